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

{{/* The ValidatingWebhookConfiguration: cluster-scoped, so its name carries the release's. */}}
{{- define "hisparse.webhookConfiguration" -}}
{{ include "hisparse.fullname" . }}.hisparsedeployments.serving.hisparse.dev
{{- end -}}

{{/* kopf's ClusterKopfPeering (cluster-scoped): peering.name, or the release's fullname. */}}
{{- define "hisparse.peering" -}}
{{ .Values.peering.name | default (include "hisparse.fullname" .) }}
{{- end -}}

{{/* cert-manager's Certificate for the webhook (when webhook.certManager.enabled). */}}
{{- define "hisparse.certificate" -}}
{{ include "hisparse.fullname" . | trunc 50 | trimSuffix "-" }}-webhook
{{- end -}}

{{/* The operator image: repository@digest when a digest is given (it wins over the tag), else repository:tag. */}}
{{- define "hisparse.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}
