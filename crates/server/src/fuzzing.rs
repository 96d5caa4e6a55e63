//! Operation sequences applied to the shuffle core, with its invariants checked after every step
//! (feature `fuzzing`; the `core_ops` fuzz target and this crate's tests use it).
//!
//! A [`Harness`] holds one application's shuffle in the core, a fake disk (files are numbers,
//! their bytes a `Vec`), the flush plans handed out and not yet carried out, open streams, and a
//! model of what was pushed: every batch has a unique id, and each push is remembered as
//! acknowledged (its whole body stored) or refused (some of its sections may have been stored).
//! After each [`Op`] it checks:
//! - the memory budget's usage equals the reservations of the pushes whose bytes some buffer or
//!   flush plan still holds (nothing leaks, nothing is freed early);
//! - every chunk lies inside what was written of its file, and no two chunks overlap;
//! - a deleted shuffle holds, records and serves nothing, and never gets a file again;
//! - a partition is lost only after something that can lose it (a failed write given up, no
//!   file to be had), and a plan reported lost does lose it;
//! - after each commit, every chunk lies within its file's end as the commit cuts it;
//! - only a readable shuffle's partitions that hold chunks in files are offered to the object
//!   store, a move hands back exactly the files offered, and a moved partition serves the same
//!   bytes from its objects (named after its files here, so they are read off the fake disk),
//!   also after a restart from its record.
//!
//! Each stream it asks for is checked against the model: refused with the right code exactly
//! when it must be (not committed, no such partition, partition lost, a map of the range with
//! no `MapperEnd`, a named attempt that did not end or pushed nothing there), and otherwise
//! reading exactly the attempts the model says (each map's first `MapperEnd`, or the named
//! ones) with the batch counts they reported. Every byte read is a whole batch with a good CRC,
//! of an attempt the stream reads; no batch is served twice; every acknowledged batch of those
//! attempts is served; nothing is served that was not pushed to the partition. Chunk fetches
//! answer `UNKNOWN_STREAM` exactly for streams closed, expired or of a deleted shuffle.
//!
//! Everything is deterministic: no threads, no clock (time is a counter), no files.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arbitrary::{Arbitrary, Unstructured};
use bytes::{Bytes, BytesMut};
use sluice_proto::batch::{put_batch, split_batches};
use sluice_proto::message::{MapAttempt, OpenStream, RegisterShuffle, Section};
use sluice_proto::ErrorCode;

use crate::core::{
    padded_len, Apps, ByteRange, ChunkSource, FileSource, FlushOutcome, FlushPlan, Lifecycle,
    Shuffle, ShuffleKey, Streams, COPY_BELOW,
};
use crate::memory_budget::MemoryBudget;

const APP: &str = "app";
const SHUFFLE: u32 = 7;
const MAPS: u32 = 2;
const PARTITIONS: u32 = 3;
/// Small, so pushes fill buffers and make flush plans often.
const CHUNK_BYTES: u64 = 200;
/// Marks a model buffer entry as a copied section (the push id in the other bits).
const COPIED: u64 = 1 << 63;
const STREAM_IDLE: Duration = Duration::from_secs(60);

/// One thing that can happen to a shuffle, in the order a fuzzer picks.
#[derive(Debug, Clone, Arbitrary)]
pub enum Op {
    /// Registers the shuffle (again, after an unregister: a new one under the same id).
    Register,
    /// A push of one or more sections, each some batches of one map attempt.
    Push {
        /// `(partition, map, attempt, batches, payload bytes per batch)`; a partition past the
        /// shuffle's makes the whole push invalid.
        sections: Vec<(u8, u8, u8, u8, u8)>,
    },
    /// A writer carries out the `which`-th pending flush plan.
    FlushDone {
        /// Index into the pending plans (modulo their number).
        which: u8,
    },
    /// A pending flush plan's write fails: it is pointed elsewhere, or reported lost.
    FlushFailed {
        /// Index into the pending plans (modulo their number).
        which: u8,
        /// Report the plan lost instead of retargeting it.
        give_up: bool,
    },
    /// Memory pressure: a partition's buffer is handed out.
    Relieve {
        /// The partition (modulo the shuffle's).
        partition: u8,
    },
    /// A map attempt reports its end, with the batches it had acknowledged per partition.
    MapperEnd {
        /// The map (modulo a little more than the shuffle's, so some are out of range).
        map: u8,
        /// The attempt.
        attempt: u8,
    },
    /// The driver commits: buffers go out, and the commit finishes once nothing is in flight.
    Commit,
    /// A reader opens a stream and reads every chunk of it.
    OpenStream {
        /// The partition (modulo a little more than the shuffle's).
        partition: u8,
        /// Start of the map range.
        map_start: u8,
        /// Length of the map range.
        maps: u8,
        /// Named attempts instead of the winners: `(map, attempt)`.
        named: Option<Vec<(u8, u8)>>,
    },
    /// A reader fetches one chunk of an open stream.
    FetchChunk {
        /// Index into the streams opened so far.
        stream: u8,
        /// The chunk.
        chunk: u8,
    },
    /// A reader closes a stream.
    CloseStream {
        /// Index into the streams opened so far.
        stream: u8,
    },
    /// The application unregisters the shuffle.
    Unregister,
    /// The disk under the partitions' current files fails (they are not kept), or every
    /// directory is out (no file can be opened), or all is well again.
    Disk {
        /// 0: healthy; 1: current files not kept; 2: nothing can be opened.
        state: u8,
    },
    /// The server restarts: a readable shuffle comes back from its commit record (encoded and
    /// decoded, as a restarted server reads it), and every stream is gone; it must serve the
    /// same bytes as before. (An unsealed shuffle is not restarted: a restart deletes it.)
    Restart,
    /// The disks fill: committed partitions are offered to the object store, and partition
    /// `partition` (modulo the shuffle's) moves there if it is among them.
    Offload {
        /// The partition.
        partition: u8,
    },
    /// Time passes; idle streams expire.
    Tick {
        /// Seconds.
        secs: u8,
    },
}

