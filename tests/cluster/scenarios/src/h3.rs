//! The HTTP/3 clients the scenarios judge the data plane with, run as subprocesses whose JSON
//! they read: aioquic (`tests/py/h3client.py`, from the repo's `.venv` when scripts/setup.sh
//! made one, or `H3I_PYTHON`) and curl 8.14 with HTTP/3 from the Debian trixie chroot
//! (`H3I_TRIXIE_ROOT`, default `/work/trixie-root`).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::cmd::{head, output, repo};
use crate::error::IoContext;
use crate::{fail, Error, Result};

/// Where a request goes: `https://host:port/path` sent to `addr`, trusting `cacert`.
#[derive(Clone, Debug)]
pub struct Target<'a> {
    pub addr: &'a str,
    pub host: &'a str,
    pub port: u16,
    pub path: &'a str,
    pub cacert: &'a Path,
}

/// One answer: status, the leaf certificate's and the body's SHA-256, the Alt-Svc header.
#[derive(Clone, Debug, Default)]
pub struct Answer {
    pub status: Option<u64>,
    pub cert_sha256: String,
    pub body_sha256: String,
    pub body_len: u64,
    pub alt_svc: String,
    /// Timings and versions, for the line a check prints.
    pub detail: String,
}

/// What an answer must carry; `None` checks nothing.
#[derive(Clone, Debug, Default)]
pub struct Expect<'a> {
    pub cert_sha256: Option<&'a str>,
    pub body_sha256: Option<&'a str>,
    pub alt_svc: Option<&'a str>,
}

/// The two clients.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Client {
    Aioquic,
    Curl,
}

impl Client {
    pub fn name(self) -> &'static str {
        match self {
            Client::Aioquic => "aioquic",
            Client::Curl => "curl",
        }
    }
}

/// The interpreter with aioquic.
pub fn python() -> PathBuf {
    if let Ok(p) = std::env::var("H3I_PYTHON") {
        return p.into();
    }
    let venv = repo().join(".venv/bin/python3");
    if venv.exists() {
        venv
    } else {
        "python3".into()
    }
}

/// The trixie chroot holding curl with HTTP/3.
pub fn trixie_root() -> PathBuf {
    std::env::var("H3I_TRIXIE_ROOT")
        .unwrap_or_else(|_| "/work/trixie-root".into())
        .into()
}

/// h3client.py's JSON report for `t` (extra arguments appended).
pub async fn h3client(t: &Target<'_>, extra: &[&str]) -> Result<Value> {
    let url = format!("https://{}:{}{}", t.host, t.port, t.path);
    let resolve = format!("{}:{}:{}", t.host, t.port, t.addr);
    let script = repo().join("tests/py/h3client.py");
    let (script, cacert) = (script.to_string_lossy(), t.cacert.to_string_lossy());
    let mut args = vec![&*script, &url, "--resolve", &resolve, "--cacert", &cacert];
    args.extend(["--connect-timeout", "5", "--timeout", "20"]);
    args.extend(extra);
    let py = python().to_string_lossy().to_string();
    let run = output(&py, &args);
    let out = tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .map_err(|_| Error::Command(format!("h3client.py {url} via {} ran over 30 s", t.addr)))??;
    serde_json::from_str(&out.stdout).map_err(|_| {
        Error::Command(format!(
            "h3client.py printed no JSON (exit {:?}): {} {}",
            out.status,
            head(&out.stdout, 300),
            crate::cmd::tail(&out.stderr, 500)
        ))
    })
}

