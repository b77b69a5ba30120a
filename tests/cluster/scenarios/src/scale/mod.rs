//! The scale harness: HOSTS annotated hosts in HOSTS/4 namespaces, each with its own TLS Secret
//! (a distinct certificate from one test CA), a share of them HTTPRoutes on Gateways, against a
//! 4-host baseline in the same run; then one table of what the product costs at each size.
//! h3-ingress is a black box here: the harness writes only what users, cert-manager and a
//! gateway controller write, and reads the listener's status, the pods' /metrics, the API
//! server's /metrics and the node agent's files, through its Go tool (`tests/cluster/scale`,
//! client-go and quic-go, built once per source hash into the cluster's cache), so it measures
//! any implementation alike. Every wait is bounded, so a run on code that misses the targets
//! ends and says what it saw. `h3i-scenarios scale` lists the options ([`opts::USAGE`]).
//!
//! A port of the former `tests/cluster/scale.sh`, which it replaced before it had itself run
//! end to end on a cluster (it runs only with `H3I_CLUSTER_SCALE=1`, not in CI).

mod measure;
pub mod opts;

use std::path::PathBuf;
use std::process::Stdio;

use h3i_scenarios::app::{self, NS_OP};
use h3i_scenarios::cmd::{output, repo};
use h3i_scenarios::error::IoContext;
use h3i_scenarios::{fail, indent, Env, Error, Result, Run, Scenario};
use k8s_openapi::api::core::v1::Namespace;
use kube::{Api, Client};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

use crate::FromEnv;
pub use opts::Opts;

const LISTENER: &str = "scale";
const CLASS: &str = "nginx";
const GW_CLASS: &str = "h3i-scale";
/// Every namespace the tool makes carries this label.
const NS_LABEL: &str = "h3i-scale=1";

/// The run's state.
pub struct Scale {
    env: Env,
    client: Client,
    tmp: PathBuf,
    opts: Opts,
    tool: PathBuf,
    load_start: String,
    /// When the scenario's own steps began (after `cluster.sh up`): the run-time target is
    /// measured from here, as the harness always measured it.
    started: std::time::Instant,
}

impl FromEnv for Scale {
    fn from_env(env: Env, client: Client) -> Self {
        let tmp =
            h3i_scenarios::scratch_dir("h3i-scale").unwrap_or_else(|_| "/tmp/h3i-scale".into());
        let args: Vec<String> = std::env::args().skip(2).collect();
        // main parsed them already (a bad one never gets here).
        let opts = Opts::parse(&args)
            .unwrap_or_else(|_| Opts::parse(&["8".into()]).expect("8 hosts parse"));
        Scale {
            env,
            client,
            tmp,
            opts,
            tool: PathBuf::new(),
            load_start: load(),
            started: std::time::Instant::now(),
        }
    }
}

/// The load average over 1, 5 and 15 minutes.
pub fn load() -> String {
    let l = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    l.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
}

/// Milliseconds since the epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Scenario for Scale {
    const TITLE: &'static str = "SCALE RUN";

    fn namespace(&self) -> &str {
        NS_OP
    }

    async fn run(&mut self, run: &mut Run) -> Result<()> {
        self.started = std::time::Instant::now();
        self.prepare().await?;
        self.set_up(run).await?;
        self.baseline(run).await?;
        self.at_scale(run).await?;
        self.table(run).await
    }

    async fn cleanup(&mut self) {
        if self.opts.keep {
            println!(
                "--keep: objects, nginx and {} left in place",
                self.tmp.display()
            );
            return;
        }
        let _ = output(
            "kubectl",
            &["delete", "namespace", "-l", NS_LABEL, "--wait=false"],
        )
        .await;
        let classes =
            Api::<k8s_openapi::api::networking::v1::IngressClass>::all(self.client.clone());
        let _ = h3i_scenarios::k8s::delete(&classes, CLASS).await;
        measure::stop_nginx(&self.tmp);
        app::remove_objects(&self.client, &[]).await;
        let gw = h3i_scenarios::gateway_api::api(
            &self.client,
            "v1",
            "GatewayClass",
            "gatewayclasses",
            None,
        );
        let _ = h3i_scenarios::k8s::delete(&gw, GW_CLASS).await;
        let _ = std::fs::remove_dir_all(&self.tmp);
    }
}

impl Scale {
    fn state(&self) -> PathBuf {
        self.tmp.join("state.json")
    }

    fn results(&self) -> PathBuf {
        self.tmp.join("results.json")
    }

