//! Upstream addresses resolved once per configuration generation, not once per connection.
//!
//! The upstream may be a Service name that cluster DNS resolves (CoreDNS in the cluster
//! tests); looking it up on every upstream connect puts one DNS query in front of every new
//! connection (with PROXY protocol, every client connection). A [`Target`] is made per
//! distinct address when a generation is built and starts resolving at once; connects then
//! use its addresses until they are [`REFRESH_AFTER`] old, or until a connect to every one of
//! them failed (a Service that moved), when one caller resolves again and the others wait for
//! its answer. A failed lookup keeps the addresses already known and is not repeated within
//! [`RETRY_AFTER`], so a DNS outage costs a bounded number of queries and log lines.
//! IP literals are never looked up.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use prometheus::IntCounterVec;
use tokio::time::Instant;
use tracing::Level;

use crate::config::UpstreamAddress;
use crate::proxy::observe::logs::{limited, Reason};
use crate::proxy::observe::metrics::resolution;

/// How long resolved addresses are used before the name is looked up again: a Service's
/// ClusterIP rarely moves, and a moved one is noticed sooner by the connect failure.
pub const REFRESH_AFTER: Duration = Duration::from_secs(30);

/// How long a failed lookup is not repeated (the addresses known before it are used meanwhile).
pub const RETRY_AFTER: Duration = Duration::from_secs(1);

type LookupFuture = Pin<Box<dyn Future<Output = io::Result<Vec<SocketAddr>>> + Send>>;

/// How a name is turned into addresses: the system resolver, or a stand-in in tests.
pub type Lookup = Arc<dyn Fn(String) -> LookupFuture + Send + Sync>;

/// The system resolver (`getaddrinfo` through tokio).
pub fn system_lookup() -> Lookup {
    Arc::new(|name: String| {
        Box::pin(async move { Ok(tokio::net::lookup_host(name).await?.collect()) })
    })
}

#[derive(Default)]
struct Cached {
    addrs: Arc<Vec<SocketAddr>>,
    /// When `addrs` were resolved; `None` before the first answer.
    resolved: Option<Instant>,
    /// When the last lookup failed, if it failed.
    failed: Option<Instant>,
}

/// One upstream address as connects see it.
pub struct Target {
    /// `host:port`, as configured (and as errors name it).
    name: String,
    /// Set for an IP literal: its one address, never looked up.
    literal: Option<SocketAddr>,
    state: tokio::sync::Mutex<Cached>,
    lookup: Lookup,
    resolutions: IntCounterVec,
}

