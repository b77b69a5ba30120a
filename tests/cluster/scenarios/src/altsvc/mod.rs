//! Managed `Alt-Svc` (`spec.advertise.altSvc`) end to end on real nodes, with Traefik v3.7.13
//! as the TCP ingress on TCP 443 of both nodes (`tests/cluster/traefik.sh`) and the listener on
//! UDP 443. Nobody edits Traefik's configuration or the Ingresses' Middlewares: the operator
//! does. Each change is timed against the 5 s the product promises (docs/configuration.md,
//! "Alt-Svc on the TCP side"), reading the header from Traefik over TCP on both nodes:
//! (a) the annotation added to an Ingress without Middlewares: the host served over HTTP/3 on
//! both nodes, then `alt-svc: h3=":443"; ma=86400` on TCP responses; the operator's Middleware
//! and its reference in the Ingress's `router.middlewares`;
//! (b) the data plane taken off the nodes: no data plane pod Ready, then `alt-svc: clear`;
//! (c) the data plane back: served again, then the header back;
//! (d) the annotation removed: `clear`, then the reference and the Middleware gone while Traefik
//! still routes the host (200 over TCP);
//! (e) an Ingress with the user's own Middleware list: the list is left as the user wrote it,
//! the status names the reference to add, no header until the user adds it, then the header;
//! (f) Debian's Chromium (tests/browser/chromium.py, an empty profile) loads
//! `https://shop.h3i.test/` from Traefik, gets the operator's `Alt-Svc` and tries QUIC to the
//! data plane on the next load; forced onto QUIC, the page and 1 MiB come over h3.
//! Real nodes only; `H3I_ALTSVC_KEEP=1` keeps the objects and Traefik.

mod steps;

use std::path::PathBuf;

use h3i_scenarios::app::{self, NS_OP};
use h3i_scenarios::cmd::{repo, run as sh};
use h3i_scenarios::poll::Timings;
use h3i_scenarios::{indent, Env, Result, Run, Scenario};
use kube::Client;

use crate::FromEnv;

const NS_APP: &str = "h3i-altsvc";
/// The host whose Ingress names no Middleware, and the one with the user's own.
const WWW: &str = "www.altsvc.h3i.test";
const OWN: &str = "own.altsvc.h3i.test";
/// The browser test's host (tests/browser/chromium.py's `HOST`).
const SHOP: &str = "shop.h3i.test";
const LISTENER: &str = "altsvc";
const CLASS: &str = "traefik";
/// The user's own Middleware on [`OWN`]: a response header of theirs.
const TEAM: &str = "team";
const TEAM_HEADER: &str = "x-team";
/// What each change must take at most, from the moment the host is (or stops being) served.
const TARGET_SECONDS: f64 = 5.0;

pub struct AltSvc {
    env: Env,
    client: Client,
    tmp: PathBuf,
    ca: PathBuf,
    /// Certificate hash per host, as the data plane must serve it.
    certs: Vec<(&'static str, String)>,
    /// Each change's figure, printed as one table at the end.
    timings: Timings,
}

impl FromEnv for AltSvc {
    fn from_env(env: Env, client: Client) -> Self {
        let tmp =
            h3i_scenarios::scratch_dir("h3i-altsvc").unwrap_or_else(|_| "/tmp/h3i-altsvc".into());
        AltSvc {
            ca: tmp.join("pki/ca.crt"),
            env,
            client,
            tmp,
            certs: Vec::new(),
            timings: Timings::new(TARGET_SECONDS),
        }
    }
}

fn traefik_sh() -> String {
    repo()
        .join("tests/cluster/traefik.sh")
        .to_string_lossy()
        .into_owned()
}

impl Scenario for AltSvc {
    const TITLE: &'static str = "ALT-SVC";

    fn namespace(&self) -> &str {
        NS_OP
    }

    async fn run(&mut self, run: &mut Run) -> Result<()> {
        self.prepare().await?;
        self.install(run).await?;
        self.annotated(run).await?;
        self.off_the_nodes(run).await?;
        self.back_on_the_nodes(run).await?;
        self.unannotated(run).await?;
        self.users_own_list(run).await?;
        self.browser(run).await?;
        run.step(format!("the timings (target: <= {TARGET_SECONDS} s each)"));
        self.timings.report()
    }

    async fn cleanup(&mut self) {
        if app::keep("H3I_ALTSVC_KEEP") {
            println!(
                "H3I_ALTSVC_KEEP=1: objects, Traefik and {} left in place",
                self.tmp.display()
            );
            return;
        }
        app::remove_objects(&self.client, &[NS_APP]).await;
        let _ = sh(&traefik_sh(), &["down"]).await;
        let _ = std::fs::remove_dir_all(&self.tmp);
    }
}
