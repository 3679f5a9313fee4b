//! README.md's install as a person pastes it: the shell blocks of its "Install in a cluster"
//! section, read from README.md at run time (never copied here), each run by `bash -e` in a
//! folder of the user's own against the tests' real node (testbed::node::one_node_cluster: kube-apiserver,
//! the scheduler and controllers, a kubelet with containerd). The agent's pod must turn Ready, the
//! node's ModelCacheVerified True for the README's model, and the check commands, README's and
//! those `helm install` prints, must run and print the node's conditions. The node's control plane
//! serves no prometheus-operator API: the install must not need it (cluster_install.rs installs
//! where it is served). Every shell block of README.md and docs/, and each command the chart's
//! notes print, at least parses.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use mlnode_testbed as testbed;
use testbed::node::one_node_cluster::{OneNodeCluster, NODE};
use testbed::node::runtime::REGISTRY;
use testbed::node::workload::{agent_pods, await_agent_pod, open_to_all};

const SECTION: &str = "## Install in a cluster";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .unwrap()
}

/// The fenced code blocks of a Markdown text, as (info string, code) in order, with the fence's
/// own indentation (a block inside a list item) taken off each line, as it is off the page.
fn code_blocks(markdown: &str) -> Vec<(String, String)> {
    let mut blocks = Vec::new();
    let mut open: Option<(usize, String, Vec<String>)> = None;
    for line in markdown.lines() {
        let indent = line.len() - line.trim_start().len();
        let trimmed = line.trim_start();
        match &mut open {
            None => {
                if let Some(info) = trimmed.strip_prefix("```") {
                    open = Some((indent, info.trim().to_string(), Vec::new()));
                }
            }
            Some((fence, _, lines)) => {
                if trimmed.starts_with("```") {
                    let (_, info, lines) = open.take().unwrap();
                    blocks.push((info, lines.join("\n") + "\n"));
                } else {
                    let cut = (*fence).min(indent);
                    lines.push(line[cut..].to_string());
                }
            }
        }
    }
    blocks
}

/// The shell blocks of README.md's install section, in order.
fn install_blocks() -> Vec<String> {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let start = readme
        .find(SECTION)
        .unwrap_or_else(|| panic!("README.md has no section {SECTION:?}"));
    let rest = &readme[start + SECTION.len()..];
    let section = &rest[..rest.find("\n## ").unwrap_or(rest.len())];
    code_blocks(section)
        .into_iter()
        .filter(|(info, _)| info == "sh")
        .map(|(_, code)| code)
        .collect()
}

/// The one install block that holds `marker`.
fn block(blocks: &[String], marker: &str) -> String {
    let found: Vec<&String> = blocks.iter().filter(|b| b.contains(marker)).collect();
    assert_eq!(
        found.len(),
        1,
        "README's install section: one shell block with {marker:?}, found {found:#?}"
    );
    found[0].clone()
}

#[test]
fn every_shell_block_of_the_readme_and_docs_parses() {
    let mut documents = vec![repo().join("README.md")];
    for entry in std::fs::read_dir(repo().join("docs")).unwrap() {
        documents.push(entry.unwrap().path());
    }
    let mut parsed = 0;
    for document in documents {
        let text = std::fs::read_to_string(&document).unwrap();
        for (info, code) in code_blocks(&text) {
            if !matches!(info.as_str(), "sh" | "bash" | "shell" | "console") {
                continue;
            }
            if let Err(why) = parses(&code) {
                panic!(
                    "{}: a shell block bash cannot parse:\n{code}\n{why}",
                    document.display()
                );
            }
            parsed += 1;
        }
    }
    assert!(parsed >= 10, "only {parsed} shell blocks found");
    // The commands `helm install` prints (the chart's NOTES.txt), as a person pastes them.
    let notes = testbed::needs!(testbed::renderers::helm::helm(&[
        "install",
        "mlnode-agent",
        testbed::renderers::helm::chart_dir().to_str().unwrap(),
        "--namespace",
        "mlnode-system",
        "--dry-run=client",
    ]));
    assert!(notes.status.success(), "{notes:?}");
    let commands = notes_commands(&String::from_utf8_lossy(&notes.stdout));
    assert!(commands.len() >= 4, "{commands:?}");
    for command in commands {
        if let Err(why) = parses(&command) {
            panic!("NOTES.txt: {command}: {why}");
        }
    }
}

/// Whether bash parses `code` (`bash -n`); what it said if not.
fn parses(code: &str) -> Result<(), String> {
    let output = Command::new("bash")
        .args(["-n", "-c", code])
        .output()
        .unwrap();
    output
        .status
        .success()
        .then_some(())
        .ok_or_else(|| String::from_utf8_lossy(&output.stderr).into_owned())
}

