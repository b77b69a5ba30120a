//! What most scenarios stand up before their own checks, and take down after: the chart in the
//! operator's namespace (with the registry's pull secret on real nodes), TLS Secrets from the
//! run's PKI, an IngressClass with annotated Ingresses, an Http3Listener; the data plane's pods
//! by listener; what a previous or kept run left, removed.

use std::collections::BTreeMap;
use std::path::Path;

use h3_ingress::api::{annotations, schema, Http3Listener};
use h3_ingress::operator::labels;
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret};
use k8s_openapi::api::networking::v1::IngressClass;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{Api, Client, ResourceExt};
use serde_json::{json, Value};

use crate::cmd::{output, repo, run as sh};
use crate::k8s::{self, KUBE_READY};
use crate::pki::Leaf;
use crate::poll::until;
use crate::{info, Env, Error, Result};

/// The chart's release and namespace (operator and data plane).
pub const NS_OP: &str = "h3-ingress";
pub const RELEASE: &str = "h3-ingress";
/// The image repository the chart is installed with (the agent runs the local binary for it).
pub const IMAGE_REPO: &str = "registry.h3i.test/h3-ingress";
/// What nginx advertises (the proxy's own default differs).
pub const ALT_SVC: &str = "h3=\":443\"; ma=3600";
/// The pull secret of the cluster's registry, in the operator's namespace.
pub const PULL_SECRET: &str = "regcred";

/// Whether `H3I_<NAME>_KEEP=1` asks to leave a run's objects in place.
pub fn keep(var: &str) -> bool {
    std::env::var(var).is_ok_and(|v| v == "1")
}

/// `app.kubernetes.io/instance=LISTENER,app.kubernetes.io/component=data-plane`
pub fn dp_selector(listener: &str) -> String {
    format!(
        "{}={listener},{}={}",
        labels::INSTANCE,
        labels::COMPONENT,
        labels::COMPONENT_DATA_PLANE
    )
}

/// `app.kubernetes.io/component=operator`
pub fn op_selector() -> String {
    format!("{}={}", labels::COMPONENT, labels::COMPONENT_OPERATOR)
}

/// Applies a namespace with these labels.
pub async fn namespace(client: &Client, name: &str, labels: &[(&str, &str)]) -> Result<()> {
    let labels: BTreeMap<&str, &str> = labels.iter().copied().collect();
    let ns = json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": name, "labels": labels}});
    k8s::apply(&Api::<Namespace>::all(client.clone()), name, &ns).await?;
    Ok(())
}

/// `helm install` of `chart` into [`NS_OP`] (labelled privileged: the data plane is
/// hostNetwork) with `image.repository=`[`IMAGE_REPO`], the registry's pull secret on real
/// nodes, and `sets` (`key=value`); `--wait`. Returns what helm printed.
pub async fn helm_install(
    env: &Env,
    client: &Client,
    chart: &Path,
    sets: &[String],
) -> Result<String> {
    let privileged = [("pod-security.kubernetes.io/enforce", "privileged")];
    namespace(client, NS_OP, &privileged).await?;
    let mut all = vec![format!("image.repository={IMAGE_REPO}")];
    if env.real_nodes {
        let password = std::fs::read_to_string(&env.registry_password_file).unwrap_or_default();
        pull_secret(client, NS_OP, &env.registry_user, password.trim()).await?;
        all.push(format!("imagePullSecrets[0].name={PULL_SECRET}"));
    }
    all.extend(sets.iter().cloned());
    let chart = chart.to_string_lossy();
    let mut args = vec!["install", RELEASE, &chart, "-n", NS_OP];
    for s in &all {
        args.extend(["--set", s]);
    }
    args.extend(["--wait", "--timeout", "120s"]);
    sh("helm", &args)
        .await
        .map_err(|e| Error::Check(format!("helm install: {e}")))
}

/// The working tree's chart.
pub fn chart() -> std::path::PathBuf {
    repo().join("charts/h3-ingress")
}

