{{/*
Shared names, labels and the render-time guards of the Tandem chart.
*/}}

{{- define "tandem.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Full name: the release name when it already contains the chart name ("tandem"), else <release>-tandem. */}}
{{- define "tandem.fullname" -}}
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

{{- define "tandem.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels on every object the chart renders (CRDs keep their own, byte-identical to crds/). */}}
{{- define "tandem.labels" -}}
helm.sh/chart: {{ include "tandem.chart" . }}
{{ include "tandem.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: tandem
{{- end -}}

{{/* Selector labels of the operator pod: stable across chart versions (a selector is immutable). */}}
{{- define "tandem.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tandem.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "tandem.serviceAccountName" -}}
{{- .Values.serviceAccount.name -}}
{{- end -}}

{{/* The operator's user name as the API server sees it (used by the admission policies). */}}
{{- define "tandem.operatorUser" -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "tandem.serviceAccountName" .) -}}
{{- end -}}

{{/* repository[:tag]@sha256:<digest>: the digest is always present (S-SUP-01). */}}
{{- define "tandem.image" -}}
{{- $img := .Values.image -}}
{{- if not (regexMatch "^sha256:[a-f0-9]{64}$" ($img.digest | toString)) -}}
{{- fail "image.digest must be set to sha256:<64 hex>: the operator image is pulled by digest only" -}}
{{- end -}}
{{- if $img.tag -}}
{{- printf "%s:%s@%s" $img.repository $img.tag $img.digest -}}
{{- else -}}
{{- printf "%s@%s" $img.repository $img.digest -}}
{{- end -}}
{{- end -}}

{{/* Every namespace the operator watches: the serving namespaces plus the optional cache namespace. */}}
{{- define "tandem.watchedNamespaces" -}}
{{- $all := list -}}
{{- range .Values.watchNamespaces }}{{ $all = append $all . }}{{ end -}}
{{- with .Values.cache.namespace }}{{ $all = append $all . }}{{ end -}}
{{- toJson $all -}}
{{- end -}}

{{/*
Render-time guards the JSON schema cannot express (they also hold with --skip-schema-validation).
Included once, from deployment.yaml.
*/}}
{{- define "tandem.validate" -}}
{{- if gt (int .Values.replicaCount) 3 -}}
{{- fail "replicaCount must be 0 to 3: one replica acts and the others stand by on the Lease; more only cost memory. See the chart README." -}}
{{- end -}}
{{- if not .Values.watchNamespaces -}}
{{- fail "watchNamespaces is required: list the namespaces Tandem serves (it is never cluster-wide)" -}}
{{- end -}}
{{- if has .Release.Namespace .Values.watchNamespaces -}}
{{- fail (printf "watchNamespaces must not contain the release namespace %s: keep the operator's identity apart from the workloads it creates" .Release.Namespace) -}}
{{- end -}}
{{- if ne (len .Values.watchNamespaces) (len (uniq .Values.watchNamespaces)) -}}
{{- fail "watchNamespaces has duplicates" -}}
{{- end -}}
{{- with .Values.cache.namespace -}}
{{- if has . $.Values.watchNamespaces -}}
{{- fail "cache.namespace must not also be in watchNamespaces (it gets narrower rights and no pod backstop)" -}}
{{- end -}}
{{- if eq . $.Release.Namespace -}}
{{- fail "cache.namespace must not be the release namespace" -}}
{{- end -}}
{{- end -}}
{{- if and .Values.namespace.requireRestricted (not .Values.namespace.create) -}}
{{- $ns := lookup "v1" "Namespace" "" .Release.Namespace -}}
{{- if $ns -}}
{{- $enforce := dig "metadata" "labels" "pod-security.kubernetes.io/enforce" "" $ns -}}
{{- if ne $enforce "restricted" -}}
{{- fail (printf "namespace %s must be labelled pod-security.kubernetes.io/enforce=restricted (plus warn and audit) before installing Tandem: kubectl label namespace %s pod-security.kubernetes.io/enforce=restricted pod-security.kubernetes.io/warn=restricted pod-security.kubernetes.io/audit=restricted (or set namespace.requireRestricted=false)" .Release.Namespace .Release.Namespace) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* API server CIDRs for the NetworkPolicy: from values, else the `kubernetes` EndpointSlice (install time). */}}
{{- define "tandem.apiServerCIDRs" -}}
{{- $cidrs := list -}}
{{- range .Values.networkPolicy.apiServer.cidrs }}{{ $cidrs = append $cidrs . }}{{ end -}}
{{- if not $cidrs -}}
{{- $slice := lookup "discovery.k8s.io/v1" "EndpointSlice" "default" "kubernetes" -}}
{{- range ($slice.endpoints | default list) -}}
{{- range .addresses -}}
{{- $cidrs = append $cidrs (ternary (printf "%s/128" .) (printf "%s/32" .) (contains ":" .)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if not $cidrs -}}
{{- fail "networkPolicy.apiServer.cidrs is empty and the API server endpoints could not be looked up (helm template has no cluster): set networkPolicy.apiServer.cidrs, e.g. --set 'networkPolicy.apiServer.cidrs={10.0.0.1/32}'" -}}
{{- end -}}
{{- toJson (uniq $cidrs) -}}
{{- end -}}

{{/* The router (`tandem router`, the data plane): its name, selector labels and identity. */}}
{{- define "tandem.routerName" -}}
{{- printf "%s-router" (include "tandem.fullname" .) -}}
{{- end -}}

{{/* Selector labels of the router pods: stable across chart versions (a selector is immutable). */}}
{{- define "tandem.routerSelectorLabels" -}}
app.kubernetes.io/name: {{ include "tandem.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: router
{{- end -}}

{{- define "tandem.routerLabels" -}}
helm.sh/chart: {{ include "tandem.chart" . }}
{{ include "tandem.routerSelectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: tandem
{{- end -}}

{{- define "tandem.routerServiceAccountName" -}}
{{- .Values.router.serviceAccount.name -}}
{{- end -}}

{{/*
Ports the engine pods listen on, as the operator's pod builder opens them (operator/tandem/builders/pods.py
ENGINE_PORT and MOONCAKE_BOOTSTRAP_PORT; a chart test keeps them equal): the OpenAI API (both legs) and
the MooncakeConnector bootstrap server (the router's `/query`).
*/}}
{{- define "tandem.enginePort" -}}8000{{- end -}}
{{- define "tandem.engineBootstrapPort" -}}8998{{- end -}}

{{/*
Engine scrape relabeling: the ONE source of the rules both the PodMonitor and the plain Prometheus job
render (enginescrape.yaml). They keep only Tandem's engine pods (labels `tandem.dev/component=engine`,
`app.kubernetes.io/managed-by=tandem`, as operator/tandem/builders/pods.py sets them) on their `http`
port (the OpenAI port, where vLLM serves /metrics), and write the series label contract of
operator/tandem/core/promql.py: `namespace`, `pool`, `revision`, `role`, `pair`, `pod`, from the pod's
namespace, `tandem.dev/*` labels and name. Without these target labels every built-in gate and every
autoscaling query matches nothing. Argument: (dict "style" "operator") for the PodMonitor's camelCase
keys, (dict "style" "prometheus") for prometheus.yml's snake_case keys.
*/}}
{{- define "tandem.engineRelabelRules" -}}
{{- $rules := list
  (dict "action" "keep" "source" (list "__meta_kubernetes_pod_label_tandem_dev_component") "regex" "engine")
  (dict "action" "keep" "source" (list "__meta_kubernetes_pod_label_app_kubernetes_io_managed_by") "regex" "tandem")
  (dict "action" "keep" "source" (list "__meta_kubernetes_pod_container_port_name") "regex" "http")
  (dict "action" "replace" "source" (list "__meta_kubernetes_namespace") "target" "namespace")
  (dict "action" "replace" "source" (list "__meta_kubernetes_pod_label_tandem_dev_pool") "target" "pool")
  (dict "action" "replace" "source" (list "__meta_kubernetes_pod_label_tandem_dev_revision") "target" "revision")
  (dict "action" "replace" "source" (list "__meta_kubernetes_pod_label_tandem_dev_role") "target" "role")
  (dict "action" "replace" "source" (list "__meta_kubernetes_pod_label_tandem_dev_pair") "target" "pair")
  (dict "action" "replace" "source" (list "__meta_kubernetes_pod_name") "target" "pod")
-}}
{{- $operator := eq .style "operator" -}}
{{- range $rules }}
- action: {{ .action }}
  {{ if $operator }}sourceLabels{{ else }}source_labels{{ end }}: {{ toJson .source }}
  {{- with .regex }}
  regex: {{ . }}
  {{- end }}
  {{- with .target }}
  {{ if $operator }}targetLabel{{ else }}target_label{{ end }}: {{ . }}
  {{- end }}
{{- end }}
{{- end -}}
