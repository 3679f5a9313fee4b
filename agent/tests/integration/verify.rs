//! The verifier on real files in temporary directories: every status word, both ways of opening
//! files (openat2 and the O_NOFOLLOW walk), plain directories and Hugging Face caches.

use crate::common;

use std::os::unix::fs::symlink;
use std::path::Path;
use std::time::{Duration, Instant};

use common::{content, sha256_hex, HfCache, PlainModel, SharedStoreCache, COMMIT, OTHER_COMMIT};
use mlnode_agent::cache::hasher::Control;
use mlnode_agent::cache::layout::Layout;
use mlnode_agent::cache::manifest::{self, TrustPolicy};
use mlnode_agent::cache::report::{FileStatus, Report, Verdict};
use mlnode_agent::cache::safe_open::Strategy;
use mlnode_agent::cache::{verify, VerifyOptions};

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

#[test]
fn complete_plain_cache_verifies_and_hashes_every_byte() {
    for strategy in STRATEGIES {
        let model = PlainModel::new();
        let report = run(model.root(), &model.manifest_json("v1", true), strategy);
        assert_eq!(report.status, Verdict::Verified, "{report:#?}");
        assert!(report.files.iter().all(|f| f.status == FileStatus::Ok));
        let total: u64 = model.files.values().map(|b| b.len() as u64).sum();
        assert_eq!(report.bytes_hashed, total);
        assert_eq!(report.revision.as_deref(), Some("v1"));
        let config = report
            .files
            .iter()
            .find(|f| f.path == "config.json")
            .unwrap();
        assert_eq!(
            config.sha256.as_deref(),
            Some(sha256_hex(&model.files["config.json"]).as_str())
        );
    }
}

#[test]
fn wrong_revision_fails_without_hashing() {
    let model = PlainModel::new();
    let options = VerifyOptions {
        revision: Some("v2".into()),
        ..VerifyOptions::default()
    };
    let report = run_with(model.root(), &model.manifest_json("v1", true), options);
    assert_eq!(report.status, Verdict::Failed);
    assert!(
        report
            .error
            .as_deref()
            .unwrap()
            .contains("revision mismatch"),
        "{report:?}"
    );
    assert_eq!(report.bytes_hashed, 0);
}

#[test]
fn truncated_file_is_a_size_mismatch_found_without_reading() {
    let model = PlainModel::new();
    let shard = "model-00001-of-00002.safetensors";
    let original = &model.files[shard];
    std::fs::write(model.path(shard), &original[..original.len() / 2]).unwrap();
    let report = run(
        model.root(),
        &model.manifest_json("v1", true),
        Strategy::Auto,
    );
    assert_eq!(status(&report, shard), FileStatus::SizeMismatch);
    assert_eq!(report.status, Verdict::Failed);
    // The other files were hashed, the truncated one was not read at all.
    let others: u64 = model
        .files
        .iter()
        .filter(|(p, _)| *p != shard)
        .map(|(_, b)| b.len() as u64)
        .sum();
    assert_eq!(report.bytes_hashed, others);
}

#[test]
fn truncated_file_without_size_in_manifest_is_a_digest_mismatch() {
    let model = PlainModel::new();
    let shard = "model-00002-of-00002.safetensors";
    std::fs::write(model.path(shard), b"short").unwrap();
    let report = run(
        model.root(),
        &model.manifest_json("v1", false),
        Strategy::Auto,
    );
    assert_eq!(status(&report, shard), FileStatus::DigestMismatch);
}

#[test]
fn one_flipped_byte_is_a_digest_mismatch() {
    let model = PlainModel::new();
    let shard = "model-00001-of-00002.safetensors";
    let mut bytes = model.files[shard].clone();
    bytes[12345] ^= 1;
    std::fs::write(model.path(shard), &bytes).unwrap();
    let report = run(
        model.root(),
        &model.manifest_json("v1", true),
        Strategy::Auto,
    );
    assert_eq!(status(&report, shard), FileStatus::DigestMismatch);
    assert!(error(&report, shard).contains(&sha256_hex(&model.files[shard])));
}

#[test]
fn missing_file_is_missing() {
    for strategy in STRATEGIES {
        let model = PlainModel::new();
        std::fs::remove_file(model.path("tokenizer/tokenizer.json")).unwrap();
        let report = run(model.root(), &model.manifest_json("v1", true), strategy);
        assert_eq!(
            status(&report, "tokenizer/tokenizer.json"),
            FileStatus::Missing
        );
        assert_eq!(report.status, Verdict::Failed);
    }
}

#[test]
fn unsafe_manifest_paths_are_refused_before_any_open() {
    let model = PlainModel::new();
    let digest = sha256_hex(b"x");
    for path in [
        "../outside.json",
        "/etc/passwd",
        "a/../config.json",
        "./config.json",
        "a//b",
        "dir/",
        "",
    ] {
        let manifest = serde_json::json!({"revision": "v1", "files": {path: digest}}).to_string();
        let report = run(model.root(), &manifest, Strategy::Auto);
        assert_eq!(
            status(&report, path),
            FileStatus::UnsafePath,
            "path {path:?}"
        );
        assert_eq!(report.status, Verdict::Failed);
    }
}

