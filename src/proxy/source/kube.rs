//! Kubernetes mode (`proxy --listener NAME --hosts-namespace NS`): two watches, whatever the
//! size of the cluster. One follows the `Http3Listener` by name; the other the listener's
//! certificate mirrors (`api::mirror`): the Secrets of type `h3-ingress.dev/host-certificate`
//! labelled `h3-ingress.dev/listener=NAME` in the hosts namespace. The operator decides which
//! hosts are served and writes them there; this source serves exactly what it finds, and never
//! reads an Ingress, a Gateway API object or a user's Secret.
//!
//! Each mirror is parsed once per `resourceVersion`, in parallel (bounded by the cores) while
//! the first list is still arriving, and kept as [`mirrors::Mirror`], not as a Secret. Bursts
//! of events are coalesced ([`DEBOUNCE`], at most [`MAX_DELAY`]) into one configuration. The
//! first configuration is sent once the listener and the first complete list of mirrors are
//! in: a pod is not ready before it serves what it should. A spec that cannot be used is sent
//! as [`ConfigUpdate::Invalid`], once per version and reason, as the file source does with a
//! bad file; if the API server goes away nothing is sent, so the proxy keeps serving the last
//! good configuration.
//!
//! The listener's status is dropped on arrival, but for one field: the pod the operator named
//! to probe the TCP ingress for Alt-Svc ([`probes`]), passed on to the prober, not into the
//! configuration (a status write never rebuilds it).
//!
//! The decisions are the pure [`step`], [`Reported::update`], [`Debounce`] and [`probes`];
//! [`watch_listener`] is the I/O around them.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Client, ResourceExt};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tracing::{info, warn};

use super::ConfigUpdate;
use crate::api::{mirror, Http3Listener};
use crate::config::mirrors::{self, Fingerprint, Mirror, MirrorInput, MirrorSet};
use crate::config::ProxyConfig;
use crate::proxy::observe::logs::{self, CauseLog};

/// Certificates expire without any watch event: re-evaluate this often regardless.
pub const RECHECK: Duration = Duration::from_secs(60);
/// A configuration is built once no event came for this long...
pub const DEBOUNCE: Duration = Duration::from_millis(100);
/// ...or this long after the first event it includes, whichever comes first, so a steady
/// stream of events cannot hold a change back.
pub const MAX_DELAY: Duration = Duration::from_secs(1);
/// Mirrors per parse task: big enough that task overhead is nothing next to key parsing,
/// small enough that the first list's parsing keeps pace with its pages.
const PARSE_CHUNK: usize = 32;

#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error("listener name {0:?} is empty")]
    NoName(String),
    #[error("--hosts-namespace is empty: the namespace of the listener's certificate mirrors")]
    NoNamespace,
}

/// Whether this pod (`own`, its name, unknown outside a pod) is the one the listener's status
/// names to probe for Alt-Svc. Nobody probes while no pod is named: the operator names one
/// as soon as a pod is ready. Pure.
pub fn probes(named: Option<&str>, own: Option<&str>) -> bool {
    named.is_some() && named == own
}

/// The prober the listener's status names.
fn prober_of(l: &Http3Listener) -> Option<String> {
    l.status.as_ref().and_then(|s| s.alt_svc_prober.clone())
}

/// What the watches have seen so far.
pub struct Snapshot<'a> {
    /// Whether the listener's first list is complete.
    pub listener_synced: bool,
    /// Whether the mirrors' first list is complete and parsed.
    pub mirrors_synced: bool,
    pub listener: Option<&'a Http3Listener>,
    pub mirrors: &'a MirrorSet,
}

#[derive(Debug)]
pub enum Step {
    /// Not all inputs have arrived yet; sending now would drop hosts for a moment.
    Wait,
    /// Inputs are complete but not usable; the running config stays (the text says why).
    Keep(String),
    /// Inputs give the configuration already sent.
    Unchanged,
    Send(Box<ProxyConfig>, Box<Fingerprint>),
}

