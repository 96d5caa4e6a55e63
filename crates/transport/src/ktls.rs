//! Which path encrypts a TLS data connection's bytes, decided after each rustls handshake: the
//! kernel (kTLS), when it offers the `tls` ULP and the negotiated cipher, or rustls in user space.
//!
//! kTLS: the `ktls` crate drains what rustls has already decrypted (the handshake is read record
//! by record through its `CorkStream`, so rustls holds no partial record), takes the session keys
//! out of rustls and gives them to the socket (`TCP_ULP "tls"`, then `SOL_TLS` `TLS_TX`/`TLS_RX`).
//! From then on the socket is used as a plain one: the writer's `writev` and `sendfile`
//! ([`Sink::Ktls`]) hand plaintext to the kernel, which encrypts it; [`KtlsReader`] reads
//! plaintext and turns the records that are not application data (an alert, a post-handshake
//! message) into an end of stream or a clear error.
//!
//! Every failure that can be foreseen falls back to user space before the keys leave rustls,
//! counted (`ktls_fallbacks`) and logged: kTLS off in the configuration, the kernel refusing the
//! ULP or the cipher (probed once per process, on a loopback connection of its own), a cipher the
//! kernel lacks. Once the keys are out of rustls there is no way back: a failure at that point
//! (the socket broke while draining, or the kernel refused what the probe accepted) closes that
//! one connection, counted (`ktls_failures`) and logged.

use std::io;
use std::os::fd::AsRawFd;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use ktls::{CompatibleCiphers, CorkStream};
use tokio::io::{AsyncRead, AsyncWriteExt, ReadBuf};
use tokio::net::tcp::OwnedReadHalf;
use tokio::net::TcpStream;

use crate::stats::TransportStats;
use crate::stream::Sink;
use crate::sys;
use crate::tls::TlsListener;

/// An accepted TLS connection's two halves.
pub(crate) type Halves = (Box<dyn AsyncRead + Send + Unpin>, Sink);

/// What the kernel offers, probed once per process (when a listener with `ktls` on first
/// accepts): the ciphers it takes, or why kTLS cannot run here.
async fn kernel_ciphers() -> Result<&'static CompatibleCiphers, &'static str> {
    static PROBE: tokio::sync::OnceCell<Result<CompatibleCiphers, String>> =
        tokio::sync::OnceCell::const_new();
    let probed = PROBE
        .get_or_init(|| async {
            match CompatibleCiphers::new().await {
                Err(e) => Err(format!("probing the kernel's kTLS failed: {e}")),
                Ok(c) if !any(&c) => Err(format!(
                    "the kernel refused the `tls` ULP (kTLS) on a test connection{}",
                    if crate::tls::ktls_available() {
                        ""
                    } else {
                        ": `tls` is not in /proc/sys/net/ipv4/tcp_available_ulp (modprobe tls)"
                    }
                )),
                Ok(c) => Ok(c),
            }
        })
        .await;
    probed.as_ref().map_err(|e| e.as_str())
}

fn any(c: &CompatibleCiphers) -> bool {
    [&c.tls12, &c.tls13].iter().any(|v| v.aes_gcm_128 || v.aes_gcm_256 || v.chacha20_poly1305)
}

/// The TLS handshake of an accepted connection, then the hand-off to the kernel where it can
/// run; each bounded by `limit`. `None` when the handshake failed (counted in
/// `tls_handshakes_failed`: a plain-text client, an untrusted or expired certificate, a missing
/// client certificate under mTLS) or a hand-off past the point of no return did (`ktls_failures`),
/// logged.
pub(crate) async fn accept(
    tls: &TlsListener,
    stream: TcpStream,
    limit: Duration,
    stats: &TransportStats,
) -> Option<Halves> {
    let kernel = if tls.ktls() {
        kernel_ciphers().await
    } else {
        Err("kTLS is off in the configuration (transport.tls.ktls = false)")
    };
    let ciphers = match kernel {
        Ok(c) => c,
        Err(why) => {
            let s = handshake(tls.acceptor().accept(stream), limit, stats).await?;
            return Some(user_space(s, why, stats));
        }
    };
    let s = handshake(tls.acceptor().accept(CorkStream::new(stream)), limit, stats).await?;
    let suite = s.get_ref().1.negotiated_cipher_suite();
    if !suite.is_some_and(|c| ciphers.is_compatible(c)) {
        let why = format!("the kernel has no kTLS for the negotiated cipher suite {suite:?}");
        return Some(user_space(s, &why, stats));
    }
    match tokio::time::timeout(limit, hand_off(s)).await {
        Ok(Ok(halves)) => {
            TransportStats::add(&stats.ktls_connections, 1);
            log_path_once(
                &KTLS_LOGGED,
                "TLS: kTLS: the session keys went to the kernel, which encrypts; chunks go out with sendfile",
            );
            Some(halves)
        }
        Ok(Err(e)) => {
            TransportStats::add(&stats.ktls_failures, 1);
            tracing::warn!(error = %e, "kTLS hand-off failed after the keys left rustls; closing this connection");
            None
        }
        Err(_) => {
            TransportStats::add(&stats.ktls_failures, 1);
            tracing::warn!(
                after_ms = limit.as_millis() as u64,
                "kTLS hand-off timed out (the peer did not finish its record); closing this connection"
            );
            None
        }
    }
}

