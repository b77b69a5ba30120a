//! The data plane's Kubernetes source end to end against a mock API server that speaks the
//! list + streaming watch protocol: objects in, `ProxyConfig`s out on the channel; a rotated
//! certificate and a new Ingress host arrive live; only the referenced Secrets are ever
//! requested (by name); when the API server goes away nothing is sent, so the proxy keeps its
//! last good configuration. Without the Gateway API's CRDs (404) all of that works; with them,
//! an accepted annotated HTTPRoute is served with its Gateway listener's certificate. Then the
//! same source driving the real proxy, as `proxy --listener` runs it: live certificate rotation, and an invalid spec counted as an
//! invalid reload exactly like a bad file in standalone mode.

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

use h3_ingress::config::ProxyConfig;
use h3_ingress::proxy::source::kube::watch_listener;
use h3_ingress::proxy::ConfigUpdate;

type RespBody = UnsyncBoxBody<Bytes, Infallible>;
type Handle = tower_test::mock::Handle<Request<Body>, Response<RespBody>>;

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

fn ingress(hosts: &[(&str, &str)], rv: &str) -> Value {
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
           "metadata": {"name": "web", "namespace": "shop", "resourceVersion": rv,
                        "annotations": {"h3-ingress.dev/enabled": "true"}},
           "spec": {"ingressClassName": "nginx",
                    "tls": hosts.iter().map(|(h, s)| json!({"hosts": [h], "secretName": s})).collect::<Vec<_>>()}})
}

fn secret(name: &str, host: &str, rv: &str) -> (Value, String) {
    use base64_free::encode;
    let ck = rcgen::generate_simple_self_signed(vec![host.to_string()]).unwrap();
    let der_sha = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(ck.cert.der().as_ref() as &[u8]))
    };
    (
        json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
               "metadata": {"name": name, "namespace": "shop", "resourceVersion": rv},
               "data": {"tls.crt": encode(ck.cert.pem().as_bytes()),
                        "tls.key": encode(ck.signing_key.serialize_pem().as_bytes())}}),
        der_sha,
    )
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
    /// Objects listed per collection path; a Secret list is filtered by the name selector.
    secrets: BTreeMap<String, Value>,
    ingress: Option<Value>,
    /// Open watch streams per collection path (Secrets: path + name).
    watches: BTreeMap<String, mpsc::UnboundedSender<Bytes>>,
    /// Every Secret request, as `path?query`.
    secret_requests: Vec<String>,
    down: bool,
    /// The listener to list (the default one when unset).
    listener: Option<Value>,
    /// IngressClasses to list.
    classes: Vec<Value>,
    /// Gateways, HTTPRoutes and ReferenceGrants to list by collection path; without any, the
    /// Gateway API is not installed (404, as an API server without its CRDs answers).
    gateway_api: BTreeMap<String, Vec<Value>>,
}

fn not_found() -> Response<RespBody> {
    Response::builder()
        .status(404)
        .body(full(
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
                          "status": "Failure", "reason": "NotFound", "code": 404,
                          "message": "the server could not find the requested resource"}),
        ))
        .unwrap()
}

