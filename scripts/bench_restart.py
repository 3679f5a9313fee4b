"""What an agent restart costs a node (issue 38): the release agent started against a model cache a
previous agent of the same boot verified, today's behaviour (verify.trust_unchanged_after_restart:
false, every byte hashed again) beside the new one, in one run, for a 20 GiB model of four shards
and for one of 2,000 small files. Per case: the time from the agent's start to /readyz's verdict,
the bytes it read (/proc/<pid>/io: rchar, every read() whether cached or not; read_bytes, what the
block device gave, the page cache dropped before each case) and its CPU seconds. Then one shard
changed in place while the agent was down: the time until the restarted agent fails it.

The record lives in ModelCacheVerified's message on the node, so each agent talks to an API server:
the tests' real one (kube-apiserver and etcd, scripts/control_plane.py) on loopback, with the node.

    python3 scripts/bench_restart.py [--big-gib 20] [--small-files 2000]

Writes the table to stdout and target/bench_restart.md."""
import argparse
import os
import pathlib
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import agent_process  # noqa: E402
from bench_priority import make_cold  # noqa: E402
from control_plane import ControlPlane  # noqa: E402

NODE = "bench-node"
MiB = 1 << 20
GiB = 1 << 30


def proc_io(pid: int) -> dict:
    return {k: int(v) for k, v in (line.split(": ") for line in open(f"/proc/{pid}/io"))}


def cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def verdict(port: int):
    """/readyz's status and body, or None while the model has none yet."""
    import http.client
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", "/readyz")
        response = conn.getresponse()
        body = response.read().decode()
    except OSError:
        return None
    if response.status == 200 or ("not verified:" in body and "in progress" not in body):
        return response.status, body
    return None


def recorded(api: ControlPlane) -> bool:
    condition = api.condition("ModelCacheVerified") or {}
    return condition.get("status") == "True" and "; verified m=" in condition.get("message", "")


def run_agent(binary, root, manifest, api, work, trust: bool):
    """Starts the agent, waits for its verdict; returns seconds, rchar, read_bytes, CPU seconds and
    the verdict; stops the agent."""
    make_cold(root)
    config = {
        "start_jitter": "0s",
        "node_name": NODE,
        "nvml": {"enabled": False},
        "neuron": {"enabled": False},
        "startup": {"enabled": False},
        "readiness": {"enabled": True, "interval": "1s", "boot_id_file": str(work / "boot_id")},
        "verify": {"trust_unchanged_after_restart": trust, "restart_jitter": "0s"},
        "models": [{"name": "m", "root": str(root), "manifest": str(manifest)}],
    }
    # The agent's own files beside neither the cache nor the manifest, whose folder it watches.
    home = work / "agent"
    home.mkdir(exist_ok=True)
    env = {"KUBECONFIG": str(api.kubeconfig)}
    started = time.monotonic()
    agent, port = agent_process.serve(binary, config, home, log=open(home / "agent.log", "w"), env=env)
    try:
        while (answer := verdict(port)) is None:
            if time.monotonic() - started > 600:
                sys.exit("no verdict within 600 s")
            time.sleep(0.01)
        seconds = time.monotonic() - started
        io, cpu = proc_io(agent.pid), cpu_seconds(agent.pid)
        # The record is on the node once the condition says True and carries it: the next agent's
        # to take (an agent with trust off writes one too).
        deadline = time.monotonic() + 30
        while answer[0] == 200 and not recorded(api):
            if time.monotonic() > deadline:
                sys.exit("the agent left no record on the node")
            time.sleep(0.05)
        return seconds, io["rchar"], io["read_bytes"], cpu, answer
    finally:
        agent.terminate()
        agent.wait(timeout=30)


def write_model(root: pathlib.Path, sizes):
    root.mkdir(parents=True)
    chunk = os.urandom(8 * MiB)
    for name, size in sizes:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as f:
            left = size
            while left:
                n = min(left, len(chunk))
                f.write(chunk[:n])
                left -= n


