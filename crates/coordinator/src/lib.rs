//! # sluice-coordinator
//!
//! Knows the live servers (from their heartbeats), the live applications (from theirs) and each
//! registered shuffle's assignment. Holds no durable state: servers and applications heartbeat to
//! every coordinator, so a restarted coordinator rebuilds its view of them within one heartbeat
//! interval, and several coordinators run side by side.
//!
//! **Several coordinators.** Any of them answers every request. Assignments are the one thing a
//! heartbeat cannot rebuild (they come from the load at the moment of the request), so the
//! coordinator that makes one hands it to its peers (`peers`) *before* it answers, and passes on
//! every unregistration; a starting coordinator asks its peers for everything they know
//! ([`ShuffleSync`]). An assignment answered to a client is thus known to every live peer: it
//! survives the loss of the coordinator that made it. (Recomputing assignments
//! deterministically was the alternative; it would have to ignore the load that makes them good,
//! and holding them in the servers would have put a second job on the data plane.) A peer down
//! while an assignment was made asks for it when it starts again.
//!
//! ## Layout
//! The API is [`CoordinatorConfig`], [`Coordinator`] and the values it reports.
//! - [`CoordinatorConfig`]: the configuration.
//! - [`Coordinator`]: the state and what each request does to it ([`Coordinator::handle`],
//!   free of I/O).
//! - `assign`: the load-aware partition assignment, free of I/O.
//! - [`Coordinator::serve`]: the transport handler and the expiry tick.
//! - `report`: read-only views and operator actions for the admin API (servers with their
//!   state, applications, shuffles with their assignment; drain, undrain, unregister). No HTTP
//!   here: `sluice-admin` serves them.

#![warn(missing_docs)]

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod report;

pub use report::{
    AppSummary, DrainMark, PartitionPlace, ServerState, ServerSummary, ShuffleSummary,
};

use parking_lot::Mutex;
use serde::Deserialize;
use sluice_proto::message::*;
use sluice_proto::{ErrorCode, MsgType};
use sluice_transport::{Admission, ConnInfo, Handler, Request, Response, TransportStats};
use tokio::net::TcpListener;

/// A server not heard from for this long (or ten server timeouts, if longer) is forgotten.
const LOST_SERVERS_FORGOTTEN_AFTER: Duration = Duration::from_secs(3600);

/// Configuration of a `sluice coordinator`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CoordinatorConfig {
    /// Address to listen on (`host:port`; port 0 picks a free one).
    pub listen: String,
    /// A server with no heartbeat for this long is marked lost and gets no new partitions, in ms.
    pub server_timeout_ms: u64,
    /// An application with no heartbeat for this long is forgotten with its assignments, in ms.
    pub app_expiry_ms: u64,
    /// Network transport settings.
    pub transport: sluice_transport::ServerConfig,
    /// Bearer token the admin API's write endpoints (drain, undrain, unregister) require;
    /// `None`: they are open. At least 16 characters.
    pub admin_token: Option<String>,
    /// The other coordinators (`host:port`): each assignment made here is handed to them before
    /// it is answered, and a starting coordinator asks them for theirs.
    pub peers: Vec<String>,
    /// How long handing an assignment to one peer may take before it is given up on (the peer
    /// asks for it when it starts again), in milliseconds.
    pub peer_timeout_ms: u64,
    /// TLS to the peers (`[peer_tls]`: `ca_file`, and `cert_file`/`key_file` when they require
    /// client certificates); `None`: plain TCP. Peers prove the cluster key
    /// (`transport.secret`) like servers do.
    pub peer_tls: Option<sluice_transport::TlsClientConfig>,
    /// Servers listed in each assignment beyond those its partitions were given to (the ones
    /// with the most room): where the parts of split partitions go (docs/protocol.md,
    /// "Partition splits"). Each gets the shuffle's registration, commit and every map's end.
    pub spare_servers: u16,
    /// Most partitions one `RegisterShuffle` may ask for; more is refused (`INVALID_REQUEST`).
    /// Assigning takes time and memory per partition under the coordinator's one lock, so an
    /// unbounded count (a bug, `u32::MAX`) would stall or abort every request. The servers
    /// enforce the same key.
    pub max_partitions_per_shuffle: u32,
    /// Most map tasks one `RegisterShuffle` may name; more is refused (`INVALID_REQUEST`), as
    /// the servers would refuse it (they keep state per map).
    pub max_maps_per_shuffle: u32,
}

impl Default for CoordinatorConfig {
    fn default() -> Self {
        CoordinatorConfig {
            listen: "127.0.0.1:9096".into(),
            server_timeout_ms: 10_000,
            app_expiry_ms: 120_000,
            transport: sluice_transport::ServerConfig::default(),
            admin_token: None,
            peers: Vec::new(),
            peer_timeout_ms: 1_000,
            peer_tls: None,
            spare_servers: 2,
            max_partitions_per_shuffle: 262_144,
            max_maps_per_shuffle: 1_048_576,
        }
    }
}

impl CoordinatorConfig {
    /// Checks the values.
    pub fn validate(&self) -> Result<(), String> {
        if self.server_timeout_ms == 0 || self.app_expiry_ms == 0 || self.peer_timeout_ms == 0 {
            return Err(
                "server_timeout_ms, app_expiry_ms and peer_timeout_ms must be positive".into()
            );
        }
        if self.max_partitions_per_shuffle == 0 || self.max_maps_per_shuffle == 0 {
            return Err(
                "max_partitions_per_shuffle and max_maps_per_shuffle must be positive".into()
            );
        }
        if let Some(p) = self.peers.iter().find(|p| !p.contains(':')) {
            return Err(format!("peers: {p:?} is not host:port"));
        }
        sluice_transport::validate_admin_token(self.admin_token.as_deref())?;
        self.transport.validate().map_err(|e| format!("transport: {e}"))
    }
}

/// What the coordinator knows of one server.
#[derive(Debug, Clone)]
pub struct ServerInfo {
    /// Its name and where clients reach it, as it last reported them.
    pub addr: ServerAddr,
    /// When its last registration or heartbeat arrived; too long ago and it is not live.
    pub last_seen: Instant,
    /// Memory it may hold pushed data in.
    pub memory_budget_bytes: u64,
    /// Part of that budget free at its last heartbeat: memory pressure weighs on its score.
    pub free_memory_bytes: u64,
    /// Free disk above its reserve at its last heartbeat (0 while full or draining).
    pub free_disk_bytes: u64,
    /// The last heartbeat reported no free disk above the server's reserve (its directories are
    /// full or failed, or it is draining): it gets no new partitions while another server has
    /// room.
    pub no_room: bool,
    /// Partitions it held at its last heartbeat.
    pub partitions_held: u32,
    /// Push rate at its last heartbeat: a busy server scores worse.
    pub push_bytes_per_s: u64,
    /// Partitions assigned since its last heartbeat (not yet in `partitions_held`), less those
    /// of shuffles unregistered since then.
    pub assigned_since_heartbeat: u32,
    /// Since when `assigned_since_heartbeat` counts (its last heartbeat, or when it joined).
    pub promised_since: Instant,
    /// Total size of its data directories, from its registration.
    pub disk_capacity_bytes: u64,
    /// Its last [`ServerStatus`] (drain state, shuffles held, disks); `None` from a server that
    /// does not send one.
    pub status: Option<ServerStatus>,
    /// What an operator asked of it through this coordinator and it has not yet carried out.
    pub drain_mark: Option<DrainMark>,
}

impl ServerInfo {
    /// Lower is better: partitions held or promised, scaled up by memory pressure and push rate.
    fn load_score(&self) -> f64 {
        // In u64: both counts come from (or grow with) what servers report, and a sum that
        // wrapped would make the busiest server look idle.
        let partitions =
            (u64::from(self.partitions_held) + u64::from(self.assigned_since_heartbeat) + 1) as f64;
        let free_frac = if self.memory_budget_bytes == 0 {
            1.0
        } else {
            self.free_memory_bytes as f64 / self.memory_budget_bytes as f64
        };
        let busy = 1.0 + self.push_bytes_per_s as f64 / 1e9;
        partitions * busy / (free_frac + 0.1)
    }

    /// Counts one more partition given to it since its last heartbeat (saturating: a count
    /// that wrapped to 0 would make it look idle).
    fn promise_partition(&mut self) {
        self.assigned_since_heartbeat = self.assigned_since_heartbeat.saturating_add(1);
    }
}

/// Spreads `num_partitions` over `servers` (greedy on the load score), with a replica on another
/// server when `replication` is 2 and there is one. Updates the servers' promised counts.
fn assign(servers: &mut [ServerInfo], num_partitions: u32, replication: u8) -> Vec<PartitionLoc> {
    let mut out = Vec::with_capacity(num_partitions as usize);
    for _ in 0..num_partitions {
        let mut order: Vec<usize> = (0..servers.len()).collect();
        order.sort_by(|&a, &b| servers[a].load_score().total_cmp(&servers[b].load_score()));
        let primary = order[0];
        servers[primary].promise_partition();
        let replica = if replication >= 2 && order.len() > 1 {
            servers[order[1]].promise_partition();
            order[1] as u16
        } else {
            NO_REPLICA
        };
        out.push(PartitionLoc { primary: primary as u16, replica });
    }
    out
}

/// A registered shuffle: its assignment and what it was registered with.
#[derive(Debug, Clone)]
struct Registered {
    assignment: Assignment,
    num_maps: u32,
    replication: u8,
    /// When it was registered.
    since: Instant,
    /// The parts of each split partition (part 0 first, the assignment's own entry).
    splits: HashMap<u32, Vec<PartitionLoc>>,
    /// Learned from a peer at start, its splits not yet: `GetSplits` is answered with a
    /// retriable error meanwhile (an empty list would be a wrong answer, and readers keep it).
    splits_pending: bool,
}

impl Registered {
    fn new(assignment: Assignment, num_maps: u32, replication: u8) -> Self {
        Registered {
            assignment,
            num_maps,
            replication,
            since: Instant::now(),
            splits: HashMap::new(),
            splits_pending: false,
        }
    }

    /// Every split partition with its parts, in partition order.
    fn splits(&self, app_id: &str) -> Splits {
        let mut partitions: Vec<SplitParts> = self
            .splits
            .iter()
            .map(|(&partition_id, parts)| SplitParts { partition_id, parts: parts.clone() })
            .collect();
        partitions.sort_unstable_by_key(|p| p.partition_id);
        Splits { app_id: app_id.to_owned(), shuffle_id: self.assignment.shuffle_id, partitions }
    }

    /// Takes parts a peer made, merged with those known here ([`merge_parts`]).
    fn learn_splits(&mut self, s: &Splits) {
        let n = self.assignment.servers.len();
        for p in &s.partitions {
            let fits = p.parts.iter().all(|l| {
                (l.primary as usize) < n && (l.replica == NO_REPLICA || (l.replica as usize) < n)
            });
            if !fits || (p.partition_id as usize) >= self.assignment.partitions.len() {
                tracing::warn!(
                    shuffle = s.shuffle_id,
                    partition = p.partition_id,
                    "a peer's split does not fit the assignment known here; ignored"
                );
                continue;
            }
            let first = self.assignment.partitions[p.partition_id as usize].clone();
            let known = self.splits.entry(p.partition_id).or_insert_with(|| vec![first]);
            let merged = merge_parts(known, &p.parts);
            if merged.len() > known.len() {
                *known = merged;
            }
        }
    }
}

