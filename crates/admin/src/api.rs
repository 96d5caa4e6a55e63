//! The admin API's JSON bodies, version 1: what the endpoints answer and what `sluice admin`
//! reads. `docs/openapi.yaml` describes the same shapes; the integration test checks every
//! answer of a running cluster against it. Fields are only ever added within `/api/v1`.
//!
//! Most of these mirror a report of the server or coordinator crate field for field, on
//! purpose: the JSON is a versioned contract with scripts and the Helm chart, while those
//! reports follow the code (the server core's may change with any refactoring).

use serde::{Deserialize, Serialize};

/// Every error answer: a human message and a stable machine code.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiError {
    /// What went wrong, for people.
    pub error: String,
    /// What went wrong, for scripts: `not_found`, `method_not_allowed`, `unauthorized`,
    /// `bad_request`, `unknown_server`, `unknown_app`, `unknown_shuffle`, `invalid_body`.
    pub code: String,
}

/// An optional body of the write endpoints: why the operator acts, logged with the action.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActionRequest {
    /// Free text for the log (who, why).
    #[serde(default)]
    pub reason: Option<String>,
}

/// Whether a data directory takes new data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DiskState {
    /// Neither full nor failed.
    InService,
    /// Its file system is below the reserve: it serves what it holds, takes nothing new.
    Full,
    /// Out of service after an I/O error, until the server restarts.
    Failed,
}

/// One data directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Disk {
    /// Its path on the server.
    pub path: String,
    /// Free bytes on its file system.
    pub free_bytes: u64,
    /// Total bytes of its file system.
    pub capacity_bytes: u64,
    /// Whether it takes new data.
    pub state: DiskState,
}

/// `GET /api/v1/disks` (server).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Disks {
    /// Every data directory, in configuration order.
    pub disks: Vec<Disk>,
}

/// A server's memory budget for pushed data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Memory {
    /// The budget.
    pub budget_bytes: u64,
    /// Reserved now.
    pub used_bytes: u64,
    /// Highest reservation since start.
    pub peak_bytes: u64,
}

/// A server's counters since start (the server crate's own type: the same fields).
pub use sluice_server::Counters;

/// Where a shuffle is in its life on a server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ShuffleState {
    /// Takes pushes.
    Open,
    /// Being committed: pushes refused, buffers flushing.
    Committing,
    /// Committed: readers may read.
    Readable,
    /// Unregistered or expired.
    Deleted,
}

/// One shuffle as a server holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldShuffle {
    /// Its id within its application.
    pub shuffle_id: u32,
    /// Where it is in its life.
    pub state: ShuffleState,
    /// Maps it was registered with.
    pub maps: u32,
    /// Maps that ended here.
    pub maps_ended: u32,
    /// Partitions it was registered with.
    pub partitions: u32,
    /// Partitions that lost data.
    pub lost_partitions: u32,
    /// Bytes in memory, not yet handed to a flusher.
    pub buffered_bytes: u64,
    /// Bytes of its chunks: on disk, or in the object store for `offloaded_bytes` of them.
    pub stored_bytes: u64,
    /// Bytes of its chunks moved to the object store (the object-store tier); absent from
    /// servers that predate it.
    #[serde(default)]
    pub offloaded_bytes: u64,
    /// Chunks in its index.
    pub chunks: u64,
    /// Flushes handed out and not yet written.
    pub flushes_in_flight: u64,
}

/// One application as a server holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldApp {
    /// Its id.
    pub app_id: String,
    /// Milliseconds since it was last heard from.
    pub idle_ms: u64,
    /// Its shuffles here.
    pub shuffles: Vec<HeldShuffle>,
}

/// `GET /api/v1/status` (server).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerStatus {
    /// Its stable name; `null` until it serves.
    pub server_id: Option<String>,
    /// `host:port` clients reach it at; `null` until it serves.
    pub address: Option<String>,
    /// Serving its listener.
    pub serving: bool,
    /// Taking no new partitions.
    pub draining: bool,
    /// Its memory budget.
    pub memory: Memory,
    /// Counters since start.
    pub counters: Counters,
    /// Connections open now.
    pub connections: u64,
    /// Shuffles held, of every application.
    pub shuffles_held: u64,
    /// Of those, the ones not committed yet that hold data: what a restart would lose (a
    /// SIGTERM waits for them to be committed).
    pub uncommitted_shuffles: u64,
    /// Partitions of those shuffles.
    pub partitions_held: u32,
    /// Every application and its shuffles.
    pub apps: Vec<HeldApp>,
}

