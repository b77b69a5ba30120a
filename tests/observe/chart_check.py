#!/usr/bin/env python3
"""The Helm chart, rendered and linted by the real Helm v4 SDK (PyPI helm-python-sdk), offline.

Renders with default values and with every optional part on (with and without the Prometheus
Operator API), lints both, validates every rendered object (k8svalidate.py), and checks the
properties the issue asks for: CRD copy identical, secure defaults, least-privilege RBAC exactly
the rules listed below, capability-gated monitors, dashboard ConfigMap, NOTES, a values schema
that rejects typos, and documented values.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import helmlib  # noqa: E402
import k8svalidate  # noqa: E402
from helm_python import HelmError  # noqa: E402

ROOT = helmlib.ROOT
CHART = helmlib.CHART
failures: list[str] = []
skipped: list[str] = []


def check(cond: bool, what: str) -> None:
    if not cond:
        failures.append(what)


def rules(*entries) -> set[tuple[str, str, str]]:
    return {(group, r, v) for group, resources, verbs in entries for r in resources for v in verbs}


# (apiGroup, resource, verb) the operator may use cluster-wide, plus finalizers;
# templates/rbac.yaml says why each is needed. Anything more or less fails. No `bind`, no
# `escalate`, no wildcard.
CONTRACT = rules(
    ("h3-ingress.dev", ["http3listeners"], ["get", "list", "watch"]),
    ("h3-ingress.dev", ["http3listeners/status"], ["get", "patch"]),
    ("h3-ingress.dev", ["http3listeners/finalizers"], ["update"]),
    ("networking.k8s.io", ["ingresses", "ingressclasses"], ["get", "list", "watch"]),
    ("gateway.networking.k8s.io", ["gateways", "httproutes", "referencegrants"], ["get", "list", "watch"]),
    ("traefik.io", ["middlewares", "tlsoptions"], ["get", "list", "watch"]),
    # rbac.advertiseAltSvc (default): spec.advertise.altSvc's own Middlewares, and
    # router.middlewares on Ingresses that have none.
    ("traefik.io", ["middlewares"], ["create", "patch", "delete"]),
    ("networking.k8s.io", ["ingresses"], ["patch"]),
    ("", ["secrets"], ["get", "list", "watch"]),
    ("", ["events"], ["create", "patch"]),
    ("events.k8s.io", ["events"], ["create", "patch"]),
    # The data plane's read access to its listener (deleted when another operator runs it, and by
    # the uninstall hook).
    ("rbac.authorization.k8s.io", ["clusterroles", "clusterrolebindings"], ["get", "list", "watch", "create", "patch", "delete"]),
    # The other operators' Leases: whose a listener is (controller names).
    ("coordination.k8s.io", ["leases"], ["get", "list", "watch"]),
    # The one CRD by name: read it (CRDCurrent), and with crd.upgrade (default) apply it.
    ("apiextensions.k8s.io", ["customresourcedefinitions[http3listeners.h3-ingress.dev]"],
     ["get", "list", "watch", "patch"]),
)
# crd.upgrade=false: the same without patching the CRD.
CONTRACT_NO_CRD_UPGRADE = CONTRACT - {
    ("apiextensions.k8s.io", "customresourcedefinitions[http3listeners.h3-ingress.dev]", "patch")}
# The same, in the release namespace only: the data plane objects it runs there.
NAMESPACED = rules(
    ("apps", ["daemonsets"], ["get", "list", "watch", "create", "patch", "delete"]),
    # Its own Deployment by name: the uninstall hook scales it to 0 first.
    ("apps", ["deployments[h3-ingress-operator]", "deployments/scale[h3-ingress-operator]"], ["get", "patch"]),
    ("", ["serviceaccounts"], ["get", "list", "watch", "create", "patch", "delete"]),
    ("", ["services"], ["get", "list", "watch", "create", "patch", "delete"]),
    ("", ["pods"], ["get", "list", "watch"]),
    ("", ["events"], ["list"]),
    # The listeners' QUIC keys Secrets (created once, never changed).
    ("", ["secrets"], ["create"]),
)
# In the hosts namespace only: the certificate mirrors, and the data plane's Role there.
HOSTS = rules(("", ["secrets"], ["get", "list", "watch", "create", "patch", "delete"]),
              ("rbac.authorization.k8s.io", ["roles", "rolebindings"], ["get", "list", "watch", "create", "patch", "delete"]))
# The operator's own Lease (election and registration; the uninstall hook deletes it).
LEASES = {("coordination.k8s.io", "leases", v) for v in ["get", "list", "watch", "create", "update", "patch", "delete"]}


def grants(role: dict) -> set[tuple[str, str, str]]:
    """(group, resource, verb) of every rule; a rule restricted to resourceNames gives
    `resource[name]` per name."""
    out = set()
    for rule in role["rules"]:
        names = rule.get("resourceNames")
        for g in rule["apiGroups"]:
            for r in rule["resources"]:
                for v in rule["verbs"]:
                    check("*" not in (g, r, v), f"{role['kind']} {role['metadata']['name']} uses a wildcard")
                    out |= {(g, f"{r}[{n}]", v) for n in names} if names else {(g, r, v)}
    return out


def unnamed(rules_: set[tuple[str, str, str]]) -> set[tuple[str, str, str]]:
    """The rules with their resourceNames dropped: a rule on a resource covers it by name."""
    return {(g, r.split("[")[0], v) for g, r, v in rules_}


def by_kind(objs):
    out: dict[str, list[dict]] = {}
    for _, o in objs:
        out.setdefault(o["kind"], []).append(o)
    return out


def properties(name: str, objs, notes: str, monitoring: bool, all_on: bool) -> None:
    k = by_kind(objs)
    (dep,) = k["Deployment"]
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    sc, psc = c["securityContext"], pod["securityContext"]
    check(psc.get("runAsNonRoot") is True and sc.get("runAsNonRoot") is True, f"{name}: not runAsNonRoot")
    check(sc.get("allowPrivilegeEscalation") is False, f"{name}: privilege escalation allowed")
    check(sc.get("readOnlyRootFilesystem") is True, f"{name}: root filesystem writable")
    check(sc.get("capabilities") == {"drop": ["ALL"]}, f"{name}: capabilities not exactly drop ALL")
    check(psc.get("seccompProfile", {}).get("type") == "RuntimeDefault", f"{name}: no RuntimeDefault seccomp")
    check(c["args"][0] == "operator" and "--leader-election" in c["args"], f"{name}: operator args {c['args']}")
    check("--crd-upgrade" in c["args"], f"{name}: the operator does not upgrade an older CRD: {c['args']}")
    # The appVersion tag of a working-tree chart is reused by every build: always pulled.
    check(c["imagePullPolicy"] == "Always", f"{name}: pull policy {c['imagePullPolicy']} for {c['image']}")
    env = {e["name"]: e for e in c["env"]}
    check(env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace",
          f"{name}: POD_NAMESPACE not from the downward API")
    check("H3_INGRESS_IMAGE" in env, f"{name}: no data plane image")
    check(any(a.startswith("--admin-address=[::]:") for a in c["args"]),
          f"{name}: the admin endpoint is not [::] (IPv6-only clusters): {c['args']}")
    if all_on:
        check(env.get("H3_INGRESS_IMAGE_PULL_SECRETS", {}).get("value") == "regcred,mirror",
              f"{name}: imagePullSecrets not passed to the operator for the data plane")
        check(pod.get("imagePullSecrets") == [{"name": "regcred"}, {"name": "mirror"}],
              f"{name}: imagePullSecrets not on the operator's pods")
        check(env.get("H3_INGRESS_TUNE_IMAGE", {}).get("value", "").startswith("registry.example.com/busybox@sha256:"),
              f"{name}: dataPlane.tuneImage not passed to the operator")
    else:
        check("H3_INGRESS_IMAGE_PULL_SECRETS" not in env and "H3_INGRESS_TUNE_IMAGE" not in env,
              f"{name}: pull secrets or tune image passed without values")
    check(c["livenessProbe"]["httpGet"]["path"] == "/healthz" and c["readinessProbe"]["httpGet"]["path"] == "/readyz",
          f"{name}: probes")
    # The image's architectures: the operator's own pods and (through the operator) the data plane's.
    check(arch_terms(pod) == [[ARCH_DEFAULT]], f"{name}: operator affinity {pod.get('affinity')}")
    check(env.get("H3_INGRESS_ARCHITECTURES", {}).get("value") == "amd64,arm64",
          f"{name}: image.architectures not passed to the operator")
    for o in (o for _, o in objs):
        labels = o["metadata"].get("labels", {})
        check(labels.get("app.kubernetes.io/name") == "h3-ingress", f"{name}: {o['kind']} lacks app.kubernetes.io/name")

    (cr,) = k["ClusterRole"]
    for o in k["ClusterRole"] + k["ClusterRoleBinding"] + k.get("PriorityClass", []):
        check(o["metadata"]["name"].startswith("h3-ingress.h3-ingress-"),
              f"{name}: cluster-scoped {o['kind']} {o['metadata']['name']} not named after the release namespace")
    check(cr["metadata"].get("annotations", {}).get("h3-ingress.dev/controller-name") == "h3-ingress.dev/operator",
          f"{name}: the operator ClusterRole does not carry the controller name")
    check(env.get("H3_INGRESS_CONTROLLER_NAME", {}).get("value") == "h3-ingress.dev/operator",
          f"{name}: the controller name is not passed to the operator")
    (job,) = k["Job"]
    hook = job["metadata"].get("annotations", {})
    jc = job["spec"]["template"]["spec"]["containers"][0]
    check(hook.get("helm.sh/hook") == "pre-delete" and "hook-succeeded" in hook.get("helm.sh/hook-delete-policy", ""),
          f"{name}: the uninstall Job is not a pre-delete hook: {hook}")
    check(jc["args"][0] == "uninstall" and "--operator-deployment=h3-ingress-operator" in jc["args"],
          f"{name}: uninstall hook args {jc['args']}")
    check(job["spec"]["template"]["spec"]["serviceAccountName"] == pod["serviceAccountName"],
          f"{name}: the uninstall hook does not run as the operator's ServiceAccount")
    check(jc["securityContext"] == c["securityContext"], f"{name}: the uninstall hook's container is not locked down")
    cluster = grants(cr)
    check(cluster == CONTRACT, f"{name}: ClusterRole differs from the expected rules: extra {sorted(cluster - CONTRACT)}, "
                               f"missing {sorted(CONTRACT - cluster)}")
    roles = {r["metadata"]["name"]: r for r in k["Role"]}
    check(set(roles) == {"h3-ingress-operator", "h3-ingress-leader-election", "h3-ingress-operator-hosts"},
          f"{name}: Roles {sorted(roles)}")
    if "h3-ingress-operator-hosts" in roles:
        hosts = roles.pop("h3-ingress-operator-hosts")
        check(grants(hosts) == HOSTS, f"{name}: the hosts namespace Role is not exactly the mirror rules")
        check(hosts["metadata"].get("namespace") == "h3-ingress-hosts",
              f"{name}: the mirrors Role is not in the hosts namespace")
        (nsobj,) = [n for n in k.get("Namespace", []) if n["metadata"]["name"] == "h3-ingress-hosts"] or [None]
        check(nsobj is not None, f"{name}: the hosts namespace is not created")
    if "h3-ingress-operator" in roles:
        ns = grants(roles["h3-ingress-operator"])
        check(ns == NAMESPACED, f"{name}: the operator's Role differs: extra {sorted(ns - NAMESPACED)}, "
                                f"missing {sorted(NAMESPACED - ns)}")
    if "h3-ingress-leader-election" in roles:
        check(grants(roles["h3-ingress-leader-election"]) == LEASES,
              f"{name}: leader-election Role is not exactly the lease rules")
    for r in roles.values():
        check(r["metadata"].get("namespace") == "h3-ingress", f"{name}: Role {r['metadata']['name']} not in the release namespace")
    sa = k["ServiceAccount"][0]["metadata"]["name"]
    for b in k["ClusterRoleBinding"] + k["RoleBinding"]:
        check(b["subjects"] == [{"kind": "ServiceAccount", "name": sa, "namespace": "h3-ingress"}],
              f"{name}: {b['kind']} binds {b['subjects']}")

    svc = k["Service"][0]
    check(svc["spec"]["ports"][0]["name"] == "metrics", f"{name}: metrics Service port")
    mon_kinds = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
    present = mon_kinds & set(k)
    if all_on and monitoring:
        check(present == mon_kinds, f"{name}: monitors missing: {mon_kinds - present}")
    else:
        check(not present, f"{name}: {present} rendered without monitoring.coreos.com/v1")
    if all_on and not monitoring:
        check("WARNING" in notes and "were NOT created" in notes, f"{name}: NOTES do not warn about skipped monitors")
    if "PodMonitor" in k:
        pod_monitor(name, k["PodMonitor"][0])
    if "PrometheusRule" in k:
        groups = k["PrometheusRule"][0]["spec"]["groups"]
        alerts = [r for g in groups for r in g["rules"] if "alert" in r]
        check(all(r["labels"].get("team") == "edge" and r["labels"].get("severity") for r in alerts),
              f"{name}: alertLabels not merged (or severity lost)")
    if all_on:
        check(dep["spec"]["replicas"] == 2 and "PodDisruptionBudget" in k, f"{name}: 2 replicas + PDB")
        (listener,) = k["Http3Listener"]
        check(listener["spec"]["upstream"]["address"].endswith(":443"), f"{name}: listener spec")
        check(listener["spec"].get("controllerName") == "h3-ingress.dev/operator",
              f"{name}: the chart's listener does not name the release's operator")
    cms = [o for o in k.get("ConfigMap", []) if o["metadata"]["name"].endswith("-dashboard")]
    check(len(cms) == 1, f"{name}: dashboard ConfigMap missing")
    if cms:
        check(cms[0]["metadata"]["labels"].get("grafana_dashboard") == "1", f"{name}: dashboard label")
        dash = (CHART / "dashboards/h3-ingress.json").read_text()
        check(json.loads(cms[0]["data"]["h3-ingress.json"]) == json.loads(dash), f"{name}: dashboard data differs")
    for needle in ("kubectl annotate ingress NAME -n NAMESPACE h3-ingress.dev/enabled=true", "kubectl get h3l -w"):
        check(needle in notes, f"{name}: NOTES.txt lacks `{needle}`")


ARCH_DEFAULT = {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64", "arm64"]}


def arch_terms(pod: dict) -> list[list[dict]]:
    """The kubernetes.io/arch expressions of each required node selector term."""
    terms = (pod.get("affinity", {}).get("nodeAffinity", {})
             .get("requiredDuringSchedulingIgnoredDuringExecution", {}).get("nodeSelectorTerms", []))
    return [[e for e in t.get("matchExpressions", []) if e["key"] == "kubernetes.io/arch"] for t in terms]


def architectures() -> None:
    """image.architectures narrows the operator's affinity and the data plane's (--architectures),
    and is added to every node selector term of a user's operator.affinity, which stays otherwise."""
    def operator(values):
        (dep,) = [o for _, o in helmlib.objects(helmlib.render(values)) if o["kind"] == "Deployment"]
        pod = dep["spec"]["template"]["spec"]
        env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
        return pod, env
    arm = {"key": "kubernetes.io/arch", "operator": "In", "values": ["arm64"]}
    pod, env = operator({"image": {"architectures": ["arm64"]}})
    check(arch_terms(pod) == [[arm]] and env["H3_INGRESS_ARCHITECTURES"] == "arm64",
          f"image.architectures=[arm64]: affinity {pod['affinity']}, env {env['H3_INGRESS_ARCHITECTURES']}")
    pool = {"key": "pool", "operator": "In", "values": ["edge"]}
    by_name = {"key": "metadata.name", "operator": "In", "values": ["node-1"]}
    preferred = [{"weight": 1, "preference": {"matchExpressions": [{"key": "zone", "operator": "Exists"}]}}]
    anti = {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "podAffinityTerm": {
        "topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"a": "b"}}}}]}
    user = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [pool]}, {"matchFields": [by_name]}]},
        "preferredDuringSchedulingIgnoredDuringExecution": preferred}, "podAntiAffinity": anti}
    pod, _ = operator({"operator": {"affinity": user, "nodeSelector": {"pool": "edge"}}})
    aff = pod["affinity"]
    terms = aff["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    check(terms == [{"matchExpressions": [pool, ARCH_DEFAULT]},
                    {"matchFields": [by_name], "matchExpressions": [ARCH_DEFAULT]}],
          f"operator.affinity terms not each given the architecture: {terms}")
    check(aff["nodeAffinity"].get("preferredDuringSchedulingIgnoredDuringExecution") == preferred
          and aff.get("podAntiAffinity") == anti and pod.get("nodeSelector") == {"pool": "edge"},
          f"the rest of operator.affinity or operator.nodeSelector was not kept: {aff}")
    print("image.architectures: default [amd64, arm64] on the operator's affinity and --architectures; "
          "[arm64] narrows both; added to each of 2 user nodeSelectorTerms, the rest kept")


