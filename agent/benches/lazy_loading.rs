//! The practice guide's caveat about lazy loading, measured on the tests' real node
//! (testbed::node::one_node_cluster: kubelet, containerd with AWS's SOCI snapshotter, the registry behind a
//! link held to 32 MiB/s): "benefits may shrink when startup immediately reads all
//! weights/libraries". The same server image, with and without a SOCI index, started by two
//! servers: one that reads all of its weights from the image's layers at start, one that reads a
//! tenth of them. The agent runs as users install it (overlays/gpu with components/soci) and
//! reports each startup's phases and where the image's bytes were fetched; the table sets them
//! side by side, and each lazy startup against the whole pull of the same server as a ratio.
//!
//! `cargo bench --bench lazy_loading -- [--weights-mib 320]` after `scripts/test.sh` has built
//! the node's programs and put kubectl and kustomize under target/tools (PATH). Prints the table
//! and writes it to target/bench_lazy_loading.md.

#[path = "support/args.rs"]
mod args;
#[path = "support/on_node.rs"]
mod on_node;

use std::fmt::Write;

use args::arg;
use mlnode_testbed as testbed;

use serde_json::{json, Value};

use testbed::node::runtime::{REGISTRY, REGISTRY_RATE};
use testbed::node::workload::{
    await_agent_pod, await_agent_startups, await_pod_ready, container_output, events_of,
    first_with, for_this_cluster, image_with_shards, pull_seconds, weights_in_image_pod, Shard,
};

/// Shards of the weights: the tenth-reading server reads the first.
const SHARDS: u8 = 10;

/// One startup as the agent, the kubelet and the server saw it.
struct Row {
    server: &'static str,
    lazy: bool,
    kubelet_pull: f64,
    startup: Value,
    read_bytes: u64,
}

impl Row {
    fn phase(&self, name: &str) -> f64 {
        self.startup["phases"][name].as_f64().unwrap_or(0.0)
    }

    fn total(&self) -> f64 {
        self.startup["total_seconds"].as_f64().unwrap()
    }

    /// From the container's start to Ready: what the phases before it leave of the total.
    fn start_to_ready(&self) -> f64 {
        self.total()
            - ["scheduling", "image_pull", "container_start"]
                .iter()
                .map(|p| self.phase(p))
                .sum::<f64>()
    }

    /// "pull / start / start→Ready" in MiB, or what the agent said instead.
    fn fetched(&self) -> String {
        let load = &self.startup["lazy_load"];
        if load["lazy"] != true {
            return format!("lazy: {}", load["lazy"]);
        }
        ["image_pull", "container_start", "start_to_ready"]
            .iter()
            .map(
                |stretch| match load["fetched"][stretch]["fetched_bytes"].as_f64() {
                    Some(bytes) => format!("{:.0}", bytes / 1048576.0),
                    None => "-".into(),
                },
            )
            .collect::<Vec<_>>()
            .join(" / ")
    }

    fn fetching(&self) -> String {
        self.startup["lazy_load"]["fetched"]["start_to_ready"]["fetch_seconds"]
            .as_f64()
            .map_or("-".into(), |s| format!("{s:.1}"))
    }
}

