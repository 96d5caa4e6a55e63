//! `sluice bench transport` at a toy size: it runs, and its counters show that each server took
//! the path it is reported under (the figures in docs/benchmarks.md rest on that), cold file
//! regions included.

mod utils;

use std::time::Duration;

use utils::run_sluice;

#[test]
fn bench_transport_reports_each_path_it_measured() {
    // On the build disk: `--cold` drops the file's pages, which a memory-backed /tmp keeps.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let args = [
        "bench",
        "transport",
        "--json",
        "--file-gib",
        "0.03",
        "--chunk-mib",
        "1",
        "--passes",
        "1",
        "--rounds",
        "1",
        "--frames",
        "5000",
        "--cold",
        "--dir",
    ];
    let mut argv: Vec<&std::ffi::OsStr> = args.iter().map(std::ffi::OsStr::new).collect();
    argv.push(dir.path().as_os_str());
    let out = run_sluice(&argv, Duration::from_secs(120));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let j: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON object");
    let n = |k: &str| j[k].as_f64().unwrap_or_else(|| panic!("no number {k} in {j}"));
    let file = n("file_bytes");
    assert!(file >= 30.0 * 1024.0 * 1024.0, "{j}");
    // One pass, one round: the zero-copy server sent every byte with sendfile, none by copying;
    // the copy server the reverse.
    assert_eq!(n("zero_copy_server_sendfile_bytes"), file, "{j}");
    assert_eq!(n("zero_copy_server_copy_bytes"), 0.0, "{j}");
    assert_eq!(n("copy_server_copy_bytes"), file, "{j}");
    assert_eq!(n("copy_server_sendfile_bytes"), 0.0, "{j}");
    for k in [
        "zero_copy_gbps",
        "copy_gbps",
        "raw_sendfile_gbps",
        "raw_copy_gbps",
        "zero_copy_client_cpu_s_per_gb",
        "copy_client_cpu_s_per_gb",
        "raw_sendfile_client_cpu_s_per_gb",
        "raw_copy_client_cpu_s_per_gb",
        "batched_msgs_per_s",
        "unbatched_msgs_per_s",
    ] {
        assert!(n(k) > 0.0 && n(k).is_finite(), "{k} in {j}");
    }
    assert!(n("zero_copy_server_cold_regions") >= 0.0, "{j}");
    // Cold: the pool server sent the pass with sendfile and found regions to read in first.
    let cold = |k: &str| j["cold"][k].as_f64().unwrap_or_else(|| panic!("no cold.{k} in {j}"));
    assert_eq!(cold("pool_server_sendfile_bytes"), file, "{j}");
    assert!(cold("pool_server_cold_regions") >= 1.0, "{j}");
    for k in ["pool_gbps", "inline_gbps", "pool_ping_max_ms", "inline_ping_max_ms"] {
        assert!(cold(k) > 0.0 && cold(k).is_finite(), "cold.{k} in {j}");
    }
}

fn bench_json(args: &[&str]) -> serde_json::Value {
    let argv: Vec<&std::ffi::OsStr> = args.iter().map(std::ffi::OsStr::new).collect();
    let out = run_sluice(&argv, Duration::from_secs(180));
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("{e}: not one JSON object: {stdout}"))
}

#[test]
fn bench_push_measures_the_kernel_baseline_beside_the_server() {
    let j = bench_json(&["bench", "push", "--json", "--bytes", "48M", "--memory-budget", "16M"]);
    let n = |k: &str| j[k].as_f64().unwrap_or_else(|| panic!("no number {k} in {j}"));
    assert!(n("stored_bytes") >= n("bytes") && n("bytes") >= 40.0 * 1048576.0, "{j}");
    for k in ["ingest_gbps", "server_cpu_s_per_gb", "baseline_gbps", "cpu_ratio"] {
        assert!(n(k) > 0.0 && n(k).is_finite(), "{k} in {j}");
    }
    // The sink's CPU is counted in clock ticks: at this size it may round to 0, never below.
    assert!(n("baseline_cpu_s_per_gb") >= 0.0, "{j}");
}

