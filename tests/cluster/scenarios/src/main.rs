//! `h3i-scenarios SCENARIO`: brings the test cluster up (`scripts/cluster.sh up`, a health
//! check when it is up already), runs the scenario's steps against it and prints the step
//! table and `TITLE PASSED in Ns` (exit 0) or `TITLE FAILED at Ns: why` and a failure report
//! (exit 1). Without root it prints `TITLE SKIPPED (needs root)` and exits 0, or 1 under
//! `H3I_TESTS_REQUIRE_ROOT=1`.

mod advertise;
mod altsvc;
mod arch;
mod coexist;
mod dns;
mod frontdoor;
mod gateway;
mod journey;
mod monitoring;
mod nodes;
mod rollout;
mod scale;
mod skew;
mod smoke;
mod traefik;
mod upgrade;

use std::process::ExitCode;

use h3i_scenarios::{drive, indent, is_root, ok, Env, Run, Scenario};

const USAGE: &str =
    "usage: h3i-scenarios SCENARIO\n\n  advertise DNS HTTPS records published and withdrawn as the host is served or not (real\n            nodes, Knot DNS), timed\n  alt-svc   Alt-Svc kept by the operator on Traefik (real nodes): sent while served, clear\n            when not, the user's own Middleware list untouched, timed\n  arch      the image index's platforms on real nodes, pods kept to nodes of its\n            architectures\n  coexist   two installations side by side, a forceBuffers roll, one uninstalled\n  dns-check the cluster DNS (CoreDNS) from the pod network and from hostNetwork pods\n  journey   the user's journey (tests/cluster/README.md)\n  monitoring  the chart's monitors, rules and dashboard under a real Prometheus Operator\n  smoke     the test cluster itself, end to end\n  traefik-check  Traefik as the TCP ingress: routing, ipAllowList, forwarded headers, PROXY protocol\n  frontdoor HTTP/3 keeps the TCP ingress's per-host rules (real nodes, nginx and Traefik)\n  gateway   Gateway API: HTTPRoutes, Gateways, ReferenceGrant\n  node-checks  what only a real node answers (image, capabilities, NodePort, Chromium, grace, probes, OOM)\n  skew      CRD version skew both ways, certificate renewal\n  rollout   a DaemonSet roll under three clients per node\n  upgrade   helm upgrade from the previous release, helm rollback back, under clients\n            (`upgrade build`: only build the previous release's binary)\n  scale HOSTS [options]   the scale harness against a 4-host baseline (`scale` alone: options)\n";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("advertise") => start::<advertise::Advertise>(),
        Some("alt-svc") => start::<altsvc::AltSvc>(),
        Some("arch") => start::<arch::Arch>(),
        Some("coexist") => start::<coexist::Coexist>(),
        Some("dns-check") => start::<dns::Dns>(),
        Some("journey") => start::<journey::Journey>(),
        Some("monitoring") => start::<monitoring::Monitoring>(),
        Some("smoke") => start::<smoke::Smoke>(),
        Some("gateway") => start::<gateway::Gateway>(),
        Some("node-checks") => start::<nodes::Nodes>(),
        Some("skew") => start::<skew::Skew>(),
        Some("rollout") => start::<rollout::Rollout>(),
        Some("upgrade") if args.get(1).is_some_and(|a| a == "build") => match upgrade::build_only()
        {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("UPGRADE BUILD FAILED: {e}");
                ExitCode::FAILURE
            }
        },
        Some("upgrade") => start::<upgrade::Upgrade>(),
        Some("scale") => match scale::Opts::parse(&args[1..]) {
            Ok(_) => start::<scale::Scale>(),
            Err(e) => {
                eprint!("{e}\n\n{}", scale::opts::USAGE);
                ExitCode::from(2)
            }
        },
        Some("frontdoor") => start::<frontdoor::Frontdoor>(),
        Some("traefik-check") => start::<traefik::TraefikCheck>(),
        _ => {
            eprint!("{USAGE}");
            ExitCode::from(2)
        }
    }
}

/// The steps every scenario shares (root, cluster up), then the scenario itself.
fn start<S: Scenario + FromEnv>() -> ExitCode {
    if !is_root() {
        println!(
            "{} SKIPPED (needs root): network namespaces and the cluster's processes",
            S::TITLE
        );
        let required = std::env::var("H3I_TESTS_REQUIRE_ROOT").is_ok_and(|v| v == "1");
        return if required {
            ExitCode::FAILURE
        } else {
            ExitCode::SUCCESS
        };
    }
    let mut run = Run::new(S::TITLE);
    if let Err(e) = S::before(&mut run) {
        return failed_early(&run, &e);
    }
    run.step("cluster up (scripts/cluster.sh up; warm: binaries cached)");
    let was_up = h3i_scenarios::env::cluster_healthy();
    match h3i_scenarios::env::cluster_up() {
        Ok(out) => indent(out),
        Err(e) => return failed_early(&run, &e),
    }
    let env = match Env::load_sync() {
        Ok(env) => Env { was_up, ..env },
        Err(e) => return failed_early(&run, &e),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build();
    let rt = match rt {
        Ok(rt) => rt,
        Err(e) => return failed_early(&run, &e),
    };
    rt.block_on(async {
        let client = match env.client().await {
            Ok(c) => c,
            Err(e) => return failed_early(&run, &e),
        };
        ok(format!(
            "up in {}s; nodes: {}",
            run.secs(),
            nodes(&client).await
        ));
        let scenario = S::from_env(env, client.clone());
        if drive(scenario, &mut run, &client).await {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        }
    })
}

/// Each node of the cluster by name, with whether it is ready.
async fn nodes(client: &kube::Client) -> String {
    let api: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client.clone());
    let Ok(list) = api.list(&Default::default()).await else {
        return "?".into();
    };
    let state = |n: &k8s_openapi::api::core::v1::Node| {
        let conds = n
            .status
            .as_ref()
            .and_then(|s| s.conditions.clone())
            .unwrap_or_default();
        let ready = conds
            .iter()
            .any(|c| c.type_ == h3i_scenarios::k8s::KUBE_READY && c.status == "True");
        if ready {
            ""
        } else {
            "Not"
        }
    };
    let names = list.items.iter().map(|n| {
        format!(
            "{}={}{}",
            kube::ResourceExt::name_any(n),
            state(n),
            h3i_scenarios::k8s::KUBE_READY
        )
    });
    names.collect::<Vec<_>>().join(" ")
}

fn failed_early(run: &Run, why: &dyn std::fmt::Display) -> ExitCode {
    run.failed(why);
    ExitCode::FAILURE
}

/// How `main` makes a scenario from the cluster's environment and an admin client.
pub trait FromEnv {
    fn from_env(env: Env, client: kube::Client) -> Self;

    /// Steps before the cluster comes up (blocking: no runtime yet), e.g. what the cluster's
    /// node agent must be started with.
    fn before(_run: &mut Run) -> h3i_scenarios::Result<()> {
        Ok(())
    }
}
