//! `h3-ingress probe {live|ready|startup}`: the kubelet's questions, asked of one process over
//! a unix socket in its pod's own `/tmp` (an emptyDir), so two pods of one listener on one
//! node (a rollout under hostNetwork, where they share the node's ports) are never confused.
//!
//! - **live**: the process answers at all. Its probe server runs from the very start, before
//!   the configuration is loaded, so loading thousands of hosts is never mistaken for being
//!   stuck; a process whose runtime is stuck does not answer and fails.
//! - **startup**: the configuration is loaded and the data plane runs (its UDP sockets may
//!   still be waiting for the port, which the readiness says).
//! - **ready**: it should receive traffic: hosts loaded, sockets bound, not draining and not
//!   superseded by a newer generation on the node.
//!
//! The wire format is one line each way: the check's name, then `ok` or `fail: REASON`.
//! [`answer`] is pure; [`serve`] and [`ask`] are the I/O around it.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::fds::{AcceptBackoff, AcceptSocket};

/// Where the data plane listens for probes under Kubernetes (the pod's `/tmp` emptyDir).
pub const DEFAULT_SOCKET: &str = "/tmp/h3-ingress-probe.sock";
/// How long one probe may take, both ways; below the probes' `timeoutSeconds`.
pub const TIMEOUT: Duration = Duration::from_secs(2);
/// A question is one short word; an answer may carry a reason.
const MAX_QUESTION: usize = 64;
const MAX_ANSWER: usize = 4096;

/// A kubelet question.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Check {
    Live,
    Ready,
    Startup,
}

impl Check {
    pub fn as_str(self) -> &'static str {
        match self {
            Check::Live => "live",
            Check::Ready => "ready",
            Check::Startup => "startup",
        }
    }

    fn parse(s: &str) -> Option<Check> {
        [Check::Live, Check::Ready, Check::Startup]
            .into_iter()
            .find(|c| c.as_str() == s)
    }
}

/// What the probe server asks the process.
pub trait ProbeSource: Send + Sync + 'static {
    /// Loaded and running, or why not yet.
    fn started(&self) -> Result<(), String>;
    /// Should receive traffic, or why not.
    fn ready(&self) -> Result<(), String>;
}

/// The answer line to a question line.
pub fn answer(source: &dyn ProbeSource, question: &str) -> String {
    let r = match Check::parse(question.trim()) {
        Some(Check::Live) => Ok(()),
        Some(Check::Startup) => source.started(),
        Some(Check::Ready) => source.ready(),
        None => Err(format!("unknown check {:?}", question.trim())),
    };
    match r {
        Ok(()) => "ok\n".to_string(),
        Err(why) => format!("fail: {}\n", why.replace('\n', " ")),
    }
}

/// Listens on `path` (replacing a stale socket file of an earlier run of this container)
/// until `shutdown`; a failed accept pauses the loop ([`AcceptBackoff`]).
pub fn serve(
    path: &Path,
    source: Arc<dyn ProbeSource>,
    shutdown: CancellationToken,
) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let listener = UnixListener::bind(path)?;
    let path = path.to_path_buf();
    tokio::spawn(async move {
        let mut backoff = AcceptBackoff::new(AcceptSocket::Probe);
        loop {
            let stream = tokio::select! {
                r = listener.accept() => match r {
                    Ok((s, _)) => {
                        backoff.accepted();
                        s
                    }
                    Err(e) => {
                        let pause = backoff.failed(&e);
                        tokio::select! {
                            _ = tokio::time::sleep(pause) => continue,
                            _ = shutdown.cancelled() => break,
                        }
                    }
                },
                _ = shutdown.cancelled() => break,
            };
            let source = source.clone();
            tokio::spawn(async move {
                let _ = tokio::time::timeout(TIMEOUT, one(stream, source.as_ref())).await;
            });
        }
        let _ = std::fs::remove_file(&path);
    });
    Ok(())
}

async fn one(stream: UnixStream, source: &dyn ProbeSource) -> io::Result<()> {
    let (r, mut w) = stream.into_split();
    let mut line = String::new();
    BufReader::new(r.take(MAX_QUESTION as u64))
        .read_line(&mut line)
        .await?;
    w.write_all(answer(source, &line).as_bytes()).await
}

/// Why a probe failed, as `h3-ingress probe` prints it.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("{path}: {source} (is the data plane running in this pod?)")]
    Connect { path: PathBuf, source: io::Error },
    #[error("{path}: no answer within {TIMEOUT:?}")]
    Timeout { path: PathBuf },
    #[error("{0}")]
    Failed(String),
}

/// Asks the process listening on `path`.
pub async fn ask(path: &Path, check: Check) -> Result<String, ProbeError> {
    let talk = async {
        let mut s = UnixStream::connect(path)
            .await
            .map_err(|source| ProbeError::Connect {
                path: path.to_path_buf(),
                source,
            })?;
        let io = |source| ProbeError::Connect {
            path: path.to_path_buf(),
            source,
        };
        s.write_all(format!("{}\n", check.as_str()).as_bytes())
            .await
            .map_err(io)?;
        let mut line = String::new();
        BufReader::new(s.take(MAX_ANSWER as u64))
            .read_line(&mut line)
            .await
            .map_err(io)?;
        Ok::<_, ProbeError>(line)
    };
    let line = tokio::time::timeout(TIMEOUT, talk)
        .await
        .map_err(|_| ProbeError::Timeout {
            path: path.to_path_buf(),
        })??;
    if line.trim_end() == "ok" {
        Ok(format!("{}: ok", check.as_str()))
    } else {
        Err(ProbeError::Failed(format!(
            "{}: {}",
            check.as_str(),
            line.trim_end()
        )))
    }
}

/// A probe server that could not start: logged, the process goes on (the kubelet's probes
/// then fail and say why).
pub fn serve_or_warn(path: &Path, source: Arc<dyn ProbeSource>, shutdown: CancellationToken) {
    if let Err(e) = serve(path, source, shutdown) {
        warn!(path = %path.display(), error = %e, "probe socket not available");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    struct Fake {
        started: AtomicBool,
    }

    impl ProbeSource for Fake {
        fn started(&self) -> Result<(), String> {
            if self.started.load(Ordering::Relaxed) {
                Ok(())
            } else {
                Err("loading 2000 hosts".into())
            }
        }
        fn ready(&self) -> Result<(), String> {
            Err("superseded\nby a newer process".into())
        }
    }

    #[tokio::test]
    async fn each_check_is_answered_over_the_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("probe.sock");
        std::fs::write(&path, b"stale").unwrap();
        let fake = Arc::new(Fake {
            started: AtomicBool::new(false),
        });
        let stop = CancellationToken::new();
        serve(&path, fake.clone(), stop.clone()).unwrap();
        assert_eq!(ask(&path, Check::Live).await.unwrap(), "live: ok");
        let e = ask(&path, Check::Startup).await.unwrap_err().to_string();
        assert_eq!(e, "startup: fail: loading 2000 hosts");
        fake.started.store(true, Ordering::Relaxed);
        assert!(ask(&path, Check::Startup).await.is_ok());
        let e = ask(&path, Check::Ready).await.unwrap_err().to_string();
        assert_eq!(e, "ready: fail: superseded by a newer process");
        assert_eq!(
            answer(fake.as_ref(), "nap\n"),
            "fail: unknown check \"nap\"\n"
        );
        stop.cancel();
        let other = dir.path().join("none.sock");
        let e = ask(&other, Check::Live).await.unwrap_err().to_string();
        assert!(e.contains("none.sock") && e.contains("data plane"), "{e}");
    }
}
