//! The front door: HTTP/3 keeps the TCP ingress's per-host rules (docs/kubernetes-networking.md,
//! "The client's address"; docs/behaviour.md, "Hosts held back"). Two TCP ingresses on the real
//! nodes: Debian nginx on TCP 443 (allowlists as ingress-nginx writes them: `allow`/`deny` on
//! the server, the real-IP module only once trusted) and Traefik v3.7.13 on TCP 8444 (an
//! `ipAllowList` Middleware; entryPoint `h3proxy` on 8443 taking PROXY protocol from
//! 127.0.0.1). Two listeners, one per ingress class. Checked, each in a step:
//! (a) an allowlisted host of each is not served over HTTP/3 with the default listener and the
//! status says why, while an unannotated host with the same nginx rule shows what serving it
//! would do (an outside client gets 200 over HTTP/3, 403 over TCP);
//! (b) with the listener's declaration they are served and an outside client gets 403 over
//! HTTP/3 exactly as over TCP, an inside one 200 (nginx: forwarded headers, trusted; Traefik:
//! trusted headers are refused for a Middleware that judges the peer, PROXY protocol serves it),
//! an outside client's own `X-Forwarded-For`/`Forwarded`/`X-Real-IP` naming the inside address
//! still gets 403 over HTTP/3, Traefik's access log names the client, and a `rateLimit`
//! Middleware gives two HTTP/3 clients their own buckets;
//! (c) `proxy-read-timeout: "120"` reaches the host's mirror, and a 90 s response comes back
//! 200 over HTTP/3 as over TCP and is in the data plane's access log (`slow.rs`);
//! (d) hosts asking for client certificates (an annotation, a TLSOption) are refused with
//! their reason. Every answer is printed again at the end as one table.
//! `H3I_FRONTDOOR_KEEP=1` keeps the objects, nginx and Traefik afterwards; otherwise they go
//! and the run waits for its namespaces to be gone (the next test finds the UDP ports free).

mod setup;
mod slow;
mod steps;

use h3i_scenarios::k8s::Apis;
use std::path::PathBuf;

use h3_ingress::api::{HostStatus, Http3Listener};
use h3i_scenarios::cmd::{output, repo};
use h3i_scenarios::k8s;
use h3i_scenarios::{fail, indent, Env, Result, Run, Scenario};
use kube::Client;
use serde_json::{json, Value};

use crate::FromEnv;

const NS_OP: &str = "h3-ingress";
const RELEASE: &str = "h3-ingress";
const NS_APP: &str = "h3i-frontdoor";
const NS_HOSTS: &str = "h3-ingress-hosts";
const IMAGE_REPO: &str = "registry.h3i.test/h3-ingress";
/// The listeners: one per TCP ingress.
const L_NGINX: &str = "fd-nginx";
const L_TRAEFIK: &str = "fd-traefik";
/// UDP ports of the listeners and the TCP ports of the ingresses they forward to.
const UDP_NGINX: u16 = 443;
const UDP_TRAEFIK: u16 = 9443;
const TCP_NGINX: u16 = 443;
const TCP_TRAEFIK: u16 = 8444;
const TCP_TRAEFIK_PROXY: u16 = 8443;
/// nginx hosts: allowlisted with the annotation; the same nginx rule without it; client
/// certificates; a long read timeout.
const GUARDED: &str = "guarded.fd.h3i.test";
const OPEN: &str = "open.fd.h3i.test";
const MTLS: &str = "mtls.fd.h3i.test";
const SLOW: &str = "slow.fd.h3i.test";
/// Traefik hosts: an ipAllowList Middleware; a TLSOption with clientAuth; a rateLimit
/// Middleware (per source, Traefik's default criterion) of `RATE_BURST` requests a minute.
const T_GUARDED: &str = "tguard.fd.h3i.test";
const T_MTLS: &str = "tmtls.fd.h3i.test";
const T_RATE: &str = "trate.fd.h3i.test";
const RATE_BURST: u64 = 2;
const WHITELIST: &str = "nginx.ingress.kubernetes.io/whitelist-source-range";

pub struct Frontdoor {
    env: Env,
    client: Client,
    tmp: PathBuf,
    ca: PathBuf,
    /// The host's address on the bridge: the client inside every allowlist.
    inside: String,
    /// The node whose namespace is the client outside them (its address is in none).
    outside_node: String,
    outside: String,
    /// Every verdict line, printed again as one table at the end.
    table: std::sync::Mutex<Vec<String>>,
    /// What nginx proxies [`slow::SLOW_PATH`] of [`SLOW`] to (from `ingresses`).
    slow_backend: Option<slow::SlowBackend>,
}

impl FromEnv for Frontdoor {
    fn from_env(env: Env, client: Client) -> Self {
        let tmp = h3i_scenarios::scratch_dir("h3i-frontdoor")
            .unwrap_or_else(|_| "/tmp/h3i-frontdoor".into());
        let inside = std::env::var("H3I_HOST_IP").unwrap_or_default();
        let outside_node = env.nodes.last().cloned().unwrap_or_default();
        let outside = env.ips.last().cloned().unwrap_or_default();
        Frontdoor {
            ca: tmp.join("pki/ca.crt"),
            env,
            client,
            tmp,
            inside,
            outside_node,
            outside,
            table: Default::default(),
            slow_backend: None,
        }
    }
}

impl Scenario for Frontdoor {
    const TITLE: &'static str = "FRONTDOOR";

    fn namespace(&self) -> &str {
        NS_OP
    }

