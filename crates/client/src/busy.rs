//! How many pushes a busy server is sent at once.
//!
//! A server answers `Busy` only after the push's whole body has crossed the network: it cannot
//! skip a frame's body, so it reads the body and throws it away. If every push in flight to a
//! busy server were resent on its own after the back-off, each refusal would cost a body's worth
//! of client CPU, bandwidth and server CPU — and the server, already behind on its flushing,
//! would spend its CPU reading bodies it drops. Measured on `sluice local`
//! (`docs/benchmarks-log.md#holding-pushes`): once such a storm starts it feeds itself, with
//! thousands of refusals and push throughput a third of a calm run's.
//!
//! So a client keeps one [`BusyGate`] per server, shared by all its writers, that works like a
//! congestion window. While the server is calm, pushes pass with one uncontended lock. A `Busy`
//! closes the gate for the back-off the server asked for and shrinks the window to one push:
//! the next push goes alone, as a probe. Each acknowledgement widens the window by one (the
//! window doubles per round trip), until it reaches [`CALM_WINDOW`] and the gate stops counting.
//! A refusal at any width starts over from one. So a server that turns busy again is refused at
//! most a window's worth of pushes, never every push the writers hold. Any other outcome (an
//! error, a lost connection) opens the gate: those are for each push's own retries to handle.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// A window this wide means the server keeps up: the gate stops limiting.
pub(crate) const CALM_WINDOW: u32 = 64;

/// A server's busy state as its pushers saw it.
#[derive(Default)]
struct State {
    /// After a refusal: no push before this time.
    retry_at: Option<Instant>,
    /// Pushes the server may have at once; `None` while it is calm (no limit).
    window: Option<u32>,
    /// Pushes through the gate and not yet answered.
    out: u32,
    /// Back-offs in a row that ended in a refusal (refusals that arrive within a back-off are
    /// one burst: pushes that were in flight together).
    refusals: u32,
    /// Pushes waiting at the gate: a push that is answered signals `changed` only if any.
    waiting: u32,
}

/// One server's gate.
#[derive(Default)]
pub(crate) struct BusyGate {
    state: Mutex<State>,
    /// Signalled when a push is answered while others wait.
    changed: Notify,
}

/// A push's way through its server's gate: report how it was answered, or drop it (a push
/// abandoned unanswered frees its place in the window).
pub(crate) struct Pass {
    gate: Arc<BusyGate>,
}

impl BusyGate {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until a push may be sent. `Err(n)`: the server refused pushes `n` back-offs in a
    /// row, more than `max_refusals`, and its last back-off is not over; the push gives up.
    /// Once it is over, one push goes as a probe again (a server busy for a long spell is not
    /// given up on for good). A calm gate costs one lock.
    pub(crate) async fn enter(self: &Arc<Self>, max_refusals: u32) -> Result<Pass, u32> {
        match self.try_pass(max_refusals, false) {
            Try::Pass(pass) => return Ok(pass),
            Try::GiveUp(n) => return Err(n),
            Try::Wait(_) => {}
        }
        loop {
            // Registered before the state is read again, so no change in between is missed.
            let mut changed = pin!(self.changed.notified());
            changed.as_mut().enable();
            let wake_at = match self.try_pass(max_refusals, true) {
                Try::Pass(pass) => return Ok(pass),
                Try::GiveUp(n) => return Err(n),
                Try::Wait(wake_at) => wake_at,
            };
            // Counted as waiting until woken, or until this future is dropped.
            let _waiting = Waiting(self);
            match wake_at {
                Some(at) => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(at) => {}
                        _ = changed => {}
                    }
                }
                None => changed.await,
            }
        }
    }

    /// Takes a place if the state allows one; with `wait`, a push told to wait is counted as
    /// waiting (a [`Waiting`] undoes that).
    fn try_pass(self: &Arc<Self>, max_refusals: u32, wait: bool) -> Try {
        let mut s = self.state();
        if s.refusals > max_refusals && s.retry_at.is_some_and(|at| Instant::now() < at) {
            return Try::GiveUp(s.refusals);
        }
        let wake_at = match (s.window, s.retry_at) {
            (Some(_), Some(at)) if Instant::now() < at => Some(at),
            (Some(w), _) if s.out >= w => None,
            _ => {
                s.out += 1;
                return Try::Pass(Pass { gate: self.clone() });
            }
        };
        if wait {
            s.waiting += 1;
        }
        Try::Wait(wake_at)
    }
}

impl Pass {
    /// The server answered `Busy`, asking for `backoff`.
    pub(crate) fn refused(self, backoff: Duration) {
        let now = Instant::now();
        let mut s = self.gate.state();
        if s.retry_at.is_none_or(|at| now >= at) {
            s.refusals = s.refusals.saturating_add(1);
        }
        s.retry_at = Some(now + backoff);
        s.window = Some(1);
    }

    /// The server took the push.
    pub(crate) fn acknowledged(self) {
        let mut s = self.gate.state();
        s.refusals = 0;
        s.retry_at = None;
        s.window = s.window.map(|w| w + 1).filter(|&w| w < CALM_WINDOW);
    }

    /// The push failed otherwise: the server is not refusing pushes for being busy.
    pub(crate) fn failed(self) {
        let mut s = self.gate.state();
        s.refusals = 0;
        s.retry_at = None;
        s.window = None;
    }
}

