//! The Traefik check's requests (curl over TCP, PROXY protocol headers from
//! `tests/py/proxyv2_get.py`) and their verdicts: a status, and the fields of the line the
//! request left in the node's access log.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use h3i_scenarios::cmd::{output, repo, run as sh};
use h3i_scenarios::poll::until;
use h3i_scenarios::{fail, ok, Result, Run};
use serde_json::Value;

use super::{fqdn, traefik_sh, TraefikCheck, BODY, CLIENT_OK, CLIENT_OK6, CLIENT_OTHER};

/// The access log fields a verdict may name (`-` when the line lacks one).
const FIELDS: [&str; 7] = [
    "DownstreamStatus",
    "ClientHost",
    "ClientAddr",
    "request_X-Forwarded-For",
    "request_X-Real-Ip",
    "entryPointName",
    "ServiceAddr",
];

/// One request's answer and where its node's access log stood before it.
pub(super) struct Sent {
    code: String,
    body: String,
    log: PathBuf,
    lines_before: usize,
}

/// Where a request is sent from: the host, or a node's namespace.
#[derive(Clone, Copy)]
enum From<'a> {
    Host,
    Node(&'a str),
}

fn lines_of(path: &PathBuf) -> usize {
    std::fs::read_to_string(path).map_or(0, |t| t.lines().count())
}

/// `FIELD=VALUE ...` of a JSON access log line, in [`FIELDS`]' order.
pub(super) fn fields_of(line: &str) -> String {
    let v: Value = serde_json::from_str(line).unwrap_or_default();
    let field = |k: &str| match &v[k] {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    };
    FIELDS
        .iter()
        .map(|k| format!("{k}={}", field(k)))
        .collect::<Vec<_>>()
        .join(" ")
}

fn bracketed(addr: &str) -> String {
    if addr.contains(':') {
        format!("[{addr}]")
    } else {
        addr.to_string()
    }
}

impl TraefikCheck {
    async fn access_log(&self, node: usize) -> Result<PathBuf> {
        let out = sh(&traefik_sh(), &["access-log", &self.env.nodes[node]]).await?;
        Ok(PathBuf::from(out.trim()))
    }

    async fn exec(&self, from: From<'_>, program: &str, args: &[&str]) -> Result<(String, i32)> {
        let out = match from {
            From::Host => output(program, args).await?,
            From::Node(node) => {
                let mut all = vec!["netns", "exec", node, program];
                all.extend(args);
                output("ip", &all).await?
            }
        };
        Ok((out.stdout, out.status.unwrap_or(-1)))
    }

    /// One HTTPS GET of `NAME.traefik.h3i.test` from `from` to node `node`'s `addr:port`.
    async fn request(
        &self,
        node: usize,
        from: From<'_>,
        name: &str,
        addr: &str,
        port: u16,
        extra: &[&str],
    ) -> Result<Sent> {
        let log = self.access_log(node).await?;
        let lines_before = lines_of(&log);
        let host = fqdn(name);
        let body_file = self.tmp.join("body");
        let _ = std::fs::remove_file(&body_file);
        let resolve = format!("{host}:{port}:{}", bracketed(addr));
        let url = format!("https://{host}:{port}/");
        let (ca, body_path) = (self.ca.to_string_lossy(), body_file.to_string_lossy());
        let mut args = vec!["-s", "-m", "10", "-o", &body_path, "-w", "%{http_code}"];
        args.extend(["--cacert", &ca, "--resolve", &resolve]);
        args.extend(extra);
        args.push(&url);
        let (stdout, status) = self.exec(from, "curl", &args).await?;
        let code = if status == 0 {
            stdout.trim().to_string()
        } else {
            format!("curl exit {status}")
        };
        let body = std::fs::read_to_string(&body_file).unwrap_or_default();
        Ok(Sent {
            code,
            body,
            log,
            lines_before,
        })
    }

