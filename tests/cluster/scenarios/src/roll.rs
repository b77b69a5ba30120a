//! A roll under clients (the rollout and upgrade scenarios): the application (a throttled
//! 2 MiB file behind nginx on every node, an annotated Ingress, an Http3Listener), three
//! aioquic clients per node (`tests/py/rollclient.py`: a new connection per request every
//! 200 ms, a kept connection, a slow download), and the verdict on what they saw, node by node:
//! - new connections: every request answered 200 and none slower than `max_new_ms` (new
//!   connections must not wait for the old process's drain);
//! - the kept connection: every request answered, on it or, after the server closed it with
//!   GOAWAY (H3_NO_ERROR) or refused the request unprocessed (H3_REQUEST_REJECTED), on a retry;
//!   a retried attempt must appear in no upstream access log (nothing processed was lost); a
//!   connection the server closed with an error is broken;
//! - the slow download: complete, 200, the expected bytes and SHA-256.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;

use serde_json::{json, Value};
use tokio::process::{Child, Command};

use crate::cmd::repo;
use crate::error::IoContext;
use crate::poll::wait_ok;
use crate::{app, fail, Env, Nginx, Pki, Result};

const H3_NO_ERROR: u64 = 0x100;
const H3_REQUEST_REJECTED: u64 = 0x10B;

/// The application a roll runs under.
pub struct RollApp<'a> {
    pub name: &'a str,
    pub host: &'a str,
    pub ns_app: &'a str,
    pub class: &'a str,
    pub listener: &'a str,
    /// `http.drainTimeoutSeconds`: the slow download must finish within it.
    pub drain: u32,
    pub slow_bytes: usize,
}

impl RollApp<'_> {
    /// A throw-away CA and leaf (`DIR/pki`), the 2 MiB file under `/slow/` (its SHA-256
    /// returned), nginx for the host on every node (the caller made it with the throttled
    /// location), namespace, Secret `NAME-tls`, IngressClass, the annotated Ingress `NAME` and
    /// the Http3Listener (upstream the node's nginx).
    pub async fn stand_up(
        &self,
        env: &Env,
        client: &kube::Client,
        dir: &Path,
        nginx: &Nginx,
    ) -> Result<String> {
        let pki = Pki::new(&dir.join("pki"), &format!("h3i-{}-ca", self.name))?;
        let leaf = pki.leaf(self.host, self.host)?;
        let slow = nginx.www().join("slow");
        std::fs::create_dir_all(&slow).context(|| format!("mkdir {}", slow.display()))?;
        let bytes = crate::random_bytes(self.slow_bytes)?;
        let sha = crate::pki::sha256_hex(&bytes);
        std::fs::write(slow.join("2m.bin"), bytes).context(|| "write 2m.bin".into())?;
        for node in &env.nodes {
            nginx.start(node, &[(self.host, &leaf)]).await?;
        }
        app::namespace(client, self.ns_app, &[]).await?;
        let secret = format!("{}-tls", self.name);
        app::tls_secret(client, self.ns_app, &secret, &leaf).await?;
        app::ingress_class(
            client,
            self.class,
            &format!("example.com/h3i-{}", self.name),
        )
        .await?;
        app::ingress(
            client,
            self.ns_app,
            self.name,
            self.class,
            self.host,
            &secret,
        )
        .await?;
        let spec = json!({"ingressClassName": self.class, "upstream": {"address": "127.0.0.1:443"},
            "http": {"drainTimeoutSeconds": self.drain}});
        app::listener(client, self.listener, spec).await?;
        Ok(sha)
    }
}

/// The clients of one roll: one rollclient.py per node.
pub struct Clients {
    pub prefix: String,
    children: Vec<Child>,
    /// (node, result file, stderr file)
    files: Vec<(String, PathBuf, PathBuf)>,
}

