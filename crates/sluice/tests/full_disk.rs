//! A data directory whose file system fills up: pushes past the free space get a clear error
//! (never a hang or a crash), what was committed before is still served, and once a shuffle is
//! deleted the directory takes data again.
//!
//! The small file system is a 40 MiB tmpfs mounted for the test, which needs the right to mount
//! (root with CAP_SYS_ADMIN: the tests run so on this project's machines). Where `mount` is
//! refused, the test prints that it did not run and why, and passes without checking anything;
//! the storage and flusher unit tests cover the same logic without a real full disk.

mod utils;

use std::sync::Arc;
use std::time::Duration;

use sluice_client::{ClientError, ShuffleClient};
use sluice_proto::message::Assignment;
use sluice_proto::ErrorCode;
use utils::*;

const RECORD: usize = 64 << 10;
const PARTITIONS: u32 = 4;

/// Pushes `mib` MiB from one map into `a` (records of 64 KiB over 4 partitions) and finishes.
async fn push(client: &ShuffleClient, a: &Arc<Assignment>, mib: usize) -> Result<(), ClientError> {
    let mut w = client.writer(a.clone(), 0, 0).await?;
    for seq in 0..(mib << 20) / RECORD {
        let seq = seq as u32;
        w.add_batch(seq % PARTITIONS, &framed(&[record(0, 0, seq, RECORD)])).await?;
    }
    w.finish().await.map(|_| ())
}

/// Reads every partition of `a` back and checks the records' count and ids.
async fn verify(client: &ShuffleClient, a: &Assignment, mib: usize) {
    let mut n = 0;
    for p in 0..PARTITIONS {
        let r = read_partition(client, a, p, 0, 1).await.expect("read");
        n += r.unique_ids(format!("shuffle {} partition {p}", a.shuffle_id)).len();
    }
    assert_eq!(n, (mib << 20) / RECORD, "records of shuffle {}", a.shuffle_id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_data_clearly_and_recovers_when_space_is_freed() {
    bounded("a_full_disk_refuses_data_clearly_and_recovers_when_space_is_freed", 90, async {
        let scratch = Scratch::new();
        let Some(fs) = SmallFs::mount(&scratch.path().join("small"), 40, "FULL-DISK TEST") else {
            return;
        };
        let server = scratch.server(&ServerSpec {
            data_dirs: vec![fs.0.join("data")],
            sets: vec![format!("data_dir_reserve_bytes={}", 4 << 20)],
            metrics: true,
            ..Default::default()
        });
        let client = client("full", None);

        // 16 MiB fit: committed and readable.
        let first = assignment(1, &[server.addr], PARTITIONS);
        register_direct(&client, &first, 1).await.unwrap();
        push(&client, &first, 16).await.expect("16 MiB fit in 40");
        client.commit_shuffle(&first).await.expect("commit");
        verify(&client, &first, 16).await;

        // 32 more do not: the map's pushes or the commit fail with a storage error.
        let second = assignment(2, &[server.addr], PARTITIONS);
        register_direct(&client, &second, 1).await.unwrap();
        let outcome = match push(&client, &second, 32).await {
            Ok(()) => client.commit_shuffle(&second).await.map(|_| ()),
            Err(e) => Err(e),
        };
        let c = code(outcome);
        assert!(
            matches!(c, ErrorCode::StorageUnavailable | ErrorCode::StorageFailed),
            "32 MiB into ~20 MiB of room: {c:?}"
        );
        // The directory is marked full before the line is logged, and a push refused for it
        // may be answered in between (CI saw the error before the line): wait for it.
        let logged = eventually(10, || server.log_text().contains("data directory full")).await;
        let log = server.log_text();
        for l in log.lines().filter(|l| l.contains("full") || l.contains("no directory is left")) {
            eprintln!("server: {l}");
        }
        eprintln!("outcome: {c:?}");
        assert!(logged, "no \"data directory full\" line; log:\n{log}");
        assert!(!log.contains("panicked"), "log:\n{log}");
        assert_eq!(metric(&server.metrics().await, "sluice_server_data_dirs_full"), 1.0);

        // What was committed before is still served from the full directory.
        verify(&client, &first, 16).await;

        // Deleting the failed shuffle frees its space; within a few maintenance ticks the
        // directory takes data again and a new shuffle goes through whole.
        client.unregister_shuffle(&second).await.expect("unregister");
        let back = eventually(10, || server.log_text().contains("back in use")).await;
        assert!(back, "the directory never came back; log:\n{}", server.log_text());
        assert_eq!(metric(&server.metrics().await, "sluice_server_data_dirs_full"), 0.0);
        let third = assignment(3, &[server.addr], PARTITIONS);
        register_direct(&client, &third, 1).await.unwrap();
        push(&client, &third, 8).await.expect("8 MiB after space was freed");
        client.commit_shuffle(&third).await.expect("commit after space was freed");
        verify(&client, &third, 8).await;
        verify(&client, &first, 16).await;

        drop(server);
        tokio::time::sleep(Duration::from_millis(100)).await;
        drop(fs);
    })
    .await
}
