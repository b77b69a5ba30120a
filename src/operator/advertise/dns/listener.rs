//! What a listener's `spec.advertise.dns` and status mean for its records, and what its
//! status says of them. Pure: the task ([`super::task`]) does the I/O.
//!
//! - [`Settings::from_spec`]: the spec checked, each error naming its field;
//! - [`served`]: the hosts that get a record (served, and some data plane pod ready);
//! - [`want`]: their records;
//! - [`State`]: what the last attempt achieved, as the `DnsAdvertised` condition and
//!   `status.advertise.dns` show it.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::jiff::Timestamp;

use super::client::DnsError;
use super::plan;
use super::publish::Report;
use super::tsig::{Algorithm, TsigError};
use super::wire::{rcode, Name, Record};
use crate::api::{
    bounds, host_states, reasons, DnsAdvertise, DnsAdvertiseStatus, HostStatus, TsigAlgorithm,
    TsigSecretRef, MAX_ADVERTISE_HOSTS,
};

/// `spec.advertise.dns`, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub server: String,
    pub zones: Vec<Name>,
    pub key_name: Name,
    pub algorithm: Algorithm,
    pub secret: TsigSecretRef,
    pub ttl: u32,
}

/// A field of `spec.advertise.dns` that cannot be used, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("advertise.dns.{field}: {why}")]
pub struct FieldError {
    pub field: String,
    pub why: String,
}

fn field(field: impl Into<String>, why: impl Into<String>) -> FieldError {
    FieldError {
        field: field.into(),
        why: why.into(),
    }
}

impl Settings {
    /// The spec's settings, or the first field that is wrong (the CRD schema checks the
    /// bounds too; this also covers a spec written before it had them).
    pub fn from_spec(spec: &DnsAdvertise) -> Result<Settings, FieldError> {
        crate::config::parse_host_port(&spec.server).map_err(|why| {
            field(
                "server",
                format!("{:?} is not host:port ({why})", spec.server),
            )
        })?;
        if spec.zones.is_empty() {
            return Err(field("zones", "names no zone"));
        }
        let mut zones = Vec::with_capacity(spec.zones.len());
        for (i, z) in spec.zones.iter().enumerate() {
            let name = Name::parse(z).map_err(|e| field(format!("zones[{i}]"), e.to_string()))?;
            if name.to_string() == "." || name.to_string().starts_with('*') {
                return Err(field(format!("zones[{i}]"), format!("{z:?} is not a zone")));
            }
            zones.push(name);
        }
        let key_name =
            Name::parse(&spec.tsig_key_name).map_err(|e| field("tsigKeyName", e.to_string()))?;
        if spec.tsig_secret_ref.name.is_empty() {
            return Err(field("tsigSecretRef.name", "is empty"));
        }
        if spec.tsig_secret_ref.key.is_empty() {
            return Err(field("tsigSecretRef.key", "is empty"));
        }
        let ttl = bounds::DNS_TTL_SECONDS;
        if !ttl.contains(spec.ttl_seconds.into()) {
            return Err(field(
                "ttlSeconds",
                format!("{} is outside {}..={}", spec.ttl_seconds, ttl.min, ttl.max),
            ));
        }
        Ok(Settings {
            server: spec.server.clone(),
            zones,
            key_name,
            algorithm: algorithm(spec.algorithm),
            secret: spec.tsig_secret_ref.clone(),
            ttl: spec.ttl_seconds,
        })
    }
}

fn algorithm(a: TsigAlgorithm) -> Algorithm {
    match a {
        TsigAlgorithm::HmacSha256 => Algorithm::HmacSha256,
        TsigAlgorithm::HmacSha384 => Algorithm::HmacSha384,
        TsigAlgorithm::HmacSha512 => Algorithm::HmacSha512,
    }
}

/// The hosts that get a record: those the status marks served, while at least one data plane
/// pod is ready. Anything else (annotation removed, host refused, `InvalidSpec`, no pod
/// ready, a pod that cannot load the certificate) leaves a host out, and its record goes.
pub fn served(hosts: &[HostStatus], ready_pods: i32) -> BTreeSet<String> {
    if ready_pods < 1 {
        return BTreeSet::new();
    }
    hosts
        .iter()
        .filter(|h| h.state == host_states::SERVING)
        .map(|h| h.name.clone())
        .collect()
}

