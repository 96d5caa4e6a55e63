//! Server and client transport settings: one serde struct each, `#[serde(default)]`, units in
//! the field names, and a `validate()` that says what is wrong.

use serde::Deserialize;
use sluice_proto::{DEFAULT_MAX_FRAME_BYTES, MAX_MAX_FRAME_BYTES, MIN_MAX_FRAME_BYTES};

use crate::error::TransportError;

/// Most iovecs one `writev` may take (Linux `IOV_MAX`).
pub const IOV_MAX: usize = 1024;

/// Settings of the accepting side ([`crate::serve`]).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Connections open at once; the accept loop waits for a free slot beyond this.
    pub max_connections: usize,
    /// Largest frame (bytes, header included) this side accepts; the handshake negotiates
    /// `min(client's, this)`. Range 65 536 ..= 1 GiB.
    pub max_frame_bytes: u32,
    /// Per connection: when the in-memory bytes queued for sending (heads and memory bodies)
    /// exceed this, request handling waits before queueing more responses.
    pub outbound_high_watermark_bytes: usize,
    /// Per connection: waiting producers resume once the queued in-memory bytes fall to this.
    pub outbound_low_watermark_bytes: usize,
    /// Per connection: most file-body frames queued at once (their bodies are not in memory, so
    /// they are bounded by count rather than bytes).
    pub outbound_max_file_frames: usize,
    /// A peer that makes no progress for this long (ms) while we wait on it — a stalled write,
    /// a frame that stops half-way, a handshake that never comes — is dropped. 0 disables it,
    /// except before the handshake completes: that is bounded by 10 s then, so a silent
    /// connection cannot hold a `max_connections` slot forever. A connection idle between
    /// requests is kept (TCP keepalive finds a peer whose host died).
    pub idle_timeout_ms: u64,
    /// Send file bodies with `sendfile(2)` (true) or with `pread` + `write` through a user-space
    /// buffer (false: the baseline, and the automatic fallback when `sendfile` is unavailable).
    pub zero_copy: bool,
    /// Before queueing a file body that is not all in the page cache (`cachestat(2)`), read it
    /// in on tokio's blocking pool, so that `sendfile` (or the copy path's `pread`), which runs
    /// on an async worker, never waits on the disk there. `false` sends cold regions as they are
    /// (the comparison baseline of `sluice bench transport --cold`).
    pub cold_regions_on_blocking_pool: bool,
    /// Cold regions read in at once per listener (the rest wait their turn without holding a
    /// thread): a bound on the disk reads in flight, which a spinning disk wants small. 0: only
    /// tokio's blocking pool (512 threads) bounds them.
    pub max_cold_reads: usize,
    /// The cluster key (at least 16 characters): a client must prove it (the cluster's own
    /// peers) or the credential derived from it for the application it names
    /// (`docs/security.md`). `None` turns authentication off.
    pub secret: Option<String>,
    /// TLS on this listener (`[transport.tls]`); `None`: plain TCP.
    pub tls: Option<crate::tls::TlsServerConfig>,
    /// Set `TCP_NODELAY` on accepted sockets.
    pub tcp_nodelay: bool,
    /// `SO_SNDBUF` for accepted sockets (bytes); `None` keeps the kernel's autotuning.
    pub send_buffer_bytes: Option<usize>,
    /// `SO_RCVBUF` (bytes), set on the listener so accepted sockets inherit it before their
    /// window scale is chosen; `None` keeps the kernel's autotuning.
    pub recv_buffer_bytes: Option<usize>,
    /// Requests of one connection handled at once; the connection stops reading beyond this.
    pub max_inflight_requests_per_connection: usize,
    /// Most frames coalesced into one `writev`; 1 turns batching off (one write per frame).
    pub max_frames_per_write: usize,
    /// Most bytes gathered into one `writev` before it is issued (the first frame always goes).
    pub max_bytes_per_write: usize,
    /// Size of the reusable buffer of the copy path (bytes).
    pub copy_buffer_bytes: usize,
    /// On shutdown, how long (ms) a connection may take to finish its in-flight requests.
    pub shutdown_grace_ms: u64,
    /// Offer host-local reads (`FEATURE_HOST_LOCAL_READS`) in the handshake to peers on this
    /// host that ask for them ([`crate::ConnInfo::peer_on_this_host`]). Not read from the
    /// configuration: the server sets it from its own `host_local_reads`.
    #[serde(skip)]
    pub offer_host_local_reads: bool,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            max_connections: 4096,
            max_frame_bytes: DEFAULT_MAX_FRAME_BYTES,
            outbound_high_watermark_bytes: 8 << 20,
            outbound_low_watermark_bytes: 4 << 20,
            outbound_max_file_frames: 64,
            idle_timeout_ms: 120_000,
            zero_copy: true,
            cold_regions_on_blocking_pool: true,
            max_cold_reads: 16,
            secret: None,
            tls: None,
            tcp_nodelay: true,
            send_buffer_bytes: None,
            recv_buffer_bytes: None,
            max_inflight_requests_per_connection: 64,
            max_frames_per_write: IOV_MAX / 2,
            max_bytes_per_write: 1 << 20,
            copy_buffer_bytes: 256 << 10,
            shutdown_grace_ms: 30_000,
            offer_host_local_reads: false,
        }
    }
}

