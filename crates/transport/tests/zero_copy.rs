//! File bodies: sendfile vs copy counters, tiny socket buffers, truncated files, peers leaving
//! mid-transfer.
mod utils;

use std::sync::Arc;

use sluice_proto::{ErrorCode, Message};
use sluice_transport::{Body, ClientConfig, Connection, FileRegion, ServerConfig, TransportError};
use utils::*;

async fn fetch_all(zero_copy: bool) -> sluice_transport::StatsSnapshot {
    let (file, data) = pattern_file(4 << 20);
    let handler = TestHandler {
        file: Some(Arc::new(file.reopen().unwrap())),
        chunk_bytes: 1 << 20,
        ..Default::default()
    };
    let server = TestServer::start(handler, ServerConfig { zero_copy, ..Default::default() }).await;
    let conn = Connection::connect(server.addr, &client_config()).await.unwrap();
    for i in 0..4u32 {
        let r = conn.request(fetch(i), Body::Empty).await.unwrap();
        assert_eq!(&r.body[..], &data[(i as usize) << 20..((i as usize) + 1) << 20]);
    }
    // The server counts a body once its last `sendfile` or write returns; the client may hold
    // the bytes first (a fresh-clone CI run read the counters 256 KiB short).
    eventually("all four bodies counted", || {
        let s = server.stats.snapshot();
        s.sendfile_bytes + s.copy_bytes == 4 << 20
    })
    .await;
    let s = server.stats.snapshot();
    drop(conn);
    server.stop().await;
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_copy_counters() {
    let s = fetch_all(true).await;
    assert_eq!(s.sendfile_bytes, 4 << 20);
    assert_eq!(s.copy_bytes, 0);
    assert_eq!(s.sendfile_fallbacks, 0);
    assert_eq!(s.writev_frames, 4, "heads went out with writev: {s:?}");

    let s = fetch_all(false).await;
    assert_eq!(s.sendfile_bytes, 0);
    assert_eq!(s.copy_bytes, 4 << 20);
}

/// A pattern file on the build disk (not a possibly memory-backed /tmp, whose pages cannot be
/// dropped) with none of its pages cached; `None` where `cachestat(2)` cannot tell.
fn cold_pattern_file(len: usize) -> Option<(tempfile::NamedTempFile, Vec<u8>, Arc<std::fs::File>)> {
    use std::os::fd::AsRawFd;
    let (file, data) = pattern_file_in(std::path::Path::new(env!("CARGO_TARGET_TMPDIR")), len);
    file.as_file().sync_all().unwrap();
    // The pages are clean after the sync, so the kernel drops them on this advice. (The whole
    // file: a large folio that straddles a smaller range would stay.)
    // SAFETY: plain syscall on an open descriptor.
    let r =
        unsafe { libc::posix_fadvise(file.as_file().as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(r, 0);
    let shared = Arc::new(file.reopen().unwrap());
    match FileRegion::new(shared.clone(), 0, len as u64).is_cached() {
        None => {
            eprintln!("cachestat(2) unavailable on this kernel: cold regions cannot be detected");
            None
        }
        Some(cached) => {
            assert!(!cached, "still cached after POSIX_FADV_DONTNEED");
            Some((file, data, shared))
        }
    }
}

/// A region that is not in the page cache is read in on the blocking pool before its frame is
/// queued, so the writer's `sendfile` on an async worker never waits on the disk; a cached one is
/// sent as it is. Both arrive intact through `sendfile`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_region_is_read_in_off_the_async_workers() {
    let Some((_file, data, shared)) = cold_pattern_file(4 << 20) else { return };
    let chunk1 = FileRegion::new(shared.clone(), 1 << 20, 1 << 20);
    assert_eq!(chunk1.is_cached(), Some(false));

    let handler = TestHandler { file: Some(shared), chunk_bytes: 1 << 20, ..Default::default() };
    let server = TestServer::start(handler, ServerConfig::default()).await;
    let conn = Connection::connect(server.addr, &client_config()).await.unwrap();
    // Cold, then cached.
    for _ in 0..2 {
        let r = conn.request(fetch(1), Body::Empty).await.unwrap();
        assert_eq!(&r.body[..], &data[1 << 20..2 << 20]);
    }
    // The writer counts a body once `sendfile` returns, which may be after the reader has it.
    eventually("both bodies counted", || server.stats.snapshot().sendfile_bytes == 2 << 20).await;
    let s = server.stats.snapshot();
    assert_eq!((s.file_regions_cold, s.file_regions_cold_bytes), (1, 1 << 20), "{s:?}");
    assert_eq!((s.sendfile_bytes, s.copy_bytes), (2 << 20, 0), "{s:?}");
    assert_eq!(chunk1.is_cached(), Some(true));
    drop(conn);
    server.stop().await;
}

/// `max_cold_reads` bounds the read-ins in flight: with 1, requests for several cold chunks at
/// once are read in one at a time, and every body still arrives intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cold_read_ins_are_bounded() {
    let Some((_file, data, shared)) = cold_pattern_file(8 << 20) else { return };
    let handler = TestHandler { file: Some(shared), chunk_bytes: 1 << 20, ..Default::default() };
    let cfg = ServerConfig { max_cold_reads: 1, ..Default::default() };
    let server = TestServer::start(handler, cfg).await;
    let conn = Arc::new(Connection::connect(server.addr, &client_config()).await.unwrap());
    // Every other chunk, so read-ahead of one does not warm the next asked for.
    let tasks: Vec<_> = [0u32, 2, 4, 6]
        .into_iter()
        .map(|i| {
            let conn = conn.clone();
            tokio::spawn(async move { (i, conn.request(fetch(i), Body::Empty).await.unwrap()) })
        })
        .collect();
    for t in tasks {
        let (i, r) = t.await.unwrap();
        assert_eq!(&r.body[..], &data[(i as usize) << 20..((i as usize) + 1) << 20]);
    }
    let s = server.stats.snapshot();
    assert!(s.file_regions_cold >= 2, "{s:?}");
    assert_eq!(s.file_regions_cold_reading_peak, 1, "{s:?}");
    assert_eq!(s.file_regions_cold_reading, 0, "{s:?}");
    drop(conn);
    server.stop().await;
}

/// Tiny SO_SNDBUF/SO_RCVBUF force many partial sendfile and writev calls; every byte must still
/// arrive in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiny_socket_buffers_many_partial_writes() {
    // (Kept small: with a 4 KiB send buffer each round trip may wait for a delayed ACK.)
    let len = 2 << 20;
    let (file, data) = pattern_file(len);
    let handler = TestHandler {
        file: Some(Arc::new(file.reopen().unwrap())),
        chunk_bytes: len as u64,
        ..Default::default()
    };
    let cfg = ServerConfig {
        send_buffer_bytes: Some(4096),
        recv_buffer_bytes: Some(4096),
        ..Default::default()
    };
    let server = TestServer::start(handler, cfg).await;
    let ccfg = ClientConfig {
        send_buffer_bytes: Some(4096),
        recv_buffer_bytes: Some(4096),
        // With 4 KiB buffers a busy machine can leave the sender in the kernel's zero-window
        // probe back-off for many seconds before the transfer resumes (seen: 19 s under load
        // 6, completing intact). The timeout only guards against a hang.
        request_timeout_ms: 60_000,
        ..client_config()
    };
    let conn = Connection::connect(server.addr, &ccfg).await.unwrap();

    let r = conn.request(fetch(0), Body::Empty).await.unwrap();
    assert_eq!(crc32c::crc32c(&r.body), crc32c::crc32c(&data));
    // A large memory body both ways (client writev → server, server writev → client).
    let (m, body) = push(1 << 20);
    let Body::Memory(sent) = body.clone() else { unreachable!() };
    let r = conn.request(m, body).await.unwrap();
    assert_eq!(crc32c::crc32c(&r.body), crc32c::crc32c(&sent));

    let s = server.stats.snapshot();
    assert_eq!(s.sendfile_bytes, len as u64);
    assert!(s.sendfile_calls > 50, "expected many partial sendfile calls: {s:?}");
    assert!(s.writev_calls > 20, "expected many partial writev calls: {s:?}");
    drop(conn);
    server.stop().await;
}

