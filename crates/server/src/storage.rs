//! Data directories: choice by free space, taking a failing directory out of service, a full
//! one out of use until space returns, and the pool of recycled files.
//!
//! **Full file systems.** A directory whose file system has less than `reserve` bytes free, or
//! that answered a write with `ENOSPC`, is *full*: no new data goes there until the maintenance
//! tick ([`Storage::refresh`]) sees free space above the reserve again (a deleted shuffle, an
//! operator's clean-up). The recycle pool is the first thing given back: a full directory drains
//! its pool before it stops taking data. Unlike a failed directory, a full one keeps serving
//! what it holds.
//!
//! **Recycling.** When a shuffle is deleted, its partition files are not unlinked but moved to the
//! directory's `.recycle/` pool (up to `recycle_bytes_per_dir`), and a new partition file is taken
//! from the pool before one is created. Writing over a file whose pages are still in the page cache
//! costs a copy, while writing a new file costs a fresh page per 4 KiB (allocation, zeroing, memory
//! accounting) and a block allocation in the file system; on this project's VM, 1 GiB written
//! into new pages took 2.3 s, over cached ones 0.13 s (docs/benchmarks.md). PostgreSQL and RocksDB
//! recycle their log files for the same reasons. Flushes start at 4 KiB-aligned offsets and are
//! padded to a whole page, so overwriting a recycled file never reads a partial page from disk.
//! A recycled file is handed out only when no reader still holds it open. What lies past a new
//! partition's data in a recycled file is stale and never served: reads go through the chunk
//! index. The pool is emptied when the server starts, never holds more than half of its file
//! system's free space, and when full drops its oldest file that nobody holds to take a new one
//! (the newest files' pages are the likeliest to be cached).

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

/// Files of deleted shuffles waiting for reuse, oldest first.
#[derive(Debug, Default)]
struct Pool {
    /// Oldest first: taken from the back (newest), dropped from the front (a deque: a deleted
    /// wide shuffle recycles thousands of files, each past the cap dropping the oldest).
    files: std::collections::VecDeque<Pooled>,
}

/// A file in the recycle pool.
#[derive(Debug)]
struct Pooled {
    file: Arc<File>,
    /// Its path in the pool.
    at: PathBuf,
    len: u64,
    /// The path it had before: it is never handed back to that path (see
    /// [`DataDir::take_recycled`]).
    was: PathBuf,
}

impl Pool {
    /// Total length of the pooled files (a handful: the cap over a partition file's size).
    fn bytes(&self) -> u64 {
        self.files.iter().map(|p| p.len).sum()
    }
}

/// Free bytes a full directory needs before it takes data again, whatever the reserve (with no
/// reserve, a few free pages would only bring the next `ENOSPC`).
const MIN_FREE_TO_RESUME: u64 = 16 << 20;

/// Name of the pool directory inside each data directory.
pub const RECYCLE_DIR: &str = ".recycle";

/// One data directory.
#[derive(Debug)]
pub struct DataDir {
    /// Index among the server's directories (selects its flusher threads).
    pub index: usize,
    pub path: PathBuf,
    failed: AtomicBool,
    /// No new data until free space is back above `reserve` (see the module's notes).
    full: AtomicBool,
    /// When the directory was last marked full.
    full_since: Mutex<Option<Instant>>,
    /// Free bytes the server leaves on the file system.
    reserve: u64,
    recycle_cap: u64,
    /// Files the pool may hold (each keeps a descriptor open): a share of the process's
    /// descriptor limit, see [`Storage::open`].
    recycle_max_files: usize,
    pool: Mutex<Pool>,
    next_pooled: AtomicU64,
    /// Files taken from the pool for new partitions.
    reused: AtomicU64,
    /// Free bytes as the last [`DataDir::refresh`] saw them (read on the push path, where a
    /// `statvfs` per push would cost too much).
    seen_free: AtomicU64,
    /// Bytes written here since that refresh (taken off `seen_free` by [`Storage::room_seen`]).
    written: AtomicU64,
}

impl DataDir {
    /// Whether the directory was taken out of service.
    pub fn is_failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    /// Takes the directory out of service (logged once).
    pub fn fail(&self, why: &dyn std::fmt::Display) {
        if !self.failed.swap(true, Ordering::AcqRel) {
            tracing::error!(dir = %self.path.display(), error = %why,
                "data directory failed; taken out of service");
        }
    }

