//! Two real coordinators, peers of each other: an assignment made by one is answered by the
//! other after the first is SIGKILLed; clients move on to the survivor, which assigns new
//! shuffles; the killed one, restarted, learns the survivor's assignments; unregistering
//! through one reaches the other.

mod utils;

use std::net::{SocketAddr, TcpListener};

use sluice_proto::message::{GetAssignment, GetSplits, SplitPartition, UnregisterShuffle};
use sluice_proto::{ErrorCode, Message};
use utils::*;

/// A port free now (bound and released).
fn free_port() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

const TOKEN: &str = "ha-admin-token-0123456789";

fn coordinator(scratch: &Scratch, name: &str, listen: SocketAddr, peer: SocketAddr) -> Proc {
    let args = [
        "coordinator".to_string(),
        "--listen".into(),
        listen.to_string(),
        "--metrics-listen".into(),
        "127.0.0.1:0".into(),
        "--set".into(),
        format!("admin_token={TOKEN}"),
        "--set".into(),
        format!("peers=[\"{peer}\"]"),
        "--set".into(),
        "server_timeout_ms=3000".into(),
    ];
    scratch.spawn(name, &args)
}

async fn assignment_at(
    coord: SocketAddr,
    app: &str,
    shuffle_id: u32,
) -> Result<Message, ErrorCode> {
    call(&raw(coord).await, GetAssignment { app_id: app.into(), shuffle_id }).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_coordinator_answers_and_a_killed_one_costs_the_job_nothing() {
    bounded("any_coordinator_answers", 90, async {
        let scratch = Scratch::new();
        let (pa, pb) = (free_port(), free_port());
        let mut a = coordinator(&scratch, "coord-a", pa, pb);
        let b = coordinator(&scratch, "coord-b", pb, pa);
        let both = format!("coordinators=[\"{pa}\", \"{pb}\"]");
        let spec = ServerSpec { sets: vec![both], ..Default::default() };
        let servers = [scratch.server(&spec), scratch.server(&spec)];
        wait_registered(pa, 2, 15).await;
        wait_registered(pb, 2, 15).await;

        let client = client_with("ha-app", None, |o| {
            o.coordinators = vec![pa.to_string(), pb.to_string()];
        });
        client.register_app().await.unwrap();
        // Made by A (the first in the list): B knows it before the client has the answer.
        let s1 = client.register_shuffle(1, 2, 6, 1).await.unwrap();
        let got = assignment_at(pb, "ha-app", 1).await;
        let Ok(Message::Assignment(at_b)) = got else {
            panic!("B does not know A's assignment: {got:?}\nA: {}\nB: {}", a.log_text(), b.log_text())
        };
        assert_eq!(at_b, *s1);

        // A split made by A: B knows its part before the writer has the answer.
        let ask = SplitPartition {
            app_id: "ha-app".into(),
            shuffle_id: 1,
            partition_id: 0,
            known_parts: 1,
        };
        let Ok(Message::Splits(made)) = call(&raw(pa).await, ask).await else {
            panic!("A did not split partition 0")
        };
        assert_eq!(made.partitions[0].parts.len(), 2, "{made:?}");
        let splits_at = |c: SocketAddr| async move {
            match call(&raw(c).await, GetSplits { app_id: "ha-app".into(), shuffle_id: 1 }).await {
                Ok(Message::Splits(s)) => s.partitions,
                other => panic!("GetSplits: {other:?}"),
            }
        };
        assert_eq!(splits_at(pb).await, made.partitions, "B does not know A's split");

        // B stalled (SIGSTOP) while A splits partition 1: the hand-over fails, and A sends it
        // again once B answers; B never keeps a list without the new part.
        let signal = |sig: &str, pid: u32| {
            let ok = std::process::Command::new("kill").args([sig, &pid.to_string()]).status();
            assert!(ok.unwrap().success(), "kill {sig}");
        };
        signal("-STOP", b.pid());
        let ask = SplitPartition {
            app_id: "ha-app".into(),
            shuffle_id: 1,
            partition_id: 1,
            known_parts: 1,
        };
        let split = call(&raw(pa).await, ask).await;
        signal("-CONT", b.pid());
        let Ok(Message::Splits(made1)) = split else { panic!("A did not split partition 1") };
        let mut learned = false;
        for _ in 0..50 {
            let at_b = splits_at(pb).await;
            if at_b.iter().any(|p| p.partition_id == 1 && p.parts == made1.partitions[0].parts) {
                learned = true;
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
        assert!(learned, "B never learned the split it missed while stalled:\n{}", a.log_text());

        // Map 0 before A dies, map 1 after; the shuffle commits and reads back whole.
        for (m, t) in spawn_writers(&client, &s1, 1, 300, 400, |_, s| s % 6).into_iter().enumerate() {
            t.await.unwrap().unwrap_or_else(|e| panic!("map {m}: {e}"));
        }
        a.kill();
        let Ok(Message::Assignment(still)) = assignment_at(pb, "ha-app", 1).await else {
            panic!("B forgot the assignment when A died")
        };
        assert_eq!(still, *s1);
        let mut w = client.writer(s1.clone(), 1, 0).await.unwrap();
        for seq in 0..300 {
            w.add_batch(seq % 6, &framed(&[record(1, 0, seq, 400)])).await.unwrap();
        }
        w.finish().await.unwrap();
        client.commit_shuffle(&s1).await.unwrap();
        let mut n = 0;
        for p in 0..6 {
            n += read_partition(&client, &s1, p, 0, 2).await.unwrap().unique_ids(p).len();
        }
        assert_eq!(n, 600);

        // A new shuffle: the client moves on to B, which assigns it (over the servers it scores
        // best: both, or the less loaded one).
        let s2 = client.register_shuffle(2, 1, 4, 1).await.expect("B takes the registration");
        let live: Vec<u16> = servers.iter().map(|s| s.addr.port()).collect();
        assert!(!s2.servers.is_empty() && s2.servers.iter().all(|s| live.contains(&s.port)));

        // A comes back and learns from B what was assigned while it was down.
        let _a = coordinator(&scratch, "coord-a2", pa, pb);
        let mut learned = false;
        for _ in 0..50 {
            if matches!(assignment_at(pa, "ha-app", 2).await, Ok(Message::Assignment(ref x)) if *x == *s2)
            {
                learned = true;
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
        assert!(learned, "the restarted coordinator did not learn shuffle 2 from its peer");
        let at_b = splits_at(pb).await;
        assert_eq!(at_b.len(), 2, "partitions 0 and 1 split: {at_b:?}");
        assert_eq!(splits_at(pa).await, at_b, "nor shuffle 1's splits");

        // Unregistering through B reaches A.
        let conn = raw(pb).await;
        call(&conn, UnregisterShuffle { app_id: "ha-app".into(), shuffle_id: 2 }).await.unwrap();
        assert_eq!(assignment_at(pa, "ha-app", 2).await, Err(ErrorCode::UnknownShuffle));

        // So does forgetting the application through B's admin API: A no longer answers with
        // its assignments either.
        assert!(matches!(assignment_at(pa, "ha-app", 1).await, Ok(Message::Assignment(_))));
        let admin = sluice_admin::AdminClient::new(
            &b.metrics.expect("B's admin address").to_string(),
            Some(TOKEN.into()),
            std::time::Duration::from_secs(10),
        );
        let answer = admin
            .call("POST".parse().unwrap(), "/api/v1/apps/ha-app/unregister", bytes::Bytes::new())
            .await
            .expect("an answer");
        assert_eq!(answer.status.as_u16(), 200, "{}", String::from_utf8_lossy(&answer.body));
        for c in [pb, pa] {
            let left = assignment_at(c, "ha-app", 1).await;
            assert!(left.is_err(), "{c} still answers for the unregistered app: {left:?}");
        }
        drop(b);
    })
    .await
}
