#!/usr/bin/env python3
"""Memory per manifest file: `mlnode-agent serve` (release build) on one model of N small files,
peak resident memory (VmHWM) once its first verification is done, for each N given.

  python3 scripts/bench_manifest_memory.py [N ...]     (default: 10000 100000)

Prints one Markdown table: files, peak RSS, bytes per file, and whether it fits the memory limit
of the DaemonSet in deploy/daemonset/base (read from it). Caches are generated under a temporary directory (one small file each, 1,000
per folder) and removed afterwards; traffic stays on 127.0.0.1.
"""
import hashlib
import json
import pathlib
import re
import shutil
import sys
import tempfile

import agent_process



def daemonset_memory_limit_mib() -> int:
    text = (agent_process.REPO / "deploy/daemonset/base/daemonset.yaml").read_text()
    return int(re.search(r"limits:\s*\n\s*memory:\s*(\d+)Mi", text).group(1))


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
    agent, port = agent_process.serve(
        binary,
        {"node_name": "bench", "nvml": {"enabled": False}, "neuron": {"enabled": False},
         "models": [{"name": "m", "root": str(root), "manifest": str(manifest)}]},
        root.parent,
    )
    try:
        agent_process.wait_ready(port, 1800, str(root))
        status = open(f"/proc/{agent.pid}/status").read()
        return int(re.search(r"VmHWM:\s+(\d+)", status).group(1)) / 1024
    finally:
        agent.terminate()
        agent.wait(timeout=10)


def main():
    sizes = [int(a) for a in sys.argv[1:]] or [10_000, 100_000]
    binary = agent_process.release_binary()
    limit = daemonset_memory_limit_mib()
    print(f"| files | peak RSS (MiB) | bytes per file | under the {limit} MiB limit |")
    print("| ---: | ---: | ---: | --- |")
    for n in sizes:
        work = pathlib.Path(tempfile.mkdtemp(prefix="mlnode-mem-"))
        try:
            root = work / "model"
            manifest = make_cache(root, n)
            peak = peak_rss_after_verification(binary, root, manifest)
            print(f"| {n:,} | {peak:.1f} | {peak * 1024 * 1024 / n:,.0f} | {'yes' if peak < limit else 'no'} |", flush=True)
        finally:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
