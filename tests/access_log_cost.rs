//! What `accessLog.enabled` costs the proxy: the same requests through the real binary with
//! the log off and on, in turns, the proxy's own CPU time (utime + stime from /proc/PID/stat,
//! so other load on the machine does not count) per request. Run by hand (it prints a table):
//!
//! ```sh
//! cargo test --release --test access_log_cost -- --ignored --nocapture
//! ```
//!
//! After one round that is not counted, `H3I_COST_ROUNDS` (default 2) rounds of each mode (off
//! then on, then on then off, and so on), `H3I_COST_CONNECTIONS` connections per
//! round, 100 requests per connection. The client is quinn and h3 in this process (default
//! 200 connections, 8 at a time, 10 requests in flight on each: the fastest client here), or
//! with `H3I_COST_CLIENT=aioquic` an independent one, `H3I_COST_CLIENTS` (default 4) aioquic
//! processes at once (default 40 connections; about 400 requests a second, aioquic's rate,
//! not the proxy's).
//!
//! A request that does not get its 200 is a failure; after the table each round's failures
//! are listed by reason (h3client.py's status, stream reset or error), then each connection
//! that had one, then what the proxy (its counters, its warnings and, with the log on, its
//! access-log lines) and nginx (non-200 lines, error log) saw in that round. Every request's
//! path carries `?c=CONNECTION&r=INDEX` (nginx's `location = /whoami` ignores the query), so a
//! failure can be found in both logs.

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use serde_json::{json, Value};
use support::h3client::H3Client;
use support::net::free_udp_port;
use support::proxy::ProxyProcess;
use support::{NginxFixture, NginxOptions, TestPki};

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// utime + stime of `pid`, in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
    // SAFETY: sysconf has no preconditions.
    ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

struct Round {
    log: bool,
    requests: usize,
    failures: usize,
    seconds: f64,
    cpu: f64,
    /// Failed requests by reason.
    reasons: BTreeMap<String, usize>,
    /// What else the round saw about its failures (one line each).
    notes: Vec<String>,
}

/// Why a request of h3client.py's report did not get its 200; `None` when it did.
fn failure(r: Option<&Value>) -> Option<String> {
    let Some(r) = r else {
        return Some("no result (the connection failed)".into());
    };
    let mut why = Vec::new();
    match r["status"].as_u64() {
        Some(200) => {}
        Some(s) => why.push(format!("status {s}")),
        None => why.push("no status".into()),
    }
    if let Some(reset) = r["reset"]["error_name"].as_str() {
        why.push(format!("reset {reset}"));
    }
    if let Some(stop) = r["stop_sending"]["error_name"].as_str() {
        why.push(format!("stop_sending {stop}"));
    }
    if let Some(e) = r["error"].as_str() {
        why.push(format!("error {e:?}"));
    }
    (r["status"].as_u64() != Some(200)).then(|| why.join(", "))
}

/// One connection's failures: their reasons, and a line about it (`None`: none failed).
fn connection_failures(
    conn: usize,
    run: &support::h3client::H3Run,
    per_connection: usize,
    reasons: &mut BTreeMap<String, usize>,
) -> Option<String> {
    let mut failed = Vec::new();
    for i in 0..per_connection {
        if let Some(why) = failure(run.requests().get(i)) {
            *reasons.entry(why.clone()).or_default() += 1;
            let r = &run.requests().get(i).cloned().unwrap_or_default();
            failed.push(format!(
                "r{i} (stream {}, {} ms): {why}",
                r["stream_id"], r["total_ms"]
            ));
        }
    }
    if failed.is_empty() {
        return None;
    }
    let c = run.connection();
    let mut line = format!(
        "connection c{conn}: exit {}, handshake {}, close {}; {} failed: {}",
        run.exit_code,
        c["handshake"],
        c["close"],
        failed.len(),
        failed.join("; ")
    );
    if !run.stderr.trim().is_empty() {
        line.push_str(&format!("; stderr: {}", run.stderr.trim()));
    }
    Some(line)
}

/// The proxy's counters of refusals and failures that are not zero.
fn proxy_counters(metrics: &str) -> Vec<String> {
    let families = [
        "h3_ingress_upstream_errors_total",
        "h3_ingress_rejected_requests_total",
        "h3_ingress_limits_total",
        "h3_ingress_handshakes_total",
        "h3_ingress_access_log_dropped_total",
    ];
    metrics
        .lines()
        .filter(|l| families.iter().any(|f| l.starts_with(f)))
        .filter(|l| !l.ends_with(" 0"))
        .map(|l| format!("proxy counter: {l}"))
        .collect()
}

