//! The Helm chart (deploy/helm/mlnode-agent) as Helm 4 renders it, against what kustomize renders:
//! by default the objects of overlays/gpu and overlays/neuron together, object by object; each
//! component's value the objects of that component; the files the two share copied, never kept
//! twice by hand; and values that are wrong refused by Helm, naming the key.

use std::collections::BTreeMap;
use std::path::Path;

use mlnode_testbed as testbed;
use serde_json::{json, Value};
use testbed::renderers::helm::{chart_dir, helm};
use testbed::renderers::kustomize::{self, deploy_dir, id};

type Id = (String, String, String);

/// An object as both must agree on it: without the labels Helm adds (kustomize's are checked to
/// be among them), the pull policy Helm sets, the agent's config parsed, not as text, and PromQL
/// compared token by token.
fn comparable(o: &Value) -> Value {
    let mut o = o.clone();
    let labels = o["metadata"]["labels"].take();
    if let Some(release) = labels.get("release") {
        o["metadata"]["labels"] = json!({"release": release});
    } else {
        o["metadata"].as_object_mut().unwrap().remove("labels");
    }
    if o["kind"] == "DaemonSet" {
        let container = &mut o["spec"]["template"]["spec"]["containers"][0];
        container.as_object_mut().unwrap().remove("imagePullPolicy");
    }
    // kustomize re-emits a folded PromQL block with an extra line break before a more-indented
    // line, Helm without; PromQL reads any run of spaces and line breaks alike.
    if o["kind"] == "PrometheusRule" {
        for group in o["spec"]["groups"].as_array_mut().unwrap() {
            for rule in group["rules"].as_array_mut().unwrap() {
                let expr = rule["expr"]
                    .as_str()
                    .unwrap()
                    .split_whitespace()
                    .collect::<Vec<_>>();
                rule["expr"] = expr.join(" ").into();
            }
        }
    }
    if o["kind"] == "ConfigMap" && o["metadata"]["name"] == "mlnode-agent-config" {
        let text = o["data"]["config.yaml"].as_str().unwrap().to_string();
        o["data"]["config.yaml"] = serde_saphyr::from_str::<Value>(&text).unwrap();
    }
    o
}

/// Both overlays, each with `components` (the GPU-only ones on overlays/gpu alone), as one
/// cluster has them.
fn kustomize_cluster(components: &[&str]) -> Result<BTreeMap<Id, Value>, String> {
    let gpu_only = [
        "components/nvidia-runtime-class",
        "components/mig-monitor",
        "components/process-attribution",
    ];
    let neuron_components: Vec<&str> = components
        .iter()
        .copied()
        .filter(|c| !gpu_only.contains(c))
        .collect();
    let mut objects = BTreeMap::new();
    for object in kustomize::render_with("overlays/gpu", components)?
        .into_iter()
        .chain(kustomize::render_with(
            "overlays/neuron",
            &neuron_components,
        )?)
    {
        if object["kind"] != "Namespace" {
            objects.insert(id(&object), object);
        }
    }
    Ok(objects)
}

fn chart(values: &str) -> Result<BTreeMap<Id, Value>, String> {
    chart_on(values, &[])
}

/// [`chart`] for a cluster that serves `api_versions` besides Kubernetes' own.
fn chart_on(values: &str, api_versions: &[&str]) -> Result<BTreeMap<Id, Value>, String> {
    let args: Vec<&str> = api_versions
        .iter()
        .flat_map(|v| ["--api-versions", v])
        .collect();
    let objects = testbed::renderers::helm::render_with_args(values, &args)?
        .unwrap_or_else(|refused| panic!("helm template refused {values:?}: {refused}"));
    Ok(objects.into_iter().map(|o| (id(&o), o)).collect())
}

fn assert_same(values: &str, kustomized: &BTreeMap<Id, Value>, charted: &BTreeMap<Id, Value>) {
    let (ours, theirs): (Vec<&Id>, Vec<&Id>) =
        (kustomized.keys().collect(), charted.keys().collect());
    assert_eq!(
        ours, theirs,
        "{values:?}: the kinds and names of the objects"
    );
    for (id, kustomized) in kustomized {
        let charted = &charted[id];
        assert_eq!(
            comparable(kustomized),
            comparable(charted),
            "{values:?}: {id:?} as kustomize renders it (left) and as the chart does (right)"
        );
        for (key, value) in kustomized["metadata"]["labels"]
            .as_object()
            .into_iter()
            .flatten()
        {
            assert_eq!(
                &charted["metadata"]["labels"][key], value,
                "{values:?}: {id:?} label {key}"
            );
        }
    }
}