impl Drop for Pass {
    fn drop(&mut self) {
        let waiting = {
            let mut s = self.gate.state();
            s.out -= 1;
            s.waiting
        };
        if waiting > 0 {
            self.gate.changed.notify_waiters();
        }
    }
}

/// What [`BusyGate::try_pass`] found.
enum Try {
    Pass(Pass),
    /// Wait for a change, and until this time if `Some`.
    Wait(Option<Instant>),
    /// The refusals in a row, over the bound.
    GiveUp(u32),
}

/// One push counted in [`State::waiting`].
struct Waiting<'a>(&'a BusyGate);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.state().waiting -= 1;
    }
}

/// A client's gates, one per server address.
#[derive(Default)]
pub(crate) struct BusyGates(Mutex<HashMap<SocketAddr, Arc<BusyGate>>>);

impl BusyGates {
    pub(crate) fn get(&self, addr: SocketAddr) -> Arc<BusyGate> {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        map.entry(addr).or_default().clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BACKOFF: Duration = Duration::from_millis(50);

    /// Starts `n` pushes at the gate; each ends with its pass.
    fn waiters(g: &Arc<BusyGate>, n: usize) -> Vec<tokio::task::JoinHandle<Pass>> {
        (0..n)
            .map(|_| {
                let g = g.clone();
                tokio::spawn(async move { g.enter(1000).await.unwrap() })
            })
            .collect()
    }

    /// `n` passes through a calm gate.
    async fn passes(g: &Arc<BusyGate>, n: usize) -> Vec<Pass> {
        let mut out = Vec::new();
        for _ in 0..n {
            out.push(g.enter(3).await.unwrap());
        }
        out
    }

    async fn settle() {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_calm_gate_does_not_limit() {
        let g = Arc::new(BusyGate::default());
        for p in passes(&g, 200).await {
            p.acknowledged();
        }
        assert!(g.state().window.is_none());
        assert_eq!(g.state().out, 0);
        assert_eq!(g.state().waiting, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn after_a_refusal_one_push_after_the_backoff_then_a_growing_window() {
        let g = Arc::new(BusyGate::default());
        let t0 = Instant::now();
        g.enter(3).await.unwrap().refused(BACKOFF);
        let probe = g.enter(3).await.unwrap();
        assert!(t0.elapsed() >= BACKOFF, "the probe waited out the back-off");
        let queued = waiters(&g, 5);
        settle().await;
        assert!(queued.iter().all(|w| !w.is_finished()), "a push went out beside the probe");
        // The probe is taken: the window is two, and one of the queued goes (the probe's place
        // is free again, and one more).
        probe.acknowledged();
        settle().await;
        assert_eq!(queued.iter().filter(|w| w.is_finished()).count(), 2);
        assert_eq!(g.state().out, 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_refusal_at_any_width_starts_over_from_one() {
        let g = Arc::new(BusyGate::default());
        g.enter(3).await.unwrap().refused(BACKOFF);
        for _ in 0..10 {
            g.enter(3).await.unwrap().acknowledged();
        }
        assert_eq!(g.state().window, Some(11));
        g.enter(3).await.unwrap().refused(BACKOFF);
        assert_eq!(g.state().window, Some(1));
        let queued = waiters(&g, 3);
        tokio::time::sleep(BACKOFF).await;
        settle().await;
        assert_eq!(queued.iter().filter(|w| w.is_finished()).count(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn the_window_grows_back_to_calm() {
        let g = Arc::new(BusyGate::default());
        g.enter(3).await.unwrap().refused(BACKOFF);
        for _ in 0..CALM_WINDOW {
            g.enter(3).await.unwrap().acknowledged();
        }
        assert!(g.state().window.is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_failure_opens_the_gate_and_an_abandoned_push_frees_its_place() {
        let g = Arc::new(BusyGate::default());
        g.enter(3).await.unwrap().refused(BACKOFF);
        let probe = g.enter(3).await.unwrap();
        let queued = waiters(&g, 1);
        settle().await;
        assert!(!queued[0].is_finished());
        drop(probe); // abandoned: its place is free, the window stays one
        settle().await;
        assert!(queued[0].is_finished());
        assert_eq!(g.state().window, Some(1));
        let second = waiters(&g, 1);
        settle().await;
        assert!(!second[0].is_finished());
        let first = queued.into_iter().next().unwrap().await.unwrap();
        first.failed();
        settle().await;
        assert!(g.state().window.is_none());
        assert!(second[0].is_finished());
    }

    #[tokio::test(start_paused = true)]
    async fn refusals_within_a_backoff_are_one_and_too_many_in_a_row_fail_the_push() {
        let g = Arc::new(BusyGate::default());
        // A burst of pushes in flight together, refused together: one refusal.
        for p in passes(&g, 10).await {
            p.refused(BACKOFF);
        }
        assert_eq!(g.state().refusals, 1);
        for _ in 0..3 {
            g.enter(3).await.unwrap().refused(BACKOFF);
        }
        assert_eq!(g.enter(3).await.err(), Some(4));
        // The back-off over, a push goes as a probe again; taken, the gate is calm.
        tokio::time::sleep(BACKOFF * 2).await;
        let probe = tokio::time::timeout(BACKOFF * 10, g.enter(3)).await;
        probe.expect("the probe waits no longer than a back-off").unwrap().acknowledged();
        assert_eq!(g.state().refusals, 0);
        g.enter(3).await.unwrap();
    }
}
