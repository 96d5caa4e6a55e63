//! Peers that vanish without a word: TCP keepalive on both ends, a client connection retired
//! when its server stops answering, and a bound on a silent connection's handshake.
mod utils;

use std::net::SocketAddr;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sluice_proto::message::{ChunkData, FetchChunk, HandshakeOk};
use sluice_proto::Message;
use sluice_transport::{Body, ClientConfig, Connection, Pool, ServerConfig, TransportError};
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use utils::*;

/// The keepalive settings of the socket of this process connected from `local` to `peer`, as
/// `getsockopt` reads them: (SO_KEEPALIVE, TCP_KEEPIDLE, TCP_KEEPINTVL, TCP_KEEPCNT); `None`
/// while no such socket is open.
fn keepalive_of(local: SocketAddr, peer: SocketAddr) -> Option<(bool, Duration, Duration, u32)> {
    for entry in std::fs::read_dir("/proc/self/fd").ok()?.flatten() {
        let Ok(fd) = entry.file_name().to_string_lossy().parse::<i32>() else { continue };
        // SAFETY: the descriptor is only borrowed for `getsockopt`/`getsockname` calls, never
        // closed; one closed meanwhile by another test makes those calls fail with EBADF.
        let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
        let sock = socket2::SockRef::from(&borrowed);
        let addr = |a: std::io::Result<socket2::SockAddr>| a.ok().and_then(|a| a.as_socket());
        if addr(sock.local_addr()) == Some(local) && addr(sock.peer_addr()) == Some(peer) {
            return Some((
                sock.keepalive().ok()?,
                sock.keepalive_time().ok()?,
                sock.keepalive_interval().ok()?,
                sock.keepalive_retries().ok()?,
            ));
        }
    }
    None
}

const KEEPALIVE: (bool, Duration, Duration, u32) =
    (true, Duration::from_secs(30), Duration::from_secs(10), 3);

/// An accepted connection (server side) and a connecting one (client side) both probe an idle
/// peer: 30 s idle, then 3 probes 10 s apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalive_is_set_on_accepted_and_connected_sockets() {
    let server = TestServer::start(TestHandler::default(), ServerConfig::default()).await;
    let raw = TcpStream::connect(server.addr).await.unwrap();
    let me = raw.local_addr().unwrap();
    // The server's socket: local address its listener's, peer ours.
    eventually("server socket configured", || keepalive_of(server.addr, me) == Some(KEEPALIVE))
        .await;
    // Our own socket was not configured by anyone: the probe reads real values.
    assert_eq!(keepalive_of(me, server.addr).map(|k| k.0), Some(false));
    drop(raw);

    // The client's socket, seen while it waits for a handshake reply that never comes.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let connecting = tokio::spawn(async move {
        let cfg = ClientConfig { connect_timeout_ms: 5_000, ..client_config() };
        Connection::connect(addr, &cfg).await
    });
    let (accepted, client) = listener.accept().await.unwrap();
    eventually("client socket configured", || keepalive_of(client, addr) == Some(KEEPALIVE)).await;
    connecting.abort();
    drop(accepted);
    server.stop().await;
}

/// A fake server: completes each handshake, then reads requests and answers only
/// `FetchChunk`s whose `chunk_index` is not 0, each with an empty `ChunkData`. Counts the
/// connections it accepted and those the client closed.
struct FakeServer {
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    closed_by_client: Arc<AtomicUsize>,
}

async fn fake_server() -> FakeServer {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let closed_by_client = Arc::new(AtomicUsize::new(0));
    let (acc, closed) = (accepted.clone(), closed_by_client.clone());
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { return };
            acc.fetch_add(1, Ordering::SeqCst);
            let closed = closed.clone();
            tokio::spawn(async move {
                let mut peer = RawPeer { stream, buf: Default::default() };
                let (id, m, _) = peer.read_frame().await.unwrap();
                assert!(matches!(m, Message::Handshake(_)));
                let ok = HandshakeOk { version: 1, features: 1, max_frame_bytes: 1 << 20 };
                peer.send(&sluice_proto::encode_frame(id, &Message::HandshakeOk(ok), &[])).await;
                loop {
                    let Some((id, m, _)) = read_or_wait(&mut peer).await else {
                        closed.fetch_add(1, Ordering::SeqCst);
                        return;
                    };
                    if let Message::FetchChunk(FetchChunk { stream_id, chunk_index }) = m {
                        if chunk_index == 3 {
                            // A long answer: its head at once, its body dribbled over 1 s.
                            let data = Message::ChunkData(ChunkData { stream_id, chunk_index });
                            let body = vec![7u8; 40 * 64];
                            let frame = sluice_proto::encode_frame(id, &data, &body);
                            let (head, rest) = frame.split_at(frame.len() - body.len());
                            peer.send(head).await;
                            for piece in rest.chunks(64) {
                                tokio::time::sleep(Duration::from_millis(25)).await;
                                peer.send(piece).await;
                            }
                        } else if chunk_index != 0 {
                            let data = Message::ChunkData(ChunkData { stream_id, chunk_index });
                            peer.send(&sluice_proto::encode_frame(id, &data, &[])).await;
                        }
                    }
                }
            });
        }
    });
    FakeServer { addr, accepted, closed_by_client }
}

/// The next frame, waiting as long as it takes (`RawPeer::read_frame` gives up after 10 s);
/// `None` at EOF.
async fn read_or_wait(peer: &mut RawPeer) -> Option<(u32, Message, bytes::Bytes)> {
    loop {
        if let Some(f) = sluice_proto::parse(&mut peer.buf, u32::MAX).unwrap() {
            return Some((f.request_id, f.message, f.body));
        }
        match peer.stream.read_buf(&mut peer.buf).await {
            Ok(0) | Err(_) => return None,
            Ok(_) => {}
        }
    }
}

