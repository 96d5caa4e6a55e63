//! A server SIGKILLed under a writer or a reader: the client's next call fails within a bounded
//! time instead of hanging.

mod utils;

use std::time::{Duration, Instant};

use utils::*;

/// Longest a client may take to notice the dead server.
const NOTICE: Duration = Duration::from_secs(15);

/// Pushes 256 KiB batches (small pauses) for 400 ms, SIGKILLs the server, keeps pushing until
/// the writer reports an error, and returns how long after the kill that took (panics if it
/// never comes within `NOTICE` + 5 s).
async fn push_until_the_writer_notices(
    opts: impl FnOnce(&mut sluice_client::ClientOptions),
) -> Duration {
    let scratch = Scratch::new();
    let mut server = scratch.server(&ServerSpec::default());
    let client = client_with("crash-push", None, opts);
    let a = assignment(1, &[server.addr], 4);
    register_direct(&client, &a, 1).await.unwrap();

    let mut w = client.writer(a.clone(), 0, 0).await.unwrap();
    // Push for a while so the pipeline is full, then kill the server.
    let mut seq = 0u32;
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(400) {
        w.add_batch(seq % 4, &framed(&[record(0, 0, seq, 256 << 10)])).await.unwrap();
        seq += 1;
        if seq & 7 == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    assert!(seq > 8, "pushed only {seq} batches before the kill");
    server.kill();
    let killed = Instant::now();

    // Keep pushing (small pauses) until the writer reports the failure, then finish.
    let failed = async {
        loop {
            let r = w.add_batch(seq % 4, &framed(&[record(0, 0, seq, 256 << 10)])).await;
            seq += 1;
            if let Err(e) = r {
                return e;
            }
            if killed.elapsed() > NOTICE {
                // Not noticed while pushing: finishing must fail.
                return w.finish().await.expect_err("finish after the server died");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    let e = match tokio::time::timeout(NOTICE + Duration::from_secs(5), failed).await {
        Ok(e) => e,
        Err(_) => panic!(
            "the writer reported nothing for {:?} after the server was killed ({seq} batches written)",
            killed.elapsed()
        ),
    };
    let took = killed.elapsed();
    eprintln!("writer failed {took:?} after the kill: {e}");
    took
}

/// With a small push pipeline (2 MiB in flight: 8 pushes) and short reconnect back-offs the
/// failure surfaces quickly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writer_fails_promptly_when_the_server_dies_mid_push() {
    bounded("writer_fails_promptly_when_the_server_dies_mid_push", 30, async {
        let took = push_until_the_writer_notices(|o| o.max_inflight_bytes = 2 << 20).await;
        assert!(took < NOTICE, "noticed only after {took:?}");
    })
    .await
}

/// The same with the default client options (64 MiB in flight, reconnect back-off up to 10 s).
///
/// Fails today: every in-flight push task retries through `Pool::get`, which sleeps out the
/// slot's reconnect back-off *while holding the slot's mutex*; the back-off doubles with every
/// failed connect of any caller (capped at 10 s), so the ~256 queued tasks serialize behind
/// each other's back-offs. The writer only sees an error once a task has used up its
/// `error_max_retries` (add_batch waits for in-flight permits, finish joins every task), i.e.
/// after roughly (tasks per slot) × 10 s — measured: no error after 100 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writer_with_default_options_fails_promptly_when_the_server_dies() {
    bounded("writer_with_default_options_fails_promptly_when_the_server_dies", 30, async {
        let took = push_until_the_writer_notices(|o| {
            o.transport = sluice_transport::ClientConfig::default();
        })
        .await;
        assert!(took < NOTICE, "noticed only after {took:?}");
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finish_fails_promptly_when_the_server_dies_before_mapper_end() {
    bounded("finish_fails_promptly_when_the_server_dies_before_mapper_end", 30, async {
        let scratch = Scratch::new();
        let mut server = scratch.server(&ServerSpec::default());
        let client = client("crash-finish", None);
        let a = assignment(1, &[server.addr], 2);
        register_direct(&client, &a, 1).await.unwrap();
        let mut w = client.writer(a.clone(), 0, 0).await.unwrap();
        for seq in 0..50 {
            // Small records stay in the writer until finish.
            w.write_record(seq % 2, &record(0, 0, seq, 100)).await.unwrap();
        }
        server.kill();
        let killed = Instant::now();
        let r = tokio::time::timeout(NOTICE, w.finish()).await;
        match r {
            Ok(Err(e)) => eprintln!("finish failed {:?} after the kill: {e}", killed.elapsed()),
            Ok(Ok(b)) => panic!("finish succeeded against a dead server: {b:?}"),
            Err(_) => panic!("finish hung for {NOTICE:?} after the server was killed"),
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reader_fails_promptly_when_the_server_dies_mid_fetch() {
    bounded("reader_fails_promptly_when_the_server_dies_mid_fetch", 30, async {
        let scratch = Scratch::new();
        // 256 KiB chunks: a 32 MiB partition is 128 chunks, far more than the prefetch depth.
        let mut server = scratch
            .server(&ServerSpec { sets: vec!["chunk_bytes=262144".into()], ..Default::default() });
        let client = client_with("crash-fetch", None, |o| o.fetch_prefetch_chunks = 2);
        let a = assignment(1, &[server.addr], 1);
        register_direct(&client, &a, 1).await.unwrap();
        let mut w = client.writer(a.clone(), 0, 0).await.unwrap();
        for seq in 0..128u32 {
            w.add_batch(0, &framed(&[record(0, 0, seq, 256 << 10)])).await.unwrap();
        }
        w.finish().await.unwrap();
        client.commit_shuffle(&a).await.unwrap();

        let mut r = client.reader(&a, 0, 0, 1).await.unwrap();
        for _ in 0..4 {
            let b = r.next_batch().await.expect("first batches").expect("more batches");
            assert_eq!(parse_records(&b).len(), 1);
        }
        server.kill();
        let killed = Instant::now();
        let drained = async {
            let mut got = 4;
            loop {
                match r.next_batch().await {
                    Ok(Some(_)) => got += 1,
                    Ok(None) => return Ok(got),
                    Err(e) => return Err(e),
                }
            }
        };
        match tokio::time::timeout(NOTICE, drained).await {
            Ok(Err(e)) => {
                eprintln!("reader failed {:?} after the kill: {e}", killed.elapsed());
            }
            Ok(Ok(n)) => panic!("the reader ended cleanly with {n} of 128 batches after a kill"),
            Err(_) => panic!("the reader hung for {NOTICE:?} after the server was killed"),
        }
    })
    .await
}
