//! The journal's files: which there are (what journald creates, rotates and vacuums), and which the
//! loaded libsystemd can open. Each file's open is checked alone when it is first seen, so that one
//! file the library refuses (an incompatible header flag it does not know, written by a newer
//! systemd than the image's) is left out, counted and named, instead of failing the whole journal
//! or being skipped in silence.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use nix::errno::Errno;

use super::libsystemd::Libsystemd;

/// A journal file as listed: its path and inode (journald reuses `system.journal`'s name for the
/// file it rotates to).
pub type Listed = (PathBuf, u64);

/// The journal files in those of `dirs` that exist and their machine-id directories, sorted. Err
/// says why there is no journal to read: none of `dirs` exists.
pub fn list(dirs: &[PathBuf]) -> Result<Vec<Listed>, String> {
    use std::os::unix::fs::DirEntryExt;
    if !dirs.iter().any(|d| d.is_dir()) {
        return Err(format!(
            "none of {dirs:?} exists: mount the host's journal directories read-only (components/kernel-log)"
        ));
    }
    let mut files = Vec::new();
    let mut pending: Vec<PathBuf> = dirs.to_vec();
    // The directories given, and the machine-id directories in them: where journald writes.
    for _ in 0..2 {
        for dir in std::mem::take(&mut pending) {
            let Ok(listing) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in listing.flatten() {
                let path = entry.path();
                match entry.file_type() {
                    Ok(kind) if kind.is_dir() => pending.push(path),
                    Ok(kind) if kind.is_file() && is_journal(&path) => {
                        files.push((path, entry.ino()))
                    }
                    _ => {}
                }
            }
        }
    }
    files.sort();
    Ok(files)
}

/// What journalctl reads: `.journal`, and `.journal~` (a file journald set aside as damaged, still
/// holding what it could write).
fn is_journal(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.ends_with(".journal") || n.ends_with(".journal~"))
}

/// Why a file is left out, as the series' `reason` label says it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unreadable {
    pub file: PathBuf,
    pub error: Errno,
    /// The header's incompatible flags, when they could be read.
    pub incompatible_flags: Option<u32>,
}

impl Unreadable {
    pub const REASONS: [&'static str; 3] =
        ["unsupported_format", "permission_denied", "unreadable"];

    pub fn reason(&self) -> &'static str {
        match self.error {
            Errno::EPROTONOSUPPORT => "unsupported_format",
            Errno::EACCES | Errno::EPERM => "permission_denied",
            _ => "unreadable",
        }
    }

    /// What the log says, once: the file, the library's error, and for a format it does not know,
    /// the flags the file carries.
    pub fn describe(&self, library: &Path) -> String {
        let file = self.file.display();
        let library = library.display();
        match (self.error, self.incompatible_flags) {
            (Errno::EPROTONOSUPPORT, Some(flags)) => format!(
                "journal file {file} has incompatible header flags {} that {library} does not support: a newer systemd wrote it; its entries are not read until the image ships a libsystemd at least as new as the host's",
                describe_flags(flags)
            ),
            (Errno::EACCES | Errno::EPERM, _) => format!(
                "journal file {file} cannot be opened ({}): the agent reads the journal as its owner, root (docs/kernel-log.md)",
                self.error
            ),
            _ => format!(
                "journal file {file} cannot be read by {library} ({}): damaged or cut short; its entries are not read",
                self.error
            ),
        }
    }
}

/// The incompatible flags systemd defines (docs/JOURNAL_FILE_FORMAT.md, `HEADER_INCOMPATIBLE_*`),
/// by bit.
const INCOMPATIBLE_FLAGS: [(u32, &str); 5] = [
    (1 << 0, "COMPRESSED_XZ"),
    (1 << 1, "COMPRESSED_LZ4"),
    (1 << 2, "KEYED_HASH"),
    (1 << 3, "COMPRESSED_ZSTD"),
    (1 << 4, "COMPACT"),
];

/// `0x58 (COMPRESSED_ZSTD, COMPACT, unknown 0x40)`.
pub fn describe_flags(flags: u32) -> String {
    let mut names: Vec<String> = INCOMPATIBLE_FLAGS
        .iter()
        .filter(|(bit, _)| flags & bit != 0)
        .map(|(_, name)| name.to_string())
        .collect();
    let known = INCOMPATIBLE_FLAGS.iter().fold(0, |all, (bit, _)| all | bit);
    if flags & !known != 0 {
        names.push(format!("unknown {:#x}", flags & !known));
    }
    format!("{flags:#x} ({})", names.join(", "))
}

/// The start of a journal file's header (docs/JOURNAL_FILE_FORMAT.md): the signature `LPKSHHRH`,
/// `compatible_flags` and `incompatible_flags` (little-endian 32 bits each), then `state`.
fn header(file: &Path) -> Option<[u8; 17]> {
    use std::io::Read;
    let mut header = [0u8; 17];
    std::fs::File::open(file)
        .and_then(|mut f| f.read_exact(&mut header))
        .ok()?;
    (&header[..8] == b"LPKSHHRH").then_some(header)
}

fn incompatible_flags(file: &Path) -> Option<u32> {
    header(file).map(|h| u32::from_le_bytes([h[12], h[13], h[14], h[15]]))
}

/// `STATE_ARCHIVED`: journald rotated the file away and never writes it again.
const STATE_ARCHIVED: u8 = 2;

/// `files` split into the archived ones, which no writer will change (their history can be read
/// in parallel), and the others, which journald may still append to.
pub fn split_archived(files: &[PathBuf]) -> (Vec<PathBuf>, Vec<PathBuf>) {
    files
        .iter()
        .cloned()
        .partition(|f| header(f).is_some_and(|h| h[16] == STATE_ARCHIVED))
}