/// A fake partition file: a number.
type FakeFile = u32;

/// The fake storage: hands out file numbers, and can be told to refuse.
#[derive(Debug, Default)]
struct FakeStorage {
    next: std::cell::Cell<u32>,
    /// 0: healthy; 1: current files are not kept; 2: nothing can be opened.
    state: u8,
    /// The shuffle under its key was deleted (and not registered again): no file may be opened.
    deleted: std::cell::Cell<bool>,
}

impl FileSource<FakeFile> for FakeStorage {
    fn keeps(&self, _current: &FakeFile) -> bool {
        self.state == 0
    }

    fn open(&self, _key: &ShuffleKey, _partition: u32, _n: u32) -> Result<FakeFile, String> {
        assert!(!self.deleted.get(), "a file opened for a deleted shuffle");
        if self.state == 2 {
            return Err("every directory is out (fuzz)".into());
        }
        let n = self.next.get();
        self.next.set(n + 1);
        Ok(n)
    }
}

/// What a stream sends of a chunk: byte ranges of a fake file.
#[derive(Debug, Clone)]
struct Served {
    file: FakeFile,
    ranges: Vec<ByteRange>,
}

/// A pushed batch in the model.
#[derive(Debug, Clone, Copy)]
struct PushedBatch {
    partition: u32,
    map: u32,
    attempt: u32,
    /// Whether its push was acknowledged (else it may or may not be stored).
    acked: bool,
}

/// A flush plan handed out and not yet carried out: its shuffle, the plan, and the pushes whose
/// bytes it holds.
type Pending = (Arc<Shuffle<FakeFile>>, FlushPlan<FakeFile>, Vec<u64>);

/// A stream the harness opened, with what it was told it reads.
struct OpenedStream {
    id: u64,
    shuffle: Arc<Shuffle<FakeFile>>,
    chunks: usize,
    last_used: Instant,
    /// Closed by the reader, or dropped by an expiry.
    gone: bool,
}

/// The core, a fake disk, and a model of what should be there.
pub struct Harness {
    budget: Arc<MemoryBudget>,
    apps: Apps<FakeFile>,
    streams: Streams<FakeFile, Served>,
    storage: FakeStorage,
    shuffle: Option<Arc<Shuffle<FakeFile>>>,
    /// Plans handed out and not yet carried out, each with the pushes whose bytes it holds.
    pending: Vec<Pending>,
    /// Per partition of the current shuffle: the pushes whose bytes its buffer holds.
    buffered: Vec<Vec<(u64, u64)>>,
    /// Reservation size of every push by id.
    push_bytes: HashMap<u64, u64>,
    /// The fake disk: file → bytes, and the page-padded regions written, by start.
    disk: HashMap<FakeFile, Vec<u8>>,
    written: HashMap<FakeFile, BTreeMap<u64, u64>>,
    /// Every batch of the current shuffle, by batch id.
    batches: HashMap<u32, PushedBatch>,
    /// Map attempts that sent MapperEnd (no more pushes of them), with the batch counts per
    /// partition they reported.
    ended: BTreeMap<(u32, u32), BTreeMap<u32, u32>>,
    /// Each map's first attempt to end: the one a stream of winners reads.
    first_end: BTreeMap<u32, u32>,
    /// Partitions that something could have lost (a plan reported lost, no file to be had).
    may_be_lost: Vec<bool>,
    /// Shuffles deleted, still held to check they hold nothing.
    deleted: Vec<Arc<Shuffle<FakeFile>>>,
    opened: Vec<OpenedStream>,
    next_push: u64,
    next_batch: u32,
    now: Instant,
    /// Operations applied (for messages).
    step: usize,
    /// Restarts that brought a readable shuffle back from its record.
    restarts: usize,
    /// Partitions moved to the object store.
    offloads: usize,
}

impl Default for Harness {
    fn default() -> Self {
        Harness::new()
    }
}

impl Harness {
    /// An empty server: nothing registered, a budget that never pauses.
    pub fn new() -> Harness {
        Harness {
            budget: MemoryBudget::new(1 << 40, 0.9, 0.95, 0.5),
            apps: Apps::default(),
            streams: Streams::default(),
            storage: FakeStorage::default(),
            shuffle: None,
            pending: Vec::new(),
            buffered: Vec::new(),
            push_bytes: HashMap::new(),
            disk: HashMap::new(),
            written: HashMap::new(),
            batches: HashMap::new(),
            ended: BTreeMap::new(),
            first_end: BTreeMap::new(),
            may_be_lost: Vec::new(),
            deleted: Vec::new(),
            opened: Vec::new(),
            next_push: 0,
            next_batch: 0,
            now: Instant::now(),
            step: 0,
            restarts: 0,
            offloads: 0,
        }
    }

