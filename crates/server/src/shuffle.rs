//! Applications, shuffles and their partitions: buffers, files and chunk index.
//!
//! A partition holds in-memory slices of pushed bodies (each with its budget reservation) until
//! they are flushed, then a list of chunks: `(file, offset, length, runs)`, a run being the bytes
//! of one map attempt in the chunk. A stream serves, of each chunk, the byte ranges of the map
//! attempts it reads: a map sub-range read, or a read that skips losing attempts, moves only the
//! bytes it keeps.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::flusher::padded_len;
use crate::memory_budget::Reservation;
use crate::storage::DataDir;

/// Consecutive batches of one map attempt: `len` bytes, batch headers included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    pub map_id: u32,
    pub attempt_id: u32,
    pub len: u32,
}

/// A flushed region of a partition file.
#[derive(Debug, Clone)]
pub struct Chunk {
    pub file: Arc<File>,
    pub offset: u64,
    pub len: u64,
    /// The chunk's bytes, in order, as runs of one map attempt each, sorted by `(map, attempt)`
    /// with one run per attempt (the flusher writes a chunk's batches grouped so), so a reader
    /// is sent the byte ranges of the attempts it reads and nothing else.
    pub runs: Box<[Run]>,
}

impl Chunk {
    /// Whether the chunk holds a batch of a map in `[start, end)`.
    pub fn has_map_in(&self, start: u32, end: u32) -> bool {
        let i = self.runs.partition_point(|r| r.map_id < start);
        self.runs.get(i).is_some_and(|r| r.map_id < end)
    }

    /// The byte ranges of the file, ascending and with adjacent ones merged, that hold the
    /// chunk's batches of map attempts `wanted` says yes to. Empty when it holds none.
    pub fn ranges(&self, mut wanted: impl FnMut(u32, u32) -> bool) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = Vec::new();
        let mut at = self.offset;
        for r in self.runs.iter() {
            if wanted(r.map_id, r.attempt_id) {
                match out.last_mut() {
                    Some((o, l)) if *o + *l == at => *l += r.len as u64,
                    _ => out.push((at, r.len as u64)),
                }
            }
            at += r.len as u64;
        }
        out
    }
}

/// Groups a chunk's slices by map attempt: reorders `slices` (one per run of `runs`, same
/// order) so each attempt's come together, in `(map, attempt)` order and, within an attempt, in
/// the order they came; returns the chunk's runs, one per attempt. Batch order across attempts
/// means nothing to readers (each batch names its map, attempt and batch id).
pub fn group_by_attempt(slices: &mut Vec<Bytes>, runs: &[Run]) -> Box<[Run]> {
    debug_assert_eq!(slices.len(), runs.len());
    let mut pairs: Vec<(Run, Bytes)> = runs.iter().copied().zip(slices.drain(..)).collect();
    pairs.sort_by_key(|(r, _)| (r.map_id, r.attempt_id)); // stable: each attempt's order stays
    let mut grouped: Vec<Run> = Vec::new();
    for (r, slice) in pairs {
        slices.push(slice);
        match grouped.last_mut() {
            Some(g) if (g.map_id, g.attempt_id) == (r.map_id, r.attempt_id) => g.len += r.len,
            _ => grouped.push(r),
        }
    }
    grouped.into_boxed_slice()
}

/// The file a partition currently appends to.
#[derive(Debug, Clone)]
pub struct OpenFile {
    pub file: Arc<File>,
    pub dir: Arc<DataDir>,
    pub path: PathBuf,
}

/// Bytes waiting in memory to be flushed, with the reservations that pay for them.
#[derive(Debug, Default)]
pub struct Buffered {
    /// Pushed bytes, one slice per run of `runs`.
    pub slices: Vec<Bytes>,
    /// Which map attempt each slice's batches are of.
    pub runs: Vec<Run>,
    pub reservations: Vec<Arc<Reservation>>,
    pub bytes: u64,
}

/// One partition of a shuffle on this server.
#[derive(Debug, Default)]
pub struct Partition {
    pub buffer: Buffered,
    pub file: Option<OpenFile>,
    /// Number of files created so far (names the next one).
    pub files_created: u32,
    /// Where the next flush goes in `file`.
    pub next_offset: u64,
    pub chunks: Vec<Chunk>,
    /// Bytes accepted for this partition (buffered + flushed).
    pub accepted_bytes: u64,
    /// Set when data of this partition could not be stored anywhere.
    pub lost: Option<String>,
}

/// What a map's attempts reported in `MapperEnd`: the winner's (the first to arrive), and the
/// later attempts', which are read only when a reader names them (`OpenStream::attempts`).
#[derive(Debug, Clone)]
pub struct MapEnd {
    pub attempt_id: u32,
    /// partition → batches pushed there.
    pub batches: HashMap<u32, u32>,
    /// Later attempts, in arrival order: (attempt, partition → batches).
    pub later: Vec<(u32, HashMap<u32, u32>)>,
}

