//! The transport's typed error: whose fault it is, the wire code it maps to, and whether a retry
//! can help.

use std::net::SocketAddr;

use sluice_proto::{ErrorCode, ProtoError};

/// Why a transport operation failed.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// A socket or file operation failed (ours or the network's).
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    /// The TCP connection could not be opened.
    #[error("connecting to {addr}: {source}")]
    Connect {
        /// The peer we tried.
        addr: SocketAddr,
        /// Why the connect failed (refused, unreachable, …).
        #[source]
        source: std::io::Error,
    },
    /// No answer (or no progress) within the configured time.
    #[error("{what} timed out after {after_ms} ms")]
    Timeout {
        /// What took too long (a request, the connect and handshake, a stalled read or write).
        what: &'static str,
        /// The limit that passed, in milliseconds.
        after_ms: u64,
    },
    /// The connection is closed; every request still pending on it failed with this.
    #[error("connection closed: {0}")]
    Closed(String),
    /// The peer answered with an `Error` frame.
    #[error("remote error {code}: {message}")]
    Remote {
        /// The code the peer sent; [`ErrorCode::is_retriable`] says whether to try again.
        code: ErrorCode,
        /// The peer's text, for logs.
        message: String,
    },
    /// The peer sent bytes that do not decode (its fault).
    #[error("protocol error: {0}")]
    Proto(#[from] ProtoError),
    /// A frame arrived where the protocol does not allow it (a response as a request, a second
    /// handshake, a reply to no request).
    #[error("protocol violation: {0}")]
    Violation(String),
    /// A file body's file is shorter than its region (storage's fault): detected before its frame
    /// started (the requester gets `DATA_LOST`) or mid-frame (the connection is closed).
    #[error("file region {offset}+{len} runs past the end of the file ({file_len} bytes)")]
    FileTruncated {
        /// Where the region starts in the file.
        offset: u64,
        /// The region's length.
        len: u64,
        /// The file's length when the shortfall was seen.
        file_len: u64,
    },
    /// An invalid setting.
    #[error("invalid transport config: {0}")]
    Config(String),
}

impl TransportError {
    /// The wire error code that best describes this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::Io(_) | Self::Connect { .. } | Self::Closed(_) => ErrorCode::Internal,
            Self::Timeout { .. } => ErrorCode::Timeout,
            Self::Remote { code, .. } => *code,
            Self::Proto(e) => e.code(),
            Self::Violation(_) => ErrorCode::ProtocolViolation,
            Self::FileTruncated { .. } => ErrorCode::DataLost,
            Self::Config(_) => ErrorCode::InvalidRequest,
        }
    }

    /// Whether the same request may succeed if sent again (possibly on a new connection).
    pub fn is_retriable(&self) -> bool {
        match self {
            Self::Io(_) | Self::Connect { .. } | Self::Closed(_) | Self::Timeout { .. } => true,
            Self::Remote { code, .. } => code.is_retriable(),
            Self::Proto(_) | Self::Violation(_) | Self::FileTruncated { .. } | Self::Config(_) => {
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_retry() {
        let t = TransportError::Timeout { what: "request", after_ms: 5 };
        assert_eq!(t.code(), ErrorCode::Timeout);
        assert!(t.is_retriable());
        let r = TransportError::Remote { code: ErrorCode::UnknownApp, message: "x".into() };
        assert!(!r.is_retriable());
        assert!(TransportError::Closed("eof".into()).is_retriable());
        assert_eq!(
            TransportError::Proto(ProtoError::UnknownType(99)).code(),
            ErrorCode::UnknownMessageType
        );
    }
}
