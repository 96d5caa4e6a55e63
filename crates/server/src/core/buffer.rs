//! A partition's buffer: pushed bytes waiting to be flushed, and how a flush lays them out.
//!
//! Large sections stay where they arrived: slices of their push body, which stays in memory
//! (and reserved) until every partition holding a slice of it has flushed. Small sections are
//! copied into the partition's own blocks ([`Staged`]) as they arrive, paid for by a
//! reservation of the partition's, so that
//! - a body whose sections were all copied is freed as soon as the push is stored: flushing one
//!   partition frees that partition's memory, not a share of bodies pinned by a thousand others
//!   (a wide shuffle's pushes hold one small section for every partition);
//! - a flush writes a few large buffers, not one `iovec` per section (the kernel copies tiny
//!   `iovec`s at a fraction of its speed), and the buffer keeps no bookkeeping per section: the
//!   runs of copied batches are read back from their headers when the flush is laid out.
//!
//! A flush lays the bytes out grouped by map attempt ([`Layout`]): copied runs are copied once
//! more, in order, into one contiguous buffer; slices are written where they are.

use std::sync::Arc;

use bytes::Bytes;
use sluice_proto::batch::BATCH_HEADER_LEN;

use super::chunk::{padding, Run};
use crate::memory_budget::Reservation;

/// Sections shorter than this are copied into the partition's blocks; longer ones stay
/// zero-copy slices of their push body.
pub const COPY_BELOW: usize = 32 << 10;

/// Whole batches copied back to back into blocks. Blocks are never reallocated: a new one is
/// added when the last is full, a quarter of what is staged (1 KiB to 1 MiB) or what the
/// section needs, so unused capacity stays under a quarter of the bytes plus 1 KiB. A batch
/// may span blocks.
#[derive(Debug, Default)]
pub struct Staged {
    blocks: Vec<Vec<u8>>,
    len: u64,
}

impl Staged {
    const MIN_BLOCK: u64 = 1 << 10;
    const MAX_BLOCK: u64 = 1 << 20;

    /// Bytes staged.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Capacity a new block must bring for `n` more bytes to fit (0: they fit).
    pub fn growth_for(&self, n: usize) -> usize {
        let free = self.blocks.last().map_or(0, |b| b.capacity() - b.len());
        if n <= free {
            return 0;
        }
        let quarter = (self.len / 4).clamp(Self::MIN_BLOCK, Self::MAX_BLOCK) as usize;
        quarter.max(n - free)
    }

    /// Copies `data` in; `growth` must be [`Self::growth_for`] of it (already reserved).
    pub fn append(&mut self, data: &[u8], growth: usize) {
        let mut rest = data;
        if let Some(last) = self.blocks.last_mut() {
            let take = rest.len().min(last.capacity() - last.len());
            last.extend_from_slice(&rest[..take]);
            rest = &rest[take..];
        }
        if !rest.is_empty() {
            debug_assert!(growth >= rest.len());
            let mut block = Vec::with_capacity(growth);
            block.extend_from_slice(rest);
            self.blocks.push(block);
        }
        self.len += data.len() as u64;
    }

    /// Capacity of every block (what its reservation pays for).
    #[cfg(any(test, feature = "fuzzing"))]
    pub fn capacity(&self) -> u64 {
        self.blocks.iter().map(|b| b.capacity() as u64).sum()
    }

    /// Heap bytes of its bookkeeping (the block list, not the blocks).
    fn heap_bytes(&self) -> usize {
        self.blocks.capacity() * std::mem::size_of::<Vec<u8>>()
    }

    /// Where each block starts in the staged bytes (for [`Self::copy_range`]).
    fn block_starts(&self) -> Vec<u64> {
        let mut at = 0;
        self.blocks
            .iter()
            .map(|b| {
                let start = at;
                at += b.len() as u64;
                start
            })
            .collect()
    }

    /// Appends `len` bytes from `offset` to `out`, across blocks; `starts` is
    /// [`Self::block_starts`]. Finds the first block by bisection: a partition's staged bytes
    /// span a dozen blocks or more, and a flush copies hundreds of small batches out of them.
    fn copy_range(&self, starts: &[u64], mut offset: u64, mut len: usize, out: &mut Vec<u8>) {
        let mut i = starts.partition_point(|&s| s <= offset).saturating_sub(1);
        while len > 0 && i < self.blocks.len() {
            let b = &self.blocks[i];
            let at = offset.saturating_sub(starts[i]) as usize;
            if at < b.len() {
                let take = len.min(b.len() - at);
                out.extend_from_slice(&b[at..at + take]);
                len -= take;
                offset += take as u64;
            }
            i += 1;
        }
    }

