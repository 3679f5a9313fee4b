//! Which pages of a file the page cache holds, so that a verification in `serve` can leave the cache
//! as it found it: the pages it brought in are dropped after hashing, the pages that were there (a
//! model a server just loaded) stay. Residency comes from `mincore(2)` on a read-only mapping that
//! is never touched (so a file truncated meanwhile cannot raise SIGBUS); dropping is
//! `posix_fadvise(DONTNEED)`, which leaves dirty pages alone.

use std::fs::File;
use std::os::fd::AsRawFd;

use nix::fcntl::{posix_fadvise, PosixFadviseAdvice};

/// Which pages of `[start, start + len)` of a file were resident when looked at.
pub struct Residency {
    /// Page-aligned start of the looked-at range.
    start: u64,
    page: u64,
    /// One entry per page: whether it was resident.
    resident: Vec<bool>,
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(size).unwrap_or(4096).max(1)
}

impl Residency {
    /// Looks at the pages covering `[start, start + len)`.
    pub fn look(file: &File, start: u64, len: u64) -> std::io::Result<Residency> {
        let page = page_size();
        let aligned = start - start % page;
        let span = (start + len).div_ceil(page) * page - aligned;
        let pages = (span / page) as usize;
        if pages == 0 {
            return Ok(Residency {
                start: aligned,
                page,
                resident: Vec::new(),
            });
        }
        let offset = libc::off_t::try_from(aligned).map_err(std::io::Error::other)?;
        // SAFETY: a fresh read-only shared mapping of our own descriptor; it is never read through,
        // only passed to mincore and unmapped below.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                span as usize,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                offset,
            )
        };
        if map == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let mut vector = vec![0u8; pages];
        // SAFETY: `map` spans `span` bytes and `vector` has one byte per page of it.
        let looked = unsafe { libc::mincore(map, span as usize, vector.as_mut_ptr()) };
        let error = std::io::Error::last_os_error();
        // SAFETY: unmapping exactly what was mapped above.
        unsafe { libc::munmap(map, span as usize) };
        if looked != 0 {
            return Err(error);
        }
        Ok(Residency {
            start: aligned,
            page,
            resident: vector.iter().map(|b| b & 1 == 1).collect(),
        })
    }

    /// The fraction of the looked-at pages that were resident (1 for an empty range).
    pub fn fraction(&self) -> f64 {
        if self.resident.is_empty() {
            return 1.0;
        }
        self.resident.iter().filter(|r| **r).count() as f64 / self.resident.len() as f64
    }

    /// Drops from the page cache every run of pages that was not resident when looked at.
    pub fn drop_brought_in(&self, file: &File) {
        let mut page = 0;
        while page < self.resident.len() {
            if self.resident[page] {
                page += 1;
                continue;
            }
            let run_start = page;
            while page < self.resident.len() && !self.resident[page] {
                page += 1;
            }
            let offset = self.start + run_start as u64 * self.page;
            let len = (page - run_start) as u64 * self.page;
            // Advice only: a failure leaves the pages cached, nothing else.
            let _ = posix_fadvise(
                file,
                offset as libc::off_t,
                len as libc::off_t,
                PosixFadviseAdvice::POSIX_FADV_DONTNEED,
            );
        }
    }
}

/// Restores the page cache behind a sequential read of `[start, end)` (`end` None: to the end of
/// the file), a window at a time. The residency of each window is looked at one window ahead of
/// the reads, because the kernel's read-ahead for one window already brings in the start of the
/// next: looked at later, those pages would seem to have been cached before.
pub struct Restorer {
    window: u64,
    end: Option<u64>,
    /// The window being read: where it ends, and what was cached of it before.
    current: Option<(u64, Residency)>,
    /// The window after it, looked at before the current one was read.
    next: Option<(u64, Residency)>,
}

impl Restorer {
    pub fn new(window: u64, end: Option<u64>) -> Restorer {
        Restorer {
            window,
            end,
            current: None,
            next: None,
        }
    }

    /// Looks at `[from, from + window)`, cut at the end; None when empty or refused (then nothing
    /// of it is dropped: better cached than lost).
    fn look(&self, file: &File, from: u64) -> Option<(u64, Residency)> {
        let until = self
            .end
            .map_or(from + self.window, |end| end.min(from + self.window));
        (until > from)
            .then(|| Residency::look(file, from, until - from).ok())
            .flatten()
            .map(|residency| (until, residency))
    }

    /// Called before each read at `offset`: past the current window, its new pages are dropped
    /// and the next window (looked at earlier, or now if that look was refused) becomes current.
    pub fn before_read(&mut self, file: &File, offset: u64) {
        if self
            .current
            .as_ref()
            .is_some_and(|(until, _)| offset < *until)
        {
            return;
        }
        if let Some((_, before)) = self.current.take() {
            before.drop_brought_in(file);
        }
        self.current = self.next.take().or_else(|| self.look(file, offset));
        let after = self
            .current
            .as_ref()
            .map_or(offset + self.window, |(until, _)| *until);
        self.next = self.look(file, after);
    }

    /// After the last read (or a stop): drops what the reads brought in, read-ahead included.
    pub fn finish(self, file: &File) {
        for (_, before) in self.current.into_iter().chain(self.next) {
            before.drop_brought_in(file);
        }
    }
}
