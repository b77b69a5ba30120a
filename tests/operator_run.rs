//! The whole operator wiring (`run_with`: Lease election, Controller with its watches and
//! triggers, caches, reconcile, admin endpoint, graceful shutdown) against a mock API server
//! that speaks list + watch: it keeps what is written, lists it (by label selector, as
//! metadata when asked), and tells every open watch about each write, as a kube-apiserver
//! would, so the operator's own writes come back through its caches. No kube-apiserver runs
//! here (the real one is `tests/cluster/`); this is the closest quick check that the pieces
//! are connected the way the unit tests assume: which watches are opened and how, which
//! changes start a reconcile (and that the operator's own writes do not), and that once its
//! caches hold what it wrote, a reconcile costs no API request.

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

use h3_ingress::api::mirror;
use h3_ingress::api::{MirrorReport, SocketReport, StatusReport};
use h3_ingress::operator::reports::{ReportFetcher, ReportFuture};
use h3_ingress::operator::run::{run_with, Options};

type RespBody = UnsyncBoxBody<Bytes, Infallible>;
type Handle = tower_test::mock::Handle<Request<Body>, Response<RespBody>>;

const NS: &str = "h3-ingress";
const HOSTS: &str = "h3-ingress-hosts";
const LISTENERS: &str = "/apis/h3-ingress.dev/v1alpha1/http3listeners";
const DAEMON_SETS: &str = "/apis/apps/v1/daemonsets";
const SECRETS: &str = "/api/v1/secrets";
const WEB_TLS: &str = "/api/v1/namespaces/shop/secrets/web-tls";
const CRDS: &str = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions";
/// Every operator's Lease, cluster-wide (the operator's own is answered apart, `lease`).
const LEASES: &str = "/apis/coordination.k8s.io/v1/leases";
const CRD_NAME: &str = "http3listeners.h3-ingress.dev";
/// The label selector of every watch of what the operator makes (`watches::owned_selector`).
const OWNED: &str =
    "app.kubernetes.io/managed-by=h3-ingress-operator,app.kubernetes.io/component=data-plane";

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

fn not_found() -> (u16, Value) {
    (
        404,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "reason": "NotFound", "code": 404, "message": "not found"}),
    )
}

fn listener() -> Value {
    json!({"apiVersion": "h3-ingress.dev/v1alpha1", "kind": "Http3Listener",
        "metadata": {"name": "public", "uid": "5e1f0000-0000-4000-8000-000000000001",
                     "generation": 1},
        "spec": {"ingressClassName": "nginx", "upstream": {"address": "ingress-nginx-controller.ingress-nginx:443"}}})
}

fn ingress() -> Value {
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
           "metadata": {"name": "web", "namespace": "shop", "uid": "1a", "generation": 1,
                        "annotations": {"h3-ingress.dev/enabled": "true"}},
           "spec": {"ingressClassName": "nginx",
                    "tls": [{"hosts": ["a.example.com"], "secretName": "web-tls"}]}})
}

/// `shop/web-tls` with a new certificate for `a.example.com` at every call.
fn tls_secret() -> Value {
    let ck = rcgen::generate_simple_self_signed(vec!["a.example.com".to_string()]).unwrap();
    let s = k8s_openapi::api::core::v1::Secret {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some("web-tls".into()),
            namespace: Some("shop".into()),
            ..Default::default()
        },
        type_: Some("kubernetes.io/tls".into()),
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

fn pod() -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "h3-ingress-public-abcde", "namespace": NS,
                     "labels": {"app.kubernetes.io/managed-by": "h3-ingress-operator",
                                "app.kubernetes.io/component": "data-plane",
                                "app.kubernetes.io/name": "h3-ingress",
                                "app.kubernetes.io/instance": "public"}},
        "spec": {"nodeName": "node-1", "containers": [{"name": "h3-ingress"}]},
        "status": {"podIP": "10.0.0.7"}})
}

/// Where an API path points: the resource across namespaces (`/api/v1/secrets`), the
/// namespace, the object's name, and whether it is the status subresource.
#[derive(Debug, Clone, PartialEq)]
struct Target {
    all: String,
    ns: Option<String>,
    name: Option<String>,
    status: bool,
}

fn target(path: &str) -> Target {
    let parts: Vec<&str> = path.split('/').collect();
    let (prefix, ns, rest) = match parts.iter().position(|p| *p == "namespaces") {
        Some(i) if parts.len() > i + 2 => (&parts[..i], Some(parts[i + 1]), &parts[i + 2..]),
        _ => {
            let n = if parts.get(1) == Some(&"api") { 3 } else { 4 };
            (
                &parts[..n.min(parts.len())],
                None,
                &parts[n.min(parts.len())..],
            )
        }
    };
    Target {
        all: format!("{}/{}", prefix.join("/"), rest.first().unwrap_or(&"")),
        ns: ns.map(str::to_string),
        name: rest.get(1).map(|s| s.to_string()),
        status: rest.get(2) == Some(&"status"),
    }
}

