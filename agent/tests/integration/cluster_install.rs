//! The shipped objects accepted by a real kube-apiserver (testbed::cluster::control_plane): every overlay and
//! component as kustomize renders it and the chart with every values combination as Helm installs
//! it, server-side applied; the examples (Priority and Fairness, node-readiness-controller's
//! NodeReadinessRule under its own CRD, the vLLM Deployments). Every warning the server gives is
//! one docs/security.md names; the DaemonSet's pod is admitted in a namespace labelled as the README
//! says and refused at `baseline`, with exactly the exceptions docs/security.md lists, as
//! PodSecurity itself reports them.

use std::path::Path;

use mlnode_testbed as testbed;
use serde_json::{json, Value};
use testbed::cluster::control_plane::{self, Install};
use testbed::needs;

/// The reasons PodSecurity gives, as kube-apiserver prints them (k8s.io/pod-security-admission
/// `policy/check_*.go`, each check's `ForbiddenReason`), for the checks docs/security.md's table
/// names.
const HOST_PATH: &str = "hostPath volumes"; // hostPathVolumes
const HOST_NAMESPACES: &str = "host namespaces"; // hostNamespaces
const CAPABILITIES_BASELINE: &str = "non-default capabilities"; // capabilities_baseline
const RESTRICTED_VOLUMES: &str = "restricted volume types"; // restrictedVolumes
const RUN_AS_NON_ROOT: &str = "runAsNonRoot != true"; // runAsNonRoot
const RUN_AS_USER: &str = "runAsUser=0"; // runAsUser
const CAPABILITIES_RESTRICTED: &str = "unrestricted capabilities"; // capabilities_restricted

/// An overlay, the components added, and the reasons its pod fails baseline and restricted for.
type Case = (
    &'static str,
    &'static [&'static str],
    &'static [&'static str],
    &'static [&'static str],
);

const AS_ROOT: &[&str] = &[RESTRICTED_VOLUMES, RUN_AS_NON_ROOT, RUN_AS_USER];

/// Every overlay, and each component in the overlay it is meant for.
const CASES: &[Case] = &[
    ("overlays/gpu", &[], &[HOST_PATH], AS_ROOT),
    ("overlays/neuron", &[], &[HOST_PATH], AS_ROOT),
    (
        "overlays/gpu",
        &[
            "components/startup-taint",
            "components/nvidia-runtime-class",
            "components/prometheus-operator",
            "components/prometheus-release",
        ],
        &[HOST_PATH],
        AS_ROOT,
    ),
    (
        "overlays/gpu",
        &[
            "components/prometheus-operator",
            "components/servicemonitor",
            "components/prometheus-release",
        ],
        &[HOST_PATH],
        AS_ROOT,
    ),
    (
        "overlays/neuron",
        &[
            "components/prometheus-operator",
            "components/servicemonitor",
        ],
        &[HOST_PATH],
        AS_ROOT,
    ),
    (
        "overlays/gpu",
        &["components/non-root"],
        &[HOST_PATH],
        &[RESTRICTED_VOLUMES],
    ),
    (
        "overlays/gpu",
        &["components/mig-monitor"],
        &[CAPABILITIES_BASELINE, HOST_PATH],
        &[
            CAPABILITIES_RESTRICTED,
            RESTRICTED_VOLUMES,
            RUN_AS_NON_ROOT,
            RUN_AS_USER,
        ],
    ),
    (
        "overlays/gpu",
        &["components/repair-condition", "components/model-labels"],
        &[HOST_PATH],
        AS_ROOT,
    ),
    // The journal, read-only, with no capability: baseline's only exception stays hostPath.
    (
        "overlays/gpu",
        &["components/kernel-log"],
        &[HOST_PATH],
        AS_ROOT,
    ),
    // The snapshotter's metrics socket and containerd's content store, read-only, with no
    // capability.
    ("overlays/gpu", &["components/soci"], &[HOST_PATH], AS_ROOT),
    // The host's PID namespace, for NVML's pids: baseline's second exception.
    (
        "overlays/gpu",
        &["components/process-attribution"],
        &[HOST_NAMESPACES, HOST_PATH],
        &[
            HOST_NAMESPACES,
            RESTRICTED_VOLUMES,
            RUN_AS_NON_ROOT,
            RUN_AS_USER,
        ],
    ),
];

