//! Support library of the cluster scenarios (`h3i-scenarios SCENARIO`): they drive the product
//! on the test cluster of `scripts/cluster.sh` through its own API types and print what they
//! proved. How to write one: `tests/cluster/README.md`, "Writing a scenario".
//!
//! - [`Run`], [`ok`], [`info`], [`indent`] print timed steps and the step table
//! - [`Error`], [`fail`], [`expect_eq`], [`ensure!`] are checks that say what they expected
//!   and what they got
//! - [`poll::until`] and [`poll::wait_ok`] poll with deadlines
//! - [`k8s`] applies (server-side), gets, patches and deletes objects, reads conditions and events
//! - [`Env`] is what `scripts/cluster.sh env` says; [`env::cluster`] runs that script
//! - [`cmd`] runs subprocesses (helm, kubectl where kubectl is what is tested, `ip netns exec`)
//! - [`h3`] holds the HTTP/3 clients (aioquic, trixie curl), [`prom`] the admin endpoints and
//!   metrics, [`promapi`] a Prometheus server's HTTP API (queries, targets, rules)
//! - [`Pki`] and [`Nginx`] make a throw-away PKI and Debian nginx in each node's namespace
//! - [`pods`] finds a pod's process and token; [`report`] prints what a failure shows
//! - [`app`] installs the chart, Secrets, Ingresses and listeners, and removes what a run left;
//!   [`gateway_api`] installs the Gateway API's CRDs and reaches its objects
//! - [`roll`] runs clients across a roll and judges what they saw

pub mod app;
pub mod cmd;
pub mod env;
pub mod error;
pub mod gateway_api;
pub mod h3;
pub mod k8s;
pub mod nginx;
pub mod pki;
pub mod pods;
pub mod poll;
pub mod prom;
pub mod promapi;
pub mod report;
pub mod roll;
pub mod run;

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

pub use env::Env;
pub use error::{expect_eq, fail, Error, Result};
pub use nginx::Nginx;
pub use pki::Pki;
pub use run::{indent, info, ok, Run};

/// One scenario: what it runs, and what it removes afterwards. `main` drives it with [`drive`].
// Static dispatch only (main matches the scenario's name), so the futures need not be Send.
#[allow(async_fn_in_trait)]
pub trait Scenario {
    /// The word of `TITLE PASSED in Ns` (`JOURNEY`).
    const TITLE: &'static str;
    /// The namespace whose container logs a failure report shows.
    fn namespace(&self) -> &str;
    /// The steps; the first failed check ends them.
    async fn run(&mut self, run: &mut Run) -> Result<()>;
    /// Removes what the run made (unless asked to keep it); runs after a pass and after the
    /// failure report.
    async fn cleanup(&mut self);
}

/// Runs a scenario: its steps, then on failure the verdict, the step table and the failure
/// report, then its clean-up. Returns whether it passed.
pub async fn drive<S: Scenario>(mut s: S, run: &mut Run, client: &kube::Client) -> bool {
    let result = s.run(run).await;
    match &result {
        Ok(()) => run.passed(),
        Err(e) => {
            run.failed(e);
            report::failure_report(client, s.namespace()).await;
        }
    }
    s.cleanup().await;
    result.is_ok()
}

/// Whether this process runs as root (the scenarios need network namespaces and the cluster's
/// processes).
pub fn is_root() -> bool {
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// A number unique in this process, for scratch names.
pub fn unique() -> u64 {
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

/// A new scratch directory `/tmp/PREFIX.XXXXXX` (the name says which run left it).
pub fn scratch_dir(prefix: &str) -> Result<PathBuf> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let dir = std::env::temp_dir().join(format!(
        "{prefix}.{:06x}",
        (nanos ^ std::process::id()) & 0xff_ffff
    ));
    std::fs::create_dir_all(&dir).map_err(|source| Error::Io {
        context: format!("mkdir {}", dir.display()),
        source,
    })?;
    Ok(dir)
}

/// `n` bytes from the kernel's random source (files to serve and upload).
pub fn random_bytes(n: usize) -> Result<Vec<u8>> {
    use std::io::Read;
    let mut buf = vec![0u8; n];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .map_err(|source| Error::Io {
            context: "read /dev/urandom".into(),
            source,
        })?;
    Ok(buf)
}
