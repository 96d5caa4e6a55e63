//! `sluice local`: the main job. Starts an embedded coordinator and N servers on loopback, runs
//! a synthetic shuffle through them (including a failed-and-retried and a speculative map
//! attempt), reads every partition back and verifies every record. With `--keep` the cluster
//! stays up until Ctrl-C, its addresses printed, for Spark or `sluice admin` to use.

use std::time::Instant;

use anyhow::Context;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;
use sluice_client::{ClientOptions, ShuffleClient};

use crate::cluster::{cpu_seconds, metric, Cluster, ClusterSpec};
use crate::workload::{expected_tally, map_runs, mismatches, read_all, run_map, secs, Tally};

/// `sluice local` flags.
#[derive(Args, Debug, Clone)]
pub struct LocalArgs {
    /// Shuffle servers to start.
    #[arg(long, default_value_t = 2)]
    pub servers: usize,
    /// Map tasks (all run concurrently).
    #[arg(long, default_value_t = 8)]
    pub maps: u32,
    /// Reduce partitions.
    #[arg(long, default_value_t = 32)]
    pub partitions: u32,
    /// Total record bytes the maps push (suffixes K, M, G allowed).
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    pub bytes: u64,
    /// Bytes per record (16 to 65536).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(16..=65536))]
    pub record_bytes: u32,
    /// Copies of each partition: 1, or 2 (primary + replica on another server).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=2))]
    pub replication: u8,
    /// Memory budget of each server (suffixes allowed).
    #[arg(long, default_value = "256M", value_parser = parse_size)]
    pub memory_budget: u64,
    /// Partitions read at once.
    #[arg(long, default_value_t = 4)]
    pub readers: usize,
    /// Pushed but unacknowledged bytes per map attempt (suffixes allowed; default: the native
    /// client's `max_inflight_bytes`).
    #[arg(long, value_parser = parse_size)]
    pub max_inflight: Option<u64>,
    /// Bytes a partition's records fill before they are sealed into a batch (suffixes allowed;
    /// default: the native client's `batch_bytes`).
    #[arg(long, value_parser = parse_size)]
    pub batch_bytes: Option<u64>,
    /// Directory under which the servers' data directories are created (default: system temp).
    #[arg(long)]
    pub data_root: Option<std::path::PathBuf>,
    /// Print one JSON object instead of the human summary (with `--keep`, a line with the
    /// cluster's addresses first).
    #[arg(long)]
    pub json: bool,
    /// Leave the cluster up after the job until Ctrl-C or SIGTERM, printing the data and admin
    /// addresses of the coordinator and of each server once it is ready.
    #[arg(long)]
    pub keep: bool,
    /// With `--keep`: start the cluster only, run no job.
    #[arg(long, requires = "keep")]
    pub no_job: bool,
    /// With `--keep`: the job leaves its committed shuffle registered and its application
    /// heartbeating until the cluster stops, so `sluice admin` and the status page show it.
    #[arg(long, requires = "keep", conflicts_with = "no_job")]
    pub hold: bool,
    /// `admin_token` of the coordinator and the servers: their admin write endpoints (drain,
    /// unregister) then need it.
    #[arg(long)]
    pub admin_token: Option<String>,
    /// TLS on every listener of the cluster, with certificates of a throw-away CA made for it
    /// (rcgen; kept in the cluster's temporary directory): the job's connections are encrypted.
    #[arg(long)]
    pub tls: bool,
}

/// Parses `123`, `64K`, `256M`, `2G` (binary units).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mult) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 1u64 << 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 1 << 20),
        Some('G' | 'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<f64>().map(|n| (n * mult as f64) as u64).map_err(|e| format!("{s}: {e}"))
}

