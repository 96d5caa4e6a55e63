//! Data directories: choice by free space, and taking a failing directory out of service.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// One data directory.
#[derive(Debug)]
pub struct DataDir {
    /// Index among the server's directories (selects its flusher threads).
    pub index: usize,
    pub path: PathBuf,
    failed: AtomicBool,
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

    /// Free bytes on the directory's file system (0 when it cannot be read).
    pub fn free_bytes(&self) -> u64 {
        rustix::fs::statvfs(&self.path).map(|s| s.f_bavail.saturating_mul(s.f_frsize)).unwrap_or(0)
    }

    /// Total bytes of the directory's file system.
    pub fn capacity_bytes(&self) -> u64 {
        rustix::fs::statvfs(&self.path).map(|s| s.f_blocks.saturating_mul(s.f_frsize)).unwrap_or(0)
    }
}

/// The server's data directories.
#[derive(Debug)]
pub struct Storage {
    dirs: Vec<Arc<DataDir>>,
}

impl Storage {
    /// Creates (if needed) and probes every directory; a directory that cannot be written is
    /// taken out of service right away.
    pub fn open(paths: &[PathBuf]) -> Storage {
        let dirs = paths
            .iter()
            .enumerate()
            .map(|(index, p)| {
                let d =
                    Arc::new(DataDir { index, path: p.clone(), failed: AtomicBool::new(false) });
                if let Err(e) = probe(p) {
                    d.fail(&e);
                }
                d
            })
            .collect();
        Storage { dirs }
    }

    /// All directories, failed ones included.
    pub fn dirs(&self) -> &[Arc<DataDir>] {
        &self.dirs
    }

    /// The healthy directory with the most free space, skipping `avoid`.
    pub fn choose(&self, avoid: Option<usize>) -> Option<Arc<DataDir>> {
        self.dirs
            .iter()
            .filter(|d| !d.is_failed() && Some(d.index) != avoid)
            .max_by_key(|d| d.free_bytes())
            .cloned()
    }

    /// Whether any directory is still in service (no syscall: cheap enough for every push).
    pub fn has_healthy(&self) -> bool {
        self.dirs.iter().any(|d| !d.is_failed())
    }

    /// Free bytes over healthy directories.
    pub fn free_bytes(&self) -> u64 {
        self.dirs.iter().filter(|d| !d.is_failed()).map(|d| d.free_bytes()).sum()
    }

    /// Capacity over healthy directories.
    pub fn capacity_bytes(&self) -> u64 {
        self.dirs.iter().filter(|d| !d.is_failed()).map(|d| d.capacity_bytes()).sum()
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
