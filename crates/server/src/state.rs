//! The server's state and how each request changes it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;
use sluice_proto::batch::{validate_batches, BATCH_HEADER_LEN};
use sluice_proto::message::*;
use sluice_proto::ErrorCode;
use sluice_transport::{Body, FileRegion, Response};

use crate::config::ServerConfig;
use crate::flusher::Flushers;
use crate::memory_budget::{MemoryBudget, Pressure, Reservation};
use crate::shuffle::{App, Chunk, MapEnd, Run, Shuffle};
use crate::stats::Stats;
use crate::storage::Storage;

/// A failed request: a wire code and a message for the requester.
pub type Failure = (ErrorCode, String);

fn fail<T>(code: ErrorCode, msg: impl Into<String>) -> Result<T, Failure> {
    Err((code, msg.into()))
}

/// What admission hands to the push handler: the body's memory reservation and the shuffle it
/// was admitted for, so the handler does not look the shuffle up a second time.
pub struct Admitted {
    pub reservation: Reservation,
    pub shuffle: Arc<Shuffle>,
}

/// An open read stream. It belongs to no connection: a reader may fetch its chunks over any
/// pooled connection, so it lives until `CloseStream`, its shuffle's deletion, or idleness.
struct Stream {
    shuffle: Arc<Shuffle>,
    /// What `FetchChunk` sends of each chunk (cloning a body is a reference count).
    chunks: Vec<Body>,
    last_used: Instant,
}

/// What a stream sends of a chunk: the file ranges holding the batches of the attempts in
/// `committed` (sorted by map id, one attempt per map), as one body built when the stream opens;
/// `None` when the chunk holds none of them.
fn served_body(chunk: &Chunk, committed: &[CommittedMap]) -> Option<Body> {
    let ranges = chunk.ranges(|map, attempt| {
        committed
            .binary_search_by_key(&map, |c| c.map_id)
            .is_ok_and(|i| committed[i].attempt_id == attempt)
    });
    let regions: Vec<FileRegion> = ranges
        .into_iter()
        .map(|(offset, len)| FileRegion::new(chunk.file.clone(), offset, len))
        .collect();
    Some(Body::from(regions)).filter(|b| !b.is_empty())
}

/// A stream not fetched from for this long is dropped (its reader is gone).
const STREAM_IDLE: Duration = Duration::from_secs(600);

/// Everything a server holds.
pub struct ServerState {
    pub config: ServerConfig,
    pub budget: Arc<MemoryBudget>,
    pub storage: Arc<Storage>,
    pub stats: Arc<Stats>,
    /// Receive buffers of push bodies, reused; bounded by the memory budget.
    pub body_pool: Arc<sluice_transport::BodyPool>,
    flushers: Flushers,
    apps: Mutex<HashMap<String, Arc<App>>>,
    streams: Mutex<HashMap<u64, Stream>>,
    next_stream: AtomicU64,
    /// Bytes handed to flushers and not yet written.
    flushing_bytes: Arc<AtomicU64>,
    relieving: AtomicBool,
    /// Taking no new partitions (see [`ServerState::start_draining`]).
    draining: AtomicBool,
}

impl ServerState {
    pub fn new(config: ServerConfig) -> Arc<Self> {
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
        let flushing_bytes = Arc::new(AtomicU64::new(0));
        let on_done = {
            let (flushing, stats) = (flushing_bytes.clone(), stats.clone());
            Arc::new(move |bytes: u64| {
                flushing.fetch_sub(bytes, Ordering::AcqRel);
                stats.flushed_bytes.fetch_add(bytes, Ordering::Relaxed);
            })
        };
        let body_pool = sluice_transport::BodyPool::new(
            usize::try_from(config.memory_budget_bytes).unwrap_or(usize::MAX),
        );
        let flushers = Flushers::start(
            storage.clone(),
            config.flushers_per_dir,
            config.flusher_nice,
            config.flush_write_bytes,
            on_done,
        );
        Arc::new(ServerState {
            config,
            budget,
            storage,
            stats,
            body_pool,
            flushers,
            apps: Mutex::new(HashMap::new()),
            streams: Mutex::new(HashMap::new()),
            next_stream: AtomicU64::new(1),
            flushing_bytes,
            relieving: AtomicBool::new(false),
            draining: AtomicBool::new(false),
        })
    }

