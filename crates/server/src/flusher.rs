//! Flushers: threads per data directory that append partition buffers to files.
//!
//! File writes block, so they run on plain threads, never on the async workers. Each job writes
//! one chunk at an offset reserved when it was submitted (positional writes let several jobs of
//! one partition run at once), then records the chunk and releases the memory it held. A write
//! error takes the directory out of service and the job is written again on another directory;
//! only when no directory is left is the partition marked lost, so readers get `DATA_LOST`
//! instead of silently missing data.
//!
//! `ENOSPC` is not a broken directory: the directory's recycle pool is deleted and the write
//! tried again; if the pool was empty, the directory is marked full (see `storage`) and the job
//! goes to another directory, or, with none left, waits up to [`FULL_WAIT`] for space to be
//! freed (its memory stays reserved meanwhile, so pushers get `Busy`) before the partition is
//! marked lost.
//!
//! A chunk's batches are written grouped by map attempt (see `shuffle::group_by_attempt`), so a
//! reader of some attempts is served a few byte ranges of it, not all of it.
//!
//! Chunks start at 4 KiB-aligned offsets and each write is padded with zeros to a whole page, so
//! writing into a recycled file (see `storage`) never has the kernel read a partial page first.

use std::io::IoSlice;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};

use crate::shuffle::{group_by_attempt, Buffered, Chunk, OpenFile, Partition, Shuffle};
use crate::storage::{create_file, DataDir, Storage};

/// How long a chunk that no directory has room for waits for space before its partition is
/// marked lost.
pub const FULL_WAIT: Duration = Duration::from_secs(10);

/// Whether `e` says the file system is full.
fn is_nospc(e: &std::io::Error) -> bool {
    e.raw_os_error() == Some(rustix::io::Errno::NOSPC.raw_os_error())
}

/// Takes a directory whose write or create failed with `e` out of use: full (for a while) on
/// `ENOSPC`, out of service on anything else. Returns whether it was a full disk.
fn note_failure(dir: &DataDir, e: &std::io::Error) -> bool {
    if is_nospc(e) {
        dir.mark_full(e);
        true
    } else {
        dir.fail(e);
        false
    }
}

/// Chunks start at multiples of this (the page size).
pub const CHUNK_ALIGN: u64 = 4096;
static ZEROS: [u8; CHUNK_ALIGN as usize] = [0; CHUNK_ALIGN as usize];

/// Bytes a chunk of `len` bytes takes in its file, padding included.
pub fn padded_len(len: u64) -> u64 {
    len.div_ceil(CHUNK_ALIGN) * CHUNK_ALIGN
}

/// One chunk to write.
pub struct FlushJob {
    pub shuffle: Arc<Shuffle>,
    pub partition: u32,
    pub data: Buffered,
    pub target: OpenFile,
    pub offset: u64,
}

/// The flusher threads of all data directories.
pub struct Flushers {
    queues: Vec<Sender<FlushJob>>,
    storage: Arc<Storage>,
    write_bytes: usize,
}

/// Why a buffer could not be handed to a flusher.
#[derive(Debug, thiserror::Error)]
#[error("no data directory can take the partition: {0}")]
pub struct NoStorage(pub String);

impl Flushers {
    /// Starts `per_dir` threads for each directory, each `nice` steps below the server's
    /// priority, each `pwritev` ending at a multiple of `write_bytes` in the file (see
    /// `ServerConfig::flush_write_bytes`). `on_done(bytes)` is called after each job.
    pub fn start(
        storage: Arc<Storage>,
        per_dir: usize,
        nice: i32,
        write_bytes: usize,
        on_done: Arc<dyn Fn(u64) + Send + Sync>,
    ) -> Flushers {
        let mut queues = Vec::new();
        for dir in storage.dirs() {
            let (tx, rx) = crossbeam_channel::unbounded::<FlushJob>();
            for i in 0..per_dir {
                let rx: Receiver<FlushJob> = rx.clone();
                let storage = storage.clone();
                let on_done = on_done.clone();
                std::thread::Builder::new()
                    .name(format!("sluice-flush-{}-{i}", dir.index))
                    .spawn(move || {
                        lower_priority(nice);
                        for job in rx {
                            let bytes = job.data.bytes;
                            run_job(&storage, job, write_bytes);
                            on_done(bytes);
                        }
                    })
                    .expect("spawn flusher thread");
            }
            queues.push(tx);
        }
        Flushers { queues, storage, write_bytes }
    }