/// A partition's parts as two coordinators listed them, as one list that both make alike.
/// One list extending the other: the longer. Two that went apart (each coordinator answered a
/// `SplitPartition` of the same part count at once, and chose another server for the new
/// part; writers may have pushed to both): their common start, then the rest of the one whose
/// next part sorts first, then the other's parts not listed yet. Readers must read every part
/// that took batches, and every coordinator must list them alike.
fn merge_parts(mine: &[PartitionLoc], theirs: &[PartitionLoc]) -> Vec<PartitionLoc> {
    let common = mine.iter().zip(theirs).take_while(|(a, b)| a == b).count();
    let key = |l: &PartitionLoc| (l.primary, l.replica);
    let (a, b) = (&mine[common..], &theirs[common..]);
    let (first, second) = match (a.first(), b.first()) {
        (None, _) => return theirs.to_vec(),
        (_, None) => return mine.to_vec(),
        (Some(x), Some(y)) if key(x) <= key(y) => (a, b),
        _ => (b, a),
    };
    let mut out: Vec<PartitionLoc> = mine[..common].to_vec();
    for l in first.iter().chain(second) {
        if !out.contains(l) {
            out.push(l.clone());
        }
    }
    out
}

/// What one server last said of who is at quota there ([`QuotaReport`]).
#[derive(Debug, Clone)]
struct QuotaHeard {
    at: Instant,
    at_quota: Vec<AtQuota>,
}

#[derive(Default)]
struct View {
    servers: HashMap<String, ServerInfo>,
    apps: HashMap<String, Instant>,
    /// The user each application runs as, from its `RegisterApp` (those with one).
    app_users: HashMap<String, String>,
    /// Per server: its last [`QuotaReport`]. Only a live server's report, not older than
    /// `server_timeout_ms`, counts: a server that stops reporting someone (or dies, or restarts)
    /// stops holding them back.
    quota: HashMap<String, QuotaHeard>,
    /// Shuffle registrations refused with `QUOTA_EXCEEDED`.
    quota_refusals: u64,
    shuffles: HashMap<(String, u32), Registered>,
    /// Parts added to split partitions here (not the ones learned from peers).
    splits_made: u64,
    /// While learning from its peers at start: the applications and shuffles removed meanwhile,
    /// which a peer's snapshot taken before the removal must not bring back.
    removed_while_learning: Option<Removed>,
}

/// Applications and shuffles removed (see [`View::removed_while_learning`]).
#[derive(Default)]
struct Removed {
    apps: std::collections::HashSet<String>,
    shuffles: std::collections::HashSet<(String, u32)>,
}

impl View {
    /// Notes that application `app` (or only its shuffle `shuffle`) was removed, if learning.
    fn note_removed(&mut self, app: &str, shuffle: Option<u32>) {
        if let Some(r) = &mut self.removed_while_learning {
            match shuffle {
                Some(id) => r.shuffles.insert((app.to_owned(), id)),
                None => r.apps.insert(app.to_owned()),
            };
        }
    }

    /// Whether a peer's snapshot may bring back shuffle `key` (not removed since learning began).
    fn may_learn(&self, key: &(String, u32)) -> bool {
        self.removed_while_learning
            .as_ref()
            .is_none_or(|r| !r.apps.contains(&key.0) && !r.shuffles.contains(key))
    }

    /// A shuffle is unregistered: the partitions its assignment promised to servers that have
    /// not sent a heartbeat since no longer count against them. (Registering and unregistering
    /// shuffles between two heartbeats, as a probe does, would otherwise make a server look
    /// loaded until its next one, and the next shuffle would pass it over.) Promises a heartbeat
    /// has since replaced are its `partitions_held`, which says what the server holds.
    fn release_promises(&mut self, shuffle: &Registered) {
        let a = &shuffle.assignment;
        for loc in &a.partitions {
            for i in [loc.primary, loc.replica] {
                let Some(addr) = a.servers.get(i as usize) else { continue };
                if let Some(s) = self.servers.get_mut(&addr.server_id) {
                    if shuffle.since >= s.promised_since {
                        s.assigned_since_heartbeat = s.assigned_since_heartbeat.saturating_sub(1);
                    }
                }
            }
        }
    }

    /// The quota reports of servers heard from within `timeout`, themselves not older.
    fn live_quota_reports(
        &self,
        timeout: Duration,
    ) -> impl Iterator<Item = (&String, &QuotaHeard)> + '_ {
        self.quota.iter().filter(move |(id, h)| {
            h.at.elapsed() < timeout
                && self.servers.get(*id).is_some_and(|s| s.last_seen.elapsed() < timeout)
        })
    }

    /// Why `app_id` may not register a shuffle: a live server reported it, or its user, at a
    /// quota within `timeout` (the first such report, by server id); `None`: it may.
    fn at_quota(&self, app_id: &str, timeout: Duration) -> Option<String> {
        let user = self.app_users.get(app_id).map(String::as_str);
        let mut servers: Vec<(&String, &QuotaHeard)> = self.live_quota_reports(timeout).collect();
        servers.sort_by(|a, b| a.0.cmp(b.0));
        for (server, heard) in servers {
            for a in &heard.at_quota {
                let (limit, held) = (a.limit_bytes, a.held_bytes);
                if a.holder == QUOTA_HOLDER_APP && a.name == app_id {
                    return Some(format!(
                        "application {app_id} is at its quota app.{} on server {server} (limit \
                         {limit} bytes, {held} held there)",
                        a.quota
                    ));
                }
                if a.holder == QUOTA_HOLDER_USER && Some(a.name.as_str()) == user {
                    return Some(format!(
                        "user {} (application {app_id}) is at its quota user.{} on server \
                         {server} (limit {limit} bytes, {held} held there by the user's \
                         applications)",
                        a.name, a.quota
                    ));
                }
            }
        }
        None
    }

    /// Applications and users at a quota on a live server, as (`app`/`user`, name) pairs.
    fn holders_at_quota(&self, timeout: Duration) -> Vec<(&'static str, String)> {
        let mut out: Vec<(&'static str, String)> = self
            .live_quota_reports(timeout)
            .flat_map(|(_, h)| h.at_quota.iter())
            .map(|a| (if a.holder == QUOTA_HOLDER_APP { "app" } else { "user" }, a.name.clone()))
            .collect();
        out.sort();
        out.dedup();
        out
    }
}

/// The coordinator's state.
pub struct Coordinator {
    config: CoordinatorConfig,
    view: Mutex<View>,
    /// Inside [`Coordinator::serve`] (readiness).
    serving: AtomicBool,
    /// Done learning from its peers at start (readiness): a rolling update must not stop the
    /// peer this one is still learning from.
    learned: AtomicBool,
    /// Connections to the peers (`peers`), made on first use.
    peer_pool: std::sync::OnceLock<sluice_transport::Pool>,
    /// Counters of its listener (handshakes, refusals, TLS), in its metrics.
    stats: Arc<TransportStats>,
    /// Hand-overs a peer did not take, by peer, oldest first: sent again until it does (see
    /// [`Coordinator::hand_over`]).
    unsent: Mutex<HashMap<String, std::collections::VecDeque<(Instant, Message)>>>,
}

/// How long a hand-over a peer did not take is sent again (a peer down longer relearns
/// everything when it starts).
const HAND_OVER_RETRY_FOR: Duration = Duration::from_secs(600);
/// Most hand-overs kept for one peer; the oldest go first.
const HAND_OVER_RETRY_MAX: usize = 10_000;

/// A refused request: the `Error` message its requester gets.
type Refused = Message;

/// The `Error` reply with wire code `code`.
fn refuse(code: ErrorCode, text: impl Into<String>) -> Refused {
    Message::error(code, text)
}

impl Coordinator {
    /// A coordinator that knows no server, application or shuffle yet; fails when `config`
    /// does not validate.
    pub fn new(config: CoordinatorConfig) -> Result<Arc<Self>, String> {
        config.validate()?;
        Ok(Arc::new(Coordinator {
            config,
            view: Mutex::new(View::default()),
            serving: AtomicBool::new(false),
            learned: AtomicBool::new(false),
            peer_pool: std::sync::OnceLock::new(),
            stats: Arc::new(TransportStats::default()),
            unsent: Mutex::new(HashMap::new()),
        }))
    }

    /// The configuration it runs with.
    pub fn config(&self) -> &CoordinatorConfig {
        &self.config
    }

    /// Its listener's transport counters (connections, refused handshakes and bodies, …).
    pub fn transport_stats(&self) -> sluice_transport::StatsSnapshot {
        self.stats.snapshot()
    }

    /// Whether it serves its listener ([`Coordinator::serve`] runs).
    pub fn is_serving(&self) -> bool {
        self.serving.load(Ordering::Acquire)
    }

    /// Whether it is done learning from its peers at start (at once without peers).
    pub fn has_learned(&self) -> bool {
        self.learned.load(Ordering::Acquire)
    }

    /// Servers that heartbeated within the timeout.
    pub fn live_servers(&self) -> Vec<ServerInfo> {
        let timeout = Duration::from_millis(self.config.server_timeout_ms);
        let view = self.view.lock();
        let mut v: Vec<_> =
            view.servers.values().filter(|s| s.last_seen.elapsed() < timeout).cloned().collect();
        v.sort_by(|a, b| a.addr.server_id.cmp(&b.addr.server_id));
        v
    }

