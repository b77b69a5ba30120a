//! The journey's control-plane half: port conflicts, leader hand-over, the optional Service,
//! the CEL rule, an API server outage, RBAC, garbage collection and Pod Security admission.

use h3i_scenarios::k8s::Apis;
use std::time::{Duration, Instant};

use h3_ingress::api::reasons;
use h3i_scenarios::cmd::{output, repo, run as sh};
use h3i_scenarios::env::cluster;
use h3i_scenarios::k8s;
use h3i_scenarios::poll::{until, wait_ok};
use h3i_scenarios::{ensure, expect_eq, fail, info, ok, pods, Error, Result, Run};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Namespace, Pod, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::ResourceExt;
use serde_json::json;

use super::*;

impl Journey {
    pub(super) async fn port_conflicts(&mut self, run: &mut Run) -> Result<()> {
        run.step("a second listener on the same nodes and UDP port, then one on the same metrics port, get the PortConflict reason");
        let ls = self.all::<Http3Listener>();
        let dss = self.ns::<DaemonSet>(NS_OP);
        let twin = format!("{LISTENER}-twin");
        self.apply_listener(&twin, 443, DP_ADMIN_PORT, json!({}))
            .await?;
        let conflict = || async { Ok(self.ready(&twin).await?.1 == reasons::PORT_CONFLICT) };
        wait_ok(
            30,
            &format!("h3l/{twin} Ready=False reason {}", reasons::PORT_CONFLICT),
            conflict,
        )
        .await?;
        let (s, _, m) = self.ready(&twin).await?;
        expect_eq(&format!("{twin} Ready"), "False", s.as_str())?;
        ok(format!("message: {m}"));
        ensure!(
            !k8s::exists(&dss, &data_plane_name(&twin)).await?,
            "the conflicting listener's DaemonSet was applied"
        );
        k8s::delete(&ls, &twin).await?;
        // Another UDP port but the same metrics port: the clash is on the TCP hostPort alone.
        let twin2 = format!("{LISTENER}-twin2");
        self.apply_listener(&twin2, 8443, DP_ADMIN_PORT, json!({}))
            .await?;
        let metrics_conflict = || async {
            let (_, r, m) = self.ready(&twin2).await?;
            Ok(r == reasons::PORT_CONFLICT && m.contains("TCP port 9476 (spec.metrics.address)"))
        };
        let what = format!(
            "h3l/{twin2} (UDP 8443, metrics 9476) Ready=False reason {} on TCP 9476",
            reasons::PORT_CONFLICT
        );
        wait_ok(30, &what, metrics_conflict).await?;
        ensure!(
            !k8s::exists(&dss, &data_plane_name(&twin2)).await?,
            "the conflicting listener's DaemonSet was applied"
        );
        let m = self.ready(&twin2).await?.2;
        ok(format!(
            "message: {}..; no DaemonSet for it",
            h3i_scenarios::cmd::head(&m, 120)
        ));
        ensure!(
            self.ready(LISTENER).await?.0 == "True",
            "the first listener lost Ready=True to the conflicts"
        );
        ok(format!("{LISTENER} stays Ready=True"));
        k8s::delete(&ls, &twin2).await
    }