    /// The tool with the run's files; its output indented as it comes; a non-zero exit fails
    /// with `what`.
    async fn tool(&self, command: &str, args: &[&str], what: &str) -> Result<()> {
        let p = |p: PathBuf| p.to_string_lossy().to_string();
        let common = [
            "--kubeconfig".to_string(),
            p(self.env.kubeconfig.clone()),
            "--state".into(),
            p(self.state()),
            "--results".into(),
            p(self.results()),
            "--ca".into(),
            p(self.tmp.join("pki/ca.crt")),
            "--pki".into(),
            p(self.tmp.join("pki")),
            "--nginx-certs".into(),
            p(self.tmp.join("nginx-certs")),
            "--namespace".into(),
            NS_OP.into(),
            "--nodes".into(),
            self.env.ips.join(" "),
        ];
        let mut child = Command::new(&self.tool)
            .arg(command)
            .args(&common)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context(|| format!("spawn {}", self.tool.display()))?;
        let (Some(out), Some(err)) = (child.stdout.take(), child.stderr.take()) else {
            return fail("the tool's output");
        };
        let print = |r| async move {
            let mut lines = BufReader::new(r).lines();
            while let Ok(Some(l)) = lines.next_line().await {
                indent(l);
            }
        };
        tokio::join!(
            print(Box::new(out) as Box<dyn tokio::io::AsyncRead + Unpin + Send>),
            print(Box::new(err))
        );
        let status = child.wait().await.context(|| "wait for the tool".into())?;
        if !status.success() {
            return fail(format!("{what}: h3i-scale {command} exited {status}"));
        }
        Ok(())
    }

    async fn prepare(&mut self) -> Result<()> {
        h3i_scenarios::ok(format!(
            "nodes {} at {}; load {}",
            self.env.nodes.join(" "),
            self.env.ips.join(" "),
            load()
        ));
        if !self.env.binary.exists() {
            return fail(format!(
                "H3I_BINARY={} does not exist (cargo build first)",
                self.env.binary.display()
            ));
        }
        if output("nginx", &["-v"]).await.is_err() {
            return fail("no nginx (apt-get install nginx)");
        }
        let labelled =
            h3i_scenarios::k8s::names(&Api::<Namespace>::all(self.client.clone()), NS_LABEL)
                .await?;
        if app::anything_left(&self.client, &[]).await? || !labelled.is_empty() {
            app::remove_leftovers(&self.client, &[]).await?;
            let n =
                h3i_scenarios::k8s::names(&Api::<Namespace>::all(self.client.clone()), NS_LABEL)
                    .await?
                    .len();
            h3i_scenarios::info(format!("deleting {n} namespaces labelled {NS_LABEL}"));
            let out = output(
                "kubectl",
                &[
                    "delete",
                    "ns",
                    "-l",
                    NS_LABEL,
                    "--wait=true",
                    "--timeout=600s",
                ],
            )
            .await?;
            if !out.success() {
                return fail(format!(
                    "namespaces {NS_LABEL} not deleted within 600s: {}",
                    out.stderr.trim()
                ));
            }
        }
        for node in &self.env.nodes {
            for pid in h3i_scenarios::nginx::stop_leftovers(node, "/tmp/h3i-scale.") {
                h3i_scenarios::info(format!(
                    "stopping a previous run's nginx in {node} (pid {pid})"
                ));
            }
        }
        let version = output(&self.env.binary.to_string_lossy(), &["--version"])
            .await?
            .stdout;
        h3i_scenarios::ok(format!(
            "binary {} ({})",
            self.env.binary.display(),
            version.trim()
        ));
        Ok(())
    }

    /// `$CACHE/scale-KEY/h3i-scale`, KEY the hash of the tool's module files, sources and Go
    /// version (as `cat go.mod go.sum ./*.go; go version` in its directory); built when missing.
    async fn build_tool(&mut self) -> Result<()> {
        let src = repo().join("tests/cluster/scale");
        let mut files: Vec<PathBuf> = std::fs::read_dir(&src)
            .context(|| format!("read {}", src.display()))?
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "go"))
            .collect();
        files.sort();
        let mut bytes = Vec::new();
        for f in [src.join("go.mod"), src.join("go.sum")]
            .iter()
            .chain(&files)
        {
            bytes.extend(std::fs::read(f).context(|| format!("read {}", f.display()))?);
        }
        bytes.extend(
            h3i_scenarios::cmd::run("go", &["version"])
                .await?
                .into_bytes(),
        );
        let key: String = h3i_scenarios::pki::sha256_hex(&bytes)
            .chars()
            .take(12)
            .collect();
        let cache =
            std::env::var("H3I_CLUSTER_CACHE").unwrap_or_else(|_| "/var/cache/h3-ingress".into());
        let out = PathBuf::from(cache.clone()).join(format!("scale-{key}/h3i-scale"));
        if out.exists() {
            h3i_scenarios::ok(format!("cached {}", out.display()));
        } else {
            let dir = out.parent().map(PathBuf::from).unwrap_or_default();
            std::fs::create_dir_all(&dir).context(|| format!("mkdir {}", dir.display()))?;
            let script = format!(
                "cd {} && GOMODCACHE={cache}/gomod GOCACHE={cache}/gocache GOFLAGS=-mod=readonly GOTOOLCHAIN=local nice -n 10 go build -trimpath -ldflags='-s -w' -o {}.tmp . && mv {1}.tmp {1}",
                src.display(),
                out.display()
            );
            let o = output("sh", &["-c", &script]).await?;
            if !o.success() {
                return fail(format!(
                    "go build tests/cluster/scale: {}{}",
                    o.stdout, o.stderr
                ));
            }
            h3i_scenarios::ok(format!("built {}", out.display()));
        }
        self.tool = out;
        Ok(())
    }
}

/// `what` as an I/O error of the scratch directory.
fn io(what: &str, source: std::io::Error) -> Error {
    Error::Io {
        context: what.into(),
        source,
    }
}
