{{/* The chart's name. */}}
{{- define "gpu-agent.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's full name: "gpu-agent" for a release called gpu-agent. */}}
{{- define "gpu-agent.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "gpu-agent.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpu-agent.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "gpu-agent.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "gpu-agent.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gpu-agent
{{- end }}

{{- define "gpu-agent.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "gpu-agent.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The release's namespace, or namespaceOverride: every namespaced object goes there. */}}
{{- define "gpu-agent.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* registry/repository, then @digest or :tag. global.imageRegistry wins over
     image.registry, as in charts that depend on this one; an empty registry leaves the
     repository as it is. */}}
{{- define "gpu-agent.image" -}}
{{- $registry := default .Values.image.registry (dig "imageRegistry" "" (default dict .Values.global)) }}
{{- $repository := .Values.image.repository }}
{{- if $registry }}
{{- $repository = printf "%s/%s" (trimSuffix "/" $registry) $repository }}
{{- end }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" $repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" $repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* The name of the admin-access ResourceClaimTemplate, and of the pod's claim. */}}
{{- define "gpu-agent.adminAccessClaim" -}}
{{- printf "%s-admin-access" (include "gpu-agent.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Where the Secrets of `metrics` are mounted: beside the ConfigMap's /etc/gpu-agent, not
     inside it (a mount point inside a read-only volume cannot be created). */}}
{{- define "gpu-agent.tlsDir" -}}/etc/gpu-agent-tls{{- end }}
{{- define "gpu-agent.authDir" -}}/etc/gpu-agent-auth{{- end }}
{{- define "gpu-agent.dcgmDir" -}}/etc/gpu-agent-dcgm{{- end }}

{{/* The agent's configuration as JSON: `config`, with the [http.tls] and [http.auth] keys
     that `metrics` adds. */}}
{{- define "gpu-agent.config" -}}
{{- $c := deepCopy (default dict .Values.config) }}
{{- $http := default dict (get $c "http") }}
{{- $tls := .Values.metrics.tls }}
{{- if $tls.enabled }}
{{- if hasKey $http "tls" }}
{{- fail "metrics.tls.enabled and config.http.tls both set TLS: use one of them" }}
{{- end }}
{{- $secret := required "metrics.tls.existingSecret: the Secret holding tls.crt and tls.key" $tls.existingSecret }}
{{- $dir := include "gpu-agent.tlsDir" . }}
{{- $t := dict "cert_file" (printf "%s/tls.crt" $dir) "key_file" (printf "%s/tls.key" $dir) }}
{{- if ne $tls.clientAuthType "NoClientCert" }}
{{- $_ := set $t "client_ca_file" (printf "%s/ca.crt" $dir) }}
{{- $_ := set $t "client_auth_type" $tls.clientAuthType }}
{{- end }}
{{- $_ := set $http "tls" $t }}
{{- end }}
{{- $token := .Values.metrics.auth.bearerToken }}
{{- if $token.existingSecret }}
{{- $auth := default dict (get $http "auth") }}
{{- if hasKey $auth "bearer_token_file" }}
{{- fail "metrics.auth.bearerToken and config.http.auth.bearer_token_file both set a token: use one of them" }}
{{- end }}
{{- $_ := set $auth "bearer_token_file" (printf "%s/%s" (include "gpu-agent.authDir" .) $token.key) }}
{{- $_ := set $http "auth" $auth }}
{{- end }}
{{- if $http }}
{{- $_ := set $c "http" $http }}
{{- end }}
{{- toJson $c }}
{{- end }}

{{/* The port of config.http.metrics_addr: the container port `metrics`, the probes', the
     Service's and the NetworkPolicy's. */}}
{{- define "gpu-agent.metricsPort" -}}
{{- $addr := dig "http" "metrics_addr" "" (default dict .Values.config) }}
{{- if not $addr }}
{{- fail "config.http.metrics_addr is required: the kubelet's probes and Prometheus reach /healthz, /readyz and /metrics there" }}
{{- end }}
{{- $port := regexFind "[0-9]+$" $addr }}
{{- if not $port }}
{{- fail (printf "config.http.metrics_addr %q has no port" $addr) }}
{{- end }}
{{- $port }}
{{- end }}

{{/* The probes' and monitors' scheme. */}}
{{- define "gpu-agent.scheme" -}}
{{- if .Values.metrics.tls.enabled }}https{{ else }}http{{ end }}
{{- end }}

{{/* A table as TOML, keys sorted: its plain keys, then each sub-table under its own
     header. toToml would do, but Helm reads every number in values as a float and toToml
     writes 1000 as 1000.0, which the agent refuses for an integer key; toJson writes it as
     1000, and a JSON string, boolean or array of strings is TOML as it stands. A null
     drops the key. Context: {path: "http.tls", table: <map>}. */}}
{{- define "gpu-agent.tomlTable" -}}
{{- range $k, $v := .table }}
{{- if and (not (kindIs "map" $v)) (not (kindIs "invalid" $v)) }}
{{ include "gpu-agent.tomlKey" $k }} = {{ toJson $v }}
{{- end }}
{{- end }}
{{- range $k, $v := .table }}
{{- if kindIs "map" $v }}
{{- $path := include "gpu-agent.tomlKey" $k }}
{{- if $.path }}
{{- $path = printf "%s.%s" $.path $path }}
{{- end }}

[{{ $path }}]
{{- include "gpu-agent.tomlTable" (dict "path" $path "table" $v) }}
{{- end }}
{{- end }}
{{- end }}

{{/* A key: bare where TOML allows it, else quoted. */}}
{{- define "gpu-agent.tomlKey" -}}
{{- if regexMatch "^[A-Za-z0-9_-]+$" . }}{{ . }}{{ else }}{{ toJson . }}{{ end }}
{{- end }}

{{- define "gpu-agent.configToml" -}}
# Rendered by the gpu-agent chart from its `config` value (docs/configuration.md).
{{- include "gpu-agent.tomlTable" (dict "path" "" "table" (include "gpu-agent.config" . | fromJson)) }}
{{ end }}

{{/* What a ServiceMonitor's endpoint and a PodMonitor's podMetricsEndpoint share.
     Context: {root: $, m: .Values.serviceMonitor or .Values.podMonitor}. */}}
{{- define "gpu-agent.scrapeEndpoint" -}}
path: /metrics
scheme: {{ include "gpu-agent.scheme" .root }}
interval: {{ .m.interval }}
scrapeTimeout: {{ .m.scrapeTimeout }}
honorLabels: {{ .m.honorLabels }}
{{- with .m.relabelings }}
relabelings:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .m.metricRelabelings }}
metricRelabelings:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .m.tlsConfig }}
tlsConfig:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .m.authorization }}
authorization:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .m.basicAuth }}
basicAuth:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* `base` with each key of `over` put in its place (a null removes it): a user's
     securityContext or probe, key by key over the chart's. mergeOverwrite would not do:
     it skips false and 0, so readOnlyRootFilesystem: false could not be said.
     Context: {base: <map>, over: <map or nil>}. */}}
{{- define "gpu-agent.override" -}}
{{- $out := deepCopy .base }}
{{- range $k, $v := (default dict .over) }}
{{- if kindIs "invalid" $v }}
{{- $_ := unset $out $k }}
{{- else }}
{{- $_ := set $out $k $v }}
{{- end }}
{{- end }}
{{- toYaml $out }}
{{- end }}