/// What the proxy's log and nginx's logs say about a round's failures: the proxy's warnings
/// and errors, its access-log lines that are not a plain 200, nginx's lines from
/// `nginx_from` on that are not 200, and nginx's error log from byte `error_from` on.
fn log_notes(
    proxy: &ProxyProcess,
    nginx: &NginxFixture,
    nginx_from: usize,
    error_from: usize,
) -> Vec<String> {
    let mut notes = Vec::new();
    for line in proxy.log().lines() {
        if line.starts_with("{\"time\"") {
            let v: Value = serde_json::from_str(line).unwrap_or_default();
            if v["status"].as_u64() != Some(200) || !v["refused"].is_null() {
                notes.push(format!("proxy access log: {line}"));
            }
        } else if line.contains("WARN") || line.contains("ERROR") {
            notes.push(format!("proxy log: {line}"));
        }
    }
    let entries = nginx.access_log_entries();
    let mut statuses: BTreeMap<String, usize> = BTreeMap::new();
    for e in entries.iter().skip(nginx_from) {
        *statuses.entry(e["status"].to_string()).or_default() += 1;
        if e["status"].as_u64() != Some(200) {
            notes.push(format!("nginx access log: {e}"));
        }
    }
    // Upstream connections of this round, and the most requests one carried (nginx ends an
    // HTTP/2 connection after `keepalive_requests`, 1000 by default).
    let mut per_conn: BTreeMap<u64, u64> = BTreeMap::new();
    for e in entries.iter().skip(nginx_from) {
        let (c, n) = (e["connection"].as_u64(), e["connection_requests"].as_u64());
        if let (Some(c), Some(n)) = (c, n) {
            let most = per_conn.entry(c).or_default();
            *most = (*most).max(n);
        }
    }
    notes.push(format!(
        "nginx this round: statuses {statuses:?}; {} connections, requests per connection {:?}",
        per_conn.len(),
        per_conn.values().collect::<Vec<_>>()
    ));
    let error_log = nginx.error_log();
    for line in error_log.get(error_from..).unwrap_or("").lines() {
        notes.push(format!("nginx error log: {line}"));
    }
    notes
}

/// One round's requests from `H3I_COST_CLIENTS` aioquic processes at once (h3client.py,
/// `--parallel`, one connection each run): failures by reason and a line per connection
/// that had one, per client.
fn aioquic_load(
    pki: &TestPki,
    proxy: &ProxyProcess,
    connections: usize,
    per_connection: usize,
) -> Vec<(BTreeMap<String, usize>, Vec<String>)> {
    let clients = env("H3I_COST_CLIENTS", 4);
    let specs = |conn: usize| -> Value {
        (0..per_connection)
            .map(|i| json!({"name": format!("r{i}"), "path": format!("/whoami?c={conn}&r={i}")}))
            .collect()
    };
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..clients)
            .map(|c| {
                let specs = &specs;
                s.spawn(move || {
                    let (mut reasons, mut lines) = (BTreeMap::new(), Vec::new());
                    for conn in (c..connections).step_by(clients) {
                        let run = H3Client::new(format!("https://a.test:{}/", proxy.port))
                            .resolve(format!("a.test:{}:127.0.0.1", proxy.port))
                            .cacert(&pki.ca_cert_path)
                            .arg("--parallel")
                            .requests(&specs(conn))
                            .run()
                            .unwrap();
                        let line = connection_failures(conn, &run, per_connection, &mut reasons);
                        lines.extend(line);
                    }
                    (reasons, lines)
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    })
}

/// Connections of the Rust client open at once, and requests in flight on each.
const QUINN_CONNECTIONS_AT_ONCE: usize = 8;
const QUINN_LANES: usize = 10;

/// One round's requests from quinn and h3 in this process, the fastest client this machine
/// has (aioquic reaches about 400 requests a second): `connections` connections,
/// [`QUINN_CONNECTIONS_AT_ONCE`] at a time, [`QUINN_LANES`] requests in flight on each.
/// Failed requests by reason.
fn quinn_load(port: u16, connections: usize, per_connection: usize) -> BTreeMap<String, usize> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let ep = support::quic::any_certificate_client();
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let places = Arc::new(tokio::sync::Semaphore::new(QUINN_CONNECTIONS_AT_ONCE));
        let mut set = tokio::task::JoinSet::new();
        for c in 0..connections {
            let place = places.clone().acquire_owned().await.unwrap();
            let ep = ep.clone();
            set.spawn(async move {
                let r = quinn_connection(&ep, addr, c, per_connection).await;
                drop(place);
                r
            });
        }
        let mut reasons = BTreeMap::new();
        while let Some(r) = set.join_next().await {
            for (why, n) in r.unwrap() {
                *reasons.entry(why).or_default() += n;
            }
        }
        ep.wait_idle().await;
        reasons
    })
}

