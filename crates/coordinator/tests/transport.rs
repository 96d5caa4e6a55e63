//! A real coordinator on 127.0.0.1 port 0, spoken to over TCP: what bad requests get, and that
//! it keeps serving after them.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_coordinator::{Coordinator, CoordinatorConfig};
use sluice_proto::message::{
    Handshake, Push, RegisterShuffle, ServerHeartbeat, MAGIC, PROTOCOL_VERSION,
};
use sluice_proto::{encode_frame, ErrorCode, Message};
use sluice_transport::{Body, ClientConfig, Connection, FrameReader, TransportError};
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A coordinator serving on a port of its own until dropped.
struct Running {
    addr: SocketAddr,
    coordinator: Arc<Coordinator>,
    _stop: oneshot::Sender<()>,
    _task: JoinHandle<std::io::Result<()>>,
}

async fn start(config: CoordinatorConfig) -> Running {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let coordinator = Coordinator::new(config).unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(coordinator.clone().serve(listener, async {
        let _ = stopped.await;
    }));
    Running { addr, coordinator, _stop: stop, _task: task }
}

/// A client that writes frames by hand (a `Push` to a coordinator is not something the
/// native client would send) and reads the answers.
struct RawClient {
    wr: OwnedWriteHalf,
    rd: FrameReader,
}

impl RawClient {
    async fn connect(addr: SocketAddr) -> RawClient {
        let (rd, wr) = TcpStream::connect(addr).await.unwrap().into_split();
        let mut c = RawClient { wr, rd: FrameReader::new(rd, 64 << 20, None) };
        let hs = Handshake {
            magic: MAGIC,
            version: PROTOCOL_VERSION,
            features: 0,
            max_frame_bytes: 64 << 20,
            app_id: String::new(),
            client_nonce: String::new(),
        };
        let (_, reply) = c.ask(0, &hs.into(), &[]).await;
        assert!(matches!(reply, Message::HandshakeOk(_)), "{reply:?}");
        c
    }

    /// Sends one frame and reads the next answer (request id, message).
    async fn ask(&mut self, request_id: u32, m: &Message, body: &[u8]) -> (u32, Message) {
        self.wr.write_all(&encode_frame(request_id, m, body)).await.unwrap();
        let next = tokio::time::timeout(Duration::from_secs(10), self.rd.read_head());
        let (h, reply) = next.await.expect("an answer in time").unwrap().expect("an answer");
        let body = self.rd.read_body(h.body_len()).await.unwrap();
        assert!(body.is_empty());
        (h.request_id, reply)
    }
}

fn heartbeat(server_id: &str, port: u16) -> Message {
    ServerHeartbeat {
        server_id: server_id.into(),
        host: "127.0.0.1".into(),
        port,
        memory_budget_bytes: 1 << 30,
        free_memory_bytes: 1 << 30,
        free_disk_bytes: 1 << 40,
        ..Default::default()
    }
    .into()
}

fn register(shuffle_id: u32, num_partitions: u32) -> Message {
    RegisterShuffle {
        app_id: "app".into(),
        shuffle_id,
        num_maps: 4,
        num_partitions,
        replication: 1,
    }
    .into()
}

fn expect_error(m: &Message, code: ErrorCode) -> String {
    match m {
        Message::Error(e) if e.code == code.as_u16() => e.message.clone(),
        other => panic!("expected {code}, got {other:?}"),
    }
}

/// A `Push` (meant for a server) sent to a coordinator: refused before its 32 MiB body is read
/// (the transport counts it discarded, not read into a buffer), and the same connection goes
/// on with the next request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_to_a_coordinator_is_refused_before_its_body_is_read() {
    let c = start(CoordinatorConfig::default()).await;
    let mut raw = RawClient::connect(c.addr).await;
    let push: Message = Push { app_id: "app".into(), shuffle_id: 1, partition_id: 0 }.into();
    let body = vec![7u8; 32 << 20];
    let (id, reply) = raw.ask(5, &push, &body).await;
    assert_eq!(id, 5);
    let text = expect_error(&reply, ErrorCode::InvalidRequest);
    assert!(text.contains("a coordinator does not take Push"), "{text}");
    let stats = c.coordinator.transport_stats();
    assert_eq!(stats.bodies_rejected, 1, "the body was discarded unread: {stats:?}");
    // The connection is in step: the next request is answered.
    let (id, reply) = raw.ask(6, &heartbeat("s1", 7001), &[]).await;
    assert_eq!(id, 6);
    assert!(matches!(reply, Message::Ok(_)), "{reply:?}");
    assert_eq!(c.coordinator.transport_stats().protocol_errors, 0);
}

/// `num_partitions = u32::MAX` (or anything over `max_partitions_per_shuffle`) is refused at
/// once with `INVALID_REQUEST` naming the limit; the coordinator goes on serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_registration_is_refused_and_the_coordinator_keeps_serving() {
    let c = start(CoordinatorConfig::default()).await;
    let cfg = ClientConfig { request_timeout_ms: 10_000, ..Default::default() };
    let conn = Connection::connect(c.addr, &cfg).await.unwrap();
    conn.request(heartbeat("s1", 7001), Body::Empty).await.unwrap();
    let t = Instant::now();
    for too_many in [u32::MAX, 262_145] {
        match conn.request(register(1, too_many), Body::Empty).await {
            Err(TransportError::Remote { code: ErrorCode::InvalidRequest, message }) => {
                assert!(
                    message.contains(&format!(
                        "num_partitions {too_many} exceeds this coordinator's \
                         max_partitions_per_shuffle (262144)"
                    )),
                    "{message}"
                );
            }
            other => panic!("not refused: {other:?}"),
        }
    }
    assert!(t.elapsed() < Duration::from_secs(2), "refused at once: {:?}", t.elapsed());
    let reply = conn.request(register(1, 262_144), Body::Empty).await.unwrap();
    let Message::Assignment(a) = reply.message else { panic!("{:?}", reply.message) };
    assert_eq!(a.partitions.len(), 262_144);
    // Another connection is served too.
    let other = Connection::connect(c.addr, &cfg).await.unwrap();
    let reply = other.request(register(2, 8), Body::Empty).await.unwrap();
    assert!(matches!(reply.message, Message::Assignment(_)), "{:?}", reply.message);
}
