//! Pooled receive buffers for request bodies.
//!
//! A server receives push bodies (tens of KiB to a few MiB each) on its network threads and frees
//! them on its flusher threads once written. Left to the allocator, that cross-thread churn kept
//! freed memory mapped while new bodies took fresh pages: with mimalloc, a server's resident
//! memory rose tens of MiB past its budget under `Busy` churn, and a shorter purge delay traded
//! that for page faults on every body. The pool hands a freed body's buffer straight to the next
//! body of the same size class instead: memory already resident, no page fault, and the pool's
//! footprint (buffers out plus buffers kept) never passes its limit, which a server sets to its
//! memory budget.
//!
//! A buffer's size is the body's length rounded up to a sixteenth of the power of two below it
//! (4 KiB at least), so a body wastes at most 1/16 of its length: a 256 KiB batch with its
//! 20-byte header takes 272 KiB. (Whole 64 KiB steps made that 320 KiB, a quarter more memory
//! than the budget had counted.) A server charges its budget [`BodyPool::footprint`], the size
//! of the buffer, not the body's length. Bodies under [`MIN_POOLED`] or over [`MAX_POOLED`]
//! bypass the pool.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;

/// Smallest size step of pooled buffers.
const MIN_STEP: usize = 4 << 10;
/// Smaller bodies are plain allocations (control messages, tiny pushes).
pub const MIN_POOLED: usize = 16 << 10;
/// Larger bodies are plain allocations (rare: beyond any client's push size).
pub const MAX_POOLED: usize = 16 << 20;

/// A bounded pool of body buffers, shared by a server's connections.
#[derive(Debug)]
pub struct BodyPool {
    limit: usize,
    inner: Mutex<Free>,
}

#[derive(Debug)]
struct Free {
    /// Per buffer size, buffers ready for reuse, most recently freed last.
    lists: BTreeMap<usize, Vec<Box<[u8]>>>,
    /// Capacity of the buffers in `lists`.
    kept: usize,
    /// Capacity of the pool's buffers currently held by bodies.
    out: usize,
    /// Bodies that got a kept buffer / a new allocation.
    reused: u64,
    allocated: u64,
    /// When a buffer was last taken (or the pool made).
    last_take: Instant,
}

/// Counters of a [`BodyPool`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BodyPoolStats {
    /// Bodies that got a kept buffer.
    pub reused: u64,
    /// Bodies that got a new allocation (pooled size, nothing kept to reuse).
    pub allocated: u64,
    /// Bytes of kept buffers now.
    pub kept_bytes: u64,
    /// Bytes of the pool's buffers held by bodies now.
    pub out_bytes: u64,
}

impl BodyPool {
    /// A pool whose buffers (held by bodies and kept for reuse, together) stay within `limit`
    /// bytes; beyond it, freed buffers go back to the allocator.
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(BodyPool {
            limit,
            inner: Mutex::new(Free {
                lists: BTreeMap::new(),
                kept: 0,
                out: 0,
                reused: 0,
                allocated: 0,
                last_take: Instant::now(),
            }),
        })
    }

    fn free(&self) -> MutexGuard<'_, Free> {
        // Nothing panics while holding the lock; a poisoned one is still consistent.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a body of `len` bytes goes through the pool.
    pub fn pools(len: usize) -> bool {
        (MIN_POOLED..=MAX_POOLED).contains(&len)
    }

    /// The memory a body of `len` bytes takes: its pooled buffer's size, or `len` for a body
    /// the pool does not take.
    pub fn footprint(len: usize) -> usize {
        if !Self::pools(len) {
            return len;
        }
        let step = (1usize << len.ilog2()) / 16;
        len.next_multiple_of(step.max(MIN_STEP))
    }

    /// A buffer of at least `len` bytes (`len` within [`MIN_POOLED`]..=[`MAX_POOLED`]); its
    /// content is whatever an earlier body left there.
    pub(crate) fn take(self: &Arc<Self>, len: usize) -> PooledBuf {
        debug_assert!(Self::pools(len));
        let cap = Self::footprint(len);
        let kept = {
            let mut free = self.free();
            free.last_take = Instant::now();
            free.out += cap;
            let buf = free.lists.get_mut(&cap).and_then(Vec::pop);
            if buf.is_some() {
                free.kept -= cap;
                free.reused += 1;
            } else {
                free.allocated += 1;
                // Room for the new buffer within the limit: kept buffers of other sizes go back
                // to the allocator, largest first.
                while free.out + free.kept > self.limit {
                    let Some(b) = free.lists.values_mut().rev().find_map(Vec::pop) else { break };
                    free.kept -= b.len();
                }
            }
            buf
        };
        // Allocated outside the lock.
        let buf = kept.unwrap_or_else(|| vec![0u8; cap].into_boxed_slice());
        PooledBuf { buf: Some(buf), len, pool: self.clone() }
    }

    fn give_back(&self, buf: Box<[u8]>) {
        let cap = buf.len();
        let mut free = self.free();
        free.out -= cap;
        if free.out + free.kept + cap <= self.limit {
            free.kept += cap;
            free.lists.entry(cap).or_default().push(buf);
        }
        // else: dropped here, back to the allocator (outside the pool's limit).
    }

    /// Gives every kept buffer back to the allocator when no buffer was taken for `idle`, so a
    /// server between jobs does not sit on its budget's worth of memory. Returns the bytes given.
    pub fn release_if_idle(&self, idle: Duration) -> usize {
        let mut free = self.free();
        if free.last_take.elapsed() < idle {
            return 0;
        }
        let kept = free.kept;
        free.lists.clear();
        free.kept = 0;
        kept
    }

    /// The pool's counters.
    pub fn stats(&self) -> BodyPoolStats {
        let free = self.free();
        BodyPoolStats {
            reused: free.reused,
            allocated: free.allocated,
            kept_bytes: free.kept as u64,
            out_bytes: free.out as u64,
        }
    }
}

