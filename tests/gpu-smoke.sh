#!/usr/bin/env bash
# Real-GPU smoke test, for a machine with an NVIDIA GPU and driver (never run by CI: it has none).
# Needs the repository, cargo, python3, curl and nvidia-smi. Builds the agent, serves against the real
# libnvidia-ml.so.1 as the DaemonSet runs it (a non-root UID, 65532, through setpriv when started as
# root), and prints one table comparing /metrics with `nvidia-smi --query-gpu`: identity, memory
# (reserved included), temperatures, power, clocks, utilisations, clock event reasons, remapped rows,
# and the presence of dcgm-exporter's default DCGM_FI_* series. Exits non-zero on a mismatch beyond
# sampling noise, printing the agent's log whenever it fails. Read-only: it changes no GPU setting.
set -euo pipefail
cd "$(dirname "$0")/.."

command -v nvidia-smi >/dev/null || { echo "gpu-smoke: nvidia-smi not found; this needs an NVIDIA GPU" >&2; exit 2; }
cargo build --release -q -p mlnode-agent

work=$(mktemp -d)
chmod 755 "$work"
port=${MLNODE_SMOKE_PORT:-19400}
cat > "$work/config.yaml" <<YAML
listen: 127.0.0.1:$port
node_name: gpu-smoke
models: []
nvml:
  enabled: true
  sample_interval: 500ms
  dcgm_names: true
YAML
chmod 644 "$work/config.yaml"
run_as=()
if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null; then
    # The DaemonSet's user: what NVML gives a non-root process is what the agent gets in a cluster.
    run_as=(setpriv --reuid=65532 --regid=65532 --clear-groups)
    cp target/release/mlnode-agent "$work/mlnode-agent"
    binary="$work/mlnode-agent"
else
    binary=target/release/mlnode-agent
fi
"${run_as[@]}" "$binary" serve --config "$work/config.yaml" 2> "$work/agent.log" &
agent=$!
finish() {
    status=$?
    kill "$agent" 2>/dev/null || true
    if [ "$status" != 0 ]; then
        echo "--- agent log ($work/agent.log) ---" >&2
        cat "$work/agent.log" >&2
    fi
    rm -rf "$work"
}
trap finish EXIT

for _ in $(seq 1 150); do
    if curl -sf "localhost:$port/metrics" -o "$work/metrics.txt" && grep -q '^mlnode_gpu_count' "$work/metrics.txt"; then break; fi
    if ! kill -0 "$agent" 2>/dev/null; then echo "gpu-smoke: the agent exited" >&2; exit 1; fi
    sleep 0.1
done
grep -q '^mlnode_gpu_count' "$work/metrics.txt" || { echo "gpu-smoke: no GPU series after 15 s" >&2; exit 1; }
sleep 1.5  # a few samples, so clocks and power have settled and GPM has two samples
curl -sf "localhost:$port/metrics" -o "$work/metrics.txt"

# Ask only for the fields this nvidia-smi knows (older ones lack clocks_event_reasons, remapped rows).
fields=index,uuid,pci.bus_id,name,driver_version
for f in memory.total memory.reserved memory.used memory.free temperature.gpu temperature.memory \
         power.draw clocks.sm clocks.mem utilization.gpu utilization.memory utilization.encoder \
         utilization.decoder clocks_event_reasons.active remapped_rows.correctable \
         remapped_rows.uncorrectable remapped_rows.pending remapped_rows.failure; do
    if nvidia-smi --help-query-gpu | grep -q "\"$f\""; then fields="$fields,$f"; fi
done
nvidia-smi --query-gpu="$fields" --format=csv,nounits > "$work/smi.csv"

python3 tests/gpu_smoke_compare.py "$work/metrics.txt" "$work/smi.csv" "$work/agent.log"
