//! The reduce side: one partition over a map range, verified batch by batch.

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::SocketAddr;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use sluice_proto::batch::{crc32c, split_batches};
use sluice_proto::message::*;
use sluice_proto::ErrorCode;
use sluice_transport::Body;

use crate::writer::servers_of;
use crate::{expect_ok, server_addrs, ClientError, ShuffleClient};

type ChunkFuture = BoxFuture<'static, Result<Bytes, ClientError>>;

/// Reads the chunk `at` names from the server's file here (host-local reads): the file must be
/// the server's one (a regular file, device and inode from the open file), its spans must add up
/// to the `expect` bytes the stream's handle gave for the chunk and hold them, and it must still
/// be at its path once read (a deleted shuffle's files are moved away before they are reused for
/// other data). A chunk over `most` bytes (the frame limit: no chunk is larger) is refused.
/// Blocking (but an open never waits: not on a FIFO put at the path, not through a symlink).
fn read_local(at: &ChunkLocal, expect: u32, most: usize) -> Result<Bytes, String> {
    use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
    let same = |m: &std::fs::Metadata, what: &str| {
        if (m.dev(), m.ino()) == (at.device, at.inode) {
            return Ok(());
        }
        Err(format!(
            "{} {what} (device {}, inode {} against {}, {})",
            at.path,
            m.dev(),
            m.ino(),
            at.device,
            at.inode
        ))
    };
    let len: usize = at.spans.iter().map(|s| s.length as usize).sum();
    if len != expect as usize {
        return Err(format!(
            "{}: spans of {len} bytes where the stream's chunk has {expect}",
            at.path
        ));
    }
    if len > most {
        return Err(format!("{}: spans of {len} bytes, over the {most}-byte frames", at.path));
    }
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
        .open(&at.path)
        .map_err(|e| format!("{}: {e}", at.path))?;
    let m = f.metadata().map_err(|e| format!("{}: {e}", at.path))?;
    if !m.is_file() {
        return Err(format!("{}: not a regular file", at.path));
    }
    same(&m, "is another file here")?;
    let mut buf = vec![0u8; len];
    let mut filled = 0;
    for s in &at.spans {
        let end = filled + s.length as usize;
        f.read_exact_at(&mut buf[filled..end], s.offset)
            .map_err(|e| format!("{} [{}, +{}): {e}", at.path, s.offset, s.length))?;
        filled = end;
    }
    same(
        &std::fs::metadata(&at.path).map_err(|e| format!("{} after the read: {e}", at.path))?,
        "was moved or replaced while read",
    )?;
    Ok(Bytes::from(buf))
}

/// Reads one partition's batches for maps `[map_start, map_end)`: each of its parts in turn
/// when it was split (docs/protocol.md, "Partition splits"), each part checked on its own.
pub struct PartitionReader {
    client: ShuffleClient,
    /// Servers holding the part read now (primary, then replica) and the one read now.
    candidates: Vec<SocketAddr>,
    /// The parts still to read after this one, each as its servers.
    parts_left: VecDeque<Vec<SocketAddr>>,
    /// map → the attempt every part read so far committed (checked when no attempts are
    /// named: parts must agree).
    winners: HashMap<u32, u32>,
    current: usize,
    open_msg: OpenStream,
    addr: SocketAddr,
    stream_id: u64,
    map_start: u32,
    map_end: u32,
    /// map → (committed attempt, batches expected).
    committed: HashMap<u32, (u32, u32)>,
    /// (map, batch id) read in the current part: its completeness check.
    seen: HashSet<(u32, u32)>,
    /// (map, batch id) delivered from any part: a batch read twice (two copies of a part,
    /// when the parts are unknown and every server is read) is delivered once.
    delivered: HashSet<(u32, u32)>,
    next_chunk: u32,
    chunk_count: u32,
    /// The length of each chunk of the stream read now, as its handle gave them.
    chunk_lengths: std::sync::Arc<[u32]>,
    inflight: VecDeque<ChunkFuture>,
    ready: VecDeque<Bytes>,
    finished: bool,
    /// Streams re-opened on the same server after it forgot them (it restarted).
    reopened: u32,
    /// Payload bytes delivered.
    pub bytes_read: u64,
    /// Batches delivered.
    pub batches_read: u64,
    /// Batches dropped: duplicates, uncommitted attempts, maps outside the range.
    pub batches_dropped: u64,
}

