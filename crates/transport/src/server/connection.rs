//! One accepted connection: handshake, then the read loop, then an orderly close.

use std::future::Future;
use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use sluice_proto::message::{
    AuthChallenge, HandshakeOk, Pong, FEATURE_CRC32C, FEATURE_HOST_LOCAL_READS, PROTOCOL_VERSION,
};
use sluice_proto::{encode_frame, ErrorCode, Message, MsgType};
use sluice_proto::{HANDSHAKE_MAX_FRAME_BYTES, MIN_MAX_FRAME_BYTES};
use tokio::net::TcpStream;
use tokio::sync::{watch, Semaphore};

use super::{Admission, ConnInfo, Handler, PeerIdentity, Request, Response};
use crate::body::{Body, FileRegion};
use crate::codec::FrameReader;
use crate::config::ServerConfig;
use crate::error::TransportError;
use crate::outbound::{millis, OutFrame, Outbound, WriterOptions};
use crate::secret::{app_credential, constant_time_eq, handshake_proof, nonce};
use crate::socket::configure;
use crate::stats::TransportStats;
use crate::stream::Sink;
use crate::tls::TlsListener;

/// How long we keep reading (and dropping) a peer's bytes after a fatal error frame.
const LINGER: Duration = Duration::from_secs(1);
const LINGER_MAX_BYTES: usize = 4 << 20;
/// Bound on each wait of the handshake (TLS, then each handshake frame and reply) when
/// `idle_timeout_ms` is 0: "never drop an idle peer" is meant for connections that proved who
/// they are, not for one that connects and stays silent, which would hold its
/// `max_connections` slot forever.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the read loop ended.
enum End {
    /// The peer closed between frames.
    PeerClosed,
    /// `serve` is shutting down.
    Shutdown,
    /// The peer broke the protocol: answer with this error, then close.
    Fatal { request_id: u32, code: ErrorCode, text: String },
    /// Reading failed (reset, stalled mid-frame, closed mid-frame).
    ReadFailed(TransportError),
    /// The writer stopped with an error (or ended).
    WriterEnded(Result<(), TransportError>),
}

/// Keeps the `connections_open` gauge right on every exit path.
struct OpenGauge(Arc<TransportStats>);

impl Drop for OpenGauge {
    fn drop(&mut self) {
        TransportStats::sub(&self.0.connections_open, 1);
    }
}

