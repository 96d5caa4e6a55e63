//! Chunks: the flushed regions of a partition's files, and the runs of map attempts in them.
//!
//! A chunk is one flush: `len` bytes at a page-aligned `offset` of one of the partition's files,
//! followed by zero padding to a whole page. Its bytes are runs of one map attempt each, sorted by
//! `(map, attempt)`, so a reader of some attempts is sent a few byte ranges of it and nothing else.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// Chunks start at multiples of this (the page size): writing into a recycled file never makes
/// the kernel read a partial page first.
pub const CHUNK_ALIGN: u64 = 4096;
static ZEROS: [u8; CHUNK_ALIGN as usize] = [0; CHUNK_ALIGN as usize];

/// The zeros that pad a chunk of `len` bytes to a whole page (no allocation).
pub fn padding(len: u64) -> Bytes {
    Bytes::from_static(&ZEROS[..(padded_len(len) - len) as usize])
}

/// Bytes a chunk of `len` bytes takes in its file, padding included.
pub fn padded_len(len: u64) -> u64 {
    len.div_ceil(CHUNK_ALIGN) * CHUNK_ALIGN
}

/// Consecutive batches of one map attempt: `len` bytes, batch headers included. A plain value
/// (what a push's batch headers say), so its fields are open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Run {
    /// The map the batches are of.
    pub map_id: u32,
    /// The map's attempt that pushed them.
    pub attempt_id: u32,
    /// Bytes of the batches, headers included.
    pub len: u32,
}

/// `len` bytes at `offset` of a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteRange {
    /// Where the range starts in the file.
    pub offset: u64,
    /// How many bytes it spans.
    pub len: u64,
}

/// A chunk's runs, sorted by `(map, attempt)`, encoded in a few bytes each: a chunk of a wide
/// shuffle holds one run per map, and as 12-byte [`Run`]s they were a third of a server's
/// metadata (docs/benchmarks-log.md#metadata-at-scale). Each run is a head byte — the map's
/// distance from the previous run's map (capped at 15) in bits 3–6, the attempt (capped at 7) in
/// bits 0–2 — then, when capped, the rest of each as a LEB128 varint, then the length as one:
/// 2 bytes for a small batch of the next map's first attempt. Serialized as the list of runs
/// (the commit record's format, as before).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Runs {
    bytes: Box<[u8]>,
    count: u32,
    /// The first and last run's maps, to skip a chunk without decoding it.
    maps: (u32, u32),
}

fn put_varint(out: &mut Vec<u8>, mut v: u32) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn get_varint(bytes: &[u8], at: &mut usize) -> u32 {
    let mut v = 0u32;
    for shift in (0..35).step_by(7) {
        // Encoded here from u32s: never past the end nor longer than 5 bytes.
        let b = bytes.get(*at).copied().unwrap_or(0);
        *at += 1;
        v |= ((b & 0x7f) as u32) << shift;
        if b & 0x80 == 0 {
            break;
        }
    }
    v
}

impl Runs {
    const MAP_CAP: u32 = 15;
    const ATTEMPT_CAP: u32 = 7;

    /// Encodes `runs` (sorted by map, as [`group_by_attempt`] leaves them).
    fn encode(runs: &[Run]) -> Runs {
        let mut out = Vec::with_capacity(runs.len() * 2);
        let mut prev = 0;
        for r in runs {
            let d = r.map_id.saturating_sub(prev);
            prev = r.map_id;
            let (dh, ah) = (d.min(Self::MAP_CAP), r.attempt_id.min(Self::ATTEMPT_CAP));
            out.push((dh << 3 | ah) as u8);
            if dh == Self::MAP_CAP {
                put_varint(&mut out, d - Self::MAP_CAP);
            }
            if ah == Self::ATTEMPT_CAP {
                put_varint(&mut out, r.attempt_id - Self::ATTEMPT_CAP);
            }
            put_varint(&mut out, r.len);
        }
        let maps = (runs.first().map_or(0, |r| r.map_id), runs.last().map_or(0, |r| r.map_id));
        Runs { bytes: out.into_boxed_slice(), count: runs.len() as u32, maps }
    }

    fn iter(&self) -> impl Iterator<Item = Run> + '_ {
        let (mut at, mut map) = (0usize, 0u32);
        (0..self.count).map(move |_| {
            let head = self.bytes.get(at).copied().unwrap_or(0) as u32;
            at += 1;
            let (mut d, mut attempt) = (head >> 3, head & 7);
            if d == Self::MAP_CAP {
                d += get_varint(&self.bytes, &mut at);
            }
            if attempt == Self::ATTEMPT_CAP {
                attempt += get_varint(&self.bytes, &mut at);
            }
            map += d;
            Run { map_id: map, attempt_id: attempt, len: get_varint(&self.bytes, &mut at) }
        })
    }
}

