//! The chart's GPU DaemonSet installed by Helm, as the README installs it.

use super::*;

#[test]
fn the_charts_gpu_daemonset_installed_by_helm_runs_on_the_real_node() {
    let cluster = testbed::needs!(testbed::node::one_node_cluster::shared());
    testbed::needs!(testbed::renderers::helm::helm(&["version"]).map(|_| ()));
    let mut node = cluster.exclusive();
    let values = cluster.runtime.dir().join("chart-values.json");
    // Removed by Helm, the way it was installed; also by the next test should this one fail.
    node.install(
        "the chart",
        |cluster| {
            held_until_the_agent_lifts_its_startup_taint(cluster, "charted", &[], |manifest| {
                // As the README installs the chart, into a namespace labelled privileged, with the
                // values a cluster without the Prometheus Operator and with the NVIDIA handler sets.
                let image = cluster.agent_image();
                let (repository, digest) = image.split_once('@').unwrap();
                std::fs::write(
                    &values,
                    json!({
                        "image": {"repository": repository, "tag": format!("test@{digest}")},
                        "modelManifests": {"llama-3.1-8b.json": manifest},
                        "config": {"models": [{
                            "name": "llama-3.1-8b",
                            "root": "/models/llama-3.1-8b",
                            "manifest": "/etc/mlnode/manifests/llama-3.1-8b.json",
                        }]},
                        "startupTaint": {"enabled": true},
                        "runtimeClassName": "nvidia",
                        "podMonitor": {"enabled": false},
                        "prometheusRule": {"enabled": false},
                    })
                    .to_string(),
                )
                .unwrap();
                helm(
                    cluster,
                    &[
                        "install",
                        "mlnode-agent",
                        &chart(),
                        "--namespace",
                        "mlnode-system",
                        "--create-namespace",
                        "-f",
                        values.to_str().unwrap(),
                    ],
                );
                cluster.admin.admin(
                    &[
                        "label",
                        "namespace",
                        "mlnode-system",
                        "pod-security.kubernetes.io/enforce=privileged",
                        "--overwrite",
                    ],
                    "",
                );
            })
        },
        uninstall_chart,
    );
    node.remove();
}

fn uninstall_chart(cluster: &OneNodeCluster) {
    let uninstalled = testbed::renderers::helm::helm(&[
        "uninstall",
        "mlnode-agent",
        "--namespace",
        "mlnode-system",
        "--wait",
        "--ignore-not-found",
        "--kubeconfig",
        cluster.admin.kubeconfig().to_str().unwrap(),
    ])
    .unwrap();
    assert!(
        uninstalled.status.success(),
        "helm uninstall: {uninstalled:?}"
    );
    await_no_agent(cluster, "charted");
}

/// helm against the one-node cluster as its admin; fails with its output.
fn helm(cluster: &OneNodeCluster, args: &[&str]) {
    let mut with_cluster = args.to_vec();
    with_cluster.extend(["--kubeconfig", cluster.admin.kubeconfig().to_str().unwrap()]);
    let output = testbed::renderers::helm::helm(&with_cluster).unwrap();
    assert!(output.status.success(), "helm {args:?}: {output:?}");
}

/// The chart's folder.
fn chart() -> String {
    testbed::renderers::helm::chart_dir().display().to_string()
}
