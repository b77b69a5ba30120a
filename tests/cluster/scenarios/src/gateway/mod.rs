//! Gateway API on the test cluster: the standard-channel CRDs of sigs.k8s.io/gateway-api
//! (pinned, through the Go module proxy), the chart, a Debian nginx on each node standing in for
//! the TCP gateway, a Gateway with HTTPS listeners, an annotated HTTPRoute whose accepted parent
//! status the run writes as a gateway controller would (no controller runs), and an
//! Http3Listener with gatewayClassName. Then: the host is served over HTTP/3 on both nodes with
//! the Gateway's certificate; status, `kubectl h3-ingress status` and Events name the route; the
//! operator never writes the route's status; a cross-namespace certificate is RefNotPermitted
//! until a ReferenceGrant exists, then served; removing the annotation stops serving; the
//! documented example passes the API server's validation. `H3I_GATEWAY_KEEP=1` keeps its
//! objects and nginx.

mod checks;

use std::path::PathBuf;

use h3_ingress::api::{host_states, mirror, HostStatus, Http3Listener};
use h3_ingress::operator::resources::data_plane_name;
use h3i_scenarios::app::{self, NS_OP};
use h3i_scenarios::cmd::{output, run as sh};
use h3i_scenarios::gateway_api;
use h3i_scenarios::h3::{self, Expect, Refusal};
use h3i_scenarios::k8s;
use h3i_scenarios::pki::Leaf;
use h3i_scenarios::{Env, Nginx, Result, Run, Scenario};
use k8s_openapi::api::core::v1::{Event, Secret};
use kube::api::{DynamicObject, ListParams};
use kube::{Api, Client, ResourceExt};

use crate::FromEnv;

const NS_INFRA: &str = "h3i-gw-infra"; // the Gateway and its own certificate
const NS_APP: &str = "h3i-gw-app"; // the HTTPRoutes
const NS_CERTS: &str = "h3i-gw-certs"; // a certificate shared from another namespace
const NS_HOSTS: &str = "h3-ingress-hosts"; // the certificate mirrors
const HOST: &str = "gw.h3i.test";
const HOST_X: &str = "cross.h3i.test";
const CLASS: &str = "h3i-test";
const LISTENER: &str = "gateway";
/// The field manager the run writes route status with, as a gateway controller.
const TEST_MANAGER: &str = "h3i-gateway-test";
const RELEASE_SA: &str = "h3-ingress";

/// The run's state: the cluster, the scratch directory, nginx and the leaves.
pub struct Gateway {
    env: Env,
    client: Client,
    tmp: PathBuf,
    nginx: Nginx,
    ca: PathBuf,
    cert: Option<Leaf>,
    cert_x: Option<Leaf>,
    /// Namespaces the documented example names, made for its dry run.
    doc_ns: Vec<String>,
}

impl FromEnv for Gateway {
    fn from_env(env: Env, client: Client) -> Self {
        let tmp =
            h3i_scenarios::scratch_dir("h3i-gateway").unwrap_or_else(|_| "/tmp/h3i-gateway".into());
        Gateway {
            nginx: Nginx::new(&tmp, app::ALT_SVC, ""),
            ca: tmp.join("pki/ca.crt"),
            env,
            client,
            tmp,
            cert: None,
            cert_x: None,
            doc_ns: Vec::new(),
        }
    }
}

impl Scenario for Gateway {
    const TITLE: &'static str = "GATEWAY";

    fn namespace(&self) -> &str {
        NS_OP
    }

    async fn run(&mut self, run: &mut Run) -> Result<()> {
        self.prepare().await?;
        self.crds(run).await?;
        self.install(run).await?;
        self.tcp_gateway(run).await?;
        self.gateway(run).await?;
        self.listener(run).await?;
        self.served(run).await?;
        self.status(run).await?;
        self.cross_refused(run).await?;
        self.grant(run).await?;
        self.annotation_removed(run).await?;
        self.documented_example(run).await?;
        run.step("done: Gateway API hosts on the real control plane");
        h3i_scenarios::indent(sh("kubectl", &["get", "h3l", LISTENER]).await?);
        Ok(())
    }

    async fn cleanup(&mut self) {
        let nss: Vec<&str> = self.doc_ns.iter().map(String::as_str).collect();
        let _ = output(
            "kubectl",
            &[
                &["delete", "namespace", "--ignore-not-found", "--wait=false"][..],
                &nss,
            ]
            .concat(),
        )
        .await;
        if app::keep("H3I_GATEWAY_KEEP") {
            println!(
                "H3I_GATEWAY_KEEP=1: objects, nginx and {} left in place",
                self.tmp.display()
            );
            return;
        }
        self.nginx.stop();
        app::remove_objects(&self.client, &[NS_APP, NS_INFRA, NS_CERTS]).await;
        let classes = gateway_api::api(&self.client, "v1", "GatewayClass", "gatewayclasses", None);
        let _ = k8s::delete(&classes, CLASS).await;
        let _ = std::fs::remove_dir_all(&self.tmp);
    }
}

