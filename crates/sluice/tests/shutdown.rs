//! `sluice server` and `sluice coordinator` stop on SIGTERM, promptly, even with idle client
//! connections open.

mod utils;

use std::time::{Duration, Instant};

use sluice_proto::message::{Ping, RegisterApp};
use sluice_proto::Message;
use utils::*;

fn sigterm(p: &Proc) {
    // SAFETY: plain kill(2) on a child we own and have not reaped.
    let rc = unsafe { libc::kill(p.pid() as i32, libc::SIGTERM) };
    assert_eq!(rc, 0, "kill(SIGTERM)");
}

async fn exits_within(p: &mut Proc, limit: Duration) -> Duration {
    let start = Instant::now();
    while p.is_running() {
        assert!(
            start.elapsed() < limit,
            "still running {limit:?} after SIGTERM; log:\n{}",
            p.log_text()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    start.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_server_and_coordinator_with_idle_connections_open() {
    bounded("sigterm_stops_server_and_coordinator_with_idle_connections_open", 30, async {
        let scratch = Scratch::new();
        let mut coord = scratch.coordinator();
        let mut server = scratch.server(&ServerSpec::with_coordinator(coord.addr));
        wait_registered(coord.addr, 1, 15).await;
        // Idle connections, as pooled clients keep them.
        let to_server = raw(server.addr).await;
        let to_coord = raw(coord.addr).await;
        call(&to_server, RegisterApp { app_id: "bye".into(), ..Default::default() }).await.unwrap();
        assert!(matches!(call(&to_coord, Ping {}).await, Ok(Message::Pong(_))));

        sigterm(&server);
        let took = exits_within(&mut server, Duration::from_secs(10)).await;
        eprintln!("server exited {took:?} after SIGTERM");
        assert!(eventually(5, || to_server.is_closed()).await, "client not told of the close");

        sigterm(&coord);
        let took = exits_within(&mut coord, Duration::from_secs(10)).await;
        eprintln!("coordinator exited {took:?} after SIGTERM");
    })
    .await
}