pub(super) async fn run<H: Handler>(
    stream: TcpStream,
    id: u64,
    peer: SocketAddr,
    handler: Arc<H>,
    shared: Arc<Shared>,
    stats: Arc<TransportStats>,
    mut stop: watch::Receiver<bool>,
) {
    let cfg = &shared.cfg;
    let local = stream.local_addr().ok();
    TransportStats::add(&stats.connections_open, 1);
    let _open = OpenGauge(stats.clone());
    if let Err(e) = configure(&stream, cfg.tcp_nodelay, cfg.send_buffer_bytes, None) {
        tracing::warn!(error = %e, "setting socket options failed");
    }
    let idle = millis(cfg.idle_timeout_ms);
    // Every wait before the handshake completes is bounded, whatever `idle_timeout_ms` says.
    let handshake_limit = idle.unwrap_or(HANDSHAKE_TIMEOUT);
    let (mut reader, mut wr) = match &shared.tls {
        None => {
            let (rd, wr) = stream.into_split();
            (FrameReader::new(rd, HANDSHAKE_MAX_FRAME_BYTES, idle), Sink::Plain(wr))
        }
        Some(tls) => {
            let accepted = tokio::select! {
                r = crate::ktls::accept(tls, stream, handshake_limit, &stats) => r,
                _ = stop.wait_for(|s| *s) => return,
            };
            let Some((rd, wr)) = accepted else { return };
            (FrameReader::new(rd, HANDSHAKE_MAX_FRAME_BYTES, idle), wr)
        }
    };
    reader.set_body_pool(handler.body_pool());

    let handshake = tokio::select! {
        r = handshake(&mut reader, &mut wr, cfg, handshake_limit, id, (peer, local)) => r,
        _ = stop.wait_for(|s| *s) => return,
    };
    let (conn, max_frame, reply) = match handshake {
        Ok(x) => x,
        Err(HandshakeEnd::PeerLeft) => return,
        Err(HandshakeEnd::Refused { request_id, code, text }) => {
            tracing::info!(%code, %text, "handshake refused");
            TransportStats::add(&stats.handshakes_failed, 1);
            let frame = encode_frame(request_id, &Message::error(code, text), &[]);
            if write_direct(&mut wr, &frame, handshake_limit).await.is_ok() {
                let _ = wr.shutdown().await;
                reader.drain(LINGER, LINGER_MAX_BYTES).await;
            }
            return;
        }
    };
    if let Err(e) = write_direct(&mut wr, &reply, handshake_limit).await {
        tracing::debug!(error = %e, "handshake reply not sent");
        return;
    }
    reader.max_frame_bytes = max_frame;
    tracing::debug!(identity = %conn.identity, max_frame, "handshake done");

    let (outbound, mut writer) = Outbound::start(wr, WriterOptions::from(cfg), stats.clone());
    let opts = ResponseOpts { max_frame, shared: shared.clone() };
    let max_inflight = cfg.max_inflight_requests_per_connection;
    let inflight = Arc::new(Semaphore::new(max_inflight));
    let end = tokio::select! {
        end = read_loop(&mut reader, &conn, &handler, &outbound, &inflight, &opts, &stats) => end,
        w = &mut writer => End::WriterEnded(w.unwrap_or_else(|e| Err(TransportError::Closed(format!("writer task: {e}"))))),
        _ = stop.wait_for(|s| *s) => End::Shutdown,
    };

    let grace = Duration::from_millis(cfg.shutdown_grace_ms);
    match end {
        End::PeerClosed | End::Shutdown => {
            // Let in-flight requests answer, then flush and close.
            let all = u32::try_from(max_inflight).unwrap_or(u32::MAX);
            if tokio::time::timeout(grace, inflight.acquire_many(all)).await.is_err() {
                tracing::warn!("in-flight requests did not finish within the grace period");
            }
            outbound.close();
            finish_writer(writer, grace).await;
        }
        End::Fatal { request_id, code, text } => {
            tracing::info!(%code, %text, "peer broke the protocol; closing");
            TransportStats::add(&stats.protocol_errors, 1);
            let _ = outbound.send_now(OutFrame::error(request_id, code, text));
            outbound.close();
            finish_writer(writer, grace).await;
            reader.drain(LINGER, LINGER_MAX_BYTES).await;
        }
        End::ReadFailed(e) => {
            tracing::info!(error = %e, "read failed; closing");
            outbound.close();
            finish_writer(writer, grace).await;
        }
        End::WriterEnded(r) => {
            if let Err(e) = r {
                tracing::info!(error = %e, "write failed; closing");
            }
        }
    }
    handler.connection_closed(&conn);
}

/// Waits up to `grace` for the writer to send what is queued; then stops it, so that the
/// socket, the queued frames and their files go with the connection (a peer that never reads
/// would otherwise keep them past the connection's slot, which is released on return).
async fn finish_writer(
    mut writer: tokio::task::JoinHandle<Result<(), TransportError>>,
    grace: Duration,
) {
    match tokio::time::timeout(grace, &mut writer).await {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(e))) => tracing::debug!(error = %e, "writer ended with an error"),
        Ok(Err(e)) => tracing::warn!(error = %e, "writer task failed"),
        Err(_) => {
            tracing::warn!("writer did not finish within the grace period; closing the connection");
            writer.abort();
            let _ = writer.await;
        }
    }
}

/// Why a handshake did not complete.
enum HandshakeEnd {
    /// The peer left (or stayed silent past the handshake's bound) without a word: nothing to
    /// answer.
    PeerLeft,
    /// Refused: answer request `request_id` with this error, then close.
    Refused { request_id: u32, code: ErrorCode, text: String },
}

impl HandshakeEnd {
    fn refused(request_id: u32, code: ErrorCode, text: impl Into<String>) -> Self {
        HandshakeEnd::Refused { request_id, code, text: text.into() }
    }
}

/// Reads the next frame of the handshake, within `limit`.
async fn handshake_frame(
    reader: &mut FrameReader,
    limit: Duration,
) -> Result<(sluice_proto::Header, Message), HandshakeEnd> {
    let head = match tokio::time::timeout(limit, reader.read_head()).await {
        Ok(r) => r,
        Err(_) => {
            tracing::debug!(after_ms = limit.as_millis() as u64, "no handshake in time; closing");
            return Err(HandshakeEnd::PeerLeft);
        }
    };
    match head {
        Ok(Some(x)) => Ok(x),
        Ok(None) => Err(HandshakeEnd::PeerLeft),
        Err(TransportError::Proto(e)) => {
            Err(HandshakeEnd::refused(reader.front_request_id(), e.code(), e.to_string()))
        }
        Err(_) => Err(HandshakeEnd::PeerLeft),
    }
}

