//! Which pages of a file the page cache holds, so that a verification in `serve` can leave the cache
//! as it found it: the pages it brought in are dropped after hashing, the pages that were there (a
//! model a server just loaded) stay. Residency comes from `mincore(2)` on a read-only mapping that
//! is never touched (so a file truncated meanwhile cannot raise SIGBUS); dropping is
//! `posix_fadvise(DONTNEED)`, which leaves dirty pages alone.
//!
//! Residency is looked at [`LOOK_AHEAD`] ahead of the reads: the kernel's read-ahead runs ahead of
//! them by up to twice the device's read-ahead size (and file systems such as Lustre read further),
//! so pages looked at just before their read could already be the job's own. One bit per page: 32
//! KiB per GiB read.

use std::fs::File;
use std::os::fd::AsRawFd;

use nix::fcntl::{posix_fadvise, PosixFadviseAdvice};

/// mincore is asked about this much of the range at a time, to bound its byte-per-page vector.
const LOOK_CHUNK: u64 = 64 << 20;
/// How far ahead of the reads residency is looked at: beyond any read-ahead (Linux's default
/// maximum is 2 x `read_ahead_kb`; Lustre's per-file default, 64 MiB), and small enough that the
/// first read of a huge file does not wait for a look at all of it.
pub const LOOK_AHEAD: u64 = 4 * LOOK_CHUNK;

/// Which pages of `[start, start + len)` of a file were resident when looked at; looked at from
/// the start, as far as [`Residency::look_until`] has got.
pub struct Residency {
    /// Page-aligned start of the range.
    start: u64,
    page: u64,
    pages: usize,
    /// The pages looked at so far, from the start.
    looked: usize,
    /// One bit per page, set when it was resident.
    resident: Vec<u64>,
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(size).unwrap_or(4096).max(1)
}

/// The mincore bytes of `[offset, offset + span)`, `offset` page-aligned.
fn mincore(file: &File, offset: u64, span: u64, page: u64) -> std::io::Result<Vec<u8>> {
    let offset = libc::off_t::try_from(offset).map_err(std::io::Error::other)?;
    let span = usize::try_from(span).map_err(std::io::Error::other)?;
    // SAFETY: a fresh read-only shared mapping of our own descriptor; it is never read through,
    // only passed to mincore and unmapped below.
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            span,
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            offset,
        )
    };
    if map == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    let mut vector = vec![0u8; span.div_ceil(page as usize)];
    // SAFETY: `map` spans `span` bytes and `vector` has one byte per page of it.
    let looked = unsafe { libc::mincore(map, span, vector.as_mut_ptr()) };
    let error = std::io::Error::last_os_error();
    // SAFETY: unmapping exactly what was mapped above.
    unsafe { libc::munmap(map, span) };
    if looked != 0 {
        return Err(error);
    }
    Ok(vector)
}

impl Residency {
    /// The pages covering `[start, start + len)`, none looked at yet.
    pub fn new(start: u64, len: u64) -> Residency {
        let page = page_size();
        let aligned = start - start % page;
        let pages = ((start + len).div_ceil(page) * page - aligned) / page;
        let pages = usize::try_from(pages).unwrap_or(usize::MAX);
        Residency {
            start: aligned,
            page,
            pages,
            looked: 0,
            resident: vec![0u64; pages.div_ceil(64)],
        }
    }

    /// Looks at the pages covering `[start, start + len)` now.
    pub fn look(file: &File, start: u64, len: u64) -> std::io::Result<Residency> {
        let mut residency = Residency::new(start, len);
        residency.look_until(file, start + len)?;
        Ok(residency)
    }

    /// The index of the page past the one holding byte `offset - 1`, within the range: the end of
    /// a page span that covers everything before `offset`.
    fn pages_before(&self, offset: u64) -> usize {
        (offset.saturating_sub(self.start).div_ceil(self.page) as usize).min(self.pages)
    }

    /// Looks at the pages not yet looked at up to `until`.
    pub fn look_until(&mut self, file: &File, until: u64) -> std::io::Result<()> {
        let last = self.pages_before(until);
        while self.looked < last {
            let chunk = (last - self.looked).min((LOOK_CHUNK / self.page) as usize);
            let offset = self.start + self.looked as u64 * self.page;
            let bytes = mincore(file, offset, chunk as u64 * self.page, self.page)?;
            for (i, byte) in bytes.iter().enumerate() {
                if byte & 1 == 1 {
                    let index = self.looked + i;
                    self.resident[index / 64] |= 1 << (index % 64);
                }
            }
            self.looked += chunk;
        }
        Ok(())
    }

