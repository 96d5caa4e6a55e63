//! The connecting side: one handshaked [`Connection`] multiplexes many requests by request id.
//! A writer task sends (the same writer as the server's: `writev`, `sendfile`, watermarks), a
//! reader task matches responses to the pending table, and when the connection is lost every
//! pending request fails at once.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use sluice_proto::message::{
    AuthProof, Handshake, Pong, FEATURE_CRC32C, FEATURE_HOST_LOCAL_READS, MAGIC, PROTOCOL_VERSION,
};
use sluice_proto::{
    encode_frame, ErrorCode, Message, HANDSHAKE_MAX_FRAME_BYTES, MIN_MAX_FRAME_BYTES,
};
use tokio::io::AsyncRead;
use tokio::net::TcpSocket;
use tokio::sync::oneshot;
use tokio::task::AbortHandle;
use tracing::Instrument;

use crate::body::Body;
use crate::codec::FrameReader;
use crate::config::ClientConfig;
use crate::error::TransportError;
use crate::outbound::{millis, OutFrame, Outbound, WriterOptions};
use crate::secret::{handshake_proof, nonce};
use crate::socket::configure;
use crate::stats::TransportStats;
use crate::stream::{Sink, TlsStream};

/// A response: any message but `Error` (which becomes [`TransportError::Remote`]); `Busy` and
/// the like are replies too.
#[derive(Debug, Clone)]
pub struct Reply {
    /// The decoded response message.
    pub message: Message,
    /// The response body (a fetched chunk's bytes); empty when the message has none.
    pub body: Bytes,
}

type Waiter = oneshot::Sender<Result<Reply, TransportError>>;

#[derive(Default)]
struct Pending {
    waiters: HashMap<u32, Waiter>,
    next_id: u32,
    /// Set once: why the connection is closed.
    closed: Option<String>,
}

struct Shared {
    pending: Mutex<Pending>,
    /// Bytes read from the server (from the handshake on, a body's bytes as they arrive): a
    /// request that times out with this unchanged since it was sent heard nothing at all from
    /// the server meanwhile, the sign of a dead peer rather than a slow request or a long body.
    bytes_received: Arc<AtomicU64>,
}

/// A read half that counts the bytes read through it (see [`Shared::bytes_received`]).
struct CountingRead<R> {
    inner: R,
    count: Arc<AtomicU64>,
}

impl<R: AsyncRead + Unpin> AsyncRead for CountingRead<R> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = std::pin::Pin::new(&mut self.inner).poll_read(cx, buf);
        if let std::task::Poll::Ready(Ok(())) = &polled {
            self.count.fetch_add((buf.filled().len() - before) as u64, Relaxed);
        }
        polled
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn register(
        &self,
    ) -> Result<(u32, oneshot::Receiver<Result<Reply, TransportError>>), TransportError> {
        let mut p = self.lock();
        if let Some(reason) = &p.closed {
            return Err(TransportError::Closed(reason.clone()));
        }
        // A wrapping counter, skipping ids still in flight.
        let mut id = p.next_id;
        while p.waiters.contains_key(&id) {
            id = id.wrapping_add(1);
        }
        p.next_id = id.wrapping_add(1);
        let (tx, rx) = oneshot::channel();
        p.waiters.insert(id, tx);
        Ok((id, rx))
    }

    /// Marks the connection closed and fails every pending request with `reason`.
    fn fail_all(&self, reason: String) {
        let waiters = {
            let mut p = self.lock();
            if p.closed.is_none() {
                p.closed = Some(reason);
            }
            std::mem::take(&mut p.waiters)
        };
        let reason = self.lock().closed.clone().unwrap_or_default();
        for (_, w) in waiters {
            let _ = w.send(Err(TransportError::Closed(reason.clone())));
        }
    }
}

/// Removes a request's pending entry if the request is dropped (timed out or cancelled).
struct PendingGuard<'a> {
    shared: &'a Shared,
    id: u32,
    armed: bool,
}

impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.shared.lock().waiters.remove(&self.id);
        }
    }
}

/// One handshaked connection to a server.
pub struct Connection {
    shared: Arc<Shared>,
    outbound: Outbound,
    reader: AbortHandle,
    peer: SocketAddr,
    max_frame_bytes: u32,
    /// The feature bits the handshake settled on.
    features: u64,
    /// This end's address.
    local: Option<SocketAddr>,
    request_timeout: Option<Duration>,
    stats: Arc<TransportStats>,
}

