//! The operator's API traffic, checked request by request against a scripted API server
//! (kube's tower-test mock, in the style of kube-rs/controller-rs's `ApiServerVerifier`):
//! each referenced Secret read once per resourceVersion, one certificate mirror per Secret
//! written only when its content changes, server-side applies of what changed only, obsolete
//! mirrors and RBAC deleted, the status patch (only when changed, only by the leader), events,
//! and the Lease.
//!
//! The caches a reconcile reads are filled by hand, and filled again from what the scripted
//! API server answered (its resourceVersions and generations), as the operator's watches
//! would; a second reconcile on the same `Context` then shows what a reconcile costs at
//! steady state, after a Secret rotation, and while pods load.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, PodSpec, PodStatus, Secret, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::{
    Ingress, IngressClass, IngressRule, IngressSpec, IngressTLS,
};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::ByteString;
use kube::api::PartialObjectMeta;
use kube::client::Body;
use kube::core::PartialObjectMetaExt;
use kube::runtime::controller::Action;
use kube::runtime::events::Reporter;
use kube::runtime::reflector::{self, store::Writer, Store};
use kube::runtime::watcher;
use kube::Client;
use serde_json::{json, Value};
use tokio::sync::watch;

use h3_ingress::api::mirror::{self, HostsDocument, MirroredHost};
use h3_ingress::api::{
    annotations, reasons, HostCount, HostStatus, Http3Listener, Http3ListenerSpec,
    Http3ListenerStatus, MirrorFailure, MirrorReport, SecretRef, SocketReport, StatusReport,
};
use h3_ingress::operator::context::{Caches, Context};
use h3_ingress::operator::controller::{reconcile, REQUEUE, SETTLE_REQUEUE, UNREADABLE_REQUEUE};
use h3_ingress::operator::leader::{self, LeaseConfig};
use h3_ingress::operator::metrics::OperatorMetrics;
use h3_ingress::operator::reports::{ReportFetcher, ReportFuture};
use h3_ingress::operator::resources::Params;
use h3_ingress::operator::secrets::SourceSecrets;
use h3_ingress::operator::watches::OwnedStores;

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

/// The operator's namespace, and the hosts namespace the certificate mirrors go to.
const NS: &str = "h3-ingress";
const HOSTS: &str = "h3-ingress-hosts";
const RBAC: &str = "/apis/rbac.authorization.k8s.io/v1";
/// The listener's ClusterRole(Binding): named after the operator's namespace too.
const CLUSTER_RBAC: &str = "h3-ingress.h3-ingress-data-plane-public";
/// What versions before release-scoped names called them (and the hosts-namespace Role still).
const LEGACY_RBAC: &str = "h3-ingress-data-plane-public";
const STATUS: &str = "/apis/h3-ingress.dev/v1alpha1/http3listeners/public/status";
const DAEMON_SET: &str = "/apis/apps/v1/namespaces/h3-ingress/daemonsets/h3-ingress-public";
const NS_SERVICE: &str = "/api/v1/namespaces/h3-ingress/services/h3-ingress-public";
const WEB_TLS: &str = "/api/v1/namespaces/shop/secrets/web-tls";
/// The data plane pod's `/status` address (its IP, the default metrics port).
const POD_ADDRESS: &str = "10.0.0.7:9476";
const POD: &str = "h3-ingress-public-x7k2p";
/// The resourceVersion of the source Secret `shop/web-tls` in the metadata cache.
const SECRET_RV: &str = "7";
/// The resourceVersion the API server gives the mirror of `shop/web-tls` when first written.
const MIRROR_RV: &str = "201";

type Answer = Box<dyn FnOnce(&str, Value) -> (u16, Value) + Send>;

/// One expected request: method, path, and a closure that checks the query and JSON body
/// (Null when empty) and returns the status code and JSON to answer with.
struct Expect {
    method: &'static str,
    path: String,
    answer: Answer,
    /// Never answered (kept open until the script ends): a request that times out.
    hold: bool,
}

fn expect(
    method: &'static str,
    path: impl Into<String>,
    answer: impl FnOnce(&str, Value) -> (u16, Value) + Send + 'static,
) -> Expect {
    Expect {
        method,
        path: path.into(),
        answer: Box::new(answer),
        hold: false,
    }
}

/// A request the API server receives and never answers.
fn unanswered(method: &'static str, path: impl Into<String>) -> Expect {
    Expect {
        hold: true,
        ..expect(method, path, |_, _| unreachable!("never answered"))
    }
}

/// A request the scripted API server answered, and its answer.
#[derive(Debug, Clone)]
struct Answered {
    method: String,
    path: String,
    code: u16,
    body: Value,
}

/// `METHOD path` of every answered request.
fn lines(answered: &[Answered]) -> Vec<String> {
    answered
        .iter()
        .map(|a| format!("{} {}", a.method, a.path))
        .collect()
}

/// Answers the script in order and fails on any request that is not the next expected one.
/// Returns the handle (for the next reconcile on the same client) and what it answered.
async fn verifier(mut handle: Handle, script: Vec<Expect>) -> (Handle, Vec<Answered>) {
    let mut answered = Vec::new();
    let mut held = Vec::new();
    for (i, e) in script.into_iter().enumerate() {
        let (req, send) = tokio::time::timeout(Duration::from_secs(5), handle.next_request())
            .await
            .unwrap_or_else(|_| panic!("request #{i} ({} {}) never came", e.method, e.path))
            .expect("client dropped");
        let method = req.method().to_string();
        let path = req.uri().path().to_string();
        let query = req.uri().query().unwrap_or_default().to_string();
        // A path ending in `*` takes any name there (an event's generated one).
        let path_seen = match e.path.strip_suffix('*') {
            Some(prefix) if path.starts_with(prefix) => e.path.as_str(),
            _ => path.as_str(),
        };
        assert_eq!(
            (method.as_str(), path_seen),
            (e.method, e.path.as_str()),
            "request #{i}: got {method} {}",
            req.uri()
        );
        if e.hold {
            held.push(send);
            continue;
        }
        let bytes = req.into_body().collect_bytes().await.unwrap();
        let body: Value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap()
        };
        let (code, answer) = (e.answer)(&query, body);
        send.send_response(
            Response::builder()
                .status(code)
                .body(Body::from(serde_json::to_vec(&answer).unwrap()))
                .unwrap(),
        );
        answered.push(Answered {
            method,
            path,
            code,
            body: answer,
        });
    }
    // Anything after the script is a request the operator should not have made.
    if let Ok(Some((req, _))) =
        tokio::time::timeout(Duration::from_millis(200), handle.next_request()).await
    {
        panic!(
            "unexpected request after the script: {} {}",
            req.method(),
            req.uri()
        );
    }
    drop(held);
    (handle, answered)
}

fn api_status(code: u16, reason: &str, message: &str) -> (u16, Value) {
    (
        code,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "reason": reason, "code": code, "message": message}),
    )
}

fn not_found(what: &str) -> (u16, Value) {
    api_status(404, "NotFound", &format!("{what} not found"))
}

fn success() -> (u16, Value) {
    (
        200,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}),
    )
}

fn list(kind: &str, items: Vec<Value>) -> (u16, Value) {
    (
        200,
        json!({"apiVersion": "v1", "kind": kind, "metadata": {"resourceVersion": "1"}, "items": items}),
    )
}

/// How long the operator waits for a Secret GET here (its own default is 10 s).
const READ_TIMEOUT: Duration = Duration::from_millis(300);

/// resourceVersions the scripted API server hands out (unique across the tests of this file).
static NEXT_RV: AtomicU64 = AtomicU64::new(1000);

/// `object` as the API server stores it: with a new resourceVersion.
fn stamped(mut object: Value) -> Value {
    let rv = NEXT_RV.fetch_add(1, Ordering::Relaxed);
    object["metadata"]["resourceVersion"] = rv.to_string().into();
    object
}

fn assert_ours(query: &str, what: &str) {
    assert!(
        query.contains("fieldManager=h3-ingress-operator") && query.contains("force=true"),
        "{what}: {query}"
    );
}

/// A server-side apply by our one field manager; answers with the applied object.
fn ssa(path: String, kind: &'static str) -> Expect {
    expect("PATCH", path, move |query, body| {
        assert_ours(query, kind);
        assert_eq!(body["kind"], kind);
        (200, stamped(body))
    })
}

/// What the pod answers on `/status`, per address; the tests change it between reconciles.
#[derive(Clone, Default)]
struct Fetcher(Arc<Mutex<BTreeMap<SocketAddr, Result<StatusReport, String>>>>);

impl Fetcher {
    fn set(&self, report: StatusReport) {
        let mut m = self.0.lock().unwrap();
        m.insert(POD_ADDRESS.parse().unwrap(), Ok(report));
    }
}

impl ReportFetcher for Fetcher {
    fn fetch(&self, address: SocketAddr) -> ReportFuture {
        let r = self
            .0
            .lock()
            .unwrap()
            .get(&address)
            .cloned()
            .unwrap_or_else(|| Err(format!("unexpected fetch from {address}")));
        Box::pin(async move { r })
    }
}

fn listener() -> Http3Listener {
    let spec: Http3ListenerSpec = serde_json::from_value(json!({
        "ingressClassName": "nginx",
        "upstream": {"address": "ingress-nginx-controller.ingress-nginx:443"}
    }))
    .unwrap();
    let mut l = Http3Listener::new("public", spec);
    l.metadata.uid = Some("5e1f0000-0000-4000-8000-000000000001".into());
    l.metadata.generation = Some(2);
    l.metadata.resource_version = Some("10".into());
    l
}

/// Two hosts: `a.example.com` with Secret `web-tls` (which exists), and
/// `missing.example.com` with Secret `missing` (which does not).
fn ingress() -> Ingress {
    Ingress {
        metadata: ObjectMeta {
            namespace: Some("shop".into()),
            name: Some("web".into()),
            uid: Some("1a000000-0000-4000-8000-000000000002".into()),
            annotations: Some(
                [(annotations::ENABLED.to_string(), "true".to_string())]
                    .into_iter()
                    .collect(),
            ),
            ..Default::default()
        },
        spec: Some(IngressSpec {
            ingress_class_name: Some("nginx".into()),
            rules: Some(vec![
                IngressRule {
                    host: Some("a.example.com".into()),
                    http: None,
                },
                IngressRule {
                    host: Some("missing.example.com".into()),
                    http: None,
                },
            ]),
            tls: Some(vec![
                IngressTLS {
                    hosts: Some(vec!["a.example.com".into()]),
                    secret_name: Some("web-tls".into()),
                },
                IngressTLS {
                    hosts: Some(vec!["missing.example.com".into()]),
                    secret_name: Some("missing".into()),
                },
            ]),
            default_backend: None,
        }),
        status: None,
    }
}

fn secret_ref(name: &str) -> SecretRef {
    SecretRef {
        namespace: "shop".into(),
        name: name.into(),
    }
}

/// `shop/web-tls` at resourceVersion `rv`, with a new certificate for `a.example.com` (every
/// call makes another one: a rotation).
fn tls_secret(rv: &str) -> Secret {
    let ck = rcgen::generate_simple_self_signed(vec!["a.example.com".to_string()]).unwrap();
    Secret {
        metadata: ObjectMeta {
            namespace: Some("shop".into()),
            name: Some("web-tls".into()),
            resource_version: Some(rv.into()),
            ..Default::default()
        },
        type_: Some("kubernetes.io/tls".into()),
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
    }
}

/// A Secret's entry in the operator's stripped, cluster-wide metadata cache.
fn secret_meta(ns: &str, name: &str, rv: &str) -> PartialObjectMeta<Secret> {
    ObjectMeta {
        namespace: Some(ns.into()),
        name: Some(name.into()),
        resource_version: Some(rv.into()),
        ..Default::default()
    }
    .into_request_partial()
}