/// The commands of the chart's notes, as `helm install` prints them: each indented `kubectl` line.
fn notes_commands(printed: &str) -> Vec<String> {
    let notes = printed.split("NOTES:").nth(1).unwrap_or_default();
    notes
        .lines()
        .filter(|l| l.starts_with("  kubectl "))
        .map(|l| l.trim().to_string())
        .collect()
}

/// A folder of the user's own, where they paste the README's commands: the repository's `deploy`
/// beside what they write, `mlnode-agent` on the PATH, their kubeconfig, and `$IMAGE` the
/// registry they pushed the agent's image to (README step 1, which needs a Docker engine this
/// machine lacks: the tests' build of the image stands in, tagged as step 1 tags it).
struct UserShell {
    dir: tempfile::TempDir,
    env: Vec<(String, String)>,
}

impl UserShell {
    fn new(cluster: &OneNodeCluster) -> UserShell {
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        std::os::unix::fs::symlink(repo().join("deploy"), dir.path().join("deploy")).unwrap();
        let agent = assert_cmd::cargo::cargo_bin("mlnode-agent");
        let path = format!(
            "{}:{}",
            agent.parent().unwrap().display(),
            std::env::var("PATH").unwrap_or_default()
        );
        cluster.agent_image();
        cluster.runtime.crane(&[
            "tag",
            &format!("{REGISTRY}/mlnode-agent:test"),
            env!("CARGO_PKG_VERSION"),
        ]);
        UserShell {
            dir,
            env: vec![
                ("PATH".into(), path),
                (
                    "KUBECONFIG".into(),
                    cluster.admin.kubeconfig().display().to_string(),
                ),
                ("IMAGE".into(), format!("{REGISTRY}/mlnode-agent")),
            ],
        }
    }

    fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }

    /// `code` run by `bash -e -o pipefail` in the user's folder; fails with what it printed.
    fn run(&self, code: &str) -> Output {
        let output = Command::new("bash")
            .args(["-e", "-o", "pipefail", "-c", code])
            .current_dir(self.dir.path())
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "README's command failed:\n{code}\nstdout: {}\nstderr: {}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        output
    }
}

/// The node as a GPU node the README's model is on: labelled as GPU Feature Discovery labels it,
/// no startup taint (the README's install adds none), the model under its /var/lib/models and a
/// copy of it in the user's folder (where README step 2 writes its manifest from), and the
/// `nvidia` RuntimeClass the GPU Operator makes. Anything of an earlier install removed first.
fn a_gpu_node_with_the_model(cluster: &OneNodeCluster, user: &UserShell) {
    cluster.admin.admin(
        &[
            "delete",
            "namespace",
            "mlnode-system",
            "--ignore-not-found",
            "--wait",
        ],
        "",
    );
    await_no_agent(cluster);
    // An earlier install's verdicts stay on the Node: gone, so that what is awaited is this one's.
    let forget = serde_json::json!({"status": {"conditions": [
        {"type": "ModelCacheVerified", "$patch": "delete"},
        {"type": "AcceleratorHealthy", "$patch": "delete"}]}});
    cluster.admin.admin(
        &[
            "patch",
            "node",
            NODE,
            "--subresource=status",
            "-p",
            &forget.to_string(),
        ],
        "",
    );
    cluster.label_as_gpu_node();
    cluster.admin.kubectl(
        &["taint", "node", NODE, "mlnode.dev/not-ready:NoSchedule-"],
        "",
    );
    let model = testbed::models::PlainModel::new();
    let on_node = cluster
        .runtime
        .dir()
        .join("models")
        .join(testbed::renderers::kustomize::README_MODEL);
    let _ = std::fs::remove_dir_all(&on_node);
    for root in [
        on_node.clone(),
        user.path(testbed::renderers::kustomize::README_MODEL),
    ] {
        for (path, bytes) in &model.files {
            let file = root.join(path);
            std::fs::create_dir_all(file.parent().unwrap()).unwrap();
            std::fs::write(file, bytes).unwrap();
        }
    }
    open_to_all(&on_node);
    testbed::models::wait_until_settled(&on_node);
    cluster
        .admin
        .apply(&[serde_json::json!({
            "apiVersion": "node.k8s.io/v1",
            "kind": "RuntimeClass",
            "metadata": {"name": "nvidia"},
            "handler": "nvidia",
        })])
        .unwrap();
}

