#!/usr/bin/env python3
"""Benchmark of `mlnode-agent verify` against its peers, in one run, on generated caches.

Prints one Markdown table (and writes it to --out if given). Page cache warm: every contender
runs once untimed first, then --runs times; the best run is reported (the least disturbed by the
rest of the machine). Peak RSS is each process's own maximum resident set, from GNU time.

Caches (in --workdir, default a temp dir; needs ~8.5 GiB of disk and as much free memory for the
page cache to stay warm):
  * "8 files": 8 x 512 MiB weights + small JSON files; native manifest and model_signing `files` bundle,
    each also with BLAKE3 (`mlnode-agent manifest --hash blake3`; model_signing's API with
    hashing_algorithm="blake3"), to show what the faster hash gives on the same cores;
  * "sharded": one 4 GiB file with a model_signing `shards` bundle (256 MiB shards).

Contenders: mlnode-agent verify; a single-threaded Python hashlib loop (the usual way);
coreutils `sha256sum -c`; `model_signing verify key` (and its API for the BLAKE3 bundle, which its
command line cannot verify); `openssl speed -evp sha256` for one core's rate.
Requires: python3 with model-signing (scripts/test.sh installs it), sha256sum, openssl, GNU time
(Debian package `time`).
"""
import argparse
import hashlib
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import agent_process

MiB = 1 << 20
GiB = 1 << 30

PYTHON_LOOP = r"""
import hashlib, json, pathlib, sys
root, manifest = pathlib.Path(sys.argv[1]), json.load(open(sys.argv[2]))
for rel, entry in manifest["files"].items():
    want = entry["sha256"] if isinstance(entry, dict) else entry
    h = hashlib.sha256()
    with open(root / rel, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    if h.hexdigest() != want:
        sys.exit(f"{rel}: digest mismatch")
"""


def run_measured(cmd, cwd=None):
    """Runs cmd under GNU time; returns (seconds, peak RSS bytes). Fails loudly on a non-zero exit.

    GNU time, not wait4 from here: Linux carries a process's RSS high-water mark across exec, so a
    child forked from this (large) Python process would report our memory, not its own.
    """
    start = time.perf_counter()
    proc = subprocess.run(["/usr/bin/time", "-f", "%M"] + [str(c) for c in cmd], cwd=cwd,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"{' '.join(map(str, cmd))} exited {proc.returncode}: {proc.stderr}")
    return seconds, int(proc.stderr.strip().splitlines()[-1]) * 1024


def best_of(cmd, runs, cwd=None):
    run_measured(cmd, cwd)  # warm the page cache and the binary
    results = [run_measured(cmd, cwd) for _ in range(runs)]
    return min(r[0] for r in results), max(r[1] for r in results)


def write_file(path, size, seed):
    block = bytearray(os.urandom(64 * MiB))
    with open(path, "wb") as f:
        written = 0
        while written < size:
            block[:16] = hashlib.md5(f"{seed}:{written}".encode()).digest()
            n = min(len(block), size - written)
            f.write(block[:n])
            written += n


def one_core_rate():
    """openssl's SHA-256 rate on 16 KiB blocks, one process, in bytes/s."""
    out = subprocess.run(
        ["openssl", "speed", "-seconds", "3", "-evp", "sha256"],
        capture_output=True, text=True, check=True,
    ).stdout
    line = [l for l in out.splitlines() if l.lower().startswith("sha256") or l.startswith("SHA256")][-1]
    last = line.split()[-1]  # e.g. "2045678.93k": thousands of bytes per second
    return float(last.rstrip("k")) * 1000


