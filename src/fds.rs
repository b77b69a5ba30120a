//! File descriptors of the commands that serve (`proxy`, `operator`, `demo`): the limit
//! raised at start, the count exported, and accept loops that survive running out.
//!
//! Container runtimes start a process with the soft `RLIMIT_NOFILE` at 1024 (containerd 2.x
//! sets it so for every container; the hard limit is far above), and nothing raises it for
//! us. The data plane keeps one upstream connection per active host (more with HTTP/1.1
//! upstreams, one per client connection with `proxyProtocol`), so a node with a few thousand
//! busy hosts passes 1024: every new upstream `connect` fails (502), and every accept fails
//! with EMFILE. [`raise_nofile_limit`] lifts the soft limit to the hard one, which needs no
//! privilege; [`FdCollector`] exports both the count and the limit.
//!
//! An accept that fails with EMFILE leaves the connection in the listen queue, so the socket
//! stays readable and the next accept fails at once: a loop that retries at once spins on a
//! core, and its probes (the kubelet's, over the same exhausted process) time out until the
//! pod is killed. [`AcceptBackoff`] pauses every accept loop after an error (10 ms doubling
//! to 1 s, back to 10 ms after an accept succeeds), counts the error and logs it at most
//! once a minute per socket.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{IntCounterVec, IntGauge, Opts};

/// The first pause after an accept error; doubled after each further one...
pub const FIRST_PAUSE: Duration = Duration::from_millis(10);
/// ...up to this, the longest a queued connection (a probe) waits once descriptors are free.
pub const MAX_PAUSE: Duration = Duration::from_secs(1);
/// One log line per socket per this long; the counter has every error.
const LOG_EVERY_SECS: u64 = 60;

/// The names of the two process metrics every Prometheus client library exports under these
/// names (so dashboards and alerts written for them work unchanged); the prometheus crate's
/// own process collector would export them too, but it is not built in (its `process`
/// feature is off), so they are registered here, once, by [`FdCollector`].
pub const OPEN_FDS: &str = "process_open_fds";
pub const MAX_FDS: &str = "process_max_fds";
/// The accept-error counter's name in the data plane and in the operator.
pub const PROXY_ACCEPT_ERRORS: &str = "h3_ingress_accept_errors_total";
pub const OPERATOR_ACCEPT_ERRORS: &str = "h3_ingress_operator_accept_errors_total";

/// The soft limit as it was, and as it is after [`raise_nofile_limit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NofileLimit {
    pub was: u64,
    pub soft: u64,
    pub hard: u64,
}

fn getrlimit() -> io::Result<libc::rlimit> {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(l)
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit (no privilege needed).
pub fn raise_nofile_limit() -> io::Result<NofileLimit> {
    let l = getrlimit()?;
    let was = l.rlim_cur;
    if l.rlim_cur < l.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: l.rlim_max,
            rlim_max: l.rlim_max,
        };
        // SAFETY: setrlimit reads one rlimit from a struct we own.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    let now = getrlimit()?;
    Ok(NofileLimit {
        was,
        soft: now.rlim_cur,
        hard: now.rlim_max,
    })
}

/// [`raise_nofile_limit`], with one log line saying what the limit was and is.
pub fn raise_and_log() {
    match raise_nofile_limit() {
        Ok(l) if l.was != l.soft => tracing::info!(
            was = l.was,
            soft = l.soft,
            hard = l.hard,
            "file descriptor limit raised from {} to the hard limit {}",
            l.was,
            l.hard
        ),
        Ok(l) => tracing::info!(
            soft = l.soft,
            hard = l.hard,
            "file descriptor limit {} (the hard limit)",
            l.soft
        ),
        Err(e) => tracing::warn!(
            error = %e,
            "could not raise the file descriptor limit; connections beyond it will fail"
        ),
    }
}

/// The soft limit now.
pub fn max_fds() -> Option<u64> {
    getrlimit().ok().map(|l| l.rlim_cur)
}

/// Descriptors open now (the one reading `/proc/self/fd` included, as every client library
/// counts). When the directory cannot even be opened for want of a descriptor, all are in use.
pub fn open_fds() -> Option<u64> {
    match std::fs::read_dir("/proc/self/fd") {
        Ok(d) => Some(d.count() as u64),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => max_fds(),
        Err(_) => None,
    }
}

/// The accepting sockets, the values of the accept-error counter's `socket` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcceptSocket {
    /// `/metrics`, `/healthz`, `/readyz`, `/status` (data plane and operator).
    Admin,
    /// `h3-ingress probe`, the kubelet's questions (data plane).
    Probe,
    /// Processes sharing the port on a host (data plane rollouts).
    Handover,
    /// The stand-in TCP ingress of `demo`.
    Ingress,
}

impl AcceptSocket {
    pub const ALL: [AcceptSocket; 4] = [
        AcceptSocket::Admin,
        AcceptSocket::Probe,
        AcceptSocket::Handover,
        AcceptSocket::Ingress,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            AcceptSocket::Admin => "admin",
            AcceptSocket::Probe => "probe",
            AcceptSocket::Handover => "handover",
            AcceptSocket::Ingress => "ingress",
        }
    }
}

/// Errors per socket, and the minute of each socket's last log line (process-wide: the
/// limit is the process's).
static ERRORS: [AtomicU64; AcceptSocket::ALL.len()] =
    [const { AtomicU64::new(0) }; AcceptSocket::ALL.len()];
static LOGGED_MINUTE: [AtomicU64; AcceptSocket::ALL.len()] =
    [const { AtomicU64::new(0) }; AcceptSocket::ALL.len()];

