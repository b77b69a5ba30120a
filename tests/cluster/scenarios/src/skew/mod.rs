//! Version skew and certificate renewal, with the chart, a Debian nginx on each node standing
//! in for the TCP ingress, and an Http3Listener serving two hosts from annotated Ingresses:
//! (a) a newer CRD (the next schema revision, with a defaulted `spec.upstream.futureSetting`)
//! replaces the served one under the running binary, whose pods are restarted under it; a
//! second listener then uses a value only that CRD admits (as after a `helm rollback` of the
//! binary): it alone is refused, also by a restarted operator, which goes on reconciling the
//! first;
//! (b) an older CRD with `crd.upgrade=false`, then `crd.upgrade=true`;
//! (c) with `upstream.verify: servedCertificate` (the default), a host's certificate rotated in
//! both orders while HTTP/3 requests run on both nodes, and a control with no grace.
//! `H3I_SKEW_KEEP=1` keeps its objects and nginx.

mod crd;
mod renewal;
mod values;

use std::path::PathBuf;

use h3_ingress::api::{conditions, schema, Http3Listener};
use h3i_scenarios::app::{self, NS_OP};
use h3i_scenarios::h3::{self, Expect};
use h3i_scenarios::k8s;
use h3i_scenarios::pki::Leaf;
use h3i_scenarios::{Env, Nginx, Pki, Result, Run, Scenario};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DynamicObject};
use kube::{Api, Client};

use crate::FromEnv;

const NS_APP: &str = "h3i-skew";
const HOSTS: [&str; 2] = ["skew1.h3i.test", "skew2.h3i.test"];
const CLASS: &str = "h3i-skew";
const LISTENER: &str = "skew";

/// The run's state: the cluster, the scratch directory, nginx, the PKI and what was proven.
pub struct Skew {
    env: Env,
    client: Client,
    tmp: PathBuf,
    nginx: Nginx,
    ca: PathBuf,
    pki: Option<Pki>,
    /// The hosts' current certificate hashes.
    certs: [String; 2],
    /// The binary's CRD schema revision.
    rev: u32,
    /// One line per part, printed at the end.
    summary: Vec<String>,
}

impl FromEnv for Skew {
    fn from_env(env: Env, client: Client) -> Self {
        let tmp = h3i_scenarios::scratch_dir("h3i-skew").unwrap_or_else(|_| "/tmp/h3i-skew".into());
        Skew {
            nginx: Nginx::new(&tmp, app::ALT_SVC, ""),
            ca: tmp.join("pki/ca.crt"),
            env,
            client,
            tmp,
            pki: None,
            certs: Default::default(),
            rev: schema::SCHEMA_REVISION,
            summary: Vec::new(),
        }
    }
}

impl Scenario for Skew {
    const TITLE: &'static str = "SKEW";

    fn namespace(&self) -> &str {
        NS_OP
    }

    async fn run(&mut self, run: &mut Run) -> Result<()> {
        self.prepare().await?;
        self.install(run).await?;
        self.newer_crd(run).await?;
        self.newer_crd_restart(run).await?;
        self.newer_value(run).await?;
        self.older_crd(run).await?;
        self.crd_upgrade(run).await?;
        self.rotation(run).await?;
        self.control(run).await?;
        run.step("done");
        println!();
        for line in &self.summary {
            println!("{line}");
        }
        Ok(())
    }

