{{/* The product's name in labels and selectors: "deathwatch", or nameOverride. A selector
cannot change after install: set it at install or never. */}}
{{- define "deathwatch.name" -}}
{{- .Values.nameOverride | default "deathwatch" | trunc 63 | trimSuffix "-" -}}
{{- end }}

{{/* What every object's name starts with: the release's name when it holds the product's
("deathwatch", "deathwatch-staging"), else RELEASE-deathwatch; or fullnameOverride. Two
releases never share a name, cluster-scoped objects included; a release named deathwatch (the
kustomize manifests are its render) keeps the names it always had. Cut to 40, so that the
longest suffix (-controller-firewall-coverage) keeps a name within 63. */}}
{{- define "deathwatch.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "deathwatch.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end }}

{{/* Where the metrics ports' certificate comes from: "cert-manager" (a Certificate), "chart"
(the CA and certificate this chart makes: monitoring/generated-tls.yaml), or nothing (each
process signs its own at start, and scrapers skip verifying it). Both components mount the
Secret FULLNAME-metrics-tls whenever it is not nothing. */}}
{{- define "deathwatch.metricsTLS" -}}
{{- $tls := .Values.metrics.tls -}}
{{- if $tls.certManager.enabled -}}
cert-manager
{{- else if and $tls.generated.enabled (or .Values.metrics.serviceMonitor.enabled .Values.metrics.podMonitor.enabled) -}}
chart
{{- end -}}
{{- end }}

{{/* A part's ServiceAccount: FULLNAME-PART, or its serviceAccount.name (with create false,
one the platform made). (list $ PART) */}}
{{- define "deathwatch.serviceAccountName" -}}
{{- $root := index . 0 -}}
{{- $part := index . 1 -}}
{{- $sa := (index $root.Values $part).serviceAccount -}}
{{- $sa.name | default (printf "%s-%s" (include "deathwatch.fullname" $root) $part) -}}
{{- end }}

