//! The outbound side of one connection: a queue of frames bounded by watermarks, and the one
//! writer task that drains it.
//!
//! Producers (request handlers on a server, requesters on a client) queue [`OutFrame`]s through
//! an [`Outbound`]. The writer gathers queued heads and memory bodies into one `writev` (at most
//! `max_frames_per_write` frames, `IOV_MAX` iovecs, `max_bytes_per_write` bytes) and sends file
//! bodies with `sendfile(2)` straight from the page cache, resuming partial writes and waiting
//! for socket writability on `EAGAIN`. With zero copy off (or `sendfile` unavailable) file bodies
//! go through a reusable buffer with `pread` + `write` instead.
//!
//! Backpressure follows Netty's `ChannelOutboundBuffer` water marks: in-memory bytes queued above
//! the high mark make [`Outbound::send`] wait until the writer has drained them to the low mark.
//! File bodies are not in memory, so they count by frame (`max_file_frames`) rather than by byte.

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use sluice_proto::{encode_head, ErrorCode, Message, ProtoError};
use tokio::io::{AsyncWriteExt, Interest};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::body::{Body, FileRegion};
use crate::config::{ClientConfig, ServerConfig, IOV_MAX};
use crate::error::TransportError;
use crate::stats::TransportStats;
use crate::stream::Sink;
use crate::sys;

/// Bytes a writer moves before it yields to the runtime, so one busy connection cannot starve
/// the other tasks of its worker thread.
const YIELD_EVERY_BYTES: u64 = 16 << 20;

/// How a writer batches, bounds and sends.
#[derive(Debug, Clone)]
pub struct WriterOptions {
    /// Queued in-memory bytes above which producers wait.
    pub high_watermark_bytes: usize,
    /// Queued in-memory bytes at which waiting producers resume.
    pub low_watermark_bytes: usize,
    /// Most queued file-body frames; producers wait beyond it.
    pub max_file_frames: usize,
    /// Most frames per `writev` (1 = one write per frame).
    pub max_frames_per_write: usize,
    /// Most bytes gathered per `writev`.
    pub max_bytes_per_write: usize,
    /// `sendfile` for file bodies (else the copy path).
    pub zero_copy: bool,
    /// Size of the copy path's buffer.
    pub copy_buffer_bytes: usize,
    /// Drop the connection when a write makes no progress for this long.
    pub idle_timeout: Option<Duration>,
}

impl From<&ServerConfig> for WriterOptions {
    fn from(c: &ServerConfig) -> Self {
        WriterOptions {
            high_watermark_bytes: c.outbound_high_watermark_bytes,
            low_watermark_bytes: c.outbound_low_watermark_bytes,
            max_file_frames: c.outbound_max_file_frames,
            max_frames_per_write: c.max_frames_per_write,
            max_bytes_per_write: c.max_bytes_per_write,
            zero_copy: c.zero_copy,
            copy_buffer_bytes: c.copy_buffer_bytes,
            idle_timeout: millis(c.idle_timeout_ms),
        }
    }
}

impl From<&ClientConfig> for WriterOptions {
    fn from(c: &ClientConfig) -> Self {
        WriterOptions {
            high_watermark_bytes: c.outbound_high_watermark_bytes,
            low_watermark_bytes: c.outbound_low_watermark_bytes,
            max_file_frames: 64,
            max_frames_per_write: c.max_frames_per_write,
            max_bytes_per_write: c.max_bytes_per_write,
            zero_copy: true,
            copy_buffer_bytes: 256 << 10,
            idle_timeout: millis(c.idle_timeout_ms),
        }
    }
}

/// `Some(ms)` unless 0 ("disabled").
pub(crate) fn millis(ms: u64) -> Option<Duration> {
    (ms > 0).then(|| Duration::from_millis(ms))
}

/// One frame waiting to be written: its encoded head (header + fields) and its body, kept apart.
#[derive(Debug)]
pub struct OutFrame {
    request_id: u32,
    head: Bytes,
    body: Body,
    /// Progress of the front frame.
    head_off: usize,
    body_off: u64,
    /// What this frame holds against the watermarks (fixed at queueing).
    mem_bytes: usize,
    file_frames: usize,
}

