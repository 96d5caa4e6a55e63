//! The server's wiring: each request handed to the core, the core's flush plans handed to the
//! flushers, deleted shuffles' files handed to storage, and the clock read here, not in the core.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use sluice_proto::message::*;
use sluice_proto::ErrorCode;
use sluice_transport::{Body, ConnInfo, FileRegion, Response};
use tokio::sync::Notify;

use crate::config::ServerConfig;
use crate::core::{
    AppReport, Apps, ByteRange, ChunkSource, Deleted, FlushPlan, Refusal, Shuffle, Streams,
};
use crate::files::{remove_app_dirs, remove_shuffle_files, FileRef, Placement};
use crate::flusher::Flushers;
use crate::memory_budget::{MemoryBudget, Pressure, Reservation};
use crate::quota::Quotas;
use crate::stats::Stats;
use crate::storage::Storage;
use crate::tier::{Tier, TierError};

/// A shuffle as the server holds it.
type ShuffleRef = Arc<Shuffle<FileRef>>;

/// What making a commit durable took: encoding its record, and the record's size.
#[derive(Debug, Default)]
struct Durable {
    record: Duration,
    record_bytes: usize,
}

/// What admission hands to the push handler: the body's memory reservation and the shuffle it
/// was admitted for, so the handler does not look the shuffle up a second time.
pub struct Admitted {
    reservation: Reservation,
    shuffle: ShuffleRef,
    /// The body's bytes, counted in its application's disk quota until it is stored or not.
    disk: crate::quota::DiskHold,
}

/// The decision about a push, made before its body is read.
pub enum Admit {
    /// Memory is reserved for the body: read it.
    Admitted(Admitted),
    /// No memory now: hold the push ([`ServerState::hold_push`]) or answer
    /// [`ServerState::busy_reply`].
    NoRoom,
    /// Refused for good.
    Refused(Refusal),
}

/// A stream not fetched from for this long is dropped (its reader is gone).
const STREAM_IDLE: Duration = Duration::from_secs(600);
/// How long a registration or an unregistration waits for a deleted shuffle's files to be
/// removed (a big shuffle's take a fraction of a second; a disk that hangs, longer).
const DELETION_WAIT: Duration = Duration::from_secs(30);

/// What a stream sends of one chunk: regions of a local file (sent with `sendfile`), or byte
/// ranges of an object, read from the object store when the chunk is fetched.
#[derive(Debug, Clone)]
pub(crate) enum ChunkBody {
    /// On a local disk: regions of `file` (sent with `sendfile`, or named to a host-local
    /// reader).
    Local { body: Body, file: FileRef },
    /// In the object store: the object's key and the ranges of it to send, in order.
    Object { key: Arc<str>, ranges: Arc<[std::ops::Range<u64>]> },
}

/// The user whose quotas application `r.app_id` counts for ([`PeerIdentity::vouched_user`]);
/// a user named and not taken is logged.
///
/// [`PeerIdentity::vouched_user`]: sluice_transport::PeerIdentity::vouched_user
pub(crate) fn vouched_user<'a>(conn: &'a ConnInfo, r: &'a RegisterApp) -> Option<&'a str> {
    let user = conn.identity.vouched_user(&r.user);
    if user.is_none() && !r.user.is_empty() {
        tracing::warn!(identity = %conn.identity, user = %r.user,
            "the user an authenticated application names is not the one its id carries \
             (<user>/<rest>): not taken for quotas");
    }
    user
}

impl ChunkBody {
    /// Bytes the chunk's body holds.
    fn len(&self) -> u64 {
        match self {
            ChunkBody::Local { body, .. } => body.len(),
            ChunkBody::Object { ranges, .. } => ranges.iter().map(|r| r.end - r.start).sum(),
        }
    }
}

/// Logs a refused request for another application's stream.
fn stream_refused(conn: &ConnInfo, stream: u64) {
    tracing::warn!(identity = %conn.identity, stream, "stream of another application refused");
}

/// `st_dev` and `st_ino` as the wire carries them (narrower than 64 bits on some systems).
fn st_u64<T: Into<u64>>(v: T) -> u64 {
    v.into()
}

/// Everything a server holds: the core's state and the shells around it.
pub struct ServerState {
    config: ServerConfig,
    pub(crate) budget: Arc<MemoryBudget>,
    pub(crate) storage: Arc<Storage>,
    pub(crate) stats: Arc<Stats>,
    /// Receive buffers of push bodies, reused; bounded by the memory budget.
    pub(crate) body_pool: Arc<sluice_transport::BodyPool>,
    flushers: Flushers,
    apps: Apps<FileRef>,
    streams: Streams<FileRef, ChunkBody>,
    /// The object store committed partitions move to when the disks fill (`None`: off).
    tier: Option<Arc<Tier>>,
    /// An offload pass is running (one at a time).
    offloading: AtomicBool,
    /// Bytes handed to flushers and not yet written.
    flushing_bytes: Arc<AtomicU64>,
    /// Woken when a shuffle's last flush in flight is done (commits wait for that).
    flushes_done: Arc<Notify>,
    relieving: AtomicBool,
    /// Taking no new partitions (see [`ServerState::start_draining`]).
    draining: AtomicBool,
    /// Stopping (SIGTERM): its drain cannot be cancelled ([`ServerState::start_stopping`]).
    stopping: AtomicBool,
    /// What each application and user holds, against their limits.
    quotas: Quotas,
    /// Local files of partitions moved to the object store whose commit record could not be
    /// rewritten yet (so it still names them): kept until a later pass rewrites it.
    stranded: parking_lot::Mutex<Vec<(ShuffleRef, Vec<PathBuf>)>>,
}

impl ServerState {
    /// Opens storage and starts the flushers; `tier` is the object store opened from
    /// `config.object_store`.
    pub(crate) fn new(config: ServerConfig, tier: Option<Tier>) -> Arc<Self> {
        let budget = MemoryBudget::new(
            config.memory_budget_bytes,
            config.flush_watermark,
            config.busy_watermark,
            config.resume_watermark,
        );
        let storage = Arc::new(Storage::open(
            &config.data_dirs,
            config.data_dir_reserve_bytes,
            config.recycle_bytes_per_dir,
        ));
        let stats = Arc::new(Stats::default());
        let apps = Apps::default().with_max_partitions_per_app(config.max_partitions_per_app);
        let recovered = crate::durable::recover(&storage);
        if !recovered.shuffles.is_empty() || recovered.uncommitted > 0 || recovered.lost > 0 {
            tracing::info!(
                shuffles = recovered.shuffles.len(),
                lost = recovered.lost,
                uncommitted_deleted = recovered.uncommitted,
                "recovered the committed shuffles found on the data directories"
            );
        }
        stats.recovered_shuffles.store(recovered.shuffles.len() as u64, Ordering::Relaxed);
        stats.recovered_lost.store(recovered.lost as u64, Ordering::Relaxed);
        let now = Instant::now();
        for s in recovered.shuffles {
            // A parked (open) shuffle takes pushes again: it splits as any other.
            apps.insert_recovered(s.with_split_bytes(config.split_threshold_bytes), now);
        }
        for (app_id, why) in &recovered.unlisted {
            apps.insert_unlisted(app_id, why, now);
        }
        let flushing_bytes = Arc::new(AtomicU64::new(0));
        let flushes_done = Arc::new(Notify::new());
        let on_done = {
            let (flushing, stats, done) =
                (flushing_bytes.clone(), stats.clone(), flushes_done.clone());
            Arc::new(move |bytes: u64, last: bool, micros: u64| {
                flushing.fetch_sub(bytes, Ordering::AcqRel);
                stats.flushed_bytes.fetch_add(bytes, Ordering::Relaxed);
                stats.flushes.fetch_add(1, Ordering::Relaxed);
                stats.flush_us.fetch_add(micros, Ordering::Relaxed);
                if last {
                    done.notify_waiters();
                }
            })
        };
        let body_pool = sluice_transport::BodyPool::new(
            usize::try_from(config.memory_budget_bytes).unwrap_or(usize::MAX),
        );
        let flushers = Flushers::start(
            storage.clone(),
            config.flushers_per_dir,
            config.flusher_nice,
            crate::flusher::WriteHow {
                write_bytes: config.flush_write_bytes,
                writeback: config.durable_commit && config.flush_writeback,
            },
            on_done,
        );
        Arc::new(ServerState {
            budget,
            storage,
            stats,
            body_pool,
            flushers,
            apps,
            streams: Streams::starting_at(first_stream_id()),
            tier: tier.map(Arc::new),
            offloading: AtomicBool::new(false),
            flushing_bytes,
            flushes_done,
            relieving: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            stranded: parking_lot::Mutex::new(Vec::new()),
            draining: AtomicBool::new(false),
            quotas: Quotas::new(config.quotas.clone()),
            config,
        })
    }

