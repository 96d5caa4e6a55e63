//! Error codes a real server answers with (`docs/protocol.md`, "Error codes"), and that it keeps
//! serving afterwards: request errors leave the connection open, fatal ones close it and only it.

mod utils;

use std::net::SocketAddr;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use sluice_proto::batch::put_batch;
use sluice_proto::message::*;
use sluice_proto::{encode_frame, ErrorCode, Message};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use utils::*;

const APP: &str = "errors-app";

fn batch_body(map: u32, seq: u32) -> Bytes {
    let mut b = BytesMut::new();
    put_batch(&mut b, map, 0, seq, &framed(&[record(map, 0, seq, 64)]));
    b.freeze()
}

fn push(app: &str, shuffle: u32, partition: u32) -> Push {
    Push { app_id: app.into(), shuffle_id: shuffle, partition_id: partition }
}

/// A server still answers a fresh connection: Ping, and a push to a good shuffle.
async fn still_serving(addr: SocketAddr) {
    let c = raw(addr).await;
    assert!(matches!(call(&c, Ping {}).await, Ok(Message::Pong(_))));
    let (m, _) = call_body(&c, push(APP, 1, 0), batch_body(9, 0)).await.expect("good push");
    assert!(matches!(m, Message::PushAck(_)), "{m:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_errors_leave_the_connection_open() {
    bounded("request_errors_leave_the_connection_open", 30, async {
        let scratch = Scratch::new();
        let server = scratch.server(&ServerSpec::default());
        let c = raw(server.addr).await;
        call(&c, RegisterApp { app_id: APP.into(), ..Default::default() }).await.unwrap();
        for shuffle in [1, 2] {
            let reg = RegisterShuffle {
                app_id: APP.into(),
                shuffle_id: shuffle,
                num_maps: 10,
                num_partitions: 2,
                replication: 1,
            };
            call(&c, reg).await.unwrap();
        }

        // Every check runs on the same connection: none of these errors is fatal.
        let e = call_body(&c, push("ghost-app", 1, 0), batch_body(0, 0)).await;
        assert_eq!(e.err(), Some(ErrorCode::UnknownApp), "push for an unknown app");
        let e = call_body(&c, push(APP, 77, 0), batch_body(0, 0)).await;
        assert_eq!(e.err(), Some(ErrorCode::UnknownShuffle), "push to an unregistered shuffle");
        let e = call_body(&c, push(APP, 2, 5), batch_body(0, 0)).await;
        assert_eq!(e.err(), Some(ErrorCode::InvalidRequest), "push to partition ≥ partitions");
        let e = call_body(&c, push(APP, 2, 0), batch_body(10, 0)).await;
        assert_eq!(e.err(), Some(ErrorCode::InvalidRequest), "a batch of map ≥ maps");
        let end = MapperEnd {
            app_id: APP.into(),
            shuffle_id: 1,
            map_id: 0,
            attempt_id: 0,
            batch_counts: vec![BatchCount { partition_id: 7, batches: 1 }],
        };
        assert_eq!(
            call(&c, end).await.err(),
            Some(ErrorCode::InvalidRequest),
            "map end of partition ≥ partitions"
        );
        // Registrations past the server's bounds are refused before anything is allocated
        // (u32::MAX partitions would be ~900 GB of partition state).
        for (num_maps, num_partitions) in [(10, u32::MAX), (10, 262_145), (u32::MAX, 2)] {
            let reg = RegisterShuffle {
                app_id: APP.into(),
                shuffle_id: 3,
                num_maps,
                num_partitions,
                replication: 1,
            };
            let e = call(&c, reg).await;
            assert_eq!(
                e.err(),
                Some(ErrorCode::InvalidRequest),
                "{num_maps} maps × {num_partitions}"
            );
        }

        let open = |shuffle, map_end| OpenStream {
            app_id: APP.into(),
            shuffle_id: shuffle,
            partition_id: 0,
            map_start: 0,
            map_end,
            attempts: vec![],
        };
        assert_eq!(call(&c, open(2, 10)).await.err(), Some(ErrorCode::ShuffleNotCommitted));

        // A bad CRC rejects the whole push, even with a good section beside it.
        let mut body = BytesMut::new();
        body.extend_from_slice(&batch_body(1, 0));
        let good_len = body.len() as u32;
        let mut bad = BytesMut::from(&batch_body(1, 1)[..]);
        let last = bad.len() - 1;
        bad[last] ^= 0x55; // payload byte flipped after the CRC was computed
        body.extend_from_slice(&bad);
        let merged = PushMerged {
            app_id: APP.into(),
            shuffle_id: 2,
            entries: vec![
                Section { partition_id: 0, offset: 0, length: good_len },
                Section { partition_id: 1, offset: good_len, length: bad.len() as u32 },
            ],
        };
        let e = call_body(&c, merged, body.freeze()).await;
        assert_eq!(e.err(), Some(ErrorCode::ChecksumMismatch), "batch with a bad CRC");
        let e = call_body(&c, push(APP, 2, 1), bad.clone().freeze()).await;
        assert_eq!(e.err(), Some(ErrorCode::ChecksumMismatch), "Push with a bad CRC");

        // Maps 0..9 of shuffle 2 end (with no output); map 9 never does.
        for map_id in 0..9 {
            let end = MapperEnd {
                app_id: APP.into(),
                shuffle_id: 2,
                map_id,
                attempt_id: 0,
                batch_counts: vec![],
            };
            assert!(matches!(call(&c, end).await, Ok(Message::MapperEndResult(_))));
        }
        // Commit shuffle 2: nothing of the rejected pushes was stored.
        match call(&c, CommitShuffle { app_id: APP.into(), shuffle_id: 2 }).await {
            Ok(Message::CommitResult(r)) => assert!(r.partitions.is_empty(), "stored: {r:?}"),
            other => panic!("commit: {other:?}"),
        }
        let e = call_body(&c, push(APP, 2, 0), batch_body(0, 0)).await;
        assert_eq!(e.err(), Some(ErrorCode::ShuffleCommitted), "push after commit");
        let late_end = MapperEnd {
            app_id: APP.into(),
            shuffle_id: 2,
            map_id: 9,
            attempt_id: 0,
            batch_counts: vec![],
        };
        assert_eq!(call(&c, late_end).await.err(), Some(ErrorCode::ShuffleCommitted));

        // A range holding map 9 cannot be served as complete; one without it can.
        assert_eq!(call(&c, open(2, 10)).await.err(), Some(ErrorCode::DataLost));
        let h = match call(&c, open(2, 9)).await {
            Ok(Message::StreamHandle(h)) => h,
            other => panic!("OpenStream after commit: {other:?}"),
        };
        assert!(h.chunk_lengths.is_empty() && h.committed.is_empty(), "{h:?}");
        let fetch = FetchChunk { stream_id: h.stream_id, chunk_index: 0 };
        assert_eq!(call(&c, fetch).await.err(), Some(ErrorCode::ChunkOutOfRange));
        let fetch = FetchChunk { stream_id: h.stream_id ^ 0xDEAD_BEEF, chunk_index: 0 };
        assert_eq!(call(&c, fetch).await.err(), Some(ErrorCode::UnknownStream));
        call(&c, CloseStream { stream_id: h.stream_id }).await.unwrap();
        let fetch = FetchChunk { stream_id: h.stream_id, chunk_index: 0 };
        assert_eq!(call(&c, fetch).await.err(), Some(ErrorCode::UnknownStream), "after close");

        // Still the same connection, still answering; and others too.
        assert!(matches!(call(&c, Ping {}).await, Ok(Message::Pong(_))));
        assert!(!c.is_closed());
        still_serving(server.addr).await;
    })
    .await
}

/// A raw socket after a good handshake.
async fn handshaken(addr: SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let hs = Handshake {
        magic: MAGIC,
        version: PROTOCOL_VERSION,
        features: FEATURE_CRC32C,
        max_frame_bytes: 1 << 20,
        app_id: APP.into(),
        client_nonce: String::new(),
    };
    s.write_all(&encode_frame(1, &hs.into(), &[])).await.unwrap();
    match read_frame(&mut s).await {
        Some((1, Message::HandshakeOk(ok))) => assert_eq!(ok.max_frame_bytes, 1 << 20),
        other => panic!("handshake: {other:?}"),
    }
    s
}

/// Reads one frame (≤ 5 s); `None` at end of stream.
async fn read_frame(s: &mut TcpStream) -> Option<(u32, Message)> {
    let mut buf = BytesMut::new();
    bounded("reading a frame", 5, async {
        loop {
            if let Some(f) = sluice_proto::parse(&mut buf, 64 << 20).expect("server frames parse") {
                return Some((f.request_id, f.message));
            }
            if s.read_buf(&mut buf).await.ok()? == 0 {
                return None;
            }
        }
    })
    .await
}

/// Sends `bytes` after a handshake; expects an `Error` with one of `codes`, then the close.
async fn expect_fatal(addr: SocketAddr, what: &str, bytes: &[u8], codes: &[ErrorCode]) {
    let mut s = handshaken(addr).await;
    s.write_all(bytes).await.unwrap();
    match read_frame(&mut s).await {
        Some((_, Message::Error(e))) => {
            let code = ErrorCode::from_u16(e.code);
            assert!(
                code.is_some_and(|c| codes.contains(&c)),
                "{what}: got error {} ({}), want one of {codes:?}",
                e.code,
                e.message
            );
            assert_eq!(e.retriable, 0, "{what}: fatal errors are not retriable");
        }
        other => panic!("{what}: want an Error frame, got {other:?}"),
    }
    // Then the server closes the connection (it may first drain what we sent).
    let closed = bounded(what, 5, async {
        let mut sink = [0u8; 4096];
        loop {
            match s.read(&mut sink).await {
                Ok(0) | Err(_) => return true,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(closed);
}

fn header(frame_len: u32, msg_type: u8, request_id: u32, fields_len: u32) -> BytesMut {
    let mut h = BytesMut::new();
    h.put_u32(frame_len);
    h.put_u8(msg_type);
    h.put_u32(request_id);
    h.put_u32(fields_len);
    h
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_frames_close_only_their_connection() {
    bounded("malformed_frames_close_only_their_connection", 30, async {
        let scratch = Scratch::new();
        let server = scratch.server(&ServerSpec::default());
        let c = raw(server.addr).await;
        call(&c, RegisterApp { app_id: APP.into(), ..Default::default() }).await.unwrap();
        let reg = RegisterShuffle {
            app_id: APP.into(),
            shuffle_id: 1,
            num_maps: 10,
            num_partitions: 2,
            replication: 1,
        };
        call(&c, reg).await.unwrap();

        use ErrorCode::*;
        let addr = server.addr;
        expect_fatal(addr, "frame_len < 13", &header(5, 4, 7, 0), &[MalformedFrame]).await;
        expect_fatal(addr, "unknown type", &header(13, 0xEE, 7, 0), &[UnknownMessageType]).await;
        expect_fatal(addr, "fields past frame", &header(13, 4, 7, 20), &[MalformedFrame]).await;
        // Over the negotiated 1 MiB, and absurdly large.
        expect_fatal(addr, "2 MiB frame", &header(2 << 20, 30, 7, 10), &[FrameTooLarge]).await;
        expect_fatal(addr, "oversize", &header(0xFFFF_FFF0, 30, 7, 10), &[FrameTooLarge]).await;
        // A Ping with a body.
        let mut ping = header(17, 4, 7, 0);
        ping.put_u32(0);
        expect_fatal(addr, "body on Ping", &ping, &[MalformedFrame]).await;
        // A Push whose fields do not decode (str length past the fields).
        let mut bad_push = header(13 + 4, 30, 7, 4);
        bad_push.put_u16(100);
        bad_push.put_u16(0);
        expect_fatal(addr, "bad Push fields", &bad_push, &[MalformedFrame]).await;
        // A PushMerged whose second section covers the first one's bytes again: one body
        // stored (and charged once) twice.
        let body = batch_body(1, 0);
        let overlap = PushMerged {
            app_id: APP.into(),
            shuffle_id: 1,
            entries: vec![
                Section { partition_id: 0, offset: 0, length: body.len() as u32 },
                Section { partition_id: 1, offset: 0, length: body.len() as u32 },
            ],
        };
        let frame = encode_frame(7, &overlap.into(), &body);
        expect_fatal(addr, "overlapping sections", &frame, &[MalformedFrame]).await;
        // A response sent as a request.
        let ack = encode_frame(7, &PushAck {}.into(), &[]);
        expect_fatal(addr, "PushAck as request", &ack, &[ProtocolViolation]).await;
        // Plain garbage (an HTTP request, then noise).
        let mut garbage = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec();
        garbage.extend((0..200u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8));
        expect_fatal(
            addr,
            "garbage",
            &garbage,
            &[MalformedFrame, UnknownMessageType, FrameTooLarge],
        )
        .await;
        let mut noise = vec![0u8, 0, 0, 40, 0x99];
        noise.extend((0..60u32).map(|i| (i.wrapping_mul(40_503) >> 3) as u8));
        expect_fatal(addr, "noise", &noise, &[MalformedFrame, UnknownMessageType]).await;

        // The first connection and new ones are unaffected.
        assert!(matches!(call(&c, Ping {}).await, Ok(Message::Pong(_))));
        still_serving(addr).await;
        tokio::time::sleep(Duration::from_millis(10)).await;
    })
    .await
}
