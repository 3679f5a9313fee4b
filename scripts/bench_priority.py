#!/usr/bin/env python3
"""What `serve`'s verification takes from inference on this machine, in one run, as one table.

Five parts, each side by side with its baseline:
  1. CPU: a "serving" stand-in (one process per core hashing fixed 1 MiB units, reporting units/s)
     alone, then while `serve` verifies a cold 4 GiB cache with `verify.priority` idle and normal,
     and in `auto` as a restarted agent sees it: the stand-in has held the model's weights open since
     before the agent started (a DaemonSet rollout), so the agent never saw the open.
  2. Disk: a "loader" stand-in reading a cold 2 GiB model the way safetensors loads one (mmap, then a
     copy of each tensor-sized slice) alone, then while `serve` verifies the cold 4 GiB cache (idle,
     normal, and idle under `verify.max_bytes_per_second: 100MiB`).
  3. Page cache (fincore): a hot 2 GiB model's residency through `serve`'s verification of the cold
     4 GiB cache, and how much of the cold cache that verification leaves resident; `verify` beside it.
  4. The held node: with the CPU stand-in running, time from start to the first
     `ModelCacheVerified=True` the agent writes to the tests' real API server on loopback, the node carrying the
     startup taint, in `auto`, `normal` and `idle`.
  5. `mlnode-agent verify` throughput against `model_signing verify` and a Python hashlib loop
     (scripts/bench_verify.py's measurement, on the same 8 x 512 MiB cache).

Needs ~10.5 GiB of disk in --workdir (default a temp dir on the disk, not tmpfs: pages of tmpfs
cannot be dropped) and root or the files' owner to drop their pages. Requires fincore (util-linux),
GNU time, model-signing (scripts/test.sh installs it).
"""
import argparse
import contextlib
import hashlib
import mmap
import multiprocessing
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import agent_process
from control_plane import ControlPlane
import bench_verify

MiB = 1 << 20
GiB = 1 << 30
NODE = "bench-node"
TAINT = {"key": "mlnode.dev/not-ready", "effect": "NoSchedule"}


def files_of(root: pathlib.Path):
    return sorted(p for p in root.rglob("*") if p.is_file())


def make_cold(root: pathlib.Path):
    for path in files_of(root):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def make_hot(root: pathlib.Path):
    for path in files_of(root):
        with open(path, "rb") as f:
            while f.read(16 * MiB):
                pass


def resident(root: pathlib.Path) -> float:
    """The fraction of the model's bytes in the page cache, from fincore."""
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--raw", "--output", "RES,SIZE"]
                         + [str(p) for p in files_of(root)], capture_output=True, text=True, check=True).stdout
    res = size = 0
    for line in out.split("\n"):
        if line.strip():
            r, s = line.split()
            res, size = res + int(r), size + int(s)
    return res / size


# --- the stand-ins ------------------------------------------------------------------------------

def _hash_units(stop, out):
    """One core of the serving stand-in: SHA-256 over fixed 1 MiB units until `stop`; puts how many."""
    buffer = os.urandom(64 * 1024)
    units = 0
    while not stop.is_set():
        h = hashlib.sha256()
        for _ in range(16):
            h.update(buffer)
        units += 1
    out.put(units)


@contextlib.contextmanager
def cpu_load(rates=None):
    """The CPU stand-in, one process per core, for as long as the block runs; its units per second
    are appended to `rates` when given."""
    stop, out = multiprocessing.Event(), multiprocessing.Queue()
    workers = [multiprocessing.Process(target=_hash_units, args=(stop, out)) for _ in range(os.cpu_count())]
    started = time.monotonic()
    for w in workers:
        w.start()
    try:
        yield
    finally:
        stop.set()
        total = sum(out.get() for _ in workers)
        elapsed = time.monotonic() - started
        for w in workers:
            w.join()
        if rates is not None:
            rates.append(total / elapsed)


def cpu_stand_in(seconds: float) -> float:
    """Units per second of the CPU stand-in over a window of `seconds`."""
    rates = []
    with cpu_load(rates):
        time.sleep(seconds)
    return rates[0]


def load_model(root: pathlib.Path) -> float:
    """Seconds to read every file as safetensors does: mmap it, copy out 16 MiB tensors."""
    started = time.perf_counter()
    for path in files_of(root):
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                continue
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
                for offset in range(0, size, 16 * MiB):
                    bytes(m[offset:offset + 16 * MiB])
    return time.perf_counter() - started


# --- the agent ----------------------------------------------------------------------------------