def pod_monitor(name: str, pm: dict) -> None:
    """The data plane declares no container port (src/operator/resources.rs): the PodMonitor must
    not select by one (`port`, `portNumber`, `targetPort` keep only declared ports, so it would
    scrape nothing) and must take the port from the annotation the operator writes."""
    src = (helmlib.ROOT / "src/operator/resources.rs").read_text()
    m = re.search(r'pub const METRICS_PORT_ANNOTATION: &str = "([^"]+)";', src)
    check(m is not None, "src/operator/resources.rs has no METRICS_PORT_ANNOTATION")
    if m is None:
        return
    meta = "__meta_kubernetes_pod_annotation_" + re.sub(r"[^a-zA-Z0-9_]", "_", m.group(1))
    (ep,) = pm["spec"]["podMetricsEndpoints"]
    check(not {"port", "portNumber", "targetPort"} & set(ep), f"{name}: PodMonitor selects a container port: {ep}")
    sources = [l for r in ep["relabelings"] for l in r.get("sourceLabels", [])]
    check(meta in sources, f"{name}: PodMonitor relabelings do not read {meta}")
    targets = [r.get("targetLabel") for r in ep["relabelings"]]
    check("__address__" in targets, f"{name}: PodMonitor does not set __address__")


def negative_cases() -> None:
    """values.schema.json and template guards must reject what they are meant to reject."""
    typos = [
        {"operator": {"replicass": 2}},
        {"imag": {"repository": "x"}},
        {"metrics": {"serviceMonitor": {"enable": True}}},
        {"metrics": {"prometheusRule": {"share": {"preset": "nginx"}}}},
        {"metrics": {"prometheusRule": {"disabledAlerts": ["H3IngressNoTraffic"]}}},
        {"metrics": {"podMonitor": {"interval": "15 seconds"}}},
        {"metrics": {"podMonitor": {"port": "metrics"}}},
        {"metrics": {"prometheusRule": {"alertFor": {"H3IngressNoTraffic": "5m"}}}},
        {"metrics": {"prometheusRule": {"alertFor": {"H3IngressOperatorDown": "soon"}}}},
        {"image": {"digest": "latest"}},
        {"operator": {"replicas": 3}},
        {"listener": {"name": "Default"}},
        {"controllerName": "staging"},
        {"controllerName": "Example.com/staging"},
        {"uninstall": {"waitSecond": 10}},
        {"listener": {"spec": {"upstream": {"clientAddress": {"trusted": "yes"}}}}},
        {"listener": {"spec": {"upstream": {"clientAddress": {"trust": True}}}}},
        {"listener": {"spec": {"upstream": {"clientAddress": {"via": "proxyProtocol"}}}}},
        {"image": {"architectures": []}},
        {"image": {"architectures": ["linux/arm64"]}},
        {"image": {"architectures": ["arm64", "arm64"]}},
    ]
    rejected = 0
    for v in typos:
        try:
            helmlib.validate_values(v)
            failures.append(f"values.schema.json accepted {v}")
        except HelmError:
            rejected += 1
    print(f"values.schema.json rejected {rejected}/{len(typos)} typo'd or invalid value sets")
    try:
        helmlib.validate_values(helmlib.ALL_ON)
    except HelmError as e:
        failures.append(f"values.schema.json rejects the all-on values: {e}")
    guards = [
        ({"operator": {"replicas": 2, "leaderElection": {"enabled": False}}}, "needs operator.leaderElection"),
        ({"listener": {"enabled": True}}, "listener.spec.upstream.address is required"),
        ({"metrics": {"prometheusRule": {"enabled": True, "share": {"preset": "generic"}}}},
         "share.generic.expr is required"),
    ]
    for values, message in guards:
        try:
            helmlib.render(values, api_versions=[helmlib.MONITORING_API])
            failures.append(f"rendering {values} did not fail")
        except HelmError as e:
            check(message in str(e), f"rendering {values} failed with an unexpected error: {e}")
    print(f"template guards: {len(guards)} invalid combinations refused with their message")
    # Disabling an alert removes exactly it; alertFor changes exactly the `for:` it names.
    source = yaml.safe_load((helmlib.ROOT / "charts/h3-ingress/rules/h3-ingress.rules.yaml").read_text())
    source_for = {r["alert"]: r["for"] for g in source["groups"] for r in g["rules"] if "alert" in r}
    objs = helmlib.objects(helmlib.render(
        {"metrics": {"prometheusRule": {"enabled": True, "disabledAlerts": ["H3IngressNoH3Traffic"],
                                        "alertFor": {"H3IngressDataPlaneTargetsMissing": "30s"}}}},
        api_versions=[helmlib.MONITORING_API]))
    (rule,) = [o for _, o in objs if o["kind"] == "PrometheusRule"]
    rendered_for = {r["alert"]: r["for"] for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r}
    check(set(rendered_for) == set(source_for) - {"H3IngressNoH3Traffic"},
          f"disabledAlerts left {sorted(rendered_for)}")
    want_for = dict(source_for, H3IngressDataPlaneTargetsMissing="30s")
    check(all(rendered_for[a] == want_for[a] for a in rendered_for),
          f"alertFor: rendered {rendered_for}, want {want_for}")