    /// The configuration the server runs with.
    pub fn config(&self) -> &ServerConfig {
        &self.config
    }

    /// Decides about a push before its body is read: known shuffle, open for pushes, storage
    /// available, and memory reserved for the whole body.
    pub(crate) fn admit_push(&self, app_id: &str, shuffle_id: u32, body_len: u32) -> Admit {
        let shuffle = match self.apps.shuffle(app_id, shuffle_id) {
            Ok(s) => s,
            Err(r) => return Admit::Refused(r),
        };
        if let Err(r) = shuffle.admits_pushes() {
            return Admit::Refused(r);
        }
        // The budget pays for the memory the body will take, the pool's rounding included.
        let footprint = sluice_transport::BodyPool::footprint(body_len as usize) as u64;
        if footprint > self.budget.capacity() {
            return Admit::Refused(Refusal::new(
                ErrorCode::InvalidRequest,
                format!(
                    "a push of {body_len} bytes ({footprint} in memory) exceeds the server's memory budget of {} bytes",
                    self.budget.capacity()
                ),
            ));
        }
        if !self.storage.has_healthy() {
            let why = self.storage.unavailable_reason();
            return Admit::Refused(Refusal::new(ErrorCode::StorageUnavailable, why));
        }
        // Before the shared budget is touched: an application over its quota takes none of it.
        let (charge, disk) = match self.quotas.admit(app_id, footprint, body_len as u64) {
            Ok(c) => c,
            Err(r) => return Admit::Refused(r),
        };
        match self.budget.try_reserve(footprint) {
            Some(reservation) => {
                let reservation = reservation.charged(Quotas::buffered(charge, footprint));
                Admit::Admitted(Admitted { reservation, shuffle, disk })
            }
            None => Admit::NoRoom,
        }
    }

    /// The reply to a push there is no memory for: `Busy`, counted.
    pub(crate) fn busy_reply(&self) -> Message {
        self.stats.busy_replies.fetch_add(1, Ordering::Relaxed);
        self.relieve_pressure();
        Message::Busy(Busy { backoff_ms: self.config.busy_backoff_ms })
    }

    /// Waits, at most `busy_hold_ms`, for memory for a push that found none, with its body still
    /// unread in the socket: holding it (and so every later frame of its connection) is
    /// backpressure that costs nothing, where a `Busy` reply costs the body's whole transfer,
    /// discarded, and its resend. Ends in `Busy` if the budget stays paused.
    pub(crate) async fn hold_push(
        self: Arc<Self>,
        app_id: String,
        shuffle_id: u32,
        body_len: u32,
    ) -> Result<Admitted, Message> {
        let start = tokio::time::Instant::now();
        let deadline = start + Duration::from_millis(self.config.busy_hold_ms as u64);
        self.stats.pushes_held.fetch_add(1, Ordering::Relaxed);
        self.relieve_pressure();
        let result = loop {
            // Only a paused budget is worth waiting for: it frees up as the flushers write. (A
            // reservation can also fail unpaused, for a body larger than the room the capacity
            // leaves; waiting would not help.)
            let timed_out = !self.budget.is_paused()
                || tokio::select! {
                    _ = self.budget.wait_for_room(u64::from(body_len)) => false,
                    _ = tokio::time::sleep_until(deadline) => true,
                };
            match self.admit_push(&app_id, shuffle_id, body_len) {
                Admit::Admitted(a) => break Ok(a),
                Admit::Refused(r) => break Err(r.into()),
                Admit::NoRoom if timed_out || !self.budget.is_paused() => {
                    break Err(self.busy_reply())
                }
                Admit::NoRoom => {}
            }
        };
        let held_us = start.elapsed().as_micros().min(u64::MAX as u128) as u64;
        self.stats.push_hold_us.fetch_add(held_us, Ordering::Relaxed);
        result
    }

    /// Handles one request (after admission) from a connection whose frames are at most
    /// `max_frame` bytes.
    pub(crate) async fn dispatch(
        self: Arc<Self>,
        conn: Arc<ConnInfo>,
        msg: Message,
        body: Bytes,
        admitted: Option<Admitted>,
        max_frame: u32,
    ) -> Response {
        let result = match msg {
            Message::Ping(_) => Ok(Response::msg(Pong {})),
            Message::Push(p) => {
                let length = body.len() as u32;
                let section = Section { partition_id: p.partition_id, offset: 0, length };
                self.push(&p.app_id, p.shuffle_id, &[section], body, admitted)
            }
            Message::PushMerged(p) => {
                self.push(&p.app_id, p.shuffle_id, &p.entries, body, admitted)
            }
            Message::MapperEnd(m) => self.mapper_end(m),
            Message::RegisterApp(r) => {
                if let Some(user) = vouched_user(&conn, &r) {
                    self.quotas.set_user(&r.app_id, user);
                }
                Ok(self.touch_app(&r.app_id))
            }
            Message::AppHeartbeat(r) => Ok(self.touch_app(&r.app_id)),
            Message::UnregisterApp(r) => {
                self.remove_app(&r.app_id, "unregistered").await;
                Ok(Response::msg(OkMsg {}))
            }
            Message::RegisterShuffle(r) => {
                // An authenticated application's id may carry its user: counted from its first
                // shuffle, whether or not a `RegisterApp` named it here.
                if let Some(user) = conn.identity.vouched_user("") {
                    self.quotas.set_user(&r.app_id, user);
                }
                self.register_shuffle(&r).await
            }
            Message::UnregisterShuffle(r) => self.unregister_shuffle(&r.app_id, r.shuffle_id).await,
            Message::CommitShuffle(c) => self.commit(&c.app_id, c.shuffle_id).await,
            Message::OpenStream(o) => self.open_stream(o, max_frame),
            Message::FetchChunk(f) => self.fetch_chunk(f, &conn).await,
            Message::FetchChunkLocal(f) => self.fetch_chunk_local(f, &conn).await,
            Message::CloseStream(c) => {
                // Another application's stream stays open, and the answer is the one for a
                // stream not open (a no-op): which ids others hold open is not told.
                let closed =
                    self.streams.close_for(c.stream_id, |app| conn.identity.may_act_for(app));
                if closed.is_err() {
                    stream_refused(&conn, c.stream_id);
                }
                Ok(Response::msg(OkMsg {}))
            }
            other => Err(Refusal::new(
                ErrorCode::InvalidRequest,
                format!("a server does not take {}", other.msg_type().name()),
            )),
        };
        result.unwrap_or_else(|refusal| {
            tracing::debug!(code = %refusal.code(), reason = refusal.reason(), "request failed");
            self.stats.errors.fetch_add(1, Ordering::Relaxed);
            Response::msg(refusal)
        })
    }

