//! Host-local reads (`host_local_reads`, docs/protocol.md): a real server on this host answers
//! `FetchChunkLocal` with the path, device, inode and spans of each chunk in its files; the
//! spans, read from the file here, are byte for byte what `FetchChunk` sends. The handshake
//! offers the feature only when the server has it on; with it off, `FetchChunkLocal` gets the
//! chunk's bytes.

mod utils;

use std::net::SocketAddr;
use std::os::unix::fs::{FileExt, MetadataExt};

use bytes::{Bytes, BytesMut};
use sluice_proto::batch::put_batch;
use sluice_proto::message::*;
use sluice_proto::{encode_frame, Message};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use utils::*;

const APP: &str = "app-host-local";
const MAPS: u32 = 3;

/// Registers shuffle 1 (3 maps, 1 partition), pushes 6 batches of ~40 KB per map, commits.
async fn write_shuffle(c: &sluice_transport::Connection) {
    call(c, RegisterApp { app_id: APP.into(), ..Default::default() }).await.unwrap();
    let reg = RegisterShuffle {
        app_id: APP.into(),
        shuffle_id: 1,
        num_maps: MAPS,
        num_partitions: 1,
        replication: 1,
    };
    call(c, reg).await.unwrap();
    for map in 0..MAPS {
        for b in 0..6 {
            let mut body = BytesMut::new();
            let records: Vec<_> = (0..100).map(|s| record(map, 0, b * 100 + s, 400)).collect();
            put_batch(&mut body, map, 0, b, &framed(&records));
            let push = Push { app_id: APP.into(), shuffle_id: 1, partition_id: 0 };
            call_body(c, push, body.freeze()).await.unwrap();
        }
        let end = MapperEnd {
            app_id: APP.into(),
            shuffle_id: 1,
            map_id: map,
            attempt_id: 0,
            batch_counts: vec![BatchCount { partition_id: 0, batches: 6 }],
        };
        call(c, end).await.unwrap();
    }
    call(c, CommitShuffle { app_id: APP.into(), shuffle_id: 1 }).await.unwrap();
}

async fn open(c: &sluice_transport::Connection) -> StreamHandle {
    let open = OpenStream {
        app_id: APP.into(),
        shuffle_id: 1,
        partition_id: 0,
        map_start: 0,
        map_end: MAPS,
        attempts: vec![],
    };
    match call(c, open).await {
        Ok(Message::StreamHandle(h)) => h,
        other => panic!("open stream: {other:?}"),
    }
}

/// The features the server answers a handshake asking for CRC32C and host-local reads with.
async fn offered_features(addr: SocketAddr) -> u64 {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let hs = Handshake {
        magic: MAGIC,
        version: PROTOCOL_VERSION,
        features: FEATURE_CRC32C | FEATURE_HOST_LOCAL_READS,
        max_frame_bytes: 1 << 20,
        app_id: APP.into(),
        client_nonce: String::new(),
    };
    s.write_all(&encode_frame(1, &hs.into(), &[])).await.unwrap();
    let mut head = [0u8; 4];
    s.read_exact(&mut head).await.unwrap();
    let len = u32::from_be_bytes(head) as usize;
    let mut rest = vec![0u8; len - 4];
    s.read_exact(&mut rest).await.unwrap();
    let mut all = BytesMut::from(&head[..]);
    all.extend_from_slice(&rest);
    match sluice_proto::parse(&mut all, 1 << 20).unwrap().unwrap().message {
        Message::HandshakeOk(ok) => ok.features,
        other => panic!("expected HandshakeOk, got {other:?}"),
    }
}

