//! The admin API of real `sluice coordinator` and `sluice server` processes holding a shuffle:
//! every endpoint of docs/openapi.yaml called, each answer's status and JSON checked against
//! the document's schemas, and the bad inputs (unknown names, bad ids, missing and wrong
//! tokens, wrong methods, garbage bodies, unknown paths) answered with a 4xx and a JSON error.

mod utils;

use std::collections::BTreeSet;
use std::time::Duration;

use bytes::Bytes;
use serde_json::Value;
use sluice_admin::AdminClient;
use utils::openapi::OpenApi;
use utils::*;

const TOKEN: &str = "test-admin-token-0123";
const APP: &str = "api-app";

/// The server's metric names before the admin API existed: dashboards rely on them.
const SERVER_METRICS: &[&str] = &[
    "sluice_server_push_requests_total",
    "sluice_server_pushed_bytes_total",
    "sluice_server_busy_replies_total",
    "sluice_server_split_replies_total",
    "sluice_server_pushes_held_total",
    "sluice_server_push_hold_microseconds_total",
    "sluice_server_flushed_bytes_total",
    "sluice_server_commits_total",
    "sluice_server_commit_wait_microseconds_total",
    "sluice_server_commit_sync_microseconds_total",
    "sluice_server_recovered_shuffles_total",
    "sluice_server_recovered_lost_total",
    "sluice_server_streams_opened_total",
    "sluice_server_fetched_chunks_total",
    "sluice_server_fetched_bytes_total",
    "sluice_server_local_read_chunks_total",
    "sluice_server_local_read_bytes_total",
    "sluice_server_request_errors_total",
    "sluice_server_requests_unauthorized_total",
    "sluice_server_handshakes_failed_total",
    "sluice_server_tls_connections_user_space_total",
    "sluice_server_tls_handshakes_failed_total",
    "sluice_server_ktls_connections_total",
    "sluice_server_ktls_fallbacks_total",
    "sluice_server_ktls_failures_total",
    "sluice_server_tls_bytes_total",
    "sluice_server_tls_file_bytes_total",
    "sluice_server_ktls_available",
    "sluice_server_apps_expired_total",
    "sluice_server_body_buffers_reused_total",
    "sluice_server_body_buffers_allocated_total",
    "sluice_server_body_pool_kept_bytes",
    "sluice_server_memory_used_bytes",
    "sluice_server_metadata_bytes",
    "sluice_server_quota_refusals_total",
    "sluice_server_memory_peak_bytes",
    "sluice_server_memory_budget_bytes",
    "sluice_server_sendfile_bytes_total",
    "sluice_server_sendfile_calls_total",
    "sluice_server_writev_bytes_total",
    "sluice_server_copy_bytes_total",
    "sluice_server_cold_regions_total",
    "sluice_server_cold_region_bytes_total",
    "sluice_server_recycled_files_reused_total",
    "sluice_server_recycle_pool_bytes",
    "sluice_server_data_dirs_full",
    "sluice_server_data_dirs_failed",
    "sluice_server_draining",
    // Added for the dashboard: flush latency, the pause, connections, what is held, and series
    // per application and per data directory.
    "sluice_server_flushes_total",
    "sluice_server_flush_microseconds_total",
    "sluice_server_memory_paused",
    "sluice_server_connections_open",
    "sluice_server_shuffles_held",
    "sluice_server_partitions_held",
    "sluice_server_app_buffered_bytes",
    "sluice_server_app_stored_bytes",
    "sluice_server_data_dir_free_bytes",
    "sluice_server_data_dir_capacity_bytes",
    // Added for the object-store tier (issue 22).
    "sluice_server_offloaded_partitions_total",
    "sluice_server_offloaded_bytes_total",
    "sluice_server_offload_failures_total",
    "sluice_server_object_store_read_bytes_total",
    "sluice_server_object_store_errors_total",
    "sluice_server_object_store_bytes",
    "sluice_server_app_offloaded_bytes",
];

