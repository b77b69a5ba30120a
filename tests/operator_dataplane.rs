//! The data plane's Kubernetes source end to end against a mock API server that speaks the
//! list + streaming watch protocol: the listener and its certificate mirrors in,
//! `ProxyConfig`s out on the channel. The source opens exactly two watches (the listener by
//! name, the mirrors by label and type in the hosts namespace) and asks for nothing else: no
//! Ingress, no Gateway API kind, no Secret elsewhere. A new mirror adds its hosts, a rotated
//! one swaps the certificate, a deleted one removes its hosts, a broken one is a failure while
//! the others serve, an unchanged resourceVersion is not parsed again (not even on a relist),
//! and when the API server goes away nothing is sent, so the proxy keeps its last good
//! configuration. Then the same source driving the real proxy, as `proxy --listener` runs it:
//! live certificate rotation, the digest on `/status`, `/hosts`, and an invalid spec counted as
//! an invalid reload exactly like a bad file in standalone mode.

mod support;

use std::collections::BTreeMap;
use std::convert::Infallible;
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
use tokio::sync::mpsc;

use h3_ingress::api::mirror;
use h3_ingress::config::ProxyConfig;
use h3_ingress::proxy::source::kube::watch_listener;
use h3_ingress::proxy::ConfigUpdate;

type RespBody = UnsyncBoxBody<Bytes, Infallible>;
type Handle = tower_test::mock::Handle<Request<Body>, Response<RespBody>>;

const NS: &str = "h3-hosts";
const LISTENERS: &str = "/apis/h3-ingress.dev/v1alpha1/http3listeners";
const MIRRORS: &str = "/api/v1/namespaces/h3-hosts/secrets";

fn full(v: Value) -> RespBody {
    http_body_util::Full::new(Bytes::from(serde_json::to_vec(&v).unwrap()))
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

fn listener() -> Value {
    json!({"apiVersion": "h3-ingress.dev/v1alpha1", "kind": "Http3Listener",
           "metadata": {"name": "public", "resourceVersion": "1", "uid": "u1", "generation": 1},
           "spec": {"ingressClassName": "nginx", "upstream": {"address": "10.0.0.1:443"}}})
}

/// A certificate and key for `names`, with the leaf's SHA-256.
struct Cert {
    cert: String,
    key: String,
    sha: String,
}

fn cert(names: &[&str]) -> Cert {
    let ck =
        rcgen::generate_simple_self_signed(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .unwrap();
    let sha = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(ck.cert.der().as_ref() as &[u8]))
    };
    Cert {
        cert: ck.cert.pem(),
        key: ck.signing_key.serialize_pem(),
        sha,
    }
}

/// The mirror Secret `name` (resourceVersion `rv`) serving `hosts` with `c`.
fn mirror_secret(name: &str, rv: &str, c: &Cert, hosts: &[&str]) -> Value {
    let doc = json!({"hosts": hosts.iter().map(|h| json!({"name": h, "source": format!("Ingress shop/{name}")})).collect::<Vec<_>>()});
    mirror_secret_with(name, rv, c, &doc)
}

/// The mirror Secret `name` with `doc` as its `hosts.json`.
fn mirror_secret_with(name: &str, rv: &str, c: &Cert, doc: &Value) -> Value {
    use base64_free::encode;
    json!({"apiVersion": "v1", "kind": "Secret", "type": mirror::SECRET_TYPE,
           "metadata": {"name": name, "namespace": NS, "resourceVersion": rv,
                        "labels": {mirror::LISTENER_LABEL: "public"},
                        "annotations": {mirror::SOURCE_ANNOTATION: format!("shop/{name}-tls"),
                                        "kubectl.kubernetes.io/last-applied-configuration": "{}"},
                        "managedFields": [{"manager": "h3-ingress-operator", "operation": "Apply"}]},
           "data": {mirror::CERT_KEY: encode(c.cert.as_bytes()),
                    mirror::KEY_KEY: encode(c.key.as_bytes()),
                    mirror::HOSTS_KEY: encode(doc.to_string().as_bytes())}})
}

/// Standard base64 without pulling a crate in for one test.
mod base64_free {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    pub fn encode(b: &[u8]) -> String {
        let mut s = String::new();
        for c in b.chunks(3) {
            let n = (c[0] as u32) << 16
                | (*c.get(1).unwrap_or(&0) as u32) << 8
                | *c.get(2).unwrap_or(&0) as u32;
            for i in 0..4 {
                if i <= c.len() {
                    s.push(T[(n >> (18 - 6 * i) & 63) as usize] as char);
                } else {
                    s.push('=');
                }
            }
        }
        s
    }
}

fn event(kind: &str, obj: &Value) -> Bytes {
    let mut line = serde_json::to_vec(&json!({"type": kind, "object": obj})).unwrap();
    line.push(b'\n');
    Bytes::from(line)
}

#[derive(Default)]
struct World {
    /// The mirrors to list, by name.
    mirrors: BTreeMap<String, Value>,
    /// The listener to list (the default one when unset).
    listener: Option<Value>,
    /// Open watch streams per collection path.
    watches: BTreeMap<String, mpsc::UnboundedSender<Bytes>>,
    /// Every request, as `path?query`.
    requests: Vec<String>,
    down: bool,
}

fn status(code: u16, reason: &str) -> Response<RespBody> {
    Response::builder()
        .status(code)
        .body(full(
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
                          "status": "Failure", "reason": reason, "code": code,
                          "message": reason}),
        ))
        .unwrap()
}

fn query_param<'a>(query: &'a str, key: &str) -> Option<&'a str> {
    query
        .split('&')
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
}

async fn api_server(mut handle: Handle, world: Arc<Mutex<World>>) {
    while let Some((req, send)) = handle.next_request().await {
        let path = req.uri().path().to_string();
        let query = req.uri().query().unwrap_or_default().to_string();
        let watch = query.contains("watch=true");
        let mut w = world.lock().unwrap();
        w.requests.push(format!("{path}?{query}"));
        if w.down {
            send.send_response(status(503, "ServiceUnavailable"));
            continue;
        }
        let items: Vec<Value> = match path.as_str() {
            LISTENERS => vec![w.listener.clone().unwrap_or_else(listener)],
            MIRRORS => w.mirrors.values().cloned().collect(),
            // Anything else is a request the source must not make; the test fails on it.
            _ => {
                send.send_response(status(404, "NotFound"));
                continue;
            }
        };
        let body = if watch {
            let (tx, rx) = mpsc::unbounded_channel();
            w.watches.insert(path, tx);
            streaming(rx)
        } else {
            full(
                json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": "1"}, "items": items}),
            )
        };
        send.send_response(Response::builder().status(200).body(body).unwrap());
    }
}

