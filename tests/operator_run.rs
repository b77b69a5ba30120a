//! The whole operator wiring (`run_with`: Lease election, Controller with its watches and
//! triggers, reconcile, admin endpoint, graceful shutdown) against a mock API server that
//! speaks list + watch. No kube-apiserver exists on these machines; this is the closest check
//! that the pieces are connected the way the unit tests assume.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream;
use http::{Request, Response};
use http_body::Frame;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, StreamBody};
use kube::client::Body;
use kube::Client;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use h3_ingress::api::{HostReport, SocketReport, StatusReport};
use h3_ingress::operator::controller::{run_with, Options};
use h3_ingress::operator::reports::{ReportFetcher, ReportFuture};

type RespBody = UnsyncBoxBody<Bytes, Infallible>;
type Handle = tower_test::mock::Handle<Request<Body>, Response<RespBody>>;

const NS: &str = "h3-ingress";

fn full(v: &Value) -> RespBody {
    http_body_util::Full::new(Bytes::from(serde_json::to_vec(v).unwrap()))
        .map_err(|never| match never {})
        .boxed_unsync()
}

fn streaming(rx: mpsc::UnboundedReceiver<Bytes>) -> RespBody {
    let s = stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
    });
    StreamBody::new(s).boxed_unsync()
}

fn list(items: Vec<Value>) -> Value {
    json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": "1"}, "items": items})
}

fn not_found() -> (u16, Value) {
    (
        404,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "reason": "NotFound", "code": 404, "message": "not found"}),
    )
}

fn listener(status: Option<&Value>) -> Value {
    let mut l = json!({"apiVersion": "h3-ingress.dev/v1alpha1", "kind": "Http3Listener",
        "metadata": {"name": "public", "uid": "5e1f0000-0000-4000-8000-000000000001",
                     "generation": 1, "resourceVersion": "3"},
        "spec": {"ingressClassName": "nginx", "upstream": {"address": "ingress-nginx-controller.ingress-nginx:443"}}});
    if let Some(s) = status {
        l["status"] = s.clone();
        l["metadata"]["resourceVersion"] = "4".into();
    }
    l
}

fn ingress() -> Value {
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
           "metadata": {"name": "web", "namespace": "shop", "uid": "1a", "resourceVersion": "2",
                        "annotations": {"h3-ingress.dev/enabled": "true"}},
           "spec": {"ingressClassName": "nginx",
                    "tls": [{"hosts": ["a.example.com"], "secretName": "web-tls"}]}})
}

fn secret() -> Value {
    let ck = rcgen::generate_simple_self_signed(vec!["a.example.com".to_string()]).unwrap();
    let s = k8s_openapi::api::core::v1::Secret {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some("web-tls".into()),
            namespace: Some("shop".into()),
            ..Default::default()
        },
        data: Some(
            [
                (
                    "tls.crt".to_string(),
                    k8s_openapi::ByteString(ck.cert.pem().into_bytes()),
                ),
                (
                    "tls.key".to_string(),
                    k8s_openapi::ByteString(ck.signing_key.serialize_pem().into_bytes()),
                ),
            ]
            .into_iter()
            .collect(),
        ),
        ..Default::default()
    };
    serde_json::to_value(s).unwrap()
}

#[derive(Default)]
struct World {
    lease: Option<Value>,
    lease_writes: Vec<Value>,
    status_patches: Vec<Value>,
    events: Vec<Value>,
    applied: Vec<String>,
    /// The listener's QUIC keys Secret, once the operator created it.
    keys: Option<Value>,
    /// The last DaemonSet applied.
    daemon_set: Option<Value>,
    watches: BTreeMap<String, mpsc::UnboundedSender<Bytes>>,
    unexpected: Vec<String>,
    /// The served Http3Listener CRD; `None`: this binary's own.
    crd: Option<Value>,
    /// Server-side applies of the CRD by the operator.
    crd_patches: Vec<Value>,
    /// Watch events for a path whose watch is not open yet (an API server replays them from
    /// the list's resourceVersion).
    backlog: BTreeMap<String, Vec<Bytes>>,
}

const CRDS: &str = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions";

fn served_crd(w: &World) -> Value {
    w.crd
        .clone()
        .unwrap_or_else(|| serde_json::to_value(h3_ingress::api::crd()).unwrap())
}

