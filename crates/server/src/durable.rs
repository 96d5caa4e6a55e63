//! Durable commits and recovery at start.
//!
//! **At commit**, once every flush of a shuffle is written, the server makes its data durable
//! (`fdatasync` of each of its files on a directory, or one `syncfs` of the directory's file
//! system when it holds many of them), then writes the shuffle's commit record (see
//! `core::record`) as `index` in the shuffle's directory on each data directory that holds a
//! file of it: written to a temporary name while the data syncs, then (data durable) synced,
//! renamed, and the directories synced. Only then is the commit answered: a commit a writer saw
//! succeed survives a crash of the server.
//!
//! **At start**, the server reads every shuffle directory of its data directories: a shuffle
//! with a commit record is served again (a partition whose files are missing or short, or whose
//! entry in the record is damaged, is lost: its readers get `DATA_LOST`); a shuffle without one
//! was never committed and is deleted; a record that cannot be read at all makes the shuffle
//! lost as a whole. Its application is then held as if just heard from: it expires like any
//! other when no heartbeat follows (`app_expiry_ms`). An application directory that cannot be
//! listed is left as it is, and its application held likewise, its shuffles not held lost to
//! their readers (which of them the directory held is not known).
//!
//! **At a stop** (SIGTERM), once no uncommitted shuffle holds data, the open shuffles that hold
//! nothing (a job's later stages, registered before they run) are *parked*: their pushes are
//! refused with `SHUTTING_DOWN`, which clients retry, and their registration is written as a
//! record marked not sealed. The restarted server holds them open again and takes the pushes.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::core::{decode_record, Decoded, Shuffle, ShuffleKey};
use crate::files::{
    app_dir_name, app_id_of_dir, could_be_app_dir, legacy_app_dir_name, note_app_id, noted_app_id,
    remove_app_dir, shuffle_dir, DataFile, FileRef,
};
use crate::storage::{DataDir, Storage, RECYCLE_DIR};

/// The commit record's file name inside a shuffle's directory.
pub const INDEX_FILE: &str = "index";
/// Prefix of a commit record being written (deleted at start: never renamed, so never used).
const INDEX_TMP_PREFIX: &str = ".index.tmp.";
/// Above this many files of one shuffle on one directory, one `syncfs` replaces their
/// `fdatasync`s.
const SYNCFS_ABOVE_FILES: usize = 32;

/// Makes a committed shuffle durable: `files` synced, then its record written next to them (see
/// the module's notes); returns the record. Blocking. `record` makes the record, on this thread
/// while another syncs `files` (a wide shuffle's record takes as long to encode as its files
/// to sync); the record is written to its temporary files meanwhile too, and only synced and
/// given its name once the files are synced (a crash in between leaves a temporary record,
/// deleted at start). A shuffle deleted meanwhile (`deleted` says so, and its directory is
/// gone) gets no record; a directory gone under a shuffle that was not deleted is an error (its
/// data is gone with it).
pub fn persist(
    storage: &Storage,
    key: &ShuffleKey,
    record: impl FnOnce() -> Vec<u8>,
    files: &[FileRef],
    deleted: impl Fn() -> bool,
) -> io::Result<Vec<u8>> {
    let (synced, record, staged) = std::thread::scope(|s| {
        let syncing = std::thread::Builder::new()
            .name("sluice-commit-sync".into())
            .spawn_scoped(s, || sync_files(files));
        let record = record();
        let staged = stage_record(storage, key, &record, files, &deleted);
        let synced = match syncing {
            Ok(h) => h.join().unwrap_or_else(|_| Err(io::Error::other("the sync thread panicked"))),
            Err(_) => sync_files(files), // no thread to be had: in turn
        };
        (synced, record, staged)
    });
    // Dropping a staged record unpublished deletes it.
    let staged = staged?;
    synced?;
    let sdirs: Vec<PathBuf> = staged.iter().map(|s| s.sdir.clone()).collect();
    for s in staged {
        match s.publish() {
            Err(_) if deleted() => {} // deleted meanwhile, its directory with it
            done => done?,
        }
    }
    if deleted() {
        // Deleted while its record was published: the deletion may have removed the directory
        // before the record was in it. The record goes, and its directory if nothing else is
        // in it (never more: a shuffle registered again with the id may be using it).
        for sdir in sdirs {
            let _ = std::fs::remove_file(sdir.join(INDEX_FILE));
            let _ = std::fs::remove_dir(&sdir);
        }
    }
    Ok(record)
}

