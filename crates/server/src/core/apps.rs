//! The applications a server holds shuffles of, and when each was last heard from.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use sluice_proto::message::RegisterShuffle;
use sluice_proto::ErrorCode;

use super::key::ShuffleKey;
use super::partition::Removal;
use super::record::Stamp;
use super::refusal::Refusal;
use super::report::{idle_ms, AppReport};
use super::shuffle::Shuffle;

/// A registered application.
#[derive(Debug)]
struct App<F> {
    /// When a request of the application last arrived (passed in: the core reads no clock).
    last_seen: Instant,
    shuffles: HashMap<u32, Arc<Shuffle<F>>>,
    /// Why a directory of the application could not be listed at start (see
    /// [`Apps::insert_unlisted`]).
    unlisted: Option<Arc<str>>,
    /// Shuffles of an unlisted application unregistered since the start: unknown, not lost.
    gone: HashSet<u32>,
}

impl<F> App<F> {
    fn new(now: Instant) -> App<F> {
        App { last_seen: now, shuffles: HashMap::new(), unlisted: None, gone: HashSet::new() }
    }
}

/// Shuffles whose files are being deleted (see [`Deleted`]).
type Deleting = Arc<Mutex<HashSet<ShuffleKey>>>;

/// A shuffle that was deleted: what its files were, for the shell to remove.
#[derive(Debug)]
pub struct Deleted<F> {
    /// Which shuffle.
    pub key: ShuffleKey,
    /// Its partitions' current files, which may be recycled.
    pub files: Vec<F>,
    /// Their earlier files, to retire (never created from now on), not recycled.
    pub older: Vec<F>,
    /// Its record writers' lock ([`Shuffle::record_writer`]), held while its files are removed.
    record: Arc<Mutex<Stamp>>,
    /// Keys of the objects in the object store that held its offloaded partitions.
    pub objects: Vec<String>,
    /// Until this is dropped (with the rest, once the shell has removed the files), the
    /// shuffle counts as being deleted: registering its key again is refused
    /// ([`Apps::is_deleting`]), so that a new shuffle's files never meet the old one's removal.
    _deleting: DeletingMark,
}

impl<F> Deleted<F> {
    /// The lock of its commit record's writers: held while the shuffle's files are removed,
    /// it waits for a record being written to be done and keeps another from being written (a
    /// writer that takes it next finds the shuffle deleted and writes none), so that no record
    /// lands in a directory after its removal, where a shuffle registered again with the key
    /// would find it.
    pub fn record_writers(&self) -> Arc<Mutex<Stamp>> {
        self.record.clone()
    }
}

/// Holds a deleted shuffle's key among those being deleted; dropping it ends that.
#[derive(Debug)]
pub struct DeletingMark {
    key: ShuffleKey,
    set: Deleting,
}

impl Drop for DeletingMark {
    fn drop(&mut self) {
        self.set.lock().remove(&self.key);
    }
}

/// Every application and its shuffles. One lock for the map: a lookup per request, held for a
/// hash probe and a reference count.
#[derive(Debug)]
pub struct Apps<F> {
    apps: Mutex<HashMap<String, App<F>>>,
    /// Keys of deleted shuffles whose files are still being removed; taken inside `apps`'s
    /// lock where both are (a key enters it as its shuffle leaves the map).
    deleting: Deleting,
    /// Most partitions an application's shuffles may hold together ([`Self::with_max_partitions_per_app`]).
    max_app_partitions: u64,
}

impl<F> Default for Apps<F> {
    fn default() -> Self {
        Apps {
            apps: Mutex::new(HashMap::new()),
            deleting: Arc::default(),
            max_app_partitions: u64::MAX,
        }
    }
}

impl<F> Apps<F> {
    /// Refuses a registration that would take an application's shuffles past `n` partitions
    /// together: each partition's state is allocated at registration, so a tenant registering
    /// shuffle after shuffle would otherwise take the server's memory with a few bytes each.
    pub fn with_max_partitions_per_app(mut self, n: u64) -> Self {
        self.max_app_partitions = n;
        self
    }
}

impl<F: Clone> Apps<F> {
    /// Notes that `app_id` was heard from at `now` (registering it if new).
    pub fn touch(&self, app_id: &str, now: Instant) {
        let mut apps = self.apps.lock();
        match apps.get_mut(app_id) {
            Some(a) => a.last_seen = now,
            None => {
                apps.insert(app_id.to_owned(), App::new(now));
            }
        }
    }

    /// Holds a shuffle read back at start, as if its application had been heard from at `now`
    /// (it expires like any other if no heartbeat follows). A shuffle of the same key already
    /// held stays.
    pub fn insert_recovered(&self, shuffle: Shuffle<F>, now: Instant) {
        let mut apps = self.apps.lock();
        let app = apps.entry(shuffle.key().app_id().to_owned()).or_insert_with(|| App::new(now));
        app.shuffles.entry(shuffle.key().shuffle_id()).or_insert_with(|| Arc::new(shuffle));
    }

