//! Partition files: what the core's flush plans point at, where a partition's next file is
//! created, and removing a deleted shuffle's files.
//!
//! A partition's files live at `<data dir>/<app>/<shuffle>/<partition>-<n>.data`, `n` counting
//! the files opened for it (a write error or a full disk moves it to a new one, on another
//! directory).

use std::fs::File;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use crate::core::{Deleted, FileSource, ShuffleKey};
use crate::storage::{create_file, DataDir, Storage};

/// A partition file and the directory it is on. A new file is created by the first write to
/// it, on a flusher thread: creating a file costs the file system an inode (half a millisecond
/// on a busy ext4), too much for an async worker holding a partition's lock, and a wide
/// shuffle's commit would create thousands in a row.
#[derive(Debug)]
pub struct DataFile {
    /// The open file (chunk bodies are regions of it), once created or taken from the pool.
    file: OnceLock<Arc<File>>,
    /// Held while the file is created, so that it is created once.
    creating: Mutex<()>,
    /// The directory it is on: a write error there takes the directory out of service.
    pub dir: Arc<DataDir>,
    /// Where it is (it moves to the recycle pool when its shuffle is deleted).
    pub path: PathBuf,
}

impl DataFile {
    /// A file that exists and is open.
    pub fn opened(file: Arc<File>, dir: Arc<DataDir>, path: PathBuf) -> DataFile {
        DataFile { file: OnceLock::from(file), creating: Mutex::new(()), dir, path }
    }

    /// A file to be created at `path` by the first write ([`Self::open`]).
    pub fn to_create(dir: Arc<DataDir>, path: PathBuf) -> DataFile {
        DataFile { file: OnceLock::new(), creating: Mutex::new(()), dir, path }
    }

    /// The open file, created now (with its directories) if it was not yet. Blocking.
    pub fn open(&self) -> std::io::Result<&Arc<File>> {
        if let Some(f) = self.file.get() {
            return Ok(f);
        }
        let _creating = self.creating.lock();
        if let Some(f) = self.file.get() {
            return Ok(f);
        }
        let f = Arc::new(create_file(&self.path)?);
        Ok(self.file.get_or_init(|| f))
    }

    /// The open file, if it was created (every file a chunk was written to was).
    pub fn file(&self) -> Option<&Arc<File>> {
        self.file.get()
    }
}

/// How the core holds a partition file.
pub type FileRef = Arc<DataFile>;

/// Whether `e` says the file system is full.
pub fn is_nospc(e: &std::io::Error) -> bool {
    e.raw_os_error() == Some(rustix::io::Errno::NOSPC.raw_os_error())
}

/// Takes a directory whose write or create failed with `e` out of use: full (for a while) on
/// `ENOSPC`, out of service on anything else. Returns whether it was a full disk.
pub fn note_failure(dir: &DataDir, e: &std::io::Error) -> bool {
    if is_nospc(e) {
        dir.mark_full(e);
        true
    } else {
        dir.fail(e);
        false
    }
}

/// Where partition files go: the [`FileSource`] the core asks for files.
pub struct Placement<'a> {
    storage: &'a Storage,
    /// A directory not to open the next file on (the one a write just failed on).
    avoid: Option<usize>,
    /// Keep writing to a file on a full directory when no directory is in service: the data was
    /// accepted already and the reserve is there for it (the writer waits for space on
    /// `ENOSPC`).
    stay_when_nothing_else: bool,
}

impl<'a> Placement<'a> {
    /// For a new flush: the current file while its directory is in service (or while it is only
    /// full and no other is in service), else a new file on the directory with most room.
    pub fn for_flush(storage: &'a Storage) -> Self {
        Placement { storage, avoid: None, stay_when_nothing_else: true }
    }

    /// For a flush whose write failed on directory `avoid`: the current file only if its
    /// directory is in service, else a new file on another directory.
    pub fn after_failure(storage: &'a Storage, avoid: Option<usize>) -> Self {
        Placement { storage, avoid, stay_when_nothing_else: false }
    }
}

impl FileSource<FileRef> for Placement<'_> {
    fn keeps(&self, current: &FileRef) -> bool {
        let dir = &current.dir;
        dir.in_service()
            || (self.stay_when_nothing_else && !dir.is_failed() && !self.storage.has_healthy())
    }

    fn open(&self, key: &ShuffleKey, partition: u32, number: u32) -> Result<FileRef, String> {
        let Some(dir) = self.storage.choose(self.avoid) else {
            return Err(self.storage.unavailable_reason());
        };
        let path = shuffle_dir(&dir, key).join(format!("{partition}-{number}.data"));
        // A pooled file is renamed into place now; a new one is created by its first write (a
        // failure there is a write error, which moves the partition on).
        let file = match dir.take_recycled(&path) {
            Some(file) => DataFile::opened(file, dir, path),
            None => DataFile::to_create(dir, path),
        };
        Ok(Arc::new(file))
    }
}

/// File-name-safe form of an application id (no separators, no `..`).
pub fn sanitize(app_id: &str) -> String {
    let s: String = app_id
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' })
        .collect();
    if s.is_empty() {
        "_".into()
    } else {
        s
    }
}

/// A shuffle's directory inside a data directory.
pub(crate) fn shuffle_dir(dir: &DataDir, key: &ShuffleKey) -> PathBuf {
    dir.path.join(sanitize(key.app_id())).join(key.shuffle_id().to_string())
}

/// Removes a deleted shuffle's files from every data directory; each partition's current file is
/// offered to its directory's recycle pool first (see `storage`). Blocking file work.
pub fn remove_shuffle_files(storage: &Storage, deleted: Deleted<FileRef>) {
    // The commit record first: a crash part way through leaves files no restart serves again,
    // rather than a record whose files are half gone.
    for d in storage.dirs() {
        let _ = std::fs::remove_file(shuffle_dir(d, &deleted.key).join(crate::durable::INDEX_FILE));
    }
    for f in deleted.files {
        // The pool hands a file out only once nobody else holds it (an in-flight flush plan, a
        // stream's chunk bodies), whatever else holds `f` now.
        if let Some(file) = f.file() {
            f.dir.recycle(file.clone(), &f.path);
        }
    }
    for d in storage.dirs() {
        let p = shuffle_dir(d, &deleted.key);
        match std::fs::remove_dir_all(&p) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(path = %p.display(), error = %e, "cannot delete shuffle files")
            }
        }
    }
}

/// Removes an application's own directory from every data directory, once its shuffles' are
/// gone (one would be left behind per application).
pub fn remove_app_dirs(storage: &Storage, app_id: &str) {
    for d in storage.dirs() {
        let _ = std::fs::remove_dir(d.path.join(sanitize(app_id)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_safe() {
        assert_eq!(sanitize("../evil/app"), "___evil_app");
        assert_eq!(sanitize(""), "_");
    }
}
