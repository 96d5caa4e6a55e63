//! An embedded local cluster: a coordinator and N servers started as child processes of this
//! binary on loopback, with temporary data directories. Used by `sluice local` and the
//! end-to-end benchmarks; the children are killed when the cluster is dropped. Starting and
//! watching the children is `sluice-testkit`'s, shared with the integration tests.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use sluice_testkit::{proc_status_kib, Launcher, Proc, ServerSpec, TestPki};

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

/// One counter or gauge from a child's metrics endpoint (0 when unavailable).
pub fn metric(child: &Proc, name: &str) -> u64 {
    child.scrape().map_or(0.0, |m| sluice_testkit::metric(&m, name)) as u64
}

/// What to start.
pub struct ClusterSpec {
    pub servers: usize,
    pub memory_budget_bytes: u64,
    /// Parent of the data directories; a temporary directory when `None`.
    pub data_root: Option<PathBuf>,
    /// Extra `--set key=value` per server (index → settings).
    pub server_sets: Vec<Vec<String>>,
    /// `admin_token` of the coordinator and every server (`None`: their write endpoints are
    /// open).
    pub admin_token: Option<String>,
    /// TLS on every listener, with certificates of a throw-away CA made for this cluster.
    pub tls: bool,
}

/// A running cluster.
pub struct Cluster {
    pub coordinator: Proc,
    pub servers: Vec<Proc>,
    /// The throw-away CA's certificate when the cluster runs TLS.
    pub tls_ca: Option<PathBuf>,
    /// Holds the data directories; dropped after the children.
    _launcher: Launcher,
}

impl Cluster {
    pub fn start(spec: &ClusterSpec) -> anyhow::Result<Cluster> {
        let exe = std::env::current_exe().context("locating the sluice binary")?;
        let launcher = Launcher::new(exe, "sluice-", spec.data_root.as_deref())?;
        let token_set: Vec<String> =
            spec.admin_token.iter().map(|t| format!("admin_token={t}")).collect();
        let (tls_ca, tls_sets) = match spec.tls {
            false => (None, Vec::new()),
            true => {
                let pki = TestPki::new(launcher.path(), "sluice-local")?;
                let (cert, key) = pki.issue("loopback", &["127.0.0.1", "localhost"], false)?;
                let sets = vec![
                    format!("transport.tls.cert_file=\"{}\"", cert.display()),
                    format!("transport.tls.key_file=\"{}\"", key.display()),
                ];
                (Some(pki.ca_file()), sets)
            }
        };
        let coordinator_sets: Vec<String> = token_set.iter().chain(&tls_sets).cloned().collect();
        let mut coordinator = launcher.coordinator_with_admin(
            &coordinator_sets
                .iter()
                .flat_map(|s| ["--set".to_owned(), s.clone()])
                .collect::<Vec<_>>(),
        )?;
        coordinator.tls_ca = tls_ca.clone();
        let mut servers = Vec::new();
        for i in 0..spec.servers {
            let mut sets = token_set.clone();
            sets.extend(tls_sets.iter().cloned());
            if let Some(ca) = &tls_ca {
                sets.push(format!("coordinator_tls.ca_file=\"{}\"", ca.display()));
            }
            sets.extend(spec.server_sets.get(i).cloned().unwrap_or_default());
            let server = ServerSpec {
                data_dirs: vec![launcher.path().join(format!("server-{i}"))],
                memory_budget_bytes: spec.memory_budget_bytes,
                coordinator: Some(coordinator.addr),
                metrics: true,
                sets,
                listen: None,
                run_under: Vec::new(),
            };
            let mut server = launcher.server(&server)?;
            server.tls_ca = tls_ca.clone();
            servers.push(server);
        }
        Ok(Cluster { coordinator, servers, tls_ca, _launcher: launcher })
    }

    /// Client transport settings for this cluster: TLS trusting its CA when it runs TLS.
    pub fn client_transport(&self) -> sluice_transport::ClientConfig {
        let tls = self.tls_ca.as_ref().map(|ca| sluice_transport::TlsClientConfig {
            ca_file: ca.clone(),
            ..Default::default()
        });
        sluice_transport::ClientConfig { tls, ..Default::default() }
    }

    /// Waits until the coordinator assigns over all servers (they have heartbeated).
    pub async fn wait_ready(&self) -> anyhow::Result<()> {
        let transport = self.client_transport();
        let limit = Duration::from_secs(20);
        sluice_testkit::wait_registered(
            self.coordinator.addr,
            self.servers.len(),
            limit,
            &transport,
        )
        .await
    }
}
