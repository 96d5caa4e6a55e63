//! `sluice local`, the main job, run as a real process: it starts its own coordinator and
//! servers, shuffles with a retried and a speculative map attempt, and verifies every record.

mod utils;

use std::time::Duration;

use utils::{files_under, run_sluice, Scratch};

/// Runs `sluice local ARGS --json --data-root ROOT` (bounded) and returns its JSON summary.
fn run_local(args: &[&str], root: &std::path::Path, limit: Duration) -> serde_json::Value {
    let mut argv: Vec<&std::ffi::OsStr> = vec!["local".as_ref()];
    argv.extend(args.iter().map(|a| std::ffi::OsStr::new(*a)));
    argv.extend(["--json".as_ref(), "--data-root".as_ref(), root.as_os_str()]);
    let out = run_sluice(&argv, limit);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let line =
        stdout.lines().rev().find(|l| l.trim_start().starts_with('{')).unwrap_or_else(|| {
            panic!("no JSON summary from sluice local {args:?}:\n{stdout}\n{stderr}")
        });
    serde_json::from_str(line).expect("a JSON summary")
}

fn check_summary(s: &serde_json::Value, servers: u64) {
    assert_eq!(s["verified"], serde_json::Value::Bool(true), "{s}");
    assert_eq!(s["servers"].as_u64(), Some(servers), "{s}");
    assert_eq!(s["maps"].as_u64(), Some(6), "{s}");
    assert_eq!(s["partitions"].as_u64(), Some(8), "{s}");
    assert_eq!(s["mismatched_partitions"].as_array().map(|a| a.len()), Some(0), "{s}");
    let records = s["records"].as_u64().unwrap_or(0);
    // 32 MiB of 100-byte records, give or take the rounding per map.
    assert!(((32 << 20) / 100 - 6..=(32 << 20) / 100).contains(&records), "records {records}: {s}");
    // Every record is read back (the failed attempt's half is pushed too but never read).
    let fetched = s["fetched_bytes"].as_u64().unwrap_or(0);
    assert!(fetched >= records * 100, "fetched {fetched} bytes for {records} records: {s}");
    // Every chunk went out by the zero-copy path: the servers' `sendfile` moved at least what
    // the readers kept. More, in fact: chunks also hold the losing attempts' batches (about 8 MiB
    // here), which covers a last `sendfile` call not yet counted when the summary was taken.
    let (sent, calls) = (s["sendfile_bytes"].as_u64(), s["sendfile_calls"].as_u64());
    assert!(sent >= Some(fetched), "sendfile moved {sent:?} of {fetched} fetched bytes: {s}");
    assert!(calls.is_some_and(|c| c > 0 && Some(c) <= sent), "{s}");
    assert!(s["server_peak_rss_bytes"].as_u64().unwrap_or(0) > 0, "{s}");
}

#[test]
fn local_job_two_servers_verifies() {
    let scratch = Scratch::new();
    let s = run_local(
        &["--bytes", "32M", "--maps", "6", "--partitions", "8"],
        scratch.path(),
        Duration::from_secs(60),
    );
    check_summary(&s, 2);
    // The job unregisters its app and removes its data directories.
    assert!(
        files_under(scratch.path()).is_empty(),
        "left behind: {:?}",
        files_under(scratch.path())
    );
}

#[test]
fn local_job_one_server_verifies() {
    let scratch = Scratch::new();
    let s = run_local(
        &["--bytes", "32M", "--maps", "6", "--partitions", "8", "--servers", "1"],
        scratch.path(),
        Duration::from_secs(60),
    );
    check_summary(&s, 1);
    assert!(
        files_under(scratch.path()).is_empty(),
        "left behind: {:?}",
        files_under(scratch.path())
    );
}

/// `sluice local --tls`: a throw-away CA, every listener on TLS; the job verifies, and every
/// chunk went out encrypted: with `sendfile` on a kTLS socket where the kernel has kTLS, else in
/// user space, none with `sendfile`.
#[test]
fn local_job_with_tls_verifies() {
    let scratch = Scratch::new();
    let s = run_local(
        &["--bytes", "32M", "--maps", "6", "--partitions", "8", "--tls"],
        scratch.path(),
        Duration::from_secs(90),
    );
    assert_eq!(s["verified"], serde_json::Value::Bool(true), "{s}");
    assert_eq!(s["tls"], serde_json::Value::Bool(true), "{s}");
    let fetched = s["fetched_bytes"].as_u64().unwrap_or(0);
    assert!(fetched >= 32 << 20, "{s}");
    if sluice_transport::ktls_available() {
        assert!(s["sendfile_bytes"].as_u64().unwrap_or(0) >= fetched, "kTLS, no sendfile: {s}");
        assert_eq!(s["tls_file_bytes"].as_u64(), Some(0), "kTLS, chunks in user space: {s}");
        assert!(s["ktls_connections"].as_u64().unwrap_or(0) > 0, "{s}");
    } else {
        assert_eq!(s["sendfile_bytes"].as_u64(), Some(0), "plain bytes went out: {s}");
        assert!(s["tls_file_bytes"].as_u64().unwrap_or(0) >= fetched, "{s}");
        assert_eq!(s["ktls_connections"].as_u64(), Some(0), "{s}");
    }
}