    /// Applies one request and returns the reply (an `Error` message for a refusal). No I/O:
    /// [`Self::serve`] calls it for each request, and tests call it directly.
    pub fn handle(&self, msg: Message) -> Message {
        let result: Result<Message, Refused> = match msg {
            Message::Ping(_) => Ok(Pong {}.into()),
            Message::RegisterServer(r) => {
                // A server (re)starting holds nothing yet: what it said before is void.
                self.view.lock().quota.remove(&r.server_id);
                self.server_seen(
                    ServerAddr { server_id: r.server_id, host: r.host, port: r.port },
                    |s| {
                        s.memory_budget_bytes = r.memory_budget_bytes;
                        s.free_memory_bytes = r.memory_budget_bytes;
                        s.disk_capacity_bytes = r.disk_capacity_bytes;
                    },
                );
                Ok(OkMsg {}.into())
            }
            Message::ServerHeartbeat(h) => {
                self.server_seen(
                    ServerAddr { server_id: h.server_id, host: h.host, port: h.port },
                    |s| {
                        s.memory_budget_bytes = h.memory_budget_bytes;
                        s.free_memory_bytes = h.free_memory_bytes;
                        s.free_disk_bytes = h.free_disk_bytes;
                        let no_room = h.free_disk_bytes == 0;
                        if no_room != s.no_room {
                            tracing::warn!(server = %s.addr.server_id, no_room,
                                "server's room for new partitions changed (no free disk: full or draining)");
                        }
                        s.no_room = no_room;
                        s.partitions_held = h.partitions_held;
                        s.push_bytes_per_s = h.push_bytes_per_s;
                        s.assigned_since_heartbeat = 0;
                        s.promised_since = Instant::now();
                    },
                );
                Ok(OkMsg {}.into())
            }
            Message::ServerStatus(st) => self.server_status(st),
            Message::QuotaReport(q) => {
                let heard = QuotaHeard { at: Instant::now(), at_quota: q.at_quota };
                self.view.lock().quota.insert(q.server_id, heard);
                Ok(OkMsg {}.into())
            }
            Message::RegisterApp(r) => {
                let mut v = self.view.lock();
                v.apps.insert(r.app_id.clone(), Instant::now());
                if !r.user.is_empty() {
                    v.app_users.insert(r.app_id, r.user);
                }
                Ok(OkMsg {}.into())
            }
            Message::AppHeartbeat(r) => Ok(self.app_seen(&r.app_id)),
            Message::UnregisterApp(r) => {
                let mut v = self.view.lock();
                v.note_removed(&r.app_id, None);
                v.apps.remove(&r.app_id);
                let gone: Vec<(String, u32)> =
                    v.shuffles.keys().filter(|(a, _)| *a == r.app_id).cloned().collect();
                for key in gone {
                    if let Some(shuffle) = v.shuffles.remove(&key) {
                        v.release_promises(&shuffle);
                    }
                }
                Ok(OkMsg {}.into())
            }
            Message::RegisterShuffle(r) => self.register_shuffle(r),
            Message::GetAssignment(g) => {
                match self.view.lock().shuffles.get(&(g.app_id.clone(), g.shuffle_id)) {
                    Some(r) => Ok(r.assignment.clone().into()),
                    None => Err(refuse(
                        ErrorCode::UnknownShuffle,
                        format!("shuffle {} of {} is not registered here", g.shuffle_id, g.app_id),
                    )),
                }
            }
            Message::UnregisterShuffle(u) => {
                let mut v = self.view.lock();
                v.note_removed(&u.app_id, Some(u.shuffle_id));
                if let Some(shuffle) = v.shuffles.remove(&(u.app_id, u.shuffle_id)) {
                    v.release_promises(&shuffle);
                }
                Ok(OkMsg {}.into())
            }
            Message::ShuffleSync(s) => Ok(self.apply_sync(s, false)),
            Message::SplitPartition(r) => self.split_partition(r),
            Message::GetSplits(g) => {
                match self.view.lock().shuffles.get(&(g.app_id.clone(), g.shuffle_id)) {
                    Some(r) if r.splits_pending => Err(refuse(
                        ErrorCode::Internal,
                        format!(
                            "shuffle {} of {}: this coordinator is still learning its split \
                             partitions from its peers; ask another, or again",
                            g.shuffle_id, g.app_id
                        ),
                    )),
                    Some(r) => Ok(r.splits(&g.app_id).into()),
                    None => Err(refuse(
                        ErrorCode::UnknownShuffle,
                        format!("shuffle {} of {} is not registered here", g.shuffle_id, g.app_id),
                    )),
                }
            }
            Message::Splits(s) => {
                if let Some(r) =
                    self.view.lock().shuffles.get_mut(&(s.app_id.clone(), s.shuffle_id))
                {
                    r.learn_splits(&s);
                }
                Ok(OkMsg {}.into())
            }
            other => Err(not_taken(other.msg_type())),
        };
        result.unwrap_or_else(|refused| refused)
    }

    fn server_seen(&self, addr: ServerAddr, update: impl FnOnce(&mut ServerInfo)) {
        let mut v = self.view.lock();
        let s = v.servers.entry(addr.server_id.clone()).or_insert_with(|| {
            tracing::info!(server = %addr.server_id, host = %addr.host, port = addr.port, "server joined");
            ServerInfo {
                addr: addr.clone(),
                last_seen: Instant::now(),
                memory_budget_bytes: 0,
                free_memory_bytes: 0,
                free_disk_bytes: 0,
                no_room: false,
                partitions_held: 0,
                push_bytes_per_s: 0,
                assigned_since_heartbeat: 0,
                promised_since: Instant::now(),
                disk_capacity_bytes: 0,
                status: None,
                drain_mark: None,
            }
        });
        s.addr = addr;
        s.last_seen = Instant::now();
        update(s);
    }

    fn app_seen(&self, app_id: &str) -> Message {
        self.view.lock().apps.insert(app_id.to_owned(), Instant::now());
        OkMsg {}.into()
    }

    /// Refuses a registration beyond `max_partitions_per_shuffle` or `max_maps_per_shuffle`
    /// before any work is done for it.
    fn check_shuffle_size(&self, r: &RegisterShuffle) -> Result<(), Refused> {
        let c = &self.config;
        let over = |field: &str, asked: u32, key: &str, limit: u32| {
            let text = format!(
                "shuffle {} of {} not registered: {field} {asked} exceeds this coordinator's \
                 {key} ({limit})",
                r.shuffle_id, r.app_id
            );
            tracing::warn!(app = %r.app_id, shuffle = r.shuffle_id, %text, "shuffle registration refused");
            refuse(ErrorCode::InvalidRequest, text)
        };
        let (partitions, maps) = (c.max_partitions_per_shuffle, c.max_maps_per_shuffle);
        if r.num_partitions > partitions {
            return Err(over(
                "num_partitions",
                r.num_partitions,
                "max_partitions_per_shuffle",
                partitions,
            ));
        }
        if r.num_maps > maps {
            return Err(over("num_maps", r.num_maps, "max_maps_per_shuffle", maps));
        }
        Ok(())
    }

    fn register_shuffle(&self, r: RegisterShuffle) -> Result<Message, Refused> {
        self.check_shuffle_size(&r)?;
        let key = (r.app_id.clone(), r.shuffle_id);
        let timeout = Duration::from_millis(self.config.server_timeout_ms);
        // One hold of the lock from the lookup to the insert: two registrations of one shuffle
        // at once must not both assign (the last insert would win, and the first caller's
        // writers would push to servers its readers never read).
        let mut v = self.view.lock();
        if let Some(known) = v.shuffles.get(&key) {
            if known.assignment.partitions.len() as u32 == r.num_partitions {
                // Idempotent: a retried (or concurrent) registration gets the same answer.
                return Ok(known.assignment.clone().into());
            }
        }
        // An application registers itself when it registers a shuffle, so a restarted
        // coordinator does not refuse a job whose app heartbeat has not arrived yet.
        v.apps.insert(r.app_id.clone(), Instant::now());
        if let Some(why) = v.at_quota(&r.app_id, timeout) {
            v.quota_refusals += 1;
            tracing::warn!(app = %r.app_id, shuffle = r.shuffle_id, reason = %why,
                "shuffle registration refused: at quota");
            return Err(refuse(
                ErrorCode::QuotaExceeded,
                format!("shuffle {} not registered: {why}", r.shuffle_id),
            ));
        }
        let mut live: Vec<ServerInfo> =
            v.servers.values().filter(|s| s.last_seen.elapsed() < timeout).cloned().collect();
        if live.is_empty() {
            return Err(refuse(ErrorCode::NoServers, "no live shuffle server is registered"));
        }
        // Servers with no disk left, or draining, are skipped while another has room (with
        // none, the servers refuse the pushes with a clear error).
        let takes_new = |s: &ServerInfo| !s.no_room && s.state(timeout) == ServerState::Live;
        if live.iter().any(takes_new) {
            live.retain(takes_new);
        }
        live.sort_by(|a, b| a.addr.server_id.cmp(&b.addr.server_id));
        let locs = assign(&mut live, r.num_partitions, r.replication);
        // Keep only the servers the assignment uses, and renumber.
        let mut used: Vec<usize> = locs
            .iter()
            .flat_map(|l| [l.primary, l.replica])
            .filter(|i| *i != NO_REPLICA)
            .map(|i| i as usize)
            .collect();
        used.sort_unstable();
        used.dedup();
        // Spares, for the parts of partitions that will be split: the least loaded of the others.
        let mut others: Vec<usize> = (0..live.len()).filter(|i| !used.contains(i)).collect();
        others.sort_by(|&a, &b| live[a].load_score().total_cmp(&live[b].load_score()));
        used.extend(others.into_iter().take(self.config.spare_servers as usize));
        used.sort_unstable();
        let remap = |i: u16| {
            if i == NO_REPLICA {
                NO_REPLICA
            } else {
                used.binary_search(&(i as usize)).unwrap_or(0) as u16
            }
        };
        let assignment = Assignment {
            shuffle_id: r.shuffle_id,
            servers: used.iter().map(|&i| live[i].addr.clone()).collect(),
            partitions: locs
                .iter()
                .map(|l| PartitionLoc { primary: remap(l.primary), replica: remap(l.replica) })
                .collect(),
        };
        for s in &live {
            if let Some(known) = v.servers.get_mut(&s.addr.server_id) {
                known.assigned_since_heartbeat = s.assigned_since_heartbeat;
            }
        }
        tracing::info!(app = %r.app_id, shuffle = r.shuffle_id, partitions = r.num_partitions,
            servers = assignment.servers.len(), "shuffle assigned");
        let registered = Registered::new(assignment.clone(), r.num_maps, r.replication);
        v.shuffles.insert(key, registered);
        Ok(assignment.into())
    }

    /// A new part for a partition whose last part's server answered `PushSplit`: on a server of
    /// the shuffle's assignment that holds no part of it, is live, not draining and has room
    /// (the least loaded). The answer lists the partition's parts, unchanged when someone split
    /// it already (it has more than `known_parts`) or no server can take a part.
    fn split_partition(&self, r: SplitPartition) -> Result<Message, Refused> {
        let timeout = Duration::from_millis(self.config.server_timeout_ms);
        let mut guard = self.view.lock();
        let v = &mut *guard;
        let Some(reg) = v.shuffles.get_mut(&(r.app_id.clone(), r.shuffle_id)) else {
            return Err(refuse(
                ErrorCode::UnknownShuffle,
                format!("shuffle {} of {} is not registered here", r.shuffle_id, r.app_id),
            ));
        };
        let Some(first) = reg.assignment.partitions.get(r.partition_id as usize).cloned() else {
            return Err(refuse(
                ErrorCode::InvalidRequest,
                format!(
                    "partition {} of a {}-partition shuffle",
                    r.partition_id,
                    reg.assignment.partitions.len()
                ),
            ));
        };
        let parts = reg.splits.entry(r.partition_id).or_insert_with(|| vec![first]);
        if parts.len() == r.known_parts as usize {
            let holding: Vec<usize> = parts
                .iter()
                .flat_map(|l| [l.primary, l.replica])
                .filter(|&i| i != NO_REPLICA)
                .map(|i| i as usize)
                .collect();
            let mut candidates: Vec<(usize, f64)> = reg
                .assignment
                .servers
                .iter()
                .enumerate()
                .filter(|(i, _)| !holding.contains(i))
                .filter_map(|(i, a)| {
                    let s = v.servers.get(&a.server_id)?;
                    // As the servers judge themselves: less free disk than memory is nearly
                    // full (they answer pushes with PushSplit then). 0 with room: no heartbeat
                    // yet, only a registration.
                    let room = !s.no_room
                        && (s.free_disk_bytes == 0 || s.free_disk_bytes >= s.memory_budget_bytes);
                    (room && s.state(timeout) == ServerState::Live).then(|| (i, s.load_score()))
                })
                .collect();
            candidates.sort_by(|a, b| a.1.total_cmp(&b.1));
            let want = if reg.replication >= 2 { 2 } else { 1 };
            if candidates.len() >= want {
                let primary = candidates[0].0 as u16;
                let replica = if want == 2 { candidates[1].0 as u16 } else { NO_REPLICA };
                for (i, _) in candidates.iter().take(want) {
                    if let Some(s) = v.servers.get_mut(&reg.assignment.servers[*i].server_id) {
                        s.promise_partition();
                    }
                }
                parts.push(PartitionLoc { primary, replica });
                v.splits_made += 1;
                tracing::info!(app = %r.app_id, shuffle = r.shuffle_id, partition = r.partition_id,
                    part = parts.len() - 1,
                    server = %reg.assignment.servers[primary as usize].server_id,
                    "partition split: a new part");
            } else {
                tracing::warn!(app = %r.app_id, shuffle = r.shuffle_id, partition = r.partition_id,
                    parts = parts.len(),
                    "partition split asked, but no server of the shuffle can take another part; its writers go on with the last one");
            }
        }
        let parts = parts.clone();
        if parts.len() == 1 {
            reg.splits.remove(&r.partition_id);
        }
        Ok(Splits {
            app_id: r.app_id,
            shuffle_id: r.shuffle_id,
            partitions: vec![SplitParts { partition_id: r.partition_id, parts }],
        }
        .into())
    }

