//! The data plane's Kubernetes mode (`h3-ingress proxy --listener NAME`): watch its
//! `Http3Listener`, the Ingresses, and only the Secrets they reference, and send a new
//! [`ProxyConfig`] whenever they change. If the API server goes away nothing is sent, so the
//! proxy keeps serving the last good configuration.
//!
//! The decision of what to send is the pure [`step`]; [`watch_listener`] is the I/O around it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Client;
use tokio::sync::{mpsc, Notify};
use tokio::task::JoinHandle;

use crate::api::{Http3Listener, SecretRef};
use crate::config::kube::{from_objects, referenced_secrets, SecretMap};
use crate::config::ProxyConfig;

/// Certificates expire without any watch event: re-evaluate this often regardless.
pub const RECHECK: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("listener name {0:?} is empty")]
    NoName(String),
}

/// What the watches have seen so far.
pub struct Snapshot<'a> {
    /// Whether the listener and Ingress lists have completed once.
    pub synced: bool,
    pub listener: Option<&'a Http3Listener>,
    pub ingresses: &'a [Arc<Ingress>],
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
                    tracing::warn!(secret = %format!("{}/{}", r.namespace, r.name), error = %e, "Secret watch (retrying)");
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
                    tracing::warn!(watch = what, error = %e, "watch failed (retrying with backoff)");
                    continue;
                }
            }
            changed.notify_one();
        }
    })
}

/// Aborts the watch tasks when `watch_listener` returns or is dropped.
struct Tasks(Vec<JoinHandle<()>>, BTreeMap<SecretRef, JoinHandle<()>>);

impl Drop for Tasks {
    fn drop(&mut self) {
        for t in self.0.iter().chain(self.1.values()) {
            t.abort();
        }
    }
}

/// Watches the listener `listener`, the Ingresses and the referenced Secrets, and sends every
/// new valid configuration on `tx`. Returns when the receiver is dropped.
pub async fn watch_listener(
    client: Client,
    listener: String,
    tx: mpsc::Sender<ProxyConfig>,
) -> Result<(), Error> {
    if listener.is_empty() {
        return Err(Error::NoName(listener));
    }
    let changed = Arc::new(Notify::new());
    let listener_synced = Arc::new(AtomicBool::new(false));
    let ingress_synced = Arc::new(AtomicBool::new(false));

    let (listeners, lw) = reflector::store::<Http3Listener>();
    let (ingresses, iw): (Store<Ingress>, _) = reflector::store();
    let lstream = reflector::reflector(
        lw,
        watcher(
            Api::<Http3Listener>::all(client.clone()),
            watcher::Config::default().fields(&format!("metadata.name={listener}")),
        ),
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
    let mut tasks = Tasks(
        vec![
            drive(
                lstream,
                "Http3Listener",
                listener_synced.clone(),
                changed.clone(),
            ),
            drive(istream, "Ingress", ingress_synced.clone(), changed.clone()),
        ],
        BTreeMap::new(),
    );
    let slots: Slots = Arc::default();
    let key = ObjectRef::<Http3Listener>::new(&listener);
    let mut last: Option<String> = None;
    let mut last_keep: Option<String> = None;

    loop {
        tokio::select! {
            _ = changed.notified() => {}
            _ = tokio::time::sleep(RECHECK) => {}
            _ = tx.closed() => return Ok(()),
        }
        let synced =
            listener_synced.load(Ordering::Acquire) && ingress_synced.load(Ordering::Acquire);
        let current = listeners.get(&key);
        let all_ingresses = ingresses.state();

        // Follow the set of referenced Secrets: start watches for new ones, stop old ones.
        if let (true, Some(l)) = (synced, current.as_deref()) {
            let wanted: BTreeSet<SecretRef> =
                referenced_secrets(l, all_ingresses.iter().map(|i| i.as_ref()));
            let mut s = slots.lock().expect("not poisoned");
            s.retain(|r, _| wanted.contains(r));
            tasks.1.retain(|r, t| {
                let keep = wanted.contains(r);
                if !keep {
                    t.abort();
                }
                keep
            });
            for r in wanted {
                if let std::collections::btree_map::Entry::Vacant(e) = tasks.1.entry(r.clone()) {
                    s.insert(r.clone(), SecretSlot::new());
                    e.insert(watch_secret(
                        client.clone(),
                        r,
                        slots.clone(),
                        changed.clone(),
                    ));
                }
            }
        }

        let (secrets, pending) = {
            let s = slots.lock().expect("not poisoned");
            let map: SecretMap = s
                .iter()
                .filter_map(|(r, slot)| {
                    slot.secret
                        .clone()
                        .map(|sec| ((r.namespace.clone(), r.name.clone()), sec))
                })
                .collect();
            (map, s.values().filter(|slot| slot.pending()).count())
        };
        let snapshot = Snapshot {
            synced,
            listener: current.as_deref(),
            ingresses: &all_ingresses,
            secrets: &secrets,
            secrets_pending: pending,
        };
        match step(&snapshot, last.as_deref(), crate::config::file::unix_now()) {
            Step::Wait | Step::Unchanged => {}
            Step::Keep(why) => {
                if last_keep.as_deref() != Some(why.as_str()) {
                    tracing::warn!(listener = %listener, "keeping the running configuration: {why}");
                    last_keep = Some(why);
                }
            }
            Step::Send(c) => {
                last_keep = None;
                let fp = fingerprint(&c);
                tracing::info!(
                    listener = %listener,
                    hosts = c.hosts.len(),
                    wanted = c.host_reports.len(),
                    "new configuration from Kubernetes"
                );
                if tx.send(*c).await.is_err() {
                    return Ok(());
                }
                last = Some(fp);
            }
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
}
