//! The wire codec's hot paths, each beside a baseline in the same run:
//!
//! - `push_frame/parse`: a server taking a 1 MiB `PushMerged` frame off its read buffer (header
//!   check, fields decode, section bounds; the body is sliced, not copied), against
//!   `push_frame/copy`: copying the frame's bytes once into a reused buffer, the least any receive
//!   path pays per frame (the socket read);
//! - `push_frame/encode_head`: a client writing that frame's header and fields;
//! - `chunk/validate`: walking a 4 MiB chunk of 64 KiB batches and checking every CRC32C (what a
//!   reader does to each fetched chunk), against `chunk/copy`, a copy of the same 4 MiB into a
//!   reused buffer.
//!
//! Run: `cargo bench -p sluice-proto --bench codec` (criterion prints time and GiB/s per case).

use bytes::BytesMut;
use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use sluice_proto::batch::{put_batch, validate_batches};
use sluice_proto::message::{PushMerged, Section};
use sluice_proto::{encode_head, parse, Message};

const PUSH_BYTES: usize = 1 << 20;
const CHUNK_BYTES: usize = 4 << 20;
const BATCH_BYTES: usize = 64 << 10;

/// `count` batches of `payload_len` bytes each, as a writer lays them out.
fn batches(count: usize, payload_len: usize) -> Vec<u8> {
    let payload: Vec<u8> = (0..payload_len).map(|i| (i * 31 % 251) as u8).collect();
    let mut out = BytesMut::new();
    for b in 0..count {
        put_batch(&mut out, 7, 0, b as u32, &payload);
    }
    out.to_vec()
}

fn push_frame(c: &mut Criterion) {
    let sections = 8;
    let body = batches(sections, PUSH_BYTES / sections - 20);
    let per = body.len() / sections;
    let message = Message::PushMerged(PushMerged {
        app_id: "app-20261122-0001".into(),
        shuffle_id: 3,
        entries: (0..sections)
            .map(|s| Section {
                partition_id: s as u32,
                offset: (s * per) as u32,
                length: per as u32,
            })
            .collect(),
    });
    let mut frame = BytesMut::new();
    encode_head(1, &message, body.len() as u64, u32::MAX, &mut frame).expect("encodes");
    frame.extend_from_slice(&body);
    let frame = frame.freeze();

    let mut g = c.benchmark_group("push_frame");
    g.throughput(Throughput::Bytes(frame.len() as u64));
    g.bench_function("parse", |b| {
        b.iter_batched(
            || BytesMut::from(&frame[..]),
            |mut buf| black_box(parse(&mut buf, u32::MAX).expect("valid").expect("whole")),
            criterion::BatchSize::LargeInput,
        )
    });
    g.bench_function("copy", |b| {
        let mut out = vec![0u8; frame.len()];
        b.iter(|| {
            out.copy_from_slice(black_box(&frame[..]));
            black_box(out[0])
        })
    });
    g.bench_function("encode_head", |b| {
        let mut out = BytesMut::with_capacity(256);
        b.iter(|| {
            out.clear();
            encode_head(2, black_box(&message), body.len() as u64, u32::MAX, &mut out)
                .expect("encodes");
            black_box(out.len())
        })
    });
    g.finish();
}

fn chunk(c: &mut Criterion) {
    let chunk = batches(CHUNK_BYTES / BATCH_BYTES, BATCH_BYTES - 20);
    let mut g = c.benchmark_group("chunk");
    g.throughput(Throughput::Bytes(chunk.len() as u64));
    g.bench_function("validate", |b| {
        b.iter(|| {
            let mut n = 0;
            validate_batches(black_box(&chunk), |_| n += 1).expect("valid");
            n
        })
    });
    g.bench_function("copy", |b| {
        let mut out = vec![0u8; chunk.len()];
        b.iter(|| {
            out.copy_from_slice(black_box(&chunk[..]));
            black_box(out[0])
        })
    });
    g.finish();
}

criterion_group!(benches, push_frame, chunk);
criterion_main!(benches);