/// The reasons of one PodSecurity message (`... violate(s) PodSecurity "level:latest": reason
/// (detail), reason (detail)`), sorted.
fn pod_security_reasons(message: &str, level: &str) -> Vec<String> {
    let marker = format!("PodSecurity \"{level}:latest\": ");
    let Some(at) = message.find(&marker) else {
        return Vec::new();
    };
    let mut reasons = Vec::new();
    let (mut depth, mut current) = (0, String::new());
    for c in message[at + marker.len()..].chars() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                reasons.push(current.trim().to_string());
                current.clear();
                continue;
            }
            '\n' if depth == 0 => break,
            _ => {}
        }
        if depth == 0 && c != ')' {
            current.push(c);
        }
    }
    reasons.push(current.trim().to_string());
    reasons.retain(|r| !r.is_empty());
    reasons.sort();
    reasons
}

fn sorted(reasons: &[&str]) -> Vec<String> {
    let mut reasons: Vec<String> = reasons.iter().map(|r| r.to_string()).collect();
    reasons.sort();
    reasons
}

#[test]
fn every_overlay_and_component_is_accepted_with_only_the_documented_exceptions() {
    let control_plane = needs!(control_plane::shared());
    control_plane.with_crds();
    for (overlay, components, baseline, restricted) in CASES {
        let what = format!("{overlay} + {components:?}");
        let objects = needs!(testbed::renderers::kustomize::render_with(
            overlay, components
        ));
        let install = Install::new(control_plane, &objects);
        let warnings = control_plane
            .apply(&install.objects)
            .unwrap_or_else(|refusal| panic!("{what}: refused: {refusal}"));
        // The one warning: the DaemonSet's pod against the namespace's warn level, restricted.
        assert_eq!(warnings.len(), 1, "{what}: {warnings:?}");
        assert_eq!(
            pod_security_reasons(&warnings[0], "restricted"),
            sorted(restricted),
            "{what}: {warnings:?}"
        );

        // Its pod, as the DaemonSet controller makes it, admitted in the namespace the README
        // labels (enforce privileged)...
        let daemonset = testbed::renderers::kustomize::daemonset(&install.objects);
        // No RuntimeClass that nothing creates, unless asked for.
        let runtime_class = daemonset["spec"]["template"]["spec"]["runtimeClassName"].as_str();
        assert_eq!(
            runtime_class.is_some(),
            components.contains(&"components/nvidia-runtime-class"),
            "{what}: runtimeClassName {runtime_class:?}"
        );
        let node = control_plane.unique("node");
        let pod =
            control_plane::daemonset_pod(daemonset, &node, &control_plane.unique("mlnode-agent"));
        let admit = || {
            let output =
                control_plane.kubectl(&["create", "--dry-run=server", "-f", "-"], &pod.to_string());
            if output.status.success() {
                Ok(())
            } else {
                Err(String::from_utf8_lossy(&output.stderr).into_owned())
            }
        };
        if components.contains(&"components/nvidia-runtime-class") {
            // Refused until whoever installs the handler creates the RuntimeClass, as the
            // component says; then admitted (the RuntimeClass plugin reads it from an informer).
            let refusal = admit().expect_err("admitted without the RuntimeClass");
            assert!(
                refusal.contains("RuntimeClass \"nvidia\" not found"),
                "{what}: {refusal}"
            );
            let runtime_class = json!({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
                "metadata": {"name": "nvidia"}, "handler": "nvidia"});
            control_plane.apply(&[runtime_class]).unwrap();
            testbed::wait_until(&what, std::time::Duration::from_secs(30), admit);
        }
        admit().unwrap_or_else(|refusal| panic!("{what}: {refusal}"));
        // ...and refused where the namespace enforces baseline, for exactly the documented reasons.
        let strict = control_plane.namespace(
            "baseline",
            json!({"pod-security.kubernetes.io/enforce": "baseline"}),
        );
        control_plane.admin(
            &["create", "serviceaccount", "mlnode-agent", "-n", &strict],
            "",
        );
        let mut there = pod.clone();
        there["metadata"]["namespace"] = json!(strict);
        let refused = control_plane.kubectl(
            &["create", "--dry-run=server", "-f", "-"],
            &there.to_string(),
        );
        assert!(!refused.status.success(), "{what}: admitted at baseline");
        let refusal = String::from_utf8_lossy(&refused.stderr);
        assert_eq!(
            pod_security_reasons(&refusal, "baseline"),
            sorted(baseline),
            "{what}: {refusal}"
        );
    }
}