fn respond(w: &mut World, method: &str, path: &str, query: &str, body: Value) -> (u16, Value) {
    let lease_path =
        format!("/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/h3-ingress-operator");
    let lease_collection = format!("/apis/coordination.k8s.io/v1/namespaces/{NS}/leases");
    match (method, path) {
        ("GET", p) if p == lease_path => match &w.lease {
            Some(l) => (200, l.clone()),
            None => not_found(),
        },
        ("POST", p) if p == lease_collection => {
            let mut l = body;
            l["metadata"]["resourceVersion"] = "1".into();
            w.lease = Some(l.clone());
            w.lease_writes.push(l.clone());
            (201, l)
        }
        ("PUT", p) if p == lease_path => {
            let mut l = body;
            let rv: u64 = l["metadata"]["resourceVersion"]
                .as_str()
                .unwrap_or("0")
                .parse()
                .unwrap_or(0);
            l["metadata"]["resourceVersion"] = (rv + 1).to_string().into();
            w.lease = Some(l.clone());
            w.lease_writes.push(l.clone());
            (200, l)
        }
        ("GET", "/apis/h3-ingress.dev/v1alpha1/http3listeners") => {
            let status = w.status_patches.last().map(|p| p["status"].clone());
            (200, list(vec![listener(status.as_ref())]))
        }
        ("GET", "/apis/networking.k8s.io/v1/ingresses") => (200, list(vec![ingress()])),
        ("GET", CRDS) => {
            assert!(
                query.contains("fieldSelector=metadata.name%3Dhttp3listeners.h3-ingress.dev"),
                "the CRD is read by name: {query}"
            );
            (200, list(vec![served_crd(w)]))
        }
        ("PATCH", p) if p == format!("{CRDS}/http3listeners.h3-ingress.dev") => {
            assert!(
                query.contains("fieldManager=h3-ingress-operator"),
                "{query}"
            );
            assert!(query.contains("force=true"), "{query}");
            let mut crd = body.clone();
            crd["metadata"]["resourceVersion"] = "99".into();
            w.crd_patches.push(body);
            w.crd = Some(crd.clone());
            let mut line = serde_json::to_vec(&json!({"type": "MODIFIED", "object": crd})).unwrap();
            line.push(b'\n');
            match w.watches.get(CRDS) {
                Some(tx) => drop(tx.send(Bytes::from(line))),
                None => w.backlog.entry(CRDS.into()).or_default().push(line.into()),
            }
            (200, crd)
        }
        ("GET", "/apis/networking.k8s.io/v1/ingressclasses") => (200, list(vec![])),
        ("GET", "/api/v1/secrets") => (200, list(vec![])),
        ("GET", "/api/v1/namespaces/shop/secrets/web-tls") => (200, secret()),
        ("GET", p) if p == format!("/api/v1/namespaces/{NS}/secrets/h3-ingress-keys-public") => {
            match &w.keys {
                Some(k) => (200, k.clone()),
                None => not_found(),
            }
        }
        ("POST", p) if p == format!("/api/v1/namespaces/{NS}/secrets") => {
            assert!(w.keys.is_none(), "the keys Secret is created once");
            w.keys = Some(body.clone());
            (201, body)
        }
        ("GET", p)
            if p == format!("/apis/apps/v1/namespaces/{NS}/daemonsets")
                || p == format!("/api/v1/namespaces/{NS}/services") =>
        {
            (200, list(vec![]))
        }
        (
            "GET",
            "/apis/rbac.authorization.k8s.io/v1/roles"
            | "/apis/rbac.authorization.k8s.io/v1/rolebindings",
        ) => (200, list(vec![])),
        ("GET", p) if p == format!("/api/v1/namespaces/{NS}/pods") => (
            200,
            list(vec![json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "h3-ingress-public-abcde", "namespace": NS},
                "spec": {"nodeName": "node-1", "containers": [{"name": "h3-ingress"}]},
                "status": {"podIP": "10.0.0.7"}})]),
        ),
        ("PATCH", "/apis/h3-ingress.dev/v1alpha1/http3listeners/public/status") => {
            w.status_patches.push(body.clone());
            let l = listener(Some(&body["status"]));
            // The watch would report our own write; the next reconcile must not rewrite it.
            if let Some(tx) = w
                .watches
                .get("/apis/h3-ingress.dev/v1alpha1/http3listeners")
            {
                let mut line =
                    serde_json::to_vec(&json!({"type": "MODIFIED", "object": l})).unwrap();
                line.push(b'\n');
                let _ = tx.send(Bytes::from(line));
            }
            (200, l)
        }
        // The event recorder patches an event it publishes again (its series count).
        ("PATCH", p) if p.starts_with("/apis/events.k8s.io/v1/namespaces/") => {
            w.events.push(body.clone());
            (200, body)
        }
        ("PATCH", p) => {
            assert!(
                query.contains("fieldManager=h3-ingress-operator"),
                "{p}?{query}"
            );
            w.applied
                .push(format!("{} {}", body["kind"].as_str().unwrap_or("?"), p));
            let mut obj = body;
            if obj["kind"] == "DaemonSet" {
                w.daemon_set = Some(obj.clone());
                obj["status"] = json!({"currentNumberScheduled": 1, "desiredNumberScheduled": 1,
                                       "numberMisscheduled": 0, "numberReady": 1});
            }
            (200, obj)
        }
        ("POST", p) if p.starts_with("/apis/events.k8s.io/v1/namespaces/") => {
            w.events.push(body.clone());
            (201, body)
        }
        // A cluster without the Gateway API's CRDs: the operator works without it.
        ("GET", p) if p.starts_with("/apis/gateway.networking.k8s.io/") => not_found(),
        _ => {
            w.unexpected.push(format!("{method} {path}?{query}"));
            not_found()
        }
    }
}

