//! A slow reader meets the outbound watermarks: the server stops producing instead of
//! buffering, and a peer that stops reading altogether is dropped.
mod utils;

use std::sync::Arc;
use std::time::Duration;

use sluice_proto::Message;
use sluice_transport::ServerConfig;
use utils::*;

const CHUNK: usize = 256 << 10;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_reader_keeps_server_memory_bounded() {
    let handler = TestHandler { chunk_bytes: CHUNK as u64, ..Default::default() };
    let cfg = ServerConfig {
        outbound_high_watermark_bytes: 1 << 20,
        outbound_low_watermark_bytes: 512 << 10,
        max_inflight_requests_per_connection: 8,
        send_buffer_bytes: Some(64 << 10),
        ..Default::default()
    };
    let server = TestServer::start(handler, cfg).await;
    let mut raw = raw_connect_with(server.addr, Some(16 << 10)).await;
    let n = 200u32;
    let mut requests = Vec::new();
    for i in 0..n {
        requests.extend_from_slice(&sluice_proto::encode_frame(i, &fetch(i), &[]));
    }
    // Send everything without reading anything (the requests are small; a writer task so a
    // full server receive window cannot block the test).
    let (rd, mut wr) = raw.stream.into_split();
    let sender = tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        wr.write_all(&requests).await.unwrap();
        wr
    });
    eventually("producers waiting at the high watermark", || {
        server.stats.snapshot().outbound_waits > 0
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let bound = (1 << 20) + 8 * (CHUNK + 64);
    let s = server.stats.snapshot();
    assert!(s.outbound_queued_bytes as usize <= bound, "{s:?}");
    assert!(s.outbound_queued_bytes_peak as usize <= bound, "{s:?}");
    assert!(s.frames_received < n as u64, "the server stopped reading requests: {s:?}");

    // Now read everything: all responses arrive, intact.
    let wr = sender.await.unwrap();
    raw.stream = rd.reunite(wr).unwrap();
    let mut seen = vec![false; n as usize];
    for _ in 0..n {
        let (id, m, body) = raw.read_frame().await.expect("a response");
        assert!(matches!(m, Message::ChunkData(_)));
        assert_eq!(body.len(), CHUNK);
        assert!(body.iter().all(|b| *b == id as u8));
        seen[id as usize] = true;
    }
    assert!(seen.iter().all(|s| *s));
    let s = server.stats.snapshot();
    assert!(s.outbound_queued_bytes_peak as usize <= bound, "{s:?}");
    assert_eq!(s.outbound_queued_bytes, 0);
    drop(raw);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_file_frames_are_bounded() {
    let (file, _) = pattern_file(64 << 20);
    let handler = TestHandler {
        file: Some(Arc::new(file.reopen().unwrap())),
        chunk_bytes: 512 << 10,
        ..Default::default()
    };
    let cfg = ServerConfig {
        outbound_max_file_frames: 4,
        max_inflight_requests_per_connection: 16,
        send_buffer_bytes: Some(64 << 10),
        ..Default::default()
    };
    let server = TestServer::start(handler, cfg).await;
    let mut raw = raw_connect_with(server.addr, Some(16 << 10)).await;
    let mut requests = Vec::new();
    for i in 0..100u32 {
        requests.extend_from_slice(&sluice_proto::encode_frame(i, &fetch(i), &[]));
    }
    raw.send(&requests).await;
    eventually("producers waiting", || server.stats.snapshot().outbound_waits > 0).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let s = server.stats.snapshot();
    assert!(s.outbound_queued_file_frames <= 4 + 16, "{s:?}");
    for _ in 0..100 {
        raw.read_frame().await.expect("a response");
    }
    drop(raw);
    server.stop().await;
}

/// A peer that stops reading is dropped after the idle timeout, and its queue is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_peer_is_dropped() {
    let handler = TestHandler { chunk_bytes: CHUNK as u64, ..Default::default() };
    let cfg = ServerConfig {
        idle_timeout_ms: 300,
        send_buffer_bytes: Some(64 << 10),
        ..Default::default()
    };
    let server = TestServer::start(handler, cfg).await;
    let mut raw = raw_connect_with(server.addr, Some(16 << 10)).await;
    let mut requests = Vec::new();
    for i in 0..64u32 {
        requests.extend_from_slice(&sluice_proto::encode_frame(i, &fetch(i), &[]));
    }
    raw.send(&requests).await;
    eventually("stalled connection dropped", || server.stats.snapshot().connections_stalled == 1)
        .await;
    eventually("connection closed", || server.stats.snapshot().connections_open == 0).await;
    eventually("queue released", || server.stats.snapshot().outbound_queued_bytes == 0).await;
    drop(raw);
    server.stop().await;
}

/// Pings from a peer that never reads the pongs meet the watermarks too: the server stops
/// reading them once its queue is full, instead of queueing a pong for each without end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pings_never_read_keep_server_memory_bounded() {
    let cfg = ServerConfig {
        outbound_high_watermark_bytes: 64 << 10,
        outbound_low_watermark_bytes: 32 << 10,
        send_buffer_bytes: Some(16 << 10),
        idle_timeout_ms: 0,
        shutdown_grace_ms: 200,
        ..Default::default()
    };
    let server = TestServer::start(TestHandler::default(), cfg).await;
    let raw = raw_connect_with(server.addr, Some(16 << 10)).await;
    let ping = Message::Ping(sluice_proto::message::Ping {});
    let mut pings = Vec::new();
    for i in 0..200_000u32 {
        pings.extend_from_slice(&sluice_proto::encode_frame(i, &ping, &[]));
    }
    let (_rd, mut wr) = raw.stream.into_split();
    let sender = tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        let _ = wr.write_all(&pings).await;
        wr
    });
    eventually("pongs waiting at the high watermark", || {
        server.stats.snapshot().outbound_waits > 0
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let s = server.stats.snapshot();
    // The watermark and a pong over it (the socket's buffers hold more pongs, not the queue).
    assert!(s.outbound_queued_bytes_peak <= (64 << 10) + 1024, "{s:?}");
    assert!(s.frames_received < 200_000, "the server kept reading pings: {s:?}");
    // Stopping, the server does not wait on a peer that never reads past its grace period: the
    // connection and its queue go.
    let stats = server.stats.clone();
    server.stop().await;
    assert_eq!(stats.snapshot().outbound_queued_bytes, 0);
    sender.abort();
}
