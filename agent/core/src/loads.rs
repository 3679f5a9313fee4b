//! When each model's weight files were last opened: the end of a model load, seen through the same
//! inotify watch that keeps the cache verified (opens through an HF snapshot symlink are reported on
//! the blob it points to, inside the watched folder).

use std::collections::{HashMap, VecDeque};
use std::path::Path;

use crate::shared::Shared;

/// File endings of model weights; config and tokenizer files are opened by other things too.
const WEIGHT_EXTENSIONS: [&str; 9] = [
    "safetensors",
    "bin",
    "pt",
    "pth",
    "gguf",
    "ckpt",
    "h5",
    "msgpack",
    "onnx",
];
/// Opens remembered per model: enough to cover the pods starting at once on one node.
const REMEMBERED: usize = 4096;

/// Whether a path names weights. Hub blobs have no extension: every blob counts.
pub fn is_weight_file(path: &Path) -> bool {
    let in_blobs = path
        .parent()
        .and_then(|p| p.file_name())
        .is_some_and(|n| n == "blobs");
    in_blobs
        || path
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| WEIGHT_EXTENSIONS.contains(&e))
}

/// A file by device and inode, as an open or a write of it is reported whichever link was used.
pub type FileId = (u64, u64);

/// Model name → its weight files' opens by other processes, and writes.
#[derive(Clone, Default)]
pub struct LoadActivity(Shared<HashMap<String, ModelLoads>>);

/// One model's opens (Unix time, file), oldest first, when each file was last written, and each
/// file's writes by session.
#[derive(Default)]
struct ModelLoads {
    opens: VecDeque<(f64, FileId)>,
    written: HashMap<FileId, f64>,
    sessions: HashMap<FileId, VecDeque<WriteSession>>,
}

/// Writes of one file from its first to its completion (a close after writing): a download of it.
/// A write after a completion starts another (a retry, a new revision written in place).
#[derive(Clone, Copy, Debug, PartialEq)]
struct WriteSession {
    first: f64,
    /// When it was closed after writing, and its size then.
    completed: Option<(f64, u64)>,
}

/// Sessions kept per file: a retry or two of one download, and the next revision's.
const SESSIONS_KEPT: usize = 8;

/// What was written into a model's cache within a window: from the first write to the last
/// completed file, the bytes of the files completed (each file once, at its last completion).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Download {
    pub first_write: f64,
    pub last_completed: f64,
    pub bytes: u64,
    pub files: usize,
}

impl ModelLoads {
    /// A write of `file`: the latest open of it since its previous write was the writer's (a
    /// download, a repair: one opens a file and writes it at once), not a load; a read before it
    /// stays one. Written again and again (each write call), nothing more is taken back until the
    /// file is opened again.
    fn wrote(&mut self, file: FileId, at: f64) {
        let since = self.written.get(&file).copied();
        let writer = self
            .opens
            .iter()
            .rposition(|(t, f)| *f == file && since.is_none_or(|s| *t > s));
        if let Some(writer) = writer {
            self.opens.remove(writer);
        }
        self.written.insert(file, at);
        // Files written before the oldest open remembered say nothing any more.
        if self.written.len() > REMEMBERED {
            let oldest = self.opens.front().map_or(at, |(t, _)| *t);
            self.written.retain(|_, t| *t >= oldest);
        }
    }

    fn session(&mut self, file: FileId, at: f64, completed: Option<u64>) {
        let sessions = self.sessions.entry(file).or_default();
        let open = sessions.back_mut().filter(|s| s.completed.is_none());
        let session = match open {
            Some(session) => session,
            None => {
                if sessions.len() == SESSIONS_KEPT {
                    sessions.pop_front();
                }
                sessions.push_back(WriteSession {
                    first: at,
                    completed: None,
                });
                sessions.back_mut().expect("just pushed")
            }
        };
        session.completed = completed.map(|bytes| (at, bytes));
        if self.sessions.len() > REMEMBERED {
            // The files written longest ago go first.
            let mut firsts: Vec<f64> = self
                .sessions
                .values()
                .filter_map(|s| s.back().map(|s| s.first))
                .collect();
            firsts.sort_by(f64::total_cmp);
            let cut = firsts[firsts.len() - REMEMBERED];
            self.sessions
                .retain(|_, s| s.back().is_some_and(|s| s.first >= cut));
        }
    }

    /// The download whose writes began within `[from, until]`: None when nothing was written
    /// then, or when a file written then was not completed (a download cut off, still running
    /// or abandoned: no stretch rather than a short one).
    fn download(&self, from: f64, until: f64) -> Option<Download> {
        let mut download: Option<Download> = None;
        for sessions in self.sessions.values() {
            let within: Vec<&WriteSession> = sessions
                .iter()
                .filter(|s| s.first >= from && s.first <= until)
                .collect();
            let Some(last) = within.last() else { continue };
            let (completed_at, bytes) = last.completed.filter(|(at, _)| *at <= until)?;
            let first = within[0].first;
            let d = download.get_or_insert(Download {
                first_write: first,
                last_completed: completed_at,
                bytes: 0,
                files: 0,
            });
            d.first_write = d.first_write.min(first);
            d.last_completed = d.last_completed.max(completed_at);
            d.bytes += bytes;
            d.files += 1;
        }
        download
    }
}