/// The answer to a server's `POST`/`DELETE /api/v1/drain`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainState {
    /// Draining now.
    pub draining: bool,
    /// Shuffles it still holds (a decommission is complete at 0).
    pub shuffles_held: u64,
    /// Of those, the ones not committed yet that hold data (a restart loses nothing at 0).
    pub uncommitted_shuffles: u64,
}

/// Where a server stands, as a coordinator sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MemberState {
    /// Heartbeating, taking new partitions.
    Live,
    /// Heartbeating, taking no new partitions.
    Draining,
    /// Silent past the coordinator's `server_timeout_ms`.
    Lost,
}

/// An operator's drain request a server has not carried out yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DrainPending {
    /// Asked to drain.
    Drain,
    /// Asked to stop draining.
    Undrain,
}

/// One server as a coordinator sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// Its stable name.
    pub server_id: String,
    /// `host:port` clients reach it at.
    pub address: String,
    /// Live, draining or lost.
    pub state: MemberState,
    /// A drain or undrain asked through this coordinator, not yet carried out.
    pub drain_pending: Option<DrainPending>,
    /// Its memory budget.
    pub memory_budget_bytes: u64,
    /// Free memory at its last heartbeat.
    pub free_memory_bytes: u64,
    /// Free disk above its reserve at its last heartbeat (0 while full or draining).
    pub free_disk_bytes: u64,
    /// Total size of its data directories.
    pub disk_capacity_bytes: u64,
    /// Partitions it held at its last heartbeat.
    pub partitions_held: u32,
    /// Shuffles it held at its last status report; `null` for a server that sends none.
    pub shuffles_held: Option<u32>,
    /// Bytes pushed to it per second at its last heartbeat.
    pub push_bytes_per_s: u64,
    /// Milliseconds since its last heartbeat.
    pub last_heartbeat_ms: u64,
    /// Its data directories at its last status report.
    pub disks: Vec<Disk>,
}

/// `GET /api/v1/servers` (coordinator).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Members {
    /// Every server heard from since the coordinator started, by id.
    pub servers: Vec<Member>,
}

/// One application as a coordinator sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct App {
    /// Its id.
    pub app_id: String,
    /// Its registered shuffles.
    pub shuffles: Vec<u32>,
    /// Milliseconds since its last heartbeat or registration.
    pub last_heartbeat_ms: u64,
}

/// `GET /api/v1/apps` (coordinator).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Apps {
    /// Every live application, by id.
    pub apps: Vec<App>,
}

/// A server an assignment names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerRef {
    /// Its stable name.
    pub server_id: String,
    /// `host:port` clients reach it at.
    pub address: String,
}

/// Where one partition lives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    /// The partition.
    pub partition: u32,
    /// Server id of its primary copy.
    pub primary: String,
    /// Server id of its replica; `null` without one.
    pub replica: Option<String>,
}

/// One registered shuffle and its assignment (coordinator).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shuffle {
    /// Its application.
    pub app_id: String,
    /// Its id within the application.
    pub shuffle_id: u32,
    /// Map tasks.
    pub maps: u32,
    /// Partitions.
    pub partitions: u32,
    /// Copies of each partition (1 or 2).
    pub replication: u8,
    /// Milliseconds since it was registered.
    pub registered_ms: u64,
    /// The servers it is spread over.
    pub servers: Vec<ServerRef>,
    /// Each partition's servers, in partition order.
    pub assignment: Vec<Placement>,
}

/// `GET /api/v1/apps/{app}/shuffles` (coordinator).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shuffles {
    /// The application.
    pub app_id: String,
    /// Its shuffles, by id.
    pub shuffles: Vec<Shuffle>,
}

/// The answer to `POST /api/v1/apps/{app}/unregister` (coordinator).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unregistered {
    /// The application forgotten.
    pub app_id: String,
}

/// `GET /healthz` and `GET /readyz`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Health {
    /// `ok`, or why not ready: `draining`, `not_serving`.
    pub status: String,
}
