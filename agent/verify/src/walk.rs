//! Listing the files of a model directory, for `extra` files and for writing a manifest.
//!
//! The listing stays inside the directory under the same rules as opening a file: symlinks are
//! listed, never followed (the directory itself included: a snapshot folder that is a symlink to
//! `/etc` is not listed), and a part of the tree that cannot be listed (too deep for PATH_MAX,
//! unreadable) is reported, not fatal: the manifest's own files decide the verdict.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Names that model_signing leaves out of a model by default, plus the metadata folder that
/// `hf download --local-dir` keeps inside the model directory. Only matched at the top level.
const IGNORED_TOP_LEVEL: [&str; 5] = [".git", ".gitattributes", ".github", ".gitignore", ".cache"];

/// How many unlistable places are described (all are counted).
const UNLISTED_DESCRIBED: usize = 5;
/// A path in a message is cut to this many characters: a chain of directories can be longer than
/// anyone wants to read.
const PATH_SHOWN: usize = 120;

/// The places a walk could not list: how many, and a description of the first few.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Unlisted {
    pub count: usize,
    pub described: Vec<String>,
}

impl Unlisted {
    /// "3 place(s) ... could not be listed: a/b: permission denied; ..." or None.
    pub fn summary(&self) -> Option<String> {
        (self.count > 0).then(|| {
            format!(
                "{} place(s) below the model could not be listed, so extra files there are unknown: {}",
                self.count,
                self.described.join("; ")
            )
        })
    }
}

/// One non-directory entry a walk found, relative to the walked directory, `/`-separated.
pub enum Found<'a> {
    Utf8(&'a str),
    /// A path that is not UTF-8, escaped by [`escape`] (never in a manifest, so always extra).
    Escaped(String),
}

/// What a walk found, collected.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Listing {
    /// Every non-directory entry with a UTF-8 path, sorted.
    pub files: Vec<String>,
    pub not_utf8: Vec<String>,
    pub unlisted: Unlisted,
}

impl Listing {
    pub fn unlisted_summary(&self) -> Option<String> {
        self.unlisted.summary()
    }
}

/// A path as text that names it unambiguously: UTF-8 as is, every other byte as `\xNN`, and a
/// backslash as `\\` (so `a\xff` the four characters and `a` followed by byte 0xff differ).
pub fn escape(path: &OsStr) -> String {
    let mut out = String::new();
    for chunk in path.as_bytes().utf8_chunks() {
        for c in chunk.valid().chars() {
            if c == '\\' {
                out.push_str("\\\\");
            } else {
                out.push(c);
            }
        }
        for byte in chunk.invalid() {
            out.push_str(&format!("\\x{byte:02x}"));
        }
    }
    out
}

fn shorten(text: String) -> String {
    match text.char_indices().nth(PATH_SHOWN) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text,
    }
}

/// Lists every non-directory entry below `dir`. Err only when `dir` itself is not a directory to
/// list (missing, or a symlink).
pub fn list_files(dir: &Path) -> std::io::Result<Listing> {
    let mut listing = Listing::default();
    listing.unlisted = walk_files(dir, |found| match found {
        Found::Utf8(path) => listing.files.push(path.to_string()),
        Found::Escaped(name) => listing.not_utf8.push(name),
    })?;
    Ok(listing)
}

/// Calls `found` for every non-directory entry below `dir`, in name order, without collecting
/// them: a million-file tree is checked against its manifest as it is read.
pub fn walk_files(dir: &Path, mut found: impl FnMut(Found<'_>)) -> std::io::Result<Unlisted> {
    let meta = std::fs::symlink_metadata(dir)?;
    if meta.file_type().is_symlink() {
        return Err(std::io::Error::other(format!(
            "{} is a symlink; it is not followed",
            dir.display()
        )));
    }
    let mut unlisted = Unlisted::default();
    let walker = walkdir::WalkDir::new(dir)
        .min_depth(1)
        .follow_links(false)
        .follow_root_links(false)
        .sort_by_file_name()
        .into_iter()
        .filter_entry(|entry| {
            entry.depth() != 1
                || !IGNORED_TOP_LEVEL
                    .iter()
                    .any(|ignored| entry.file_name() == *ignored)
        });
    for entry in walker {
        let entry = match entry {
            Ok(entry) => entry,
            Err(e) => {
                unlisted.count += 1;
                if unlisted.described.len() < UNLISTED_DESCRIBED {
                    let place = e
                        .path()
                        .map(|p| escape(p.strip_prefix(dir).unwrap_or(p).as_os_str()))
                        .unwrap_or_default();
                    let reason = e
                        .io_error()
                        .map(|io| io.kind().to_string())
                        .unwrap_or_else(|| e.to_string());
                    unlisted
                        .described
                        .push(format!("{}: {reason}", shorten(place)));
                }
                continue;
            }
        };
        if entry.file_type().is_dir() {
            continue;
        }
        let rel = entry.path().strip_prefix(dir).unwrap_or(entry.path());
        match rel.to_str() {
            Some(text) => found(Found::Utf8(text)),
            None => found(Found::Escaped(escape(rel.as_os_str()))),
        }
    }
    Ok(unlisted)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::ffi::OsStringExt;

    #[test]
    fn non_utf8_names_are_escaped_unambiguously() {
        let raw = std::ffi::OsString::from_vec(b"a\xff".to_vec());
        let literal = OsStr::new("a\\xff");
        assert_eq!(escape(&raw), "a\\xff");
        assert_eq!(escape(literal), "a\\\\xff");
        assert_ne!(escape(&raw), escape(literal));
        let other = std::ffi::OsString::from_vec(b"a\xfe".to_vec());
        assert_ne!(escape(&raw), escape(&other), "two names, two reports");
    }

    #[test]
    fn a_symlinked_directory_is_not_listed_and_unreadable_parts_do_not_fail_the_walk() {
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("/etc", dir.path().join("snapshot")).unwrap();
        assert!(list_files(&dir.path().join("snapshot")).is_err());
        std::fs::write(dir.path().join("config.json"), b"{}").unwrap();
        let listing = list_files(dir.path()).unwrap();
        assert_eq!(
            listing.files,
            ["config.json", "snapshot"],
            "the link is an entry, not followed"
        );
        assert_eq!(listing.unlisted_summary(), None);
    }
}
