//! The result of one verification: a status word per file, and the verdict.

use serde::Serialize;

use crate::fingerprint::Fingerprint;

/// What was found for one file. The words are part of the interface: they appear in `--json`
/// output, in the `status` label of `mlnode_model_cache_files`, and in alert rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FileStatus {
    /// Present, a regular file, and its content has the manifest's digest.
    Ok,
    /// Not there (or a dangling symlink) and no download of it is under way.
    Missing,
    /// Its size differs from the manifest's: truncated, partially written, or grown.
    SizeMismatch,
    /// Its content does not have the manifest's digest.
    DigestMismatch,
    /// The manifest's path is absolute, has `..`, `.` or empty components, or a NUL byte; or a Hugging
    /// Face snapshot entry is neither a regular file nor a `../../blobs/<hash>` link.
    UnsafePath,
    /// Opening it would leave ROOT: a symlink on the way points outside, or the path crosses a
    /// mount point.
    EscapesRoot,
    /// A directory, FIFO, socket or device where a file should be.
    NotRegularFile,
    /// Its size, mtime, ctime or inode changed while it was hashed, twice in a row.
    ChangedDuringRead,
    /// Not (yet) right, but a download of it is under way: an `.incomplete` file or a lock file.
    InProgress,
    /// The operating system refused to read it; the error says why.
    IoError,
    /// Present under ROOT but not in the manifest.
    Extra,
}

impl FileStatus {
    pub const ALL: [FileStatus; 11] = [
        FileStatus::Ok,
        FileStatus::Missing,
        FileStatus::SizeMismatch,
        FileStatus::DigestMismatch,
        FileStatus::UnsafePath,
        FileStatus::EscapesRoot,
        FileStatus::NotRegularFile,
        FileStatus::ChangedDuringRead,
        FileStatus::InProgress,
        FileStatus::IoError,
        FileStatus::Extra,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            FileStatus::Ok => "ok",
            FileStatus::Missing => "missing",
            FileStatus::SizeMismatch => "size_mismatch",
            FileStatus::DigestMismatch => "digest_mismatch",
            FileStatus::UnsafePath => "unsafe_path",
            FileStatus::EscapesRoot => "escapes_root",
            FileStatus::NotRegularFile => "not_regular_file",
            FileStatus::ChangedDuringRead => "changed_during_read",
            FileStatus::InProgress => "in_progress",
            FileStatus::IoError => "io_error",
            FileStatus::Extra => "extra",
        }
    }
}

/// One line of the report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FileReport {
    pub path: String,
    pub status: FileStatus,
    /// The size on disk, where the file could be looked at.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    /// The manifest's size, where it gives one and it differs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expected_size: Option<u64>,
    /// The digest computed from the file's content (whole files only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl FileReport {
    pub fn new(path: impl Into<String>, status: FileStatus) -> Self {
        FileReport {
            path: path.into(),
            status,
            size: None,
            expected_size: None,
            sha256: None,
            error: None,
        }
    }

    pub fn with_error(mut self, error: impl Into<String>) -> Self {
        self.error = Some(error.into());
        self
    }

    pub fn with_size(mut self, size: u64) -> Self {
        self.size = Some(size);
        self
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Verified,
    Failed,
}

/// The whole result, also the `--json` document.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub status: Verdict,
    pub revision: Option<String>,
    /// A failure that concerns the whole cache rather than one file (a wrong revision).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Parts of the tree that could not be listed for extra files. Only `fail_on_extra` makes
    /// this a failure: the manifest's files decide the verdict.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listing_error: Option<String>,
    /// The lines kept: every file's, or only those not `ok` when the verification was asked to
    /// keep no `ok` lines (a daemon: on a million-file cache they would be most of its memory).
    pub files: Vec<FileReport>,
    /// The bundle's root digest ([`crate::manifest::Manifest::root_digest`]), hex; none for a
    /// native manifest.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub root_digest: Option<String>,
    /// Files found `ok` whose lines were not kept.
    #[serde(skip)]
    pub ok_not_kept: usize,
    /// What the manifest's files should weigh: their sizes in the manifest, or on disk where it
    /// gives none. An incremental run keeps the last full run's figure.
    #[serde(skip)]
    pub expected_bytes: u64,
    pub bytes_hashed: u64,
    pub seconds: f64,
    /// Files taken as `ok` without hashing because they matched the trusted fingerprint
    /// ([`crate::VerifyOptions::trusted`]).
    #[serde(skip)]
    pub trusted_files: usize,
    /// What a full run saw of its intact files, for a later run to trust
    /// ([`crate::fingerprint`]); None for a run of some files only.
    #[serde(skip)]
    pub fingerprint: Option<Fingerprint>,
}