/// The record of each host served on UDP `port`, and the hosts whose name cannot be a DNS
/// name (reported as outside the zones).
pub fn want(
    hosts: &BTreeSet<String>,
    port: u16,
    ttl: u32,
) -> (BTreeMap<Name, Record>, BTreeSet<String>) {
    let mut records = BTreeMap::new();
    let mut bad = BTreeSet::new();
    for h in hosts {
        match Name::parse(h) {
            Ok(n) => {
                let r = plan::record(&n, port, ttl);
                records.insert(n, r);
            }
            Err(_) => {
                bad.insert(h.clone());
            }
        }
    }
    (records, bad)
}

/// The HMAC secret from a Secret's data: base64 text, as `tsig-keygen`, `keymgr` and
/// `ddns-confgen` print it (surrounding whitespace and a final newline are fine).
pub fn secret_bytes(data: &[u8]) -> Result<Vec<u8>, String> {
    use base64::Engine;
    let text = std::str::from_utf8(data).map_err(|_| "is not base64 text".to_string())?;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text.trim())
        .map_err(|e| format!("is not base64 ({e})"))?;
    if bytes.is_empty() {
        return Err("is empty".to_string());
    }
    Ok(bytes)
}

/// A condition's status (`None`: Unknown), reason and message.
pub type ConditionParts = (Option<bool>, &'static str, String);

/// The `DnsAdvertised` condition (status, reason, message) and `status.advertise.dns` of a
/// listener: from its spec's verdict and its task's state. Nothing for a listener that never
/// had `advertise.dns` (`had_condition`: the stored status carries the condition).
pub fn verdict(
    spec: Option<&Result<Settings, FieldError>>,
    state: Option<&State>,
    had_condition: bool,
) -> Option<(ConditionParts, Option<DnsAdvertiseStatus>)> {
    let status = state.map(State::status);
    match (spec, state) {
        (Some(Err(e)), _) => Some(((Some(false), reasons::INVALID_SPEC, e.to_string()), status)),
        (Some(Ok(s)), None) => {
            let pending = State::pending(s);
            Some((pending.condition(), Some(pending.status())))
        }
        (_, Some(st)) => Some((st.condition(), status.filter(|_| spec.is_some()))),
        (None, None) if had_condition => Some((
            (
                Some(false),
                reasons::DISABLED,
                "spec.advertise.dns is not set: no record is published".to_string(),
            ),
            None,
        )),
        (None, None) => None,
    }
}

/// The `DnsAdvertised` reason of a failed attempt.
pub fn reason_of(e: &DnsError) -> &'static str {
    match e {
        DnsError::Io { .. } | DnsError::Timeout(_) => reasons::SERVER_UNREACHABLE,
        DnsError::Tsig { source, .. } => match source {
            TsigError::Wire(_) => reasons::UPDATE_REFUSED,
            _ => reasons::TSIG_REFUSED,
        },
        // Knot and BIND answer NOTAUTH to a key they do not know (with TSIG error BADKEY).
        DnsError::Refused { rcode: r, .. } if *r == rcode::name(rcode::NOTAUTH) => {
            reasons::TSIG_REFUSED
        }
        DnsError::Refused { .. } | DnsError::Wire { .. } => reasons::UPDATE_REFUSED,
    }
}

/// What the last attempt for a listener achieved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct State {
    /// `Some(true)`: in step; `Some(false)`: failed or partly refused; `None`: not tried yet.
    pub ok: Option<bool>,
    pub reason: &'static str,
    pub message: String,
    pub server: String,
    pub zones: Vec<String>,
    pub published: usize,
    pub conflicts: BTreeSet<String>,
    pub outside: BTreeSet<String>,
    pub last_update: Option<Timestamp>,
}

impl State {
    pub fn pending(s: &Settings) -> State {
        State {
            ok: None,
            reason: reasons::PUBLISH_PENDING,
            message: "not published yet".to_string(),
            server: s.server.clone(),
            zones: s.zones.iter().map(Name::to_string).collect(),
            published: 0,
            conflicts: BTreeSet::new(),
            outside: BTreeSet::new(),
            last_update: None,
        }
    }