fn bar(total: u64, msg: &'static str, hidden: bool) -> ProgressBar {
    if hidden {
        return ProgressBar::hidden();
    }
    let b = ProgressBar::new(total);
    b.set_style(
        ProgressStyle::with_template("{msg:6} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    b.set_message(msg);
    b
}

/// Runs the job; returns whether every record verified.
pub async fn run(args: LocalArgs) -> anyhow::Result<bool> {
    let cluster = Cluster::start(&ClusterSpec {
        servers: args.servers,
        memory_budget_bytes: args.memory_budget,
        data_root: args.data_root.clone(),
        server_sets: Vec::new(),
        admin_token: args.admin_token.clone(),
        tls: args.tls,
    })?;
    if args.keep {
        cluster.wait_ready().await?;
        print_addresses(&cluster, args.json);
        if args.no_job {
            crate::serve::shutdown_signal().await;
            return Ok(true);
        }
    }
    let app_id = format!("local-{}", std::process::id());
    let mut opts = ClientOptions {
        coordinators: vec![cluster.coordinator.addr.to_string()],
        transport: cluster.client_transport(),
        ..ClientOptions::default()
    };
    if let Some(n) = args.batch_bytes {
        opts.batch_bytes = usize::try_from(n).context("--batch-bytes")?;
    }
    if let Some(n) = args.max_inflight {
        opts.max_inflight_bytes = usize::try_from(n).context("--max-inflight")?;
    }
    let client = ShuffleClient::new(app_id, opts);
    cluster.wait_ready().await?;
    // Resident memory of the servers before any data: the idle footprint.
    let idle_rss = cluster.servers.iter().map(|s| s.rss_bytes()).max().unwrap_or(0);
    client.register_app().await?;
    let a = client.register_shuffle(0, args.maps, args.partitions, args.replication).await?;

    // What the reducers must read: computed before the map stage, so the push is timed
    // without the tally's hashing (the maps push the same records from the same generator).
    let bytes_per_map = args.bytes / args.maps as u64;
    let runs = map_runs(args.maps);
    let t = Instant::now();
    let (record_bytes, partitions) = (args.record_bytes as usize, args.partitions);
    let tally_runs = runs.clone();
    let expect = tokio::task::spawn_blocking(move || {
        expected_tally(&tally_runs, bytes_per_map, record_bytes, partitions)
    })
    .await
    .context("tally task panicked")?;
    let tally_s = secs(t);

    // CPU seconds of this process (the maps and reducers) and of the servers, so each phase's
    // cost can be split between client and servers.
    let cpu = || {
        let servers: f64 = cluster.servers.iter().map(|s| cpu_seconds(s.pid())).sum();
        (cpu_seconds(std::process::id()), servers)
    };

    // Map stage.
    let push_bar = bar(args.bytes + bytes_per_map * 3 / 2, "push", args.json);
    let cpu_before_push = cpu();
    let t = Instant::now();
    let mut tasks = Vec::new();
    for m in 0..args.maps {
        let mine: Vec<_> = runs.iter().copied().filter(|r| r.map_id == m).collect();
        let (client, a, bar) = (client.clone(), a.clone(), push_bar.clone());
        tasks.push(tokio::spawn(async move {
            let mut pushed = 0;
            if m == 0 {
                // A retry starts after its failed attempt.
                for r in mine {
                    pushed +=
                        run_map(&client, a.clone(), r, bytes_per_map, record_bytes, &bar).await?;
                }
            } else {
                let all = mine
                    .into_iter()
                    .map(|r| run_map(&client, a.clone(), r, bytes_per_map, record_bytes, &bar));
                for p in futures_util::future::join_all(all).await {
                    pushed += p?;
                }
            }
            Ok::<u64, anyhow::Error>(pushed)
        }));
    }
    let mut pushed = 0u64;
    for t in tasks {
        pushed += t.await.context("map task panicked")??;
    }
    let push_s = secs(t);
    let cpu_push = cpu();
    push_bar.finish_and_clear();
    let t = Instant::now();
    let sizes = client.commit_shuffle(&a).await?;
    let commit_s = secs(t);
    let commit_sync_us = cluster
        .servers
        .iter()
        .map(|s| metric(s, "sluice_server_commit_sync_microseconds_total"))
        .sum::<u64>();

    // Reduce stage.
    let got = Tally::new(args.partitions);
    let fetch_bar = bar(sizes.iter().sum(), "fetch", args.json);
    let cpu_before_fetch = cpu();
    let t = Instant::now();
    let fetched = read_all(&client, &a, args.maps, args.readers, &got, &fetch_bar).await?;
    let fetch_s = secs(t);
    let cpu_fetch = cpu();
    let per_gb = |before: (f64, f64), after: (f64, f64), bytes: u64| {
        let gb = bytes as f64 / 1e9;
        json!({
            "client": (after.0 - before.0) / gb,
            "servers": (after.1 - before.1) / gb,
        })
    };
    fetch_bar.finish_and_clear();
    let bad = mismatches(&expect, &got);
    let verified = bad.is_empty();
    let peak_rss = cluster.servers.iter().map(|s| s.peak_rss_bytes()).max().unwrap_or(0);
    let server_sum = |m: &str| cluster.servers.iter().map(|s| metric(s, m)).sum::<u64>();
    let busy = server_sum("sluice_server_busy_replies_total");
    let held = server_sum("sluice_server_pushes_held_total");
    let sendfile_bytes = server_sum("sluice_server_sendfile_bytes_total");
    let tls_file_bytes = server_sum("sluice_server_tls_file_bytes_total");
    let ktls_connections = server_sum("sluice_server_ktls_connections_total");
    let sendfile_calls = server_sum("sluice_server_sendfile_calls_total");
    let records: u64 =
        expect.count.iter().map(|c| c.load(std::sync::atomic::Ordering::Relaxed)).sum();
    let servers: Vec<_> = cluster.servers.iter().map(|s| s.addr).collect();
    if !args.hold {
        client.unregister_shuffle(&a).await?;
        client.unregister_app(&servers).await?;
    }

    let summary = json!({
        "verified": verified,
        "bytes": pushed,
        "records": records,
        "fetched_bytes": fetched,
        "tally_seconds": tally_s,
        "push_seconds": push_s,
        "fetch_seconds": fetch_s,
        "commit_seconds": commit_s,
        "commit_sync_seconds": commit_sync_us as f64 / 1e6,
        "push_gbps": pushed as f64 / push_s / 1e9,
        "fetch_gbps": fetched as f64 / fetch_s / 1e9,
        "push_cpu_s_per_gb": per_gb(cpu_before_push, cpu_push, pushed),
        "fetch_cpu_s_per_gb": per_gb(cpu_before_fetch, cpu_fetch, fetched),
        "server_peak_rss_bytes": peak_rss,
        "server_idle_rss_bytes": idle_rss,
        "client_peak_rss_bytes": crate::cluster::own_peak_rss_bytes(),
        "busy_replies": busy,
        "pushes_held": held,
        "sendfile_bytes": sendfile_bytes,
        "tls": args.tls,
        "tls_file_bytes": tls_file_bytes,
        "ktls_connections": ktls_connections,
        "sendfile_calls": sendfile_calls,
        "memory_budget_bytes": args.memory_budget,
        "servers": args.servers,
        "maps": args.maps,
        "partitions": args.partitions,
        "replication": args.replication,
        "mismatched_partitions": bad,
    });
    if args.json {
        println!("{summary}");
    } else {
        let mib = |b: u64| b as f64 / (1 << 20) as f64;
        println!(
            "sluice local: {} servers, {} maps (one retried, one speculative), {} partitions",
            args.servers, args.maps, args.partitions
        );
        println!(
            "  pushed      {:>10.1} MiB  {:>6.2} GB/s  ({records} records)",
            mib(pushed),
            summary["push_gbps"].as_f64().unwrap_or(0.0)
        );
        println!(
            "  committed   in {:.3} s (of which {:.3} s making it durable, summed over the servers)",
            commit_s,
            commit_sync_us as f64 / 1e6
        );
        println!(
            "  fetched     {:>10.1} MiB  {:>6.2} GB/s",
            mib(fetched),
            summary["fetch_gbps"].as_f64().unwrap_or(0.0)
        );
        let cpu = |phase: &str, who: &str| summary[phase][who].as_f64().unwrap_or(0.0);
        println!(
            "  CPU s per GB: push {:.2} client + {:.2} servers; fetch {:.2} client + {:.2} servers",
            cpu("push_cpu_s_per_gb", "client"),
            cpu("push_cpu_s_per_gb", "servers"),
            cpu("fetch_cpu_s_per_gb", "client"),
            cpu("fetch_cpu_s_per_gb", "servers"),
        );
        println!(
            "  server peak resident {:.1} MiB (memory budget {:.1} MiB; idle {:.1} MiB)",
            mib(peak_rss),
            mib(args.memory_budget),
            mib(idle_rss)
        );
        if held + busy > 0 {
            println!("  memory pressure: {held} pushes held until the flushers made room, {busy} answered Busy");
        }
        println!(
            "  verified: {verified}{}",
            if verified { String::new() } else { format!(" (partitions {bad:?} differ)") }
        );
    }
    if args.keep {
        if args.hold {
            // The application heartbeats while the cluster stays up (servers expire it after
            // `app_expiry_ms` without), and lets go of its data when the cluster stops.
            let beat = async {
                loop {
                    client.heartbeat(&servers).await;
                    tokio::time::sleep(std::time::Duration::from_secs(5)).await;
                }
            };
            tokio::select! {
                _ = crate::serve::shutdown_signal() => {}
                _ = beat => {}
            }
            let _ = client.unregister_app(&servers).await;
        } else {
            crate::serve::shutdown_signal().await;
        }
    }
    Ok(verified)
}

/// Prints where the cluster's processes listen: a line per process, or one JSON object.
fn print_addresses(cluster: &Cluster, json: bool) {
    let admin = |p: &sluice_testkit::Proc| p.metrics.map(|a| a.to_string()).unwrap_or_default();
    if json {
        let servers: Vec<_> = cluster
            .servers
            .iter()
            .map(|s| json!({"address": s.addr.to_string(), "admin": admin(s)}))
            .collect();
        let c = &cluster.coordinator;
        let coordinator = json!({"address": c.addr.to_string(), "admin": admin(c)});
        println!("{}", json!({"cluster": {"coordinator": coordinator, "servers": servers}}));
        return;
    }
    let c = &cluster.coordinator;
    println!("sluice local: cluster up; Ctrl-C stops it");
    println!("  coordinator  {}  admin {}  (status page http://{}/)", c.addr, admin(c), admin(c));
    for (i, s) in cluster.servers.iter().enumerate() {
        println!("  {:<11}  {}  admin {}", format!("server {i}"), s.addr, admin(s));
    }
    println!("  sluice admin --coordinator {} servers", admin(c));
}

/// Shared handle for benches that need an app with a shuffle on a fresh cluster.
pub async fn client_for(cluster: &Cluster, app: &str) -> anyhow::Result<ShuffleClient> {
    let opts = ClientOptions {
        coordinators: vec![cluster.coordinator.addr.to_string()],
        transport: cluster.client_transport(),
        ..ClientOptions::default()
    };
    let client = ShuffleClient::new(app, opts);
    cluster.wait_ready().await?;
    client.register_app().await?;
    Ok(client)
}

#[cfg(test)]
mod tests {
    #[test]
    fn sizes() {
        assert_eq!(super::parse_size("2G").unwrap(), 2 << 30);
        assert_eq!(super::parse_size("64k").unwrap(), 64 << 10);
        assert_eq!(super::parse_size("100").unwrap(), 100);
        assert!(super::parse_size("x").is_err());
    }
}
