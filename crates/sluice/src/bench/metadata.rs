//! `sluice bench metadata`: what a wide shuffle (2,000 maps × 10,000 partitions by default)
//! costs in metadata, on one real server and a coordinator started as child processes.
//!
//! The shuffle is registered with the coordinator; every map pushes one small batch to each of
//! its partitions (every partition by default: `--fraction 1`; a fraction `f` has each map push
//! to `k = round(f * partitions)` partitions, `k` in a row from `m * 7919 mod partitions`,
//! wrapping), then sends its `MapperEnd`;
//! the shuffle is committed; every partition is opened as a stream and read back, and the bytes
//! read are checked against the bytes pushed.
//!
//! Memory is measured twice, from the inside and from the outside:
//! - `server_metadata_bytes`: what the server's core counts its shuffles' structures at
//!   (`sluice_server_metadata_bytes`: partitions, chunk index, files, buffer bookkeeping, map
//!   ends; each container by its capacity), once every stream was read.
//! - `server_rss_growth_bytes`: the server's RSS at that point, minus its RSS before the shuffle
//!   was registered, minus what its memory budget still holds (`memory_used`, 0 after a commit)
//!   and what its body pool keeps for reuse (`body_pool_kept`): the structures plus whatever the
//!   allocator keeps mapped (fragmentation), an upper bound. The children run with
//!   `MIMALLOC_PURGE_DELAY=0`, so freed pages go back to the kernel at once instead of after the
//!   10 s the server keeps them for reuse by default.
//! - `coordinator_bytes`: the coordinator's RSS growth from before registration to the end.
//! - `client_peak_rss_bytes`: this process's peak RSS (the bench's maps and readers, all in one
//!   process: an upper bound of one executor's and the driver's client memory).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use serde_json::json;
use sluice_client::ShuffleClient;
use sluice_proto::message::{Assignment, Ping};
use sluice_proto::Message;

use crate::cluster::{metric, own_peak_rss_bytes, Cluster, ClusterSpec};
use crate::local::{client_for, parse_size};
use crate::workload::secs;

/// Flags of `sluice bench metadata`.
#[derive(Args, Debug, Clone)]
pub struct MetadataArgs {
    /// Map tasks.
    #[arg(long, default_value_t = 2000)]
    pub maps: u32,
    /// Partitions.
    #[arg(long, default_value_t = 10_000)]
    pub partitions: u32,
    /// Share of (map, partition) pairs that get a batch, in (0, 1].
    #[arg(long, default_value_t = 1.0)]
    pub fraction: f64,
    /// Payload bytes of each batch (the batch header adds 20).
    #[arg(long, default_value_t = 16)]
    pub payload_bytes: usize,
    /// Maps written at once.
    #[arg(long, default_value_t = 4)]
    pub writers: u32,
    /// Partitions read at once.
    #[arg(long, default_value_t = 4)]
    pub readers: u32,
    /// The server's memory budget.
    #[arg(long, default_value = "512M", value_parser = parse_size)]
    pub memory_budget: u64,
    /// A server setting, `KEY=VALUE` (as `sluice server --set`); repeatable.
    #[arg(long = "server-set", value_name = "KEY=VALUE")]
    pub server_set: Vec<String>,
    /// First run the same shuffle once and delete it, so that the measured shuffle's partition
    /// files come from the server's recycle pool (what a second job on the server meets).
    #[arg(long)]
    pub reuse_files: bool,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// Whether map `m` pushes to partition `p` of `parts` when each map pushes to `k` of them.
fn pushes_to(m: u32, p: u32, k: u32, parts: u32) -> bool {
    let start = (m as u64 * 7919 % parts as u64) as u32;
    (p + parts - start) % parts < k
}

/// A batch payload that names its map and partition (so a mix-up would change the bytes read).
fn payload(m: u32, p: u32, len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len);
    let seed = ((m as u64) << 32 | p as u64).to_le_bytes();
    while v.len() < len {
        v.extend_from_slice(&seed[..(len - v.len()).min(8)]);
    }
    v
}

/// Before the runtime's threads start: the children this process starts give freed memory back
/// at once (see the module's notes), unless the caller chose otherwise.
pub fn before_runtime() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // Called from `main`'s thread before any other thread of this process exists.
        std::env::set_var("MIMALLOC_PURGE_DELAY", "0");
    }
}

