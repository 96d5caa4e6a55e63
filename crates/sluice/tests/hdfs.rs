//! The object-store tier on a real HDFS: a MiniDFSCluster (one NameNode, one DataNode, 1 MiB
//! blocks) from `tests/hdfs` (hadoop-client-minicluster, Maven Central), started once by the
//! test on free ports. A `sluice server` whose disk watermark is tiny moves every committed
//! partition there (a multipart upload, several blocks each) and serves it back,
//! byte-identical, with its local files gone; after a SIGKILL and a restart it still does;
//! unregistering deletes the objects; an HDFS killed in the middle of a read gives
//! `STORAGE_FAILED` (retriable), never wrong bytes.
//!
//! Without Java or the MiniDFS's build (`build.rs` looks for both; `make test` builds it first
//! with `make hdfs-server`) the test is ignored with the reason `HDFS TESTS NOT RUN: …`: not
//! run, never passed. A MiniDFS that is there but does not start fails the test.

mod utils;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{ChildStdin, Command, Stdio};
use std::time::Duration;

use futures_util::TryStreamExt;
use object_store::ObjectStore;
use sluice_proto::ErrorCode;
use utils::tier::*;
use utils::*;

/// The HDFS directory the server writes under (`object_store.prefix`).
const PREFIX: &str = "sluice-test";

/// A running MiniDFSCluster (killed on drop; it also stops when its stdin closes).
struct MiniDfs {
    process: StoreProcess,
    /// Held open: the cluster runs until it closes.
    _stdin: Option<ChildStdin>,
    url: String,
}