#[test]
fn symlink_to_etc_passwd_escapes_root() {
    for strategy in STRATEGIES {
        let model = PlainModel::new();
        std::fs::remove_file(model.path("config.json")).unwrap();
        symlink("/etc/passwd", model.path("config.json")).unwrap();
        let report = run(model.root(), &model.manifest_json("v1", true), strategy);
        assert_eq!(
            status(&report, "config.json"),
            FileStatus::EscapesRoot,
            "{strategy:?}"
        );

        // The same file reached by climbing out with `..` is caught too.
        std::fs::remove_file(model.path("config.json")).unwrap();
        symlink(
            "../../../../../../../../etc/passwd",
            model.path("config.json"),
        )
        .unwrap();
        let report = run(model.root(), &model.manifest_json("v1", true), strategy);
        assert_eq!(
            status(&report, "config.json"),
            FileStatus::EscapesRoot,
            "{strategy:?}"
        );
    }
}

#[test]
fn directory_symlink_that_escapes_is_caught_on_the_way() {
    for strategy in STRATEGIES {
        let model = PlainModel::new();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(
            outside.path().join("tokenizer.json"),
            &model.files["tokenizer/tokenizer.json"],
        )
        .unwrap();
        std::fs::remove_dir_all(model.path("tokenizer")).unwrap();
        symlink(outside.path(), model.path("tokenizer")).unwrap();
        let report = run(model.root(), &model.manifest_json("v1", true), strategy);
        // Same content, but outside ROOT: not acceptable.
        assert_eq!(
            status(&report, "tokenizer/tokenizer.json"),
            FileStatus::EscapesRoot,
            "{strategy:?}"
        );
    }
}

#[test]
fn symlink_chain_inside_root_is_fine() {
    for strategy in STRATEGIES {
        let model = PlainModel::new();
        let shard = "model-00002-of-00002.safetensors";
        std::fs::create_dir_all(model.path("store/deep")).unwrap();
        std::fs::rename(model.path(shard), model.path("store/deep/real.bin")).unwrap();
        symlink("deep/real.bin", model.path("store/hop")).unwrap();
        symlink("store/hop", model.path(shard)).unwrap();
        let report = run(model.root(), &model.manifest_json("v1", true), strategy);
        assert_eq!(
            status(&report, shard),
            FileStatus::Ok,
            "{strategy:?}: {report:#?}"
        );
        assert_eq!(report.status, Verdict::Verified);
        assert_eq!(status(&report, "store/deep/real.bin"), FileStatus::Extra);
    }
}

/// A model_signing bundle signed with `allow_symlinks: false` (model_signing's default) reaches no
/// file through a symlink, even one that stays inside ROOT, in either way of opening; the other
/// files still verify. A directory symlink on the way is refused the same.
#[test]
fn a_bundle_without_allow_symlinks_refuses_every_symlink() {
    for strategy in STRATEGIES {
        let model = PlainModel::new();
        let shard = "model-00002-of-00002.safetensors";
        std::fs::create_dir_all(model.path("store")).unwrap();
        std::fs::rename(model.path(shard), model.path("store/real.bin")).unwrap();
        symlink("store/real.bin", model.path(shard)).unwrap();
        let mut manifest = manifest::parse(
            Path::new("bundle.sig"),
            model.manifest_json("v1", true).as_bytes(),
            &TrustPolicy::RequireKey,
        )
        .unwrap();
        manifest.allow_symlinks = false;
        let options = VerifyOptions {
            strategy,
            ..VerifyOptions::default()
        };
        let report = verify(model.root(), &manifest, &options, &Control::default()).unwrap();
        assert_eq!(
            status(&report, shard),
            FileStatus::UnsafePath,
            "{strategy:?}"
        );
        assert!(
            error(&report, shard).contains("allow_symlinks"),
            "{report:#?}"
        );
        assert_eq!(status(&report, "config.json"), FileStatus::Ok);
        assert_eq!(report.status, Verdict::Failed);

        // The file back in place, its folder reached through a symlinked directory instead.
        std::fs::remove_file(model.path(shard)).unwrap();
        std::fs::rename(model.path("store/real.bin"), model.path(shard)).unwrap();
        let nested = "tokenizer/tokenizer.json";
        std::fs::rename(model.path("tokenizer"), model.path("store/tok")).unwrap();
        symlink("store/tok", model.path("tokenizer")).unwrap();
        let report = verify(model.root(), &manifest, &options, &Control::default()).unwrap();
        assert_eq!(
            status(&report, nested),
            FileStatus::UnsafePath,
            "{strategy:?}"
        );
        assert_eq!(status(&report, shard), FileStatus::Ok, "{strategy:?}");
        manifest.allow_symlinks = true;
        let report = verify(model.root(), &manifest, &options, &Control::default()).unwrap();
        assert_eq!(status(&report, nested), FileStatus::Ok, "{strategy:?}");
    }
}

#[test]
fn symlink_loop_is_an_io_error_not_a_hang() {
    for strategy in STRATEGIES {
        let model = PlainModel::new();
        std::fs::remove_file(model.path("config.json")).unwrap();
        symlink("loop-b", model.path("config.json")).unwrap();
        symlink("config.json", model.path("loop-b")).unwrap();
        let report = run(model.root(), &model.manifest_json("v1", true), strategy);
        assert_eq!(
            status(&report, "config.json"),
            FileStatus::IoError,
            "{strategy:?}"
        );
        assert!(
            error(&report, "config.json").contains("symbolic links"),
            "{report:#?}"
        );
    }
}