    /// Takes the partition's buffer and queues it as one chunk; returns the bytes queued (0 when
    /// the shuffle is deleted: the buffer is dropped). The caller holds the partition lock, so the
    /// offset reservation and the buffer hand-off are atomic.
    pub fn submit(
        &self,
        shuffle: &Arc<Shuffle>,
        partition_id: u32,
        p: &mut Partition,
    ) -> Result<u64, NoStorage> {
        if p.buffer.bytes == 0 {
            return Ok(0);
        }
        if shuffle.deleted.load(Ordering::Acquire) {
            // Pushed just before the shuffle was deleted: nothing may create its files again
            // (its current file went to the recycle pool). The buffer and its memory go.
            drop(std::mem::take(&mut p.buffer));
            return Ok(0);
        }
        // A partition whose file is on a full directory moves to one in service, if any; with
        // none, accepted data still goes to its file (the reserve is there for it, and the
        // flusher waits for space on `ENOSPC`).
        let target = match &p.file {
            Some(f) if f.dir.in_service() => f.clone(),
            Some(f) if !f.dir.is_failed() && !self.storage.has_healthy() => f.clone(),
            _ => open_next_file(&self.storage, shuffle, partition_id, p, None)
                .map_err(|e| NoStorage(e.to_string()))?,
        };
        let data = std::mem::take(&mut p.buffer);
        let bytes = data.bytes;
        let offset = p.next_offset;
        p.next_offset += padded_len(bytes);
        shuffle.inflight_flushes.fetch_add(1, Ordering::AcqRel);
        let job =
            FlushJob { shuffle: shuffle.clone(), partition: partition_id, data, target, offset };
        if let Err(e) = self.queues[job.target.dir.index].send(job) {
            // Only when the threads are gone (shutdown): write inline rather than lose it.
            run_job(&self.storage, e.into_inner(), self.write_bytes);
        }
        Ok(bytes)
    }
}

/// Adds `nice` to the calling thread's nice value (on Linux, priority is per thread).
fn lower_priority(nice: i32) {
    if nice == 0 {
        return;
    }
    let tid = rustix::thread::gettid();
    let now = rustix::process::getpriority_process(Some(tid)).unwrap_or(0);
    if let Err(e) = rustix::process::setpriority_process(Some(tid), (now + nice).min(19)) {
        tracing::warn!(error = %e, "cannot lower the flusher thread's priority");
    }
}

/// Opens the partition's next file on the healthiest directory other than `avoid`.
fn open_next_file(
    storage: &Storage,
    shuffle: &Shuffle,
    partition_id: u32,
    p: &mut Partition,
    avoid: Option<usize>,
) -> std::io::Result<OpenFile> {
    loop {
        let Some(dir) = storage.choose(avoid) else {
            return Err(std::io::Error::other(storage.unavailable_reason()));
        };
        let path = shuffle.file_path(&dir, partition_id, p.files_created);
        let opened = match dir.take_recycled(&path) {
            Some(file) => Ok(file),
            None => create_file(&path).map(Arc::new),
        };
        match opened {
            Ok(file) => {
                p.files_created += 1;
                let f = OpenFile { file, dir, path };
                p.file = Some(f.clone());
                p.next_offset = 0;
                return Ok(f);
            }
            Err(e) => {
                note_failure(&dir, &e);
            }
        }
    }
}

