//! Every v1 message: its fields and its fixed type id (see `docs/protocol.md`).

use bytes::BytesMut;

use crate::error::{ErrorCode, ProtoError};
use crate::wire::{wire_struct, Reader, Wire};

/// Handshake magic, "SLCE".
pub const MAGIC: u32 = 0x534C_4345;
/// The protocol version this crate speaks.
pub const PROTOCOL_VERSION: u16 = 1;
/// Feature bit: batches carry CRC32C checksums (always set by v1 peers).
pub const FEATURE_CRC32C: u64 = 1;
/// Feature bit: host-local reads. A client sets it when it can read chunks from a server's files
/// itself (`FetchChunkLocal`); a server answers it set when it offers that to this peer (on its
/// host, `host_local_reads` on).
pub const FEATURE_HOST_LOCAL_READS: u64 = 2;
/// `PartitionLoc::replica` value meaning "no replica".
pub const NO_REPLICA: u16 = 0xFFFF;
/// [`DiskReport::state`]: the directory takes new data.
pub const DISK_IN_SERVICE: u8 = 0;
/// [`DiskReport::state`]: its file system is full; it serves what it holds, takes nothing new.
pub const DISK_FULL: u8 = 1;
/// [`DiskReport::state`]: out of service after an I/O error, until the server restarts.
pub const DISK_FAILED: u8 = 2;
/// [`DrainOrder::order`]: nothing to change.
pub const DRAIN_ORDER_NONE: u8 = 0;
/// [`DrainOrder::order`]: start draining (take no new partitions).
pub const DRAIN_ORDER_START: u8 = 1;
/// [`DrainOrder::order`]: stop draining (take new partitions again).
pub const DRAIN_ORDER_STOP: u8 = 2;
/// [`AtQuota::holder`]: an application.
pub const QUOTA_HOLDER_APP: u8 = 0;
/// [`AtQuota::holder`]: a user (all of the user's applications together).
pub const QUOTA_HOLDER_USER: u8 = 1;

wire_struct! {
    /// First frame of every connection, client → server.
    pub struct Handshake {
        /// [`MAGIC`]; anything else is refused as `UNSUPPORTED_VERSION`.
        pub magic: u32,
        /// The protocol version the client speaks ([`PROTOCOL_VERSION`]).
        pub version: u16,
        /// Feature bits the client supports ([`FEATURE_CRC32C`]); unknown bits are ignored.
        pub features: u64,
        /// The client's proposed `max_frame_bytes`.
        pub max_frame_bytes: u32,
        /// Application the connection works for; empty for the cluster's own peers (servers,
        /// coordinators, operators' tools).
        pub app_id: String,
        /// Random text the client chose for this connection; mixed into the credential proof
        /// ([`AuthProof`]) when the responder asks for one. May be empty.
        pub client_nonce: String,
    }
}
wire_struct! {
    /// The responder's answer to a [`Handshake`] when authentication is on: prove you hold the
    /// credential of the handshake's `app_id` (of the cluster when it is empty).
    pub struct AuthChallenge {
        /// Fresh random text, never sent twice: a recorded proof is useless on another
        /// connection.
        pub server_nonce: String,
    }
}
wire_struct! {
    /// The client's answer to an [`AuthChallenge`]; answered by `HandshakeOk` or `AUTH_FAILED`.
    pub struct AuthProof {
        /// Lower-case hex HMAC-SHA256 keyed with the credential over the app id and both
        /// nonces (`docs/security.md`).
        pub proof: String,
    }
}
wire_struct! {
    /// Answer to [`Handshake`]: the negotiated version, features and frame limit.
    pub struct HandshakeOk {
        /// The version both sides speak from now on.
        pub version: u16,
        /// The intersection of both sides' feature bits.
        pub features: u64,
        /// The largest frame either side may send on this connection.
        pub max_frame_bytes: u32,
    }
}
wire_struct! {
    /// A failed request (or a fatal connection error).
    pub struct ErrorMsg {
        /// An [`ErrorCode`] number.
        pub code: u16,
        /// 1 when the code is retriable, else 0 (copied from the code's table; other values
        /// are malformed).
        pub retriable: u8,
        /// Human-readable detail for logs; not for parsing.
        pub message: String,
    }
}
wire_struct! { /// Liveness probe.
pub struct Ping {} }
wire_struct! { /// Answer to [`Ping`].
pub struct Pong {} }
wire_struct! { /// Success with no result fields.
pub struct OkMsg {} }
wire_struct! {
    /// A server announcing itself to a coordinator.
    pub struct RegisterServer {
        /// The server's stable name, unique in the cluster.
        pub server_id: String,
        /// Host clients reach the server at.
        pub host: String,
        /// Port clients reach the server at.
        pub port: u16,
        /// Memory the server may hold pushed data in.
        pub memory_budget_bytes: u64,
        /// Total size of the server's data directories.
        pub disk_capacity_bytes: u64,
    }
}
wire_struct! {
    /// A server's periodic state report; also registers an unknown server.
    pub struct ServerHeartbeat {
        /// The server's stable name, unique in the cluster.
        pub server_id: String,
        /// Host clients reach the server at.
        pub host: String,
        /// Port clients reach the server at.
        pub port: u16,
        /// Memory the server may hold pushed data in.
        pub memory_budget_bytes: u64,
        /// Part of the memory budget not held by pushed data.
        pub free_memory_bytes: u64,
        /// Free disk above the server's reserve; 0 while it is full or draining, which keeps
        /// new partitions away from it.
        pub free_disk_bytes: u64,
        /// Partitions the server holds data for.
        pub partitions_held: u32,
        /// Bytes pushed to the server per second since its previous heartbeat.
        pub push_bytes_per_s: u64,
        /// Connections open on the server.
        pub active_connections: u32,
    }
}
wire_struct! {
    /// One data directory of a server, as [`ServerStatus`] reports it.
    pub struct DiskReport {
        /// The directory's path on the server.
        pub path: String,
        /// Free bytes on its file system.
        pub free_bytes: u64,
        /// Total bytes of its file system.
        pub capacity_bytes: u64,
        /// [`DISK_IN_SERVICE`], [`DISK_FULL`] or [`DISK_FAILED`]; other values are malformed.
        pub state: u8,
    }
}
wire_struct! {
    /// What a server reports besides its load, after each heartbeat: whether it drains, what it
    /// holds, its disks. Answered by [`DrainOrder`] (a coordinator that predates it answers
    /// `UNKNOWN_MESSAGE_TYPE`, and the server stops sending it there until a heartbeat fails).
    pub struct ServerStatus {
        /// The server's stable name, as in its heartbeat.
        pub server_id: String,
        /// 1 while it takes no new partitions, else 0 (other values are malformed).
        pub draining: u8,
        /// Shuffles it holds, of every application.
        pub shuffles_held: u32,
        /// Its data directories.
        pub disks: Vec<DiskReport>,
    }
}
wire_struct! {
    /// A coordinator's answer to [`ServerStatus`]: what an operator asked of the server.
    pub struct DrainOrder {
        /// [`DRAIN_ORDER_NONE`], [`DRAIN_ORDER_START`] or [`DRAIN_ORDER_STOP`]; other values are
        /// malformed.
        pub order: u8,
    }
}
wire_struct! {
    /// One application or user at one of a server's quotas, as [`QuotaReport`] lists it.
    pub struct AtQuota {
        /// [`QUOTA_HOLDER_APP`] or [`QUOTA_HOLDER_USER`]; other values are malformed.
        pub holder: u8,
        /// The application's id or the user's name.
        pub name: String,
        /// The quota's kind: `buffered_bytes`, `disk_bytes` or `object_store_bytes` (with the
        /// holder, `app.disk_bytes`, …).
        pub quota: String,
        /// The quota's limit on that server.
        pub limit_bytes: u64,
        /// What the holder holds there now (below the limit when a push was refused because
        /// it would have passed it).
        pub held_bytes: u64,
    }
}
wire_struct! {
    /// Who is at quota on a server, after each heartbeat of a server that has quotas: every
    /// application and user whose usage reached a limit, or a push of which was refused for
    /// one recently (docs/operations.md#quotas). Answered `Ok`. The list replaces the server's
    /// previous one; a coordinator refuses new shuffles of those applications (and of those
    /// users' applications) with `QUOTA_EXCEEDED`.
    pub struct QuotaReport {
        /// The server's stable name, as in its heartbeat.
        pub server_id: String,
        /// Every application and user at a quota there (empty: none).
        pub at_quota: Vec<AtQuota>,
    }
}
wire_struct! {
    /// An application starting.
    pub struct RegisterApp {
        /// The application's id, the namespace of its shuffles.
        pub app_id: String,
        /// The user the application runs as (Spark's `sparkUser`), whose quotas it counts
        /// against on servers; empty: none (only the application's own quotas apply).
        pub user: String,
    }
}
wire_struct! {
    /// An application is still alive; one that stops sending these expires with its data.
    pub struct AppHeartbeat {
        /// The application's id.
        pub app_id: String,
    }
}
wire_struct! {
    /// An application ended: delete its data.
    pub struct UnregisterApp {
        /// The application's id.
        pub app_id: String,
    }
}
wire_struct! {
    /// Register a shuffle: with a coordinator, returns an [`Assignment`]; with a server, prepares it.
    pub struct RegisterShuffle {
        /// The application the shuffle belongs to.
        pub app_id: String,
        /// The shuffle's id, unique within the application.
        pub shuffle_id: u32,
        /// Map tasks that will write (map ids `0..num_maps`).
        pub num_maps: u32,
        /// Partitions the maps write to; at least 1.
        pub num_partitions: u32,
        /// Copies of each partition: 1, or 2 for a replica on another server.
        pub replication: u8,
    }
}
wire_struct! {
    /// A server's address inside an [`Assignment`].
    pub struct ServerAddr {
        /// The server's stable name.
        pub server_id: String,
        /// Host to connect to.
        pub host: String,
        /// Port to connect to.
        pub port: u16,
    }
}
wire_struct! {
    /// Where one partition lives: indexes into `Assignment::servers`.
    pub struct PartitionLoc {
        /// The server that holds the partition.
        pub primary: u16,
        /// The server that holds its second copy, or [`NO_REPLICA`].
        pub replica: u16,
    }
}
wire_struct! {
    /// Partition → server map of one shuffle, in partition order.
    pub struct Assignment {
        /// The shuffle this assignment is for.
        pub shuffle_id: u32,
        /// The servers the partitions are spread over.
        pub servers: Vec<ServerAddr>,
        /// One entry per partition, in partition order.
        pub partitions: Vec<PartitionLoc>,
    }
}
wire_struct! {
    /// A registered shuffle as coordinators pass it to each other (in [`ShuffleSync`]).
    pub struct SyncedShuffle {
        /// The application the shuffle belongs to.
        pub app_id: String,
        /// Map tasks of the shuffle.
        pub num_maps: u32,
        /// Copies of each partition: 1 or 2.
        pub replication: u8,
        /// Where its partitions live.
        pub assignment: Assignment,
    }
}
wire_struct! {
    /// Coordinator to coordinator: shuffles one of them assigned and applications and shuffles
    /// it forgot, so that any coordinator answers for every assignment. With `want_all` set the
    /// answer is a `ShuffleSync` of everything the receiver knows (a starting coordinator asks
    /// its peers); otherwise `Ok`.
    pub struct ShuffleSync {
        /// 1: answer with every shuffle known; 0: answer `Ok` (other values are malformed).
        pub want_all: u8,
        /// Shuffles assigned (or known, in an answer).
        pub shuffles: Vec<SyncedShuffle>,
        /// Applications unregistered.
        pub removed_apps: Vec<String>,
        /// Shuffles unregistered.
        pub removed_shuffles: Vec<UnregisterShuffle>,
    }
}
wire_struct! {
    /// Ask a coordinator for a registered shuffle's assignment.
    pub struct GetAssignment {
        /// The application the shuffle belongs to.
        pub app_id: String,
        /// The shuffle asked about.
        pub shuffle_id: u32,
    }
}
wire_struct! {
    /// Client → coordinator: a server answered a push of this partition with [`PushSplit`];
    /// give the partition a new part on another server of the shuffle. Answered by [`Splits`]
    /// with the partition's parts (unchanged when another writer split it already, or when no
    /// server of the shuffle can take another part).
    pub struct SplitPartition {
        /// The application the shuffle belongs to.
        pub app_id: String,
        /// The shuffle.
        pub shuffle_id: u32,
        /// The partition to split.
        pub partition_id: u32,
        /// How many parts the sender knows of (≥ 1): only its last one is split.
        pub known_parts: u16,
    }
}
wire_struct! {
    /// Ask a coordinator for the parts of a shuffle's split partitions; answered by [`Splits`].
    pub struct GetSplits {
        /// The application the shuffle belongs to.
        pub app_id: String,
        /// The shuffle asked about.
        pub shuffle_id: u32,
    }
}
wire_struct! {
    /// The parts of one partition, in order; part 0 is the assignment's own entry.
    pub struct SplitParts {
        /// The partition.
        pub partition_id: u32,
        /// Its parts (≥ 1; an empty list is malformed), each a primary and an optional replica
        /// indexing the shuffle's assignment's `servers`.
        pub parts: Vec<PartitionLoc>,
    }
}
wire_struct! {
    /// Parts of split partitions. The answer to [`GetSplits`] (every partition with more than
    /// one part) and to [`SplitPartition`] (that partition, whatever its number of parts);
    /// coordinator → peer, a split made (answered `Ok`).
    pub struct Splits {
        /// The application the shuffle belongs to.
        pub app_id: String,
        /// The shuffle.
        pub shuffle_id: u32,
        /// The partitions, each with its parts.
        pub partitions: Vec<SplitParts>,
    }
}
wire_struct! {
    /// The answer to a push that was stored when some of its partitions passed the server's
    /// split threshold (or its disks are nearly full): their next batches go to their next part
    /// ([`SplitPartition`]).
    pub struct PushSplit {
        /// The partitions to move on from this server.
        pub partitions: Vec<u32>,
    }
}
wire_struct! {
    /// Flush and seal a shuffle on a server; answered by [`CommitResult`].
    pub struct CommitShuffle {
        /// The application the shuffle belongs to.
        pub app_id: String,
        /// The shuffle to commit.
        pub shuffle_id: u32,
    }
}
wire_struct! {
    /// Bytes stored for one partition.
    pub struct PartitionSize {
        /// The partition.
        pub partition: u32,
        /// Bytes stored for it, batch headers included.
        pub bytes: u64,
    }
}
wire_struct! {
    /// Sizes of the partitions a server holds for a committed shuffle.
    pub struct CommitResult {
        /// The committed shuffle.
        pub shuffle_id: u32,
        /// Each partition this server holds data for.
        pub partitions: Vec<PartitionSize>,
    }
}
wire_struct! {
    /// Delete a shuffle's data.
    pub struct UnregisterShuffle {
        /// The application the shuffle belongs to.
        pub app_id: String,
        /// The shuffle to delete.
        pub shuffle_id: u32,
    }
}
wire_struct! {
    /// One partition's batches; the body holds whole batches.
    pub struct Push {
        /// The application the shuffle belongs to.
        pub app_id: String,
        /// The shuffle pushed to.
        pub shuffle_id: u32,
        /// The partition every batch of the body belongs to.
        pub partition_id: u32,
    }
}
wire_struct! {
    /// The byte range `[offset, offset+length)` of a `PushMerged` body, holding one partition.
    pub struct Section {
        /// The partition the section's batches belong to.
        pub partition_id: u32,
        /// Where the section starts in the body.
        pub offset: u32,
        /// The section's length in bytes (whole batches).
        pub length: u32,
    }
}
wire_struct! {
    /// Batches of many partitions of one server in one frame.
    pub struct PushMerged {
        /// The application the shuffle belongs to.
        pub app_id: String,
        /// The shuffle pushed to.
        pub shuffle_id: u32,
        /// The body's sections, one per partition pushed.
        pub entries: Vec<Section>,
    }
}
wire_struct! { /// A push was stored.
pub struct PushAck {} }
wire_struct! {
    /// Nothing of the push was stored; retry after `backoff_ms`.
    pub struct Busy {
        /// Suggested wait before sending the same push again, in milliseconds.
        pub backoff_ms: u32,
    }
}
wire_struct! {
    /// Batches one map attempt pushed to one partition.
    pub struct BatchCount {
        /// The partition.
        pub partition_id: u32,
        /// How many batches the attempt pushed to it.
        pub batches: u32,
    }
}
wire_struct! {
    /// A map attempt finished pushing.
    pub struct MapperEnd {
        /// The application the shuffle belongs to.
        pub app_id: String,
        /// The shuffle written.
        pub shuffle_id: u32,
        /// The map task that ended.
        pub map_id: u32,
        /// Which attempt of the map task it was.
        pub attempt_id: u32,
        /// Per partition the attempt pushed to, its batch count; empty when it pushed nothing.
        pub batch_counts: Vec<BatchCount>,
    }
}
wire_struct! {
    /// The attempt that won for the map of a [`MapperEnd`].
    pub struct MapperEndResult {
        /// The first attempt of the map to report; readers read its data.
        pub winning_attempt: u32,
    }
}
wire_struct! {
    /// One map attempt a reader asks for (see [`OpenStream::attempts`]).
    pub struct MapAttempt {
        /// The map task.
        pub map_id: u32,
        /// The attempt of it to read.
        pub attempt_id: u32,
    }
}
wire_struct! {
    /// Open a read stream over maps `[map_start, map_end)` of one partition.
    pub struct OpenStream {
        /// The application the shuffle belongs to.
        pub app_id: String,
        /// The committed shuffle to read.
        pub shuffle_id: u32,
        /// The partition to read.
        pub partition_id: u32,
        /// First map of the range.
        pub map_start: u32,
        /// End of the map range, exclusive; not below `map_start`.
        pub map_end: u32,
        /// Empty: read each map's winning attempt (the first to end). Otherwise read exactly
        /// these attempts, map ids ascending and inside the range, and no other map of the
        /// range: what an engine that chose its own attempts (Spark's map statuses) asks for.
        pub attempts: Vec<MapAttempt>,
    }
}
wire_struct! {
    /// A map's winning attempt and how many batches it pushed to the partition.
    pub struct CommittedMap {
        /// The map task.
        pub map_id: u32,
        /// The attempt the stream serves for it.
        pub attempt_id: u32,
        /// Batches that attempt pushed to the partition: what the reader must see.
        pub batches: u32,
    }
}
wire_struct! {
    /// An open stream: its chunks and the committed attempts of its maps.
    pub struct StreamHandle {
        /// The stream's id for `FetchChunk` and `CloseStream`.
        pub stream_id: u64,
        /// The length the server will send of each chunk, in chunk order.
        pub chunk_lengths: Vec<u32>,
        /// Each map of the range with data in the partition, with the attempt served.
        pub committed: Vec<CommittedMap>,
    }
}
wire_struct! {
    /// Ask for one chunk of a stream.
    pub struct FetchChunk {
        /// The stream.
        pub stream_id: u64,
        /// The chunk, an index into `StreamHandle::chunk_lengths`.
        pub chunk_index: u32,
    }
}
wire_struct! {
    /// One chunk; the body holds its bytes.
    pub struct ChunkData {
        /// The stream it was fetched from.
        pub stream_id: u64,
        /// Which chunk of the stream this is.
        pub chunk_index: u32,
    }
}
wire_struct! {
    /// Ask for one chunk of a stream as regions of a file on the server's host, which the
    /// reader, on the same host, reads itself (see `docs/protocol.md`, host-local reads). A
    /// server that cannot or will not answer so sends the chunk's bytes: a [`ChunkData`], as
    /// for a [`FetchChunk`].
    pub struct FetchChunkLocal {
        /// The stream.
        pub stream_id: u64,
        /// The chunk, an index into `StreamHandle::chunk_lengths`.
        pub chunk_index: u32,
    }
}
wire_struct! {
    /// A byte range of a file.
    pub struct FileSpan {
        /// First byte.
        pub offset: u64,
        /// Bytes in it.
        pub length: u32,
    }
}
wire_struct! {
    /// Where one chunk's bytes are: spans of one file on the server's host, in order; together
    /// they are exactly the bytes a [`ChunkData`] of the chunk would carry.
    pub struct ChunkLocal {
        /// The stream it was fetched from.
        pub stream_id: u64,
        /// Which chunk of the stream this is.
        pub chunk_index: u32,
        /// The file's absolute path on the server's host.
        pub path: String,
        /// The file's device (`st_dev`): the reader checks the path names this very file.
        pub device: u64,
        /// The file's inode number (`st_ino`).
        pub inode: u64,
        /// The chunk's spans of the file, in chunk order.
        pub spans: Vec<FileSpan>,
    }
}
wire_struct! {
    /// Release a stream.
    pub struct CloseStream {
        /// The stream.
        pub stream_id: u64,
    }
}

