//! Kubernetes mode (`proxy --listener NAME`): watch the `Http3Listener`, the Ingresses (and
//! which IngressClass is the default), the Gateway API's Gateways, HTTPRoutes and
//! ReferenceGrants where they are installed, and only the Secrets they reference, and send a new
//! [`ProxyConfig`] whenever they change. A spec that cannot be used is sent as [`ConfigUpdate::Invalid`], once per version, exactly as
//! the file source does with a bad file. If the API server goes away nothing is sent, so the
//! proxy keeps serving the last good configuration.
//!
//! The decision of what to send is the pure [`step`] and [`Reported::update`];
//! [`watch_listener`] is the I/O around them.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Client;
use tokio::sync::{mpsc, Notify};
use tokio::task::JoinHandle;
use tracing::{info, warn};

use super::ConfigUpdate;
use crate::api::{Http3Listener, SecretRef};
use crate::config::gateway::GatewayObjects;
use crate::config::kube::{
    default_class, from_objects, referenced_secrets, with_default_class, SecretMap,
};
use crate::config::ProxyConfig;
use crate::gateway_api::GatewayApiWatch;

/// Certificates expire without any watch event: re-evaluate this often regardless.
pub const RECHECK: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error("listener name {0:?} is empty")]
    NoName(String),
}

/// What the watches have seen so far.
pub struct Snapshot<'a> {
    /// Whether the listener and Ingress lists have completed once.
    pub synced: bool,
    pub listener: Option<&'a Http3Listener>,
    pub ingresses: &'a [Arc<Ingress>],
    /// Empty where the Gateway API is not installed.
    pub gateway_api: &'a GatewayObjects,
    pub secrets: &'a SecretMap,
    /// Referenced Secrets whose first list has not completed yet (within [`SECRET_WAIT`]).
    pub secrets_pending: usize,
}

#[derive(Debug)]
pub enum Step {
    /// Not all inputs have arrived yet; sending now would drop hosts for a moment.
    Wait,
    /// Inputs are complete but not usable; the running config stays (the text says why).
    Keep(String),
    /// Inputs give the configuration already sent.
    Unchanged,
    Send(Box<ProxyConfig>),
}

/// Identifies a configuration: the `Debug` form covers every setting, each host's name,
/// expiry and certificate hash, and the host reports, and is deterministic (sorted maps).
pub fn fingerprint(c: &ProxyConfig) -> String {
    format!("{c:?}")
}

/// Decides what to send, given the inputs and the fingerprint of what was sent last. Pure.
pub fn step(s: &Snapshot<'_>, last: Option<&str>, now_unix: i64) -> Step {
    if !s.synced {
        return Step::Wait;
    }
    let Some(listener) = s.listener else {
        return Step::Keep("the Http3Listener does not exist (deleted?)".into());
    };
    if s.secrets_pending > 0 {
        return Step::Wait;
    }
    match from_objects(
        listener,
        s.ingresses.iter().map(|i| i.as_ref()),
        s.gateway_api,
        s.secrets,
        now_unix,
    ) {
        Err(e) => Step::Keep(format!("invalid Http3Listener spec: {e}")),
        Ok(c) => {
            if last == Some(fingerprint(&c).as_str()) {
                Step::Unchanged
            } else {
                Step::Send(Box::new(c))
            }
        }
    }
}

/// What the source has told the proxy, so each configuration and each rejection is sent once.
#[derive(Debug, Default)]
pub struct Reported {
    /// Fingerprint of the last configuration sent.
    pub config: Option<String>,
    /// The rejection last sent: the listener's generation and why.
    rejected: Option<(Option<i64>, String)>,
}

impl Reported {
    /// The update `step` calls for, if any, remembered as sent. A rejection is sent once per
    /// version of the listener's spec (its `metadata.generation`) and reason, as a file
    /// source sends one per reload: re-evaluating the same spec (a timer, an unrelated
    /// Ingress) does not count it again.
    pub fn update(&mut self, step: Step, generation: Option<i64>) -> Option<ConfigUpdate> {
        match step {
            Step::Wait => None,
            Step::Unchanged => {
                self.rejected = None;
                None
            }
            Step::Keep(why) => {
                let key = (generation, why);
                if self.rejected.as_ref() == Some(&key) {
                    return None;
                }
                let why = key.1.clone();
                self.rejected = Some(key);
                Some(ConfigUpdate::Invalid(why))
            }
            Step::Send(c) => {
                self.rejected = None;
                self.config = Some(fingerprint(&c));
                Some(ConfigUpdate::Apply(c))
            }
        }
    }
}

