//! One task per listener with `spec.advertise.dns`, fed by its reconciles with the hosts it
//! serves ([`Desired`]), running a [`Publisher`]. The I/O shell around [`super::listener`].
//!
//! A reconcile only hands the task what it wants ([`Advertisers::feed`]: a watch channel,
//! nothing happens when it is what the task has), so a reconcile never waits for the DNS
//! server and serving never depends on it. The task syncs when what it is given changes, and
//! at rest asks one SOA question per zone every [`Timing::recheck`] (to notice someone else
//! changing the zone) and sends no UPDATE. A failed attempt is retried after a back-off that
//! doubles up to [`Timing::backoff_max`], whatever changes meanwhile. Its [`State`] is read
//! by the next reconcile; the task asks for one ([`Advertisers::new`]'s `changed`) whenever
//! the state changes. When `advertise.dns` goes away (or becomes invalid, or the listener is
//! deleted) the task deletes every record it owns, then ends.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::Client;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::client::Server;
use super::listener::{self, Settings, State};
use super::plan::Owner;
use super::publish::{Publisher, Target};
use super::tsig::Key;
use crate::api::{reasons, TsigSecretRef};
use crate::operator::metrics::DnsMetrics;

/// What a listener's reconcile wants published.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Desired {
    /// `None`: withdraw every record and stop.
    pub settings: Option<Settings>,
    pub hosts: BTreeSet<String>,
    /// The listener's UDP port (`port=` in the record when not 443).
    pub port: u16,
}

pub type KeyFuture = Pin<Box<dyn Future<Output = Result<Vec<u8>, String>> + Send>>;

/// Where the TSIG secret comes from: the data of a Secret's key (base64, as key generators
/// print it).
pub trait KeySource: Send + Sync {
    fn read(&self, secret: &TsigSecretRef) -> KeyFuture;
}

/// The Secret in the operator's namespace, read with a GET when a task starts and after the
/// server refused the key (so a rotated key is picked up on the next retry).
pub struct KubeKeys {
    pub client: Client,
    pub namespace: String,
}

impl KeySource for KubeKeys {
    fn read(&self, r: &TsigSecretRef) -> KeyFuture {
        let api = Api::<Secret>::namespaced(self.client.clone(), &self.namespace);
        let (ns, name, key) = (self.namespace.clone(), r.name.clone(), r.key.clone());
        Box::pin(async move {
            let secret = api
                .get_opt(&name)
                .await
                .map_err(|e| format!("Secret {ns}/{name}: {e}"))?
                .ok_or_else(|| format!("Secret {ns}/{name} not found"))?;
            let data = secret.data.unwrap_or_default();
            let value = data
                .get(&key)
                .ok_or_else(|| format!("Secret {ns}/{name} has no key {key:?}"))?;
            Ok(value.0.clone())
        })
    }
}

/// How long a task waits.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    pub backoff_min: Duration,
    pub backoff_max: Duration,
    /// How often a task at rest asks each zone's serial.
    pub recheck: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            backoff_min: Duration::from_secs(1),
            backoff_max: Duration::from_secs(300),
            recheck: Duration::from_secs(60),
        }
    }
}

type Changed = Arc<dyn Fn(&str) + Send + Sync>;

struct Shared {
    keys: Arc<dyn KeySource>,
    changed: Changed,
    owner: String,
    timing: Timing,
    metrics: DnsMetrics,
}

struct Running {
    tx: watch::Sender<Desired>,
    state: Arc<Mutex<Option<State>>>,
    task: JoinHandle<()>,
}

/// Every listener's task.
pub struct Advertisers {
    shared: Arc<Shared>,
    running: Mutex<BTreeMap<String, Running>>,
}

impl Advertisers {
    /// `owner`: who the registry records name (two installs never take each other's);
    /// `changed`: called with a listener's name when its [`State`] changed; `metrics`: where
    /// every task counts its UPDATEs and failures.
    pub fn new(
        keys: Arc<dyn KeySource>,
        changed: Changed,
        owner: &str,
        timing: Timing,
        metrics: DnsMetrics,
    ) -> Advertisers {
        Advertisers {
            shared: Arc::new(Shared {
                keys,
                changed,
                owner: owner.to_string(),
                timing,
                metrics,
            }),
            running: Mutex::new(BTreeMap::new()),
        }
    }

