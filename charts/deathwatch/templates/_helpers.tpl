{{/* The labels every object carries: the product, and which part of it. */}}
{{- define "deathwatch.labels" -}}
app.kubernetes.io/name: deathwatch
app.kubernetes.io/component: {{ . }}
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
