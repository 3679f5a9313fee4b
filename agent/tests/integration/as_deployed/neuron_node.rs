//! A Neuron node as the Neuron overlay and the chart deploy the agent there, which requires the
//! driver.

use super::*;

#[test]
fn the_neuron_overlay_runs_as_deployed_and_requires_the_driver() {
    let objects = testbed::needs!(kustomize::render_with("overlays/neuron", &[]));
    neuron_runs_as_deployed(objects);
}

/// The chart's Neuron DaemonSet, as the kubelet would start it on an Inf2 node: the same run as
/// the overlay's, on the chart's RBAC, admission policy and ConfigMaps.
#[test]
fn the_charts_neuron_daemonset_runs_as_deployed_and_requires_the_driver() {
    neuron_runs_as_deployed(testbed::needs!(charted_for("neuron", "")));
}

fn neuron_runs_as_deployed(objects: Vec<Value>) {
    testbed::needs!(emulated_container::supported());
    let _port = PORT_9400.lock().unwrap_or_else(|p| p.into_inner());
    let control_plane = testbed::needs!(control_plane::shared());
    let labels = json!({"metadata": {"labels": {
        "node.kubernetes.io/instance-type": "inf2.48xlarge", "topology.kubernetes.io/zone": "us-east-2a"}}});
    let taints =
        json!([{"key": "aws.amazon.com/neuron", "value": "present", "effect": "NoSchedule"}]);
    let tree = testbed::devices::neuron_sysfs::NeuronTree::new(
        testbed::devices::neuron_sysfs::INF2_48XLARGE,
    );
    for (driver, expected) in [(Some(tree.root()), "True"), (None, "False")] {
        let host = Host::new();
        let manifest = user_model(&host);
        std::fs::create_dir_all(host.path("/var/lib/kubelet/pod-resources")).unwrap();
        let name = control_plane.unique("ip-10-0-2-40.us-east-2.compute.internal");
        let node = control_plane::node(&name, labels.clone());
        let cluster = ApiOnlyNode::start(control_plane, &objects, node, taints.clone());
        let volumes = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let setup = NodeSetup {
            host: &host,
            cluster: &cluster,
            nvml_scenario: None,
            neuron_sysfs: driver,
            configmap_edits: readme_model(&cluster.on.install.objects, manifest),
        };
        let spec = as_kubelet_would(&cluster.on.install.objects, &setup, volumes.path());
        let mut agent = run(&spec, volumes.path());
        agent.wait(
            "AcceleratorHealthy written",
            Duration::from_secs(60),
            |_| cluster.condition("AcceleratorHealthy")["status"] == expected,
        );
        let metrics = agent.metrics().unwrap();
        let up = |c: &str| sample(&metrics, "mlnode_collector_up", &[("collector", c)]);
        // MLNODE_NVML__ENABLED=false and MLNODE_NEURON__ENABLED=true took effect.
        assert_eq!(up("nvml"), Some(0.0));
        assert!(
            agent.log().contains("nvml.enabled: false"),
            "{}",
            agent.log()
        );
        let healthy = cluster.condition("AcceleratorHealthy");
        match driver {
            Some(_) => {
                assert_eq!(up("neuron"), Some(1.0), "{}", agent.log());
                // The EC2 type and zone come from the Node's labels through the API server; the
                // driver's chip family is neuron_family.
                agent.wait(
                    "instance_type from the Node",
                    Duration::from_secs(30),
                    |a| {
                        a.metrics().is_some_and(|m| {
                            sample(
                                &m,
                                "mlnode_neuron_device_info",
                                &[
                                    ("instance_type", "inf2.48xlarge"),
                                    ("availability_zone", "us-east-2a"),
                                    ("neuron_family", "Inf2"),
                                ],
                            )
                            .is_some()
                        })
                    },
                );
                assert!(
                    healthy["message"]
                        .as_str()
                        .unwrap()
                        .contains("12 Neuron device(s)"),
                    "{healthy}"
                );
            }
            None => {
                // A Neuron node without a driver is not a healthy accelerator node.
                assert_eq!(up("neuron"), Some(0.0));
                assert_eq!(healthy["reason"], "CollectorUnavailable", "{healthy}");
            }
        }
        assert_eq!(
            cluster.node()["spec"]["taints"],
            taints,
            "no startup taint component: taints untouched"
        );
        let refused = control_plane::refused_requests(&agent.metrics().unwrap());
        assert_eq!(refused, Vec::<String>::new(), "{}", agent.log());
    }
}
