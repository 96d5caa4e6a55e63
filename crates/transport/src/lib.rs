//! # sluice-transport
//!
//! Sockets for the Sluice protocol (`docs/protocol.md`): the server's accept loop and
//! connections, the client's multiplexed connections and pool, and the one writer both use —
//! many small frames per `writev`, file bodies with `sendfile(2)`, bounded by watermarks.
//!
//! ## Layout
//! Every module is private; the API is the list of re-exports below.
//! - `config`: [`ServerConfig`] and [`ClientConfig`] (serde, defaults, `validate()`).
//! - `error`: [`TransportError`], with its wire code and whether a retry can help.
//! - `body`: [`Body`] — empty, memory, or a [`FileRegion`] sent without a user-space copy.
//! - `body_pool`: [`BodyPool`] — reusable buffers for request bodies, shared by connections.
//! - `codec`: [`FrameReader`] — header and fields first, then exactly the body.
//! - `outbound`: [`Outbound`], the per-connection queue of [`OutFrame`]s with watermarks, and
//!   the writer task (`writev`, `sendfile`, the copy path) set up by [`WriterOptions`].
//! - `server`: [`serve`], the [`Handler`] trait and its request/response types.
//! - `client`: [`Connection`] — request ids, pending table, timeouts.
//! - `pool`: [`Pool`] — N connections per peer, reconnect with backoff.
//! - `stats`: [`TransportStats`] counters.
//! - `secret`: [`constant_time_eq`], per-application credentials ([`app_credential`]) and the
//!   handshake's proof, and the rules for the admin API's token.
//! - `tls`: [`TlsServerConfig`] / [`TlsClientConfig`] (rustls, PEM files, reload on change or
//!   `SIGHUP`, optional mTLS).
//! - `ktls`: after a server's TLS handshake, the session keys handed to the kernel (kTLS) where
//!   it takes them, else rustls encrypting in user space: counted and logged.
//! - `stream`: [`Sink`], a connection's write half, plain or kTLS (`writev`, `sendfile`) or TLS
//!   in user space.
//! - `sys`: the raw `sendfile` / `posix_fadvise` / `pread` calls; `socket`: socket options.

#![warn(missing_docs)]

mod body;
mod body_pool;
mod client;
mod codec;
mod config;
mod error;
mod ktls;
mod outbound;
mod pool;
mod secret;
mod server;
mod socket;
mod stats;
mod stream;
mod sys;
mod tls;

pub use body::{Body, FileRegion};
pub use body_pool::{BodyPool, BodyPoolStats};
pub use client::{Connection, Reply};
pub use config::{ClientConfig, ServerConfig};
pub use error::TransportError;
pub use pool::Pool;
pub use secret::{
    app_credential, constant_time_eq, handshake_proof, validate_admin_token, ADMIN_TOKEN_MIN_CHARS,
    CLUSTER_KEY_MIN_CHARS,
};
pub use server::{serve, Admission, ConnInfo, Handler, PeerIdentity, Request, Response};
pub use stats::{StatsSnapshot, TransportStats};
pub use stream::{Sink, TlsStream};
pub use tls::{ktls_available, TlsClientConfig, TlsListener, TlsServerConfig};

// A connection's two halves on their own, for `sluice bench transport`, which drives the writer
// and the reader over a bare socket to measure them without a server or client around them.
pub use codec::FrameReader;
pub use outbound::{OutFrame, Outbound, WriterOptions};
