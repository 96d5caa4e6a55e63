//! `sluice server` and `sluice coordinator`: load the config, bind, print the bound address on
//! stdout (`listening on HOST:PORT`, for scripts and tests that use port 0), serve the admin
//! endpoint (`metrics on HOST:PORT`) when asked, serve until Ctrl-C or SIGTERM (a server drains
//! first: see `server_stop`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use tokio::net::TcpListener;

use crate::settings::{load, parse_set};

/// Flags common to both services.
#[derive(Args, Debug, Clone)]
pub struct Common {
    /// TOML configuration file (see docs/configuration.md).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Listen address, `host:port` (port 0: any free port).
    #[arg(long)]
    listen: Option<String>,
    /// Serve the admin endpoint over HTTP on this address: Prometheus metrics at `/metrics`,
    /// the JSON API under `/api/v1`, `/healthz`, `/readyz` (and a coordinator's status page at
    /// `/`); see docs/operations.md.
    #[arg(long, visible_alias = "admin-listen")]
    metrics_listen: Option<String>,
    /// Override any configuration key: `--set transport.zero_copy=false`.
    #[arg(long = "set", value_parser = parse_set)]
    sets: Vec<(String, toml::Value)>,
}

/// `sluice server` flags.
#[derive(Args, Debug, Clone)]
pub struct ServerArgs {
    #[command(flatten)]
    common: Common,
    /// A data directory (repeat for several).
    #[arg(long = "data-dir")]
    data_dirs: Vec<PathBuf>,
    /// Memory budget for buffered shuffle data, in bytes.
    #[arg(long)]
    memory_budget_bytes: Option<u64>,
    /// A coordinator to heartbeat to (repeat for several).
    #[arg(long = "coordinator")]
    coordinators: Vec<String>,
    /// Delete everything in the data directories before starting, instead of serving again the
    /// committed shuffles found there.
    #[arg(long)]
    clean: bool,
}

/// `sluice coordinator` flags.
#[derive(Args, Debug, Clone)]
pub struct CoordinatorArgs {
    #[command(flatten)]
    common: Common,
}

impl Common {
    fn sets(&self, mut extra: Vec<(String, toml::Value)>) -> Vec<(String, toml::Value)> {
        if let Some(l) = &self.listen {
            extra.push(("listen".into(), toml::Value::String(l.clone())));
        }
        extra.extend(self.sets.iter().cloned());
        extra
    }
}

/// Connections the kernel may hold ready for the accept loop (it caps this at
/// `net.core.somaxconn`, 4,096 by default). `TcpListener::bind` asks for 1,024: 1,000 clients
/// connecting at once overflowed that queue (the kernel's `ListenOverflows` counter), and each
/// client whose handshake was dropped connected only after its SYN's 1 s retransmit
/// (docs/benchmarks-log.md#connections-2026-11-27).
const LISTEN_BACKLOG: u32 = 4096;

/// A listener on `addr` (address reuse on, as `TcpListener::bind` sets) with [`LISTEN_BACKLOG`].
fn listen_on(addr: std::net::SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

async fn bind(listen: &str) -> anyhow::Result<TcpListener> {
    let addrs =
        tokio::net::lookup_host(listen).await.with_context(|| format!("resolving {listen}"))?;
    let mut last = None;
    for addr in addrs {
        match listen_on(addr) {
            Ok(l) => {
                println!("listening on {}", l.local_addr()?);
                return Ok(l);
            }
            Err(e) => last = Some(e),
        }
    }
    let e = last.unwrap_or_else(|| std::io::Error::other("the address resolves to nothing"));
    Err(e).with_context(|| format!("binding {listen}"))
}

/// Resolves on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    tracing::info!("shutting down");
}

/// Binds the admin endpoint on `listen` and serves `router` on it in the background (for the
/// process's life), over TLS with the process's certificate when `tls` is set. Prints
/// `metrics on ADDR`, which scripts and the tests read.
/// The warning due when the protocol port asks for credentials (`secret`) but the admin
/// endpoint's writes (drain, unregister: a job's data deleted) need no token.
fn open_admin_writes(secret: bool, token: bool, listen: &str) -> Option<String> {
    (secret && !token).then(|| {
        format!(
            "authentication is on but admin_token is not set: anyone who reaches {listen} can \
             drain servers and unregister applications (deleting their data); set admin_token"
        )
    })
}

async fn serve_admin(
    listen: &str,
    router: axum::Router,
    tls: Option<sluice_transport::TlsServerConfig>,
    (secret, token): (bool, bool),
) -> anyhow::Result<()> {
    if let Some(warning) = open_admin_writes(secret, token, listen) {
        tracing::warn!("{warning}");
    }
    let l = TcpListener::bind(listen).await.with_context(|| format!("binding metrics {listen}"))?;
    println!("metrics on {}", l.local_addr()?);
    tokio::spawn(async move {
        if let Err(e) = sluice_admin::serve(l, router, tls, std::future::pending()).await {
            tracing::error!(error = %e, "admin endpoint stopped");
        }
    });
    Ok(())
}

