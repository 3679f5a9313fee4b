//! Pod startup phases: the computation over Pods and Events shaped as a cluster returns them, and
//! the tracker in the agent binary against the real API server (list, watch, 410 Gone, one events
//! list per startup), with the model load seen from a real process opening the weights.

use mlnode_testbed as testbed;
use serde_json::json;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, Pod};
use mlnode_agent::startup::phases::{compute, Phase};
use testbed::agent::sample;
use testbed::cluster::api_only_node::ApiOnlyNode;
use testbed::cluster::pods::{
    bound_vllm_pod, in_namespace, kubelet_event, unix, vllm_pod, PodTimes,
};
use testbed::models::PlainModel;

const MAIN: &str = "spec.containers{vllm}";

fn typed(pod: serde_json::Value, events: Vec<serde_json::Value>) -> (Pod, Vec<Event>) {
    (
        serde_json::from_value(pod).unwrap(),
        events
            .into_iter()
            .map(|e| serde_json::from_value(e).unwrap())
            .collect(),
    )
}

fn times(ready: Option<f64>) -> PodTimes {
    PodTimes {
        created: 1000.0,
        scheduled: 1002.0,
        started: 1060.0,
        ready,
        restart_count: 0,
        last_finished: None,
    }
}

#[test]
fn a_cold_start_splits_into_every_phase() {
    let pod = vllm_pod(
        "u1",
        "vllm-0",
        "/var/lib/models/llama",
        &times(Some(1200.0)),
    );
    let events = vec![
        kubelet_event("u1", "vllm-0", "Scheduled", "Successfully assigned inference/vllm-0 to node", None, 1002.0),
        kubelet_event("u1", "vllm-0", "Pulling", "Pulling image \"vllm/vllm-openai:v0.11.0\"", Some(MAIN), 1003.0),
        kubelet_event("u1", "vllm-0", "Pulled", "Successfully pulled image \"vllm/vllm-openai:v0.11.0\" in 52.3s (52.5s including waiting). Image size: 10234567890 bytes.", Some(MAIN), 1055.0),
        kubelet_event("u1", "vllm-0", "Created", "Created container: vllm", Some(MAIN), 1058.0),
        kubelet_event("u1", "vllm-0", "Started", "Started container vllm", Some(MAIN), 1060.0),
    ];
    let (pod, events) = typed(pod, events);
    let s = compute(&pod, &events, Some("llama".into()), Some(1150.0), None).unwrap();
    assert_eq!(s.phases[&Phase::Scheduling], 2.0);
    assert_eq!(s.phases[&Phase::ImagePull], 52.3);
    assert_eq!(s.phases[&Phase::ContainerStart], 5.0);
    assert_eq!(s.phases[&Phase::ModelLoad], 90.0);
    assert_eq!(s.phases[&Phase::Readiness], 50.0);
    assert_eq!(s.total_seconds, 200.0);
    assert_eq!(s.pulls[0].size_bytes, Some(10234567890));
}

#[test]
fn a_cached_image_an_old_kubelet_and_a_failed_pull() {
    let cached = vec![kubelet_event(
        "u1",
        "p",
        "Pulled",
        "Container image \"vllm/vllm-openai:v0.11.0\" already present on machine",
        Some(MAIN),
        1004.0,
    )];
    let (pod, events) = typed(vllm_pod("u1", "p", "/m", &times(Some(1200.0))), cached);
    let s = compute(&pod, &events, None, None, None).unwrap();
    assert_eq!(s.phases[&Phase::ImagePull], 0.0);
    assert!(s.pulls[0].cache_hit);
    assert_eq!(s.phases[&Phase::ContainerStart], 56.0);
    assert!(
        !s.phases.contains_key(&Phase::ModelLoad) && !s.phases.contains_key(&Phase::Readiness),
        "no load source: unknown, not 0"
    );

    let retried = vec![
        kubelet_event(
            "u1",
            "p",
            "Failed",
            "Failed to pull image \"vllm/vllm-openai:v0.11.0\": rpc error: code = DeadlineExceeded",
            Some(MAIN),
            1010.0,
        ),
        kubelet_event(
            "u1",
            "p",
            "BackOff",
            "Back-off pulling image \"vllm/vllm-openai:v0.11.0\"",
            Some(MAIN),
            1011.0,
        ),
        kubelet_event(
            "u1",
            "p",
            "Pulled",
            "Successfully pulled image \"vllm/vllm-openai:v0.11.0\" in 40s",
            Some(MAIN),
            1055.0,
        ),
    ];
    let (pod, events) = typed(vllm_pod("u1", "p", "/m", &times(Some(1200.0))), retried);
    let s = compute(&pod, &events, None, None, None).unwrap();
    assert_eq!(
        s.phases[&Phase::ImagePull],
        40.0,
        "the successful pull's own duration (kubelet <1.30 message, no size)"
    );
    assert_eq!(s.pulls[0].size_bytes, None);
}