/// Whether an error must be seen twice on an unchanged file before it counts: a reader that
/// follows sees files as journald creates them; a one-off scan reads what is there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Settle {
    Twice,
    Now,
}

struct Checked {
    inode: u64,
    /// Size and modification time when last checked: a file that changes is checked again.
    shape: Option<(u64, SystemTime)>,
    outcome: Result<(), Unreadable>,
    /// Counted and said (an error seen on an unchanged file, or at once under `Settle::Now`).
    settled: bool,
}

/// The outcome of each file's own open, kept while the file is listed.
#[derive(Default)]
pub struct FileChecks {
    checked: BTreeMap<PathBuf, Checked>,
}

impl FileChecks {
    /// The listed files the library can open, checking those not seen before (or changed since
    /// they could not be opened). Returns them and the files newly settled as unreadable (to be
    /// said once).
    pub fn readable(
        &mut self,
        library: &Arc<Libsystemd>,
        listed: &[Listed],
        settle: Settle,
    ) -> (Vec<PathBuf>, Vec<Unreadable>) {
        self.checked.retain(|path, c| {
            listed
                .iter()
                .any(|(p, inode)| p == path && *inode == c.inode)
        });
        let mut readable = Vec::new();
        let mut settled = Vec::new();
        for (path, inode) in listed {
            if self.checked.get(path).is_some_and(|c| c.outcome.is_ok()) {
                readable.push(path.clone());
                continue;
            }
            let shape = shape(path);
            if let Some(known) = self.checked.get_mut(path) {
                if let Err(unreadable) = &known.outcome {
                    if known.shape == shape && shape.is_some() {
                        if !known.settled {
                            known.settled = true;
                            settled.push(unreadable.clone());
                        }
                        continue;
                    }
                }
            }
            let outcome = match library.open_files(std::slice::from_ref(path)) {
                Ok(_) => Ok(()),
                // Vacuumed between the listing and the open: gone, not unreadable.
                Err(Errno::ENOENT) => continue,
                Err(error) => Err(Unreadable {
                    file: path.clone(),
                    error,
                    incompatible_flags: incompatible_flags(path),
                }),
            };
            let now = settle == Settle::Now && outcome.is_err();
            if let Err(unreadable) = &outcome {
                if now {
                    settled.push(unreadable.clone());
                }
            } else {
                readable.push(path.clone());
            }
            self.checked.insert(
                path.clone(),
                Checked {
                    inode: *inode,
                    shape,
                    outcome,
                    settled: now,
                },
            );
        }
        (readable, settled)
    }

    /// The files left out, counted and said: by reason.
    pub fn unreadable(&self) -> impl Iterator<Item = &Unreadable> + Clone {
        self.checked
            .values()
            .filter(|c| c.settled)
            .filter_map(|c| c.outcome.as_ref().err())
    }
}

fn shape(path: &Path) -> Option<(u64, SystemTime)> {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.len(), meta.modified().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_are_named_and_the_unknown_ones_shown() {
        assert_eq!(describe_flags(0x18), "0x18 (COMPRESSED_ZSTD, COMPACT)");
        assert_eq!(describe_flags(0x48), "0x48 (COMPRESSED_ZSTD, unknown 0x40)");
    }

    #[test]
    fn journal_files_are_listed_with_their_machine_directories_and_nothing_else() {
        let root = tempfile::tempdir().unwrap();
        let machine = root.path().join("4f1c2d3e4b5a69788796a5b4c3d2e1f0");
        std::fs::create_dir_all(&machine).unwrap();
        for name in ["system.journal", "system@0001.journal~", "notes.txt"] {
            std::fs::write(machine.join(name), b"").unwrap();
        }
        let names: Vec<String> = list(&[root.path().into(), root.path().join("missing")])
            .unwrap()
            .iter()
            .map(|(p, _)| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["system.journal", "system@0001.journal~"]);
        assert!(list(&[root.path().join("missing")])
            .unwrap_err()
            .contains("none of"));
    }

    /// A file journald is creating is not unreadable: an error counts, once, when the file has
    /// stopped changing; a file gone is forgotten.
    #[test]
    fn an_error_counts_once_and_only_once_the_file_has_stopped_changing() {
        let library = Libsystemd::load(Path::new("libsystemd.so.0"))
            .expect("Debian's libsystemd0 is needed (apt-get install libsystemd0)");
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("system.journal");
        // Shorter than any journal header: what a reader sees before journald has written one.
        std::fs::write(&file, b"LPKSHHRH").unwrap();
        let mut checks = FileChecks::default();
        let listed = list(&[dir.path().into()]).unwrap();
        let (readable, settled) = checks.readable(&library, &listed, Settle::Twice);
        assert!(readable.is_empty() && settled.is_empty());
        let (_, settled) = checks.readable(&library, &listed, Settle::Twice);
        assert_eq!(settled.len(), 1, "unchanged since: counted");
        assert_eq!(settled[0].reason(), "unreadable");
        assert_eq!(settled[0].file, file);
        let (_, settled) = checks.readable(&library, &listed, Settle::Twice);
        assert!(settled.is_empty(), "said once");
        assert_eq!(checks.unreadable().count(), 1);
        std::fs::remove_file(&file).unwrap();
        let (readable, _) = checks.readable(&library, &[], Settle::Twice);
        assert!(readable.is_empty());
        assert_eq!(checks.unreadable().count(), 0, "gone, forgotten");
        // A one-off scan says it at once.
        std::fs::write(&file, b"LPKSHHRH").unwrap();
        let listed = list(&[dir.path().into()]).unwrap();
        let (_, settled) = FileChecks::default().readable(&library, &listed, Settle::Now);
        assert_eq!(settled.len(), 1);
    }
}
