//! Parallel hashing of byte ranges with a fixed buffer per worker.
//!
//! Work is a list of [`Job`]s, each one whole file or one shard of a file. Workers take jobs
//! from a shared queue sorted largest first (longest-processing-time scheduling), so the last job
//! to finish is a small one and no core idles while one big file finishes alone. Each worker owns
//! one buffer for its lifetime: memory is `threads x BUFFER_SIZE` whatever the model's size.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use nix::fcntl::{posix_fadvise, PosixFadviseAdvice};
use sha2::Digest as _;

use super::layout::Layout;
use super::manifest::HashAlgorithm;
use super::page_cache::Restorer;
use super::safe_open::{OpenFailure, OpenedFile, Root, Snapshot};
use super::throttle::Throttle;

/// Small enough that what a read copies in is still in the core's L2 when SHA-256 reads it back,
/// large enough that the system call is a small part of each read. On the reference machine
/// 64 KiB verified 4 GiB in 1.40 s against 1.53 s with 1 MiB (docs/performance.md).
pub const BUFFER_SIZE: usize = 64 * 1024;

/// Shared between the hashing workers and whoever watches them: bytes done, for a progress bar or
/// a metric, and a flag that stops all workers at their next buffer.
#[derive(Debug, Default)]
pub struct Control {
    pub hashed_bytes: AtomicU64,
    /// What the current run expects to hash, once it knows: the length of a progress bar.
    pub planned_bytes: AtomicU64,
    cancelled: AtomicBool,
    /// Drop the pages a job brought into the page cache once it has hashed them (`serve`: the
    /// cache belongs to the servers on the node); pages that were cached before stay.
    restore_page_cache: bool,
    /// The read rate every worker of every run shares (`verify.max_bytes_per_second`).
    throttle: Option<Arc<Throttle>>,
    /// Time the workers of this run slept for the read rate, summed over workers.
    throttled_nanos: AtomicU64,
}

impl Control {
    /// For `serve`: jobs leave the page cache as they found it, and read at most at `throttle`'s
    /// rate.
    pub fn for_serve(throttle: Option<Arc<Throttle>>) -> Control {
        Control {
            restore_page_cache: true,
            throttle,
            ..Control::default()
        }
    }

    /// Time this run's workers have waited for the read rate.
    pub fn throttled(&self) -> std::time::Duration {
        std::time::Duration::from_nanos(self.throttled_nanos.load(Ordering::Relaxed))
    }

    fn read(&self, bytes: u64) {
        self.hashed_bytes.fetch_add(bytes, Ordering::Relaxed);
        if let Some(throttle) = &self.throttle {
            let slept = throttle.pace(bytes);
            let nanos = u64::try_from(slept.as_nanos()).unwrap_or(u64::MAX);
            self.throttled_nanos.fetch_add(nanos, Ordering::Relaxed);
        }
    }

    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::Relaxed);
    }

    pub fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Relaxed)
    }
}

/// How a job's bytes are digested.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Algorithm {
    Sha256,
    Blake3,
    /// BLAKE2b with a 512-bit digest (Python's `hashlib.blake2b()`, as model_signing uses it).
    Blake2b,
    /// Git's blob id: SHA-1 of `blob <size>\0` and the content. The Hugging Face hub names the
    /// cached copies of files it keeps in git (not LFS) by it.
    GitBlob,
}

impl From<HashAlgorithm> for Algorithm {
    fn from(algorithm: HashAlgorithm) -> Algorithm {
        match algorithm {
            HashAlgorithm::Sha256 => Algorithm::Sha256,
            HashAlgorithm::Blake3 => Algorithm::Blake3,
            HashAlgorithm::Blake2b => Algorithm::Blake2b,
        }
    }
}

/// An incremental digest of any kind. BLAKE3's hasher is large (its chunk stack): boxed.
enum Running {
    Sha256(sha2::Sha256),
    Blake3(Box<blake3::Hasher>),
    Blake2b(blake2::Blake2b512),
    Sha1(sha1::Sha1),
}

impl Running {
    fn new(algorithm: Algorithm, size: u64) -> Running {
        match algorithm {
            Algorithm::Sha256 => Running::Sha256(sha2::Sha256::new()),
            Algorithm::Blake3 => Running::Blake3(Box::new(blake3::Hasher::new())),
            Algorithm::Blake2b => Running::Blake2b(blake2::Blake2b512::new()),
            Algorithm::GitBlob => {
                let mut sha1 = sha1::Sha1::new();
                sha1.update(format!("blob {size}\0").as_bytes());
                Running::Sha1(sha1)
            }
        }
    }

    fn update(&mut self, bytes: &[u8]) {
        match self {
            Running::Sha256(h) => h.update(bytes),
            Running::Blake3(h) => {
                h.update(bytes);
            }
            Running::Blake2b(h) => h.update(bytes),
            Running::Sha1(h) => h.update(bytes),
        }
    }

    fn finish(self) -> Vec<u8> {
        match self {
            Running::Sha256(h) => h.finalize().to_vec(),
            Running::Blake3(h) => h.finalize().as_bytes().to_vec(),
            Running::Blake2b(h) => h.finalize().to_vec(),
            Running::Sha1(h) => h.finalize().to_vec(),
        }
    }
}

