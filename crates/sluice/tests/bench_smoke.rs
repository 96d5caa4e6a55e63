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
