//! A connection's two halves, plain TCP or TLS: the reader takes any `AsyncRead`; the writer
//! needs to know which, as only a plain socket can take `writev` of its own and `sendfile`.

use std::io;

use tokio::io::{AsyncWriteExt, WriteHalf};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpStream;

/// A TLS connection over TCP (either side).
pub type TlsStream = tokio_rustls::TlsStream<TcpStream>;

/// The write half of a connection.
pub enum Sink {
    /// Plain TCP: `writev` and `sendfile` on the socket.
    Plain(OwnedWriteHalf),
    /// TLS in user space: bytes go through rustls, which encrypts them; file bodies are read
    /// into a buffer first (the kernel cannot encrypt what `sendfile` would hand it).
    Tls(WriteHalf<TlsStream>),
}

impl From<OwnedWriteHalf> for Sink {
    fn from(w: OwnedWriteHalf) -> Self {
        Sink::Plain(w)
    }
}

impl Sink {
    /// Whether bytes go through TLS.
    pub fn is_tls(&self) -> bool {
        matches!(self, Sink::Tls(_))
    }

    /// Writes all of `buf` and flushes it to the socket.
    pub(crate) async fn write_all_flush(&mut self, buf: &[u8]) -> io::Result<()> {
        match self {
            Sink::Plain(w) => w.write_all(buf).await,
            Sink::Tls(w) => {
                w.write_all(buf).await?;
                w.flush().await
            }
        }
    }

    /// Ends the write direction (TLS: `close_notify` first).
    pub(crate) async fn shutdown(&mut self) -> io::Result<()> {
        match self {
            Sink::Plain(w) => w.shutdown().await,
            Sink::Tls(w) => w.shutdown().await,
        }
    }
}
