//! The operator's API traffic, checked request by request against a scripted API server
//! (kube's tower-test mock, in the style of kube-rs/controller-rs's `ApiServerVerifier`):
//! server-side applies with one field manager, Secret reads, stale RBAC deletion, pod listing,
//! the status patch (only when changed, only by the leader), events, and the Lease.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::networking::v1::{Ingress, IngressRule, IngressSpec, IngressTLS};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::ByteString;
use kube::client::Body;
use kube::runtime::controller::Action;
use kube::runtime::events::Reporter;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;
use kube::Client;
use serde_json::{json, Value};
use tokio::sync::watch;

use h3_ingress::api::{
    annotations, reasons, HostReport, Http3Listener, Http3ListenerSpec, Http3ListenerStatus,
    SocketReport, StatusReport,
};
use h3_ingress::operator::controller::{reconcile, Caches, Context};
use h3_ingress::operator::leader::{self, LeaseConfig};
use h3_ingress::operator::metrics::OperatorMetrics;
use h3_ingress::operator::reports::{ReportFetcher, ReportFuture};
use h3_ingress::operator::resources::Params;
use h3_ingress::operator::watches::OwnedStores;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::PartialObjectMeta;

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

const NS: &str = "h3-ingress";
const SELECTOR: &str = "app.kubernetes.io%2Fcomponent%3Ddata-plane%2Capp.kubernetes.io%2Finstance%3Dpublic%2Capp.kubernetes.io%2Fname%3Dh3-ingress";

type Answer = Box<dyn FnOnce(&str, Value) -> (u16, Value) + Send>;

/// One expected request: method, path, and a closure that checks the query and JSON body
/// (Null when empty) and returns the status code and JSON to answer with.
struct Expect {
    method: &'static str,
    path: String,
    answer: Answer,
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
    }
}

