//! Stable wire error codes and the decoder's typed error.

use std::fmt;

/// A stable error code carried by the `Error` message. Numbers are fixed forever; see the table
/// in `docs/protocol.md`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum ErrorCode {
    /// Bad lengths, bad field encoding, trailing bytes, or a body where none is allowed. Fatal.
    MalformedFrame = 1,
    /// `frame_len` over the negotiated `max_frame_bytes`. Fatal.
    FrameTooLarge = 2,
    /// A `msg_type` that v1 does not define. Fatal.
    UnknownMessageType = 3,
    /// The handshake's magic or version is not one the responder speaks. Fatal.
    UnsupportedVersion = 4,
    /// The handshake's credential proof is missing or wrong. Fatal.
    AuthFailed = 5,
    /// A batch's CRC32C does not match its payload (corrupted in flight: retriable).
    ChecksumMismatch = 6,
    /// The application is not registered, or it expired for lack of heartbeats.
    UnknownApp = 7,
    /// The shuffle is not registered on the responder.
    UnknownShuffle = 8,
    /// A push or mapper end arrived after the shuffle was committed.
    ShuffleCommitted = 9,
    /// A stream was opened before the shuffle was committed (retriable: the commit may follow).
    ShuffleNotCommitted = 10,
    /// A fetch or close named a stream that is not open.
    UnknownStream = 11,
    /// A chunk index at or past the stream's chunk count.
    ChunkOutOfRange = 12,
    /// A disk failed while writing or reading; the request's data was not stored (retriable).
    StorageFailed = 13,
    /// No data directory can take the partition: all failed or full.
    StorageUnavailable = 14,
    /// The coordinator knows no live server to assign (retriable: servers may join).
    NoServers = 15,
    /// Well formed but wrong for the state it meets (a partition or map id out of range, a push
    /// larger than the server's memory budget, ...).
    InvalidRequest = 16,
    /// A bug or unexpected state on the responder (retriable).
    Internal = 17,
    /// The responder is stopping (retriable elsewhere or later).
    ShuttingDown = 18,
    /// Stored data is missing or truncated, or this server's copy is incomplete; another copy may
    /// still have it.
    DataLost = 19,
    /// A request got no answer in time. Made by clients; never sent by servers.
    Timeout = 20,
    /// A well-formed frame out of place (a second handshake, a response sent as a request). Fatal.
    ProtocolViolation = 21,
    /// The connection is authenticated for another application than the one the request names
    /// (or a cluster-only request on an application's connection). Answers that request only.
    Unauthorized = 22,
    /// The application (or its user) is over one of its quotas on the responder: the message
    /// names the quota and its limit. Not retriable: the data is not going to shrink by itself.
    QuotaExceeded = 23,
}

impl ErrorCode {
    /// Every code, in number order.
    pub const ALL: [ErrorCode; 23] = [
        Self::MalformedFrame,
        Self::FrameTooLarge,
        Self::UnknownMessageType,
        Self::UnsupportedVersion,
        Self::AuthFailed,
        Self::ChecksumMismatch,
        Self::UnknownApp,
        Self::UnknownShuffle,
        Self::ShuffleCommitted,
        Self::ShuffleNotCommitted,
        Self::UnknownStream,
        Self::ChunkOutOfRange,
        Self::StorageFailed,
        Self::StorageUnavailable,
        Self::NoServers,
        Self::InvalidRequest,
        Self::Internal,
        Self::ShuttingDown,
        Self::DataLost,
        Self::Timeout,
        Self::ProtocolViolation,
        Self::Unauthorized,
        Self::QuotaExceeded,
    ];

    /// The code's number on the wire.
    pub fn as_u16(self) -> u16 {
        self as u16
    }

    /// The code for a wire number, if it is one v1 knows.
    pub fn from_u16(v: u16) -> Option<Self> {
        Self::ALL.get((v as usize).checked_sub(1)?).copied()
    }