    async fn run(&mut self, run: &mut Run) -> Result<()> {
        self.prepare().await?;
        self.install(run).await?;
        self.ingresses(run).await?;
        self.objects(run).await?;
        let slow = self.start_slow_requests(run).await?;
        self.held_back_by_default(run).await?;
        self.nginx_trusted(run).await?;
        self.traefik_checked(run).await?;
        self.timeouts_and_certificates(run, slow).await?;
        run.step("the answers, HTTP/3 beside TCP, per node, host and client address");
        for line in self.table.lock().map(|t| t.clone()).unwrap_or_default() {
            indent(line);
        }
        Ok(())
    }

    async fn cleanup(&mut self) {
        if std::env::var("H3I_FRONTDOOR_KEEP").is_ok_and(|v| v == "1") {
            println!(
                "H3I_FRONTDOOR_KEEP=1: objects, nginx, Traefik and {} left in place",
                self.tmp.display()
            );
            return;
        }
        self.remove_objects().await;
        if let Err(e) = self.namespaces_gone().await {
            println!("frontdoor cleanup: {e}");
        }
        let _ = std::fs::remove_dir_all(&self.tmp);
    }
}

/// Where a request comes from: the host (inside every allowlist) or a node's namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Origin<'a> {
    Host,
    Node(&'a str),
}

impl Apis for Frontdoor {
    fn client(&self) -> &Client {
        &self.client
    }
}

impl Frontdoor {
    /// Prints `line` and keeps it for the closing table.
    fn record(&self, line: String) {
        indent(&line);
        if let Ok(mut t) = self.table.lock() {
            t.push(line);
        }
    }

    /// `ip netns exec NODE` before `program` when the request comes from a node.
    async fn from(&self, from: Origin<'_>, program: &str, args: &[&str]) -> Result<String> {
        let out = match from {
            Origin::Host => output(program, args).await?,
            Origin::Node(node) => {
                let mut all = vec!["netns", "exec", node, program];
                all.extend(args);
                output("ip", &all).await?
            }
        };
        Ok(out.stdout)
    }

    /// The status of one HTTP/3 GET (aioquic) of `https://host:port/` sent to `addr`; fails
    /// when the handshake or the request does.
    async fn h3_status(&self, from: Origin<'_>, addr: &str, port: u16, host: &str) -> Result<u64> {
        self.h3_status_with(from, addr, port, host, &[]).await
    }

    /// As `h3_status`, the request carrying `headers` (`name: value`) of the client's own.
    async fn h3_status_with(
        &self,
        from: Origin<'_>,
        addr: &str,
        port: u16,
        host: &str,
        headers: &[&str],
    ) -> Result<u64> {
        let url = format!("https://{host}:{port}/");
        let resolve = format!("{host}:{port}:{addr}");
        let script = repo().join("tests/py/h3client.py");
        let (script, ca) = (script.to_string_lossy(), self.ca.to_string_lossy());
        let py = h3i_scenarios::h3::python();
        let args = [
            &*script,
            &url,
            "--resolve",
            &resolve,
            "--cacert",
            &ca,
            "--connect-timeout",
            "5",
            "--timeout",
            "20",
        ];
        let mut args = args.to_vec();
        for h in headers {
            args.extend(["--header", *h]);
        }
        let text = self.from(from, &py.to_string_lossy(), &args).await?;
        let rep: Value = serde_json::from_str(&text)
            .map_err(|_| h3i_scenarios::Error::Check(format!("h3client.py: no JSON: {text}")))?;
        let hs = &rep["connection"]["handshake"];
        if hs["ok"] != Value::Bool(true) {
            return fail(format!(
                "HTTP/3 {url} via {addr} from {from:?}: handshake failed: {hs}"
            ));
        }
        match rep["requests"][0]["status"].as_u64() {
            Some(s) => Ok(s),
            None => fail(format!(
                "HTTP/3 {url} via {addr}: no status: {}",
                rep["requests"][0]
            )),
        }
    }

    /// The status of one HTTPS GET over TCP (curl, HTTP/2) of `https://host:port/`.
    async fn tcp_status(&self, from: Origin<'_>, addr: &str, port: u16, host: &str) -> Result<u64> {
        let url = format!("https://{host}:{port}/");
        let resolve = format!("{host}:{port}:{addr}");
        let ca = self.ca.to_string_lossy();
        let args = [
            "-sS",
            "--http2",
            "--max-time",
            "10",
            "--cacert",
            &ca,
            "--resolve",
            &resolve,
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            &url,
        ];
        let text = self.from(from, "curl", &args).await?;
        text.trim()
            .parse()
            .or_else(|_| fail(format!("curl {url} via {addr} from {from:?}: {text:?}")))
    }

    /// Applies a listener: `class`, UDP `port`, metrics on `metrics`, `upstream` as given.
    async fn apply_listener(
        &self,
        name: &str,
        class: &str,
        port: u16,
        metrics: u16,
        upstream: Value,
    ) -> Result<()> {
        let obj = json!({"apiVersion": "h3-ingress.dev/v1alpha1", "kind": "Http3Listener",
            "metadata": {"name": name},
            "spec": {"ingressClassName": class, "port": port, "upstream": upstream,
                "metrics": {"address": format!("[::]:{metrics}")},
                "http": {"drainTimeoutSeconds": 2}, "accessLog": {"enabled": true}}});
        k8s::apply(&self.all::<Http3Listener>(), name, &obj).await?;
        Ok(())
    }

    /// The listener's status entry of `host` (listed: not served), if any.
    async fn host_status(&self, listener: &str, host: &str) -> Result<Option<HostStatus>> {
        let l = k8s::get(&self.all::<Http3Listener>(), listener).await?;
        let hosts = l
            .and_then(|l| l.status)
            .map(|s| s.hosts)
            .unwrap_or_default();
        Ok(hosts.into_iter().find(|h| h.name == host))
    }
}