impl Clients {
    /// rollclient.py against every node for `seconds` (results in `DIR/PREFIXclients-I.json`,
    /// request ids `PREFIXNODE-`); returns once all of them run.
    pub async fn start(
        env: &Env,
        dir: &Path,
        host: &str,
        prefix: &str,
        seconds: u64,
        drain: u32,
    ) -> Result<Clients> {
        let mut c = Clients {
            prefix: prefix.into(),
            children: Vec::new(),
            files: Vec::new(),
        };
        let ca = dir.join("pki/ca.crt");
        let mut ready = Vec::new();
        for (i, (ip, node)) in env.ips.iter().zip(&env.nodes).enumerate() {
            let out = dir.join(format!("{prefix}clients-{i}.json"));
            let err = dir.join(format!("{prefix}clients-{i}.err"));
            let r = dir.join(format!("{prefix}ready-{i}"));
            let child = Command::new(crate::h3::python())
                .arg(repo().join("tests/py/rollclient.py"))
                .args(["--host", host, "--addr", ip, "--port", "443", "--cacert"])
                .arg(&ca)
                .args(["--duration", &seconds.to_string(), "--interval", "0.2"])
                .args([
                    "--slow-path",
                    "/slow/2m.bin",
                    "--slow-timeout",
                    &(drain + 30).to_string(),
                ])
                .arg("--ready-file")
                .arg(&r)
                .args(["--id-prefix", &format!("{prefix}{node}-")])
                .stdin(Stdio::null())
                .stdout(
                    std::fs::File::create(&out).context(|| format!("create {}", out.display()))?,
                )
                .stderr(
                    std::fs::File::create(&err).context(|| format!("create {}", err.display()))?,
                )
                .kill_on_drop(true)
                .spawn()
                .context(|| "spawn rollclient.py".into())?;
            c.children.push(child);
            c.files.push((node.clone(), out, err));
            ready.push(r);
        }
        let what = format!("the clients run on {}", env.ips.join(" "));
        wait_ok(30, &what, || async { Ok(ready.iter().all(|r| r.exists())) }).await?;
        Ok(c)
    }

    /// Waits for every client; one that failed to run fails the test.
    pub async fn done(&mut self) -> Result<()> {
        for (child, (_, _, err)) in self.children.iter_mut().zip(&self.files) {
            let status = child
                .wait()
                .await
                .context(|| "wait for rollclient.py".into())?;
            if !status.success() {
                let text = std::fs::read_to_string(err).unwrap_or_default();
                return fail(format!("a client run failed ({status}): {text}"));
            }
        }
        self.children.clear();
        Ok(())
    }

    /// Kills the clients still running (clean-up).
    pub fn kill(&mut self) {
        for c in &mut self.children {
            let _ = c.start_kill();
        }
    }

    /// The clients' reports by node.
    pub fn results(&self) -> Result<Vec<(String, Value)>> {
        let mut out = Vec::new();
        for (node, file, _) in &self.files {
            let text =
                std::fs::read_to_string(file).context(|| format!("read {}", file.display()))?;
            let doc = serde_json::from_str(&text).map_err(|source| crate::Error::Json {
                context: file.display().to_string(),
                source,
            })?;
            out.push((node.clone(), doc));
        }
        Ok(out)
    }

    /// When each node's slow download ended (seconds since the epoch).
    pub fn slow_ends(&self) -> Result<Vec<f64>> {
        Ok(self
            .results()?
            .iter()
            .map(|(_, d)| {
                d["slow"]["start"].as_f64().unwrap_or(0.0)
                    + d["slow"]["ms"].as_f64().unwrap_or(0.0) / 1000.0
            })
            .collect())
    }
}

/// What the slow download must be, and how long a new connection may take.
pub struct Want<'a> {
    pub slow_bytes: u64,
    pub slow_sha256: &'a str,
    pub max_new_ms: f64,
}