/// One GET over aioquic.
pub async fn aioquic(t: &Target<'_>) -> Result<Answer> {
    let rep = h3client(t, &[]).await?;
    let conn = &rep["connection"];
    let hs = &conn["handshake"];
    if hs["ok"] != Value::Bool(true) {
        return fail(format!(
            "aioquic: handshake with {}:{} (SNI {}) failed: {hs}",
            t.addr, t.port, t.host
        ));
    }
    let r = &rep["requests"][0];
    if !r["error"].is_null() || !r["reset"].is_null() {
        return fail(format!(
            "aioquic: request failed: error={} reset={}",
            r["error"], r["reset"]
        ));
    }
    let alt_svc = r["headers"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|h| {
            h[0].as_str()
                .is_some_and(|n| n.eq_ignore_ascii_case("alt-svc"))
        })
        .and_then(|h| h[1].as_str())
        .unwrap_or_default();
    Ok(Answer {
        status: r["status"].as_u64(),
        cert_sha256: conn["server_cert"]["sha256"]
            .as_str()
            .unwrap_or_default()
            .into(),
        body_sha256: r["body_sha256"].as_str().unwrap_or_default().into(),
        body_len: r["body_length"].as_u64().unwrap_or(0),
        alt_svc: alt_svc.into(),
        detail: format!(
            "ALPN {}, handshake {:.0} ms, total {:.0} ms",
            hs["alpn"].as_str().unwrap_or("?"),
            hs["ms"].as_f64().unwrap_or(0.0),
            r["total_ms"].as_f64().unwrap_or(0.0)
        ),
    })
}

/// One GET over trixie curl `--http3-only`, run inside the chroot.
pub async fn curl(t: &Target<'_>) -> Result<Answer> {
    let root = trixie_root();
    if !root.join("usr/bin/curl").exists() {
        return fail(format!(
            "no trixie chroot with curl at {} (scripts/trixie-chroot.sh {0})",
            root.display()
        ));
    }
    let name = format!("h3i-curl-{}-{}", std::process::id(), crate::unique());
    let work = root.join("tmp").join(&name);
    std::fs::create_dir_all(&work).context(|| format!("mkdir {}", work.display()))?;
    let result = curl_in(t, &root, &work, &format!("/tmp/{name}")).await;
    let _ = std::fs::remove_dir_all(&work);
    result
}

async fn curl_in(t: &Target<'_>, root: &Path, work: &Path, inside: &str) -> Result<Answer> {
    std::fs::copy(t.cacert, work.join("ca.crt"))
        .context(|| "copy the CA into the chroot".into())?;
    let resolve = format!("{}:{}:{}", t.host, t.port, t.addr);
    let url = format!("https://{}:{}{}", t.host, t.port, t.path);
    let (ca, hdrs, body) = (
        format!("{inside}/ca.crt"),
        format!("{inside}/headers"),
        format!("{inside}/body"),
    );
    let root_s = root.to_string_lossy();
    let args = [
        &*root_s,
        "curl",
        "--http3-only",
        "-sS",
        "--max-time",
        "20",
        "--resolve",
        &resolve,
        "--cacert",
        &ca,
        "-D",
        &hdrs,
        "-o",
        &body,
        "-w",
        "%{json}\\n%{certs}",
        &url,
    ];
    let out = output("chroot", &args).await?;
    let (first, certs) = out.stdout.split_once('\n').unwrap_or((&out.stdout, ""));
    let Ok(info) = serde_json::from_str::<Value>(first) else {
        return fail(format!(
            "curl: exit {:?}, no -w JSON: {}",
            out.status,
            head(out.stderr.trim(), 300)
        ));
    };
    if !out.success() {
        return fail(format!(
            "curl: exit {:?}: {}",
            out.status,
            head(out.stderr.trim(), 300)
        ));
    }
    if info["http_version"] != "3" {
        return fail(format!(
            "curl: answered over HTTP/{}, not HTTP/3",
            info["http_version"]
        ));
    }
    let body = std::fs::read(work.join("body")).context(|| "curl's body".into())?;
    let headers = std::fs::read(work.join("headers")).context(|| "curl's headers".into())?;
    let alt_svc = String::from_utf8_lossy(&headers)
        .lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("alt-svc"))
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_default();
    let version = output("chroot", &[&*root_s, "curl", "--version"]).await?;
    let version = version
        .stdout
        .split_whitespace()
        .nth(1)
        .unwrap_or("?")
        .to_string();
    Ok(Answer {
        status: info["response_code"].as_u64(),
        cert_sha256: leaf_sha256_of_pem_chain(certs)?,
        body_sha256: crate::pki::sha256_hex(&body),
        body_len: body.len() as u64,
        alt_svc,
        detail: format!(
            "curl {version}, connect {:.0} ms, total {:.0} ms",
            info["time_connect"].as_f64().unwrap_or(0.0) * 1000.0,
            info["time_total"].as_f64().unwrap_or(0.0) * 1000.0
        ),
    })
}