/// How many later attempts of one map a server remembers; an engine makes a handful (retries,
/// speculative copies, stage re-runs), so more means a misbehaving client.
pub const MAX_LATER_ATTEMPTS: usize = 64;

impl MapEnd {
    /// The batches per partition that `attempt` reported, if it ended here.
    pub fn batches_of(&self, attempt: u32) -> Option<&HashMap<u32, u32>> {
        if attempt == self.attempt_id {
            return Some(&self.batches);
        }
        self.later.iter().find(|(a, _)| *a == attempt).map(|(_, b)| b)
    }
}

/// A registered shuffle.
#[derive(Debug)]
pub struct Shuffle {
    pub app_id: String,
    pub shuffle_id: u32,
    pub num_maps: u32,
    pub partitions: Vec<Mutex<Partition>>,
    pub maps: Mutex<HashMap<u32, MapEnd>>,
    /// Set when a commit starts: pushes are refused from then on.
    pub committed: AtomicBool,
    /// Set when a commit has flushed every buffer and cut its files to their data: streams may
    /// be opened from then on.
    pub readable: AtomicBool,
    /// Flush jobs submitted and not yet finished.
    pub inflight_flushes: AtomicU64,
    pub flushed: Notify,
    /// Relative directory of its files inside a data directory.
    pub rel_dir: PathBuf,
    pub deleted: AtomicBool,
}

impl Shuffle {
    pub fn new(app_id: &str, shuffle_id: u32, num_maps: u32, num_partitions: u32) -> Arc<Self> {
        Arc::new(Shuffle {
            app_id: app_id.to_owned(),
            shuffle_id,
            num_maps,
            partitions: (0..num_partitions).map(|_| Mutex::new(Partition::default())).collect(),
            maps: Mutex::new(HashMap::new()),
            committed: AtomicBool::new(false),
            readable: AtomicBool::new(false),
            inflight_flushes: AtomicU64::new(0),
            flushed: Notify::new(),
            rel_dir: PathBuf::from(sanitize(app_id)).join(shuffle_id.to_string()),
            deleted: AtomicBool::new(false),
        })
    }

    pub fn is_committed(&self) -> bool {
        self.committed.load(Ordering::Acquire)
    }

    /// Whether readers may open streams: set once a commit has flushed everything.
    pub fn is_readable(&self) -> bool {
        self.readable.load(Ordering::Acquire)
    }

    /// Every file that holds this shuffle's data, with where that data ends (page padding
    /// included). A file taken from the recycle pool can be longer: the bytes past the end are an
    /// earlier shuffle's.
    pub fn file_ends(&self) -> Vec<(Arc<File>, u64)> {
        let mut ends: HashMap<*const File, (Arc<File>, u64)> = HashMap::new();
        let mut note = |file: &Arc<File>, end: u64| {
            let e = ends.entry(Arc::as_ptr(file)).or_insert_with(|| (file.clone(), 0));
            e.1 = e.1.max(end);
        };
        for p in &self.partitions {
            let p = p.lock();
            if let Some(f) = &p.file {
                note(&f.file, p.next_offset);
            }
            for c in &p.chunks {
                note(&c.file, c.offset + padded_len(c.len));
            }
        }
        ends.into_values().collect()
    }

    /// Records a map attempt's end; the first attempt to report wins. A later attempt is kept
    /// beside it (once; a repeated `MapperEnd` of an attempt changes nothing), also after the
    /// commit: its pushes were all acknowledged, so made before the commit. Returns the winner,
    /// or `None` for a map with no end before the commit: it never gets one (the commit needs
    /// every map).
    pub fn mapper_end(&self, map_id: u32, attempt_id: u32, counts: &[(u32, u32)]) -> Option<u32> {
        let batches = || counts.iter().copied().collect();
        let mut maps = self.maps.lock();
        let e = match maps.entry(map_id) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(_) if self.is_committed() => return None,
            Entry::Vacant(v) => {
                v.insert(MapEnd { attempt_id, batches: batches(), later: Vec::new() })
            }
        };
        if e.batches_of(attempt_id).is_none() {
            if e.later.len() < MAX_LATER_ATTEMPTS {
                e.later.push((attempt_id, batches()));
            } else {
                tracing::warn!(
                    app = %self.app_id,
                    shuffle = self.shuffle_id,
                    map = map_id,
                    attempt = attempt_id,
                    "too many attempts of one map ended; this one is not kept"
                );
            }
        }
        Some(e.attempt_id)
    }

    /// Path of a partition's n-th file inside a data directory.
    pub fn file_path(&self, dir: &DataDir, partition: u32, n: u32) -> PathBuf {
        dir.path.join(&self.rel_dir).join(format!("{partition}-{n}.data"))
    }

    /// Deletes the shuffle's files from every data directory; each partition's current file is
    /// offered to its directory's recycle pool first (see `storage`).
    pub fn delete_files(&self, dirs: &[Arc<DataDir>]) {
        self.deleted.store(true, Ordering::Release);
        for p in &self.partitions {
            let mut p = p.lock();
            p.chunks.clear();
            if let Some(OpenFile { file, dir, path }) = p.file.take() {
                dir.recycle(file, &path);
            }
        }
        for d in dirs {
            let p = d.path.join(&self.rel_dir);
            match std::fs::remove_dir_all(&p) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::warn!(path = %p.display(), error = %e, "cannot delete shuffle files")
                }
            }
        }
    }
}

