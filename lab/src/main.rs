//! `h3-ingress-lab`: the network lab's command line (see docs/lab.md). Needs root.

use std::process::ExitCode;

use clap::Parser;

/// Network lab for h3-ingress: a user-space path emulator between two network namespaces,
/// the benchmark against HTTP/2 and peer servers, and the CI smoke test. Needs root.
#[derive(Parser)]
#[command(name = "h3-ingress-lab", version)]
struct Cli {
    #[command(subcommand)]
    command: h3_ingress_lab::LabCommand,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match h3_ingress_lab::run(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