    fn push(
        &self,
        app_id: &str,
        shuffle_id: u32,
        sections: &[Section],
        body: Bytes,
        admitted: Option<Admitted>,
    ) -> Result<Response, Refusal> {
        let (shuffle, reservation, disk) = match admitted {
            Some(a) => (a.shuffle, Some(a.reservation), Some(a.disk)),
            None => (self.apps.shuffle(app_id, shuffle_id)?, None, None),
        };
        // While the writers have next to nothing to do, buffers go to disk early: the commit
        // then finds little left to write and sync, and memory stays free for bursts.
        let early = match self.config.early_flush_bytes {
            0 => u64::MAX,
            n if self.flushing_bytes.load(Ordering::Acquire) < self.config.chunk_bytes => n,
            _ => u64::MAX,
        };
        let placement = Placement::for_flush(&self.storage);
        let pushed = shuffle.push_flushing_at(sections, &body, reservation, &placement, early);
        self.submit(&shuffle, pushed.flushes);
        if let Err(r) = &pushed.result {
            if r.code() == ErrorCode::StorageUnavailable {
                tracing::error!(shuffle = %shuffle.key(), sections_stored = pushed.stored,
                    reason = r.reason(), "partition lost");
            }
        }
        pushed.result?;
        let deleted = || shuffle.is_deleted();
        self.quotas.accepted_unless_deleted(app_id, shuffle_id, body.len() as u64, disk, deleted);
        self.stats.push_requests.fetch_add(1, Ordering::Relaxed);
        self.stats.pushed_bytes.fetch_add(body.len() as u64, Ordering::Relaxed);
        if self.budget.pressure() != Pressure::Normal {
            self.relieve_pressure();
        }
        let mut split = pushed.split;
        if self.disks_nearly_full() {
            // Whatever is buffered must still fit: every partition of the push moves on.
            split = sections.iter().map(|s| s.partition_id).collect();
            split.dedup();
        }
        if split.is_empty() {
            return Ok(Response::msg(PushAck {}));
        }
        self.stats.split_replies.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(shuffle = %shuffle.key(), partitions = ?split, "push stored; partitions split");
        Ok(Response::msg(PushSplit { partitions: split }))
    }

    /// Less room left on the disks, above their reserve, than the memory budget: what the
    /// server buffers might not fit, so partitions move on to other servers (`PushSplit`).
    pub(crate) fn disks_nearly_full(&self) -> bool {
        self.storage.room_seen() < self.budget.capacity()
    }

    /// Hands flush plans to the flushers.
    fn submit(&self, shuffle: &ShuffleRef, plans: impl IntoIterator<Item = FlushPlan<FileRef>>) {
        for plan in plans {
            self.flushing_bytes.fetch_add(plan.bytes(), Ordering::AcqRel);
            self.flushers.submit(shuffle, plan);
        }
    }

    /// While the flushers have less than a chunk to write (and early flushes are on): hands
    /// them the buffers of open shuffles that hold a page or more and did at the previous
    /// call too (the maintenance tick calls this every second), so data waiting for more goes
    /// to disk while the disks are idle rather than all at the commit.
    pub(crate) fn flush_aged(&self) {
        if self.config.early_flush_bytes == 0
            || self.flushing_bytes.load(Ordering::Acquire) >= self.config.chunk_bytes
        {
            return;
        }
        let placement = Placement::for_flush(&self.storage);
        for s in self.apps.shuffles() {
            let (plans, lost) = s.flush_aged(crate::core::CHUNK_ALIGN, &placement);
            for r in lost {
                tracing::error!(shuffle = %s.key(), reason = r.reason(), "partition lost");
            }
            self.submit(&s, plans);
        }
    }

    /// Above the flush watermark: hand the largest buffers to the flushers until what stays in
    /// memory (and is not already being flushed) is back under the resume watermark.
    pub(crate) fn relieve_pressure(&self) {
        if self.relieving.swap(true, Ordering::AcqRel) {
            return; // someone else is at it
        }
        let used = self.budget.used();
        let flushing = self.flushing_bytes.load(Ordering::Acquire);
        let mut need = (used.saturating_sub(flushing)).saturating_sub(self.budget.resume_at());
        // Paused (busy) counts as pressure too: usage can sit between the resume and the flush
        // watermarks, where nothing else would flush and the pause would never end.
        if (used >= self.budget.flush_at() || self.budget.is_paused()) && need > 0 {
            let mut candidates = Vec::new();
            for s in self.apps.shuffles() {
                for (pid, bytes) in s.buffered() {
                    candidates.push((bytes, s.clone(), pid));
                }
            }
            candidates.sort_unstable_by_key(|c| std::cmp::Reverse(c.0));
            let placement = Placement::for_flush(&self.storage);
            for (_, s, pid) in candidates {
                if need == 0 {
                    break;
                }
                match s.take_flush(pid, &placement) {
                    Ok(Some(plan)) => {
                        need = need.saturating_sub(plan.bytes());
                        self.submit(&s, [plan]);
                    }
                    Ok(None) => {}
                    Err(r) => tracing::error!(shuffle = %s.key(), partition = pid,
                        reason = r.reason(), "partition lost"),
                }
            }
        }
        self.relieving.store(false, Ordering::Release);
    }

    /// Refuses a registration beyond the configured sizes, before anything is allocated for it.
    fn check_shuffle_sizes(&self, r: &RegisterShuffle) -> Result<(), Refusal> {
        let (parts, maps) =
            (self.config.max_partitions_per_shuffle, self.config.max_maps_per_shuffle);
        let why = if r.num_partitions > parts {
            format!(
                "{} partitions, more than this server's max_partitions_per_shuffle ({parts})",
                r.num_partitions
            )
        } else if r.num_maps > maps {
            format!("{} maps, more than this server's max_maps_per_shuffle ({maps})", r.num_maps)
        } else {
            return Ok(());
        };
        tracing::warn!(app = %r.app_id, shuffle = r.shuffle_id, reason = %why,
            "shuffle registration refused");
        Err(Refusal::new(
            ErrorCode::InvalidRequest,
            format!("shuffle {} of {} not registered: {why}", r.shuffle_id, r.app_id),
        ))
    }

