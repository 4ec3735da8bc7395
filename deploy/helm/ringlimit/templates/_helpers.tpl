{{/* The chart's name, shortened to fit a DNS label. */}}
{{- define "ringlimit.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The release's full name. Kept to 52 characters so that "-headless" still
fits in a 63-character Service name.
*/}}
{{- define "ringlimit.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* The headless Service: stable pod DNS names, and the join address. */}}
{{- define "ringlimit.headless" -}}
{{ include "ringlimit.fullname" . }}-headless
{{- end }}

{{/*
The --join address: the headless Service's name, which resolves to every
pod, ready or not (publishNotReadyAddresses), so the first pods find each
other before any is ready.
*/}}
{{- define "ringlimit.join" -}}
{{ include "ringlimit.headless" . }}.{{ .Release.Namespace }}.svc.{{ .Values.clusterDomain }}:{{ .Values.ports.gossip }}
{{- end }}

{{- define "ringlimit.policyConfigMap" -}}
{{- if .Values.existingPolicyConfigMap }}
{{- .Values.existingPolicyConfigMap }}
{{- else if .Values.policies }}
{{- include "ringlimit.fullname" . }}-policies
{{- end }}
{{- end }}

{{- define "ringlimit.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object. */}}
{{- define "ringlimit.labels" -}}
helm.sh/chart: {{ include "ringlimit.chart" . }}
{{ include "ringlimit.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: ringlimit
{{- end }}

{{/* Labels that select this release's pods; never change them on upgrade. */}}
{{- define "ringlimit.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ringlimit.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "ringlimit.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* Fails the render when the values contradict each other. */}}
{{- define "ringlimit.validate" -}}
{{- if le (int .Values.terminationGracePeriodSeconds) (int .Values.shutdownTimeoutSeconds) }}
{{- fail (printf "terminationGracePeriodSeconds (%d) must exceed shutdownTimeoutSeconds (%d): the kubelet would kill a node during its hand-off" (int .Values.terminationGracePeriodSeconds) (int .Values.shutdownTimeoutSeconds)) }}
{{- end }}
{{- if and .Values.policies .Values.existingPolicyConfigMap }}
{{- fail "policies and existingPolicyConfigMap: set one, not both" }}
{{- end }}
{{- if regexMatch "^(0+(\\.0+)?(ns|us|µs|ms|s|m|h))+$" (toString .Values.snapshots.interval) }}
{{- fail "snapshots.interval: must be more than 0" }}
{{- end }}
{{- $q := int .Values.strict.quorum }}
{{- $n := int .Values.replicaCount }}
{{- if and .Values.strict.fence (not $q) }}
{{- fail "strict.fence: set only with strict.quorum (strict mode is off)" }}
{{- end }}
{{- if $q }}
{{- if le (mul 2 $q) $n }}
{{- fail (printf "strict.quorum (%d) must be a majority of replicaCount (%d), at least %d: else two sides of a split could both decide a key" $q $n (add (div $n 2) 1)) }}
{{- end }}
{{- if ge $q $n }}
{{- fail (printf "strict.quorum (%d) must be below replicaCount (%d): a rolling update takes a pod down, and with fewer than a quorum up every key is refused" $q $n) }}
{{- end }}
{{- $u := .Values.podDisruptionBudget.maxUnavailable }}
{{- if and .Values.podDisruptionBudget.enabled (not (kindIs "string" $u)) (lt (sub $n (int $u)) $q) }}
{{- fail (printf "podDisruptionBudget.maxUnavailable (%d) must leave strict.quorum (%d) of replicaCount (%d) up: an eviction it allows would leave every key refused" (int $u) $q $n) }}
{{- end }}
{{- end }}
{{- $p := .Values.ports }}
{{- if ne (len (list (int $p.http) (int $p.grpc) (int $p.peer) (int $p.gossip) | uniq)) 4 }}
{{- fail "ports: http, grpc, peer and gossip must differ" }}
{{- end }}
{{- if and $p.resp (has (int $p.resp) (list (int $p.http) (int $p.grpc) (int $p.peer) (int $p.gossip))) }}
{{- fail "ports.resp: must differ from http, grpc, peer and gossip" }}
{{- end }}
{{- end }}

{{/*
A pod's DNS domain under the headless Service. Each pod's member name is
<pod>.<this>, its own DNS name, so that one certificate with the wildcard
DNS name *.<this> is valid for every pod of the StatefulSet, however far
it scales: rlnode accepts a peer's name when the peer's certificate is
valid for it as a host name.
*/}}
{{- define "ringlimit.podDomain" -}}
{{ include "ringlimit.headless" . }}.{{ .Release.Namespace }}.svc.{{ .Values.clusterDomain }}
{{- end }}

{{/* The Secret with the peer certificate, its key and the cluster CA. */}}
{{- define "ringlimit.peerTLSSecret" -}}
{{ .Values.tls.existingSecret | default (printf "%s-peer-tls" (include "ringlimit.fullname" .)) }}
{{- end }}

{{/* The Secret with the gossip keys. */}}
{{- define "ringlimit.gossipSecret" -}}
{{ .Values.gossip.existingSecret | default (printf "%s-gossip" (include "ringlimit.fullname" .)) }}
{{- end }}

{{/* Where each pod's snapshot volume is mounted: its --snapshot-dir. */}}
{{- define "ringlimit.snapshotDir" -}}
/var/lib/ringlimit
{{- end }}
