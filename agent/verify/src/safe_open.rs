//! Opening files under ROOT without ever leaving it.
//!
//! Every path is resolved relative to a directory descriptor for ROOT with
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV)`: the kernel refuses any
//! `..`, absolute symlink or mount crossing that would leave ROOT, and there is no window between
//! a check and the open for a rename to slip through. Where `openat2` is refused (kernels before
//! 5.6, or a seccomp profile that answers ENOSYS or EPERM, as some container runtimes do) the same
//! rules are enforced by walking the path one component at a time with `O_PATH | O_NOFOLLOW`,
//! resolving symlinks ourselves against a stack of directory descriptors (so `..` can never climb
//! above ROOT) and checking that every component is on ROOT's device.
//!
//! A file is first opened with `O_PATH`, which has no side effects, and only opened for reading
//! once `fstat` shows it is a regular file: a FIFO is never opened (it would block), nor a device.

use std::ffi::OsString;
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering};

use nix::errno::Errno;
use nix::fcntl::{openat, openat2, readlinkat, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{fstat, FileStat, Mode, SFlag};

/// How many symlinks one path may pass through, as the kernel's own limit.
const MAX_SYMLINKS: usize = 40;

/// How the path is resolved. `Auto` uses `openat2` and falls back to the walk when it is refused;
/// tests force `Walk` to check that the fallback enforces the same rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    Auto,
    Walk,
}

/// Why a file could not be opened, already sorted into the report's status words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpenFailure {
    Missing(String),
    EscapesRoot(String),
    NotRegular(String),
    /// A symlink on the path where the manifest allows none.
    Symlink(String),
    Io(String),
}

/// The identity and state of an open file; compared before and after hashing to notice a file
/// that was replaced or written to meanwhile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Snapshot {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime: (i64, i64),
    pub ctime: (i64, i64),
}

impl Snapshot {
    pub fn of(stat: &FileStat) -> Snapshot {
        Snapshot {
            dev: stat.st_dev,
            ino: stat.st_ino,
            size: stat.st_size as u64,
            mtime: (stat.st_mtime, stat.st_mtime_nsec),
            ctime: (stat.st_ctime, stat.st_ctime_nsec),
        }
    }

    pub fn same_file(&self, other: &Snapshot) -> bool {
        self.dev == other.dev && self.ino == other.ino
    }
}

/// A regular file under ROOT, open for reading.
pub struct OpenedFile {
    pub file: File,
    pub snapshot: Snapshot,
}

/// A directory that paths are resolved beneath.
pub struct Root {
    dir: OwnedFd,
    dev: u64,
    path: PathBuf,
    strategy: Strategy,
    /// Whether a path may pass through symlinks (inside ROOT). A model_signing bundle signed with
    /// `allow_symlinks: false` allows none, as model_signing's own verifier.
    symlinks: bool,
}

/// Remembers, process-wide, that the kernel refused openat2, so that each later open goes straight
/// to the walk instead of paying for a failing system call.
static OPENAT2: AtomicU8 = AtomicU8::new(OPENAT2_UNKNOWN);
const OPENAT2_UNKNOWN: u8 = 0;
const OPENAT2_WORKS: u8 = 1;
const OPENAT2_REFUSED: u8 = 2;

/// The result of resolving a path with `O_PATH`: where it ended up and what it is.
struct Located {
    /// The directory holding the final component (None: ROOT itself); only the walk sets it.
    parent: Option<OwnedFd>,
    name: OsString,
    stat: FileStat,
}

fn file_kind(stat: &FileStat) -> &'static str {
    match SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT {
        SFlag::S_IFDIR => "a directory",
        SFlag::S_IFIFO => "a FIFO",
        SFlag::S_IFSOCK => "a socket",
        SFlag::S_IFCHR => "a character device",
        SFlag::S_IFBLK => "a block device",
        SFlag::S_IFLNK => "a symlink",
        SFlag::S_IFREG => "a regular file",
        _ => "not a regular file",
    }
}

fn is_kind(stat: &FileStat, kind: SFlag) -> bool {
    SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT == kind
}

impl Root {
    pub fn open(path: &Path) -> std::io::Result<Root> {
        Root::with_strategy(path, Strategy::Auto)
    }

    pub fn with_strategy(path: &Path, strategy: Strategy) -> std::io::Result<Root> {
        let dir = nix::fcntl::open(
            path,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        let dev = fstat(&dir)?.st_dev;
        Ok(Root {
            dir,
            dev,
            path: path.to_path_buf(),
            strategy,
            symlinks: true,
        })
    }

    /// The same ROOT, refusing every path that passes through a symlink (the kernel's
    /// `RESOLVE_NO_SYMLINKS`, or the walk's own check), with no window for a rename.
    pub fn without_symlinks(mut self) -> Root {
        self.symlinks = false;
        self
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.dir.as_fd()
    }

    /// Opens `rel` (already checked to be a normalised relative path) for reading.
    pub fn open_file(&self, rel: &str) -> Result<OpenedFile, OpenFailure> {
        // Two attempts: a rename between the O_PATH look and the real open is retried once.
        for _ in 0..2 {
            let located = self.locate(rel)?;
            if !is_kind(&located.stat, SFlag::S_IFREG) {
                return Err(OpenFailure::NotRegular(format!(
                    "is {}",
                    file_kind(&located.stat)
                )));
            }
            let read_flags =
                OFlag::O_RDONLY | OFlag::O_CLOEXEC | OFlag::O_NOCTTY | OFlag::O_NONBLOCK;
            // The O_PATH look raised no IN_OPEN; the open below raises one, announced first.
            let looked = (located.stat.st_dev, located.stat.st_ino);
            crate::own_opens::expect(looked);
            let fd = match &located.parent {
                None if self.use_openat2() => self.openat2(rel, read_flags),
                None => openat(
                    self.fd(),
                    located.name.as_os_str(),
                    read_flags | OFlag::O_NOFOLLOW,
                    Mode::empty(),
                ),
                Some(parent) => openat(
                    parent,
                    located.name.as_os_str(),
                    read_flags | OFlag::O_NOFOLLOW,
                    Mode::empty(),
                ),
            };
            let fd = match fd {
                Ok(fd) => fd,
                Err(e) => {
                    crate::own_opens::cancel(looked);
                    match e {
                        Errno::ENOENT | Errno::ELOOP | Errno::EXDEV | Errno::EAGAIN => continue,
                        e => return Err(OpenFailure::Io(e.desc().to_string())),
                    }
                }
            };
            let stat = fstat(&fd).map_err(|e| OpenFailure::Io(e.desc().to_string()))?;
            if (stat.st_dev, stat.st_ino) != looked {
                // Another file was renamed there meanwhile: the IN_OPEN was that file's, read as
                // another process's open of it (one spurious open of a file being replaced, rather
                // than an announcement left to swallow a real one).
                crate::own_opens::cancel(looked);
            }
            if Snapshot::of(&stat).same_file(&Snapshot::of(&located.stat)) {
                return Ok(OpenedFile {
                    file: File::from(fd),
                    snapshot: Snapshot::of(&stat),
                });
            }
        }
        Err(OpenFailure::Io("it was replaced while being opened".into()))
    }

    /// The first `limit` bytes of the regular file `rel` (small files the layouts read whole:
    /// a marker, a tree listing), opened as [`Root::open_file`] opens any.
    pub fn read_at_most(&self, rel: &str, limit: u64) -> Option<Vec<u8>> {
        let opened = self.open_file(rel).ok()?;
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut std::io::Read::take(&opened.file, limit), &mut bytes)
            .ok()?;
        Some(bytes)
    }

    /// `fstatat` without following a final symlink, for markers such as `x.incomplete` that are
    /// only looked at, never opened.
    pub fn exists_nofollow(&self, rel: &str) -> bool {
        nix::sys::stat::fstatat(self.fd(), rel, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW).is_ok()
    }

    /// The target of the symlink at `rel`, or None when `rel` is not a symlink.
    pub fn read_link(&self, rel: &str) -> Result<Option<OsString>, Errno> {
        match readlinkat(self.fd(), rel) {
            Ok(target) => Ok(Some(target)),
            Err(Errno::EINVAL) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn use_openat2(&self) -> bool {
        self.strategy == Strategy::Auto && OPENAT2.load(Ordering::Relaxed) != OPENAT2_REFUSED
    }

    fn openat2(&self, rel: &str, flags: OFlag) -> nix::Result<OwnedFd> {
        let mut resolve = ResolveFlag::RESOLVE_BENEATH
            | ResolveFlag::RESOLVE_NO_MAGICLINKS
            | ResolveFlag::RESOLVE_NO_XDEV;
        if !self.symlinks {
            resolve |= ResolveFlag::RESOLVE_NO_SYMLINKS;
        }
        let how = OpenHow::new().flags(flags).resolve(resolve);
        // RESOLVE_BENEATH answers EAGAIN when a concurrent rename might have let a `..` escape.
        let mut result = openat2(self.fd(), rel, how);
        for _ in 0..3 {
            if !matches!(result, Err(Errno::EAGAIN)) {
                break;
            }
            result = openat2(self.fd(), rel, how);
        }
        result
    }

    fn locate(&self, rel: &str) -> Result<Located, OpenFailure> {
        if self.use_openat2() {
            let flags = OFlag::O_PATH | OFlag::O_CLOEXEC;
            match self.openat2(rel, flags) {
                Ok(fd) => {
                    OPENAT2.store(OPENAT2_WORKS, Ordering::Relaxed);
                    let stat = fstat(&fd).map_err(|e| OpenFailure::Io(e.desc().to_string()))?;
                    return Ok(Located {
                        parent: None,
                        name: OsString::from(rel),
                        stat,
                    });
                }
                Err(Errno::ENOSYS | Errno::EPERM)
                    if OPENAT2.load(Ordering::Relaxed) != OPENAT2_WORKS =>
                {
                    OPENAT2.store(OPENAT2_REFUSED, Ordering::Relaxed);
                }
                Err(Errno::ELOOP) if !self.symlinks => return Err(symlink_refused()),
                Err(e) => return Err(classify(e)),
            }
        }
        self.walk(rel)
    }

    /// The fallback: one component at a time, never following a symlink in the kernel.
    fn walk(&self, rel: &str) -> Result<Located, OpenFailure> {
        let mut pending: std::collections::VecDeque<OsString> = split(rel.as_bytes()).collect();
        let mut dirs: Vec<OwnedFd> = Vec::new();
        let mut symlinks = 0;
        while let Some(name) = pending.pop_front() {
            match name.as_bytes() {
                b"" | b"." => continue,
                b".." => {
                    if dirs.pop().is_none() {
                        return Err(OpenFailure::EscapesRoot(
                            "a symlink on its path leads above ROOT".into(),
                        ));
                    }
                    continue;
                }
                _ => {}
            }
            let parent = dirs.last().map(|d| d.as_fd()).unwrap_or(self.fd());
            let fd = openat(
                parent,
                name.as_os_str(),
                OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                Mode::empty(),
            )
            .map_err(classify)?;
            let stat = fstat(&fd).map_err(|e| OpenFailure::Io(e.desc().to_string()))?;
            if stat.st_dev != self.dev {
                return Err(OpenFailure::EscapesRoot(
                    "its path crosses a mount point".into(),
                ));
            }
            if is_kind(&stat, SFlag::S_IFLNK) {
                if !self.symlinks {
                    return Err(symlink_refused());
                }
                symlinks += 1;
                if symlinks > MAX_SYMLINKS {
                    return Err(classify(Errno::ELOOP));
                }
                let target =
                    readlinkat(&fd, "").map_err(|e| OpenFailure::Io(e.desc().to_string()))?;
                if target.as_bytes().starts_with(b"/") {
                    return Err(OpenFailure::EscapesRoot(format!(
                        "a symlink on its path points to the absolute path {}",
                        target.to_string_lossy()
                    )));
                }
                for (i, part) in split(target.as_bytes()).enumerate() {
                    pending.insert(i, part);
                }
                continue;
            }
            if pending.is_empty() {
                let parent = dirs.pop();
                return Ok(Located { parent, name, stat });
            }
            if !is_kind(&stat, SFlag::S_IFDIR) {
                return Err(OpenFailure::Missing(format!(
                    "{} on its path is {}, not a directory",
                    name.to_string_lossy(),
                    file_kind(&stat)
                )));
            }
            dirs.push(fd);
        }
        Err(OpenFailure::NotRegular("is ROOT itself".into()))
    }
}

fn split(path: &[u8]) -> impl Iterator<Item = OsString> + '_ {
    path.split(|&b| b == b'/')
        .map(|part| OsString::from(std::ffi::OsStr::from_bytes(part)))
}

fn symlink_refused() -> OpenFailure {
    OpenFailure::Symlink(
        "its path passes through a symlink where none is allowed (a bundle signed with allow_symlinks: false, as model_signing verifies it; or an entry of a shared blob store)".into(),
    )
}

fn classify(errno: Errno) -> OpenFailure {
    match errno {
        Errno::ENOENT => OpenFailure::Missing("no such file (or a dangling symlink)".into()),
        Errno::ENOTDIR => OpenFailure::Missing("a component of its path is not a directory".into()),
        Errno::EXDEV => OpenFailure::EscapesRoot(
            "a symlink on its path leads outside ROOT, or the path crosses a mount point".into(),
        ),
        Errno::ELOOP => {
            OpenFailure::Io("too many levels of symbolic links (a symlink loop?)".into())
        }
        other => OpenFailure::Io(other.desc().to_string()),
    }
}