impl OutFrame {
    /// Encodes the head of `message` for a body of `body.len()` bytes.
    pub fn new(
        request_id: u32,
        message: &Message,
        body: Body,
        max_frame_bytes: u32,
    ) -> Result<Self, ProtoError> {
        let mut head = BytesMut::with_capacity(64);
        encode_head(request_id, message, body.len(), max_frame_bytes, &mut head)?;
        let head = head.freeze();
        let mem_bytes = head.len() + body.memory().iter().map(Bytes::len).sum::<usize>();
        let file_frames = body.is_file() as usize;
        Ok(OutFrame { request_id, head, body, head_off: 0, body_off: 0, mem_bytes, file_frames })
    }

    /// An `Error` frame (small, always encodable).
    pub fn error(request_id: u32, code: ErrorCode, text: impl Into<String>) -> Self {
        let msg = Message::error(code, text);
        OutFrame::new(request_id, &msg, Body::Empty, u32::MAX)
            .expect("an error frame fits in a frame")
    }

    /// Total bytes this frame puts on the wire.
    pub fn wire_len(&self) -> u64 {
        self.head.len() as u64 + self.body.len()
    }

    fn head_done(&self) -> bool {
        self.head_off == self.head.len()
    }

    fn done(&self) -> bool {
        self.head_done() && self.body_off == self.body.len()
    }
}

enum Item {
    Frame(OutFrame),
    /// Frames queued before this go out; then the writer ends.
    Close,
}

/// Watermark state of one connection's queue. A std mutex: held for a few instructions, never
/// across an await.
struct Gate {
    mem_bytes: usize,
    file_frames: usize,
    writable: bool,
    closed: Option<String>,
}

struct Shared {
    gate: Mutex<Gate>,
    /// Mirrors `Gate::writable`, for producers to wait on; written under the gate lock.
    writable: watch::Sender<bool>,
    opts: WriterOptions,
    stats: Arc<TransportStats>,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Gate> {
        // A panic while holding this lock leaves only counters behind; keep going.
        self.gate.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Accounts for frames that left the queue (written or dropped) and reopens the gate below
    /// the low mark.
    fn release(&self, mem: usize, files: usize) {
        if mem == 0 && files == 0 {
            return;
        }
        let mut g = self.lock();
        g.mem_bytes -= mem;
        g.file_frames -= files;
        if !g.writable
            && g.mem_bytes <= self.opts.low_watermark_bytes
            && g.file_frames <= self.opts.max_file_frames / 2
        {
            g.writable = true;
            self.writable.send_replace(true);
        }
        drop(g);
        TransportStats::sub(&self.stats.outbound_queued_bytes, mem as u64);
        if files > 0 {
            TransportStats::sub(&self.stats.outbound_queued_file_frames, files as u64);
        }
    }
}

impl Drop for Shared {
    /// Frames still queued when the queue goes (its writer stopped before sending them) leave
    /// the stats with it.
    fn drop(&mut self) {
        let g = self.lock();
        TransportStats::sub(&self.stats.outbound_queued_bytes, g.mem_bytes as u64);
        TransportStats::sub(&self.stats.outbound_queued_file_frames, g.file_frames as u64);
    }
}

/// The producer handle of a connection's outbound queue. Cheap to clone.
#[derive(Clone)]
pub struct Outbound {
    tx: mpsc::UnboundedSender<Item>,
    shared: Arc<Shared>,
}

impl Outbound {
    /// Starts the writer task for `wr` and returns the queue feeding it and the task's handle,
    /// which ends with `Ok` after [`Outbound::close`] (or when every `Outbound` is dropped) once
    /// the queue is flushed, or with the error that broke the connection.
    pub fn start(
        wr: impl Into<Sink>,
        opts: WriterOptions,
        stats: Arc<TransportStats>,
    ) -> (Outbound, JoinHandle<Result<(), TransportError>>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let (writable, _) = watch::channel(true);
        let gate = Gate { mem_bytes: 0, file_frames: 0, writable: true, closed: None };
        let shared = Arc::new(Shared { gate: Mutex::new(gate), writable, opts, stats });
        let writer = Writer::new(wr.into(), shared.clone());
        let handle = tokio::spawn(writer.run(rx));
        (Outbound { tx, shared }, handle)
    }

