//! A restarted agent and what a previous agent of the same boot verified (issue 38,
//! docs/cache-verification.md "Restarts"): the record kept in `ModelCacheVerified`'s message on a
//! real kube-apiserver (through the recording proxy, testbed::cluster::api_only_node), real files on disk, the
//! agent binary run twice. An unchanged cache is
//! verified again without a byte read and no gate leaves True; anything that changed while the
//! agent was down is hashed and found.

use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use mlnode_testbed as testbed;
use serde_json::{json, Value};
use testbed::agent::{sample, Agent};
use testbed::cluster::api_only_node::ApiOnlyNode;
use testbed::models::PlainModel;

const BOOT: &str = "3f2b1c9e-8d7a-4c1b-9e2f-0a1b2c3d4e5f";

/// A node of the real cluster and its boot id.
struct Node {
    api: ApiOnlyNode,
    _boot: tempfile::TempDir,
    boot_id: PathBuf,
}

impl Node {
    fn new() -> Result<Node, String> {
        let boot = tempfile::tempdir().unwrap();
        let boot_id = boot.path().join("boot_id");
        std::fs::write(&boot_id, format!("{BOOT}\n")).unwrap();
        Ok(Node {
            api: ApiOnlyNode::gpu(&[])?,
            _boot: boot,
            boot_id,
        })
    }

    /// The agent verifying `llama` at `root`, with `verify` added to its verify section. No start
    /// jitter: the tests measure the restart, not the spread of a rollout.
    fn agent(&self, root: &Path, manifest: &Path, verify: &str) -> Agent {
        self.agent_jittered(root, manifest, "0s", verify)
    }

    /// [`Node::agent`] with `start_jitter`, as the chart sets it for a rollout.
    fn agent_jittered(&self, root: &Path, manifest: &Path, jitter: &str, verify: &str) -> Agent {
        let config = format!(
            "start_jitter: {jitter}\nnvml:\n  enabled: false\nneuron:\n  enabled: false\nverify:\n  restart_jitter: 0s\n{verify}readiness:\n  enabled: true\n  interval: 200ms\n  heartbeat: 1s\n  boot_id_file: {:?}\n{}",
            self.boot_id.display().to_string(),
            testbed::agent::model_config("llama", root, manifest)
        );
        self.api.start_agent(&config)
    }

    fn cache_condition(&self) -> Value {
        self.api.condition("ModelCacheVerified")
    }

