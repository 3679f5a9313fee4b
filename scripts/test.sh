#!/usr/bin/env bash
# Every test of the project, on a fresh machine: installs what the tests need, then checks
# formatting and lints, then runs the test suite. `.ci/run` calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."

# The bundle tests sign models with the real OpenSSF model_signing tool; the deploy tests validate
# every object against the Kubernetes schema with kubernetes-validate.
if ! python3 -c 'import model_signing' >/dev/null 2>&1 || ! command -v kubernetes-validate >/dev/null 2>&1; then
    python3 -m pip install --quiet --disable-pip-version-check 'model-signing>=1.1,<2' pyopenssl 'kubernetes-validate>=1.33'
fi

# The end-to-end tests start a real Prometheus on loopback to scrape the agent.
if ! command -v prometheus >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi

cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace
