//! Shared harness of the `sluice` integration tests: real `sluice coordinator` / `sluice server`
//! processes on 127.0.0.1 port 0 (killed on drop), clients wired to them, raw frames, record
//! payloads that name their map and attempt, `/proc` memory figures and the metrics endpoint.
//! Starting and watching the processes is `sluice-testkit`'s, shared with `sluice local`; this
//! file makes its failures test failures.
//!
//! Everything that waits is bounded: process start (20 s), registration, metrics scrapes and
//! every test body (see [`bounded`]).
#![allow(dead_code)]

pub mod openapi;
pub mod tier;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use sluice_client::{ClientError, ClientOptions, PartitionReader, ShuffleClient};
use sluice_proto::message::*;
use sluice_proto::{ErrorCode, Message};
use sluice_testkit::Launcher;
use sluice_transport::{Body, ClientConfig, Connection, TransportError};

// Each test binary compiles this file and uses part of it (hence also `dead_code` above).
#[allow(unused_imports)]
pub use sluice_testkit::{metric, ServerSpec};

/// Runs a test body with a deadline; a hang becomes a failure that names the test.
pub async fn bounded<T>(what: &str, secs: u64, f: impl std::future::Future<Output = T>) -> T {
    match tokio::time::timeout(Duration::from_secs(secs), f).await {
        Ok(v) => v,
        Err(_) => panic!("{what}: did not finish within {secs} s"),
    }
}

