//! A coordinator killed and restarted on the same port in the middle of a job: servers
//! re-register from their heartbeats, new shuffles are assigned over all of them, and the
//! shuffle registered before the restart still commits and reads back (servers hold its data).

mod utils;

use std::time::{Duration, Instant};

use sluice_proto::message::{GetAssignment, RegisterShuffle};
use sluice_proto::ErrorCode;
use sluice_proto::Message;
use utils::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordinator_restart_mid_job() {
    bounded("coordinator_restart_mid_job", 45, async {
        let scratch = Scratch::new();
        let mut coord = scratch.coordinator();
        let port_addr = coord.addr;
        let spec = ServerSpec::with_coordinator(coord.addr); // heartbeat_interval_ms=200
        let servers = [scratch.server(&spec), scratch.server(&spec)];
        wait_registered(coord.addr, 2, 15).await;

        let client = client("restart", Some(coord.addr));
        client.register_app().await.unwrap();
        let parts = 6;
        let a1 = client.register_shuffle(1, 2, parts, 1).await.unwrap();
        assert_eq!(a1.servers.len(), 2);

        // Map 0 pushes before the coordinator dies, map 1 while it is down.
        let write = |m: u32| {
            let (client, a1) = (client.clone(), a1.clone());
            async move {
                let mut w = client.writer(a1, m, 0).await.unwrap();
                for seq in 0..600u32 {
                    w.write_record(seq % parts, &record(m, 0, seq, 500)).await.unwrap();
                }
                w.finish().await.expect("map finishes (needs no coordinator)");
            }
        };
        write(0).await;
        coord.kill();
        write(1).await;
        tokio::time::sleep(Duration::from_millis(500)).await; // servers' heartbeats fail meanwhile

        let mut coord = scratch.coordinator_on(&port_addr.to_string());
        assert_eq!(coord.addr, port_addr, "restarted on the same port");
        let restarted = Instant::now();

        // The new coordinator knows nothing of shuffle 1 (no durable state)...
        let got = client
            .coordinator_request(GetAssignment { app_id: "restart".into(), shuffle_id: 1 }.into())
            .await;
        assert_eq!(code(got), ErrorCode::UnknownShuffle);
        // ...but learns both servers from their heartbeats and assigns shuffle 2 over them.
        let a2 = loop {
            match client.register_shuffle(2, 1, 8, 1).await {
                Ok(a) if a.servers.len() == 2 => break a,
                Ok(a) => {
                    // Assigned while only one server was back: start over.
                    let _ = client.unregister_shuffle(&a).await;
                }
                Err(e) => assert_eq!(e.code(), ErrorCode::NoServers, "{e}"),
            }
            assert!(
                restarted.elapsed() < Duration::from_secs(15),
                "servers did not re-register within 15 s of the restart"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        eprintln!("both servers back {:?} after the restart", restarted.elapsed());
        let mut ports: Vec<u16> = a2.servers.iter().map(|s| s.port).collect();
        ports.sort_unstable();
        let mut want: Vec<u16> = servers.iter().map(|s| s.addr.port()).collect();
        want.sort_unstable();
        assert_eq!(ports, want);

        // Shuffle 1 commits and reads back whole.
        client.commit_shuffle(&a1).await.expect("commit shuffle 1 after the restart");
        for p in 0..parts {
            let r = read_partition(&client, &a1, p, 0, 2).await.expect("read shuffle 1");
            let want: Vec<RecordId> = (0..2u32)
                .flat_map(|m| {
                    (0..600u32).filter(move |s| s % parts == p).map(move |seq| RecordId {
                        map: m,
                        attempt: 0,
                        seq,
                    })
                })
                .collect();
            assert_eq!(r.ids(), want, "partition {p} of shuffle 1");
        }

        // Shuffle 2 works end to end on the new assignment.
        let mut w = client.writer(a2.clone(), 0, 0).await.unwrap();
        for seq in 0..80u32 {
            w.write_record(seq % 8, &record(0, 0, seq, 100)).await.unwrap();
        }
        w.finish().await.unwrap();
        client.commit_shuffle(&a2).await.unwrap();
        let mut n = 0;
        for p in 0..8 {
            n += read_partition(&client, &a2, p, 0, 1).await.unwrap().records.len();
        }
        assert_eq!(n, 80);
        coord.kill();
    })
    .await
}

/// A server that stops heartbeating is left out of new assignments once `server_timeout_ms`
/// passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_server_gets_no_new_partitions() {
    bounded("a_dead_server_gets_no_new_partitions", 30, async {
        let scratch = Scratch::new();
        let args = ["coordinator", "--listen", "127.0.0.1:0", "--set", "server_timeout_ms=1000"]
            .map(String::from);
        let coord = scratch.spawn("coordinator", &args);
        let spec = ServerSpec::with_coordinator(coord.addr);
        let (live, mut dead) = (scratch.server(&spec), scratch.server(&spec));
        wait_registered(coord.addr, 2, 15).await;
        dead.kill();
        let killed = Instant::now();
        let client = client("dead-server", Some(coord.addr));
        client.register_app().await.unwrap();
        // Past the timeout, even a wide shuffle is assigned to the live server only (were the
        // dead one still considered, the load-aware spread would give it about half).
        tokio::time::sleep(Duration::from_millis(1500).saturating_sub(killed.elapsed())).await;
        let mut last = None;
        for id in 1..=3 {
            let reg = RegisterShuffle {
                app_id: "dead-server".into(),
                shuffle_id: id,
                num_maps: 1,
                num_partitions: 64,
                replication: 1,
            };
            // Ask the coordinator only: registering on the dead server would fail.
            match client.coordinator_request(reg.into()).await.unwrap() {
                Message::Assignment(a) => {
                    let ports: Vec<u16> = a.servers.iter().map(|s| s.port).collect();
                    assert_eq!(ports, vec![live.addr.port()], "shuffle {id} assigned to {ports:?}");
                    last = Some(std::sync::Arc::new(a));
                }
                other => panic!("RegisterShuffle: {other:?}"),
            }
        }
        let a = last.unwrap();
        assert_eq!(a.servers[0].port, live.addr.port());
        register_direct(&client, &a, 1).await.unwrap();
        // And the job runs on the live one.
        let mut w = client.writer(a.clone(), 0, 0).await.unwrap();
        for seq in 0..16u32 {
            w.write_record(seq % 64, &record(0, 0, seq, 100)).await.unwrap();
        }
        w.finish().await.unwrap();
        client.commit_shuffle(&a).await.unwrap();
        let mut n = 0;
        for p in 0..16 {
            n += read_partition(&client, &a, p, 0, 1).await.unwrap().records.len();
        }
        assert_eq!(n, 16);
    })
    .await
}