impl PartitionReader {
    pub(crate) async fn open(
        client: ShuffleClient,
        a: &Assignment,
        partition: u32,
        map_start: u32,
        map_end: u32,
        attempts: Vec<MapAttempt>,
    ) -> Result<Self, ClientError> {
        if map_start > map_end {
            // Sent as is, the server's decoder would call the frame malformed and close a shared
            // connection; this is the caller's mistake, so say so here.
            return Err(ClientError::Server {
                code: ErrorCode::InvalidRequest,
                message: format!("map range [{map_start}, {map_end}) is backwards"),
            });
        }
        if a.partitions.get(partition as usize).is_none() {
            return Err(ClientError::Server {
                code: ErrorCode::InvalidRequest,
                message: format!("partition {partition} not in the assignment"),
            });
        }
        let addrs = server_addrs(a).await?;
        // The first part is the assignment's entry, split or not: opened first, which waits
        // for the commit, and only then are the parts asked for (and kept): a list asked
        // before the commit could miss a part made after it.
        let first = a.partitions[partition as usize].clone();
        let candidates: Vec<SocketAddr> = servers_of(&first).map(|i| addrs[i]).collect();
        let open_msg = OpenStream {
            app_id: client.inner.app_id.clone(),
            shuffle_id: a.shuffle_id,
            partition_id: partition,
            map_start,
            map_end,
            attempts,
        };
        if let Err(e) = open_msg.validate() {
            // Names out of order or outside the range: as for a backwards range, refused here
            // rather than as a malformed frame that closes a shared connection.
            return Err(ClientError::Server {
                code: ErrorCode::InvalidRequest,
                message: format!("partition {partition}: {e}"),
            });
        }
        let (current, handle) = open_any(&client, &candidates, &open_msg).await?;
        let splits = client.committed_splits(a).await?;
        let parts = splits.of(a, partition);
        let parts_left: VecDeque<Vec<SocketAddr>> = parts
            .iter()
            .filter(|loc| **loc != first)
            .map(|loc| servers_of(loc).map(|i| addrs[i]).collect())
            .collect();
        let addr = candidates[current];
        let mut r = PartitionReader {
            client,
            candidates,
            parts_left,
            winners: HashMap::new(),
            current,
            open_msg,
            addr,
            stream_id: handle.stream_id,
            map_start,
            map_end,
            committed: handle
                .committed
                .iter()
                .map(|c| (c.map_id, (c.attempt_id, c.batches)))
                .collect(),
            seen: HashSet::new(),
            delivered: HashSet::new(),
            next_chunk: 0,
            chunk_count: handle.chunk_lengths.len() as u32,
            chunk_lengths: handle.chunk_lengths.into(),
            inflight: VecDeque::new(),
            ready: VecDeque::new(),
            finished: false,
            reopened: 0,
            bytes_read: 0,
            batches_read: 0,
            batches_dropped: 0,
        };
        r.check_winners()?;
        r.fill();
        Ok(r)
    }

