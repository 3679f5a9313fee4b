//! A startup's image pull split into its transfer and its unpack, and a model downloaded before
//! its server loads it, measured on the tests' real node (testbed::node::one_node_cluster:
//! kubelet, containerd 2.4, the registry behind a rate-held link), with the agent installed as
//! users install it (overlays/gpu with components/image-pull, the README's model).
//!
//! - Images of the same bytes laid out two ways (a few large layers, many small ones), pulled at
//!   two link rates: the agent's `image_transfer` and `image_unpack` beside the kubelet's pull,
//!   what the link implies for the bytes it carried, and containerd's own record of the pull (its
//!   debug log: the pull's figure, each layer's apply). The link rate should move the transfer
//!   and not the unpack; the layer count the unpack.
//! - The model's weights downloaded into the node's cache by an init container at a held rate,
//!   then loaded by the server as soon as the agent has verified them: the agent's
//!   `model_download`, `model_load` and `readiness` beside the downloader's and the server's own
//!   clocks.
//!
//! `cargo bench --bench pull_and_download -- [--image-mib 200] [--slow-mib-per-s 8]
//! [--model-mib 256] [--store-mib-per-s 64]` after `scripts/test.sh` has built the node's programs
//! and put kubectl under target/tools (PATH). Prints the tables and writes them to
//! target/bench_pull_and_download.md.

#[path = "support/args.rs"]
mod args;
#[path = "support/on_node.rs"]
mod on_node;

use std::fmt::Write;

use args::arg;
use mlnode_testbed as testbed;

use serde_json::{json, Value};

use testbed::cluster::pods::unix;
use testbed::node::containerd_log::pull_record;
use testbed::node::runtime::{REGISTRY, REGISTRY_RATE};
use testbed::node::workload::{
    await_agent_pod, await_agent_startups, await_pod_ready, container_output, events_of,
    first_with, for_this_cluster, image_with_layers, layers_to_fetch, model_store, open_to_all,
    pull_seconds, weights_in_image_pod, with_download_step, workload_pod, Shard,
};
use testbed::renderers::kustomize::README_MODEL;

struct Row {
    layout: &'static str,
    layers: usize,
    rate: u64,
    fetched: u64,
    kubelet: f64,
    containerd: f64,
    transfer: f64,
    unpack: f64,
    containerd_transfer: f64,
    containerd_unpack: f64,
    applying: f64,
}

