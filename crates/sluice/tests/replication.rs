//! Replication 2: every batch goes to a partition's primary and its replica, so losing one server
//! after the commit loses no data — the reader fails over and returns every record exactly once.

mod utils;

use utils::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replicated_shuffle_survives_a_lost_server() {
    bounded("replication", 60, async {
        let scratch = Scratch::new();
        let coord = scratch.coordinator();
        let mut servers: Vec<Proc> =
            (0..2).map(|_| scratch.server(&ServerSpec::with_coordinator(coord.addr))).collect();
        wait_registered(coord.addr, 2, 20).await;
        let client = client("repl", Some(coord.addr));
        client.register_app().await.unwrap();
        let (maps, parts) = (3u32, 6u32);
        let a = client.register_shuffle(1, maps, parts, 2).await.unwrap();
        assert!(a.partitions.iter().all(|l| l.replica != sluice_proto::message::NO_REPLICA));

        let mut sent = 0usize;
        for m in 0..maps {
            let mut w = client.writer(a.clone(), m, 0).await.unwrap();
            for seq in 0..60u32 {
                // Mixed sizes: small batches go out merged, large ones alone.
                let len = if seq % 5 == 0 { 80 << 10 } else { 300 };
                // Every other batch handed over as `Bytes`: its header and payload gathered,
                // the same two pieces sent to both copies.
                let batch = framed(&[record(m, 0, seq, len)]);
                if seq % 2 == 0 {
                    w.add_batch(seq % parts, &batch).await.unwrap();
                } else {
                    w.add_batch_bytes(seq % parts, batch.into()).await.unwrap();
                }
                sent += 1;
            }
            w.finish().await.unwrap();
        }
        let sizes = client.commit_shuffle(&a).await.unwrap();
        assert!(sizes.iter().all(|s| *s > 0), "every partition stored: {sizes:?}");

        let before: Vec<_> = read_every_partition(&client, &a, parts, maps).await;
        assert_eq!(before.iter().map(|r| r.records.len()).sum::<usize>(), sent);

        // Lose the primary of partition 0 and read everything again.
        let primary = addrs_of(&a)[a.partitions[0].primary as usize];
        servers.iter_mut().find(|s| s.addr == primary).unwrap().kill();
        let after = read_every_partition(&client, &a, parts, maps).await;
        for (p, (b, f)) in before.iter().zip(&after).enumerate() {
            assert_eq!(b.ids(), f.ids(), "partition {p} after losing {primary}");
            assert_eq!(b.tally(), f.tally(), "partition {p} checksums");
        }
    })
    .await;
}

async fn read_every_partition(
    client: &sluice_client::ShuffleClient,
    a: &sluice_proto::message::Assignment,
    parts: u32,
    maps: u32,
) -> Vec<ReadResult> {
    let mut out = Vec::new();
    for p in 0..parts {
        out.push(read_partition(client, a, p, 0, maps).await.unwrap());
    }
    out
}
