//! Every status word on a plain model folder: ok, the revision, sizes and digests that differ,
//! missing and extra files, downloads in progress, what is not a regular file, a file changed
//! while hashed, a cancelled run.

use super::*;

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
