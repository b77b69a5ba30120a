//! The served CRD against the schema this operator was built with (`api::schema`).
//!
//! Helm installs `crds/` once and never upgrades it, so after an upgrade of the chart an older
//! CRD silently drops every field it lacks from every listener; and after a downgrade of the
//! operator the CRD is newer than the binary. The pure core ([`judge`], [`set_condition`])
//! turns the served CRD into a verdict and the `CRDCurrent` condition every listener carries:
//! older is False (`CRDOutdated`, naming what is dropped and how to upgrade; the status change
//! makes the Warning Event), newer is True (`CRDNewer`: this operator reads it fine).
//!
//! The shell ([`CrdCheck`]) watches that one CRD by name (one watch per operator, however many
//! listeners), keeps the verdict for the reconciles and asks for a reconcile of every listener
//! when it changes. When allowed (`--crd-upgrade`, the chart's `crd.upgrade`) the leader
//! applies its own CRD with server-side apply, only over an older one: never over a newer
//! CRD, whose fields an older operator would prune.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Client;
use tokio::sync::watch;

use super::metrics::{crd_upgrade, OperatorMetrics};
use super::FIELD_MANAGER;
use crate::api::schema::{self, Identity};
use crate::api::{conditions, reasons, Http3ListenerStatus};

/// Fields a condition message names before "and N more".
const LISTED: usize = 8;
/// A failed upgrade is tried again this long after, while the CRD stays older.
pub const UPGRADE_RETRY: Duration = Duration::from_secs(300);

/// What the served CRD is to this operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// This operator's revision and hash.
    Matches,
    /// A later revision.
    Newer,
    /// An earlier revision (0: not annotated, from before revisions existed).
    Outdated,
    /// This revision, but another schema (another hash, or other fields).
    Modified,
    /// Not readable (the message says why).
    Unreadable(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub kind: Kind,
    /// The served CRD's revision (`None`: not a number, or not read).
    pub served: Option<u32>,
    /// Fields of this operator's schema the served one lacks: the API server drops them.
    pub dropped: Vec<String>,
    /// Fields of the served schema this operator does not know: it reads past them.
    pub ignored: Vec<String>,
    /// Why this operator's own upgrade of the CRD failed, if it tried.
    pub upgrade_failed: Option<String>,
}

impl Verdict {
    pub fn unreadable(why: String) -> Self {
        Self {
            kind: Kind::Unreadable(why),
            served: None,
            dropped: Vec::new(),
            ignored: Vec::new(),
            upgrade_failed: None,
        }
    }

    /// Whether applying this operator's CRD over the served one is an upgrade: older only.
    pub fn wants_upgrade(&self) -> bool {
        self.kind == Kind::Outdated
    }
}

/// Compares the served CRD with `ours` (this binary's [`crate::api::crd`]). Pure.
pub fn judge(served: &CustomResourceDefinition, ours: &CustomResourceDefinition) -> Verdict {
    let theirs = schema::identity_of(served);
    let mine: Identity = schema::identity_of(ours);
    let (their_schema, my_schema) = (schema::schema_of(served), schema::schema_of(ours));
    let diff = |a: &Option<serde_json::Value>, b: &Option<serde_json::Value>| match (a, b) {
        (Some(a), Some(b)) => schema::missing_fields(a, b),
        _ => Vec::new(),
    };
    let dropped = match &their_schema {
        Some(_) => diff(&my_schema, &their_schema),
        None => vec![format!("every field (no {} schema)", schema::VERSION)],
    };
    let ignored = diff(&their_schema, &my_schema);
    let kind = match (theirs.revision, mine.revision) {
        (Some(t), Some(m)) if t > m => Kind::Newer,
        (Some(t), Some(m)) if t < m => Kind::Outdated,
        // The same revision: the same schema unless edited (its hash, or its fields, differ).
        (Some(_), Some(_))
            if theirs.hash == mine.hash && dropped.is_empty() && ignored.is_empty() =>
        {
            Kind::Matches
        }
        (Some(_), Some(_)) => Kind::Modified,
        // Unparsable revision: judge by what it would drop.
        _ if dropped.is_empty() => Kind::Modified,
        _ => Kind::Outdated,
    };
    Verdict {
        kind,
        served: theirs.revision,
        dropped,
        ignored,
        upgrade_failed: None,
    }
}

fn listed(fields: &[String]) -> String {
    if fields.len() <= LISTED {
        return fields.join(", ");
    }
    format!(
        "{} and {} more",
        fields[..LISTED].join(", "),
        fields.len() - LISTED
    )
}