#[test]
fn init_containers_pulls_count_and_the_main_container_starts_after_its_own_pull() {
    let events = vec![
        kubelet_event("u1", "p", "Pulled", "Successfully pulled image \"ghcr.io/mlnode/mlnode-agent:0.1.0\" in 2.5s (2.5s including waiting). Image size: 9000000 bytes.", Some("spec.initContainers{verify-model-cache}"), 1006.0),
        kubelet_event("u1", "p", "Pulled", "Successfully pulled image \"vllm/vllm-openai:v0.11.0\" in 30s (30s including waiting). Image size: 10234567890 bytes.", Some(MAIN), 1050.0),
    ];
    let (pod, events) = typed(vllm_pod("u1", "p", "/m", &times(Some(1200.0))), events);
    let s = compute(&pod, &events, None, None, None).unwrap();
    assert_eq!(s.phases[&Phase::ImagePull], 32.5);
    assert_eq!(
        s.phases[&Phase::ContainerStart],
        10.0,
        "from the main container's pull, not the init container's"
    );
}

#[test]
fn a_restart_is_measured_from_the_previous_exit() {
    let t = PodTimes {
        created: 1000.0,
        scheduled: 1002.0,
        started: 2010.0,
        ready: Some(2100.0),
        restart_count: 1,
        last_finished: Some(2000.0),
    };
    let events = vec![
        kubelet_event(
            "u1",
            "p",
            "Pulled",
            "Successfully pulled image \"vllm/vllm-openai:v0.11.0\" in 52.3s",
            Some(MAIN),
            1055.0,
        ),
        kubelet_event(
            "u1",
            "p",
            "Pulled",
            "Container image \"vllm/vllm-openai:v0.11.0\" already present on machine",
            Some(MAIN),
            2005.0,
        ),
    ];
    let (pod, events) = typed(vllm_pod("u1", "p", "/m", &t), events);
    let s = compute(&pod, &events, None, Some(2060.0), None).unwrap();
    assert_eq!(s.total_seconds, 100.0);
    assert!(
        !s.phases.contains_key(&Phase::Scheduling),
        "a restart is not scheduled again"
    );
    assert_eq!(
        s.phases[&Phase::ImagePull],
        0.0,
        "only the restart's cache hit, not the first pull"
    );
    assert_eq!(s.phases[&Phase::ModelLoad], 50.0);
    assert_eq!(s.restarts, 1);
}

#[test]
fn clock_skew_makes_a_phase_unknown_and_not_ready_is_no_startup() {
    // The Scheduled condition predates creation by 30 s: a skewed clock, not a negative duration.
    let skewed = PodTimes {
        created: 1000.0,
        scheduled: 970.0,
        started: 1060.0,
        ready: Some(1200.0),
        restart_count: 0,
        last_finished: None,
    };
    let (pod, events) = typed(vllm_pod("u1", "p", "/m", &skewed), vec![]);
    let s = compute(&pod, &events, None, None, None).unwrap();
    assert!(!s.phases.contains_key(&Phase::Scheduling));
    assert_eq!(s.total_seconds, 200.0, "the total is always known");
    let (pod, events) = typed(vllm_pod("u1", "p", "/m", &times(None)), vec![]);
    assert!(compute(&pod, &events, None, None, None).is_none());
}