/// Answers the script in order and fails on any request that is not the next expected one.
async fn verifier(mut handle: Handle, script: Vec<Expect>) {
    for (i, e) in script.into_iter().enumerate() {
        let (req, send) = tokio::time::timeout(Duration::from_secs(5), handle.next_request())
            .await
            .unwrap_or_else(|_| panic!("request #{i} ({} {}) never came", e.method, e.path))
            .expect("client dropped");
        let method = req.method().to_string();
        let path = req.uri().path().to_string();
        let query = req.uri().query().unwrap_or_default().to_string();
        assert_eq!(
            (method.as_str(), path.as_str()),
            (e.method, e.path.as_str()),
            "request #{i}: got {method} {}",
            req.uri()
        );
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
}

fn not_found(what: &str) -> (u16, Value) {
    (
        404,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": format!("{what} not found"), "reason": "NotFound", "code": 404}),
    )
}

fn list(kind: &str, items: Vec<Value>) -> (u16, Value) {
    (
        200,
        json!({"apiVersion": "v1", "kind": kind, "metadata": {"resourceVersion": "1"}, "items": items}),
    )
}

/// A server-side apply by our one field manager; answers with the applied object.
fn ssa(path: String, kind: &'static str) -> Expect {
    expect("PATCH", path, move |query, body| {
        assert!(
            query.contains("fieldManager=h3-ingress-operator") && query.contains("force=true"),
            "{kind}: {query}"
        );
        assert_eq!(body["kind"], kind);
        (200, body)
    })
}

struct Fetcher(BTreeMap<SocketAddr, Result<StatusReport, String>>);

impl ReportFetcher for Fetcher {
    fn fetch(&self, address: SocketAddr) -> ReportFuture {
        let r = self
            .0
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

fn tls_secret() -> Secret {
    let ck = rcgen::generate_simple_self_signed(vec!["a.example.com".to_string()]).unwrap();
    Secret {
        metadata: ObjectMeta {
            namespace: Some("shop".into()),
            name: Some("web-tls".into()),
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

fn pod_report() -> StatusReport {
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
        hosts: vec![HostReport {
            name: "a.example.com".into(),
            state: "Serving".into(),
            reason: reasons::SERVING.into(),
            alt_svc_advertised: Some(true),
            requests: 42,
            ..Default::default()
        }],
        requests_total: 42,
        config_generation: 1,
        ..Default::default()
    }
}

struct Harness {
    ctx: Arc<Context>,
    handle: Handle,
    metrics: Arc<OperatorMetrics>,
    _writers: Writers,
}

struct Writers {
    _ingresses: reflector::store::Writer<Ingress>,
    _listeners: reflector::store::Writer<Http3Listener>,
    _classes: reflector::store::Writer<k8s_openapi::api::networking::v1::IngressClass>,
    _roles: reflector::store::Writer<PartialObjectMeta<Role>>,
    _role_bindings: reflector::store::Writer<PartialObjectMeta<RoleBinding>>,
    _services: reflector::store::Writer<PartialObjectMeta<Service>>,
}

/// A filled cache of `objects`, as a reflector would have it after its first list.
fn filled<K>(objects: Vec<K>) -> (Store<K>, reflector::store::Writer<K>)
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

/// Metadata of an object the operator made for listener `public`, as the owned caches hold it.
fn owned_meta<K: Default>(namespace: &str, name: &str) -> PartialObjectMeta<K> {
    PartialObjectMeta {
        metadata: ObjectMeta {
            namespace: Some(namespace.into()),
            name: Some(name.into()),
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
        ..Default::default()
    }
}

/// What the caches hold besides the Ingresses.
#[derive(Default)]
struct World {
    /// Other listeners in the controller's store.
    listeners: Vec<Http3Listener>,
    /// Namespaces with a Role and a RoleBinding of listener `public`.
    roles: Vec<&'static str>,
    role_bindings: Vec<&'static str>,
    /// Whether its Service exists.
    service: bool,
    /// What the pod answers on /status instead of `pod_report()`.
    report: Option<StatusReport>,
    /// IngressClasses in the cache.
    classes: Vec<k8s_openapi::api::networking::v1::IngressClass>,
}

/// The usual world: the Role of a namespace no longer referenced ("old") is still there.
fn world() -> World {
    World {
        roles: vec!["shop", "old"],
        role_bindings: vec!["shop"],
        ..Default::default()
    }
}

fn harness(is_leader: bool, ingresses: Vec<Ingress>) -> Harness {
    harness_in(is_leader, ingresses, world())
}

fn harness_in(is_leader: bool, ingresses: Vec<Ingress>, w: World) -> Harness {
    let (svc, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(svc, "default");
    let rbac = "h3-ingress-data-plane-public";
    let (ingress_store, i) = filled(ingresses);
    let (listener_store, l) = filled(w.listeners);
    let (classes, c) = filled(w.classes);
    let (roles, r) = filled(w.roles.iter().map(|ns| owned_meta(ns, rbac)).collect());
    let (role_bindings, rb) = filled(
        w.role_bindings
            .iter()
            .map(|ns| owned_meta(ns, rbac))
            .collect(),
    );
    let services = if w.service {
        vec![owned_meta(NS, "h3-ingress-public")]
    } else {
        vec![]
    };
    let (services, sv) = filled(services);
    let (_tx, rx) = watch::channel(is_leader);
    let metrics = OperatorMetrics::new();
    let report = w.report.unwrap_or_else(pod_report);
    let fetcher = Fetcher(
        [("10.0.0.7:9476".parse().unwrap(), Ok(report))]
            .into_iter()
            .collect(),
    );
    let ctx = Context::new(
        client,
        Params {
            namespace: NS.into(),
            default_image: "ghcr.io/h3-ingress/h3-ingress:test".into(),
        },
        Caches {
            ingresses: ingress_store,
            listeners: listener_store,
            classes,
            owned: OwnedStores {
                roles,
                role_bindings,
                services,
            },
            gateway_api: None,
        },
        rx,
        Arc::new(fetcher),
        Reporter {
            controller: "h3-ingress-operator".into(),
            instance: Some("operator-0".into()),
        },
        metrics.clone(),
    );
    Harness {
        ctx: Arc::new(ctx),
        handle,
        metrics,
        _writers: Writers {
            _ingresses: i,
            _listeners: l,
            _classes: c,
            _roles: r,
            _role_bindings: rb,
            _services: sv,
        },
    }
}

/// Runs one reconcile against the script; panics from the verifier are reported first.
async fn run(h: Harness, l: Http3Listener, script: Vec<Expect>) -> Action {
    let server = tokio::spawn(verifier(h.handle, script));
    let result = tokio::time::timeout(Duration::from_secs(10), reconcile(Arc::new(l), h.ctx)).await;
    server.await.expect("API server script");
    result
        .expect("reconcile finished")
        .expect("reconcile succeeded")
}

/// The listener's QUIC keys Secret: read, and created with 64 random bytes (immutable, owned
/// by the listener) only when it does not exist; an existing one is never written.
fn keys_secret(exists: bool) -> Vec<Expect> {
    let path = format!("/api/v1/namespaces/{NS}/secrets/h3-ingress-keys-public");
    if exists {
        return vec![expect("GET", path, |_, _| {
            (
                200,
                json!({"apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": "h3-ingress-keys-public", "namespace": NS},
                "immutable": true, "data": {"key": "c2VjcmV0"}}),
            )
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
                (201, body)
            },
        ),
    ]
}

/// How many requests of [`apply_script`] come before the DaemonSet's: two TLS Secrets read,
/// the keys Secret read and created, ServiceAccount, ClusterRole(Binding), Role(Binding).
const BEFORE_DAEMON_SET: usize = 9;

/// Requests every leader reconcile of `listener()` makes before the status patch.
fn apply_script() -> Vec<Expect> {
    apply_script_with(false)
}

/// [`apply_script`], with the keys Secret already there (`keys_exist`) or created.
fn apply_script_with(keys_exist: bool) -> Vec<Expect> {
    let rbac = "/apis/rbac.authorization.k8s.io/v1";
    let mut script = vec![
        expect("GET", "/api/v1/namespaces/shop/secrets/missing", |_, _| {
            not_found("secrets \"missing\"")
        }),
        expect("GET", "/api/v1/namespaces/shop/secrets/web-tls", |_, _| {
            (200, serde_json::to_value(tls_secret()).unwrap())
        }),
    ];
    script.extend(keys_secret(keys_exist));
    script.extend([
        ssa(
            format!("/api/v1/namespaces/{NS}/serviceaccounts/h3-ingress-public"),
            "ServiceAccount",
        ),
        ssa(
            format!("{rbac}/clusterroles/h3-ingress-data-plane-public"),
            "ClusterRole",
        ),
        ssa(
            format!("{rbac}/clusterrolebindings/h3-ingress-data-plane-public"),
            "ClusterRoleBinding",
        ),
        expect(
            "PATCH",
            format!("{rbac}/namespaces/shop/roles/h3-ingress-data-plane-public"),
            |q, body| {
                assert!(q.contains("fieldManager=h3-ingress-operator"), "{q}");
                // Only the two referenced Secrets, read-only.
                assert_eq!(
                    body["rules"],
                    json!([{"apiGroups": [""], "resources": ["secrets"],
                        "resourceNames": ["missing", "web-tls"], "verbs": ["get", "list", "watch"]}])
                );
                assert_eq!(body["metadata"]["ownerReferences"][0]["name"], "public");
                (200, body)
            },
        ),
        ssa(
            format!("{rbac}/namespaces/shop/rolebindings/h3-ingress-data-plane-public"),
            "RoleBinding",
        ),
        expect(
            "PATCH",
            format!("/apis/apps/v1/namespaces/{NS}/daemonsets/h3-ingress-public"),
            |q, mut body| {
                assert!(
                    q.contains("fieldManager=h3-ingress-operator") && q.contains("force=true"),
                    "{q}"
                );
                let pod = &body["spec"]["template"]["spec"];
                assert_eq!(pod["hostNetwork"], true);
                assert_eq!(
                    pod["containers"][0]["args"],
                    json!(["proxy", "--listener", "public", "--keys-file", "/etc/h3-ingress/keys/key"])
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
                body["status"] = json!({"currentNumberScheduled": 1, "desiredNumberScheduled": 1,
                                     "numberMisscheduled": 0, "numberReady": 1});
                (200, body)
            },
        ),
        // Pruning reads the owned-object caches: no list. The namespace whose Secret is no
        // longer referenced loses its Role.
        expect(
            "DELETE",
            format!("{rbac}/namespaces/old/roles/h3-ingress-data-plane-public"),
            |_, body| {
                assert_eq!(body["propagationPolicy"], "Background");
                (
                    200,
                    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}),
                )
            },
        ),
        expect("GET", format!("/api/v1/namespaces/{NS}/pods"), |q, _| {
            assert!(q.contains(&format!("labelSelector={SELECTOR}")), "{q}");
            list(
                "PodList",
                vec![json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "h3-ingress-public-x7k2p", "namespace": NS},
                "spec": {"nodeName": "node-1", "containers": [{"name": "h3-ingress"}]},
                "status": {"podIP": "10.0.0.7", "phase": "Running"}})],
            )
        }),
    ]);
    script
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

fn status_of(patch: &Value) -> Http3ListenerStatus {
    serde_json::from_value(patch["status"].clone()).unwrap()
}

fn condition<'a>(s: &'a Http3ListenerStatus, t: &str) -> (&'a str, &'a str) {
    let c = s.conditions.iter().find(|c| c.type_ == t).unwrap();
    (c.status.as_str(), c.reason.as_str())
}

#[tokio::test]
async fn leader_applies_objects_prunes_rbac_writes_status_and_publishes_events() {
    let h = harness(true, vec![ingress()]);
    let metrics = h.metrics.clone();
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut script = apply_script();
    let seen = log.clone();
    script.push(expect(
        "PATCH",
        "/apis/h3-ingress.dev/v1alpha1/http3listeners/public/status",
        move |q, body| {
            assert!(
                q.contains("fieldManager=h3-ingress-operator") && q.contains("force=true"),
                "{q}"
            );
            assert_eq!(body["apiVersion"], "h3-ingress.dev/v1alpha1");
            assert_eq!(body["kind"], "Http3Listener");
            seen.lock().unwrap().push(body.clone());
            let mut l = serde_json::to_value(listener()).unwrap();
            l["status"] = body["status"].clone();
            (200, l)
        },
    ));
    script.extend([
        event(
            "default",
            "Http3Listener",
            "Normal",
            "Http3Enabled",
            "HTTP/3 enabled for a.example.com",
        ),
        event(
            "shop",
            "Ingress",
            "Normal",
            "Http3Enabled",
            "HTTP/3 enabled for a.example.com",
        ),
        event(
            "default",
            "Http3Listener",
            "Warning",
            "SecretNotFound",
            "HTTP/3 not served for missing.example.com: Secret shop/missing not found",
        ),
        event(
            "shop",
            "Ingress",
            "Warning",
            "SecretNotFound",
            "HTTP/3 not served for missing.example.com",
        ),
        event(
            "default",
            "Http3Listener",
            "Normal",
            "SomeHostsServing",
            "Ready is True: 1 of 2 hosts served",
        ),
        event(
            "default",
            "Http3Listener",
            "Warning",
            "SomeHostsNotServing",
            "Degraded is True",
        ),
    ]);

    let action = run(h, listener(), script).await;
    assert_eq!(action, Action::requeue(Duration::from_secs(60)));

    let patches = log.lock().unwrap();
    let s = status_of(&patches[0]);
    assert_eq!(s.observed_generation, Some(2));
    assert_eq!(s.hosts_summary.as_deref(), Some("1/2"));
    assert_eq!(condition(&s, "Ready"), ("True", "SomeHostsServing"));
    assert_eq!(condition(&s, "SocketsBound"), ("True", "Bound"));
    assert_eq!(condition(&s, "BuffersApplied"), ("True", "Applied"));
    assert_eq!(condition(&s, "Degraded"), ("True", "SomeHostsNotServing"));
    let a = &s.hosts[0];
    assert_eq!(
        (a.name.as_str(), a.state.as_str(), a.alt_svc_advertised),
        ("a.example.com", "Serving", Some(true))
    );
    assert_eq!(a.ingress.as_deref(), Some("shop/web"));
    assert_eq!(
        a.dns_https_record,
        "a.example.com. 3600 IN HTTPS 1 . alpn=\"h3,h2\""
    );
    assert_eq!(
        (s.hosts[1].reason.as_str(), s.hosts[1].message.as_str()),
        ("SecretNotFound", "Secret shop/missing not found")
    );
    assert_eq!(s.nodes.as_ref().unwrap().summary, "1/1");
    assert_eq!(
        s.udp.as_ref().unwrap().min_receive_buffer_bytes,
        Some(8_388_608)
    );
    assert_eq!(s.requests[0].total, 42);
    assert_eq!(metrics.status_writes.get(), 1);
    assert_eq!(metrics.events.with_label_values(&["Warning"]).get(), 3);
    assert_eq!(metrics.reconciles.with_label_values(&["ok"]).get(), 1);
}

#[tokio::test]
async fn an_unchanged_status_is_not_written_again() {
    // First pass: capture the status the operator writes.
    let h = harness(true, vec![ingress()]);
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut script = apply_script();
    let seen = log.clone();
    script.push(expect(
        "PATCH",
        "/apis/h3-ingress.dev/v1alpha1/http3listeners/public/status",
        move |_, body| {
            seen.lock().unwrap().push(body.clone());
            let mut l = serde_json::to_value(listener()).unwrap();
            l["status"] = body["status"].clone();
            (200, l)
        },
    ));
    for ns in ["default", "shop", "default", "shop", "default", "default"] {
        script.push(expect(
            "POST",
            format!("/apis/events.k8s.io/v1/namespaces/{ns}/events"),
            |_, b| (201, b),
        ));
    }
    run(h, listener(), script).await;
    let stored = status_of(&log.lock().unwrap()[0]);

    // Second pass, a while later, with that status stored: same applies, no status patch,
    // no events (the script ends after the pod list; any further request would hang).
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let h = harness(true, vec![ingress()]);
    let metrics = h.metrics.clone();
    let mut l = listener();
    l.status = Some(stored);
    run(h, l, apply_script_with(true)).await;
    assert_eq!(metrics.status_writes.get(), 0);
    assert_eq!(metrics.events.with_label_values(&["Normal"]).get(), 0);
    assert_eq!(metrics.events.with_label_values(&["Warning"]).get(), 0);
}

#[tokio::test]
async fn busy_counters_are_written_at_most_once_a_minute() {
    let h = harness(true, vec![ingress()]);
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut script = apply_script();
    script.extend(first_status(log.clone()));
    run(h, listener(), script).await;
    let stored = status_of(&log.lock().unwrap()[0]);
    assert_eq!(stored.requests[0].total, 42);

    // Traffic goes on: the pod now reports more requests. Within the minute: no write.
    let busy = || {
        let mut r = pod_report();
        r.hosts[0].requests = 9_000;
        r.hosts[0].requests_last5m = 700;
        r.requests_total = 9_000;
        r
    };
    let h = harness_in(
        true,
        vec![ingress()],
        World {
            report: Some(busy()),
            ..world()
        },
    );
    let metrics = h.metrics.clone();
    let mut l = listener();
    l.status = Some(stored.clone());
    run(h, l, apply_script()).await;
    assert_eq!(
        metrics.status_writes.get(),
        0,
        "counters alone were written within a minute"
    );

    // The stored counters are a minute old: now they are written, and nothing else changes.
    let mut old = stored;
    let minute_ago =
        k8s_openapi::jiff::Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_secs(61);
    old.counters_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        minute_ago,
    ));
    let h = harness_in(
        true,
        vec![ingress()],
        World {
            report: Some(busy()),
            ..world()
        },
    );
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut script = apply_script();
    script.push(status_patch(log.clone()));
    let mut l = listener();
    l.status = Some(old.clone());
    run(h, l, script).await;
    let written = status_of(&log.lock().unwrap()[0]);
    assert_eq!(
        (written.requests[0].total, written.requests[0].last5m),
        (9_000, 700)
    );
    assert_eq!(written.conditions, old.conditions, "no event-worthy change");
}

#[tokio::test]
async fn an_ingress_without_a_class_counts_for_the_default_class() {
    let mut classless = ingress();
    classless.spec.as_mut().unwrap().ingress_class_name = None;
    let nginx: k8s_openapi::api::networking::v1::IngressClass = serde_json::from_value(json!({
        "metadata": {"name": "nginx",
                     "annotations": {"ingressclass.kubernetes.io/is-default-class": "true"}}
    }))
    .unwrap();
    let w = World {
        classes: vec![nginx],
        ..world()
    };
    let h = harness_in(true, vec![classless], w);
    let log = Arc::new(Mutex::new(Vec::new()));
    // The same reads, applies (a Role for the Ingress's Secrets) and status as for an Ingress
    // of class nginx.
    let mut script = apply_script();
    script.extend(first_status(log.clone()));
    run(h, listener(), script).await;
    let s = status_of(&log.lock().unwrap()[0]);
    assert_eq!(s.hosts_summary.as_deref(), Some("1/2"));
    assert_eq!(s.hosts[0].ingress.as_deref(), Some("shop/web"));
}

#[tokio::test]
async fn a_standby_replica_makes_no_api_call_at_all() {
    let h = harness(false, vec![ingress()]);
    let metrics = h.metrics.clone();
    let mut handle = h.handle;
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
    let h = harness(true, vec![ingress()]);
    let mut l = listener();
    l.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::now(),
    ));
    // An empty script: any request fails the test.
    assert_eq!(run(h, l, vec![]).await, Action::await_change());
}