/// `helm upgrade RELEASE CHART --reuse-values --set ...` (`--wait`, 120 s).
pub async fn helm_upgrade(
    chart: &Path,
    reuse: bool,
    sets: &[String],
    timeout: &str,
) -> Result<String> {
    let chart = chart.to_string_lossy();
    let mut args = vec!["upgrade", RELEASE, &chart, "-n", NS_OP];
    if reuse {
        args.push("--reuse-values");
    }
    for s in sets {
        args.extend(["--set", s]);
    }
    args.extend(["--wait", "--timeout", timeout]);
    sh("helm", &args)
        .await
        .map_err(|e| Error::Check(format!("helm upgrade: {e}")))
}

/// `helm rollback RELEASE REVISION` (`--wait`): the chart and values of that revision, as a
/// user goes back after an upgrade. Helm leaves the CRD as it is.
pub async fn helm_rollback(revision: u32, timeout: &str) -> Result<String> {
    let revision = revision.to_string();
    let args = [
        "rollback",
        RELEASE,
        &revision,
        "-n",
        NS_OP,
        "--wait",
        "--timeout",
        timeout,
    ];
    sh("helm", &args)
        .await
        .map_err(|e| Error::Check(format!("helm rollback: {e}")))
}

/// A `kubernetes.io/dockerconfigjson` Secret for the cluster's registry.
pub async fn pull_secret(client: &Client, ns: &str, user: &str, password: &str) -> Result<()> {
    let auth = crate::pods::base64(format!("{user}:{password}").as_bytes());
    let config = json!({"auths": {"registry.h3i.test": {"username": user, "password": password, "auth": auth}}});
    let data = BTreeMap::from([(".dockerconfigjson", config.to_string().into_bytes())]);
    secret(
        client,
        ns,
        PULL_SECRET,
        "kubernetes.io/dockerconfigjson",
        data,
    )
    .await
}

/// A `kubernetes.io/tls` Secret with this leaf's certificate (as its file has it: a chain when
/// the CA was appended) and key.
pub async fn tls_secret(client: &Client, ns: &str, name: &str, leaf: &Leaf) -> Result<()> {
    let read = |p: &Path| {
        std::fs::read(p).map_err(|source| Error::Io {
            context: format!("read {}", p.display()),
            source,
        })
    };
    let data = BTreeMap::from([("tls.crt", read(&leaf.crt)?), ("tls.key", read(&leaf.key)?)]);
    secret(client, ns, name, "kubernetes.io/tls", data).await
}

/// A Secret of `type_` with these data keys (their bytes; base64 is done here).
pub async fn secret(
    client: &Client,
    ns: &str,
    name: &str,
    type_: &str,
    data: BTreeMap<&str, Vec<u8>>,
) -> Result<()> {
    let data: BTreeMap<&str, String> = data
        .into_iter()
        .map(|(k, v)| (k, crate::pods::base64(&v)))
        .collect();
    let v = json!({"apiVersion": "v1", "kind": "Secret", "type": type_,
        "metadata": {"name": name, "namespace": ns}, "data": data});
    k8s::apply(&Api::<Secret>::namespaced(client.clone(), ns), name, &v).await?;
    Ok(())
}

/// An IngressClass of this controller.
pub async fn ingress_class(client: &Client, name: &str, controller: &str) -> Result<()> {
    let v = json!({"apiVersion": "networking.k8s.io/v1", "kind": "IngressClass",
        "metadata": {"name": name}, "spec": {"controller": controller}});
    k8s::apply(&Api::<IngressClass>::all(client.clone()), name, &v).await?;
    Ok(())
}