/// How long a new Secret watch may take to list before the host is treated as missing. It
/// covers the moment between a new Ingress and the operator granting access to its Secret
/// (the watch retries with backoff meanwhile), without letting one unreadable Secret hold
/// every other change back forever.
pub const SECRET_WAIT: Duration = Duration::from_secs(30);

/// One watched Secret: known once its first list completed; `None` when it does not exist.
struct SecretSlot {
    synced: bool,
    secret: Option<Secret>,
    since: tokio::time::Instant,
}

impl SecretSlot {
    fn new() -> Self {
        Self {
            synced: false,
            secret: None,
            since: tokio::time::Instant::now(),
        }
    }

    fn pending(&self) -> bool {
        !self.synced && self.since.elapsed() < SECRET_WAIT
    }
}

type Slots = Arc<Mutex<BTreeMap<SecretRef, SecretSlot>>>;

/// Watches exactly one Secret by name (a `metadata.name` field selector, which is what the
/// per-name Role allows for list and watch).
fn watch_secret(
    client: Client,
    r: SecretRef,
    slots: Slots,
    changed: Arc<Notify>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let api: Api<Secret> = Api::namespaced(client, &r.namespace);
        let cfg = watcher::Config::default().fields(&format!("metadata.name={}", r.name));
        let mut events = watcher(api, cfg).default_backoff().boxed();
        let mut listed: Option<Secret> = None;
        while let Some(ev) = events.next().await {
            let ev = match ev {
                Ok(ev) => ev,
                Err(e) => {
                    warn!(secret = %format!("{}/{}", r.namespace, r.name), error = %e, "Secret watch (retrying)");
                    // Wakes the loop so SECRET_WAIT is noticed without a watch event.
                    changed.notify_one();
                    continue;
                }
            };
            let mut slots = slots.lock().expect("not poisoned");
            let Some(slot) = slots.get_mut(&r) else { break };
            match ev {
                watcher::Event::Init => listed = None,
                watcher::Event::InitApply(s) => listed = Some(s),
                watcher::Event::InitDone => {
                    slot.secret = listed.take();
                    slot.synced = true;
                }
                watcher::Event::Apply(s) => slot.secret = Some(s),
                watcher::Event::Delete(_) => slot.secret = None,
            }
            drop(slots);
            changed.notify_one();
        }
    })
}

/// Drives a reflector, flagging when its first list completed and notifying on every change.
fn drive<K>(
    stream: impl futures_util::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
    what: &'static str,
    synced: Arc<AtomicBool>,
    changed: Arc<Notify>,
) -> JoinHandle<()>
where
    K: Send + 'static,
{
    tokio::spawn(async move {
        let mut stream = Box::pin(stream);
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(watcher::Event::InitDone) => synced.store(true, Ordering::Release),
                Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => continue,
                Ok(_) => {}
                Err(e) => {
                    warn!(watch = what, error = %e, "watch failed (retrying with backoff)");
                    continue;
                }
            }
            changed.notify_one();
        }
    })
}

/// The watches of one listener: its object, every Ingress, the IngressClasses (which one is
/// the default), and the Secrets they reference. Dropping it stops them all.
struct Watches {
    client: Client,
    key: ObjectRef<Http3Listener>,
    listeners: Store<Http3Listener>,
    ingresses: Store<Ingress>,
    classes: Store<IngressClass>,
    listener_synced: Arc<AtomicBool>,
    ingress_synced: Arc<AtomicBool>,
    class_synced: Arc<AtomicBool>,
    gateway_api: GatewayApiWatch,
    /// Notified on every change of any watched object.
    changed: Arc<Notify>,
    slots: Slots,
    tasks: Vec<JoinHandle<()>>,
    secret_tasks: BTreeMap<SecretRef, JoinHandle<()>>,
}

