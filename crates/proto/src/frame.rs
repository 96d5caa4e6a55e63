//! The frame: a fixed 13-byte header, the message's fields, then an opaque body.
//!
//! [`check`] answers "is a whole frame here, and how long is it?" from the header alone, so a
//! reader can reserve memory for the body before reading it. [`parse`] splits a complete frame off
//! a buffer without copying the body.

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::error::ProtoError;
use crate::message::{Message, MsgType};

/// Length of the fixed frame header.
pub const HEADER_LEN: usize = 13;
/// `max_frame_bytes` in force until the handshake completes.
pub const HANDSHAKE_MAX_FRAME_BYTES: u32 = 64 * 1024;
/// Smallest `max_frame_bytes` a peer may negotiate.
pub const MIN_MAX_FRAME_BYTES: u32 = 64 * 1024;
/// Largest `max_frame_bytes` a peer may negotiate.
pub const MAX_MAX_FRAME_BYTES: u32 = 1 << 30;
/// Default `max_frame_bytes` on both sides.
pub const DEFAULT_MAX_FRAME_BYTES: u32 = 64 * 1024 * 1024;

/// The decoded fixed header of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Total frame length, header included.
    pub frame_len: u32,
    /// Raw message type id (already checked to be a known type by [`check`]).
    pub msg_type: u8,
    /// Request id; a response carries its request's id.
    pub request_id: u32,
    /// Length of the fields after the header.
    pub fields_len: u32,
}

impl Header {
    /// Header for a frame carrying `fields_len` bytes of fields and `body_len` bytes of body.
    /// `None` when the frame would not fit in `u32`.
    pub fn new(
        msg_type: MsgType,
        request_id: u32,
        fields_len: usize,
        body_len: u64,
    ) -> Option<Self> {
        let total = (HEADER_LEN as u64).checked_add(fields_len as u64)?.checked_add(body_len)?;
        Some(Header {
            frame_len: u32::try_from(total).ok()?,
            msg_type: msg_type as u8,
            request_id,
            fields_len: u32::try_from(fields_len).ok()?,
        })
    }

    /// Length of the body that follows the fields.
    pub fn body_len(&self) -> u32 {
        self.frame_len - HEADER_LEN as u32 - self.fields_len
    }

    /// The message type (valid because [`check`] validated it).
    pub fn msg_type(&self) -> MsgType {
        MsgType::from_u8(self.msg_type).expect("header type checked on decode")
    }

    /// Writes the 13 header bytes.
    pub fn put(&self, out: &mut impl BufMut) {
        out.put_u32(self.frame_len);
        out.put_u8(self.msg_type);
        out.put_u32(self.request_id);
        out.put_u32(self.fields_len);
    }

    /// Decodes and validates a header from the first [`HEADER_LEN`] bytes of `buf`.
    ///
    /// `Ok(None)` when fewer than [`HEADER_LEN`] bytes are present. Validation covers the frame
    /// length against `max_frame_bytes`, the fields length against the frame length, the message
    /// type, and that only body-carrying messages have a body.
    pub fn decode(buf: &[u8], max_frame_bytes: u32) -> Result<Option<Header>, ProtoError> {
        if buf.len() < HEADER_LEN {
            return Ok(None);
        }
        let mut b = &buf[..HEADER_LEN];
        let h = Header {
            frame_len: b.get_u32(),
            msg_type: b.get_u8(),
            request_id: b.get_u32(),
            fields_len: b.get_u32(),
        };
        if (h.frame_len as usize) < HEADER_LEN {
            return Err(ProtoError::Malformed("frame_len shorter than the header"));
        }
        if h.frame_len > max_frame_bytes {
            return Err(ProtoError::FrameTooLarge {
                len: h.frame_len as u64,
                max: max_frame_bytes,
            });
        }
        if h.fields_len > h.frame_len - HEADER_LEN as u32 {
            return Err(ProtoError::Malformed("fields_len runs past frame_len"));
        }
        let ty = MsgType::from_u8(h.msg_type).ok_or(ProtoError::UnknownType(h.msg_type))?;
        if h.body_len() > 0 && !ty.has_body() {
            return Err(ProtoError::Malformed("body on a message that carries none"));
        }
        Ok(Some(h))
    }
}

/// Is a whole frame at the front of `buf`? `Ok(None)` means "not yet, read more"; `Ok(Some(h))`
/// means `h.frame_len` bytes are present. Errors mean the stream is broken and must be closed.
pub fn check(buf: &[u8], max_frame_bytes: u32) -> Result<Option<Header>, ProtoError> {
    match Header::decode(buf, max_frame_bytes)? {
        Some(h) if buf.len() >= h.frame_len as usize => Ok(Some(h)),
        _ => Ok(None),
    }
}

/// A decoded frame. The body shares the receive buffer's memory (no copy).
#[derive(Debug, Clone, PartialEq)]
pub struct Frame {
    /// The sender's id for the request; a response carries its request's id.
    pub request_id: u32,
    /// The decoded message fields.
    pub message: Message,
    /// The opaque body after the fields (a push's batches, a chunk's bytes), possibly empty.
    pub body: Bytes,
}

/// Splits one complete frame off the front of `buf` and decodes its message.
///
/// `Ok(None)` when the frame is not complete yet (nothing is consumed).
pub fn parse(buf: &mut BytesMut, max_frame_bytes: u32) -> Result<Option<Frame>, ProtoError> {
    let Some(h) = check(buf, max_frame_bytes)? else { return Ok(None) };
    let mut frame = buf.split_to(h.frame_len as usize).freeze();
    frame.advance(HEADER_LEN);
    let fields = frame.split_to(h.fields_len as usize);
    let message = Message::decode(h.msg_type(), &fields)?;
    message.validate_body(frame.len())?;
    Ok(Some(Frame { request_id: h.request_id, message, body: frame }))
}

/// Encodes the header and fields of a frame into `out`; the body (of `body_len` bytes) is not
/// written: the transport sends it from memory with `writev` or from a file with `sendfile`.
///
/// Fails with [`ProtoError::FrameTooLarge`] if the frame would not fit in `max_frame_bytes`.
pub fn encode_head(
    request_id: u32,
    message: &Message,
    body_len: u64,
    max_frame_bytes: u32,
    out: &mut BytesMut,
) -> Result<(), ProtoError> {
    let start = out.len();
    out.put_bytes(0, HEADER_LEN);
    message.encode_fields(out);
    let fields_len = out.len() - start - HEADER_LEN;
    let too_large = |len| ProtoError::FrameTooLarge { len, max: max_frame_bytes };
    let total = (HEADER_LEN + fields_len) as u64 + body_len;
    let header = Header::new(message.msg_type(), request_id, fields_len, body_len)
        .ok_or_else(|| too_large(total))?;
    if header.frame_len > max_frame_bytes {
        out.truncate(start);
        return Err(too_large(total));
    }
    let mut slot = &mut out[start..start + HEADER_LEN];
    header.put(&mut slot);
    Ok(())
}

/// Encodes a whole frame (header, fields, body) into one buffer: for tests, vectors and small
/// control messages. The data path uses [`encode_head`] and keeps the body apart.
pub fn encode_frame(request_id: u32, message: &Message, body: &[u8]) -> BytesMut {
    let mut out = BytesMut::with_capacity(HEADER_LEN + 64 + body.len());
    encode_head(request_id, message, body.len() as u64, u32::MAX, &mut out)
        .expect("frame within u32::MAX");
    out.extend_from_slice(body);
    out
}