fn revision(r: Option<u32>) -> String {
    match r {
        Some(0) => "0 (not annotated)".into(),
        Some(r) => r.to_string(),
        None => "unreadable".into(),
    }
}

/// How to upgrade the CRD by hand; Helm never upgrades `crds/`.
pub const UPGRADE_HINT: &str = "upgrade it with `kubectl apply --server-side --force-conflicts \
     -f crds/http3listeners.h3-ingress.dev.yaml` of this release (Helm never upgrades crds/), \
     or `h3-ingress crd | kubectl apply --server-side --force-conflicts -f -` with this \
     binary, or let the operator do it (chart value crd.upgrade=true, operator --crd-upgrade)";

/// The `CRDCurrent` condition's status ("True", "False", "Unknown"), reason and message.
pub fn condition_of(v: &Verdict) -> (&'static str, &'static str, String) {
    let ours = format!(
        "this operator's {} ({})",
        schema::SCHEMA_REVISION,
        crate::version::BUILD
    );
    let served = revision(v.served);
    let dropped = || {
        format!(
            "the API server drops {} from every listener, so they take their defaults",
            listed(&v.dropped)
        )
    };
    let failed = v
        .upgrade_failed
        .as_ref()
        .map(|e| format!("; the operator's own upgrade failed: {e}"))
        .unwrap_or_default();
    match &v.kind {
        Kind::Matches => (
            "True",
            reasons::CRD_MATCHES,
            format!("the served CRD has schema revision {served}, the same as {ours}"),
        ),
        Kind::Newer => {
            let ignored = if v.ignored.is_empty() {
                String::new()
            } else {
                format!("; this operator reads past {}", listed(&v.ignored))
            };
            (
                "True",
                reasons::CRD_NEWER,
                format!("the served CRD has schema revision {served}, newer than {ours}{ignored}"),
            )
        }
        Kind::Outdated => (
            "False",
            reasons::CRD_OUTDATED,
            format!(
                "the served CRD has schema revision {served}, older than {ours}: {}; {UPGRADE_HINT}{failed}",
                dropped()
            ),
        ),
        Kind::Modified if v.dropped.is_empty() => (
            "True",
            reasons::CRD_MODIFIED,
            format!("the served CRD claims schema revision {served}, the same as {ours}, but its schema differs; it drops nothing this operator uses"),
        ),
        Kind::Modified => (
            "False",
            reasons::CRD_MODIFIED,
            format!(
                "the served CRD claims schema revision {served}, the same as {ours}, but its schema differs: {}; {UPGRADE_HINT}",
                dropped()
            ),
        ),
        Kind::Unreadable(why) => (
            "Unknown",
            reasons::CRD_UNREADABLE,
            format!(
                "cannot read CustomResourceDefinition {}: {why} (the operator needs get, list \
                 and watch on it by name)",
                schema::CRD_NAME
            ),
        ),
    }
}

/// Puts the `CRDCurrent` condition for `verdict` into `next` (replacing one there), keeping
/// its transition time from `previous` while its status stays. No verdict yet (the watch has
/// not answered): the condition `previous` had is kept, so a restart does not flap it.
pub fn set_condition(
    next: &mut Http3ListenerStatus,
    verdict: Option<&Verdict>,
    previous: Option<&Http3ListenerStatus>,
    now: Timestamp,
    generation: Option<i64>,
) {
    let before = previous.and_then(|p| {
        p.conditions
            .iter()
            .find(|c| c.type_ == conditions::CRD_CURRENT)
    });
    let condition = match verdict {
        Some(v) => {
            let (status, reason, message) = condition_of(v);
            let since = match before {
                Some(b) if b.status == status => b.last_transition_time.clone(),
                _ => Time(now),
            };
            Condition {
                type_: conditions::CRD_CURRENT.into(),
                status: status.into(),
                reason: reason.into(),
                message,
                observed_generation: generation,
                last_transition_time: since,
            }
        }
        None => match before {
            Some(b) => b.clone(),
            None => return,
        },
    };
    next.conditions
        .retain(|c| c.type_ != conditions::CRD_CURRENT);
    next.conditions.push(condition);
}

/// The verdict on the served CRD, kept by a watch of it; what reconciles read.
pub struct CrdCheck {
    verdict: Mutex<Option<Verdict>>,
    /// Whether a watch feeds it (else it never answers, and nobody waits for it).
    watched: bool,
}

/// How the operator treats the served CRD.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// Apply this operator's CRD over an older one (as the leader).
    pub upgrade: bool,
}

impl CrdCheck {
    /// A check that never answers: listeners get no `CRDCurrent` condition (tests that run no
    /// watch, and the time before the watch answers).
    pub fn disabled() -> Arc<Self> {
        Arc::new(Self {
            verdict: Mutex::new(None),
            watched: false,
        })
    }