/// An Ingress of `class` with the h3 annotation for `host`, its TLS from Secret `secret`.
pub async fn ingress(
    client: &Client,
    ns: &str,
    name: &str,
    class: &str,
    host: &str,
    secret: &str,
) -> Result<()> {
    let v = json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
        "metadata": {"name": name, "namespace": ns, "annotations": {annotations::ENABLED: "true"}},
        "spec": {"ingressClassName": class,
            "tls": [{"hosts": [host], "secretName": secret}],
            "rules": [{"host": host, "http": {"paths": [{"path": "/", "pathType": "Prefix",
                "backend": {"service": {"name": "shop", "port": {"number": 80}}}}]}}]}});
    let api: Api<k8s_openapi::api::networking::v1::Ingress> = Api::namespaced(client.clone(), ns);
    k8s::apply(&api, name, &v).await?;
    Ok(())
}

/// Applies an Http3Listener with this spec.
pub async fn listener(client: &Client, name: &str, spec: Value) -> Result<Http3Listener> {
    let v = json!({"apiVersion": format!("h3-ingress.dev/{}", schema::VERSION),
        "kind": "Http3Listener", "metadata": {"name": name}, "spec": spec});
    k8s::apply(&Api::<Http3Listener>::all(client.clone()), name, &v).await
}

/// Kubernetes' own `Ready` of a pod is `True`.
pub fn pod_ready(p: &Pod) -> bool {
    let conds = p.status.as_ref().and_then(|s| s.conditions.as_ref());
    conds
        .into_iter()
        .flatten()
        .any(|c| c.type_ == KUBE_READY && c.status == "True")
}

/// The restart count of the pod's first container.
pub fn restarts(p: &Pod) -> i32 {
    let st = p
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref());
    st.and_then(|c| c.first()).map_or(0, |c| c.restart_count)
}

/// The node a pod is scheduled on.
pub fn node_of(p: &Pod) -> String {
    p.spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default()
}

/// Exactly `count` pods match `selector` in [`NS_OP`], all Ready, none being deleted.
pub async fn pods_ready(client: &Client, selector: &str, count: usize) -> Result<bool> {
    let pods = k8s::list(&Api::<Pod>::namespaced(client.clone(), NS_OP), selector).await?;
    let ready = pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none() && pod_ready(p))
        .count();
    Ok(pods.len() == count && ready == count)
}

/// The pods matching `selector` in [`NS_OP`].
pub async fn pods(client: &Client, selector: &str) -> Result<Vec<Pod>> {
    k8s::list(&Api::<Pod>::namespaced(client.clone(), NS_OP), selector).await
}

/// What an interrupted or kept run left (listeners, the release, the namespaces, the CRD)
/// would confuse every check: delete it and wait until it is gone.
pub async fn remove_leftovers(client: &Client, namespaces: &[&str]) -> Result<()> {
    info("removing objects a previous run left");
    let ls = Api::<Http3Listener>::all(client.clone());
    for l in listeners_left(&ls).await? {
        k8s::delete(&ls, &l).await?;
    }
    let _ = until(60, "listeners deleted", || async {
        Ok(listeners_left(&ls).await?.is_empty())
    })
    .await;
    let _ = output("helm", &["uninstall", RELEASE, "-n", NS_OP, "--wait"]).await;
    let nss = Api::<Namespace>::all(client.clone());
    // The operator's namespace too: the previous scenario's clean-up deleted it without
    // waiting, and a namespace still terminating refuses the next install's objects.
    let all: Vec<&str> = namespaces.iter().copied().chain([NS_OP]).collect();
    for n in &all {
        k8s::delete(&nss, n).await?;
    }
    until(90, &format!("namespaces {all:?} deleted"), || async {
        for n in &all {
            if k8s::exists(&nss, n).await? {
                return Ok(false);
            }
        }
        Ok(true)
    })
    .await?;
    // Waited for as `kubectl delete` waits: a CRD still terminating is skipped by the next
    // `helm install` (it exists) and then vanishes under its listeners.
    let crds = Api::<CustomResourceDefinition>::all(client.clone());
    k8s::delete(&crds, schema::CRD_NAME).await?;
    until(60, "the CRD deleted", || async {
        Ok(!k8s::exists(&crds, schema::CRD_NAME).await?)
    })
    .await?;
    Ok(())
}

