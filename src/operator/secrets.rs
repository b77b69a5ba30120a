//! The Secrets listeners serve hosts with, each read once per resourceVersion.
//!
//! One metadata-only watch of all Secrets (stripped to namespace, name and resourceVersion, so
//! key material in `last-applied-configuration` annotations is never held) tells which
//! referenced Secret exists and when it changed; a referenced Secret is fetched (GET) only when
//! its resourceVersion differs from the copy kept here. At steady state a reconcile makes no
//! Secret request at all, whatever the number of hosts; a restarted operator fetches each
//! referenced Secret once, a bounded number at a time. Certificate checks are cached per Secret
//! version and host, and whether the chain is publicly trusted per Secret version, so a
//! reconcile parses and verifies nothing it did before.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, OnceLock};

use futures_util::{future, stream, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PartialObjectMeta};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Client, ResourceExt};

use super::hosts::resolve::{
    host_error, missing_keys, secret_not_found, tls_pair, Certificates, Servable,
};
use crate::api::SecretRef;

/// Secret GETs in flight at once while a restarted operator (or a burst of new hosts) reads
/// the referenced Secrets.
pub const FETCH_CONCURRENCY: usize = 16;

/// A Secret's TLS pair as fetched, at one resourceVersion.
pub struct TlsPair {
    pub cert: Vec<u8>,
    pub key: Vec<u8>,
}

/// What is kept of one referenced Secret.
struct Kept {
    resource_version: String,
    /// `None` when the Secret has no `tls.crt`/`tls.key`.
    pair: Option<Arc<TlsPair>>,
    /// `notAfter` of the certificate per host it was checked for and passed.
    passed: Mutex<HashMap<String, i64>>,
    /// Whether the chain verifies against the public web roots, judged with the first host
    /// that passed: the chain's verdict does not depend on which of its names is asked (name
    /// constraints bind every name the leaf carries), and the names are checked per host.
    public_roots: OnceLock<bool>,
}

/// Why a referenced Secret could not be read (other than not existing).
#[derive(Debug, Clone)]
struct Unreadable(String);

/// The source Secrets: their metadata for everything, their content for referenced ones.
#[derive(Clone)]
pub struct SourceSecrets {
    meta: Store<PartialObjectMeta<Secret>>,
    kept: Arc<Mutex<HashMap<SecretRef, Arc<Kept>>>>,
    unreadable: Arc<Mutex<HashMap<SecretRef, Unreadable>>>,
}

/// Drops everything a Secret's metadata carries but its identity and version.
fn strip(s: &mut PartialObjectMeta<Secret>) {
    let m = &mut s.metadata;
    m.annotations = None;
    m.labels = None;
    m.managed_fields = None;
    m.owner_references = None;
    m.finalizers = None;
}

impl SourceSecrets {
    /// The metadata watch (its stream must be polled: it fills the store and yields a `()` for
    /// every Secret that changed, for the caller to decide whether it matters). It leaves out
    /// `hosts_namespace`, which holds the operator's own certificate mirrors (one per source
    /// Secret: as many again, each write of which would come back as an event) and is never
    /// a source.
    pub fn watch(
        client: &Client,
        hosts_namespace: &str,
    ) -> (
        Self,
        impl futures_util::Stream<Item = Result<PartialObjectMeta<Secret>, watcher::Error>>
            + Send
            + 'static,
    ) {
        let (meta, writer) = reflector::store();
        let events = watcher(
            Api::<PartialObjectMeta<Secret>>::all(client.clone()),
            watcher::Config::default()
                .any_semantic()
                .fields(&format!("metadata.namespace!={hosts_namespace}")),
        )
        .map_ok(|ev| ev.modify(strip))
        .default_backoff()
        .reflect(writer)
        .touched_objects();
        (Self::with_store(meta), events)
    }

    /// A cache over an existing metadata store (tests).
    pub fn with_store(meta: Store<PartialObjectMeta<Secret>>) -> Self {
        Self {
            meta,
            kept: Arc::default(),
            unreadable: Arc::default(),
        }
    }

