//! Per-application isolation with real processes (docs/security.md): a coordinator and a server
//! sharing a cluster key, two applications each with its own credential. One application's
//! connection asking for the other's data is refused with `UNAUTHORIZED`, request by request, and
//! the other's data reads back byte for byte; wrong, missing and replayed credentials are refused
//! at the handshake, and the server goes on serving.

mod utils;

use std::net::SocketAddr;

use bytes::{Bytes, BytesMut};
use sluice_proto::batch::put_batch;
use sluice_proto::message::*;
use sluice_proto::{encode_frame, ErrorCode, Message};
use sluice_transport::{app_credential, handshake_proof, ClientConfig, Connection, TransportError};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use utils::*;

const KEY: &str = "test-cluster-key-0123456789abcdef";
const A: &str = "app-alice";
const B: &str = "app-bob";

fn key_set() -> String {
    format!("transport.secret=\"{KEY}\"")
}

/// Transport settings of a connection proving `secret` for `app` ("" for the cluster).
fn as_app(app: &str, secret: &str) -> ClientConfig {
    ClientConfig { app_id: app.into(), secret: secret.into(), ..test_transport() }
}

async fn connect(addr: SocketAddr, app: &str, secret: &str) -> Result<Connection, TransportError> {
    Connection::connect(addr, &as_app(app, secret)).await
}

/// Sends a request without a body; the remote error's code and text.
async fn call_remote(conn: &Connection, msg: Message) -> Result<(), (ErrorCode, String)> {
    match conn.request(msg, sluice_transport::Body::from(Bytes::new())).await {
        Ok(_) => Ok(()),
        Err(TransportError::Remote { code, message }) => Err((code, message)),
        Err(e) => panic!("transport failure instead of an answer: {e}"),
    }
}

async fn connect_app(addr: SocketAddr, app: &str) -> Connection {
    connect(addr, app, &app_credential(KEY, app)).await.expect("an application's own credential")
}

/// Everything partition 0 of `app`'s shuffle 1 holds on the server: each chunk's bytes.
async fn read_back(c: &Connection, app: &str) -> Vec<Bytes> {
    let open = OpenStream {
        app_id: app.into(),
        shuffle_id: 1,
        partition_id: 0,
        map_start: 0,
        map_end: 2,
        attempts: vec![],
    };
    let Ok(Message::StreamHandle(h)) = call(c, open).await else { panic!("open stream") };
    let mut out = Vec::new();
    for i in 0..h.chunk_lengths.len() as u32 {
        let (_, body) =
            call_body(c, FetchChunk { stream_id: h.stream_id, chunk_index: i }, Bytes::new())
                .await
                .expect("fetch");
        out.push(body);
    }
    call(c, CloseStream { stream_id: h.stream_id }).await.expect("close");
    out
}

