//! Stable wire error codes and the decoder's typed error.

use std::fmt;

/// A stable error code carried by the `Error` message. Numbers are fixed forever; see the table
/// in `docs/protocol.md`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum ErrorCode {
    MalformedFrame = 1,
    FrameTooLarge = 2,
    UnknownMessageType = 3,
    UnsupportedVersion = 4,
    AuthFailed = 5,
    ChecksumMismatch = 6,
    UnknownApp = 7,
    UnknownShuffle = 8,
    ShuffleCommitted = 9,
    ShuffleNotCommitted = 10,
    UnknownStream = 11,
    ChunkOutOfRange = 12,
    StorageFailed = 13,
    StorageUnavailable = 14,
    NoServers = 15,
    InvalidRequest = 16,
    Internal = 17,
    ShuttingDown = 18,
    DataLost = 19,
    Timeout = 20,
    ProtocolViolation = 21,
}

impl ErrorCode {
    /// Every code, in number order.
    pub const ALL: [ErrorCode; 21] = [
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
    #[error("malformed frame: {0}")]
    Malformed(&'static str),
    #[error("frame of {len} bytes exceeds the maximum of {max}")]
    FrameTooLarge { len: u64, max: u32 },
    #[error("unknown message type {0}")]
    UnknownType(u8),
    #[error("unsupported protocol: {0}")]
    UnsupportedVersion(String),
    #[error("batch checksum mismatch (map {map_id}, attempt {attempt_id}, batch {batch_id})")]
    ChecksumMismatch { map_id: u32, attempt_id: u32, batch_id: u32 },
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
        assert_eq!(ErrorCode::from_u16(22), None);
    }
}