    /// Queues a frame, first waiting while the queue is above its high watermark (until the
    /// writer drains it to the low one). Fails once the writer has stopped.
    pub async fn send(&self, frame: OutFrame) -> Result<(), TransportError> {
        let mut frame = Some(frame);
        loop {
            let mut writable = {
                let mut g = self.shared.lock();
                if let Some(reason) = &g.closed {
                    return Err(TransportError::Closed(reason.clone()));
                }
                if g.writable {
                    let f = frame.take().expect("frame queued once");
                    return self.push_locked(&mut g, Item::Frame(f));
                }
                self.shared.writable.subscribe()
            };
            TransportStats::add(&self.shared.stats.outbound_waits, 1);
            if writable.wait_for(|w| *w).await.is_err() {
                return Err(TransportError::Closed("writer stopped".into()));
            }
        }
    }

    /// Queues a frame if the queue is under its high watermark; `Ok(false)` (the frame dropped)
    /// if it is not: for an answer that may be left out rather than wait (a pong read by a task
    /// that must never block, or the queue grow).
    pub fn send_if_room(&self, frame: OutFrame) -> Result<bool, TransportError> {
        let mut g = self.shared.lock();
        if let Some(reason) = &g.closed {
            return Err(TransportError::Closed(reason.clone()));
        }
        if !g.writable {
            return Ok(false);
        }
        self.push_locked(&mut g, Item::Frame(frame)).map(|()| true)
    }

    /// Queues a frame now, ignoring the watermarks: for small control frames that must not
    /// wait behind data and come at most once per connection (handshake replies, fatal
    /// errors), never one per request a peer may send without end.
    pub fn send_now(&self, frame: OutFrame) -> Result<(), TransportError> {
        let mut g = self.shared.lock();
        if let Some(reason) = &g.closed {
            return Err(TransportError::Closed(reason.clone()));
        }
        self.push_locked(&mut g, Item::Frame(frame))
    }

    fn push_locked(&self, g: &mut Gate, item: Item) -> Result<(), TransportError> {
        let (mem, files) = match &item {
            Item::Frame(f) => (f.mem_bytes, f.file_frames),
            Item::Close => (0, 0),
        };
        g.mem_bytes += mem;
        g.file_frames += files;
        let opts = &self.shared.opts;
        if g.writable
            && (g.mem_bytes > opts.high_watermark_bytes || g.file_frames >= opts.max_file_frames)
        {
            g.writable = false;
            self.shared.writable.send_replace(false);
        }
        let stats = &self.shared.stats;
        TransportStats::add(&stats.outbound_queued_bytes, mem as u64);
        if files > 0 {
            TransportStats::add(&stats.outbound_queued_file_frames, files as u64);
        }
        TransportStats::max(&stats.outbound_queued_bytes_peak, g.mem_bytes as u64);
        if self.tx.send(item).is_err() {
            g.mem_bytes -= mem;
            g.file_frames -= files;
            TransportStats::sub(&stats.outbound_queued_bytes, mem as u64);
            TransportStats::sub(&stats.outbound_queued_file_frames, files as u64);
            return Err(TransportError::Closed("writer stopped".into()));
        }
        Ok(())
    }

    /// Asks the writer to finish: frames queued so far are sent, later ones are refused.
    pub fn close(&self) {
        let mut g = self.shared.lock();
        if g.closed.is_none() {
            let _ = self.push_locked(&mut g, Item::Close);
            g.closed = Some("connection closing".into());
        }
    }

    /// Whether the writer has stopped (or is stopping) and refuses frames.
    pub fn is_closed(&self) -> bool {
        self.shared.lock().closed.is_some()
    }