/// Syncs `files`' data: `fdatasync` of each, or one `syncfs` of a directory's file system
/// when it holds many of them.
fn sync_files(files: &[FileRef]) -> io::Result<()> {
    for (dir, files) in by_dir(files).values() {
        if files.len() > SYNCFS_ABOVE_FILES {
            let d = File::open(&dir.path)?;
            rustix::fs::syncfs(&d).map_err(io::Error::from)?;
        } else {
            // A file never written was never created: nothing of it to sync.
            for (f, file) in files.iter().filter_map(|f| Some((f, f.file()?))) {
                file.sync_data().map_err(|e| context(e, &f.path))?;
            }
        }
    }
    Ok(())
}

type ByDir<'a> = BTreeMap<usize, (Arc<DataDir>, Vec<&'a FileRef>)>;

fn by_dir(files: &[FileRef]) -> ByDir<'_> {
    let mut by_dir: ByDir<'_> = BTreeMap::new();
    for f in files {
        by_dir.entry(f.dir.index).or_insert_with(|| (f.dir.clone(), Vec::new())).1.push(f);
    }
    by_dir
}

/// Writes `record` to a temporary file on each directory that holds one of `files` that was
/// created (or, with none, on the one with most room), as [`persist`] says; they are synced and
/// named by [`StagedRecord::publish`].
fn stage_record(
    storage: &Storage,
    key: &ShuffleKey,
    record: &[u8],
    files: &[FileRef],
    deleted: impl Fn() -> bool,
) -> io::Result<Vec<StagedRecord>> {
    // A shuffle with no data at all still has a record (its readers must find it), on the
    // directory with most room.
    let mut dirs: Vec<(Arc<DataDir>, bool)> = by_dir(files)
        .into_values()
        .filter(|(_, files)| files.iter().any(|f| f.file().is_some()))
        .map(|(d, _)| (d, true))
        .collect();
    if dirs.is_empty() {
        // A full directory still takes a record of a few bytes; a failed one does not.
        let any = storage.dirs().iter().find(|d| !d.is_failed()).cloned();
        let Some(dir) = storage.choose(None).or(any) else {
            return Err(io::Error::other("no data directory is in service"));
        };
        dirs.push((dir, false));
    }
    let mut staged = Vec::new();
    for (dir, has_files) in dirs {
        let sdir = shuffle_dir(&dir, key);
        if deleted() {
            continue; // deleted meanwhile: leave nothing behind
        }
        if has_files {
            // Made with its files; never made again here (the deletion may be removing it).
            if !sdir.is_dir() {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("{}: the shuffle's directory is gone, with its files", sdir.display()),
                ));
            }
        } else {
            std::fs::create_dir_all(&sdir).map_err(|e| context(e, &sdir))?;
        }
        note_app_id(&dir.path, key.app_id());
        staged.push(StagedRecord::write(sdir, record)?);
    }
    Ok(staged)
}