    /// Whether the metadata watch listed once (never waits).
    pub fn listed(&self) -> bool {
        super::watches::listed(&self.meta)
    }

    fn current_version(&self, r: &SecretRef) -> Option<String> {
        let key = ObjectRef::new(&r.name).within(&r.namespace);
        self.meta.get(&key).and_then(|m| m.resource_version())
    }

    /// The referenced Secrets whose content is missing or older than the watch says.
    fn stale(&self, refs: &BTreeSet<SecretRef>) -> Vec<(SecretRef, String)> {
        let kept = self.kept.lock().expect("not poisoned");
        refs.iter()
            .filter_map(|r| {
                let rv = self.current_version(r)?;
                let fresh = kept.get(r).is_some_and(|k| k.resource_version == rv);
                (!fresh).then(|| (r.clone(), rv))
            })
            .collect()
    }

    /// Fetches what `refs` needs and forgets content no longer in `all_referenced` (every
    /// listener's Secrets). Returns how many Secrets it fetched.
    pub async fn refresh(
        &self,
        client: &Client,
        refs: &BTreeSet<SecretRef>,
        all_referenced: &BTreeSet<SecretRef>,
    ) -> usize {
        let stale = self.stale(refs);
        let fetched = stale.len();
        // Each Secret is kept as it arrives, so at most FETCH_CONCURRENCY whole Secrets (with
        // their managedFields and last-applied copies) are alive at once, not all of them:
        // a restarted operator at 10,000 hosts read 10,000 before keeping the first.
        stream::iter(stale.into_iter().map(|(r, _)| {
            let api = Api::<Secret>::namespaced(client.clone(), &r.namespace);
            async move {
                let got = api.get_opt(&r.name).await;
                (r, got)
            }
        }))
        .buffer_unordered(FETCH_CONCURRENCY)
        .for_each(|(r, got)| {
            self.store(r, got);
            future::ready(())
        })
        .await;
        self.kept
            .lock()
            .expect("not poisoned")
            .retain(|r, _| all_referenced.contains(r));
        self.unreadable
            .lock()
            .expect("not poisoned")
            .retain(|r, _| all_referenced.contains(r));
        fetched
    }

    fn store(&self, r: SecretRef, got: Result<Option<Secret>, kube::Error>) {
        let mut kept = self.kept.lock().expect("not poisoned");
        let mut unreadable = self.unreadable.lock().expect("not poisoned");
        match got {
            Ok(Some(s)) => {
                unreadable.remove(&r);
                let pair = tls_pair(&s).map(|(c, k)| {
                    Arc::new(TlsPair {
                        cert: c.to_vec(),
                        key: k.to_vec(),
                    })
                });
                let kept_one = Kept {
                    resource_version: s.resource_version().unwrap_or_default(),
                    pair,
                    passed: Mutex::default(),
                    public_roots: OnceLock::new(),
                };
                kept.insert(r, Arc::new(kept_one));
            }
            Ok(None) => {
                kept.remove(&r);
            }
            Err(e) => {
                tracing::debug!(secret = %format!("{}/{}", r.namespace, r.name), error = %e, "cannot read Secret");
                kept.remove(&r);
                unreadable.insert(r, Unreadable(e.to_string()));
            }
        }
    }

    /// The TLS pair of a referenced Secret as last fetched.
    pub fn pair(&self, r: &SecretRef) -> Option<Arc<TlsPair>> {
        let kept = self.kept.lock().expect("not poisoned");
        kept.get(r).and_then(|k| k.pair.clone())
    }

    /// How many Secrets' contents are kept (a bound the scale test reads).
    pub fn kept_count(&self) -> usize {
        self.kept.lock().expect("not poisoned").len()
    }
}