#[tokio::test]
async fn an_invalid_spec_leaves_the_data_plane_alone_and_says_why() {
    let h = harness(true, vec![]);
    let mut l = listener();
    l.spec.upstream.address = "no-port".into();
    let log = Arc::new(Mutex::new(Vec::new()));
    let seen = log.clone();
    let script = vec![
        expect(
            "PATCH",
            "/apis/h3-ingress.dev/v1alpha1/http3listeners/public/status",
            move |_, body| {
                seen.lock().unwrap().push(body.clone());
                (200, serde_json::to_value(listener()).unwrap())
            },
        ),
        event(
            "default",
            "Http3Listener",
            "Warning",
            "InvalidSpec",
            "Ready is False: spec.upstream.address: \"no-port\" is not host:port",
        ),
    ];
    run(h, l, script).await;
    let s = status_of(&log.lock().unwrap()[0]);
    assert_eq!(condition(&s, "Ready"), ("False", "InvalidSpec"));
    assert_eq!(condition(&s, "SocketsBound"), ("Unknown", "NoReports"));
}

#[tokio::test]
async fn lease_is_created_renewed_respected_and_raced_safely() {
    let (svc, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let api = kube::Api::namespaced(Client::new(svc, "default"), NS);
    let cfg = LeaseConfig::new(NS, "h3-ingress-operator", "operator-0_abc");
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

/// Runs one reconcile that must fail after the script (an apply the API server refused).
async fn run_failing(h: Harness, l: Http3Listener, script: Vec<Expect>) -> String {
    let server = tokio::spawn(verifier(h.handle, script));
    let result = tokio::time::timeout(Duration::from_secs(10), reconcile(Arc::new(l), h.ctx)).await;
    server.await.expect("API server script");
    result
        .expect("reconcile finished")
        .expect_err("reconcile must report the refused apply")
        .to_string()
}

/// The first status patch of a reconcile, captured into `log`.
fn status_patch(log: Arc<Mutex<Vec<Value>>>) -> Expect {
    expect(
        "PATCH",
        "/apis/h3-ingress.dev/v1alpha1/http3listeners/public/status",
        move |q, body| {
            assert!(q.contains("fieldManager=h3-ingress-operator"), "{q}");
            log.lock().unwrap().push(body.clone());
            let mut l = serde_json::to_value(listener()).unwrap();
            l["status"] = body["status"].clone();
            (200, l)
        },
    )
}

/// Events, in order: (namespace, kind, type, reason).
fn events(list: &[(&'static str, &'static str, &'static str, &'static str)]) -> Vec<Expect> {
    list.iter()
        .map(|(ns, kind, t, reason)| event(ns, kind, t, reason, ""))
        .collect()
}

/// The Warning events of the hosts `listener()` wants when no pod serves them: the missing
/// Secret, on the listener and on the Ingress.
const SECRET_NOT_FOUND_EVENTS: [(&str, &str, &str, &str); 2] = [
    ("default", "Http3Listener", "Warning", "SecretNotFound"),
    ("shop", "Ingress", "Warning", "SecretNotFound"),
];

fn api_status(code: u16, reason: &str, message: &str) -> (u16, Value) {
    (
        code,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "reason": reason, "code": code, "message": message}),
    )
}

