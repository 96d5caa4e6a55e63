//! The kernel baseline of `sluice bench push`: the same bytes received by a plain blocking loop
//! (no runtime, no framing, no memory budget) that reads each connection into a buffer and
//! writes it to a file, in a process of its own (`sluice bench push-sink`) whose CPU is counted as
//! the Sluice server's is.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use anyhow::{bail, Context};
use clap::Args;

use crate::cluster::cpu_seconds;

/// Flags of the hidden `sluice bench push-sink`.
#[derive(Args, Debug, Clone)]
pub struct SinkArgs {
    /// Where each connection's file is written (deleted when the connection ends).
    #[arg(long)]
    pub dir: PathBuf,
    /// Bytes of the buffer each connection is read into, and of each write to its file.
    #[arg(long, default_value_t = 1 << 20)]
    pub buffer_bytes: usize,
}

/// The sink: prints `port N`, then serves connections, one blocking thread each, until its stdin
/// closes. A connection's bytes go to a file of their own; at the sender's end of stream the
/// sink answers the byte count (8 bytes, big-endian) once every byte is written.
pub fn run_sink(args: SinkArgs) -> anyhow::Result<()> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    println!("port {}", listener.local_addr()?.port());
    std::io::stdout().flush()?;
    std::thread::spawn(|| {
        let mut sink = Vec::new();
        let _ = std::io::stdin().read_to_end(&mut sink);
        std::process::exit(0);
    });
    for (n, stream) in listener.incoming().enumerate() {
        let Ok(stream) = stream else { continue };
        let (path, size) = (args.dir.join(format!("conn-{n}.data")), args.buffer_bytes);
        std::thread::spawn(move || {
            if let Err(e) = sink_conn(stream, &path, size) {
                eprintln!("push-sink: connection {n}: {e:#}");
            }
            let _ = std::fs::remove_file(&path);
        });
    }
    Ok(())
}

fn sink_conn(mut s: TcpStream, path: &std::path::Path, size: usize) -> anyhow::Result<()> {
    let mut file = std::fs::File::create(path)?;
    let mut buf = vec![0u8; size];
    let mut total = 0u64;
    loop {
        let n = s.read(&mut buf)?;
        if n == 0 {
            break;
        }
        file.write_all(&buf[..n])?;
        total += n as u64;
    }
    s.write_all(&total.to_be_bytes())?;
    Ok(())
}

/// The sink process, started from this binary.
pub struct Sink {
    child: Child,
    addr: SocketAddr,
}

impl Sink {
    pub fn start(dir: &std::path::Path, buffer_bytes: usize) -> anyhow::Result<Sink> {
        let mut child = Command::new(std::env::current_exe()?)
            .args(["bench", "push-sink", "--buffer-bytes", &buffer_bytes.to_string(), "--dir"])
            .arg(dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("starting the push sink")?;
        let mut line = String::new();
        BufReader::new(child.stdout.take().context("sink stdout")?).read_line(&mut line)?;
        let port: u16 = line.trim().strip_prefix("port ").context("sink's port line")?.parse()?;
        Ok(Sink { child, addr: SocketAddr::from(([127, 0, 0, 1], port)) })
    }

    pub fn cpu_seconds(&self) -> f64 {
        cpu_seconds(self.child.id())
    }

    /// Sends `bytes` over `conns` connections at once, in writes of `write_bytes` taken from
    /// `payload` (as the push writers' frames are), and waits until the sink wrote them all.
    pub fn send(
        &self,
        conns: u32,
        bytes: u64,
        write_bytes: usize,
        payload: &[u8],
    ) -> anyhow::Result<()> {
        let per_conn = bytes / conns as u64;
        std::thread::scope(|scope| {
            let handles: Vec<_> = (0..conns)
                .map(|_| scope.spawn(|| send_one(self.addr, per_conn, write_bytes, payload)))
                .collect();
            handles.into_iter().try_for_each(|h| h.join().expect("sender thread panicked"))
        })
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

fn send_one(
    addr: SocketAddr,
    bytes: u64,
    write_bytes: usize,
    payload: &[u8],
) -> anyhow::Result<()> {
    let mut s = TcpStream::connect(addr)?;
    s.set_nodelay(true)?;
    let mut left = bytes;
    while left > 0 {
        let n = (left as usize).min(write_bytes).min(payload.len());
        s.write_all(&payload[..n])?;
        left -= n as u64;
    }
    s.shutdown(std::net::Shutdown::Write)?;
    let mut ack = [0u8; 8];
    s.read_exact(&mut ack)?;
    let got = u64::from_be_bytes(ack);
    if got != bytes {
        bail!("the sink wrote {got} of {bytes} bytes");
    }
    Ok(())
}
