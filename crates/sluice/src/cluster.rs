//! An embedded local cluster: a coordinator and N servers started as child processes of this
//! binary on loopback, with temporary data directories. Used by `sluice local` and the
//! end-to-end benchmarks; the children are killed when the cluster is dropped.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context};

/// A child `sluice` process.
pub struct Child {
    proc: std::process::Child,
    pub addr: SocketAddr,
    /// The metrics endpoint, when started with `--metrics-listen`.
    pub metrics: Option<SocketAddr>,
}

impl Child {
    /// Spawns `sluice ARGS` and waits (bounded) for its `listening on` line.
    pub fn spawn(args: &[String]) -> anyhow::Result<Child> {
        let exe = std::env::current_exe().context("locating the sluice binary")?;
        let mut proc = Command::new(exe)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("spawning a sluice child")?;
        let stdout = proc.stdout.take().expect("piped stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                for (key, prefix) in [("listen", "listening on "), ("metrics", "metrics on ")] {
                    if let Some(a) = line.strip_prefix(prefix) {
                        let _ = tx.send((key, a.trim().to_owned()));
                    }
                }
            }
        });
        let wants_metrics = args.iter().any(|a| a == "--metrics-listen");
        let (mut addr, mut metrics) = (None, None);
        while addr.is_none() || (wants_metrics && metrics.is_none()) {
            match rx.recv_timeout(Duration::from_secs(20)) {
                Ok(("listen", a)) => addr = Some(a.parse().context("parsing the child's address")?),
                Ok((_, a)) => metrics = Some(a.parse().context("parsing the metrics address")?),
                Err(_) => {
                    let _ = proc.kill();
                    bail!("sluice {} did not start within 20 s", args.join(" "));
                }
            }
        }
        Ok(Child { proc, addr: addr.expect("set above"), metrics })
    }

    /// One counter or gauge from the child's metrics endpoint (0 when unavailable).
    pub fn metric(&self, name: &str) -> u64 {
        use std::io::{Read, Write};
        let Some(addr) = self.metrics else { return 0 };
        let Ok(mut s) = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)) else {
            return 0;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        let _ = s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n");
        let mut text = String::new();
        let _ = s.read_to_string(&mut text);
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Process id.
    pub fn pid(&self) -> u32 {
        self.proc.id()
    }

    /// Peak resident memory (VmHWM) in bytes, from /proc.
    pub fn peak_rss_bytes(&self) -> u64 {
        proc_status_kib(self.pid(), "VmHWM:") * 1024
    }

    /// Current resident memory (VmRSS) in bytes.
    pub fn rss_bytes(&self) -> u64 {
        proc_status_kib(self.pid(), "VmRSS:") * 1024
    }
}

/// CPU seconds (user + system) a process has used, from /proc/<pid>/stat.
pub fn cpu_seconds(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return 0.0 };
    // Fields after the parenthesised command name; utime and stime are the 14th and 15th.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    let hz = rustix::param::clock_ticks_per_second() as f64;
    (ticks(11) + ticks(12)) / hz
}

/// Peak resident memory (VmHWM) of this process in bytes: `sluice local`'s maps and readers.
pub fn own_peak_rss_bytes() -> u64 {
    proc_status_kib(std::process::id(), "VmHWM:") * 1024
}

fn proc_status_kib(pid: u32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.proc.kill();
        let _ = self.proc.wait();
    }
}

/// What to start.
pub struct ClusterSpec {
    pub servers: usize,
    pub memory_budget_bytes: u64,
    /// Parent of the data directories; a temporary directory when `None`.
    pub data_root: Option<PathBuf>,
    /// Extra `--set key=value` per server (index → settings).
    pub server_sets: Vec<Vec<String>>,
}

/// A running cluster.
pub struct Cluster {
    pub coordinator: Child,
    pub servers: Vec<Child>,
    _data: tempfile::TempDir,
}

impl Cluster {
    pub fn start(spec: &ClusterSpec) -> anyhow::Result<Cluster> {
        let data = match &spec.data_root {
            Some(root) => tempfile::Builder::new().prefix("sluice-").tempdir_in(root)?,
            None => tempfile::Builder::new().prefix("sluice-").tempdir()?,
        };
        let coordinator =
            Child::spawn(&["coordinator".into(), "--listen".into(), "127.0.0.1:0".into()])?;
        let mut servers = Vec::new();
        for i in 0..spec.servers {
            let mut args: Vec<String> = vec![
                "server".into(),
                "--listen".into(),
                "127.0.0.1:0".into(),
                "--data-dir".into(),
                data.path().join(format!("server-{i}")).display().to_string(),
                "--memory-budget-bytes".into(),
                spec.memory_budget_bytes.to_string(),
                "--coordinator".into(),
                coordinator.addr.to_string(),
                "--set".into(),
                "heartbeat_interval_ms=200".into(),
                "--metrics-listen".into(),
                "127.0.0.1:0".into(),
            ];
            for s in spec.server_sets.get(i).into_iter().flatten() {
                args.push("--set".into());
                args.push(s.clone());
            }
            servers.push(Child::spawn(&args)?);
        }
        Ok(Cluster { coordinator, servers, _data: data })
    }

    /// Waits until the coordinator assigns over all servers (they have heartbeated).
    pub async fn wait_ready(&self, client: &sluice_client::ShuffleClient) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        let probe_id = u32::MAX;
        loop {
            let reg = sluice_proto::message::RegisterShuffle {
                app_id: client.app_id().to_owned(),
                shuffle_id: probe_id,
                num_maps: 1,
                num_partitions: (self.servers.len() * 4) as u32,
                replication: 1,
            };
            let reply = client.coordinator_request(reg.into()).await;
            if let Ok(sluice_proto::Message::Assignment(a)) = &reply {
                let forget = sluice_proto::message::UnregisterShuffle {
                    app_id: client.app_id().to_owned(),
                    shuffle_id: probe_id,
                };
                let _ = client.coordinator_request(forget.into()).await;
                if a.servers.len() == self.servers.len() {
                    return Ok(());
                }
            }
            if tokio::time::Instant::now() > deadline {
                bail!("servers did not all register with the coordinator within 20 s");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}
