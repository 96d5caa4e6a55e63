//! The object-store tier against a real S3-compatible server: `s3s-fs` (crates.io), started by
//! each test on a free port over a directory of its own, with SigV4 credentials. A `sluice
//! server` whose disk watermark is tiny moves every committed partition there and serves it
//! back, byte-identical, with its local files gone; after a SIGKILL and a restart it still
//! does; a store killed in the middle of a read gives `STORAGE_FAILED` (retriable), never
//! wrong bytes, and the same read succeeds once the store is back.
//!
//! Without `s3s-fs` (`build.rs` looks for it; `make test` installs it first with
//! `make s3-server`) the tests are ignored with the reason `OBJECT STORE TESTS NOT RUN: …`:
//! not run, never passed.

mod utils;

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use sluice_proto::ErrorCode;
use utils::tier::*;
use utils::*;

const BUCKET: &str = "sluice-test";
const ACCESS_KEY: &str = "sluice-test-access";
const SECRET_KEY: &str = "sluice-test-secret-key-0123456789";

/// The `s3s-fs` binary `build.rs` found.
fn s3s_fs() -> &'static str {
    // Only the tests `cfg(no_s3_server)` leaves enabled get here.
    match option_env!("SLUICE_S3S_FS_BIN") {
        Some(path) => path,
        None => panic!("build.rs found no s3s-fs, yet the test runs"),
    }
}

/// A running `s3s-fs` on 127.0.0.1:`port` over `root` (killed on drop).
struct Store {
    process: StoreProcess,
    root: PathBuf,
    port: u16,
}