    fn mapper_end(&self, m: MapperEnd) -> Result<Response, Refusal> {
        let shuffle = self.apps.shuffle(&m.app_id, m.shuffle_id)?;
        let counts: Vec<_> = m.batch_counts.iter().map(|c| (c.partition_id, c.batches)).collect();
        let (winner, dropped) = shuffle.mapper_end(m.map_id, m.attempt_id, &counts)?;
        if dropped {
            tracing::warn!(shuffle = %shuffle.key(), map = m.map_id, attempt = m.attempt_id,
                "too many attempts of one map ended; this one is not kept");
        }
        Ok(Response::msg(MapperEndResult { winning_attempt: winner }))
    }

    fn touch_app(&self, app_id: &str) -> Response {
        self.apps.touch(app_id, Instant::now());
        Response::msg(OkMsg {})
    }

    /// Forgets application `app_id` and deletes its data; done once its files are gone. All
    /// but the file work is done before the first wait: a request's future dropped meanwhile
    /// (its connection gone) leaves the deletion running and nothing else undone.
    async fn remove_app(&self, app_id: &str, why: &str) {
        let deleted = self.apps.remove(app_id);
        self.quotas.app_removed(app_id);
        match deleted {
            Some(deleted) => self.delete_app_data(app_id, deleted, why).await,
            // Removed by another request whose deletion is still running: done once it is.
            None => self.deletion_done(app_id, None).await,
        }
    }

    /// Registers a shuffle; one whose key was deleted and whose files are still being removed
    /// (an application that unregistered a shuffle and registers the same id again) waits for
    /// that first, so that the removal never takes the new shuffle's files.
    async fn register_shuffle(&self, r: &RegisterShuffle) -> Result<Response, Refusal> {
        self.check_shuffle_sizes(r)?;
        self.deletion_done(&r.app_id, Some(r.shuffle_id)).await;
        let (chunk, split) = (self.config.chunk_bytes, self.config.split_threshold_bytes);
        self.apps.register_shuffle(r, chunk, split, Instant::now())?;
        Ok(Response::msg(OkMsg {}))
    }

