{{/* Names are cut to 63 characters: a DNS label, the limit of object and label values. */}}
{{- define "shardline.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* "<release>-<chart>", or the release name alone when it already holds the chart name. Stage
StatefulSets append "-stage-<i>" and their pods "-<ordinal>", so leave room for those. */}}
{{- define "shardline.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "shardline.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every object; call with (dict "root" $ "component" "gateway"). */}}
{{- define "shardline.labels" -}}
helm.sh/chart: {{ include "shardline.chart" .root }}
{{ include "shardline.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: shardline
{{- end }}

{{/* The labels a Service or workload selects its pods by; never change them on upgrade. */}}
{{- define "shardline.selectorLabels" -}}
app.kubernetes.io/name: {{ include "shardline.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "shardline.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{/* The name clients ask for; stage workers register under it and the gateway serves it. */}}
{{- define "shardline.modelName" -}}
{{- .Values.model.name | default (base .Values.model.path) }}
{{- end }}

{{/* Where every pod mounts the model volume; the model directory is model.path inside it. */}}
{{- define "shardline.modelMount" -}}
/models
{{- end }}

{{- define "shardline.modelDir" -}}
{{- printf "%s/%s" (include "shardline.modelMount" .) .Values.model.path | clean }}
{{- end }}

{{/* The model volume as a pod's volumes entry. */}}
{{- define "shardline.modelVolume" -}}
- name: model
{{- if .Values.model.volume.persistentVolumeClaim }}
  persistentVolumeClaim:
    claimName: {{ .Values.model.volume.persistentVolumeClaim }}
    readOnly: true
{{- else }}
  hostPath:
    path: {{ .Values.model.volume.hostPath }}
    type: Directory
{{- end }}
{{- end }}

{{- define "shardline.modelVolumeMount" -}}
- name: model
  mountPath: {{ include "shardline.modelMount" . }}
  readOnly: true
{{- end }}

{{- define "shardline.redisUrl" -}}
{{- if .Values.redis.externalUrl }}
{{- .Values.redis.externalUrl }}
{{- else }}
{{- printf "redis://%s-redis:%d/0" (include "shardline.fullname" .) (int .Values.redis.port) }}
{{- end }}
{{- end }}

{{- define "shardline.tokenizerAddress" -}}
{{- printf "%s-tokenizer:%d" (include "shardline.fullname" .) (int .Values.tokenizer.port) }}
{{- end }}

{{/* Replicas of stage .stage: its entry in stages.replicasByStage, else stages.replicas. */}}
{{- define "shardline.stageReplicas" -}}
{{- $byStage := .root.Values.stages.replicasByStage }}
{{- if hasKey $byStage (toString .stage) }}
{{- get $byStage (toString .stage) | int }}
{{- else }}
{{- .root.Values.stages.replicas | int }}
{{- end }}
{{- end }}

{{/* A stage worker drains within --drain-timeout after SIGTERM, then deregisters and stops its
server: the kubelet must not SIGKILL it before. */}}
{{- define "shardline.stageGracePeriod" -}}
{{- add (ceil .Values.stages.drainTimeoutSeconds | int) 15 }}
{{- end }}

{{- define "shardline.podSpecCommon" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
automountServiceAccountToken: false
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- end }}

{{/* nodeSelector, tolerations and affinity of one component's values. */}}
{{- define "shardline.scheduling" -}}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