/// Decides what to send, given the inputs and the fingerprint of what was sent last. Pure.
/// An unchanged configuration is recognised from its inputs, without building it.
pub fn step(s: &Snapshot<'_>, last: Option<&Fingerprint>, now_unix: i64) -> Step {
    if !s.listener_synced {
        return Step::Wait;
    }
    let Some(listener) = s.listener else {
        return Step::Keep("the Http3Listener does not exist (deleted?)".into());
    };
    if !s.mirrors_synced {
        return Step::Wait;
    }
    let fingerprint = Fingerprint::of(listener, s.mirrors, now_unix);
    if last == Some(&fingerprint) {
        return Step::Unchanged;
    }
    match mirrors::build(listener, s.mirrors, now_unix) {
        Err(e) => Step::Keep(format!("invalid Http3Listener spec: {e}")),
        Ok(c) => Step::Send(Box::new(c), Box::new(fingerprint)),
    }
}

/// What the source has told the proxy, so each configuration and each rejection is sent once.
#[derive(Debug, Default)]
pub struct Reported {
    /// Fingerprint of the last configuration sent.
    pub config: Option<Fingerprint>,
    /// The rejection last sent: the listener's generation and why.
    rejected: Option<(Option<i64>, String)>,
}

impl Reported {
    /// The update `step` calls for, if any, remembered as sent. A rejection is sent once per
    /// version of the listener's spec (its `metadata.generation`) and reason, as a file
    /// source sends one per reload: re-evaluating the same spec (a timer, a mirror) does not
    /// count it again.
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
            Step::Send(c, fingerprint) => {
                self.rejected = None;
                self.config = Some(*fingerprint);
                Some(ConfigUpdate::Apply(c))
            }
        }
    }
}

/// When to build after a burst of changes: [`DEBOUNCE`] after the last, at most
/// [`MAX_DELAY`] after the first. Pure: times are passed in.
#[derive(Debug, Default, Clone, Copy)]
pub struct Debounce {
    first: Option<Instant>,
    last: Option<Instant>,
    /// Build as soon as possible (a list just completed).
    urgent: bool,
}

impl Debounce {
    pub fn touch(&mut self, now: Instant) {
        self.first.get_or_insert(now);
        self.last = Some(now);
    }

    /// Like [`Self::touch`], but due at once.
    pub fn urgent(&mut self, now: Instant) {
        self.touch(now);
        self.urgent = true;
    }

    /// When the pending changes should be built; `None` when there are none.
    pub fn deadline(&self) -> Option<Instant> {
        if self.urgent {
            return self.last;
        }
        Some((self.last? + DEBOUNCE).min(self.first? + MAX_DELAY))
    }

    pub fn clear(&mut self) {
        *self = Debounce::default();
    }
}

/// Strips what the source never reads before the object is kept: managed fields,
/// annotations (`kubectl.kubernetes.io/last-applied-configuration` repeats the whole
/// spec) and the status the operator rewrites.
fn strip(mut l: Http3Listener) -> Http3Listener {
    l.managed_fields_mut().clear();
    l.annotations_mut().clear();
    l.labels_mut().clear();
    l.status = None;
    l
}

/// Parses mirrors on the blocking pool, at most one task per core at a time.
struct Parser {
    tasks: JoinSet<Vec<Mirror>>,
    limit: usize,
    done: Vec<Mirror>,
}

impl Parser {
    fn new() -> Self {
        Parser {
            tasks: JoinSet::new(),
            limit: std::thread::available_parallelism().map_or(2, |n| n.get()),
            done: Vec::new(),
        }
    }

    /// Starts parsing `inputs`, first waiting for a task to finish when every core is busy
    /// (which also holds the watch back: a list is not buffered faster than it parses).
    async fn submit(&mut self, inputs: Vec<MirrorInput>) {
        if inputs.is_empty() {
            return;
        }
        while self.tasks.len() >= self.limit {
            self.join_one().await;
        }
        self.tasks
            .spawn_blocking(move || inputs.into_iter().map(mirrors::parse).collect());
    }

    async fn join_one(&mut self) {
        match self.tasks.join_next().await {
            Some(Ok(m)) => self.done.extend(m),
            // A panic in a parser is a bug; the mirrors it held stay unparsed and are
            // retried on the next event or relist.
            Some(Err(e)) => warn!(error = %e, "a certificate mirror parse task failed"),
            None => {}
        }
    }