/// One reconcile in which the API server refuses the DaemonSet with `code`/`message`; the
/// status must then say `Ready=False` with `ready_reason`, with a Warning event.
async fn refused_daemon_set(
    code: u16,
    message: &'static str,
    ready_reason: &'static str,
) -> (Http3ListenerStatus, String, Arc<OperatorMetrics>) {
    // Everything up to the DaemonSet is applied; the DaemonSet is refused.
    let refusal = expect(
        "PATCH",
        format!("/apis/apps/v1/namespaces/{NS}/daemonsets/h3-ingress-public"),
        move |_, _| api_status(code, "Forbidden", message),
    );
    refused_at(BEFORE_DAEMON_SET, refusal, ready_reason).await
}

/// One reconcile whose request number `at` of [`apply_script`] gets `refusal`'s answer.
async fn refused_at(
    at: usize,
    refusal: Expect,
    ready_reason: &'static str,
) -> (Http3ListenerStatus, String, Arc<OperatorMetrics>) {
    let h = harness(true, vec![ingress()]);
    let metrics = h.metrics.clone();
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut script = apply_script();
    script.truncate(at);
    script.push(refusal);
    script.push(status_patch(log.clone()));
    let mut evs = SECRET_NOT_FOUND_EVENTS.to_vec();
    evs.push(("default", "Http3Listener", "Warning", ready_reason));
    evs.push(("default", "Http3Listener", "Warning", "SomeHostsNotServing"));
    script.extend(events(&evs));
    let err = run_failing(h, listener(), script).await;
    let s = status_of(&log.lock().unwrap()[0]);
    (s, err, metrics)
}

