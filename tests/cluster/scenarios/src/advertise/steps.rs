//! The advertise scenario's steps: the set-up, each change timed, and the reads of the zone and
//! the listener's status that every step repeats.

use std::collections::BTreeMap;
use std::time::Instant;

use h3_ingress::api::{annotations, conditions, Http3Listener};
use h3_ingress::operator::advertise::dns::plan::REGISTRY_LABEL;
use h3i_scenarios::h3::{self, Expect};
use h3i_scenarios::poll::{first_true, wait_ok};
use h3i_scenarios::{ensure, info, ok, Error, Pki};
use k8s_openapi::api::networking::v1::Ingress;
use kube::Api;
use serde_json::{json, Value};

use super::*;

/// The record the operator keeps for a host served on UDP 443.
const RECORD: &str = "1 . alpn=h3,h2";
impl Advertise {
    pub(super) async fn prepare(&mut self) -> Result<()> {
        ensure!(
            self.env.real_nodes,
            "real nodes only (H3I_NODES=real scripts/cluster.sh up)"
        );
        ensure!(
            !self.host_ip.is_empty(),
            "scripts/cluster.sh env names no H3I_HOST_IP"
        );
        knot::stop_leftovers("h3i-advertise.").await;
        if app::anything_left(&self.client, &[NS_APP]).await? {
            app::remove_leftovers(&self.client, &[NS_APP]).await?;
        }
        let classes =
            Api::<k8s_openapi::api::networking::v1::IngressClass>::all(self.client.clone());
        h3i_scenarios::k8s::delete(&classes, CLASS).await?;
        for node in &self.env.nodes {
            for pid in h3i_scenarios::nginx::stop_leftovers(node, "/tmp/h3i-advertise.") {
                info(format!(
                    "stopping a previous run's nginx in {node} (pid {pid})"
                ));
            }
        }
        Ok(())
    }

    fn knot(&self) -> Result<&Knot> {
        self.knot
            .as_ref()
            .ok_or_else(|| Error::Check("knotd is not running".into()))
    }

    pub(super) async fn install(&mut self, run: &mut Run) -> Result<()> {
        run.step(format!(
            "knotd on {}:{} serving {ZONE} (TSIG key {KEY_NAME}); helm install; nginx on both nodes serving {HOST}; its Ingress without the annotation; a listener with advertise.dns",
            self.host_ip,
            knot::PORT
        ));
        let secret = h3i_scenarios::pods::base64(&h3i_scenarios::random_bytes(32)?);
        let dir = self.tmp.join("knot");
        self.knot = Some(Knot::start(&dir, &self.host_ip, ZONE, KEY_NAME, &secret).await?);
        ok(format!(
            "knotd answers for {ZONE} on {}",
            self.knot()?.address()
        ));
        app::helm_install(&self.env, &self.client, &app::chart(), &[]).await?;
        let pki = Pki::new(&self.tmp.join("pki"), "h3i-advertise-ca")?;
        let leaf = pki.leaf("www", HOST)?;
        self.cert = leaf.sha256.clone();
        for node in &self.env.nodes {
            self.nginx.start(node, &[(HOST, &leaf)]).await?;
        }
        app::namespace(&self.client, NS_APP, &[]).await?;
        app::ingress_class(&self.client, CLASS, "example.com/h3i-advertise").await?;
        app::tls_secret(&self.client, NS_APP, "www-tls", &leaf).await?;
        app::ingress(&self.client, NS_APP, "www", CLASS, HOST, "www-tls").await?;
        self.annotate(false).await?;
        let data = BTreeMap::from([("secret", secret.into_bytes())]);
        app::secret(&self.client, NS_OP, KEY_SECRET, "Opaque", data).await?;
        self.apply_listener(false).await?;
        let what = format!(
            "the listener's {} condition written",
            conditions::DNS_ADVERTISED
        );
        wait_ok(60, &what, || async {
            Ok(self.dns_condition().await?.is_some())
        })
        .await?;
        info(self.dns_condition().await?.unwrap_or_default());
        ensure!(
            self.zone_lines().await? == (Vec::new(), Vec::new()),
            "{HOST} has records before its annotation"
        );
        ok(format!("no HTTPS or TXT record for {HOST} yet"));
        Ok(())
    }

    /// `h3-ingress.dev/enabled: "true"` on the Ingress, or the annotation removed.
    async fn annotate(&self, on: bool) -> Result<()> {
        let value = if on { json!("true") } else { Value::Null };
        let patch = json!({"metadata": {"annotations": {annotations::ENABLED: value}}});
        let api: Api<Ingress> = Api::namespaced(self.client.clone(), NS_APP);
        h3i_scenarios::k8s::merge(&api, "www", &patch).await?;
        Ok(())
    }

    /// The listener, with `advertise.dns` naming knotd; `off_nodes` adds a nodeSelector that no
    /// node matches (the DaemonSet then has no pod).
    async fn apply_listener(&self, off_nodes: bool) -> Result<()> {
        let mut spec = json!({"ingressClassName": CLASS,
            "upstream": {"address": "127.0.0.1:443"}, "http": {"drainTimeoutSeconds": 2},
            "advertise": {"dns": {"server": self.knot()?.address(), "zones": [ZONE],
                "tsigKeyName": KEY_NAME, "tsigSecretRef": {"name": KEY_SECRET, "key": "secret"},
                "ttlSeconds": 30}}});
        if off_nodes {
            spec["nodeSelector"] = json!({"h3i.test/advertise": "nowhere"});
        }
        app::listener(&self.client, LISTENER, spec).await?;
        Ok(())
    }

