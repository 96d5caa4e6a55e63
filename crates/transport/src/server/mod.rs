//! The accepting side: [`serve`] runs the accept loop; each connection does its handshake, then
//! one reader decodes requests and hands them to the [`Handler`], whose responses go out through
//! the connection's writer.

mod connection;

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use sluice_proto::{ErrorCode, Message};
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;
use tracing::Instrument;

use crate::body::Body;
use crate::config::ServerConfig;
use crate::stats::TransportStats;

/// The handler's decision about a request body, made from its header and fields alone. `P` is
/// the handler's [`Handler::Permit`]: whatever it wants kept alive with an admitted body
/// (typically a memory-budget reservation of the body's bytes, released when the request, and
/// so the permit, is dropped).
pub enum Admission<P> {
    /// Read the body; the permit travels with the [`Request`].
    Accept(P),
    /// Do not keep the body: it is read and dropped through the connection's own read buffer
    /// (never buffered whole), and this message is the reply (e.g. `Busy`).
    Reject(Message),
    /// Not yet decided: the connection reads nothing more until this future decides — `Ok`
    /// as [`Admission::Accept`], `Err` as [`Admission::Reject`]. Meanwhile the body waits in
    /// the socket and the peer's further sends back up behind it (TCP flow control): the way to
    /// slow a pusher down without making it send a body twice. The future should be short.
    Later(Pin<Box<dyn Future<Output = Result<P, Message>> + Send>>),
}

/// One request from a peer, with the permit its handler's admission gave it.
pub struct Request<P = ()> {
    /// The peer's id for this request; the transport puts it on the response.
    pub request_id: u32,
    /// The decoded message.
    pub message: Message,
    /// The body, in a buffer of exactly its size (empty when the message has none).
    pub body: Bytes,
    /// What [`Handler::admit`] accepted the request with.
    pub permit: P,
}

/// The answer to a request.
pub struct Response {
    /// The response message (`Error` for a failure).
    pub message: Message,
    /// The response body: memory bytes go out with `writev`, a file region with `sendfile`.
    pub body: Body,
}

impl Response {
    /// A response without a body.
    pub fn msg(message: impl Into<Message>) -> Self {
        Response { message: message.into(), body: Body::Empty }
    }

    /// A response with a body.
    pub fn with_body(message: impl Into<Message>, body: impl Into<Body>) -> Self {
        Response { message: message.into(), body: body.into() }
    }

    /// An `Error` response.
    pub fn error(code: ErrorCode, text: impl Into<String>) -> Self {
        Response::msg(Message::error(code, text))
    }
}

/// What the transport knows about a connection.
#[derive(Debug, Clone)]
pub struct ConnInfo {
    /// Unique (per `serve` call) connection id, also in the connection's tracing span.
    pub id: u64,
    /// The peer's address.
    pub peer: SocketAddr,
    /// This end's address (`None` when the socket could not say).
    pub local: Option<SocketAddr>,
    /// The application id from the handshake, when the client gave one.
    pub app_id: Option<String>,
    /// Who the handshake proved the peer to be: what it may ask for.
    pub identity: PeerIdentity,
    /// The `max_frame_bytes` the handshake settled on: no response to this peer may be larger.
    pub max_frame_bytes: u32,
}

impl ConnInfo {
    /// Whether the peer is on this host, in this network namespace: it connected over loopback
    /// or from this end's own address. (What host-local reads are offered to.)
    pub fn peer_on_this_host(&self) -> bool {
        let ip = self.peer.ip().to_canonical();
        ip.is_loopback() || self.local.is_some_and(|l| l.ip().to_canonical() == ip)
    }
}

/// Who a connection speaks for, settled by its handshake (`docs/security.md`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerIdentity {
    /// Authentication is off (no cluster key): the connection may act for any application.
    Anyone,
    /// Proved the cluster key: a server, a coordinator, an operator's tool. May do anything.
    Cluster,
    /// Proved the credential of this application: may act for it alone.
    App(String),
}

impl PeerIdentity {
    /// Whether this identity may send `message`: `Err` with the refusal's text when the
    /// message names another application, or is for the cluster's own peers only.
    pub fn authorize(&self, message: &Message) -> Result<(), String> {
        let PeerIdentity::App(own) = self else { return Ok(()) };
        if message.is_cluster_only() {
            return Err(format!(
                "{} is for the cluster's servers only; this connection is authenticated for \
                 application {own:?}",
                message.msg_type().name()
            ));
        }
        match message.app_id() {
            Some(named) if named != own => Err(format!(
                "this connection is authenticated for application {own:?}, not {named:?}"
            )),
            _ => Ok(()),
        }
    }

    /// The user whose quotas an application's usage counts for, given the user its
    /// `RegisterApp` names (`declared`, "" for none). With authentication off, or from the
    /// cluster: the one named. An authenticated application's credential proves its id, not a
    /// user it names, so its user is the one its id carries, `<user>/<rest>` (the launcher that
    /// issued the credential chose the id): the id's user when it names none or that one, else
    /// none (a tenant naming another's user would charge that user's quotas and learn its usage
    /// from the refusals); an id without `/` binds no user.
    pub fn vouched_user<'a>(&'a self, declared: &'a str) -> Option<&'a str> {
        let PeerIdentity::App(own) = self else {
            return (!declared.is_empty()).then_some(declared);
        };
        let bound = own.split_once('/').map(|(user, _)| user).filter(|u| !u.is_empty())?;
        (declared.is_empty() || declared == bound).then_some(bound)
    }

    /// Whether this identity may act for `app_id` (for requests that name an application only
    /// through something it owns, as a stream).
    pub fn may_act_for(&self, app_id: &str) -> bool {
        match self {
            PeerIdentity::App(own) => own == app_id,
            PeerIdentity::Anyone | PeerIdentity::Cluster => true,
        }
    }
}