    /// After a sync that went through: published, or some hosts left out and why.
    pub fn synced(&mut self, r: &Report, bad: &BTreeSet<String>, now: Timestamp) {
        self.published = r.published;
        self.conflicts = r.conflicts.iter().map(Name::to_string).collect();
        self.outside = r
            .outside
            .iter()
            .map(Name::to_string)
            .chain(bad.iter().cloned())
            .collect();
        if r.updates > 0 {
            self.last_update = Some(now);
        }
        let (ok, reason, message) = if !self.conflicts.is_empty() {
            let names = first(&self.conflicts);
            (false, reasons::RECORD_CONFLICT, format!(
                "{} hosts have an HTTPS or registry record the operator did not make, left alone: {names}",
                self.conflicts.len()
            ))
        } else if !self.outside.is_empty() {
            let names = first(&self.outside);
            (
                false,
                reasons::OUTSIDE_ZONES,
                format!(
                    "{} hosts are in none of advertise.dns.zones: {names}",
                    self.outside.len()
                ),
            )
        } else {
            (
                true,
                reasons::PUBLISHED,
                format!("{} HTTPS records on {}", r.published, self.server),
            )
        };
        self.ok = Some(ok);
        self.reason = reason;
        self.message = message;
    }

    /// After an attempt that did not reach the zone (what was published stays as it was).
    pub fn failed(&mut self, reason: &'static str, message: String) {
        self.ok = Some(false);
        self.reason = reason;
        self.message = message;
    }

    /// The condition's status, reason and message.
    pub fn condition(&self) -> ConditionParts {
        (self.ok, self.reason, self.message.clone())
    }

    /// `status.advertise.dns`: counts, and at most [`MAX_ADVERTISE_HOSTS`] names per list.
    pub fn status(&self) -> DnsAdvertiseStatus {
        let cut = |s: &BTreeSet<String>| {
            s.iter()
                .take(MAX_ADVERTISE_HOSTS)
                .cloned()
                .collect::<Vec<_>>()
        };
        let conflicts = cut(&self.conflicts);
        let outside_zones = cut(&self.outside);
        let omitted =
            self.conflicts.len() + self.outside.len() - conflicts.len() - outside_zones.len();
        DnsAdvertiseStatus {
            server: self.server.clone(),
            zones: self.zones.clone(),
            published: self.published as i64,
            conflicts,
            outside_zones,
            hosts_omitted: omitted as i64,
            last_update_time: self
                .last_update
                .map(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time),
        }
    }
}

