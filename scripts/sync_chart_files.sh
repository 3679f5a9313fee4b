#!/usr/bin/env bash
# The Helm chart reads what it shares with kustomize from copies inside the chart (Helm reads no
# file outside it): the base objects it derives its own from, and the dashboards. This writes
# them; agent/tests/integration/helm.rs fails, naming this script, while a copy differs.
set -euo pipefail
cd "$(dirname "$0")/.."
chart=deploy/helm/mlnode-agent/files
rm -rf "$chart/base" "$chart/dashboards"
mkdir -p "$chart/base" "$chart/dashboards"
for file in config.yaml daemonset.yaml podmonitor.yaml prometheusrule.yaml rbac.yaml validating-admission-policy.yaml; do
    cp "deploy/daemonset/base/$file" "$chart/base/$file"
done
cp deploy/daemonset/components/startup-taint/rbac.yaml "$chart/base/startup-taint-rbac.yaml"
cp deploy/daemonset/components/model-labels/rbac.yaml "$chart/base/model-labels-rbac.yaml"
cp deploy/daemonset/components/servicemonitor/service.yaml "$chart/base/servicemonitor.yaml"
cp dashboards/*.json "$chart/dashboards/"
