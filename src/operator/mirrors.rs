//! The certificate mirrors of a listener (`api::mirror`): which ones it needs ([`desired`],
//! pure), which of those differ from what the hosts namespace holds ([`plan`], pure, against a
//! metadata-only cache of the mirrors), and the writes and deletions that close the gap
//! ([`sync`]). An unchanged listener costs no API call; one rotated Secret costs one write.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use futures_util::{stream, StreamExt};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::ByteString;
use kube::api::{Api, DeleteParams, PartialObjectMeta, Patch, PatchParams};
use kube::{Resource, ResourceExt};

use super::apply::ApplyError;
use super::context::Context;
use super::hosts::resolve::secret_key;
use super::hosts::{ResolvedHosts, ServedHost};
use super::resources::{owner_reference, selector_labels, BuildError, Params};
use super::secrets::TlsPair;
use super::{labels, FIELD_MANAGER};
use crate::api::mirror::{
    content_hash, digest, mirror_name, HostsDocument, MirroredHost, PreviousLeaf, CERT_KEY,
    CONTENT_ANNOTATION, HOSTS_KEY, KEY_KEY, LISTENER_LABEL, PREVIOUS_KEY, SECRET_TYPE,
    SOURCE_ANNOTATION,
};
use crate::api::{Http3Listener, SecretRef};

/// Mirror writes in flight at once (a new listener at 10,000 hosts writes that many).
pub const WRITE_CONCURRENCY: usize = 16;

/// One mirror as the listener needs it.
#[derive(Clone)]
pub struct DesiredMirror {
    pub name: String,
    pub source: SecretRef,
    pub hosts_json: Vec<u8>,
    /// [`content_hash`] of the data.
    pub content: String,
    pub pair: Arc<TlsPair>,
    /// `previous.json`: the leaf the certificate replaced, when it did recently; written
    /// with the mirror but not part of its content hash (see [`PREVIOUS_KEY`]).
    pub previous: Option<Vec<u8>>,
}

/// The mirrors a listener's served hosts need: one per Secret, its hosts in serving order.
/// A Secret whose content is not at hand (`pairs` says `None`) gets no mirror: its hosts are
/// not served until it is read. `previous` is the leaf a Secret's certificate replaced.
pub fn desired(
    listener: &str,
    resolved: &ResolvedHosts,
    pairs: impl Fn(&SecretRef) -> Option<Arc<TlsPair>>,
    upstream: impl Fn(&ServedHost) -> Option<String>,
    previous: impl Fn(&SecretRef) -> Option<PreviousLeaf>,
) -> Vec<DesiredMirror> {
    resolved
        .by_secret()
        .into_iter()
        .filter_map(|(source, hosts)| {
            let pair = pairs(source)?;
            let doc = HostsDocument {
                hosts: hosts
                    .iter()
                    .map(|h| MirroredHost {
                        name: h.name.clone(),
                        upstream: upstream(h),
                        source: h.origin.text(),
                        response_timeout_seconds: h.timeouts.response,
                        request_body_idle_timeout_seconds: h.timeouts.request_body_idle,
                        response_body_idle_timeout_seconds: h.timeouts.response_body_idle,
                    })
                    .collect(),
            };
            let hosts_json = serde_json::to_vec(&doc).expect("hosts document serialises");
            Some(DesiredMirror {
                name: mirror_name(listener, source),
                source: source.clone(),
                content: content_hash(&pair.cert, &pair.key, &hosts_json),
                hosts_json,
                pair,
                previous: previous(source)
                    .map(|p| serde_json::to_vec(&p).expect("previous leaf serialises")),
            })
        })
        .collect()
}

/// A mirror in the hosts namespace, as the metadata cache has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Existing {
    pub name: String,
    pub content: Option<String>,
    pub resource_version: String,
}

/// What [`sync`] has to do: mirrors to write (missing or different) and to delete.
#[derive(Default)]
pub struct Plan {
    pub write: Vec<DesiredMirror>,
    pub delete: Vec<String>,
}

/// Compares the desired mirrors with the existing ones by content hash. Pure. A mirror in
/// `held` (of a Secret that could not be read since the operator started) is neither written
/// nor deleted: it holds the last good content, which the operator does not have.
pub fn plan(desired: &[DesiredMirror], existing: &[Existing], held: &BTreeSet<String>) -> Plan {
    let have: BTreeMap<&str, &Existing> = existing.iter().map(|e| (e.name.as_str(), e)).collect();
    let mut want: BTreeSet<&str> = desired.iter().map(|d| d.name.as_str()).collect();
    want.extend(held.iter().map(String::as_str));
    Plan {
        write: desired
            .iter()
            .filter(|d| {
                have.get(d.name.as_str())
                    .is_none_or(|e| e.content.as_deref() != Some(d.content.as_str()))
            })
            .cloned()
            .collect(),
        delete: existing
            .iter()
            .filter(|e| !want.contains(e.name.as_str()))
            .map(|e| e.name.clone())
            .collect(),
    }
}

