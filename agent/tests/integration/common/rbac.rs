//! RBAC as the API server's authorizer decides it (k8s.io/kubernetes
//! `plugin/pkg/auth/authorizer/rbac/rbac.go`, `RuleAllows`): a request is allowed when a rule of a
//! Role bound in the request's namespace, or of a ClusterRole bound cluster-wide (or in that
//! namespace), matches its API group, resource (`resource/subresource`), verb and name.

use serde_json::Value;

/// What the authorizer sees of one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attributes {
    pub verb: String,
    pub api_group: String,
    pub resource: String,
    pub subresource: String,
    pub namespace: Option<String>,
    pub name: Option<String>,
}

impl Attributes {
    /// The attributes of a request to the core API (`/api/v1/…`) or a named group
    /// (`/apis/<group>/<version>/…`), as the API server's request-info resolver derives them
    /// (k8s.io/apiserver `pkg/endpoints/request/requestinfo.go`).
    pub fn from_request(method: &str, path: &str, query: &str) -> Option<Attributes> {
        let (api_group, rest) = match path.strip_prefix("/api/v1/") {
            Some(rest) => ("", rest),
            None => {
                let mut named = path.strip_prefix("/apis/")?.splitn(3, '/');
                let (group, _version, rest) = (named.next()?, named.next()?, named.next()?);
                (group, rest)
            }
        };
        let parts: Vec<&str> = rest.split('/').collect();
        let (namespace, rest) = match parts.as_slice() {
            ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some(ns.to_string()), rest),
            rest => (None, rest),
        };
        let (resource, name, subresource) = match rest {
            [resource] => (*resource, None, ""),
            [resource, name] => (*resource, Some(name.to_string()), ""),
            [resource, name, sub] => (*resource, Some(name.to_string()), *sub),
            _ => return None,
        };
        let watching = query
            .split('&')
            .any(|kv| kv == "watch=true" || kv == "watch=1");
        let verb = match (method, name.is_some()) {
            ("GET", _) if watching => "watch",
            ("GET", true) => "get",
            ("GET", false) => "list",
            ("POST", _) => "create",
            ("PUT", _) => "update",
            ("PATCH", _) => "patch",
            ("DELETE", true) => "delete",
            ("DELETE", false) => "deletecollection",
            _ => return None,
        };
        Some(Attributes {
            verb: verb.into(),
            api_group: api_group.into(),
            resource: resource.into(),
            subresource: subresource.into(),
            namespace,
            name,
        })
    }
}

/// The rules that apply to one service account, with the namespace each is confined to.
pub struct Rbac {
    rules: Vec<(Option<String>, Value)>,
}

fn binds(binding: &Value, namespace: &str, name: &str) -> bool {
    binding["subjects"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|s| s["kind"] == "ServiceAccount" && s["name"] == name && s["namespace"] == namespace)
}

impl Rbac {
    /// The RBAC objects among `objects` that grant anything to service account `namespace/name`.
    pub fn for_service_account(objects: &[Value], namespace: &str, name: &str) -> Rbac {
        let find_role = |kind: &str, role: &str, ns: Option<&str>| -> Vec<Value> {
            objects
                .iter()
                .filter(|o| {
                    o["kind"] == kind
                        && o["metadata"]["name"] == role
                        && ns.is_none_or(|ns| o["metadata"]["namespace"] == ns)
                })
                .flat_map(|o| o["rules"].as_array().cloned().unwrap_or_default())
                .collect()
        };
        let mut rules = Vec::new();
        for binding in objects.iter().filter(|o| binds(o, namespace, name)) {
            let role_ref = &binding["roleRef"];
            let role = role_ref["name"].as_str().unwrap_or_default();
            let scope = match binding["kind"].as_str() {
                Some("ClusterRoleBinding") => None,
                Some("RoleBinding") => binding["metadata"]["namespace"].as_str().map(String::from),
                _ => continue,
            };
            let granted = match role_ref["kind"].as_str() {
                Some("ClusterRole") => find_role("ClusterRole", role, None),
                Some("Role") => find_role("Role", role, scope.as_deref()),
                _ => Vec::new(),
            };
            rules.extend(granted.into_iter().map(|r| (scope.clone(), r)));
        }
        Rbac { rules }
    }

    pub fn allows(&self, request: &Attributes) -> bool {
        let resource = if request.subresource.is_empty() {
            request.resource.clone()
        } else {
            format!("{}/{}", request.resource, request.subresource)
        };
        self.rules.iter().any(|(scope, rule)| {
            let listed = |field: &str, value: &str| {
                rule[field]
                    .as_array()
                    .is_some_and(|l| l.iter().any(|v| v == value || v == "*"))
            };
            let names_ok = match (rule["resourceNames"].as_array(), &request.name) {
                (None, _) => true,
                (Some(names), _) if names.is_empty() => true,
                (Some(names), Some(name)) => names.iter().any(|n| n == name.as_str()),
                (Some(_), None) => false,
            };
            let scope_ok = scope.is_none() || *scope == request.namespace;
            scope_ok
                && listed("apiGroups", &request.api_group)
                && listed("resources", &resource)
                && listed("verbs", &request.verb)
                && names_ok
        })
    }
}