/// SHA-256 of the DER of the first certificate of a PEM text (curl's `%{certs}`).
pub fn leaf_sha256_of_pem_chain(text: &str) -> Result<String> {
    const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
    const END: &str = "-----END CERTIFICATE-----";
    let body = text
        .split_once(BEGIN)
        .and_then(|(_, rest)| rest.split_once(END))
        .map(|(b, _)| b);
    let Some(body) = body else {
        return fail(format!(
            "curl printed no certificate in %{{certs}}: {:?}",
            head(text, 200)
        ));
    };
    let b64: String = body.chars().filter(|c| !c.is_whitespace()).collect();
    Ok(crate::pki::sha256_hex(&base64_decode(&b64)?))
}

fn base64_decode(s: &str) -> Result<Vec<u8>> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0);
    for c in s.bytes().take_while(|&c| c != b'=') {
        let Some(v) = ALPHABET.iter().position(|&a| a == c) else {
            return fail(format!("not base64: {:?}", c as char));
        };
        acc = (acc << 6) | v as u32;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    Ok(out)
}

/// GETs `t` with `client` and checks status 200 and `want`; returns the line to print.
pub async fn get(client: Client, t: &Target<'_>, want: &Expect<'_>) -> Result<String> {
    let a = match client {
        Client::Aioquic => aioquic(t).await?,
        Client::Curl => curl(t).await?,
    };
    let mut problems = Vec::new();
    if a.status != Some(200) {
        problems.push(format!("status {:?}, want 200", a.status));
    }
    if let Some(c) = want.cert_sha256.filter(|c| *c != a.cert_sha256) {
        problems.push(format!(
            "certificate sha256 {}..., want {}...",
            head(&a.cert_sha256, 16),
            head(c, 16)
        ));
    }
    if let Some(b) = want.body_sha256.filter(|b| *b != a.body_sha256) {
        problems.push(format!(
            "body sha256 {}... ({} B), want {}...",
            head(&a.body_sha256, 16),
            a.body_len,
            head(b, 16)
        ));
    }
    if let Some(s) = want.alt_svc.filter(|s| *s != a.alt_svc) {
        problems.push(format!("Alt-Svc {:?}, want {s:?}", a.alt_svc));
    }
    let name = client.name();
    if !problems.is_empty() {
        return fail(format!(
            "{name} https://{}{} via {}: {}",
            t.host,
            t.path,
            t.addr,
            problems.join("; ")
        ));
    }
    Ok(format!(
        "{name:7} {:>10} {}{}: HTTP/3 200, cert {}, body {} B sha256 {}, Alt-Svc {:?} ({})",
        t.addr,
        t.host,
        t.path,
        head(&a.cert_sha256, 12),
        a.body_len,
        head(&a.body_sha256, 12),
        a.alt_svc,
        a.detail
    ))
}

/// How a refused handshake must fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// A live server refuses the name with a TLS alert (no certificate for it).
    TlsAlert,
    /// Nothing answers (time-out or ICMP unreachable).
    Silent,
}

/// The handshake for `t` fails the way `kind` says; returns the line to print.
pub async fn refused(t: &Target<'_>, kind: Refusal) -> Result<String> {
    let rep = h3client(t, &[]).await?;
    let hs = &rep["connection"]["handshake"];
    if hs["ok"] == Value::Bool(true) {
        let cert = rep["connection"]["server_cert"]["sha256"]
            .as_str()
            .unwrap_or_default();
        return fail(format!(
            "{} via {}: the handshake succeeded (cert {}), want it refused",
            t.host,
            t.addr,
            head(cert, 12)
        ));
    }
    let got = hs["kind"].as_str().unwrap_or_default();
    let fits = match kind {
        Refusal::TlsAlert => got == "tls_alert",
        Refusal::Silent => got == "timeout" || got == "unreachable",
    };
    if !fits {
        return fail(format!(
            "{} via {}: handshake failed with {got} ({}), want {kind:?}",
            t.host, t.addr, hs["detail"]
        ));
    }
    let d = &hs["detail"];
    let detail = if d.is_object() {
        let s = |k: &str| d[k].as_str().unwrap_or_default().to_string();
        format!(
            "{} {} {}",
            s("error_name"),
            s("tls_alert_name"),
            s("reason")
        )
        .trim()
        .to_string()
    } else {
        d.to_string()
    };
    Ok(format!(
        "{:>10} {}: handshake failed ({got}: {})",
        t.addr,
        t.host,
        head(&detail, 100)
    ))
}

