//! The applications a server holds shuffles of, and when each was last heard from.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use sluice_proto::message::RegisterShuffle;
use sluice_proto::ErrorCode;

use super::key::ShuffleKey;
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
}

impl<F> App<F> {
    fn new(now: Instant) -> App<F> {
        App { last_seen: now, shuffles: HashMap::new(), unlisted: None }
    }
}

/// A shuffle that was deleted: what its files were, for the shell to remove.
#[derive(Debug)]
pub struct Deleted<F> {
    /// Which shuffle.
    pub key: ShuffleKey,
    /// Its partitions' current files, which may be recycled.
    pub files: Vec<F>,
    /// Keys of the objects in the object store that held its offloaded partitions.
    pub objects: Vec<String>,
}

/// Every application and its shuffles. One lock for the map: a lookup per request, held for a
/// hash probe and a reference count.
#[derive(Debug)]
pub struct Apps<F> {
    apps: Mutex<HashMap<String, App<F>>>,
}

impl<F> Default for Apps<F> {
    fn default() -> Self {
        Apps { apps: Mutex::new(HashMap::new()) }
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
        let app = apps.entry(r.app_id.clone()).or_insert_with(|| App::new(now));
        app.last_seen = now;
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
                let key = ShuffleKey::new(&r.app_id, r.shuffle_id);
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
            (None, Some(why)) if to_read => Err(Refusal::new(
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
            app.shuffles.remove(&shuffle_id)
        };
        Ok(removed.map(|s| delete(&s)))
    }

    /// Removes an application and deletes its shuffles (`None`: it was not registered). The
    /// deletions run outside the map's lock.
    pub fn remove(&self, app_id: &str) -> Option<Vec<Deleted<F>>> {
        let app = self.apps.lock().remove(app_id)?;
        Some(app.shuffles.values().map(|s| delete(s)).collect())
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

fn delete<F: Clone>(s: &Shuffle<F>) -> Deleted<F> {
    let (files, objects) = s.delete();
    Deleted { key: s.key().clone(), files, objects }
}