/// Declares the type-id table once and derives `MsgType` and `Message` from it.
macro_rules! messages {
    ($($id:literal => $variant:ident($ty:ident) body=$body:literal,)*) => {
        /// A message type id. Ids are fixed and never reused.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u8)]
        pub enum MsgType {
            $(
                #[doc = concat!("Id ", stringify!($id), ": frames carrying [`", stringify!($ty), "`].")]
                $variant = $id
            ),*
        }

        impl MsgType {
            /// Every message type, in id order.
            pub const ALL: &'static [MsgType] = &[$(MsgType::$variant),*];

            /// The type for a wire id, if v1 knows it.
            pub fn from_u8(id: u8) -> Option<MsgType> {
                match id { $($id => Some(MsgType::$variant),)* _ => None }
            }
            /// Whether frames of this type may carry a body.
            pub fn has_body(self) -> bool {
                match self { $(MsgType::$variant => $body),* }
            }
            /// The message's name as written in `docs/protocol.md`.
            pub fn name(self) -> &'static str {
                match self { $(MsgType::$variant => stringify!($variant)),* }
            }
        }

        /// Any v1 message (its fields; a body travels beside it). Serializes as its bare fields.
        #[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
        #[serde(untagged)]
        #[cfg_attr(test, derive(proptest_derive::Arbitrary))]
        pub enum Message {
            $(
                #[doc = concat!("[`", stringify!($ty), "`], type id ", stringify!($id), ".")]
                $variant($ty)
            ),*
        }

        impl Message {
            /// This message's type id.
            pub fn msg_type(&self) -> MsgType {
                match self { $(Message::$variant(_) => MsgType::$variant),* }
            }
            /// Appends the message's fields.
            pub fn encode_fields(&self, out: &mut BytesMut) {
                match self { $(Message::$variant(m) => m.put(out)),* }
            }
            /// Decodes a message's fields strictly and checks its invariants.
            pub fn decode(ty: MsgType, fields: &[u8]) -> Result<Message, ProtoError> {
                let mut r = Reader::new(fields);
                let m = match ty { $(MsgType::$variant => Message::$variant(<$ty>::get(&mut r)?)),* };
                r.finish()?;
                m.validate()?;
                Ok(m)
            }
        }

        $(impl From<$ty> for Message {
            fn from(m: $ty) -> Message { Message::$variant(m) }
        })*
    };
}