/// Every request the source made asks for exactly the listener by name or the mirrors by
/// label and type: two collections, nothing else.
fn assert_only_the_two_watches(world: &Arc<Mutex<World>>) {
    let requests = world.lock().unwrap().requests.clone();
    assert!(!requests.is_empty());
    for r in &requests {
        let (path, query) = r.split_once('?').unwrap();
        match path {
            LISTENERS => assert_eq!(
                query_param(query, "fieldSelector"),
                Some("metadata.name%3Dpublic"),
                "{r}"
            ),
            MIRRORS => {
                assert_eq!(
                    query_param(query, "labelSelector"),
                    Some("h3-ingress.dev%2Flistener%3Dpublic"),
                    "{r}"
                );
                assert_eq!(
                    query_param(query, "fieldSelector"),
                    Some("type%3Dh3-ingress.dev%2Fhost-certificate"),
                    "{r}"
                );
            }
            _ => panic!("the source asked for something else than its two watches: {r}"),
        }
    }
    let watched: std::collections::BTreeSet<&str> = requests
        .iter()
        .filter(|r| r.contains("watch=true"))
        .map(|r| r.split_once('?').unwrap().0)
        .collect();
    assert_eq!(watched, [MIRRORS, LISTENERS].into_iter().collect());
}

async fn next(rx: &mut mpsc::Receiver<ConfigUpdate>, what: &str) -> ProxyConfig {
    let update = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .unwrap_or_else(|_| panic!("no config for: {what}"))
        .expect("sender alive");
    match update {
        ConfigUpdate::Apply(c) => *c,
        ConfigUpdate::Invalid(why) => panic!("{what}: rejected: {why}"),
    }
}

/// Nothing is sent for `secs` seconds.
async fn quiet(rx: &mut mpsc::Receiver<ConfigUpdate>, secs: u64, what: &str) {
    let got = tokio::time::timeout(Duration::from_secs(secs), rx.recv()).await;
    assert!(got.is_err(), "{what}: {:?}", got.unwrap());
}

