//! Every Kubernetes object in deploy/ is valid against the Kubernetes 1.33 schema
//! (`kubernetes-validate`, installed by the test command), and the documented init-container gate
//! runs the verifier with the exit codes the pod relies on.

use std::path::{Path, PathBuf};
use std::process::Command;

use assert_cmd::cargo::CommandCargoExt;
use mlnode_testbed as testbed;
use testbed::models::PlainModel;
use testbed::renderers::kustomize::{daemonset, id};

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// The YAML files under deploy/ that hold Kubernetes objects (kustomization files are build input;
/// the Helm chart's templates are validated as Helm renders them, in helm.rs).
fn object_files() -> Vec<PathBuf> {
    walkdir::WalkDir::new(deploy_dir())
        .into_iter()
        .filter_map(|e| e.ok())
        .map(|e| e.into_path())
        .filter(|p| {
            p.extension().is_some_and(|x| x == "yaml")
                && p.file_name().is_some_and(|n| n != "kustomization.yaml")
                && !p.starts_with(deploy_dir().join("helm"))
        })
        .collect()
}

#[test]
fn every_object_in_deploy_validates_against_kubernetes_1_33() {
    let files = object_files();
    assert!(files.len() >= 3, "{files:?}");
    let output = Command::new("kubernetes-validate")
        .args(["--kubernetes-version", "1.33.0", "--strict", "--no-warn"])
        .args(&files)
        .output()
        .expect("kubernetes-validate is installed by the test command (pip install kubernetes-validate)");
    let report = String::from_utf8_lossy(&output.stdout).to_string()
        + &String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{report}");
    assert!(!report.contains("ERROR"), "{report}");
}

/// The init container's command from the example, with its paths pointed at `root` and `manifest`.
fn init_container_command(root: &Path, manifest: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(deploy_dir().join("examples/vllm-with-verified-cache.yaml"))
        .unwrap();
    let deployment: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
    let init = &deployment["spec"]["template"]["spec"]["initContainers"][0];
    init["command"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .map(|a| match a {
            "/models/llama-3.1-8b" => root.display().to_string(),
            "/etc/mlnode/manifests/llama-3.1-8b.json" => manifest.display().to_string(),
            other => other.to_string(),
        })
        .collect()
}

#[test]
fn the_init_container_gate_blocks_a_corrupt_cache() {
    let model = PlainModel::new();
    let (_dir, manifest) = testbed::write_temp(&model.manifest_json("v1", true));
    let command = init_container_command(model.root(), &manifest);
    assert_eq!(command[0], "mlnode-agent");
    let run = || {
        Command::cargo_bin("mlnode-agent")
            .unwrap()
            .args(&command[1..])
            .output()
            .unwrap()
            .status
            .code()
    };
    assert_eq!(
        run(),
        Some(0),
        "a verified cache lets the vLLM container start"
    );
    std::fs::write(model.path("model-00002-of-00002.safetensors"), b"truncated").unwrap();
    assert_eq!(run(), Some(1), "a corrupt cache keeps the pod in Init");
    std::fs::write(model.path("stray.bin"), b"x").unwrap();
    std::fs::write(
        model.path("model-00002-of-00002.safetensors"),
        &model.files["model-00002-of-00002.safetensors"],
    )
    .unwrap();
    assert_eq!(
        run(),
        Some(1),
        "--fail-on-extra: an unexpected file fails too"
    );
}

pub(crate) fn validate(objects: &[serde_json::Value]) {
    // One file per object, as JSON (a subset of the YAML kubernetes-validate reads).
    let dir = tempfile::tempdir().unwrap();
    let files: Vec<PathBuf> = objects
        .iter()
        .enumerate()
        .map(|(i, o)| {
            let path = dir.path().join(format!("{i}.json"));
            std::fs::write(&path, o.to_string()).unwrap();
            path
        })
        .collect();
    let output = Command::new("kubernetes-validate")
        .args(["--kubernetes-version", "1.33.0", "--strict", "--no-warn"])
        .args(&files)
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&output.stdout).to_string()
        + &String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && !report.contains("ERROR"),
        "{report}"
    );
}

