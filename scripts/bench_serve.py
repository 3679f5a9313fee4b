#!/usr/bin/env python3
"""Idle cost and scrape latency of `mlnode-agent serve`, beside prometheus-node-exporter, in one run.

Prints one Markdown table (and writes it to --out). For each server:
  * /metrics latency p50/p99 over --scrapes sequential scrapes on one keep-alive connection;
  * CPU seconds per hour when idle with one scrape every 15 s (measured over --idle-seconds, from
    /proc/<pid>/stat), and that as a percentage of one core;
  * RSS after the scrapes (VmRSS) and the peak (VmHWM).
The agent runs with 4 configured models (4 small generated caches). Then, on the 8 x 512 MiB cache that
scripts/bench_verify.py generates (--eight DIR), one 512 MiB file is changed while the agent runs, and
the bytes the incremental re-verification hashed are reported.
Requires: prometheus-node-exporter (Debian), a release build (made here).
"""
import argparse
import http.client
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time

from agent_process import REPO, free_port, sample

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


def memory(pid):
    status = open(f"/proc/{pid}/status").read()
    rss = int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024
    hwm = int(re.search(r"VmHWM:\s+(\d+)", status).group(1)) / 1024
    return rss, hwm


def scrape(conn):
    conn.request("GET", "/metrics")
    response = conn.getresponse()
    body = response.read()
    if response.status != 200:
        sys.exit(f"/metrics answered {response.status}")
    return body


def wait_until(port, check, limit=600):
    started = time.time()
    while time.time() - started < limit:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            body = scrape(conn).decode()
            conn.close()
            if check(body):
                return body
        except OSError:
            pass
        time.sleep(0.2)
    sys.exit(f"condition not met within {limit}s on port {port}")


def measure(name, pid, port, scrapes, idle_seconds):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    for _ in range(20):
        scrape(conn)
    latencies = []
    for _ in range(scrapes):
        start = time.perf_counter()
        scrape(conn)
        latencies.append(time.perf_counter() - start)
    latencies.sort()
    p50 = latencies[len(latencies) // 2] * 1000
    p99 = latencies[int(len(latencies) * 0.99) - 1] * 1000
    cpu_before = cpu_seconds(pid)
    started = time.time()
    while time.time() - started < idle_seconds:
        # The agent closes a connection left idle past its header-read timeout (5 s); Prometheus
        # finds it closed at its next scrape and dials again, and so does this loop.
        idle = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        scrape(idle)
        idle.close()
        time.sleep(15)
    idle_cpu = (cpu_seconds(pid) - cpu_before) / (time.time() - started)
    conn.close()
    rss, hwm = memory(pid)
    return {"name": name, "p50": p50, "p99": p99, "cpu_hour": idle_cpu * 3600, "cpu_pct": idle_cpu * 100, "rss": rss, "hwm": hwm}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scrapes", type=int, default=1000)
    parser.add_argument("--idle-seconds", type=int, default=60)
    parser.add_argument("--eight", type=pathlib.Path, default=pathlib.Path("/tmp/bench"), help="bench_verify.py's --workdir")
    parser.add_argument("--out", type=pathlib.Path)
    args = parser.parse_args()

    subprocess.run(["cargo", "build", "--release", "--quiet", "-p", "mlnode-agent"], cwd=REPO, check=True)
    agent = REPO / "target/release/mlnode-agent"
    work = pathlib.Path(tempfile.mkdtemp(prefix="mlnode-serve-bench-"))
    models = []
    for i in range(4):
        root = work / f"model-{i}"
        shutil.copytree(REPO / "tests/fixtures/tiny-model", root)
        (root / "model-00001-of-00001.safetensors").write_bytes(os.urandom(32 << 20))
        manifest = work / f"model-{i}.json"
        with open(manifest, "w") as f:
            subprocess.run([agent, "manifest", "--revision", f"r{i}", root], stdout=f, check=True)
        models.append({"name": f"model-{i}", "root": str(root), "manifest": str(manifest)})

    rows = []
    port = free_port()
    config = work / "config.yaml"
    config.write_text(json.dumps({"listen": f"127.0.0.1:{port}", "node_name": "bench", "models": models}))
    proc = subprocess.Popen([agent, "serve", "--config", config], stderr=subprocess.DEVNULL)
    try:
        wait_until(port, lambda b: all(sample(b, "mlnode_model_cache_verified", model_name=m["name"]) == 1 for m in models))
        rows.append(measure("mlnode-agent serve (4 models)", proc.pid, port, args.scrapes, args.idle_seconds))
    finally:
        proc.terminate()
        proc.wait()

    ne_port = free_port()
    ne = subprocess.Popen(["prometheus-node-exporter", f"--web.listen-address=127.0.0.1:{ne_port}"], stderr=subprocess.DEVNULL)
    try:
        time.sleep(1)
        rows.append(measure("prometheus-node-exporter (Debian defaults)", ne.pid, ne_port, args.scrapes, args.idle_seconds))
    finally:
        ne.terminate()
        ne.wait()

    lines = [
        "| server | scrape p50 ms | scrape p99 ms | idle CPU s/hour | idle CPU % of a core | RSS MiB | peak RSS MiB |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(f"| {r['name']} | {r['p50']:.2f} | {r['p99']:.2f} | {r['cpu_hour']:.1f} | {r['cpu_pct']:.3f} | {r['rss']:.1f} | {r['hwm']:.1f} |")
    ours, peer = rows
    lines.append("")
    lines.append(f"Ratios (node-exporter / mlnode-agent): p99 {peer['p99'] / ours['p99']:.1f}x, RSS {peer['rss'] / ours['rss']:.1f}x.")

    eight = args.eight / "eight"
    if (eight / "model-00008-of-00008.safetensors").exists():
        port = free_port()
        config.write_text(json.dumps({"listen": f"127.0.0.1:{port}", "node_name": "bench",
                                      "models": [{"name": "eight", "root": str(eight), "manifest": str(args.eight / "eight.manifest.json")}]}))
        proc = subprocess.Popen([agent, "serve", "--config", config], stderr=subprocess.DEVNULL)
        target = eight / "model-00003-of-00008.safetensors"
        try:
            body = wait_until(port, lambda b: sample(b, "mlnode_model_cache_verified", model_name="eight") == 1)
            before = sample(body, "mlnode_model_cache_hashed_bytes_total", model_name="eight")
            with open(target, "r+b") as f:
                f.seek(1000)
                original = f.read(1)
                f.seek(1000)
                f.write(bytes([original[0] ^ 0xFF]))
            changed = time.time()
            body = wait_until(port, lambda b: sample(b, "mlnode_model_cache_files", model_name="eight", status="digest_mismatch") == 1)
            seconds = time.time() - changed
            after = sample(body, "mlnode_model_cache_hashed_bytes_total", model_name="eight")
            lines.append("")
            lines.append(
                f"Incremental re-verification: one 512 MiB file changed in a {8 * 512} MiB cache; the agent hashed "
                f"{(after - before) / 2**20:.0f} MiB and reported digest_mismatch {seconds:.2f} s after the write."
            )
        finally:
            with open(target, "r+b") as f:
                f.seek(1000)
                f.write(original)
            proc.terminate()
            proc.wait()
    table = "\n".join(lines)
    print(table)
    if args.out:
        args.out.write_text(table + "\n")
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