    /// The latest verdict, if the watch has answered.
    pub fn verdict(&self) -> Option<Verdict> {
        self.verdict.lock().expect("not poisoned").clone()
    }

    /// Whether the watch has yet to answer: a status written now would lack `CRDCurrent` and
    /// be written again a moment later. (It answers within one list: with the CRD, or with
    /// why it cannot be read.)
    pub fn pending(&self) -> bool {
        self.watched && self.verdict.lock().expect("not poisoned").is_none()
    }

    /// Stores `v`; true when it differs from the one before.
    fn store(&self, v: Verdict) -> bool {
        let mut cur = self.verdict.lock().expect("not poisoned");
        let changed = cur.as_ref() != Some(&v);
        *cur = Some(v);
        changed
    }

    /// Starts the watch of the CRD. `changed` is called whenever the verdict changes (the
    /// controller reconciles every listener then); `leader` gates the upgrade.
    pub fn start(
        client: &Client,
        policy: Policy,
        leader: watch::Receiver<bool>,
        metrics: Arc<OperatorMetrics>,
        changed: Arc<dyn Fn() + Send + Sync>,
    ) -> Arc<Self> {
        let check = Arc::new(Self {
            verdict: Mutex::new(None),
            watched: true,
        });
        metrics
            .crd_revision
            .with_label_values(&["operator"])
            .set(i64::from(schema::SCHEMA_REVISION));
        let shell = Shell {
            api: Api::all(client.clone()),
            check: check.clone(),
            policy,
            leader,
            metrics,
            changed,
            ours: crate::api::crd(),
        };
        tokio::spawn(shell.run());
        check
    }
}

/// The watch task's state.
struct Shell {
    api: Api<CustomResourceDefinition>,
    check: Arc<CrdCheck>,
    policy: Policy,
    leader: watch::Receiver<bool>,
    metrics: Arc<OperatorMetrics>,
    changed: Arc<dyn Fn() + Send + Sync>,
    ours: CustomResourceDefinition,
}

impl Shell {
    async fn run(mut self) {
        let by_name =
            watcher::Config::default().fields(&format!("metadata.name={}", schema::CRD_NAME));
        let mut events = watcher(self.api.clone(), by_name).default_backoff().boxed();
        let mut last: Option<CustomResourceDefinition> = None;
        // The last failed upgrade: when, and why (an older CRD is retried after UPGRADE_RETRY).
        let mut failed: Option<(tokio::time::Instant, String)> = None;
        let mut leader_open = true;
        loop {
            let retry = failed.as_ref().map(|(t, _)| *t + UPGRADE_RETRY);
            tokio::select! {
                ev = events.next() => match ev {
                    None => return,
                    Some(Ok(watcher::Event::Apply(crd) | watcher::Event::InitApply(crd))) => {
                        last = Some(crd);
                        failed = None;
                    }
                    Some(Ok(watcher::Event::Delete(_))) => {
                        last = None;
                        self.publish(Verdict::unreadable("it was deleted".into()));
                        continue;
                    }
                    Some(Ok(_)) => continue,
                    // Once read, a broken watch (an API server restart) changes nothing: the
                    // watcher resumes and the verdict stands.
                    Some(Err(e)) => {
                        if last.is_none() {
                            self.publish(Verdict::unreadable(e.to_string()));
                        }
                        continue;
                    }
                },
                // Without leader election the flag never changes (its sender is gone).
                r = self.leader.changed(), if leader_open => {
                    if r.is_err() {
                        leader_open = false;
                        continue;
                    }
                }
                _ = sleep_until(retry) => failed = None,
            }
            let Some(crd) = &last else { continue };
            let v = self
                .assess(crd, failed.as_ref().map(|(_, why)| why.as_str()))
                .await;
            let Some(v) = v else { continue };
            if let (None, Some(why)) = (&failed, &v.upgrade_failed) {
                failed = Some((tokio::time::Instant::now(), why.clone()));
            }
            self.publish(v);
        }
    }