/// The mirror Secret for `m`, owned by the listener (so deleting it removes its mirrors).
pub fn object(
    listener: &Http3Listener,
    params: &Params,
    m: &DesiredMirror,
) -> Result<Secret, BuildError> {
    let name = listener.name_any();
    let mut labels_: BTreeMap<String, String> = selector_labels(&name);
    labels_.insert(labels::MANAGED_BY.into(), labels::MANAGED_BY_VALUE.into());
    labels_.insert(LISTENER_LABEL.into(), name.clone());
    let annotations: BTreeMap<String, String> = [
        (SOURCE_ANNOTATION.to_string(), secret_key(&m.source)),
        (CONTENT_ANNOTATION.to_string(), m.content.clone()),
    ]
    .into_iter()
    .collect();
    let previous = m.previous.as_ref().map(|p| (PREVIOUS_KEY, p));
    let data: BTreeMap<String, ByteString> = [
        (CERT_KEY, &m.pair.cert),
        (KEY_KEY, &m.pair.key),
        (HOSTS_KEY, &m.hosts_json),
    ]
    .into_iter()
    .chain(previous)
    .map(|(k, v)| (k.to_string(), ByteString(v.clone())))
    .collect();
    Ok(Secret {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some(m.name.clone()),
            namespace: Some(params.hosts_namespace.clone()),
            labels: Some(labels_),
            annotations: Some(annotations),
            owner_references: Some(vec![owner_reference(listener)?]),
            ..Default::default()
        },
        type_: Some(SECRET_TYPE.into()),
        data: Some(data),
        ..Default::default()
    })
}

/// The cached mirrors of a listener.
pub fn existing(store: &[Arc<PartialObjectMeta<Secret>>], listener: &str) -> Vec<Existing> {
    store
        .iter()
        .filter(|m| m.labels().get(LISTENER_LABEL).map(String::as_str) == Some(listener))
        .filter(|m| m.metadata.deletion_timestamp.is_none())
        .map(|m| Existing {
            name: m.name_any(),
            content: m.annotations().get(CONTENT_ANNOTATION).cloned(),
            resource_version: m.resource_version().unwrap_or_default(),
        })
        .collect()
}

/// The mirrors a listener's pods should have applied, once [`sync`] wrote them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Synced {
    /// Every desired mirror's resourceVersion (those just written: the API server's answer).
    pub versions: BTreeMap<String, String>,
    /// `api::mirror::digest` of `versions`: what an up-to-date pod reports.
    pub digest: String,
    pub written: usize,
    pub deleted: usize,
}

fn failed(action: &'static str, ns: &str, name: &str, source: kube::Error) -> ApplyError {
    ApplyError {
        action,
        kind: Secret::kind(&()).into_owned(),
        object: format!("{ns}/{name}"),
        source,
    }
}

