//! One `sluice` child process.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

/// How long a child may take to print its address line(s).
pub const START_TIMEOUT: Duration = Duration::from_secs(20);

/// How long a metrics scrape may take.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(5);

/// A line the child prints on stdout once its socket is bound (`sluice serve` prints them).
enum AddressLine {
    /// `listening on ADDR`: the protocol port.
    Listening(String),
    /// `metrics on ADDR`: the Prometheus endpoint, when started with `--metrics-listen`.
    Metrics(String),
}

/// A child `sluice` process, SIGKILLed and reaped on drop.
pub struct Proc {
    /// `None` once killed.
    child: Option<Child>,
    pid: u32,
    /// The protocol address it printed (`listening on ADDR`).
    pub addr: SocketAddr,
    /// The metrics address it printed (`metrics on ADDR`), when started with `--metrics-listen`.
    pub metrics: Option<SocketAddr>,
    /// The file its stderr goes to; `None` when it shares ours.
    log: Option<PathBuf>,
    /// The CA (PEM) of its certificate when its listeners run TLS: scrapes trust it.
    pub tls_ca: Option<PathBuf>,
}

impl Proc {
    /// Runs `command ARGS` (the `sluice` binary, with whatever environment the caller set) and
    /// waits, at most [`START_TIMEOUT`], for its `listening on` line — and its `metrics on` line
    /// when `ARGS` has `--metrics-listen`. Its stdin is closed; its stdout is drained for its
    /// whole life (a full pipe would stall it); its stderr goes to `log` when given, else to
    /// ours. A child that exits or stays silent is killed and the error says so, with its log.
    pub fn spawn(
        mut command: Command,
        args: &[String],
        log: Option<&Path>,
    ) -> anyhow::Result<Proc> {
        let what = format!("sluice {}", args.join(" "));
        let stderr = match log {
            Some(path) => Stdio::from(
                std::fs::File::create(path)
                    .with_context(|| format!("creating the log file {}", path.display()))?,
            ),
            None => Stdio::inherit(),
        };
        let mut child = command
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .with_context(|| format!("spawning {what}"))?;
        let stdout = child.stdout.take().context("the child's piped stdout")?;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let found = if let Some(a) = line.strip_prefix("listening on ") {
                    AddressLine::Listening(a.trim().to_owned())
                } else if let Some(a) = line.strip_prefix("metrics on ") {
                    AddressLine::Metrics(a.trim().to_owned())
                } else {
                    continue;
                };
                let _ = tx.send(found);
            }
        });
        let mut proc = Proc {
            pid: child.id(),
            child: Some(child),
            addr: ([0, 0, 0, 0], 0).into(),
            metrics: None,
            log: log.map(Path::to_owned),
            tls_ca: None,
        };
        let wants_metrics = args.iter().any(|a| a == "--metrics-listen");
        let deadline = Instant::now() + START_TIMEOUT;
        let mut have_addr = false;
        while !have_addr || (wants_metrics && proc.metrics.is_none()) {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(AddressLine::Listening(a)) => {
                    proc.addr =
                        a.parse().with_context(|| format!("{what} printed address {a:?}"))?;
                    have_addr = true;
                }
                Ok(AddressLine::Metrics(a)) => {
                    let addr =
                        a.parse().with_context(|| format!("{what} printed metrics {a:?}"))?;
                    proc.metrics = Some(addr);
                }
                // Dropping `proc` on the way out kills and reaps the child.
                Err(RecvTimeoutError::Timeout) => bail!(
                    "{what} did not print its address within {START_TIMEOUT:?}{}",
                    proc.log_for_error()
                ),
                Err(RecvTimeoutError::Disconnected) => {
                    bail!("{what} exited before printing its address{}", proc.log_for_error())
                }
            }
        }
        Ok(proc)
    }

    /// Process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The file its stderr (its log) goes to, when not ours.
    pub fn log_path(&self) -> Option<&Path> {
        self.log.as_deref()
    }

    /// SIGKILL and reap (idempotent): a crash, as far as the rest of the cluster can tell.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        match &mut self.child {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Peak resident memory (VmHWM) in bytes, from `/proc`.
    pub fn peak_rss_bytes(&self) -> u64 {
        proc_status_kib(self.pid, "VmHWM:") * 1024
    }

    /// Current resident memory (VmRSS) in bytes, from `/proc`.
    pub fn rss_bytes(&self) -> u64 {
        proc_status_kib(self.pid, "VmRSS:") * 1024
    }

    /// Whether the kernel may back the child's memory with transparent huge pages
    /// (`THP_enabled` in /proc/PID/status); `None` when the kernel does not say.
    pub fn thp_enabled(&self) -> Option<bool> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).ok()?;
        let line = status.lines().find(|l| l.starts_with("THP_enabled:"))?;
        Some(line.split_whitespace().nth(1)? != "0")
    }

    /// The child's stderr so far, when it goes to a log file (empty otherwise).
    pub fn log_text(&self) -> String {
        self.log.as_ref().and_then(|p| std::fs::read_to_string(p).ok()).unwrap_or_default()
    }

    /// Every value on the child's metrics endpoint (see [`crate::scrape`]).
    pub fn scrape(&self) -> std::io::Result<HashMap<String, f64>> {
        let addr = self.metrics.ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::NotFound, "started without --metrics-listen")
        })?;
        crate::scrape_tls(addr, SCRAPE_TIMEOUT, self.tls_ca.as_deref())
    }

    /// `; log:` and the log, for an error message, when there is a log file.
    fn log_for_error(&self) -> String {
        match &self.log {
            Some(_) => format!("; log:\n{}", self.log_text()),
            None => String::new(),
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A `/proc/<pid>/status` field in KiB (0 when unreadable).
pub fn proc_status_kib(pid: u32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> (Command, Vec<String>) {
        (Command::new("sh"), vec!["-c".into(), script.into()])
    }

    #[test]
    fn reads_the_address_lines_and_kills_on_drop() {
        let (cmd, mut args) = sh("echo starting; echo 'listening on 127.0.0.1:5'; \
             echo 'metrics on 127.0.0.1:6'; exec sleep 30");
        // Makes it wait for the metrics line too (`sh -c` takes it as `$0`).
        args.push("--metrics-listen".into());
        let mut p = Proc::spawn(cmd, &args, None).unwrap();
        assert_eq!(p.addr, "127.0.0.1:5".parse().unwrap());
        assert_eq!(p.metrics, Some("127.0.0.1:6".parse().unwrap()));
        assert!(p.is_running());
        let pid = p.pid();
        drop(p);
        assert!(!Path::new(&format!("/proc/{pid}")).exists(), "killed and reaped");
    }

    #[test]
    fn a_child_that_exits_first_is_an_error_with_its_log() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("x.log");
        let (cmd, args) = sh("echo 'bad flag' >&2; exit 2");
        let e = Proc::spawn(cmd, &args, Some(&log)).err().expect("an error").to_string();
        assert!(e.contains("exited before printing its address; log:\nbad flag"), "{e}");
    }
}