messages! {
    1 => Handshake(Handshake) body=false,
    2 => HandshakeOk(HandshakeOk) body=false,
    3 => Error(ErrorMsg) body=false,
    4 => Ping(Ping) body=false,
    5 => Pong(Pong) body=false,
    6 => Ok(OkMsg) body=false,
    7 => AuthChallenge(AuthChallenge) body=false,
    8 => AuthProof(AuthProof) body=false,
    10 => RegisterServer(RegisterServer) body=false,
    11 => ServerHeartbeat(ServerHeartbeat) body=false,
    12 => RegisterApp(RegisterApp) body=false,
    13 => AppHeartbeat(AppHeartbeat) body=false,
    14 => UnregisterApp(UnregisterApp) body=false,
    15 => RegisterShuffle(RegisterShuffle) body=false,
    16 => Assignment(Assignment) body=false,
    17 => GetAssignment(GetAssignment) body=false,
    18 => CommitShuffle(CommitShuffle) body=false,
    19 => CommitResult(CommitResult) body=false,
    20 => UnregisterShuffle(UnregisterShuffle) body=false,
    21 => ServerStatus(ServerStatus) body=false,
    22 => DrainOrder(DrainOrder) body=false,
    23 => QuotaReport(QuotaReport) body=false,
    25 => ShuffleSync(ShuffleSync) body=false,
    26 => SplitPartition(SplitPartition) body=false,
    27 => GetSplits(GetSplits) body=false,
    28 => Splits(Splits) body=false,
    30 => Push(Push) body=true,
    31 => PushMerged(PushMerged) body=true,
    32 => PushAck(PushAck) body=false,
    33 => Busy(Busy) body=false,
    34 => MapperEnd(MapperEnd) body=false,
    35 => MapperEndResult(MapperEndResult) body=false,
    36 => OpenStream(OpenStream) body=false,
    37 => StreamHandle(StreamHandle) body=false,
    38 => FetchChunk(FetchChunk) body=false,
    39 => ChunkData(ChunkData) body=true,
    40 => CloseStream(CloseStream) body=false,
    41 => PushSplit(PushSplit) body=false,
    42 => FetchChunkLocal(FetchChunkLocal) body=false,
    43 => ChunkLocal(ChunkLocal) body=false,
}

