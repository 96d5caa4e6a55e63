//! TLS with real processes (docs/security.md): a server with a certificate from a throw-away CA,
//! mutual TLS, and the ways a connection can fail — a plain-text client, an untrusted CA, an
//! expired certificate, no client certificate — each a clear error while the server goes on
//! serving. Chunks go out encrypted in user space when kTLS is off (by configuration, or because
//! the kernel lacks it): the server counts them there, sends nothing with `sendfile` and names the
//! path and its reason in its log. Where the kernel has kTLS (`tls` in
//! /proc/sys/net/ipv4/tcp_available_ulp) the keys go to the kernel and chunks go out with
//! `sendfile`; elsewhere that test is ignored, `KTLS TEST NOT RUN` (build.rs, `cfg(no_ktls)`).
//! Certificates reload on `SIGHUP`.

mod utils;

use std::net::SocketAddr;
use std::path::Path;

use bytes::{Bytes, BytesMut};
use sluice_proto::batch::put_batch;
use sluice_proto::message::*;
use sluice_proto::Message;
use sluice_testkit::TestPki;
use sluice_transport::{ClientConfig, Connection, TlsClientConfig, TransportError};
use utils::*;

fn tls_sets(cert: &Path, key: &Path, client_ca: Option<&Path>) -> Vec<String> {
    let mut sets = vec![
        format!("transport.tls.cert_file=\"{}\"", cert.display()),
        format!("transport.tls.key_file=\"{}\"", key.display()),
    ];
    if let Some(ca) = client_ca {
        sets.push(format!("transport.tls.client_ca_file=\"{}\"", ca.display()));
    }
    sets
}

fn tls_client(
    ca: &Path,
    client: Option<&(std::path::PathBuf, std::path::PathBuf)>,
) -> ClientConfig {
    ClientConfig {
        app_id: "tls-app".into(),
        tls: Some(TlsClientConfig {
            ca_file: ca.to_owned(),
            cert_file: client.map(|c| c.0.clone()),
            key_file: client.map(|c| c.1.clone()),
            server_name: None,
        }),
        ..test_transport()
    }
}

async fn connect_err(addr: SocketAddr, cfg: &ClientConfig) -> String {
    match Connection::connect(addr, cfg).await {
        Ok(_) => panic!("connected"),
        Err(e) => e.to_string(),
    }
}

