//! The `h3-ingress` binary: parses the command line and hands each subcommand to the library.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};

use h3_ingress::config::ConfigError;
use h3_ingress::proxy::run::{ProxyArgs, RunError};
use h3_ingress::{fds, lifecycle, logging};

#[derive(Parser)]
#[command(
    name = "h3-ingress",
    version = h3_ingress::version::LONG,
    about = "HTTP/3 for a cluster whose TCP ingress has none"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the HTTP/3 data plane in front of the TCP ingress.
    Proxy(ProxyArgs),
    /// Fetch a URL over HTTP/3 (and HTTP/2) and prove both serve the same thing.
    Check(h3_ingress::check::CheckArgs),
    /// Everything on localhost: a stand-in TCP ingress, the HTTP/3 proxy, and a check.
    Demo {
        /// Exit after the check instead of serving until Ctrl-C.
        #[arg(long)]
        once: bool,
    },
    /// Print the Http3Listener CustomResourceDefinition as YAML.
    Crd,
    /// Run the Kubernetes operator (Http3Listener controller).
    Operator(h3_ingress::operator::cli::OperatorArgs),
    /// The chart's pre-delete hook: stop the operator and remove every data plane it made.
    Uninstall(h3_ingress::operator::uninstall::UninstallArgs),
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
    /// Ask the data plane of this pod (Kubernetes probes): live, ready or startup.
    Probe {
        check: h3_ingress::probe::Check,
        /// The data plane's probe socket.
        #[arg(long, default_value = h3_ingress::probe::DEFAULT_SOCKET)]
        socket: PathBuf,
    },
    /// Validate a standalone configuration file and print the result.
    Validate {
        /// YAML configuration file.
        #[arg(long)]
        config: PathBuf,
    },
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
    if matches!(cli.command, Command::Operator(_)) {
        h3_ingress::memory::tune_for_caches();
    }
    let result = tokio::runtime::Runtime::new()
        .context("starting the runtime")
        .and_then(|rt| rt.block_on(run(cli)));
    result.unwrap_or_else(|e| {
        eprintln!("error: {e:#}");
        ExitCode::FAILURE
    })
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Crd => {
            print!("{}", h3_ingress::api::crd_yaml());
            Ok(ExitCode::SUCCESS)
        }
        Command::Operator(a) => {
            logging::init(logging::SERVER);
            fds::raise_and_log();
            h3_ingress::operator::run::run(a.options()).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Uninstall(a) => {
            logging::init(logging::SERVER);
            h3_ingress::operator::uninstall::run(&a).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Render {
            out,
            namespace,
            data_plane_image,
        } => {
            let params = h3_ingress::operator::resources::Params {
                hosts_namespace: format!("{namespace}-hosts"),
                namespace,
                default_image: data_plane_image,
            };
            Ok(render(&out, &params))
        }
        Command::Validate { config } => Ok(match h3_ingress::config::file::load(&config) {
            Ok(c) => {
                let (l, up) = (&c.listen, &c.upstream.address);
                let hosts = c.hosts.len();
                println!(
                    "ok: port {}, ipv4 {:?}, ipv6 {:?}, {hosts} host(s), upstream {up}",
                    l.port, l.ipv4, l.ipv6
                );
                ExitCode::SUCCESS
            }
            Err(e) => invalid_config(&e),
        }),
        Command::Proxy(args) => {
            logging::init(logging::PROXY);
            fds::raise_and_log();
            let shutdown = lifecycle::shutdown_token().context("installing the signal handlers")?;
            match h3_ingress::proxy::run::run(args, shutdown).await {
                Ok(()) => Ok(ExitCode::SUCCESS),
                Err(RunError::Config(e)) => Ok(invalid_config(&e)),
                Err(e) => Err(e.into()),
            }
        }
        Command::Probe { check, socket } => {
            match h3_ingress::probe::ask(&socket, check).await {
                Ok(line) => println!("{line}"),
                Err(e) => {
                    eprintln!("{e}");
                    return Ok(ExitCode::FAILURE);
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Check(args) => {
            logging::init(logging::QUIET);
            Ok(exit_code(h3_ingress::check::run_cli(&args).await?))
        }
        Command::Demo { once } => {
            logging::init(logging::SERVER);
            fds::raise_and_log();
            Ok(exit_code(h3_ingress::demo::run(once).await?))
        }
    }
}

/// 0 when the command did what it was asked, 1 when not.
fn exit_code(success: bool) -> ExitCode {
    ExitCode::from(u8::from(!success))
}

/// Every problem of an invalid configuration file, one line each; exit code 2.
fn invalid_config(e: &ConfigError) -> ExitCode {
    for fe in &e.errors {
        eprintln!("error: {fe}");
    }
    ExitCode::from(2)
}

fn render(out: &Path, params: &h3_ingress::operator::resources::Params) -> ExitCode {
    match h3_ingress::operator::render::write_all(out, params) {
        Ok(files) => files.iter().for_each(|f| println!("{}", f.display())),
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}
