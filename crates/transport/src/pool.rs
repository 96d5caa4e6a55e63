//! A pool of connections per peer, in the manner of Spark's `TransportClientFactory`: N
//! connections to each server, opened lazily, used round-robin, and a broken one replaced —
//! with an exponential backoff between failed attempts so a dead server is not hammered.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::client::Connection;
use crate::config::ClientConfig;
use crate::error::TransportError;
use crate::stats::TransportStats;

#[derive(Default)]
struct Slot {
    conn: Option<Arc<Connection>>,
    /// Failed connection attempts in a row.
    failures: u32,
    /// No new attempt before this.
    retry_at: Option<Instant>,
}

struct Peer {
    /// An async mutex per slot: a caller that finds its slot empty connects while holding it,
    /// and concurrent callers of the same slot wait for that connection instead of opening
    /// their own.
    slots: Vec<tokio::sync::Mutex<Slot>>,
    next: AtomicUsize,
}

/// Connections to many peers, `connections_per_peer` each.
pub struct Pool {
    cfg: ClientConfig,
    stats: Arc<TransportStats>,
    peers: Mutex<HashMap<SocketAddr, Arc<Peer>>>,
}

impl Pool {
    /// An empty pool; connections open on first use.
    pub fn new(cfg: ClientConfig) -> Self {
        Self::with_stats(cfg, Arc::new(TransportStats::default()))
    }

    /// A pool counting into `stats`.
    pub fn with_stats(cfg: ClientConfig, stats: Arc<TransportStats>) -> Self {
        Pool { cfg, stats, peers: Mutex::new(HashMap::new()) }
    }

    /// The pool's counters.
    pub fn stats(&self) -> &Arc<TransportStats> {
        &self.stats
    }

    fn peer(&self, addr: SocketAddr) -> Arc<Peer> {
        let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        let n = self.cfg.connections_per_peer.max(1);
        peers
            .entry(addr)
            .or_insert_with(|| {
                let slots = (0..n).map(|_| tokio::sync::Mutex::new(Slot::default())).collect();
                Arc::new(Peer { slots, next: AtomicUsize::new(0) })
            })
            .clone()
    }

    /// A live connection to `addr`: the next slot's, opened (or replaced) if needed. When that
    /// slot is backing off after failures, another live connection to the peer is used if there
    /// is one; otherwise the call fails at once with a retriable `Connect` error.
    pub async fn get(&self, addr: SocketAddr) -> Result<Arc<Connection>, TransportError> {
        let peer = self.peer(addr);
        let n = peer.slots.len();
        let idx = peer.next.fetch_add(1, Relaxed) % n;
        let mut slot = peer.slots[idx].lock().await;
        if let Some(c) = &slot.conn {
            if !c.is_closed() {
                return Ok(c.clone());
            }
            slot.conn = None;
        }
        if let Some(at) = slot.retry_at {
            if at > Instant::now() {
                for (i, other) in peer.slots.iter().enumerate() {
                    if i == idx {
                        continue;
                    }
                    if let Ok(s) = other.try_lock() {
                        if let Some(c) = s.conn.as_ref().filter(|c| !c.is_closed()) {
                            return Ok(c.clone());
                        }
                    }
                }
                // Fail now rather than sleep out the backoff holding this slot: callers keep
                // their own bounded retries, and a dead peer must not queue every caller behind
                // every other caller's backoff.
                let wait_ms = at.saturating_duration_since(Instant::now()).as_millis();
                return Err(TransportError::Connect {
                    addr,
                    source: std::io::Error::new(
                        std::io::ErrorKind::ConnectionRefused,
                        format!("peer unreachable; next reconnect attempt in {wait_ms} ms"),
                    ),
                });
            }
        }
        match Connection::connect_with_stats(addr, &self.cfg, self.stats.clone()).await {
            Ok(c) => {
                let c = Arc::new(c);
                slot.conn = Some(c.clone());
                slot.failures = 0;
                slot.retry_at = None;
                Ok(c)
            }
            Err(e) => {
                slot.failures = slot.failures.saturating_add(1);
                let wait = backoff(&self.cfg, slot.failures);
                tracing::debug!(%addr, failures = slot.failures, wait_ms = wait.as_millis() as u64, error = %e, "connect failed");
                slot.retry_at = Some(Instant::now() + wait);
                Err(e)
            }
        }
    }

    /// Closes and forgets every connection to `addr` (e.g. a server known to be gone).
    pub fn remove(&self, addr: SocketAddr) {
        self.peers.lock().unwrap_or_else(|e| e.into_inner()).remove(&addr);
    }
}

/// `min · 2^(failures-1)`, capped at `max`.
fn backoff(cfg: &ClientConfig, failures: u32) -> Duration {
    let shift = failures.saturating_sub(1).min(20);
    let ms =
        cfg.reconnect_backoff_min_ms.saturating_mul(1 << shift).min(cfg.reconnect_backoff_max_ms);
    Duration::from_millis(ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_the_cap() {
        let cfg = ClientConfig {
            reconnect_backoff_min_ms: 100,
            reconnect_backoff_max_ms: 1000,
            ..Default::default()
        };
        let ms: Vec<u64> = (1..=6).map(|f| backoff(&cfg, f).as_millis() as u64).collect();
        assert_eq!(ms, vec![100, 200, 400, 800, 1000, 1000]);
    }
}