#[test]
fn the_agent_follows_pods_through_the_api_and_sees_the_model_load() {
    let node = testbed::needs!(ApiOnlyNode::gpu(&[]));
    let model = PlainModel::new();
    let (_dir, manifest) = testbed::write_temp(&model.manifest_json("v1", true));
    let root = model.root().display().to_string();
    // The pods as their ReplicaSet creates them, bound to the node; their times are the server's.
    let create = |name: &str| node.put_pod(&bound_vllm_pod(name, &root, node.name()));
    let created = create("vllm-llama-0");
    // A second pod that is deleted before it is ever Ready.
    create("vllm-llama-1");
    let uid = created["metadata"]["uid"].as_str().unwrap().to_string();
    let at = unix(&created["metadata"]["creationTimestamp"]);
    let t = PodTimes {
        created: at,
        scheduled: at + 2.0,
        started: at + 4.0,
        ready: None,
        restart_count: 0,
        last_finished: None,
    };
    // The kubelet's record of the start, each moment in the past by the time it is written.
    testbed::wait_until(
        "the pod's start in the past",
        Duration::from_secs(10),
        || {
            (testbed::cluster::pods::unix_now() > t.started + 1.0)
                .then_some(())
                .ok_or_else(String::new)
        },
    );
    let pulled = kubelet_event(&uid, "vllm-llama-0", "Pulled", "Successfully pulled image \"vllm/vllm-openai:v0.11.0\" in 1.5s (1.6s including waiting). Image size: 10234567890 bytes.", Some(MAIN), at + 3.0);
    node.control_plane
        .create(&in_namespace(pulled, &node.inference));
    set_status(&node, "vllm-llama-0", &root, &t);

    let config = format!(
        "nvml:\n  enabled: false\nneuron:\n  enabled: false\nreadiness:\n  enabled: false\nstartup:\n  enabled: true\n{}",
        testbed::agent::model_config("llama", model.root(), &manifest)
    );
    let agent = node.start_agent(&config);
    agent.wait_for("cache verified", Duration::from_secs(20), |m| {
        sample(m, "mlnode_model_cache_verified", &[("model_name", "llama")]) == Some(1.0)
    });
    // The agent tells its own opens from others' exactly (its verifier announces each, docs/
    // startup.md), so a server loading right after a verification counts, and the agent's own
    // reads never do; a write's open is no load. In order: a download rewrites a shard (its open
    // counts as an open, its write says it was no load), the agent verifies it again, the server
    // reads both shards within 100 ms of that verification's end, then a repair rewrites the
    // other shard and is verified in turn: 1 + 2 + 1 opens, the load ending at the server's.
    let weight_opens = || {
        sample(
            &agent.metrics(),
            "mlnode_model_cache_weight_opens_total",
            &[("model_name", "llama")],
        )
        .unwrap_or(0.0)
    };
    // Full and incremental ones.
    let verifications = || {
        testbed::agent::samples(
            &agent.metrics(),
            "mlnode_model_cache_verify_duration_seconds_count",
            &[("model_name", "llama")],
        )
        .iter()
        .sum::<f64>()
    };
    let shards = [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ];
    // Written whole from the model's own bytes: reading the file first would be an open of it
    // right before the writer's, which inotify merges into one (identical events in a row).
    let rewrite = |shard: &str| {
        std::fs::write(model.path(shard), &model.files[shard]).unwrap();
    };
    // Until a verification more than `done` has ended, looked at every few milliseconds.
    let verified_after = |done: f64| {
        testbed::wait_until(
            "the agent's verification of the write",
            Duration::from_secs(20),
            || {
                (verifications() > done)
                    .then(std::time::Instant::now)
                    .ok_or_else(String::new)
            },
        )
    };
    let before = weight_opens();
    let done = verifications();
    rewrite(shards[0]);
    let ended = verified_after(done);
    let opening = testbed::cluster::pods::unix_now();
    // As a server does, its config first: an open of another file between the verifier's last
    // open of a shard and the server's keeps inotify from merging the two identical events in a
    // row into one (docs/startup.md), which would leave the server's uncounted when the agent's
    // reader lags the kernel's queue on a loaded machine.
    for file in std::iter::once("config.json").chain(shards) {
        let status = std::process::Command::new("cat")
            .arg(model.path(file))
            .stdout(std::process::Stdio::null())
            .status()
            .unwrap();
        assert!(status.success());
    }
    let opened = testbed::cluster::pods::unix_now();
    eprintln!(
        "the server read the shards {:?} after the verification ended",
        ended.elapsed()
    );
    let done = verifications();
    rewrite(shards[1]);
    verified_after(done);
    agent.wait_for("the opens counted", Duration::from_secs(20), |m| {
        sample(
            m,
            "mlnode_model_cache_weight_opens_total",
            &[("model_name", "llama")],
        )
        .unwrap_or(0.0)
            >= before + 4.0
    });
    assert_eq!(
        weight_opens(),
        before + 4.0,
        "two writers' opens and the server's two; none of the agent's three verifications' reads"
    );
    node.delete_pod("vllm-llama-1");
    let ready = PodTimes {
        ready: Some(testbed::cluster::pods::unix_now().ceil() + 1.0),
        ..t
    };
    set_status(&node, "vllm-llama-0", &root, &ready);

    let inference = node.inference.as_str();
    agent.wait_for("startup measured", Duration::from_secs(20), |m| {
        sample(
            m,
            "mlnode_pod_startup_total_seconds_count",
            &[("model_name", "llama"), ("namespace", inference)],
        ) == Some(1.0)
    });
    let m = agent.metrics();
    let last = |phase: &str| {
        sample(
            &m,
            "mlnode_pod_startup_last_phase_seconds",
            &[("pod", "vllm-llama-0"), ("phase", phase)],
        )
    };
    assert_eq!(last("scheduling"), Some(2.0));
    assert_eq!(last("image_pull"), Some(1.5));
    assert_eq!(last("container_start"), Some(1.0));
    // From the container's start (t.started) to the last open, whenever the machine got to it.
    let load = last("model_load").expect("model load seen from the weight opens");
    let (earliest, latest) = (opening - t.started - 1.0, opened - t.started + 1.0);
    assert!(
        (earliest..=latest).contains(&load),
        "model load {load}, expected {earliest:.1}..{latest:.1}"
    );
    assert!(last("readiness").is_some());
    // The two rewrites, within the startup: a download of both shards, each once, at its size.
    let written: usize = shards.iter().map(|s| model.files[*s].len()).sum();
    assert_eq!(
        sample(
            &m,
            "mlnode_pod_startup_model_download_bytes_sum",
            &[("model_name", "llama"), ("namespace", inference)],
        ),
        Some(written as f64)
    );
    assert_eq!(
        sample(
            &m,
            "mlnode_image_pull_bytes_count",
            &[("namespace", inference)]
        ),
        Some(1.0)
    );
    assert!(
        !m.contains("vllm-llama-1"),
        "a pod deleted before Ready has no startup"
    );
    let log = agent.log();
    assert!(
        log.contains("\"message\":\"pod startup\"") && log.contains("model_load"),
        "one JSON line with the breakdown"
    );

    // One events list for the startup, and no polling.
    let events = format!("/api/v1/namespaces/{inference}/events?");
    let lists = || {
        node.requests()
            .iter()
            .filter(|r| r.path.starts_with(&events))
            .count()
    };
    assert_eq!(lists(), 1);
    // A 410 Gone makes the watcher list again; the startup is not reported twice.
    let pod_lists = || {
        node.requests()
            .iter()
            .filter(|r| r.path.starts_with("/api/v1/pods?") && !r.path.contains("watch="))
            .count()
    };
    let watches = || {
        node.requests()
            .iter()
            .filter(|r| r.path.starts_with("/api/v1/pods?") && r.path.contains("watch="))
            .count()
    };
    let (lists_before, watches_before) = (pod_lists(), watches());
    node.api.expire_watches();
    testbed::wait_until("a new list of pods", Duration::from_secs(10), || {
        (pod_lists() > lists_before)
            .then_some(())
            .ok_or_else(String::new)
    });
    // The watcher asks for its next watch only once the tracker has taken every listed pod.
    testbed::wait_until("a new watch of pods", Duration::from_secs(10), || {
        (watches() > watches_before)
            .then_some(())
            .ok_or_else(String::new)
    });
    assert_eq!(lists(), 1);
    assert_eq!(
        sample(
            &agent.metrics(),
            "mlnode_pod_startup_total_seconds_count",
            &[("model_name", "llama")]
        ),
        Some(1.0)
    );
    assert!(
        node.requests()
            .iter()
            .all(|r| r.path.contains("spec.nodeName%3D") || !r.path.starts_with("/api/v1/pods")),
        "only this node's pods"
    );
}