#[test]
fn fifo_in_place_of_a_weight_file_does_not_block() {
    for strategy in STRATEGIES {
        let model = PlainModel::new();
        let shard = "model-00001-of-00002.safetensors";
        std::fs::remove_file(model.path(shard)).unwrap();
        nix::unistd::mkfifo(&model.path(shard), nix::sys::stat::Mode::S_IRWXU).unwrap();
        let started = Instant::now();
        let report = run(model.root(), &model.manifest_json("v1", true), strategy);
        assert!(started.elapsed() < Duration::from_secs(5));
        assert_eq!(status(&report, shard), FileStatus::NotRegularFile);
        assert!(error(&report, shard).contains("FIFO"));
    }
}

#[test]
fn directory_in_place_of_a_file_is_not_a_regular_file() {
    for strategy in STRATEGIES {
        let model = PlainModel::new();
        std::fs::remove_file(model.path("config.json")).unwrap();
        std::fs::create_dir(model.path("config.json")).unwrap();
        let report = run(model.root(), &model.manifest_json("v1", true), strategy);
        assert_eq!(status(&report, "config.json"), FileStatus::NotRegularFile);
    }
}

#[test]
fn extra_files_are_listed_and_fail_only_when_asked() {
    let model = PlainModel::new();
    std::fs::write(model.path("stray.bin"), b"not in the manifest").unwrap();
    std::fs::create_dir_all(model.path(".git")).unwrap();
    std::fs::write(model.path(".git/HEAD"), b"ref: refs/heads/main").unwrap();
    let json = model.manifest_json("v1", true);
    let report = run(model.root(), &json, Strategy::Auto);
    assert_eq!(report.status, Verdict::Verified);
    assert_eq!(status(&report, "stray.bin"), FileStatus::Extra);
    assert!(
        report.files.iter().all(|f| !f.path.starts_with(".git")),
        "git metadata is not model content"
    );
    let strict = VerifyOptions {
        fail_on_extra: true,
        ..VerifyOptions::default()
    };
    assert_eq!(
        run_with(model.root(), &json, strict).status,
        Verdict::Failed
    );
}

#[test]
fn partial_download_in_a_local_dir_is_in_progress() {
    let model = PlainModel::new();
    let shard = "model-00002-of-00002.safetensors";
    std::fs::write(model.path(shard), b"first bytes").unwrap();
    let json = model.manifest_json("v1", true);
    assert_eq!(
        status(&run(model.root(), &json, Strategy::Auto), shard),
        FileStatus::SizeMismatch
    );
    // `hf download --local-dir` keeps its partial file and lock here.
    let marker_dir = model.path(".cache/huggingface/download");
    std::fs::create_dir_all(&marker_dir).unwrap();
    std::fs::write(
        marker_dir.join(format!("{shard}.incomplete")),
        b"first bytes",
    )
    .unwrap();
    let report = run(model.root(), &json, Strategy::Auto);
    assert_eq!(status(&report, shard), FileStatus::InProgress);
    assert_eq!(
        report.status,
        Verdict::Failed,
        "a cache still downloading is not verified"
    );
    // The metadata folder is not model content.
    assert!(report.files.iter().all(|f| !f.path.starts_with(".cache")));
}

#[test]
fn lingering_lock_file_does_not_excuse_a_corrupt_file() {
    let model = PlainModel::new();
    let marker_dir = model.path(".cache/huggingface/download");
    std::fs::create_dir_all(&marker_dir).unwrap();
    std::fs::write(marker_dir.join("config.json.lock"), b"").unwrap();
    let json = model.manifest_json("v1", true);
    // A good file stays ok whatever markers lie around.
    assert_eq!(
        status(&run(model.root(), &json, Strategy::Auto), "config.json"),
        FileStatus::Ok
    );
}

#[test]
fn hf_cache_resolves_refs_and_verifies_the_snapshot() {
    for strategy in STRATEGIES {
        let cache = HfCache::new();
        let json = cache.manifest_json(COMMIT);
        let report = run(&cache.root(), &json, strategy);
        assert_eq!(report.status, Verdict::Verified, "{report:#?}");
        assert_eq!(report.revision.as_deref(), Some(COMMIT));
        // `--revision main` names the same commit through refs/main.
        let options = VerifyOptions {
            revision: Some("main".into()),
            strategy,
            ..VerifyOptions::default()
        };
        assert_eq!(
            run_with(&cache.root(), &json, options).status,
            Verdict::Verified
        );
    }
}

#[test]
fn hf_cache_at_another_revision_fails() {
    let cache = HfCache::new();
    // The manifest is for OTHER_COMMIT, the cache's main is COMMIT.
    std::fs::create_dir_all(cache.snapshot(OTHER_COMMIT)).unwrap();
    let options = VerifyOptions {
        revision: Some("main".into()),
        ..VerifyOptions::default()
    };
    let report = run_with(&cache.root(), &cache.manifest_json(OTHER_COMMIT), options);
    assert_eq!(report.status, Verdict::Failed);
    let message = report.error.unwrap();
    assert!(
        message.contains("revision mismatch") && message.contains(COMMIT),
        "{message}"
    );
}