/// A server that stops answering (here: never answers `chunk_index` 0; chunk 3's answer comes
/// slowly) and sends nothing else:
/// the request times out, the connection is closed (a request pipelined behind it fails at once
/// with `Closed` saying why, rather than waiting out its own timeout), and the pool's next
/// connection is a new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_server_connection_is_retired_after_a_request_timeout() {
    let fake = fake_server().await;
    let pool = Pool::new(ClientConfig {
        request_timeout_ms: 400,
        connections_per_peer: 1,
        ..client_config()
    });
    let first = pool.get(fake.addr).await.unwrap();
    let c = first.clone();
    let timed_out = tokio::spawn(async move { c.request(fetch(0), Body::Empty).await });
    tokio::time::sleep(Duration::from_millis(150)).await;
    let c = first.clone();
    let behind = tokio::spawn(async move { c.request(fetch(0), Body::Empty).await });

    let err = timed_out.await.unwrap().unwrap_err();
    assert!(matches!(err, TransportError::Timeout { what: "request", after_ms: 400 }), "{err:?}");
    let err = behind.await.unwrap().unwrap_err();
    match &err {
        TransportError::Closed(why) => assert!(why.contains("presumed dead"), "{why}"),
        other => panic!("the pipelined request should fail with the reason: {other:?}"),
    }
    assert!(err.is_retriable());
    assert!(first.is_closed());
    assert_eq!(first.pending_requests(), 0);
    eventually("the retired socket closed", || fake.closed_by_client.load(Ordering::SeqCst) == 1)
        .await;

    let second = pool.get(fake.addr).await.unwrap();
    assert!(!Arc::ptr_eq(&first, &second), "a new connection");
    assert_eq!(fake.accepted.load(Ordering::SeqCst), 2);
    let reply = second.request(fetch(1), Body::Empty).await.unwrap();
    assert!(matches!(reply.message, Message::ChunkData(_)));
}

/// A request that times out while the server answered others meanwhile: the server is alive
/// (the request is slow, not the connection dead), so the connection stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_on_a_connection_that_hears_from_its_server_keeps_it() {
    let fake = fake_server().await;
    let cfg = ClientConfig { request_timeout_ms: 400, ..client_config() };
    let conn = Arc::new(Connection::connect(fake.addr, &cfg).await.unwrap());
    let c = conn.clone();
    let slow = tokio::spawn(async move { c.request(fetch(0), Body::Empty).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    conn.request(fetch(1), Body::Empty).await.unwrap();
    let err = slow.await.unwrap().unwrap_err();
    assert!(matches!(err, TransportError::Timeout { .. }), "{err:?}");
    assert!(!conn.is_closed());
    conn.request(fetch(2), Body::Empty).await.unwrap();
    assert_eq!(fake.accepted.load(Ordering::SeqCst), 1);
}

/// A request that times out while a long answer is still arriving on its connection (the
/// answer's head came before the request was sent, its body keeps coming after the timeout):
/// the server is alive, so the connection stays, and serves the next request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_while_a_long_body_arrives_keeps_the_connection() {
    let fake = fake_server().await;
    let cfg = ClientConfig { request_timeout_ms: 400, ..client_config() };
    let conn = Arc::new(Connection::connect(fake.addr, &cfg).await.unwrap());
    let c = conn.clone();
    let long = tokio::spawn(async move { c.request(fetch(3), Body::Empty).await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let err = conn.request(fetch(0), Body::Empty).await.unwrap_err();
    assert!(matches!(err, TransportError::Timeout { .. }), "{err:?}");
    assert!(!conn.is_closed(), "closed while the server was sending");
    // The long answer outlasts its own timeout too, with its bytes arriving all along.
    let err = long.await.unwrap().unwrap_err();
    assert!(matches!(err, TransportError::Timeout { .. }), "{err:?}");
    assert!(!conn.is_closed(), "closed while the server was sending");
    tokio::time::sleep(Duration::from_millis(800)).await; // the rest of the body
    let reply = conn.request(fetch(1), Body::Empty).await.unwrap();
    assert!(matches!(reply.message, Message::ChunkData(_)));
    assert_eq!(fake.accepted.load(Ordering::SeqCst), 1);
}

/// With `idle_timeout_ms = 0` (never drop an idle peer), a connection that never sends its
/// handshake is still closed, after 10 s (paused clock: no real wait), freeing its slot.
#[tokio::test]
async fn a_silent_connection_is_closed_before_its_handshake_even_without_an_idle_timeout() {
    let cfg = ServerConfig { idle_timeout_ms: 0, shutdown_grace_ms: 10, ..Default::default() };
    let server = TestServer::start(TestHandler::default(), cfg).await;
    let mut silent = TcpStream::connect(server.addr).await.unwrap();
    // Real time until the server has the connection (and its handshake wait has begun).
    eventually("accepted", || server.stats.snapshot().connections_open == 1).await;
    tokio::time::pause();
    let start = tokio::time::Instant::now();
    let mut byte = [0u8; 1];
    let read = tokio::time::timeout(Duration::from_secs(60), silent.read(&mut byte)).await;
    assert!(matches!(read, Ok(Ok(0))), "closed by the server: {read:?}");
    assert!(start.elapsed() <= Duration::from_secs(10), "{:?}", start.elapsed());
    eventually("slot freed", || server.stats.snapshot().connections_open == 0).await;
    tokio::time::resume();
    drop(silent);
    server.stop().await;
}
