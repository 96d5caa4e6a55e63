//! # sluice-server
//!
//! The shuffle server: accepts pushes into a byte-accounted memory budget, flushes them to local
//! disks, seals partitions on commit and serves chunks to readers with `sendfile`.
//!
//! ## Layout
//! The shuffle logic is a core with no I/O; the rest is the shell that does the I/O around it.
//! - `core`: what the server remembers about its shuffles and every rule about how it changes:
//!   applications, shuffles and their lifecycle, partitions (buffers, file cursors, chunk
//!   index), map ends, streams. No sockets, files or clock; unit-tested and fuzzed alone.
//! - `state`: the wiring — each request handed to the core, its flush plans to the flushers,
//!   deleted shuffles' files to storage.
//! - `flusher`: threads that write flush plans at their `(file, offset)` and report back.
//! - `files`: partition files: where a partition's next one is created, and their removal.
//! - `storage`: data directories, chosen by free space, taken out of service on failure; the
//!   recycle pool.
//! - `tier`: the object-store tier: committed partitions copied to an S3-compatible store when
//!   the disks fill, and their chunks read back with ranged GETs (the pass that decides what
//!   moves is `ServerState::offload`).
//! - `memory_budget`: reservations and watermarks for buffered data.
//! - `quota`: per-application and per-user limits on buffered, stored and object-store bytes,
//!   checked when a push is admitted.
//! - `config`: the server's configuration ([`ServerConfig`]).
//! - `stats`: counters exported as Prometheus text.
//! - `status`: read-only views for operators ([`ServerHandle`]: status, disks, metrics, the
//!   drain switch); no HTTP here, `sluice-admin` serves them.
//! - this file: the transport [`Handler`], heartbeats to coordinators and the maintenance
//!   tick, wired together by [`Server::serve`].
//! - [`fuzzing`] (feature `fuzzing`): operation sequences applied to the core, for the
//!   `core_ops` fuzz target and the property test.
#![warn(missing_docs)]

mod config;
mod core;
mod durable;
mod files;
mod flusher;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
mod memory_budget;
mod quota;
mod state;
mod stats;
mod status;
mod storage;
mod tier;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use sluice_proto::message::{
    FetchChunk, Message, QuotaReport, RegisterServer, ServerHeartbeat, ServerStatus,
    DRAIN_ORDER_START, DRAIN_ORDER_STOP,
};
use sluice_proto::ErrorCode;
use sluice_transport::{
    Admission, BodyPool, ClientConfig, ConnInfo, Handler, Pool, Request, Response, TransportStats,
};
use tokio::net::TcpListener;

pub use config::ServerConfig;
pub use core::{AppReport, Lifecycle, ShuffleReport};
pub use state::ServerState;
pub use status::{Counters, DiskState, DiskStatus, Identity, ServerHandle, StatusReport};

use state::{Admit, Admitted};

/// Adapts [`ServerState`] to the transport's handler interface.
struct ServerHandler {
    state: Arc<ServerState>,
}

impl Handler for ServerHandler {
    /// An admitted push's memory reservation and shuffle (`None` for other requests).
    type Permit = Option<Admitted>;

    fn admit(&self, _conn: &ConnInfo, message: &Message, body_len: u32) -> Admission<Self::Permit> {
        let (app, shuffle) = match message {
            Message::Push(p) => (&p.app_id, p.shuffle_id),
            Message::PushMerged(p) => (&p.app_id, p.shuffle_id),
            _ => return Admission::Accept(None),
        };
        match self.state.admit_push(app, shuffle, body_len) {
            Admit::Admitted(admitted) => Admission::Accept(Some(admitted)),
            Admit::Refused(refusal) => Admission::Reject(refusal.into()),
            Admit::NoRoom if self.state.config().busy_hold_ms > 0 => {
                let hold = self.state.clone().hold_push(app.clone(), shuffle, body_len);
                Admission::Later(Box::pin(async move { hold.await.map(Some) }))
            }
            Admit::NoRoom => Admission::Reject(self.state.busy_reply()),
        }
    }

    fn body_pool(&self) -> Option<Arc<BodyPool>> {
        Some(self.state.body_pool.clone())
    }

