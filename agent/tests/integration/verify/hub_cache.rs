//! Hugging Face hub caches laid out by huggingface_hub's own code: refs and snapshots, markers of
//! unfinished downloads, the shared xet store, entries of the wrong form, and a cache checked
//! without a manifest.

use super::*;

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
    testbed::models::run_python_helper(
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
