{{/* What selects a part's pods: the product and the part. Never more: a selector cannot
change after install, and these two are what every release of this chart has selected by. */}}
{{- define "deathwatch.selectorLabels" -}}
app.kubernetes.io/name: deathwatch
app.kubernetes.io/component: {{ . }}
{{- end }}

{{/* The labels every object carries, Kubernetes' recommended set: the product, the part, the
release, the version; and, where Helm installs it, the chart and who manages it
(hack/render_manifests.py leaves those two out of the kustomize manifests). (list $ PART) */}}
{{- define "deathwatch.labels" -}}
{{- $root := index . 0 -}}
{{ include "deathwatch.selectorLabels" (index . 1) }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/version: {{ $root.Chart.AppVersion | quote }}
app.kubernetes.io/part-of: deathwatch
app.kubernetes.io/managed-by: {{ $root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" $root.Chart.Name $root.Chart.Version }}
{{- end }}

{{/* An image reference: repository@digest, or repository:tag (tag: the appVersion). */}}
{{- define "deathwatch.image" -}}
{{- $image := index . 0 -}}
{{- $root := index . 1 -}}
{{- if $image.digest -}}
{{ $image.repository }}@{{ $image.digest }}
{{- else -}}
{{ $image.repository }}:{{ $image.tag | default $root.Chart.AppVersion }}
{{- end -}}
{{- end }}