    /// Applies `op`, then checks every invariant; panics (naming the step) when one fails.
    pub fn apply(&mut self, op: &Op) {
        self.step += 1;
        match op {
            Op::Register => self.register(),
            Op::Push { sections } => self.push(sections),
            Op::FlushDone { which } => self.flush_done(*which as usize),
            Op::FlushFailed { which, give_up } => self.flush_failed(*which as usize, *give_up),
            Op::Relieve { partition } => self.relieve(*partition as u32 % PARTITIONS),
            Op::MapperEnd { map, attempt } => {
                self.mapper_end(*map as u32 % (MAPS + 1), *attempt as u32 % 3)
            }
            Op::Commit => self.commit(),
            Op::OpenStream { partition, map_start, maps, named } => {
                let named = named.as_ref().map(|n| {
                    let mut v: Vec<MapAttempt> = n
                        .iter()
                        .map(|&(m, a)| MapAttempt {
                            map_id: m as u32 % MAPS,
                            attempt_id: a as u32 % 3,
                        })
                        .collect();
                    v.sort_by_key(|a| a.map_id);
                    v.dedup_by_key(|a| a.map_id);
                    v
                });
                let start = *map_start as u32 % (MAPS + 1);
                let end = start + *maps as u32 % (MAPS + 2);
                self.open_stream(*partition as u32 % (PARTITIONS + 1), start, end, named);
            }
            Op::FetchChunk { stream, chunk } => self.fetch_chunk(*stream as usize, *chunk as u32),
            Op::CloseStream { stream } => {
                if !self.opened.is_empty() {
                    let i = *stream as usize % self.opened.len();
                    self.streams.close(self.opened[i].id);
                    self.opened[i].gone = true;
                }
            }
            Op::Unregister => self.unregister(),
            Op::Disk { state } => self.storage.state = state % 3,
            Op::Restart => self.restart(),
            Op::Offload { partition } => self.offload(*partition as u32 % PARTITIONS),
            Op::Tick { secs } => {
                self.now += Duration::from_secs(*secs as u64);
                self.streams.expire(self.now, STREAM_IDLE);
                let now = self.now;
                for o in &mut self.opened {
                    o.gone |= now.saturating_duration_since(o.last_used) >= STREAM_IDLE
                        || o.shuffle.is_deleted();
                }
            }
        }
        self.check();
    }

    /// The end of a run: carries out every pending plan, ends every map that has not ended
    /// (with the attempt that has the most acknowledged batches), commits until the shuffle is
    /// readable, moves partition 0 to the object store, reads every partition back (winners, and
    /// each ended attempt by name), unregisters, and checks that all memory came back.
    pub fn finish(&mut self) {
        self.storage.state = 0;
        self.drain_pending();
        if let Some(s) = self.shuffle.clone() {
            if s.lifecycle() == Lifecycle::Open {
                for map in 0..MAPS {
                    if !self.first_end.contains_key(&map) {
                        let attempt = (0..3)
                            .max_by_key(|&a| {
                                let mine =
                                    |b: &&PushedBatch| b.acked && (b.map, b.attempt) == (map, a);
                                (self.batches.values().filter(mine).count(), std::cmp::Reverse(a))
                            })
                            .unwrap_or(0);
                        self.mapper_end(map, attempt);
                    }
                }
            }
            while s.lifecycle() != Lifecycle::Readable {
                self.commit();
                self.drain_pending();
            }
            // Partition 0 is read from the object store (if it has chunks in files), the
            // others from their files.
            self.offload(0);
            for p in 0..PARTITIONS + 1 {
                self.open_stream(p, 0, MAPS, None);
                let ended: Vec<(u32, u32)> = self.ended.keys().copied().collect();
                for (map_id, attempt_id) in ended {
                    self.open_stream(p, 0, MAPS, Some(vec![MapAttempt { map_id, attempt_id }]));
                }
            }
            self.unregister();
        }
        self.check();
        assert_eq!(self.budget.used(), 0, "memory left reserved after everything was flushed");
    }

    fn drain_pending(&mut self) {
        while !self.pending.is_empty() {
            self.flush_done(0);
            self.check();
        }
    }

    fn restart(&mut self) {
        let Some(s) = self.shuffle.clone() else { return };
        if s.lifecycle() != Lifecycle::Readable {
            return;
        }
        let record = s.commit_record(|f: &FakeFile| f.to_string());
        let decoded = crate::core::decode_record(&record).expect("a fresh record decodes");
        let back = Shuffle::recovered(decoded, |_, _, name, _| {
            name.parse::<FakeFile>().map_err(|e| e.to_string())
        });
        self.apps = Apps::default();
        self.apps.insert_recovered(back, self.now);
        self.shuffle = Some(self.apps.shuffle(APP, SHUFFLE).expect("recovered"));
        // As the server does: ids above every id of the run before.
        self.streams =
            Streams::starting_at(self.opened.iter().map(|o| o.id).max().unwrap_or(0) + 1);
        for o in &mut self.opened {
            o.gone = true;
        }
        self.restarts += 1;
    }

