//! A registered shuffle: its lifecycle, partitions and map ends, and what each request does to
//! them.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use sluice_proto::batch::{validate_batches, BATCH_HEADER_LEN};
use sluice_proto::message::{CommittedMap, OpenStream, PartitionSize, Section};
use sluice_proto::ErrorCode;

use super::buffer::COPY_BELOW;
use super::chunk::{ByteRange, Chunk, Run};
use super::key::ShuffleKey;
use super::maps::{Ended, MapEnds};
use super::partition::{ChunkSource, FileSource, FlushOutcome, FlushPlan, Partition, Removal};
use super::record::{self, Decoded, PartitionRecord, Stamp};
use super::refusal::Refusal;
use super::report::ShuffleReport;
use crate::memory_budget::Reservation;

/// Where a shuffle is in its life. It only moves forward: `Open → Committing → Readable`, and
/// from any of them to `Deleted`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[repr(u8)]
pub enum Lifecycle {
    /// Takes pushes.
    Open = 0,
    /// A commit started: pushes are refused, the buffers are being flushed.
    Committing = 1,
    /// Everything is flushed and the files are cut to their data: streams may open.
    Readable = 2,
    /// Unregistered or expired: serves nothing, its files are gone.
    Deleted = 3,
}

impl Lifecycle {
    fn from_u8(v: u8) -> Lifecycle {
        match v {
            0 => Lifecycle::Open,
            1 => Lifecycle::Committing,
            2 => Lifecycle::Readable,
            _ => Lifecycle::Deleted,
        }
    }
}

/// The result of a push: the flushes it made due (to hand to writers, whatever the result), and
/// whether it was stored.
#[derive(Debug)]
#[must_use = "the flush plans must go to a writer"]
pub struct Pushed<F> {
    /// Buffers that filled up, to be written.
    pub flushes: Vec<FlushPlan<F>>,
    /// How many sections, from the first, went into their partitions' buffers (all of them
    /// when `result` is `Ok`).
    pub stored: usize,
    /// `Ok` when every section was stored; a refusal stops at the section it names (the
    /// sections before it were stored).
    pub result: Result<(), Refusal>,
    /// Partitions of the push whose data here reached the shuffle's split threshold (each
    /// once, in the push's order).
    pub split: Vec<u32>,
}

/// What starting a commit handed out.
#[derive(Debug)]
#[must_use = "the flush plans must go to a writer"]
pub struct CommitFlushes<F> {
    /// Every buffer that held data, to be written.
    pub flushes: Vec<FlushPlan<F>>,
    /// Why each partition whose buffer had nowhere to go was lost.
    pub lost: Vec<Refusal>,
}

/// One registered shuffle on this server.
#[derive(Debug)]
pub struct Shuffle<F> {
    key: ShuffleKey,
    num_maps: u32,
    /// A buffer is flushed once it holds this many bytes; a section that would take a non-empty
    /// buffer past it sends the buffer first, so no chunk exceeds it but a single section.
    chunk_bytes: u64,
    /// A partition holding this many bytes is split ([`Pushed::split`]); `u64::MAX`: never.
    split_bytes: u64,
    /// A [`Lifecycle`]: an atomic, because every push section reads it.
    lifecycle: AtomicU8,
    partitions: Box<[Mutex<Partition<F>>]>,
    maps: Mutex<MapEnds>,
    /// Flush plans handed out and not yet reported back, over all partitions.
    flushes_in_flight: AtomicU64,
    /// Set for a shuffle whose commit record could not be read at start (why): every stream of
    /// it is `DATA_LOST`.
    lost: Option<String>,
    /// Open and empty while the server stops: pushes get `SHUTTING_DOWN` (retriable) until the
    /// restarted server, which serves it open again from its record, takes them.
    parked: std::sync::atomic::AtomicBool,
    /// Held while a commit record of the shuffle is made and written ([`Self::record_writer`]),
    /// and by its deletion while it removes the shuffle's files; the stamp of its next record.
    record: Arc<Mutex<Stamp>>,
    /// Its commit record is written, or it has none to write (`durable_commit` off): only then
    /// may its partitions move to the object store ([`Self::offloadable`]).
    recorded: std::sync::atomic::AtomicBool,
}