impl std::fmt::Display for PeerIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PeerIdentity::Anyone => f.write_str("anyone (auth off)"),
            PeerIdentity::Cluster => f.write_str("cluster"),
            PeerIdentity::App(a) => write!(f, "app {a:?}"),
        }
    }
}

/// The application above the transport (the shuffle server, the coordinator).
pub trait Handler: Send + Sync + 'static {
    /// What admission hands to [`Handler::handle`] with an admitted request (`()` for a handler
    /// that admits everything); the default is what [`Handler::admit`]'s default gives.
    type Permit: Default + Send + 'static;

    /// Called after a request's header and fields are decoded, *before* its body is read: the
    /// place to reserve memory for `body_len` bytes, or to refuse the body. Must not block (to
    /// wait, return [`Admission::Later`]).
    fn admit(&self, conn: &ConnInfo, message: &Message, body_len: u32) -> Admission<Self::Permit> {
        let _ = (conn, message, body_len);
        Admission::Accept(Self::Permit::default())
    }

    /// Handles one request. Futures of one connection run concurrently (up to
    /// `max_inflight_requests_per_connection`), each on its own task; a panic becomes an
    /// `INTERNAL` error response.
    fn handle(
        &self,
        conn: &Arc<ConnInfo>,
        req: Request<Self::Permit>,
    ) -> impl Future<Output = Response> + Send + 'static;

    /// Where request bodies get their buffers: a pool shared by every connection, or `None`
    /// for a new allocation per body. Asked once per connection.
    fn body_pool(&self) -> Option<Arc<crate::BodyPool>> {
        None
    }

    /// Called once when a connection that completed its handshake is gone.
    fn connection_closed(&self, conn: &ConnInfo) {
        let _ = conn;
    }
}

/// Aborts a background task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Accepts connections on `listener` and serves them with `handler` until `shutdown` completes;
/// then stops accepting, tells every connection to finish its in-flight requests (bounded by
/// `shutdown_grace_ms`), waits for them, and returns.
///
/// Fails only when `config` is invalid; accept errors are logged and retried.
pub async fn serve<H: Handler>(
    listener: TcpListener,
    handler: Arc<H>,
    config: ServerConfig,
    stats: Arc<TransportStats>,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    config.validate().map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
    if let Some(n) = config.recv_buffer_bytes {
        // On the listener, so accepted sockets inherit it *before* the handshake picks their
        // window scale; shrinking SO_RCVBUF after accept can stall a connection whose peer was
        // already promised a larger window.
        socket2::SockRef::from(&listener).set_recv_buffer_size(n)?;
    }
    // One bound on cold read-ins for all of this listener's connections.
    let cold_reads = (config.max_cold_reads > 0).then(|| Semaphore::new(config.max_cold_reads));
    let tls = match &config.tls {
        None => None,
        Some(t) => Some(
            crate::tls::TlsListener::new(t.clone())
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?,
        ),
    };
    // Reloads the certificates on change or SIGHUP while the listener runs.
    let _watch = tls.clone().map(|t| AbortOnDrop(tokio::spawn(t.watch())));
    let shared = Arc::new(connection::Shared { cfg: config, cold_reads, tls });
    // Bounds open connections: a tokio semaphore so the accept loop can await a free slot; each
    // connection task holds its permit until it ends.
    let limit = Arc::new(Semaphore::new(shared.cfg.max_connections));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut conns = JoinSet::new();
    let mut next_id = 0u64;
    tokio::pin!(shutdown);
    loop {
        while conns.try_join_next().is_some() {}
        let permit = tokio::select! {
            _ = &mut shutdown => break,
            p = limit.clone().acquire_owned() => p.expect("the connection semaphore is never closed"),
        };
        let (stream, peer) = tokio::select! {
            _ = &mut shutdown => break,
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    // Out of descriptors, an aborted connection, …: transient; back off a little.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        next_id += 1;
        TransportStats::add(&stats.connections_accepted, 1);
        let span = tracing::info_span!("conn", id = next_id, %peer);
        let task = connection::run(
            stream,
            next_id,
            peer,
            handler.clone(),
            shared.clone(),
            stats.clone(),
            stop_rx.clone(),
        );
        conns.spawn(
            async move {
                task.await;
                drop(permit);
            }
            .instrument(span),
        );
    }
    tracing::info!(open = conns.len(), "transport shutting down");
    let _ = stop_tx.send(true);
    while conns.join_next().await.is_some() {}
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn(peer: &str, local: Option<&str>) -> ConnInfo {
        ConnInfo {
            id: 1,
            peer: peer.parse().unwrap(),
            local: local.map(|l| l.parse().unwrap()),
            app_id: None,
            identity: PeerIdentity::Anyone,
            max_frame_bytes: 1 << 20,
        }
    }

    #[test]
    fn a_peer_is_on_this_host_over_loopback_or_from_this_ends_own_address() {
        assert!(conn("127.0.0.1:5000", Some("127.0.0.1:9097")).peer_on_this_host());
        assert!(conn("127.0.0.2:5000", None).peer_on_this_host());
        assert!(conn("[::1]:5000", None).peer_on_this_host());
        assert!(conn("[::ffff:127.0.0.1]:5000", None).peer_on_this_host());
        assert!(conn("10.1.2.3:5000", Some("10.1.2.3:9097")).peer_on_this_host());
        assert!(conn("[::ffff:10.1.2.3]:5000", Some("10.1.2.3:9097")).peer_on_this_host());
        assert!(!conn("10.1.2.4:5000", Some("10.1.2.3:9097")).peer_on_this_host());
        assert!(!conn("10.1.2.4:5000", None).peer_on_this_host());
    }
}
