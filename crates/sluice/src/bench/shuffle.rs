//! End-to-end shuffle benchmarks on an embedded cluster: `sluice bench push` (ingest into one
//! server) and `sluice bench fetch` (reading committed data back, zero copy beside the copy path).

use std::sync::Arc;
use std::time::Instant;

use clap::Args;
use serde_json::json;
use sluice_client::ShuffleClient;
use sluice_proto::message::Assignment;
use sluice_testkit::Proc;

use crate::cluster::{cpu_seconds, Cluster, ClusterSpec};
use crate::local::{client_for, parse_size};
use crate::workload::secs;

/// Flags shared by the shuffle benchmarks.
#[derive(Args, Debug, Clone)]
pub struct ShuffleBenchArgs {
    /// Bytes to push (suffixes K, M, G).
    #[arg(long, default_value = "2G", value_parser = parse_size)]
    pub bytes: u64,
    /// Concurrent map writers.
    #[arg(long, default_value_t = 4)]
    pub maps: u32,
    /// Partitions.
    #[arg(long, default_value_t = 16)]
    pub partitions: u32,
    /// Bytes per batch.
    #[arg(long, default_value = "256K", value_parser = parse_size)]
    pub batch_bytes: u64,
    /// Server memory budget.
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    pub memory_budget: u64,
    /// Partitions read at once (fetch).
    #[arg(long, default_value_t = 4)]
    pub readers: usize,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

pub(crate) fn payload(bytes: usize) -> Vec<u8> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    (0..bytes)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Pushes `bytes` in ready-made batches from `maps` concurrent writers; returns bytes pushed.
async fn push_batches(
    client: &ShuffleClient,
    a: &Arc<Assignment>,
    args: &ShuffleBenchArgs,
) -> anyhow::Result<u64> {
    let batch = bytes::Bytes::from(payload(args.batch_bytes as usize));
    let per_map = args.bytes / args.maps as u64 / args.batch_bytes;
    let tasks = (0..args.maps).map(|m| {
        let (client, a, batch) = (client.clone(), a.clone(), batch.clone());
        let parts = args.partitions;
        tokio::spawn(async move {
            let mut w = client.writer(a, m, 0).await?;
            for i in 0..per_map {
                w.add_batch_bytes(((i + m as u64) % parts as u64) as u32, batch.clone()).await?;
            }
            w.finish().await?;
            Ok::<u64, anyhow::Error>(per_map * batch.len() as u64)
        })
    });
    let mut total = 0;
    for r in futures_util::future::join_all(tasks).await {
        total += r??;
    }
    Ok(total)
}

async fn one_server(
    args: &ShuffleBenchArgs,
    sets: Vec<String>,
    data_root: Option<std::path::PathBuf>,
    tls: bool,
) -> anyhow::Result<(Cluster, ShuffleClient, Arc<Assignment>)> {
    let cluster = Cluster::start(&ClusterSpec {
        admin_token: None,
        servers: 1,
        memory_budget_bytes: args.memory_budget,
        data_root,
        server_sets: vec![sets],
        tls,
    })?;
    let client = client_for(&cluster, "bench").await?;
    let a = client.register_shuffle(0, args.maps, args.partitions, 1).await?;
    Ok((cluster, client, a))
}

fn server(c: &Cluster) -> &Proc {
    &c.servers[0]
}

/// `sluice bench push`: ingest into one server whose data directory is on tmpfs (memory only:
/// the figure is the server's ingest path, not the disk).
pub async fn push(args: ShuffleBenchArgs) -> anyhow::Result<()> {
    let shm = std::path::Path::new("/dev/shm");
    let root = shm.is_dir().then(|| shm.to_path_buf());
    let (cluster, client, a) =
        one_server(&args, vec!["chunk_bytes=8388608".into()], root.clone(), false).await?;
    // Warm-up: a budget's worth of pushes into a throw-away shuffle, so the server's allocator
    // has touched its memory once (a fresh process pays the kernel's page zeroing on first use;
    // a long-running server does not). The measured run below is steady-state ingest.
    let warm_args = ShuffleBenchArgs { bytes: args.memory_budget.min(args.bytes), ..args.clone() };
    let warm = client.register_shuffle(1, args.maps, args.partitions, 1).await?;
    push_batches(&client, &warm, &warm_args).await?;
    client.unregister_shuffle(&warm).await?;
    let me = std::process::id();
    let (cpu0, client_cpu0) = (cpu_seconds(server(&cluster).pid()), cpu_seconds(me));
    let t = Instant::now();
    let bytes = push_batches(&client, &a, &args).await?;
    let s = secs(t);
    let cpu = cpu_seconds(server(&cluster).pid()) - cpu0;
    // The pushing clients are this process: on this machine they share its CPUs with the server.
    let client_cpu = cpu_seconds(me) - client_cpu0;
    let sizes = client.commit_shuffle(&a).await?;
    let stored: u64 = sizes.iter().sum();
    let peak_rss = server(&cluster).peak_rss_bytes();
    drop(cluster);
    // The kernel baseline: the same bytes over as many connections as writers, in writes of a
    // push frame's size, into a blocking read-and-write loop; a warm-up of the same size first.
    let frame = client.options().push_frame_bytes.max(args.batch_bytes as usize);
    let (base_s, base_cpu, base_client_cpu) = tokio::task::spawn_blocking({
        let (maps, bytes, warm) = (args.maps, bytes, warm_args.bytes);
        let dir = root.clone().unwrap_or_else(std::env::temp_dir);
        move || push_baseline_run(&dir, maps, bytes, warm, frame)
    })
    .await??;
    let gb = bytes as f64 / 1e9;
    let (cpu_gb, base_cpu_gb) = (cpu / gb, base_cpu / gb);
    let (client_cpu_gb, base_client_cpu_gb) = (client_cpu / gb, base_client_cpu / gb);
    let out = json!({
        "bench": "push",
        "bytes": bytes,
        "stored_bytes": stored,
        "seconds": s,
        "ingest_gbps": gb / s,
        "server_cpu_s_per_gb": cpu_gb,
        "server_peak_rss_bytes": peak_rss,
        "client_cpu_s_per_gb": client_cpu_gb,
        "baseline_gbps": gb / base_s,
        "baseline_cpu_s_per_gb": base_cpu_gb,
        "baseline_client_cpu_s_per_gb": base_client_cpu_gb,
        "cpu_ratio": cpu_gb / base_cpu_gb.max(1e-9),
        "memory_budget_bytes": args.memory_budget,
        "data_on_tmpfs": root.is_some(),
        "writers": args.maps,
        "warm_up_bytes": warm_args.bytes,
        "load": super::transport::loadavg(),
    });
    if args.json {
        println!("{out}");
    } else {
        println!(
            "bench push: {} writers → 1 server (data on {}; after a {:.2} GiB warm-up), load {}",
            args.maps,
            if root.is_some() { "tmpfs" } else { "disk" },
            warm_args.bytes as f64 / (1u64 << 30) as f64,
            out["load"].as_str().unwrap_or("?"),
        );
        println!(
            "  {:<44} {:>6.2} GB/s  {:>6.3} CPU s/GB (clients {:.3})  peak RSS {:.0} MiB",
            "sluice server",
            gb / s,
            cpu_gb,
            client_cpu_gb,
            peak_rss as f64 / 1048576.0
        );
        println!(
            "  {:<44} {:>6.2} GB/s  {:>6.3} CPU s/GB (senders {:.3})",
            "kernel baseline (blocking recv + write loop)",
            gb / base_s,
            base_cpu_gb,
            base_client_cpu_gb
        );
        println!(
            "  server CPU / baseline CPU: {:.2}x (target <= 1.5)",
            out["cpu_ratio"].as_f64().unwrap_or(0.0)
        );
    }
    anyhow::ensure!(stored >= bytes, "server stored {stored} bytes of {bytes} pushed");
    Ok(())
}

/// The kernel baseline of `bench push` (see `push_baseline`): a warm-up pass of `warm` bytes, then
/// `bytes` measured; returns (seconds, the sink's CPU seconds, this process's — the senders' —
/// CPU seconds) of the measured pass.
fn push_baseline_run(
    dir: &std::path::Path,
    conns: u32,
    bytes: u64,
    warm: u64,
    frame: usize,
) -> anyhow::Result<(f64, f64, f64)> {
    let dir = tempfile::Builder::new().prefix("sluice-push-sink-").tempdir_in(dir)?;
    let sink = super::push_baseline::Sink::start(dir.path(), frame)?;
    let data = payload(frame);
    sink.send(conns, warm, frame, &data)?;
    let (cpu0, me) = (sink.cpu_seconds(), std::process::id());
    let senders0 = cpu_seconds(me);
    let t = Instant::now();
    sink.send(conns, bytes, frame, &data)?;
    let s = secs(t);
    Ok((s, sink.cpu_seconds() - cpu0, cpu_seconds(me) - senders0))
}

/// Reads every partition of a committed shuffle; returns (bytes, seconds, server CPU seconds).
async fn fetch_all(
    cluster: &Cluster,
    client: &ShuffleClient,
    a: &Assignment,
    args: &ShuffleBenchArgs,
) -> anyhow::Result<(u64, f64, f64)> {
    let cpu0 = cpu_seconds(server(cluster).pid());
    let t = Instant::now();
    let bytes = read_batches(client, a, args).await?;
    let s = secs(t);
    Ok((bytes, s, cpu_seconds(server(cluster).pid()) - cpu0))
}

async fn read_batches(
    client: &ShuffleClient,
    a: &Assignment,
    args: &ShuffleBenchArgs,
) -> anyhow::Result<u64> {
    let next = std::sync::atomic::AtomicU32::new(0);
    let worker = || async {
        let mut bytes = 0u64;
        loop {
            let p = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if p >= args.partitions {
                return Ok::<u64, anyhow::Error>(bytes);
            }
            let mut r = client.reader(a, p, 0, args.maps).await?;
            while let Some(b) = r.next_batch().await? {
                bytes += b.len() as u64;
            }
        }
    };
    let mut total = 0;
    for r in futures_util::future::join_all((0..args.readers).map(|_| worker())).await {
        total += r?;
    }
    Ok(total)
}

/// `sluice bench fetch`: the same committed data served by a zero-copy server, by a
/// copy-path server (`transport.zero_copy=false`) and by a TLS server (a throw-away CA; chunks
/// read and encrypted in user space, or by the kernel where it has kTLS), measured one after the
/// other in one run.
pub async fn fetch(args: ShuffleBenchArgs) -> anyhow::Result<()> {
    let mut rows = Vec::new();
    let mut tls_path = "";
    for (name, zero_copy, tls) in
        [("sendfile", true, false), ("copy", false, false), ("tls", true, true)]
    {
        let sets = vec!["chunk_bytes=8388608".into(), format!("transport.zero_copy={zero_copy}")];
        let (cluster, client, a) = one_server(&args, sets, None, tls).await?;
        let pushed = push_batches(&client, &a, &args).await?;
        client.commit_shuffle(&a).await?;
        let (bytes, s, cpu) = fetch_all(&cluster, &client, &a, &args).await?;
        anyhow::ensure!(bytes == pushed, "{name}: read {bytes} of {pushed} bytes");
        if tls {
            // The TLS row sends with sendfile only on kTLS connections (the kernel encrypting).
            let m = |k| crate::cluster::metric(server(&cluster), k);
            let ktls = m("sluice_server_ktls_connections_total");
            let plain = m("sluice_server_sendfile_bytes_total");
            anyhow::ensure!(ktls > 0 || plain == 0, "tls: {plain} bytes went out with sendfile");
            tls_path = if ktls > 0 {
                "kTLS (sendfile, the kernel encrypts)"
            } else if sluice_transport::ktls_available() {
                "user space (the kernel's kTLS refused: see the server's log)"
            } else {
                "user space (no kTLS in this kernel)"
            };
        }
        rows.push((name, bytes as f64 / s / 1e9, cpu / (bytes as f64 / 1e9)));
    }
    let (z, c, t) = (rows[0], rows[1], rows[2]);
    let out = json!({
        "bench": "fetch",
        "bytes": args.bytes,
        "zero_copy_gbps": z.1, "copy_gbps": c.1, "tls_gbps": t.1,
        "zero_copy_server_cpu_s_per_gb": z.2, "copy_server_cpu_s_per_gb": c.2,
        "tls_server_cpu_s_per_gb": t.2,
        "speedup": z.1 / c.1, "cpu_ratio": z.2 / c.2.max(1e-9),
        "tls_vs_zero_copy": t.1 / z.1, "tls_cpu_ratio": t.2 / z.2.max(1e-9),
        "tls_path": tls_path,
        "readers": args.readers,
    });
    if args.json {
        println!("{out}");
    } else {
        println!(
            "bench fetch: {:.2} GiB committed, {} readers, one server each",
            args.bytes as f64 / (1u64 << 30) as f64,
            args.readers
        );
        println!("  {:<9} {:>8} {:>14}", "path", "GB/s", "server CPU s/GB");
        for (n, g, cpu) in &rows {
            println!("  {n:<9} {g:>8.2} {cpu:>14.3}");
        }
        println!("  sendfile/copy {:>6.2}x {:>13.2}x", z.1 / c.1, z.2 / c.2.max(1e-9));
        println!("  tls/sendfile  {:>6.2}x {:>13.2}x", t.1 / z.1, t.2 / z.2.max(1e-9));
        println!("  tls path: {}", out["tls_path"].as_str().unwrap_or(""));
    }
    Ok(())
}

/// Flags of `sluice bench read`.
#[derive(Args, Debug, Clone)]
pub struct ReadArgs {
    /// The coordinator that assigned the shuffle (host:port).
    #[arg(long)]
    pub coordinator: String,
    /// The application the shuffle belongs to.
    #[arg(long)]
    pub app: String,
    /// The committed shuffle to read.
    #[arg(long)]
    pub shuffle: u32,
    /// Its map count: every partition is read over maps `[0, maps)`.
    #[arg(long)]
    pub maps: u32,
    /// Partitions read at once.
    #[arg(long, default_value_t = 1)]
    pub readers: usize,
}

/// `sluice bench read`: reads every partition of a shuffle another client pushed and committed
/// (the JVM reader's baseline in `bench/jvm`, on the same shuffle in the same run). Prints one
/// JSON object: bytes, GB/s and this process's CPU seconds per GB, counted over the reads only.
pub async fn read(args: ReadArgs) -> anyhow::Result<()> {
    let opts = sluice_client::ClientOptions {
        coordinators: vec![args.coordinator.clone()],
        ..Default::default()
    };
    let client = ShuffleClient::new(args.app.clone(), opts);
    let get =
        sluice_proto::message::GetAssignment { app_id: args.app.clone(), shuffle_id: args.shuffle };
    let sluice_proto::message::Message::Assignment(a) =
        client.coordinator_request(get.into()).await?
    else {
        anyhow::bail!("the coordinator answered GetAssignment with something else");
    };
    let partitions = a.partitions.len() as u32;
    let shape = ShuffleBenchArgs {
        bytes: 0,
        maps: args.maps,
        partitions,
        batch_bytes: 1,
        memory_budget: 0,
        readers: args.readers.max(1),
        json: true,
    };
    let pid = std::process::id();
    let cpu0 = cpu_seconds(pid);
    let t = Instant::now();
    let bytes = read_batches(&client, &a, &shape).await?;
    let s = secs(t);
    let cpu = cpu_seconds(pid) - cpu0;
    println!(
        "{}",
        json!({
            "bench": "read",
            "bytes": bytes,
            "seconds": s,
            "gbps": bytes as f64 / s / 1e9,
            "cpu_s_per_gb": cpu / (bytes.max(1) as f64 / 1e9),
            "partitions": partitions,
            "readers": shape.readers,
        })
    );
    Ok(())
}
