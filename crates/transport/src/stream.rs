//! A connection's two halves, plain TCP, kTLS or TLS in user space: the reader takes any
//! `AsyncRead`; the writer needs to know which, as only a socket of its own (plain, or kTLS where
//! the kernel encrypts) can take `writev` and `sendfile`.

use std::io;

use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpStream;

/// A TLS connection over TCP (either side).
pub type TlsStream = tokio_rustls::TlsStream<TcpStream>;

/// The write half of a connection.
pub enum Sink {
    /// Plain TCP: `writev` and `sendfile` on the socket.
    Plain(OwnedWriteHalf),
    /// TLS whose keys were handed to the kernel (kTLS): `writev` and `sendfile` on the socket as
    /// on a plain one, the kernel encrypting what they hand it.
    Ktls(OwnedWriteHalf),
    /// TLS in user space: bytes go through rustls, which encrypts them; file bodies are read
    /// into a buffer first (the kernel cannot encrypt what `sendfile` would hand it).
    Tls(Box<dyn AsyncWrite + Send + Unpin>),
}

impl From<OwnedWriteHalf> for Sink {
    fn from(w: OwnedWriteHalf) -> Self {
        Sink::Plain(w)
    }
}

impl Sink {
    /// Whether bytes go through TLS (in user space or in the kernel).
    pub fn is_tls(&self) -> bool {
        !matches!(self, Sink::Plain(_))
    }

    /// Writes all of `buf` and flushes it to the socket.
    pub(crate) async fn write_all_flush(&mut self, buf: &[u8]) -> io::Result<()> {
        match self {
            Sink::Plain(w) | Sink::Ktls(w) => w.write_all(buf).await,
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
            Sink::Ktls(w) => {
                use std::os::fd::AsRawFd;
                if let Err(e) = crate::sys::ktls_send_close_notify(w.as_ref().as_raw_fd()) {
                    tracing::debug!(error = %e, "kTLS close_notify not sent");
                }
                w.shutdown().await
            }
            Sink::Tls(w) => w.shutdown().await,
        }
    }
}