    /// Moves partition `pid` to the object store if the core offers it; its objects are named
    /// after its files (`object-<file>`), so that streams read them off the fake disk.
    fn offload(&mut self, pid: u32) {
        let Some(s) = self.shuffle.clone() else { return };
        let offered = s.offloadable();
        assert!(
            offered.is_empty() || s.lifecycle() == Lifecycle::Readable,
            "step {}: partitions of a shuffle not readable offered to the store",
            self.step
        );
        for (p, files) in &offered {
            let part = s.partition(*p).unwrap();
            assert!(part.lost().is_none() && !part.chunks().is_empty(), "step {}", self.step);
            for (f, end) in files {
                let written = self.written.get(f).and_then(|w| w.last_key_value());
                let written_end = written.map_or(0, |(at, len)| at + len);
                assert!(*end <= written_end, "step {}: offered past what was written", self.step);
            }
        }
        let Some((_, files)) = offered.into_iter().find(|(p, _)| *p == pid) else { return };
        let keys: Vec<String> = files.iter().map(|(f, _)| format!("object-{f}")).collect();
        let local = s.offloaded(pid, keys).expect("an offered partition moves");
        assert_eq!(local, files.iter().map(|(f, _)| *f).collect::<Vec<_>>(), "step {}", self.step);
        assert!(s.offloaded(pid, vec!["again".into()]).is_err(), "step {}: moved twice", self.step);
        self.offloads += 1;
    }

    fn register(&mut self) {
        if self.shuffle.is_some() {
            return;
        }
        let r = RegisterShuffle {
            app_id: APP.into(),
            shuffle_id: SHUFFLE,
            num_maps: MAPS,
            num_partitions: PARTITIONS,
            ..Default::default()
        };
        self.apps.register_shuffle(&r, CHUNK_BYTES, 0, self.now).expect("registers");
        self.shuffle = Some(self.apps.shuffle(APP, SHUFFLE).expect("registered"));
        self.storage.deleted.set(false);
        self.buffered = vec![Vec::new(); PARTITIONS as usize];
        self.may_be_lost = vec![false; PARTITIONS as usize];
        self.batches.clear();
        self.ended.clear();
        self.first_end.clear();
    }

    /// Notes partitions the last operation lost: only possible with no file to be had
    /// (`no_file`); their buffers are dropped.
    fn note_newly_lost(&mut self, lost_before: &[bool], no_file: bool) {
        let Some(s) = self.shuffle.clone() else { return };
        for (p, &before) in lost_before.iter().enumerate() {
            if s.partition(p as u32).unwrap().lost().is_some() && !before {
                assert!(no_file, "step {}: partition {p} lost with storage healthy", self.step);
                self.may_be_lost[p] = true;
                self.buffered[p].clear(); // a lost partition drops its buffer
            }
        }
    }

    fn lost_now(&self) -> Vec<bool> {
        let Some(s) = &self.shuffle else { return vec![false; PARTITIONS as usize] };
        (0..PARTITIONS).map(|p| s.partition(p).unwrap().lost().is_some()).collect()
    }

    fn push(&mut self, spec: &[(u8, u8, u8, u8, u8)]) {
        let Some(shuffle) = self.shuffle.clone() else { return };
        if spec.is_empty() {
            return;
        }
        let mut body = BytesMut::new();
        let mut sections = Vec::new();
        let mut section_batches: Vec<Vec<u32>> = Vec::new();
        for &(p, m, a, n, len) in spec.iter().take(8) {
            let (partition, map, attempt) =
                (p as u32 % (PARTITIONS + 1), m as u32 % MAPS, a as u32 % 3);
            if self.ended.contains_key(&(map, attempt)) {
                continue; // a map attempt pushes nothing after its MapperEnd
            }
            let offset = body.len() as u32;
            let mut ids = Vec::new();
            for _ in 0..(n % 4).max(1) {
                let id = self.next_batch;
                self.next_batch += 1;
                // Now and then a section too large to copy: a slice of the body (see `buffer`).
                let n = if len == u8::MAX { COPY_BELOW as u32 } else { len as u32 % 97 };
                let payload: Vec<u8> = (0..n).map(|i| (id.wrapping_mul(31) ^ i) as u8).collect();
                put_batch(&mut body, map, attempt, id, &payload);
                ids.push(id);
                self.batches.insert(id, PushedBatch { partition, map, attempt, acked: false });
            }
            sections.push(Section {
                partition_id: partition,
                offset,
                length: body.len() as u32 - offset,
            });
            section_batches.push(ids);
        }
        if sections.is_empty() {
            return;
        }
        let body = body.freeze();
        let size = body.len() as u64;
        let reservation = self.budget.try_reserve(size).expect("the budget never pauses here");
        let id = self.next_push;
        self.next_push += 1;
        self.push_bytes.insert(id, size);
        let lost_before = self.lost_now();
        let pushed = shuffle.push(&sections, &body, Some(reservation), &self.storage);
        // Mirror where the sections went: a plan for a partition takes its whole buffer, before
        // a section is added (when it would overflow the chunk) or after (when full).
        let mut plans = pushed.flushes.into_iter().peekable();
        for s in sections.iter().take(pushed.stored) {
            let p = s.partition_id as usize;
            let held: u64 = self.buffered[p].iter().map(|x| x.1).sum();
            if let Some(plan) = plans
                .next_if(|pl| pl.partition() == s.partition_id && pl.bytes() == held && held > 0)
            {
                let pushes = self.buffered[p].drain(..).map(|x| x.0).collect();
                self.pending.push((shuffle.clone(), plan, pushes));
            }
            // A copied section holds the copy's memory, not the push's.
            let copied = (s.length as usize) < COPY_BELOW;
            self.buffered[p].push((if copied { id | COPIED } else { id }, s.length as u64));
            let held = held_bytes(&self.buffered[p]);
            if let Some(plan) =
                plans.next_if(|pl| pl.partition() == s.partition_id && pl.bytes() == held)
            {
                let pushes = self.buffered[p].drain(..).map(|x| x.0).collect();
                self.pending.push((shuffle.clone(), plan, pushes));
            }
        }
        assert!(plans.next().is_none(), "step {}: a flush plan the model cannot place", self.step);
        self.note_newly_lost(&lost_before, self.storage.state == 2);
        match pushed.result {
            Ok(()) => {
                assert_eq!(pushed.stored, sections.len());
                for ids in &section_batches {
                    for b in ids {
                        self.batches.get_mut(b).expect("pushed").acked = true;
                    }
                }
            }
            Err(r) => assert!(
                matches!(
                    r.code(),
                    ErrorCode::InvalidRequest
                        | ErrorCode::ShuffleCommitted
                        | ErrorCode::UnknownShuffle
                        | ErrorCode::StorageFailed
                        | ErrorCode::StorageUnavailable
                ),
                "step {}: unexpected refusal {r}",
                self.step
            ),
        }
    }