/// By default the chart installs what both overlays install (the Namespace aside: Helm installs
/// into one, README labels it), and every component is a value that gives what it gives.
#[test]
fn the_chart_renders_what_kustomize_renders_default_and_component_by_component() {
    const OPERATOR: &str = "components/prometheus-operator";
    const FORCED: &str = "podMonitor: {enabled: true}\nprometheusRule: {enabled: true}\n";
    for (values, components) in [
        ("", &[][..]),
        ("startupTaint: {enabled: true}", &["components/startup-taint"]),
        (FORCED, &[OPERATOR]),
        (
            &format!("{FORCED}prometheus: {{release: kube-prometheus-stack}}"),
            &[OPERATOR, "components/prometheus-release"],
        ),
        (
            "podMonitor: {enabled: false}\nprometheusRule: {enabled: true}\nserviceMonitor: {enabled: true}",
            &[OPERATOR, "components/servicemonitor"],
        ),
        (
            "prometheusRule: {enabled: true}\nserviceMonitor: {enabled: true}\nprometheus: {release: kube-prometheus-stack}",
            &[OPERATOR, "components/servicemonitor", "components/prometheus-release"],
        ),
        ("runtimeClassName: nvidia", &["components/nvidia-runtime-class"]),
        ("nonRoot: {enabled: true}", &["components/non-root"]),
        ("migMonitor: {enabled: true}", &["components/mig-monitor"]),
        ("repairCondition: {enabled: true}", &["components/repair-condition"]),
        ("modelLabels: {enabled: true}", &["components/model-labels"]),
        ("kernelLog: {enabled: true}", &["components/kernel-log"]),
        ("soci: {enabled: true}", &["components/soci"]),
        ("imagePullSplit: {enabled: true}", &["components/image-pull"]),
        (
            "processAttribution: {enabled: true}",
            &["components/process-attribution"],
        ),
    ] {
        let kustomized = testbed::needs!(kustomize_cluster(components));
        let charted = testbed::needs!(chart(values));
        assert_same(values, &kustomized, &charted);
    }
    // On a cluster that serves prometheus-operator's API, `auto` installs its objects; on one
    // that does not (`helm template` sees none), nothing of it.
    let kustomized = testbed::needs!(kustomize_cluster(&[OPERATOR]));
    let charted = testbed::needs!(chart_on("", &["monitoring.coreos.com/v1"]));
    assert_same("auto, served", &kustomized, &charted);
    let bare = testbed::needs!(chart(""));
    assert!(
        !bare
            .keys()
            .any(|(kind, _, _)| kind.contains("Monitor") || kind == "PrometheusRule"),
        "a bare cluster gets no prometheus-operator object: {:?}",
        bare.keys()
    );
}

/// A startup taint of the user's own: the admission policy allows its key, in the chart as in
/// the kustomize component (whose one value the policy's replacement copies).
#[test]
fn a_custom_startup_taint_is_the_one_the_admission_policy_allows() {
    let taint = "example.com/gpu-warming=true:NoSchedule";
    let charted = testbed::needs!(chart(&format!(
        "startupTaint: {{enabled: true, taint: \"{taint}\"}}"
    )));
    let policy = &charted[&(
        "ValidatingAdmissionPolicy".into(),
        String::new(),
        "mlnode-agent-own-node".into(),
    )];
    assert_eq!(
        startup_taint_variable(policy),
        format!("'{taint}'"),
        "{policy}"
    );
    // The component as its comment says to change it: its one value, nothing else.
    let component = deploy_dir().join("daemonset/components/startup-taint");
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let copy = dir.path().join("startup-taint");
    std::fs::create_dir(&copy).unwrap();
    for file in ["kustomization.yaml", "rbac.yaml"] {
        let text = std::fs::read_to_string(component.join(file)).unwrap();
        let edited = text.replace("mlnode.dev/not-ready:NoSchedule", taint);
        std::fs::write(copy.join(file), edited).unwrap();
    }
    let overlay =
        kustomize::relative_path(dir.path(), &deploy_dir().join("daemonset/overlays/gpu"));
    std::fs::write(
        dir.path().join("kustomization.yaml"),
        format!("resources: [{overlay}]\ncomponents: [./startup-taint]\n"),
    )
    .unwrap();
    let objects = testbed::needs!(kustomize::render(dir.path()));
    let policy = objects
        .iter()
        .find(|o| {
            o["kind"] == "ValidatingAdmissionPolicy"
                && o["metadata"]["name"] == "mlnode-agent-own-node"
        })
        .unwrap();
    assert_eq!(startup_taint_variable(policy), format!("'{taint}'"));
    let env = &kustomize::daemonset(&objects)["spec"]["template"]["spec"]["containers"][0]["env"];
    assert!(
        env.as_array()
            .unwrap()
            .iter()
            .any(|e| e["name"] == "MLNODE_READINESS__STARTUP_TAINT" && e["value"] == taint),
        "{env}"
    );
}