async fn api_server(mut handle: Handle, world: Arc<Mutex<World>>) {
    while let Some((req, send)) = handle.next_request().await {
        let method = req.method().to_string();
        let path = req.uri().path().to_string();
        let query = req.uri().query().unwrap_or_default().to_string();
        let bytes = req.into_body().collect_bytes().await.unwrap();
        let body: Value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap()
        };
        let mut w = world.lock().unwrap();
        if method == "GET" && query.contains("watch=true") {
            let (tx, rx) = mpsc::unbounded_channel();
            for line in w.backlog.remove(&path).unwrap_or_default() {
                let _ = tx.send(line);
            }
            w.watches.insert(path, tx);
            send.send_response(Response::builder().status(200).body(streaming(rx)).unwrap());
            continue;
        }
        let (code, answer) = respond(&mut w, &method, &path, &query, body);
        send.send_response(
            Response::builder()
                .status(code)
                .body(full(&answer))
                .unwrap(),
        );
    }
}

struct Fetcher;

impl ReportFetcher for Fetcher {
    fn fetch(&self, address: SocketAddr) -> ReportFuture {
        assert_eq!(address.to_string(), "10.0.0.7:9476");
        Box::pin(async {
            Ok(StatusReport {
                version: "0.1.0".into(),
                port: 443,
                sockets: vec![SocketReport {
                    family: "ipv4".into(),
                    address: "0.0.0.0:443".into(),
                    bound: true,
                    receive_buffer_requested_bytes: 4_194_304,
                    receive_buffer_effective_bytes: 8_388_608,
                    send_buffer_requested_bytes: 4_194_304,
                    send_buffer_effective_bytes: 8_388_608,
                    ..Default::default()
                }],
                hosts: vec![HostReport {
                    name: "a.example.com".into(),
                    state: "Serving".into(),
                    reason: "Serving".into(),
                    ..Default::default()
                }],
                ..Default::default()
            })
        })
    }
}

/// Sends a watch event to the watch open on `path`.
fn push(world: &Mutex<World>, path: &str, kind: &str, object: Value) {
    let w = world.lock().unwrap();
    let tx = w
        .watches
        .get(path)
        .unwrap_or_else(|| panic!("no watch on {path}"));
    let mut line = serde_json::to_vec(&json!({"type": kind, "object": object})).unwrap();
    line.push(b'\n');
    tx.send(Bytes::from(line)).unwrap();
}

/// The operator's `h3_ingress_operator_reconciles_total{result="ok"}`.
async fn reconciles(admin: SocketAddr) -> u64 {
    let metrics = http_get(admin, "/metrics").await;
    metrics
        .lines()
        .find_map(|l| l.strip_prefix("h3_ingress_operator_reconciles_total{result=\"ok\"} "))
        .unwrap_or_else(|| panic!("{metrics}"))
        .trim()
        .parse()
        .unwrap()
}