    /// The same through h3proxy (8443) with a PROXY protocol header of `version` claiming
    /// `source` (`IP:PORT`).
    async fn proxy_request(
        &self,
        node: usize,
        from: From<'_>,
        name: &str,
        addr: &str,
        source: &str,
        version: &str,
    ) -> Result<Sent> {
        let log = self.access_log(node).await?;
        let lines_before = lines_of(&log);
        let script = repo().join("tests/py/proxyv2_get.py");
        let (script, ca) = (script.to_string_lossy(), self.ca.to_string_lossy());
        let (connect, sni) = (format!("{}:8443", bracketed(addr)), fqdn(name));
        let args = [
            &*script,
            "--connect",
            &connect,
            "--source",
            source,
            "--sni",
            &sni,
            "--cafile",
            &ca,
            "--version",
            version,
        ];
        let (stdout, _) = self.exec(from, "python3", &args).await?;
        let v: Value = serde_json::from_str(stdout.trim()).unwrap_or_default();
        let code = match (&v["status"], &v["error"]) {
            (Value::Number(n), _) => n.to_string(),
            (_, Value::String(e)) => format!("error: {e}"),
            _ => format!("error: no JSON from proxyv2_get.py: {stdout}"),
        };
        Ok(Sent {
            code,
            body: String::new(),
            log,
            lines_before,
        })
    }

