//! What a failed run prints after its verdict, on stderr: every pod, the listeners with their
//! conditions, the last events, and the last lines of each container log of the pods in the
//! operator's namespace (through the API server, as `kubectl logs`).

use h3_ingress::api::Http3Listener;
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{ListParams, LogParams};
use kube::{Api, Client, ResourceExt};

/// Prints the report; never fails (the run's verdict is made already).
pub async fn failure_report(client: &Client, namespace: &str) {
    eprintln!("--- pods:");
    if let Ok(pods) = Api::<Pod>::all(client.clone())
        .list(&ListParams::default())
        .await
    {
        for p in &pods.items {
            let st = p.status.clone().unwrap_or_default();
            let restarts: i32 = st
                .container_statuses
                .iter()
                .flatten()
                .map(|c| c.restart_count)
                .sum();
            eprintln!(
                "{:<20} {:<52} {:<10} restarts {:<3} {:<16} {}",
                p.namespace().unwrap_or_default(),
                p.name_any(),
                st.phase.unwrap_or_default(),
                restarts,
                st.pod_ip.unwrap_or_default(),
                p.spec
                    .as_ref()
                    .and_then(|s| s.node_name.clone())
                    .unwrap_or_default()
            );
        }
    }
    eprintln!("--- listeners:");
    if let Ok(ls) = Api::<Http3Listener>::all(client.clone())
        .list(&ListParams::default())
        .await
    {
        for l in &ls.items {
            let conds = l.status.iter().flat_map(|s| &s.conditions);
            let conds: Vec<String> = conds
                .map(|c| format!("{}={} {}: {}", c.type_, c.status, c.reason, c.message))
                .collect();
            eprintln!("{}: {}", l.name_any(), conds.join("; "));
        }
    }
    eprintln!("--- events (last 15):");
    if let Ok(ev) = Api::<Event>::all(client.clone())
        .list(&ListParams::default())
        .await
    {
        let mut ev = ev.items;
        ev.sort_by_key(|e| e.last_timestamp.clone().map(|t| t.0));
        for e in ev.iter().rev().take(15).rev() {
            let o = &e.involved_object;
            let object = format!(
                "{}/{}",
                o.kind.as_deref().unwrap_or(""),
                o.name.as_deref().unwrap_or("")
            );
            eprintln!("{object}: {}", crate::k8s::event_line(e));
        }
    }
    container_logs(client, namespace).await;
}

async fn container_logs(client: &Client, namespace: &str) {
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let Ok(pods) = api.list(&ListParams::default()).await else {
        return;
    };
    for p in &pods.items {
        let containers = p
            .spec
            .iter()
            .flat_map(|s| &s.containers)
            .map(|c| c.name.clone());
        for c in containers.collect::<Vec<_>>() {
            let lp = LogParams {
                container: Some(c.clone()),
                tail_lines: Some(15),
                ..Default::default()
            };
            if let Ok(text) = api.logs(&p.name_any(), &lp).await {
                eprintln!("--- {namespace}/{}/{c} (last 15 lines):", p.name_any());
                eprint!("{text}");
            }
        }
    }
}
