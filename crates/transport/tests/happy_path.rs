mod utils;

use std::sync::Arc;

use sluice_proto::Message;
use sluice_transport::{Body, Connection, ServerConfig};
use utils::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_echo_and_file_fetch() {
    let (file, data) = pattern_file(3 << 20);
    let handler = TestHandler {
        file: Some(Arc::new(file.reopen().unwrap())),
        chunk_bytes: 1 << 20,
        ..Default::default()
    };
    let server = TestServer::start(handler, ServerConfig::default()).await;
    let conn = Connection::connect(server.addr, &client_config()).await.unwrap();

    let (m, body) = push(5000);
    let Body::Memory(sent) = body.clone() else { unreachable!() };
    let reply = conn.request(m, body).await.unwrap();
    assert!(matches!(reply.message, Message::ChunkData(_)));
    assert_eq!(reply.body, sent);

    for i in 0..3u32 {
        let reply = conn.request(fetch(i), Body::Empty).await.unwrap();
        let want = &data[(i as usize) << 20..((i as usize) + 1) << 20];
        assert_eq!(&reply.body[..], want);
    }
    // Many concurrent requests on one connection, answered out of order.
    let conn = Arc::new(conn);
    let mut tasks = Vec::new();
    for i in 0..64usize {
        let conn = conn.clone();
        tasks.push(tokio::spawn(async move {
            let (m, body) = push(i * 100);
            let r = conn.request(m, body.clone()).await.unwrap();
            let Body::Memory(b) = body else { return assert!(r.body.is_empty()) };
            assert_eq!(r.body, b);
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    // Counted once the last `sendfile` returns, which may be after the client has the bytes.
    eventually("three bodies counted", || server.stats.snapshot().sendfile_bytes >= 3 << 20).await;
    let s = server.stats.snapshot();
    assert_eq!(s.sendfile_bytes, 3 << 20);
    assert_eq!(s.connections_open, 1);
    drop(conn);
    server.stop().await;
}

/// A body sent in pieces (`Body::Memories`) arrives as their concatenation: pieces of many sizes,
/// more of them than one `writev` takes (IOV_MAX), on concurrent requests sharing the writer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_in_pieces_arrives_whole() {
    use bytes::Bytes;
    let server = TestServer::start(TestHandler::default(), ServerConfig::default()).await;
    let conn = Arc::new(Connection::connect(server.addr, &client_config()).await.unwrap());
    let mut tasks = Vec::new();
    for t in 0..4usize {
        let conn = conn.clone();
        tasks.push(tokio::spawn(async move {
            let (m, _) = push(0);
            let pieces: Vec<Bytes> = (0..1500 + t * 300)
                .map(|i| {
                    let len = [0, 1, 20, 700, 9000, 65536][(i + t) % 6];
                    Bytes::from((0..len).map(|j| (i * 31 + j * 7 + t) as u8).collect::<Vec<u8>>())
                })
                .collect();
            let want: Vec<u8> = pieces.concat();
            let body = Body::from(pieces);
            assert!(matches!(body, Body::Memories(_)));
            assert_eq!(body.len(), want.len() as u64);
            let reply = conn.request(m, body).await.unwrap();
            assert_eq!(reply.body.len(), want.len());
            assert!(reply.body[..] == want[..], "request {t}: the body came back changed");
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    drop(conn);
    server.stop().await;
}
