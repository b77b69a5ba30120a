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
    /// Validate a standalone configuration file and print the result.
    Validate {
        /// YAML configuration file.
        #[arg(long)]
        config: PathBuf,
    },
    /// Network lab: path emulator between two namespaces, benchmark, CI smoke (needs root).
    #[cfg(feature = "lab")]
    Lab(Box<h3_ingress::lab::LabArgs>),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        #[cfg(feature = "lab")]
        Command::Lab(args) => match h3_ingress::lab::run(*args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {:#}", anyhow::Error::from(e));
                ExitCode::FAILURE
            }
        },
        Command::Crd => {
            print!("{}", h3_ingress::api::crd_yaml());
            ExitCode::SUCCESS
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