/// `k=v,...` selectors, equality only (all the operator uses).
fn selected(object: &Value, selector: &str) -> bool {
    selector.split(',').filter(|s| !s.is_empty()).all(|kv| {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        object["metadata"]["labels"][k].as_str() == Some(v)
    })
}

/// An object as a metadata-only request gets it.
fn metadata_only(object: &Value) -> Value {
    json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
           "metadata": object["metadata"].clone()})
}

struct Watch {
    all: String,
    ns: Option<String>,
    selector: String,
    metadata: bool,
    tx: mpsc::UnboundedSender<Bytes>,
}

/// The query parameter `key`, percent-decoded.
fn param(query: &str, key: &str) -> Option<String> {
    let raw = query
        .split('&')
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))?;
    let mut out = Vec::new();
    let mut bytes = raw.bytes();
    while let Some(b) = bytes.next() {
        match b {
            b'%' => {
                let hex: String = bytes.by_ref().take(2).map(char::from).collect();
                out.push(u8::from_str_radix(&hex, 16).unwrap());
            }
            b'+' => out.push(b' '),
            b => out.push(b),
        }
    }
    Some(String::from_utf8(out).unwrap())
}

/// The API server's state.
#[derive(Default)]
struct World {
    /// Objects by resource (`Target::all`), then `(namespace, name)`.
    objects: BTreeMap<String, BTreeMap<(String, String), Value>>,
    rv: u64,
    lease: Option<Value>,
    lease_writes: Vec<Value>,
    status_patches: Vec<Value>,
    events: Vec<Value>,
    /// `kind path` of every server-side apply.
    applied: Vec<String>,
    watches: Vec<Watch>,
    /// `all?labelSelector` of every watch opened, and whether it asked for metadata only.
    watch_requests: Vec<(String, String, bool)>,
    /// `METHOD path` of every request but the Lease's and watches.
    requests: Vec<String>,
    /// Every watch event sent (resource, namespace, resourceVersion, type, object), so a
    /// watch opened from an older resourceVersion gets what happened since, as from an API
    /// server (the operator may write between its list and its watch).
    history: Vec<(String, String, u64, String, Value)>,
    unexpected: Vec<String>,
}

impl World {
    fn next_rv(&mut self) -> String {
        self.rv += 1;
        self.rv.to_string()
    }

    fn get(&self, t: &Target) -> Option<&Value> {
        let key = (t.ns.clone().unwrap_or_default(), t.name.clone()?);
        self.objects.get(&t.all)?.get(&key)
    }

    /// Stores `object` under `t` (a new resourceVersion) and tells the watches.
    fn put(&mut self, t: &Target, mut object: Value) -> Value {
        let existed = self.get(t).is_some();
        object["metadata"]["resourceVersion"] = self.next_rv().into();
        let key = (t.ns.clone().unwrap_or_default(), t.name.clone().unwrap());
        let objects = self.objects.entry(t.all.clone()).or_default();
        objects.insert(key, object.clone());
        self.tell(t, if existed { "MODIFIED" } else { "ADDED" }, &object);
        object
    }

    fn remove(&mut self, t: &Target) -> Option<Value> {
        let key = (t.ns.clone().unwrap_or_default(), t.name.clone()?);
        let object = self.objects.get_mut(&t.all)?.remove(&key)?;
        self.tell(t, "DELETED", &object);
        Some(object)
    }

    /// Changes a stored object as someone else would (a new resourceVersion, watches told).
    fn edit(&mut self, path: &str, f: impl FnOnce(&mut Value)) {
        let t = target(path);
        let mut object = self.get(&t).cloned().unwrap_or_else(|| panic!("{path}"));
        f(&mut object);
        self.put(&t, object);
    }

    fn tell(&mut self, t: &Target, kind: &str, object: &Value) {
        let rv = object["metadata"]["resourceVersion"]
            .as_str()
            .and_then(|v| v.parse().ok())
            .unwrap_or(self.rv);
        self.history.push((
            t.all.clone(),
            t.ns.clone().unwrap_or_default(),
            rv,
            kind.to_string(),
            object.clone(),
        ));
        let ns = t.ns.as_deref();
        for w in &self.watches {
            let here = w.all == t.all && (w.ns.is_none() || w.ns.as_deref() == ns);
            if !here || !selected(object, &w.selector) {
                continue;
            }
            let object = match w.metadata {
                true => metadata_only(object),
                false => object.clone(),
            };
            let mut line = serde_json::to_vec(&json!({"type": kind, "object": object})).unwrap();
            line.push(b'\n');
            let _ = w.tx.send(Bytes::from(line));
        }
    }