    /// Every mirror submitted so far, parsed.
    async fn finish(&mut self) -> Vec<Mirror> {
        while !self.tasks.is_empty() {
            self.join_one().await;
        }
        std::mem::take(&mut self.done)
    }
}

/// A list of the mirrors in progress (the first one, or a relist after a watch failure).
struct Relist {
    seen: HashSet<String>,
    batch: Vec<MirrorInput>,
    started: Instant,
}

/// The source's state between events: the listener, the parsed mirrors, and what changed
/// since the last build.
struct Inputs {
    listener: Option<Http3Listener>,
    listing: Option<Http3Listener>,
    /// The Alt-Svc prober named by the listener's status ([`prober_of`]), and by the listing.
    prober: Option<String>,
    listing_prober: Option<String>,
    listener_synced: bool,
    mirrors: MirrorSet,
    mirrors_synced: bool,
    relist: Option<Relist>,
    /// Mirror changes since the last build: the latest input per name, `None` when deleted.
    pending: BTreeMap<String, Option<MirrorInput>>,
    debounce: Debounce,
    parser: Parser,
}

impl Inputs {
    fn new() -> Self {
        Inputs {
            listener: None,
            listing: None,
            prober: None,
            listing_prober: None,
            listener_synced: false,
            mirrors: MirrorSet::new(),
            mirrors_synced: false,
            relist: None,
            pending: BTreeMap::new(),
            debounce: Debounce::default(),
            parser: Parser::new(),
        }
    }

    fn on_listener(&mut self, ev: watcher::Event<Http3Listener>) {
        match ev {
            watcher::Event::Init => self.listing = None,
            watcher::Event::InitApply(l) => {
                self.listing_prober = prober_of(&l);
                self.listing = Some(strip(l));
            }
            watcher::Event::InitDone => {
                self.listener = self.listing.take();
                self.prober = self.listing_prober.take();
                self.listener_synced = true;
            }
            watcher::Event::Apply(l) => {
                self.prober = prober_of(&l);
                self.listener = Some(strip(l));
            }
            watcher::Event::Delete(_) => {
                self.listener = None;
                self.prober = None;
            }
        }
        if let Some(l) = &self.listener {
            // Version skew: fields a newer CRD added are read past, and said once.
            crate::skew::note_unknown_fields(l);
        }
        self.debounce.touch(Instant::now());
    }

    /// Whether `input` differs from the mirror of that name already parsed.
    fn changed(&self, input: &MirrorInput) -> bool {
        self.mirrors
            .get(&input.name)
            .is_none_or(|m| m.resource_version != input.resource_version)
    }

    async fn on_mirror(&mut self, ev: watcher::Event<Secret>) {
        match ev {
            watcher::Event::Init => {
                // The list supersedes changes not built yet.
                self.pending.clear();
                self.relist = Some(Relist {
                    seen: HashSet::new(),
                    batch: Vec::new(),
                    started: Instant::now(),
                });
            }
            watcher::Event::InitApply(s) => {
                let Some(input) = MirrorInput::from_secret(s) else {
                    return;
                };
                let changed = self.changed(&input);
                let Some(r) = self.relist.as_mut() else {
                    return;
                };
                r.seen.insert(input.name.clone());
                if changed {
                    r.batch.push(input);
                }
                if r.batch.len() >= PARSE_CHUNK {
                    let batch = std::mem::take(&mut r.batch);
                    self.parser.submit(batch).await;
                }
            }
            watcher::Event::InitDone => self.relisted().await,
            watcher::Event::Apply(s) => {
                if let Some(input) = MirrorInput::from_secret(s) {
                    if self.changed(&input) {
                        self.pending.insert(input.name.clone(), Some(input));
                        self.debounce.touch(Instant::now());
                    }
                }
            }
            watcher::Event::Delete(s) => {
                if let Some(name) = s.metadata.name {
                    self.pending.insert(name, None);
                    self.debounce.touch(Instant::now());
                }
            }
        }
    }