impl Drop for Watches {
    fn drop(&mut self) {
        for t in self.tasks.iter().chain(self.secret_tasks.values()) {
            t.abort();
        }
    }
}

impl Watches {
    /// Starts the listener and Ingress watches; Secret watches follow in [`Self::follow_secrets`].
    fn start(client: Client, listener: &str) -> Self {
        let changed = Arc::new(Notify::new());
        let listener_synced = Arc::new(AtomicBool::new(false));
        let ingress_synced = Arc::new(AtomicBool::new(false));
        let class_synced = Arc::new(AtomicBool::new(false));
        let (listeners, lw) = reflector::store::<Http3Listener>();
        let (ingresses, iw) = reflector::store::<Ingress>();
        let (classes, cw) = reflector::store::<IngressClass>();
        let by_name = watcher::Config::default().fields(&format!("metadata.name={listener}"));
        let lstream = reflector::reflector(
            lw,
            watcher(Api::<Http3Listener>::all(client.clone()), by_name),
        )
        .default_backoff();
        let istream = reflector::reflector(
            iw,
            watcher(
                Api::<Ingress>::all(client.clone()),
                watcher::Config::default(),
            ),
        )
        .default_backoff();
        let cstream = reflector::reflector(
            cw,
            watcher(
                Api::<IngressClass>::all(client.clone()),
                watcher::Config::default(),
            ),
        )
        .default_backoff();
        let tasks = vec![
            drive(
                lstream,
                "Http3Listener",
                listener_synced.clone(),
                changed.clone(),
            ),
            drive(istream, "Ingress", ingress_synced.clone(), changed.clone()),
            drive(
                cstream,
                "IngressClass",
                class_synced.clone(),
                changed.clone(),
            ),
        ];
        let notify = changed.clone();
        let gateway_api = GatewayApiWatch::start(&client, Arc::new(move |_| notify.notify_one()));
        Self {
            gateway_api,
            client,
            key: ObjectRef::new(listener),
            listeners,
            ingresses,
            classes,
            listener_synced,
            ingress_synced,
            class_synced,
            changed,
            slots: Arc::default(),
            tasks,
            secret_tasks: BTreeMap::new(),
        }
    }

    fn synced(&self) -> bool {
        [
            &self.listener_synced,
            &self.ingress_synced,
            &self.class_synced,
        ]
        .iter()
        .all(|f| f.load(Ordering::Acquire))
            && self.gateway_api.synced()
    }

    /// Every Ingress, those without a class counted as the default class's (as the operator
    /// counts them).
    fn ingresses(&self) -> Vec<Arc<Ingress>> {
        let classes = self.classes.state();
        let default = default_class(classes.iter().map(|c| c.as_ref()));
        with_default_class(&self.ingresses.state(), default.as_deref())
    }

    /// Follows the set of referenced Secrets: starts watches for new ones, stops old ones.
    fn follow_secrets(
        &mut self,
        listener: &Http3Listener,
        ingresses: &[Arc<Ingress>],
        gateway_api: &GatewayObjects,
    ) {
        let wanted: BTreeSet<SecretRef> =
            referenced_secrets(listener, ingresses.iter().map(|i| i.as_ref()), gateway_api);
        let mut slots = self.slots.lock().expect("not poisoned");
        slots.retain(|r, _| wanted.contains(r));
        self.secret_tasks.retain(|r, t| {
            let keep = wanted.contains(r);
            if !keep {
                t.abort();
            }
            keep
        });
        for r in wanted {
            if let std::collections::btree_map::Entry::Vacant(e) =
                self.secret_tasks.entry(r.clone())
            {
                slots.insert(r.clone(), SecretSlot::new());
                let (client, slots, changed) = (
                    self.client.clone(),
                    self.slots.clone(),
                    self.changed.clone(),
                );
                e.insert(watch_secret(client, r, slots, changed));
            }
        }
    }

    /// The Secrets known so far and how many are still being listed.
    fn secrets(&self) -> (SecretMap, usize) {
        let s = self.slots.lock().expect("not poisoned");
        let map: SecretMap = s
            .iter()
            .filter_map(|(r, slot)| {
                let sec = slot.secret.clone()?;
                Some(((r.namespace.clone(), r.name.clone()), sec))
            })
            .collect();
        (map, s.values().filter(|slot| slot.pending()).count())
    }

