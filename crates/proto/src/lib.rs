//! # sluice-proto
//!
//! The Sluice wire protocol, version 1 (`docs/protocol.md`), with no I/O and no async runtime.
//!
//! ## Layout
//! The API is what the crate root re-exports, plus two public namespaces.
//! - `error`: the stable wire error codes ([`ErrorCode`]) and the decoder's typed error
//!   ([`ProtoError`]).
//! - `frame`: the 13-byte frame [`Header`], [`check`] (is a whole frame here?) and [`parse`]
//!   (split it off and decode), head-only encoding ([`encode_head`]) that leaves the body to the
//!   transport (`writev` from memory, `sendfile` from a file), and the frame-size limits.
//! - [`message`] (public namespace): every v1 message and its fixed type id ([`Message`],
//!   [`MsgType`]).
//! - [`batch`] (public namespace): the per-batch header inside push bodies and chunks, and
//!   CRC32C checks.
//! - `wire`: the field primitives (integers, `str`, `list<T>`) with bounded decoding.
//! - `fuzzing` (only with `--cfg fuzzing`): the decoders `cargo fuzz` drives.

#![warn(missing_docs)]

mod error;
mod wire;

// A namespace: the batch format inside push bodies and chunks (header, encoder, iterator,
// checks, CRC32C) is one layer of its own, and `batch::put_batch`, `batch::crc32c` say which
// layer they belong to better than the crate root would.
pub mod batch;
mod frame;
// A namespace: every message struct (dozens of them) and the protocol constants; callers
// `use sluice_proto::message::*` rather than crowd the crate root with them.
pub mod message;

pub use error::{ErrorCode, ProtoError};
pub use frame::{
    check, encode_frame, encode_head, parse, Frame, Header, DEFAULT_MAX_FRAME_BYTES,
    HANDSHAKE_MAX_FRAME_BYTES, HEADER_LEN, MAX_MAX_FRAME_BYTES, MIN_MAX_FRAME_BYTES,
};
pub use message::{Message, MsgType};

#[cfg(fuzzing)]
pub mod fuzzing {
    //! Entry points for `cargo fuzz`: every decoder reachable from untrusted bytes.
    use bytes::BytesMut;

    /// Feeds arbitrary bytes through `check` + `parse` + batch validation; must never panic.
    pub fn decode_frame(data: &[u8]) {
        let max = crate::frame::DEFAULT_MAX_FRAME_BYTES;
        let mut buf = BytesMut::from(data);
        while let Ok(Some(frame)) = crate::frame::parse(&mut buf, max) {
            let _ = frame.message.validate_body(frame.body.len());
            let _ = crate::batch::validate_batches(&frame.body, |_| {});
        }
    }
}