/// The DaemonSet of listener `public` as a watch would show it.
fn daemon_set(ready: i32, rv: &str) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
           "metadata": {"name": "h3-ingress-public", "namespace": NS, "uid": "d1", "generation": 1,
                        "resourceVersion": rv,
                        "labels": {"app.kubernetes.io/managed-by": "h3-ingress-operator",
                                   "app.kubernetes.io/component": "data-plane"},
                        "ownerReferences": [{"apiVersion": "h3-ingress.dev/v1alpha1", "kind": "Http3Listener",
                                             "name": "public", "uid": "5e1f0000-0000-4000-8000-000000000001",
                                             "controller": true}]},
           "spec": {"selector": {"matchLabels": {"a": "b"}}, "template": {"spec": {"containers": []}}},
           "status": {"currentNumberScheduled": 1, "desiredNumberScheduled": 1, "numberMisscheduled": 0,
                      "numberReady": ready, "observedGeneration": 1}})
}

/// Waits `settle`, then returns how many reconciles ran meanwhile.
async fn reconciles_after(admin: SocketAddr, settle: Duration, action: impl FnOnce()) -> u64 {
    let before = reconciles(admin).await;
    action();
    tokio::time::sleep(settle).await;
    reconciles(admin).await - before
}

/// Our own writes and status-only changes do not start a reconcile; a spec edit and a change
/// in the DaemonSet's readiness do. (A reconcile writes status and applies objects; if those
/// writes triggered reconciles, a listener under traffic would reconcile itself in a loop.)
async fn only_real_changes_trigger(admin: SocketAddr, world: &Arc<Mutex<World>>) {
    let listeners = "/apis/h3-ingress.dev/v1alpha1/http3listeners";
    let daemonsets = format!("/apis/apps/v1/namespaces/{NS}/daemonsets");
    let settle = Duration::from_millis(2500);
    let status = json!({"hostsSummary": "9/9"});
    let n = reconciles_after(admin, settle, || {
        push(world, listeners, "MODIFIED", listener(Some(&status)));
    })
    .await;
    assert_eq!(n, 0, "a status-only change reconciled");
    let n = reconciles_after(admin, settle, || {
        push(world, &daemonsets, "ADDED", daemon_set(1, "20"));
    })
    .await;
    // The DaemonSet is new to the watch: one reconcile for it.
    assert_eq!(n, 1, "first sight of the DaemonSet");
    let n = reconciles_after(admin, settle, || {
        push(world, &daemonsets, "MODIFIED", daemon_set(1, "21"));
        let mut l = listener(Some(&json!({"hostsSummary": "8/9"})));
        l["metadata"]["resourceVersion"] = "30".into();
        push(world, listeners, "MODIFIED", l);
    })
    .await;
    assert_eq!(
        n, 0,
        "status-only and unchanged-readiness events reconciled"
    );
    let n = reconciles_after(admin, settle, || {
        push(world, &daemonsets, "MODIFIED", daemon_set(0, "22"));
    })
    .await;
    assert_eq!(n, 1, "a readiness change must reconcile");
    let n = reconciles_after(admin, settle, || {
        let mut l = listener(None);
        l["metadata"]["generation"] = 2.into();
        l["metadata"]["resourceVersion"] = "31".into();
        push(world, listeners, "MODIFIED", l);
    })
    .await;
    assert!(n >= 1, "a spec change must reconcile");
}

