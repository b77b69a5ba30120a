//! What every reconciliation shares: the API client, the parameters, the caches the watches
//! fill, the leadership flag and the report source.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use k8s_openapi::jiff::Timestamp;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::Store;
use kube::Client;
use tokio::sync::watch;

use super::advertise::dns::task::{Advertisers, KubeKeys, Timing};
use super::hosts::ingress::{default_class, with_default_class};
use super::hosts::policy::keys::TRAEFIK_CONTROLLER;
use super::hosts::{GatewayObjects, TraefikObjects};
use super::metrics::OperatorMetrics;
use super::ownership::{self, Me, Ownership};
use super::reports::{Gate, ReportFetcher, STATUS_FAN_OUT};
use super::resources::{Params, PodDefaults};
use super::secrets::SourceSecrets;
use super::watches::gateway::GatewayApiWatch;
use super::watches::traefik::TraefikWatch;
use super::watches::{listed, OwnedStores};
use crate::api::{HostStatus, Http3Listener, SecretRef};

/// The operator's caches: what reconciles read instead of asking the API server.
#[derive(Clone)]
pub struct Caches {
    /// All Ingresses, kept by a reflector the controller polls.
    pub ingresses: Store<Ingress>,
    /// All listeners (the controller's own store), for port conflicts between them.
    pub listeners: Store<Http3Listener>,
    /// All IngressClasses: which one is the default.
    pub classes: Store<IngressClass>,
    /// The objects the operator made (pruning, the applied-hash check, DaemonSet status).
    pub owned: OwnedStores,
    /// Gateways, HTTPRoutes and ReferenceGrants; `None` leaves the Gateway API out entirely.
    pub gateway_api: Option<Arc<GatewayApiWatch>>,
    /// Traefik's Middlewares and TLSOptions; `None` judges every named one unreadable.
    pub traefik: Option<Arc<TraefikWatch>>,
    /// The data plane pods (their IPs, for `/status`).
    pub pods: Store<Pod>,
    /// The Secrets hosts are served with.
    pub secrets: SourceSecrets,
    /// Every operator's Lease: which operators run, with which controller name.
    pub leases: Store<Lease>,
}

/// What the operator remembers of a listener between reconciles. Lost on restart (then the
/// first reconcile rebuilds it, publishing no per-host event for a listener that already has
/// a status: `events::hosts_before`).
#[derive(Debug, Default, Clone)]
pub struct Memory {
    /// The Secrets, Ingresses (`namespace/name`) and Gateways its hosts came from at the last
    /// reconcile: a change to one of them concerns this listener.
    pub secrets: BTreeSet<SecretRef>,
    pub ingresses: BTreeSet<String>,
    pub gateways: BTreeSet<String>,
    pub routes: BTreeSet<String>,
    /// The Traefik Middleware and TLSOption names and keys its hosts' policies looked up
    /// (`hosts::traefik::Demands::looked_up`).
    pub traefik: BTreeSet<String>,
    /// The hosts (lowercase) its Ingresses asked for: any Ingress of the class that names one
    /// with `spec.tls`, annotated or not, may decide its certificate (`hosts::owners`).
    pub ingress_hosts: HashSet<String>,
    /// The mirrors every answering pod had applied when all of them last were up to date.
    pub last_synced: BTreeMap<String, String>,
    /// Every wanted host's status as last published (for per-host events).
    pub hosts: Option<Vec<HostStatus>>,
    /// Prompt looks in a row while its pods load new mirrors.
    pub settling: u32,
    /// The hash and generation of each object as the operator last applied it.
    pub applied: BTreeMap<String, Applied>,
}

/// An object as last applied: the hash of what was applied, and the version the API server
/// then had. An object whose cached version moved on (someone edited it) is applied again.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Applied {
    pub hash: String,
    pub version: String,
}