    pub(super) async fn hand_over(&mut self, run: &mut Run) -> Result<()> {
        run.step("leader hand-over: a second operator replica takes the Lease when the leader hangs, and when it is deleted");
        // Also pins the init container's image (checked on the Pod Security step's listener).
        let chart = repo().join("charts/h3-ingress");
        let tune = format!("dataPlane.tuneImage={}", self.tune_image);
        let args = [
            "upgrade",
            RELEASE,
            &*chart.to_string_lossy(),
            "-n",
            NS_OP,
            "--reuse-values",
            "--set",
            "operator.replicas=2",
            "--set",
            &tune,
            "--wait",
            "--timeout",
            "120s",
        ];
        sh("helm", &args)
            .await
            .map_err(|e| Error::Check(format!("helm upgrade: {e}")))?;
        let deploys = self.ns::<Deployment>(NS_OP);
        let ready = |d: Deployment| d.status.and_then(|s| s.ready_replicas).unwrap_or(0);
        let tune_repo = self.tune_image.split('@').next().unwrap_or_default();
        ok(format!("helm upgrade --set operator.replicas=2 --set dataPlane.tuneImage={tune_repo}@...: {} replicas ready", ready(deploys.get(OP_DEPLOY).await?)));
        // The upgrade replaced the replicas: the old leader released the Lease on SIGTERM.
        wait_ok(
            30,
            "a running replica of the new ReplicaSet holds the Lease",
            || self.leader_running(),
        )
        .await?;
        let leader = self.leader_pod().await?.unwrap_or_default();
        let podapi = self.ns::<Pod>(NS_OP);
        let pid = pods::pid(&self.env, &podapi, NS_OP, &leader, "operator").await?;
        info(format!("leader {leader} (pid {pid}); freezing it with SIGSTOP (a hung or partitioned leader does not release the Lease)"));
        sh("kill", &["-STOP", &pid.to_string()]).await?;
        let t0 = Instant::now();
        let taken = until(
            45,
            &format!("another replica takes the Lease from the frozen {leader}"),
            || async { Ok(self.leader_pod().await?.is_some_and(|l| l != leader)) },
        )
        .await;
        let lease = self.ns::<Lease>(NS_OP).get(LEASE).await;
        let _ = k8s::delete(&podapi, &leader).await;
        let _ = output("kill", &["-CONT", &pid.to_string()]).await;
        taken?;
        let new_leader = self.leader_pod().await?.unwrap_or_default();
        let secs = lease?
            .spec
            .and_then(|s| s.lease_duration_seconds)
            .unwrap_or_default();
        ok(format!(
            "Lease taken by {new_leader} {}s after the freeze (leaseDurationSeconds {secs})",
            t0.elapsed().as_secs()
        ));
        until(
            30,
            "the new leader exports h3_ingress_operator_leader 1",
            || async { Ok(self.operator_metric("h3_ingress_operator_leader").await? == 1.0) },
        )
        .await?;
        ok(format!(
            "the frozen pod deleted; {new_leader} reports h3_ingress_operator_leader 1"
        ));
        wait_ok(
            60,
            "operator Deployment back to 2 ready replicas",
            || async { Ok(ready(deploys.get(OP_DEPLOY).await?) == 2) },
        )
        .await?;
        // The everyday hand-over (rollout, drain, kubectl delete): the leader gets SIGTERM and
        // gives the Lease up, so the standby takes it within its retry period, not after expiry.
        wait_ok(30, "both replicas running, one holding the Lease", || {
            self.leader_running()
        })
        .await?;
        let leader = self.leader_pod().await?.unwrap_or_default();
        let t0 = Instant::now();
        k8s::delete(&podapi, &leader).await?;
        let what = format!("the standby takes the Lease that the deleted {leader} released (before it could expire)");
        until(8, &what, || async {
            Ok(self.leader_pod().await?.is_some_and(|l| l != leader)
                && self.leader_running().await?)
        })
        .await?;
        let now = self.leader_pod().await?.unwrap_or_default();
        ok(format!(
            "leader {leader} deleted (SIGTERM): {now} holds the Lease {}s later",
            t0.elapsed().as_secs()
        ));
        Ok(())
    }

    /// `kubectl auth can-i ARGS`: yes or no, as the API server judges.
    async fn can(args: &[&str]) -> String {
        let mut all = vec!["auth", "can-i"];
        all.extend(args);
        output("kubectl", &all)
            .await
            .map(|o| o.stdout.trim().to_string())
            .unwrap_or_default()
    }