fn run_job(storage: &Storage, mut job: FlushJob, write_bytes: usize) {
    let shuffle = job.shuffle.clone();
    let runs = std::mem::take(&mut job.data.runs);
    let mut runs = group_by_attempt(&mut job.data.slices, &runs);
    // The page padding goes out as one more slice (`bytes` keeps the chunk's own length).
    let pad = (padded_len(job.data.bytes) - job.data.bytes) as usize;
    if pad > 0 {
        job.data.slices.push(bytes::Bytes::from_static(&ZEROS[..pad]));
    }
    loop {
        if shuffle.deleted.load(Ordering::Acquire) {
            break;
        }
        match write_all_at(&job.target.file, &job.data.slices, job.offset, write_bytes) {
            Ok(()) => {
                let chunk = Chunk {
                    file: job.target.file.clone(),
                    offset: job.offset,
                    len: job.data.bytes,
                    runs: std::mem::take(&mut runs),
                };
                shuffle.partitions[job.partition as usize].lock().chunks.push(chunk);
                break;
            }
            Err(e) => {
                // A full disk gives back its recycled files first; then the same write again.
                if is_nospc(&e) && job.target.dir.drain_pool() > 0 {
                    continue;
                }
                let full = note_failure(&job.target.dir, &e);
                if let Err(e2) = relocate(storage, &shuffle, &mut job, full) {
                    if shuffle.deleted.load(Ordering::Acquire) {
                        break; // deleted while waiting for space: nothing to keep
                    }
                    let msg = format!("flush failed ({e}) and no directory is left ({e2})");
                    tracing::error!(app = %shuffle.app_id, shuffle = shuffle.shuffle_id,
                        partition = job.partition, bytes = job.data.bytes, "{msg}");
                    shuffle.partitions[job.partition as usize].lock().lost.get_or_insert(msg);
                    break;
                }
            }
        }
    }
    // Release the memory before waking a committer waiting for the flush to finish.
    drop(job);
    if shuffle.inflight_flushes.fetch_sub(1, Ordering::AcqRel) == 1 {
        shuffle.flushed.notify_waiters();
    }
}

/// Points a job whose write failed at the partition's next file (a new offset in it). After a
/// full disk with no other directory to go to, waits for one to have room until [`FULL_WAIT`]
/// after the directory filled up, re-reading free space; the partition lock is not held while
/// waiting.
fn relocate(
    storage: &Storage,
    shuffle: &Shuffle,
    job: &mut FlushJob,
    full: bool,
) -> std::io::Result<()> {
    // The wait counts from when the directory filled up, so the jobs queued behind this one
    // do not each wait anew.
    let deadline = match job.target.dir.full_since() {
        Some(since) if full => since + FULL_WAIT,
        _ => Instant::now(),
    };
    let mut avoid = Some(job.target.dir.index);
    loop {
        {
            let mut p = shuffle.partitions[job.partition as usize].lock();
            let next = match &p.file {
                Some(f) if f.dir.in_service() => Ok(f.clone()),
                _ => open_next_file(storage, shuffle, job.partition, &mut p, avoid),
            };
            match next {
                Ok(f) => {
                    job.offset = p.next_offset;
                    p.next_offset += padded_len(job.data.bytes);
                    job.target = f;
                    return Ok(());
                }
                Err(e) if Instant::now() >= deadline || shuffle.deleted.load(Ordering::Acquire) => {
                    return Err(e);
                }
                Err(_) => {}
            }
        }
        // The directory that was full may take data again once space is freed.
        avoid = None;
        std::thread::sleep(Duration::from_millis(250));
        storage.refresh();
    }
}