/// Requests over fresh connections (`per_connection` on each) to every target, round robin,
/// for `seconds`; every answer must be 200. Returns the line to print.
pub async fn load(targets: &[Target<'_>], seconds: u64, per_connection: usize) -> Result<String> {
    let never = AtomicBool::new(false);
    load_until(
        targets,
        seconds,
        per_connection,
        Duration::from_millis(500),
        &never,
    )
    .await
}

/// [`load`] with `pause` between rounds, ending early once `stop` is set (by a task running
/// beside it: `tokio::join!`).
pub async fn load_until(
    targets: &[Target<'_>],
    seconds: u64,
    per_connection: usize,
    pause: Duration,
    stop: &AtomicBool,
) -> Result<String> {
    let started = Instant::now();
    let path = targets.first().map_or("/", |t| t.path);
    let spec = Value::Array(vec![serde_json::json!({ "path": path }); per_connection]).to_string();
    let (mut good, mut bad, mut errors) = (0u64, 0u64, Vec::new());
    while started.elapsed() < Duration::from_secs(seconds) && !stop.load(Ordering::Relaxed) {
        for t in targets {
            let rep = h3client(t, &["--requests", &spec]).await?;
            let reqs = rep["requests"].as_array().cloned().unwrap_or_default();
            for r in &reqs {
                if r["status"] == 200 {
                    good += 1;
                } else {
                    bad += 1;
                    errors.push(format!("{}: {} {}", t.addr, r["status"], r["error"]));
                }
            }
            if reqs.is_empty() {
                bad += 1;
                errors.push(format!("{}: {}", t.addr, rep["connection"]["handshake"]));
            }
        }
        tokio::time::sleep(pause).await;
    }
    let took = started.elapsed().as_secs_f64();
    if bad > 0 {
        errors.truncate(3);
        return fail(format!(
            "{bad} of {} requests failed over {took:.0} s: {errors:?}",
            good + bad
        ));
    }
    Ok(format!(
        "{good} HTTP/3 requests over {took:.0} s to {} node(s), all 200",
        targets.len()
    ))
}

/// One GET of `path` with aioquic on every address: 200 and what `want` says; the lines to
/// print.
pub async fn get_all(
    ips: &[String],
    host: &str,
    port: u16,
    path: &str,
    cacert: &Path,
    want: &Expect<'_>,
) -> Result<Vec<String>> {
    let mut lines = Vec::new();
    for ip in ips {
        let t = Target {
            addr: ip,
            host,
            port,
            path,
            cacert,
        };
        lines.push(get(Client::Aioquic, &t, want).await?);
    }
    Ok(lines)
}

/// The handshake for `host` refused the way `kind` says on every address; the lines to print.
pub async fn refused_all(
    ips: &[String],
    host: &str,
    cacert: &Path,
    kind: Refusal,
) -> Result<Vec<String>> {
    let mut lines = Vec::new();
    for ip in ips {
        let t = Target {
            addr: ip,
            host,
            port: 443,
            path: "/",
            cacert,
        };
        lines.push(refused(&t, kind).await?);
    }
    Ok(lines)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_leaf_hash_is_of_the_first_certificate() {
        let dir = std::env::temp_dir().join(format!("h3i-h3-test-{}", std::process::id()));
        let pki = crate::Pki::new(&dir, "ca").unwrap();
        let leaf = pki.leaf("a", "a.test").unwrap();
        let chain = std::fs::read_to_string(&leaf.crt).unwrap()
            + &std::fs::read_to_string(pki.ca()).unwrap();
        assert_eq!(leaf_sha256_of_pem_chain(&chain).unwrap(), leaf.sha256);
        assert!(leaf_sha256_of_pem_chain("nothing").is_err());
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn base64_round_trips_known_vectors() {
        assert_eq!(base64_decode("aGVsbG8=").unwrap(), b"hello");
        assert_eq!(base64_decode("aGk=").unwrap(), b"hi");
        assert!(base64_decode("a$").is_err());
    }
}
