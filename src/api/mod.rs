//! API types: the `Http3Listener` CRD, the settings it shares with the standalone file (and
//! the [`bounds`] of their numbers), the condition types, reasons and annotations users see,
//! the [`altsvc`] advice they are given, and which fields a parse did not know ([`unknown`]).
//! No I/O here.

mod advertise;
pub mod altsvc;
pub mod bounds;
pub mod gateway;
pub mod keys;
mod listener;
pub mod mirror;
mod origin;
mod report;
pub mod schema;
mod service;
mod settings;
pub mod traefik;
pub mod unknown;

pub use advertise::*;
pub use listener::*;
pub use origin::*;
pub use report::*;
pub use service::*;
pub use settings::*;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

/// The controller name of an operator started without `--controller-name`, and of a listener
/// without `spec.controllerName` (the CRD fills it in): one operator per cluster needs nothing
/// set. A second operator gets its own name, as a second ingress-nginx gets its own
/// `--controller-class`.
pub const DEFAULT_CONTROLLER_NAME: &str = "h3-ingress.dev/operator";
/// What a controller name looks like: a lower-case DNS name, `/`, a path (IngressClass and
/// GatewayClass controller names have this form). The CRD checks it; [`controller_name_error`]
/// is the same rule for the operator's flag.
pub const CONTROLLER_NAME_PATTERN: &str =
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/[A-Za-z0-9._~/-]+$";
/// Longest controller name (a DNS subdomain's length).
pub const MAX_CONTROLLER_NAME: usize = 253;

/// Why `name` is not a controller name ([`CONTROLLER_NAME_PATTERN`]), if it is not one.
pub fn controller_name_error(name: &str) -> Option<String> {
    let why = |m: &str| {
        Some(format!(
            "controller name {name:?} {m} (e.g. {DEFAULT_CONTROLLER_NAME})"
        ))
    };
    if name.len() < 3 || name.len() > MAX_CONTROLLER_NAME {
        return why(&format!("must have 3 to {MAX_CONTROLLER_NAME} characters"));
    }
    let Some((domain, path)) = name.split_once('/') else {
        return why("has no '/': it is a DNS name, '/', and a path");
    };
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if !domain.split('.').all(label_ok) {
        return why("does not start with a lower-case DNS name");
    }
    let path_ok = |b: u8| b.is_ascii_alphanumeric() || b"._~/-".contains(&b);
    if path.is_empty() || !path.bytes().all(path_ok) {
        return why("has a path that is empty or not letters, digits and ._~/-");
    }
    None
}

/// Annotations on an Ingress, an HTTPRoute or a Gateway that switch HTTP/3 on per host.
pub mod annotations {
    /// `"true"` turns HTTP/3 on for the Ingress's TLS hosts. Off by default.
    pub const ENABLED: &str = "h3-ingress.dev/enabled";
    /// Name of the `Http3Listener` to use instead of the one matching the ingress class.
    pub const LISTENER: &str = "h3-ingress.dev/listener";
    /// Comma-separated subset of the object's hosts to serve.
    pub const HOSTS: &str = "h3-ingress.dev/hosts";
    /// On an operator's Lease and on the chart's operator ClusterRole: the operator's
    /// controller name (operators find each other, and the chart a second release, by it).
    pub const CONTROLLER_NAME: &str = "h3-ingress.dev/controller-name";
}

/// Condition types on `Http3Listener.status.conditions` (no phase, per API conventions).
pub mod conditions {
    pub const READY: &str = "Ready";
    pub const SOCKETS_BOUND: &str = "SocketsBound";
    pub const BUFFERS_APPLIED: &str = "BuffersApplied";
    pub const DEGRADED: &str = "Degraded";
    /// Whether the CRD the API server serves reads every field this operator writes and reads
    /// (`api::schema`): False while an older CRD would drop some.
    pub const CRD_CURRENT: &str = "CRDCurrent";
    /// Whether every served host's certificate chains to a public web root: Chrome uses
    /// HTTP/3 only then (Firefox and Safari may with a private CA). A note: never part of
    /// Ready or Degraded.
    pub const PUBLIC_ROOTS: &str = "PublicRoots";
    /// Whether the TCP ingress gets each HTTP/3 client's address (`spec.upstream
    /// .clientAddress`): True when it comes in a PROXY header or in forwarded headers the
    /// ingress is declared to trust, False when the ingress sees the node's address. A note,
    /// never part of Ready or Degraded; its message counts the hosts held back for it.
    pub const CLIENT_ADDRESS: &str = "ClientAddress";
    /// Only with `spec.advertise.dns`: whether every served host's DNS HTTPS record is in its
    /// zone (and no record of a host no longer served is left). Never part of Ready or
    /// Degraded: serving does not depend on it.
    pub const DNS_ADVERTISED: &str = "DnsAdvertised";
}