/// The name of the mirror of `shop/<secret>` for listener `public`.
fn mirror_of(secret: &str) -> String {
    mirror::mirror_name("public", &secret_ref(secret))
}

/// What an up-to-date pod reports when the mirror of `web-tls` is at `rv`.
fn digest_at(rv: &str) -> String {
    mirror::digest([(mirror_of("web-tls").as_str(), rv)])
}

/// Metadata of an object the operator made for `listener`, as the owned caches hold it.
fn owned_meta<K>(namespace: &str, name: &str, listener: &str) -> PartialObjectMeta<K>
where
    K: kube::Resource<DynamicType = ()>,
{
    ObjectMeta {
        namespace: Some(namespace.into()),
        name: Some(name.into()),
        resource_version: Some("50".into()),
        labels: Some(
            [
                (
                    "app.kubernetes.io/instance".to_string(),
                    listener.to_string(),
                ),
                (mirror::LISTENER_LABEL.to_string(), listener.to_string()),
            ]
            .into_iter()
            .collect(),
        ),
        ..Default::default()
    }
    .into_request_partial()
}

/// The listener's data plane pod, as the pod cache holds it.
fn pod() -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(POD.into()),
            namespace: Some(NS.into()),
            labels: Some(
                [(
                    "app.kubernetes.io/instance".to_string(),
                    "public".to_string(),
                )]
                .into_iter()
                .collect(),
            ),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: Some("node-1".into()),
            ..Default::default()
        }),
        status: Some(PodStatus {
            pod_ip: Some("10.0.0.7".into()),
            ..Default::default()
        }),
    }
}

/// A pod with both sockets bound, which has applied the mirrors whose digest is `digest`.
fn pod_report(digest: &str) -> StatusReport {
    StatusReport {
        version: "0.1.0".into(),
        port: 443,
        sockets: ["ipv4", "ipv6"]
            .iter()
            .map(|f| SocketReport {
                family: f.to_string(),
                address: if *f == "ipv4" {
                    "0.0.0.0:443"
                } else {
                    "[::]:443"
                }
                .into(),
                bound: true,
                receive_buffer_requested_bytes: 4_194_304,
                receive_buffer_effective_bytes: 8_388_608,
                send_buffer_requested_bytes: 4_194_304,
                send_buffer_effective_bytes: 8_388_608,
                clamped: false,
                gso_segments: 64,
                drops: 0,
                error: String::new(),
            })
            .collect(),
        hosts_loaded: 1,
        mirrors: Some(MirrorReport {
            synced: true,
            count: 1,
            digest: digest.to_string(),
            ..Default::default()
        }),
        requests_total: 42,
        config_generation: 1,
        ..Default::default()
    }
}

/// A filled cache of `objects`, as a reflector would have it after its first list.
fn filled<K>(objects: Vec<K>) -> (Store<K>, Writer<K>)
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Default,
{
    let (store, mut writer) = reflector::store();
    writer.apply_watcher_event(&watcher::Event::Init);
    for o in objects {
        writer.apply_watcher_event(&watcher::Event::InitApply(o));
    }
    writer.apply_watcher_event(&watcher::Event::InitDone);
    (store, writer)
}

/// The writers of every cache, for the tests to play the watches.
struct Writers {
    _ingresses: Writer<Ingress>,
    listeners: Writer<Http3Listener>,
    _classes: Writer<IngressClass>,
    _pods: Writer<Pod>,
    /// The cluster-wide Secret metadata.
    secrets: Writer<PartialObjectMeta<Secret>>,
    roles: Writer<PartialObjectMeta<Role>>,
    role_bindings: Writer<PartialObjectMeta<RoleBinding>>,
    services: Writer<PartialObjectMeta<Service>>,
    service_accounts: Writer<PartialObjectMeta<ServiceAccount>>,
    cluster_roles: Writer<PartialObjectMeta<ClusterRole>>,
    cluster_role_bindings: Writer<PartialObjectMeta<ClusterRoleBinding>>,
    keys: Writer<PartialObjectMeta<Secret>>,
    mirrors: Writer<PartialObjectMeta<Secret>>,
    daemon_sets: Writer<DaemonSet>,
}

/// What the caches hold besides the Ingresses.
struct World {
    /// Other listeners in the controller's store.
    listeners: Vec<Http3Listener>,
    classes: Vec<IngressClass>,
    /// Roles and RoleBindings of the listeners, as the owned caches list them.
    roles: Vec<PartialObjectMeta<Role>>,
    role_bindings: Vec<PartialObjectMeta<RoleBinding>>,
    cluster_roles: Vec<PartialObjectMeta<ClusterRole>>,
    cluster_role_bindings: Vec<PartialObjectMeta<ClusterRoleBinding>>,
    service_accounts: Vec<PartialObjectMeta<ServiceAccount>>,
    daemon_sets: Vec<DaemonSet>,
    /// Mirrors in the hosts namespace.
    mirrors: Vec<PartialObjectMeta<Secret>>,
    /// The operators' Leases (which operators run, with which controller name).
    leases: Vec<Lease>,
    /// This operator's controller name.
    controller_name: &'static str,
    /// Whether the listener's Service exists.
    service: bool,
    /// Whether its pod runs.
    pod: bool,
    /// What the pod answers on /status.
    report: StatusReport,
}

/// A fresh install: nothing made yet, one pod that will have applied the mirror of
/// `web-tls` as the API server first stores it.
fn world() -> World {
    World {
        listeners: vec![],
        classes: vec![],
        roles: vec![],
        role_bindings: vec![],
        cluster_roles: vec![],
        cluster_role_bindings: vec![],
        service_accounts: vec![],
        daemon_sets: vec![],
        mirrors: vec![],
        leases: vec![],
        controller_name: h3_ingress::api::DEFAULT_CONTROLLER_NAME,
        service: false,
        pod: true,
        report: pod_report(&digest_at(MIRROR_RV)),
    }
}

struct Harness {
    ctx: Arc<Context>,
    handle: Option<Handle>,
    metrics: Arc<OperatorMetrics>,
    fetcher: Fetcher,
    w: Writers,
    /// The listener as the controller would pass it: with the status last written.
    listener: Http3Listener,
}

fn harness(is_leader: bool, ingresses: Vec<Ingress>) -> Harness {
    harness_in(is_leader, ingresses, world())
}

fn harness_in(is_leader: bool, ingresses: Vec<Ingress>, w: World) -> Harness {
    let (svc, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(svc, "default");
    let (ingress_store, i) = filled(ingresses);
    let (listener_store, l) = filled(w.listeners);
    let (classes, c) = filled(w.classes);
    let (pods, p) = filled(if w.pod { vec![pod()] } else { vec![] });
    let (secret_meta, s) = filled(vec![secret_meta("shop", "web-tls", SECRET_RV)]);
    let (roles, r) = filled(w.roles);
    let (role_bindings, rb) = filled(w.role_bindings);
    let services = match w.service {
        true => vec![owned_meta(NS, "h3-ingress-public", "public")],
        false => vec![],
    };
    let (services, sv) = filled(services);
    let (service_accounts, sa) = filled(w.service_accounts);
    let (cluster_roles, cr) = filled(w.cluster_roles);
    let (cluster_role_bindings, crb) = filled(w.cluster_role_bindings);
    let (keys, k) = filled(vec![]);
    let (mirrors, m) = filled(w.mirrors);
    let (daemon_sets, d) = filled(w.daemon_sets);
    let (leases, _) = filled(w.leases);
    let (_tx, rx) = watch::channel(is_leader);
    let metrics = OperatorMetrics::new();
    let fetcher = Fetcher::default();
    fetcher.set(w.report);
    let owned = OwnedStores {
        roles,
        role_bindings,
        services,
        service_accounts,
        cluster_roles,
        cluster_role_bindings,
        keys,
        mirrors,
        daemon_sets,
    };
    let caches = Caches {
        ingresses: ingress_store,
        listeners: listener_store,
        classes,
        owned,
        gateway_api: None,
        traefik: None,
        pods,
        // A GET without an answer fails the read after this long (10 s in the operator).
        secrets: SourceSecrets::with_store(secret_meta).with_read_timeout(READ_TIMEOUT),
        leases,
    };
    let params = Params {
        namespace: NS.into(),
        default_image: "ghcr.io/h3-ingress/h3-ingress:test".into(),
        hosts_namespace: HOSTS.into(),
    };
    let reporter = Reporter {
        controller: "h3-ingress-operator".into(),
        instance: Some("operator-0".into()),
    };
    let ctx = Context::new(
        client,
        params,
        caches,
        rx,
        Arc::new(fetcher.clone()),
        reporter,
        metrics.clone(),
    )
    .with_controller_name(w.controller_name);
    // As `run` does once every cache listed.
    ctx.caches_ready.store(true, Ordering::Release);
    let w = Writers {
        _ingresses: i,
        listeners: l,
        _classes: c,
        _pods: p,
        secrets: s,
        roles: r,
        role_bindings: rb,
        services: sv,
        service_accounts: sa,
        cluster_roles: cr,
        cluster_role_bindings: crb,
        keys: k,
        mirrors: m,
        daemon_sets: d,
    };
    Harness {
        ctx: Arc::new(ctx),
        handle: Some(handle),
        metrics,
        fetcher,
        w,
        listener: listener(),
    }
}

fn apply<K: kube::Resource + Clone>(writer: &mut Writer<K>, object: K)
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    writer.apply_watcher_event(&watcher::Event::Apply(object));
}

fn delete<K: kube::Resource + Clone>(writer: &mut Writer<K>, object: K)
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    writer.apply_watcher_event(&watcher::Event::Delete(object));
}

impl Harness {
    /// One reconcile of `self.listener` against `script`: its result (an error as text) and
    /// every request answered.
    async fn try_run(&mut self, script: Vec<Expect>) -> (Result<Action, String>, Vec<Answered>) {
        let handle = self.handle.take().expect("one reconcile at a time");
        let server = tokio::spawn(verifier(handle, script));
        let l = Arc::new(self.listener.clone());
        let result =
            tokio::time::timeout(Duration::from_secs(10), reconcile(l, self.ctx.clone())).await;
        // The script's verdict first: a failed check there also fails the reconcile.
        let (handle, answered) = match server.await {
            Ok(done) => done,
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        };
        self.handle = Some(handle);
        let result = result.expect("reconcile finished");
        (result.map_err(|e| e.to_string()), answered)
    }

    /// One reconcile that must succeed.
    async fn run(&mut self, script: Vec<Expect>) -> (Action, Vec<Answered>) {
        let (result, answered) = self.try_run(script).await;
        (result.expect("reconcile succeeded"), answered)
    }

    /// One reconcile that must fail after the script (an API call the API server refused).
    async fn run_failing(&mut self, script: Vec<Expect>) -> String {
        let (result, _) = self.try_run(script).await;
        result.expect_err("reconcile must report the refused call")
    }

    /// Plays the watches: every object the API server stored or deleted reaches the caches
    /// as it answered it (resourceVersion, generation, status), and the listener comes back
    /// with the status last written.
    fn feed(&mut self, answered: &[Answered]) {
        for a in answered.iter().filter(|a| (200..300).contains(&a.code)) {
            match a.method.as_str() {
                "PATCH" | "POST" => self.stored(&a.body),
                "DELETE" => self.deleted(&a.path),
                _ => {}
            }
        }
    }