type Send = h3::client::SendRequest<h3_quinn::OpenStreams, bytes::Bytes>;

type Driver = h3::client::Connection<h3_quinn::Connection, bytes::Bytes>;

/// A QUIC connection to `addr` for `a.test` and HTTP/3 on it.
async fn quinn_open(
    ep: &quinn::Endpoint,
    addr: std::net::SocketAddr,
) -> Result<(quinn::Connection, (Driver, Send)), String> {
    let q = ep
        .connect(addr, "a.test")
        .map_err(|e| e.to_string())?
        .await
        .map_err(|e| e.to_string())?;
    let h3 = h3::client::new(h3_quinn::Connection::new(q.clone()))
        .await
        .map_err(|e| e.to_string())?;
    Ok((q, h3))
}

/// `per_connection` GETs on one connection, [`QUINN_LANES`] at a time.
async fn quinn_connection(
    ep: &quinn::Endpoint,
    addr: std::net::SocketAddr,
    conn: usize,
    per_connection: usize,
) -> BTreeMap<String, usize> {
    let mut reasons = BTreeMap::new();
    let (q, (mut driver, send)) = match quinn_open(ep, addr).await {
        Ok(o) => o,
        Err(e) => {
            reasons.insert(format!("connection: {}", cut(&e)), per_connection);
            return reasons;
        }
    };
    let drive = tokio::spawn(async move {
        let _ = std::future::poll_fn(|cx| driver.poll_close(cx)).await;
    });
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut lanes = tokio::task::JoinSet::new();
    for _ in 0..QUINN_LANES {
        let (mut send, next) = (send.clone(), next.clone());
        lanes.spawn(async move {
            let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= per_connection {
                    return reasons;
                }
                match quinn_get(&mut send, conn, i).await {
                    Ok(200) => {}
                    Ok(s) => *reasons.entry(format!("status {s}")).or_default() += 1,
                    Err(e) => *reasons.entry(cut(&e)).or_default() += 1,
                }
            }
        });
    }
    while let Some(r) = lanes.join_next().await {
        for (why, n) in r.unwrap() {
            *reasons.entry(why).or_default() += n;
        }
    }
    q.close(0u32.into(), b"done");
    drive.abort();
    reasons
}

/// A reason short enough to count by (an error's text may name a stream).
fn cut(e: &str) -> String {
    e.chars().take(80).collect()
}

async fn quinn_get(send: &mut Send, conn: usize, i: usize) -> Result<u16, String> {
    let req = http::Request::get(format!("https://a.test/whoami?c={conn}&r={i}"))
        .body(())
        .unwrap();
    let mut s = send
        .send_request(req)
        .await
        .map_err(|e| format!("send: {e}"))?;
    s.finish().await.map_err(|e| format!("finish: {e}"))?;
    let resp = s
        .recv_response()
        .await
        .map_err(|e| format!("response: {e}"))?;
    while s
        .recv_data()
        .await
        .map_err(|e| format!("body: {e}"))?
        .is_some()
    {}
    Ok(resp.status().as_u16())
}