/// Hash `len` bytes of `path` from `start`; `len: None` means to the end of the file.
#[derive(Clone, Debug)]
pub struct Job {
    pub path: String,
    pub start: u64,
    pub len: Option<u64>,
    /// For ordering only: the bytes this job is expected to read.
    pub weight: u64,
    /// The file as first seen; a job that finds another file (or the same one changed) retries.
    pub expected: Option<Snapshot>,
    pub algorithm: Algorithm,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JobResult {
    Hashed {
        /// The digest's bytes: 32 for SHA-256, 20 for a git blob id.
        digest: Vec<u8>,
        bytes: u64,
        snapshot: Snapshot,
    },
    Open(OpenFailure),
    /// The file changed under us on both attempts.
    Changed(String),
    Io(String),
    Cancelled,
}

/// Runs every job on the current rayon pool and returns the results in the jobs' order. Job paths
/// are located in `layout` under `root`.
pub fn run(root: &Root, layout: &Layout, jobs: &[Job], control: &Control) -> Vec<JobResult> {
    let mut order: Vec<usize> = (0..jobs.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(jobs[i].weight));
    let next = AtomicUsize::new(0);
    let results: Vec<Mutex<Option<JobResult>>> = jobs.iter().map(|_| Mutex::new(None)).collect();
    let planned: u64 = jobs.iter().map(|job| job.weight).sum();
    control.planned_bytes.fetch_add(planned, Ordering::Relaxed);
    let workers = rayon::current_num_threads().min(jobs.len()).max(1);
    rayon::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|_| {
                let mut buffer = vec![0u8; BUFFER_SIZE];
                loop {
                    let slot = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&index) = order.get(slot) else { break };
                    let result = run_job(root, layout, &jobs[index], &mut buffer, control);
                    *results[index].lock().unwrap_or_else(|p| p.into_inner()) = Some(result);
                }
            });
        }
    });
    results
        .into_iter()
        .map(|slot| {
            slot.into_inner()
                .unwrap_or_else(|p| p.into_inner())
                .unwrap_or(JobResult::Cancelled)
        })
        .collect()
}

fn run_job(
    root: &Root,
    layout: &Layout,
    job: &Job,
    buffer: &mut [u8],
    control: &Control,
) -> JobResult {
    let mut last_change = String::new();
    for _attempt in 0..2 {
        if control.is_cancelled() {
            return JobResult::Cancelled;
        }
        let OpenedFile {
            file,
            snapshot: before,
        } = match layout.open(root, &job.path) {
            Ok(opened) => opened,
            Err(failure) => return JobResult::Open(failure),
        };
        if let Some(expected) = &job.expected {
            if expected != &before {
                last_change = describe_change(expected, &before);
                continue;
            }
        }
        let digest = Running::new(job.algorithm, before.size);
        let restorer = control.restore_page_cache.then(|| {
            let end = job.len.map_or(before.size, |len| job.start + len);
            Restorer::new(&file, RESTORE_WINDOW, job.start, end)
        });
        let hashed = hash_range(&file, job.start, job.len, digest, buffer, control, restorer);
        let (digest, bytes) = match hashed {
            Ok(Some(done)) => done,
            Ok(None) => return JobResult::Cancelled,
            Err(e) => return JobResult::Io(e.to_string()),
        };
        let after = match nix::sys::stat::fstat(&file) {
            Ok(stat) => Snapshot::of(&stat),
            Err(e) => return JobResult::Io(e.desc().to_string()),
        };
        let short_read = job.len.is_some_and(|len| bytes != len);
        if after != before || short_read {
            last_change = if short_read {
                format!(
                    "read {bytes} bytes where {} were expected",
                    job.len.unwrap_or(0)
                )
            } else {
                describe_change(&before, &after)
            };
            continue;
        }
        return JobResult::Hashed {
            digest,
            bytes,
            snapshot: after,
        };
    }
    JobResult::Changed(last_change)
}

fn describe_change(before: &Snapshot, after: &Snapshot) -> String {
    if !before.same_file(after) {
        "it was replaced by another file".into()
    } else if before.size != after.size {
        format!("its size went from {} to {} bytes", before.size, after.size)
    } else {
        "it was modified (mtime/ctime changed)".into()
    }
}

/// The page cache is restored this many bytes at a time: the new pages of a window are dropped
/// right after it is hashed, so a large file never sits in the cache whole.
const RESTORE_WINDOW: u64 = 16 << 20;

/// Hashes a range with positional reads, so shards of one file can be read by several workers
/// at once; `restorer` (serve) drops the pages the reads bring in. Returns None when cancelled.
fn hash_range(
    file: &File,
    start: u64,
    len: Option<u64>,
    mut hasher: Running,
    buffer: &mut [u8],
    control: &Control,
    mut restorer: Option<Restorer>,
) -> std::io::Result<Option<(Vec<u8>, u64)>> {
    // Advice only: a failure changes nothing but speed.
    let advice_len = len.unwrap_or(0).try_into().unwrap_or(0);
    let _ = posix_fadvise(
        file,
        start as libc::off_t,
        advice_len,
        PosixFadviseAdvice::POSIX_FADV_SEQUENTIAL,
    );
    let mut offset = start;
    let end = len.map(|len| start + len);
    let result = loop {
        if control.is_cancelled() {
            break Ok(None);
        }
        let want = match end {
            Some(end) => (end - offset).min(buffer.len() as u64) as usize,
            None => buffer.len(),
        };
        if want == 0 {
            break Ok(Some(()));
        }
        let n = match file.read_at(&mut buffer[..want], offset) {
            Ok(0) => break Ok(Some(())),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => break Err(e),
        };
        hasher.update(&buffer[..n]);
        offset += n as u64;
        if let Some(restorer) = restorer.as_mut() {
            restorer.after_read(file, offset);
        }
        control.read(n as u64);
    };
    if let Some(restorer) = restorer {
        restorer.finish(file);
    }
    Ok(result?.map(|()| (hasher.finish(), offset - start)))
}