    fn stored(&mut self, object: &Value) {
        let meta: ObjectMeta = serde_json::from_value(object["metadata"].clone()).unwrap();
        let w = &mut self.w;
        match object["kind"].as_str().unwrap_or_default() {
            "ServiceAccount" => apply(&mut w.service_accounts, meta.into_request_partial()),
            "ClusterRole" => apply(&mut w.cluster_roles, meta.into_request_partial()),
            "ClusterRoleBinding" => {
                apply(&mut w.cluster_role_bindings, meta.into_request_partial())
            }
            "Role" => apply(&mut w.roles, meta.into_request_partial()),
            "RoleBinding" => apply(&mut w.role_bindings, meta.into_request_partial()),
            "Service" => apply(&mut w.services, meta.into_request_partial()),
            "Secret" if meta.namespace.as_deref() == Some(NS) => {
                apply(&mut w.keys, meta.into_request_partial())
            }
            "Secret" => apply(&mut w.mirrors, meta.into_request_partial()),
            "DaemonSet" => apply(
                &mut w.daemon_sets,
                serde_json::from_value(object.clone()).unwrap(),
            ),
            "Http3Listener" => {
                self.listener = serde_json::from_value(object.clone()).unwrap();
                apply(&mut w.listeners, self.listener.clone());
            }
            "Event" => {}
            other => panic!("no cache for {other}: {object}"),
        }
    }

    fn deleted(&mut self, path: &str) {
        let parts: Vec<&str> = path.split('/').collect();
        let (resource, name) = (parts[parts.len() - 2], parts[parts.len() - 1]);
        let ns = parts
            .iter()
            .position(|p| *p == "namespaces")
            .map(|i| parts[i + 1].to_string());
        let meta = ObjectMeta {
            name: Some(name.into()),
            namespace: ns,
            ..Default::default()
        };
        let w = &mut self.w;
        match resource {
            "roles" => delete(&mut w.roles, meta.into_request_partial()),
            "clusterroles" => delete(&mut w.cluster_roles, meta.into_request_partial()),
            "clusterrolebindings" => {
                delete(&mut w.cluster_role_bindings, meta.into_request_partial())
            }
            "serviceaccounts" => delete(&mut w.service_accounts, meta.into_request_partial()),
            "daemonsets" => delete(
                &mut w.daemon_sets,
                DaemonSet {
                    metadata: meta,
                    ..Default::default()
                },
            ),
            "rolebindings" => delete(&mut w.role_bindings, meta.into_request_partial()),
            "services" => delete(&mut w.services, meta.into_request_partial()),
            "secrets" => delete(&mut w.mirrors, meta.into_request_partial()),
            other => panic!("no cache for {other}: {path}"),
        }
    }

    /// The Secret metadata watch sees `shop/web-tls` at `rv`.
    fn secret_changed(&mut self, rv: &str) {
        apply(&mut self.w.secrets, secret_meta("shop", "web-tls", rv));
    }
}

/// The counters a reconcile moves, to compare before and after.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
struct Counts {
    applies: u64,
    mirror_writes: u64,
    mirror_deletes: u64,
    secret_reads: u64,
    status_writes: u64,
    events: u64,
}

impl Counts {
    fn of(m: &OperatorMetrics) -> Self {
        Counts {
            applies: m.applies.get(),
            mirror_writes: m.mirror_writes.get(),
            mirror_deletes: m.mirror_deletes.get(),
            secret_reads: m.secret_reads.get(),
            status_writes: m.status_writes.get(),
            events: m.events.with_label_values(&["Normal"]).get()
                + m.events.with_label_values(&["Warning"]).get(),
        }
    }
}

/// The one GET of the referenced Secret that exists (`shop/missing` does not: the metadata
/// cache says so, and it is not asked for).
fn secret_read(secret: Secret) -> Expect {
    expect("GET", WEB_TLS, move |_, _| {
        (200, serde_json::to_value(secret).unwrap())
    })
}

fn data_of(body: &Value, key: &str) -> Vec<u8> {
    let b: ByteString = serde_json::from_value(body["data"][key].clone()).unwrap();
    b.0
}

/// The mirror of `secret` in the hosts namespace, applied server-side, checked against the
/// Secret it copies; the API server stores it at `rv`. No `previous.json`: nothing replaced.
fn mirror_write(secret: &Secret, rv: &'static str) -> Expect {
    mirror_write_replacing(secret, None, rv)
}

/// [`mirror_write`] of a certificate that replaced the one of `replaced`: the mirror also
/// carries that one's leaf and when it was replaced, outside its content hash.
fn mirror_write_replacing(secret: &Secret, replaced: Option<&Secret>, rv: &'static str) -> Expect {
    let old_leaf = replaced.map(|r| {
        let pem = String::from_utf8(r.data.as_ref().unwrap()["tls.crt"].0.clone()).unwrap();
        let end =
            pem.find("-----END CERTIFICATE-----").unwrap() + "-----END CERTIFICATE-----".len();
        format!("{}\n", &pem[..end])
    });
    let data = secret.data.clone().unwrap();
    let (cert, key) = (data["tls.crt"].0.clone(), data["tls.key"].0.clone());
    let name = mirror_of("web-tls");
    let path = format!("/api/v1/namespaces/{HOSTS}/secrets/{name}");
    expect("PATCH", path, move |q, mut body| {
        assert_ours(q, "mirror");
        assert_eq!(body["kind"], "Secret");
        assert_eq!(body["type"], mirror::SECRET_TYPE);
        let meta = &body["metadata"];
        assert_eq!(meta["labels"][mirror::LISTENER_LABEL], "public", "{body}");
        assert_eq!(
            meta["annotations"][mirror::SOURCE_ANNOTATION],
            "shop/web-tls"
        );
        assert_eq!(meta["ownerReferences"][0]["name"], "public");
        assert_eq!(data_of(&body, mirror::CERT_KEY), cert);
        assert_eq!(data_of(&body, mirror::KEY_KEY), key);
        let hosts_json = data_of(&body, mirror::HOSTS_KEY);
        let doc: HostsDocument = serde_json::from_slice(&hosts_json).unwrap();
        let a = MirroredHost {
            name: "a.example.com".into(),
            upstream: None,
            source: "Ingress shop/web".into(),
            ..Default::default()
        };
        assert_eq!(doc.hosts, [a]);
        assert_eq!(
            meta["annotations"][mirror::CONTENT_ANNOTATION],
            mirror::content_hash(&cert, &key, &hosts_json)
        );
        match &old_leaf {
            None => assert!(body["data"].get(mirror::PREVIOUS_KEY).is_none(), "{body}"),
            Some(leaf) => {
                let p: mirror::PreviousLeaf =
                    serde_json::from_slice(&data_of(&body, mirror::PREVIOUS_KEY)).unwrap();
                assert_eq!(&p.certificate, leaf);
                let now = h3_ingress::config::file::unix_now();
                assert!((now - p.replaced_at).abs() < 60, "{p:?}");
            }
        }
        body["metadata"]["resourceVersion"] = rv.into();
        (200, body)
    })
}

/// A mirror deleted from the hosts namespace.
fn mirror_delete(name: String) -> Expect {
    let path = format!("/api/v1/namespaces/{HOSTS}/secrets/{name}");
    expect("DELETE", path, |_, body| {
        assert_eq!(body["propagationPolicy"], "Background");
        success()
    })
}

/// The listener's QUIC keys Secret when the cache does not have it: read, and created with
/// 64 random bytes (immutable, owned by the listener) only when it does not exist.
fn keys_secret(exists: bool) -> Vec<Expect> {
    let path = format!("/api/v1/namespaces/{NS}/secrets/h3-ingress-keys-public");
    if exists {
        return vec![expect("GET", path, |_, _| {
            let keys = json!({"apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": "h3-ingress-keys-public", "namespace": NS},
                "immutable": true, "data": {"key": "c2VjcmV0"}});
            (200, stamped(keys))
        })];
    }
    vec![
        expect("GET", path, |_, _| {
            not_found("secrets \"h3-ingress-keys-public\"")
        }),
        expect(
            "POST",
            format!("/api/v1/namespaces/{NS}/secrets"),
            |_, body| {
                assert_eq!(body["metadata"]["name"], "h3-ingress-keys-public");
                assert_eq!(body["immutable"], true);
                assert_eq!(body["metadata"]["ownerReferences"][0]["name"], "public");
                let key = body["data"]["key"].as_str().unwrap();
                let bytes: ByteString = serde_json::from_value(json!(key)).unwrap();
                assert_eq!(bytes.0.len(), 64, "{key}");
                (201, stamped(body))
            },
        ),
    ]
}

/// ServiceAccount, ClusterRole(Binding), and the one Role(Binding), in the hosts namespace.
fn rbac_applies() -> Vec<Expect> {
    vec![
        ssa(
            format!("/api/v1/namespaces/{NS}/serviceaccounts/h3-ingress-public"),
            "ServiceAccount",
        ),
        ssa(format!("{RBAC}/clusterroles/{CLUSTER_RBAC}"), "ClusterRole"),
        ssa(
            format!("{RBAC}/clusterrolebindings/{CLUSTER_RBAC}"),
            "ClusterRoleBinding",
        ),
        expect(
            "PATCH",
            format!("{RBAC}/namespaces/{HOSTS}/roles/h3-ingress-data-plane-public"),
            |q, body| {
                assert_ours(q, "Role");
                // The mirrors, read-only; no user's Secret anywhere.
                assert_eq!(
                    body["rules"],
                    json!([{"apiGroups": [""], "resources": ["secrets"],
                        "verbs": ["get", "list", "watch"]}])
                );
                assert_eq!(body["metadata"]["ownerReferences"][0]["name"], "public");
                (200, stamped(body))
            },
        ),
        ssa(
            format!("{RBAC}/namespaces/{HOSTS}/rolebindings/h3-ingress-data-plane-public"),
            "RoleBinding",
        ),
    ]
}

/// The DaemonSet's apply, answered with generation 1 and `status`.
fn daemon_set_with(status: Value) -> Expect {
    expect("PATCH", DAEMON_SET, move |q, mut body| {
        assert_ours(q, "DaemonSet");
        let pod = &body["spec"]["template"]["spec"];
        assert_eq!(pod["hostNetwork"], true);
        assert_eq!(
            pod["containers"][0]["args"],
            json!([
                "proxy",
                "--listener",
                "public",
                "--keys-file",
                "/etc/h3-ingress/keys/key",
                "--hosts-namespace",
                HOSTS
            ])
        );
        assert_eq!(
            pod["volumes"][1]["secret"]["secretName"],
            "h3-ingress-keys-public"
        );
        assert_eq!(
            pod["containers"][0]["image"],
            "ghcr.io/h3-ingress/h3-ingress:test"
        );
        assert_eq!(
            body["metadata"]["ownerReferences"][0]["uid"],
            "5e1f0000-0000-4000-8000-000000000001"
        );
        body["metadata"]["generation"] = 1.into();
        body["metadata"]["uid"] = "d5000000-0000-4000-8000-000000000005".into();
        body["status"] = status;
        (200, stamped(body))
    })
}

/// The DaemonSet's apply; its one pod is ready.
fn daemon_set() -> Expect {
    daemon_set_with(
        json!({"currentNumberScheduled": 1, "desiredNumberScheduled": 1,
        "numberMisscheduled": 0, "numberReady": 1, "observedGeneration": 1}),
    )
}

/// Every request of a fresh install's first reconcile before the status: the Secret read,
/// its mirror written, the keys Secret made, and every object applied. No pod list: pods
/// come from the cache.
fn first_script(secret: &Secret) -> Vec<Expect> {
    let mut script = vec![secret_read(secret.clone()), mirror_write(secret, MIRROR_RV)];
    script.extend(keys_secret(false));
    script.extend(rbac_applies());
    script.push(daemon_set());
    script
}

