//! The hand-off from the operator to the data plane: certificate mirrors.
//!
//! For every TLS Secret a listener serves at least one host with, the operator keeps one copy
//! of that Secret's certificate and key, with the hosts served from it, in the hosts namespace
//! (a namespace that holds nothing else), labelled with the listener's name. A data plane pod
//! then needs one watch (a label selector in one namespace) and read access to that namespace
//! only, whatever the number of hosts, Secrets and namespaces in the cluster; it never reads an
//! Ingress, a Gateway or a user's Secret. A rotated certificate or a new host moves one small
//! object, and a restarted pod loads everything with one paginated list.
//!
//! Both sides parse what the other writes, possibly from another version of this binary, so
//! unknown JSON fields are ignored and every field has a default. A change that an older data
//! plane would misread must use new data keys, never a new meaning for an old one.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::SecretRef;

/// Label on every mirror: the listener whose data plane reads it.
pub const LISTENER_LABEL: &str = "h3-ingress.dev/listener";
/// The Secret type of a mirror, so `kubectl get secrets` tells them apart from users' Secrets.
pub const SECRET_TYPE: &str = "h3-ingress.dev/host-certificate";
/// `namespace/name` of the Secret the mirror copies.
pub const SOURCE_ANNOTATION: &str = "h3-ingress.dev/source";
/// [`content_hash`] of the mirror's data: the operator rewrites a mirror only when it differs,
/// reading it from a metadata-only cache.
pub const CONTENT_ANNOTATION: &str = "h3-ingress.dev/content-sha256";
/// The certificate chain (PEM), as in the source Secret.
pub const CERT_KEY: &str = "tls.crt";
/// The private key (PEM), as in the source Secret.
pub const KEY_KEY: &str = "tls.key";
/// A [`HostsDocument`] (JSON): the hosts served with this certificate.
pub const HOSTS_KEY: &str = "hosts.json";
/// A [`PreviousLeaf`] (JSON): the leaf this mirror's certificate replaced and when, written
/// with a new certificate, so that a data plane started after the switch still accepts the
/// old leaf from the TCP ingress for `upstream.servedCertificateGraceSeconds` (a running one
/// remembers it anyway). History, not state: never part of [`content_hash`], so no mirror is
/// rewritten to add or drop it; older data planes do not read it.
pub const PREVIOUS_KEY: &str = "previous.json";

/// Kubernetes names are DNS subdomains of at most 253 characters; the listener part of a
/// mirror's name is cut so the hash always fits.
const MAX_NAME: usize = 253;
const NAME_HASH_HEX: usize = 16;

/// One host served with a mirror's certificate.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct MirroredHost {
    /// As served: lowercase, possibly `*.domain`.
    pub name: String,
    /// `host:port` of the proxy to forward this host's requests to, when it is not the
    /// listener's `upstream.address` (a Gateway run by its own proxy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream: Option<String>,
    /// Where the host comes from, as people read it (`Ingress shop/web`), for logs and `/hosts`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub source: String,
    // The host's own upstream timeouts, resolved from what its TCP side is given (an
    // Ingress's annotations, an HTTPRoute's timeouts), present only where they differ from
    // the listener's: a mirror of a host without its own policy keeps its bytes across an
    // upgrade, so its pods do not all reload at once. Ranges: `super::bounds`, as the
    // listener's fields of the same name.
    /// Replaces `upstream.responseTimeoutSeconds` for this host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_timeout_seconds: Option<u32>,
    /// Replaces `http.requestBodyIdleTimeoutSeconds` for this host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_body_idle_timeout_seconds: Option<u32>,
    /// Replaces `upstream.responseBodyIdleTimeoutSeconds` for this host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_body_idle_timeout_seconds: Option<u32>,
}

/// The `hosts.json` of a mirror.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct HostsDocument {
    #[serde(default)]
    pub hosts: Vec<MirroredHost>,
}

/// The `previous.json` of a mirror.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PreviousLeaf {
    /// The replaced leaf certificate, PEM.
    pub certificate: String,
    /// When the operator first read the certificate that replaced it (Unix seconds).
    pub replaced_at: i64,
}

fn hex_sha256(parts: &[&[u8]]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        // Length-prefixed, so two different splits of the same bytes hash differently.
        h.update((p.len() as u64).to_be_bytes());
        h.update(p);
    }
    hex::encode(h.finalize())
}