    /// The verdict on `crd`, after upgrading it when it is older and that is allowed (then
    /// `None`: the watch brings the upgraded CRD next). `failed`: the reason the last attempt
    /// failed, when it is too early to try again.
    async fn assess(
        &self,
        crd: &CustomResourceDefinition,
        failed: Option<&str>,
    ) -> Option<Verdict> {
        let mut v = judge(crd, &self.ours);
        let served = v.served.map(i64::from).unwrap_or(-1);
        self.metrics
            .crd_revision
            .with_label_values(&["served"])
            .set(served);
        if !(v.wants_upgrade() && self.policy.upgrade && *self.leader.borrow()) {
            return Some(v);
        }
        if let Some(why) = failed {
            v.upgrade_failed = Some(why.to_string());
            return Some(v);
        }
        let params = PatchParams::apply(FIELD_MANAGER).force();
        match self
            .api
            .patch(schema::CRD_NAME, &params, &Patch::Apply(&self.ours))
            .await
        {
            Ok(_) => {
                self.metrics
                    .crd_upgrades
                    .with_label_values(&[crd_upgrade::OK])
                    .inc();
                tracing::info!(
                    crd = schema::CRD_NAME,
                    from = %revision(v.served),
                    to = schema::SCHEMA_REVISION,
                    added = %listed(&v.dropped),
                    "upgraded the served CRD to this operator's schema"
                );
                None
            }
            Err(e) => {
                self.metrics
                    .crd_upgrades
                    .with_label_values(&[crd_upgrade::ERROR])
                    .inc();
                v.upgrade_failed = Some(e.to_string());
                Some(v)
            }
        }
    }

    /// Stores `v`; when it changed, logs it and asks for every listener to be reconciled.
    fn publish(&self, v: Verdict) {
        let (status, reason, message) = condition_of(&v);
        if !self.check.store(v) {
            return;
        }
        if status == "True" {
            tracing::info!(crd = schema::CRD_NAME, reason, "{message}");
        } else {
            tracing::warn!(crd = schema::CRD_NAME, reason, "{message}");
        }
        (self.changed)();
    }
}

