//! The operator's DNS advertise tasks (`operator::advertise::dns::task`, what a reconcile
//! feeds with the hosts a listener serves) against a real authoritative server (Debian's
//! Knot DNS), measured and printed as a table:
//! - a host's HTTPS record is in the zone within 5 s of the host being served, and gone
//!   within 5 s of it no longer being served;
//! - 1,000 hosts are published in batches (UPDATE messages counted), then nothing is sent at
//!   rest while reconciles keep feeding the same hosts (UPDATEs and zone serial over a
//!   measured interval: `H3I_DNS_REST_SECONDS`, 60 by default), then withdrawn in batches;
//! - a server that is down and a key the server refuses give `DnsAdvertised`'s reason and are
//!   retried with a doubling back-off; a rotated Secret is picked up on the next retry.
//!
//! Needs `knotd` and `kdig` (scripts/setup.sh installs them).

mod support;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use h3_ingress::api::{reasons, DnsAdvertise, TsigAlgorithm, TsigSecretRef};
use h3_ingress::operator::advertise::dns::listener::{Settings, State};
use h3_ingress::operator::advertise::dns::task::{
    Advertisers, Desired, KeyFuture, KeySource, Timing,
};
use h3_ingress::operator::metrics::DnsMetrics;
use support::knot::{KnotFixture, KnotOptions};

const SECRET: &[u8; 32] = b"0123456789abcdef0123456789abcdef";
const ZONE: &str = "example.test";
const LISTENER: &str = "public";

fn b64(b: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(b)
}

fn knot() -> KnotFixture {
    KnotFixture::start(KnotOptions {
        zone: ZONE,
        records: &["user HTTPS 1 . alpn=h2"],
        key_name: "h3-ingress",
        secret_b64: &b64(SECRET),
    })
    .unwrap()
}

/// The Secret's data as a test changes it (a rotation is a new value).
struct Keys(Mutex<Vec<u8>>);

impl KeySource for Keys {
    fn read(&self, _: &TsigSecretRef) -> KeyFuture {
        let v = self.0.lock().unwrap().clone();
        Box::pin(async move { Ok(v) })
    }
}

struct Harness {
    adv: Advertisers,
    keys: Arc<Keys>,
    notified: Arc<AtomicUsize>,
}

fn harness(timing: Timing) -> Harness {
    let keys = Arc::new(Keys(Mutex::new(b64(SECRET).into_bytes())));
    let notified = Arc::new(AtomicUsize::new(0));
    let n = notified.clone();
    let adv = Advertisers::new(
        keys.clone(),
        Arc::new(move |_: &str| {
            n.fetch_add(1, Ordering::Relaxed);
        }),
        "h3-ingress-test",
        timing,
        DnsMetrics::unregistered(),
    );
    Harness {
        adv,
        keys,
        notified,
    }
}

fn settings(server: &str) -> Settings {
    Settings::from_spec(&DnsAdvertise {
        server: server.to_string(),
        zones: vec![ZONE.to_string()],
        tsig_key_name: "h3-ingress".into(),
        tsig_secret_ref: TsigSecretRef {
            name: "dns-key".into(),
            key: "secret".into(),
        },
        algorithm: TsigAlgorithm::HmacSha256,
        ttl_seconds: 60,
    })
    .unwrap()
}

fn desired(server: &str, hosts: &BTreeSet<String>) -> Desired {
    Desired {
        settings: Some(settings(server)),
        hosts: hosts.clone(),
        port: 443,
    }
}

fn hosts(names: impl IntoIterator<Item = String>) -> BTreeSet<String> {
    names.into_iter().collect()
}

