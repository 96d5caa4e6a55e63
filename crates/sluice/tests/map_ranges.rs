//! AQE-style map sub-range reads: `[0,3)` and `[3,8)` partition the full `[0,8)` read exactly,
//! a sub-range stream serves fewer chunks when the maps were flushed into different chunks, and
//! of a chunk shared with other maps only its own maps' bytes.

mod utils;

use utils::*;

const MAPS: u32 = 8;
const PARTS: u32 = 4;

/// Chunks a stream over `[start, end)` of partition `p` would serve, and their bytes.
async fn chunk_count(
    client: &sluice_client::ShuffleClient,
    addr: std::net::SocketAddr,
    p: u32,
    start: u32,
    end: u32,
) -> (usize, u64) {
    let h = stream_handle(client, addr, p, (start, end), vec![]).await.expect("OpenStream");
    for c in &h.committed {
        assert!((start..end).contains(&c.map_id), "committed map outside the range: {c:?}");
    }
    (h.chunk_lengths.len(), h.chunk_lengths.iter().map(|&l| l as u64).sum())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn map_sub_ranges_partition_the_full_read() {
    bounded("map_sub_ranges_partition_the_full_read", 30, async {
        let scratch = Scratch::new();
        let server = scratch
            .server(&ServerSpec { sets: vec!["chunk_bytes=65536".into()], ..Default::default() });
        let client = client("aqe", None);
        let a = assignment(1, &[server.addr], PARTS);
        register_direct(&client, &a, MAPS).await.unwrap();

        // Maps run one after the other. Each pushes, per partition, one large batch (≥ chunk
        // size: flushed at once into its own chunk, with whatever small batches were waiting)
        // and a few small records (merged, left in the buffer for the next map's chunk).
        for m in 0..MAPS {
            let mut w = client.writer(a.clone(), m, 0).await.unwrap();
            for p in 0..PARTS {
                let big = framed(&[record(m, 0, 1000 + p, 70_000)]);
                w.add_batch(p, &big).await.unwrap();
            }
            for seq in 0..(3 * PARTS) {
                w.write_record(seq % PARTS, &record(m, 0, seq, 100 + m as usize)).await.unwrap();
            }
            w.finish().await.unwrap();
        }
        client.commit_shuffle(&a).await.unwrap();

        for p in 0..PARTS {
            let full = read_partition(&client, &a, p, 0, MAPS).await.expect("full read");
            let low = read_partition(&client, &a, p, 0, 3).await.expect("[0,3)");
            let high = read_partition(&client, &a, p, 3, MAPS).await.expect("[3,8)");
            assert_eq!(
                full.records.len(),
                (MAPS * 4) as usize,
                "partition {p}: 1 big + 3 small per map"
            );
            assert!(low.records.iter().all(|(id, _)| id.map < 3), "partition {p}: [0,3) leaked");
            assert!(high.records.iter().all(|(id, _)| id.map >= 3), "partition {p}: [3,8) leaked");
            let (lc, ls) = low.tally();
            let (hc, hs) = high.tally();
            assert_eq!((lc + hc, ls + hs), full.tally(), "partition {p}: counts and checksums");
            let mut union = [low.ids(), high.ids()].concat();
            union.sort_unstable();
            assert_eq!(union, full.ids(), "partition {p}: sub-ranges vs. full read");
            // Chunks shared across the boundary (map 2's small batches flushed with map 3's
            // large one, when pushes arrive in that order) are sent in part: only the range's
            // batches, so the reader has nothing to filter.
            assert_eq!(low.batches_dropped + high.batches_dropped, 0, "partition {p}: filtered");

            let (n_full, b_full) = chunk_count(&client, server.addr, p, 0, MAPS).await;
            let (n_low, b_low) = chunk_count(&client, server.addr, p, 0, 3).await;
            let (n_high, b_high) = chunk_count(&client, server.addr, p, 3, MAPS).await;
            let (n_none, _) = chunk_count(&client, server.addr, p, 5, 5).await;
            let (n_one, b_one) = chunk_count(&client, server.addr, p, 4, 5).await;
            eprintln!(
                "partition {p}: chunks full {n_full}, [0,3) {n_low}, [3,8) {n_high}; bytes full \
                 {b_full}, [0,3) {b_low}, [3,8) {b_high}, map 4 {b_one} in {n_one} chunks"
            );
            assert_eq!(b_low + b_high, b_full, "partition {p}: sub-ranges' bytes add up");
            // Map 4's batches alone: the large record's, and one holding its 3 small records of
            // 104 bytes (each record framed with its u32 length, each batch with its header).
            let want = (20 + 4 + 70_000) + (20 + 3 * (4 + 104));
            assert!(n_one >= 1, "partition {p}: map 4 in no chunk");
            assert_eq!(b_one, want, "partition {p}: map 4 alone");
            assert!(
                n_full >= MAPS as usize,
                "partition {p}: maps were not flushed apart ({n_full} chunks)"
            );
            assert!(
                n_low < n_full && n_high < n_full,
                "partition {p}: sub-ranges served every chunk"
            );
            assert!(n_low + n_high >= n_full, "partition {p}: a chunk belongs to neither range");
            assert_eq!(n_none, 0, "empty range");
        }
    })
    .await
}