impl Target {
    pub fn new(address: &UpstreamAddress, lookup: Lookup, resolutions: IntCounterVec) -> Self {
        let literal = address
            .host
            .parse()
            .ok()
            .map(|ip| SocketAddr::new(ip, address.port));
        Target {
            name: address.to_string(),
            literal,
            state: tokio::sync::Mutex::new(Cached::default()),
            lookup,
            resolutions,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The addresses to connect to: the cached ones while fresh, else looked up now.
    pub async fn addrs(&self) -> io::Result<Arc<Vec<SocketAddr>>> {
        if let Some(a) = self.literal {
            return Ok(Arc::new(vec![a]));
        }
        let mut state = self.state.lock().await;
        let fresh = state
            .resolved
            .is_some_and(|at| at.elapsed() < REFRESH_AFTER);
        if fresh {
            return Ok(state.addrs.clone());
        }
        self.resolve(&mut state).await
    }

    /// After a connect to every one of `tried` failed: the addresses looked up again, unless
    /// another connect already did (then its answer). `None` for a literal, or when nothing
    /// new came of it (the caller keeps its error).
    pub async fn refresh(&self, tried: &Arc<Vec<SocketAddr>>) -> Option<Arc<Vec<SocketAddr>>> {
        if self.literal.is_some() {
            return None;
        }
        let mut state = self.state.lock().await;
        if !Arc::ptr_eq(&state.addrs, tried) {
            return Some(state.addrs.clone());
        }
        let fresh = self.resolve(&mut state).await.ok()?;
        (!Arc::ptr_eq(&fresh, tried) && fresh != *tried).then_some(fresh)
    }

    /// Looks the name up (holding the lock, so concurrent callers wait for this answer), or
    /// within [`RETRY_AFTER`] of a failure answers with what is known.
    async fn resolve(&self, state: &mut Cached) -> io::Result<Arc<Vec<SocketAddr>>> {
        let known = || (!state.addrs.is_empty()).then(|| state.addrs.clone());
        if state.failed.is_some_and(|at| at.elapsed() < RETRY_AFTER) {
            return known().ok_or_else(|| io::Error::other("the last lookup failed just now"));
        }
        let answer = (self.lookup)(self.name.clone()).await.and_then(|a| {
            if a.is_empty() {
                Err(io::Error::new(io::ErrorKind::NotFound, "no addresses"))
            } else {
                Ok(a)
            }
        });
        match answer {
            Ok(addrs) => {
                self.count(resolution::OK);
                state.failed = None;
                state.resolved = Some(Instant::now());
                if *state.addrs != addrs {
                    state.addrs = Arc::new(addrs);
                }
                Ok(state.addrs.clone())
            }
            Err(e) => {
                self.count(resolution::FAILED);
                state.failed = Some(Instant::now());
                limited!(Level::WARN, Reason::UpstreamResolve, upstream = %self.name, error = %e, "resolving the upstream failed");
                match known() {
                    Some(a) => Ok(a),
                    None => Err(e),
                }
            }
        }
    }

    fn count(&self, result: &str) {
        self.resolutions.with_label_values(&[result]).inc();
    }

    /// Starts resolving in the background (a new generation's targets), when a runtime runs.
    pub fn prefetch(self: &Arc<Self>) {
        if self.literal.is_some() {
            return;
        }
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let t = self.clone();
            rt.spawn(async move {
                let _ = t.addrs().await;
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;

    /// What the fake lookup answers; a test changes it.
    type Answers = Arc<Mutex<io::Result<Vec<SocketAddr>>>>;

    /// A lookup answering from a list that a test can change, counting its calls.
    fn fake(answers: Answers, calls: Arc<AtomicUsize>) -> Lookup {
        Arc::new(move |_name| {
            calls.fetch_add(1, Ordering::SeqCst);
            let answer = match &*answers.lock().unwrap() {
                Ok(a) => Ok(a.clone()),
                Err(e) => Err(io::Error::new(e.kind(), e.to_string())),
            };
            Box::pin(async move {
                tokio::time::sleep(Duration::from_millis(5)).await;
                answer
            })
        })
    }

    fn counter() -> IntCounterVec {
        IntCounterVec::new(prometheus::Opts::new("r", "-"), &["result"]).unwrap()
    }

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    fn setup(first: &str) -> (Arc<Target>, Answers, Arc<AtomicUsize>) {
        let answers = Arc::new(Mutex::new(Ok(vec![addr(first)])));
        let calls = Arc::new(AtomicUsize::new(0));
        let name = crate::config::parse_host_port("ingress.svc:443").unwrap();
        let t = Target::new(&name, fake(answers.clone(), calls.clone()), counter());
        (Arc::new(t), answers, calls)
    }

    #[tokio::test(start_paused = true)]
    async fn a_name_is_looked_up_once_until_it_is_old() {
        let (t, answers, calls) = setup("10.0.0.1:443");
        let many: Vec<_> = (0..1000).map(|_| t.addrs()).collect();
        for a in futures_util::future::join_all(many).await {
            assert_eq!(*a.unwrap(), [addr("10.0.0.1:443")]);
        }
        assert_eq!(
            calls.load(Ordering::SeqCst),
            1,
            "1000 concurrent connects, one lookup"
        );
        *answers.lock().unwrap() = Ok(vec![addr("10.0.0.2:443")]);
        tokio::time::advance(REFRESH_AFTER - Duration::from_secs(1)).await;
        assert_eq!(*t.addrs().await.unwrap(), [addr("10.0.0.1:443")]);
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(*t.addrs().await.unwrap(), [addr("10.0.0.2:443")]);
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        assert_eq!(t.resolutions.with_label_values(&[resolution::OK]).get(), 2);
    }

    /// A Service that moved: the connects that failed on the old address resolve once between
    /// them, and get the new one.
    #[tokio::test(start_paused = true)]
    async fn a_failed_connect_resolves_again_once() {
        let (t, answers, calls) = setup("10.0.0.1:443");
        let tried = t.addrs().await.unwrap();
        assert_eq!(
            t.refresh(&tried).await,
            None,
            "same answer: nothing new to try"
        );
        *answers.lock().unwrap() = Ok(vec![addr("10.0.0.9:443")]);
        let both = futures_util::future::join(t.refresh(&tried), t.refresh(&tried)).await;
        assert_eq!(both.0.as_deref(), Some(&vec![addr("10.0.0.9:443")]));
        assert_eq!(both.1.as_deref(), Some(&vec![addr("10.0.0.9:443")]));
        assert_eq!(
            calls.load(Ordering::SeqCst),
            3,
            "first, the same answer, the new one"
        );
    }

    /// DNS down: the known addresses stay in use, and the lookup is retried at most once per
    /// RETRY_AFTER.
    #[tokio::test(start_paused = true)]
    async fn a_failed_lookup_keeps_what_is_known_and_is_not_repeated_at_once() {
        let (t, answers, calls) = setup("10.0.0.1:443");
        t.addrs().await.unwrap();
        *answers.lock().unwrap() = Err(io::Error::new(io::ErrorKind::TimedOut, "dns down"));
        tokio::time::advance(REFRESH_AFTER).await;
        for _ in 0..100 {
            assert_eq!(*t.addrs().await.unwrap(), [addr("10.0.0.1:443")]);
        }
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        tokio::time::advance(RETRY_AFTER).await;
        t.addrs().await.unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 3);
        assert_eq!(
            t.resolutions.with_label_values(&[resolution::FAILED]).get(),
            2
        );

        // Never resolved and DNS down: the connect fails with the lookup's error.
        let (t, answers, _) = setup("10.0.0.1:443");
        *answers.lock().unwrap() = Err(io::Error::new(io::ErrorKind::TimedOut, "dns down"));
        assert_eq!(t.addrs().await.unwrap_err().kind(), io::ErrorKind::TimedOut);
    }

    #[tokio::test]
    async fn literals_are_never_looked_up() {
        let calls = Arc::new(AtomicUsize::new(0));
        let answers = Arc::new(Mutex::new(Ok(vec![])));
        for a in ["127.0.0.1:443", "[::1]:8443"] {
            let name = crate::config::parse_host_port(a).unwrap();
            let t = Target::new(&name, fake(answers.clone(), calls.clone()), counter());
            assert_eq!(*t.addrs().await.unwrap(), [addr(a)]);
            assert_eq!(t.refresh(&t.addrs().await.unwrap()).await, None);
        }
        assert_eq!(calls.load(Ordering::SeqCst), 0);
    }
}
