//! Writer failover with replication 2: a server lost while map tasks push costs no map attempt,
//! a server's incomplete copy (a map with no `MapperEnd` there) is answered `DATA_LOST` and read
//! from the replica instead, and losing both copies of a partition is a clear error.

mod utils;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use sluice_client::{ClientError, ShuffleClient};
use sluice_proto::batch::put_batch;
use sluice_proto::message::*;
use sluice_proto::{ErrorCode, Message};
use sluice_transport::{Body, TransportError};
use tokio::sync::{watch, Notify};
use utils::*;

/// A hand-made replicated assignment: partition `p` on server `p % n`, its replica on the next.
fn replicated(shuffle_id: u32, servers: &[SocketAddr], partitions: u32) -> Arc<Assignment> {
    let mut a = Arc::unwrap_or_clone(assignment(shuffle_id, servers, partitions));
    let n = servers.len() as u16;
    for l in &mut a.partitions {
        l.replica = (l.primary + 1) % n;
    }
    Arc::new(a)
}

/// Expected records per partition: sorted ids, and (count, sum of CRC32C) as `ReadResult::tally`.
#[derive(Default)]
struct Expected {
    ids: BTreeMap<u32, Vec<RecordId>>,
    tally: BTreeMap<u32, (usize, u64)>,
}

impl Expected {
    fn add(&mut self, partition: u32, rec: &[u8], id: RecordId) {
        self.ids.entry(partition).or_default().push(id);
        let t = self.tally.entry(partition).or_default();
        t.0 += 1;
        t.1 += crc32c::crc32c(rec) as u64;
    }

    /// Reads every partition over `[0, maps)` and checks each record arrived exactly once.
    async fn check(&self, client: &ShuffleClient, a: &Assignment, maps: u32) {
        for p in 0..a.partitions.len() as u32 {
            let r = read_partition(client, a, p, 0, maps)
                .await
                .unwrap_or_else(|e| panic!("reading partition {p}: {e}"));
            let mut want = self.ids.get(&p).cloned().unwrap_or_default();
            want.sort_unstable();
            assert_eq!(r.ids(), want, "partition {p}: records (each exactly once)");
            assert_eq!(r.tally(), self.tally.get(&p).copied().unwrap_or_default(), "partition {p}");
        }
    }
}

/// Replication 2 over three servers, four map tasks pushing concurrently; one server is
/// SIGKILLed once a third of the records are written, while the writers are still pushing (each
/// pushes its second half only after the kill). Every writer finishes, the commit succeeds on
/// the two live servers, and every record is read back exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writers_of_a_replicated_shuffle_survive_a_server_killed_mid_push() {
    bounded(
        "writers_of_a_replicated_shuffle_survive_a_server_killed_mid_push",
        90,
        lose_a_server_mid_push(false),
    )
    .await
}

/// As above, but the killed server comes straight back on the same address, empty: it answers
/// the writers' next pushes, a map task that starts only now, the commit and the readers with
/// `UNKNOWN_APP`/`UNKNOWN_SHUFFLE`. That is the server's loss, not the request's: each goes on
/// with the other copy, and every record is read back exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writers_of_a_replicated_shuffle_survive_a_server_restarted_mid_push() {
    bounded(
        "writers_of_a_replicated_shuffle_survive_a_server_restarted_mid_push",
        90,
        lose_a_server_mid_push(true),
    )
    .await
}

