use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

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

fn run_operator(a: OperatorArgs) -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let opts = h3_ingress::operator::controller::Options {
        namespace: a.namespace,
        leader_election: !a.no_leader_election,
        lease_name: a.lease_name,
        data_plane_image: a.data_plane_image,
        admin_address: a.admin_address,
    };
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(h3_ingress::operator::controller::run(opts)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Crd => {
            print!("{}", h3_ingress::api::crd_yaml());
            ExitCode::SUCCESS
        }
        Command::Operator(a) => run_operator(a),
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
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::FAILURE
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
                ExitCode::SUCCESS
            }
            Err(e) => {
                for fe in &e.errors {
                    eprintln!("error: {fe}");
                }
                ExitCode::from(2)
            }
        },
    }
}