    /// Each batch's `(map, attempt)` and where it is, as runs of one attempt in staging order:
    /// `(run, offset)`. The batches were checked when pushed.
    fn runs(&self, out: &mut Vec<(Run, Loc)>, piece: u32) {
        let mut head = Vec::with_capacity(BATCH_HEADER_LEN);
        let starts = self.block_starts();
        let mut at = 0u64;
        let first = out.len();
        let word = |h: &[u8], i: usize| u32::from_be_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
        while at + BATCH_HEADER_LEN as u64 <= self.len {
            head.clear();
            self.copy_range(&starts, at, BATCH_HEADER_LEN, &mut head);
            let (map_id, attempt_id) = (word(&head, 0), word(&head, 4));
            let len = BATCH_HEADER_LEN as u32 + word(&head, 12);
            match out[first..].last_mut() {
                Some((r, _)) if (r.map_id, r.attempt_id) == (map_id, attempt_id) => r.len += len,
                _ => out.push((Run { map_id, attempt_id, len }, Loc::Staged(piece, at))),
            }
            at += len as u64;
        }
        debug_assert_eq!(at, self.len, "staged bytes are whole batches");
    }
}

/// Part of a buffer, in push order.
#[derive(Debug)]
enum Piece {
    /// A slice of a push body: one run.
    Slice(Bytes, Run),
    /// Copied sections.
    Staged(Staged),
}

/// Where a run's bytes are in the buffer.
#[derive(Debug, Clone, Copy)]
enum Loc {
    /// Piece `n`, a slice.
    Slice(u32),
    /// At this offset of piece `n`, staged.
    Staged(u32, u64),
}

/// Bytes waiting in memory to be flushed, with the reservations that pay for them.
#[derive(Debug, Default)]
pub struct Buffer {
    pieces: Vec<Piece>,
    /// Shared by every partition a push had sections it did not copy for: the push's memory
    /// is freed when the last of them is flushed.
    reservations: Vec<Arc<Reservation>>,
    /// Pays for the blocks of every staged piece.
    staged: Option<Reservation>,
    bytes: u64,
    /// Seen holding data by the last age check (see [`Self::age`]).
    aged: bool,
}

impl Buffer {
    /// Bytes buffered.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Marks the buffer as seen by an age check; returns whether the previous check saw it
    /// too (it has waited at least one check interval since). A flush takes the mark with
    /// the buffer.
    pub fn age(&mut self) -> bool {
        std::mem::replace(&mut self.aged, true)
    }

    /// Heap bytes of its bookkeeping (not of the pushed or copied bytes: the budget counts
    /// those).
    pub fn heap_bytes(&self) -> usize {
        use std::mem::size_of;
        let staged = self.pieces.iter().map(|p| match p {
            Piece::Staged(s) => s.heap_bytes(),
            Piece::Slice(..) => 0,
        });
        self.pieces.capacity() * size_of::<Piece>()
            + staged.sum::<usize>()
            + self.reservations.capacity() * size_of::<Arc<Reservation>>()
    }

    /// Bytes reserved for copies.
    #[cfg(any(test, feature = "fuzzing"))]
    pub fn staged_reserved(&self) -> u64 {
        self.staged.as_ref().map_or(0, Reservation::bytes)
    }

    /// Capacity of the blocks holding copies.
    #[cfg(any(test, feature = "fuzzing"))]
    pub fn staged_capacity(&self) -> u64 {
        let each = self.pieces.iter().map(|p| match p {
            Piece::Staged(s) => s.capacity(),
            Piece::Slice(..) => 0,
        });
        each.sum()
    }

    /// Adds a section's slices (one per run); `reservation` pays for them.
    pub fn append(
        &mut self,
        slices: impl Iterator<Item = (Bytes, Run)>,
        len: u64,
        reservation: Option<&Arc<Reservation>>,
    ) {
        self.pieces.extend(slices.map(|(b, r)| Piece::Slice(b, r)));
        if let Some(r) = reservation {
            self.reservations.push(r.clone());
        }
        self.bytes += len;
    }

    /// Copies a section (whole batches) into the buffer's blocks, its new capacity reserved
    /// like `like` (same budget and holder). `false`: the budget has no room for it; nothing
    /// changed (the caller keeps the section as a slice instead).
    pub fn copy_in(&mut self, data: &[u8], like: &Reservation) -> bool {
        let growth = match self.pieces.last() {
            Some(Piece::Staged(s)) => s.growth_for(data.len()),
            _ => Staged::default().growth_for(data.len()),
        };
        let reservation = self.staged.get_or_insert_with(|| like.empty_like());
        if growth > 0 && !reservation.try_grow(growth as u64) {
            return false;
        }
        if !matches!(self.pieces.last(), Some(Piece::Staged(_))) {
            self.pieces.push(Piece::Staged(Staged::default()));
        }
        let Some(Piece::Staged(s)) = self.pieces.last_mut() else { unreachable!("just pushed") };
        s.append(data, growth);
        self.bytes += data.len() as u64;
        true
    }