    fn list(&self, t: &Target, selector: &str, metadata: bool) -> Value {
        let items: Vec<Value> = self
            .objects
            .get(&t.all)
            .into_iter()
            .flatten()
            .filter(|((ns, _), o)| t.ns.as_ref().is_none_or(|n| n == ns) && selected(o, selector))
            .map(|(_, o)| {
                if metadata {
                    metadata_only(o)
                } else {
                    o.clone()
                }
            })
            .collect();
        let kind = if metadata {
            "PartialObjectMetadataList"
        } else {
            "List"
        };
        json!({"apiVersion": "v1", "kind": kind,
               "metadata": {"resourceVersion": self.rv.to_string()}, "items": items})
    }

    /// The cluster as the test starts: the listener, an annotated Ingress, its TLS Secret, an
    /// unrelated Secret, the listener's pod (the DaemonSet controller is not simulated) and
    /// this binary's CRD.
    fn seeded() -> Self {
        Self::with_crd(serde_json::to_value(h3_ingress::api::crd()).unwrap())
    }

    /// [`World::seeded`] serving `crd` as the Http3Listener CRD.
    fn with_crd(crd: Value) -> Self {
        let mut w = World::default();
        w.put(&target(&format!("{CRDS}/{CRD_NAME}")), crd);
        w.put(&target(&format!("{LISTENERS}/public")), listener());
        w.put(
            &target("/apis/networking.k8s.io/v1/namespaces/shop/ingresses/web"),
            ingress(),
        );
        w.put(&target(WEB_TLS), tls_secret());
        let other = json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "db", "namespace": "other"}, "data": {"password": "c2VjcmV0"}});
        w.put(&target("/api/v1/namespaces/other/secrets/db"), other);
        w.put(
            &target(&format!(
                "/api/v1/namespaces/{NS}/pods/h3-ingress-public-abcde"
            )),
            pod(),
        );
        w
    }
}

/// The resources the operator lists and watches (`Target::all`).
const LISTED: [&str; 14] = [
    LISTENERS,
    LEASES,
    CRDS,
    "/apis/networking.k8s.io/v1/ingresses",
    "/apis/networking.k8s.io/v1/ingressclasses",
    SECRETS,
    "/api/v1/pods",
    "/api/v1/services",
    "/api/v1/serviceaccounts",
    DAEMON_SETS,
    "/apis/rbac.authorization.k8s.io/v1/roles",
    "/apis/rbac.authorization.k8s.io/v1/rolebindings",
    "/apis/rbac.authorization.k8s.io/v1/clusterroles",
    "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
];

/// A server-side apply: stored as sent; a DaemonSet gets a generation (bumped when its spec
/// changes) and the status of one ready pod.
fn apply(w: &mut World, t: &Target, mut object: Value) -> Value {
    let old = w.get(t).cloned();
    let uid = old.as_ref().map(|o| o["metadata"]["uid"].clone());
    object["metadata"]["uid"] = uid.unwrap_or_else(|| format!("uid-{}", w.rv).into());
    if object["kind"] == "DaemonSet" {
        let generation = match &old {
            Some(o) if o["spec"] == object["spec"] => o["metadata"]["generation"].as_i64().unwrap(),
            Some(o) => o["metadata"]["generation"].as_i64().unwrap() + 1,
            None => 1,
        };
        object["metadata"]["generation"] = generation.into();
        object["status"] = json!({"currentNumberScheduled": 1, "desiredNumberScheduled": 1,
            "numberMisscheduled": 0, "numberReady": 1, "observedGeneration": generation});
    }
    w.put(t, object)
}

fn respond(w: &mut World, method: &str, path: &str, query: &str, body: Value) -> (u16, Value) {
    let t = target(path);
    let events = t.all == "/apis/events.k8s.io/v1/events";
    match method {
        "GET" if t.name.is_none() && LISTED.contains(&t.all.as_str()) => {
            let selector = param(query, "labelSelector").unwrap_or_default();
            (200, w.list(&t, &selector, false))
        }
        "GET" if t.name.is_some() => match w.get(&t) {
            Some(o) => (200, o.clone()),
            None => not_found(),
        },
        "POST" | "PATCH" if events => {
            w.events.push(body.clone());
            (if method == "POST" { 201 } else { 200 }, body)
        }
        "PATCH" if t.status => {
            w.status_patches.push(body.clone());
            let mut l = w.get(&t).cloned().unwrap();
            l["status"] = body["status"].clone();
            (200, w.put(&t, l))
        }
        "PATCH" => {
            assert!(
                query.contains("fieldManager=h3-ingress-operator") && query.contains("force=true"),
                "{path}?{query}"
            );
            let kind = body["kind"].as_str().unwrap_or("?").to_string();
            w.applied.push(format!("{kind} {path}"));
            (200, apply(w, &t, body))
        }
        "POST" => {
            let name = body["metadata"]["name"].as_str().unwrap().to_string();
            let t = Target {
                name: Some(name),
                ..t
            };
            if w.get(&t).is_some() {
                return (
                    409,
                    json!({"kind": "Status", "code": 409, "reason": "AlreadyExists"}),
                );
            }
            (201, w.put(&t, body))
        }
        "DELETE" => match w.remove(&t) {
            Some(_) => (
                200,
                json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}),
            ),
            None => not_found(),
        },
        _ => {
            w.unexpected.push(format!("{method} {path}?{query}"));
            not_found()
        }
    }
}

