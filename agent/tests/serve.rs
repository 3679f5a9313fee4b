//! `mlnode-agent serve` end to end: the real binary as a child process on a loopback port, a real
//! model cache in a temp dir, its manifest in a directory laid out like a mounted ConfigMap.

mod common;

use std::io::{Seek, SeekFrom, Write};
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use assert_cmd::cargo::CommandCargoExt;
use common::agent::{model_config, sample, Agent};
use common::PlainModel;

/// A ConfigMap volume: `<dir>/manifest.json -> ..data/manifest.json`, `..data -> ..<version>/`.
/// kubelet updates it by writing a new version directory and renaming a new `..data` link over the old.
struct ConfigMapDir {
    dir: tempfile::TempDir,
    version: u32,
}

impl ConfigMapDir {
    fn new(manifest: &str) -> ConfigMapDir {
        let mut cm = ConfigMapDir {
            dir: tempfile::tempdir().unwrap(),
            version: 0,
        };
        cm.update(manifest);
        symlink("..data/manifest.json", cm.dir.path().join("manifest.json")).unwrap();
        cm
    }

    fn update(&mut self, manifest: &str) {
        self.version += 1;
        let version = format!(
            "..2026_11_30_00_00_0{}.{}",
            self.version,
            1000 + self.version
        );
        std::fs::create_dir(self.dir.path().join(&version)).unwrap();
        std::fs::write(
            self.dir.path().join(&version).join("manifest.json"),
            manifest,
        )
        .unwrap();
        let tmp = self.dir.path().join("..data_tmp");
        symlink(&version, &tmp).unwrap();
        std::fs::rename(&tmp, self.dir.path().join("..data")).unwrap();
    }

    fn manifest(&self) -> PathBuf {
        self.dir.path().join("manifest.json")
    }
}

