use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use h3_ingress::proxy::ConfigUpdate;

#[derive(Parser)]
#[command(
    name = "h3-ingress",
    version,
    about = "HTTP/3 for a cluster whose TCP ingress has none"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the HTTP/3 data plane in front of the TCP ingress.
    Proxy {
        /// Standalone mode: YAML configuration file (SIGHUP reloads hosts and certificates).
        #[arg(
            long,
            required_unless_present = "listener",
            conflicts_with = "listener"
        )]
        config: Option<PathBuf>,
        /// Kubernetes mode: serve this Http3Listener, its annotated Ingresses and their
        /// Secrets, following changes live.
        #[arg(long)]
        listener: Option<String>,
    },
    /// Fetch a URL over HTTP/3 (and HTTP/2) and prove both serve the same thing.
    Check {
        /// https:// URL to fetch.
        url: String,
        /// HOST:PORT:ADDR, like curl's --resolve.
        #[arg(long)]
        resolve: Option<String>,
        /// PEM file of CA certificates to trust instead of the system store.
        #[arg(long, conflicts_with = "insecure")]
        cacert: Option<PathBuf>,
        /// Do not verify the server certificate.
        #[arg(long, short = 'k')]
        insecure: bool,
        /// Also fetch over HTTP/2 and compare status and body hash.
        #[arg(long)]
        compare_h2: bool,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        /// Seconds before giving up on each protocol.
        #[arg(long, default_value_t = 15)]
        timeout: u64,
    },
    /// Everything on localhost: a stand-in TCP ingress, the HTTP/3 proxy, and a check.
    Demo {
        /// Exit after the check instead of serving until Ctrl-C.
        #[arg(long)]
        once: bool,
    },
    /// Print the Http3Listener CustomResourceDefinition as YAML.
    Crd,
    /// Run the Kubernetes operator (Http3Listener controller).
    Operator(OperatorArgs),
    /// Write every object the operator creates for two example listeners as YAML.
    Render {
        #[arg(long, default_value = "target/rendered/operator")]
        out: PathBuf,
        /// Namespace the data-plane objects go to.
        #[arg(long, default_value = "h3-ingress")]
        namespace: String,
        #[arg(long, env = "H3_INGRESS_IMAGE", default_value = h3_ingress::operator::DEFAULT_IMAGE)]
        data_plane_image: String,
    },
    /// Validate a standalone configuration file and print the result.
    Validate {
        /// YAML configuration file.
        #[arg(long)]
        config: PathBuf,
    },
}

fn init_logging(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

const SERVER_LOG: &str = "info,quinn=warn,quinn_proto=warn,h3=warn,rustls=warn,hyper=warn";

#[derive(clap::Args)]
struct OperatorArgs {
    /// Namespace of the data-plane DaemonSets, ServiceAccounts and the leader Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "h3-ingress")]
    namespace: String,
    /// Elect a leader through a Lease so several replicas are safe (the default).
    #[arg(long, overrides_with = "no_leader_election")]
    leader_election: bool,
    /// Act as leader unconditionally (one replica only).
    #[arg(long)]
    no_leader_election: bool,
    #[arg(long, default_value = "h3-ingress-operator")]
    lease_name: String,
    /// Data plane image for listeners without spec.image.
    #[arg(long, env = "H3_INGRESS_IMAGE", default_value = h3_ingress::operator::DEFAULT_IMAGE)]
    data_plane_image: String,
    /// Serves /healthz, /readyz and /metrics.
    #[arg(long, default_value = "0.0.0.0:9477")]
    admin_address: std::net::SocketAddr,
}

async fn run_operator(a: OperatorArgs) -> anyhow::Result<ExitCode> {
    init_logging("info,kube=warn,hyper=warn");
    let opts = h3_ingress::operator::controller::Options {
        namespace: a.namespace,
        leader_election: !a.no_leader_election,
        lease_name: a.lease_name,
        data_plane_image: a.data_plane_image,
        admin_address: a.admin_address,
    };
    h3_ingress::operator::controller::run(opts).await?;
    Ok(ExitCode::SUCCESS)
}

fn main() -> ExitCode {
    // Installed as `kubectl-h3_ingress`, the same binary is the kubectl plugin.
    if std::env::args_os()
        .next()
        .is_some_and(|argv0| h3_ingress::plugin::invoked_as_plugin(&argv0))
    {
        return h3_ingress::plugin::main();
    }
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Crd => {
            print!("{}", h3_ingress::api::crd_yaml());
            Ok(ExitCode::SUCCESS)
        }
        Command::Operator(a) => run_operator(a).await,
        Command::Render {
            out,
            namespace,
            data_plane_image,
        } => {
            let params = h3_ingress::operator::resources::Params {
                namespace,
                default_image: data_plane_image,
            };
            match h3_ingress::operator::render::write_all(&out, &params) {
                Ok(files) => {
                    for f in files {
                        println!("{}", f.display());
                    }
                    Ok(ExitCode::SUCCESS)
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    Ok(ExitCode::FAILURE)
                }
            }
        }
        Command::Validate { config } => match h3_ingress::config::file::load(&config) {
            Ok(c) => {
                println!(
                    "ok: port {}, ipv4 {:?}, ipv6 {:?}, {} host(s), upstream {}",
                    c.listen.port,
                    c.listen.ipv4,
                    c.listen.ipv6,
                    c.hosts.len(),
                    c.upstream.address
                );
                Ok(ExitCode::SUCCESS)
            }
            Err(e) => {
                for fe in &e.errors {
                    eprintln!("error: {fe}");
                }
                Ok(ExitCode::from(2))
            }
        },
        Command::Proxy { config, listener } => {
            init_logging(SERVER_LOG);
            match (config, listener) {
                (Some(path), _) => run_file_proxy(path).await,
                (None, Some(name)) => run_kube_proxy(name).await,
                (None, None) => unreachable!("clap requires --config or --listener"),
            }
        }
        Command::Check {
            url,
            resolve,
            cacert,
            insecure,
            compare_h2,
            json,
            timeout,
        } => {
            init_logging("warn");
            let opts = h3_ingress::check::CheckOptions {
                url,
                resolve,
                cacert,
                insecure,
                compare_h2,
                timeout: Duration::from_secs(timeout),
            };
            let report = h3_ingress::check::run(&opts).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{}", report.render());
            }
            Ok(if report.success() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::Demo { once } => {
            init_logging(SERVER_LOG);
            run_demo(once).await
        }
    }
}

async fn run_file_proxy(path: PathBuf) -> anyhow::Result<ExitCode> {
    let initial = match h3_ingress::config::file::load(&path) {
        Ok(c) => c,
        Err(e) => {
            for fe in &e.errors {
                eprintln!("error: {fe}");
            }
            return Ok(ExitCode::from(2));
        }
    };
    let shutdown = CancellationToken::new();
    let (tx, rx) = mpsc::channel(4);
    let mut hup = signal(SignalKind::hangup()).context("installing the SIGHUP handler")?;
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let sd = shutdown.clone();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = hup.recv() => {
                    tracing::info!(file = %path.display(), "SIGHUP: reloading configuration");
                    let update = match h3_ingress::config::file::load(&path) {
                        Ok(c) => ConfigUpdate::Apply(Box::new(c)),
                        Err(e) => ConfigUpdate::Invalid(e.to_string()),
                    };
                    if tx.send(update).await.is_err() {
                        return;
                    }
                }
                _ = term.recv() => { tracing::info!("SIGTERM"); sd.cancel(); return; }
                _ = int.recv() => { tracing::info!("SIGINT"); sd.cancel(); return; }
            }
        }
    });
    h3_ingress::proxy::serve(initial, rx, shutdown, None).await?;
    Ok(ExitCode::SUCCESS)
}