/// The privilege-minimised container the issue and docs/security.md promise.
pub(crate) fn assert_locked_down(ds: &serde_json::Value) {
    let pod = &ds["spec"]["template"]["spec"];
    for key in ["hostNetwork", "hostPID", "hostIPC"] {
        assert_ne!(pod[key], true, "{key}");
    }
    // UID 0 for the kubelet's root-only socket, with nothing else of root's (docs/security.md).
    assert_eq!(pod["securityContext"]["runAsUser"], 0);
    assert_ne!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    assert_eq!(pod["priorityClassName"], "system-node-critical");
    let containers = pod["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 1);
    let c = &containers[0];
    let sc = &c["securityContext"];
    assert_eq!(sc["runAsUser"], 0, "a fixed UID, the pod's");
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["privileged"], false);
    assert_eq!(sc["capabilities"]["drop"], serde_json::json!(["ALL"]));
    assert!(sc["capabilities"].get("add").is_none());
    assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault");
    assert!(
        c["resources"]["requests"]["cpu"].is_string()
            && c["resources"]["requests"]["memory"].is_string()
            && c["resources"]["limits"]["memory"].is_string()
    );
    let env = c["env"].as_array().unwrap();
    assert!(env
        .iter()
        .any(|e| e["name"] == "NODE_NAME"
            && e["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"));
    assert!(
        c["resources"]["limits"].get("nvidia.com/gpu").is_none(),
        "the agent takes no GPU from the scheduler"
    );
    // hostPath mounts: the model caches and the pod-resources socket directory, read-only; nothing else.
    let host_paths: Vec<(&str, &str)> = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| Some((v["name"].as_str()?, v["hostPath"]["path"].as_str()?)))
        .collect();
    assert_eq!(
        host_paths,
        [
            ("models", "/var/lib/models"),
            ("pod-resources", "/var/lib/kubelet/pod-resources")
        ]
    );
    for mount in c["volumeMounts"].as_array().unwrap() {
        assert_eq!(mount["readOnly"], true, "{mount}");
    }
    assert!(
        !host_paths.iter().any(|(_, p)| p.contains("containerd")
            || p.contains("docker.sock")
            || p.contains("crio")),
        "no container runtime socket"
    );
}

/// The objects kustomize renders, or None where no kustomize is installed (a failure under
/// `CI=true`, see `testbed::needs!`).
fn render(overlay: &str, components: &[&str]) -> Option<Vec<serde_json::Value>> {
    testbed::renderers::kustomize::render_with(overlay, components)
        .map_err(|reason| testbed::missing(&reason))
        .ok()
}

#[test]
fn rendered_overlays_validate_and_are_privilege_minimised() {
    let Some(gpu) = render("overlays/gpu", &[]) else {
        return;
    };
    validate(&gpu);
    let ds = daemonset(&gpu);
    assert_locked_down(ds);
    let pod = &ds["spec"]["template"]["spec"];
    assert!(
        pod.get("runtimeClassName").is_none(),
        "only components/nvidia-runtime-class sets one"
    );
    let env = pod["containers"][0]["env"].as_array().unwrap();
    let var = |name: &str| {
        env.iter()
            .find(|e| e["name"] == name)
            .map(|e| e["value"].clone())
    };
    assert_eq!(var("NVIDIA_VISIBLE_DEVICES"), Some("all".into()));
    assert_eq!(var("NVIDIA_DRIVER_CAPABILITIES"), Some("utility".into()));
    assert!(pod["affinity"]["nodeAffinity"].is_object());
    assert!(gpu.iter().any(|o| o["kind"] == "ValidatingAdmissionPolicy"));
    assert!(
        !gpu.iter().any(|o| o["apiVersion"].as_str().unwrap().starts_with("monitoring.coreos.com/")),
        "a bare cluster's apply: prometheus-operator's kinds only with components/prometheus-operator"
    );
    let Some(operator) = render("overlays/gpu", &["components/prometheus-operator"]) else {
        return;
    };
    assert!(
        operator.iter().any(|o| o["kind"] == "PrometheusRule")
            && operator.iter().any(|o| o["kind"] == "PodMonitor")
    );

    let Some(neuron) = render("overlays/neuron", &[]) else {
        return;
    };
    validate(&neuron);
    assert_locked_down(daemonset(&neuron));
}

