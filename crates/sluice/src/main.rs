//! `sluice`: the command-line entry point. A thin clap dispatcher; each subcommand's logic lives
//! in its own module.

mod admin;
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

/// mimalloc's ids of the options set below (`mimalloc.h`, v3; libmimalloc-sys names neither).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
const MI_OPTION_ALLOW_THP: libmimalloc_sys::mi_option_t = 43;

/// How long freed memory stays mapped before mimalloc returns it to the kernel, in ms, unless
/// `MIMALLOC_PURGE_DELAY` says otherwise. mimalloc's default (1 s) gave pages back between a
/// Spark job's pushes, and every push body that landed on them paid page faults that zero fresh
/// memory: 12% of a server's CPU in a Spark run (perf), and `sluice local` took 2–3x the minor
/// faults (4 200–5 800 vs 2 000–2 100 with 10 s). Push bodies reuse pooled buffers (bounded by
/// the memory budget), so what else stays mapped is small; without the pool the allocator kept
/// freed bodies mapped while new ones took fresh memory.
const PURGE_DELAY_MS: std::ffi::c_long = 10_000;

/// Sets up the allocator before the command runs; `MIMALLOC_*` variables override each choice.
///
/// A server (`server`) turns transparent huge pages off for its process (unless
/// `MIMALLOC_ALLOW_THP` is set): mimalloc asks for them on its arenas, and then a 2 MiB page is resident as a whole while any
/// block in it lives, so push bodies freed out of order by the flushers leave partly used huge
/// pages behind. With flushers slowed down (`flusher_nice=10`, pushes answered `Busy` thousands of
/// times) a server's peak RSS reached 333–372 MiB with a 256 MiB budget in `sluice local`; with
/// 4 KiB pages it was 245–254 MiB, and at the default settings the push rate did not change
/// (docs/benchmarks-log.md#server-memory). Other commands keep huge pages: there, 4 KiB pages
/// only cost faults (`sluice local`'s own process: 228 k minor faults per run instead of 1.6 k).
fn configure_allocator(server: bool) {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: sets a plain integer option; mimalloc reads it when it next purges.
        unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS) }
    }
    if server && std::env::var_os("MIMALLOC_ALLOW_THP").is_none() {
        // SAFETY: as above; mimalloc reads it before it next maps memory. Arenas mapped before
        // main (and asked for huge pages then) are covered by the prctl, which applies to every
        // mapping of the process, present and future.
        unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_ALLOW_THP, 0) }
        if let Err(e) = rustix::thread::disable_transparent_huge_pages(true) {
            eprintln!("sluice: could not turn transparent huge pages off: {e}");
        }
    }
}

#[derive(Parser)]
#[command(name = "sluice", version, about = "Sluice remote shuffle service")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// `sluice credential`: the key comes from the environment, never from the command line (which
/// other users of the machine can read in /proc).
#[derive(clap::Args)]
struct CredentialArgs {
    /// The application id the credential is for.
    #[arg(long)]
    app_id: String,
}

/// Reads the cluster key from `SLUICE_CLUSTER_KEY` and prints the credential of `--app-id`.
fn credential(args: CredentialArgs) -> anyhow::Result<()> {
    let key = std::env::var("SLUICE_CLUSTER_KEY").map_err(|_| {
        anyhow::anyhow!("set SLUICE_CLUSTER_KEY to the cluster key (transport.secret)")
    })?;
    anyhow::ensure!(
        key.chars().count() >= sluice_transport::CLUSTER_KEY_MIN_CHARS,
        "SLUICE_CLUSTER_KEY is shorter than {} characters",
        sluice_transport::CLUSTER_KEY_MIN_CHARS
    );
    anyhow::ensure!(!args.app_id.is_empty(), "--app-id is empty (the cluster's own identity)");
    println!("{}", sluice_transport::app_credential(&key, &args.app_id));
    Ok(())
}

/// `sluice dev-certs`.
#[derive(clap::Args)]
struct DevCertsArgs {
    /// Directory to write the PEM files to (created if missing).
    #[arg(long)]
    dir: std::path::PathBuf,
    /// Names (IP addresses or DNS names) the server certificate is for.
    #[arg(long, value_delimiter = ',', default_value = "127.0.0.1,localhost")]
    names: Vec<String>,
}

