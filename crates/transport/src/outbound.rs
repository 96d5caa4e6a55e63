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

    /// Queues a frame now, ignoring the watermarks: for small control frames (handshake
    /// replies, pongs, fatal errors) that must not wait behind data.
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
        let opts = &self.shared.opts;
        let mut iov: Vec<IoSlice<'_>> = Vec::with_capacity((self.queue.len() * 2).min(IOV_MAX));
        let mut bytes = 0usize;
        for (i, f) in self.queue.iter().enumerate() {
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
            // The memory body's pieces from where the frame stands; a body of more pieces than
            // iovecs left goes on in the next write.
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
    fn advance(&mut self, mut n: usize) {
        let (mut mem, mut files, mut heads) = (0, 0, 0u64);
        while let Some(f) = self.queue.front_mut() {
            let h = n.min(f.head.len() - f.head_off);
            if h > 0 && f.head_off + h == f.head.len() {
                heads += 1;
            }
            f.head_off += h;
            n -= h;
            if !f.body.is_file() {
                let r = n.min((f.body.len() - f.body_off) as usize);
                f.body_off += r as u64;
                n -= r;
            }
            if !f.done() {
                break;
            }
            mem += f.mem_bytes;
            files += f.file_frames;
            self.queue.pop_front();
        }
        debug_assert_eq!(n, 0, "writev wrote more than was gathered");
        TransportStats::add(&self.shared.stats.writev_frames, heads);
        self.shared.release(mem, files);
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