    /// Takes what a peer passed on; answers with everything known here when it asks.
    fn apply_sync(&self, s: ShuffleSync, splits_pending: bool) -> Message {
        let mut v = self.view.lock();
        for app in &s.removed_apps {
            v.note_removed(app, None);
            v.apps.remove(app);
            v.shuffles.retain(|(a, _), _| a != app);
        }
        for u in &s.removed_shuffles {
            v.note_removed(&u.app_id, Some(u.shuffle_id));
            v.shuffles.remove(&(u.app_id.clone(), u.shuffle_id));
        }
        let learned = s.shuffles.len();
        for sh in s.shuffles {
            let key = (sh.app_id.clone(), sh.assignment.shuffle_id);
            if splits_pending && !v.may_learn(&key) {
                continue; // a start's snapshot, older than the removal
            }
            // Heard of through a peer: alive now, as if it had registered here.
            v.apps.entry(sh.app_id.clone()).or_insert_with(Instant::now);
            // What is known here stays: a peer's copy of the same registration is the same.
            let r = v
                .shuffles
                .entry(key)
                .or_insert_with(|| Registered::new(sh.assignment, sh.num_maps, sh.replication));
            r.splits_pending |= splits_pending;
        }
        if learned > 0 {
            tracing::debug!(shuffles = learned, "assignments learned from a peer");
        }
        if s.want_all == 0 {
            return OkMsg {}.into();
        }
        let shuffles = v
            .shuffles
            .iter()
            .map(|((app_id, _), r)| SyncedShuffle {
                app_id: app_id.clone(),
                num_maps: r.num_maps,
                replication: r.replication,
                assignment: r.assignment.clone(),
            })
            .collect();
        ShuffleSync { want_all: 0, shuffles, ..Default::default() }.into()
    }

    /// What the peers must be told of a request answered here with `reply`: an assignment
    /// made (or repeated), an application or shuffle forgotten.
    fn for_peers(request: &Message, reply: &Message) -> Option<Message> {
        let mut s = ShuffleSync::default();
        match (request, reply) {
            // A split (or the parts a writer was told): a peer merges it with its own list.
            (Message::SplitPartition(_), Message::Splits(sp)) => return Some(sp.clone().into()),
            (Message::RegisterShuffle(r), Message::Assignment(a)) => {
                s.shuffles.push(SyncedShuffle {
                    app_id: r.app_id.clone(),
                    num_maps: r.num_maps,
                    replication: r.replication,
                    assignment: a.clone(),
                })
            }
            (Message::UnregisterApp(u), Message::Ok(_)) => s.removed_apps.push(u.app_id.clone()),
            (Message::UnregisterShuffle(u), Message::Ok(_)) => s.removed_shuffles.push(u.clone()),
            _ => return None,
        }
        Some(s.into())
    }

    fn peer_pool(&self) -> &sluice_transport::Pool {
        self.peer_pool.get_or_init(|| {
            sluice_transport::Pool::new(sluice_transport::ClientConfig {
                connections_per_peer: 1,
                secret: self.config.transport.secret.clone().unwrap_or_default(),
                request_timeout_ms: self.config.peer_timeout_ms,
                connect_timeout_ms: self.config.peer_timeout_ms,
                // A peer that was down (starting, restarting) is tried again at once: an
                // assignment handed over late is one a client may already hold.
                reconnect_backoff_min_ms: 10,
                reconnect_backoff_max_ms: 100,
                tls: self.config.peer_tls.clone(),
                ..sluice_transport::ClientConfig::default()
            })
        })
    }

    /// Sends `msg` to every peer at once, each bounded by `peer_timeout_ms`; returns each
    /// peer's answer.
    async fn tell_peers(self: &Arc<Self>, msg: Message) -> Vec<PeerAnswer> {
        let mut tasks = tokio::task::JoinSet::new();
        for peer in self.config.peers.clone() {
            let (me, msg) = (self.clone(), msg.clone());
            tasks.spawn(async move {
                let reply = me.ask_peer(&peer, msg).await;
                PeerAnswer { peer, reply }
            });
        }
        let mut out = Vec::new();
        while let Some(r) = tasks.join_next().await {
            if let Ok(r) = r {
                out.push(r);
            }
        }
        out
    }

    /// Hands `sync` (what a request answered here changed) to every peer, before the answer
    /// goes out. A peer that does not take it answers without it until it restarts (a starting
    /// coordinator asks its peers for everything): a warning for each, as that is where a
    /// client can get another assignment than the one it holds.
    async fn hand_over(self: &Arc<Self>, sync: Message) {
        let what = sync.msg_type().name();
        // What only adds (an assignment, a split: taking it twice is taking it once) is sent
        // again until the peer takes it; a removal is not (sent late, it could remove a
        // registration made again since).
        let again = match &sync {
            Message::Splits(_) => true,
            Message::ShuffleSync(s) => s.removed_apps.is_empty() && s.removed_shuffles.is_empty(),
            _ => false,
        };
        for answer in self.tell_peers(sync.clone()).await {
            if let Err(error) = answer.reply {
                if again {
                    tracing::warn!(peer = %answer.peer, change = what, %error,
                        "hand-over to a peer coordinator failed; sent again until it takes it");
                    let mut unsent = self.unsent.lock();
                    let q = unsent.entry(answer.peer).or_default();
                    if q.len() >= HAND_OVER_RETRY_MAX {
                        q.pop_front();
                    }
                    q.push_back((Instant::now(), sync.clone()));
                } else {
                    tracing::warn!(peer = %answer.peer, change = what, %error,
                        "hand-over to a peer coordinator failed; it lacks this change until it \
                         restarts or the application expires there");
                }
            }
        }
    }

    /// Sends the hand-overs peers did not take again, oldest first, each peer until one fails;
    /// those older than [`HAND_OVER_RETRY_FOR`] are dropped.
    async fn resend_hand_overs(self: &Arc<Self>) {
        let peers: Vec<String> = self.unsent.lock().keys().cloned().collect();
        for peer in peers {
            loop {
                let next = {
                    let mut unsent = self.unsent.lock();
                    let Some(q) = unsent.get_mut(&peer) else { break };
                    while q.front().is_some_and(|(at, _)| at.elapsed() > HAND_OVER_RETRY_FOR) {
                        q.pop_front();
                        tracing::warn!(peer = %peer, "a hand-over the peer coordinator did not \
                            take in time is dropped; it lacks it until it restarts");
                    }
                    match q.front() {
                        Some((_, m)) => m.clone(),
                        None => {
                            unsent.remove(&peer);
                            break;
                        }
                    }
                };
                if self.ask_peer(&peer, next).await.is_err() {
                    break;
                }
                let mut unsent = self.unsent.lock();
                if let Some(q) = unsent.get_mut(&peer) {
                    q.pop_front();
                }
            }
        }
    }

    /// One request to one peer, bounded by twice `peer_timeout_ms`; `Err` says why no answer
    /// came (the caller logs it at the level it deserves).
    async fn ask_peer(self: &Arc<Self>, peer: &str, msg: Message) -> Result<Message, String> {
        let limit = Duration::from_millis(self.config.peer_timeout_ms * 2);
        let call = async {
            let addr = tokio::net::lookup_host(peer)
                .await?
                .next()
                .ok_or_else(|| std::io::Error::other("no address"))?;
            // Twice: a pooled connection to a peer that restarted since fails at once, and
            // the second try connects anew (a lost unregistration would stay lost).
            let mut tries = 0;
            loop {
                tries += 1;
                let conn = self.peer_pool().get(addr).await.map_err(std::io::Error::other);
                let reply = match conn {
                    Ok(c) => c.request(msg.clone(), sluice_transport::Body::Empty).await,
                    Err(e) if tries < 2 => {
                        tracing::debug!(peer = %peer, error = %e, "peer connection failed; once more");
                        continue;
                    }
                    Err(e) => return Err(e),
                };
                match reply {
                    Ok(r) => return Ok(r.message),
                    Err(e) if tries < 2 => {
                        tracing::debug!(peer = %peer, error = %e, "peer request failed; once more")
                    }
                    Err(e) => return Err(std::io::Error::other(e)),
                }
            }
        };
        match tokio::time::timeout(limit, call).await {
            Ok(Ok(m)) => Ok(m),
            Ok(Err(e)) => Err(format!("not reached: {e}")),
            Err(_) => Err(format!("no answer within {} ms", limit.as_millis())),
        }
    }

    /// At start: asks every peer for the assignments it knows, until one answers or a few
    /// seconds pass (they may be starting too).
    async fn learn_from_peers(self: Arc<Self>) {
        self.view.lock().removed_while_learning = Some(Removed::default());
        self.learn_from_peers_once().await;
        self.view.lock().removed_while_learning = None;
        self.learned.store(true, Ordering::Release);
    }

