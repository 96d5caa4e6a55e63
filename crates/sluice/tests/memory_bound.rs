//! The memory budget holds under load: 16 concurrent map tasks push 3× the budget into one
//! server; every record comes back, the server's peak resident memory stays within the budget
//! plus a fixed allowance, and its metrics show the budget was actually under pressure.

mod utils;

use std::collections::HashMap;
use std::time::Duration;

use sluice_client::ShuffleClient;
use utils::*;

const BUDGET: u64 = 128 << 20;
/// Resident memory allowed on top of the budget (code, runtime, socket buffers, allocator slack).
const ALLOWANCE: u64 = 64 << 20;
const MAPS: u32 = 16;
const PARTITIONS: u32 = 32;
const BYTES_PER_MAP: usize = 24 << 20;
const RECORD_BYTES: usize = 128 << 10;

/// Bytes in MiB, for messages.
fn mib(bytes: f64) -> f64 {
    bytes / (1 << 20) as f64
}

/// A client for a server pushed far past its budget: 8 MiB in flight, and `Busy` retried for as
/// long as the test's deadline allows (under CPU contention one push can lose the race for budget
/// many times, since `Busy` replies are not served in order).
fn patient_client(app: &str) -> ShuffleClient {
    client_with(app, None, |o| {
        o.max_inflight_bytes = 8 << 20;
        o.busy_max_retries = u32::MAX;
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_writers_stay_within_the_memory_budget() {
    bounded("sixteen_writers_stay_within_the_memory_budget", 60, async {
        let scratch = Scratch::new();
        let coord = scratch.coordinator();
        let spec = ServerSpec {
            memory_budget_bytes: BUDGET,
            metrics: true,
            // Partition buffers large enough (32 × 8 MiB) that only the budget's watermarks,
            // not the chunk size, decide when data leaves memory.
            // No early flushes: they would keep the budget from ever filling.
            sets: vec!["chunk_bytes=8388608".into(), "early_flush_bytes=0".into()],
            ..ServerSpec::with_coordinator(coord.addr)
        };
        let server = scratch.server(&spec);
        wait_registered(coord.addr, 1, 15).await;
        let client = client_with("memory", Some(coord.addr), |o| {
            o.max_inflight_bytes = 16 << 20;
        });
        client.register_app().await.unwrap();
        let a = client.register_shuffle(0, MAPS, PARTITIONS, 1).await.unwrap();

        // Expected per partition: (records, sum of CRC32C).
        let records_per_map = (BYTES_PER_MAP / RECORD_BYTES) as u32;
        let mut expect: HashMap<u32, (usize, u64)> = HashMap::new();
        for m in 0..MAPS {
            for seq in 0..records_per_map {
                let p = (seq + m) % PARTITIONS;
                let e = expect.entry(p).or_default();
                e.0 += 1;
                e.1 += crc32c::crc32c(&record(m, 0, seq, RECORD_BYTES)) as u64;
            }
        }
        let tasks = spawn_writers(&client, &a, MAPS, records_per_map, RECORD_BYTES, |m, seq| {
            (seq + m) % PARTITIONS
        });
        for t in tasks {
            t.await.expect("map task").expect("map task pushes everything");
        }
        let before_commit = server.metrics().await;
        client.commit_shuffle(&a).await.expect("commit");

        for p in 0..PARTITIONS {
            let r = read_partition(&client, &a, p, 0, MAPS).await.expect("read");
            assert_eq!(r.tally(), expect[&p], "partition {p}: (records, checksum)");
            r.unique_ids(format!("partition {p}"));
        }

        let peak = server.peak_rss_bytes();
        let m = server.metrics().await;
        let total = (MAPS as usize * BYTES_PER_MAP) as f64;
        eprintln!(
            "server VmHWM {:.1} MiB; budget peak {:.1} MiB; busy replies {}; flushed before commit {:.1} MiB",
            mib(peak as f64),
            mib(metric(&m, "sluice_server_memory_peak_bytes")),
            metric(&m, "sluice_server_busy_replies_total"),
            mib(metric(&before_commit, "sluice_server_flushed_bytes_total")),
        );
        assert!(peak > 0, "VmHWM unreadable");
        assert!(
            peak <= BUDGET + ALLOWANCE,
            "server peak RSS {:.1} MiB exceeds budget + allowance {:.1} MiB",
            mib(peak as f64),
            mib((BUDGET + ALLOWANCE) as f64)
        );
        // The accounting never went over the budget...
        assert!(metric(&m, "sluice_server_memory_peak_bytes") <= BUDGET as f64);
        // ...but it was reached for: at least the flush watermark (0.7), and data was flushed
        // under pressure before the commit, and pushes were refused while busy or spilled.
        assert!(
            metric(&m, "sluice_server_memory_peak_bytes") >= 0.7 * BUDGET as f64,
            "budget never came under pressure: {m:?}"
        );
        assert!(
            metric(&before_commit, "sluice_server_flushed_bytes_total") >= total - BUDGET as f64,
            "too little flushed before the commit: {before_commit:?}"
        );
        assert!(metric(&m, "sluice_server_pushed_bytes_total") >= total);
        assert_eq!(metric(&m, "sluice_server_memory_used_bytes"), 0.0, "leaked reservations");
        // The commit flushed what was left in memory, and its wait was counted.
        assert_eq!(metric(&m, "sluice_server_commits_total"), 1.0, "{m:?}");
        assert!(metric(&m, "sluice_server_commit_wait_microseconds_total") > 0.0, "{m:?}");
    })
    .await
}

/// 8 writers push 320 MiB of 256 KiB batches at one server with an 8 MiB budget (configured
/// further with `sets`); every record is read back once. Returns the server's metrics.
async fn far_over_a_tiny_budget(app: &str, sets: &[&str]) -> HashMap<String, f64> {
    let scratch = Scratch::new();
    let budget: u64 = 8 << 20;
    let server = scratch.server(&ServerSpec {
        memory_budget_bytes: budget,
        metrics: true,
        sets: sets.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    });
    let client = patient_client(app);
    let parts = 8u32;
    let a = assignment(1, &[server.addr], parts);
    register_direct(&client, &a, 8).await.unwrap();
    let per_map = 160u32; // × 256 KiB = 40 MiB per map, 320 MiB in all
    let tasks = spawn_writers(&client, &a, 8, per_map, 256 << 10, move |_, seq| seq % parts);
    for t in tasks {
        if let Err(e) = t.await.unwrap() {
            panic!("a writer did not ride out the memory pressure: {e}");
        }
    }
    client.commit_shuffle(&a).await.unwrap();
    let mut n = 0;
    for p in 0..parts {
        let ids = read_partition(&client, &a, p, 0, 8).await.unwrap().unique_ids(p);
        assert!(ids.iter().all(|id| id.seq % parts == p));
        n += ids.len();
    }
    assert_eq!(n, 8 * per_map as usize);
    let m = server.metrics().await;
    eprintln!(
        "busy replies {}, pushes held {} ({:.0} ms in all), budget peak {:.1} MiB, VmHWM {:.1} MiB",
        metric(&m, "sluice_server_busy_replies_total"),
        metric(&m, "sluice_server_pushes_held_total"),
        metric(&m, "sluice_server_push_hold_microseconds_total") / 1e3,
        mib(metric(&m, "sluice_server_memory_peak_bytes")),
        mib(server.peak_rss_bytes() as f64)
    );
    assert!(metric(&m, "sluice_server_memory_peak_bytes") <= budget as f64);
    assert!(server.peak_rss_bytes() <= budget + ALLOWANCE, "VmHWM over budget + allowance");
    m
}

/// A budget far below the offered load, with holding off (`busy_hold_ms=0`): pushes are
/// answered `Busy`, writers back off and retry, and nothing is lost or duplicated.
///
/// It used to hang about one run in three: the budget wedged in the state that
/// `busy_then_stuck_between_resume_and_flush_watermarks` reproduces deterministically (seen:
/// `memory_used_bytes` 5.50 MiB of 8, busy replies climbing, nothing flushed, for minutes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tiny_budget_answers_busy_and_loses_nothing() {
    bounded("a_tiny_budget_answers_busy_and_loses_nothing", 45, async {
        let m = far_over_a_tiny_budget("tiny", &["busy_backoff_ms=5", "busy_hold_ms=0"]).await;
        assert!(metric(&m, "sluice_server_busy_replies_total") > 0.0, "never busy: {m:?}");
        assert_eq!(metric(&m, "sluice_server_pushes_held_total"), 0.0, "{m:?}");
    })
    .await
}

/// The same load with holding on: a push that finds the budget paused waits, unread, until the
/// flushers make room, so no push is refused and no body crosses the network twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_budget_holds_pushes_instead_of_refusing_them() {
    bounded("a_paused_budget_holds_pushes_instead_of_refusing_them", 45, async {
        // A hold far longer than flushing a few MiB takes, so none runs out here.
        let m = far_over_a_tiny_budget("held", &["busy_hold_ms=5000"]).await;
        assert!(metric(&m, "sluice_server_pushes_held_total") > 0.0, "never paused: {m:?}");
        assert_eq!(metric(&m, "sluice_server_busy_replies_total"), 0.0, "a push was refused");
        assert_eq!(
            metric(&m, "sluice_server_pushed_bytes_total"),
            metric(&m, "sluice_server_flushed_bytes_total"),
            "{m:?}"
        );
    })
    .await
}

/// Flushers that fall behind (lowest priority, one per directory) under 8 writers of 32 KiB
/// batches, 4x the budget in all: pushes are answered `Busy` while bodies are freed out of order
/// by the flushers. Resident memory stays within budget + allowance: bodies reuse pooled
/// buffers, and the server runs without transparent huge pages. Before, the allocator kept freed
/// bodies mapped while new ones took fresh memory (VmHWM here 87–136 MiB), and `sluice local`
/// with `flusher_nice=10` peaked at 333–372 MiB on a 256 MiB budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_flushers_keep_resident_memory_within_the_budget() {
    bounded("slow_flushers_keep_resident_memory_within_the_budget", 60, async {
        let scratch = Scratch::new();
        let budget: u64 = 64 << 20;
        let server = scratch.server(&ServerSpec {
            memory_budget_bytes: budget,
            metrics: true,
            sets: vec![
                "flusher_nice=19".into(),
                "flushers_per_dir=1".into(),
                "busy_backoff_ms=5".into(),
            ],
            ..Default::default()
        });
        if let Some(thp) = server.thp_enabled() {
            assert!(!thp, "the server runs with transparent huge pages allowed");
        }
        let client = patient_client("slow-flush");
        let (maps, parts, per_map) = (8u32, 32u32, 1024u32); // × 32 KiB: 32 MiB per map
        let a = assignment(1, &[server.addr], parts);
        register_direct(&client, &a, maps).await.unwrap();
        let tasks =
            spawn_writers(&client, &a, maps, per_map, 32 << 10, move |m, seq| (seq + m) % parts);
        for t in tasks {
            t.await.unwrap().expect("a writer rides out Busy");
        }
        client.commit_shuffle(&a).await.unwrap();
        let mut n = 0;
        for p in 0..parts {
            n += read_partition(&client, &a, p, 0, maps).await.unwrap().unique_ids(p).len();
        }
        assert_eq!(n, (maps * per_map) as usize);
        let m = server.metrics().await;
        let (reused, allocated) = (
            metric(&m, "sluice_server_body_buffers_reused_total"),
            metric(&m, "sluice_server_body_buffers_allocated_total"),
        );
        eprintln!(
            "busy replies {}, budget peak {:.1} MiB, VmHWM {:.1} MiB, body buffers reused {} / \
             allocated {}",
            metric(&m, "sluice_server_busy_replies_total"),
            mib(metric(&m, "sluice_server_memory_peak_bytes")),
            mib(server.peak_rss_bytes() as f64),
            reused,
            allocated
        );
        assert!(metric(&m, "sluice_server_memory_peak_bytes") >= 0.7 * budget as f64, "{m:?}");
        // 256 MiB went through a 64 MiB budget: bodies mostly land in buffers freed by earlier
        // ones.
        assert!(reused > 2.0 * allocated, "body buffers reused {reused}, allocated {allocated}");
        assert!(
            server.peak_rss_bytes() <= budget + ALLOWANCE,
            "VmHWM {:.1} MiB over budget + allowance",
            mib(server.peak_rss_bytes() as f64)
        );
    })
    .await
}

