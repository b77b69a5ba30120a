//! S6's mechanics, shared by the bench and the smoke: a second client address, the server's
//! TCP congestion control per client address (a per-route `congctl`), and two downloads at
//! once whose throughput through the one bottleneck the router counts per client address.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::client::Sample;
use crate::netns;
use crate::session::Session;
use crate::topology::{CLIENT2_V4, CLIENT_V4, PREFIX_V4};
use crate::LabError;

/// One S6 run: what each client address received through the bottleneck in the window.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ShareSample {
    /// The window as measured between the two counter snapshots, seconds.
    pub window_s: f64,
    /// IP bytes the bottleneck delivered to the row's client address (`CLIENT_V4`).
    pub row_bytes: u64,
    /// IP bytes delivered to the competing flow's address (`CLIENT2_V4`).
    pub other_bytes: u64,
    /// Packets of each flow the drop-tail queue dropped in the window.
    pub row_drops: u64,
    pub other_drops: u64,
    /// The congestion control of the server's TCP sockets toward each client address, as
    /// `ss -ti` showed them in the window ("" when there was no such socket: an h3 row).
    pub row_tcp_cc: String,
    pub other_tcp_cc: String,
    /// Why this run does not count (a flow ended inside the window, or had no handshake
    /// before it), if it does not.
    pub invalid: Option<String>,
    /// The run does not count because a handshake had not completed before the window.
    #[serde(default)]
    pub handshake_late: bool,
}

impl ShareSample {
    /// The row's share of what the two flows received; `None` for a run that does not count.
    pub fn share(&self) -> Option<f64> {
        let total = self.row_bytes + self.other_bytes;
        (self.invalid.is_none() && total > 0).then(|| self.row_bytes as f64 / total as f64)
    }
    pub fn row_mbit(&self) -> f64 {
        mbit(self.row_bytes, self.window_s)
    }
    pub fn other_mbit(&self) -> f64 {
        mbit(self.other_bytes, self.window_s)
    }
}

fn mbit(bytes: u64, secs: f64) -> f64 {
    if secs > 0.0 {
        bytes as f64 * 8.0 / secs / 1e6
    } else {
        0.0
    }
}

/// Gives the client namespace's TUN device the second client address (idempotent).
pub fn add_second_client(s: &Session) -> Result<(), LabError> {
    let (ns, dev) = (&s.names.client_ns, &s.names.client_tun);
    let addr = format!("{CLIENT2_V4}/{PREFIX_V4}");
    let shown = netns::ip(&["-n", ns, "-4", "addr", "show", "dev", dev])?;
    if !shown.contains(&format!("inet {addr} ")) {
        netns::ip(&["-n", ns, "addr", "add", &addr, "dev", dev])?;
    }
    Ok(())
}

/// Puts `cc` on the host's allowed list (a non-initial namespace may only pick what it lists)
/// and checks it took.
pub fn allow_tcp_cc(cc: &str) -> Result<(), LabError> {
    let path = "/proc/sys/net/ipv4/tcp_allowed_congestion_control";
    let read = || {
        std::fs::read_to_string(path).map_err(|e| LabError::io("read allowed TCP controllers", e))
    };
    let allowed = read()?;
    if allowed.split_whitespace().any(|x| x == cc) {
        return Ok(());
    }
    let set = format!(
        "net.ipv4.tcp_allowed_congestion_control={} {cc}",
        allowed.trim()
    );
    netns::run("sysctl", &["-q", "-w", &set])?;
    let now = read()?;
    if !now.split_whitespace().any(|x| x == cc) {
        return Err(LabError::Failed(format!(
            "{cc} is not in tcp_allowed_congestion_control after setting it: {}",
            now.trim()
        )));
    }
    Ok(())
}

/// Makes the server's TCP use `cc` toward `client` (a per-route `congctl`) and checks the
/// route carries it.
pub fn set_route_cc(s: &Session, client: Ipv4Addr, cc: &str) -> Result<(), LabError> {
    allow_tcp_cc(cc)?;
    let (ns, dev) = (&s.names.server_ns, &s.names.server_tun);
    let dst = format!("{client}/32");
    netns::ip(&[
        "-n", ns, "route", "replace", &dst, "dev", dev, "congctl", cc,
    ])?;
    let shown = netns::ip(&["-n", ns, "route", "show", &dst])?;
    if !shown.contains(&format!("congctl {cc}")) {
        return Err(LabError::Failed(format!(
            "the route to {client} in {ns} does not carry congctl {cc}: {}",
            shown.trim()
        )));
    }
    Ok(())
}

