//! Flushers: threads per data directory that carry out the core's flush plans.
//!
//! A flusher is a writer: it writes a plan's slices at the plan's `(file, offset)` and reports
//! the outcome back to the shuffle ([`Shuffle::flushed`]), which records the chunk and frees the
//! memory. File writes block, so they run on plain threads, never on the async workers; offsets
//! are reserved when a plan is made, so several plans of one partition are written at once.
//!
//! A write error takes the directory out of service and the plan is pointed at another
//! directory ([`Shuffle::retarget`]); only when no directory is left is the partition reported
//! lost, so readers get `DATA_LOST` instead of silently missing data. `ENOSPC` is not a broken
//! directory: the directory's recycle pool is deleted and the write tried again; if the pool was
//! empty, the directory is marked full (see `storage`) and the plan goes to another directory,
//! or, with none left, waits up to [`FULL_WAIT`] for space to be freed (its memory stays
//! reserved meanwhile, so pushers get `Busy`) before the partition is reported lost.

use std::io::IoSlice;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};

use crate::core::{FlushOutcome, FlushPlan, Lifecycle, Shuffle};
use crate::files::{is_nospc, is_out_of_fds, note_failure, FileRef, Placement};
use crate::storage::Storage;

/// How long a chunk that no directory has room for waits for space before its partition is
/// marked lost.
pub const FULL_WAIT: Duration = Duration::from_secs(10);

/// How long a flush waits for a file descriptor (`EMFILE`, `ENFILE`) before its data is lost,
/// and the pause between its tries.
const FD_WAIT: Duration = Duration::from_secs(10);
const FD_PAUSE: Duration = Duration::from_millis(100);
/// A commit's flushes smaller than this are not written back one by one: the commit's sync
/// follows at once and writes them together (a wide shuffle's commit flushes 10,000 buffers of
/// a few KiB; a write-back request for each cost more than writing them).
const COMMIT_WRITEBACK_MIN: u64 = 1 << 20;

/// One plan to carry out, with the shuffle to report to.
struct FlushJob {
    shuffle: Arc<Shuffle<FileRef>>,
    plan: FlushPlan<FileRef>,
}

/// What the server is told after each plan: its bytes, whether it was its shuffle's last flush
/// in flight (a commit may be waiting for that), and how long it took from the start of its
/// first write, in microseconds.
pub type OnFlushed = Arc<dyn Fn(u64, bool, u64) + Send + Sync>;

/// The flusher threads of all data directories.
pub struct Flushers {
    queues: Vec<Sender<FlushJob>>,
    storage: Arc<Storage>,
    how: WriteHow,
    on_done: OnFlushed,
}

/// How flushers write.
#[derive(Debug, Clone, Copy)]
pub struct WriteHow {
    /// Each `pwritev` ends at a multiple of this in the file (see
    /// `ServerConfig::flush_write_bytes`).
    pub write_bytes: usize,
    /// Start writing each flush back to disk at once (see `ServerConfig::flush_writeback`).
    pub writeback: bool,
}

