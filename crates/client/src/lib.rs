//! # sluice-client
//!
//! The native client that map and reduce tasks use.
//!
//! ## Layout
//! Every module is private; the API is [`ShuffleClient`] and what it hands out.
//! - this file: [`ClientOptions`] and [`ShuffleClient`]: coordinator calls (any live
//!   coordinator of a list), shuffle registration on servers, commit, cleanup and heartbeats;
//!   [`ClientError`].
//! - `writer`: [`ShuffleWriter`] batches records per partition, pushes merged frames per
//!   server with bounded in-flight bytes, retries `Busy`, goes on with the other copy when a
//!   server of a replicated shuffle fails, ends with `MapperEnd`.
//! - `reader`: [`PartitionReader`] opens a stream for (partition, map range), prefetches
//!   chunks, verifies every batch's CRC32C, keeps committed attempts only, drops duplicates and
//!   reports any missing batch as data loss.
//! - `busy`: the per-server gate that holds pushes back while a server answers `Busy`.

#![warn(missing_docs)]

mod busy;
mod reader;
mod writer;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use sluice_proto::message::*;
use sluice_proto::ErrorCode;
use sluice_transport::{Body, ClientConfig, Pool, Reply, TransportError};

pub use reader::PartitionReader;
pub use writer::ShuffleWriter;

/// Errors a client call can end with.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The connection failed, timed out, or the peer answered with an `Error` frame.
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// A server or coordinator refused the request with an `Error` reply.
    #[error("{code}: {message}")]
    Server {
        /// The wire code of the refusal.
        code: ErrorCode,
        /// The peer's text, for logs.
        message: String,
    },
    /// A well-formed reply of the wrong type; the text says what the request wanted.
    #[error("unexpected reply {0}")]
    UnexpectedReply(&'static str),
    /// Data a read needs is missing (fewer batches than the committed maps pushed, or a chunk
    /// that could not be fetched) and no other copy had it.
    #[error("data lost: {0}")]
    DataLost(String),
    /// A fetched chunk did not split into whole batches, or a batch failed its CRC32C, and no
    /// other copy was sound.
    #[error("corrupt shuffle data: {0}")]
    Corrupt(String),
    /// A coordinator or server address (`host:port`) did not resolve.
    #[error("cannot resolve {0}")]
    Resolve(String),
    /// Every server holding a partition failed (a replicated shuffle survives losing one of
    /// them): no complete copy of the partition can be written or committed any more. `code`
    /// is the last failure's.
    #[error("partition {partition} has no live copy left: {failures}")]
    CopiesLost {
        /// The partition with no copy left.
        partition: u32,
        /// Each server's failure (`addr: why`), joined with `; `.
        failures: String,
        /// The last failure's wire code.
        code: ErrorCode,
    },
}

impl ClientError {
    /// The wire code that best describes the failure.
    pub fn code(&self) -> ErrorCode {
        match self {
            ClientError::Transport(e) => e.code(),
            ClientError::Server { code, .. } => *code,
            ClientError::UnexpectedReply(_) => ErrorCode::ProtocolViolation,
            ClientError::DataLost(_) => ErrorCode::DataLost,
            ClientError::Corrupt(_) => ErrorCode::ChecksumMismatch,
            ClientError::Resolve(_) => ErrorCode::InvalidRequest,
            ClientError::CopiesLost { code, .. } => *code,
        }
    }

    /// Whether trying again may help.
    pub fn is_retriable(&self) -> bool {
        self.code().is_retriable()
    }

