//! The pure core of Kubernetes mode: certificate mirrors (`api::mirror`) in, a
//! [`ProxyConfig`] and the [`MirrorReport`] of `/status` out.
//!
//! A mirror is parsed once per `resourceVersion` ([`parse`]): its key once, whatever the number
//! of hosts it serves, each host's name checked against the leaf. What is kept of it is what
//! serving needs ([`Mirror`]), never the Secret. Building a configuration ([`build`]) then
//! parses nothing: it checks each certificate's validity at `now` (certificates expire without
//! an event), resolves names claimed twice, and turns every host it cannot serve into a
//! failure, never a reason to drop another host.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Secret;

use super::{
    self as config, normalize_host_name, parse_host_port, Certificate, ConfigError, HostError,
    HostTable, HostTimeouts, ProxyConfig, Replaced, UpstreamAddress,
};
use crate::api::bounds::{self, Bound};
use crate::api::mirror::{self, HostsDocument};
use crate::api::{
    host_states, reasons, HostReport, Http3Listener, Http3ListenerSpec, MirrorFailure,
    MirrorReport, MAX_REPORTED_FAILURES,
};

/// Why a mirror, or one host of it, cannot be served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// A constant from `api::reasons`.
    pub reason: &'static str,
    pub message: String,
}

impl Problem {
    fn invalid(message: String) -> Self {
        Problem {
            reason: reasons::MIRROR_INVALID,
            message,
        }
    }
}

impl From<HostError> for Problem {
    fn from(e: HostError) -> Self {
        Problem {
            reason: e.reason(),
            message: e.to_string(),
        }
    }
}

/// What the source takes of a mirror Secret: its identity and its data keys. Everything else
/// (managedFields, other annotations, other keys) is dropped as it arrives.
#[derive(Debug, Clone, Default)]
pub struct MirrorInput {
    pub name: String,
    pub resource_version: String,
    /// [`mirror::SOURCE_ANNOTATION`]: `namespace/name` of the Secret it copies.
    pub source: String,
    pub cert: Option<Vec<u8>>,
    pub key: Option<Vec<u8>>,
    pub hosts: Option<Vec<u8>>,
    /// [`mirror::PREVIOUS_KEY`], when the operator wrote one.
    pub previous: Option<Vec<u8>>,
}

impl MirrorInput {
    /// The mirror in `s`, moving its data out; `None` for a Secret that is not a mirror
    /// (no name, or another type than [`mirror::SECRET_TYPE`]).
    pub fn from_secret(s: Secret) -> Option<MirrorInput> {
        if s.type_.as_deref() != Some(mirror::SECRET_TYPE) {
            return None;
        }
        let meta = s.metadata;
        let mut data = s.data.unwrap_or_default();
        let mut take = |k: &str| data.remove(k).map(|b| b.0);
        Some(MirrorInput {
            name: meta.name?,
            resource_version: meta.resource_version.unwrap_or_default(),
            source: meta
                .annotations
                .and_then(|mut a| a.remove(mirror::SOURCE_ANNOTATION))
                .unwrap_or_default(),
            cert: take(mirror::CERT_KEY),
            key: take(mirror::KEY_KEY),
            hosts: take(mirror::HOSTS_KEY),
            previous: take(mirror::PREVIOUS_KEY),
        })
    }
}

/// One host of a mirror's `hosts.json`, checked against the mirror's certificate.
#[derive(Debug)]
pub struct MirrorHost {
    /// Normalised when it is a valid name, as written otherwise.
    pub name: String,
    pub source: String,
    pub upstream: Option<UpstreamAddress>,
    pub timeouts: HostTimeouts,
    /// Why this host cannot be served even though its mirror can.
    pub problem: Option<Problem>,
}

/// A parsed mirror: what serving its hosts needs.
#[derive(Debug)]
pub struct Mirror {
    pub name: String,
    pub resource_version: String,
    /// `namespace/name` of the Secret it copies, shared by its hosts' entries.
    pub source: Arc<str>,
    /// Empty when `hosts.json` is missing or does not parse (then `problem` says so).
    pub hosts: Vec<MirrorHost>,
    pub certificate: Option<Certificate>,
    /// Why none of its hosts can be served, whatever the time.
    pub problem: Option<Problem>,
    /// The leaf its certificate replaced (a `previous.json` that does not parse is ignored:
    /// it only widens what the upstream may present for a while).
    pub replaced: Option<Arc<Replaced>>,
}