    /// Waits (a bounded time: a deletion that long is logged and not waited for further) until
    /// no deleted shuffle of `app_id` — shuffle `shuffle_id`, or with `None` any — is still
    /// having its files removed.
    async fn deletion_done(&self, app_id: &str, shuffle_id: Option<u32>) {
        let deadline = Instant::now() + DELETION_WAIT;
        while self.apps.is_deleting(app_id, shuffle_id) {
            if Instant::now() >= deadline {
                tracing::warn!(app = app_id, shuffle = ?shuffle_id,
                    "a deleted shuffle's files are still being removed; not waiting longer");
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Deletes the data of application `app_id`, forgotten already (`deleted`: its shuffles').
    async fn delete_app_data(&self, app_id: &str, mut deleted: Vec<Deleted<FileRef>>, why: &str) {
        tracing::info!(
            app = app_id,
            shuffles = deleted.len(),
            "application {why}; deleting its data"
        );
        for d in &mut deleted {
            self.remove_objects(std::mem::take(&mut d.objects));
        }
        let app = app_id.to_string();
        self.on_blocking_pool(move |storage| {
            for d in deleted {
                remove_shuffle_files(storage, d);
            }
            remove_app_dirs(storage, &app);
        })
        .await;
    }

    /// Deletes a deleted shuffle's files and objects; done once its files are gone.
    async fn remove_files(&self, mut deleted: Deleted<FileRef>) {
        self.remove_objects(std::mem::take(&mut deleted.objects));
        self.on_blocking_pool(move |storage| remove_shuffle_files(storage, deleted)).await;
    }

    /// Runs file work (unlinking, renaming into the recycle pool: a big shuffle's thousands of
    /// files take a disk's while) on tokio's blocking pool, so that it never holds an async
    /// worker, and waits for it.
    async fn on_blocking_pool(&self, work: impl FnOnce(&Storage) + Send + 'static) {
        let storage = self.storage.clone();
        if let Err(e) = tokio::task::spawn_blocking(move || work(&storage)).await {
            tracing::error!(error = %e, "deleting files failed");
        }
    }

    /// Deletes a deleted shuffle's objects from the store, in the background.
    fn remove_objects(&self, objects: Vec<String>) {
        if objects.is_empty() {
            return;
        }
        let Some(tier) = self.tier.clone() else {
            tracing::warn!(
                objects = objects.len(),
                "a deleted shuffle had objects in a store no longer configured; left there"
            );
            return;
        };
        // Called from request handlers and the maintenance tick, both on the runtime.
        tokio::spawn(async move {
            for key in objects {
                tier.delete(&key).await;
            }
        });
    }

    async fn unregister_shuffle(&self, app_id: &str, shuffle_id: u32) -> Result<Response, Refusal> {
        let deleted = self.apps.unregister_shuffle(app_id, shuffle_id)?;
        // Before the wait, as in `remove_app`.
        self.quotas.shuffle_deleted(app_id, shuffle_id);
        match deleted {
            Some(d) => self.remove_files(d).await,
            // Unregistered by another request whose deletion is still running (a retry).
            None => self.deletion_done(app_id, Some(shuffle_id)).await,
        }
        Ok(Response::msg(OkMsg {}))
    }

    /// Seals a shuffle: refuse pushes, flush every buffer, wait for the flushers, report sizes.
    async fn commit(&self, app_id: &str, shuffle_id: u32) -> Result<Response, Refusal> {
        let shuffle = self.apps.shuffle(app_id, shuffle_id)?;
        let started = Instant::now();
        let begun = shuffle.begin_commit(&Placement::for_flush(&self.storage))?;
        let handed_out = started.elapsed();
        let (commit_plans, commit_bytes) =
            (begun.flushes.len(), begun.flushes.iter().map(|p| p.bytes()).sum::<u64>());
        for r in begun.lost {
            tracing::error!(shuffle = %shuffle.key(), reason = r.reason(), "partition lost at commit");
        }
        self.submit(&shuffle, begun.flushes);
        loop {
            // Registered before the check: a wake-up between the two is not missed.
            let done = self.flushes_done.notified();
            if shuffle.flushes_in_flight() == 0 {
                break;
            }
            done.await;
        }
        let flushed = started.elapsed();
        // Reused files are cut to this shuffle's data, so that no earlier shuffle's bytes (another
        // application's, perhaps) stay in them for as long as this shuffle lives. The files are
        // held (`ends`) while they are cut, so the recycle pool cannot hand one out meanwhile.
        let files = shuffle.file_ends();
        if !shuffle.is_deleted() {
            let ends: Vec<_> =
                files.iter().filter_map(|(f, end)| Some((f.file()?.clone(), *end))).collect();
            let cut = tokio::task::spawn_blocking(move || crate::storage::cut_stale_tails(&ends))
                .await
                .unwrap_or(0);
            if cut > 0 {
                tracing::debug!(shuffle = %shuffle.key(), files = cut, "reused files cut");
            }
        }
        let partitions = shuffle.finish_commit()?;
        let written = started.elapsed();
        let mut durable = Durable::default();
        if self.config.durable_commit && !shuffle.is_deleted() {
            durable =
                self.make_durable(&shuffle, files.into_iter().map(|(f, _)| f).collect()).await?;
        } else if !self.config.durable_commit {
            // No record to write: its partitions may move to the store from now on.
            shuffle.mark_recorded();
        }
        self.stats.commits.fetch_add(1, Ordering::Relaxed);
        let waited = started.elapsed();
        self.stats.commit_wait_us.fetch_add(waited.as_micros() as u64, Ordering::Relaxed);
        tracing::info!(
            shuffle = %shuffle.key(),
            bytes = partitions.iter().map(|p| p.bytes).sum::<u64>(),
            waited_ms = waited.as_millis() as u64,
            handed_out_ms = handed_out.as_millis() as u64,
            flushed_ms = flushed.as_millis() as u64,
            written_ms = written.as_millis() as u64,
            record_ms = durable.record.as_millis() as u64,
            record_bytes = durable.record_bytes,
            flushed_at_commit = commit_bytes,
            flushes_at_commit = commit_plans,
            "committed"
        );
        Ok(Response::msg(CommitResult { shuffle_id, partitions }))
    }

    /// Syncs a committed shuffle's files and writes its commit record (see `durable`); the
    /// commit is answered only after this.
    async fn make_durable(
        &self,
        shuffle: &ShuffleRef,
        files: Vec<FileRef>,
    ) -> Result<Durable, Refusal> {
        let started = Instant::now();
        let (storage, s) = (self.storage.clone(), shuffle.clone());
        // A wide shuffle's record is tens of MB to encode: not on an async worker.
        let done = tokio::task::spawn_blocking(move || {
            let mut encoded = Duration::ZERO;
            // From the state read to the record written, no move to the object store rewrites
            // it (see `offload_partition`), and the shuffle's deletion waits.
            let mut writer = s.record_writer();
            let record = || {
                let r = writer.record(|f: &FileRef| f.dir.path.display().to_string());
                encoded = started.elapsed();
                r
            };
            let record =
                crate::durable::persist(&storage, s.key(), record, &files, || s.is_deleted())?;
            s.mark_recorded();
            Ok(Durable { record: encoded, record_bytes: record.len() })
        })
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(e.to_string())));
        let took = started.elapsed();
        self.stats.commit_sync_us.fetch_add(took.as_micros() as u64, Ordering::Relaxed);
        done.map_err(|e| {
            tracing::error!(shuffle = %shuffle.key(), error = %e, "commit could not be made durable");
            Refusal::new(ErrorCode::StorageFailed, format!("the commit could not be made durable: {e}"))
        })
    }

    fn open_stream(&self, o: OpenStream, max_frame: u32) -> Result<Response, Refusal> {
        let shuffle = self.apps.shuffle_to_read(&o.app_id, o.shuffle_id)?;
        // Of each chunk, only the batches of the attempts read: other maps' (a map sub-range
        // read) and losing attempts' stay on disk.
        let body = |source: ChunkSource<'_, FileRef>, ranges: &[ByteRange]| match source {
            ChunkSource::File(f) => {
                // Written, so created: `None` would be a chunk of a file never written.
                let file = f.file()?;
                let regions: Vec<FileRegion> =
                    ranges.iter().map(|r| FileRegion::new(file.clone(), r.offset, r.len)).collect();
                Some(ChunkBody::Local { body: Body::from(regions), file: f.clone() })
            }
            ChunkSource::Object(key) => Some(ChunkBody::Object {
                key: key.into(),
                ranges: ranges.iter().map(|r| r.offset..r.offset + r.len).collect(),
            }),
        };
        // Chunks merged for the stream stay within the reader's frames.
        let room = (max_frame as u64).saturating_sub(chunk_frame_overhead());
        let (chunks, committed) = shuffle.open_stream_within(&o, room, body)?;
        let Some(chunks) = chunks.into_iter().collect::<Option<Vec<ChunkBody>>>() else {
            let why = format!("partition {}: a chunk in a file never written", o.partition_id);
            tracing::error!(shuffle = %shuffle.key(), "{why}");
            return Err(Refusal::new(ErrorCode::Internal, why));
        };
        // Each chunk goes out as one ChunkData frame, which must fit the frames this connection
        // agreed on: a reader that proposed smaller frames than the writers used would otherwise
        // fail on the first large chunk, after the stream was opened, with no hint why.
        if let Some((i, c)) = chunks.iter().enumerate().find(|(_, c)| c.len() > room) {
            return Err(Refusal::new(
                ErrorCode::InvalidRequest,
                format!(
                    "chunk {i} of partition {} is {} bytes, over the {max_frame}-byte frames this \
                     connection agreed on: the client's max_frame_bytes must be at least the \
                     servers' chunk_bytes plus 1 KiB, and at least the writers' frame size",
                    o.partition_id,
                    c.len()
                ),
            ));
        }
        let chunk_lengths = chunks.iter().map(|c| c.len() as u32).collect();
        let stream_id = self.streams.open(shuffle, chunks, Instant::now());
        self.stats.streams_opened.fetch_add(1, Ordering::Relaxed);
        Ok(Response::msg(StreamHandle { stream_id, chunk_lengths, committed }))
    }

    async fn fetch_chunk(&self, f: FetchChunk, conn: &ConnInfo) -> Result<Response, Refusal> {
        let chunk = self.fetch_for(f.stream_id, f.chunk_index, conn)?;
        self.send_chunk(f, chunk).await
    }

    /// Chunk `index` of stream `id`, for `conn`: another application's stream is refused as
    /// one not open (`UNKNOWN_STREAM`: which ids others hold open is not told), with a warning.
    fn fetch_for(&self, id: u64, index: u32, conn: &ConnInfo) -> Result<ChunkBody, Refusal> {
        let may_read = |app: &str| conn.identity.may_act_for(app);
        self.streams.fetch_for(id, index, Instant::now(), may_read).map_err(|r| {
            if r.code() != ErrorCode::Unauthorized {
                return r;
            }
            stream_refused(conn, id);
            crate::core::stream_not_open(id)
        })
    }

    /// A chunk's bytes, as the answer to `FetchChunk`.
    async fn send_chunk(&self, f: FetchChunk, chunk: ChunkBody) -> Result<Response, Refusal> {
        let body = match chunk {
            ChunkBody::Local { body, .. } => body,
            ChunkBody::Object { key, ranges } => self.read_object(&key, &ranges).await?,
        };
        self.stats.fetched_chunks.fetch_add(1, Ordering::Relaxed);
        self.stats.fetched_bytes.fetch_add(body.len(), Ordering::Relaxed);
        Ok(Response {
            message: ChunkData { stream_id: f.stream_id, chunk_index: f.chunk_index }.into(),
            body,
        })
    }

    /// `FetchChunkLocal` from a reader on this host (the shell answers one from elsewhere as
    /// `FetchChunk`): where the chunk's bytes are in a local file, when host-local reads are on
    /// and the chunk is wholly in one; its bytes otherwise (in the object store; a path that is
    /// not UTF-8; a file `fstat` fails on or that has no name left).
    async fn fetch_chunk_local(
        &self,
        f: FetchChunkLocal,
        conn: &ConnInfo,
    ) -> Result<Response, Refusal> {
        let chunk = self.fetch_for(f.stream_id, f.chunk_index, conn)?;
        let as_bytes = FetchChunk { stream_id: f.stream_id, chunk_index: f.chunk_index };
        let ChunkBody::Local { body, file } = &chunk else {
            return self.send_chunk(as_bytes, chunk).await;
        };
        if !self.config.host_local_reads {
            return self.send_chunk(as_bytes, chunk).await;
        }
        // The reader opens the path itself: it must say the same there (absolute) and be text.
        let Some(path) = file.path.to_str().filter(|_| file.path.is_absolute()) else {
            return self.send_chunk(as_bytes, chunk).await;
        };
        let open = body.regions().first().map(|r| &r.file);
        let stat = match open.map(|f| rustix::fs::fstat(f.as_ref())) {
            Some(Ok(st)) => st,
            Some(Err(e)) => {
                tracing::warn!(file = path, error = %e, "fstat of a chunk's file failed; sending its bytes");
                return self.send_chunk(as_bytes, chunk).await;
            }
            // An empty chunk: its bytes are none.
            None => return self.send_chunk(as_bytes, chunk).await,
        };
        // No name left: the file was unlinked while the stream holds it open (its partition
        // moved to the object store, say). The reader could not open it; the bytes it can have.
        if stat.st_nlink == 0 {
            return self.send_chunk(as_bytes, chunk).await;
        }
        let spans = body
            .regions()
            .iter()
            .map(|r| FileSpan { offset: r.offset, length: r.len as u32 })
            .collect();
        self.stats.local_chunks.fetch_add(1, Ordering::Relaxed);
        self.stats.local_bytes.fetch_add(body.len(), Ordering::Relaxed);
        Ok(Response::msg(ChunkLocal {
            stream_id: f.stream_id,
            chunk_index: f.chunk_index,
            path: path.to_owned(),
            device: st_u64(stat.st_dev),
            inode: st_u64(stat.st_ino),
            spans,
        }))
    }

    /// Reads one chunk's ranges of an offloaded partition's object. A store that fails or does
    /// not answer in time is `STORAGE_FAILED` (retriable: the reader's task is retried, and
    /// reads again once the store is back); an object gone from the store is `DATA_LOST`.
    async fn read_object(
        &self,
        key: &str,
        ranges: &[std::ops::Range<u64>],
    ) -> Result<Body, Refusal> {
        let Some(tier) = &self.tier else {
            let why = format!("chunk in object {key}, but no object store is configured");
            tracing::error!(object = key, "{why}");
            return Err(Refusal::new(ErrorCode::StorageFailed, why));
        };
        match tier.read(key, ranges).await {
            Ok(parts) => {
                let len: usize = parts.iter().map(Bytes::len).sum();
                self.stats.store_read_bytes.fetch_add(len as u64, Ordering::Relaxed);
                let bytes = if parts.len() == 1 {
                    parts.into_iter().next().unwrap_or_default()
                } else {
                    let mut all = bytes::BytesMut::with_capacity(len);
                    parts.iter().for_each(|p| all.extend_from_slice(p));
                    all.freeze()
                };
                Ok(Body::from(bytes))
            }
            Err(e) => {
                self.stats.store_errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(object = key, error = %e, "object store read failed");
                let code = match e {
                    TierError::NotFound { .. } => ErrorCode::DataLost,
                    _ => ErrorCode::StorageFailed,
                };
                Err(Refusal::new(code, format!("reading the partition from the object store: {e}")))
            }
        }
    }

    /// One offload pass, when an object store is configured: every data directory whose file
    /// system is in use above `offload_high_watermark` has committed partitions with files on
    /// it moved to the store, largest first, until it would be under `offload_low_watermark`.
    /// One pass at a time; the maintenance tick starts one every second.
    pub(crate) async fn offload(self: Arc<Self>) {
        let (Some(tier), Some(oc)) = (self.tier.clone(), self.config.object_store.as_ref()) else {
            return;
        };
        if self.offloading.swap(true, Ordering::AcqRel) {
            return;
        }
        /// Lets the next pass run however this one ends (a panic in it included).
        struct Running<'a>(&'a AtomicBool);
        impl Drop for Running<'_> {
            fn drop(&mut self) {
                self.0.store(false, Ordering::Release);
            }
        }
        let _running = Running(&self.offloading);
        self.reclaim_stranded().await;
        let (high, low) = (oc.offload_high_watermark, oc.offload_low_watermark);
        let storage = self.storage.clone();
        // statvfs of each directory: blocking.
        let over = tokio::task::spawn_blocking(move || dirs_over(&storage, high, low))
            .await
            .unwrap_or_default();
        if !over.is_empty() {
            self.offload_until(&tier, over).await;
        }
    }

    /// Moves partitions with files on the directories of `need` (directory → bytes to free)
    /// to the store, largest first, until each has freed its bytes or nothing is left to move.
    async fn offload_until(&self, tier: &Arc<Tier>, mut need: HashMap<usize, u64>) {
        let mut candidates = Vec::new();
        for s in self.apps.shuffles() {
            for (pid, files) in s.offloadable() {
                let bytes: u64 = files.iter().map(|(_, end)| end).sum();
                candidates.push((bytes, s.clone(), pid, files));
            }
        }
        candidates.sort_unstable_by_key(|c| std::cmp::Reverse(c.0));
        for (_, shuffle, pid, files) in candidates {
            if need.values().all(|n| *n == 0) {
                break;
            }
            let on: Vec<(usize, u64)> = files.iter().map(|(f, end)| (f.dir.index, *end)).collect();
            if !on.iter().any(|(d, _)| need.get(d).is_some_and(|n| *n > 0)) {
                continue;
            }
            match self.offload_partition(tier, &shuffle, pid, files).await {
                Ok(()) => {
                    for (d, bytes) in on {
                        if let Some(n) = need.get_mut(&d) {
                            *n = n.saturating_sub(bytes);
                        }
                    }
                }
                Err(Offload::Skipped(why)) => {
                    tracing::debug!(shuffle = %shuffle.key(), partition = pid, reason = %why,
                        "partition not moved to the object store");
                }
                Err(Offload::Unreadable(why)) => {
                    // This partition's disk, not the store: the next candidate may move.
                    self.stats.offload_failures.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(shuffle = %shuffle.key(), partition = pid, reason = %why,
                        "a partition's file could not be read to move it to the object store");
                }
                Err(Offload::Failed(why)) => {
                    self.stats.offload_failures.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(shuffle = %shuffle.key(), partition = pid, reason = %why,
                        "moving a partition to the object store failed");
                    // A store that fails one upload likely fails the next: wait for the next
                    // pass rather than read every candidate's files for nothing.
                    break;
                }
            }
        }
    }

    /// Copies partition `pid`'s files to the store, verifies them, switches the partition to
    /// the objects, rewrites the commit record, and only then deletes the local files.
    async fn offload_partition(
        &self,
        tier: &Tier,
        shuffle: &ShuffleRef,
        pid: u32,
        files: Vec<(FileRef, u64)>,
    ) -> Result<(), Offload> {
        let token = unique_token();
        let mut keys: Vec<String> = Vec::with_capacity(files.len());
        let mut bytes = 0;
        for (n, (f, end)) in files.iter().enumerate() {
            let key = tier.object_key(shuffle.key(), pid, n as u32, token);
            // The last file's cursor counts the page padding after its last chunk, which the
            // file may not hold: copy what it has up to there (every chunk lies inside).
            let Some(file) = f.file() else {
                // Never written (its first write failed and moved on): no chunk is in it, so
                // its object is never read, and none is made.
                keys.push(key);
                continue;
            };
            // A length not known is no length: an object of 0 bytes would pass the upload's
            // check, and the local file would then go.
            let on_disk = match file.metadata() {
                Ok(m) => m.len(),
                Err(e) => {
                    for k in &keys {
                        tier.delete(k).await;
                    }
                    return Err(Offload::Unreadable(format!(
                        "{}: {e}; it stays on its local disk, and the next pass tries again",
                        f.path.display()
                    )));
                }
            };
            let len = (*end).min(on_disk);
            if let Err(e) = tier.upload(file.clone(), &f.path, len, &key).await {
                // This file's object too: the upload may have landed before its check failed
                // or timed out, and nothing else would ever delete it.
                for k in keys.iter().chain([&key]) {
                    tier.delete(k).await;
                }
                let why = format!("{e}; it stays on its local disk, and the next pass tries again");
                if matches!(e, crate::tier::TierError::Local { .. }) {
                    return Err(Offload::Unreadable(why));
                }
                self.stats.store_errors.fetch_add(1, Ordering::Relaxed);
                return Err(Offload::Failed(why));
            }
            keys.push(key);
            bytes += len;
        }
        let local = match shuffle.offloaded(pid, keys.clone()) {
            Ok(local) => local,
            Err(r) => {
                for k in &keys {
                    tier.delete(k).await;
                }
                return Err(Offload::Skipped(r.reason().to_owned()));
            }
        };
        // The application's bytes count in the store from here on, no longer on disk.
        let key = shuffle.key();
        self.quotas.moved_to_object_store(key.app_id(), key.shuffle_id(), bytes);
        // From here on readers are served from the store. The local files go only once the
        // commit record says where the data is: a crash before that restarts on the old record
        // and the local files (the objects are then left over in the store).
        if self.config.durable_commit {
            let (storage, s) = (self.storage.clone(), shuffle.clone());
            let written = tokio::task::spawn_blocking(move || {
                // The state read and the record written under the shuffle's record lock: a
                // commit retried meanwhile, which read the state before the switch, writes its
                // record before this one, never after it.
                // Its deletion holds the lock while it removes the files: a shuffle found not
                // deleted here keeps its directories until the record is written.
                let mut writer = s.record_writer();
                if s.is_deleted() {
                    return Err(std::io::Error::other("the shuffle was deleted meanwhile"));
                }
                let record = writer.record(|f: &FileRef| f.dir.path.display().to_string());
                crate::durable::rewrite(&storage, s.key(), &record)
            })
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(e.to_string())));
            if written.is_err() && shuffle.is_deleted() {
                return Err(Offload::Skipped("the shuffle was deleted meanwhile".into()));
            }
            if let Err(e) = written {
                let paths = local.iter().map(|f| f.path.clone()).collect();
                self.stranded.lock().push((shuffle.clone(), paths));
                return Err(Offload::Failed(format!(
                    "the commit record could not be rewritten ({e}); the partition is served \
                     from the store, and its local files, which the record on disk still names, \
                     are kept until a later pass rewrites it"
                )));
            }
        }
        let paths: Vec<_> = local.iter().map(|f| f.path.clone()).collect();
        drop(local);
        tokio::task::spawn_blocking(move || remove_moved_files(paths)).await.unwrap_or(());
        self.stats.offloaded_partitions.fetch_add(1, Ordering::Relaxed);
        self.stats.offloaded_bytes.fetch_add(bytes, Ordering::Relaxed);
        tracing::info!(shuffle = %shuffle.key(), partition = pid, bytes, objects = keys.len(),
            "partition moved to the object store; its local files are deleted");
        Ok(())
    }

    /// Rewrites the commit records of shuffles whose local files a move left behind (their
    /// record could not be rewritten then), and deletes those files once it is; a record that
    /// still cannot be written keeps them for the next pass. A deleted shuffle's go with it.
    async fn reclaim_stranded(&self) {
        let stranded = std::mem::take(&mut *self.stranded.lock());
        for (shuffle, paths) in stranded {
            if shuffle.is_deleted() {
                continue;
            }
            let (storage, s, files) = (self.storage.clone(), shuffle.clone(), paths.clone());
            let written = tokio::task::spawn_blocking(move || {
                let mut writer = s.record_writer();
                if s.is_deleted() {
                    return Ok(false);
                }
                let record = writer.record(|f: &FileRef| f.dir.path.display().to_string());
                crate::durable::rewrite(&storage, s.key(), &record)?;
                remove_moved_files(files);
                Ok(true)
            })
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(e.to_string())));
            match written {
                Ok(true) => tracing::info!(shuffle = %shuffle.key(),
                    "commit record rewritten; the local files of partitions moved to the object \
                     store are deleted"),
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(shuffle = %shuffle.key(), error = %e,
                        "the commit record still cannot be rewritten; local files of partitions \
                         moved to the object store are kept");
                    self.stranded.lock().push((shuffle, paths));
                }
            }
        }
    }

    /// Bytes of committed partitions held in the object store now.
    pub(crate) fn offloaded_bytes(&self) -> u64 {
        self.apps.shuffles().iter().map(|s| s.offloaded_bytes()).sum()
    }

    /// Drops streams that went idle or whose shuffle was deleted.
    pub(crate) fn expire_streams(&self) {
        self.streams.expire(Instant::now(), STREAM_IDLE);
    }

    /// Expires applications whose heartbeats stopped.
    pub(crate) async fn expire_apps(&self) {
        let limit = Duration::from_millis(self.config.app_expiry_ms);
        // Every expired application forgotten first, then their files deleted: the next tick's
        // call, which may start while these are deleted, finds none of them.
        // Each checked again as it is removed: one heard from meanwhile stays.
        let now = Instant::now();
        let expired: Vec<_> = (self.apps.expired(now, limit).into_iter())
            .filter_map(|id| Some((self.apps.remove_expired(&id, now, limit)?, id)))
            .collect();
        for (deleted, id) in expired {
            self.stats.apps_expired.fetch_add(1, Ordering::Relaxed);
            self.quotas.app_removed(&id);
            self.delete_app_data(&id, deleted, "expired (no heartbeat)").await;
        }
    }

    /// Stops taking new partitions before a planned stop: heartbeats report no free disk, so
    /// coordinators assign this server nothing while another server has room. What it holds is
    /// still served, and pushes to its shuffles are still taken (their map stages finish).
    pub fn start_draining(&self) {
        if !self.draining.swap(true, Ordering::AcqRel) {
            tracing::info!(
                shuffles = self.shuffles_held(),
                "draining: no new partitions; stopping once no shuffle is left"
            );
        }
    }

    /// Drains for a stop (SIGTERM) that nothing calls off: [`ServerState::stop_draining`] is
    /// refused from now on (taking new partitions, a stopping server would be assigned work it
    /// then waits for, or loses at the stop).
    pub fn start_stopping(&self) {
        self.stopping.store(true, Ordering::Release);
        self.start_draining();
    }

    /// Whether it is stopping ([`ServerState::start_stopping`]).
    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    /// Takes new partitions again after [`ServerState::start_draining`] (an operator changed
    /// their mind); idempotent. `false` (and it stays draining) while it is stopping
    /// ([`ServerState::start_stopping`]).
    pub fn stop_draining(&self) -> bool {
        if self.stopping.load(Ordering::Acquire) {
            tracing::warn!("a drain cancel refused: the server is stopping (SIGTERM)");
            return false;
        }
        if self.draining.swap(false, Ordering::AcqRel) {
            tracing::info!(
                shuffles = self.shuffles_held(),
                "drain cancelled: taking new partitions"
            );
        }
        true
    }

    /// Whether the server drains: [`ServerState::start_draining`] was called, and not
    /// [`ServerState::stop_draining`] after it.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// Shuffles held, of every application.
    pub fn shuffles_held(&self) -> usize {
        self.apps.shuffles_held()
    }

    /// Shuffles held that are not committed yet and hold data (see
    /// [`ServerConfig::durable_commit`]: the committed ones survive a restart, and so do open
    /// ones that hold nothing, once parked: [`ServerState::park_open_shuffles`]).
    pub fn unsealed_shuffles(&self) -> usize {
        self.apps.unsealed()
    }

    /// For a stop: every open shuffle that holds nothing stops taking pushes (`SHUTTING_DOWN`,
    /// which clients retry) and its registration is written next to where its data would go,
    /// so the restarted server takes its pushes. Returns `false`, with nothing parked, when
    /// some open shuffle holds data after all (a push came in meanwhile) or a record cannot be
    /// written: the stop must wait.
    pub async fn park_open_shuffles(&self) -> bool {
        let open: Vec<ShuffleRef> = self
            .apps
            .shuffles()
            .into_iter()
            .filter(|s| s.lifecycle() == crate::core::Lifecycle::Open)
            .collect();
        let mut parked: Vec<ShuffleRef> = Vec::new();
        for s in open {
            if !s.park() {
                parked.iter().for_each(|p| p.unpark());
                return false;
            }
            parked.push(s);
        }
        let storage = self.storage.clone();
        let records: Vec<_> = parked
            .iter()
            .map(|s| {
                (s.key().clone(), s.commit_record(|f: &FileRef| f.dir.path.display().to_string()))
            })
            .collect();
        let n = records.len();
        let written = tokio::task::spawn_blocking(move || {
            records.iter().try_for_each(|(key, r)| {
                crate::durable::persist(&storage, key, || r.clone(), &[], || false).map(drop)
            })
        })
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(e.to_string())));
        if let Err(e) = written {
            tracing::error!(error = %e, "cannot write the registrations of open shuffles; not stopping yet");
            parked.iter().for_each(|p| p.unpark());
            return false;
        }
        if n > 0 {
            tracing::info!(shuffles = n, "open shuffles with no data parked: pushes to them are refused (retriable) until the restart");
        }
        true
    }

    /// Bytes the shuffles' metadata takes on the heap (for metrics).
    pub(crate) fn metadata_bytes(&self) -> u64 {
        self.apps.metadata_bytes()
    }

    /// Pushes refused per quota (`app.disk_bytes`, ...), every quota listed (for metrics).
    pub(crate) fn quota_refusals(&self) -> Vec<(String, u64)> {
        self.quotas.refusals()
    }

    /// The `QuotaReport` entries (`None`: no quota is set, nothing to report); see
    /// `Quotas::at_quota`.
    pub(crate) fn at_quota(&self, window: std::time::Duration) -> Option<Vec<AtQuota>> {
        self.quotas.any_limit().then(|| self.quotas.at_quota(window))
    }

    /// Every application and what its shuffles hold now (for the status API).
    pub fn apps_report(&self) -> Vec<AppReport> {
        self.apps.report(Instant::now())
    }

    /// Partitions of all shuffles held (for heartbeats).
    pub(crate) fn partitions_held(&self) -> u32 {
        self.apps.partitions_held()
    }
}