    /// Whether this failure of a request that retries could not cure is the *server's* — it is
    /// unreachable, stopping, its storage failed, it lost its state (a restarted server knows
    /// neither the application nor the shuffle the coordinator assigned to it), or it answered
    /// nonsense — rather than the request's (a committed shuffle, an invalid request, our own
    /// settings). A writer of a replicated shuffle gives up on such a server and carries on
    /// with the other copy of its partitions; a request's own failure would fail on every server
    /// alike. (A shuffle unregistered for real is unknown on every server: the writer then loses
    /// every copy and fails.)
    pub fn is_server_failure(&self) -> bool {
        match self {
            ClientError::Transport(TransportError::Config(_)) | ClientError::Resolve(_) => false,
            ClientError::Transport(TransportError::Remote { code, .. })
            | ClientError::Server { code, .. } => {
                code.is_retriable()
                    || matches!(
                        code,
                        ErrorCode::StorageUnavailable
                            | ErrorCode::UnknownApp
                            | ErrorCode::UnknownShuffle
                    )
            }
            // Lost connections, timeouts, undecodable or out-of-place replies.
            ClientError::Transport(_) | ClientError::UnexpectedReply(_) => true,
            ClientError::CopiesLost { .. } => true,
            ClientError::DataLost(_) | ClientError::Corrupt(_) => false,
        }
    }
}

/// Options of a [`ShuffleClient`].
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct ClientOptions {
    /// Coordinator addresses (`host:port`); any live one is used.
    pub coordinators: Vec<String>,
    /// A partition's records are sealed into a batch once it holds this many bytes.
    pub batch_bytes: usize,
    /// Batches for one server are merged into a `PushMerged` frame up to this many bytes.
    pub push_frame_bytes: usize,
    /// Bytes a writer may have pushed and not yet acknowledged.
    pub max_inflight_bytes: usize,
    /// How many times a push answered `Busy` is sent again (each after the server's back-off);
    /// also how many probes in a row a busy server may refuse before the pushes waiting for it
    /// fail (see `busy.rs`).
    pub busy_max_retries: u32,
    /// How many times a request that failed with a retriable error is sent again.
    pub error_max_retries: u32,
    /// Back-off before retrying a failed request, in milliseconds (doubles, capped at 2 s).
    pub retry_backoff_ms: u64,
    /// Chunks a reader fetches ahead of the one it is consuming.
    pub fetch_prefetch_chunks: usize,
    /// Connection settings.
    pub transport: ClientConfig,
    /// The user the application runs as, sent in `RegisterApp` to the coordinator and to the
    /// servers of each shuffle: servers count the application in that user's quotas. Empty:
    /// none (only the application's own quotas apply).
    pub user: String,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            coordinators: Vec::new(),
            batch_bytes: 256 << 10,
            push_frame_bytes: 1 << 20,
            max_inflight_bytes: 16 << 20,
            busy_max_retries: 1_000,
            error_max_retries: 4,
            retry_backoff_ms: 20,
            fetch_prefetch_chunks: 4,
            transport: ClientConfig::default(),
            user: String::new(),
        }
    }
}

pub(crate) struct Inner {
    pub opts: ClientOptions,
    pub pool: Pool,
    pub app_id: String,
    /// Per server: holds pushes back while it answers `Busy`.
    pub busy: busy::BusyGates,
    /// Parts of split partitions per committed shuffle, as readers learned them (parts never
    /// change after the commit; forgotten when the shuffle is unregistered).
    pub splits: parking_lot::Mutex<std::collections::HashMap<u32, Arc<Parts>>>,
    /// Host-local reads: per server, how its files have been failing (see [`GIVE_UP_AFTER`]).
    pub local_failures: parking_lot::Mutex<std::collections::HashMap<SocketAddr, FileFailures>>,
}

/// Chunks in a row that could not be read from a server's files before readers stop asking it
/// for [`ASK_AGAIN_AFTER`]. A file can go for ordinary reasons (its partition moved to the object
/// store, its shuffle deleted); failures in a row mean its files are not readable here (another
/// mount namespace, permissions) — for now: a pause, not for good, so that a passing cause
/// (prefetched chunks of a partition being moved, say) does not cost the process its local reads.
pub const GIVE_UP_AFTER: u32 = 3;

/// How long readers fetch a server's chunks over the network after [`GIVE_UP_AFTER`] failures.
pub const ASK_AGAIN_AFTER: std::time::Duration = std::time::Duration::from_secs(300);

