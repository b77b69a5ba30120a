//! The operator's watches of Traefik's Middlewares and TLSOptions (`traefik.io/v1alpha1`),
//! which the per-host policy reads ([`crate::operator::hosts::traefik`]). Optional
//! ([`super::optional`]): without Traefik's CRDs the kinds count as empty and unreadable, so
//! a host naming a Middleware is held back unless its listener sends the PROXY header.
//!
//! Light: a cached object keeps its namespace, name and identity, and of its spec only the
//! fields the policy reads (`api::traefik`); labels, annotations and managed fields go. A
//! change is reported only when that spec changed, and says which names it answers to, so
//! only the listeners that looked one of them up reconcile ([`crate::operator::triggers`]).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use kube::api::Api;
use kube::runtime::reflector::Store;
use kube::{Client, Resource};
use tokio::task::JoinHandle;

use super::filter::hash_of;
use super::optional::{follow, Flags, Kind};
use crate::api::traefik::{Middleware, TLSOption};
use crate::operator::hosts::traefik::{
    middleware_ids, tls_option_ids, TraefikObjects, ALT_SVC_PREFIX,
};
use crate::operator::labels;

/// What changed: the names (as the policy's lookups record them) a changed object answers to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TraefikChange {
    Object {
        names: Vec<String>,
    },
    /// A kind was listed for the first time, found not served, or became unreadable.
    Synced,
}

fn ns_name<K: Resource>(o: &K) -> (String, String) {
    let m = o.meta();
    (
        m.namespace.clone().unwrap_or_default(),
        m.name.clone().unwrap_or_default(),
    )
}

/// A Middleware answers to its `ns/name` key (chains, HTTPRoute filters) and its ids.
pub fn middleware_change(m: &Middleware) -> TraefikChange {
    let (ns, name) = ns_name(m);
    let mut names = vec![format!("{ns}/{name}")];
    names.extend(middleware_ids(&ns, &name).map(|id| format!("id {id}")));
    TraefikChange::Object { names }
}

/// A TLSOption answers to its ids (`default` for the default one).
pub fn tls_option_change(t: &TLSOption) -> TraefikChange {
    let (ns, name) = ns_name(t);
    TraefikChange::Object {
        names: tls_option_ids(&ns, &name)
            .into_iter()
            .map(|id| format!("tls {id}"))
            .collect(),
    }
}

/// What the policy reads of a Middleware: its kept spec, and whether it is being deleted.
pub fn middleware_key(m: &Middleware) -> u64 {
    let mut spec = m.spec.clone();
    if !is_alt_svc_middleware(&m.metadata) {
        spec.headers = None;
    }
    hash_of(&(
        serde_json::to_string(&spec).unwrap_or_default(),
        m.metadata.deletion_timestamp.is_some(),
    ))
}

pub fn tls_option_key(t: &TLSOption) -> u64 {
    hash_of(&(
        serde_json::to_string(&t.spec).unwrap_or_default(),
        t.metadata.deletion_timestamp.is_some(),
    ))
}

/// Whether an object is one of the operator's own Alt-Svc Middlewares (its name and label).
pub fn is_alt_svc_middleware(m: &kube::api::ObjectMeta) -> bool {
    m.name
        .as_deref()
        .is_some_and(|n| n.starts_with(ALT_SVC_PREFIX))
        && (m.labels.as_ref())
            .and_then(|l| l.get(labels::MANAGED_BY))
            .map(String::as_str)
            == Some(labels::MANAGED_BY_VALUE)
}

/// [`strip`], and a Middleware's response headers unless it is the operator's own (only those
/// are read: the policy judges no header).
pub fn strip_middleware(m: &mut Middleware) {
    if !is_alt_svc_middleware(&m.metadata) {
        m.spec.headers = None;
    }
    strip(m);
}

/// Everything but the object's identity goes: the policy reads names and the kept spec. The
/// operator's own Alt-Svc Middlewares keep their listener label and owner (their Ingress), so
/// a listener's deletion can be told from the cache
/// (`operator::advertise::altsvc::orphans`).
pub fn strip<K: Resource>(o: &mut K) {
    let ours = is_alt_svc_middleware(o.meta());
    let m = o.meta_mut();
    m.managed_fields = None;
    m.annotations = None;
    m.finalizers = None;
    if ours {
        let keep = [
            labels::MANAGED_BY,
            labels::INSTANCE,
            labels::OPERATOR_NAMESPACE,
        ];
        if let Some(l) = m.labels.as_mut() {
            l.retain(|k, _| keep.contains(&k.as_str()));
        }
    } else {
        m.labels = None;
        m.owner_references = None;
    }
}