async fn lose_a_server_mid_push(restart: bool) {
    {
        let scratch = Scratch::new();
        let coord = scratch.coordinator();
        let mut servers: Vec<Proc> =
            (0..3).map(|_| scratch.server(&ServerSpec::with_coordinator(coord.addr))).collect();
        wait_registered(coord.addr, 3, 20).await;
        let client = client_with("failover", Some(coord.addr), |o| {
            // Small batches and frames, few bytes in flight: many pushes, some always pending.
            o.batch_bytes = 4 << 10;
            o.push_frame_bytes = 64 << 10;
            o.max_inflight_bytes = 1 << 20;
        });
        client.register_app().await.unwrap();
        // Maps 0-3 push around the loss; map 4 (only when restarting) starts after it.
        let (maps, parts, per_map) = (4u32 + restart as u32, 12u32, 600u32);
        let a = client.register_shuffle(1, maps, parts, 2).await.unwrap();
        assert_eq!(a.servers.len(), 3);
        assert!(a.partitions.iter().all(|l| l.replica != NO_REPLICA && l.replica != l.primary));

        let written = Arc::new(AtomicU64::new(0));
        let third = Arc::new(Notify::new());
        let (killed_tx, killed_rx) = watch::channel(false);
        let mut tasks = Vec::new();
        for m in 0..maps {
            let (client, a, written, third, mut killed) =
                (client.clone(), a.clone(), written.clone(), third.clone(), killed_rx.clone());
            let late = m == 4;
            tasks.push(tokio::spawn(async move {
                if late {
                    killed.wait_for(|k| *k).await.expect("the test holds the sender");
                }
                let mut w = client.writer(a, m, 0).await?;
                let mut expected = Expected::default();
                for seq in 0..per_map {
                    if seq == per_map / 2 {
                        killed.wait_for(|k| *k).await.expect("the test holds the sender");
                    }
                    let p = seq % parts;
                    // Mostly small records (merged frames), every tenth a large batch (a Push).
                    let len = if seq % 10 == 0 { 80 << 10 } else { 300 };
                    let rec = record(m, 0, seq, len);
                    if len > 1000 {
                        w.add_batch(p, &framed(std::slice::from_ref(&rec))).await?;
                    } else {
                        w.write_record(p, &rec).await?;
                    }
                    expected.add(p, &rec, RecordId { map: m, attempt: 0, seq });
                    if written.fetch_add(1, Ordering::Relaxed) + 1 == (maps * per_map / 3) as u64 {
                        third.notify_one();
                    }
                }
                w.finish().await?;
                Ok::<_, ClientError>(expected)
            }));
        }
        third.notified().await;
        // The primary of partition 0: it holds data of every writer.
        let victim = addrs_of(&a)[a.partitions[0].primary as usize];
        servers.iter_mut().find(|s| s.addr == victim).expect("victim").kill();
        let at_kill = written.load(Ordering::Relaxed);
        if restart {
            let spec =
                ServerSpec { listen: Some(victim), ..ServerSpec::with_coordinator(coord.addr) };
            let back = scratch.server(&spec);
            assert_eq!(back.addr, victim, "restarted on the same address");
            servers.push(back);
        }
        killed_tx.send_replace(true);

        let mut expected = Expected::default();
        for (m, t) in tasks.into_iter().enumerate() {
            let e = t.await.unwrap().unwrap_or_else(|e| panic!("map {m} failed: {e}"));
            for (p, ids) in e.ids {
                expected.ids.entry(p).or_default().extend(ids);
            }
            for (p, (n, sum)) in e.tally {
                let t = expected.tally.entry(p).or_default();
                t.0 += n;
                t.1 += sum;
            }
        }
        let total = (4 * per_map) as u64;
        assert!(at_kill < total / 2 + 4, "killed after {at_kill} of {total} records");
        eprintln!("killed {victim} after {at_kill} of {total} records; every writer finished");

        let sizes = client.commit_shuffle(&a).await.expect("commit on the live servers");
        assert!(sizes.iter().all(|s| *s > 0), "every partition committed somewhere: {sizes:?}");
        expected.check(&client, &a, maps).await;
    }
}