    /// [`Self::learn_from_peers`]: every peer is asked until it answers, for 10 rounds at most
    /// (a peer that answered, this coordinator itself among them in a list of all, does not
    /// end the asking of one slow to answer).
    async fn learn_from_peers_once(self: &Arc<Self>) {
        let mut unheard: Vec<String> = self.config.peers.clone();
        let mut heard_any = false;
        for _ in 0..10 {
            if unheard.is_empty() {
                return;
            }
            let want = Message::from(ShuffleSync { want_all: 1, ..Default::default() });
            let mut tasks = tokio::task::JoinSet::new();
            for peer in unheard.clone() {
                let (me, msg) = (self.clone(), want.clone());
                tasks.spawn(async move {
                    let reply = me.ask_peer(&peer, msg).await;
                    PeerAnswer { peer, reply }
                });
            }
            let mut answers = Vec::new();
            while let Some(r) = tasks.join_next().await {
                if let Ok(r) = r {
                    answers.push(r);
                }
            }
            for PeerAnswer { peer, reply } in answers {
                let s = match reply {
                    Ok(Message::ShuffleSync(s)) => s,
                    Ok(other) => {
                        tracing::debug!(peer = %peer, reply = other.msg_type().name(),
                            "unexpected answer to ShuffleSync from a peer");
                        continue;
                    }
                    // Peers starting at the same time are expected not to answer yet.
                    Err(error) => {
                        tracing::debug!(peer = %peer, %error, "peer coordinator not heard at start");
                        continue;
                    }
                };
                tracing::info!(peer = %peer, shuffles = s.shuffles.len(),
                    "assignments learned from a peer coordinator");
                let shuffles: Vec<(String, u32)> = s
                    .shuffles
                    .iter()
                    .map(|sh| (sh.app_id.clone(), sh.assignment.shuffle_id))
                    .collect();
                // And the parts of their split partitions; until then, `GetSplits` of those
                // shuffles is answered with a retriable error, not a list that may lack parts.
                self.apply_sync(s, true);
                self.learn_splits_from(&peer, shuffles).await;
                unheard.retain(|p| *p != peer);
                heard_any = true;
            }
            if unheard.is_empty() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        if heard_any {
            tracing::warn!(peers = ?unheard, "peer coordinators not heard at start; their \
                assignments are learned as they hand them over");
        } else {
            tracing::info!("no peer coordinator answered at start; starting with no assignments");
        }
    }

    /// Asks `peer` for the splits of `shuffles` (learned from it), again every second for those
    /// it does not answer, for [`HAND_OVER_RETRY_FOR`] at most (then a warning, and the splits
    /// made here are answered). A peer answering anything but the splits (it forgot the
    /// shuffle) leaves those made here.
    async fn learn_splits_from(self: &Arc<Self>, peer: &str, mut shuffles: Vec<(String, u32)>) {
        let started = Instant::now();
        loop {
            let mut unanswered = Vec::new();
            for (app_id, shuffle_id) in shuffles {
                let ask = GetSplits { app_id: app_id.clone(), shuffle_id };
                let retriable = |e: &sluice_proto::message::ErrorMsg| {
                    ErrorCode::from_u16(e.code).is_some_and(|c| c.is_retriable())
                };
                match self.ask_peer(peer, ask.into()).await {
                    // The peer is learning them itself: asked again.
                    Ok(Message::Error(e)) if retriable(&e) => unanswered.push((app_id, shuffle_id)),
                    Ok(reply) => {
                        if let Message::Splits(sp) = reply {
                            self.handle(sp.into());
                        }
                        self.set_splits_learned(&[(app_id, shuffle_id)]);
                    }
                    Err(error) => {
                        tracing::debug!(peer = %peer, shuffle = shuffle_id, %error,
                            "a peer coordinator did not answer for a shuffle's splits; asking again");
                        unanswered.push((app_id, shuffle_id));
                    }
                }
            }
            if unanswered.is_empty() {
                return;
            }
            if started.elapsed() > HAND_OVER_RETRY_FOR {
                tracing::warn!(peer = %peer, shuffles = unanswered.len(),
                    "splits of shuffles not learned from a peer coordinator in time: answering \
                     with those made here");
                self.set_splits_learned(&unanswered);
                return;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
            shuffles = unanswered;
        }
    }

    /// The splits of `shuffles` are learned from a peer (or will not be): `GetSplits` answers.
    fn set_splits_learned(&self, shuffles: &[(String, u32)]) {
        let mut v = self.view.lock();
        for key in shuffles {
            if let Some(r) = v.shuffles.get_mut(key) {
                r.splits_pending = false;
            }
        }
    }

    /// Forgets applications whose heartbeats stopped, with their assignments.
    pub fn expire(&self) {
        self.expire_at(Instant::now());
    }

    /// [`Self::expire`] as of `now`.
    fn expire_at(&self, now: Instant) {
        let since = |t: Instant| now.saturating_duration_since(t);
        let limit = Duration::from_millis(self.config.app_expiry_ms);
        let mut v = self.view.lock();
        let expired: Vec<String> =
            v.apps.iter().filter(|(_, t)| since(**t) > limit).map(|(a, _)| a.clone()).collect();
        for app in expired {
            tracing::info!(app = %app, "application expired");
            v.apps.remove(&app);
            v.shuffles.retain(|(a, _), _| *a != app);
        }
        // Users of applications gone (unregistered, expired, forgotten), reports gone stale.
        let View { apps, app_users, quota, .. } = &mut *v;
        app_users.retain(|a, _| apps.contains_key(a));
        let stale = Duration::from_millis(self.config.server_timeout_ms);
        quota.retain(|_, h| since(h.at) < stale);
        // Servers lost long ago are forgotten (listed as lost until then): a server's id is
        // its host and port by default, and pods that come back elsewhere would otherwise add
        // one for good each time. One that comes back registers again.
        let forget = LOST_SERVERS_FORGOTTEN_AFTER.max(stale * 10);
        v.servers.retain(|id, s| {
            let keep = since(s.last_seen) < forget;
            if !keep {
                tracing::info!(server = %id, "server lost long ago forgotten");
            }
            keep
        });
    }

    /// Serves on `listener` until `shutdown` completes.
    pub async fn serve(
        self: Arc<Self>,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send,
    ) -> std::io::Result<()> {
        let ticker = {
            let me = self.clone();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_secs(1));
                loop {
                    tick.tick().await;
                    me.expire();
                    me.resend_hand_overs().await;
                }
            })
        };
        let learner = tokio::spawn(self.clone().learn_from_peers());
        let transport = self.config.transport.clone();
        self.serving.store(true, Ordering::Release);
        let me = self.clone();
        let stats = self.stats.clone();
        let r = sluice_transport::serve(
            listener,
            Arc::new(CoordHandler(self)),
            transport,
            stats,
            shutdown,
        )
        .await;
        me.serving.store(false, Ordering::Release);
        ticker.abort();
        learner.abort();
        r
    }
}

/// One peer's answer to something sent to every peer.
struct PeerAnswer {
    /// The peer, as configured (`host:port`).
    peer: String,
    /// Its reply, or why none came (not reached, an error answer, no answer in time).
    reply: Result<Message, String>,
}

/// The reply to a request a coordinator does not take.
fn not_taken(ty: MsgType) -> Refused {
    refuse(ErrorCode::InvalidRequest, format!("a coordinator does not take {}", ty.name()))
}

struct CoordHandler(Arc<Coordinator>);

impl Handler for CoordHandler {
    type Permit = ();

    /// Refuses every body-carrying request (`Push`, `PushMerged`: meant for a server) before
    /// its body is read, so the transport drops the body through its read buffer instead of
    /// reading up to `max_frame_bytes` into a new one just to refuse it.
    fn admit(&self, conn: &ConnInfo, message: &Message, body_len: u32) -> Admission<()> {
        let ty = message.msg_type();
        if !ty.has_body() {
            return Admission::Accept(());
        }
        tracing::warn!(peer = %conn.peer, request = ty.name(), body_len,
            "request with a body refused: a coordinator takes none (a client pointed at the wrong port?)");
        Admission::Reject(not_taken(ty))
    }