/// The status patch, captured into `log`; answered with the listener holding that status.
fn status_patch(log: Arc<Mutex<Vec<Value>>>) -> Expect {
    expect("PATCH", STATUS, move |q, body| {
        assert_ours(q, "status");
        assert_eq!(body["apiVersion"], "h3-ingress.dev/v1alpha1");
        assert_eq!(body["kind"], "Http3Listener");
        log.lock().unwrap().push(body.clone());
        let mut l = serde_json::to_value(listener()).unwrap();
        l["status"] = body["status"].clone();
        (200, stamped(l))
    })
}

fn event(
    ns: &'static str,
    kind: &'static str,
    type_: &'static str,
    reason: &'static str,
    note_start: &'static str,
) -> Expect {
    expect(
        "POST",
        format!("/apis/events.k8s.io/v1/namespaces/{ns}/events"),
        move |_, body| {
            assert_eq!(body["regarding"]["kind"], kind, "{body}");
            assert_eq!(
                (body["type"].as_str(), body["reason"].as_str()),
                (Some(type_), Some(reason)),
                "{body}"
            );
            assert!(
                body["note"].as_str().unwrap().starts_with(note_start),
                "{body}"
            );
            assert_eq!(body["reportingController"], "h3-ingress-operator");
            (201, body)
        },
    )
}

/// A Warning on the listener (the events of conditions gone bad).
fn warning(reason: &'static str, note_start: &'static str) -> Expect {
    event("default", "Http3Listener", "Warning", reason, note_start)
}

/// The listener's Degraded warning while `missing.example.com` is not served.
fn degraded() -> Expect {
    warning("SomeHostsNotServing", "Degraded is True")
}

/// The same event on the listener and on the Ingress `shop/web` (a host's transition).
fn on_both(type_: &'static str, reason: &'static str, note_start: &'static str) -> [Expect; 2] {
    [
        event("default", "Http3Listener", type_, reason, note_start),
        event("shop", "Ingress", type_, reason, note_start),
    ]
}

/// Why `missing.example.com` is not served: its Secret does not exist.
const MISSING_NOTE: &str =
    "HTTP/3 not served for missing.example.com: Secret shop/missing not found";

/// A listener's first status announces `missing.example.com`, whose Secret does not exist.
fn missing_refused() -> [Expect; 2] {
    on_both("Warning", reasons::SECRET_NOT_FOUND, MISSING_NOTE)
}

/// `a.example.com` served.
fn a_enabled() -> [Expect; 2] {
    on_both("Normal", "Http3Enabled", "HTTP/3 enabled for a.example.com")
}

/// An event the recorder already published on the object in `ns` with this reason and action
/// (for a host event, the same host), published again: kube's recorder keys events by reason,
/// action and object (not note), so it PATCHes the first one's series to `count`, the first
/// one's note (`note_start`) unchanged.
fn repeated(
    ns: &'static str,
    reason: &'static str,
    note_start: &'static str,
    count: u64,
) -> Expect {
    let path = format!("/apis/events.k8s.io/v1/namespaces/{ns}/events/*");
    expect("PATCH", path, move |_, body| {
        assert_eq!(body["reason"], reason, "{body}");
        assert!(
            body["note"].as_str().unwrap().starts_with(note_start),
            "{body}"
        );
        assert_eq!(body["series"]["count"], count, "{body}");
        (200, body)
    })
}

/// The status patch and the events of the first reconcile of `listener()` with `ingress()`.
/// The listener has no status yet, so each host is announced on it and on the Ingress:
/// `a.example.com` served, `missing.example.com` not (its Secret is missing). Then Ready
/// (one of two hosts) and Degraded (the missing Secret).
fn first_status(log: Arc<Mutex<Vec<Value>>>) -> Vec<Expect> {
    let mut script = vec![status_patch(log)];
    script.extend(a_enabled());
    script.extend(missing_refused());
    script.push(event(
        "default",
        "Http3Listener",
        "Normal",
        "SomeHostsServing",
        "Ready is True: 1 of 2 hosts served",
    ));
    script.push(degraded());
    script
}

fn status_of(patch: &Value) -> Http3ListenerStatus {
    serde_json::from_value(patch["status"].clone()).unwrap()
}

fn condition<'a>(s: &'a Http3ListenerStatus, t: &str) -> (&'a str, &'a str) {
    let c = s.conditions.iter().find(|c| c.type_ == t).unwrap();
    (c.status.as_str(), c.reason.as_str())
}

fn ready_message(s: &Http3ListenerStatus) -> &str {
    let c = s.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    c.message.as_str()
}

fn count(state: &str, reason: &str, n: i64) -> HostCount {
    HostCount {
        state: state.into(),
        reason: reason.into(),
        count: n,
    }
}

/// The status entry of `missing.example.com`, whose Secret does not exist.
fn missing_host() -> HostStatus {
    HostStatus {
        name: "missing.example.com".into(),
        origin: h3_ingress::api::HostOrigin::ingress("shop/web"),
        secret: Some("shop/missing".into()),
        state: "NotServing".into(),
        reason: reasons::SECRET_NOT_FOUND.into(),
        message: "Secret shop/missing not found".into(),
        ..Default::default()
    }
}

#[tokio::test]
async fn leader_writes_the_mirror_applies_objects_writes_status_and_publishes_events() {
    let mut h = harness(true, vec![ingress()]);
    let secret = tls_secret(SECRET_RV);
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut script = first_script(&secret);
    script.extend(first_status(log.clone()));
    let (action, _) = h.run(script).await;
    assert_eq!(action, Action::requeue(REQUEUE));

    let s = status_of(&log.lock().unwrap()[0]);
    assert_eq!(s.observed_generation, Some(2));
    assert_eq!(s.hosts_summary.as_deref(), Some("1/2"));
    assert_eq!(condition(&s, "Ready"), ("True", "SomeHostsServing"));
    assert_eq!(condition(&s, "SocketsBound"), ("True", "Bound"));
    assert_eq!(condition(&s, "BuffersApplied"), ("True", "Applied"));
    assert_eq!(condition(&s, "Degraded"), ("True", "SomeHostsNotServing"));
    // Counted by state and reason; only the host not served is listed.
    assert_eq!(
        s.host_counts,
        [
            count("NotServing", reasons::SECRET_NOT_FOUND, 1),
            count("Serving", reasons::SERVING, 1)
        ]
    );
    assert_eq!(s.hosts, [missing_host()]);
    assert_eq!(s.hosts_omitted, 0);
    assert_eq!(s.nodes.as_ref().unwrap().summary, "1/1");
    assert_eq!(
        s.udp.as_ref().unwrap().min_receive_buffer_bytes,
        Some(8_388_608)
    );
    let m = &h.metrics;
    assert_eq!(
        Counts::of(m),
        Counts {
            applies: 6,
            mirror_writes: 1,
            mirror_deletes: 0,
            secret_reads: 1,
            status_writes: 1,
            events: 6,
        }
    );
    assert_eq!(m.events.with_label_values(&["Warning"]).get(), 3);
    assert_eq!(m.reconciles.with_label_values(&["ok"]).get(), 1);
}

/// A fresh install reconciled once, with everything it wrote back in the caches (as the
/// watches would have it). Returns the harness and the source Secret as read.
async fn settled() -> (Harness, Secret) {
    let mut h = harness(true, vec![ingress()]);
    let secret = tls_secret(SECRET_RV);
    let mut script = first_script(&secret);
    script.extend(first_status(Arc::default()));
    let (_, answered) = h.run(script).await;
    h.feed(&answered);
    (h, secret)
}

/// The point of the caches: with nothing changed, a reconcile reads the Secret from memory,
/// finds the mirror's content hash and every object's version unchanged, hears from the pods
/// that they serve the mirrors as written, and computes the same status: zero API calls.
#[tokio::test]
async fn at_steady_state_a_reconcile_makes_no_api_call_at_all() {
    let (mut h, _) = settled().await;
    let before = Counts::of(&h.metrics);
    for _ in 0..2 {
        // An empty script: any request fails the test.
        let (action, answered) = h.run(vec![]).await;
        assert_eq!(lines(&answered), Vec::<String>::new());
        assert_eq!(action, Action::requeue(REQUEUE));
    }
    assert_eq!(Counts::of(&h.metrics), before);
    assert_eq!(h.metrics.reconciles.with_label_values(&["ok"]).get(), 3);
}

/// A referenced Secret is fetched once per resourceVersion the metadata watch reports: the
/// same version costs nothing, a new one exactly one GET (and, its content being the same,
/// nothing else).
#[tokio::test]
async fn a_referenced_secret_is_read_once_per_resource_version() {
    let (mut h, secret) = settled().await;
    assert_eq!(h.metrics.secret_reads.get(), 1);
    let (_, answered) = h.run(vec![]).await;
    assert!(answered.is_empty());
    assert_eq!(h.metrics.secret_reads.get(), 1, "same version, no read");

    // A label edit: new version, same data.
    h.secret_changed("8");
    let mut same = secret.clone();
    same.metadata.resource_version = Some("8".into());
    let before = Counts::of(&h.metrics);
    let (_, answered) = h.run(vec![secret_read(same)]).await;
    assert_eq!(lines(&answered), [format!("GET {WEB_TLS}")]);
    assert_eq!(
        Counts::of(&h.metrics),
        Counts {
            secret_reads: before.secret_reads + 1,
            ..before
        }
    );
    let (_, answered) = h.run(vec![]).await;
    assert!(answered.is_empty(), "version 8 is kept now");
}

/// A rotated certificate (cert-manager renewing it) costs one Secret GET and one mirror
/// write; the pods, once they load it, report the new digest and the status stays as it was.
#[tokio::test]
async fn a_rotated_secret_costs_one_read_and_one_mirror_write() {
    let (mut h, original) = settled().await;
    let rotated = tls_secret("8");
    h.secret_changed("8");
    h.fetcher.set(pod_report(&digest_at("202")));
    let before = Counts::of(&h.metrics);
    // The mirror also says which leaf the new certificate replaced (for a pod that starts
    // during the renewal grace), at no extra request.
    let write = mirror_write_replacing(&rotated, Some(&original), "202");
    let script = vec![secret_read(rotated.clone()), write];
    let (action, answered) = h.run(script).await;
    let mirror = format!(
        "/api/v1/namespaces/{HOSTS}/secrets/{}",
        mirror_of("web-tls")
    );
    assert_eq!(
        lines(&answered),
        [format!("GET {WEB_TLS}"), format!("PATCH {mirror}")]
    );
    assert_eq!(action, Action::requeue(REQUEUE));
    assert_eq!(
        Counts::of(&h.metrics),
        Counts {
            secret_reads: before.secret_reads + 1,
            mirror_writes: before.mirror_writes + 1,
            ..before
        }
    );
    // Once the watch brings the mirror back, nothing more.
    h.feed(&answered);
    let (_, answered) = h.run(vec![]).await;
    assert!(answered.is_empty(), "{:?}", lines(&answered));
}

/// The host's entry in a status: state, reason and message.
fn host_entry(s: &Http3ListenerStatus, name: &str) -> Option<(String, String)> {
    s.hosts
        .iter()
        .find(|h| h.name == name)
        .map(|h| (h.state.clone(), h.reason.clone()))
}