/// Reasons for conditions and per-host states. CamelCase, stable: users alert on them.
pub mod reasons {
    // Ready
    pub const ALL_HOSTS_SERVING: &str = "AllHostsServing";
    /// Ready is True but some wanted hosts are not served (see `status.hosts`).
    pub const SOME_HOSTS_SERVING: &str = "SomeHostsServing";
    /// Hosts are wanted but none is served.
    pub const NO_HOSTS_SERVING: &str = "NoHostsServing";
    pub const NO_HOSTS: &str = "NoHosts";
    pub const PODS_NOT_READY: &str = "PodsNotReady";
    pub const INVALID_SPEC: &str = "InvalidSpec";
    /// Another listener that can run on the same nodes already uses one of this listener's
    /// host ports (its UDP port or its metrics port); this one's DaemonSet is not applied.
    pub const PORT_CONFLICT: &str = "PortConflict";
    /// The API server refused to apply an object for lack of permission (RBAC).
    pub const FORBIDDEN: &str = "Forbidden";
    /// An admission webhook or policy refused an object.
    pub const ADMISSION_DENIED: &str = "AdmissionDenied";
    /// Applying or pruning an object failed for another reason (the message has the API's).
    pub const APPLY_FAILED: &str = "ApplyFailed";
    /// The DaemonSet cannot create its pods (e.g. Pod Security on the namespace); the
    /// message is the DaemonSet's `FailedCreate` event.
    pub const PODS_NOT_CREATED: &str = "PodsNotCreated";
    /// No running operator has the listener's `spec.controllerName` (never installed, or
    /// uninstalled): nothing runs or updates its data plane. The message names the operators
    /// that do run and their controller names.
    pub const NO_CONTROLLER: &str = "NoController";
    /// Two running operators (in the namespaces the message names) have the listener's
    /// `spec.controllerName`: neither touches it until one gets another `--controller-name`.
    pub const CONTROLLER_CONFLICT: &str = "ControllerConflict";
    // SocketsBound
    pub const BOUND: &str = "Bound";
    pub const BIND_FAILED: &str = "BindFailed";
    pub const NO_REPORTS: &str = "NoReports";
    // BuffersApplied
    pub const APPLIED: &str = "Applied";
    pub const CLAMPED: &str = "Clamped";
    // Degraded
    pub const SOME_HOSTS_NOT_SERVING: &str = "SomeHostsNotServing";
    pub const UDP_DROPS: &str = "UdpDrops";
    pub const AS_EXPECTED: &str = "AsExpected";
    /// Pods still run socket settings the spec no longer has; the DaemonSet is rolling them.
    pub const ROLLOUT_PENDING: &str = "RolloutPending";
    /// A data plane container exited in the last ten minutes (the kubelet's reason, e.g.
    /// `OOMKilled`, is in the message).
    pub const CONTAINER_EXITED: &str = "ContainerExited";
    // CRDCurrent
    /// The served CRD has this operator's schema revision and hash.
    pub const CRD_MATCHES: &str = "CRDMatches";
    /// The served CRD is newer than this operator: fields it adds are read past (True).
    pub const CRD_NEWER: &str = "CRDNewer";
    /// The served CRD is older than this operator: the API server drops fields it lacks.
    pub const CRD_OUTDATED: &str = "CRDOutdated";
    /// The served CRD claims this operator's revision but its schema differs (edited by hand).
    pub const CRD_MODIFIED: &str = "CRDModified";
    /// The operator cannot read the CRD (RBAC), so it cannot tell.
    pub const CRD_UNREADABLE: &str = "CRDUnreadable";
    // PublicRoots
    /// Every served host's certificate chains to a public web root.
    pub const ALL_PUBLICLY_TRUSTED: &str = "AllPubliclyTrusted";
    /// Some served hosts' certificates do not (a private CA, self-signed): Chrome will not
    /// use HTTP/3 for them.
    pub const PRIVATE_ROOTS: &str = "PrivateRoots";
    /// No served host's certificate has been judged (none served yet).
    pub const NO_CERTIFICATES: &str = "NoCertificates";
    // ClientAddress
    /// In a PROXY protocol header: the TCP ingress sees the client as its peer.
    pub const PROXY_PROTOCOL: &str = "ProxyProtocol";
    /// In forwarded headers the TCP ingress is declared to trust (`clientAddress.trusted`).
    pub const TRUSTED_FORWARDED_HEADERS: &str = "TrustedForwardedHeaders";
    /// In forwarded headers nobody declared trusted: the TCP ingress sees the node.
    pub const UNTRUSTED_FORWARDED_HEADERS: &str = "UntrustedForwardedHeaders";
    // Degraded
    /// Served hosts whose TCP-side policy has a value h3-ingress could not carry (not
    /// readable, or beyond its bounds): the message names the annotation or field.
    pub const POLICY_VALUE_IGNORED: &str = "PolicyValueIgnored";
    /// No host is known to be private, but some Secrets hold the leaf without the
    /// intermediate that issued it: whether those chain to a public web root is unknown.
    pub const INCOMPLETE_CHAIN: &str = "IncompleteChain";
    // DnsAdvertised (also INVALID_SPEC: a field of spec.advertise.dns, named in the message)
    /// The zones hold exactly the served hosts' records (True).
    pub const PUBLISHED: &str = "Published";
    /// Not tried yet since the listener (or its `advertise.dns`) appeared (Unknown).
    pub const PUBLISH_PENDING: &str = "Pending";
    /// The server did not answer, or not within the timeout (False; retried with back-off).
    pub const SERVER_UNREACHABLE: &str = "ServerUnreachable";
    /// The server refused our TSIG signature or key, or its answer did not verify with it
    /// (False; the Secret is read again on each retry).
    pub const TSIG_REFUSED: &str = "TsigRefused";
    /// The server refused the update for another reason (REFUSED: no update ACL for the key,
    /// NOTZONE, SERVFAIL...) or answered something unreadable (False).
    pub const UPDATE_REFUSED: &str = "UpdateRefused";
    /// The TSIG Secret or its key is missing, or the key is not base64 (False).
    pub const TSIG_KEY_UNAVAILABLE: &str = "TsigKeyUnavailable";
    /// Some served hosts' zone holds a record the operator did not make: left alone (False).
    pub const RECORD_CONFLICT: &str = "Conflict";
    /// Some served hosts are in none of `advertise.dns.zones` (False).
    pub const OUTSIDE_ZONES: &str = "OutsideZones";
    /// `spec.advertise.dns` was removed: the records were withdrawn (False).
    pub const DISABLED: &str = "Disabled";
    // Per host
    pub const SERVING: &str = "Serving";
    pub const NO_TLS: &str = "NoTLS";
    pub const SECRET_NOT_FOUND: &str = "SecretNotFound";
    /// Reading the host's Secret failed (an error or a timeout, not a 404). With state
    /// `Serving` the host keeps the last good certificate read from it; with `NotServing`
    /// nothing was read from it yet. Also `Degraded`'s reason while hosts are served so.
    pub const SECRET_UNREADABLE: &str = "SecretUnreadable";
    pub const CERTIFICATE_INVALID: &str = "CertificateInvalid";
    pub const CERTIFICATE_DOES_NOT_MATCH_HOST: &str = "CertificateDoesNotMatchHost";
    pub const HOST_CONFLICT: &str = "HostConflict";
    /// Gateway API: the route's parent Gateway has not accepted it (`status.parents`), or no
    /// listener of the Gateway takes it (sectionName, port, allowedRoutes, hostname).
    pub const ROUTE_NOT_ACCEPTED: &str = "RouteNotAccepted";
    /// Gateway API: the Gateway listener is not `protocol: HTTPS` with `tls.mode: Terminate`,
    /// so there is no certificate h3-ingress could serve.
    pub const LISTENER_NOT_HTTPS: &str = "ListenerNotHTTPS";
    /// Gateway API: the listener's certificate is in another namespace and no ReferenceGrant
    /// there lets Gateways of the listener's namespace refer to it.
    pub const REF_NOT_PERMITTED: &str = "RefNotPermitted";
    /// The host can be served but no data plane pod reports serving it (yet).
    pub const CONFIG_PENDING: &str = "ConfigPending";
    /// A data plane pod cannot read a certificate mirror (`api::mirror`): a data key is
    /// missing, `hosts.json` does not parse, or a host's `upstream` is not `host:port`.
    pub const MIRROR_INVALID: &str = "MirrorInvalid";
    /// The host's TCP-side policy judges the client's address (an allowlist, a per-client
    /// limit) and the listener's `upstream.clientAddress` does not get that address to the
    /// TCP ingress in the form the policy reads: not served over HTTP/3, which would
    /// otherwise be judged by the node's address. The message names the annotation or
    /// Middleware and what to set.
    pub const CLIENT_ADDRESS_POLICY: &str = "ClientAddressPolicy";
    /// The TCP ingress asks for a client certificate for the host (ingress-nginx
    /// `auth-tls-*`, a Traefik TLSOption with `clientAuth`): h3-ingress cannot ask the
    /// browser for it and pass it on.
    pub const CLIENT_CERTIFICATE_REQUIRED: &str = "ClientCertificateRequired";
    /// The TCP ingress passes the host's TLS through to the backend (`ssl-passthrough`):
    /// there is no certificate h3-ingress could terminate it with.
    pub const TLS_PASSTHROUGH: &str = "TLSPassthrough";
}