    /// In-memory bytes queued now on this connection.
    pub fn queued_bytes(&self) -> usize {
        self.shared.lock().mem_bytes
    }
}

/// The writer task's state.
struct Writer {
    wr: Sink,
    shared: Arc<Shared>,
    queue: VecDeque<OutFrame>,
    /// Cleared for good when `sendfile` turns out to be unavailable on this socket.
    zero_copy: bool,
    copy_buf: Vec<u8>,
    /// `copy_buf[copy_pos..copy_end]` is read from the file but not yet written.
    copy_pos: usize,
    copy_end: usize,
    since_yield: u64,
}

impl Writer {
    fn new(wr: Sink, shared: Arc<Shared>) -> Self {
        // Under TLS in user space the socket must only see ciphertext: file bodies are read and
        // encrypted, never handed to `sendfile`.
        let zero_copy = shared.opts.zero_copy && !wr.is_tls();
        Writer {
            wr,
            shared,
            queue: VecDeque::new(),
            zero_copy,
            copy_buf: Vec::new(),
            copy_pos: 0,
            copy_end: 0,
            since_yield: 0,
        }
    }

    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Item>) -> Result<(), TransportError> {
        let result = self.pump(&mut rx).await;
        // Stop accepting frames, then release what is still queued.
        {
            let mut g = self.shared.lock();
            if g.closed.is_none() || result.is_err() {
                g.closed = Some(match &result {
                    Ok(()) => "connection closed".to_string(),
                    Err(e) => e.to_string(),
                });
            }
            g.writable = true;
            self.shared.writable.send_replace(true);
        }
        rx.close();
        let (mut mem, mut files) = (0, 0);
        for f in self.queue.drain(..) {
            mem += f.mem_bytes;
            files += f.file_frames;
        }
        while let Ok(item) = rx.try_recv() {
            if let Item::Frame(f) = item {
                mem += f.mem_bytes;
                files += f.file_frames;
            }
        }
        self.shared.release(mem, files);
        result
    }

    async fn pump(&mut self, rx: &mut mpsc::UnboundedReceiver<Item>) -> Result<(), TransportError> {
        let mut closing = false;
        loop {
            if !closing {
                if self.queue.is_empty() {
                    // TLS keeps records in rustls until flushed: out with them before waiting.
                    self.flush().await?;
                    match rx.recv().await {
                        Some(Item::Frame(f)) => self.enqueue(f),
                        Some(Item::Close) | None => return self.flush().await,
                    }
                }
                while self.queue.len() < self.shared.opts.max_frames_per_write {
                    match rx.try_recv() {
                        Ok(Item::Frame(f)) => self.enqueue(f),
                        Ok(Item::Close) => {
                            closing = true;
                            break;
                        }
                        Err(_) => break,
                    }
                }
            }
            if self.queue.is_empty() {
                return self.flush().await;
            }
            let front = &self.queue[0];
            let moved = if front.head_done() && front.body.is_file() {
                self.send_file_body().await?
            } else {
                self.write_gathered().await?
            };
            self.since_yield += moved;
            if self.since_yield >= YIELD_EVERY_BYTES {
                self.since_yield = 0;
                tokio::task::yield_now().await;
            }
        }
    }

    /// Takes a frame into the writer's queue. A file frame whose file has become shorter than
    /// its region since it was queued is replaced, before any of it is written, by a `DATA_LOST`
    /// error for the requester (the writer's own check; producers check too).
    fn enqueue(&mut self, mut f: OutFrame) {
        if let Err(e) = f.body.check_len() {
            tracing::warn!(request_id = f.request_id, error = %e, "file body truncated; answering DATA_LOST");
            TransportStats::add(&self.shared.stats.file_regions_truncated, 1);
            let err = OutFrame::error(f.request_id, ErrorCode::DataLost, e.to_string());
            f.head = err.head;
            f.body = Body::Empty;
        }
        self.queue.push_back(f);
    }