/// A read of the referenced Secret that fails while its content moved (a rotation the
/// metadata watch reported): a 500, then no answer at all. The operator keeps the pair it
/// read before: the mirror is neither deleted nor rewritten (the pods keep serving), the host
/// stays `Serving` with reason `SecretUnreadable`, `Degraded` says which Secret and why, and
/// the read is tried again soon. Then a 404: the Secret is gone, the mirror is deleted and
/// the host is no longer served.
#[tokio::test]
async fn a_failed_secret_read_keeps_the_last_good_certificate_until_a_404() {
    let (mut h, secret) = settled().await;
    let before = h.ctx.caches.secrets.pair(&secret_ref("web-tls")).unwrap();
    assert_eq!(before.cert, secret.data.as_ref().unwrap()["tls.crt"].0);
    h.secret_changed("8");
    let log = Arc::new(Mutex::new(Vec::new()));
    let failing = expect("GET", WEB_TLS, |_, _| {
        api_status(500, "InternalError", "etcdserver: request timed out")
    });
    // No mirror write and no DELETE: any would fail the script.
    let (action, answered) = h.run(vec![failing, status_patch(log.clone())]).await;
    h.feed(&answered);
    assert_eq!(action, Action::requeue(UNREADABLE_REQUEUE));
    let s = status_of(&log.lock().unwrap()[0]);
    assert_eq!(condition(&s, "Ready"), ("True", "SomeHostsServing"));
    assert!(s
        .host_counts
        .contains(&count("Serving", reasons::SECRET_UNREADABLE, 1)));
    let degraded = s.conditions.iter().find(|c| c.type_ == "Degraded").unwrap();
    assert!(
        degraded.message.contains(
            "1 hosts keep the last good certificate of a Secret that cannot be read \
             (a.example.com); serving the last good certificate: reading Secret shop/web-tls \
             failed: 500 InternalError: etcdserver: request timed out"
        ),
        "{}",
        degraded.message
    );
    assert_eq!(h.metrics.secret_read_errors.get(), 1);
    let kept = h.ctx.caches.secrets.pair(&secret_ref("web-tls")).unwrap();
    assert_eq!(kept.cert, before.cert, "the last good pair is kept");

    // No answer: the same, with the timeout as the reason.
    let script = vec![unanswered("GET", WEB_TLS), status_patch(log.clone())];
    let (action, answered) = h.run(script).await;
    h.feed(&answered);
    assert_eq!(action, Action::requeue(UNREADABLE_REQUEUE));
    let s = status_of(&log.lock().unwrap()[1]);
    let degraded = s.conditions.iter().find(|c| c.type_ == "Degraded").unwrap();
    assert!(
        degraded
            .message
            .contains("reading Secret shop/web-tls failed: no answer within 0.3 s"),
        "{}",
        degraded.message
    );
    assert_eq!(h.metrics.secret_read_errors.get(), 2);
    assert_eq!(h.metrics.mirror_deletes.get(), 0);

    // A 404: the Secret is gone. The mirror goes, and the host is no longer served.
    let mut script = vec![
        expect("GET", WEB_TLS, |_, _| not_found("secrets \"web-tls\"")),
        mirror_delete(mirror_of("web-tls")),
        status_patch(log.clone()),
    ];
    // The listener and the Ingress already had a SecretNotFound, missing.example.com's: each
    // host's events are a series of their own (their action names the host), so
    // a.example.com's is new and names it.
    script.extend(on_both(
        "Warning",
        reasons::SECRET_NOT_FOUND,
        "HTTP/3 not served for a.example.com",
    ));
    script.push(warning("NoHostsServing", "Ready is False"));
    let (_, answered) = h.run(script).await;
    h.feed(&answered);
    let s = status_of(&log.lock().unwrap()[2]);
    assert_eq!(
        host_entry(&s, "a.example.com"),
        Some(("NotServing".into(), reasons::SECRET_NOT_FOUND.into()))
    );
    assert_eq!(h.metrics.mirror_deletes.get(), 1);
    assert!(h.ctx.caches.secrets.pair(&secret_ref("web-tls")).is_none());
}

/// As a rotation happens: the reconcile asks the pods right after writing the mirror, before
/// they can have loaded it. The host is still served with the certificate they have, so it
/// stays `Serving` (no status write, no Ready flip, no warning); the listener is looked at
/// again soon, and once the pods report the new digest nothing more is written.
#[tokio::test]
async fn a_renewed_certificate_keeps_its_host_serving_while_the_pods_load_it() {
    let (mut h, original) = settled().await;
    let rotated = tls_secret("8");
    h.secret_changed("8");
    let before = Counts::of(&h.metrics);
    let write = mirror_write_replacing(&rotated, Some(&original), "202");
    let script = vec![secret_read(rotated.clone()), write];
    let (action, answered) = h.run(script).await;
    assert_eq!(answered.len(), 2, "{:?}", lines(&answered));
    assert_eq!(action, Action::requeue(SETTLE_REQUEUE));
    assert_eq!(Counts::of(&h.metrics).status_writes, before.status_writes);
    assert_eq!(Counts::of(&h.metrics).events, before.events);

    h.feed(&answered);
    h.fetcher.set(pod_report(&digest_at("202")));
    let (action, answered) = h.run(vec![]).await;
    assert!(answered.is_empty(), "{:?}", lines(&answered));
    assert_eq!(action, Action::requeue(REQUEUE));
}

/// Metadata of a cluster-scoped object made for `listener`, labelled with the namespace of the
/// operator that made it (none: a version before release-scoped names).
fn cluster_meta<K>(name: &str, listener: &str, operator: Option<&str>) -> PartialObjectMeta<K>
where
    K: kube::Resource<DynamicType = ()>,
{
    let mut labels = BTreeMap::from([(
        "app.kubernetes.io/instance".to_string(),
        listener.to_string(),
    )]);
    if let Some(ns) = operator {
        labels.insert("h3-ingress.dev/operator-namespace".into(), ns.into());
    }
    ObjectMeta {
        name: Some(name.into()),
        resource_version: Some("50".into()),
        labels: Some(labels),
        ..Default::default()
    }
    .into_request_partial()
}

/// The legacy ClusterRoleBinding as the API server has it, binding the data plane
/// ServiceAccount of namespace `ns`.
fn legacy_binding(ns: &'static str) -> Expect {
    expect(
        "GET",
        format!("{RBAC}/clusterrolebindings/{LEGACY_RBAC}"),
        move |_, _| {
            (
                200,
                json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                    "metadata": {"name": LEGACY_RBAC, "resourceVersion": "50",
                        "labels": {"app.kubernetes.io/instance": "public"}},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": LEGACY_RBAC},
                    "subjects": [{"kind": "ServiceAccount", "name": "h3-ingress-public",
                        "namespace": ns}]}),
            )
        },
    )
}

fn deleted(path: String) -> Expect {
    expect("DELETE", path, |_, body| {
        assert_eq!(body["propagationPolicy"], "Background");
        success()
    })
}

/// What the listener no longer needs goes: the mirror of a Secret no host uses now, and the
/// ClusterRole(Binding) a version before release-scoped names made, once the binding is seen
/// to bind this operator's ServiceAccount. Other listeners' objects stay.
#[tokio::test]
async fn obsolete_mirrors_and_cluster_rbac_named_before_release_scoping_are_deleted() {
    let old = mirror_of("old-tls");
    let w = World {
        mirrors: vec![
            owned_meta(HOSTS, &old, "public"),
            owned_meta(HOSTS, "other-0123456789abcdef", "other"),
        ],
        cluster_roles: vec![
            cluster_meta(LEGACY_RBAC, "public", None),
            cluster_meta("h3-ingress-data-plane-other", "other", None),
        ],
        cluster_role_bindings: vec![cluster_meta(LEGACY_RBAC, "public", None)],
        ..world()
    };
    let mut h = harness_in(true, vec![ingress()], w);
    let secret = tls_secret(SECRET_RV);
    let mut script = vec![
        secret_read(secret.clone()),
        mirror_write(&secret, MIRROR_RV),
        mirror_delete(old),
    ];
    script.extend(keys_secret(false));
    script.extend(rbac_applies());
    script.push(daemon_set());
    script.push(legacy_binding(NS));
    script.push(deleted(format!("{RBAC}/clusterrolebindings/{LEGACY_RBAC}")));
    script.push(deleted(format!("{RBAC}/clusterroles/{LEGACY_RBAC}")));
    script.extend(first_status(Arc::default()));
    let (_, answered) = h.run(script).await;
    assert_eq!(h.metrics.mirror_deletes.get(), 1);
    // The deletions reach the caches: nothing is deleted twice.
    h.feed(&answered);
    let (_, answered) = h.run(vec![]).await;
    assert!(answered.is_empty(), "{:?}", lines(&answered));
}

/// Two installations of a version before release-scoped names each applied the one
/// ClusterRoleBinding of a listener in turn; the one that binds the other installation's
/// ServiceAccount is that installation's to remove.
#[tokio::test]
async fn a_legacy_binding_of_another_installation_is_left_alone() {
    let w = World {
        cluster_roles: vec![cluster_meta(LEGACY_RBAC, "public", None)],
        cluster_role_bindings: vec![cluster_meta(LEGACY_RBAC, "public", None)],
        ..world()
    };
    let mut h = harness_in(true, vec![ingress()], w);
    let mut script = first_script(&tls_secret(SECRET_RV));
    script.push(legacy_binding("staging"));
    script.extend(first_status(Arc::default()));
    h.run(script).await;
}

/// A running operator's Lease: in namespace `ns`, with controller name `name`.
fn lease(ns: &str, name: &str) -> Lease {
    serde_json::from_value(json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "h3-ingress-operator", "namespace": ns,
            "labels": {"app.kubernetes.io/name": "h3-ingress",
                "app.kubernetes.io/component": "operator"},
            "annotations": {"h3-ingress.dev/controller-name": name}},
        "spec": {"holderIdentity": "x", "leaseDurationSeconds": 15,
            "renewTime": k8s_openapi::jiff::Timestamp::now().to_string()}
    }))
    .unwrap()
}

/// The listener named `controller` in spec.controllerName.
fn run_by(mut l: Http3Listener, controller: &str) -> Http3Listener {
    l.spec.controller_name = controller.into();
    l
}

/// A listener another running operator runs costs nothing; a data plane this operator still
/// has for it (a hand-over, or two installations of earlier versions both running it) stays
/// until the new owner's pods are ready on every node, then goes, every object of it and none
/// of the other operator's.
#[tokio::test]
async fn a_listener_of_another_operator_is_left_to_it_and_our_data_plane_goes_once_it_serves() {
    let mut h = harness_in(
        true,
        vec![ingress()],
        World {
            leases: vec![lease("prod", "example.com/prod")],
            ..world()
        },
    );
    h.listener = run_by(listener(), "example.com/prod");
    let (action, answered) = h.run(vec![]).await;
    assert!(answered.is_empty(), "{:?}", lines(&answered));
    assert_eq!(action, Action::requeue(REQUEUE));

    let ds: DaemonSet = serde_json::from_value(json!({
        "metadata": {"name": "h3-ingress-public", "namespace": NS,
            "labels": {"app.kubernetes.io/instance": "public"}}}))
    .unwrap();
    let w = World {
        leases: vec![lease("prod", "example.com/prod")],
        daemon_sets: vec![ds],
        service_accounts: vec![owned_meta(NS, "h3-ingress-public", "public")],
        roles: vec![owned_meta(HOSTS, LEGACY_RBAC, "public")],
        role_bindings: vec![owned_meta(HOSTS, LEGACY_RBAC, "public")],
        mirrors: vec![owned_meta(HOSTS, &mirror_of("web-tls"), "public")],
        cluster_roles: vec![
            cluster_meta(CLUSTER_RBAC, "public", Some(NS)),
            cluster_meta("prod.h3-ingress-data-plane-public", "public", Some("prod")),
        ],
        cluster_role_bindings: vec![
            cluster_meta(CLUSTER_RBAC, "public", Some(NS)),
            cluster_meta("prod.h3-ingress-data-plane-public", "public", Some("prod")),
        ],
        ..world()
    };
    let mut h = harness_in(true, vec![ingress()], w);
    h.listener = run_by(listener(), "example.com/prod");
    // The new owner has not written a status of this generation with every pod ready.
    let serving = |ready: i32| -> Option<Http3ListenerStatus> {
        serde_json::from_value(json!({"observedGeneration": 2,
            "nodes": {"desired": 2, "ready": ready, "summary": format!("{ready}/2")}}))
        .unwrap()
    };
    h.listener.status = serving(1);
    let (action, answered) = h.run(vec![]).await;
    assert!(answered.is_empty(), "{:?}", lines(&answered));
    assert_eq!(
        action,
        Action::requeue(h3_ingress::operator::controller::HAND_OVER_WAIT)
    );
    h.listener.status = serving(2);
    let script = vec![
        deleted(DAEMON_SET.into()),
        deleted(format!(
            "/api/v1/namespaces/{NS}/serviceaccounts/h3-ingress-public"
        )),
        deleted(format!("{RBAC}/namespaces/{HOSTS}/roles/{LEGACY_RBAC}")),
        deleted(format!(
            "{RBAC}/namespaces/{HOSTS}/rolebindings/{LEGACY_RBAC}"
        )),
        deleted(format!("{RBAC}/clusterrolebindings/{CLUSTER_RBAC}")),
        deleted(format!("{RBAC}/clusterroles/{CLUSTER_RBAC}")),
        mirror_delete(mirror_of("web-tls")),
    ];
    let (_, answered) = h.run(script).await;
    h.feed(&answered);
    let (_, answered) = h.run(vec![]).await;
    assert!(answered.is_empty(), "{:?}", lines(&answered));
    assert_eq!(h.metrics.applies.get(), 0);
}

