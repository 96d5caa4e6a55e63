//! Data lifetime on a real server: applications expire without heartbeats (their files go),
//! heartbeated ones stay; `UnregisterShuffle` deletes one shuffle's files, `UnregisterApp` all.

mod utils;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::BytesMut;
use sluice_proto::batch::put_batch;
use sluice_proto::message::*;
use sluice_proto::{ErrorCode, Message};
use sluice_transport::Connection;
use utils::*;

fn data_files(dir: &Path) -> Vec<PathBuf> {
    files_under(dir).into_iter().filter(|p| p.extension().is_some_and(|e| e == "data")).collect()
}

/// Registers `app`'s shuffle `shuffle` (1 map, 2 partitions), pushes one batch per partition,
/// ends the map and commits — all on `c`.
async fn one_committed_shuffle(c: &Connection, app: &str, shuffle: u32) {
    call(c, RegisterApp { app_id: app.into(), ..Default::default() }).await.unwrap();
    let reg = RegisterShuffle {
        app_id: app.into(),
        shuffle_id: shuffle,
        num_maps: 1,
        num_partitions: 2,
        replication: 1,
    };
    call(c, reg).await.unwrap();
    for p in 0..2 {
        let mut body = BytesMut::new();
        put_batch(&mut body, 0, 0, 0, &framed(&[record(0, 0, p, 4000)]));
        let push = Push { app_id: app.into(), shuffle_id: shuffle, partition_id: p };
        call_body(c, push, body.freeze()).await.expect("push");
    }
    let end = MapperEnd {
        app_id: app.into(),
        shuffle_id: shuffle,
        map_id: 0,
        attempt_id: 0,
        batch_counts: vec![
            BatchCount { partition_id: 0, batches: 1 },
            BatchCount { partition_id: 1, batches: 1 },
        ],
    };
    call(c, end).await.unwrap();
    match call(c, CommitShuffle { app_id: app.into(), shuffle_id: shuffle }).await {
        Ok(Message::CommitResult(r)) => assert_eq!(r.partitions.len(), 2, "{r:?}"),
        other => panic!("commit: {other:?}"),
    }
}

fn open(app: &str, shuffle: u32) -> OpenStream {
    OpenStream {
        app_id: app.into(),
        shuffle_id: shuffle,
        partition_id: 0,
        map_start: 0,
        map_end: 1,
        attempts: vec![],
    }
}

