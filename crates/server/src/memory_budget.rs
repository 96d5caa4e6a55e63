//! The byte-accounted memory budget for buffered shuffle data.
//!
//! Every pushed body is reserved here *before* it is read off the socket; the reservation travels
//! with the bytes and is released when the last slice of them is flushed and dropped. Usage is
//! compared with three watermarks: above `flush` the largest partition buffers are flushed, above
//! `busy` pushes are answered with a retriable `Busy` until usage falls below `resume`.
//! [`MemoryBudget::wait_for_room`] lets a push wait for that moment instead (see `busy_hold_ms`).

use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::Notify;

/// What the budget says about a new push.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pressure {
    /// Below the flush watermark.
    Normal,
    /// Above the flush watermark: flush the largest buffers.
    Flush,
    /// Above the busy watermark (or not yet back under resume): answer pushes with `Busy`.
    Busy,
}

/// A shared memory budget.
#[derive(Debug)]
pub struct MemoryBudget {
    capacity: u64,
    flush_at: u64,
    busy_at: u64,
    resume_at: u64,
    used: AtomicU64,
    peak: AtomicU64,
    paused: AtomicBool,
    /// Tasks in [`Self::wait_for_room`]: releases signal `room` only while there are some.
    waiting: AtomicUsize,
    room: Notify,
}

impl MemoryBudget {
    /// A budget of `capacity` bytes with watermarks given as fractions of it.
    pub fn new(capacity: u64, flush: f64, busy: f64, resume: f64) -> Arc<Self> {
        let at = |f: f64| (capacity as f64 * f) as u64;
        Arc::new(MemoryBudget {
            capacity,
            flush_at: at(flush),
            busy_at: at(busy),
            resume_at: at(resume),
            used: AtomicU64::new(0),
            peak: AtomicU64::new(0),
            paused: AtomicBool::new(false),
            waiting: AtomicUsize::new(0),
            room: Notify::new(),
        })
    }

    /// Reserves `bytes` unless the budget is paused or the reservation would cross the busy
    /// watermark (a push never takes the budget past it, so usage stays under the capacity).
    pub fn try_reserve(self: &Arc<Self>, bytes: u64) -> Option<Reservation> {
        if self.paused.load(Ordering::Acquire) {
            if self.used() >= self.resume_at {
                return None;
            }
            self.paused.store(false, Ordering::Release);
        }
        let mut cur = self.used.load(Ordering::Relaxed);
        loop {
            let next = cur.checked_add(bytes)?;
            // A single body larger than the whole busy headroom could never be admitted; let it in
            // when the budget is empty so a large frame cannot be starved forever.
            if next > self.busy_at && cur != 0 {
                self.paused.store(true, Ordering::Release);
                return None;
            }
            if next > self.capacity {
                return None;
            }
            match self.used.compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => {
                    self.peak.fetch_max(next, Ordering::Relaxed);
                    return Some(Reservation { budget: self.clone(), bytes, charge: None });
                }
                Err(actual) => cur = actual,
            }
        }
    }

    /// Whether a reservation may succeed now: usage is under the resume watermark while paused,
    /// under the busy watermark otherwise.
    fn has_room(&self) -> bool {
        let used = self.used();
        used < if self.is_paused() { self.resume_at } else { self.busy_at }
    }

    /// Whether a reservation of `bytes` may succeed now: [`Self::has_room`], and the bytes fit
    /// under the busy watermark (or the budget is empty, which takes any single body).
    fn has_room_for(&self, bytes: u64) -> bool {
        let used = self.used();
        self.has_room() && (used == 0 || used.saturating_add(bytes) <= self.busy_at)
    }

    /// Returns once a reservation of `bytes` may succeed ([`Self::has_room_for`]); at once if
    /// it may now. A release signals waiters only when it leaves room, so while the budget is
    /// paused they sleep until usage is back under the resume watermark, and a body larger than
    /// the room under it sleeps until a release leaves room for it (it never spins between a
    /// wakeup and a failed reservation). A reservation may still fail after the wakeup: waiters
    /// and other pushes race for the room.
    pub async fn wait_for_room(&self, bytes: u64) {
        struct Waiting<'a>(&'a AtomicUsize);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::SeqCst);
            }
        }
        self.waiting.fetch_add(1, Ordering::SeqCst);
        let _waiting = Waiting(&self.waiting);
        loop {
            // Registered before the check, so a release in between is not missed.
            let mut room = pin!(self.room.notified());
            room.as_mut().enable();
            if self.has_room_for(bytes) {
                return;
            }
            room.await;
        }
    }

    /// Current pressure.
    pub fn pressure(&self) -> Pressure {
        let used = self.used();
        if self.paused.load(Ordering::Acquire) && used >= self.resume_at || used >= self.busy_at {
            Pressure::Busy
        } else if used >= self.flush_at {
            Pressure::Flush
        } else {
            Pressure::Normal
        }
    }

    /// Whether pushes are being refused until usage falls under the resume watermark.
    pub fn is_paused(&self) -> bool {
        self.paused.load(Ordering::Acquire)
    }

    /// Bytes reserved now.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Acquire)
    }

    /// Highest reservation total seen.
    pub fn peak(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }

    /// The budget's size.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Bytes above which buffers are flushed.
    pub fn flush_at(&self) -> u64 {
        self.flush_at
    }

    /// Bytes below which flushing under pressure may stop.
    pub fn resume_at(&self) -> u64 {
        self.resume_at
    }
}