    /// One `writev` over the heads and memory bodies at the front of the queue, up to the first
    /// file body (whose head is included). Returns the bytes written.
    async fn write_gathered(&mut self) -> Result<u64, TransportError> {
        let mut iov = Vec::with_capacity((self.queue.len() * 2).min(IOV_MAX));
        gather(&self.queue, &self.shared.opts, &mut iov);
        let n = match &mut self.wr {
            Sink::Plain(wr) | Sink::Ktls(wr) => loop {
                match wr.try_write_vectored(&iov) {
                    Ok(0) => return Err(io::Error::from(io::ErrorKind::WriteZero).into()),
                    Ok(n) => break n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        wait_writable(wr, &self.shared).await?;
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e.into()),
                }
            },
            Sink::Tls(wr) => {
                let n = tls_write(&self.shared, wr.write_vectored(&iov)).await?;
                TransportStats::add(&self.shared.stats.tls_bytes, n as u64);
                n
            }
        };
        drop(iov);
        let stats = &self.shared.stats;
        TransportStats::add(&stats.writev_calls, 1);
        TransportStats::add(&stats.writev_bytes, n as u64);
        self.advance(n);
        Ok(n as u64)
    }

    /// Moves the front frames' progress past `n` written bytes, retiring completed frames.
    fn advance(&mut self, n: usize) {
        let r = advance(&mut self.queue, n);
        TransportStats::add(&self.shared.stats.writev_frames, r.heads);
        self.shared.release(r.mem, r.files);
    }

    /// Sends (part of) the front frame's file body, from one of its regions, and retires the
    /// frame when it is done.
    async fn send_file_body(&mut self) -> Result<u64, TransportError> {
        let f = self.queue.front_mut().expect("front frame");
        let (region, within) = f.body.region_at(f.body_off).expect("front body has bytes left");
        let region = region.clone();
        let moved = if let (true, Sink::Plain(wr) | Sink::Ktls(wr)) = (self.zero_copy, &self.wr) {
            let mut off = region.offset + within;
            let want = usize::try_from(region.len - within).unwrap_or(usize::MAX);
            let sock = wr.as_ref().as_raw_fd();
            let res = wr
                .as_ref()
                .try_io(Interest::WRITABLE, || sys::sendfile(sock, &region.file, &mut off, want));
            match res {
                Ok(0) => return Err(truncated(&region)),
                Ok(n) => {
                    TransportStats::add(&self.shared.stats.sendfile_calls, 1);
                    TransportStats::add(&self.shared.stats.sendfile_bytes, n as u64);
                    n as u64
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    wait_writable(wr, &self.shared).await?;
                    0
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => 0,
                Err(e) if sys::sendfile_unsupported(&e) => {
                    tracing::info!(error = %e, "sendfile unavailable on this connection; using the copy path");
                    TransportStats::add(&self.shared.stats.sendfile_fallbacks, 1);
                    self.zero_copy = false;
                    0
                }
                Err(e) => return Err(e.into()),
            }
        } else {
            self.copy_step(&region, within).await?
        };
        let f = self.queue.front_mut().expect("front frame");
        f.body_off += moved;
        if f.done() {
            let (mem, files) = (f.mem_bytes, f.file_frames);
            self.queue.pop_front();
            self.shared.release(mem, files);
        }
        Ok(moved)
    }

    /// The copy path: `pread` into the reusable buffer, then `write` it out; `body_off` is where
    /// the frame's progress is in `region`. The buffer holds bytes of one region at a time.
    /// Returns the bytes written to the socket.
    async fn copy_step(
        &mut self,
        region: &FileRegion,
        body_off: u64,
    ) -> Result<u64, TransportError> {
        if self.copy_pos == self.copy_end {
            if self.copy_buf.is_empty() {
                self.copy_buf = vec![0; self.shared.opts.copy_buffer_bytes];
            }
            let want = (region.len - body_off).min(self.copy_buf.len() as u64) as usize;
            let n = loop {
                match sys::pread(&region.file, &mut self.copy_buf[..want], region.offset + body_off)
                {
                    Ok(n) => break n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e.into()),
                }
            };
            if n == 0 {
                return Err(truncated(region));
            }
            self.copy_pos = 0;
            self.copy_end = n;
        }
        let chunk = &self.copy_buf[self.copy_pos..self.copy_end];
        let wr = match &mut self.wr {
            Sink::Plain(wr) | Sink::Ktls(wr) => wr,
            Sink::Tls(wr) => {
                let n = tls_write(&self.shared, wr.write(chunk)).await?;
                self.copy_pos += n;
                let stats = &self.shared.stats;
                TransportStats::add(&stats.tls_file_bytes, n as u64);
                TransportStats::add(&stats.tls_bytes, n as u64);
                return Ok(n as u64);
            }
        };
        match wr.try_write(chunk) {
            Ok(0) => Err(io::Error::from(io::ErrorKind::WriteZero).into()),
            Ok(n) => {
                self.copy_pos += n;
                TransportStats::add(&self.shared.stats.copy_bytes, n as u64);
                Ok(n as u64)
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                wait_writable(wr, &self.shared).await?;
                Ok(0)
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(0),
            Err(e) => Err(e.into()),
        }
    }

    /// Pushes what rustls holds out to the socket (a no-op on a plain socket).
    async fn flush(&mut self) -> Result<(), TransportError> {
        if let Sink::Tls(wr) = &mut self.wr {
            let shared = self.shared.clone();
            tls_write(&shared, async { wr.flush().await.map(|()| 0) }).await?;
        }
        Ok(())
    }
}