/// The pod's status as the kubelet writes it for `t`.
fn set_status(node: &ApiOnlyNode, name: &str, root: &str, t: &PodTimes) {
    let status = &vllm_pod("", name, root, t)["status"];
    node.control_plane
        .write_pod_status(&node.inference, name, status);
}

/// `mlnode-agent startup-report` as an SRE runs it, with their own kubeconfig (the admin's here):
/// the pod's phases from what the server stores, its creation time the server's own.
#[test]
fn startup_report_prints_the_phases_from_the_api() {
    let control_plane = testbed::needs!(testbed::cluster::control_plane::shared());
    let namespace = control_plane.namespace("inference", json!({}));
    let node = control_plane.unique("node");
    let created = control_plane.create_pod(
        &namespace,
        &bound_vllm_pod("vllm-mistral-0", "/var/lib/models/mistral", &node),
    );
    let uid = created["metadata"]["uid"].as_str().unwrap();
    let at = unix(&created["metadata"]["creationTimestamp"]);
    let t = PodTimes {
        created: at,
        scheduled: at + 2.0,
        started: at + 60.0,
        ready: Some(at + 200.0),
        restart_count: 0,
        last_finished: None,
    };
    let status = &vllm_pod(uid, "vllm-mistral-0", "/var/lib/models/mistral", &t)["status"];
    control_plane.write_pod_status(&namespace, "vllm-mistral-0", status);
    let pulled = kubelet_event(uid, "vllm-mistral-0", "Pulled", "Successfully pulled image \"vllm/vllm-openai:v0.11.0\" in 20.5s (20.6s including waiting). Image size: 10234567890 bytes.", Some(MAIN), at + 40.0);
    control_plane.create(&in_namespace(pulled, &namespace));
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_mlnode-agent"))
        .args(["startup-report", "--node", &node])
        .env("KUBECONFIG", control_plane.kubeconfig())
        .env_remove("MLNODE_CONFIG")
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{table}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let row = table
        .lines()
        .find(|l| l.contains("vllm-mistral-0"))
        .unwrap_or_else(|| panic!("{table}"));
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(
        cells,
        [
            namespace.as_str(),
            "vllm-mistral-0",
            "-",
            "2.0s",
            "20.5s",
            "20.0s",
            "-",
            "-",
            "200.0s"
        ],
        "{table}"
    );
}

