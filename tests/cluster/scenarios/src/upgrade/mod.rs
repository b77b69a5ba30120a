//! `helm upgrade` from the previous release to the working tree and `helm rollback` back, under
//! clients. The previous release is the chart and the binary of one pinned commit of this repository
//! ([`pinned::PINNED_COMMIT`]), built once into the shared cache; the node agent runs that build for the
//! image tag it is installed with (`H3I_TAG_BINARIES`) and `H3I_BINARY` for the working tree's.
//!
//! The release is installed from the pinned chart with the pinned tag, with a Debian nginx per
//! node (a throttled `/slow/` path), one annotated Ingress and an Http3Listener. Then twice,
//! under three clients per node (`h3i_scenarios::roll`): up (`helm upgrade` to the working
//! tree's chart and tag), down (`helm rollback` to the install's revision: the pinned chart,
//! tag and values, the working tree's CRD left served, as helm leaves it). Checks per change: the operator and both data plane pods end
//! up running the expected binary; the clients' verdict per node; the listener's Ready
//! condition, polled every 0.5 s from before the change until the roll is done, never anything
//! but True; what CRDCurrent says once the new operator has written it.
//! `H3I_UPGRADE_KEEP=1` keeps its objects and nginx.

mod change;
mod pinned;

use std::path::PathBuf;

use h3_ingress::api::conditions;
use h3i_scenarios::app::{self, NS_OP};
use h3i_scenarios::h3::{self, Expect};
use h3i_scenarios::k8s;
use h3i_scenarios::roll::Clients;
use h3i_scenarios::{Env, Nginx, Result, Run, Scenario};
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, Client, ResourceExt};

use crate::FromEnv;

pub use pinned::build_only;

const NS_APP: &str = "h3i-upgrade";
const HOST: &str = "upgrade.h3i.test";
const CLASS: &str = "h3i-upgrade";
const LISTENER: &str = "upgrade";
/// http.drainTimeoutSeconds: the slow download must finish within it.
const DRAIN: u32 = 120;
const SLOW_BYTES: usize = 2_097_152;
/// nginx limit_rate: 2 MiB at 32 KiB/s is about 64 s, longer than a change.
const SLOW_RATE: &str = "32k";
/// The request loops must outlast the change (checked).
const CLIENT_SECONDS: u64 = 100;

/// The revision `helm install` makes, which `down` rolls back to.
const INSTALL_REVISION: u32 = 1;

/// How a change reaches the release.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Via {
    /// `helm upgrade` to a side's chart and tag.
    Upgrade,
    /// `helm rollback` to [`INSTALL_REVISION`].
    Rollback,
}

impl Via {
    fn verb(self) -> &'static str {
        match self {
            Via::Upgrade => "upgrade",
            Via::Rollback => "rollback",
        }
    }
}

/// One side of the upgrade: its chart, image tag and the binary the agent runs for it.
#[derive(Clone, Debug, Default)]
struct Side {
    chart: PathBuf,
    tag: String,
    bin: PathBuf,
}

/// The run's state.
pub struct Upgrade {
    env: Env,
    client: Client,
    tmp: PathBuf,
    nginx: Nginx,
    slow_sha: String,
    pinned: Side,
    work: Side,
    op_pod: String,
    clients: Option<Clients>,
    /// Targets missed (the other change still runs; the run fails at the end).
    misses: Vec<String>,
}

impl FromEnv for Upgrade {
    fn from_env(env: Env, client: Client) -> Self {
        let tmp =
            h3i_scenarios::scratch_dir("h3i-upgrade").unwrap_or_else(|_| "/tmp/h3i-upgrade".into());
        let (tag, bin) = pinned::from_tag_binaries();
        Upgrade {
            nginx: Nginx::new(
                &tmp,
                app::ALT_SVC,
                &format!("location /slow/ {{ limit_rate {SLOW_RATE}; }}"),
            ),
            pinned: Side {
                chart: tmp.join("pinned/charts/h3-ingress"),
                tag,
                bin,
            },
            work: Side {
                chart: app::chart(),
                tag: String::new(),
                bin: env.binary.clone(),
            },
            env,
            client,
            tmp,
            slow_sha: String::new(),
            op_pod: String::new(),
            clients: None,
            misses: Vec::new(),
        }
    }

    fn before(run: &mut Run) -> Result<()> {
        pinned::before(run)
    }
}

impl Scenario for Upgrade {
    const TITLE: &'static str = "UPGRADE";

    fn namespace(&self) -> &str {
        NS_OP
    }

