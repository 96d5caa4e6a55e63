//! Open read streams: what each serves of each chunk, until it is closed, its shuffle is
//! deleted, or it goes idle.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use sluice_proto::ErrorCode;

use super::refusal::Refusal;
use super::shuffle::Shuffle;

/// An open stream. It belongs to no connection: a reader may fetch its chunks over any pooled
/// connection, so it lives until closed, its shuffle's deletion, or idleness.
#[derive(Debug)]
struct Stream<F, B> {
    shuffle: Arc<Shuffle<F>>,
    /// What each chunk fetch sends, built when the stream opened (`B` is the shell's body).
    chunks: Vec<B>,
    last_used: Instant,
}

/// Every open stream, by id.
#[derive(Debug)]
pub struct Streams<F, B> {
    open: Mutex<HashMap<u64, Stream<F, B>>>,
    next_id: AtomicU64,
}

impl<F, B> Default for Streams<F, B> {
    fn default() -> Self {
        Streams::starting_at(1)
    }
}

impl<F, B> Streams<F, B> {
    /// No stream open; the first to open gets id `first`. A restarted server must not hand out
    /// the ids of its previous run: a reader still holding one would fetch another stream's
    /// chunks. The shell picks `first` above every id an earlier run can have used.
    pub fn starting_at(first: u64) -> Self {
        Streams { open: Mutex::new(HashMap::new()), next_id: AtomicU64::new(first.max(1)) }
    }
}

impl<F: Clone, B: Clone> Streams<F, B> {
    /// Opens a stream of `chunks` of `shuffle` at `now`; returns its id.
    pub fn open(&self, shuffle: Arc<Shuffle<F>>, chunks: Vec<B>, now: Instant) -> u64 {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.open.lock().insert(id, Stream { shuffle, chunks, last_used: now });
        id
    }

    /// Chunk `index` of stream `id`, fetched at `now`, whoever asks (the server asks
    /// [`Self::fetch_for`]).
    #[cfg(any(test, feature = "fuzzing"))]
    pub fn fetch(&self, id: u64, index: u32, now: Instant) -> Result<B, Refusal> {
        self.fetch_for(id, index, now, |_| true)
    }

    /// [`Self::fetch`] for a reader that may read the data of the applications `may_read`
    /// accepts: another application's stream is refused `UNAUTHORIZED`. Checked under the
    /// streams' lock, so a stream that opens just then is checked too.
    pub fn fetch_for(
        &self,
        id: u64,
        index: u32,
        now: Instant,
        may_read: impl Fn(&str) -> bool,
    ) -> Result<B, Refusal> {
        let mut open = self.open.lock();
        let Some(s) = open.get_mut(&id).filter(|s| !s.shuffle.is_deleted()) else {
            return Err(stream_not_open(id));
        };
        if !may_read(s.shuffle.key().app_id()) {
            return Err(not_yours(id));
        }
        let Some(c) = s.chunks.get(index as usize) else {
            let why = format!("chunk {index} of {}", s.chunks.len());
            return Err(Refusal::new(ErrorCode::ChunkOutOfRange, why));
        };
        s.last_used = now;
        Ok(c.clone())
    }

    /// Closes stream `id` (a no-op when it is not open), whoever asks (the server asks
    /// [`Self::close_for`]).
    #[cfg(any(test, feature = "fuzzing"))]
    pub fn close(&self, id: u64) {
        self.open.lock().remove(&id);
    }

    /// [`Self::close`] for a reader that may close the streams of the applications `may_read`
    /// accepts: another application's stream is refused `UNAUTHORIZED` and stays open.
    pub fn close_for(&self, id: u64, may_read: impl Fn(&str) -> bool) -> Result<(), Refusal> {
        let mut open = self.open.lock();
        match open.get(&id) {
            Some(s) if !may_read(s.shuffle.key().app_id()) => Err(not_yours(id)),
            Some(_) => {
                open.remove(&id);
                Ok(())
            }
            None => Ok(()),
        }
    }

    /// Drops the streams idle for `idle` at `now` and those whose shuffle was deleted; returns
    /// how many are left.
    pub fn expire(&self, now: Instant, idle: Duration) -> usize {
        let mut open = self.open.lock();
        open.retain(|_, s| {
            now.saturating_duration_since(s.last_used) < idle && !s.shuffle.is_deleted()
        });
        open.len()
    }
}

/// The refusal of another application's stream.
/// The refusal of a stream that is not open.
pub fn stream_not_open(id: u64) -> Refusal {
    Refusal::new(ErrorCode::UnknownStream, format!("stream {id} is not open"))
}

fn not_yours(id: u64) -> Refusal {
    Refusal::new(ErrorCode::Unauthorized, format!("stream {id} belongs to another application"))
}