/// The SOCI snapshotter's metrics socket as the agent reads it, answering what the test sets:
/// the snapshotter's own exposition (tests/fixtures/soci/metrics.txt) with the weights' layer's
/// fetched bytes set, another form, or a connection closed unanswered, as a snapshotter that
/// stopped leaves it. A fake only for the cut and the other form: the rest of the exposition is
/// soci's own.
struct SociSocket {
    _dir: tempfile::TempDir,
    path: std::path::PathBuf,
    answer: std::sync::Arc<std::sync::Mutex<Option<String>>>,
    reads: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

/// The weights' layer of the fixture's image, and a layer of an image no pod here runs.
const WEIGHTS_LAYER: &str =
    "sha256:507a7f7c82543fde896e979994ff940967d4f612a1bbbeca6a9ee07344d5155c";
const OTHER_IMAGES_LAYER: &str =
    "sha256:ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff";

impl SociSocket {
    fn start() -> SociSocket {
        use std::io::{Read, Write};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let answer = std::sync::Arc::new(std::sync::Mutex::new(None::<String>));
        let reads = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (served, counted) = (answer.clone(), reads.clone());
        // Ends with the test process; each connection is one request.
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                let mut request = [0u8; 4096];
                let _ = stream.read(&mut request);
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                if let Some(body) = served.lock().unwrap().clone() {
                    let _ = write!(
                        stream,
                        "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                }
            }
        });
        SociSocket {
            _dir: dir,
            path,
            answer,
            reads,
        }
    }