/// The request ids nginx logged (`id=` in the query string) in these access logs. A log that
/// cannot be read fails: read as empty, it would hide every retried request that was processed.
pub fn processed_ids(logs: &[PathBuf]) -> Result<BTreeSet<String>> {
    let mut ids = BTreeSet::new();
    for p in logs {
        let bytes = std::fs::read(p).context(|| format!("read the access log {}", p.display()))?;
        let text = String::from_utf8_lossy(&bytes);
        for line in text.lines() {
            if let Some(at) = line.find("id=") {
                let id = line[at + 3..].split_whitespace().next().unwrap_or_default();
                let id = id
                    .split('&')
                    .next()
                    .unwrap_or_default()
                    .trim_end_matches('"');
                ids.insert(id.to_string());
            }
        }
    }
    Ok(ids)
}

/// The kept connection's counts: requests, failed, retried attempts, broken connections,
/// retried attempts that were processed upstream anyway.
#[derive(Debug, PartialEq)]
pub struct Kept {
    pub requests: usize,
    pub failed: usize,
    pub retried: usize,
    pub broken: usize,
    pub lost: Vec<String>,
}

/// A result whose `error` is null; one without the key is a client that broke its format.
fn is_ok(r: &Value) -> bool {
    r.get("error").is_some_and(Value::is_null)
}

/// Judges the kept connection's requests and connections against the processed ids.
pub fn kept_verdict(kept: &[Value], conns: &[Value], processed: &BTreeSet<String>) -> Kept {
    let mut by_n: BTreeMap<String, Vec<&Value>> = BTreeMap::new();
    for r in kept {
        let id = r["id"].as_str().unwrap_or_default();
        let n = id.rsplit_once("-a").map_or(id, |(n, _)| n);
        by_n.entry(n.to_string()).or_default().push(r);
    }
    let failed = by_n
        .values()
        .filter(|a| !a.iter().any(|r| is_ok(r)))
        .count();
    let retried: Vec<&Value> = by_n
        .values()
        .flatten()
        .filter(|r| !is_ok(r))
        .copied()
        .collect();
    let lost = retried
        .iter()
        .filter_map(|r| r["id"].as_str())
        .filter(|id| processed.contains(*id))
        .map(String::from)
        .collect();
    let mut broken = 0;
    for c in conns {
        let close = &c["close"];
        let code = close["code"].as_u64();
        if close["by"] == "peer" && !matches!(code, Some(H3_NO_ERROR) | Some(0)) {
            broken += 1;
        }
        let reason = match &close["reason"] {
            Value::String(s) => s.clone(),
            Value::Null => String::new(),
            v => v.to_string(),
        };
        if close["by"] == "local" && reason.contains("request failed") {
            // The two ways a request can fail cleanly across a GOAWAY: refused unprocessed, or
            // on a connection the server closed without an error.
            let clean = reason.contains(&format!("stream reset (code {H3_REQUEST_REJECTED})"))
                || reason.contains(&format!("connection closed (code {H3_NO_ERROR} "));
            if !clean {
                broken += 1;
            }
        }
    }
    Kept {
        requests: by_n.len(),
        failed,
        retried: retried.len(),
        broken,
        lost,
    }
}

