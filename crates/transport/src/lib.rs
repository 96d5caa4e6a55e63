//! # sluice-transport
//!
//! Sockets for the Sluice protocol (`docs/protocol.md`): the server's accept loop and
//! connections, the client's multiplexed connections and pool, and the one writer both use —
//! many small frames per `writev`, file bodies with `sendfile(2)`, bounded by watermarks.
//!
//! ## Layout
//! - [`config`]: [`ServerConfig`] and [`ClientConfig`] (serde, defaults, `validate()`).
//! - [`error`]: [`TransportError`], with its wire code and whether a retry can help.
//! - [`body`]: [`Body`] — empty, memory, or a [`FileRegion`] sent without a user-space copy.
//! - [`codec`]: [`FrameReader`] — header and fields first, then exactly the body.
//! - [`outbound`]: the per-connection queue with watermarks and the writer task (`writev`,
//!   `sendfile`, the copy path).
//! - [`server`]: [`serve`], the [`Handler`] trait and its request/response types.
//! - [`client`]: [`Connection`] — request ids, pending table, timeouts.
//! - [`pool`]: [`Pool`] — N connections per peer, reconnect with backoff.
//! - [`stats`]: [`TransportStats`] counters.
//! - `sys`: the raw `sendfile` / `posix_fadvise` / `pread` calls; `socket`: socket options.

pub mod body;
pub mod body_pool;
pub mod client;
pub mod codec;
pub mod config;
pub mod error;
pub mod outbound;
pub mod pool;
pub mod server;
mod socket;
pub mod stats;
mod sys;

pub use body::{Body, FileRegion};
pub use body_pool::{BodyPool, BodyPoolStats};
pub use client::{Connection, Reply};
pub use codec::FrameReader;
pub use config::{ClientConfig, ServerConfig};
pub use error::TransportError;
pub use outbound::{OutFrame, Outbound, WriterOptions};
pub use pool::Pool;
pub use server::{serve, Admission, ConnInfo, Handler, Request, Response};
pub use stats::{StatsSnapshot, TransportStats};