/// Writes a committed shuffle's `record` anew on every data directory in service that holds
/// one (after partitions moved to the object store: the record says where they are now).
/// Blocking. `Err` when no directory holds a record (the shuffle was deleted meanwhile) or one
/// cannot be written.
pub fn rewrite(storage: &Storage, key: &ShuffleKey, record: &[u8]) -> io::Result<()> {
    let mut written = 0;
    for dir in storage.dirs().iter().filter(|d| !d.is_failed()) {
        let sdir = shuffle_dir(dir, key);
        if sdir.join(INDEX_FILE).is_file() {
            write_synced(&sdir, record)?;
            written += 1;
        }
    }
    if written == 0 {
        return Err(io::Error::other("no data directory holds the shuffle's commit record"));
    }
    Ok(())
}

fn context(e: io::Error, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

/// Writes `record` as `sdir/index` through a temporary file; syncs the file, then the shuffle's
/// directory and its parents up to the data directory (new directory entries).
fn write_synced(sdir: &Path, record: &[u8]) -> io::Result<()> {
    StagedRecord::write(sdir.to_path_buf(), record)?.publish()
}

/// A record written to a temporary file in its shuffle's directory, not yet synced nor named:
/// dropped unpublished, the file is deleted.
struct StagedRecord {
    sdir: PathBuf,
    tmp: Option<(PathBuf, File)>,
}

impl StagedRecord {
    fn write(sdir: PathBuf, record: &[u8]) -> io::Result<StagedRecord> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let tmp = sdir.join(format!("{INDEX_TMP_PREFIX}{}", NEXT.fetch_add(1, Ordering::Relaxed)));
        let f = std::fs::OpenOptions::new().write(true).create_new(true).open(&tmp);
        let f = f.map_err(|e| context(e, &sdir))?;
        let mut staged = StagedRecord { sdir, tmp: Some((tmp, f)) };
        if let Some((_, f)) = &mut staged.tmp {
            f.write_all(record).map_err(|e| context(e, &staged.sdir))?;
        }
        Ok(staged)
    }

    /// Syncs the record, names it `index`, and syncs the shuffle's directory and its parents
    /// up to the data directory.
    fn publish(mut self) -> io::Result<()> {
        let Some((tmp, f)) = self.tmp.take() else { return Ok(()) };
        let named = f.sync_data().and_then(|()| std::fs::rename(&tmp, self.sdir.join(INDEX_FILE)));
        if let Err(e) = named {
            let _ = std::fs::remove_file(&tmp);
            return Err(context(e, &self.sdir));
        }
        let mut at = Some(self.sdir.as_path());
        for _ in 0..3 {
            let Some(d) = at else { break };
            File::open(d).and_then(|d| d.sync_all()).map_err(|e| context(e, d))?;
            at = d.parent();
        }
        Ok(())
    }
}

impl Drop for StagedRecord {
    fn drop(&mut self) {
        if let Some((tmp, _)) = self.tmp.take() {
            let _ = std::fs::remove_file(tmp);
        }
    }
}

/// What a start found on the data directories.
#[derive(Debug, Default)]
pub struct Recovered {
    /// Committed shuffles, readable again (some partitions may be lost).
    pub shuffles: Vec<Shuffle<FileRef>>,
    /// Shuffles never committed, whose files were deleted.
    pub uncommitted: usize,
    /// Partitions reported lost (damaged record entries, missing or short files), shuffles
    /// whose record could not be read at all, and application directories that could not be
    /// listed.
    pub lost: usize,
    /// Applications one of whose directories could not be listed, and why: which of their
    /// shuffles it held is not known, so a reader of any shuffle of theirs not recovered is
    /// told it is lost (`DATA_LOST`), not that it is unknown. Its files are left as they are
    /// (a restart that can list the directory serves them again).
    pub unlisted: Vec<(String, String)>,
}

/// A shuffle's directories found at start, one per data directory holding any of it.
type Places = Vec<(Arc<DataDir>, PathBuf)>;

