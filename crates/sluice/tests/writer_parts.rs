//! `ShuffleWriter::write_record_parts`: a record handed over in pieces (a key and a value, say,
//! or an id and a payload) is read back as one record, the pieces' concatenation, byte for byte,
//! including around batch boundaries and for a record larger than a batch; and
//! `ShuffleWriter::add_batch_bytes`: a ready-made batch handed over as `Bytes` (not copied) reads
//! back as a batch copied in would.

mod utils;

use utils::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_written_in_parts_read_back_whole() {
    bounded("records_written_in_parts_read_back_whole", 30, async {
        let scratch = Scratch::new();
        let server = scratch.server(&ServerSpec::default());
        let client = client_with("parts", None, |o| o.batch_bytes = 64 << 10);
        let a = assignment(1, &[server.addr], 2);
        register_direct(&client, &a, 1).await.unwrap();

        let mut w = client.writer(a.clone(), 0, 0).await.unwrap();
        let mut sent = 0;
        for seq in 0..3000u32 {
            // Sizes from 12 bytes to past the 64 KiB batch (every 500th record).
            let len = if seq % 500 == 499 { 100_000 } else { 12 + (seq as usize * 37) % 900 };
            let rec = record(0, 0, seq, len);
            // Split at two points that move with `seq`: an empty piece now and then, the
            // 12-byte id split across pieces.
            let (i, j) = ((seq as usize * 7) % len, (seq as usize * 13) % len);
            let (i, j) = (i.min(j), i.max(j));
            w.write_record_parts(seq % 2, &[&rec[..i], &rec[i..j], &rec[j..]]).await.unwrap();
            sent += 1;
        }
        w.finish().await.expect("finish");
        client.commit_shuffle(&a).await.expect("commit");

        let mut got = 0;
        for p in 0..2 {
            // parse_records checks every record's bytes against `record(...)`.
            let r = read_partition(&client, &a, p, 0, 1).await.expect("read");
            let ids = r.unique_ids(format!("partition {p}"));
            assert!(ids.iter().all(|id| id.seq % 2 == p), "partition {p}: {ids:?}");
            got += ids.len();
        }
        assert_eq!(got, sent);
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_handed_over_as_bytes_read_back_whole() {
    bounded("batches_handed_over_as_bytes_read_back_whole", 30, async {
        let scratch = Scratch::new();
        let server = scratch.server(&ServerSpec::default());
        let client = client("batch-bytes", None);
        let a = assignment(1, &[server.addr], 3);
        register_direct(&client, &a, 1).await.unwrap();

        let mut w = client.writer(a.clone(), 0, 0).await.unwrap();
        let mut sent = 0;
        for seq in 0..600u32 {
            let p = seq % 3;
            // Large batches go out alone (header and payload gathered), small ones merged; an
            // empty one now and then; records written one by one on the same partitions between
            // them, so an open batch is sealed before each handed-over one.
            match seq % 4 {
                0 => {
                    let len = if seq % 8 == 0 { 100_000 } else { 70_000 };
                    let batch = framed(&[record(0, 0, seq, len), record(0, 0, seq + 10_000, 40)]);
                    w.add_batch_bytes(p, batch.into()).await.unwrap();
                    sent += 2;
                }
                1 => {
                    let batch = framed(&[record(0, 0, seq, 12 + seq as usize % 500)]);
                    w.add_batch_bytes(p, batch.into()).await.unwrap();
                    sent += 1;
                }
                2 => w.add_batch_bytes(p, bytes::Bytes::new()).await.unwrap(),
                _ => {
                    w.write_record(p, &record(0, 0, seq, 200)).await.unwrap();
                    sent += 1;
                }
            }
        }
        w.finish().await.expect("finish");
        client.commit_shuffle(&a).await.expect("commit");

        let mut got = 0;
        for p in 0..3 {
            // parse_records checks every record's bytes against `record(...)`.
            let r = read_partition(&client, &a, p, 0, 1).await.expect("read");
            let ids = r.unique_ids(format!("partition {p}"));
            assert!(ids.iter().all(|id| id.seq % 10_000 % 3 == p), "partition {p}: {ids:?}");
            got += ids.len();
        }
        assert_eq!(got, sent);
    })
    .await
}
