//! Shared test harness: a real server on 127.0.0.1 port 0 with a scriptable handler.
#![allow(dead_code)]

use std::fs::File;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use sluice_proto::message::{ChunkData, FetchChunk, PushAck};
use sluice_proto::{ErrorCode, Message};
use sluice_transport::{
    serve, Admission, Body, ClientConfig, ConnInfo, FileRegion, Handler, Request, Response,
    ServerConfig, TransportStats,
};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// What the test handler does:
/// - `Push`: answers `ChunkData` echoing the body from memory (after `delay`).
/// - `FetchChunk{chunk_index}`: answers `ChunkData` with the file region
///   `[chunk_index*chunk_bytes, +chunk_bytes)` of `file`, or without a file `chunk_bytes` bytes
///   of value `chunk_index as u8` from memory.
/// - `Ping` never reaches it (the transport answers).
#[derive(Default)]
pub struct TestHandler {
    pub file: Option<Arc<File>>,
    pub chunk_bytes: u64,
    pub delay: Option<Duration>,
    /// Reject bodies larger than this with `Busy`.
    pub reject_above: Option<u32>,
    pub closed: AtomicUsize,
}

impl Handler for TestHandler {
    type Permit = ();

    fn admit(&self, _conn: &ConnInfo, _message: &Message, body_len: u32) -> Admission<()> {
        match self.reject_above {
            Some(max) if body_len > max => {
                Admission::Reject(Message::Busy(sluice_proto::message::Busy { backoff_ms: 7 }))
            }
            _ => Admission::Accept(()),
        }
    }

    fn handle(
        &self,
        _conn: &Arc<ConnInfo>,
        req: Request,
    ) -> impl std::future::Future<Output = Response> + Send + 'static {
        let delay = self.delay;
        let file = self.file.clone();
        let chunk = self.chunk_bytes;
        async move {
            if let Some(d) = delay {
                tokio::time::sleep(d).await;
            }
            match req.message {
                Message::Push(_) => Response::with_body(
                    ChunkData { stream_id: 1, chunk_index: 0 },
                    Body::from(req.body),
                ),
                Message::FetchChunk(FetchChunk { stream_id, chunk_index }) => match file {
                    Some(f) => Response::with_body(
                        ChunkData { stream_id, chunk_index },
                        Body::File(FileRegion::new(f, chunk_index as u64 * chunk, chunk)),
                    ),
                    None => Response::with_body(
                        ChunkData { stream_id, chunk_index },
                        Bytes::from(vec![chunk_index as u8; chunk as usize]),
                    ),
                },
                Message::AppHeartbeat(_) => Response::msg(PushAck {}),
                _ => Response::error(ErrorCode::InvalidRequest, "unexpected"),
            }
        }
    }

    fn connection_closed(&self, _conn: &ConnInfo) {
        self.closed.fetch_add(1, Ordering::SeqCst);
    }
}

pub struct TestServer {
    pub addr: SocketAddr,
    pub stats: Arc<TransportStats>,
    pub handler: Arc<TestHandler>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<std::io::Result<()>>>,
}

impl TestServer {
    pub async fn start(handler: TestHandler, config: ServerConfig) -> TestServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        Self::start_on(listener, handler, config).await
    }

    pub async fn start_on(
        listener: TcpListener,
        handler: TestHandler,
        config: ServerConfig,
    ) -> TestServer {
        let addr = listener.local_addr().unwrap();
        let stats = Arc::new(TransportStats::default());
        let handler = Arc::new(handler);
        let (tx, rx) = oneshot::channel();
        let task = tokio::spawn(serve(listener, handler.clone(), config, stats.clone(), async {
            let _ = rx.await;
        }));
        TestServer { addr, stats, handler, stop: Some(tx), task: Some(task) }
    }

    pub async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        tokio::time::timeout(Duration::from_secs(10), self.task.take().unwrap())
            .await
            .expect("server stops in time")
            .unwrap()
            .unwrap();
    }
}

pub fn client_config() -> ClientConfig {
    ClientConfig { request_timeout_ms: 10_000, app_id: "app-1".into(), ..Default::default() }
}

pub fn push(body_len: usize) -> (Message, Body) {
    let body: Vec<u8> = (0..body_len).map(|i| (i * 31 % 251) as u8).collect();
    let m = Message::Push(sluice_proto::message::Push {
        app_id: "app-1".into(),
        shuffle_id: 1,
        partition_id: 2,
    });
    (m, Body::Memory(Bytes::from(body)))
}