def crd_upgrade_and_pull_policy() -> None:
    """crd.upgrade=false drops the CRD patch rule and tells the operator; the pull policy is
    IfNotPresent only for an image that names one build (a digest, a VERSION-COMMIT tag)."""
    def operator(values):
        k = by_kind(helmlib.objects(helmlib.render(values)))
        (dep,) = k["Deployment"]
        return k["ClusterRole"][0], dep["spec"]["template"]["spec"]["containers"][0]
    cr, _ = operator({"rbac": {"advertiseAltSvc": False}})
    no_alt_svc = CONTRACT - rules(("traefik.io", ["middlewares"], ["create", "patch", "delete"]),
                                  ("networking.k8s.io", ["ingresses"], ["patch"]))
    check(grants(cr) == no_alt_svc, f"rbac.advertiseAltSvc=false: ClusterRole extra "
          f"{sorted(grants(cr) - no_alt_svc)}, missing {sorted(no_alt_svc - grants(cr))}")
    cr, c = operator({"crd": {"upgrade": False}})
    check(grants(cr) == CONTRACT_NO_CRD_UPGRADE,
          f"crd.upgrade=false: ClusterRole extra {sorted(grants(cr) - CONTRACT_NO_CRD_UPGRADE)}, "
          f"missing {sorted(CONTRACT_NO_CRD_UPGRADE - grants(cr))}")
    check("--no-crd-upgrade" in c["args"], f"crd.upgrade=false: operator args {c['args']}")
    cases = [
        ({"image": {"tag": "0.1.0-3f2a9c1b7d4e"}}, "IfNotPresent"),
        ({"image": {"digest": "sha256:" + "a" * 64}}, "IfNotPresent"),
        ({"image": {"tag": "0.1.0"}}, "Always"),
        ({"image": {"tag": "latest"}}, "Always"),
        ({"image": {"tag": "0.1.0", "pullPolicy": "IfNotPresent"}}, "IfNotPresent"),
        ({"image": {"pullPolicy": "Never"}}, "Never"),
    ]
    for values, want in cases:
        _, c = operator(values)
        check(c["imagePullPolicy"] == want, f"{values}: pull policy {c['imagePullPolicy']}, want {want}")
    print(f"crd.upgrade=false: no CRD patch rule, --no-crd-upgrade; pull policy right in {len(cases)} image cases")