/// File-name-safe form of an application id (no separators, no `..`).
pub fn sanitize(app_id: &str) -> String {
    let s: String = app_id
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' })
        .collect();
    if s.is_empty() {
        "_".into()
    } else {
        s
    }
}

/// A registered application.
#[derive(Debug)]
pub struct App {
    pub last_seen: Mutex<Instant>,
    pub shuffles: Mutex<HashMap<u32, Arc<Shuffle>>>,
}

impl App {
    pub fn new() -> Self {
        App { last_seen: Mutex::new(Instant::now()), shuffles: Mutex::new(HashMap::new()) }
    }

    pub fn touch(&self) {
        *self.last_seen.lock() = Instant::now();
    }
}

impl Default for App {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(map_id: u32, attempt_id: u32, len: u32) -> Run {
        Run { map_id, attempt_id, len }
    }

    #[test]
    fn chunk_map_range_and_byte_ranges() {
        let c = Chunk {
            file: Arc::new(tempfile::tempfile().unwrap()),
            offset: 4096,
            len: 100,
            runs: vec![run(3, 0, 10), run(3, 1, 20), run(7, 0, 30), run(9, 2, 40)].into(),
        };
        assert!(c.has_map_in(0, 4));
        assert!(!c.has_map_in(4, 7));
        assert!(c.has_map_in(7, 8));
        assert!(!c.has_map_in(10, 20));
        assert!(!c.has_map_in(5, 5));
        assert_eq!(c.ranges(|_, _| true), vec![(4096, 100)], "all of it: one range");
        assert_eq!(c.ranges(|_, _| false), vec![]);
        // Map 3's losing attempt 1 left out: two ranges around it.
        assert_eq!(
            c.ranges(|m, a| a == [0, 0, 0, 0, 0, 0, 0, 0, 0, 2][m as usize]),
            vec![(4096, 10), (4126, 70)]
        );
        assert_eq!(c.ranges(|m, _| (7..10).contains(&m)), vec![(4126, 70)]);
        assert_eq!(c.ranges(|m, a| m == 3 && a == 1), vec![(4106, 20)]);
    }

    #[test]
    fn grouping_orders_attempts_and_keeps_each_ones_order() {
        let b = |s: &'static str| Bytes::from_static(s.as_bytes());
        let mut slices = vec![b("9a"), b("3a"), b("9b"), b("3x"), b("3b"), b("1a")];
        let runs =
            [run(9, 0, 2), run(3, 0, 2), run(9, 0, 2), run(3, 5, 2), run(3, 0, 2), run(1, 0, 2)];
        let grouped = group_by_attempt(&mut slices, &runs);
        assert_eq!(slices, vec![b("1a"), b("3a"), b("3b"), b("3x"), b("9a"), b("9b")]);
        assert_eq!(&*grouped, &[run(1, 0, 2), run(3, 0, 4), run(3, 5, 2), run(9, 0, 4)]);
    }

    #[test]
    fn first_mapper_end_wins_and_names_are_safe() {
        let s = Shuffle::new("../evil/app", 1, 2, 2);
        assert_eq!(s.mapper_end(0, 1, &[(0, 2)]), Some(1));
        assert_eq!(s.mapper_end(0, 0, &[(0, 5)]), Some(1));
        assert_eq!(s.mapper_end(0, 0, &[(0, 9)]), Some(1), "a repeated MapperEnd changes nothing");
        assert_eq!(s.mapper_end(0, 1, &[(0, 9)]), Some(1));
        let maps = s.maps.lock();
        assert_eq!(maps[&0].batches[&0], 2);
        assert_eq!(maps[&0].batches_of(0).map(|b| b[&0]), Some(5), "the later attempt is kept");
        assert_eq!(maps[&0].batches_of(1).map(|b| b[&0]), Some(2));
        assert!(maps[&0].batches_of(2).is_none());
        drop(maps);
        for a in 2..2 + MAX_LATER_ATTEMPTS as u32 {
            s.mapper_end(0, a, &[]);
        }
        assert_eq!(s.maps.lock()[&0].later.len(), MAX_LATER_ATTEMPTS, "bounded");
        assert_eq!(sanitize("../evil/app"), "___evil_app");
    }
}