/// Reads and checks the client's handshake, each read and write within `limit`. With a cluster
/// key configured, challenges the client to prove the credential of the application it names
/// (of the cluster when it names none) and binds the connection to that identity
/// (`docs/security.md`).
async fn handshake(
    reader: &mut FrameReader,
    wr: &mut Sink,
    cfg: &ServerConfig,
    limit: Duration,
    id: u64,
    (peer, local): (SocketAddr, Option<SocketAddr>),
) -> Result<(Arc<ConnInfo>, u32, bytes::BytesMut), HandshakeEnd> {
    let (h, hs) = match handshake_frame(reader, limit).await? {
        (h, Message::Handshake(hs)) => (h, hs),
        (h, _) => {
            return Err(HandshakeEnd::refused(
                h.request_id,
                ErrorCode::ProtocolViolation,
                "the first frame must be a Handshake",
            ))
        }
    };
    if hs.max_frame_bytes < MIN_MAX_FRAME_BYTES {
        return Err(HandshakeEnd::refused(
            h.request_id,
            ErrorCode::MalformedFrame,
            format!(
                "proposed max_frame_bytes {} is below {MIN_MAX_FRAME_BYTES}",
                hs.max_frame_bytes
            ),
        ));
    }
    let (identity, reply_id) = match &cfg.secret {
        None => (PeerIdentity::Anyone, h.request_id),
        Some(key) => {
            let server_nonce = nonce();
            let challenge = AuthChallenge { server_nonce: server_nonce.clone() };
            let frame = encode_frame(h.request_id, &Message::AuthChallenge(challenge), &[]);
            if write_direct(wr, &frame, limit).await.is_err() {
                return Err(HandshakeEnd::PeerLeft);
            }
            let (ph, proof) = match handshake_frame(reader, limit).await? {
                (ph, Message::AuthProof(p)) => (ph, p),
                (ph, other) => {
                    return Err(HandshakeEnd::refused(
                        ph.request_id,
                        ErrorCode::AuthFailed,
                        format!(
                            "authentication is on: expected AuthProof, got {}",
                            other.msg_type().name()
                        ),
                    ))
                }
            };
            // The cluster's own peers prove the cluster key itself; an application proves the
            // credential derived from it for its id.
            let credential = match hs.app_id.is_empty() {
                true => key.clone(),
                false => app_credential(key, &hs.app_id),
            };
            let want = handshake_proof(&credential, &hs.app_id, &server_nonce, &hs.client_nonce);
            if !constant_time_eq(want.as_bytes(), proof.proof.as_bytes()) {
                let who = match hs.app_id.is_empty() {
                    true => "the cluster".to_string(),
                    false => format!("application {:?}", hs.app_id),
                };
                return Err(HandshakeEnd::refused(
                    ph.request_id,
                    ErrorCode::AuthFailed,
                    format!("wrong or missing credential for {who}"),
                ));
            }
            let identity = match hs.app_id.is_empty() {
                true => PeerIdentity::Cluster,
                false => PeerIdentity::App(hs.app_id.clone()),
            };
            (identity, ph.request_id)
        }
    };
    let max_frame = hs.max_frame_bytes.min(cfg.max_frame_bytes);
    let app_id = (!hs.app_id.is_empty()).then_some(hs.app_id);
    let conn = ConnInfo { id, peer, local, app_id, identity, max_frame_bytes: max_frame };
    let mut offered = FEATURE_CRC32C;
    if cfg.offer_host_local_reads && conn.peer_on_this_host() {
        offered |= FEATURE_HOST_LOCAL_READS;
    }
    let ok = HandshakeOk {
        version: PROTOCOL_VERSION,
        features: hs.features & offered,
        max_frame_bytes: max_frame,
    };
    let reply = encode_frame(reply_id, &Message::HandshakeOk(ok), &[]);
    Ok((Arc::new(conn), max_frame, reply))
}

/// Writes a whole frame before the writer task exists (handshake replies and refusals), within
/// `limit`.
async fn write_direct(wr: &mut Sink, frame: &[u8], limit: Duration) -> Result<(), TransportError> {
    tokio::time::timeout(limit, wr.write_all_flush(frame))
        .await
        .map_err(|_| TransportError::Timeout {
            what: "peer stalled: handshake write",
            after_ms: limit.as_millis() as u64,
        })?
        .map_err(Into::into)
}

