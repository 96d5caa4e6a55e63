//! `sluice admin`: the operator's command line over the admin API of a coordinator (and, for
//! `status`, of one server). Human tables by default, the API's JSON with `--json`; exit codes
//! a script can rely on (see [`EXIT_CODES`]).

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use serde::Serialize;
use sluice_admin::api::{self, Member, MemberState};
use sluice_admin::{AdminClient, ClientError};

/// What `sluice admin --help` says about exit codes (docs/operations.md says the same).
pub const EXIT_CODES: &str = "Exit codes: 0 done; 1 the request failed or was refused (unknown \
server or application, wrong token, a server lost while draining); 2 usage error; 3 the address \
could not be reached; 4 `drain --wait` timed out with shuffles still held.";

/// Exit code of a `drain --wait` that ran out of time.
const EXIT_WAIT_TIMED_OUT: i32 = 4;

/// `sluice admin` flags.
#[derive(Args, Debug, Clone)]
#[command(after_help = EXIT_CODES)]
pub struct AdminArgs {
    /// A coordinator's admin address (its `--metrics-listen`), `HOST:PORT`.
    #[arg(long, env = "SLUICE_COORDINATOR_ADMIN", global = true)]
    coordinator: Option<String>,
    /// The admin token, for drain, undrain and unregister (`admin_token` in the configs).
    #[arg(long, env = "SLUICE_ADMIN_TOKEN", hide_env_values = true, global = true)]
    token: Option<String>,
    /// Print the API's JSON instead of a table.
    #[arg(long, global = true)]
    json: bool,
    /// Seconds each request may take.
    #[arg(long, default_value_t = 10, global = true)]
    request_timeout_secs: u64,
    /// HTTPS: the CA (PEM) of the endpoints' certificates, for processes running
    /// `[transport.tls]` (their admin endpoint serves HTTPS then).
    #[arg(long, env = "SLUICE_ADMIN_TLS_CA_FILE", global = true)]
    tls_ca_file: Option<std::path::PathBuf>,
    /// HTTPS: the name the endpoints' certificates are checked against (default: the address's
    /// IP), e.g. a pod's DNS name when it is reached at 127.0.0.1.
    #[arg(long, env = "SLUICE_ADMIN_TLS_SERVER_NAME", global = true)]
    tls_server_name: Option<String>,
    #[command(subcommand)]
    command: AdminCommand,
}

