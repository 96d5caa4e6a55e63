//! `sluice admin` against a `sluice local --keep` cluster holding a shuffle: each command's
//! JSON output (checked against docs/openapi.yaml) and exit codes, `drain --wait` finishing
//! once the shuffle is gone, and the codes for refusals, usage errors and unreachable
//! addresses.

mod utils;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use utils::openapi::OpenApi;
use utils::*;

const TOKEN: &str = "cli-admin-token-0123456";
const APP: &str = "cli-app";

/// A `sluice local --keep` child: stopped with SIGINT (its own children go with it), killed
/// if it does not stop in time.
struct KeptCluster {
    child: Child,
    coordinator: SocketAddr,
    coordinator_admin: String,
    server_admins: Vec<String>,
    _dir: tempfile::TempDir,
}

impl KeptCluster {
    fn start() -> KeptCluster {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = std::fs::File::create(dir.path().join("local.log")).expect("log file");
        let mut child = Command::new(sluice_bin())
            .args(["local", "--keep", "--no-job", "--json", "--servers", "2"])
            .args(["--memory-budget", "64M", "--admin-token", TOKEN, "--data-root"])
            .arg(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("spawning sluice local --keep");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let line = match rx.recv_timeout(Duration::from_secs(40)) {
            Ok(l) => l,
            Err(e) => {
                let _ = child.kill();
                let log = std::fs::read_to_string(dir.path().join("local.log")).unwrap_or_default();
                panic!("sluice local --keep printed no addresses ({e}); log:\n{log}");
            }
        };
        let v: Value = serde_json::from_str(&line).expect("the addresses line is JSON");
        let c = &v["cluster"]["coordinator"];
        let servers = v["cluster"]["servers"].as_array().expect("servers");
        assert_eq!(servers.len(), 2, "{v}");
        KeptCluster {
            coordinator: c["address"].as_str().unwrap().parse().unwrap(),
            coordinator_admin: c["admin"].as_str().unwrap().to_owned(),
            server_admins: servers.iter().map(|s| s["admin"].as_str().unwrap().into()).collect(),
            child,
            _dir: dir,
        }
    }
}

impl Drop for KeptCluster {
    fn drop(&mut self) {
        let pid = rustix::process::Pid::from_raw(self.child.id() as i32).expect("pid");
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::INT);
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(15) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `sluice admin ARGS` with `env`, bounded; its output whatever the exit code.
fn admin(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(sluice_bin());
    cmd.arg("admin").args(args).stdin(Stdio::null());
    cmd.env_remove("SLUICE_ADMIN_TOKEN").env_remove("SLUICE_COORDINATOR_ADMIN");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn");
    wait_bounded(child, Duration::from_secs(30))
}

fn wait_bounded(mut child: Child, limit: Duration) -> Output {
    let start = Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!("sluice admin did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("output")
}

fn code(o: &Output) -> i32 {
    o.status.code().expect("an exit code")
}

fn json(o: &Output) -> Value {
    assert_eq!(code(o), 0, "stderr: {}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!("not JSON ({e}): {}", String::from_utf8_lossy(&o.stdout));
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sluice_admin_commands_against_a_kept_local_cluster() {
    bounded("sluice_admin_commands_against_a_kept_local_cluster", 120, async {
        let api = OpenApi::load();
        let cluster = tokio::task::spawn_blocking(KeptCluster::start).await.unwrap();
        let c = cluster.coordinator_admin.clone();
        let cc = ["--coordinator", c.as_str()];
        let run = |args: Vec<&str>, env: Vec<(&str, &str)>| {
            let (args, env): (Vec<String>, Vec<(String, String)>) = (
                args.into_iter().map(String::from).collect(),
                env.into_iter().map(|(k, v)| (k.to_owned(), v.to_owned())).collect(),
            );
            tokio::task::spawn_blocking(move || {
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                let env: Vec<(&str, &str)> =
                    env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
                admin(&args, &env)
            })
        };

        // A shuffle held on both servers.
        let client = client(APP, Some(cluster.coordinator));
        client.register_app().await.unwrap();
        let a = client.register_shuffle(3, 2, 4, 1).await.unwrap();
        for w in spawn_writers(&client, &a, 2, 20, 100, |m, seq| (m + seq) % 4) {
            w.await.unwrap().expect("pushes");
        }
        client.commit_shuffle(&a).await.expect("commit");

        // servers: both live; once their status reports arrive, each holds the shuffle.
        let mut servers = Value::Null;
        for _ in 0..100 {
            servers = json(&run([&cc[..], &["servers", "--json"]].concat(), vec![]).await.unwrap());
            let list = servers["servers"].as_array().unwrap();
            if list.len() == 2 && list.iter().all(|s| s["shuffles_held"] == 1) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        api.check_schema("Members", &servers);
        let list = servers["servers"].as_array().unwrap();
        assert!(list.iter().all(|s| s["state"] == "live" && s["shuffles_held"] == 1), "{servers}");
        let id = list[0]["server_id"].as_str().unwrap().to_owned();
        let table = run([&cc[..], &["servers"]].concat(), vec![]).await.unwrap();
        let text = String::from_utf8_lossy(&table.stdout).into_owned();
        assert!(
            text.starts_with("SERVER") && text.contains(&id) && text.contains("live"),
            "{text}"
        );

        // apps and shuffles, the coordinator named by the environment this time.
        let env = vec![("SLUICE_COORDINATOR_ADMIN", c.as_str())];
        let apps = json(&run(vec!["apps", "--json"], env.clone()).await.unwrap());
        api.check_schema("Apps", &apps);
        assert!(apps["apps"].as_array().unwrap().iter().any(|x| x["app_id"] == APP), "{apps}");
        let sh = json(&run(vec!["shuffles", APP, "--json"], env.clone()).await.unwrap());
        api.check_schema("Shuffles", &sh);
        assert_eq!(sh["shuffles"][0]["shuffle_id"], 3);
        assert_eq!(sh["shuffles"][0]["assignment"].as_array().map(Vec::len), Some(4));
        let table = run(vec!["shuffles", APP], env.clone()).await.unwrap();
        assert!(String::from_utf8_lossy(&table.stdout).contains(&id));
        let unknown = run(vec!["shuffles", "no-such-app"], env.clone()).await.unwrap();
        assert_eq!(code(&unknown), 1);
        assert!(String::from_utf8_lossy(&unknown.stderr).contains("unknown_app"));

        // status of one server, at its own admin address.
        let srv = cluster.server_admins[0].as_str();
        let st = json(&run(vec!["status", "--server", srv, "--json"], vec![]).await.unwrap());
        api.check_schema("ServerStatus", &st);
        assert_eq!(st["shuffles_held"], 1);
        // request: any endpoint, its status code on the first line and its body after.
        let out = run(vec!["request", "--server", srv, "GET", "/api/v1/status"], vec![]);
        let out = out.await.unwrap();
        assert_eq!(code(&out), 0);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (status, body) = text.split_once('\n').expect("a status line, then the body");
        assert_eq!(status, "200");
        let body: Value = serde_json::from_str(body).expect("the status as JSON");
        assert_eq!(body["shuffles_held"], 1);
        // A refusal is an answer too (exit 0): the drain without the token is a 401.
        let out = run(vec!["request", "--server", srv, "POST", "/api/v1/drain"], vec![]);
        let out = out.await.unwrap();
        assert_eq!(code(&out), 0);
        assert!(String::from_utf8_lossy(&out.stdout).starts_with("401\n"));
        let bad = run(vec!["request", "--server", srv, "PATCH", "/x"], vec![]).await.unwrap();
        assert_eq!(code(&bad), 2, "an unknown method is a usage error");

        // drain: refused without the token; with it, --wait lasts until the shuffle is gone.
        let refused = run([&cc[..], &["drain", &id]].concat(), vec![]).await.unwrap();
        assert_eq!(code(&refused), 1);
        assert!(String::from_utf8_lossy(&refused.stderr).contains("401"));
        let wrong =
            run([&cc[..], &["--token", "wrong-token-0123456789", "drain", &id]].concat(), vec![]);
        assert_eq!(code(&wrong.await.unwrap()), 1);
        let waiting = run(
            [&cc[..], &["drain", &id, "--wait", "--json", "--wait-timeout-secs", "60"]].concat(),
            vec![("SLUICE_ADMIN_TOKEN", TOKEN)],
        );
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert!(!waiting.is_finished(), "drain --wait returned while the shuffle is held");
        client.unregister_shuffle(&a).await.expect("unregister the shuffle");
        let drained = waiting.await.unwrap();
        let m = json(&drained);
        api.check_schema("Member", &m);
        assert_eq!((m["state"].as_str(), m["shuffles_held"].as_u64()), (Some("draining"), Some(0)));
        let progress = String::from_utf8_lossy(&drained.stderr).into_owned();
        assert!(progress.contains(&format!("draining {id}")), "no progress line: {progress}");
        // A shuffle on the other server: its drain --wait runs out of time (exit code 4).
        let other = other_server(&servers, &id);
        let b = client.register_shuffle(4, 1, 2, 1).await.unwrap();
        assert!(b.servers.iter().all(|s| s.server_id == other), "the drained server got it");
        let mut args = cc.to_vec();
        args.extend(["--token", TOKEN, "drain", other.as_str(), "--wait"]);
        args.extend(["--wait-timeout-secs", "1"]);
        let timed_out = run(args, vec![]).await.unwrap();
        assert_eq!(code(&timed_out), 4, "{}", String::from_utf8_lossy(&timed_out.stderr));
        client.unregister_shuffle(&b).await.expect("unregister");

        // undrain both.
        for s in list {
            let sid = s["server_id"].as_str().unwrap();
            let out =
                run([&cc[..], &["--token", TOKEN, "undrain", sid, "--json"]].concat(), vec![]);
            let m = json(&out.await.unwrap());
            assert_eq!(m["state"], "live", "{m}");
        }
        let unknown = run([&cc[..], &["--token", TOKEN, "undrain", "nope"]].concat(), vec![]);
        assert_eq!(code(&unknown.await.unwrap()), 1);

        // unregister the application: gone from the list; a second time is refused.
        let out = run([&cc[..], &["--token", TOKEN, "unregister", APP, "--json"]].concat(), vec![]);
        assert_eq!(json(&out.await.unwrap())["app_id"], APP);
        let apps = json(&run([&cc[..], &["apps", "--json"]].concat(), vec![]).await.unwrap());
        assert!(apps["apps"].as_array().unwrap().iter().all(|x| x["app_id"] != APP));
        let again = run([&cc[..], &["--token", TOKEN, "unregister", APP]].concat(), vec![]);
        assert_eq!(code(&again.await.unwrap()), 1);

        // Exit codes: 3 unreachable, 2 usage.
        let gone = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().to_string()
        };
        let unreachable = run(vec!["--coordinator", gone.as_str(), "servers"], vec![]).await;
        assert_eq!(code(&unreachable.unwrap()), 3);
        let nobody = run(vec!["request", "--server", gone.as_str(), "GET", "/healthz"], vec![]);
        assert_eq!(code(&nobody.await.unwrap()), 3);
        assert_eq!(code(&run(vec!["servers"], vec![]).await.unwrap()), 2, "no coordinator");
        assert_eq!(code(&run([&cc[..], &["frobnicate"]].concat(), vec![]).await.unwrap()), 2);
        assert_eq!(code(&run([&cc[..], &["drain"]].concat(), vec![]).await.unwrap()), 2);
        let help = run(vec!["--help"], vec![]).await.unwrap();
        assert!(String::from_utf8_lossy(&help.stdout).contains("Exit codes: 0"));
    })
    .await
}

/// The id of the server other than `id`.
fn other_server(servers: &Value, id: &str) -> String {
    let list = servers["servers"].as_array().unwrap();
    list.iter().map(|s| s["server_id"].as_str().unwrap()).find(|s| *s != id).unwrap().to_owned()
}