/// Runs the maps, `writers` at a time; returns the payload bytes pushed.
async fn push_all(
    client: &ShuffleClient,
    a: &Arc<Assignment>,
    args: &MetadataArgs,
    k: u32,
) -> anyhow::Result<u64> {
    let next = Arc::new(AtomicU32::new(0));
    let pushed = Arc::new(AtomicU64::new(0));
    let workers = (0..args.writers.max(1)).map(|_| {
        let (client, a, next, pushed) = (client.clone(), a.clone(), next.clone(), pushed.clone());
        let (maps, parts, len) = (args.maps, args.partitions, args.payload_bytes);
        tokio::spawn(async move {
            loop {
                let m = next.fetch_add(1, Ordering::Relaxed);
                if m >= maps {
                    return Ok::<(), anyhow::Error>(());
                }
                let mut w = client.writer(a.clone(), m, 0).await?;
                let mut bytes = 0;
                for p in (0..parts).filter(|&p| pushes_to(m, p, k, parts)) {
                    w.add_batch(p, &payload(m, p, len)).await?;
                    bytes += len as u64;
                }
                w.finish().await.with_context(|| format!("map {m}"))?;
                pushed.fetch_add(bytes, Ordering::Relaxed);
            }
        })
    });
    for r in futures_util::future::join_all(workers).await {
        r??;
    }
    Ok(pushed.load(Ordering::Relaxed))
}

/// Opens every partition as a stream over all maps and reads it; returns (payload bytes,
/// batches) read.
async fn read_all(
    client: &ShuffleClient,
    a: &Assignment,
    args: &MetadataArgs,
) -> anyhow::Result<(u64, u64)> {
    let next = AtomicU32::new(0);
    let worker = || async {
        let (mut bytes, mut batches) = (0u64, 0u64);
        loop {
            let p = next.fetch_add(1, Ordering::Relaxed);
            if p >= args.partitions {
                return Ok::<_, anyhow::Error>((bytes, batches));
            }
            let mut r = client.reader(a, p, 0, args.maps).await?;
            while let Some(b) = r.next_batch().await? {
                bytes += b.len() as u64;
                batches += 1;
            }
        }
    };
    let (mut bytes, mut batches) = (0, 0);
    for r in futures_util::future::join_all((0..args.readers.max(1)).map(|_| worker())).await {
        let (b, n) = r?;
        bytes += b;
        batches += n;
    }
    Ok((bytes, batches))
}

