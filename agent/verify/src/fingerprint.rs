//! What a verification saw of the files it found intact, without their content: each file's
//! identity and change state (device, inode, size, mtime and ctime in nanoseconds) and, in a hub
//! cache, the blob its snapshot link names. Folded, in manifest order, into at most
//! [`MAX_BUCKETS`] 64-bit digests, so that a later look (one `stat` per file, no read) tells which
//! groups of files changed since, and only those are hashed again.
//!
//! What this trusts is the kernel's word that a file whose inode, size, mtime and ctime are the
//! same has the same content: every write through the file APIs moves mtime and ctime, and ctime
//! cannot be set back (`utimensat` sets mtime and atime, and moves ctime to now). A raw write to the
//! block device bypasses it; the scheduled full hash still finds that (docs/security.md).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sha2::{Digest, Sha256};

use crate::safe_open::Snapshot;

/// A handful of groups keeps the record small (it lives in a node condition's message) while a
/// change in one file re-hashes a sixteenth of a large model, not all of it.
pub const MAX_BUCKETS: usize = 16;

/// A bucket that no later look matches: it held a file changed so recently that a write in the
/// same timestamp tick could still follow unseen (git's "racily clean" entries).
const NEVER: u64 = 0;

/// A file changed less than this before its verification began is never trusted unchanged later:
/// the kernel stamps times from a clock that ticks every few milliseconds, so two writes close
/// together can leave one mtime and ctime.
const RACY: Duration = Duration::from_secs(2);

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fingerprint {
    buckets: Vec<u64>,
}

impl Fingerprint {
    /// A fingerprint as recorded: 1 to [`MAX_BUCKETS`] digests.
    pub fn from_buckets(buckets: Vec<u64>) -> Result<Fingerprint, String> {
        if buckets.is_empty() || buckets.len() > MAX_BUCKETS {
            return Err(format!(
                "{} buckets; a fingerprint has 1 to {MAX_BUCKETS}",
                buckets.len()
            ));
        }
        Ok(Fingerprint { buckets })
    }

    pub fn buckets(&self) -> &[u64] {
        &self.buckets
    }

    /// How many buckets a manifest of `files` files is folded into.
    pub fn bucket_count(files: usize) -> usize {
        files.clamp(1, MAX_BUCKETS)
    }

    /// The bucket of the manifest's `index`th file: consecutive ranges of the manifest's order.
    pub fn bucket_of(index: usize, files: usize) -> usize {
        index * Fingerprint::bucket_count(files) / files.max(1)
    }

    /// Per bucket of `recorded`, whether this fingerprint (a later look) matches it: the bucket's
    /// files are as they were. None match a record of another shape.
    pub fn unchanged_since(&self, recorded: &Fingerprint) -> Vec<bool> {
        if self.buckets.len() != recorded.buckets.len() {
            return vec![false; self.buckets.len()];
        }
        self.buckets
            .iter()
            .zip(&recorded.buckets)
            .map(|(now, then)| now == then && *then != NEVER)
            .collect()
    }

    /// Whether every bucket can be matched by a later look (none held a racy file).
    pub fn is_complete(&self) -> bool {
        !self.buckets.contains(&NEVER)
    }
}

/// Folds files, in manifest order, into their buckets.
pub(crate) struct Folder {
    files: usize,
    hashers: Vec<Option<Sha256>>,
    /// Files changed after this are racy.
    racy_after: (i64, i64),
}

impl Folder {
    /// For a manifest of `files` files, verified from `started` on.
    pub fn new(files: usize, started: SystemTime) -> Folder {
        let racy_after = started
            .checked_sub(RACY)
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or((0, 0), |d| {
                (d.as_secs() as i64, i64::from(d.subsec_nanos()))
            });
        Folder {
            files,
            hashers: (0..Fingerprint::bucket_count(files))
                .map(|_| Some(Sha256::new()))
                .collect(),
            racy_after,
        }
    }

