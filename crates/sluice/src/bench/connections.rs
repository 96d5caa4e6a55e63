//! `sluice bench connections`: many clients at once against one server. For each count N (say 10,
//! 100, 1,000), a fresh server (data on tmpfs, so the figure is the server's, not the disk's)
//! takes N clients of one connection each: all at once, each creates its writer and connects
//! (timed on its own: `setup_seconds`), then each pushes its share of the bytes into a partition
//! of its own; after the commit each reads its partition back, all at once (opening its stream
//! included). Prints per N the push GB/s of the N connected clients (and with the set-up
//! counted), the fetch GB/s, their ratio to the smallest N's, the server's peak RSS against the
//! budget + 64 MiB + 64 KiB per connection, and its thread count (no thread per connection).
//!
//! Each client keeps the client's default window of bytes in flight, or, with
//! `--inflight-total`, a share of that total (at least one batch).
//!
//! Every count's clients do this `--passes` times (2 by default), a shuffle per pass, through
//! the same connections; the row's figures are the later passes', the first pass's are beside
//! them. The first pass measures this process as much as the server: one process plays every
//! client, and at 1,000 clients each one's whole share (1 MiB of 1 GiB) is in flight at once,
//! so the bench holds ~1 GiB it touches for the first time (the kernel zeroing pages was a
//! quarter of the machine's samples in a 1,000-client run, docs/benchmarks-log.md), where 10
//! clients recycle their windows. A real cluster's clients are executors on many machines,
//! each warm and each touching only its own share.
//!
//! With `--rounds N` every count runs N times, the order of the counts reversed every other
//! round (10, 100, 1,000, then 1,000, 100, 10, …), so that neither the first run after a start
//! (the bench's own memory touched for the first time) nor a drift of the machine's speed
//! lands on one count alone; a count's row then holds the median of its runs' GB/s, its
//! highest peak RSS, and every run's figures.

use std::time::Instant;

use anyhow::{bail, Context};
use clap::Args;
use serde_json::json;
use sluice_client::{ClientOptions, ShuffleClient};
use sluice_proto::message::Ping;
use sluice_proto::Message;

use crate::cluster::{cpu_seconds, metric, Cluster, ClusterSpec};
use crate::local::parse_size;
use crate::workload::secs;

/// Flags of `sluice bench connections`.
#[derive(Args, Debug, Clone)]
pub struct ConnArgs {
    /// Client counts, comma-separated; each gets a fresh server.
    #[arg(long, value_delimiter = ',', default_value = "10,100,1000")]
    pub counts: Vec<u32>,
    /// Bytes pushed (and read back) at every count, shared out evenly (suffixes K, M, G).
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    pub bytes: u64,
    /// Bytes per batch.
    #[arg(long, default_value = "256K", value_parser = parse_size)]
    pub batch_bytes: u64,
    /// The server's memory budget.
    #[arg(long, default_value = "256M", value_parser = parse_size)]
    pub memory_budget: u64,
    /// Bytes all clients together may have pushed and not yet had acknowledged: each client's
    /// window is this ÷ the count, at least one batch. 0 (the default): each client has the
    /// client's own default window (16 MiB), however many there are. Measured on 2026-11-26
    /// (docs/benchmarks-log.md): sharing 160 MiB did not raise the 1,000-client push rate.
    #[arg(long, default_value = "0", value_parser = parse_size)]
    pub inflight_total: u64,
    /// Runs of every count, the counts' order reversed every other round; rows give medians.
    #[arg(long, default_value_t = 1)]
    pub rounds: u32,
    /// Shuffles pushed and read back through the same connected clients at every count and
    /// round; the row's figures are the medians of the passes after the first, the first
    /// pass's are reported beside them (`first_pass_*`).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..))]
    pub passes: u32,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// Raises this process's open-file limit (inherited by the server it starts) to what `need`
/// descriptors take, up to the hard limit; fails clearly when the hard limit is lower.
fn raise_nofile(need: u64) -> anyhow::Result<u64> {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut lim = getrlimit(Resource::Nofile);
    let cur = lim.current.unwrap_or(u64::MAX);
    if cur >= need {
        return Ok(cur);
    }
    let max = lim.maximum.unwrap_or(u64::MAX);
    if max < need {
        bail!("{need} open files needed, but the hard limit (ulimit -Hn) is {max}");
    }
    lim.current = Some(need);
    setrlimit(Resource::Nofile, lim).context("raising RLIMIT_NOFILE")?;
    Ok(need)
}

/// The kernel's count of connections dropped because a listen queue was full (`TcpExt
/// ListenOverflows` in /proc/net/netstat; the whole host's, so other programs' count too), or
/// `None` where the file does not say.
fn listen_overflows() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/net/netstat").ok()?;
    let mut lines = text.lines().filter(|l| l.starts_with("TcpExt:"));
    let (names, values) = (lines.next()?, lines.next()?);
    let at = names.split_whitespace().position(|n| n == "ListenOverflows")?;
    values.split_whitespace().nth(at)?.parse().ok()
}