    /// Until the node's condition carries a record of `llama` whose every group of files a
    /// restart can match (none changed within the racy window before it was hashed).
    fn wait_for_record(&self) -> String {
        let boot = std::fs::read_to_string(&self.boot_id).unwrap();
        let boot = boot.trim();
        testbed::wait_until(
            "a complete record on the node",
            Duration::from_secs(30),
            || {
                let condition = self.cache_condition();
                let message = condition["message"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                let complete = condition["status"] == "True"
                    && message.contains(&format!("[mlnode-agent: boot {boot}; verified llama="))
                    && !message.contains("0000000000000000");
                complete.then_some(message).ok_or(condition.to_string())
            },
        )
    }

    /// How many status writes the API server has seen: the start of what the next agent wrote.
    fn mark(&self) -> usize {
        self.api.requests().len()
    }

    /// Every `ModelCacheVerified` written since `mark`.
    fn cache_writes_since(&self, mark: usize) -> Vec<Value> {
        self.api.requests()[mark..]
            .iter()
            .filter(|r| r.method == "PATCH" && r.resource_path().ends_with("/status"))
            .flat_map(|r| {
                r.body["status"]["conditions"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
            })
            .filter(|c| c["type"] == "ModelCacheVerified")
            .collect()
    }
}

/// /readyz once the model has a verdict, either way.
fn ready(agent: &Agent) -> String {
    testbed::wait_until("a verdict on /readyz", Duration::from_secs(30), || {
        let (status, body) = agent.get("/readyz");
        let failed = body.contains("not verified:") && !body.contains("in progress");
        (status == 200 || failed)
            .then_some(body.clone())
            .ok_or(body)
    })
}

fn hashed(agent: &Agent) -> f64 {
    sample(
        &agent.metrics(),
        "mlnode_model_cache_hashed_bytes_total",
        &[("model_name", "llama")],
    )
    .unwrap()
}

fn restart_records(agent: &Agent, result: &str) -> f64 {
    sample(
        &agent.metrics(),
        "mlnode_model_cache_restart_records_total",
        &[("model_name", "llama"), ("result", result)],
    )
    .unwrap_or(0.0)
}

/// A model verified by a first agent, which left its record on the node and was stopped.
fn verified_then_stopped(node: &Node, model: &PlainModel, manifest: &Path) {
    testbed::models::wait_until_settled(model.root());
    let mut first = node.agent(model.root(), manifest, "");
    assert_eq!(ready(&first).lines().count(), 1);
    node.wait_for_record();
    assert_eq!(first.terminate().0, Some(0));
}

#[test]
fn an_unchanged_cache_is_verified_at_restart_without_a_read_and_every_gate_stays_true() {
    let node = testbed::needs!(Node::new());
    let model = PlainModel::new();
    let (_dir, manifest) = testbed::write_temp(&model.manifest_json("v1", true));
    // A pod serving the model, gated on it.
    node.api.put_pod(&testbed::cluster::pods::gated_vllm_pod(
        "",
        "vllm-0",
        node.api.name(),
        "/var/lib/models",
        json!({"mlnode.dev/model": "llama"}),
    ));
    let gate = || node.api.pod_condition("vllm-0", "mlnode.dev/ModelVerified");
    testbed::models::wait_until_settled(model.root());
    let mut first = node.agent(model.root(), &manifest, "");
    ready(&first);
    node.wait_for_record();
    testbed::wait_until("the pod's gate True", Duration::from_secs(20), || {
        (gate()["status"] == "True")
            .then_some(())
            .ok_or(gate().to_string())
    });
    assert_eq!(first.terminate().0, Some(0));

    let mark = node.mark();
    let second = node.agent(model.root(), &manifest, "");
    let body = ready(&second);
    assert!(body.contains("unchanged since"), "{body}");
    assert_eq!(hashed(&second), 0.0, "no byte of the cache read again");
    assert_eq!(restart_records(&second, "trusted"), 1.0);
    let metrics = second.metrics();
    assert_eq!(
        sample(
            &metrics,
            "mlnode_model_cache_verified_by",
            &[("model_name", "llama"), ("verified_by", "unchanged_since")]
        ),
        Some(1.0)
    );
    assert!(second
        .log()
        .contains("a previous agent of this boot recorded what it verified"));

    // The condition says where the verdict came from, carries the record on, and never left True.
    let condition = testbed::wait_until("the restart said", Duration::from_secs(20), || {
        let c = node.cache_condition();
        c["message"]
            .as_str()
            .is_some_and(|m| m.contains("unchanged since a previous agent of this boot"))
            .then(|| c.clone())
            .ok_or(c.to_string())
    });
    assert_eq!(condition["status"], "True");
    let written = node.cache_writes_since(mark);
    assert!(
        written.iter().all(|c| c["status"] == "True"),
        "a restart never takes the gate out: {written:?}"
    );
    // The pod's gate was never written anything but True either, and still is.
    let pod_writes: Vec<Value> = node.api.requests()[mark..]
        .iter()
        .filter(|r| r.method == "PATCH" && r.path.contains("/pods/"))
        .flat_map(|r| {
            r.body["status"]["conditions"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .collect();
    assert!(
        pod_writes.iter().all(|c| c["status"] == "True"),
        "{pod_writes:?}"
    );
    assert_eq!(gate()["status"], "True");
}

/// A file written beside the manifest (another model's manifest, a ConfigMap's `..data`) while
/// a restarted agent waits out its start jitter for its record is not the model: the unchanged
/// cache stays trusted, no byte read. Before, any change seen before the first verification
/// asked for everything, and the whole cache was hashed again a second after it was trusted.
#[test]
fn a_write_beside_the_manifest_during_a_restart_reads_nothing() {
    let node = testbed::needs!(Node::new());
    let model = PlainModel::new();
    let (dir, manifest) = testbed::write_temp(&model.manifest_json("v1", true));
    testbed::models::wait_until_settled(model.root());
    let mut first = node.agent(model.root(), &manifest, "");
    ready(&first);
    node.wait_for_record();
    assert_eq!(first.terminate().0, Some(0));

    let second = node.agent_jittered(model.root(), &manifest, "2s", "");
    // Written again and again until the cache is trusted: some of it lands while the agent
    // watches and waits.
    let mut writes = 0;
    testbed::wait_until("trusted", Duration::from_secs(30), || {
        writes += 1;
        std::fs::write(dir.path().join("other-model.json"), writes.to_string()).unwrap();
        match testbed::agent::http_get(second.port(), "/readyz") {
            Ok((200, body)) => Ok(body),
            other => Err(format!("{other:?}")),
        }
    });
    // A file of no manifest in the model's root: seen after every write above.
    std::fs::write(model.root().join("notes.txt"), "x").unwrap();
    second.wait_for_log("the root listed again", Duration::from_secs(20), |log| {
        log.contains(r#""kind":"incremental""#)
    });
    assert_eq!(hashed(&second), 0.0, "{}", second.log());
    assert_eq!(restart_records(&second, "trusted"), 1.0);
    assert_eq!(second.log().matches(r#""kind":"full""#).count(), 1);
}

/// What changed while the agent was down, and what the restart must find.
enum Expect {
    /// The changed file's content differs: the model fails, naming it.
    Fails(&'static str),
    /// The content is the same, but the file is not the one recorded: hashed again, verified.
    HashedAgain(&'static str),
}

/// Runs a first agent, stops it, changes the cache with `change`, starts a second agent and checks
/// that exactly the changed file was hashed again and judged as `expect` says.
fn restart_after(change: impl FnOnce(&PlainModel), expect: Expect) {
    let node = testbed::needs!(Node::new());
    let model = PlainModel::new();
    let (_dir, manifest) = testbed::write_temp(&model.manifest_json("v1", true));
    verified_then_stopped(&node, &model, &manifest);
    change(&model);
    let second = node.agent(model.root(), &manifest, "");
    let body = ready(&second);
    let (path, verified) = match expect {
        Expect::Fails(path) => (path, false),
        Expect::HashedAgain(path) => (path, true),
    };
    if verified {
        assert!(body.starts_with("llama: verified"), "{body}");
    } else {
        assert!(body.contains(&format!("{path} digest_mismatch")), "{body}");
    }
    // Each file of this small model is a group of its own: only the changed one is read.
    let size = model.files[path].len() as f64;
    testbed::wait_until("the run counted", Duration::from_secs(10), || {
        (hashed(&second) == size).then_some(()).ok_or(format!(
            "hashed {} bytes, the file has {size}",
            hashed(&second)
        ))
    });
    assert_eq!(restart_records(&second, "partial"), 1.0);
}

const SHARD: &str = "model-00001-of-00002.safetensors";

#[test]
fn a_byte_flipped_in_place_while_the_agent_was_down_is_hashed_and_found() {
    restart_after(
        |model| {
            let mut file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(model.path(SHARD))
                .unwrap();
            file.seek(SeekFrom::Start(1000)).unwrap();
            file.write_all(&[model.files[SHARD][1000] ^ 0xff]).unwrap();
        },
        Expect::Fails(SHARD),
    );
}

/// The shard replaced, as a download tool replaces a file, by a new file (a new inode) of `bytes`.
fn replace_shard(model: &PlainModel, bytes: &[u8]) {
    let new = model.path("replacement.tmp");
    std::fs::write(&new, bytes).unwrap();
    std::fs::rename(&new, model.path(SHARD)).unwrap();
}

#[test]
fn a_file_replaced_by_another_of_the_same_size_is_hashed_and_found() {
    restart_after(
        |model| {
            replace_shard(
                model,
                &testbed::models::content(9, model.files[SHARD].len()),
            )
        },
        Expect::Fails(SHARD),
    );
}

#[test]
fn a_file_replaced_by_a_copy_of_itself_is_hashed_again() {
    restart_after(
        |model| replace_shard(model, &model.files[SHARD]),
        Expect::HashedAgain(SHARD),
    );
}

/// `touch -d` sets the old mtime back after a write; ctime cannot be set back, and says so.
#[test]
fn a_write_whose_mtime_was_set_back_is_hashed_and_found() {
    restart_after(
        |model| {
            let path = model.path(SHARD);
            let mtime = std::fs::metadata(&path).unwrap().modified().unwrap();
            std::fs::write(
                &path,
                testbed::models::content(11, model.files[SHARD].len()),
            )
            .unwrap();
            std::fs::File::options()
                .write(true)
                .open(&path)
                .unwrap()
                .set_modified(mtime)
                .unwrap();
            assert_eq!(std::fs::metadata(&path).unwrap().modified().unwrap(), mtime);
        },
        Expect::Fails(SHARD),
    );
}

#[test]
fn a_new_boot_a_changed_manifest_and_a_foreign_record_are_hashed_whole() {
    let node = testbed::needs!(Node::new());
    let model = PlainModel::new();
    let (_dir, manifest) = testbed::write_temp(&model.manifest_json("v1", true));
    let all: f64 = model.files.values().map(|b| b.len() as f64).sum();
    verified_then_stopped(&node, &model, &manifest);

    // The node rebooted: a record of another boot is none.
    std::fs::write(&node.boot_id, "0a1b2c3d-0000-4000-8000-000000000001\n").unwrap();
    let mut agent = node.agent(model.root(), &manifest, "");
    assert!(ready(&agent).starts_with("llama: verified"));
    assert_eq!(hashed(&agent), all);
    assert_eq!(restart_records(&agent, "none"), 1.0);
    assert!(agent.log().contains("from an earlier boot"));
    node.wait_for_record();
    agent.terminate();

    // A new manifest (a rollout that changed it): the record is of another one.
    std::fs::write(&manifest, model.manifest_json("v2", true)).unwrap();
    let mut agent = node.agent(model.root(), &manifest, "");
    assert!(ready(&agent).starts_with("llama: verified (revision v2)"));
    assert_eq!(hashed(&agent), all);
    assert_eq!(restart_records(&agent, "unusable"), 1.0);
    node.wait_for_record();
    agent.terminate();

    // A record the agent did not write whole: counted, said, ignored.
    let condition = node.cache_condition();
    let message = condition["message"].as_str().unwrap();
    let cut = message.rfind(':').unwrap();
    let mut garbled = condition.clone();
    garbled["message"] = json!(format!("{}:not-hex]", &message[..cut]));
    // Written as an agent writes it: its own token, a strategic-merge patch of its condition.
    let written = node.api.control_plane.request_as(
        &node.api.on.token,
        "PATCH",
        &format!("{}/status", node.api.path()),
        "application/strategic-merge-patch+json",
        &json!({"status": {"conditions": [garbled]}}),
    );
    assert_eq!(written.0, 200, "{}", written.1);
    let agent = node.agent(model.root(), &manifest, "");
    assert!(ready(&agent).starts_with("llama: verified"));
    assert_eq!(hashed(&agent), all);
    assert_eq!(restart_records(&agent, "none"), 1.0);
    assert_eq!(
        sample(
            &agent.metrics(),
            "mlnode_readiness_memory_errors_total",
            &[]
        ),
        Some(1.0)
    );
    assert!(agent
        .log()
        .contains("does not carry the verified caches' records in the form this agent writes"));
}

#[test]
fn with_trust_off_a_restart_hashes_as_before() {
    let node = testbed::needs!(Node::new());
    let model = PlainModel::new();
    let (_dir, manifest) = testbed::write_temp(&model.manifest_json("v1", true));
    verified_then_stopped(&node, &model, &manifest);
    let agent = node.agent(
        model.root(),
        &manifest,
        "  trust_unchanged_after_restart: false\n",
    );
    assert!(ready(&agent).starts_with("llama: verified"));
    let all: f64 = model.files.values().map(|b| b.len() as f64).sum();
    assert_eq!(hashed(&agent), all);
    assert_eq!(restart_records(&agent, "none"), 0.0, "not even looked");
}

/// A hub cache: its snapshot entries are links into blobs/, and the blob behind each is what a
/// restart looks at.
#[test]
fn an_unchanged_hub_cache_is_trusted_and_a_rewritten_blob_is_not() {
    let node = testbed::needs!(Node::new());
    let cache = testbed::models::HfCache::new();
    let (_dir, manifest) = testbed::write_temp(&cache.manifest_json(testbed::models::COMMIT));
    testbed::models::wait_until_settled(cache.hub.path());
    let mut first = node.agent(&cache.root(), &manifest, "");
    ready(&first);
    node.wait_for_record();
    first.terminate();

    let mut second = node.agent(&cache.root(), &manifest, "");
    assert!(ready(&second).starts_with("llama: verified"));
    assert_eq!(hashed(&second), 0.0);
    assert_eq!(restart_records(&second, "trusted"), 1.0);
    second.terminate();

    // The blob the entry links is written anew with the same bytes: not the file recorded.
    let weights = &cache.files["model.safetensors"];
    let blob = cache
        .root()
        .join("blobs")
        .join(testbed::models::sha256_hex(weights));
    std::fs::remove_file(&blob).unwrap();
    std::fs::write(&blob, weights).unwrap();
    let third = node.agent(&cache.root(), &manifest, "");
    assert!(ready(&third).starts_with("llama: verified"));
    assert_eq!(hashed(&third), weights.len() as f64);
}
