//! `sluice`: the command-line entry point. A thin clap dispatcher; each subcommand's logic lives
//! in its own module.

mod bench;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "sluice", version, about = "Sluice remote shuffle service")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Benchmarks.
    Bench {
        #[command(subcommand)]
        bench: bench::BenchCommand,
    },
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Bench { bench } => bench::run(bench),
    }
}