fn main() {
    let weights_mib = arg("--weights-mib", 320.0) as usize;
    let shard_bytes = weights_mib.div_ceil(SHARDS as usize) << 20;
    let cluster = testbed::node::one_node_cluster::shared()
        .unwrap_or_else(|e| panic!("the tests' node: {e}"));
    let _node_wide = cluster.exclusive();
    // A GPU node, as GPU Feature Discovery labels it: where the gpu overlay's DaemonSet runs.
    cluster.label_as_gpu_node();
    let objects = testbed::renderers::kustomize::render_with("overlays/gpu", &["components/soci"])
        .unwrap_or_else(|e| panic!("kustomize: {e}"));
    let installed = for_this_cluster(cluster, objects);
    cluster.admin.apply(&installed).unwrap();
    let agent = await_agent_pod(cluster, None);
    let agent = agent["metadata"]["name"].as_str().unwrap();
    let namespace = cluster.namespace("lazy-bench");
    let transfer = (SHARDS as usize * shard_bytes) as f64 / REGISTRY_RATE as f64;
    eprintln!(
        "{SHARDS} shards of {} MiB, {transfer:.1} s at the link's {} MiB/s",
        shard_bytes >> 20,
        REGISTRY_RATE >> 20
    );

    let mut rows = Vec::new();
    for (case, (server, model)) in [("all", "/weights"), ("tenth", "/weights/tenth")]
        .into_iter()
        .enumerate()
    {
        for lazy in [false, true] {
            let name = format!("{server}-{}", if lazy { "lazy" } else { "whole" });
            // Layers of their own: a snapshot of another case's image never stands in.
            let seed = 40 + (case as u8 * 2 + lazy as u8) * SHARDS;
            let shards: Vec<Shard> = (0..SHARDS)
                .map(|i| Shard {
                    path: format!(
                        "{}/model-{:05}-of-{SHARDS:05}.safetensors",
                        if i == 0 { "tenth" } else { "rest" },
                        i + 1
                    ),
                    seed: seed + i,
                    bytes: shard_bytes,
                })
                .collect();
            let tag = format!("bench-{name}");
            let image = if lazy {
                let source = format!("{tag}-source");
                image_with_shards(cluster, &source, &shards);
                cluster
                    .runtime
                    .push_soci_converted(&format!("workload:{source}"), &format!("workload:{tag}"));
                format!("{REGISTRY}/workload:{tag}")
            } else {
                image_with_shards(cluster, &tag, &shards);
                format!("{REGISTRY}/workload:{tag}")
            };
            let mut pod = weights_in_image_pod(&name, &image);
            pod["spec"]["containers"][0]["args"][1] = json!(model);
            cluster
                .admin
                .admin(&["create", "-n", &namespace, "-f", "-"], &pod.to_string());
            await_pod_ready(cluster, &namespace, &name);
            let startup = await_agent_startups(cluster, agent, &namespace, &name, 1).remove(0);
            let events = events_of(cluster, &namespace, &name);
            let pulled = first_with(&events, "reason", "Pulled");
            let loaded = first_with(
                &container_output(cluster, &namespace, &name, &name),
                "event",
                "model_loaded",
            );
            rows.push(Row {
                server,
                lazy,
                kubelet_pull: pull_seconds(pulled["message"].as_str().unwrap()),
                startup,
                read_bytes: loaded["bytes"].as_u64().unwrap(),
            });
        }
    }

    let mut table = format!(
        "Weights: {SHARDS} shards of {} MiB ({transfer:.1} s at the link's {} MiB/s). Seconds; fetched in MiB per stretch (image_pull / container_start / start_to_ready).\n\n\
         | server | image | server read MiB | kubelet pull | agent image_pull | container_start | start to Ready | total | fetched MiB | fetching s (start to Ready) | total, lazy / whole |\n\
         | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: |\n",
        shard_bytes >> 20,
        REGISTRY_RATE >> 20
    );
    for row in &rows {
        let whole = rows
            .iter()
            .find(|r| r.server == row.server && !r.lazy)
            .unwrap();
        writeln!(
            table,
            "| {} | {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {} | {} | {:.2} |",
            row.server,
            if row.lazy { "SOCI index" } else { "no index" },
            row.read_bytes >> 20,
            row.kubelet_pull,
            row.phase("image_pull"),
            row.phase("container_start"),
            row.start_to_ready(),
            row.total(),
            row.fetched(),
            row.fetching(),
            row.total() / whole.total(),
        )
        .unwrap();
    }
    on_node::finish(
        cluster,
        &table,
        "bench_lazy_loading.md",
        installed,
        &namespace,
    );
}
