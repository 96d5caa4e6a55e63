//! Turns the read half of a socket into frames: header and fields first (so the receiver can
//! decide about the body — reserve memory, or refuse it), then exactly the body.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use sluice_proto::{Header, Message, HEADER_LEN};
use tokio::io::{AsyncRead, AsyncReadExt};

use crate::body_pool::BodyPool;
use crate::error::TransportError;

/// Bytes asked of the socket per read while looking for a frame head.
const READ_CHUNK: usize = 64 << 10;
/// The most one read for a frame head takes in: a head is at most a few hundred bytes (a push's
/// section list included), and what follows it is the body, which `read_body` reads straight
/// into the body's own buffer. Reads of `READ_CHUNK` pulled up to 64 KiB of each 1 MiB push body
/// into this buffer, to be copied again into the body: 3.7 % of a server's CPU in `bench push`
/// (perf). 8 KiB still takes in a hundred small frames (acks, fetch requests) per read.
const HEAD_READ: usize = 8 << 10;

/// Reads frames from one connection.
pub struct FrameReader {
    /// The read half: a plain socket's, or a TLS stream's (which decrypts). Boxed: one virtual
    /// call per read of up to 64 KiB is nothing, and one reader type serves both.
    rd: Box<dyn AsyncRead + Send + Unpin>,
    /// Bytes read but not yet consumed: at most one frame head plus whatever followed it.
    buf: BytesMut,
    /// Frames longer than this are refused (`FRAME_TOO_LARGE`).
    pub max_frame_bytes: u32,
    /// A frame that stops arriving half-way for this long is an error; the wait for the next
    /// frame's first byte is not limited.
    idle_timeout: Option<Duration>,
    /// Where mid-sized bodies get their buffers (`None`: each body is a new allocation).
    pool: Option<Arc<BodyPool>>,
}

impl FrameReader {
    /// A reader over `rd` accepting frames up to `max_frame_bytes`.
    pub fn new(
        rd: impl AsyncRead + Send + Unpin + 'static,
        max_frame_bytes: u32,
        idle_timeout: Option<Duration>,
    ) -> Self {
        FrameReader {
            rd: Box::new(rd),
            buf: BytesMut::with_capacity(READ_CHUNK),
            max_frame_bytes,
            idle_timeout,
            pool: None,
        }
    }

    /// Takes the buffers of later bodies from `pool`.
    pub fn set_body_pool(&mut self, pool: Option<Arc<BodyPool>>) {
        self.pool = pool;
    }

    /// Reads the next frame's header and fields, leaving its body unread. `Ok(None)` when the
    /// peer closed the connection between frames. A decoding error is the peer's fault and
    /// leaves the connection unusable.
    pub async fn read_head(&mut self) -> Result<Option<(Header, Message)>, TransportError> {
        loop {
            if let Some(h) = Header::decode(&self.buf, self.max_frame_bytes)? {
                let head_len = HEADER_LEN + h.fields_len as usize;
                if self.buf.len() >= head_len {
                    let message = Message::decode(h.msg_type(), &self.buf[HEADER_LEN..head_len])?;
                    message.validate_body(h.body_len() as usize)?;
                    self.buf.advance(head_len);
                    if head_len > READ_CHUNK {
                        // Grown for these fields (up to `max_frame_bytes`): not kept for the
                        // connection's life, which every connection could then hold.
                        self.buf = BytesMut::from(&self.buf[..]);
                        self.buf.reserve(READ_CHUNK.saturating_sub(self.buf.len()));
                    }
                    return Ok(Some((h, message)));
                }
            }
            let idle = !self.buf.is_empty();
            self.buf.reserve(HEAD_READ);
            if self.fill(idle).await? == 0 {
                return match self.buf.is_empty() {
                    true => Ok(None),
                    false => {
                        Err(TransportError::Closed("peer closed the connection mid-frame".into()))
                    }
                };
            }
        }
    }

    /// The request id of the frame at the front of the buffer, when its header bytes are here
    /// (to answer a frame that failed to decode).
    pub fn front_request_id(&self) -> u32 {
        match self.buf.get(5..9) {
            Some(b) => u32::from_be_bytes([b[0], b[1], b[2], b[3]]),
            None => 0,
        }
    }

    /// Whether the bytes at the front look like a TLS record (an alert or a handshake): what a
    /// plain-text client reads from a TLS port.
    pub fn front_looks_like_tls(&self) -> bool {
        matches!(self.buf.first(), Some(0x15 | 0x16)) && self.buf.get(1) == Some(&0x03)
    }