    /// Evaluates the watched objects now: the update to send, if any.
    fn evaluate(&mut self, reported: &mut Reported) -> Option<ConfigUpdate> {
        let synced = self.synced();
        let current = self.listeners.get(&self.key);
        let all_ingresses = self.ingresses();
        let gateway_api = self.gateway_api.objects();
        if let (true, Some(l)) = (synced, current.as_deref()) {
            // Version skew: fields a newer CRD added are read past, and said once.
            crate::skew::note_unknown_fields(l);
            self.follow_secrets(l, &all_ingresses, &gateway_api);
        }
        let (secrets, pending) = self.secrets();
        let snapshot = Snapshot {
            synced,
            listener: current.as_deref(),
            ingresses: &all_ingresses,
            gateway_api: &gateway_api,
            secrets: &secrets,
            secrets_pending: pending,
        };
        let now = crate::config::file::unix_now();
        let step = step(&snapshot, reported.config.as_deref(), now);
        let generation = current.as_deref().and_then(|l| l.metadata.generation);
        reported.update(step, generation)
    }
}

/// Watches the listener `listener`, the Ingresses and the referenced Secrets, and sends every
/// new configuration, and every new reason none can be built, on `tx`. Returns when the
/// receiver is dropped.
pub async fn watch_listener(
    client: Client,
    listener: String,
    tx: mpsc::Sender<ConfigUpdate>,
) -> Result<(), WatchError> {
    if listener.is_empty() {
        return Err(WatchError::NoName(listener));
    }
    let mut watches = Watches::start(client, &listener);
    let mut reported = Reported::default();
    loop {
        tokio::select! {
            _ = watches.changed.notified() => {}
            _ = tokio::time::sleep(RECHECK) => {}
            _ = tx.closed() => return Ok(()),
        }
        let Some(update) = watches.evaluate(&mut reported) else {
            continue;
        };
        if let ConfigUpdate::Apply(c) = &update {
            info!(
                listener = %listener,
                hosts = c.hosts.len(),
                wanted = c.host_reports.len(),
                "new configuration from Kubernetes"
            );
        }
        if tx.send(update).await.is_err() {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{annotations, Http3ListenerSpec};
    use k8s_openapi::api::networking::v1::{IngressSpec, IngressTLS};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use k8s_openapi::ByteString;

    fn now() -> i64 {
        crate::config::file::unix_now()
    }

    fn none() -> &'static GatewayObjects {
        static NONE: std::sync::OnceLock<GatewayObjects> = std::sync::OnceLock::new();
        NONE.get_or_init(GatewayObjects::default)
    }

    fn listener() -> Http3Listener {
        let spec: Http3ListenerSpec = serde_json::from_value(serde_json::json!({
            "ingressClassName": "nginx", "upstream": {"address": "10.0.0.1:443"}
        }))
        .unwrap();
        Http3Listener::new("public", spec)
    }

    fn ingress() -> Arc<Ingress> {
        Arc::new(Ingress {
            metadata: ObjectMeta {
                namespace: Some("shop".into()),
                name: Some("web".into()),
                annotations: Some(
                    [(annotations::ENABLED.to_string(), "true".to_string())]
                        .into_iter()
                        .collect(),
                ),
                ..Default::default()
            },
            spec: Some(IngressSpec {
                ingress_class_name: Some("nginx".into()),
                tls: Some(vec![IngressTLS {
                    hosts: Some(vec!["a.example.com".into()]),
                    secret_name: Some("web-tls".into()),
                }]),
                ..Default::default()
            }),
            status: None,
        })
    }

    fn secrets() -> SecretMap {
        let ck = rcgen::generate_simple_self_signed(vec!["a.example.com".to_string()]).unwrap();
        let s = Secret {
            data: Some(
                [
                    (
                        "tls.crt".to_string(),
                        ByteString(ck.cert.pem().into_bytes()),
                    ),
                    (
                        "tls.key".to_string(),
                        ByteString(ck.signing_key.serialize_pem().into_bytes()),
                    ),
                ]
                .into_iter()
                .collect(),
            ),
            ..Default::default()
        };
        [(("shop".to_string(), "web-tls".to_string()), s)]
            .into_iter()
            .collect()
    }

    #[test]
    fn waits_for_complete_inputs_sends_once_and_keeps_the_last_good_config() {
        let l = listener();
        let ings = [ingress()];
        let sec = secrets();
        fn snap<'a>(
            synced: bool,
            listener: Option<&'a Http3Listener>,
            pending: usize,
            ingresses: &'a [Arc<Ingress>],
            secrets: &'a SecretMap,
        ) -> Snapshot<'a> {
            Snapshot {
                synced,
                listener,
                ingresses,
                gateway_api: none(),
                secrets,
                secrets_pending: pending,
            }
        }
        let snap = |synced, listener, pending| snap(synced, listener, pending, &ings, &sec);
        assert!(matches!(
            step(&snap(false, Some(&l), 0), None, now()),
            Step::Wait
        ));
        assert!(matches!(
            step(&snap(true, Some(&l), 1), None, now()),
            Step::Wait
        ));
        let Step::Send(c) = step(&snap(true, Some(&l), 0), None, now()) else {
            panic!("expected a config")
        };
        assert!(c.hosts.lookup("a.example.com").is_some());
        let fp = fingerprint(&c);
        assert!(matches!(
            step(&snap(true, Some(&l), 0), Some(&fp), now()),
            Step::Unchanged
        ));
        assert!(
            matches!(step(&snap(true, None, 0), Some(&fp), now()), Step::Keep(m) if m.contains("does not exist"))
        );
        let mut bad = l.clone();
        bad.spec.upstream.address = "x".into();
        assert!(
            matches!(step(&snap(true, Some(&bad), 0), Some(&fp), now()), Step::Keep(m) if m.contains("spec.upstream.address"))
        );

        // A new certificate is a new configuration.
        let other = secrets();
        let s2 = Snapshot {
            secrets: &other,
            ..snap(true, Some(&l), 0)
        };
        assert!(matches!(step(&s2, Some(&fp), now()), Step::Send(_)));
        // So is the passage of time past the certificate's expiry.
        let far = c.hosts.lookup("a.example.com").unwrap().not_after + 1;
        let Step::Send(expired) = step(&snap(true, Some(&l), 0), Some(&fp), far) else {
            panic!("expiry must produce a new config")
        };
        assert!(expired.hosts.is_empty());
        assert_eq!(
            expired.host_reports[0].reason,
            crate::api::reasons::CERTIFICATE_INVALID
        );
    }

    #[test]
    fn each_rejection_is_reported_once_per_spec_version_and_reason() {
        let mut r = Reported::default();
        let keep = |why: &str| Step::Keep(why.to_string());
        let invalid = |u: Option<ConfigUpdate>| matches!(u, Some(ConfigUpdate::Invalid(_)));
        assert!(invalid(r.update(keep("spec: x"), Some(2))));
        // Re-evaluating the same spec (the timer, an unrelated Ingress) sends nothing.
        assert!(r.update(keep("spec: x"), Some(2)).is_none());
        assert!(r.update(Step::Wait, Some(2)).is_none());
        assert!(r.update(keep("spec: x"), Some(2)).is_none());
        // An edited spec that is still broken, or broken differently, is a new rejection.
        assert!(invalid(r.update(keep("spec: x"), Some(3))));
        assert!(invalid(r.update(keep("spec: y"), Some(3))));

        let Step::Send(c) = step(
            &Snapshot {
                synced: true,
                listener: Some(&listener()),
                ingresses: &[ingress()],
                gateway_api: none(),
                secrets: &secrets(),
                secrets_pending: 0,
            },
            None,
            now(),
        ) else {
            panic!("expected a config")
        };
        let fp = fingerprint(&c);
        assert!(matches!(
            r.update(Step::Send(c), Some(4)),
            Some(ConfigUpdate::Apply(_))
        ));
        assert_eq!(r.config.as_deref(), Some(fp.as_str()));
        // Deleted, back unchanged, deleted again: two rejections.
        let gone = "the Http3Listener does not exist (deleted?)";
        assert!(invalid(r.update(keep(gone), None)));
        assert!(r.update(Step::Unchanged, Some(4)).is_none());
        assert!(invalid(r.update(keep(gone), None)));
    }
}