    /// Whether the directory's file system is (was last seen) full.
    pub fn is_full(&self) -> bool {
        self.full.load(Ordering::Acquire)
    }

    /// Whether new data may go here: neither failed nor full.
    pub fn in_service(&self) -> bool {
        !self.is_failed() && !self.is_full()
    }

    /// Stops new data going here until [`DataDir::refresh`] sees free space again (logged once
    /// per spell).
    pub fn mark_full(&self, why: &dyn std::fmt::Display) {
        if !self.full.swap(true, Ordering::AcqRel) {
            *self.full_since.lock() = Some(Instant::now());
            tracing::warn!(dir = %self.path.display(), reason = %why, reserve = self.reserve,
                "data directory full; no new data goes there until space is freed");
        }
    }

    /// Since when the directory has been full (`None`: it is not).
    pub fn full_since(&self) -> Option<Instant> {
        self.full_since.lock().filter(|_| self.is_full())
    }

    /// Re-reads the free space: below the reserve, the pool is drained and, if that is not
    /// enough, the directory is marked full; at or above it, a full directory is back in use.
    pub fn refresh(&self) {
        if self.is_failed() {
            return;
        }
        let mut free = self.free_bytes();
        if free < self.reserve && self.drain_pool() > 0 {
            free = self.free_bytes();
        }
        self.seen_free.store(free, Ordering::Relaxed);
        self.written.store(0, Ordering::Relaxed);
        if free < self.reserve {
            self.mark_full(&format_args!("{free} bytes free"));
        } else if free >= self.reserve.max(MIN_FREE_TO_RESUME)
            && self.full.swap(false, Ordering::AcqRel)
        {
            tracing::info!(dir = %self.path.display(), free,
                "data directory has free space again; back in use");
        }
    }

    /// Deletes the pooled files that nobody holds open; returns the bytes given back.
    pub fn drain_pool(&self) -> u64 {
        let mut pool = self.pool.lock();
        let mut freed = 0;
        pool.files.retain(|p| {
            if Arc::strong_count(&p.file) > 1 {
                return true;
            }
            match std::fs::remove_file(&p.at) {
                Ok(()) => freed += p.len,
                Err(e) => tracing::warn!(path = %p.at.display(), error = %e,
                    "cannot delete a recycled file"),
            }
            false
        });
        if freed > 0 {
            tracing::info!(dir = %self.path.display(), bytes = freed,
                "recycle pool drained to free space");
        }
        freed
    }

    /// Free bytes on the directory's file system (0 when it cannot be read).
    pub fn free_bytes(&self) -> u64 {
        rustix::fs::statvfs(&self.path).map(|s| s.f_bavail.saturating_mul(s.f_frsize)).unwrap_or(0)
    }

    /// Total bytes of the directory's file system.
    pub fn capacity_bytes(&self) -> u64 {
        rustix::fs::statvfs(&self.path).map(|s| s.f_blocks.saturating_mul(s.f_frsize)).unwrap_or(0)
    }

