//! Transport counters: atomics bumped on the hot path, read with [`TransportStats::snapshot`].

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use serde::Serialize;

macro_rules! stats {
    ($($(#[$doc:meta])* $name:ident,)*) => {
        /// Counters and gauges of one transport (a server or a client side). Shared by every
        /// connection through an `Arc`; `Relaxed` atomics, as each is independent.
        #[derive(Debug, Default)]
        pub struct TransportStats { $($(#[$doc])* pub $name: AtomicU64,)* }

        /// A plain copy of [`TransportStats`] at one moment.
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
        pub struct StatsSnapshot { $($(#[$doc])* pub $name: u64,)* }

        impl TransportStats {
            /// Reads every counter (each one atomically; the set is not one instant).
            pub fn snapshot(&self) -> StatsSnapshot {
                StatsSnapshot { $($name: self.$name.load(Relaxed),)* }
            }
        }
    };
}

stats! {
    /// File-body bytes sent with `sendfile`.
    sendfile_bytes,
    /// `sendfile` calls that moved at least one byte.
    sendfile_calls,
    /// Bytes (heads and memory bodies) sent with `writev`.
    writev_bytes,
    /// `writev` calls that moved at least one byte.
    writev_calls,
    /// Frames whose head went out with `writev` (with its memory body, if any).
    writev_frames,
    /// File-body bytes sent through the copy path (`pread` + `write`).
    copy_bytes,
    /// Bytes written through TLS in user space (rustls encrypting them), all kinds.
    tls_bytes,
    /// File-body bytes read into a buffer and encrypted in user space because the connection
    /// is TLS without kTLS (they would have gone out with `sendfile` on a plain connection).
    tls_file_bytes,
    /// TLS connections whose bytes rustls encrypts in user space (no kTLS).
    tls_connections_user_space,
    /// TLS connections whose keys went to the kernel (kTLS): file bodies go out with
    /// `sendfile` (counted in `sendfile_bytes`), the kernel encrypting them.
    ktls_connections,
    /// TLS connections kept in user space instead of kTLS: kTLS off in the configuration, or the
    /// kernel lacking it or the negotiated cipher (decided before the keys leave rustls).
    ktls_fallbacks,
    /// kTLS hand-offs that failed after the keys had left rustls (the socket broke while
    /// draining, or the kernel refused what its probe accepted): that connection was closed.
    ktls_failures,
    /// TLS handshakes that failed (a plain-text client, an untrusted or expired certificate, a
    /// client without the certificate mTLS asks for).
    tls_handshakes_failed,
    /// Times `sendfile` was unavailable (EINVAL/ENOSYS/EOPNOTSUPP) and the copy path took over.
    sendfile_fallbacks,
    /// Connections accepted (server) or opened (client).
    connections_accepted,
    /// Connections open now (gauge).
    connections_open,
    /// Handshakes refused (version, auth, bad first frame).
    handshakes_failed,
    /// Requests refused with `UNAUTHORIZED`: they named another application than the one the
    /// connection is authenticated for, or asked a cluster-only thing of an application's.
    requests_unauthorized,
    /// Frames received.
    frames_received,
    /// Frames closed by a fatal protocol error from the peer.
    protocol_errors,
    /// Request bodies discarded after `Admission::Reject` (or a `Later` that rejected).
    bodies_rejected,
    /// File bodies not wholly in the page cache when queued, read in on the blocking pool first
    /// (so `sendfile` on an async worker does not wait on the disk).
    file_regions_cold,
    /// Bytes of those regions.
    file_regions_cold_bytes,
    /// Cold regions being read in now (gauge).
    file_regions_cold_reading,
    /// Highest `file_regions_cold_reading` seen so far (bounded by `max_cold_reads`).
    file_regions_cold_reading_peak,
    /// File bodies answered with `DATA_LOST` because the file was shorter than the region.
    file_regions_truncated,
    /// Connections dropped because the peer made no progress for the idle timeout.
    connections_stalled,
    /// In-memory bytes queued for sending, all connections together (gauge).
    outbound_queued_bytes,
    /// Highest `outbound_queued_bytes` of a single connection seen so far.
    outbound_queued_bytes_peak,
    /// File-body frames queued for sending, all connections together (gauge).
    outbound_queued_file_frames,
    /// Times a producer had to wait at the high watermark.
    outbound_waits,
}

impl TransportStats {
    pub(crate) fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Relaxed);
    }

    pub(crate) fn sub(c: &AtomicU64, n: u64) {
        c.fetch_sub(n, Relaxed);
    }

    /// Raises a high-water gauge; a plain load first, as it rarely moves.
    pub(crate) fn max(c: &AtomicU64, n: u64) {
        if n > c.load(Relaxed) {
            c.fetch_max(n, Relaxed);
        }
    }
}