    fn handle(
        &self,
        conn: &Arc<ConnInfo>,
        req: Request,
    ) -> impl Future<Output = Response> + Send + 'static {
        let me = self.0.clone();
        let mut request = req.message;
        // An application's credential proves its id, not the user it names: an authenticated
        // application's user is the one its id carries, if any (see `vouched_user`).
        if let Message::RegisterApp(r) = &mut request {
            r.user = conn.identity.vouched_user(&r.user).unwrap_or_default().to_owned();
        }
        // All the work inside the future: the transport turns a panic into an `INTERNAL` answer
        // only while polling it (a panic here, outside, would end the whole connection). So the
        // requests of one connection may be handled out of order, each in its own task; no
        // client pipelines coordinator requests that depend on each other.
        async move {
            // Only what changes assignments goes to the peers (and never what came from one).
            let keep = matches!(
                request,
                Message::RegisterShuffle(_)
                    | Message::UnregisterApp(_)
                    | Message::UnregisterShuffle(_)
                    | Message::SplitPartition(_)
            ) && !me.config.peers.is_empty();
            let kept = keep.then(|| request.clone());
            let reply = me.handle(request);
            if let Some(sync) = kept.as_ref().and_then(|r| Coordinator::for_peers(r, &reply)) {
                // Before the answer: an assignment a client holds is known to the live peers.
                me.hand_over(sync).await;
            }
            Response::msg(reply)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(id: &str, held: u32, free: u64) -> ServerInfo {
        ServerInfo {
            addr: ServerAddr { server_id: id.into(), host: "127.0.0.1".into(), port: 1 },
            last_seen: Instant::now(),
            memory_budget_bytes: 100,
            free_memory_bytes: free,
            free_disk_bytes: 1 << 40,
            no_room: false,
            partitions_held: held,
            push_bytes_per_s: 0,
            assigned_since_heartbeat: 0,
            promised_since: Instant::now(),
            disk_capacity_bytes: 0,
            status: None,
            drain_mark: None,
        }
    }

    /// A heartbeat of server `id` (memory budget 10, all free).
    fn beat(c: &Coordinator, id: &str, port: u16, free_disk_bytes: u64) {
        let h = ServerHeartbeat {
            server_id: id.into(),
            host: "h".into(),
            port,
            memory_budget_bytes: 10,
            free_memory_bytes: 10,
            free_disk_bytes,
            ..Default::default()
        };
        assert!(matches!(c.handle(h.into()), Message::Ok(_)));
    }

    #[test]
    fn spreads_evenly_and_prefers_the_idle_server() {
        let mut s = vec![server("a", 0, 100), server("b", 0, 100)];
        let locs = assign(&mut s, 10, 1);
        let on_a = locs.iter().filter(|l| l.primary == 0).count();
        assert_eq!(on_a, 5);
        let mut s = vec![server("a", 50, 10), server("b", 0, 100)];
        let locs = assign(&mut s, 10, 1);
        assert!(locs.iter().all(|l| l.primary == 1), "loaded server a should get nothing");
    }

    /// Servers with a primary partition of `shuffle` (by id), registered with `n` partitions.
    fn primaries(c: &Coordinator, app: &str, shuffle: u32, n: u32) -> Vec<String> {
        let reg = RegisterShuffle {
            app_id: app.into(),
            shuffle_id: shuffle,
            num_maps: 1,
            num_partitions: n,
            replication: 1,
        };
        let Message::Assignment(a) = c.handle(reg.into()) else { panic!("not assigned") };
        let mut ids: Vec<String> =
            a.partitions.iter().map(|l| a.servers[l.primary as usize].server_id.clone()).collect();
        ids.sort();
        ids.dedup();
        ids
    }

    #[test]
    fn an_unregistered_shuffles_partitions_stop_counting_against_its_servers() {
        // A probe registers and unregisters a wide shuffle while only s1 has joined (as the
        // tests' `wait_registered` does), then s2 and s3 join: a 4-partition shuffle must still
        // use all three (the probe's 24 partitions once made s1 look loaded until its next
        // heartbeat, and the shuffle passed it over).
        let c = Coordinator::new(CoordinatorConfig::default()).unwrap();
        beat(&c, "s1", 1, 1 << 30);
        assert_eq!(primaries(&c, "probe", 9, 24), ["s1"]);
        let forget = UnregisterShuffle { app_id: "probe".into(), shuffle_id: 9 };
        assert!(matches!(c.handle(forget.into()), Message::Ok(_)));
        beat(&c, "s2", 2, 1 << 30);
        beat(&c, "s3", 3, 1 << 30);
        assert_eq!(primaries(&c, "job", 1, 4), ["s1", "s2", "s3"]);
        // The same through UnregisterApp.
        assert_eq!(primaries(&c, "probe", 9, 60), ["s1", "s2", "s3"]);
        assert!(matches!(
            c.handle(UnregisterApp { app_id: "probe".into() }.into()),
            Message::Ok(_)
        ));
        let promised = |id: &str| c.view.lock().servers[id].assigned_since_heartbeat;
        // `job`'s four partitions are all that is promised now.
        assert_eq!(promised("s1") + promised("s2") + promised("s3"), 4);
        // A heartbeat replaces the promises before it (the server's own count says what it
        // holds): unregistering `job` afterwards takes nothing off s1's new count.
        beat(&c, "s1", 1, 1 << 30);
        assert_eq!(promised("s1"), 0);
        primaries(&c, "other", 2, 3);
        let s1_other = promised("s1");
        let others_before = promised("s2") + promised("s3");
        let forget = UnregisterShuffle { app_id: "job".into(), shuffle_id: 1 };
        assert!(matches!(c.handle(forget.into()), Message::Ok(_)));
        assert_eq!(promised("s1"), s1_other, "only `other`'s, promised after the heartbeat");
        let job_elsewhere = 4 - 2; // `job` put 2 of its 4 on s1 (the first and the fourth)
        assert_eq!(promised("s2") + promised("s3"), others_before - job_elsewhere);
    }

    #[test]
    fn replicas_go_to_another_server() {
        let mut s = vec![server("a", 0, 100), server("b", 0, 100), server("c", 0, 100)];
        for l in assign(&mut s, 9, 2) {
            assert_ne!(l.primary, l.replica);
        }
        let mut one = vec![server("a", 0, 100)];
        assert_eq!(assign(&mut one, 2, 2)[0].replica, NO_REPLICA);
    }

    fn split_ask(c: &Coordinator, partition_id: u32, known_parts: u16) -> Vec<PartitionLoc> {
        let ask = SplitPartition { app_id: "a".into(), shuffle_id: 1, partition_id, known_parts };
        match c.handle(ask.into()) {
            Message::Splits(s) => {
                assert_eq!(s.partitions.len(), 1);
                s.partitions[0].parts.clone()
            }
            m => panic!("{m:?}"),
        }
    }

    #[test]
    fn a_split_adds_one_part_on_a_server_without_one_and_repeats_are_answered_the_same() {
        let c = Coordinator::new(CoordinatorConfig::default()).unwrap();
        for (id, port) in [("s1", 1), ("s2", 2), ("s3", 3)] {
            beat(&c, id, port, 1 << 30);
        }
        // One partition: one server used, two spares listed for its parts.
        let reg = RegisterShuffle {
            app_id: "a".into(),
            shuffle_id: 1,
            num_maps: 2,
            num_partitions: 1,
            replication: 1,
        };
        let Message::Assignment(a) = c.handle(reg.into()) else { panic!() };
        assert_eq!(a.servers.len(), 3, "the used server and two spares");
        let first = a.partitions[0].clone();
        let two = split_ask(&c, 0, 1);
        assert_eq!(two.len(), 2);
        assert_eq!(two[0], first);
        assert_ne!(two[1].primary, first.primary);
        // Another writer told at the same time (it knew one part): the same two parts.
        assert_eq!(split_ask(&c, 0, 1), two);
        let three = split_ask(&c, 0, 2);
        assert_eq!(three.len(), 3);
        let mut on: Vec<u16> = three.iter().map(|l| l.primary).collect();
        on.sort_unstable();
        on.dedup();
        assert_eq!(on.len(), 3, "each part on its own server: {three:?}");
        // Every server holds a part: the parts stay as they are.
        assert_eq!(split_ask(&c, 0, 3), three);
        match c.handle(GetSplits { app_id: "a".into(), shuffle_id: 1 }.into()) {
            Message::Splits(s) => assert_eq!(s.partitions[0].parts, three),
            m => panic!("{m:?}"),
        }
        // Out of range, unknown shuffle: refused.
        let bad =
            SplitPartition { app_id: "a".into(), shuffle_id: 1, partition_id: 1, known_parts: 1 };
        assert!(
            matches!(c.handle(bad.into()), Message::Error(e) if e.code == ErrorCode::InvalidRequest.as_u16())
        );
        let unknown = GetSplits { app_id: "a".into(), shuffle_id: 9 };
        assert!(
            matches!(c.handle(unknown.into()), Message::Error(e) if e.code == ErrorCode::UnknownShuffle.as_u16())
        );
        // A peer keeps the longer list it is told, never a shorter one.
        let peer = Coordinator::new(CoordinatorConfig::default()).unwrap();
        let sync = ShuffleSync {
            want_all: 0,
            shuffles: vec![SyncedShuffle {
                app_id: "a".into(),
                num_maps: 2,
                replication: 1,
                assignment: a.clone(),
            }],
            ..Default::default()
        };
        peer.handle(sync.into());
        let told = |parts: Vec<PartitionLoc>| Splits {
            app_id: "a".into(),
            shuffle_id: 1,
            partitions: vec![SplitParts { partition_id: 0, parts }],
        };
        assert!(matches!(peer.handle(told(three.clone()).into()), Message::Ok(_)));
        peer.handle(told(two.clone()).into());
        assert_eq!(split_ask(&peer, 0, 3), three);
    }

    /// Two coordinators answered `SplitPartition` of the same part count at once and chose
    /// other servers for the new part (writers may have pushed to both): told each other's
    /// list, both list every part, alike, and each writer's list is within it.
    #[test]
    fn coordinators_that_split_a_partition_at_once_list_both_parts_alike() {
        let c1 = Coordinator::new(CoordinatorConfig::default()).unwrap();
        let c2 = Coordinator::new(CoordinatorConfig::default()).unwrap();
        for c in [&c1, &c2] {
            for (id, port) in [("s1", 1), ("s2", 2), ("s3", 3)] {
                beat(c, id, port, 1 << 30);
            }
        }
        let reg = RegisterShuffle {
            app_id: "a".into(),
            shuffle_id: 1,
            num_maps: 2,
            num_partitions: 1,
            replication: 1,
        };
        let Message::Assignment(a) = c1.handle(reg.into()) else { panic!() };
        let sync = ShuffleSync {
            want_all: 0,
            shuffles: vec![SyncedShuffle {
                app_id: "a".into(),
                num_maps: 2,
                replication: 1,
                assignment: a.clone(),
            }],
            ..Default::default()
        };
        c2.handle(sync.into());
        // c2 sees the server c1 would choose as loaded: they choose apart.
        let first = a.partitions[0].primary;
        let spares: Vec<u16> = (0..3).filter(|&i| i != first).collect();
        let busy = &a.servers[spares[0] as usize];
        c2.view.lock().servers.get_mut(&busy.server_id).unwrap().assigned_since_heartbeat = 1000;
        let (one, two) = (split_ask(&c1, 0, 1), split_ask(&c2, 0, 1));
        assert_eq!((one.len(), two.len()), (2, 2));
        assert_ne!(one[1], two[1], "the coordinators did not choose apart; the test needs them to");
        let told = |parts: Vec<PartitionLoc>| Splits {
            app_id: "a".into(),
            shuffle_id: 1,
            partitions: vec![SplitParts { partition_id: 0, parts }],
        };
        c1.handle(told(two.clone()).into());
        c2.handle(told(one.clone()).into());
        let listed = |c: &Coordinator| match c
            .handle(GetSplits { app_id: "a".into(), shuffle_id: 1 }.into())
        {
            Message::Splits(s) => s.partitions[0].parts.clone(),
            m => panic!("{m:?}"),
        };
        let (l1, l2) = (listed(&c1), listed(&c2));
        assert_eq!(l1, l2, "the coordinators list the parts apart");
        assert_eq!(l1.len(), 3);
        for part in one.iter().chain(&two) {
            assert!(l1.contains(part), "{part:?} took batches and is not listed: {l1:?}");
        }
        // A third coordinator told both, in either order, lists them alike too.
        for order in [[&one, &two], [&two, &one]] {
            let c3 = Coordinator::new(CoordinatorConfig::default()).unwrap();
            let sync = ShuffleSync {
                want_all: 0,
                shuffles: vec![SyncedShuffle {
                    app_id: "a".into(),
                    num_maps: 2,
                    replication: 1,
                    assignment: a.clone(),
                }],
                ..Default::default()
            };
            c3.handle(sync.into());
            for parts in order {
                c3.handle(told(parts.clone()).into());
            }
            assert_eq!(listed(&c3), l1);
        }
    }

    /// A coordinator learning a shuffle from a peer at start does not answer `GetSplits` with
    /// an empty list before it has asked the peer for the shuffle's splits (readers keep the
    /// answer): a retriable error meanwhile, so clients ask another coordinator, or again.
    #[test]
    fn splits_not_yet_learned_at_start_are_an_error_to_retry_not_an_empty_list() {
        let c = Coordinator::new(CoordinatorConfig::default()).unwrap();
        let a = Assignment {
            shuffle_id: 1,
            servers: vec![],
            partitions: vec![PartitionLoc { primary: 0, replica: NO_REPLICA }],
        };
        let sync = ShuffleSync {
            want_all: 0,
            shuffles: vec![SyncedShuffle {
                app_id: "a".into(),
                num_maps: 1,
                replication: 1,
                assignment: a,
            }],
            ..Default::default()
        };
        c.apply_sync(sync, true);
        let ask = || c.handle(GetSplits { app_id: "a".into(), shuffle_id: 1 }.into());
        match ask() {
            Message::Error(e) => {
                let code = ErrorCode::from_u16(e.code).unwrap();
                assert!(code.is_retriable(), "{code:?}: {}", e.message);
                assert!(e.message.contains("still learning"), "{}", e.message);
            }
            m => panic!("answered before its splits were learned: {m:?}"),
        }
        c.set_splits_learned(&[("a".into(), 1)]);
        assert!(matches!(ask(), Message::Splits(_)));
    }

    /// A shuffle unregistered while a starting coordinator learns from its peers is not
    /// brought back by a peer's snapshot taken before the removal; registered again later, it is
    /// taken as any hand-over.
    #[test]
    fn a_snapshot_older_than_a_removal_does_not_bring_the_shuffle_back() {
        let c = Coordinator::new(CoordinatorConfig::default()).unwrap();
        let synced = |id: u32| SyncedShuffle {
            app_id: "a".into(),
            num_maps: 1,
            replication: 1,
            assignment: Assignment {
                shuffle_id: id,
                servers: vec![],
                partitions: vec![PartitionLoc { primary: 0, replica: NO_REPLICA }],
            },
        };
        let sync = |ids: &[u32]| ShuffleSync {
            want_all: 0,
            shuffles: ids.iter().map(|&id| synced(id)).collect(),
            ..Default::default()
        };
        let known = |id: u32| {
            let ask = GetAssignment { app_id: "a".into(), shuffle_id: id };
            matches!(c.handle(ask.into()), Message::Assignment(_))
        };
        c.view.lock().removed_while_learning = Some(Removed::default());
        c.handle(UnregisterShuffle { app_id: "a".into(), shuffle_id: 1 }.into());
        c.apply_sync(sync(&[1, 2]), true);
        assert!(!known(1), "the removed shuffle came back with an older snapshot");
        assert!(known(2));
        // An application removed meanwhile: none of its shuffles come back.
        c.handle(UnregisterApp { app_id: "a".into() }.into());
        c.apply_sync(sync(&[2, 3]), true);
        assert!(!known(2) && !known(3));
        // Learning over: a registration handed over later is taken.
        c.view.lock().removed_while_learning = None;
        c.apply_sync(sync(&[1]), false);
        assert!(known(1));
    }

    #[test]
    fn a_full_server_gets_no_part() {
        let c = Coordinator::new(CoordinatorConfig::default()).unwrap();
        beat(&c, "s1", 1, 1 << 30);
        beat(&c, "s2", 2, 1 << 30);
        let reg = RegisterShuffle {
            app_id: "a".into(),
            shuffle_id: 1,
            num_maps: 2,
            num_partitions: 1,
            replication: 1,
        };
        let Message::Assignment(a) = c.handle(reg.into()) else { panic!() };
        let other = if a.partitions[0].primary == 0 { "s2" } else { "s1" };
        let port = if other == "s1" { 1 } else { 2 };
        beat(&c, other, port, 5); // less free disk than its memory budget (10): nearly full
        assert_eq!(split_ask(&c, 0, 1).len(), 1, "no room anywhere else: unchanged");
        beat(&c, other, port, 1 << 30);
        assert_eq!(split_ask(&c, 0, 1).len(), 2);
    }

    /// Registrations of one shuffle arriving at once (a driver retrying while its first try is
    /// still in flight): each caller must get the assignment the
    /// coordinator keeps, or writers push to servers readers never read. With sixteen servers
    /// and one partition, two registrations that both assign choose different servers.
    #[test]
    fn concurrent_registrations_of_one_shuffle_all_get_the_assignment_kept() {
        let c =
            Coordinator::new(CoordinatorConfig { spare_servers: 0, ..Default::default() }).unwrap();
        for i in 0..16u16 {
            beat(&c, &format!("s{i}"), i + 1, 1 << 30);
        }
        // A 4 MiB application id: hashing it makes every hold of the lock last milliseconds, and
        // parking_lot hands a mutex held that long to its longest waiter (eventual fairness). So
        // the callers, all queued on the lock, take it in turn: a registration that let go of
        // the lock between its lookup and its insert would let every other caller's lookup in
        // between, each would miss and assign anew, and only the last would be kept.
        let app = "a".repeat(4 << 20);
        let reg = |shuffle_id| RegisterShuffle {
            app_id: app.clone(),
            shuffle_id,
            num_maps: 1,
            num_partitions: 1,
            replication: 1,
        };
        // Not the application's first shuffle: a lookup in an empty map skips the hashing.
        assert!(matches!(c.handle(reg(0).into()), Message::Assignment(_)));
        const CALLERS: usize = 4;
        let started = std::sync::atomic::AtomicUsize::new(0);
        let answers: Vec<Message> = std::thread::scope(|scope| {
            let held = c.view.lock();
            let callers: Vec<_> = (0..CALLERS)
                .map(|_| {
                    scope.spawn(|| {
                        let r = reg(1);
                        started.fetch_add(1, Ordering::SeqCst);
                        c.handle(r.into())
                    })
                })
                .collect();
            while started.load(Ordering::SeqCst) < CALLERS {
                std::thread::sleep(Duration::from_millis(1));
            }
            // Time to reach the lock and wait on it.
            std::thread::sleep(Duration::from_millis(200));
            drop(held);
            callers.into_iter().map(|t| t.join().unwrap()).collect()
        });
        let kept = c.handle(GetAssignment { app_id: app.clone(), shuffle_id: 1 }.into());
        assert!(matches!(kept, Message::Assignment(_)), "{kept:?}");
        let differing = answers.iter().filter(|a| **a != kept).count();
        assert_eq!(differing, 0, "callers told another assignment than the one kept");
    }

    #[test]
    fn registrations_beyond_the_size_limits_are_refused() {
        let config = CoordinatorConfig {
            max_partitions_per_shuffle: 100,
            max_maps_per_shuffle: 50,
            ..Default::default()
        };
        let c = Coordinator::new(config).unwrap();
        beat(&c, "s1", 1, 1 << 30);
        let reg = |num_maps, num_partitions| RegisterShuffle {
            app_id: "a".into(),
            shuffle_id: 1,
            num_maps,
            num_partitions,
            replication: 1,
        };
        for (maps, partitions, says) in [
            (
                1,
                101,
                "num_partitions 101 exceeds this coordinator's max_partitions_per_shuffle (100)",
            ),
            (51, 1, "num_maps 51 exceeds this coordinator's max_maps_per_shuffle (50)"),
            (1, u32::MAX, "max_partitions_per_shuffle (100)"),
        ] {
            match c.handle(reg(maps, partitions).into()) {
                Message::Error(e) => {
                    assert_eq!(e.code, ErrorCode::InvalidRequest.as_u16(), "{e:?}");
                    assert!(e.message.contains(says), "{}", e.message);
                }
                m => panic!("not refused: {m:?}"),
            }
        }
        assert!(c.shuffle("a", 1).is_none());
        // At the limits: registered.
        assert!(matches!(c.handle(reg(50, 100).into()), Message::Assignment(_)));
        for bad in [
            CoordinatorConfig { max_partitions_per_shuffle: 0, ..Default::default() },
            CoordinatorConfig { max_maps_per_shuffle: 0, ..Default::default() },
        ] {
            let e = Coordinator::new(bad).err().expect("refused");
            assert!(e.contains("max_partitions_per_shuffle and max_maps_per_shuffle"), "{e}");
        }
    }

    /// A server may report any `partitions_held`: u32::MAX must make it the most loaded, not
    /// overflow (a panic in debug builds, a wrap to "idle" in release ones).
    #[test]
    fn a_server_holding_u32_max_partitions_is_the_most_loaded() {
        let c =
            Coordinator::new(CoordinatorConfig { spare_servers: 0, ..Default::default() }).unwrap();
        let full = ServerHeartbeat {
            server_id: "full".into(),
            host: "h".into(),
            port: 1,
            memory_budget_bytes: 10,
            free_memory_bytes: 10,
            free_disk_bytes: 1 << 30,
            partitions_held: u32::MAX,
            ..Default::default()
        };
        assert!(matches!(c.handle(full.into()), Message::Ok(_)));
        beat(&c, "idle", 2, 1 << 30);
        let reg = RegisterShuffle {
            app_id: "a".into(),
            shuffle_id: 1,
            num_maps: 1,
            num_partitions: 8,
            replication: 2,
        };
        let Message::Assignment(a) = c.handle(reg.into()) else { panic!() };
        let primaries: Vec<&str> =
            a.partitions.iter().map(|l| a.servers[l.primary as usize].server_id.as_str()).collect();
        assert!(primaries.iter().all(|s| *s == "idle"), "{primaries:?}");
        // The count of partitions promised since a heartbeat saturates too.
        let mut s = vec![server("a", u32::MAX, 100)];
        s[0].assigned_since_heartbeat = u32::MAX - 1;
        assign(&mut s, 3, 1);
        assert_eq!(s[0].assigned_since_heartbeat, u32::MAX);
        assert!(s[0].load_score() > server("b", 0, 100).load_score());
    }

    fn conn_info() -> Arc<ConnInfo> {
        Arc::new(ConnInfo {
            id: 1,
            peer: "127.0.0.1:1".parse().unwrap(),
            local: None,
            app_id: None,
            identity: sluice_transport::PeerIdentity::Anyone,
            max_frame_bytes: 1 << 20,
        })
    }

    #[test]
    fn a_server_lost_long_ago_is_forgotten() {
        let c = Coordinator::new(CoordinatorConfig::default()).unwrap();
        beat(&c, "s1", 1, 1 << 30);
        beat(&c, "s2", 2, 1 << 30);
        // Two hours on, s2 having beaten meanwhile.
        let later = Instant::now() + Duration::from_secs(7200);
        c.view.lock().servers.get_mut("s2").unwrap().last_seen = later;
        c.expire_at(later);
        let v = c.view.lock();
        assert!(!v.servers.contains_key("s1"), "a server lost two hours ago is still listed");
        assert!(v.servers.contains_key("s2"));
    }

    #[test]
    fn an_authenticated_applications_user_is_the_one_its_id_carries() {
        let c = Coordinator::new(CoordinatorConfig::default()).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let as_app = |app: &str| {
            let mut info = (*conn_info()).clone();
            info.identity = sluice_transport::PeerIdentity::App(app.into());
            Arc::new(info)
        };
        // An application's credential proves its id only: the user it names is not taken.
        let reg = RegisterApp { app_id: "m-1".into(), user: "etl".into() };
        rt.block_on(CoordHandler(c.clone()).handle(&as_app("m-1"), request(reg)));
        assert_eq!(c.view.lock().app_users.get("m-1"), None);
        // Its id carries its user (`<user>/<rest>`): that one, named or not; another, never.
        let reg = RegisterApp { app_id: "etl/run-7".into(), user: String::new() };
        rt.block_on(CoordHandler(c.clone()).handle(&as_app("etl/run-7"), request(reg)));
        assert_eq!(c.view.lock().app_users.get("etl/run-7").map(String::as_str), Some("etl"));
        let reg = RegisterApp { app_id: "mallory/m-2".into(), user: "etl".into() };
        rt.block_on(CoordHandler(c.clone()).handle(&as_app("mallory/m-2"), request(reg)));
        assert_eq!(c.view.lock().app_users.get("mallory/m-2"), None);
        // With authentication off (or from the cluster), as before.
        let reg = RegisterApp { app_id: "e-1".into(), user: "etl".into() };
        rt.block_on(CoordHandler(c.clone()).handle(&conn_info(), request(reg)));
        assert_eq!(c.view.lock().app_users.get("e-1").map(String::as_str), Some("etl"));
    }

    fn request(message: impl Into<Message>) -> Request {
        Request { request_id: 1, message: message.into(), body: Default::default(), permit: () }
    }

    /// The transport catches a handler's panic only while polling the future `handle` returns:
    /// the work must be inside it, not done on the call.
    #[test]
    fn the_handler_does_its_work_inside_the_future() {
        let c = Coordinator::new(CoordinatorConfig::default()).unwrap();
        beat(&c, "s1", 1, 1 << 30);
        let reg = RegisterShuffle {
            app_id: "a".into(),
            shuffle_id: 1,
            num_maps: 1,
            num_partitions: 2,
            replication: 1,
        };
        let future = CoordHandler(c.clone()).handle(&conn_info(), request(reg));
        assert!(c.shuffle("a", 1).is_none(), "registered before the future was polled");
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let response = rt.block_on(future);
        assert!(matches!(response.message, Message::Assignment(_)), "{:?}", response.message);
        assert!(c.shuffle("a", 1).is_some());
    }

    /// Counts the WARN events whose message contains `needle` (a subscriber of its own: the
    /// crate has no `tracing-subscriber`).
    struct WarnCounter {
        needle: &'static str,
        hits: Arc<std::sync::atomic::AtomicUsize>,
    }

    impl tracing::Subscriber for WarnCounter {
        fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
            tracing::span::Id::from_u64(1)
        }
        fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
        fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
        fn event(&self, event: &tracing::Event<'_>) {
            struct Text(String);
            impl tracing::field::Visit for Text {
                fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
                    if f.name() == "message" {
                        self.0 = format!("{v:?}");
                    }
                }
            }
            let mut text = Text(String::new());
            event.record(&mut text);
            if *event.metadata().level() == tracing::Level::WARN && text.0.contains(self.needle) {
                self.hits.fetch_add(1, Ordering::SeqCst);
            }
        }
        fn enter(&self, _: &tracing::span::Id) {}
        fn exit(&self, _: &tracing::span::Id) {}
    }

    /// A peer that cannot be reached when an assignment is handed over: the assignment is
    /// still answered, and the failure is a warning (the peer will answer without it).
    #[test]
    fn a_failed_hand_over_is_a_warning() {
        // A port nothing listens on: the peer refuses connections.
        let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let config = CoordinatorConfig {
            peers: vec![dead.to_string()],
            peer_timeout_ms: 500,
            ..Default::default()
        };
        let c = Coordinator::new(config).unwrap();
        beat(&c, "s1", 1, 1 << 30);
        let reg = RegisterShuffle {
            app_id: "a".into(),
            shuffle_id: 1,
            num_maps: 1,
            num_partitions: 2,
            replication: 1,
        };
        let hits = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let warn =
            WarnCounter { needle: "hand-over to a peer coordinator failed", hits: hits.clone() };
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let response = tracing::subscriber::with_default(warn, || {
            rt.block_on(CoordHandler(c.clone()).handle(&conn_info(), request(reg)))
        });
        assert!(matches!(response.message, Message::Assignment(_)), "{:?}", response.message);
        assert_eq!(hits.load(Ordering::SeqCst), 1, "one warning for the one peer");
    }

    #[test]
    fn register_shuffle_needs_servers_and_is_idempotent() {
        let c = Coordinator::new(CoordinatorConfig::default()).unwrap();
        let reg = RegisterShuffle {
            app_id: "a".into(),
            shuffle_id: 1,
            num_maps: 2,
            num_partitions: 4,
            replication: 1,
        };
        match c.handle(reg.clone().into()) {
            Message::Error(e) => assert_eq!(e.code, ErrorCode::NoServers.as_u16()),
            m => panic!("{m:?}"),
        }
        for (id, port) in [("s1", 1), ("s2", 2)] {
            beat(&c, id, port, 1 << 30);
        }
        let a1 = c.handle(reg.clone().into());
        let a2 = c.handle(reg.into());
        assert_eq!(a1, a2);
        let Message::Assignment(a) = a1 else { panic!() };
        assert_eq!(a.servers.len(), 2);
        assert_eq!(a.partitions.len(), 4);
    }

    #[test]
    fn a_server_with_a_full_disk_gets_no_partitions_while_another_has_room() {
        let c = Coordinator::new(CoordinatorConfig::default()).unwrap();
        let beat = |id, port, free_disk_bytes| beat(&c, id, port, free_disk_bytes);
        let servers_of = |shuffle_id| {
            let reg = RegisterShuffle {
                app_id: "a".into(),
                shuffle_id,
                num_maps: 1,
                num_partitions: 8,
                replication: 1,
            };
            let Message::Assignment(a) = c.handle(reg.into()) else { panic!() };
            let mut v: Vec<String> = a.servers.iter().map(|s| s.server_id.clone()).collect();
            v.sort();
            v
        };
        beat("full", 1, 0);
        beat("roomy", 2, 1 << 30);
        assert_eq!(servers_of(1), ["roomy"]);
        // Space freed: back in the rotation (both heartbeat, so neither has partitions promised).
        beat("full", 1, 1 << 30);
        beat("roomy", 2, 1 << 30);
        assert_eq!(servers_of(2), ["full", "roomy"]);
        // All full: the assignment still goes out (the servers refuse pushes with a clear error).
        beat("full", 1, 0);
        beat("roomy", 2, 0);
        assert_eq!(servers_of(3), ["full", "roomy"]);
    }

    /// `c`'s answer to a `ServerStatus` of server `id` (draining or not).
    fn status(c: &Coordinator, id: &str, draining: bool) -> u8 {
        let st = ServerStatus {
            server_id: id.into(),
            draining: draining.into(),
            shuffles_held: 0,
            disks: Vec::new(),
        };
        match c.handle(st.into()) {
            Message::DrainOrder(o) => o.order,
            m => panic!("{m:?}"),
        }
    }

    #[test]
    fn a_drain_takes_effect_here_at_once_and_reaches_the_server_in_its_status_answer() {
        let c = Coordinator::new(CoordinatorConfig::default()).unwrap();
        beat(&c, "s1", 1, 1 << 30);
        beat(&c, "s2", 2, 1 << 30);
        let state = |id: &str| {
            c.servers_report().into_iter().find(|s| s.addr.server_id == id).unwrap().state
        };
        assert!(c.drain_server("s1") && !c.drain_server("nope"));
        assert_eq!(state("s1"), ServerState::Draining);
        let reg = RegisterShuffle {
            app_id: "a".into(),
            shuffle_id: 1,
            num_maps: 3,
            num_partitions: 4,
            replication: 1,
        };
        let Message::Assignment(a) = c.handle(reg.into()) else { panic!() };
        assert_eq!(a.servers.iter().map(|s| s.server_id.as_str()).collect::<Vec<_>>(), ["s2"]);
        // The order is repeated until the server reports it carried out, then the mark goes.
        assert_eq!(status(&c, "s1", false), DRAIN_ORDER_START);
        assert_eq!(status(&c, "s1", false), DRAIN_ORDER_START);
        assert_eq!(status(&c, "s1", true), DRAIN_ORDER_NONE);
        assert_eq!(state("s1"), ServerState::Draining, "its own report keeps it draining");
        assert_eq!(status(&c, "s2", false), DRAIN_ORDER_NONE);
        // Undrain: live here at once, the order goes out until the server has stopped draining.
        assert!(c.undrain_server("s1"));
        assert_eq!(state("s1"), ServerState::Live);
        assert_eq!(status(&c, "s1", true), DRAIN_ORDER_STOP);
        assert_eq!(status(&c, "s1", false), DRAIN_ORDER_NONE);
        assert_eq!(c.servers_report()[0].drain_pending, None);
        // The shuffle's report names its maps and placement.
        let sh = c.shuffle("a", 1).unwrap();
        assert_eq!((sh.maps, sh.partitions, sh.placement.len()), (3, 4, 4));
        assert!(sh.placement.iter().all(|p| p.primary == "s2" && p.replica.is_none()));
    }

    #[test]
    fn an_operator_forgets_a_stuck_application() {
        let c = Coordinator::new(CoordinatorConfig::default()).unwrap();
        beat(&c, "s1", 1, 1 << 30);
        let reg = RegisterShuffle {
            app_id: "stuck".into(),
            shuffle_id: 7,
            num_maps: 1,
            num_partitions: 2,
            replication: 1,
        };
        assert!(matches!(c.handle(reg.into()), Message::Assignment(_)));
        assert_eq!(c.apps_report()[0].shuffles, [7]);
        assert_eq!(c.shuffles_of("stuck").unwrap().len(), 1);
        assert!(c.shuffles_of("other").is_none());
        assert!(c.unregister_app("stuck"));
        assert!(!c.unregister_app("stuck"));
        assert!(c.apps_report().is_empty() && c.shuffle("stuck", 7).is_none());
    }

    fn quota_report(c: &Coordinator, server: &str, at_quota: Vec<AtQuota>) {
        let q = QuotaReport { server_id: server.into(), at_quota };
        assert!(matches!(c.handle(q.into()), Message::Ok(_)));
    }

    fn at(holder: u8, name: &str, quota: &str) -> AtQuota {
        AtQuota {
            holder,
            name: name.into(),
            quota: quota.into(),
            limit_bytes: 2 << 20,
            held_bytes: 2 << 20,
        }
    }

    fn register(c: &Coordinator, app: &str, shuffle_id: u32) -> Message {
        let reg = RegisterShuffle {
            app_id: app.into(),
            shuffle_id,
            num_maps: 2,
            num_partitions: 4,
            replication: 1,
        };
        c.handle(reg.into())
    }

    fn refused_at_quota(m: &Message) -> Option<String> {
        match m {
            Message::Error(e) if e.code == ErrorCode::QuotaExceeded.as_u16() => {
                Some(e.message.clone())
            }
            _ => None,
        }
    }

    #[test]
    fn an_app_or_user_at_quota_on_a_server_gets_no_new_shuffle_until_the_server_stops_saying_so() {
        let c = Coordinator::new(CoordinatorConfig::default()).unwrap();
        beat(&c, "s1", 1, 1 << 30);
        beat(&c, "s2", 2, 1 << 30);
        for (app, user) in [("hog", "alice"), ("sibling", "alice"), ("other", "bob")] {
            let r = RegisterApp { app_id: app.into(), user: user.into() };
            assert!(matches!(c.handle(r.into()), Message::Ok(_)));
        }
        assert!(matches!(register(&c, "hog", 0), Message::Assignment(_)));
        quota_report(&c, "s1", Vec::new());
        quota_report(&c, "s2", vec![at(QUOTA_HOLDER_APP, "hog", "disk_bytes")]);
        let m = register(&c, "hog", 1);
        let why = refused_at_quota(&m).unwrap_or_else(|| panic!("not refused: {m:?}"));
        assert!(
            why.contains("application hog is at its quota app.disk_bytes on server s2"),
            "{why}"
        );
        assert!(why.contains("limit 2097152 bytes"), "{why}");
        // A retry of a shuffle registered before is answered as before; others are not held back.
        assert!(matches!(register(&c, "hog", 0), Message::Assignment(_)));
        assert!(matches!(register(&c, "sibling", 1), Message::Assignment(_)));
        assert!(matches!(register(&c, "other", 1), Message::Assignment(_)));
        assert!(c.metrics().contains("sluice_coordinator_quota_refusals_total 1\n"));
        assert!(c.metrics().contains("sluice_coordinator_at_quota{holder=\"app\"} 1\n"));
        // The server stops saying it: registrations go through again.
        quota_report(&c, "s2", Vec::new());
        assert!(matches!(register(&c, "hog", 1), Message::Assignment(_)));
        // A user at quota holds back every application of that user, named in the message.
        quota_report(&c, "s1", vec![at(QUOTA_HOLDER_USER, "alice", "buffered_bytes")]);
        let why = refused_at_quota(&register(&c, "sibling", 2)).expect("sibling refused");
        assert!(
            why.contains(
                "user alice (application sibling) is at its quota user.buffered_bytes on server s1"
            ),
            "{why}"
        );
        assert!(refused_at_quota(&register(&c, "hog", 2)).is_some());
        assert!(matches!(register(&c, "other", 2), Message::Assignment(_)));
        // A restarted server's registration voids what it said before.
        let r = RegisterServer {
            server_id: "s1".into(),
            host: "h".into(),
            port: 1,
            memory_budget_bytes: 10,
            disk_capacity_bytes: 1 << 30,
        };
        assert!(matches!(c.handle(r.into()), Message::Ok(_)));
        assert!(matches!(register(&c, "sibling", 2), Message::Assignment(_)));
        assert!(c.metrics().contains("sluice_coordinator_quota_refusals_total 3\n"));
    }

    #[test]
    fn a_quota_report_of_a_lost_server_holds_nothing_back() {
        let config = CoordinatorConfig { server_timeout_ms: 200, ..Default::default() };
        let c = Coordinator::new(config).unwrap();
        beat(&c, "s1", 1, 1 << 30);
        beat(&c, "s2", 2, 1 << 30);
        quota_report(&c, "s1", vec![at(QUOTA_HOLDER_APP, "hog", "disk_bytes")]);
        assert!(refused_at_quota(&register(&c, "hog", 0)).is_some());
        // s1 dies (no heartbeat past the timeout) while s2 goes on.
        std::thread::sleep(Duration::from_millis(250));
        beat(&c, "s2", 2, 1 << 30);
        assert!(matches!(register(&c, "hog", 0), Message::Assignment(_)));
        c.expire();
        assert!(c.view.lock().quota.is_empty(), "a stale report is dropped");
    }
}
