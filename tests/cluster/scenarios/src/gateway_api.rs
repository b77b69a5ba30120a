//! The Gateway API's standard-channel CRDs: the pinned module `sigs.k8s.io/gateway-api`,
//! downloaded through the Go module proxy into the cluster's module cache (outside the repo,
//! checked against its pinned go.sum hash), applied server-side as its README says; and its
//! objects through kube's dynamic API.

use std::path::PathBuf;
use std::time::Instant;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Api, Client};
use serde_json::Value;

use crate::cmd::{output, run as sh};
use crate::poll::until;
use crate::{fail, ok, Error, Result};

/// The release whose standard channel is installed, and its go.sum hash: the module proxy and
/// the checksum database must hand out exactly this tree.
pub const VERSION: &str = "v1.6.3";
pub const SUM: &str = "h1:lKpJa5bGlraC/QeACvCpsHLdmO6y0iKfzVl6gzaFEYc=";
pub const GROUP: &str = "gateway.networking.k8s.io";

/// An API of one of the Gateway API's kinds (`HTTPRoute`, `v1`, plural `httproutes`), in
/// `ns` or cluster-wide.
pub fn api(
    client: &Client,
    version: &str,
    kind: &str,
    plural: &str,
    ns: Option<&str>,
) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk(GROUP, version, kind);
    let ar = ApiResource::from_gvk_with_plural(&gvk, plural);
    match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    }
}

/// `config/crd/standard` of the pinned module in the cluster's Go module cache.
async fn crd_dir(scratch: &std::path::Path) -> Result<PathBuf> {
    let cache =
        std::env::var("H3I_CLUSTER_CACHE").unwrap_or_else(|_| "/var/cache/h3-ingress".into());
    let module = format!("sigs.k8s.io/gateway-api@{VERSION}");
    let script = format!(
        "cd {} && GOMODCACHE={cache}/gomod GOCACHE={cache}/gocache GOTOOLCHAIN=local GOFLAGS=-mod=mod go mod download -json {module}",
        scratch.display()
    );
    let out = sh("sh", &["-c", &script]).await?;
    let info: Value = serde_json::from_str(&out).map_err(|source| Error::Json {
        context: format!("go mod download -json {module}"),
        source,
    })?;
    let sum = info["Sum"].as_str().unwrap_or_default();
    if sum != SUM {
        return fail(format!("{module} has go.sum {sum}, pinned {SUM}"));
    }
    let dir = PathBuf::from(info["Dir"].as_str().unwrap_or_default()).join("config/crd/standard");
    if !dir.is_dir() {
        return fail(format!("no config/crd/standard in {}", dir.display()));
    }
    Ok(dir)
}

/// Applies the standard channel and waits until the kinds h3-ingress reads are Established
/// and the HTTPRoute CRD names the pinned bundle.
pub async fn install_crds(client: &Client, scratch: &std::path::Path) -> Result<()> {
    let t0 = Instant::now();
    let dir = crd_dir(scratch).await?;
    let d = dir.to_string_lossy();
    // Environment plumbing: the release's YAML files as its README applies them.
    let out = output(
        "kubectl",
        &["apply", "--server-side", "--force-conflicts", "-f", &d],
    )
    .await?;
    if !out.success() {
        return fail(format!("kubectl apply {d}: {}", out.stderr.trim()));
    }
    let crds = Api::<CustomResourceDefinition>::all(client.clone());
    for kind in [
        "gateways",
        "httproutes",
        "referencegrants",
        "gatewayclasses",
    ] {
        let name = format!("{kind}.{GROUP}");
        until(30, &format!("crd/{name} Established"), || async {
            let c = crate::k8s::get(&crds, &name).await?;
            let conds = c
                .and_then(|c| c.status)
                .and_then(|s| s.conditions)
                .unwrap_or_default();
            Ok(conds
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True"))
        })
        .await?;
    }
    let route = crds.get(&format!("httproutes.{GROUP}")).await?;
    let ann = route.metadata.annotations.unwrap_or_default();
    let get = |k: &str| {
        ann.get(&format!("{GROUP}/{k}"))
            .cloned()
            .unwrap_or_default()
    };
    let bundle = format!("{} {}", get("bundle-version"), get("channel"));
    if bundle != format!("{VERSION} standard") {
        return fail(format!(
            "HTTPRoute CRD bundle '{bundle}', want '{VERSION} standard'"
        ));
    }
    let files = std::fs::read_dir(&dir).map(|d| d.count()).unwrap_or(0);
    ok(format!(
        "{files} files from {d} applied in {}s; gateways, httproutes, referencegrants Established (bundle {bundle})",
        t0.elapsed().as_secs()
    ));
    Ok(())
}