    /// A list is complete: mirrors it did not name are gone, the rest are parsed (only
    /// those with a new resourceVersion), and the result is built at once.
    async fn relisted(&mut self) {
        let Some(mut r) = self.relist.take() else {
            return;
        };
        self.parser.submit(std::mem::take(&mut r.batch)).await;
        let parsed = self.parser.finish().await;
        let reparsed = parsed.len();
        self.mirrors.retain(|name, _| r.seen.contains(name));
        for m in parsed {
            self.mirrors.insert(m.name.clone(), Arc::new(m));
        }
        info!(
            mirrors = self.mirrors.len(),
            parsed = reparsed,
            elapsed_ms = r.started.elapsed().as_millis() as u64,
            "certificate mirrors listed"
        );
        self.mirrors_synced = true;
        // The first configuration waits for nothing more.
        self.debounce.urgent(Instant::now());
    }

    /// Applies the pending mirror changes, parsing the new versions in parallel.
    async fn flush(&mut self) {
        let pending = std::mem::take(&mut self.pending);
        let mut batch = Vec::new();
        for (name, change) in pending {
            match change {
                None => {
                    self.mirrors.remove(&name);
                }
                Some(input) => {
                    batch.push(input);
                    if batch.len() >= PARSE_CHUNK {
                        self.parser.submit(std::mem::take(&mut batch)).await;
                    }
                }
            }
        }
        self.parser.submit(batch).await;
        for m in self.parser.finish().await {
            self.mirrors.insert(m.name.clone(), Arc::new(m));
        }
    }

    fn snapshot(&self) -> Snapshot<'_> {
        Snapshot {
            listener_synced: self.listener_synced,
            mirrors_synced: self.mirrors_synced,
            listener: self.listener.as_ref(),
            mirrors: &self.mirrors,
        }
    }

    /// Evaluates the inputs now: the update to send, if any.
    fn evaluate(&self, reported: &mut Reported) -> Option<ConfigUpdate> {
        let now = crate::config::file::unix_now();
        let step = step(&self.snapshot(), reported.config.as_ref(), now);
        let generation = self.listener.as_ref().and_then(|l| l.metadata.generation);
        reported.update(step, generation)
    }
}

/// The cause of a watch failure, as one log line per minute names it: the HTTP status where
/// the API server answered, else the kind of failure.
fn cause(what: &str, e: &watcher::Error) -> String {
    let api = match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s)) => Some(s.as_ref()),
        watcher::Error::WatchError(s) => Some(s.as_ref()),
        _ => None,
    };
    match api {
        Some(s) => format!("{what} {} {}", s.code, s.reason),
        None => match e {
            watcher::Error::InitialListFailed(_) => format!("{what} list"),
            watcher::Error::WatchStartFailed(_) => format!("{what} watch start"),
            watcher::Error::WatchFailed(_) => format!("{what} watch"),
            _ => format!("{what} other"),
        },
    }
}

/// What to do about a watch failure, for the log line.
fn hint(cause: &str, namespace: &str) -> String {
    if cause.contains(" 403 ") {
        "the pod's ServiceAccount may not read it (yet): the operator grants get, list and \
         watch on the listener and on Secrets in the hosts namespace"
            .into()
    } else if cause.starts_with("mirrors 404") {
        format!("the hosts namespace {namespace:?} does not exist (yet)")
    } else if cause.starts_with("listener 404") {
        "the Http3Listener CRD is not installed".into()
    } else {
        "retrying with backoff".into()
    }
}

/// Logs a watch failure at most once per cause per [`logs::WINDOW`].
fn log_failure(log: &mut CauseLog, what: &str, namespace: &str, e: &watcher::Error) {
    let cause = cause(what, e);
    if let Some(suppressed) = log.allow(&cause, std::time::Instant::now()) {
        warn!(
            watch = what,
            cause = %cause,
            error = %e,
            suppressed,
            "watch failed, retrying with backoff: {}",
            hint(&cause, namespace)
        );
    }
}