/// One server's host-local read failures.
#[derive(Debug, Default, Clone, Copy)]
pub struct FileFailures {
    /// Chunks in a row its files failed to give.
    in_a_row: u32,
    /// Since when readers have stopped asking (at [`GIVE_UP_AFTER`] in a row).
    paused_at: Option<std::time::Instant>,
    /// Whether readers ever stopped asking it (the first time is a warning, later ones not).
    paused_before: bool,
}

impl Inner {
    /// Whether to ask `addr` for chunks as regions of its files (besides its offer, see
    /// [`sluice_transport::Connection::offers_host_local_reads`]): readers have not stopped, or
    /// stopped [`ASK_AGAIN_AFTER`] ago (then they try again, [`GIVE_UP_AFTER`] more chunks).
    pub(crate) fn reads_files_of(&self, addr: SocketAddr) -> bool {
        self.reads_files_at(addr, std::time::Instant::now())
    }

    /// [`Self::reads_files_of`] at `now`.
    fn reads_files_at(&self, addr: SocketAddr, now: std::time::Instant) -> bool {
        let mut f = self.local_failures.lock();
        let Some(n) = f.get_mut(&addr) else { return true };
        match n.paused_at {
            Some(at) if now.saturating_duration_since(at) < ASK_AGAIN_AFTER => false,
            Some(_) => {
                n.paused_at = None;
                n.in_a_row = 0;
                true
            }
            None => true,
        }
    }

    /// A chunk of `addr` could not be read from its file (it is fetched instead).
    pub(crate) fn file_read_failed(&self, addr: SocketAddr, why: &str) {
        let (paused, before) = {
            let mut f = self.local_failures.lock();
            let n = f.entry(addr).or_default();
            n.in_a_row += 1;
            let pause = n.in_a_row == GIVE_UP_AFTER && n.paused_at.is_none();
            let before = n.paused_before;
            if pause {
                n.paused_at = Some(std::time::Instant::now());
                n.paused_before = true;
            }
            (pause, before)
        };
        let secs = ASK_AGAIN_AFTER.as_secs();
        if paused && !before {
            tracing::warn!(server = %addr, last = why, "host-local reads stopped after {GIVE_UP_AFTER} failures in a row; fetching over the network, asking again in {secs} s");
        } else if paused {
            tracing::debug!(server = %addr, last = why, "host-local reads stopped again after {GIVE_UP_AFTER} failures in a row; asking again in {secs} s");
        } else {
            tracing::debug!(server = %addr, reason = why, "host-local read failed; fetching the chunk");
        }
    }

    /// A chunk of `addr` was read from its file.
    pub(crate) fn file_read(&self, addr: SocketAddr) {
        if let Some(n) = self.local_failures.lock().get_mut(&addr) {
            n.in_a_row = 0;
        }
    }
}

/// The parts of a shuffle's split partitions: partition → its parts (part 0 first), each a
/// primary and an optional replica indexing the assignment's servers.
#[derive(Debug, Default, Clone)]
pub struct Parts {
    /// The split partitions' parts.
    pub split: std::collections::HashMap<u32, Vec<PartitionLoc>>,
    /// No coordinator knew the shuffle (one restarted without peers, say): any server of the
    /// assignment may hold a part, so every one is read (see [`Parts::of`]).
    pub unknown: bool,
}

impl Parts {
    /// Partition `p`'s parts: its split parts, or the assignment's one entry. When the parts
    /// are unknown, the assignment's entry and then every other server of the assignment, each
    /// as a part of its own: a reader opens a stream on each, and one holding nothing of the
    /// partition serves nothing.
    pub fn of(&self, a: &Assignment, p: u32) -> Vec<PartitionLoc> {
        let first = a.partitions.get(p as usize).cloned();
        if let Some(parts) = self.split.get(&p) {
            return parts.clone();
        }
        let mut out: Vec<PartitionLoc> = first.clone().into_iter().collect();
        if let (true, Some(f)) = (self.unknown, first) {
            let others = (0..a.servers.len() as u16).filter(|&i| i != f.primary && i != f.replica);
            out.extend(others.map(|primary| PartitionLoc { primary, replica: NO_REPLICA }));
        }
        out
    }