    /// `STATUS/REASON: MESSAGE` of the listener's DnsAdvertised condition.
    async fn dns_condition(&self) -> Result<Option<String>> {
        let c = h3i_scenarios::k8s::condition(&self.client, LISTENER, conditions::DNS_ADVERTISED)
            .await?;
        Ok(c.map(|c| format!("{}/{}: {}", c.status, c.reason, c.message)))
    }

    /// The host's HTTPS records and the TXT records of its ownership entry.
    async fn zone_lines(&self) -> Result<(Vec<String>, Vec<String>)> {
        let k = self.knot()?;
        let txt = format!("{REGISTRY_LABEL}.{HOST}");
        Ok((k.query(HOST, "HTTPS").await?, k.query(&txt, "TXT").await?))
    }

    async fn published(&self) -> Result<bool> {
        let (https, txt) = self.zone_lines().await?;
        Ok(https == [RECORD] && !txt.is_empty())
    }

    async fn withdrawn(&self) -> Result<bool> {
        Ok(self.zone_lines().await? == (Vec::new(), Vec::new()))
    }

    /// Aioquic GET /whoami on both nodes answered 200 with the host's certificate.
    async fn served(&self) -> Result<bool> {
        let want = Expect {
            cert_sha256: Some(&self.cert),
            ..Default::default()
        };
        h3::get_all(&self.env.ips, HOST, 443, "/whoami", &self.ca, &want).await?;
        Ok(true)
    }

    /// `status.advertise.dns.published` becomes `n`; the zone's lines and the condition shown.
    async fn status_says(&self, n: i64) -> Result<()> {
        let api: Api<Http3Listener> = Api::all(self.client.clone());
        let what = format!("status.advertise.dns.published = {n}");
        wait_ok(30, &what, || async {
            let l = api.get(LISTENER).await?;
            let dns = l.status.and_then(|s| s.advertise).and_then(|a| a.dns);
            Ok(dns.is_some_and(|d| d.published == n))
        })
        .await?;
        let (https, txt) = self.zone_lines().await?;
        info(format!(
            "{HOST} HTTPS {https:?}; {REGISTRY_LABEL}.{HOST} TXT {txt:?}"
        ));
        info(self.dns_condition().await?.unwrap_or_default());
        Ok(())
    }
}

impl Advertise {
    /// Served on both nodes and published, timed from `t0` together: (served, published).
    async fn served_and_published(&self, t0: Instant) -> Result<(f64, f64)> {
        let (what_served, what_published) = (
            format!("{HOST} served on both nodes"),
            format!("{HOST}'s HTTPS record in the zone"),
        );
        let (served, published) = tokio::join!(
            first_true(t0, 120, &what_served, || self.served()),
            first_true(t0, 120, &what_published, || self.published()),
        );
        Ok((served?, published?))
    }

    pub(super) async fn annotated(&mut self, run: &mut Run) -> Result<()> {
        run.step(format!(
            "(a) the annotation added: {HOST} served over HTTP/3 on both nodes, then its HTTPS record and TXT in the zone"
        ));
        let t0 = Instant::now();
        self.annotate(true).await?;
        let (served, published) = self.served_and_published(t0).await?;
        ok(format!(
            "after the annotation: served on both nodes at {served:.2} s, the record in the zone at {published:.2} s"
        ));
        self.status_says(1).await?;
        self.timings.row(
            "(a) annotation added: record in the zone after the host is served",
            published - served,
        );
        Ok(())
    }

    pub(super) async fn off_the_nodes(&mut self, run: &mut Run) -> Result<()> {
        run.step("(b) the data plane taken off the nodes (a nodeSelector no node matches): no data plane pod serving, then the record and the TXT gone");
        let t0 = Instant::now();
        self.apply_listener(true).await?;
        let (stopped, gone) = tokio::join!(
            first_true(t0, 120, "no data plane pod Ready and not deleted", || {
                app::none_serving(&self.client, LISTENER)
            }),
            first_true(t0, 120, "the record and the TXT gone", || self.withdrawn()),
        );
        let (stopped, gone) = (stopped?, gone?);
        let pods_gone = first_true(t0, 120, "the data plane pods gone", || async {
            Ok(app::pods(&self.client, &app::dp_selector(LISTENER))
                .await?
                .is_empty())
        })
        .await?;
        ok(format!(
            "after the nodeSelector: no pod serving at {stopped:.2} s, the record gone at {gone:.2} s, the pods gone at {pods_gone:.2} s"
        ));
        self.status_says(0).await?;
        self.timings.row(
            "(b) data plane off the nodes: record gone after no pod serves",
            gone - stopped,
        );
        Ok(())
    }

    pub(super) async fn back_on_the_nodes(&mut self, run: &mut Run) -> Result<()> {
        run.step(format!(
            "(c) the data plane back on the nodes: {HOST} served again, then its record back"
        ));
        let t0 = Instant::now();
        self.apply_listener(false).await?;
        let (served, published) = self.served_and_published(t0).await?;
        ok(format!(
            "after the nodeSelector went: served on both nodes at {served:.2} s, the record back at {published:.2} s"
        ));
        self.status_says(1).await?;
        self.timings.row(
            "(c) data plane back: record in the zone after the host is served",
            published - served,
        );
        Ok(())
    }

    pub(super) async fn unannotated(&mut self, run: &mut Run) -> Result<()> {
        run.step(format!(
            "(d) the annotation removed: {HOST}'s record and TXT gone"
        ));
        let t0 = Instant::now();
        self.annotate(false).await?;
        let gone = first_true(t0, 120, "the record and the TXT gone", || self.withdrawn()).await?;
        ok(format!(
            "after the annotation went: the record gone at {gone:.2} s"
        ));
        self.status_says(0).await?;
        self.timings
            .row("(d) annotation removed: record gone after the change", gone);
        Ok(())
    }
}
