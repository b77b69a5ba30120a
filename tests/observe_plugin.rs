//! The built binary, started as `kubectl-h3_ingress` (a symlink, as users install it), against a
//! file and against a small fake API server reached through a kubeconfig. The plugin's pure
//! parts are unit-tested in src/plugin.rs; this proves the argv[0] dispatch, kubeconfig loading,
//! name resolution and the HTTP requests of the real executable.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;

const LISTENER: &str = r#"{
  "apiVersion": "h3-ingress.dev/v1alpha1", "kind": "Http3Listener",
  "metadata": {"name": "nginx", "generation": 1},
  "spec": {"port": 8443, "upstream": {"address": "ingress-nginx-controller.ingress-nginx.svc:443"}},
  "status": {
    "observedGeneration": 1, "hostsSummary": "1/2",
    "conditions": [{"type": "Ready", "status": "True", "reason": "SomeHostsServing", "message": "",
                    "lastTransitionTime": "2026-11-30T00:00:00Z"}],
    "hostCounts": [{"state": "NotServing", "reason": "NoTLS", "count": 1},
                   {"state": "Serving", "reason": "Serving", "count": 1}],
    "hosts": [
      {"name": "api.example.com", "ingress": "web/shop", "secret": "web/api-tls",
       "state": "NotServing", "reason": "NoTLS", "message": "api.example.com is not in spec.tls"}
    ],
    "nodes": {"desired": 2, "ready": 2, "summary": "2/2"}
  }
}"#;
/// A data plane pod's `/hosts`: the served hosts, which the status only counts.
const HOSTS: &str = r#"[
  {"name": "shop.example.com", "state": "Serving", "reason": "Serving", "ingress": "web/shop",
   "secret": "web/shop-tls", "altSvcAdvertised": true, "requests": 42, "requestsLast5m": 3}
]"#;

/// Where the plugin reads `/hosts`: the pod's metrics port through the API server's pod proxy.
const HOSTS_PROXY: &str = "/api/v1/namespaces/h3-ingress/pods/nginx-dp-x:9476/proxy/hosts";

fn pods() -> String {
    r#"{"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": [
      {"metadata": {"name": "nginx-dp-x", "namespace": "h3-ingress"},
       "spec": {"nodeName": "node-7", "containers": []},
       "status": {"phase": "Running", "hostIP": "192.0.2.7",
                  "conditions": [{"type": "Ready", "status": "True"}]}}]}"#
        .to_string()
}

/// Answers the requests the plugin makes, and 404 otherwise; records every path.
async fn fake_api_server() -> (SocketAddr, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen2 = seen.clone();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let seen = seen2.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<hyper::body::Incoming>| {
                    let path = req.uri().to_string();
                    seen.lock().unwrap().push(path.clone());
                    async move {
                        let p = path.split('?').next().unwrap().to_string();
                        let (status, body) = match p.as_str() {
                            "/apis/h3-ingress.dev/v1alpha1/http3listeners" => (
                                200,
                                format!(r#"{{"apiVersion": "h3-ingress.dev/v1alpha1", "kind": "Http3ListenerList", "metadata": {{}}, "items": [{LISTENER}]}}"#),
                            ),
                            "/apis/h3-ingress.dev/v1alpha1/http3listeners/nginx" => (200, LISTENER.to_string()),
                            "/api/v1/pods" => (200, pods()),
                            HOSTS_PROXY => (200, HOSTS.to_string()),
                            _ => (
                                404,
                                r#"{"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "reason": "NotFound", "code": 404, "message": "not found"}"#.to_string(),
                            ),
                        };
                        Ok::<_, std::convert::Infallible>(
                            Response::builder()
                                .status(status)
                                .header("content-type", "application/json")
                                .body(Full::new(Bytes::from(body)))
                                .unwrap(),
                        )
                    }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (addr, seen)
}

fn plugin_dir() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("kubectl-h3_ingress");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_h3-ingress"), &link).unwrap();
    (dir, link)
}

fn kubeconfig(dir: &Path, addr: SocketAddr) -> PathBuf {
    // "localhost" rather than the IP, so the binary resolves a name like it would in a cluster.
    let text = format!(
        "apiVersion: v1\nkind: Config\ncurrent-context: fake\nclusters:\n- name: fake\n  cluster:\n    server: http://localhost:{}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\nusers:\n- name: fake\n  user:\n    token: not-a-secret\n",
        addr.port()
    );
    let path = dir.join("kubeconfig");
    std::fs::write(&path, text).unwrap();
    path
}

async fn run(plugin: &Path, args: &[&str]) -> Output {
    let plugin = plugin.to_path_buf();
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    tokio::task::spawn_blocking(move || Command::new(plugin).args(args).output().unwrap())
        .await
        .unwrap()
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[tokio::test]
async fn status_from_a_file() {
    let (dir, plugin) = plugin_dir();
    let file = dir.path().join("h3l.json");
    std::fs::write(&file, LISTENER).unwrap();
    let hosts = dir.path().join("hosts.json");
    std::fs::write(&hosts, HOSTS).unwrap();
    let (file, hosts) = (file.to_str().unwrap(), hosts.to_str().unwrap());
    let out = run(&plugin, &["status", "-f", file, "--hosts-file", hosts]).await;
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("Listener nginx: UDP port 8443, pods ready 2/2, hosts serving 1/2"),
        "{stdout}"
    );
    assert!(stdout.contains("shop.example.com   Serving"), "{stdout}");
    assert!(
        stdout.contains("api.example.com: api.example.com is not in spec.tls"),
        "{stdout}"
    );
    // Without a pod's /hosts, the status alone: counts, and the host not served.
    let out = run(&plugin, &["status", "-f", file]).await;
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("1 Serving/Serving"), "{stdout}");
    assert!(!stdout.contains("shop.example.com"), "{stdout}");
    assert!(stdout.contains("api.example.com"), "{stdout}");

    let out = run(&plugin, &["status", "other", "-f", file]).await;
    assert!(!out.status.success());
    assert!(text(&out).1.contains("Http3Listener \"other\" not found"));
}

