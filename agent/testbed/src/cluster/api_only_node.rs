//! A node of the real cluster (crate::cluster::control_plane) as a test of the agent needs it: the shipped
//! objects installed in a namespace of their own, the Node with the agent's pod bound to it and
//! that pod's token, a namespace for the node's inference pods, and the proxy the agent may talk
//! through (crate::cluster::fault_proxy).

use std::path::Path;

use serde_json::{json, Value};

use crate::agent::Agent;
use crate::cluster::control_plane::{self, gpu_taints, AgentOnNode, ControlPlane};
use crate::cluster::fault_proxy::ApiProxy;
use crate::cluster::fault_proxy::Recorded;

/// The agent's objects installed on the shared control plane for one Node that exists only in the
/// API (no kubelet runs it), with the agent's pod bound to it and that pod's token.
pub struct ApiOnlyNode {
    pub control_plane: &'static ControlPlane,
    pub on: AgentOnNode,
    /// The namespace of the node's inference pods.
    pub inference: String,
    pub api: ApiProxy,
}

impl ApiOnlyNode {
    /// The GPU overlay with `components`, on a GPU node.
    pub fn gpu(components: &[&str]) -> Result<ApiOnlyNode, String> {
        let control_plane = control_plane::shared()?;
        let objects = crate::renderers::kustomize::render_with("overlays/gpu", components)?;
        let node = control_plane::node(&control_plane.unique("node"), json!({}));
        Ok(ApiOnlyNode::start(
            control_plane,
            &objects,
            node,
            gpu_taints(),
        ))
    }

    /// `objects` installed, `node` registered with `taints`, the agent's pod on it.
    pub fn start(
        control_plane: &'static ControlPlane,
        objects: &[Value],
        node: Value,
        taints: Value,
    ) -> ApiOnlyNode {
        let on = AgentOnNode::start_on(control_plane, objects, &node);
        control_plane.set_taints(&on.node, taints);
        let inference = control_plane.namespace("inference", json!({}));
        let api = ApiProxy::start(control_plane, &on.token);
        ApiOnlyNode {
            control_plane,
            on,
            inference,
            api,
        }
    }

    /// The node's name.
    pub fn name(&self) -> &str {
        &self.on.node
    }

    /// The node's path in the API.
    pub fn path(&self) -> String {
        format!("/api/v1/nodes/{}", self.on.node)
    }

    pub fn node(&self) -> Value {
        self.control_plane.get(&["node", &self.on.node])
    }

    pub fn condition(&self, kind: &str) -> Value {
        control_plane::condition(&self.node(), kind)
    }

    /// `pod` (a vLLM pod as crate::cluster::pods builds it) created in the inference namespace, its status
    /// written as the kubelet writes it; the stored pod.
    pub fn put_pod(&self, pod: &Value) -> Value {
        self.control_plane.create_pod(&self.inference, pod)
    }

    pub fn pod(&self, name: &str) -> Value {
        self.control_plane
            .get(&["pod", name, "-n", &self.inference])
    }

    pub fn pod_condition(&self, name: &str, kind: &str) -> Value {
        control_plane::condition(&self.pod(name), kind)
    }

    /// The inference pod `name`'s status path in the API.
    pub fn pod_status_path(&self, name: &str) -> String {
        format!("/api/v1/namespaces/{}/pods/{name}/status", self.inference)
    }

    pub fn delete_pod(&self, name: &str) {
        self.control_plane.admin(
            &["delete", "pod", name, "-n", &self.inference, "--wait=false"],
            "",
        );
    }

    /// The node's taints as another writer sets them.
    pub fn set_taints(&self, taints: Value) {
        self.control_plane.set_taints(&self.on.node, taints);
    }

    /// Whether an Event of `reason` was created in the inference namespace.
    pub fn has_event(&self, reason: &str) -> bool {
        let events = self.control_plane.get(&[
            "events",
            "-n",
            &self.inference,
            &format!("--field-selector=reason={reason}"),
        ]);
        !events["items"].as_array().unwrap().is_empty()
    }

    /// The proxy's kubeconfig: what the agent talks through.
    pub fn kubeconfig(&self) -> std::path::PathBuf {
        self.api.kubeconfig()
    }

    /// Sets an annotation on the node, as `kubectl annotate --overwrite` does.
    pub fn annotate_node(&self, key: &str, value: &str) {
        self.control_plane.admin(
            &[
                "annotate",
                "--overwrite",
                "node",
                &self.on.node,
                &format!("{key}={value}"),
            ],
            "",
        );
    }

    /// Sets a label on the node, as `kubectl label --overwrite` does.
    pub fn label_node(&self, key: &str, value: &str) {
        self.control_plane.admin(
            &[
                "label",
                "--overwrite",
                "node",
                &self.on.node,
                &format!("{key}={value}"),
            ],
            "",
        );
    }

    /// A DRA driver's ResourceSlice (as the API server returns it) published for this node, as
    /// the driver's kubelet plugin publishes it: the server names it from `generateName`.
    pub fn put_resource_slice(&self, mut slice: Value) {
        let metadata = slice["metadata"].as_object_mut().unwrap();
        for server_set in ["name", "resourceVersion", "ownerReferences"] {
            metadata.remove(server_set);
        }
        self.control_plane.create(&slice);
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.api.requests()
    }

    /// The agent binary with `config` on this node, talking through the proxy.
    pub fn start_agent(&self, config: &str) -> Agent {
        // MLNODE_NODE_NAME overrides the harness's node_name: the agent acts on the node it runs on.
        Agent::start_with_env(
            config,
            &[
                ("KUBECONFIG", &self.api.kubeconfig()),
                ("MLNODE_NODE_NAME", Path::new(&self.on.node)),
            ],
        )
    }
}

/// NVIDIA's DRA driver's ResourceSlice for `node` (tests/fixtures/dra, cited in SOURCES): `gpu-0`
/// is GPU 0 of the fake NVML's scenarios, `gpu-1-mig-1g10gb-19-0` a MIG device of GPU 1.
pub fn nvidia_resource_slice(node: &str) -> Value {
    let fixture = include_str!("../../../../tests/fixtures/dra/nvidia-resourceslice.json");
    serde_json::from_str(&fixture.replace("gpu-node-1", node)).unwrap()
}
