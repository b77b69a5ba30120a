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

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Crd => {
            print!("{}", h3_ingress::api::crd_yaml());
            ExitCode::SUCCESS
        }
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
