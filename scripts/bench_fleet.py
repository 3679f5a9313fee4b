"""What a fleet of agents costs its API server (issue 39): many release agents, each its own node
with its own gated vLLM pods and a small model, against one loopback API server (fake_api.py) that
counts every request by verb, resource and code as kube-apiserver's apiserver_request_total does.
Phases: the start (every agent on a fresh node), one hour of steady state (time scaled: the agents'
readiness.interval and readiness.heartbeat, and the server's watch timeouts, divided by --scale),
a rollout (every agent restarted within one real minute, as the DaemonSet replaces them), a churn of
pods (each node's pods replaced, as a Deployment's rollout does), and push-back (API Priority and
Fairness' 429 with Retry-After while the pods churn again). Printed per node and per 1,000 nodes,
beside the kubelet's own budget and node-problem-detector's.

    python3 scripts/bench_fleet.py [--agents 100] [--scale 60] [--pods 2]

Writes the tables to stdout and target/bench_fleet.md; with BENCH_DIR set, the agents' configs and
logs are kept there."""
import argparse
import collections
import os
import pathlib
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import agent_process  # noqa: E402
from fake_api import FakeApiServer  # noqa: E402

GATE = "mlnode.dev/ModelVerified"
HOUR = 3600.0
# The kubelet's writes per node and hour when nothing changes: a Lease renewal every 10 s
# (nodeLeaseDurationSeconds 40 / 4, pkg/kubelet/nodelease) and a node status every 5 min
# (nodeStatusReportFrequency); node-problem-detector's condition manager writes the node's
# conditions every --k8s-exporter-heartbeat-period (5 min) and on a change
# (kubernetes/node-problem-detector pkg/exporters/k8sexporter/condition/manager.go, 2cbf6c50).
KUBELET_WRITES_PER_HOUR = HOUR / 10 + HOUR / 300
NPD_WRITES_PER_HOUR = HOUR / 300


def vllm_pod(node: str, index: int, generation: int) -> dict:
    """A core/v1 Pod as the API server returns it for a gated vLLM replica bound to `node`: the
    readiness gate and model annotation of deploy/examples/vllm-with-model-gate.yaml, the model
    mounted read-only from the node, the kubelet's own conditions in its status."""
    name = f"vllm-{node}-{generation}-{index}"
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    kubelet = [{"type": t, "status": "True", "lastProbeTime": None, "lastTransitionTime": now}
               for t in ("PodReadyToStartContainers", "Initialized", "ContainersReady", "PodScheduled")]
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "inference", "uid": f"{node}-{generation}-{index}",
                     "creationTimestamp": now, "labels": {"app": "vllm"},
                     "annotations": {"mlnode.dev/model": "m"}},
        "spec": {
            "nodeName": node,
            "readinessGates": [{"conditionType": GATE}],
            "containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.11.0",
                            "volumeMounts": [{"name": "models", "mountPath": "/models", "readOnly": True}]}],
            "volumes": [{"name": "models", "hostPath": {"path": "/var/lib/models", "type": "Directory"}}],
        },
        "status": {"phase": "Running", "conditions": kubelet + [
            {"type": "Ready", "status": "False", "reason": "ReadinessGatesNotReady", "lastProbeTime": None,
             "lastTransitionTime": now}],
            "containerStatuses": [{"name": "vllm", "ready": True, "restartCount": 0, "image": "vllm/vllm-openai:v0.11.0",
                                   "imageID": "", "started": True, "state": {"running": {"startedAt": now}}}]},
    }


class Fleet:
    def __init__(self, binary, api, work, model, manifest, scale):
        self.binary, self.api, self.work, self.scale = binary, api, work, scale
        self.model, self.manifest = model, manifest
        self.agents = {}

    def config(self, node: str) -> dict:
        return {
            "node_name": node,
            "nvml": {"enabled": False},
            "neuron": {"enabled": False},
            # In a cluster the startup tracker runs by default; here the kubeconfig says where.
            "startup": {"enabled": True},
            "readiness": {"enabled": True, "interval": f"{int(10_000 / self.scale)}ms",
                          "heartbeat": f"{int(300_000 / self.scale)}ms"},
            "models": [{"name": "m", "root": str(self.model), "manifest": str(self.manifest),
                        "host_path": "/var/lib/models/m"}],
        }

    def start(self, node: str):
        home = self.work / node
        home.mkdir(exist_ok=True)
        env = {"KUBECONFIG": str(self.api.kubeconfig(home / "kubeconfig")), "MLNODE_NODE_NAME": node}
        log = open(home / "agent.log", "a")
        self.agents[node] = agent_process.serve(self.binary, self.config(node), home, log=log, env=env)

    def stop(self, node: str):
        agent, _ = self.agents.pop(node)
        agent.terminate()
        agent.wait(timeout=30)

    def rss_mib(self) -> float:
        total = 0
        for agent, _ in self.agents.values():
            for line in open(f"/proc/{agent.pid}/status"):
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        return total / 1024 / len(self.agents)