/// The two watches: the listener by name, the mirrors by label and type in `namespace`.
fn watches(
    client: Client,
    listener: &str,
    namespace: &str,
) -> (
    impl Stream<Item = Result<watcher::Event<Http3Listener>, watcher::Error>> + Send,
    impl Stream<Item = Result<watcher::Event<Secret>, watcher::Error>> + Send,
) {
    let by_name = watcher::Config::default().fields(&format!("metadata.name={listener}"));
    let listeners = watcher(Api::<Http3Listener>::all(client.clone()), by_name).default_backoff();
    let selected = watcher::Config::default()
        .labels(&format!("{}={listener}", mirror::LISTENER_LABEL))
        .fields(&format!("type={}", mirror::SECRET_TYPE));
    let secrets = watcher(Api::<Secret>::namespaced(client, namespace), selected).default_backoff();
    (listeners, secrets)
}

/// Says on `prober` whether this pod (`pod`) is the listener's Alt-Svc prober now, with one
/// line when that changes.
fn tell_prober(prober: &watch::Sender<bool>, named: Option<&str>, pod: Option<&str>) {
    let mine = probes(named, pod);
    if prober.send_if_modified(|v| std::mem::replace(v, mine) != mine) {
        match named {
            Some(p) if mine => info!(pod = %p, "this pod probes the TCP ingress for Alt-Svc"),
            Some(p) => info!(prober = %p, "another pod probes the TCP ingress for Alt-Svc"),
            None => info!("no pod is named to probe the TCP ingress for Alt-Svc yet"),
        }
    }
}

