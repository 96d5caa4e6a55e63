//! What an operator sees and does through a coordinator (the admin API): servers with their
//! state, applications, shuffles with their assignment; drain, undrain, unregister. Plain
//! values; `sluice-admin` serves them as JSON.
//!
//! **Drains.** An operator's drain or undrain is a [`DrainMark`] on the server, which takes
//! effect here at once (a server marked to drain gets no new partitions from this coordinator)
//! and reaches the server in the answer to its next `ServerStatus` (a `DrainOrder`). Once the
//! server reports the state asked for, the mark is cleared and its own report is the truth: so
//! a server drained through one coordinator reports no room to every coordinator, and another
//! coordinator can undrain it. A server that sends no `ServerStatus` (an older one) keeps the
//! mark, which this coordinator alone honours.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_proto::message::{
    DiskReport, DrainOrder, Message, ServerAddr, ServerStatus, ShuffleSync, DRAIN_ORDER_NONE,
    DRAIN_ORDER_START, DRAIN_ORDER_STOP, NO_REPLICA,
};

use crate::{Coordinator, Refused, Registered, ServerInfo};

/// Where a server stands, as this coordinator sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerState {
    /// Heard from within `server_timeout_ms`, taking new partitions.
    Live,
    /// Heard from, taking no new partitions (drained by an operator, or by `SIGUSR1`).
    Draining,
    /// Not heard from within `server_timeout_ms`: gets nothing.
    Lost,
}

impl ServerState {
    /// `live`, `draining` or `lost`.
    pub fn name(self) -> &'static str {
        match self {
            ServerState::Live => "live",
            ServerState::Draining => "draining",
            ServerState::Lost => "lost",
        }
    }
}

/// An operator's request to a server, not yet carried out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrainMark {
    /// Stop taking new partitions.
    Drain,
    /// Take new partitions again.
    Undrain,
}

impl ServerInfo {
    /// Where the server stands, `timeout` being `server_timeout_ms`.
    pub fn state(&self, timeout: Duration) -> ServerState {
        let reported = self.status.as_ref().is_some_and(|s| s.draining == 1);
        if self.last_seen.elapsed() >= timeout {
            ServerState::Lost
        } else if self.drain_mark == Some(DrainMark::Drain)
            || (reported && self.drain_mark != Some(DrainMark::Undrain))
        {
            ServerState::Draining
        } else {
            ServerState::Live
        }
    }
}

/// One server as the coordinator sees it.
#[derive(Debug, Clone)]
pub struct ServerSummary {
    /// Its name and where clients reach it.
    pub addr: ServerAddr,
    /// Live, draining or lost.
    pub state: ServerState,
    /// Memory budget, and the part of it free at its last heartbeat.
    pub memory_budget_bytes: u64,
    /// Free memory at its last heartbeat.
    pub free_memory_bytes: u64,
    /// Free disk above its reserve at its last heartbeat (0 while full or draining).
    pub free_disk_bytes: u64,
    /// Total size of its data directories.
    pub disk_capacity_bytes: u64,
    /// Partitions it held at its last heartbeat.
    pub partitions_held: u32,
    /// Its push rate at its last heartbeat.
    pub push_bytes_per_s: u64,
    /// Milliseconds since its last heartbeat.
    pub last_heartbeat_ms: u64,
    /// Shuffles it held at its last `ServerStatus` (`None`: it sends none).
    pub shuffles_held: Option<u32>,
    /// Its data directories at its last `ServerStatus`.
    pub disks: Vec<DiskReport>,
    /// A drain or undrain asked through this coordinator and not yet carried out.
    pub drain_pending: Option<DrainMark>,
}

/// One application.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppSummary {
    /// Its id.
    pub app_id: String,
    /// Its registered shuffles, ascending.
    pub shuffles: Vec<u32>,
    /// Milliseconds since its last heartbeat or registration.
    pub last_heartbeat_ms: u64,
}

/// Where one partition of a shuffle lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionPlace {
    /// The partition.
    pub partition: u32,
    /// The server id of its primary copy.
    pub primary: String,
    /// The server id of its replica, if any.
    pub replica: Option<String>,
}

/// One registered shuffle and its assignment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShuffleSummary {
    /// Its application.
    pub app_id: String,
    /// Its id within the application.
    pub shuffle_id: u32,
    /// Map tasks it was registered with.
    pub maps: u32,
    /// Partitions.
    pub partitions: u32,
    /// Copies of each partition.
    pub replication: u8,
    /// Milliseconds since it was registered.
    pub registered_ms: u64,
    /// The servers its partitions are spread over.
    pub servers: Vec<ServerAddr>,
    /// Each partition's servers, in partition order.
    pub placement: Vec<PartitionPlace>,
}

fn millis_since(t: Instant) -> u64 {
    t.elapsed().as_millis().min(u64::MAX as u128) as u64
}

