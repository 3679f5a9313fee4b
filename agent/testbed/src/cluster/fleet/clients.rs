//! The server's other clients while a phase runs: a controller whose latency is kept, and the rest
//! of a larger fleet in the agents' priority level.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;

/// Another client of the server: reads a node and writes a ConfigMap in turn, each request's
/// latency kept.
pub(super) struct OtherClient {
    pub(super) running: Arc<AtomicBool>,
    pub(super) latencies: Arc<Mutex<Vec<f64>>>,
    pub(super) client: ureq::Agent,
    pub(super) server: String,
    pub(super) token: String,
    pub(super) node: String,
}

impl OtherClient {
    pub(super) fn run(self) {
        let agent = &self.client;
        let auth = format!("Bearer {}", self.token);
        let mut n = 0u64;
        while self.running.load(Ordering::Relaxed) {
            n += 1;
            let started = Instant::now();
            let answered = if n.is_multiple_of(2) {
                agent
                    .get(&format!("{}/api/v1/nodes/{}", self.server, self.node))
                    .header("Authorization", &auth)
                    .call()
            } else {
                let body = json!({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": "other-client", "namespace": "kube-system"}, "data": {"n": n.to_string()}});
                agent
                    .patch(&format!(
                        "{}/api/v1/namespaces/kube-system/configmaps/other-client?fieldManager=other-client&force=true",
                        self.server
                    ))
                    .header("Authorization", &auth)
                    .content_type("application/apply-patch+yaml")
                    .send(body.to_string())
            };
            // While kube-apiserver restarts there is nothing to answer: not a latency.
            if answered.is_ok_and(|r| r.status().as_u16() < 500) {
                self.latencies
                    .lock()
                    .unwrap()
                    .push(started.elapsed().as_secs_f64());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// How long one request of the other clients may take.
pub(super) const CLIENT_TIMEOUT: Duration = Duration::from_secs(30);

/// The rest of a large fleet in the agents' priority level: `FLOOD_CLIENTS` clients with the
/// agents' service account (a token bound to no pod, so no node's) listing every pod from the
/// watch cache back to back, until `running` is false. A level narrowed to no seat still
/// dispatches a request when none of its own executes (the queue set never starves a level
/// outright), so a handful of agents alone seldom meets a 429; a fleet of hundreds does.
pub(super) struct Flood {
    pub(super) running: Arc<AtomicBool>,
    pub(super) client: ureq::Agent,
    pub(super) server: String,
    pub(super) token: String,
}

pub(super) const FLOOD_CLIENTS: usize = 4;

impl Flood {
    pub(super) fn run(self) {
        let agent = &self.client;
        let url = format!("{}/api/v1/pods?resourceVersion=0", self.server);
        let auth = format!("Bearer {}", self.token);
        while self.running.load(Ordering::Relaxed) {
            let _ = agent.get(&url).header("Authorization", &auth).call();
        }
    }
}
