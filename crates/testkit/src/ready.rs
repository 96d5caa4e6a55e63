//! Waiting until a coordinator knows its servers.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::bail;
use sluice_proto::message::{RegisterShuffle, UnregisterApp, UnregisterShuffle};
use sluice_proto::Message;
use sluice_transport::{Body, ClientConfig, Connection};

/// Waits, at most `limit`, until the coordinator at `coordinator` assigns a shuffle over
/// `servers` servers: they have all registered or heartbeated. A server that printed its address
/// is listening, but a job started before its first heartbeat would be spread over fewer
/// servers than it asked for.
///
/// Probes with a throwaway application and a shuffle id no job uses, and removes both.
pub async fn wait_registered(
    coordinator: SocketAddr,
    servers: usize,
    limit: Duration,
    transport: &ClientConfig,
) -> anyhow::Result<()> {
    let app_id = format!("probe-{}", std::process::id());
    let call = async |conn: &Connection, msg: Message| {
        conn.request(msg, Body::Empty).await.map(|r| r.message)
    };
    let start = Instant::now();
    loop {
        if let Ok(conn) = Connection::connect(coordinator, transport).await {
            let reg = RegisterShuffle {
                app_id: app_id.clone(),
                shuffle_id: u32::MAX,
                num_maps: 1,
                // Enough partitions that a load-aware spread touches every server.
                num_partitions: (servers * 8) as u32,
                replication: 1,
            };
            let got = call(&conn, reg.into()).await;
            let forget = UnregisterShuffle { app_id: app_id.clone(), shuffle_id: u32::MAX };
            let _ = call(&conn, forget.into()).await;
            if let Ok(Message::Assignment(a)) = got {
                if a.servers.len() == servers {
                    let _ = call(&conn, UnregisterApp { app_id: app_id.clone() }.into()).await;
                    return Ok(());
                }
            }
        }
        if start.elapsed() > limit {
            bail!("{servers} servers did not register with {coordinator} within {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