/// The chart installed as README says (`helm install` into a namespace labelled for Pod Security
/// `privileged`), then upgraded through every values combination the chart's tests render: each
/// accepted by the server.
#[test]
fn the_chart_installs_and_upgrades_through_every_values_combination() {
    let control_plane = needs!(control_plane::shared());
    control_plane.with_crds();
    let namespace = control_plane.unique("mlnode-helm");
    control_plane.create(&control_plane::readme_namespace(&namespace));
    let chart = testbed::renderers::helm::chart_dir();
    let values_dir = tempfile::tempdir().unwrap();
    for values in [
        "",
        "startupTaint: {enabled: true}",
        "prometheus: {release: kube-prometheus-stack}",
        "podMonitor: {enabled: false}\nserviceMonitor: {enabled: true}\nprometheus: {release: kube-prometheus-stack}",
        "podMonitor: {enabled: false}\nprometheusRule: {enabled: false}",
        "runtimeClassName: nvidia",
        "nonRoot: {enabled: true}",
        "migMonitor: {enabled: true}",
        "repairCondition: {enabled: true}\nmodelLabels: {enabled: true}",
        "kernelLog: {enabled: true}",
        "processAttribution: {enabled: true}",
        "dashboards: {enabled: true}",
        "gpu: {enabled: false}",
    ] {
        let file = values_dir.path().join("values.yaml");
        std::fs::write(&file, values).unwrap();
        let output = needs!(testbed::renderers::helm::helm(&[
            "upgrade",
            "--install",
            "mlnode-agent",
            chart.to_str().unwrap(),
            "--kubeconfig",
            control_plane.kubeconfig().to_str().unwrap(),
            "--namespace",
            &namespace,
            "--values",
            file.to_str().unwrap(),
            "--wait=hookOnly",
        ]));
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success(),
            "helm upgrade --install with {values:?}: {stderr}"
        );
        // Helm logs each warning the server gives: only PodSecurity's at the namespace's warn level
        // (restricted), which docs/security.md explains.
        let warnings: Vec<&str> = stderr
            .lines()
            .filter_map(|line| line.split_once("Warning: ").map(|(_, warning)| warning))
            .collect();
        for warning in &warnings {
            assert!(
                warning.contains("would violate PodSecurity") && warning.contains("restricted:latest"),
                "{values:?}: a warning docs/security.md does not explain: {warning}"
            );
        }
        if values.is_empty() {
            // This server serves prometheus-operator's API (its CRDs above): `auto` installs the
            // PodMonitor and the rules. (A server without them: readme_install.rs.)
            for kind in ["podmonitors", "prometheusrules"] {
                let found = control_plane.get(&[kind, "-n", &namespace]);
                assert_eq!(
                    found["items"].as_array().map(Vec::len),
                    Some(1),
                    "{kind} where the cluster serves monitoring.coreos.com/v1: {found}"
                );
            }
        }
    }
    // The last release runs the Neuron DaemonSet alone: Helm removed the GPU one.
    let daemonsets = control_plane.get(&["daemonsets", "-n", &namespace]);
    let names: Vec<&str> = daemonsets["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["mlnode-agent-neuron"]);
}

fn example(name: &str) -> Vec<Value> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/examples")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap();
    serde_saphyr::from_multiple::<Value>(&text)
        .unwrap()
        .into_iter()
        .filter(|v| !v.is_null())
        .collect()
}