    /// Takes a coordinator's `Splits`, checked against the assignment: an index outside its
    /// servers is the coordinator's error.
    pub(crate) fn learn(&mut self, a: &Assignment, s: Splits) -> Result<(), ClientError> {
        let n = a.servers.len();
        for p in s.partitions {
            let bad = p.parts.iter().any(|l| {
                l.primary as usize >= n || (l.replica != NO_REPLICA && l.replica as usize >= n)
            });
            if bad || p.partition_id as usize >= a.partitions.len() {
                return Err(ClientError::Server {
                    code: ErrorCode::Internal,
                    message: format!(
                        "the coordinator's parts of partition {} do not fit the assignment",
                        p.partition_id
                    ),
                });
            }
            let known = self.split.get(&p.partition_id).map_or(1, Vec::len);
            if p.parts.len() > known {
                self.split.insert(p.partition_id, p.parts);
            }
        }
        Ok(())
    }
}

/// An application's handle on Sluice.
#[derive(Clone)]
pub struct ShuffleClient {
    pub(crate) inner: Arc<Inner>,
}

/// Resolves an assignment's server addresses.
pub(crate) async fn server_addrs(a: &Assignment) -> Result<Vec<SocketAddr>, ClientError> {
    let mut out = Vec::with_capacity(a.servers.len());
    for s in &a.servers {
        let hp = format!("{}:{}", s.host, s.port);
        let addr = tokio::net::lookup_host(&hp).await.ok().and_then(|mut i| i.next());
        out.push(addr.ok_or(ClientError::Resolve(hp))?);
    }
    Ok(out)
}

/// Turns an `Error` reply into an error (the transport already does; this catches odd replies).
pub(crate) fn expect_ok(reply: Reply) -> Result<Message, ClientError> {
    match reply.message {
        Message::Error(e) => Err(ClientError::Server {
            code: ErrorCode::from_u16(e.code).unwrap_or(ErrorCode::Internal),
            message: e.message,
        }),
        m => Ok(m),
    }
}

impl ShuffleClient {
    /// A client for `app_id`.
    pub fn new(app_id: impl Into<String>, mut opts: ClientOptions) -> ShuffleClient {
        let app_id = app_id.into();
        opts.transport.app_id = app_id.clone();
        let pool = Pool::new(opts.transport.clone());
        ShuffleClient {
            inner: Arc::new(Inner {
                opts,
                pool,
                app_id,
                busy: Default::default(),
                splits: Default::default(),
                local_failures: Default::default(),
            }),
        }
    }

    /// The application this client works for: every request it sends names it.
    pub fn app_id(&self) -> &str {
        &self.inner.app_id
    }

    /// The options it was made with (`transport.app_id` set to [`Self::app_id`]).
    pub fn options(&self) -> &ClientOptions {
        &self.inner.opts
    }

    /// Sends one request to a server.
    pub async fn request(&self, addr: SocketAddr, msg: Message) -> Result<Message, ClientError> {
        let conn = self.inner.pool.get(addr).await?;
        expect_ok(conn.request(msg, Body::Empty).await?)
    }

    /// [`Self::request`], sent again after a back-off while it fails with a retriable error, at
    /// most `error_max_retries` times. Only for requests a server may safely see twice
    /// (`MapperEnd`: the first attempt to report stays the winner; `CommitShuffle`;
    /// `OpenStream`).
    pub async fn request_with_retries(
        &self,
        addr: SocketAddr,
        msg: Message,
    ) -> Result<Message, ClientError> {
        let opts = &self.inner.opts;
        let mut tries = 0;
        loop {
            match self.request(addr, msg.clone()).await {
                Err(e) if e.is_retriable() && tries < opts.error_max_retries => {
                    tracing::debug!(server = %addr, error = %e, tries, "request failed; retrying");
                    tokio::time::sleep(backoff(opts.retry_backoff_ms, tries)).await;
                    tries += 1;
                }
                r => return r,
            }
        }
    }

