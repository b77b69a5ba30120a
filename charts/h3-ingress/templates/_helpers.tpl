{{/* Chart name, overridable. */}}
{{- define "h3-ingress.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Release-scoped prefix of object names; the release name alone when it already contains the chart name. */}}
{{- define "h3-ingress.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
Prefix of the names of cluster-scoped objects (ClusterRole, ClusterRoleBinding, PriorityClass):
the release namespace, a dot, the full name. Release names are unique per namespace only, so
two releases called h3-ingress in two namespaces get two sets of cluster-scoped objects instead
of fighting over one. A namespace has no dot, so the name reads back unambiguously.
*/}}
{{- define "h3-ingress.clusterName" -}}
{{- printf "%s.%s" (.Release.Namespace | default "default") (include "h3-ingress.fullname" .) -}}
{{- end -}}

{{/*
Refuses a controllerName another release already has: two operators with one name would both
refuse every listener of that name (ControllerConflict). Each release's operator ClusterRole
carries its controller name (one of an earlier chart carries none, and its operator runs every
listener: the default name). Skipped where `lookup` sees no cluster (helm template, dry runs):
the operators then say it themselves.
*/}}
{{- define "h3-ingress.uniqueControllerName" -}}
{{- $crs := lookup "rbac.authorization.k8s.io/v1" "ClusterRole" "" "" -}}
{{- range (($crs | default dict).items | default list) -}}
{{- $labels := .metadata.labels | default dict -}}
{{- $ann := .metadata.annotations | default dict -}}
{{- $mine := or (eq (get $ann "meta.helm.sh/release-namespace") $.Release.Namespace) (eq .metadata.name (printf "%s-operator" (include "h3-ingress.clusterName" $))) -}}
{{- if and (eq (get $labels "app.kubernetes.io/name") "h3-ingress") (eq (get $labels "app.kubernetes.io/component") "operator") (not $mine) -}}
{{- $theirs := get $ann "h3-ingress.dev/controller-name" | default "h3-ingress.dev/operator" -}}
{{- if eq $theirs $.Values.controllerName -}}
{{- fail (printf "controllerName %q is already the controller name of release %s in namespace %s (ClusterRole %s): give this release its own, e.g. --set controllerName=example.com/%s, and set spec.controllerName on its listeners" $.Values.controllerName (get $ann "meta.helm.sh/release-name") (get $ann "meta.helm.sh/release-namespace") .metadata.name $.Release.Namespace) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "h3-ingress.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels shared by every object. app.kubernetes.io/name is always h3-ingress, whatever the release
    is called: the operator labels the data plane pods it creates the same way, and the PodMonitor
    and the dashboard select by it. */}}
{{- define "h3-ingress.labels" -}}
helm.sh/chart: {{ include "h3-ingress.chart" . }}
app.kubernetes.io/name: h3-ingress
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "h3-ingress.operatorLabels" -}}
{{ include "h3-ingress.labels" . }}
app.kubernetes.io/component: operator
{{- end -}}

{{/* Selector labels must never change after install (Deployment selectors are immutable). */}}
{{- define "h3-ingress.operatorSelectorLabels" -}}
app.kubernetes.io/name: h3-ingress
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "h3-ingress.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "h3-ingress.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The namespace of the certificate mirrors (see values `hosts`). */}}
{{- define "h3-ingress.hostsNamespace" -}}
{{- default (printf "%s-hosts" (.Release.Namespace | default "default")) .Values.hosts.namespace -}}
{{- end -}}

{{/* The data plane's priority class: the one named, else the chart's own when it creates one. */}}
{{- define "h3-ingress.dataPlanePriorityClass" -}}
{{- if .Values.dataPlane.priorityClassName -}}
{{- .Values.dataPlane.priorityClassName -}}
{{- else if .Values.dataPlane.priorityClass.create -}}
{{- include "h3-ingress.clusterName" . }}-data-plane
{{- end -}}
{{- end -}}

