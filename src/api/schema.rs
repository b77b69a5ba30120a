//! Which schema a CRD carries, so an operator can tell whether the CRD the API server serves is
//! the one its binary was built with, an older one or a newer one.
//!
//! The generated CRD carries two annotations: [`annotations::SCHEMA_REVISION`], a number that
//! grows by one with every change of the schema, and [`annotations::SCHEMA_HASH`], a hash of
//! the generated CRD's `spec`. Revisions order CRDs (the API server may rewrite a spec, so a
//! hash of the served object would not match ours even when nothing changed); the hash names
//! the exact schema and is what the test below holds the revision to.
//!
//! **Bumping the revision**: when a change to the types changes the CRD, the unit test
//! `schema_revision_matches_the_generated_crd` fails and prints the new hash. Append it to
//! [`SCHEMA_HASHES`] (never edit an entry): the revision is the number of entries.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// `metadata.name` of the Http3Listener CRD.
pub const CRD_NAME: &str = "http3listeners.h3-ingress.dev";
/// The version whose schema listeners are read with.
pub const VERSION: &str = "v1alpha1";

/// Annotations on the CRD.
pub mod annotations {
    /// The schema revision, a decimal number; absent on CRDs from before revisions existed
    /// (read as revision 0).
    pub const SCHEMA_REVISION: &str = "h3-ingress.dev/schema-revision";
    /// [`super::spec_hash`] of the CRD's spec as generated.
    pub const SCHEMA_HASH: &str = "h3-ingress.dev/schema-hash";
}

/// The hash of every schema the CRD has had, oldest first; revision N is entry N-1. Append
/// only (see the module's doc).
pub const SCHEMA_HASHES: &[&str] = &[
    // 1: the first annotated schema (upstream.servedCertificateGraceSeconds added).
    "sha256:a9bf0b7db8c4974c",
    // 2: the bounded status (hostCounts, hostsOmitted; requests gone) and gatewayUpstreams.
    "sha256:784afc34a6842977",
    // 3: rollout.maxSurge (maxUnavailable defaults to 0; CEL refuses both at 0).
    "sha256:04b3cadde5623ff1",
    // 4: metrics.hostLabel.
    "sha256:ace7e773dce49f47",
    // 5: upstream.clientAddress (via, proxyProtocolAddress, trusted, clientForwardedFor) and
    // accessLog.enabled.
    "sha256:ead722d1432b3ec7",
    // 6: controllerName (which operator runs the listener), and its printer column.
    "sha256:25c20e19158e372a",
    // 7: advertise.dns (server, zones, tsigKeyName, tsigSecretRef, algorithm, ttlSeconds) and
    // status.advertise.dns.
    "sha256:3133b5ad2a2977eb",
    // 8: altSvc.probePath and status.altSvcProber (one Alt-Svc prober per listener).
    "sha256:ccbcd59bab4c091c",
    // 9: advertise.altSvc and status.advertise.altSvc (managed Alt-Svc on Traefik); what
    // transport.idleTimeoutSeconds closes (the proxy's own idle timer).
    "sha256:c2735429bcd1aecc",
];

/// This binary's schema revision.
pub const SCHEMA_REVISION: u32 = SCHEMA_HASHES.len() as u32;

/// What a CRD says about its schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// 0 when the annotation is missing; `None` when it is not a number.
    pub revision: Option<u32>,
    pub hash: Option<String>,
}

/// `sha256:` and the first 16 hex digits of the SHA-256 of `spec` in canonical JSON (object
/// keys sorted at every level, no whitespace), so the same schema hashes the same whatever the
/// map order of the JSON library.
pub fn spec_hash(spec: &Value) -> String {
    let mut text = String::new();
    canonical(spec, &mut text);
    let digest = Sha256::digest(text.as_bytes());
    format!("sha256:{}", &hex::encode(digest)[..16])
}