/// `sluice bench metadata`.
pub async fn run(args: MetadataArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.fraction > 0.0 && args.fraction <= 1.0,
        "--fraction must be in (0, 1], not {}",
        args.fraction
    );
    anyhow::ensure!(args.maps > 0 && args.partitions > 0, "--maps and --partitions must be > 0");
    let k = ((args.fraction * args.partitions as f64).round() as u32).clamp(1, args.partitions);
    let pairs = args.maps as u64 * k as u64;
    let cluster = Cluster::start(&ClusterSpec {
        admin_token: None,
        servers: 1,
        memory_budget_bytes: args.memory_budget,
        data_root: None,
        server_sets: vec![args.server_set.clone()],
        tls: false,
    })?;
    let server = &cluster.servers[0];
    let coordinator = &cluster.coordinator;
    let client = client_for(&cluster, "bench-metadata").await?;
    if args.reuse_files {
        let a = client.register_shuffle(1, args.maps, args.partitions, 1).await?;
        push_all(&client, &a, &args, k).await?;
        client.commit_shuffle(&a).await?;
        client.unregister_shuffle(&a).await?;
    }
    let reused0 = metric(server, "sluice_server_recycled_files_reused_total");
    let server_rss0 = server.rss_bytes();
    let coordinator_rss0 = coordinator.rss_bytes();

    let t = Instant::now();
    let a = client.register_shuffle(0, args.maps, args.partitions, 1).await?;
    let register_s = secs(t);

    let t = Instant::now();
    let pushed = push_all(&client, &a, &args, k).await?;
    let push_s = secs(t);
    let server_rss_pushed = server.rss_bytes();

    let t = Instant::now();
    let sizes = client.commit_shuffle(&a).await?;
    let commit_s = secs(t);
    let stored: u64 = sizes.iter().sum();
    let server_rss_committed = server.rss_bytes();
    let metadata_committed = metric(server, "sluice_server_metadata_bytes");

    let t = Instant::now();
    let (read, batches) = read_all(&client, &a, &args).await?;
    let read_s = secs(t);
    anyhow::ensure!(read == pushed, "read {read} payload bytes of {pushed} pushed");
    anyhow::ensure!(batches == pairs, "read {batches} batches of {pairs} pushed");

    let server_rss = server.rss_bytes();
    let used = metric(server, "sluice_server_memory_used_bytes");
    let pool = metric(server, "sluice_server_body_pool_kept_bytes");
    let server_rss_growth =
        server_rss.saturating_sub(server_rss0).saturating_sub(used).saturating_sub(pool);
    let server_metadata = metric(server, "sluice_server_metadata_bytes");
    let coordinator_bytes = coordinator.rss_bytes().saturating_sub(coordinator_rss0);
    let reused = metric(server, "sluice_server_recycled_files_reused_total") - reused0;

    // The deletion: the shuffle unregistered (its files recycled or deleted) while other
    // clients ping the server back to back, each on a connection of its own (the server's
    // async workers each hold some of them); the slowest ping beside the slowest of pings just
    // before, with nothing else going on (the baseline, same run).
    let (idle_ping_max, _) = ping_while(&cluster, async { Ok(()) }, 100).await?;
    let ((ping_max, pings), unregister_s) = {
        let t = Instant::now();
        let r = ping_while(&cluster, client.unregister_shuffle(&a), 0).await?;
        (r, secs(t))
    };
    let mib = |b: u64| b as f64 / 1048576.0;
    let out = json!({
        "bench": "metadata",
        "maps": args.maps,
        "partitions": args.partitions,
        "fraction": args.fraction,
        "pairs_pushed": pairs,
        "payload_bytes_per_batch": args.payload_bytes,
        "pushed_payload_bytes": pushed,
        "stored_bytes": stored,
        "server_metadata_bytes": server_metadata,
        "server_metadata_bytes_per_pair": server_metadata as f64 / pairs.max(1) as f64,
        "server_metadata_after_commit_bytes": metadata_committed,
        "server_rss_growth_bytes": server_rss_growth,
        "server_rss_before_bytes": server_rss0,
        "server_rss_after_push_bytes": server_rss_pushed,
        "server_rss_after_commit_bytes": server_rss_committed,
        "server_rss_after_read_bytes": server_rss,
        "server_peak_rss_bytes": server.peak_rss_bytes(),
        "server_memory_used_bytes": used,
        "server_body_pool_kept_bytes": pool,
        "coordinator_bytes": coordinator_bytes,
        "coordinator_peak_rss_bytes": coordinator.peak_rss_bytes(),
        "client_peak_rss_bytes": own_peak_rss_bytes(),
        "register_seconds": register_s,
        "push_seconds": push_s,
        "commit_seconds": commit_s,
        "read_seconds": read_s,
        "files_reused": reused,
        "unregister_seconds": unregister_s,
        "ping_max_ms_during_unregister": ping_max * 1e3,
        "pings_during_unregister": pings,
        "ping_max_ms_idle": idle_ping_max * 1e3,
        "memory_budget_bytes": args.memory_budget,
        "targets": { "server_metadata_bytes": 64u64 << 20, "commit_seconds": 1.0 },
        "within_targets": server_metadata <= 64 << 20 && commit_s <= 1.0,
        "load": super::transport::loadavg(),
    });
    if args.json {
        println!("{out}");
    } else {
        println!(
            "bench metadata: {} maps x {} partitions ({} pairs with a batch of {} B), one server",
            args.maps, args.partitions, pairs, args.payload_bytes
        );
        println!("  server metadata  {:>9.1} MiB (target <= 64)", mib(server_metadata));
        println!("  server RSS growth{:>9.1} MiB", mib(server_rss_growth));
        println!("  commit           {commit_s:>9.3} s   (target <= 1)");
        println!("  coordinator      {:>9.1} MiB", mib(coordinator_bytes));
        println!("  client peak RSS  {:>9.1} MiB", mib(own_peak_rss_bytes()));
        println!(
            "  register {register_s:.3} s, push {push_s:.1} s, read {read_s:.1} s, load {}",
            out["load"].as_str().unwrap_or("?")
        );
        println!(
            "  unregister {unregister_s:.3} s; slowest ping meanwhile {:.2} ms ({pings} pings), \
             idle {:.2} ms",
            ping_max * 1e3,
            idle_ping_max * 1e3
        );
    }
    Ok(())
}

/// Clients pinging in [`ping_while`], each on a connection of its own.
const PROBERS: usize = 8;

/// Pings the server back to back from [`PROBERS`] clients of their own while `work` runs, and
/// then until each answered at least `min_pings`. Returns the slowest ping's seconds and the
/// pings answered.
async fn ping_while(
    cluster: &Cluster,
    work: impl std::future::Future<Output = Result<(), sluice_client::ClientError>>,
    min_pings: u32,
) -> anyhow::Result<(f64, u32)> {
    let addr = cluster.servers[0].addr;
    let mut probers = Vec::with_capacity(PROBERS);
    for _ in 0..PROBERS {
        let p = client_for(cluster, "bench-metadata-ping").await?;
        p.request(addr, Message::Ping(Ping {})).await?; // connected before the work starts
        probers.push(p);
    }
    let done = std::sync::atomic::AtomicBool::new(false);
    let probe = |prober: &ShuffleClient| {
        let (prober, done) = (prober.clone(), &done);
        async move {
            let (mut slowest, mut n) = (0f64, 0u32);
            while !done.load(Ordering::Acquire) || n < min_pings {
                let t = Instant::now();
                prober.request(addr, Message::Ping(Ping {})).await?;
                slowest = slowest.max(secs(t));
                n += 1;
            }
            Ok::<_, anyhow::Error>((slowest, n))
        }
    };
    let probes = futures_util::future::try_join_all(probers.iter().map(probe));
    let work = async {
        let r = work.await;
        done.store(true, Ordering::Release);
        r
    };
    let (probed, worked) = tokio::join!(probes, work);
    worked?;
    Ok(probed?.into_iter().fold((0f64, 0u32), |(s, n), (s1, n1)| (s.max(s1), n + n1)))
}