/// Writes the mirrors that differ and deletes the ones no longer wanted (`held` ones stay,
/// see [`plan`]), a bounded number at a time. The first failure is returned after every other
/// write was tried.
pub async fn sync(
    ctx: &Context,
    listener: &Http3Listener,
    desired: Vec<DesiredMirror>,
    held: &BTreeSet<String>,
) -> Result<Synced, ApplyError> {
    let name = listener.name_any();
    let ns = ctx.params.hosts_namespace.clone();
    let existing = existing(&ctx.caches.owned.mirrors.state(), &name);
    let mut versions: BTreeMap<String, String> = existing
        .iter()
        .map(|e| (e.name.clone(), e.resource_version.clone()))
        .collect();
    let Plan { write, delete } = plan(&desired, &existing, held);
    let api = Api::<Secret>::namespaced(ctx.client.clone(), &ns);
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let mut objects = Vec::with_capacity(write.len());
    for m in &write {
        let obj = object(listener, &ctx.params, m).map_err(|e| {
            let source = kube::Error::Service(Box::new(std::io::Error::other(e.to_string())));
            failed("applying", &ns, &m.name, source)
        })?;
        objects.push((m.name.clone(), obj));
    }
    let results: Vec<(String, Result<Secret, kube::Error>)> =
        stream::iter(objects.into_iter().map(|(n, obj)| {
            let (api, params) = (api.clone(), params.clone());
            async move {
                let r = api.patch(&n, &params, &Patch::Apply(&obj)).await;
                (n, r)
            }
        }))
        .buffer_unordered(WRITE_CONCURRENCY)
        .collect()
        .await;
    let mut first_error = None;
    let written = results.len();
    for (n, r) in results {
        match r {
            Ok(s) => {
                versions.insert(n, s.resource_version().unwrap_or_default());
            }
            Err(e) => {
                versions.remove(&n);
                first_error.get_or_insert(failed("applying", &ns, &n, e));
            }
        }
    }
    for n in &delete {
        versions.remove(n);
        match api.delete(n, &DeleteParams::background()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => {
                first_error.get_or_insert(failed("deleting", &ns, n, e));
            }
        }
    }
    if let Some(e) = first_error {
        return Err(e);
    }
    let mut want: BTreeSet<&str> = desired.iter().map(|d| d.name.as_str()).collect();
    want.extend(held.iter().map(String::as_str));
    versions.retain(|n, _| want.contains(n.as_str()));
    let digest = digest(versions.iter().map(|(n, v)| (n.as_str(), v.as_str())));
    Ok(Synced {
        versions,
        digest,
        written,
        deleted: delete.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sref(name: &str) -> SecretRef {
        SecretRef {
            namespace: "shop".into(),
            name: name.into(),
        }
    }

    fn served(host: &str, secret: &str) -> ServedHost {
        ServedHost {
            name: host.into(),
            secret: sref(secret),
            origin: crate::api::HostOrigin::ingress(format!("shop/{host}")),
            timeouts: Default::default(),
        }
    }

    fn pair(tag: &str) -> Arc<TlsPair> {
        Arc::new(TlsPair {
            cert: format!("cert {tag}").into_bytes(),
            key: format!("key {tag}").into_bytes(),
        })
    }

    #[test]
    fn one_mirror_per_secret_and_only_changes_are_written() {
        let resolved = ResolvedHosts {
            served: vec![
                served("a.test", "a"),
                served("b.test", "ab"),
                served("c.test", "ab"),
            ],
            reports: vec![],
        };
        let d = desired("public", &resolved, |_| Some(pair("1")), |_| None, |_| None);
        assert_eq!(d.len(), 2);
        let ab = d.iter().find(|m| m.source == sref("ab")).unwrap();
        let doc: HostsDocument = serde_json::from_slice(&ab.hosts_json).unwrap();
        let names: Vec<&str> = doc.hosts.iter().map(|h| h.name.as_str()).collect();
        assert_eq!(names, ["b.test", "c.test"]);

        // Nothing exists: everything is written.
        let none = BTreeSet::new();
        let p = plan(&d, &[], &none);
        assert_eq!((p.write.len(), p.delete.len()), (2, 0));
        // Everything exists as desired, plus a leftover: only the leftover goes.
        let mut existing: Vec<Existing> = d
            .iter()
            .map(|m| Existing {
                name: m.name.clone(),
                content: Some(m.content.clone()),
                resource_version: "7".into(),
            })
            .collect();
        existing.push(Existing {
            name: "public-old".into(),
            content: None,
            resource_version: "3".into(),
        });
        let p = plan(&d, &existing, &none);
        assert_eq!(p.write.len(), 0);
        assert_eq!(p.delete, ["public-old"]);
        // A rotated certificate changes one mirror only.
        let d2 = desired(
            "public",
            &resolved,
            |s| Some(pair(if s.name == "a" { "2" } else { "1" })),
            |_| None,
            |_| None,
        );
        let p = plan(&d2, &existing, &none);
        assert_eq!(p.write.len(), 1);
        assert_eq!(p.write[0].source, sref("a"));
        // A host's own timeouts change its mirror's content, and only its.
        let mut slow = resolved.clone();
        slow.served[0].timeouts.response = Some(600);
        let d4 = desired("public", &slow, |_| Some(pair("1")), |_| None, |_| None);
        let a4 = d4.iter().find(|m| m.source == sref("a")).unwrap();
        let doc: HostsDocument = serde_json::from_slice(&a4.hosts_json).unwrap();
        assert_eq!(doc.hosts[0].response_timeout_seconds, Some(600));
        assert_eq!(plan(&d4, &existing, &none).write.len(), 1);
        // A Secret not read yet gets no mirror.
        let d3 = desired(
            "public",
            &resolved,
            |s| (s.name == "a").then(|| pair("1")),
            |_| None,
            |_| None,
        );
        assert_eq!(d3.len(), 1);
        // ...and when it could not be read since the operator started, its mirror (the last
        // good content) stays: neither written nor deleted.
        let held: BTreeSet<String> = existing
            .iter()
            .filter(|e| e.name != d3[0].name)
            .map(|e| e.name.clone())
            .collect();
        let p = plan(&d3, &existing, &held);
        assert_eq!((p.write.len(), p.delete.len()), (0, 0));
        let p = plan(&d3, &existing, &none);
        assert_eq!(p.delete.len(), 2, "without the hold: deleted");
        // The leaf a renewal replaced goes along with the new certificate, outside the
        // content hash: a mirror is never rewritten for it, an unchanged one stays as it is.
        let previous = PreviousLeaf {
            certificate: "old leaf".into(),
            replaced_at: 7,
        };
        let with = desired(
            "public",
            &resolved,
            |s| Some(pair(if s.name == "a" { "2" } else { "1" })),
            |_| None,
            |s| (s.name == "a").then(|| previous.clone()),
        );
        let same: Vec<(&str, &str)> = with
            .iter()
            .zip(&d2)
            .map(|(a, b)| (a.content.as_str(), b.content.as_str()))
            .collect();
        assert!(same.iter().all(|(a, b)| a == b), "{same:?}");
        let p = plan(&with, &existing, &none);
        assert_eq!(p.write.len(), 1);
        let written = &p.write[0];
        let previous_json = written.previous.as_ref().unwrap();
        let back: PreviousLeaf = serde_json::from_slice(previous_json).unwrap();
        assert_eq!(back, previous);
        let untouched = with.iter().find(|m| m.source == sref("ab")).unwrap();
        assert!(untouched.previous.is_none());
    }
}