impl Gateway {
    fn dp_user(&self) -> String {
        format!(
            "system:serviceaccount:{NS_OP}:{}",
            data_plane_name(LISTENER)
        )
    }

    fn op_user(&self) -> String {
        format!("system:serviceaccount:{NS_OP}:{RELEASE_SA}")
    }

    fn routes(&self) -> Api<DynamicObject> {
        gateway_api::api(&self.client, "v1", "HTTPRoute", "httproutes", Some(NS_APP))
    }

    fn sha(leaf: &Option<Leaf>) -> String {
        leaf.as_ref().map(|l| l.sha256.clone()).unwrap_or_default()
    }

    /// Aioquic GET /whoami on every node with this certificate; the lines to print.
    async fn served_everywhere(&self, host: &str, cert: &str) -> Result<Vec<String>> {
        let want = Expect {
            cert_sha256: Some(cert),
            ..Default::default()
        };
        h3::get_all(&self.env.ips, host, 443, "/whoami", &self.ca, &want).await
    }

    async fn refused_everywhere(&self, host: &str) -> Result<Vec<String>> {
        h3::refused_all(&self.env.ips, host, &self.ca, Refusal::TlsAlert).await
    }

    /// The listener's status entry for `host`, if it has one.
    async fn host_status(&self, host: &str) -> Result<Option<HostStatus>> {
        let l = k8s::get(&Api::<Http3Listener>::all(self.client.clone()), LISTENER).await?;
        let hosts = l
            .and_then(|l| l.status)
            .map(|s| s.hosts)
            .unwrap_or_default();
        Ok(hosts.into_iter().find(|h| h.name == host))
    }

    /// `kubectl h3-ingress status ARGS` with the binary as the plugin on PATH (served hosts
    /// come from a pod's /hosts).
    async fn plugin(&self, args: &[&str]) -> Result<String> {
        let dir = self.tmp.join("plugin");
        let path = format!(
            "{}:{}",
            dir.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut all = vec![
            "PATH=".to_string() + &path,
            "kubectl".into(),
            "h3-ingress".into(),
            "status".into(),
        ];
        all.extend(args.iter().map(|a| a.to_string()));
        sh("env", &all).await
    }

    /// The row of `host` in `kubectl h3-ingress status LISTENER`, or "".
    async fn plugin_row(&self, host: &str) -> Result<String> {
        let text = self.plugin(&[LISTENER]).await?;
        Ok(text
            .lines()
            .find(|l| l.split_whitespace().next() == Some(host))
            .unwrap_or_default()
            .to_string())
    }

    /// `host` is Serving in both state columns of the plugin's table.
    async fn plugin_serving(&self, host: &str) -> Result<bool> {
        let row = self.plugin_row(host).await?;
        let cols: Vec<&str> = row.split_whitespace().collect();
        Ok(cols.len() > 2 && cols[1] == host_states::SERVING && cols[2] == host_states::SERVING)
    }

    /// The hosts of the listener's mirror of the Secret `source` (namespace/name), joined by
    /// commas ("" when there is no mirror).
    async fn mirror_hosts(&self, source: &str) -> Result<String> {
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), NS_HOSTS);
        let sel = format!("{}={LISTENER}", mirror::LISTENER_LABEL);
        for s in k8s::list(&secrets, &sel).await? {
            if s.annotations()
                .get(mirror::SOURCE_ANNOTATION)
                .map(String::as_str)
                != Some(source)
            {
                continue;
            }
            let raw = s
                .data
                .as_ref()
                .and_then(|d| d.get(mirror::HOSTS_KEY))
                .map(|b| b.0.clone());
            let doc: serde_json::Value =
                serde_json::from_slice(&raw.unwrap_or_default()).unwrap_or_default();
            let names: Vec<&str> = doc["hosts"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|h| h["name"].as_str())
                .collect();
            return Ok(names.join(","));
        }
        Ok(String::new())
    }

    /// `TYPE REASON: message` of the events about HTTPRoute `name`.
    async fn route_events(&self, name: &str) -> Result<Vec<String>> {
        let api: Api<Event> = Api::namespaced(self.client.clone(), NS_APP);
        let fields = format!("involvedObject.kind=HTTPRoute,involvedObject.name={name}");
        let list = api.list(&ListParams::default().fields(&fields)).await?;
        Ok(list.items.iter().map(k8s::event_line).collect())
    }
}
