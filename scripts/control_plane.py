"""The tests' real control plane (kube-apiserver and etcd from tests/programs/control-plane, the program
scripts/test.sh builds into target/control-plane) for the scripts in this folder that measure the
agent against an API server: started on loopback with one Node, read over TLS with the admin's
client certificate. Imported by its neighbours (a script's own folder is on its path)."""
import base64
import json
import pathlib
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

REPO = pathlib.Path(__file__).resolve().parent.parent
BINARY = REPO / "target/control-plane/control-plane"
KUBECTL = shutil.which("kubectl") or str(REPO / "target/tools/kubectl")


class ControlPlane:
    """A kube-apiserver with its etcd, holding the Node `node` (with `taints`). Use as a context
    manager: the server and its folder go when the block ends."""

    def __init__(self, node: str, taints=()):
        if not BINARY.is_file():
            raise SystemExit(f"{BINARY} is not built: scripts/test.sh builds it with Go")
        self.node_name = node
        self.taints = [dict(t) for t in taints]
        self.folder = tempfile.TemporaryDirectory(prefix="mlnode-bench-control-plane-")
        self.dir = pathlib.Path(self.folder.name)
        self.kubeconfig = self.dir / "admin.kubeconfig"
        self.process = subprocess.Popen(
            [BINARY, "--dir", self.dir / "state", "--kubeconfig", self.kubeconfig],
            stdout=subprocess.DEVNULL, stderr=open(self.dir / "control-plane.log", "w"))
        deadline = time.monotonic() + 120
        while not self.kubeconfig.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise SystemExit(f"the control plane did not start: see {self.dir / 'control-plane.log'}")
            time.sleep(0.1)
        self.server, self.tls = self._connection()
        self.reset_node()

    def _connection(self):
        # kubectl reads the YAML the control plane writes (scripts/test.sh installs it).
        config = json.loads(subprocess.run(
            [KUBECTL, "config", "view", "--raw", "-o", "json", "--kubeconfig", self.kubeconfig],
            check=True, capture_output=True, text=True).stdout)
        cluster = config["clusters"][0]["cluster"]
        user = config["users"][0]["user"]
        files = {}
        for key in ("certificate-authority-data", "client-certificate-data", "client-key-data"):
            path = self.dir / key
            path.write_bytes(base64.b64decode(cluster.get(key) or user[key]))
            files[key] = path
        tls = ssl.create_default_context(cafile=files["certificate-authority-data"])
        tls.load_cert_chain(files["client-certificate-data"], files["client-key-data"])
        return cluster["server"], tls

    def request(self, method: str, path: str, body=None, content_type="application/json"):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.server + path, data=data, method=method,
                                         headers={"Content-Type": content_type})
        try:
            with urllib.request.urlopen(request, context=self.tls, timeout=30) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return None
            raise

    def reset_node(self):
        """The Node as a fresh one: deleted if there, then created with the taints."""
        name = urllib.parse.quote(self.node_name)
        self.request("DELETE", f"/api/v1/nodes/{name}")
        deadline = time.monotonic() + 30
        while self.request("GET", f"/api/v1/nodes/{name}") is not None:
            if time.monotonic() > deadline:
                raise SystemExit(f"node {self.node_name} was not deleted")
            time.sleep(0.05)
        self.request("POST", "/api/v1/nodes", {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": self.node_name, "labels": {"kubernetes.io/hostname": self.node_name}},
            "spec": {"taints": self.taints},
        })

    def node(self) -> dict:
        return self.request("GET", f"/api/v1/nodes/{urllib.parse.quote(self.node_name)}")

    def condition(self, kind: str):
        conditions = (self.node().get("status") or {}).get("conditions") or []
        return next((c for c in conditions if c["type"] == kind), None)

    def close(self):
        if self.process.poll() is None:
            # The control plane stops etcd and the server on SIGTERM.
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.folder.cleanup()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

