#!/usr/bin/env python3
"""Compares the agent's /metrics with `nvidia-smi --query-gpu` output, field by field.

usage: gpu_smoke_compare.py METRICS_TXT SMI_CSV AGENT_LOG

SMI_CSV is `nvidia-smi --query-gpu=index,uuid,pci.bus_id,name,driver_version,memory.total,memory.used,
memory.free,temperature.gpu,power.draw,clocks.sm,clocks.mem,utilization.gpu --format=csv,noheader,nounits`.
Prints one line per GPU and field; exits 1 on a mismatch beyond sampling noise (the two tools read at
different instants), 0 otherwise. Used by tests/gpu-smoke.sh, and tested against the fake NVML by
agent/tests/gpu.rs.
"""
import csv
import re
import sys

metrics, smi, log = (open(p).read() for p in sys.argv[1:4])
series = {}
for line in metrics.splitlines():
    m = re.match(r'^(\w+)\{(.*)\} (\S+)$', line)
    if m:
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
        series.setdefault(m.group(1), {})[labels.get("gpu")] = (labels, float(m.group(3)))
up = re.search(r'mlnode_collector_up\{collector="nvml".*\} (\S+)', metrics)
if not up or up.group(1) != "1":
    sys.exit(f"nvml collector is not up:\n{log}")
# (field, agent series, convert agent value to nvidia-smi's unit, tolerance: absolute, relative)
checks = [
    ("memory.total MiB", "mlnode_gpu_memory_total_bytes", lambda v: v / 2**20, 1, 0),
    ("memory.used MiB", "mlnode_gpu_memory_used_bytes", lambda v: v / 2**20, 256, 0.05),
    ("memory.free MiB", "mlnode_gpu_memory_free_bytes", lambda v: v / 2**20, 256, 0.05),
    ("temperature C", "mlnode_gpu_temperature_celsius", lambda v: v, 3, 0),
    ("power W", "mlnode_gpu_power_watts", lambda v: v, 15, 0.2),
    ("clocks.sm MHz", "mlnode_gpu_sm_clock_hertz", lambda v: v / 1e6, 150, 0.15),
    ("clocks.mem MHz", "mlnode_gpu_memory_clock_hertz", lambda v: v / 1e6, 50, 0.05),
    ("utilization %", "mlnode_gpu_utilization_ratio", lambda v: v * 100, 30, 0),
]
failures = 0
print(f"{'gpu':>3} {'field':<18} {'agent':>12} {'nvidia-smi':>12}  ok")
for row in csv.reader(smi.splitlines(), skipinitialspace=True):
    index, uuid, bus, name, driver = row[:5]
    values = dict(zip([c[0] for c in checks], row[5:]))
    labels = series.get("mlnode_gpu_memory_total_bytes", {}).get(index, ({}, 0))[0]
    for key, want in (("UUID", uuid), ("modelName", name), ("DCGM_FI_DRIVER_VERSION", driver)):
        ok = labels.get(key) == want
        failures += not ok
        print(f"{index:>3} {key:<18} {labels.get(key, '-'):>12} {want:>12}  {'yes' if ok else 'NO'}")
    ok = labels.get("pci_bus_id", "").lower() == bus.lower()
    failures += not ok
    print(f"{index:>3} {'pci_bus_id':<18} {labels.get('pci_bus_id', '-'):>12} {bus:>12}  {'yes' if ok else 'NO'}")
    for field, name_, convert, absolute, relative in checks:
        text = values.get(field, "").strip()
        got = series.get(name_, {}).get(index)
        if text in ("[N/A]", "[Not Supported]", ""):
            ok = got is None
            print(f"{index:>3} {field:<18} {'absent' if got is None else got[1]:>12} {text or '-':>12}  {'yes' if ok else 'NO'}")
        else:
            want = float(text)
            have = convert(got[1]) if got else None
            ok = have is not None and abs(have - want) <= max(absolute, relative * want)
            shown = f"{have:.1f}" if have is not None else "absent"
            print(f"{index:>3} {field:<18} {shown:>12} {want:>12.1f}  {'yes' if ok else 'NO'}")
        failures += not ok
print(f"\n{failures} mismatch(es)")
sys.exit(1 if failures else 0)
