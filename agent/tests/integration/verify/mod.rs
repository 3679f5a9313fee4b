//! The verifier on real files in temporary directories: every status word, both ways of opening
//! files (openat2 and the O_NOFOLLOW walk), plain directories and Hugging Face caches.

mod escapes;
mod hub_cache;
mod reading;
mod statuses;

use std::os::unix::fs::symlink;
use std::path::Path;
use std::time::{Duration, Instant};

use mlnode_agent::cache::hasher::Control;
use mlnode_agent::cache::layout::Layout;
use mlnode_agent::cache::manifest::{self, TrustPolicy};
use mlnode_agent::cache::report::{FileStatus, Report, Verdict};
use mlnode_agent::cache::safe_open::Strategy;
use mlnode_agent::cache::{verify, VerifyOptions};
use mlnode_testbed as testbed;
use testbed::models::{
    content, sha256_hex, HfCache, PlainModel, SharedStoreCache, COMMIT, OTHER_COMMIT,
};

const STRATEGIES: [Strategy; 2] = [Strategy::Auto, Strategy::Walk];

/// A lock file held as huggingface_hub's filelock holds it for a whole download
/// (`flock(LOCK_EX)`), until dropped.
fn hold_lock(path: &Path) -> nix::fcntl::Flock<std::fs::File> {
    let file = std::fs::File::create(path).unwrap();
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
        .unwrap_or_else(|(_, e)| panic!("flock {}: {e}", path.display()))
}

fn run_with(root: &Path, manifest_json: &str, options: VerifyOptions) -> Report {
    let manifest = manifest::parse(
        Path::new("test-manifest.json"),
        manifest_json.as_bytes(),
        &TrustPolicy::RequireKey,
    )
    .expect("test manifest parses");
    verify(root, &manifest, &options, &Control::default()).expect("verification runs")
}

fn run(root: &Path, manifest_json: &str, strategy: Strategy) -> Report {
    run_with(
        root,
        manifest_json,
        VerifyOptions {
            strategy,
            ..VerifyOptions::default()
        },
    )
}

fn status(report: &Report, path: &str) -> FileStatus {
    report
        .files
        .iter()
        .find(|f| f.path == path)
        .unwrap_or_else(|| panic!("{path} not in report: {:#?}", report.files))
        .status
}

fn error(report: &Report, path: &str) -> String {
    report
        .files
        .iter()
        .find(|f| f.path == path)
        .and_then(|f| f.error.clone())
        .unwrap_or_default()
}