/// Registers, pushes 3 batches of 64 KiB into partition 0, commits, and reads the partition
/// back: the pushed bytes and the chunks' bytes.
async fn round_trip(c: &Connection, app: &str) -> (Vec<u8>, Vec<u8>) {
    call(c, RegisterApp { app_id: app.into(), ..Default::default() }).await.unwrap();
    let reg = RegisterShuffle {
        app_id: app.into(),
        shuffle_id: 1,
        num_maps: 1,
        num_partitions: 1,
        replication: 1,
    };
    call(c, reg).await.unwrap();
    let mut pushed = Vec::new();
    for b in 0..3 {
        let records: Vec<_> = (0..64).map(|s| record(0, 0, b * 100 + s, 1000)).collect();
        let mut body = BytesMut::new();
        put_batch(&mut body, 0, 0, b, &framed(&records));
        pushed.extend_from_slice(&body);
        let push = Push { app_id: app.into(), shuffle_id: 1, partition_id: 0 };
        call_body(c, push, body.freeze()).await.unwrap();
    }
    let end = MapperEnd {
        app_id: app.into(),
        shuffle_id: 1,
        map_id: 0,
        attempt_id: 0,
        batch_counts: vec![BatchCount { partition_id: 0, batches: 3 }],
    };
    call(c, end).await.unwrap();
    call(c, CommitShuffle { app_id: app.into(), shuffle_id: 1 }).await.unwrap();
    let open = OpenStream {
        app_id: app.into(),
        shuffle_id: 1,
        partition_id: 0,
        map_start: 0,
        map_end: 1,
        attempts: vec![],
    };
    let Ok(Message::StreamHandle(h)) = call(c, open).await else { panic!("open stream") };
    let mut read = Vec::new();
    for i in 0..h.chunk_lengths.len() as u32 {
        let fetch = FetchChunk { stream_id: h.stream_id, chunk_index: i };
        let (_, body) = call_body(c, fetch, Bytes::new()).await.expect("fetch");
        read.extend_from_slice(&body);
    }
    (pushed, read)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_client_certificates_and_every_way_to_fail() {
    bounded("tls_with_client_certificates_and_every_way_to_fail", 150, async {
        let scratch = Scratch::new();
        let dir = scratch.path();
        let pki = TestPki::new(dir, "cluster").unwrap();
        let (cert, key) = pki.issue("server", &["127.0.0.1", "localhost"], false).unwrap();
        let client_cert = pki.issue("client", &["tls-client"], false).unwrap();
        // kTLS off by configuration: the user-space path, on any kernel.
        let mut sets = tls_sets(&cert, &key, Some(&pki.ca_file()));
        sets.push("transport.tls.ktls=false".into());
        let mut server = scratch.server(&ServerSpec { metrics: true, sets, ..Default::default() });
        // The metrics endpoint runs TLS too (same certificate): a plain scrape gets nothing.
        let plain_scrape =
            sluice_testkit::scrape(server.metrics.unwrap(), std::time::Duration::from_secs(5));
        assert!(plain_scrape.map_or(true, |m| m.is_empty()), "metrics served in plain text");
        server.tls_ca = Some(pki.ca_file());
        let good = tls_client(&pki.ca_file(), Some(&client_cert));

        // A plain-text client: told the server speaks TLS (or, at worst, that it closed).
        let plain = connect_err(server.addr, &test_transport()).await;
        assert!(plain.contains("TLS") || plain.contains("closed"), "plain client: {plain}");
        // A client that trusts another CA.
        let other = TestPki::new(dir, "other").unwrap();
        let untrusted =
            connect_err(server.addr, &tls_client(&other.ca_file(), Some(&client_cert))).await;
        assert!(untrusted.contains("UnknownIssuer"), "untrusted CA: {untrusted}");
        // No client certificate where mTLS asks for one; one from another CA.
        let anonymous = connect_err(server.addr, &tls_client(&pki.ca_file(), None)).await;
        // (TLS 1.3: the client learns it at its first read, from the server's alert.)
        assert!(anonymous.contains("CertificateRequired"), "{anonymous}");
        let stranger = other.issue("stranger", &["x"], false).unwrap();
        let foreign = connect_err(server.addr, &tls_client(&pki.ca_file(), Some(&stranger))).await;
        assert!(foreign.contains("alert"), "{foreign}");

        // The server kept serving: a good client's data goes round byte for byte.
        let c = Connection::connect(server.addr, &good).await.expect("a trusted client");
        let (pushed, read) = round_trip(&c, "tls-app").await;
        assert_eq!(read, pushed, "bytes read back through TLS differ from those pushed");
        let m = server.metrics().await;
        // The fallback path: chunks were read and encrypted in user space, never sendfile'd.
        assert!(metric(&m, "sluice_server_tls_file_bytes_total") >= pushed.len() as f64);
        assert_eq!(metric(&m, "sluice_server_sendfile_bytes_total"), 0.0, "plain bytes sent");
        assert_eq!(metric(&m, "sluice_server_ktls_connections_total"), 0.0, "kTLS is off");
        let user_space = metric(&m, "sluice_server_tls_connections_user_space_total");
        assert!(user_space >= 1.0);
        // Every connection that finished its TLS handshake fell back, counted.
        assert_eq!(metric(&m, "sluice_server_ktls_fallbacks_total"), user_space);
        assert!(metric(&m, "sluice_server_tls_handshakes_failed_total") >= 4.0);
        let log = std::fs::read_to_string(server.log_path().expect("a log file")).unwrap();
        assert!(
            log.contains("TLS: user space: kTLS is off in the configuration"),
            "the path and its reason are named in the log"
        );

        // An expired certificate: refused by the client, with the reason.
        let (old_cert, old_key) = pki.issue("expired", &["127.0.0.1"], true).unwrap();
        let expired = scratch.server(&ServerSpec {
            sets: tls_sets(&old_cert, &old_key, None),
            ..Default::default()
        });
        let e = connect_err(expired.addr, &tls_client(&pki.ca_file(), None)).await;
        assert!(e.contains("certificate expired"), "expired certificate: {e}");

        // Reload: the expired server gets a valid certificate of another CA in the same files;
        // after SIGHUP clients of that CA connect, without a restart.
        let fresh = other.issue("fresh", &["127.0.0.1"], false).unwrap();
        std::fs::copy(&fresh.0, &old_cert).unwrap();
        std::fs::copy(&fresh.1, &old_key).unwrap();
        rustix::process::kill_process(
            rustix::process::Pid::from_raw(expired.pid() as i32).unwrap(),
            rustix::process::Signal::HUP,
        )
        .unwrap();
        let trusts_other = tls_client(&other.ca_file(), None);
        let mut reloaded = false;
        // Up to 30 s: a debug server on a loaded machine (the rest of the suite, builds) can
        // take seconds to read and build the new configuration.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while std::time::Instant::now() < deadline {
            match Connection::connect(expired.addr, &trusts_other).await {
                Ok(c) => {
                    call(&c, Ping {}).await.expect("ping after the reload");
                    reloaded = true;
                    break;
                }
                Err(TransportError::Closed(_)) => {
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await
                }
                Err(e) => panic!("{e}"),
            }
        }
        assert!(reloaded, "the certificate was not reloaded on SIGHUP");

        // Reload on change: with `reload_check_ms` short, new files are taken without a signal.
        let (c2, k2) = pki.issue("watched", &["127.0.0.1"], false).unwrap();
        let mut sets = tls_sets(&c2, &k2, None);
        sets.push("transport.tls.reload_check_ms=100".into());
        let watched = scratch.server(&ServerSpec { sets, ..Default::default() });
        let trusts_pki = tls_client(&pki.ca_file(), None);
        Connection::connect(watched.addr, &trusts_pki).await.expect("the first certificate");
        let next = other.issue("watched-next", &["127.0.0.1"], false).unwrap();
        std::fs::copy(&next.1, &k2).unwrap();
        std::fs::copy(&next.0, &c2).unwrap();
        let mut changed = false;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while std::time::Instant::now() < deadline {
            if let Ok(c) = Connection::connect(watched.addr, &trusts_other).await {
                call(&c, Ping {}).await.expect("ping after the change");
                changed = true;
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        assert!(changed, "the changed files were not reloaded");
    })
    .await
}

/// A TLS server with kTLS on (the default), one client, one round trip: returns the bytes pushed
/// and read back, the server's metrics and its log.
async fn ktls_round_trip(
    scratch: &Scratch,
) -> (Vec<u8>, Vec<u8>, std::collections::HashMap<String, f64>, String) {
    let pki = TestPki::new(scratch.path(), "ktls").unwrap();
    let (cert, key) = pki.issue("server", &["127.0.0.1"], false).unwrap();
    let server = scratch.server(&ServerSpec {
        metrics: true,
        sets: tls_sets(&cert, &key, None),
        ..Default::default()
    });
    let c = Connection::connect(server.addr, &tls_client(&pki.ca_file(), None)).await.unwrap();
    let (pushed, read) = round_trip(&c, "tls-app").await;
    let mut server = server;
    server.tls_ca = Some(pki.ca_file());
    let m = server.metrics().await;
    let log = std::fs::read_to_string(server.log_path().expect("a log file")).unwrap();
    (pushed, read, m, log)
}

/// kTLS for real: the keys go to the kernel after the handshake, chunks go out with `sendfile`
/// on the kTLS socket (the kernel encrypting them) and arrive byte-identical through the
/// client's rustls. Needs `tls` in /proc/sys/net/ipv4/tcp_available_ulp (`modprobe tls`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    no_ktls,
    ignore = "KTLS TEST NOT RUN: this kernel has no `tls` ULP (/proc/sys/net/ipv4/tcp_available_ulp; modprobe tls)"
)]
async fn ktls_sends_chunks_with_sendfile_where_the_kernel_has_it() {
    if !sluice_transport::ktls_available() {
        // Built where the kernel had kTLS, run where it has not: say so, assert nothing.
        eprintln!("KTLS TEST NOT RUN: no `tls` in /proc/sys/net/ipv4/tcp_available_ulp");
        return;
    }
    bounded("ktls_sends_chunks_with_sendfile_where_the_kernel_has_it", 60, async {
        let scratch = Scratch::new();
        let (pushed, read, m, log) = ktls_round_trip(&scratch).await;
        assert_eq!(read, pushed, "bytes read back through kTLS differ from those pushed");
        assert_eq!(metric(&m, "sluice_server_ktls_connections_total"), 1.0, "{log}");
        assert_eq!(metric(&m, "sluice_server_ktls_fallbacks_total"), 0.0);
        assert_eq!(metric(&m, "sluice_server_ktls_failures_total"), 0.0);
        assert!(metric(&m, "sluice_server_sendfile_bytes_total") > 0.0, "no sendfile under kTLS");
        assert_eq!(metric(&m, "sluice_server_tls_file_bytes_total"), 0.0, "chunks in user space");
        assert!(log.contains("TLS: kTLS: the session keys went to the kernel"), "{log}");
    })
    .await
}

