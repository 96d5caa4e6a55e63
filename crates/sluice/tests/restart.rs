//! Restart-safe servers: a committed shuffle survives SIGKILL and a restart on the same
//! directories, byte-identical; an uncommitted one is deleted at start; a damaged or truncated
//! commit record or data file makes partitions lost (`DATA_LOST`), never wrong bytes, and the
//! server starts; SIGTERM waits for open shuffles to be committed; a SIGKILL during a commit
//! leaves either the whole committed shuffle or a clean error.

mod utils;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_proto::message::Assignment;
use sluice_proto::ErrorCode;
use utils::*;

const PARTITIONS: u32 = 6;
const MAPS: u32 = 3;

/// Writes shuffle `a`: MAPS maps of 40 batches each over the partitions (map 1 also has a
/// second, losing attempt), committed when `commit`.
async fn write_shuffle(client: &sluice_client::ShuffleClient, a: &Arc<Assignment>, commit: bool) {
    register_direct(client, a, MAPS).await.unwrap();
    for t in spawn_writers(client, a, MAPS, 40, 20_000, |m, s| (m + s) % PARTITIONS) {
        t.await.unwrap().unwrap();
    }
    let mut w = client.writer(a.clone(), 1, 7).await.unwrap();
    for seq in 0..10 {
        w.add_batch(seq % PARTITIONS, &framed(&[record(1, 7, seq, 3000)])).await.unwrap();
    }
    w.finish().await.unwrap();
    if commit {
        client.commit_shuffle(a).await.unwrap();
    }
}

/// Every partition's records (ids and CRCs, sorted), or the error code of its read.
async fn read_all(
    client: &sluice_client::ShuffleClient,
    a: &Assignment,
) -> Vec<Result<Vec<(RecordId, u32)>, ErrorCode>> {
    let mut out = Vec::new();
    for p in 0..PARTITIONS {
        out.push(match read_partition(client, a, p, 0, MAPS).await {
            Ok(r) => {
                let mut v = r.records;
                v.sort();
                Ok(v)
            }
            Err(e) => Err(code::<()>(Err(e))),
        });
    }
    out
}