#[test]
fn corrupt_restore_and_configmap_swap_end_to_end() {
    let model = PlainModel::new();
    let mut cm = ConfigMapDir::new(&model.manifest_json("v1", true));
    // On a network file system an operator caps the read rate; 1 MiB/s (the least allowed) makes
    // this half-megabyte model's first verification wait for it.
    let config = format!(
        "{}verify:\n  max_bytes_per_second: 1MiB\n",
        model_config("llama", model.root(), &cm.manifest())
    );
    let mut agent = Agent::start(&config);
    let verified = |rev: &'static str| {
        move |m: &str| {
            sample(
                m,
                "mlnode_model_cache_verified",
                &[("model_name", "llama"), ("revision", rev)],
            ) == Some(1.0)
        }
    };

    agent.wait_for(
        "first verification",
        Duration::from_secs(20),
        verified("v1"),
    );
    let metrics = agent.metrics();
    assert_eq!(
        sample(
            &metrics,
            "mlnode_model_cache_files",
            &[("model_name", "llama"), ("status", "ok")]
        ),
        Some(4.0)
    );
    assert!(
        metrics.contains("Hostname=\"test-node\""),
        "every series carries Hostname"
    );
    let priority = |metrics: &str, which: &str| {
        sample(
            metrics,
            "mlnode_model_cache_verify_priority",
            &[("model_name", "llama"), ("priority", which)],
        )
    };
    assert_eq!(
        sample(
            &metrics,
            "mlnode_model_cache_verify_max_bytes_per_second",
            &[]
        ),
        Some(f64::from(1 << 20))
    );
    let throttled = sample(
        &metrics,
        "mlnode_model_cache_verify_throttled_seconds_total",
        &[("model_name", "llama")],
    );
    assert!(throttled.is_some_and(|s| s > 0.0), "{throttled:?}");
    // Nothing serves from the model yet: its first verification runs at full speed.
    assert_eq!(priority(&metrics, "normal"), Some(1.0));
    assert_eq!(priority(&metrics, "idle"), Some(0.0));
    let (status, body) = agent.get("/readyz");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("llama: verified (revision v1)"), "{body}");
    assert_eq!(agent.get("/healthz").0, 200);
    let hashed_before = sample(
        &metrics,
        "mlnode_model_cache_hashed_bytes_total",
        &[("model_name", "llama")],
    )
    .unwrap();

    // One flipped byte in one shard, size unchanged.
    let shard = "model-00001-of-00002.safetensors";
    let original = model.files[shard].clone();
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .open(model.path(shard))
        .unwrap();
    file.seek(SeekFrom::Start(4096)).unwrap();
    file.write_all(&[original[4096] ^ 0xff]).unwrap();
    drop(file);
    let took = agent.wait_for("corruption noticed", Duration::from_secs(5), |m| {
        sample(m, "mlnode_model_cache_verified", &[("model_name", "llama")]) == Some(0.0)
            && sample(
                m,
                "mlnode_model_cache_files",
                &[("model_name", "llama"), ("status", "digest_mismatch")],
            ) == Some(1.0)
    });
    eprintln!("corruption reported after {took:?}");
    let metrics = agent.metrics();
    // A change after the first verification is re-verified in the idle classes.
    assert_eq!(priority(&metrics, "idle"), Some(1.0));
    agent.wait_for_log(
        "the verification's log line",
        Duration::from_secs(5),
        |log| {
            log.lines()
                .any(|l| l.contains("failed verification") && l.contains(r#""priority":"idle""#))
        },
    );
    let hashed_after = sample(
        &metrics,
        "mlnode_model_cache_hashed_bytes_total",
        &[("model_name", "llama")],
    )
    .unwrap();
    assert_eq!(
        hashed_after - hashed_before,
        original.len() as f64,
        "only the changed file is re-hashed"
    );
    assert!(
        sample(
            &metrics,
            "mlnode_model_cache_verify_duration_seconds_count",
            &[("model_name", "llama"), ("kind", "incremental")]
        )
        .unwrap()
            >= 1.0
    );
    let (status, body) = agent.get("/readyz");
    assert_eq!(status, 503);
    assert!(
        body.contains(shard) && body.contains("digest_mismatch"),
        "{body}"
    );
    assert!(
        agent.log().contains("digest_mismatch"),
        "the failure is logged"
    );

    std::fs::write(model.path(shard), &original).unwrap();
    agent.wait_for("restored", Duration::from_secs(5), verified("v1"));

    // A ConfigMap update: same files, new revision.
    cm.update(&model.manifest_json("v2", true));
    agent.wait_for("manifest swap", Duration::from_secs(5), verified("v2"));
    let metrics = agent.metrics();
    assert_eq!(
        sample(
            &metrics,
            "mlnode_model_cache_verified",
            &[("revision", "v1")]
        ),
        None,
        "the old revision's series is gone"
    );

    let (code, took) = agent.terminate();
    assert_eq!(code, Some(0));
    assert!(took < Duration::from_secs(1), "SIGTERM took {took:?}");
}

#[test]
fn a_broken_model_never_stops_the_others() {
    let good = PlainModel::new();
    let (_dir, manifest) = common::write_temp(&good.manifest_json("v1", true));
    let (_bad_dir, bad_manifest) = common::write_temp("{\"files\": ");
    let config = format!(
        "{}{}{}",
        model_config("good", good.root(), &manifest),
        model_config("missing-root", Path::new("/nonexistent/model"), &manifest)
            .replace("models:\n", ""),
        model_config("bad-manifest", good.root(), &bad_manifest).replace("models:\n", ""),
    );
    let mut agent = Agent::start(&config);
    agent.wait_for("good verified", Duration::from_secs(20), |m| {
        sample(m, "mlnode_model_cache_verified", &[("model_name", "good")]) == Some(1.0)
            && sample(
                m,
                "mlnode_model_cache_verified",
                &[("model_name", "missing-root")],
            ) == Some(0.0)
            && sample(
                m,
                "mlnode_model_cache_verified",
                &[("model_name", "bad-manifest")],
            ) == Some(0.0)
    });
    let (status, body) = agent.get("/readyz");
    assert_eq!(status, 503);
    assert!(body.contains("good: verified"), "{body}");
    assert!(
        body.contains("missing-root: not verified") && body.contains("/nonexistent/model"),
        "{body}"
    );
    assert!(
        body.contains("bad-manifest: not verified") && body.contains("truncated"),
        "{body}"
    );
    assert_eq!(
        agent.get("/healthz").0,
        200,
        "failing caches are not a sick agent"
    );
    let (code, _) = agent.terminate();
    assert_eq!(code, Some(0));
}

#[test]
fn a_download_in_progress_is_reported_as_such() {
    let model = PlainModel::new();
    let (_dir, manifest) = common::write_temp(&model.manifest_json("v1", true));
    let shard = "model-00002-of-00002.safetensors";
    std::fs::remove_file(model.path(shard)).unwrap();
    std::fs::write(model.path(&format!("{shard}.incomplete")), b"partial").unwrap();
    let agent = Agent::start(&model_config("llama", model.root(), &manifest));
    agent.wait_for("in progress", Duration::from_secs(20), |m| {
        sample(
            m,
            "mlnode_model_cache_files",
            &[("model_name", "llama"), ("status", "in_progress")],
        ) == Some(1.0)
            && sample(
                m,
                "mlnode_model_cache_files",
                &[("model_name", "llama"), ("status", "ok")],
            ) == Some(3.0)
    });
    // The download finishes: the partial file is renamed into place.
    std::fs::write(
        model.path(&format!("{shard}.incomplete")),
        &model.files[shard],
    )
    .unwrap();
    std::fs::rename(
        model.path(&format!("{shard}.incomplete")),
        model.path(shard),
    )
    .unwrap();
    agent.wait_for("download finished", Duration::from_secs(5), |m| {
        sample(m, "mlnode_model_cache_verified", &[("model_name", "llama")]) == Some(1.0)
    });
}

#[test]
fn bad_config_exits_2_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.yaml");
    std::fs::write(&config, "verify:\n  threads: lots\n").unwrap();
    let output = Command::cargo_bin("mlnode-agent")
        .unwrap()
        .args(["serve", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("verify.threads") && stderr.contains("config.yaml"),
        "{stderr}"
    );
}

#[test]
fn sigterm_during_hashing_cancels_it_and_exits_within_a_second() {
    // A 64 GiB sparse file: minutes of hashing, no disk used.
    let dir = tempfile::tempdir().unwrap();
    let weights = dir.path().join("model.safetensors");
    std::fs::File::create(&weights)
        .unwrap()
        .set_len(64 << 30)
        .unwrap();
    let manifest = format!(
        r#"{{"files": {{"model.safetensors": {{"sha256": "{}", "size": {}}}}}}}"#,
        "0".repeat(64),
        64u64 << 30
    );
    let (_m, manifest_path) = common::write_temp(&manifest);
    let mut agent = Agent::start(&model_config("huge", dir.path(), &manifest_path));
    let started = std::time::Instant::now();
    loop {
        // Connection refused until the agent listens.
        let (status, body) = common::agent::http_get(agent.port, "/readyz").unwrap_or_default();
        if status == 503
            && body.contains("first verification in progress")
            && started.elapsed() > Duration::from_millis(500)
        {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "{body}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let (code, took) = agent.terminate();
    assert_eq!(code, Some(0));
    assert!(
        took < Duration::from_secs(1),
        "SIGTERM while hashing took {took:?}"
    );
    let log = agent.log();
    assert!(
        log.contains("verification cancelled for shutdown"),
        "hashing was stopped, not abandoned: {log}"
    );
}

/// A manifest that becomes unusable leaves no stale file counts behind (every count 0, not the
/// last ok=4), and a FIFO where a manifest should be is refused, not waited on: the agent keeps
/// serving and still stops within a second.
#[test]
fn an_unusable_manifest_drops_the_counts_and_a_fifo_is_refused() {
    let model = PlainModel::new();
    let mut cm = ConfigMapDir::new(&model.manifest_json("v1", true));
    let fifo_dir = tempfile::tempdir().unwrap();
    let fifo = fifo_dir.path().join("manifest.json");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
    let config = format!(
        "{}{}",
        model_config("llama", model.root(), &cm.manifest()),
        model_config("fifo", model.root(), &fifo).replace("models:\n", ""),
    );
    let mut agent = Agent::start(&config);
    let files = |m: &str, model: &str, status: &str| {
        sample(
            m,
            "mlnode_model_cache_files",
            &[("model_name", model), ("status", status)],
        )
    };
    agent.wait_for("llama verified", Duration::from_secs(20), |m| {
        files(m, "llama", "ok") == Some(4.0)
    });
    let (_, readyz) = agent.get("/readyz");
    assert!(
        readyz.contains("fifo: not verified") && readyz.contains("a FIFO"),
        "{readyz}"
    );
    cm.update("{\"files\": ");
    agent.wait_for("counts dropped", Duration::from_secs(20), |m| {
        sample(m, "mlnode_model_cache_verified", &[("model_name", "llama")]) == Some(0.0)
            && files(m, "llama", "ok") == Some(0.0)
    });
    let metrics = agent.metrics();
    for line in metrics.lines().filter(|l| {
        l.starts_with("mlnode_model_cache_files{") && l.contains("model_name=\"llama\"")
    }) {
        assert!(line.ends_with(" 0"), "{line}");
    }
    let (code, elapsed) = agent.terminate();
    assert_eq!(code, Some(0));
    assert!(elapsed < Duration::from_secs(1), "{elapsed:?}");
}

/// 1,100 connections that never finish a request (idle, or half a header) do not keep /metrics
/// from answering, and the agent closes them itself: a client gets a bounded time to send its
/// headers.
#[test]
fn idle_and_half_sent_connections_neither_block_metrics_nor_stay_open() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    use std::io::Read;
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    setrlimit(Resource::RLIMIT_NOFILE, hard.min(65536), hard).unwrap();
    let model = PlainModel::new();
    let (_dir, manifest) = common::write_temp(&model.manifest_json("v1", true));
    let agent = Agent::start(&model_config("llama", model.root(), &manifest));
    agent.wait_for("serving", Duration::from_secs(20), |m| {
        m.contains("mlnode_build_info")
    });
    let address = format!("127.0.0.1:{}", agent.port);
    let mut held: Vec<std::net::TcpStream> = (0..1100)
        .map(|i| {
            let mut stream = std::net::TcpStream::connect(&address).unwrap();
            if i % 2 == 0 {
                stream
                    .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
                    .unwrap();
            }
            stream
        })
        .collect();
    let started = std::time::Instant::now();
    let (status, body) = agent.get("/metrics");
    assert_eq!(status, 200);
    assert!(body.contains("mlnode_model_cache_verified"));
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    // Every held connection is closed by the agent (EOF or reset), well before a minute.
    for stream in &mut held {
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let mut buf = [0u8; 256];
        let mut closed = false;
        while !closed {
            match stream.read(&mut buf) {
                Ok(0) => closed = true,
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    panic!(
                        "a connection is still held open after {:?}",
                        started.elapsed()
                    )
                }
                Err(_) => closed = true,
            }
        }
    }
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
}

/// A weight file the agent could not read (root without capabilities, as the DaemonSet runs it,
/// and a file of another user with mode 000) is re-verified as soon as `chmod` fixes it, not at
/// the next full rescan a day later.
#[test]
fn a_permission_fix_reverifies_the_file_at_once() {
    use std::os::unix::fs::PermissionsExt;
    let model = PlainModel::new();
    let (_dir, manifest) = common::write_temp(&model.manifest_json("v1", true));
    let shard = model.path("model-00002-of-00002.safetensors");
    std::os::unix::fs::chown(&shard, Some(1000), Some(1000)).unwrap();
    std::fs::set_permissions(&shard, std::fs::Permissions::from_mode(0o000)).unwrap();
    let no_capabilities = [
        "setpriv",
        "--bounding-set=-all",
        "--inh-caps=-all",
        "--ambient-caps=-all",
        "--no-new-privs",
        "--",
    ];
    let agent = Agent::start_wrapped(
        &model_config("llama", model.root(), &manifest),
        &[],
        &no_capabilities,
    );
    let files = |m: &str, status: &str| {
        sample(
            m,
            "mlnode_model_cache_files",
            &[("model_name", "llama"), ("status", status)],
        )
    };
    agent.wait_for("the unreadable shard", Duration::from_secs(20), |m| {
        files(m, "io_error") == Some(1.0)
    });
    std::fs::set_permissions(&shard, std::fs::Permissions::from_mode(0o644)).unwrap();
    let took = agent.wait_for("re-verified after chmod", Duration::from_secs(10), |m| {
        files(m, "ok") == Some(4.0) && files(m, "io_error") == Some(0.0)
    });
    assert!(took < Duration::from_secs(10), "{took:?}");
}

/// SIGTERM while a large manifest (300,000 entries) is still being loaded stops the agent within
/// a second: the parse is not waited for.
#[test]
fn sigterm_while_a_large_manifest_loads_exits_within_a_second() {
    let root = tempfile::tempdir().unwrap();
    let entries: Vec<String> = (0..300_000)
        .map(|i| format!("\"shard/{i:07}.bin\": {{\"sha256\": \"{i:064x}\", \"size\": {i}}}"))
        .collect();
    let (_dir, manifest) = common::write_temp(&format!(
        "{{\"revision\": \"v1\", \"files\": {{{}}}}}",
        entries.join(", ")
    ));
    let mut agent = Agent::start(&model_config("huge", root.path(), &manifest));
    agent.wait_for("serving", Duration::from_secs(20), |m| {
        m.contains("mlnode_build_info")
    });
    // Still loading: the file counts appear once the manifest is parsed.
    let loading = !agent.metrics().contains("model_name=\"huge\"");
    let (code, elapsed) = agent.terminate();
    assert_eq!(code, Some(0), "{}", agent.log());
    assert!(
        elapsed < Duration::from_secs(1),
        "{elapsed:?} (loading: {loading})"
    );
    assert!(
        loading,
        "the manifest was parsed before SIGTERM; the state under test was missed"
    );
}

/// A hub cache whose weights live in huggingface_hub 2.x's shared Xet store, outside the repo
/// folder (laid out by huggingface_hub's own code): the store is watched too, so a corrupted store
/// entry fails the model at once, not at the next full rescan (a day away here).
#[test]
fn a_change_in_the_shared_xet_store_reverifies_the_model_at_once() {
    let cache = common::SharedStoreCache::new();
    let repo = cache.repo("llama");
    let snapshot = repo.join("snapshots").join(common::SHARED_COMMIT);
    let config = std::fs::read(snapshot.join("sub/config.json")).unwrap();
    let manifest = serde_json::json!({"revision": common::SHARED_COMMIT, "files": {
        "model.safetensors": {"sha256": common::sha256_hex(&cache.weights), "size": cache.weights.len()},
        "sub/config.json": common::sha256_hex(&config)}});
    let (_dir, manifest) = common::write_temp(&manifest.to_string());
    let config = format!(
        "{}verify:\n  full_rescan_interval: 24h\n",
        model_config("llama", &repo, &manifest)
    );
    let agent = Agent::start(&config);
    let files = |m: &str, status: &str| {
        sample(
            m,
            "mlnode_model_cache_files",
            &[("model_name", "llama"), ("status", status)],
        )
    };
    agent.wait_for("verified through the store", Duration::from_secs(20), |m| {
        files(m, "ok") == Some(2.0)
    });
    cache.corrupt_store_entry();
    agent.wait_for("the store change seen", Duration::from_secs(10), |m| {
        files(m, "digest_mismatch") == Some(1.0)
            && sample(m, "mlnode_model_cache_verified", &[("model_name", "llama")]) == Some(0.0)
    });
}