impl OpenStream {
    /// The range is not backwards, and the named attempts' map ids ascend strictly inside it.
    /// Decoding checks this; a sender may check before it sends.
    pub fn validate(&self) -> Result<(), ProtoError> {
        if self.map_start > self.map_end {
            return Err(ProtoError::Malformed("map range start after end"));
        }
        let mut next = self.map_start; // lowest map id the next entry may name
        for a in &self.attempts {
            if a.map_id < next || a.map_id >= self.map_end {
                return Err(ProtoError::Malformed(
                    "stream attempts not ascending or outside the map range",
                ));
            }
            next = a.map_id + 1;
        }
        Ok(())
    }
}

impl Assignment {
    /// Every partition's servers are in the server list.
    fn validate(&self) -> Result<(), ProtoError> {
        let n = self.servers.len();
        let bad = |i: u16| (i as usize) >= n;
        if self
            .partitions
            .iter()
            .any(|p| bad(p.primary) || (p.replica != NO_REPLICA && bad(p.replica)))
        {
            return Err(ProtoError::Malformed("assignment index outside the server list"));
        }
        Ok(())
    }
}

impl Message {
    /// Invariants beyond the layout (the "semantic" part of malformed).
    fn validate(&self) -> Result<(), ProtoError> {
        match self {
            Message::Handshake(h) => {
                if h.magic != MAGIC {
                    return Err(ProtoError::UnsupportedVersion(format!(
                        "bad handshake magic {:#010x}",
                        h.magic
                    )));
                }
                if h.version != PROTOCOL_VERSION {
                    return Err(ProtoError::UnsupportedVersion(format!(
                        "protocol version {} (this peer speaks {PROTOCOL_VERSION})",
                        h.version
                    )));
                }
            }
            Message::Error(e) if e.retriable > 1 => {
                return Err(ProtoError::Malformed("error retriable flag is not 0 or 1"));
            }
            Message::RegisterShuffle(r) => {
                if r.num_partitions == 0 {
                    return Err(ProtoError::Malformed("shuffle with zero partitions"));
                }
                if !(1..=2).contains(&r.replication) {
                    return Err(ProtoError::Malformed("replication must be 1 or 2"));
                }
            }
            Message::Assignment(a) => a.validate()?,
            Message::ShuffleSync(s) => {
                if s.want_all > 1 {
                    return Err(ProtoError::Malformed("ShuffleSync.want_all is not 0 or 1"));
                }
                for sh in &s.shuffles {
                    sh.assignment.validate()?;
                }
            }
            Message::OpenStream(o) => o.validate()?,
            Message::SplitPartition(r) if r.known_parts == 0 => {
                return Err(ProtoError::Malformed("SplitPartition.known_parts is 0"));
            }
            Message::Splits(s) if s.partitions.iter().any(|p| p.parts.is_empty()) => {
                return Err(ProtoError::Malformed("a split partition with no parts"));
            }
            Message::ServerStatus(s) => {
                if s.draining > 1 {
                    return Err(ProtoError::Malformed("server status draining flag is not 0 or 1"));
                }
                if s.disks.iter().any(|d| d.state > DISK_FAILED) {
                    return Err(ProtoError::Malformed("unknown disk state"));
                }
            }
            Message::DrainOrder(d) if d.order > DRAIN_ORDER_STOP => {
                return Err(ProtoError::Malformed("unknown drain order"));
            }
            Message::QuotaReport(q) if q.at_quota.iter().any(|a| a.holder > QUOTA_HOLDER_USER) => {
                return Err(ProtoError::Malformed("unknown quota holder"));
            }
            _ => {}
        }
        Ok(())
    }

