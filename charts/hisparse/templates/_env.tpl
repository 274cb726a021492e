{{/* The operator container's environment: every HISPARSE_* setting the chart gives the operator
(controller/settings.py reads them), as a YAML list. The Deployment adds extraEnv after it and refuses an
extraEnv variable of the same name (two values for one name: Kubernetes takes the last, silently). */}}
{{- define "hisparse.operatorEnv" -}}
# kopf's identity among peers: the pod name.
- name: POD_ID
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
# The operator's own namespace: the certificate Secret and the Service live here.
- name: HISPARSE_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: HISPARSE_WEBHOOK_PORT
  value: {{ .Values.webhook.port | quote }}
# The apiserver calls the webhook through this Service (the configuration's service reference).
- name: HISPARSE_WEBHOOK_SERVICE
  value: {{ include "hisparse.fullname" . | quote }}
- name: HISPARSE_WEBHOOK_SECRET
  value: {{ include "hisparse.webhookSecret" . | quote }}
- name: HISPARSE_WEBHOOK_CONFIGURATION
  value: {{ include "hisparse.webhookConfiguration" . | quote }}
{{- if not .Values.webhook.certManager.enabled }}
# The Secret is the release's: one the operator makes again (it was deleted) is marked as the release's.
- name: HISPARSE_WEBHOOK_SECRET_RELEASE
  value: {{ printf "%s/%s" .Release.Namespace .Release.Name | quote }}
{{- end }}
- name: HISPARSE_WEBHOOK_CERT_SOURCE
  value: {{ if .Values.webhook.certManager.enabled }}external{{ else }}operator{{ end }}
- name: HISPARSE_WEBHOOK_ADDR
  value: "0.0.0.0"
- name: HISPARSE_WEBHOOK_CERT_DIR
  value: /run/hisparse/webhook
- name: HISPARSE_METRICS_PORT
  value: {{ .Values.metrics.port | quote }}
- name: HISPARSE_METRICS_ADDR
  value: "0.0.0.0"
- name: HISPARSE_RESYNC_SECONDS
  value: {{ .Values.resyncSeconds | quote }}
- name: HISPARSE_WORKERS
  value: {{ .Values.workers | quote }}
- name: HISPARSE_UPGRADE_CANARIES
  value: {{ .Values.upgradeCanaries | quote }}
{{- if lt (float64 .Values.retry.maxSeconds) (float64 .Values.retry.baseSeconds) }}
{{- fail (printf "retry.maxSeconds %v is below retry.baseSeconds %v: the delay only grows from the base; raise maxSeconds or lower baseSeconds" .Values.retry.maxSeconds .Values.retry.baseSeconds) }}
{{- end }}
- name: HISPARSE_RETRY_BASE_SECONDS
  value: {{ .Values.retry.baseSeconds | quote }}
- name: HISPARSE_RETRY_MAX_SECONDS
  value: {{ .Values.retry.maxSeconds | quote }}
{{- if .Values.prometheusUrl }}
- name: HISPARSE_PROMETHEUS_URL
  value: {{ .Values.prometheusUrl | quote }}
{{- end }}
{{- if .Values.parity.image }}
- name: HISPARSE_PARITY_IMAGE
  value: {{ .Values.parity.image | quote }}
- name: HISPARSE_PARITY_IMAGE_PULL_POLICY
  value: {{ .Values.parity.pullPolicy | quote }}
{{- end }}
{{- if gt (int .Values.replicas) 1 }}
- name: HISPARSE_PEERING
  value: {{ include "hisparse.peering" . | quote }}
- name: HISPARSE_PEERING_LIFETIME
  value: {{ .Values.peering.lifetimeSeconds | quote }}
{{- end }}
{{- end -}}
