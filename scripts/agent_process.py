"""The release agent as a child process, for the scripts in this folder that measure it: build it,
start `serve` on a loopback port with a config given as a dict, and wait until every model is
verified (`/readyz` 200). Imported by its neighbours (a script's own folder is on its path)."""
import http.client
import json
import os
import pathlib
import socket
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parent.parent


def release_binary() -> pathlib.Path:
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "mlnode-agent"], cwd=REPO, check=True)
    return REPO / "target/release/mlnode-agent"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(binary: pathlib.Path, config: dict, work: pathlib.Path, log=subprocess.DEVNULL, env=None):
    """Starts `serve` with `config` (its `listen` set to a free loopback port) and `env` added to
    this process's environment; returns the process and the port."""
    port = free_port()
    path = work / "config.yaml"
    path.write_text(json.dumps({**config, "listen": f"127.0.0.1:{port}"}))
    agent = subprocess.Popen([binary, "serve", "--config", path], stdout=subprocess.DEVNULL, stderr=log,
                             env={**os.environ, **(env or {})})
    return agent, port


def metrics(port: int) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request("GET", "/metrics")
    return conn.getresponse().read().decode()


def sample(body: str, name: str, **labels):
    """The value of the first sample of `name` carrying `labels`, or None."""
    for line in body.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


def wait_ready(port: int, limit_seconds: float, what: str):
    """Polls /readyz until every model is verified; exits with `what` after `limit_seconds`."""
    deadline = time.time() + limit_seconds
    while time.time() < deadline:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/readyz")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    sys.exit(f"{what}: not verified within {limit_seconds:.0f} s")