    fn take_pending(&mut self, which: usize) -> Option<Pending> {
        if self.pending.is_empty() {
            return None;
        }
        let i = which % self.pending.len();
        Some(self.pending.swap_remove(i))
    }

    fn flush_done(&mut self, which: usize) {
        let Some((shuffle, mut plan, _pushes)) = self.take_pending(which) else { return };
        if shuffle.is_deleted() {
            // Deleted meanwhile: the writer may skip the write, or report one that raced the
            // deletion; either way nothing may be recorded.
            let outcome =
                if which.is_multiple_of(2) { FlushOutcome::Written } else { FlushOutcome::Dropped };
            shuffle.flushed(plan, outcome);
            return;
        }
        let (file, offset) = (*plan.file(), plan.offset());
        let bytes: Vec<u8> = plan.slices().iter().flat_map(|s| s.iter().copied()).collect();
        assert_eq!(
            bytes.len() as u64,
            padded_len(plan.bytes()),
            "step {}: a plan's slices are its padded bytes",
            self.step
        );
        let regions = self.written.entry(file).or_default();
        let end = offset + bytes.len() as u64;
        // No write overlaps another: the cursor reserved each plan its own place.
        if let Some((&start, &len)) = regions.range(..end).next_back() {
            assert!(
                start + len <= offset,
                "step {}: a write at {offset} overlaps one at {start}",
                self.step
            );
        }
        regions.insert(offset, bytes.len() as u64);
        let data = self.disk.entry(file).or_default();
        if data.len() < end as usize {
            data.resize(end as usize, 0);
        }
        data[offset as usize..end as usize].copy_from_slice(&bytes);
        shuffle.flushed(plan, FlushOutcome::Written);
    }

    fn flush_failed(&mut self, which: usize, give_up: bool) {
        let Some((shuffle, mut plan, pushes)) = self.take_pending(which) else { return };
        if !give_up && shuffle.retarget(&mut plan, &self.storage).is_ok() {
            self.pending.push((shuffle, plan, pushes));
            return;
        }
        let pid = plan.partition();
        shuffle.flushed(plan, FlushOutcome::Lost("write failed (fuzz)".into()));
        if self.shuffle.as_ref().is_some_and(|s| Arc::ptr_eq(s, &shuffle)) {
            let lost = shuffle.partition(pid).unwrap().lost().is_some();
            assert!(lost, "step {}: a plan reported lost did not lose its partition", self.step);
            self.may_be_lost[pid as usize] = true;
            self.buffered[pid as usize].clear();
        }
    }

    fn relieve(&mut self, pid: u32) {
        let Some(shuffle) = self.shuffle.clone() else { return };
        let lost_before = self.lost_now();
        match shuffle.take_flush(pid, &self.storage) {
            Ok(Some(plan)) => {
                assert_eq!(plan.bytes(), held_bytes(&self.buffered[pid as usize]));
                let pushes = self.buffered[pid as usize].drain(..).map(|x| x.0).collect();
                self.pending.push((shuffle, plan, pushes));
            }
            Ok(None) => {}
            Err(r) => assert_eq!(r.code(), ErrorCode::StorageUnavailable, "step {}", self.step),
        }
        self.note_newly_lost(&lost_before, self.storage.state == 2);
    }

    fn mapper_end(&mut self, map: u32, attempt: u32) {
        let Some(shuffle) = self.shuffle.clone() else { return };
        let mut counts: BTreeMap<u32, u32> = BTreeMap::new();
        for b in self.batches.values().filter(|b| b.acked && (b.map, b.attempt) == (map, attempt)) {
            *counts.entry(b.partition).or_default() += 1;
        }
        let list: Vec<(u32, u32)> = counts.iter().map(|(p, n)| (*p, *n)).collect();
        let open = shuffle.lifecycle() == Lifecycle::Open;
        match shuffle.mapper_end(map, attempt, &list) {
            Ok((winner, _)) => {
                assert!(map < MAPS, "step {}: MapperEnd of map {map} taken", self.step);
                assert!(
                    open || self.first_end.contains_key(&map),
                    "step {}: a first end after the commit",
                    self.step
                );
                let first = *self.first_end.entry(map).or_insert(attempt);
                assert_eq!(winner, first, "step {}: the winner is the first to end", self.step);
                // A repeated MapperEnd changes nothing; at most 64 later attempts are kept.
                self.ended.entry((map, attempt)).or_insert(counts);
            }
            Err(r) => assert!(
                map >= MAPS || (!open && !self.first_end.contains_key(&map)),
                "step {}: MapperEnd refused: {r}",
                self.step
            ),
        }
    }