    /// Checks what depends on the body's length: `PushMerged` sections must lie inside it, each
    /// non-empty and after the one before (no byte in two sections). A section is stored, charged
    /// and written once per entry, so overlapping entries would make one body's bytes cost the
    /// server many times what its admission and quota counted.
    pub fn validate_body(&self, body_len: usize) -> Result<(), ProtoError> {
        if let Message::PushMerged(p) = self {
            let mut next = 0u64; // where the next section may start
            for s in &p.entries {
                let end = s.offset as u64 + s.length as u64;
                if end > body_len as u64 {
                    return Err(ProtoError::Malformed("push section outside the body"));
                }
                if s.length == 0 {
                    return Err(ProtoError::Malformed("empty push section"));
                }
                if (s.offset as u64) < next {
                    return Err(ProtoError::Malformed(
                        "push sections overlap or are not in body order",
                    ));
                }
                next = end;
            }
        }
        Ok(())
    }

    /// The application a request acts for, when it names one: the key of the authorization
    /// check (`docs/security.md`). Streams are named by id; the server checks their owner.
    pub fn app_id(&self) -> Option<&str> {
        let id = match self {
            Message::RegisterApp(m) => &m.app_id,
            Message::AppHeartbeat(m) => &m.app_id,
            Message::UnregisterApp(m) => &m.app_id,
            Message::RegisterShuffle(m) => &m.app_id,
            Message::GetAssignment(m) => &m.app_id,
            Message::SplitPartition(m) => &m.app_id,
            Message::GetSplits(m) => &m.app_id,
            Message::Splits(m) => &m.app_id,
            Message::CommitShuffle(m) => &m.app_id,
            Message::UnregisterShuffle(m) => &m.app_id,
            Message::Push(m) => &m.app_id,
            Message::PushMerged(m) => &m.app_id,
            Message::MapperEnd(m) => &m.app_id,
            Message::OpenStream(m) => &m.app_id,
            _ => return None,
        };
        Some(id)
    }

