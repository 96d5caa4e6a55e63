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

    /// Appends `len` bytes to `out`, from `offset` of block `block` on, across blocks.
    fn copy_from(&self, mut block: usize, mut offset: usize, mut len: usize, out: &mut Vec<u8>) {
        while len > 0 && block < self.blocks.len() {
            let b = &self.blocks[block];
            if offset < b.len() {
                let take = len.min(b.len() - offset);
                out.extend_from_slice(&b[offset..offset + take]);
                len -= take;
            }
            (block, offset) = (block + 1, 0);
        }
    }

    /// Each batch's `(map, attempt)` and where it is, as runs of one attempt in staging order.
    /// The batches were checked when pushed. Walks the blocks once: a flush of a wide shuffle
    /// reads hundreds of small batch headers, nearly all within one block.
    fn runs(&self, out: &mut Vec<(Run, Loc)>, piece: u32) {
        const HEAD: usize = BATCH_HEADER_LEN;
        let mut spanning = Vec::with_capacity(HEAD);
        let (mut block, mut offset) = (0usize, 0usize); // where the next batch starts
        let mut left = self.len; // staged bytes from there on
        let first = out.len();
        let word = |h: &[u8], i: usize| u32::from_be_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
        while left >= HEAD as u64 {
            while offset >= self.blocks[block].len() {
                (block, offset) = (block + 1, offset - self.blocks[block].len());
            }
            let b = &self.blocks[block];
            let head = if offset + HEAD <= b.len() {
                &b[offset..offset + HEAD]
            } else {
                spanning.clear();
                self.copy_from(block, offset, HEAD, &mut spanning);
                &spanning[..]
            };
            let (map_id, attempt_id) = (word(head, 0), word(head, 4));
            let len = HEAD as u32 + word(head, 12);
            let at = Loc::Staged { piece, block: block as u32, offset: offset as u32 };
            match out[first..].last_mut() {
                Some((r, _)) if (r.map_id, r.attempt_id) == (map_id, attempt_id) => r.len += len,
                _ => out.push((Run { map_id, attempt_id, len }, at)),
            }
            offset += len as usize;
            left = left.saturating_sub(len as u64);
        }
        debug_assert_eq!(left, 0, "staged bytes are whole batches");
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
    /// Piece `piece`, staged, from `offset` of its block `block` on (blocks are at most 1 MiB).
    Staged { piece: u32, block: u32, offset: u32 },
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
            // Each attempt's batches keep their order: the position breaks ties (an unstable
            // sort of small keys, several times faster than a stable one of the entries).
            let mut order: Vec<(u64, u32)> = (entries.iter().enumerate())
                .map(|(i, (r, _))| ((r.map_id as u64) << 32 | r.attempt_id as u64, i as u32))
                .collect();
            order.sort_unstable();
            let staged_len: u64 = self
                .pieces
                .iter()
                .map(|p| if let Piece::Staged(s) = p { s.len() } else { 0 })
                .sum();
            let mut copy: Vec<u8> = Vec::with_capacity(staged_len as usize);
            for &(_, i) in &order {
                let (run, loc) = entries[i as usize];
                match loc {
                    Loc::Staged { piece, block, offset } => {
                        let Piece::Staged(s) = &self.pieces[piece as usize] else { continue };
                        s.copy_from(block as usize, offset as usize, run.len as usize, &mut copy);
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
            entries = order.iter().map(|&(_, i)| entries[i as usize]).collect();
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
    fn batches_out_of_order_across_blocks_are_grouped_by_attempt_in_push_order() {
        let budget = MemoryBudget::new(1 << 30, 0.7, 0.9, 0.6);
        let push = budget.try_reserve(1).unwrap();
        let mut buf = Buffer::default();
        // Maps and attempts in a scrambled order, of sizes that make batches span blocks, with
        // a slice now and then: the layout is every attempt's batches, in push order, by
        // (map, attempt).
        let mut pushed: Vec<((u32, u32), Bytes)> = Vec::new();
        for i in 0..4000u32 {
            let (map, attempt) = ((i * 7919) % 613, (i / 1300) % 3);
            let b = batches(&[(map, attempt, ((i * 31) % 200) as usize)]);
            if i % 97 == 0 {
                let run = Run { map_id: map, attempt_id: attempt, len: b.len() as u32 };
                buf.append(std::iter::once((b.clone(), run)), b.len() as u64, None);
            } else {
                assert!(buf.copy_in(&b, &push));
            }
            pushed.push(((map, attempt), b));
        }
        let len = buf.bytes() as usize;
        let layout = buf.lay_out();
        let mut want = pushed.clone();
        want.sort_by_key(|(k, _)| *k); // stable: push order within an attempt
        let want_bytes: Vec<u8> = want.iter().flat_map(|(_, b)| b.iter().copied()).collect();
        assert_eq!(&written(&layout)[..len], &want_bytes[..]);
        let mut want_runs: Vec<(u32, u32, u32)> = Vec::new();
        for ((m, a), b) in &want {
            match want_runs.last_mut() {
                Some(r) if (r.0, r.1) == (*m, *a) => r.2 += b.len() as u32,
                _ => want_runs.push((*m, *a, b.len() as u32)),
            }
        }
        let runs: Vec<_> = layout.runs.iter().map(|r| (r.map_id, r.attempt_id, r.len)).collect();
        assert_eq!(runs, want_runs);
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