async fn wait_for_watch(world: &Arc<Mutex<World>>, key: &str) -> mpsc::UnboundedSender<Bytes> {
    for _ in 0..200 {
        if let Some(tx) = world.lock().unwrap().watches.get(key) {
            return tx.clone();
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("no watch on {key}");
}

fn leaf(c: &ProxyConfig, host: &str) -> String {
    c.hosts.lookup(host).unwrap().leaf_sha256.clone()
}

fn digest_of(pairs: &[(&str, &str)]) -> String {
    mirror::digest(pairs.iter().copied())
}

type Source = tokio::task::JoinHandle<Result<(), h3_ingress::proxy::source::kube::WatchError>>;

/// A source against a mock API server whose mirrors are `mirrors`.
fn start_source(
    mirrors: &[(&str, Value)],
) -> (Arc<Mutex<World>>, mpsc::Receiver<ConfigUpdate>, Source) {
    start_source_with(None, mirrors)
}

/// [`start_source`] with `listener` as the listener (the default one when `None`).
fn start_source_with(
    listener: Option<Value>,
    mirrors: &[(&str, Value)],
) -> (Arc<Mutex<World>>, mpsc::Receiver<ConfigUpdate>, Source) {
    let (svc, handle) = tower_test::mock::pair::<Request<Body>, Response<RespBody>>();
    let client = Client::new(svc, "default");
    let world = Arc::new(Mutex::new(World::default()));
    {
        let mut w = world.lock().unwrap();
        w.listener = listener;
        for (name, m) in mirrors {
            w.mirrors.insert(name.to_string(), m.clone());
        }
    }
    tokio::spawn(api_server(handle, world.clone()));
    let (tx, rx) = mpsc::channel(4);
    let (prober, _) = tokio::sync::watch::channel(false);
    let source = tokio::spawn(watch_listener(
        client,
        "public".into(),
        NS.into(),
        None,
        tx,
        prober,
    ));
    (world, rx, source)
}

#[tokio::test]
async fn mirrors_in_configs_out_and_nothing_else_is_asked_for() {
    let (ca, cb) = (cert(&["a.example.com"]), cert(&["b.example.com"]));
    let (world, mut rx, source) = start_source(&[
        ("m-a", mirror_secret("m-a", "10", &ca, &["a.example.com"])),
        ("m-b", mirror_secret("m-b", "11", &cb, &["b.example.com"])),
    ]);

    // 1. The first configuration: both mirrors, and what was applied is their digest.
    let c1 = next(&mut rx, "initial mirrors").await;
    assert_eq!(c1.listen.port, 443);
    assert_eq!(c1.upstream.address.to_string(), "10.0.0.1:443");
    assert_eq!(leaf(&c1, "a.example.com"), ca.sha);
    assert_eq!(leaf(&c1, "b.example.com"), cb.sha);
    let a = c1.hosts.lookup("a.example.com").unwrap();
    assert_eq!(
        (a.secret.as_deref(), a.source.as_str()),
        (Some("shop/m-a-tls"), "Ingress shop/m-a")
    );
    let r = c1.mirrors.as_ref().unwrap();
    assert_eq!((r.synced, r.count, r.failed_count), (true, 2, 0));
    assert_eq!(r.digest, digest_of(&[("m-a", "10"), ("m-b", "11")]));
    let mirrors = wait_for_watch(&world, MIRRORS).await;

    // 2. A new mirror adds its hosts.
    let cc = cert(&["c.example.com", "d.example.com"]);
    let m_c = mirror_secret("m-c", "12", &cc, &["c.example.com", "d.example.com"]);
    mirrors.send(event("ADDED", &m_c)).unwrap();
    let c2 = next(&mut rx, "new mirror").await;
    assert_eq!(leaf(&c2, "d.example.com"), cc.sha);
    assert_eq!(c2.hosts.len(), 4);

    // 3. A rotated mirror (a new resourceVersion) swaps the certificate.
    let ca2 = cert(&["a.example.com"]);
    mirrors
        .send(event(
            "MODIFIED",
            &mirror_secret("m-a", "13", &ca2, &["a.example.com"]),
        ))
        .unwrap();
    let c3 = next(&mut rx, "rotated mirror").await;
    assert_eq!(leaf(&c3, "a.example.com"), ca2.sha);
    assert_eq!(leaf(&c3, "b.example.com"), cb.sha);

    // 4. The same resourceVersion again (even with other bytes, which the API server never
    //    sends) is not parsed again: nothing is sent.
    let other = cert(&["a.example.com"]);
    mirrors
        .send(event(
            "MODIFIED",
            &mirror_secret("m-a", "13", &other, &["a.example.com"]),
        ))
        .unwrap();
    quiet(&mut rx, 1, "an unchanged resourceVersion").await;

    // 5. A deleted mirror removes its hosts.
    mirrors.send(event("DELETED", &m_c)).unwrap();
    let c5 = next(&mut rx, "deleted mirror").await;
    assert!(c5.hosts.lookup("c.example.com").is_none());
    assert_eq!(c5.hosts.len(), 2);
    assert_eq!(
        c5.mirrors.unwrap().digest,
        digest_of(&[("m-a", "13"), ("m-b", "11")])
    );
    assert_only_the_two_watches(&world);
    drop(mirrors);
    continue_when_broken_or_gone(world, rx, source, ca2.sha).await;
}

/// The next update, which must be a rejection; its reason.
async fn rejected(rx: &mut mpsc::Receiver<ConfigUpdate>, what: &str) -> String {
    let update = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .unwrap_or_else(|_| panic!("nothing sent for: {what}"))
        .expect("sender alive");
    match update {
        ConfigUpdate::Invalid(why) => why,
        ConfigUpdate::Apply(_) => panic!("{what}: a configuration was sent"),
    }
}

/// The listener with `transport.congestionControl` set, as version `n` of its spec.
fn listener_with_controller(controller: &str, n: u64) -> Value {
    let mut l = listener();
    l["metadata"]["resourceVersion"] = n.to_string().into();
    l["metadata"]["generation"] = n.into();
    l["spec"]["transport"] = json!({"congestionControl": controller});
    l
}

/// A listener whose spec has an enum value this binary does not know (a newer CRD's, after
/// a rollback) is read, not a failed watch: the source reports which field, once, and sends
/// no configuration, so the proxy keeps serving its last good one; a pod that starts on such
/// a spec reports the same instead of waiting for a listener it cannot parse; a fixed spec
/// is served.
#[tokio::test]
async fn an_unknown_enum_value_keeps_the_last_good_configuration_and_names_the_field() {
    let ca = cert(&["a.example.com"]);
    let m_a = mirror_secret("m-a", "10", &ca, &["a.example.com"]);
    let (world, mut rx, _source) = start_source(&[("m-a", m_a.clone())]);
    next(&mut rx, "the good listener").await;
    let listeners = wait_for_watch(&world, LISTENERS).await;
    listeners
        .send(event("MODIFIED", &listener_with_controller("l4s", 2)))
        .unwrap();
    let why = rejected(&mut rx, "an unknown congestion controller").await;
    assert!(
        why.contains(
            "spec.transport.congestionControl: \"l4s\" is not a value this h3-ingress knows"
        ),
        "{why}"
    );
    quiet(&mut rx, 1, "the same rejection again").await;
    listeners
        .send(event("MODIFIED", &listener_with_controller("bbr", 3)))
        .unwrap();
    let fixed = next(&mut rx, "the fixed listener").await;
    assert_eq!(
        fixed.transport.congestion_control,
        h3_ingress::api::CongestionControl::Bbr
    );

    let (_world, mut rx, _source) =
        start_source_with(Some(listener_with_controller("l4s", 2)), &[("m-a", m_a)]);
    let why = rejected(&mut rx, "a pod starting on the unknown value").await;
    assert!(why.contains("spec.transport.congestionControl"), "{why}");
}

/// The second half of the test above: a broken mirror, a relist, the API server gone.
async fn continue_when_broken_or_gone(
    world: Arc<Mutex<World>>,
    mut rx: mpsc::Receiver<ConfigUpdate>,
    source: Source,
    a_sha: String,
) {
    // 6. A broken mirror (its key belongs to another certificate) is a failure; the others
    //    still serve.
    let mut broken = cert(&["e.example.com"]);
    broken.key = cert(&["e.example.com"]).key;
    wait_for_watch(&world, MIRRORS)
        .await
        .send(event(
            "ADDED",
            &mirror_secret("m-e", "14", &broken, &["e.example.com"]),
        ))
        .unwrap();
    let c6 = next(&mut rx, "broken mirror").await;
    assert!(c6.hosts.lookup("e.example.com").is_none());
    assert_eq!(leaf(&c6, "a.example.com"), a_sha);
    let r = c6.mirrors.unwrap();
    assert_eq!((r.count, r.failed_count), (3, 1));
    assert_eq!(r.failed[0].mirror, "m-e");
    assert_eq!(r.failed[0].reason, "CertificateInvalid");
    assert_eq!(c6.host_reports[0].name, "e.example.com");

    // 7. The mirrors' watch expires (410 Gone): the source lists them again. The list carries
    //    the same resourceVersions (with other bytes under m-a's), so nothing is parsed or
    //    sent.
    let lists = |w: &World| {
        let is_list = |r: &&String| r.starts_with(MIRRORS) && !r.contains("watch=true");
        w.requests.iter().filter(is_list).count()
    };
    let lists_before = {
        let mut w = world.lock().unwrap();
        let other = cert(&["a.example.com"]);
        w.mirrors.clear();
        for (name, rv, c, h) in [
            ("m-a", "13", &other, "a.example.com"),
            ("m-b", "11", &cert(&["b.example.com"]), "b.example.com"),
            ("m-e", "14", &broken, "e.example.com"),
        ] {
            w.mirrors
                .insert(name.into(), mirror_secret(name, rv, c, &[h]));
        }
        lists(&w)
    };
    let gone = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                      "reason": "Expired", "code": 410, "message": "too old resource version"});
    let expired = wait_for_watch(&world, MIRRORS).await;
    expired.send(event("ERROR", &gone)).unwrap();
    drop(expired);
    for _ in 0..200 {
        if lists(&world.lock().unwrap()) > lists_before {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(lists(&world.lock().unwrap()) > lists_before, "no relist");
    quiet(&mut rx, 1, "a relist with the same resourceVersions").await;

    // 8. The API server goes away: streams end, every request fails. Nothing is sent, so the
    //    proxy keeps its configuration; the source keeps retrying instead of giving up.
    {
        let mut w = world.lock().unwrap();
        w.down = true;
        w.watches.clear();
    }
    quiet(
        &mut rx,
        4,
        "a config was sent while the API server was down",
    )
    .await;
    assert!(!source.is_finished(), "the source gave up");
    assert_only_the_two_watches(&world);

    // 9. The proxy shutting down (receiver dropped) ends the source cleanly.
    drop(rx);
    let done = tokio::time::timeout(Duration::from_secs(5), source).await;
    assert!(matches!(done, Ok(Ok(Ok(())))), "{done:?}");
}

/// No mirror yet (a listener without hosts, or RBAC not granted yet): no configuration at
/// all until the list completes; an empty list is a configuration with no host.
#[tokio::test]
async fn the_first_configuration_waits_for_the_complete_list() {
    let (world, mut rx, _source) = start_source(&[]);
    let c = next(&mut rx, "an empty list").await;
    assert!(c.hosts.is_empty());
    assert_eq!(c.mirrors.unwrap().digest, digest_of(&[]));
    assert_only_the_two_watches(&world);
}

// ---------------------------------------------------------------------------------------------
// The same source driving the real data plane through `kube_with`, the code `proxy --listener`
// runs: a certificate rotated in a mirror is served to new connections while a connection
// opened before the swap keeps working on its old one; a broken spec is counted.

mod live {
    use super::*;
    use h3_ingress::proxy::run::{kube_with, KubeSource};
    use h3_ingress::proxy::RunningProxy;
    use std::net::SocketAddr;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::task::JoinHandle;
    use tokio_util::sync::CancellationToken;

    struct H3 {
        conn: quinn::Connection,
        send: h3::client::SendRequest<h3_quinn::OpenStreams, Bytes>,
        _driver: tokio::task::JoinHandle<()>,
    }

    impl H3 {
        async fn connect(ep: &quinn::Endpoint, addr: SocketAddr, host: &str) -> H3 {
            let conn = ep
                .connect(addr, host)
                .unwrap()
                .await
                .expect("QUIC handshake");
            let (mut driver, send) = h3::client::new(h3_quinn::Connection::new(conn.clone()))
                .await
                .expect("HTTP/3 setup");
            let driver = tokio::spawn(async move {
                let _ = std::future::poll_fn(|cx| driver.poll_close(cx)).await;
            });
            H3 {
                conn,
                send,
                _driver: driver,
            }
        }

        fn served_cert_sha256(&self) -> String {
            use sha2::Digest;
            let certs = self
                .conn
                .peer_identity()
                .unwrap()
                .downcast::<Vec<rustls::pki_types::CertificateDer<'static>>>()
                .unwrap();
            hex::encode(sha2::Sha256::digest(certs[0].as_ref()))
        }

        async fn get(&mut self, host: &str) -> (u16, String) {
            let (status, body) = self.get_path(host, "/").await;
            (status, body.expect("the whole body"))
        }

        /// Status and body of `path`; `Err` when the stream was reset mid-body.
        async fn get_path(&mut self, host: &str, path: &str) -> (u16, Result<String, String>) {
            self.get_path_fin_after(host, path, Duration::ZERO).await
        }

        /// As [`Self::get_path`], with the request stream's FIN sent `fin_after` after the
        /// HEADERS (in a later packet, as some clients send it).
        async fn get_path_fin_after(
            &mut self,
            host: &str,
            path: &str,
            fin_after: Duration,
        ) -> (u16, Result<String, String>) {
            let req = http::Request::get(format!("https://{host}{path}"))
                .body(())
                .unwrap();
            let mut s = self.send.send_request(req).await.expect("request");
            if !fin_after.is_zero() {
                tokio::time::sleep(fin_after).await;
            }
            s.finish().await.unwrap();
            let resp = s.recv_response().await.expect("response");
            let mut body = Vec::new();
            loop {
                match s.recv_data().await {
                    Ok(Some(chunk)) => {
                        use bytes::Buf;
                        body.extend_from_slice(chunk.chunk());
                    }
                    Ok(None) => break,
                    Err(e) => return (resp.status().as_u16(), Err(e.to_string())),
                }
            }
            let body = String::from_utf8_lossy(&body).into_owned();
            (resp.status().as_u16(), Ok(body))
        }
    }

    /// A plain-HTTP stand-in for the TCP ingress.
    async fn upstream() -> SocketAddr {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let (s, _) = l.accept().await.unwrap();
                tokio::spawn(answer(s));
            }
        });
        addr
    }

    /// A TLS stand-in for the TCP ingress that presents `c` (HTTP/1.1, no ALPN).
    async fn tls_upstream(c: &Cert) -> SocketAddr {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let chain = vec![CertificateDer::from_pem_slice(c.cert.as_bytes()).unwrap()];
        let key = PrivateKeyDer::from_pem_slice(c.key.as_bytes()).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let (s, _) = l.accept().await.unwrap();
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    // A refused handshake is the proxy's verdict, seen as its 502.
                    if let Ok(s) = acceptor.accept(s).await {
                        answer(s).await;
                    }
                });
            }
        });
        addr
    }

    /// Answers every request on `io` with a fixed body.
    async fn answer<S>(io: S)
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let svc = hyper::service::service_fn(|_req| async {
            Ok::<_, Infallible>(hyper::Response::new(http_body_util::Full::new(
                Bytes::from_static(b"from the TCP ingress"),
            )))
        });
        let _ = hyper::server::conn::http1::Builder::new()
            .serve_connection(hyper_util::rt::TokioIo::new(io), svc)
            .await;
    }

    fn free_udp_port() -> u16 {
        std::net::UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    /// The proxy of `proxy --listener public` against the mock API server, serving a.test
    /// with the certificate of Secret web-tls (returned with its SHA-256).
    struct Running {
        proxy: RunningProxy,
        world: Arc<Mutex<World>>,
        listener: Value,
        sha1: String,
        shutdown: CancellationToken,
        task: JoinHandle<Result<(), h3_ingress::proxy::run::RunError>>,
    }

    async fn start() -> Running {
        let up = upstream().await;
        let c1 = cert(&["a.example.com"]);
        let m = mirror_secret("m-a", "10", &c1, &["a.example.com"]);
        start_with(up, json!({}), vec![m], c1.sha).await
    }

    /// The proxy forwarding to `up` with the listener's `upstream` fields merged with
    /// `upstream_extra`, serving `mirrors`; `sha1` is what `Running::sha1` remembers.
    async fn start_with(
        up: SocketAddr,
        upstream_extra: Value,
        mirrors: Vec<Value>,
        sha1: String,
    ) -> Running {
        let mut upstream = json!({"address": up.to_string(), "tls": false});
        for (k, v) in upstream_extra.as_object().unwrap() {
            upstream[k] = v.clone();
        }
        launch_all(upstream, mirrors, sha1).await
    }

    /// The proxy with `upstream` as the listener's `spec.upstream` and `mirror` (serving a
    /// certificate whose leaf has the SHA-256 `sha1`) as its only mirror.
    async fn launch(upstream: Value, mirror: Value, sha1: String) -> Running {
        launch_all(upstream, vec![mirror], sha1).await
    }

    async fn launch_all(upstream: Value, mirrors: Vec<Value>, sha1: String) -> Running {
        launch_spec(upstream, json!({}), mirrors, sha1).await
    }

    /// This data plane's pod name, as the downward API gives it.
    const POD: &str = "dp-a";

    /// As [`launch_all`], with `spec_extra`'s fields added to the listener's spec.
    async fn launch_spec(
        upstream: Value,
        spec_extra: Value,
        mirrors: Vec<Value>,
        sha1: String,
    ) -> Running {
        let port = free_udp_port();
        let mut l = listener();
        l["spec"] = json!({
            "ingressClassName": "nginx",
            "port": port,
            "addresses": {"ipv4": "127.0.0.1", "ipv6": null},
            "upstream": upstream,
            "metrics": {"address": "127.0.0.1:0"}
        });
        for (k, v) in spec_extra.as_object().unwrap() {
            l["spec"][k] = v.clone();
        }
        let (svc, handle) = tower_test::mock::pair::<Request<Body>, Response<RespBody>>();
        let world = Arc::new(Mutex::new(World::default()));
        {
            let mut w = world.lock().unwrap();
            for m in mirrors {
                let name = m["metadata"]["name"].as_str().unwrap().to_string();
                w.mirrors.insert(name, m);
            }
            w.listener = Some(l.clone());
        }
        tokio::spawn(api_server(handle, world.clone()));
        let shutdown = CancellationToken::new();
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let client = Client::new(svc, "default");
        let source = KubeSource {
            listener: "public".into(),
            hosts_namespace: NS.into(),
            pod: Some(POD.into()),
        };
        let task = tokio::spawn(kube_with(client, source, shutdown.clone(), Some(ready_tx)));
        let proxy = tokio::time::timeout(Duration::from_secs(10), ready_rx)
            .await
            .expect("the proxy starts on the first configuration")
            .unwrap();
        assert_eq!(
            Some(u64::from(proxy.udp_addrs[0].port())),
            l["spec"]["port"].as_u64()
        );
        Running {
            proxy,
            world,
            listener: l,
            sha1,
            shutdown,
            task,
        }
    }

    impl Running {
        async fn stop(self) {
            self.shutdown.cancel();
            let done = tokio::time::timeout(Duration::from_secs(40), self.task).await;
            assert!(matches!(done, Ok(Ok(Ok(())))), "{done:?}");
        }

        /// The body the admin endpoint serves on `path`.
        async fn admin(&self, path: &str) -> String {
            let mut s = tokio::net::TcpStream::connect(self.proxy.admin_addr)
                .await
                .unwrap();
            let req = format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
            s.write_all(req.as_bytes()).await.unwrap();
            let mut text = String::new();
            s.read_to_string(&mut text).await.unwrap();
            let (head, body) = text.split_once("\r\n\r\n").unwrap();
            assert!(head.starts_with("HTTP/1.1 200"), "{path}: {head}");
            body.to_string()
        }

        /// `h3_ingress_config_reloads_total{result}` as the admin endpoint serves it.
        async fn reloads(&self, result: &str) -> u64 {
            let text = self.admin("/metrics").await;
            let series = format!("h3_ingress_config_reloads_total{{result=\"{result}\"}} ");
            let line = text.lines().find(|l| l.starts_with(&series));
            line.map_or(0, |l| l[series.len()..].parse().unwrap())
        }

        /// Waits until the `result` count reaches `want` (and checks it goes no further).
        async fn wait_reloads(&self, result: &str, want: u64) {
            for _ in 0..200 {
                if self.reloads(result).await >= want {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            assert_eq!(
                self.reloads(result).await,
                want,
                "reloads{{result={result}}}"
            );
        }

        /// A status write: a new resourceVersion, the spec of `generation` unchanged.
        async fn write_status(&self, generation: i64, address: &str) {
            let mut l = self.listener.clone();
            l["metadata"]["generation"] = json!(generation);
            l["metadata"]["resourceVersion"] = json!(format!("{}", 200 + generation));
            l["spec"]["upstream"]["address"] = json!(address);
            l["status"] = json!({"hostsSummary": "1/1"});
            wait_for_watch(&self.world, LISTENERS)
                .await
                .send(event("MODIFIED", &l))
                .unwrap();
        }

        /// A status write that names `prober` (or no pod) to probe for Alt-Svc.
        async fn name_prober(&self, prober: Option<&str>, version: u64) {
            let mut l = self.listener.clone();
            l["metadata"]["resourceVersion"] = json!(format!("{}", 300 + version));
            l["status"] = json!({"altSvcProber": prober});
            wait_for_watch(&self.world, LISTENERS)
                .await
                .send(event("MODIFIED", &l))
                .unwrap();
        }

        async fn modify_listener(&self, generation: i64, address: &str) {
            let mut l = self.listener.clone();
            l["metadata"]["generation"] = json!(generation);
            l["metadata"]["resourceVersion"] = json!(format!("{}", 100 + generation));
            l["spec"]["upstream"]["address"] = json!(address);
            wait_for_watch(&self.world, LISTENERS)
                .await
                .send(event("MODIFIED", &l))
                .unwrap();
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_running_proxy_serves_a_rotated_certificate_without_dropping_an_open_connection() {
        let r = start().await;
        let addr = r.proxy.udp_addrs[0];
        let ep = crate::support::quic::any_certificate_client();
        let mut before = H3::connect(&ep, addr, "a.example.com").await;
        assert_eq!(before.served_cert_sha256(), r.sha1);
        assert_eq!(
            before.get("a.example.com").await,
            (200, "from the TCP ingress".to_string())
        );

        // The status says which mirrors are applied.
        let status: Value = serde_json::from_str(&r.admin("/status").await).unwrap();
        assert_eq!(status["mirrors"]["digest"], digest_of(&[("m-a", "10")]));
        assert_eq!(status["hostsLoaded"], 1);
        assert!(status.get("hosts").is_none(), "{status}");

        // Rotate the certificate in the mirror.
        let c2 = cert(&["a.example.com"]);
        let sha2 = c2.sha.clone();
        wait_for_watch(&r.world, MIRRORS)
            .await
            .send(event(
                "MODIFIED",
                &mirror_secret("m-a", "11", &c2, &["a.example.com"]),
            ))
            .unwrap();

        // New connections get the new certificate (no restart, same sockets)...
        let mut served = String::new();
        for _ in 0..100 {
            let c = H3::connect(&ep, addr, "a.example.com").await;
            served = c.served_cert_sha256();
            if served == sha2 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(served, sha2, "the rotated certificate was never served");

        // ...while the connection opened before the swap is still alive and still answers.
        assert!(
            before.conn.close_reason().is_none(),
            "{:?}",
            before.conn.close_reason()
        );
        assert_eq!(
            before.get("a.example.com").await,
            (200, "from the TCP ingress".to_string())
        );
        assert_eq!(before.served_cert_sha256(), r.sha1);
        r.wait_reloads("applied", 1).await;
        let status: Value = serde_json::from_str(&r.admin("/status").await).unwrap();
        assert_eq!(status["mirrors"]["digest"], digest_of(&[("m-a", "11")]));
        // /hosts: the host, where it comes from, its requests.
        let hosts: Value = serde_json::from_str(&r.admin("/hosts").await).unwrap();
        let a = &hosts[0];
        assert_eq!(
            (&a["name"], &a["state"], &a["secret"], &a["source"]),
            (
                &json!("a.example.com"),
                &json!("Serving"),
                &json!("shop/m-a-tls"),
                &json!("Ingress shop/m-a")
            ),
            "{hosts}"
        );
        assert_eq!(a["requests"], 2, "{hosts}");
        r.stop().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_invalid_spec_is_counted_as_an_invalid_reload_like_a_bad_file() {
        let r = start().await;
        assert_eq!(r.reloads("invalid").await, 0);

        // The spec breaks: one invalid reload, and the proxy keeps serving.
        r.modify_listener(2, "x").await;
        r.wait_reloads("invalid", 1).await;
        let ep = crate::support::quic::any_certificate_client();
        let mut h3 = H3::connect(&ep, r.proxy.udp_addrs[0], "a.example.com").await;
        assert_eq!(h3.get("a.example.com").await.0, 200);

        // Re-evaluating the same broken spec (the operator writing the listener's status: a
        // new resourceVersion, the same generation) counts nothing; a new broken version of
        // the spec counts again, as a second bad SIGHUP would.
        r.write_status(2, "x").await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(r.reloads("invalid").await, 1);
        r.modify_listener(3, "y").await;
        r.wait_reloads("invalid", 2).await;

        // Fixed again: the configuration equals the running one, so nothing is applied.
        let up = r.listener["spec"]["upstream"]["address"].as_str().unwrap();
        r.modify_listener(4, up).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(r.reloads("invalid").await, 2);
        assert_eq!(r.reloads("applied").await, 0);
        assert_eq!(h3.get("a.example.com").await.0, 200);
        r.stop().await;
    }

    /// A stand-in for the TCP ingress that waits before it answers (`/wait/MS`) or sends one
    /// body chunk, waits, then the rest (`/stall/MS`).
    async fn slow_upstream() -> SocketAddr {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let (s, _) = l.accept().await.unwrap();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(|req: http::Request<_>| async move {
                        let path = req.uri().path().to_string();
                        let ms = |prefix: &str| {
                            path.strip_prefix(prefix)
                                .and_then(|n| n.parse::<u64>().ok())
                        };
                        let (tx, rx) = mpsc::unbounded_channel::<Bytes>();
                        if let Some(ms) = ms("/wait/") {
                            tokio::time::sleep(Duration::from_millis(ms)).await;
                            tx.send(Bytes::from_static(b"waited")).unwrap();
                        } else if let Some(ms) = ms("/stall/") {
                            tx.send(Bytes::from_static(b"first ")).unwrap();
                            tokio::spawn(async move {
                                tokio::time::sleep(Duration::from_millis(ms)).await;
                                let _ = tx.send(Bytes::from_static(b"last"));
                            });
                        }
                        Ok::<_, Infallible>(hyper::Response::new(streaming(rx)))
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(s), svc)
                        .await;
                });
            }
        });
        addr
    }

    /// A host whose mirror carries its own timeouts gets them; the others get the listener's.
    /// Scaled down from the case that motivates it (a host with a 600 s read timeout behind a
    /// 60 s listener): the listener allows 1 s for the response and 1 s of body silence,
    /// slow.example.com 3 s each, and the upstream takes 2 s.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_host_with_its_own_timeouts_outlasts_the_listeners() {
        let up = slow_upstream().await;
        let c = cert(&["a.example.com", "slow.example.com"]);
        let doc = json!({"hosts": [
            {"name": "a.example.com"},
            {"name": "slow.example.com", "responseTimeoutSeconds": 3,
             "responseBodyIdleTimeoutSeconds": 3}
        ]});
        let m = mirror_secret_with("m-a", "10", &c, &doc);
        let listener_timeouts =
            json!({"responseTimeoutSeconds": 1, "responseBodyIdleTimeoutSeconds": 1});
        let r = start_with(up, listener_timeouts, vec![m], c.sha).await;
        let ep = crate::support::quic::any_certificate_client();
        let addr = r.proxy.udp_addrs[0];
        let mut slow = H3::connect(&ep, addr, "slow.example.com").await;
        let mut plain = H3::connect(&ep, addr, "a.example.com").await;

        let (status, body) = slow.get_path("slow.example.com", "/wait/2000").await;
        assert_eq!((status, body.as_deref()), (200, Ok("waited")));
        let (status, _) = plain.get_path("a.example.com", "/wait/2000").await;
        assert_eq!(status, 504, "the listener's 1 s response timeout");
        // The FIN after the HEADERS, in a packet of its own: the timeout holds all the same
        // (it once never started, and this answered 200 whenever the FIN came late).
        let late = Duration::from_millis(100);
        let (status, _) = plain
            .get_path_fin_after("a.example.com", "/wait/2000", late)
            .await;
        assert_eq!(
            status, 504,
            "the 1 s response timeout, FIN after the HEADERS"
        );

        let (status, body) = slow.get_path("slow.example.com", "/stall/2000").await;
        assert_eq!((status, body.as_deref()), (200, Ok("first last")));
        let (status, body) = plain.get_path("a.example.com", "/stall/2000").await;
        assert_eq!(status, 200);
        assert!(body.is_err(), "reset after 1 s of body silence: {body:?}");

        let metrics = r.admin("/metrics").await;
        for (limit, want) in [("response_timeout", 2), ("response_body_idle_timeout", 1)] {
            let series = format!("h3_ingress_limits_total{{limit=\"{limit}\"}} {want}");
            assert!(metrics.lines().any(|l| l == series), "{series}");
        }
        for c in [slow, plain] {
            c.conn.close(0u32.into(), b"done");
        }
        r.stop().await;
    }

    /// A request that waits upstream 3x the listener's idle timeout (2 s), within its host's
    /// own response timeout (10 s), gets its answer although the client sends no PINGs: the
    /// proxy's keep-alive PINGs keep the connection alive while it waits (without them the
    /// connection idle-timed out after 2 s). A connection with no request in flight is still
    /// closed after the idle timeout, by the proxy (GOAWAY, then "idle timeout"), although
    /// those PINGs keep it alive at the QUIC level: one that never sent a request, and the
    /// one above once its response is in.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_long_upstream_wait_outlasts_the_idle_timeout_but_an_idle_connection_does_not() {
        let up = slow_upstream().await;
        let c = cert(&["slow.example.com"]);
        let doc = json!({"hosts": [{"name": "slow.example.com", "responseTimeoutSeconds": 10}]});
        let m = mirror_secret_with("m-a", "10", &c, &doc);
        let upstream = json!({"address": up.to_string(), "tls": false});
        let spec = json!({"transport": {"idleTimeoutSeconds": 2}});
        let r = launch_spec(upstream, spec, vec![m], c.sha).await;
        // No keep-alive of its own, like aioquic and curl.
        let ep = crate::support::quic::any_certificate_client();
        let addr = r.proxy.udp_addrs[0];
        let idle = H3::connect(&ep, addr, "slow.example.com").await;
        let idle_since = std::time::Instant::now();
        let idle_conn = idle.conn.clone();
        let idle_closed = tokio::spawn(async move {
            let e = idle_conn.closed().await;
            (e, idle_since.elapsed())
        });
        let mut slow = H3::connect(&ep, addr, "slow.example.com").await;

        let (status, body) = slow.get_path("slow.example.com", "/wait/6000").await;
        let answered = std::time::Instant::now();
        assert_eq!((status, body.as_deref()), (200, Ok("waited")));

        let closed_by_idle_timer = |e: &quinn::ConnectionError| {
            matches!(e, quinn::ConnectionError::ApplicationClosed(c)
                if c.error_code == 0x100u32.into() && &c.reason[..] == b"idle timeout")
        };
        let want = Duration::from_millis(1500)..Duration::from_millis(3500);
        // Long before the answer: the connection that never sent a request.
        let (e, after) = tokio::time::timeout(Duration::ZERO, idle_closed)
            .await
            .expect("the connection without a request is closed")
            .unwrap();
        assert!(closed_by_idle_timer(&e), "{e:?}");
        assert!(
            want.contains(&after),
            "closed {after:?} after it was opened"
        );
        let e = tokio::time::timeout(Duration::from_secs(5), slow.conn.closed())
            .await
            .expect("closed after its last response");
        let after = answered.elapsed();
        assert!(closed_by_idle_timer(&e), "{e:?}");
        assert!(want.contains(&after), "closed {after:?} after its response");
        drop(idle);
        r.stop().await;
    }

    /// A plain-HTTP TCP ingress that answers `Alt-Svc: h3=":PORT"` and records every request
    /// as `METHOD PATH HOST USER-AGENT`.
    async fn recording_upstream(port: u16) -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let log = seen.clone();
        tokio::spawn(async move {
            loop {
                let (s, _) = l.accept().await.unwrap();
                let log = log.clone();
                let svc = hyper::service::service_fn(move |req: http::Request<_>| {
                    let h = |name| {
                        let v = req.headers().get(name).and_then(|v| v.to_str().ok());
                        v.unwrap_or("-").to_string()
                    };
                    let line = format!(
                        "{} {} {} {}",
                        req.method(),
                        req.uri(),
                        h("host"),
                        h("user-agent")
                    );
                    log.lock().unwrap().push(line);
                    let (_tx, rx) = mpsc::unbounded_channel::<Bytes>();
                    let mut resp = hyper::Response::new(streaming(rx));
                    let alt = format!("h3=\":{port}\"; ma=60");
                    resp.headers_mut().insert("alt-svc", alt.parse().unwrap());
                    async move { Ok::<_, Infallible>(resp) }
                });
                tokio::spawn(async move {
                    let io = hyper_util::rt::TokioIo::new(s);
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(io, svc)
                        .await;
                });
            }
        });
        (addr, seen)
    }

    /// One pod per listener probes the TCP ingress for Alt-Svc: the one the listener's status
    /// names. Before that, and while another pod is named, this one sends nothing and exports
    /// no Alt-Svc series; named, it probes `altSvc.probePath` with its documented user agent;
    /// unnamed again, it forgets what it found.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn only_the_pod_the_status_names_probes_for_alt_svc() {
        let port = free_udp_port();
        let (up, seen) = recording_upstream(port).await;
        let c = cert(&["a.example.com"]);
        let m = mirror_secret("m-a", "10", &c, &["a.example.com"]);
        let upstream = json!({"address": up.to_string(), "tls": false});
        let spec = json!({"port": port, "altSvc": {"probePath": "/h3-probe?from=h3i"}});
        let r = launch_spec(upstream, spec, vec![m], c.sha).await;
        let probes = || seen.lock().unwrap().len();
        let series = "h3_ingress_alt_svc_advertised{host=\"a.example.com\"} 1";
        let exported = |text: &str| text.lines().any(|l| l == series);

        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(probes(), 0, "no pod named yet");
        r.name_prober(Some("dp-b"), 1).await;
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(probes(), 0, "another pod named");
        assert!(!exported(&r.admin("/metrics").await));

        r.name_prober(Some(POD), 2).await;
        let mut found = false;
        for _ in 0..100 {
            if exported(&r.admin("/metrics").await) {
                found = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(found, "named, it probes and exports the result");
        let ua = h3_ingress::proxy::altsvc::USER_AGENT;
        assert_eq!(
            seen.lock().unwrap().clone(),
            vec![format!("HEAD /h3-probe?from=h3i a.example.com {ua}")]
        );
        assert!(ua.starts_with("h3-ingress-alt-svc-probe/"), "{ua}");
        assert!(r
            .admin("/hosts")
            .await
            .contains("\"altSvcAdvertised\":true"));

        r.name_prober(Some("dp-b"), 3).await;
        let mut gone = false;
        for _ in 0..100 {
            if !exported(&r.admin("/metrics").await) {
                gone = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(gone, "handed on, it forgets its results");
        assert!(!r.admin("/hosts").await.contains("altSvcAdvertised"));
        assert_eq!(probes(), 1, "and sends no more");
        r.stop().await;
    }

    /// The motivating case at full scale (about 90 s): run by hand with `--ignored`. The client
    /// sends no PINGs (as aioquic and curl): the proxy's keep-alive PINGs keep the connection
    /// alive past `transport.idleTimeoutSeconds` (30 s) while the requests wait.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "90 s; the scaled-down test above runs in CI"]
    async fn a_90_s_response_under_a_120_s_host_timeout_and_a_60_s_listener() {
        let up = slow_upstream().await;
        let c = cert(&["a.example.com", "slow.example.com"]);
        let doc = json!({"hosts": [
            {"name": "a.example.com"},
            {"name": "slow.example.com", "responseTimeoutSeconds": 120}
        ]});
        let m = mirror_secret_with("m-a", "10", &c, &doc);
        let r = start_with(up, json!({"responseTimeoutSeconds": 60}), vec![m], c.sha).await;
        let ep = crate::support::quic::any_certificate_client();
        let addr = r.proxy.udp_addrs[0];
        let mut slow = H3::connect(&ep, addr, "slow.example.com").await;
        let mut plain = H3::connect(&ep, addr, "a.example.com").await;
        let started = std::time::Instant::now();
        let (a, b) = tokio::join!(slow.get_path("slow.example.com", "/wait/90000"), async {
            let r = plain.get_path("a.example.com", "/wait/90000").await;
            (r, started.elapsed())
        });
        let total = started.elapsed();
        eprintln!(
            "slow.example.com: {} after {total:?}; a.example.com: {} after {:?}",
            a.0, b.0 .0, b.1
        );
        assert_eq!((a.0, a.1.as_deref()), (200, Ok("waited")));
        assert_eq!(b.0 .0, 504);
        assert!(
            b.1 >= Duration::from_secs(60) && b.1 < Duration::from_secs(62),
            "{:?}",
            b.1
        );
        for c in [slow, plain] {
            c.conn.close(0u32.into(), b"done");
        }
        r.stop().await;
    }

    /// `h3_ingress_upstream_certificate_grace_total{leaf}` as the admin endpoint serves it.
    async fn grace_accepted(r: &Running, leaf: &str) -> u64 {
        let text = r.admin("/metrics").await;
        let series = format!("h3_ingress_upstream_certificate_grace_total{{leaf=\"{leaf}\"}} ");
        let line = text.lines().find(|l| l.starts_with(&series));
        line.map_or(0, |l| l[series.len()..].parse().unwrap())
    }

    /// A data plane that starts after a renewal (a restart, a roll), while the TCP ingress
    /// still presents the leaf the renewal replaced (`verify: servedCertificate`): the mirror
    /// it starts from says which leaf that was and since when, and the proxy accepts it for
    /// the rest of the grace. Without `previous.json` (what every data plane did before), or
    /// with a replacement older than the grace, the same request is a 502.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_data_plane_started_after_a_renewal_accepts_the_leaf_its_mirror_says_was_replaced() {
        const GRACE: i64 = 300;
        let (old, new) = (cert(&["a.example.com"]), cert(&["a.example.com"]));
        let ingress = tls_upstream(&old).await;
        let now = h3_ingress::config::file::unix_now();
        let upstream = json!({"address": ingress.to_string(), "tls": true,
                              "verify": "servedCertificate",
                              "servedCertificateGraceSeconds": GRACE});
        let cases = [
            ("replaced 10 s ago", Some(now - 10), 200, 1),
            ("no previous.json", None, 502, 0),
            ("replaced before the grace", Some(now - GRACE - 60), 502, 0),
        ];
        for (what, replaced_at, want, previous_accepted) in cases {
            let mut m = mirror_secret("m-a", "10", &new, &["a.example.com"]);
            if let Some(replaced_at) = replaced_at {
                let p = mirror::PreviousLeaf {
                    certificate: old.cert.clone(),
                    replaced_at,
                };
                let json = serde_json::to_vec(&p).unwrap();
                m["data"][mirror::PREVIOUS_KEY] = json!(base64_free::encode(&json));
            }
            let r = launch(upstream.clone(), m, new.sha.clone()).await;
            let ep = crate::support::quic::any_certificate_client();
            let mut h3 = H3::connect(&ep, r.proxy.udp_addrs[0], "a.example.com").await;
            assert_eq!(h3.served_cert_sha256(), new.sha, "{what}");
            let (status, body) = h3.get("a.example.com").await;
            assert_eq!(status, want, "{what}: {body}");
            if want == 200 {
                assert_eq!(body, "from the TCP ingress", "{what}");
            }
            assert_eq!(
                grace_accepted(&r, "previous").await,
                previous_accepted,
                "{what}"
            );
            h3.conn.close(0u32.into(), b"done");
            r.stop().await;
        }
    }
}
