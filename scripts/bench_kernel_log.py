#!/usr/bin/env python3
"""Benchmark of the kernel log source against journalctl, in one run, on a generated journal.

Prints one Markdown table (and writes it to --out if given).

The journal (in --workdir, default a temp dir) is written by systemd's own tool, Debian's
systemd-journal-remote, from Journal Export Format, as a long-running node's boot would leave it:
--gib of this boot's entries, one in ten from the kernel (of those, one in a hundred an NVRM XID
line), the rest a vLLM server's stdout; journal-remote rotates files as journald does.

Rows:
  * the lookback: `mlnode-agent kernel-log -D DIR` (what `serve` reads at start: this boot's kernel
    entries, parsed into facts) beside `journalctl -D DIR -k -b --grep NVRM -o cat` (the peer reading
    the same entries and matching the same driver's lines); best of --runs, page cache warm; peak
    RSS of each process (GNU time), the journal's mapped pages included;
  * the same lookback from a cold page cache in a memory cgroup limited as the DaemonSet limits the
    agent (192 MiB): the mapped journal pages are charged to it and reclaimed under the limit (root
    and the memory controller needed; the row says so where they are missing);
  * following: `mlnode-agent serve` with only the kernel log source, while --rate kernel lines a
    second are appended for --seconds by a journal-remote process fed through a pipe (as journald
    appends), to a file the agent has already found (its first line read before the window opens:
    the steady state, not the rescan a new file costs); the agent's CPU time over the window
    (/proc/PID/stat), per thousand entries and as a share of one core, and its resident set at the
    end; then a rotation: a new file, as many lines written into it at once, all to be read.

Requires: systemd-journal-remote and journalctl (scripts/test.sh installs them), GNU time, and
libsystemd0 (the agent's reader loads it, as in its image).
"""
import argparse
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import agent_process

GiB = 1 << 30
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
JOURNAL_REMOTE = "/lib/systemd/systemd-journal-remote"
# __MONOTONIC_TIMESTAMP rises with the wall clock, as the kernel's clock does within one boot: each
# systemd-journal-remote process starts sequence numbers of its own, so sd-journal orders one boot's
# entries of different files by this timestamp (journald's files share their sequence numbers).
MONOTONIC_ORIGIN_USEC = 1_600_000_000 * 10**6


def boot_id() -> str:
    return pathlib.Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "")


def export_entry(i: int, boot: str, realtime: int) -> str:
    if i % 10 == 0:
        transport, ident = "kernel", "kernel"
        if i % 1000 == 0:
            message = f"NVRM: Xid (PCI:0000:{(i // 1000) % 8 * 16 + 7:02x}:00): 13, pid={i}, name=python3, Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): Out Of Range Address"
        else:
            message = f"nvme nvme0: I/O tag {i % 1024} (0x{i:x}) opcode 0x2 (I/O Cmd) QID 5 timeout, completion polled"
    else:
        transport, ident = "stdout", "vllm"
        message = f"INFO 12-01 10:00:00 [loggers.py:{i % 500}] Engine 000: Avg prompt throughput: {i % 97}.0 tokens/s, Avg generation throughput: {i % 89}.4 tokens/s, Running: {i % 8} reqs, Waiting: 0 reqs"
    return (f"__REALTIME_TIMESTAMP={realtime}\n__MONOTONIC_TIMESTAMP={realtime - MONOTONIC_ORIGIN_USEC}\n_BOOT_ID={boot}\n"
            f"_TRANSPORT={transport}\nPRIORITY=6\nSYSLOG_IDENTIFIER={ident}\n_HOSTNAME=ip-10-0-1-23\n"
            f"MESSAGE={message}\n\n")