fn startup_taint_variable(policy: &Value) -> String {
    policy["spec"]["variables"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "startupTaint")
        .unwrap()["expression"]
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn the_rendered_chart_validates_and_is_privilege_minimised() {
    let charted = testbed::needs!(chart(""));
    let objects: Vec<Value> = charted.into_values().collect();
    crate::deploy::validate(&objects);
    let daemonsets: Vec<&Value> = objects
        .iter()
        .filter(|o| o["kind"] == "DaemonSet")
        .collect();
    assert_eq!(
        daemonsets.len(),
        2,
        "one for GPU nodes, one for Neuron nodes"
    );
    for ds in daemonsets {
        crate::deploy::assert_locked_down(ds);
    }
}

/// What Helm reads from the chart and kustomize from deploy/daemonset is one text: the chart holds
/// copies scripts/sync_chart_files.sh writes, and a copy that differs fails here.
#[test]
fn the_chart_holds_exact_copies_of_what_it_shares_with_kustomize() {
    let files = chart_dir().join("files");
    let base = deploy_dir().join("daemonset");
    let mut pairs: Vec<(std::path::PathBuf, std::path::PathBuf)> = [
        "base/config.yaml",
        "base/daemonset.yaml",
        "components/prometheus-operator/podmonitor.yaml",
        "components/prometheus-operator/prometheusrule.yaml",
        "base/rbac.yaml",
        "base/validating-admission-policy.yaml",
    ]
    .iter()
    .map(|f| {
        let name = Path::new(f).file_name().unwrap();
        (base.join(f), files.join("base").join(name))
    })
    .collect();
    pairs.push((
        base.join("components/startup-taint/rbac.yaml"),
        files.join("base/startup-taint-rbac.yaml"),
    ));
    pairs.push((
        base.join("components/model-labels/rbac.yaml"),
        files.join("base/model-labels-rbac.yaml"),
    ));
    pairs.push((
        base.join("components/servicemonitor/service.yaml"),
        files.join("base/servicemonitor.yaml"),
    ));
    let dashboards = deploy_dir().join("../dashboards");
    for entry in std::fs::read_dir(&dashboards).unwrap() {
        let source = entry.unwrap().path();
        pairs.push((
            source.clone(),
            files.join("dashboards").join(source.file_name().unwrap()),
        ));
    }
    let copies = std::fs::read_dir(files.join("dashboards")).unwrap().count()
        + std::fs::read_dir(files.join("base")).unwrap().count();
    assert_eq!(
        copies,
        pairs.len(),
        "the chart holds a file kustomize does not: run scripts/sync_chart_files.sh"
    );
    for (source, copy) in pairs {
        let read = |p: &Path| std::fs::read(p).unwrap_or_default();
        assert!(
            read(&source) == read(&copy),
            "{} differs from {}: run scripts/sync_chart_files.sh",
            copy.display(),
            source.display()
        );
    }
}

#[test]
fn the_chart_lints_packages_and_carries_the_agents_version() {
    let chart = chart_dir();
    let chart_path = chart.to_str().unwrap();
    let lint = testbed::needs!(helm(&["lint", "--strict", chart_path]));
    assert!(
        lint.status.success(),
        "{}",
        String::from_utf8_lossy(&lint.stdout)
    );
    let dir = tempfile::tempdir().unwrap();
    let package = testbed::needs!(helm(&[
        "package",
        chart_path,
        "-d",
        dir.path().to_str().unwrap()
    ]));
    assert!(
        package.status.success(),
        "{}",
        String::from_utf8_lossy(&package.stderr)
    );
    assert!(dir
        .path()
        .join(format!("mlnode-agent-{}.tgz", "0.1.0"))
        .exists());
    let meta: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(chart.join("Chart.yaml")).unwrap())
            .unwrap();
    assert_eq!(meta["apiVersion"], "v2");
    assert_eq!(
        meta["appVersion"],
        env!("CARGO_PKG_VERSION"),
        "appVersion is the agent's version"
    );
    assert!(meta["kubeVersion"].is_string());
}

