//! Partition files: what the core's flush plans point at, where a partition's next file is
//! created, and removing a deleted shuffle's files.
//!
//! A partition's files live at `<data dir>/<app>/<shuffle>/<partition>-<n>.data`, `n` counting
//! the files opened for it (a write error or a full disk moves it to a new one, on another
//! directory).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use crate::core::{Deleted, FileSource, ShuffleKey};
use crate::storage::{create_file, DataDir, Storage};

/// A partition file and the directory it is on. A new file is taken from the recycle pool, or
/// created, by the first write to it, on a flusher thread: creating a file costs the file system
/// an inode (half a millisecond on a busy ext4), and renaming one as much, too much for an async
/// worker holding a partition's lock, and a wide shuffle's commit would make thousands in a row.
#[derive(Debug)]
pub struct DataFile {
    /// The open file (chunk bodies are regions of it), once created or taken from the pool.
    file: OnceLock<Arc<File>>,
    /// Held while the file is created, so that it is created once; `true` once its shuffle's
    /// files are being removed ([`Self::retire`]): it is never created after that.
    creating: Mutex<bool>,
    /// The directory it is on: a write error there takes the directory out of service.
    pub dir: Arc<DataDir>,
    /// Where it is (it moves to the recycle pool when its shuffle is deleted).
    pub path: PathBuf,
}

impl DataFile {
    /// A file that exists and is open.
    pub fn opened(file: Arc<File>, dir: Arc<DataDir>, path: PathBuf) -> DataFile {
        DataFile { file: OnceLock::from(file), creating: Mutex::new(false), dir, path }
    }

    /// A file to be made at `path` by the first write ([`Self::open`]).
    pub fn to_create(dir: Arc<DataDir>, path: PathBuf) -> DataFile {
        DataFile { file: OnceLock::new(), creating: Mutex::new(false), dir, path }
    }

    /// The open file: if it was not yet, one from its directory's recycle pool moved into place
    /// or, with none there, a new one (with its directories). Blocking.
    pub fn open(&self) -> std::io::Result<&Arc<File>> {
        if let Some(f) = self.file.get() {
            return Ok(f);
        }
        let retired = self.creating.lock();
        if let Some(f) = self.file.get() {
            return Ok(f);
        }
        if *retired {
            let why = format!("{}: its shuffle was deleted", self.path.display());
            return Err(std::io::Error::new(std::io::ErrorKind::NotFound, why));
        }
        let f = match self.dir.take_recycled(&self.path) {
            Some(f) => f,
            None => Arc::new(create_file(&self.path)?),
        };
        Ok(self.file.get_or_init(|| f))
    }

    /// The open file, if it was created (every file a chunk was written to was).
    pub fn file(&self) -> Option<&Arc<File>> {
        self.file.get()
    }

    /// Its shuffle's files are being removed: it is never created from now on (a flush of the
    /// deleted shuffle that comes later would make it, and its directories, again under the
    /// removal); the open file, if it was created (one being created is waited for).
    pub fn retire(&self) -> Option<&Arc<File>> {
        let mut retired = self.creating.lock();
        *retired = true;
        self.file.get()
    }
}

/// How the core holds a partition file.
pub type FileRef = Arc<DataFile>;

/// Whether `e` says the file system is full.
pub fn is_nospc(e: &std::io::Error) -> bool {
    e.raw_os_error() == Some(rustix::io::Errno::NOSPC.raw_os_error())
}

/// Whether `e` says the process (`EMFILE`) or the system (`ENFILE`) has no file descriptor
/// left: no fault of the directory's.
pub fn is_out_of_fds(e: &std::io::Error) -> bool {
    let code = e.raw_os_error();
    code == Some(rustix::io::Errno::MFILE.raw_os_error())
        || code == Some(rustix::io::Errno::NFILE.raw_os_error())
}

/// Takes a directory whose write or create failed with `e` out of use: full (for a while) on
/// `ENOSPC`, out of service on anything else but a lack of file descriptors (which is not the
/// directory's: it stays in service). Returns whether it was a full disk.
pub fn note_failure(dir: &DataDir, e: &std::io::Error) -> bool {
    if is_out_of_fds(e) {
        tracing::warn!(dir = %dir.path.display(), error = %e,
            "out of file descriptors; the directory stays in service");
        return false;
    }
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
        // Taken from the recycle pool or created by its first write, on a flusher thread (a
        // failure there is a write error, which moves the partition on): a rename costs the file
        // system as a new inode does, too much here, where a push or a commit holds the
        // partition's lock on an async worker.
        Ok(Arc::new(DataFile::to_create(dir, path)))
    }
}

