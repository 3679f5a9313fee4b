//! A bench on the tests' real node, at its end: its table printed and kept under target/ (as
//! `file`), and what it installed and the namespace it ran in removed.

use mlnode_testbed::node::one_node_cluster::OneNodeCluster;
use serde_json::Value;

pub fn finish(
    cluster: &OneNodeCluster,
    table: &str,
    file: &str,
    installed: Vec<Value>,
    namespace: &str,
) {
    println!("{table}");
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../target")
        .join(file);
    std::fs::write(&out, table).unwrap();
    eprintln!("written to {}", out.display());
    let list = mlnode_testbed::cluster::control_plane::list(installed);
    cluster
        .admin
        .admin(&["delete", "--wait", "-f", "-"], &list.to_string());
    cluster
        .admin
        .admin(&["delete", "namespace", namespace, "--wait=false"], "");
}
