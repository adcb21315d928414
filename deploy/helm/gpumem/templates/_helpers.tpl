{{/* The name of every object. */}}
{{- define "gpumem.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels every object carries. */}}
{{- define "gpumem.labels" -}}
app.kubernetes.io/name: {{ include "gpumem.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* What the Service and the DaemonSet select the pods by. */}}
{{- define "gpumem.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpumem.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
