//! `sluice bench …`: end-to-end figures, each measured beside its baseline in the same run.

pub mod transport;

use clap::Subcommand;

/// The benchmarks.
#[derive(Subcommand)]
pub enum BenchCommand {
    /// Transport: sendfile vs copy for file bodies, batched vs one-write-per-frame small frames.
    Transport(transport::Args),
    /// The server process of `bench transport` (started by it; not for direct use).
    #[command(hide = true)]
    TransportServer(transport::ServerArgs),
}

/// Runs a benchmark subcommand.
pub fn run(cmd: BenchCommand) -> anyhow::Result<()> {
    match cmd {
        BenchCommand::Transport(args) => transport::run(args),
        BenchCommand::TransportServer(args) => transport::run_server(args),
    }
}