    /// The request's status is `want` and (for a response) its access log line has every
    /// `FIELD=VALUE` of `fields`; returns that line's fields.
    async fn expect(
        &self,
        what: &str,
        sent: &Sent,
        want: &str,
        fields: &[String],
    ) -> Result<String> {
        if sent.code != want {
            return fail(format!("{what}: status {}, want {want}", sent.code));
        }
        let deadline = Instant::now() + Duration::from_secs(3);
        let logged = loop {
            let text = std::fs::read_to_string(&sent.log).unwrap_or_default();
            if let Some(line) = text.lines().nth(sent.lines_before) {
                break fields_of(line);
            }
            if Instant::now() >= deadline {
                break "(no access log line)".to_string();
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        for kv in fields {
            if !format!(" {logged} ").contains(&format!(" {kv} ")) {
                return fail(format!("{what}: access log has '{logged}', want {kv}"));
            }
        }
        ok(format!("{what}: {}; logged {logged}", sent.code));
        Ok(logged)
    }

    pub(super) async fn routing(&self, run: &mut Run) -> Result<()> {
        run.step(format!("routing: open.traefik.h3i.test on every node, IPv4 and IPv6, to the ClusterIP {} through kube-proxy", self.cluster_ip));
        until(30, "Traefik routes open.traefik.h3i.test", || async {
            let s = self
                .request(0, From::Host, "open", &self.env.ips[0], 443, &[])
                .await?;
            Ok(s.code == "200")
        })
        .await?;
        let (h4, h6) = (&self.host4, &self.host6);
        for (i, node) in self.env.nodes.iter().enumerate() {
            let ip = &self.env.ips[i];
            let s = self.request(i, From::Host, "open", ip, 443, &[]).await?;
            if s.body.trim_end() != BODY {
                return fail(format!("open via {ip}: body '{}'", s.body));
            }
            let want = [
                format!("ClientHost={h4}"),
                "entryPointName=websecure".into(),
                format!("ServiceAddr={}:80", self.cluster_ip),
                format!("request_X-Real-Ip={h4}"),
                "request_X-Forwarded-For=-".into(),
            ];
            let what = format!("open via {node} {ip}:443 from the host");
            self.expect(&what, &s, "200", &want).await?;
            let ip6 = &self.env.ips6[i];
            let s = self.request(i, From::Host, "open", ip6, 443, &[]).await?;
            let what = format!("open via {node} [{ip6}]:443 from the host");
            self.expect(&what, &s, "200", &[format!("ClientHost={h6}")])
                .await?;
        }
        Ok(())
    }

    pub(super) async fn allow_list(&self, run: &mut Run) -> Result<()> {
        run.step("ipAllowList, default ipStrategy: the connection's address decides");
        let n = self.env.nodes.len();
        let h4 = &self.host4;
        for (i, node) in self.env.nodes.iter().enumerate() {
            let (other, other_ip) = (&self.env.nodes[(i + 1) % n], &self.env.ips[(i + 1) % n]);
            let ip = &self.env.ips[i];
            let s = self.request(i, From::Host, "allow", ip, 443, &[]).await?;
            let what = format!("allow via {node} from the host ({h4}, in the list)");
            self.expect(&what, &s, "200", &[format!("ClientHost={h4}")])
                .await?;
            let s = self
                .request(i, From::Node(other), "allow", ip, 443, &[])
                .await?;
            let what = format!("allow via {node} from {other} ({other_ip}, not in it)");
            self.expect(&what, &s, "403", &[format!("ClientHost={other_ip}")])
                .await?;
        }
        Ok(())
    }

    pub(super) async fn forwarded_headers(&self, run: &mut Run) -> Result<()> {
        let h4 = self.host4.clone();
        run.step(format!(
            "forwarded headers: websecure trusts {h4} only; ipStrategy.depth 1 reads X-Forwarded-For"
        ));
        let (ip0, n1, ip1) = (&self.env.ips[0], &self.env.nodes[1], &self.env.ips[1]);
        let xff = |v: &str| format!("X-Forwarded-For: {v}");
        let ok_xff = xff(CLIENT_OK);
        let s = self
            .request(0, From::Host, "xff", ip0, 443, &["-H", &ok_xff])
            .await?;
        let want = [
            format!("ClientHost={CLIENT_OK}"),
            format!("request_X-Forwarded-For={CLIENT_OK}"),
            format!("request_X-Real-Ip={h4}"),
        ];
        let what = format!("xff, trusted sender, X-Forwarded-For {CLIENT_OK}");
        let logged = self.expect(&what, &s, "200", &want).await?;
        if !logged.contains(&format!("ClientAddr={h4}:")) {
            return fail(format!("ClientAddr is not the connection's ({logged})"));
        }
        let other_xff = xff(CLIENT_OTHER);
        let s = self
            .request(0, From::Host, "xff", ip0, 443, &["-H", &other_xff])
            .await?;
        let what = format!("xff, trusted sender, X-Forwarded-For {CLIENT_OTHER}");
        self.expect(&what, &s, "403", &[format!("ClientHost={CLIENT_OTHER}")])
            .await?;
        let both = xff(&format!("{CLIENT_OTHER}, {CLIENT_OK}"));
        let s = self
            .request(0, From::Host, "xff", ip0, 443, &["-H", &both])
            .await?;
        let what = format!(
            "xff, trusted sender, X-Forwarded-For '{CLIENT_OTHER}, {CLIENT_OK}' (depth 1: the last)"
        );
        self.expect(&what, &s, "200", &[]).await?;
        let s = self.request(0, From::Host, "xff", ip0, 443, &[]).await?;
        let what = "xff, trusted sender, no X-Forwarded-For (depth 1 finds no address)";
        self.expect(what, &s, "403", &[format!("ClientHost={h4}")])
            .await?;
        let real = format!("X-Real-Ip: {CLIENT_OK}");
        let extra = ["-H", ok_xff.as_str(), "-H", real.as_str()];
        let s = self
            .request(0, From::Node(n1), "xff", ip0, 443, &extra)
            .await?;
        let want = [
            format!("ClientHost={ip1}"),
            "request_X-Forwarded-For=-".into(),
            format!("request_X-Real-Ip={ip1}"),
        ];
        let what = format!("xff, untrusted sender {ip1} with X-Forwarded-For and X-Real-Ip {CLIENT_OK} (both removed)");
        self.expect(&what, &s, "403", &want).await?;
        self.not_read(ip0, &ok_xff, &other_xff).await
    }

    /// A Middleware with the default ipStrategy does not read X-Forwarded-For, even from a
    /// trusted sender (though Traefik logs it as the client).
    async fn not_read(&self, ip0: &str, ok_xff: &str, other_xff: &str) -> Result<()> {
        let s = self
            .request(0, From::Host, "conn", ip0, 443, &["-H", ok_xff])
            .await?;
        let want = [
            format!("ClientHost={CLIENT_OK}"),
            format!("request_X-Forwarded-For={CLIENT_OK}"),
        ];
        let what = format!(
            "conn (default ipStrategy), trusted sender, X-Forwarded-For {CLIENT_OK} (not read)"
        );
        self.expect(&what, &s, "403", &want).await?;
        let s = self
            .request(0, From::Host, "allow", ip0, 443, &["-H", other_xff])
            .await?;
        let what = format!(
            "allow (default ipStrategy), trusted sender, X-Forwarded-For {CLIENT_OTHER} (not read)"
        );
        self.expect(&what, &s, "200", &[format!("ClientHost={CLIENT_OTHER}")])
            .await?;
        Ok(())
    }

    pub(super) async fn proxy_protocol(&self, run: &mut Run) -> Result<()> {
        let (h4, h6) = (self.host4.clone(), self.host6.clone());
        run.step(format!("PROXY protocol on h3proxy :8443 (trusted: {h4}, {h6}): the header's source is the connection's address"));
        for (i, node) in self.env.nodes.iter().enumerate() {
            let ip = &self.env.ips[i];
            let src = format!("{CLIENT_OK}:40000");
            let s = self
                .proxy_request(i, From::Host, "conn", ip, &src, "2")
                .await?;
            let want = [
                format!("ClientHost={CLIENT_OK}"),
                format!("ClientAddr={src}"),
                "entryPointName=h3proxy".into(),
                format!("request_X-Real-Ip={CLIENT_OK}"),
            ];
            let what = format!("conn via {node}:8443, PROXY v2 from {src}");
            self.expect(&what, &s, "200", &want).await?;
        }
        let ip0 = self.env.ips[0].clone();
        let src = format!("{CLIENT_OTHER}:40001");
        let s = self
            .proxy_request(0, From::Host, "conn", &ip0, &src, "2")
            .await?;
        let want = [
            format!("ClientHost={CLIENT_OTHER}"),
            format!("ClientAddr={src}"),
        ];
        self.expect(&format!("conn, PROXY v2 from {src}"), &s, "403", &want)
            .await?;
        let (ip6, src) = (&self.env.ips6[0], format!("[{CLIENT_OK6}]:40002"));
        let s = self
            .proxy_request(0, From::Host, "conn", ip6, &src, "2")
            .await?;
        let what = format!("conn via [{ip6}]:8443, PROXY v2 (TCP6) from {src}");
        self.expect(&what, &s, "200", &[format!("ClientHost={CLIENT_OK6}")])
            .await?;
        self.proxy_v1_and_untrusted(&ip0).await
    }

    async fn proxy_v1_and_untrusted(&self, ip0: &str) -> Result<()> {
        let src = format!("{CLIENT_OK}:40003");
        let s = self
            .proxy_request(0, From::Host, "conn", ip0, &src, "1")
            .await?;
        let what = format!("conn, PROXY v1 from {src}");
        self.expect(&what, &s, "200", &[format!("ClientAddr={src}")])
            .await?;
        let (n1, ip1) = (&self.env.nodes[1], &self.env.ips[1]);
        let src = format!("{CLIENT_OK}:40004");
        let s = self
            .proxy_request(0, From::Node(n1), "conn", ip0, &src, "2")
            .await?;
        let want = [
            format!("ClientHost={ip1}"),
            "entryPointName=h3proxy".into(),
            format!("request_X-Real-Ip={ip1}"),
        ];
        let what = format!("conn, PROXY v2 from {src} sent by the untrusted {ip1} (header read and ignored: its own address)");
        self.expect(&what, &s, "403", &want).await?;
        let s = self.request(0, From::Host, "conn", ip0, 8443, &[]).await?;
        let h4 = &self.host4;
        let what = format!(
            "conn via :8443 from the trusted {h4} without a PROXY header (allowed; its own address)"
        );
        let want = [format!("ClientHost={h4}"), "entryPointName=h3proxy".into()];
        self.expect(&what, &s, "403", &want).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_line_gives_its_fields_in_order_and_dashes_for_the_absent() {
        let line = r#"{"ClientHost":"10.79.0.254","ClientAddr":"10.79.0.254:51234","DownstreamStatus":403,"entryPointName":"websecure","request_X-Real-Ip":"10.79.0.254"}"#;
        assert_eq!(
            fields_of(line),
            "DownstreamStatus=403 ClientHost=10.79.0.254 ClientAddr=10.79.0.254:51234 \
             request_X-Forwarded-For=- request_X-Real-Ip=10.79.0.254 entryPointName=websecure \
             ServiceAddr=-"
        );
        assert!(fields_of("not json").starts_with("DownstreamStatus=- "));
    }
}