/// `sluice server`.
pub async fn server(args: ServerArgs) -> anyhow::Result<()> {
    let mut extra = Vec::new();
    if !args.data_dirs.is_empty() {
        let dirs =
            args.data_dirs.iter().map(|d| toml::Value::String(d.display().to_string())).collect();
        extra.push(("data_dirs".into(), toml::Value::Array(dirs)));
    }
    if let Some(b) = args.memory_budget_bytes {
        extra.push(("memory_budget_bytes".into(), toml::Value::Integer(b as i64)));
    }
    if !args.coordinators.is_empty() {
        let c = args.coordinators.iter().map(|c| toml::Value::String(c.clone())).collect();
        extra.push(("coordinators".into(), toml::Value::Array(c)));
    }
    let config: sluice_server::ServerConfig =
        load(args.common.config.as_deref(), "SLUICE_SERVER_", &args.common.sets(extra))?;
    let listen = config.listen.clone();
    if args.clean {
        for d in &config.data_dirs {
            clean_dir(d).with_context(|| format!("--clean: emptying {}", d.display()))?;
        }
    }
    let server = sluice_server::Server::new(config).map_err(anyhow::Error::msg)?;
    let listener = bind(&listen).await?;
    if let Some(m) = &args.common.metrics_listen {
        let token = server.state().config().admin_token.clone();
        let transport = &server.state().config().transport;
        let auth = (transport.secret.is_some(), token.is_some());
        let router = sluice_admin::server_router(server.handle(), token);
        serve_admin(m, router, transport.tls.clone(), auth).await?;
    }
    let state = server.state().clone();
    server.serve(listener, server_stop(state)).await?;
    Ok(())
}

/// Empties a data directory (`sluice server --clean`); a missing one is fine.
fn clean_dir(dir: &std::path::Path) -> std::io::Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for e in entries {
        let e = e?;
        if e.file_type()?.is_dir() {
            std::fs::remove_dir_all(e.path())?;
        } else {
            std::fs::remove_file(e.path())?;
        }
    }
    tracing::info!(dir = %dir.display(), "data directory emptied (--clean)");
    Ok(())
}

/// When a server stops.
/// - SIGTERM (a planned stop or restart): it drains (takes no new partitions, see
///   `ServerState::start_draining`), keeps taking pushes to the shuffles it holds and serving
///   reads, and stops once every shuffle it holds is committed (durable: a restart on the same
///   directories serves them again) or after `drain_timeout_ms`. A second SIGTERM, or Ctrl-C,
///   stops it at once. Without `durable_commit` it stops at once (a restart loses everything).
/// - SIGUSR1 (decommission): it drains and stops once it holds no shuffle at all (the
///   applications unregistered them, ended or expired) or after `drain_timeout_ms`. A drain
///   cancelled meanwhile (admin API, coordinator) cancels this stop, until the next SIGUSR1.
///
/// A drain asked through the admin API alone does not stop the process: whoever asked for it
/// stops it (a Kubernetes `preStop` hook, an operator).
async fn server_stop(state: Arc<sluice_server::ServerState>) {
    use tokio::signal::unix::{signal, SignalKind};
    let mut usr1 = signal(SignalKind::user_defined1()).expect("SIGUSR1 handler");
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let timeout = Duration::from_millis(state.config().drain_timeout_ms);
    loop {
        let decommission = tokio::select! {
            _ = tokio::signal::ctrl_c() => return,
            _ = term.recv() => false,
            _ = usr1.recv() => true,
        };
        if !decommission && !state.config().durable_commit {
            tracing::info!(
                "SIGTERM: stopping (durable_commit is off: what this server holds is lost)"
            );
            return;
        }
        if decommission {
            state.start_draining();
        } else {
            state.start_stopping();
        }
        let done = |s: &sluice_server::ServerState| {
            if decommission {
                s.shuffles_held()
            } else {
                s.unsealed_shuffles()
            }
        };
        if !decommission {
            tracing::info!(
                uncommitted = done(&state),
                "SIGTERM: draining; stopping once every shuffle held is committed"
            );
        }
        let drained = async {
            let mut tick = tokio::time::interval(Duration::from_millis(200));
            loop {
                tick.tick().await;
                if decommission && !state.is_draining() {
                    return false;
                }
                // A restart keeps committed shuffles, and the open ones that hold nothing once
                // they are parked (their registrations written).
                if done(&state) == 0 && (decommission || state.park_open_shuffles().await) {
                    tracing::info!(
                        shuffles_held = state.shuffles_held(),
                        "drained: nothing left that a stop would lose; stopping"
                    );
                    return true;
                }
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => return,
            _ = term.recv() => {
                tracing::info!("second SIGTERM: stopping now");
                return;
            }
            done = drained => if done { return },
            _ = tokio::time::sleep(timeout) => {
                tracing::warn!(shuffles = state.shuffles_held(), uncommitted = state.unsealed_shuffles(),
                    "drain timeout: stopping");
                return;
            }
        }
        tracing::info!("drain cancelled: not stopping");
    }
}

/// `sluice coordinator`.
pub async fn coordinator(args: CoordinatorArgs) -> anyhow::Result<()> {
    let config: sluice_coordinator::CoordinatorConfig =
        load(args.common.config.as_deref(), "SLUICE_COORDINATOR_", &args.common.sets(Vec::new()))?;
    let listener = bind(&config.listen).await?;
    let coord = sluice_coordinator::Coordinator::new(config).map_err(anyhow::Error::msg)?;
    if let Some(m) = &args.common.metrics_listen {
        let token = coord.config().admin_token.clone();
        let transport = &coord.config().transport;
        let auth = (transport.secret.is_some(), token.is_some());
        let router = sluice_admin::coordinator_router(coord.clone(), token);
        serve_admin(m, router, transport.tls.clone(), auth).await?;
    }
    coord.serve(listener, shutdown_signal()).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admin_writes_open_under_authentication_are_warned_of() {
        let w = open_admin_writes(true, false, "0.0.0.0:9099").expect("a warning");
        assert!(w.contains("admin_token") && w.contains("0.0.0.0:9099"), "{w}");
        assert_eq!(open_admin_writes(true, true, "x"), None);
        assert_eq!(open_admin_writes(false, false, "x"), None, "no authentication: open by design");
    }
}