/// Reads back every shuffle on the directories in service (see the module's notes). Blocking.
pub fn recover(storage: &Storage) -> Recovered {
    // (app directory, shuffle) → its directories, one per data directory holding any of it.
    let mut found: BTreeMap<(String, u32), Places> = BTreeMap::new();
    let mut unlisted = Vec::new();
    for dir in storage.dirs().iter().filter(|d| !d.is_failed()) {
        for (app, app_path) in subdirs(&dir.path) {
            if app == RECYCLE_DIR || app.starts_with('.') {
                continue;
            }
            if !could_be_app_dir(&app) {
                tracing::debug!(path = %app_path.display(), "not an application directory; left alone");
                continue;
            }
            let shuffles = match list_subdirs(&app_path) {
                Ok(shuffles) => shuffles,
                Err(e) => {
                    unlisted.extend(unlisted_app(&dir.path, &app, &app_path, &e));
                    continue;
                }
            };
            for (shuffle, path) in shuffles {
                match shuffle_id_of_dir(&shuffle) {
                    Some(id) => {
                        found.entry((app.clone(), id)).or_default().push((dir.clone(), path))
                    }
                    None => tracing::warn!(path = %path.display(),
                        "not a shuffle directory; left alone"),
                }
            }
        }
    }
    let mut out = Recovered { lost: unlisted.len(), unlisted, ..Recovered::default() };
    for ((mut app, shuffle_id), mut places) in found {
        let mut records: Vec<Result<Decoded, String>> = Vec::new();
        for (_, path) in &places {
            remove_tmp_records(path);
            match std::fs::read(path.join(INDEX_FILE)) {
                Ok(bytes) => records.push(decode_record(&bytes).and_then(|d| {
                    let named =
                        app_dir_name(&d.app_id) == app || legacy_app_dir_name(&d.app_id) == app;
                    if named && d.shuffle_id == shuffle_id {
                        Ok(d)
                    } else {
                        Err(format!("it is of shuffle {} of {}", d.shuffle_id, d.app_id))
                    }
                })),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => records.push(Err(format!("cannot read it: {e}"))),
            }
        }
        // A shuffle a server before the one-to-one names wrote (`a.b`'s under `a_b`): moved to
        // the directory its id has now, so that it is served, found and deleted like any other.
        let known_id = records.iter().flatten().next().map(|d| d.app_id.clone());
        let renamed = records.iter().flatten().map(|d| app_dir_name(&d.app_id)).find(|n| *n != app);
        if let Some(new) = renamed {
            // The same shuffle under both names (an older server's copy left beside this one's):
            // the one under today's name stands, recovered on its own; the other is left alone.
            if let Some((_, taken)) =
                places.iter().find(|(d, _)| d.path.join(&new).join(shuffle_id.to_string()).exists())
            {
                tracing::warn!(path = %taken.display(), to = %new, shuffle = shuffle_id,
                    "an older server's shuffle directory is left alone: its shuffle is also under \
                     its application's name of today");
                continue;
            }
            match move_shuffle_dirs(&places, &new, shuffle_id) {
                Ok(moved) => {
                    tracing::info!(from = %app, to = %new, shuffle = shuffle_id,
                        "shuffle directory of an older server moved to its application's name");
                    for (dir, _) in &places {
                        remove_app_dir(&dir.path.join(&app));
                    }
                    (app, places) = (new, moved);
                }
                Err(why) => records = vec![Err(why)],
            }
        }
        if records.is_empty() {
            for (_, path) in &places {
                if let Err(e) = std::fs::remove_dir_all(path) {
                    tracing::warn!(path = %path.display(), error = %e,
                        "cannot delete an uncommitted shuffle's files");
                }
            }
            for (dir, _) in &places {
                remove_app_dir(&dir.path.join(&app));
            }
            tracing::info!(app = %app, shuffle = shuffle_id,
                "shuffle was never committed; its files are deleted");
            out.uncommitted += 1;
            continue;
        }
        let merged = merge(records);
        // A registration parked at a clean stop (open, empty) with data files beside it took
        // pushes after a restart and was never committed: it is garbage, like any uncommitted
        // shuffle (readers of it are told it is unknown, never served part of it).
        if merged.as_ref().is_ok_and(|d| !d.sealed) && places.iter().any(|(_, p)| has_data_files(p))
        {
            for (dir, path) in &places {
                let _ = std::fs::remove_dir_all(path);
                remove_app_dir(&dir.path.join(&app));
            }
            tracing::info!(app = %app, shuffle = shuffle_id,
                "shuffle took pushes after a restart and was never committed; its files are deleted");
            out.uncommitted += 1;
            continue;
        }
        if let Some(id) = &known_id {
            // A shuffle of an older server, or one moved to a shortened name above: noted as
            // the commit notes it, for a restart that finds its record lost.
            for (dir, _) in &places {
                note_app_id(&dir.path, id);
            }
        }
        let shuffle = match merged {
            Ok(d) => Shuffle::recovered(d, |pid, n, name, needed| {
                open_partition_file(storage, &app, shuffle_id, (pid, n), name, needed)
            }),
            Err(why) => {
                tracing::error!(app = %app, shuffle = shuffle_id, reason = %why,
                    "commit record unreadable: the shuffle is reported lost");
                out.lost += 1;
                // Keyed by the application's own id (from a readable copy of the record, from
                // the directory's name, or for a shortened name from the file beside it that
                // holds the id), so that its readers are told the shuffle is lost, not unknown.
                let app_id = known_id
                    .or_else(|| app_id_of_dir(&app))
                    .or_else(|| noted_app_id(places.iter().map(|(d, _)| d.path.as_path()), &app))
                    .unwrap_or_else(|| app.clone());
                Shuffle::lost_at_start(ShuffleKey::new(&app_id, shuffle_id), why)
            }
        };
        for (pid, why) in shuffle.lost_partitions() {
            tracing::error!(shuffle = %shuffle.key(), partition = pid, reason = %why,
                "partition lost at restart; its readers get DATA_LOST");
            out.lost += 1;
        }
        out.shuffles.push(shuffle);
    }
    out
}

