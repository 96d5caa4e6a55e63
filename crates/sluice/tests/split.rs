//! Partition splits with real processes: a coordinator and three servers. A partition pushed
//! past the servers' split threshold continues on other servers (its parts), and reads back
//! byte-identical through the native client, also over map ranges; a server whose disk fills
//! up mid-shuffle splits the partitions it holds instead of failing them.
//!
//! The full-disk case mounts a small tmpfs (root with CAP_SYS_ADMIN, as on this project's
//! machines); where `mount` is refused it prints SPLIT FULL-DISK TEST NOT RUN and checks
//! nothing.

mod utils;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use sluice_proto::message::Assignment;
use sluice_proto::ErrorCode;
use utils::*;

const MAPS: u32 = 4;
const PARTITIONS: u32 = 4;

/// Server addresses by index in the assignment.
fn server_of(a: &Assignment, index: u16) -> SocketAddr {
    addrs_of(a)[index as usize]
}

/// The records of partition `p` over maps `[start, end)`, as written: `(map, seq)` of every
/// batch for which `partition(map, seq) == p`.
fn expected(
    per_map: u32,
    start: u32,
    end: u32,
    p: u32,
    partition: impl Fn(u32, u32) -> u32,
) -> Vec<RecordId> {
    let mut v: Vec<RecordId> = (start..end)
        .flat_map(|m| (0..per_map).map(move |s| (m, s)))
        .filter(|&(m, s)| partition(m, s) == p)
        .map(|(map, seq)| RecordId { map, attempt: 0, seq })
        .collect();
    v.sort_unstable();
    v
}

async fn metric_sum(servers: &[Proc], name: &str) -> f64 {
    let mut total = 0.0;
    for s in servers {
        total += sluice_testkit::metric(&s.metrics().await, name);
    }
    total
}

