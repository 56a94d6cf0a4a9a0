{{/* Chart name, overridable. */}}
{{- define "managed-jobs.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: <release>-<chart>, or <release> when it already contains the chart name. */}}
{{- define "managed-jobs.fullname" -}}
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

{{/* Name of cluster-scoped objects: unique per release namespace too. */}}
{{- define "managed-jobs.clusterName" -}}
{{- printf "%s-%s" .Release.Namespace (include "managed-jobs.fullname" .) | trunc 253 | trimSuffix "-" }}
{{- end }}

{{/* chart label value. */}}
{{- define "managed-jobs.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Common labels. */}}
{{- define "managed-jobs.labels" -}}
helm.sh/chart: {{ include "managed-jobs.chart" . }}
{{ include "managed-jobs.selectorLabels" . }}
app.kubernetes.io/version: {{ include "managed-jobs.version" . | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: managed-jobs
{{- end }}

{{/* Selector labels (immutable in a StatefulSet: never add to these). */}}
{{- define "managed-jobs.selectorLabels" -}}
app.kubernetes.io/name: {{ include "managed-jobs.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/* Version label: the image tag, else the chart's appVersion, as a valid label value. */}}
{{- define "managed-jobs.version" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- regexReplaceAll "[^-A-Za-z0-9_.]" $tag "_" | trunc 63 | trimSuffix "-" | trimSuffix "_" | trimSuffix "." }}
{{- end }}

{{- define "managed-jobs.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* ServiceAccount name. */}}
{{- define "managed-jobs.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "managed-jobs.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The --executors value, e.g. "pod" or "local,pod". */}}
{{- define "managed-jobs.executors" -}}
{{- $e := list }}
{{- if .Values.executors.local }}{{ $e = append $e "local" }}{{ end }}
{{- if .Values.executors.pod }}{{ $e = append $e "pod" }}{{ end }}
{{- if not $e }}{{ fail "enable at least one executor: executors.pod and/or executors.local" }}{{ end }}
{{- join "," $e }}
{{- end }}

{{/* Name of the metrics Service (also the StatefulSet's governing service). */}}
{{- define "managed-jobs.metricsServiceName" -}}
{{- printf "%s-metrics" (include "managed-jobs.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