{{/* The agent container's securityContext as the chart makes it: privileged as root with
     privileged.enabled; otherwise uid 65534 with the capabilities the image's file
     capabilities carry, within this bounding set (docs/deploy.md), SYS_ADMIN and AppArmor
     Unconfined only with tracefsMount.enabled. */}}
{{- define "gpu-agent.securityContext" -}}
{{- if .Values.privileged.enabled }}
privileged: true
runAsUser: 0
runAsGroup: 0
runAsNonRoot: false
readOnlyRootFilesystem: true
{{- else }}
{{- $tracefs := .Values.tracefsMount.enabled }}
privileged: false
{{- if not $tracefs }}
allowPrivilegeEscalation: false
{{- end }}
capabilities:
  drop: ["ALL"]
  add: ["BPF", "PERFMON", "DAC_READ_SEARCH", "DAC_OVERRIDE", "SYS_RESOURCE"{{ if $tracefs }}, "SYS_ADMIN"{{ end }}]
runAsUser: 65534
runAsGroup: 65534
runAsNonRoot: true
readOnlyRootFilesystem: true
seccompProfile:
  type: RuntimeDefault
appArmorProfile:
  type: {{ if $tracefs }}Unconfined{{ else }}RuntimeDefault{{ end }}
{{- end }}
{{- end }}

{{/* A probe of the chart's on the container port `metrics`. Context: {root: $, path:
     /readyz or /healthz, initialDelaySeconds, periodSeconds}. */}}
{{- define "gpu-agent.probe" -}}
httpGet:
  path: {{ .path }}
  port: metrics
  {{- if .root.Values.metrics.tls.enabled }}
  scheme: HTTPS
  {{- end }}
initialDelaySeconds: {{ .initialDelaySeconds }}
periodSeconds: {{ .periodSeconds }}
timeoutSeconds: 5
failureThreshold: 3
{{- end }}
