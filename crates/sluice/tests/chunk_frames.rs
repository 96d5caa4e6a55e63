//! Chunks and frames: a chunk goes out as one frame, so it must never be larger than what a
//! reader can take. A server cuts a chunk before a large section would take a part-filled buffer
//! past `chunk_bytes`, and refuses to open a stream for a reader whose agreed frames are smaller
//! than a chunk, with an error that names the settings (not an internal error on the first fetch).

mod utils;

use utils::*;

const MIB: usize = 1 << 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_record_after_small_ones_is_its_own_chunk_and_small_frames_are_told_why() {
    bounded("chunk frames", 60, async {
        let scratch = Scratch::new();
        let server = scratch
            .server(&ServerSpec { sets: vec![format!("chunk_bytes={MIB}")], ..Default::default() });
        let writer_client = client("cf", None);
        let a = assignment(1, &[server.addr], 1);
        register_direct(&writer_client, &a, 1).await.unwrap();
        let mut w = writer_client.writer(a.clone(), 0, 1).await.unwrap();
        // 900 KB of small records (under the 1 MiB chunk), then one record of 3 MB: without the
        // cut they made one chunk of 3.9 MB.
        let mut want = Vec::new();
        for seq in 0..900 {
            want.push(record(0, 0, seq, 1000));
        }
        want.push(record(0, 0, 900, 3 * MIB));
        for r in &want {
            w.write_record(0, r).await.unwrap();
        }
        w.finish().await.expect("finish");
        writer_client.commit_shuffle(&a).await.expect("commit");

        // Frames of 3.5 MiB take the 3 MB record's chunk, not a 3.9 MB one.
        let reader = client_with("cf", None, |o| o.transport.max_frame_bytes = 7 * MIB as u32 / 2);
        let r = read_partition(&reader, &a, 0, 0, 1).await.expect("read with 3.5 MiB frames");
        let tally = (want.len(), want.iter().map(|r| crc32c::crc32c(r) as u64).sum::<u64>());
        assert_eq!(r.tally(), tally);
        assert_eq!(r.unique_ids("partition 0").len(), want.len());

        // Frames of 1 MiB cannot take the 3 MB chunk: the stream is refused, saying why.
        let small = client_with("cf", None, |o| o.transport.max_frame_bytes = MIB as u32);
        let err = read_partition(&small, &a, 0, 0, 1).await.expect_err("1 MiB frames");
        let text = err.to_string();
        assert!(text.contains("INVALID_REQUEST") && text.contains("chunk_bytes"), "{text}");
    })
    .await;
}
