//! Quotas with real processes (docs/operations.md#quotas): a coordinator and a server whose
//! `[quotas]` limit what one application, and one user's applications together, may hold. An
//! application over its disk or memory quota is refused with `QUOTA_EXCEEDED`, the message naming
//! the quota and its limit, while another application's pushes and reads go on, byte for byte;
//! a user quota is shared by the user's applications and freed when one of them deletes a shuffle.
//! Servers tell the coordinator who is at quota (`QuotaReport`): it refuses the next shuffle of
//! an application (or of a user's applications) at quota with `QUOTA_EXCEEDED`, naming the quota
//! and the server, until the application frees space.

mod utils;

use std::sync::Arc;

use sluice_client::{ClientError, ShuffleClient};
use sluice_proto::message::Assignment;
use sluice_proto::ErrorCode;
use sluice_testkit::ServerSpec;
use utils::*;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;

/// A coordinator and one server with `sets`, registered.
async fn cluster(scratch: &Scratch, sets: &[String]) -> (Proc, Proc) {
    let coordinator = scratch.coordinator();
    let server = scratch.server(&ServerSpec {
        memory_budget_bytes: 64 * MIB,
        coordinator: Some(coordinator.addr),
        metrics: true,
        sets: sets.to_vec(),
        ..ServerSpec::default()
    });
    wait_registered(coordinator.addr, 1, 20).await;
    (coordinator, server)
}

/// A client of `app` run by `user`, whose merged push frames stay small (256 KiB), registered.
async fn app(coordinator: &Proc, app: &str, user: &str) -> ShuffleClient {
    let c = client_with(app, Some(coordinator.addr), |o| {
        o.user = user.into();
        o.push_frame_bytes = 256 << 10;
    });
    c.register_app().await.expect("register app");
    c
}

/// Map 0 of `a` pushes `batches` batches of one `record_len`-byte record to partition 0, then
/// ends; the writer's result.
async fn write(
    c: &ShuffleClient,
    a: &Arc<Assignment>,
    batches: u32,
    record_len: usize,
) -> Result<Vec<u64>, ClientError> {
    let mut w = c.writer(a.clone(), 0, 0).await?;
    for seq in 0..batches {
        w.add_batch(0, &framed(&[record(0, 0, seq, record_len)])).await?;
    }
    w.finish().await
}

/// Commits `a` and checks that partition 0 holds exactly map 0's `batches` records of
/// `record_len` bytes, each with its checksum.
async fn commit_and_check(c: &ShuffleClient, a: &Assignment, batches: u32, record_len: usize) {
    c.commit_shuffle(a).await.expect("commit");
    let got = read_partition(c, a, 0, 0, 1).await.expect("read");
    let mut want: Vec<_> = (0..batches)
        .flat_map(|seq| parse_records(&framed(&[record(0, 0, seq, record_len)])))
        .collect();
    want.sort_unstable();
    let mut records = got.records.clone();
    records.sort_unstable();
    assert_eq!(records, want, "partition 0 read back byte for byte");
}

fn quota_error(r: Result<Vec<u64>, ClientError>) -> String {
    match r {
        Err(e) => {
            assert_eq!(e.code(), ErrorCode::QuotaExceeded, "{e}");
            assert!(!e.is_retriable(), "QUOTA_EXCEEDED is not retriable: {e}");
            e.to_string()
        }
        Ok(v) => panic!("expected QUOTA_EXCEEDED, the writer finished: {v:?}"),
    }
}

/// Shuffle `id` of each application at the same time, `(batches, bytes each)`: the hog's must
/// be refused with `QUOTA_EXCEEDED` (its message returned), the good one's read back whole.
async fn race(
    hog: &ShuffleClient,
    (hog_batches, hog_len): (u32, u64),
    good: &ShuffleClient,
    (good_batches, good_len): (u32, u64),
    id: u32,
) -> String {
    let hog_a = hog.register_shuffle(id, 1, 1, 1).await.unwrap();
    let good_a = good.register_shuffle(id, 1, 1, 1).await.unwrap();
    let (hog_r, good_r) = bounded("both writers", 60, async {
        tokio::join!(
            write(hog, &hog_a, hog_batches, hog_len as usize),
            write(good, &good_a, good_batches, good_len as usize)
        )
    })
    .await;
    good_r.expect("the other application's pushes go on");
    commit_and_check(good, &good_a, good_batches, good_len as usize).await;
    quota_error(hog_r)
}

