//! `mlnode-agent serve` end to end: the real binary as a child process on a loopback port, a real
//! model cache in a temp dir, its manifest in a directory laid out like a mounted ConfigMap.

use std::io::{Seek, SeekFrom, Write};
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use assert_cmd::cargo::CommandCargoExt;
use mlnode_testbed as testbed;
use testbed::agent::{model_config, sample, Agent, EXIT_BOUND};
use testbed::models::PlainModel;

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
    // No kubelet and no startup taint: the agent cannot know that nothing serves from the model
    // (a restarted agent never saw the opens that happened before it), so it yields.
    assert_eq!(priority(&metrics, "idle"), Some(1.0));
    assert_eq!(priority(&metrics, "normal"), Some(0.0));
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
    // So is a change after the first verification.
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
    assert!(took < EXIT_BOUND, "SIGTERM took {took:?}");
}

#[test]
fn a_broken_model_never_stops_the_others() {
    let good = PlainModel::new();
    let (_dir, manifest) = testbed::write_temp(&good.manifest_json("v1", true));
    let (_bad_dir, bad_manifest) = testbed::write_temp("{\"files\": ");
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
    let (_dir, manifest) = testbed::write_temp(&model.manifest_json("v1", true));
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

/// A model kept only on the nodes its `node_selector` selects needs the node's labels: with no
/// API server to ask (no cluster, no kubeconfig), `serve` exits at once saying so, rather than
/// verifying it everywhere or nowhere.
#[test]
fn a_node_selector_without_an_api_server_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.yaml");
    std::fs::write(
        &config,
        "listen: 127.0.0.1:0\nmodels:\n  - {name: qwen, root: /models/qwen, manifest: /m/qwen.json, node_selector: {pool: gpu}}\n",
    )
    .unwrap();
    let output = Command::cargo_bin("mlnode-agent")
        .unwrap()
        .args(["serve", "--config"])
        .arg(&config)
        .env("HOME", dir.path())
        .env("KUBECONFIG", dir.path().join("no-kubeconfig"))
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("models[].node_selector needs this node's labels")
            && stderr.contains("remove node_selector"),
        "{stderr}"
    );
}

