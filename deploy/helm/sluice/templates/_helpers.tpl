{{/* Names: <fullname>-coordinator and <fullname>-server ("sluice-…" for a release "sluice"). */}}
{{- define "sluice.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "sluice.coordinator.name" -}}{{ include "sluice.fullname" . }}-coordinator{{- end -}}
{{- define "sluice.server.name" -}}{{ include "sluice.fullname" . }}-server{{- end -}}
{{- define "sluice.secretName" -}}{{ include "sluice.fullname" . }}-secrets{{- end -}}

{{/* Labels of every object; pass (dict "ctx" $ "component" "server"). */}}
{{- define "sluice.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .ctx.Chart.Name .ctx.Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: sluice
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
{{ include "sluice.selectorLabels" . }}
{{- with .ctx.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "sluice.selectorLabels" -}}
app.kubernetes.io/name: {{ default .ctx.Chart.Name .ctx.Values.nameOverride }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
{{- if .component }}
app.kubernetes.io/component: {{ .component }}
{{- end }}
{{- end -}}

{{- define "sluice.image" -}}
{{ .Values.image.repository }}:{{ default .Chart.AppVersion .Values.image.tag }}
{{- end -}}

{{/*
A map as TOML: its keys that hold no map first, then one [table] per map (recursively, with
dotted names). Pass (dict "map" $m "prefix" "").
*/}}
{{- define "sluice.toml" -}}
{{- $prefix := .prefix -}}
{{- range $k := keys .map | sortAlpha }}
{{- $v := index $.map $k }}
{{- if not (kindIs "map" $v) }}
{{ include "sluice.tomlKey" $k }} = {{ include "sluice.tomlValue" (dict "key" $k "value" $v) }}
{{- end }}
{{- end }}
{{- range $k := keys .map | sortAlpha }}
{{- $v := index $.map $k }}
{{- if kindIs "map" $v }}
{{- $name := ternary (include "sluice.tomlKey" $k) (printf "%s.%s" $prefix (include "sluice.tomlKey" $k)) (eq $prefix "") }}

[{{ $name }}]
{{- include "sluice.toml" (dict "map" $v "prefix" $name) }}
{{- end }}
{{- end }}
{{- end -}}

{{- define "sluice.tomlKey" -}}
{{- if regexMatch "^[A-Za-z0-9_-]+$" . }}{{ . }}{{ else }}{{ toJson . }}{{ end -}}
{{- end -}}

{{/*
One TOML value. Helm reads every YAML number as a float64; a whole one is written as an integer
because the binary wants integers for sizes and times (a float there stops it at start).
*/}}
{{- define "sluice.tomlValue" -}}
{{- $v := .value -}}
{{- if kindIs "string" $v }}{{ toJson $v }}
{{- else if kindIs "bool" $v }}{{ $v }}
{{- else if or (kindIs "float64" $v) (kindIs "float32" $v) }}
{{- if eq (floor $v) (float64 $v) }}{{ int64 $v }}{{ else }}{{ $v }}{{ end }}
{{- else if or (kindIs "int" $v) (kindIs "int64" $v) }}{{ $v }}
{{- else if kindIs "slice" $v }}[{{ range $i, $e := $v }}{{ if $i }}, {{ end }}{{ include "sluice.tomlValue" (dict "key" $.key "value" $e) }}{{ end }}]
{{- else }}{{ fail (printf "config key %s: cannot write %v (%s) as TOML" .key $v (kindOf $v)) }}
{{- end }}
{{- end -}}

{{/* Every coordinator pod by its stable name, as a JSON list of host:port. */}}
{{- define "sluice.coordinatorAddresses" -}}
{{- $svc := include "sluice.coordinator.name" . -}}
{{- $list := list -}}
{{- range $i := until (int .Values.coordinator.replicas) -}}
{{- $list = append $list (printf "%s-%d.%s.%s.svc:%d" $svc $i $svc $.Release.Namespace (int $.Values.coordinator.port)) -}}
{{- end -}}
{{- toJson $list -}}
{{- end -}}

{{/* Mount paths of the servers' data directories, as a JSON list. */}}
{{- define "sluice.dataDirs" -}}
{{- $p := .Values.server.persistence -}}
{{- $n := 0 -}}
{{- if eq $p.type "hostPath" -}}
{{- $n = len $p.hostPath.paths -}}
{{- else -}}
{{- $n = int $p.volumeClaimTemplates.count -}}
{{- end -}}
{{- if lt $n 1 -}}
{{- fail "server.persistence: at least one data directory is needed" -}}
{{- end -}}
{{- $dirs := list -}}
{{- range $i := until $n -}}
{{- $dirs = append $dirs (printf "/var/lib/sluice/data%d" $i) -}}
{{- end -}}
{{- toJson $dirs -}}
{{- end -}}

{{/*
A config map with the keys the chart sets itself: `forced` wins over the user's map, `defaults`
lose to it. Keys the chart sets per pod through the environment (which overrides the file) are
refused rather than silently ignored, and so are those it sets from `tls` (the forced `transport`
table holds only `tls`: the user's other transport keys merge with it). Pass (dict "config" …
"forced" … "defaults" … "refused" … "what" "server").
*/}}
{{- define "sluice.mergeConfig" -}}
{{- $user := deepCopy (default dict .config) -}}
{{- range $k := concat (keys .forced) .refused -}}
{{- if and (eq $k "transport") (hasKey $user "transport") -}}
{{- if hasKey (index $user "transport") "tls" -}}
{{- fail (printf "%s.config.transport.tls is set by the chart from the tls values; remove it" $.what) -}}
{{- end -}}
{{- else if hasKey $user $k -}}
{{- fail (printf "%s.config.%s is set by the chart (see values.yaml); remove it" $.what $k) -}}
{{- end -}}
{{- end -}}
{{- if and (hasKey $user "transport") (hasKey (index $user "transport") "secret") -}}
{{- fail (printf "%s.config.transport.secret would be readable by anyone who can read ConfigMaps: use transportSecret" .what) -}}
{{- end -}}
{{- toJson (merge (deepCopy .forced) $user (deepCopy .defaults)) -}}
{{- end -}}

{{- define "sluice.serverConfig" -}}
{{- $forced := dict "listen" (printf "0.0.0.0:%d" (int .Values.server.port)) "data_dirs" (include "sluice.dataDirs" . | fromJsonArray) -}}
{{- if .Values.tls.enabled -}}
{{- $_ := set $forced "transport" (dict "tls" (include "sluice.tlsListen" . | fromJson)) -}}
{{- $_ := set $forced "coordinator_tls" (include "sluice.tlsToCoordinators" . | fromJson) -}}
{{- end -}}
{{- $defaults := dict "coordinators" (include "sluice.coordinatorAddresses" . | fromJsonArray) -}}
{{- include "sluice.mergeConfig" (dict "config" .Values.server.config "forced" $forced "defaults" $defaults "refused" (list "server_id" "advertise_host") "what" "server") -}}
{{- end -}}

{{/* Every coordinator is a peer of the others (each also lists itself: harmless, see docs/operations.md). */}}
{{- define "sluice.coordinatorConfig" -}}
{{- $forced := dict "listen" (printf "0.0.0.0:%d" (int .Values.coordinator.port)) -}}
{{- if .Values.tls.enabled -}}
{{- $_ := set $forced "transport" (dict "tls" (include "sluice.tlsListen" . | fromJson)) -}}
{{- $_ := set $forced "peer_tls" (include "sluice.tlsToCoordinators" . | fromJson) -}}
{{- end -}}
{{- $defaults := dict -}}
{{- if gt (int .Values.coordinator.replicas) 1 -}}
{{- $defaults = dict "peers" (include "sluice.coordinatorAddresses" . | fromJsonArray) -}}
{{- end -}}
{{- include "sluice.mergeConfig" (dict "config" .Values.coordinator.config "forced" $forced "defaults" $defaults "refused" list "what" "coordinator") -}}
{{- end -}}

{{/* A config key in milliseconds as whole seconds, rounded up; pass (dict "config" … "key" … "default" …). */}}
{{- define "sluice.seconds" -}}
{{- $ms := .default -}}
{{- if hasKey .config .key -}}{{- $ms = index .config .key -}}{{- end -}}
{{- div (add (int64 $ms) 999) 1000 -}}
{{- end -}}

{{- define "sluice.shutdownGraceSeconds" -}}
{{- include "sluice.seconds" (dict "config" (default dict (index . "transport")) "key" "shutdown_grace_ms" "default" 30000) -}}
{{- end -}}

{{/*
Pod anti-affinity (soft or hard) added to the component's own affinity. Pass (dict "ctx" $
"component" "server" "values" .Values.server).
*/}}
{{- define "sluice.affinity" -}}
{{- $term := dict "topologyKey" "kubernetes.io/hostname" "labelSelector" (dict "matchLabels" (include "sluice.selectorLabels" . | fromYaml)) -}}
{{- $anti := dict -}}
{{- if eq .values.podAntiAffinity "hard" -}}
{{- $anti = dict "requiredDuringSchedulingIgnoredDuringExecution" (list $term) -}}
{{- else if eq .values.podAntiAffinity "soft" -}}
{{- $anti = dict "preferredDuringSchedulingIgnoredDuringExecution" (list (dict "weight" 100 "podAffinityTerm" $term)) -}}
{{- else -}}
{{- fail (printf "%s.podAntiAffinity must be soft or hard, not %v" .component .values.podAntiAffinity) -}}
{{- end -}}
{{- toYaml (merge (dict "podAntiAffinity" $anti) (deepCopy (default dict .values.affinity))) -}}
{{- end -}}

{{/* Environment variable with the admin token, when enabled; pass (dict "ctx" $ "prefix" "SLUICE_SERVER_"). */}}
{{- define "sluice.adminTokenEnv" -}}
{{- with .ctx.Values.adminToken }}
{{- if .enabled }}
- name: {{ $.prefix }}ADMIN_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ default (include "sluice.secretName" $.ctx) .existingSecret }}
      key: {{ .secretKey }}
{{- end }}
{{- end }}
{{- end -}}

{{/* Pod-level settings both components share; pass (dict "ctx" $ "values" .Values.server). */}}
{{- define "sluice.podCommon" -}}
# Required: any variable starting with SLUICE_SERVER_ / SLUICE_COORDINATOR_ is read as a
# configuration key, and Kubernetes would inject <SERVICE>_SERVICE_HOST/_PORT variables for
# Services (one named sluice-server-… would stop every server at start).
enableServiceLinks: false
# The processes never call the Kubernetes API.
automountServiceAccountToken: false
securityContext:
  runAsNonRoot: true
  runAsUser: 10001
  runAsGroup: 10001
  fsGroup: 10001
  fsGroupChangePolicy: OnRootMismatch
  seccompProfile:
    type: RuntimeDefault
{{- with .ctx.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Container-level hardening both components share. */}}
{{- define "sluice.containerSecurityContext" -}}
securityContext:
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  capabilities:
    drop: ["ALL"]
{{- end -}}

{{/* Probes on the admin HTTP API; pass (dict "values" .Values.server). */}}
{{- define "sluice.probes" -}}
readinessProbe:
  httpGet:
    path: /readyz
    port: metrics
    {{- if .ctx.Values.tls.enabled }}
    scheme: HTTPS
    {{- end }}
  {{- toYaml .values.probes.readiness | nindent 2 }}
livenessProbe:
  httpGet:
    path: /healthz
    port: metrics
    {{- if .ctx.Values.tls.enabled }}
    scheme: HTTPS
    {{- end }}
  {{- toYaml .values.probes.liveness | nindent 2 }}
{{- end -}}

{{/* The name every pod's certificate is checked against by servers, the hook and Prometheus. */}}
{{- define "sluice.tlsServerName" -}}
{{- .Values.tls.serverName | default (printf "%s.%s.svc" (include "sluice.fullname" .) .Release.Namespace) -}}
{{- end -}}

{{/*
[transport.tls] of both components, and the servers' [coordinator_tls], from the mounted Secret
(as JSON maps, forced over the user's config).
*/}}
{{- define "sluice.tlsListen" -}}
{{- $t := .Values.tls -}}
{{- $m := dict "cert_file" (printf "%s/tls.crt" $t.mountPath) "key_file" (printf "%s/tls.key" $t.mountPath) "ktls" $t.ktls -}}
{{- if $t.mutual -}}
{{- $_ := set $m "client_ca_file" (printf "%s/ca.crt" $t.mountPath) -}}
{{- end -}}
{{- toJson $m -}}
{{- end -}}

{{- define "sluice.tlsToCoordinators" -}}
{{- $t := .Values.tls -}}
{{- $m := dict "ca_file" (printf "%s/ca.crt" $t.mountPath) "server_name" (include "sluice.tlsServerName" .) -}}
{{- if $t.mutual -}}
{{- $_ := set $m "cert_file" (printf "%s/tls.crt" $t.mountPath) -}}
{{- $_ := set $m "key_file" (printf "%s/tls.key" $t.mountPath) -}}
{{- end -}}
{{- toJson $m -}}
{{- end -}}

{{/*
Pod annotations: the checksum of the component's own config (a change rolls its pods, not the
other component's), Prometheus scraping, the user's. Pass (dict "ctx" $ "values" … "config" …).
*/}}
{{- define "sluice.podAnnotations" -}}
checksum/config: {{ toJson .config | sha256sum }}
{{- if .ctx.Values.metrics.podAnnotations }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .values.metricsPort | quote }}
prometheus.io/path: /metrics
{{- end }}
{{- with .values.podAnnotations }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Volumes and mounts for the optional TLS secret. */}}
{{- define "sluice.tlsVolume" -}}
{{- if .Values.tls.enabled }}
- name: tls
  secret:
    secretName: {{ required "tls.secretName is required when tls.enabled" .Values.tls.secretName }}
{{- end }}
{{- end -}}

{{- define "sluice.tlsMount" -}}
{{- if .Values.tls.enabled }}
- name: tls
  mountPath: {{ .Values.tls.mountPath }}
  readOnly: true
{{- end }}
{{- end -}}