/// `previous.json`: the replaced leaf, when it parses and differs from the current one.
fn replaced(json: Option<&[u8]>, current: Option<&Certificate>) -> Option<Arc<Replaced>> {
    use rustls::pki_types::pem::PemObject;
    let p: mirror::PreviousLeaf = serde_json::from_slice(json?).ok()?;
    let leaf = rustls::pki_types::CertificateDer::from_pem_slice(p.certificate.as_bytes()).ok()?;
    (leaf.as_ref() != current?.leaf().as_ref()).then(|| {
        Arc::new(Replaced {
            leaf: leaf.to_vec(),
            at: p.replaced_at,
        })
    })
}

/// Parses one mirror: its hosts, its certificate and key once, each host's name against the
/// leaf. Pure and independent of time ([`build`] checks validity at `now`).
pub fn parse(input: MirrorInput) -> Mirror {
    let MirrorInput {
        name,
        resource_version,
        source,
        cert,
        key,
        hosts,
        previous,
    } = input;
    let mut m = Mirror {
        name,
        resource_version,
        source: source.into(),
        hosts: Vec::new(),
        certificate: None,
        problem: None,
        replaced: None,
    };
    let document = match hosts
        .as_deref()
        .map(serde_json::from_slice::<HostsDocument>)
    {
        None => {
            m.problem = Some(Problem::invalid(format!("no {}", mirror::HOSTS_KEY)));
            return m;
        }
        Some(Err(e)) => {
            m.problem = Some(Problem::invalid(format!("{}: {e}", mirror::HOSTS_KEY)));
            return m;
        }
        Some(Ok(d)) => d,
    };
    let certificate = match (cert, key) {
        (Some(c), Some(k)) => Certificate::from_pem(&c, &k).map_err(Problem::from),
        _ => Err(Problem {
            reason: reasons::CERTIFICATE_INVALID,
            message: format!("no {} and {}", mirror::CERT_KEY, mirror::KEY_KEY),
        }),
    };
    m.hosts = document
        .hosts
        .into_iter()
        .enumerate()
        .map(|(i, h)| host(i, h, certificate.as_ref().ok()))
        .collect();
    match certificate {
        Ok(c) => {
            m.replaced = replaced(previous.as_deref(), Some(&c));
            m.certificate = Some(c);
        }
        Err(p) => m.problem = Some(p),
    }
    m
}

/// A host's own timeouts, each within the range of the listener's field of the same meaning
/// (`api::bounds`); the first one outside it is the host's problem.
fn timeouts(i: usize, h: &mirror::MirroredHost) -> Result<HostTimeouts, Problem> {
    let check = |value: Option<u32>, bound: Bound, name: &str| match value {
        None => Ok(None),
        Some(v) if bound.contains(v.into()) => Ok(Some(std::time::Duration::from_secs(v.into()))),
        Some(v) => Err(Problem::invalid(format!(
            "{}: hosts[{i}].{name}: {v} is outside {}..={}",
            mirror::HOSTS_KEY,
            bound.min,
            bound.max
        ))),
    };
    Ok(HostTimeouts {
        response: check(
            h.response_timeout_seconds,
            bounds::RESPONSE_TIMEOUT_SECONDS,
            "responseTimeoutSeconds",
        )?,
        request_body_idle: check(
            h.request_body_idle_timeout_seconds,
            bounds::REQUEST_BODY_IDLE_TIMEOUT_SECONDS,
            "requestBodyIdleTimeoutSeconds",
        )?,
        response_body_idle: check(
            h.response_body_idle_timeout_seconds,
            bounds::RESPONSE_BODY_IDLE_TIMEOUT_SECONDS,
            "responseBodyIdleTimeoutSeconds",
        )?,
    })
}

fn host(i: usize, h: mirror::MirroredHost, cert: Option<&Certificate>) -> MirrorHost {
    let (timeouts, mut problem) = match timeouts(i, &h) {
        Ok(t) => (t, None),
        Err(p) => (HostTimeouts::default(), Some(p)),
    };
    let upstream = h
        .upstream
        .as_deref()
        .and_then(|u| match parse_host_port(u) {
            Ok(a) => Some(a),
            Err(why) => {
                problem.get_or_insert_with(|| {
                    Problem::invalid(format!(
                        "{}: hosts[{i}].upstream: {u:?} is not host:port ({why})",
                        mirror::HOSTS_KEY
                    ))
                });
                None
            }
        });
    let checked = match cert {
        Some(c) => c.check_name(&h.name),
        None => normalize_host_name(&h.name),
    };
    let name = match checked {
        Ok(n) => n,
        Err(e) => {
            problem = problem.or(Some(e.into()));
            h.name
        }
    };
    MirrorHost {
        name,
        source: h.source,
        upstream,
        timeouts,
        problem,
    }
}