fn threads_of(pid: u32) -> u64 {
    sluice_testkit::proc_status_kib(pid, "Threads:")
}

/// One count: returns its JSON row.
async fn one_count(args: &ConnArgs, n: u32) -> anyhow::Result<serde_json::Value> {
    let shm = std::path::Path::new("/dev/shm");
    let cluster = Cluster::start(&ClusterSpec {
        admin_token: None,
        servers: 1,
        memory_budget_bytes: args.memory_budget,
        data_root: shm.is_dir().then(|| shm.to_path_buf()),
        server_sets: vec![vec![]],
        tls: false,
    })?;
    cluster.wait_ready().await?;
    let server = &cluster.servers[0];
    let window = match args.inflight_total {
        0 => ClientOptions::default().max_inflight_bytes as u64,
        total => (total / n as u64).max(args.batch_bytes),
    };
    let opts = || {
        let mut o = ClientOptions {
            coordinators: vec![cluster.coordinator.addr.to_string()],
            ..ClientOptions::default()
        };
        o.transport.connections_per_peer = 1;
        o.max_inflight_bytes = window as usize;
        o
    };
    let app = format!("bench-conn-{n}");
    let clients: Vec<ShuffleClient> =
        (0..n).map(|_| ShuffleClient::new(app.clone(), opts())).collect();
    clients[0].register_app().await?;
    let batch = bytes::Bytes::from(super::shuffle::payload(args.batch_bytes as usize));
    let per_client = (args.bytes / n as u64 / args.batch_bytes).max(1);

    let mut passes = Vec::with_capacity(args.passes as usize);
    for pass in 0..args.passes {
        let p = one_pass(&cluster, &clients, pass, per_client, &batch).await;
        passes.push(p.with_context(|| format!("pass {}", pass + 1))?);
    }
    // The row's figures are the passes after the first (medians), when there are any: by then
    // the bench process — one process playing every client, where a real cluster has one per
    // machine — has touched the memory it needs once (see the module's comment).
    let later = if passes.len() > 1 { &passes[1..] } else { &passes[..] };
    let median = |k: &str| {
        let mut v: Vec<f64> = later.iter().filter_map(|r| r[k].as_f64()).collect();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        (n > 0).then(|| if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 })
    };
    let first = &passes[0];
    let peak = server.peak_rss_bytes();
    let allowed = args.memory_budget + (64 << 20) + (64 << 10) * n as u64;
    let bytes = first["bytes"].as_u64().unwrap_or(0);
    let gb = bytes as f64 / 1e9;
    let push_gbps = median("push_gbps");
    let setup_s = median("setup_seconds");
    let with_setup = push_gbps.zip(setup_s).map(|(p, s)| gb / (gb / p + s));
    let max = |k: &str| passes.iter().filter_map(|r| r[k].as_u64()).max();
    let sum = |k: &str| passes.iter().filter_map(|r| r[k].as_u64()).sum::<u64>();
    Ok(json!({
        "connections": n,
        "bytes": bytes,
        "push_gbps": push_gbps,
        "push_gbps_with_setup": with_setup,
        "setup_seconds": setup_s,
        "listen_overflows": sum("listen_overflows"),
        "fetch_gbps": median("fetch_gbps"),
        "push_server_cpu_s_per_gb": median("push_server_cpu_s_per_gb"),
        "fetch_server_cpu_s_per_gb": median("fetch_server_cpu_s_per_gb"),
        "first_pass_push_gbps": first["push_gbps"],
        "first_pass_push_gbps_with_setup": first["push_gbps_with_setup"],
        "first_pass_setup_seconds": first["setup_seconds"],
        "first_pass_fetch_gbps": first["fetch_gbps"],
        "server_peak_rss_bytes": peak,
        "server_rss_after_push_bytes": max("server_rss_after_push_bytes"),
        "rss_allowed_bytes": allowed,
        "rss_within": peak <= allowed,
        "server_threads": max("server_threads"),
        "pushes_held": sum("pushes_held"),
        "client_inflight_bytes": window,
        "busy_replies": sum("busy_replies"),
        "passes": passes,
        "load": super::transport::loadavg(),
    }))
}