async fn api_server(mut handle: Handle, world: Arc<Mutex<World>>) {
    while let Some((req, send)) = handle.next_request().await {
        let path = req.uri().path().to_string();
        let query = req.uri().query().unwrap_or_default().to_string();
        let watch = query.contains("watch=true");
        let mut w = world.lock().unwrap();
        if w.down {
            send.send_response(
                Response::builder()
                    .status(503)
                    .body(full(json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
                                      "status": "Failure", "code": 503, "message": "apiserver down"})))
                    .unwrap(),
            );
            continue;
        }
        let selected_name = query
            .split('&')
            .find_map(|kv| kv.strip_prefix("fieldSelector=metadata.name%3D"))
            .map(str::to_string);
        if path.starts_with("/apis/gateway.networking.k8s.io/") && w.gateway_api.is_empty() {
            send.send_response(not_found());
            continue;
        }
        let (key, items): (String, Vec<Value>) = match path.as_str() {
            "/apis/h3-ingress.dev/v1alpha1/http3listeners" => {
                assert_eq!(
                    selected_name.as_deref(),
                    Some("public"),
                    "the listener is watched by name: {query}"
                );
                (
                    path.clone(),
                    vec![w.listener.clone().unwrap_or_else(listener)],
                )
            }
            "/apis/networking.k8s.io/v1/ingresses" => {
                (path.clone(), w.ingress.clone().into_iter().collect())
            }
            "/apis/networking.k8s.io/v1/ingressclasses" => (path.clone(), w.classes.clone()),
            p if p.starts_with("/apis/gateway.networking.k8s.io/") => (
                path.clone(),
                w.gateway_api.get(p).cloned().unwrap_or_default(),
            ),
            p if p.starts_with("/api/v1/namespaces/") && p.ends_with("/secrets") => {
                w.secret_requests.push(format!("{path}?{query}"));
                let name = selected_name.unwrap_or_else(|| {
                    panic!("a Secret request without a name selector: {path}?{query}")
                });
                let key = format!("{path}/{name}");
                (
                    key.clone(),
                    w.secrets.get(&key).cloned().into_iter().collect(),
                )
            }
            other => panic!("unexpected request {other}?{query}"),
        };
        let body = if watch {
            let (tx, rx) = mpsc::unbounded_channel();
            w.watches.insert(key, tx);
            streaming(rx)
        } else {
            full(
                json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": "1"}, "items": items}),
            )
        };
        send.send_response(Response::builder().status(200).body(body).unwrap());
    }
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

#[tokio::test]
async fn objects_in_configs_out_live_updates_and_last_good_config_when_the_api_goes_away() {
    let (svc, handle) = tower_test::mock::pair::<Request<Body>, Response<RespBody>>();
    let client = Client::new(svc, "default");
    let world = Arc::new(Mutex::new(World::default()));
    let secrets_path = "/api/v1/namespaces/shop/secrets";
    let (s1, sha1) = secret("web-tls", "a.example.com", "10");
    {
        let mut w = world.lock().unwrap();
        w.ingress = Some(ingress(&[("a.example.com", "web-tls")], "5"));
        w.secrets.insert(format!("{secrets_path}/web-tls"), s1);
    }
    tokio::spawn(api_server(handle, world.clone()));
    let (tx, mut rx) = mpsc::channel(4);
    let source = tokio::spawn(watch_listener(client, "public".into(), tx));

    // 1. The first configuration, built by the same pure function as the file mode.
    let c1 = next(&mut rx, "initial objects").await;
    assert_eq!(c1.listen.port, 443);
    assert_eq!(c1.upstream.address.to_string(), "10.0.0.1:443");
    assert_eq!(leaf(&c1, "a.example.com"), sha1);
    assert_eq!(c1.host_reports.len(), 1);
    assert_eq!(c1.host_reports[0].ingress.as_deref(), Some("shop/web"));

    // 2. cert-manager renews the certificate: the new one arrives without a restart.
    let (s2, sha2) = secret("web-tls", "a.example.com", "11");
    wait_for_watch(&world, &format!("{secrets_path}/web-tls"))
        .await
        .send(event("MODIFIED", &s2))
        .unwrap();
    let c2 = next(&mut rx, "rotated certificate").await;
    assert_eq!(leaf(&c2, "a.example.com"), sha2);
    assert_ne!(sha1, sha2);

    // 3. The Ingress gains a host whose Secret does not exist (yet): a new watch for exactly
    //    that Secret, and a per-host reason.
    wait_for_watch(&world, "/apis/networking.k8s.io/v1/ingresses")
        .await
        .send(event(
            "MODIFIED",
            &ingress(
                &[("a.example.com", "web-tls"), ("b.example.com", "b-tls")],
                "6",
            ),
        ))
        .unwrap();
    let c3 = next(&mut rx, "new Ingress host").await;
    assert_eq!(leaf(&c3, "a.example.com"), sha2);
    let b = c3
        .host_reports
        .iter()
        .find(|h| h.name == "b.example.com")
        .unwrap();
    assert_eq!(
        (b.state.as_str(), b.reason.as_str()),
        ("NotServing", "SecretNotFound")
    );

    // 4. The Secret appears: b is served.
    let (sb, shab) = secret("b-tls", "b.example.com", "12");
    wait_for_watch(&world, &format!("{secrets_path}/b-tls"))
        .await
        .send(event("ADDED", &sb))
        .unwrap();
    let c4 = next(&mut rx, "new Secret").await;
    assert_eq!(leaf(&c4, "b.example.com"), shab);

    // Only the two referenced Secrets were ever asked for, each by name.
    let requests = world.lock().unwrap().secret_requests.clone();
    assert!(!requests.is_empty());
    for r in &requests {
        assert!(
            r.contains("metadata.name%3Dweb-tls") || r.contains("metadata.name%3Db-tls"),
            "{r}"
        );
    }

    // 5. The API server goes away: streams end, every request fails. Nothing is sent, so the
    //    proxy keeps c4; the source keeps retrying instead of giving up.
    {
        let mut w = world.lock().unwrap();
        w.down = true;
        w.watches.clear();
    }
    let quiet = tokio::time::timeout(Duration::from_secs(4), rx.recv()).await;
    assert!(
        quiet.is_err(),
        "a config was sent while the API server was down"
    );
    assert!(!source.is_finished(), "the source gave up");

    // 6. The proxy shutting down (receiver dropped) ends the source cleanly.
    drop(rx);
    let done = tokio::time::timeout(Duration::from_secs(5), source).await;
    assert!(matches!(done, Ok(Ok(Ok(())))), "{done:?}");
}