def settle(root: pathlib.Path):
    """Waits until every file is older than the racy window: a file changed within 2 s of its hash is
    never trusted at a restart (mlnode_verify::fingerprint), and a real cache is older than that."""
    newest = max(max(p.stat().st_mtime, p.stat().st_ctime) for p in root.rglob("*") if p.is_file())
    while time.time() < newest + 2.5:
        time.sleep(0.1)


def case_rows(name, binary, root, api, work):
    (work / "manifests").mkdir(exist_ok=True)
    manifest = work / "manifests" / f"{name}.manifest.json"
    with open(manifest, "w") as out:
        subprocess.run([binary, "manifest", "--revision", "r1", str(root)], stdout=out, check=True)
    settle(root)
    rows = []
    # A previous agent of this boot verified the cache and left its record.
    run_agent(binary, root, manifest, api, work, trust=True)
    for label, trust in (("today: every byte hashed again", False), ("new: unchanged cache trusted", True)):
        seconds, rchar, read_bytes, cpu, answer = run_agent(binary, root, manifest, api, work, trust)
        assert answer[0] == 200, answer
        rows.append((name, label, seconds, rchar, read_bytes, cpu))
    # One shard changed in place while the agent was down.
    shard = max((p for p in root.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    with open(shard, "r+b") as f:
        f.seek(shard.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))
    # The new agent first, while the node still has the unchanged cache's record (a failed verdict
    # leaves none).
    for label, trust in (("new: one changed file found", True), ("today: one changed file found", False)):
        seconds, rchar, read_bytes, cpu, answer = run_agent(binary, root, manifest, api, work, trust)
        assert answer[0] == 503 and "digest_mismatch" in answer[1], answer
        rows.append((name, label, seconds, rchar, read_bytes, cpu))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--big-gib", type=int, default=20)
    parser.add_argument("--small-files", type=int, default=2000)
    args = parser.parse_args()
    binary = agent_process.release_binary()
    rows = []
    with ControlPlane(NODE) as api, tempfile.TemporaryDirectory(dir=agent_process.REPO / "target") as tmp:
        work = pathlib.Path(tmp)
        (work / "boot_id").write_text(open("/proc/sys/kernel/random/boot_id").read())
        big = work / "big"
        write_model(big, [(f"model-{i:05d}-of-00004.safetensors", args.big_gib * GiB // 4) for i in range(1, 5)])
        rows += case_rows(f"{args.big_gib} GiB, 4 shards", binary, big, api, work)
        small = work / "small"
        write_model(small, [(f"part-{i // 100:02d}/file-{i:05d}.bin", 64 * 1024) for i in range(args.small_files)])
        rows += case_rows(f"{args.small_files} files of 64 KiB", binary, small, api, work)

    lines = [
        "| model | agent start | to verdict (s) | read, all reads (MiB) | read from disk (MiB) | CPU (s) |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for name, label, seconds, rchar, read_bytes, cpu in rows:
        lines.append(f"| {name} | {label} | {seconds:.2f} | {rchar / MiB:.1f} | {read_bytes / MiB:.1f} | {cpu:.2f} |")
    by = {(r[0], r[1]): r for r in rows}
    lines.append("")
    for name in dict.fromkeys(r[0] for r in rows):
        today, new = by[(name, "today: every byte hashed again")], by[(name, "new: unchanged cache trusted")]
        changed_today, changed_new = by[(name, "today: one changed file found")], by[(name, "new: one changed file found")]
        lines.append(
            f"{name}: unchanged restart {today[2] / new[2]:.0f}x faster to its verdict, "
            f"{today[3] / max(new[3], 1):.0f}x fewer bytes read; one changed file found "
            f"{changed_today[2] / changed_new[2]:.1f}x as fast as today."
        )
    table = "\n".join(lines)
    print(table)
    (agent_process.REPO / "target" / "bench_restart.md").write_text(table + "\n")


if __name__ == "__main__":
    main()