    /// A page not looked at counts as resident: better left cached than dropped from a server.
    fn was_resident(&self, page: usize) -> bool {
        page >= self.looked || self.resident[page / 64] & (1 << (page % 64)) != 0
    }

    /// The fraction of the looked-at pages that were resident (1 when none were looked at).
    pub fn fraction(&self) -> f64 {
        if self.looked == 0 {
            return 1.0;
        }
        let count: u32 = self.resident.iter().map(|word| word.count_ones()).sum();
        f64::from(count) / self.looked as f64
    }

    /// Drops from the page cache every run of pages in `[from, until)` that was not resident when
    /// looked at (the range is cut to the looked-at one).
    pub fn drop_brought_in(&self, file: &File, from: u64, until: u64) {
        let mut page = (from.saturating_sub(self.start) / self.page) as usize;
        let last = self.pages_before(until);
        while page < last {
            if self.was_resident(page) {
                page += 1;
                continue;
            }
            let run_start = page;
            while page < last && !self.was_resident(page) {
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

/// Restores the page cache behind a sequential read of `[start, end)`: the pages the reads bring
/// in are dropped a window at a time as the reads pass, so a large file never sits in the cache
/// whole, and the rest (read-ahead included) when the read is done.
pub struct Restorer {
    window: u64,
    end: u64,
    /// Where the next drop starts: everything before it has been restored.
    restored: u64,
    /// Pages past a refused look count as resident (kept), and looking stops.
    before: Residency,
    refused: bool,
}

impl Restorer {
    /// Looks at the start of `[start, end)` now, before the first read.
    pub fn new(file: &File, window: u64, start: u64, end: u64) -> Restorer {
        let mut restorer = Restorer {
            window,
            end,
            restored: start,
            before: Residency::new(start, end.saturating_sub(start)),
            refused: false,
        };
        restorer.look_ahead(file, start);
        restorer
    }

    fn look_ahead(&mut self, file: &File, offset: u64) {
        if self.refused {
            return;
        }
        if let Err(e) = self
            .before
            .look_until(file, offset.saturating_add(LOOK_AHEAD))
        {
            self.refused = true;
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                tracing::warn!(error = %e, "cannot see which pages of a model file are cached (mmap or mincore refused); the pages a verification reads stay cached");
            });
        }
    }

    /// Called after each read that ended at `offset`: residency is looked at further ahead, and
    /// once a whole window lies behind the reads, the pages its reads brought in are dropped.
    pub fn after_read(&mut self, file: &File, offset: u64) {
        if offset >= self.restored + self.window {
            let until = offset - (offset - self.restored) % self.window;
            self.before.drop_brought_in(file, self.restored, until);
            self.restored = until;
            self.look_ahead(file, offset);
        }
    }

    /// After the last read (or a stop): drops what the reads brought in, read-ahead included.
    pub fn finish(self, file: &File) {
        self.before.drop_brought_in(file, self.restored, self.end);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn residency_is_one_bit_per_page_across_look_chunks() {
        // Not tmpfs, whose pages cannot be dropped: the test says so and stops there, and fails
        // under CI=true, where a test it did not run must not pass.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let page = page_size();
        let size = LOOK_CHUNK + 3 * page;
        std::fs::write(&path, vec![7u8; size as usize]).unwrap();
        let file = File::open(&path).unwrap();
        file.sync_all().unwrap();
        posix_fadvise(&file, 0, 0, PosixFadviseAdvice::POSIX_FADV_DONTNEED).unwrap();
        if Residency::look(&file, 0, size).unwrap().fraction() > 0.01 {
            let reason = format!(
                "the pages of {} cannot be dropped (is the temporary folder tmpfs? set TMPDIR)",
                path.display()
            );
            assert!(
                std::env::var("CI").map_or(true, |v| v != "true"),
                "CI=true and this test cannot run: {reason}"
            );
            eprintln!("SKIPPED: {reason}");
            return;
        }
        // One page in the first look chunk and the last page (in the second) made resident.
        let mut buffer = vec![0u8; page as usize];
        std::os::unix::fs::FileExt::read_exact_at(&file, &mut buffer, 5 * page).unwrap();
        std::os::unix::fs::FileExt::read_exact_at(&file, &mut buffer, size - page).unwrap();
        let residency = Residency::look(&file, 0, size).unwrap();
        assert!(residency.was_resident(5));
        assert!(residency.was_resident(residency.pages - 1));
        // Read-ahead may bring in neighbours of the pages read, never the middle of the file.
        assert!(!residency.was_resident(residency.pages / 2));
        assert!(residency.fraction() < 0.1, "{}", residency.fraction());
    }
}
