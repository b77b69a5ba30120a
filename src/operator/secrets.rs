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
//!
//! A read that fails (an error or no answer within [`READ_TIMEOUT`], anything but a 404) keeps
//! the content last read: its hosts stay served with the last good certificate, and the
//! status says so ([`crate::api::reasons::SECRET_UNREADABLE`]),
//! until a read succeeds. Only a Secret that is gone (a 404, or absent from the metadata
//! watch) or whose certificate no longer passes (expired, not for the host) stops its hosts.
//! Dropping a host on an API server's hiccup would make every data plane stop answering it,
//! and browsers then mark HTTP/3 broken for that origin for minutes.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use futures_util::{future, stream, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PartialObjectMeta};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Client, ResourceExt};

use super::hosts::resolve::{
    host_error, missing_keys, secret_not_found, tls_pair, Certificates, Servable,
};
use super::hosts::roots::Roots;
use crate::api::mirror::PreviousLeaf;
use crate::api::{reasons, SecretRef};

/// How long a replaced leaf is remembered: the longest grace a data plane may give it.
const PREVIOUS_FOR_SECS: i64 = crate::api::bounds::SERVED_CERTIFICATE_GRACE_SECONDS.max as i64;

/// Secret GETs in flight at once while a restarted operator (or a burst of new hosts) reads
/// the referenced Secrets.
pub const FETCH_CONCURRENCY: usize = 16;
/// A Secret GET without an answer after this long counts as a failed read (the client's own
/// read timeout is minutes long, and one hung GET would hold the whole reconcile).
pub const READ_TIMEOUT: Duration = Duration::from_secs(10);
/// At most this many characters of a read error go into a host's message.
const MAX_ERROR_TEXT: usize = 200;

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
    public_roots: OnceLock<Roots>,
}

/// Why a referenced Secret could not be read (other than not existing).
#[derive(Debug, Clone)]
struct Unreadable(String);

/// What one [`SourceSecrets::refresh`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Refreshed {
    /// Secrets read (GET sent).
    pub read: usize,
    /// Of those, reads that failed (an error or a timeout; a 404 is not a failure).
    pub failed: usize,
}

/// A failed read in words: the API server's code, reason and message, or the transport's.
fn describe(e: &kube::Error) -> String {
    let text = match e {
        kube::Error::Api(s) => format!("{} {}: {}", s.code, s.reason, s.message),
        other => other.to_string(),
    };
    super::text::cut(&text, MAX_ERROR_TEXT)
}

/// The source Secrets: their metadata for everything, their content for referenced ones.
#[derive(Clone)]
pub struct SourceSecrets {
    meta: Store<PartialObjectMeta<Secret>>,
    kept: Arc<Mutex<HashMap<SecretRef, Arc<Kept>>>>,
    unreadable: Arc<Mutex<HashMap<SecretRef, Unreadable>>>,
    read_timeout: Duration,
    /// The leaf a Secret's certificate replaced, for the mirror written with the new one
    /// (`api::mirror::PREVIOUS_KEY`); for [`PREVIOUS_FOR_SECS`], so only recent renewals.
    previous: Arc<Mutex<HashMap<SecretRef, PreviousLeaf>>>,
}

/// The first certificate of a PEM chain: its DER (to compare) and its PEM block (to keep).
fn first_certificate(pem: &[u8]) -> Option<(Vec<u8>, String)> {
    use rustls::pki_types::pem::PemObject;
    let der = rustls::pki_types::CertificateDer::pem_slice_iter(pem)
        .next()?
        .ok()?;
    let text = std::str::from_utf8(pem).ok()?;
    let (begin, end) = ("-----BEGIN CERTIFICATE-----", "-----END CERTIFICATE-----");
    let from = text.find(begin)?;
    let to = from + text[from..].find(end)? + end.len();
    Some((der.to_vec(), format!("{}\n", &text[from..to])))
}