    fn answer(&self, text: Option<String>) {
        *self.answer.lock().unwrap() = text;
    }

    /// soci's exposition with the weights' layer at `fetched` bytes and another image's layer,
    /// mounted beside it, at ten times that.
    fn exposition(fetched: u64) -> String {
        let fixture = include_str!("../../../tests/fixtures/soci/metrics.txt");
        let weights = format!("soci_fs_layer_fetched_size_bytes{{digest=\"{WEIGHTS_LAYER}\"");
        let mut text: String = fixture
            .lines()
            .map(|line| match line.starts_with(&weights) {
                true => format!("{} {fetched}\n", line.rsplit_once(' ').unwrap().0),
                false => format!("{line}\n"),
            })
            .collect();
        text.push_str(&format!(
            "soci_fs_layer_fetched_size_bytes{{digest=\"{OTHER_IMAGES_LAYER}\",mountpoint=\"/var/lib/soci-snapshotter-grpc/snapshotter/snapshots/9/fs\"}} {}\n",
            fetched * 10
        ));
        text
    }

    /// Until the agent has read the socket `more` times more.
    fn await_reads(&self, more: usize) {
        let count = || self.reads.load(std::sync::atomic::Ordering::SeqCst);
        let target = count() + more;
        testbed::wait_until("the agent's readings", Duration::from_secs(10), || {
            (count() >= target)
                .then_some(())
                .ok_or_else(|| format!("{} readings", count()))
        });
    }
}

/// The content store of the tests' node as containerd left it for the lazily pulled image
/// (tests/fixtures/SOURCES).
fn fixture_content_store() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let blobs = dir.path().join("blobs/sha256");
    std::fs::create_dir_all(&blobs).unwrap();
    let fixtures =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/soci/blobs");
    for entry in std::fs::read_dir(fixtures).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), blobs.join(entry.file_name())).unwrap();
    }
    dir
}

/// The SOCI-converted image's index as the kubelet reported it on the tests' node, and a
/// manifest of an image pulled whole there.
const LAZY_IMAGE: &str =
    "127.0.0.1:5000/workload@sha256:85acc76c69b63036bc0272ec39686538cb14c313f705c3af0ddb71849b241ab4";
const WHOLE_IMAGE: &str =
    "127.0.0.1:5000/workload@sha256:10a7fcaa578901425a44d4c62920ffced4d5759b48f7249b29b2a9530ac6afa9";

/// The agent's "pod startup" line for `pod`, its breakdown parsed.
fn startup_line(log: &str, pod: &str) -> Option<serde_json::Value> {
    log.lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|line| {
            line["fields"]["message"] == "pod startup" || line["message"] == "pod startup"
        })
        .map(|line| {
            let fields = if line["fields"].is_object() {
                &line["fields"]
            } else {
                &line
            };
            serde_json::from_str::<serde_json::Value>(fields["phases"].as_str().unwrap()).unwrap()
        })
        .find(|startup| startup["pod"] == pod)
}

