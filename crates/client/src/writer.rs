//! The map side: records → per-partition batches → frames per server → pushes.
//!
//! With replication a batch goes to its partition's primary and replica. When a server fails for
//! good while a map attempt writes (see [`ClientError::is_server_failure`]), the writer gives up
//! on it for the rest of the attempt: later batches go to the other copy only and `MapperEnd`
//! goes to the live servers only, so the given-up server's partial copy of the map is never
//! reported complete (a server answers `DATA_LOST` for a map it has no `MapperEnd` of, and
//! readers fail over). The attempt fails only when a partition with data has lost both servers.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use sluice_proto::batch::{BatchHeader, BATCH_HEADER_LEN};
use sluice_proto::message::*;
use sluice_proto::ErrorCode;
use sluice_transport::Body;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

use crate::{
    backoff, copies_lost, expect_ok, server_addrs, ClientError, Parts, ServerFailure, ShuffleClient,
};

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
    /// Whether some partition has a replica: only then may the writer give up on a server.
    replicated: bool,
    /// Per server: why the writer gave up on it (code, text); `None` while it is live.
    given_up: Vec<Option<ServerFailure>>,
    /// Per server: flips to `true` when the writer gives up on it, so its pushes still in
    /// flight stop retrying at once instead of holding in-flight bytes through their back-offs.
    given_up_tx: Vec<watch::Sender<bool>>,
    /// Push tasks; each reports the server it pushed to with its outcome (the partitions a
    /// `PushSplit` named, if any).
    tasks: JoinSet<(usize, Result<Vec<u32>, ClientError>)>,
    /// The parts of split partitions (learned at start, and from `PushSplit` answers); a
    /// partition's batches go to its last part.
    parts: Parts,
    /// Per server, per partition: batches routed there (each server's `MapperEnd` counts).
    batches_to: Vec<Vec<u32>>,
    /// `PushSplit` answers not acted on yet: the server and its partitions.
    pending_splits: Vec<(usize, Vec<u32>)>,
    /// (partition, parts known) already asked to split: a hundred `PushSplit`s of the same
    /// part make one `SplitPartition`.
    asked: std::collections::HashSet<(u32, usize)>,
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
        let replicated = assignment.partitions.iter().any(|l| l.replica != NO_REPLICA);
        // Splits made before this attempt started: never push to a part that was left.
        let parts = client.splits_for_writer(&assignment).await;
        Ok(ShuffleWriter {
            parts,
            batches_to: vec![vec![0; n]; addrs.len()],
            pending_splits: Vec::new(),
            asked: Default::default(),
            merged: (0..addrs.len()).map(|_| Merged::default()).collect(),
            given_up: vec![None; addrs.len()],
            given_up_tx: (0..addrs.len()).map(|_| watch::Sender::new(false)).collect(),
            client,
            assignment,
            addrs,
            map_id,
            attempt_id,
            open: (0..n).map(|_| BytesMut::new()).collect(),
            next_batch: vec![0; n],
            bytes: vec![0; n],
            inflight: Arc::new(Semaphore::new(permits)),
            replicated,
            tasks: JoinSet::new(),
        })
    }

    /// Partition `partition`'s index in the writer's buffers; `INVALID_REQUEST` for one the
    /// shuffle does not have (as the server would answer).
    fn index_of(&self, partition: u32) -> Result<usize, ClientError> {
        let p = partition as usize;
        if p < self.open.len() {
            return Ok(p);
        }
        Err(ClientError::Server {
            code: ErrorCode::InvalidRequest,
            message: format!("partition {partition}: the shuffle has {}", self.open.len()),
        })
    }

    /// Appends one record (`u32` length + bytes) to a partition.
    pub async fn write_record(&mut self, partition: u32, record: &[u8]) -> Result<(), ClientError> {
        self.write_record_parts(partition, &[record]).await
    }

    /// Appends one record made of several slices (a key and a value, say), copied once each
    /// straight into the batch: the caller never assembles the record in a buffer of its own.
    /// The reader sees one record, the slices' concatenation.
    pub async fn write_record_parts(
        &mut self,
        partition: u32,
        parts: &[&[u8]],
    ) -> Result<(), ClientError> {
        let p = self.index_of(partition)?;
        let len: usize = parts.iter().map(|s| s.len()).sum();
        let need = 4 + len;
        // A record that does not fit the open batch's buffer closes the batch first: growing
        // the buffer would copy the whole batch into a new allocation twice its size.
        let open = &self.open[p];
        if open.len() > BATCH_HEADER_LEN && open.len() + need > open.capacity() {
            self.seal(p).await?;
        }
        let buf = &mut self.open[p];
        if buf.is_empty() {
            // Room for the batch and for the record that takes it past `batch_bytes`, if that
            // record is no larger than this one.
            buf.reserve(BATCH_HEADER_LEN + self.client.inner.opts.batch_bytes + need);
            buf.put_bytes(0, BATCH_HEADER_LEN);
        }
        buf.put_u32(len as u32);
        for part in parts {
            buf.put_slice(part);
        }
        if buf.len() >= self.client.inner.opts.batch_bytes {
            self.seal(p).await?;
        }
        Ok(())
    }

    /// Adds one ready-made batch payload (the caller made it self-contained), copied once into
    /// a buffer behind the batch's header. [`add_batch_bytes`](Self::add_batch_bytes) takes one
    /// the caller already holds as [`Bytes`] without copying it.
    pub async fn add_batch(&mut self, partition: u32, payload: &[u8]) -> Result<(), ClientError> {
        let p = self.index_of(partition)?;
        self.seal(p).await?;
        let mut buf = BytesMut::with_capacity(BATCH_HEADER_LEN + payload.len());
        buf.put_bytes(0, BATCH_HEADER_LEN);
        buf.put_slice(payload);
        self.open[p] = buf;
        self.seal(p).await
    }

    /// Adds one ready-made batch payload without copying it: a batch of 64 KiB or more goes out
    /// as its own push, its header and `payload` gathered into one `writev` (smaller ones are
    /// merged with others, which copies them). The writer holds `payload` until every copy of
    /// the batch is acknowledged.
    pub async fn add_batch_bytes(
        &mut self,
        partition: u32,
        payload: Bytes,
    ) -> Result<(), ClientError> {
        let p = self.index_of(partition)?;
        self.seal(p).await?;
        if payload.is_empty() {
            return Ok(());
        }
        let header = self.next_header(p, &payload);
        self.route_batch(p, Body::from(vec![Bytes::copy_from_slice(&header), payload])).await
    }

    /// The header of partition `p`'s next batch, counted as sealed.
    fn next_header(&mut self, p: usize, payload: &[u8]) -> [u8; BATCH_HEADER_LEN] {
        let header =
            BatchHeader::for_payload(self.map_id, self.attempt_id, self.next_batch[p], payload);
        self.next_batch[p] += 1;
        self.bytes[p] += (BATCH_HEADER_LEN + payload.len()) as u64;
        header.to_bytes()
    }

    /// Closes partition `p`'s open batch and routes it to its server.
    async fn seal(&mut self, p: usize) -> Result<(), ClientError> {
        if self.open[p].len() <= BATCH_HEADER_LEN {
            self.open[p].clear();
            return Ok(());
        }
        let mut batch = std::mem::take(&mut self.open[p]);
        let header = self.next_header(p, &batch[BATCH_HEADER_LEN..]);
        batch[..BATCH_HEADER_LEN].copy_from_slice(&header);
        self.route_batch(p, Body::Memory(batch.freeze())).await
    }

    /// Sends a sealed batch (header and payload, in one piece or two) to partition `p`'s
    /// server(s): alone as a `Push` when large, else merged into the server's next `PushMerged`.
    async fn route_batch(&mut self, p: usize, batch: Body) -> Result<(), ClientError> {
        let len = batch.len() as usize;
        // Learn about servers lost and partitions split meanwhile before routing the batch.
        self.reap()?;
        self.apply_splits().await;
        self.check_live_copy(p)?;
        // The primary, then the replica when the shuffle is replicated: both hold every batch,
        // unless the writer gave up on one of them.
        for server in servers_of(&self.route(p)) {
            if self.given_up[server].is_some() {
                continue;
            }
            self.batches_to[server][p] += 1;
            if len >= MERGE_BELOW_BYTES {
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
                length: len as u32,
            });
            for piece in batch.memory() {
                m.body.extend_from_slice(piece);
            }
            if m.body.len() >= self.client.inner.opts.push_frame_bytes {
                self.send_merged(server).await?;
            }
        }
        Ok(())
    }

    /// Where partition `p`'s batches go now: its last part.
    fn route(&self, p: usize) -> PartitionLoc {
        let parts = self.parts.of(&self.assignment, p as u32);
        parts.last().cloned().unwrap_or(PartitionLoc { primary: 0, replica: NO_REPLICA })
    }

    /// Acts on the `PushSplit` answers reaped: each partition whose *current* part's server
    /// answered so is split at a coordinator, once per part. A coordinator that cannot be
    /// reached leaves the partition where it is (the threshold is soft): logged, not failed.
    async fn apply_splits(&mut self) {
        for (server, partitions) in std::mem::take(&mut self.pending_splits) {
            for p in partitions {
                let parts = self.parts.of(&self.assignment, p);
                let Some(current) = parts.last() else { continue };
                if !servers_of(current).any(|s| s == server) || !self.asked.insert((p, parts.len()))
                {
                    continue; // an older part's server, or asked already
                }
                let (client, a) = (self.client.clone(), self.assignment.clone());
                match client.split_partition(&a, &mut self.parts, p, parts.len()).await {
                    Ok(()) => {
                        let now = self.parts.of(&a, p).len();
                        tracing::debug!(
                            partition = p,
                            parts = now,
                            map = self.map_id,
                            "partition split"
                        );
                    }
                    Err(e) => {
                        tracing::warn!(partition = p, error = %e,
                        "cannot split the partition; its batches stay on its current part")
                    }
                }
            }
        }
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
        self.send(server, msg.into(), Body::Memory(m.body.freeze())).await
    }

    /// Sends a push in the background once in-flight bytes allow it (dropped if the writer
    /// gives up on the server meanwhile).
    async fn send(&mut self, server: usize, msg: Message, body: Body) -> Result<(), ClientError> {
        // Fail fast: a push that failed for good fails the attempt or loses its server.
        self.reap()?;
        let units =
            (body.len() as usize).div_ceil(PERMIT_BYTES).clamp(1, self.inflight_capacity()) as u32;
        let permit =
            self.inflight.clone().acquire_many_owned(units).await.expect("semaphore never closed");
        // Waiting for in-flight bytes may have taken a while: look again.
        self.reap()?;
        if self.given_up[server].is_some() {
            return Ok(());
        }
        let client = self.client.clone();
        let addr = self.addrs[server];
        let mut given_up = self.given_up_tx[server].subscribe();
        self.tasks.spawn(async move {
            let _permit = permit;
            let result = tokio::select! {
                r = push_with_retries(&client, addr, msg, body) => r,
                // The writer no longer counts on this server: stop retrying. (Also when the
                // writer is dropped: the sender is gone.)
                _ = given_up.wait_for(|g| *g) => Ok(Vec::new()),
            };
            (server, result)
        });
        Ok(())
    }

    fn inflight_capacity(&self) -> usize {
        (self.client.inner.opts.max_inflight_bytes / PERMIT_BYTES).max(1)
    }

    /// Takes in the outcomes of the push tasks that have finished.
    fn reap(&mut self) -> Result<(), ClientError> {
        while let Some(done) = self.tasks.try_join_next() {
            let (server, result) =
                done.map_err(|e| ClientError::DataLost(format!("push task: {e}")))?;
            self.settle(server, result)?;
        }
        Ok(())
    }

    /// A request to `server` ended with `result` (retries, if any, done).
    fn settle(
        &mut self,
        server: usize,
        result: Result<Vec<u32>, ClientError>,
    ) -> Result<(), ClientError> {
        match result {
            Ok(split) if split.is_empty() => Ok(()),
            Ok(split) => {
                self.pending_splits.push((server, split));
                Ok(())
            }
            // Already given up on: its other requests' outcomes no longer matter.
            Err(_) if self.given_up[server].is_some() => Ok(()),
            Err(e) => self.give_up_on(server, e),
        }
    }

    /// `server` failed a request for good. Without replication, or when the failure is the
    /// request's own (it would fail on the other copy too), the attempt fails with it. Otherwise
    /// the writer goes on without the server, as long as every partition it wrote keeps a live
    /// copy.
    fn give_up_on(&mut self, server: usize, e: ClientError) -> Result<(), ClientError> {
        if !self.replicated || !e.is_server_failure() {
            return Err(e);
        }
        tracing::warn!(
            server = %self.addrs[server],
            shuffle = self.assignment.shuffle_id,
            map = self.map_id,
            attempt = self.attempt_id,
            error = %e,
            "server failed; this map attempt goes on with the other copy of its partitions"
        );
        self.given_up[server] = Some(ServerFailure::of(&e));
        self.given_up_tx[server].send_replace(true);
        self.merged[server] = Merged::default();
        for p in 0..self.next_batch.len() {
            if self.next_batch[p] > 0 {
                self.check_live_copy(p)?;
            }
        }
        Ok(())
    }

    /// Fails unless every part of partition `p` that holds its batches (and its current part)
    /// has a server the writer has not given up on.
    fn check_live_copy(&self, p: usize) -> Result<(), ClientError> {
        let parts = self.parts.of(&self.assignment, p as u32);
        for (i, loc) in parts.iter().enumerate() {
            let used = i + 1 == parts.len() || servers_of(loc).any(|s| self.batches_to[s][p] > 0);
            if !used || servers_of(loc).any(|s| self.given_up[s].is_none()) {
                continue;
            }
            return Err(copies_lost(p as u32, servers_of(loc), &self.addrs, |s| {
                self.given_up[s].clone()
            }));
        }
        Ok(())
    }

    /// Pushes everything left, waits for every acknowledgement, then reports the map's end to
    /// every server of the shuffle that the writer has not given up on. Returns the bytes
    /// pushed per partition.
    pub async fn finish(mut self) -> Result<Vec<u64>, ClientError> {
        for p in 0..self.open.len() {
            self.seal(p).await?;
        }
        for s in 0..self.merged.len() {
            self.send_merged(s).await?;
        }
        while let Some(done) = self.tasks.join_next().await {
            let (server, result) =
                done.map_err(|e| ClientError::DataLost(format!("push task: {e}")))?;
            self.settle(server, result)?;
        }
        // Nothing is left to route, but the next writers should find the new parts.
        self.apply_splits().await;
        let live: Vec<usize> =
            (0..self.addrs.len()).filter(|s| self.given_up[*s].is_none()).collect();
        let ends = live.iter().map(|&server| {
            // A live server holds every batch routed to it: each push to it was acknowledged,
            // or the writer would have given up on it.
            let batch_counts = self.batches_to[server]
                .iter()
                .enumerate()
                .filter(|(_, &n)| n > 0)
                .map(|(p, &n)| BatchCount { partition_id: p as u32, batches: n })
                .collect();
            let msg = MapperEnd {
                app_id: self.client.inner.app_id.clone(),
                shuffle_id: self.assignment.shuffle_id,
                map_id: self.map_id,
                attempt_id: self.attempt_id,
                batch_counts,
            };
            let (client, addr) = (self.client.clone(), self.addrs[server]);
            async move { (server, client.request_with_retries(addr, msg.into()).await) }
        });
        for (server, r) in futures_util::future::join_all(ends).await {
            let result = match r {
                Ok(Message::MapperEndResult(_)) => Ok(Vec::new()),
                Ok(_) => Err(ClientError::UnexpectedReply("MapperEnd wants MapperEndResult")),
                Err(e) => Err(e),
            };
            // A failed MapperEnd is a lost server like a failed push: tolerated while every
            // partition it holds data of has its other copy reported.
            self.settle(server, result)?;
        }
        Ok(self.bytes)
    }
}