/// Why a partition was not moved to the object store.
enum Offload {
    /// It no longer needs moving (deleted meanwhile, ...).
    Skipped(String),
    /// The store failed; the partition stays where it was.
    Failed(String),
    /// Its local file could not be read; it stays where it was, and the pass goes on.
    Unreadable(String),
}

/// Deletes the local files of a partition moved to the object store. Blocking.
fn remove_moved_files(paths: Vec<PathBuf>) {
    for p in paths {
        if let Err(e) = std::fs::remove_file(&p) {
            tracing::warn!(path = %p.display(), error = %e,
                "cannot delete a partition file moved to the object store");
        }
    }
}

/// For each data directory in service whose file system is in use above `high` (a fraction of
/// its capacity): the bytes to free to bring it down to `low`. Blocking (statvfs).
fn dirs_over(storage: &Storage, high: f64, low: f64) -> HashMap<usize, u64> {
    let mut over = HashMap::new();
    for d in storage.dirs().iter().filter(|d| !d.is_failed()) {
        let capacity = d.capacity_bytes();
        let used = capacity.saturating_sub(d.free_bytes());
        if capacity > 0 && used as f64 > high * capacity as f64 {
            let target = (low * capacity as f64) as u64;
            over.insert(d.index, used.saturating_sub(target).max(1));
        }
    }
    over
}