#[test]
fn every_component_renders_valid_objects() {
    for components in [
        &["components/startup-taint"][..],
        &["components/nvidia-runtime-class"],
        &["components/prometheus-operator"],
        &[
            "components/prometheus-operator",
            "components/prometheus-release",
        ],
        &[
            "components/prometheus-operator",
            "components/servicemonitor",
            "components/prometheus-release",
        ],
        &["components/non-root"],
        &["components/mig-monitor"],
        &["components/repair-condition"],
        &["components/model-labels"],
        &["components/kernel-log"],
        &["components/soci"],
        &["components/image-pull"],
        &["components/process-attribution"],
    ] {
        let Some(objects) = render("overlays/gpu", components) else {
            return;
        };
        validate(&objects);
        let Some(plain) = render("overlays/gpu", &[]) else {
            return;
        };
        assert_ne!(objects, plain, "{components:?} changes what is rendered");
    }
    // A component that patches the DaemonSet finds it under either overlay's name.
    for component in [
        "components/startup-taint",
        "components/non-root",
        "components/repair-condition",
        "components/model-labels",
        "components/kernel-log",
        "components/soci",
        "components/image-pull",
    ] {
        let (Some(with), Some(without)) = (
            render("overlays/neuron", &[component]),
            render("overlays/neuron", &[]),
        ) else {
            return;
        };
        assert_ne!(
            daemonset(&with)["spec"],
            daemonset(&without)["spec"],
            "{component} patches the Neuron DaemonSet"
        );
    }
    let Some(objects) = render(
        "overlays/gpu",
        &[
            "components/prometheus-operator",
            "components/servicemonitor",
            "components/prometheus-release",
        ],
    ) else {
        return;
    };
    assert!(
        !objects.iter().any(|o| o["kind"] == "PodMonitor"),
        "the ServiceMonitor replaces it"
    );
    for kind in ["ServiceMonitor", "PrometheusRule"] {
        let object = objects.iter().find(|o| o["kind"] == kind).unwrap();
        assert!(
            object["metadata"]["labels"]["release"].is_string(),
            "{kind} selectable by a kube-prometheus-stack release"
        );
    }
    let monitor = objects
        .iter()
        .find(|o| o["kind"] == "ServiceMonitor")
        .unwrap();
    assert_eq!(monitor["spec"]["endpoints"][0]["honorLabels"], true);
}

#[test]
fn the_startup_taint_component_adds_its_rbac_and_setting() {
    let Some(objects) = render("overlays/gpu", &["components/startup-taint"]) else {
        return;
    };
    validate(&objects);
    let role = objects
        .iter()
        .find(|o| {
            o["kind"] == "ClusterRole" && o["metadata"]["name"] == "mlnode-agent-startup-taint"
        })
        .unwrap();
    assert_eq!(role["rules"][0]["verbs"], serde_json::json!(["patch"]));
    let env = daemonset(&objects)["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap()
        .clone();
    assert!(env
        .iter()
        .any(|e| e["name"] == "MLNODE_READINESS__STARTUP_TAINT"
            && e["value"] == "mlnode.dev/not-ready:NoSchedule"));
}

#[test]
fn the_model_labels_component_adds_its_rbac_and_setting() {
    let Some(objects) = render("overlays/gpu", &["components/model-labels"]) else {
        return;
    };
    validate(&objects);
    let role = objects
        .iter()
        .find(|o| {
            o["kind"] == "ClusterRole" && o["metadata"]["name"] == "mlnode-agent-model-labels"
        })
        .unwrap();
    assert_eq!(
        role["rules"],
        serde_json::json!([{"apiGroups": [""], "resources": ["nodes"], "verbs": ["patch"]}])
    );
    let env = &daemonset(&objects)["spec"]["template"]["spec"]["containers"][0]["env"];
    assert!(env
        .as_array()
        .unwrap()
        .contains(&serde_json::json!({"name": "MLNODE_READINESS__MODEL_LABELS", "value": "true"})));
}

#[test]
fn the_shipped_config_is_valid_for_the_agent() {
    let Some(objects) = render("base", &[]) else {
        return;
    };
    let config = objects
        .iter()
        .find(|o| o["kind"] == "ConfigMap" && o["metadata"]["name"] == "mlnode-agent-config")
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("config.yaml"),
        config["data"]["config.yaml"].as_str().unwrap(),
    )
    .unwrap();
    mlnode_agent::config::load(Some(&dir.path().join("config.yaml")), &[])
        .unwrap_or_else(|e| panic!("{e}"));
}