/// Two running operators with one controller name: neither applies anything; the one in the
/// first namespace says so in the status, the other stays silent.
#[tokio::test]
async fn a_listener_two_operators_claim_is_refused_and_said_once() {
    let default = h3_ingress::api::DEFAULT_CONTROLLER_NAME;
    let mut h = harness_in(
        true,
        vec![ingress()],
        World {
            leases: vec![lease("aaa-first", default)],
            ..world()
        },
    );
    let (_, answered) = h.run(vec![]).await;
    assert!(
        answered.is_empty(),
        "the second in order writes nothing: {:?}",
        lines(&answered)
    );

    let mut h = harness_in(
        true,
        vec![ingress()],
        World {
            leases: vec![lease("zzz-second", default)],
            ..world()
        },
    );
    let log = Arc::new(Mutex::new(Vec::new()));
    let script = vec![
        status_patch(log.clone()),
        warning("ControllerConflict", "Ready is False"),
    ];
    h.run(script).await;
    let s = status_of(&log.lock().unwrap()[0]);
    assert_eq!(
        condition(&s, "Ready"),
        ("False", reasons::CONTROLLER_CONFLICT)
    );
    assert!(
        ready_message(&s).contains("namespaces h3-ingress, zzz-second"),
        "{}",
        ready_message(&s)
    );
    assert_eq!(s.conditions.len(), 1, "nothing but the refusal: {s:?}");
    assert_eq!(h.metrics.applies.get() + h.metrics.mirror_writes.get(), 0);
}

/// A controller name no running operator has: the first running operator says so.
#[tokio::test]
async fn a_listener_nobody_runs_is_refused_with_no_controller() {
    let mut h = harness(true, vec![ingress()]);
    h.listener = run_by(listener(), "example.com/gone");
    let log = Arc::new(Mutex::new(Vec::new()));
    let script = vec![
        status_patch(log.clone()),
        warning("NoController", "Ready is False"),
    ];
    h.run(script).await;
    let s = status_of(&log.lock().unwrap()[0]);
    assert_eq!(condition(&s, "Ready"), ("False", reasons::NO_CONTROLLER));
    assert!(
        ready_message(&s).contains(r#""example.com/gone""#)
            && ready_message(&s).contains(r#""h3-ingress.dev/operator" in namespace h3-ingress"#),
        "{}",
        ready_message(&s)
    );
    assert_eq!(h.metrics.applies.get(), 0);
}

/// Pods that have not loaded the mirrors as written (they report another digest) do not
/// serve the new host yet: `ConfigPending`, looked at again soon. When they catch up the
/// host is announced on the listener and its Ingress.
#[tokio::test]
async fn hosts_are_pending_until_the_pods_report_the_mirrors_as_written() {
    let w = World {
        report: pod_report(&digest_at("100")),
        ..world()
    };
    let mut h = harness_in(true, vec![ingress()], w);
    let secret = tls_secret(SECRET_RV);
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut script = first_script(&secret);
    // The pending host gets no event of its own; the refused one does.
    script.push(status_patch(log.clone()));
    script.extend(missing_refused());
    script.extend([warning("NoHostsServing", "Ready is False"), degraded()]);
    let (action, answered) = h.run(script).await;
    assert_eq!(action, Action::requeue(SETTLE_REQUEUE));
    let s = status_of(&log.lock().unwrap()[0]);
    assert_eq!(s.hosts_summary.as_deref(), Some("0/2"));
    let a = &s.hosts[0];
    assert_eq!(
        (a.name.as_str(), a.reason.as_str(), a.message.as_str()),
        (
            "a.example.com",
            reasons::CONFIG_PENDING,
            "not loaded yet by 1 of 1 data plane pods"
        )
    );
    assert_eq!(s.hosts[1], missing_host());

    // The pod has loaded them: one status write, the host's events, Ready's.
    h.feed(&answered);
    h.fetcher.set(pod_report(&digest_at(MIRROR_RV)));
    let log = Arc::new(Mutex::new(Vec::new()));
    let enabled = "HTTP/3 enabled for a.example.com";
    let script = vec![
        status_patch(log.clone()),
        event(
            "default",
            "Http3Listener",
            "Normal",
            "Http3Enabled",
            enabled,
        ),
        event("shop", "Ingress", "Normal", "Http3Enabled", enabled),
        event(
            "default",
            "Http3Listener",
            "Normal",
            "SomeHostsServing",
            "Ready is True: 1 of 2 hosts served",
        ),
    ];
    let (action, _) = h.run(script).await;
    assert_eq!(action, Action::requeue(REQUEUE));
    let s = status_of(&log.lock().unwrap()[0]);
    assert_eq!(s.hosts_summary.as_deref(), Some("1/2"));
    assert_eq!(s.hosts, [missing_host()]);
}

/// A pod that cannot serve from a mirror (it parses the certificate itself) has the last
/// word: its reason and message become the host's.
#[tokio::test]
async fn a_pods_mirror_failure_becomes_the_hosts_reason() {
    let mut report = pod_report(&digest_at(MIRROR_RV));
    let failure = MirrorFailure {
        mirror: mirror_of("web-tls"),
        source: "shop/web-tls".into(),
        host: None,
        reason: reasons::CERTIFICATE_INVALID.into(),
        message: "the private key does not match the certificate".into(),
    };
    let mirrors = report.mirrors.as_mut().unwrap();
    mirrors.failed = vec![failure];
    mirrors.failed_count = 1;
    let w = World { report, ..world() };
    let mut h = harness_in(true, vec![ingress()], w);
    let secret = tls_secret(SECRET_RV);
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut script = first_script(&secret);
    script.push(status_patch(log.clone()));
    let invalid = "HTTP/3 not served for a.example.com: h3-ingress-public-x7k2p on node-1: the private key does not match the certificate";
    script.extend(on_both("Warning", reasons::CERTIFICATE_INVALID, invalid));
    script.extend(missing_refused());
    script.extend([warning("NoHostsServing", "Ready is False"), degraded()]);
    h.run(script).await;
    let s = status_of(&log.lock().unwrap()[0]);
    let a = &s.hosts[0];
    assert_eq!(
        (a.name.as_str(), a.state.as_str(), a.reason.as_str()),
        ("a.example.com", "NotServing", reasons::CERTIFICATE_INVALID)
    );
    assert_eq!(
        a.message,
        format!("{POD} on node-1: the private key does not match the certificate")
    );
    assert_eq!(
        s.host_counts,
        [
            count("NotServing", reasons::CERTIFICATE_INVALID, 1),
            count("NotServing", reasons::SECRET_NOT_FOUND, 1)
        ]
    );
}

/// After a restart nothing is remembered: the Secret is read and every object applied again
/// (the operator cannot know what it applied), but the mirror, whose content hash the cache
/// shows, is not rewritten, the keys Secret is not read, and the stored status, unchanged, is
/// neither written nor announced again.
#[tokio::test]
async fn a_restarted_operator_does_not_rewrite_an_unchanged_status_or_mirror() {
    let mut h = harness(true, vec![ingress()]);
    let secret = tls_secret(SECRET_RV);
    let mut script = first_script(&secret);
    script.extend(first_status(Arc::default()));
    let (_, written) = h.run(script).await;

    // A while later, a new operator process whose caches list what the first one made.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let mut h = harness(true, vec![ingress()]);
    h.feed(&written);
    assert!(h.listener.status.is_some());
    let mut script = vec![secret_read(secret)];
    script.extend(rbac_applies());
    script.push(daemon_set());
    h.run(script).await;
    let c = Counts::of(&h.metrics);
    assert_eq!((c.applies, c.mirror_writes), (6, 0));
    assert_eq!((c.status_writes, c.events), (0, 0));
}

/// The status's counters (`udp.drops`) changing alone are written at most once a minute:
/// here the pods restarted and count their drops from zero again.
#[tokio::test]
async fn counters_alone_are_written_at_most_once_a_minute() {
    let (mut h, _) = settled().await;
    let stored = h.listener.status.clone().unwrap();
    assert_eq!(stored.udp.as_ref().unwrap().drops, 0);
    let mut earlier = stored.clone();
    earlier.udp.as_mut().unwrap().drops = 500;
    h.listener.status = Some(earlier.clone());
    let (_, answered) = h.run(vec![]).await;
    assert!(
        answered.is_empty(),
        "counters alone written within a minute"
    );

    // The stored counters are a minute old: now they are written, and nothing else changes.
    let minute_ago =
        k8s_openapi::jiff::Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_secs(61);
    earlier.counters_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        minute_ago,
    ));
    h.listener.status = Some(earlier.clone());
    let log = Arc::new(Mutex::new(Vec::new()));
    let (_, answered) = h.run(vec![status_patch(log.clone())]).await;
    assert_eq!(lines(&answered), [format!("PATCH {STATUS}")]);
    let written = status_of(&log.lock().unwrap()[0]);
    assert_eq!(written.udp.as_ref().unwrap().drops, 0);
    assert_eq!(
        written.conditions, earlier.conditions,
        "no event-worthy change"
    );
}

#[tokio::test]
async fn an_ingress_without_a_class_counts_for_the_default_class() {
    let mut classless = ingress();
    classless.spec.as_mut().unwrap().ingress_class_name = None;
    let nginx: IngressClass = serde_json::from_value(json!({
        "metadata": {"name": "nginx",
                     "annotations": {"ingressclass.kubernetes.io/is-default-class": "true"}}
    }))
    .unwrap();
    let w = World {
        classes: vec![nginx],
        ..world()
    };
    let mut h = harness_in(true, vec![classless], w);
    let log = Arc::new(Mutex::new(Vec::new()));
    // The same reads, writes and status as for an Ingress of class nginx.
    let mut script = first_script(&tls_secret(SECRET_RV));
    script.extend(first_status(log.clone()));
    h.run(script).await;
    let s = status_of(&log.lock().unwrap()[0]);
    assert_eq!(s.hosts_summary.as_deref(), Some("1/2"));
    assert_eq!(s.hosts, [missing_host()]);
}