#[tokio::test]
async fn an_rbac_refusal_reaches_the_status_with_a_warning_and_counts_as_an_error() {
    let msg = "daemonsets.apps \"h3-ingress-public\" is forbidden: User \"system:serviceaccount:h3-ingress:h3-ingress\" cannot patch resource \"daemonsets\" in API group \"apps\" in the namespace \"h3-ingress\"";
    let (s, err, metrics) = refused_daemon_set(403, msg, "Forbidden").await;
    let ready = s.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "Forbidden")
    );
    assert_eq!(
        ready.message,
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
    // The two TLS Secrets and the keys Secret's read come first.
    let (s, err, metrics) = refused_at(3, refusal, "Forbidden").await;
    let ready = s.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "Forbidden")
    );
    assert_eq!(
        ready.message,
        format!("creating Secret {NS}/h3-ingress-keys-public: {msg} (HTTP 403)")
    );
    assert!(err.contains("cannot create resource"), "{err}");
    assert_eq!(metrics.reconciles.with_label_values(&["error"]).get(), 1);
}

#[tokio::test]
async fn an_admission_denial_reaches_the_status_with_the_webhook_message() {
    let msg = "admission webhook \"validation.gatekeeper.sh\" denied the request: [psp-host-network] hostNetwork is not allowed";
    let (s, _, _) = refused_daemon_set(403, msg, "AdmissionDenied").await;
    let ready = s.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "AdmissionDenied")
    );
    assert!(
        ready.message.contains("hostNetwork is not allowed"),
        "{}",
        ready.message
    );
}

