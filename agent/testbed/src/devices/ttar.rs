//! Unpacks a ttar archive, the text archive node_exporter and procfs keep their sysfs fixtures in
//! (prometheus/procfs `ttar`): entries separated by `# ttar - - -` lines, each a `Directory: P`,
//! a `Path: P` with `Lines: N` and that many lines of content, or a `Path: P` with
//! `SymlinkTo: T`, and a `Mode:`. A malformed archive is an error naming the entry and why.

use std::path::Path;

/// Unpacks the archive `text` under `into`; Err names the line that is not ttar.
pub fn unpack(text: &str, into: &Path) -> Result<(), String> {
    let mut lines = text.lines().enumerate().peekable();
    while let Some((number, line)) = lines.next() {
        let at = |why: &str| format!("line {}: {why}: {line:?}", number + 1);
        if line.starts_with('#') || line.starts_with("Mode: ") || line.is_empty() {
            continue;
        }
        if let Some(dir) = line.strip_prefix("Directory: ") {
            std::fs::create_dir_all(into.join(dir)).map_err(|e| at(&e.to_string()))?;
            continue;
        }
        let path = line
            .strip_prefix("Path: ")
            .ok_or_else(|| at("neither Directory, Path nor Mode"))?;
        let target = into.join(path);
        let (_, next) = lines
            .next()
            .ok_or_else(|| at("a Path with nothing after it"))?;
        if let Some(link) = next.strip_prefix("SymlinkTo: ") {
            std::os::unix::fs::symlink(link, &target).map_err(|e| at(&e.to_string()))?;
            continue;
        }
        let count: usize = next
            .strip_prefix("Lines: ")
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| at("a Path without Lines or SymlinkTo"))?;
        let mut content = String::new();
        for _ in 0..count {
            let (_, line) = lines.next().ok_or_else(|| at("fewer lines than it says"))?;
            content.push_str(line);
            content.push('\n');
        }
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(|e| at(&e.to_string()))?;
        }
        std::fs::write(&target, content).map_err(|e| at(&e.to_string()))?;
    }
    Ok(())
}