/// A values file that is wrong never renders a pod that crash-loops: Helm refuses it, naming the
/// key and the reason.
#[test]
fn wrong_values_are_refused_naming_the_key() {
    for (values, says) in [
        ("bogus: 1", "additional properties 'bogus' not allowed"),
        ("gpu: {enabled: maybe}", "/gpu/enabled"),
        ("config: {verfy: {threads: 4}}", "'verfy' not allowed"),
        (
            "startupTaint: {enabled: true, taint: no-effect}",
            "/startupTaint/taint",
        ),
        (
            "modelManifests: {llama.json: '{\"revision\": '}",
            "modelManifests.llama.json: not a JSON manifest",
        ),
        (
            "gpu: {enabled: false}\nneuron: {enabled: false}",
            "would install no agent",
        ),
    ] {
        let refused = testbed::needs!(testbed::renderers::helm::render(values))
            .expect_err(&format!("helm template accepted {values:?}"));
        assert!(refused.contains(says), "{values:?}: {refused}");
    }
}

/// `config` is merged over the default config, `models` replaced whole; `modelManifests` replaces
/// the example manifest; the image, pull secrets and the pod's extras land in both DaemonSets.
#[test]
fn values_users_expect_of_a_chart_land_where_they_belong() {
    let values = r#"
image: {repository: registry.example.com/mlnode-agent, tag: "9.9.9", pullPolicy: Always}
imagePullSecrets: [{name: registry}]
config:
  models: [{name: qwen, root: /models/qwen, manifest: /etc/mlnode/manifests/qwen.json}]
  verify: {threads: 4}
modelManifests: {qwen.json: '{"revision": "r1", "files": {}}'}
podLabels: {team: inference}
podAnnotations: {example.com/scrape: "false"}
extraEnv: [{name: MLNODE_VERIFY__DEBOUNCE, value: 1s}]
nodeSelector: {pool: inference}
modelsHostPath: /mnt/nvme/models
"#;
    let charted = testbed::needs!(chart(values));
    let config = &charted[&(
        "ConfigMap".into(),
        "mlnode-system".into(),
        "mlnode-agent-config".into(),
    )];
    let text = config["data"]["config.yaml"].as_str().unwrap();
    let config: Value = serde_saphyr::from_str(text).unwrap();
    // The merged config is one the agent starts with.
    let (_dir, file) = testbed::write_temp(text);
    let loaded = mlnode_agent::config::load(Some(&file), &[]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(*loaded.verify.threads, 4);
    assert_eq!(config["models"].as_array().unwrap().len(), 1);
    assert_eq!(config["models"][0]["name"], "qwen");
    assert_eq!(config["verify"]["threads"], 4);
    assert_eq!(
        config["verify"]["full_rescan_interval"], "24h",
        "the default stays beneath"
    );
    assert_eq!(config["log_format"], "json");
    let manifests = &charted[&(
        "ConfigMap".into(),
        "mlnode-system".into(),
        "mlnode-model-manifests".into(),
    )];
    assert_eq!(manifests["data"].as_object().unwrap().len(), 1);
    for kind in ["gpu", "neuron"] {
        let ds = &charted[&(
            "DaemonSet".into(),
            "mlnode-system".into(),
            format!("mlnode-agent-{kind}"),
        )];
        let pod = &ds["spec"]["template"];
        let container = &pod["spec"]["containers"][0];
        assert_eq!(
            container["image"],
            "registry.example.com/mlnode-agent:9.9.9"
        );
        assert_eq!(container["imagePullPolicy"], "Always");
        assert_eq!(pod["spec"]["imagePullSecrets"][0]["name"], "registry");
        assert_eq!(pod["metadata"]["labels"]["team"], "inference");
        assert_eq!(
            pod["metadata"]["labels"]["app.kubernetes.io/component"],
            kind
        );
        assert_eq!(
            pod["metadata"]["annotations"]["example.com/scrape"],
            "false"
        );
        assert_eq!(pod["spec"]["nodeSelector"]["pool"], "inference");
        let models = pod["spec"]["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == "models")
            .unwrap();
        assert_eq!(models["hostPath"]["path"], "/mnt/nvme/models");
        let env = container["env"].as_array().unwrap();
        assert_eq!(env.last().unwrap()["name"], "MLNODE_VERIFY__DEBOUNCE");
    }
}

/// kube-prometheus-stack's Grafana sidecar loads every ConfigMap labelled `grafana_dashboard: "1"`:
/// each dashboard of dashboards/ is one, unchanged, with the label and namespace configurable.
#[test]
fn dashboards_are_configmaps_grafanas_sidecar_loads() {
    let none = testbed::needs!(chart(""));
    assert!(!none
        .keys()
        .any(|(_, _, name)| name.starts_with("mlnode-agent-dashboard-")));
    let charted = testbed::needs!(chart(
        "dashboards: {enabled: true, label: grafana_dashboard, labelValue: \"1\", namespace: monitoring}"
    ));
    let dashboards = deploy_dir().join("../dashboards");
    let mut found = 0;
    for entry in std::fs::read_dir(&dashboards).unwrap() {
        let path = entry.unwrap().path();
        let file = path.file_name().unwrap().to_str().unwrap().to_string();
        let name = format!("mlnode-agent-dashboard-{}", file.trim_end_matches(".json"));
        let map = &charted[&("ConfigMap".into(), "monitoring".into(), name)];
        assert_eq!(map["metadata"]["labels"]["grafana_dashboard"], "1");
        assert_eq!(
            map["data"][&file].as_str().unwrap(),
            std::fs::read_to_string(&path).unwrap(),
            "{file} as it is in dashboards/"
        );
        found += 1;
    }
    assert_eq!(found, 3);
}

/// The chart's `config` takes what the agent takes: its schema is the agent's own (written by
/// scripts/sync_chart_files.sh from `mlnode-agent config --schema`), the agent's whole effective
/// configuration is accepted as `config`, and a misspelt key anywhere in it is refused, named.
#[test]
fn the_charts_config_is_the_agents_configuration_whole() {
    let schema = assert_cmd::Command::cargo_bin("mlnode-agent")
        .unwrap()
        .args(["config", "--schema"])
        .output()
        .unwrap();
    assert!(schema.status.success(), "{schema:?}");
    let generated: Value = serde_json::from_slice(&schema.stdout).unwrap();
    let values_schema: Value = serde_json::from_str(
        &std::fs::read_to_string(chart_dir().join("values.schema.json")).unwrap(),
    )
    .unwrap();
    assert!(
        values_schema["properties"]["config"] == generated,
        "values.schema.json's config differs from `mlnode-agent config --schema`: run scripts/sync_chart_files.sh"
    );

    // Everything `mlnode-agent config` prints, as a user would paste it under `config:`.
    let effective = assert_cmd::Command::cargo_bin("mlnode-agent")
        .unwrap()
        .args(["config", "--set", "rdma.expected_efa_devices=32", "--set"])
        .arg("models=[{name: llama, root: /models/llama, manifest: /etc/mlnode/manifests/llama.json, public_key: /etc/mlnode/keys/signer.pub}]")
        .env_remove("NODE_NAME")
        .output()
        .unwrap();
    assert!(effective.status.success(), "{effective:?}");
    let config: Value =
        serde_saphyr::from_str(&String::from_utf8(effective.stdout).unwrap()).unwrap();
    for section in [
        "rdma",
        "kernel_log",
        "hostname_label",
        "start_jitter",
        "api_request_timeout",
    ] {
        assert!(config.get(section).is_some(), "{section} in {config}");
    }
    let values = json!({"config": config}).to_string();
    let charted = testbed::needs!(chart(&values));
    let map = &charted[&(
        "ConfigMap".into(),
        "mlnode-system".into(),
        "mlnode-agent-config".into(),
    )];
    let text = map["data"]["config.yaml"].as_str().unwrap();
    let (_dir, file) = testbed::write_temp(text);
    let loaded = mlnode_agent::config::load(Some(&file), &[]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(loaded.rdma.expected_efa_devices, 32);

    for (values, says) in [
        ("config: {verify: {thraeds: 4}}", "'thraeds' not allowed"),
        (
            "config: {rdma: {expected_efa_device: 4}}",
            "'expected_efa_device' not allowed",
        ),
        (
            "config: {models: [{name: a, root: /models/a, manifest: /m/a.json, public_kee: /k}]}",
            "'public_kee' not allowed",
        ),
        (
            "config: {verify: {trust_unchanged_after_restart: 4}}",
            "/config/verify/trust_unchanged_after_restart",
        ),
        ("config: {log_format: [json]}", "/config/log_format"),
    ] {
        let refused = testbed::needs!(testbed::renderers::helm::render(values))
            .expect_err(&format!("helm template accepted {values:?}"));
        assert!(refused.contains(says), "{values:?}: {refused}");
    }
}
