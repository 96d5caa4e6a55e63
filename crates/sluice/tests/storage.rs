//! Data directories that cannot be written: refused pushes when none is usable, data landing in
//! the good one when another is bad, and a loud commit failure (not silent loss) when every
//! directory breaks after the pushes were accepted.
//!
//! Tests run as root, so permissions do not stop writes: a directory is made unusable by putting
//! its path under (or replacing it with) a regular file.

mod utils;

use std::path::{Path, PathBuf};

use bytes::BytesMut;
use sluice_proto::batch::put_batch;
use sluice_proto::message::*;
use sluice_proto::{ErrorCode, Message};
use utils::*;

/// A path under a regular file: `mkdir -p` of it fails with ENOTDIR.
fn under_a_file(scratch: &Scratch, name: &str) -> PathBuf {
    let f = scratch.path().join(format!("{name}-blocker"));
    std::fs::write(&f, b"not a directory").unwrap();
    f.join("data")
}

/// A server on `data_dirs` that flushes partitions only when full or at the commit
/// (`early_flush_bytes=0`, the default being 16 KiB): for tests that count on small pushes waiting
/// in memory for the commit (each partition one page-padded chunk; a directory broken after the
/// pushes fails the commit).
fn commit_flushes_only(data_dirs: Vec<PathBuf>) -> ServerSpec {
    ServerSpec { data_dirs, sets: vec!["early_flush_bytes=0".into()], ..Default::default() }
}

/// Replaces a (working) directory with a regular file.
fn break_dir(dir: &Path) {
    let gone = dir.with_extension("gone");
    std::fs::rename(dir, &gone).unwrap();
    std::fs::write(dir, b"not a directory any more").unwrap();
}

fn data_files(dir: &Path) -> Vec<PathBuf> {
    files_under(dir).into_iter().filter(|p| p.extension().is_some_and(|e| e == "data")).collect()
}

/// Every committed byte is in `files`: each partition here is flushed once, at commit, as one
/// chunk padded to a whole page (see the server's flusher), so the files hold the committed bytes
/// plus less than a page each.
fn assert_stored(files: &[PathBuf], committed: u64) {
    let on_disk: u64 = files.iter().map(|f| f.metadata().unwrap().len()).sum();
    let slack = 4096 * files.len() as u64;
    assert!(
        on_disk >= committed && on_disk < committed + slack,
        "{on_disk} bytes on disk in {} files vs. {committed} committed",
        files.len()
    );
    for f in files {
        assert_eq!(f.metadata().unwrap().len() % 4096, 0, "{f:?} is not page-padded");
    }
}