const ABSENT: &str = "hosts whose Ingress names a Traefik Middleware are held back unless \
                      their listener sends the PROXY header";

/// The two caches and their flags.
pub struct TraefikWatch {
    pub middlewares: Store<Middleware>,
    pub tls_options: Store<TLSOption>,
    flags: [Arc<Flags>; 2],
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for TraefikWatch {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl TraefikWatch {
    /// Starts both cluster-wide watches; `on_change` runs after every relevant change and once
    /// each kind is known.
    pub fn start(client: &Client, on_change: Arc<dyn Fn(TraefikChange) + Send + Sync>) -> Self {
        let flags: [Arc<Flags>; 2] = Default::default();
        let (middlewares, m) = follow(
            Api::<Middleware>::all(client.clone()),
            Kind {
                what: "Middleware",
                absent_means: ABSENT,
                key: middleware_key,
                describe: middleware_change,
                synced: TraefikChange::Synced,
                strip: strip_middleware,
            },
            flags[0].clone(),
            on_change.clone(),
        );
        let (tls_options, t) = follow(
            Api::<TLSOption>::all(client.clone()),
            Kind {
                what: "TLSOption",
                absent_means: "TLSOptions asking for client certificates are not seen",
                key: tls_option_key,
                describe: tls_option_change,
                synced: TraefikChange::Synced,
                strip: strip::<TLSOption>,
            },
            flags[1].clone(),
            on_change,
        );
        Self {
            middlewares,
            tls_options,
            flags,
            tasks: vec![m, t],
        }
    }

    /// Whether both kinds have been listed once or found not served.
    pub fn synced(&self) -> bool {
        self.flags.iter().all(|f| f.synced.load(Ordering::Acquire))
    }

    /// The objects seen so far; readable when the Middleware kind is (an unreadable TLSOption
    /// kind only hides client-certificate demands, which fail closed at the TCP ingress).
    pub fn objects(&self) -> TraefikObjects {
        TraefikObjects {
            middlewares: self.middlewares.state(),
            tls_options: self.tls_options.state(),
            readable: self.flags[0].readable.load(Ordering::Acquire),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn middleware(spec: serde_json::Value, labels: bool) -> Middleware {
        let mut v = serde_json::json!({
            "metadata": {"namespace": "my.shop", "name": "ip_guard", "uid": "u1",
                "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "x".repeat(2000)}},
            "spec": spec
        });
        if labels {
            v["metadata"]["labels"] = serde_json::json!({"team": "a"});
        }
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_cached_middleware_keeps_its_identity_and_the_spec_read() {
        let mut m = middleware(
            serde_json::json!({"ipAllowList": {"sourceRange": ["10.0.0.0/8"]},
            "headers": {"customRequestHeaders": {"a": "b".repeat(2000)}}}),
            true,
        );
        strip(&mut m);
        let kept = serde_json::to_string(&m).unwrap();
        assert!(kept.len() < 300, "{} bytes: {kept}", kept.len());
        assert_eq!(m.metadata.name.as_deref(), Some("ip_guard"));
        assert_eq!(
            middleware_change(&m),
            TraefikChange::Object {
                names: vec![
                    "my.shop/ip_guard".to_string(),
                    "id my-shop-ip-guard".to_string(),
                    "id my.shop_ip_guard".to_string()
                ]
            }
        );
    }

    #[test]
    fn only_the_spec_read_counts_as_a_change() {
        let a = middleware(
            serde_json::json!({"ipAllowList": {"sourceRange": ["10.0.0.0/8"]}}),
            false,
        );
        let relabelled = middleware(
            serde_json::json!({"ipAllowList": {"sourceRange": ["10.0.0.0/8"]},
            "headers": {"customRequestHeaders": {"a": "b"}}}),
            true,
        );
        assert_eq!(middleware_key(&a), middleware_key(&relabelled));
        let narrowed = middleware(
            serde_json::json!({"ipAllowList": {"sourceRange": ["10.1.0.0/16"]}}),
            false,
        );
        assert_ne!(middleware_key(&a), middleware_key(&narrowed));
    }
}