/// One node's line (and the lines of its retried requests), and what it failed.
pub fn judge(
    node: &str,
    doc: &Value,
    processed: &BTreeSet<String>,
    want: &Want,
) -> (Vec<String>, Vec<String>) {
    let empty = Vec::new();
    let arr = |k: &str| doc[k].as_array().unwrap_or(&empty).clone();
    let (new, kept, conns) = (arr("new"), arr("kept"), arr("kept_connections"));
    let new_failed: Vec<&Value> = new.iter().filter(|r| !is_ok(r)).collect();
    let slowest = new
        .iter()
        .filter_map(|r| r["ms"].as_f64())
        .fold(0.0, f64::max);
    let k = kept_verdict(&kept, &conns, processed);
    let slow = &doc["slow"];
    let slow_ok = slow["error"].is_null()
        && slow["status"] == 200
        && slow["bytes"].as_u64() == Some(want.slow_bytes)
        && slow["sha256"] == want.slow_sha256;
    let closes: Vec<&str> = conns
        .iter()
        .map(|c| c["close"]["by"].as_str().unwrap_or("?"))
        .collect();
    let verdict = if slow_ok {
        "complete".to_string()
    } else {
        format!("FAILED: {}", slow["error"])
    };
    let mut lines = vec![format!(
        "{node}: new {} requests, {} failed, slowest {slowest:.0} ms; kept {} requests on {} connection(s) (closed by {}), {} failed, {} retried unprocessed, {} retried but processed, {} broken; slow download {} bytes in {:.1} s, {verdict}",
        new.len(), new_failed.len(), k.requests, conns.len(), closes.join(","), k.failed, k.retried, k.lost.len(), k.broken,
        slow["bytes"], slow["ms"].as_f64().unwrap_or(0.0) / 1000.0
    )];
    for r in kept.iter().filter(|r| !is_ok(r)) {
        let id = r["id"].as_str().unwrap_or_default();
        let processed = if processed.contains(id) {
            " (processed upstream)"
        } else {
            ""
        };
        lines.push(format!(
            "  {node}: kept {id} retried after {:.0} ms: {}{processed}",
            r["ms"].as_f64().unwrap_or(0.0),
            r["error"]
        ));
    }
    let mut bad = Vec::new();
    if !new_failed.is_empty() {
        let first: Vec<&&Value> = new_failed.iter().take(3).collect();
        bad.push(format!("{node}: new-connection requests failed: {first:?}"));
    }
    if slowest > want.max_new_ms {
        bad.push(format!(
            "{node}: a new connection took {slowest:.0} ms (> {} ms)",
            want.max_new_ms
        ));
    }
    if k.failed > 0 || k.broken > 0 || !k.lost.is_empty() {
        bad.push(format!(
            "{node}: kept connection: {} failed, {} broken, processed retries {:?}",
            k.failed, k.broken, k.lost
        ));
    }
    if !slow_ok {
        bad.push(format!("{node}: slow download: {slow}"));
    }
    if new.is_empty() || k.requests == 0 {
        bad.push(format!("{node}: the clients made no requests"));
    }
    (lines, bad)
}