fn summary(app_id: &str, shuffle_id: u32, r: &Registered) -> ShuffleSummary {
    let a = &r.assignment;
    let id = |i: u16| a.servers.get(i as usize).map(|s| s.server_id.clone());
    ShuffleSummary {
        app_id: app_id.to_owned(),
        shuffle_id,
        maps: r.num_maps,
        partitions: a.partitions.len() as u32,
        replication: r.replication,
        registered_ms: millis_since(r.since),
        servers: a.servers.clone(),
        placement: a
            .partitions
            .iter()
            .enumerate()
            .map(|(p, loc)| PartitionPlace {
                partition: p as u32,
                primary: id(loc.primary).unwrap_or_default(),
                replica: if loc.replica == NO_REPLICA { None } else { id(loc.replica) },
            })
            .collect(),
    }
}

impl Coordinator {
    fn server_timeout(&self) -> Duration {
        Duration::from_millis(self.config.server_timeout_ms)
    }

    /// Every server it has heard from since it started, lost ones included, by id.
    pub fn servers_report(&self) -> Vec<ServerSummary> {
        let timeout = self.server_timeout();
        let view = self.view.lock();
        let mut out: Vec<ServerSummary> = view
            .servers
            .values()
            .map(|s| ServerSummary {
                addr: s.addr.clone(),
                state: s.state(timeout),
                memory_budget_bytes: s.memory_budget_bytes,
                free_memory_bytes: s.free_memory_bytes,
                free_disk_bytes: s.free_disk_bytes,
                disk_capacity_bytes: s.disk_capacity_bytes,
                partitions_held: s.partitions_held,
                push_bytes_per_s: s.push_bytes_per_s,
                last_heartbeat_ms: millis_since(s.last_seen),
                shuffles_held: s.status.as_ref().map(|st| st.shuffles_held),
                disks: s.status.as_ref().map(|st| st.disks.clone()).unwrap_or_default(),
                drain_pending: s.drain_mark,
            })
            .collect();
        out.sort_by(|a, b| a.addr.server_id.cmp(&b.addr.server_id));
        out
    }

    /// Every live application, by id.
    pub fn apps_report(&self) -> Vec<AppSummary> {
        let view = self.view.lock();
        let mut out: Vec<AppSummary> = view
            .apps
            .iter()
            .map(|(app, seen)| {
                let mut shuffles: Vec<u32> =
                    view.shuffles.keys().filter(|(a, _)| a == app).map(|(_, s)| *s).collect();
                shuffles.sort_unstable();
                AppSummary { app_id: app.clone(), shuffles, last_heartbeat_ms: millis_since(*seen) }
            })
            .collect();
        out.sort_by(|a, b| a.app_id.cmp(&b.app_id));
        out
    }

    /// The shuffles of `app_id`, by id; `None` when no such application is registered.
    pub fn shuffles_of(&self, app_id: &str) -> Option<Vec<ShuffleSummary>> {
        let view = self.view.lock();
        let mut out: Vec<ShuffleSummary> = view
            .shuffles
            .iter()
            .filter(|((a, _), _)| a == app_id)
            .map(|((a, id), r)| summary(a, *id, r))
            .collect();
        if out.is_empty() && !view.apps.contains_key(app_id) {
            return None;
        }
        out.sort_by_key(|s| s.shuffle_id);
        Some(out)
    }

    /// One shuffle; `None` when it is not registered here.
    pub fn shuffle(&self, app_id: &str, shuffle_id: u32) -> Option<ShuffleSummary> {
        let view = self.view.lock();
        view.shuffles.get(&(app_id.to_owned(), shuffle_id)).map(|r| summary(app_id, shuffle_id, r))
    }

    /// Marks a server to drain: it gets no new partitions from here at once, and is told at its
    /// next `ServerStatus`. Idempotent; `false` when no server has that id.
    pub fn drain_server(&self, server_id: &str) -> bool {
        self.mark(server_id, DrainMark::Drain)
    }

    /// Cancels a drain (also one the server started itself); `false` for an unknown id.
    pub fn undrain_server(&self, server_id: &str) -> bool {
        self.mark(server_id, DrainMark::Undrain)
    }

    fn mark(&self, server_id: &str, mark: DrainMark) -> bool {
        let mut view = self.view.lock();
        let Some(s) = view.servers.get_mut(server_id) else { return false };
        if s.drain_mark != Some(mark) {
            tracing::info!(
                server = server_id,
                ?mark,
                "operator asked a server to change its drain"
            );
        }
        s.drain_mark = Some(mark);
        true
    }

