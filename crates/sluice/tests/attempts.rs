//! Map attempts against real servers: a failed-and-retried map, a speculative pair (first
//! `MapperEnd` wins), and a push repeated after a lost acknowledgement.

mod utils;

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use sluice_proto::batch::put_batch;
use sluice_proto::message::*;
use sluice_proto::{ErrorCode, Message};
use utils::*;

/// Sum of a counter over servers.
async fn total(servers: &[&Proc], name: &str) -> f64 {
    let mut t = 0.0;
    for s in servers {
        t += metric(&s.metrics().await, name);
    }
    t
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retried_and_speculative_attempts_read_once() {
    bounded("retried_and_speculative_attempts_read_once", 30, async {
        let scratch = Scratch::new();
        let coord = scratch.coordinator();
        let spec = ServerSpec { metrics: true, ..ServerSpec::with_coordinator(coord.addr) };
        let (s1, s2) = (scratch.server(&spec), scratch.server(&spec));
        wait_registered(coord.addr, 2, 15).await;
        let servers = [&s1, &s2];

        let client = client("attempts", Some(coord.addr));
        client.register_app().await.expect("register app");
        let parts = 4u32;
        let a = client.register_shuffle(1, 3, parts, 1).await.expect("register shuffle");
        assert_eq!(a.servers.len(), 2, "both servers in the assignment");

        // Map 0, attempt 0: six large batches (each sent alone as a Push), then it "dies".
        let pushes_before = total(&servers, "sluice_server_push_requests_total").await;
        let mut w00 = client.writer(a.clone(), 0, 0).await.unwrap();
        for seq in 0..6u32 {
            let payload = framed(&[record(0, 0, seq, 70_000)]);
            w00.add_batch(seq % parts, &payload).await.unwrap();
        }
        // Make sure attempt 0's batches are really stored before it is abandoned.
        let stored = async {
            loop {
                let n = total(&servers, "sluice_server_push_requests_total").await;
                if n >= pushes_before + 6.0 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        bounded("attempt 0's pushes to be acknowledged", 10, stored).await;
        drop(w00); // never finishes

        // Map 0, attempt 1: different records (small ones, merged), finishes.
        let mut w01 = client.writer(a.clone(), 0, 1).await.unwrap();
        for seq in 0..40u32 {
            w01.write_record(seq % parts, &record(0, 1, seq, 100)).await.unwrap();
        }
        w01.finish().await.expect("map 0 attempt 1 finishes");

        // Map 1, attempts 0 and 1 push the same records; attempt 0 ends first and wins.
        let mut w10 = client.writer(a.clone(), 1, 0).await.unwrap();
        let mut w11 = client.writer(a.clone(), 1, 1).await.unwrap();
        for seq in 0..30u32 {
            w10.write_record(seq % parts, &record(1, 0, seq, 200)).await.unwrap();
            w11.write_record(seq % parts, &record(1, 1, seq, 200)).await.unwrap();
        }
        w10.finish().await.expect("map 1 attempt 0 finishes");
        w11.finish().await.expect("map 1 attempt 1 finishes too (it just loses)");

        // Map 2: one plain attempt.
        let mut w2 = client.writer(a.clone(), 2, 0).await.unwrap();
        for seq in 0..20u32 {
            w2.write_record(seq % parts, &record(2, 0, seq, 50)).await.unwrap();
        }
        w2.finish().await.unwrap();

        // MapperEndResult names the first attempt to report, whoever asks later.
        for addr in addrs_of(&a) {
            for (map, attempt, winner) in [(1, 1, 0), (1, 7, 0), (0, 0, 1), (0, 1, 1)] {
                let end = MapperEnd {
                    app_id: client.app_id().into(),
                    shuffle_id: 1,
                    map_id: map,
                    attempt_id: attempt,
                    batch_counts: vec![],
                };
                match client.request(addr, end.into()).await {
                    Ok(Message::MapperEndResult(r)) => assert_eq!(
                        r.winning_attempt, winner,
                        "late MapperEnd of map {map} attempt {attempt} on {addr}"
                    ),
                    other => panic!("MapperEnd: {other:?}"),
                }
            }
        }

        client.commit_shuffle(&a).await.expect("commit");
        let mut per_attempt: BTreeMap<(u32, u32), Vec<u32>> = BTreeMap::new();
        let mut dropped = 0;
        for p in 0..parts {
            let r = read_partition(&client, &a, p, 0, 3).await.expect("read");
            dropped += r.batches_dropped;
            for (id, _) in r.records {
                assert_eq!(id.seq % parts, p, "record {id:?} in the wrong partition");
                per_attempt.entry((id.map, id.attempt)).or_default().push(id.seq);
            }
        }
        for seqs in per_attempt.values_mut() {
            seqs.sort_unstable();
        }
        let attempts: Vec<_> = per_attempt.keys().copied().collect();
        assert_eq!(attempts, vec![(0, 1), (1, 0), (2, 0)], "exactly one attempt per map");
        assert_eq!(per_attempt[&(0, 1)], (0..40).collect::<Vec<_>>());
        assert_eq!(per_attempt[&(1, 0)], (0..30).collect::<Vec<_>>());
        assert_eq!(per_attempt[&(2, 0)], (0..20).collect::<Vec<_>>());
        // The losers' batches (6 of map 0 attempt 0, one per partition of map 1 attempt 1) were
        // stored, but the servers sent none of them: the readers had nothing to drop.
        assert_eq!(dropped, 0, "batches dropped by the readers");
        // Named explicitly, map 1's losing attempt is served, as many bytes as the winner (the
        // same records), and a stream of both maps 1 and 2 more than either alone.
        for p in 0..parts {
            let named = |attempts: &[(u32, u32)]| {
                attempts
                    .iter()
                    .map(|&(map_id, attempt_id)| MapAttempt { map_id, attempt_id })
                    .collect::<Vec<_>>()
            };
            let winner = served_bytes(&client, &a, p, 1, 2, named(&[(1, 0)])).await;
            let loser = served_bytes(&client, &a, p, 1, 2, named(&[(1, 1)])).await;
            let with_map_2 = served_bytes(&client, &a, p, 1, 3, named(&[(1, 1), (2, 0)])).await;
            assert!(winner > 0 && winner == loser, "partition {p}: {winner} vs {loser} bytes");
            assert!(with_map_2 > loser, "partition {p}: {with_map_2} vs {loser} bytes");
        }
    })
    .await
}

/// Bytes the servers of the shuffle would send for a stream over `[start, end)` of partition
/// `p` that names `attempts` (the sum of its chunk lengths).
async fn served_bytes(
    client: &sluice_client::ShuffleClient,
    a: &Assignment,
    p: u32,
    start: u32,
    end: u32,
    attempts: Vec<MapAttempt>,
) -> u64 {
    let mut total = 0;
    for addr in addrs_of(a) {
        match stream_handle(client, addr, p, (start, end), attempts.clone()).await {
            Ok(h) => total += h.chunk_lengths.iter().map(|&l| l as u64).sum::<u64>(),
            // This server holds none of the partition's batches of those attempts.
            Err(e) if e.code() == ErrorCode::DataLost => {}
            Err(e) => panic!("OpenStream on {addr}: {e}"),
        }
    }
    total
}

/// Push frames for one batch of map 0 attempt 0.
fn one_batch(payload: &[u8]) -> Bytes {
    let mut body = BytesMut::new();
    put_batch(&mut body, 0, 0, 0, payload);
    body.freeze()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_push_after_lost_ack_is_read_once() {
    bounded("duplicate_push_after_lost_ack_is_read_once", 30, async {
        let scratch = Scratch::new();
        let server = scratch.server(&ServerSpec::default());
        let conn = raw(server.addr).await;
        let app = "dup-app".to_string();
        call(&conn, RegisterApp { app_id: app.clone(), ..Default::default() }).await.unwrap();
        let reg = RegisterShuffle {
            app_id: app.clone(),
            shuffle_id: 5,
            num_maps: 1,
            num_partitions: 2,
            replication: 1,
        };
        call(&conn, reg).await.unwrap();

        let rec = record(0, 0, 42, 300);
        let body = one_batch(&framed(std::slice::from_ref(&rec)));
        let push = Push { app_id: app.clone(), shuffle_id: 5, partition_id: 1 };
        // The same frame twice: the first ack was "lost", the client sent it again.
        for _ in 0..2 {
            let (m, _) = call_body(&conn, push.clone(), body.clone()).await.expect("push");
            assert!(matches!(m, Message::PushAck(_)), "{m:?}");
        }
        let end = MapperEnd {
            app_id: app.clone(),
            shuffle_id: 5,
            map_id: 0,
            attempt_id: 0,
            batch_counts: vec![BatchCount { partition_id: 1, batches: 1 }],
        };
        match call(&conn, end).await {
            Ok(Message::MapperEndResult(r)) => assert_eq!(r.winning_attempt, 0),
            other => panic!("MapperEnd: {other:?}"),
        }
        match call(&conn, CommitShuffle { app_id: app.clone(), shuffle_id: 5 }).await {
            Ok(Message::CommitResult(c)) => {
                assert_eq!(c.partitions.len(), 1, "{c:?}");
                assert_eq!(c.partitions[0].partition, 1);
            }
            other => panic!("commit: {other:?}"),
        }

        // The raw stream names one committed batch for the map.
        let open = OpenStream {
            app_id: app.clone(),
            shuffle_id: 5,
            partition_id: 1,
            map_start: 0,
            map_end: 1,
            attempts: vec![],
        };
        match call(&conn, open).await {
            Ok(Message::StreamHandle(h)) => {
                assert_eq!(
                    h.committed,
                    vec![CommittedMap { map_id: 0, attempt_id: 0, batches: 1 }]
                );
                assert!(!h.chunk_lengths.is_empty());
                call(&conn, CloseStream { stream_id: h.stream_id }).await.unwrap();
            }
            other => panic!("OpenStream: {other:?}"),
        }

        // The native reader delivers the record exactly once.
        let client = client(&app, None);
        let a = assignment(5, &[server.addr], 2);
        let r = read_partition(&client, &a, 1, 0, 1).await.expect("read");
        assert_eq!(r.records.len(), 1, "{r:?}");
        assert_eq!(r.records[0].0, RecordId { map: 0, attempt: 0, seq: 42 });
        assert_eq!(r.batches_read, 1);
        let empty = read_partition(&client, &a, 0, 0, 1).await.expect("read partition 0");
        assert!(empty.records.is_empty());
    })
    .await
}

/// A reader that names the attempts to read (`OpenStream::attempts`, as the Spark plugin does
/// with Spark's map statuses) gets exactly those, whichever attempt of a map ended first: a later
/// attempt's data, no other map of the range, `DATA_LOST` for an attempt that did not end on
/// the server, and nothing (no error: a split partition's part) for one that pushed nothing to
/// the partition there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn named_attempts_are_read_whoever_won() {
    bounded("named_attempts_are_read_whoever_won", 30, async {
        let scratch = Scratch::new();
        let server = scratch.server(&ServerSpec::default());
        let client = client("named", None);
        let a = assignment(2, &[server.addr], 2);
        register_direct(&client, &a, 3).await.expect("register");

        // Map 0: attempt 0 writes partition 0 only and ends first; attempt 1 writes partition 1
        // only and ends later (it loses).
        let write = |map: u32, attempt: u32, n: u32, part: fn(u32) -> u32| {
            let (client, a) = (client.clone(), a.clone());
            async move {
                let mut w = client.writer(a, map, attempt).await.unwrap();
                for seq in 0..n {
                    w.write_record(part(seq), &record(map, attempt, seq, 100)).await.unwrap();
                }
                w.finish().await.expect("finish");
            }
        };
        write(0, 0, 10, |_| 0).await;
        write(0, 1, 12, |_| 1).await;
        write(1, 5, 8, |s| s % 2).await;
        write(2, 0, 6, |s| s % 2).await;

        // Map 0 attempt 2 pushes to partition 1 and never ends; attempt 3 pushes there before
        // the commit and reports its end after it.
        let conn = raw(server.addr).await;
        let push = Push { app_id: client.app_id().into(), shuffle_id: 2, partition_id: 1 };
        for attempt in [2, 3] {
            let mut body = BytesMut::new();
            put_batch(&mut body, 0, attempt, 0, &framed(&[record(0, attempt, 0, 100)]));
            let (m, _) = call_body(&conn, push.clone(), body.freeze()).await.expect("push");
            assert!(matches!(m, Message::PushAck(_)), "{m:?}");
        }
        client.commit_shuffle(&a).await.expect("commit");
        let end = MapperEnd {
            app_id: client.app_id().into(),
            shuffle_id: 2,
            map_id: 0,
            attempt_id: 3,
            batch_counts: vec![BatchCount { partition_id: 1, batches: 1 }],
        };
        match call(&conn, end).await {
            Ok(Message::MapperEndResult(r)) => assert_eq!(r.winning_attempt, 0),
            other => panic!("late MapperEnd: {other:?}"),
        }

        let attempts_in = |r: &ReadResult| {
            let mut v: Vec<(u32, u32)> = r.ids().iter().map(|id| (id.map, id.attempt)).collect();
            v.dedup();
            v
        };
        // Without names: the winners, as before.
        let winners = read_partition(&client, &a, 1, 0, 3).await.expect("winners");
        assert_eq!(attempts_in(&winners), vec![(1, 5), (2, 0)]);

        // Named: map 0's losing attempt and map 1; map 2 is in the range but not named.
        let named = read_attempts(&client, &a, 1, 0, 3, &[(0, 1), (1, 5)]).await.expect("named");
        assert_eq!(attempts_in(&named), vec![(0, 1), (1, 5)]);
        let ids = named.unique_ids("partition 1");
        assert_eq!(ids.iter().filter(|id| id.map == 0).count(), 12, "all of map 0 attempt 1");
        assert_eq!(ids.iter().filter(|id| id.map == 1).count(), 4, "map 1's odd records");

        // The attempt whose end came after the commit.
        let late = read_attempts(&client, &a, 1, 0, 1, &[(0, 3)]).await.expect("late attempt");
        assert_eq!(late.ids(), vec![RecordId { map: 0, attempt: 3, seq: 0 }]);

        // An attempt that never ended here, and one that pushed nothing to the partition.
        let unended = read_attempts(&client, &a, 1, 0, 3, &[(0, 2)]).await;
        assert_eq!(code(unended), ErrorCode::DataLost);
        let nothing_here = read_attempts(&client, &a, 1, 0, 3, &[(0, 0), (1, 5)]).await;
        let nothing_here = nothing_here.expect("an attempt with nothing here reads as nothing");
        assert_eq!(attempts_in(&nothing_here), vec![(1, 5)]);
        // A map the shuffle does not have; names out of order (refused before sending).
        let beyond = read_attempts(&client, &a, 1, 0, 4, &[(3, 0)]).await;
        assert_eq!(code(beyond), ErrorCode::InvalidRequest);
        let unordered = read_attempts(&client, &a, 1, 0, 3, &[(1, 5), (0, 1)]).await;
        assert_eq!(code(unordered), ErrorCode::InvalidRequest);
        // The connection and the shuffle are still fine.
        let again = read_attempts(&client, &a, 0, 0, 3, &[(0, 0)]).await.expect("partition 0");
        assert_eq!(again.unique_ids("partition 0").len(), 10);
    })
    .await
}