#[tokio::test]
async fn pods_the_daemon_set_cannot_create_are_explained_from_its_failed_create_event() {
    let h = harness(true, vec![ingress()]);
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut script = apply_script();
    script.truncate(BEFORE_DAEMON_SET);
    script.push(expect(
        "PATCH",
        format!("/apis/apps/v1/namespaces/{NS}/daemonsets/h3-ingress-public"),
        |_, mut body| {
            body["metadata"]["uid"] = "d5000000-0000-4000-8000-000000000005".into();
            body["status"] = json!({"currentNumberScheduled": 0, "desiredNumberScheduled": 2,
                                    "numberMisscheduled": 0, "numberReady": 0, "numberUnavailable": 2});
            (200, body)
        },
    ));
    let rest = apply_script().split_off(BEFORE_DAEMON_SET + 1);
    // The stale Role's deletion, then a pod list that finds no pod.
    let mut rest = rest.into_iter();
    script.push(rest.next().unwrap());
    script.push(expect(
        "GET",
        format!("/api/v1/namespaces/{NS}/pods"),
        |_, _| list("PodList", vec![]),
    ));
    let psa = "Error creating: pods \"h3-ingress-public-4xv8q\" is forbidden: violates PodSecurity \"restricted:latest\": host namespaces (hostNetwork=true), hostPort (container \"h3-ingress\" uses hostPorts 443, 9476)";
    script.push(expect(
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
    ));
    script.push(status_patch(log.clone()));
    let mut evs = SECRET_NOT_FOUND_EVENTS.to_vec();
    evs.push(("default", "Http3Listener", "Warning", "PodsNotCreated"));
    evs.push(("default", "Http3Listener", "Warning", "SomeHostsNotServing"));
    script.extend(events(&evs));
    run(h, listener(), script).await;
    let s = status_of(&log.lock().unwrap()[0]);
    let ready = s.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "PodsNotCreated")
    );
    assert_eq!(
        ready.message,
        format!("2 of 2 data plane pods not created: {psa}")
    );
}