fn route(annotated: bool, rv: &str) -> Value {
    let annotations = if annotated {
        json!({"h3-ingress.dev/enabled": "true"})
    } else {
        json!({})
    };
    json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
           "metadata": {"name": "web", "namespace": "shop", "resourceVersion": rv, "uid": "r1",
                        "generation": 1, "annotations": annotations},
           "spec": {"parentRefs": [{"name": "gw"}], "hostnames": ["a.example.com"]},
           "status": {"parents": [{"parentRef": {"name": "gw"}, "controllerName": "example.com/gw",
               "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted",
                   "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}]}})
}

#[tokio::test]
async fn an_accepted_annotated_httproute_is_served_with_the_gateway_certificate_until_unannotated()
{
    let (svc, handle) = tower_test::mock::pair::<Request<Body>, Response<RespBody>>();
    let client = Client::new(svc, "default");
    let world = Arc::new(Mutex::new(World::default()));
    let secrets_path = "/api/v1/namespaces/shop/secrets";
    let routes = "/apis/gateway.networking.k8s.io/v1/httproutes";
    let (cert, sha) = secret("gw-tls", "a.example.com", "10");
    {
        let mut w = world.lock().unwrap();
        let mut l = listener();
        l["spec"]["gatewayClassName"] = json!("gw");
        w.listener = Some(l);
        w.secrets.insert(format!("{secrets_path}/gw-tls"), cert);
        w.gateway_api.insert(
            "/apis/gateway.networking.k8s.io/v1/gateways".into(),
            vec![
                json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
                "metadata": {"name": "gw", "namespace": "shop", "resourceVersion": "3"},
                "spec": {"gatewayClassName": "gw", "listeners": [{"name": "https", "port": 443,
                    "protocol": "HTTPS", "tls": {"certificateRefs": [{"name": "gw-tls"}]}}]}}),
            ],
        );
        w.gateway_api.insert(routes.into(), vec![route(true, "5")]);
        w.gateway_api.insert(
            "/apis/gateway.networking.k8s.io/v1beta1/referencegrants".into(),
            vec![],
        );
    }
    tokio::spawn(api_server(handle, world.clone()));
    let (tx, mut rx) = mpsc::channel(4);
    let _source = tokio::spawn(watch_listener(client, "public".into(), tx));

    let c1 = next(&mut rx, "route attached to an HTTPS Gateway listener").await;
    assert_eq!(leaf(&c1, "a.example.com"), sha);
    let h = &c1.host_reports[0];
    assert_eq!(
        (
            h.http_route.as_deref(),
            h.gateway.as_deref(),
            h.gateway_listener.as_deref()
        ),
        (Some("shop/web"), Some("shop/gw"), Some("https"))
    );
    assert_eq!(h.secret.as_deref(), Some("shop/gw-tls"));
    assert_eq!(
        world
            .lock()
            .unwrap()
            .secret_requests
            .iter()
            .filter(|r| !r.contains("metadata.name%3Dgw-tls"))
            .count(),
        0,
        "only the Gateway listener's Secret is read"
    );

    wait_for_watch(&world, routes)
        .await
        .send(event("MODIFIED", &route(false, "6")))
        .unwrap();
    let c2 = next(&mut rx, "annotation removed").await;
    assert!(c2.hosts.lookup("a.example.com").is_none());
    assert!(c2.host_reports.is_empty(), "{:?}", c2.host_reports);
}

// ---------------------------------------------------------------------------------------------
// The same source driving the real data plane through `kube_with`, the code `proxy --listener`
// runs: a certificate rotated in a Secret is served to new connections while a connection
// opened before the swap keeps working on its old one; a broken spec is counted.

mod live {
    use super::*;
    use h3_ingress::proxy::run::kube_with;
    use h3_ingress::proxy::RunningProxy;
    use std::net::SocketAddr;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::task::JoinHandle;
    use tokio_util::sync::CancellationToken;

    fn client() -> quinn::Endpoint {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut tls = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .dangerous()
            // Any certificate: the test compares the served one itself.
            .with_custom_certificate_verifier(h3_ingress::proxy::tls::AnyServerCertificate::new())
            .with_no_client_auth();
        tls.alpn_protocols = vec![b"h3".to_vec()];
        let quic = quinn::crypto::rustls::QuicClientConfig::try_from(tls).unwrap();
        let mut ep = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
        ep.set_default_client_config(quinn::ClientConfig::new(Arc::new(quic)));
        ep
    }

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
            let req = http::Request::get(format!("https://{host}/"))
                .body(())
                .unwrap();
            let mut s = self.send.send_request(req).await.expect("request");
            s.finish().await.unwrap();
            let resp = s.recv_response().await.expect("response");
            let mut body = Vec::new();
            while let Some(chunk) = s.recv_data().await.unwrap() {
                use bytes::Buf;
                body.extend_from_slice(chunk.chunk());
            }
            (
                resp.status().as_u16(),
                String::from_utf8_lossy(&body).into_owned(),
            )
        }
    }

    /// A plain-HTTP stand-in for the TCP ingress.
    async fn upstream() -> SocketAddr {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let (s, _) = l.accept().await.unwrap();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(|_req| async {
                        Ok::<_, Infallible>(hyper::Response::new(http_body_util::Full::new(
                            Bytes::from_static(b"from the TCP ingress"),
                        )))
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(s), svc)
                        .await;
                });
            }
        });
        addr
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
        let port = free_udp_port();
        let mut l = listener();
        l["spec"] = json!({
            "ingressClassName": "nginx",
            "port": port,
            "addresses": {"ipv4": "127.0.0.1", "ipv6": null},
            "upstream": {"address": up.to_string(), "tls": false},
            "metrics": {"address": "127.0.0.1:0"}
        });
        let (svc, handle) = tower_test::mock::pair::<Request<Body>, Response<RespBody>>();
        let world = Arc::new(Mutex::new(World::default()));
        let (s1, sha1) = secret("web-tls", "a.example.com", "10");
        {
            let mut w = world.lock().unwrap();
            w.ingress = Some(ingress(&[("a.example.com", "web-tls")], "5"));
            w.secrets.insert(format!("{SECRETS}/web-tls"), s1);
            w.listener = Some(l.clone());
        }
        tokio::spawn(api_server(handle, world.clone()));
        let shutdown = CancellationToken::new();
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let client = Client::new(svc, "default");
        let task = tokio::spawn(kube_with(
            client,
            "public".into(),
            shutdown.clone(),
            Some(ready_tx),
        ));
        let proxy = tokio::time::timeout(Duration::from_secs(10), ready_rx)
            .await
            .expect("the proxy starts on the first configuration")
            .unwrap();
        assert_eq!(proxy.udp_addrs[0].port(), port);
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

        /// `h3_ingress_config_reloads_total{result}` as the admin endpoint serves it.
        async fn reloads(&self, result: &str) -> u64 {
            let mut s = tokio::net::TcpStream::connect(self.proxy.admin_addr)
                .await
                .unwrap();
            s.write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
                .await
                .unwrap();
            let mut text = String::new();
            s.read_to_string(&mut text).await.unwrap();
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

    const SECRETS: &str = "/api/v1/namespaces/shop/secrets";
    const LISTENERS: &str = "/apis/h3-ingress.dev/v1alpha1/http3listeners";

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_running_proxy_serves_a_rotated_certificate_without_dropping_an_open_connection() {
        let r = start().await;
        let addr = r.proxy.udp_addrs[0];
        let ep = client();
        let mut before = H3::connect(&ep, addr, "a.example.com").await;
        assert_eq!(before.served_cert_sha256(), r.sha1);
        assert_eq!(
            before.get("a.example.com").await,
            (200, "from the TCP ingress".to_string())
        );

        // Rotate the certificate in the Secret.
        let (s2, sha2) = secret("web-tls", "a.example.com", "11");
        wait_for_watch(&r.world, &format!("{SECRETS}/web-tls"))
            .await
            .send(event("MODIFIED", &s2))
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
        r.stop().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_invalid_spec_is_counted_as_an_invalid_reload_like_a_bad_file() {
        let r = start().await;
        assert_eq!(r.reloads("invalid").await, 0);

        // The spec breaks: one invalid reload, and the proxy keeps serving.
        r.modify_listener(2, "x").await;
        r.wait_reloads("invalid", 1).await;
        let ep = client();
        let mut h3 = H3::connect(&ep, r.proxy.udp_addrs[0], "a.example.com").await;
        assert_eq!(h3.get("a.example.com").await.0, 200);

        // Re-evaluating the same broken spec (an unrelated Ingress change) counts nothing;
        // a new broken version of the spec counts again, as a second bad SIGHUP would.
        wait_for_watch(&r.world, "/apis/networking.k8s.io/v1/ingresses")
            .await
            .send(event(
                "MODIFIED",
                &ingress(&[("a.example.com", "web-tls")], "7"),
            ))
            .unwrap();
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
}

fn ingress_class(name: &str, default: bool, rv: &str) -> Value {
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "IngressClass",
           "metadata": {"name": name, "resourceVersion": rv,
                        "annotations": {"ingressclass.kubernetes.io/is-default-class": default.to_string()}},
           "spec": {"controller": "k8s.io/ingress-nginx"}})
}

