//! Socket options shared by both sides.

use tokio::net::TcpStream;

/// Sets `TCP_NODELAY` and, when given, `SO_SNDBUF` / `SO_RCVBUF` (bytes; the kernel may round
/// them and Linux doubles them for bookkeeping).
pub(crate) fn configure(
    stream: &TcpStream,
    nodelay: bool,
    send_buffer_bytes: Option<usize>,
    recv_buffer_bytes: Option<usize>,
) -> std::io::Result<()> {
    stream.set_nodelay(nodelay)?;
    let sock = socket2::SockRef::from(stream);
    if let Some(n) = send_buffer_bytes {
        sock.set_send_buffer_size(n)?;
    }
    if let Some(n) = recv_buffer_bytes {
        sock.set_recv_buffer_size(n)?;
    }
    Ok(())
}