async fn metric(p: &Proc, name: &str) -> f64 {
    sluice_testkit::metric(&p.metrics().await, name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committed_shuffle_is_served_again_after_sigkill_and_restart() {
    bounded("a_committed_shuffle_is_served_again_after_sigkill_and_restart", 90, async {
        let (r, mut server) = Restartable::new(&["chunk_bytes=65536"]);
        let client = client("restart-app", None);
        let a = assignment(1, &[r.addr], PARTITIONS);
        write_shuffle(&client, &a, true).await;
        let b = assignment(2, &[r.addr], PARTITIONS);
        write_shuffle(&client, &b, false).await; // never committed
        let before = read_all(&client, &a).await;
        assert!(before.iter().all(|p| p.as_ref().is_ok_and(|v| !v.is_empty())), "{before:?}");
        let records: usize = before.iter().map(|p| p.as_ref().unwrap().len()).sum();
        assert_eq!(records, (MAPS * 40) as usize, "winners only");
        assert!(!r.index_files().is_empty(), "no commit record written");
        let uncommitted_dirs = r.dirs.iter().filter(|d| d.join("restart-app/2").exists()).count();
        assert!(uncommitted_dirs > 0, "the uncommitted shuffle has files");

        server.kill();
        let server = r.start();
        assert_eq!(metric(&server, "sluice_server_recovered_shuffles_total").await, 1.0);
        assert_eq!(metric(&server, "sluice_server_recovered_lost_total").await, 0.0);
        let after = read_all(&client, &a).await;
        assert_eq!(after, before, "the restarted server serves other bytes");
        // The losing attempt of map 1 is still there for a reader that names it.
        let named = read_attempts(&client, &a, 1, 1, 2, &[(1, 7)]).await.unwrap();
        assert!(named.records.iter().all(|(id, _)| id.attempt == 7) && !named.records.is_empty());
        // The uncommitted shuffle is gone: files and all.
        assert!(r.dirs.iter().all(|d| !d.join("restart-app/2").exists()));
        assert_eq!(code(read_partition(&client, &b, 0, 0, MAPS).await), ErrorCode::UnknownShuffle);
        // Still an ordinary shuffle: unregistering deletes it, and it stays deleted after a
        // restart.
        client.unregister_shuffle(&a).await.unwrap();
        assert!(r.data_files().is_empty() && r.index_files().is_empty());
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn applications_whose_ids_differ_only_in_punctuation_keep_their_data_apart() {
    bounded("applications_whose_ids_differ_only_in_punctuation", 90, async {
        // Before, every character but letters, digits, `-` and `_` became `_` in the data
        // directory's name: these two shared one directory, and the second one's files
        // overwrote the first's.
        let (r, mut server) = Restartable::new(&["chunk_bytes=65536"]);
        let (dot, underscore) = (client("etl.daily", None), client("etl_daily", None));
        let a = assignment(1, &[r.addr], PARTITIONS);
        write_shuffle(&dot, &a, true).await;
        let dot_records = read_all(&dot, &a).await;
        write_shuffle(&underscore, &a, false).await;
        // One shuffle of each holds data apart; their directories are named one to one.
        assert!(r.dirs.iter().any(|d| d.join("etl~2edaily/1").exists()));
        assert!(r.dirs.iter().any(|d| d.join("etl_daily/1").exists()));
        underscore.commit_shuffle(&a).await.unwrap();
        assert_eq!(read_all(&dot, &a).await, dot_records, "etl.daily reads other bytes");
        let underscore_records = read_all(&underscore, &a).await;
        assert!(underscore_records.iter().all(|p| p.as_ref().is_ok_and(|v| !v.is_empty())));

        // Both come back from a restart, each with its own bytes; deleting one leaves the other.
        server.kill();
        let _server = r.start();
        assert_eq!(metric(&_server, "sluice_server_recovered_shuffles_total").await, 2.0);
        assert_eq!(read_all(&dot, &a).await, dot_records);
        assert_eq!(read_all(&underscore, &a).await, underscore_records);
        underscore.unregister_shuffle(&a).await.unwrap();
        assert_eq!(
            read_all(&dot, &a).await,
            dot_records,
            "unregistering etl_daily took etl.daily's"
        );
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shuffle_in_a_directory_named_by_an_older_server_is_recovered_and_moved() {
    bounded("a_shuffle_in_a_directory_named_by_an_older_server", 90, async {
        let (r, mut server) = Restartable::new(&["chunk_bytes=65536"]);
        let dot = client("etl.daily", None);
        let a = assignment(1, &[r.addr], PARTITIONS);
        write_shuffle(&dot, &a, true).await;
        let before = read_all(&dot, &a).await;
        server.kill();
        // The layout of a server before the one-to-one names: `etl.daily` under `etl_daily`.
        for d in &r.dirs {
            if d.join("etl~2edaily").exists() {
                std::fs::rename(d.join("etl~2edaily"), d.join("etl_daily")).unwrap();
            }
        }
        let server = r.start();
        assert_eq!(metric(&server, "sluice_server_recovered_shuffles_total").await, 1.0);
        assert_eq!(metric(&server, "sluice_server_recovered_lost_total").await, 0.0);
        assert_eq!(read_all(&dot, &a).await, before, "other bytes after the upgrade");
        assert!(r.dirs.iter().all(|d| !d.join("etl_daily").exists()), "not moved");
        assert!(r.dirs.iter().any(|d| d.join("etl~2edaily/1").exists()));
        dot.unregister_shuffle(&a).await.unwrap();
        assert!(r.data_files().is_empty() && r.index_files().is_empty(), "not deleted");
    })
    .await
}

/// Copies directory `from` to `to`, files and subdirectories.
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shuffle_under_both_names_is_served_from_todays_and_the_older_copy_left_alone() {
    bounded("a_shuffle_under_both_names", 90, async {
        let (r, mut server) = Restartable::new(&["chunk_bytes=65536"]);
        let dot = client("etl.daily", None);
        let a = assignment(1, &[r.addr], PARTITIONS);
        write_shuffle(&dot, &a, true).await;
        let before = read_all(&dot, &a).await;
        server.kill();
        for d in &r.dirs {
            if d.join("etl~2edaily").exists() {
                copy_tree(&d.join("etl~2edaily"), &d.join("etl_daily"));
            }
        }
        let server = r.start();
        assert_eq!(metric(&server, "sluice_server_recovered_shuffles_total").await, 1.0);
        assert_eq!(metric(&server, "sluice_server_recovered_lost_total").await, 0.0);
        assert_eq!(read_all(&dot, &a).await, before);
        assert!(r.dirs.iter().any(|d| d.join("etl_daily/1").exists()), "the older copy went");
    })
    .await
}

/// Flips one byte in the middle of `path`.
fn damage(path: &Path) {
    let mut bytes = std::fs::read(path).unwrap();
    let i = bytes.len() / 2;
    bytes[i] ^= 0x5A;
    std::fs::write(path, bytes).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_records_and_files_lose_partitions_never_bytes_and_the_server_starts() {
    bounded("damaged_records_and_files_lose_partitions_never_bytes", 90, async {
        let (r, mut server) = Restartable::new(&["chunk_bytes=65536"]);
        let client = client("damage-app", None);
        let a = assignment(1, &[r.addr], PARTITIONS);
        write_shuffle(&client, &a, true).await;
        let good = read_all(&client, &a).await;
        let indexes = r.index_files();

        // 1. One byte of every copy of the record flipped: what is hit is lost, the rest is
        //    served as it was.
        server.kill();
        for f in &indexes {
            damage(f);
        }
        let server = r.start();
        assert!(metric(&server, "sluice_server_recovered_lost_total").await >= 1.0);
        let got = read_all(&client, &a).await;
        assert!(got.contains(&Err(ErrorCode::DataLost)), "damage unseen: {got:?}");
        for (p, (g, want)) in got.iter().zip(&good).enumerate() {
            if let Ok(v) = g {
                assert_eq!(Ok(v), want.as_ref(), "partition {p}: wrong bytes after damage");
            }
        }
        drop(server);

        // 2. The records cut to 10 bytes: the whole shuffle is lost.
        for f in &indexes {
            std::fs::OpenOptions::new().write(true).open(f).unwrap().set_len(10).unwrap();
        }
        let server = r.start();
        let got = read_all(&client, &a).await;
        assert!(got.iter().all(|p| *p == Err(ErrorCode::DataLost)), "{got:?}");
        assert!(server.log_text().contains("commit record unreadable"), "no log line");
        drop(server);

        // 3. A sound record, but a data file cut short: that partition is lost.
        let mut server = r.start();
        client.unregister_shuffle(&a).await.unwrap();
        let a = assignment(3, &[r.addr], PARTITIONS);
        write_shuffle(&client, &a, true).await;
        let good = read_all(&client, &a).await;
        server.kill();
        let victim =
            r.data_files().into_iter().find(|f| f.to_string_lossy().contains("/3/2-")).unwrap();
        let len = std::fs::metadata(&victim).unwrap().len();
        std::fs::OpenOptions::new().write(true).open(&victim).unwrap().set_len(len / 2).unwrap();
        let server = r.start();
        let got = read_all(&client, &a).await;
        assert_eq!(got[2], Err(ErrorCode::DataLost));
        for p in [0, 1, 3, 4, 5] {
            assert_eq!(got[p], good[p], "partition {p}");
        }
        assert!(server.log_text().contains("truncated"), "no log line names the cut file");
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_shuffle_of_an_application_with_a_shortened_directory_name_is_lost_under_its_id() {
    bounded("a_lost_shuffle_of_an_application_with_a_shortened_directory_name", 90, async {
        // An id whose directory name is cut and ends in a digest: the name alone cannot say it.
        let id = format!("{}.etl", "x".repeat(300));
        let (r, mut server) = Restartable::new(&["chunk_bytes=65536"]);
        let c = client(&id, None);
        let a = assignment(1, &[r.addr], PARTITIONS);
        write_shuffle(&c, &a, true).await;
        assert!(read_all(&c, &a).await.iter().all(|p| p.as_ref().is_ok_and(|v| !v.is_empty())));
        let app_dirs = || -> Vec<std::path::PathBuf> {
            let named = |e: &std::fs::DirEntry| e.file_name().to_string_lossy().starts_with("xxx");
            r.dirs
                .iter()
                .flat_map(|d| std::fs::read_dir(d).unwrap().filter_map(Result::ok))
                .filter(named)
                .map(|e| e.path())
                .collect()
        };
        let dirs = app_dirs();
        assert!(!dirs.is_empty(), "no application directory");
        for d in &dirs {
            let name = d.file_name().unwrap().to_string_lossy().into_owned();
            assert!(name.len() < 255 && name.contains("~~"), "not a shortened name: {name}");
            assert_eq!(std::fs::read_to_string(d.join("app-id")).unwrap(), id, "no note");
        }

        // A server before the note wrote none: a restart notes its committed shuffles.
        server.kill();
        for d in &dirs {
            std::fs::remove_file(d.join("app-id")).unwrap();
        }
        let mut server = r.start();
        assert!(read_all(&c, &a).await.iter().all(|p| p.as_ref().is_ok_and(|v| !v.is_empty())));
        assert!(dirs.iter().all(|d| d.join("app-id").is_file()), "not noted at restart");

        // Every copy of the commit record unreadable: the whole shuffle is lost, and its readers
        // (who name the application by its id) are told so, not that it is unknown.
        server.kill();
        for f in r.index_files() {
            std::fs::OpenOptions::new().write(true).open(f).unwrap().set_len(10).unwrap();
        }
        let server = r.start();
        assert!(metric(&server, "sluice_server_recovered_lost_total").await >= 1.0);
        let got = read_all(&c, &a).await;
        assert!(got.iter().all(|p| *p == Err(ErrorCode::DataLost)), "{got:?}");

        // Unregistering the application deletes the lost shuffle's files and its directories.
        c.unregister_app(&[r.addr]).await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !app_dirs().is_empty() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(app_dirs(), Vec::<std::path::PathBuf>::new(), "left behind");
        assert!(r.data_files().is_empty(), "data files left behind");
    })
    .await
}

/// The server's capabilities to read what permissions forbid, dropped (the tests run as root,
/// which reads a directory of mode 000 anyway): run under this, it cannot list such a directory.
const WITHOUT_DAC_CAPS: &[&str] = &[
    "setpriv",
    "--bounding-set=-dac_override,-dac_read_search",
    "--inh-caps=-dac_override,-dac_read_search",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shuffle_under_an_application_directory_that_cannot_be_listed_is_lost_not_unknown() {
    bounded("an_application_directory_that_cannot_be_listed", 90, async {
        use std::os::unix::fs::PermissionsExt;
        let (r, mut server) = Restartable::new(&["chunk_bytes=65536"]);
        let c = client("unlisted-app", None);
        let a = assignment(1, &[r.addr], PARTITIONS);
        write_shuffle(&c, &a, true).await;
        let before = read_all(&c, &a).await;
        assert!(before.iter().all(|p| p.as_ref().is_ok_and(|v| !v.is_empty())), "{before:?}");
        let app_dirs: Vec<_> =
            r.dirs.iter().map(|d| d.join("unlisted-app")).filter(|d| d.is_dir()).collect();
        assert!(!app_dirs.is_empty(), "no application directory");

        // Every directory of the application unreadable, and a server that cannot read it
        // anyway: the shuffle is not recovered, and its readers are told it is lost.
        server.kill();
        let mode = |d: &Path, m: u32| std::fs::set_permissions(d, PermissionsExt::from_mode(m));
        for d in &app_dirs {
            mode(d, 0o000).unwrap();
        }
        // SAFETY: geteuid(2) has no preconditions. Not root: the mode alone stops the server.
        let root = unsafe { libc::geteuid() } == 0;
        let mut server = r.start_under(if root { WITHOUT_DAC_CAPS } else { &[] });
        let log = server.log_text();
        assert!(log.contains("cannot list an application directory at restart"), "{log}");
        assert!(metric(&server, "sluice_server_recovered_lost_total").await >= 1.0);
        let got = read_all(&c, &a).await;
        assert!(got.iter().all(|p| *p == Err(ErrorCode::DataLost)), "{got:?}");

        // Nothing of it was deleted: readable again, a restart serves it whole.
        server.kill();
        for d in &app_dirs {
            mode(d, 0o755).unwrap();
        }
        let _server = r.start();
        assert_eq!(read_all(&c, &a).await, before, "not served whole once readable again");
    })
    .await
}

fn sigterm(p: &Proc) {
    // SAFETY: kill(2) on a child's pid.
    assert_eq!(unsafe { libc::kill(p.pid() as i32, libc::SIGTERM) }, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_waits_for_open_shuffles_to_be_committed_then_a_restart_serves_them() {
    bounded("sigterm_waits_for_open_shuffles_to_be_committed", 90, async {
        let (r, mut server) = Restartable::new(&["chunk_bytes=65536"]);
        let client = client("term-app", None);
        let a = assignment(1, &[r.addr], PARTITIONS);
        register_direct(&client, &a, MAPS).await.unwrap();
        let mut w = client.writer(a.clone(), 0, 0).await.unwrap();
        for seq in 0..20 {
            w.add_batch(seq % PARTITIONS, &framed(&[record(0, 0, seq, 200_000)])).await.unwrap();
        }
        // Some of it on the server (the writer sends full pushes only) before the signal.
        let mut pushed = 0.0;
        for _ in 0..100 {
            pushed = metric(&server, "sluice_server_pushed_bytes_total").await;
            if pushed > 0.0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(pushed > 0.0, "nothing reached the server");
        sigterm(&server);
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert!(server.is_running(), "stopped with an open shuffle: its pushes would be lost");
        // Pushes to the open shuffle are still taken while it drains.
        for seq in 20..40 {
            w.add_batch(seq % PARTITIONS, &framed(&[record(0, 0, seq, 200_000)])).await.unwrap();
        }
        w.finish().await.unwrap();
        for m in 1..MAPS {
            client.writer(a.clone(), m, 0).await.unwrap().finish().await.unwrap();
        }
        client.commit_shuffle(&a).await.unwrap();
        let started = Instant::now();
        assert!(eventually(10, || !server.is_running()).await, "still running after the commit");
        eprintln!("stopped {:?} after the commit", started.elapsed());
        let _server = r.start();
        let got = read_all(&client, &a).await;
        let n: usize = got.iter().map(|p| p.as_ref().map(|v| v.len()).unwrap()).sum();
        assert_eq!(n, 40);
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_shuffle_without_data_does_not_hold_a_stop_and_is_open_after_the_restart() {
    bounded("an_open_shuffle_without_data_does_not_hold_a_stop", 60, async {
        let (r, mut server) =
            Restartable::new(&["chunk_bytes=65536", "split_threshold_bytes=4096"]);
        let client = client("later-stage-app", None);
        // A job's later stage: registered, nothing pushed yet.
        let later = assignment(2, &[r.addr], PARTITIONS);
        register_direct(&client, &later, MAPS).await.unwrap();
        sigterm(&server);
        assert!(eventually(10, || !server.is_running()).await, "an empty shuffle held the stop");
        assert!(server.log_text().contains("parked"), "no log line: {}", server.log_text());
        let server = r.start();
        // The restarted server takes the stage's pushes and serves its data.
        write_shuffle(&client, &later, true).await;
        let got = read_all(&client, &later).await;
        let n: usize = got.iter().map(|p| p.as_ref().map(|v| v.len()).unwrap()).sum();
        assert_eq!(n, (MAPS * 40) as usize);
        // And splits its partitions past the threshold, as it did before the restart.
        let splits = metric(&server, "sluice_server_split_replies_total").await;
        assert!(splits >= 1.0, "no PushSplit after the restart ({splits})");
    })
    .await
}

/// A commit with a few hundred MB still in memory, so that it takes a while, SIGKILLed after
/// `delay`; after a restart the shuffle reads back whole, or its reads fail cleanly — and a
/// commit the client saw succeed always reads back whole.
async fn kill_during_commit(delay: Duration) -> &'static str {
    let (r, mut server) = Restartable::new(&[
        "memory_budget_bytes=536870912",
        "chunk_bytes=8388608",
        "flush_watermark=0.95",
        "busy_watermark=0.97",
        "resume_watermark=0.9",
    ]);
    let client = client("commit-kill-app", None);
    let a = assignment(1, &[r.addr], PARTITIONS);
    register_direct(&client, &a, MAPS).await.unwrap();
    for t in spawn_writers(&client, &a, MAPS, 64, 1 << 20, |m, s| (m + s) % PARTITIONS) {
        t.await.unwrap().unwrap();
    }
    let commit = {
        let (client, a) = (client.clone(), a.clone());
        tokio::spawn(async move { client.commit_shuffle(&a).await })
    };
    tokio::time::sleep(delay).await;
    server.kill();
    let answered = commit.await.unwrap();
    let _server = r.start();
    let got = read_all(&client, &a).await;
    let whole = got.iter().all(|p| p.is_ok());
    if whole {
        let n: usize = got.iter().map(|p| p.as_ref().unwrap().len()).sum();
        assert_eq!(n, (MAPS * 64) as usize, "a partial shuffle was served");
    } else {
        assert!(answered.is_err(), "the commit was answered OK but its data is gone: {got:?}");
        for p in &got {
            assert!(
                matches!(
                    p,
                    Err(ErrorCode::UnknownApp | ErrorCode::UnknownShuffle | ErrorCode::DataLost)
                ),
                "an unclean failure: {p:?}"
            );
        }
    }
    match (answered.is_ok(), whole) {
        (true, _) => "committed, served whole",
        (false, true) => "answer lost, served whole",
        (false, false) => "not committed, clean error",
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_during_a_commit_leaves_the_whole_shuffle_or_a_clean_error() {
    bounded("sigkill_during_a_commit", 150, async {
        let mut seen = Vec::new();
        for ms in [0, 40, 150, 2000] {
            let outcome = kill_during_commit(Duration::from_millis(ms)).await;
            eprintln!("killed {ms} ms into the commit: {outcome}");
            seen.push(outcome);
        }
        assert!(
            seen.contains(&"committed, served whole"),
            "no kill came after the commit: {seen:?}"
        );
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_carries_on_across_a_restart_of_its_server() {
    bounded("a_reader_carries_on_across_a_restart", 60, async {
        let (r, mut server) = Restartable::new(&["chunk_bytes=65536"]);
        let client = client_with("reread-app", None, |o| o.fetch_prefetch_chunks = 1);
        let a = assignment(1, &[r.addr], PARTITIONS);
        write_shuffle(&client, &a, true).await;
        let whole = read_partition(&client, &a, 0, 0, MAPS).await.unwrap();
        assert!(whole.batches_read > 4, "too few batches to stop half way");

        let mut reader = client.reader(&a, 0, 0, MAPS).await.unwrap();
        let mut got = Vec::new();
        for _ in 0..2 {
            got.extend(parse_records(&reader.next_batch().await.unwrap().unwrap()));
        }
        sigterm(&server);
        assert!(eventually(10, || !server.is_running()).await, "SIGTERM did not stop it");
        let _server = r.start();
        while let Some(b) = reader.next_batch().await.expect("the reader carries on") {
            got.extend(parse_records(&b));
        }
        got.sort();
        let mut want = whole.records.clone();
        want.sort();
        assert_eq!(got, want, "records lost or repeated across the restart");
    })
    .await
}
