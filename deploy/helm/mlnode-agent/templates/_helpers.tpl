{{/* The labels every object of the chart carries. */}}
{{- define "mlnode-agent.labels" -}}
app.kubernetes.io/name: mlnode-agent
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/*
The objects of one of the chart's copies of kustomize's base files (files/base/, written by
scripts/sync_chart_files.sh), as a list: what the chart shares with kustomize is read from there,
never written twice. `replace` pairs are applied to the text first.
*/}}
{{- define "mlnode-agent.base" -}}
{{- $text := .root.Files.Get (printf "files/base/%s" .file) -}}
{{- if not $text }}{{ fail (printf "the chart lacks files/base/%s: run scripts/sync_chart_files.sh" .file) }}{{ end -}}
{{- range $pair := (default list .replace) }}{{ $text = replace (index $pair 0) (index $pair 1) $text }}{{ end -}}
{{- $objects := list -}}
{{- range $doc := regexSplit "(?m)^---\\s*$" $text -1 -}}
{{- $object := fromYaml $doc -}}
{{- if $object.kind }}{{ $objects = append $objects $object }}{{ end -}}
{{- end -}}
{{- toYaml (dict "objects" $objects) -}}
{{- end -}}

{{/*
One object, in the release's namespace where kustomize's is mlnode-system (its own and its
subjects'), with the chart's labels added to its own.
*/}}
{{- define "mlnode-agent.emit" -}}
{{- $object := .object -}}
{{- $namespace := .root.Release.Namespace -}}
{{- if eq (dig "metadata" "namespace" "" $object) "mlnode-system" }}{{ $_ := set $object.metadata "namespace" $namespace }}{{ end -}}
{{- range $subject := (default list $object.subjects) }}{{ if eq (default "" $subject.namespace) "mlnode-system" }}{{ $_ := set $subject "namespace" $namespace }}{{ end }}{{ end -}}
{{- $labels := merge (default dict $object.metadata.labels) (default dict .labels) (include "mlnode-agent.labels" .root | fromYaml) -}}
{{- $_ := set $object.metadata "labels" $labels }}
---
{{ toYaml $object }}
{{- end -}}

{{/* The `release` label kube-prometheus-stack selects by, where one is set. */}}
{{- define "mlnode-agent.prometheusLabels" -}}
{{- if .Values.prometheus.release }}{{ toYaml (dict "release" .Values.prometheus.release) }}{{ end -}}
{{- end -}}