    async fn run(&mut self, run: &mut Run) -> Result<()> {
        self.prepare().await?;
        self.install(run).await?;
        let (up, down) = (self.work.clone(), self.pinned.clone());
        self.change(run, "up", &up, Via::Upgrade).await?;
        self.change(run, "down", &down, Via::Rollback).await?;
        self.after(run).await
    }

    async fn cleanup(&mut self) {
        if let Some(c) = &mut self.clients {
            c.kill();
        }
        if app::keep("H3I_UPGRADE_KEEP") {
            println!(
                "H3I_UPGRADE_KEEP=1: objects, nginx and {} left in place",
                self.tmp.display()
            );
            return;
        }
        self.nginx.stop();
        app::remove_objects(&self.client, &[NS_APP]).await;
        let classes =
            Api::<k8s_openapi::api::networking::v1::IngressClass>::all(self.client.clone());
        let _ = k8s::delete(&classes, CLASS).await;
        let _ = std::fs::remove_dir_all(&self.tmp);
    }
}

impl Upgrade {
    fn pods_api(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), NS_OP)
    }

    async fn dp_pods(&self) -> Result<Vec<Pod>> {
        app::pods(&self.client, &app::dp_selector(LISTENER)).await
    }

    fn image(p: &Pod) -> String {
        p.spec
            .as_ref()
            .and_then(|s| s.containers[0].image.clone())
            .unwrap_or_default()
    }

    /// The container's process runs `bin`.
    async fn runs(&self, pod: &str, container: &str, bin: &std::path::Path) -> Result<bool> {
        let pid =
            h3i_scenarios::pods::pid(&self.env, &self.pods_api(), NS_OP, pod, container).await?;
        let want = std::fs::canonicalize(bin).unwrap_or_else(|_| bin.to_path_buf());
        Ok(h3i_scenarios::pods::exe_of(pid) == want)
    }

    /// One operator pod, Ready, of `side`'s tag, its process running `side`'s binary (its name
    /// kept in `op_pod`).
    async fn operator_runs(&self, side: &Side) -> Result<Option<String>> {
        let pods = app::pods(&self.client, &app::op_selector()).await?;
        let [p] = pods.as_slice() else {
            return Ok(None);
        };
        let want = format!("{}:{}", app::IMAGE_REPO, side.tag);
        if Self::image(p) != want
            || !app::pod_ready(p)
            || !self.runs(&p.name_any(), "operator", &side.bin).await?
        {
            return Ok(None);
        }
        Ok(Some(p.name_any()))
    }

    /// Every pod of `old` gone, two data plane pods of `side`'s tag Ready, running its binary.
    async fn rolled(&self, old: &[String], side: &Side) -> Result<bool> {
        for p in old {
            if k8s::exists(&self.pods_api(), p).await? {
                return Ok(false);
            }
        }
        let pods = self.dp_pods().await?;
        let want = format!("{}:{}", app::IMAGE_REPO, side.tag);
        if pods.iter().filter(|p| app::pod_ready(p)).count() != 2 {
            return Ok(false);
        }
        for p in &pods {
            let fine = Self::image(p) == want
                && p.metadata.deletion_timestamp.is_none()
                && app::pod_ready(p);
            if !fine || !self.runs(&p.name_any(), "h3-ingress", &side.bin).await? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// On both nodes a pod of `side`'s tag is Ready (the old ones may still be draining).
    async fn taken_over(&self, side: &Side) -> Result<bool> {
        let want = format!("{}:{}", app::IMAGE_REPO, side.tag);
        let pods = self.dp_pods().await?;
        Ok(pods
            .iter()
            .filter(|p| Self::image(p) == want && app::pod_ready(p))
            .count()
            == 2)
    }

    async fn served_everywhere(&self) -> Result<bool> {
        let ca = self.tmp.join("pki/ca.crt");
        h3::get_all(&self.env.ips, HOST, 443, "/whoami", &ca, &Expect::default()).await?;
        Ok(true)
    }

    /// The listener's condition of this type as `STATUS REASON: message`.
    async fn cond_line(&self, type_: &str) -> Result<(String, String)> {
        let Some(c) = k8s::condition(&self.client, LISTENER, type_).await? else {
            return Ok((String::new(), format!("no {type_} condition")));
        };
        Ok((
            c.status.clone(),
            format!("{} {}: {}", c.status, c.reason, c.message),
        ))
    }

    async fn crd_current(&self) -> Result<(String, String)> {
        self.cond_line(conditions::CRD_CURRENT).await
    }
}