/// Writes every slice at `offset` with `pwritev` calls that each end at or before the next
/// multiple of `write_bytes` in the file (the kernel sizes new page-cache folios by the write).
fn write_all_at(
    file: &std::fs::File,
    slices: &[bytes::Bytes],
    mut offset: u64,
    write_bytes: usize,
) -> std::io::Result<()> {
    let mut idx = 0;
    let mut skip = 0usize; // bytes of slices[idx] already written
    while idx < slices.len() {
        let mut room = write_bytes - (offset % write_bytes as u64) as usize;
        let iov: Vec<IoSlice<'_>> = std::iter::once(&slices[idx][skip..])
            .chain(slices[idx + 1..].iter().map(|b| &b[..]))
            .take(512)
            .map_while(|s| {
                let take = s.len().min(room);
                room -= take;
                (take > 0 || s.is_empty()).then(|| IoSlice::new(&s[..take]))
            })
            .collect();
        let n = rustix::io::pwritev(file, &iov, offset).map_err(std::io::Error::from)?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::WriteZero,
                "pwritev wrote nothing",
            ));
        }
        offset += n as u64;
        let mut left = n;
        while left > 0 {
            let avail = slices[idx].len() - skip;
            if left >= avail {
                left -= avail;
                idx += 1;
                skip = 0;
            } else {
                skip += left;
                left = 0;
            }
        }
        while idx < slices.len() && slices[idx].len() == skip {
            idx += 1;
            skip = 0;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    #[test]
    fn flusher_threads_run_below_the_servers_priority() {
        let dir = tempfile::tempdir().unwrap();
        let storage = Arc::new(Storage::open(&[dir.path().to_path_buf()], 0, 0));
        let _f = Flushers::start(storage, 1, 7, 256 << 10, Arc::new(|_| {}));
        let me = rustix::process::getpriority_process(None).unwrap();
        let want = (me + 7).min(19);
        let task_dir = std::path::Path::new("/proc/self/task");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            // Any flusher thread of this process at the wanted nice (other tests may run
            // flushers of their own).
            let nices: Vec<i32> = std::fs::read_dir(task_dir)
                .unwrap()
                .flatten()
                .filter_map(|t| {
                    let comm = std::fs::read_to_string(t.path().join("comm")).ok()?;
                    if !comm.starts_with("sluice-flush") {
                        return None;
                    }
                    let stat = std::fs::read_to_string(t.path().join("stat")).ok()?;
                    // Field 19 (nice), counted after the parenthesised command name.
                    let rest = stat.rsplit_once(')')?.1;
                    rest.split_whitespace().nth(16)?.parse::<i32>().ok()
                })
                .collect();
            if nices.contains(&want) {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "flusher threads' nice {nices:?}, want {want}"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    /// Buffers `bytes` for partition 0 and submits them; waits for the flush.
    fn flush_once(flushers: &Flushers, shuffle: &Arc<Shuffle>, bytes: usize) {
        let mut p = shuffle.partitions[0].lock();
        p.buffer.slices.push(bytes::Bytes::from(vec![7u8; bytes]));
        p.buffer.runs.push(crate::shuffle::Run { map_id: 0, attempt_id: 0, len: bytes as u32 });
        p.buffer.bytes = bytes as u64;
        flushers.submit(shuffle, 0, &mut p).expect("a directory takes it");
        drop(p);
        let deadline = Instant::now() + Duration::from_secs(5);
        while shuffle.inflight_flushes.load(Ordering::Acquire) > 0 {
            assert!(Instant::now() < deadline, "flush never finished");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn a_partition_on_a_full_dir_moves_to_one_in_service_and_stays_when_there_is_none() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let storage =
            Arc::new(Storage::open(&[a.path().to_path_buf(), b.path().to_path_buf()], 0, 0));
        let flushers = Flushers::start(storage.clone(), 1, 0, 4096, Arc::new(|_| {}));
        let shuffle = Shuffle::new("app", 1, 1, 1);
        flush_once(&flushers, &shuffle, 1000);
        let first = shuffle.partitions[0].lock().file.clone().unwrap().dir.index;

        // Its directory fills up: the next chunk goes to the other one, in a new file.
        storage.dirs()[first].mark_full(&"test");
        flush_once(&flushers, &shuffle, 1000);
        let p = shuffle.partitions[0].lock();
        assert_eq!(p.file.as_ref().unwrap().dir.index, 1 - first);
        assert_eq!((p.files_created, p.chunks.len(), p.lost.as_deref()), (2, 2, None));
        drop(p);

        // Both full: data already accepted still goes to the partition's file (the reserve is
        // for it), not to a lost partition.
        storage.dirs()[1 - first].mark_full(&"test");
        flush_once(&flushers, &shuffle, 1000);
        let p = shuffle.partitions[0].lock();
        assert_eq!(p.file.as_ref().unwrap().dir.index, 1 - first);
        assert_eq!((p.files_created, p.chunks.len(), p.lost.as_deref()), (2, 3, None));
    }

    #[test]
    fn chunks_are_page_aligned() {
        assert_eq!(padded_len(0), 0);
        assert_eq!(padded_len(1), 4096);
        assert_eq!(padded_len(4096), 4096);
        assert_eq!(padded_len(4097), 8192);
    }

    #[test]
    fn pwritev_writes_every_slice_in_order() {
        let slices: Vec<bytes::Bytes> = (0..2000u32)
            .map(|i| bytes::Bytes::from(vec![(i % 251) as u8; (i % 7) as usize]))
            .collect();
        let want: Vec<u8> = slices.iter().flat_map(|s| s.iter().copied()).collect();
        // Writes bounded at every byte, at an odd size, at a page, and wider than the data.
        for write_bytes in [1, 3, 4096, 1 << 20] {
            let f = tempfile::tempfile().unwrap();
            write_all_at(&f, &slices, 5, write_bytes).unwrap();
            let mut got = vec![0u8; want.len()];
            f.read_exact_at(&mut got, 5).unwrap();
            assert_eq!(got, want, "write_bytes {write_bytes}");
            assert_eq!(f.metadata().unwrap().len(), 5 + want.len() as u64);
        }
    }
}