    /// UPDATE messages sent by every task so far.
    pub fn updates_sent(&self) -> u64 {
        self.shared.metrics.updates.get()
    }

    /// Hands `listener`'s task what it should publish (starting the task if needed). Costs
    /// nothing when the task has it already.
    pub fn feed(&self, listener: &str, desired: Desired) {
        let mut running = self.running.lock().expect("not poisoned");
        if let Some(r) = running.get(listener).filter(|r| !r.task.is_finished()) {
            r.tx.send_if_modified(|d| {
                let changed = *d != desired;
                *d = desired.clone();
                changed
            });
            return;
        }
        let Some(settings) = &desired.settings else {
            return;
        };
        let state = Arc::new(Mutex::new(Some(State::pending(settings))));
        let (tx, rx) = watch::channel(desired);
        let task = tokio::spawn(run(
            listener.to_string(),
            rx,
            state.clone(),
            self.shared.clone(),
        ));
        running.insert(listener.to_string(), Running { tx, state, task });
    }

    /// What `listener`'s task last achieved.
    pub fn state(&self, listener: &str) -> Option<State> {
        let running = self.running.lock().expect("not poisoned");
        running
            .get(listener)
            .and_then(|r| r.state.lock().expect("not poisoned").clone())
    }

    /// Withdraws the records of listeners that are gone (`alive` says which still exist).
    /// It asks only about the listeners that publish records, so a reconcile pays for those,
    /// not for every listener in the cluster.
    pub fn withdraw_gone(&self, alive: impl Fn(&str) -> bool) {
        let gone: Vec<String> = {
            let running = self.running.lock().expect("not poisoned");
            running.keys().filter(|l| !alive(l)).cloned().collect()
        };
        for l in gone {
            self.feed(&l, Desired::default());
            let mut running = self.running.lock().expect("not poisoned");
            if running.get(&l).is_some_and(|r| r.task.is_finished()) {
                running.remove(&l);
            }
        }
    }

    /// Stops every task without withdrawing anything (leadership lost: the new leader
    /// adopts the records).
    pub fn stop_all(&self) {
        let mut running = self.running.lock().expect("not poisoned");
        for (_, r) in std::mem::take(&mut *running) {
            r.task.abort();
        }
    }
}

impl Drop for Advertisers {
    fn drop(&mut self) {
        self.stop_all();
    }
}

/// One listener's task, until told to withdraw (or its sender is gone).
async fn run(
    listener: String,
    mut rx: watch::Receiver<Desired>,
    state: Arc<Mutex<Option<State>>>,
    shared: Arc<Shared>,
) {
    let mut task = Task {
        listener,
        state,
        shared,
        publisher: None,
        backoff: Duration::ZERO,
    };
    loop {
        let desired = rx.borrow_and_update().clone();
        let Some(settings) = desired.settings.clone() else {
            task.withdraw().await;
            return;
        };
        if task.publisher.as_ref().is_some_and(|(s, _)| *s != settings) {
            // Another server, zones or key: what the old one published goes first (one try:
            // the old server may be the one that never answered).
            task.withdraw_from_old(1).await;
            task.set(|st| *st = State::pending(&settings));
        }
        if let Err((reason, message)) = task.attempt(&settings, &desired).await {
            task.shared.metrics.failed(reason);
            task.set(|st| st.failed(reason, message));
            task.wait_backoff().await;
            continue;
        }
        task.backoff = Duration::ZERO;
        if !task.rest(&mut rx).await {
            return;
        }
    }
}

struct Task {
    listener: String,
    state: Arc<Mutex<Option<State>>>,
    shared: Arc<Shared>,
    publisher: Option<(Settings, Publisher)>,
    backoff: Duration,
}

impl Task {
    /// Changes the state; asks for a reconcile when that changed it.
    fn set(&self, f: impl FnOnce(&mut State)) {
        let changed = {
            let mut guard = self.state.lock().expect("not poisoned");
            let Some(st) = guard.as_mut() else { return };
            let before = st.clone();
            f(st);
            *st != before
        };
        if changed {
            (self.shared.changed)(&self.listener);
        }
    }