async fn push_code(addr: SocketAddr, app: &str, shuffle: u32) -> Option<ErrorCode> {
    let c = raw(addr).await;
    let mut body = BytesMut::new();
    put_batch(&mut body, 0, 0, 9, &framed(&[record(0, 0, 9, 64)]));
    let push = Push { app_id: app.into(), shuffle_id: shuffle, partition_id: 0 };
    call_body(&c, push, body.freeze()).await.err()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apps_without_heartbeats_expire_and_lose_their_files() {
    bounded("apps_without_heartbeats_expire_and_lose_their_files", 30, async {
        let scratch = Scratch::new();
        let data = scratch.path().join("data");
        let server = scratch.server(&ServerSpec {
            data_dirs: vec![data.clone()],
            metrics: true,
            sets: vec!["app_expiry_ms=800".into()],
            ..Default::default()
        });
        let c = raw(server.addr).await;
        one_committed_shuffle(&c, "silent", 1).await;
        one_committed_shuffle(&c, "alive", 1).await;
        let silent_dir = data.join("silent");
        let alive_dir = data.join("alive");
        assert_eq!(data_files(&silent_dir).len(), 2, "files of the silent app after commit");
        assert_eq!(data_files(&alive_dir).len(), 2, "files of the alive app after commit");

        // "alive" heartbeats every 200 ms; "silent" never again.
        let hb = {
            let addr = server.addr;
            tokio::spawn(async move {
                let c = raw(addr).await;
                loop {
                    call(&c, AppHeartbeat { app_id: "alive".into() }).await.unwrap();
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            })
        };
        let gone = eventually(5, || data_files(&silent_dir).is_empty()).await;
        assert!(gone, "the silent app's files are still there: {:?}", data_files(&silent_dir));
        assert_eq!(push_code(server.addr, "silent", 1).await, Some(ErrorCode::UnknownApp));
        assert_eq!(call(&c, open("silent", 1)).await.err(), Some(ErrorCode::UnknownApp));
        let m = server.metrics().await;
        assert_eq!(metric(&m, "sluice_server_apps_expired_total"), 1.0, "{m:?}");

        // Past several expiry periods, the heartbeated app is intact and readable.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(data_files(&alive_dir).len(), 2, "the alive app lost files");
        let client = client("alive", None);
        let a = assignment(1, &[server.addr], 2);
        for p in 0..2 {
            let r = read_partition(&client, &a, p, 0, 1).await.expect("alive app readable");
            assert_eq!(r.ids(), vec![RecordId { map: 0, attempt: 0, seq: p }]);
        }
        hb.abort();
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unregister_shuffle_then_app_deletes_files() {
    bounded("unregister_shuffle_then_app_deletes_files", 30, async {
        let scratch = Scratch::new();
        let data = scratch.path().join("data");
        let server =
            scratch.server(&ServerSpec { data_dirs: vec![data.clone()], ..Default::default() });
        let client = client("unreg", None);
        let (a1, a2) = (assignment(1, &[server.addr], 3), assignment(2, &[server.addr], 3));
        for a in [&a1, &a2] {
            register_direct(&client, a, 1).await.unwrap();
            let mut w = client.writer(a.clone(), 0, 0).await.unwrap();
            for seq in 0..300u32 {
                w.write_record(seq % 3, &record(0, 0, seq, 1000)).await.unwrap();
            }
            w.finish().await.unwrap();
            client.commit_shuffle(a).await.unwrap();
        }
        let (dir1, dir2) = (data.join("unreg").join("1"), data.join("unreg").join("2"));
        assert_eq!(data_files(&dir1).len(), 3);
        assert_eq!(data_files(&dir2).len(), 3);

        client.unregister_shuffle(&a1).await.expect("unregister shuffle 1");
        assert!(data_files(&dir1).is_empty(), "shuffle 1 files remain: {:?}", data_files(&dir1));
        assert!(!dir1.exists(), "shuffle 1 directory remains");
        assert_eq!(data_files(&dir2).len(), 3, "shuffle 2 files were touched");
        let c = raw(server.addr).await;
        assert_eq!(call(&c, open("unreg", 1)).await.err(), Some(ErrorCode::UnknownShuffle));
        let mut n = 0;
        for p in 0..3 {
            n += read_partition(&client, &a2, p, 0, 1)
                .await
                .expect("shuffle 2 readable")
                .records
                .len();
        }
        assert_eq!(n, 300);

        client.unregister_app(&[server.addr]).await.expect("unregister app");
        assert!(data_files(&data).is_empty(), "files remain: {:?}", data_files(&data));
        assert!(!data.join("unreg").exists(), "the application's directory remains");
        assert_eq!(call(&c, open("unreg", 2)).await.err(), Some(ErrorCode::UnknownApp));
        assert_eq!(push_code(server.addr, "unreg", 2).await, Some(ErrorCode::UnknownApp));
    })
    .await
}

/// A server of the assignment that is gone does not keep the others from deleting the
/// shuffle: every server is told, and the failure is still reported. (And a writer refuses a
/// partition the shuffle does not have.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unregister_tells_every_server_when_one_is_gone() {
    bounded("unregister_tells_every_server_when_one_is_gone", 60, async {
        let scratch = Scratch::new();
        let data = scratch.path().join("data");
        let server =
            scratch.server(&ServerSpec { data_dirs: vec![data.clone()], ..Default::default() });
        let client = client("gone", None);
        let a = assignment(1, &[server.addr], 2);
        register_direct(&client, &a, 1).await.unwrap();
        let mut w = client.writer(a.clone(), 0, 0).await.unwrap();
        for seq in 0..100u32 {
            w.write_record(seq % 2, &record(0, 0, seq, 1000)).await.unwrap();
        }
        w.finish().await.unwrap();
        client.commit_shuffle(&a).await.unwrap();
        let dir = data.join("gone").join("1");
        assert_eq!(data_files(&dir).len(), 2);
        // A partition the shuffle does not have is refused by the writer, never a panic.
        let mut w = client.writer(a.clone(), 0, 1).await.unwrap();
        assert_eq!(code(w.write_record(2, b"x").await), ErrorCode::InvalidRequest);
        assert_eq!(code(w.add_batch(u32::MAX, b"x").await), ErrorCode::InvalidRequest);
        assert_eq!(
            code(w.add_batch_bytes(7, bytes::Bytes::from_static(b"x")).await),
            ErrorCode::InvalidRequest
        );
        drop(w);
        // The same shuffle as an assignment whose first server is gone (nothing listens there).
        let gone = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let mut with_gone = (*a).clone();
        let dead = ServerAddr {
            host: gone.ip().to_string(),
            port: gone.port(),
            ..with_gone.servers[0].clone()
        };
        with_gone.servers.insert(0, dead);
        let told = client.unregister_shuffle(&with_gone).await;
        assert!(told.is_err(), "the gone server's failure is reported");
        assert!(!dir.exists(), "the live server kept the shuffle: {:?}", data_files(&dir));
    })
    .await
}

/// A shuffle registered again with the same id while its 1,000 files are being removed after
/// its unregistration: the registration is answered once they are gone, not refused, and the
/// new shuffle's files are its own, whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shuffle_registered_again_while_its_files_are_deleted_keeps_its_data() {
    bounded("a_shuffle_registered_again_while_its_files_are_deleted", 60, async {
        const WIDE: u32 = 1000;
        let scratch = Scratch::new();
        let data = scratch.path().join("data");
        let server =
            scratch.server(&ServerSpec { data_dirs: vec![data.clone()], ..Default::default() });
        let client = client("again", None);
        let a = assignment(1, &[server.addr], WIDE);
        let write = |generation: u32| {
            let (client, a) = (client.clone(), a.clone());
            async move {
                let mut w = client.writer(a.clone(), 0, 0).await.unwrap();
                for p in 0..WIDE {
                    w.write_record(p, &record(0, 0, generation * WIDE + p, 200)).await.unwrap();
                }
                w.finish().await.unwrap();
                client.commit_shuffle(&a).await.unwrap();
            }
        };
        register_direct(&client, &a, 1).await.unwrap();
        write(0).await;
        let dir = data.join("again").join("1");
        assert_eq!(data_files(&dir).len(), WIDE as usize);

        // The unregistration on one connection; on another, once the shuffle has left the
        // server's map (its files are removed after that), the registration.
        let (c1, c2) = (raw(server.addr).await, raw(server.addr).await);
        let unregistering = tokio::spawn(async move {
            call(&c1, UnregisterShuffle { app_id: "again".into(), shuffle_id: 1 }).await
        });
        while call(&c2, open("again", 1)).await.err() != Some(ErrorCode::UnknownShuffle) {
            tokio::task::yield_now().await;
        }
        let reg = RegisterShuffle {
            app_id: "again".into(),
            shuffle_id: 1,
            num_maps: 1,
            num_partitions: WIDE,
            replication: 1,
        };
        call(&c2, reg).await.expect("registered again while the old files were removed");
        unregistering.await.unwrap().expect("unregistered");
        write(1).await;
        assert_eq!(data_files(&dir).len(), WIDE as usize, "files lost or left");
        for p in (0..WIDE).step_by(97) {
            let got = read_partition(&client, &a, p, 0, 1).await.expect("readable").records;
            let ids: Vec<u32> = got.iter().map(|(id, _)| id.seq).collect();
            assert_eq!(ids, [WIDE + p], "partition {p}");
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unregister_during_pushes_leaves_no_files() {
    bounded("unregister_during_pushes_leaves_no_files", 30, async {
        let scratch = Scratch::new();
        let data = scratch.path().join("data");
        // Small chunks: partition files are being created and written while we unregister.
        let server = scratch.server(&ServerSpec {
            data_dirs: vec![data.clone()],
            sets: vec!["chunk_bytes=65536".into()],
            ..Default::default()
        });
        let client = client("busy-unreg", None);
        let a = assignment(3, &[server.addr], 16);
        register_direct(&client, &a, 4).await.unwrap();
        let tasks = spawn_writers(&client, &a, 4, 4000, 70_000, |_, seq| seq % 16);
        let dir = data.join("busy-unreg").join("3");
        let started = eventually(10, || data_files(&dir).len() >= 8).await;
        assert!(started, "pushes did not reach the disk");
        client.unregister_shuffle(&a).await.expect("unregister during pushes");
        for t in tasks {
            let r = t.await.unwrap();
            assert_eq!(code(r), ErrorCode::UnknownShuffle, "writers see the shuffle gone");
        }
        // Give late flushes time to (wrongly) recreate anything.
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(data_files(&dir).is_empty(), "files after unregister: {:?}", data_files(&dir));
    })
    .await
}
