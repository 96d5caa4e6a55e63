//! Children that share one temporary directory.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::Proc;

/// Starts `sluice` children whose data directories (and log files, when asked for) lie in one
/// temporary directory, deleted when the launcher is dropped — so drop it after the children
/// (a struct's fields drop in order: declare it last).
pub struct Launcher {
    /// The `sluice` binary.
    exe: PathBuf,
    /// `Some(filter)`: each child's stderr goes to `<name>-<n>.log` in the directory, with
    /// `RUST_LOG=filter`; `None`: children share our stderr and environment.
    log_filter: Option<String>,
    dir: tempfile::TempDir,
    /// Numbers the files and directories handed out, so no two children share one.
    next: AtomicUsize,
}

impl Launcher {
    /// A launcher of `exe` with a fresh directory named `prefix…` under `parent` (the system's
    /// temporary directory when `None`). Children share our stderr until [`Self::log_to_files`].
    pub fn new(
        exe: impl Into<PathBuf>,
        prefix: &str,
        parent: Option<&Path>,
    ) -> std::io::Result<Launcher> {
        let mut builder = tempfile::Builder::new();
        builder.prefix(prefix);
        let dir = match parent {
            Some(parent) => builder.tempdir_in(parent)?,
            None => builder.tempdir()?,
        };
        Ok(Launcher { exe: exe.into(), log_filter: None, dir, next: AtomicUsize::new(0) })
    }

    /// Each child started from now on logs at `filter` (a `RUST_LOG` value) to its own file,
    /// which [`Proc::log_text`] reads back.
    pub fn log_to_files(mut self, filter: impl Into<String>) -> Launcher {
        self.log_filter = Some(filter.into());
        self
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// A path in the directory no other call returns: `<name>-<n>`.
    pub fn unique_path(&self, name: &str) -> PathBuf {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        self.path().join(format!("{name}-{n}"))
    }

    /// `sluice ARGS`, its log (when logging to files) named after `name`.
    pub fn spawn(&self, name: &str, args: &[String]) -> anyhow::Result<Proc> {
        self.spawn_under(&[], name, args)
    }

    /// [`Self::spawn`] run by `under` (a command and its arguments that runs the rest of its
    /// command line in its place, as `setpriv …` does; empty: none).
    pub fn spawn_under(
        &self,
        under: &[String],
        name: &str,
        args: &[String],
    ) -> anyhow::Result<Proc> {
        let mut command = match under.split_first() {
            Some((run, its_args)) => {
                let mut c = Command::new(run);
                c.args(its_args).arg(&self.exe);
                c
            }
            None => Command::new(&self.exe),
        };
        let log = self.log_filter.as_ref().map(|filter| {
            command.env("RUST_LOG", filter);
            self.unique_path(name).with_extension("log")
        });
        Proc::spawn(command, args, log.as_deref())
    }

    /// `sluice coordinator --listen LISTEN`.
    pub fn coordinator_on(&self, listen: &str) -> anyhow::Result<Proc> {
        self.spawn("coordinator", &["coordinator", "--listen", listen].map(String::from))
    }

    /// `sluice coordinator --listen 127.0.0.1:0`.
    pub fn coordinator(&self) -> anyhow::Result<Proc> {
        self.coordinator_on("127.0.0.1:0")
    }

    /// `sluice coordinator --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 EXTRA…`: a
    /// coordinator with its admin endpoint (status page, JSON API, metrics) on a free port.
    pub fn coordinator_with_admin(&self, extra: &[String]) -> anyhow::Result<Proc> {
        let mut args: Vec<String> =
            ["coordinator", "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"]
                .map(String::from)
                .to_vec();
        args.extend(extra.iter().cloned());
        self.spawn("coordinator", &args)
    }

    /// `sluice server` as described by `spec`; with no data directory named, one fresh
    /// directory in this launcher's.
    pub fn server(&self, spec: &ServerSpec) -> anyhow::Result<Proc> {
        let mut args = spec.args();
        if spec.data_dirs.is_empty() {
            args.push("--data-dir".into());
            args.push(self.unique_path("data").display().to_string());
        }
        self.spawn_under(&spec.run_under, "server", &args)
    }
}

/// How to start a server.
#[derive(Clone, Debug)]
pub struct ServerSpec {
    /// Its data directories; empty: one fresh directory of the [`Launcher`]'s.
    pub data_dirs: Vec<PathBuf>,
    /// `--memory-budget-bytes`.
    pub memory_budget_bytes: u64,
    /// The coordinator to register and heartbeat with; `None`: a server on its own, driven by
    /// hand-made assignments.
    pub coordinator: Option<SocketAddr>,
    /// Whether to open a metrics endpoint (on a free port).
    pub metrics: bool,
    /// `--set key=value` entries, after the launcher's own (so they win).
    pub sets: Vec<String>,
    /// `None`: a free port.
    pub listen: Option<SocketAddr>,
    /// A command the server is run by (see [`Launcher::spawn_under`]); empty: none.
    pub run_under: Vec<String>,
}

impl Default for ServerSpec {
    fn default() -> Self {
        ServerSpec {
            data_dirs: Vec::new(),
            memory_budget_bytes: 64 << 20,
            coordinator: None,
            metrics: false,
            sets: Vec::new(),
            listen: None,
            run_under: Vec::new(),
        }
    }
}

impl ServerSpec {
    /// The default spec, registering with `coordinator`.
    pub fn with_coordinator(coordinator: SocketAddr) -> Self {
        ServerSpec { coordinator: Some(coordinator), ..Default::default() }
    }

    /// The `sluice server` arguments, `--data-dir` for each of `data_dirs`. Heartbeats every
    /// 200 ms (not the default second), so a coordinator knows a fresh server quickly.
    fn args(&self) -> Vec<String> {
        let listen = self.listen.map_or("127.0.0.1:0".to_owned(), |a| a.to_string());
        let mut args: Vec<String> = vec!["server".into(), "--listen".into(), listen];
        for d in &self.data_dirs {
            args.push("--data-dir".into());
            args.push(d.display().to_string());
        }
        args.push("--memory-budget-bytes".into());
        args.push(self.memory_budget_bytes.to_string());
        if let Some(c) = self.coordinator {
            args.push("--coordinator".into());
            args.push(c.to_string());
        }
        if self.metrics {
            args.push("--metrics-listen".into());
            args.push("127.0.0.1:0".into());
        }
        args.push("--set".into());
        args.push("heartbeat_interval_ms=200".into());
        for s in &self.sets {
            args.push("--set".into());
            args.push(s.clone());
        }
        args
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_args_put_the_specs_sets_after_the_launchers() {
        let spec = ServerSpec {
            data_dirs: vec!["/d1".into(), "/d2".into()],
            coordinator: Some(([127, 0, 0, 1], 9096).into()),
            metrics: true,
            sets: vec!["heartbeat_interval_ms=50".into()],
            ..Default::default()
        };
        let args = spec.args().join(" ");
        assert_eq!(
            args,
            "server --listen 127.0.0.1:0 --data-dir /d1 --data-dir /d2 \
             --memory-budget-bytes 67108864 --coordinator 127.0.0.1:9096 \
             --metrics-listen 127.0.0.1:0 --set heartbeat_interval_ms=200 \
             --set heartbeat_interval_ms=50"
        );
    }

    #[test]
    fn unique_paths_differ() {
        let l = Launcher::new("sluice", "sluice-testkit-", None).unwrap();
        assert_ne!(l.unique_path("data"), l.unique_path("data"));
        assert!(l.unique_path("server").starts_with(l.path()));
    }
}