    async fn wait_backoff(&mut self) {
        let t = self.shared.timing;
        self.backoff = (self.backoff * 2).clamp(t.backoff_min, t.backoff_max);
        tokio::time::sleep(self.backoff).await;
    }

    /// One sync of the zones to `desired`.
    async fn attempt(
        &mut self,
        settings: &Settings,
        desired: &Desired,
    ) -> Result<(), (&'static str, String)> {
        if self.publisher.is_none() {
            let data = (self.shared.keys.read(&settings.secret).await)
                .map_err(|e| (reasons::TSIG_KEY_UNAVAILABLE, e))?;
            let secret = listener::secret_bytes(&data).map_err(|e| {
                let r = &settings.secret;
                (
                    reasons::TSIG_KEY_UNAVAILABLE,
                    format!("Secret {} key {:?}: {e}", r.name, r.key),
                )
            })?;
            let target = Target {
                server: Server {
                    address: settings.server.clone(),
                    key: Key::new(settings.key_name.clone(), settings.algorithm, &secret),
                },
                zones: settings.zones.clone(),
                owner: Owner {
                    id: self.shared.owner.clone(),
                    listener: self.listener.clone(),
                },
            };
            self.publisher = Some((settings.clone(), Publisher::new(target)));
        }
        let (want, bad) = listener::want(&desired.hosts, desired.port, settings.ttl);
        let (_, publisher) = self.publisher.as_mut().expect("made above");
        match publisher.sync(&want).await {
            Ok(report) => {
                self.shared.metrics.updates.inc_by(report.updates as u64);
                self.set(|st| st.synced(&report, &bad, Timestamp::now()));
                Ok(())
            }
            Err(e) => {
                let reason = listener::reason_of(&e);
                if reason == reasons::TSIG_REFUSED {
                    // Read the Secret again next time: the key may have been rotated.
                    self.publisher = None;
                }
                Err((reason, e.to_string()))
            }
        }
    }

    /// Waits at rest until what is wanted changes (true) or the sender is gone (false);
    /// meanwhile checks the zones' serials, and returns (true) to sync again when someone
    /// else changed a zone.
    async fn rest(&mut self, rx: &mut watch::Receiver<Desired>) -> bool {
        loop {
            tokio::select! {
                r = rx.changed() => return r.is_ok(),
                () = tokio::time::sleep(self.shared.timing.recheck) => {}
            }
            let Some((_, publisher)) = self.publisher.as_mut() else {
                return true;
            };
            match publisher.check().await {
                Ok(true) => {}
                Ok(false) => return true,
                Err(e) => {
                    let reason = listener::reason_of(&e);
                    self.shared.metrics.failed(reason);
                    self.set(|st| st.failed(reason, e.to_string()));
                    self.wait_backoff().await;
                    return true;
                }
            }
        }
    }

    /// Deletes every record of ours (best effort: tried three times with back-off), and
    /// says so.
    async fn withdraw(&mut self) {
        let withdrawn = self.withdraw_from_old(3).await;
        self.set(|st| {
            let message = if withdrawn {
                "spec.advertise.dns is gone: every record of this listener was withdrawn"
            } else {
                "spec.advertise.dns is gone, but the server did not take the deletions: \
                 records of this listener may remain"
            };
            st.failed(reasons::DISABLED, message.to_string());
            st.published = 0;
        });
    }

    async fn withdraw_from_old(&mut self, tries: usize) -> bool {
        let Some((_, mut publisher)) = self.publisher.take() else {
            return true;
        };
        for i in 0..tries {
            if i > 0 {
                self.wait_backoff().await;
            }
            match publisher.sync(&BTreeMap::new()).await {
                Ok(report) => {
                    self.shared.metrics.updates.inc_by(report.updates as u64);
                    return true;
                }
                Err(e) => {
                    tracing::warn!(listener = %self.listener, error = %e, "cannot withdraw DNS records");
                }
            }
        }
        false
    }
}