    /// A flush wrote `bytes` here (counted against the free space the last refresh saw).
    pub fn note_written(&self, bytes: u64) {
        self.written.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Offers a deleted shuffle's file (at `path`, open as `file`) to the pool. Returns whether it
    /// was kept; if not, the caller deletes it with the rest of the shuffle's directory.
    pub fn recycle(&self, file: Arc<File>, path: &Path) -> bool {
        if self.recycle_cap == 0 || !self.in_service() {
            return false;
        }
        let Ok(len) = file.metadata().map(|m| m.len()) else { return false };
        if len == 0 {
            return false;
        }
        let mut pool = self.pool.lock();
        // The pool never holds more than its cap, nor more than half the free space above the
        // reserve: space it holds is not free for partitions larger than the files in it. The
        // newest file is the one whose pages are likeliest to be cached, so older files nobody
        // holds make room.
        let limit = self.recycle_cap.min(self.free_bytes().saturating_sub(self.reserve) / 2);
        if len > limit || self.recycle_max_files == 0 {
            return false;
        }
        // Nor more files than its share of descriptors: a wide shuffle's thousands of small
        // files would otherwise hold the process's descriptors, and the next file it creates
        // would fail (`EMFILE`).
        while pool.bytes() + len > limit || pool.files.len() >= self.recycle_max_files {
            let Some(i) = pool.files.iter().position(|p| Arc::strong_count(&p.file) == 1) else {
                return false;
            };
            let Some(old) = pool.files.remove(i) else { return false };
            let old = old.at;
            if let Err(e) = std::fs::remove_file(&old) {
                tracing::warn!(path = %old.display(), error = %e, "cannot delete a recycled file");
            }
        }
        let n = self.next_pooled.fetch_add(1, Ordering::Relaxed);
        let to = self.path.join(RECYCLE_DIR).join(format!("{n}.recycled"));
        if let Err(e) = std::fs::create_dir_all(self.path.join(RECYCLE_DIR))
            .and_then(|()| std::fs::rename(path, &to))
        {
            tracing::debug!(path = %path.display(), error = %e, "not recycled");
            return false;
        }
        pool.files.push_back(Pooled { file, at: to, len, was: path.to_path_buf() });
        true
    }

    /// Takes a pooled file that nobody else holds open and was not at `path` before, and moves
    /// it to `path`.
    pub fn take_recycled(&self, path: &Path) -> Option<Arc<File>> {
        let mut pool = self.pool.lock();
        // Newest first: its pages are the likeliest to be still cached. Never back to the path
        // it had: a host-local reader holding an answer that named this file there (its device,
        // inode and path) would find all three the same and read the new data as the old.
        let i =
            pool.files.iter().rposition(|p| Arc::strong_count(&p.file) == 1 && p.was != path)?;
        // `remove`, not `swap_remove`: the rest stay oldest first for `recycle`.
        let Pooled { file, at: from, .. } = pool.files.remove(i)?;
        drop(pool);
        let moved = match path.parent() {
            Some(parent) => std::fs::create_dir_all(parent),
            None => Ok(()),
        }
        .and_then(|()| std::fs::rename(&from, path));
        match moved {
            Ok(()) => {
                self.reused.fetch_add(1, Ordering::Relaxed);
                Some(file)
            }
            Err(e) => {
                tracing::warn!(from = %from.display(), to = %path.display(), error = %e,
                    "cannot reuse a recycled file; deleting it");
                let _ = std::fs::remove_file(&from);
                None
            }
        }
    }

    /// Bytes in the recycle pool.
    pub fn pooled_bytes(&self) -> u64 {
        self.pool.lock().bytes()
    }
}

/// Cuts each file to its end where it is longer: a file taken from the recycle pool keeps an
/// earlier shuffle's bytes past the new data until then. Returns how many files were cut.
pub fn cut_stale_tails(files: &[(Arc<File>, u64)]) -> usize {
    let mut cut = 0;
    for (file, end) in files {
        let result = file.metadata().and_then(|m| {
            if m.len() > *end {
                file.set_len(*end).map(|()| true)
            } else {
                Ok(false)
            }
        });
        match result {
            Ok(true) => cut += 1,
            Ok(false) => {}
            // The stale bytes stay; reads go through the chunk index and never reach them.
            Err(e) => tracing::warn!(error = %e, end, "cannot cut a reused file to its data"),
        }
    }
    cut
}

/// The server's data directories.
#[derive(Debug)]
pub struct Storage {
    dirs: Vec<Arc<DataDir>>,
}

impl Storage {
    /// Creates (if needed) and probes every directory; a directory that cannot be written is
    /// taken out of service right away.
    /// Leftover recycled files of an earlier process are deleted. Each directory leaves
    /// `reserve_bytes` free on its file system.
    pub fn open(paths: &[PathBuf], reserve_bytes: u64, recycle_bytes_per_dir: u64) -> Storage {
        Self::open_with_max_pooled(paths, reserve_bytes, recycle_bytes_per_dir, None)
    }