/// Gathers into `iov` the heads and memory bodies at the front of `queue`, from where each
/// frame stands, up to the first file body (whose head is included), within the write's bounds:
/// `max_frames_per_write` frames, `IOV_MAX` iovecs, `max_bytes_per_write` bytes (the first frame
/// always goes in, at least in part). A memory body of more pieces than iovecs left goes on in
/// the next write.
fn gather<'a>(queue: &'a VecDeque<OutFrame>, opts: &WriterOptions, iov: &mut Vec<IoSlice<'a>>) {
    let mut bytes = 0usize;
    for (i, f) in queue.iter().enumerate() {
        if i > 0
            && (i >= opts.max_frames_per_write
                || iov.len() + 2 > IOV_MAX
                || bytes >= opts.max_bytes_per_write)
        {
            break;
        }
        if !f.head_done() {
            iov.push(IoSlice::new(&f.head[f.head_off..]));
            bytes += f.head.len() - f.head_off;
        }
        if f.body.is_file() {
            break;
        }
        let mut skip = f.body_off as usize;
        for b in f.body.memory() {
            if skip >= b.len() {
                skip -= b.len();
                continue;
            }
            if iov.len() == IOV_MAX {
                break;
            }
            iov.push(IoSlice::new(&b[skip..]));
            bytes += b.len() - skip;
            skip = 0;
        }
    }
}

/// What [`advance`] retired: the watermark accounting of the frames that left the queue, and the
/// heads completed.
#[derive(Debug, Default, PartialEq)]
struct Retired {
    mem: usize,
    files: usize,
    heads: u64,
}

/// Moves the front frames of `queue` past `n` bytes written from what [`gather`] gave, retiring
/// the frames that are done. A file body's bytes are never counted here (`sendfile` and the copy
/// path move those).
fn advance(queue: &mut VecDeque<OutFrame>, mut n: usize) -> Retired {
    let mut r = Retired::default();
    while let Some(f) = queue.front_mut() {
        let h = n.min(f.head.len() - f.head_off);
        if h > 0 && f.head_off + h == f.head.len() {
            r.heads += 1;
        }
        f.head_off += h;
        n -= h;
        if !f.body.is_file() {
            let b = n.min((f.body.len() - f.body_off) as usize);
            f.body_off += b as u64;
            n -= b;
        }
        if !f.done() {
            break;
        }
        r.mem += f.mem_bytes;
        r.files += f.file_frames;
        queue.pop_front();
    }
    debug_assert_eq!(n, 0, "writev wrote more than was gathered");
    r
}

/// Mid-frame end of file: the header promised more bytes than the file has. The stream cannot be
/// repaired (the peer waits for the rest of the body), so this is fatal for the connection.
fn truncated(region: &FileRegion) -> TransportError {
    let file_len = sys::file_len(&region.file).unwrap_or(0);
    TransportError::FileTruncated { offset: region.offset, len: region.len, file_len }
}

/// A TLS write (or flush), bounded like a plain one by the idle timeout.
async fn tls_write(
    shared: &Shared,
    write: impl std::future::Future<Output = io::Result<usize>>,
) -> Result<usize, TransportError> {
    let n = match shared.opts.idle_timeout {
        None => write.await?,
        Some(t) => match tokio::time::timeout(t, write).await {
            Ok(r) => r?,
            Err(_) => {
                TransportStats::add(&shared.stats.connections_stalled, 1);
                return Err(TransportError::Timeout {
                    what: "peer stalled: write",
                    after_ms: t.as_millis() as u64,
                });
            }
        },
    };
    Ok(n)
}