fn unix_now() -> i64 {
    crate::config::file::unix_now()
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
            read_timeout: READ_TIMEOUT,
            previous: Arc::default(),
        }
    }

    /// The same cache with another [`READ_TIMEOUT`] (tests).
    pub fn with_read_timeout(mut self, timeout: Duration) -> Self {
        self.read_timeout = timeout;
        self
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
    /// listener's Secrets). A Secret read before whose read fails now keeps its content.
    pub async fn refresh(
        &self,
        client: &Client,
        refs: &BTreeSet<SecretRef>,
        all_referenced: &BTreeSet<SecretRef>,
    ) -> Refreshed {
        let stale = self.stale(refs);
        let mut done = Refreshed {
            read: stale.len(),
            failed: 0,
        };
        let timeout = self.read_timeout;
        // Each Secret is kept as it arrives, so at most FETCH_CONCURRENCY whole Secrets (with
        // their managedFields and last-applied copies) are alive at once, not all of them:
        // a restarted operator at 10,000 hosts read 10,000 before keeping the first.
        stream::iter(stale.into_iter().map(|(r, _)| {
            let api = Api::<Secret>::namespaced(client.clone(), &r.namespace);
            async move {
                let got = match tokio::time::timeout(timeout, api.get_opt(&r.name)).await {
                    Ok(got) => got.map_err(|e| describe(&e)),
                    Err(_) => Err(format!("no answer within {} s", timeout.as_secs_f32())),
                };
                (r, got)
            }
        }))
        .buffer_unordered(FETCH_CONCURRENCY)
        .for_each(|(r, got)| {
            done.failed += usize::from(got.is_err());
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
        let now = unix_now();
        self.previous
            .lock()
            .expect("not poisoned")
            .retain(|r, p| all_referenced.contains(r) && now - p.replaced_at <= PREVIOUS_FOR_SECS);
        done
    }

    /// Notes the leaf `old` held when `new` replaces it with another one.
    fn note_replaced(&self, r: &SecretRef, old: Option<&TlsPair>, new: Option<&TlsPair>) {
        let (Some(old), Some(new)) = (old, new) else {
            return;
        };
        let (Some((was, certificate)), Some((is, _))) =
            (first_certificate(&old.cert), first_certificate(&new.cert))
        else {
            return;
        };
        if was != is {
            let leaf = PreviousLeaf {
                certificate,
                replaced_at: unix_now(),
            };
            self.previous
                .lock()
                .expect("not poisoned")
                .insert(r.clone(), leaf);
        }
    }

    /// The leaf a referenced Secret's certificate replaced in the last day, if it did.
    pub fn previous(&self, r: &SecretRef) -> Option<PreviousLeaf> {
        let previous = self.previous.lock().expect("not poisoned");
        let p = previous.get(r)?;
        (unix_now() - p.replaced_at <= PREVIOUS_FOR_SECS).then(|| p.clone())
    }

    /// Keeps what a read brought: new content, the end of a Secret that is gone (a 404), or
    /// why it could not be read, in which case the content read before stays.
    fn store(&self, r: SecretRef, got: Result<Option<Secret>, String>) {
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
                let old = kept.get(&r).and_then(|k| k.pair.clone());
                self.note_replaced(&r, old.as_deref(), pair.as_deref());
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
                unreadable.remove(&r);
            }
            Err(e) => {
                tracing::debug!(secret = %format!("{}/{}", r.namespace, r.name), error = %e, "cannot read Secret");
                unreadable.insert(r, Unreadable(e));
            }
        }
    }

    /// Whether the last read of `r` failed (its last good content, if any, is what serves).
    pub fn unreadable(&self, r: &SecretRef) -> bool {
        self.unreadable
            .lock()
            .expect("not poisoned")
            .contains_key(r)
    }

    /// Whether `r`'s last read failed and nothing was ever read from it (a restarted operator
    /// during an API server's trouble): its certificate mirror, if one exists, is the only
    /// copy of its last good content and must stay.
    pub fn never_read(&self, r: &SecretRef) -> bool {
        self.unreadable(r) && !self.kept.lock().expect("not poisoned").contains_key(r)
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
        let failed = self
            .unreadable
            .lock()
            .expect("not poisoned")
            .get(sref)
            .cloned();
        let read_failed = |why: &str| {
            format!(
                "reading Secret {}/{} failed: {why}",
                sref.namespace, sref.name
            )
        };
        let Some(kept) = kept else {
            return Err(match failed {
                Some(Unreadable(why)) => (
                    reasons::SECRET_UNREADABLE,
                    format!(
                        "{}; nothing was read from it since the operator started (a certificate \
                         mirror written before stays as it is)",
                        read_failed(&why)
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
                .get_or_init(|| super::hosts::roots::public_roots(&pair.cert, host, now_unix)),
            stale: failed.as_ref().map(|Unreadable(why)| {
                format!("serving the last good certificate: {}", read_failed(why))
            }),
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
                public_roots: Roots::Private,
                stale: None,
            })
        );
        assert_eq!(
            s.kept.lock().unwrap()[&sref("a")].public_roots.get(),
            Some(&Roots::Private)
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

    #[test]
    fn a_failed_read_keeps_the_last_good_pair_and_a_404_drops_it() {
        let (store, mut w) = reflector::store::<PartialObjectMeta<Secret>>();
        let s = SourceSecrets::with_store(store);
        for (name, rv) in [("a", "2"), ("new", "1")] {
            let m: PartialObjectMeta<Secret> = ObjectMeta {
                namespace: Some("shop".into()),
                name: Some(name.into()),
                resource_version: Some(rv.into()),
                ..Default::default()
            }
            .into_request_partial();
            w.apply_watcher_event(&watcher::Event::Apply(m));
        }
        let now = crate::config::file::unix_now();
        let good = secret("a", "1", &["a.test"]);
        s.store(sref("a"), Ok(Some(good.clone())));
        // Version 2 (a rotation) cannot be read: version 1 still serves, and says why.
        assert_eq!(s.stale(&[sref("a")].into_iter().collect()).len(), 1);
        s.store(sref("a"), Err("500 InternalError: etcd".into()));
        let served = s.check(&sref("a"), "a.test", now).unwrap();
        assert_eq!(
            served.stale.as_deref(),
            Some(
                "serving the last good certificate: reading Secret shop/a failed: \
                 500 InternalError: etcd"
            )
        );
        assert_eq!(
            s.pair(&sref("a")).unwrap().cert,
            good.data.as_ref().unwrap()["tls.crt"].0
        );
        assert!(s.unreadable(&sref("a")) && !s.never_read(&sref("a")));
        // Still stale: read again at the next reconcile.
        assert_eq!(s.stale(&[sref("a")].into_iter().collect()).len(), 1);
        // The last good certificate stops serving when it expires, like any other.
        let after = s.kept.lock().unwrap()[&sref("a")].passed.lock().unwrap()["a.test"] + 1;
        assert_eq!(
            s.check(&sref("a"), "a.test", after).unwrap_err().0,
            reasons::CERTIFICATE_INVALID
        );
        // Never read and unreadable: not served, and its mirror is to be held.
        s.store(sref("new"), Err("403 Forbidden: no".into()));
        let (reason, message) = s.check(&sref("new"), "new.test", now).unwrap_err();
        assert_eq!(reason, reasons::SECRET_UNREADABLE);
        assert!(
            message.starts_with("reading Secret shop/new failed: 403"),
            "{message}"
        );
        assert!(s.never_read(&sref("new")));
        // A read that works again clears the failure; a 404 drops the pair.
        s.store(sref("a"), Ok(Some(secret("a", "2", &["a.test"]))));
        assert_eq!(s.check(&sref("a"), "a.test", now).unwrap().stale, None);
        s.store(sref("a"), Err("timeout".into()));
        s.store(sref("a"), Ok(None));
        assert!(s.pair(&sref("a")).is_none() && !s.unreadable(&sref("a")));
        assert_eq!(
            s.check(&sref("a"), "a.test", now).unwrap_err().0,
            reasons::SECRET_NOT_FOUND
        );
    }

    /// A renewed certificate leaves the leaf it replaced, for the mirror written with it; the
    /// same certificate under a new resourceVersion does not.
    #[test]
    fn the_leaf_a_renewal_replaced_is_kept_for_the_mirror() {
        let (store, _w) = reflector::store::<PartialObjectMeta<Secret>>();
        let s = SourceSecrets::with_store(store);
        let first = secret("a", "1", &["a.test"]);
        let old_leaf = first_certificate(&first.data.as_ref().unwrap()["tls.crt"].0).unwrap();
        s.store(sref("a"), Ok(Some(first.clone())));
        assert_eq!(s.previous(&sref("a")), None, "nothing replaced yet");
        let mut relabelled = first;
        relabelled.metadata.resource_version = Some("2".into());
        s.store(sref("a"), Ok(Some(relabelled)));
        assert_eq!(s.previous(&sref("a")), None, "the same leaf");
        s.store(sref("a"), Ok(Some(secret("a", "3", &["a.test"]))));
        let p = s.previous(&sref("a")).expect("the replaced leaf");
        assert_eq!(p.certificate, old_leaf.1);
        assert!((unix_now() - p.replaced_at).abs() <= 5);
        use rustls::pki_types::pem::PemObject;
        let der = rustls::pki_types::CertificateDer::from_pem_slice(p.certificate.as_bytes());
        assert_eq!(der.unwrap().to_vec(), old_leaf.0);
    }
}