async fn http_get(addr: SocketAddr, path: &str) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_elects_itself_reconciles_writes_status_once_and_releases_the_lease() {
    let (svc, handle) = tower_test::mock::pair::<Request<Body>, Response<RespBody>>();
    let client = Client::new(svc, "default");
    let world = Arc::new(Mutex::new(World::default()));
    tokio::spawn(api_server(handle, world.clone()));
    let admin = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin_addr = admin.local_addr().unwrap();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let opts = Options {
        namespace: NS.into(),
        leader_election: true,
        lease_name: "h3-ingress-operator".into(),
        data_plane_image: "ghcr.io/h3-ingress/h3-ingress:test".into(),
        admin_address: admin_addr,
        // What the operator's --image-pull-secrets and --tune-image give every data plane pod.
        pod_defaults: h3_ingress::operator::resources::PodDefaults {
            image_pull_secrets: vec!["regcred".into()],
            tune_image: "busybox@sha256:test".into(),
        },
        crd_upgrade: true,
    };
    let op = tokio::spawn(run_with(
        client,
        opts,
        Some(admin),
        Arc::new(Fetcher),
        shutdown.clone(),
    ));

    // Wait for the status write, then give the controller time to see its own write.
    let mut waited = 0;
    while world.lock().unwrap().status_patches.is_empty() {
        assert!(
            waited < 200,
            "no status patch within 10 s; world: {:?}",
            world.lock().unwrap().unexpected
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        waited += 1;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;

    let ready = http_get(admin_addr, "/readyz").await;
    assert!(ready.starts_with("HTTP/1.1 200"), "{ready}");
    let metrics = http_get(admin_addr, "/metrics").await;
    assert!(
        metrics.contains("h3_ingress_operator_leader 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("h3_ingress_operator_status_writes_total 1"),
        "{metrics}"
    );
    only_real_changes_trigger(admin_addr, &world).await;

    shutdown.cancel();
    let done = tokio::time::timeout(Duration::from_secs(10), op).await;
    assert!(matches!(done, Ok(Ok(Ok(())))), "{done:?}");

    let w = world.lock().unwrap();
    assert!(
        w.unexpected.is_empty(),
        "unexpected requests: {:#?}",
        w.unexpected
    );
    // (`status_writes_total 1` above: the unchanged status was not written again; the later
    // patches come from the readiness and spec changes `only_real_changes_trigger` made.)
    assert_eq!(w.keys.as_ref().unwrap()["immutable"], true);
    let status = &w.status_patches[0]["status"];
    let ready = status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Ready")
        .unwrap();
    assert_eq!(
        (ready["status"].as_str(), ready["reason"].as_str()),
        (Some("True"), Some("AllHostsServing")),
        "{status}"
    );
    assert_eq!(status["hostsSummary"], "1/1");
    let crd = condition(status, "CRDCurrent");
    assert_eq!(
        (crd["status"].as_str(), crd["reason"].as_str()),
        (Some("True"), Some("CRDMatches"))
    );
    assert!(
        w.crd_patches.is_empty(),
        "the served CRD is this binary's: not applied again"
    );
    assert!(
        w.applied.iter().any(|a| a.starts_with("DaemonSet ")),
        "{:?}",
        w.applied
    );
    let pod = &w.daemon_set.as_ref().unwrap()["spec"]["template"]["spec"];
    assert_eq!(pod["imagePullSecrets"], json!([{"name": "regcred"}]));
    assert_eq!(pod["nodeSelector"], json!({"kubernetes.io/os": "linux"}));
    // A reused tag (not VERSION-COMMIT, no digest) is pulled every time a pod starts.
    assert_eq!(pod["containers"][0]["imagePullPolicy"], "Always");
    assert!(
        w.events.iter().any(|e| e["reason"] == "Http3Enabled"),
        "{:?}",
        w.events
    );
    // Took the Lease, renewed it, and gave it back on shutdown.
    assert_eq!(
        w.lease_writes[0]["spec"]["holderIdentity"]
            .as_str()
            .map(|s| !s.is_empty()),
        Some(true)
    );
    let last = w.lease_writes.last().unwrap();
    assert!(
        last["spec"]["holderIdentity"].is_null(),
        "lease not released: {last}"
    );
}

fn condition<'a>(status: &'a Value, type_: &str) -> &'a Value {
    status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == type_)
        .unwrap_or_else(|| panic!("no {type_} condition in {status}"))
}

const UPSTREAM_SCHEMA: &str =
    "/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties/upstream/properties";

/// The CRD of a release from before schema revisions: this binary's without the annotations
/// and without `upstream.servedCertificateGraceSeconds`.
fn older_crd() -> Value {
    let mut crd = serde_json::to_value(h3_ingress::api::crd()).unwrap();
    crd["metadata"]["annotations"] = json!({});
    let upstream = crd.pointer_mut(UPSTREAM_SCHEMA).unwrap();
    let removed = upstream
        .as_object_mut()
        .unwrap()
        .remove("servedCertificateGraceSeconds");
    assert!(removed.is_some());
    crd
}

/// A later release's CRD: the next revision, with `upstream.futureSetting`.
fn newer_crd() -> Value {
    let mut crd = serde_json::to_value(h3_ingress::api::crd()).unwrap();
    let next = h3_ingress::api::schema::SCHEMA_REVISION + 1;
    crd["metadata"]["annotations"]["h3-ingress.dev/schema-revision"] = next.to_string().into();
    let upstream = crd.pointer_mut(UPSTREAM_SCHEMA).unwrap();
    upstream["futureSetting"] = json!({"type": "integer", "default": 1});
    crd
}

