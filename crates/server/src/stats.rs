//! Server counters, exported as Prometheus text (`sluice_server_<what>_<unit>`).

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

/// Monotonic counters of a server.
#[derive(Debug, Default)]
pub struct Stats {
    pub push_requests: AtomicU64,
    pub pushed_bytes: AtomicU64,
    pub busy_replies: AtomicU64,
    /// Pushes answered `PushSplit`: stored, and some partition of theirs moves on to a new part.
    pub split_replies: AtomicU64,
    /// Pushes that found no memory and were held unread (`busy_hold_ms`), and for how long in
    /// all, in microseconds.
    pub pushes_held: AtomicU64,
    pub push_hold_us: AtomicU64,
    pub flushed_bytes: AtomicU64,
    /// Flush plans carried out, and the time they took in all (writes, retries and moves), in
    /// microseconds: their ratio is the average flush latency.
    pub flushes: AtomicU64,
    pub flush_us: AtomicU64,
    pub commits: AtomicU64,
    /// Time commits spent flushing and waiting for the flushers, in microseconds.
    pub commit_wait_us: AtomicU64,
    /// Time commits spent making their data and commit record durable, in microseconds.
    pub commit_sync_us: AtomicU64,
    /// Committed shuffles read back at start.
    pub recovered_shuffles: AtomicU64,
    /// Partitions (and whole shuffles with an unreadable record) found lost at start.
    pub recovered_lost: AtomicU64,
    pub streams_opened: AtomicU64,
    pub fetched_chunks: AtomicU64,
    pub fetched_bytes: AtomicU64,
    /// Chunks answered as regions of a local file (host-local reads), and their bytes: the
    /// reader read them itself (not in `fetched_*`).
    pub local_chunks: AtomicU64,
    pub local_bytes: AtomicU64,
    pub errors: AtomicU64,
    pub apps_expired: AtomicU64,
    /// Partitions moved to the object store, and their bytes (files as uploaded, page padding
    /// included).
    pub offloaded_partitions: AtomicU64,
    pub offloaded_bytes: AtomicU64,
    /// Partition moves that failed (the partition stays on its local disk).
    pub offload_failures: AtomicU64,
    /// Chunk bytes read back from the object store for readers.
    pub store_read_bytes: AtomicU64,
    /// Calls to the object store that failed (uploads, reads, deletions).
    pub store_errors: AtomicU64,
}

impl Stats {
    /// `(metric name, value)` for every counter.
    pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        vec![
            ("sluice_server_push_requests_total", g(&self.push_requests)),
            ("sluice_server_pushed_bytes_total", g(&self.pushed_bytes)),
            ("sluice_server_busy_replies_total", g(&self.busy_replies)),
            ("sluice_server_split_replies_total", g(&self.split_replies)),
            ("sluice_server_pushes_held_total", g(&self.pushes_held)),
            ("sluice_server_push_hold_microseconds_total", g(&self.push_hold_us)),
            ("sluice_server_flushed_bytes_total", g(&self.flushed_bytes)),
            ("sluice_server_flushes_total", g(&self.flushes)),
            ("sluice_server_flush_microseconds_total", g(&self.flush_us)),
            ("sluice_server_commits_total", g(&self.commits)),
            ("sluice_server_commit_wait_microseconds_total", g(&self.commit_wait_us)),
            ("sluice_server_commit_sync_microseconds_total", g(&self.commit_sync_us)),
            ("sluice_server_recovered_shuffles_total", g(&self.recovered_shuffles)),
            ("sluice_server_recovered_lost_total", g(&self.recovered_lost)),
            ("sluice_server_streams_opened_total", g(&self.streams_opened)),
            ("sluice_server_fetched_chunks_total", g(&self.fetched_chunks)),
            ("sluice_server_fetched_bytes_total", g(&self.fetched_bytes)),
            ("sluice_server_local_read_chunks_total", g(&self.local_chunks)),
            ("sluice_server_local_read_bytes_total", g(&self.local_bytes)),
            ("sluice_server_request_errors_total", g(&self.errors)),
            ("sluice_server_apps_expired_total", g(&self.apps_expired)),
            ("sluice_server_offloaded_partitions_total", g(&self.offloaded_partitions)),
            ("sluice_server_offloaded_bytes_total", g(&self.offloaded_bytes)),
            ("sluice_server_offload_failures_total", g(&self.offload_failures)),
            ("sluice_server_object_store_read_bytes_total", g(&self.store_read_bytes)),
            ("sluice_server_object_store_errors_total", g(&self.store_errors)),
        ]
    }

    /// Appends a gauge with one series per `(label value, value)`, the value escaped as the
    /// text format wants (`\\`, `\"`, `\n`).
    pub fn labelled(out: &mut String, name: &str, label: &str, series: &[(String, u64)]) {
        let _ = writeln!(out, "# TYPE {name} gauge");
        for (value, v) in series {
            let escaped = value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n");
            let _ = writeln!(out, "{name}{{{label}=\"{escaped}\"}} {v}");
        }
    }

    /// Prometheus text exposition of the counters plus `extra` gauges.
    pub fn prometheus(&self, extra: &[(&str, u64)]) -> String {
        let mut out = String::new();
        for (name, v) in self.snapshot().into_iter().chain(extra.iter().copied()) {
            let kind = if name.ends_with("_total") { "counter" } else { "gauge" };
            let _ = writeln!(out, "# TYPE {name} {kind}\n{name} {v}");
        }
        out
    }
}
