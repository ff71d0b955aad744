{{/*
Helpers of the venturi chart. Every name starts with "venturi." so that the chart can sit in an
umbrella chart without colliding with another chart's helpers.
*/}}

{{/*
venturi.name: the chart name (or nameOverride), truncated to 63 characters, the limit of a
DNS label and of a label value.
*/}}
{{- define "venturi.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
venturi.fullname: the prefix of every resource name. The release name alone when it already
contains the chart name ("venturi", "venturi-prod"), else "<release>-<name>"; at most 63
characters (Service names are DNS labels).
*/}}
{{- define "venturi.fullname" -}}
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

{{/*
venturi.chart: "<chart>-<version>", for the helm.sh/chart label ("+" is not allowed in labels).
*/}}
{{- define "venturi.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
venturi.labels: the labels of every object of the release, but app.kubernetes.io/component,
which each object adds (operator, crd, dashboard).
*/}}
{{- define "venturi.labels" -}}
helm.sh/chart: {{ include "venturi.chart" . }}
app.kubernetes.io/name: {{ include "venturi.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: venturi
{{- end }}

{{/*
venturi.operatorLabels: the labels of the operator's objects (Deployment, ServiceAccount, RBAC,
Service, monitors, rules).
*/}}
{{- define "venturi.operatorLabels" -}}
{{ include "venturi.labels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{/*
venturi.selectorLabels: the labels that select the operator's pods (Deployment, Service,
PodMonitor). They never change across upgrades: a Deployment's selector is immutable.
*/}}
{{- define "venturi.selectorLabels" -}}
app.kubernetes.io/name: {{ include "venturi.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/*
venturi.serviceAccountName: the operator's ServiceAccount, created or given.
*/}}
{{- define "venturi.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "venturi.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
venturi.image: "<repository>:<tag>", the tag defaulting to the chart's appVersion.
*/}}
{{- define "venturi.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{/*
venturi.rbacRules: what the operator does, and nothing more (kube.py, handlers.py, kopf):
- jobqueues: kopf lists and watches them, and patches them (its finalizer and annotations);
- jobqueues/status: the operator's status patches;
- deployments get and deployments/scale get/patch: read replicas, scale through the subresource;
- pods get/list/patch: before a scale-in, each worker pod's pod-deletion-cost annotation is set
  to the jobs it holds, so the ReplicaSet removes idle pods first;
- horizontalpodautoscalers and KEDA scaledobjects list: a Deployment another autoscaler
  scales is left alone (403 and 404 on scaledobjects are tolerated);
- secrets get: the DSN in each JobQueue's spec.database.secretName, only the Secrets named in
  rbac.secretNames (every Secret only with rbac.readAllSecrets);
- events create/patch: the operator's Events on JobQueues (kopf posts core v1 Events).
*/}}
{{- define "venturi.rbacRules" -}}
- apiGroups: ["venturi.dev"]
  resources: ["jobqueues"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["venturi.dev"]
  resources: ["jobqueues/status"]
  verbs: ["get", "patch"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get"]
- apiGroups: ["apps"]
  resources: ["deployments/scale"]
  verbs: ["get", "patch"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "patch"]
- apiGroups: ["autoscaling"]
  resources: ["horizontalpodautoscalers"]
  verbs: ["list"]
- apiGroups: ["keda.sh"]
  resources: ["scaledobjects"]
  verbs: ["list"]
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get"]
  {{- if not .Values.rbac.readAllSecrets }}
  resourceNames:
    {{- toYaml .Values.rbac.secretNames | nindent 4 }}
  {{- end }}
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end }}

{{/*
venturi.validate: value combinations the schema cannot express fail here, loudly.
*/}}
{{- define "venturi.validate" -}}
{{- $op := .Values.operator }}
{{- if and $op.watchNamespaces $op.watchAllNamespaces }}
{{- fail "operator.watchNamespaces and operator.watchAllNamespaces=true exclude each other: set one" }}
{{- end }}
{{- if not (or $op.watchNamespaces $op.watchAllNamespaces) }}
{{- fail "operator.watchNamespaces is required: the namespaces whose JobQueues the operator watches, for example --set 'operator.watchNamespaces={jobs}' (or operator.watchAllNamespaces=true to watch every namespace, with cluster-wide RBAC)" }}
{{- end }}
{{- if .Values.rbac.create }}
{{- if and .Values.rbac.secretNames .Values.rbac.readAllSecrets }}
{{- fail "rbac.secretNames and rbac.readAllSecrets=true exclude each other: set one" }}
{{- end }}
{{- if not (or .Values.rbac.secretNames .Values.rbac.readAllSecrets) }}
{{- fail "rbac.secretNames is required: the Secrets the operator may read, the spec.database.secretName of every JobQueue, for example --set 'rbac.secretNames={venturi-db}' (or rbac.readAllSecrets=true to let it read every Secret in the watched namespaces)" }}
{{- end }}
{{- end }}
{{- if and (gt (int $op.replicas) 1) (not $op.leaderElection) }}
{{- fail "operator.replicas above 1 needs operator.leaderElection=true: without an election every replica would scale the same Deployments" }}
{{- end }}
{{- if and .Values.monitoring.serviceMonitor.enabled .Values.monitoring.podMonitor.enabled }}
{{- fail "monitoring.serviceMonitor.enabled and monitoring.podMonitor.enabled cannot both be true: Prometheus would scrape the operator twice" }}
{{- end }}
{{- end }}
