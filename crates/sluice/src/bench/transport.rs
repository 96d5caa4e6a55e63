//! `sluice bench transport`: the transport's two fast paths, each beside its baseline in the same
//! run, with the server in a separate process (this binary re-executed as the hidden
//! `sluice bench transport-server`) over loopback:
//!
//! - **file bodies**: a page-cached file served in chunks (`FetchChunk` → `ChunkData` with a
//!   file-region body) by a zero-copy server (`sendfile`) and by a copy-path server (`pread` +
//!   `write`): GB/s and the server process's CPU seconds per GB (`getrusage` in the child);
//!   beside them the **kernel's own ceiling**: the same chunks streamed by a plain blocking
//!   loop (no runtime, no framing, no requests) with `sendfile` and with `pread` + `write`, so a
//!   gap between the two paths can be told apart from overhead of ours;
//! - **small frames**: 1 KiB frames pushed one way through the transport's writer, batched
//!   (many frames per `writev`) and one write per frame: messages per second.
//!
//! The child talks to the parent over stdin/stdout: it prints `ports <zero-copy> <copy> <sink> <raw>`
//! once, then answers `cpu` with `cpu <seconds>` and `stats` with `stats <json>`; it exits when
//! stdin closes.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bytes::Bytes;
use serde::Serialize;
use sluice_proto::message::{
    ChunkData, FetchChunk, Handshake, Ping, FEATURE_CRC32C, MAGIC, PROTOCOL_VERSION,
};
use sluice_proto::{encode_frame, ErrorCode, Message, DEFAULT_MAX_FRAME_BYTES};
use sluice_transport::{
    serve, Body, ClientConfig, ConnInfo, Connection, FileRegion, FrameReader, Handler, OutFrame,
    Outbound, Request, Response, ServerConfig, TransportStats, WriterOptions,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Options of `sluice bench transport`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Size of the served file, GiB (created in a temp dir and read once to warm the cache).
    #[arg(long, default_value_t = 1.0)]
    pub file_gib: f64,
    /// Chunk (body) size of the file test, MiB.
    #[arg(long, default_value_t = 4)]
    pub chunk_mib: u64,
    /// Passes over the file per measurement.
    #[arg(long, default_value_t = 3)]
    pub passes: u32,
    /// Chunk requests in flight at once on each connection. A real reader prefetches (the
    /// client's default is 4); here 2 moved the most bytes: with 1 each connection idles for a
    /// round trip per chunk, and deeper queues fill the client's receive queue with page-cache
    /// fragments that the kernel collapses (docs/benchmarks-log.md#transport-quiet).
    #[arg(long, default_value_t = 2)]
    pub pipeline: usize,
    /// Measurements of each mode (alternating); the best of each is reported.
    #[arg(long, default_value_t = 3)]
    pub rounds: u32,
    /// Small frames sent per small-frame measurement.
    #[arg(long, default_value_t = 2_000_000)]
    pub frames: u64,
    /// Body bytes of each small frame.
    #[arg(long, default_value_t = 1024)]
    pub frame_bytes: usize,
    /// Frames per `writev` in the batched run.
    #[arg(long, default_value_t = 64)]
    pub batch: usize,
    /// Client connections of the file test (each with `--pipeline` requests in flight).
    #[arg(long, default_value_t = 2)]
    pub connections: usize,
    /// Fetch through `Connection` (a fresh buffer per body, as a real reader would) instead of
    /// the lean reader that reuses one scratch buffer.
    #[arg(long)]
    pub client_connection: bool,
    /// Directory for the temp file (default: the system temp dir).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Address the server child listens on and the client connects to. Loopback by default;
    /// with `--server-prefix`, an address in another network namespace, so that the receiving
    /// side's work is not done on the server's CPU (bench/transport/two-hosts.sh).
    #[arg(long, default_value_t = IpAddr::V4(Ipv4Addr::LOCALHOST))]
    pub server_ip: IpAddr,
    /// A command to start the server child under, split on whitespace (for example
    /// `ip netns exec sluice-b taskset -c 0`).
    #[arg(long)]
    pub server_prefix: Option<String>,
    /// Also serve the file cold: before each measurement its pages are dropped from the page
    /// cache; one pass is fetched from a zero-copy server that reads cold regions in on its
    /// blocking pool and from one that leaves them to `sendfile`, while another connection
    /// pings the same server every millisecond (the file must be on a disk, not tmpfs).
    #[arg(long)]
    pub cold: bool,
    /// `SO_SNDBUF` of the server child's sockets, bytes (all its servers, the kernel loop
    /// included). Unset: the kernel's autotuning (up to `net.ipv4.tcp_wmem`'s maximum); the
    /// kernel doubles the value and caps it at `net.core.wmem_max`.
    #[arg(long)]
    pub server_send_buffer: Option<usize>,
}

/// Options of the hidden server child.
#[derive(clap::Args, Debug)]
pub struct ServerArgs {
    /// The file to serve.
    #[arg(long)]
    pub file: PathBuf,
    /// Chunk size, bytes.
    #[arg(long)]
    pub chunk_bytes: u64,
    /// Address to listen on.
    #[arg(long, default_value_t = IpAddr::V4(Ipv4Addr::LOCALHOST))]
    pub bind: IpAddr,
    /// `SO_SNDBUF` of accepted sockets, bytes (unset: the kernel's autotuning).
    #[arg(long)]
    pub send_buffer_bytes: Option<usize>,
}