    fn handle(
        &self,
        conn: &Arc<ConnInfo>,
        req: Request<Self::Permit>,
    ) -> impl Future<Output = Response> + Send + 'static {
        // Streams are named by id alone, so the transport's check of the named application
        // (`PeerIdentity::authorize`) cannot see whose they are: the state checks their owner
        // against `conn`'s identity as it looks the stream up.
        // The permit is what `admit` made: the reservation (it moves into the partition buffers)
        // and the shuffle.
        let state = self.state.clone();
        let (mut message, body, permit, max_frame) =
            (req.message, req.body, req.permit, conn.max_frame_bytes);
        // Where a chunk is in this host's files means nothing to a reader on another host (a
        // file there may even have the same path): it gets the chunk's bytes.
        if let Message::FetchChunkLocal(f) = &message {
            if !conn.peer_on_this_host() {
                message = FetchChunk { stream_id: f.stream_id, chunk_index: f.chunk_index }.into();
            }
        }
        let conn = conn.clone();
        async move { state.dispatch(conn, message, body, permit, max_frame).await }
    }
}

/// A configured server, ready to serve on a listener.
pub struct Server {
    state: Arc<ServerState>,
    transport_stats: Arc<TransportStats>,
    /// Set when [`Server::serve`] starts: what the server reports to coordinators.
    identity: Arc<OnceLock<Identity>>,
}

impl Server {
    /// Validates the configuration and opens storage.
    pub fn new(config: ServerConfig) -> Result<Server, String> {
        config.validate()?;
        raise_open_file_limit();
        let tier = config.object_store.as_ref().map(tier::Tier::open).transpose()?;
        if let Some(o) = &config.object_store {
            tracing::info!(bucket = %o.bucket, endpoint = %o.endpoint, hdfs_url = %o.hdfs_url,
                high = o.offload_high_watermark, low = o.offload_low_watermark,
                "object-store tier on: committed partitions move there when the disks fill");
        }
        let state = ServerState::new(config, tier);
        for d in state.storage.dirs() {
            if d.is_failed() {
                tracing::error!(dir = %d.path.display(), "data directory unusable at start");
            }
        }
        Ok(Server {
            state,
            transport_stats: Arc::new(TransportStats::default()),
            identity: Arc::new(OnceLock::new()),
        })
    }

    /// The server's state: what drains it and reports what it holds.
    pub fn state(&self) -> &Arc<ServerState> {
        &self.state
    }

    /// A handle for operators (the admin endpoint): status, disks, metrics, drain.
    pub fn handle(&self) -> ServerHandle {
        ServerHandle {
            state: self.state.clone(),
            transport: self.transport_stats.clone(),
            identity: self.identity.clone(),
        }
    }

