//! What `accessLog.enabled` costs the proxy: the same requests through the real binary with
//! the log off and on, in turns, the proxy's own CPU time (utime + stime from /proc/PID/stat,
//! so other load on the machine does not count) per request. Run by hand (it prints a table):
//!
//! ```sh
//! cargo test --release --test access_log_cost -- --ignored --nocapture
//! ```
//!
//! `H3I_COST_ROUNDS` (default 2) rounds of each mode, `H3I_COST_CONNECTIONS` (default 40)
//! connections per round from `H3I_COST_CLIENTS` (default 4) aioquic clients at once, 100
//! requests per connection. aioquic is the client, so the rate is aioquic's, not the proxy's.
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
    let (clients, connections) = (env("H3I_COST_CLIENTS", 4), env("H3I_COST_CONNECTIONS", 40));
    let per_connection = 100;
    let specs = |conn: usize| -> Value {
        (0..per_connection)
            .map(|i| json!({"name": format!("r{i}"), "path": format!("/whoami?c={conn}&r={i}")}))
            .collect()
    };
    let (nginx_from, error_from) = (nginx.access_log_entries().len(), nginx.error_log().len());
    let cpu0 = cpu_seconds(proxy.pid());
    let start = Instant::now();
    let per_client: Vec<(BTreeMap<String, usize>, Vec<String>)> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..clients)
            .map(|c| {
                let (specs, proxy) = (&specs, &proxy);
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
    });
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
        let lines = proxy
            .log()
            .lines()
            .filter(|l| l.starts_with("{\"time\""))
            .count();
        assert_eq!(lines, requests, "one access-log line per request");
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
    for _ in 0..rounds {
        for log in [false, true] {
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