/// One pass of a count: shuffle `pass` registered, each client's writer made and its connection
/// checked (the set-up, timed on its own), every client pushing `per_client` batches into its
/// own partition (timed), the commit, every client reading its partition back (timed), then the
/// shuffle unregistered (its bytes freed: the data is on tmpfs). Returns the pass's figures.
async fn one_pass(
    cluster: &Cluster,
    clients: &[ShuffleClient],
    pass: u32,
    per_client: u64,
    batch: &bytes::Bytes,
) -> anyhow::Result<serde_json::Value> {
    let server = &cluster.servers[0];
    let n = clients.len() as u32;
    let a = clients[0].register_shuffle(pass, n, n, 1).await?;

    // Set-up first, timed on its own: every client's writer (it asks a coordinator for the
    // shuffle's splits) and its connection to the server (a ping), all at once. The push is
    // timed from when all N are connected: the rate N open connections move, not how fast N
    // connections are made (`setup_seconds`; `push_gbps_with_setup` counts both). In passes
    // after the first the connections are open already; the writers are new.
    let addr = server.addr;
    let pressure = || {
        (
            metric(server, "sluice_server_pushes_held_total"),
            metric(server, "sluice_server_busy_replies_total"),
        )
    };
    let pressure0 = pressure();
    let overflows0 = listen_overflows();
    let t = Instant::now();
    let setups = clients.iter().enumerate().map(|(i, c)| {
        let (c, a) = (c.clone(), a.clone());
        tokio::spawn(async move {
            let w = c.writer(a, i as u32, 0).await?;
            c.request(addr, Message::Ping(Ping {})).await?;
            Ok::<_, anyhow::Error>(w)
        })
    });
    let mut writers = Vec::with_capacity(n as usize);
    for r in futures_util::future::join_all(setups).await {
        writers.push(r??);
    }
    let setup_s = secs(t);
    // Handshakes the kernel dropped for a full accept queue: each such client connected only
    // after its SYN was sent again, a second later.
    let overflows = listen_overflows().zip(overflows0).map(|(a, b)| a.saturating_sub(b));

    let cpu0 = cpu_seconds(server.pid());
    let t = Instant::now();
    let pushes = writers.into_iter().enumerate().map(|(i, mut w)| {
        let batch = batch.clone();
        tokio::spawn(async move {
            for _ in 0..per_client {
                w.add_batch_bytes(i as u32, batch.clone()).await?;
            }
            w.finish().await?;
            Ok::<u64, anyhow::Error>(per_client * batch.len() as u64)
        })
    });
    let mut pushed = 0;
    for r in futures_util::future::join_all(pushes).await {
        pushed += r??;
    }
    let push_s = secs(t);
    let push_cpu = cpu_seconds(server.pid()) - cpu0;
    let threads_push = threads_of(server.pid());
    let rss_after_push = server.rss_bytes();
    // Memory pressure while pushing: pushes the server held until its flushers made room, and
    // pushes it answered `Busy` (each sent again after a back-off), in this pass.
    let (held, busy) = pressure();
    let (held, busy) = (held.saturating_sub(pressure0.0), busy.saturating_sub(pressure0.1));
    let stored: u64 = clients[0].commit_shuffle(&a).await?.iter().sum();
    anyhow::ensure!(stored >= pushed, "server stored {stored} bytes of {pushed} pushed");

    let cpu1 = cpu_seconds(server.pid());
    let t = Instant::now();
    let reads = clients.iter().enumerate().map(|(i, c)| {
        let (c, a) = (c.clone(), a.clone());
        tokio::spawn(async move {
            let mut r = c.reader(&a, i as u32, 0, n).await?;
            let mut got = 0u64;
            while let Some(b) = r.next_batch().await? {
                got += b.len() as u64;
            }
            Ok::<u64, anyhow::Error>(got)
        })
    });
    let mut fetched = 0;
    for r in futures_util::future::join_all(reads).await {
        fetched += r??;
    }
    let fetch_s = secs(t);
    let fetch_cpu = cpu_seconds(server.pid()) - cpu1;
    anyhow::ensure!(fetched == pushed, "read {fetched} bytes of {pushed} pushed");
    clients[0].unregister_shuffle(&a).await?;
    let gb = pushed as f64 / 1e9;
    Ok(json!({
        "pass": pass + 1,
        "bytes": pushed,
        "push_gbps": gb / push_s,
        "push_gbps_with_setup": gb / (push_s + setup_s),
        "setup_seconds": setup_s,
        "listen_overflows": overflows,
        "fetch_gbps": gb / fetch_s,
        "push_server_cpu_s_per_gb": push_cpu / gb,
        "fetch_server_cpu_s_per_gb": fetch_cpu / gb,
        "server_rss_after_push_bytes": rss_after_push,
        "server_threads": threads_push,
        "pushes_held": held,
        "busy_replies": busy,
    }))
}

