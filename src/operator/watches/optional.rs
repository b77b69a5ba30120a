//! Watches of kinds a cluster may not have (the Gateway API's, Traefik's): on a cluster without
//! their CRDs, or where RBAC does not let the operator read them, a kind counts as empty and
//! this is logged once (and once more when it becomes readable). The watches keep retrying
//! with kube's backoff (at most 30 s apart), so CRDs installed later are picked up without a
//! restart.
//!
//! kube's backoff starts over after every successful item, and a watcher announces each new
//! list attempt with an `Init` event before the list fails, so on a 404 the default backoff
//! would retry about once a second forever. These watches keep `Init` away from the backoff,
//! so it grows to its 30 s ceiling.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use futures_util::StreamExt;
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Resource;
use serde::de::DeserializeOwned;
use tokio::task::JoinHandle;
use tracing::info;

use super::filter::ChangeFilter;

/// Whether a watch error means the kind is not served to us at all: no CRD (404) or no RBAC
/// grant (403). Anything else is a passing API server problem.
pub fn is_unavailable(e: &watcher::Error) -> bool {
    let status = match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s)) => s.as_ref(),
        watcher::Error::WatchError(s) => s.as_ref(),
        _ => return false,
    };
    matches!(status.code, 403 | 404) || status.is_not_found() || status.is_forbidden()
}

/// One optional kind: how its changes are compared and described, what a cached object
/// keeps, and what its absence means (said once in the log).
pub struct Kind<K, C> {
    /// The kind's name in logs (`HTTPRoute`).
    pub what: &'static str,
    /// What its absence means, for the log line.
    pub absent_means: &'static str,
    /// A hash of what the consumer reads: a change of anything else is not reported.
    pub key: fn(&K) -> u64,
    pub describe: fn(&K) -> C,
    /// Reported once the kind is listed, or found not served.
    pub synced: C,
    /// Drops what nothing reads from a cached object.
    pub strip: fn(&mut K),
}

/// Whether a kind was listed or found not served (`synced`), and whether it is readable.
#[derive(Default)]
pub struct Flags {
    pub synced: AtomicBool,
    pub readable: AtomicBool,
}

/// A reflector for one kind whose changes (per `kind.key`) call `on_change` with what
/// `kind.describe` says of the object; a kind that is not served counts as synced, unreadable
/// and empty.
pub fn follow<K, C>(
    api: Api<K>,
    kind: Kind<K, C>,
    flags: Arc<Flags>,
    on_change: Arc<dyn Fn(C) + Send + Sync>,
) -> (Store<K>, JoinHandle<()>)
where
    K: Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
    C: Clone + Send + Sync + 'static,
{
    let (store, writer) = reflector::store::<K>();
    let strip = kind.strip;
    let events = watcher(api, watcher::Config::default().any_semantic())
        .map(move |ev| ev.map(|e| e.modify(strip)));
    let stream = reflector::reflector(writer, events)
        .filter(|ev| futures_util::future::ready(!matches!(ev, Ok(watcher::Event::Init))))
        .backoff(watcher::DefaultBackoff::default());
    let task = tokio::spawn(async move {
        let mut stream = Box::pin(stream);
        let mut filter = ChangeFilter::new(kind.key);
        let mut unavailable = false;
        let log = super::filter::ErrorLog::default();
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(ev) => {
                    let done = matches!(ev, watcher::Event::InitDone);
                    if done && std::mem::take(&mut unavailable) {
                        info!(kind = kind.what, "optional kind is served now; reading it");
                    }
                    if let Some(o) = filter.accept(ev) {
                        on_change((kind.describe)(&o));
                    }
                    if done {
                        flags.readable.store(true, Ordering::Release);
                        flags.synced.store(true, Ordering::Release);
                        on_change(kind.synced.clone());
                    }
                }
                Err(e) if is_unavailable(&e) => {
                    if !unavailable {
                        info!(kind = kind.what, error = %e,
                            "kind not served (CRDs not installed, or no RBAC to read it): {}; \
                             retrying in the background", kind.absent_means);
                        unavailable = true;
                    }
                    let was_readable = flags.readable.swap(false, Ordering::AcqRel);
                    if !flags.synced.swap(true, Ordering::AcqRel) || was_readable {
                        on_change(kind.synced.clone());
                    }
                }
                Err(e) => log.warn(kind.what, &e),
            }
        }
    });
    (store, task)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;

    fn api(code: u16) -> kube::Error {
        kube::Error::Api(Box::new(Status {
            code,
            ..Default::default()
        }))
    }

    #[test]
    fn missing_crds_and_rbac_mean_unavailable_other_errors_do_not() {
        assert!(is_unavailable(&watcher::Error::InitialListFailed(api(404))));
        assert!(is_unavailable(&watcher::Error::InitialListFailed(api(403))));
        assert!(is_unavailable(&watcher::Error::WatchStartFailed(api(404))));
        assert!(!is_unavailable(&watcher::Error::InitialListFailed(api(
            500
        ))));
        assert!(!is_unavailable(&watcher::Error::WatchError(Box::new(
            Status {
                code: 410,
                ..Default::default()
            }
        ))));
        assert!(!is_unavailable(&watcher::Error::NoResourceVersion));
    }
}