    /// The `index`th manifest file, found intact as `snapshot` (through `blob`, in a hub cache).
    pub fn add(&mut self, index: usize, path: &str, blob: Option<&str>, snapshot: &Snapshot) {
        let bucket = Fingerprint::bucket_of(index, self.files);
        if snapshot.mtime >= self.racy_after || snapshot.ctime >= self.racy_after {
            self.hashers[bucket] = None;
        }
        let Some(hasher) = self.hashers[bucket].as_mut() else {
            return;
        };
        // Lengths first, so no two different files fold to the same bytes.
        let blob = blob.unwrap_or_default();
        hasher.update((path.len() as u64).to_le_bytes());
        hasher.update(path.as_bytes());
        hasher.update((blob.len() as u64).to_le_bytes());
        hasher.update(blob.as_bytes());
        for value in [
            snapshot.dev,
            snapshot.ino,
            snapshot.size,
            snapshot.mtime.0 as u64,
            snapshot.mtime.1 as u64,
            snapshot.ctime.0 as u64,
            snapshot.ctime.1 as u64,
        ] {
            hasher.update(value.to_le_bytes());
        }
    }

    /// The `index`th manifest file is not intact: its bucket matches nothing.
    pub fn spoil(&mut self, index: usize) {
        self.hashers[Fingerprint::bucket_of(index, self.files)] = None;
    }

    /// The fingerprint, with the buckets in `kept` (bucket, value) taken from an earlier one: their
    /// files matched it and were not hashed again.
    pub fn finish(self, kept: &[(usize, u64)]) -> Fingerprint {
        let mut buckets: Vec<u64> = self
            .hashers
            .into_iter()
            .map(|h| match h {
                Some(h) => {
                    let digest = h.finalize();
                    // A real digest of 0 would read as NEVER: vanishingly rare, and only costs a
                    // re-hash.
                    u64::from_le_bytes(digest[..8].try_into().expect("8 of 32 bytes"))
                }
                None => NEVER,
            })
            .collect();
        for &(bucket, value) in kept {
            buckets[bucket] = value;
        }
        Fingerprint { buckets }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot(ino: u64, ctime: i64) -> Snapshot {
        Snapshot {
            dev: 2049,
            ino,
            size: 100,
            mtime: (ctime, 5),
            ctime: (ctime, 7),
        }
    }

    const LONG_AGO: i64 = 1_700_000_000;

    fn fold(files: &[(String, Snapshot)], started: SystemTime) -> Fingerprint {
        let mut folder = Folder::new(files.len(), started);
        for (i, (path, snap)) in files.iter().enumerate() {
            folder.add(i, path, None, snap);
        }
        folder.finish(&[])
    }

    #[test]
    fn buckets_are_consecutive_ranges_of_at_most_sixteen() {
        assert_eq!(Fingerprint::bucket_count(3), 3);
        assert_eq!(Fingerprint::bucket_count(2000), 16);
        assert_eq!(Fingerprint::bucket_of(0, 2000), 0);
        assert_eq!(Fingerprint::bucket_of(124, 2000), 0);
        assert_eq!(Fingerprint::bucket_of(125, 2000), 1);
        assert_eq!(Fingerprint::bucket_of(1999, 2000), 15);
        assert_eq!(Fingerprint::bucket_of(2, 3), 2);
    }

    #[test]
    fn one_changed_file_changes_only_its_bucket() {
        let now = SystemTime::now();
        let files: Vec<(String, Snapshot)> = (0..40)
            .map(|i| (format!("f{i}"), snapshot(i, LONG_AGO)))
            .collect();
        let before = fold(&files, now);
        assert!(before.is_complete());
        let mut changed = files.clone();
        changed[17].1.ctime.1 += 1;
        let after = fold(&changed, now);
        let differing: Vec<usize> = (0..16)
            .filter(|&b| before.buckets()[b] != after.buckets()[b])
            .collect();
        assert_eq!(differing, vec![Fingerprint::bucket_of(17, 40)]);
    }

    #[test]
    fn a_file_changed_just_before_the_verification_is_never_trusted() {
        let started = UNIX_EPOCH + Duration::from_secs(LONG_AGO as u64 + 1);
        let fingerprint = fold(&[("a".to_string(), snapshot(1, LONG_AGO))], started);
        assert!(!fingerprint.is_complete());
        assert_eq!(fingerprint.buckets(), &[NEVER]);
    }

    #[test]
    fn a_recorded_fingerprint_has_one_to_sixteen_buckets() {
        assert!(Fingerprint::from_buckets(vec![]).is_err());
        assert!(Fingerprint::from_buckets(vec![1; 17]).is_err());
        assert_eq!(
            Fingerprint::from_buckets(vec![1, 2]).unwrap().buckets(),
            &[1, 2]
        );
    }
}
