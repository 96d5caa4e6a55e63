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

/// A flushed region of a partition file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Chunk {
    /// Which of the partition's files (their number, in opening order).
    file: u32,
    offset: u64,
    len: u64,
    /// The chunk's bytes, in order, as runs of one map attempt each, sorted by `(map, attempt)`
    /// with one run per attempt (see [`group_by_attempt`]).
    runs: Box<[Run]>,
}

impl Chunk {
    /// A chunk of `runs` (grouped by attempt) written at `offset` of file number `file`.
    pub(crate) fn new(file: u32, offset: u64, runs: Box<[Run]>) -> Chunk {
        let len = runs.iter().map(|r| r.len as u64).sum();
        Chunk { file, offset, len, runs }
    }

    /// The number of the partition file that holds the chunk.
    pub fn file(&self) -> u32 {
        self.file
    }

    /// Where the chunk starts in its file (a multiple of [`CHUNK_ALIGN`]).
    #[cfg(any(test, feature = "fuzzing"))]
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
        let i = self.runs.partition_point(|r| r.map_id < start);
        self.runs.get(i).is_some_and(|r| r.map_id < end)
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
    fn chunks_are_page_aligned() {
        assert_eq!(padded_len(0), 0);
        assert_eq!(padded_len(1), 4096);
        assert_eq!(padded_len(4096), 4096);
        assert_eq!(padded_len(4097), 8192);
    }
}