impl Report {
    /// A verification that failed as a whole before any file was looked at.
    pub fn failed(error: String, revision: Option<String>) -> Report {
        Report {
            status: Verdict::Failed,
            revision,
            error: Some(error),
            listing_error: None,
            files: Vec::new(),
            root_digest: None,
            ok_not_kept: 0,
            expected_bytes: 0,
            bytes_hashed: 0,
            seconds: 0.0,
            trusted_files: 0,
            fingerprint: None,
        }
    }

    /// Files per status word, every word present (zero included) so callers can export all of them.
    pub fn counts(&self) -> Vec<(FileStatus, usize)> {
        FileStatus::ALL
            .iter()
            .map(|&status| {
                let n = self.files.iter().filter(|f| f.status == status).count();
                let unkept = if status == FileStatus::Ok {
                    self.ok_not_kept
                } else {
                    0
                };
                (status, n + unkept)
            })
            .collect()
    }

    pub fn is_verified(&self) -> bool {
        self.status == Verdict::Verified
    }

    /// Verified only when every manifest file is `ok`, nothing failed as a whole, and (if asked)
    /// no file is extra.
    pub fn verdict_of(
        files: &[FileReport],
        error: Option<&str>,
        listing_error: Option<&str>,
        fail_on_extra: bool,
    ) -> Verdict {
        let failed = error.is_some()
            || (fail_on_extra && listing_error.is_some())
            || files.iter().any(|f| match f.status {
                FileStatus::Ok => false,
                FileStatus::Extra => fail_on_extra,
                _ => true,
            });
        if failed {
            Verdict::Failed
        } else {
            Verdict::Verified
        }
    }

    /// Folds in an incremental run, which looked again at the manifest files `looked` and
    /// re-listed the extras: its lines replace theirs, the rest is kept.
    pub fn merge(
        &mut self,
        partial: Report,
        looked: &std::collections::HashSet<String>,
        fail_on_extra: bool,
    ) {
        let mut had_lines = 0;
        self.files.retain(|f| {
            let again = f.status != FileStatus::Extra && looked.contains(&f.path);
            had_lines += usize::from(again);
            f.status != FileStatus::Extra && !again
        });
        // A file looked at again without a kept line was ok, and counted as such.
        self.ok_not_kept =
            self.ok_not_kept.saturating_sub(looked.len() - had_lines) + partial.ok_not_kept;
        self.files.extend(partial.files);
        self.files.sort_by(|a, b| a.path.cmp(&b.path));
        self.revision = partial.revision.or(self.revision.take());
        self.error = partial.error;
        self.listing_error = partial.listing_error;
        self.bytes_hashed = partial.bytes_hashed;
        self.seconds = partial.seconds;
        self.status = Report::verdict_of(
            &self.files,
            self.error.as_deref(),
            self.listing_error.as_deref(),
            fail_on_extra,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn report(files: Vec<FileReport>, ok_not_kept: usize) -> Report {
        let status = Report::verdict_of(&files, None, None, false);
        Report {
            status,
            error: None,
            files,
            ok_not_kept,
            ..Report::failed(String::new(), None)
        }
    }

    fn count(report: &Report, status: FileStatus) -> usize {
        report
            .counts()
            .into_iter()
            .find(|(s, _)| *s == status)
            .map_or(0, |(_, n)| n)
    }

    #[test]
    fn merging_without_ok_lines_keeps_the_counts_right() {
        // 10 files: 9 ok (not kept), "b" missing, and an extra.
        let mut full = report(
            vec![
                FileReport::new("b", FileStatus::Missing),
                FileReport::new("x", FileStatus::Extra),
            ],
            9,
        );
        // "b" is back and "c" (ok until now) is corrupt.
        let partial = report(vec![FileReport::new("c", FileStatus::DigestMismatch)], 1);
        let looked: HashSet<String> = ["b", "c"].map(String::from).into();
        full.merge(partial, &looked, false);
        assert_eq!(count(&full, FileStatus::Ok), 9);
        assert_eq!(count(&full, FileStatus::Missing), 0);
        assert_eq!(count(&full, FileStatus::DigestMismatch), 1);
        assert_eq!(
            count(&full, FileStatus::Extra),
            0,
            "extras are listed afresh"
        );
        assert_eq!(full.status, Verdict::Failed);

        let fixed = report(Vec::new(), 1);
        full.merge(fixed, &HashSet::from(["c".to_string()]), false);
        assert_eq!(count(&full, FileStatus::Ok), 10);
        assert!(full.files.is_empty());
        assert_eq!(full.status, Verdict::Verified);
    }
}