/// A buffer from a [`BodyPool`], returned to it when dropped. Fill it through
/// [`PooledBuf::bytes_mut`], then make it a [`Bytes`] with [`PooledBuf::freeze`].
#[derive(Debug)]
pub(crate) struct PooledBuf {
    buf: Option<Box<[u8]>>,
    len: usize,
    pool: Arc<BodyPool>,
}

impl PooledBuf {
    /// The body's `len` bytes, to fill.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        let len = self.len;
        &mut self.buf.as_mut().expect("present until dropped")[..len]
    }

    /// The filled body as `Bytes`; the buffer returns to the pool when the last slice of it is
    /// dropped.
    pub fn freeze(self) -> Bytes {
        Bytes::from_owner(self)
    }
}

impl AsRef<[u8]> for PooledBuf {
    fn as_ref(&self) -> &[u8] {
        &self.buf.as_ref().expect("present until dropped")[..self.len]
    }
}

impl Drop for PooledBuf {
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take() {
            self.pool.give_back(buf);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const K64: usize = 64 << 10;

    #[test]
    fn a_freed_buffer_serves_the_next_body_of_its_size() {
        let pool = BodyPool::new(8 << 20);
        let mut b = pool.take(100_000);
        b.bytes_mut().fill(7);
        let addr = b.as_ref().as_ptr();
        let bytes = b.freeze();
        assert_eq!(bytes.len(), 100_000);
        let slice = bytes.slice(10..20);
        drop(bytes);
        // A slice still holds the buffer.
        assert_eq!(pool.stats().kept_bytes, 0);
        assert_eq!(&slice[..], &[7u8; 10]);
        drop(slice);
        let s = pool.stats();
        assert_eq!((s.kept_bytes, s.out_bytes), (100 << 10, 0));
        // Same size (96..100 KiB): the same memory; another size: a new allocation.
        let again = pool.take(99_000);
        assert_eq!(again.as_ref().as_ptr(), addr);
        let other = pool.take(300_000);
        let s = pool.stats();
        assert_eq!((s.reused, s.allocated), (1, 2));
        assert_eq!(s.out_bytes, (100 + 304) << 10);
        drop((again, other));
    }

    #[test]
    fn a_buffer_wastes_at_most_a_sixteenth_of_its_body() {
        // A 256 KiB batch and its header: 272 KiB, where 64 KiB steps took 320.
        assert_eq!(BodyPool::footprint((256 << 10) + 20), 272 << 10);
        assert_eq!(BodyPool::footprint(1 << 20), 1 << 20);
        assert_eq!(BodyPool::footprint(MIN_POOLED + 1), MIN_POOLED + MIN_STEP);
        for len in (MIN_POOLED..=MAX_POOLED).step_by(7_919).chain([MAX_POOLED]) {
            let f = BodyPool::footprint(len);
            assert!(f >= len && f - len < (len / 16).max(MIN_STEP), "{len} -> {f}");
            assert_eq!(BodyPool::footprint(f), f, "a buffer's size is its own footprint");
        }
        // Outside the pool: the body's own length.
        assert_eq!(BodyPool::footprint(100), 100);
        assert_eq!(BodyPool::footprint(MAX_POOLED + 5), MAX_POOLED + 5);
    }

    #[test]
    fn buffers_out_and_kept_stay_within_the_limit() {
        let limit = 1 << 20;
        let pool = BodyPool::new(limit);
        // Fill the pool with small buffers, then ask for large ones: kept small buffers are
        // given up to make room, and at no point do out + kept pass the limit (beyond what is
        // out, which the caller's own accounting bounds).
        let small: Vec<_> = (0..16).map(|_| pool.take(K64)).collect();
        drop(small);
        assert_eq!(pool.stats().kept_bytes, limit as u64);
        for _ in 0..4 {
            let big = pool.take(512 << 10);
            let s = pool.stats();
            assert!(s.kept_bytes + s.out_bytes <= limit as u64, "{s:?}");
            drop(big);
            let s = pool.stats();
            assert!(s.kept_bytes + s.out_bytes <= limit as u64, "{s:?}");
        }
        // Over the limit with buffers out: what comes back beyond it is not kept.
        let held: Vec<_> = (0..3).map(|_| pool.take(512 << 10)).collect();
        drop(held);
        assert!(pool.stats().kept_bytes <= limit as u64);
        assert_eq!(pool.stats().out_bytes, 0);
    }

    #[test]
    fn an_idle_pool_gives_its_buffers_back() {
        let pool = BodyPool::new(8 << 20);
        drop(pool.take(K64));
        assert_eq!(pool.release_if_idle(Duration::from_secs(60)), 0, "not idle yet");
        assert_eq!(pool.stats().kept_bytes, K64 as u64);
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(pool.release_if_idle(Duration::from_millis(10)), K64);
        assert_eq!(pool.stats().kept_bytes, 0);
    }

    #[test]
    fn only_mid_sized_bodies_are_pooled() {
        assert!(!BodyPool::pools(MIN_POOLED - 1));
        assert!(BodyPool::pools(MIN_POOLED));
        assert!(BodyPool::pools(MAX_POOLED));
        assert!(!BodyPool::pools(MAX_POOLED + 1));
    }
}