    /// Serves on `listener` until `shutdown` completes; heartbeats to the configured coordinators
    /// and runs the maintenance tick (pressure relief, application expiry) meanwhile.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send,
    ) -> std::io::Result<()> {
        let local = listener.local_addr()?;
        let state = self.state.clone();
        let identity = identity(&state, local);
        let _ = self.identity.set(identity.clone());
        let mut tasks = tokio::task::JoinSet::new();
        tasks.spawn(maintenance(state.clone()));
        for coord in state.config().coordinators.clone() {
            let transport = self.transport_stats.clone();
            tasks.spawn(heartbeat_loop(state.clone(), transport, coord, identity.clone()));
        }
        let handler = Arc::new(ServerHandler { state: state.clone() });
        let mut transport_config = state.config().transport.clone();
        transport_config.offer_host_local_reads = state.config().host_local_reads;
        let result = sluice_transport::serve(
            listener,
            handler,
            transport_config,
            self.transport_stats.clone(),
            shutdown,
        )
        .await;
        tasks.shutdown().await;
        result
    }

    /// Prometheus text for the server's counters and gauges.
    pub(crate) fn metrics(state: &ServerState, transport: &TransportStats) -> String {
        let t = transport.snapshot();
        let pool = state.body_pool.stats();
        let mut out = state.stats.prometheus(&[
            ("sluice_server_body_buffers_reused_total", pool.reused),
            ("sluice_server_body_buffers_allocated_total", pool.allocated),
            ("sluice_server_body_pool_kept_bytes", pool.kept_bytes),
            ("sluice_server_memory_used_bytes", state.budget.used()),
            ("sluice_server_memory_peak_bytes", state.budget.peak()),
            ("sluice_server_memory_budget_bytes", state.budget.capacity()),
            ("sluice_server_sendfile_bytes_total", t.sendfile_bytes),
            ("sluice_server_sendfile_calls_total", t.sendfile_calls),
            ("sluice_server_writev_bytes_total", t.writev_bytes),
            ("sluice_server_copy_bytes_total", t.copy_bytes),
            ("sluice_server_cold_regions_total", t.file_regions_cold),
            ("sluice_server_cold_region_bytes_total", t.file_regions_cold_bytes),
            ("sluice_server_recycled_files_reused_total", state.storage.reused_files()),
            ("sluice_server_recycle_pool_bytes", state.storage.pooled_bytes()),
            ("sluice_server_data_dirs_full", state.storage.count(|d| d.is_full())),
            ("sluice_server_data_dirs_failed", state.storage.count(|d| d.is_failed())),
            ("sluice_server_draining", u64::from(state.is_draining())),
            ("sluice_server_memory_paused", u64::from(state.budget.is_paused())),
            ("sluice_server_connections_open", t.connections_open),
            ("sluice_server_requests_unauthorized_total", t.requests_unauthorized),
            ("sluice_server_handshakes_failed_total", t.handshakes_failed),
            ("sluice_server_tls_connections_user_space_total", t.tls_connections_user_space),
            ("sluice_server_tls_handshakes_failed_total", t.tls_handshakes_failed),
            ("sluice_server_ktls_connections_total", t.ktls_connections),
            ("sluice_server_ktls_fallbacks_total", t.ktls_fallbacks),
            ("sluice_server_ktls_failures_total", t.ktls_failures),
            ("sluice_server_tls_bytes_total", t.tls_bytes),
            ("sluice_server_tls_file_bytes_total", t.tls_file_bytes),
            ("sluice_server_ktls_available", u64::from(sluice_transport::ktls_available())),
            ("sluice_server_shuffles_held", state.shuffles_held() as u64),
            ("sluice_server_partitions_held", u64::from(state.partitions_held())),
            ("sluice_server_metadata_bytes", state.metadata_bytes()),
            ("sluice_server_object_store_bytes", state.offloaded_bytes()),
        ]);
        // Per application: what its shuffles hold in memory and in files.
        let apps = state.apps_report();
        let per_app = |f: fn(&AppReport) -> u64| -> Vec<(String, u64)> {
            apps.iter().map(|a| (a.app_id.clone(), f(a))).collect()
        };
        let buffered = per_app(|a| a.shuffles.iter().map(|s| s.buffered_bytes).sum());
        let stored = per_app(|a| a.shuffles.iter().map(|s| s.stored_bytes).sum());
        stats::Stats::labelled(&mut out, "sluice_server_app_buffered_bytes", "app", &buffered);
        stats::Stats::labelled(&mut out, "sluice_server_app_stored_bytes", "app", &stored);
        let refusals = state.quota_refusals();
        stats::Stats::labelled(&mut out, "sluice_server_quota_refusals_total", "quota", &refusals);
        let offloaded = per_app(|a| a.shuffles.iter().map(|s| s.offloaded_bytes).sum());
        stats::Stats::labelled(&mut out, "sluice_server_app_offloaded_bytes", "app", &offloaded);
        // Per data directory: free space and size (statvfs each, once per scrape).
        let dirs = state.storage.dirs();
        let per_dir = |f: fn(&storage::DataDir) -> u64| -> Vec<(String, u64)> {
            dirs.iter().map(|d| (d.path.display().to_string(), f(d))).collect()
        };
        let free = per_dir(storage::DataDir::free_bytes);
        let capacity = per_dir(storage::DataDir::capacity_bytes);
        stats::Stats::labelled(&mut out, "sluice_server_data_dir_free_bytes", "dir", &free);
        stats::Stats::labelled(&mut out, "sluice_server_data_dir_capacity_bytes", "dir", &capacity);
        out
    }
}

/// Every partition with flushed data keeps its file open (chunks point into it), so a server
/// holding a few 200-partition Spark shuffles needs more descriptors than the usual soft limit
/// of 1024: raise the soft limit to the hard one.
fn raise_open_file_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let lim = getrlimit(Resource::Nofile);
    if lim.current < lim.maximum {
        let raised = rustix::process::Rlimit { current: lim.maximum, maximum: lim.maximum };
        if let Err(e) = setrlimit(Resource::Nofile, raised) {
            tracing::warn!(error = %e, "cannot raise the open-file limit");
        }
    }
}

