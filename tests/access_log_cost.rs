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

mod support;

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
    let specs: Value = (0..per_connection)
        .map(|i| json!({"name": format!("r{i}"), "path": "/whoami"}))
        .collect();
    let cpu0 = cpu_seconds(proxy.pid());
    let start = Instant::now();
    let failures: usize = std::thread::scope(|s| {
        let workers: Vec<_> = (0..clients)
            .map(|c| {
                let (specs, proxy) = (&specs, &proxy);
                s.spawn(move || {
                    let mut failed = 0;
                    for _ in (c..connections).step_by(clients) {
                        let run = H3Client::new(format!("https://a.test:{}/", proxy.port))
                            .resolve(format!("a.test:{}:127.0.0.1", proxy.port))
                            .cacert(&pki.ca_cert_path)
                            .arg("--parallel")
                            .requests(specs)
                            .run()
                            .unwrap();
                        failed += (0..per_connection)
                            .filter(|i| {
                                run.requests().get(*i).and_then(|r| r["status"].as_u64())
                                    != Some(200)
                            })
                            .count();
                    }
                    failed
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).sum()
    });
    let seconds = start.elapsed().as_secs_f64();
    let cpu = cpu_seconds(proxy.pid()) - cpu0;
    let requests = connections * per_connection;
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
    assert_eq!(all.iter().map(|r| r.failures).sum::<usize>(), 0);
}
