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

/// mimalloc's id of its `purge_delay` option (`mimalloc.h`, v3; libmimalloc-sys has no name for it).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// How long freed memory stays mapped before mimalloc returns it to the kernel, in ms, unless
/// `MIMALLOC_PURGE_DELAY` says otherwise. mimalloc's default (1 s) gave pages back between a
/// Spark job's pushes, and every push body that landed on them paid a page fault that zeroes a
/// 2 MiB huge page: 12% of a server's CPU in a Spark run (perf), and `sluice local` took 2–3x the
/// minor faults (4 200–5 800 vs 2 000–2 100 with 10 s). What stays mapped is at most the peak of buffered
/// data, which the memory budget bounds.
const PURGE_DELAY_MS: std::ffi::c_long = 10_000;

fn keep_freed_memory_mapped() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: sets a plain integer option; mimalloc reads it when it next purges.
        unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS) }
    }
}

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
    keep_freed_memory_mapped();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn purge_delay_option_id_is_mimallocs() {
        // The id must name purge_delay: setting it shows through mimalloc's own getter, and its
        // default (before any set in this test process) is mimalloc v3's 1000 ms.
        let get = || unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) };
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
            assert_eq!(get(), 1000, "option 15 is not purge_delay (default 1000 ms)");
        }
        keep_freed_memory_mapped();
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
            assert_eq!(get(), PURGE_DELAY_MS);
        }
    }
}