#[tokio::test]
async fn status_and_check_against_an_api_server() {
    let (addr, seen) = fake_api_server().await;
    let (dir, plugin) = plugin_dir();
    let kc = kubeconfig(dir.path(), addr);
    let kc = kc.to_str().unwrap();

    let out = run(&plugin, &["status", "--kubeconfig", kc]).await;
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("  shop.example.com   Serving      Serving   yes       -             42"),
        "{stdout}"
    );

    let out = run(&plugin, &["status", "nginx", "--kubeconfig", kc]).await;
    assert!(out.status.success(), "{:?}", text(&out));

    let out = run(&plugin, &["status", "missing", "--kubeconfig", kc]).await;
    assert!(!out.status.success());
    assert!(
        text(&out).1.contains("Http3Listener \"missing\" not found"),
        "{:?}",
        text(&out)
    );

    let out = run(
        &plugin,
        &["check", "shop.example.com", "--dry-run", "--kubeconfig", kc],
    )
    .await;
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert_eq!(
        stdout,
        "h3-ingress check https://shop.example.com:8443/ --resolve shop.example.com:8443:192.0.2.7\n"
    );
    assert!(
        stderr.contains("listener nginx, pod h3-ingress/nginx-dp-x on node node-7"),
        "{stderr}"
    );

    // With one listener, a host it does not serve is checked there all the same: the
    // check itself says why it fails.
    let out = run(
        &plugin,
        &["check", "nope.example.com", "--dry-run", "--kubeconfig", kc],
    )
    .await;
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("--resolve nope.example.com:8443:192.0.2.7"),
        "{stdout}"
    );

    let paths = seen.lock().unwrap().clone();
    assert!(paths.iter().any(|p| p == HOSTS_PROXY), "{paths:?}");
    assert!(
        paths.iter().any(|p| p.starts_with("/api/v1/pods?")
            && p.contains("app.kubernetes.io%2Finstance%3Dnginx")),
        "{paths:?}"
    );
}

#[tokio::test]
async fn check_with_node_needs_no_cluster() {
    let (_dir, plugin) = plugin_dir();
    let out = run(
        &plugin,
        &[
            "check",
            "a.example.com",
            "--node",
            "[::1]:4433",
            "--dry-run",
            "--",
            "--insecure",
        ],
    )
    .await;
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert_eq!(
        stdout,
        "h3-ingress check https://a.example.com:4433/ --resolve a.example.com:4433:[::1] --insecure\n"
    );
}

#[test]
fn the_plain_binary_is_not_the_plugin() {
    let out = Command::new(env!("CARGO_BIN_EXE_h3-ingress"))
        .arg("status")
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "h3-ingress has no `status` subcommand; the plugin does"
    );
}