/// Everything one run measured (the `--json` output).
#[derive(Debug, Serialize)]
struct Results {
    file_bytes: u64,
    chunk_bytes: u64,
    passes: u32,
    pipeline: usize,
    connections: usize,
    zero_copy_gbps: f64,
    copy_gbps: f64,
    zero_copy_server_cpu_s_per_gb: f64,
    copy_server_cpu_s_per_gb: f64,
    /// zero_copy_gbps / copy_gbps.
    zero_copy_speedup: f64,
    /// zero-copy CPU per GB / copy CPU per GB (lower is better).
    zero_copy_cpu_ratio: f64,
    /// The client process's CPU per GB in the same rounds. On loopback the receive path and
    /// part of the send path (segments sent when the receiver's ACKs arrive) run in whichever
    /// process's context gets there first, so the split between the two shifts with how each
    /// side waits; the sum is the cost of moving the bytes.
    zero_copy_client_cpu_s_per_gb: f64,
    copy_client_cpu_s_per_gb: f64,
    /// The kernel baseline: a blocking loop streaming the same chunks with `sendfile` and with
    /// `pread` + `write` (256 KiB buffer), read by blocking clients into a 256 KiB buffer.
    raw_sendfile_gbps: f64,
    raw_copy_gbps: f64,
    raw_sendfile_server_cpu_s_per_gb: f64,
    raw_copy_server_cpu_s_per_gb: f64,
    raw_sendfile_client_cpu_s_per_gb: f64,
    raw_copy_client_cpu_s_per_gb: f64,
    frame_body_bytes: usize,
    frames: u64,
    batch: usize,
    batched_msgs_per_s: f64,
    unbatched_msgs_per_s: f64,
    /// batched / unbatched.
    batching_speedup: f64,
    /// Server counters: bytes the zero-copy server sent with sendfile and with the copy path,
    /// and the same for the copy-path server (a check that each ran the path it claims).
    zero_copy_server_sendfile_bytes: u64,
    zero_copy_server_copy_bytes: u64,
    copy_server_sendfile_bytes: u64,
    copy_server_copy_bytes: u64,
    /// Mean bytes moved per `sendfile` call (socket-buffer sized when the client keeps up).
    sendfile_bytes_per_call: u64,
    /// Chunks of the (meant to be cached) file passes that the zero-copy server found not all
    /// in the page cache and read in first (the host evicting idle page cache between passes).
    zero_copy_server_cold_regions: u64,
    zero_copy_server_cold_region_bytes: u64,
    /// With `--cold`: the cold-file measurement.
    cold: Option<ColdResults>,
    /// Where the server ran: its address and the command it was started under, if any.
    server_ip: String,
    server_prefix: Option<String>,
    /// `--server-send-buffer`, if given.
    server_send_buffer_bytes: Option<usize>,
    /// 1-minute load average before and after the run (other work on the machine).
    loadavg_before: String,
    loadavg_after: String,
}

/// Runs the benchmark and prints its results.
pub fn run(args: Args) -> anyhow::Result<()> {
    if args.chunk_mib == 0
        || args.pipeline == 0
        || args.connections == 0
        || args.batch == 0
        || args.batch > 512
    {
        bail!("--chunk-mib and --pipeline must be positive and --batch in 1..=512");
    }
    let loadavg_before = loadavg();
    let dir = match &args.dir {
        Some(d) => tempfile::tempdir_in(d),
        None => tempfile::tempdir(),
    }
    .context("creating a temp dir")?;
    let path = dir.path().join("bench-transport.dat");
    let chunk_bytes = args.chunk_mib << 20;
    let file_bytes =
        ((args.file_gib * (1u64 << 30) as f64) as u64).div_ceil(chunk_bytes).max(1) * chunk_bytes;
    progress(
        &args,
        &format!("writing and warming a {} MiB file in {}", file_bytes >> 20, dir.path().display()),
    );
    write_file(&path, file_bytes)?;
    warm(&path)?;

    let mut child = ServerChild::spawn(&path, chunk_bytes, &args)?;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let result = rt.block_on(async {
        let mut r = measure(&args, &mut child, file_bytes, chunk_bytes).await?;
        if args.cold {
            r.cold = Some(measure_cold(&args, &mut child, &path, file_bytes, chunk_bytes).await?);
        }
        anyhow::Ok(r)
    });
    child.stop();
    let mut r = result?;
    r.server_ip = args.server_ip.to_string();
    r.server_prefix = args.server_prefix.clone();
    r.server_send_buffer_bytes = args.server_send_buffer;
    r.loadavg_before = loadavg_before;
    r.loadavg_after = loadavg();
    if args.json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        print_table(&r);
    }
    Ok(())
}