/// The Lease, answered apart (it is renewed every few seconds and is no reconcile's cost).
fn lease(w: &mut World, method: &str, body: Value) -> (u16, Value) {
    match method {
        "GET" => match &w.lease {
            Some(l) => (200, l.clone()),
            None => not_found(),
        },
        "POST" | "PUT" => {
            let mut l = body;
            l["metadata"]["resourceVersion"] = w.next_rv().into();
            w.lease = Some(l.clone());
            w.lease_writes.push(l.clone());
            (if method == "POST" { 201 } else { 200 }, l)
        }
        _ => panic!("{method} on the Lease"),
    }
}

fn open_watch(w: &mut World, path: &str, query: &str, metadata: bool) -> RespBody {
    let t = target(path);
    let selector = param(query, "labelSelector").unwrap_or_default();
    w.watch_requests
        .push((t.all.clone(), selector.clone(), metadata));
    let (tx, rx) = mpsc::unbounded_channel();
    let since: u64 = param(query, "resourceVersion")
        .and_then(|v| v.parse().ok())
        .unwrap_or(u64::MAX);
    for (all, ns, rv, kind, object) in &w.history {
        let here = *all == t.all && t.ns.as_ref().is_none_or(|n| n == ns);
        if here && *rv > since && selected(object, &selector) {
            let object = if metadata {
                metadata_only(object)
            } else {
                object.clone()
            };
            let mut line = serde_json::to_vec(&json!({"type": kind, "object": object})).unwrap();
            line.push(b'\n');
            let _ = tx.send(Bytes::from(line));
        }
    }
    w.watches.push(Watch {
        all: t.all,
        ns: t.ns,
        selector,
        metadata,
        tx,
    });
    streaming(rx)
}

async fn api_server(mut handle: Handle, world: Arc<Mutex<World>>) {
    let leases = format!("/apis/coordination.k8s.io/v1/namespaces/{NS}/leases");
    while let Some((req, send)) = handle.next_request().await {
        let method = req.method().to_string();
        let path = req.uri().path().to_string();
        let query = req.uri().query().unwrap_or_default().to_string();
        let accept = req
            .headers()
            .get(http::header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let metadata = accept.contains("as=PartialObjectMetadata");
        let bytes = req.into_body().collect_bytes().await.unwrap();
        let body: Value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap()
        };
        let mut w = world.lock().unwrap();
        let all_secrets = target(&path).all == SECRETS && target(&path).ns.is_none();
        if all_secrets && !metadata {
            // Key material of every Secret in the cluster would cross the wire.
            w.unexpected
                .push(format!("full read of all Secrets: {path}?{query}"));
        }
        if method == "GET" && query.contains("watch=true") {
            let body = open_watch(&mut w, &path, &query, metadata);
            send.send_response(Response::builder().status(200).body(body).unwrap());
            continue;
        }
        let (code, mut answer) = if path.starts_with(&leases) {
            lease(&mut w, &method, body)
        } else if path.starts_with("/apis/gateway.networking.k8s.io/")
            || path.starts_with("/apis/traefik.io/")
        {
            // A cluster without the Gateway API's or Traefik's CRDs: the operator works
            // without them.
            not_found()
        } else {
            w.requests.push(format!("{method} {path}"));
            respond(&mut w, &method, &path, &query, body)
        };
        if metadata && code == 200 && method == "GET" {
            answer = match target(&path).name {
                Some(_) => metadata_only(&answer),
                None => {
                    let t = target(&path);
                    let selector = param(&query, "labelSelector").unwrap_or_default();
                    w.list(&t, &selector, true)
                }
            };
        }
        send.send_response(
            Response::builder()
                .status(code)
                .body(full(&answer))
                .unwrap(),
        );
    }
}

