#!/usr/bin/env bash
# Real-GPU smoke test, for a machine with an NVIDIA GPU and driver (never run by CI: it has none).
# Builds the agent, serves against the real libnvidia-ml.so.1, prints /metrics beside
# `nvidia-smi --query-gpu` for the same fields, and exits non-zero on a mismatch beyond sampling
# noise. Read-only: it changes no GPU setting.
set -euo pipefail
cd "$(dirname "$0")/.."

command -v nvidia-smi >/dev/null || { echo "gpu-smoke: nvidia-smi not found; this needs an NVIDIA GPU" >&2; exit 2; }
cargo build --release -q -p mlnode-agent

work=$(mktemp -d)
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
target/release/mlnode-agent serve --config "$work/config.yaml" 2> "$work/agent.log" &
agent=$!
trap 'kill $agent 2>/dev/null; rm -rf "$work"' EXIT

for _ in $(seq 1 100); do
    if curl -sf "localhost:$port/metrics" -o "$work/metrics.txt" && grep -q '^mlnode_gpu_count' "$work/metrics.txt"; then break; fi
    sleep 0.1
done
sleep 1.5  # a few samples, so clocks and power have settled
curl -sf "localhost:$port/metrics" -o "$work/metrics.txt"
nvidia-smi --query-gpu=index,uuid,pci.bus_id,name,driver_version,memory.total,memory.used,memory.free,temperature.gpu,power.draw,clocks.sm,clocks.mem,utilization.gpu \
    --format=csv,noheader,nounits > "$work/smi.csv"

python3 tests/gpu_smoke_compare.py "$work/metrics.txt" "$work/smi.csv" "$work/agent.log"
