"""A loopback API server for the benchmarks in this folder: just what `serve` asks of a real one at
start and while it runs, in the shapes the real server answers (core/v1 Node; a strategic-merge
patch of status.conditions, merged by type; a JSON patch of spec.taints, guarded by a test of the
list; a merge patch of the node's labels; Events; the node's pods, listed and watched). It keeps
one node, no pods, and records when ModelCacheVerified first turns True. Imported by its
neighbours (a script's own folder is on its path)."""
import http.server
import json
import pathlib
import threading
import time


class FakeApiServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, node_name: str, taints=()):
        super().__init__(("127.0.0.1", 0), Handler)
        self.node = {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": node_name, "uid": "9f0e6b1c-0000-4000-8000-000000000001",
                         "resourceVersion": "1", "labels": {}, "annotations": {}},
            "spec": {"taints": [dict(t) for t in taints]},
            "status": {"conditions": []},
        }
        self.agent_taints = {t["key"] for t in taints}
        self.verified_at = None
        self.lock = threading.Lock()
        # Set to end the pod watches, which otherwise send nothing until the server closes.
        self.closing = threading.Event()

    def kubeconfig(self, path: pathlib.Path) -> pathlib.Path:
        server = f"http://127.0.0.1:{self.server_address[1]}"
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "bench",
            "clusters": [{"name": "bench", "cluster": {"server": server}}],
            "users": [{"name": "bench", "user": {"token": "bench"}}],
            "contexts": [{"name": "bench", "context": {"cluster": "bench", "user": "bench"}}],
        }))
        return path

    def condition(self, kind: str):
        with self.lock:
            return next((c for c in self.node["status"]["conditions"] if c["type"] == kind), None)

    def close(self):
        self.closing.set()
        self.shutdown()


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def answer(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def body(self):
        return json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"null")

    def do_GET(self):
        api = self.server
        path = self.path.split("?")[0]
        if path.startswith("/api/v1/pods") and "watch=true" in self.path:
            # A watch with no pod changes: nothing is sent until the server closes.
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            api.closing.wait()
            return
        if path.startswith("/api/v1/pods"):
            return self.answer(200, {"apiVersion": "v1", "kind": "PodList",
                                     "metadata": {"resourceVersion": "1"}, "items": []})
        if path == f"/api/v1/nodes/{api.node['metadata']['name']}":
            with api.lock:
                return self.answer(200, api.node)
        self.answer(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                          "reason": "NotFound", "code": 404})

    def do_PATCH(self):
        api = self.server
        patch = self.body()
        with api.lock:
            node = api.node
            if self.path.split("?")[0].endswith("/status"):
                conditions = {c["type"]: c for c in node["status"]["conditions"]}
                for condition in patch["status"]["conditions"]:
                    conditions[condition["type"]] = condition
                    verified = (condition["type"], condition["status"]) == ("ModelCacheVerified", "True")
                    if verified and api.verified_at is None:
                        api.verified_at = time.monotonic()
                node["status"]["conditions"] = list(conditions.values())
            elif isinstance(patch, list):
                # The agent's only JSON patch here: take its startup taint off, guarded by a test
                # of the list.
                node["spec"]["taints"] = [t for t in node["spec"]["taints"] if t["key"] not in api.agent_taints]
            else:
                node["metadata"]["labels"].update(patch.get("metadata", {}).get("labels", {}))
            node["metadata"]["resourceVersion"] = str(int(node["metadata"]["resourceVersion"]) + 1)
            self.answer(200, node)

    def do_POST(self):
        self.answer(201, self.body())