impl Connection {
    /// Connects to `addr` and completes the handshake, within `connect_timeout_ms`.
    pub async fn connect(
        addr: SocketAddr,
        cfg: &ClientConfig,
    ) -> Result<Connection, TransportError> {
        Self::connect_with_stats(addr, cfg, Arc::new(TransportStats::default())).await
    }

    /// [`Connection::connect`], counting into `stats` (shared, e.g., by a [`crate::Pool`]).
    pub async fn connect_with_stats(
        addr: SocketAddr,
        cfg: &ClientConfig,
        stats: Arc<TransportStats>,
    ) -> Result<Connection, TransportError> {
        cfg.validate()?;
        let t = Duration::from_millis(cfg.connect_timeout_ms);
        match tokio::time::timeout(t, Self::open(addr, cfg, stats)).await {
            Ok(r) => r,
            Err(_) => Err(TransportError::Timeout {
                what: "connect and handshake",
                after_ms: cfg.connect_timeout_ms,
            }),
        }
    }

    async fn open(
        addr: SocketAddr,
        cfg: &ClientConfig,
        stats: Arc<TransportStats>,
    ) -> Result<Connection, TransportError> {
        let connect_err = |source| TransportError::Connect { addr, source };
        let socket = if addr.is_ipv4() { TcpSocket::new_v4() } else { TcpSocket::new_v6() }
            .map_err(connect_err)?;
        // Buffer sizes before connect, so the window scale of the SYN matches them.
        if let Some(n) = cfg.send_buffer_bytes {
            socket
                .set_send_buffer_size(u32::try_from(n).unwrap_or(u32::MAX))
                .map_err(connect_err)?;
        }
        if let Some(n) = cfg.recv_buffer_bytes {
            socket
                .set_recv_buffer_size(u32::try_from(n).unwrap_or(u32::MAX))
                .map_err(connect_err)?;
        }
        let stream = socket.connect(addr).await.map_err(connect_err)?;
        configure(&stream, cfg.tcp_nodelay, None, None)?;
        let local = stream.local_addr().ok();
        let idle = millis(cfg.idle_timeout_ms);
        let (rd, mut wr): (Box<dyn AsyncRead + Send + Unpin>, Sink) = match &cfg.tls {
            None => {
                let (rd, wr) = stream.into_split();
                (Box::new(rd), Sink::Plain(wr))
            }
            Some(tls) => {
                let connector = tokio_rustls::TlsConnector::from(tls.load()?);
                let name = tls.server_name(addr)?;
                let limit = Duration::from_millis(cfg.connect_timeout_ms);
                let s = match tokio::time::timeout(limit, connector.connect(name, stream)).await {
                    Ok(Ok(s)) => s,
                    Ok(Err(e)) => {
                        return Err(TransportError::Closed(format!(
                            "TLS handshake with {addr} failed: {e}"
                        )))
                    }
                    Err(_) => {
                        return Err(TransportError::Timeout {
                            what: "TLS handshake",
                            after_ms: cfg.connect_timeout_ms,
                        })
                    }
                };
                let (rd, wr) = tokio::io::split(TlsStream::Client(s));
                (Box::new(rd), Sink::Tls(Box::new(wr)))
            }
        };

        let client_nonce = nonce();
        let hs = Handshake {
            magic: MAGIC,
            version: PROTOCOL_VERSION,
            features: FEATURE_CRC32C
                | if cfg.host_local_reads { FEATURE_HOST_LOCAL_READS } else { 0 },
            max_frame_bytes: cfg.max_frame_bytes,
            app_id: cfg.app_id.clone(),
            client_nonce: client_nonce.clone(),
        };
        wr.write_all_flush(&encode_frame(0, &Message::Handshake(hs), &[])).await?;
        let bytes_received = Arc::new(AtomicU64::new(0));
        let rd = CountingRead { inner: rd, count: bytes_received.clone() };
        let mut reader = FrameReader::new(rd, HANDSHAKE_MAX_FRAME_BYTES, idle);
        let mut reply = match reader.read_head().await {
            Err(TransportError::Proto(_)) if reader.front_looks_like_tls() => {
                return Err(TransportError::Config(format!(
                    "{addr} answered with TLS: set the client's tls settings (transport.tls)"
                )))
            }
            r => r?,
        };
        if let Some((_, Message::AuthChallenge(c))) = &reply {
            // The server has authentication on: prove the credential without sending it.
            if cfg.secret.is_empty() {
                return Err(TransportError::Config(format!(
                    "{addr} requires authentication and no credential is configured \
                     (transport.secret)"
                )));
            }
            let proof = handshake_proof(&cfg.secret, &cfg.app_id, &c.server_nonce, &client_nonce);
            let frame = encode_frame(1, &Message::AuthProof(AuthProof { proof }), &[]);
            wr.write_all_flush(&frame).await?;
            reply = reader.read_head().await?;
        }
        let (max_frame_bytes, features) = match reply {
            Some((_, Message::HandshakeOk(ok))) => {
                if !(MIN_MAX_FRAME_BYTES..=cfg.max_frame_bytes).contains(&ok.max_frame_bytes) {
                    return Err(TransportError::Violation(format!(
                        "server chose max_frame_bytes {} outside {MIN_MAX_FRAME_BYTES}..={}",
                        ok.max_frame_bytes, cfg.max_frame_bytes
                    )));
                }
                (ok.max_frame_bytes, ok.features)
            }
            Some((_, Message::Error(e))) => return Err(remote(e)),
            Some((_, other)) => {
                return Err(TransportError::Violation(format!(
                    "{} in reply to a Handshake",
                    other.msg_type().name()
                )))
            }
            None => {
                return Err(TransportError::Closed(
                    "server closed the connection during the handshake".into(),
                ))
            }
        };
        reader.max_frame_bytes = max_frame_bytes;
        TransportStats::add(&stats.connections_accepted, 1);
        TransportStats::add(&stats.connections_open, 1);

        let shared = Arc::new(Shared { pending: Mutex::new(Pending::default()), bytes_received });
        let (outbound, writer) = Outbound::start(wr, WriterOptions::from(cfg), stats.clone());
        let span = tracing::info_span!("client_conn", %addr);
        let reader_task = tokio::spawn(
            read_loop(reader, shared.clone(), outbound.clone(), stats.clone())
                .instrument(span.clone()),
        );
        let reader_abort = reader_task.abort_handle();
        let reader_abort_on_drop = reader_task.abort_handle();
        let (s, st) = (shared.clone(), stats.clone());
        tokio::spawn(
            async move {
                // Whichever of reader and writer ends first ends the connection.
                let reason = tokio::select! {
                    w = writer => match w {
                        Ok(Ok(())) => "connection closed".to_string(),
                        Ok(Err(e)) => format!("write failed: {e}"),
                        Err(e) => format!("writer task: {e}"),
                    },
                    r = reader_task => match r {
                        Ok(reason) => reason,
                        Err(e) => format!("reader task: {e}"),
                    },
                };
                tracing::debug!(%reason, "connection ended");
                reader_abort.abort();
                s.fail_all(reason);
                TransportStats::sub(&st.connections_open, 1);
            }
            .instrument(span),
        );
        Ok(Connection {
            shared,
            outbound,
            reader: reader_abort_on_drop,
            peer: addr,
            max_frame_bytes,
            features,
            local,
            request_timeout: millis(cfg.request_timeout_ms),
            stats,
        })
    }

    /// Sends a request and waits for its response, within `request_timeout_ms` (counted from
    /// the call, so time spent waiting at the outbound watermark counts too). An `Error`
    /// response is `Err(Remote)`.
    ///
    /// A request that times out while nothing at all came from the server since it was sent
    /// closes the connection: the peer is presumed dead (its host gone without a FIN, a
    /// partition), and a pool would otherwise keep handing out the connection, each request
    /// waiting the whole timeout. Requests still pending on it fail at once with `Closed`
    /// saying why; the pool opens a new connection on the next [`crate::Pool::get`]. A
    /// connection that received any bytes meanwhile (another answer, part of a long body) is
    /// alive and stays.
    pub async fn request(&self, message: Message, body: Body) -> Result<Reply, TransportError> {
        let Some(t) = self.request_timeout else {
            return self.request_inner(message, body).await;
        };
        let heard_before = self.shared.bytes_received.load(Relaxed);
        match tokio::time::timeout(t, self.request_inner(message, body)).await {
            Ok(r) => r,
            Err(_) => {
                let after_ms = t.as_millis() as u64;
                if self.shared.bytes_received.load(Relaxed) == heard_before {
                    self.retire(format!(
                        "{} sent nothing for {after_ms} ms while a request waited \
                         (request_timeout_ms): presumed dead, connection closed",
                        self.peer
                    ));
                }
                Err(TransportError::Timeout { what: "request", after_ms })
            }
        }
    }