    /// Lays the bytes out as a flush writes them (see [`Layout`]). The copies' blocks are
    /// freed here (their bytes are in the layout's buffer); the reservations stay with the
    /// buffer until it is dropped.
    pub fn lay_out(&mut self) -> Layout {
        let mut entries: Vec<(Run, Loc)> = Vec::new();
        for (n, p) in self.pieces.iter().enumerate() {
            match p {
                Piece::Slice(_, run) => entries.push((*run, Loc::Slice(n as u32))),
                Piece::Staged(s) => s.runs(&mut entries, n as u32),
            }
        }
        let sorted = entries.is_sorted_by_key(|(r, _)| (r.map_id, r.attempt_id));
        let mut slices: Vec<Bytes> = Vec::new();
        if sorted && self.pieces.len() == 1 {
            // One staged piece in order already: its blocks are the layout.
            match self.pieces.pop() {
                Some(Piece::Staged(s)) => {
                    slices.extend(s.blocks.into_iter().filter(|b| !b.is_empty()).map(Bytes::from))
                }
                Some(Piece::Slice(b, _)) => slices.push(b),
                None => {}
            }
        } else {
            // Stable: each attempt's batches keep their order.
            entries.sort_by_key(|(r, _)| (r.map_id, r.attempt_id));
            let staged_len: u64 = self
                .pieces
                .iter()
                .map(|p| if let Piece::Staged(s) = p { s.len() } else { 0 })
                .sum();
            let mut copy: Vec<u8> = Vec::with_capacity(staged_len as usize);
            let starts: Vec<Vec<u64>> = self
                .pieces
                .iter()
                .map(|p| if let Piece::Staged(s) = p { s.block_starts() } else { Vec::new() })
                .collect();
            for (run, loc) in &entries {
                match *loc {
                    Loc::Staged(n, at) => {
                        let Piece::Staged(s) = &self.pieces[n as usize] else { continue };
                        s.copy_range(&starts[n as usize], at, run.len as usize, &mut copy);
                    }
                    Loc::Slice(n) => {
                        let Piece::Slice(b, _) = &self.pieces[n as usize] else { continue };
                        if !copy.is_empty() {
                            let rest = copy.capacity() - copy.len();
                            let full = std::mem::replace(&mut copy, Vec::with_capacity(rest));
                            slices.push(Bytes::from(full));
                        }
                        slices.push(b.clone());
                    }
                }
            }
            if !copy.is_empty() {
                slices.push(Bytes::from(copy));
            }
            self.pieces.clear();
        }
        let mut runs: Vec<Run> = Vec::new();
        for (r, _) in entries {
            match runs.last_mut() {
                Some(g) if (g.map_id, g.attempt_id) == (r.map_id, r.attempt_id) => g.len += r.len,
                _ => runs.push(r),
            }
        }
        let pad = padding(self.bytes);
        if !pad.is_empty() {
            slices.push(pad);
        }
        Layout { slices, runs: runs.into_boxed_slice() }
    }
}

/// A flush's bytes as written: grouped by map attempt (sorted by map, then attempt, each
/// attempt's batches in push order), then zero padding to a whole page.
#[derive(Debug, Default)]
pub struct Layout {
    /// The bytes, in order.
    pub slices: Vec<Bytes>,
    /// The runs of one attempt each, in order.
    pub runs: Box<[Run]>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory_budget::MemoryBudget;
    use bytes::BytesMut;
    use sluice_proto::batch::put_batch;

    fn batches(of: &[(u32, u32, usize)]) -> Bytes {
        let mut b = BytesMut::new();
        for (i, &(map, attempt, n)) in of.iter().enumerate() {
            put_batch(&mut b, map, attempt, i as u32, &vec![map as u8; n]);
        }
        b.freeze()
    }

    fn written(l: &Layout) -> Vec<u8> {
        l.slices.iter().flat_map(|s| s.iter().copied()).collect()
    }