/// Partition 0 takes three batches in four (20 KB records): 18 MB over a 1 MiB threshold.
fn skewed(m: u32, seq: u32) -> u32 {
    if !seq.is_multiple_of(4) {
        0
    } else {
        1 + (m + seq / 4) % (PARTITIONS - 1)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_past_the_split_threshold_reads_back_from_its_parts() {
    bounded("a_partition_past_the_split_threshold_reads_back_from_its_parts", 120, async {
        let scratch = Scratch::new();
        let coord = scratch.coordinator();
        let sets = vec![format!("split_threshold_bytes={}", 1 << 20), "chunk_bytes=65536".into()];
        let dirs: Vec<PathBuf> = (0..3).map(|i| scratch.path().join(format!("s{i}"))).collect();
        let servers: Vec<Proc> = dirs
            .iter()
            .map(|d| {
                scratch.server(&ServerSpec {
                    data_dirs: vec![d.clone()],
                    metrics: true,
                    sets: sets.clone(),
                    ..ServerSpec::with_coordinator(coord.addr)
                })
            })
            .collect();
        wait_registered(coord.addr, 3, 20).await;
        // Frames of 128 KiB and little in flight: a writer hears PushSplit while it still has
        // batches to route.
        let client = client_with("split-app", Some(coord.addr), |o| {
            o.push_frame_bytes = 128 << 10;
            o.max_inflight_bytes = 512 << 10;
        });
        client.register_app().await.unwrap();
        let a = client.register_shuffle(1, MAPS, PARTITIONS, 1).await.unwrap();
        assert_eq!(a.servers.len(), 3, "the spares are in the assignment: {a:?}");
        // A read tried before the commit fails, and leaves nothing behind: the reads below, of
        // the same client, must still find the parts the writers make.
        let early = read_partition(&client, &a, 0, 0, MAPS).await.map(|_| ()).unwrap_err();
        assert_eq!(early.code(), ErrorCode::ShuffleNotCommitted, "{early}");

        // 300 batches a map: each writer still has most of its batches to route when the
        // first PushSplit answers come back.
        const PER_MAP: u32 = 300;
        for t in spawn_writers(&client, &a, MAPS, PER_MAP, 20_000, skewed) {
            t.await.unwrap().expect("a writer");
        }
        let sizes = client.commit_shuffle(&a).await.expect("commit");

        let parts = client.splits(&a).await.unwrap();
        let p0 = parts.of(&a, 0);

        assert!(p0.len() >= 2, "partition 0 was not split: {p0:?}");
        let on: BTreeSet<SocketAddr> = p0.iter().map(|l| server_of(&a, l.primary)).collect();
        assert_eq!(on.len(), p0.len(), "two parts on one server: {p0:?}");
        assert!(metric_sum(&servers, "sluice_server_split_replies_total").await >= 1.0);
        // The sizes the commit reports add the parts up: at least the payload pushed.
        let pushed0 = expected(PER_MAP, 0, MAPS, 0, skewed).len() as u64 * 20_000;
        assert!(sizes[0] >= pushed0, "partition 0: {} bytes reported, {pushed0} pushed", sizes[0]);

        // Every partition whole, exactly once; map ranges across the parts too.
        for p in 0..PARTITIONS {
            let r = read_partition(&client, &a, p, 0, MAPS).await.expect("read");
            assert_eq!(
                r.unique_ids(format!("partition {p}")),
                expected(PER_MAP, 0, MAPS, p, skewed)
            );
        }
        for (start, end) in [(1, 3), (0, 1), (3, 4)] {
            let r = read_partition(&client, &a, 0, start, end).await.expect("range read");
            assert_eq!(
                r.unique_ids(format!("partition 0 maps {start}..{end}")),
                expected(PER_MAP, start, end, 0, skewed),
            );
        }
        // Named attempts (as Spark reads) go across the parts too.
        let named: Vec<(u32, u32)> = (0..MAPS).map(|m| (m, 0)).collect();
        let r = read_attempts(&client, &a, 0, 0, MAPS, &named).await.expect("named read");
        assert_eq!(r.unique_ids("partition 0, named"), expected(PER_MAP, 0, MAPS, 0, skewed));

        // Each part's server holds some of partition 0's data.
        let mut per_server: BTreeMap<SocketAddr, usize> = BTreeMap::new();
        for l in &p0 {
            let addr = server_of(&a, l.primary);
            let files = part_files(&servers, &dirs, addr);
            per_server.insert(addr, files);
        }
        assert!(per_server.values().all(|&n| n > 0), "a part without data: {per_server:?}");

        // A coordinator restarted without peers forgets the splits: a new reader reads every
        // server of the assignment instead, and still gets each partition whole, once.
        let mut coord = coord;
        coord.kill();
        let _coord = scratch.coordinator_on(&coord.addr.to_string());
        let fresh = utils::client("split-app", Some(coord.addr));
        for p in 0..PARTITIONS {
            let r = read_partition(&fresh, &a, p, 0, MAPS).await.expect("read, parts unknown");
            let want = expected(PER_MAP, 0, MAPS, p, skewed);
            assert_eq!(r.unique_ids(format!("partition {p}, parts unknown")), want);
        }
        let sizes_again = fresh.commit_shuffle(&a).await.expect("a second commit, parts unknown");
        assert_eq!(sizes_again, sizes, "the sizes add up the same without the coordinator's parts");
        for s in &servers {
            assert!(!s.log_text().contains("panicked"), "{}", s.log_text());
        }
    })
    .await
}

/// Partition-0 data files (`<dir>/<app>/<shuffle>/0-<n>.data`) in the data directory of the
/// server listening on `addr`.
fn part_files(servers: &[Proc], dirs: &[PathBuf], addr: SocketAddr) -> usize {
    let Some(i) = servers.iter().position(|s| s.addr == addr) else { return 0 };
    files_under(&dirs[i])
        .iter()
        .filter(|f| f.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("0-")))
        .count()
}

/// Every map pushes 64 KiB records round-robin over the partitions.
fn even(m: u32, seq: u32) -> u32 {
    (m + seq) % PARTITIONS
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_whose_disk_fills_splits_instead_of_failing() {
    bounded("a_server_whose_disk_fills_splits_instead_of_failing", 120, async {
        let scratch = Scratch::new();
        let Some(fs) = SmallFs::mount(&scratch.path().join("small"), 32, "SPLIT FULL-DISK TEST")
        else {
            return;
        };
        let coord = scratch.coordinator();
        // Server 0: a 32 MiB disk (4 MiB reserve) and an 8 MiB budget; it splits once less
        // than 8 MiB is left. The others have room.
        let small = scratch.server(&ServerSpec {
            data_dirs: vec![fs.0.join("data")],
            memory_budget_bytes: 8 << 20,
            metrics: true,
            sets: vec![format!("data_dir_reserve_bytes={}", 4 << 20)],
            ..ServerSpec::with_coordinator(coord.addr)
        });
        let others: Vec<Proc> = (0..2)
            .map(|_| {
                scratch.server(&ServerSpec {
                    metrics: true,
                    ..ServerSpec::with_coordinator(coord.addr)
                })
            })
            .collect();
        wait_registered(coord.addr, 3, 20).await;
        let client = client_with("full-split", Some(coord.addr), |o| {
            o.max_inflight_bytes = 2 << 20;
        });
        client.register_app().await.unwrap();
        let a = client.register_shuffle(1, MAPS, PARTITIONS, 1).await.unwrap();
        let small_index = addrs_of(&a).iter().position(|x| *x == small.addr);
        let Some(small_index) = small_index else {
            panic!("the small server is not in the assignment: {a:?}")
        };
        let on_small: Vec<u32> = (0..PARTITIONS)
            .filter(|&p| a.partitions[p as usize].primary as usize == small_index)
            .collect();
        assert!(!on_small.is_empty(), "no partition on the small server: {a:?}");

        // 4 maps × 512 records of 64 KiB, a quarter each per partition: 32 MiB per partition,
        // more than the small server's 28 MiB of room.
        const PER_MAP: u32 = 512;
        for t in spawn_writers(&client, &a, MAPS, PER_MAP, 64 << 10, even) {
            t.await.unwrap().expect("a writer, with the small server's disk filling up");
        }
        client.commit_shuffle(&a).await.expect("commit");
        let parts = client.splits(&a).await.unwrap();
        for &p in &on_small {
            let ps = parts.of(&a, p);
            assert!(ps.len() >= 2, "partition {p} on the small server was not split: {ps:?}");
        }
        for p in 0..PARTITIONS {
            let r = read_partition(&client, &a, p, 0, MAPS).await.expect("read");
            assert_eq!(r.unique_ids(format!("partition {p}")), expected(PER_MAP, 0, MAPS, p, even));
        }
        let m = small.metrics().await;
        assert!(sluice_testkit::metric(&m, "sluice_server_split_replies_total") >= 1.0);
        assert!(!small.log_text().contains("partition lost"), "{}", small.log_text());
        for s in others.iter().chain([&small]) {
            assert!(!s.log_text().contains("panicked"), "{}", s.log_text());
        }
        drop(small);
        tokio::time::sleep(Duration::from_millis(100)).await;
        drop(fs);
    })
    .await
}
