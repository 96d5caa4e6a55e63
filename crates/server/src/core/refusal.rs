//! A request the core turns down, with the wire code its requester gets.

use sluice_proto::{ErrorCode, Message};

/// A request the core turns down: the wire code the requester gets and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason} ({code})")]
pub struct Refusal {
    code: ErrorCode,
    reason: String,
}

impl Refusal {
    /// A refusal with wire code `code`.
    pub fn new(code: ErrorCode, reason: impl Into<String>) -> Refusal {
        Refusal { code, reason: reason.into() }
    }

    /// The wire code.
    pub fn code(&self) -> ErrorCode {
        self.code
    }

    /// Why, for the requester and the log.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl From<Refusal> for Message {
    fn from(r: Refusal) -> Message {
        Message::error(r.code, r.reason)
    }
}