/// The mirrors as the source knows them, by name.
pub type MirrorSet = BTreeMap<String, Arc<Mirror>>;

/// `api::mirror::digest` of a set: what the operator compares with the set it wrote.
pub fn digest(mirrors: &MirrorSet) -> String {
    mirror::digest(
        mirrors
            .values()
            .map(|m| (m.name.as_str(), m.resource_version.as_str())),
    )
}

/// The mirrors whose certificate is outside its validity at `now`: the part of a
/// configuration that changes with time alone.
pub fn out_of_time(mirrors: &MirrorSet, now_unix: i64) -> Vec<String> {
    mirrors
        .values()
        .filter(|m| {
            m.certificate
                .as_ref()
                .is_some_and(|c| c.check_time(now_unix).is_err())
        })
        .map(|m| m.name.clone())
        .collect()
}

/// Everything a configuration depends on, so an unchanged one is recognised without
/// building or formatting it.
#[derive(Debug, Clone, PartialEq)]
pub struct Fingerprint {
    spec: Http3ListenerSpec,
    mirrors: String,
    out_of_time: Vec<String>,
}

impl Fingerprint {
    pub fn of(listener: &Http3Listener, mirrors: &MirrorSet, now_unix: i64) -> Self {
        Fingerprint {
            spec: listener.spec.clone(),
            mirrors: digest(mirrors),
            out_of_time: out_of_time(mirrors, now_unix),
        }
    }
}

/// Hosts served, and every host (or mirror) that could not be, in mirror name order.
struct Resolved {
    table: HostTable,
    failures: Vec<MirrorFailure>,
    failed_hosts: Vec<HostReport>,
}

impl Resolved {
    fn fail(&mut self, m: &Mirror, host: Option<&MirrorHost>, p: &Problem) {
        self.failures.push(MirrorFailure {
            mirror: m.name.clone(),
            source: m.source.to_string(),
            host: host.map(|h| h.name.clone()),
            reason: p.reason.to_string(),
            message: p.message.clone(),
        });
        let hosts: Vec<&MirrorHost> = match host {
            Some(h) => vec![h],
            None => m.hosts.iter().collect(),
        };
        for h in hosts {
            self.failed_hosts.push(HostReport {
                name: h.name.clone(),
                state: host_states::NOT_SERVING.to_string(),
                reason: p.reason.to_string(),
                message: p.message.clone(),
                secret: Some(m.source.to_string()).filter(|s| !s.is_empty()),
                source: h.source.clone(),
                mirror: m.name.clone(),
                ..Default::default()
            });
        }
    }
}

fn resolve(mirrors: &MirrorSet, now_unix: i64) -> Resolved {
    let mut r = Resolved {
        table: HostTable::default(),
        failures: Vec::new(),
        failed_hosts: Vec::new(),
    };
    // Which mirror a name was first served from, to explain a second claim.
    let mut owner: HashMap<&str, &Mirror> = HashMap::new();
    for m in mirrors.values() {
        let cert = match (&m.certificate, &m.problem) {
            (_, Some(p)) => {
                r.fail(m, None, p);
                continue;
            }
            (None, None) => continue,
            (Some(c), None) => c,
        };
        if let Err(e) = cert.check_time(now_unix) {
            r.fail(m, None, &e.into());
            continue;
        }
        for h in &m.hosts {
            if let Some(p) = &h.problem {
                r.fail(m, Some(h), p);
                continue;
            }
            if let Some(first) = owner.get(h.name.as_str()) {
                let p = Problem {
                    reason: reasons::HOST_CONFLICT,
                    message: format!(
                        "{} is already served from mirror {} (Secret {})",
                        h.name, first.name, first.source
                    ),
                };
                r.fail(m, Some(h), &p);
                continue;
            }
            let mut entry = cert.entry(h.name.clone());
            entry.upstream = h.upstream.clone();
            entry.timeouts = h.timeouts;
            entry.source = h.source.clone();
            entry.secret = Some(m.source.clone()).filter(|s| !s.is_empty());
            entry.replaced = m.replaced.clone();
            r.table.insert(entry);
            owner.insert(&h.name, m);
        }
    }
    r
}

