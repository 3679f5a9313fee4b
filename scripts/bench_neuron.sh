#!/usr/bin/env bash
# Cost of one Neuron scrape on a generated 12-device x 2-core (inf2.48xlarge-shaped) sysfs tree:
# microseconds per scrape (benches/neuron_scrape.rs, release build) and system calls per scrape
# (the same binary under `strace -c`; Debian package strace). Prints one Markdown table.
# The tree lives on the temp directory's file system, not sysfs: kernfs answers opens and reads
# from memory too, so the syscall count transfers exactly and the time roughly.
set -euo pipefail
cd "$(dirname "$0")/.."
scrapes=${1:-2000}
command -v strace >/dev/null || { echo "bench_neuron: needs strace (apt-get install strace)" >&2; exit 2; }

line=$(cargo bench -q --bench neuron_scrape -- "$scrapes" 2>/dev/null | grep '^neuron scrape')
us=$(sed -E 's/.* ([0-9.]+) us per scrape.*/\1/' <<<"$line")
series=$(sed -E 's/.*cores, ([0-9]+) series.*/\1/' <<<"$line")
binary=$(ls -t target/release/deps/neuron_scrape-* | grep -v '\.d$' | head -n 1)

# Syscalls of N scrapes minus those of 1 (tree generation and start-up), per scrape.
# strace -c columns: % time, seconds, usecs/call, calls, [errors], syscall.
calls() { awk -v s="$2" '$NF==s{print $4}' "$1"; }
count() { strace -f -c -o "$1" "$binary" "$2" >/dev/null; calls "$1" total; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
one=$(count "$tmp/one" 1)
many=$(count "$tmp/many" 201)
per=$(( (many - one) / 200 ))
breakdown=$(for f in openat read close getdents64 newfstatat; do
    a=$(calls "$tmp/one" $f); b=$(calls "$tmp/many" $f)
    printf '%s %d, ' "$f" $(( (${b:-0} - ${a:-0}) / 200 )); done)

cpu_hour=$(awk -v us="$us" 'BEGIN{printf "%.2f", us * 240 / 1e6}')
echo "| tree | series | us per scrape | syscalls per scrape | of which | CPU s/hour at one scrape per 15 s |"
echo "| --- | ---: | ---: | ---: | --- | ---: |"
echo "| 12 devices x 2 cores | $series | $us | $per | ${breakdown%, } | $cpu_hour |"