{{/* What selects a part's pods: the product and the part. Never more: a selector cannot
change after install, and these two are what every release of this chart has selected by.
(list $ PART) */}}
{{- define "deathwatch.selectorLabels" -}}
app.kubernetes.io/name: {{ include "deathwatch.name" (index . 0) }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{/* The labels every object carries, Kubernetes' recommended set: the product, the part, the
release, the version; and, where Helm installs it, the chart and who manages it
(hack/render_manifests.py leaves those two out of the kustomize manifests). (list $ PART) */}}
{{- define "deathwatch.labels" -}}
{{- $root := index . 0 -}}
{{ include "deathwatch.selectorLabels" (list $root (index . 1)) }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/version: {{ $root.Chart.AppVersion | quote }}
app.kubernetes.io/part-of: deathwatch
app.kubernetes.io/managed-by: {{ $root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" $root.Chart.Name $root.Chart.Version }}
{{- with $root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* An image reference: repository@digest, or repository:tag (tag: the appVersion). */}}
{{/* Where the release's objects go: namespaceOverride, else the release's namespace (as
kube-prometheus-stack's charts do, for an umbrella chart that installs into another). ($) */}}
{{- define "deathwatch.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride -}}
{{- end }}

{{/* An image's reference: registry/repository, then @digest or :tag (the chart's appVersion
by default). The registry is global.imageRegistry, else the image's own (`ghcr.io`), replaced
whole, as Bitnami's and kube-prometheus-stack's charts do: a mirror is
`registry.corp.example/mirror/deathwatch-dev/controller`. A repository that names its own
host (its first part has a dot or a port, or is localhost: Docker's rule) is taken as it is,
so `--set controller.image.repository=my.registry/x` means my.registry/x. (list image $) */}}
{{- define "deathwatch.image" -}}
{{- $image := index . 0 -}}
{{- $root := index . 1 -}}
{{- $registry := $root.Values.global.imageRegistry | default $image.registry | default "" -}}
{{- $parts := splitList "/" $image.repository -}}
{{- $first := first $parts -}}
{{- $hosted := and (gt (len $parts) 1) (or (contains "." $first) (contains ":" $first) (eq $first "localhost")) -}}
{{- $repository := ternary $image.repository (printf "%s/%s" (trimSuffix "/" $registry) $image.repository) (or $hosted (eq $registry "")) -}}
{{- if $image.digest -}}
{{ $repository }}@{{ $image.digest }}
{{- else -}}
{{ $repository }}:{{ $image.tag | default $root.Chart.AppVersion }}
{{- end -}}
{{- end }}

{{/* Every pod's pull secrets: imagePullSecrets and global.imagePullSecrets (a parent
chart's), once each. ($) */}}
{{- define "deathwatch.imagePullSecrets" -}}
{{- $all := concat (.Values.imagePullSecrets | default list) (.Values.global.imagePullSecrets | default list) | uniq -}}
{{- with $all }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* The controller's sinks file (deathwatch._operator.delivery.config): the chart's sinks,
each pointed at the directory its Secret is mounted at. */}}
{{- define "deathwatch.deliveryConfig" -}}
{{- $d := .Values.delivery -}}
cluster: {{ $d.clusterName | quote }}
sinks:
{{- range $d.sinks }}
  - name: {{ .name }}
    url: {{ .url | quote }}
    secretDir: /etc/deathwatch/delivery/{{ .name }}
    {{- with .states }}
    states: {{ toJson . }}
    {{- end }}
    {{- with .mode }}
    mode: {{ . }}
    {{- end }}
    {{- with .namespaces }}
    namespaces: {{ toJson . }}
    {{- end }}
    {{- with .timeoutSeconds }}
    timeoutSeconds: {{ . }}
    {{- end }}
    {{- with .concurrency }}
    concurrency: {{ . }}
    {{- end }}
    {{- with .maxAgeSeconds }}
    maxAgeSeconds: {{ . }}
    {{- end }}
    {{- with .lateAfterSeconds }}
    lateAfterSeconds: {{ . }}
    {{- end }}
    {{- if .allowInsecure }}
    allowInsecure: true
    {{- end }}
{{- end }}
{{- end }}

{{/* Refuse, at install and upgrade, a release that would share a node's table or a host port
with another release's firewall, or serve the DeathWatches another release's controller
serves (the same controller id, over namespaces both serve), naming that release. `lookup`
reads the cluster then; under `helm template` (Argo CD, Flux) it sees nothing, and the agents
find a shared table contested and say so on every verdict (ADR 0029). ($) */}}
{{- define "deathwatch.collisions" -}}
{{- $ := . -}}
{{- if not $.Values.cleanup -}}
{{- $f := $.Values.firewall -}}
{{- $c := $.Values.controller -}}
{{- $ports := list (toString $f.metricsPort) -}}
{{- if $f.exits.enabled }}{{ $ports = append $ports (toString $f.exits.metricsPort) }}{{ end -}}
{{- $scope := ternary "*" (join "," $.Values.scope.namespaces) $.Values.scope.clusterWide -}}
{{- $problems := list -}}
{{- range $kind := list "DaemonSet" "Deployment" -}}
{{- range $o := (lookup "apps/v1" $kind "" "").items | default list -}}
{{- $labels := $o.metadata.labels | default dict -}}
{{- $notes := $o.metadata.annotations | default dict -}}
{{- $theirs := and (eq (get $labels "app.kubernetes.io/part-of") "deathwatch") (not (and (eq $o.metadata.namespace (include "deathwatch.namespace" $)) (eq (get $labels "app.kubernetes.io/instance") $.Release.Name))) -}}
{{- $who := printf "release %s (namespace %s, %s %s)" (get $labels "app.kubernetes.io/instance") $o.metadata.namespace $kind $o.metadata.name -}}
{{- if and $theirs $f.enabled (eq $kind "DaemonSet") (eq (get $labels "app.kubernetes.io/component") "firewall") -}}
{{- if eq (get $notes "deathwatch.dev/table" | default "deathwatch") $f.table -}}
{{- $problems = append $problems (printf "firewall.table: table inet %s on every node is the firewall's of %s: give this release its own (--set firewall.table=%s)" $f.table $who $.Release.Name) -}}
{{- end -}}
{{- range $p := splitList "," (get $notes "deathwatch.dev/host-ports" | default "9101,9102") -}}
{{- if has $p $ports -}}
{{- $problems = append $problems (printf "firewall.metricsPort, firewall.exits.metricsPort: host port %s is taken on every node by the firewall of %s: give this release other ports" $p $who) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if and $theirs (eq $kind "Deployment") (eq (get $labels "app.kubernetes.io/component") "controller") (eq (get $notes "deathwatch.dev/controller-id") $c.controllerId) -}}
{{- $other := get $notes "deathwatch.dev/scope" | default "*" -}}
{{- $shared := or (eq $other "*") (eq $scope "*") -}}
{{- range $ns := splitList "," $other }}{{ if has $ns $.Values.scope.namespaces }}{{ $shared = true }}{{ end }}{{ end -}}
{{- if $shared -}}
{{- $problems = append $problems (printf "controller.controllerId: the controller of %s serves the DeathWatches with controller id %q in namespaces this release serves too: give this release its own (--set controller.controllerId=%s) and annotate its DeathWatches deathwatch.dev/controller-id=%s, or serve other namespaces (scope.namespaces)" $who $c.controllerId $.Release.Name $.Release.Name) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- with uniq $problems -}}
{{- fail (printf "this release would share what another deathwatch release holds (or install its firewall with firewall.enabled=false):\n  - %s" (join "\n  - " .)) -}}
{{- end -}}
{{- end -}}
{{- end }}

{{/* Refuse, at install and upgrade, to take over a CRD this release does not own: one
release per cluster installs the CRDs (crds.enabled); Helm would refuse it too, without
saying what to do. `lookup` sees nothing under `helm template`, where the applier decides. ($) */}}
{{- define "deathwatch.crdOwners" -}}
{{- $ := . -}}
{{- $problems := list -}}
{{- range $path, $_ := $.Files.Glob "files/crds/*.yaml" -}}
{{- $name := ($.Files.Get $path | fromYaml).metadata.name -}}
{{- with lookup "apiextensions.k8s.io/v1" "CustomResourceDefinition" "" $name -}}
{{- $notes := .metadata.annotations | default dict -}}
{{- $release := get $notes "meta.helm.sh/release-name" -}}
{{- $namespace := get $notes "meta.helm.sh/release-namespace" -}}
{{- if not $release -}}
{{- $problems = append $problems (printf "CRD %s was applied without Helm (kubectl, or a chart's crds/ directory): install with --set crds.enabled=false, or hand it to this release first: kubectl annotate crd %s meta.helm.sh/release-name=%s meta.helm.sh/release-namespace=%s && kubectl label crd %s app.kubernetes.io/managed-by=Helm" $name $name $.Release.Name $.Release.Namespace $name) -}}
{{- else if not (and (eq $release $.Release.Name) (eq $namespace $.Release.Namespace)) -}}
{{- $problems = append $problems (printf "CRD %s is installed by release %s (namespace %s): one release per cluster owns the CRDs; install this one with --set crds.enabled=false" $name $release $namespace) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- with $problems -}}
{{- fail (printf "crds.enabled: this release would take CRDs it does not own:\n  - %s" (join "\n  - " .)) -}}
{{- end -}}
{{- end }}