/// The mirror of `source` for `listener`: `<listener>-<16 hex of SHA-256(namespace/name)>`.
/// Stable, so the operator finds its mirrors again after a restart without listing them.
pub fn mirror_name(listener: &str, source: &SecretRef) -> String {
    let key = format!("{}/{}", source.namespace, source.name);
    let hash = &hex_sha256(&[key.as_bytes()])[..NAME_HASH_HEX];
    let room = MAX_NAME - NAME_HASH_HEX - 1;
    let mut prefix: &str = listener;
    if prefix.len() > room {
        prefix = &prefix[..room];
    }
    // A subdomain may not end in '.' or '-' before our '-'; listener names are subdomains, so
    // only a cut can leave one.
    let prefix = prefix.trim_end_matches(['.', '-']);
    format!("{prefix}-{hash}")
}

/// What [`CONTENT_ANNOTATION`] holds for this data.
pub fn content_hash(cert: &[u8], key: &[u8], hosts_json: &[u8]) -> String {
    hex_sha256(&[cert, key, hosts_json])
}

/// The identity of a set of mirrors as one side has them: a hash of every `(name,
/// resourceVersion)`, in name order. The operator compares the set it wrote with the set
/// each pod reports having applied; equal digests mean the pod serves exactly what the
/// operator resolved.
pub fn digest<'a>(mirrors: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let mut v: Vec<(&str, &str)> = mirrors.into_iter().collect();
    v.sort_unstable();
    let mut h = Sha256::new();
    for (name, rv) in v {
        h.update(name.as_bytes());
        h.update(b"\t");
        h.update(rv.as_bytes());
        h.update(b"\n");
    }
    hex::encode(&h.finalize()[..16])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(ns: &str, name: &str) -> SecretRef {
        SecretRef {
            namespace: ns.into(),
            name: name.into(),
        }
    }

    #[test]
    fn names_are_stable_distinct_and_valid() {
        let a = mirror_name("public", &r("shop", "web-tls"));
        assert_eq!(a, mirror_name("public", &r("shop", "web-tls")));
        assert!(
            a.starts_with("public-") && a.len() == "public-".len() + 16,
            "{a}"
        );
        assert_ne!(a, mirror_name("public", &r("shop", "web-tls2")));
        // `ns/name` keeps ("a-b", "c") and ("a", "b-c") apart.
        assert_ne!(
            mirror_name("l", &r("a-b", "c")),
            mirror_name("l", &r("a", "b-c"))
        );
        let long = "x".repeat(240) + "-y";
        let n = mirror_name(&long, &r("a", "b"));
        assert!(n.len() <= 253, "{}", n.len());
        assert!(!n[..n.len() - 17].ends_with('-'), "{n}");
    }

    #[test]
    fn digests_ignore_order_and_see_every_change() {
        let d = digest([("a", "1"), ("b", "2")]);
        assert_eq!(d, digest([("b", "2"), ("a", "1")]));
        assert_ne!(d, digest([("a", "1"), ("b", "3")]));
        assert_ne!(d, digest([("a", "1")]));
        assert_eq!(d.len(), 32);
        assert_ne!(
            content_hash(b"ab", b"c", b""),
            content_hash(b"a", b"bc", b"")
        );
    }

    #[test]
    fn documents_from_other_versions_parse() {
        let newer = r#"{"hosts":[{"name":"a.test","futureField":1}],"future":true}"#;
        let d: HostsDocument = serde_json::from_str(newer).unwrap();
        assert_eq!(d.hosts[0].name, "a.test");
        assert_eq!(d.hosts[0].upstream, None);
        let empty: HostsDocument = serde_json::from_str("{}").unwrap();
        assert!(empty.hosts.is_empty());
        let previous = r#"{"certificate":"PEM","replacedAt":7,"futureField":1}"#;
        let p: PreviousLeaf = serde_json::from_str(previous).unwrap();
        assert_eq!((p.certificate.as_str(), p.replaced_at), ("PEM", 7));
    }

    /// A host without timeouts of its own is written as before they existed, byte for byte.
    #[test]
    fn per_host_timeouts_are_written_only_when_present() {
        let plain = MirroredHost {
            name: "a.test".into(),
            ..Default::default()
        };
        let json = serde_json::to_string(&plain).unwrap();
        assert_eq!(json, r#"{"name":"a.test"}"#);
        let slow = MirroredHost {
            response_timeout_seconds: Some(600),
            ..plain
        };
        let json = serde_json::to_string(&slow).unwrap();
        assert_eq!(json, r#"{"name":"a.test","responseTimeoutSeconds":600}"#);
        let back: MirroredHost = serde_json::from_str(&json).unwrap();
        assert_eq!(back, slow);
    }
}
