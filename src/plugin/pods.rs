//! The per-host view of a listener: one ready data plane pod's `/hosts` (the Alt-Svc prober's
//! where it can), read through the API server's pod proxy (`pods/proxy`, as `kubectl get
//! --raw` would), so the plugin needs no route to the nodes' admin port and the listener's
//! status need not list every host.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kube::Client;

use super::{pick_node, Views};
use crate::api::{HostReport, Http3Listener};
use crate::operator::resources::label_selector;

/// A `/hosts` document larger than this is not one (10,000 hosts take about 3 MiB).
pub const MAX_HOSTS_BYTES: usize = 64 << 20;

/// `/hosts` of one ready pod of each listener; an error text where it cannot be read.
pub async fn host_views(client: &Client, listeners: &[Http3Listener]) -> Views {
    let mut out = BTreeMap::new();
    for l in listeners {
        let name = l.metadata.name.clone().unwrap_or_default();
        out.insert(name.clone(), view(client, l, &name).await);
    }
    out
}

/// The pod whose `/hosts` to read: the Alt-Svc prober the status names (only it knows each
/// host's Alt-Svc) while it is ready, else the first ready pod.
pub(super) fn view_pod(l: &Http3Listener, pods: &[Pod]) -> Option<(String, String, String)> {
    let prober = l.status.as_ref().and_then(|s| s.alt_svc_prober.as_deref());
    let named: Vec<Pod> = pods
        .iter()
        .filter(|p| prober.is_some() && p.metadata.name.as_deref() == prober)
        .cloned()
        .collect();
    pick_node(&named).or_else(|| pick_node(pods))
}

async fn view(client: &Client, l: &Http3Listener, name: &str) -> Result<Vec<HostReport>, String> {
    let pods = Api::<Pod>::all(client.clone())
        .list(&ListParams::default().labels(&label_selector(name)))
        .await
        .map_err(|e| format!("listing the data plane pods: {e}"))?
        .items;
    let (pod, _, _) = view_pod(l, &pods).ok_or("no ready data plane pod")?;
    let (ns, pod_name) = pod.split_once('/').unwrap_or(("", &pod));
    let port = l
        .spec
        .metrics
        .address
        .rsplit_once(':')
        .map(|(_, p)| p.to_string())
        .unwrap_or_default();
    let path = format!("/api/v1/namespaces/{ns}/pods/{pod_name}:{port}/proxy/hosts");
    let req = http::Request::get(&path)
        .body(Vec::new())
        .map_err(|e| e.to_string())?;
    let text = client
        .request_text(req)
        .await
        .map_err(|e| format!("GET {path}: {e}"))?;
    if text.len() > MAX_HOSTS_BYTES {
        return Err(format!(
            "GET {path}: {} bytes is not a host list",
            text.len()
        ));
    }
    serde_json::from_str(&text).map_err(|e| format!("{path}: not a host list: {e}"))
}