def agent_config(model: pathlib.Path, manifest: pathlib.Path, priority: str, readiness=False) -> dict:
    return {
        "node_name": NODE,
        "models": [{"name": "bench", "root": str(model), "manifest": str(manifest)}],
        "verify": {"priority": priority},
        "nvml": {"enabled": False},
        "neuron": {"enabled": False},
        "startup": {"enabled": False},
        "readiness": {"enabled": True, "startup_taint": "mlnode.dev/not-ready:NoSchedule", "interval": "200ms"}
        if readiness else {"enabled": False},
    }


@contextlib.contextmanager
def serving(binary, config, work, env=None):
    """`serve` running; yields its port and pid."""
    agent, port = agent_process.serve(binary, config, work, env=env)
    try:
        yield port, agent.pid
    finally:
        agent.terminate()
        agent.wait(timeout=30)


def bytes_read(pid: int) -> int:
    """What the process has read so far (cached or not): a verification's progress as it runs,
    where the hashed-bytes metric only moves when a verification ends."""
    for line in open(f"/proc/{pid}/io"):
        if line.startswith("rchar:"):
            return int(line.split()[1])
    return 0


def wait_reading(pid: int):
    """Until the agent has read 16 MiB: its first verification is under way."""
    deadline = time.monotonic() + 60
    while bytes_read(pid) < 16 * MiB:
        if time.monotonic() > deadline:
            sys.exit("the agent did not start verifying within 60 s")
        time.sleep(0.02)


# --- the parts ----------------------------------------------------------------------------------