    /// The stable upper-case name used in docs, logs and the golden-vector manifest.
    pub fn name(self) -> &'static str {
        match self {
            Self::MalformedFrame => "MALFORMED_FRAME",
            Self::FrameTooLarge => "FRAME_TOO_LARGE",
            Self::UnknownMessageType => "UNKNOWN_MESSAGE_TYPE",
            Self::UnsupportedVersion => "UNSUPPORTED_VERSION",
            Self::AuthFailed => "AUTH_FAILED",
            Self::ChecksumMismatch => "CHECKSUM_MISMATCH",
            Self::UnknownApp => "UNKNOWN_APP",
            Self::UnknownShuffle => "UNKNOWN_SHUFFLE",
            Self::ShuffleCommitted => "SHUFFLE_COMMITTED",
            Self::ShuffleNotCommitted => "SHUFFLE_NOT_COMMITTED",
            Self::UnknownStream => "UNKNOWN_STREAM",
            Self::ChunkOutOfRange => "CHUNK_OUT_OF_RANGE",
            Self::StorageFailed => "STORAGE_FAILED",
            Self::StorageUnavailable => "STORAGE_UNAVAILABLE",
            Self::NoServers => "NO_SERVERS",
            Self::InvalidRequest => "INVALID_REQUEST",
            Self::Internal => "INTERNAL",
            Self::ShuttingDown => "SHUTTING_DOWN",
            Self::DataLost => "DATA_LOST",
            Self::Timeout => "TIMEOUT",
            Self::ProtocolViolation => "PROTOCOL_VIOLATION",
            Self::Unauthorized => "UNAUTHORIZED",
            Self::QuotaExceeded => "QUOTA_EXCEEDED",
        }
    }

    /// Whether the same request may succeed when sent again later.
    pub fn is_retriable(self) -> bool {
        matches!(
            self,
            Self::ChecksumMismatch
                | Self::ShuffleNotCommitted
                | Self::StorageFailed
                | Self::NoServers
                | Self::Internal
                | Self::ShuttingDown
                | Self::Timeout
        )
    }

    /// Whether the responder closes the connection after sending this error.
    pub fn is_fatal(self) -> bool {
        matches!(
            self,
            Self::MalformedFrame
                | Self::FrameTooLarge
                | Self::UnknownMessageType
                | Self::UnsupportedVersion
                | Self::AuthFailed
                | Self::ProtocolViolation
        )
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why bytes from a peer could not be decoded. Always the peer's fault; each maps to a wire code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtoError {
    /// Lengths or fields that do not add up; the text names the first check that failed.
    #[error("malformed frame: {0}")]
    Malformed(&'static str),
    /// A header announced more bytes than the connection allows; refused before any is read.
    #[error("frame of {len} bytes exceeds the maximum of {max}")]
    FrameTooLarge {
        /// The `frame_len` the header announced.
        len: u64,
        /// The connection's `max_frame_bytes`.
        max: u32,
    },
    /// A `msg_type` byte that v1 does not define.
    #[error("unknown message type {0}")]
    UnknownType(u8),
    /// A handshake with the wrong magic or a version we do not speak; the text says which.
    #[error("unsupported protocol: {0}")]
    UnsupportedVersion(String),
    /// A batch whose payload does not match the CRC32C in its header.
    #[error("batch checksum mismatch (map {map_id}, attempt {attempt_id}, batch {batch_id})")]
    ChecksumMismatch {
        /// The batch header's map id.
        map_id: u32,
        /// The batch header's attempt id.
        attempt_id: u32,
        /// The batch header's batch id (its sequence number within the attempt).
        batch_id: u32,
    },
}

impl ProtoError {
    /// The wire error code a responder sends for this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::Malformed(_) => ErrorCode::MalformedFrame,
            Self::FrameTooLarge { .. } => ErrorCode::FrameTooLarge,
            Self::UnknownType(_) => ErrorCode::UnknownMessageType,
            Self::UnsupportedVersion(_) => ErrorCode::UnsupportedVersion,
            Self::ChecksumMismatch { .. } => ErrorCode::ChecksumMismatch,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_are_dense() {
        for (i, c) in ErrorCode::ALL.iter().enumerate() {
            assert_eq!(c.as_u16() as usize, i + 1);
            assert_eq!(ErrorCode::from_u16(c.as_u16()), Some(*c));
        }
        assert_eq!(ErrorCode::from_u16(0), None);
        assert_eq!(ErrorCode::from_u16(24), None);
    }
}
