//! `h3i-scenarios SCENARIO`: brings the test cluster up (`scripts/cluster.sh up`, a health
//! check when it is up already), runs the scenario's steps against it and prints the step
//! table and `TITLE PASSED in Ns` (exit 0) or `TITLE FAILED at Ns: why` and a failure report
//! (exit 1). Without root it prints `TITLE SKIPPED (needs root)` and exits 0, or 1 under
//! `H3I_TESTS_REQUIRE_ROOT=1`.

mod frontdoor;
mod journey;

use std::process::ExitCode;

use h3i_scenarios::{drive, indent, is_root, ok, Env, Run, Scenario};

const USAGE: &str = "usage: h3i-scenarios SCENARIO\n\n  journey     the user's journey (tests/cluster/README.md)\n  frontdoor   HTTP/3 keeps the TCP ingress's per-host rules (real nodes, Traefik)\n";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("journey") => start::<journey::Journey>(),
        Some("frontdoor") => start::<frontdoor::Frontdoor>(),
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
    run.step("cluster up (scripts/cluster.sh up; warm: binaries cached)");
    match h3i_scenarios::env::cluster_up() {
        Ok(out) => indent(out),
        Err(e) => return failed_early(&run, &e),
    }
    let env = match Env::load_sync() {
        Ok(env) => env,
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

/// `name=Ready name=NotReady ...` of the cluster's nodes (kubernetes' own node condition).
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
            .any(|c| c.type_ == "Ready" && c.status == "True"); // kubernetes' own node condition
        if ready {
            "Ready" // kubernetes' own node condition
        } else {
            "NotReady"
        } // kubernetes' own node condition
    };
    let names = list
        .items
        .iter()
        .map(|n| format!("{}={}", kube::ResourceExt::name_any(n), state(n)));
    names.collect::<Vec<_>>().join(" ")
}

fn failed_early(run: &Run, why: &dyn std::fmt::Display) -> ExitCode {
    run.failed(why);
    ExitCode::FAILURE
}

/// How `main` makes a scenario from the cluster's environment and an admin client.
pub trait FromEnv {
    fn from_env(env: Env, client: kube::Client) -> Self;
}