    /// Without named attempts, each part's server chose each map's winning attempt itself:
    /// they must agree, or the partition would mix two attempts' records.
    fn check_winners(&mut self) -> Result<(), ClientError> {
        if !self.open_msg.attempts.is_empty() {
            return Ok(());
        }
        for (&m, &(attempt, _)) in &self.committed {
            match self.winners.insert(m, attempt) {
                Some(w) if w != attempt => {
                    return Err(ClientError::DataLost(format!(
                        "map {m}: attempt {w} committed in one part of partition {}, attempt {attempt} in another (on {})",
                        self.open_msg.partition_id, self.addr
                    )))
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// The current part is read whole: on to the next one, if any (`false`: none left).
    async fn next_part(&mut self) -> Result<bool, ClientError> {
        let Some(candidates) = self.parts_left.pop_front() else {
            return Ok(false);
        };
        let (current, handle) = open_any(&self.client, &candidates, &self.open_msg).await?;
        self.addr = candidates[current];
        self.candidates = candidates;
        self.current = current;
        self.stream_id = handle.stream_id;
        self.committed =
            handle.committed.iter().map(|c| (c.map_id, (c.attempt_id, c.batches))).collect();
        self.seen.clear();
        self.next_chunk = 0;
        self.chunk_count = handle.chunk_lengths.len() as u32;
        self.chunk_lengths = handle.chunk_lengths.into();
        self.inflight.clear();
        self.finished = false;
        self.reopened = 0;
        self.check_winners()?;
        self.fill();
        Ok(true)
    }

    /// Keeps up to `fetch_prefetch_chunks` fetches in flight.
    fn fill(&mut self) {
        let depth = self.client.inner.opts.fetch_prefetch_chunks.max(1);
        while self.inflight.len() < depth && self.next_chunk < self.chunk_count {
            let (client, addr, stream_id, chunk_index) =
                (self.client.clone(), self.addr, self.stream_id, self.next_chunk);
            let expect = self.chunk_lengths.get(chunk_index as usize).copied().unwrap_or(0);
            let fut = tokio::spawn(async move {
                let conn = client.inner.pool.get(addr).await?;
                if conn.offers_host_local_reads()
                    && conn.peer_on_this_host()
                    && client.inner.reads_files_of(addr)
                {
                    let ask = FetchChunkLocal { stream_id, chunk_index };
                    let reply = conn.request(ask.into(), Body::Empty).await?;
                    let body = reply.body.clone();
                    let most = conn.max_frame_bytes() as usize;
                    match expect_ok(reply)? {
                        // The server sends the bytes of a chunk it cannot name a file of.
                        Message::ChunkData(c) if c.chunk_index == chunk_index => return Ok(body),
                        Message::ChunkLocal(at)
                            if at.chunk_index == chunk_index && at.stream_id == stream_id =>
                        {
                            let path = at.path.clone();
                            let read =
                                tokio::task::spawn_blocking(move || read_local(&at, expect, most));
                            match read.await {
                                Ok(Ok(bytes)) => {
                                    client.inner.file_read(addr);
                                    return Ok(bytes);
                                }
                                Ok(Err(e)) => client.inner.file_read_failed(addr, &e),
                                Err(e) => {
                                    client.inner.file_read_failed(addr, &format!("{path}: {e}"))
                                }
                            }
                        }
                        _ => {
                            return Err(ClientError::UnexpectedReply(
                                "FetchChunkLocal wants ChunkLocal or ChunkData",
                            ))
                        }
                    }
                }
                let reply =
                    conn.request(FetchChunk { stream_id, chunk_index }.into(), Body::Empty).await?;
                let body = reply.body.clone();
                match expect_ok(reply)? {
                    Message::ChunkData(c) if c.chunk_index == chunk_index => Ok(body),
                    _ => Err(ClientError::UnexpectedReply("FetchChunk wants ChunkData")),
                }
            });
            self.inflight.push_back(
                async move { fut.await.map_err(|e| ClientError::DataLost(format!("fetch task: {e}")))? }.boxed(),
            );
            self.next_chunk += 1;
        }
    }

    /// The next verified batch payload, or `None` at the end of the partition. At the end it
    /// checks that every committed map delivered exactly the batches it reported; batches missing
    /// from one copy are read from the other (those already delivered are skipped by id).
    pub async fn next_batch(&mut self) -> Result<Option<Bytes>, ClientError> {
        loop {
            if let Some(b) = self.ready.pop_front() {
                return Ok(Some(b));
            }
            let Some(fut) = self.inflight.pop_front() else {
                if self.finished {
                    return Ok(None);
                }
                match self.missing() {
                    None => {
                        self.finish().await;
                        if self.next_part().await? {
                            continue;
                        }
                        return Ok(None);
                    }
                    Some(e) => {
                        self.fail_over(e).await?;
                        continue;
                    }
                }
            };
            let chunk = match fut.await {
                Ok(c) => c,
                Err(e) => {
                    self.fail_over(e).await?;
                    continue;
                }
            };
            self.fill();
            let batches = match split_batches(&chunk) {
                Ok(b) => b,
                Err(e) => {
                    self.fail_over(ClientError::Corrupt(e.to_string())).await?;
                    continue;
                }
            };
            if let Some((h, _)) = batches.iter().find(|(h, p)| crc32c(p) != h.crc32c) {
                let e = ClientError::Corrupt(format!(
                    "batch {} of map {} attempt {}: CRC32C mismatch",
                    h.batch_id, h.map_id, h.attempt_id
                ));
                self.fail_over(e).await?;
                continue;
            }
            for (h, payload) in batches {
                let keep = (self.map_start..self.map_end).contains(&h.map_id)
                    && self.committed.get(&h.map_id).is_some_and(|(a, _)| *a == h.attempt_id)
                    && self.seen.insert((h.map_id, h.batch_id))
                    && self.delivered.insert((h.map_id, h.batch_id));
                if keep {
                    self.bytes_read += payload.len() as u64;
                    self.batches_read += 1;
                    self.ready.push_back(payload);
                } else {
                    self.batches_dropped += 1;
                }
            }
        }
    }

    /// After a failure on the current server: re-open the stream on the next server holding
    /// the partition, or give up with `err` when none is left. Batches already delivered are
    /// recognised by their ids and skipped; the committed attempts stay those first read.
    ///
    /// A server that answers `UNKNOWN_STREAM` restarted since the stream was opened (streams are
    /// not kept across restarts, committed data is): the stream is opened again on the same
    /// server first, a few times at most; if that open fails (the restarted server lost the
    /// partition, say), the next copy is tried, as for any failure.
    async fn fail_over(&mut self, mut err: ClientError) -> Result<(), ClientError> {
        // Closed once, on the server it is open on (its id means nothing on another, where it
        // may name another stream of this application: `addr` changes only once one opens).
        self.close_current();
        let mut from = self.addr;
        let handle = loop {
            let restarted = err.code() == ErrorCode::UnknownStream && self.reopened < MAX_REOPENS;
            if !restarted && self.current + 1 >= self.candidates.len() {
                return Err(err);
            }
            if restarted {
                self.reopened += 1;
            } else {
                self.current += 1;
            }
            let next = self.candidates[self.current];
            if restarted {
                tracing::info!(server = %next, "the server forgot the stream (restarted?); opening it again");
            } else {
                tracing::warn!(from = %from, to = %next, error = %err, "reading from the replica");
            }
            match open_on(&self.client, next, &self.open_msg).await {
                Ok(handle) => break handle,
                Err(e) => {
                    from = next;
                    err = e;
                }
            }
        };
        let next = self.candidates[self.current];
        self.addr = next;
        self.stream_id = handle.stream_id;
        self.chunk_count = handle.chunk_lengths.len() as u32;
        self.chunk_lengths = handle.chunk_lengths.into();
        self.next_chunk = 0;
        self.inflight.clear();
        self.fill();
        Ok(())
    }

    /// `DATA_LOST` naming the first committed map whose batches are not all delivered, if any.
    fn missing(&self) -> Option<ClientError> {
        let mut got: HashMap<u32, u32> = HashMap::new();
        for (m, _) in &self.seen {
            *got.entry(*m).or_default() += 1;
        }
        let mut maps: Vec<_> = self.committed.iter().collect();
        maps.sort_unstable();
        maps.into_iter().find_map(|(m, (attempt, want))| {
            let have = got.get(m).copied().unwrap_or(0);
            (have != *want).then(|| {
                ClientError::DataLost(format!(
                    "map {m} attempt {attempt}: {have} of {want} batches found on {}",
                    self.addr
                ))
            })
        })
    }

    async fn finish(&mut self) {
        self.finished = true;
        let _ =
            self.client.request(self.addr, CloseStream { stream_id: self.stream_id }.into()).await;
    }

    /// Closes the current server's stream in the background (best effort; the server also
    /// drops it when idle).
    fn close_current(&self) {
        let (client, addr, stream_id) = (self.client.clone(), self.addr, self.stream_id);
        if let Ok(h) = tokio::runtime::Handle::try_current() {
            h.spawn(async move {
                let _ = client.request(addr, CloseStream { stream_id }.into()).await;
            });
        }
    }
}

impl Drop for PartitionReader {
    fn drop(&mut self) {
        // Pending fetches are tasks; abort by dropping their futures. The server drops the
        // stream when the connection closes or on CloseStream; send it if still open.
        if !self.finished {
            self.close_current();
        }
    }
}

/// How many times a reader opens its stream again on a server that forgot it (see
/// `PartitionReader::fail_over`).
const MAX_REOPENS: u32 = 3;

/// Opens a stream on the first of `candidates` (a part's primary, then its replica) that
/// opens it; returns which one with its handle.
async fn open_any(
    client: &ShuffleClient,
    candidates: &[SocketAddr],
    open: &OpenStream,
) -> Result<(usize, StreamHandle), ClientError> {
    let mut current = 0;
    loop {
        match open_on(client, candidates[current], open).await {
            Ok(h) => return Ok((current, h)),
            Err(e) if current + 1 < candidates.len() => {
                tracing::warn!(server = %candidates[current], error = %e, "opening on the replica");
                current += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Opens a stream on one server, retrying retriable failures (e.g. not committed yet).
async fn open_on(
    client: &ShuffleClient,
    addr: SocketAddr,
    open: &OpenStream,
) -> Result<StreamHandle, ClientError> {
    match client.request_with_retries(addr, open.clone().into()).await? {
        Message::StreamHandle(h) => Ok(h),
        _ => Err(ClientError::UnexpectedReply("OpenStream wants StreamHandle")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    /// The whole of `real` as a server would name it at `named`: its device and inode.
    fn chunk_of(named: &std::path::Path, real: &std::path::Path, len: u32) -> ChunkLocal {
        let m = std::fs::metadata(real).unwrap();
        ChunkLocal {
            stream_id: 1,
            chunk_index: 0,
            path: named.to_str().unwrap().to_owned(),
            device: m.dev(),
            inode: m.ino(),
            spans: vec![FileSpan { offset: 0, length: len }],
        }
    }

    #[test]
    fn a_regular_file_is_read_and_anything_else_refused_without_waiting() {
        let dir = tempfile::tempdir().unwrap();
        let data = b"the chunk's bytes";
        let n = data.len() as u32;
        let file = dir.path().join("0-0.data");
        std::fs::write(&file, data).unwrap();
        assert_eq!(read_local(&chunk_of(&file, &file, n), n, 1 << 20).unwrap(), &data[..]);

        let e = read_local(&chunk_of(&file, &file, n), n + 1, 1 << 20).unwrap_err();
        assert!(e.contains("where the stream's chunk has"), "{e}");
        let e = read_local(&chunk_of(&file, &file, n), n, 4).unwrap_err();
        assert!(e.contains("over the 4-byte frames"), "{e}");

        // A symlink to the very file (its device and inode behind it): not followed.
        let link = dir.path().join("link.data");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        assert!(read_local(&chunk_of(&link, &file, n), n, 1 << 20).is_err());

        // A FIFO: a plain open for reading would wait for a writer for ever.
        let fifo = dir.path().join("fifo.data");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
        let (tx, rx) = std::sync::mpsc::channel();
        let at = chunk_of(&fifo, &fifo, n);
        std::thread::spawn(move || tx.send(read_local(&at, n, 1 << 20)));
        let got = rx.recv_timeout(std::time::Duration::from_secs(10)).expect("the open waited");
        let e = got.unwrap_err();
        assert!(e.contains("not a regular file"), "{e}");
    }
}