/// Pooled body buffers are freed after this long without a push.
const BODY_POOL_IDLE: Duration = Duration::from_secs(10);

async fn maintenance(state: Arc<ServerState>) {
    let mut tick = tokio::time::interval(Duration::from_millis(50));
    let mut n = 0u64;
    loop {
        tick.tick().await;
        state.relieve_pressure();
        n += 1;
        if n.is_multiple_of(20) {
            let released = state.body_pool.release_if_idle(BODY_POOL_IDLE);
            if released > 0 {
                tracing::debug!(
                    bytes = released,
                    "no pushes for a while: pooled body buffers freed"
                );
            }
            state.flush_aged();
            // In a task of its own: deleting an expired application's files is waited for
            // on the blocking pool, and the tick goes on meanwhile.
            tokio::spawn({
                let state = state.clone();
                async move { state.expire_apps().await }
            });
            state.expire_streams();
            tokio::spawn(state.clone().offload());
            // statvfs, and deleting the recycle pool when space runs low: blocking file work.
            let storage = state.storage.clone();
            tokio::task::spawn_blocking(move || storage.refresh());
        }
    }
}

/// Identity a server reports to coordinators.
fn identity(state: &ServerState, local: SocketAddr) -> Identity {
    let host = if state.config().advertise_host.is_empty() {
        local.ip().to_string()
    } else {
        state.config().advertise_host.clone()
    };
    let id = if state.config().server_id.is_empty() {
        format!("{host}:{}", local.port())
    } else {
        state.config().server_id.clone()
    };
    Identity { server_id: id, host, port: local.port() }
}

/// Registers with one coordinator, then heartbeats to it forever; a coordinator that is down
/// or restarting is retried at the next interval (a restarted one learns us from the heartbeat).
/// After each heartbeat, a [`ServerStatus`] whose answer may order a drain (see
/// [`send_status`]), and, with quotas set, a [`QuotaReport`] (see [`send_quota_report`]).
async fn heartbeat_loop(
    state: Arc<ServerState>,
    transport: Arc<TransportStats>,
    coord: String,
    me: Identity,
) {
    let Identity { server_id, host, port } = me;
    // Servers prove the cluster key to coordinators (no app id: the cluster's identity).
    let secret = state.config().transport.secret.clone().unwrap_or_default();
    let tls = state.config().coordinator_tls.clone();
    let pool =
        Pool::new(ClientConfig { connections_per_peer: 1, secret, tls, ..ClientConfig::default() });
    let mut registered = false;
    // Whether this coordinator takes `ServerStatus` (one that predates it refuses it).
    let mut takes_status = true;
    // Whether it takes `QuotaReport` (the same way).
    let mut takes_quota_report = true;
    let mut last_pushed = 0u64;
    // Heartbeats failed in a row: the first failure and every minute's worth after it are
    // warnings (a coordinator down for long would otherwise fill the log every beat).
    let mut failed_in_a_row = 0u64;
    let interval = Duration::from_millis(state.config().heartbeat_interval_ms);
    let warn_every = (60_000 / state.config().heartbeat_interval_ms.max(1)).max(1);
    let mut tick = tokio::time::interval(interval);
    loop {
        tick.tick().await;
        let addr = match tokio::net::lookup_host(&coord).await.map(|mut a| a.next()) {
            Ok(Some(a)) => a,
            _ => {
                tracing::warn!(coordinator = %coord, "cannot resolve coordinator address");
                continue;
            }
        };
        let pushed = state.stats.pushed_bytes.load(std::sync::atomic::Ordering::Relaxed);
        let msg: Message = if registered {
            ServerHeartbeat {
                server_id: server_id.clone(),
                host: host.clone(),
                port,
                memory_budget_bytes: state.budget.capacity(),
                free_memory_bytes: state.budget.capacity().saturating_sub(state.budget.used()),
                // A draining server has no room for new partitions (see `start_draining`).
                free_disk_bytes: if state.is_draining() { 0 } else { state.storage.free_bytes() },
                partitions_held: state.partitions_held(),
                push_bytes_per_s: (pushed - last_pushed) * 1000
                    / interval.as_millis().max(1) as u64,
                active_connections: transport.snapshot().connections_open as u32,
            }
            .into()
        } else {
            RegisterServer {
                server_id: server_id.clone(),
                host: host.clone(),
                port,
                memory_budget_bytes: state.budget.capacity(),
                disk_capacity_bytes: state.storage.capacity_bytes(),
            }
            .into()
        };
        last_pushed = pushed;
        let sent =
            async { pool.get(addr).await?.request(msg, sluice_transport::Body::Empty).await };
        match sent.await {
            Ok(_) => {
                if failed_in_a_row > 0 {
                    tracing::info!(coordinator = %coord, failed = failed_in_a_row,
                        "heartbeats reach the coordinator again");
                }
                failed_in_a_row = 0;
                registered = true;
            }
            Err(e) => {
                if failed_in_a_row.is_multiple_of(warn_every) {
                    tracing::warn!(coordinator = %coord, error = %e, failed_in_a_row,
                        "heartbeat failed: this coordinator does not hear from this server");
                } else {
                    tracing::debug!(coordinator = %coord, error = %e, "heartbeat failed");
                }
                failed_in_a_row += 1;
                registered = false;
                // A restarted coordinator may be a newer one: ask it again.
                takes_status = true;
                takes_quota_report = true;
                continue;
            }
        }
        if takes_status {
            takes_status = send_status(&state, &pool, addr, &coord, &server_id).await;
        }
        if takes_quota_report {
            takes_quota_report =
                send_quota_report(&state, &pool, addr, &coord, &server_id, interval).await;
        }
    }
}