    async fn cleanup(&mut self) {
        if app::keep("H3I_SKEW_KEEP") {
            println!(
                "H3I_SKEW_KEEP=1: objects, nginx and {} left in place",
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

impl Skew {
    fn crds(&self) -> Api<CustomResourceDefinition> {
        Api::all(self.client.clone())
    }

    /// The listener as the API server serves it, fields this build does not know included.
    fn raw_listeners(&self) -> Api<DynamicObject> {
        Api::all_with(
            self.client.clone(),
            &ApiResource::erase::<Http3Listener>(&()),
        )
    }

    /// A leaf for `host` with the CA appended (a Secret from a CA whose certificate the chain
    /// carries, so that both sides can recognise a renewal's issuer).
    fn chained_leaf(&self, name: &str, host: &str) -> Result<Leaf> {
        let Some(pki) = &self.pki else {
            return h3i_scenarios::fail("no PKI yet");
        };
        let leaf = pki.leaf(name, host)?;
        let ca = std::fs::read_to_string(pki.ca()).unwrap_or_default();
        let crt = std::fs::read_to_string(&leaf.crt).unwrap_or_default();
        std::fs::write(&leaf.crt, crt + &ca).map_err(|source| h3i_scenarios::Error::Io {
            context: format!("append the CA to {}", leaf.crt.display()),
            source,
        })?;
        Ok(leaf)
    }

    /// The CRD's schema revision annotation ("" without one).
    async fn crd_revision(&self) -> Result<String> {
        let crd = k8s::get(&self.crds(), schema::CRD_NAME).await?;
        let ann = crd.and_then(|c| c.metadata.annotations).unwrap_or_default();
        Ok(ann
            .get(schema::annotations::SCHEMA_REVISION)
            .cloned()
            .unwrap_or_default())
    }

    /// CRDCurrent as (status, reason, message).
    async fn crd_current(&self) -> Result<(String, String, String)> {
        let c = k8s::condition(&self.client, LISTENER, conditions::CRD_CURRENT).await?;
        Ok(c.map(|c| (c.status, c.reason, c.message))
            .unwrap_or_default())
    }

    async fn crd_is(&self, status: &str, reason: &str) -> Result<bool> {
        let (s, r, _) = self.crd_current().await?;
        Ok(s == status && r == reason)
    }

    /// Aioquic GET /whoami on every node answered 200 with this certificate.
    async fn served_everywhere(&self, host: &str, cert: &str) -> Result<bool> {
        let want = Expect {
            cert_sha256: Some(cert),
            ..Default::default()
        };
        h3::get_all(&self.env.ips, host, 443, "/whoami", &self.ca, &want).await?;
        Ok(true)
    }

    async fn all_served(&self) -> Result<bool> {
        Ok(self.served_everywhere(HOSTS[0], &self.certs[0]).await?
            && self.served_everywhere(HOSTS[1], &self.certs[1]).await?)
    }

    /// `name=restarts` of the pods matching `selector`, and whether all are 0.
    async fn restarts(&self, selector: &str) -> Result<(String, bool)> {
        let pods = app::pods(&self.client, selector).await?;
        let line: Vec<String> = pods
            .iter()
            .map(|p| format!("{}={} ", kube::ResourceExt::name_any(p), app::restarts(p)))
            .collect();
        Ok((
            line.concat(),
            !pods.is_empty() && pods.iter().all(|p| app::restarts(p) == 0),
        ))
    }

    /// Lines of a container's log naming `spec.upstream.futureSetting` as unknown.
    async fn unknown_field_lines(&self, pod: &str, container: &str) -> Result<usize> {
        let pods = Api::namespaced(self.client.clone(), NS_OP);
        let files = h3i_scenarios::pods::log_files(&self.env, &pods, NS_OP, pod, container).await?;
        let mut n = 0;
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap_or_default();
            n += text.lines().filter(|l| unknown_field_line(l)).count();
        }
        Ok(n)
    }

    /// Whether a container's log has a line with `needle`.
    async fn log_has(&self, pod: &str, container: &str, needle: &str) -> Result<bool> {
        let pods = Api::namespaced(self.client.clone(), NS_OP);
        let files = h3i_scenarios::pods::log_files(&self.env, &pods, NS_OP, pod, container).await?;
        Ok(files.iter().any(|f| {
            std::fs::read_to_string(f)
                .unwrap_or_default()
                .contains(needle)
        }))
    }

    /// A data plane metric summed over both nodes' pods.
    async fn dp_metric(&self, name: &str, label: (&str, &str)) -> Result<f64> {
        let mut total = 0.0;
        for ip in &self.env.ips {
            total += h3i_scenarios::prom::metric(&format!("{ip}:9476"), name, &[label]).await?;
        }
        Ok(total)
    }
}

/// `grep 'does not know.*spec.upstream.futureSetting'`
fn unknown_field_line(line: &str) -> bool {
    line.split_once("does not know")
        .is_some_and(|(_, rest)| rest.contains("spec.upstream.futureSetting"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_field_line_names_the_field_after_the_verdict() {
        assert!(unknown_field_line("WARN the API server's listener has fields this build does not know: spec.upstream.futureSetting"));
        assert!(!unknown_field_line(
            "spec.upstream.futureSetting does not know"
        ));
        assert!(!unknown_field_line("nothing"));
    }
}
