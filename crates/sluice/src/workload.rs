//! The synthetic shuffle of `sluice local` and the end-to-end benchmarks.
//!
//! M map tasks push random records to P partitions; the records of map `m` are a deterministic
//! function of `(m, salt)`, so a retried or speculative attempt that must win pushes exactly the
//! same records, and a failed attempt pushes *different* ones (salt ≠ 0) — counting them would
//! break the checksums. Each partition's expected record count and checksum (the sum of the
//! records' CRC32Cs) are computed from the same generator before the push, and compared with
//! what the reducers read back.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context};
use indicatif::ProgressBar;
use sluice_client::ShuffleClient;
use sluice_proto::message::Assignment;

/// Per-partition record count and checksum.
#[derive(Default)]
pub struct Tally {
    pub count: Vec<AtomicU64>,
    pub sum: Vec<AtomicU64>,
}

impl Tally {
    pub fn new(partitions: u32) -> Arc<Tally> {
        Arc::new(Tally {
            count: (0..partitions).map(|_| AtomicU64::new(0)).collect(),
            sum: (0..partitions).map(|_| AtomicU64::new(0)).collect(),
        })
    }
}

/// A record's part of its partition's checksum: XXH3-64 of its bytes, summed per partition so the
/// order of arrival does not matter. The readers hash every record they get inside the timed
/// fetch; XXH3 takes 5.6 ns for a 100-byte record where CRC32C took 10.1 (`cargo run --release
/// -p sluice --example hash_speed`). The batches' own CRC32C, which the reader checks, already
/// guards the bytes; this tally checks that every record came back once, in its partition.
fn record_hash(rec: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(rec)
}

/// xorshift64*: fast deterministic bytes; quality is irrelevant, speed and repeatability matter.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// The next value in `0..n`: the high word of a 64×64-bit product, where `%` would cost a
    /// division (tens of cycles, twice per record).
    fn below(&mut self, n: u64) -> u64 {
        below(self.next(), n)
    }
}

/// `x` mapped onto `0..n` by multiplication (Lemire's reduction).
fn below(x: u64, n: u64) -> u64 {
    ((x as u128 * n as u128) >> 64) as u64
}

/// Bytes of the shared random pool: larger than the largest record (`sluice local` takes up to
/// 64 KiB), small enough to stay in the CPU's cache. A 1 MiB pool made the generator's reads miss
/// the cache: `sluice local --bytes 2G` spent 0.91–0.94 client CPU s/GB against 0.66–0.76 with
/// this size (docs/benchmarks-log.md#generator-pool), CPU that a map task's own output, freshly
/// made, does not cost.
const POOL_BYTES: usize = 128 << 10;

/// Random bytes shared by all generators (records take slices of it).
fn random_pool() -> &'static [u8] {
    static POOL: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    POOL.get_or_init(|| {
        let mut r = Rng(0x0123_4567_89AB_CDEF);
        (0..POOL_BYTES / 8).flat_map(|_| r.next().to_le_bytes()).collect()
    })
}

/// One map attempt to run.
#[derive(Clone, Copy)]
pub struct MapRun {
    pub map_id: u32,
    pub attempt_id: u32,
    /// 0 for the map's real records; anything else makes different records.
    pub salt: u64,
    /// Fraction of the records to push (a failing attempt stops part-way).
    pub fraction: f64,
    /// Whether this attempt finishes (sends MapperEnd).
    pub finish: bool,
    /// Whether its records count in the expected tally.
    pub counts: bool,
}

/// The records of one map attempt, in push order: a deterministic function of the attempt's
/// map id and salt, so the expected tally can be computed apart from the push.
struct Records {
    rng: Rng,
    pool: &'static [u8],
    rec_len: usize,
    left: u64,
    partitions: u64,
}

/// One generated record: a unique 8-byte word, then a slice of the shared random pool.
struct Record {
    word: [u8; 8],
    rest: &'static [u8],
}

impl Record {
    fn len(&self) -> usize {
        8 + self.rest.len()
    }

    /// The record's bytes, in order (for a writer that takes a record in parts).
    fn parts(&self) -> [&[u8]; 2] {
        [&self.word, self.rest]
    }

    /// `record_hash` of the whole record, assembled in `scratch`.
    fn hash(&self, scratch: &mut Vec<u8>) -> u64 {
        scratch.clear();
        scratch.extend_from_slice(&self.word);
        scratch.extend_from_slice(self.rest);
        record_hash(scratch)
    }
}