fn canonical(v: &Value, out: &mut String) {
    match v {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String((*k).clone()).to_string());
                out.push(':');
                canonical(&map[*k], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical(item, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// The schema identity a CRD's annotations carry.
pub fn identity_of(crd: &CustomResourceDefinition) -> Identity {
    let annotations = crd.metadata.annotations.as_ref();
    let get = |key: &str| annotations.and_then(|a| a.get(key)).cloned();
    Identity {
        revision: match get(annotations::SCHEMA_REVISION) {
            None => Some(0),
            Some(r) => r.trim().parse().ok(),
        },
        hash: get(annotations::SCHEMA_HASH),
    }
}

/// The OpenAPI schema of [`VERSION`] in a CRD, as JSON.
pub fn schema_of(crd: &CustomResourceDefinition) -> Option<Value> {
    let version = crd.spec.versions.iter().find(|v| v.name == VERSION)?;
    let schema = version.schema.as_ref()?.open_api_v3_schema.as_ref()?;
    serde_json::to_value(schema).ok()
}

/// Paths of the fields `ours` has and `theirs` lacks (`spec.upstream.x`, `spec.hosts[].y`,
/// `spec.nodeSelector.*`), topmost only: what the API server serving `theirs` would drop from
/// an object written with `ours`. Nothing below a `x-kubernetes-preserve-unknown-fields` of
/// theirs, which keeps whatever it is given.
pub fn missing_fields(ours: &Value, theirs: &Value) -> Vec<String> {
    let mut out = Vec::new();
    missing_under(ours, theirs, "", &mut out);
    out
}

fn missing_under(ours: &Value, theirs: &Value, path: &str, out: &mut Vec<String>) {
    if theirs.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true)) {
        return;
    }
    let join = |key: &str| {
        if path.is_empty() {
            key.to_string()
        } else {
            format!("{path}.{key}")
        }
    };
    if let Some(props) = ours.get("properties").and_then(Value::as_object) {
        let mut keys: Vec<&String> = props.keys().collect();
        keys.sort();
        for key in keys {
            match theirs.get("properties").and_then(|p| p.get(key.as_str())) {
                None => out.push(join(key)),
                Some(t) => missing_under(&props[key.as_str()], t, &join(key), out),
            }
        }
    }
    if let Some(items) = ours.get("items") {
        let theirs_items = theirs.get("items").unwrap_or(&Value::Null);
        missing_under(items, theirs_items, &format!("{path}[]"), out);
    }
    if let Some(values) = ours.get("additionalProperties").filter(|v| v.is_object()) {
        match theirs.get("additionalProperties") {
            Some(t) if t.is_object() => missing_under(values, t, &join("*"), out),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn hash_ignores_key_order_and_sees_every_value() {
        let a = json!({"b": [1, {"y": "2", "x": true}], "a": null});
        let b: Value = serde_json::from_str(r#"{"a":null,"b":[1,{"x":true,"y":"2"}]}"#).unwrap();
        assert_eq!(spec_hash(&a), spec_hash(&b));
        assert!(spec_hash(&a).starts_with("sha256:") && spec_hash(&a).len() == 23);
        let c = json!({"b": [1, {"y": "3", "x": true}], "a": null});
        assert_ne!(spec_hash(&a), spec_hash(&c));
        let d = json!({"b": [{"y": "2", "x": true}, 1], "a": null});
        assert_ne!(spec_hash(&a), spec_hash(&d), "list order counts");
    }

    #[test]
    fn missing_fields_are_the_topmost_ones_ours_has_and_theirs_lacks() {
        let obj = |props: Value| json!({"type": "object", "properties": props});
        let ours = obj(json!({
            "spec": obj(json!({
                "port": {"type": "integer"},
                "upstream": obj(json!({"address": {}, "newSetting": {}})),
                "service": obj(json!({"a": {}, "b": {}})),
                "hosts": {"type": "array", "items": obj(json!({"name": {}, "extra": {}}))},
                "nodeSelector": {"type": "object", "additionalProperties": obj(json!({"k": {}}))},
                "loose": obj(json!({"x": {}})),
            })),
        }));
        let theirs = obj(json!({
            "spec": obj(json!({
                "port": {"type": "integer"},
                "upstream": obj(json!({"address": {}})),
                "hosts": {"type": "array", "items": obj(json!({"name": {}}))},
                "nodeSelector": {"type": "object", "additionalProperties": {"type": "object"}},
                "loose": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                "onlyTheirs": {},
            })),
        }));
        assert_eq!(
            missing_fields(&ours, &theirs),
            [
                "spec.hosts[].extra",
                "spec.nodeSelector.*.k",
                "spec.service",
                "spec.upstream.newSetting"
            ]
        );
        assert_eq!(
            missing_fields(&theirs, &ours),
            ["spec.onlyTheirs"],
            "the other way round: what ours would drop"
        );
        assert!(missing_fields(&ours, &ours).is_empty());
    }
}