/// Everything a reconciliation needs; shared by all of them.
pub struct Context {
    pub client: Client,
    pub params: Params,
    pub pod_defaults: PodDefaults,
    pub caches: Caches,
    pub leader: watch::Receiver<bool>,
    pub reports: Arc<dyn ReportFetcher>,
    pub recorder: Recorder,
    pub metrics: Arc<OperatorMetrics>,
    /// Per listener name.
    pub memory: Mutex<BTreeMap<String, Memory>>,
    /// Set once every cache listed once; reconciles wait for it.
    pub caches_ready: Arc<AtomicBool>,
    /// Version skew: the served CRD against this binary's schema (`operator::crd`).
    pub crd: Arc<super::crd::CrdCheck>,
    /// This operator's namespace and controller name: which listeners are its own.
    pub me: Me,
    /// The bound on `/status` fetches, shared by every reconcile.
    pub status_gate: Gate,
    /// The listeners' DNS publishing tasks (`spec.advertise.dns`).
    pub advertise: Arc<Advertisers>,
}

impl Context {
    pub fn new(
        client: Client,
        params: Params,
        caches: Caches,
        leader: watch::Receiver<bool>,
        reports: Arc<dyn ReportFetcher>,
        reporter: Reporter,
        metrics: Arc<OperatorMetrics>,
    ) -> Self {
        let keys = KubeKeys {
            client: client.clone(),
            namespace: params.namespace.clone(),
        };
        let advertise = Advertisers::new(
            Arc::new(keys),
            Arc::new(|_: &str| {}),
            super::FIELD_MANAGER,
            Timing::default(),
            metrics.dns.clone(),
        );
        Self {
            advertise: Arc::new(advertise),
            recorder: Recorder::new(client.clone(), reporter),
            client,
            pod_defaults: PodDefaults::default(),
            caches,
            leader,
            reports,
            metrics,
            memory: Mutex::new(BTreeMap::new()),
            caches_ready: Arc::new(AtomicBool::new(false)),
            crd: super::crd::CrdCheck::disabled(),
            me: Me {
                namespace: params.namespace.clone(),
                controller_name: crate::api::DEFAULT_CONTROLLER_NAME.to_string(),
            },
            params,
            status_gate: Gate::new(STATUS_FAN_OUT),
        }
    }

    /// This operator's controller name (the default unless set).
    pub fn with_controller_name(mut self, name: &str) -> Self {
        self.me.controller_name = name.to_string();
        self
    }

    /// The operators running now, from their Leases (`operator::ownership`).
    pub fn running_operators(&self) -> std::collections::BTreeMap<String, String> {
        let regs: Vec<_> = self
            .caches
            .leases
            .state()
            .iter()
            .map(|l| ownership::registration(l))
            .collect();
        ownership::running(&regs, Timestamp::now())
    }

    /// Who runs `listener`, as this operator sees it now.
    pub fn ownership(&self, listener: &Http3Listener) -> Ownership {
        ownership::decide(
            ownership::wanted(listener),
            &self.me,
            &self.running_operators(),
        )
    }

    /// The check of the served CRD whose verdict the status carries as `CRDCurrent`.
    pub fn with_crd_check(mut self, crd: Arc<super::crd::CrdCheck>) -> Self {
        self.crd = crd;
        self
    }

    /// The DNS publishing tasks, with how they ask for a reconcile.
    pub fn with_advertisers(mut self, advertise: Arc<Advertisers>) -> Self {
        self.advertise = advertise;
        self
    }

    /// What goes into every data plane pod besides the listener's spec.
    pub fn with_pod_defaults(mut self, pod: PodDefaults) -> Self {
        self.pod_defaults = pod;
        self
    }

    /// Every Ingress as the listeners see it: one without a class belongs to the default
    /// IngressClass (the data plane counts them the same way).
    pub fn ingresses(&self) -> Vec<Arc<Ingress>> {
        let classes = self.caches.classes.state();
        let default = default_class(classes.iter().map(|c| c.as_ref()));
        with_default_class(&self.caches.ingresses.state(), default.as_deref())
    }