/// Removes the per-client routes again, so later cases use the namespace's controller.
pub fn clear_route_cc(s: &Session) {
    for client in [CLIENT_V4, CLIENT2_V4] {
        let dst = format!("{client}/32");
        let _ = netns::ip(&["-n", &s.names.server_ns, "route", "del", &dst]);
    }
}

/// The congestion controls `ss -tin` shows for the server's TCP sockets, with " paced" after
/// those that carry a maximum pacing rate (`pacing_rate A/B`: SO_MAX_PACING_RATE is set, so
/// the kernel paces the flow). Pure: each socket's info line (indented) starts with the
/// controller's name.
pub fn socket_ccs(ss: &str) -> Vec<String> {
    let mut v: Vec<String> = ss
        .lines()
        .filter(|l| l.starts_with([' ', '\t']))
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            let cc = words.next()?;
            let paced = words
                .skip_while(|w| *w != "pacing_rate")
                .nth(1)
                .is_some_and(|rate| rate.contains('/'));
            let plain = cc.bytes().all(|b| b.is_ascii_alphanumeric());
            plain.then(|| match paced {
                true => format!("{cc} paced"),
                false => cc.to_string(),
            })
        })
        .collect();
    v.sort();
    v.dedup();
    v
}

/// What the server's TCP sockets toward `client` run, joined ("" when it has none).
fn tcp_cc_toward(s: &Session, client: Ipv4Addr) -> String {
    let dst = client.to_string();
    let ns = &s.names.server_ns;
    netns::run("ip", &["netns", "exec", ns, "ss", "-tinH", "dst", &dst])
        .map(|o| socket_ccs(&o).join(","))
        .unwrap_or_else(|e| format!("ss failed: {e}"))
}

/// How long to wait before and while counting, seconds.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    pub warm_up_s: f64,
    pub window_s: f64,
}

type Flow<'a> = Box<dyn FnOnce() -> Result<Sample, LabError> + Send + 'a>;

/// Runs the row's flow (from `CLIENT_V4`) and the competing one (from `CLIENT2_V4`) at once;
/// counts what each address received between `warm_up_s` and `warm_up_s + window_s`. Both
/// flows must outlast the window (their time limit ends them) for the run to count. Returns
/// the run and both clients' samples.
pub fn measure<'a>(
    s: &'a Session,
    w: Window,
    row: Flow<'a>,
    other: Flow<'a>,
) -> Result<(ShareSample, Sample, Sample), LabError> {
    let t0 = Instant::now();
    std::thread::scope(|sc| {
        let hr = sc.spawn(move || row().map(|x| (x, t0.elapsed())));
        let ho = sc.spawn(move || other().map(|x| (x, t0.elapsed())));
        std::thread::sleep(Duration::from_secs_f64(w.warm_up_s));
        let before = s.snapshot()?;
        let from = Instant::now();
        std::thread::sleep(Duration::from_secs_f64(w.window_s / 2.0));
        let row_tcp_cc = tcp_cc_toward(s, CLIENT_V4);
        let other_tcp_cc = tcp_cc_toward(s, CLIENT2_V4);
        let end = t0 + Duration::from_secs_f64(w.warm_up_s + w.window_s);
        std::thread::sleep(end.saturating_duration_since(Instant::now()));
        let after = s.snapshot()?;
        let window_s = from.elapsed().as_secs_f64();
        let join = |h: std::thread::ScopedJoinHandle<'_, _>| {
            h.join()
                .map_err(|_| LabError::Failed("a client thread panicked".into()))?
        };
        let (row_x, row_t): (Sample, Duration) = join(hr)?;
        let (other_x, other_t): (Sample, Duration) = join(ho)?;
        let d = after.counters.delta(&before.counters);
        let by = |a: Ipv4Addr| d.s2c_by_client.get(&a.octets()[3]).cloned();
        let (r, o) = (
            by(CLIENT_V4).unwrap_or_default(),
            by(CLIENT2_V4).unwrap_or_default(),
        );
        let needed = Duration::from_secs_f64(w.warm_up_s + w.window_s);
        let flows = [
            ("the row's", &row_x, row_t),
            ("the competing", &other_x, other_t),
        ];
        let ended = flows
            .into_iter()
            .find(|(_, _, t)| *t < needed)
            .map(|(who, x, t)| {
                format!(
                    "{who} flow ended after {:.1} s, inside the window: {}",
                    t.as_secs_f64(),
                    x.error.clone().unwrap_or_else(|| "completed".into())
                )
            });
        let late = late_handshake(&flows, w.warm_up_s);
        let handshake_late = ended.is_none() && late.is_some();
        let invalid = ended.or(late);
        let sample = ShareSample {
            window_s,
            row_bytes: r.tx_bytes,
            other_bytes: o.tx_bytes,
            row_drops: r.drop_queue,
            other_drops: o.drop_queue,
            row_tcp_cc,
            other_tcp_cc,
            invalid,
            handshake_late,
        };
        Ok((sample, row_x, other_x))
    })
}

