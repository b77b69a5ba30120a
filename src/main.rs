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
        #[arg(long)]
        config: PathBuf,
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
        Command::Proxy { config } => {
            init_logging(SERVER_LOG);
            run_file_proxy(config).await
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
