//! Recycled partition files on a real server: a deleted shuffle's files are reused by the next
//! shuffle's partitions, its stale bytes are never served and are cut off at the commit, and the
//! pool stays within its cap.

mod utils;

use std::path::Path;

use utils::*;

/// Writes `records` records of `len` bytes per partition from one map, commits and returns the
/// assignment.
async fn write_shuffle(
    client: &sluice_client::ShuffleClient,
    addr: std::net::SocketAddr,
    shuffle_id: u32,
    parts: u32,
    records: u32,
    len: usize,
) -> std::sync::Arc<sluice_proto::message::Assignment> {
    let a = assignment(shuffle_id, &[addr], parts);
    register_direct(client, &a, 1).await.unwrap();
    let mut w = client.writer(a.clone(), 0, shuffle_id).await.unwrap();
    for seq in 0..records * parts {
        w.write_record(seq % parts, &record(shuffle_id, shuffle_id, seq, len)).await.unwrap();
    }
    w.finish().await.expect("finish");
    client.commit_shuffle(&a).await.expect("commit");
    a
}

fn pool_files(dir: &Path) -> Vec<std::path::PathBuf> {
    files_under(&dir.join(".recycle"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_shuffles_files_are_reused_and_their_stale_bytes_never_served() {
    bounded("recycle", 60, async {
        let scratch = Scratch::new();
        let data = scratch.path().join("data");
        let server = scratch.server(&ServerSpec {
            data_dirs: vec![data.clone()],
            metrics: true,
            ..Default::default()
        });
        let client = client("rc", None);
        // Shuffle 1: big partitions (~2 MB each), then deleted: its 4 files go to the pool.
        let a1 = write_shuffle(&client, server.addr, 1, 4, 2000, 1000).await;
        client.unregister_shuffle(&a1).await.unwrap();
        let pooled = pool_files(&data);
        assert_eq!(pooled.len(), 4, "pool after deleting shuffle 1: {pooled:?}");
        let m = server.metrics().await;
        assert!(metric(&m, "sluice_server_recycle_pool_bytes") >= 4.0 * 2e6, "{m:?}");

        // Shuffle 2: small partitions written into those files; what lies past them is shuffle
        // 1's data, which must never come back.
        let a2 = write_shuffle(&client, server.addr, 2, 4, 50, 300).await;
        let m = server.metrics().await;
        assert_eq!(metric(&m, "sluice_server_recycled_files_reused_total"), 4.0, "{m:?}");
        assert!(pool_files(&data).is_empty(), "every pooled file was taken");
        for p in 0..4 {
            let r = read_partition(&client, &a2, p, 0, 1).await.expect("read shuffle 2");
            let ids = r.ids();
            assert_eq!(ids.len(), 50, "partition {p}: {} records", ids.len());
            assert!(ids.iter().all(|id| id.map == 2 && id.seq % 4 == p), "partition {p}: {ids:?}");
        }
        // The commit cut the reused files (2 MB of shuffle 1 each) to shuffle 2's data: about
        // 16 KB per partition, in whole pages. Nothing of shuffle 1 stays in them.
        let files: Vec<_> = files_under(&data)
            .into_iter()
            .filter(|p| p.extension().is_some_and(|e| e == "data"))
            .collect();
        assert_eq!(files.len(), 4, "{files:?}");
        for f in &files {
            let len = std::fs::metadata(f).unwrap().len();
            assert!(len > 0 && len < 64 << 10 && len % 4096 == 0, "{f:?}: {len} bytes");
        }
        client.unregister_shuffle(&a2).await.unwrap();
        // Back in the pool at their new length.
        let m = server.metrics().await;
        let pooled = metric(&m, "sluice_server_recycle_pool_bytes");
        assert!(pooled > 0.0 && pooled < 4.0 * 65536.0, "{m:?}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pool_keeps_no_more_than_its_cap_and_zero_turns_it_off() {
    bounded("recycle cap", 60, async {
        let scratch = Scratch::new();
        for (cap, want) in [(5_000_000u64, 2usize), (0, 0)] {
            let data = scratch.path().join(format!("data-{cap}"));
            let server = scratch.server(&ServerSpec {
                data_dirs: vec![data.clone()],
                sets: vec![format!("recycle_bytes_per_dir={cap}")],
                ..Default::default()
            });
            let client = client("cap", None);
            // Four files of ~2 MB each: a 5 MB pool keeps two, a 0 pool none.
            let a = write_shuffle(&client, server.addr, 1, 4, 2000, 1000).await;
            client.unregister_shuffle(&a).await.unwrap();
            assert_eq!(pool_files(&data).len(), want, "cap {cap}");
            let left: Vec<_> = files_under(&data)
                .into_iter()
                .filter(|p| p.extension().is_some_and(|e| e == "data"))
                .collect();
            assert!(left.is_empty(), "cap {cap}: shuffle files left: {left:?}");
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_server_starts_with_an_empty_pool() {
    bounded("recycle restart", 60, async {
        let scratch = Scratch::new();
        let data = scratch.path().join("data");
        let spec = ServerSpec { data_dirs: vec![data.clone()], ..Default::default() };
        let mut server = scratch.server(&spec);
        let client = client("rs", None);
        let a = write_shuffle(&client, server.addr, 1, 2, 100, 1000).await;
        client.unregister_shuffle(&a).await.unwrap();
        assert_eq!(pool_files(&data).len(), 2);
        server.kill();
        let _again = scratch.server(&spec);
        assert!(pool_files(&data).is_empty(), "{:?}", pool_files(&data));
    })
    .await;
}