/// Where a lazily loaded image's bytes were fetched, read from the snapshotter's socket while the
/// pods start: each rise goes to the phase it happened in, another image's layer counts for
/// nothing, an image the snapshotter pulled whole is not lazy; a cut and then another form leave
/// the phases the agent could not see absent (not 0), say why, and the rest of the agent goes on.
#[test]
fn a_lazily_loaded_images_fetching_is_split_over_its_phases_and_a_cut_leaves_the_rest_absent() {
    let node = testbed::needs!(ApiOnlyNode::gpu(&[]));
    let model = PlainModel::new();
    let (_dir, manifest) = testbed::write_temp(&model.manifest_json("v1", true));
    let root = model.root().display().to_string();
    let store = fixture_content_store();
    let soci = SociSocket::start();
    soci.answer(Some(SociSocket::exposition(0)));
    let config = format!(
        "nvml:\n  enabled: false\nneuron:\n  enabled: false\nreadiness:\n  enabled: false\nstartup:\n  enabled: true\n  content_store: {}\n  soci:\n    metrics_socket: {}\n    sample_interval: 100ms\n{}",
        store.path().display(),
        soci.path.display(),
        testbed::agent::model_config("llama", model.root(), &manifest)
    );
    let agent = node.start_agent(&config);
    // Pods created once the tracker watches: its first reading is as their startups begin.
    agent.wait_for("the tracker started", Duration::from_secs(20), |m| {
        sample(m, "mlnode_collector_up", &[("collector", "startup")]) == Some(1.0)
    });
    let now = testbed::cluster::pods::unix_now;
    let after = |at: f64| {
        testbed::wait_until("the moment", Duration::from_secs(10), || {
            (now() >= at).then_some(()).ok_or_else(String::new)
        })
    };
    // One startup's life as the kubelet writes it: the image pulled at a whole second, the
    // container started the next, its fetching (`fetch`) after that, Ready at the next whole
    // second. Returns its Ready time.
    let start = |pods: &[(&str, &str)], fetch: &dyn Fn()| -> f64 {
        let created: Vec<(String, f64, &str)> = pods
            .iter()
            .map(|(name, image)| {
                let pod = node.put_pod(&bound_vllm_pod(name, &root, node.name()));
                (
                    pod["metadata"]["uid"].as_str().unwrap().to_string(),
                    unix(&pod["metadata"]["creationTimestamp"]),
                    *image,
                )
            })
            .collect();
        // The agent reads the snapshotter only while a pod starts: readings say it sees them.
        soci.await_reads(3);
        let pulled = now().ceil();
        after(pulled + 1.2);
        for ((uid, at, image), (name, _)) in created.iter().zip(pods) {
            let event = kubelet_event(uid, name, "Pulled", "Successfully pulled image \"127.0.0.1:5000/workload:soci\" in 80ms (80ms including waiting). Image size: 72234598 bytes.", Some(MAIN), pulled);
            node.control_plane
                .create(&in_namespace(event, &node.inference));
            let t = PodTimes {
                created: *at,
                scheduled: *at,
                started: pulled + 1.0,
                ready: None,
                restart_count: 0,
                last_finished: None,
            };
            set_status_of_image(&node, name, &root, &t, image);
        }
        soci.await_reads(3);
        fetch();
        let ready = now().ceil();
        for ((_, at, image), (name, _)) in created.iter().zip(pods) {
            let t = PodTimes {
                created: *at,
                scheduled: *at,
                started: pulled + 1.0,
                ready: Some(ready),
                restart_count: 0,
                last_finished: None,
            };
            set_status_of_image(&node, name, &root, &t, image);
        }
        ready
    };
    let awaited = |pod: &str| {
        testbed::wait_until(
            &format!("the agent's startup of {pod}"),
            Duration::from_secs(20),
            || startup_line(&agent.log(), pod).ok_or_else(|| agent.log()),
        )
    };

    start(&[("lazy", LAZY_IMAGE), ("whole", WHOLE_IMAGE)], &|| {
        for fetched in [32u64 << 20, 64 << 20] {
            soci.answer(Some(SociSocket::exposition(fetched)));
            soci.await_reads(3);
        }
    });
    let lazy = awaited("lazy");
    eprintln!("lazy: {lazy}");
    let load = &lazy["lazy_load"];
    assert_eq!(load["lazy"], true, "{lazy}");
    assert_eq!(load["fetched"]["image_pull"]["fetched_bytes"], 0, "{lazy}");
    assert_eq!(
        load["fetched"]["container_start"]["fetched_bytes"], 0,
        "{lazy}"
    );
    let start_to_ready = &load["fetched"]["start_to_ready"];
    assert_eq!(
        start_to_ready["fetched_bytes"],
        64u64 << 20,
        "every rise of the image's layers, none of the other image's: {lazy}"
    );
    let fetching = start_to_ready["fetch_seconds"].as_f64().unwrap();
    assert!(
        fetching > 0.0 && fetching < lazy["phases"]["model_load"].as_f64().unwrap_or(10.0),
        "{lazy}"
    );
    assert!(
        lazy["image_pull_split"]["absent"]
            .as_str()
            .is_some_and(|why| why.contains("loaded lazily")),
        "a lazily loaded image is not unpacked: no split: {lazy}"
    );
    let whole = awaited("whole");
    assert_eq!(
        whole["lazy_load"],
        json!({"lazy": false, "fetched": {}}),
        "none of its layers mounted by the snapshotter: {whole}"
    );
    // The node's store kept the whole image's manifest, not its layer: no split, and why.
    assert!(
        whole["image_pull_split"]["absent"]
            .as_str()
            .is_some_and(|why| why.contains("1 of the image's 1 layers are not in")),
        "{whole}"
    );
    assert!(
        agent
            .log()
            .contains("an image pull is not split into transfer and unpack"),
        "said in the log"
    );
    let m = agent.metrics();
    let inference = node.inference.as_str();
    for (lazy, count) in [("true", 1.0), ("false", 1.0)] {
        assert_eq!(
            sample(
                &m,
                "mlnode_pod_startup_lazy_images_total",
                &[("namespace", inference), ("lazy", lazy)]
            ),
            Some(count)
        );
    }
    assert_eq!(
        sample(
            &m,
            "mlnode_pod_startup_phase_fetched_bytes_sum",
            &[("namespace", inference), ("phase", "start_to_ready")]
        ),
        Some((64u64 << 20) as f64)
    );
    assert_eq!(
        sample(&m, "mlnode_collector_up", &[("collector", "soci")]),
        Some(1.0)
    );

    // The snapshotter stops mid-startup, then answers in another form: the phases it saw keep
    // their figures, the rest are absent, and the agent says why.
    start(&[("cut", LAZY_IMAGE)], &|| {
        soci.answer(Some(SociSocket::exposition(96 << 20)));
        soci.await_reads(3);
        soci.answer(None);
        agent.wait_for("the snapshotter down", Duration::from_secs(10), |m| {
            sample(m, "mlnode_collector_up", &[("collector", "soci")]) == Some(0.0)
        });
        soci.answer(Some("<html>503 Service Unavailable</html>\n".into()));
        soci.await_reads(3);
    });
    let cut = awaited("cut");
    eprintln!("cut: {cut}");
    assert_eq!(cut["lazy_load"]["lazy"], true, "{cut}");
    let fetched = cut["lazy_load"]["fetched"].as_object().unwrap();
    assert!(
        fetched.contains_key("image_pull") && fetched.contains_key("container_start"),
        "{cut}"
    );
    assert!(
        !fetched.contains_key("start_to_ready"),
        "absent, not 0: {cut}"
    );
    assert!(
        cut["phases"]["container_start"].is_number(),
        "the phases go on: {cut}"
    );
    let log = agent.log();
    assert!(
        log.contains("is not a series name; is the socket soci-snapshotter's metrics endpoint?"),
        "the reason, in the log: {log}"
    );
    assert!(!log.contains("panicked"), "the agent goes on");
    assert_eq!(
        sample(
            &agent.metrics(),
            "mlnode_collector_up",
            &[("collector", "startup")]
        ),
        Some(1.0)
    );
}

/// The pod's status as the kubelet writes it for `t`, its main container's image `image_id`.
fn set_status_of_image(node: &ApiOnlyNode, name: &str, root: &str, t: &PodTimes, image_id: &str) {
    let mut status = vllm_pod("", name, root, t)["status"].clone();
    status["containerStatuses"][0]["imageID"] = json!(image_id);
    node.control_plane
        .write_pod_status(&node.inference, name, &status);
}