/// A region past the end of its file is answered with DATA_LOST before any byte of the frame
/// goes out; the connection stays usable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncated_file_answers_data_lost() {
    let (file, data) = pattern_file(3 << 20);
    let handler = TestHandler {
        file: Some(Arc::new(file.reopen().unwrap())),
        chunk_bytes: 1 << 20,
        ..Default::default()
    };
    let server = TestServer::start(handler, ServerConfig::default()).await;
    let conn = Connection::connect(server.addr, &client_config()).await.unwrap();
    // Shrink the file under the regions: chunk 2 is now past the end.
    file.as_file().set_len((2 << 20) + 100).unwrap();
    let err = conn.request(fetch(2), Body::Empty).await.unwrap_err();
    match err {
        TransportError::Remote { code: ErrorCode::DataLost, ref message } => {
            assert!(message.contains("past the end"))
        }
        other => panic!("expected DATA_LOST, got {other:?}"),
    }
    assert!(!conn.is_closed());
    let r = conn.request(fetch(1), Body::Empty).await.unwrap();
    assert_eq!(&r.body[..], &data[1 << 20..2 << 20]);
    assert_eq!(server.stats.snapshot().file_regions_truncated, 1);
    drop(conn);
    server.stop().await;
}

/// The file shrinks while its body is being sent: sendfile returns 0 mid-frame. The header is
/// already out, so the server must close the connection (not spin, not hang) and keep serving
/// others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_truncated_mid_sendfile_closes_connection() {
    let len = 8 << 20;
    for zero_copy in [true, false] {
        let (file, _) = pattern_file(len);
        let handler = TestHandler {
            file: Some(Arc::new(file.reopen().unwrap())),
            chunk_bytes: len as u64,
            ..Default::default()
        };
        let cfg = ServerConfig { zero_copy, send_buffer_bytes: Some(4096), ..Default::default() };
        let server = TestServer::start(handler, cfg).await;
        let mut raw = raw_connect(server.addr).await;
        raw.send(&sluice_proto::encode_frame(5, &fetch(0), &[])).await;
        // Read a little, so the server is mid-body, then cut the file.
        let mut got = 0;
        while got < 64 << 10 {
            use tokio::io::AsyncReadExt;
            let mut b = vec![0; 16 << 10];
            got += raw.stream.read(&mut b).await.unwrap();
        }
        file.as_file().set_len(1 << 20).unwrap();
        let total = got + raw.read_to_end().await;
        assert!(total < len, "the stream must end early, got {total}");
        eventually("connection closed", || server.stats.snapshot().connections_open == 0).await;
        // Other connections are unaffected.
        let conn = Connection::connect(server.addr, &client_config()).await.unwrap();
        let (m, body) = push(10);
        conn.request(m, body).await.unwrap();
        drop(conn);
        server.stop().await;
    }
}

