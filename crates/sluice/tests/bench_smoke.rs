//! `sluice bench transport` at a toy size: it runs, and its counters show that each server took
//! the path it is reported under (the figures in docs/benchmarks.md rest on that).

mod utils;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use utils::{sluice_bin, Scratch};

#[test]
fn bench_transport_reports_each_path_it_measured() {
    let dir = Scratch::new();
    let mut child = Command::new(sluice_bin())
        .args(["bench", "transport", "--json", "--file-gib", "0.03", "--chunk-mib", "1"])
        .args(["--passes", "1", "--rounds", "1", "--frames", "5000", "--dir"])
        .arg(dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning sluice bench transport");
    let start = Instant::now();
    while child.try_wait().expect("waiting for the bench").is_none() {
        if start.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            panic!("sluice bench transport did not finish within 120 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().expect("bench output");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "bench failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
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
        "batched_msgs_per_s",
        "unbatched_msgs_per_s",
    ] {
        assert!(n(k) > 0.0 && n(k).is_finite(), "{k} in {j}");
    }
}