    /// Holds an application one of whose directories could not be listed at start (`why`),
    /// as if heard from at `now`: which of its shuffles the directory held is not known, so a
    /// reader of any of its shuffles not held is told the shuffle is lost
    /// ([`Self::shuffle_to_read`]), not that it is unknown.
    pub fn insert_unlisted(&self, app_id: &str, why: &str, now: Instant) {
        let mut apps = self.apps.lock();
        let app = apps.entry(app_id.to_owned()).or_insert_with(|| App::new(now));
        app.unlisted.get_or_insert_with(|| why.into());
    }

    /// Registers a shuffle (and its application, if new). Registering it again with the same
    /// sizes is a no-op; with other sizes, a refusal.
    pub fn register_shuffle(
        &self,
        r: &RegisterShuffle,
        chunk_bytes: u64,
        split_bytes: u64,
        now: Instant,
    ) -> Result<(), Refusal> {
        let mut apps = self.apps.lock();
        let key = ShuffleKey::new(&r.app_id, r.shuffle_id);
        if self.deleting.lock().contains(&key) {
            let why = format!("{key} was deleted and its files are still being removed");
            return Err(Refusal::new(ErrorCode::Internal, why));
        }
        let app = apps.entry(r.app_id.clone()).or_insert_with(|| App::new(now));
        app.last_seen = now;
        app.gone.remove(&r.shuffle_id);
        match app.shuffles.get(&r.shuffle_id) {
            Some(s) => {
                s.check_not_lost()?;
                if s.num_partitions() != r.num_partitions || s.num_maps() != r.num_maps {
                    return Err(Refusal::new(
                        ErrorCode::InvalidRequest,
                        format!("{} is already registered with other sizes", s.key()),
                    ));
                }
                Ok(())
            }
            None => {
                let held: u64 = app.shuffles.values().map(|s| u64::from(s.num_partitions())).sum();
                let limit = self.max_app_partitions;
                if held + u64::from(r.num_partitions) > limit {
                    let why = format!(
                        "{key} not registered: {} partitions with the {held} its application's \
                         shuffles hold here would pass max_partitions_per_app ({limit}); \
                         unregister shuffles it no longer needs",
                        r.num_partitions
                    );
                    return Err(Refusal::new(ErrorCode::QuotaExceeded, why));
                }
                let s = Shuffle::new(key, r.num_maps, r.num_partitions, chunk_bytes)
                    .with_split_bytes(split_bytes);
                app.shuffles.insert(r.shuffle_id, Arc::new(s));
                Ok(())
            }
        }
    }

    /// A registered shuffle.
    pub fn shuffle(&self, app_id: &str, shuffle_id: u32) -> Result<Arc<Shuffle<F>>, Refusal> {
        self.lookup(app_id, shuffle_id, false)
    }

    /// A registered shuffle, for its readers: one not held, of an application a directory of
    /// which could not be listed at start, is lost (it may have been there), not unknown.
    pub fn shuffle_to_read(
        &self,
        app_id: &str,
        shuffle_id: u32,
    ) -> Result<Arc<Shuffle<F>>, Refusal> {
        self.lookup(app_id, shuffle_id, true)
    }

    fn lookup(
        &self,
        app_id: &str,
        shuffle_id: u32,
        to_read: bool,
    ) -> Result<Arc<Shuffle<F>>, Refusal> {
        let apps = self.apps.lock();
        let Some(app) = apps.get(app_id) else {
            let why = format!("application {app_id} is not registered");
            return Err(Refusal::new(ErrorCode::UnknownApp, why));
        };
        match (app.shuffles.get(&shuffle_id), &app.unlisted) {
            (Some(s), _) => Ok(s.clone()),
            (None, Some(why)) if to_read && !app.gone.contains(&shuffle_id) => Err(Refusal::new(
                ErrorCode::DataLost,
                format!("shuffle {shuffle_id} of {app_id} is not held: {why}"),
            )),
            (None, _) => Err(Refusal::new(
                ErrorCode::UnknownShuffle,
                format!("shuffle {shuffle_id} of {app_id} is not registered"),
            )),
        }
    }

    /// Unregisters and deletes a shuffle (`None`: it was not registered).
    pub fn unregister_shuffle(
        &self,
        app_id: &str,
        shuffle_id: u32,
    ) -> Result<Option<Deleted<F>>, Refusal> {
        let removed = {
            let mut apps = self.apps.lock();
            let Some(app) = apps.get_mut(app_id) else {
                let why = format!("application {app_id} is not registered");
                return Err(Refusal::new(ErrorCode::UnknownApp, why));
            };
            if app.unlisted.is_some() {
                app.gone.insert(shuffle_id);
            }
            app.shuffles.remove(&shuffle_id).map(|s| (self.mark_deleting(&s), s))
        };
        Ok(removed.map(|(mark, s)| delete(&s, mark)))
    }