impl ServerConfig {
    /// Checks every field, naming the first bad one.
    pub fn validate(&self) -> Result<(), TransportError> {
        let bad = |m: String| Err(TransportError::Config(m));
        if self.max_connections == 0 {
            return bad("max_connections must be at least 1".into());
        }
        if let Some(tls) = &self.tls {
            tls.validate()?;
        }
        if let Some(key) = &self.secret {
            let n = key.chars().count();
            if n < crate::secret::CLUSTER_KEY_MIN_CHARS {
                return bad(format!(
                    "secret (the cluster key): {n} characters, need at least {}",
                    crate::secret::CLUSTER_KEY_MIN_CHARS
                ));
            }
        }
        check_frame_bytes(self.max_frame_bytes)?;
        check_watermarks(self.outbound_high_watermark_bytes, self.outbound_low_watermark_bytes)?;
        if self.outbound_max_file_frames == 0 {
            return bad("outbound_max_file_frames must be at least 1".into());
        }
        if self.max_inflight_requests_per_connection == 0 {
            return bad("max_inflight_requests_per_connection must be at least 1".into());
        }
        check_write_limits(self.max_frames_per_write, self.max_bytes_per_write)?;
        if self.copy_buffer_bytes < 4096 {
            return bad(format!("copy_buffer_bytes {} is below 4096", self.copy_buffer_bytes));
        }
        check_buffers(self.send_buffer_bytes, self.recv_buffer_bytes)
    }
}

/// Settings of the connecting side ([`crate::Connection`], [`crate::Pool`]).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClientConfig {
    /// Time (ms) to open the TCP connection and complete the handshake.
    pub connect_timeout_ms: u64,
    /// Time (ms) a request may take, from queueing to its response; 0 means no limit.
    pub request_timeout_ms: u64,
    /// Largest frame (bytes) proposed in the handshake; the server may lower it.
    pub max_frame_bytes: u32,
    /// Connections a [`crate::Pool`] keeps to each peer, used round-robin.
    pub connections_per_peer: usize,
    /// Set `TCP_NODELAY`.
    pub tcp_nodelay: bool,
    /// `SO_SNDBUF` (bytes); `None` keeps the kernel's autotuning.
    pub send_buffer_bytes: Option<usize>,
    /// `SO_RCVBUF` (bytes), set before connecting; `None` keeps the kernel's autotuning.
    pub recv_buffer_bytes: Option<usize>,
    /// Per connection: requests wait before queueing when more in-memory bytes than this are
    /// queued for sending.
    pub outbound_high_watermark_bytes: usize,
    /// Per connection: waiting requests resume once queued bytes fall to this.
    pub outbound_low_watermark_bytes: usize,
    /// First wait (ms) before reconnecting to a peer whose connection failed.
    pub reconnect_backoff_min_ms: u64,
    /// Longest wait (ms) between reconnect attempts (the wait doubles up to this).
    pub reconnect_backoff_max_ms: u64,
    /// Application id sent in the handshake ("" for none).
    pub app_id: String,
    /// The credential this client proves in the handshake when the peer asks: the cluster key
    /// for the cluster's own peers (`app_id` empty), else the application's credential
    /// ([`crate::app_credential`]). Never sent itself. "" for none.
    pub secret: String,
    /// TLS to the servers (`None`: plain TCP).
    pub tls: Option<crate::tls::TlsClientConfig>,
    /// Most frames coalesced into one `writev`; 1 turns batching off.
    pub max_frames_per_write: usize,
    /// Most bytes gathered into one `writev` before it is issued.
    pub max_bytes_per_write: usize,
    /// A server that makes no progress on a frame or our writes for this long (ms) is dropped;
    /// 0 disables it.
    pub idle_timeout_ms: u64,
    /// Ask servers for host-local reads in the handshake (`FEATURE_HOST_LOCAL_READS`): a server
    /// on this host that offers them names chunks' files, which readers then read themselves.
    pub host_local_reads: bool,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            connect_timeout_ms: 10_000,
            request_timeout_ms: 120_000,
            max_frame_bytes: DEFAULT_MAX_FRAME_BYTES,
            connections_per_peer: 2,
            tcp_nodelay: true,
            send_buffer_bytes: None,
            recv_buffer_bytes: None,
            outbound_high_watermark_bytes: 8 << 20,
            outbound_low_watermark_bytes: 4 << 20,
            reconnect_backoff_min_ms: 100,
            reconnect_backoff_max_ms: 10_000,
            app_id: String::new(),
            secret: String::new(),
            tls: None,
            max_frames_per_write: IOV_MAX / 2,
            max_bytes_per_write: 1 << 20,
            idle_timeout_ms: 120_000,
            host_local_reads: true,
        }
    }
}