#[tokio::test]
async fn a_standby_replica_makes_no_api_call_at_all() {
    let h = harness(false, vec![ingress()]);
    let metrics = h.metrics.clone();
    let mut handle = h.handle.unwrap();
    let ctx = h.ctx;
    // Keep the client alive: a dropped client would also end `next_request` (with None).
    let action = reconcile(Arc::new(listener()), ctx.clone()).await.unwrap();
    assert_eq!(action, Action::await_change());
    let next = tokio::time::timeout(Duration::from_millis(300), handle.next_request()).await;
    assert!(
        next.is_err(),
        "a standby replica sent a request: {:?}",
        next.map(|r| r.map(|(req, _)| req.uri().clone()))
    );
    drop(ctx);
    assert_eq!(metrics.reconciles.with_label_values(&["standby"]).get(), 1);
    assert_eq!(metrics.status_writes.get(), 0);
}

#[tokio::test]
async fn a_listener_being_deleted_is_left_to_the_garbage_collector() {
    let (mut h, _) = settled().await;
    assert!(!h.ctx.memory_of("public").secrets.is_empty());
    h.listener.metadata.deletion_timestamp = Some(
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now()),
    );
    // An empty script: any request fails the test.
    let (action, _) = h.run(vec![]).await;
    assert_eq!(action, Action::await_change());
    assert!(
        h.ctx.memory_of("public").secrets.is_empty(),
        "its Secrets no longer trigger it"
    );
}

#[tokio::test]
async fn an_invalid_spec_leaves_the_data_plane_alone_and_says_why() {
    let mut h = harness(true, vec![]);
    h.listener.spec.upstream.address = "no-port".into();
    let log = Arc::new(Mutex::new(Vec::new()));
    let script = vec![
        status_patch(log.clone()),
        warning(
            "InvalidSpec",
            "Ready is False: spec.upstream.address: \"no-port\" is not host:port",
        ),
    ];
    h.run(script).await;
    let s = status_of(&log.lock().unwrap()[0]);
    assert_eq!(condition(&s, "Ready"), ("False", "InvalidSpec"));
    assert_eq!(condition(&s, "SocketsBound"), ("Unknown", "NoReports"));
}

/// Everything of [`first_script`] before the DaemonSet, then `refusal`; the status must then
/// say `Ready=False` with `ready_reason`, with a Warning event, and the reconcile fails.
async fn refused(
    before: Vec<Expect>,
    refusal: Expect,
    ready_reason: &'static str,
) -> (Http3ListenerStatus, String, Arc<OperatorMetrics>) {
    let mut h = harness(true, vec![ingress()]);
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut script = before;
    script.push(refusal);
    script.push(status_patch(log.clone()));
    script.extend(missing_refused());
    script.push(warning(ready_reason, "Ready is False"));
    script.push(degraded());
    let err = h.run_failing(script).await;
    let s = status_of(&log.lock().unwrap()[0]);
    (s, err, h.metrics.clone())
}

/// Every request of [`first_script`] before the DaemonSet's.
fn before_daemon_set(secret: &Secret) -> Vec<Expect> {
    let mut script = first_script(secret);
    script.pop();
    script
}

/// The API server refuses the DaemonSet with `code`/`message`.
async fn refused_daemon_set(
    code: u16,
    message: &'static str,
    ready_reason: &'static str,
) -> (Http3ListenerStatus, String, Arc<OperatorMetrics>) {
    let refusal = expect("PATCH", DAEMON_SET, move |_, _| {
        api_status(code, "Forbidden", message)
    });
    let before = before_daemon_set(&tls_secret(SECRET_RV));
    refused(before, refusal, ready_reason).await
}

#[tokio::test]
async fn an_rbac_refusal_reaches_the_status_with_a_warning_and_counts_as_an_error() {
    let msg = "daemonsets.apps \"h3-ingress-public\" is forbidden: User \"system:serviceaccount:h3-ingress:h3-ingress\" cannot patch resource \"daemonsets\" in API group \"apps\" in the namespace \"h3-ingress\"";
    let (s, err, metrics) = refused_daemon_set(403, msg, "Forbidden").await;
    assert_eq!(condition(&s, "Ready"), ("False", "Forbidden"));
    assert_eq!(
        ready_message(&s),
        format!("applying DaemonSet {NS}/h3-ingress-public: {msg} (HTTP 403)")
    );
    assert!(err.contains("cannot patch resource"), "{err}");
    assert_eq!(metrics.reconciles.with_label_values(&["error"]).get(), 1);
    assert_eq!(metrics.status_writes.get(), 1);
}

/// Without `create` on Secrets in its namespace (the chart's Role grants exactly that), the
/// keys Secret cannot be made: nothing else is applied and the status says why.
#[tokio::test]
async fn a_refused_keys_secret_reaches_the_status_and_applies_nothing_else() {
    let msg = "secrets is forbidden: User \"system:serviceaccount:h3-ingress:h3-ingress\" cannot create resource \"secrets\" in API group \"\" in the namespace \"h3-ingress\"";
    let refusal = expect(
        "POST",
        format!("/api/v1/namespaces/{NS}/secrets"),
        move |_, _| api_status(403, "Forbidden", msg),
    );
    // The source Secret's read, its mirror's write and the keys Secret's read come first.
    let mut before = before_daemon_set(&tls_secret(SECRET_RV));
    before.truncate(3);
    let (s, err, metrics) = refused(before, refusal, "Forbidden").await;
    assert_eq!(condition(&s, "Ready"), ("False", "Forbidden"));
    assert_eq!(
        ready_message(&s),
        format!("creating Secret {NS}/h3-ingress-keys-public: {msg} (HTTP 403)")
    );
    assert!(err.contains("cannot create resource"), "{err}");
    assert_eq!(metrics.reconciles.with_label_values(&["error"]).get(), 1);
    assert_eq!(metrics.applies.get(), 0);
}

#[tokio::test]
async fn an_admission_denial_reaches_the_status_with_the_webhook_message() {
    let msg = "admission webhook \"validation.gatekeeper.sh\" denied the request: [psp-host-network] hostNetwork is not allowed";
    let (s, _, _) = refused_daemon_set(403, msg, "AdmissionDenied").await;
    assert_eq!(condition(&s, "Ready"), ("False", "AdmissionDenied"));
    assert!(
        ready_message(&s).contains("hostNetwork is not allowed"),
        "{}",
        ready_message(&s)
    );
}

/// The DaemonSet's `FailedCreate` events, newest first: what they list.
fn failed_create_events(psa: &'static str) -> Expect {
    expect(
        "GET",
        format!("/api/v1/namespaces/{NS}/events"),
        move |q, _| {
            let q = q.replace("%3D", "=").replace("%2C", ",");
            assert!(q.contains("involvedObject.kind=DaemonSet"), "{q}");
            assert!(q.contains("involvedObject.name=h3-ingress-public"), "{q}");
            assert!(q.contains("reason=FailedCreate"), "{q}");
            assert!(
                q.contains("involvedObject.uid=d5000000-0000-4000-8000-000000000005"),
                "{q}"
            );
            let ev = |msg: &str, t: &str| {
                json!({"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": format!("e-{t}"), "namespace": NS},
            "involvedObject": {"kind": "DaemonSet", "name": "h3-ingress-public", "namespace": NS},
            "reason": "FailedCreate", "type": "Warning", "message": msg, "lastTimestamp": t})
            };
            list(
                "EventList",
                vec![
                    ev("older reason", "2026-01-01T00:00:00Z"),
                    ev(psa, "2026-01-01T00:05:00Z"),
                ],
            )
        },
    )
}

#[tokio::test]
async fn pods_the_daemon_set_cannot_create_are_explained_from_its_failed_create_event() {
    let w = World {
        pod: false,
        ..world()
    };
    let mut h = harness_in(true, vec![ingress()], w);
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut script = before_daemon_set(&tls_secret(SECRET_RV));
    script.push(daemon_set_with(
        json!({"currentNumberScheduled": 0, "desiredNumberScheduled": 2,
               "numberMisscheduled": 0, "numberReady": 0, "numberUnavailable": 2}),
    ));
    let psa = "Error creating: pods \"h3-ingress-public-4xv8q\" is forbidden: violates PodSecurity \"restricted:latest\": host namespaces (hostNetwork=true), hostPort (container \"h3-ingress\" uses hostPorts 443, 9476)";
    script.push(failed_create_events(psa));
    script.push(status_patch(log.clone()));
    script.extend(missing_refused());
    script.push(warning("PodsNotCreated", "Ready is False"));
    script.push(degraded());
    h.run(script).await;
    let s = status_of(&log.lock().unwrap()[0]);
    assert_eq!(condition(&s, "Ready"), ("False", "PodsNotCreated"));
    assert_eq!(
        ready_message(&s),
        format!("2 of 2 data plane pods not created: {psa}")
    );
}

#[tokio::test]
async fn the_service_is_applied_when_asked_and_deleted_when_no_longer_asked() {
    let mut h = harness(true, vec![ingress()]);
    h.listener.spec.service = Some(
        serde_json::from_value(json!({
            "annotations": {"metallb.universe.tf/allow-shared-ip": "ingress-443"},
            "externalTrafficPolicy": "Cluster"
        }))
        .unwrap(),
    );
    let svc = NS_SERVICE.to_string();
    let mut script = before_daemon_set(&tls_secret(SECRET_RV));
    script.push(expect("PATCH", svc.clone(), |q, body| {
        assert_ours(q, "Service");
        assert_eq!(body["spec"]["type"], "LoadBalancer");
        assert_eq!(body["spec"]["externalTrafficPolicy"], "Cluster");
        assert_eq!(
            body["spec"]["ports"],
            json!([{"name": "quic", "protocol": "UDP", "port": 443, "targetPort": 443}])
        );
        assert_eq!(
            body["metadata"]["annotations"]["metallb.universe.tf/allow-shared-ip"],
            "ingress-443"
        );
        assert_eq!(body["metadata"]["ownerReferences"][0]["name"], "public");
        (200, stamped(body))
    }));
    script.push(daemon_set());
    script.extend(first_status(Arc::default()));
    let (_, answered) = h.run(script).await;
    h.feed(&answered);

    // spec.service removed (a new generation); the cache has the Service: it is deleted,
    // and the DaemonSet, unchanged, is not applied again.
    h.listener.spec.service = None;
    h.listener.metadata.generation = Some(3);
    let log = Arc::new(Mutex::new(Vec::new()));
    let script = vec![
        expect("DELETE", svc, |_, body| {
            assert_eq!(body["propagationPolicy"], "Background");
            success()
        }),
        status_patch(log.clone()),
    ];
    let (_, answered) = h.run(script).await;
    assert_eq!(lines(&answered)[0], format!("DELETE {NS_SERVICE}"));
    assert_eq!(
        status_of(&log.lock().unwrap()[0]).observed_generation,
        Some(3)
    );
}

#[tokio::test]
async fn a_port_conflict_applies_nothing_and_names_the_older_listener() {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    let at = |s: i64| Some(Time(k8s_openapi::jiff::Timestamp::from_second(s).unwrap()));
    let mut older = listener();
    older.metadata.name = Some("edge".into());
    older.metadata.uid = Some("ed000000-0000-4000-8000-000000000009".into());
    older.metadata.creation_timestamp = at(1_000);
    let w = World {
        listeners: vec![older],
        ..world()
    };
    let mut h = harness_in(true, vec![ingress()], w);
    h.listener.metadata.creation_timestamp = at(2_000);
    let log = Arc::new(Mutex::new(Vec::new()));
    // The Secret is read (the hosts' status), then nothing is written but the status.
    let mut script = vec![
        secret_read(tls_secret(SECRET_RV)),
        status_patch(log.clone()),
    ];
    script.extend(missing_refused());
    script.extend([warning("PortConflict", "Ready is False"), degraded()]);
    h.run(script).await;
    let s = status_of(&log.lock().unwrap()[0]);
    assert_eq!(condition(&s, "Ready"), ("False", "PortConflict"));
    assert!(
        ready_message(&s)
            .starts_with("UDP port 443 (spec.port) is already held by Http3Listener \"edge\""),
        "{}",
        ready_message(&s)
    );
    assert_eq!(h.metrics.mirror_writes.get(), 0);
}