    /// Sends one request to the first coordinator that answers; retriable failures move on to
    /// the next one.
    pub async fn coordinator_request(&self, msg: Message) -> Result<Message, ClientError> {
        let mut last = ClientError::Server {
            code: ErrorCode::NoServers,
            message: "no coordinator configured".into(),
        };
        for c in &self.inner.opts.coordinators {
            let Some(addr) = tokio::net::lookup_host(c).await.ok().and_then(|mut i| i.next())
            else {
                last = ClientError::Resolve(c.clone());
                continue;
            };
            match self.request(addr, msg.clone()).await {
                Ok(m) => return Ok(m),
                Err(e @ ClientError::Transport(_)) => last = e,
                Err(e) => return Err(e),
            }
        }
        Err(last)
    }

    /// The parts of a shuffle's split partitions, asked of a coordinator (none without one).
    pub async fn splits(&self, a: &Assignment) -> Result<Parts, ClientError> {
        let mut parts = Parts::default();
        if self.inner.opts.coordinators.is_empty() {
            return Ok(parts);
        }
        let ask = GetSplits { app_id: self.inner.app_id.clone(), shuffle_id: a.shuffle_id };
        match self.coordinator_request(ask.into()).await? {
            Message::Splits(s) => parts.learn(a, s)?,
            _ => return Err(ClientError::UnexpectedReply("GetSplits wants Splits")),
        }
        Ok(parts)
    }

    /// [`Self::splits`] for a writer that starts: without an answer (no coordinator
    /// reachable, or one that does not know the shuffle), none. A partition split meanwhile
    /// then gets this writer's batches on its first part, which still takes them (the split
    /// threshold is soft) and is read like every part.
    pub(crate) async fn splits_for_writer(&self, a: &Assignment) -> Parts {
        self.splits(a).await.unwrap_or_else(|e| {
            tracing::warn!(shuffle = a.shuffle_id, error = %e,
                "cannot learn the shuffle's split partitions; writing to their first parts");
            Parts::default()
        })
    }

    /// [`Self::splits`] for reading a committed shuffle: when no coordinator knows it (it
    /// restarted without peers) or none answers, the parts are unknown and every server of the
    /// assignment is read (see [`Parts::of`]); never fewer parts than there are.
    pub(crate) async fn splits_for_reading(&self, a: &Assignment) -> Result<Parts, ClientError> {
        match self.splits(a).await {
            Ok(p) => Ok(p),
            Err(e) if e.code() == ErrorCode::UnknownShuffle || e.is_retriable() => {
                tracing::warn!(shuffle = a.shuffle_id, error = %e,
                    "the coordinators do not know the shuffle's split partitions; reading every server of its assignment");
                Ok(Parts { unknown: true, ..Parts::default() })
            }
            Err(e) => Err(e),
        }
    }

    /// [`Self::splits_for_reading`] of a committed shuffle (ask only once a stream of it
    /// opened: a list asked before the commit could miss a part made after it), asked once and
    /// kept; parts not known (no coordinator answered) are asked again next time.
    pub(crate) async fn committed_splits(&self, a: &Assignment) -> Result<Arc<Parts>, ClientError> {
        if let Some(p) = self.inner.splits.lock().get(&a.shuffle_id) {
            return Ok(p.clone());
        }
        let parts = Arc::new(self.splits_for_reading(a).await?);
        if !parts.unknown {
            self.inner.splits.lock().insert(a.shuffle_id, parts.clone());
        }
        Ok(parts)
    }

    /// Asks a coordinator for a new part of partition `p`, which has `known` parts here.
    pub(crate) async fn split_partition(
        &self,
        a: &Assignment,
        parts: &mut Parts,
        p: u32,
        known: usize,
    ) -> Result<(), ClientError> {
        let ask = SplitPartition {
            app_id: self.inner.app_id.clone(),
            shuffle_id: a.shuffle_id,
            partition_id: p,
            known_parts: known.min(u16::MAX as usize) as u16,
        };
        match self.coordinator_request(ask.into()).await? {
            Message::Splits(s) => parts.learn(a, s),
            _ => Err(ClientError::UnexpectedReply("SplitPartition wants Splits")),
        }
    }