/// A server's copy of a partition that lacks a map's `MapperEnd` (its writer gave up on it)
/// answers `DATA_LOST` on `OpenStream`, naming the map; the native reader then reads the
/// replica, and with no other copy it reports the loss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_without_a_map_end_is_data_lost_and_the_replica_is_read() {
    bounded("a_copy_without_a_map_end_is_data_lost_and_the_replica_is_read", 60, async {
        let scratch = Scratch::new();
        let (s0, s1) =
            (scratch.server(&ServerSpec::default()), scratch.server(&ServerSpec::default()));
        let app = "partial-copy";
        let client = client(app, None);
        // Partition 0 on s0 (replica s1), partition 1 on s1 (replica s0).
        let a = replicated(1, &[s0.addr, s1.addr], 2);
        register_direct(&client, &a, 2).await.unwrap();
        let mut expected = Expected::default();

        // Map 0: the native writer, to both copies, ends on both.
        let mut w = client.writer(a.clone(), 0, 0).await.unwrap();
        for seq in 0..40u32 {
            let rec = record(0, 0, seq, 200);
            w.write_record(seq % 2, &rec).await.unwrap();
            expected.add(seq % 2, &rec, RecordId { map: 0, attempt: 0, seq });
        }
        w.finish().await.unwrap();

        // Map 1, by hand: three batches per partition to both copies, MapperEnd to s1 only.
        let (c0, c1) = (raw(s0.addr).await, raw(s1.addr).await);
        for p in 0..2u32 {
            for batch_id in 0..3u32 {
                let seq = 100 + p * 10 + batch_id;
                let rec = record(1, 0, seq, 500);
                let mut body = BytesMut::new();
                put_batch(&mut body, 1, 0, batch_id, &framed(std::slice::from_ref(&rec)));
                let push = Push { app_id: app.into(), shuffle_id: 1, partition_id: p };
                for c in [&c0, &c1] {
                    let (m, _) = call_body(c, push.clone(), body.clone().freeze()).await.unwrap();
                    assert!(matches!(m, Message::PushAck(_)), "{m:?}");
                }
                expected.add(p, &rec, RecordId { map: 1, attempt: 0, seq });
            }
        }
        let end = MapperEnd {
            app_id: app.into(),
            shuffle_id: 1,
            map_id: 1,
            attempt_id: 0,
            batch_counts: (0..2).map(|p| BatchCount { partition_id: p, batches: 3 }).collect(),
        };
        assert!(matches!(call(&c1, end).await, Ok(Message::MapperEndResult(_))));
        client.commit_shuffle(&a).await.expect("commit on both servers");

        // s0 holds every batch of map 1, but no MapperEnd: its copy is not served as complete.
        let open = |map_start, map_end| OpenStream {
            app_id: app.into(),
            shuffle_id: 1,
            partition_id: 0,
            map_start,
            map_end,
            attempts: vec![],
        };
        match c0.request(open(0, 2).into(), Body::Empty).await {
            Err(TransportError::Remote { code, message }) => {
                assert_eq!(code, ErrorCode::DataLost);
                assert!(message.contains("map 1 "), "the message names the map: {message}");
            }
            other => panic!("OpenStream of an incomplete copy: {other:?}"),
        }
        // Map 0 alone is complete there.
        match call(&c0, open(0, 1)).await {
            Ok(Message::StreamHandle(h)) => {
                assert_eq!(h.committed.len(), 1, "{h:?}");
                call(&c0, CloseStream { stream_id: h.stream_id }).await.unwrap();
            }
            other => panic!("OpenStream of map 0 only: {other:?}"),
        }

        // The native reader fails over to s1 for partition 0, reads s1 for partition 1.
        expected.check(&client, &a, 2).await;

        // With s0 as the only copy, the loss is reported.
        let only_s0 = assignment(1, &[s0.addr], 2);
        for p in 0..2 {
            let r = read_partition(&client, &only_s0, p, 0, 2).await;
            assert_eq!(code(r), ErrorCode::DataLost, "partition {p} from s0 alone");
        }
    })
    .await
}