/// Bytes held from a [`MemoryBudget`]; released on drop.
#[derive(Debug)]
pub struct Reservation {
    budget: Arc<MemoryBudget>,
    bytes: u64,
    /// The application's (and user's) buffered-bytes count of these bytes, if kept: released
    /// with them (see `quota`).
    charge: Option<crate::quota::BufferedCharge>,
}

impl Reservation {
    /// Keeps `charge` until the reservation is released.
    pub fn charged(mut self, charge: crate::quota::BufferedCharge) -> Reservation {
        self.charge = Some(charge);
        self
    }

    /// An empty reservation from the same budget, counted for the same holder (application
    /// and user), to grow with [`Self::try_grow`]: what pays for bytes copied out of a push.
    pub fn empty_like(&self) -> Reservation {
        Reservation {
            budget: self.budget.clone(),
            bytes: 0,
            charge: self.charge.as_ref().map(|c| c.empty_like()),
        }
    }

    /// Reserves `bytes` more unless that would take the budget past its capacity. Unlike
    /// [`MemoryBudget::try_reserve`] it neither pauses the budget nor stops at the busy
    /// watermark: it pays for copies of bytes an admitted push holds already, whose own
    /// reservation is released just after.
    pub fn try_grow(&mut self, bytes: u64) -> bool {
        let b = &self.budget;
        let mut cur = b.used.load(Ordering::Relaxed);
        loop {
            let Some(next) = cur.checked_add(bytes).filter(|n| *n <= b.capacity) else {
                return false;
            };
            match b.used.compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => {
                    b.peak.fetch_max(next, Ordering::Relaxed);
                    self.bytes += bytes;
                    if let Some(c) = &mut self.charge {
                        c.grow(bytes);
                    }
                    return true;
                }
                Err(actual) => cur = actual,
            }
        }
    }

    /// Bytes it holds.
    #[cfg(any(test, feature = "fuzzing"))]
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let b = &self.budget;
        b.used.fetch_sub(self.bytes, Ordering::SeqCst);
        if b.waiting.load(Ordering::SeqCst) != 0 && b.has_room() {
            b.room.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_waiter_wakes_when_usage_is_back_under_resume() {
        let b = MemoryBudget::new(1000, 0.7, 0.9, 0.6);
        let r1 = b.try_reserve(650).unwrap();
        let r2 = b.try_reserve(200).unwrap();
        assert!(b.try_reserve(100).is_none(), "would cross busy: paused");
        let short = std::time::Duration::from_millis(20);
        assert!(tokio::time::timeout(short, b.wait_for_room(100)).await.is_err(), "room at 850");
        let waiter = tokio::spawn({
            let b = b.clone();
            async move { b.wait_for_room(100).await }
        });
        tokio::task::yield_now().await;
        drop(r2); // 650: under busy, not under resume
        tokio::time::sleep(short).await;
        assert!(!waiter.is_finished(), "woke above the resume watermark");
        drop(r1); // 0
        tokio::time::timeout(std::time::Duration::from_secs(5), waiter).await.unwrap().unwrap();
        assert!(b.try_reserve(200).is_some());
        assert_eq!(b.waiting.load(Ordering::SeqCst), 0);
    }

    /// A body larger than the room under the resume watermark leaves the busy one: a waiter
    /// for it sleeps until a release leaves room for it, rather than waking at every check.
    #[tokio::test]
    async fn a_waiter_for_a_large_body_sleeps_until_it_fits() {
        let b = MemoryBudget::new(1000, 0.7, 0.9, 0.6);
        let r1 = b.try_reserve(300).unwrap();
        let r2 = b.try_reserve(200).unwrap();
        assert!(b.try_reserve(450).is_none(), "950 would cross busy (900): paused");
        // 500 used, under resume (600): room, but not for 450.
        let short = std::time::Duration::from_millis(20);
        assert!(
            tokio::time::timeout(short, b.wait_for_room(450)).await.is_err(),
            "no room for 450"
        );
        let waiter = tokio::spawn({
            let b = b.clone();
            async move { b.wait_for_room(450).await }
        });
        tokio::task::yield_now().await;
        drop(r2); // 300: 750 fits under 900
        tokio::time::timeout(std::time::Duration::from_secs(5), waiter).await.unwrap().unwrap();
        assert!(b.try_reserve(450).is_some());
        drop(r1);
    }

    #[test]
    fn reserves_releases_and_applies_hysteresis() {
        let b = MemoryBudget::new(1000, 0.7, 0.9, 0.6);
        let r1 = b.try_reserve(650).unwrap();
        assert_eq!(b.pressure(), Pressure::Normal);
        let r2 = b.try_reserve(100).unwrap();
        assert_eq!(b.pressure(), Pressure::Flush);
        assert!(b.try_reserve(200).is_none(), "would cross busy");
        assert_eq!(b.pressure(), Pressure::Busy);
        drop(r2); // 650: below busy but above resume: still paused
        assert!(b.try_reserve(10).is_none());
        drop(r1); // 0: below resume
        let r3 = b.try_reserve(10).unwrap();
        assert_eq!(b.used(), 10);
        assert_eq!(b.peak(), 750);
        drop(r3);
        assert_eq!(b.used(), 0);
    }

    #[test]
    fn a_grown_reservation_stays_under_capacity_and_releases_everything() {
        let b = MemoryBudget::new(1000, 0.7, 0.9, 0.6);
        let push = b.try_reserve(800).unwrap();
        let mut copies = push.empty_like();
        assert_eq!(b.used(), 800);
        assert!(copies.try_grow(150), "past busy (900) but under capacity: a copy may");
        assert!(!b.is_paused(), "growing never pauses the budget");
        assert!(!copies.try_grow(51), "past the capacity");
        assert_eq!((copies.bytes(), b.used()), (150, 950));
        drop(push);
        assert_eq!(b.used(), 150);
        drop(copies);
        assert_eq!(b.used(), 0);
        assert_eq!(b.peak(), 950);
    }

    #[test]
    fn never_exceeds_capacity() {
        let b = MemoryBudget::new(100, 0.7, 0.9, 0.6);
        assert!(b.try_reserve(101).is_none());
        let r = b.try_reserve(100).unwrap(); // alone in an empty budget
        assert!(b.try_reserve(1).is_none());
        drop(r);
    }
}