impl<F: Clone> Shuffle<F> {
    /// A shuffle of `num_maps` maps and `num_partitions` partitions whose chunks hold up to
    /// `chunk_bytes` each.
    pub fn new(key: ShuffleKey, num_maps: u32, num_partitions: u32, chunk_bytes: u64) -> Self {
        Shuffle {
            key,
            num_maps,
            chunk_bytes,
            split_bytes: u64::MAX,
            lifecycle: AtomicU8::new(Lifecycle::Open as u8),
            partitions: (0..num_partitions).map(|_| Mutex::new(Partition::default())).collect(),
            maps: Mutex::new(MapEnds::default()),
            flushes_in_flight: AtomicU64::new(0),
            lost: None,
            parked: std::sync::atomic::AtomicBool::new(false),
            record: Arc::new(Mutex::new(Stamp::registered_now())),
            recorded: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Splits a partition once it holds `bytes` here ([`Pushed::split`]); 0: never.
    pub fn with_split_bytes(mut self, bytes: u64) -> Self {
        self.split_bytes = if bytes == 0 { u64::MAX } else { bytes };
        self
    }

    /// Whether a restart would lose something of it: it is not committed and holds data (pushed
    /// bytes, files, or a map's end). An open shuffle with none comes back open and empty from
    /// the record [`Self::park`] allows.
    pub fn unsealed_with_data(&self) -> bool {
        if self.lifecycle() >= Lifecycle::Readable {
            return false;
        }
        if self.lifecycle() == Lifecycle::Committing || self.maps.lock().ended() > 0 {
            return true;
        }
        self.partitions.iter().any(|p| {
            let p = p.lock();
            p.buffered_bytes() > 0 || !p.chunks().is_empty() || p.has_files()
        })
    }

    /// For a stopping server: an open shuffle that holds nothing stops taking pushes
    /// (`SHUTTING_DOWN`, which clients retry) and returns `true`: its registration alone, in a
    /// record ([`Self::commit_record`]), lets the restarted server take them again. `false`
    /// (and nothing changes) when it is not open or holds data.
    pub fn park(&self) -> bool {
        if self.lifecycle() != Lifecycle::Open {
            return false;
        }
        self.parked.store(true, Ordering::Release);
        // A push admitted before the flag may have stored data meanwhile: it stays open then.
        if self.unsealed_with_data() {
            self.parked.store(false, Ordering::Release);
            return false;
        }
        true
    }

    /// Takes pushes again after [`Self::park`] (the stop was called off).
    pub fn unpark(&self) {
        self.parked.store(false, Ordering::Release);
    }

    /// A committed shuffle read back from its commit record at start: readable at once. `open`
    /// opens file `name` of a partition (partition, file number, name, the end its chunks need)
    /// or says why it cannot; a partition with a file that cannot be opened is lost.
    pub fn recovered(
        d: Decoded,
        mut open: impl FnMut(u32, u32, &str, u64) -> Result<F, String>,
    ) -> Self {
        let key = ShuffleKey::new(&d.app_id, d.shuffle_id);
        let partitions = d.partitions.into_iter().enumerate().map(|(pid, r)| {
            let stored = match r {
                Ok(PartitionRecord::Stored { files, chunks }) => {
                    let needed = |n: usize| {
                        let in_file = chunks.iter().filter(|c| c.file() as usize == n);
                        in_file.map(Chunk::padded_end).max().unwrap_or(0)
                    };
                    let opened: Result<Vec<F>, String> = files
                        .iter()
                        .enumerate()
                        .map(|(n, name)| open(pid as u32, n as u32, name, needed(n)))
                        .collect();
                    opened.map(|files| (files, chunks))
                }
                Ok(PartitionRecord::Offloaded { objects, chunks }) => {
                    return Mutex::new(Partition::recovered_offloaded(objects, chunks));
                }
                Ok(PartitionRecord::Lost(why)) => Err(why),
                Err(why) => Err(why),
            };
            Mutex::new(Partition::recovered(stored))
        });
        let lifecycle = if d.sealed { Lifecycle::Readable } else { Lifecycle::Open };
        Shuffle {
            key,
            num_maps: d.num_maps,
            chunk_bytes: d.chunk_bytes,
            split_bytes: u64::MAX,
            lifecycle: AtomicU8::new(lifecycle as u8),
            partitions: partitions.collect(),
            maps: Mutex::new(d.maps),
            flushes_in_flight: AtomicU64::new(0),
            lost: None,
            parked: std::sync::atomic::AtomicBool::new(false),
            // Its registration's, and later than the record read.
            record: Arc::new(Mutex::new(Stamp { revision: d.stamp.revision + 1, ..d.stamp })),
            // Read back from its record: written, if it says the shuffle was committed (an open
            // one is recorded again when it commits).
            recorded: std::sync::atomic::AtomicBool::new(lifecycle == Lifecycle::Readable),
        }
    }

    /// A shuffle whose commit record was found at start but cannot be read (why): it serves
    /// `DATA_LOST` to every reader, so they fail over or re-run its maps.
    pub fn lost_at_start(key: ShuffleKey, why: String) -> Self {
        let mut s = Shuffle::new(key, 0, 0, 0);
        s.lifecycle = AtomicU8::new(Lifecycle::Readable as u8);
        s.lost = Some(why);
        s
    }

    /// `DATA_LOST` for a shuffle lost at the server's restart ([`Self::lost_at_start`]).
    pub fn check_not_lost(&self) -> Result<(), Refusal> {
        match &self.lost {
            Some(why) => Err(Refusal::new(
                ErrorCode::DataLost,
                format!("{} lost at the server's restart: {why}", self.key),
            )),
            None => Ok(()),
        }
    }

    /// The commit record of a readable shuffle (see `record`): its map ends and each
    /// partition's files, named by `name`, and chunk index. Of a parked one (see
    /// [`Self::park`]): its registration, marked not sealed, read back as an open shuffle.
    pub fn commit_record(&self, name: impl Fn(&F) -> String) -> Vec<u8> {
        self.record_writer().record(name)
    }

    /// [`Self::commit_record`], stamped `stamp`.
    fn stamped_record(&self, stamp: Stamp, name: impl Fn(&F) -> String) -> Vec<u8> {
        let mut out = record::start(
            (self.key.app_id(), self.key.shuffle_id()),
            (self.num_maps, self.chunk_bytes),
            (self.lifecycle() == Lifecycle::Readable, &self.maps.lock()),
            self.partitions.len() as u32,
        );
        for p in self.partitions.iter() {
            record::put_partition(&mut out, &p.lock().record(&name));
        }
        record::finish(&mut out, stamp);
        out
    }

    /// Which shuffle this is.
    pub fn key(&self) -> &ShuffleKey {
        &self.key
    }

    /// Its number of maps.
    pub fn num_maps(&self) -> u32 {
        self.num_maps
    }

    /// Its number of partitions.
    pub fn num_partitions(&self) -> u32 {
        self.partitions.len() as u32
    }

    /// Where it is in its life.
    pub fn lifecycle(&self) -> Lifecycle {
        Lifecycle::from_u8(self.lifecycle.load(Ordering::Acquire))
    }

    /// Moves the lifecycle forward to `to` (never back); returns the state it was in.
    fn advance(&self, to: Lifecycle) -> Lifecycle {
        Lifecycle::from_u8(self.lifecycle.fetch_max(to as u8, Ordering::AcqRel))
    }

    /// Whether it was deleted.
    pub fn is_deleted(&self) -> bool {
        self.lifecycle() == Lifecycle::Deleted
    }

    /// Flush plans handed out and not reported back, over all partitions.
    pub fn flushes_in_flight(&self) -> u64 {
        self.flushes_in_flight.load(Ordering::Acquire)
    }

    /// A look at one partition (for checks; changes go through the shuffle).
    #[cfg(any(test, feature = "fuzzing"))]
    pub fn partition(&self, pid: u32) -> Option<parking_lot::MutexGuard<'_, Partition<F>>> {
        self.partitions.get(pid as usize).map(|p| p.lock())
    }

    /// Refuses what the lifecycle forbids a push.
    fn check_open(&self) -> Result<(), Refusal> {
        match self.lifecycle() {
            Lifecycle::Open if self.parked.load(Ordering::Acquire) => Err(Refusal::new(
                ErrorCode::ShuttingDown,
                format!("the server is restarting; {} takes pushes again after it", self.key),
            )),
            Lifecycle::Open => Ok(()),
            Lifecycle::Deleted => Err(Refusal::new(
                ErrorCode::UnknownShuffle,
                format!("{} was unregistered", self.key),
            )),
            _ => Err(Refusal::new(
                ErrorCode::ShuffleCommitted,
                format!("{} is committed; pushes are refused", self.key),
            )),
        }
    }

    /// Whether a push may come in (checked at admission, before its body is read).
    pub fn admits_pushes(&self) -> Result<(), Refusal> {
        self.check_open()
    }

    /// Stores a push: `sections` of `body`, each a sequence of whole batches for one partition.
    /// Every section is checked (partition number, batch framing and CRCs) before any is stored:
    /// a bad batch refuses the whole push. `reservation` pays for the body's memory; it is freed
    /// when the last partition holding a slice of it has flushed (small sections are copied
    /// and free it at once, see `buffer`). A buffer is flushed when it holds the shuffle's chunk
    /// size.
    #[cfg(any(test, feature = "fuzzing"))]
    pub fn push(
        &self,
        sections: &[Section],
        body: &Bytes,
        reservation: Option<Reservation>,
        files: &impl FileSource<F>,
    ) -> Pushed<F> {
        self.push_flushing_at(sections, body, reservation, files, u64::MAX)
    }

    /// [`Self::push`], also flushing a buffer of the push's partitions that holds `early` bytes
    /// or more: what the shell asks for while its writers are idle, so that the disks take the
    /// data as it comes rather than all at the commit.
    pub fn push_flushing_at(
        &self,
        sections: &[Section],
        body: &Bytes,
        reservation: Option<Reservation>,
        files: &impl FileSource<F>,
        early: u64,
    ) -> Pushed<F> {
        let mut pushed =
            Pushed { flushes: Vec::new(), stored: 0, result: Ok(()), split: Vec::new() };
        let data = (body, reservation, early.min(self.chunk_bytes));
        pushed.result = self.push_sections(sections, data, files, &mut pushed);
        pushed
    }

    fn push_sections(
        &self,
        sections: &[Section],
        (body, mut reservation, flush_at): (&Bytes, Option<Reservation>, u64),
        files: &impl FileSource<F>,
        out: &mut Pushed<F>,
    ) -> Result<(), Refusal> {
        let Pushed { flushes, stored, split, .. } = out;
        self.check_open()?;
        let nparts = self.num_partitions();
        // Each section's batches as runs of one map attempt (a writer is one map attempt, so one
        // run per section but for odd clients), all sections' in one list: `runs_end[i]` is where
        // section i's end.
        let mut runs: Vec<Run> = Vec::with_capacity(sections.len());
        let mut runs_end: Vec<usize> = Vec::with_capacity(sections.len());
        for s in sections {
            if s.partition_id >= nparts {
                return Err(Refusal::new(
                    ErrorCode::InvalidRequest,
                    format!("partition {} of a {nparts}-partition shuffle", s.partition_id),
                ));
            }
            let Some(bytes) = section_bytes(body, s) else {
                return Err(Refusal::new(
                    ErrorCode::InvalidRequest,
                    "push section outside the body",
                ));
            };
            let first = runs.len();
            let mut outside_maps = None;
            validate_batches(bytes, |h| {
                if h.map_id >= self.num_maps {
                    outside_maps.get_or_insert(h.map_id);
                }
                let size = BATCH_HEADER_LEN as u32 + h.length;
                match runs[first..].last_mut() {
                    Some(r) if (r.map_id, r.attempt_id) == (h.map_id, h.attempt_id) => {
                        r.len += size
                    }
                    _ => runs.push(Run { map_id: h.map_id, attempt_id: h.attempt_id, len: size }),
                }
            })
            .map_err(|e| Refusal::new(e.code(), e.to_string()))?;
            if let Some(m) = outside_maps {
                // Stored, it could never be read: streams name maps below `num_maps`.
                return Err(Refusal::new(
                    ErrorCode::InvalidRequest,
                    format!("a batch of map {m} in a {}-map shuffle", self.num_maps),
                ));
            }
            runs_end.push(runs.len());
        }
        // Small sections are copied into their partitions' buffers (see `buffer`), paid for by
        // reservations of their own: a body all of whose sections were copied is freed when
        // the push returns. The rest stay slices of the body, which `shared` then pays for.
        let mut shared: Option<Arc<Reservation>> = None;
        for (i, s) in sections.iter().enumerate() {
            let section_runs = &runs[if i == 0 { 0 } else { runs_end[i - 1] }..runs_end[i]];
            let (pid, len) = (s.partition_id, s.length as u64);
            let mut p = self.partitions[pid as usize].lock();
            // Under the partition lock: a commit that started meanwhile flushes this partition
            // only after us, or refuses us here.
            self.check_open()?;
            p.check_storing(pid)?;
            if p.buffered_bytes() > 0 && p.buffered_bytes() + len > self.chunk_bytes {
                flushes.extend(self.take_locked(pid, &mut p, files)?);
            }
            let data = &body[s.offset as usize..(s.offset + s.length) as usize];
            let like = reservation.as_ref().or(shared.as_deref());
            let copied = match like {
                Some(r) if data.len() < COPY_BELOW => p.copy_in(data, r),
                _ => false,
            };
            if !copied {
                if shared.is_none() {
                    shared = reservation.take().map(Arc::new);
                }
                let mut at = s.offset as usize;
                let slices = section_runs.iter().map(|r| {
                    let slice = body.slice(at..at + r.len as usize);
                    at += r.len as usize;
                    (slice, *r)
                });
                p.append(slices, len, shared.as_ref());
            }
            *stored += 1;
            if p.held_bytes() >= self.split_bytes && !split.contains(&pid) {
                split.push(pid);
            }
            if p.buffered_bytes() >= flush_at {
                flushes.extend(self.take_locked(pid, &mut p, files)?);
            }
        }
        Ok(())
    }

    fn take_locked(
        &self,
        pid: u32,
        p: &mut Partition<F>,
        files: &impl FileSource<F>,
    ) -> Result<Option<FlushPlan<F>>, Refusal> {
        let plan = p.take_flush(&self.key, pid, files)?;
        if plan.is_some() {
            self.flushes_in_flight.fetch_add(1, Ordering::AcqRel);
        }
        Ok(plan)
    }

    /// Hands partition `pid`'s buffer out as a flush plan (to relieve memory pressure).
    /// `Ok(None)`: nothing buffered.
    pub fn take_flush(
        &self,
        pid: u32,
        files: &impl FileSource<F>,
    ) -> Result<Option<FlushPlan<F>>, Refusal> {
        let Some(p) = self.partitions.get(pid as usize) else { return Ok(None) };
        self.take_locked(pid, &mut p.lock(), files)
    }

    /// Hands out, as flush plans, the buffers of an open shuffle that hold at least `min_bytes`
    /// and already did at the previous call: called at an interval while the writers are
    /// idle, it sends data that keeps waiting for more to disk, so a commit finds little left
    /// to write and sync. Each partition whose buffer has nowhere to go is lost (the refusals
    /// say why).
    pub fn flush_aged(
        &self,
        min_bytes: u64,
        files: &impl FileSource<F>,
    ) -> (Vec<FlushPlan<F>>, Vec<Refusal>) {
        let (mut plans, mut lost) = (Vec::new(), Vec::new());
        if self.lifecycle() != Lifecycle::Open {
            return (plans, lost);
        }
        for (pid, p) in self.partitions.iter().enumerate() {
            let mut p = p.lock();
            if p.buffered_bytes() < min_bytes.max(1) || !p.aged() {
                continue;
            }
            match self.take_locked(pid as u32, &mut p, files) {
                Ok(plan) => plans.extend(plan),
                Err(r) => lost.push(r),
            }
        }
        (plans, lost)
    }

    /// Bytes buffered per partition, of the partitions that buffer any.
    pub fn buffered(&self) -> Vec<(u32, u64)> {
        let each = self.partitions.iter().enumerate();
        each.map(|(pid, p)| (pid as u32, p.lock().buffered_bytes())).filter(|x| x.1 > 0).collect()
    }

    /// Points a plan whose write failed at a new place (see [`Partition`]).
    pub fn retarget(
        &self,
        plan: &mut FlushPlan<F>,
        files: &impl FileSource<F>,
    ) -> Result<(), String> {
        self.partitions[plan.partition() as usize].lock().retarget(&self.key, plan, files)
    }

    /// Takes a plan back with its outcome; returns whether it was the shuffle's last flush in
    /// flight (a commit may be waiting for that). The plan's memory is freed before this
    /// returns.
    pub fn flushed(&self, plan: FlushPlan<F>, outcome: FlushOutcome) -> bool {
        self.partitions[plan.partition() as usize].lock().flushed(plan, outcome);
        self.flushes_in_flight.fetch_sub(1, Ordering::AcqRel) == 1
    }

    /// Records a map attempt's `MapperEnd` (`counts`: partition → batches pushed there); returns
    /// the map's winning attempt, and whether this attempt was one too many to remember.
    pub fn mapper_end(
        &self,
        map_id: u32,
        attempt_id: u32,
        counts: &[(u32, u32)],
    ) -> Result<(u32, bool), Refusal> {
        if map_id >= self.num_maps {
            return Err(Refusal::new(
                ErrorCode::InvalidRequest,
                format!("map {map_id} of a {}-map shuffle", self.num_maps),
            ));
        }
        let nparts = self.num_partitions();
        if let Some((pid, _)) = counts.iter().find(|c| c.0 >= nparts) {
            return Err(Refusal::new(
                ErrorCode::InvalidRequest,
                format!("map {map_id} reports batches of partition {pid} of a {nparts}-partition shuffle"),
            ));
        }
        let committed = self.lifecycle() != Lifecycle::Open;
        if !committed && self.parked.load(Ordering::Acquire) {
            // Its record is written (or being written) without it: kept only in memory, it
            // would be lost at the restart. Retried, it reaches the restarted server.
            return Err(Refusal::new(
                ErrorCode::ShuttingDown,
                format!("the server is restarting; {} takes map ends again after it", self.key),
            ));
        }
        match self.maps.lock().record(map_id, attempt_id, counts, committed) {
            (Ended::Winner(w), dropped) => Ok((w, dropped)),
            (Ended::NotKept, _) => Err(Refusal::new(
                ErrorCode::ShuffleCommitted,
                format!("map {map_id} ended after the commit"),
            )),
        }
    }

    /// Starts (or repeats) a commit: pushes are refused from now on, and every buffer is handed
    /// out for flushing; a partition whose buffer has nowhere to go is lost, and its refusal is
    /// returned beside the plans (for the log). The commit is done once
    /// [`Self::flushes_in_flight`] is 0: then [`Self::finish_commit`].
    pub fn begin_commit(&self, files: &impl FileSource<F>) -> Result<CommitFlushes<F>, Refusal> {
        // A shuffle lost at the server's restart has nothing to commit: answering with its
        // (no) partitions would tell the client the data is there and empty.
        self.check_not_lost()?;
        if self.advance(Lifecycle::Committing) == Lifecycle::Deleted {
            return Err(Refusal::new(
                ErrorCode::UnknownShuffle,
                format!("{} was unregistered", self.key),
            ));
        }
        let (mut plans, mut lost) = (Vec::new(), Vec::new());
        for (pid, p) in self.partitions.iter().enumerate() {
            // A failure marks the partition lost; readers of it get DATA_LOST.
            match self.take_locked(pid as u32, &mut p.lock(), files) {
                Ok(Some(plan)) => plans.push(plan),
                Ok(None) => {}
                Err(r) => lost.push(r),
            }
        }
        Ok(CommitFlushes { flushes: plans, lost })
    }

    /// Every file holding the shuffle's data, with where that data ends (see
    /// [`Partition`]): what a commit cuts reused files to.
    pub fn file_ends(&self) -> Vec<(F, u64)> {
        let mut out = Vec::new();
        for p in self.partitions.iter() {
            p.lock().file_ends(&mut out);
        }
        out
    }

    /// Ends a commit whose flushes are all done: the shuffle becomes readable. Returns the
    /// bytes of each partition holding any, or the first lost partition.
    pub fn finish_commit(&self) -> Result<Vec<PartitionSize>, Refusal> {
        debug_assert_eq!(self.flushes_in_flight(), 0, "a commit finishes after its flushes");
        if self.advance(Lifecycle::Readable) == Lifecycle::Deleted {
            return Err(Refusal::new(
                ErrorCode::UnknownShuffle,
                format!("{} was unregistered", self.key),
            ));
        }
        let mut sizes = Vec::new();
        for (pid, p) in self.partitions.iter().enumerate() {
            let mut p = p.lock();
            p.seal();
            if let Some(why) = p.lost() {
                return Err(Refusal::new(
                    ErrorCode::StorageFailed,
                    format!("partition {pid} lost: {why}"),
                ));
            }
            let bytes: u64 = p.chunks().iter().map(|c| c.len()).sum();
            if bytes > 0 {
                sizes.push(PartitionSize { partition: pid as u32, bytes });
            }
        }
        Ok(sizes)
    }

    /// What a stream of `o` serves: the attempts it reads (sorted by map) and, of each chunk
    /// holding any of their batches, those batches' byte ranges, made into a body by `body`
    /// (given the chunk's file). A map attempt the stream would read but that has no complete
    /// copy here is `DATA_LOST`: the reader fails over, never reads a partial copy. Consecutive
    /// chunks of a file are served as one of up to the shuffle's chunk size.
    #[cfg(any(test, feature = "fuzzing"))]
    pub fn open_stream<B>(
        &self,
        o: &OpenStream,
        body: impl FnMut(ChunkSource<'_, F>, &[ByteRange]) -> B,
    ) -> Result<(Vec<B>, Vec<CommittedMap>), Refusal> {
        self.open_stream_within(o, self.chunk_bytes, body)
    }

    /// [`Self::open_stream`], merging consecutive chunks only up to `max_chunk` bytes (what
    /// the reader's frames hold, when less than the chunk size).
    pub fn open_stream_within<B>(
        &self,
        o: &OpenStream,
        max_chunk: u64,
        body: impl FnMut(ChunkSource<'_, F>, &[ByteRange]) -> B,
    ) -> Result<(Vec<B>, Vec<CommittedMap>), Refusal> {
        let state = self.lifecycle();
        if state != Lifecycle::Readable {
            return Err(match state {
                Lifecycle::Deleted => Refusal::new(
                    ErrorCode::UnknownShuffle,
                    format!("{} was unregistered", self.key),
                ),
                _ => Refusal::new(
                    ErrorCode::ShuffleNotCommitted,
                    format!("{} is not committed yet", self.key),
                ),
            });
        }
        let pid = o.partition_id;
        self.check_not_lost()?;
        let Some(p) = self.partitions.get(pid as usize) else {
            let why = format!("partition {pid} does not exist");
            return Err(Refusal::new(ErrorCode::InvalidRequest, why));
        };
        if let Some(why) = p.lock().lost() {
            return Err(Refusal::new(ErrorCode::DataLost, format!("partition {pid} lost: {why}")));
        }
        if let Some(a) = o.attempts.last().filter(|a| a.map_id >= self.num_maps) {
            let why = format!("map {} of a {}-map shuffle", a.map_id, self.num_maps);
            return Err(Refusal::new(ErrorCode::InvalidRequest, why));
        }
        let mut committed = {
            let maps = self.maps.lock();
            if o.attempts.is_empty() {
                if let Some(m) = maps.first_unended(o.map_start, o.map_end.min(self.num_maps)) {
                    // A map attempt sends MapperEnd to every server of the shuffle (also when it
                    // has no output) except those its writer gave up on, and a shuffle is
                    // committed once every map has ended. A map without one here is one whose
                    // writer gave up on this server part-way and went on with the other copy:
                    // what this server holds of it is incomplete.
                    return Err(Refusal::new(
                        ErrorCode::DataLost,
                        format!(
                            "map {m} of {} has no MapperEnd on this server: its copy of \
                             partition {pid} is incomplete",
                            self.key
                        ),
                    ));
                }
                maps.winners(o.map_start, o.map_end, pid)
            } else {
                maps.named(&o.attempts, pid).map_err(|(a, why)| {
                    let what = format!("map {} attempt {} of {}", a.map_id, a.attempt_id, self.key);
                    Refusal::new(ErrorCode::DataLost, format!("{what} {why} (partition {pid})"))
                })?
            }
        };
        committed.sort_unstable_by_key(|c| c.map_id);
        let span = match (committed.first(), committed.last()) {
            (Some(f), Some(l)) => (f.map_id, l.map_id + 1),
            _ => (0, 0),
        };
        // Chunks never change once the shuffle is readable.
        let wanted = |map: u32, attempt: u32| {
            committed
                .binary_search_by_key(&map, |c| c.map_id)
                .is_ok_and(|i| committed[i].attempt_id == attempt)
        };
        let bodies = p.lock().serve(span, wanted, max_chunk.min(self.chunk_bytes), body)?;
        Ok((bodies, committed))
    }

    /// Bytes the shuffle's metadata holds on the heap: its partitions (chunk index, files,
    /// buffer bookkeeping) and map ends; not the pushed bytes buffered (the memory budget's).
    pub fn metadata_bytes(&self) -> u64 {
        let parts = self.partitions.len() * std::mem::size_of::<Mutex<Partition<F>>>();
        let each: usize = self.partitions.iter().map(|p| p.lock().heap_bytes()).sum();
        (std::mem::size_of::<Self>() + parts + each + self.maps.lock().heap_bytes()) as u64
    }

    /// The partitions that lost data, with why.
    pub fn lost_partitions(&self) -> Vec<(u32, String)> {
        let each = self.partitions.iter().enumerate();
        each.filter_map(|(pid, p)| p.lock().lost().map(|why| (pid as u32, why.to_owned())))
            .collect()
    }

    /// What the shuffle holds now.
    pub fn report(&self) -> ShuffleReport {
        let mut r = ShuffleReport {
            shuffle_id: self.key.shuffle_id(),
            state: self.lifecycle(),
            maps: self.num_maps,
            maps_ended: self.maps.lock().ended(),
            partitions: self.num_partitions(),
            lost_partitions: 0,
            buffered_bytes: 0,
            stored_bytes: 0,
            offloaded_bytes: 0,
            chunks: 0,
            flushes_in_flight: self.flushes_in_flight(),
        };
        for p in self.partitions.iter() {
            let p = p.lock();
            r.lost_partitions += u32::from(p.lost().is_some());
            r.buffered_bytes += p.buffered_bytes();
            r.stored_bytes += p.chunks().iter().map(|c| c.len()).sum::<u64>();
            r.offloaded_bytes += p.offloaded_bytes();
            r.chunks += p.chunks().len() as u64;
        }
        r
    }

    /// Deletes the shuffle: it serves nothing from now on and every buffer is freed. Returns
    /// its partitions' files, which the shell retires (the current ones it may recycle), and
    /// the keys of the objects in the object store that held its offloaded partitions, which
    /// the shell deletes.
    pub fn delete(&self) -> Removal<F> {
        self.advance(Lifecycle::Deleted);
        let mut all = Removal::default();
        for p in self.partitions.iter() {
            let Removal { current, older, objects } = p.lock().delete();
            all.current.extend(current);
            all.older.extend(older);
            all.objects.extend(objects);
        }
        all
    }

    /// The partitions of a readable shuffle that may move to the object store, each with its
    /// files and where its data in each ends (see `Partition`); none while it is not readable,
    /// nor before its commit record is written ([`Self::mark_recorded`]: a move rewrites the
    /// record, which must exist, and must not race the commit's).
    pub fn offloadable(&self) -> Vec<(u32, Vec<(F, u64)>)> {
        if self.lifecycle() != Lifecycle::Readable || self.lost.is_some() || !self.is_recorded() {
            return Vec::new();
        }
        let each = self.partitions.iter().enumerate();
        each.filter_map(|(pid, p)| Some((pid as u32, p.lock().offloadable()?))).collect()
    }

    /// Held by whoever makes and writes a commit record of the shuffle (the commit, a move to the
    /// object store), from reading its state to the record's publication: two writers one
    /// after the other, so the record written last holds the state seen last, and stamped
    /// later. Its deletion holds it too while it removes the files ([`Self::record_lock`]): a
    /// writer holding it that finds the shuffle not deleted writes before the removal.
    /// Blocking.
    pub fn record_writer(&self) -> RecordWriter<'_, F> {
        RecordWriter { shuffle: self, stamp: self.record.lock() }
    }

    /// The lock [`Self::record_writer`] holds, for the deletion (see `Deleted`).
    pub(super) fn record_lock(&self) -> Arc<Mutex<Stamp>> {
        self.record.clone()
    }

    /// Its commit record is written (or it has none: `durable_commit` off); see
    /// [`Self::offloadable`].
    pub fn mark_recorded(&self) {
        self.recorded.store(true, Ordering::Release);
    }

    /// Whether [`Self::mark_recorded`] was called (or it was read back from its record).
    pub fn is_recorded(&self) -> bool {
        self.recorded.load(Ordering::Acquire)
    }

    /// Partition `pid`'s files were copied to `objects` (one key per file number): its chunks
    /// are served from them from now on. Returns its local files, to delete once the commit
    /// record says where the data is; `Err` (nothing changed) when the partition no longer
    /// holds them (the shuffle was deleted meanwhile, ...): delete the objects instead.
    pub fn offloaded(&self, pid: u32, objects: Vec<String>) -> Result<Vec<F>, Refusal> {
        let Some(p) = self.partitions.get(pid as usize) else {
            let why = format!("partition {pid} does not exist");
            return Err(Refusal::new(ErrorCode::InvalidRequest, why));
        };
        // The partition's own health, under its lock, decides: a deletion marks every
        // partition deleted under their locks, so it either sees the objects or refuses them.
        p.lock().offloaded(objects).map_err(|why| {
            Refusal::new(ErrorCode::UnknownShuffle, format!("{} partition {pid}: {why}", self.key))
        })
    }

    /// Bytes of its chunks that are in the object store.
    pub fn offloaded_bytes(&self) -> u64 {
        self.partitions.iter().map(|p| p.lock().offloaded_bytes()).sum()
    }
}

/// The right to make a shuffle's commit records ([`Shuffle::record_writer`]), each stamped
/// later than the one before.
pub struct RecordWriter<'a, F> {
    shuffle: &'a Shuffle<F>,
    stamp: parking_lot::MutexGuard<'a, Stamp>,
}

impl<F: Clone> RecordWriter<'_, F> {
    /// The shuffle's commit record now (see [`Shuffle::commit_record`]).
    pub fn record(&mut self, name: impl Fn(&F) -> String) -> Vec<u8> {
        let stamp = *self.stamp;
        self.stamp.revision += 1;
        self.shuffle.stamped_record(stamp, name)
    }
}

/// The bytes of `s` in `body`, if it lies inside.
fn section_bytes<'a>(body: &'a Bytes, s: &Section) -> Option<&'a [u8]> {
    let start = s.offset as usize;
    body.get(start..start.checked_add(s.length as usize)?)
}
