//! What every reconciliation shares: the API client, the parameters, the caches the watches
//! fill, the leadership flag and the report source.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::Store;
use kube::Client;
use tokio::sync::watch;

use super::metrics::OperatorMetrics;
use super::reports::ReportFetcher;
use super::resources::{Params, PodDefaults};
use super::watches::OwnedStores;
use crate::api::{Http3Listener, SecretRef};
use crate::config::gateway::GatewayObjects;
use crate::config::kube::{default_class, with_default_class};
use crate::gateway_api::GatewayApiWatch;

/// The operator's caches: what reconciles read instead of asking the API server.
#[derive(Clone)]
pub struct Caches {
    /// All Ingresses, kept by a reflector the controller polls.
    pub ingresses: Store<Ingress>,
    /// All listeners (the controller's own store), for port conflicts between them.
    pub listeners: Store<Http3Listener>,
    /// All IngressClasses: which one is the default.
    pub classes: Store<IngressClass>,
    /// The Roles, RoleBindings and Services the operator made, for pruning.
    pub owned: OwnedStores,
    /// Gateways, HTTPRoutes and ReferenceGrants; `None` leaves the Gateway API out entirely.
    pub gateway_api: Option<Arc<GatewayApiWatch>>,
}

/// Everything a reconciliation needs; shared by all of them.
pub struct Context {
    pub client: Client,
    pub params: Params,
    pub pod_defaults: PodDefaults,
    pub ingresses: Store<Ingress>,
    pub listeners: Store<Http3Listener>,
    pub classes: Store<IngressClass>,
    pub owned: OwnedStores,
    pub gateway_api: Option<Arc<GatewayApiWatch>>,
    pub leader: watch::Receiver<bool>,
    pub reports: Arc<dyn ReportFetcher>,
    pub recorder: Recorder,
    pub metrics: Arc<OperatorMetrics>,
    /// Secrets each listener references, so a Secret change re-reconciles only when it matters.
    pub secret_interest: Mutex<BTreeMap<String, BTreeSet<SecretRef>>>,
    /// Prompt looks in a row per listener whose pods are still loading a host.
    pub settling: Mutex<BTreeMap<String, u32>>,
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
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            params,
            pod_defaults: PodDefaults::default(),
            ingresses: caches.ingresses,
            listeners: caches.listeners,
            classes: caches.classes,
            owned: caches.owned,
            gateway_api: caches.gateway_api,
            leader,
            reports,
            metrics,
            secret_interest: Mutex::new(BTreeMap::new()),
            settling: Mutex::new(BTreeMap::new()),
        }
    }

    /// What goes into every data plane pod besides the listener's spec.
    pub fn with_pod_defaults(mut self, pod: PodDefaults) -> Self {
        self.pod_defaults = pod;
        self
    }

    /// Every Ingress as the listeners see it: one without a class belongs to the default
    /// IngressClass (the data plane counts them the same way).
    pub fn ingresses(&self) -> Vec<Arc<Ingress>> {
        let classes = self.classes.state();
        let default = default_class(classes.iter().map(|c| c.as_ref()));
        with_default_class(&self.ingresses.state(), default.as_deref())
    }

    /// The Gateway API objects seen so far (none without the Gateway API).
    pub fn gateway_objects(&self) -> GatewayObjects {
        self.gateway_api
            .as_ref()
            .map(|g| g.objects())
            .unwrap_or_default()
    }

    /// Whether the Gateway API kinds have been listed (or found not served) once; before
    /// that every route's host would look unwanted.
    pub fn gateway_api_synced(&self) -> bool {
        self.gateway_api.as_ref().is_none_or(|g| g.synced())
    }

    /// Whether some listener references this Secret.
    pub fn wants_secret(&self, namespace: &str, name: &str) -> bool {
        let interest = self.secret_interest.lock().expect("not poisoned");
        interest.values().any(|set| {
            set.iter()
                .any(|s| s.namespace == namespace && s.name == name)
        })
    }
}