fn main() {
    let image_mib = arg("--image-mib", 200.0) as usize;
    let slow = (arg("--slow-mib-per-s", 8.0) * 1048576.0) as u64;
    let model_mib = arg("--model-mib", 256.0) as usize;
    let store_rate = (arg("--store-mib-per-s", 64.0) * 1048576.0) as u64;
    let cluster = testbed::node::one_node_cluster::shared()
        .unwrap_or_else(|e| panic!("the tests' node: {e}"));
    let _node_wide = cluster.exclusive();
    cluster.label_as_gpu_node();
    let objects =
        testbed::renderers::kustomize::render_with("overlays/gpu", &["components/image-pull"])
            .unwrap_or_else(|e| panic!("kustomize: {e}"));
    // The README's model, its weights not yet on the node: the store has them, the cache is empty.
    let namespace = cluster.namespace("pull-bench");
    let model = Model::new(cluster, &namespace, model_mib);
    let config = testbed::renderers::kustomize::config_with_readme_model(&objects);
    let installed: Vec<Value> = for_this_cluster(cluster, objects)
        .into_iter()
        .map(|mut o| {
            if o["kind"] == "ConfigMap" && o["metadata"]["name"] == "mlnode-model-manifests" {
                o["data"][format!("{README_MODEL}.json")] = json!(model.manifest);
            }
            if o["kind"] == "ConfigMap" && o["metadata"]["name"] == "mlnode-agent-config" {
                o["data"]["config.yaml"] = json!(config);
            }
            o
        })
        .collect();
    cluster.admin.apply(&installed).unwrap();
    let agent = await_agent_pod(cluster, None);
    let agent_ip = agent["status"]["podIP"].as_str().unwrap().to_string();
    let agent = agent["metadata"]["name"].as_str().unwrap();
    let slow_registry = cluster.registry_at(slow);
    let log = cluster.runtime.dir().join("containerd.log");

    let mut rows = Vec::new();
    let mut seed = 100u8;
    for (layout, layers) in [("large layers", 4usize), ("small layers", 50)] {
        for (registry, rate) in [(REGISTRY, REGISTRY_RATE), (slow_registry.as_str(), slow)] {
            let bytes = (image_mib << 20) / layers;
            let shards: Vec<[Shard; 1]> = (0..layers)
                .map(|n| {
                    seed = seed.wrapping_add(1);
                    [Shard {
                        path: format!("part-{n:03}.bin"),
                        seed,
                        bytes,
                    }]
                })
                .collect();
            let tag = format!("pull-{layers}-{}", rate >> 20);
            let stack: Vec<&[Shard]> = shards.iter().map(|s| s.as_slice()).collect();
            image_with_layers(cluster, &tag, &stack);
            let (digests, fetched) =
                layers_to_fetch(cluster, &format!("{REGISTRY}/workload:{tag}"));
            let image = format!("{registry}/workload:{tag}");
            let name = tag.clone();
            cluster.admin.admin(
                &["create", "-n", &namespace, "-f", "-"],
                &weights_in_image_pod(&name, &image).to_string(),
            );
            await_pod_ready(cluster, &namespace, &name);
            let startup = await_agent_startups(cluster, agent, &namespace, &name, 1).remove(0);
            let pulled = first_with(&events_of(cluster, &namespace, &name), "reason", "Pulled");
            let names: Vec<String> = digests.into_iter().map(|(d, _)| d).collect();
            let record = pull_record(&std::fs::read_to_string(&log).unwrap(), &image, &names)
                .unwrap_or_else(|| panic!("containerd's log records no pull of {image}"));
            let split = &startup["image_pull_split"];
            let part = |key: &str| {
                split[key]
                    .as_f64()
                    .unwrap_or_else(|| panic!("no split: {startup}"))
            };
            let applying_from = record.applying_from();
            rows.push(Row {
                layout,
                layers: layers + 1,
                rate,
                fetched,
                kubelet: pull_seconds(pulled["message"].as_str().unwrap()),
                containerd: record.seconds,
                transfer: part("transfer_seconds"),
                unpack: part("unpack_seconds"),
                containerd_transfer: applying_from - record.began(),
                containerd_unpack: record.ended - applying_from,
                applying: record.applies.iter().map(|a| a.seconds).sum(),
            });
            cluster.admin.admin(
                &["delete", "pod", "-n", &namespace, &name, "--wait=false"],
                "",
            );
        }
    }

    let mut table = format!(
        "An image of {image_mib} MiB of incompressible weights laid out two ways, each pulled once through a link held to its rate. Seconds.\n\n\
         | layout | layers | link MiB/s | MiB fetched | kubelet pull | containerd pull | transfer: agent | transfer: link | transfer: containerd | unpack: agent | unpack: containerd | applying (Σ applies) |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n"
    );
    for row in &rows {
        writeln!(
            table,
            "| {} | {} | {} | {:.1} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
            row.layout,
            row.layers,
            row.rate >> 20,
            row.fetched as f64 / 1048576.0,
            row.kubelet,
            row.containerd,
            row.transfer,
            row.fetched as f64 / row.rate as f64,
            row.containerd_transfer,
            row.unpack,
            row.containerd_unpack,
            row.applying,
        )
        .unwrap();
    }
    let ratio = |layout: &str, pick: fn(&Row) -> f64| {
        let of = |fast: bool| {
            rows.iter()
                .find(|r| r.layout == layout && (r.rate == REGISTRY_RATE) == fast)
                .map(pick)
                .unwrap()
        };
        of(false) / of(true)
    };
    for layout in ["large layers", "small layers"] {
        writeln!(
            table,
            "\n{layout}: slow link / fast link: transfer {:.2}, unpack {:.2}",
            ratio(layout, |r| r.transfer),
            ratio(layout, |r| r.unpack),
        )
        .unwrap();
    }
    let unpack_of = |layout: &str| {
        rows.iter()
            .filter(|r| r.layout == layout)
            .map(|r| r.unpack)
            .sum::<f64>()
    };
    writeln!(
        table,
        "small layers / large layers, unpack at both rates: {:.2}",
        unpack_of("small layers") / unpack_of("large layers")
    )
    .unwrap();
    eprintln!("{table}");

    let image = format!("{REGISTRY}/workload:pull-{}-{}", 4, REGISTRY_RATE >> 20);
    let download = model.download(cluster, agent, &agent_ip, &namespace, &image, store_rate);
    writeln!(
        table,
        "\nThe README's model, {model_mib} MiB in two shards, downloaded into the node's cache by an init container at {} MiB/s, loaded once the agent verified it. Seconds.\n\n\
         | stretch | agent | ground truth |\n| --- | ---: | ---: |\n{download}",
        store_rate >> 20
    )
    .unwrap();
    on_node::finish(
        cluster,
        &table,
        "bench_pull_and_download.md",
        installed,
        &namespace,
    );
}

/// The README's model as its store holds it: two shards and its config, in the store's folder;
/// the node's cache folder made empty and writable by the pods' user.
struct Model {
    files: Vec<String>,
    /// What the agent counts of a download: the weight files', not the config's.
    weight_bytes: u64,
    manifest: String,
}