/// The pod's `/status`: it reports the listener's mirrors as they were at the previous look
/// (the first time, not loaded yet), as a pod that loads what it watches a moment later.
struct Fetcher {
    world: Arc<Mutex<World>>,
    seen: Mutex<Option<String>>,
}

impl Fetcher {
    fn digest_now(&self) -> String {
        let w = self.world.lock().unwrap();
        let mirrors = w.objects.get(SECRETS).into_iter().flatten();
        let ours: Vec<(String, String)> = mirrors
            .filter(|((ns, _), o)| {
                ns == HOSTS && o["metadata"]["labels"][mirror::LISTENER_LABEL] == "public"
            })
            .map(|((_, name), o)| {
                let rv = o["metadata"]["resourceVersion"].as_str().unwrap();
                (name.clone(), rv.to_string())
            })
            .collect();
        mirror::digest(ours.iter().map(|(n, v)| (n.as_str(), v.as_str())))
    }
}

impl ReportFetcher for Fetcher {
    fn fetch(&self, address: SocketAddr) -> ReportFuture {
        assert_eq!(address.to_string(), "10.0.0.7:9476");
        let now = self.digest_now();
        let before = self.seen.lock().unwrap().replace(now);
        let report = StatusReport {
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
            mirrors: Some(MirrorReport {
                synced: before.is_some(),
                digest: before.unwrap_or_default(),
                ..Default::default()
            }),
            ..Default::default()
        };
        Box::pin(async move { Ok(report) })
    }
}

/// The operator's `h3_ingress_operator_reconciles_total{result="ok"}`.
async fn reconciles(admin: SocketAddr) -> u64 {
    metric(admin, "h3_ingress_operator_reconciles_total{result=\"ok\"}").await
}

async fn metric(admin: SocketAddr, name: &str) -> u64 {
    let metrics = http_get(admin, "/metrics").await;
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {name} in {metrics}"))
        .trim()
        .parse()
        .unwrap()
}

/// Runs `action`, waits `settle`, and returns how many reconciles ran meanwhile and the API
/// requests they made (the Lease's and watches aside).
async fn after(
    admin: SocketAddr,
    world: &Mutex<World>,
    settle: Duration,
    action: impl FnOnce(&mut World),
) -> (u64, Vec<String>) {
    let before = reconciles(admin).await;
    let seen = {
        let mut w = world.lock().unwrap();
        let seen = w.requests.len();
        action(&mut w);
        seen
    };
    tokio::time::sleep(settle).await;
    let requests = world.lock().unwrap().requests[seen..].to_vec();
    (reconciles(admin).await - before, requests)
}

/// Our own writes and status-only changes do not start a reconcile; a change in the
/// DaemonSet's readiness, in a Secret the listener serves hosts with, and in its spec do.
/// (A reconcile writes status and applies objects; if those writes triggered reconciles, a
/// listener under traffic would reconcile itself in a loop.) At rest nothing but the Lease
/// costs a request.
async fn only_real_changes_trigger(admin: SocketAddr, world: &Arc<Mutex<World>>) {
    let settle = Duration::from_millis(2500);
    let listener_path = format!("{LISTENERS}/public");
    let ds = format!("/apis/apps/v1/namespaces/{NS}/daemonsets/h3-ingress-public");
    let (n, requests) = after(admin, world, settle, |w| {
        w.edit(&listener_path, |l| {
            l["status"]["hostsSummary"] = "9/9".into()
        });
    })
    .await;
    assert_eq!(
        (n, requests),
        (0, vec![]),
        "a status-only change reconciled"
    );
    let (n, requests) = after(admin, world, settle, |w| {
        // A status rewrite with the same counts (the DaemonSet controller's), and another
        // status-only listener change.
        w.edit(&ds, |d| d["status"]["numberAvailable"] = 1.into());
        w.edit(&listener_path, |l| {
            l["status"]["hostsSummary"] = "8/9".into()
        });
    })
    .await;
    assert_eq!((n, requests), (0, vec![]), "unchanged readiness reconciled");
    let (n, requests) = after(admin, world, settle, |w| {
        w.edit("/api/v1/namespaces/other/secrets/db", |s| {
            s["data"]["password"] = "b3RoZXI=".into()
        });
    })
    .await;
    assert_eq!(
        (n, requests),
        (0, vec![]),
        "a Secret no host uses reconciled"
    );
    let (n, requests) = after(admin, world, settle, |w| {
        w.edit(&ds, |d| d["status"]["numberReady"] = 0.into());
    })
    .await;
    assert_eq!(n, 1, "a readiness change must reconcile");
    // Everything else it reads comes from the caches.
    assert_eq!(status_and_events(&requests), ["PATCH status"; 1]);
    // A renewed certificate: the Secret is read once and its mirror written once; the host
    // stays served (no status write) while the pod loads it, and the look after costs nothing.
    let mirror = format!(
        "/api/v1/namespaces/{HOSTS}/secrets/{}",
        mirror::mirror_name(
            "public",
            &h3_ingress::api::SecretRef {
                namespace: "shop".into(),
                name: "web-tls".into()
            }
        )
    );
    let (n, requests) = after(admin, world, Duration::from_secs(5), |w| {
        let renewed = tls_secret();
        w.edit(WEB_TLS, |s| s["data"] = renewed["data"].clone());
    })
    .await;
    assert!(n >= 1, "a renewed Secret must reconcile");
    assert_eq!(
        requests,
        [format!("GET {WEB_TLS}"), format!("PATCH {mirror}")]
    );
    let (n, requests) = after(admin, world, settle, |w| {
        w.edit(&listener_path, |l| l["metadata"]["generation"] = 2.into());
    })
    .await;
    assert!(n >= 1, "a spec change must reconcile");
    // A new generation changes none of the objects: only observedGeneration is written.
    assert_eq!(status_and_events(&requests), ["PATCH status"; 1]);
}

