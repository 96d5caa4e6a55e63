//! The coordinator's status page in a real headless Chromium: a cluster holding a shuffle (one
//! server drained), the page loaded until its script has drawn the API's data, the DOM checked
//! for the servers, the application and the shuffle, and a screenshot taken.
//!
//! Without Chromium (`build.rs` looks for it; `make test` installs Debian's `chromium` first)
//! the test is ignored with the reason `STATUS PAGE BROWSER TEST NOT RUN: …`: not run, never
//! passed. The screenshot goes to `target/`; with `SLUICE_SCREENSHOT_TO=docs/status-page.png`
//! (`make status-page-screenshot`) it also replaces the one in the docs.

mod utils;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use sluice_admin::AdminClient;
use utils::*;

const APP: &str = "spark-etl-nightly";

/// `$SLUICE_CHROMIUM`, else `chromium` on the `PATH`.
fn chromium() -> PathBuf {
    if let Some(p) = std::env::var_os("SLUICE_CHROMIUM") {
        return p.into();
    }
    let path = std::env::var_os("PATH").expect("PATH");
    std::env::split_paths(&path)
        .map(|d| d.join("chromium"))
        .find(|p| p.is_file())
        .expect("build.rs found chromium, but it is gone")
}

/// Runs headless Chromium on `url` (bounded): the DOM once the page's timers have had
/// `budget_ms` of virtual time, and a screenshot to `png`.
fn load(url: &str, png: &Path, profile: &Path) -> String {
    let mut child = Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            "--window-size=1280,900",
            "--virtual-time-budget=5000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(format!("--screenshot={}", png.display()))
        .arg("--dump-dom")
        .arg(url)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting chromium");
    let start = Instant::now();
    while child.try_wait().expect("waiting for chromium").is_none() {
        if start.elapsed() > Duration::from_secs(45) {
            let _ = child.kill();
            panic!("chromium did not finish within 45 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().expect("chromium output");
    assert!(
        out.status.success(),
        "chromium failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    no_chromium,
    ignore = "STATUS PAGE BROWSER TEST NOT RUN: no chromium on this machine (apt-get install chromium)"
)]
async fn the_status_page_shows_servers_applications_and_shuffles_in_a_browser() {
    bounded("the_status_page_shows_servers_applications_and_shuffles_in_a_browser", 90, async {
        let scratch = Scratch::new();
        let args: Vec<String> =
            ["coordinator", "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"]
                .map(String::from)
                .to_vec();
        let coord = scratch.spawn("coordinator", &args);
        let spec = ServerSpec { metrics: true, ..ServerSpec::with_coordinator(coord.addr) };
        let (s1, s2) = (scratch.server(&spec), scratch.server(&spec));
        wait_registered(coord.addr, 2, 15).await;
        let admin_addr = coord.metrics.expect("admin address").to_string();

        // A committed shuffle over both servers, then one server drained.
        let client = client(APP, Some(coord.addr));
        client.register_app().await.unwrap();
        let a = client.register_shuffle(7, 4, 12, 1).await.unwrap();
        for w in spawn_writers(&client, &a, 4, 100, 2000, |m, seq| (m * 7 + seq) % 12) {
            w.await.unwrap().expect("pushes");
        }
        client.commit_shuffle(&a).await.expect("commit");
        let (id1, id2) =
            (format!("127.0.0.1:{}", s1.addr.port()), format!("127.0.0.1:{}", s2.addr.port()));
        let api = AdminClient::new(&admin_addr, None, Duration::from_secs(10));
        api.set_drain(&id2, true, Some("status page test")).await.expect("drain");
        // Until both servers' own reports (shuffles, disks, the drain taken) have arrived.
        let mut reported = false;
        for _ in 0..100 {
            let s = api.servers().await.expect("servers").servers;
            if s.iter().all(|m| m.shuffles_held == Some(1) && m.drain_pending.is_none()) {
                reported = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(reported, "the servers' status reports never reached the coordinator");
        let page = api.call("GET".parse().unwrap(), "/", Bytes::new()).await.expect("page");
        assert!(String::from_utf8_lossy(&page.body).contains("<title>Sluice status</title>"));

        let png = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("status-page.png");
        let profile = tempfile::tempdir().expect("profile dir");
        let url = format!("http://{admin_addr}/");
        let (png2, dir) = (png.clone(), profile.path().to_owned());
        let dom = tokio::task::spawn_blocking(move || load(&url, &png2, &dir)).await.unwrap();

        // The script drew the API's data: the servers (one draining), the application, the
        // shuffle with its maps and partitions, the disks.
        assert!(dom.contains(r#"data-ready="yes""#), "the page never drew its data:\n{dom}");
        for needle in [&id1, &id2, APP] {
            assert!(dom.contains(needle), "the page does not name {needle}:\n{dom}");
        }
        assert!(dom.contains(r#"<span class="badge draining">draining</span>"#), "{dom}");
        assert!(dom.contains(r#"<span class="badge live">live</span>"#), "{dom}");
        assert!(dom.contains(r#"<span class="badge in_service">in service</span>"#), "{dom}");
        assert!(dom.contains("2 live") || dom.contains("1 live, 1 draining"), "{dom}");
        let shuffle_row = format!(
            r#"<td class=""><code>{APP}</code></td><td class="num">7</td><td class="num">4</td><td class="num">12</td>"#
        );
        assert!(dom.contains(&shuffle_row), "no row for shuffle 7 (4 maps, 12 partitions):\n{dom}");

        let bytes = std::fs::read(&png).expect("the screenshot");
        assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n") && bytes.len() > 10_000, "not a PNG");
        if let Some(to) = std::env::var_os("SLUICE_SCREENSHOT_TO") {
            let to = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(to);
            std::fs::copy(&png, &to).expect("copying the screenshot");
            println!("screenshot saved to {}", to.display());
        }
        println!("screenshot: {}", png.display());
    })
    .await
}
