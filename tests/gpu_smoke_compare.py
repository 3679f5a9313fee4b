#!/usr/bin/env python3
"""Compares the agent's /metrics with `nvidia-smi --query-gpu` output, field by field.

usage: gpu_smoke_compare.py METRICS_TXT SMI_CSV AGENT_LOG

SMI_CSV is `nvidia-smi --query-gpu=<fields> --format=csv,nounits` output WITH its header line: the
columns are found by name, so a driver whose nvidia-smi lacks a field (tests/gpu-smoke.sh asks only
for those `--help-query-gpu` lists) simply has fewer checks. Prints one table, one row per GPU and
field; exits 1 on a mismatch beyond sampling noise (the two tools read at different instants), 0
otherwise. Used by tests/gpu-smoke.sh, and tested against the fake NVML by agent/tests/gpu.rs.
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
        key = (labels.get("gpu"), labels.get("cause"), labels.get("direction"))
        series.setdefault(m.group(1), {})[key] = (labels, float(m.group(3)))
up = re.search(r'mlnode_collector_up\{collector="nvml".*\} (\S+)', metrics)
if not up or up.group(1) != "1":
    sys.exit(f"nvml collector is not up:\n{log}")


def agent(name, gpu, cause=None, direction=None):
    found = series.get(name, {}).get((gpu, cause, direction))
    return found[1] if found else None


MIB = 2**20
# nvidia-smi field -> (agent series, its labels, convert to nvidia-smi's unit, tolerance abs, rel)
NUMERIC = {
    "memory.total": ("mlnode_gpu_memory_total_bytes", {}, lambda v: v / MIB, 1, 0),
    "memory.reserved": ("mlnode_gpu_memory_reserved_bytes", {}, lambda v: v / MIB, 1, 0),
    "memory.used": ("mlnode_gpu_memory_used_bytes", {}, lambda v: v / MIB, 256, 0.05),
    "memory.free": ("mlnode_gpu_memory_free_bytes", {}, lambda v: v / MIB, 256, 0.05),
    "temperature.gpu": ("mlnode_gpu_temperature_celsius", {}, lambda v: v, 3, 0),
    "temperature.memory": ("mlnode_gpu_memory_temperature_celsius", {}, lambda v: v, 3, 0),
    "power.draw": ("mlnode_gpu_power_watts", {}, lambda v: v, 15, 0.2),
    "clocks.sm": ("mlnode_gpu_sm_clock_hertz", {}, lambda v: v / 1e6, 150, 0.15),
    "clocks.mem": ("mlnode_gpu_memory_clock_hertz", {}, lambda v: v / 1e6, 50, 0.05),
    "utilization.gpu": ("mlnode_gpu_utilization_ratio", {}, lambda v: v * 100, 30, 0),
    "utilization.memory": ("mlnode_gpu_memory_copy_utilization_ratio", {}, lambda v: v * 100, 30, 0),
    "utilization.encoder": ("mlnode_gpu_encoder_utilization_ratio", {}, lambda v: v * 100, 10, 0),
    "utilization.decoder": ("mlnode_gpu_decoder_utilization_ratio", {}, lambda v: v * 100, 10, 0),
    "remapped_rows.correctable": ("mlnode_gpu_remapped_rows_total", {"cause": "correctable"}, lambda v: v, 0, 0),
    "remapped_rows.uncorrectable": ("mlnode_gpu_remapped_rows_total", {"cause": "uncorrectable"}, lambda v: v, 0, 0),
}
# Yes/No fields -> the agent's 0/1 gauge.
FLAGS = {
    "remapped_rows.pending": "mlnode_gpu_row_remap_pending",
    "remapped_rows.failure": "mlnode_gpu_row_remap_failed",
}
# The clock event reasons mask, without gpu_idle (0x1), which flips with load between two reads.
REASONS = ("clocks_event_reasons.active", "clocks_throttle_reasons.active")
# dcgm-exporter's default fields every GPU that NVML reads at all has (the rest depend on the GPU).
DCGM_ALWAYS = ["DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_GPU_TEMP",
               "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK",
               "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
               "DCGM_FI_DEV_MEM_COPY_UTIL"]
UNAVAILABLE = ("[N/A]", "[Not Supported]", "N/A", "")

rows = list(csv.reader(smi.splitlines(), skipinitialspace=True))
header = [re.sub(r"\s*\[.*\]$", "", h.strip()) for h in rows[0]]
failures = 0
table = []


def check(gpu, field, have, want, ok):
    global failures
    failures += not ok
    table.append((gpu, field, have, want, "yes" if ok else "NO"))


for row in rows[1:]:
    smi_row = dict(zip(header, (v.strip() for v in row)))
    gpu = smi_row["index"]
    labels = series.get("mlnode_gpu_memory_total_bytes", {}).get((gpu, None, None), ({}, 0))[0]
    for key, field in (("UUID", "uuid"), ("modelName", "name"), ("DCGM_FI_DRIVER_VERSION", "driver_version")):
        want = smi_row.get(field, "")
        check(gpu, key, labels.get(key, "-"), want, labels.get(key) == want)
    bus = smi_row.get("pci.bus_id", "")
    check(gpu, "pci_bus_id", labels.get("pci_bus_id", "-"), bus, labels.get("pci_bus_id", "").lower() == bus.lower())
    for field, (name, extra, convert, absolute, relative) in NUMERIC.items():
        if field not in smi_row:
            continue
        text = smi_row[field]
        got = agent(name, gpu, extra.get("cause"))
        if text in UNAVAILABLE:
            check(gpu, field, "absent" if got is None else got, text or "-", got is None)
            continue
        want = float(text)
        have = convert(got) if got is not None else None
        ok = have is not None and abs(have - want) <= max(absolute, relative * want)
        check(gpu, field, "absent" if have is None else f"{have:.1f}", f"{want:.1f}", ok)
    for field, name in FLAGS.items():
        if field in smi_row and smi_row[field] not in UNAVAILABLE:
            got = agent(name, gpu)
            want = 1.0 if smi_row[field].lower() == "yes" else 0.0
            check(gpu, field, "absent" if got is None else f"{got:.0f}", smi_row[field], got == want)
    for field in REASONS:
        if field in smi_row and smi_row[field] not in UNAVAILABLE:
            mask = int(smi_row[field], 16)
            got = agent("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", gpu)
            have = int(got) if got is not None else None
            ok = have is not None and (have & ~1) == (mask & ~1)
            check(gpu, field, "absent" if have is None else hex(have), hex(mask), ok)
            break
    missing = [name for name in DCGM_ALWAYS if agent(name, gpu) is None]
    check(gpu, "DCGM_FI_* present", f"{len(DCGM_ALWAYS) - len(missing)}/{len(DCGM_ALWAYS)}",
          ", ".join(missing) or "all", not missing)

print("| gpu | field | agent | nvidia-smi | ok |")
print("| ---: | --- | ---: | ---: | --- |")
for gpu, field, have, want, ok in table:
    print(f"| {gpu} | {field} | {have} | {want} | {ok} |")
print(f"\n{failures} mismatch(es)")
sys.exit(1 if failures else 0)
