//! Server configuration: one serde struct, every field documented with its unit.

use std::path::PathBuf;

use serde::Deserialize;

/// Configuration of a `sluice server`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Address to listen on (`host:port`; port 0 picks a free one).
    pub listen: String,
    /// Host name or IP that clients use to reach this server (sent to coordinators).
    /// Empty: the listen address's IP.
    pub advertise_host: String,
    /// Stable id of this server; empty: `host:port`.
    pub server_id: String,
    /// Directories that hold flushed shuffle files. At least one.
    pub data_dirs: Vec<PathBuf>,
    /// Bytes of buffered shuffle data the server may hold in memory.
    pub memory_budget_bytes: u64,
    /// Fraction of the budget above which the largest partition buffers are flushed.
    pub flush_watermark: f64,
    /// Fraction of the budget above which pushes are answered with `Busy`.
    pub busy_watermark: f64,
    /// Fraction of the budget below which `Busy` stops.
    pub resume_watermark: f64,
    /// Back-off suggested to clients in a `Busy` reply, in milliseconds.
    pub busy_backoff_ms: u32,
    /// How long a push that finds the budget paused may wait for memory, its body unread in the
    /// socket, before it is answered `Busy`, in milliseconds (0: answer at once). The wait
    /// stalls that connection's reading, which is backpressure that costs nothing; a `Busy`
    /// costs the body's transfer, discarded, and its resend. At most 10 000.
    pub busy_hold_ms: u32,
    /// A partition buffer this large is flushed as one chunk, in bytes; also the chunk size
    /// readers fetch.
    pub chunk_bytes: u64,
    /// While the flushers have less than `chunk_bytes` to write, a partition buffer this large
    /// is flushed already, in bytes, and so is, every second, one of a page or more that held
    /// data a second before (0: neither; buffers are flushed only at `chunk_bytes` or under
    /// memory pressure). Keeps the disks busy while they have room, so a commit finds little
    /// left to write and sync; streams still serve consecutive small chunks as one of up to
    /// `chunk_bytes`.
    pub early_flush_bytes: u64,
    /// A partition whose data on this server reaches this many bytes is split: pushes to it are
    /// answered `PushSplit`, and its writers move on to a new part on another server (see
    /// docs/protocol.md, "Partition splits"). 0: never on size (a server whose disks are nearly
    /// full still splits).
    pub split_threshold_bytes: u64,
    /// Most partitions a shuffle may be registered with. Each partition's state is allocated at
    /// registration, outside the memory budget (208 bytes each before it holds data: 52 MiB at
    /// the default), so one registration of billions would take the server down; a larger one
    /// is refused with `INVALID_REQUEST`. Coordinators have the same key.
    pub max_partitions_per_shuffle: u32,
    /// Most maps a shuffle may be registered with; a larger registration is refused with
    /// `INVALID_REQUEST`. Coordinators have the same key.
    pub max_maps_per_shuffle: u32,
    /// Most partitions one application's shuffles may hold on this server together; a
    /// registration past it is refused with `QUOTA_EXCEEDED`. Partition state is allocated at
    /// registration, outside the memory budget (see `max_partitions_per_shuffle`): without
    /// this, one application registering shuffle after shuffle takes the server's memory
    /// (2,097,152 by default: 416 MiB of partition state).
    pub max_partitions_per_app: u64,
    /// Flusher threads per data directory.
    pub flushers_per_dir: usize,
    /// Bytes of a flush each `pwritev` carries at most (each ends at a multiple of this in the
    /// file). 256 KiB by default because Linux sizes the page-cache folios a write creates by its
    /// length, and on a VM that hands free memory back to its host (free page reporting) the
    /// large folios of 4 MiB writes come from memory the host must fault in again.
    /// Measured: docs/benchmarks.md#flush-write-bytes.
    pub flush_write_bytes: usize,
    /// Nice value added to the flusher threads (0–19; 0: the server's own priority). Above 0,
    /// flushing yields the CPU to the network threads and to co-located processes; when it
    /// falls behind, pushers get `Busy`. 0 by default because flushers niced on CPUs they share
    /// with pushers fall behind, and that costs `Busy` replies and push throughput.
    /// Measured: docs/benchmarks.md#flusher-nice.
    pub flusher_nice: i32,
    /// Free bytes left on each data directory's file system, in bytes: below it the directory
    /// takes no new data (its recycle pool is given back first) until space is freed.
    pub data_dir_reserve_bytes: u64,
    /// Bytes of deleted shuffles' files each data directory keeps for reuse by new partition
    /// files (0: delete them). Writing over a file's cached pages skips allocating new ones.
    pub recycle_bytes_per_dir: u64,
    /// An application with no heartbeat for this long is expired and its data deleted, in ms.
    pub app_expiry_ms: u64,
    /// After SIGTERM, the server stops once no shuffle of it takes pushes any more (every one it
    /// holds is committed, and so durable), or after this many milliseconds, whichever comes
    /// first; after SIGUSR1, once it holds no shuffle at all, or after this long.
    pub drain_timeout_ms: u64,
    /// Make each commit durable before answering it: the shuffle's files are synced and its
    /// commit record written next to them, so a restarted server serves it again. `false`: no
    /// sync and no record; a restart loses what the server held (the old behaviour).
    pub durable_commit: bool,
    /// With `durable_commit`: start writing each flush back to disk as soon as it is written
    /// (`sync_file_range`), so that a commit's sync finds little left to write. Without it the
    /// page cache holds the bytes until the commit syncs them all at once.
    /// Measured: docs/benchmarks.md (durable commit).
    pub flush_writeback: bool,
    /// Offer host-local reads: a reader on this host (connected over loopback or from this
    /// server's own address) that asks for a chunk with `FetchChunkLocal` is told where its
    /// bytes are in the server's files and reads them itself, without the network. The reader
    /// must be able to open the files (same user or group, same mounts): it can then read every
    /// shuffle on them, so turn this on only where the file system keeps applications apart as
    /// much as it needs to. `false`: such requests get the chunk's bytes, as `FetchChunk`.
    pub host_local_reads: bool,
    /// Coordinator addresses (`host:port`) to heartbeat to.
    pub coordinators: Vec<String>,
    /// Interval between heartbeats to each coordinator, in milliseconds.
    pub heartbeat_interval_ms: u64,
    /// TLS to the coordinators (`[coordinator_tls]`: `ca_file`, and `cert_file`/`key_file` when
    /// they require client certificates); `None`: plain TCP.
    pub coordinator_tls: Option<sluice_transport::TlsClientConfig>,
    /// Network transport settings (frame limit, watermarks, zero copy, auth).
    pub transport: sluice_transport::ServerConfig,
    /// Bearer token the admin API's write endpoints (drain) require; `None`: they are open.
    /// At least 16 characters.
    pub admin_token: Option<String>,
    /// Limits per application and per user on what they hold on this server (`[quotas]`:
    /// `app`, `user` and `users.<name>`, each with `buffered_bytes`, `disk_bytes`,
    /// `object_store_bytes`; 0: no limit). None by default.
    pub quotas: crate::quota::QuotaConfig,
    /// The object-store tier (`[object_store]`): where committed partitions move when the data
    /// directories fill up, S3 (`bucket`) or HDFS (`hdfs_url`). `None`: off, data stays on
    /// local disks.
    pub object_store: Option<ObjectStoreConfig>,
}

