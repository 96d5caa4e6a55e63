//! Socket options shared by both sides.

use std::time::Duration;

use tokio::net::TcpStream;

/// Idle time before the first keepalive probe. A peer whose host dies without a FIN or RST (a
/// power loss, a pulled cable, a partition) otherwise keeps its connection, and on a server its
/// `max_connections` slot, until the kernel's default of two hours; with these three values it
/// is gone within about a minute (30 s idle, then 3 probes 10 s apart).
pub(crate) const KEEPALIVE_IDLE: Duration = Duration::from_secs(30);
/// Time between unanswered keepalive probes.
pub(crate) const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// Unanswered probes after which the kernel drops the connection (reads fail with
/// `ETIMEDOUT`, which the reader reports and the connection ends on).
pub(crate) const KEEPALIVE_PROBES: u32 = 3;

/// Sets `TCP_NODELAY`, TCP keepalive ([`KEEPALIVE_IDLE`], [`KEEPALIVE_INTERVAL`],
/// [`KEEPALIVE_PROBES`]) and, when given, `SO_SNDBUF` / `SO_RCVBUF` (bytes; the kernel may round
/// them and Linux doubles them for bookkeeping).
pub(crate) fn configure(
    stream: &TcpStream,
    nodelay: bool,
    send_buffer_bytes: Option<usize>,
    recv_buffer_bytes: Option<usize>,
) -> std::io::Result<()> {
    stream.set_nodelay(nodelay)?;
    let sock = socket2::SockRef::from(stream);
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(KEEPALIVE_IDLE)
        .with_interval(KEEPALIVE_INTERVAL)
        .with_retries(KEEPALIVE_PROBES);
    sock.set_tcp_keepalive(&keepalive)?;
    if let Some(n) = send_buffer_bytes {
        sock.set_send_buffer_size(n)?;
    }
    if let Some(n) = recv_buffer_bytes {
        sock.set_recv_buffer_size(n)?;
    }
    Ok(())
}