impl Records {
    fn new(run: &MapRun, bytes_per_map: u64, record_bytes: usize, partitions: u64) -> Records {
        let rec_len = record_bytes.max(16);
        Records {
            rng: Rng((run.map_id as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
                ^ run.salt.wrapping_mul(0xD1B5_4A32_D192_ED03)
                | 1),
            pool: random_pool(),
            rec_len,
            left: ((bytes_per_map / rec_len as u64) as f64 * run.fraction) as u64,
            partitions,
        }
    }

    /// The next record and its partition.
    fn next(&mut self) -> Option<(u32, Record)> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        // A unique 8-byte word from the attempt's generator, then a slice of a shared random
        // pool chosen by it: one generator call per record instead of one per 8 bytes, and no
        // copy: the writer takes the two parts as they are.
        let word = self.rng.next();
        let off = below(word, (self.pool.len() - self.rec_len) as u64) as usize;
        let rest = &self.pool[off..off + self.rec_len - 8];
        let p = self.rng.below(self.partitions) as u32;
        Some((p, Record { word: word.to_le_bytes(), rest }))
    }
}

/// The count and checksum per partition of every record the winning attempts push, from the
/// same generator the maps use, on one thread per core. `sluice local` runs this before the
/// push, so the push is timed without the tally's hashing.
pub fn expected_tally(
    runs: &[MapRun],
    bytes_per_map: u64,
    record_bytes: usize,
    partitions: u32,
) -> Arc<Tally> {
    let tally = Tally::new(partitions);
    let counting: Vec<MapRun> = runs.iter().copied().filter(|r| r.counts).collect();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(counting.len());
    std::thread::scope(|s| {
        for t in 0..threads {
            let (tally, counting) = (&tally, &counting);
            s.spawn(move || {
                for run in counting.iter().skip(t).step_by(threads) {
                    let mut gen = Records::new(run, bytes_per_map, record_bytes, partitions as u64);
                    // Tallied per map and merged once: shared atomics per record would bounce
                    // cache lines between the cores millions of times.
                    let n = partitions as usize;
                    let (mut count, mut sum) = (vec![0u64; n], vec![0u64; n]);
                    let mut scratch = Vec::with_capacity(record_bytes.max(16));
                    while let Some((p, rec)) = gen.next() {
                        count[p as usize] += 1;
                        sum[p as usize] = sum[p as usize].wrapping_add(rec.hash(&mut scratch));
                    }
                    for p in 0..n {
                        tally.count[p].fetch_add(count[p], Ordering::Relaxed);
                        tally.sum[p].fetch_add(sum[p], Ordering::Relaxed);
                    }
                }
            });
        }
    });
    tally
}

/// Pushes one map attempt's records; returns the record bytes pushed.
pub async fn run_map(
    client: &ShuffleClient,
    a: Arc<Assignment>,
    run: MapRun,
    bytes_per_map: u64,
    record_bytes: usize,
    progress: &ProgressBar,
) -> anyhow::Result<u64> {
    let partitions = a.partitions.len() as u64;
    let mut w = client.writer(a, run.map_id, run.attempt_id).await?;
    let mut gen = Records::new(&run, bytes_per_map, record_bytes, partitions);
    let mut pushed = 0u64;
    while let Some((p, rec)) = gen.next() {
        w.write_record_parts(p, &rec.parts()).await?;
        pushed += rec.len() as u64;
        if pushed % (1 << 20) < rec.len() as u64 {
            progress.inc(1 << 20);
        }
    }
    if run.finish {
        w.finish()
            .await
            .with_context(|| format!("map {} attempt {}", run.map_id, run.attempt_id))?;
    }
    Ok(pushed)
}

/// The map attempts of a run: a failed-then-retried map 0, a speculative pair for map 1.
pub fn map_runs(maps: u32) -> Vec<MapRun> {
    let full = |map_id, attempt_id| MapRun {
        map_id,
        attempt_id,
        salt: 0,
        fraction: 1.0,
        finish: true,
        counts: attempt_id == 0,
    };
    let mut runs = Vec::new();
    for m in 0..maps {
        match m {
            // The first attempt dies half-way with different records; the retry wins.
            0 => {
                runs.push(MapRun {
                    map_id: 0,
                    attempt_id: 0,
                    salt: 7,
                    fraction: 0.5,
                    finish: false,
                    counts: false,
                });
                runs.push(MapRun { attempt_id: 1, counts: true, ..full(0, 1) });
            }
            // Speculation: two attempts push the same records and both finish; one wins.
            1 => {
                runs.push(full(1, 0));
                runs.push(MapRun { counts: false, ..full(1, 1) });
            }
            _ => runs.push(full(m, 0)),
        }
    }
    runs
}

