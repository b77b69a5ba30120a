//! The Gateway scenario's steps, in order.

use h3_ingress::api::reasons;
use h3_ingress::operator::events::event_reasons;
use h3i_scenarios::app;
use h3i_scenarios::cmd::{can_i, output, repo, run as sh};
use h3i_scenarios::poll::wait_ok;
use h3i_scenarios::{ensure, fail, indent, info, ok, Pki, Result, Run};
use kube::api::{Patch, PatchParams};
use serde_json::json;

use super::*;

const HTTPROUTES: &str = "httproutes.gateway.networking.k8s.io";

impl Gateway {
    pub(super) async fn prepare(&mut self) -> Result<()> {
        ensure!(
            self.env.binary.exists(),
            "H3I_BINARY={} does not exist (cargo build first)",
            self.env.binary.display()
        );
        let namespaces = [NS_APP, NS_INFRA, NS_CERTS];
        if app::anything_left(&self.client, &namespaces).await? {
            app::remove_leftovers(&self.client, &namespaces).await?;
        }
        for node in &self.env.nodes {
            for pid in h3i_scenarios::nginx::stop_leftovers(node, "/tmp/h3i-gateway.") {
                info(format!(
                    "stopping a previous run's nginx in {node} (pid {pid})"
                ));
            }
        }
        ok(format!(
            "nodes {} at {}; binary {}",
            self.env.nodes.join(" "),
            self.env.ips.join(" "),
            self.env.binary.display()
        ));
        Ok(())
    }

    pub(super) async fn crds(&mut self, run: &mut Run) -> Result<()> {
        run.step(format!(
            "install the Gateway API {} standard-channel CRDs (sigs.k8s.io/gateway-api via the Go module proxy)",
            gateway_api::VERSION
        ));
        gateway_api::install_crds(&self.client, &self.tmp).await
    }

    pub(super) async fn install(&mut self, run: &mut Run) -> Result<()> {
        run.step(format!(
            "helm install the chart (image {} = {})",
            app::IMAGE_REPO,
            self.env.image_source()
        ));
        app::helm_install(&self.env, &self.client, &app::chart(), &[]).await?;
        let op = self.op_user();
        ensure!(
            can_i(&["list", HTTPROUTES, "--as", &op, "-A"]).await == "yes",
            "the operator cannot list HTTPRoutes"
        );
        for verb in ["update", "patch"] {
            ensure!(
                can_i(&[verb, HTTPROUTES, "--subresource=status", "--as", &op, "-A"]).await == "no",
                "the operator can {verb} HTTPRoute status"
            );
            ensure!(
                can_i(&[
                    verb,
                    "gateways.gateway.networking.k8s.io",
                    "--as",
                    &op,
                    "-A"
                ])
                .await
                    == "no",
                "the operator can {verb} Gateways"
            );
        }
        ok("operator running; can list HTTPRoutes, Gateways, ReferenceGrants; cannot update or patch HTTPRoutes' status or Gateways");
        Ok(())
    }

    pub(super) async fn tcp_gateway(&mut self, run: &mut Run) -> Result<()> {
        run.step(format!(
            "the TCP gateway: Debian nginx on TCP 443 in each node's namespace, serving {HOST} and {HOST_X}"
        ));
        let pki = Pki::new(&self.tmp.join("pki"), "h3i-gateway-ca")?;
        let cert = pki.leaf(HOST, HOST)?;
        let cert_x = pki.leaf(HOST_X, HOST_X)?;
        for node in &self.env.nodes {
            self.nginx
                .start(node, &[(HOST, &cert), (HOST_X, &cert_x)])
                .await?;
        }
        for ip in &self.env.ips {
            let resolve = format!("{HOST}:443:{ip}");
            let ca = self.ca.to_string_lossy();
            let url = format!("https://{HOST}/whoami");
            let args = [
                "-sS",
                "--http2",
                "--max-time",
                "5",
                "--cacert",
                &ca,
                "--resolve",
                &resolve,
                "-o",
                "/dev/null",
                "-w",
                "%{http_version} %{response_code}",
                &url,
            ];
            let out = output("curl", &args).await?;
            ensure!(
                out.stdout == "2 200",
                "nginx on {ip}: {} {}",
                out.stdout,
                out.stderr.trim()
            );
        }
        ok(format!(
            "nginx answers https://{HOST}/whoami over h2 on {}",
            self.env.ips.join(" ")
        ));
        self.cert = Some(cert);
        self.cert_x = Some(cert_x);
        Ok(())
    }

