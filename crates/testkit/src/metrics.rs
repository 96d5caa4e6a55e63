//! Reading a child's Prometheus endpoint.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// `GET /metrics` from `addr` → `name → value`, comments skipped; a labelled series is keyed
/// with its labels. The whole exchange is bounded by `limit`: a child that hangs fails the
/// scrape instead of the caller.
pub fn scrape(addr: SocketAddr, limit: Duration) -> io::Result<HashMap<String, f64>> {
    scrape_tls(addr, limit, None)
}

/// [`scrape`] over TLS, trusting the CA in `ca` (PEM) when given: the endpoint of a process
/// whose listeners run TLS.
pub fn scrape_tls(
    addr: SocketAddr,
    limit: Duration,
    ca: Option<&std::path::Path>,
) -> io::Result<HashMap<String, f64>> {
    let deadline = Instant::now() + limit;
    let tcp = TcpStream::connect_timeout(&addr, limit)?;
    tcp.set_write_timeout(Some(limit))?;
    tcp.set_read_timeout(Some(limit))?;
    let mut s: Box<dyn ReadWrite> = match ca {
        None => Box::new(tcp.try_clone()?),
        Some(ca) => {
            let cfg =
                sluice_transport::TlsClientConfig { ca_file: ca.to_owned(), ..Default::default() }
                    .load()
                    .map_err(io::Error::other)?;
            let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
            let conn = rustls::ClientConnection::new(cfg, name).map_err(io::Error::other)?;
            Box::new(rustls::StreamOwned::new(conn, tcp.try_clone()?))
        }
    };
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")?;
    // HTTP/1.0: the answer ends where the connection does.
    let mut answer = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            let why = format!("metrics from {addr}: no whole answer within {limit:?}");
            return Err(io::Error::new(io::ErrorKind::TimedOut, why));
        }
        tcp.set_read_timeout(Some(left))?;
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
            // A TLS peer that closes without close_notify: the HTTP/1.0 answer ended anyway.
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof && ca.is_some() => break,
            Err(e) => return Err(e),
        }
    }
    Ok(parse(&String::from_utf8_lossy(&answer)))
}

/// A plain or TLS stream to read an answer from.
trait ReadWrite: Read + Write {}
impl<T: Read + Write> ReadWrite for T {}

/// The samples of an HTTP answer carrying the Prometheus text format.
fn parse(answer: &str) -> HashMap<String, f64> {
    let body = answer.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    body.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.trim().to_owned(), v.trim().parse().ok()?))
        })
        .collect()
}

/// A metric's value in a [`scrape`] (0 when absent, as a counter that never moved is).
pub fn metric(m: &HashMap<String, f64>, name: &str) -> f64 {
    m.get(name).copied().unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_samples_and_skips_headers_and_comments() {
        let answer = "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n\
            # TYPE sluice_server_commits_total counter\n\
            sluice_server_commits_total 3\n\
            \n\
            sluice_server_dir_free_bytes{dir=\"/a b\"} 1.5e3\n\
            not_a_number x\n";
        let m = parse(answer);
        assert_eq!(m.len(), 2, "{m:?}");
        assert_eq!(metric(&m, "sluice_server_commits_total"), 3.0);
        assert_eq!(metric(&m, "sluice_server_dir_free_bytes{dir=\"/a b\"}"), 1500.0);
        assert_eq!(metric(&m, "absent"), 0.0);
        assert!(parse("no header end").is_empty());
    }
}