def wait_for(what: str, missing, limit: float):
    """Until `missing()` names nothing; exits naming what is still missing after `limit` s."""
    deadline = time.monotonic() + limit
    while left := missing():
        if time.monotonic() > deadline:
            sys.exit(f"{what}: not within {limit:.0f} s; still missing: {left[:5]}")
        time.sleep(0.2)


def gates_missing(api: FakeApiServer) -> list:
    """The nodes without ModelCacheVerified True and the pods without their gate True."""
    missing = []
    for node, pods in list(api.pods.items()):
        if (api.condition("ModelCacheVerified", node) or {}).get("status") != "True":
            missing.append(node)
        for uid in list(pods):
            if (api.pod_condition(node, uid, GATE) or {}).get("status") != "True":
                missing.append(uid)
    return missing


def diff(after: collections.Counter, before: collections.Counter) -> collections.Counter:
    return collections.Counter({k: v - before[k] for k, v in after.items() if v - before[k]})


WRITES = ("create", "patch", "update", "delete")


def split(counts) -> tuple:
    writes = sum(v for (verb, _, _), v in counts.items() if verb in WRITES)
    return sum(counts.values()), writes


def churn(api: FakeApiServer, pods: int, generation: int):
    """Every node's pods replaced by new ones (one Deployment rollout), spread over 10 s."""
    nodes = list(api.nodes)
    for i, node in enumerate(nodes):
        for uid in list(api.pods[node]):
            api.delete_pod(node, uid)
        for index in range(pods):
            api.put_pod(node, vllm_pod(node, index, generation))
        time.sleep(10 / len(nodes))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=100)
    parser.add_argument("--scale", type=float, default=60.0, help="how much faster than real time the steady hour runs")
    parser.add_argument("--pods", type=int, default=2, help="gated pods per node")
    args = parser.parse_args()
    binary = agent_process.release_binary()
    nodes = [f"fleet-node-{i:04d}" for i in range(args.agents)]
    api = FakeApiServer(nodes, watch_scale=1 / args.scale)
    threading.Thread(target=api.serve_forever, daemon=True).start()
    for node in nodes:
        for index in range(args.pods):
            api.put_pod(node, vllm_pod(node, index, 0))
    phases = {}
    with tempfile.TemporaryDirectory(dir=agent_process.REPO / "target") as tmp:
        work = pathlib.Path(os.environ.get("BENCH_DIR", tmp))
        model = work / "model"
        model.mkdir()
        for i, size in enumerate((4096, 65536, 1 << 20)):
            (model / f"part-{i}.safetensors").write_bytes(os.urandom(size))
        manifest = work / "manifest.json"
        with open(manifest, "w") as out:
            subprocess.run([binary, "manifest", "--revision", "r1", str(model)], stdout=out, check=True)
        time.sleep(2.5)  # older than the racy window: a restart may trust the files unchanged
        fleet = Fleet(binary, api, work, model, manifest, args.scale)

        # The start: every node fresh, every agent at once (a new node group).
        before, began = api.snapshot(), time.monotonic()
        for node in nodes:
            fleet.start(node)
        wait_for("every gate True after the start", lambda: gates_missing(api), 300)
        time.sleep(2)
        phases["start"] = (diff(api.snapshot(), before), time.monotonic() - began)

        # One hour of steady state, scaled.
        before, began = api.snapshot(), time.monotonic()
        time.sleep(HOUR / args.scale)
        phases["steady"] = (diff(api.snapshot(), before), time.monotonic() - began)
        watches = max(len(w) for w in api.watchers.values())
        rss = fleet.rss_mib()

        # A rollout: every agent replaced, one after another, within a minute of real time.
        before, began = api.snapshot(), time.monotonic()
        for node in nodes:
            fleet.stop(node)
            fleet.start(node)
            time.sleep(60 / len(nodes))
        time.sleep(10)
        wait_for("every gate True after the rollout", lambda: gates_missing(api), 120)
        phases["rollout"] = (diff(api.snapshot(), before), time.monotonic() - began)

        # Pod churn: each node's pods replaced.
        before, began = api.snapshot(), time.monotonic()
        churn(api, args.pods, 1)
        wait_for("every new pod's gate True", lambda: gates_missing(api), 120)
        time.sleep(2)
        phases["churn"] = (diff(api.snapshot(), before), time.monotonic() - began)

        # Push-back: the server answers 429 (Retry-After 2) to everything while the pods churn
        # again, for 20 s; then every new pod's gate must be written (no verdict lost).
        before, began = api.snapshot(), time.monotonic()
        api.throttle = 2
        churn(api, args.pods, 2)
        time.sleep(10)
        throttled = diff(api.snapshot(), before)
        throttled_seconds = time.monotonic() - began
        api.throttle = None
        lifted = time.monotonic()
        wait_for("every gate written after the push-back", lambda: gates_missing(api), 180)
        recovered = time.monotonic() - lifted
        phases["push-back"] = (diff(api.snapshot(), before), time.monotonic() - began)

        for node in list(fleet.agents):
            fleet.stop(node)
    api.close()
    print_tables(args, phases, watches, rss, throttled, throttled_seconds, recovered)