/// The status patch and the six events of the first reconcile of `listener()` (as in
/// `leader_applies_objects_prunes_rbac_writes_status_and_publishes_events`).
fn first_status(log: Arc<Mutex<Vec<Value>>>) -> Vec<Expect> {
    let mut out = vec![status_patch(log)];
    for ns in ["default", "shop", "default", "shop", "default", "default"] {
        out.push(expect(
            "POST",
            format!("/apis/events.k8s.io/v1/namespaces/{ns}/events"),
            |_, b| (201, b),
        ));
    }
    out
}

#[tokio::test]
async fn the_service_is_applied_when_asked_and_deleted_when_no_longer_asked() {
    let h = harness(true, vec![ingress()]);
    let mut l = listener();
    l.spec.service = Some(
        serde_json::from_value(json!({
            "annotations": {"metallb.universe.tf/allow-shared-ip": "ingress-443"},
            "externalTrafficPolicy": "Cluster"
        }))
        .unwrap(),
    );
    let mut script = apply_script();
    let tail = script.split_off(BEFORE_DAEMON_SET);
    script.push(expect(
        "PATCH",
        format!("/api/v1/namespaces/{NS}/services/h3-ingress-public"),
        |q, body| {
            assert!(
                q.contains("fieldManager=h3-ingress-operator") && q.contains("force=true"),
                "{q}"
            );
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
            (200, body)
        },
    ));
    script.extend(tail);
    script.extend(first_status(Arc::default()));
    run(h, l, script).await;

    // spec.service removed; the cache still has the Service: it is deleted after the Role.
    let h = harness_in(
        true,
        vec![ingress()],
        World {
            service: true,
            ..world()
        },
    );
    let mut script = apply_script();
    let pods = script.pop().unwrap();
    script.push(expect(
        "DELETE",
        format!("/api/v1/namespaces/{NS}/services/h3-ingress-public"),
        |_, body| {
            assert_eq!(body["propagationPolicy"], "Background");
            (
                200,
                json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}),
            )
        },
    ));
    script.push(pods);
    script.extend(first_status(Arc::default()));
    run(h, listener(), script).await;
}