#[test]
fn hf_cache_dangling_symlink_is_missing_and_incomplete_blob_is_in_progress() {
    let cache = HfCache::new();
    let blob = sha256_hex(&cache.files["model.safetensors"]);
    std::fs::remove_file(cache.root().join("blobs").join(&blob)).unwrap();
    let json = cache.manifest_json(COMMIT);
    let report = run(&cache.root(), &json, Strategy::Auto);
    assert_eq!(status(&report, "model.safetensors"), FileStatus::Missing);

    std::fs::write(
        cache
            .root()
            .join("blobs")
            .join(format!("{blob}.incomplete")),
        b"partial",
    )
    .unwrap();
    let report = run(&cache.root(), &json, Strategy::Auto);
    assert_eq!(status(&report, "model.safetensors"), FileStatus::InProgress);
    assert_eq!(report.status, Verdict::Failed);
}

#[test]
fn hf_cache_lock_held_for_a_missing_blob_is_in_progress() {
    let cache = HfCache::new();
    let blob = sha256_hex(&cache.files["config.json"]);
    std::fs::remove_file(cache.snapshot(COMMIT).join("config.json")).unwrap();
    let locks = cache.hub.path().join(".locks/models--org--tiny");
    std::fs::create_dir_all(&locks).unwrap();
    // Held as huggingface_hub's filelock holds it for the whole download: flock(LOCK_EX).
    let lock = hold_lock(&locks.join(format!("{blob}.lock")));
    let report = run(&cache.root(), &cache.manifest_json(COMMIT), Strategy::Auto);
    assert_eq!(status(&report, "config.json"), FileStatus::InProgress);
    // The download ends (or dies): its lock file stays, and no longer excuses anything.
    drop(lock);
    let report = run(&cache.root(), &cache.manifest_json(COMMIT), Strategy::Auto);
    assert_eq!(status(&report, "config.json"), FileStatus::Missing);
}

/// huggingface_hub 2.x downloads to a process-unique `blobs/<sha256>.<8 hex>.incomplete`
/// (`_download_to_tmp_and_move` in file_download.py, 2.4.0); and the `.lock` every finished
/// download leaves behind does not turn a corrupt blob into `in_progress`.
#[test]
fn hf_cache_markers_of_huggingface_hub_2() {
    let cache = HfCache::new();
    let blob = sha256_hex(&cache.files["model.safetensors"]);
    let blobs = cache.root().join("blobs");
    std::fs::remove_file(blobs.join(&blob)).unwrap();
    std::fs::write(
        blobs.join(format!("{blob}.3f9a0c1e.incomplete")),
        b"partial",
    )
    .unwrap();
    let json = cache.manifest_json(COMMIT);
    assert_eq!(
        status(
            &run(&cache.root(), &json, Strategy::Auto),
            "model.safetensors"
        ),
        FileStatus::InProgress
    );

    let corrupt = HfCache::new();
    let blob = sha256_hex(&corrupt.files["model.safetensors"]);
    std::fs::write(corrupt.root().join("blobs").join(&blob), b"bit rot").unwrap();
    let locks = corrupt.hub.path().join(".locks/models--org--tiny");
    std::fs::create_dir_all(&locks).unwrap();
    std::fs::write(locks.join(format!("{blob}.lock")), b"").unwrap();
    let report = run(
        &corrupt.root(),
        &corrupt.manifest_json(COMMIT),
        Strategy::Auto,
    );
    assert_eq!(
        status(&report, "model.safetensors"),
        FileStatus::DigestMismatch
    );
}

#[test]
fn hf_snapshot_entry_of_the_wrong_form_is_unsafe() {
    let cache = HfCache::new();
    let entry = cache.snapshot(COMMIT).join("sub/extra.json");
    let blob = sha256_hex(&cache.files["sub/extra.json"]);
    std::fs::remove_file(&entry).unwrap();
    // Stays inside ROOT but is not how the hub links: one `../` too few for a nested entry.
    symlink(format!("../../blobs/{blob}"), &entry).unwrap();
    // ...which from snapshots/<commit>/sub/ lands in snapshots/blobs/.
    std::fs::create_dir_all(cache.root().join("snapshots/blobs")).unwrap();
    std::fs::copy(
        cache.root().join("blobs").join(&blob),
        cache.root().join("snapshots/blobs").join(&blob),
    )
    .unwrap();
    let report = run(&cache.root(), &cache.manifest_json(COMMIT), Strategy::Auto);
    assert_eq!(
        status(&report, "sub/extra.json"),
        FileStatus::UnsafePath,
        "{report:#?}"
    );
}

#[test]
fn hf_snapshot_symlink_to_etc_passwd_escapes_root() {
    let cache = HfCache::new();
    let entry = cache.snapshot(COMMIT).join("config.json");
    std::fs::remove_file(&entry).unwrap();
    symlink("/etc/passwd", &entry).unwrap();
    let report = run(&cache.root(), &cache.manifest_json(COMMIT), Strategy::Walk);
    assert_eq!(status(&report, "config.json"), FileStatus::EscapesRoot);
}