/// An S3-compatible object store, or an HDFS, that committed partitions move to when the local
/// disks pass [`ObjectStoreConfig::offload_high_watermark`], and are served back from by ranged
/// reads.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ObjectStoreConfig {
    /// S3 bucket the partitions go to (it must exist). Required for S3, that is unless
    /// `hdfs_url` is set.
    pub bucket: String,
    /// An HDFS instead of S3: the NameNode (`hdfs://host:port`) or the name service
    /// (`hdfs://name`, resolved through the Hadoop configuration in `$HADOOP_CONF_DIR`). Empty:
    /// S3. With it, the S3 settings (`bucket`, `endpoint`, the keys) must stay unset, and
    /// `request_timeout_ms`, `max_retries` bound each operation as a whole only (HDFS has no
    /// per-request bounds here); `connect_timeout_ms`, `region`, `allow_http` and `path_style`
    /// do not apply.
    pub hdfs_url: String,
    /// Key prefix of every object this server writes (`<prefix>/<app>/<shuffle>/...`); on HDFS,
    /// the directory under the root (`/<prefix>/<app>/<shuffle>/...`).
    pub prefix: String,
    /// Endpoint URL of an S3-compatible store (`http://host:port` for MinIO and the like);
    /// empty: AWS S3 of `region`.
    pub endpoint: String,
    /// Region (signing; AWS S3's endpoint when `endpoint` is empty).
    pub region: String,
    /// Access key id; empty: `AWS_ACCESS_KEY_ID` from the environment, or the instance's
    /// credentials (web identity, container or instance metadata).
    pub access_key_id: String,
    /// Secret access key; empty: `AWS_SECRET_ACCESS_KEY` from the environment, or as above.
    pub secret_access_key: String,
    /// Allow plain `http://` endpoints (a store on a trusted network, and the tests).
    pub allow_http: bool,
    /// Path-style requests (`endpoint/bucket/key`) rather than virtual-host style
    /// (`bucket.endpoint/key`); most self-hosted stores want `true`.
    pub path_style: bool,
    /// Fraction of a data directory's file system in use above which its committed partitions
    /// start moving to the store (largest first), in (0, 1].
    pub offload_high_watermark: f64,
    /// Moving stops once the directory is back under this fraction; below the high watermark.
    pub offload_low_watermark: f64,
    /// Bound on one HTTP request to the store (connect, send, answer), in milliseconds. A
    /// chunk read gets `request_timeout_ms` × (`max_retries` + 1) + 1 s in all: keep that under
    /// the readers' request timeout (120 s by default), so they hear `STORAGE_FAILED` rather
    /// than time out themselves.
    pub request_timeout_ms: u64,
    /// Bound on connecting to the store, in milliseconds.
    pub connect_timeout_ms: u64,
    /// Retries of a failed request to the store (with back-off), inside the bound of
    /// `request_timeout_ms` × (retries + 1) that a chunk read or an upload step gets as a whole.
    pub max_retries: usize,
    /// Chunk reads from the store at once; more wait. Each holds one chunk in memory, so this
    /// × `chunk_bytes` bounds the memory reads from the store take.
    pub max_concurrent_reads: usize,
    /// Size of each part of the multipart upload that copies a partition file, in bytes
    /// (5 MiB to 5 GiB, as S3 requires).
    pub upload_part_bytes: u64,
}