    /// Registers the application with a coordinator.
    pub async fn register_app(&self) -> Result<(), ClientError> {
        self.coordinator_request(self.register_app_msg()).await?;
        Ok(())
    }

    fn register_app_msg(&self) -> Message {
        let user = self.inner.opts.user.clone();
        RegisterApp { app_id: self.inner.app_id.clone(), user }.into()
    }

    /// Heartbeats the application to every coordinator that answers and to `servers`.
    pub async fn heartbeat(&self, servers: &[SocketAddr]) {
        let hb = || Message::from(AppHeartbeat { app_id: self.inner.app_id.clone() });
        for c in &self.inner.opts.coordinators {
            if let Some(addr) = tokio::net::lookup_host(c).await.ok().and_then(|mut i| i.next()) {
                let _ = self.request(addr, hb()).await;
            }
        }
        for s in servers {
            if let Err(e) = self.request(*s, hb()).await {
                tracing::debug!(server = %s, error = %e, "app heartbeat failed");
            }
        }
    }

    /// Gets an assignment from a coordinator and registers the shuffle on its servers.
    pub async fn register_shuffle(
        &self,
        shuffle_id: u32,
        num_maps: u32,
        num_partitions: u32,
        replication: u8,
    ) -> Result<Arc<Assignment>, ClientError> {
        let reg = RegisterShuffle {
            app_id: self.inner.app_id.clone(),
            shuffle_id,
            num_maps,
            num_partitions,
            replication,
        };
        let Message::Assignment(a) = self.coordinator_request(reg.clone().into()).await? else {
            return Err(ClientError::UnexpectedReply("RegisterShuffle wants Assignment"));
        };
        for addr in server_addrs(&a).await? {
            // A server learns the application's user only from this (it counts quotas per user).
            if !self.inner.opts.user.is_empty() {
                self.request(addr, self.register_app_msg()).await?;
            }
            self.request(addr, reg.clone().into()).await?;
        }
        Ok(Arc::new(a))
    }