/// An encoded name longer than this is cut and given a digest of the whole id instead.
const NAME_KEEP_MAX: usize = 200;
/// Where a long name is cut before its digest (an encoded name is ASCII).
const NAME_CUT: usize = 160;

/// The directory (and object-key) name of an application id: letters, digits, `-` and `_` as
/// they are, every other byte as `~` and two hex digits, an empty id as `~`. One-to-one, so two
/// applications never share a directory (`a.b` is `a~2eb`, `a_b` stays `a_b`), and safe: no
/// separator, no `.` or `..`, never hidden. A name that would pass [`NAME_KEEP_MAX`] bytes is
/// cut and ends in `~~` and 32 hex digits of the id's SHA-256, which no short name contains
/// (a `~` of a short name is followed by a hex digit), so it stays within a file name's 255.
pub fn app_dir_name(app_id: &str) -> String {
    use std::fmt::Write;
    if app_id.is_empty() {
        return "~".into();
    }
    let mut s = String::with_capacity(app_id.len());
    for b in app_id.bytes() {
        if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' {
            s.push(b as char);
        } else {
            let _ = write!(s, "~{b:02x}");
        }
    }
    if s.len() > NAME_KEEP_MAX {
        use sha2::Digest;
        let digest = sha2::Sha256::digest(app_id.as_bytes());
        s.truncate(NAME_CUT);
        s.push_str("~~");
        for b in &digest[..16] {
            let _ = write!(s, "{b:02x}");
        }
    }
    s
}

/// The application id an [`app_dir_name`] stands for, when the name says it in full: exactly
/// the name that id is given (not a cut name with a digest, not a name this server never makes).
pub fn app_id_of_dir(name: &str) -> Option<String> {
    if name == "~" {
        return Some(String::new());
    }
    let b = name.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'~' => {
                let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
                let byte = u8::from_str_radix(hex, 16).ok()?;
                if byte.is_ascii_alphanumeric() || byte == b'-' || byte == b'_' {
                    return None; // such bytes are never escaped
                }
                out.push(byte);
                i += 3;
            }
            c if c.is_ascii_alphanumeric() || c == b'-' || c == b'_' => {
                out.push(c);
                i += 1;
            }
            _ => return None,
        }
    }
    let id = String::from_utf8(out).ok()?;
    (app_dir_name(&id) == name).then_some(id)
}

/// The directory name servers gave an application id before [`app_dir_name`] (every byte but
/// letters, digits, `-` and `_` as `_`, an empty id as `_`): not one to one. Read at restart
/// only, to move such a directory to its name of today.
pub fn legacy_app_dir_name(app_id: &str) -> String {
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

/// Whether `name` is one [`app_dir_name`] or [`legacy_app_dir_name`] could have made (a data
/// directory's `lost+found` is not).
pub fn could_be_app_dir(name: &str) -> bool {
    !name.is_empty()
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'~')
}

/// The file in an application's directory that names the application in full, written only
/// where [`app_dir_name`] cut the name, beside each commit record (and at restart beside each
/// recovered shuffle's): a restart that finds a shuffle there whose commit record is unreadable
/// reports it lost under the application's own id (its readers are told `DATA_LOST`, not that
/// it is unknown, and unregistering the application deletes it). Only committed shuffles are
/// recovered, so a note beside each commit record is enough.
pub const APP_ID_FILE: &str = "app-id";

/// Where [`note_app_id`] writes before it renames.
const APP_ID_TMP_PREFIX: &str = ".app-id.";

/// Held while a note is checked and written, and while an application directory holding one is
/// checked and removed: a new shuffle's note is never deleted by the removal of the directory
/// it is in.
static NOTES: Mutex<()> = parking_lot::const_mutex(());

/// Whether [`app_dir_name`] cut `name` (it then ends in `~~` and a digest).
fn is_cut_name(name: &str) -> bool {
    name.contains("~~")
}

/// Where `app_id`'s directory name is cut, writes [`APP_ID_FILE`] in its directory on data
/// directory `root` (which the caller has made: a shuffle's directory in it), if it is not
/// there. Blocking: for the commit's blocking work and the start. A failure is logged and
/// otherwise left alone: the file serves only a restart that finds the shuffle's record lost.
pub(crate) fn note_app_id(root: &Path, app_id: &str) {
    let name = app_dir_name(app_id);
    if !is_cut_name(&name) {
        return;
    }
    let dir = root.join(&name);
    let file = dir.join(APP_ID_FILE);
    let _held = NOTES.lock();
    if file.is_file() {
        return;
    }
    // Through a synced temporary file and a rename: neither a crash nor a power loss leaves a
    // partial id behind (the directory is synced with the commit record after this).
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!("{APP_ID_TMP_PREFIX}{n}"));
    let written = std::fs::create_dir_all(&dir)
        .and_then(|()| {
            use std::io::Write;
            let mut f = File::create(&tmp)?;
            f.write_all(app_id.as_bytes())?;
            f.sync_data()
        })
        .and_then(|()| std::fs::rename(&tmp, &file));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        tracing::warn!(path = %file.display(), error = %e,
            "cannot write an application's full id beside its shortened directory name");
    }
}