def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=pathlib.Path)
    parser.add_argument("--seconds", type=float, default=10, help="CPU stand-in window")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each CPU and loader case")
    parser.add_argument("--held-limit", type=float, default=60, help="give up on a first verification after this")
    parser.add_argument("--out", type=pathlib.Path, help="also write the table here")
    args = parser.parse_args()
    binary = agent_process.release_binary()
    work = args.workdir or pathlib.Path(tempfile.mkdtemp(prefix="mlnode-bench-", dir=agent_process.REPO / "target"))
    work.mkdir(parents=True, exist_ok=True)

    # Part 5 first: it makes the 8 x 512 MiB cache (the cold 4 GiB model of the other parts).
    verify_lines = bench_verify.measure(binary, work, runs=2)
    cold, cold_manifest = work / "eight", work / "eight.manifest.json"
    hot = work / "hot"
    if not (hot / "model-00004-of-00004.safetensors").exists():
        hot.mkdir(exist_ok=True)
        for i in range(1, 5):
            bench_verify.write_file(hot / f"model-0000{i}-of-00004.safetensors", 512 * MiB, 100 + i)
    hot_manifest = work / "hot.manifest.json"
    with open(hot_manifest, "w") as f:
        subprocess.run([binary, "manifest", hot], stdout=f, check=True)
    scheduler = pathlib.Path(f"/sys/block/{block_device(work)}/queue/scheduler")
    # Read everything once: under a VM, a first read may come from the host's disk and a later one
    # from the host's cache; afterwards every "cold" read in here costs the same.
    make_hot(cold)
    make_hot(hot)
    rows = []

    def while_verifying_cold(stand_in, priority, rate=None):
        """`stand_in()` while serve's first verification of the cold 4 GiB cache is under way (at
        `priority`, under a read `rate`); its result and what the agent read meanwhile. The weights
        are held open from before the agent starts, as a server that loaded them holds them."""
        make_cold(cold)
        config = agent_config(cold, cold_manifest, priority)
        config["verify"]["max_bytes_per_second"] = rate
        with open(files_of(cold)[0], "rb"), serving(binary, config, work) as (_, pid):
            wait_reading(pid)
            before = bytes_read(pid)
            result = stand_in()
            return result, bytes_read(pid) - before

    # 1. CPU. Windows differ by a few percent on a VM whatever runs: each case runs --repeats
    # times, interleaved, and the median is reported with the range.
    def window():
        return cpu_stand_in(args.seconds)

    alone, during = [], {"idle": [], "normal": [], "auto": []}
    for _ in range(args.repeats):
        alone.append(window())
        for priority, runs in during.items():
            runs.append(while_verifying_cold(window, priority))
    base = statistics.median(alone)
    rows.append(("1. CPU stand-in (units/s) alone", "-", f"{base:,.0f}", "1.000",
                 f"{min(alone) / base:.3f} to {max(alone) / base:.3f} in {args.repeats} runs"))
    for priority, runs in during.items():
        rate = statistics.median(r for r, _ in runs)
        read = statistics.median(b for _, b in runs)
        what = ", restarted agent, weights held open since before" if priority == "auto" else ""
        rows.append((f"1. CPU stand-in (units/s) while serve verifies cold 4 GiB{what}", priority,
                     f"{rate:,.0f}", f"{rate / base:.3f}",
                     f"{min(r for r, _ in runs) / base:.3f} to {max(r for r, _ in runs) / base:.3f}; "
                     f"agent read {read / GiB:.2f} GiB in the {args.seconds:.0f} s window"))

    # 2. Disk.
    # Disk contention under a VM is noisier still: the same repeats.
    def load_cold():
        make_cold(hot)
        return load_model(hot)

    cases = [("idle", None), ("normal", None), ("idle", "100MiB")]
    alone, during = [], {case: [] for case in cases}
    for _ in range(args.repeats):
        alone.append(load_cold())
        for case in cases:
            during[case].append(while_verifying_cold(load_cold, *case))
    base = statistics.median(alone)
    rows.append(("2. loader stand-in (s) for cold 2 GiB, alone", "-", f"{base:.2f}", "1.000",
                 f"{min(alone):.2f} to {max(alone):.2f} in {args.repeats} runs; "
                 f"I/O scheduler: {scheduler.read_text().strip()}"))
    for (priority, rate), runs in during.items():
        took = statistics.median(t for t, _ in runs)
        read = statistics.median(r for _, r in runs)
        rows.append((f"2. loader stand-in (s) while serve verifies cold 4 GiB{f', {rate}/s limit' if rate else ''}",
                     priority, f"{took:.2f}", f"{took / base:.3f}",
                     f"{min(t for t, _ in runs) / base:.2f} to {max(t for t, _ in runs) / base:.2f}; "
                     f"agent read {read / GiB:.2f} GiB meanwhile"))

    # 3. Page cache.
    for tool in ["serve", "verify"]:
        make_hot(hot)
        make_cold(cold)
        hot_before = resident(hot)
        if tool == "serve":
            with serving(binary, agent_config(cold, cold_manifest, "auto"), work) as (port, _):
                agent_process.wait_ready(port, 600, "page-cache part")
        else:
            subprocess.run([binary, "verify", "--manifest", cold_manifest, cold], stdout=subprocess.DEVNULL, check=True)
        rows.append((f"3. resident after {tool} verifies cold 4 GiB: hot 2 GiB / cold 4 GiB", tool,
                     f"{100 * resident(hot):.1f}% / {100 * resident(cold):.1f}%", "-",
                     f"hot before: {100 * hot_before:.1f}%"))

    # 4. The held node.
    times = {}
    with ControlPlane(NODE, [TAINT]) as api:
        for priority in ["normal", "auto", "idle"]:
            make_cold(hot)
            api.reset_node()
            verified_at = None
            with cpu_load(), serving(binary, agent_config(hot, hot_manifest, priority, readiness=True), work,
                                     env={"KUBECONFIG": str(api.kubeconfig)}) as (_, pid):
                started = time.monotonic()
                # Polled every 50 ms: the time is the first read that finds the condition True.
                while verified_at is None and time.monotonic() - started < args.held_limit:
                    if (api.condition("ModelCacheVerified") or {}).get("status") == "True":
                        verified_at = time.monotonic()
                    time.sleep(0.05)
                read = bytes_read(pid)
            times[priority] = None if verified_at is None else verified_at - started
            took = times[priority]
            rows.append(("4. start to ModelCacheVerified=True (s), tainted node, CPU stand-in running, cold 2 GiB",
                         priority, f"{took:.2f}" if took else f"> {args.held_limit:.0f}",
                         f"{took / times['normal']:.2f}" if took and times["normal"] else "-",
                         "" if took else f"{read / GiB:.2f} GiB read by then"))

    lines = [
        f"Machine: {os.cpu_count()} cores, {os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE') / GiB:.0f} GiB, "
        f"kernel {os.uname().release}; workdir on /dev/{block_device(work)}.",
        "",
        "| part | priority | value | vs baseline | note |",
        "| --- | --- | ---: | ---: | --- |",
    ] + [f"| {' | '.join(row)} |" for row in rows] + ["", "5. `mlnode-agent verify` (scripts/bench_verify.py):", ""] + verify_lines
    table = "\n".join(lines)
    print(table)
    if args.out:
        args.out.write_text(table + "\n")
    if not args.workdir:
        shutil.rmtree(work)


def block_device(path: pathlib.Path) -> str:
    """The disk under `path` (vda for /dev/vda1): its queue names the I/O scheduler."""
    device = os.stat(path).st_dev
    link = pathlib.Path(f"/sys/dev/block/{os.major(device)}:{os.minor(device)}").resolve()
    return link.parent.name if (link / "partition").exists() else link.name


if __name__ == "__main__":
    main()