/// A cluster with both GPU and Inferentia/Trainium nodes applies both overlays: each has its own
/// DaemonSet, selecting only its own pods, and every object the two share is the same in both, so
/// the second apply overwrites nothing the first made.
#[test]
fn the_gpu_and_neuron_overlays_share_a_cluster_overwriting_nothing() {
    let (Some(gpu), Some(neuron)) = (render("overlays/gpu", &[]), render("overlays/neuron", &[]))
    else {
        return;
    };
    for object in &gpu {
        if let Some(same) = neuron.iter().find(|o| id(o) == id(object)) {
            assert_eq!(
                same,
                object,
                "{:?} differs between the overlays",
                id(object)
            );
        }
    }
    let (gpu_ds, neuron_ds) = (daemonset(&gpu), daemonset(&neuron));
    assert_ne!(id(gpu_ds), id(neuron_ds));
    let selects = |ds: &serde_json::Value, pod: &serde_json::Value| {
        let wanted = ds["spec"]["selector"]["matchLabels"].as_object().unwrap();
        wanted
            .iter()
            .all(|(k, v)| &pod["spec"]["template"]["metadata"]["labels"][k] == v)
    };
    assert!(selects(gpu_ds, gpu_ds) && selects(neuron_ds, neuron_ds));
    assert!(
        !selects(gpu_ds, neuron_ds) && !selects(neuron_ds, gpu_ds),
        "each DaemonSet selects only its own pods"
    );
}

/// The example FlowSchema matches the agents as deployed: the service account and namespace the
/// rendered DaemonSet runs as, and a priority level the same file defines.
#[test]
fn the_priority_and_fairness_example_matches_the_deployed_service_account() {
    let text =
        std::fs::read_to_string(deploy_dir().join("examples/api-priority-and-fairness.yaml"))
            .unwrap();
    let objects: Vec<serde_json::Value> = serde_saphyr::from_multiple(&text).unwrap();
    let schema = testbed::renderers::kustomize::find(&objects, "FlowSchema", "mlnode-agent");
    let level =
        testbed::renderers::kustomize::find(&objects, "PriorityLevelConfiguration", "mlnode-agent");
    assert_eq!(
        schema["spec"]["priorityLevelConfiguration"]["name"],
        level["metadata"]["name"]
    );
    let rendered = testbed::needs!(testbed::renderers::kustomize::render_with(
        "overlays/gpu",
        &[]
    ));
    let ds = daemonset(&rendered);
    let subject = &schema["spec"]["rules"][0]["subjects"][0]["serviceAccount"];
    assert_eq!(
        subject["name"],
        ds["spec"]["template"]["spec"]["serviceAccountName"]
    );
    assert_eq!(subject["namespace"], ds["metadata"]["namespace"]);
    // Below the built-in `service-accounts` schema (9000), which would match first otherwise, and
    // above the system's own (at most 900).
    let precedence = schema["spec"]["matchingPrecedence"].as_u64().unwrap();
    assert!((901..9000).contains(&precedence), "{precedence}");
}
