#!/usr/bin/env python3
"""What hostile or heavy input costs the agent, before and after a change, in one run: the release
binary of this tree beside another (`--before`, e.g. one built from the previous commit).

1. A Hugging Face cache's tree listing checked without a manifest: N listed files, half of them
   downloaded (blob and link), no manifest. Seconds and peak RSS of `verify`.
2. A certificate bundle (made by the real model_signing, tests/model_signing/sign.py) whose chain is
   padded with decoy certificates. Seconds and peak RSS of `verify --certificate-chain`, exit code.
3. Clients that pipeline complete requests and never read the replies, against `serve` limited to
   1,024 descriptors: whether /metrics still answers within 30 s, how soon, and the agent's
   descriptors at the end.

usage: bench_hostile.py [--before BINARY] [--runs N]

With --runs N, case 3 runs N times per binary, a row each: whether /metrics is answered every time,
within a scrape timeout (10 s), is what matters, and one run says little about that.
"""
import argparse
import hashlib
import json
import os
import pathlib
import resource
import socket
import subprocess
import sys
import tempfile
import time

import agent_process

REPO = agent_process.REPO
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def timed(command, **kwargs):
    """Runs `command`; its exit code, wall seconds and peak RSS in MiB (of this child alone: each
    runs in a fresh `python3 -c` wrapper so that getrusage's maximum is its own)."""
    wrapper = ("import resource,subprocess,sys,time;t=time.time();"
               "r=subprocess.run(sys.argv[1:],stdout=subprocess.DEVNULL,stderr=subprocess.DEVNULL);"
               "print(r.returncode,time.time()-t,resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    out = subprocess.run([sys.executable, "-c", wrapper, *map(str, command)], capture_output=True,
                         text=True, check=True, **kwargs).stdout.split()
    return int(out[0]), float(out[1]), int(out[2]) / 1024


def tree_listing_cache(work: pathlib.Path, listed: int) -> pathlib.Path:
    """A hub repo cache whose tree listing (huggingface_hub's `trees/<commit>.json`, format 1, as
    `_tree_cache.py` writes it) names `listed` files, every second one downloaded."""
    root = work / f"hub-{listed}" / "models--org--wide"
    (root / "blobs").mkdir(parents=True)
    (root / "refs").mkdir()
    (root / "refs/main").write_text(COMMIT)
    snapshot = root / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    files = {}
    for i in range(listed):
        content = f"shard {i}\n".encode()
        sha = hashlib.sha256(content).hexdigest()
        name = f"shards/{i:06}.bin"
        files[name] = {"size": 134, "blob_id": hashlib.sha1(name.encode()).hexdigest(),
                       "lfs_sha256": sha, "lfs_size": len(content)}
        if i % 2 == 0:
            (root / "blobs" / sha).write_bytes(content)
            link = snapshot / name
            link.parent.mkdir(exist_ok=True)
            link.symlink_to(f"../../../blobs/{sha}")
    (root / "trees").mkdir()
    (root / "trees" / f"{COMMIT}.json").write_text(json.dumps({"format_version": 1, "files": files}))
    return root


def decoy_bundle(work: pathlib.Path, decoys: int) -> tuple[pathlib.Path, pathlib.Path, pathlib.Path]:
    model, keys = work / "signed-model", work / "keys"
    if not model.exists():
        model.mkdir()
        (model / "config.json").write_text("{}")
        (model / "model.safetensors").write_bytes(os.urandom(1 << 20))
        keys.mkdir()
        subprocess.run([sys.executable, REPO / "tests/model_signing/sign.py", model, work / "model.sig", keys,
                        "certificate"], check=True, capture_output=True)
    bundle = json.loads((work / "model.sig").read_text())
    chain = bundle["verificationMaterial"]["x509CertificateChain"]["certificates"]
    chain.extend([chain[-1]] * decoys)
    path = work / f"decoys-{decoys}.sig"
    path.write_text(json.dumps(bundle))
    return model, path, keys / "ca.pem"


def slow_readers(binary: pathlib.Path, work: pathlib.Path, clients: int) -> tuple[str, str, int]:
    """`serve` under a 1,024-descriptor limit and `clients` connections that pipeline requests and
    never read: seconds until /metrics answers (or "never" within 30 s), and the agent's descriptors."""
    model = work / "tiny"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text("{}")
    manifest = work / "tiny.json"
    manifest.write_text(json.dumps({"files": {"config.json": hashlib.sha256(b"{}").hexdigest()}}))
    port = agent_process.free_port()
    config = work / "serve.yaml"
    config.write_text(json.dumps({"listen": f"127.0.0.1:{port}",
                                  "models": [{"name": "m", "root": str(model), "manifest": str(manifest)}]}))
    agent = subprocess.Popen(["prlimit", "--nofile=1024:1024", binary, "serve", "--config", config],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        agent_process.wait_ready(port, 20, "slow readers")
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 8192), hard))
        requests = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" * 300
        held = []
        for _ in range(clients):
            try:
                s = socket.create_connection(("127.0.0.1", port), timeout=2)
                s.setblocking(False)
                try:
                    s.send(requests)
                except OSError:
                    pass
                held.append(s)
            except OSError:
                pass
        started = time.time()
        answered = "never"
        while time.time() - started < 30:
            try:
                agent_process.metrics(port)
                answered = f"{time.time() - started:.1f}"
                break
            except OSError:
                time.sleep(0.2)
        descriptors = len(os.listdir(f"/proc/{agent.pid}/fd"))
        for s in held:
            s.close()
        return answered, str(len(held)), descriptors
    finally:
        agent.kill()
        agent.wait()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", type=pathlib.Path, help="the binary to compare with")
    parser.add_argument("--runs", type=int, default=1, help="how many times to run case 3 per binary")
    args = parser.parse_args()
    binaries = [("after", agent_process.release_binary())]
    if args.before:
        binaries.insert(0, ("before", args.before))
    rows = ["| case | binary | result | seconds | peak RSS MiB |", "| --- | --- | --- | ---: | ---: |"]
    with tempfile.TemporaryDirectory(dir="/dev/shm") as tmp:
        work = pathlib.Path(tmp)
        for listed in [12_000, 20_000]:
            root = tree_listing_cache(work, listed)
            for label, binary in binaries:
                code, seconds, rss = timed([binary, "verify", root])
                rows.append(f"| tree listing, {listed:,} listed, half downloaded | {label} | exit {code} | "
                            f"{seconds:.2f} | {rss:.1f} |")
        for decoys in [50_000, 100_000]:
            model, bundle, ca = decoy_bundle(work, decoys)
            size = bundle.stat().st_size / 1e6
            for label, binary in binaries:
                code, seconds, rss = timed([binary, "verify", "--manifest", bundle, "--certificate-chain", ca, model])
                rows.append(f"| bundle with {decoys:,} decoy certificates ({size:.0f} MB) | {label} | exit {code} | "
                            f"{seconds:.2f} | {rss:.1f} |")
        for run in range(1, args.runs + 1):
            for label, binary in binaries:
                answered, held, descriptors = slow_readers(binary, work, 1_100)
                rows.append(f"| 1,100 pipelining clients that never read, 1,024 descriptors, run {run} | {label} | "
                            f"/metrics answered after {answered} s; {held} connected; {descriptors} descriptors open"
                            " | - | - |")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
