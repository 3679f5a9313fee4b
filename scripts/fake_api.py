"""A loopback API server for the benchmarks in this folder: just what `serve` asks of a real one at
start and while it runs, in the shapes the real server answers (core/v1 Node; a strategic-merge
patch of status.conditions, merged by type; a JSON patch of spec.taints, guarded by a test of the
list; a merge patch of the node's labels; Events; the node's pods listed, watched and their status
patched). It keeps any number of nodes and their pods, counts every request by verb, resource and
code as kube-apiserver's `apiserver_request_total` does, ends each watch after the `timeoutSeconds`
the client asked for (times `watch_scale`, for benchmarks that drive time faster), and answers
everything with API Priority and Fairness' 429 while `throttle` is set. It records when
ModelCacheVerified first turns True. Imported by its neighbours (a script's own folder is on its
path)."""
import collections
import http.server
import json
import pathlib
import queue
import threading
import time
import urllib.parse


def classify(method: str, path: str, query: dict) -> tuple:
    """A request's verb and resource as apiserver_request_total names them (get, list, watch,
    create, patch; `pods/status`)."""
    parts = path.strip("/").split("/")
    rest = parts[2:] if parts[:1] == ["api"] else parts[3:]
    if rest[:1] == ["namespaces"] and len(rest) > 2:
        rest = rest[2:]
    resource = rest[0] if rest else "other"
    if len(rest) > 2:
        resource += "/" + rest[2]
    named = len(rest) > 1
    if method == "GET":
        verb = "watch" if query.get("watch") in ("true", "1") else "get" if named else "list"
    else:
        verb = {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}.get(method, "other")
    return verb, resource


def merge_conditions(status: dict, patch_conditions: list):
    """A strategic-merge patch of `status.conditions`: merged on `type`, as core/v1 declares."""
    conditions = {c["type"]: c for c in status.get("conditions", [])}
    for condition in patch_conditions:
        conditions[condition["type"]] = {**conditions.get(condition["type"], {}), **condition}
    status["conditions"] = list(conditions.values())


class FakeApiServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024

    def __init__(self, node_names, taints=(), watch_scale: float = 1.0):
        super().__init__(("127.0.0.1", 0), Handler)
        names = [node_names] if isinstance(node_names, str) else list(node_names)
        self.nodes = {name: self.new_node(name, i, taints) for i, name in enumerate(names)}
        self.agent_taints = {t["key"] for t in taints}
        self.pods = {name: {} for name in names}  # node -> uid -> pod
        self.watchers = collections.defaultdict(list)  # node -> [queue]
        self.history = collections.defaultdict(list)  # node -> [(resourceVersion, event line)]
        self.counts = collections.Counter()  # (verb, resource, code) -> requests
        self.resource_version = 1
        self.watch_scale = watch_scale
        self.throttle = None  # Retry-After seconds while set
        self.verified_at = None
        self.lock = threading.Lock()
        # Set to end the watches, which otherwise send nothing until their timeout.
        self.closing = threading.Event()

    @staticmethod
    def new_node(name, i, taints):
        return {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "uid": f"9f0e6b1c-0000-4000-8000-{i:012d}",
                         "resourceVersion": "1", "labels": {"kubernetes.io/hostname": name}, "annotations": {}},
            "spec": {"taints": [dict(t) for t in taints]},
            "status": {"conditions": []},
        }

    @property
    def node(self):
        return next(iter(self.nodes.values()))

    def kubeconfig(self, path: pathlib.Path) -> pathlib.Path:
        server = f"http://127.0.0.1:{self.server_address[1]}"
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "bench",
            "clusters": [{"name": "bench", "cluster": {"server": server}}],
            "users": [{"name": "bench", "user": {"token": "bench"}}],
            "contexts": [{"name": "bench", "context": {"cluster": "bench", "user": "bench"}}],
        }))
        return path

    def condition(self, kind: str, node: str = None):
        with self.lock:
            conditions = (self.nodes[node] if node else self.node)["status"]["conditions"]
            return next((c for c in conditions if c["type"] == kind), None)

    def pod_condition(self, node: str, uid: str, kind: str):
        with self.lock:
            pod = self.pods[node].get(uid)
            conditions = pod["status"].get("conditions", []) if pod else []
            return next((c for c in conditions if c["type"] == kind), None)

    def next_version(self) -> str:
        self.resource_version += 1
        return str(self.resource_version)

    def put_pod(self, node: str, pod: dict):
        """Adds or replaces a pod bound to `node`, and tells the node's watches."""
        with self.lock:
            kind = "MODIFIED" if pod["metadata"]["uid"] in self.pods[node] else "ADDED"
            pod["metadata"]["resourceVersion"] = self.next_version()
            self.pods[node][pod["metadata"]["uid"]] = pod
            self.tell(node, kind, pod)

    def delete_pod(self, node: str, uid: str):
        with self.lock:
            pod = self.pods[node].pop(uid)
            pod["metadata"]["resourceVersion"] = self.next_version()
            self.tell(node, "DELETED", pod)

    def tell(self, node: str, kind: str, obj: dict):
        line = (json.dumps({"type": kind, "object": obj}) + "\n").encode()
        self.history[node].append((int(obj["metadata"]["resourceVersion"]), line))
        for watcher in self.watchers[node]:
            watcher.put(line)

    def snapshot(self) -> collections.Counter:
        with self.lock:
            return collections.Counter(self.counts)

    def close(self):
        self.closing.set()
        self.shutdown()


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def answer(self, status, body, counted=True):
        api = self.server
        if counted:
            with api.lock:
                api.counts[(*self.kind, str(status))] += 1
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def not_found(self):
        self.answer(404, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                          "reason": "NotFound", "code": 404})

    def body(self):
        return json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"null")

    def route(self) -> bool:
        """Parses the request; answers it at once (and returns False) while throttled."""
        url = urllib.parse.urlsplit(self.path)
        self.path_only = url.path
        self.query = dict(urllib.parse.parse_qsl(url.query))
        self.kind = classify(self.command, url.path, self.query)
        api = self.server
        retry_after = api.throttle
        if retry_after is None:
            return True
        # What API Priority and Fairness answers a request it rejects (kube-apiserver,
        # staging/src/k8s.io/apiserver/pkg/server/filters/priority-and-fairness.go -> maxinflight.go
        # tooManyRequests): 429, Retry-After in seconds, a plain-text body. The request's own body
        # was read by then.
        with api.lock:
            api.counts[(*self.kind, "429")] += 1
        data = b"Too many requests, please try again later.\n"
        self.send_response(429)
        self.send_header("Retry-After", str(retry_after))
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        return False

    def node_of_selector(self):
        selector = self.query.get("fieldSelector", "")
        return selector.split("spec.nodeName=", 1)[1].split(",")[0] if "spec.nodeName=" in selector else None

    def do_GET(self):
        if not self.route():
            return
        api = self.server
        path = self.path_only
        if path == "/api/v1/pods":
            node = self.node_of_selector()
            if self.kind[0] == "watch":
                return self.watch(node)
            with api.lock:
                items = list(api.pods.get(node, {}).values()) if node else \
                    [p for pods in api.pods.values() for p in pods.values()]
                version = str(api.resource_version)
            return self.answer(200, {"apiVersion": "v1", "kind": "PodList",
                                     "metadata": {"resourceVersion": version}, "items": items})
        if path.startswith("/api/v1/nodes/"):
            name = path.rsplit("/", 1)[1]
            with api.lock:
                node = api.nodes.get(name)
                body = json.loads(json.dumps(node)) if node else None
            return self.answer(200, body) if body else self.not_found()
        self.not_found()

    def watch(self, node):
        """Events of the node's pods, one JSON object a line: first every event after the
        resourceVersion the client watches from (as the API server's watch cache replays them),
        then each as it happens, until the client's timeoutSeconds (as kube-apiserver ends a
        watch) scaled by `watch_scale`, or the server closes."""
        api = self.server
        since = int(self.query.get("resourceVersion") or 0)
        with api.lock:
            api.counts[(*self.kind, "200")] += 1
            events = queue.Queue()
            for version, line in api.history[node]:
                if since and version > since:
                    events.put(line)
            api.watchers[node].append(events)
        ends = time.monotonic() + float(self.query.get("timeoutSeconds", 1800)) * api.watch_scale
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            while not api.closing.is_set():
                left = ends - time.monotonic()
                if left <= 0:
                    break
                try:
                    line = events.get(timeout=min(left, 0.5))
                except queue.Empty:
                    continue
                self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        except OSError:
            pass
        finally:
            with api.lock:
                api.watchers[node].remove(events)

    def do_PATCH(self):
        patch = self.body()
        if not self.route():
            return
        api = self.server
        parts = self.path_only.strip("/").split("/")
        if self.kind[1] == "pods/status":
            namespace, name = parts[3], parts[5]
            with api.lock:
                found = next(((n, p) for n, pods in api.pods.items() for p in pods.values()
                              if p["metadata"]["namespace"] == namespace and p["metadata"]["name"] == name), None)
                if found:
                    node, pod = found
                    merge_conditions(pod["status"], patch["status"]["conditions"])
                    pod["metadata"]["resourceVersion"] = api.next_version()
                    api.tell(node, "MODIFIED", pod)
                    body = json.loads(json.dumps(pod))
            return self.answer(200, body) if found else self.not_found()
        with api.lock:
            node = api.nodes.get(parts[3])
            if node is None:
                body = None
            elif self.kind[1] == "nodes/status":
                merge_conditions(node["status"], patch["status"]["conditions"])
                verified = any((c["type"], c["status"]) == ("ModelCacheVerified", "True")
                               for c in patch["status"]["conditions"])
                if verified and api.verified_at is None:
                    api.verified_at = time.monotonic()
            elif isinstance(patch, list):
                # The agent's only JSON patch here: take its startup taint off, guarded by a test
                # of the list.
                node["spec"]["taints"] = [t for t in node["spec"]["taints"] if t["key"] not in api.agent_taints]
            else:
                node["metadata"]["labels"].update(patch.get("metadata", {}).get("labels", {}))
            if node is not None:
                node["metadata"]["resourceVersion"] = api.next_version()
                body = json.loads(json.dumps(node))
        return self.answer(200, body) if body else self.not_found()

    def do_POST(self):
        event = self.body()
        if not self.route():
            return
        self.answer(201, event)