/// Accept errors counted so far on `socket`.
pub fn accept_errors(socket: AcceptSocket) -> u64 {
    ERRORS[socket as usize].load(Ordering::Relaxed)
}

/// The pause after `prev` (none: the first error since the last accept). Pure.
pub fn next_pause(prev: Option<Duration>) -> Duration {
    prev.map_or(FIRST_PAUSE, |p| (p * 2).min(MAX_PAUSE))
}

/// One accept loop's pause after errors.
#[derive(Debug)]
pub struct AcceptBackoff {
    socket: AcceptSocket,
    last: Option<Duration>,
}

impl AcceptBackoff {
    pub fn new(socket: AcceptSocket) -> Self {
        Self { socket, last: None }
    }

    /// An accept succeeded: the next error pauses [`FIRST_PAUSE`] again.
    pub fn accepted(&mut self) {
        self.last = None;
    }

    /// Counts the error, logs it (once a minute per socket) and returns how long to pause
    /// before the next accept.
    pub fn failed(&mut self, e: &io::Error) -> Duration {
        let pause = next_pause(self.last);
        self.last = Some(pause);
        let i = self.socket as usize;
        let total = ERRORS[i].fetch_add(1, Ordering::Relaxed) + 1;
        let minute = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() / LOG_EVERY_SECS);
        if LOGGED_MINUTE[i].swap(minute, Ordering::Relaxed) != minute {
            tracing::warn!(
                socket = self.socket.as_str(),
                error = %e,
                errors_so_far = total,
                ?pause,
                "accept failed; pausing this socket's accepts (at most one such line a minute)"
            );
        }
        pause
    }
}

/// `process_open_fds`, `process_max_fds` and the accept errors by socket, read at scrape
/// time; `accept_errors` names the counter ([`PROXY_ACCEPT_ERRORS`] or
/// [`OPERATOR_ACCEPT_ERRORS`]).
pub struct FdCollector {
    open: IntGauge,
    max: IntGauge,
    errors: IntCounterVec,
}

impl FdCollector {
    pub fn new(accept_errors: &str) -> Self {
        let gauge = |name: &str, help: &str| IntGauge::new(name, help).expect("valid gauge");
        let errors = IntCounterVec::new(
            Opts::new(
                accept_errors,
                "Failed accepts by socket (admin, probe, handover, ingress); each pauses that socket's accepts 10 ms to 1 s (EMFILE: the file descriptor limit is reached).",
            ),
            &["socket"],
        )
        .expect("valid counter");
        for s in AcceptSocket::ALL {
            errors.with_label_values(&[s.as_str()]);
        }
        Self {
            open: gauge(OPEN_FDS, "Number of open file descriptors."),
            max: gauge(
                MAX_FDS,
                "Maximum number of open file descriptors (the soft RLIMIT_NOFILE).",
            ),
            errors,
        }
    }
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl Collector for FdCollector {
    fn desc(&self) -> Vec<&Desc> {
        let mut d = self.open.desc();
        d.extend(self.max.desc());
        d.extend(self.errors.desc());
        d
    }

    fn collect(&self) -> Vec<MetricFamily> {
        if let Some(n) = open_fds() {
            self.open.set(to_i64(n));
        }
        if let Some(n) = max_fds() {
            self.max.set(to_i64(n));
        }
        for s in AcceptSocket::ALL {
            let c = self.errors.with_label_values(&[s.as_str()]);
            c.inc_by(accept_errors(s).saturating_sub(c.get()));
        }
        let mut out = self.open.collect();
        out.extend(self.max.collect());
        out.extend(self.errors.collect());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_double_up_to_the_bound_and_start_over_after_an_accept() {
        let mut b = AcceptBackoff::new(AcceptSocket::Ingress);
        let emfile = io::Error::from_raw_os_error(libc::EMFILE);
        let before = accept_errors(AcceptSocket::Ingress);
        let pauses: Vec<Duration> = (0..10).map(|_| b.failed(&emfile)).collect();
        assert_eq!(pauses[0], FIRST_PAUSE);
        assert_eq!(pauses[1], FIRST_PAUSE * 2);
        assert!(pauses.windows(2).all(|w| w[1] >= w[0]));
        assert_eq!(*pauses.last().unwrap(), MAX_PAUSE);
        assert_eq!(accept_errors(AcceptSocket::Ingress) - before, 10);
        b.accepted();
        assert_eq!(b.failed(&emfile), FIRST_PAUSE);
    }

    #[test]
    fn the_collector_reports_descriptors_the_limit_and_every_socket() {
        let c = FdCollector::new(PROXY_ACCEPT_ERRORS);
        let registry = prometheus::Registry::new();
        registry.register(Box::new(c)).unwrap();
        let families = registry.gather();
        let value = |name: &str| {
            let f = families.iter().find(|f| f.name() == name).unwrap();
            f.get_metric()[0].get_gauge().get_value()
        };
        let open = value(OPEN_FDS);
        assert!(open >= 3.0, "stdin, stdout, stderr at least: {open}");
        assert_eq!(value(MAX_FDS) as u64, max_fds().unwrap());
        let errors = families
            .iter()
            .find(|f| f.name() == PROXY_ACCEPT_ERRORS)
            .unwrap();
        assert_eq!(errors.get_metric().len(), AcceptSocket::ALL.len());
    }

    /// Raising twice is harmless and never lowers anything (the test process may already
    /// run at its hard limit).
    #[test]
    fn raising_reaches_the_hard_limit() {
        let l = raise_nofile_limit().unwrap();
        assert_eq!(l.soft, l.hard);
        assert!(l.soft >= l.was);
        assert_eq!(raise_nofile_limit().unwrap().was, l.soft);
    }
}