async fn handshake<S>(
    accept: tokio_rustls::Accept<S>,
    limit: Duration,
    stats: &TransportStats,
) -> Option<tokio_rustls::server::TlsStream<S>>
where
    S: AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    match tokio::time::timeout(limit, accept).await {
        Ok(Ok(s)) => Some(s),
        Ok(Err(e)) => {
            TransportStats::add(&stats.tls_handshakes_failed, 1);
            tracing::info!(error = %e, "TLS handshake failed; closing");
            None
        }
        Err(_) => {
            TransportStats::add(&stats.tls_handshakes_failed, 1);
            tracing::info!(after_ms = limit.as_millis() as u64, "TLS handshake timed out; closing");
            None
        }
    }
}

/// rustls keeps encrypting: counted, and the reason logged once per process.
fn user_space<S>(s: tokio_rustls::server::TlsStream<S>, why: &str, stats: &TransportStats) -> Halves
where
    S: AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    TransportStats::add(&stats.tls_connections_user_space, 1);
    TransportStats::add(&stats.ktls_fallbacks, 1);
    if !USER_SPACE_LOGGED.swap(true, Ordering::Relaxed) {
        tracing::info!(
            reason = why,
            "TLS: user space: {why}; chunks are read and encrypted by rustls, not sent with sendfile"
        );
    }
    let (rd, wr) = tokio::io::split(s);
    (Box::new(rd), Sink::Tls(Box::new(wr)))
}

static KTLS_LOGGED: AtomicBool = AtomicBool::new(false);
static USER_SPACE_LOGGED: AtomicBool = AtomicBool::new(false);

fn log_path_once(flag: &AtomicBool, what: &str) {
    if !flag.swap(true, Ordering::Relaxed) {
        tracing::info!("{what}");
    }
}

/// Flushes what rustls still holds, then gives the keys to the kernel.
async fn hand_off(
    mut s: tokio_rustls::server::TlsStream<CorkStream<TcpStream>>,
) -> Result<Halves, ktls::Error> {
    s.flush().await.map_err(ktls::Error::DrainError)?;
    let k = ktls::config_ktls_server(s).await?;
    let (drained, tcp) = k.into_raw();
    let (rd, wr) = tcp.into_split();
    let reader = KtlsReader { rd, drained: drained.unwrap_or_default(), pos: 0, ended: false };
    Ok((Box::new(reader), Sink::Ktls(wr)))
}

/// The read half of a kTLS socket: first the plaintext rustls had decrypted before the hand-off,
/// then what the kernel decrypts. A record that is not application data makes `read` fail with
/// `EIO`; it is read with its type: the peer's `close_notify` is the end of the stream, another
/// alert or a post-handshake message (a TLS 1.3 key update, which this path does not follow) is
/// an error that closes the connection.
pub(crate) struct KtlsReader {
    rd: OwnedReadHalf,
    drained: Vec<u8>,
    pos: usize,
    ended: bool,
}

impl AsyncRead for KtlsReader {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.ended {
            return Poll::Ready(Ok(()));
        }
        if this.pos < this.drained.len() {
            let n = buf.remaining().min(this.drained.len() - this.pos);
            buf.put_slice(&this.drained[this.pos..this.pos + n]);
            this.pos += n;
            if this.pos == this.drained.len() {
                this.drained = Vec::new();
                this.pos = 0;
            }
            return Poll::Ready(Ok(()));
        }
        match ready!(Pin::new(&mut this.rd).poll_read(cx, buf)) {
            Err(e) if e.raw_os_error() == Some(libc::EIO) => {
                let fd = this.rd.as_ref().as_raw_fd();
                match sys::ktls_read_control_record(fd)? {
                    Some((sys::TLS_RECORD_ALERT, [_, 0])) => {
                        this.ended = true;
                        Poll::Ready(Ok(()))
                    }
                    Some((sys::TLS_RECORD_ALERT, [level, desc])) => {
                        this.ended = true;
                        Poll::Ready(Err(io::Error::other(format!(
                            "the peer sent TLS alert {desc} (level {level})"
                        ))))
                    }
                    Some((sys::TLS_RECORD_HANDSHAKE, _)) => Poll::Ready(Err(io::Error::other(
                        "the peer sent a TLS handshake message (a key update?) on a kTLS connection: not supported, closing",
                    ))),
                    Some((t, _)) => Poll::Ready(Err(io::Error::other(format!(
                        "the peer sent a TLS record of type {t} on a kTLS connection: closing"
                    )))),
                    None => Poll::Ready(Err(e)),
                }
            }
            r => Poll::Ready(r),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// What rustls had decrypted before the hand-off comes first, then the socket's bytes, then
    /// the end (a plain socket stands in for the kTLS one: its application data reads the same).
    #[tokio::test]
    async fn the_reader_serves_the_drained_bytes_first() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut peer = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (s, _) = l.accept().await.unwrap();
        let (rd, _wr) = s.into_split();
        let drained = b"handshake frame decrypted by rustls ".to_vec();
        let mut r = KtlsReader { rd, drained: drained.clone(), pos: 0, ended: false };
        peer.write_all(b"and then the kernel's").await.unwrap();
        peer.shutdown().await.unwrap();
        // Small reads: the drained bytes are handed out in pieces, never mixed with the socket's.
        let mut first = [0u8; 10];
        let n = r.read(&mut first).await.unwrap();
        assert_eq!(&first[..n], &drained[..n]);
        let mut rest = Vec::new();
        r.read_to_end(&mut rest).await.unwrap();
        let mut all = first[..n].to_vec();
        all.extend_from_slice(&rest);
        assert_eq!(all, b"handshake frame decrypted by rustls and then the kernel's");
    }
}
