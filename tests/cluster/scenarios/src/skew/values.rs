//! The skew scenario's value part: under the newer CRD, a second listener uses a value of an
//! enum that only that CRD admits ([`FUTURE_CC`]), as a listener written before a `helm
//! rollback` of the binary would. The kube-rs list of listeners fails on one object it cannot
//! parse, so the failure this guards against is every listener going unreconciled (and a
//! restarted operator never getting past its first list); what must happen is that listener
//! alone refused with `InvalidSpec`, naming the field, by the running operator and by a
//! restarted one, which still reconciles the first listener's next generation.

use std::time::Instant;

use h3_ingress::api::reasons;
use h3i_scenarios::poll::wait_ok;
use h3i_scenarios::{ensure, info, ok};
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

use super::crd::FUTURE_CC;
use super::*;

const FUTURE_LISTENER: &str = "skew-future";
/// Its own UDP port and a class with no Ingresses: were it ever applied, it would collide with
/// nothing.
const FUTURE_PORT: u16 = 8443;
const FUTURE_CLASS: &str = "h3i-skew-future";
/// What the refusal must name.
const FIELD: &str = "spec.transport.congestionControl";

impl Skew {
    /// `Ready=False/InvalidSpec` on the future listener, naming the field and the value.
    async fn future_refused(&self) -> Result<Option<String>> {
        let c = k8s::condition(&self.client, FUTURE_LISTENER, conditions::READY).await?;
        Ok(c.filter(|c| {
            c.status == "False"
                && c.reason == reasons::INVALID_SPEC
                && c.message.contains(FIELD)
                && c.message.contains(FUTURE_CC)
        })
        .map(|c| c.message))
    }

    /// The first listener as installed, with `rollout.maxSurge` set when given (a change of the
    /// DaemonSet's update strategy alone: no pod rolls): its generation.
    async fn first_listener(&self, max_surge: Option<&str>) -> Result<i64> {
        let mut spec = json!({"ingressClassName": CLASS,
            "upstream": {"address": "127.0.0.1:443"}, "http": {"drainTimeoutSeconds": 2}});
        if let Some(s) = max_surge {
            spec["rollout"] = json!({ "maxSurge": s });
        }
        let l = app::listener(&self.client, LISTENER, spec).await?;
        Ok(l.metadata.generation.unwrap_or_default())
    }

    pub(super) async fn newer_value(&mut self, run: &mut Run) -> Result<()> {
        run.step(format!(
            "(a) a second listener {FUTURE_LISTENER} with transport.congestionControl={FUTURE_CC} (only the newer CRD admits it): refused alone, also by a restarted operator, which still reconciles {LISTENER}"
        ));
        app::listener(
            &self.client,
            FUTURE_LISTENER,
            json!({"ingressClassName": FUTURE_CLASS, "port": FUTURE_PORT,
            "upstream": {"address": "127.0.0.1:443"},
            "transport": {"congestionControl": FUTURE_CC}}),
        )
        .await?;
        let t0 = Instant::now();
        let what = format!(
            "{FUTURE_LISTENER}: {}=False/{} naming {FIELD} and {FUTURE_CC}",
            conditions::READY,
            reasons::INVALID_SPEC
        );
        wait_ok(60, &what, || async {
            Ok(self.future_refused().await?.is_some())
        })
        .await?;
        let refused_after = t0.elapsed().as_secs_f64();
        info(self.future_refused().await?.unwrap_or_default());
        self.restart_operator().await?;
        let t1 = Instant::now();
        let generation = self.first_listener(Some("50%")).await?;
        let what = format!("the restarted operator observed generation {generation} of {LISTENER}");
        wait_ok(60, &what, || async {
            let l = self.raw_listeners().get(LISTENER).await?;
            Ok(l.data["status"]["observedGeneration"] == generation)
        })
        .await?;
        let observed_after = t1.elapsed().as_secs_f64();
        wait_ok(30, &format!("{FUTURE_LISTENER} still refused"), || async {
            Ok(self.future_refused().await?.is_some())
        })
        .await?;
        let dp = app::pods(&self.client, &app::dp_selector(FUTURE_LISTENER)).await?;
        ensure!(
            dp.is_empty(),
            "{FUTURE_LISTENER} has data plane pods: {}",
            app::pod_names(&dp)
        );
        wait_ok(60, "every host still served on both nodes", || {
            self.all_served()
        })
        .await?;
        ok(format!("{FUTURE_LISTENER} refused after {refused_after:.1} s, no data plane for it; the restarted operator reconciled {LISTENER} generation {generation} {observed_after:.1} s after the change"));
        let raw = self.raw_listeners();
        k8s::delete(&raw, FUTURE_LISTENER).await?;
        self.first_listener(None).await?;
        self.summary.push(format!(
            "(a) a value only the newer CRD admits ({FIELD}={FUTURE_CC}) on a second listener: {} after {refused_after:.1} s, that listener alone; a restarted operator reconciled the first listener's next generation after {observed_after:.1} s",
            reasons::INVALID_SPEC
        ));
        Ok(())
    }

    /// The operator pod deleted, and a new one Ready.
    async fn restart_operator(&self) -> Result<()> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), NS_OP);
        let op = app::op_selector();
        let old = k8s::names(&pods, &op).await?;
        for p in &old {
            k8s::delete(&pods, p).await?;
        }
        wait_ok(120, "a new operator pod Ready", || async {
            for p in &old {
                if k8s::exists(&pods, p).await? {
                    return Ok(false);
                }
            }
            app::pods_ready(&self.client, &op, 1).await
        })
        .await
    }
}
