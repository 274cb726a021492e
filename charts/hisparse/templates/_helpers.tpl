{{/* Name of every object the chart makes: <release>-hisparse, or the release name when it already says hisparse. */}}
{{- define "hisparse.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "hisparse.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "hisparse.labels" -}}
{{ include "hisparse.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* The Secret holding the webhook's CA and serving certificate (created empty here, filled by the operator). */}}
{{- define "hisparse.webhookSecret" -}}
{{ include "hisparse.fullname" . | trunc 50 | trimSuffix "-" }}-webhook-cert
{{- end -}}