    #[test]
    fn copies_and_slices_are_laid_out_by_attempt_in_push_order() {
        let budget = MemoryBudget::new(1 << 20, 0.7, 0.9, 0.6);
        let push = budget.try_reserve(1000).unwrap();
        let mut buf = Buffer::default();
        let (a, b, c) =
            (batches(&[(3, 0, 5)]), batches(&[(1, 0, 7), (3, 0, 2)]), batches(&[(1, 0, 900)]));
        assert!(buf.copy_in(&a, &push));
        assert!(buf.copy_in(&b, &push));
        let run = Run { map_id: 1, attempt_id: 0, len: c.len() as u32 };
        buf.append(std::iter::once((c.clone(), run)), c.len() as u64, None);
        assert!(buf.copy_in(&batches(&[(0, 1, 1)]), &push));
        let bytes = buf.bytes();
        assert_eq!(bytes, (a.len() + b.len() + c.len() + 21) as u64);
        assert!(buf.staged_reserved() >= buf.staged_capacity());
        let layout = buf.lay_out();
        let runs: Vec<_> = layout.runs.iter().map(|r| (r.map_id, r.attempt_id, r.len)).collect();
        assert_eq!(runs, [(0, 1, 21), (1, 0, 27 + c.len() as u32), (3, 0, 25 + 22)]);
        let out = written(&layout);
        assert_eq!(out.len() as u64, bytes.div_ceil(4096) * 4096, "padded to a page");
        // Map 1: the copied batch, then the slice (push order); map 3: both copied batches.
        let mut want = batches(&[(0, 1, 1)]).to_vec();
        want.extend_from_slice(&b[..27]);
        want.extend_from_slice(&c);
        want.extend_from_slice(&a);
        want.extend_from_slice(&b[27..]);
        assert_eq!(&out[..bytes as usize], &want[..]);
        assert!(out[bytes as usize..].iter().all(|&x| x == 0));
    }

    #[test]
    fn slices_are_grouped_by_attempt_keeping_each_ones_order() {
        let b = |s: &'static str| Bytes::from_static(s.as_bytes());
        let run = |map_id, attempt_id| Run { map_id, attempt_id, len: 2 };
        let mut buf = Buffer::default();
        let pushed =
            [("9a", 9, 0), ("3a", 3, 0), ("9b", 9, 0), ("3x", 3, 5), ("3b", 3, 0), ("1a", 1, 0)];
        for (s, map, attempt) in pushed {
            buf.append(std::iter::once((b(s), run(map, attempt))), 2, None);
        }
        let layout = buf.lay_out();
        assert_eq!(&written(&layout)[..12], b"1a3a3b3x9a9b");
        let runs: Vec<_> = layout.runs.iter().map(|r| (r.map_id, r.attempt_id, r.len)).collect();
        assert_eq!(runs, [(1, 0, 2), (3, 0, 4), (3, 5, 2), (9, 0, 4)]);
    }

    #[test]
    fn a_lone_slice_is_written_as_it_is() {
        let b = batches(&[(4, 0, 40_000)]);
        let mut buf = Buffer::default();
        let run = Run { map_id: 4, attempt_id: 0, len: b.len() as u32 };
        buf.append(std::iter::once((b.clone(), run)), b.len() as u64, None);
        let layout = buf.lay_out();
        assert_eq!(layout.slices[0], b, "the body's own bytes");
        assert_eq!(&*layout.runs, &[run]);
    }

    #[test]
    fn blocks_grow_without_moving_and_batches_may_span_them() {
        let budget = MemoryBudget::new(1 << 30, 0.7, 0.9, 0.6);
        let push = budget.try_reserve(1).unwrap();
        let mut buf = Buffer::default();
        let mut want = Vec::new();
        // Maps in order: the staged blocks are the layout as they are.
        for map in 0..3000u32 {
            let b = batches(&[(map, 0, (map % 50) as usize)]);
            assert!(buf.copy_in(&b, &push));
            want.extend_from_slice(&b);
        }
        let (cap, len) = (buf.staged_capacity(), buf.bytes());
        assert!(cap <= len + len / 4 + 1024, "capacity {cap} for {len} bytes");
        assert_eq!(buf.staged_reserved(), cap, "the reservation pays for exactly the blocks");
        assert_eq!(budget.used(), 1 + cap);
        let layout = buf.lay_out();
        assert!(layout.slices.len() > 3, "several blocks, written as they are");
        assert_eq!(layout.runs.len(), 3000);
        assert_eq!(&written(&layout)[..len as usize], &want[..]);
        drop(buf);
        assert_eq!(budget.used(), 1);
    }

    #[test]
    fn a_copy_the_budget_has_no_room_for_changes_nothing() {
        let budget = MemoryBudget::new(2000, 0.7, 0.9, 0.6);
        let push = budget.try_reserve(1800).unwrap();
        let mut buf = Buffer::default();
        assert!(!buf.copy_in(&batches(&[(0, 0, 300)]), &push));
        assert_eq!((buf.bytes(), budget.used()), (0, 1800));
    }
}