    /// Whether only the cluster's own peers may send this request (a server reporting to a
    /// coordinator, a coordinator passing assignments to another), never an application.
    pub fn is_cluster_only(&self) -> bool {
        matches!(
            self,
            Message::RegisterServer(_)
                | Message::ServerHeartbeat(_)
                | Message::ServerStatus(_)
                | Message::QuotaReport(_)
                | Message::ShuffleSync(_)
                | Message::Splits(_)
        )
    }

    /// An `Error` message for a wire code.
    pub fn error(code: ErrorCode, message: impl Into<String>) -> Message {
        Message::Error(ErrorMsg {
            code: code.as_u16(),
            retriable: code.is_retriable() as u8,
            message: message.into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{encode_frame, parse};
    use proptest::prelude::*;

    fn make_valid_assignment(a: &mut Assignment) {
        let n = a.servers.len() as u16;
        for p in &mut a.partitions {
            p.primary = if n == 0 { 0 } else { p.primary % n };
            if p.replica != NO_REPLICA && n > 0 {
                p.replica %= n;
            }
        }
        if n == 0 {
            a.partitions.clear();
        }
    }

    /// Bends a random message into one that satisfies [`Message::validate`].
    fn make_valid(mut m: Message) -> Message {
        match &mut m {
            Message::Handshake(h) => {
                h.magic = MAGIC;
                h.version = PROTOCOL_VERSION;
            }
            Message::Error(e) => e.retriable &= 1,
            Message::RegisterShuffle(r) => {
                r.num_partitions = r.num_partitions.max(1);
                r.replication = 1 + (r.replication & 1);
            }
            Message::Assignment(a) => make_valid_assignment(a),
            Message::ShuffleSync(s) => {
                s.want_all &= 1;
                s.shuffles.iter_mut().for_each(|sh| make_valid_assignment(&mut sh.assignment));
            }
            Message::OpenStream(o) => {
                if o.map_start > o.map_end {
                    std::mem::swap(&mut o.map_start, &mut o.map_end);
                }
                let range = o.map_start..o.map_end;
                o.attempts.retain(|a| range.contains(&a.map_id));
                o.attempts.sort_unstable_by_key(|a| a.map_id);
                o.attempts.dedup_by_key(|a| a.map_id);
            }
            Message::ServerStatus(s) => {
                s.draining &= 1;
                s.disks.iter_mut().for_each(|d| d.state %= DISK_FAILED + 1);
            }
            Message::DrainOrder(d) => d.order %= DRAIN_ORDER_STOP + 1,
            Message::QuotaReport(q) => q.at_quota.iter_mut().for_each(|a| a.holder &= 1),
            Message::SplitPartition(r) => r.known_parts = r.known_parts.max(1),
            Message::Splits(s) => s.partitions.iter_mut().for_each(|p| {
                if p.parts.is_empty() {
                    p.parts.push(PartitionLoc { primary: 0, replica: NO_REPLICA });
                }
            }),
            // Sections need a body to lie in (`validate_body`); round trips of sections are
            // `push_merged_sections_*`.
            Message::PushMerged(p) => p.entries.clear(),
            _ => {}
        }
        m
    }

    proptest! {
        #[test]
        fn round_trip_every_message(m in any::<Message>(), id in any::<u32>(),
                                    body in proptest::collection::vec(any::<u8>(), 0..64)) {
            let m = make_valid(m);
            let body = if m.msg_type().has_body() { body } else { Vec::new() };
            let mut buf = encode_frame(id, &m, &body);
            let frame = parse(&mut buf, u32::MAX).expect("valid frame decodes").expect("complete");
            prop_assert_eq!(frame.request_id, id);
            prop_assert_eq!(&frame.message, &m);
            prop_assert_eq!(&frame.body[..], &body[..]);
            prop_assert!(buf.is_empty());
        }

        #[test]
        fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..256)) {
            let mut buf = bytes::BytesMut::from(&data[..]);
            while let Ok(Some(_)) = parse(&mut buf, 1 << 20) {}
        }
    }

    #[test]
    fn every_type_id_is_covered_once() {
        let mut seen = std::collections::HashSet::new();
        for t in MsgType::ALL {
            assert!(seen.insert(*t as u8));
            assert_eq!(MsgType::from_u8(*t as u8), Some(*t));
        }
        assert_eq!(seen.len(), 40);
    }
}