impl ClientConfig {
    /// Checks every field, naming the first bad one.
    pub fn validate(&self) -> Result<(), TransportError> {
        let bad = |m: String| Err(TransportError::Config(m));
        check_frame_bytes(self.max_frame_bytes)?;
        if self.connections_per_peer == 0 {
            return bad("connections_per_peer must be at least 1".into());
        }
        if self.connect_timeout_ms == 0 {
            return bad("connect_timeout_ms must be at least 1".into());
        }
        check_watermarks(self.outbound_high_watermark_bytes, self.outbound_low_watermark_bytes)?;
        if self.reconnect_backoff_min_ms > self.reconnect_backoff_max_ms {
            return bad(format!(
                "reconnect_backoff_min_ms {} exceeds reconnect_backoff_max_ms {}",
                self.reconnect_backoff_min_ms, self.reconnect_backoff_max_ms
            ));
        }
        check_write_limits(self.max_frames_per_write, self.max_bytes_per_write)?;
        check_buffers(self.send_buffer_bytes, self.recv_buffer_bytes)
    }
}

fn check_frame_bytes(v: u32) -> Result<(), TransportError> {
    if !(MIN_MAX_FRAME_BYTES..=MAX_MAX_FRAME_BYTES).contains(&v) {
        return Err(TransportError::Config(format!(
            "max_frame_bytes {v} outside {MIN_MAX_FRAME_BYTES}..={MAX_MAX_FRAME_BYTES}"
        )));
    }
    Ok(())
}

fn check_watermarks(high: usize, low: usize) -> Result<(), TransportError> {
    if high == 0 || low > high {
        return Err(TransportError::Config(format!(
            "outbound watermarks need 0 < low ({low}) <= high ({high})"
        )));
    }
    Ok(())
}

fn check_write_limits(frames: usize, bytes: usize) -> Result<(), TransportError> {
    if frames == 0 || frames > IOV_MAX / 2 {
        return Err(TransportError::Config(format!(
            "max_frames_per_write {frames} outside 1..={}",
            IOV_MAX / 2
        )));
    }
    if bytes == 0 {
        return Err(TransportError::Config("max_bytes_per_write must be at least 1".into()));
    }
    Ok(())
}

fn check_buffers(send: Option<usize>, recv: Option<usize>) -> Result<(), TransportError> {
    for (name, v) in [("send_buffer_bytes", send), ("recv_buffer_bytes", recv)] {
        if let Some(v) = v {
            if !(1024..=(1 << 30)).contains(&v) {
                return Err(TransportError::Config(format!("{name} {v} outside 1024..=1 GiB")));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate() {
        ServerConfig::default().validate().unwrap();
        ClientConfig::default().validate().unwrap();
        assert!(ServerConfig::default().zero_copy);
    }

    #[test]
    fn bad_values_are_named() {
        let c = ServerConfig {
            outbound_low_watermark_bytes: 10,
            outbound_high_watermark_bytes: 5,
            ..Default::default()
        };
        assert!(c.validate().unwrap_err().to_string().contains("watermarks"));
        let c = ClientConfig { max_frame_bytes: 10, ..Default::default() };
        assert!(c.validate().unwrap_err().to_string().contains("max_frame_bytes"));
    }
}
