//! `sluice bench …`: end-to-end figures, each measured beside its baseline in the same run.

pub mod connections;
pub mod metadata;
pub mod push_baseline;
pub mod shuffle;
pub mod transport;

use clap::Subcommand;

/// The benchmarks.
#[derive(Subcommand)]
pub enum BenchCommand {
    /// Transport: sendfile vs copy for file bodies, batched vs one-write-per-frame small frames.
    Transport(transport::Args),
    /// Ingest into one server (data on tmpfs): GB/s and server CPU per GB.
    Push(shuffle::ShuffleBenchArgs),
    /// Fetch committed data: sendfile server beside a copy-path server.
    Fetch(shuffle::ShuffleBenchArgs),
    /// Many clients at once (10, 100, 1,000 connections): throughput and server RSS per count.
    Connections(connections::ConnArgs),
    /// A wide shuffle's metadata (2,000 maps x 10,000 partitions): server, coordinator and
    /// client memory, and the commit's time.
    Metadata(metadata::MetadataArgs),
    /// Read a committed shuffle of a running cluster with the Rust client (bench/jvm's baseline).
    #[command(hide = true)]
    Read(shuffle::ReadArgs),
    /// The kernel baseline's sink of `bench push` (started by it; not for direct use).
    #[command(hide = true)]
    PushSink(push_baseline::SinkArgs),
    /// The server process of `bench transport` (started by it; not for direct use).
    #[command(hide = true)]
    TransportServer(transport::ServerArgs),
}

/// Runs a benchmark subcommand.
pub fn run(cmd: BenchCommand) -> anyhow::Result<()> {
    match cmd {
        BenchCommand::Transport(args) => transport::run(args),
        BenchCommand::TransportServer(args) => transport::run_server(args),
        BenchCommand::Push(args) => runtime()?.block_on(shuffle::push(args)),
        BenchCommand::Fetch(args) => runtime()?.block_on(shuffle::fetch(args)),
        BenchCommand::Connections(args) => runtime()?.block_on(connections::run(args)),
        BenchCommand::Metadata(args) => {
            metadata::before_runtime();
            runtime()?.block_on(metadata::run(args))
        }
        BenchCommand::PushSink(args) => push_baseline::run_sink(args),
        BenchCommand::Read(args) => runtime()?.block_on(shuffle::read(args)),
    }
}

fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build()
}