/// `sluice bench connections`.
pub async fn run(args: ConnArgs) -> anyhow::Result<()> {
    let most = args.counts.iter().copied().max().unwrap_or(0) as u64;
    // Each client's socket here, the server's end of it and a file per partition there.
    let limit = raise_nofile(3 * most + 256)?;
    anyhow::ensure!(args.rounds > 0, "--rounds must be at least 1");
    anyhow::ensure!(!args.counts.is_empty(), "--counts names no count");
    anyhow::ensure!(args.counts.iter().all(|&n| n > 0), "a count of 0 clients");
    let mut runs: Vec<Vec<serde_json::Value>> = vec![Vec::new(); args.counts.len()];
    let mut seq = 0u32;
    for round in 0..args.rounds {
        let mut order: Vec<usize> = (0..args.counts.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        for i in order {
            let n = args.counts[i];
            let mut row = one_count(&args, n).await.with_context(|| format!("{n} connections"))?;
            row["round"] = json!(round);
            row["seq"] = json!(seq); // the run's place in the bench's order
            seq += 1;
            if !args.json {
                eprintln!("{n} connections, round {round} done: {row}");
            }
            runs[i].push(row);
        }
    }
    let mut rows: Vec<serde_json::Value> = runs.into_iter().map(summarize).collect();
    // Each figure against the first count's (10 connections by default).
    let ratios = [
        ("push_gbps", "push_vs_first"),
        ("push_gbps_with_setup", "push_with_setup_vs_first"),
        ("fetch_gbps", "fetch_vs_first"),
        ("first_pass_push_gbps", "first_pass_push_vs_first"),
        ("first_pass_push_gbps_with_setup", "first_pass_push_with_setup_vs_first"),
        ("first_pass_fetch_gbps", "first_pass_fetch_vs_first"),
    ];
    let base: Vec<Option<f64>> = ratios.iter().map(|(k, _)| rows[0][*k].as_f64()).collect();
    for r in &mut rows {
        for ((k, out), b) in ratios.iter().zip(&base) {
            r[*out] = json!(r[*k].as_f64().zip(*b).map(|(a, b)| a / b));
        }
    }
    let out = json!({
        "bench": "connections",
        "memory_budget_bytes": args.memory_budget,
        "nofile_limit": limit,
        "rounds": args.rounds,
        "passes": args.passes,
        "inflight_total_bytes": args.inflight_total,
        "rows": rows,
    });
    if args.json {
        println!("{out}");
        return Ok(());
    }
    println!(
        "bench connections: one server (budget {} MiB, data on tmpfs), clients' in-flight total {} MiB (0: 16 MiB each), {:.2} GiB pushed and read back per pass, {} pass(es) per run (figures: passes 2 on; \"1st pass\": the first's against the first count's), {} run(s) per count (medians)",
        args.memory_budget >> 20,
        args.inflight_total >> 20,
        args.bytes as f64 / (1u64 << 30) as f64,
        args.passes,
        args.rounds
    );
    println!(
        "  {:>6} {:>7} {:>9} {:>9} {:>7} {:>11} {:>10} {:>7} {:>15} {:>16} {:>14} {:>12} {:>8} {:>6} {:>6} {:>6}",
        "conns",
        "setup s",
        "overflows",
        "push GB/s",
        "vs 1st",
        "with setup",
        "fetch GB/s",
        "vs 1st",
        "1st pass: push",
        "fetch (vs 1st)",
        "peak RSS MiB",
        "allowed MiB",
        "threads",
        "held",
        "busy",
        "load"
    );
    for r in &rows {
        let f = |k: &str| r[k].as_f64().unwrap_or(f64::NAN);
        let mib = |k: &str| r[k].as_u64().unwrap_or(0) as f64 / 1048576.0;
        println!(
            "  {:>6} {:>7.3} {:>9} {:>9.2} {:>7.2} {:>11.2} {:>10.2} {:>7.2} {:>15} {:>16} {:>14.0} {:>12.0} {:>8} {:>6} {:>6} {:>6}",
            r["connections"].as_u64().unwrap_or(0),
            f("setup_seconds"),
            r["listen_overflows"].as_u64().unwrap_or(0),
            f("push_gbps"),
            f("push_vs_first"),
            f("push_gbps_with_setup"),
            f("fetch_gbps"),
            f("fetch_vs_first"),
            format!("{:.2} ({:.2})", f("first_pass_push_gbps"), f("first_pass_push_vs_first")),
            format!("{:.2} ({:.2})", f("first_pass_fetch_gbps"), f("first_pass_fetch_vs_first")),
            mib("server_peak_rss_bytes"),
            mib("rss_allowed_bytes"),
            r["server_threads"].as_u64().unwrap_or(0),
            r["pushes_held"].as_u64().unwrap_or(0),
            r["busy_replies"].as_u64().unwrap_or(0),
            r["load"].as_str().unwrap_or("").split(' ').next().unwrap_or("")
        );
    }
    Ok(())
}

/// One count's row from its runs (in the order run): the median push and fetch GB/s and server
/// CPU per GB, the highest peak RSS (the bound must hold in every run), held and `Busy` pushes
/// summed, and every run's row under `runs`.
fn summarize(runs: Vec<serde_json::Value>) -> serde_json::Value {
    let median = |k: &str| {
        let mut v: Vec<f64> = runs.iter().filter_map(|r| r[k].as_f64()).collect();
        v.sort_by(f64::total_cmp);
        match v.len() {
            0 => None,
            n if n % 2 == 1 => Some(v[n / 2]),
            n => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
        }
    };
    let max = |k: &str| runs.iter().filter_map(|r| r[k].as_u64()).max();
    let sum = |k: &str| runs.iter().filter_map(|r| r[k].as_u64()).sum::<u64>();
    let mut row = runs[0].clone();
    for k in [
        "push_gbps",
        "push_gbps_with_setup",
        "setup_seconds",
        "fetch_gbps",
        "push_server_cpu_s_per_gb",
        "fetch_server_cpu_s_per_gb",
        "first_pass_push_gbps",
        "first_pass_push_gbps_with_setup",
        "first_pass_setup_seconds",
        "first_pass_fetch_gbps",
    ] {
        row[k] = json!(median(k));
    }
    for k in ["server_peak_rss_bytes", "server_rss_after_push_bytes", "server_threads"] {
        row[k] = json!(max(k));
    }
    row["pushes_held"] = json!(sum("pushes_held"));
    row["listen_overflows"] = json!(sum("listen_overflows"));
    row["busy_replies"] = json!(sum("busy_replies"));
    row["rss_within"] = json!(runs.iter().all(|r| r["rss_within"].as_bool() == Some(true)));
    if let Some(o) = row.as_object_mut() {
        o.remove("round");
        o.remove("seq");
    }
    row["runs"] = json!(runs);
    row
}