    pub(super) async fn gateway(&mut self, run: &mut Run) -> Result<()> {
        run.step(format!(
            "a Gateway (class {CLASS}, no controller) with HTTPS listeners, its Secret, an annotated HTTPRoute accepted by the test"
        ));
        for ns in [NS_INFRA, NS_APP, NS_CERTS] {
            app::namespace(&self.client, ns, &[]).await?;
        }
        let (Some(cert), Some(cert_x)) = (&self.cert, &self.cert_x) else {
            return fail("no certificates");
        };
        app::tls_secret(&self.client, NS_INFRA, "gw-tls", cert).await?;
        app::tls_secret(&self.client, NS_CERTS, "cross-tls", cert_x).await?;
        let classes = gateway_api::api(&self.client, "v1", "GatewayClass", "gatewayclasses", None);
        let class = json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass",
            "metadata": {"name": CLASS}, "spec": {"controllerName": "example.com/h3i-test-gateway"}});
        k8s::apply(&classes, CLASS, &class).await?;
        let all = json!({"namespaces": {"from": "All"}});
        let gw = json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
            "metadata": {"name": "gw", "namespace": NS_INFRA},
            "spec": {"gatewayClassName": CLASS, "listeners": [
                {"name": "http", "port": 80, "protocol": "HTTP", "allowedRoutes": all},
                {"name": "https", "port": 443, "protocol": "HTTPS", "hostname": HOST,
                 "tls": {"mode": "Terminate", "certificateRefs": [{"kind": "Secret", "name": "gw-tls"}]},
                 "allowedRoutes": all},
                {"name": "cross", "port": 8443, "protocol": "HTTPS", "hostname": HOST_X,
                 "tls": {"certificateRefs": [{"name": "cross-tls", "namespace": NS_CERTS}]},
                 "allowedRoutes": all}]}});
        let gateways = gateway_api::api(&self.client, "v1", "Gateway", "gateways", Some(NS_INFRA));
        k8s::apply(&gateways, "gw", &gw).await?;
        self.route("web", HOST, "https").await?;
        ok(format!(
            "gateway/gw (listeners http, https -> secret gw-tls, cross -> secret {NS_CERTS}/cross-tls), httproute/web for {HOST}, status.parents Accepted=True"
        ));
        let route = self.routes().get("web").await?;
        for p in route.data["status"]["parents"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let c = &p["conditions"][0];
            indent(format!(
                "{}/{}: {}={} by {}",
                p["parentRef"]["name"].as_str().unwrap_or_default(),
                p["parentRef"]["sectionName"].as_str().unwrap_or_default(),
                c["type"].as_str().unwrap_or_default(),
                c["status"].as_str().unwrap_or_default(),
                p["controllerName"].as_str().unwrap_or_default()
            ));
        }
        Ok(())
    }

    /// An annotated HTTPRoute for `host` on the Gateway's listener `section`, and its status
    /// written as a gateway controller would (the run's field manager).
    async fn route(&self, name: &str, host: &str, section: &str) -> Result<()> {
        let route = json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"name": name, "namespace": NS_APP,
                "annotations": {h3_ingress::api::annotations::ENABLED: "true"}},
            "spec": {"parentRefs": [{"name": "gw", "namespace": NS_INFRA, "sectionName": section}],
                "hostnames": [host], "rules": [{"backendRefs": [{"name": "shop", "port": 80}]}]}});
        k8s::apply(&self.routes(), name, &route).await?;
        let now = sh("date", &["-u", "+%Y-%m-%dT%H:%M:%SZ"])
            .await?
            .trim()
            .to_string();
        let cond = |t: &str, message: &str| {
            json!({"type": t, "status": "True", "reason": t,
            "message": message, "observedGeneration": 1, "lastTransitionTime": now})
        };
        let status = json!({"status": {"parents": [{
            "parentRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "gw",
                "namespace": NS_INFRA, "sectionName": section},
            "controllerName": "example.com/h3i-test-gateway",
            "conditions": [cond("Accepted", "accepted by the test"), cond("ResolvedRefs", "")]}]}});
        let pp = PatchParams {
            field_manager: Some(TEST_MANAGER.into()),
            ..Default::default()
        };
        self.routes()
            .patch_status(name, &pp, &Patch::Merge(&status))
            .await?;
        Ok(())
    }

    pub(super) async fn listener(&mut self, run: &mut Run) -> Result<()> {
        run.step(format!(
            "an Http3Listener '{LISTENER}' with gatewayClassName {CLASS}: UDP 443 on every node, upstream the node's nginx"
        ));
        app::listener(
            &self.client,
            LISTENER,
            json!({"gatewayClassName": CLASS, "port": 443,
            "upstream": {"address": "127.0.0.1:443"}, "metrics": {"address": "[::]:9476"},
            "http": {"drainTimeoutSeconds": 2}}),
        )
        .await?;
        indent(format!("http3listener.h3-ingress.dev/{LISTENER} applied"));
        let dir = self.tmp.join("plugin");
        std::fs::create_dir_all(&dir).map_err(|source| h3i_scenarios::Error::Io {
            context: "mkdir plugin".into(),
            source,
        })?;
        let link = dir.join("kubectl-h3_ingress");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&self.env.binary, &link).map_err(|source| {
            h3i_scenarios::Error::Io {
                context: "plugin link".into(),
                source,
            }
        })?;
        let gw_tls = format!("{NS_INFRA}/gw-tls");
        let cross_tls = format!("{NS_CERTS}/cross-tls");
        wait_ok(
            60,
            &format!("the certificate mirror of {gw_tls} in {NS_HOSTS}"),
            || async { Ok(self.mirror_hosts(&gw_tls).await? == HOST) },
        )
        .await?;
        let cross = self.mirror_hosts(&cross_tls).await?;
        ok(format!(
            "the operator copied {gw_tls} for {HOST} into {NS_HOSTS}; no mirror of {cross_tls}: '{cross}'"
        ));
        ensure!(
            cross.is_empty(),
            "{cross_tls} was mirrored without a ReferenceGrant"
        );
        let dp = self.dp_user();
        ensure!(
            can_i(&["get", "secret/gw-tls", "-n", NS_INFRA, "--as", &dp]).await == "no",
            "the data plane can read {gw_tls} itself"
        );
        ensure!(
            can_i(&["list", HTTPROUTES, "--as", &dp, "-A"]).await == "no",
            "the data plane can list HTTPRoutes"
        );
        ensure!(
            can_i(&[
                "patch",
                HTTPROUTES,
                "--subresource=status",
                "--as",
                &dp,
                "-A"
            ])
            .await
                == "no",
            "the data plane can patch HTTPRoute status"
        );
        ok("the data plane reads neither the Gateway's Secret nor HTTPRoutes: only its mirrors");
        Ok(())
    }

    pub(super) async fn served(&mut self, run: &mut Run) -> Result<()> {
        run.step(format!(
            "HTTP/3 to {HOST} on both nodes with the Gateway's certificate (aioquic)"
        ));
        let cert = Self::sha(&self.cert);
        let what = format!(
            "{HOST} served over HTTP/3 on {} with certificate {}",
            self.env.ips.join(" "),
            h3i_scenarios::cmd::head(&cert, 12)
        );
        wait_ok(120, &what, || async {
            Ok(!self.served_everywhere(HOST, &cert).await?.is_empty())
        })
        .await?;
        indent(self.served_everywhere(HOST, &cert).await?.join("\n"));
        Ok(())
    }

    pub(super) async fn status(&mut self, run: &mut Run) -> Result<()> {
        run.step(
            "status, kubectl h3-ingress status and Events name the HTTPRoute, Gateway and listener",
        );
        wait_ok(
            60,
            &format!("{HOST} Serving in kubectl h3-ingress status"),
            || self.plugin_serving(HOST),
        )
        .await?;
        let text = self
            .plugin(&[])
            .await
            .map_err(|e| h3i_scenarios::Error::Check(format!("kubectl h3-ingress status: {e}")))?;
        indent(&text);
        let source = format!("HTTPRoute {NS_APP}/web, Gateway {NS_INFRA}/gw listener https");
        let secret = format!("{NS_INFRA}/gw-tls");
        let row = text.lines().find(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            let after = l.split_once(secret.as_str()).map(|(_, rest)| rest);
            cols.first() == Some(&HOST)
                && cols.get(1) == Some(&host_states::SERVING)
                && after.is_some_and(|r| r.starts_with(' ') && r.trim_start().starts_with(&source))
        });
        ensure!(
            row.is_some(),
            "kubectl h3-ingress status does not show {HOST} Serving from HTTPRoute {NS_APP}/web with Secret {secret}"
        );
        ok(format!(
            "kubectl h3-ingress status: {HOST} Serving, Secret {secret}, source {source}"
        ));
        let enabled = format!(
            "Normal {}: HTTP/3 enabled for {HOST}",
            event_reasons::HTTP3_ENABLED
        );
        wait_ok(
            30,
            &format!("an {} Event on httproute/web", event_reasons::HTTP3_ENABLED),
            || async {
                Ok(self
                    .route_events("web")
                    .await?
                    .iter()
                    .any(|e| e.starts_with(&enabled)))
            },
        )
        .await?;
        indent(self.route_events("web").await?.join("\n"));
        let route = self.routes().get("web").await?;
        let mut managers: Vec<String> = route
            .metadata
            .managed_fields
            .iter()
            .flatten()
            .filter(|f| f.subresource.as_deref() == Some("status"))
            .filter_map(|f| f.manager.clone())
            .collect();
        managers.sort();
        managers.dedup();
        ensure!(
            managers == [TEST_MANAGER],
            "HTTPRoute status written by {managers:?}, want only the test ({TEST_MANAGER})"
        );
        ok(format!(
            "the route's status has one writer, the test's stand-in gateway controller ({TEST_MANAGER}): h3-ingress never wrote it"
        ));
        Ok(())
    }

    pub(super) async fn cross_refused(&mut self, run: &mut Run) -> Result<()> {
        run.step(format!(
            "a cross-namespace certificate without a ReferenceGrant: {HOST_X} is {} and not served",
            reasons::REF_NOT_PERMITTED
        ));
        self.route("cross", HOST_X, "cross").await?;
        wait_ok(
            60,
            &format!("status.hosts {HOST_X} {}", reasons::REF_NOT_PERMITTED),
            || async {
                Ok(self
                    .host_status(HOST_X)
                    .await?
                    .is_some_and(|h| h.reason == reasons::REF_NOT_PERMITTED))
            },
        )
        .await?;
        if let Some(h) = self.host_status(HOST_X).await? {
            info(format!("{HOST_X}: {} {}: {}", h.state, h.reason, h.message));
        }
        let warning = format!("Warning {}", reasons::REF_NOT_PERMITTED);
        wait_ok(
            30,
            &format!(
                "a {} Warning on httproute/cross",
                reasons::REF_NOT_PERMITTED
            ),
            || async {
                Ok(self
                    .route_events("cross")
                    .await?
                    .iter()
                    .any(|e| e.starts_with(&warning)))
            },
        )
        .await?;
        let refused = self.refused_everywhere(HOST_X).await.map_err(|e| {
            h3i_scenarios::Error::Check(format!("{HOST_X} should be refused on every node: {e}"))
        })?;
        indent(refused.join("\n"));
        let cross_tls = format!("{NS_CERTS}/cross-tls");
        ensure!(
            self.mirror_hosts(&cross_tls).await?.is_empty(),
            "{cross_tls} mirrored without a ReferenceGrant"
        );
        let served = self.served_everywhere(HOST, &Self::sha(&self.cert)).await?;
        ok(format!(
            "no mirror of {cross_tls}: the data plane was not given the Secret; {HOST} still served: {} nodes",
            served.len()
        ));
        Ok(())
    }

    pub(super) async fn grant(&mut self, run: &mut Run) -> Result<()> {
        run.step(format!(
            "a ReferenceGrant in {NS_CERTS} from Gateways in {NS_INFRA} to Secret cross-tls: {HOST_X} is served"
        ));
        let grants = gateway_api::api(
            &self.client,
            "v1beta1",
            "ReferenceGrant",
            "referencegrants",
            Some(NS_CERTS),
        );
        let grant = json!({"apiVersion": "gateway.networking.k8s.io/v1beta1", "kind": "ReferenceGrant",
            "metadata": {"name": "gateways-from-infra", "namespace": NS_CERTS},
            "spec": {"from": [{"group": "gateway.networking.k8s.io", "kind": "Gateway", "namespace": NS_INFRA}],
                "to": [{"group": "", "kind": "Secret", "name": "cross-tls"}]}});
        k8s::apply(&grants, "gateways-from-infra", &grant).await?;
        let cert_x = Self::sha(&self.cert_x);
        let what = format!(
            "{HOST_X} served over HTTP/3 on {} with certificate {}",
            self.env.ips.join(" "),
            h3i_scenarios::cmd::head(&cert_x, 12)
        );
        wait_ok(120, &what, || async {
            Ok(!self.served_everywhere(HOST_X, &cert_x).await?.is_empty())
        })
        .await?;
        indent(self.served_everywhere(HOST_X, &cert_x).await?.join("\n"));
        let cross_tls = format!("{NS_CERTS}/cross-tls");
        ensure!(
            self.mirror_hosts(&cross_tls).await? == HOST_X,
            "no mirror of {cross_tls} for {HOST_X}"
        );
        wait_ok(
            90,
            &format!("{HOST_X} Serving in kubectl h3-ingress status"),
            || self.plugin_serving(HOST_X),
        )
        .await?;
        ok(format!(
            "the operator mirrored {cross_tls} once the grant permitted it; {HOST_X} Serving"
        ));
        Ok(())
    }

    pub(super) async fn annotation_removed(&mut self, run: &mut Run) -> Result<()> {
        run.step(format!(
            "remove the annotation from httproute/web: {HOST} is no longer served"
        ));
        let patch =
            json!({"metadata": {"annotations": {h3_ingress::api::annotations::ENABLED: null}}});
        k8s::merge(&self.routes(), "web", &patch).await?;
        let what = format!(
            "handshakes for {HOST} refused on {}",
            self.env.ips.join(" ")
        );
        wait_ok(60, &what, || async {
            Ok(!self.refused_everywhere(HOST).await?.is_empty())
        })
        .await?;
        indent(self.refused_everywhere(HOST).await?.join("\n"));
        let gw_tls = format!("{NS_INFRA}/gw-tls");
        let what =
            format!("{HOST} gone from the status, kubectl h3-ingress status and the mirrors");
        wait_ok(30, &what, || async {
            Ok(self.host_status(HOST).await?.is_none()
                && self.plugin_row(HOST).await?.is_empty()
                && self.mirror_hosts(&gw_tls).await?.is_empty())
        })
        .await?;
        self.served_everywhere(HOST_X, &Self::sha(&self.cert_x))
            .await
            .map_err(|e| {
                h3i_scenarios::Error::Check(format!("{HOST_X} should still be served: {e}"))
            })?;
        ok(format!(
            "{HOST_X} (httproute/cross) still served on every node"
        ));
        Ok(())
    }

    pub(super) async fn documented_example(&mut self, run: &mut Run) -> Result<()> {
        run.step("the Gateway API example of docs/configuration.md is accepted by the API server (server-side dry run)");
        let doc = std::fs::read_to_string(repo().join("docs/configuration.md")).unwrap_or_default();
        let yaml = doc_example(&doc);
        ensure!(
            !yaml.is_empty(),
            "docs/configuration.md has no YAML under \"### Gateway API\""
        );
        let file = self.tmp.join("doc-example.yaml");
        std::fs::write(&file, &yaml).map_err(|source| h3i_scenarios::Error::Io {
            context: "write the example".into(),
            source,
        })?;
        let f = file.to_string_lossy();
        let kinds = yaml.lines().filter(|l| l.starts_with("kind:")).count();
        // kubectl reads the YAML (this crate has no YAML parser) and prints each object as
        // JSON, one after the other (a List when it is given one).
        let json = sh(
            "kubectl",
            &["create", "--dry-run=client", "-o", "json", "-f", &f],
        )
        .await?;
        let mut items = Vec::new();
        for o in serde_json::Deserializer::from_str(&json).into_iter::<serde_json::Value>() {
            let o = o.map_err(|source| h3i_scenarios::Error::Json {
                context: "kubectl create --dry-run=client".into(),
                source,
            })?;
            match o["items"].as_array() {
                Some(list) => items.extend(list.iter().cloned()),
                None => items.push(o),
            }
        }
        let mut nss: Vec<String> = items
            .iter()
            .filter_map(|o| o["metadata"]["namespace"].as_str().map(String::from))
            .collect();
        nss.sort();
        nss.dedup();
        for ns in &nss {
            app::namespace(&self.client, ns, &[]).await?;
            self.doc_ns.push(ns.clone());
        }
        let out = output("kubectl", &["apply", "--dry-run=server", "-f", &f]).await?;
        if !out.success() {
            return fail(format!(
                "docs/configuration.md's Gateway API example: {}{}",
                out.stdout, out.stderr
            ));
        }
        indent(&out.stdout);
        ok(format!("{kinds} objects of the documented example pass the API server's validation (CRD schemas and CEL rules)"));
        Ok(())
    }
}

/// The YAML blocks of the "### Gateway API" section of docs/configuration.md, as one stream.
fn doc_example(doc: &str) -> String {
    let Some((_, section)) = doc.split_once("### Gateway API") else {
        return String::new();
    };
    let mut blocks = Vec::new();
    let mut rest = section;
    while let Some((_, after)) = rest.split_once("```yaml\n") {
        let Some((block, tail)) = after.split_once("```") else {
            break;
        };
        blocks.push(block.to_string());
        rest = tail;
    }
    blocks.join("\n---\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_example_is_every_yaml_block_after_the_heading() {
        let doc = "# x\n```yaml\nkind: A\n```\n### Gateway API\ntext\n```yaml\nkind: B\n```\nmore\n```yaml\nkind: C\n```\n";
        assert_eq!(doc_example(doc), "kind: B\n\n---\nkind: C\n");
        assert_eq!(doc_example("nothing"), "");
    }

    #[test]
    fn the_documentation_has_the_example() {
        let doc = std::fs::read_to_string(repo().join("docs/configuration.md")).unwrap();
        let y = doc_example(&doc);
        assert!(y.contains("kind: HTTPRoute"), "{y}");
    }
}