/// The application id [`APP_ID_FILE`] holds in directory `name` on any of `roots`, if it is one
/// whose [`app_dir_name`] is `name`. Blocking.
pub(crate) fn noted_app_id<'a>(
    roots: impl IntoIterator<Item = &'a Path>,
    name: &str,
) -> Option<String> {
    if !is_cut_name(name) {
        return None;
    }
    roots.into_iter().find_map(|root| {
        let bytes = std::fs::read(root.join(name).join(APP_ID_FILE)).ok()?;
        let id = String::from_utf8(bytes).ok()?;
        (app_dir_name(&id) == name).then_some(id)
    })
}

/// Removes application directory `path` if it is empty or, for a shortened name, holds nothing
/// but its [`APP_ID_FILE`] (and temporary ones a crash left). Blocking.
pub(crate) fn remove_app_dir(path: &Path) {
    if std::fs::remove_dir(path).is_ok() {
        return;
    }
    if !path.file_name().is_some_and(|n| is_cut_name(&n.to_string_lossy())) {
        return; // not empty: a shuffle of the application is still there
    }
    let _held = NOTES.lock();
    let Ok(entries) = std::fs::read_dir(path) else { return };
    let names: Vec<std::ffi::OsString> =
        entries.filter_map(Result::ok).map(|e| e.file_name()).collect();
    let noted = |n: &std::ffi::OsString| {
        n.to_str().is_some_and(|n| n == APP_ID_FILE || n.starts_with(APP_ID_TMP_PREFIX))
    };
    if names.iter().all(noted) {
        for n in &names {
            let _ = std::fs::remove_file(path.join(n));
        }
        let _ = std::fs::remove_dir(path);
    }
}

/// A shuffle's directory inside a data directory.
pub(crate) fn shuffle_dir(dir: &DataDir, key: &ShuffleKey) -> PathBuf {
    dir.path.join(app_dir_name(key.app_id())).join(key.shuffle_id().to_string())
}