async fn measure(
    args: &Args,
    child: &mut ServerChild,
    file_bytes: u64,
    chunk_bytes: u64,
) -> anyhow::Result<Results> {
    let (zc_addr, copy_addr, sink_addr) = child.addrs;
    let chunks = file_bytes / chunk_bytes;
    let total_chunks = chunks * args.passes as u64;
    let bytes = total_chunks * chunk_bytes;
    // Per path, the fastest round.
    let (mut zc, mut cp) = (Round::default(), Round::default());
    for round in 0..args.rounds {
        for (zero_copy, addr) in [(true, zc_addr), (false, copy_addr)] {
            let pass =
                fetch_pass(args, addr, total_chunks, chunks, chunk_bytes, args.client_connection);
            let r = Round::measure(child, bytes, pass).await?;
            progress(args, &format!("round {round}: {} {r}", mode(zero_copy)));
            (if zero_copy { &mut zc } else { &mut cp }).keep_faster(r);
        }
    }
    let stats = child.stats_after(bytes * args.rounds as u64)?;

    let (mut raw_sf, mut raw_cp) = (Round::default(), Round::default());
    for round in 0..args.rounds {
        for zero_copy in [true, false] {
            let (raw_addr, n) = (child.raw_addr, args.connections as u64);
            let pass = async {
                tokio::task::block_in_place(|| {
                    let lanes: Vec<_> = (0..n)
                        .map(|c| {
                            let count = total_chunks / n + u64::from(c < total_chunks % n);
                            std::thread::spawn(move || {
                                raw_fetch(raw_addr, zero_copy, count, c, n, chunk_bytes)
                            })
                        })
                        .collect();
                    for lane in lanes {
                        lane.join().map_err(|_| anyhow::anyhow!("raw client panicked"))??;
                    }
                    anyhow::Ok(())
                })
            };
            let r = Round::measure(child, bytes, pass).await?;
            progress(args, &format!("round {round}: kernel loop, {} {r}", mode(zero_copy)));
            (if zero_copy { &mut raw_sf } else { &mut raw_cp }).keep_faster(r);
        }
    }

    let (mut batched, mut unbatched) = (0.0f64, 0.0f64);
    for round in 0..args.rounds {
        for batch in [args.batch, 1] {
            let (cpu0, own0, t) = (child.cpu()?, process_cpu_seconds(), Instant::now());
            let (frames, frame_bytes) = (args.frames, args.frame_bytes);
            // Sender and its writer share one thread (the sink has the other core).
            let rate = tokio::task::block_in_place(|| {
                std::thread::spawn(move || {
                    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
                    rt.block_on(push_frames(sink_addr, frames, frame_bytes, batch))
                })
                .join()
                .map_err(|_| anyhow::anyhow!("sender thread panicked"))
            })??;
            let secs = t.elapsed().as_secs_f64();
            let (sink, own) = ((child.cpu()? - cpu0) / secs, (process_cpu_seconds() - own0) / secs);
            progress(
                args,
                &format!(
                    "round {round}: {batch} frames/writev: {:.2} M msg/s (sender {:.0}% CPU, sink {:.0}%)",
                    rate / 1e6,
                    own * 100.0,
                    sink * 100.0
                ),
            );
            let best = if batch == 1 { &mut unbatched } else { &mut batched };
            *best = best.max(rate);
        }
    }

    Ok(Results {
        file_bytes,
        chunk_bytes,
        passes: args.passes,
        pipeline: args.pipeline,
        connections: args.connections,
        zero_copy_gbps: zc.gbps,
        copy_gbps: cp.gbps,
        zero_copy_server_cpu_s_per_gb: zc.server_cpu_s_per_gb,
        copy_server_cpu_s_per_gb: cp.server_cpu_s_per_gb,
        zero_copy_speedup: zc.gbps / cp.gbps,
        zero_copy_cpu_ratio: zc.server_cpu_s_per_gb / cp.server_cpu_s_per_gb,
        zero_copy_client_cpu_s_per_gb: zc.client_cpu_s_per_gb,
        copy_client_cpu_s_per_gb: cp.client_cpu_s_per_gb,
        raw_sendfile_gbps: raw_sf.gbps,
        raw_copy_gbps: raw_cp.gbps,
        raw_sendfile_server_cpu_s_per_gb: raw_sf.server_cpu_s_per_gb,
        raw_copy_server_cpu_s_per_gb: raw_cp.server_cpu_s_per_gb,
        raw_sendfile_client_cpu_s_per_gb: raw_sf.client_cpu_s_per_gb,
        raw_copy_client_cpu_s_per_gb: raw_cp.client_cpu_s_per_gb,
        frame_body_bytes: args.frame_bytes,
        frames: args.frames,
        batch: args.batch,
        batched_msgs_per_s: batched,
        unbatched_msgs_per_s: unbatched,
        batching_speedup: batched / unbatched,
        zero_copy_server_sendfile_bytes: stats.zero_copy.sendfile_bytes,
        zero_copy_server_copy_bytes: stats.zero_copy.copy_bytes,
        copy_server_sendfile_bytes: stats.copy.sendfile_bytes,
        copy_server_copy_bytes: stats.copy.copy_bytes,
        sendfile_bytes_per_call: stats.zero_copy.sendfile_bytes
            / stats.zero_copy.sendfile_calls.max(1),
        zero_copy_server_cold_regions: stats.zero_copy.file_regions_cold,
        zero_copy_server_cold_region_bytes: stats.zero_copy.file_regions_cold_bytes,
        cold: None,
        server_ip: String::new(),
        server_prefix: None,
        server_send_buffer_bytes: None,
        loadavg_before: String::new(),
        loadavg_after: String::new(),
    })
}

/// One measured pass over a file: its speed and what it cost the server child and this process.
#[derive(Debug, Default, Clone, Copy)]
struct Round {
    gbps: f64,
    server_cpu_s_per_gb: f64,
    client_cpu_s_per_gb: f64,
}

impl Round {
    /// Runs `pass`, which moves `bytes` from the server child to this process, and measures it.
    async fn measure(
        child: &mut ServerChild,
        bytes: u64,
        pass: impl std::future::Future<Output = anyhow::Result<()>>,
    ) -> anyhow::Result<Round> {
        let (server0, client0, t) = (child.cpu()?, process_cpu_seconds(), Instant::now());
        pass.await?;
        let secs = t.elapsed().as_secs_f64();
        let (server, client) = (child.cpu()? - server0, process_cpu_seconds() - client0);
        let gb = bytes as f64 / 1e9;
        Ok(Round {
            gbps: gb / secs,
            server_cpu_s_per_gb: server / gb,
            client_cpu_s_per_gb: client / gb,
        })
    }

    /// Keeps `r` if it is the faster round (the best round is what a run reports).
    fn keep_faster(&mut self, r: Round) {
        if r.gbps > self.gbps {
            *self = r;
        }
    }
}

impl std::fmt::Display for Round {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:.2} GB/s, server {:.3} CPU s/GB (client {:.0}% CPU)",
            self.gbps,
            self.server_cpu_s_per_gb,
            self.client_cpu_s_per_gb * self.gbps * 100.0
        )
    }
}

fn mode(zero_copy: bool) -> &'static str {
    if zero_copy {
        "sendfile"
    } else {
        "copy    "
    }
}