    /// [`Self::open`], the pools holding at most `max_pooled_files` files each; `None`: half the
    /// process's descriptor limit (`RLIMIT_NOFILE`, soft) shared by the directories (the rest is
    /// for live partition files, connections and readers; a flush that finds none left has the
    /// pools close theirs, see `flusher`).
    pub fn open_with_max_pooled(
        paths: &[PathBuf],
        reserve_bytes: u64,
        recycle_bytes_per_dir: u64,
        max_pooled_files: Option<usize>,
    ) -> Storage {
        let max_files = max_pooled_files.unwrap_or_else(|| {
            let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile);
            let soft = limit.current.unwrap_or(u64::MAX).min(1 << 24) as usize;
            soft / 2 / paths.len().max(1)
        });
        let dirs = paths
            .iter()
            .enumerate()
            .map(|(index, p)| {
                let d = Arc::new(DataDir {
                    index,
                    path: p.clone(),
                    failed: AtomicBool::new(false),
                    full: AtomicBool::new(false),
                    full_since: Mutex::new(None),
                    reserve: reserve_bytes,
                    recycle_cap: recycle_bytes_per_dir,
                    recycle_max_files: max_files,
                    pool: Mutex::new(Pool::default()),
                    next_pooled: AtomicU64::new(0),
                    reused: AtomicU64::new(0),
                    seen_free: AtomicU64::new(0),
                    written: AtomicU64::new(0),
                });
                match std::fs::remove_dir_all(p.join(RECYCLE_DIR)) {
                    Err(e) if e.kind() != io::ErrorKind::NotFound => {
                        tracing::warn!(dir = %p.display(), error = %e, "cannot empty the recycle pool")
                    }
                    _ => {}
                }
                if let Err(e) = probe(p) {
                    d.fail(&e);
                }
                d.refresh();
                d
            })
            .collect();
        Storage { dirs }
    }

    /// Deletes every directory's pooled files that nobody holds open (their descriptors
    /// closed); returns how many bytes that gave back.
    pub fn drain_pools(&self) -> u64 {
        self.dirs.iter().map(|d| d.drain_pool()).sum()
    }

    /// All directories, failed ones included.
    pub fn dirs(&self) -> &[Arc<DataDir>] {
        &self.dirs
    }

    /// The directory in service with the most free space, skipping `avoid`.
    pub fn choose(&self, avoid: Option<usize>) -> Option<Arc<DataDir>> {
        self.dirs
            .iter()
            .filter(|d| d.in_service() && Some(d.index) != avoid)
            .max_by_key(|d| d.free_bytes())
            .cloned()
    }

    /// Whether new data can go anywhere (no syscall: cheap enough for every push).
    pub fn has_healthy(&self) -> bool {
        self.dirs.iter().any(|d| d.in_service())
    }

    /// Free bytes above the reserve over the directories in service, as the last refresh saw
    /// them (a directory marked full since counts nothing): cheap enough for every push.
    pub fn room_seen(&self) -> u64 {
        self.dirs
            .iter()
            .filter(|d| d.in_service())
            .map(|d| {
                let free = d.seen_free.load(Ordering::Relaxed);
                free.saturating_sub(d.written.load(Ordering::Relaxed)).saturating_sub(d.reserve)
            })
            .sum()
    }

    /// Why no data can be taken (for the error a refused push gets): which directories are
    /// full and which failed.
    pub fn unavailable_reason(&self) -> String {
        let list = |pick: &dyn Fn(&DataDir) -> bool| {
            let v: Vec<String> = self
                .dirs
                .iter()
                .filter(|d| pick(d))
                .map(|d| d.path.display().to_string())
                .collect();
            v.join(", ")
        };
        let failed = list(&|d| d.is_failed());
        let full = list(&|d| !d.is_failed() && d.is_full());
        match (failed.is_empty(), full.is_empty()) {
            (_, true) => format!("every data directory is out of service (failed: {failed})"),
            (true, false) => format!("every data directory is full ({full})"),
            (false, false) => format!(
                "every data directory is full or out of service (full: {full}; failed: {failed})"
            ),
        }
    }

    /// Directories for which `pick` holds.
    pub fn count(&self, pick: impl Fn(&DataDir) -> bool) -> u64 {
        self.dirs.iter().filter(|d| pick(d)).count() as u64
    }

    /// Re-reads every directory's free space (see [`DataDir::refresh`]).
    pub fn refresh(&self) {
        for d in &self.dirs {
            d.refresh();
        }
    }

    /// Free bytes above the reserve over the directories in service (what coordinators are told).
    pub fn free_bytes(&self) -> u64 {
        self.dirs
            .iter()
            .filter(|d| d.in_service())
            .map(|d| d.free_bytes().saturating_sub(d.reserve))
            .sum()
    }

    /// Capacity over healthy directories.
    pub fn capacity_bytes(&self) -> u64 {
        self.dirs.iter().filter(|d| !d.is_failed()).map(|d| d.capacity_bytes()).sum()
    }

    /// Bytes in the recycle pools.
    pub fn pooled_bytes(&self) -> u64 {
        self.dirs.iter().map(|d| d.pooled_bytes()).sum()
    }

    /// Recycled files taken for new partitions so far.
    pub fn reused_files(&self) -> u64 {
        self.dirs.iter().map(|d| d.reused.load(Ordering::Relaxed)).sum()
    }
}

