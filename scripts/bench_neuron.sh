#!/usr/bin/env bash
# Cost of one Neuron scrape on sysfs trees shaped as driver 2.25 writes them on an inf2.48xlarge
# (12 devices x 2 cores) and a trn2.48xlarge (16 devices x 8 physical cores): microseconds per scrape
# (benches/neuron_scrape.rs, release build) and system calls per scrape (the same binary under
# `strace -c`; Debian package strace). Prints one Markdown table.
# The trees live on tmpfs (/dev/shm), not sysfs: kernfs answers opens and reads from memory too, so
# the syscall count transfers exactly and the time roughly.
set -euo pipefail
cd "$(dirname "$0")/.."
scrapes=${1:-500}
command -v strace >/dev/null || { echo "bench_neuron: needs strace (apt-get install strace)" >&2; exit 2; }

cargo bench -q --bench neuron_scrape --no-run 2>/dev/null
binary=$(ls -t target/release/deps/neuron_scrape-* | grep -v '\.d$' | head -n 1)
# Syscalls of N scrapes minus those of 1 (tree generation and start-up), per scrape.
# strace -c columns: % time, seconds, usecs/call, calls, [errors], syscall.
calls() { awk -v s="$2" '$NF==s{print $4}' "$1"; }
count() { strace -f -c -o "$1" "$binary" "$2" "$3" >/dev/null; calls "$1" total; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

echo "| tree | series | us per scrape | syscalls per scrape | of which | CPU s/hour at one scrape per 15 s |"
echo "| --- | ---: | ---: | ---: | --- | ---: |"
for shape in inf2.48xlarge trn2.48xlarge; do
    line=$("$binary" "$scrapes" "$shape" | grep '^neuron scrape')
    us=$(sed -E 's/.* ([0-9.]+) us per scrape.*/\1/' <<<"$line")
    series=$(sed -E 's/.*cores, ([0-9]+) series.*/\1/' <<<"$line")
    shape_text=$(sed -E 's/^neuron scrape: ([^,]+),.*/\1/' <<<"$line")
    one=$(count "$tmp/one" 1 "$shape")
    many=$(count "$tmp/many" 21 "$shape")
    per=$(( (many - one) / 20 ))
    breakdown=$(for f in openat read close getdents64 newfstatat; do
        a=$(calls "$tmp/one" $f); b=$(calls "$tmp/many" $f)
        printf '%s %d, ' "$f" $(( (${b:-0} - ${a:-0}) / 20 )); done)
    cpu_hour=$(awk -v us="$us" 'BEGIN{printf "%.2f", us * 240 / 1e6}')
    echo "| $shape_text | $series | $us | $per | ${breakdown%, } | $cpu_hour |"
done