/// How a chunk's runs are written in a commit record: their count and their bytes as held (two
/// bytes or so per run). Version 1 records listed every run as a [`Run`] (read by
/// [`Chunk::from_runs`]).
#[derive(Serialize)]
struct RunsOut<'a> {
    count: u32,
    #[serde(with = "serde_bytes")]
    bytes: &'a [u8],
}

#[derive(Deserialize)]
struct RunsIn {
    count: u32,
    #[serde(with = "serde_bytes")]
    bytes: Vec<u8>,
}

/// The next varint of `bytes` from `at`, or `None` past the end or beyond a `u32`.
fn checked_varint(bytes: &[u8], at: &mut usize) -> Option<u32> {
    let mut v = 0u64;
    for shift in (0..35).step_by(7) {
        let b = *bytes.get(*at)?;
        *at += 1;
        v |= ((b & 0x7f) as u64) << shift;
        if b & 0x80 == 0 {
            return u32::try_from(v).ok();
        }
    }
    None
}

impl Runs {
    /// Runs read back from a record: every one decoded within `bytes`, all of them used.
    fn decode_checked(count: u32, bytes: &[u8]) -> Result<Vec<Run>, String> {
        let bad = || format!("{count} runs do not decode from {} bytes", bytes.len());
        let (mut at, mut map) = (0usize, 0u32);
        let mut runs = Vec::with_capacity((count as usize).min(bytes.len()));
        for _ in 0..count {
            let head = *bytes.get(at).ok_or_else(bad)? as u32;
            at += 1;
            let (mut d, mut attempt) = (head >> 3, head & 7);
            if head >> 7 != 0 {
                return Err(bad());
            }
            if d == Self::MAP_CAP {
                d = d
                    .checked_add(checked_varint(bytes, &mut at).ok_or_else(bad)?)
                    .ok_or_else(bad)?;
            }
            if attempt == Self::ATTEMPT_CAP {
                let more = checked_varint(bytes, &mut at).ok_or_else(bad)?;
                attempt = attempt.checked_add(more).ok_or_else(bad)?;
            }
            map = map.checked_add(d).ok_or_else(bad)?;
            let len = checked_varint(bytes, &mut at).ok_or_else(bad)?;
            runs.push(Run { map_id: map, attempt_id: attempt, len });
        }
        if at != bytes.len() {
            return Err(bad());
        }
        Ok(runs)
    }
}

impl Serialize for Runs {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        RunsOut { count: self.count, bytes: &self.bytes }.serialize(s)
    }
}

impl<'de> Deserialize<'de> for Runs {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let wire = RunsIn::deserialize(d)?;
        let mut runs =
            Runs::decode_checked(wire.count, &wire.bytes).map_err(serde::de::Error::custom)?;
        // Sorted as written; a record from elsewhere is sorted here rather than misread.
        runs.sort_by_key(|r| (r.map_id, r.attempt_id));
        Ok(Runs::encode(&runs))
    }
}

/// A flushed region of a partition file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Chunk {
    /// Which of the partition's files (their number, in opening order).
    file: u32,
    offset: u64,
    len: u64,
    /// The chunk's bytes, in order, as runs of one map attempt each, sorted by `(map, attempt)`
    /// with one run per attempt (see [`group_by_attempt`]).
    runs: Runs,
}

impl Chunk {
    /// A chunk of `runs` (grouped by attempt) written at `offset` of file number `file`.
    pub(crate) fn new(file: u32, offset: u64, runs: Box<[Run]>) -> Chunk {
        let len = runs.iter().map(|r| r.len as u64).sum();
        Chunk { file, offset, len, runs: Runs::encode(&runs) }
    }

    /// A chunk read back from a version 1 commit record, which listed its runs one by one.
    pub(crate) fn from_runs(file: u32, offset: u64, len: u64, mut runs: Vec<Run>) -> Chunk {
        runs.sort_by_key(|r| (r.map_id, r.attempt_id));
        Chunk { file, offset, len, runs: Runs::encode(&runs) }
    }

    /// Bytes its index holds on the heap (beyond the `Chunk` itself).
    pub fn heap_bytes(&self) -> usize {
        self.runs.bytes.len()
    }

    /// The number of the partition file that holds the chunk.
    pub fn file(&self) -> u32 {
        self.file
    }

    /// Where the chunk starts in its file (a multiple of [`CHUNK_ALIGN`]).
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The chunk's bytes, padding excluded.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Where the chunk's padding ends in its file.
    pub fn padded_end(&self) -> u64 {
        self.offset + padded_len(self.len)
    }