#[tokio::test]
async fn a_port_conflict_applies_nothing_and_names_the_older_listener() {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    let at = |s: i64| Some(Time(k8s_openapi::jiff::Timestamp::from_second(s).unwrap()));
    let mut older = listener();
    older.metadata.name = Some("edge".into());
    older.metadata.uid = Some("ed000000-0000-4000-8000-000000000009".into());
    older.metadata.creation_timestamp = at(1_000);
    let mut l = listener();
    l.metadata.creation_timestamp = at(2_000);
    let h = harness_in(
        true,
        vec![ingress()],
        World {
            listeners: vec![older],
            ..world()
        },
    );
    let log = Arc::new(Mutex::new(Vec::new()));
    // The Secrets are read (the hosts' status), then nothing is applied or listed.
    let mut script = apply_script();
    script.truncate(2);
    script.push(status_patch(log.clone()));
    let mut evs = SECRET_NOT_FOUND_EVENTS.to_vec();
    evs.push(("default", "Http3Listener", "Warning", "PortConflict"));
    evs.push(("default", "Http3Listener", "Warning", "SomeHostsNotServing"));
    script.extend(events(&evs));
    run(h, l, script).await;
    let s = status_of(&log.lock().unwrap()[0]);
    let ready = s.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "PortConflict")
    );
    assert!(
        ready
            .message
            .starts_with("UDP port 443 (spec.port) is already held by Http3Listener \"edge\""),
        "{}",
        ready.message
    );
}
