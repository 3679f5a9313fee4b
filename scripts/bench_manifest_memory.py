#!/usr/bin/env python3
"""Memory per manifest file: `mlnode-agent serve` (release build) on one model of N small files,
peak resident memory (VmHWM) once its first verification is done, for each N given.

  python3 scripts/bench_manifest_memory.py [N ...]     (default: 10000 100000)

Prints one Markdown table: files, peak RSS, bytes per file, and whether it fits the DaemonSet's
128 MiB memory limit. Caches are generated under a temporary directory (one small file each, 1,000
per folder) and removed afterwards; traffic stays on 127.0.0.1.
"""
import hashlib
import http.client
import json
import os
import pathlib
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
LIMIT_MIB = 128


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_cache(root: pathlib.Path, n: int) -> pathlib.Path:
    files = {}
    for i in range(n):
        folder = root / f"d{i // 1000:04d}"
        folder.mkdir(parents=True, exist_ok=True)
        data = f"file {i}\n".encode()
        (folder / f"f{i:07d}.bin").write_bytes(data)
        files[f"d{i // 1000:04d}/f{i:07d}.bin"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    manifest = root.with_suffix(".json")
    manifest.write_text(json.dumps({"revision": "r", "files": files}))
    return manifest


def peak_rss_after_verification(binary: pathlib.Path, root: pathlib.Path, manifest: pathlib.Path) -> float:
    port = free_port()
    config = root.with_suffix(".yaml")
    config.write_text(json.dumps({"listen": f"127.0.0.1:{port}", "node_name": "bench",
                                  "nvml": {"enabled": False}, "neuron": {"enabled": False},
                                  "models": [{"name": "m", "root": str(root), "manifest": str(manifest)}]}))
    agent = subprocess.Popen([binary, "serve", "--config", config], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 1800
        while time.time() < deadline:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                conn.request("GET", "/readyz")
                if conn.getresponse().status == 200:
                    break
            except OSError:
                pass
            time.sleep(0.5)
        else:
            sys.exit(f"{root}: not verified within 30 minutes")
        status = open(f"/proc/{agent.pid}/status").read()
        return int(re.search(r"VmHWM:\s+(\d+)", status).group(1)) / 1024
    finally:
        agent.terminate()
        agent.wait(timeout=10)


def main():
    sizes = [int(a) for a in sys.argv[1:]] or [10_000, 100_000]
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "mlnode-agent"], cwd=REPO, check=True)
    binary = REPO / "target/release/mlnode-agent"
    print("| files | peak RSS (MiB) | bytes per file | under the 128 MiB limit |")
    print("| ---: | ---: | ---: | --- |")
    for n in sizes:
        work = pathlib.Path(tempfile.mkdtemp(prefix="mlnode-mem-"))
        try:
            root = work / "model"
            manifest = make_cache(root, n)
            peak = peak_rss_after_verification(binary, root, manifest)
            print(f"| {n:,} | {peak:.1f} | {peak * 1024 * 1024 / n:,.0f} | {'yes' if peak < LIMIT_MIB else 'no'} |", flush=True)
        finally:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