/// The shuffle id a directory named `name` is for: only the id as a shuffle's directory is
/// named (`7`, never `07` or `+7`, which `parse` takes too: two directories would be taken for
/// the same shuffle, and a deletion, which removes only `7`, would leave the other behind).
fn shuffle_id_of_dir(name: &str) -> Option<u32> {
    name.parse::<u32>().ok().filter(|id| id.to_string() == name)
}

/// Moves each of a shuffle's directories (`places`) to `<data dir>/<app>/<shuffle_id>`; the new
/// places, or why not (a failed rename: those moved stay moved, and the shuffle is reported
/// lost).
fn move_shuffle_dirs(places: &Places, app: &str, shuffle_id: u32) -> Result<Places, String> {
    let mut moved = Vec::with_capacity(places.len());
    for (dir, path) in places {
        let to = dir.path.join(app).join(shuffle_id.to_string());
        if to.exists() {
            return Err(format!("{} exists; {} cannot move there", to.display(), path.display()));
        }
        std::fs::create_dir_all(dir.path.join(app))
            .and_then(|()| std::fs::rename(path, &to))
            .map_err(|e| format!("cannot move {} to {}: {e}", path.display(), to.display()))?;
        moved.push((dir.clone(), to));
    }
    Ok(moved)
}

/// Whether a shuffle directory holds a partition file.
fn has_data_files(sdir: &Path) -> bool {
    std::fs::read_dir(sdir).is_ok_and(|entries| {
        entries.filter_map(Result::ok).any(|e| e.path().extension().is_some_and(|x| x == "data"))
    })
}