    /// Removes an application and deletes its shuffles (`None`: it was not registered). The
    /// deletions run outside the map's lock.
    pub fn remove(&self, app_id: &str) -> Option<Vec<Deleted<F>>> {
        self.remove_if(app_id, |_| true)
    }

    /// [`Self::remove`] if the application is still expired at `now` (not heard from for more
    /// than `limit`): one heard from since [`Self::expired`] named it stays.
    pub fn remove_expired(
        &self,
        app_id: &str,
        now: Instant,
        limit: Duration,
    ) -> Option<Vec<Deleted<F>>> {
        self.remove_if(app_id, |a| now.saturating_duration_since(a.last_seen) > limit)
    }

    fn remove_if(&self, app_id: &str, cond: impl Fn(&App<F>) -> bool) -> Option<Vec<Deleted<F>>> {
        let marked: Vec<_> = {
            let mut apps = self.apps.lock();
            if !cond(apps.get(app_id)?) {
                return None;
            }
            let app = apps.remove(app_id)?;
            app.shuffles.into_values().map(|s| (self.mark_deleting(&s), s)).collect()
        };
        Some(marked.into_iter().map(|(mark, s)| delete(&s, mark)).collect())
    }

    /// Counts `s` as being deleted until the mark is dropped; called inside the map's lock, as
    /// `s` leaves it.
    fn mark_deleting(&self, s: &Shuffle<F>) -> DeletingMark {
        self.deleting.lock().insert(s.key().clone());
        DeletingMark { key: s.key().clone(), set: self.deleting.clone() }
    }

    /// Whether shuffle `shuffle_id` of `app_id` (or, with `None`, any shuffle of it) was
    /// deleted and its files are still being removed.
    pub fn is_deleting(&self, app_id: &str, shuffle_id: Option<u32>) -> bool {
        let deleting = self.deleting.lock();
        match shuffle_id {
            Some(id) => deleting.contains(&ShuffleKey::new(app_id, id)),
            None => deleting.iter().any(|k| k.app_id() == app_id),
        }
    }

    /// The applications not heard from for more than `limit` before `now`.
    pub fn expired(&self, now: Instant, limit: Duration) -> Vec<String> {
        let apps = self.apps.lock();
        let old = apps.iter().filter(|(_, a)| now.saturating_duration_since(a.last_seen) > limit);
        old.map(|(id, _)| id.clone()).collect()
    }

    /// Every application with what its shuffles hold, at `now`, ordered by id.
    pub fn report(&self, now: Instant) -> Vec<AppReport> {
        let apps: Vec<(String, App<F>)> = {
            let apps = self.apps.lock();
            let copy = |a: &App<F>| App {
                last_seen: a.last_seen,
                shuffles: a.shuffles.clone(),
                unlisted: a.unlisted.clone(),
                gone: HashSet::new(),
            };
            apps.iter().map(|(id, a)| (id.clone(), copy(a))).collect()
        };
        // Partitions are locked one at a time, outside the map's lock.
        let mut out: Vec<AppReport> = apps
            .into_iter()
            .map(|(app_id, a)| {
                let mut shuffles: Vec<_> = a.shuffles.values().map(|s| s.report()).collect();
                shuffles.sort_by_key(|s| s.shuffle_id);
                AppReport { app_id, idle_ms: idle_ms(now, a.last_seen), shuffles }
            })
            .collect();
        out.sort_by(|a, b| a.app_id.cmp(&b.app_id));
        out
    }

    /// Every shuffle held.
    pub fn shuffles(&self) -> Vec<Arc<Shuffle<F>>> {
        let apps = self.apps.lock();
        apps.values().flat_map(|a| a.shuffles.values().cloned()).collect()
    }

    /// Bytes the metadata of every shuffle held takes on the heap (see
    /// [`Shuffle::metadata_bytes`]); partitions are locked one at a time, outside the map's lock.
    pub fn metadata_bytes(&self) -> u64 {
        self.shuffles().iter().map(|s| s.metadata_bytes()).sum()
    }

    /// Shuffles held, of every application.
    pub fn shuffles_held(&self) -> usize {
        self.apps.lock().values().map(|a| a.shuffles.len()).sum()
    }

    /// Shuffles held that are not committed and hold data: what a restart would lose.
    pub fn unsealed(&self) -> usize {
        let apps = self.apps.lock();
        let all = apps.values().flat_map(|a| a.shuffles.values());
        all.filter(|s| s.unsealed_with_data()).count()
    }

    /// Partitions of all shuffles held.
    pub fn partitions_held(&self) -> u32 {
        let apps = self.apps.lock();
        apps.values().flat_map(|a| a.shuffles.values()).map(|s| s.num_partitions()).sum()
    }
}

fn delete<F: Clone>(s: &Shuffle<F>, deleting: DeletingMark) -> Deleted<F> {
    let Removal { current: files, older, objects } = s.delete();
    let record = s.record_lock();
    Deleted { key: s.key().clone(), files, older, objects, record, _deleting: deleting }
}
