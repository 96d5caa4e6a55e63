//! The object-store tier: copies committed partition files to an S3-compatible store or an HDFS
//! and reads chunks back from it with ranged reads, both through `object_store`'s one
//! [`ObjectStore`] trait (HDFS by `hdfs-native-object-store`, a Rust HDFS client: no JVM).
//!
//! The server, not the reader, reads the store: readers keep the one protocol they have
//! (`OpenStream`/`FetchChunk`/`ChunkData`, CRCs checked end to end) and need no store
//! credentials, no S3 client and no network path to the store; the chunk index, the attempts a
//! stream reads and the access checks stay on the server. The cost is one more hop for
//! offloaded bytes, which only cold, spilled data pays.
//!
//! Every call is bounded: on S3 each HTTP request by `request_timeout_ms` (retried
//! `max_retries` times by the client library), and on both stores each operation as a whole by
//! `request_timeout_ms` × (`max_retries` + 1) + 1 s, the only bound HDFS calls get (its client
//! has no per-request options). A store that fails, hangs or vanishes gives an error, never a
//! wait without end and never bytes of another length than asked.

use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hdfs_native_object_store::HdfsObjectStoreBuilder;
use object_store::aws::AmazonS3Builder;
use object_store::path::Path as ObjectPath;
use object_store::{
    BackoffConfig, ClientOptions, ObjectStore, ObjectStoreExt, PutPayload, RetryConfig,
    WriteMultipart,
};
use tokio::sync::Semaphore;

use crate::config::ObjectStoreConfig;
use crate::core::ShuffleKey;
use crate::files::app_dir_name;

/// Why a call to the store failed.
#[derive(Debug, thiserror::Error)]
pub enum TierError {
    /// The object is not there (deleted behind the server's back): its data is lost.
    #[error("object {key} is not in the store: {why}")]
    NotFound {
        /// The object's key.
        key: String,
        /// The store's answer.
        why: String,
    },
    /// The store failed or did not answer in time; a retry may succeed.
    #[error("object store: {0}")]
    Failed(String),
    /// A local file could not be read for an upload.
    #[error("reading {path}: {why}")]
    Local {
        /// The file.
        path: String,
        /// The error.
        why: String,
    },
}

/// A configured object store and the bounds its calls run under.
pub struct Tier {
    /// S3 or HDFS.
    store: Arc<dyn ObjectStore>,
    config: ObjectStoreConfig,
    /// Chunk reads in flight at most (each holds one chunk in memory).
    reads: Semaphore,
    /// Bound on one whole operation (a read of one chunk, one upload step).
    op_timeout: Duration,
}

impl std::fmt::Debug for Tier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tier({})", self.store)
    }
}

impl Tier {
    /// A client for the configured store (no request is made yet).
    pub fn open(config: &ObjectStoreConfig) -> Result<Tier, String> {
        let request = Duration::from_millis(config.request_timeout_ms);
        let store: Arc<dyn ObjectStore> = if config.hdfs_url.is_empty() {
            Self::s3(config)?
        } else {
            let hdfs = HdfsObjectStoreBuilder::new().with_url(&config.hdfs_url).build();
            Arc::new(hdfs.map_err(|e| format!("object_store.hdfs_url: {e}"))?)
        };
        Ok(Tier {
            store,
            config: config.clone(),
            reads: Semaphore::new(config.max_concurrent_reads),
            op_timeout: request * (config.max_retries as u32 + 1) + Duration::from_secs(1),
        })
    }

    /// An S3 client, each request bounded by `request_timeout_ms` and retried `max_retries`
    /// times.
    fn s3(config: &ObjectStoreConfig) -> Result<Arc<dyn ObjectStore>, String> {
        // reqwest is built without a crypto provider of its own (object_store's `aws` feature
        // would bring aws-lc): HTTPS endpoints use rustls's process default, ring, as the rest
        // of Sluice does. Installing fails only when one is installed already, which is fine.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let request = Duration::from_millis(config.request_timeout_ms);
        let options = ClientOptions::new()
            .with_timeout(request)
            .with_connect_timeout(Duration::from_millis(config.connect_timeout_ms))
            .with_allow_http(config.allow_http);
        let retry = RetryConfig {
            backoff: BackoffConfig {
                init_backoff: Duration::from_millis(50),
                max_backoff: Duration::from_secs(2),
                base: 2.0,
            },
            max_retries: config.max_retries,
            retry_timeout: request * (config.max_retries as u32 + 1),
        };
        let mut b = AmazonS3Builder::from_env()
            .with_bucket_name(&config.bucket)
            .with_region(&config.region)
            .with_allow_http(config.allow_http)
            .with_virtual_hosted_style_request(!config.path_style)
            .with_client_options(options)
            .with_retry(retry);
        if !config.endpoint.is_empty() {
            b = b.with_endpoint(&config.endpoint);
        }
        if !config.access_key_id.is_empty() {
            b = b
                .with_access_key_id(&config.access_key_id)
                .with_secret_access_key(&config.secret_access_key);
        }
        Ok(Arc::new(b.build().map_err(|e| format!("object_store: {e}"))?))
    }

    /// A new key for file `n` of partition `pid` of `key`: unique to this copy (`token`), so
    /// that servers sharing a bucket, replicas and a later copy of the same partition never
    /// overwrite each other's objects.
    pub fn object_key(&self, key: &ShuffleKey, pid: u32, n: u32, token: u64) -> String {
        let prefix = self.config.prefix.trim_matches('/');
        let app = app_dir_name(key.app_id());
        let name = format!("{app}/{}/{pid}-{n}-{token:016x}.data", key.shuffle_id());
        if prefix.is_empty() {
            name
        } else {
            format!("{prefix}/{name}")
        }
    }