    /// Reads exactly `len` body bytes into a buffer of its own (never a view into a larger read
    /// buffer, so what the body holds is what was reserved for it): from the body pool when one
    /// is set and the size is pooled (capacity rounded up to 64 KiB), else of exactly `len`.
    pub async fn read_body(&mut self, len: u32) -> Result<Bytes, TransportError> {
        let len = len as usize;
        if len == 0 {
            return Ok(Bytes::new());
        }
        let have = self.buf.len().min(len);
        if have == len {
            let body = Bytes::copy_from_slice(&self.buf[..len]);
            self.buf.advance(len);
            return Ok(body);
        }
        if let Some(pool) = self.pool.as_ref().filter(|_| BodyPool::pools(len)) {
            let mut body = pool.take(len);
            let dst = body.bytes_mut();
            dst[..have].copy_from_slice(&self.buf[..have]);
            self.buf.advance(have);
            let mut filled = have;
            while filled < len {
                let n = with_idle(self.idle_timeout, self.rd.read(&mut dst[filled..])).await?;
                if n == 0 {
                    return Err(TransportError::Closed(
                        "peer closed the connection mid-body".into(),
                    ));
                }
                filled += n;
            }
            return Ok(body.freeze());
        }
        let mut body = BytesMut::with_capacity(len);
        body.extend_from_slice(&self.buf[..have]);
        self.buf.advance(have);
        while body.len() < len {
            // `read_buf` fills only the spare capacity, so this never reads past the body.
            let n = with_idle(self.idle_timeout, self.rd.read_buf(&mut body)).await?;
            if n == 0 {
                return Err(TransportError::Closed("peer closed the connection mid-body".into()));
            }
        }
        Ok(body.freeze())
    }

    /// Reads and drops `len` body bytes through the reader's own buffer, `READ_CHUNK` at a
    /// time. No buffer of its own: a connection keeps only that buffer however many bodies it
    /// has refused (a 256 KiB scratch kept per connection once put a 1,000-connection server
    /// 29 MiB over its memory bound after a few hundred `Busy` answers, docs/benchmarks-log.md).
    pub async fn discard_body(&mut self, len: u32) -> Result<(), TransportError> {
        let mut left = len as usize;
        let have = self.buf.len().min(left);
        self.buf.advance(have);
        left -= have;
        while left > 0 {
            // Nothing of the next frame has been read yet: the body comes first.
            debug_assert!(self.buf.is_empty());
            self.buf.clear();
            self.buf.reserve(READ_CHUNK);
            let want = left.min(READ_CHUNK);
            let mut into = (&mut self.buf).limit(want);
            let n = with_idle(self.idle_timeout, self.rd.read_buf(&mut into)).await?;
            if n == 0 {
                return Err(TransportError::Closed("peer closed the connection mid-body".into()));
            }
            self.buf.clear();
            left -= n;
        }
        Ok(())
    }

    /// Reads and drops whatever the peer still sends, for at most `limit` or until it closes:
    /// called after a fatal error frame, so that closing with unread input (which sends a TCP
    /// reset) does not destroy the error frame before the peer reads it.
    pub async fn drain(&mut self, limit: Duration, max_bytes: usize) {
        let deadline = tokio::time::Instant::now() + limit;
        let mut total = 0;
        self.buf.clear();
        while total < max_bytes {
            self.buf.reserve(READ_CHUNK);
            match tokio::time::timeout_at(deadline, self.rd.read_buf(&mut self.buf)).await {
                Ok(Ok(n)) if n > 0 => {
                    total += n;
                    self.buf.clear();
                }
                _ => return,
            }
        }
    }

    /// Reads at most `HEAD_READ` more bytes into the buffer.
    async fn fill(&mut self, idle: bool) -> Result<usize, TransportError> {
        let timeout = if idle { self.idle_timeout } else { None };
        let mut room = (&mut self.buf).limit(HEAD_READ);
        with_idle(timeout, self.rd.read_buf(&mut room)).await
    }
}