fn dev_certs(args: DevCertsArgs) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.dir)?;
    let pki = sluice_testkit::TestPki::new(&args.dir, "sluice")?;
    let names: Vec<&str> = args.names.iter().map(String::as_str).collect();
    let (cert, key) = pki.issue("sluice", &names, false)?;
    let (client, client_key) = pki.issue("client", &["sluice-client"], false)?;
    for f in [pki.ca_file(), cert, key, client, client_key] {
        println!("{}", f.display());
    }
    Ok(())
}

#[derive(Subcommand)]
enum Command {
    /// Run a shuffle server.
    Server(serve::ServerArgs),
    /// Run a coordinator.
    Coordinator(serve::CoordinatorArgs),
    /// The main job: an embedded coordinator and servers on loopback run a verified shuffle.
    Local(local::LocalArgs),
    /// Operate a running cluster through a coordinator's admin API (servers, apps, shuffles,
    /// drain, undrain, unregister, a server's status).
    Admin(admin::AdminArgs),
    /// Print an application's credential (HMAC of the cluster key and the app id), for the
    /// launcher that starts the application (docs/security.md).
    Credential(CredentialArgs),
    /// Write a throw-away CA and a certificate it signs (PEM) for loopback demos and tests:
    /// DIR/sluice-ca.pem, DIR/sluice.pem, DIR/sluice-key.pem, DIR/client.pem, DIR/client-key.pem.
    /// Never for production: the CA's key is not kept.
    DevCerts(DevCertsArgs),
    /// Benchmarks.
    Bench {
        #[command(subcommand)]
        bench: bench::BenchCommand,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    configure_allocator(matches!(cli.command, Command::Server(_)));
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let rt = || tokio::runtime::Builder::new_multi_thread().enable_all().build();
    match cli.command {
        Command::Server(args) => rt()?.block_on(serve::server(args)),
        Command::Coordinator(args) => rt()?.block_on(serve::coordinator(args)),
        Command::Local(args) => {
            if rt()?.block_on(local::run(args))? {
                Ok(())
            } else {
                std::process::exit(1)
            }
        }
        Command::Admin(args) => std::process::exit(rt()?.block_on(admin::run(args))),
        Command::Credential(args) => credential(args),
        Command::DevCerts(args) => dev_certs(args),
        Command::Bench { bench } => bench::run(bench),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocator_option_ids_are_mimallocs() {
        // The ids must name the options: their defaults (before any set in this test process)
        // are mimalloc v3's, as are those of their neighbours, and a set shows through mimalloc's
        // own getter. One test, so nothing else in this process sets them first.
        let get = |id| unsafe { libmimalloc_sys::mi_option_get(id) };
        let (purge_env, thp_env) =
            (std::env::var_os("MIMALLOC_PURGE_DELAY"), std::env::var_os("MIMALLOC_ALLOW_THP"));
        if purge_env.is_none() {
            assert_eq!(get(MI_OPTION_PURGE_DELAY), 1000, "option 15 is not purge_delay (1000 ms)");
        }
        if thp_env.is_none() {
            assert_eq!(get(MI_OPTION_ALLOW_THP), 1, "option 43 is not allow_thp (default 1)");
            // page_cross_thread_max_reclaim (32, options.c) before it, minimal_purge_size (0) after.
            assert_eq!(
                get(MI_OPTION_ALLOW_THP - 1),
                32,
                "option 42 is not the one before allow_thp"
            );
            assert_eq!(get(MI_OPTION_ALLOW_THP + 1), 0, "option 44 is not the one after allow_thp");
        }
        configure_allocator(true);
        if purge_env.is_none() {
            assert_eq!(get(MI_OPTION_PURGE_DELAY), PURGE_DELAY_MS);
        }
        if thp_env.is_none() {
            assert_eq!(get(MI_OPTION_ALLOW_THP), 0);
            assert!(
                rustix::thread::transparent_huge_pages_are_disabled().unwrap(),
                "THP still allowed for the process"
            );
        }
    }
}