/// Runs the operator (its own leader) on `world` until the first status patch, then stops it;
/// returns its last /metrics.
async fn first_status(world: &Arc<Mutex<World>>, crd_upgrade: bool) -> String {
    let (svc, handle) = tower_test::mock::pair::<Request<Body>, Response<RespBody>>();
    tokio::spawn(api_server(handle, world.clone()));
    let admin = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin_addr = admin.local_addr().unwrap();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let opts = Options {
        namespace: NS.into(),
        leader_election: false,
        lease_name: "h3-ingress-operator".into(),
        data_plane_image: "ghcr.io/h3-ingress/h3-ingress:test".into(),
        admin_address: admin_addr,
        pod_defaults: Default::default(),
        crd_upgrade,
    };
    let client = Client::new(svc, "default");
    let op = tokio::spawn(run_with(
        client,
        opts,
        Some(admin),
        Arc::new(Fetcher),
        shutdown.clone(),
    ));
    for _ in 0..200 {
        if !world.lock().unwrap().status_patches.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Events are published after the status write.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let metrics = http_get(admin_addr, "/metrics").await;
    shutdown.cancel();
    let done = tokio::time::timeout(Duration::from_secs(10), op).await;
    assert!(matches!(done, Ok(Ok(Ok(())))), "{done:?}");
    let w = world.lock().unwrap();
    assert!(!w.status_patches.is_empty(), "no status patch within 10 s");
    assert!(w.unexpected.is_empty(), "{:#?}", w.unexpected);
    metrics
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_crd_is_reported_with_a_warning_and_left_alone_when_not_allowed() {
    let world = Arc::new(Mutex::new(World {
        crd: Some(older_crd()),
        ..Default::default()
    }));
    let metrics = first_status(&world, false).await;
    let w = world.lock().unwrap();
    let c = condition(&w.status_patches[0]["status"], "CRDCurrent");
    assert_eq!(
        (c["status"].as_str(), c["reason"].as_str()),
        (Some("False"), Some("CRDOutdated")),
        "{c}"
    );
    let message = c["message"].as_str().unwrap();
    assert!(
        message.contains("revision 0 (not annotated)")
            && message.contains("drops spec.upstream.servedCertificateGraceSeconds"),
        "{message}"
    );
    let warning = w
        .events
        .iter()
        .find(|e| e["reason"] == "CRDOutdated")
        .unwrap_or_else(|| panic!("no CRDOutdated event: {:?}", w.events));
    assert_eq!(warning["type"], "Warning");
    assert!(w.crd_patches.is_empty(), "--no-crd-upgrade applied the CRD");
    assert!(
        metrics.contains("h3_ingress_operator_crd_schema_revision{of=\"served\"} 0"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_crd_is_upgraded_by_the_operator_before_any_listener_sees_it() {
    let world = Arc::new(Mutex::new(World {
        crd: Some(older_crd()),
        ..Default::default()
    }));
    let metrics = first_status(&world, true).await;
    let w = world.lock().unwrap();
    assert_eq!(w.crd_patches.len(), 1, "one server-side apply of the CRD");
    let applied = &w.crd_patches[0];
    assert_eq!(
        applied["metadata"]["annotations"]["h3-ingress.dev/schema-revision"],
        h3_ingress::api::schema::SCHEMA_REVISION.to_string()
    );
    assert!(applied
        .pointer(&format!("{UPSTREAM_SCHEMA}/servedCertificateGraceSeconds"))
        .is_some());
    for patch in &w.status_patches {
        let c = condition(&patch["status"], "CRDCurrent");
        assert_eq!(
            (c["status"].as_str(), c["reason"].as_str()),
            (Some("True"), Some("CRDMatches"))
        );
    }
    assert!(
        !w.events.iter().any(|e| e["reason"] == "CRDOutdated"),
        "{:?}",
        w.events
    );
    assert!(
        metrics.contains("h3_ingress_operator_crd_upgrades_total{result=\"ok\"} 1"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_crd_is_tolerated_and_never_downgraded() {
    let world = Arc::new(Mutex::new(World {
        crd: Some(newer_crd()),
        ..Default::default()
    }));
    first_status(&world, true).await;
    let w = world.lock().unwrap();
    let c = condition(&w.status_patches[0]["status"], "CRDCurrent");
    assert_eq!(
        (c["status"].as_str(), c["reason"].as_str()),
        (Some("True"), Some("CRDNewer")),
        "{c}"
    );
    assert!(
        c["message"]
            .as_str()
            .unwrap()
            .ends_with("reads past spec.upstream.futureSetting"),
        "{c}"
    );
    assert!(
        w.crd_patches.is_empty(),
        "an older operator must not apply its CRD over a newer one"
    );
}