/// One admin endpoint under test, checked against the OpenAPI document.
struct Endpoint<'a> {
    api: &'a OpenApi,
    admin: AdminClient,
    anonymous: AdminClient,
    wrong: AdminClient,
}

/// Who calls.
#[derive(Clone, Copy)]
enum As {
    Admin,
    Anonymous,
    WrongToken,
}

impl Endpoint<'_> {
    fn new(api: &OpenApi, addr: std::net::SocketAddr) -> Endpoint<'_> {
        let c = |t: Option<&str>| {
            AdminClient::new(&addr.to_string(), t.map(String::from), Duration::from_secs(10))
        };
        Endpoint {
            api,
            admin: c(Some(TOKEN)),
            anonymous: c(None),
            wrong: c(Some("not-the-admin-token-at-all")),
        }
    }

    /// `METHOD path` (an instance of `template`) as `who` with `body`: asserts the status,
    /// checks the answer against the document, returns its JSON (`Null` for text).
    async fn call(
        &self,
        who: As,
        method: &str,
        template: &str,
        path: &str,
        body: &str,
        status: u16,
    ) -> Value {
        let client = match who {
            As::Admin => &self.admin,
            As::Anonymous => &self.anonymous,
            As::WrongToken => &self.wrong,
        };
        let m = method.parse().expect("a method");
        let a = client.call(m, path, Bytes::from(body.to_owned())).await.expect("an answer");
        let text = String::from_utf8_lossy(&a.body).into_owned();
        assert_eq!(a.status.as_u16(), status, "{method} {path}: {text}");
        self.api.check(method, template, status, a.content_type.as_deref(), &a.body);
        serde_json::from_slice(&a.body).unwrap_or(Value::Null)
    }

    /// A GET as anyone.
    async fn get(&self, template: &str, path: &str, status: u16) -> Value {
        self.call(As::Anonymous, "GET", template, path, "", status).await
    }

    /// An answer off the document (unknown path, wrong method): status and `Error` body.
    async fn error(&self, method: &str, path: &str, status: u16, code: &str) {
        let m = method.parse().expect("a method");
        let a = self.admin.call(m, path, Bytes::new()).await.expect("an answer");
        assert_eq!(a.status.as_u16(), status, "{method} {path}");
        let v: Value = serde_json::from_slice(&a.body).expect("a JSON error");
        self.api.check_schema("Error", &v);
        assert_eq!(v["code"], code, "{method} {path}: {v}");
    }
}

