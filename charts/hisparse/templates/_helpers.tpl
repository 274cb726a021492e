{{/* The chart's name as labels give it: nameOverride, or the chart's. */}}
{{- define "hisparse.name" -}}
{{- .Values.nameOverride | default .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Name of every namespaced object the chart makes in its own namespace: fullnameOverride, else
<release>-<name>, or the release name when it already holds the name. */}}
{{- define "hisparse.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "hisparse.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Name of every object outside the release's namespace (cluster-scoped ones, and the Roles in watched
namespaces): <namespace>-<fullname>, since two releases of one name may live in two namespaces. Past 63
characters: cut, plus 8 hex of the whole name's hash, so two long names stay apart. */}}
{{- define "hisparse.clusterName" -}}
{{- $full := printf "%s-%s" .Release.Namespace (include "hisparse.fullname" .) -}}
{{- if le (len $full) 63 -}}
{{- $full -}}
{{- else -}}
{{- printf "%s-%s" ($full | trunc 54 | trimSuffix "-") ($full | sha256sum | trunc 8) -}}
{{- end -}}
{{- end -}}

{{- define "hisparse.selectorLabels" -}}
app.kubernetes.io/name: {{ include "hisparse.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{/* Labels of one component's objects: commonLabels, then the chart's own (which win a shared key, so a
selector cannot be broken by a value). Call with (dict "root" $ "component" "test"). */}}
{{- define "hisparse.componentLabels" -}}
{{- $root := .root -}}
{{- $own := dict
  "app.kubernetes.io/name" (include "hisparse.name" $root)
  "app.kubernetes.io/instance" $root.Release.Name
  "app.kubernetes.io/component" .component
  "app.kubernetes.io/version" $root.Chart.AppVersion
  "app.kubernetes.io/managed-by" $root.Release.Service
  "app.kubernetes.io/part-of" "hisparse"
  "helm.sh/chart" (printf "%s-%s" $root.Chart.Name $root.Chart.Version | replace "+" "_") -}}
{{- toYaml (merge $own ($root.Values.commonLabels | default dict)) -}}
{{- end -}}

{{/* Labels of every object the chart makes (the operator's component). */}}
{{- define "hisparse.labels" -}}
{{- include "hisparse.componentLabels" (dict "root" . "component" "operator") -}}
{{- end -}}

{{/* The ServiceAccount the operator runs as: serviceAccount.name, or the fullname when the chart creates it. */}}
{{- define "hisparse.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- .Values.serviceAccount.name | default (include "hisparse.fullname" .) -}}
{{- else -}}
{{- required "serviceAccount.name: name the existing ServiceAccount when serviceAccount.create is false (the chart binds its roles to it)" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The namespaces this release manages, as a JSON list: the release's own with singleNamespace, else
watchNamespaces; [] means every namespace. The operator's --namespace flags, the Roles per namespace, the
webhook's namespaceSelector and the claim checked against other releases all come from here. */}}
{{- define "hisparse.watched" -}}
{{- if .Values.singleNamespace -}}
{{- if .Values.watchNamespaces -}}
{{- fail "singleNamespace manages the release's namespace alone: leave watchNamespaces empty, or turn singleNamespace off and list the namespaces in watchNamespaces" -}}
{{- end -}}
{{- list .Release.Namespace | toJson -}}
{{- else -}}
{{- .Values.watchNamespaces | default list | toJson -}}
{{- end -}}
{{- end -}}

{{/* The Secret holding the webhook's CA and serving certificate (created empty here, filled by the operator). */}}
{{- define "hisparse.webhookSecret" -}}
{{ include "hisparse.fullname" . | trunc 50 | trimSuffix "-" }}-webhook-cert
{{- end -}}

{{/* The ValidatingWebhookConfiguration: cluster-scoped, so its name carries the release's namespace and name. */}}
{{- define "hisparse.webhookConfiguration" -}}
{{ include "hisparse.clusterName" . }}.hisparsedeployments.serving.hisparse.dev
{{- end -}}

{{/* kopf's ClusterKopfPeering (cluster-scoped): peering.name, or the release's cluster-unique name. */}}
{{- define "hisparse.peering" -}}
{{ .Values.peering.name | default (include "hisparse.clusterName" .) }}
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
