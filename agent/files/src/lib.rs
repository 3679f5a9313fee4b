//! Reading the small files the agent parses (config, manifests, keys, sysfs attributes, an image's
//! manifests in containerd's content store): opened without blocking, refused unless they are
//! regular files, and read only up to a bound. A FIFO or a device put where a manifest should be
//! must not hang the agent, and an endless or huge file must not exhaust its memory. A crate of its
//! own, a leaf: the verifier core, the collectors and the Kubernetes side all read through it, and
//! none of them need another for it.

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Opens `path` for reading without blocking (opening a FIFO would otherwise wait for a writer
/// forever), with `flags` added (`O_NOFOLLOW`, say), and refuses anything but a regular file.
pub fn open_regular(path: &Path, flags: libc::c_int) -> std::io::Result<std::fs::File> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | flags)
        .open(path)?;
    let kind = file.metadata()?.file_type();
    if !kind.is_file() {
        return Err(std::io::Error::other(format!(
            "not a regular file ({})",
            kind_of(&kind)
        )));
    }
    Ok(file)
}

/// [`open_regular`], refusing a file over `limit` bytes; returns it with its size.
pub fn open_bounded(path: &Path, limit: u64) -> std::io::Result<(std::fs::File, u64)> {
    let file = open_regular(path, 0)?;
    let size = file.metadata()?.len();
    if size > limit {
        return Err(too_large(limit));
    }
    Ok((file, size))
}

/// `FileTooLarge`, so a caller can tell a file refused for its size from one that could not be
/// read.
fn too_large(limit: u64) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::FileTooLarge,
        format!("larger than the {limit} bytes allowed"),
    )
}

/// Reads `path` whole, failing on anything but a regular file or a file over `limit` bytes (also
/// one that grows past it while read).
pub fn read_bounded(path: &Path, limit: u64) -> std::io::Result<Vec<u8>> {
    let (file, size) = open_bounded(path, limit)?;
    let mut bytes = Vec::with_capacity(size as usize);
    file.take(limit + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(too_large(limit));
    }
    Ok(bytes)
}

/// [`read_bounded`], for text: bytes that are not UTF-8 are an error.
pub fn read_bounded_text(path: &Path, limit: u64) -> std::io::Result<String> {
    String::from_utf8(read_bounded(path, limit)?)
        .map_err(|_| std::io::Error::other("not UTF-8 text"))
}

fn kind_of(kind: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if kind.is_dir() {
        "a directory"
    } else if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_socket() {
        "a socket"
    } else if kind.is_char_device() || kind.is_block_device() {
        "a device"
    } else {
        "not a file"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifos_directories_and_oversized_files_are_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let error = read_bounded(&fifo, 1024).unwrap_err().to_string();
        assert!(error.contains("a FIFO"), "{error}");
        let error = read_bounded(dir.path(), 1024).unwrap_err().to_string();
        assert!(error.contains("a directory"), "{error}");
        let big = dir.path().join("big");
        std::fs::write(&big, vec![b'x'; 2048]).unwrap();
        let error = read_bounded(&big, 1024).unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::FileTooLarge);
        assert!(error.to_string().contains("larger"));
        assert_eq!(read_bounded(&big, 2048).unwrap().len(), 2048);
        let error = read_bounded(Path::new("/dev/zero"), 1024)
            .unwrap_err()
            .to_string();
        assert!(error.contains("a device"), "{error}");
    }
}