impl Certificates for SourceSecrets {
    fn check(
        &self,
        sref: &SecretRef,
        host: &str,
        now_unix: i64,
    ) -> Result<Servable, (&'static str, String)> {
        if self.current_version(sref).is_none() {
            return Err(secret_not_found(sref));
        }
        let kept = self.kept.lock().expect("not poisoned").get(sref).cloned();
        let Some(kept) = kept else {
            let unreadable = self.unreadable.lock().expect("not poisoned");
            return Err(match unreadable.get(sref) {
                Some(Unreadable(why)) => (
                    crate::api::reasons::SECRET_NOT_FOUND,
                    format!(
                        "Secret {}/{} cannot be read: {why}",
                        sref.namespace, sref.name
                    ),
                ),
                None => secret_not_found(sref),
            });
        };
        let Some(pair) = &kept.pair else {
            return Err(missing_keys(sref));
        };
        let servable = || Servable {
            public_roots: *kept
                .public_roots
                .get_or_init(|| super::hosts::roots::publicly_trusted(&pair.cert, host, now_unix)),
        };
        if let Some(not_after) = kept.passed.lock().expect("not poisoned").get(host) {
            if now_unix <= *not_after {
                return Ok(servable());
            }
        }
        // Not checked yet, or expired since: parse, with the code the data plane loads with.
        match crate::config::HostEntry::from_pem(host, &pair.cert, &pair.key, now_unix) {
            Ok(e) => {
                let mut passed = kept.passed.lock().expect("not poisoned");
                passed.insert(host.to_string(), e.not_after);
                drop(passed);
                Ok(servable())
            }
            Err(e) => Err(host_error(sref, e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::reasons;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use kube::core::PartialObjectMetaExt;

    fn sref(name: &str) -> SecretRef {
        SecretRef {
            namespace: "shop".into(),
            name: name.into(),
        }
    }

    fn secret(name: &str, rv: &str, hosts: &[&str]) -> Secret {
        let (_, mut s) = crate::operator::hosts::fixtures::tls_secret("shop", name, hosts);
        s.metadata.resource_version = Some(rv.into());
        s
    }

    #[test]
    fn checks_are_cached_per_version_and_host_and_missing_ones_are_reported() {
        let (store, mut w) = reflector::store::<PartialObjectMeta<Secret>>();
        let s = SourceSecrets::with_store(store);
        for (name, rv) in [("a", "1"), ("b", "1")] {
            let mut m: PartialObjectMeta<Secret> = ObjectMeta {
                namespace: Some("shop".into()),
                name: Some(name.into()),
                resource_version: Some(rv.into()),
                ..Default::default()
            }
            .into_request_partial();
            strip(&mut m);
            w.apply_watcher_event(&watcher::Event::Apply(m));
        }
        let now = crate::config::file::unix_now();
        assert_eq!(
            s.check(&sref("a"), "a.test", now).unwrap_err().0,
            reasons::SECRET_NOT_FOUND
        );
        s.store(sref("a"), Ok(Some(secret("a", "1", &["a.test"]))));
        // A self-signed test certificate: servable, but not from a public web root, judged
        // once for the Secret version and kept.
        assert_eq!(
            s.check(&sref("a"), "a.test", now),
            Ok(Servable {
                public_roots: false
            })
        );
        assert_eq!(
            s.kept.lock().unwrap()[&sref("a")].public_roots.get(),
            Some(&false)
        );
        assert_eq!(
            s.kept.lock().unwrap()[&sref("a")]
                .passed
                .lock()
                .unwrap()
                .len(),
            1
        );
        let wrong = s.check(&sref("a"), "b.test", now).unwrap_err();
        assert_eq!(
            wrong.0,
            reasons::CERTIFICATE_DOES_NOT_MATCH_HOST,
            "{wrong:?}"
        );
        // Past the cached notAfter: parsed again, and refused as expired.
        let after = s.kept.lock().unwrap()[&sref("a")].passed.lock().unwrap()["a.test"] + 1;
        assert_eq!(
            s.check(&sref("a"), "a.test", after).unwrap_err().0,
            reasons::CERTIFICATE_INVALID
        );
        let mut no_keys = secret("b", "1", &["b.test"]);
        no_keys.data = None;
        s.store(sref("b"), Ok(Some(no_keys)));
        assert_eq!(
            s.check(&sref("b"), "b.test", now).unwrap_err().0,
            reasons::CERTIFICATE_INVALID
        );
        s.store(sref("a"), Ok(None));
        assert!(s.pair(&sref("a")).is_none());
    }
}