def generate(directory: pathlib.Path, size: int) -> int:
    """Writes the journal until its files hold `size` bytes; returns the entries written."""
    directory.mkdir(parents=True, exist_ok=True)
    boot = boot_id()
    start = int(time.time() * 1e6) - 24 * 3600 * 10**6
    writer = subprocess.Popen([JOURNAL_REMOTE, f"--output={directory / 'system.journal'}", "-"],
                              stdin=subprocess.PIPE, stderr=subprocess.DEVNULL)
    i = 0
    while True:
        chunk = "".join(export_entry(i + k, boot, start + (i + k) * 1000) for k in range(20000))
        writer.stdin.write(chunk.encode())
        i += 20000
        if i % 400000 == 0 and sum(f.stat().st_size for f in directory.glob("*.journal")) >= size:
            break
    writer.stdin.close()
    writer.wait()
    return i


def measured(cmd):
    """(seconds, peak RSS bytes) of cmd under GNU time; fails loudly on a non-zero exit."""
    start = time.perf_counter()
    proc = subprocess.run(["/usr/bin/time", "-f", "%M"] + [str(c) for c in cmd],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"{' '.join(map(str, cmd))} exited {proc.returncode}: {proc.stderr}")
    return seconds, int(proc.stderr.strip().splitlines()[-1]) * 1024


DAEMONSET_MEMORY_LIMIT = 192 << 20  # deploy/daemonset/base/daemonset.yaml, resources.limits.memory


def memory_cgroup(limit: int):
    """A memory cgroup limited to `limit` bytes (v1 or v2), or None where this process cannot make
    one (it needs root and the memory controller)."""
    candidates = [(pathlib.Path("/sys/fs/cgroup/memory"), "memory.limit_in_bytes"),
                  (pathlib.Path("/sys/fs/cgroup"), "memory.max")]
    for root, knob in candidates:
        if not (root / "cgroup.procs").exists():
            continue
        if knob == "memory.max" and "memory" not in (root / "cgroup.controllers").read_text(errors="ignore"):
            continue
        group = root / f"bench-kernel-log-{os.getpid()}"
        try:
            group.mkdir(exist_ok=True)
            (group / knob).write_text(str(limit))
            return group
        except OSError:
            continue
    return None


def cold_under_limit(cmd, group: pathlib.Path):
    """(seconds, peak RSS bytes) of cmd in `group`, the page cache dropped first: the journal's pages
    are read from disk and charged to the limited group, as in the agent's pod after a node boots."""
    subprocess.run(["sync"], check=True)
    pathlib.Path("/proc/sys/vm/drop_caches").write_text("3")
    wrapped = ["sh", "-c", f'echo $$ > {group / "cgroup.procs"} && exec "$@"', "sh"] + [str(c) for c in cmd]
    return measured(wrapped)


def best_of(cmd, runs):
    measured(cmd)  # warm the page cache
    results = [measured(cmd) for _ in range(runs)]
    return min(r[0] for r in results), max(r[1] for r in results)


def cpu_seconds(pid: int) -> float:
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def rss_bytes(pid: int) -> dict:
    """VmRSS, and its anonymous part (the heap, what an OOM kill counts) and its file-backed part
    (the journal's mapped pages: page cache the kernel reclaims under pressure)."""
    fields = {}
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile"):
            fields[key] = int(value.split()[0]) * 1024
    return fields


def metrics_or_empty(port: int) -> str:
    """The exposition, or nothing while the server is not listening yet."""
    try:
        return agent_process.metrics(port)
    except OSError:
        return ""


