//! The map side: records → per-partition batches → frames per server → pushes.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use sluice_proto::batch::{BatchHeader, BATCH_HEADER_LEN};
use sluice_proto::message::*;
use sluice_proto::ErrorCode;
use sluice_transport::Body;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::{backoff, expect_ok, server_addrs, ClientError, ShuffleClient};

/// Batches below this size are merged with others into a `PushMerged` frame; larger ones go out
/// alone as `Push`, so their bytes are never copied again.
const MERGE_BELOW_BYTES: usize = 64 << 10;
/// Units of the in-flight semaphore.
const PERMIT_BYTES: usize = 1024;

#[derive(Default)]
struct Merged {
    body: BytesMut,
    sections: Vec<Section>,
}

/// Writes one map attempt's output.
pub struct ShuffleWriter {
    client: ShuffleClient,
    assignment: Arc<Assignment>,
    addrs: Vec<SocketAddr>,
    map_id: u32,
    attempt_id: u32,
    /// Per partition: the open batch, its first 20 bytes reserved for the header.
    open: Vec<BytesMut>,
    next_batch: Vec<u32>,
    bytes: Vec<u64>,
    merged: Vec<Merged>,
    inflight: Arc<Semaphore>,
    tasks: JoinSet<Result<(), ClientError>>,
}

impl ShuffleWriter {
    pub(crate) async fn new(
        client: ShuffleClient,
        assignment: Arc<Assignment>,
        map_id: u32,
        attempt_id: u32,
    ) -> Result<Self, ClientError> {
        let addrs = server_addrs(&assignment).await?;
        let n = assignment.partitions.len();
        let permits = (client.inner.opts.max_inflight_bytes / PERMIT_BYTES).max(1);
        Ok(ShuffleWriter {
            merged: (0..addrs.len()).map(|_| Merged::default()).collect(),
            client,
            assignment,
            addrs,
            map_id,
            attempt_id,
            open: (0..n).map(|_| BytesMut::new()).collect(),
            next_batch: vec![0; n],
            bytes: vec![0; n],
            inflight: Arc::new(Semaphore::new(permits)),
            tasks: JoinSet::new(),
        })
    }

    /// Appends one record (`u32` length + bytes) to a partition.
    pub async fn write_record(&mut self, partition: u32, record: &[u8]) -> Result<(), ClientError> {
        let p = partition as usize;
        let buf = &mut self.open[p];
        if buf.is_empty() {
            buf.reserve(self.client.inner.opts.batch_bytes + BATCH_HEADER_LEN);
            buf.put_bytes(0, BATCH_HEADER_LEN);
        }
        buf.put_u32(record.len() as u32);
        buf.put_slice(record);
        if buf.len() >= self.client.inner.opts.batch_bytes {
            self.seal(p).await?;
        }
        Ok(())
    }

    /// Adds one ready-made batch payload (the caller made it self-contained).
    pub async fn add_batch(&mut self, partition: u32, payload: &[u8]) -> Result<(), ClientError> {
        let p = partition as usize;
        self.seal(p).await?;
        let mut buf = BytesMut::with_capacity(BATCH_HEADER_LEN + payload.len());
        buf.put_bytes(0, BATCH_HEADER_LEN);
        buf.put_slice(payload);
        self.open[p] = buf;
        self.seal(p).await
    }

    /// Closes partition `p`'s open batch and routes it to its server.
    async fn seal(&mut self, p: usize) -> Result<(), ClientError> {
        if self.open[p].len() <= BATCH_HEADER_LEN {
            self.open[p].clear();
            return Ok(());
        }
        let mut batch = std::mem::take(&mut self.open[p]);
        let header = BatchHeader::for_payload(
            self.map_id,
            self.attempt_id,
            self.next_batch[p],
            &batch[BATCH_HEADER_LEN..],
        );
        batch[..BATCH_HEADER_LEN].copy_from_slice(&header.to_bytes());
        self.next_batch[p] += 1;
        self.bytes[p] += batch.len() as u64;
        let batch = batch.freeze();
        // The primary, then the replica when the shuffle is replicated: both hold every batch.
        for server in servers_of(&self.assignment.partitions[p]) {
            if batch.len() >= MERGE_BELOW_BYTES {
                let msg = Push {
                    app_id: self.client.inner.app_id.clone(),
                    shuffle_id: self.assignment.shuffle_id,
                    partition_id: p as u32,
                };
                self.send(server, msg.into(), batch.clone()).await?;
                continue;
            }
            let m = &mut self.merged[server];
            m.sections.push(Section {
                partition_id: p as u32,
                offset: m.body.len() as u32,
                length: batch.len() as u32,
            });
            m.body.extend_from_slice(&batch);
            if m.body.len() >= self.client.inner.opts.push_frame_bytes {
                self.send_merged(server).await?;
            }
        }
        Ok(())
    }