async fn refusals(server: &Proc, quota: &str) -> f64 {
    let m = server.metrics().await;
    *m.get(&format!("sluice_server_quota_refusals_total{{quota=\"{quota}\"}}"))
        .unwrap_or_else(|| panic!("no refusal count for {quota}: {m:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_app_over_its_disk_or_memory_quota_is_refused_and_the_other_goes_on() {
    let scratch = Scratch::new();
    let sets = [
        format!("quotas.app.disk_bytes={}", MIB),
        format!("quotas.app.buffered_bytes={}", 2 * MIB),
    ];
    let (coordinator, server) = cluster(&scratch, &sets).await;
    let hog = app(&coordinator, "hog", "").await;
    let good = app(&coordinator, "good", "").await;
    // At the same time: the hog pushes 3 MiB in 16 KiB batches (past its 1 MiB disk quota),
    // the good application 768 KiB (under it).
    let msg = race(&hog, (192, 16 * KIB), &good, (48, 16 * KIB), 1).await;
    assert!(msg.contains("application hog"), "{msg}");
    assert!(msg.contains("app.disk_bytes: limit 1048576 bytes"), "{msg}");
    assert!(refusals(&server, "app.disk_bytes").await >= 1.0);

    // Memory: one 3 MiB batch is more than a 2 MiB buffered quota lets an application hold,
    // refused before the body is read; a second shuffle of the good one goes on beside it. (A
    // second application: the hog is at its disk quota, so the coordinator gives it no new
    // shuffle, see the test below.)
    let hog = app(&coordinator, "hog-memory", "").await;
    let msg = race(&hog, (1, 3 * MIB), &good, (16, 8 * KIB), 2).await;
    assert!(msg.contains("app.buffered_bytes: limit 2097152 bytes"), "{msg}");
    assert!(refusals(&server, "app.buffered_bytes").await >= 1.0);
    assert_eq!(refusals(&server, "user.disk_bytes").await, 0.0, "no user quota is set");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_user_quota_is_shared_by_the_users_applications() {
    let scratch = Scratch::new();
    let sets = [format!("quotas.user.disk_bytes={}", MIB)];
    let (coordinator, server) = cluster(&scratch, &sets).await;
    let a1 = app(&coordinator, "alice-1", "alice").await;
    let a2 = app(&coordinator, "alice-2", "alice").await;
    let b1 = app(&coordinator, "bob-1", "bob").await;
    let s1 = a1.register_shuffle(1, 1, 1, 1).await.unwrap();
    let s2 = a2.register_shuffle(1, 1, 1, 1).await.unwrap();
    let sb = b1.register_shuffle(1, 1, 1, 1).await.unwrap();

    // 640 KiB each: alice's first application fits, her second passes the 1 MiB they share.
    bounded("alice-1", 30, write(&a1, &s1, 40, 16 * KIB as usize)).await.expect("alice-1 fits");
    let msg = quota_error(bounded("alice-2", 30, write(&a2, &s2, 40, 16 * KIB as usize)).await);
    assert!(msg.contains("user alice (application alice-2)"), "{msg}");
    assert!(msg.contains("user.disk_bytes: limit 1048576 bytes"), "{msg}");
    // Another user's application has a quota of its own.
    bounded("bob-1", 30, write(&b1, &sb, 40, 16 * KIB as usize)).await.expect("bob has room");
    commit_and_check(&b1, &sb, 40, 16 * KIB as usize).await;
    commit_and_check(&a1, &s1, 40, 16 * KIB as usize).await;
    assert!(refusals(&server, "user.disk_bytes").await >= 1.0);
    assert_eq!(refusals(&server, "app.disk_bytes").await, 0.0, "no application quota is set");

    // Both of alice's shuffles deleted: their bytes no longer count, and alice-2 has room again.
    a1.unregister_shuffle(&s1).await.expect("unregister");
    a2.unregister_shuffle(&s2).await.expect("unregister the refused one");
    // (The coordinator lets alice's applications register again once the server's next report
    // no longer lists her.)
    let s3 = registered_once_allowed(&a2, 2).await;
    bounded("alice-2 again", 30, write(&a2, &s3, 40, 16 * KIB as usize)).await.expect("room again");
    commit_and_check(&a2, &s3, 40, 16 * KIB as usize).await;
}

/// Registers shuffle `id` (one map, one partition), retrying (≤ 10 s) while the coordinator
/// refuses it at quota: it learns that space was freed from the server's next report.
async fn registered_once_allowed(c: &ShuffleClient, id: u32) -> Arc<Assignment> {
    bounded("registration allowed again", 10, async {
        loop {
            match c.register_shuffle(id, 1, 1, 1).await {
                Ok(a) => return a,
                Err(e) if e.code() == ErrorCode::QuotaExceeded => {
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await
                }
                Err(e) => panic!("registering shuffle {id}: {e}"),
            }
        }
    })
    .await
}

/// Registers shuffle `id` until the coordinator refuses it at quota (≤ 10 s: the server reports
/// after its next heartbeat); the refusal's message. Registrations let through meanwhile are
/// unregistered.
async fn refused_registration(c: &ShuffleClient, id: u32) -> String {
    bounded("the coordinator refuses the registration", 10, async {
        loop {
            match c.register_shuffle(id, 1, 1, 1).await {
                Ok(a) => {
                    c.unregister_shuffle(&a).await.expect("unregister");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
                Err(e) => {
                    assert_eq!(e.code(), ErrorCode::QuotaExceeded, "{e}");
                    assert!(!e.is_retriable(), "{e}");
                    return e.to_string();
                }
            }
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_coordinator_refuses_new_shuffles_of_an_app_at_quota_until_it_frees_space() {
    let scratch = Scratch::new();
    let (coordinator, server) =
        cluster(&scratch, &[format!("quotas.app.disk_bytes={}", MIB)]).await;
    let hog = app(&coordinator, "hog", "").await;
    let good = app(&coordinator, "good", "").await;
    // The hog passes its 1 MiB on the server: its pushes are refused.
    let first = hog.register_shuffle(1, 1, 1, 1).await.unwrap();
    quota_error(bounded("hog", 30, write(&hog, &first, 96, 16 * KIB as usize)).await);
    assert!(refusals(&server, "app.disk_bytes").await >= 1.0);
    // Its next shuffle is refused by the coordinator, the message naming the quota, the
    // application and the server; it stays refused while the hog holds its data.
    let msg = refused_registration(&hog, 2).await;
    assert!(msg.contains("application hog is at its quota app.disk_bytes on server"), "{msg}");
    assert!(msg.contains("limit 1048576 bytes"), "{msg}");
    tokio::time::sleep(std::time::Duration::from_millis(600)).await; // three more reports
    let again = hog.register_shuffle(3, 1, 1, 1).await.map(|_| ());
    assert_eq!(code(again), ErrorCode::QuotaExceeded, "still at quota");
    // Another application registers, writes and reads as usual.
    let other = good.register_shuffle(2, 1, 1, 1).await.expect("another app registers");
    bounded("good", 30, write(&good, &other, 16, 16 * KIB as usize)).await.expect("good writes");
    commit_and_check(&good, &other, 16, 16 * KIB as usize).await;
    // The hog deletes its shuffle: once the server's report says so, it registers again.
    hog.unregister_shuffle(&first).await.expect("unregister");
    let next = registered_once_allowed(&hog, 4).await;
    bounded("hog again", 30, write(&hog, &next, 16, 16 * KIB as usize)).await.expect("room again");
    commit_and_check(&hog, &next, 16, 16 * KIB as usize).await;
}

/// With authentication on, an application's user is the one its id carries (`<user>/<rest>`,
/// chosen by the launcher that issued its credential), never one it merely names: mallory's
/// application naming alice's user charges her nothing, and alice's two applications share
/// her quota.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn under_authentication_a_user_quota_counts_only_the_applications_the_user_id_binds() {
    const KEY: &str = "quota-test-cluster-key-0123456789";
    let key_set = format!("transport.secret=\"{KEY}\"");
    let scratch = Scratch::new();
    let coordinator = scratch.spawn(
        "coordinator",
        &["coordinator", "--listen", "127.0.0.1:0", "--set", &key_set].map(String::from),
    );
    let server = scratch.server(&ServerSpec {
        memory_budget_bytes: 64 * MIB,
        coordinator: Some(coordinator.addr),
        metrics: true,
        sets: vec![format!("quotas.user.disk_bytes={}", MIB), key_set.clone()],
        ..ServerSpec::default()
    });
    let cluster = sluice_transport::ClientConfig { secret: KEY.into(), ..test_transport() };
    let ready = std::time::Duration::from_secs(20);
    sluice_testkit::wait_registered(coordinator.addr, 1, ready, &cluster).await.unwrap();
    let app = |id: &str, user: &str| {
        let credential = sluice_transport::app_credential(KEY, id);
        client_with(id, Some(coordinator.addr), |o| {
            o.user = user.into();
            o.push_frame_bytes = 256 << 10;
            o.transport.secret = credential;
        })
    };
    let (mallory, alice1, alice2) =
        (app("mallory/m-1", "alice"), app("alice/a-1", "alice"), app("alice/a-2", ""));
    for c in [&mallory, &alice1, &alice2] {
        c.register_app().await.expect("register app");
    }
    let sm = mallory.register_shuffle(1, 1, 1, 1).await.unwrap();
    let s1 = alice1.register_shuffle(1, 1, 1, 1).await.unwrap();
    let s2 = alice2.register_shuffle(1, 1, 1, 1).await.unwrap();

    // 640 KiB each. Mallory's counts for no user: alice's first still fits her 1 MiB.
    bounded("mallory", 30, write(&mallory, &sm, 40, 16 * KIB as usize)).await.expect("mallory");
    bounded("alice/a-1", 30, write(&alice1, &s1, 40, 16 * KIB as usize))
        .await
        .expect("alice's first application was charged mallory's bytes");
    // Alice's second (naming no user: its id's) shares her quota and passes it.
    let msg =
        quota_error(bounded("alice/a-2", 30, write(&alice2, &s2, 40, 16 * KIB as usize)).await);
    assert!(msg.contains("user alice (application alice/a-2)"), "{msg}");
    assert!(server.log_text().contains("not the one its id carries"), "no warning for mallory");
    commit_and_check(&alice1, &s1, 40, 16 * KIB as usize).await;
}