/// The configuration of `listener` serving `mirrors` at `now_unix`, with its report. Fails
/// only for an invalid spec; a host that cannot be served is a failure in the report.
pub fn build(
    listener: &Http3Listener,
    mirrors: &MirrorSet,
    now_unix: i64,
) -> Result<ProxyConfig, ConfigError> {
    let Resolved {
        table,
        failures,
        failed_hosts,
    } = resolve(mirrors, now_unix);
    let mut c = config::build(
        listener.spec.listener_settings(),
        listener.spec.unknown_values.values(),
        table,
        "spec",
    )?;
    c.host_reports = failed_hosts;
    c.mirrors = Some(MirrorReport {
        synced: true,
        count: mirrors.len() as u64,
        digest: digest(mirrors),
        failed_count: failures.len() as u64,
        failed: failures.into_iter().take(MAX_REPORTED_FAILURES).collect(),
    });
    Ok(c)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::api::mirror::MirroredHost;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use k8s_openapi::ByteString;

    pub(crate) fn now() -> i64 {
        super::super::file::unix_now()
    }

    pub(crate) fn listener() -> Http3Listener {
        let spec: Http3ListenerSpec = serde_json::from_value(serde_json::json!({
            "ingressClassName": "nginx", "upstream": {"address": "10.0.0.1:443"}
        }))
        .unwrap();
        Http3Listener::new("public", spec)
    }

    /// A mirror input serving `hosts` with a fresh self-signed certificate for `names`.
    pub(crate) fn input(name: &str, rv: &str, names: &[&str], hosts: &[&str]) -> MirrorInput {
        let ck = rcgen::generate_simple_self_signed(
            names.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
        )
        .unwrap();
        let doc = HostsDocument {
            hosts: hosts
                .iter()
                .map(|h| MirroredHost {
                    name: h.to_string(),
                    upstream: None,
                    source: format!("Ingress shop/{name}"),
                    ..Default::default()
                })
                .collect(),
        };
        MirrorInput {
            name: name.into(),
            resource_version: rv.into(),
            source: format!("shop/{name}-tls"),
            cert: Some(ck.cert.pem().into_bytes()),
            key: Some(ck.signing_key.serialize_pem().into_bytes()),
            hosts: Some(serde_json::to_vec(&doc).unwrap()),
            previous: None,
        }
    }

    pub(crate) fn set(inputs: Vec<MirrorInput>) -> MirrorSet {
        inputs
            .into_iter()
            .map(|i| (i.name.clone(), Arc::new(parse(i))))
            .collect()
    }

    /// `previous.json` reaches every host of the mirror as the leaf it replaced; one that
    /// names the current leaf, or does not parse, is nothing.
    #[test]
    fn the_replaced_leaf_of_a_mirror_reaches_its_hosts() {
        let (old_pem, _) = crate::testcerts::self_signed(&["a.test"]);
        let previous = |certificate: &str| {
            let p = mirror::PreviousLeaf {
                certificate: certificate.into(),
                replaced_at: 1_700_000_000,
            };
            Some(serde_json::to_vec(&p).unwrap())
        };
        let mut i = input("m1", "1", &["a.test", "b.test"], &["a.test", "b.test"]);
        i.previous = previous(&old_pem);
        let c = build(&listener(), &set(vec![i]), now()).unwrap();
        use rustls::pki_types::pem::PemObject;
        let old_der =
            rustls::pki_types::CertificateDer::from_pem_slice(old_pem.as_bytes()).unwrap();
        for host in ["a.test", "b.test"] {
            let r = c.hosts.lookup(host).unwrap().replaced.clone().unwrap();
            assert_eq!((r.leaf.as_slice(), r.at), (old_der.as_ref(), 1_700_000_000));
        }
        let mut same = input("m1", "2", &["a.test"], &["a.test"]);
        let current = String::from_utf8(same.cert.clone().unwrap()).unwrap();
        same.previous = previous(&current);
        let mut junk = input("m2", "1", &["b.test"], &["b.test"]);
        junk.previous = Some(b"{not json".to_vec());
        let c = build(&listener(), &set(vec![same, junk]), now()).unwrap();
        assert!(c.hosts.lookup("a.test").unwrap().replaced.is_none());
        assert!(c.hosts.lookup("b.test").unwrap().replaced.is_none());
    }

    #[test]
    fn one_key_serves_every_host_of_a_mirror_and_bad_hosts_fail_alone() {
        let s = set(vec![input(
            "m1",
            "1",
            &["a.test", "*.b.test"],
            &["A.test", "x.b.test", "*.b.test", "c.test", "bad_name"],
        )]);
        let c = build(&listener(), &s, now()).unwrap();
        let names: Vec<&str> = c.hosts.names().collect();
        assert_eq!(names, ["*.b.test", "a.test", "x.b.test"]);
        let a = c.hosts.lookup("a.test").unwrap();
        let x = c.hosts.lookup("x.b.test").unwrap();
        assert!(Arc::ptr_eq(&a.certified_key, &x.certified_key));
        assert_eq!(a.secret.as_deref(), Some("shop/m1-tls"));
        assert_eq!(a.source, "Ingress shop/m1");
        let r = c.mirrors.unwrap();
        assert_eq!((r.count, r.failed_count), (1, 2));
        assert_eq!(r.digest, mirror::digest([("m1", "1")]));
        assert_eq!(r.failed[0].host.as_deref(), Some("c.test"));
        assert_eq!(r.failed[0].reason, reasons::CERTIFICATE_DOES_NOT_MATCH_HOST);
        assert_eq!(r.failed[1].reason, reasons::CERTIFICATE_INVALID);
        assert_eq!(c.host_reports.len(), 2);
        assert_eq!(c.host_reports[0].mirror, "m1");
    }

    #[test]
    fn a_broken_mirror_fails_whole_while_the_others_serve() {
        let mut broken = input("m0", "1", &["a.test"], &["a.test", "b.test"]);
        broken.key = Some(input("x", "1", &["a.test"], &[]).key.unwrap());
        let mut no_doc = input("m2", "1", &["d.test"], &["d.test"]);
        no_doc.hosts = Some(b"{not json".to_vec());
        let mut bad_upstream = input("m3", "1", &["e.test"], &["e.test"]);
        bad_upstream.hosts =
            Some(br#"{"hosts":[{"name":"e.test","upstream":"nope"},{"name":"e.test"}]}"#.to_vec());
        let s = set(vec![
            broken,
            input("m1", "1", &["c.test"], &["c.test"]),
            no_doc,
            bad_upstream,
        ]);
        let c = build(&listener(), &s, now()).unwrap();
        let names: Vec<&str> = c.hosts.names().collect();
        assert_eq!(names, ["c.test", "e.test"]);
        let r = c.mirrors.unwrap();
        let f: Vec<(&str, Option<&str>, &str)> = r
            .failed
            .iter()
            .map(|f| (f.mirror.as_str(), f.host.as_deref(), f.reason.as_str()))
            .collect();
        assert_eq!(
            f,
            [
                ("m0", None, reasons::CERTIFICATE_INVALID),
                ("m2", None, reasons::MIRROR_INVALID),
                ("m3", Some("e.test"), reasons::MIRROR_INVALID),
            ]
        );
        assert!(r.failed[0].message.contains("does not belong"), "{r:?}");
        assert!(r.failed[2].message.contains("hosts[0].upstream"), "{r:?}");
        // A mirror-wide failure lists each of its hosts in /hosts.
        let failed: Vec<&str> = c.host_reports.iter().map(|h| h.name.as_str()).collect();
        assert_eq!(failed, ["a.test", "b.test", "e.test"]);
    }

    #[test]
    fn a_name_claimed_twice_is_served_once_and_the_upstream_override_is_kept() {
        let mut first = input("m1", "1", &["a.test"], &[]);
        first.hosts = Some(br#"{"hosts":[{"name":"a.test","upstream":"gw.test:8443"}]}"#.to_vec());
        let s = set(vec![first, input("m2", "1", &["a.test"], &["a.test"])]);
        let c = build(&listener(), &s, now()).unwrap();
        let a = c.hosts.lookup("a.test").unwrap();
        assert_eq!(a.upstream.as_ref().unwrap().to_string(), "gw.test:8443");
        let r = c.mirrors.unwrap();
        assert_eq!(r.failed[0].reason, reasons::HOST_CONFLICT);
        assert!(r.failed[0].message.contains("mirror m1"), "{r:?}");
    }

    /// A host's own timeouts reach its entry; one outside its range fails that host alone,
    /// naming the field.
    #[test]
    fn per_host_timeouts_reach_the_entry_and_out_of_range_ones_fail_the_host() {
        let mut m = input("m1", "1", &["a.test", "b.test", "c.test"], &[]);
        m.hosts = Some(
            br#"{"hosts":[{"name":"a.test","responseTimeoutSeconds":120,"responseBodyIdleTimeoutSeconds":600},
                {"name":"b.test"},
                {"name":"c.test","requestBodyIdleTimeoutSeconds":0}]}"#
                .to_vec(),
        );
        let c = build(&listener(), &set(vec![m]), now()).unwrap();
        let secs = |s: u64| Some(std::time::Duration::from_secs(s));
        let a = c.hosts.lookup("a.test").unwrap();
        assert_eq!(
            a.timeouts,
            HostTimeouts {
                response: secs(120),
                request_body_idle: None,
                response_body_idle: secs(600),
            }
        );
        assert_eq!(
            c.hosts.lookup("b.test").unwrap().timeouts,
            HostTimeouts::default()
        );
        assert!(c.hosts.lookup("c.test").is_none());
        let r = c.mirrors.unwrap();
        assert_eq!(r.failed[0].host.as_deref(), Some("c.test"));
        assert_eq!(r.failed[0].reason, reasons::MIRROR_INVALID);
        assert_eq!(
            r.failed[0].message,
            "hosts.json: hosts[2].requestBodyIdleTimeoutSeconds: 0 is outside 1..=3600"
        );
    }

    #[test]
    fn the_report_stays_bounded_and_counts_every_failure() {
        let inputs = (0..MAX_REPORTED_FAILURES + 5)
            .map(|i| {
                let mut m = input(&format!("m{i:03}"), "1", &["a.test"], &[]);
                m.cert = None;
                m
            })
            .collect();
        let c = build(&listener(), &set(inputs), now()).unwrap();
        let r = c.mirrors.unwrap();
        assert_eq!(r.failed.len(), MAX_REPORTED_FAILURES);
        assert_eq!(r.failed_count, MAX_REPORTED_FAILURES as u64 + 5);
    }

    #[test]
    fn expiry_needs_no_reparse_and_turns_hosts_into_failures() {
        let s = set(vec![input("m1", "1", &["a.test"], &["a.test"])]);
        let l = listener();
        let c = build(&l, &s, now()).unwrap();
        let after = c.hosts.lookup("a.test").unwrap().not_after + 1;
        assert!(out_of_time(&s, now()).is_empty());
        assert_eq!(out_of_time(&s, after), ["m1"]);
        assert_ne!(
            Fingerprint::of(&l, &s, now()),
            Fingerprint::of(&l, &s, after)
        );
        let expired = build(&l, &s, after).unwrap();
        assert!(expired.hosts.is_empty());
        let r = expired.mirrors.unwrap();
        assert_eq!(r.failed[0].reason, reasons::CERTIFICATE_INVALID);
        assert!(r.failed[0].message.contains("expired at"), "{r:?}");
        assert_eq!(expired.host_reports[0].name, "a.test");
    }

    #[test]
    fn only_mirror_secrets_are_taken_and_only_their_three_keys() {
        let i = input("m1", "7", &["a.test"], &["a.test"]);
        let data: BTreeMap<String, ByteString> = [
            (mirror::CERT_KEY, i.cert.clone().unwrap()),
            (mirror::KEY_KEY, i.key.clone().unwrap()),
            (mirror::HOSTS_KEY, i.hosts.clone().unwrap()),
            ("other", b"x".to_vec()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), ByteString(v)))
        .collect();
        let secret = |ty: &str| Secret {
            metadata: ObjectMeta {
                name: Some("m1".into()),
                resource_version: Some("7".into()),
                annotations: Some(
                    [(mirror::SOURCE_ANNOTATION.to_string(), "shop/web-tls".into())].into(),
                ),
                ..Default::default()
            },
            type_: Some(ty.into()),
            data: Some(data.clone()),
            ..Default::default()
        };
        assert!(MirrorInput::from_secret(secret("kubernetes.io/tls")).is_none());
        let got = MirrorInput::from_secret(secret(mirror::SECRET_TYPE)).unwrap();
        assert_eq!(
            (
                got.name.as_str(),
                got.resource_version.as_str(),
                got.source.as_str()
            ),
            ("m1", "7", "shop/web-tls")
        );
        assert_eq!(got.hosts, i.hosts);
        let m = parse(got);
        assert!(m.problem.is_none(), "{:?}", m.problem);
        assert_eq!(&*m.source, "shop/web-tls");
    }
}