/// Where the kernel has no kTLS, kTLS on (the default) falls back to user space before the keys
/// leave rustls: the connection works, byte-identical, counted as a fallback, the reason logged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(no_ktls),
    ignore = "this kernel has kTLS: its absence cannot be seen here (the kTLS test runs instead)"
)]
async fn without_ktls_in_the_kernel_tls_falls_back_to_user_space() {
    bounded("without_ktls_in_the_kernel_tls_falls_back_to_user_space", 60, async {
        let scratch = Scratch::new();
        let (pushed, read, m, log) = ktls_round_trip(&scratch).await;
        assert_eq!(read, pushed, "bytes read back through TLS differ from those pushed");
        assert_eq!(metric(&m, "sluice_server_ktls_available"), 0.0);
        assert_eq!(metric(&m, "sluice_server_ktls_connections_total"), 0.0);
        assert_eq!(metric(&m, "sluice_server_ktls_fallbacks_total"), 1.0);
        assert_eq!(metric(&m, "sluice_server_ktls_failures_total"), 0.0);
        assert_eq!(metric(&m, "sluice_server_tls_connections_user_space_total"), 1.0);
        assert_eq!(metric(&m, "sluice_server_sendfile_bytes_total"), 0.0);
        assert!(metric(&m, "sluice_server_tls_file_bytes_total") >= pushed.len() as f64);
        assert!(
            log.contains("TLS: user space: the kernel refused the `tls` ULP (kTLS)"),
            "the reason is not in the log: {log}"
        );
    })
    .await
}