impl Default for ObjectStoreConfig {
    fn default() -> Self {
        ObjectStoreConfig {
            bucket: String::new(),
            hdfs_url: String::new(),
            prefix: "sluice".into(),
            endpoint: String::new(),
            region: "us-east-1".into(),
            access_key_id: String::new(),
            secret_access_key: String::new(),
            allow_http: false,
            path_style: true,
            offload_high_watermark: 0.85,
            offload_low_watermark: 0.75,
            request_timeout_ms: 20_000,
            connect_timeout_ms: 5_000,
            max_retries: 3,
            max_concurrent_reads: 16,
            upload_part_bytes: 16 << 20,
        }
    }
}

impl ObjectStoreConfig {
    /// Checks the values; the message names the field (`object_store.<field>`).
    pub fn validate(&self) -> Result<(), String> {
        if self.hdfs_url.is_empty() {
            if self.bucket.is_empty() {
                return Err("object_store.bucket: required when [object_store] is set (or \
                            hdfs_url, for HDFS)"
                    .into());
            }
        } else {
            check_hdfs_url(&self.hdfs_url)?;
            let s3 = [
                ("bucket", &self.bucket),
                ("endpoint", &self.endpoint),
                ("access_key_id", &self.access_key_id),
                ("secret_access_key", &self.secret_access_key),
            ];
            if let Some((name, _)) = s3.iter().find(|(_, v)| !v.is_empty()) {
                return Err(format!(
                    "object_store.{name}: an S3 setting, but hdfs_url is set (HDFS): set one \
                     store or the other"
                ));
            }
        }
        let (lo, hi) = (self.offload_low_watermark, self.offload_high_watermark);
        if !(0.0 <= lo && lo < hi && hi <= 1.0) {
            return Err(format!(
                "object_store: need 0 <= offload_low_watermark ({lo}) < offload_high_watermark ({hi}) <= 1"
            ));
        }
        if self.request_timeout_ms == 0 || self.connect_timeout_ms == 0 {
            return Err(
                "object_store.request_timeout_ms and connect_timeout_ms must be positive".into()
            );
        }
        if self.max_retries > 10 {
            return Err(format!("object_store.max_retries: {} is over 10", self.max_retries));
        }
        if self.max_concurrent_reads == 0 {
            return Err("object_store.max_concurrent_reads: must be at least 1".into());
        }
        if !(5 << 20..=5 << 30).contains(&self.upload_part_bytes) {
            return Err(format!(
                "object_store.upload_part_bytes: {} is not between 5 MiB and 5 GiB",
                self.upload_part_bytes
            ));
        }
        if !self.endpoint.is_empty() {
            let http = self.endpoint.starts_with("http://");
            if !http && !self.endpoint.starts_with("https://") {
                return Err(format!(
                    "object_store.endpoint: {:?} is not an http:// or https:// URL",
                    self.endpoint
                ));
            }
            if http && !self.allow_http {
                return Err("object_store.endpoint: plain http:// needs allow_http = true".into());
            }
        }
        if self.access_key_id.is_empty() != self.secret_access_key.is_empty() {
            return Err(
                "object_store: access_key_id and secret_access_key go together (both or neither)"
                    .into(),
            );
        }
        Ok(())
    }
}