/// Removes a deleted shuffle's files from every data directory; each partition's current file is
/// offered to its directory's recycle pool first (see `storage`), and every file is retired
/// before its directory is removed (a flush still in flight never makes it again). Blocking
/// file work.
pub fn remove_shuffle_files(storage: &Storage, deleted: Deleted<FileRef>) {
    // No commit record is being written meanwhile, nor written after this (a writer that holds
    // the lock next finds the shuffle deleted).
    let writers = deleted.record_writers();
    let _no_writer = writers.lock();
    // The commit record first: a crash part way through leaves files no restart serves again,
    // rather than a record whose files are half gone.
    for d in storage.dirs() {
        let _ = std::fs::remove_file(shuffle_dir(d, &deleted.key).join(crate::durable::INDEX_FILE));
    }
    for f in deleted.older {
        f.retire();
    }
    for f in deleted.files {
        // The pool hands a file out only once nobody else holds it (an in-flight flush plan, a
        // stream's chunk bodies), whatever else holds `f` now.
        if let Some(file) = f.retire() {
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
        remove_app_dir(&d.path.join(app_dir_name(app_id)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_directorys_own_failures_take_it_out_of_service() {
        let tmp = tempfile::tempdir().unwrap();
        let storage = Storage::open(&[tmp.path().to_path_buf()], 0, 0);
        let dir = &storage.dirs()[0];
        let os = |e: rustix::io::Errno| std::io::Error::from_raw_os_error(e.raw_os_error());
        // The process or the system out of descriptors: not the directory's fault.
        for e in [rustix::io::Errno::MFILE, rustix::io::Errno::NFILE] {
            assert!(!note_failure(dir, &os(e)));
            assert!(dir.in_service(), "{e:?}");
        }
        assert!(note_failure(dir, &os(rustix::io::Errno::NOSPC)), "a full disk");
        assert!(dir.is_full() && !dir.is_failed());
        assert!(!note_failure(dir, &os(rustix::io::Errno::IO)));
        assert!(dir.is_failed(), "an I/O error is the directory's");
    }

    #[test]
    fn names_are_safe_and_one_to_one() {
        assert_eq!(app_dir_name("app-20261127-0001_x"), "app-20261127-0001_x");
        assert_eq!(app_dir_name("../evil/app"), "~2e~2e~2fevil~2fapp");
        assert_eq!(app_dir_name(""), "~");
        // Ids that the old name (every other character as `_`) gave one directory.
        let ids = ["a.b", "a_b", "a/b", "a~b", "a~2eb", "a b", "a\u{e9}b", "", "~", "."];
        let names: std::collections::HashSet<String> =
            ids.iter().map(|i| app_dir_name(i)).collect();
        assert_eq!(names.len(), ids.len(), "{names:?}");
        for id in ids {
            let name = app_dir_name(id);
            assert!(!name.starts_with('.') && !name.contains('/'), "{name}");
            assert_eq!(app_id_of_dir(&name).as_deref(), Some(id), "{name}");
        }
        assert_eq!(app_id_of_dir("a~2"), None);
        assert_eq!(app_id_of_dir("a~2Eb"), None, "upper-case hex is not a name we make");
        assert!(could_be_app_dir("a~2eb") && could_be_app_dir("a_b"));
        assert!(!could_be_app_dir("lost+found") && !could_be_app_dir(".recycle"));
        assert_eq!(legacy_app_dir_name("etl.daily"), "etl_daily");
        assert_eq!(app_id_of_dir("a~41"), None, "an escaped letter is not a name we make");
        assert_eq!(app_id_of_dir(".recycle"), None);
    }

    #[test]
    fn long_names_are_cut_with_a_digest() {
        let a = "x.".repeat(300);
        let mut b = a.clone();
        b.push('y');
        let (na, nb) = (app_dir_name(&a), app_dir_name(&b));
        assert!(na.len() <= 255 && nb.len() <= 255, "{} {}", na.len(), nb.len());
        assert_ne!(na, nb, "ids sharing their first bytes keep apart by the digest");
        assert!(na.contains("~~"));
        assert_eq!(app_id_of_dir(&na), None);
        let plain = "y".repeat(NAME_KEEP_MAX);
        assert_eq!(app_dir_name(&plain), plain, "up to the bound a name is kept whole");
    }

    #[test]
    fn a_retired_file_is_never_created() {
        let root = tempfile::tempdir().unwrap();
        let storage = crate::storage::Storage::open(&[root.path().to_path_buf()], 0, 0);
        let dir = storage.dirs()[0].clone();
        let made = DataFile::to_create(dir.clone(), root.path().join("app/1/0-0.data"));
        made.open().unwrap();
        assert!(made.retire().is_some(), "a created file is handed back for the pool");
        let never = DataFile::to_create(dir.clone(), root.path().join("app/2/0-0.data"));
        assert!(never.retire().is_none());
        let e = never.open().unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{e}");
        assert!(!root.path().join("app/2").exists(), "its directory made again");
        assert!(!dir.is_failed());
    }

    #[test]
    fn a_shortened_name_has_its_id_noted_beside_it() {
        let root = tempfile::tempdir().unwrap();
        let (short, long) = ("app.1".to_string(), "x.".repeat(300));
        note_app_id(root.path(), &short);
        assert!(!root.path().join(app_dir_name(&short)).exists(), "a whole name needs no note");
        note_app_id(root.path(), &long);
        let name = app_dir_name(&long);
        let note = root.path().join(&name).join(APP_ID_FILE);
        let inode = || std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&note).unwrap());
        let first = inode();
        note_app_id(root.path(), &long); // once is enough: not written again
        assert_eq!(inode(), first, "the note was written again");
        assert_eq!(noted_app_id([root.path()], &name), Some(long.clone()));
        let entries = std::fs::read_dir(root.path().join(&name)).unwrap().count();
        assert_eq!(entries, 1, "a temporary file left behind");
        // A note that does not give this name back is not believed.
        std::fs::write(root.path().join(&name).join(APP_ID_FILE), "other").unwrap();
        assert_eq!(noted_app_id([root.path()], &name), None);
        // The directory goes once nothing but the note is in it.
        std::fs::create_dir(root.path().join(&name).join("1")).unwrap();
        remove_app_dir(&root.path().join(&name));
        assert!(root.path().join(&name).join(APP_ID_FILE).exists(), "a shuffle was still there");
        std::fs::remove_dir(root.path().join(&name).join("1")).unwrap();
        // A temporary note a crash left does not keep the directory.
        std::fs::write(root.path().join(&name).join(format!("{APP_ID_TMP_PREFIX}7")), "x").unwrap();
        remove_app_dir(&root.path().join(&name));
        assert!(!root.path().join(&name).exists());
        // A whole name's directory with something in it stays.
        std::fs::create_dir_all(root.path().join("app~2e1").join(APP_ID_FILE)).unwrap();
        remove_app_dir(&root.path().join("app~2e1"));
        assert!(root.path().join("app~2e1").exists());
    }
}