/// Whether a message type only ever travels as a response.
fn is_response(t: MsgType) -> bool {
    matches!(
        t,
        MsgType::HandshakeOk
            | MsgType::Error
            | MsgType::Pong
            | MsgType::Ok
            | MsgType::Assignment
            | MsgType::CommitResult
            | MsgType::PushAck
            | MsgType::PushSplit
            | MsgType::Busy
            | MsgType::MapperEndResult
            | MsgType::StreamHandle
            | MsgType::ChunkData
            | MsgType::ChunkLocal
            | MsgType::AuthChallenge
    )
}

async fn read_loop<H: Handler>(
    reader: &mut FrameReader,
    conn: &Arc<ConnInfo>,
    handler: &Arc<H>,
    outbound: &Outbound,
    inflight: &Arc<Semaphore>,
    opts: &ResponseOpts,
    stats: &Arc<TransportStats>,
) -> End {
    let max_frame = opts.max_frame;
    loop {
        // Stop reading while the connection has its fill of requests in flight: the peer then
        // feels the backpressure through TCP.
        let permit = inflight
            .clone()
            .acquire_owned()
            .await
            .expect("the in-flight semaphore is never closed");
        let (h, message) = match reader.read_head().await {
            Ok(Some(x)) => x,
            Ok(None) => return End::PeerClosed,
            Err(TransportError::Proto(e)) => {
                return End::Fatal {
                    request_id: reader.front_request_id(),
                    code: e.code(),
                    text: e.to_string(),
                }
            }
            Err(e) => return End::ReadFailed(e),
        };
        TransportStats::add(&stats.frames_received, 1);
        let ty = message.msg_type();
        if ty == MsgType::Handshake || ty == MsgType::AuthProof {
            let text = format!("{} after the handshake", ty.name());
            return End::Fatal {
                request_id: h.request_id,
                code: ErrorCode::ProtocolViolation,
                text,
            };
        }
        if is_response(ty) {
            let text = format!("{} sent as a request", ty.name());
            return End::Fatal {
                request_id: h.request_id,
                code: ErrorCode::ProtocolViolation,
                text,
            };
        }
        if ty == MsgType::Ping {
            // Within the watermarks like any answer: a peer that sends pings and never reads
            // the pongs stops being read once its queue is full, rather than growing it.
            let pong = OutFrame::new(h.request_id, &Message::Pong(Pong {}), Body::Empty, max_frame);
            if let Ok(pong) = pong {
                if outbound.send(pong).await.is_err() {
                    return End::ReadFailed(TransportError::Closed("writer stopped".into()));
                }
            }
            continue;
        }
        let body_len = h.body_len();
        // Authorization before admission: a refused push reserves no memory, and its body is
        // read and dropped like any refused body.
        if let Err(text) = conn.identity.authorize(&message) {
            tracing::warn!(identity = %conn.identity, request = ty.name(), %text, "request refused");
            TransportStats::add(&stats.requests_unauthorized, 1);
            if let Err(e) = reader.discard_body(body_len).await {
                return End::ReadFailed(e);
            }
            let resp = Response::error(ErrorCode::Unauthorized, text);
            if send_response(outbound, h.request_id, resp, opts, stats).await.is_err() {
                return End::ReadFailed(TransportError::Closed("writer stopped".into()));
            }
            continue;
        }
        let decision = match handler.admit(conn, &message, body_len) {
            Admission::Accept(permit) => Ok(permit),
            Admission::Reject(reply) => Err(reply),
            // Counted by the handler, which knows what it waits for.
            Admission::Later(decide) => decide.await,
        };
        match decision {
            Ok(body_permit) => {
                let body = match reader.read_body(body_len).await {
                    Ok(b) => b,
                    Err(e) => return End::ReadFailed(e),
                };
                let request_id = h.request_id;
                let req = Request { request_id, message, body, permit: body_permit };
                let fut = CatchUnwind(Box::pin(handler.handle(conn, req)));
                let outbound = outbound.clone();
                let stats = stats.clone();
                let opts = opts.clone();
                tokio::spawn(async move {
                    let resp = fut.await.unwrap_or_else(|_| {
                        tracing::error!(request_id, "request handler panicked");
                        Response::error(ErrorCode::Internal, "request handler panicked")
                    });
                    let _ = send_response(&outbound, request_id, resp, &opts, &stats).await;
                    drop(permit);
                });
            }
            Err(reply) => {
                if let Err(e) = reader.discard_body(body_len).await {
                    return End::ReadFailed(e);
                }
                TransportStats::add(&stats.bodies_rejected, 1);
                let resp = Response::msg(reply);
                if send_response(outbound, h.request_id, resp, opts, stats).await.is_err() {
                    return End::ReadFailed(TransportError::Closed("writer stopped".into()));
                }
            }
        }
    }
}

