//! Checksum and hash speeds behind docs/benchmarks-log.md#crc-fast ("Batch CRC32C with crc-fast"):
//! `cargo run --release -p sluice --example hash_speed`. Loops over an 8 MiB buffer (in cache).
use std::time::Instant;

fn rate(len: usize, f: impl Fn(&[u8]) -> u64) -> (f64, f64) {
    let buf: Vec<u8> =
        (0..8usize << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let (n, slots) = ((2usize << 30) / len, (8usize << 20) / len);
    let t = Instant::now();
    let mut s = 0u64;
    for i in 0..n {
        let o = (i % slots) * len;
        s = s.wrapping_add(f(&buf[o..o + len]));
    }
    let secs = t.elapsed().as_secs_f64();
    std::hint::black_box(s);
    ((n * len) as f64 / secs / 1e9, secs / n as f64 * 1e9)
}

fn main() {
    for len in [100usize, 4096, 65536, 256 << 10, 1 << 20, 4 << 20] {
        let (a, an) = rate(len, |b| crc32c::crc32c(b) as u64);
        let (c, cn) = rate(len, |b| sluice_proto::batch::crc32c(b) as u64);
        let (x, xn) = rate(len, xxhash_rust::xxh3::xxh3_64);
        println!(
            "{len:>8} bytes: crc32c crate {a:5.1} GB/s ({an:.1} ns), crc-fast {c:5.1} GB/s ({cn:.1} ns), xxh3 {x:5.1} GB/s ({xn:.1} ns)"
        );
    }
}
