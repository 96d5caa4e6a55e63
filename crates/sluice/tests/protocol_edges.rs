//! Edges between the client and a real server: authentication, data loss detection, a push
//! larger than the memory budget, backwards map ranges and the lifetime of read streams.

mod utils;

use std::time::Duration;

use bytes::BytesMut;
use sluice_proto::batch::put_batch;
use sluice_proto::message::*;
use sluice_proto::{ErrorCode, Message};
use utils::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_application_credential_is_enforced() {
    bounded("the_application_credential_is_enforced", 30, async {
        const KEY: &str = "s3cret-cluster-key";
        let scratch = Scratch::new();
        let server = scratch.server(&ServerSpec {
            sets: vec![format!("transport.secret=\"{KEY}\"")],
            ..Default::default()
        });
        let a = assignment(1, &[server.addr], 2);
        let wrong = client_with("auth", None, |o| o.transport.secret = "guess".into());
        assert_eq!(code(register_direct(&wrong, &a, 1).await), ErrorCode::AuthFailed);
        // The cluster key is not an application's credential.
        let key = client_with("auth", None, |o| o.transport.secret = KEY.into());
        assert_eq!(code(register_direct(&key, &a, 1).await), ErrorCode::AuthFailed);

        let credential = sluice_transport::app_credential(KEY, "auth");
        let ok = client_with("auth", None, |o| o.transport.secret = credential);
        register_direct(&ok, &a, 1).await.expect("with the credential");
        let mut w = ok.writer(a.clone(), 0, 0).await.unwrap();
        w.write_record(1, &record(0, 0, 1, 64)).await.unwrap();
        w.finish().await.unwrap();
        ok.commit_shuffle(&a).await.unwrap();
        let r = read_partition(&ok, &a, 1, 0, 1).await.unwrap();
        assert_eq!(r.ids(), vec![RecordId { map: 0, attempt: 0, seq: 1 }]);
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_batches_are_reported_as_data_lost() {
    bounded("missing_batches_are_reported_as_data_lost", 30, async {
        let scratch = Scratch::new();
        let server = scratch.server(&ServerSpec::default());
        let c = raw(server.addr).await;
        let app = "lossy";
        call(&c, RegisterApp { app_id: app.into(), ..Default::default() }).await.unwrap();
        let reg = RegisterShuffle {
            app_id: app.into(),
            shuffle_id: 1,
            num_maps: 1,
            num_partitions: 1,
            replication: 1,
        };
        call(&c, reg).await.unwrap();
        // Batches 0 and 2 arrive; batch 1 never does, yet the map reports three.
        for id in [0, 2] {
            let mut body = BytesMut::new();
            put_batch(&mut body, 0, 0, id, &framed(&[record(0, 0, id, 128)]));
            let push = Push { app_id: app.into(), shuffle_id: 1, partition_id: 0 };
            call_body(&c, push, body.freeze()).await.unwrap();
        }
        let end = MapperEnd {
            app_id: app.into(),
            shuffle_id: 1,
            map_id: 0,
            attempt_id: 0,
            batch_counts: vec![BatchCount { partition_id: 0, batches: 3 }],
        };
        call(&c, end).await.unwrap();
        call(&c, CommitShuffle { app_id: app.into(), shuffle_id: 1 }).await.unwrap();
        let client = client(app, None);
        let a = assignment(1, &[server.addr], 1);
        let r = read_partition(&client, &a, 0, 0, 1).await;
        assert_eq!(code(r), ErrorCode::DataLost);
    })
    .await
}

/// A push body larger than the whole memory budget can never be reserved. The server should
/// refuse it with a non-retriable error (or admit it into an empty budget); it answers `Busy`
/// forever instead, so the writer retries `busy_max_retries` (1000) × `busy_backoff_ms` (50) ≈
/// 50 s and then fails with `TIMEOUT`, which is retriable, so an engine retries the task again.
/// Root cause: `MemoryBudget::try_reserve` returns `None` for `next > capacity` even when the
/// budget is empty, and `admit_push` turns every `None` into `Busy`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_larger_than_the_budget_is_not_busy_forever() {
    bounded("a_push_larger_than_the_budget_is_not_busy_forever", 30, async {
        let scratch = Scratch::new();
        let server =
            scratch.server(&ServerSpec { memory_budget_bytes: 4 << 20, ..Default::default() });
        let client = client("huge", None);
        let a = assignment(1, &[server.addr], 1);
        register_direct(&client, &a, 1).await.unwrap();
        let mut w = client.writer(a.clone(), 0, 0).await.unwrap();
        w.add_batch(0, &framed(&[record(0, 0, 0, 6 << 20)])).await.unwrap();
        let r = tokio::time::timeout(Duration::from_secs(10), w.finish()).await;
        match r {
            Ok(Ok(_)) => {} // admitted into the empty budget: fine
            Ok(Err(e)) => assert!(!e.is_retriable(), "a retriable error for a hopeless push: {e}"),
            Err(_) => {
                panic!("the writer still retries Busy after 10 s for a push that can never fit")
            }
        }
    })
    .await
}

/// A backwards map range (`map_start > map_end`) is a malformed frame (pinned by the golden
/// vector `open_stream_range_backwards`), which is fatal: the server closes the connection. The
/// native reader sends it as given, over a pooled connection that other requests share; it
/// should refuse the range locally with INVALID_REQUEST, as the JVM client does
/// (`ShuffleReaderClient` throws `IllegalArgumentException`). Today it gets MALFORMED_FRAME and
/// takes the pooled connection down with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reader_refuses_a_backwards_map_range_locally() {
    bounded("the_reader_refuses_a_backwards_map_range_locally", 30, async {
        let scratch = Scratch::new();
        let server = scratch.server(&ServerSpec::default());
        let client = client("backwards", None);
        let a = assignment(1, &[server.addr], 1);
        register_direct(&client, &a, 8).await.unwrap();
        client.commit_shuffle(&a).await.unwrap();
        let r = client.reader(&a, 0, 5, 3).await.map(|_| ());
        assert_eq!(code(r), ErrorCode::InvalidRequest);
    })
    .await
}

/// The wire behaviour itself: a backwards range is fatal, and only for its connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backwards_map_range_is_a_fatal_malformed_frame() {
    bounded("a_backwards_map_range_is_a_fatal_malformed_frame", 30, async {
        let scratch = Scratch::new();
        let server = scratch.server(&ServerSpec::default());
        let (c1, c2) = (raw(server.addr).await, raw(server.addr).await);
        let open = OpenStream {
            app_id: "x".into(),
            shuffle_id: 1,
            partition_id: 0,
            map_start: 5,
            map_end: 3,
            attempts: vec![],
        };
        assert_eq!(call(&c1, open).await.err(), Some(ErrorCode::MalformedFrame));
        let closed = eventually(5, || c1.is_closed()).await;
        assert!(closed, "the connection stays open after a fatal error");
        assert!(matches!(call(&c2, Ping {}).await, Ok(Message::Pong(_))));
    })
    .await
}