/// What one listener's connections share.
pub(crate) struct Shared {
    pub cfg: ServerConfig,
    /// The listener's TLS (`None`: plain TCP).
    pub tls: Option<Arc<TlsListener>>,
    /// Permits for cold read-ins ([`ServerConfig::max_cold_reads`]); `None`: unbounded.
    pub cold_reads: Option<Semaphore>,
}

/// How one connection's responses are queued.
#[derive(Clone)]
pub(crate) struct ResponseOpts {
    /// The frame size the handshake negotiated.
    pub max_frame: u32,
    pub shared: Arc<Shared>,
}

/// Queues a response. A file body whose file is shorter than its region becomes `DATA_LOST`
/// (before any byte of the frame is written); a response too large for the negotiated frame
/// size becomes `INTERNAL`. A file body that is not all in the page cache is read in on tokio's
/// blocking pool first: the writer's `sendfile` runs on an async worker, and a page-cache miss
/// there would stall every connection of that worker for the disk read.
pub(crate) async fn send_response(
    outbound: &Outbound,
    request_id: u32,
    resp: Response,
    opts: &ResponseOpts,
    stats: &TransportStats,
) -> Result<(), TransportError> {
    let Response { mut message, mut body } = resp;
    if body.is_file() {
        match body.check_len() {
            // Regions of one file in ascending order (a chunk's byte ranges) are read in as their
            // one span, with one request: the gaps between them are small and near.
            Ok(()) => match body.span() {
                Some(span) => read_in_if_cold(&span, request_id, &opts.shared, stats).await,
                None => {
                    for region in body.regions() {
                        read_in_if_cold(region, request_id, &opts.shared, stats).await;
                    }
                }
            },
            Err(e) => {
                tracing::warn!(request_id, error = %e, "file body truncated; answering DATA_LOST");
                TransportStats::add(&stats.file_regions_truncated, 1);
                message = Message::error(ErrorCode::DataLost, e.to_string());
                body = Body::Empty;
            }
        }
    }
    let frame = match OutFrame::new(request_id, &message, body, opts.max_frame) {
        Ok(f) => f,
        Err(e) => {
            tracing::error!(request_id, error = %e, "response does not fit in a frame");
            OutFrame::error(request_id, ErrorCode::Internal, format!("response does not fit: {e}"))
        }
    };
    outbound.send(frame).await
}

/// Makes sure a file body's `sendfile` will not wait on the disk: a region `cachestat` finds not
/// all cached is read in on the blocking pool (at most `max_cold_reads` at once; waiting for a
/// permit holds no thread). Where that is off, fails, or the kernel cannot tell, read-ahead is
/// queued and the writer finds out.
async fn read_in_if_cold(
    region: &FileRegion,
    request_id: u32,
    shared: &Shared,
    stats: &TransportStats,
) {
    match region.is_cached() {
        Some(true) => return,
        Some(false) if shared.cfg.cold_regions_on_blocking_pool => {}
        Some(false) | None => return region.will_need(),
    }
    TransportStats::add(&stats.file_regions_cold, 1);
    TransportStats::add(&stats.file_regions_cold_bytes, region.len);
    let _permit = match &shared.cold_reads {
        Some(s) => Some(s.acquire().await.expect("never closed")),
        None => None,
    };
    let reading = &stats.file_regions_cold_reading;
    TransportStats::add(reading, 1);
    TransportStats::max(&stats.file_regions_cold_reading_peak, reading.load(Relaxed));
    let r = region.clone();
    let read_in = tokio::task::spawn_blocking(move || r.populate()).await;
    TransportStats::sub(reading, 1);
    match read_in {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            tracing::debug!(request_id, error = %e, "reading a cold region in failed");
            region.will_need();
        }
        Err(e) => tracing::warn!(request_id, error = %e, "cold region task failed"),
    }
}

/// Turns a panic while polling the handler's future into an `Err`, so the requester still gets
/// an answer.
struct CatchUnwind<F>(F);

impl<F: Future + Unpin> Future for CatchUnwind<F> {
    type Output = Result<F::Output, ()>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match std::panic::catch_unwind(AssertUnwindSafe(|| Pin::new(&mut self.0).poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(v)) => Poll::Ready(Ok(v)),
            Err(_) => Poll::Ready(Err(())),
        }
    }
}