/// Runs `sluice ARGS` to completion within `limit` (killed and failed past it) and returns its
/// output, asserting it exited successfully.
pub fn run_sluice(args: &[&std::ffi::OsStr], limit: Duration) -> std::process::Output {
    let what = args.iter().map(|a| a.to_string_lossy()).collect::<Vec<_>>().join(" ");
    let mut child = Command::new(sluice_bin())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawning sluice {what}: {e}"));
    let start = std::time::Instant::now();
    while child.try_wait().expect("waiting for sluice").is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("sluice {what} did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().expect("sluice output");
    assert!(
        out.status.success(),
        "sluice {what} failed: {}\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The `sluice` binary under test.
pub fn sluice_bin() -> &'static str {
    env!("CARGO_BIN_EXE_sluice")
}

/// A child `sluice` process (see [`sluice_testkit::Proc`]: SIGKILLed and reaped on drop, its
/// stderr in a log file), with the scrape of its metrics endpoint made async.
pub struct Proc(sluice_testkit::Proc);

impl std::ops::Deref for Proc {
    type Target = sluice_testkit::Proc;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::DerefMut for Proc {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl Proc {
    /// Scrapes the child's metrics endpoint (bounded to 5 s).
    pub async fn metrics(&self) -> HashMap<String, f64> {
        let addr = self.0.metrics.expect("started with --metrics-listen");
        let ca = self.0.tls_ca.clone();
        let scrape =
            move || sluice_testkit::scrape_tls(addr, Duration::from_secs(5), ca.as_deref());
        let m = tokio::task::spawn_blocking(scrape).await.expect("the scrape task");
        m.unwrap_or_else(|e| panic!("metrics scrape: {e}"))
    }
}

/// A server on two fixed directories of its scratch (`d1`, `d2`) and, once started, a fixed
/// port: restartable on the same data (the shuffle's files, and so the copies of its commit
/// record, may be on either directory or both).
pub struct Restartable {
    pub scratch: Scratch,
    pub dirs: Vec<PathBuf>,
    pub addr: SocketAddr,
    pub sets: Vec<String>,
}

impl Restartable {
    /// Starts one in a new scratch with `sets`.
    pub fn new(sets: &[&str]) -> (Restartable, Proc) {
        Restartable::start_in(Scratch::new(), sets.iter().map(|s| s.to_string()).collect())
    }

    /// Starts one in `scratch` with `sets`.
    pub fn start_in(scratch: Scratch, sets: Vec<String>) -> (Restartable, Proc) {
        let dirs = vec![scratch.path().join("d1"), scratch.path().join("d2")];
        let mut r = Restartable { scratch, dirs, addr: "127.0.0.1:0".parse().unwrap(), sets };
        let p = r.start();
        r.addr = p.addr;
        (r, p)
    }

    /// (Re)starts the server, on its port once it has one.
    pub fn start(&self) -> Proc {
        self.start_under(&[])
    }

    /// [`Self::start`], the server run by `under` (e.g. `setpriv …`).
    pub fn start_under(&self, under: &[&str]) -> Proc {
        self.scratch.server(&ServerSpec {
            data_dirs: self.dirs.clone(),
            metrics: true,
            listen: (self.addr.port() != 0).then_some(self.addr),
            sets: self.sets.clone(),
            run_under: under.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        })
    }

    /// The files under its directories that `name` accepts.
    pub fn files(&self, name: impl Fn(&Path) -> bool) -> Vec<PathBuf> {
        self.dirs.iter().flat_map(|d| files_under(d)).filter(|f| name(f)).collect()
    }

    /// Its commit records.
    pub fn index_files(&self) -> Vec<PathBuf> {
        self.files(|f| f.file_name().is_some_and(|n| n == "index"))
    }

    /// Its partition files.
    pub fn data_files(&self) -> Vec<PathBuf> {
        self.files(|f| f.extension().is_some_and(|e| e == "data"))
    }
}

/// Per-test scratch: a temporary directory for logs and data directories, and the children
/// that use it (a failure to start one fails the test, with its log).
pub struct Scratch(Launcher);

impl Default for Scratch {
    fn default() -> Self {
        Self::new()
    }
}

impl Scratch {
    pub fn new() -> Scratch {
        let launcher = Launcher::new(sluice_bin(), "sluice-it-", None).expect("tempdir");
        let filter = std::env::var("SLUICE_TEST_LOG").unwrap_or_else(|_| "info".into());
        Scratch(launcher.log_to_files(filter))
    }

    pub fn path(&self) -> &Path {
        self.0.path()
    }

    /// `sluice ARGS`, its log named after `name`.
    pub fn spawn(&self, name: &str, args: &[String]) -> Proc {
        started(self.0.spawn(name, args))
    }

    /// `sluice coordinator --listen LISTEN`.
    pub fn coordinator_on(&self, listen: &str) -> Proc {
        started(self.0.coordinator_on(listen))
    }

    /// `sluice coordinator --listen 127.0.0.1:0`.
    pub fn coordinator(&self) -> Proc {
        started(self.0.coordinator())
    }

    /// `sluice server` as described by `spec`.
    pub fn server(&self, spec: &ServerSpec) -> Proc {
        started(self.0.server(spec))
    }
}

fn started(p: anyhow::Result<sluice_testkit::Proc>) -> Proc {
    Proc(p.unwrap_or_else(|e| panic!("{e:#}")))
}

/// Client transport settings for tests: short connect timeout and back-offs, a request timeout
/// well under the test deadlines.
pub fn test_transport() -> ClientConfig {
    ClientConfig {
        connect_timeout_ms: 3_000,
        request_timeout_ms: 20_000,
        reconnect_backoff_min_ms: 50,
        reconnect_backoff_max_ms: 500,
        ..ClientConfig::default()
    }
}

/// A native client for `app`, with `coordinator` if any.
pub fn client(app: &str, coordinator: Option<SocketAddr>) -> ShuffleClient {
    client_with(app, coordinator, |_| {})
}

/// [`client`] with options adjusted by `f`.
pub fn client_with(
    app: &str,
    coordinator: Option<SocketAddr>,
    f: impl FnOnce(&mut ClientOptions),
) -> ShuffleClient {
    let mut opts = ClientOptions {
        coordinators: coordinator.into_iter().map(|c| c.to_string()).collect(),
        transport: test_transport(),
        ..ClientOptions::default()
    };
    f(&mut opts);
    ShuffleClient::new(app, opts)
}

/// A single handshaked connection (no pool), for hand-made requests.
pub async fn raw(addr: SocketAddr) -> Connection {
    Connection::connect(addr, &test_transport()).await.expect("connecting")
}

/// Sends a request without a body; `Ok(message)` or the remote error code.
pub async fn call(conn: &Connection, msg: impl Into<Message>) -> Result<Message, ErrorCode> {
    call_body(conn, msg, Bytes::new()).await.map(|(m, _)| m)
}

/// Sends a request with a body; `Ok((message, body))` or the remote error code (a transport
/// failure panics: the tests using this expect answers).
pub async fn call_body(
    conn: &Connection,
    msg: impl Into<Message>,
    body: Bytes,
) -> Result<(Message, Bytes), ErrorCode> {
    match conn.request(msg.into(), Body::from(body)).await {
        Ok(r) => Ok((r.message, r.body)),
        Err(TransportError::Remote { code, .. }) => Err(code),
        Err(e) => panic!("transport failure instead of an answer: {e}"),
    }
}

/// The wire code of a client error.
pub fn code<T: std::fmt::Debug>(r: Result<T, ClientError>) -> ErrorCode {
    match r {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => e.code(),
    }
}

/// Waits (≤ `secs`) until the coordinator assigns over `n` servers (they have registered).
pub async fn wait_registered(coordinator: SocketAddr, n: usize, secs: u64) {
    let limit = Duration::from_secs(secs);
    let ready = sluice_testkit::wait_registered(coordinator, n, limit, &test_transport()).await;
    ready.unwrap_or_else(|e| panic!("{e:#}"));
}

/// An assignment made by hand (no coordinator): partition `p` on server `p % servers`.
pub fn assignment(shuffle_id: u32, servers: &[SocketAddr], partitions: u32) -> Arc<Assignment> {
    Arc::new(Assignment {
        shuffle_id,
        servers: servers
            .iter()
            .enumerate()
            .map(|(i, a)| ServerAddr {
                server_id: format!("s{i}"),
                host: a.ip().to_string(),
                port: a.port(),
            })
            .collect(),
        partitions: (0..partitions)
            .map(|p| PartitionLoc {
                primary: (p as usize % servers.len()) as u16,
                replica: NO_REPLICA,
            })
            .collect(),
    })
}

/// Registers the app and a hand-made assignment's shuffle on every server of it.
pub async fn register_direct(
    client: &ShuffleClient,
    a: &Assignment,
    num_maps: u32,
) -> Result<(), ClientError> {
    for addr in addrs_of(a) {
        client
            .request(
                addr,
                RegisterApp { app_id: client.app_id().into(), ..Default::default() }.into(),
            )
            .await?;
        client
            .request(
                addr,
                RegisterShuffle {
                    app_id: client.app_id().into(),
                    shuffle_id: a.shuffle_id,
                    num_maps,
                    num_partitions: a.partitions.len() as u32,
                    replication: 1,
                }
                .into(),
            )
            .await?;
    }
    Ok(())
}

/// The socket addresses of an assignment's servers.
pub fn addrs_of(a: &Assignment) -> Vec<SocketAddr> {
    a.servers.iter().map(|s| format!("{}:{}", s.host, s.port).parse().expect("ip:port")).collect()
}

// ---------------------------------------------------------------------------------------------
// Records: each names its map, attempt and sequence number, so a reader can tell attempts apart.

/// Identity of one test record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RecordId {
    pub map: u32,
    pub attempt: u32,
    pub seq: u32,
}

/// A record of `len` bytes (≥ 12): the id, then a filler derived from it.
pub fn record(map: u32, attempt: u32, seq: u32, len: usize) -> Vec<u8> {
    let mut r = Vec::with_capacity(len.max(12));
    r.put_u32(map);
    r.put_u32(attempt);
    r.put_u32(seq);
    let fill = (map.wrapping_mul(31) ^ attempt.wrapping_mul(7) ^ seq) as u8;
    r.resize(len.max(12), fill);
    r
}

/// Frames records the way `ShuffleWriter::write_record` does (`u32` length, bytes), for
/// `add_batch`.
pub fn framed(records: &[Vec<u8>]) -> Vec<u8> {
    let mut out = BytesMut::new();
    for r in records {
        out.put_u32(r.len() as u32);
        out.put_slice(r);
    }
    out.to_vec()
}

/// Splits a batch payload into its records and checks each one's filler.
pub fn parse_records(batch: &[u8]) -> Vec<(RecordId, u32)> {
    let mut out = Vec::new();
    let mut b = batch;
    while !b.is_empty() {
        assert!(b.len() >= 4, "record length runs past the batch");
        let len = u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize;
        assert!(b.len() >= 4 + len && len >= 12, "record runs past the batch");
        let r = &b[4..4 + len];
        let u = |i: usize| u32::from_be_bytes([r[i], r[i + 1], r[i + 2], r[i + 3]]);
        let id = RecordId { map: u(0), attempt: u(4), seq: u(8) };
        let want = record(id.map, id.attempt, id.seq, len);
        assert_eq!(r, &want[..], "record {id:?} corrupted");
        out.push((id, crc32c::crc32c(r)));
        b = &b[4 + len..];
    }
    out
}

/// What a partition read delivered.
#[derive(Debug, Default, Clone)]
pub struct ReadResult {
    /// Every record, in delivery order, with its CRC32C.
    pub records: Vec<(RecordId, u32)>,
    pub batches_read: u64,
    pub batches_dropped: u64,
}

impl ReadResult {
    /// Record count and sum of CRCs.
    pub fn tally(&self) -> (usize, u64) {
        (self.records.len(), self.records.iter().map(|(_, c)| *c as u64).sum())
    }

    /// Sorted ids.
    pub fn ids(&self) -> Vec<RecordId> {
        let mut v: Vec<_> = self.records.iter().map(|(id, _)| *id).collect();
        v.sort_unstable();
        v
    }

    /// Sorted ids, asserting that no record was read twice (`what` names the partition).
    pub fn unique_ids(&self, what: impl std::fmt::Display) -> Vec<RecordId> {
        let ids = self.ids();
        assert!(ids.windows(2).all(|w| w[0] != w[1]), "{what}: a record read twice");
        ids
    }
}

/// Starts one writer task per map `m` in `0..maps`: it pushes `per_map` batches of one record
/// each, `record(m, 0, seq, record_len)`, to partition `partition(m, seq)`, and finishes. Each
/// task's result is its writer's `finish()`.
pub fn spawn_writers(
    client: &ShuffleClient,
    a: &Arc<Assignment>,
    maps: u32,
    per_map: u32,
    record_len: usize,
    partition: impl Fn(u32, u32) -> u32 + Copy + Send + 'static,
) -> Vec<tokio::task::JoinHandle<Result<Vec<u64>, ClientError>>> {
    (0..maps)
        .map(|m| {
            let (client, a) = (client.clone(), a.clone());
            tokio::spawn(async move {
                let mut w = client.writer(a, m, 0).await?;
                for seq in 0..per_map {
                    w.add_batch(partition(m, seq), &framed(&[record(m, 0, seq, record_len)]))
                        .await?;
                }
                w.finish().await
            })
        })
        .collect()
}

/// Reads partition `p` over maps `[start, end)` with the native reader.
pub async fn read_partition(
    client: &ShuffleClient,
    a: &Assignment,
    p: u32,
    start: u32,
    end: u32,
) -> Result<ReadResult, ClientError> {
    drain(client.reader(a, p, start, end).await?).await
}

/// Reads partition `p` over maps `[start, end)`, exactly the map attempts named.
pub async fn read_attempts(
    client: &ShuffleClient,
    a: &Assignment,
    p: u32,
    start: u32,
    end: u32,
    attempts: &[(u32, u32)],
) -> Result<ReadResult, ClientError> {
    let named = attempts.iter().map(|&(map_id, attempt_id)| MapAttempt { map_id, attempt_id });
    drain(client.reader_of_attempts(a, p, start, end, named.collect()).await?).await
}

/// Every record a reader delivers.
async fn drain(mut r: PartitionReader) -> Result<ReadResult, ClientError> {
    let mut out = ReadResult::default();
    while let Some(b) = r.next_batch().await? {
        out.records.extend(parse_records(&b));
    }
    out.batches_read = r.batches_read;
    out.batches_dropped = r.batches_dropped;
    Ok(out)
}

/// Regular files under `dir`, recursively (missing dir: none).
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else { continue };
        for e in rd.flatten() {
            let p = e.path();
            match e.file_type() {
                Ok(t) if t.is_dir() => stack.push(p),
                Ok(t) if t.is_file() => out.push(p),
                _ => {}
            }
        }
    }
    out.sort();
    out
}

/// Polls `cond` every 50 ms for up to `secs`; returns whether it became true.
pub async fn eventually(secs: u64, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        if cond() {
            return true;
        }
        if tokio::time::Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Opens a stream over `[start, end)` of partition `p` of shuffle 1 on `addr` (naming
/// `attempts`, or the winners when empty), closes it, and returns its handle: what the server
/// would serve.
pub async fn stream_handle(
    client: &ShuffleClient,
    addr: SocketAddr,
    p: u32,
    (start, end): (u32, u32),
    attempts: Vec<MapAttempt>,
) -> Result<StreamHandle, ClientError> {
    let open = OpenStream {
        app_id: client.app_id().into(),
        shuffle_id: 1,
        partition_id: p,
        map_start: start,
        map_end: end,
        attempts,
    };
    match client.request(addr, open.into()).await? {
        Message::StreamHandle(h) => {
            let _ = client.request(addr, CloseStream { stream_id: h.stream_id }.into()).await;
            Ok(h)
        }
        other => panic!("OpenStream [{start},{end}) of partition {p}: {other:?}"),
    }
}

/// A tmpfs of `mib` MiB at `path`, unmounted on drop.
pub struct SmallFs(pub PathBuf);

impl SmallFs {
    /// `what` names the test in the line printed when it cannot run.
    pub fn mount(path: &Path, mib: u64, what: &str) -> Option<SmallFs> {
        std::fs::create_dir_all(path).unwrap();
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
            .arg(path)
            .output()
            .expect("run mount");
        if out.status.success() {
            return Some(SmallFs(path.to_owned()));
        }
        eprintln!(
            "{what} NOT RUN: cannot mount a small tmpfs (euid {}): {}",
            rustix::process::geteuid().as_raw(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
        None
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg("-l").arg(&self.0).status();
    }
}