    /// Whether the chunk holds a batch of a map in `[start, end)`.
    pub fn has_map_in(&self, start: u32, end: u32) -> bool {
        let (first, last) = self.runs.maps;
        if self.runs.count == 0 || end <= first || start > last {
            return false;
        }
        self.runs.iter().find(|r| r.map_id >= start).is_some_and(|r| r.map_id < end)
    }

    /// The byte ranges of the file, ascending and with adjacent ones merged, that hold the
    /// chunk's batches of map attempts `wanted` says yes to. Empty when it holds none.
    pub fn ranges(&self, mut wanted: impl FnMut(u32, u32) -> bool) -> Vec<ByteRange> {
        let mut out: Vec<ByteRange> = Vec::new();
        let mut at = self.offset;
        for r in self.runs.iter() {
            if wanted(r.map_id, r.attempt_id) {
                match out.last_mut() {
                    Some(last) if last.offset + last.len == at => last.len += r.len as u64,
                    _ => out.push(ByteRange { offset: at, len: r.len as u64 }),
                }
            }
            at += r.len as u64;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(map_id: u32, attempt_id: u32, len: u32) -> Run {
        Run { map_id, attempt_id, len }
    }

    fn range(offset: u64, len: u64) -> ByteRange {
        ByteRange { offset, len }
    }

    #[test]
    fn chunk_map_range_and_byte_ranges() {
        let c = Chunk::new(
            0,
            4096,
            vec![run(3, 0, 10), run(3, 1, 20), run(7, 0, 30), run(9, 2, 40)].into(),
        );
        assert_eq!((c.len(), c.padded_end()), (100, 8192));
        assert!(c.has_map_in(0, 4));
        assert!(!c.has_map_in(4, 7));
        assert!(c.has_map_in(7, 8));
        assert!(!c.has_map_in(10, 20));
        assert!(!c.has_map_in(5, 5));
        assert_eq!(c.ranges(|_, _| true), vec![range(4096, 100)], "all of it: one range");
        assert_eq!(c.ranges(|_, _| false), vec![]);
        // Map 3's losing attempt 1 left out: two ranges around it.
        assert_eq!(
            c.ranges(|m, a| a == [0, 0, 0, 0, 0, 0, 0, 0, 0, 2][m as usize]),
            vec![range(4096, 10), range(4126, 70)]
        );
        assert_eq!(c.ranges(|m, _| (7..10).contains(&m)), vec![range(4126, 70)]);
        assert_eq!(c.ranges(|m, a| m == 3 && a == 1), vec![range(4106, 20)]);
    }

    #[test]
    fn runs_encode_in_a_few_bytes_and_decode_as_they_were() {
        let runs: Vec<Run> = [
            run(0, 0, 36),
            run(1, 0, 36),
            run(1, 6, 127),
            run(1, 7, 128),
            run(16, 300, 70_000),
            run(31, 0, 1),
            run(1_000_000, 2, u32::MAX),
            run(u32::MAX, u32::MAX, 0),
        ]
        .into();
        let enc = Runs::encode(&runs);
        assert_eq!(enc.iter().collect::<Vec<_>>(), runs);
        // Map 0 attempt 0, 36 bytes; then the next map, attempt 0, 36 bytes: 2 bytes each.
        assert_eq!(&enc.bytes[..4], &[0, 36, 1 << 3, 36]);
        let wide = Runs::encode(&(0..2000).map(|m| run(m, 0, 36)).collect::<Vec<_>>());
        assert_eq!(wide.bytes.len(), 4000, "2,000 maps' small batches");
        // The record's format: the count and the bytes as held.
        let bytes = postcard::to_allocvec(&enc).unwrap();
        assert_eq!(bytes.len(), 1 + 1 + enc.bytes.len(), "a count, a length, the bytes");
        assert_eq!(postcard::from_bytes::<Runs>(&bytes).unwrap(), enc);
        // Bytes that do not decode to their count of runs are refused, never misread.
        for (count, bad) in
            [(2, &[0u8, 36][..]), (1, &[0, 36, 0]), (1, &[0x80, 36]), (1, &[0, 0xff])]
        {
            let wire = postcard::to_allocvec(&RunsOut { count, bytes: bad }).unwrap();
            assert!(postcard::from_bytes::<Runs>(&wire).is_err(), "{count} runs in {bad:?}");
        }
        let empty = Chunk::new(0, 0, Box::new([]));
        assert!(!empty.has_map_in(0, u32::MAX));
    }

    #[test]
    fn chunks_are_page_aligned() {
        assert_eq!(padded_len(0), 0);
        assert_eq!(padded_len(1), 4096);
        assert_eq!(padded_len(4096), 4096);
        assert_eq!(padded_len(4097), 8192);
    }
}