impl Flushers {
    /// Starts `per_dir` threads for each directory, each `nice` steps below the server's
    /// priority, each writing as `how` says. `on_done` is called after each plan is reported.
    pub fn start(
        storage: Arc<Storage>,
        per_dir: usize,
        nice: i32,
        how: WriteHow,
        on_done: OnFlushed,
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
                            run_job(&storage, job, how, &on_done);
                        }
                    })
                    .expect("spawn flusher thread");
            }
            queues.push(tx);
        }
        Flushers { queues, storage, how, on_done }
    }

    /// Queues a plan on its directory's flushers.
    pub fn submit(&self, shuffle: &Arc<Shuffle<FileRef>>, plan: FlushPlan<FileRef>) {
        let queue = &self.queues[plan.file().dir.index];
        if let Err(e) = queue.send(FlushJob { shuffle: shuffle.clone(), plan }) {
            // Only when the threads are gone (shutdown): write inline rather than lose it.
            run_job(&self.storage, e.into_inner(), self.how, &self.on_done);
        }
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

fn run_job(storage: &Storage, job: FlushJob, how: WriteHow, on_done: &OnFlushed) {
    let FlushJob { shuffle, mut plan } = job;
    let started = Instant::now();
    // Since when the write has failed for want of a file descriptor.
    let mut fd_wait_since: Option<Instant> = None;
    let outcome = loop {
        if shuffle.is_deleted() {
            break FlushOutcome::Dropped;
        }
        let offset = plan.offset();
        // A new file is created by its first write (see `files`).
        let written = plan.file().open().cloned().and_then(|file| {
            write_all_at(&file, plan.slices(), offset, how.write_bytes).map(|()| file)
        });
        let e = match written {
            Ok(file) => {
                plan.file().dir.note_written(plan.bytes());
                let committing = shuffle.lifecycle() != Lifecycle::Open;
                if how.writeback && (!committing || plan.bytes() >= COMMIT_WRITEBACK_MIN) {
                    start_writeback(&file, offset, plan.bytes());
                }
                break FlushOutcome::Written;
            }
            Err(e) => e,
        };
        // Deleted meanwhile (its files retired, its directory being removed): nothing to keep,
        // and no failure of the directory's.
        if shuffle.is_deleted() {
            break FlushOutcome::Dropped;
        }
        // A full disk gives back its recycled files first; then the same write again.
        if is_nospc(&e) && plan.file().dir.drain_pool() > 0 {
            continue;
        }
        // No descriptor left to create the file with: the recycle pools close theirs first,
        // then the same write again, after a pause while others close theirs (streams ending,
        // connections closing), for up to FD_WAIT. Not the directory's fault: it stays in
        // service.
        if is_out_of_fds(&e) {
            if storage.drain_pools() > 0 {
                continue;
            }
            let since = *fd_wait_since.get_or_insert_with(Instant::now);
            if since.elapsed() < FD_WAIT {
                if since.elapsed() < FD_PAUSE {
                    tracing::warn!(shuffle = %shuffle.key(), partition = plan.partition(), error = %e,
                        "no file descriptor left for a flush; waiting for one");
                }
                std::thread::sleep(FD_PAUSE);
                continue;
            }
            let msg = format!("flush failed: {e} (no file descriptor freed within {FD_WAIT:?})");
            tracing::error!(shuffle = %shuffle.key(), partition = plan.partition(),
                bytes = plan.bytes(), "{msg}");
            break FlushOutcome::Lost(msg);
        }
        let full = note_failure(&plan.file().dir, &e);
        if let Err(e2) = relocate(storage, &shuffle, &mut plan, full) {
            if shuffle.is_deleted() {
                break FlushOutcome::Dropped; // deleted while waiting for space: nothing to keep
            }
            let msg = format!("flush failed ({e}) and no directory is left ({e2})");
            tracing::error!(shuffle = %shuffle.key(), partition = plan.partition(),
                bytes = plan.bytes(), "{msg}");
            break FlushOutcome::Lost(msg);
        }
    };
    let bytes = plan.bytes();
    // The memory is released here, before a committer waiting for the flush is woken.
    let last = shuffle.flushed(plan, outcome);
    on_done(bytes, last, started.elapsed().as_micros().min(u64::MAX as u128) as u64);
}

/// Asks the kernel to start writing `len` bytes at `offset` of `file` back to disk, without
/// waiting for it (`sync_file_range(SYNC_FILE_RANGE_WRITE)`), so that the commit's `fdatasync`
/// finds them written or under way. Best effort: a failure here shows up at that sync.
fn start_writeback(file: &std::fs::File, offset: u64, len: u64) {
    use std::os::fd::AsRawFd;
    // SAFETY: the descriptor is open for the call's duration (`file` is borrowed); the call
    // reads no memory of ours.
    let rc = unsafe {
        libc::sync_file_range(
            file.as_raw_fd(),
            offset as libc::off64_t,
            len as libc::off64_t,
            libc::SYNC_FILE_RANGE_WRITE,
        )
    };
    if rc != 0 {
        tracing::debug!(error = %std::io::Error::last_os_error(), "sync_file_range failed");
    }
}

/// Points a plan whose write failed at the partition's next file. After a full disk with no
/// other directory to go to, waits for one to have room until [`FULL_WAIT`] after the directory
/// filled up, re-reading free space; the partition is not locked while waiting.
fn relocate(
    storage: &Storage,
    shuffle: &Shuffle<FileRef>,
    plan: &mut FlushPlan<FileRef>,
    full: bool,
) -> Result<(), String> {
    // The wait counts from when the directory filled up, so the plans queued behind this one
    // do not each wait anew.
    let deadline = match plan.file().dir.full_since() {
        Some(since) if full => since + FULL_WAIT,
        _ => Instant::now(),
    };
    let mut avoid = Some(plan.file().dir.index);
    loop {
        match shuffle.retarget(plan, &Placement::after_failure(storage, avoid)) {
            Ok(()) => return Ok(()),
            Err(e) if Instant::now() >= deadline || shuffle.is_deleted() => return Err(e),
            Err(_) => {}
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

    fn how(write_bytes: usize) -> WriteHow {
        WriteHow { write_bytes, writeback: true }
    }
    use std::os::unix::fs::FileExt;

    #[test]
    fn flusher_threads_run_below_the_servers_priority() {
        let dir = tempfile::tempdir().unwrap();
        let storage = Arc::new(Storage::open(&[dir.path().to_path_buf()], 0, 0));
        let _f = Flushers::start(storage, 1, 7, how(256 << 10), Arc::new(|_, _, _| {}));
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

    /// A push of one `bytes`-byte batch of map 0 for partition 0 of a shuffle whose chunks are
    /// one byte, so it is flushed at once; waits for the flush.
    fn flush_once(
        storage: &Storage,
        flushers: &Flushers,
        shuffle: &Arc<Shuffle<FileRef>>,
        bytes: usize,
    ) {
        let body = crate::core::tests::batch_body(0, 0, bytes);
        let length = body.len() as u32;
        let section = sluice_proto::message::Section { partition_id: 0, offset: 0, length };
        let pushed = shuffle.push(&[section], &body, None, &Placement::for_flush(storage));
        pushed.result.expect("a directory takes it");
        for plan in pushed.flushes {
            flushers.submit(shuffle, plan);
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while shuffle.flushes_in_flight() > 0 {
            assert!(Instant::now() < deadline, "flush never finished");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn a_partition_on_a_full_dir_moves_to_one_in_service_and_stays_when_there_is_none() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let storage =
            Arc::new(Storage::open(&[a.path().to_path_buf(), b.path().to_path_buf()], 0, 0));
        let flushers = Flushers::start(storage.clone(), 1, 0, how(4096), Arc::new(|_, _, _| {}));
        let shuffle = Arc::new(Shuffle::new(crate::core::ShuffleKey::new("app", 1), 1, 1, 1));
        flush_once(&storage, &flushers, &shuffle, 1000);
        let first = shuffle.partition(0).unwrap().current_file().unwrap().dir.index;

        // Its directory fills up: the next chunk goes to the other one, in a new file.
        storage.dirs()[first].mark_full(&"test");
        flush_once(&storage, &flushers, &shuffle, 1000);
        let p = shuffle.partition(0).unwrap();
        assert_eq!(p.current_file().unwrap().dir.index, 1 - first);
        assert_eq!((p.files_opened(), p.chunks().len(), p.lost()), (2, 2, None));
        drop(p);

        // Both full: data already accepted still goes to the partition's file (the reserve is
        // for it), not to a lost partition.
        storage.dirs()[1 - first].mark_full(&"test");
        flush_once(&storage, &flushers, &shuffle, 1000);
        let p = shuffle.partition(0).unwrap();
        assert_eq!(p.current_file().unwrap().dir.index, 1 - first);
        assert_eq!((p.files_opened(), p.chunks().len(), p.lost()), (2, 3, None));
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