/// Tells a coordinator who is at quota here (nothing when no quota is set). A push refused for
/// `buffered_bytes` counts for two heartbeat intervals (`Quotas::at_quota`). Returns `false`
/// when the coordinator does not take the message (it predates it).
async fn send_quota_report(
    state: &ServerState,
    pool: &Pool,
    addr: SocketAddr,
    coord: &str,
    server_id: &str,
    interval: Duration,
) -> bool {
    let Some(at_quota) = state.at_quota(interval * 2) else { return true };
    let report = QuotaReport { server_id: server_id.to_owned(), at_quota };
    ask_coordinator(pool, addr, coord, report.into()).await.is_ok()
}

/// Sends a [`ServerStatus`] to a coordinator and carries out the drain order in its answer.
/// Returns `false` when the coordinator does not take the message (it predates it).
async fn send_status(
    state: &ServerState,
    pool: &Pool,
    addr: SocketAddr,
    coord: &str,
    server_id: &str,
) -> bool {
    let status = ServerStatus {
        server_id: server_id.to_owned(),
        draining: u8::from(state.is_draining()),
        shuffles_held: u32::try_from(state.shuffles_held()).unwrap_or(u32::MAX),
        disks: status::disks(state).iter().map(Into::into).collect(),
    };
    match ask_coordinator(pool, addr, coord, status.into()).await {
        Ok(Some(Message::DrainOrder(o)))
            if o.order == DRAIN_ORDER_START && !state.is_draining() =>
        {
            tracing::info!(coordinator = %coord, "drain ordered by a coordinator");
            state.start_draining();
        }
        Ok(Some(Message::DrainOrder(o)))
            if o.order == DRAIN_ORDER_STOP && state.is_draining() && !state.is_stopping() =>
        {
            tracing::info!(coordinator = %coord, "drain cancelled by a coordinator");
            state.stop_draining();
        }
        Ok(_) => {}
        Err(()) => return false,
    }
    true
}

/// One of the messages a server sends after its heartbeat (`ServerStatus`, `QuotaReport`):
/// `Ok(Some(answer))`; `Ok(None)` when it failed (logged; the next heartbeat tries again);
/// `Err(())` when the coordinator does not take it (it predates it: `UNKNOWN_MESSAGE_TYPE`).
async fn ask_coordinator(
    pool: &Pool,
    addr: SocketAddr,
    coord: &str,
    msg: Message,
) -> Result<Option<Message>, ()> {
    let what = msg.msg_type().name();
    let sent = async { pool.get(addr).await?.request(msg, sluice_transport::Body::Empty).await };
    match sent.await {
        Ok(r) => Ok(Some(r.message)),
        Err(sluice_transport::TransportError::Remote { code, .. })
            if matches!(code, ErrorCode::UnknownMessageType | ErrorCode::InvalidRequest) =>
        {
            tracing::info!(coordinator = %coord, %code, message = what,
                "coordinator does not take this message (older version); not sent again");
            Err(())
        }
        Err(e) => {
            tracing::debug!(coordinator = %coord, error = %e, message = what, "failed");
            Ok(None)
        }
    }
}