/// An application directory `app` (at `path`, on data directory `root`) that could not be
/// listed: logged, and its application's id with why, when the id can be told (from the name,
/// or for a shortened one from the note in it, which may still be readable).
fn unlisted_app(root: &Path, app: &str, path: &Path, e: &io::Error) -> Option<(String, String)> {
    let id = app_id_of_dir(app).or_else(|| noted_app_id([root], app));
    match &id {
        Some(id) => tracing::error!(path = %path.display(), app = %id, error = %e,
            "cannot list an application directory at restart: its shuffles there are not \
             recovered (their readers are told they are lost) and its files are left as they are"),
        None => tracing::error!(path = %path.display(), error = %e,
            "cannot list an application directory at restart, nor tell its application's id \
             (a shortened name whose note cannot be read): its shuffles there are not \
             recovered and its files are left as they are"),
    }
    Some((id?, format!("{} could not be listed at restart: {e}", path.display())))
}

/// The subdirectories of a data directory, by name. One that cannot be listed (or an entry
/// that cannot be read) is logged as an error: the shuffles under it are not recovered, and
/// their readers will be told they are unknown.
fn subdirs(path: &Path) -> Vec<(String, PathBuf)> {
    list_subdirs(path).unwrap_or_else(|e| {
        tracing::error!(path = %path.display(), error = %e,
            "cannot list a directory at restart: the shuffles under it are not recovered");
        Vec::new()
    })
}

/// The subdirectories of `path`, by name; an entry that cannot be read is logged as an error
/// (what it holds is not recovered).
fn list_subdirs(path: &Path) -> io::Result<Vec<(String, PathBuf)>> {
    let entries = std::fs::read_dir(path)?;
    Ok(entries
        .filter_map(|e| match e {
            Ok(e) => Some(e),
            Err(err) => {
                tracing::error!(path = %path.display(), error = %err,
                    "cannot read a directory entry at restart: what it holds is not recovered");
                None
            }
        })
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| Some((e.file_name().into_string().ok()?, e.path())))
        .collect())
}