/// `requests` with the events left out and the status patch shortened: what a reconcile
/// asked of the API server besides publishing events.
fn status_and_events(requests: &[String]) -> Vec<&str> {
    requests
        .iter()
        .filter(|r| !r.contains("/apis/events.k8s.io/"))
        .map(|r| match r.ends_with("/http3listeners/public/status") {
            true => "PATCH status",
            false => r.as_str(),
        })
        .collect()
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

fn ready(status: &Value) -> (Option<&str>, Option<&str>) {
    let c = status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "Ready");
    (
        c.and_then(|c| c["status"].as_str()),
        c.and_then(|c| c["reason"].as_str()),
    )
}

/// Every owned kind is watched by label, in the namespace it lives in; Secrets cluster-wide
/// are watched as metadata only.
fn assert_watches(w: &World) {
    let watched = |all: &str| {
        w.watch_requests
            .iter()
            .filter(|(a, _, _)| a == all)
            .map(|(_, sel, meta)| (sel.as_str(), *meta))
            .collect::<Vec<_>>()
    };
    for owned in [
        "/api/v1/serviceaccounts",
        "/api/v1/services",
        "/api/v1/pods",
        DAEMON_SETS,
        "/apis/rbac.authorization.k8s.io/v1/roles",
        "/apis/rbac.authorization.k8s.io/v1/rolebindings",
        "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
    ] {
        let got = watched(owned);
        assert!(!got.is_empty(), "no watch of {owned}");
        assert!(got.iter().all(|(sel, _)| *sel == OWNED), "{owned}: {got:?}");
    }
    // The other operators' Leases, cluster-wide, by label.
    assert_eq!(
        watched(LEASES),
        [(
            "app.kubernetes.io/name=h3-ingress,app.kubernetes.io/component=operator",
            false
        )]
    );
    // The keys Secrets (operator's namespace) and the mirrors (hosts namespace): by label,
    // metadata only, each in its namespace.
    let namespaced: Vec<_> = w.watches.iter().filter(|x| x.all == SECRETS).collect();
    let mut spaces: Vec<(Option<&str>, &str, bool)> = namespaced
        .iter()
        .map(|x| (x.ns.as_deref(), x.selector.as_str(), x.metadata))
        .collect();
    spaces.sort();
    assert_eq!(
        spaces,
        [
            (None, "", true),
            (Some(NS), OWNED, true),
            (Some(HOSTS), OWNED, true)
        ]
    );
}

