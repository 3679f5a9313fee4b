#!/usr/bin/env python3
"""Soak: `mlnode-agent serve` (release build) with 4 models under file churn and scrapes, for a
bounded time, printing resident memory, open file descriptors and threads at the start and the end.

  python3 scripts/soak.py [--seconds 600] [--scrapers 4]

Every second each model gets churn that the agent must follow: one of its files rewritten with a
corrupt byte and restored, a stray file created and removed, a directory renamed back and forth.
Scrapers hit /metrics continuously on loopback. The agent must answer every scrape, and its fds and
threads must not grow; RSS is printed for the reader to judge (allocator caches move it a little).
All traffic stays on 127.0.0.1; the loops stop by themselves at --seconds.
"""
import argparse
import hashlib
import http.client
import json
import os
import pathlib
import re
import sys
import tempfile
import threading
import time

import agent_process



def usage(pid):
    status = open(f"/proc/{pid}/status").read()
    rss = int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024
    threads = int(re.search(r"Threads:\s+(\d+)", status).group(1))
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    return rss, fds, threads


def make_model(root: pathlib.Path, seed: int):
    files = {}
    for i in range(6):
        data = hashlib.sha256(f"{seed}-{i}".encode()).digest() * (2048 * (i + 1))
        path = root / ("weights" if i % 2 else ".") / f"part-{i}.safetensors"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        files[str(path.relative_to(root))] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    return files


def churn(root: pathlib.Path, stop: threading.Event, errors: list):
    target = root / "part-0.safetensors"
    original = target.read_bytes()
    n = 0
    while not stop.is_set():
        try:
            target.write_bytes(b"\0" + original[1:])
            target.write_bytes(original)
            stray = root / f"stray-{n}.tmp"
            stray.write_bytes(b"x")
            stray.unlink()
            (root / "weights").rename(root / "weights-moved")
            (root / "weights-moved").rename(root / "weights")
        except OSError as e:
            errors.append(f"churn: {e}")
        n += 1
        stop.wait(1.0)


def scraper(port: int, stop: threading.Event, counts: dict, errors: list):
    while not stop.is_set():
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/metrics")
            response = conn.getresponse()
            response.read()
            conn.close()
            if response.status == 200:
                counts["ok"] += 1
            else:
                errors.append(f"/metrics answered {response.status}")
        except OSError as e:
            errors.append(f"scrape: {e}")
        stop.wait(0.05)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=int, default=600)
    parser.add_argument("--scrapers", type=int, default=4)
    args = parser.parse_args()
    if not 10 <= args.seconds <= 3600:
        sys.exit("--seconds must be between 10 and 3600")

    binary = agent_process.release_binary()
    work = pathlib.Path(tempfile.mkdtemp(prefix="mlnode-soak-"))
    models = []
    for i in range(4):
        root = work / f"model-{i}"
        root.mkdir()
        manifest = work / f"model-{i}.json"
        manifest.write_text(json.dumps({"revision": "soak", "files": make_model(root, i)}))
        models.append({"name": f"model-{i}", "root": str(root), "manifest": str(manifest)})
    agent, port = agent_process.serve(
        binary,
        {"node_name": "soak", "models": models, "verify": {"debounce": "200ms"},
         "nvml": {"enabled": False}, "neuron": {"enabled": False}},
        work,
        log=open(work / "agent.log", "w"),
    )
    try:
        agent_process.wait_ready(port, 60, "the soak's models")
        before = usage(agent.pid)
        stop = threading.Event()
        errors: list = []
        counts = {"ok": 0}
        threads = [threading.Thread(target=churn, args=(pathlib.Path(m["root"]), stop, errors)) for m in models]
        threads += [threading.Thread(target=scraper, args=(port, stop, counts, errors)) for _ in range(args.scrapers)]
        for t in threads:
            t.start()
        time.sleep(args.seconds)
        stop.set()
        for t in threads:
            t.join()
        # Idle again: tokio keeps an idle blocking thread for 10 s, so wait for the count to settle
        # (bounded) before comparing; a leak does not settle.
        settled = time.time() + 30
        after = usage(agent.pid)
        while time.time() < settled and (after[2] > before[2] + 2 or after[1] > before[1] + 4):
            time.sleep(1)
            after = usage(agent.pid)
    finally:
        agent.terminate()
        agent.wait(timeout=10)
    print(f"soak: {args.seconds} s, 4 models under churn, {args.scrapers} scrapers, {counts['ok']} scrapes answered, {len(errors)} errors")
    print("| | RSS MiB | fds | threads |")
    print("| --- | --- | --- | --- |")
    print(f"| start | {before[0]:.1f} | {before[1]} | {before[2]} |")
    print(f"| end (idle) | {after[0]:.1f} | {after[1]} | {after[2]} |")
    for e in errors[:10]:
        print("error:", e)
    if errors or after[1] > before[1] + 4 or after[2] > before[2] + 2:
        sys.exit(1)


if __name__ == "__main__":
    main()
