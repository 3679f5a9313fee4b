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

/// Model name → Unix times of weight-file opens, oldest first.
#[derive(Clone, Default)]
pub struct LoadActivity(Shared<HashMap<String, VecDeque<f64>>>);

impl LoadActivity {
    pub fn record(&self, model: &str, at: f64) {
        self.0.update(|map| {
            let opens = map.entry(model.to_string()).or_default();
            if opens.len() == REMEMBERED {
                opens.pop_front();
            }
            opens.push_back(at);
        });
    }

    /// The last open in `[from, until]`.
    pub fn last_open(&self, model: &str, from: f64, until: f64) -> Option<f64> {
        let map = self.0.borrow();
        map.get(model)?
            .iter()
            .rev()
            .find(|t| **t >= from && **t <= until)
            .copied()
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
        for t in [10.0, 20.0, 30.0] {
            loads.record("llama", t);
        }
        assert_eq!(loads.last_open("llama", 15.0, 25.0), Some(20.0));
        assert_eq!(loads.last_open("llama", 31.0, 40.0), None);
        assert_eq!(loads.last_open("mistral", 0.0, 40.0), None);
    }
}