/// What both install paths start from: the README's install blocks, the user's folder, the node
/// with the model, and README step 2's manifest written. The caller holds the node exclusively.
fn a_user_with_the_models_manifest(cluster: &OneNodeCluster) -> (Vec<String>, UserShell) {
    let blocks = install_blocks();
    let user = UserShell::new(cluster);
    a_gpu_node_with_the_model(cluster, &user);
    user.run(&block(&blocks, "mlnode-agent manifest"));
    (blocks, user)
}

fn await_no_agent(cluster: &OneNodeCluster) {
    testbed::wait_until("no agent pod on the node", Duration::from_secs(120), || {
        let pods = agent_pods(cluster);
        pods.is_empty()
            .then_some(())
            .ok_or_else(|| format!("{pods:#?}"))
    })
}

/// After the install command: the agent's pod Ready, and the node's ModelCacheVerified True for
/// the README's model. How long each took from `started`.
fn the_agent_verifies_the_readmes_model(cluster: &OneNodeCluster, started: Instant) -> (f64, f64) {
    await_agent_pod(cluster, None);
    let ready = started.elapsed().as_secs_f64();
    testbed::wait_until(
        "ModelCacheVerified True for the README's model",
        Duration::from_secs(120),
        || match cluster.node_condition("ModelCacheVerified") {
            Some(c) if c["status"] == "True" && c["reason"] == "AllModelCachesVerified" => Ok(()),
            other => Err(format!("{other:?}")),
        },
    );
    (ready, started.elapsed().as_secs_f64())
}

/// `ds/<name> -- <command>` of a `kubectl exec`: the command run in that DaemonSet's pod on the
/// node, in its first container, as `ctr tasks exec` runs it; what it printed.
fn in_the_agents_container(cluster: &OneNodeCluster, exec: &str) -> String {
    let (target, command) = exec
        .split_once(" -- ")
        .expect("kubectl exec ds/NAME -- COMMAND");
    let pod = agent_pods(cluster)
        .into_iter()
        .find(|p| p["metadata"]["ownerReferences"][0]["name"] == target.trim())
        .unwrap_or_else(|| panic!("no pod of {target}"));
    let container = pod["status"]["containerStatuses"][0]["containerID"]
        .as_str()
        .unwrap()
        .trim_start_matches("containerd://")
        .to_string();
    let mut args = vec![
        "--namespace",
        "k8s.io",
        "tasks",
        "exec",
        "--exec-id",
        "readme-check",
        &container,
    ];
    args.extend(command.split_whitespace());
    cluster.runtime.ctr(&args)
}

/// README step 4: the check commands print this node with its conditions True.
fn the_check_prints_the_nodes_conditions(user: &UserShell, check: &str) {
    let printed = String::from_utf8(user.run(check).stdout).unwrap();
    let line = printed
        .lines()
        .find(|l| l.starts_with(NODE))
        .unwrap_or_else(|| panic!("the check printed no line for {NODE}: {printed}"));
    let columns: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(columns, [NODE, "True", "True"], "{printed}");
}

#[test]
fn the_readmes_helm_install_runs_as_written_on_a_real_node() {
    let cluster = testbed::needs!(testbed::node::one_node_cluster::shared());
    testbed::needs!(testbed::renderers::helm::helm(&["version"]).map(|_| ()));
    let _node_wide = cluster.exclusive();
    let (blocks, user) = a_user_with_the_models_manifest(cluster);
    user.run(&block(&blocks, "kubectl create namespace"));
    // This node's NVIDIA runtime is not containerd's default: the user adds it to their values,
    // as the README says between the two blocks.
    let mut values = std::fs::read_to_string(user.path("my-values.yaml")).unwrap();
    values.push_str("runtimeClassName: nvidia\n");
    std::fs::write(user.path("my-values.yaml"), values).unwrap();
    let started = Instant::now();
    let installed = user.run(&block(&blocks, "helm install"));
    let (ready, verified) = the_agent_verifies_the_readmes_model(cluster, started);
    the_check_prints_the_nodes_conditions(&user, &block(&blocks, "custom-columns"));
    let notes = notes_commands(&String::from_utf8_lossy(&installed.stdout));
    assert!(notes.len() >= 4, "{notes:?}");
    for command in &notes {
        let printed = match command.split_once(" exec ds/") {
            // The node cluster's API server cannot dial its kubelet (no route from the host
            // into the node's network, and no name to look up): the command after `--` runs as
            // written in the agent's container, through the node's containerd instead.
            Some((_, exec)) => in_the_agents_container(cluster, exec),
            None => String::from_utf8(user.run(command).stdout).unwrap(),
        };
        if command.contains("custom-columns") {
            assert!(printed.contains(NODE), "{command}: {printed}");
        }
        if command.contains("mlnode-agent config") {
            assert!(printed.contains("llama-3.1-8b"), "{command}: {printed}");
        }
    }
    what_helm_says_of_the_cluster_it_installs_on(cluster, &user);
    eprintln!(
        "README helm install: agent pod Ready {ready:.1} s and ModelCacheVerified=True {verified:.1} s after `helm install`; the section's {} shell blocks: the image build not run, the Helm path's 4 and the kustomize path's 4 each run verbatim by its test; and the {} commands helm install printed",
        blocks.len(),
        notes.len()
    );

    user.run("helm uninstall mlnode-agent --namespace mlnode-system --wait");
    cluster
        .admin
        .admin(&["delete", "namespace", "mlnode-system", "--wait"], "");
    await_no_agent(cluster);
}