def follow(agent: pathlib.Path, directory: pathlib.Path, work: pathlib.Path, rate: int, seconds: int):
    config = {"models": [], "nvml": {"enabled": False}, "neuron": {"enabled": False},
              "readiness": {"enabled": False}, "startup": {"enabled": False},
              "kernel_log": {"enabled": True, "journal_dirs": [str(directory)]}}
    proc, port = agent_process.serve(agent, config, work)
    try:
        deadline = time.time() + 600
        while agent_process.sample(metrics_or_empty(port), "mlnode_kernel_log_up") != 1.0:
            if time.time() > deadline or proc.poll() is not None:
                sys.exit("the agent did not finish reading the journal's history")
            time.sleep(0.5)
        boot = boot_id()
        writer = subprocess.Popen([JOURNAL_REMOTE, f"--output={directory / 'follow.journal'}", "-"],
                                  stdin=subprocess.PIPE, stderr=subprocess.DEVNULL)
        # The steady state: the new file is found (and the engine's rescan done) before the window
        # opens, by a first line written and given time to be read.
        writer.stdin.write(export_entry(0, boot, int(time.time() * 1e6)).encode())
        writer.stdin.flush()
        read_before = agent_process.sample(agent_process.metrics(port), "mlnode_kernel_log_entries_read_total")
        settle = time.time() + 30
        while time.time() < settle:
            now_read = agent_process.sample(agent_process.metrics(port), "mlnode_kernel_log_entries_read_total")
            if now_read > read_before:
                break
            time.sleep(0.2)
        time.sleep(2)
        before_entries = agent_process.sample(agent_process.metrics(port), "mlnode_kernel_log_entries_read_total")
        cpu_before, started = cpu_seconds(proc.pid), time.perf_counter()
        for n in range(rate * seconds):
            line = export_entry(n * 10, boot, int(time.time() * 1e6))
            writer.stdin.write(line.encode())
            writer.stdin.flush()
            time.sleep(max(0.0, started + (n + 1) / rate - time.perf_counter()))
        writer.stdin.close()
        writer.wait()
        # Until every appended entry is read, or nothing more comes for 10 s.
        expected, last, quiet_since = before_entries + rate * seconds, -1.0, time.time()
        while True:
            got = agent_process.sample(agent_process.metrics(port), "mlnode_kernel_log_entries_read_total")
            if got >= expected or time.time() - quiet_since > 10:
                break
            if got != last:
                last, quiet_since = got, time.time()
            time.sleep(0.2)
        read = got - before_entries
        window = time.perf_counter() - started
        cpu = cpu_seconds(proc.pid) - cpu_before
        rss = rss_bytes(proc.pid)
        rotated = rotation(proc, port, directory, boot, rate * seconds)
        return cpu, window, rss, read, rotated
    finally:
        proc.terminate()
        proc.wait()
        # The journal stays as generated (33 files for 2 GiB) for the next run's lookback.
        (directory / "follow.journal").unlink(missing_ok=True)