    async fn send_merged(&mut self, server: usize) -> Result<(), ClientError> {
        let m = std::mem::take(&mut self.merged[server]);
        if m.sections.is_empty() {
            return Ok(());
        }
        let msg = PushMerged {
            app_id: self.client.inner.app_id.clone(),
            shuffle_id: self.assignment.shuffle_id,
            entries: m.sections,
        };
        self.send(server, msg.into(), m.body.freeze()).await
    }

    /// Sends a push in the background once in-flight bytes allow it.
    async fn send(&mut self, server: usize, msg: Message, body: Bytes) -> Result<(), ClientError> {
        // Fail fast: a push that already failed makes the whole map attempt fail.
        while let Some(done) = self.tasks.try_join_next() {
            done.map_err(|e| ClientError::DataLost(format!("push task: {e}")))??;
        }
        let units = body.len().div_ceil(PERMIT_BYTES).clamp(1, self.inflight_capacity()) as u32;
        let permit =
            self.inflight.clone().acquire_many_owned(units).await.expect("semaphore never closed");
        let client = self.client.clone();
        let addr = self.addrs[server];
        self.tasks.spawn(async move {
            let _permit = permit;
            push_with_retries(&client, addr, msg, body).await
        });
        Ok(())
    }

    fn inflight_capacity(&self) -> usize {
        (self.client.inner.opts.max_inflight_bytes / PERMIT_BYTES).max(1)
    }

    /// Pushes everything left, waits for every acknowledgement, then reports the map's end to
    /// every server of the shuffle. Returns the bytes pushed per partition.
    pub async fn finish(mut self) -> Result<Vec<u64>, ClientError> {
        for p in 0..self.open.len() {
            self.seal(p).await?;
        }
        for s in 0..self.merged.len() {
            self.send_merged(s).await?;
        }
        while let Some(done) = self.tasks.join_next().await {
            done.map_err(|e| ClientError::DataLost(format!("push task: {e}")))??;
        }
        let mut per_server: Vec<Vec<BatchCount>> = vec![Vec::new(); self.addrs.len()];
        for (p, loc) in self.assignment.partitions.iter().enumerate() {
            if self.next_batch[p] > 0 {
                for server in servers_of(loc) {
                    per_server[server]
                        .push(BatchCount { partition_id: p as u32, batches: self.next_batch[p] });
                }
            }
        }
        let ends = per_server.into_iter().zip(&self.addrs).map(|(batch_counts, addr)| {
            let msg = MapperEnd {
                app_id: self.client.inner.app_id.clone(),
                shuffle_id: self.assignment.shuffle_id,
                map_id: self.map_id,
                attempt_id: self.attempt_id,
                batch_counts,
            };
            let client = self.client.clone();
            async move { client.request(*addr, msg.into()).await }
        });
        for r in futures_util::future::join_all(ends).await {
            match r? {
                Message::MapperEndResult(_) => {}
                _ => return Err(ClientError::UnexpectedReply("MapperEnd wants MapperEndResult")),
            }
        }
        Ok(self.bytes)
    }
}

/// Sends one push until it is acknowledged: `Busy` waits the suggested back-off, retriable
/// errors back off exponentially; each kind has its own bound, so a dead server fails the push
/// within a few back-offs while a busy one is waited for.
async fn push_with_retries(
    client: &ShuffleClient,
    addr: SocketAddr,
    msg: Message,
    body: Bytes,
) -> Result<(), ClientError> {
    let opts = &client.inner.opts;
    let (mut busy, mut errors) = (0u32, 0u32);
    loop {
        let result = async {
            let conn = client.inner.pool.get(addr).await?;
            expect_ok(conn.request(msg.clone(), Body::Memory(body.clone())).await?)
        }
        .await;
        let wait = match result {
            Ok(Message::PushAck(_)) => return Ok(()),
            Ok(Message::Busy(b)) => {
                busy += 1;
                if busy > opts.busy_max_retries {
                    return Err(ClientError::Server {
                        code: ErrorCode::Timeout,
                        message: format!("{addr} still busy after {busy} tries"),
                    });
                }
                std::time::Duration::from_millis(b.backoff_ms as u64)
            }
            Ok(_) => return Err(ClientError::UnexpectedReply("push wants PushAck or Busy")),
            Err(e) if e.is_retriable() && errors < opts.error_max_retries => {
                tracing::debug!(server = %addr, error = %e, errors, "push failed; retrying");
                errors += 1;
                backoff(opts.retry_backoff_ms, errors - 1)
            }
            Err(e) => return Err(e),
        };
        tokio::time::sleep(wait).await;
    }
}

/// Indexes of the servers that hold a partition: its primary, then its replica if any.
pub(crate) fn servers_of(loc: &PartitionLoc) -> impl Iterator<Item = usize> {
    let replica = (loc.replica != NO_REPLICA).then_some(loc.replica as usize);
    std::iter::once(loc.primary as usize).chain(replica)
}
