//! Draining a server before a planned stop (SIGUSR1): the coordinator gives it no new
//! partitions, it keeps serving the shuffle it holds, and it stops by itself once that shuffle
//! is gone.

mod utils;

use std::time::Duration;

use rustix::process::{kill_process, Pid, Signal};
use utils::*;

const PARTITIONS: u32 = 8;
const MAPS: u32 = 2;
const RECORDS: u32 = 400;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draining_server_gets_no_new_partitions_serves_what_it_holds_and_then_stops() {
    bounded(
        "a_draining_server_gets_no_new_partitions_serves_what_it_holds_and_then_stops",
        60,
        async {
            let scratch = Scratch::new();
            let coord = scratch.coordinator();
            let spec = ServerSpec { metrics: true, ..ServerSpec::with_coordinator(coord.addr) };
            let (mut leaving, staying) = (scratch.server(&spec), scratch.server(&spec));
            wait_registered(coord.addr, 2, 15).await;
            let client = client("drain", Some(coord.addr));
            client.register_app().await.unwrap();

            // A shuffle over both servers, written and committed.
            let first = client.register_shuffle(1, MAPS, PARTITIONS, 1).await.unwrap();
            let ports: Vec<u16> = first.servers.iter().map(|s| s.port).collect();
            assert!(ports.contains(&leaving.addr.port()) && ports.contains(&staying.addr.port()));
            let writers = spawn_writers(&client, &first, MAPS, RECORDS, 1000, |m, seq| {
                (m + seq) % PARTITIONS
            });
            for w in writers {
                w.await.unwrap().expect("map pushes");
            }
            client.commit_shuffle(&first).await.expect("commit");

            // Drain one server; after its next heartbeats new shuffles go to the other only.
            let pid = Pid::from_raw(leaving.pid() as i32).expect("pid");
            kill_process(pid, Signal::USR1).expect("SIGUSR1");
            let drained_flag =
                eventually(10, || leaving.log_text().contains("draining: no new partitions")).await;
            assert!(drained_flag, "no drain log line:\n{}", leaving.log_text());
            assert_eq!(metric(&leaving.metrics().await, "sluice_server_draining"), 1.0);
            tokio::time::sleep(Duration::from_millis(1000)).await; // heartbeats every 200 ms
            let second = client.register_shuffle(2, MAPS, PARTITIONS, 1).await.unwrap();
            let ports: Vec<u16> = second.servers.iter().map(|s| s.port).collect();
            assert_eq!(
                ports,
                vec![staying.addr.port()],
                "a new shuffle was given the draining server"
            );

            // The draining server still serves the first shuffle, every record of it.
            let mut n = 0;
            for p in 0..PARTITIONS {
                let r = read_partition(&client, &first, p, 0, MAPS).await.expect("read");
                n += r.unique_ids(format!("partition {p}")).len();
            }
            assert_eq!(n, (MAPS * RECORDS) as usize);
            assert!(leaving.is_running(), "stopped while it still held a shuffle");

            // Once the application lets go of that shuffle, it stops by itself.
            client.unregister_shuffle(&first).await.expect("unregister");
            let stopped = eventually(15, || !leaving.is_running()).await;
            assert!(stopped, "still running with nothing left; log:\n{}", leaving.log_text());
            assert!(leaving.log_text().contains("drained: nothing left that a stop would lose"));
        },
    )
    .await
}

/// A server stopping on SIGTERM (waiting for a shuffle to be committed) refuses to have its
/// drain cancelled, by the admin API or by a coordinator: taking new partitions, it would be
/// assigned work it then waits for, or loses at the stop. The commit then lets it stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_servers_drain_cannot_be_cancelled() {
    bounded("a_stopping_servers_drain_cannot_be_cancelled", 60, async {
        let scratch = Scratch::new();
        let spec = ServerSpec { metrics: true, ..ServerSpec::default() };
        let mut server = scratch.server(&spec);
        let client = client("stopping", None);
        let a = assignment(1, &[server.addr], 2);
        register_direct(&client, &a, 1).await.unwrap();
        let mut w = client.writer(a.clone(), 0, 0).await.unwrap();
        for seq in 0..50u32 {
            w.write_record(seq % 2, &record(0, 0, seq, 1000)).await.unwrap();
        }
        w.finish().await.unwrap();
        // Uncommitted data: SIGTERM drains and waits for the commit.
        let pid = Pid::from_raw(server.pid() as i32).expect("pid");
        kill_process(pid, Signal::TERM).expect("SIGTERM");
        let draining = eventually(10, || server.log_text().contains("SIGTERM: draining")).await;
        assert!(draining, "no drain on SIGTERM:\n{}", server.log_text());
        let admin = sluice_admin::AdminClient::new(
            &server.metrics.expect("admin address").to_string(),
            None,
            Duration::from_secs(10),
        );
        let answer = admin
            .call("DELETE".parse().unwrap(), "/api/v1/drain", bytes::Bytes::new())
            .await
            .expect("an answer");
        assert_eq!(answer.status.as_u16(), 409, "{}", String::from_utf8_lossy(&answer.body));
        assert_eq!(metric(&server.metrics().await, "sluice_server_draining"), 1.0);
        assert!(server.is_running());
        // Committed, nothing is left that the stop would lose: it stops.
        client.commit_shuffle(&a).await.expect("commit");
        let stopped = eventually(15, || !server.is_running()).await;
        assert!(stopped, "still running after the commit; log:\n{}", server.log_text());
    })
    .await
}