fn probe(dir: &Path) -> io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let p = dir.join(".sluice-probe");
    std::fs::write(&p, b"ok")?;
    std::fs::remove_file(&p)
}

/// Creates a partition file, with its parent directories.
pub fn create_file(path: &Path) -> io::Result<File> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::OpenOptions::new().create(true).truncate(true).read(true).write(true).open(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `<dir>/<name>.data`, `len` bytes long.
    fn file_with(dir: &Path, name: &str, len: usize) -> (Arc<File>, PathBuf) {
        let p = dir.join(format!("{name}.data"));
        std::fs::write(&p, vec![7u8; len]).unwrap();
        (Arc::new(File::open(&p).unwrap()), p)
    }

    #[test]
    fn pooled_files_go_out_only_when_nobody_holds_them_and_within_the_cap() {
        let tmp = tempfile::tempdir().unwrap();
        let storage = Storage::open(&[tmp.path().to_path_buf()], 0, 10_000);
        let dir = &storage.dirs()[0];
        let [(a, pa), (b, pb), (c, pc)] = ["a", "b", "c"].map(|n| file_with(tmp.path(), n, 4000));
        let reader_of_a = a.clone(); // an open stream still sending from `a`
        assert!(dir.recycle(a, &pa));
        let held_b = b.clone(); // b is held too while c comes in
        assert!(dir.recycle(b, &pb));
        assert!(!dir.recycle(c, &pc), "over the 10 000-byte cap, and a and b are both held");
        assert!(pc.exists() && !pa.exists() && !pb.exists());
        assert_eq!(dir.pooled_bytes(), 8000);
        drop(held_b);

        // `b` is free; `a` is still open elsewhere, so it stays in the pool.
        let to = tmp.path().join("app/1/0-0.data");
        let got = dir.take_recycled(&to).expect("b is free");
        assert!(to.exists());
        assert_eq!(got.metadata().unwrap().len(), 4000);
        assert!(dir.take_recycled(&tmp.path().join("x.data")).is_none(), "a is still held");
        drop(reader_of_a);
        assert!(dir.take_recycled(&tmp.path().join("y.data")).is_some());
        assert_eq!(dir.pooled_bytes(), 0);
        assert_eq!(storage.reused_files(), 2);
    }

    #[test]
    fn a_pooled_file_never_goes_back_to_the_path_it_had() {
        // A shuffle deleted and registered again under its id makes the same paths: its files
        // must not be its old ones, or a host-local reader still holding an answer that named
        // an old file (path, device, inode) would find all three unchanged and read new data.
        let tmp = tempfile::tempdir().unwrap();
        let storage = Storage::open(&[tmp.path().to_path_buf()], 0, 10_000);
        let dir = &storage.dirs()[0];
        let (a, pa) = file_with(tmp.path(), "a", 4000);
        let ino = |f: &File| std::os::unix::fs::MetadataExt::ino(&f.metadata().unwrap());
        let a_ino = ino(&a);
        assert!(dir.recycle(a, &pa));
        assert!(dir.take_recycled(&pa).is_none(), "the only pooled file was at that path");
        assert!(!pa.exists());
        let (b, pb) = file_with(tmp.path(), "b", 4000);
        assert!(dir.recycle(b, &pb));
        // `b`, the newest, would go first; not back to its own path: `a` goes there.
        let got = dir.take_recycled(&pb).expect("a was elsewhere");
        assert_eq!(ino(&got), a_ino);
        let other = tmp.path().join("c.data");
        assert!(dir.take_recycled(&other).is_some(), "b may go anywhere else");
        assert_eq!(dir.pooled_bytes(), 0);
    }

    #[test]
    fn the_pool_holds_no_more_files_than_its_share_of_descriptors() {
        let tmp = tempfile::tempdir().unwrap();
        let storage =
            Storage::open_with_max_pooled(&[tmp.path().to_path_buf()], 0, 1 << 30, Some(2));
        let dir = &storage.dirs()[0];
        let [(a, pa), (b, pb), (c, pc)] = ["a", "b", "c"].map(|n| file_with(tmp.path(), n, 10));
        let (held_a, held_b) = (a.clone(), b.clone()); // streams still sending from them
        assert!(dir.recycle(a, &pa) && dir.recycle(b, &pb));
        assert!(!dir.recycle(c.clone(), &pc), "two files pooled already, both held");
        drop(held_b);
        assert!(dir.recycle(c, &pc), "b, free now, makes room");
        let pooled = std::fs::read_dir(tmp.path().join(RECYCLE_DIR)).unwrap().count();
        assert_eq!((pooled, dir.pooled_bytes()), (2, 20), "a and c");
        assert_eq!(storage.drain_pools(), 10, "c; a is held");
        drop(held_a);
        assert_eq!(storage.drain_pools(), 10, "a");
        let none = Storage::open_with_max_pooled(&[tmp.path().to_path_buf()], 0, 1 << 30, Some(0));
        let (d, pd) = file_with(tmp.path(), "d", 10);
        assert!(!none.dirs()[0].recycle(d, &pd), "a share of 0 keeps nothing");
        // By default a share of the descriptor limit: some files, not none.
        assert!(storage_default_max(&tmp) > 0);
    }

    fn storage_default_max(tmp: &tempfile::TempDir) -> usize {
        Storage::open(&[tmp.path().to_path_buf()], 0, 1 << 30).dirs()[0].recycle_max_files
    }

    #[test]
    fn a_full_pool_makes_room_by_dropping_its_oldest_free_file() {
        let tmp = tempfile::tempdir().unwrap();
        let storage = Storage::open(&[tmp.path().to_path_buf()], 0, 10_000);
        let dir = &storage.dirs()[0];
        let [(a, pa), (b, pb), (c, pc)] = ["a", "b", "c"].map(|n| file_with(tmp.path(), n, 4000));
        assert!(dir.recycle(a, &pa));
        assert!(dir.recycle(b, &pb));
        assert!(dir.recycle(c, &pc), "a, the oldest, makes room");
        assert_eq!(dir.pooled_bytes(), 8000);
        let pooled = std::fs::read_dir(tmp.path().join(RECYCLE_DIR)).unwrap().count();
        assert_eq!(pooled, 2, "a's file is deleted");
        let (big, pbig) = file_with(tmp.path(), "big", 20_000);
        assert!(!dir.recycle(big, &pbig), "larger than the whole pool");
        assert_eq!(dir.pooled_bytes(), 8000);
    }

    #[test]
    fn a_full_dir_takes_no_data_gives_back_its_pool_and_returns_when_space_is_free() {
        let tmp = tempfile::tempdir().unwrap();
        let storage = Storage::open(&[tmp.path().to_path_buf()], 0, 10_000);
        let dir = &storage.dirs()[0];
        let [(a, pa), (b, pb)] = ["a", "b"].map(|n| file_with(tmp.path(), n, 4000));
        let held_b = b.clone();
        assert!(dir.recycle(a, &pa) && dir.recycle(b, &pb));
        assert_eq!(dir.drain_pool(), 4000, "a is deleted, b is still open elsewhere");
        assert_eq!(dir.pooled_bytes(), 4000);
        drop(held_b);

        dir.mark_full(&"test");
        assert!(!dir.in_service() && !dir.is_failed() && dir.full_since().is_some());
        assert!(!storage.has_healthy() && storage.choose(None).is_none());
        assert_eq!(storage.free_bytes(), 0, "coordinators are told there is no room");
        assert!(storage.unavailable_reason().contains("every data directory is full"));
        let (c, pc) = file_with(tmp.path(), "c", 4000);
        assert!(!dir.recycle(c, &pc), "a full directory keeps no files");

        // This file system has room above the (zero) reserve: back in use.
        storage.refresh();
        assert!(dir.in_service() && dir.full_since().is_none());
        assert!(storage.choose(None).is_some());
        assert_eq!(dir.pooled_bytes(), 4000, "the pool is only drained below the reserve");
    }

    #[test]
    fn a_reserve_above_the_free_space_marks_the_dir_full_at_start() {
        let tmp = tempfile::tempdir().unwrap();
        let storage = Storage::open(&[tmp.path().to_path_buf()], u64::MAX, 10_000);
        assert!(storage.dirs()[0].is_full());
        assert!(!storage.has_healthy());
        storage.refresh();
        assert!(storage.dirs()[0].is_full(), "still below the reserve");
    }

    #[test]
    fn a_zero_cap_keeps_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let storage = Storage::open(&[tmp.path().to_path_buf()], 0, 0);
        let (a, pa) = file_with(tmp.path(), "a", 100);
        assert!(!storage.dirs()[0].recycle(a, &pa));
        assert!(pa.exists(), "left for the caller to delete");
    }
}
