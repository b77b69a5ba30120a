//! DNS HTTPS records published by the operator (`spec.advertise.dns`), end to end on real
//! nodes: Debian's Knot DNS on the host's bridge address as the user's authoritative server
//! (one zone, a TSIG key whose secret is a Secret in the operator's namespace), Debian nginx on
//! both nodes as the TCP ingress, and one Ingress whose `h3-ingress.dev/enabled` annotation is
//! turned on and off. Each change is timed against the 5 s the product promises
//! (docs/configuration.md, "DNS HTTPS records"):
//! (a) the annotation added: the host served over HTTP/3 on both nodes, then its record (and
//! the ownership TXT beside it) in the zone;
//! (b) the data plane taken off the nodes (a nodeSelector no node matches): no data plane pod
//! Ready, then the record and the TXT gone;
//! (c) the data plane back: served again, the record back;
//! (d) the annotation removed: the record gone.
//! `status.advertise.dns.published` is read after each. The figures are printed as one table.
//! Real nodes only; `H3I_ADVERTISE_KEEP=1` keeps the objects, nginx and knotd.

mod knot;
mod steps;

use std::path::PathBuf;

use h3i_scenarios::app::{self, NS_OP};
use h3i_scenarios::poll::Timings;
use h3i_scenarios::{Env, Nginx, Result, Run, Scenario};
use kube::Client;

use crate::FromEnv;
use knot::Knot;

const NS_APP: &str = "h3i-advertise";
const ZONE: &str = "advertise.h3i.test";
const HOST: &str = "www.advertise.h3i.test";
const CLASS: &str = "h3i-advertise";
const LISTENER: &str = "advertise";
const KEY_NAME: &str = "h3i-advertise-key";
const KEY_SECRET: &str = "h3i-advertise-tsig";
/// What each change must take at most, from the moment the host is (or stops being) served.
const TARGET_SECONDS: f64 = 5.0;

pub struct Advertise {
    env: Env,
    client: Client,
    tmp: PathBuf,
    ca: PathBuf,
    nginx: Nginx,
    knot: Option<Knot>,
    /// The host's address on the bridge, where knotd listens.
    host_ip: String,
    /// The host's certificate hash, as the data plane must serve it.
    cert: String,
    /// Each change's figure, printed as one table at the end.
    timings: Timings,
}

impl FromEnv for Advertise {
    fn from_env(env: Env, client: Client) -> Self {
        let tmp = h3i_scenarios::scratch_dir("h3i-advertise")
            .unwrap_or_else(|_| "/tmp/h3i-advertise".into());
        Advertise {
            nginx: Nginx::new(&tmp, app::ALT_SVC, ""),
            ca: tmp.join("pki/ca.crt"),
            env,
            client,
            tmp,
            knot: None,
            host_ip: std::env::var("H3I_HOST_IP").unwrap_or_default(),
            cert: String::new(),
            timings: Timings::new(TARGET_SECONDS),
        }
    }
}

impl Scenario for Advertise {
    const TITLE: &'static str = "ADVERTISE";

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
        run.step(format!("the timings (target: <= {TARGET_SECONDS} s each)"));
        self.timings.report()
    }

    async fn cleanup(&mut self) {
        if app::keep("H3I_ADVERTISE_KEEP") {
            println!(
                "H3I_ADVERTISE_KEEP=1: objects, nginx, knotd and {} left in place",
                self.tmp.display()
            );
            if let Some(k) = self.knot.take() {
                k.keep_running();
            }
            return;
        }
        self.nginx.stop();
        if let Some(mut k) = self.knot.take() {
            k.stop();
        }
        app::remove_objects(&self.client, &[NS_APP]).await;
        let classes =
            kube::Api::<k8s_openapi::api::networking::v1::IngressClass>::all(self.client.clone());
        let _ = h3i_scenarios::k8s::delete(&classes, CLASS).await;
        let _ = std::fs::remove_dir_all(&self.tmp);
    }
}
