//! The front door's checks (a) to (d), each a step.

use h3_ingress::api::mirror::{mirror_name, HostsDocument, HOSTS_KEY};
use h3_ingress::api::{conditions, reasons, SecretRef};
use h3i_scenarios::h3::{self, Refusal, Target};
use h3i_scenarios::k8s::Apis;
use h3i_scenarios::poll::{until, wait_ok};
use h3i_scenarios::{ensure, expect_eq, indent, ok, Result, Run};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::networking::v1::Ingress;
use kube::ResourceExt;

use super::*;

/// The four answers that must agree: HTTP/3 and TCP, from inside and outside the allowlist.
#[derive(Debug, PartialEq, Eq)]
struct Verdicts {
    h3_inside: u64,
    h3_outside: u64,
    tcp_inside: u64,
    tcp_outside: u64,
}

impl Frontdoor {
    fn target<'a>(&'a self, addr: &'a str, host: &'a str, port: u16) -> Target<'a> {
        Target {
            addr,
            host,
            port,
            path: "/",
            cacert: &self.ca,
        }
    }

    /// The listener lists `host` as not served for `reason` with a message naming `names`;
    /// returns the message. The message is waited for too: the operator's watch of Traefik's
    /// kinds backs off up to 30 s while their CRDs are absent (installed after the operator),
    /// and says meanwhile that it cannot read the Middleware.
    async fn held(&self, listener: &str, host: &str, reason: &str, names: &str) -> Result<String> {
        let what = format!("{listener}: {host} not served, reason {reason}, naming {names:?}");
        until(90, &what, || async {
            let h = self.host_status(listener, host).await?;
            Ok(h.is_some_and(|h| h.reason == reason && h.message.contains(names)))
        })
        .await?;
        let message = self
            .host_status(listener, host)
            .await?
            .map(|h| h.message)
            .unwrap_or_default();
        ok(format!("{what}: {message}"));
        Ok(message)
    }

    /// The condition `ClientAddress` of `listener` has this status and reason.
    async fn client_address(&self, listener: &str, status: &str, reason: &str) -> Result<()> {
        let what = format!(
            "{listener}: {} {status} ({reason})",
            conditions::CLIENT_ADDRESS
        );
        wait_ok(60, &what, || async {
            k8s::condition_is(
                &self.client,
                listener,
                conditions::CLIENT_ADDRESS,
                status,
                reason,
            )
            .await
        })
        .await?;
        let c = k8s::condition(&self.client, listener, conditions::CLIENT_ADDRESS).await?;
        indent(c.map(|c| c.message).unwrap_or_default());
        Ok(())
    }

    /// HTTP/3 from inside answers 200 on every node (the data plane serves `host`).
    pub(super) async fn h3_served(&self, host: &str, port: u16) -> Result<()> {
        let what = format!("{host} answers over HTTP/3 on every node (UDP {port})");
        wait_ok(60, &what, || async {
            for ip in &self.env.ips {
                if self.h3_status(Origin::Host, ip, port, host).await? != 200 {
                    return Ok(false);
                }
            }
            Ok(true)
        })
        .await
    }

    /// Every node refuses the HTTP/3 handshake for `host` (no certificate for it).
    async fn h3_refused(&self, host: &str, port: u16) -> Result<()> {
        for ip in &self.env.ips {
            indent(h3::refused(&self.target(ip, host, port), Refusal::TlsAlert).await?);
        }
        Ok(())
    }

    /// The four verdicts for `host` on every node, each printed.
    async fn verdicts(&self, host: &str, udp: u16, tcp: u16) -> Result<Vec<Verdicts>> {
        let outside = Origin::Node(&self.outside_node);
        let mut all = Vec::new();
        for ip in &self.env.ips {
            let v = Verdicts {
                h3_inside: self.h3_status(Origin::Host, ip, udp, host).await?,
                h3_outside: self.h3_status(outside, ip, udp, host).await?,
                tcp_inside: self.tcp_status(Origin::Host, ip, tcp, host).await?,
                tcp_outside: self.tcp_status(outside, ip, tcp, host).await?,
            };
            self.record(format!(
                "{ip} {host}: inside {}: TCP {} HTTP/3 {}; outside {}: TCP {} HTTP/3 {}",
                self.inside, v.tcp_inside, v.h3_inside, self.outside, v.tcp_outside, v.h3_outside
            ));
            all.push(v);
        }
        Ok(all)
    }

    /// HTTP/3 answers exactly as TCP: the inside client 200, the outside one 403.
    async fn kept(&self, host: &str, udp: u16, tcp: u16) -> Result<()> {
        let want = Verdicts {
            h3_inside: 200,
            h3_outside: 403,
            tcp_inside: 200,
            tcp_outside: 403,
        };
        for v in self.verdicts(host, udp, tcp).await? {
            expect_eq(&format!("{host}: HTTP/3 as TCP"), &want, &v)?;
        }
        self.spoof_refused(host, udp).await?;
        ok(format!(
            "{host}: the allowlist holds over HTTP/3 exactly as over TCP on every node"
        ));
        Ok(())
    }

    /// The outside client claiming the inside address in its own forwarding headers still
    /// gets 403 over HTTP/3 on every node.
    async fn spoof_refused(&self, host: &str, udp: u16) -> Result<()> {
        let xff = format!("x-forwarded-for: {}", self.inside);
        let fwd = format!("forwarded: for={}", self.inside);
        let real = format!("x-real-ip: {}", self.inside);
        let headers = [xff.as_str(), fwd.as_str(), real.as_str()];
        for ip in &self.env.ips {
            let outside = Origin::Node(&self.outside_node);
            let s = self
                .h3_status_with(outside, ip, udp, host, &headers)
                .await?;
            self.record(format!(
                "{ip} {host}: outside {} claiming {} (X-Forwarded-For, Forwarded, X-Real-IP): HTTP/3 {s}",
                self.outside, self.inside
            ));
            expect_eq(&format!("{host}: spoofed headers over HTTP/3"), &403, &s)?;
        }
        Ok(())
    }

    /// (a) The installed listeners hold the allowlisted and client-certificate hosts back and
    /// say why; the unannotated host with the same nginx rule shows what serving them would do.
    pub(super) async fn held_back_by_default(&mut self, run: &mut Run) -> Result<()> {
        run.step(
            "(a) as installed: allowlisted hosts held back with the annotation or Middleware named",
        );
        let m = self
            .held(L_NGINX, GUARDED, reasons::CLIENT_ADDRESS_POLICY, WHITELIST)
            .await?;
        ensure!(
            m.contains(WHITELIST) && m.contains("clientAddress.trusted: true"),
            "{m}"
        );
        let allow = format!("Middleware {NS_APP}/allow (ipAllowList");
        self.held(L_TRAEFIK, T_GUARDED, reasons::CLIENT_ADDRESS_POLICY, &allow)
            .await?;
        let rate = format!("Middleware {NS_APP}/rate (rateLimit");
        self.held(L_TRAEFIK, T_RATE, reasons::CLIENT_ADDRESS_POLICY, &rate)
            .await?;
        for l in [L_NGINX, L_TRAEFIK] {
            self.client_address(l, "False", reasons::UNTRUSTED_FORWARDED_HEADERS)
                .await?;
        }
        self.h3_served(OPEN, UDP_NGINX).await?;
        self.h3_refused(GUARDED, UDP_NGINX).await?;
        self.h3_refused(T_GUARDED, UDP_TRAEFIK).await?;
        let ing = self.ns::<Ingress>(NS_APP).get("guarded").await?;
        let uid = ing.uid().unwrap_or_default();
        let warned = k8s::events(
            &self.client,
            "Ingress",
            &uid,
            Some("Warning"),
            Some(reasons::CLIENT_ADDRESS_POLICY),
        )
        .await?;
        ensure!(
            !warned.is_empty(),
            "no {} event on Ingress {NS_APP}/guarded",
            reasons::CLIENT_ADDRESS_POLICY
        );
        ok(format!(
            "event on Ingress {NS_APP}/guarded: {}",
            k8s::event_line(&warned[0])
        ));
        run.step(format!(
            "(a) the bypass the hold-back prevents: {OPEN} has the same nginx allowlist and no annotation"
        ));
        let v = self.verdicts(OPEN, UDP_NGINX, TCP_NGINX).await?;
        ensure!(
            v.iter().all(|v| v.h3_outside == 200 && v.tcp_outside == 403),
            "{OPEN}: want the outside client admitted over HTTP/3 (nginx judges 127.0.0.1) and refused over TCP: {v:?}"
        );
        ok(format!("{OPEN}: outside client {} got 200 over HTTP/3, 403 over TCP (what {GUARDED} is spared)", self.outside));
        self.plugin().await
    }

    /// `kubectl h3-ingress status`: the held-back host's row, reason and message.
    async fn plugin(&self) -> Result<()> {
        let link = self.tmp.join("kubectl-h3_ingress");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&self.env.binary, &link).map_err(|source| {
            h3i_scenarios::Error::Io {
                context: "plugin link".into(),
                source,
            }
        })?;
        let out = h3i_scenarios::cmd::run(&link.to_string_lossy(), &["status", L_NGINX]).await?;
        indent(&out);
        let row = out
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{GUARDED} ")));
        ensure!(
            row.is_some_and(|r| r.contains(reasons::CLIENT_ADDRESS_POLICY)),
            "kubectl h3-ingress status: no {GUARDED} row with {}",
            reasons::CLIENT_ADDRESS_POLICY
        );
        ensure!(
            out.contains("hosts held back on purpose"),
            "kubectl h3-ingress status: no held-back line"
        );
        ok("kubectl h3-ingress status shows the held-back host, its reason and the annotation");
        Ok(())
    }

    /// (b) nginx: the real-IP module trusts 127.0.0.1, the listener declares it.
    pub(super) async fn nginx_trusted(&mut self, run: &mut Run) -> Result<()> {
        run.step(format!(
            "(b) nginx takes X-Forwarded-For from 127.0.0.1 (real_ip), {L_NGINX} declares clientAddress.trusted"
        ));
        self.nginx(true, true).await?;
        let up = json!({"address": format!("127.0.0.1:{TCP_NGINX}"), "clientAddress": {"trusted": true}});
        self.apply_listener(L_NGINX, "nginx", UDP_NGINX, 9476, up)
            .await?;
        self.client_address(L_NGINX, "True", reasons::TRUSTED_FORWARDED_HEADERS)
            .await?;
        self.h3_served(GUARDED, UDP_NGINX).await?;
        self.kept(GUARDED, UDP_NGINX, TCP_NGINX).await?;
        self.kept(OPEN, UDP_NGINX, TCP_NGINX).await
    }

    /// (b) Traefik: trusted headers do not serve a Middleware that judges the peer (checked,
    /// not believed); PROXY protocol to entryPoint h3proxy does.
    pub(super) async fn traefik_checked(&mut self, run: &mut Run) -> Result<()> {
        run.step(format!(
            "(b) {L_TRAEFIK} declares trusted forwarded headers: the Middleware judges the peer, still held back"
        ));
        let up = json!({"address": format!("127.0.0.1:{TCP_TRAEFIK}"), "clientAddress": {"trusted": true}});
        self.apply_listener(L_TRAEFIK, "traefik", UDP_TRAEFIK, 9486, up)
            .await?;
        self.client_address(L_TRAEFIK, "True", reasons::TRUSTED_FORWARDED_HEADERS)
            .await?;
        let depth = "ipStrategy.depth: 1";
        self.held(L_TRAEFIK, T_GUARDED, reasons::CLIENT_ADDRESS_POLICY, depth)
            .await?;
        self.h3_refused(T_GUARDED, UDP_TRAEFIK).await?;
        run.step(format!(
            "(b) {L_TRAEFIK} sends PROXY protocol to h3proxy (127.0.0.1:{TCP_TRAEFIK_PROXY}): served, the allowlist holds"
        ));
        let up =
            json!({"address": format!("127.0.0.1:{TCP_TRAEFIK_PROXY}"), "proxyProtocol": true});
        self.apply_listener(L_TRAEFIK, "traefik", UDP_TRAEFIK, 9486, up)
            .await?;
        self.client_address(L_TRAEFIK, "True", reasons::PROXY_PROTOCOL)
            .await?;
        self.h3_served(T_GUARDED, UDP_TRAEFIK).await?;
        self.kept(T_GUARDED, UDP_TRAEFIK, TCP_TRAEFIK).await?;
        self.traefik_log_names_the_client().await?;
        self.buckets().await
    }

    /// Traefik's rateLimit counts each HTTP/3 client apart, as over TCP: the inside client
    /// spends its burst over HTTP/3 and gets 429, the outside one still gets 200. Each
    /// client's TCP requests are printed beside them. One node (each runs its own Traefik,
    /// with its own buckets); run once per scenario (a bucket refills one request a minute).
    async fn buckets(&self) -> Result<()> {
        let ip = &self.env.ips[0];
        let outside = Origin::Node(&self.outside_node);
        // Served since `h3_served(T_GUARDED)`: one listener's hosts reach its pods in one
        // document. The inside client's first request spends its first token.
        let mut inside = Vec::new();
        while inside.last() != Some(&429) && inside.len() <= RATE_BURST as usize + 1 {
            inside.push(
                self.h3_status(Origin::Host, ip, UDP_TRAEFIK, T_RATE)
                    .await?,
            );
        }
        let h3_outside = self.h3_status(outside, ip, UDP_TRAEFIK, T_RATE).await?;
        let tcp_inside = self
            .tcp_status(Origin::Host, ip, TCP_TRAEFIK, T_RATE)
            .await?;
        let tcp_outside = self.tcp_status(outside, ip, TCP_TRAEFIK, T_RATE).await?;
        self.record(format!(
            "{ip} {T_RATE} (rateLimit {RATE_BURST}/min per source): inside {} HTTP/3 {inside:?} \
             then TCP {tcp_inside}; outside {} HTTP/3 {h3_outside} then TCP {tcp_outside}",
            self.inside, self.outside
        ));
        ensure!(
            inside.last() == Some(&429) && inside[..inside.len() - 1].iter().all(|s| *s == 200),
            "{T_RATE}: the inside client's HTTP/3 requests {inside:?}, want 200s then 429 within {} requests",
            RATE_BURST + 2
        );
        expect_eq(
            &format!("{T_RATE}: the outside client's own bucket over HTTP/3"),
            &200,
            &h3_outside,
        )?;
        // The TCP answers are recorded above, not asserted: whether a client's HTTP/3 and TCP
        // requests share a bucket is Traefik's to decide (one router per entryPoint: they do not).
        ok(format!("{T_RATE}: one rateLimit bucket per HTTP/3 client"));
        Ok(())
    }

    /// Traefik's access log: the outside client's HTTP/3 requests were judged by its address.
    async fn traefik_log_names_the_client(&self) -> Result<()> {
        let state = std::env::var("H3I_CLUSTER_STATE").unwrap_or_default();
        let mut found = 0;
        for node in &self.env.nodes {
            let log = std::fs::read_to_string(format!("{state}/traefik/{node}.access.log"))
                .unwrap_or_default();
            for line in log
                .lines()
                .filter(|l| l.contains(T_GUARDED) && l.contains("h3proxy"))
            {
                let v: Value = serde_json::from_str(line).unwrap_or_default();
                let addr = v["ClientAddr"].as_str().unwrap_or_default();
                if addr.starts_with(&format!("{}:", self.outside)) {
                    ensure!(
                        v["DownstreamStatus"] == 403,
                        "outside client admitted: {line}"
                    );
                    found += 1;
                }
            }
        }
        ensure!(
            found >= self.env.nodes.len(),
            "Traefik logged {found} h3proxy requests from {}",
            self.outside
        );
        ok(format!(
            "Traefik's access log: {found} requests on h3proxy with ClientAddr {}:port (the HTTP/3 client), 403",
            self.outside
        ));
        Ok(())
    }

    /// (c) the read timeout in the mirror and the slow responses; (d) client certificates
    /// refused.
    pub(super) async fn timeouts_and_certificates(
        &mut self,
        run: &mut Run,
        slow: super::slow::SlowRequests,
    ) -> Result<()> {
        run.step(format!(
            "(c) {SLOW}'s proxy-read-timeout \"120\" in its certificate mirror"
        ));
        let source = SecretRef {
            namespace: NS_APP.into(),
            name: "slow-tls".into(),
        };
        let name = mirror_name(L_NGINX, &source);
        let m = self.ns::<Secret>(NS_HOSTS).get(&name).await?;
        let json = m
            .data
            .and_then(|d| d.get(HOSTS_KEY).cloned())
            .map(|b| b.0)
            .unwrap_or_default();
        let doc: HostsDocument = serde_json::from_slice(&json).unwrap_or_default();
        indent(String::from_utf8_lossy(&json));
        let h = doc.hosts.iter().find(|h| h.name == SLOW);
        ensure!(
            h.is_some_and(|h| h.response_timeout_seconds == Some(120)
                && h.response_body_idle_timeout_seconds == Some(120)),
            "mirror {NS_HOSTS}/{name}: want {SLOW} with 120 s response and response body idle timeouts"
        );
        ok(format!("{NS_HOSTS}/{name}: {SLOW} responseTimeoutSeconds 120, responseBodyIdleTimeoutSeconds 120"));
        self.slow_answered(run, slow).await?;
        run.step(format!("(d) client certificates: {MTLS} (auth-tls-verify-client) and {T_MTLS} (TLSOption) refused"));
        let verify = "auth-tls-verify-client";
        self.held(L_NGINX, MTLS, reasons::CLIENT_CERTIFICATE_REQUIRED, verify)
            .await?;
        let option = format!("TLSOption {NS_APP}/mtls");
        self.held(
            L_TRAEFIK,
            T_MTLS,
            reasons::CLIENT_CERTIFICATE_REQUIRED,
            &option,
        )
        .await?;
        self.h3_refused(MTLS, UDP_NGINX).await?;
        self.h3_refused(T_MTLS, UDP_TRAEFIK).await
    }
}