    /// [`Self::unregister_app`], then hands the removal to the peer coordinators (as an
    /// `UnregisterApp` answered here would be), so that none of them keeps answering with the
    /// application's assignments or teaches them back to a restarting coordinator. The peers are
    /// told even when this coordinator did not know the application (it may have missed a
    /// hand-over); `false` says only that it was not known here.
    pub async fn unregister_app_everywhere(self: &Arc<Self>, app_id: &str) -> bool {
        let known = self.unregister_app(app_id);
        if !self.config.peers.is_empty() {
            let sync = ShuffleSync { removed_apps: vec![app_id.to_owned()], ..Default::default() };
            self.hand_over(sync.into()).await;
        }
        known
    }

    /// Forgets an application and its shuffles' assignments here (the servers delete its data
    /// when its heartbeats stop reaching them). `false` when it is not known here.
    pub fn unregister_app(&self, app_id: &str) -> bool {
        let mut view = self.view.lock();
        let had_app = view.apps.remove(app_id).is_some();
        let before = view.shuffles.len();
        view.shuffles.retain(|(a, _), _| a != app_id);
        let known = had_app || view.shuffles.len() != before;
        if known {
            tracing::info!(app = app_id, "application unregistered by an operator");
        }
        known
    }

    /// Prometheus text of the coordinator's gauges: live servers, servers by state,
    /// applications and shuffles registered, applications and users at quota; and counters:
    /// splits made, shuffle registrations refused at quota; and its listener's counters:
    /// connections, refused handshakes and requests, failed TLS handshakes.
    pub fn metrics(&self) -> String {
        let live = self.live_servers().len();
        let servers = self.servers_report();
        let count = |st: ServerState| servers.iter().filter(|s| s.state == st).count();
        let timeout = Duration::from_millis(self.config.server_timeout_ms);
        let (apps, shuffles, splits, refusals, at_quota) = {
            let view = self.view.lock();
            let at_quota = view.holders_at_quota(timeout);
            (view.apps.len(), view.shuffles.len(), view.splits_made, view.quota_refusals, at_quota)
        };
        let mut out = format!(
            "# TYPE sluice_coordinator_live_servers gauge\nsluice_coordinator_live_servers {live}\n"
        );
        out.push_str("# TYPE sluice_coordinator_servers gauge\n");
        for st in [ServerState::Live, ServerState::Draining, ServerState::Lost] {
            let n = count(st);
            out.push_str(&format!("sluice_coordinator_servers{{state=\"{}\"}} {n}\n", st.name()));
        }
        for (name, v) in
            [("sluice_coordinator_applications", apps), ("sluice_coordinator_shuffles", shuffles)]
        {
            out.push_str(&format!("# TYPE {name} gauge\n{name} {v}\n"));
        }
        out.push_str(&format!(
            "# TYPE sluice_coordinator_splits_total counter\nsluice_coordinator_splits_total {splits}\n"
        ));
        out.push_str(&format!(
            "# TYPE sluice_coordinator_quota_refusals_total counter\n\
             sluice_coordinator_quota_refusals_total {refusals}\n"
        ));
        out.push_str("# TYPE sluice_coordinator_at_quota gauge\n");
        for holder in ["app", "user"] {
            let n = at_quota.iter().filter(|(h, _)| *h == holder).count();
            out.push_str(&format!("sluice_coordinator_at_quota{{holder=\"{holder}\"}} {n}\n"));
        }
        let t = self.stats.snapshot();
        for (name, kind, v) in [
            ("sluice_coordinator_connections_open", "gauge", t.connections_open),
            ("sluice_coordinator_connections_accepted_total", "counter", t.connections_accepted),
            ("sluice_coordinator_handshakes_failed_total", "counter", t.handshakes_failed),
            ("sluice_coordinator_requests_unauthorized_total", "counter", t.requests_unauthorized),
            ("sluice_coordinator_tls_handshakes_failed_total", "counter", t.tls_handshakes_failed),
            ("sluice_coordinator_protocol_errors_total", "counter", t.protocol_errors),
        ] {
            out.push_str(&format!("# TYPE {name} {kind}\n{name} {v}\n"));
        }
        out
    }

    /// A server's `ServerStatus`: kept for the reports, answered with the drain order pending.
    pub(crate) fn server_status(&self, st: ServerStatus) -> Result<Message, Refused> {
        let mut view = self.view.lock();
        let Some(s) = view.servers.get_mut(&st.server_id) else {
            // It registers with its next heartbeat; its status can wait for that.
            return Ok(DrainOrder { order: DRAIN_ORDER_NONE }.into());
        };
        let draining = st.draining == 1;
        let order = match s.drain_mark {
            Some(DrainMark::Drain) if !draining => DRAIN_ORDER_START,
            Some(DrainMark::Undrain) if draining => DRAIN_ORDER_STOP,
            Some(_) => {
                s.drain_mark = None; // carried out: the server's report is the truth from now on
                DRAIN_ORDER_NONE
            }
            None => DRAIN_ORDER_NONE,
        };
        s.status = Some(st);
        Ok(DrainOrder { order }.into())
    }
}