/// The examples, each accepted as users apply it: the agents' FlowSchema and
/// PriorityLevelConfiguration, the vLLM Deployments in their `inference` namespace.
#[test]
fn the_examples_are_accepted() {
    let control_plane = needs!(control_plane::shared());
    let priority = example("api-priority-and-fairness.yaml");
    assert_eq!(control_plane.apply(&priority), Ok(vec![]));
    let flow_schema = control_plane.get(&["flowschema", "mlnode-agent"]);
    let dangling = flow_schema["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "Dangling");
    assert_ne!(
        dangling.map(|c| c["status"].clone()),
        Some(json!("True")),
        "the FlowSchema names a priority level that exists: {flow_schema:#}"
    );
    if control_plane
        .kubectl(&["get", "namespace", "inference"], "")
        .status
        .success()
    {
        // Another run of this test created it: applying again is what users do too.
    } else {
        control_plane.admin(&["create", "namespace", "inference"], "");
        control_plane.admin(
            &["create", "serviceaccount", "default", "-n", "inference"],
            "",
        );
    }
    for file in [
        "vllm-with-model-gate.yaml",
        "vllm-single-gpu-replicas.yaml",
        "vllm-with-verified-cache.yaml",
        "vllm-with-verified-download.yaml",
    ] {
        assert_eq!(control_plane.apply(&example(file)), Ok(vec![]), "{file}");
    }
}

/// deploy/examples/node-readiness-rule.yaml under node-readiness-controller's own CRD: accepted;
/// the same rule broken each way the CRD's schema and CEL rules forbid is refused by the server
/// with the CRD's message (upstream's own example, problem-gate-rule.yaml, as the control).
#[test]
fn the_node_readiness_rule_example_is_valid_for_node_readiness_controller() {
    let control_plane = needs!(control_plane::shared());
    control_plane.with_crds();
    let rule = example("node-readiness-rule.yaml").remove(0);
    let fixtures =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/node-readiness-controller");
    let control: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(fixtures.join("problem-gate-rule.yaml")).unwrap(),
    )
    .unwrap();
    let dry_run = |object: &Value| {
        // Under a name of its own: a create, as a new rule is, not an update of the applied one.
        let mut object = object.clone();
        object["metadata"]["name"] = json!(control_plane.unique("rule"));
        let output = control_plane.kubectl(
            &["create", "--dry-run=server", "-f", "-"],
            &object.to_string(),
        );
        if output.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&output.stderr).into_owned())
        }
    };
    assert_eq!(dry_run(&control), Ok(()));
    assert_eq!(control_plane.apply(std::slice::from_ref(&rule)), Ok(vec![]));
    for (field, value, says) in [
        (
            "/spec/taint/key",
            json!("readiness.k8s.io/example.com/mlnode"),
            "exactly one '/'",
        ),
        (
            "/spec/taint/key",
            json!("mlnode.dev/not-ready"),
            "readiness.k8s.io/",
        ),
        (
            "/spec/taint/effect",
            json!("Sometimes"),
            "taint effect must be one of",
        ),
        (
            "/spec/enforcementMode",
            json!("always"),
            "Unsupported value: \"always\"",
        ),
        (
            "/spec/conditions",
            json!([]),
            "should have at least 1 items",
        ),
        (
            "/spec/conditions/0/requiredStatus",
            json!(true),
            "must be of type string",
        ),
    ] {
        let mut broken = rule.clone();
        *broken.pointer_mut(field).unwrap() = value;
        let refusal = dry_run(&broken).expect_err(field);
        assert!(refusal.contains(says), "{field}: {refusal}");
    }
    let mut unknown = rule.clone();
    unknown["spec"]["taints"] = json!([]);
    let refusal = dry_run(&unknown).expect_err("an unknown field");
    assert!(
        refusal.contains("unknown field \"spec.taints\""),
        "{refusal}"
    );
}