fn server(scratch: &Scratch, host_local: bool) -> Proc {
    scratch.server(&ServerSpec {
        metrics: true,
        sets: vec![
            format!("host_local_reads={host_local}"),
            // Several chunks per partition.
            "chunk_bytes=65536".into(),
        ],
        ..ServerSpec::default()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_on_this_host_is_told_where_each_chunk_is_and_reads_the_same_bytes() {
    bounded("a_reader_on_this_host_is_told_where_each_chunk_is", 60, async {
        let scratch = Scratch::new();
        let server = server(&scratch, true);
        assert_eq!(
            offered_features(server.addr).await,
            FEATURE_CRC32C | FEATURE_HOST_LOCAL_READS,
            "the handshake offers host-local reads"
        );
        let c = raw(server.addr).await;
        write_shuffle(&c).await;
        let h = open(&c).await;
        assert!(h.chunk_lengths.len() >= 3, "{} chunks", h.chunk_lengths.len());
        let mut local_bytes = 0u64;
        for (i, &len) in h.chunk_lengths.iter().enumerate() {
            let i = i as u32;
            let (_, sent) =
                call_body(&c, FetchChunk { stream_id: h.stream_id, chunk_index: i }, Bytes::new())
                    .await
                    .expect("fetch");
            assert_eq!(sent.len() as u32, len);
            let ask = FetchChunkLocal { stream_id: h.stream_id, chunk_index: i };
            let Ok(Message::ChunkLocal(at)) = call(&c, ask).await else {
                panic!("chunk {i}: no ChunkLocal")
            };
            assert_eq!((at.stream_id, at.chunk_index), (h.stream_id, i));
            assert!(at.path.starts_with(scratch.path().to_str().unwrap()), "{}", at.path);
            let file = std::fs::File::open(&at.path).expect("the named file opens here");
            let meta = file.metadata().unwrap();
            assert_eq!((meta.dev(), meta.ino()), (at.device, at.inode), "{}", at.path);
            let mut read = Vec::new();
            for s in &at.spans {
                let mut buf = vec![0u8; s.length as usize];
                file.read_exact_at(&mut buf, s.offset).unwrap();
                read.extend_from_slice(&buf);
            }
            assert_eq!(read.len() as u32, len, "chunk {i}: the spans' length");
            assert!(read == sent[..], "chunk {i}: the file's spans differ from the bytes sent");
            local_bytes += len as u64;
        }
        // Only a chunk index of the stream.
        let past = FetchChunkLocal { stream_id: h.stream_id, chunk_index: 999 };
        assert_eq!(call(&c, past).await.err(), Some(sluice_proto::ErrorCode::ChunkOutOfRange));
        let m = server.metrics().await;
        let chunks = h.chunk_lengths.len() as f64;
        assert_eq!(metric(&m, "sluice_server_local_read_chunks_total"), chunks);
        assert_eq!(metric(&m, "sluice_server_local_read_bytes_total"), local_bytes as f64);
        // The bytes went out once each, for FetchChunk.
        assert_eq!(metric(&m, "sluice_server_fetched_chunks_total"), chunks);
    })
    .await
}

/// A file unlinked while a stream holds it open (as when its partition moves to the object
/// store) has no name a reader could open: the server sends those chunks' bytes instead of
/// naming a path that leads nowhere (readers that failed on such paths paused their local reads).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunk_whose_file_was_unlinked_is_sent_not_named() {
    bounded("a_chunk_whose_file_was_unlinked_is_sent_not_named", 60, async {
        let scratch = Scratch::new();
        let server = server(&scratch, true);
        let c = raw(server.addr).await;
        write_shuffle(&c).await;
        let h = open(&c).await;
        let first = FetchChunkLocal { stream_id: h.stream_id, chunk_index: 0 };
        let Ok(Message::ChunkLocal(at)) = call(&c, first).await else { panic!("no ChunkLocal") };
        let (mut named, mut sent) = (std::collections::BTreeSet::new(), Vec::new());
        for i in 0..h.chunk_lengths.len() as u32 {
            let ask = FetchChunkLocal { stream_id: h.stream_id, chunk_index: i };
            if let Ok(Message::ChunkLocal(at)) = call(&c, ask).await {
                named.insert(at.path);
            }
            let fetch = FetchChunk { stream_id: h.stream_id, chunk_index: i };
            sent.push(call_body(&c, fetch, Bytes::new()).await.expect("fetch").1);
        }
        for p in &named {
            std::fs::remove_file(p).unwrap();
        }
        assert!(named.contains(&at.path));
        for (i, &len) in h.chunk_lengths.iter().enumerate() {
            let i = i as u32;
            let ask = FetchChunkLocal { stream_id: h.stream_id, chunk_index: i };
            let (m, body) = call_body(&c, ask, Bytes::new()).await.expect("fetch");
            assert!(
                matches!(m, Message::ChunkData(ref d) if d.chunk_index == i),
                "chunk {i}: expected ChunkData for an unlinked file, got {m:?}"
            );
            assert_eq!(body.len() as u32, len, "chunk {i}");
            assert!(body == sent[i as usize], "chunk {i}: other bytes than before the unlink");
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_host_local_reads_off_the_server_sends_the_chunks_bytes() {
    bounded("with_host_local_reads_off_the_server_sends_the_chunks_bytes", 60, async {
        let scratch = Scratch::new();
        let server = server(&scratch, false);
        assert_eq!(offered_features(server.addr).await, FEATURE_CRC32C, "not offered");
        let c = raw(server.addr).await;
        write_shuffle(&c).await;
        let h = open(&c).await;
        for (i, &len) in h.chunk_lengths.iter().enumerate() {
            let i = i as u32;
            let ask = FetchChunkLocal { stream_id: h.stream_id, chunk_index: i };
            let (m, body) = call_body(&c, ask, Bytes::new()).await.expect("fetch");
            assert!(
                matches!(m, Message::ChunkData(d) if d.stream_id == h.stream_id && d.chunk_index == i),
                "chunk {i}: expected ChunkData"
            );
            assert_eq!(body.len() as u32, len);
            let (_, sent) =
                call_body(&c, FetchChunk { stream_id: h.stream_id, chunk_index: i }, Bytes::new())
                    .await
                    .unwrap();
            assert_eq!(body, sent);
        }
        let m = server.metrics().await;
        assert_eq!(metric(&m, "sluice_server_local_read_chunks_total"), 0.0);
    })
    .await
}

/// The native reader reads every chunk from the server's file (the server sends none), and when
/// the files' paths stop leading to them (here: the application's directory moved away), fetches
/// the same bytes over the network.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_native_reader_reads_the_servers_files_and_fetches_when_it_cannot() {
    bounded("the_native_reader_reads_the_servers_files", 60, async {
        const APP_N: &str = "app-native-local";
        const PARTS: u32 = 4;
        let scratch = Scratch::new();
        let server = server(&scratch, true);
        let client = client(APP_N, None);
        let a = assignment(1, &[server.addr], PARTS);
        register_direct(&client, &a, MAPS).await.unwrap();
        for w in spawn_writers(&client, &a, MAPS, 200, 1_000, |m, seq| (m + seq) % PARTS) {
            w.await.unwrap().unwrap();
        }
        client.commit_shuffle(&a).await.unwrap();
        let count = |m: &std::collections::HashMap<String, f64>, name: &str| metric(m, name);

        let before = server.metrics().await;
        let mut first = Vec::new();
        for p in 0..PARTS {
            let r = read_partition(&client, &a, p, 0, MAPS).await.expect("read");
            assert_eq!(r.records.len(), (MAPS * 200 / PARTS) as usize, "partition {p}");
            first.push(r.ids());
        }
        let after = server.metrics().await;
        let local = count(&after, "sluice_server_local_read_chunks_total")
            - count(&before, "sluice_server_local_read_chunks_total");
        let sent = count(&after, "sluice_server_fetched_chunks_total")
            - count(&before, "sluice_server_fetched_chunks_total");
        assert!(local >= PARTS as f64, "{local} chunks named as file spans");
        assert_eq!(sent, 0.0, "chunks sent over the network");

        let data = files_under(scratch.path())
            .into_iter()
            .find(|f| {
                f.extension().is_some_and(|e| e == "data") && f.to_string_lossy().contains(APP_N)
            })
            .expect("a data file of the application");
        let app_dir = data.parent().and_then(|d| d.parent()).unwrap().to_path_buf();
        let moved = app_dir.with_file_name(format!("{APP_N}.moved"));
        std::fs::rename(&app_dir, &moved).unwrap();
        let before = server.metrics().await;
        for (p, ids) in first.iter().enumerate() {
            let r = read_partition(&client, &a, p as u32, 0, MAPS).await.expect("read again");
            assert_eq!(&r.ids(), ids, "partition {p} read over the network");
        }
        let after = server.metrics().await;
        std::fs::rename(&moved, &app_dir).unwrap();
        let sent = count(&after, "sluice_server_fetched_chunks_total")
            - count(&before, "sluice_server_fetched_chunks_total");
        assert!(sent >= PARTS as f64, "{sent} chunks sent over the network after the move");
    })
    .await
}