impl LoadActivity {
    /// Another process opened `file`, a weight file of `model`, at `at`.
    pub fn record(&self, model: &str, at: f64, file: FileId) {
        self.0.update(|map| {
            let opens = &mut map.entry(model.to_string()).or_default().opens;
            if opens.len() == REMEMBERED {
                opens.pop_front();
            }
            opens.push_back((at, file));
        });
    }

    /// Another process wrote `file`, a weight file of `model`, at `at`, and closed it then when
    /// `completed` gives its size: the open that wrote it is no load, and the write is part of a
    /// download.
    pub fn record_write(&self, model: &str, file: FileId, at: f64, completed: Option<u64>) {
        self.0.update(|map| {
            let loads = map.entry(model.to_string()).or_default();
            loads.wrote(file, at);
            loads.session(file, at, completed);
        });
    }

    /// What was downloaded into `model`'s cache within `[from, until]` ([`Download`]).
    pub fn download(&self, model: &str, from: f64, until: f64) -> Option<Download> {
        self.0.borrow().get(model)?.download(from, until)
    }

    /// The last open in `[from, until]` that was a read.
    pub fn last_open(&self, model: &str, from: f64, until: f64) -> Option<f64> {
        let map = self.0.borrow();
        map.get(model)?
            .opens
            .iter()
            .rev()
            .map(|(t, _)| *t)
            .find(|t| *t >= from && *t <= until)
    }
}

pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_are_told_from_other_files() {
        assert!(is_weight_file(Path::new(
            "/models/llama/model-00001-of-00004.safetensors"
        )));
        assert!(is_weight_file(Path::new("/hub/models--a--b/blobs/3f2a9c")));
        assert!(!is_weight_file(Path::new("/models/llama/config.json")));
    }

    #[test]
    fn last_open_in_a_window() {
        let loads = LoadActivity::default();
        for (t, inode) in [(10.0, 1), (20.0, 2), (30.0, 1)] {
            loads.record("llama", t, (1, inode));
        }
        assert_eq!(loads.last_open("llama", 15.0, 25.0), Some(20.0));
        assert_eq!(loads.last_open("llama", 31.0, 40.0), None);
        assert_eq!(loads.last_open("mistral", 0.0, 40.0), None);
    }

    /// A download opens a shard and writes it (many writes), a server then reads it: the
    /// download's open is no load, the server's is; a second download of the shard (truncated,
    /// written again) takes back its own open only.
    #[test]
    fn the_opens_that_wrote_a_file_are_no_loads() {
        let loads = LoadActivity::default();
        let (shard, other) = ((1, 7), (1, 8));
        loads.record("llama", 10.0, other);
        loads.record("llama", 11.0, shard);
        for at in [11.1, 11.2, 15.0] {
            loads.record_write("llama", shard, at, None);
        }
        assert_eq!(
            loads.last_open("llama", 0.0, 16.0),
            Some(10.0),
            "the writer's open is gone"
        );
        loads.record("llama", 16.0, shard);
        assert_eq!(
            loads.last_open("llama", 0.0, 17.0),
            Some(16.0),
            "the server's read"
        );
        loads.record("llama", 20.0, shard);
        loads.record_write("llama", shard, 20.5, None);
        assert_eq!(
            loads.last_open("llama", 0.0, 21.0),
            Some(16.0),
            "the second download's open taken back, the read before it kept"
        );
    }

    /// Two shards downloaded (many writes each, then closed), one of them cut and written again
    /// from the start: one download from the first write to the last completion, each file's
    /// bytes once, at its last completion. One written and never completed: no download.
    #[test]
    fn a_download_runs_from_the_first_write_to_the_last_completed_file() {
        let loads = LoadActivity::default();
        let (first, second) = ((1, 1), (1, 2));
        loads.record_write("llama", first, 100.0, None);
        loads.record_write("llama", first, 101.0, Some(300));
        loads.record_write("llama", second, 100.5, None);
        loads.record_write("llama", second, 101.5, Some(100_000));
        loads.record_write("llama", second, 102.0, None);
        loads.record_write("llama", second, 104.0, Some(200_000));
        assert_eq!(
            loads.download("llama", 99.0, 110.0),
            Some(Download {
                first_write: 100.0,
                last_completed: 104.0,
                bytes: 200_300,
                files: 2
            })
        );
        assert_eq!(loads.download("llama", 105.0, 110.0), None, "nothing then");
        loads.record_write("llama", (1, 3), 106.0, None);
        assert_eq!(
            loads.download("llama", 105.0, 110.0),
            None,
            "never completed"
        );
        assert_eq!(loads.download("mistral", 0.0, 110.0), None);
    }
}