/// The peer closes while a large file body is being sent: the writer sees the error, the
/// connection ends, nothing leaks, the server keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_closes_mid_sendfile() {
    let len = 32 << 20;
    let (file, data) = pattern_file(len);
    let handler = TestHandler {
        file: Some(Arc::new(file.reopen().unwrap())),
        chunk_bytes: len as u64,
        ..Default::default()
    };
    let cfg = ServerConfig { send_buffer_bytes: Some(64 << 10), ..Default::default() };
    let server = TestServer::start(handler, cfg).await;
    let mut raw = raw_connect(server.addr).await;
    raw.send(&sluice_proto::encode_frame(1, &fetch(0), &[])).await;
    {
        use tokio::io::AsyncReadExt;
        let mut b = vec![0; 64 << 10];
        raw.stream.read_exact(&mut b).await.unwrap();
    }
    drop(raw);
    eventually("connection closed", || server.stats.snapshot().connections_open == 0).await;
    eventually("handler told", || {
        server.handler.closed.load(std::sync::atomic::Ordering::SeqCst) == 1
    })
    .await;
    let s = server.stats.snapshot();
    assert!(s.sendfile_bytes < len as u64);
    assert_eq!(s.outbound_queued_bytes, 0);
    assert_eq!(s.outbound_queued_file_frames, 0);
    let conn = Connection::connect(server.addr, &client_config()).await.unwrap();
    let r = conn.request(fetch(0), Body::Empty).await.unwrap();
    assert_eq!(r.body.len(), data.len());
    assert!(matches!(r.message, Message::ChunkData(_)));
    drop(conn);
    server.stop().await;
}