/// Commits a one-partition shuffle of `chunks` chunks (a little over 1 MiB each) on `server`.
async fn chunked_shuffle(
    client: &sluice_client::ShuffleClient,
    server: std::net::SocketAddr,
    chunks: u32,
) -> std::sync::Arc<Assignment> {
    let a = assignment(1, &[server], 1);
    register_direct(client, &a, 1).await.unwrap();
    let mut w = client.writer(a.clone(), 0, 0).await.unwrap();
    for seq in 0..chunks {
        w.add_batch(0, &framed(&[record(0, 0, seq, 1 << 20)])).await.unwrap();
    }
    w.finish().await.unwrap();
    client.commit_shuffle(&a).await.unwrap();
    a
}

/// Streams are tied to the connection that opened them (`Stream::conn_id`, dropped in
/// `connection_closed`), but the native reader fetches through its pool's connections round
/// robin. So when the connection that carried `OpenStream` closes — for any reason, e.g. another
/// request on it got a fatal error — a read in progress on the *other* connection fails with
/// UNKNOWN_STREAM (not retriable). Either streams must outlive their opening connection (until
/// `CloseStream`), or the reader must fetch on the connection that opened the stream (then this
/// raw check is moot, and the native-reader check below is what matters).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_outlives_the_connection_that_opened_it() {
    bounded("a_stream_outlives_the_connection_that_opened_it", 30, async {
        let scratch = Scratch::new();
        let server = scratch
            .server(&ServerSpec { sets: vec!["chunk_bytes=1048576".into()], ..Default::default() });
        let client = client("streams", None);
        chunked_shuffle(&client, server.addr, 4).await;

        let (opener, fetcher) = (raw(server.addr).await, raw(server.addr).await);
        let open = OpenStream {
            app_id: "streams".into(),
            shuffle_id: 1,
            partition_id: 0,
            map_start: 0,
            map_end: 1,
            attempts: vec![],
        };
        let h = match call(&opener, open).await {
            Ok(Message::StreamHandle(h)) => h,
            other => panic!("OpenStream: {other:?}"),
        };
        assert_eq!(h.chunk_lengths.len(), 4);
        let fetch = |i| FetchChunk { stream_id: h.stream_id, chunk_index: i };
        assert!(matches!(call(&fetcher, fetch(0)).await, Ok(Message::ChunkData(_))));
        drop(opener);
        tokio::time::sleep(Duration::from_millis(300)).await;
        let r = call(&fetcher, fetch(1)).await;
        assert!(matches!(r, Ok(Message::ChunkData(_))), "chunk 1 after the opener closed: {r:?}");
    })
    .await
}