def measure(agent: pathlib.Path, work: pathlib.Path, runs: int) -> list:
    """Makes the caches in `work` (kept for a next run) and measures every contender; returns the
    table's lines."""
    cores = os.cpu_count()

    # --- the 8-file cache ---------------------------------------------------------------------
    model = work / "eight"
    if not (model / "model-00008-of-00008.safetensors").exists():
        model.mkdir(exist_ok=True)
        for i in range(1, 9):
            write_file(model / f"model-0000{i}-of-00008.safetensors", 512 * MiB, i)
        for name in ["config.json", "generation_config.json", "tokenizer_config.json", "model.safetensors.index.json"]:
            (model / name).write_text(json.dumps({"name": name, "pad": "x" * 2000}))
    manifest = work / "eight.manifest.json"
    with open(manifest, "w") as f:
        subprocess.run([agent, "manifest", "--revision", "bench", model], stdout=f, check=True)
    blake3_manifest = work / "eight.blake3.json"
    with open(blake3_manifest, "w") as f:
        subprocess.run([agent, "manifest", "--hash", "blake3", "--revision", "bench", model], stdout=f, check=True)
    sums = work / "eight.sha256"
    entries = json.load(open(manifest))["files"]
    sums.write_text("".join(f"{e['sha256']}  {p}\n" for p, e in entries.items()))
    keys = work / "keys"
    keys.mkdir(exist_ok=True)
    signer = agent_process.REPO / "tests/model_signing/sign.py"
    bundle = work / "eight.sig"
    subprocess.run([sys.executable, signer, model, bundle, keys, "files"], check=True)
    blake3_bundle = work / "eight.blake3.sig"
    subprocess.run([sys.executable, signer, model, blake3_bundle, keys, "files"], check=True,
                   env={**os.environ, "HASH": "blake3"})
    loop = work / "python_loop.py"
    loop.write_text(PYTHON_LOOP)
    total = sum(e["size"] for e in entries.values())

    # --- the sharded 4 GiB file ---------------------------------------------------------------
    big = work / "big"
    if not (big / "model.safetensors").exists():
        big.mkdir(exist_ok=True)
        write_file(big / "model.safetensors", 4 * GiB, 99)
    big_bundle = work / "big.sig"
    subprocess.run([sys.executable, signer, big, big_bundle, keys, "shards", str(256 * MiB)], check=True)

    rate1 = one_core_rate()
    pub = keys / "public.pem"
    rows = []

    def row(cache, name, cmd, size, cwd=None):
        seconds, rss = best_of(cmd, runs, cwd)
        rows.append((cache, name, size / seconds, rss))

    row("8 x 512 MiB", "mlnode-agent verify", [agent, "verify", "--manifest", manifest, model], total)
    row("8 x 512 MiB", "mlnode-agent verify (bundle)", [agent, "verify", "--manifest", bundle, "--public-key", pub, model], total)
    row("8 x 512 MiB", "python hashlib loop", [sys.executable, loop, model, manifest], total)
    row("8 x 512 MiB", "sha256sum -c", ["sha256sum", "-c", "--quiet", sums], total, cwd=model)
    row("8 x 512 MiB", "model_signing verify key", ["model_signing", "verify", "key", "--signature", bundle, "--public_key", pub, model], total)
    row("8 x 512 MiB, BLAKE3", "mlnode-agent verify", [agent, "verify", "--manifest", blake3_manifest, model], total)
    row("8 x 512 MiB, BLAKE3", "mlnode-agent verify (bundle)", [agent, "verify", "--manifest", blake3_bundle, "--public-key", pub, model], total)
    # model_signing's command line hashes with SHA-256 only; its API reads the bundle's algorithm.
    row("8 x 512 MiB, BLAKE3", "model_signing API verify (key)", [sys.executable, "-c",
        "import model_signing,sys\n"
        "model_signing.verifying.Config().use_elliptic_key_verifier(public_key=sys.argv[1]).verify(sys.argv[2], sys.argv[3])",
        pub, model, blake3_bundle], total)
    row("4 GiB, 256 MiB shards", "mlnode-agent verify", [agent, "verify", "--manifest", big_bundle, "--public-key", pub, big], 4 * GiB)
    row("4 GiB, 256 MiB shards", "python hashlib loop", [sys.executable, "-c",
        "import hashlib,sys\nh=hashlib.sha256()\nf=open(sys.argv[1],'rb')\nfor c in iter(lambda: f.read(1<<20), b''): h.update(c)",
        big / "model.safetensors"], 4 * GiB)

    def ours(cache):
        return next(r[2] for r in rows if r[0] == cache and r[1] == "mlnode-agent verify")

    lines = [
        f"One core (openssl speed -evp sha256, 16 KiB blocks): {rate1 / 1e9:.2f} GB/s; cores: {cores}; "
        f"ideal parallel rate (cores x one core): {cores * rate1 / 1e9:.2f} GB/s.",
        "",
        "| cache | tool | GB/s | mlnode-agent / tool | vs one core | peak RSS MiB |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for cache, name, rate, rss in rows:
        lines.append(
            f"| {cache} | {name} | {rate / 1e9:.2f} | {ours(cache) / rate:.2f}x | {rate / rate1:.2f}x | {rss / MiB:.1f} |"
        )
    lines.append("")
    lines.append(
        f"mlnode-agent reaches {100 * ours('8 x 512 MiB') / (cores * rate1):.0f}% (8 files) and "
        f"{100 * ours('4 GiB, 256 MiB shards') / (cores * rate1):.0f}% (sharded) of cores x one core."
    )
    lines.append(
        f"With BLAKE3 manifests the same cores verify {ours('8 x 512 MiB, BLAKE3') / ours('8 x 512 MiB'):.2f}x as fast as with SHA-256."
    )
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=pathlib.Path)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=pathlib.Path, help="also write the table here")
    args = parser.parse_args()
    work = args.workdir or pathlib.Path(tempfile.mkdtemp(prefix="mlnode-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    table = "\n".join(measure(agent_process.release_binary(), work, args.runs))
    print(table)
    if args.out:
        args.out.write_text(table + "\n")


if __name__ == "__main__":
    main()