def print_tables(args, phases, watches, rss, throttled, throttled_seconds, recovered):
    n = args.agents
    steady, steady_seconds = phases["steady"]
    per_hour = HOUR / (steady_seconds * args.scale)  # scaled seconds -> one real hour
    lines = [
        f"Steady state, {n} agents, one hour at {args.scale:.0f}x (readiness.heartbeat 5 min, "
        f"{args.pods} gated pods a node, watches ended by the server at their timeoutSeconds):",
        "",
        "| verb | resource | code | per node and hour | 1,000 nodes (requests/s) |",
        "| --- | --- | --- | ---: | ---: |",
    ]
    for (verb, resource, code), value in sorted(steady.items()):
        hourly = value / n * per_hour
        lines.append(f"| {verb} | {resource} | {code} | {hourly:.1f} | {hourly * 1000 / HOUR:.2f} |")
    total, writes = split(steady)
    agent_writes = writes / n * per_hour
    lines += [
        f"| **all** | | | **{total / n * per_hour:.1f}** | **{total / n * per_hour * 1000 / HOUR:.2f}** |",
        f"| writes | | | {agent_writes:.1f} | {agent_writes * 1000 / HOUR:.2f} |",
        f"| kubelet's writes (Lease 10 s, node status 5 min) | | | {KUBELET_WRITES_PER_HOUR:.0f} | "
        f"{KUBELET_WRITES_PER_HOUR * 1000 / HOUR:.2f} |",
        f"| node-problem-detector's writes (heartbeat 5 min) | | | {NPD_WRITES_PER_HOUR:.0f} | "
        f"{NPD_WRITES_PER_HOUR * 1000 / HOUR:.2f} |",
        "",
        f"Agent writes / kubelet writes: {agent_writes / KUBELET_WRITES_PER_HOUR:.3f}; open watches per agent: "
        f"{watches}; agent RSS {rss:.1f} MiB.",
        "",
        "The phases, less the steady state's own share of each window (its heartbeats and watch renewals, at the",
        "scaled rate); per node:",
        "",
        "| phase | what | requests | writes | by verb and resource | seconds |",
        "| --- | --- | ---: | ---: | --- | ---: |",
    ]
    what = {
        "start": "every agent started on a fresh node",
        "rollout": "every agent restarted within a minute",
        "churn": f"each node's {args.pods} pods replaced",
        "push-back": "429 Retry-After 2 for 20 s while the pods churn",
    }
    extras = {}
    for phase in ("start", "rollout", "churn", "push-back"):
        counts, seconds = phases[phase]
        baseline = {k: v * seconds / steady_seconds for k, v in steady.items()}
        extra = collections.Counter()
        for (verb, resource, code) in set(counts) | set(baseline):
            extra[(verb, resource, code)] += counts[(verb, resource, code)] - baseline.get((verb, resource, code), 0)
        extras[phase] = extra
        total, writes = split(extra)
        by = collections.Counter()
        for (verb, resource, code), value in extra.items():
            by[f"{verb} {resource}" + ("" if code.startswith("2") else f" {code}")] += value / n
        named = ", ".join(f"{k} {v:.1f}" for k, v in sorted(by.items(), key=lambda kv: -kv[1]) if v >= 0.05)
        lines.append(f"| {phase} | {what[phase]} | {total / n:.1f} | {writes / n:.1f} | {named} | {seconds:.0f} |")
    # At 5,000 nodes: each restart's own requests spread over the minute, and the steady state of
    # the 5,000 agents (at its real, unscaled rate) beside them.
    total, writes = split(extras["rollout"])
    steady_total, steady_writes = split(steady)
    rate_5000 = 5000 * (total / n / 60 + steady_total / n * per_hour / HOUR)
    writes_5000 = 5000 * (writes / n / 60 + steady_writes / n * per_hour / HOUR)
    refused = sum(v for (_, _, code), v in throttled.items() if code == "429")
    lines += [
        "",
        f"Rollout at 5,000 nodes, all restarted within one minute: {total / n:.1f} requests per restart, "
        f"{writes / n:.1f} of them writes -> {rate_5000:.0f} requests/s ({writes_5000:.0f} writes/s) for that minute, "
        f"steady state included; the 5,000 kubelets' Lease renewals alone are 500 writes/s, every second.",
        f"Push-back: {refused / n / throttled_seconds:.2f} refused requests per agent and second while "
        f"throttled ({refused} in {throttled_seconds:.0f} s); every gate written {recovered:.1f} s after the "
        f"server answered again.",
    ]
    table = "\n".join(lines)
    print(table)
    (agent_process.REPO / "target" / "bench_fleet.md").write_text(table + "\n")


if __name__ == "__main__":
    main()