#[derive(Subcommand, Debug, Clone)]
enum AdminCommand {
    /// Servers the coordinator knows: state, what they hold, memory, disk, heartbeat.
    Servers,
    /// Applications the coordinator knows, with their shuffles.
    Apps,
    /// An application's shuffles and where their partitions are.
    Shuffles {
        /// The application id.
        app: String,
    },
    /// Stop giving a server new partitions (it keeps serving what it holds).
    Drain {
        /// The server's id (as `sluice admin servers` shows it).
        server: String,
        /// Wait until the server holds no shuffle, showing progress.
        #[arg(long)]
        wait: bool,
        /// With `--wait`: give up after this many seconds (exit code 4).
        #[arg(long, default_value_t = 3600)]
        wait_timeout_secs: u64,
        /// Why, for the logs.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Cancel a drain: the server takes new partitions again.
    Undrain {
        /// The server's id.
        server: String,
        /// Why, for the logs.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Forget a stuck application on the coordinator (servers delete its data once its
    /// heartbeats stop, after their `app_expiry_ms`).
    Unregister {
        /// The application id.
        app: String,
        /// Why, for the logs.
        #[arg(long)]
        reason: Option<String>,
    },
    /// One server's own status: memory, counters, drain state, what it holds.
    Status {
        /// The server's admin address (its `--metrics-listen`), `HOST:PORT`.
        #[arg(long)]
        server: String,
    },
    /// One request to any process's admin endpoint, as scripts need it (the servers' preStop
    /// hook under TLS): prints the HTTP status code on the first line, then the body. Exit 0 for
    /// any answer, whatever its status; 3 when none came.
    Request {
        /// The admin address (a `--metrics-listen`), `HOST:PORT`.
        #[arg(long)]
        server: String,
        /// GET, POST or DELETE.
        method: String,
        /// The path, e.g. /api/v1/status.
        path: String,
    },
}

/// A failed command: its message and exit code.
struct Failure(String, i32);

impl From<ClientError> for Failure {
    fn from(e: ClientError) -> Failure {
        let code = e.exit_code();
        Failure(e.to_string(), code)
    }
}

/// Runs the command; returns the process's exit code.
pub async fn run(args: AdminArgs) -> i32 {
    match command(&args).await {
        Ok(()) => 0,
        Err(Failure(msg, code)) => {
            eprintln!("sluice admin: {msg}");
            code
        }
    }
}

fn coordinator(args: &AdminArgs) -> Result<AdminClient, Failure> {
    let Some(addr) = &args.coordinator else {
        return Err(Failure(
            "no coordinator: pass --coordinator HOST:PORT or set SLUICE_COORDINATOR_ADMIN".into(),
            2,
        ));
    };
    Ok(client(args, addr))
}

fn client(args: &AdminArgs, addr: &str) -> AdminClient {
    let timeout = Duration::from_secs(args.request_timeout_secs.max(1));
    let mut c = AdminClient::new(addr, args.token.clone(), timeout);
    if let Some(ca) = &args.tls_ca_file {
        c = c.with_tls_ca(ca.clone());
    }
    if let Some(name) = &args.tls_server_name {
        c = c.with_tls_server_name(name.clone());
    }
    c
}

/// Prints `value` as JSON, or `table` for people.
fn print<T: Serialize>(json: bool, value: &T, table: impl FnOnce(&T) -> String) {
    if json {
        println!("{}", serde_json::to_string_pretty(value).expect("serializable"));
    } else {
        print!("{}", table(value));
    }
}

async fn command(args: &AdminArgs) -> Result<(), Failure> {
    match &args.command {
        AdminCommand::Servers => {
            let s = coordinator(args)?.servers().await?;
            print(args.json, &s, |s| servers_table(&s.servers));
        }
        AdminCommand::Apps => {
            let a = coordinator(args)?.apps().await?;
            print(args.json, &a, apps_table);
        }
        AdminCommand::Shuffles { app } => {
            let s = coordinator(args)?.shuffles(app).await?;
            print(args.json, &s, shuffles_table);
        }
        AdminCommand::Drain { server, wait, wait_timeout_secs, reason } => {
            let c = coordinator(args)?;
            let m = c.set_drain(server, true, reason.as_deref()).await?;
            if !*wait {
                print(args.json, &m, |m| format!("{}: {}\n", m.server_id, describe(m)));
                return Ok(());
            }
            let m = wait_drained(&c, server, Duration::from_secs(*wait_timeout_secs)).await?;
            print(args.json, &m, |m| format!("{}: drained, holds no shuffle\n", m.server_id));
        }
        AdminCommand::Undrain { server, reason } => {
            let m = coordinator(args)?.set_drain(server, false, reason.as_deref()).await?;
            print(args.json, &m, |m| format!("{}: {}\n", m.server_id, describe(m)));
        }
        AdminCommand::Unregister { app, reason } => {
            let u = coordinator(args)?.unregister(app, reason.as_deref()).await?;
            print(args.json, &u, |u| format!("{}: unregistered\n", u.app_id));
        }
        AdminCommand::Status { server } => {
            let s = client(args, server).status().await?;
            print(args.json, &s, status_text);
        }
        AdminCommand::Request { server, method, path } => {
            let method = match method.to_ascii_uppercase().as_str() {
                "GET" => sluice_admin::Method::GET,
                "POST" => sluice_admin::Method::POST,
                "DELETE" => sluice_admin::Method::DELETE,
                m => return Err(Failure(format!("method {m}: GET, POST or DELETE"), 2)),
            };
            let a = client(args, server).call(method, path, Default::default()).await?;
            println!("{}", a.status.as_u16());
            println!("{}", String::from_utf8_lossy(&a.body).trim_end());
        }
    }
    Ok(())
}

/// A server's state in words.
fn describe(m: &Member) -> String {
    let state = state_name(m.state);
    match m.drain_pending {
        Some(api::DrainPending::Drain) => format!("{state} (drain not yet acknowledged by it)"),
        Some(api::DrainPending::Undrain) => format!("{state} (undrain not yet acknowledged)"),
        None => state.to_owned(),
    }
}

fn state_name(s: MemberState) -> &'static str {
    match s {
        MemberState::Live => "live",
        MemberState::Draining => "draining",
        MemberState::Lost => "lost",
    }
}

/// Polls the coordinator until the server has taken the drain and holds no shuffle; a
/// progress line (on stderr) meanwhile.
async fn wait_drained(c: &AdminClient, id: &str, limit: Duration) -> Result<Member, Failure> {
    let start = Instant::now();
    let tty = std::io::stderr().is_terminal();
    let mut last = String::new();
    loop {
        let servers = c.servers().await?.servers;
        let Some(m) = servers.into_iter().find(|m| m.server_id == id) else {
            return Err(Failure(format!("server {id} is gone from the coordinator"), 1));
        };
        if m.state == MemberState::Lost {
            return Err(Failure(format!("server {id} was lost while draining"), 1));
        }
        // Its own report counts only once it has taken the drain (no order pending).
        let held = if m.drain_pending.is_some() { None } else { held(&m) };
        if held == Some(0) {
            if tty {
                eprintln!();
            }
            return Ok(m);
        }
        let secs = start.elapsed().as_secs();
        let line = match held {
            None => format!("draining {id}: waiting for the server to take the drain ({secs} s)"),
            Some(n) => format!(
                "draining {id}: {n} shuffles, {} partitions still held ({secs} s)",
                m.partitions_held
            ),
        };
        if tty {
            eprint!("\r{line}\x1b[K");
        } else if line.split(" (").next() != last.split(" (").next() {
            eprintln!("{line}");
        }
        let _ = std::io::stderr().flush();
        last = line;
        if start.elapsed() >= limit {
            if tty {
                eprintln!();
            }
            return Err(Failure(
                format!("{id} still holds shuffles after {}s", limit.as_secs()),
                EXIT_WAIT_TIMED_OUT,
            ));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Shuffles a server holds, from its status report, else (a server that sends none) whether
/// it holds partitions.
fn held(m: &Member) -> Option<u32> {
    m.shuffles_held.or((m.partitions_held == 0).then_some(0))
}

/// Bytes in binary units, one decimal.
fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

fn ago(ms: u64) -> String {
    format!("{:.1} s ago", ms as f64 / 1000.0)
}

/// Rows as columns padded to their widest cell.
fn table(header: &[&str], rows: Vec<Vec<String>>) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let padded: Vec<String> =
            cells.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
        format!("{}\n", padded.join("  ").trim_end())
    };
    let mut out = line(header.iter().map(|h| h.to_string()).collect());
    for r in rows {
        out.push_str(&line(r));
    }
    out
}

fn servers_table(servers: &[Member]) -> String {
    if servers.is_empty() {
        return "no server has registered\n".into();
    }
    let rows = servers
        .iter()
        .map(|m| {
            vec![
                m.server_id.clone(),
                m.address.clone(),
                describe(m),
                m.shuffles_held.map_or("?".into(), |n| n.to_string()),
                m.partitions_held.to_string(),
                format!("{} / {}", bytes(m.free_memory_bytes), bytes(m.memory_budget_bytes)),
                format!("{} / {}", bytes(m.free_disk_bytes), bytes(m.disk_capacity_bytes)),
                format!("{}/s", bytes(m.push_bytes_per_s)),
                ago(m.last_heartbeat_ms),
            ]
        })
        .collect();
    table(
        &[
            "SERVER",
            "ADDRESS",
            "STATE",
            "SHUFFLES",
            "PARTITIONS",
            "MEMORY FREE",
            "DISK FREE",
            "PUSH",
            "HEARTBEAT",
        ],
        rows,
    )
}

fn apps_table(a: &api::Apps) -> String {
    if a.apps.is_empty() {
        return "no application is registered\n".into();
    }
    let rows = a
        .apps
        .iter()
        .map(|a| {
            let ids: Vec<String> = a.shuffles.iter().map(u32::to_string).collect();
            vec![a.app_id.clone(), ids.join(","), ago(a.last_heartbeat_ms)]
        })
        .collect();
    table(&["APP", "SHUFFLES", "HEARTBEAT"], rows)
}

fn shuffles_table(s: &api::Shuffles) -> String {
    if s.shuffles.is_empty() {
        return format!("{} has no shuffle registered\n", s.app_id);
    }
    let rows = s
        .shuffles
        .iter()
        .map(|sh| {
            // Per server: partitions it holds as primary (and as replica).
            let per_server: Vec<String> = sh
                .servers
                .iter()
                .map(|srv| {
                    let of = |pick: fn(&api::Placement) -> Option<&str>| {
                        sh.assignment.iter().filter(|p| pick(p) == Some(&srv.server_id)).count()
                    };
                    let primary = of(|p| Some(p.primary.as_str()));
                    let replica = of(|p| p.replica.as_deref());
                    if replica > 0 {
                        format!("{} {primary}+{replica}r", srv.server_id)
                    } else {
                        format!("{} {primary}", srv.server_id)
                    }
                })
                .collect();
            vec![
                sh.shuffle_id.to_string(),
                sh.maps.to_string(),
                sh.partitions.to_string(),
                sh.replication.to_string(),
                per_server.join(", "),
            ]
        })
        .collect();
    table(&["SHUFFLE", "MAPS", "PARTITIONS", "COPIES", "PARTITIONS PER SERVER"], rows)
}

fn status_text(s: &api::ServerStatus) -> String {
    let c = &s.counters;
    let mut out = format!(
        "server      {} at {}\nstate       {}\nmemory      {} used of {} (peak {})\n\
         pushes      {} ({}), {} answered Busy\nfetches     {} chunks ({})\n\
         commits     {}\nconnections {}\nholds       {} shuffles, {} partitions\n",
        s.server_id.as_deref().unwrap_or("-"),
        s.address.as_deref().unwrap_or("-"),
        if !s.serving {
            "starting"
        } else if s.draining {
            "draining"
        } else {
            "serving"
        },
        bytes(s.memory.used_bytes),
        bytes(s.memory.budget_bytes),
        bytes(s.memory.peak_bytes),
        c.push_requests,
        bytes(c.pushed_bytes),
        c.busy_replies,
        c.fetched_chunks,
        bytes(c.fetched_bytes),
        c.commits,
        s.connections,
        s.shuffles_held,
        s.partitions_held,
    );
    let rows: Vec<Vec<String>> = s
        .apps
        .iter()
        .flat_map(|a| {
            a.shuffles.iter().map(move |sh| {
                vec![
                    a.app_id.clone(),
                    sh.shuffle_id.to_string(),
                    format!("{:?}", sh.state).to_lowercase(),
                    format!("{}/{}", sh.maps_ended, sh.maps),
                    sh.partitions.to_string(),
                    bytes(sh.buffered_bytes),
                    bytes(sh.stored_bytes),
                ]
            })
        })
        .collect();
    if !rows.is_empty() {
        out.push('\n');
        out.push_str(&table(
            &["APP", "SHUFFLE", "STATE", "MAPS ENDED", "PARTITIONS", "IN MEMORY", "ON DISK"],
            rows,
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_pad_columns_and_bytes_read_well() {
        let t = table(&["A", "BB"], vec![vec!["long".into(), "x".into()]]);
        assert_eq!(t, "A     BB\nlong  x\n");
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(3 << 20), "3.0 MiB");
    }
}