    /// Closes the connection for `reason`: every pending request fails with it, new ones are
    /// refused, and the reader stops (the writer ends once its queue is out or stalls).
    fn retire(&self, reason: String) {
        if !self.is_closed() {
            tracing::warn!(peer = %self.peer, %reason, "closing a connection");
        }
        self.shared.fail_all(reason);
        self.outbound.close();
        self.reader.abort();
    }

    async fn request_inner(&self, message: Message, body: Body) -> Result<Reply, TransportError> {
        let (id, rx) = self.shared.register()?;
        let mut guard = PendingGuard { shared: &self.shared, id, armed: true };
        let frame = OutFrame::new(id, &message, body, self.max_frame_bytes)?;
        self.outbound.send(frame).await?;
        let reply = rx.await.map_err(|_| TransportError::Closed("connection dropped".into()))?;
        guard.armed = false;
        reply
    }

    /// Whether the connection is closed (requests on it fail at once).
    pub fn is_closed(&self) -> bool {
        self.shared.lock().closed.is_some() || self.outbound.is_closed()
    }

    /// The server's address.
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// The negotiated frame size limit.
    pub fn max_frame_bytes(&self) -> u32 {
        self.max_frame_bytes
    }

    /// Whether the server offered host-local reads on this connection: it answers
    /// `FetchChunkLocal` with where the chunk is in its files.
    pub fn offers_host_local_reads(&self) -> bool {
        self.features & FEATURE_HOST_LOCAL_READS != 0
    }

    /// Whether the server is on this host, as this end sees it: connected over loopback, or to
    /// this end's own address (a proxy in between could make the server think a remote reader
    /// is local; this side checks too).
    pub fn peer_on_this_host(&self) -> bool {
        let ip = self.peer.ip().to_canonical();
        ip.is_loopback() || self.local.is_some_and(|l| l.ip().to_canonical() == ip)
    }

    /// Counters of this connection (shared with its pool, if any).
    pub fn stats(&self) -> &Arc<TransportStats> {
        &self.stats
    }

    /// Requests waiting for a response.
    pub fn pending_requests(&self) -> usize {
        self.shared.lock().waiters.len()
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        // Queued frames still go out; then the writer ends, which ends the connection.
        self.outbound.close();
        self.reader.abort();
    }
}

fn remote(e: sluice_proto::message::ErrorMsg) -> TransportError {
    let code = ErrorCode::from_u16(e.code).unwrap_or(ErrorCode::Internal);
    TransportError::Remote { code, message: e.message }
}

/// Matches responses to pending requests until the connection ends; returns why it ended.
async fn read_loop(
    mut reader: FrameReader,
    shared: Arc<Shared>,
    outbound: Outbound,
    stats: Arc<TransportStats>,
) -> String {
    let mut fatal: Option<String> = None;
    loop {
        let (h, message) = match reader.read_head().await {
            Ok(Some(x)) => x,
            Ok(None) => {
                return match fatal {
                    Some(f) => format!("server closed the connection after a fatal error: {f}"),
                    None => "server closed the connection".into(),
                }
            }
            Err(e) => return format!("read failed: {e}"),
        };
        let body = match reader.read_body(h.body_len()).await {
            Ok(b) => b,
            Err(e) => return format!("read failed: {e}"),
        };
        TransportStats::add(&stats.frames_received, 1);
        let result = match message {
            Message::Ping(_) => {
                if let Ok(f) = OutFrame::new(
                    h.request_id,
                    &Message::Pong(Pong {}),
                    Body::Empty,
                    reader.max_frame_bytes,
                ) {
                    // Within the watermarks, and never waiting: this task reads the answers
                    // that drain the peer's queue (a peer pinging without reading its pongs
                    // gets none once this queue is full).
                    let _ = outbound.send_if_room(f);
                }
                continue;
            }
            Message::Error(e) => {
                if ErrorCode::from_u16(e.code).is_some_and(|c| c.is_fatal()) {
                    fatal = Some(format!("{} {}", e.code, e.message));
                }
                Err(remote(e))
            }
            message => Ok(Reply { message, body }),
        };
        let waiter = shared.lock().waiters.remove(&h.request_id);
        match waiter {
            Some(w) => {
                let _ = w.send(result);
            }
            None => tracing::debug!(
                request_id = h.request_id,
                "response to no pending request (timed out?)"
            ),
        }
    }
}
