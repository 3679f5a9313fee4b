//! An image pull split into its transfer and its unpack, against the link and containerd's log.

use super::*;

use testbed::node::containerd_log::{pull_record, PullRecord};
use testbed::node::workload::{image_with_layers, layers_to_fetch, Shard};

/// The rate of the scenario's own link to the registry, bytes a second.
const LINK_RATE: u64 = 8 << 20;

/// Within the bound: a second, or a tenth of the truth, whichever is wider.
fn within(agent: f64, truth: f64) -> bool {
    (agent - truth).abs() <= f64::max(1.0, truth * 0.1)
}

/// A server image of four 12 MiB layers of incompressible weights, pulled whole through a link
/// of its own held to 8 MiB/s: the agent's `image_transfer` is no shorter than what the link implies
/// for the bytes the node did not hold and no longer than containerd's own log allows (its pull's
/// start, by its "Pulled image" figure, to its last layer's apply), and within a second of the
/// link's figure; its `image_unpack` is within a second of containerd's rest (from its applying
/// the last layers back to back); the two add up to the kubelet's pull. Then an image with a SOCI index, loaded lazily: no unpack, so no
/// split, and its `image_pull` the kubelet's figure as before.
#[test]
fn an_image_pull_is_split_as_the_link_and_containerds_record_say_and_a_lazy_one_is_not() {
    let on = testbed::needs!(on_overlay());
    let (cluster, agent_pod, namespace) = (on.cluster, on.agent_pod.as_str(), on.namespace());
    let runtime = &cluster.runtime;
    let shards: Vec<[Shard; 1]> = (0..4u8)
        .map(|n| {
            [Shard {
                path: format!("part-{n}.bin"),
                seed: 60 + n,
                bytes: 12 << 20,
            }]
        })
        .collect();
    let layers: Vec<&[Shard]> = shards.iter().map(|s| s.as_slice()).collect();
    image_with_layers(cluster, "pull-split", &layers);
    // Through a link of its own, slow enough that the link, not the 2-core machine's other work
    // (the suite's other tests), sets the transfer's pace.
    let image = format!("{}/workload:pull-split", cluster.registry_at(LINK_RATE));
    // What the link carries: the layers the node's content store does not hold yet (the
    // server's own layer may be there, from another scenario's image).
    let (all_layers, fetched) =
        layers_to_fetch(cluster, &format!("{REGISTRY}/workload:pull-split"));
    assert!(fetched >= 4 * (12 << 20), "the weights are new to the node");

    cluster.admin.admin(
        &["create", "-n", namespace, "-f", "-"],
        &weights_in_image_pod("pull-split", &image).to_string(),
    );
    await_pod_ready(cluster, namespace, "pull-split");
    let startup = await_agent_startups(cluster, agent_pod, namespace, "pull-split", 1).remove(0);
    let pulled = first_with(
        &events_of(cluster, namespace, "pull-split"),
        "reason",
        "Pulled",
    );
    let kubelet = pull_seconds(pulled["message"].as_str().unwrap());
    let digests: Vec<String> = all_layers.iter().map(|(d, _)| d.clone()).collect();
    let log = std::fs::read_to_string(runtime.dir().join("containerd.log")).unwrap();
    let record: PullRecord = pull_record(&log, &image, &digests)
        .unwrap_or_else(|| panic!("containerd's log records no pull of {image}"));
    assert!(
        !record.applies.is_empty(),
        "containerd's log records the layers' applies"
    );

    let split = &startup["image_pull_split"];
    let transfer = split["transfer_seconds"].as_f64().unwrap_or_else(|| {
        panic!("the agent split the pull: {startup}");
    });
    let unpack = split["unpack_seconds"].as_f64().unwrap();
    // The link's figure for the bytes it carried; containerd's, its pull's start to its applying
    // the layers (back to back, once they are in) and that to its pull's end.
    let link_transfer = fetched as f64 / LINK_RATE as f64;
    let applying_from = record.applying_from();
    let containerd_transfer = applying_from - record.began();
    let containerd_unpack = record.ended - applying_from;
    eprintln!(
        "image split: kubelet {kubelet:.3} s, containerd {:.3} s; transfer: agent {transfer:.3} s, \
         link {link_transfer:.3} s ({fetched} bytes at {LINK_RATE} B/s), containerd \
         {containerd_transfer:.3} s; unpack: agent {unpack:.3} s, containerd {containerd_unpack:.3} s \
         (applies {:?} s)",
        record.seconds,
        record
            .applies
            .iter()
            .map(|a| format!("{:.3}", a.seconds))
            .collect::<Vec<_>>()
    );
    assert!(
        (transfer + unpack - kubelet).abs() < 1e-6,
        "the two add up to the kubelet's pull ({kubelet}): {startup}"
    );
    assert!(
        (phase_of(&startup, "image_pull") - kubelet).abs() < 1e-9,
        "the kubelet's figure: {startup}"
    );
    // The link's figure bounds the transfer from below (no byte comes faster), the start of
    // containerd's last apply from above (each layer is applied once it is in, one at a time);
    // the agent's boundary is between them, give or take its placing of the pull (the registry's
    // answer to the manifest request, the CRI call's own milliseconds).
    const PLACING: f64 = 0.1;
    let last_apply = record.last_apply_began().unwrap() - record.began();
    assert!(
        link_transfer - PLACING <= transfer && transfer <= last_apply + PLACING,
        "transfer: the agent's {transfer:.3} s is not between the link's {link_transfer:.3} s and \
         containerd's last apply's start {last_apply:.3} s"
    );
    for (what, agent, truth) in [
        ("transfer, by the link", transfer, link_transfer),
        ("unpack, by containerd", unpack, containerd_unpack),
    ] {
        assert!(
            within(agent, truth),
            "{what}: the agent's {agent:.3} s, the truth {truth:.3} s"
        );
    }
    let m = agent_metrics(cluster, &await_agent_pod(cluster, None));
    assert!(
        testbed::agent::sample(
            &m,
            "mlnode_pod_startup_image_transfer_seconds_count",
            &[("namespace", namespace)]
        )
        .is_some_and(|count| count >= 1.0),
        "exported"
    );

    // The same shape with a SOCI index: loaded lazily, nothing unpacked, the pull whole.
    let (_, _, lazy) = lazy_image_with_weights(cluster, "pull-split-lazy", 70);
    cluster.admin.admin(
        &["create", "-n", namespace, "-f", "-"],
        &weights_in_image_pod("pull-split-lazy", &lazy).to_string(),
    );
    await_pod_ready(cluster, namespace, "pull-split-lazy");
    let startup =
        await_agent_startups(cluster, agent_pod, namespace, "pull-split-lazy", 1).remove(0);
    let pulled = first_with(
        &events_of(cluster, namespace, "pull-split-lazy"),
        "reason",
        "Pulled",
    );
    assert_eq!(startup["lazy_load"]["lazy"], true, "{startup}");
    assert!(
        startup["image_pull_split"]["absent"]
            .as_str()
            .is_some_and(|why| why.contains("loaded lazily")),
        "{startup}"
    );
    assert!(
        (phase_of(&startup, "image_pull") - pull_seconds(pulled["message"].as_str().unwrap()))
            .abs()
            < 1e-9,
        "the kubelet's figure, as before: {startup}"
    );
    for pod in ["pull-split", "pull-split-lazy"] {
        cluster
            .admin
            .admin(&["delete", "pod", "-n", namespace, pod, "--wait=false"], "");
    }
}