/// Reads every partition back (`concurrency` at a time) and tallies its records. Each reader is
/// its own task, so decoding and checking records runs on every core of the runtime.
pub async fn read_all(
    client: &ShuffleClient,
    a: &Arc<Assignment>,
    maps: u32,
    concurrency: usize,
    got: &Arc<Tally>,
    progress: &ProgressBar,
) -> anyhow::Result<u64> {
    let parts = a.partitions.len() as u32;
    let next = Arc::new(AtomicU64::new(0));
    let workers = (0..concurrency.max(1)).map(|_| {
        let (client, a, got, progress, next) =
            (client.clone(), a.clone(), got.clone(), progress.clone(), next.clone());
        tokio::spawn(async move {
            let mut bytes = 0u64;
            loop {
                let p = next.fetch_add(1, Ordering::Relaxed) as u32;
                if p >= parts {
                    return Ok::<_, anyhow::Error>(bytes);
                }
                let n = read_partition(&client, &a, p, maps, &got, &progress).await?;
                bytes += n;
            }
        })
    });
    let mut total = 0;
    for w in futures_util::future::join_all(workers).await {
        total += w.context("reader task panicked")??;
    }
    Ok(total)
}

/// Reads one partition, checks each record and adds them to `got`; returns payload bytes.
async fn read_partition(
    client: &ShuffleClient,
    a: &Assignment,
    p: u32,
    maps: u32,
    got: &Tally,
    progress: &ProgressBar,
) -> anyhow::Result<u64> {
    let mut r =
        client.reader(a, p, 0, maps).await.with_context(|| format!("opening partition {p}"))?;
    let (mut count, mut sum, mut bytes) = (0u64, 0u64, 0u64);
    while let Some(batch) =
        r.next_batch().await.with_context(|| format!("reading partition {p}"))?
    {
        let mut b = &batch[..];
        while b.len() >= 4 {
            let len = u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize;
            if b.len() < 4 + len {
                bail!("partition {p}: record runs past its batch");
            }
            sum = sum.wrapping_add(record_hash(&b[4..4 + len]));
            count += 1;
            b = &b[4 + len..];
        }
        bytes += batch.len() as u64;
        progress.inc(batch.len() as u64);
    }
    got.count[p as usize].fetch_add(count, Ordering::Relaxed);
    got.sum[p as usize].fetch_add(sum, Ordering::Relaxed);
    Ok(bytes)
}

/// Partitions whose count or checksum differ.
pub fn mismatches(expect: &Tally, got: &Tally) -> Vec<u32> {
    (0..expect.count.len())
        .filter(|&p| {
            expect.count[p].load(Ordering::Relaxed) != got.count[p].load(Ordering::Relaxed)
                || expect.sum[p].load(Ordering::Relaxed) != got.sum[p].load(Ordering::Relaxed)
        })
        .map(|p| p as u32)
        .collect()
}

/// Seconds since `t`, never zero.
pub fn secs(t: Instant) -> f64 {
    t.elapsed().as_secs_f64().max(1e-9)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_records_hash_is_that_of_its_bytes_and_partitions_stay_in_range() {
        let run = map_runs(4)[3];
        let mut gen = Records::new(&run, 1 << 20, 100, 7);
        let mut seen = [0u32; 7];
        let mut n = 0;
        while let Some((p, rec)) = gen.next() {
            let bytes = rec.parts().concat();
            assert_eq!(bytes.len(), 100);
            assert_eq!(rec.hash(&mut Vec::new()), xxhash_rust::xxh3::xxh3_64(&bytes));
            seen[p as usize] += 1;
            n += 1;
        }
        assert_eq!(n, (1 << 20) / 100);
        // Every partition gets records, none far from its share.
        for c in seen {
            assert!((c as f64 - n as f64 / 7.0).abs() < n as f64 / 7.0 * 0.1, "{seen:?}");
        }
        assert_eq!(below(u64::MAX, 10), 9);
        assert_eq!(below(0, 10), 0);
    }

    #[test]
    fn the_largest_records_fit_the_pool_and_differ() {
        let run = map_runs(2)[0];
        let mut gen = Records::new(&run, 64 << 20, 65536, 3);
        let want = gen.left;
        assert!(want >= 512, "{want}");
        let (mut hashes, mut scratch) = (std::collections::HashSet::new(), Vec::new());
        while let Some((_, rec)) = gen.next() {
            assert_eq!(rec.len(), 65536);
            assert!(hashes.insert(rec.hash(&mut scratch)), "two records alike");
        }
        assert_eq!(hashes.len() as u64, want);
    }
}