/// Waits until the socket is writable; a peer that does not read for the idle timeout is
/// reported as stalled.
async fn wait_writable(wr: &OwnedWriteHalf, shared: &Shared) -> Result<(), TransportError> {
    match shared.opts.idle_timeout {
        None => Ok(wr.writable().await?),
        Some(t) => match tokio::time::timeout(t, wr.writable()).await {
            Ok(r) => Ok(r?),
            Err(_) => {
                TransportStats::add(&shared.stats.connections_stalled, 1);
                Err(TransportError::Timeout {
                    what: "peer stalled: write",
                    after_ms: t.as_millis() as u64,
                })
            }
        },
    }
}

#[cfg(test)]
mod tests {
    //! The gathering writer's bookkeeping without a socket: a simulated `writev` takes a chosen
    //! number of bytes from what [`gather`] offers, [`advance`] moves the queue past them, and
    //! what came out must be the frames' wire bytes, in order, each frame retired once.

    use super::*;
    use sluice_proto::encode_frame;
    use sluice_proto::message::Pong;

    fn opts() -> WriterOptions {
        WriterOptions {
            high_watermark_bytes: usize::MAX,
            low_watermark_bytes: 0,
            max_file_frames: 64,
            max_frames_per_write: IOV_MAX / 2,
            max_bytes_per_write: usize::MAX,
            zero_copy: true,
            copy_buffer_bytes: 1 << 16,
            idle_timeout: None,
        }
    }

    /// A frame whose memory body is `pieces` pieces of `piece` bytes, each piece's bytes
    /// distinct from its neighbours', and the frame's wire bytes.
    fn frame(id: u32, pieces: usize, piece: usize) -> (OutFrame, Vec<u8>) {
        let parts: Vec<Bytes> =
            (0..pieces).map(|p| Bytes::from(vec![(id as usize * 31 + p) as u8; piece])).collect();
        let flat: Vec<u8> = parts.iter().flat_map(|b| b.iter().copied()).collect();
        let msg = Message::Pong(Pong {});
        let wire = encode_frame(id, &msg, &flat).to_vec();
        (OutFrame::new(id, &msg, Body::from(parts), u32::MAX).unwrap(), wire)
    }

