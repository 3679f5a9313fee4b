#!/usr/bin/env bash
# The fuzz targets of agent/tests/integration/fuzz.rs, run longer than the test suite runs them.
#   scripts/fuzz.sh [CASES]     (default 100000 cases per target; the suite runs 256)
# A failure is shrunk and saved in agent/tests/integration/fuzz.proptest-regressions, which every later run
# (the suite included) replays first: commit that file with the fix, and it is a regression test.
set -euo pipefail
cd "$(dirname "$0")/.."
cases="${1:-100000}"
started=$(date +%s)
PROPTEST_CASES="$cases" cargo test --release -p mlnode-agent --test integration fuzz:: -- --test-threads 2
echo "fuzz: ${cases} cases per target in $(( $(date +%s) - started )) s"