/// Waits (up to 15 s) until the listener's status says Ready=True.
async fn until_ready(world: &Mutex<World>) {
    for _ in 0..300 {
        {
            let w = world.lock().unwrap();
            let last = w.status_patches.last().map(|p| &p["status"]);
            if last.is_some_and(|s| ready(s).0 == Some("True")) {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let w = world.lock().unwrap();
    panic!(
        "not Ready within 15 s; status patches: {:#?}; unexpected: {:?}",
        w.status_patches, w.unexpected
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_elects_itself_reconciles_writes_status_and_releases_the_lease() {
    let (svc, handle) = tower_test::mock::pair::<Request<Body>, Response<RespBody>>();
    let client = Client::new(svc, "default");
    let world = Arc::new(Mutex::new(World::seeded()));
    tokio::spawn(api_server(handle, world.clone()));
    let admin = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin_addr = admin.local_addr().unwrap();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let opts = Options {
        namespace: NS.into(),
        leader_election: true,
        lease_name: "h3-ingress-operator".into(),
        data_plane_image: "ghcr.io/h3-ingress/h3-ingress:test".into(),
        hosts_namespace: HOSTS.into(),
        admin_address: admin_addr,
        crd_upgrade: true,
        controller_name: h3_ingress::api::DEFAULT_CONTROLLER_NAME.into(),
        // What the operator's --image-pull-secrets, --tune-image,
        // --data-plane-priority-class and --architectures give every data plane pod.
        pod_defaults: h3_ingress::operator::resources::PodDefaults {
            image_pull_secrets: vec!["regcred".into()],
            tune_image: "busybox@sha256:test".into(),
            priority_class_name: Some("h3-ingress-data-plane".into()),
            architectures: vec!["arm64".into()],
        },
    };
    let fetcher = Fetcher {
        world: world.clone(),
        seen: Mutex::default(),
    };
    let op = tokio::spawn(run_with(
        client,
        opts,
        Some(admin),
        Arc::new(fetcher),
        shutdown.clone(),
    ));

    // The pod loads the mirror one look after it is written: pending first, then served
    // after a prompt look. Then the settle looks and the reconcile of the DaemonSet's first
    // sight run out.
    until_ready(&world).await;
    tokio::time::sleep(Duration::from_secs(4)).await;

    let ready_z = http_get(admin_addr, "/readyz").await;
    assert!(ready_z.starts_with("HTTP/1.1 200"), "{ready_z}");
    assert_eq!(metric(admin_addr, "h3_ingress_operator_leader").await, 1);
    // Pending, then served: two writes, and none for the same status again.
    assert_eq!(
        metric(admin_addr, "h3_ingress_operator_status_writes_total").await,
        2
    );
    {
        let w = world.lock().unwrap();
        assert_watches(&w);
        let first = &w.status_patches[0]["status"];
        assert_eq!(
            ready(first),
            (Some("False"), Some("NoHostsServing")),
            "{first}"
        );
        assert_eq!(first["hosts"][0]["reason"], "ConfigPending", "{first}");
        let status = &w.status_patches[1]["status"];
        assert_eq!(
            ready(status),
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
            !w.applied.iter().any(|a| a.contains(CRDS)),
            "the served CRD is this binary's: not applied again"
        );
        assert!(
            w.events
                .iter()
                .any(|e| e["reason"] == "Http3Enabled" && e["regarding"]["kind"] == "Ingress"),
            "{:?}",
            w.events
        );
    }
    only_real_changes_trigger(admin_addr, &world).await;

    shutdown.cancel();
    let done = tokio::time::timeout(Duration::from_secs(10), op).await;
    assert!(matches!(done, Ok(Ok(Ok(())))), "{done:?}");
    finally_consistent(&world.lock().unwrap());
}

/// What the API server holds at the end: what the operator made, once, and the Lease given
/// back.
fn finally_consistent(w: &World) {
    assert!(
        w.unexpected.is_empty(),
        "unexpected requests: {:#?}",
        w.unexpected
    );
    let keys = w.get(&target(&format!(
        "/api/v1/namespaces/{NS}/secrets/h3-ingress-keys-public"
    )));
    assert_eq!(keys.unwrap()["immutable"], true);
    // Every object was applied once: its caches told the later reconciles it was there.
    let ds_applies = w
        .applied
        .iter()
        .filter(|a| a.starts_with("DaemonSet "))
        .count();
    assert_eq!(ds_applies, 1, "{:#?}", w.applied);
    let ds = w
        .get(&target(&format!(
            "/apis/apps/v1/namespaces/{NS}/daemonsets/h3-ingress-public"
        )))
        .unwrap();
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["imagePullSecrets"], json!([{"name": "regcred"}]));
    assert_eq!(pod["nodeSelector"], json!({"kubernetes.io/os": "linux"}));
    assert_eq!(pod["priorityClassName"], "h3-ingress-data-plane");
    // The Lease told the other operators this one's controller name.
    assert_eq!(
        w.lease_writes[0]["metadata"]["annotations"]["h3-ingress.dev/controller-name"],
        h3_ingress::api::DEFAULT_CONTROLLER_NAME
    );
    let terms = &pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"];
    assert_eq!(
        terms["nodeSelectorTerms"],
        json!([{"matchExpressions": [
            {"key": "kubernetes.io/arch", "operator": "In", "values": ["arm64"]}]}])
    );
    // Two mirror writes: the first, and the renewed certificate's.
    let mirrors = w
        .applied
        .iter()
        .filter(|a| a.contains(HOSTS) && a.starts_with("Secret "));
    assert_eq!(mirrors.count(), 2, "{:#?}", w.applied);
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

/// The CRD patches (server-side applies) the operator made.
fn crd_patches(w: &World) -> Vec<&String> {
    w.applied.iter().filter(|a| a.contains(CRDS)).collect()
}

/// Runs the operator (its own leader) on `world` until the first status patch, then stops it;
/// returns its last /metrics.
async fn first_status(world: &Arc<Mutex<World>>, crd_upgrade: bool) -> String {
    run_until(world, crd_upgrade, |w| !w.status_patches.is_empty()).await
}

/// Runs the operator (its own leader) on `world` until `done` (at most 10 s), then stops it;
/// returns its last /metrics.
async fn run_until(
    world: &Arc<Mutex<World>>,
    crd_upgrade: bool,
    done: impl Fn(&World) -> bool,
) -> String {
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
        hosts_namespace: HOSTS.into(),
        admin_address: admin_addr,
        pod_defaults: Default::default(),
        crd_upgrade,
        controller_name: h3_ingress::api::DEFAULT_CONTROLLER_NAME.into(),
    };
    let fetcher = Fetcher {
        world: world.clone(),
        seen: Mutex::default(),
    };
    let client = Client::new(svc, "default");
    let op = tokio::spawn(run_with(
        client,
        opts,
        Some(admin),
        Arc::new(fetcher),
        shutdown.clone(),
    ));
    for _ in 0..200 {
        if done(&world.lock().unwrap()) {
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
    let world = Arc::new(Mutex::new(World::with_crd(older_crd())));
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
    assert!(
        crd_patches(&w).is_empty(),
        "--no-crd-upgrade applied the CRD"
    );
    assert!(
        metrics.contains("h3_ingress_operator_crd_schema_revision{of=\"served\"} 0"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_crd_is_upgraded_by_the_operator_before_any_listener_sees_it() {
    let world = Arc::new(Mutex::new(World::with_crd(older_crd())));
    let metrics = first_status(&world, true).await;
    let w = world.lock().unwrap();
    assert_eq!(crd_patches(&w).len(), 1, "one server-side apply of the CRD");
    let applied = w.get(&target(&format!("{CRDS}/{CRD_NAME}"))).unwrap();
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
    let world = Arc::new(Mutex::new(World::with_crd(newer_crd())));
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
        crd_patches(&w).is_empty(),
        "an older operator must not apply its CRD over a newer one"
    );
}

/// The Ready condition of the stored listener `name`: (status, reason, message).
fn listener_ready(w: &World, name: &str) -> Option<(String, String, String)> {
    let l = w.get(&target(&format!("{LISTENERS}/{name}")))?;
    let c = l["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Ready")?;
    let text = |k: &str| c[k].as_str().unwrap_or_default().to_string();
    Some((text("status"), text("reason"), text("message")))
}

/// A later release's CRD adds a congestion controller and someone uses it on one listener;
/// then this (older) operator runs again, as after a `helm rollback`. It must read the list of
/// listeners (one object it cannot parse would fail the whole list, and no listener would be
/// reconciled), reconcile the other listener as usual, and mark that one InvalidSpec naming
/// the field, applying nothing for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_with_an_enum_value_from_a_newer_crd_is_invalid_alone() {
    let mut crd = newer_crd();
    let cc = "/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties/transport/properties/congestionControl/enum";
    crd.pointer_mut(cc)
        .unwrap()
        .as_array_mut()
        .unwrap()
        .push("l4s".into());
    let mut w = World::with_crd(crd);
    let mut future = listener();
    future["metadata"]["name"] = "future".into();
    future["metadata"]["uid"] = "5e1f0000-0000-4000-8000-000000000002".into();
    future["spec"] = json!({"ingressClassName": "other", "port": 8443,
        "metrics": {"address": "[::]:9478"},
        "upstream": {"address": "10.0.0.9:443"},
        "transport": {"congestionControl": "l4s"}});
    w.put(&target(&format!("{LISTENERS}/future")), future);
    let world = Arc::new(Mutex::new(w));
    run_until(&world, true, |w| {
        listener_ready(w, "future").is_some()
            && listener_ready(w, "public").is_some_and(|(s, _, _)| s == "True")
    })
    .await;
    let w = world.lock().unwrap();
    let (status, reason, _) = listener_ready(&w, "public").expect("public reconciled");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "AllHostsServing")
    );
    let (status, reason, message) = listener_ready(&w, "future").expect("future reconciled");
    assert_eq!((status.as_str(), reason.as_str()), ("False", "InvalidSpec"));
    assert!(
        message.contains(
            "spec.transport.congestionControl: \"l4s\" is not a value this h3-ingress knows"
        ),
        "{message}"
    );
    assert!(w
        .applied
        .iter()
        .any(|a| a.ends_with("/daemonsets/h3-ingress-public")));
    assert!(
        !w.applied.iter().any(|a| a.contains("future")),
        "nothing applied for the invalid listener: {:#?}",
        w.applied
    );
}