#[test]
fn hf_snapshot_regular_file_is_accepted() {
    let cache = HfCache::new();
    let entry = cache.snapshot(COMMIT).join("config.json");
    std::fs::remove_file(&entry).unwrap();
    std::fs::write(&entry, &cache.files["config.json"]).unwrap();
    let report = run(&cache.root(), &cache.manifest_json(COMMIT), Strategy::Auto);
    assert_eq!(report.status, Verdict::Verified, "{report:#?}");
}

#[test]
fn file_changed_while_hashing_is_retried_then_reported() {
    use mlnode_agent::cache::hasher::{self, Job, JobResult};
    use mlnode_agent::cache::safe_open::Root;
    let model = PlainModel::new();
    let root = Root::open(model.root()).unwrap();
    let shard = "model-00001-of-00002.safetensors";
    let first = root.open_file(shard).unwrap().snapshot;
    // Rewritten after the first look: both attempts see a file other than the one planned.
    std::fs::write(model.path(shard), content(9, 1000)).unwrap();
    let job = Job {
        path: shard.into(),
        start: 0,
        len: None,
        weight: first.size,
        expected: Some(first),
        algorithm: mlnode_agent::cache::hasher::Algorithm::Sha256,
    };
    let results = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap()
        .install(|| hasher::run(&root, &Layout::Plain, &[job], &Control::default()));
    match &results[0] {
        JobResult::Changed(reason) => assert!(
            reason.contains("size") || reason.contains("replaced"),
            "{reason}"
        ),
        other => panic!("expected Changed, got {other:?}"),
    }
}