def rotation(proc, port: int, directory: pathlib.Path, boot: str, burst: int):
    """A file journald creates while the agent follows (a rotation), written into at once: how
    many of its `burst` kernel lines the agent reads, and the CPU seconds that costs it."""
    path = directory / f"rotated-{os.getpid()}.journal"
    before = agent_process.sample(agent_process.metrics(port), "mlnode_kernel_log_entries_read_total")
    cpu_before = cpu_seconds(proc.pid)
    writer = subprocess.Popen([JOURNAL_REMOTE, f"--output={path}", "-"],
                              stdin=subprocess.PIPE, stderr=subprocess.DEVNULL)
    for n in range(burst):
        writer.stdin.write(export_entry(n * 10, boot, int(time.time() * 1e6)).encode())
    writer.stdin.close()
    writer.wait()
    last, quiet_since = -1.0, time.time()
    while True:
        got = agent_process.sample(agent_process.metrics(port), "mlnode_kernel_log_entries_read_total")
        if got - before >= burst or time.time() - quiet_since > 15:
            break
        if got != last:
            last, quiet_since = got, time.time()
        time.sleep(0.2)
    cpu = cpu_seconds(proc.pid) - cpu_before
    path.unlink()
    return got - before, burst, cpu


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gib", type=float, default=2.0)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--rate", type=int, default=100, help="kernel lines a second while following")
    parser.add_argument("--seconds", type=int, default=60, help="how long to follow")
    parser.add_argument("--workdir", type=pathlib.Path)
    parser.add_argument("--out", type=pathlib.Path)
    args = parser.parse_args()
    for tool in (JOURNAL_REMOTE, "/usr/bin/time"):
        if not pathlib.Path(tool).exists():
            sys.exit(f"{tool} is needed")
    agent = agent_process.release_binary()
    work = args.workdir or pathlib.Path(tempfile.mkdtemp(prefix="bench-kernel-log-"))
    directory = work / "journal"
    size = int(args.gib * GiB)
    if sum(f.stat().st_size for f in directory.glob("*.journal")) < size:
        started = time.perf_counter()
        entries = generate(directory, size)
        print(f"generated {entries} entries in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    on_disk = sum(f.stat().st_size for f in directory.glob("*.journal"))
    files = len(list(directory.glob("*.journal")))

    ours = best_of([agent, "kernel-log", "-D", directory], args.runs)
    peer = best_of(["journalctl", "-D", directory, "-k", "-b", "--grep", "NVRM", "-o", "cat", "--no-pager"], args.runs)
    group = memory_cgroup(DAEMONSET_MEMORY_LIMIT)
    limited = None
    if group is not None:
        try:
            limited = (cold_under_limit([agent, "kernel-log", "-D", directory], group),
                       cold_under_limit(["journalctl", "-D", directory, "-k", "-b", "--grep", "NVRM", "-o", "cat", "--no-pager"], group))
        finally:
            group.rmdir()
        cpu, window, follow_rss, read, (rotated_read, rotated, rotated_cpu) = follow(agent, directory, work, args.rate, args.seconds)
    followed = args.rate * args.seconds

    lines = [
        f"Journal: {on_disk / GiB:.2f} GiB in {files} file(s), this boot; {os.cpu_count()} cores.",
        "",
        "| | mlnode-agent | journalctl | ratio |",
        "| --- | --- | --- | --- |",
        f"| lookback: this boot's kernel entries, seconds | {ours[0]:.2f} | {peer[0]:.2f} | {peer[0] / ours[0]:.2f}x |",
        f"| lookback: peak RSS (the journal's mapped pages included), MiB | {ours[1] / (1 << 20):.1f} | {peer[1] / (1 << 20):.1f} | {peer[1] / ours[1]:.2f}x |",
        (f"| lookback from a cold page cache, in a {DAEMONSET_MEMORY_LIMIT >> 20} MiB memory cgroup (the DaemonSet's limit): seconds | {limited[0][0]:.2f} | {limited[1][0]:.2f} | {limited[1][0] / limited[0][0]:.2f}x |"
         if limited else "| lookback in the DaemonSet's memory limit | - (needs root and a memory cgroup) | - | - |"),
        (f"| the same: peak RSS, MiB | {limited[0][1] / (1 << 20):.1f} | {limited[1][1] / (1 << 20):.1f} | {limited[1][1] / limited[0][1]:.2f}x |"
         if limited else "| the same: peak RSS | - | - | - |"),
        f"| following {args.rate} lines/s for {args.seconds} s: CPU per 1000 entries, ms | {cpu / followed * 1000 * 1000:.2f} | - | - |",
        f"| following: share of one core | {cpu / window * 100:.3f} % | - | - |",
        f"| following: entries read of those appended | {read:.0f} of {followed} | - | - |",
        f"| a file created while following (a rotation), {rotated} lines at once: read | {rotated_read:.0f} of {rotated} | - | - |",
        f"| the rotation: CPU, ms | {rotated_cpu * 1000:.0f} | - | - |",
        f"| following: RSS at the end (serve, whole agent), MiB | {follow_rss['VmRSS'] / (1 << 20):.1f} | - | - |",
        f"| of which anonymous (heap) / the journal's mapped pages, MiB | {follow_rss['RssAnon'] / (1 << 20):.1f} / {follow_rss['RssFile'] / (1 << 20):.1f} | - | - |",
    ]
    table = "\n".join(lines)
    print(table)
    if args.out:
        args.out.write_text(table + "\n")


if __name__ == "__main__":
    main()