    pub(super) async fn service(&mut self, run: &mut Run) -> Result<()> {
        run.step("the optional Service (spec.service), applied by the new leader: a 403 becomes Ready=False Forbidden; LoadBalancer, then NodePort");
        // The operator's Role loses create/patch on Services (as a cluster admin trimming RBAC
        // would): the listener says why in its status and a Warning event, the data plane serves on.
        let roles = self.ns::<Role>(NS_OP);
        let rules0 = roles.get(OP_ROLE).await?.rules.unwrap_or_default();
        let mut trimmed = rules0.clone();
        for r in &mut trimmed {
            if r.resources.iter().flatten().any(|x| x == "services") {
                r.verbs.retain(|v| v != "create" && v != "patch");
            }
        }
        k8s::merge(&roles, OP_ROLE, &json!({ "rules": trimmed })).await?;
        let op_user = self.op_user();
        wait_ok(10, "the operator may no longer create Services", || async {
            Ok(Self::can(&["create", "services", "-n", NS_OP, "--as", &op_user]).await == "no")
        })
        .await?;
        let ls = self.all::<Http3Listener>();
        let spec = json!({"spec": {"service": {"type": "LoadBalancer", "includeTcp": true, "annotations": {"metallb.universe.tf/allow-shared-ip": "h3i-journey"}}}});
        k8s::merge(&ls, LISTENER, &spec).await?;
        let forbidden = || async {
            k8s::condition_is(
                &self.client,
                LISTENER,
                h3_ingress::api::conditions::READY,
                "False",
                reasons::FORBIDDEN,
            )
            .await
        };
        wait_ok(
            30,
            &format!("h3l/{LISTENER} Ready=False reason {}", reasons::FORBIDDEN),
            forbidden,
        )
        .await?;
        let msg = self.ready(LISTENER).await?.2;
        ensure!(
            msg.contains("services"),
            "the Forbidden message should name the Service: {msg}"
        );
        ok(format!("message: {}", h3i_scenarios::cmd::head(&msg, 220)));
        let warning = || async {
            let ev = k8s::events(
                &self.client,
                "Http3Listener",
                &self.listener_uid,
                Some("Warning"),
                Some(reasons::FORBIDDEN),
            )
            .await?;
            Ok(!ev.is_empty())
        };
        wait_ok(
            30,
            &format!("a Warning event {} on the listener", reasons::FORBIDDEN),
            warning,
        )
        .await?;
        ensure!(
            self.h3_all_nodes(HOST, &self.cert_v2).await.is_ok(),
            "the data plane stopped serving {HOST} while the Service was forbidden"
        );
        ok(format!("{HOST} still served on both nodes"));
        k8s::merge(&roles, OP_ROLE, &json!({ "rules": rules0 })).await?;
        self.service_kinds().await
    }

    async fn service_kinds(&self) -> Result<()> {
        let svcs = self.ns::<Service>(NS_OP);
        let dp = self.dp();
        // Retried on the operator's error schedule (15 s).
        wait_ok(
            45,
            &format!("Role restored: Service {NS_OP}/{dp} created"),
            || k8s::exists(&svcs, &dp),
        )
        .await?;
        let svc = svcs.get(&dp).await?;
        self.owned_by_listener("svc", &svc)?;
        let describe = |s: &Service, node_ports: bool| {
            let spec = s.spec.clone().unwrap_or_default();
            let ports: Vec<String> = spec
                .ports
                .iter()
                .flatten()
                .map(|p| {
                    let np = if node_ports {
                        format!("->{}", p.node_port.unwrap_or(0))
                    } else {
                        String::new()
                    };
                    format!("{}/{}{np}", p.protocol.clone().unwrap_or_default(), p.port)
                })
                .collect();
            let ann = s
                .annotations()
                .get("metallb.universe.tf/allow-shared-ip")
                .cloned()
                .unwrap_or_default();
            (
                spec.type_.unwrap_or_default(),
                spec.external_traffic_policy.unwrap_or_default(),
                ann,
                ports,
            )
        };
        let (t, etp, ann, ports) = describe(&svc, false);
        info(format!("{t} {etp} {ann} {}", ports.join(" ")));
        ensure!(t == "LoadBalancer" && etp == "Local" && ann == "h3i-journey" && ports.contains(&"UDP/443".into()) && ports.contains(&"TCP/443".into()),
            "Service: '{t} {etp} {ann} {ports:?}', want LoadBalancer, externalTrafficPolicy Local, the allow-shared-ip annotation, UDP and TCP 443");
        ok("mixed-protocol LoadBalancer Service (UDP and TCP 443), externalTrafficPolicy Local, annotation passed through, owned by the listener");
        wait_ok(30, &format!("h3l/{LISTENER} Ready=True again"), || async {
            Ok(self.ready(LISTENER).await?.0 == "True"
                && self.summaries(LISTENER).await? == ("1/1".into(), "2/2".into()))
        })
        .await?;
        let ls = self.all::<Http3Listener>();
        // The whole of spec.service replaced: what the LoadBalancer had set goes.
        let nodeport_only = json!({"spec": {"service": {"type": "NodePort", "includeTcp": null, "annotations": null}}});
        k8s::merge(&ls, LISTENER, &nodeport_only).await?;
        let nodeport = || async {
            Ok(svcs.get(&dp).await?.spec.and_then(|s| s.type_).as_deref() == Some("NodePort"))
        };
        wait_ok(
            30,
            &format!("Service {NS_OP}/{dp} changed to NodePort"),
            nodeport,
        )
        .await?;
        let svc = svcs.get(&dp).await?;
        let (t, etp, _, ports) = describe(&svc, true);
        info(format!("{t} {etp} {}", ports.join(" ")));
        let udp_only =
            ports.len() == 1 && ports[0].starts_with("UDP/443->") && !ports[0].ends_with("->0");
        ensure!(t == "NodePort" && etp == "Local" && udp_only, "Service: '{t} {etp} {ports:?}', want NodePort, externalTrafficPolicy Local, UDP 443 only");
        let sel = svc.spec.and_then(|s| s.selector).unwrap_or_default();
        if self.env.real_nodes {
            ok(format!("NodePort Service with UDP 443 and externalTrafficPolicy Local, selector {sel:?} (HTTP/3 through it via kube-proxy: node-checks)"));
        } else {
            ok(format!("NodePort Service with UDP 443 and externalTrafficPolicy Local, selector {sel:?} (only the objects are checked: the node agent runs no kube-proxy)"));
        }
        let (s, r, _) = self.ready(LISTENER).await?;
        ensure!(
            s == "True",
            "h3l/{LISTENER} not Ready after the change to NodePort: {r}"
        );
        k8s::merge(&ls, LISTENER, &json!({"spec": {"service": null}})).await?;
        wait_ok(
            30,
            &format!("spec.service removed: Service {dp} pruned"),
            || async { Ok(!k8s::exists(&svcs, &dp).await?) },
        )
        .await
    }