/// A number no other copy of a partition made by this or another server uses (object keys).
fn unique_token() -> u64 {
    use std::hash::BuildHasher;
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    // RandomState's keys are random per process: the hash mixes them into the token.
    std::collections::hash_map::RandomState::new().hash_one((n, now.map_or(0, |d| d.as_nanos())))
}

/// The first stream id of this run: the start time in seconds above 32 bits, so that no id of
/// an earlier run (which would have had to open 2^32 streams a second) comes back after a
/// restart.
fn first_stream_id() -> u64 {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    (secs << 32) | 1
}

/// Bytes of a ChunkData frame besides its body (header and fields).
fn chunk_frame_overhead() -> u64 {
    static OVERHEAD: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *OVERHEAD.get_or_init(|| {
        let m = Message::ChunkData(ChunkData { stream_id: u64::MAX, chunk_index: u32::MAX });
        sluice_proto::encode_frame(u32::MAX, &m, &[]).len() as u64
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_transport::PeerIdentity;

    #[test]
    fn only_a_user_that_can_be_vouched_for_counts_for_quotas() {
        let conn = |identity| ConnInfo {
            id: 1,
            peer: "127.0.0.1:1".parse().unwrap(),
            local: None,
            app_id: None,
            identity,
            max_frame_bytes: 1 << 20,
        };
        let r = RegisterApp { app_id: "m-1".into(), user: "etl".into() };
        // An application's credential proves its id, not the user it names: its id's user
        // (`<user>/<rest>`, chosen by the launcher that issued the credential) or none.
        let app = |id: &str| conn(PeerIdentity::App(id.into()));
        assert_eq!(vouched_user(&app("m-1"), &r), None, "an id that binds no user");
        assert_eq!(vouched_user(&app("mallory/m-1"), &r), None, "another user's name");
        assert_eq!(vouched_user(&app("etl/run-7"), &r), Some("etl"));
        let none = RegisterApp { app_id: "etl/run-7".into(), user: String::new() };
        assert_eq!(vouched_user(&app("etl/run-7"), &none), Some("etl"), "the id's, unnamed");
        assert_eq!(vouched_user(&app("/run-7"), &none), None, "an empty user binds none");
        assert_eq!(vouched_user(&conn(PeerIdentity::Anyone), &r), Some("etl"));
        assert_eq!(vouched_user(&conn(PeerIdentity::Cluster), &r), Some("etl"));
        assert_eq!(vouched_user(&conn(PeerIdentity::Anyone), &none), None);
    }
}