/// Writes `maps` maps of `per_map` records over `parts` partitions, commits, reads back and
/// checks every record. Returns the total bytes the commit reported.
async fn round_trip(
    client: &sluice_client::ShuffleClient,
    addr: std::net::SocketAddr,
    parts: u32,
) -> u64 {
    let a = assignment(1, &[addr], parts);
    register_direct(client, &a, 2).await.unwrap();
    for m in 0..2u32 {
        let mut w = client.writer(a.clone(), m, 0).await.unwrap();
        for seq in 0..200u32 {
            w.write_record(seq % parts, &record(m, 0, seq, 1000)).await.unwrap();
        }
        w.add_batch(0, &framed(&[record(m, 0, 1000, 100_000)])).await.unwrap();
        w.finish().await.expect("finish");
    }
    let sizes = client.commit_shuffle(&a).await.expect("commit");
    let mut n = 0;
    for p in 0..parts {
        let r = read_partition(client, &a, p, 0, 2).await.expect("read");
        for (id, _) in &r.records {
            assert!(id.seq == 1000 && p == 0 || id.seq % parts == p, "{id:?} in partition {p}");
        }
        n += r.records.len();
    }
    assert_eq!(n, 2 * 201, "records read back");
    sizes.iter().sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unusable_data_dir_refuses_pushes_with_storage_unavailable() {
    bounded("unusable_data_dir_refuses_pushes_with_storage_unavailable", 30, async {
        let scratch = Scratch::new();
        let bad = under_a_file(&scratch, "bad");
        let server = scratch.server(&ServerSpec { data_dirs: vec![bad], ..Default::default() });

        // Raw: the push itself is refused with the code.
        let c = raw(server.addr).await;
        call(&c, RegisterApp { app_id: "st".into(), ..Default::default() }).await.unwrap();
        let reg = RegisterShuffle {
            app_id: "st".into(),
            shuffle_id: 1,
            num_maps: 1,
            num_partitions: 2,
            replication: 1,
        };
        call(&c, reg).await.expect("registering a shuffle needs no disk");
        let mut body = BytesMut::new();
        put_batch(&mut body, 0, 0, 0, &framed(&[record(0, 0, 0, 64)]));
        let push = Push { app_id: "st".into(), shuffle_id: 1, partition_id: 0 };
        let e = call_body(&c, push, body.freeze()).await;
        assert_eq!(e.err(), Some(ErrorCode::StorageUnavailable));
        assert!(matches!(call(&c, Ping {}).await, Ok(Message::Pong(_))), "connection stays usable");

        // Through the native writer: the map attempt fails with the same code.
        let client = client("st", None);
        let a = assignment(1, &[server.addr], 2);
        let mut w = client.writer(a, 0, 0).await.unwrap();
        w.write_record(1, &record(0, 0, 1, 64)).await.unwrap();
        assert_eq!(code(w.finish().await), ErrorCode::StorageUnavailable);
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_and_good_data_dirs_store_everything_in_the_good_one() {
    bounded("bad_and_good_data_dirs_store_everything_in_the_good_one", 30, async {
        let scratch = Scratch::new();
        let bad = under_a_file(&scratch, "bad");
        let good = scratch.path().join("good");
        let server = scratch.server(&commit_flushes_only(vec![bad.clone(), good.clone()]));
        let client = client("two-dirs", None);
        let committed = round_trip(&client, server.addr, 4).await;
        let files = data_files(&good);
        assert!(!files.is_empty(), "no data files in the good directory");
        assert_stored(&files, committed);
        assert!(!bad.exists());
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dir_that_breaks_at_runtime_is_avoided() {
    bounded("a_dir_that_breaks_at_runtime_is_avoided", 30, async {
        let scratch = Scratch::new();
        let (d0, d1) = (scratch.path().join("d0"), scratch.path().join("d1"));
        // Both on one file system: equal free space, and the choice among equals is the last
        // directory, so the broken d0 is tried first.
        let server = scratch
            .server(&ServerSpec { data_dirs: vec![d1.clone(), d0.clone()], ..Default::default() });
        break_dir(&d0);
        let client = client("runtime-break", None);
        // 16 partitions: each picks a directory when its first file is created; whichever picks
        // the broken one must move to the other.
        let committed = round_trip(&client, server.addr, 16).await;
        let files = data_files(&d1);
        assert_stored(&files, committed);
        assert!(data_files(&d0.with_extension("gone")).is_empty());
        let log = server.log_text();
        assert!(log.contains("taken out of service"), "d0 was never tried; log:\n{log}");
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dir_breaking_after_accepting_pushes_fails_the_commit() {
    bounded("every_dir_breaking_after_accepting_pushes_fails_the_commit", 30, async {
        let scratch = Scratch::new();
        let d0 = scratch.path().join("only");
        let server = scratch.server(&commit_flushes_only(vec![d0.clone()]));
        let client = client("all-broken", None);
        let a = assignment(1, &[server.addr], 2);
        register_direct(&client, &a, 1).await.unwrap();
        let mut w = client.writer(a.clone(), 0, 0).await.unwrap();
        for seq in 0..100u32 {
            w.write_record(seq % 2, &record(0, 0, seq, 500)).await.unwrap();
        }
        // Small pushes stay in memory until the commit flushes them.
        w.finish().await.expect("pushes are accepted while the directory looks fine");
        break_dir(&d0);
        let e = client.commit_shuffle(&a).await;
        let c = code(e);
        assert!(
            matches!(c, ErrorCode::StorageFailed | ErrorCode::StorageUnavailable),
            "commit with nowhere to write: {c:?}"
        );
        // Readers are told the data is lost rather than served an empty partition.
        let r = read_partition(&client, &a, 0, 0, 1).await;
        assert!(r.is_err(), "read of a lost partition succeeded: {r:?}");
        // And new pushes are refused up front.
        let b = assignment(2, &[server.addr], 1);
        register_direct(&client, &b, 1).await.unwrap();
        let mut w = client.writer(b, 0, 0).await.unwrap();
        w.write_record(0, &record(0, 0, 0, 64)).await.unwrap();
        assert_eq!(code(w.finish().await), ErrorCode::StorageUnavailable);
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shuffle_directory_gone_under_a_live_server_fails_the_commit() {
    bounded("a_shuffle_directory_gone_under_a_live_server_fails_the_commit", 30, async {
        let scratch = Scratch::new();
        let d0 = scratch.path().join("only");
        let server =
            scratch.server(&ServerSpec { data_dirs: vec![d0.clone()], ..Default::default() });
        let client = client("dir-gone", None);
        let a = assignment(1, &[server.addr], 1);
        register_direct(&client, &a, 1).await.unwrap();
        let mut w = client.writer(a.clone(), 0, 0).await.unwrap();
        // A batch larger than a push's copies: written to its file before the commit.
        w.add_batch(0, &framed(&[record(0, 0, 0, 300_000)])).await.unwrap();
        w.finish().await.expect("pushes are accepted");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let file = loop {
            if let Some(f) = data_files(&d0).into_iter().next() {
                break f;
            }
            assert!(std::time::Instant::now() < deadline, "no data file written before the commit");
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        };
        // The shuffle's directory (its files with it) moves away while the server runs: the
        // commit must not be acknowledged without its record.
        let sdir = file.parent().unwrap().to_path_buf();
        std::fs::rename(&sdir, sdir.with_extension("moved")).unwrap();
        let e = client.commit_shuffle(&a).await;
        assert_eq!(code(e), ErrorCode::StorageFailed, "commit without its shuffle's directory");
        let log = server.log_text();
        assert!(log.contains("directory is gone"), "no log line says why; log:\n{log}");
    })
    .await
}