/// The `--cold` measurement (best round's GB/s; ping round trips of all rounds together).
#[derive(Debug, Serialize)]
struct ColdResults {
    /// Cold regions read in on the blocking pool first (the default).
    pool_gbps: f64,
    pool_ping_p50_ms: f64,
    pool_ping_p99_ms: f64,
    pool_ping_max_ms: f64,
    /// Cold regions left to the writer's `sendfile` on the async worker.
    inline_gbps: f64,
    inline_ping_p50_ms: f64,
    inline_ping_p99_ms: f64,
    inline_ping_max_ms: f64,
    /// Regions the pool server found cold and read in (from its counters).
    pool_server_cold_regions: u64,
    /// Bytes the pool server sent with `sendfile` during the cold rounds.
    pool_server_sendfile_bytes: u64,
}

/// Drops the file's pages from the page cache (they are clean: `write_file` synced them) and
/// checks that its first chunk is gone.
fn evict(path: &std::path::Path, chunk_bytes: u64) -> anyhow::Result<()> {
    use std::os::fd::AsRawFd;
    let f = File::open(path)?;
    // SAFETY: plain syscall on an open descriptor; no memory is passed.
    let r = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if r != 0 {
        bail!("posix_fadvise(DONTNEED) failed: {}", std::io::Error::from_raw_os_error(r));
    }
    match FileRegion::new(Arc::new(f), 0, chunk_bytes).is_cached() {
        Some(false) => Ok(()),
        Some(true) => bail!(
            "{} stayed in the page cache after DONTNEED (on tmpfs? use --dir on a disk)",
            path.display()
        ),
        None => bail!("cachestat(2) is unavailable on this kernel; --cold needs it"),
    }
}

/// Pings `addr` every millisecond until `stop` flips; returns the round trips.
async fn ping_loop(
    addr: SocketAddr,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<Vec<f64>> {
    let conn = Connection::connect(addr, &ClientConfig::default()).await?;
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut rtts = Vec::new();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.wait_for(|s| *s) => return Ok(rtts),
        }
        let t = Instant::now();
        conn.request(Message::Ping(Ping {}), Body::Empty).await?;
        rtts.push(t.elapsed().as_secs_f64() * 1e3);
    }
}

/// Median, 99th percentile and maximum of round trips (sorted in place).
fn p50_p99_max(v: &mut [f64]) -> [f64; 3] {
    if v.is_empty() {
        return [f64::NAN; 3];
    }
    v.sort_by(f64::total_cmp);
    [0.5, 0.99, 1.0].map(|q| v[((v.len() - 1) as f64 * q).round() as usize])
}

