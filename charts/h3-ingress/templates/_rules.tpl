{{/*
The rule groups of rules/h3-ingress.rules.yaml with the TCP ingress denominator inserted right
before the share rule (same group, so both are evaluated in one pass), disabled alerts removed,
alertLabels merged in and the `for:` of alertFor set. Emitted as YAML `groups:`; used by the PrometheusRule.
*/}}
{{- define "h3-ingress.ruleGroups" -}}
{{- $cfg := .Values.metrics.prometheusRule -}}
{{- $file := .Files.Get "rules/h3-ingress.rules.yaml" | fromYaml -}}
{{- if not $file.groups -}}
{{- fail "rules/h3-ingress.rules.yaml is missing or has no groups" -}}
{{- end -}}
{{- $denominator := dict "record" "h3_ingress:tcp_ingress_requests:rate5m" "expr" (include "h3-ingress.tcpIngressRequestsExpr" .) -}}
{{- $groups := list -}}
{{- range $group := $file.groups -}}
{{- $rules := list -}}
{{- range $rule := $group.rules -}}
{{- if eq (default "" $rule.record) "h3_ingress:h3_request_share:ratio_rate5m" -}}
{{- if and (eq $cfg.share.preset "generic") (not $cfg.share.generic.perHost) -}}
{{- /* The denominator has no per-host breakdown: record the h3 total under host="*" to match it. */ -}}
{{- $rules = append $rules (dict "record" "h3_ingress:h3_requests:rate5m" "expr" "sum(rate(h3_ingress_requests_total{host!=\"other\"}[5m]))" "labels" (dict "host" "*")) -}}
{{- $_ := set $denominator "labels" (dict "host" "*") -}}
{{- end -}}
{{- $rules = append $rules $denominator -}}
{{- end -}}
{{- if $rule.alert -}}
{{- if not (has $rule.alert $cfg.disabledAlerts) -}}
{{- $labels := merge (deepCopy (default (dict) $rule.labels)) $cfg.alertLabels -}}
{{- $alert := set (deepCopy $rule) "labels" $labels -}}
{{- if hasKey $cfg.alertFor $rule.alert -}}
{{- $_ := set $alert "for" (get $cfg.alertFor $rule.alert) -}}
{{- end -}}
{{- $rules = append $rules $alert -}}
{{- end -}}
{{- else -}}
{{- $rules = append $rules $rule -}}
{{- end -}}
{{- end -}}
{{- $groups = append $groups (dict "name" $group.name "rules" $rules) -}}
{{- end -}}
{{- toYaml (dict "groups" $groups) -}}
{{- end -}}