impl Model {
    fn new(
        cluster: &testbed::node::one_node_cluster::OneNodeCluster,
        namespace: &str,
        mib: usize,
    ) -> Model {
        let models = cluster.runtime.dir().join("models");
        let store = models.join(namespace);
        let cache = models.join(README_MODEL);
        std::fs::create_dir_all(&store).unwrap();
        std::fs::create_dir_all(&cache).unwrap();
        let shard = (mib << 20) / 2;
        let mut files = std::collections::BTreeMap::new();
        files.insert(
            "config.json".to_string(),
            br#"{"model_type": "llama"}"#.to_vec(),
        );
        for n in 1..=2u8 {
            files.insert(
                format!("model-0000{n}-of-00002.safetensors"),
                testbed::models::content(200 + n, shard),
            );
        }
        for (path, bytes) in &files {
            std::fs::write(store.join(path), bytes).unwrap();
        }
        open_to_all(&store);
        // The download step runs as the pods' user: the cache is its to fill.
        std::fs::set_permissions(&cache, std::os::unix::fs::PermissionsExt::from_mode(0o777))
            .unwrap();
        let model = testbed::models::PlainModel {
            dir: tempfile::tempdir().unwrap(),
            files,
        };
        Model {
            files: model.files.keys().cloned().collect(),
            weight_bytes: model
                .files
                .iter()
                .filter(|(path, _)| path.ends_with(".safetensors"))
                .map(|(_, bytes)| bytes.len() as u64)
                .sum(),
            manifest: model.manifest_json("0e9e39f249a16976918f6564b8830bc894c89659", true),
        }
    }

    /// A server whose init container downloads the model from the store at `rate`, and which
    /// loads it once the agent has verified it: the table's rows, the agent beside the
    /// downloader's and the server's own clocks.
    fn download(
        &self,
        cluster: &testbed::node::one_node_cluster::OneNodeCluster,
        agent: &str,
        agent_ip: &str,
        namespace: &str,
        image: &str,
        rate: u64,
    ) -> String {
        let store = model_store(cluster, namespace, image, rate, None);
        let on_node = std::path::Path::new("/var/lib/models").join(README_MODEL);
        let mut pod = workload_pod("fetching", image, &on_node, 0);
        pod["metadata"]["annotations"] = json!({"mlnode.dev/model": README_MODEL});
        let server = &mut pod["spec"]["containers"][0];
        server["args"] = json!([
            "--model",
            "/model",
            "--listen",
            "0.0.0.0:8000",
            "--ready-after",
            "0s",
            "--after-verified",
            format!("http://{agent_ip}:9400/metrics"),
            "--verified-model",
            README_MODEL,
        ]);
        server["volumeMounts"][0]["readOnly"] = json!(false);
        let pod = with_download_step(pod, &store, &self.files.join(","));
        cluster
            .admin
            .admin(&["create", "-n", namespace, "-f", "-"], &pod.to_string());
        await_pod_ready(cluster, namespace, "fetching");
        let startup = await_agent_startups(cluster, agent, namespace, "fetching", 1).remove(0);
        let at = |lines: &[Value], event: &str| unix(&first_with(lines, "event", event)["at"]);
        let downloader = container_output(cluster, namespace, "fetching", "download");
        let served = container_output(cluster, namespace, "fetching", "fetching");
        let pod = cluster.admin.get(&["pod", "-n", namespace, "fetching"]);
        let started = unix(&pod["status"]["containerStatuses"][0]["state"]["running"]["startedAt"]);
        let stretch = &startup["model_download"];
        assert_eq!(
            stretch["bytes"], self.weight_bytes,
            "every weight file once, whole: {startup}"
        );
        let phase = |name: &str| {
            startup["phases"][name]
                .as_f64()
                .map_or("-".to_string(), |s| format!("{s:.2}"))
        };
        format!(
            "| `model_download` ({:.1} MiB/s by the agent) | {:.2} | {:.2} (the downloader's first request to its last file written) |\n\
             | `model_load` | {} | {:.2} (the container's start, whole seconds, to the server's last weight read) |\n\
             | `readiness` | {} | {:.2} (the server's last read to its readiness endpoint's first 200) |\n",
            stretch["bytes_per_second"].as_f64().unwrap_or_default() / 1048576.0,
            stretch["seconds"].as_f64().unwrap_or_else(|| panic!("no model_download: {startup}")),
            at(&downloader, "downloaded") - at(&downloader, "download_started"),
            phase("model_load"),
            at(&served, "model_loaded") - started,
            phase("readiness"),
            at(&served, "ready") - at(&served, "model_loaded"),
        )
    }
}