fn remove_tmp_records(sdir: &Path) {
    let Ok(entries) = std::fs::read_dir(sdir) else { return };
    for e in entries.filter_map(Result::ok) {
        if e.file_name().to_string_lossy().starts_with(INDEX_TMP_PREFIX) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// One record from the copies on several directories: the newest readable one (by its stamp:
/// the latest registration of the shuffle key, the last record made of it; of copies alike, a
/// commit record over a parked registration left by an earlier stop), each damaged partition
/// entry of it taken from another copy of the same registration where that one is sound.
/// Copies differ when a directory failed while the others were written again (a move to the
/// object store) and came back at the restart, or held a deleted registration's record.
fn merge(records: Vec<Result<Decoded, String>>) -> Result<Decoded, String> {
    let mut good = Vec::new();
    let mut why = String::new();
    for r in records {
        match r {
            Ok(d) => good.push(d),
            Err(e) => why = e,
        }
    }
    // Newest first; the sort is stable, so of copies alike the first directory's leads.
    good.sort_by_key(|d| std::cmp::Reverse((d.stamp, d.sealed)));
    let mut copies = good.into_iter();
    let mut best = copies.next().ok_or(why)?;
    for other in copies {
        // Another registration's entries are of other files; a parked registration's (empty)
        // would stand for data the commit wrote.
        let same = other.stamp.incarnation == best.stamp.incarnation && other.sealed == best.sealed;
        if !same || other.partitions.len() != best.partitions.len() {
            continue;
        }
        for (mine, theirs) in best.partitions.iter_mut().zip(other.partitions) {
            if mine.is_err() && theirs.is_ok() {
                *mine = theirs;
            }
        }
    }
    Ok(best)
}

/// Opens file number `n` of partition `pid`, on the data directory `name` (its path), checking
/// that it holds at least `needed` bytes. A file no chunk is in (`needed` 0: its creation failed
/// and the partition went on in another file, say) is not opened: whether it exists, or its
/// directory still does, costs the partition nothing.
fn open_partition_file(
    storage: &Storage,
    app: &str,
    shuffle_id: u32,
    (pid, n): (u32, u32),
    name: &str,
    needed: u64,
) -> Result<FileRef, String> {
    let configured = storage.dirs().iter().find(|d| d.path.display().to_string() == name);
    if needed == 0 {
        let path = Path::new(name).join(app).join(shuffle_id.to_string());
        let path = path.join(format!("{pid}-{n}.data"));
        // Any directory will do for one never written to: retired, it is never created.
        let Some(dir) = configured.or(storage.dirs().first()) else {
            return Err("no data directory is configured".into());
        };
        let empty = DataFile::to_create(dir.clone(), path);
        empty.retire();
        return Ok(Arc::new(empty));
    }
    let Some(dir) = configured else {
        return Err(format!("its data directory {name} is no longer configured"));
    };
    if dir.is_failed() {
        return Err(format!("its data directory {name} failed"));
    }
    let path = dir.path.join(app).join(shuffle_id.to_string()).join(format!("{pid}-{n}.data"));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let len = file.metadata().map_err(|e| format!("{}: {e}", path.display()))?.len();
    if len < needed {
        return Err(format!(
            "{} holds {len} bytes, its chunks need {needed} (truncated)",
            path.display()
        ));
    }
    Ok(Arc::new(DataFile::opened(Arc::new(file), dir.clone(), path)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recorded_file_no_chunk_is_in_is_not_needed_at_restart() {
        // A partition's first file failed to be created and its data went to a second one; the
        // record names both. Restarting, the missing first file (or its directory, gone or
        // failed) must not make the partition lost.
        let root = tempfile::tempdir().unwrap();
        let storage = Storage::open(&[root.path().to_path_buf()], 0, 0);
        let here = root.path().display().to_string();
        let gone = "/no/such/data/dir";
        for name in [here.as_str(), gone] {
            let f = open_partition_file(&storage, "app", 7, (3, 0), name, 0)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(f.file().is_none(), "not opened");
            assert!(f.open().is_err(), "and never created");
        }
        assert!(!root.path().join("app").exists(), "nothing made on disk");
        // A file chunks are in is needed, and must be long enough.
        let e = open_partition_file(&storage, "app", 7, (3, 1), &here, 10).unwrap_err();
        assert!(e.contains("3-1.data"), "{e}");
        let e = open_partition_file(&storage, "app", 7, (3, 1), gone, 10).unwrap_err();
        assert!(e.contains("no longer configured"), "{e}");
        let p = root.path().join("app/7/3-1.data");
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, [1u8; 5]).unwrap();
        let e = open_partition_file(&storage, "app", 7, (3, 1), &here, 10).unwrap_err();
        assert!(e.contains("truncated"), "{e}");
        assert!(open_partition_file(&storage, "app", 7, (3, 1), &here, 5).is_ok());
    }

    #[test]
    fn the_newest_copy_of_a_record_is_trusted_and_patched_only_from_its_own_registration() {
        let key = ShuffleKey::new("app", 7);
        let first = Shuffle::<u32>::new(key.clone(), 1, 2, 1 << 20);
        let (r0, r1) =
            (first.commit_record(|f| f.to_string()), first.commit_record(|f| f.to_string()));
        let decoded = |r: &[u8]| decode_record(r).unwrap();
        // A copy left on a directory that failed while the record was written again: whatever
        // the order the directories are read in, the later record stands.
        for copies in [[&r0, &r1], [&r1, &r0]] {
            let merged = merge(copies.iter().map(|r| Ok(decoded(r))).collect()).unwrap();
            assert_eq!(merged.stamp, decoded(&r1).stamp, "the stale copy was trusted");
        }
        assert!(decoded(&r1).stamp > decoded(&r0).stamp);
        // The key deleted and registered again: the new registration's record stands, even
        // with fewer records made of it.
        let again = Shuffle::<u32>::new(key, 1, 2, 1 << 20).commit_record(|f| f.to_string());
        let merged = merge(vec![Ok(decoded(&r1)), Ok(decoded(&again))]).unwrap();
        assert_eq!(merged.stamp, decoded(&again).stamp);
        // A damaged entry is taken from an older copy of the same registration, never from
        // another registration's.
        let damaged = |r: &[u8]| {
            let mut d = decoded(r);
            d.partitions[1] = Err("damaged".into());
            d
        };
        let merged = merge(vec![Ok(damaged(&r1)), Ok(decoded(&r0))]).unwrap();
        assert!(merged.partitions[1].is_ok(), "not patched from its own registration's copy");
        let merged = merge(vec![Ok(damaged(&again)), Ok(decoded(&r1))]).unwrap();
        assert!(merged.partitions[1].is_err(), "patched from another registration's copy");
    }

    #[test]
    fn only_a_shuffles_own_directory_name_is_taken_for_it() {
        for (name, id) in [("7", Some(7)), ("0", Some(0)), ("4294967295", Some(u32::MAX))] {
            assert_eq!(shuffle_id_of_dir(name), id, "{name}");
        }
        for name in ["07", "+7", "00", "-1", "7 ", "4294967296", "", "x"] {
            assert_eq!(shuffle_id_of_dir(name), None, "{name}");
        }
    }

    #[test]
    fn a_commit_of_a_shuffle_deleted_meanwhile_leaves_nothing_behind() {
        let root = tempfile::tempdir().unwrap();
        let storage = Storage::open(&[root.path().to_path_buf()], 0, 0);
        let key = ShuffleKey::new("app", 7);
        let sdir = shuffle_dir(&storage.dirs()[0], &key);
        // Deleted before the record is staged: no directory is made for it.
        persist(&storage, &key, || b"record".to_vec(), &[], || true).unwrap();
        assert!(!sdir.exists(), "a deleted shuffle's directory made again");
        // Deleted once the record is published: the record goes, and its empty directory.
        let calls = std::cell::Cell::new(0);
        let deleted_after_staging = || {
            calls.set(calls.get() + 1);
            calls.get() > 1
        };
        persist(&storage, &key, || b"record".to_vec(), &[], deleted_after_staging).unwrap();
        assert!(!sdir.exists(), "a deleted shuffle's record left behind");
        // Not deleted: the record stays.
        persist(&storage, &key, || b"record".to_vec(), &[], || false).unwrap();
        assert_eq!(std::fs::read(sdir.join(INDEX_FILE)).unwrap(), b"record");
    }

    #[test]
    fn a_rewritten_record_replaces_every_copy_and_needs_one() {
        let (a, b, c) = (
            tempfile::tempdir().unwrap(),
            tempfile::tempdir().unwrap(),
            tempfile::tempdir().unwrap(),
        );
        let paths = [a.path().to_path_buf(), b.path().to_path_buf(), c.path().to_path_buf()];
        let storage = Storage::open(&paths, 0, 0);
        let key = ShuffleKey::new("app/1", 3);
        assert!(rewrite(&storage, &key, b"new").is_err(), "no copy to replace");
        // Copies on the first two directories; the third holds nothing of the shuffle.
        for d in &storage.dirs()[..2] {
            let sdir = shuffle_dir(d, &key);
            std::fs::create_dir_all(&sdir).unwrap();
            std::fs::write(sdir.join(INDEX_FILE), b"old").unwrap();
        }
        rewrite(&storage, &key, b"new").unwrap();
        for d in &storage.dirs()[..2] {
            let sdir = shuffle_dir(d, &key);
            assert_eq!(std::fs::read(sdir.join(INDEX_FILE)).unwrap(), b"new");
            let left: Vec<_> = std::fs::read_dir(&sdir).unwrap().collect();
            assert_eq!(left.len(), 1, "a temporary record left behind");
        }
        assert!(!shuffle_dir(&storage.dirs()[2], &key).exists(), "a copy where there was none");
    }
}
