#!/usr/bin/env bash
# The Helm chart reads what it shares with kustomize from copies inside the chart (Helm reads no
# file outside it): the base objects it derives its own from, and the dashboards. This writes
# them, and the schema of the chart's `config` value from the agent's own
# (`mlnode-agent config --schema`); agent/tests/integration/helm.rs fails, naming this script,
# while a copy differs.
set -euo pipefail
cd "$(dirname "$0")/.."
chart=deploy/helm/mlnode-agent
rm -rf "$chart/files/base" "$chart/files/dashboards"
mkdir -p "$chart/files/base" "$chart/files/dashboards"
for file in config.yaml daemonset.yaml rbac.yaml validating-admission-policy.yaml; do
    cp "deploy/daemonset/base/$file" "$chart/files/base/$file"
done
cp deploy/daemonset/components/prometheus-operator/podmonitor.yaml "$chart/files/base/podmonitor.yaml"
cp deploy/daemonset/components/prometheus-operator/prometheusrule.yaml "$chart/files/base/prometheusrule.yaml"
cp deploy/daemonset/components/startup-taint/rbac.yaml "$chart/files/base/startup-taint-rbac.yaml"
cp deploy/daemonset/components/model-labels/rbac.yaml "$chart/files/base/model-labels-rbac.yaml"
cp deploy/daemonset/components/servicemonitor/service.yaml "$chart/files/base/servicemonitor.yaml"
cp dashboards/*.json "$chart/files/dashboards/"
schema=$(cargo run --quiet --bin mlnode-agent -- config --schema)
SCHEMA="$schema" python3 - "$chart/values.schema.json" <<'PY'
import json, os, sys
path = sys.argv[1]
with open(path) as f:
    values = json.load(f)
values["properties"]["config"] = json.loads(os.environ["SCHEMA"])
with open(path, "w") as f:
    json.dump(values, f, indent=2)
    f.write("\n")
PY