    /// The Gateway API objects seen so far (none without the Gateway API).
    pub fn gateway_objects(&self) -> GatewayObjects {
        self.caches
            .gateway_api
            .as_ref()
            .map(|g| g.objects())
            .unwrap_or_default()
    }

    /// Whether the Gateway API kinds have been listed (or found not served) once; before
    /// that every route's host would look unwanted.
    pub fn gateway_api_synced(&self) -> bool {
        self.caches.gateway_api.as_ref().is_none_or(|g| g.synced())
    }

    /// The Traefik objects seen so far (none, unreadable, without the watch).
    pub fn traefik_objects(&self) -> TraefikObjects {
        self.caches
            .traefik
            .as_ref()
            .map(|t| t.objects())
            .unwrap_or_default()
    }

    /// Whether Traefik's kinds have been listed (or found not served) once; before that every
    /// Middleware would look missing and its hosts held back.
    pub fn traefik_synced(&self) -> bool {
        self.caches.traefik.as_ref().is_none_or(|t| t.synced())
    }

    /// The IngressClasses Traefik's controller serves.
    pub fn traefik_classes(&self) -> BTreeSet<String> {
        self.caches
            .classes
            .state()
            .iter()
            .filter(|c| {
                c.spec.as_ref().and_then(|s| s.controller.as_deref()) == Some(TRAEFIK_CONTROLLER)
            })
            .filter_map(|c| c.metadata.name.clone())
            .collect()
    }

    /// The caches that have not listed yet (empty once every one has): readiness waits for
    /// them, and a pod that stays unready says which one holds it.
    pub fn pending_caches(&self) -> Vec<&'static str> {
        let mut pending: Vec<&'static str> = [
            ("Ingress", listed(&self.caches.ingresses)),
            ("IngressClass", listed(&self.caches.classes)),
            ("Http3Listener", listed(&self.caches.listeners)),
            ("Pod", listed(&self.caches.pods)),
            ("Secret", self.caches.secrets.listed()),
            ("Lease", listed(&self.caches.leases)),
        ]
        .iter()
        .filter(|(_, ok)| !ok)
        .map(|(n, _)| *n)
        .collect();
        pending.extend(self.caches.owned.pending());
        pending
    }

    /// A copy of what is remembered of `listener` (default when nothing is).
    pub fn memory_of(&self, listener: &str) -> Memory {
        let memory = self.memory.lock().expect("not poisoned");
        memory.get(listener).cloned().unwrap_or_default()
    }

    /// How an object (`kind/namespace/name`) was last applied for `listener`.
    pub fn applied(&self, listener: &str, key: &str) -> Option<Applied> {
        let memory = self.memory.lock().expect("not poisoned");
        memory.get(listener)?.applied.get(key).cloned()
    }

    /// Changes what is remembered of `listener`.
    pub fn remember(&self, listener: &str, f: impl FnOnce(&mut Memory)) {
        let mut memory = self.memory.lock().expect("not poisoned");
        f(memory.entry(listener.to_string()).or_default());
    }

    /// Forgets a listener that is gone.
    pub fn forget(&self, listener: &str) {
        self.memory.lock().expect("not poisoned").remove(listener);
    }

    /// The listeners whose hosts came from this Secret at their last reconcile.
    pub fn listeners_of_secret(&self, r: &SecretRef) -> Vec<String> {
        let memory = self.memory.lock().expect("not poisoned");
        memory
            .iter()
            .filter(|(_, m)| m.secrets.contains(r))
            .map(|(l, _)| l.clone())
            .collect()
    }

    /// Every Secret some listener references (the Secret cache keeps only these).
    pub fn all_secrets(&self) -> BTreeSet<SecretRef> {
        let memory = self.memory.lock().expect("not poisoned");
        memory
            .values()
            .flat_map(|m| m.secrets.iter().cloned())
            .collect()
    }
}
