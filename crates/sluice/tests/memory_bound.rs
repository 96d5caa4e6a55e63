//! The memory budget holds under load: 16 concurrent map tasks push 3× the budget into one
//! server; every record comes back, the server's peak resident memory stays within the budget
//! plus a fixed allowance, and its metrics show the budget was actually under pressure.

mod utils;

use std::collections::HashMap;

use utils::*;

const BUDGET: u64 = 128 << 20;
/// Resident memory allowed on top of the budget (code, runtime, socket buffers, allocator slack).
const ALLOWANCE: u64 = 64 << 20;
const MAPS: u32 = 16;
const PARTITIONS: u32 = 32;
const BYTES_PER_MAP: usize = 24 << 20;
const RECORD_BYTES: usize = 128 << 10;

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
            sets: vec!["chunk_bytes=8388608".into()],
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
        let mut tasks = Vec::new();
        for m in 0..MAPS {
            for seq in 0..records_per_map {
                let p = (seq + m) % PARTITIONS;
                let e = expect.entry(p).or_default();
                e.0 += 1;
                e.1 += crc32c::crc32c(&record(m, 0, seq, RECORD_BYTES)) as u64;
            }
            let (client, a) = (client.clone(), a.clone());
            tasks.push(tokio::spawn(async move {
                let mut w = client.writer(a, m, 0).await?;
                for seq in 0..records_per_map {
                    let payload = framed(&[record(m, 0, seq, RECORD_BYTES)]);
                    w.add_batch((seq + m) % PARTITIONS, &payload).await?;
                }
                w.finish().await
            }));
        }
        for t in tasks {
            t.await.expect("map task").expect("map task pushes everything");
        }
        let before_commit = server.metrics().await;
        client.commit_shuffle(&a).await.expect("commit");

        for p in 0..PARTITIONS {
            let r = read_partition(&client, &a, p, 0, MAPS).await.expect("read");
            assert_eq!(r.tally(), expect[&p], "partition {p}: (records, checksum)");
            let ids = r.ids();
            let mut dedup = ids.clone();
            dedup.dedup();
            assert_eq!(ids.len(), dedup.len(), "partition {p}: a record read twice");
        }

        let peak = server.peak_rss_bytes();
        let m = server.metrics().await;
        let mib = |b: f64| b / (1 << 20) as f64;
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
    })
    .await
}

/// A budget far below the offered load: pushes are answered `Busy`, writers back off and retry,
/// and nothing is lost or duplicated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tiny_budget_answers_busy_and_loses_nothing() {
    bounded("a_tiny_budget_answers_busy_and_loses_nothing", 45, async {
        let scratch = Scratch::new();
        let budget: u64 = 8 << 20;
        let server = scratch.server(&ServerSpec {
            memory_budget_bytes: budget,
            metrics: true,
            sets: vec!["busy_backoff_ms=5".into()],
            ..Default::default()
        });
        let client = client_with("tiny", None, |o| {
            o.max_inflight_bytes = 8 << 20;
            // Busy replies are not served in order: under CPU contention one push can lose the
            // race for budget many times. Let the test deadline bound it, not the retry count.
            o.busy_max_retries = u32::MAX;
        });
        let parts = 8u32;
        let a = assignment(1, &[server.addr], parts);
        register_direct(&client, &a, 8).await.unwrap();
        let per_map = 160u32; // × 256 KiB = 40 MiB per map, 320 MiB in all
        let mut tasks = Vec::new();
        for m in 0..8u32 {
            let (client, a) = (client.clone(), a.clone());
            tasks.push(tokio::spawn(async move {
                let mut w = client.writer(a, m, 0).await?;
                for seq in 0..per_map {
                    w.add_batch(seq % parts, &framed(&[record(m, 0, seq, 256 << 10)])).await?;
                }
                w.finish().await
            }));
        }
        for t in tasks {
            if let Err(e) = t.await.unwrap() {
                panic!("a writer did not ride out Busy: {e}");
            }
        }
        client.commit_shuffle(&a).await.unwrap();
        let mut n = 0;
        for p in 0..parts {
            let r = read_partition(&client, &a, p, 0, 8).await.unwrap();
            let ids = r.ids();
            let mut dedup = ids.clone();
            dedup.dedup();
            assert_eq!(ids.len(), dedup.len(), "duplicates in partition {p}");
            assert!(ids.iter().all(|id| id.seq % parts == p));
            n += ids.len();
        }
        assert_eq!(n, 8 * per_map as usize);
        let m = server.metrics().await;
        eprintln!(
            "busy replies {}, budget peak {:.1} MiB, VmHWM {:.1} MiB",
            metric(&m, "sluice_server_busy_replies_total"),
            metric(&m, "sluice_server_memory_peak_bytes") / (1 << 20) as f64,
            server.peak_rss_bytes() as f64 / (1 << 20) as f64
        );
        assert!(metric(&m, "sluice_server_busy_replies_total") > 0.0, "never busy: {m:?}");
        assert!(metric(&m, "sluice_server_memory_peak_bytes") <= budget as f64);
        assert!(server.peak_rss_bytes() <= budget + ALLOWANCE, "VmHWM over budget + allowance");
    })
    .await
}