#[test]
fn the_readmes_kustomize_install_runs_as_written_on_a_real_node() {
    let cluster = testbed::needs!(testbed::node::one_node_cluster::shared());
    let _node_wide = cluster.exclusive();
    let (blocks, user) = a_user_with_the_models_manifest(cluster);
    user.run(&block(&blocks, "my-mlnode/kustomization.yaml"));
    // The components this node needs, added where the README says.
    let file = user.path("my-mlnode/kustomization.yaml");
    let kustomization = std::fs::read_to_string(&file).unwrap();
    assert!(kustomization.contains("components: []"), "{kustomization}");
    std::fs::write(
        &file,
        kustomization.replace(
            "components: []",
            "components: [../deploy/daemonset/components/nvidia-runtime-class]",
        ),
    )
    .unwrap();
    let started = Instant::now();
    user.run(&block(&blocks, "kubectl apply -k"));
    let (ready, verified) = the_agent_verifies_the_readmes_model(cluster, started);
    the_check_prints_the_nodes_conditions(&user, &block(&blocks, "custom-columns"));
    eprintln!(
        "README kustomize install: agent pod Ready {ready:.1} s and ModelCacheVerified=True {verified:.1} s after `kubectl apply -k`"
    );

    user.run("kubectl delete -k my-mlnode --wait");
    await_no_agent(cluster);
}

/// What the chart reads of the cluster at install (`lookup`, which `helm template` cannot): a model
/// whose node_selector selects no node is a warning in the notes, and the repair condition is
/// refused where EKS Auto Mode nodes are, naming them. Dry runs against the server: nothing changes.
fn what_helm_says_of_the_cluster_it_installs_on(cluster: &OneNodeCluster, user: &UserShell) {
    let upgrade = |values: &str| {
        std::fs::write(user.path("more-values.yaml"), values).unwrap();
        Command::new("helm")
            .args([
                "upgrade",
                "mlnode-agent",
                "deploy/helm/mlnode-agent",
                "--namespace",
                "mlnode-system",
                "--reuse-values",
                "--values",
                "more-values.yaml",
                "--dry-run=server",
            ])
            .current_dir(user.dir.path())
            .envs(user.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .output()
            .unwrap()
    };
    let nowhere = upgrade(
        "config:\n  models:\n    - {name: elsewhere, root: /models/elsewhere, manifest: /etc/mlnode/manifests/llama-3.1-8b.json, node_selector: {pool: nowhere}}\n",
    );
    let printed = String::from_utf8_lossy(&nowhere.stdout);
    assert!(nowhere.status.success(), "{nowhere:?}");
    assert!(
        printed.contains(
            "WARNING: model elsewhere: its node_selector {\"pool\":\"nowhere\"} selects none"
        ),
        "{printed}"
    );
    let here = upgrade(&format!(
        "config:\n  models:\n    - {{name: here, root: /models/here, manifest: /etc/mlnode/manifests/llama-3.1-8b.json, node_selector: {{kubernetes.io/hostname: {NODE}}}}}\n"
    ));
    assert!(here.status.success(), "{here:?}");
    assert!(!String::from_utf8_lossy(&here.stdout).contains("WARNING: model"));

    let auto = "auto-mode-node";
    cluster.admin.create(&testbed::cluster::control_plane::node(
        auto,
        serde_json::json!({"metadata": {"labels": {"eks.amazonaws.com/compute-type": "auto", "nvidia.com/gpu.present": null}}}),
    ));
    let refused = upgrade("repairCondition: {enabled: true}\n");
    cluster.admin.admin(&["delete", "node", auto, "--wait"], "");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success()
            && stderr.contains(
                "repairCondition.enabled: the cluster has EKS Auto Mode nodes (auto-mode-node)"
            ),
        "{stderr}"
    );
}