/// An Ingress without a class belongs to the cluster's default IngressClass, as the TCP
/// ingress controller of that class serves it: the listener of that class serves it too, and
/// stops when the class is no longer the default.
#[tokio::test]
async fn an_ingress_without_a_class_is_served_while_the_listeners_class_is_the_default() {
    let (svc, handle) = tower_test::mock::pair::<Request<Body>, Response<RespBody>>();
    let client = Client::new(svc, "default");
    let world = Arc::new(Mutex::new(World::default()));
    let (s1, sha1) = secret("web-tls", "a.example.com", "10");
    {
        let mut w = world.lock().unwrap();
        let mut ing = ingress(&[("a.example.com", "web-tls")], "5");
        ing["spec"]
            .as_object_mut()
            .unwrap()
            .remove("ingressClassName");
        w.ingress = Some(ing);
        w.secrets
            .insert("/api/v1/namespaces/shop/secrets/web-tls".into(), s1);
        w.classes = vec![ingress_class("nginx", true, "3")];
    }
    tokio::spawn(api_server(handle, world.clone()));
    let (tx, mut rx) = mpsc::channel(4);
    let _source = tokio::spawn(watch_listener(client, "public".into(), tx));

    let c = next(&mut rx, "class-less Ingress, nginx is the default").await;
    assert_eq!(leaf(&c, "a.example.com"), sha1);

    wait_for_watch(&world, "/apis/networking.k8s.io/v1/ingressclasses")
        .await
        .send(event("MODIFIED", &ingress_class("nginx", false, "4")))
        .unwrap();
    let c = next(&mut rx, "nginx is no longer the default").await;
    assert!(c.hosts.lookup("a.example.com").is_none());
    assert!(c.host_reports.is_empty(), "{:?}", c.host_reports);
}
