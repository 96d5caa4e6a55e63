//! Read-only snapshots of what the core holds, for operators (the status API): values, not
//! state, so their fields are open.

use std::time::{Duration, Instant};

use serde::Serialize;

use super::shuffle::Lifecycle;

/// One shuffle as it stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ShuffleReport {
    /// The shuffle's number within its application.
    pub shuffle_id: u32,
    /// Where it is in its life.
    pub state: Lifecycle,
    /// Maps it was registered with, and how many of them sent `MapperEnd` here.
    pub maps: u32,
    /// Maps that ended here (at least one attempt's `MapperEnd`).
    pub maps_ended: u32,
    /// Partitions it was registered with.
    pub partitions: u32,
    /// Partitions that lost data (their readers get `DATA_LOST`).
    pub lost_partitions: u32,
    /// Bytes waiting in memory, not yet handed to a flusher.
    pub buffered_bytes: u64,
    /// Bytes written to its files (page padding excluded), wherever they are now.
    pub stored_bytes: u64,
    /// Of `stored_bytes`, those moved to the object store.
    pub offloaded_bytes: u64,
    /// Chunks in its index.
    pub chunks: u64,
    /// Flushes handed out and not yet written.
    pub flushes_in_flight: u64,
}

/// One application as it stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AppReport {
    /// The application's id.
    pub app_id: String,
    /// How long ago it was last heard from, in milliseconds.
    pub idle_ms: u64,
    /// Its shuffles, by number.
    pub shuffles: Vec<ShuffleReport>,
}

/// Milliseconds from `then` to `now` (0 when `then` is later).
pub(super) fn idle_ms(now: Instant, then: Instant) -> u64 {
    let idle: Duration = now.saturating_duration_since(then);
    idle.as_millis().min(u64::MAX as u128) as u64
}