#[test]
fn sigterm_during_hashing_cancels_it_and_exits_promptly() {
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
    let (_m, manifest_path) = testbed::write_temp(&manifest);
    // At normal priority: at `auto` the hashing thread is SCHED_IDLE, and on a machine whose cores
    // the suite's other tests keep busy it may not run at all within the cancel's grace (a full
    // run once saw "did not stop within 500ms"). What is tested is that SIGTERM cancels it.
    let config = format!(
        "{}verify:\n  priority: normal\n",
        model_config("huge", dir.path(), &manifest_path)
    );
    let mut agent = Agent::start(&config);
    let started = std::time::Instant::now();
    loop {
        // Connection refused until the agent listens.
        let (status, body) = testbed::agent::http_get(agent.port(), "/readyz").unwrap_or_default();
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
    assert!(took < EXIT_BOUND, "SIGTERM while hashing took {took:?}");
    let log = agent.log();
    assert!(
        log.contains("verification cancelled for shutdown"),
        "hashing was stopped, not abandoned: {log}"
    );
}

/// A manifest that becomes unusable leaves no stale file counts behind (every count 0, not the
/// last ok=4), and a FIFO where a manifest should be is refused, not waited on: the agent keeps
/// serving and still stops promptly on SIGTERM.
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
    assert!(elapsed < EXIT_BOUND, "{elapsed:?}");
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
    let (_dir, manifest) = testbed::write_temp(&model.manifest_json("v1", true));
    let agent = Agent::start(&model_config("llama", model.root(), &manifest));
    agent.wait_for("serving", Duration::from_secs(20), |m| {
        m.contains("mlnode_build_info")
    });
    let address = format!("127.0.0.1:{}", agent.port());
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
    // A scrape held up by the connections would wait for their 5 s header timeout.
    assert!(
        started.elapsed() < Duration::from_secs(4),
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

/// An agent serving a model, limited to 512 descriptors: a 128-connection cap derived from them.
fn serving_with_512_descriptors() -> ((PlainModel, tempfile::TempDir), Agent) {
    let model = PlainModel::new();
    let (dir, manifest) = testbed::write_temp(&model.manifest_json("v1", true));
    let agent = Agent::start_wrapped(
        &model_config("llama", model.root(), &manifest),
        &[],
        &["prlimit", "--nofile=512:512"],
    );
    agent.wait_for("serving", Duration::from_secs(20), |m| {
        m.contains("mlnode_model_cache_verified")
    });
    ((model, dir), agent)
}

/// Clients that send complete pipelined requests and never read a reply hold their connection only
/// until the write timeout, and the agent, limited to 512 descriptors (a 128-connection cap
/// derived from them), answers /metrics again while all 300 of them are still connected. Before,
/// the reply write waited forever and the descriptors ran out.
#[test]
fn clients_that_never_read_their_replies_are_dropped() {
    let (_model, agent) = serving_with_512_descriptors();
    let address = format!("127.0.0.1:{}", agent.port());
    let requests = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n".repeat(300);
    let held: Vec<std::net::TcpStream> = (0..300)
        .filter_map(|_| {
            let mut stream = std::net::TcpStream::connect(&address).ok()?;
            // Past the cap the agent closes at once; those writes may fail, which is the point.
            let _ = stream.write_all(requests.as_bytes());
            Some(stream)
        })
        .collect();
    assert!(held.len() > 128, "{} connections", held.len());
    let answered =
        (0..600).find_map(
            |_| match testbed::agent::http_get(agent.port(), "/metrics") {
                Ok((200, body)) => Some(body),
                _ => {
                    std::thread::sleep(Duration::from_millis(100));
                    None
                }
            },
        );
    let body = answered.unwrap_or_else(|| {
        panic!(
            "/metrics never answered while the readers were held\n{}",
            agent.log()
        )
    });
    assert!(body.contains("mlnode_model_cache_verified"));
    let log = agent.log();
    assert!(
        log.contains("max_connections=128") || log.contains("\"max_connections\":128"),
        "{log}"
    );
    drop(held);
}

/// Clients that connect and send nothing hold a connection until the header-read timeout (5 s).
/// With every slot of the agent's 128-connection cap held by them, a scrape still gets one at
/// once: the connection held longest gives its slot up. Each connection past the cap closes one
/// older one, and nothing else is closed, so the scrape was answered before any timeout passed.
#[test]
fn a_scrape_gets_a_slot_while_silent_clients_hold_every_one() {
    let (_model, agent) = serving_with_512_descriptors();
    let address = format!("127.0.0.1:{}", agent.port());
    let silent: Vec<std::net::TcpStream> = (0..200)
        .map(|_| std::net::TcpStream::connect(&address).unwrap())
        .collect();
    let (status, body) = testbed::agent::http_get(agent.port(), "/metrics").unwrap();
    assert_eq!(status, 200);
    assert!(body.contains("mlnode_model_cache_verified"));
    // Which silent connections the agent closed: a read that ends (or is reset) at once.
    let closed = silent
        .iter()
        .filter(|stream| {
            stream.set_nonblocking(true).unwrap();
            let mut byte = [0u8; 1];
            !matches!(
                std::io::Read::read(&mut &**stream, &mut byte),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock
            )
        })
        .count();
    assert_eq!(
        closed,
        silent.len() - 128 + 1,
        "one closed for each connection past the cap, the scrape's included"
    );
}

/// A weight file the agent could not read (root without capabilities, as the DaemonSet runs it,
/// and a file of another user with mode 000) is re-verified as soon as `chmod` fixes it, not at
/// the next full rescan a day later.
#[test]
fn a_permission_fix_reverifies_the_file_at_once() {
    use std::os::unix::fs::PermissionsExt;
    let model = PlainModel::new();
    let (_dir, manifest) = testbed::write_temp(&model.manifest_json("v1", true));
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

/// SIGTERM while a large manifest (300,000 entries) is still being loaded stops the agent
/// promptly: the parse is not waited for.
#[test]
fn sigterm_while_a_large_manifest_loads_exits_promptly() {
    let root = tempfile::tempdir().unwrap();
    let entries: Vec<String> = (0..300_000)
        .map(|i| format!("\"shard/{i:07}.bin\": {{\"sha256\": \"{i:064x}\", \"size\": {i}}}"))
        .collect();
    let (_dir, manifest) = testbed::write_temp(&format!(
        "{{\"revision\": \"v1\", \"files\": {{{}}}}}",
        entries.join(", ")
    ));
    let mut agent = Agent::start(&model_config("huge", root.path(), &manifest));
    agent.wait_for("serving", Duration::from_secs(20), |m| {
        m.contains("mlnode_build_info")
    });
    // Still loading: the file counts appear once the manifest is parsed.
    let loading = !agent
        .metrics()
        .contains("mlnode_model_cache_files{model_name=\"huge\"");
    let (code, elapsed) = agent.terminate();
    assert_eq!(code, Some(0), "{}", agent.log());
    assert!(elapsed < EXIT_BOUND, "{elapsed:?} (loading: {loading})");
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
    let cache = testbed::models::SharedStoreCache::new();
    let repo = cache.repo("llama");
    let snapshot = repo.join("snapshots").join(testbed::models::SHARED_COMMIT);
    let config = std::fs::read(snapshot.join("sub/config.json")).unwrap();
    let manifest = serde_json::json!({"revision": testbed::models::SHARED_COMMIT, "files": {
        "model.safetensors": {"sha256": testbed::models::sha256_hex(&cache.weights), "size": cache.weights.len()},
        "sub/config.json": testbed::models::sha256_hex(&config)}});
    let (_dir, manifest) = testbed::write_temp(&manifest.to_string());
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

/// ROOT renamed away and back (an operator's `mv`, a restore): the watch follows it back, the model
/// is verified again whole, and the next corrupting write is seen at once. With the manifest beside
/// ROOT, notify dropped ROOT's watches when the watched parent reported it moved out, and the rename
/// back did not restore them: the model stayed "verified" after tampering until the daily rescan.
#[test]
fn a_root_renamed_away_and_back_is_watched_again() {
    for manifest_beside_root in [true, false] {
        let model = PlainModel::new();
        let base = tempfile::tempdir().unwrap();
        let root = base.path().join("llama");
        std::fs::rename(model.root(), &root).unwrap();
        let manifest_dir = tempfile::tempdir().unwrap();
        let manifest = if manifest_beside_root {
            base.path().join("llama.manifest.json")
        } else {
            manifest_dir.path().join("llama.manifest.json")
        };
        std::fs::write(&manifest, model.manifest_json("v1", true)).unwrap();
        let agent = Agent::start(&model_config("llama", &root, &manifest));
        let full_runs = |m: &str| {
            sample(
                m,
                "mlnode_model_cache_verify_duration_seconds_count",
                &[("model_name", "llama"), ("kind", "full")],
            )
            .unwrap_or(0.0)
        };
        let verified = |m: &str| {
            sample(m, "mlnode_model_cache_verified", &[("model_name", "llama")]) == Some(1.0)
        };
        agent.wait_for("verified", Duration::from_secs(20), verified);
        let before = full_runs(&agent.metrics());

        let away = base.path().join("llama.away");
        std::fs::rename(&root, &away).unwrap();
        agent.wait_for("the move noticed", Duration::from_secs(20), |m| {
            sample(m, "mlnode_model_cache_watched", &[("model_name", "llama")]) == Some(0.0)
        });
        std::fs::rename(&away, &root).unwrap();
        agent.wait_for(
            "watched again and verified whole",
            Duration::from_secs(20),
            |m| {
                sample(m, "mlnode_model_cache_watched", &[("model_name", "llama")]) == Some(1.0)
                    && full_runs(m) > before
                    && verified(m)
            },
        );

        let shard = root.join("model-00001-of-00002.safetensors");
        let mut bytes = std::fs::read(&shard).unwrap();
        bytes[10] ^= 0xff;
        std::fs::write(&shard, bytes).unwrap();
        agent.wait_for(
            &format!("the next change seen (manifest beside ROOT: {manifest_beside_root})"),
            Duration::from_secs(15),
            |m| {
                sample(
                    m,
                    "mlnode_model_cache_files",
                    &[("model_name", "llama"), ("status", "digest_mismatch")],
                ) == Some(1.0)
            },
        );
    }
}

/// 140 models (past the 128 inotify instances a user gets by default) are all watched through one
/// instance: every one of them sees its next change. Before, each model opened its own and 12 to
/// 14 of 140 went unwatched in silence.
#[test]
fn a_hundred_and_forty_models_share_one_watch() {
    let base = tempfile::tempdir().unwrap();
    let (_dir, manifest) = testbed::write_temp(
        &serde_json::json!({"revision": "v1", "files": {
            "config.json": {"sha256": testbed::models::sha256_hex(b"{}"), "size": 2}
        }})
        .to_string(),
    );
    let mut config = String::from("models:\n");
    for i in 0..140 {
        let root = base.path().join(format!("m{i}"));
        std::fs::create_dir(&root).unwrap();
        std::fs::write(root.join("config.json"), b"{}").unwrap();
        config.push_str(&format!(
            "  - name: m{i}\n    root: {root:?}\n    manifest: {manifest:?}\n"
        ));
    }
    let agent = Agent::start(&config);
    let count = |m: &str, name: &str, value: f64| {
        m.lines()
            .filter(|l| l.starts_with(&format!("{name}{{")) && l.ends_with(&format!(" {value}")))
            .count()
    };
    agent.wait_for("140 verified and watched", Duration::from_secs(60), |m| {
        count(m, "mlnode_model_cache_verified", 1.0) == 140
            && count(m, "mlnode_model_cache_watched", 1.0) == 140
    });
    let instances = std::fs::read_dir(format!("/proc/{}/fd", agent.pid()))
        .unwrap()
        .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter(|target| target.to_string_lossy() == "anon_inode:inotify")
        .count();
    assert_eq!(instances, 1, "one inotify instance for every model");
    for i in 0..140 {
        std::fs::write(base.path().join(format!("m{i}/config.json")), b"[]").unwrap();
    }
    agent.wait_for("every model saw its change", Duration::from_secs(60), |m| {
        count(m, "mlnode_model_cache_verified", 0.0) == 140
    });
}
