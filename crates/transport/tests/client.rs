//! Client behaviour: timeouts, failing pending requests at once, pool reuse and reconnects.
mod utils;

use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_proto::Message;
use sluice_transport::{Body, ClientConfig, Connection, Pool, ServerConfig, TransportError};
use tokio::net::TcpListener;
use utils::*;

/// A request with no answer times out (paused clock: no real wait) and keeps no pending entry;
/// as nothing at all came from the server meanwhile, the connection is presumed dead and closed
/// (`liveness.rs` has a connection that stays, having heard from the server).
#[tokio::test]
async fn request_timeout() {
    let handler = TestHandler { delay: Some(Duration::from_secs(3600)), ..Default::default() };
    let server =
        TestServer::start(handler, ServerConfig { shutdown_grace_ms: 10, ..Default::default() })
            .await;
    let conn = Connection::connect(
        server.addr,
        &ClientConfig { request_timeout_ms: 5_000, ..client_config() },
    )
    .await
    .unwrap();
    tokio::time::pause();
    let (m, body) = push(10);
    let err = conn.request(m, body).await.unwrap_err();
    assert!(matches!(err, TransportError::Timeout { what: "request", after_ms: 5000 }), "{err:?}");
    assert!(err.is_retriable());
    assert_eq!(conn.pending_requests(), 0);
    assert!(conn.is_closed());
    tokio::time::resume();
    drop(conn);
    server.stop().await;
}

/// A fake server that completes the handshake, reads requests, never answers, and then drops
/// the connection: every pending request fails at once with `Closed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_requests_fail_at_once_on_connection_loss() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (drop_tx, drop_rx) = tokio::sync::oneshot::channel::<()>();
    let fake = tokio::spawn(async move {
        let (stream, _) = listener.accept().await.unwrap();
        let mut peer = RawPeer { stream, buf: Default::default() };
        let (id, m, _) = peer.read_frame().await.unwrap();
        assert!(matches!(m, Message::Handshake(_)));
        let ok = sluice_proto::message::HandshakeOk {
            version: 1,
            features: 1,
            max_frame_bytes: 1 << 20,
        };
        peer.send(&sluice_proto::encode_frame(id, &Message::HandshakeOk(ok), &[])).await;
        for _ in 0..10 {
            peer.read_frame().await.unwrap();
        }
        let _ = drop_rx.await;
    });
    let conn = Arc::new(Connection::connect(addr, &client_config()).await.unwrap());
    let mut waiting = Vec::new();
    for i in 0..10 {
        let c = conn.clone();
        waiting.push(tokio::spawn(async move { c.request(fetch(i), Body::Empty).await }));
    }
    eventually("10 pending", || conn.pending_requests() == 10).await;
    let t = Instant::now();
    drop(drop_tx);
    fake.await.unwrap();
    for w in waiting {
        let err = w.await.unwrap().unwrap_err();
        assert!(
            matches!(err, TransportError::Closed(ref r) if r.contains("server closed")),
            "{err:?}"
        );
        assert!(err.is_retriable());
    }
    assert!(t.elapsed() < Duration::from_secs(2), "failed at once, not by timeout");
    assert!(conn.is_closed());
    let err = conn.request(fetch(0), Body::Empty).await.unwrap_err();
    assert!(matches!(err, TransportError::Closed(_)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_round_robin_and_reconnect_after_restart() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server =
        TestServer::start_on(listener, TestHandler::default(), ServerConfig::default()).await;
    let cfg = ClientConfig {
        connections_per_peer: 2,
        reconnect_backoff_min_ms: 20,
        reconnect_backoff_max_ms: 100,
        ..client_config()
    };
    let pool = Pool::new(cfg);
    let a = pool.get(addr).await.unwrap();
    let b = pool.get(addr).await.unwrap();
    let c = pool.get(addr).await.unwrap();
    assert!(!Arc::ptr_eq(&a, &b), "two connections per peer");
    assert!(Arc::ptr_eq(&a, &c), "reused round-robin");
    a.request(push(10).0, push(10).1).await.unwrap();

    server.stop().await;
    eventually("connections closed", || a.is_closed() && b.is_closed()).await;
    // Down: connecting fails (and backs off).
    let err = pool.get(addr).await.err().expect("server is down");
    assert!(matches!(err, TransportError::Connect { .. }), "{err:?}");
    assert!(err.is_retriable());

    let listener = TcpListener::bind(addr).await.unwrap();
    let server =
        TestServer::start_on(listener, TestHandler::default(), ServerConfig::default()).await;
    let mut ok = 0;
    for _ in 0..20 {
        if let Ok(conn) = pool.get(addr).await {
            conn.request(push(10).0, push(10).1).await.unwrap();
            ok += 1;
            if ok == 4 {
                break;
            }
        }
    }
    assert_eq!(ok, 4, "the pool reconnected");
    drop((a, b, c));
    drop(pool);
    server.stop().await;
}
