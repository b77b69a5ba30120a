//! Withdrawing the Alt-Svc of listeners that are gone: a deleted listener is never reconciled
//! again, so the leader looks at its cache every [`PERIOD`] (no API call unless something is
//! left), and the uninstall hook withdraws everything its release made before the data planes
//! go.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::networking::v1::Ingress;
use kube::api::{Api, ListParams};
use kube::runtime::reflector::ObjectRef;
use kube::Client;
use tokio_util::sync::CancellationToken;

use super::apply::{apply, Writer};
use super::{orphans, Key, Plan};
use crate::api::traefik::Middleware;
use crate::operator::context::Context;
use crate::operator::hosts::ingress::ingress_key;
use crate::operator::labels;

/// How often the leader looks for Middlewares of deleted listeners: within the 5 s the
/// product promises for a withdrawal, plus Traefik's reload.
pub const PERIOD: Duration = Duration::from_secs(2);

fn by_key(ingresses: &[Arc<Ingress>]) -> BTreeMap<Key, &Ingress> {
    (ingresses.iter())
        .map(|i| (Key::of(&i.metadata), i.as_ref()))
        .collect()
}

async fn carry_out(client: &Client, operator_ns: &str, plans: BTreeMap<String, Plan>) -> usize {
    let mut calls = 0;
    for (listener, plan) in &plans {
        let by = Writer {
            listener,
            operator_ns,
        };
        calls += apply(client, by, plan).await.calls;
    }
    calls
}

/// One look at the caches; the API calls made.
pub async fn sweep(ctx: &Context) -> usize {
    if !*ctx.leader.borrow() || !ctx.caches_ready.load(Ordering::Acquire) || !ctx.traefik_synced() {
        return 0;
    }
    let traefik = ctx.traefik_objects();
    let ingresses = ctx.caches.ingresses.state();
    let listeners = &ctx.caches.listeners;
    let exists = |n: &str| listeners.get(&ObjectRef::new(n)).is_some();
    let index = by_key(&ingresses);
    let mws = traefik.middlewares.iter().map(|m| m.as_ref());
    let plans = orphans(mws, &index, &ctx.params.namespace, exists);
    if plans.is_empty() {
        return 0;
    }
    tracing::info!(listeners = ?plans.keys().collect::<Vec<_>>(), "withdrawing the Alt-Svc of deleted listeners");
    carry_out(&ctx.client, &ctx.params.namespace, plans).await
}

/// [`sweep`] every [`PERIOD`] until shutdown.
pub async fn run(ctx: Arc<Context>, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(PERIOD);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.cancelled() => return,
        }
        sweep(&ctx).await;
    }
}

/// The uninstall hook's part: every Alt-Svc Middleware of this installation withdrawn
/// (`clear`, the operator's own reference given up, deleted once no router names it). `Ok(0)`
/// without Traefik's kinds.
pub async fn withdraw_release(client: &Client, operator_ns: &str) -> Result<usize, kube::Error> {
    let selector = format!(
        "{}={},{}={operator_ns}",
        labels::MANAGED_BY,
        labels::MANAGED_BY_VALUE,
        labels::OPERATOR_NAMESPACE
    );
    let mut calls = 0;
    // Twice: the second pass deletes the Middlewares the first one's Ingresses let go of.
    for pass in 0..2 {
        if pass > 0 {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let made = withdraw_pass(client, operator_ns, &selector).await?;
        calls += made;
        if made == 0 {
            break;
        }
    }
    Ok(calls)
}

async fn withdraw_pass(
    client: &Client,
    operator_ns: &str,
    selector: &str,
) -> Result<usize, kube::Error> {
    let api: Api<Middleware> = Api::all(client.clone());
    let listed = match api.list(&ListParams::default().labels(selector)).await {
        Err(kube::Error::Api(e)) if e.code == 404 => return Ok(0),
        r => r?,
    };
    let mut ingresses = Vec::new();
    for m in &listed.items {
        let ns = m.metadata.namespace.clone().unwrap_or_default();
        let owners = m.metadata.owner_references.iter().flatten();
        for o in owners.filter(|o| o.kind == "Ingress") {
            let api: Api<Ingress> = Api::namespaced(client.clone(), &ns);
            if let Some(i) = api.get_opt(&o.name).await? {
                tracing::debug!(ingress = %ingress_key(&i), "withdrawing Alt-Svc");
                ingresses.push(Arc::new(i));
            }
        }
    }
    let index = by_key(&ingresses);
    let plans = orphans(listed.items.iter(), &index, operator_ns, |_| false);
    Ok(carry_out(client, operator_ns, plans).await)
}
