#!/usr/bin/env python3
"""Scrape latency, CPU and memory of the NVML collector with 8 fake GPUs.

Runs the release agent against tests/fake-nvml (8 H100s, the agent's default 1 s sample interval),
then: --scrapes sequential scrapes for latency p50/p99; one scrape per second for --seconds, over
which the process's CPU time (sampler + XID thread + scrapes) is divided per scrape; RSS at the end.
The fake library parses its JSON scenario on every call (about 100 calls a second here), so the
CPU figure is an upper bound of what the agent itself spends. The peer, dcgm-exporter, cannot run
without a GPU: docs/performance.md cites its documented resource requests.
"""
import argparse
import http.client
import json
import pathlib
import subprocess
import tempfile
import time

from agent_process import REPO, free_port, sample
from bench_serve import cpu_seconds, memory, scrape, wait_until


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scrapes", type=int, default=1000)
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--out", type=pathlib.Path)
    args = parser.parse_args()

    subprocess.run(["cargo", "build", "--release", "--quiet", "-p", "mlnode-agent", "-p", "fake-nvml"], cwd=REPO, check=True)
    agent = REPO / "target/release/mlnode-agent"
    work = pathlib.Path(tempfile.mkdtemp(prefix="mlnode-gpu-bench-"))
    devices = [{
        "uuid": f"GPU-{i:08d}-1111-2222-3333-444444444444", "name": "NVIDIA H100 80GB HBM3",
        "pci_bus_id": f"00000000:{0x07 + i * 0x10:02X}:00.0",
        "memory": {"total": 85520809984, "used": 1048576000, "free": 83935952896, "reserved": 536281088},
        "clocks_event_reasons": 4, "sm_clock_mhz": 1980, "mem_clock_mhz": 2619, "temperature_c": 45,
        "power_mw": 312500, "utilization": {"gpu": 87, "memory": 40}, "energy_mj": 123456789,
    } for i in range(8)]
    scenario = work / "scenario.json"
    scenario.write_text(json.dumps({"driver_version": "580.95.05", "devices": devices}))
    port = free_port()
    config = work / "config.yaml"
    config.write_text(json.dumps({
        "listen": f"127.0.0.1:{port}", "node_name": "bench", "models": [],
        "nvml": {"library": str(REPO / "target/release/libfake_nvml.so"), "dcgm_names": True},
    }))
    proc = subprocess.Popen([agent, "serve", "--config", config], stderr=subprocess.DEVNULL,
                            env={"FAKE_NVML_SCENARIO": str(scenario), "PATH": "/usr/bin:/bin"})
    try:
        body = wait_until(port, lambda b: sample(b, "mlnode_gpu_count") == 8)
        series = sum(1 for line in body.splitlines() if line and not line.startswith("#"))
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        latencies = []
        for _ in range(args.scrapes):
            start = time.perf_counter()
            scrape(conn)
            latencies.append(time.perf_counter() - start)
        latencies.sort()
        p50 = latencies[len(latencies) // 2] * 1000
        p99 = latencies[int(len(latencies) * 0.99) - 1] * 1000
        cpu_before, started, scrapes = cpu_seconds(proc.pid), time.time(), 0
        while time.time() - started < args.seconds:
            scrape(conn)
            scrapes += 1
            time.sleep(1)
        elapsed = time.time() - started
        cpu = cpu_seconds(proc.pid) - cpu_before
        rss, hwm = memory(proc.pid)
    finally:
        proc.terminate()
        proc.wait()
    lines = [
        "| GPUs | series per scrape | scrape p50 ms | scrape p99 ms | CPU ms per scrape (1/s, sampling included) | CPU % of a core | RSS MiB | peak RSS MiB |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        f"| 8 (fake) | {series} | {p50:.2f} | {p99:.2f} | {1000 * cpu / scrapes:.2f} | {100 * cpu / elapsed:.2f} | {rss:.1f} | {hwm:.1f} |",
    ]
    table = "\n".join(lines)
    print(table)
    if args.out:
        args.out.write_text(table + "\n")


if __name__ == "__main__":
    main()