/// Sends one push until it is acknowledged: `Busy` waits the suggested back-off at the server's
/// [`BusyGate`](crate::busy::BusyGate) (which limits the pushes a busy server is sent at once),
/// retriable errors back off exponentially; each kind has its own bound, so a dead server fails
/// the push within a few back-offs while a busy one is waited for.
async fn push_with_retries(
    client: &ShuffleClient,
    addr: SocketAddr,
    msg: Message,
    body: Body,
) -> Result<Vec<u32>, ClientError> {
    let opts = &client.inner.opts;
    let gate = client.inner.busy.get(addr);
    let still_busy = |n: u32| ClientError::Server {
        code: ErrorCode::Timeout,
        message: format!("{addr} still busy after {n} refusals"),
    };
    let (mut busy, mut errors) = (0u32, 0u32);
    loop {
        let pass = gate.enter(opts.busy_max_retries).await.map_err(still_busy)?;
        let result = async {
            let conn = client.inner.pool.get(addr).await?;
            expect_ok(conn.request(msg.clone(), body.clone()).await?)
        }
        .await;
        // The gate learns the outcome before the next push in its queue may go.
        match &result {
            Ok(Message::Busy(b)) => pass.refused(Duration::from_millis(b.backoff_ms as u64)),
            Ok(Message::PushAck(_) | Message::PushSplit(_)) => pass.acknowledged(),
            _ => pass.failed(),
        }
        match result {
            Ok(Message::PushAck(_)) => return Ok(Vec::new()),
            // Stored, and these partitions move on to a new part.
            Ok(Message::PushSplit(s)) => return Ok(s.partitions),
            Ok(Message::Busy(_)) => {
                busy += 1;
                if busy > opts.busy_max_retries {
                    return Err(still_busy(busy));
                }
                // The gate waits out the back-off.
            }
            Ok(_) => return Err(ClientError::UnexpectedReply("push wants PushAck or Busy")),
            Err(e) if e.is_retriable() && errors < opts.error_max_retries => {
                tracing::debug!(server = %addr, error = %e, errors, "push failed; retrying");
                errors += 1;
                tokio::time::sleep(backoff(opts.retry_backoff_ms, errors - 1)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Indexes of the servers that hold a partition: its primary, then its replica if any.
pub(crate) fn servers_of(loc: &PartitionLoc) -> impl Iterator<Item = usize> {
    let replica = (loc.replica != NO_REPLICA).then_some(loc.replica as usize);
    std::iter::once(loc.primary as usize).chain(replica)
}