    fn app(&self, app_id: &str) -> Result<Arc<App>, Failure> {
        match self.apps.lock().get(app_id) {
            Some(a) => Ok(a.clone()),
            None => fail(ErrorCode::UnknownApp, format!("application {app_id} is not registered")),
        }
    }

    fn shuffle(&self, app_id: &str, shuffle_id: u32) -> Result<Arc<Shuffle>, Failure> {
        match self.app(app_id)?.shuffles.lock().get(&shuffle_id) {
            Some(s) => Ok(s.clone()),
            None => fail(
                ErrorCode::UnknownShuffle,
                format!("shuffle {shuffle_id} of {app_id} is not registered"),
            ),
        }
    }

    /// Decides about a push before its body is read: known shuffle, open for pushes, storage
    /// available, and memory reserved for the whole body. `Err(None)`: no memory now (the
    /// caller holds the push or answers [`Self::busy_reply`]); `Err(Some(reply))`: refused.
    pub fn admit_push(
        &self,
        app_id: &str,
        shuffle_id: u32,
        body_len: u32,
    ) -> Result<Admitted, Option<Message>> {
        let to_msg = |(c, m): Failure| Some(Message::error(c, m));
        let shuffle = self.shuffle(app_id, shuffle_id).map_err(to_msg)?;
        if shuffle.is_committed() {
            return Err(to_msg((
                ErrorCode::ShuffleCommitted,
                format!("shuffle {shuffle_id} of {app_id} is committed; pushes are refused"),
            )));
        }
        // The budget pays for the memory the body will take, the pool's rounding included.
        let footprint = sluice_transport::BodyPool::footprint(body_len as usize) as u64;
        if footprint > self.budget.capacity() {
            return Err(to_msg((
                ErrorCode::InvalidRequest,
                format!(
                    "a push of {body_len} bytes ({footprint} in memory) exceeds the server's memory budget of {} bytes",
                    self.budget.capacity()
                ),
            )));
        }
        if !self.storage.has_healthy() {
            return Err(to_msg((ErrorCode::StorageUnavailable, self.storage.unavailable_reason())));
        }
        match self.budget.try_reserve(footprint) {
            Some(reservation) => Ok(Admitted { reservation, shuffle }),
            None => Err(None),
        }
    }

    /// The reply to a push there is no memory for: `Busy`, counted.
    pub fn busy_reply(&self) -> Message {
        self.stats.busy_replies.fetch_add(1, Ordering::Relaxed);
        self.relieve_pressure();
        Message::Busy(Busy { backoff_ms: self.config.busy_backoff_ms })
    }

