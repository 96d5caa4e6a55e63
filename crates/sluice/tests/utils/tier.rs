//! What the object-store tests (`object_store.rs` on S3, `hdfs.rs` on HDFS) share: a restartable
//! server, a shuffle written and committed, every partition read back and checked, the metrics
//! they wait for.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use sluice_proto::message::Assignment;

use super::*;

/// Maps of each test shuffle.
pub const MAPS: u32 = 3;

/// A server on two fixed directories and a fixed port, restartable (the shuffle's files, and
/// so the copies of its commit record, may be on either or both).
pub struct Restartable {
    pub scratch: Scratch,
    pub dirs: Vec<PathBuf>,
    pub addr: SocketAddr,
    pub sets: Vec<String>,
}

impl Restartable {
    pub fn start(&self) -> Proc {
        self.scratch.server(&ServerSpec {
            data_dirs: self.dirs.clone(),
            metrics: true,
            listen: (self.addr.port() != 0).then_some(self.addr),
            sets: self.sets.clone(),
            ..Default::default()
        })
    }

    pub fn files(&self, name: impl Fn(&Path) -> bool) -> Vec<PathBuf> {
        self.dirs.iter().flat_map(|d| files_under(d)).filter(|f| name(f)).collect()
    }

    pub fn data_files(&self) -> Vec<PathBuf> {
        self.files(|f| f.extension().is_some_and(|e| e == "data"))
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