/// The first few names of a set, for a condition message.
fn first(names: &BTreeSet<String>) -> String {
    const SHOWN: usize = 5;
    let shown: Vec<&str> = names.iter().take(SHOWN).map(String::as_str).collect();
    let more = names.len().saturating_sub(SHOWN);
    let mut text = shown.join(", ");
    if more > 0 {
        text.push_str(&format!(" and {more} more"));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> DnsAdvertise {
        DnsAdvertise {
            server: "ns1.example.com:53".into(),
            zones: vec!["example.com".into(), "eu.example.com.".into()],
            tsig_key_name: "h3-ingress".into(),
            tsig_secret_ref: TsigSecretRef {
                name: "dns-key".into(),
                key: "secret".into(),
            },
            algorithm: TsigAlgorithm::HmacSha512,
            ttl_seconds: 60,
        }
    }

    #[test]
    fn settings_are_checked_and_errors_name_the_field() {
        let s = Settings::from_spec(&spec()).unwrap();
        assert_eq!(s.zones[1].to_string(), "eu.example.com");
        assert_eq!(s.algorithm, Algorithm::HmacSha512);
        let err = |f: &dyn Fn(&mut DnsAdvertise)| {
            let mut d = spec();
            f(&mut d);
            Settings::from_spec(&d).unwrap_err().to_string()
        };
        assert!(err(&|d| d.server = "ns1".into()).starts_with("advertise.dns.server: "));
        assert!(err(&|d| d.zones.clear()).starts_with("advertise.dns.zones: "));
        assert!(err(&|d| d.zones[1] = "bad zone".into()).starts_with("advertise.dns.zones[1]: "));
        assert!(
            err(&|d| d.zones[0] = "*.example.com".into()).starts_with("advertise.dns.zones[0]: ")
        );
        assert!(
            err(&|d| d.tsig_key_name = "a..b".into()).starts_with("advertise.dns.tsigKeyName: ")
        );
        assert!(err(&|d| d.tsig_secret_ref.key.clear())
            .starts_with("advertise.dns.tsigSecretRef.key: "));
        assert_eq!(
            err(&|d| d.ttl_seconds = 5),
            "advertise.dns.ttlSeconds: 5 is outside 10..=3600"
        );
    }

    fn host(name: &str, state: &str) -> HostStatus {
        HostStatus {
            name: name.into(),
            state: state.into(),
            ..Default::default()
        }
    }

    #[test]
    fn only_served_hosts_with_a_ready_pod_get_a_record() {
        let hosts = [
            host("a.example.com", host_states::SERVING),
            host("b.example.com", host_states::NOT_SERVING),
            host("*.example.com", host_states::SERVING),
        ];
        assert_eq!(
            served(&hosts, 2).into_iter().collect::<Vec<_>>(),
            ["*.example.com", "a.example.com"]
        );
        assert!(
            served(&hosts, 0).is_empty(),
            "no ready pod: nothing advertised"
        );
        let (records, bad) = want(&served(&hosts, 1), 8443, 60);
        assert_eq!(records.len(), 2);
        assert!(bad.is_empty());
        let (_, bad) = want(&["bad name".to_string()].into(), 443, 60);
        assert_eq!(bad.len(), 1);
    }

    #[test]
    fn the_secret_is_base64_text_and_the_verdict_follows_spec_and_state() {
        assert_eq!(secret_bytes(b"YWJj\n").unwrap(), b"abc");
        assert!(secret_bytes(b"not base64!").is_err());
        assert!(secret_bytes(b"").is_err());
        assert!(
            verdict(None, None, false).is_none(),
            "never configured: no condition"
        );
        let (c, _) = verdict(None, None, true).unwrap();
        assert_eq!(c.1, reasons::DISABLED);
        let bad = Err(field("server", "x"));
        let (c, _) = verdict(Some(&bad), None, false).unwrap();
        assert_eq!((c.0, c.1), (Some(false), reasons::INVALID_SPEC));
        assert_eq!(c.2, "advertise.dns.server: x");
        let s = Settings::from_spec(&spec()).unwrap();
        let (c, st) = verdict(Some(&Ok(s.clone())), None, false).unwrap();
        assert_eq!((c.0, c.1), (None, reasons::PUBLISH_PENDING));
        assert_eq!(st.unwrap().server, "ns1.example.com:53");
        let mut withdrawn = State::pending(&s);
        withdrawn.failed(reasons::DISABLED, "gone".into());
        let (c, st) = verdict(None, Some(&withdrawn), true).unwrap();
        assert_eq!(c.1, reasons::DISABLED);
        assert!(st.is_none(), "nothing is published any more");
    }

    #[test]
    fn errors_map_to_reasons() {
        let server = "s:53".to_string();
        let io = DnsError::Io {
            server: server.clone(),
            source: std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
        };
        assert_eq!(reason_of(&io), reasons::SERVER_UNREACHABLE);
        assert_eq!(
            reason_of(&DnsError::Timeout(server.clone())),
            reasons::SERVER_UNREACHABLE
        );
        let tsig = DnsError::Tsig {
            server: server.clone(),
            source: TsigError::Refused("BADSIG"),
        };
        assert_eq!(reason_of(&tsig), reasons::TSIG_REFUSED);
        let notauth = DnsError::Refused {
            server: server.clone(),
            rcode: rcode::name(rcode::NOTAUTH),
        };
        assert_eq!(reason_of(&notauth), reasons::TSIG_REFUSED);
        let refused = DnsError::Refused {
            server,
            rcode: rcode::name(rcode::REFUSED),
        };
        assert_eq!(reason_of(&refused), reasons::UPDATE_REFUSED);
    }

    #[test]
    fn the_state_says_why_and_its_status_stays_bounded() {
        let s = Settings::from_spec(&spec()).unwrap();
        let mut st = State::pending(&s);
        assert_eq!(st.condition().0, None);
        let now = Timestamp::UNIX_EPOCH;
        let mut r = Report {
            published: 3,
            updates: 1,
            ..Default::default()
        };
        st.synced(&r, &BTreeSet::new(), now);
        assert_eq!(st.condition().1, reasons::PUBLISHED);
        assert_eq!(st.last_update, Some(now));
        for i in 0..30 {
            r.conflicts
                .insert(Name::parse(&format!("c{i:02}.example.com")).unwrap());
        }
        st.synced(&r, &["bad name".to_string()].into(), now);
        let (ok, reason, message) = st.condition();
        assert_eq!((ok, reason), (Some(false), reasons::RECORD_CONFLICT));
        assert!(message.contains("c04.example.com and 25 more"), "{message}");
        let status = st.status();
        assert_eq!(status.conflicts.len(), MAX_ADVERTISE_HOSTS);
        assert_eq!(status.outside_zones, ["bad name"]);
        assert_eq!(status.hosts_omitted, 10);
        st.failed(reasons::SERVER_UNREACHABLE, "down".into());
        assert_eq!(st.status().published, 3, "what was published is still said");
    }
}
