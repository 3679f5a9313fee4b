//! What a verification costs the node: a cache larger than a batch counted without its ok lines
//! kept, the page cache left as it was found, a rate limit kept.

use super::*;

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
        return testbed::missing(&format!(
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