/// Checks `object_store.hdfs_url`: `hdfs://` and an authority (NameNode `host:port` or a name
/// service), no path (the directory is `prefix`).
fn check_hdfs_url(url: &str) -> Result<(), String> {
    let bad = |why: &str| Err(format!("object_store.hdfs_url: {url:?} {why}"));
    let Some(rest) = url.strip_prefix("hdfs://") else {
        return bad("is not an hdfs:// URL");
    };
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    if authority.is_empty() {
        return bad("names no NameNode (hdfs://host:port)");
    }
    if !path.is_empty() {
        return bad("has a path: the directory is object_store.prefix");
    }
    if let Some((_, port)) = authority.rsplit_once(':') {
        if port.parse::<u16>().is_err() {
            return bad("has no valid port");
        }
    }
    Ok(())
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: "127.0.0.1:9097".into(),
            advertise_host: String::new(),
            server_id: String::new(),
            data_dirs: vec![std::env::temp_dir().join("sluice-data")],
            memory_budget_bytes: 1 << 30,
            flush_watermark: 0.7,
            busy_watermark: 0.9,
            resume_watermark: 0.6,
            busy_backoff_ms: 50,
            busy_hold_ms: 100,
            chunk_bytes: 4 << 20,
            early_flush_bytes: 16 << 10,
            split_threshold_bytes: 1 << 30,
            max_partitions_per_shuffle: 262_144,
            max_maps_per_shuffle: 1 << 20,
            max_partitions_per_app: 1 << 21,
            flushers_per_dir: 2,
            flush_write_bytes: 256 << 10,
            flusher_nice: 0,
            data_dir_reserve_bytes: 256 << 20,
            recycle_bytes_per_dir: 2 << 30,
            app_expiry_ms: 120_000,
            drain_timeout_ms: 3_600_000,
            durable_commit: true,
            flush_writeback: true,
            host_local_reads: false,
            coordinators: Vec::new(),
            coordinator_tls: None,
            heartbeat_interval_ms: 1_000,
            transport: sluice_transport::ServerConfig::default(),
            admin_token: None,
            quotas: crate::quota::QuotaConfig::default(),
            object_store: None,
        }
    }
}