/// Registers `app` and its shuffle 1 (2 maps, 1 partition) on the server, pushes one batch per
/// map and commits.
async fn write_shuffle(c: &Connection, app: &str) {
    call(c, RegisterApp { app_id: app.into(), ..Default::default() }).await.unwrap();
    let reg = RegisterShuffle {
        app_id: app.into(),
        shuffle_id: 1,
        num_maps: 2,
        num_partitions: 1,
        replication: 1,
    };
    call(c, reg).await.unwrap();
    for map in 0..2 {
        let mut body = BytesMut::new();
        let records: Vec<_> = (0..50).map(|s| record(map, 0, s, 200)).collect();
        put_batch(&mut body, map, 0, 0, &framed(&records));
        let push = Push { app_id: app.into(), shuffle_id: 1, partition_id: 0 };
        call_body(c, push, body.freeze()).await.unwrap();
        let end = MapperEnd {
            app_id: app.into(),
            shuffle_id: 1,
            map_id: map,
            attempt_id: 0,
            batch_counts: vec![BatchCount { partition_id: 0, batches: 1 }],
        };
        call(c, end).await.unwrap();
    }
    call(c, CommitShuffle { app_id: app.into(), shuffle_id: 1 }).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_application_cannot_touch_another_applications_data() {
    bounded("an_application_cannot_touch_another_applications_data", 60, async {
        let scratch = Scratch::new();
        let coord = scratch.spawn(
            "coordinator",
            &[
                "coordinator",
                "--listen",
                "127.0.0.1:0",
                "--metrics-listen",
                "127.0.0.1:0",
                "--set",
                &key_set(),
            ]
            .map(String::from),
        );
        let server = scratch.server(&ServerSpec {
            coordinator: Some(coord.addr),
            metrics: true,
            sets: vec![key_set()],
            ..Default::default()
        });
        // The server heartbeats with the cluster key: the coordinator assigns to it only if it
        // took that (an application's credential may not register servers, see below).
        let cluster = as_app("", KEY);
        sluice_testkit::wait_registered(
            coord.addr,
            1,
            std::time::Duration::from_secs(20),
            &cluster,
        )
        .await
        .expect("the server registers with the coordinator using the cluster key");

        let alice = connect_app(server.addr, A).await;
        write_shuffle(&alice, A).await;
        let before = read_back(&alice, A).await;
        assert!(!before.is_empty() && before.iter().map(|b| b.len()).sum::<usize>() > 20_000);
        // Alice opens a stream and keeps it open: Bob must not read or close it by its id.
        let open = OpenStream {
            app_id: A.into(),
            shuffle_id: 1,
            partition_id: 0,
            map_start: 0,
            map_end: 2,
            attempts: vec![],
        };
        let Ok(Message::StreamHandle(alice_stream)) = call(&alice, open.clone()).await else {
            panic!("alice opens her stream")
        };

        let bob = connect_app(server.addr, B).await;
        call(&bob, RegisterApp { app_id: B.into(), ..Default::default() })
            .await
            .expect("bob registers himself");
        let mut body = BytesMut::new();
        put_batch(&mut body, 0, 0, 9, &framed(&[record(0, 0, 9, 300)]));
        let body = body.freeze();
        let refused_plain: Vec<(&str, Message)> = vec![
            ("open alice's stream", open.into()),
            (
                "end a map of alice's",
                MapperEnd {
                    app_id: A.into(),
                    shuffle_id: 1,
                    map_id: 0,
                    attempt_id: 1,
                    batch_counts: vec![],
                }
                .into(),
            ),
            ("commit alice's shuffle", CommitShuffle { app_id: A.into(), shuffle_id: 1 }.into()),
            (
                "re-register alice's shuffle",
                RegisterShuffle {
                    app_id: A.into(),
                    shuffle_id: 1,
                    num_maps: 1,
                    num_partitions: 1,
                    replication: 1,
                }
                .into(),
            ),
            (
                "unregister alice's shuffle",
                UnregisterShuffle { app_id: A.into(), shuffle_id: 1 }.into(),
            ),
            ("heartbeat for alice", AppHeartbeat { app_id: A.into() }.into()),
            ("unregister alice", UnregisterApp { app_id: A.into() }.into()),
        ];
        for (what, msg) in refused_plain {
            assert_eq!(call(&bob, msg).await, Err(ErrorCode::Unauthorized), "bob may not {what}");
        }
        let push = Push { app_id: A.into(), shuffle_id: 1, partition_id: 0 };
        let got = call_body(&bob, push, body.clone()).await.map(|_| ());
        assert_eq!(got, Err(ErrorCode::Unauthorized), "bob may not push into alice's shuffle");
        let merged = PushMerged {
            app_id: A.into(),
            shuffle_id: 1,
            entries: vec![Section { partition_id: 0, offset: 0, length: body.len() as u32 }],
        };
        let got = call_body(&bob, merged, body.clone()).await.map(|_| ());
        assert_eq!(got, Err(ErrorCode::Unauthorized), "bob may not push-merge into alice's");

        // Alice's open stream, by its id: refused exactly as a stream not open (no oracle of
        // which ids other applications hold open), and closing it is the no-op it is for a
        // stream not open; it stays open for alice (checked below).
        let closed_id = alice_stream.stream_id + 1_000_000;
        for id in [alice_stream.stream_id, closed_id] {
            let fetch = FetchChunk { stream_id: id, chunk_index: 0 };
            let got = call_remote(&bob, fetch.into()).await;
            assert_eq!(got, Err((ErrorCode::UnknownStream, format!("stream {id} is not open"))));
            let local = FetchChunkLocal { stream_id: id, chunk_index: 0 };
            let got = call_remote(&bob, local.into()).await;
            assert_eq!(got, Err((ErrorCode::UnknownStream, format!("stream {id} is not open"))));
            call(&bob, CloseStream { stream_id: id }).await.expect("a no-op, as for any id");
        }

        // Cluster-only requests: an application cannot pose as a server.
        let hb = ServerHeartbeat {
            server_id: "fake".into(),
            host: "127.0.0.1".into(),
            port: 1,
            memory_budget_bytes: 1 << 30,
            free_memory_bytes: 1 << 30,
            free_disk_bytes: 1 << 40,
            partitions_held: 0,
            push_bytes_per_s: 0,
            active_connections: 0,
        };
        let bob_coord = connect_app(coord.addr, B).await;
        assert_eq!(call(&bob_coord, hb).await, Err(ErrorCode::Unauthorized));
        for (what, msg) in [
            ("unregister alice", Message::from(UnregisterApp { app_id: A.into() })),
            ("look up alice's shuffle", GetAssignment { app_id: A.into(), shuffle_id: 1 }.into()),
            ("drop alice's shuffle", UnregisterShuffle { app_id: A.into(), shuffle_id: 1 }.into()),
        ] {
            let got = call(&bob_coord, msg).await;
            assert_eq!(got, Err(ErrorCode::Unauthorized), "bob may not {what} on the coordinator");
        }

        // Bob's connection is still good for Bob, and alice's stream still serves her.
        call(&bob, AppHeartbeat { app_id: B.into() }).await.expect("bob's own heartbeat");
        let (_, first) = call_body(
            &alice,
            FetchChunk { stream_id: alice_stream.stream_id, chunk_index: 0 },
            Bytes::new(),
        )
        .await
        .expect("alice's stream is still open");
        assert_eq!(first, before[0]);
        // Alice's data is intact, byte for byte, read over a new connection of hers.
        let again = connect_app(server.addr, A).await;
        assert_eq!(read_back(&again, A).await, before, "alice's data changed");

        let m = server.metrics().await;
        let refused = metric(&m, "sluice_server_requests_unauthorized_total");
        // 11 refused by the transport (all but the three stream requests, refused by the server).
        assert!(refused >= 9.0, "unauthorized requests counted: {refused}");

        // The coordinator counts like the servers: bob's four refused requests, then a
        // handshake with another application's credential.
        let m = coord.metrics().await;
        assert_eq!(metric(&m, "sluice_coordinator_requests_unauthorized_total"), 4.0);
        assert_eq!(metric(&m, "sluice_coordinator_handshakes_failed_total"), 0.0);
        match connect(coord.addr, A, &app_credential(KEY, B)).await {
            Err(TransportError::Remote { code, .. }) => assert_eq!(code, ErrorCode::AuthFailed),
            Err(e) => panic!("expected AUTH_FAILED, got {e}"),
            Ok(_) => panic!("the coordinator took bob's credential for alice"),
        }
        let m = coord.metrics().await;
        assert_eq!(metric(&m, "sluice_coordinator_handshakes_failed_total"), 1.0);
        assert_eq!(metric(&m, "sluice_coordinator_tls_handshakes_failed_total"), 0.0);
        assert!(metric(&m, "sluice_coordinator_connections_accepted_total") >= 3.0);
    })
    .await
}

/// Reads one frame from a raw socket: `(msg_type, request_id, fields and body)`; `None` at EOF.
async fn read_raw(s: &mut TcpStream) -> Option<Message> {
    let mut head = [0u8; 13];
    s.read_exact(&mut head).await.ok()?;
    let len = u32::from_be_bytes(head[0..4].try_into().unwrap()) as usize;
    let mut rest = vec![0u8; len - 13];
    s.read_exact(&mut rest).await.ok()?;
    let mut all = BytesMut::from(&head[..]);
    all.extend_from_slice(&rest);
    let f = sluice_proto::parse(&mut all, 1 << 20).ok()??;
    Some(f.message)
}

fn handshake_of(app: &str, client_nonce: &str) -> Message {
    Handshake {
        magic: MAGIC,
        version: PROTOCOL_VERSION,
        features: FEATURE_CRC32C,
        max_frame_bytes: 1 << 20,
        app_id: app.into(),
        client_nonce: client_nonce.into(),
    }
    .into()
}

fn error_code(m: Option<Message>) -> Option<ErrorCode> {
    match m {
        Some(Message::Error(e)) => ErrorCode::from_u16(e.code),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_missing_and_replayed_credentials_are_refused() {
    bounded("wrong_missing_and_replayed_credentials_are_refused", 60, async {
        let scratch = Scratch::new();
        let server = scratch.server(&ServerSpec {
            metrics: true,
            sets: vec![key_set()],
            ..Default::default()
        });
        let auth_failed = |r: Result<Connection, TransportError>| match r {
            Err(TransportError::Remote { code, message }) => {
                assert_eq!(code, ErrorCode::AuthFailed, "{message}");
                message
            }
            Err(e) => panic!("expected AUTH_FAILED, got {e}"),
            Ok(_) => panic!("expected AUTH_FAILED, got a connection"),
        };
        // Another application's credential, the cluster key as an application's credential, and
        // an application's credential claimed for the cluster identity.
        let text = auth_failed(connect(server.addr, A, &app_credential(KEY, B)).await);
        assert!(text.contains(A), "the refusal names the application: {text}");
        auth_failed(connect(server.addr, A, KEY).await);
        auth_failed(connect(server.addr, "", &app_credential(KEY, A)).await);
        auth_failed(connect(server.addr, A, &app_credential("another-cluster-key-0123", A)).await);
        // No credential configured: the client says so without a round of guessing.
        match connect(server.addr, A, "").await {
            Err(TransportError::Config(m)) => assert!(m.contains("requires authentication"), "{m}"),
            Err(e) => panic!("expected a configuration error, got {e}"),
            Ok(_) => panic!("connected without a credential"),
        }
        // A client that skips the proof: AUTH_FAILED, then the server closes the connection.
        let mut s = TcpStream::connect(server.addr).await.unwrap();
        s.write_all(&encode_frame(0, &handshake_of(A, "n"), &[])).await.unwrap();
        assert!(matches!(read_raw(&mut s).await, Some(Message::AuthChallenge(_))));
        s.write_all(&encode_frame(1, &Ping {}.into(), &[])).await.unwrap();
        assert_eq!(error_code(read_raw(&mut s).await), Some(ErrorCode::AuthFailed));
        assert!(read_raw(&mut s).await.is_none(), "the connection is closed");

        // Alice's genuine handshake, recorded, then replayed on a new connection by someone who
        // does not know her credential: the server's new nonce makes the recorded proof wrong.
        let cred = app_credential(KEY, A);
        let hello = encode_frame(0, &handshake_of(A, "alice-nonce"), &[]);
        let mut s = TcpStream::connect(server.addr).await.unwrap();
        s.write_all(&hello).await.unwrap();
        let Some(Message::AuthChallenge(c)) = read_raw(&mut s).await else { panic!("challenge") };
        let proof = handshake_proof(&cred, A, &c.server_nonce, "alice-nonce");
        let proof_frame = encode_frame(1, &AuthProof { proof }.into(), &[]);
        s.write_all(&proof_frame).await.unwrap();
        assert!(matches!(read_raw(&mut s).await, Some(Message::HandshakeOk(_))), "genuine");
        drop(s);
        let mut replay = TcpStream::connect(server.addr).await.unwrap();
        replay.write_all(&hello).await.unwrap();
        let Some(Message::AuthChallenge(c2)) = read_raw(&mut replay).await else { panic!() };
        assert_ne!(c2.server_nonce, c.server_nonce, "a nonce is never sent twice");
        replay.write_all(&proof_frame).await.unwrap();
        assert_eq!(error_code(read_raw(&mut replay).await), Some(ErrorCode::AuthFailed));
        assert!(read_raw(&mut replay).await.is_none(), "the replaying connection is closed");

        // The server keeps serving: alice with her credential, the cluster with its key.
        let alice = connect_app(server.addr, A).await;
        write_shuffle(&alice, A).await;
        assert!(!read_back(&alice, A).await.is_empty());
        let ops = connect(server.addr, "", KEY).await.expect("the cluster key");
        call(&ops, Ping {}).await.expect("ping");
        let failed = metric(&server.metrics().await, "sluice_server_handshakes_failed_total");
        assert!(failed >= 6.0, "failed handshakes counted: {failed}");
    })
    .await
}