/// SIGTERM/SIGINT cancel `shutdown`.
fn cancel_on_signals(shutdown: CancellationToken) -> anyhow::Result<()> {
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM"),
            _ = int.recv() => tracing::info!("SIGINT"),
        }
        shutdown.cancel();
    });
    Ok(())
}

async fn run_kube_proxy(name: String) -> anyhow::Result<ExitCode> {
    let client = kube::Client::try_default()
        .await
        .context("connecting to the Kubernetes API (in-cluster config or KUBECONFIG)")?;
    let shutdown = CancellationToken::new();
    cancel_on_signals(shutdown.clone())?;
    let (config_tx, mut configs) = mpsc::channel(4);
    let watcher_name = name.clone();
    let watch_shutdown = shutdown.clone();
    tokio::spawn(async move {
        if let Err(e) =
            h3_ingress::operator::dataplane::watch_listener(client, watcher_name, config_tx).await
        {
            tracing::error!("watching the listener failed: {e}");
            watch_shutdown.cancel();
        }
    });
    tracing::info!(listener = %name, "waiting for the Http3Listener, its Ingresses and Secrets");
    let initial = tokio::select! {
        c = configs.recv() => match c {
            Some(c) => c,
            None => anyhow::bail!("the listener watch ended before a configuration arrived"),
        },
        _ = shutdown.cancelled() => return Ok(ExitCode::SUCCESS),
    };
    // Later configurations are applied live; socket changes are refused by the proxy and
    // rolled out by the operator (the pod template carries their hash).
    let (tx, rx) = mpsc::channel(4);
    tokio::spawn(async move {
        while let Some(c) = configs.recv().await {
            if tx.send(ConfigUpdate::Apply(Box::new(c))).await.is_err() {
                return;
            }
        }
    });
    h3_ingress::proxy::serve(initial, rx, shutdown, None).await?;
    Ok(ExitCode::SUCCESS)
}

async fn run_demo(once: bool) -> anyhow::Result<ExitCode> {
    let shutdown = CancellationToken::new();
    let (running, port, ca) = h3_ingress::demo::start(shutdown.clone()).await?;
    println!(
        "h3-ingress demo: stand-in TCP ingress on https://localhost:{port} (TCP), HTTP/3 proxy on UDP {:?}",
        running.udp_addrs
    );
    let report = h3_ingress::demo::check(port, &ca).await?;
    print!("{}", report.render());
    let ok = report.success() && report.h2.as_ref().is_some_and(|h| h.ok);
    println!(
        "result: {}",
        if ok {
            "HTTP/3 works and serves exactly what the TCP ingress serves"
        } else {
            "FAILED"
        }
    );
    if once || !ok {
        shutdown.cancel();
        tokio::time::sleep(Duration::from_millis(200)).await;
        let _ = std::fs::remove_file(&ca);
        return Ok(if ok {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        });
    }
    print!(
        "{}",
        h3_ingress::demo::instructions(port, running.admin_addr, &ca)
    );
    let mut term = signal(SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    shutdown.cancel();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let _ = std::fs::remove_file(&ca);
    Ok(ExitCode::SUCCESS)
}