/// [`CrdCheck::start`] as the controller wires it: `upgrade` from `--crd-upgrade`, a change of
/// the verdict sent on `reconcile_all`.
pub fn watch(
    client: &Client,
    upgrade: bool,
    leader: &watch::Receiver<bool>,
    metrics: &Arc<OperatorMetrics>,
    reconcile_all: &tokio::sync::mpsc::UnboundedSender<()>,
) -> Arc<CrdCheck> {
    let tx = reconcile_all.clone();
    CrdCheck::start(
        client,
        Policy { upgrade },
        leader.clone(),
        metrics.clone(),
        Arc::new(move || {
            let _ = tx.send(());
        }),
    )
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const UPSTREAM: &str =
        "/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties/upstream/properties";

    /// This binary's CRD edited: its revision annotation (None: removed), with `upstream`'s
    /// field `drop` removed and a field `add` added.
    fn edited(
        revision: Option<&str>,
        drop: Option<&str>,
        add: Option<&str>,
    ) -> CustomResourceDefinition {
        let mut v = serde_json::to_value(crate::api::crd()).unwrap();
        let annotations = v["metadata"]["annotations"].as_object_mut().unwrap();
        match revision {
            Some(r) => annotations.insert(schema::annotations::SCHEMA_REVISION.into(), r.into()),
            None => annotations.remove(schema::annotations::SCHEMA_REVISION),
        };
        let props = v.pointer_mut(UPSTREAM).unwrap().as_object_mut().unwrap();
        if let Some(d) = drop {
            assert!(props.remove(d).is_some(), "{d}");
        }
        if let Some(a) = add {
            props.insert(a.into(), json!({"type": "integer", "default": 1}));
        }
        serde_json::from_value(v).unwrap()
    }

    fn ours() -> CustomResourceDefinition {
        crate::api::crd()
    }

    #[test]
    fn the_served_crd_is_matching_older_newer_or_modified() {
        let mine = schema::SCHEMA_REVISION.to_string();
        let v = judge(&ours(), &ours());
        assert_eq!(
            (v.kind, v.dropped.len(), v.ignored.len()),
            (Kind::Matches, 0, 0)
        );

        let grace = "servedCertificateGraceSeconds";
        let older = edited(None, Some(grace), None);
        let v = judge(&older, &ours());
        assert_eq!(v.kind, Kind::Outdated);
        assert_eq!(v.served, Some(0), "no annotation: from before revisions");
        assert_eq!(v.dropped, [format!("spec.upstream.{grace}")]);
        assert!(v.wants_upgrade());

        let next = (schema::SCHEMA_REVISION + 1).to_string();
        let newer = edited(Some(&next), None, Some("futureSetting"));
        let v = judge(&newer, &ours());
        assert_eq!(v.kind, Kind::Newer);
        assert_eq!(v.ignored, ["spec.upstream.futureSetting"]);
        assert!(!v.wants_upgrade(), "never over a newer CRD");

        // Our revision number, another schema: judged by what it drops, never upgraded.
        let mut other_hash = ours();
        let annotations = other_hash.metadata.annotations.as_mut().unwrap();
        annotations.insert(schema::annotations::SCHEMA_HASH.into(), "sha256:0".into());
        assert_eq!(judge(&other_hash, &ours()).kind, Kind::Modified);
        let v = judge(&edited(Some(&mine), None, Some("x")), &ours());
        assert_eq!((&v.kind, v.dropped.is_empty()), (&Kind::Modified, true));
        let v = judge(&edited(Some(&mine), Some(grace), None), &ours());
        assert_eq!((&v.kind, v.dropped.len()), (&Kind::Modified, 1));
        assert!(!v.wants_upgrade());
        let v = judge(&edited(Some("soon"), Some(grace), None), &ours());
        assert_eq!((v.kind, v.served), (Kind::Outdated, None));
    }

    fn condition(status: &Http3ListenerStatus) -> &Condition {
        status
            .conditions
            .iter()
            .find(|c| c.type_ == conditions::CRD_CURRENT)
            .expect("CRDCurrent")
    }

    #[test]
    fn the_condition_says_what_is_dropped_and_how_to_upgrade() {
        let t = |s| Timestamp::from_second(s).unwrap();
        let older = judge(
            &edited(None, Some("servedCertificateGraceSeconds"), None),
            &ours(),
        );
        let mut next = Http3ListenerStatus::default();
        set_condition(&mut next, Some(&older), None, t(100), Some(3));
        let c = condition(&next).clone();
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", reasons::CRD_OUTDATED)
        );
        assert_eq!(c.observed_generation, Some(3));
        assert!(
            c.message.starts_with(&format!(
                "the served CRD has schema revision 0 (not annotated), older than this operator's {} ({}): the API server drops spec.upstream.servedCertificateGraceSeconds from every listener",
                schema::SCHEMA_REVISION,
                crate::version::BUILD
            )),
            "{}",
            c.message
        );
        assert!(
            c.message.contains("kubectl apply --server-side"),
            "{}",
            c.message
        );
        assert!(c.message.contains("crd.upgrade=true"), "{}", c.message);

        // Same status later: the transition time stays; the upgrade's failure is said.
        let mut failed = older.clone();
        failed.upgrade_failed = Some("forbidden".into());
        let mut later = Http3ListenerStatus::default();
        set_condition(&mut later, Some(&failed), Some(&next), t(200), Some(3));
        assert_eq!(condition(&later).last_transition_time, Time(t(100)));
        assert!(condition(&later)
            .message
            .ends_with("; the operator's own upgrade failed: forbidden"));

        // Upgraded: True, a new transition time, one condition of the type.
        let mut now = later.clone();
        set_condition(
            &mut now,
            Some(&judge(&ours(), &ours())),
            Some(&later),
            t(300),
            Some(3),
        );
        let c = condition(&now);
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("True", reasons::CRD_MATCHES)
        );
        assert_eq!(c.last_transition_time, Time(t(300)));
        assert_eq!(now.conditions.len(), 1);

        // Newer: True, naming what is read past.
        let next_rev = (schema::SCHEMA_REVISION + 1).to_string();
        let newer = judge(
            &edited(Some(&next_rev), None, Some("futureSetting")),
            &ours(),
        );
        let (status, reason, message) = condition_of(&newer);
        assert_eq!((status, reason), ("True", reasons::CRD_NEWER));
        assert!(
            message.ends_with("this operator reads past spec.upstream.futureSetting"),
            "{message}"
        );

        // No verdict yet: what the listener had stays, and nothing is invented.
        let mut unknown = Http3ListenerStatus::default();
        set_condition(&mut unknown, None, Some(&now), t(400), Some(3));
        assert_eq!(condition(&unknown), condition(&now));
        let mut fresh = Http3ListenerStatus::default();
        set_condition(&mut fresh, None, None, t(400), Some(3));
        assert!(fresh.conditions.is_empty());
    }

    #[test]
    fn long_field_lists_are_cut() {
        let many: Vec<String> = (0..12).map(|i| format!("spec.f{i}")).collect();
        let v = Verdict {
            kind: Kind::Outdated,
            served: Some(1),
            dropped: many,
            ignored: Vec::new(),
            upgrade_failed: None,
        };
        let (_, _, message) = condition_of(&v);
        assert!(
            message.contains("spec.f7 and 4 more from every listener"),
            "{message}"
        );
        let unreadable = condition_of(&Verdict::unreadable("403 Forbidden".into()));
        assert_eq!(
            (unreadable.0, unreadable.1),
            ("Unknown", reasons::CRD_UNREADABLE)
        );
    }
}
