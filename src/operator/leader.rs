//! Lease-based leader election (coordination.k8s.io/v1), so two operator replicas are safe:
//! only the holder of the Lease writes anything. The decision is a pure function; the loop
//! around it reads and writes the Lease with optimistic concurrency (resourceVersion), so two
//! candidates can never both win the same term.
//!
//! The Lease also tells other operators that this one runs and with which controller name
//! ([`super::ownership`]), so it is kept renewed even without election (`--no-leader-election`:
//! leadership is then unconditional and the Lease only a registration).

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, PostParams};
use kube::Client;
use tokio::sync::watch;

use super::labels;
use crate::api::annotations;

/// Timing as in client-go's defaults: a leader that cannot renew for `renew_deadline` steps
/// down before anyone else may take over at `lease_duration`.
#[derive(Debug, Clone)]
pub struct LeaseConfig {
    pub namespace: String,
    pub name: String,
    /// Unique per replica (pod name plus a random suffix).
    pub identity: String,
    /// The operator's controller name, annotated on the Lease for the other operators.
    pub controller_name: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

impl LeaseConfig {
    pub fn new(namespace: &str, name: &str, identity: &str, controller_name: &str) -> Self {
        Self {
            namespace: namespace.to_string(),
            name: name.to_string(),
            identity: identity.to_string(),
            controller_name: controller_name.to_string(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Nobody holds a valid lease: take it.
    Acquire,
    /// We hold it: renew it.
    Renew,
    /// Someone else holds a lease that has not expired.
    Follow { holder: String },
}

/// What to do with the Lease as it is now. Pure.
pub fn decide(spec: Option<&LeaseSpec>, me: &str, now: Timestamp) -> Decision {
    let Some(spec) = spec else {
        return Decision::Acquire;
    };
    let holder = spec.holder_identity.as_deref().unwrap_or_default();
    if holder.is_empty() {
        return Decision::Acquire;
    }
    if holder == me {
        return Decision::Renew;
    }
    let duration = SignedDuration::from_secs(spec.lease_duration_seconds.unwrap_or(0).into());
    let renewed = spec
        .renew_time
        .as_ref()
        .or(spec.acquire_time.as_ref())
        .map(|t| t.0);
    match renewed {
        Some(t) if t + duration > now => Decision::Follow {
            holder: holder.to_string(),
        },
        _ => Decision::Acquire,
    }
}

/// The Lease to write for an `Acquire` or `Renew` decision, keeping the resourceVersion of
/// `current` so the write fails if someone else wrote in between. Pure.
pub fn next_lease(
    current: Option<&Lease>,
    cfg: &LeaseConfig,
    decision: &Decision,
    now: Timestamp,
) -> Lease {
    let old = current.and_then(|l| l.spec.as_ref());
    let took_over = *decision == Decision::Acquire;
    let transitions = old.and_then(|s| s.lease_transitions).unwrap_or(0);
    let had_holder = old
        .and_then(|s| s.holder_identity.as_deref())
        .is_some_and(|h| !h.is_empty() && h != cfg.identity);
    Lease {
        metadata: ObjectMeta {
            name: Some(cfg.name.clone()),
            namespace: Some(cfg.namespace.clone()),
            resource_version: current.and_then(|l| l.metadata.resource_version.clone()),
            labels: Some(
                [
                    (labels::NAME, labels::NAME_VALUE),
                    (labels::COMPONENT, labels::COMPONENT_OPERATOR),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ),
            annotations: Some(
                [(
                    annotations::CONTROLLER_NAME.to_string(),
                    cfg.controller_name.clone(),
                )]
                .into_iter()
                .collect(),
            ),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(cfg.identity.clone()),
            lease_duration_seconds: Some(cfg.lease_duration.as_secs() as i32),
            acquire_time: if took_over {
                Some(MicroTime(now))
            } else {
                old.and_then(|s| s.acquire_time.clone())
            },
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(if took_over && had_holder {
                transitions + 1
            } else {
                transitions
            }),
            ..Default::default()
        }),
    }
}

/// One round: read the Lease, decide, write. Returns whether we hold the lease now.
pub async fn try_acquire_or_renew(
    api: &Api<Lease>,
    cfg: &LeaseConfig,
) -> Result<bool, kube::Error> {
    let current = api.get_opt(&cfg.name).await?;
    let now = Timestamp::now();
    let decision = decide(
        current.as_ref().and_then(|l| l.spec.as_ref()),
        &cfg.identity,
        now,
    );
    if let Decision::Follow { .. } = decision {
        return Ok(false);
    }
    let lease = next_lease(current.as_ref(), cfg, &decision, now);
    let written = match current {
        None => api.create(&PostParams::default(), &lease).await,
        Some(_) => api.replace(&cfg.name, &PostParams::default(), &lease).await,
    };
    match written {
        Ok(_) => Ok(true),
        // Someone else wrote first (409 Conflict / AlreadyExists): they won this round.
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

/// Gives the lease up on shutdown so the other replica need not wait for it to expire.
pub async fn release(api: &Api<Lease>, cfg: &LeaseConfig) -> Result<(), kube::Error> {
    let Some(mut current) = api.get_opt(&cfg.name).await? else {
        return Ok(());
    };
    let Some(spec) = current.spec.as_mut() else {
        return Ok(());
    };
    if spec.holder_identity.as_deref() != Some(cfg.identity.as_str()) {
        return Ok(());
    }
    spec.holder_identity = None;
    spec.lease_duration_seconds = Some(1);
    spec.renew_time = Some(MicroTime(Timestamp::now()));
    api.replace(&cfg.name, &PostParams::default(), &current)
        .await?;
    Ok(())
}

/// Publishes leadership only when it changes. Every watcher of the flag reacts to a send (the
/// controller re-reconciles every listener when it becomes leader), so a renewal every
/// `retry_period` must not look like news.
pub fn publish(tx: &watch::Sender<bool>, leader: bool) {
    tx.send_if_modified(|v| std::mem::replace(v, leader) != leader);
}

/// Runs the election until `shutdown` resolves, publishing leadership on `tx`. A leader that
/// fails to renew for `renew_deadline` steps down (sends `false`) before its lease can expire.
/// Without `elect` the Lease is only kept renewed (a registration) and nothing is published.
pub async fn run(
    client: Client,
    cfg: LeaseConfig,
    elect: bool,
    tx: watch::Sender<bool>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let api: Api<Lease> = Api::namespaced(client, &cfg.namespace);
    // Whether this replica holds the Lease (leadership when electing).
    let mut held = false;
    let mut last_renewed: Option<tokio::time::Instant> = None;
    tokio::pin!(shutdown);
    loop {
        match try_acquire_or_renew(&api, &cfg).await {
            Ok(true) => {
                if !held && elect {
                    tracing::info!(identity = %cfg.identity, lease = %cfg.name, "became leader");
                }
                held = true;
                last_renewed = Some(tokio::time::Instant::now());
            }
            Ok(false) => {
                if held && elect {
                    tracing::warn!(identity = %cfg.identity, "lost the lease to another replica");
                }
                held = false;
                last_renewed = None;
            }
            Err(e) => {
                tracing::warn!(error = %e, "leader election: cannot read or write the Lease");
                if last_renewed.is_some_and(|t| t.elapsed() >= cfg.renew_deadline) {
                    if elect {
                        tracing::warn!("could not renew the lease in time: stepping down");
                    }
                    held = false;
                    last_renewed = None;
                }
            }
        }
        if elect {
            publish(&tx, held);
        }
        tokio::select! {
            _ = &mut shutdown => break,
            _ = tokio::time::sleep(cfg.retry_period) => {}
        }
    }
    if elect {
        publish(&tx, false);
    }
    if held {
        if let Err(e) = release(&api, &cfg).await {
            tracing::warn!(error = %e, "could not release the lease");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    fn spec(holder: Option<&str>, renewed: i64) -> LeaseSpec {
        LeaseSpec {
            holder_identity: holder.map(str::to_string),
            lease_duration_seconds: Some(15),
            renew_time: Some(MicroTime(t(renewed))),
            lease_transitions: Some(4),
            ..Default::default()
        }
    }

    #[test]
    fn decisions() {
        assert_eq!(decide(None, "me", t(100)), Decision::Acquire);
        assert_eq!(
            decide(Some(&spec(None, 99)), "me", t(100)),
            Decision::Acquire
        );
        assert_eq!(
            decide(Some(&spec(Some("me"), 1)), "me", t(100)),
            Decision::Renew
        );
        assert_eq!(
            decide(Some(&spec(Some("other"), 90)), "me", t(100)),
            Decision::Follow {
                holder: "other".into()
            }
        );
        // Expired exactly at renew + duration.
        assert_eq!(
            decide(Some(&spec(Some("other"), 85)), "me", t(100)),
            Decision::Acquire
        );
        let mut no_time = spec(Some("other"), 0);
        no_time.renew_time = None;
        assert_eq!(decide(Some(&no_time), "me", t(100)), Decision::Acquire);
    }

    #[test]
    fn next_lease_counts_takeovers_and_keeps_the_resource_version() {
        let cfg = LeaseConfig::new("h3", "h3-ingress-operator", "me", "x.dev/op");
        let current = Lease {
            metadata: ObjectMeta {
                resource_version: Some("42".into()),
                ..Default::default()
            },
            spec: Some(spec(Some("other"), 1)),
        };
        let l = next_lease(Some(&current), &cfg, &Decision::Acquire, t(100));
        assert_eq!(l.metadata.resource_version.as_deref(), Some("42"));
        // What the other operators read: this one runs, with this controller name.
        let ann = l.metadata.annotations.clone().unwrap();
        assert_eq!(ann[annotations::CONTROLLER_NAME], "x.dev/op");
        let reg = super::super::ownership::registration(&l);
        assert_eq!(
            (
                reg.namespace.as_str(),
                reg.controller_name.as_str(),
                reg.renewed
            ),
            ("h3", "x.dev/op", Some(t(100)))
        );
        let s = l.spec.unwrap();
        assert_eq!(s.holder_identity.as_deref(), Some("me"));
        assert_eq!(s.lease_transitions, Some(5));
        assert_eq!(s.acquire_time.unwrap().0, t(100));
        assert_eq!(s.lease_duration_seconds, Some(15));

        let mine = Lease {
            spec: Some(LeaseSpec {
                acquire_time: Some(MicroTime(t(50))),
                ..spec(Some("me"), 90)
            }),
            ..current
        };
        let s = next_lease(Some(&mine), &cfg, &Decision::Renew, t(100))
            .spec
            .unwrap();
        assert_eq!(s.lease_transitions, Some(4));
        assert_eq!(s.acquire_time.unwrap().0, t(50));
        assert_eq!(s.renew_time.unwrap().0, t(100));

        let first = next_lease(None, &cfg, &Decision::Acquire, t(100));
        assert_eq!(first.spec.unwrap().lease_transitions, Some(0));
        assert_eq!(first.metadata.resource_version, None);
    }

    #[test]
    fn renewals_are_not_news_only_changes_are() {
        let (tx, mut rx) = watch::channel(false);
        rx.borrow_and_update();
        publish(&tx, false);
        assert!(!rx.has_changed().unwrap());
        publish(&tx, true);
        assert!(rx.has_changed().unwrap());
        assert!(*rx.borrow_and_update());
        for _ in 0..3 {
            publish(&tx, true);
        }
        assert!(!rx.has_changed().unwrap(), "a renewal woke the watchers");
        publish(&tx, false);
        assert!(rx.has_changed().unwrap());
    }
}