    /// Waits, at most `busy_hold_ms`, for memory for a push that found none, with its body still
    /// unread in the socket: holding it (and so every later frame of its connection) is
    /// backpressure that costs nothing, where a `Busy` reply costs the body's whole transfer,
    /// discarded, and its resend. Ends in `Busy` if the budget stays paused.
    pub async fn hold_push(
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
                    _ = self.budget.wait_for_room() => false,
                    _ = tokio::time::sleep_until(deadline) => true,
                };
            match self.admit_push(&app_id, shuffle_id, body_len) {
                Ok(a) => break Ok(a),
                Err(Some(reply)) => break Err(reply),
                Err(None) if timed_out || !self.budget.is_paused() => break Err(self.busy_reply()),
                Err(None) => {}
            }
        };
        let held_us = start.elapsed().as_micros().min(u64::MAX as u128) as u64;
        self.stats.push_hold_us.fetch_add(held_us, Ordering::Relaxed);
        result
    }

    /// Handles one request (after admission) from a connection whose frames are at most
    /// `max_frame` bytes.
    pub async fn dispatch(
        self: Arc<Self>,
        msg: Message,
        body: Bytes,
        admitted: Option<Admitted>,
        max_frame: u32,
    ) -> Response {
        let result = match msg {
            Message::Ping(_) => Ok(Response::msg(Pong {})),
            Message::Push(p) => {
                let sections = [(p.partition_id, 0usize, body.len())];
                self.push(&p.app_id, p.shuffle_id, &sections, body, admitted)
            }
            Message::PushMerged(p) => {
                let sections: Vec<_> = p
                    .entries
                    .iter()
                    .map(|s| (s.partition_id, s.offset as usize, s.length as usize))
                    .collect();
                self.push(&p.app_id, p.shuffle_id, &sections, body, admitted)
            }
            Message::MapperEnd(m) => self.mapper_end(m),
            Message::RegisterApp(r) => Ok(self.touch_app(&r.app_id)),
            Message::AppHeartbeat(r) => Ok(self.touch_app(&r.app_id)),
            Message::UnregisterApp(r) => Ok(self.remove_app(&r.app_id, "unregistered")),
            Message::RegisterShuffle(r) => self.register_shuffle(r),
            Message::UnregisterShuffle(r) => self.unregister_shuffle(&r.app_id, r.shuffle_id),
            Message::CommitShuffle(c) => self.commit(&c.app_id, c.shuffle_id).await,
            Message::OpenStream(o) => self.open_stream(o, max_frame),
            Message::FetchChunk(f) => self.fetch_chunk(f),
            Message::CloseStream(c) => {
                self.streams.lock().remove(&c.stream_id);
                Ok(Response::msg(OkMsg {}))
            }
            other => fail(
                ErrorCode::InvalidRequest,
                format!("a server does not take {}", other.msg_type().name()),
            ),
        };
        result.unwrap_or_else(|(code, text)| {
            tracing::debug!(%code, %text, "request failed");
            self.stats.errors.fetch_add(1, Ordering::Relaxed);
            Response::msg(Message::error(code, text))
        })
    }

    fn push(
        &self,
        app_id: &str,
        shuffle_id: u32,
        sections: &[(u32, usize, usize)],
        body: Bytes,
        admitted: Option<Admitted>,
    ) -> Result<Response, Failure> {
        let (shuffle, reservation) = match admitted {
            Some(a) => (a.shuffle, Some(a.reservation)),
            None => (self.shuffle(app_id, shuffle_id)?, None),
        };
        if shuffle.deleted.load(Ordering::Acquire) {
            // Unregistered between admission and now.
            return fail(
                ErrorCode::UnknownShuffle,
                format!("shuffle {shuffle_id} of {app_id} was unregistered"),
            );
        }
        let nparts = shuffle.partitions.len() as u32;
        // Check every section before storing any: a bad batch rejects the whole push. Each
        // section's batches as runs of one map attempt (a writer is one map attempt, so one run
        // per section but for odd clients), all sections' in one list: `runs_end[i]` is where
        // section i's end.
        let mut runs: Vec<Run> = Vec::with_capacity(sections.len());
        let mut runs_end: Vec<usize> = Vec::with_capacity(sections.len());
        for &(pid, off, len) in sections {
            if pid >= nparts {
                return fail(
                    ErrorCode::InvalidRequest,
                    format!("partition {pid} of a {nparts}-partition shuffle"),
                );
            }
            let first = runs.len();
            validate_batches(&body[off..off + len], |h| {
                let size = BATCH_HEADER_LEN as u32 + h.length;
                match runs[first..].last_mut() {
                    Some(r) if (r.map_id, r.attempt_id) == (h.map_id, h.attempt_id) => {
                        r.len += size
                    }
                    _ => runs.push(Run { map_id: h.map_id, attempt_id: h.attempt_id, len: size }),
                }
            })
            .map_err(|e| (e.code(), e.to_string()))?;
            runs_end.push(runs.len());
        }
        let reservation = reservation.map(Arc::new);
        for (i, &(pid, off, len)) in sections.iter().enumerate() {
            let section_runs = &runs[if i == 0 { 0 } else { runs_end[i - 1] }..runs_end[i]];
            let mut p = shuffle.partitions[pid as usize].lock();
            if shuffle.is_committed() {
                return fail(
                    ErrorCode::ShuffleCommitted,
                    format!("shuffle {shuffle_id} of {app_id} is committed"),
                );
            }
            if let Some(why) = &p.lost {
                return fail(
                    ErrorCode::StorageFailed,
                    format!("partition {pid} cannot be stored: {why}"),
                );
            }
            // A chunk is at most `chunk_bytes`, or one section alone (which fitted its pusher's
            // frame): a section that would take a non-empty buffer past the limit sends the
            // buffer to the flushers first. Otherwise one large section on top of a nearly full
            // buffer made a chunk larger than any frame, which no reader could fetch.
            if p.buffer.bytes > 0 && p.buffer.bytes + len as u64 > self.config.chunk_bytes {
                self.submit_flush(&shuffle, pid, &mut p)?;
            }
            let mut at = off;
            for &r in section_runs {
                p.buffer.slices.push(body.slice(at..at + r.len as usize));
                p.buffer.runs.push(r);
                at += r.len as usize;
            }
            if let Some(r) = &reservation {
                p.buffer.reservations.push(r.clone());
            }
            p.buffer.bytes += len as u64;
            p.accepted_bytes += len as u64;
            if p.buffer.bytes >= self.config.chunk_bytes {
                self.submit_flush(&shuffle, pid, &mut p)?;
            }
        }
        self.stats.push_requests.fetch_add(1, Ordering::Relaxed);
        self.stats.pushed_bytes.fetch_add(body.len() as u64, Ordering::Relaxed);
        if self.budget.pressure() != Pressure::Normal {
            self.relieve_pressure();
        }
        Ok(Response::msg(PushAck {}))
    }

    fn submit_flush(
        &self,
        shuffle: &Arc<Shuffle>,
        pid: u32,
        p: &mut crate::shuffle::Partition,
    ) -> Result<(), Failure> {
        match self.flushers.submit(shuffle, pid, p) {
            Ok(queued) => {
                self.flushing_bytes.fetch_add(queued, Ordering::AcqRel);
                Ok(())
            }
            Err(e) => {
                tracing::error!(app = %shuffle.app_id, shuffle = shuffle.shuffle_id, partition = pid, "{e}");
                p.lost.get_or_insert(e.to_string());
                fail(ErrorCode::StorageUnavailable, e.to_string())
            }
        }
    }

    /// Above the flush watermark: hand the largest buffers to the flushers until what stays in
    /// memory (and is not already being flushed) is back under the resume watermark.
    pub fn relieve_pressure(&self) {
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
            for app in self.apps.lock().values() {
                for s in app.shuffles.lock().values() {
                    for (pid, p) in s.partitions.iter().enumerate() {
                        let bytes = p.lock().buffer.bytes;
                        if bytes > 0 {
                            candidates.push((bytes, s.clone(), pid as u32));
                        }
                    }
                }
            }
            candidates.sort_unstable_by_key(|c| std::cmp::Reverse(c.0));
            for (_, s, pid) in candidates {
                if need == 0 {
                    break;
                }
                let mut p = s.partitions[pid as usize].lock();
                let bytes = p.buffer.bytes;
                if self.submit_flush(&s, pid, &mut p).is_ok() {
                    need = need.saturating_sub(bytes);
                }
            }
        }
        self.relieving.store(false, Ordering::Release);
    }

    fn mapper_end(&self, m: MapperEnd) -> Result<Response, Failure> {
        let shuffle = self.shuffle(&m.app_id, m.shuffle_id)?;
        if m.map_id >= shuffle.num_maps {
            return fail(
                ErrorCode::InvalidRequest,
                format!("map {} of a {}-map shuffle", m.map_id, shuffle.num_maps),
            );
        }
        let counts: Vec<_> = m.batch_counts.iter().map(|c| (c.partition_id, c.batches)).collect();
        let Some(winner) = shuffle.mapper_end(m.map_id, m.attempt_id, &counts) else {
            return fail(
                ErrorCode::ShuffleCommitted,
                format!("map {} ended after the commit", m.map_id),
            );
        };
        Ok(Response::msg(MapperEndResult { winning_attempt: winner }))
    }

    fn touch_app(&self, app_id: &str) -> Response {
        self.apps.lock().entry(app_id.to_owned()).or_default().touch();
        Response::msg(OkMsg {})
    }

    fn remove_app(&self, app_id: &str, why: &str) -> Response {
        if let Some(app) = self.apps.lock().remove(app_id) {
            let shuffles: Vec<_> = app.shuffles.lock().drain().map(|(_, s)| s).collect();
            tracing::info!(
                app = app_id,
                shuffles = shuffles.len(),
                "application {why}; deleting its data"
            );
            for s in shuffles {
                s.delete_files(self.storage.dirs());
            }
            // The application's own directory, now empty (one was left behind per application).
            for d in self.storage.dirs() {
                let _ = std::fs::remove_dir(d.path.join(crate::shuffle::sanitize(app_id)));
            }
        }
        Response::msg(OkMsg {})
    }

    fn register_shuffle(&self, r: RegisterShuffle) -> Result<Response, Failure> {
        let app = self.apps.lock().entry(r.app_id.clone()).or_default().clone();
        app.touch();
        let mut shuffles = app.shuffles.lock();
        if let Some(s) = shuffles.get(&r.shuffle_id) {
            if s.partitions.len() as u32 != r.num_partitions || s.num_maps != r.num_maps {
                return fail(
                    ErrorCode::InvalidRequest,
                    format!(
                        "shuffle {} of {} is already registered with other sizes",
                        r.shuffle_id, r.app_id
                    ),
                );
            }
        } else {
            shuffles.insert(
                r.shuffle_id,
                Shuffle::new(&r.app_id, r.shuffle_id, r.num_maps, r.num_partitions),
            );
        }
        Ok(Response::msg(OkMsg {}))
    }

    fn unregister_shuffle(&self, app_id: &str, shuffle_id: u32) -> Result<Response, Failure> {
        let app = self.app(app_id)?;
        let removed = app.shuffles.lock().remove(&shuffle_id);
        if let Some(s) = removed {
            s.delete_files(self.storage.dirs());
        }
        Ok(Response::msg(OkMsg {}))
    }

    /// Seals a shuffle: refuse pushes, flush every buffer, wait for the flushers, report sizes.
    async fn commit(&self, app_id: &str, shuffle_id: u32) -> Result<Response, Failure> {
        let shuffle = self.shuffle(app_id, shuffle_id)?;
        let started = Instant::now();
        shuffle.committed.store(true, Ordering::Release);
        for (pid, p) in shuffle.partitions.iter().enumerate() {
            let mut p = p.lock();
            // A failure marks the partition lost; readers of it get DATA_LOST.
            let _ = self.submit_flush(&shuffle, pid as u32, &mut p);
        }
        loop {
            let flushed = shuffle.flushed.notified();
            if shuffle.inflight_flushes.load(Ordering::Acquire) == 0 {
                break;
            }
            flushed.await;
        }
        // Reused files are cut to this shuffle's data, so that no earlier shuffle's bytes (another
        // application's, perhaps) stay in them for as long as this shuffle lives. The files are
        // held (`ends`) while they are cut, so the recycle pool cannot hand one out meanwhile.
        if !shuffle.deleted.load(Ordering::Acquire) {
            let ends = shuffle.file_ends();
            let cut = tokio::task::spawn_blocking(move || crate::storage::cut_stale_tails(&ends))
                .await
                .unwrap_or(0);
            if cut > 0 {
                tracing::debug!(
                    app = app_id,
                    shuffle = shuffle_id,
                    files = cut,
                    "reused files cut"
                );
            }
        }
        shuffle.readable.store(true, Ordering::Release);
        let mut partitions = Vec::new();
        for (pid, p) in shuffle.partitions.iter().enumerate() {
            let p = p.lock();
            if let Some(why) = &p.lost {
                return fail(ErrorCode::StorageFailed, format!("partition {pid} lost: {why}"));
            }
            let bytes: u64 = p.chunks.iter().map(|c| c.len).sum();
            if bytes > 0 {
                partitions.push(PartitionSize { partition: pid as u32, bytes });
            }
        }
        self.stats.commits.fetch_add(1, Ordering::Relaxed);
        let waited = started.elapsed();
        self.stats.commit_wait_us.fetch_add(waited.as_micros() as u64, Ordering::Relaxed);
        tracing::info!(
            app = app_id,
            shuffle = shuffle_id,
            bytes = partitions.iter().map(|p| p.bytes).sum::<u64>(),
            waited_ms = waited.as_millis() as u64,
            "committed"
        );
        Ok(Response::msg(CommitResult { shuffle_id, partitions }))
    }

    fn open_stream(&self, o: OpenStream, max_frame: u32) -> Result<Response, Failure> {
        let shuffle = self.shuffle(&o.app_id, o.shuffle_id)?;
        if !shuffle.is_readable() {
            return fail(
                ErrorCode::ShuffleNotCommitted,
                format!("shuffle {} of {} is not committed yet", o.shuffle_id, o.app_id),
            );
        }
        let Some(p) = shuffle.partitions.get(o.partition_id as usize) else {
            return fail(
                ErrorCode::InvalidRequest,
                format!("partition {} does not exist", o.partition_id),
            );
        };
        if let Some(why) = &p.lock().lost {
            return fail(ErrorCode::DataLost, format!("partition {} lost: {why}", o.partition_id));
        }
        if let Some(a) = o.attempts.last().filter(|a| a.map_id >= shuffle.num_maps) {
            return fail(
                ErrorCode::InvalidRequest,
                format!("map {} of a {}-map shuffle", a.map_id, shuffle.num_maps),
            );
        }
        let maps = shuffle.maps.lock();
        let mut committed = if o.attempts.is_empty() {
            if let Some(m) = first_unended_map(&maps, o.map_start, o.map_end.min(shuffle.num_maps))
            {
                // A map attempt sends MapperEnd to every server of the shuffle (also when it has no
                // output) except those its writer gave up on, and a shuffle is committed once every
                // map has ended. A map without one here is one whose writer gave up on this server
                // part-way and went on with the other copy: what this server holds of it is
                // incomplete and must never be served as complete. The reader fails over.
                return fail(
                    ErrorCode::DataLost,
                    format!(
                        "map {m} of shuffle {} of {} has no MapperEnd on this server: its copy of \
                         partition {} is incomplete",
                        o.shuffle_id, o.app_id, o.partition_id
                    ),
                );
            }
            winners(&maps, &o)
        } else {
            match named_attempts(&maps, &o) {
                Ok(c) => c,
                Err(why) => return fail(ErrorCode::DataLost, why),
            }
        };
        drop(maps);
        committed.sort_unstable_by_key(|c| c.map_id);
        // Of each chunk, only the batches of the attempts read: other maps' (a map sub-range
        // read) and losing attempts' stay on disk. Chunks are immutable once the shuffle is
        // readable.
        let chunks: Vec<Body> = {
            let p = p.lock();
            let (start, end) = match (committed.first(), committed.last()) {
                (Some(f), Some(l)) => (f.map_id, l.map_id + 1),
                _ => (0, 0),
            };
            p.chunks
                .iter()
                .filter(|c| c.has_map_in(start, end))
                .filter_map(|c| served_body(c, &committed))
                .collect()
        };
        // Each chunk goes out as one ChunkData frame, which must fit the frames this connection
        // agreed on: a reader that proposed smaller frames than the writers used would otherwise
        // fail on the first large chunk, after the stream was opened, with no hint why.
        let room = (max_frame as u64).saturating_sub(chunk_frame_overhead());
        if let Some((i, c)) = chunks.iter().enumerate().find(|(_, c)| c.len() > room) {
            return fail(
                ErrorCode::InvalidRequest,
                format!(
                    "chunk {i} of partition {} is {} bytes, over the {max_frame}-byte frames this \
                     connection agreed on: the client's max_frame_bytes must be at least the \
                     servers' chunk_bytes plus 1 KiB, and at least the writers' frame size",
                    o.partition_id,
                    c.len()
                ),
            );
        }
        let stream_id = self.next_stream.fetch_add(1, Ordering::Relaxed);
        let chunk_lengths = chunks.iter().map(|c| c.len() as u32).collect();
        self.streams.lock().insert(
            stream_id,
            Stream { shuffle: shuffle.clone(), chunks, last_used: Instant::now() },
        );
        self.stats.streams_opened.fetch_add(1, Ordering::Relaxed);
        Ok(Response::msg(StreamHandle { stream_id, chunk_lengths, committed }))
    }

    fn fetch_chunk(&self, f: FetchChunk) -> Result<Response, Failure> {
        let mut streams = self.streams.lock();
        let Some(s) = streams.get_mut(&f.stream_id) else {
            return fail(ErrorCode::UnknownStream, format!("stream {} is not open", f.stream_id));
        };
        let Some(c) = s.chunks.get(f.chunk_index as usize) else {
            return fail(
                ErrorCode::ChunkOutOfRange,
                format!("chunk {} of {}", f.chunk_index, s.chunks.len()),
            );
        };
        s.last_used = Instant::now();
        self.stats.fetched_chunks.fetch_add(1, Ordering::Relaxed);
        self.stats.fetched_bytes.fetch_add(c.len(), Ordering::Relaxed);
        Ok(Response {
            message: ChunkData { stream_id: f.stream_id, chunk_index: f.chunk_index }.into(),
            body: c.clone(),
        })
    }

    /// Drops streams that went idle or whose shuffle was deleted.
    pub fn expire_streams(&self) {
        self.streams.lock().retain(|_, s| {
            s.last_used.elapsed() < STREAM_IDLE && !s.shuffle.deleted.load(Ordering::Acquire)
        });
    }

    /// Expires applications whose heartbeats stopped.
    pub fn expire_apps(&self) {
        let limit = Duration::from_millis(self.config.app_expiry_ms);
        let now = Instant::now();
        let expired: Vec<String> = self
            .apps
            .lock()
            .iter()
            .filter(|(_, a)| now.duration_since(*a.last_seen.lock()) > limit)
            .map(|(id, _)| id.clone())
            .collect();
        for id in expired {
            self.stats.apps_expired.fetch_add(1, Ordering::Relaxed);
            self.remove_app(&id, "expired (no heartbeat)");
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

    /// Whether [`ServerState::start_draining`] was called.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// Shuffles held, of every application.
    pub fn shuffles_held(&self) -> usize {
        self.apps.lock().values().map(|a| a.shuffles.lock().len()).sum()
    }

    /// Partitions of all shuffles held (for heartbeats).
    pub fn partitions_held(&self) -> u32 {
        self.apps
            .lock()
            .values()
            .map(|a| a.shuffles.lock().values().map(|s| s.partitions.len() as u32).sum::<u32>())
            .sum()
    }
}

/// Bytes of a ChunkData frame besides its body (header and fields).
fn chunk_frame_overhead() -> u64 {
    static OVERHEAD: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *OVERHEAD.get_or_init(|| {
        let m = Message::ChunkData(ChunkData { stream_id: u64::MAX, chunk_index: u32::MAX });
        sluice_proto::frame::encode_frame(u32::MAX, &m, &[]).len() as u64
    })
}

/// The winning attempt of each map of the stream's range that pushed to its partition.
fn winners(maps: &HashMap<u32, MapEnd>, o: &OpenStream) -> Vec<CommittedMap> {
    maps.iter()
        .filter(|(m, _)| (o.map_start..o.map_end).contains(*m))
        .filter_map(|(m, e)| {
            let batches = *e.batches.get(&o.partition_id)?;
            (batches > 0).then_some(CommittedMap { map_id: *m, attempt_id: e.attempt_id, batches })
        })
        .collect()
}

/// The attempts a reader named (`OpenStream::attempts`), each with its batches in the stream's
/// partition; or why this server cannot serve them: an attempt that did not end here (its copy
/// here is incomplete, or it never wrote here) or that pushed nothing to the partition (the
/// reader was told it has data).
fn named_attempts(
    maps: &HashMap<u32, MapEnd>,
    o: &OpenStream,
) -> Result<Vec<CommittedMap>, String> {
    let what = |a: &MapAttempt| {
        format!(
            "map {} attempt {} of shuffle {} of {}",
            a.map_id, a.attempt_id, o.shuffle_id, o.app_id
        )
    };
    o.attempts
        .iter()
        .map(|a| {
            let ended = maps.get(&a.map_id).and_then(|e| e.batches_of(a.attempt_id));
            let Some(counts) = ended else {
                return Err(format!("{} has no MapperEnd on this server", what(a)));
            };
            match counts.get(&o.partition_id) {
                Some(&batches) if batches > 0 => {
                    Ok(CommittedMap { map_id: a.map_id, attempt_id: a.attempt_id, batches })
                }
                _ => {
                    Err(format!("{} pushed nothing to partition {} here", what(a), o.partition_id))
                }
            }
        })
        .collect()
}

/// The first map of `[start, end)` with no recorded `MapperEnd`, if any. Costs one pass over the
/// ended maps, however wide the range.
fn first_unended_map(ended: &HashMap<u32, MapEnd>, start: u32, end: u32) -> Option<u32> {
    let want = end.saturating_sub(start) as usize;
    let have = ended.keys().filter(|m| (start..end).contains(*m)).count();
    if have == want {
        return None;
    }
    (start..end).find(|m| !ended.contains_key(m))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_first_map_without_an_end() {
        let end = |attempt_id| MapEnd { attempt_id, batches: HashMap::new(), later: Vec::new() };
        let ended: HashMap<u32, MapEnd> = [(0, end(0)), (1, end(3)), (3, end(0))].into();
        assert_eq!(first_unended_map(&ended, 0, 2), None);
        assert_eq!(first_unended_map(&ended, 0, 4), Some(2));
        assert_eq!(first_unended_map(&ended, 3, 4), None);
        assert_eq!(first_unended_map(&ended, 3, 5), Some(4));
        assert_eq!(first_unended_map(&ended, 2, 2), None, "an empty range");
        assert_eq!(first_unended_map(&HashMap::new(), 0, 1), Some(0));
    }
}