/// A server that stops answering (SIGSTOP) while a map pushes: the writer gives up on it after
/// its request timeouts and finishes with the other copies. Resumed, the server commits, but it
/// never serves its partial copy of the map: readers get `DATA_LOST` there and read the replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_server_is_given_up_and_its_partial_copy_never_read() {
    bounded("a_stalled_server_is_given_up_and_its_partial_copy_never_read", 90, async {
        let scratch = Scratch::new();
        let (s0, s1) =
            (scratch.server(&ServerSpec::default()), scratch.server(&ServerSpec::default()));
        let client = client_with("stalled", None, |o| {
            o.transport.request_timeout_ms = 1_000;
            o.transport.connect_timeout_ms = 1_000;
            o.error_max_retries = 1;
            o.batch_bytes = 4 << 10;
            o.push_frame_bytes = 32 << 10;
        });
        let parts = 4u32;
        let a = replicated(1, &[s0.addr, s1.addr], parts);
        register_direct(&client, &a, 1).await.unwrap();

        let mut expected = Expected::default();
        let mut w = client.writer(a.clone(), 0, 0).await.unwrap();
        let mut write = async |w: &mut sluice_client::ShuffleWriter, seq: u32| {
            let rec = record(0, 0, seq, 300);
            expected.add(seq % parts, &rec, RecordId { map: 0, attempt: 0, seq });
            w.write_record(seq % parts, &rec).await
        };
        for seq in 0..400 {
            write(&mut w, seq).await.unwrap();
        }
        // Stall s0 (it keeps its sockets and its data), push on, finish.
        let pid = s0.pid();
        assert_eq!(unsafe { libc::kill(pid as libc::pid_t, libc::SIGSTOP) }, 0);
        let stopped = eventually(5, || proc_state(pid) == Some('T')).await;
        assert!(stopped, "s0 did not stop");
        let stalled = Instant::now();
        for seq in 400..800 {
            write(&mut w, seq).await.expect("pushing past a stalled server");
        }
        let finished = w.finish().await;
        assert_eq!(unsafe { libc::kill(pid as libc::pid_t, libc::SIGCONT) }, 0);
        finished.expect("the writer finishes on s1");
        eprintln!("finished {:?} after stalling s0", stalled.elapsed());

        // A fresh client: the writer's pool may still be backing off from s0.
        let client = utils::client("stalled", None);
        let sizes = client.commit_shuffle(&a).await.expect("both servers commit");
        assert!(sizes.iter().all(|s| *s > 0), "{sizes:?}");
        // s0 holds part of map 0 for its partitions, and no MapperEnd.
        let c0 = raw(s0.addr).await;
        for p in 0..parts {
            let open = OpenStream {
                app_id: "stalled".into(),
                shuffle_id: 1,
                partition_id: p,
                map_start: 0,
                map_end: 1,
                attempts: vec![],
            };
            assert_eq!(call(&c0, open).await.err(), Some(ErrorCode::DataLost), "partition {p}");
        }
        expected.check(&client, &a, 1).await;
    })
    .await
}

/// The state letter of a process (`R`, `S`, `T` for stopped, …) from `/proc/PID/stat`.
fn proc_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "PID (COMM) STATE …"; COMM may hold spaces and parentheses, so look after the last ')'.
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// Losing the second copy of a partition fails the attempt with `CopiesLost` (not after long),
/// and a commit with no server left for a partition fails the same way. A failure that is the
/// request's own (the shuffle is committed) fails a replicated writer at once, as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_both_copies_is_a_clear_error() {
    bounded("losing_both_copies_is_a_clear_error", 60, async {
        let scratch = Scratch::new();
        let mut s0 = scratch.server(&ServerSpec::default());
        let mut s1 = scratch.server(&ServerSpec::default());
        let client = client_with("both-lost", None, |o| o.max_inflight_bytes = 2 << 20);
        let a = replicated(1, &[s0.addr, s1.addr], 4);
        register_direct(&client, &a, 2).await.unwrap();
        let big = |m, seq| framed(&[record(m, 0, seq, 64 << 10)]);

        // Map 0 loses s0 mid-push and finishes on s1.
        let mut w0 = client.writer(a.clone(), 0, 0).await.unwrap();
        for seq in 0..20 {
            w0.add_batch(seq % 4, &big(0, seq)).await.unwrap();
        }
        s0.kill();
        for seq in 20..60 {
            w0.add_batch(seq % 4, &big(0, seq)).await.expect("pushing with s1 alive");
        }
        w0.finish().await.expect("map 0 finishes on s1");

        // Map 1 then loses s1 too.
        let mut w1 = client.writer(a.clone(), 1, 0).await.unwrap();
        w1.add_batch(0, &big(1, 0)).await.unwrap();
        s1.kill();
        let killed = Instant::now();
        let failed = async {
            for seq in 1..1_000 {
                if let Err(e) = w1.add_batch(seq % 4, &big(1, seq)).await {
                    return e;
                }
            }
            w1.finish().await.expect_err("finish with both servers dead")
        };
        let e = tokio::time::timeout(Duration::from_secs(20), failed)
            .await
            .expect("the writer noticed within 20 s");
        eprintln!("map 1 failed {:?} after the second kill: {e}", killed.elapsed());
        assert!(matches!(e, ClientError::CopiesLost { .. }), "{e:?}");

        let e = client.commit_shuffle(&a).await.expect_err("commit with no server left");
        assert!(matches!(e, ClientError::CopiesLost { .. }), "{e:?}");

        // The request's own failure: a replicated writer of a committed shuffle fails with it.
        let (t0, t1) =
            (scratch.server(&ServerSpec::default()), scratch.server(&ServerSpec::default()));
        let b = replicated(2, &[t0.addr, t1.addr], 2);
        register_direct(&client, &b, 1).await.unwrap();
        client.commit_shuffle(&b).await.unwrap();
        let mut w = client.writer(b.clone(), 0, 0).await.unwrap();
        let r = async {
            w.add_batch(0, &big(0, 0)).await?;
            w.add_batch(1, &big(0, 1)).await?;
            w.finish().await
        };
        match r.await {
            Err(e @ ClientError::CopiesLost { .. }) => panic!("the request's fault, yet: {e}"),
            Err(e) => assert_eq!(e.code(), ErrorCode::ShuffleCommitted, "{e}"),
            Ok(b) => panic!("pushed to a committed shuffle: {b:?}"),
        }
    })
    .await
}

