//! `sluice`: the command-line entry point. A thin clap dispatcher; each subcommand's logic lives
//! in its own module.

mod bench;
mod cluster;
mod local;
mod serve;
mod settings;
mod workload;

use clap::{Parser, Subcommand};

/// mimalloc keeps freed pages for reuse: push bodies and batches are ~256 KiB each, and glibc
/// returns blocks that size to the kernel, so every push paid page faults on fresh memory.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(name = "sluice", version, about = "Sluice remote shuffle service")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a shuffle server.
    Server(serve::ServerArgs),
    /// Run a coordinator.
    Coordinator(serve::CoordinatorArgs),
    /// The main job: an embedded coordinator and servers on loopback run a verified shuffle.
    Local(local::LocalArgs),
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
    let rt = || tokio::runtime::Builder::new_multi_thread().enable_all().build();
    match Cli::parse().command {
        Command::Server(args) => rt()?.block_on(serve::server(args)),
        Command::Coordinator(args) => rt()?.block_on(serve::coordinator(args)),
        Command::Local(args) => {
            if rt()?.block_on(local::run(args))? {
                Ok(())
            } else {
                std::process::exit(1)
            }
        }
        Command::Bench { bench } => bench::run(bench),
    }
}