    /// Drains `queue` with writes of the sizes `sizes` yields (each cut to what was gathered),
    /// checking every gather's bounds; returns the bytes written, what was retired, the writes.
    fn drain(
        mut queue: VecDeque<OutFrame>,
        opts: &WriterOptions,
        mut sizes: impl FnMut(usize, &[IoSlice<'_>]) -> usize,
    ) -> (Vec<u8>, Retired, usize) {
        let (mut out, mut total, mut writes) = (Vec::new(), Retired::default(), 0);
        while !queue.is_empty() {
            let mut iov = Vec::new();
            gather(&queue, opts, &mut iov);
            assert!(!iov.is_empty() && iov.len() <= IOV_MAX, "gathered {} iovecs", iov.len());
            let offered: usize = iov.iter().map(|s| s.len()).sum();
            let mut n = sizes(writes, &iov).clamp(1, offered);
            let wrote = n;
            for s in &iov {
                let k = n.min(s.len());
                out.extend_from_slice(&s[..k]);
                n -= k;
                if n == 0 {
                    break;
                }
            }
            drop(iov);
            let r = advance(&mut queue, wrote);
            total.mem += r.mem;
            total.files += r.files;
            total.heads += r.heads;
            writes += 1;
        }
        (out, total, writes)
    }

    fn queue_of(frames: Vec<(OutFrame, Vec<u8>)>) -> (VecDeque<OutFrame>, Vec<u8>, usize) {
        let mem = frames.iter().map(|(f, _)| f.mem_bytes).sum();
        let wire = frames.iter().flat_map(|(_, w)| w.iter().copied()).collect();
        (frames.into_iter().map(|(f, _)| f).collect(), wire, mem)
    }

    #[test]
    fn writes_ending_anywhere_resume_where_they_stopped() {
        // Writes of 1 byte, of each size up to two pieces and a head, and of whole gathers,
        // so that writes end inside heads, on piece boundaries, one byte either side of them
        // and between frames.
        for size in (1..=40).chain([63, 64, 65, 127, 128, 129, usize::MAX]) {
            let frames = (0..12).map(|i| frame(i, (i % 5 + 1) as usize, 32)).collect();
            let (queue, wire, mem) = queue_of(frames);
            let (out, retired, _) = drain(queue, &opts(), |_, _| size);
            assert!(out == wire, "write size {size}: wrong bytes");
            assert_eq!(retired, Retired { mem, files: 0, heads: 12 }, "write size {size}");
        }
    }

    #[test]
    fn a_body_of_more_pieces_than_iovecs_goes_on_in_the_next_write() {
        // 2,500 pieces: three gathers' worth at IOV_MAX iovecs, behind and before small frames.
        let frames = vec![frame(1, 3, 10), frame(2, 2_500, 3), frame(3, 4, 5)];
        let (queue, wire, mem) = queue_of(frames);
        let mut gathered = Vec::new();
        let (out, retired, writes) = drain(queue, &opts(), |_, iov| {
            gathered.push(iov.len());
            usize::MAX
        });
        assert!(out == wire);
        assert_eq!(retired, Retired { mem, files: 0, heads: 3 });
        assert_eq!(writes, 3, "iovecs per gather: {gathered:?}");
        assert_eq!(gathered[0], IOV_MAX, "the first gather stops at IOV_MAX");

        // Writes that end exactly at a gather's end, then one byte short of and one past a
        // piece boundary further on.
        for cut in [0usize, 1, 2] {
            let frames = vec![frame(1, 3, 10), frame(2, 2_500, 3), frame(3, 4, 5)];
            let (queue, wire, mem) = queue_of(frames);
            let (out, retired, _) = drain(queue, &opts(), |w, iov| {
                let offered: usize = iov.iter().map(|s| s.len()).sum();
                if w % 2 == 0 {
                    offered
                } else {
                    3 * 7 + cut
                }
            });
            assert!(out == wire, "cut {cut}");
            assert_eq!(retired, Retired { mem, files: 0, heads: 3 }, "cut {cut}");
        }
    }

    #[test]
    fn a_gather_keeps_to_its_frame_and_byte_bounds() {
        let mut o = opts();
        o.max_frames_per_write = 4;
        let frames: Vec<_> = (0..10).map(|i| frame(i, 2, 8)).collect();
        let (queue, _, _) = queue_of(frames);
        let mut iov = Vec::new();
        gather(&queue, &o, &mut iov);
        assert_eq!(iov.len(), 4 * 3, "4 frames of a head and 2 pieces");

        o.max_frames_per_write = IOV_MAX / 2;
        o.max_bytes_per_write = 1;
        iov.clear();
        gather(&queue, &o, &mut iov);
        assert_eq!(iov.len(), 3, "the first frame goes in whole even past the byte bound");
    }

    #[test]
    fn a_file_body_stops_the_gather_after_its_head() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, vec![7u8; 4096]).unwrap();
        let file = Arc::new(std::fs::File::open(&path).unwrap());
        let msg = Message::Pong(Pong {});
        let (before, before_wire) = frame(1, 2, 16);
        let file_frame =
            OutFrame::new(2, &msg, FileRegion::new(file, 0, 4096).into(), u32::MAX).unwrap();
        let head = file_frame.head.clone();
        let (after, _) = frame(3, 2, 16);
        let mut queue: VecDeque<OutFrame> = [before, file_frame, after].into_iter().collect();

        let mut iov = Vec::new();
        gather(&queue, &opts(), &mut iov);
        let offered: Vec<u8> = iov.iter().flat_map(|s| s.iter().copied()).collect();
        let mut want = before_wire.clone();
        want.extend_from_slice(&head);
        assert!(offered == want, "the first frame, then the file frame's head alone");
        drop(iov);

        // Written up to one byte short of the file frame's head, then the rest of it: the file
        // frame stays at the front, head done, body untouched, for `sendfile`.
        let first = advance(&mut queue, want.len() - 1);
        assert_eq!((first.heads, first.files, queue.len()), (1, 0, 2));
        let second = advance(&mut queue, 1);
        assert_eq!((second.heads, second.mem, second.files), (1, 0, 0));
        let f = queue.front().unwrap();
        assert!(f.head_done() && f.body_off == 0 && f.body.is_file());
        let mut iov = Vec::new();
        gather(&queue, &opts(), &mut iov);
        assert!(iov.is_empty(), "nothing to gather while a file body is at the front");
    }
}