    fn commit(&mut self) {
        let Some(shuffle) = self.shuffle.clone() else { return };
        let lost_before = self.lost_now();
        match shuffle.begin_commit(&self.storage) {
            Ok(begun) => {
                for plan in begun.flushes {
                    let p = plan.partition() as usize;
                    assert_eq!(plan.bytes(), held_bytes(&self.buffered[p]));
                    let pushes = self.buffered[p].drain(..).map(|x| x.0).collect();
                    self.pending.push((shuffle.clone(), plan, pushes));
                }
                assert_eq!(begun.lost.is_empty(), self.lost_now() == lost_before);
                self.note_newly_lost(&lost_before, self.storage.state == 2);
            }
            Err(r) => panic!("step {}: commit of a registered shuffle refused: {r}", self.step),
        }
        if shuffle.flushes_in_flight() == 0 {
            let lost = self.lost_now().contains(&true);
            match shuffle.finish_commit() {
                Ok(sizes) => {
                    assert!(!lost, "step {}: a commit with a lost partition succeeded", self.step);
                    // As the server after writing the commit record: moves may begin.
                    shuffle.mark_recorded();
                    for s in sizes {
                        let p = shuffle.partition(s.partition).unwrap();
                        let sum: u64 = p.chunks().iter().map(|c| c.len()).sum();
                        assert_eq!(sum, s.bytes, "step {}: reported size", self.step);
                    }
                }
                Err(r) => {
                    assert!(lost && r.code() == ErrorCode::StorageFailed, "step {}: {r}", self.step)
                }
            }
            assert_eq!(shuffle.lifecycle(), Lifecycle::Readable);
            // What the commit cuts each file to keeps every chunk in it.
            let ends: HashMap<FakeFile, u64> = shuffle.file_ends().into_iter().collect();
            for pid in 0..PARTITIONS {
                let p = shuffle.partition(pid).unwrap();
                for c in p.chunks() {
                    // A partition moved to the object store has no file left to cut.
                    let Some(f) = p.file(c.file()) else {
                        assert!(p.object(c.file()).is_some(), "step {}", self.step);
                        continue;
                    };
                    let end = ends.get(f).copied().unwrap_or(0);
                    assert!(c.padded_end() <= end, "step {}: a cut would cut a chunk", self.step);
                }
            }
        }
    }

    /// What the model says a stream of `o` must get: the attempts it reads with their batch
    /// counts, or the code it must be refused with.
    fn expected_stream(
        &self,
        shuffle: &Shuffle<FakeFile>,
        o: &OpenStream,
    ) -> Result<Vec<(u32, u32, u32)>, ErrorCode> {
        if shuffle.lifecycle() != Lifecycle::Readable {
            return Err(ErrorCode::ShuffleNotCommitted);
        }
        let p = o.partition_id;
        if p >= PARTITIONS {
            return Err(ErrorCode::InvalidRequest);
        }
        if shuffle.partition(p).unwrap().lost().is_some() {
            assert!(
                self.may_be_lost[p as usize],
                "step {}: partition {p} lost for nothing",
                self.step
            );
            return Err(ErrorCode::DataLost);
        }
        let count = |map: u32, attempt: u32| {
            self.ended.get(&(map, attempt)).map(|c| c.get(&p).copied().unwrap_or(0))
        };
        if o.attempts.is_empty() {
            if (o.map_start..o.map_end.min(MAPS)).any(|m| !self.first_end.contains_key(&m)) {
                return Err(ErrorCode::DataLost);
            }
            let reads =
                self.first_end.iter().filter(|(m, _)| (o.map_start..o.map_end).contains(*m));
            let with = reads.map(|(&m, &a)| (m, a, count(m, a).unwrap_or(0)));
            return Ok(with.filter(|x| x.2 > 0).collect());
        }
        o.attempts
            .iter()
            .map(|a| match count(a.map_id, a.attempt_id) {
                // Ended here with nothing in the partition: read as nothing (a split's part).
                Some(n) => Ok((a.map_id, a.attempt_id, n)),
                None => Err(ErrorCode::DataLost),
            })
            .collect()
    }