/// Deterministic reproduction of a wedged budget. With the default watermarks (flush 0.7,
/// busy 0.9, resume 0.6) on an 8 MiB budget:
/// 1. 11 pushes of 512 KiB to distinct partitions: 5.5 MiB buffered — under the flush watermark
///    (5.6 MiB) and each buffer under `chunk_bytes`, so nothing is flushed.
/// 2. One 2 MiB push would cross the busy watermark (7.2 MiB): `try_reserve` sets `paused` and
///    the push is answered `Busy`.
/// 3. Now every push is `Busy` (paused, and 5.5 MiB ≥ resume 4.8 MiB), while
///    `relieve_pressure` flushes nothing because 5.5 MiB < flush 5.6 MiB. Nothing else ever
///    lowers `used`: the server refuses pushes forever (only a commit would flush, and the maps
///    cannot finish to get there).
///
/// Fix idea: relieve pressure whenever the budget is paused (flush down to the resume mark), or
/// do not stay paused below the flush watermark.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_then_stuck_between_resume_and_flush_watermarks() {
    use bytes::BytesMut;
    use sluice_proto::batch::put_batch;
    use sluice_proto::message::*;
    use sluice_proto::Message;

    bounded("busy_then_stuck_between_resume_and_flush_watermarks", 30, async {
        let scratch = Scratch::new();
        let server = scratch.server(&ServerSpec {
            memory_budget_bytes: 8 << 20,
            metrics: true,
            // The wedge is in the `Busy` path: no holding, and no early flushes (the pushes must
            // fill the budget).
            sets: vec!["busy_hold_ms=0".into(), "early_flush_bytes=0".into()],
            ..Default::default()
        });
        let c = raw(server.addr).await;
        call(&c, RegisterApp { app_id: "wedge".into(), ..Default::default() }).await.unwrap();
        let reg = RegisterShuffle {
            app_id: "wedge".into(),
            shuffle_id: 1,
            num_maps: 1,
            num_partitions: 16,
            replication: 1,
        };
        call(&c, reg).await.unwrap();
        let body = |seq: u32, bytes: usize| {
            let mut b = BytesMut::new();
            put_batch(&mut b, 0, 0, seq, &vec![seq as u8; bytes - 20]);
            b.freeze()
        };
        let push = |p: u32| Push { app_id: "wedge".into(), shuffle_id: 1, partition_id: p };
        for p in 0..11 {
            let (m, _) = call_body(&c, push(p), body(p, 512 << 10)).await.unwrap();
            assert!(matches!(m, Message::PushAck(_)), "filling push {p}: {m:?}");
        }
        let (m, _) = call_body(&c, push(11), body(11, 2 << 20)).await.unwrap();
        assert!(matches!(m, Message::Busy(_)), "the push crossing the busy mark: {m:?}");

        // A small push must get in once the server has relieved the pressure.
        let start = std::time::Instant::now();
        let mut busy = 0;
        loop {
            match call_body(&c, push(12), body(12, 64 << 10)).await.unwrap().0 {
                Message::PushAck(_) => break,
                Message::Busy(b) => {
                    busy += 1;
                    if start.elapsed() > Duration::from_secs(10) {
                        let m = server.metrics().await;
                        panic!(
                            "still Busy after {busy} tries over 10 s; used {} of {} bytes, \
                             flushed {}",
                            metric(&m, "sluice_server_memory_used_bytes"),
                            metric(&m, "sluice_server_memory_budget_bytes"),
                            metric(&m, "sluice_server_flushed_bytes_total")
                        );
                    }
                    tokio::time::sleep(Duration::from_millis(b.backoff_ms as u64)).await;
                }
                other => panic!("push: {other:?}"),
            }
        }
    })
    .await
}
