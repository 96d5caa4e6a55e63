//! Peers that break the protocol get an error frame and a closed connection; others carry on.
mod utils;

use bytes::BufMut;
use sluice_proto::message::{Busy, MAGIC, PROTOCOL_VERSION};
use sluice_proto::{ErrorCode, Message};
use sluice_transport::{
    app_credential, Body, ClientConfig, Connection, ServerConfig, TransportError,
};
use utils::*;

fn header(frame_len: u32, msg_type: u8, request_id: u32, fields_len: u32) -> Vec<u8> {
    let mut b = Vec::new();
    b.put_u32(frame_len);
    b.put_u8(msg_type);
    b.put_u32(request_id);
    b.put_u32(fields_len);
    b
}

/// Each bad frame gets its error code, then EOF; a healthy connection opened before keeps
/// working throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_frames_get_an_error_then_close() {
    let cfg = ServerConfig { max_frame_bytes: 1 << 20, ..Default::default() };
    let server = TestServer::start(TestHandler::default(), cfg).await;
    let healthy = Connection::connect(server.addr, &client_config()).await.unwrap();
    let cases: Vec<(Vec<u8>, ErrorCode, u32)> = vec![
        (header(2 << 20, 30, 11, 0), ErrorCode::FrameTooLarge, 11),
        (header(13, 99, 12, 0), ErrorCode::UnknownMessageType, 12),
        (header(5, 4, 13, 0), ErrorCode::MalformedFrame, 13),
        // Ping with a body.
        ([header(17, 4, 14, 0), vec![1, 2, 3, 4]].concat(), ErrorCode::MalformedFrame, 14),
        // A response sent as a request.
        (
            sluice_proto::encode_frame(15, &Message::Busy(Busy { backoff_ms: 1 }), &[]).to_vec(),
            ErrorCode::ProtocolViolation,
            15,
        ),
        // A second handshake.
        (handshake(PROTOCOL_VERSION, MAGIC), ErrorCode::ProtocolViolation, 0),
    ];
    for (bytes, code, request_id) in cases {
        let mut raw = raw_connect(server.addr).await;
        raw.send(&bytes).await;
        let (id, m, _) = raw.read_frame().await.expect("an error frame");
        expect_error(&m, code);
        assert_eq!(id, request_id);
        assert!(raw.read_frame().await.is_none(), "connection closed after {code}");
        let (m, body) = push(100);
        healthy.request(m, body).await.unwrap();
    }
    assert_eq!(server.stats.snapshot().protocol_errors, 6);
    drop(healthy);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handshake_version_magic_and_order() {
    let server = TestServer::start(TestHandler::default(), ServerConfig::default()).await;
    for (bytes, code) in [
        (handshake(PROTOCOL_VERSION + 1, MAGIC), ErrorCode::UnsupportedVersion),
        (handshake(PROTOCOL_VERSION, 0xdead_beef), ErrorCode::UnsupportedVersion),
        (sluice_proto::encode_frame(3, &fetch(0), &[]).to_vec(), ErrorCode::ProtocolViolation),
    ] {
        let stream = tokio::net::TcpStream::connect(server.addr).await.unwrap();
        let mut raw = RawPeer { stream, buf: Default::default() };
        raw.send(&bytes).await;
        let (_, m, _) = raw.read_frame().await.expect("an error frame");
        expect_error(&m, code);
        assert!(raw.read_frame().await.is_none());
    }
    assert_eq!(server.stats.snapshot().handshakes_failed, 3);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_are_checked_and_bind_the_connection() {
    const KEY: &str = "cluster-key-0123456789";
    let cfg = ServerConfig { secret: Some(KEY.into()), ..Default::default() };
    let server = TestServer::start(TestHandler::default(), cfg).await;
    let connect = |secret: String| {
        let c = ClientConfig { secret, ..client_config() };
        async move { Connection::connect(server.addr, &c).await }
    };
    // The cluster key itself is not app-1's credential; nor is another application's.
    for wrong in [KEY.to_string(), app_credential(KEY, "app-2"), "wrong".into()] {
        let err = connect(wrong).await.err().expect("refused");
        assert!(
            matches!(err, TransportError::Remote { code: ErrorCode::AuthFailed, .. }),
            "{err:?}"
        );
        assert!(!err.is_retriable());
    }
    let ok = connect(app_credential(KEY, "app-1")).await.unwrap();
    ok.request(push(1).0, push(1).1).await.unwrap();
    // The connection is app-1's: a push naming app-2 is refused, and the connection stays.
    let other = Message::Push(sluice_proto::message::Push {
        app_id: "app-2".into(),
        shuffle_id: 1,
        partition_id: 2,
    });
    let err = ok.request(other, push(100).1).await.expect_err("refused");
    assert!(matches!(err, TransportError::Remote { code: ErrorCode::Unauthorized, .. }), "{err:?}");
    ok.request(push(1).0, push(1).1).await.unwrap();
    assert_eq!(server.stats.snapshot().requests_unauthorized, 1);
    assert_eq!(server.stats.snapshot().handshakes_failed, 3);
    drop(ok);
    server.stop().await;
}

#[test]
fn a_short_cluster_key_is_refused() {
    let cfg = ServerConfig { secret: Some("short".into()), ..Default::default() };
    let err = cfg.validate().unwrap_err().to_string();
    assert!(err.contains("5 characters"), "{err}");
}

/// A rejected body is read and dropped; the reply is the handler's message; the connection
/// stays in sync for the next request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejected_body_is_discarded() {
    let handler = TestHandler { reject_above: Some(1000), ..Default::default() };
    let server = TestServer::start(handler, ServerConfig::default()).await;
    let conn = Connection::connect(server.addr, &client_config()).await.unwrap();
    let (m, body) = push(300_000);
    let r = conn.request(m, body).await.unwrap();
    assert!(matches!(r.message, Message::Busy(Busy { backoff_ms: 7 })));
    let (m, body) = push(999);
    let r = conn.request(m, body.clone()).await.unwrap();
    let Body::Memory(b) = body else { unreachable!() };
    assert_eq!(r.body, b);
    assert_eq!(server.stats.snapshot().bodies_rejected, 1);
    drop(conn);
    server.stop().await;
}

/// The negotiated frame size is the smaller of both sides'; the client refuses to send more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frame_size_is_negotiated() {
    let server = TestServer::start(
        TestHandler::default(),
        ServerConfig { max_frame_bytes: 1 << 20, ..Default::default() },
    )
    .await;
    let conn = Connection::connect(server.addr, &client_config()).await.unwrap();
    assert_eq!(conn.max_frame_bytes(), 1 << 20);
    let (m, body) = push(2 << 20);
    let err = conn.request(m, body).await.unwrap_err();
    assert!(matches!(err, TransportError::Proto(_)), "{err:?}");
    assert!(!conn.is_closed());
    drop(conn);
    server.stop().await;
}