/// Every node judged: the lines to print, and the failures (empty when the roll went
/// unnoticed). Results that share a request id are refused (two clients without their own
/// id prefix: a retry on one node would be found "processed" in another node's log).
pub fn verdict(
    results: &[(String, Value)],
    logs: &[PathBuf],
    want: &Want,
) -> Result<(Vec<String>, Vec<String>)> {
    let processed = processed_ids(logs)?;
    let mut owner: BTreeMap<String, &str> = BTreeMap::new();
    for (node, doc) in results {
        let reqs = doc["new"]
            .as_array()
            .into_iter()
            .flatten()
            .chain(doc["kept"].as_array().into_iter().flatten());
        for r in reqs {
            let id = r["id"].as_str().unwrap_or_default().to_string();
            let first = *owner.entry(id.clone()).or_insert(node);
            if first != node {
                return fail(format!(
                    "request id {id} is in the results of both {first} and {node}: give each client its own rollclient.py --id-prefix"
                ));
            }
        }
    }
    let (mut lines, mut bad) = (Vec::new(), Vec::new());
    for (node, doc) in results {
        let (l, b) = judge(node, doc, &processed, want);
        lines.extend(l);
        bad.extend(b);
    }
    Ok((lines, bad))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn want() -> Want<'static> {
        Want {
            slow_bytes: 4,
            slow_sha256: "abc",
            max_new_ms: 3000.0,
        }
    }

    fn doc(new_err: Value, kept: Value, close: Value) -> Value {
        json!({"new": [{"id": "n1-new-1", "ms": 12.0, "status": 200, "error": new_err}],
            "kept": kept,
            "kept_connections": [{"index": 0, "close": close}],
            "slow": {"start": 100.0, "ms": 2000.0, "status": 200, "bytes": 4, "sha256": "abc", "error": null}})
    }

    #[test]
    fn a_clean_roll_passes() {
        let kept = json!([{"id": "n1-kept-1-a1", "ms": 3.0, "error": null}]);
        let d = doc(Value::Null, kept, json!({"by": "peer", "code": 256}));
        let (lines, bad) = verdict(&[("n1".into(), d)], &[], &want()).unwrap();
        assert!(bad.is_empty(), "{bad:?}");
        assert!(lines[0].starts_with("n1: new 1 requests, 0 failed, slowest 12 ms; kept 1 requests on 1 connection(s) (closed by peer)"), "{}", lines[0]);
        assert!(
            lines[0].ends_with("slow download 4 bytes in 2.0 s, complete"),
            "{}",
            lines[0]
        );
    }

    #[test]
    fn a_retry_that_was_processed_is_a_loss() {
        let kept = json!([{"id": "n1-kept-1-a1", "ms": 3.0, "error": "connection closed (code 256 x)"},
                          {"id": "n1-kept-1-a2", "ms": 3.0, "error": null}]);
        let processed = BTreeSet::from(["n1-kept-1-a1".to_string()]);
        let k = kept_verdict(kept.as_array().unwrap(), &[], &processed);
        assert_eq!(
            k,
            Kept {
                requests: 1,
                failed: 0,
                retried: 1,
                broken: 0,
                lost: vec!["n1-kept-1-a1".into()]
            }
        );
        let k = kept_verdict(kept.as_array().unwrap(), &[], &BTreeSet::new());
        assert!(k.lost.is_empty());
    }

    #[test]
    fn closes_with_an_error_are_broken_and_clean_ones_are_not() {
        let c = |by: &str, code: u64, reason: &str| json!({"close": {"by": by, "code": code, "reason": reason}});
        let conns = [
            c("peer", 0x100, ""),
            c("peer", 0x102, ""),
            c("local", 0, "request failed: stream reset (code 267)"),
            c(
                "local",
                0,
                "request failed: connection closed (code 256 by peer)",
            ),
            c("local", 0, "request failed: timeout"),
        ];
        assert_eq!(kept_verdict(&[], &conns, &BTreeSet::new()).broken, 2);
    }

    #[test]
    fn failures_slow_connections_and_bad_downloads_are_named() {
        let mut d = doc(
            json!("refused"),
            json!([]),
            json!({"by": "peer", "code": 256}),
        );
        d["new"][0]["ms"] = json!(3500.0);
        d["slow"]["bytes"] = json!(3);
        let (_, bad) = judge("n1", &d, &BTreeSet::new(), &want());
        assert_eq!(bad.len(), 4, "{bad:?}");
        assert!(bad[1].contains("3500 ms"));
        assert!(bad[3].contains("no requests"));
    }

    #[test]
    fn shared_ids_are_refused_and_access_logs_are_read() {
        let kept = json!([{"id": "x-kept-1-a1", "ms": 3.0, "error": null}]);
        let d = doc(Value::Null, kept, json!({"by": "peer", "code": 256}));
        let both = [("n1".to_string(), d.clone()), ("n2".to_string(), d)];
        assert!(verdict(&both, &[], &want()).is_err());
        let dir = std::env::temp_dir().join(format!("h3i-roll-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("access.log");
        std::fs::write(&log, "1.2.3.4 - - [x] \"GET /whoami?id=p-n1-kept-3-a1&z=1 HTTP/2.0\" 200 5\n\"GET /?id=q-new-2\" 200\n").unwrap();
        let ids = processed_ids(std::slice::from_ref(&log)).unwrap();
        assert!(processed_ids(&[dir.join("missing.log")]).is_err());
        assert_eq!(
            ids,
            BTreeSet::from(["p-n1-kept-3-a1".to_string(), "q-new-2".to_string()])
        );
        std::fs::remove_dir_all(dir).unwrap();
    }
}