async fn measure_cold(
    args: &Args,
    child: &mut ServerChild,
    path: &std::path::Path,
    file_bytes: u64,
    chunk_bytes: u64,
) -> anyhow::Result<ColdResults> {
    let chunks = file_bytes / chunk_bytes;
    let before = child.stats()?.zero_copy;
    let (mut best, mut rtts) = ([0.0f64; 2], [Vec::new(), Vec::new()]);
    for round in 0..args.rounds {
        for (i, addr) in [child.addrs.0, child.cold_inline_addr].into_iter().enumerate() {
            evict(path, chunk_bytes)?;
            let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
            let pinger = tokio::spawn(ping_loop(addr, stop_rx));
            let t = Instant::now();
            fetch_pass(args, addr, chunks, chunks, chunk_bytes, false).await?;
            let secs = t.elapsed().as_secs_f64();
            let _ = stop_tx.send(true);
            let mut r = pinger.await??;
            let gbps = file_bytes as f64 / 1e9 / secs;
            let [_, p99, max] = p50_p99_max(&mut r);
            progress(
                args,
                &format!(
                    "round {round}: cold file, {}: {gbps:.2} GB/s, ping p99 {p99:.2} ms, max {max:.2} ms",
                    if i == 0 { "read in on the blocking pool" } else { "left to sendfile" },
                ),
            );
            best[i] = best[i].max(gbps);
            rtts[i].extend(r);
        }
    }
    // The server counts a body once its `sendfile` returns, which may be after the client has
    // it: give the counters a moment to catch up.
    let sent = file_bytes * args.rounds as u64;
    let mut after = child.stats()?.zero_copy;
    for _ in 0..100 {
        if after.sendfile_bytes - before.sendfile_bytes >= sent {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        after = child.stats()?.zero_copy;
    }
    let [mut p, mut l] = rtts;
    let ([p50, p99, pmax], [l50, l99, lmax]) = (p50_p99_max(&mut p), p50_p99_max(&mut l));
    Ok(ColdResults {
        pool_gbps: best[0],
        pool_ping_p50_ms: p50,
        pool_ping_p99_ms: p99,
        pool_ping_max_ms: pmax,
        inline_gbps: best[1],
        inline_ping_p50_ms: l50,
        inline_ping_p99_ms: l99,
        inline_ping_max_ms: lmax,
        pool_server_cold_regions: after.file_regions_cold - before.file_regions_cold,
        pool_server_sendfile_bytes: after.sendfile_bytes - before.sendfile_bytes,
    })
}

/// Fetches `total` chunks from `addr` over `--connections` connections, `--pipeline` in flight
/// on each: connection `c` fetches chunks c, c+n, c+2n, … (n = connections). `client_connection`
/// goes through `Connection` instead of the lean reader.
async fn fetch_pass(
    args: &Args,
    addr: SocketAddr,
    total: u64,
    chunks: u64,
    chunk_bytes: u64,
    client_connection: bool,
) -> anyhow::Result<()> {
    let (n, pipeline) = (args.connections as u64, args.pipeline);
    let lanes: Vec<_> = (0..n)
        .map(|c| {
            let count = total / n + u64::from(c < total % n);
            tokio::spawn(async move {
                if client_connection {
                    fetch_chunks(addr, count, chunks, chunk_bytes, pipeline, c, n).await
                } else {
                    fetch_chunks_lean(addr, count, chunks, chunk_bytes, pipeline, c, n).await
                }
            })
        })
        .collect();
    for lane in lanes {
        lane.await??;
    }
    Ok(())
}

/// Fetches `total` chunks (cycling over the file) through one connection, `pipeline` at a time.
async fn fetch_chunks(
    addr: SocketAddr,
    total: u64,
    chunks: u64,
    chunk_bytes: u64,
    pipeline: usize,
    first: u64,
    stride: u64,
) -> anyhow::Result<()> {
    let chunk = move |i: u64| ((first + i * stride) % chunks) as u32;
    let conn = Arc::new(Connection::connect(addr, &ClientConfig::default()).await?);
    let mut tasks = Vec::new();
    for lane in 0..pipeline as u64 {
        let conn = conn.clone();
        tasks.push(tokio::spawn(async move {
            let mut i = lane;
            while i < total {
                let chunk_index = chunk(i);
                let reply = conn
                    .request(
                        Message::FetchChunk(FetchChunk { stream_id: 1, chunk_index }),
                        Body::Empty,
                    )
                    .await?;
                if reply.body.len() as u64 != chunk_bytes {
                    bail!(
                        "chunk {chunk_index}: {} bytes, expected {chunk_bytes}",
                        reply.body.len()
                    );
                }
                i += pipeline as u64;
            }
            Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}

/// Fetches `total` chunks like [`fetch_chunks`] but reads each body into a reused scratch buffer
/// (the transport's `FrameReader::discard_body`) instead of a fresh buffer per body, so the
/// client's page faults on new 4 MiB buffers do not cap what the server can show.
async fn fetch_chunks_lean(
    addr: SocketAddr,
    total: u64,
    chunks: u64,
    chunk_bytes: u64,
    pipeline: usize,
    first: u64,
    stride: u64,
) -> anyhow::Result<()> {
    let stream = TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let (rd, mut wr) = stream.into_split();
    let hs = Handshake {
        magic: MAGIC,
        version: PROTOCOL_VERSION,
        features: FEATURE_CRC32C,
        max_frame_bytes: DEFAULT_MAX_FRAME_BYTES,
        app_id: String::new(),
        client_nonce: String::new(),
    };
    wr.write_all(&encode_frame(0, &Message::Handshake(hs), &[])).await?;
    let mut reader = FrameReader::new(rd, DEFAULT_MAX_FRAME_BYTES, None);
    match reader.read_head().await? {
        Some((_, Message::HandshakeOk(_))) => {}
        other => bail!("handshake: {other:?}"),
    }
    let request = |i: u64| {
        let chunk_index = ((first + i * stride) % chunks) as u32;
        let m = Message::FetchChunk(FetchChunk { stream_id: 1, chunk_index });
        encode_frame(i as u32, &m, &[])
    };
    let mut sent = 0u64;
    while sent < total.min(pipeline as u64) {
        wr.write_all(&request(sent)).await?;
        sent += 1;
    }
    for _ in 0..total {
        let Some((h, m)) = reader.read_head().await? else { bail!("server closed") };
        if !matches!(m, Message::ChunkData(_)) || h.body_len() as u64 != chunk_bytes {
            bail!("unexpected reply {m:?} with {} body bytes", h.body_len());
        }
        if sent < total {
            wr.write_all(&request(sent)).await?;
            sent += 1;
        }
        reader.discard_body(h.body_len()).await?;
    }
    Ok(())
}

/// The kernel baseline's client: asks the child's raw server for `count` chunks (indexes
/// `first`, `first + stride`, … modulo the file's chunks) sent back to back with `sendfile` or
/// with `pread` + `write`, and reads them with blocking reads into one 256 KiB buffer.
fn raw_fetch(
    addr: SocketAddr,
    zero_copy: bool,
    count: u64,
    first: u64,
    stride: u64,
    chunk_bytes: u64,
) -> anyhow::Result<()> {
    let mut s = std::net::TcpStream::connect(addr)?;
    s.set_nodelay(true)?;
    let mut req = [0u8; 25];
    req[0] = u8::from(zero_copy);
    req[1..9].copy_from_slice(&count.to_be_bytes());
    req[9..17].copy_from_slice(&first.to_be_bytes());
    req[17..25].copy_from_slice(&stride.to_be_bytes());
    s.write_all(&req)?;
    let mut buf = vec![0u8; RAW_BUF];
    let (want, mut got) = (count * chunk_bytes, 0u64);
    while got < want {
        let n = s.read(&mut buf)?;
        if n == 0 {
            bail!("raw server closed after {got} of {want} bytes");
        }
        got += n as u64;
    }
    Ok(())
}

/// Buffer of the kernel baseline's copy loop and clients (the transport's copy buffer and the
/// lean reader's scratch are this size too).
const RAW_BUF: usize = 256 << 10;

/// The kernel baseline's server: one blocking thread per connection.
fn raw_serve(
    listener: std::net::TcpListener,
    file: Arc<File>,
    chunk_bytes: u64,
    send_buffer: Option<usize>,
) {
    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        if let Some(n) = send_buffer {
            if let Err(e) = socket2::SockRef::from(&stream).set_send_buffer_size(n) {
                tracing::warn!(error = %e, "SO_SNDBUF on a kernel-loop connection");
            }
        }
        let file = file.clone();
        std::thread::spawn(move || {
            if let Err(e) = raw_conn(stream, &file, chunk_bytes) {
                tracing::warn!(error = %e, "raw connection failed");
            }
        });
    }
}

fn raw_conn(mut s: std::net::TcpStream, file: &File, chunk_bytes: u64) -> anyhow::Result<()> {
    use std::os::unix::fs::FileExt;
    s.set_nodelay(true)?;
    let mut req = [0u8; 25];
    s.read_exact(&mut req)?;
    let word = |i: usize| u64::from_be_bytes(req[i..i + 8].try_into().expect("8 bytes"));
    let (zero_copy, count, first, stride) = (req[0] == 1, word(1), word(9), word(17));
    let chunks = (file.metadata()?.len() / chunk_bytes).max(1);
    let mut buf = vec![0u8; RAW_BUF];
    for i in 0..count {
        let start = ((first + i * stride) % chunks) * chunk_bytes;
        let (mut off, end) = (start, start + chunk_bytes);
        while off < end {
            if zero_copy {
                // Blocking socket: sendfile returns after moving what the send buffer took and
                // advances `off` itself.
                let want = (end - off) as usize;
                let n = rustix::fs::sendfile(&s, file, Some(&mut off), want)
                    .map_err(std::io::Error::from)?;
                if n == 0 {
                    bail!("sendfile returned 0 at offset {off}: file shorter than expected");
                }
            } else {
                let want = ((end - off) as usize).min(buf.len());
                let n = file.read_at(&mut buf[..want], off)?;
                if n == 0 {
                    bail!("pread returned 0 at offset {off}");
                }
                s.write_all(&buf[..n])?;
                off += n as u64;
            }
        }
    }
    Ok(())
}

/// Pushes `frames` frames of `frame_bytes` body one way into the child's sink through the
/// transport's writer with at most `batch` frames per `writev`; returns messages per second.
async fn push_frames(
    addr: SocketAddr,
    frames: u64,
    frame_bytes: usize,
    batch: usize,
) -> anyhow::Result<f64> {
    let stream = TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let (mut rd, mut wr) = stream.into_split();
    wr.write_all(&frames.to_be_bytes()).await?;
    let opts = WriterOptions {
        max_frames_per_write: batch,
        ..WriterOptions::from(&ClientConfig::default())
    };
    let stats = Arc::new(TransportStats::default());
    let (outbound, writer) = Outbound::start(wr, opts, stats.clone());
    let body = Bytes::from(vec![0x5a; frame_bytes]);
    let message = Message::ChunkData(ChunkData { stream_id: 7, chunk_index: 0 });
    let t = Instant::now();
    for i in 0..frames {
        let frame = OutFrame::new(i as u32, &message, Body::Memory(body.clone()), u32::MAX)?;
        outbound.send(frame).await?;
    }
    let mut ack = [0u8; 8];
    rd.read_exact(&mut ack).await.context("waiting for the sink's count")?;
    let secs = t.elapsed().as_secs_f64();
    if u64::from_be_bytes(ack) != frames {
        bail!("the sink counted {} frames, expected {frames}", u64::from_be_bytes(ack));
    }
    outbound.close();
    writer.await??;
    let s = stats.snapshot();
    if batch == 1 && s.writev_calls < frames {
        bail!("one write per frame expected, got {} writes for {frames} frames", s.writev_calls);
    }
    Ok(frames as f64 / secs)
}

/// The child process, seen from the parent.
struct ServerChild {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    addrs: (SocketAddr, SocketAddr, SocketAddr),
    raw_addr: SocketAddr,
    /// A zero-copy server that leaves cold regions to `sendfile` (the `--cold` baseline).
    cold_inline_addr: SocketAddr,
}

#[derive(serde::Deserialize)]
struct ChildStats {
    zero_copy: CountersJson,
    copy: CountersJson,
}

#[derive(serde::Deserialize)]
struct CountersJson {
    sendfile_bytes: u64,
    sendfile_calls: u64,
    copy_bytes: u64,
    file_regions_cold: u64,
    file_regions_cold_bytes: u64,
}

impl ServerChild {
    fn spawn(path: &std::path::Path, chunk_bytes: u64, args: &Args) -> anyhow::Result<ServerChild> {
        let ip = args.server_ip;
        let exe = std::env::current_exe()?;
        let mut words = args.server_prefix.as_deref().unwrap_or("").split_whitespace();
        let mut cmd = match words.next() {
            Some(program) => {
                let mut c = Command::new(program);
                c.args(words).arg(exe);
                c
            }
            None => Command::new(exe),
        };
        let mut child = cmd
            .args(["bench", "transport-server", "--chunk-bytes", &chunk_bytes.to_string()])
            .args(["--bind", &ip.to_string(), "--file"])
            .arg(path)
            .args(args.server_send_buffer.map(|n| format!("--send-buffer-bytes={n}")))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("starting the server child")?;
        let stdin = child.stdin.take();
        let mut stdout = BufReader::new(child.stdout.take().context("child stdout")?);
        let mut line = String::new();
        stdout.read_line(&mut line)?;
        let ports: Vec<u16> = line
            .strip_prefix("ports ")
            .context("child's ports line")?
            .split_whitespace()
            .map(str::parse)
            .collect::<Result<_, _>>()?;
        let [a, b, c, d, e] = ports[..] else { bail!("child printed {line:?}") };
        let at = |p: u16| SocketAddr::new(ip, p);
        Ok(ServerChild {
            child,
            stdin,
            stdout,
            addrs: (at(a), at(b), at(c)),
            raw_addr: at(d),
            cold_inline_addr: at(e),
        })
    }

    fn ask(&mut self, what: &str) -> anyhow::Result<String> {
        let stdin = self.stdin.as_mut().context("child stdin")?;
        writeln!(stdin, "{what}")?;
        stdin.flush()?;
        let mut line = String::new();
        self.stdout.read_line(&mut line)?;
        let answer = line.trim_end().strip_prefix(what).context("child's answer")?;
        Ok(answer.trim().to_string())
    }

    fn cpu(&mut self) -> anyhow::Result<f64> {
        Ok(self.ask("cpu")?.parse()?)
    }

    /// The counters once both fetch servers have counted `bytes` each (a server counts a
    /// frame's bytes after its write returns, which can be after the reader got them), or as
    /// they stand after a second.
    fn stats_after(&mut self, bytes: u64) -> anyhow::Result<ChildStats> {
        let deadline = Instant::now() + Duration::from_secs(1);
        loop {
            let s = self.stats()?;
            let sent = |c: &CountersJson| c.sendfile_bytes + c.copy_bytes;
            if (sent(&s.zero_copy) >= bytes && sent(&s.copy) >= bytes) || Instant::now() > deadline
            {
                return Ok(s);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn stats(&mut self) -> anyhow::Result<ChildStats> {
        Ok(serde_json::from_str(&self.ask("stats")?)?)
    }

    fn stop(mut self) {
        drop(self.stdin.take());
        let _ = self.child.wait();
    }
}

/// The child: a zero-copy server, a copy-path server, a frame sink and the kernel baseline's
/// blocking server on loopback.
pub fn run_server(args: ServerArgs) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let file = Arc::new(File::open(&args.file)?);
    let file_len = file.metadata()?.len();
    let handler = Arc::new(ChunkServer { file, file_len, chunk_bytes: args.chunk_bytes });
    let zc_stats = Arc::new(TransportStats::default());
    let copy_stats = Arc::new(TransportStats::default());
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let ports = rt.block_on(async {
        let zc = TcpListener::bind((args.bind, 0)).await?;
        let cp = TcpListener::bind((args.bind, 0)).await?;
        let sink = TcpListener::bind((args.bind, 0)).await?;
        let inline = TcpListener::bind((args.bind, 0)).await?;
        let ports = [&zc, &cp, &sink, &inline].map(|l| l.local_addr().map(|a| a.port()));
        // The zero-copy server, the copy server, and a zero-copy server that leaves cold
        // regions to `sendfile` (its own counters: the `--cold` baseline).
        for (listener, zero_copy, cold_on_pool, stats) in [
            (zc, true, true, zc_stats.clone()),
            (cp, false, true, copy_stats.clone()),
            (inline, true, false, Arc::new(TransportStats::default())),
        ] {
            let cfg = ServerConfig {
                zero_copy,
                cold_regions_on_blocking_pool: cold_on_pool,
                send_buffer_bytes: args.send_buffer_bytes,
                ..ServerConfig::default()
            };
            let mut stop = stop_rx.clone();
            tokio::spawn(serve(listener, handler.clone(), cfg, stats, async move {
                let _ = stop.wait_for(|s| *s).await;
            }));
        }
        tokio::spawn(sink_loop(sink));
        anyhow::Ok(ports)
    })?;
    let raw = std::net::TcpListener::bind((args.bind, 0))?;
    let raw_port = raw.local_addr()?.port();
    let raw_file = Arc::new(File::open(&args.file)?);
    let send_buffer = args.send_buffer_bytes;
    std::thread::spawn(move || raw_serve(raw, raw_file, args.chunk_bytes, send_buffer));
    let mut out = std::io::stdout().lock();
    let [zc, cp, sink, inline] = ports;
    writeln!(out, "ports {} {} {} {raw_port} {}", zc?, cp?, sink?, inline?)?;
    out.flush()?;
    for line in std::io::stdin().lock().lines() {
        match line?.trim() {
            "cpu" => writeln!(out, "cpu {}", process_cpu_seconds())?,
            "stats" => {
                let (z, c) = (zc_stats.snapshot(), copy_stats.snapshot());
                let j = serde_json::json!({ "zero_copy": z, "copy": c });
                writeln!(out, "stats {j}")?
            }
            other => writeln!(out, "unknown {other}")?,
        }
        out.flush()?;
    }
    let _ = stop_tx.send(true);
    rt.shutdown_timeout(std::time::Duration::from_secs(2));
    Ok(())
}

/// Serves `FetchChunk{chunk_index}` with the file region of that chunk.
struct ChunkServer {
    file: Arc<File>,
    file_len: u64,
    chunk_bytes: u64,
}

impl Handler for ChunkServer {
    type Permit = ();

    fn handle(
        &self,
        _conn: &Arc<ConnInfo>,
        req: Request,
    ) -> impl std::future::Future<Output = Response> + Send + 'static {
        let resp = match req.message {
            Message::FetchChunk(FetchChunk { stream_id, chunk_index }) => {
                let offset = chunk_index as u64 * self.chunk_bytes;
                if offset >= self.file_len {
                    Response::error(ErrorCode::ChunkOutOfRange, format!("chunk {chunk_index}"))
                } else {
                    let len = self.chunk_bytes.min(self.file_len - offset);
                    let region = FileRegion::new(self.file.clone(), offset, len);
                    Response::with_body(ChunkData { stream_id, chunk_index }, Body::File(region))
                }
            }
            _ => Response::error(ErrorCode::InvalidRequest, "only FetchChunk here"),
        };
        std::future::ready(resp)
    }
}

/// Each sink connection: an 8-byte frame count, then that many frames (decoded, bodies read
/// into their own buffers like a server would), then the count is written back.
async fn sink_loop(listener: TcpListener) {
    while let Ok((stream, _)) = listener.accept().await {
        tokio::spawn(async move {
            if let Err(e) = sink_conn(stream).await {
                tracing::warn!(error = %e, "sink connection failed");
            }
        });
    }
}

async fn sink_conn(stream: TcpStream) -> anyhow::Result<()> {
    stream.set_nodelay(true)?;
    let (mut rd, mut wr) = stream.into_split();
    let mut n = [0u8; 8];
    rd.read_exact(&mut n).await?;
    let want = u64::from_be_bytes(n);
    let mut reader = FrameReader::new(rd, u32::MAX, None);
    let mut got = 0u64;
    while got < want {
        let Some((h, _message)) = reader.read_head().await? else {
            bail!("sink: peer left after {got} frames")
        };
        let body = reader.read_body(h.body_len()).await?;
        std::hint::black_box(body);
        got += 1;
    }
    wr.write_all(&got.to_be_bytes()).await?;
    Ok(())
}

/// User + system CPU seconds of this process.
fn process_cpu_seconds() -> f64 {
    // SAFETY: getrusage writes into the zeroed struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return f64::NAN;
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

fn write_file(path: &std::path::Path, len: u64) -> anyhow::Result<()> {
    let mut f = File::create(path)?;
    let mut block = vec![0u8; 4 << 20];
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    for b in block.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        b.copy_from_slice(&x.to_le_bytes()[..b.len()]);
    }
    let mut left = len;
    while left > 0 {
        let n = left.min(block.len() as u64) as usize;
        f.write_all(&block[..n])?;
        left -= n as u64;
    }
    f.sync_data()?;
    Ok(())
}

/// Reads the file once so the measurement sees it in the page cache.
fn warm(path: &std::path::Path) -> anyhow::Result<()> {
    let mut f = File::open(path)?;
    let mut buf = vec![0u8; 4 << 20];
    while f.read(&mut buf)? > 0 {}
    Ok(())
}

/// The load averages (1, 5, 15 minutes), as `/proc/loadavg` gives them.
pub(crate) fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn progress(args: &Args, text: &str) {
    if !args.json {
        eprintln!("  {text}");
    }
}

fn print_table(r: &Results) {
    match &r.server_prefix {
        None => {
            println!("sluice bench transport — server in a separate process at {}", r.server_ip)
        }
        Some(p) => println!(
            "sluice bench transport — server in a separate process at {}, started under `{p}`",
            r.server_ip
        ),
    }
    println!(
        "file bodies: {} MiB file (page cache), {} MiB chunks, {} passes, {} connections × {} in flight, server SO_SNDBUF {}",
        r.file_bytes >> 20,
        r.chunk_bytes >> 20,
        r.passes,
        r.connections,
        r.pipeline,
        r.server_send_buffer_bytes.map_or("autotuned".to_string(), |n| format!("{n} bytes")),
    );
    println!("  {:<22} {:>10} {:>18} {:>18}", "path", "GB/s", "server CPU s/GB", "client CPU s/GB");
    let row = |name: &str, gbps: f64, server: f64, client: f64| {
        println!("  {name:<22} {gbps:>10.2} {server:>18.3} {client:>18.3}")
    };
    row(
        "sendfile (zero copy)",
        r.zero_copy_gbps,
        r.zero_copy_server_cpu_s_per_gb,
        r.zero_copy_client_cpu_s_per_gb,
    );
    row(
        "pread + write (copy)",
        r.copy_gbps,
        r.copy_server_cpu_s_per_gb,
        r.copy_client_cpu_s_per_gb,
    );
    println!(
        "  {:<22} {:>10.2}x {:>17.2}x",
        "zero copy / copy", r.zero_copy_speedup, r.zero_copy_cpu_ratio
    );
    println!(
        "  (sendfile moved {} KiB per call on average; {} of the chunks were not all cached and \
         were read in first)",
        r.sendfile_bytes_per_call >> 10,
        r.zero_copy_server_cold_regions
    );
    println!("  kernel baseline: a blocking loop streaming the same chunks, no runtime or framing");
    row(
        "loop: sendfile",
        r.raw_sendfile_gbps,
        r.raw_sendfile_server_cpu_s_per_gb,
        r.raw_sendfile_client_cpu_s_per_gb,
    );
    row(
        "loop: pread + write",
        r.raw_copy_gbps,
        r.raw_copy_server_cpu_s_per_gb,
        r.raw_copy_client_cpu_s_per_gb,
    );
    println!(
        "  {:<22} {:>10.2}x {:>17.2}x",
        "loop sendfile / copy",
        r.raw_sendfile_gbps / r.raw_copy_gbps,
        r.raw_sendfile_server_cpu_s_per_gb / r.raw_copy_server_cpu_s_per_gb
    );
    if let Some(c) = &r.cold {
        println!(
            "cold file (pages dropped before each pass), sendfile, a ping every ms meanwhile:"
        );
        println!(
            "  {:<34} {:>6} {:>10} {:>10} {:>10}",
            "cold regions", "GB/s", "ping p50", "p99", "max ms"
        );
        for (what, g, p50, p99, max) in [
            (
                "read in on the blocking pool",
                c.pool_gbps,
                c.pool_ping_p50_ms,
                c.pool_ping_p99_ms,
                c.pool_ping_max_ms,
            ),
            (
                "left to sendfile (async worker)",
                c.inline_gbps,
                c.inline_ping_p50_ms,
                c.inline_ping_p99_ms,
                c.inline_ping_max_ms,
            ),
        ] {
            println!("  {what:<34} {g:>6.2} {p50:>10.2} {p99:>10.2} {max:>10.2}");
        }
        println!("  ({} regions were cold when queued)", c.pool_server_cold_regions);
    }
    println!("small frames: {} frames of {} B body", r.frames, r.frame_body_bytes);
    println!("  {:<22} {:>14}", "writer", "M msg/s");
    println!(
        "  {:<22} {:>14.2}",
        format!("{} frames per writev", r.batch),
        r.batched_msgs_per_s / 1e6
    );
    println!("  {:<22} {:>14.2}", "one write per frame", r.unbatched_msgs_per_s / 1e6);
    println!("  {:<22} {:>13.2}x", "batched / one each", r.batching_speedup);
    println!("load average before / after: {} / {}", r.loadavg_before, r.loadavg_after);
}