/// Whether the operator's namespace, one of `namespaces` or the CRD exists.
pub async fn anything_left(client: &Client, namespaces: &[&str]) -> Result<bool> {
    let nss = Api::<Namespace>::all(client.clone());
    for n in namespaces.iter().chain([&NS_OP]) {
        if k8s::exists(&nss, n).await? {
            return Ok(true);
        }
    }
    k8s::exists(
        &Api::<CustomResourceDefinition>::all(client.clone()),
        schema::CRD_NAME,
    )
    .await
}

/// The listeners still there; none once the previous run's clean-up has deleted the CRD (the
/// API server then answers 404 for the whole resource path).
async fn listeners_left(ls: &Api<Http3Listener>) -> Result<Vec<String>> {
    match k8s::names(ls, "").await {
        Err(Error::Kube(kube::Error::Api(e))) if e.code == 404 => Ok(Vec::new()),
        other => other,
    }
}

/// A run's clean-up: every listener, the release, the namespaces and the CRD, without waiting
/// (the next run's [`remove_leftovers`] waits). Never fails: the verdict is made already.
pub async fn remove_objects(client: &Client, namespaces: &[&str]) {
    let ls = Api::<Http3Listener>::all(client.clone());
    for l in k8s::names(&ls, "").await.unwrap_or_default() {
        let _ = k8s::delete(&ls, &l).await;
    }
    let _ = output("helm", &["uninstall", RELEASE, "-n", NS_OP, "--wait=false"]).await;
    let nss = Api::<Namespace>::all(client.clone());
    for n in namespaces.iter().chain([&NS_OP]) {
        let _ = k8s::delete(&nss, n).await;
    }
    let crds = Api::<CustomResourceDefinition>::all(client.clone());
    let _ = k8s::delete(&crds, schema::CRD_NAME).await;
}

/// Whether no data plane pod of `listener` is both Ready and not being deleted.
pub async fn none_serving(client: &Client, listener: &str) -> Result<bool> {
    let pods = pods(client, &dp_selector(listener)).await?;
    Ok(!pods
        .iter()
        .any(|p| pod_ready(p) && p.metadata.deletion_timestamp.is_none()))
}

/// The names of pods, sorted and joined by spaces.
pub fn pod_names(pods: &[Pod]) -> String {
    let mut v: Vec<String> = pods.iter().map(|p| p.name_any()).collect();
    v.sort();
    v.join(" ")
}

/// busybox httpd answering `body` on every path, behind Service `backend` port 80 that Traefik
/// reaches through kube-proxy (`service.nativelb`), in `ns`.
pub async fn backend(client: &Client, ns: &str, body: &str) -> Result<()> {
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "www", "namespace": ns},
        "data": {"index.html": format!("{body}\n")}});
    let api: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(client.clone(), ns);
    k8s::apply(&api, "www", &cm).await?;
    let deploy = json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "backend", "namespace": ns},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "backend"}},
            "template": {"metadata": {"labels": {"app": "backend"}},
                "spec": {"containers": [{"name": "httpd", "image": "registry.h3i.test/busybox:1",
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["/bin/busybox", "httpd", "-f", "-p", "8080", "-h", "/www"],
                    "ports": [{"containerPort": 8080}],
                    "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1},
                    "volumeMounts": [{"name": "www", "mountPath": "/www"}]}],
                    "volumes": [{"name": "www", "configMap": {"name": "www"}}]}}}});
    let api: Api<k8s_openapi::api::apps::v1::Deployment> = Api::namespaced(client.clone(), ns);
    k8s::apply(&api, "backend", &deploy).await?;
    let svc = json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "backend", "namespace": ns,
            "annotations": {"traefik.ingress.kubernetes.io/service.nativelb": "true"}},
        "spec": {"selector": {"app": "backend"}, "ports": [{"port": 80, "targetPort": 8080}]}});
    let api: Api<k8s_openapi::api::core::v1::Service> = Api::namespaced(client.clone(), ns);
    k8s::apply(&api, "backend", &svc).await?;
    Ok(())
}