#[tokio::test]
async fn lease_is_created_renewed_respected_and_raced_safely() {
    let (svc, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let api = kube::Api::namespaced(Client::new(svc, "default"), NS);
    let cfg = LeaseConfig::new(
        NS,
        "h3-ingress-operator",
        "operator-0_abc",
        h3_ingress::api::DEFAULT_CONTROLLER_NAME,
    );
    let path = format!("/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/h3-ingress-operator");
    let collection = format!("/apis/coordination.k8s.io/v1/namespaces/{NS}/leases");
    let now = k8s_openapi::jiff::Timestamp::now();
    let fresh = now.to_string();
    let stale = (now - k8s_openapi::jiff::SignedDuration::from_secs(60)).to_string();
    let held = move |holder: &str, renewed: &str, rv: &str| {
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
               "metadata": {"name": "h3-ingress-operator", "namespace": NS, "resourceVersion": rv},
               "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15, "renewTime": renewed}})
    };
    let (h1, h2, h3, h4) = (held, held, held, held);
    let (fresh2, stale2) = (fresh.clone(), stale.clone());
    let script = vec![
        // 1. No lease: create it.
        expect("GET", path.clone(), |_, _| {
            not_found("leases \"h3-ingress-operator\"")
        }),
        expect("POST", collection.clone(), |_, body| {
            assert_eq!(body["spec"]["holderIdentity"], "operator-0_abc");
            assert_eq!(body["spec"]["leaseDurationSeconds"], 15);
            (201, body)
        }),
        // 2. We hold it: renew with the resourceVersion we read.
        expect("GET", path.clone(), move |_, _| {
            (200, h1("operator-0_abc", &fresh, "5"))
        }),
        expect("PUT", path.clone(), |_, body| {
            assert_eq!(body["metadata"]["resourceVersion"], "5");
            (200, body)
        }),
        // 3. Someone else holds a fresh lease: no write.
        expect("GET", path.clone(), move |_, _| {
            (200, h2("operator-1_def", &fresh2, "6"))
        }),
        // 4. Their lease expired, but they renew first: our write conflicts and we follow.
        expect("GET", path.clone(), move |_, _| {
            (200, h3("operator-1_def", &stale, "7"))
        }),
        expect("PUT", path.clone(), |_, body| {
            assert_eq!(body["metadata"]["resourceVersion"], "7");
            assert_eq!(body["spec"]["leaseTransitions"], 1);
            (
                409,
                json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                         "reason": "Conflict", "code": 409, "message": "the object has been modified"}),
            )
        }),
        // 5. Expired and nobody races: take it over.
        expect("GET", path.clone(), move |_, _| {
            (200, h4("operator-1_def", &stale2, "8"))
        }),
        expect("PUT", path.clone(), |_, body| {
            assert_eq!(body["spec"]["holderIdentity"], "operator-0_abc");
            (200, body)
        }),
    ];
    let server = tokio::spawn(verifier(handle, script));
    let mut got = Vec::new();
    for _ in 0..5 {
        got.push(leader::try_acquire_or_renew(&api, &cfg).await.unwrap());
    }
    server.await.unwrap();
    assert_eq!(got, [true, true, false, false, true]);
}

/// Serves Traefik's kinds for `secs`: Middlewares listed from `middlewares` (or refused with
/// `code` when it is not 200), TLSOptions refused with 404, watches held open. Returns every
/// `path?watch` asked for.
async fn traefik_api(
    mut handle: Handle,
    code: u16,
    middlewares: Vec<Value>,
    secs: u64,
) -> Vec<String> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    let mut asked = Vec::new();
    let mut open_watches = Vec::new();
    while let Ok(Some((req, send))) = tokio::time::timeout_at(deadline, handle.next_request()).await
    {
        let path = req.uri().path().to_string();
        let watching = req.uri().query().unwrap_or_default().contains("watch=true");
        asked.push(format!("{path}{}", if watching { "?watch" } else { "" }));
        if watching {
            open_watches.push(send);
            continue;
        }
        let (status, body) = match (path.as_str(), code) {
            ("/apis/traefik.io/v1alpha1/middlewares", 200) => {
                list("MiddlewareList", middlewares.clone())
            }
            ("/apis/traefik.io/v1alpha1/middlewares", 403) => {
                api_status(403, "Forbidden", "middlewares.traefik.io is forbidden")
            }
            _ => not_found("the server could not find the requested resource"),
        };
        send.send_response(
            Response::builder()
                .status(status)
                .body(Body::from(serde_json::to_vec(&body).unwrap()))
                .unwrap(),
        );
    }
    asked
}

/// Traefik's Middlewares and TLSOptions: one list and one watch of each served kind, cached
/// with their identity and the spec the per-host policy reads only; a kind not served counts
/// as empty (and, for Middlewares, unreadable) and its retries back off instead of looping.
#[tokio::test]
async fn traefik_kinds_are_read_light_and_a_missing_one_backs_off() {
    use h3_ingress::operator::watches::traefik::{TraefikChange, TraefikWatch};
    let guard = json!({
        "apiVersion": "traefik.io/v1alpha1", "kind": "Middleware",
        "metadata": {"namespace": "shop", "name": "allow", "uid": "m1", "resourceVersion": "5",
            "labels": {"team": "web"},
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "x".repeat(4096)},
            "managedFields": [{"manager": "kubectl", "operation": "Apply"}]},
        "spec": {"ipAllowList": {"sourceRange": ["10.0.0.0/8"]},
                 "headers": {"customResponseHeaders": {"X-Big": "y".repeat(4096)}}}
    });
    for (code, middlewares) in [(200, vec![guard]), (403, vec![])] {
        let (mock, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let client = Client::new(mock, "default");
        let changes = Arc::new(Mutex::new(Vec::new()));
        let seen = changes.clone();
        let watch = TraefikWatch::start(
            &client,
            Arc::new(move |c: TraefikChange| seen.lock().unwrap().push(c)),
        );
        let asked = traefik_api(handle, code, middlewares, 4).await;
        let count = |p: &str| asked.iter().filter(|a| *a == p).count();
        let tls = count("/apis/traefik.io/v1alpha1/tlsoptions");
        // kube's backoff from 0.8 s doubling: at most four tries in four seconds.
        assert!((1..=4).contains(&tls), "{tls} TLSOption lists: {asked:?}");
        assert_eq!(count("/apis/traefik.io/v1alpha1/tlsoptions?watch"), 0);
        assert!(watch.synced(), "{asked:?}");
        let objects = watch.objects();
        let changes = changes.lock().unwrap().clone();
        if code == 200 {
            assert_eq!(
                count("/apis/traefik.io/v1alpha1/middlewares"),
                1,
                "{asked:?}"
            );
            assert_eq!(count("/apis/traefik.io/v1alpha1/middlewares?watch"), 1);
            assert!(objects.readable);
            let m = &objects.middlewares[0];
            assert!(m.metadata.annotations.is_none() && m.metadata.labels.is_none());
            assert!(m.metadata.managed_fields.is_none());
            let kept = serde_json::to_string(m.as_ref()).unwrap();
            assert!(kept.len() < 400, "{} bytes cached: {kept}", kept.len());
            assert!(changes.contains(&TraefikChange::Object {
                names: vec![
                    "shop/allow".into(),
                    "id shop-allow".into(),
                    "id shop_allow".into()
                ]
            }));
        } else {
            let lists = count("/apis/traefik.io/v1alpha1/middlewares");
            assert!((1..=4).contains(&lists), "{lists}: {asked:?}");
            assert!(!objects.readable && objects.middlewares.is_empty());
        }
        assert_eq!(
            changes
                .iter()
                .filter(|c| **c == TraefikChange::Synced)
                .count(),
            2,
            "each kind reports once that it is known: {changes:?}"
        );
    }
}

/// An allowlist annotation on the served host's Ingress: its mirror is deleted (the data plane
/// stops serving it), the status names it with `ClientAddressPolicy` and the annotation, the
/// listener and the Ingress each get one warning; once the listener declares the TCP ingress
/// trusts the forwarded address, the mirror is written again.
#[tokio::test]
async fn a_host_with_an_allowlist_is_held_back_until_the_listener_declares_trust() {
    let (mut h, secret) = settled().await;
    let mut guarded = ingress();
    guarded.metadata.annotations.as_mut().unwrap().insert(
        "nginx.ingress.kubernetes.io/whitelist-source-range".into(),
        "10.0.0.0/8".into(),
    );
    apply(&mut h.w._ingresses, guarded);
    let log = Arc::new(Mutex::new(Vec::new()));
    let note = "HTTP/3 not served for a.example.com: nginx.ingress.kubernetes.io/whitelist-source-range: \"10.0.0.0/8\" on Ingress shop/web";
    // The same annotation holds back the Ingress's other host too: events of its own (each
    // host's action names it, so kube's recorder does not count them as repeats).
    let other = "HTTP/3 not served for missing.example.com: nginx.ingress.kubernetes.io/whitelist-source-range";
    let script = vec![
        mirror_delete(mirror_of("web-tls")),
        status_patch(log.clone()),
        warning(reasons::CLIENT_ADDRESS_POLICY, note),
        event(
            "shop",
            "Ingress",
            "Warning",
            reasons::CLIENT_ADDRESS_POLICY,
            note,
        ),
        warning(reasons::CLIENT_ADDRESS_POLICY, other),
        event(
            "shop",
            "Ingress",
            "Warning",
            reasons::CLIENT_ADDRESS_POLICY,
            other,
        ),
        warning(reasons::NO_HOSTS_SERVING, "Ready is False"),
    ];
    let (_, answered) = h.run(script).await;
    h.feed(&answered);
    let s = status_of(&log.lock().unwrap()[0]);
    assert_eq!(
        condition(&s, "ClientAddress"),
        ("False", "UntrustedForwardedHeaders")
    );
    let held = s.hosts.iter().find(|x| x.name == "a.example.com").unwrap();
    assert_eq!(held.reason, reasons::CLIENT_ADDRESS_POLICY);
    assert!(
        held.message.contains("clientAddress.trusted: true"),
        "{}",
        held.message
    );
    assert!(s
        .host_counts
        .contains(&count("NotServing", reasons::CLIENT_ADDRESS_POLICY, 2)));

    h.listener.spec.upstream.client_address.trusted = true;
    let log = Arc::new(Mutex::new(Vec::new()));
    // a.example.com is written again and pending until the pods load it (no event while
    // pending); the other host's reason is its own again.
    // Its SecretNotFound events repeat those of the listener's first status.
    let script = vec![
        mirror_write(&secret, "301"),
        status_patch(log.clone()),
        repeated("default", reasons::SECRET_NOT_FOUND, MISSING_NOTE, 2),
        repeated("shop", reasons::SECRET_NOT_FOUND, MISSING_NOTE, 2),
    ];
    let (_, answered) = h.run(script).await;
    h.feed(&answered);
    let s = status_of(&log.lock().unwrap()[0]);
    assert_eq!(
        condition(&s, "ClientAddress"),
        ("True", "TrustedForwardedHeaders")
    );
    let a = s.hosts.iter().find(|x| x.name == "a.example.com").unwrap();
    assert_eq!(a.reason, reasons::CONFIG_PENDING, "{a:?}");
}