impl MiniDfs {
    /// Starts one over `scratch/minidfs`; waits (≤ 180 s: a JVM and a cluster, on a loaded
    /// machine) for the URL it prints once it takes requests.
    fn start(scratch: &Path) -> MiniDfs {
        let (java, classpath) =
            match (option_env!("SLUICE_JAVA_BIN"), option_env!("SLUICE_MINIDFS_CP")) {
                (Some(j), Some(cp)) => (j, cp),
                // Only a test `cfg(no_minidfs)` leaves enabled gets here.
                _ => panic!("build.rs found no Java or no MiniDFS build, yet the test runs"),
            };
        let log = scratch.join("minidfs.log");
        let mut child = Command::new(java)
            .args(["-Xmx512m", "-cp", classpath, "sluice.minidfs.MiniHdfs"])
            .arg(scratch.join("minidfs"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {java}: {e}"));
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let mut dfs = MiniDfs {
            _stdin: child.stdin.take(),
            process: StoreProcess { child: Some(child), log },
            url: String::new(),
        };
        match rx.recv_timeout(Duration::from_secs(180)) {
            Ok(line) if line.starts_with("hdfs://") => dfs.url = line.trim().to_owned(),
            Ok(line) => {
                panic!("the MiniDFS did not start (it printed {line:?}): {}", dfs.log_text())
            }
            Err(_) => panic!("the MiniDFS did not start within 180 s: {}", dfs.log_text()),
        }
        dfs
    }

    /// SIGKILLs the cluster (NameNode and DataNode at once; connections drop mid-answer).
    fn kill(&mut self) {
        self.process.kill();
    }

    fn log_text(&self) -> String {
        self.process.log_text()
    }

    /// The objects under [`PREFIX`], by key, through a client of its own.
    async fn objects(&self) -> Vec<String> {
        let store = hdfs_native_object_store::HdfsObjectStoreBuilder::new()
            .with_url(&self.url)
            .build()
            .expect("an HDFS client");
        let listed = store.list(Some(&PREFIX.into())).map_ok(|m| m.location.to_string());
        let mut keys: Vec<String> = listed.try_collect().await.expect("listing the objects");
        keys.sort();
        keys
    }

    /// `--set`s for a server using this HDFS, moving everything committed at once (its disk
    /// is always over a watermark of one millionth).
    fn server_sets(&self) -> Vec<String> {
        [
            "chunk_bytes=65536".to_owned(),
            format!("object_store.hdfs_url={}", self.url),
            format!("object_store.prefix={PREFIX}"),
            "object_store.offload_high_watermark=0.000001".into(),
            "object_store.offload_low_watermark=0.0".into(),
            // Each operation as a whole: 2 s × 2 + 1 s (HDFS has no per-request bound).
            "object_store.request_timeout_ms=2000".into(),
            "object_store.max_retries=1".into(),
            "object_store.upload_part_bytes=5242880".into(),
        ]
        .to_vec()
    }
}

/// One test, so one MiniDFS start (the slow part) for all of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    no_minidfs,
    ignore = "HDFS TESTS NOT RUN: no Java or no MiniDFS build (make hdfs-server)"
)]
async fn committed_partitions_move_to_hdfs_are_served_from_it_and_a_dead_hdfs_is_a_retriable_error()
{
    bounded("committed_partitions_move_to_hdfs", 300, async {
        let scratch = Scratch::new();
        let mut dfs = MiniDfs::start(scratch.path());
        let (r, mut server) = Restartable::start_in(scratch, dfs.server_sets());
        let client = client("hdfs-app", None);

        // Two partitions of 300 records of 20 kB: 6 MB each, a multipart upload and six
        // 1 MiB blocks each, so ranged reads cross block boundaries.
        let a = assignment(1, &[r.addr], 2);
        let want = write_shuffle(&client, &a, 200).await;
        // A small second shuffle, to be unregistered.
        let b = assignment(2, &[r.addr], 1);
        let want_b = write_shuffle(&client, &b, 5).await;

        // Every partition moves: objects in HDFS under <prefix>/<app>/<shuffle>/, no partition
        // file left on the disk, the commit records still there.
        wait_metric(&server, "sluice_server_offloaded_partitions_total", 3.0, 90).await;
        assert!(eventually(10, || r.data_files().is_empty()).await, "{:?}", r.data_files());
        let objects = dfs.objects().await;
        assert_eq!(objects.len(), 3, "one object per partition file: {objects:?}");
        let of = |shuffle: u32| format!("{PREFIX}/hdfs-app/{shuffle}/");
        assert_eq!(objects.iter().filter(|k| k.starts_with(&of(1))).count(), 2, "{objects:?}");
        assert_eq!(objects.iter().filter(|k| k.starts_with(&of(2))).count(), 1, "{objects:?}");
        assert!(objects.iter().all(|k| k.ends_with(".data")), "{objects:?}");
        assert!(!r.files(|f| f.ends_with("1/index")).is_empty(), "the commit record is gone");
        let offloaded = metric_of(&server, "sluice_server_offloaded_bytes_total").await;
        assert!(offloaded >= (MAPS * 205 * 20_000) as f64, "{offloaded} bytes offloaded");
        assert!(server.log_text().contains("partition moved to the object store"), "no log line");

        // Read back from HDFS, byte-identical.
        check_all(&client, &a, &want).await;
        check_all(&client, &b, &want_b).await;
        let read = metric_of(&server, "sluice_server_object_store_read_bytes_total").await;
        assert!(read >= (MAPS * 205 * 20_000) as f64, "only {read} bytes read from HDFS");
        assert_eq!(metric_of(&server, "sluice_server_object_store_errors_total").await, 0.0);

        // Unregistering deletes that shuffle's object.
        client.unregister_shuffle(&b).await.unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while dfs.objects().await.len() != 2 {
            assert!(tokio::time::Instant::now() < deadline, "{:?}", dfs.objects().await);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }

        // SIGKILL and a restart: the record says where the partitions are.
        server.kill();
        let server = r.start();
        assert_eq!(metric_of(&server, "sluice_server_recovered_shuffles_total").await, 1.0);
        assert_eq!(metric_of(&server, "sluice_server_recovered_lost_total").await, 0.0);
        check_all(&client, &a, &want).await;
        assert!(r.data_files().is_empty(), "the restarted server holds partition files again");

        // An HDFS that hangs (stopped: connections accepted, nothing answered) is a retriable
        // error within the bound (2 s × 2 + 1 s a chunk), not a hang; resumed, it serves again.
        check_store_hang(&client, &a, &want, &dfs.process).await;

        // Some batches read, then HDFS dies: the reader gets STORAGE_FAILED (retriable)
        // within the bound, and every record it delivered before is sound.
        check_store_killed_mid_read(&client, &a, &want[0], &server, || dfs.kill()).await;

        // A retry while HDFS is down fails the same way, within the bound (2 s × 2 + 1 s).
        let started = std::time::Instant::now();
        let again = read_partition(&client, &a, 1, 0, MAPS).await;
        assert_eq!(code(again), ErrorCode::StorageFailed);
        assert!(started.elapsed() < Duration::from_secs(15), "{:?}", started.elapsed());
    })
    .await
}