    fn open_stream(
        &mut self,
        partition: u32,
        start: u32,
        end: u32,
        named: Option<Vec<MapAttempt>>,
    ) {
        let Some(shuffle) = self.shuffle.clone() else { return };
        let o = OpenStream {
            app_id: APP.into(),
            shuffle_id: SHUFFLE,
            partition_id: partition,
            map_start: start,
            map_end: end,
            attempts: named.clone().unwrap_or_default(),
        };
        let body = |f: ChunkSource<'_, FakeFile>, r: &[ByteRange]| Served {
            file: match f {
                ChunkSource::File(f) => *f,
                ChunkSource::Object(key) => object_file(key),
            },
            ranges: r.to_vec(),
        };
        let expected = self.expected_stream(&shuffle, &o);
        let (chunks, committed) = match (shuffle.open_stream(&o, body), expected) {
            (Ok(x), Ok(want)) => {
                let got: Vec<_> = x.1.iter().map(|c| (c.map_id, c.attempt_id, c.batches)).collect();
                assert_eq!(got, want, "step {}: the attempts a stream reads", self.step);
                x
            }
            (Err(r), Err(code)) => {
                assert_eq!(r.code(), code, "step {}: refused with {r}", self.step);
                return;
            }
            (Ok(_), Err(code)) => {
                panic!("step {}: a stream opened that must fail with {code}", self.step)
            }
            (Err(r), Ok(_)) => panic!("step {}: a stream refused that must open: {r}", self.step),
        };
        let reads: BTreeMap<u32, (u32, u32)> =
            committed.iter().map(|c| (c.map_id, (c.attempt_id, c.batches))).collect();
        let mut seen: BTreeSet<u32> = BTreeSet::new();
        for c in &chunks {
            for b in self.read(c) {
                let (h, id) = (b.0, b.0.batch_id);
                let want = self.batches.get(&id).copied();
                let pushed = want
                    .unwrap_or_else(|| panic!("step {}: batch {id} was never pushed", self.step));
                assert_eq!(
                    (pushed.partition, pushed.map, pushed.attempt),
                    (partition, h.map_id, h.attempt_id),
                    "step {}: batch {id} served from the wrong partition or attempt",
                    self.step
                );
                assert_eq!(
                    reads.get(&h.map_id).map(|r| r.0),
                    Some(h.attempt_id),
                    "step {}: batch {id} of an attempt the stream does not read",
                    self.step
                );
                assert!(seen.insert(id), "step {}: batch {id} served twice", self.step);
            }
        }
        let lost = shuffle.partition(partition).unwrap().lost().is_some();
        assert!(!lost, "step {}: a lost partition opened a stream", self.step);
        for (&map, &(attempt, batches)) in &reads {
            let acked: Vec<u32> = self
                .batches
                .iter()
                .filter(|(_, b)| {
                    b.acked && (b.partition, b.map, b.attempt) == (partition, map, attempt)
                })
                .map(|(id, _)| *id)
                .collect();
            for id in &acked {
                assert!(
                    seen.contains(id),
                    "step {}: acknowledged batch {id} of map {map} attempt {attempt} not served",
                    self.step
                );
            }
            assert_eq!(batches as usize, acked.len(), "step {}: MapperEnd counts", self.step);
        }
        let id = self.streams.open(shuffle.clone(), chunks.clone(), self.now);
        let now = self.now;
        self.opened.push(OpenedStream {
            id,
            shuffle,
            chunks: chunks.len(),
            last_used: now,
            gone: false,
        });
    }

    /// The batches of a served chunk, read off the fake disk; each must parse with a good CRC.
    fn read(&self, c: &Served) -> Vec<(sluice_proto::batch::BatchHeader, Bytes)> {
        let data = self.disk.get(&c.file).map(Vec::as_slice).unwrap_or(&[]);
        let mut out = Vec::new();
        for r in &c.ranges {
            let end = (r.offset + r.len) as usize;
            assert!(
                end <= data.len(),
                "step {}: served range past the file's written end",
                self.step
            );
            let bytes = Bytes::copy_from_slice(&data[r.offset as usize..end]);
            let batches = split_batches(&bytes).unwrap_or_else(|e| {
                panic!("step {}: served bytes are not whole good batches: {e}", self.step)
            });
            for (h, payload) in batches {
                assert_eq!(
                    sluice_proto::batch::crc32c(&payload),
                    h.crc32c,
                    "step {}: CRC",
                    self.step
                );
                out.push((h, payload));
            }
        }
        out
    }

    fn fetch_chunk(&mut self, stream: usize, chunk: u32) {
        if self.opened.is_empty() {
            return;
        }
        let i = stream % self.opened.len();
        let (id, now) = (self.opened[i].id, self.now);
        let s = &self.opened[i];
        let gone = s.gone || s.shuffle.is_deleted();
        match self.streams.fetch(id, chunk, now) {
            Ok(served) => {
                assert!(!gone, "step {}: a closed, expired or deleted stream served", self.step);
                assert!((chunk as usize) < s.chunks, "step {}: chunk past the stream", self.step);
                let _ = self.read(&served);
                self.opened[i].last_used = now;
            }
            Err(r) if gone => assert_eq!(r.code(), ErrorCode::UnknownStream, "step {}", self.step),
            Err(r) => {
                assert!(chunk as usize >= s.chunks, "step {}: fetch refused: {r}", self.step);
                assert_eq!(r.code(), ErrorCode::ChunkOutOfRange, "step {}", self.step);
            }
        }
    }

    fn unregister(&mut self) {
        let Some(s) = self.shuffle.take() else { return };
        let deleted = self.apps.unregister_shuffle(APP, SHUFFLE).expect("the app is known");
        let deleted = deleted.expect("the shuffle was registered");
        assert_eq!(deleted.key, *s.key());
        self.storage.deleted.set(true);
        self.buffered.iter_mut().for_each(Vec::clear);
        self.deleted.push(s);
    }

    /// The invariants that hold after every step.
    fn check(&self) {
        let step = self.step;
        // Memory: exactly the reservations of pushes whose slices something still holds, and
        // those of the copies buffers and plans hold.
        let mut held: BTreeSet<u64> = BTreeSet::new();
        held.extend(self.buffered.iter().flatten().map(|x| x.0));
        held.extend(self.pending.iter().flat_map(|p| p.2.iter().copied()));
        let slices: u64 =
            held.iter().filter(|id| *id & COPIED == 0).map(|id| self.push_bytes[id]).sum();
        let mut copies: u64 = self.pending.iter().map(|p| p.1.staged_reserved()).sum();
        if let Some(s) = &self.shuffle {
            for pid in 0..PARTITIONS {
                let reserved = s.partition(pid).unwrap().staged_reserved();
                // Copies take their bytes and at most a quarter more (1 KiB at least), per
                // run of copies between slices.
                let entries = &self.buffered[pid as usize];
                let copied: u64 = entries.iter().filter(|x| x.0 & COPIED != 0).map(|x| x.1).sum();
                let runs = 1 + entries.iter().filter(|x| x.0 & COPIED == 0).count() as u64;
                let most = copied + runs * (copied / 4).max(1024);
                assert!(
                    (copied..=if copied == 0 { 0 } else { most }).contains(&reserved),
                    "step {step}: partition {pid} reserves {reserved} for {copied} bytes copied"
                );
                copies += reserved;
            }
        }
        assert_eq!(
            self.budget.used(),
            slices + copies,
            "step {step}: memory accounted vs held by buffers and plans"
        );
        if let Some(s) = &self.shuffle {
            let in_flight = self.pending.iter().filter(|p| Arc::ptr_eq(s, &p.0)).count();
            assert_eq!(s.flushes_in_flight(), in_flight as u64, "step {step}: flushes in flight");
            for pid in 0..PARTITIONS {
                let p = s.partition(pid).unwrap();
                assert_eq!(
                    p.buffered_bytes(),
                    held_bytes(&self.buffered[pid as usize]),
                    "step {step}: partition {pid} buffer"
                );
                assert!(
                    p.lost().is_none() || self.may_be_lost[pid as usize],
                    "step {step}: partition {pid} lost for nothing"
                );
                // The chunk index points only at written regions, and no two chunks overlap.
                let mut regions: BTreeMap<(FakeFile, u64), u64> = BTreeMap::new();
                for c in p.chunks() {
                    let file = match (p.file(c.file()), p.object(c.file())) {
                        (Some(f), None) => *f,
                        (None, Some(key)) => object_file(key),
                        _ => panic!("step {step}: a chunk's file is not known as one place"),
                    };
                    let written = self.written.get(&file).and_then(|w| w.get(&c.offset()));
                    assert_eq!(
                        written.copied(),
                        Some(padded_len(c.len())),
                        "step {step}: chunk not written as indexed"
                    );
                    assert!(
                        p.object(c.file()).is_some()
                            || c.padded_end() <= p.cursor(c.file()).unwrap(),
                        "step {step}: chunk past its file's cursor"
                    );
                    assert!(
                        regions.insert((file, c.offset()), c.len()).is_none(),
                        "step {step}: two chunks at one place"
                    );
                }
            }
        }
        // A deleted shuffle holds nothing: no buffer, no chunk, no file.
        for s in &self.deleted {
            assert_eq!(s.lifecycle(), Lifecycle::Deleted, "step {step}");
            for pid in 0..PARTITIONS {
                let p = s.partition(pid).unwrap();
                let empty = p.chunks().is_empty()
                    && p.buffered_bytes() == 0
                    && p.file(0).is_none()
                    && p.object(0).is_none();
                assert!(empty, "step {step}: a deleted shuffle holds data");
            }
        }
    }
}