/// Karpenter's own CRDs, NodePool and EC2NodeClass, from the modules tests/programs/karpenter-repair pins
/// (its go.mod), as Go's module cache holds them once scripts/test.sh has built that program. The
/// AWS provider's copies, which carry its validation of AWS's labels, where it ships them.
fn karpenter_crds() -> Result<Vec<std::path::PathBuf>, String> {
    let repair = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/programs/karpenter-repair");
    let go_mod = std::fs::read_to_string(repair.join("go.mod")).unwrap();
    let version = |module: &str| {
        go_mod
            .lines()
            .find_map(|l| l.trim().strip_prefix(&format!("{module} ")))
            .map(|v| v.split_whitespace().next().unwrap().to_string())
            .unwrap_or_else(|| {
                panic!("tests/programs/karpenter-repair/go.mod requires no {module}")
            })
    };
    let cache = std::process::Command::new("go")
        .args(["env", "GOMODCACHE"])
        .output()
        .map_err(|e| format!("go is needed to find Karpenter's CRDs in its module cache ({e})"))?;
    let cache = std::path::PathBuf::from(String::from_utf8(cache.stdout).unwrap().trim());
    let core = cache.join(format!(
        "sigs.k8s.io/karpenter@{}/pkg/apis/crds",
        version("sigs.k8s.io/karpenter")
    ));
    let aws = cache.join(format!(
        "github.com/aws/karpenter-provider-aws@{}/pkg/apis/crds",
        version("github.com/aws/karpenter-provider-aws")
    ));
    let nodepools = [
        aws.join("karpenter.sh_nodepools.yaml"),
        core.join("karpenter.sh_nodepools.yaml"),
    ]
    .into_iter()
    .find(|p| p.is_file());
    let classes = aws.join("karpenter.k8s.aws_ec2nodeclasses.yaml");
    match nodepools {
        Some(nodepools) if classes.is_file() => Ok(vec![nodepools, classes]),
        _ => Err(format!(
            "Karpenter's CRDs are not in Go's module cache ({} and {}): scripts/test.sh downloads them building tests/programs/karpenter-repair",
            core.display(),
            aws.display()
        )),
    }
}

/// deploy/examples/karpenter-nodepool.yaml under Karpenter 1.15's own CRDs: accepted without a
/// warning; its startup taint is the agent's; and the same NodePool with a budget schedule but no
/// duration, or without a node class, refused by the CRD's own rules.
#[test]
fn the_karpenter_example_is_valid_for_karpenters_crds() {
    let control_plane = needs!(control_plane::shared());
    let crds = needs!(karpenter_crds());
    for crd in &crds {
        control_plane.admin(&["apply", "--server-side", "-f", crd.to_str().unwrap()], "");
    }
    control_plane.admin(
        &[
            "wait",
            "--for=condition=Established",
            "--timeout=120s",
            "crd/nodepools.karpenter.sh",
            "crd/ec2nodeclasses.karpenter.k8s.aws",
        ],
        "",
    );
    let objects = example("karpenter-nodepool.yaml");
    assert_eq!(control_plane.apply(&objects), Ok(vec![]));
    let pool = objects.iter().find(|o| o["kind"] == "NodePool").unwrap();
    let taint = &pool["spec"]["template"]["spec"]["startupTaints"][0];
    let shipped =
        testbed::renderers::kustomize::render_with("overlays/gpu", &["components/startup-taint"]);
    let shipped = needs!(shipped);
    let env = &testbed::renderers::kustomize::daemonset(&shipped)["spec"]["template"]["spec"]
        ["containers"][0]["env"];
    let agent_taint = env
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "MLNODE_READINESS__STARTUP_TAINT")
        .unwrap()["value"]
        .clone();
    assert_eq!(
        json!(format!(
            "{}:{}",
            taint["key"].as_str().unwrap(),
            taint["effect"].as_str().unwrap()
        )),
        agent_taint,
        "the NodePool registers nodes with the taint the agent removes"
    );
    let refused = |change: &dyn Fn(&mut Value), says: &str| {
        let mut broken = pool.clone();
        broken["metadata"]["name"] = json!(control_plane.unique("pool"));
        change(&mut broken);
        let output = control_plane.kubectl(
            &["create", "--dry-run=server", "-f", "-"],
            &broken.to_string(),
        );
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            !output.status.success() && stderr.contains(says),
            "{says}: {stderr}"
        );
    };
    refused(
        &|p| {
            p["spec"]["disruption"]["budgets"][0]
                .as_object_mut()
                .unwrap()
                .remove("duration");
        },
        "'schedule' must be set with 'duration'",
    );
    refused(
        &|p| {
            p["spec"]["template"]["spec"]
                .as_object_mut()
                .unwrap()
                .remove("nodeClassRef");
        },
        "nodeClassRef",
    );
}