/// Per-host states in `status.hosts[].state`.
pub mod host_states {
    pub const SERVING: &str = "Serving";
    pub const NOT_SERVING: &str = "NotServing";
}

/// The CRD as applied to clusters: what kube derives from the Rust types, plus the schema
/// identity ([`schema`]) as annotations. No type denies unknown fields, so the schema has no
/// `additionalProperties: false` (structural schemas forbid it next to `properties`); the API
/// server prunes what the schema does not name.
pub fn crd() -> CustomResourceDefinition {
    let mut crd = Http3Listener::crd();
    let hash = schema::spec_hash(&serde_json::to_value(&crd.spec).expect("CRD spec serialises"));
    crd.metadata.annotations = Some(
        [
            (
                schema::annotations::SCHEMA_REVISION.to_string(),
                schema::SCHEMA_REVISION.to_string(),
            ),
            (schema::annotations::SCHEMA_HASH.to_string(), hash),
        ]
        .into_iter()
        .collect(),
    );
    crd
}

/// `crd()` as YAML, exactly what `h3-ingress crd` prints and `crds/` holds.
pub fn crd_yaml() -> String {
    let body = serde_norway::to_string(&crd()).expect("CRD serialises to YAML");
    format!(
        "# Generated by `h3-ingress crd`; do not edit. A test fails when this file differs.\n{body}"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crd_has_names_scope_and_columns() {
        let crd = crd();
        assert_eq!(
            crd.metadata.name.as_deref(),
            Some("http3listeners.h3-ingress.dev")
        );
        assert_eq!(crd.spec.scope, "Cluster");
        assert_eq!(
            crd.spec.names.short_names.as_deref(),
            Some(&["h3l".to_string()][..])
        );
        let v = &crd.spec.versions[0];
        assert_eq!(v.name, "v1alpha1");
        assert!(v.subresources.as_ref().unwrap().status.is_some());
        let cols: Vec<_> = v
            .additional_printer_columns
            .as_ref()
            .unwrap()
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(
            cols,
            [
                "Port",
                "Hosts",
                "Pods",
                "Ready",
                "Reason",
                "Controller",
                "UDP-Drops",
                "Age"
            ]
        );
        let ready = &v.additional_printer_columns.as_ref().unwrap()[3];
        assert_eq!(
            ready.json_path,
            ".status.conditions[?(@.type==\"Ready\")].status"
        );
    }

    #[test]
    fn crd_schema_has_no_additional_properties_false_and_keeps_defaults() {
        let yaml = crd_yaml();
        assert!(!yaml.contains("additionalProperties: false"), "{yaml}");
        let json = serde_json::to_string(&crd()).unwrap();
        assert!(json.contains("\"default\":443"), "port default missing");
        assert!(
            json.contains("\"default\":4194304"),
            "buffer default missing"
        );
        let v = serde_json::to_value(crd()).unwrap();
        let transport = &v["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
            ["spec"]["properties"]["transport"];
        // The API server fills in the loss-tolerant controller when a listener names none, both
        // for an absent `transport` and for a `transport` without `congestionControl`.
        assert_eq!(transport["default"]["congestionControl"], "cubic-hs-lt");
        assert_eq!(
            transport["properties"]["congestionControl"]["default"],
            "cubic-hs-lt"
        );
    }

    #[test]
    fn crd_carries_cel_rules_for_dependent_fields() {
        let json = serde_json::to_value(crd()).unwrap();
        let spec = &json["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
            ["properties"];
        let rule = |field: &str| {
            spec[field]["x-kubernetes-validations"][0]["rule"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        };
        assert_eq!(
            rule("transport"),
            "self.connectionReceiveWindowBytes >= self.streamReceiveWindowBytes"
        );
        assert_eq!(
            rule("upstream"),
            "self.tls || self.verify == 'servedCertificate'"
        );
    }

    #[test]
    fn crd_schema_carries_every_bound_at_its_field() {
        let json = serde_json::to_value(crd()).unwrap();
        let spec = &json["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
        for b in bounds::ALL {
            let field = b
                .field
                .split('.')
                .fold(spec, |schema, name| &schema["properties"][name]);
            let limits = (field["minimum"].as_f64(), field["maximum"].as_f64());
            assert_eq!(
                limits,
                (Some(b.min as f64), Some(b.max as f64)),
                "{}: {field}",
                b.field
            );
        }
    }

    /// The Kubernetes direction of `api::unknown` (the file's strict one: `config::file`).
    #[test]
    fn listeners_from_a_newer_crd_are_read_and_their_unknown_fields_named() {
        let served = serde_json::json!({
            "apiVersion": "h3-ingress.dev/v1alpha1", "kind": "Http3Listener",
            "metadata": {"name": "public"},
            "spec": {
                "upstream": {"address": "10.0.0.1:443", "futureSetting": 7},
                "transport": {"initialWindowPackets": 10, "pacing": {"burst": 4}},
                "hosts": [{"name": "a.example.com",
                           "secretRef": {"namespace": "web", "name": "a-tls", "kind": "Secret"}}],
                "tolerations": [{"key": "k", "operator": "Exists", "newField": 1}],
                "futureTop": true
            },
            "status": {"hostsSummary": "1/1", "shards": 3}
        });
        let l: Http3Listener = serde_json::from_value(served.clone()).unwrap();
        assert_eq!(
            l.unknown_fields(),
            [
                "spec.futureTop",
                "spec.hosts[0].secretRef.kind",
                "spec.tolerations[0].newField",
                "spec.transport.pacing",
                "spec.upstream.futureSetting",
                "status.shards"
            ]
        );
        assert_eq!(l.spec.upstream.address, "10.0.0.1:443");
        assert_eq!(l.spec.transport.initial_window_packets, 10);
        assert_eq!(
            l.status.as_ref().unwrap().hosts_summary.as_deref(),
            Some("1/1")
        );
        // Never written back under our name, and no difference to this binary.
        let back = serde_json::to_value(&l).unwrap();
        assert!(
            back["spec"]["upstream"].get("futureSetting").is_none(),
            "{back}"
        );
        assert!(back["status"].get("shards").is_none(), "{back}");
        let known: Http3Listener = serde_json::from_value(back).unwrap();
        assert!(known.unknown_fields().is_empty());
        assert_eq!(known, l);
    }

    /// Every enum of the CRD, where it is in the spec, and one value of each.
    const ENUMS: [(&str, &str); 9] = [
        ("addressValidation.mode", "auto"),
        ("advertise.dns.algorithm", "hmac-sha384"),
        ("service.externalTrafficPolicy", "Local"),
        ("service.ipFamilyPolicy", "SingleStack"),
        ("service.type", "NodePort"),
        ("transport.congestionControl", "bbr"),
        ("upstream.clientAddress.clientForwardedFor", "Append"),
        ("upstream.clientAddress.via", "ForwardedHeaders"),
        ("upstream.verify", "system"),
    ];

    fn listener_with(path: &str, value: &str) -> serde_json::Value {
        let mut spec = serde_json::json!({
            "upstream": {"address": "10.0.0.1:443"},
            "service": {"annotations": {"a": "b"}},
            "transport": {"initialWindowPackets": 10},
            "advertise": {"dns": {"server": "10.0.0.53:53", "zones": ["example.com"],
                                  "tsigKeyName": "k", "tsigSecretRef": {"name": "s", "key": "k"}}},
        });
        let mut at = &mut spec;
        for key in path.split('.') {
            at = &mut at[key];
        }
        *at = value.into();
        serde_json::json!({"apiVersion": "h3-ingress.dev/v1alpha1", "kind": "Http3Listener",
                           "metadata": {"name": "l"}, "spec": spec})
    }

    /// The enum fields the CRD publishes, found in the schema: the table above must name
    /// each (a new enum gets its test here).
    #[test]
    fn every_enum_of_the_crd_is_covered() {
        fn walk(schema: &serde_json::Value, path: &str, out: &mut Vec<String>) {
            if schema.get("enum").is_some() {
                out.push(path.to_string());
            }
            let props = schema.get("properties").and_then(|p| p.as_object());
            for (k, v) in props.into_iter().flatten() {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                walk(v, &p, out);
            }
            if let Some(items) = schema.get("items") {
                walk(items, &format!("{path}[]"), out);
            }
        }
        let root = schema::schema_of(&crd()).unwrap();
        let mut found = Vec::new();
        walk(&root["properties"]["spec"], "", &mut found);
        found.sort();
        assert_eq!(found, ENUMS.map(|(p, _)| p.to_string()));
    }

    /// The Kubernetes direction for enum values a newer CRD adds: the listener is read, the
    /// value taken out and named with what this binary knows; every known value reads clean.
    #[test]
    fn an_unknown_enum_value_is_taken_out_and_named() {
        let root = schema::schema_of(&crd()).unwrap();
        for (path, good) in ENUMS {
            let l: Http3Listener = serde_json::from_value(listener_with(path, good)).unwrap();
            assert!(l.unknown_values().is_empty(), "{path}: {good}");
            let l: Http3Listener = serde_json::from_value(listener_with(path, "future-x"))
                .unwrap_or_else(|e| panic!("{path}: {e}"));
            let values = l.unknown_values();
            assert_eq!(values.len(), 1, "{path}");
            assert_eq!(
                (values[0].path.as_str(), values[0].value.as_str()),
                (path, "future-x")
            );
            // What it knows is exactly what the CRD publishes there, and all of it parses.
            let schema = path
                .split('.')
                .fold(&root["properties"]["spec"], |s, k| &s["properties"][k]);
            // (An optional enum also lists null.)
            let published: Vec<&str> = schema["enum"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|v| v.as_str())
                .collect();
            assert_eq!(values[0].known, published, "{path}");
            for v in published {
                let l: Http3Listener = serde_json::from_value(listener_with(path, v)).unwrap();
                assert!(l.unknown_values().is_empty(), "{path}: {v}");
            }
            // Everything else is read as sent.
            assert_eq!(l.spec.upstream.address, "10.0.0.1:443");
            assert_eq!(l.spec.transport.initial_window_packets, 10);
            assert!(l.unknown_fields().is_empty());
        }
        // Two at once, with an unknown field beside them: each said once, in path order.
        let mut two = listener_with("upstream.verify", "pinned");
        two["spec"]["transport"]["congestionControl"] = "l4s".into();
        two["spec"]["transport"]["pacing"] = true.into();
        let l: Http3Listener = serde_json::from_value(two).unwrap();
        let paths: Vec<&str> = l.unknown_values().iter().map(|v| v.path.as_str()).collect();
        assert_eq!(paths, ["transport.congestionControl", "upstream.verify"]);
        assert_eq!(l.unknown_fields(), ["spec.transport.pacing"]);
        // A spec is another spec when only its unknown value changed.
        let a: Http3Listener =
            serde_json::from_value(listener_with("upstream.verify", "x")).unwrap();
        let b: Http3Listener =
            serde_json::from_value(listener_with("upstream.verify", "y")).unwrap();
        assert_ne!(a, b);
        // Not a string: still a type error, as before.
        let wrong = listener_with("transport.congestionControl", "x");
        let mut wrong = wrong;
        wrong["spec"]["transport"]["congestionControl"] = 7.into();
        assert!(serde_json::from_value::<Http3Listener>(wrong).is_err());
    }

    #[test]
    fn schema_revision_matches_the_generated_crd() {
        let crd = crd();
        let hash = schema::spec_hash(&serde_json::to_value(&crd.spec).unwrap());
        assert!(
            schema::SCHEMA_HASHES.last() == Some(&hash.as_str()),
            "the CRD schema changed: append {hash:?} to api::schema::SCHEMA_HASHES (revision {} \
             then), regenerate crds/ (`cargo run -- crd`) and the chart's and deploy/'s copies",
            schema::SCHEMA_REVISION + 1
        );
        let mut seen = std::collections::BTreeSet::new();
        assert!(
            schema::SCHEMA_HASHES.iter().all(|h| seen.insert(*h)),
            "a schema hash appears twice in SCHEMA_HASHES: entries are appended, never reused"
        );
        let identity = schema::identity_of(&crd);
        assert_eq!(identity.revision, Some(schema::SCHEMA_REVISION));
        assert_eq!(identity.hash.as_deref(), Some(hash.as_str()));
        assert_eq!(crd.metadata.name.as_deref(), Some(schema::CRD_NAME));
        assert!(schema::schema_of(&crd).is_some());
    }

    /// One rule for controller names: the CRD's and the chart's pattern are this one, and the
    /// operator's flag check agrees with it on names either side of it.
    #[test]
    fn controller_names_follow_one_rule() {
        let v = serde_json::to_value(crd()).unwrap();
        let field = &v["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
            ["properties"]["controllerName"];
        assert_eq!(field["pattern"], CONTROLLER_NAME_PATTERN);
        assert_eq!(field["default"], DEFAULT_CONTROLLER_NAME);
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/charts/h3-ingress/values.schema.json"
        );
        let schema: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        assert_eq!(
            schema["properties"]["controllerName"]["pattern"],
            CONTROLLER_NAME_PATTERN
        );
        for good in [
            DEFAULT_CONTROLLER_NAME,
            "example.com/staging",
            "a/b",
            "team-a.example.com/h3/edge_1~x",
        ] {
            assert_eq!(controller_name_error(good), None, "{good}");
        }
        for bad in [
            "",
            "ab",
            "staging",
            "Example.com/x",
            "example.com/",
            "/x",
            "-a.b/c",
            "a-.b/c",
            "a..b/c",
            "a.b/c d",
            "a.b/c%d",
            "a_b.com/c",
        ] {
            assert!(controller_name_error(bad).is_some(), "{bad:?} accepted");
        }
        let long = format!("a.b/{}", "x".repeat(MAX_CONTROLLER_NAME));
        assert!(controller_name_error(&long).unwrap().contains("253"));
    }

    #[test]
    fn checked_in_crd_matches_generated() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/crds/http3listeners.h3-ingress.dev.yaml"
        );
        let on_disk = std::fs::read_to_string(path).expect("crds/ file exists");
        assert!(
            on_disk == crd_yaml(),
            "crds/ is stale: run `cargo run -- crd > crds/http3listeners.h3-ingress.dev.yaml`"
        );
    }
}
