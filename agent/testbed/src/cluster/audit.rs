//! What kube-apiserver's own audit log (audit.k8s.io/v1 Events, the log backend's JSON lines)
//! says one user asked: the server's count of requests, where a proxy's or the client's own
//! could miss what the server saw (a retry below the client, a request refused before any
//! handler, such as Priority and Fairness' 429).

use std::collections::{BTreeMap, HashSet};
use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;

use serde_json::Value;

/// The audit policy that records `user`'s requests at the Metadata level (who, what, the answer's
/// code; no bodies) and nothing else, from the stage each request is answered at.
pub fn policy_for(user: &str) -> String {
    format!(
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n  - level: Metadata\n    users: [{user:?}]\n  - level: None\n"
    )
}

/// One request as the server recorded it.
#[derive(Clone, Debug)]
pub struct Request {
    /// As `apiserver_request_total` names it, lower case: get, list, watch, create, patch, ...
    pub verb: String,
    /// `pods`, `pods/status`, `nodes/status`, ...
    pub resource: String,
    pub code: u16,
    /// Who asked, as the server authenticated them, and their groups.
    pub user: String,
    pub groups: Vec<String>,
    /// The node its token is bound to: the service-account token's node-name claim, which the
    /// server records in the user's `extra`.
    pub node: String,
    /// The path and query, as sent.
    pub uri: String,
    /// When the server received it, Unix seconds.
    pub at: f64,
}

impl Request {
    /// A LIST the server answers from its watch cache (`resourceVersion=0`), not from etcd.
    pub fn served_by_watch_cache(&self) -> bool {
        self.uri
            .split_once('?')
            .is_some_and(|(_, query)| query.split('&').any(|p| p == "resourceVersion=0"))
    }

    pub fn is_write(&self) -> bool {
        is_write(&self.verb)
    }
}

/// Whether the audit log's `verb` changes an object.
pub fn is_write(verb: &str) -> bool {
    matches!(
        verb,
        "create" | "update" | "patch" | "delete" | "deletecollection"
    )
}

/// Requests counted by verb, resource and code, as `apiserver_request_total` counts them.
pub type Counts = BTreeMap<(String, String, u16), usize>;

/// The requests counted by verb, resource and response code.
pub fn counts<'a>(requests: impl IntoIterator<Item = &'a Request>) -> Counts {
    let mut counts = Counts::new();
    for r in requests {
        *counts
            .entry((r.verb.clone(), r.resource.clone(), r.code))
            .or_default() += 1;
    }
    counts
}

/// Requests counted by the node whose agent made them.
pub fn by_node<'a>(requests: impl IntoIterator<Item = &'a Request>) -> BTreeMap<&'a str, usize> {
    let mut by_node = BTreeMap::new();
    for r in requests {
        *by_node.entry(r.node.as_str()).or_default() += 1;
    }
    by_node
}

/// Reads the audit logs as they grow, each request once: a watch is counted when it starts (its
/// `ResponseStarted` entry), not when it ends minutes later; any other request when it is
/// answered.
#[derive(Default)]
pub struct AuditReader {
    read_to: Vec<u64>,
    seen: HashSet<String>,
}

impl AuditReader {
    /// The requests the logs record since the last call, oldest first. `logs` are the server's
    /// audit logs, one per start, in order; only whole lines are taken.
    pub fn read(&mut self, logs: &[PathBuf]) -> Vec<Request> {
        self.read_to.resize(logs.len(), 0);
        let mut requests = Vec::new();
        for (log, read_to) in logs.iter().zip(self.read_to.iter_mut()) {
            let Ok(mut file) = std::fs::File::open(log) else {
                continue;
            };
            file.seek(SeekFrom::Start(*read_to)).unwrap();
            let mut text = String::new();
            file.read_to_string(&mut text).unwrap();
            let Some(whole) = text.rfind('\n').map(|end| &text[..=end]) else {
                continue;
            };
            *read_to += whole.len() as u64;
            for line in whole.lines() {
                let event: Value = serde_json::from_str(line).unwrap_or_else(|e| {
                    panic!("{}: an entry that is not JSON ({e}): {line}", log.display())
                });
                if let Some(request) = first_sight(&mut self.seen, &event) {
                    requests.push(request);
                }
            }
        }
        requests
    }
}

/// The request an entry records, if its request was not seen before.
fn first_sight(seen: &mut HashSet<String>, event: &Value) -> Option<Request> {
    let id = event["auditID"].as_str()?;
    if !seen.insert(id.to_string()) {
        return None;
    }
    let object = &event["objectRef"];
    let mut resource = object["resource"].as_str().unwrap_or("").to_string();
    if let Some(subresource) = object["subresource"].as_str() {
        resource = format!("{resource}/{subresource}");
    }
    Some(Request {
        verb: event["verb"].as_str().unwrap_or("").to_string(),
        resource,
        code: event["responseStatus"]["code"].as_u64().unwrap_or(0) as u16,
        user: event["user"]["username"].as_str().unwrap_or("").to_string(),
        groups: event["user"]["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|g| Some(g.as_str()?.to_string()))
            .collect(),
        node: event["user"]["extra"]["authentication.kubernetes.io/node-name"][0]
            .as_str()
            .unwrap_or("")
            .to_string(),
        uri: event["requestURI"].as_str().unwrap_or("").to_string(),
        at: event["requestReceivedTimestamp"]
            .as_str()
            .and_then(|t| humantime::parse_rfc3339(t).ok())
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0.0, |d| d.as_secs_f64()),
    })
}
