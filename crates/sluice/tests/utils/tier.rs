//! What the object-store tests (`object_store.rs` on S3, `hdfs.rs` on HDFS) share: a shuffle
//! written and committed, every partition read back and checked, a read the store's death
//! cuts off, the metrics they wait for.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Child;
use std::sync::Arc;
use std::time::Duration;

use sluice_proto::message::Assignment;
use sluice_proto::ErrorCode;

use super::*;

/// Maps of each test shuffle.
pub const MAPS: u32 = 3;

/// A store's process, when running, and its log file; SIGKILLed on drop.
pub struct StoreProcess {
    pub child: Option<Child>,
    pub log: PathBuf,
}

impl StoreProcess {
    /// Sends `signal` (`STOP`, `CONT`) to the process: a stopped store takes connections (the
    /// kernel's backlog) and answers nothing.
    pub fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("store running").id().to_string();
        let mut kill = std::process::Command::new("kill");
        let ok = kill.args([&format!("-{signal}"), &pid]).status().unwrap();
        assert!(ok.success(), "kill -{signal} {pid}");
    }

    /// SIGKILLs the process (connections drop mid-answer).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for StoreProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Writes and commits shuffle `a`: MAPS maps of `per_map` batches (one 20 000-byte record
/// each) over its partitions; returns the records each partition must hold.
pub async fn write_shuffle(
    client: &sluice_client::ShuffleClient,
    a: &Arc<Assignment>,
    per_map: u32,
) -> Vec<BTreeSet<RecordId>> {
    let parts = a.partitions.len() as u32;
    register_direct(client, a, MAPS).await.unwrap();
    for t in spawn_writers(client, a, MAPS, per_map, 20_000, move |m, s| (m + s) % parts) {
        t.await.unwrap().unwrap();
    }
    client.commit_shuffle(a).await.unwrap();
    let mut want = vec![BTreeSet::new(); parts as usize];
    for map in 0..MAPS {
        for seq in 0..per_map {
            want[((map + seq) % parts) as usize].insert(RecordId { map, attempt: 0, seq });
        }
    }
    want
}

/// Reads every partition of `a` and checks it holds exactly `want` (each record's bytes are
/// checked by `parse_records`, each batch's CRC by the reader).
pub async fn check_all(
    client: &sluice_client::ShuffleClient,
    a: &Assignment,
    want: &[BTreeSet<RecordId>],
) {
    for (p, want) in want.iter().enumerate() {
        let got = read_partition(client, a, p as u32, 0, MAPS)
            .await
            .unwrap_or_else(|e| panic!("partition {p}: {e}"));
        let ids: BTreeSet<RecordId> =
            got.unique_ids(format!("partition {p}")).into_iter().collect();
        assert_eq!(&ids, want, "partition {p}: other records than written");
    }
}

/// Metric `name` of `p` now.
pub async fn metric_of(p: &Proc, name: &str) -> f64 {
    sluice_testkit::metric(&p.metrics().await, name)
}

/// Waits (≤ `secs`) until metric `name` of `p` is at least `at_least`.
pub async fn wait_metric(p: &Proc, name: &str, at_least: f64, secs: u64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        let v = metric_of(p, name).await;
        if v >= at_least {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{name} is {v}, not {at_least}, after {secs} s; server log:\n{}",
            p.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Reads 5 batches of partition 0 of `a` (which must hold `want`, and more than 5 batches),
/// runs `kill_store`, and reads on: the reader must get `STORAGE_FAILED` (retriable) before the
/// partition's end, every record it delivered be one written, and `server` have logged and
/// counted the failure.
pub async fn check_store_killed_mid_read(
    client: &sluice_client::ShuffleClient,
    a: &Assignment,
    want: &BTreeSet<RecordId>,
    server: &Proc,
    kill_store: impl FnOnce(),
) {
    let mut reader = client.reader(a, 0, 0, MAPS).await.unwrap();
    let mut before = Vec::new();
    for _ in 0..5 {
        let b = reader.next_batch().await.unwrap().expect("more batches");
        before.extend(parse_records(&b));
    }
    kill_store();
    let failed = loop {
        match reader.next_batch().await {
            Ok(Some(b)) => before.extend(parse_records(&b)),
            Ok(None) => panic!("the whole partition was read with the store down"),
            Err(e) => break e,
        }
    };
    assert_eq!(failed.code(), ErrorCode::StorageFailed, "{failed}");
    assert!(failed.is_retriable(), "{failed}");
    assert!(before.len() < want.len(), "the read did not stop");
    for (id, _) in &before {
        assert!(want.contains(id), "record {id:?} was never written");
    }
    assert!(server.log_text().contains("object store read failed"), "no log line");
    assert!(metric_of(server, "sluice_server_object_store_errors_total").await >= 1.0);
}

/// Stops the store (`SIGSTOP`: connections accepted, nothing answered) while partition 0 of
/// `a` is read: the read must fail with `STORAGE_FAILED` well within 15 s, not hang; then
/// resumes it (`SIGCONT`) and checks every partition reads back as `want`.
pub async fn check_store_hang(
    client: &sluice_client::ShuffleClient,
    a: &Assignment,
    want: &[BTreeSet<RecordId>],
    store: &StoreProcess,
) {
    store.signal("STOP");
    let started = std::time::Instant::now();
    let hung = read_partition(client, a, 0, 0, MAPS).await;
    let waited = started.elapsed();
    store.signal("CONT");
    assert_eq!(code(hung), ErrorCode::StorageFailed);
    assert!(waited < Duration::from_secs(15), "a hung store held the read {waited:?}");
    check_all(client, a, want).await;
}