{{- define "h3-ingress.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/*
The operator's pull policy: image.pullPolicy, or when empty IfNotPresent only for an image that
names one build (a digest, or a VERSION-COMMIT tag as scripts/release.sh makes: the rule of the
binary's version::image_is_unique, which picks the data plane's), else Always.
*/}}
{{- define "h3-ingress.pullPolicy" -}}
{{- if .Values.image.pullPolicy -}}
{{- .Values.image.pullPolicy -}}
{{- else if regexMatch "(@sha256:[0-9a-f]+|:[^:/]+-[0-9a-f]{7,40})$" (include "h3-ingress.image" .) -}}
IfNotPresent
{{- else -}}
Always
{{- end -}}
{{- end -}}

{{/* The names of imagePullSecrets, comma-separated, for the operator's --image-pull-secrets. */}}
{{- define "h3-ingress.pullSecretNames" -}}
{{- $names := list -}}
{{- range .Values.imagePullSecrets -}}
{{- $names = append $names .name -}}
{{- end -}}
{{- join "," $names -}}
{{- end -}}

{{/* The Prometheus Operator's API is served: monitors and rules would be rejected otherwise. */}}
{{- define "h3-ingress.hasMonitoringAPI" -}}
{{- if .Capabilities.APIVersions.Has "monitoring.coreos.com/v1" -}}true{{- end -}}
{{- end -}}

{{/*
The TCP ingress's requests per second per host: the denominator of the h3 request share.
The ingress counts the requests we proxy to it too, so this is the total per host.
*/}}
{{- define "h3-ingress.tcpIngressRequestsExpr" -}}
{{- $share := .Values.metrics.prometheusRule.share -}}
{{- if eq $share.preset "ingress-nginx" -}}
sum by (host) (rate(nginx_ingress_controller_requests{host!=""}[5m]))
{{- else if eq $share.preset "f5-nginx-plus" -}}
{{- /* F5 NGINX Ingress Controller names each server's status zone after its host. */ -}}
sum by (host) (label_replace(rate(nginx_ingress_nginxplus_server_zone_requests[5m]), "host", "$1", "server_zone", "(.+)"))
{{- else if eq $share.preset "generic" -}}
{{- $expr := required "metrics.prometheusRule.share.generic.expr is required with preset generic" $share.generic.expr -}}
{{- if $share.generic.perHost -}}
sum by (host) ({{ $expr }})
{{- else -}}
{{- /* Recorded with the rule label host="*" (see _rules.tpl). */ -}}
sum({{ $expr }})
{{- end -}}
{{- else -}}
{{- fail (printf "metrics.prometheusRule.share.preset: unknown preset %q" $share.preset) -}}
{{- end -}}
{{- end -}}

{{/* The operator's affinity: operator.affinity with a node of one of image.architectures
    required. Required node selector terms are alternatives, so the architecture is added to
    each of the user's terms (or makes the only term); the rest of the affinity is kept as is. */}}
{{- define "h3-ingress.operatorAffinity" -}}
{{- $affinity := deepCopy (.Values.operator.affinity | default dict) -}}
{{- $arch := dict "key" "kubernetes.io/arch" "operator" "In" "values" .Values.image.architectures -}}
{{- $node := get $affinity "nodeAffinity" | default dict -}}
{{- $required := get $node "requiredDuringSchedulingIgnoredDuringExecution" | default dict -}}
{{- $terms := list -}}
{{- range (get $required "nodeSelectorTerms" | default (list dict)) -}}
{{- $expressions := append (get . "matchExpressions" | default list) $arch -}}
{{- $terms = append $terms (set (deepCopy .) "matchExpressions" $expressions) -}}
{{- end -}}
{{- $_ := set $required "nodeSelectorTerms" $terms -}}
{{- $_ = set $node "requiredDuringSchedulingIgnoredDuringExecution" $required -}}
{{- $_ = set $affinity "nodeAffinity" $node -}}
{{- toYaml $affinity -}}
{{- end -}}
