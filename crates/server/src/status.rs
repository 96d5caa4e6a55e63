//! Read-only views of a running server for operators (the admin API): its identity, counters,
//! memory, drain state, data directories and what it holds. Plain values; the HTTP layer
//! (`sluice-admin`) turns them into JSON.

use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};

use sluice_proto::message::{DiskReport, DISK_FAILED, DISK_FULL, DISK_IN_SERVICE};
use sluice_transport::TransportStats;

use crate::core::AppReport;
use crate::state::ServerState;

/// Who a serving server is: what it reports to coordinators.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// Its stable name (`server_id`, or `host:port`).
    pub server_id: String,
    /// Host clients reach it at.
    pub host: String,
    /// Port clients reach it at.
    pub port: u16,
}

/// Whether a data directory takes new data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiskState {
    /// Neither full nor failed.
    InService,
    /// Its file system is below the reserve: serves what it holds, takes nothing new.
    Full,
    /// Out of service after an I/O error, until the server restarts.
    Failed,
}

impl DiskState {
    /// The wire value ([`DiskReport::state`]).
    pub fn wire(self) -> u8 {
        match self {
            DiskState::InService => DISK_IN_SERVICE,
            DiskState::Full => DISK_FULL,
            DiskState::Failed => DISK_FAILED,
        }
    }

    /// From the wire value; `None` for a value the protocol does not define.
    pub fn from_wire(v: u8) -> Option<DiskState> {
        match v {
            DISK_IN_SERVICE => Some(DiskState::InService),
            DISK_FULL => Some(DiskState::Full),
            DISK_FAILED => Some(DiskState::Failed),
            _ => None,
        }
    }
}

/// One data directory as it stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskStatus {
    /// Its path.
    pub path: String,
    /// Free bytes on its file system (0 when unreadable).
    pub free_bytes: u64,
    /// Total bytes of its file system (0 when unreadable).
    pub capacity_bytes: u64,
    /// Whether it takes new data.
    pub state: DiskState,
}

impl From<&DiskStatus> for DiskReport {
    fn from(d: &DiskStatus) -> DiskReport {
        DiskReport {
            path: d.path.clone(),
            free_bytes: d.free_bytes,
            capacity_bytes: d.capacity_bytes,
            state: d.state.wire(),
        }
    }
}

/// Counters since the server started (also the admin API's `counters` object, as is).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct Counters {
    /// Push requests taken.
    pub push_requests: u64,
    /// Bytes pushed and taken.
    pub pushed_bytes: u64,
    /// Pushes answered `Busy`.
    pub busy_replies: u64,
    /// Bytes written to the data directories.
    pub flushed_bytes: u64,
    /// Shuffles committed.
    pub commits: u64,
    /// Read streams opened.
    pub streams_opened: u64,
    /// Chunks served.
    pub fetched_chunks: u64,
    /// Bytes served.
    pub fetched_bytes: u64,
    /// Requests answered with an error.
    pub request_errors: u64,
}

/// A server as it stands.
#[derive(Debug, Clone)]
pub struct StatusReport {
    /// Who it is; `None` until it serves.
    pub identity: Option<Identity>,
    /// Taking no new partitions.
    pub draining: bool,
    /// The memory budget for pushed data, in bytes.
    pub memory_budget_bytes: u64,
    /// Bytes reserved from it now.
    pub memory_used_bytes: u64,
    /// The highest reservation since start.
    pub memory_peak_bytes: u64,
    /// Counters since start.
    pub counters: Counters,
    /// Connections open now.
    pub connections: u64,
    /// Partitions of every shuffle held.
    pub partitions_held: u32,
    /// Every application and its shuffles.
    pub apps: Vec<AppReport>,
}

/// A cheap handle on a server for operators: its status, disks and metrics, and its drain
/// switch. Clone it into the admin endpoint; it outlives nothing it points to.
#[derive(Clone)]
pub struct ServerHandle {
    pub(crate) state: Arc<ServerState>,
    pub(crate) transport: Arc<TransportStats>,
    pub(crate) identity: Arc<OnceLock<Identity>>,
}

impl ServerHandle {
    /// Whether the server serves its listener (it has started [`crate::Server::serve`]).
    pub fn is_serving(&self) -> bool {
        self.identity.get().is_some()
    }

    /// Whether it takes new partitions: serving and not draining (readiness).
    pub fn is_ready(&self) -> bool {
        self.is_serving() && !self.state.is_draining()
    }

    /// Stops taking new partitions; idempotent (see [`ServerState::start_draining`]).
    pub fn start_draining(&self) {
        self.state.start_draining();
    }

    /// Takes new partitions again; idempotent. `false` while the server is stopping (SIGTERM):
    /// it stays draining.
    pub fn stop_draining(&self) -> bool {
        self.state.stop_draining()
    }

    /// Whether it drains.
    pub fn is_draining(&self) -> bool {
        self.state.is_draining()
    }

    /// Shuffles held, of every application.
    pub fn shuffles_held(&self) -> usize {
        self.state.shuffles_held()
    }

    /// Shuffles held and not committed yet (a restart would lose them).
    pub fn uncommitted_shuffles(&self) -> usize {
        self.state.unsealed_shuffles()
    }

    /// The server's data directories.
    pub fn disks(&self) -> Vec<DiskStatus> {
        disks(&self.state)
    }

    /// The whole status.
    pub fn status(&self) -> StatusReport {
        let s = &self.state;
        let g = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        StatusReport {
            identity: self.identity.get().cloned(),
            draining: s.is_draining(),
            memory_budget_bytes: s.budget.capacity(),
            memory_used_bytes: s.budget.used(),
            memory_peak_bytes: s.budget.peak(),
            counters: Counters {
                push_requests: g(&s.stats.push_requests),
                pushed_bytes: g(&s.stats.pushed_bytes),
                busy_replies: g(&s.stats.busy_replies),
                flushed_bytes: g(&s.stats.flushed_bytes),
                commits: g(&s.stats.commits),
                streams_opened: g(&s.stats.streams_opened),
                fetched_chunks: g(&s.stats.fetched_chunks),
                fetched_bytes: g(&s.stats.fetched_bytes),
                request_errors: g(&s.stats.errors),
            },
            connections: self.transport.snapshot().connections_open,
            partitions_held: s.partitions_held(),
            apps: s.apps_report(),
        }
    }

    /// Prometheus text for the server's counters and gauges.
    pub fn metrics(&self) -> String {
        crate::Server::metrics(&self.state, &self.transport)
    }
}

/// Every data directory of `state` as it stands (statvfs on each).
pub(crate) fn disks(state: &ServerState) -> Vec<DiskStatus> {
    state
        .storage
        .dirs()
        .iter()
        .map(|d| DiskStatus {
            path: d.path.display().to_string(),
            free_bytes: d.free_bytes(),
            capacity_bytes: d.capacity_bytes(),
            state: if d.is_failed() {
                DiskState::Failed
            } else if d.is_full() {
                DiskState::Full
            } else {
                DiskState::InService
            },
        })
        .collect()
}