fn round(pki: &TestPki, nginx: &NginxFixture, log: bool) -> Round {
    let leaf = pki.leaf("a.test");
    let proxy = ProxyProcess::start_with_default_log(json!({
        "port": free_udp_port(),
        "addresses": {"ipv4": "127.0.0.1", "ipv6": null},
        "upstream": {"address": format!("127.0.0.1:{}", nginx.port())},
        "accessLog": {"enabled": log},
        "hosts": [{"name": "a.test", "certFile": leaf.cert_path.display().to_string(),
                   "keyFile": leaf.key_path.display().to_string()}],
    }))
    .unwrap();
    let aioquic = std::env::var("H3I_COST_CLIENT").is_ok_and(|c| c == "aioquic");
    let connections = env("H3I_COST_CONNECTIONS", if aioquic { 40 } else { 200 });
    let per_connection = 100;
    let (nginx_from, error_from) = (nginx.access_log_entries().len(), nginx.error_log().len());
    let cpu0 = cpu_seconds(proxy.pid());
    let start = Instant::now();
    let per_client = if aioquic {
        aioquic_load(pki, &proxy, connections, per_connection)
    } else {
        vec![(
            quinn_load(proxy.port, connections, per_connection),
            Vec::new(),
        )]
    };
    let seconds = start.elapsed().as_secs_f64();
    let cpu = cpu_seconds(proxy.pid()) - cpu0;
    let requests = connections * per_connection;
    let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
    let mut notes = Vec::new();
    for (r, lines) in per_client {
        for (why, n) in r {
            *reasons.entry(why).or_default() += n;
        }
        notes.extend(lines);
    }
    let failures = reasons.values().sum();
    if failures > 0 {
        notes.extend(proxy_counters(&proxy.metrics()));
        // nginx writes its line after the response: give the last ones a moment.
        std::thread::sleep(std::time::Duration::from_millis(200));
        notes.extend(log_notes(&proxy, nginx, nginx_from, error_from));
    }
    if log {
        let lines = || {
            proxy
                .log()
                .lines()
                .filter(|l| l.starts_with("{\"time\""))
                .count()
        };
        // The writer gathers lines for 100 ms before it writes them.
        let until = Instant::now() + std::time::Duration::from_secs(2);
        while lines() < requests && Instant::now() < until {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let dropped = proxy
            .metrics()
            .lines()
            .find_map(|l| l.strip_prefix("h3_ingress_access_log_dropped_total "))
            .map_or(-1.0, |v| v.trim().parse::<f64>().unwrap_or(-1.0));
        assert_eq!(
            (lines(), dropped),
            (requests, 0.0),
            "one access-log line per request, none dropped"
        );
    }
    Round {
        log,
        requests,
        failures,
        seconds,
        cpu,
        reasons,
        notes,
    }
}

#[test]
#[ignore = "a measurement: run by hand, it prints a table"]
fn access_log_cost_per_request() {
    let pki = Arc::new(TestPki::generate().unwrap());
    let nginx = NginxFixture::start(NginxOptions {
        pki: Some(pki.clone()),
        ..Default::default()
    })
    .unwrap();
    let rounds = env("H3I_COST_ROUNDS", 2);
    let mut all = Vec::new();
    // One round first that is not counted (nginx's and the page cache's first requests), then
    // the modes in turns of off-on, on-off, so neither always runs second.
    let warm = round(&pki, &nginx, false);
    println!(
        "warm-up round (not counted): {} requests, {} failed, {:.0}/s",
        warm.requests,
        warm.failures,
        warm.requests as f64 / warm.seconds
    );
    for line in warm.reasons.iter().map(|(why, n)| format!("{n} x {why}")) {
        println!("  warm-up: {line}");
    }
    for note in warm.notes.iter().take(20) {
        println!("  warm-up: {note}");
    }
    for i in 0..rounds {
        let order = if i % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for log in order {
            all.push(round(&pki, &nginx, log));
        }
    }
    println!("| access log | requests | failures | requests/s | proxy CPU s | CPU us/request |");
    println!("|---|---|---|---|---|---|");
    for r in &all {
        println!(
            "| {} | {} | {} | {:.0} | {:.2} | {:.1} |",
            if r.log { "on" } else { "off" },
            r.requests,
            r.failures,
            r.requests as f64 / r.seconds,
            r.cpu,
            r.cpu / r.requests as f64 * 1e6
        );
    }
    let per = |log: bool| {
        let (cpu, n) = all
            .iter()
            .filter(|r| r.log == log)
            .fold((0.0, 0), |(c, n), r| (c + r.cpu, n + r.requests));
        cpu / n as f64
    };
    println!(
        "ratio on/off (CPU per request): {:.3}",
        per(true) / per(false)
    );
    for (i, r) in all.iter().enumerate().filter(|(_, r)| r.failures > 0) {
        let log = if r.log { "on" } else { "off" };
        println!("\nround {} (log {log}): {} failed", i + 1, r.failures);
        for (why, n) in &r.reasons {
            println!("  {n} x {why}");
        }
        // Enough to see the pattern; a connection that failed whole would flood the rest.
        for note in r.notes.iter().take(80) {
            println!("  {note}");
        }
        if r.notes.len() > 80 {
            println!("  ... {} more", r.notes.len() - 80);
        }
    }
    assert_eq!(all.iter().map(|r| r.failures).sum::<usize>(), 0);
}
