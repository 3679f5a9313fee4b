//! Listing the files of a model directory, for `extra` files and for writing a manifest.

use std::path::Path;

/// Names that model_signing leaves out of a model by default, plus the metadata folder that
/// `hf download --local-dir` keeps inside the model directory. Only matched at the top level.
const IGNORED_TOP_LEVEL: [&str; 5] = [".git", ".gitattributes", ".github", ".gitignore", ".cache"];

/// Every non-directory entry below `dir`, as paths relative to it with `/` separators, sorted.
/// Symlinks are listed, never followed, so a symlink loop or a link to `/` costs nothing here.
pub fn list_files(dir: &Path) -> std::io::Result<Vec<String>> {
    let mut files = Vec::new();
    let walker = walkdir::WalkDir::new(dir)
        .min_depth(1)
        .follow_links(false)
        .sort_by_file_name()
        .into_iter()
        .filter_entry(|entry| {
            entry.depth() != 1
                || !IGNORED_TOP_LEVEL
                    .iter()
                    .any(|ignored| entry.file_name() == *ignored)
        });
    for entry in walker {
        let entry = entry.map_err(|e| {
            let path = e
                .path()
                .map(|p| p.display().to_string())
                .unwrap_or_default();
            std::io::Error::other(format!("cannot list {path}: {e}"))
        })?;
        if entry.file_type().is_dir() {
            continue;
        }
        let rel = entry.path().strip_prefix(dir).unwrap_or(entry.path());
        files.push(rel.to_string_lossy().into_owned());
    }
    Ok(files)
}