fn server_of(servers: &Value, id: &str) -> Value {
    let list = servers["servers"].as_array().expect("servers");
    list.iter().find(|s| s["server_id"] == id).cloned().unwrap_or(Value::Null)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_endpoint_answers_as_the_openapi_document_says() {
    bounded("every_endpoint_answers_as_the_openapi_document_says", 90, async {
        let api = OpenApi::load();
        let scratch = Scratch::new();
        let args: Vec<String> = [
            "coordinator",
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
            "--set",
            &format!("admin_token={TOKEN}"),
        ]
        .map(String::from)
        .to_vec();
        let coord = scratch.spawn("coordinator", &args);
        let spec = ServerSpec {
            metrics: true,
            sets: vec![format!("admin_token={TOKEN}")],
            ..ServerSpec::with_coordinator(coord.addr)
        };
        let (s1, s2) = (scratch.server(&spec), scratch.server(&spec));
        wait_registered(coord.addr, 2, 15).await;
        let c = Endpoint::new(&api, coord.metrics.expect("coordinator admin address"));
        let srv = Endpoint::new(&api, s1.metrics.expect("server admin address"));

        // A committed shuffle over both servers.
        let client = client(APP, Some(coord.addr));
        client.register_app().await.unwrap();
        let a = client.register_shuffle(1, 2, 4, 1).await.unwrap();
        for w in spawn_writers(&client, &a, 2, 50, 200, |m, seq| (m + seq) % 4) {
            w.await.unwrap().expect("pushes");
        }
        client.commit_shuffle(&a).await.expect("commit");
        let id1 = format!("127.0.0.1:{}", s1.addr.port());
        let id2 = format!("127.0.0.1:{}", s2.addr.port());

        // Both: health, readiness, metrics.
        for e in [&c, &srv] {
            assert_eq!(e.get("/healthz", "/healthz", 200).await["status"], "ok");
            assert_eq!(e.get("/readyz", "/readyz", 200).await["status"], "ok");
        }
        let a_metrics = c.anonymous.call("GET".parse().unwrap(), "/metrics", Bytes::new());
        let text = String::from_utf8(a_metrics.await.unwrap().body.to_vec()).unwrap();
        assert!(text.contains("sluice_coordinator_live_servers 2"), "{text}");
        for line in [
            "sluice_coordinator_servers{state=\"live\"} 2",
            "sluice_coordinator_servers{state=\"lost\"} 0",
            "sluice_coordinator_applications 1",
            "sluice_coordinator_shuffles 1",
            // No credential is configured here: nothing refused.
            "sluice_coordinator_handshakes_failed_total 0",
            "sluice_coordinator_requests_unauthorized_total 0",
            "sluice_coordinator_tls_handshakes_failed_total 0",
        ] {
            assert!(text.lines().any(|l| l == line), "no `{line}` in {text}");
        }
        c.get("/metrics", "/metrics", 200).await;
        srv.get("/metrics", "/metrics", 200).await;
        let scraped = s1.scrape().expect("scrape");
        let name = |k: &String| k.split('{').next().unwrap_or(k).to_owned();
        let names: BTreeSet<String> = scraped.keys().map(name).collect();
        let want: BTreeSet<String> = SERVER_METRICS.iter().map(|s| s.to_string()).collect();
        assert_eq!(names, want, "the server's metric names changed");
        // The shuffle held is the application's series; each data directory has one.
        let app_series = format!("sluice_server_app_stored_bytes{{app=\"{APP}\"}}");
        assert!(scraped.contains_key(&app_series), "no series {app_series}: {scraped:?}");
        let dirs = scraped.keys().filter(|k| k.starts_with("sluice_server_data_dir_free_bytes{"));
        assert_eq!(dirs.count(), 1, "one data directory, one series");

        // Coordinator: the page, servers (with what each reports of itself), apps, shuffles.
        c.get("/", "/", 200).await;
        c.get("/status", "/status", 200).await;
        let mut servers = Value::Null;
        for _ in 0..100 {
            servers = c.get("/api/v1/servers", "/api/v1/servers", 200).await;
            if [&id1, &id2].iter().all(|id| server_of(&servers, id)["shuffles_held"] == 1) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        for id in [&id1, &id2] {
            let s = server_of(&servers, id);
            assert_eq!(s["state"], "live", "{servers:#}");
            assert_eq!(s["shuffles_held"], 1, "{servers:#}");
            assert_eq!(s["disks"].as_array().map(Vec::len), Some(1), "{servers:#}");
            assert_eq!(s["disks"][0]["state"], "in_service");
        }
        let apps = c.get("/api/v1/apps", "/api/v1/apps", 200).await;
        let app = apps["apps"].as_array().unwrap().iter().find(|a| a["app_id"] == APP).cloned();
        assert_eq!(app.expect("the application")["shuffles"], serde_json::json!([1]));
        let shuffles_t = "/api/v1/apps/{app}/shuffles";
        let shuffle_t = "/api/v1/apps/{app}/shuffles/{id}";
        let list = c.get(shuffles_t, &format!("/api/v1/apps/{APP}/shuffles"), 200).await;
        assert_eq!(list["shuffles"].as_array().map(Vec::len), Some(1));
        let one = c.get(shuffle_t, &format!("/api/v1/apps/{APP}/shuffles/1"), 200).await;
        let without_age = |mut v: Value| {
            v["registered_ms"] = Value::Null;
            v
        };
        assert_eq!(without_age(one.clone()), without_age(list["shuffles"][0].clone()));
        assert_eq!((one["maps"].as_u64(), one["partitions"].as_u64()), (Some(2), Some(4)));
        let assignment = one["assignment"].as_array().expect("assignment");
        assert_eq!(assignment.len(), 4);
        for (p, place) in assignment.iter().enumerate() {
            assert_eq!(place["partition"], p);
            assert!(place["primary"] == id1.as_str() || place["primary"] == id2.as_str());
            assert!(place["replica"].is_null());
        }
        // Bad names and ids.
        c.get(shuffles_t, "/api/v1/apps/nope/shuffles", 404).await;
        c.get(shuffle_t, "/api/v1/apps/nope/shuffles/1", 404).await;
        let bad = c.get(shuffle_t, &format!("/api/v1/apps/{APP}/shuffles/abc"), 400).await;
        assert_eq!(bad["code"], "bad_request");
        let missing = c.get(shuffle_t, &format!("/api/v1/apps/{APP}/shuffles/99"), 404).await;
        assert_eq!(missing["code"], "unknown_shuffle");

        // Drain through the coordinator: token checks, body checks, then the server is told.
        let drain_t = "/api/v1/servers/{id}/drain";
        let drain1 = format!("/api/v1/servers/{id1}/drain");
        let e = c.call(As::Anonymous, "POST", drain_t, &drain1, "", 401).await;
        assert_eq!(e["code"], "unauthorized");
        c.call(As::WrongToken, "POST", drain_t, &drain1, "", 401).await;
        c.call(As::WrongToken, "DELETE", drain_t, &drain1, "", 401).await;
        let e = c.call(As::Admin, "POST", drain_t, &drain1, "{not json", 400).await;
        assert_eq!(e["code"], "invalid_body");
        let e = c.call(As::Admin, "POST", drain_t, "/api/v1/servers/nope/drain", "", 404).await;
        assert_eq!(e["code"], "unknown_server");
        let m = c.call(As::Admin, "POST", drain_t, &drain1, r#"{"reason":"test"}"#, 200).await;
        assert_eq!(m["state"], "draining");
        let mut told = false;
        for _ in 0..100 {
            let st = srv.get("/api/v1/status", "/api/v1/status", 200).await;
            if st["draining"] == true {
                told = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(told, "the server never took the coordinator's drain");
        assert_eq!(srv.get("/readyz", "/readyz", 503).await["status"], "draining");
        let second = client.register_shuffle(2, 1, 4, 1).await.unwrap();
        let ids: Vec<&str> = second.servers.iter().map(|s| s.server_id.as_str()).collect();
        assert_eq!(ids, [id2.as_str()], "a new shuffle went to the draining server");
        let m = c.call(As::Admin, "DELETE", drain_t, &drain1, "", 200).await;
        assert_eq!(m["state"], "live");
        for _ in 0..100 {
            let ready = srv.anonymous.call("GET".parse().unwrap(), "/readyz", Bytes::new());
            if ready.await.expect("readyz").status == 200 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(srv.get("/readyz", "/readyz", 200).await["status"], "ok");
        let e = c.call(As::Admin, "DELETE", drain_t, "/api/v1/servers/nope/drain", "", 404).await;
        assert_eq!(e["code"], "unknown_server");
        c.call(As::Admin, "DELETE", drain_t, &drain1, "[1, 2]", 400).await;

        // Server: its status, disks and its own drain switch.
        let st = srv.get("/api/v1/status", "/api/v1/status", 200).await;
        assert_eq!(st["server_id"], id1.as_str());
        assert_eq!(st["address"], id1.as_str());
        assert_eq!((st["serving"].as_bool(), st["draining"].as_bool()), (Some(true), Some(false)));
        let held = st["apps"].as_array().unwrap().iter().find(|a| a["app_id"] == APP).cloned();
        let sh = held.expect("the application on the server")["shuffles"][0].clone();
        assert_eq!((sh["shuffle_id"].as_u64(), sh["state"].as_str()), (Some(1), Some("readable")));
        assert_eq!(sh["maps_ended"], 2);
        assert!(sh["stored_bytes"].as_u64() > Some(0), "{st:#}");
        assert!(st["counters"]["pushed_bytes"].as_u64() > Some(0), "{st:#}");
        let disks = srv.get("/api/v1/disks", "/api/v1/disks", 200).await;
        assert_eq!(disks["disks"][0]["state"], "in_service");
        assert!(disks["disks"][0]["capacity_bytes"].as_u64() > Some(0));
        let d = "/api/v1/drain";
        srv.call(As::Anonymous, "POST", d, d, "", 401).await;
        srv.call(As::WrongToken, "DELETE", d, d, "", 401).await;
        srv.call(As::WrongToken, "POST", "/api/v1/undrain", "/api/v1/undrain", "", 401).await;
        srv.call(As::Admin, "POST", d, d, "\u{1}garbage", 400).await;
        srv.call(As::Admin, "DELETE", d, d, r#"{"unknown": 1}"#, 400).await;
        srv.call(As::Admin, "POST", "/api/v1/undrain", "/api/v1/undrain", "null x", 400).await;
        let on = srv.call(As::Admin, "POST", d, d, "", 200).await;
        assert_eq!((on["draining"].as_bool(), on["shuffles_held"].as_u64()), (Some(true), Some(1)));
        assert_eq!(srv.call(As::Admin, "POST", d, d, "", 200).await["draining"], true);
        assert_eq!(srv.get("/readyz", "/readyz", 503).await["status"], "draining");
        assert_eq!(srv.call(As::Admin, "DELETE", d, d, "", 200).await["draining"], false);
        srv.call(As::Admin, "POST", d, d, "", 200).await;
        let off = srv.call(As::Admin, "POST", "/api/v1/undrain", "/api/v1/undrain", "", 200);
        assert_eq!(off.await["draining"], false);
        assert_eq!(srv.get("/readyz", "/readyz", 200).await["status"], "ok");

        // Paths and methods no endpoint takes.
        c.error("GET", "/api/v1/nope", 404, "not_found").await;
        c.error("GET", "/api/v2/servers", 404, "not_found").await;
        srv.error("GET", "/api/v1/servers", 404, "not_found").await;
        c.error("GET", "/api/v1/status", 404, "not_found").await;
        c.error("PUT", "/api/v1/servers", 405, "method_not_allowed").await;
        c.error("GET", &drain1, 405, "method_not_allowed").await;
        c.error("DELETE", "/api/v1/apps", 405, "method_not_allowed").await;
        srv.error("POST", "/api/v1/status", 405, "method_not_allowed").await;
        srv.error("POST", "/metrics", 405, "method_not_allowed").await;

        // Forget the application on the coordinator.
        let un_t = "/api/v1/apps/{app}/unregister";
        let un = format!("/api/v1/apps/{APP}/unregister");
        c.call(As::Anonymous, "POST", un_t, &un, "", 401).await;
        c.call(As::Admin, "POST", un_t, &un, "{", 400).await;
        c.call(As::Admin, "POST", un_t, "/api/v1/apps/nope/unregister", "", 404).await;
        assert_eq!(c.call(As::Admin, "POST", un_t, &un, "", 200).await["app_id"], APP);
        let apps = c.get("/api/v1/apps", "/api/v1/apps", 200).await;
        assert!(apps["apps"].as_array().unwrap().iter().all(|a| a["app_id"] != APP));
        c.get(shuffles_t, &format!("/api/v1/apps/{APP}/shuffles"), 404).await;

        let left = api.not_called();
        assert!(left.is_empty(), "documented endpoints this test did not call: {left:?}");
    })
    .await
}