impl Store {
    /// Starts a store on a free port, with the test bucket (a directory of its root).
    fn start(scratch: &Path) -> Store {
        let root = scratch.join("s3");
        std::fs::create_dir_all(root.join(BUCKET)).unwrap();
        let port = {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let mut s = Store {
            process: StoreProcess { child: None, log: scratch.join("s3s-fs.log") },
            root,
            port,
        };
        s.restart();
        s
    }

    /// (Re)starts the store on its port and root; waits (≤ 20 s) until it takes connections.
    fn restart(&mut self) {
        let log =
            std::fs::OpenOptions::new().create(true).append(true).open(&self.process.log).unwrap();
        let child = Command::new(s3s_fs())
            .args(["--host", "127.0.0.1", "--port", &self.port.to_string()])
            .args(["--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY])
            .arg(&self.root)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", s3s_fs()));
        self.process.child = Some(child);
        let addr = SocketAddr::from(([127, 0, 0, 1], self.port));
        for _ in 0..400 {
            if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("s3s-fs did not listen on {addr} within 20 s: {}", self.log_text());
    }

    /// SIGKILLs the store (connections drop mid-answer).
    fn kill(&mut self) {
        self.process.kill();
    }

    fn log_text(&self) -> String {
        self.process.log_text()
    }

    /// The objects the store holds (files under its bucket's directory, its own bookkeeping
    /// files aside).
    fn objects(&self) -> Vec<PathBuf> {
        files_under(&self.root.join(BUCKET))
            .into_iter()
            .filter(|f| f.extension().is_some_and(|e| e == "data"))
            .collect()
    }

    /// `--set`s for a server using this store, moving everything committed at once (its disk
    /// is always over a watermark of one millionth).
    fn server_sets(&self) -> Vec<String> {
        [
            "chunk_bytes=65536".to_owned(),
            format!("object_store.bucket={BUCKET}"),
            format!("object_store.endpoint=http://127.0.0.1:{}", self.port),
            "object_store.allow_http=true".into(),
            format!("object_store.access_key_id={ACCESS_KEY}"),
            format!("object_store.secret_access_key={SECRET_KEY}"),
            "object_store.offload_high_watermark=0.000001".into(),
            "object_store.offload_low_watermark=0.0".into(),
            "object_store.request_timeout_ms=1500".into(),
            "object_store.connect_timeout_ms=500".into(),
            "object_store.max_retries=1".into(),
            // The smallest part S3 allows: a partition file over 5 MiB goes up in parts.
            "object_store.upload_part_bytes=5242880".into(),
        ]
        .to_vec()
    }
}

/// A test's scratch directory and a store in it.
fn started() -> (Scratch, Store) {
    let scratch = Scratch::new();
    let store = Store::start(scratch.path());
    (scratch, store)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(no_s3_server, ignore = "OBJECT STORE TESTS NOT RUN: no s3s-fs (make s3-server)")]
async fn committed_partitions_move_to_the_store_and_are_served_from_it_also_after_a_restart() {
    bounded("committed_partitions_move_to_the_store", 120, async {
        let (scratch, store) = started();
        let (r, mut server) = Restartable::start_in(scratch, store.server_sets());
        let client = client("offload-app", None);
        let a = assignment(1, &[r.addr], 4);
        let want = write_shuffle(&client, &a, 30).await;

        // Every partition moves: objects in the store, no partition file left on the disk,
        // the commit record still there.
        wait_metric(&server, "sluice_server_offloaded_partitions_total", 4.0, 60).await;
        assert!(eventually(10, || r.data_files().is_empty()).await, "{:?}", r.data_files());
        assert_eq!(store.objects().len(), 4, "one object per partition file");
        let records = r.files(|f| f.ends_with("1/index"));
        assert!(!records.is_empty(), "the commit record is gone");
        let offloaded = metric_of(&server, "sluice_server_offloaded_bytes_total").await;
        assert!(offloaded >= (MAPS * 30 * 20_000) as f64, "{offloaded} bytes offloaded");
        assert!(metric_of(&server, "sluice_server_object_store_bytes").await > 0.0);
        assert!(server.log_text().contains("partition moved to the object store"), "no log line");

        // Read back from the store, byte-identical.
        check_all(&client, &a, &want).await;
        let read = metric_of(&server, "sluice_server_object_store_read_bytes_total").await;
        assert!(read >= (MAPS * 30 * 20_000) as f64, "only {read} bytes read from the store");
        assert_eq!(metric_of(&server, "sluice_server_object_store_errors_total").await, 0.0);

        // SIGKILL and a restart: the record says where the partitions are.
        server.kill();
        let server = r.start();
        assert_eq!(metric_of(&server, "sluice_server_recovered_shuffles_total").await, 1.0);
        assert_eq!(metric_of(&server, "sluice_server_recovered_lost_total").await, 0.0);
        check_all(&client, &a, &want).await;
        assert!(metric_of(&server, "sluice_server_object_store_read_bytes_total").await > 0.0);
        assert!(r.data_files().is_empty(), "the restarted server holds partition files again");

        // Unregistering deletes the objects too.
        client.unregister_shuffle(&a).await.unwrap();
        assert!(eventually(10, || store.objects().is_empty()).await, "{:?}", store.objects());
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(no_s3_server, ignore = "OBJECT STORE TESTS NOT RUN: no s3s-fs (make s3-server)")]
async fn a_store_killed_mid_read_is_a_retriable_error_and_the_read_succeeds_once_it_is_back() {
    bounded("a_store_killed_mid_read", 120, async {
        let (scratch, mut store) = started();
        let server = scratch.server(&ServerSpec {
            metrics: true,
            sets: store.server_sets(),
            ..Default::default()
        });
        let client = client("store-fail-app", None);
        // One partition of 300 records of 20 kB: about 90 chunks of 64 KiB.
        let a = assignment(1, &[server.addr], 1);
        let want = write_shuffle(&client, &a, 100).await;
        wait_metric(&server, "sluice_server_offloaded_partitions_total", 1.0, 60).await;
        let uploaded = metric_of(&server, "sluice_server_offloaded_bytes_total").await;
        assert!(uploaded > 5_242_880.0, "{uploaded} bytes: not a multipart upload");

        // Some batches read, then the store dies: the reader gets STORAGE_FAILED (retriable)
        // within the bound, and every record it delivered before is sound.
        check_store_killed_mid_read(&client, &a, &want[0], &server, || store.kill()).await;

        // A retry while the store is down fails the same way, quickly.
        let again = read_partition(&client, &a, 0, 0, MAPS).await;
        assert_eq!(code(again), ErrorCode::StorageFailed);

        // The store is back: the same read succeeds, byte-identical.
        store.restart();
        check_all(&client, &a, &want).await;

        // A store that hangs (stopped: connections accepted, nothing answered) is the same
        // retriable error within its bound (1.5 s a request, one retry, + 1 s), not a hang.
        check_store_hang(&client, &a, &want, &store.process).await;
    })
    .await
}

/// A move whose commit record cannot be rewritten (here: the record taken away while the store
/// was down) serves the partition from the store but keeps its local files, which the record
/// on disk still names; once the record can be rewritten, a later pass rewrites it and deletes
/// them — they are not stranded until the shuffle is deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(no_s3_server, ignore = "OBJECT STORE TESTS NOT RUN: no s3s-fs (make s3-server)")]
async fn local_files_a_failed_record_rewrite_kept_are_deleted_once_it_is_rewritten() {
    bounded("local_files_a_failed_record_rewrite_kept", 120, async {
        let (scratch, mut store) = started();
        store.kill(); // moves fail at their upload until it is back
        let (r, server) = Restartable::start_in(scratch, store.server_sets());
        let client = client("stranded-app", None);
        let a = assignment(1, &[r.addr], 2);
        let want = write_shuffle(&client, &a, 10).await;
        wait_metric(&server, "sluice_server_offload_failures_total", 1.0, 60).await;
        // The record away: the next move's rewrite finds none to replace.
        let records = r.index_files();
        assert_eq!(records.len(), 1, "{records:?}");
        let away = records[0].with_file_name("index.away");
        std::fs::rename(&records[0], &away).unwrap();
        let failures = metric_of(&server, "sluice_server_offload_failures_total").await;
        store.restart();
        wait_metric(&server, "sluice_server_offload_failures_total", failures + 1.0, 60).await;
        assert!(
            eventually(20, || server
                .log_text()
                .contains("the commit record could not be rewritten"))
            .await,
            "no rewrite failure logged"
        );
        assert!(!r.data_files().is_empty(), "local files deleted while the record names them");
        // Served from the store meanwhile, byte-identical.
        check_all(&client, &a, &want).await;
        // The record back: the next pass rewrites it and deletes the local files.
        std::fs::rename(&away, &records[0]).unwrap();
        assert!(eventually(30, || r.data_files().is_empty()).await, "{:?}", r.data_files());
        assert!(server.log_text().contains("commit record rewritten"), "no log line");
        // The record says where the data is now: a restart serves it from the store.
        let mut server = server;
        server.kill();
        let server = r.start();
        assert_eq!(metric_of(&server, "sluice_server_recovered_lost_total").await, 0.0);
        check_all(&client, &a, &want).await;
    })
    .await
}