impl ServerConfig {
    /// Checks the values; the message names the field and what is wrong.
    pub fn validate(&self) -> Result<(), String> {
        if self.data_dirs.is_empty() {
            return Err("data_dirs: at least one directory is required".into());
        }
        if self.memory_budget_bytes < 4 << 20 {
            return Err("memory_budget_bytes: must be at least 4 MiB".into());
        }
        let (r, f, b) = (self.resume_watermark, self.flush_watermark, self.busy_watermark);
        if !(0.0 < r && r < b && f < b && b <= 1.0 && f > 0.0) {
            return Err(format!(
                "watermarks: need 0 < resume ({r}) < busy ({b}) <= 1 and 0 < flush ({f}) < busy"
            ));
        }
        if self.max_partitions_per_shuffle == 0 || self.max_maps_per_shuffle == 0 {
            return Err("max_partitions_per_shuffle, max_maps_per_shuffle: must be positive".into());
        }
        if self.max_partitions_per_app < u64::from(self.max_partitions_per_shuffle) {
            return Err(format!(
                "max_partitions_per_app ({}) must be at least max_partitions_per_shuffle ({})",
                self.max_partitions_per_app, self.max_partitions_per_shuffle
            ));
        }
        if self.chunk_bytes == 0 || self.chunk_bytes > u32::MAX as u64 / 2 {
            return Err("chunk_bytes: must be between 1 and 2 GiB".into());
        }
        if self.chunk_bytes + 1024 > self.transport.max_frame_bytes as u64 {
            return Err("chunk_bytes: must fit in transport.max_frame_bytes".into());
        }
        if self.flush_write_bytes < 4096 {
            return Err("flush_write_bytes: must be at least 4096".into());
        }
        if self.flushers_per_dir == 0 {
            return Err("flushers_per_dir: must be at least 1".into());
        }
        if self.busy_hold_ms > 10_000 {
            return Err(format!(
                "busy_hold_ms: {} is over 10000 (a held push stalls its whole connection)",
                self.busy_hold_ms
            ));
        }
        if !(0..=19).contains(&self.flusher_nice) {
            return Err(format!("flusher_nice: {} is not in 0..=19", self.flusher_nice));
        }
        if self.heartbeat_interval_ms == 0 || self.app_expiry_ms == 0 {
            return Err("heartbeat_interval_ms and app_expiry_ms must be positive".into());
        }
        if self.quotas.users.keys().any(|u| u.is_empty()) {
            return Err("quotas.users: a user name is empty".into());
        }
        sluice_transport::validate_admin_token(self.admin_token.as_deref())?;
        if let Some(o) = &self.object_store {
            o.validate()?;
        }
        self.transport.validate().map_err(|e| format!("transport: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_store(f: impl FnOnce(&mut ObjectStoreConfig)) -> Result<(), String> {
        let mut store = ObjectStoreConfig { bucket: "b".into(), ..ObjectStoreConfig::default() };
        f(&mut store);
        ServerConfig { object_store: Some(store), ..ServerConfig::default() }.validate()
    }

    #[test]
    fn object_store_settings_are_checked_with_the_key_named() {
        assert_eq!(with_store(|_| {}), Ok(()));
        let err = |f: fn(&mut ObjectStoreConfig)| with_store(f).unwrap_err();
        assert!(err(|s| s.bucket.clear()).contains("object_store.bucket"));
        assert!(err(|s| s.offload_low_watermark = 0.9).contains("offload_low_watermark"));
        assert!(err(|s| s.offload_high_watermark = 1.5).contains("offload_high_watermark"));
        assert!(err(|s| s.offload_high_watermark = f64::NAN).contains("offload_high_watermark"));
        assert!(err(|s| s.endpoint = "http://h:9000".into()).contains("allow_http"));
        assert!(err(|s| s.endpoint = "ftp://h".into()).contains("object_store.endpoint"));
        assert!(err(|s| s.access_key_id = "k".into()).contains("secret_access_key"));
        assert!(err(|s| s.upload_part_bytes = 1 << 20).contains("upload_part_bytes"));
        assert!(err(|s| s.max_concurrent_reads = 0).contains("max_concurrent_reads"));
        assert!(err(|s| s.request_timeout_ms = 0).contains("request_timeout_ms"));
        assert!(err(|s| s.max_retries = 11).contains("max_retries"));
        let http = |s: &mut ObjectStoreConfig| {
            s.endpoint = "http://127.0.0.1:9000".into();
            s.allow_http = true;
        };
        assert_eq!(with_store(http), Ok(()));
    }

    #[test]
    fn hdfs_settings_are_checked_with_the_key_named() {
        let hdfs = |url: &str, f: fn(&mut ObjectStoreConfig)| {
            with_store(|s| {
                s.bucket.clear();
                s.hdfs_url = url.into();
                f(s);
            })
        };
        assert_eq!(hdfs("hdfs://127.0.0.1:9000", |_| {}), Ok(()));
        assert_eq!(hdfs("hdfs://nameservice", |_| {}), Ok(()));
        assert_eq!(hdfs("hdfs://nn:9000/", |_| {}), Ok(()));
        let err = |url: &str| hdfs(url, |_| {}).unwrap_err();
        assert!(err("http://nn:9000").contains("object_store.hdfs_url"));
        assert!(err("hdfs://").contains("object_store.hdfs_url"));
        assert!(err("hdfs://nn:x").contains("port"));
        assert!(err("hdfs://nn:9000/data").contains("object_store.prefix"));
        let both = hdfs("hdfs://nn:9000", |s| s.bucket = "b".into()).unwrap_err();
        assert!(both.contains("object_store.bucket") && both.contains("hdfs_url"), "{both}");
        let keys = hdfs("hdfs://nn:9000", |s| s.access_key_id = "k".into()).unwrap_err();
        assert!(keys.contains("object_store.access_key_id"), "{keys}");
    }
}