def release_scope() -> None:
    """Two releases named alike in two namespaces render no cluster-scoped name twice; the
    chart's listener takes the release's controllerName unless its spec names one."""
    def cluster_names(namespace, values):
        objs = helmlib.objects(helmlib.render(values, namespace=namespace))
        return {(o["kind"], o["metadata"]["name"]) for _, o in objs if "namespace" not in o["metadata"]
                and o["kind"] not in ("Namespace", "Http3Listener")}, objs
    a, _ = cluster_names("prod", None)
    b, objs = cluster_names("staging", {"controllerName": "example.com/staging",
                                        "listener": {"enabled": True, "spec": {"upstream": {"address": "x:443"}}}})
    check(a and b and not a & b, f"cluster-scoped names shared by two releases: {sorted(a & b)}")
    (listener,) = [o for _, o in objs if o["kind"] == "Http3Listener"]
    check(listener["spec"]["controllerName"] == "example.com/staging", f"listener {listener['spec']}")
    (dep,) = [o for _, o in objs if o["kind"] == "Deployment"]
    env = {e["name"]: e.get("value") for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
    check(env["H3_INGRESS_CONTROLLER_NAME"] == "example.com/staging", f"operator env {env}")
    _, objs = cluster_names("staging", {"controllerName": "example.com/staging", "listener": {
        "enabled": True, "spec": {"controllerName": "example.com/other", "upstream": {"address": "x:443"}}}})
    (listener,) = [o for _, o in objs if o["kind"] == "Http3Listener"]
    check(listener["spec"]["controllerName"] == "example.com/other", "a listener's own controllerName was overridden")
    print(f"release scope: {len(a)} cluster-scoped objects per release, none shared between namespaces "
          f"prod and staging: {sorted(n for _, n in b)}")


def values_documented() -> None:
    """Every leaf key of values.yaml has a `# --` comment (helm-docs style) right above it."""
    lines = (CHART / "values.yaml").read_text().splitlines()
    undocumented = []
    for i, line in enumerate(lines):
        m = re.match(r"^(\s*)([A-Za-z][\w-]*):(.*)$", line)
        if not m:
            continue
        indent, key, rest = len(m.group(1)), m.group(2), m.group(3).strip()
        nxt = next((ln for ln in lines[i + 1:] if ln.strip() and not ln.strip().startswith("#")), "")
        is_parent = rest == "" and (len(nxt) - len(nxt.lstrip())) > indent and not nxt.lstrip().startswith("- ")
        if is_parent:
            continue
        j = i - 1
        block = []
        while j >= 0 and lines[j].strip().startswith("#"):
            block.append(lines[j].strip())
            j -= 1
        if not any(b.startswith("# --") for b in block):
            undocumented.append(key)
    # Keys inside a documented free-form map (e.g. listener.spec, resources) are examples.
    allowed = {"requests", "limits", "cpu", "memory", "ingressClassName", "port", "upstream", "address",
               "runAsNonRoot", "runAsUser", "runAsGroup", "seccompProfile", "type", "allowPrivilegeEscalation",
               "readOnlyRootFilesystem", "capabilities", "drop", "grafana_dashboard"}
    bad = [k for k in undocumented if k not in allowed]
    check(not bad, f"values.yaml keys without a `# --` comment: {bad}")


def operator_flags(binary: Path, objs) -> None:
    """Every flag and env var the chart passes to the operator is one the binary accepts."""
    p = subprocess.run([str(binary), "operator", "--help"], capture_output=True, text=True) if binary.exists() else None
    if p is None or p.returncode != 0:
        msg = f"SKIPPED: {binary} has no `operator` subcommand yet; chart args not checked against it"
        print("!" * 20 + " " + msg)
        skipped.append(msg)
        return
    (dep,) = [o for _, o in objs if o["kind"] == "Deployment"]
    c = dep["spec"]["template"]["spec"]["containers"][0]
    flags = [a.split("=")[0] for a in c["args"][1:] if a.startswith("--")]
    missing = [f for f in flags if not re.search(rf"(^|\s){re.escape(f)}[\s=,]", p.stdout)]
    check(not missing, f"`h3-ingress operator` does not accept {missing}")
    envs = [e["name"] for e in c["env"] if e["name"].startswith(("POD_NAMESPACE", "H3_INGRESS_"))]
    for env in envs:
        check(f"env: {env}" in p.stdout, f"`h3-ingress operator` does not read ${env}")
    print(f"operator flags the chart passes {flags}, env {', '.join(envs)}: "
          f"{'all accepted' if not missing else 'MISSING ' + str(missing)} by {binary.name} operator")
    # The uninstall hook's command line too.
    (job,) = [o for _, o in objs if o["kind"] == "Job"]
    jc = job["spec"]["template"]["spec"]["containers"][0]
    u = subprocess.run([str(binary), jc["args"][0], "--help"], capture_output=True, text=True)
    jflags = [a.split("=")[0] for a in jc["args"][1:] if a.startswith("--")]
    jmissing = [f for f in jflags if u.returncode != 0 or not re.search(rf"(^|\s){re.escape(f)}[\s=,]", u.stdout)]
    jmissing += [e["name"] for e in jc["env"] if e["name"].startswith(("POD_NAMESPACE", "H3_INGRESS_"))
                 and f"env: {e['name']}" not in u.stdout]
    check(not jmissing, f"`h3-ingress {jc['args'][0]}` does not accept {jmissing}")
    print(f"uninstall hook flags {jflags}: {'all accepted' if not jmissing else 'MISSING ' + str(jmissing)}")


def operator_holds_what_it_grants(binary: Path, objs) -> None:
    """The RBAC escalation rule without `bind`/`escalate`: the API server admits a Role or a
    binding only for permissions its author holds at that scope. Every rule of every Role and
    ClusterRole the operator makes for a data plane (`h3-ingress render`) must therefore be held
    by the operator's ClusterRole (cluster-wide: the Roles live in any namespace)."""
    import tempfile
    (cr,) = [o for _, o in objs if o["kind"] == "ClusterRole"]
    held = grants(cr)
    check(not any(v in ("bind", "escalate") for _, _, v in held), "the operator holds bind or escalate")
    with tempfile.TemporaryDirectory() as out:
        p = subprocess.run([str(binary), "render", "--out", out, "--namespace", "h3-ingress"],
                           capture_output=True, text=True)
        check(p.returncode == 0, f"h3-ingress render failed: {p.stderr}")
        granted = set()
        made = 0
        for f in Path(out).glob("*/*.yaml"):
            obj = yaml.safe_load(f.read_text())
            if obj.get("kind") in ("Role", "ClusterRole"):
                made += 1
                granted |= grants(obj)
    missing = sorted(unnamed(granted) - held)
    check(made > 0 and not missing, f"the operator grants rules it does not hold (needs bind/escalate): {missing}")
    print(f"RBAC escalation: {made} data-plane Roles/ClusterRoles grant {len(granted)} (group, resource, verb); "
          f"the operator holds {'all of them' if not missing else 'NOT ' + str(missing)} without bind/escalate")


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--operator-flags":
        objs = helmlib.objects(helmlib.render(helmlib.ALL_ON))
        operator_flags(Path(sys.argv[2]), objs)
        if Path(sys.argv[2]).exists():
            operator_holds_what_it_grants(Path(sys.argv[2]), objs)
        if failures:
            print("FAIL chart_check --operator-flags:\n  " + "\n  ".join(failures))
            return 1
        return 3 if skipped else 0
    # CRDs: the chart ships exactly the generated file.
    crds = helmlib.crds()
    want = (ROOT / "crds/http3listeners.h3-ingress.dev.yaml").read_text()
    check(len(crds) == 1 and crds[0]["data"] == want, "chart crds/ differs from crds/ (run tests/observe/gen.py)")
    print(f"chart crds/: {len(crds)} CRD, identical to crds/http3listeners.h3-ingress.dev.yaml")
    helmlib.selftest()

    k8svalidate.ensure_node_modules()
    crd_obj = yaml.safe_load(want)
    total = 0
    cases = [
        ("default values", None, []),
        ("all optional parts on", helmlib.ALL_ON, []),
        ("all optional parts on + monitoring.coreos.com/v1", helmlib.ALL_ON, [helmlib.MONITORING_API]),
    ]
    for label, values, apis in cases:
        for kv in helmlib.KUBE_VERSIONS:
            rendered = helmlib.render(values, api_versions=apis, kube_version=kv)
            objs = helmlib.objects(rendered)
            kinds = sorted(o["kind"] for _, o in objs)
            print(f"render [{label}] kube {kv}: {len(objs)} objects (+1 CRD from crds/): {kinds}")
            properties(label, objs, helmlib.notes(rendered), bool(apis), values is not None)
        # Validated against the oldest and newest schema versions in one go.
        n, errs = k8svalidate.validate([o for _, o in objs] + [crd_obj], helmlib.KUBE_VERSIONS, label)
        total += n
        failures.extend(errs)
        for kv in helmlib.KUBE_VERSIONS:
            report = helmlib.lint(values, kube_version=kv)
            msgs = [f"[{m['severity']}] {m['path']}: {m['error']}" for m in report["messages"]]
            serious = [m for m in report["messages"] if m["severity"] >= 2] + report.get("errors", [])
            print(f"helm lint --strict [{label}] kube {kv}: {report['total_charts_linted']} chart linted, "
                  f"{len(serious)} warnings/errors" + ("".join("\n    " + m for m in msgs) if msgs else ""))
            check(not serious and report["total_charts_linted"] == 1, f"helm lint [{label}] kube {kv}: {msgs}")
    negative_cases()
    architectures()
    crd_upgrade_and_pull_policy()
    release_scope()
    values_documented()
    print(f"validated {total} rendered objects (CRD included) in {len(cases)} renders")
    if failures:
        print("FAIL chart_check:\n  " + "\n  ".join(failures))
        return 1
    print("ok: chart_check")
    return 0


if __name__ == "__main__":
    sys.exit(main())