#[test]
fn bench_connections_reads_back_every_byte_at_each_count() {
    let j = bench_json(&[
        "bench",
        "connections",
        "--json",
        "--counts",
        "2,40",
        "--bytes",
        "20M",
        "--memory-budget",
        "32M",
        "--rounds",
        "2",
        "--inflight-total",
        "8M",
        "--passes",
        "3",
    ]);
    let rows = j["rows"].as_array().unwrap_or_else(|| panic!("no rows in {j}"));
    assert_eq!(rows.len(), 2, "{j}");
    assert_eq!(j["rounds"].as_u64(), Some(2), "{j}");
    for (r, want) in rows.iter().zip([2u64, 40]) {
        let n = |k: &str| r[k].as_f64().unwrap_or_else(|| panic!("no number {k} in {r}"));
        assert_eq!(r["connections"].as_u64(), Some(want), "{r}");
        // (The bench itself fails when a reader gets other than the bytes pushed.)
        assert!(n("bytes") > 0.0 && n("push_gbps") > 0.0 && n("fetch_gbps") > 0.0, "{r}");
        assert!(n("server_peak_rss_bytes") > 0.0 && n("server_threads") >= 1.0, "{r}");
        // The set-up (writers, connections) is timed apart from the push, and also with it.
        assert!(n("setup_seconds") > 0.0, "{r}");
        assert!(n("push_gbps_with_setup") > 0.0, "{r}");
        assert!(n("push_gbps_with_setup") <= n("push_gbps"), "{r}");
        if std::path::Path::new("/proc/net/netstat").exists() {
            assert!(r["listen_overflows"].as_u64().is_some(), "{r}");
        }
        let allowed = (32u64 << 20) + (64 << 20) + (64 << 10) * want;
        assert_eq!(r["rss_allowed_bytes"].as_u64(), Some(allowed), "{r}");
        // The clients share 8 MiB in flight, at least a 256 KiB batch each.
        assert_eq!(
            r["client_inflight_bytes"].as_u64(),
            Some((8u64 << 20) / want).map(|w| w.max(256 << 10)),
            "{r}"
        );
        // Each count ran once a round, the rows' GB/s the median of those runs.
        let runs = r["runs"].as_array().unwrap_or_else(|| panic!("no runs in {r}"));
        assert_eq!(runs.len(), 2, "{r}");
        let push: Vec<f64> = runs.iter().map(|x| x["push_gbps"].as_f64().unwrap()).collect();
        assert!((n("push_gbps") - (push[0] + push[1]) / 2.0).abs() < 1e-9, "{r}");
        let peak = runs.iter().map(|x| x["server_peak_rss_bytes"].as_u64().unwrap()).max();
        assert_eq!(r["server_peak_rss_bytes"].as_u64(), peak, "{r}");
        // Each run pushed and read three shuffles through the same clients: its figures are
        // the median of the second and third passes', the first pass's beside them.
        for run in runs {
            let passes = run["passes"].as_array().unwrap_or_else(|| panic!("no passes in {run}"));
            let of = |i: usize, k: &str| passes[i][k].as_f64().unwrap();
            assert_eq!(passes.len(), 3, "{run}");
            assert!((0..3).all(|i| passes[i]["pass"].as_u64() == Some(i as u64 + 1)), "{run}");
            assert!((0..3).all(|i| of(i, "bytes") == n("bytes")), "{run}");
            let later = (of(1, "push_gbps") + of(2, "push_gbps")) / 2.0;
            assert!((run["push_gbps"].as_f64().unwrap() - later).abs() < 1e-9, "{run}");
            let first = run["first_pass_push_gbps"].as_f64();
            assert_eq!(first, Some(of(0, "push_gbps")), "{run}");
            let fetch = run["first_pass_fetch_gbps"].as_f64();
            assert_eq!(fetch, Some(of(0, "fetch_gbps")), "{run}");
        }
    }
    // The first round ran 2 connections first, the second 40 first.
    let seq = |row: usize, round: usize| rows[row]["runs"][round]["seq"].as_u64().unwrap();
    assert_eq!((seq(0, 0), seq(1, 0), seq(1, 1), seq(0, 1)), (0, 1, 2, 3), "{j}");
    assert_eq!(rows[0]["push_vs_first"].as_f64(), Some(1.0), "{j}");
}

#[test]
fn bench_metadata_reads_back_every_pair_and_reports_its_memory() {
    let j = bench_json(&[
        "bench",
        "metadata",
        "--json",
        "--maps",
        "20",
        "--partitions",
        "300",
        "--fraction",
        "0.5",
        "--memory-budget",
        "64M",
    ]);
    let n = |k: &str| j[k].as_f64().unwrap_or_else(|| panic!("no number {k} in {j}"));
    // Half the pairs by the bench's rule; each batch read back (the bench checks bytes and
    // batches against what it pushed before it prints).
    assert_eq!(n("pairs_pushed"), 3000.0, "{j}");
    assert_eq!(n("pushed_payload_bytes"), 3000.0 * 16.0, "{j}");
    assert_eq!(n("stored_bytes"), 3000.0 * 36.0, "{j}");
    assert_eq!(n("server_memory_used_bytes"), 0.0, "committed: nothing buffered {j}");
    for k in ["commit_seconds", "server_rss_after_read_bytes", "client_peak_rss_bytes"] {
        assert!(n(k) > 0.0 && n(k).is_finite(), "{k} in {j}");
    }
    // The core's count: at least a byte per (map, partition) count and two per run.
    assert!(n("server_metadata_bytes") >= 3.0 * 3000.0, "{j}");
    assert!(n("server_metadata_bytes") < 1e8, "{j}");
}