    /// Runs `f` within the operation bound; a timeout is a [`TierError::Failed`].
    async fn bounded<T>(
        &self,
        what: &str,
        f: impl std::future::Future<Output = Result<T, TierError>>,
    ) -> Result<T, TierError> {
        match tokio::time::timeout(self.op_timeout, f).await {
            Ok(r) => r,
            Err(_) => Err(TierError::Failed(format!(
                "{what}: no answer within {} ms",
                self.op_timeout.as_millis()
            ))),
        }
    }

    /// Copies bytes `[0, len)` of `file` (at `path`, for messages) to object `key`, then checks
    /// that the store holds exactly `len` bytes under it. On failure nothing usable is left
    /// (an unfinished multipart upload is aborted).
    pub async fn upload(
        &self,
        file: Arc<File>,
        path: &std::path::Path,
        len: u64,
        key: &str,
    ) -> Result<(), TierError> {
        let location = ObjectPath::from(key);
        let part = self.config.upload_part_bytes;
        let shown = path.display().to_string();
        if len <= part {
            let bytes = read_at(file, 0, len, &shown).await?;
            self.bounded("upload", async {
                self.store.put(&location, PutPayload::from(bytes)).await.map_err(failed)
            })
            .await?;
        } else {
            let upload = self
                .bounded("upload start", async {
                    self.store.put_multipart(&location).await.map_err(failed)
                })
                .await?;
            let mut w = WriteMultipart::new_with_chunk_size(upload, part as usize);
            let mut at = 0;
            let copied: Result<(), TierError> = async {
                while at < len {
                    let n = part.min(len - at);
                    let bytes = read_at(file.clone(), at, n, &shown).await?;
                    // Two parts in flight: the next is read while one uploads.
                    self.bounded("upload part", async {
                        w.wait_for_capacity(2).await.map_err(failed)
                    })
                    .await?;
                    w.put(bytes);
                    at += n;
                }
                Ok(())
            }
            .await;
            match copied {
                Ok(()) => {
                    self.bounded("upload finish", async { w.finish().await.map_err(failed) })
                        .await?;
                }
                Err(e) => {
                    let _ = tokio::time::timeout(self.op_timeout, w.abort()).await;
                    return Err(e);
                }
            }
        }
        let meta = self
            .bounded("check", async { self.store.head(&location).await.map_err(failed) })
            .await?;
        if meta.size != len {
            self.delete(key).await;
            return Err(TierError::Failed(format!(
                "the store holds {} bytes under {key} after an upload of {len}",
                meta.size
            )));
        }
        Ok(())
    }

    /// Reads `ranges` of object `key` (one chunk's wanted byte ranges) as one body; waits for a
    /// read slot first (see `max_concurrent_reads`).
    pub async fn read(&self, key: &str, ranges: &[Range<u64>]) -> Result<Vec<Bytes>, TierError> {
        let location = ObjectPath::from(key);
        // The wait for a slot counts against the bound too: reads stuck behind a hung store
        // fail with it rather than queue for ever.
        let parts = self
            .bounded("read", async {
                let _slot =
                    self.reads.acquire().await.map_err(|e| TierError::Failed(e.to_string()))?;
                self.store.get_ranges(&location, ranges).await.map_err(|e| match e {
                    object_store::Error::NotFound { source, .. } => {
                        TierError::NotFound { key: key.to_owned(), why: source.to_string() }
                    }
                    e => failed(e),
                })
            })
            .await?;
        // Never a body of another length than the index says: that would be wrong bytes.
        for (r, p) in ranges.iter().zip(&parts) {
            if p.len() as u64 != r.end - r.start {
                return Err(TierError::Failed(format!(
                    "{key}: asked for {} bytes at {}, got {}",
                    r.end - r.start,
                    r.start,
                    p.len()
                )));
            }
        }
        if parts.len() != ranges.len() {
            return Err(TierError::Failed(format!(
                "{key}: asked for {} ranges, got {}",
                ranges.len(),
                parts.len()
            )));
        }
        Ok(parts)
    }

    /// Deletes object `key`; a failure is logged (the object is left behind, never a wrong
    /// answer).
    pub async fn delete(&self, key: &str) {
        let location = ObjectPath::from(key);
        let done =
            self.bounded("delete", async { self.store.delete(&location).await.map_err(failed) });
        if let Err(e) = done.await {
            tracing::warn!(object = key, error = %e, "cannot delete an object from the store");
        }
    }
}

fn failed(e: object_store::Error) -> TierError {
    TierError::Failed(e.to_string())
}

/// Reads `len` bytes at `offset` of `file` on the blocking pool.
async fn read_at(file: Arc<File>, offset: u64, len: u64, path: &str) -> Result<Bytes, TierError> {
    let local = |why: String| TierError::Local { path: path.to_owned(), why };
    let n = usize::try_from(len).map_err(|e| local(e.to_string()))?;
    let read = tokio::task::spawn_blocking(move || {
        let mut buf = vec![0u8; n];
        file.read_exact_at(&mut buf, offset).map(|()| Bytes::from(buf))
    });
    read.await.map_err(|e| local(e.to_string()))?.map_err(|e| local(e.to_string()))
}