/// Watches the listener `listener` and its certificate mirrors in `namespace`, and sends
/// every new configuration, and every new reason none can be built, on `tx`, and on `prober`
/// whether this pod (`pod`) probes for Alt-Svc. Returns when the receiver is dropped.
pub async fn watch_listener(
    client: Client,
    listener: String,
    namespace: String,
    pod: Option<String>,
    tx: mpsc::Sender<ConfigUpdate>,
    prober: watch::Sender<bool>,
) -> Result<(), WatchError> {
    if listener.is_empty() {
        return Err(WatchError::NoName(listener));
    }
    if namespace.is_empty() {
        return Err(WatchError::NoNamespace);
    }
    let (listeners, secrets) = watches(client, &listener, &namespace);
    let (mut listeners, mut secrets) = (listeners.boxed(), secrets.boxed());
    let mut inputs = Inputs::new();
    let mut reported = Reported::default();
    // Watch failures, and the configurations sent: each at most once a minute per cause.
    let mut lines = CauseLog::new(logs::WINDOW);
    let mut recheck = tokio::time::interval_at(Instant::now() + RECHECK, RECHECK);
    loop {
        let deadline = inputs.debounce.deadline();
        let build = tokio::select! {
            ev = listeners.next() => {
                match ev {
                    Some(Ok(ev)) => {
                        inputs.on_listener(ev);
                        tell_prober(&prober, inputs.prober.as_deref(), pod.as_deref());
                    }
                    Some(Err(e)) => log_failure(&mut lines, "listener", &namespace, &e),
                    None => return Ok(()),
                }
                false
            }
            ev = secrets.next() => {
                match ev {
                    Some(Ok(ev)) => inputs.on_mirror(ev).await,
                    Some(Err(e)) => log_failure(&mut lines, "mirrors", &namespace, &e),
                    None => return Ok(()),
                }
                false
            }
            _ = tokio::time::sleep_until(deadline.unwrap_or_else(Instant::now)), if deadline.is_some() => true,
            _ = recheck.tick() => true,
            _ = tx.closed() => return Ok(()),
        };
        if !build {
            continue;
        }
        inputs.flush().await;
        inputs.debounce.clear();
        let Some(update) = inputs.evaluate(&mut reported) else {
            continue;
        };
        if let ConfigUpdate::Apply(c) = &update {
            // Under a steady stream of mirror changes a configuration is sent every second:
            // one line a minute says how many.
            if let Some(held) = lines.allow("configuration sent", std::time::Instant::now()) {
                let r = c.mirrors.as_ref();
                info!(
                    listener = %listener,
                    hosts = c.hosts.len(),
                    mirrors = r.map_or(0, |r| r.count),
                    failed = r.map_or(0, |r| r.failed_count),
                    earlier_unlogged = held,
                    "new configuration from Kubernetes"
                );
            }
        }
        if tx.send(update).await.is_err() {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::mirrors::tests::{input, listener, now, set};

    fn snap<'a>(
        listener_synced: bool,
        mirrors_synced: bool,
        l: Option<&'a Http3Listener>,
        m: &'a MirrorSet,
    ) -> Snapshot<'a> {
        Snapshot {
            listener_synced,
            mirrors_synced,
            listener: l,
            mirrors: m,
        }
    }

    #[test]
    fn waits_for_both_lists_sends_once_and_keeps_the_last_good_config() {
        let l = listener();
        let m = set(vec![input(
            "m1",
            "1",
            &["a.example.com"],
            &["a.example.com"],
        )]);
        assert!(matches!(
            step(&snap(false, true, Some(&l), &m), None, now()),
            Step::Wait
        ));
        assert!(matches!(
            step(&snap(true, false, Some(&l), &m), None, now()),
            Step::Wait
        ));
        let Step::Send(c, fp) = step(&snap(true, true, Some(&l), &m), None, now()) else {
            panic!("expected a config")
        };
        assert!(c.hosts.lookup("a.example.com").is_some());
        assert!(matches!(
            step(&snap(true, true, Some(&l), &m), Some(&*fp), now()),
            Step::Unchanged
        ));
        assert!(
            matches!(step(&snap(true, true, None, &m), Some(&*fp), now()), Step::Keep(w) if w.contains("does not exist"))
        );
        let mut bad = l.clone();
        bad.spec.upstream.address = "x".into();
        assert!(
            matches!(step(&snap(true, true, Some(&bad), &m), Some(&*fp), now()), Step::Keep(w) if w.contains("spec.upstream.address"))
        );
        // A status write (a new resourceVersion, the same spec) changes nothing.
        let mut rewritten = l.clone();
        rewritten.metadata.resource_version = Some("99".into());
        assert!(matches!(
            step(&snap(true, true, Some(&rewritten), &m), Some(&*fp), now()),
            Step::Unchanged
        ));
        // A rotated mirror (a new resourceVersion) is a new configuration...
        let rotated = set(vec![input(
            "m1",
            "2",
            &["a.example.com"],
            &["a.example.com"],
        )]);
        let Step::Send(c2, _) = step(&snap(true, true, Some(&l), &rotated), Some(&*fp), now())
        else {
            panic!("a rotated mirror must produce a new config")
        };
        let leaf = |c: &ProxyConfig| c.hosts.lookup("a.example.com").unwrap().leaf_sha256.clone();
        assert_ne!(leaf(&c), leaf(&c2));
        // ...and so is the passage of time past the certificate's expiry.
        let far = c.hosts.lookup("a.example.com").unwrap().not_after + 1;
        let Step::Send(expired, _) = step(&snap(true, true, Some(&l), &m), Some(&*fp), far) else {
            panic!("expiry must produce a new config")
        };
        assert!(expired.hosts.is_empty());
        assert_eq!(expired.mirrors.unwrap().failed_count, 1);
    }

    #[test]
    fn each_rejection_is_reported_once_per_spec_version_and_reason() {
        let mut r = Reported::default();
        let keep = |why: &str| Step::Keep(why.to_string());
        let invalid = |u: Option<ConfigUpdate>| matches!(u, Some(ConfigUpdate::Invalid(_)));
        assert!(invalid(r.update(keep("spec: x"), Some(2))));
        // Re-evaluating the same spec (the timer, a mirror) sends nothing.
        assert!(r.update(keep("spec: x"), Some(2)).is_none());
        assert!(r.update(Step::Wait, Some(2)).is_none());
        assert!(r.update(keep("spec: x"), Some(2)).is_none());
        // An edited spec that is still broken, or broken differently, is a new rejection.
        assert!(invalid(r.update(keep("spec: x"), Some(3))));
        assert!(invalid(r.update(keep("spec: y"), Some(3))));

        let m = set(vec![input("m1", "1", &["a.test"], &["a.test"])]);
        let l = listener();
        let Step::Send(c, fp) = step(&snap(true, true, Some(&l), &m), None, now()) else {
            panic!("expected a config")
        };
        assert!(matches!(
            r.update(Step::Send(c, fp.clone()), Some(4)),
            Some(ConfigUpdate::Apply(_))
        ));
        assert_eq!(r.config.as_ref(), Some(&*fp));
        // Deleted, back unchanged, deleted again: two rejections.
        let gone = "the Http3Listener does not exist (deleted?)";
        assert!(invalid(r.update(keep(gone), None)));
        assert!(r.update(Step::Unchanged, Some(4)).is_none());
        assert!(invalid(r.update(keep(gone), None)));
    }

    #[test]
    fn only_the_named_pod_probes_and_status_writes_name_it() {
        assert!(probes(Some("dp-a"), Some("dp-a")));
        assert!(!probes(Some("dp-a"), Some("dp-b")));
        assert!(!probes(None, Some("dp-a")), "nobody named yet");
        assert!(!probes(None, None), "outside a pod, with no name");
        assert!(!probes(Some("dp-a"), None));

        let named = |p: Option<&str>| {
            let mut l = listener();
            l.status = Some(crate::api::Http3ListenerStatus {
                alt_svc_prober: p.map(str::to_string),
                ..Default::default()
            });
            l
        };
        let mut i = Inputs::new();
        i.on_listener(watcher::Event::Init);
        i.on_listener(watcher::Event::InitApply(named(Some("dp-a"))));
        assert_eq!(i.prober, None, "not before the list is done");
        i.on_listener(watcher::Event::InitDone);
        assert_eq!(i.prober.as_deref(), Some("dp-a"));
        i.on_listener(watcher::Event::Apply(named(Some("dp-b"))));
        assert_eq!(i.prober.as_deref(), Some("dp-b"));
        assert!(
            i.listener.as_ref().unwrap().status.is_none(),
            "the rest is dropped"
        );
        i.on_listener(watcher::Event::Delete(named(Some("dp-b"))));
        assert_eq!(i.prober, None);
    }

    #[test]
    fn bursts_are_built_after_a_quiet_moment_or_the_maximum_delay() {
        let t0 = Instant::now();
        let mut d = Debounce::default();
        assert_eq!(d.deadline(), None);
        d.touch(t0);
        assert_eq!(d.deadline(), Some(t0 + DEBOUNCE));
        // Events every 50 ms push the build back, but never past MAX_DELAY.
        let mut t = t0;
        for _ in 0..100 {
            t += Duration::from_millis(50);
            d.touch(t);
        }
        assert_eq!(d.deadline(), Some(t0 + MAX_DELAY));
        d.urgent(t);
        assert_eq!(d.deadline(), Some(t));
        d.clear();
        assert_eq!(d.deadline(), None);
    }

    #[test]
    fn the_listener_is_kept_without_what_the_source_never_reads() {
        let mut l = listener();
        l.metadata.annotations = Some(
            [(
                "kubectl.kubernetes.io/last-applied-configuration".to_string(),
                "{...}".to_string(),
            )]
            .into(),
        );
        l.metadata.managed_fields = Some(vec![Default::default()]);
        l.status = Some(Default::default());
        let s = strip(l.clone());
        assert!(s.metadata.annotations.unwrap_or_default().is_empty());
        assert!(s.metadata.managed_fields.unwrap_or_default().is_empty());
        assert!(s.status.is_none());
        assert_eq!(s.spec, l.spec);
    }

    #[test]
    fn watch_failures_are_named_by_cause_with_what_to_do() {
        let status = |code: u16, reason: &str| {
            Box::new(kube::core::Status {
                code,
                reason: reason.into(),
                ..Default::default()
            })
        };
        let forbidden =
            watcher::Error::InitialListFailed(kube::Error::Api(status(403, "Forbidden")));
        let c = cause("mirrors", &forbidden);
        assert_eq!(c, "mirrors 403 Forbidden");
        assert!(hint(&c, "h3-hosts").contains("ServiceAccount"));
        let missing = watcher::Error::WatchError(status(404, "NotFound"));
        let c = cause("mirrors", &missing);
        assert!(
            hint(&c, "h3-hosts").contains("\"h3-hosts\" does not exist"),
            "{c}"
        );
        let c = cause("listener", &watcher::Error::NoResourceVersion);
        assert_eq!(c, "listener other");
    }
}