    /// Commits a shuffle on every server of its assignment; returns bytes per partition.
    ///
    /// A replicated shuffle survives a server that cannot be reached (or fails as a server does,
    /// see [`ClientError::is_server_failure`]) as long as every partition has a server that
    /// committed: its writers wrote the other copy only, and its readers read that copy. Without
    /// replication, or when a partition lost both copies, the commit fails.
    pub async fn commit_shuffle(&self, a: &Assignment) -> Result<Vec<u64>, ClientError> {
        let msg = Message::from(CommitShuffle {
            app_id: self.inner.app_id.clone(),
            shuffle_id: a.shuffle_id,
        });
        let mut sizes = vec![0u64; a.partitions.len()];
        let addrs = server_addrs(a).await?;
        let replies = futures_util::future::join_all(
            addrs.iter().map(|addr| self.request_with_retries(*addr, msg.clone())),
        )
        .await;
        let replicated = a.partitions.iter().any(|l| l.replica != NO_REPLICA);
        let mut failed: Vec<Option<ClientError>> = Vec::with_capacity(addrs.len());
        let mut by_server: Vec<std::collections::HashMap<u32, u64>> = Vec::new();
        for (addr, r) in addrs.iter().zip(replies) {
            by_server.push(Default::default());
            let c = match r {
                Ok(Message::CommitResult(c)) => c,
                Ok(_) => {
                    return Err(ClientError::UnexpectedReply("CommitShuffle wants CommitResult"))
                }
                Err(e) if replicated && e.is_server_failure() => {
                    tracing::warn!(server = %addr, shuffle = a.shuffle_id, error = %e, "commit failed on a server; its partitions' other copies are committed instead");
                    failed.push(Some(e));
                    continue;
                }
                Err(e) => return Err(e),
            };
            failed.push(None);
            by_server
                .last_mut()
                .expect("pushed above")
                .extend(c.partitions.iter().map(|p| (p.partition, p.bytes)));
            for p in c.partitions {
                // A replicated partition is reported by its primary and its replica.
                if let Some(s) = sizes.get_mut(p.partition as usize) {
                    *s = (*s).max(p.bytes);
                }
            }
        }
        let parts = self.splits_for_reading(a).await?;
        // Data of a partition on a server that is none of its parts: a split the coordinators
        // forgot. Readers would miss it: fail loudly instead.
        for (s, held) in by_server.iter().enumerate() {
            for (&p, &bytes) in held {
                let listed = parts.of(a, p).iter().any(|l| writer::servers_of(l).any(|x| x == s));
                if bytes > 0 && !listed {
                    return Err(ClientError::DataLost(format!(
                        "partition {p} has {bytes} bytes on {} that no coordinator lists as one of its parts",
                        addrs[s]
                    )));
                }
            }
        }
        for p in 0..a.partitions.len() as u32 {
            for loc in parts.of(a, p) {
                if writer::servers_of(&loc).all(|s| failed[s].is_some()) {
                    return Err(copies_lost(p, writer::servers_of(&loc), &addrs, |s| {
                        failed[s].as_ref().map(ServerFailure::of)
                    }));
                }
            }
        }
        // A split partition: the sum over its parts of each part's size (a part's primary
        // and replica hold the same bytes).
        for p in 0..a.partitions.len() as u32 {
            let locs = parts.of(a, p);
            if locs.len() < 2 {
                continue;
            }
            let part_size = |loc: &PartitionLoc| {
                writer::servers_of(loc)
                    .filter_map(|s| by_server[s].get(&p).copied())
                    .max()
                    .unwrap_or(0)
            };
            sizes[p as usize] = locs.iter().map(part_size).sum();
        }
        Ok(sizes)
    }

    /// Deletes a shuffle's data on its servers and forgets it at the coordinator. Every server
    /// and the coordinator are told, whichever fail (one gone must not leave the others holding
    /// the data until the application ends); the first failure is returned.
    pub async fn unregister_shuffle(&self, a: &Assignment) -> Result<(), ClientError> {
        let msg = Message::from(UnregisterShuffle {
            app_id: self.inner.app_id.clone(),
            shuffle_id: a.shuffle_id,
        });
        self.inner.splits.lock().remove(&a.shuffle_id);
        let mut first: Option<ClientError> = None;
        for s in &a.servers {
            let hp = format!("{}:{}", s.host, s.port);
            let addr = tokio::net::lookup_host(&hp).await.ok().and_then(|mut i| i.next());
            let told = match addr {
                Some(addr) => self.request(addr, msg.clone()).await.map(drop),
                None => Err(ClientError::Resolve(hp)),
            };
            if let Err(e) = told {
                first.get_or_insert(e);
            }
        }
        let _ = self.coordinator_request(msg).await;
        first.map_or(Ok(()), Err)
    }

    /// Ends the application: its data is deleted on `servers` and at the coordinators. Every
    /// server is told, whichever fail; the first failure is returned.
    pub async fn unregister_app(&self, servers: &[SocketAddr]) -> Result<(), ClientError> {
        let msg = Message::from(UnregisterApp { app_id: self.inner.app_id.clone() });
        let mut first: Option<ClientError> = None;
        for s in servers {
            if let Err(e) = self.request(*s, msg.clone()).await {
                first.get_or_insert(e);
            }
        }
        let _ = self.coordinator_request(msg).await;
        first.map_or(Ok(()), Err)
    }

    /// A writer for one map attempt.
    pub async fn writer(
        &self,
        a: Arc<Assignment>,
        map_id: u32,
        attempt_id: u32,
    ) -> Result<ShuffleWriter, ClientError> {
        ShuffleWriter::new(self.clone(), a, map_id, attempt_id).await
    }

