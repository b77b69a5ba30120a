//! The data plane's Kubernetes source end to end against a mock API server that speaks the
//! list + streaming watch protocol: objects in, `ProxyConfig`s out on the channel; a rotated
//! certificate and a new Ingress host arrive live; only the referenced Secrets are ever
//! requested (by name); when the API server goes away nothing is sent, so the proxy keeps its
//! last good configuration.

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
use h3_ingress::operator::dataplane::watch_listener;

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

async fn next(rx: &mut mpsc::Receiver<ProxyConfig>, what: &str) -> ProxyConfig {
    tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .unwrap_or_else(|_| panic!("no config for: {what}"))
        .expect("sender alive")
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

// ---------------------------------------------------------------------------------------------
// The same source driving the real data plane: a certificate rotated in a Secret is served to
// new connections while a connection opened before the swap keeps working on its old one.

mod live {
    use super::*;
    use h3_ingress::proxy::{serve, ConfigUpdate};
    use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
    use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
    use rustls::{DigitallySignedStruct, SignatureScheme};
    use std::net::SocketAddr;
    use tokio_util::sync::CancellationToken;

    /// Accepts any server certificate (the test compares the served one itself) but still
    /// checks the handshake signatures.
    #[derive(Debug)]
    struct AcceptAny(Arc<rustls::crypto::CryptoProvider>);

    impl ServerCertVerifier for AcceptAny {
        fn verify_server_cert(
            &self,
            _: &CertificateDer<'_>,
            _: &[CertificateDer<'_>],
            _: &ServerName<'_>,
            _: &[u8],
            _: UnixTime,
        ) -> Result<ServerCertVerified, rustls::Error> {
            Ok(ServerCertVerified::assertion())
        }
        fn verify_tls12_signature(
            &self,
            m: &[u8],
            c: &CertificateDer<'_>,
            d: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls12_signature(
                m,
                c,
                d,
                &self.0.signature_verification_algorithms,
            )
        }
        fn verify_tls13_signature(
            &self,
            m: &[u8],
            c: &CertificateDer<'_>,
            d: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls13_signature(
                m,
                c,
                d,
                &self.0.signature_verification_algorithms,
            )
        }
        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.0.signature_verification_algorithms.supported_schemes()
        }
    }

    fn client() -> quinn::Endpoint {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut tls = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AcceptAny(provider)))
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
                .downcast::<Vec<CertificateDer<'static>>>()
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

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_running_proxy_serves_a_rotated_certificate_without_dropping_an_open_connection() {
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
        let secrets_path = "/api/v1/namespaces/shop/secrets";
        let (s1, sha1) = secret("web-tls", "a.example.com", "10");
        {
            let mut w = world.lock().unwrap();
            w.ingress = Some(ingress(&[("a.example.com", "web-tls")], "5"));
            w.secrets.insert(format!("{secrets_path}/web-tls"), s1);
            w.listener = Some(l);
        }
        tokio::spawn(api_server(handle, world.clone()));
        let (tx, mut configs) = mpsc::channel(4);
        tokio::spawn(watch_listener(
            Client::new(svc, "default"),
            "public".into(),
            tx,
        ));

        // The proxy starts on the first configuration and takes the rest as live updates,
        // as `proxy --listener` does.
        let initial = next(&mut configs, "initial objects").await;
        let (updates_tx, updates_rx) = mpsc::channel(4);
        tokio::spawn(async move {
            while let Some(c) = configs.recv().await {
                if updates_tx
                    .send(ConfigUpdate::Apply(Box::new(c)))
                    .await
                    .is_err()
                {
                    return;
                }
            }
        });
        let shutdown = CancellationToken::new();
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let proxy = tokio::spawn(serve(initial, updates_rx, shutdown.clone(), Some(ready_tx)));
        let running = tokio::time::timeout(Duration::from_secs(10), ready_rx)
            .await
            .unwrap()
            .unwrap();
        let addr = running.udp_addrs[0];
        assert_eq!(addr.port(), port);

        let ep = client();
        let mut before = H3::connect(&ep, addr, "a.example.com").await;
        assert_eq!(before.served_cert_sha256(), sha1);
        assert_eq!(
            before.get("a.example.com").await,
            (200, "from the TCP ingress".to_string())
        );

        // Rotate the certificate in the Secret.
        let (s2, sha2) = secret("web-tls", "a.example.com", "11");
        wait_for_watch(&world, &format!("{secrets_path}/web-tls"))
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
        assert_eq!(before.served_cert_sha256(), sha1);

        shutdown.cancel();
        let done = tokio::time::timeout(Duration::from_secs(40), proxy).await;
        assert!(matches!(done, Ok(Ok(Ok(())))), "{done:?}");
    }
}