/// The fake file an object of the harness was named after (`object-<file>`).
fn object_file(key: &str) -> FakeFile {
    let file = key.strip_prefix("object-").and_then(|f| f.parse().ok());
    file.unwrap_or_else(|| panic!("object {key:?} is none the harness named"))
}

fn held_bytes(v: &[(u64, u64)]) -> u64 {
    v.iter().map(|x| x.1).sum()
}

/// Applies the operations `data` decodes to, checking after each, then drains everything (the
/// fuzz target's body). Decoding stops at the first byte sequence that makes no operation.
/// Returns how many restarts brought a readable shuffle back, and how many partitions moved to
/// the object store.
pub fn run(data: &[u8]) -> (usize, usize) {
    let mut u = Unstructured::new(data);
    let mut h = Harness::new();
    h.apply(&Op::Register);
    while let Ok(op) = Op::arbitrary(&mut u) {
        h.apply(&op);
        if u.is_empty() {
            break;
        }
    }
    h.finish();
    (h.restarts, h.offloads)
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};

    /// A few thousand random operation sequences on every `cargo test` (the fuzz target runs
    /// the same harness for as long as it is given).
    #[test]
    fn random_operation_sequences_keep_the_invariants() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed);
        let (mut restarts, mut offloads) = (0, 0);
        for _ in 0..3000 {
            let len = rng.random_range(16..2048);
            let data: Vec<u8> = (0..len).map(|_| rng.random()).collect();
            let (r, o) = super::run(&data);
            restarts += r;
            offloads += o;
        }
        // Restarts of a readable shuffle, then reads of it, are among what is checked; so are
        // partitions moved to the object store.
        assert!(restarts >= 50, "only {restarts} restarts of a readable shuffle");
        assert!(offloads >= 100, "only {offloads} partitions moved to the object store");
        eprintln!("{restarts} restarts of a readable shuffle, {offloads} partitions moved");
    }
}