#[test]
fn cancelled_control_stops_hashing() {
    let model = PlainModel::new();
    let manifest = manifest::parse(
        Path::new("m.json"),
        model.manifest_json("v1", true).as_bytes(),
        &TrustPolicy::RequireKey,
    )
    .unwrap();
    let control = Control::default();
    control.cancel();
    let result = verify(model.root(), &manifest, &VerifyOptions::default(), &control);
    assert!(result.is_err(), "a cancelled run must not produce a report");
    assert_eq!(
        control
            .hashed_bytes
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
}

/// A daemon keeps only the lines of files that are not ok: a cache of more files than one
/// hashing batch (4,096) is counted right, its one failure and its extra reported, its bytes
/// summed; the CLI's report keeps every line of the same run.
#[test]
fn a_cache_larger_than_a_batch_is_counted_without_keeping_ok_lines() {
    let dir = tempfile::tempdir().unwrap();
    let n = 5000;
    let mut files = serde_json::Map::new();
    for i in 0..n {
        let rel = format!("d{}/f{i:05}", i % 7);
        let data = format!("file {i}\n");
        std::fs::create_dir_all(dir.path().join(format!("d{}", i % 7))).unwrap();
        std::fs::write(dir.path().join(&rel), &data).unwrap();
        files.insert(
            rel,
            serde_json::json!({"sha256": sha256_hex(data.as_bytes()), "size": data.len()}),
        );
    }
    let total: u64 = (0..n).map(|i| format!("file {i}\n").len() as u64).sum();
    std::fs::write(dir.path().join("d1/f04999"), "file 9999\n").unwrap();
    std::fs::write(dir.path().join("d0/stray"), "x").unwrap();
    let manifest = serde_json::json!({"files": files}).to_string();

    let daemon = run_with(
        dir.path(),
        &manifest,
        VerifyOptions {
            keep_ok_lines: false,
            ..VerifyOptions::default()
        },
    );
    let count = |report: &Report, want: FileStatus| {
        report
            .counts()
            .into_iter()
            .find(|(s, _)| *s == want)
            .unwrap()
            .1
    };
    assert_eq!(count(&daemon, FileStatus::Ok), n - 1);
    assert_eq!(count(&daemon, FileStatus::DigestMismatch), 1);
    assert_eq!(count(&daemon, FileStatus::Extra), 1);
    assert_eq!(daemon.files.len(), 2, "{:#?}", daemon.files);
    assert_eq!(status(&daemon, "d1/f04999"), FileStatus::DigestMismatch);
    assert_eq!(status(&daemon, "d0/stray"), FileStatus::Extra);
    assert_eq!(daemon.expected_bytes, total);
    assert_eq!(daemon.status, Verdict::Failed);

    let cli = run_with(dir.path(), &manifest, VerifyOptions::default());
    assert_eq!(cli.files.len(), n + 1);
    assert_eq!(cli.counts(), daemon.counts());
}

/// `serve`'s verification leaves the page cache as it found it: a cold file is not left cached, a
/// hot one (a model a server just loaded) stays cached; the CLI's leaves what it read. Needs a
/// file system whose pages can be dropped (not tmpfs): the test says so and stops where not.
#[test]
fn a_verification_in_serve_leaves_the_page_cache_as_it_found_it() {
    use mlnode_agent::cache::page_cache::Residency;
    use nix::fcntl::{posix_fadvise, PosixFadviseAdvice};

    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    // The cold file spans three 16 MiB restore windows: the kernel's read-ahead (doubled for a
    // sequential reader) runs past a window's end before the window is done.
    let mut files = serde_json::Map::new();
    for (name, size) in [("cold.bin", 48 << 20), ("hot.bin", 8 << 20)] {
        let data: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
        std::fs::write(dir.path().join(name), &data).unwrap();
        files.insert(name.into(), serde_json::json!(sha256_hex(&data)));
    }
    let manifest = serde_json::json!({ "files": files }).to_string();
    let open = |name: &str| std::fs::File::open(dir.path().join(name)).unwrap();
    let residency = |name: &str| {
        let file = open(name);
        let size = file.metadata().unwrap().len();
        Residency::look(&file, 0, size).unwrap().fraction()
    };
    let make_cold = |name: &str| {
        let file = open(name);
        file.sync_all().unwrap();
        posix_fadvise(&file, 0, 0, PosixFadviseAdvice::POSIX_FADV_DONTNEED).unwrap();
    };
    let make_hot = |name: &str| drop(std::fs::read(dir.path().join(name)).unwrap());
    let run = |control: &Control| {
        let manifest = manifest::parse(
            Path::new("m.json"),
            manifest.as_bytes(),
            &TrustPolicy::RequireKey,
        )
        .unwrap();
        let report = verify(dir.path(), &manifest, &VerifyOptions::default(), control).unwrap();
        assert!(report.is_verified(), "{:#?}", report.files);
    };

    make_cold("cold.bin");
    if residency("cold.bin") > 0.01 {
        return common::missing(&format!(
            "pages of {} cannot be dropped from the page cache (tmpfs?)",
            dir.path().display()
        ));
    }
    make_hot("hot.bin");
    assert!(residency("hot.bin") > 0.99);

    run(&Control::for_serve(None));
    assert!(
        residency("cold.bin") < 0.01,
        "the cold file was left cached: {}",
        residency("cold.bin")
    );
    assert!(
        residency("hot.bin") > 0.99,
        "the hot file was dropped: {}",
        residency("hot.bin")
    );

    // The CLI leaves what it read: the same cold file ends up cached.
    run(&Control::default());
    assert!(residency("cold.bin") > 0.99);
}

/// `verify.max_bytes_per_second`: all of a run's workers together read no faster than the rate
/// (less the throttle's slack), and the time they waited is counted for the metric.
#[test]
fn a_throttled_verification_reads_no_faster_than_the_rate() {
    use mlnode_agent::cache::throttle::{Throttle, SLACK};
    use std::sync::Arc;

    let model = PlainModel::new();
    let manifest = manifest::parse(
        Path::new("m.json"),
        model.manifest_json(COMMIT, true).as_bytes(),
        &TrustPolicy::RequireKey,
    )
    .unwrap();
    let bytes: u64 = model.files.values().map(|f| f.len() as u64).sum();
    let rate = 1 << 20;
    let control = Control::for_serve(Some(Arc::new(Throttle::new(rate))));
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(4)
        .build()
        .unwrap();
    let started = Instant::now();
    let report = pool
        .install(|| verify(model.root(), &manifest, &VerifyOptions::default(), &control))
        .unwrap();
    let took = started.elapsed();
    assert!(report.is_verified(), "{:#?}", report.files);
    // The last read's booking ends at bytes/rate; its reader leaves at most SLACK early.
    let at_rate = Duration::from_secs_f64(bytes as f64 / rate as f64);
    assert!(
        took + SLACK >= at_rate,
        "{bytes} bytes at {rate} B/s took {took:?}"
    );
    assert!(
        control.throttled() + SLACK >= at_rate / 2,
        "waited {:?} in all",
        control.throttled()
    );
}

/// Verifies repo `name` of `cache` against its own blob names.
fn verify_shared(cache: &SharedStoreCache, name: &str, strategy: Strategy) -> Report {
    let manifest = manifest::hub::from_blob_names(&cache.repo(name), None).unwrap();
    let options = VerifyOptions {
        strategy,
        ..VerifyOptions::default()
    };
    verify(&cache.repo(name), &manifest, &options, &Control::default()).unwrap()
}

/// `hf cache scan` accepts both repos; so does the verifier, for both, though their blobs lie
/// outside the repo folders: a link of exactly the hub's form into the hub's marked store. The
/// content is still checked: one corrupted store entry fails both repos.
#[test]
fn hf_cache_files_in_the_shared_xet_store_verify_and_fail_together() {
    let cache = SharedStoreCache::new();
    for strategy in STRATEGIES {
        for repo in ["llama", "llama-copy"] {
            let report = verify_shared(&cache, repo, strategy);
            assert_eq!(
                report.status,
                Verdict::Verified,
                "{repo} {strategy:?}: {report:#?}"
            );
        }
    }
    let entry = cache.corrupt_store_entry();
    for repo in ["llama", "llama-copy"] {
        let report = verify_shared(&cache, repo, Strategy::Auto);
        assert_eq!(
            status(&report, "model.safetensors"),
            FileStatus::DigestMismatch,
            "{repo}"
        );
        assert_eq!(status(&report, "sub/config.json"), FileStatus::Ok, "{repo}");
    }
    std::fs::remove_file(&entry).unwrap();
    let report = verify_shared(&cache, "llama", Strategy::Auto);
    assert_eq!(status(&report, "model.safetensors"), FileStatus::Missing);
}

/// Only the hub's exact forms lead out of the repo folder: a blob link into an unmarked
/// directory, into the store by another shape, or a store entry that is itself a link, stays
/// refused.
#[test]
fn hf_cache_links_out_of_the_repo_are_refused_unless_they_are_the_stores_own() {
    let cache = SharedStoreCache::new();
    let blob = cache
        .repo("llama")
        .join("blobs")
        .join(sha256_hex(&cache.weights));
    let store = cache.dir.path().join("hub/blobs");
    let entry = cache.store_entry();
    let hash = entry.file_name().unwrap().to_str().unwrap().to_string();
    let relink = |target: &str| {
        std::fs::remove_file(&blob).unwrap();
        symlink(target, &blob).unwrap();
    };

    // Another shape of link into the same store file.
    relink(&format!("../../blobs/./{}/{hash}", &hash[..2]));
    let report = verify_shared(&cache, "llama", Strategy::Auto);
    assert_eq!(
        status(&report, "model.safetensors"),
        FileStatus::EscapesRoot
    );
    relink(&format!("../../blobs/{}/{hash}", &hash[..2]));
    assert_eq!(
        verify_shared(&cache, "llama", Strategy::Auto).status,
        Verdict::Verified
    );

    // The store without huggingface_hub's marker is just a directory outside the repo.
    let marker = store.join(".huggingface-shared-blobs");
    std::fs::rename(&marker, store.join("marker.saved")).unwrap();
    let report = verify_shared(&cache, "llama", Strategy::Auto);
    assert_eq!(
        status(&report, "model.safetensors"),
        FileStatus::EscapesRoot
    );
    assert!(error(&report, "model.safetensors").contains(".huggingface-shared-blobs"));
    std::fs::rename(store.join("marker.saved"), &marker).unwrap();

    // A store entry that is a link (to /etc/passwd, or anywhere) is not the hub's.
    std::fs::remove_file(&entry).unwrap();
    symlink("/etc/passwd", &entry).unwrap();
    let report = verify_shared(&cache, "llama", Strategy::Auto);
    assert_eq!(status(&report, "model.safetensors"), FileStatus::UnsafePath);
}

/// huggingface_hub's tree listing of `cache`'s commit, written by its own code
/// (tests/hf_cache/tree_listing.py): every file of the cache as an LFS file, plus `extra`.
fn write_tree_listing(cache: &HfCache, extra: &[(&str, &[u8])]) {
    let mut listing = serde_json::Map::new();
    for (path, bytes) in cache
        .files
        .iter()
        .map(|(p, b)| (p.as_str(), b.as_slice()))
        .chain(extra.iter().copied())
    {
        listing.insert(
            path.to_string(),
            serde_json::json!({"size": 134, "blob_id": "0".repeat(40),
                "lfs_sha256": sha256_hex(bytes), "lfs_size": bytes.len()}),
        );
    }
    let file = cache.hub.path().join("listing.json");
    std::fs::write(&file, serde_json::Value::Object(listing).to_string()).unwrap();
    common::run_python_helper(
        "hf_cache/tree_listing.py",
        &[cache.root().as_os_str(), COMMIT.as_ref(), file.as_os_str()],
    );
}

/// Without a manifest, a file whose download died before its snapshot link was made is found from
/// huggingface_hub's tree listing of the commit, when the cache holds evidence it was fetched: its
/// blob with no link anywhere, or an `.incomplete` download of it. A listed file with no trace
/// (skipped by allow_patterns), or whose blob another revision links, is not expected.
#[test]
fn hf_cache_without_manifest_finds_a_download_that_died_before_its_link() {
    let cache = HfCache::new();
    let without_manifest = verify_without_manifest;
    // The weights' blob finished, its link was never made.
    std::fs::remove_file(cache.snapshot(COMMIT).join("model.safetensors")).unwrap();
    assert_eq!(
        without_manifest(&cache).status,
        Verdict::Verified,
        "with no listing, nothing names the file"
    );
    let skipped: &[u8] = b"an original checkpoint nobody downloaded";
    let dying = content(9, 50_000);
    write_tree_listing(
        &cache,
        &[
            ("original/consolidated.pth", skipped),
            ("model-2.safetensors", &dying),
        ],
    );
    let report = without_manifest(&cache);
    assert_eq!(
        status(&report, "model.safetensors"),
        FileStatus::Missing,
        "{report:#?}"
    );
    assert_eq!(report.status, Verdict::Failed);
    assert!(!report
        .files
        .iter()
        .any(|f| f.path == "original/consolidated.pth"));
    assert!(!report.files.iter().any(|f| f.path == "model-2.safetensors"));

    // Another file's download died half way (huggingface_hub 2.x's per-process marker).
    std::fs::write(
        cache
            .root()
            .join("blobs")
            .join(format!("{}.1a2b3c4d.incomplete", sha256_hex(&dying))),
        &dying[..1000],
    )
    .unwrap();
    let report = without_manifest(&cache);
    assert_eq!(
        status(&report, "model-2.safetensors"),
        FileStatus::InProgress
    );

    // The weights' blob linked by another revision: its presence says nothing about this one.
    cache.add_entry(
        OTHER_COMMIT,
        "model.safetensors",
        &cache.files["model.safetensors"],
    );
    let report = without_manifest(&cache);
    assert!(
        !report.files.iter().any(|f| f.path == "model.safetensors"),
        "{report:#?}"
    );
}

fn verify_without_manifest(cache: &HfCache) -> Report {
    let manifest = manifest::hub::from_blob_names(&cache.root(), None).unwrap();
    verify(
        &cache.root(),
        &manifest,
        &VerifyOptions::default(),
        &Control::default(),
    )
    .unwrap()
}

/// Without a manifest, a snapshot entry that is not a link to a content-addressed blob is checked
/// all the same and gets the word a manifest gives it: a link out of the cache `escapes_root`, one
/// into blobs/ under another name `unsafe_path`, a dangling one `missing`. A regular file put in
/// place of a link has nothing naming its content and fails too. Before, each was left out as
/// `extra` and the cache verified.
#[test]
fn hf_cache_tampered_entries_fail_without_a_manifest_as_with_one() {
    const BLOBS_EVIL: &str = "../../blobs/evil.bin";
    type Tamper = dyn Fn(&HfCache, &Path);
    let cases: [(&str, &Tamper, FileStatus); 4] = [
        (
            "a link to /etc/hostname",
            &|_, entry| symlink("/etc/hostname", entry).unwrap(),
            FileStatus::EscapesRoot,
        ),
        (
            "a link to blobs/evil.bin",
            &|cache, entry| {
                std::fs::write(cache.root().join("blobs/evil.bin"), b"evil").unwrap();
                symlink(BLOBS_EVIL, entry).unwrap()
            },
            FileStatus::UnsafePath,
        ),
        (
            "a dangling link",
            &|_, entry| symlink(BLOBS_EVIL, entry).unwrap(),
            FileStatus::Missing,
        ),
        (
            "a regular file",
            &|_, entry| std::fs::write(entry, b"evil weights").unwrap(),
            FileStatus::UnsafePath,
        ),
    ];
    for (what, tamper, word) in cases {
        let cache = HfCache::new();
        let entry = cache.snapshot(COMMIT).join("model.safetensors");
        std::fs::remove_file(&entry).unwrap();
        tamper(&cache, &entry);
        let report = verify_without_manifest(&cache);
        assert_eq!(report.status, Verdict::Failed, "{what}: {report:#?}");
        assert_eq!(status(&report, "model.safetensors"), word, "{what}");
        assert!(!error(&report, "model.safetensors").is_empty(), "{what}");
        let with_manifest = run(&cache.root(), &cache.manifest_json(COMMIT), Strategy::Auto);
        // With a manifest a regular file is judged by its content.
        if what != "a regular file" {
            assert_eq!(
                status(&with_manifest, "model.safetensors"),
                word,
                "{what}: the same word with a manifest"
            );
        }
    }
}

/// Without a manifest, a download that never made its snapshot link fails the cache: while its
/// lock is held (huggingface_hub's filelock, `flock(LOCK_EX)` for the whole download) it is
/// `in_progress`, with only an `.incomplete` left and no lock file also `in_progress` (nothing
/// says it stopped), and once the lock is free with the partial file left it is `missing`. Each is
/// named by its blob, as the hub's links name blobs: `../../blobs/<sha256>`.
#[test]
fn hf_cache_unfinished_download_fails_without_a_manifest() {
    let cache = HfCache::new();
    let weights = sha256_hex(&cache.files["model.safetensors"]);
    // The download started: no blob and no link yet, only its partial file.
    std::fs::remove_file(cache.snapshot(COMMIT).join("model.safetensors")).unwrap();
    std::fs::remove_file(cache.root().join("blobs").join(&weights)).unwrap();
    let partial = format!("{weights}.3f9a0c1e.incomplete");
    std::fs::write(cache.root().join("blobs").join(&partial), b"partial").unwrap();
    let line = format!("../../blobs/{weights}");

    let report = verify_without_manifest(&cache);
    assert_eq!(report.status, Verdict::Failed);
    assert_eq!(
        status(&report, &line),
        FileStatus::InProgress,
        "{report:#?}"
    );

    let locks = cache.hub.path().join(".locks/models--org--tiny");
    std::fs::create_dir_all(&locks).unwrap();
    let lock = hold_lock(&locks.join(format!("{weights}.lock")));
    let report = verify_without_manifest(&cache);
    assert_eq!(status(&report, &line), FileStatus::InProgress);
    assert!(error(&report, &line).contains(&partial), "{report:#?}");

    // Killed: the lock is let go, the partial file stays.
    drop(lock);
    let report = verify_without_manifest(&cache);
    assert_eq!(report.status, Verdict::Failed);
    assert_eq!(status(&report, &line), FileStatus::Missing);
    assert!(error(&report, &line).contains("did not finish"));

    // A download just started (lock held, no partial file yet) fails too.
    std::fs::remove_file(cache.root().join("blobs").join(&partial)).unwrap();
    let config = sha256_hex(b"the next file");
    let next = hold_lock(&locks.join(format!("{config}.lock")));
    let report = verify_without_manifest(&cache);
    assert_eq!(
        status(&report, &format!("../../blobs/{config}")),
        FileStatus::InProgress
    );
    drop(next);
    // The locks every finished download leaves behind, free, are no evidence of anything.
    assert_eq!(verify_without_manifest(&cache).status, Verdict::Verified);
}