/// A copy that has a map's `MapperEnd` but not all of its batches (a push lost between writer
/// and server): the reader finds the gap at the end of the stream and reads the missing batches
/// from the replica, delivering each record exactly once; with no replica the gap is `DATA_LOST`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_missing_from_one_copy_are_read_from_the_other() {
    bounded("batches_missing_from_one_copy_are_read_from_the_other", 60, async {
        let scratch = Scratch::new();
        let (s0, s1) =
            (scratch.server(&ServerSpec::default()), scratch.server(&ServerSpec::default()));
        let app = "gap";
        let client = client(app, None);
        // One partition: primary s0, replica s1.
        let a = replicated(1, &[s0.addr, s1.addr], 1);
        register_direct(&client, &a, 1).await.unwrap();
        let (c0, c1) = (raw(s0.addr).await, raw(s1.addr).await);
        let mut expected = Expected::default();
        for batch_id in 0..4u32 {
            let rec = record(0, 0, batch_id, 300);
            let mut body = BytesMut::new();
            put_batch(&mut body, 0, 0, batch_id, &framed(std::slice::from_ref(&rec)));
            let push = Push { app_id: app.into(), shuffle_id: 1, partition_id: 0 };
            // Batch 2 never reaches s0.
            let targets: &[&sluice_transport::Connection] =
                if batch_id == 2 { &[&c1] } else { &[&c0, &c1] };
            for c in targets {
                let (m, _) = call_body(c, push.clone(), body.clone().freeze()).await.unwrap();
                assert!(matches!(m, Message::PushAck(_)), "{m:?}");
            }
            expected.add(0, &rec, RecordId { map: 0, attempt: 0, seq: batch_id });
        }
        for c in [&c0, &c1] {
            let end = MapperEnd {
                app_id: app.into(),
                shuffle_id: 1,
                map_id: 0,
                attempt_id: 0,
                batch_counts: vec![BatchCount { partition_id: 0, batches: 4 }],
            };
            assert!(matches!(call(c, end).await, Ok(Message::MapperEndResult(_))));
        }
        client.commit_shuffle(&a).await.expect("commit");

        expected.check(&client, &a, 1).await;
        let r = read_partition(&client, &a, 0, 0, 1).await.unwrap();
        assert_eq!(r.batches_read, 4, "each batch delivered once");

        let only_s0 = assignment(1, &[s0.addr], 1);
        assert_eq!(code(read_partition(&client, &only_s0, 0, 0, 1).await), ErrorCode::DataLost);
    })
    .await
}