/// The user-visible side of the same bug: a native read in progress fails with UNKNOWN_STREAM
/// because another request of the same client hit a fatal error on a pooled connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_survives_a_fatal_error_on_another_request() {
    bounded("a_read_survives_a_fatal_error_on_another_request", 30, async {
        let scratch = Scratch::new();
        let server = scratch
            .server(&ServerSpec { sets: vec!["chunk_bytes=1048576".into()], ..Default::default() });
        let client = client_with("streams", None, |o| o.fetch_prefetch_chunks = 1);
        let a = chunked_shuffle(&client, server.addr, 32).await;

        let mut r = client.reader(&a, 0, 0, 1).await.unwrap();
        assert!(r.next_batch().await.unwrap().is_some());
        // Another task of the same application sends a request the server finds malformed
        // (num_partitions 0 is pinned as MALFORMED_FRAME), twice: both pooled connections
        // carry one and are closed.
        // A request can also land on a connection the server is already closing after the
        // previous fatal error (it then fails as a lost connection): send until two were
        // answered MALFORMED_FRAME.
        let mut malformed = 0;
        for _ in 0..8 {
            let bad = RegisterShuffle {
                app_id: "streams".into(),
                shuffle_id: 9,
                num_maps: 1,
                num_partitions: 0,
                replication: 1,
            };
            match code(client.request(server.addr, bad.into()).await) {
                ErrorCode::MalformedFrame => malformed += 1,
                ErrorCode::Internal => {} // the connection was closing
                other => panic!("unexpected {other}"),
            }
            if malformed == 2 {
                break;
            }
        }
        assert_eq!(malformed, 2, "two malformed requests answered");
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut n = 1;
        loop {
            match r.next_batch().await {
                Ok(Some(_)) => n += 1,
                Ok(None) => break,
                Err(e) => panic!("the read failed after {n} of 32 batches: {e}"),
            }
        }
        assert_eq!(n, 32);
    })
    .await
}