/// Polls `f` every 20 ms until it holds or `limit` passes; the time it took.
async fn until(limit: Duration, mut f: impl FnMut() -> bool) -> Option<Duration> {
    let t = Instant::now();
    while t.elapsed() < limit {
        if f() {
            return Some(t.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

fn state(h: &Harness) -> State {
    h.adv.state(LISTENER).expect("a task runs")
}

fn serial(k: &KnotFixture) -> u32 {
    let soa = k.query(ZONE, "SOA").unwrap();
    soa[0].split_whitespace().nth(2).unwrap().parse().unwrap()
}

fn row(what: &str, figure: String, target: &str) {
    println!("| {what:<58} | {figure:>18} | {target:<10} |");
}

fn ms(d: Duration) -> String {
    format!("{} ms", d.as_millis())
}

/// Served → record, not served → no record, five times; then 1,000 hosts, at rest, withdrawn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_follow_serving_in_batches_and_nothing_is_sent_at_rest() {
    let k = knot();
    let h = harness(Timing {
        recheck: Duration::from_secs(10),
        ..Timing::default()
    });
    let server = k.address();
    println!(
        "| {:<58} | {:>18} | {:<10} |",
        "measure", "figure", "target"
    );
    println!("|{:-<60}|{:-<20}|{:-<12}|", "", "", "");

    let (mut added, mut removed) = (Vec::new(), Vec::new());
    for i in 0..5 {
        let host = format!("web{i}.{ZONE}");
        h.adv
            .feed(LISTENER, desired(&server, &hosts([host.clone()])));
        let present = until(Duration::from_secs(10), || {
            k.query(&host, "HTTPS").unwrap() == ["1 . alpn=h3,h2"]
        })
        .await;
        added.push(present.expect("the record appears"));
        h.adv.feed(LISTENER, desired(&server, &BTreeSet::new()));
        let gone = until(Duration::from_secs(10), || {
            k.query(&host, "HTTPS").unwrap().is_empty()
                && k.query(&format!("_h3-ingress.{host}"), "TXT")
                    .unwrap()
                    .is_empty()
        })
        .await;
        removed.push(gone.expect("the record goes"));
    }
    let (add_max, del_max) = (*added.iter().max().unwrap(), *removed.iter().max().unwrap());
    row(
        "served -> HTTPS record in the zone (max of 5)",
        ms(add_max),
        "<= 5 s",
    );
    row(
        "not served -> record and registry gone (max of 5)",
        ms(del_max),
        "<= 5 s",
    );
    assert!(add_max <= Duration::from_secs(5) && del_max <= Duration::from_secs(5));
    assert_eq!(state(&h).reason, reasons::PUBLISHED);
    a_thousand_hosts(&h, &k, &server).await;
    the_users_records_are_left_alone(&h, &k, &server).await;
}

/// 1,000 hosts: published in batches, nothing sent at rest, withdrawn in batches.
async fn a_thousand_hosts(h: &Harness, k: &KnotFixture, server: &str) {
    let server = server.to_string();
    let many = hosts((0..1000).map(|i| format!("h{i:04}.{ZONE}")));
    let before = h.adv.updates_sent();
    h.adv.feed(LISTENER, desired(&server, &many));
    let took = until(Duration::from_secs(120), || state(h).published == 1000).await;
    let took = took.expect("1,000 records published");
    let updates = h.adv.updates_sent() - before;
    row("1,000 hosts published: time", ms(took), "");
    row(
        "1,000 hosts published: UPDATE messages",
        updates.to_string(),
        "batched",
    );
    assert!(
        updates <= 16,
        "{updates} UPDATEs for 1,000 hosts (batches of 64)"
    );
    for probe in ["h0000", "h0500", "h0999"] {
        assert_eq!(
            k.query(&format!("{probe}.{ZONE}"), "HTTPS").unwrap(),
            ["1 . alpn=h3,h2"]
        );
    }

    let rest: u64 = std::env::var("H3I_DNS_REST_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let (updates_before, serial_before) = (h.adv.updates_sent(), serial(k));
    let notes_before = h.notified.load(Ordering::Relaxed);
    let start = Instant::now();
    let mut feeds = 0;
    while start.elapsed() < Duration::from_secs(rest) {
        // As reconciles do (every REQUEUE, and on every unrelated change).
        h.adv.feed(LISTENER, desired(&server, &many));
        feeds += 1;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let measured = start.elapsed();
    let at_rest = h.adv.updates_sent() - updates_before;
    let per_minute = at_rest as f64 * 60.0 / measured.as_secs_f64();
    row(
        &format!(
            "at rest, 1,000 hosts, {feeds} feeds over {:.1} s: UPDATEs/min",
            measured.as_secs_f64()
        ),
        format!("{per_minute:.1}"),
        "0",
    );
    row(
        "at rest: zone serial changes",
        (serial(k) - serial_before).to_string(),
        "0",
    );
    row(
        "at rest: status changes asked for",
        (h.notified.load(Ordering::Relaxed) - notes_before).to_string(),
        "0",
    );
    assert_eq!(at_rest, 0);
    assert_eq!(serial(k), serial_before);

    let before = h.adv.updates_sent();
    h.adv.feed(LISTENER, desired(&server, &BTreeSet::new()));
    let took = until(Duration::from_secs(120), || {
        state(h).published == 0 && h.adv.updates_sent() > before
    })
    .await
    .expect("withdrawn");
    row("1,000 hosts withdrawn: time", ms(took), "");
    row(
        "1,000 hosts withdrawn: UPDATE messages",
        (h.adv.updates_sent() - before).to_string(),
        "batched",
    );
    assert!(k
        .query(&format!("h0500.{ZONE}"), "HTTPS")
        .unwrap()
        .is_empty());
}

/// A host with the user's own record is left alone and said; `advertise.dns` removed
/// withdraws ours and keeps the user's.
async fn the_users_records_are_left_alone(h: &Harness, k: &KnotFixture, server: &str) {
    let server = server.to_string();
    // The user's own record: left alone and said.
    h.adv.feed(
        LISTENER,
        desired(
            &server,
            &hosts([format!("user.{ZONE}"), format!("a.{ZONE}")]),
        ),
    );
    until(Duration::from_secs(10), || {
        state(h).reason == reasons::RECORD_CONFLICT
    })
    .await
    .expect("a conflict is reported");
    assert_eq!(
        k.query(&format!("user.{ZONE}"), "HTTPS").unwrap(),
        ["1 . alpn=h2"]
    );
    assert_eq!(
        k.query(&format!("a.{ZONE}"), "HTTPS").unwrap(),
        ["1 . alpn=h3,h2"]
    );
    row(
        "a host with the user's own record",
        state(h).reason.to_string(),
        "Conflict",
    );

    // advertise.dns removed: everything of ours withdrawn, the user's record kept.
    h.adv.feed(LISTENER, Desired::default());
    until(Duration::from_secs(10), || {
        state(h).reason == reasons::DISABLED
    })
    .await
    .expect("withdrawn when disabled");
    assert!(k.query(&format!("a.{ZONE}"), "HTTPS").unwrap().is_empty());
    assert_eq!(
        k.query(&format!("user.{ZONE}"), "HTTPS").unwrap(),
        ["1 . alpn=h2"]
    );
    row(
        "advertise.dns removed",
        state(h).reason.to_string(),
        "Disabled",
    );
}

/// Accepts TCP connections and closes them at once, noting when: a server that is down for
/// DNS (the connection resets before any answer).
async fn dead_server() -> (String, Arc<Mutex<Vec<Instant>>>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    tokio::spawn(async move {
        while let Ok((c, _)) = l.accept().await {
            s.lock().unwrap().push(Instant::now());
            drop(c);
        }
    });
    (addr, seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_down_or_a_refused_key_gives_the_reason_and_backs_off() {
    let k = knot();
    let h = harness(Timing {
        backoff_min: Duration::from_millis(200),
        backoff_max: Duration::from_millis(1600),
        recheck: Duration::from_secs(60),
    });
    let a = hosts([format!("a.{ZONE}")]);
    let (dead, attempts) = dead_server().await;
    h.adv.feed(LISTENER, desired(&dead, &a));
    until(Duration::from_secs(5), || {
        state(&h).reason == reasons::SERVER_UNREACHABLE
    })
    .await
    .expect("ServerUnreachable");
    tokio::time::sleep(Duration::from_millis(6500)).await;
    let times = attempts.lock().unwrap().clone();
    let gaps: Vec<u128> = times
        .windows(2)
        .map(|w| (w[1] - w[0]).as_millis())
        .collect();
    println!(
        "server down: {}; retries {} apart (ms): {gaps:?}",
        state(&h).message,
        times.len()
    );
    assert!(times.len() >= 5 && times.len() <= 9, "{gaps:?}");
    assert_eq!(h.adv.updates_sent(), 0, "nothing reached a zone");
    // Doubling from 200 ms, up to 1.6 s.
    // (Upper limits loose: a loaded machine delays wake-ups, never hastens them.)
    assert!(gaps[0] >= 150 && gaps[0] < 1000, "{gaps:?}");
    assert!(
        gaps.windows(2).all(|w| w[1] + 50 >= w[0]),
        "never faster: {gaps:?}"
    );
    assert!(
        gaps.iter().skip(3).all(|g| (1500..3000).contains(g)),
        "{gaps:?}"
    );

    // The server comes back (the listener now names the real one): published.
    h.adv.feed(LISTENER, desired(&k.address(), &a));
    until(Duration::from_secs(5), || {
        state(&h).reason == reasons::PUBLISHED
    })
    .await
    .expect("published once the server answers");

    // A key the server does not hold: refused, nothing changed; the rotated Secret is read
    // on the next retry.
    *h.keys.0.lock().unwrap() = b64(b"not the secret the server holds!").into_bytes();
    let b = hosts([format!("a.{ZONE}"), format!("b.{ZONE}")]);
    // Another key name makes a new publisher, which reads the Secret.
    let mut d = desired(&k.address(), &b);
    d.settings.as_mut().unwrap().ttl = 120;
    h.adv.feed(LISTENER, d.clone());
    until(Duration::from_secs(5), || {
        state(&h).reason == reasons::TSIG_REFUSED
    })
    .await
    .expect("TsigRefused");
    println!("key refused: {}", state(&h).message);
    assert!(k.query(&format!("b.{ZONE}"), "HTTPS").unwrap().is_empty());
    *h.keys.0.lock().unwrap() = b64(SECRET).into_bytes();
    let took = until(Duration::from_secs(5), || {
        state(&h).reason == reasons::PUBLISHED
    })
    .await
    .expect("the rotated key is used on the next retry");
    println!("rotated key used after {} ms", took.as_millis());
    assert_eq!(
        k.query(&format!("b.{ZONE}"), "HTTPS").unwrap(),
        ["1 . alpn=h3,h2"]
    );
    assert!(h.notified.load(Ordering::Relaxed) >= 4);
}