pub fn fetch(chunk_index: u32) -> Message {
    Message::FetchChunk(FetchChunk { stream_id: 9, chunk_index })
}

/// A temp file of `len` bytes with a position-dependent pattern.
pub fn pattern_file(len: usize) -> (tempfile::NamedTempFile, Vec<u8>) {
    pattern_file_in(&std::env::temp_dir(), len)
}

/// [`pattern_file`] in `dir`.
pub fn pattern_file_in(dir: &std::path::Path, len: usize) -> (tempfile::NamedTempFile, Vec<u8>) {
    use std::io::Write;
    let data: Vec<u8> = (0..len).map(|i| ((i / 7) ^ (i % 253)) as u8).collect();
    let mut f = tempfile::NamedTempFile::new_in(dir).unwrap();
    f.write_all(&data).unwrap();
    f.flush().unwrap();
    (f, data)
}

/// Bounded wait for a condition polled every few ms.
pub async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..1000 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for {what}");
}

/// A raw client socket that has completed the handshake (for sending what `Connection` never
/// would).
pub async fn raw_connect(addr: SocketAddr) -> RawPeer {
    raw_connect_with(addr, None).await
}

/// [`raw_connect`] with a given SO_RCVBUF (set before connecting).
pub async fn raw_connect_with(addr: SocketAddr, recv_buffer_bytes: Option<u32>) -> RawPeer {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    if let Some(n) = recv_buffer_bytes {
        socket.set_recv_buffer_size(n).unwrap();
    }
    let stream = socket.connect(addr).await.unwrap();
    let mut peer = RawPeer { stream, buf: bytes::BytesMut::new() };
    peer.send(&handshake(sluice_proto::message::PROTOCOL_VERSION, sluice_proto::message::MAGIC))
        .await;
    let (_, m, _) = peer.read_frame().await.expect("handshake reply");
    assert!(matches!(m, Message::HandshakeOk(_)), "{m:?}");
    peer
}

pub fn handshake(version: u16, magic: u32) -> Vec<u8> {
    let hs = sluice_proto::message::Handshake {
        magic,
        version,
        features: 1,
        max_frame_bytes: 64 << 20,
        app_id: "raw".into(),
        client_nonce: String::new(),
    };
    sluice_proto::encode_frame(0, &Message::Handshake(hs), &[]).to_vec()
}

pub struct RawPeer {
    pub stream: tokio::net::TcpStream,
    pub buf: bytes::BytesMut,
}

impl RawPeer {
    pub async fn send(&mut self, bytes: &[u8]) {
        use tokio::io::AsyncWriteExt;
        self.stream.write_all(bytes).await.unwrap();
    }

    /// The next frame, or `None` at EOF / reset.
    pub async fn read_frame(&mut self) -> Option<(u32, Message, Bytes)> {
        use tokio::io::AsyncReadExt;
        loop {
            if let Some(f) = sluice_proto::parse(&mut self.buf, u32::MAX).unwrap() {
                return Some((f.request_id, f.message, f.body));
            }
            match tokio::time::timeout(Duration::from_secs(10), self.stream.read_buf(&mut self.buf))
                .await
            {
                Ok(Ok(0)) | Ok(Err(_)) => return None,
                Ok(Ok(_)) => {}
                Err(_) => panic!("no frame within 10 s"),
            }
        }
    }

    /// Reads until EOF (or reset), returning the byte count.
    pub async fn read_to_end(&mut self) -> usize {
        use tokio::io::AsyncReadExt;
        let mut n = self.buf.len();
        let mut scratch = vec![0u8; 1 << 16];
        loop {
            match tokio::time::timeout(Duration::from_secs(10), self.stream.read(&mut scratch))
                .await
            {
                Ok(Ok(0)) | Ok(Err(_)) => return n,
                Ok(Ok(k)) => n += k,
                Err(_) => panic!("no EOF within 10 s"),
            }
        }
    }
}

pub fn expect_error(m: &Message, code: ErrorCode) {
    match m {
        Message::Error(e) => assert_eq!(e.code, code.as_u16(), "{e:?}"),
        other => panic!("expected {code}, got {other:?}"),
    }
}
