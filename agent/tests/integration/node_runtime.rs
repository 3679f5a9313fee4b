//! The tests' node, first part: its container runtime (testbed::node), real. An image the test
//! builds and pushes to the node's own registry is pulled by containerd and run by runc with
//! seccomp's default filter; the container reads a model through a read-only bind mount, as a pod
//! reads a hostPath. Nothing of it shows in the machine's own mounts, and nothing is left running
//! once it stops.

use mlnode_testbed as testbed;
use serde_json::Value;

use testbed::node::runtime::{Runtime, REGISTRY};

#[test]
fn a_container_from_the_nodes_registry_reads_a_model_through_a_read_only_mount() {
    let programs = testbed::needs!(testbed::node::runtime::programs());
    let runtime = Runtime::start().unwrap();
    let digest = runtime.push_image("workload:v1", &[&programs.join("workload")], "/workload");
    let image = format!("{REGISTRY}/workload:v1");
    // The digest is the registry's manifest's own sha256: what was pushed is what is served.
    let manifest = runtime.crane(&["manifest", &image]);
    assert_eq!(
        digest,
        format!(
            "sha256:{}",
            testbed::models::sha256_hex(manifest.as_bytes())
        )
    );
    runtime.ctr(&["images", "pull", "--plain-http", &image]);
    assert!(
        runtime.ctr(&["images", "ls"]).contains(&digest),
        "containerd holds the image by the registry's digest"
    );

    let model = testbed::models::PlainModel::new();
    let model_bytes: u64 = walkdir::WalkDir::new(model.root())
        .into_iter()
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_file())
        .map(|e| e.metadata().unwrap().len())
        .sum();
    let mount = format!(
        "type=bind,src={},dst=/model,options=rbind:ro",
        model.root().display()
    );
    // The container's output to a file, with no stdio fifos for ctr to open.
    let log = runtime.dir().join("workload-1.log");
    let log_uri = format!("file://{}", log.display());
    let cgroup = runtime.cgroup("workload-1");
    runtime.ctr(&[
        "run",
        "--rm",
        "--seccomp",
        "--log-uri",
        &log_uri,
        "--cgroup",
        &cgroup,
        "--mount",
        &mount,
        &image,
        "workload-1",
        "/workload",
        "--model",
        "/model",
        "--exit-after-load",
    ]);
    let output = std::fs::read_to_string(&log).unwrap();
    let events: Vec<Value> = output
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let event = |name: &str| {
        events
            .iter()
            .find(|e| e["event"] == name)
            .unwrap_or_else(|| panic!("no {name} in the container's output: {output}"))
    };
    assert_eq!(
        event("started")["seccomp"],
        "2",
        "runc put the container under a seccomp filter"
    );
    assert_eq!(event("model_loaded")["bytes"], model_bytes, "{output}");
    assert!(
        testbed::node::runtime::machine_mounts_under(runtime.dir()).is_empty(),
        "the snapshots' mounts stay in the node's namespace"
    );

    assert!(
        !runtime.cgroup_dirs().is_empty(),
        "runc made the container's cgroups under the node's own root"
    );
    let dir = runtime.dir().to_path_buf();
    let cgroups = runtime.cgroup_dirs();
    drop(runtime);
    assert!(
        cgroups.iter().all(|c| !c.exists()),
        "the node's cgroups are removed with it: {cgroups:?}"
    );
    let left = testbed::node::runtime::machine_mounts_under(&dir);
    assert!(left.is_empty(), "mounts left behind: {left:?}");
    let running: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| std::fs::read(e.ok()?.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(&dir.display().to_string()))
        .collect();
    assert!(running.is_empty(), "processes left running: {running:?}");
    assert!(!dir.exists(), "the node's folder is removed with it");
}