    pub(super) async fn cel(&mut self, run: &mut Run) -> Result<()> {
        run.step("an invalid listener is rejected by the API server with the CEL rule's message");
        let ls = self.all::<Http3Listener>();
        let obj = json!({"apiVersion": "h3-ingress.dev/v1alpha1", "kind": "Http3Listener", "metadata": {"name": "journey-invalid"},
            "spec": {"upstream": {"address": "127.0.0.1:443", "tls": false, "verify": "system"}}});
        match k8s::apply(&ls, "journey-invalid", &obj).await {
            Ok(_) => {
                k8s::delete(&ls, "journey-invalid").await?;
                fail("the API server accepted upstream.tls=false with verify=system")
            }
            Err(Error::Kube(kube::Error::Api(e))) => {
                ensure!(
                    e.message
                        .contains("upstream.verify needs upstream.tls: true"),
                    "unexpected rejection: {}",
                    e.message
                );
                indent(format!("{} ({})", e.message, e.code));
                ok("rejected with the rule's message");
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    async fn apiserver_down(&self) -> bool {
        !matches!(
            tokio::time::timeout(Duration::from_secs(1), self.client.apiserver_version()).await,
            Ok(Ok(_))
        )
    }

    pub(super) async fn apiserver_restart(&mut self, run: &mut Run) -> Result<()> {
        run.step("kube-apiserver restart: the data plane keeps serving during the outage and catches up afterwards");
        let restart = tokio::spawn(cluster(&["restart-apiserver", "5"]));
        let t0 = Instant::now();
        until(30, "kube-apiserver down", || async {
            Ok(self.apiserver_down().await)
        })
        .await?;
        ok(format!(
            "kube-apiserver is down ({}s)",
            t0.elapsed().as_secs()
        ));
        let want = h3::Expect {
            cert_sha256: Some(&self.cert_v2),
            body_sha256: Some(&self.body_sha),
            alt_svc: Some(ALT_SVC),
        };
        for ip in &self.env.ips {
            let line = h3::get(
                h3::Client::Aioquic,
                &self.target(ip, HOST, "/1m.bin"),
                &want,
            )
            .await;
            indent(line.map_err(|e| {
                Error::Check(format!("HTTP/3 on {ip} while the API server is down: {e}"))
            })?);
        }
        ensure!(
            self.apiserver_down().await,
            "the API server came back before the checks ended: not proven during the outage"
        );
        ok(format!(
            "both nodes served {HOST} while the API server was still down"
        ));
        let log = restart
            .await
            .map_err(|e| Error::Command(format!("restart-apiserver: {e}")))??;
        indent(log);
        ok(format!(
            "kube-apiserver back after {}s",
            t0.elapsed().as_secs()
        ));
        info(format!("after the restart: a second Ingress for {HOST2} with its own Secret and no ingressClassName,"));
        info("then IngressClass nginx marked default (the DefaultIngressClass admission plugin fills in the");
        info("class only for Ingresses created after that, so this one relies on our default-class rule)");
        self.tls_secret(NS_APP, "shop2-tls", HOST2).await?;
        let ing = self.ns::<Ingress>(NS_APP);
        let created = k8s::apply(&ing, "shop2", &Self::ingress("shop2", None, HOST2)).await?;
        ensure!(
            created.spec.and_then(|s| s.ingress_class_name).is_none(),
            "ingress shop2 got a class at creation"
        );
        let default = json!({"metadata": {"annotations": {"ingressclass.kubernetes.io/is-default-class": "true"}}});
        k8s::merge(&self.all::<IngressClass>(), "nginx", &default).await?;
        // Watches back off (up to 30 s, as client-go's reflectors do) while the API server is
        // away, and the data plane serves the new host once the operator wrote its mirror.
        let what = format!(
            "{HOST2} served on both nodes (the data plane's watches and the operator caught up)"
        );
        wait_ok(90, &what, || self.h3_all_nodes(HOST2, &self.cert_host2)).await?;
        let want = h3::Expect {
            cert_sha256: Some(&self.cert_host2),
            body_sha256: Some(&self.body_sha),
            alt_svc: Some(ALT_SVC),
        };
        indent(
            h3::get(
                h3::Client::Aioquic,
                &self.target(&self.env.ips[0], HOST2, "/1m.bin"),
                &want,
            )
            .await?,
        );
        let both = || async {
            Ok(self.summaries(LISTENER).await?.0 == "2/2"
                && self.ready(LISTENER).await?.0 == "True")
        };
        wait_ok(30, &format!("h3l/{LISTENER} hosts 2/2, Ready True"), both).await?;
        for (pod, _, restarts, _) in self.pods_state().await? {
            ensure!(
                restarts == 0,
                "{pod} restarted during the API server outage"
            );
        }
        ok("no data plane restarts");
        Ok(())
    }

    pub(super) async fn rbac(&mut self, run: &mut Run) -> Result<()> {
        run.step("RBAC as the API server judges it (kubectl auth can-i --as)");
        let (dp, op) = (self.dp_user(), self.op_user());
        let list = [
            (
                "no",
                "data plane reads its host's Secret in the application namespace",
                vec!["get", "secret/shop-tls", "-n", NS_APP],
                &dp,
            ),
            (
                "no",
                "data plane lists Secrets in the application namespace",
                vec!["list", "secrets", "-n", NS_APP],
                &dp,
            ),
            (
                "yes",
                "data plane lists the certificate mirrors",
                vec!["list", "secrets", "-n", NS_HOSTS],
                &dp,
            ),
            (
                "no",
                "data plane reads Secrets in its own namespace (pull secrets, Helm's)",
                vec!["get", "secrets", "-n", NS_OP],
                &dp,
            ),
            (
                "no",
                "data plane reads Secrets in kube-system",
                vec!["get", "secrets", "-n", "kube-system"],
                &dp,
            ),
            (
                "no",
                "data plane reads Ingresses",
                vec!["list", "ingresses.networking.k8s.io", "-A"],
                &dp,
            ),
            (
                "no",
                "data plane writes a mirror",
                vec!["patch", "secrets", "-n", NS_HOSTS],
                &dp,
            ),
            (
                "no",
                "data plane writes its listener",
                vec!["patch", "http3listeners.h3-ingress.dev/journey"],
                &dp,
            ),
            (
                "no",
                "operator binds clusterroles",
                vec!["bind", "clusterroles"],
                &op,
            ),
            (
                "no",
                "operator binds roles",
                vec!["bind", "roles", "-n", NS_APP],
                &op,
            ),
            (
                "no",
                "operator escalates clusterroles",
                vec!["escalate", "clusterroles"],
                &op,
            ),
            (
                "no",
                "operator escalates roles",
                vec!["escalate", "roles", "-n", NS_APP],
                &op,
            ),
            (
                "no",
                "operator creates DaemonSets outside its namespace",
                vec!["create", "daemonsets", "-n", NS_APP],
                &op,
            ),
            (
                "yes",
                "operator creates DaemonSets in its namespace",
                vec!["create", "daemonsets", "-n", NS_OP],
                &op,
            ),
        ];
        for (want, what, mut args, user) in list {
            args.extend(["--as", user.as_str()]);
            let got = Self::can(&args).await;
            ensure!(
                got == want,
                "{what}: kubectl auth can-i {} -> '{got}', want '{want}'",
                args.join(" ")
            );
            ok(format!("{what}: {got}"));
        }
        self.cannot_escalate().await
    }

    /// The API server refuses the operator's attempt to bind itself cluster-admin.
    async fn cannot_escalate(&self) -> Result<()> {
        let as_operator = self.env.client_as(Some(&self.op_user())).await?;
        let bindings: Api<ClusterRoleBinding> = Api::all(as_operator);
        let crb = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "h3i-journey-escalate"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": [{"kind": "ServiceAccount", "name": OP_SA, "namespace": NS_OP}]});
        match k8s::apply(&bindings, "h3i-journey-escalate", &crb).await {
            Ok(_) => {
                k8s::delete(&self.all::<ClusterRoleBinding>(), "h3i-journey-escalate").await?;
                fail("the operator could bind itself to cluster-admin")
            }
            Err(Error::Kube(kube::Error::Api(e))) if e.code == 403 => {
                let why = e.message.split("forbidden: ").nth(1).unwrap_or(&e.message);
                let why = why.split('(').next().unwrap_or_default();
                ok(format!(
                    "the operator cannot bind itself cluster-admin: forbidden: {why}"
                ));
                Ok(())
            }
            Err(e) => fail(format!(
                "binding cluster-admin as the operator failed oddly: {e}"
            )),
        }
    }

    /// Nothing the listener owned is left: by name (a label selector would pass on objects
    /// that lost their labels), then by label.
    async fn owned_gone(&self) -> Result<bool> {
        let (dp, rbac) = (self.dp(), self.dp_rbac());
        let named = k8s::exists(&self.ns::<DaemonSet>(NS_OP), &dp).await?
            || k8s::exists(&self.ns::<ServiceAccount>(NS_OP), &dp).await?
            || k8s::exists(&self.ns::<Service>(NS_OP), &dp).await?
            || k8s::exists(&self.ns::<Role>(NS_HOSTS), &rbac).await?
            || k8s::exists(&self.ns::<RoleBinding>(NS_HOSTS), &rbac).await?
            || k8s::exists(&self.all::<ClusterRole>(), &self.dp_cluster_rbac()).await?
            || k8s::exists(&self.all::<ClusterRoleBinding>(), &self.dp_cluster_rbac()).await?;
        let sel = format!("{}={LISTENER}", h3_ingress::operator::labels::INSTANCE);
        let labelled = k8s::names(&self.ns::<DaemonSet>(NS_OP), &sel).await?.len()
            + k8s::names(&self.ns::<ServiceAccount>(NS_OP), &sel)
                .await?
                .len()
            + k8s::names(&self.ns::<Service>(NS_OP), &sel).await?.len()
            + k8s::names(&self.ns::<Pod>(NS_OP), &sel).await?.len()
            + k8s::names(&self.ns::<Role>(NS_HOSTS), &sel).await?.len()
            + k8s::names(&self.ns::<RoleBinding>(NS_HOSTS), &sel)
                .await?
                .len()
            + k8s::names(
                &self.ns::<k8s_openapi::api::core::v1::Secret>(NS_HOSTS),
                &sel,
            )
            .await?
            .len()
            + k8s::names(&self.all::<ClusterRole>(), &sel).await?.len()
            + k8s::names(&self.all::<ClusterRoleBinding>(), &sel)
                .await?
                .len();
        Ok(!named && labelled == 0)
    }

    async fn scale_operator(&self, replicas: i32) -> Result<()> {
        k8s::merge(
            &self.ns::<Deployment>(NS_OP),
            OP_DEPLOY,
            &json!({"spec": {"replicas": replicas}}),
        )
        .await?;
        Ok(())
    }

    pub(super) async fn garbage_collection(&mut self, run: &mut Run) -> Result<()> {
        run.step("delete the listener (operator stopped): the garbage collector removes everything it owned");
        let podapi = self.ns::<Pod>(NS_OP);
        self.dp_pid.clear();
        for (pod, _, _, _) in self.pods_state().await? {
            let pid = pods::pid(&self.env, &podapi, NS_OP, &pod, "h3-ingress").await?;
            self.dp_pid.insert(pod, pid);
        }
        // With the operator scaled to 0 nothing but the garbage collector can remove them.
        self.scale_operator(0).await?;
        let sel = format!(
            "{}={}",
            h3_ingress::operator::labels::COMPONENT,
            h3_ingress::operator::labels::COMPONENT_OPERATOR
        );
        wait_ok(
            60,
            "operator scaled to 0 (no operator pod left)",
            || async { Ok(k8s::names(&podapi, &sel).await?.is_empty()) },
        )
        .await?;
        k8s::delete(&self.all::<Http3Listener>(), LISTENER).await?;
        wait_ok(90, "DaemonSet, pods, ServiceAccount, ClusterRole(Binding), Role(Binding), certificate mirrors gone", || self.owned_gone()).await?;
        for (pod, pid) in &self.dp_pid {
            ensure!(
                !std::path::Path::new(&format!("/proc/{pid}")).exists(),
                "{pod}'s process {pid} still runs"
            );
        }
        let what = format!("UDP 443 no longer answers on {}", self.env.ips.join(" "));
        wait_ok(15, &what, || self.refused_all_nodes(HOST, Refusal::Silent)).await?;
        let pids: Vec<String> = self.dp_pid.values().map(u32::to_string).collect();
        ok(format!("processes {} stopped", pids.join(" ")));
        self.scale_operator(1).await?;
        wait_ok(
            60,
            "operator back (a running replica holds the Lease)",
            || self.leader_running(),
        )
        .await
    }

    pub(super) async fn pod_security(&mut self, run: &mut Run) -> Result<()> {
        run.step("Pod Security admission: the operator's namespace labelled 'restricted' -> Ready=False with a reason and a Warning event");
        let nss = self.all::<Namespace>();
        let label = |level: &str| json!({"metadata": {"labels": {"pod-security.kubernetes.io/enforce": level}}});
        k8s::merge(&nss, NS_OP, &label("restricted"))
            .await
            .map_err(|e| Error::Check(format!("cannot label {NS_OP} restricted: {e}")))?;
        let name = format!("{LISTENER}-restricted");
        self.apply_listener(
            &name,
            443,
            DP_ADMIN_PORT,
            json!({"tuneNodeBufferLimits": true}),
        )
        .await?;
        let not_created = || async {
            k8s::condition_is(
                &self.client,
                &name,
                h3_ingress::api::conditions::READY,
                "False",
                reasons::PODS_NOT_CREATED,
            )
            .await
        };
        wait_ok(
            60,
            &format!(
                "h3l/{name} Ready=False reason {}",
                reasons::PODS_NOT_CREATED
            ),
            not_created,
        )
        .await?;
        ok(format!("message: {}", self.ready(&name).await?.2));
        let ds = self
            .ns::<DaemonSet>(NS_OP)
            .get(&data_plane_name(&name))
            .await?;
        let init = ds
            .spec
            .template
            .spec
            .and_then(|s| s.init_containers)
            .unwrap_or_default();
        let image = init
            .first()
            .and_then(|c| c.image.clone())
            .unwrap_or_default();
        expect_eq(
            "init container image (the chart's dataPlane.tuneImage)",
            self.tune_image.as_str(),
            image.as_str(),
        )?;
        ok(format!("tuneNodeBufferLimits: the privileged init container runs the chart's pinned dataPlane.tuneImage {}..", h3i_scenarios::cmd::head(&self.tune_image, 60)));
        let uid = self
            .listener_obj(&name)
            .await?
            .and_then(|l| l.uid())
            .unwrap_or_default();
        let warning = || async {
            let ev = k8s::events(
                &self.client,
                "Http3Listener",
                &uid,
                Some("Warning"),
                Some(reasons::PODS_NOT_CREATED),
            )
            .await?;
            Ok(!ev.is_empty())
        };
        wait_ok(
            30,
            &format!(
                "a Warning event {} on the listener",
                reasons::PODS_NOT_CREATED
            ),
            warning,
        )
        .await?;
        let ev = k8s::events(
            &self.client,
            "Http3Listener",
            &uid,
            Some("Warning"),
            Some(reasons::PODS_NOT_CREATED),
        )
        .await?;
        indent(h3i_scenarios::cmd::head(
            &ev.first().map(k8s::event_line).unwrap_or_default(),
            200,
        ));
        k8s::delete(&self.all::<Http3Listener>(), &name).await?;
        k8s::merge(&nss, NS_OP, &label("privileged")).await?;
        Ok(())
    }
}
