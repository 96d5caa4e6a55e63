//! # sluice-proto
//!
//! The Sluice wire protocol, version 1 (`docs/protocol.md`), with no I/O and no async runtime.
//!
//! ## Layout
//! - [`error`]: the stable wire error codes and the decoder's typed error.
//! - [`frame`]: the 13-byte frame header, [`frame::check`] (is a whole frame here?) and
//!   [`frame::parse`] (split it off and decode), and head-only encoding that leaves the body to
//!   the transport (`writev` from memory, `sendfile` from a file).
//! - [`message`]: every v1 message and its fixed type id.
//! - [`batch`]: the per-batch header inside push bodies and chunks, and CRC32C checks.
//! - `wire`: the field primitives (integers, `str`, `list<T>`) with bounded decoding.

pub mod batch;
pub mod error;
pub mod frame;
pub mod message;
mod wire;

pub use error::{ErrorCode, ProtoError};
pub use frame::{check, encode_frame, encode_head, parse, Frame, Header, HEADER_LEN};
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