async fn with_idle<F>(timeout: Option<Duration>, read: F) -> Result<usize, TransportError>
where
    F: std::future::Future<Output = std::io::Result<usize>>,
{
    match timeout {
        None => Ok(read.await?),
        Some(t) => match tokio::time::timeout(t, read).await {
            Ok(r) => Ok(r?),
            Err(_) => Err(TransportError::Timeout {
                what: "peer stalled: read mid-frame",
                after_ms: t.as_millis() as u64,
            }),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_proto::encode_frame;
    use sluice_proto::message::{Ping, PushMerged, Section};
    use tokio::io::AsyncWriteExt;

    /// A reader of a connection over which `wire` is written at once (by the returned task).
    async fn reader_over(wire: Vec<u8>) -> (FrameReader, tokio::task::JoinHandle<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let sender = tokio::spawn(async move {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            s.write_all(&wire).await.unwrap();
        });
        let (conn, _) = listener.accept().await.unwrap();
        (FrameReader::new(conn, 64 << 20, None), sender)
    }

    /// A head longer than one head read (a push naming 4,000 sections: ~48 KiB of fields), then
    /// its 1 MiB body, then a small frame, all written at once: each comes back whole and in
    /// order (the head is put together over several reads; the body's bytes that a head read
    /// took in are not lost or repeated).
    #[tokio::test]
    async fn heads_longer_than_a_head_read_and_the_body_after_them() {
        let body: Vec<u8> = (0..(1u32 << 20)).map(|i| (i * 7 + i / 251) as u8).collect();
        let entries: Vec<Section> = (0..4000u32)
            .map(|p| Section { partition_id: p, offset: p * 256, length: 256 })
            .collect();
        let push = Message::PushMerged(PushMerged {
            app_id: "app".into(),
            shuffle_id: 3,
            entries: entries.clone(),
        });
        let mut wire = encode_frame(7, &push, &body).to_vec();
        assert!(wire.len() - body.len() > 3 * HEAD_READ, "the head must span several reads");
        wire.extend_from_slice(&encode_frame(8, &Message::Ping(Ping {}), &[]));
        let (mut reader, sender) = reader_over(wire).await;
        let (h, m) = reader.read_head().await.unwrap().expect("a frame");
        assert_eq!(h.request_id, 7);
        let Message::PushMerged(p) = m else { panic!("not the push: {m:?}") };
        assert_eq!(p.entries, entries);
        let got = reader.read_body(h.body_len()).await.unwrap();
        assert!(got[..] == body[..], "the body differs");
        let (h, m) = reader.read_head().await.unwrap().expect("the ping");
        assert_eq!((h.request_id, h.body_len()), (8, 0));
        assert!(matches!(m, Message::Ping(_)), "{m:?}");
        sender.await.unwrap();
        assert!(reader.read_head().await.unwrap().is_none(), "nothing after the ping");
    }

    /// A head of 4 MiB of fields grows the read buffer for itself only: after it, the buffer is
    /// back to its usual size.
    #[tokio::test]
    async fn a_large_head_does_not_leave_the_read_buffer_large() {
        let entries: Vec<Section> =
            (0..350_000u32).map(|p| Section { partition_id: p, offset: p, length: 1 }).collect();
        let body = vec![7u8; 350_000 + 349_999];
        let push = Message::PushMerged(PushMerged { app_id: "app".into(), shuffle_id: 3, entries });
        let mut wire = encode_frame(1, &push, &body).to_vec();
        assert!(wire.len() - body.len() > (4 << 20), "the fields must be large");
        wire.extend_from_slice(&encode_frame(2, &Message::Ping(Ping {}), &[]));
        let (mut reader, sender) = reader_over(wire).await;
        let (h, _) = reader.read_head().await.unwrap().expect("the push");
        assert!(reader.buf.capacity() <= 2 * READ_CHUNK, "{} bytes kept", reader.buf.capacity());
        reader.read_body(h.body_len()).await.unwrap();
        let (h, m) = reader.read_head().await.unwrap().expect("the ping");
        assert_eq!((h.request_id, h.body_len()), (2, 0));
        assert!(matches!(m, Message::Ping(_)), "{m:?}");
        sender.await.unwrap();
    }

    /// A refused 1 MiB body is read and dropped through the reader's own buffer, which does not
    /// grow for it, and the frame after it comes back whole.
    #[tokio::test]
    async fn a_discarded_body_leaves_the_next_frame_whole_and_the_read_buffer_as_it_was() {
        let body: Vec<u8> = (0..(1u32 << 20)).map(|i| (i * 13) as u8).collect();
        let push = Message::PushMerged(PushMerged {
            app_id: "app".into(),
            shuffle_id: 1,
            entries: vec![Section { partition_id: 0, offset: 0, length: 1 << 20 }],
        });
        let mut wire = encode_frame(1, &push, &body).to_vec();
        wire.extend_from_slice(&encode_frame(2, &Message::Ping(Ping {}), &[]));
        let (mut reader, sender) = reader_over(wire).await;
        let (h, _) = reader.read_head().await.unwrap().expect("the push");
        reader.discard_body(h.body_len()).await.unwrap();
        assert!(reader.buf.capacity() <= READ_CHUNK, "{} bytes kept", reader.buf.capacity());
        let (h, m) = reader.read_head().await.unwrap().expect("the ping");
        assert_eq!((h.request_id, h.body_len()), (2, 0));
        assert!(matches!(m, Message::Ping(_)), "{m:?}");
        sender.await.unwrap();
        assert!(reader.read_head().await.unwrap().is_none(), "nothing after the ping");
    }
}