/// `sluice admin` against a coordinator whose listeners run TLS: its admin endpoint serves
/// HTTPS; with the CA the command works, without it (plain HTTP) it fails with a message.
#[test]
fn sluice_admin_talks_https_to_a_tls_coordinator() {
    let scratch = Scratch::new();
    let pki = TestPki::new(scratch.path(), "admin").unwrap();
    let (cert, key) = pki.issue("coordinator", &["127.0.0.1"], false).unwrap();
    let mut args: Vec<String> =
        ["coordinator", "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"]
            .map(String::from)
            .to_vec();
    for set in tls_sets(&cert, &key, None) {
        args.extend(["--set".to_string(), set]);
    }
    let coord = scratch.spawn("coordinator", &args);
    let admin = coord.metrics.expect("an admin endpoint").to_string();
    let run = |extra: &[&str]| {
        std::process::Command::new(sluice_bin())
            .args([
                "admin",
                "--coordinator",
                admin.as_str(),
                "--json",
                "--request-timeout-secs",
                "10",
            ])
            .args(extra)
            .output()
            .expect("running sluice admin")
    };
    let ca = pki.ca_file().display().to_string();
    let ok = run(&["--tls-ca-file", &ca, "servers"]);
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
    let servers: serde_json::Value =
        serde_json::from_slice(&ok.stdout).expect("the servers as JSON");
    assert!(servers.is_object() || servers.is_array(), "{servers}");
    let plain = run(&["servers"]);
    assert!(!plain.status.success(), "plain HTTP answered by a TLS endpoint");
    let why = String::from_utf8_lossy(&plain.stderr);
    assert!(why.contains(admin.as_str()), "the failure names no address: {why}");

    // A plain-text client on the coordinator's protocol port: the TLS handshake fails, the
    // connection is closed, and the coordinator counts it like a server does.
    use std::io::{Read, Write};
    let scrape = || {
        let addr = coord.metrics.unwrap();
        sluice_testkit::scrape_tls(addr, std::time::Duration::from_secs(5), Some(&pki.ca_file()))
            .expect("the coordinator's metrics over HTTPS")
    };
    assert_eq!(metric(&scrape(), "sluice_coordinator_tls_handshakes_failed_total"), 0.0);
    let mut s = std::net::TcpStream::connect(coord.addr).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
    s.write_all(b"SLUICE plain text, not a TLS ClientHello\r\n\r\n").unwrap();
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest); // the coordinator closes (an alert at most)
    let mut counted = 0.0;
    for _ in 0..50 {
        counted = metric(&scrape(), "sluice_coordinator_tls_handshakes_failed_total");
        if counted > 0.0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(counted, 1.0, "failed TLS handshakes on the coordinator");
}