/// A flow whose handshake had not completed when the window began did not compete in it: the
/// run measures a handshake racing a full queue (S2's question), not the share.
fn late_handshake(flows: &[(&str, &Sample, Duration)], warm_up_s: f64) -> Option<String> {
    flows
        .iter()
        .find(|(_, x, _)| x.time_appconnect <= 0.0 || x.time_appconnect > warm_up_s)
        .map(|(who, x, _)| match x.time_appconnect {
            t if t > 0.0 => format!("{who} handshake completed {t:.1} s in, after the warm-up"),
            _ => format!("{who} flow never completed its handshake"),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_ccs_reads_the_info_lines_of_ss() {
        let out =
            "ESTAB 0 1448 10.77.2.2:443 10.77.1.3:40000\n\t cubic wscale:7,7 rto:260 rtt:52/1\n\
                   ESTAB 0 0 10.77.2.2:443 10.77.1.3:40002\n\t bbr wscale:7,7 rto:252\n\
                   ESTAB 0 0 10.77.2.2:443 10.77.1.3:40004\n\t cubic wscale:7,7\n";
        assert_eq!(socket_ccs(out), vec!["bbr", "cubic"]);
        assert!(socket_ccs("").is_empty());
        let paced = "ESTAB 0 0 10.77.2.2:443 10.77.1.3:40000\n\t cubic wscale:7,7 rtt:203/1 \
                     pacing_rate 13352256bps/34359738352bps delivery_rate 1bps\n\
                     ESTAB 0 0 10.77.2.2:443 10.77.1.4:40002\n\t bbr rtt:201/1 \
                     pacing_rate 9000000bps delivery_rate 1bps\n";
        assert_eq!(socket_ccs(paced), vec!["bbr", "cubic paced"]);
    }

    #[test]
    fn share_counts_only_valid_runs() {
        let mut x = ShareSample {
            window_s: 10.0,
            row_bytes: 10_000_000,
            other_bytes: 15_000_000,
            ..ShareSample::default()
        };
        assert_eq!(x.share(), Some(0.4));
        assert!((x.row_mbit() - 8.0).abs() < 1e-9);
        assert!((x.other_mbit() - 12.0).abs() < 1e-9);
        x.invalid = Some("ended".into());
        assert_eq!(x.share(), None);
        assert_eq!(ShareSample::default().share(), None);
    }

    #[test]
    fn a_flow_without_a_handshake_before_the_window_does_not_count() {
        let at = |t: f64| Sample {
            time_appconnect: t,
            ..Sample::default()
        };
        let d = Duration::from_secs(13);
        let (early, late, never) = (at(0.2), at(4.5), at(0.0));
        assert_eq!(
            late_handshake(&[("a", &early, d), ("b", &early, d)], 3.0),
            None
        );
        let why = late_handshake(&[("the row's", &late, d), ("b", &early, d)], 3.0);
        assert_eq!(
            why.as_deref(),
            Some("the row's handshake completed 4.5 s in, after the warm-up")
        );
        let why = late_handshake(&[("a", &early, d), ("the competing", &never, d)], 3.0);
        assert_eq!(
            why.as_deref(),
            Some("the competing flow never completed its handshake")
        );
    }
}