    /// A reader of one partition over maps `[map_start, map_end)`.
    pub async fn reader(
        &self,
        a: &Assignment,
        partition: u32,
        map_start: u32,
        map_end: u32,
    ) -> Result<PartitionReader, ClientError> {
        PartitionReader::open(self.clone(), a, partition, map_start, map_end, Vec::new()).await
    }

    /// A reader of one partition that reads exactly the given map attempts (`map_id`s ascending,
    /// inside `[map_start, map_end)`) and no other map of the range, whichever attempt of a map
    /// ended first on the servers: for an engine that chose the attempts itself, as Spark's map
    /// statuses do. Each one must have ended and pushed to the partition on the server that
    /// is read, or the read fails with `DATA_LOST`.
    pub async fn reader_of_attempts(
        &self,
        a: &Assignment,
        partition: u32,
        map_start: u32,
        map_end: u32,
        attempts: Vec<MapAttempt>,
    ) -> Result<PartitionReader, ClientError> {
        PartitionReader::open(self.clone(), a, partition, map_start, map_end, attempts).await
    }
}

/// The error for partition `p` once every server in `servers` failed; `why(s)` is server
/// `s`'s failure (code and text).
/// Why a copy's server was given up: the error's wire code and text.
#[derive(Debug, Clone)]
pub(crate) struct ServerFailure {
    code: ErrorCode,
    text: String,
}

impl ServerFailure {
    pub(crate) fn of(e: &ClientError) -> ServerFailure {
        ServerFailure { code: e.code(), text: e.to_string() }
    }
}

pub(crate) fn copies_lost(
    partition: u32,
    servers: impl Iterator<Item = usize>,
    addrs: &[SocketAddr],
    why: impl Fn(usize) -> Option<ServerFailure>,
) -> ClientError {
    let mut code = ErrorCode::Internal;
    let mut failures = Vec::new();
    for s in servers {
        if let Some(f) = why(s) {
            code = f.code;
            failures.push(format!("{}: {}", addrs[s], f.text));
        }
    }
    ClientError::CopiesLost { partition, failures: failures.join("; "), code }
}

/// Back-off for the n-th retry (0-based), doubling from `base_ms`, capped at 2 s.
pub(crate) fn backoff(base_ms: u64, attempt: u32) -> Duration {
    Duration::from_millis(base_ms.saturating_mul(1 << attempt.min(10)).min(2_000))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_local_failures_in_a_row_pause_the_asking_for_a_while_not_for_good() {
        let c = ShuffleClient::new("app", ClientOptions::default());
        let (inner, addr) = (&c.inner, "127.0.0.1:7001".parse().unwrap());
        assert!(inner.reads_files_of(addr));
        for _ in 0..GIVE_UP_AFTER - 1 {
            inner.file_read_failed(addr, "gone");
        }
        inner.file_read(addr); // a read in between: the count starts again
        for _ in 0..GIVE_UP_AFTER - 1 {
            inner.file_read_failed(addr, "gone");
        }
        assert!(inner.reads_files_of(addr), "not yet {GIVE_UP_AFTER} in a row");
        inner.file_read_failed(addr, "gone");
        let paused = std::time::Instant::now();
        assert!(!inner.reads_files_of(addr), "paused");
        inner.file_read_failed(addr, "a prefetched chunk's failure meanwhile");
        let almost = paused + ASK_AGAIN_AFTER - std::time::Duration::from_secs(1);
        assert!(!inner.reads_files_at(addr, almost), "still paused");
        let later = paused + ASK_AGAIN_AFTER + std::time::Duration::from_secs(1);
        assert!(inner.reads_files_at(addr, later), "asked again once the pause is over");
        inner.file_read_failed(addr, "gone"); // a fresh count: one does not pause it again
        assert!(inner.reads_files_at(addr, later));
        for _ in 0..GIVE_UP_AFTER - 1 {
            inner.file_read_failed(addr, "gone");
        }
        assert!(!inner.reads_files_of(addr), "paused again after {GIVE_UP_AFTER}");
        let other = "127.0.0.1:7002".parse().unwrap();
        assert!(inner.reads_files_of(other), "per server");
    }
}
