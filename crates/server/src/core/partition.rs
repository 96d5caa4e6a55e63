//! One partition of a shuffle: its buffer, its files with their write cursors, its chunk index.
//!
//! Pushed slices wait in the buffer (with the memory reservations that pay for them) until the
//! partition hands them out as a [`FlushPlan`]: "write these slices at this offset of this
//! file". The offset is reserved when the plan is made, so several plans of one partition can
//! be written at once; the chunk enters the index only when the writer reports the write done.
//! Files are `F`, whatever the shell opens them as; the partition never touches them.

use std::sync::Arc;

use bytes::Bytes;
use sluice_proto::ErrorCode;

use super::buffer::{Buffer, Layout};
use super::chunk::{padded_len, ByteRange, Chunk, Run};
use super::key::ShuffleKey;
use super::record::PartitionOut;
use super::refusal::Refusal;
use crate::memory_budget::Reservation;

/// Where flushes may go: the shell's storage, behind the core's back. The core asks it whether
/// a partition's current file may take more, and to open a partition's next file; opening is
/// the shell's I/O, done while the partition is locked, so no two flushes race for a file.
pub trait FileSource<F> {
    /// Whether `current` may take the partition's next flush (its directory is in service).
    fn keeps(&self, current: &F) -> bool;

    /// Opens file number `number` of `partition` of shuffle `key`; `Err` says why none can be.
    fn open(&self, key: &ShuffleKey, partition: u32, number: u32) -> Result<F, String>;
}

/// What a finished flush reports to its partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FlushOutcome {
    /// The plan's bytes are in its file at its offset: the chunk is readable once committed.
    Written,
    /// Not written and not to be: the partition's data cannot be stored anywhere (why).
    Lost(String),
    /// Not written because the shuffle was deleted meanwhile; nothing to record.
    Dropped,
}

/// A flush the core handed out: write [`FlushPlan::slices`] at [`FlushPlan::offset`] of
/// [`FlushPlan::file`], then give the plan back with the outcome
/// ([`super::Shuffle::flushed`]). Holds the memory of its bytes until then.
#[derive(Debug)]
#[must_use = "a flush plan must be written and reported back, or the shuffle never commits"]
pub struct FlushPlan<F> {
    partition: u32,
    file_number: u32,
    file: F,
    offset: u64,
    data: Buffer,
    /// Set once the bytes are laid out (grouped by attempt, the order they are written in).
    layout: Option<Layout>,
}

impl<F> FlushPlan<F> {
    /// The partition the bytes are of.
    pub fn partition(&self) -> u32 {
        self.partition
    }

    /// The file to write to.
    pub fn file(&self) -> &F {
        &self.file
    }

    /// Where in the file the bytes go (a multiple of the page size).
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// How many bytes of data (the zero padding to a whole page not counted).
    pub fn bytes(&self) -> u64 {
        self.data.bytes()
    }

    /// Bytes reserved for the plan's copied sections (see `buffer`).
    #[cfg(any(test, feature = "fuzzing"))]
    pub fn staged_reserved(&self) -> u64 {
        self.data.staged_reserved()
    }

    /// The bytes to write, in order, ending with the zero padding to a whole page (so a write
    /// into a recycled file never has the kernel read a partial page). The first call lays
    /// them out by map attempt (see [`Layout`]): do it in the writer, outside any lock.
    pub fn slices(&mut self) -> &[Bytes] {
        &self.layout.get_or_insert_with(|| self.data.lay_out()).slices
    }

    fn into_chunk(mut self) -> Chunk {
        let _ = self.slices();
        let runs = self.layout.take().map(|l| l.runs).unwrap_or_default();
        Chunk::new(self.file_number, self.offset, runs)
    }
}

/// What a deleted shuffle (or partition) leaves for the shell to remove.
#[derive(Debug, PartialEq, Eq)]
pub struct Removal<F> {
    /// Each partition's current file, which may be recycled.
    pub current: Vec<F>,
    /// Their earlier files (a partition moves on to a new file when a write fails): never to
    /// be created from now on (one whose creation failed might be made by a flush still in
    /// flight, after the shuffle's directory is removed), not recycled.
    pub older: Vec<F>,
    /// Keys of the objects in the object store that held its offloaded partitions.
    pub objects: Vec<String>,
}

impl<F> Default for Removal<F> {
    fn default() -> Self {
        Removal { current: Vec::new(), older: Vec::new(), objects: Vec::new() }
    }
}

/// One of a partition's files, with its write cursor.
#[derive(Debug)]
struct PartitionFile<F> {
    handle: F,
    /// Where the next flush into it goes: every offset below it is reserved by a plan.
    cursor: u64,
}

/// Whether a partition still takes data.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Health {
    Storing,
    /// Some of its data could not be stored anywhere: it refuses pushes and serves nothing.
    Lost(String),
    /// Its shuffle was deleted: buffers, chunks and files are gone.
    Deleted,
}

/// Where a chunk's bytes are, as the core tells the shell that builds a stream's bodies: a
/// local file, or (once its partition moved to the object store) an object, by key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkSource<'a, F> {
    /// A partition file on a local data directory.
    File(&'a F),
    /// An object in the object store, named by its key (byte offsets are the same as in the
    /// local file it was copied from).
    Object(&'a str),
}

impl<'a, F> ChunkSource<'a, F> {
    /// The local file, if the chunk is in one (for checks).
    #[cfg(any(test, feature = "fuzzing"))]
    pub fn file(self) -> Option<&'a F> {
        match self {
            ChunkSource::File(f) => Some(f),
            ChunkSource::Object(_) => None,
        }
    }
}

/// One partition of a shuffle on this server.
#[derive(Debug)]
pub struct Partition<F> {
    buffer: Buffer,
    /// Every file opened for the partition, by number; the last takes the next flush. Empty
    /// once the partition moved to the object store.
    files: Vec<PartitionFile<F>>,
    /// Once the committed partition moved to the object store: the key of the object holding
    /// each of its former files, by file number (chunks keep their file numbers and offsets).
    objects: Vec<String>,
    /// The chunk index: every written flush, in the order the writes finished.
    chunks: Vec<Chunk>,
    health: Health,
}

impl<F> Default for Partition<F> {
    fn default() -> Self {
        Partition {
            buffer: Buffer::default(),
            files: Vec::new(),
            objects: Vec::new(),
            chunks: Vec::new(),
            health: Health::Storing,
        }
    }
}

impl<F: Clone> Partition<F> {
    /// A committed partition read back at start: its files (by number) and chunk index, or why
    /// it is lost. Nothing is buffered, and nothing will be written to it.
    pub(super) fn recovered(stored: Result<(Vec<F>, Vec<Chunk>), String>) -> Self {
        match stored {
            Ok((files, chunks)) => {
                let files = files
                    .into_iter()
                    .enumerate()
                    .map(|(n, handle)| {
                        let in_file = chunks.iter().filter(|c| c.file() as usize == n);
                        PartitionFile {
                            handle,
                            cursor: in_file.map(Chunk::padded_end).max().unwrap_or(0),
                        }
                    })
                    .collect();
                Partition { files, chunks, ..Partition::default() }
            }
            Err(why) => Partition { health: Health::Lost(why), ..Partition::default() },
        }
    }

    /// A committed partition read back at start whose data is in the object store: the key of
    /// each object (by former file number) and the chunk index.
    pub(super) fn recovered_offloaded(objects: Vec<String>, chunks: Vec<Chunk>) -> Self {
        Partition { objects, chunks, ..Partition::default() }
    }

    /// The files of a committed partition that may move to the object store, with where its
    /// data in each ends (see [`Self::file_ends`]); `None` when there is nothing to move (no
    /// chunk, lost, deleted, or moved already).
    pub(super) fn offloadable(&self) -> Option<Vec<(F, u64)>> {
        if self.health != Health::Storing || self.chunks.is_empty() || self.files.is_empty() {
            return None;
        }
        let mut out = Vec::with_capacity(self.files.len());
        self.file_ends(&mut out);
        Some(out)
    }

    /// The partition's files were copied to the objects `objects` (by file number): from now on
    /// its chunks are served from them. Returns the local files, which the shell deletes once
    /// the commit record says where the data is. `Err` (nothing changes) when the partition no
    /// longer holds those files (deleted or lost meanwhile, or moved already): the shell then
    /// deletes the objects instead.
    pub(super) fn offloaded(&mut self, objects: Vec<String>) -> Result<Vec<F>, String> {
        match &self.health {
            Health::Storing => {}
            Health::Lost(why) => return Err(format!("the partition lost data: {why}")),
            Health::Deleted => return Err("the shuffle was unregistered".into()),
        }
        if !self.objects.is_empty() {
            return Err("the partition is in the object store already".into());
        }
        if objects.len() != self.files.len() {
            let why = format!("{} objects for {} files", objects.len(), self.files.len());
            return Err(why);
        }
        self.objects = objects;
        Ok(std::mem::take(&mut self.files).into_iter().map(|f| f.handle).collect())
    }

    /// Bytes of its chunks that are in the object store (0 while they are on local disks).
    pub fn offloaded_bytes(&self) -> u64 {
        if self.objects.is_empty() {
            return 0;
        }
        self.chunks.iter().map(Chunk::len).sum()
    }

    /// What the commit record says of the partition; `name` names each file (where it lives).
    pub(super) fn record(&self, name: &impl Fn(&F) -> String) -> PartitionOut<'_> {
        match &self.health {
            Health::Lost(why) => PartitionOut::Lost(why),
            _ if !self.objects.is_empty() => {
                PartitionOut::Offloaded { objects: &self.objects, chunks: &self.chunks }
            }
            _ => PartitionOut::Stored {
                files: self.files.iter().map(|f| name(&f.handle)).collect(),
                chunks: &self.chunks,
            },
        }
    }

    /// Refuses data for a partition that lost some, or whose shuffle is gone.
    pub(super) fn check_storing(&self, pid: u32) -> Result<(), Refusal> {
        match &self.health {
            Health::Storing => Ok(()),
            Health::Lost(why) => Err(Refusal::new(
                ErrorCode::StorageFailed,
                format!("partition {pid} cannot be stored: {why}"),
            )),
            Health::Deleted => {
                Err(Refusal::new(ErrorCode::UnknownShuffle, "the shuffle was unregistered"))
            }
        }
    }

    /// Bytes held: written or being written (page-padded, as the file cursors stand) and
    /// buffered. What the split threshold is compared with.
    pub fn held_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.cursor).sum::<u64>() + self.buffer.bytes()
    }

    /// Whether the buffer was seen holding data by the previous age check (it is marked seen
    /// now). See [`super::Shuffle::flush_aged`].
    pub(super) fn aged(&mut self) -> bool {
        self.buffer.age()
    }

    /// Bytes in the buffer, not yet handed to a writer.
    pub fn buffered_bytes(&self) -> u64 {
        self.buffer.bytes()
    }

    /// Bytes the partition's metadata holds on the heap: its chunk index, files and the
    /// buffer's bookkeeping (slices, runs and reservations; not the pushed bytes, which the
    /// memory budget counts).
    pub fn heap_bytes(&self) -> usize {
        use std::mem::size_of;
        self.chunks.capacity() * size_of::<Chunk>()
            + self.chunks.iter().map(Chunk::heap_bytes).sum::<usize>()
            + self.files.capacity() * size_of::<PartitionFile<F>>()
            + self.buffer.heap_bytes()
    }

    /// The chunk index.
    pub fn chunks(&self) -> &[Chunk] {
        &self.chunks
    }

    /// Whether a file was opened for it.
    pub fn has_files(&self) -> bool {
        !self.files.is_empty()
    }

    /// Why the partition lost data, if it did.
    pub fn lost(&self) -> Option<&str> {
        match &self.health {
            Health::Lost(why) => Some(why),
            _ => None,
        }
    }

    /// How many files were opened for it.
    #[cfg(test)]
    pub fn files_opened(&self) -> u32 {
        self.files.len() as u32
    }

    /// The file the next flush goes to, if one is open.
    #[cfg(test)]
    pub fn current_file(&self) -> Option<&F> {
        self.files.last().map(|f| &f.handle)
    }

    /// File `number` of the partition (`None`: not opened, or forgotten at deletion).
    #[cfg(any(test, feature = "fuzzing"))]
    pub fn file(&self, number: u32) -> Option<&F> {
        self.files.get(number as usize).map(|f| &f.handle)
    }

    /// The key of the object holding former file `number`, once the partition moved to the
    /// object store (`None`: it did not, or no such file).
    #[cfg(any(test, feature = "fuzzing"))]
    pub fn object(&self, number: u32) -> Option<&str> {
        self.objects.get(number as usize).map(String::as_str)
    }

    /// Where the next flush goes in file `number` (`None`: no such file).
    #[cfg(any(test, feature = "fuzzing"))]
    pub fn cursor(&self, number: u32) -> Option<u64> {
        self.files.get(number as usize).map(|f| f.cursor)
    }

    /// Adds a section's slices (one per run) to the buffer; `reservation` pays for them.
    pub(super) fn append(
        &mut self,
        slices: impl Iterator<Item = (Bytes, Run)>,
        len: u64,
        reservation: Option<&Arc<Reservation>>,
    ) {
        self.buffer.append(slices, len, reservation);
    }

    /// Copies a small section into the buffer (see `buffer`), paid for like `like`; `false`:
    /// no room in the budget for the copy, nothing changed.
    pub(super) fn copy_in(&mut self, data: &[u8], like: &Reservation) -> bool {
        self.buffer.copy_in(data, like)
    }

    /// Bytes reserved for the buffer's copied sections.
    #[cfg(any(test, feature = "fuzzing"))]
    pub fn staged_reserved(&self) -> u64 {
        self.buffer.staged_reserved()
    }

    /// Hands the buffer out as a flush plan at the cursor of the current file, or of a new one
    /// when the current one may not take more (`files`). `Ok(None)`: nothing buffered. When no
    /// file can be opened the partition is lost (its buffer dropped) and the refusal says why.
    pub(super) fn take_flush(
        &mut self,
        key: &ShuffleKey,
        pid: u32,
        files: &impl FileSource<F>,
    ) -> Result<Option<FlushPlan<F>>, Refusal> {
        if self.buffer.bytes() == 0 {
            return Ok(None);
        }
        if self.health != Health::Storing {
            // Lost or deleted: the bytes have nowhere to go and their memory is freed.
            self.buffer = Buffer::default();
            return Ok(None);
        }
        let (file_number, file, offset) = match self.reserve(key, pid, files, self.buffer.bytes()) {
            Ok(at) => at,
            Err(why) => {
                self.mark_lost(why.clone());
                return Err(Refusal::new(
                    ErrorCode::StorageUnavailable,
                    format!("no data directory can take the partition: {why}"),
                ));
            }
        };
        Ok(Some(FlushPlan {
            partition: pid,
            file_number,
            file,
            offset,
            data: std::mem::take(&mut self.buffer),
            layout: None,
        }))
    }

    /// Points a plan whose write failed at a new place: the current file if it may take more,
    /// else a newly opened one. `Err`: no file can be opened now (the caller may wait and try
    /// again, or report the plan lost).
    pub(super) fn retarget(
        &mut self,
        key: &ShuffleKey,
        plan: &mut FlushPlan<F>,
        files: &impl FileSource<F>,
    ) -> Result<(), String> {
        let (file_number, file, offset) = self.reserve(key, plan.partition, files, plan.bytes())?;
        plan.file_number = file_number;
        plan.file = file;
        plan.offset = offset;
        Ok(())
    }

    /// Reserves `bytes` (page-padded) at the cursor of the file that takes the next flush.
    fn reserve(
        &mut self,
        key: &ShuffleKey,
        pid: u32,
        files: &impl FileSource<F>,
        bytes: u64,
    ) -> Result<(u32, F, u64), String> {
        // A deleted or lost partition never gets a file again: its shuffle's files are gone (a
        // new one would stay behind on disk), or its data is incomplete anyway.
        match &self.health {
            Health::Storing => {}
            Health::Lost(why) => return Err(format!("the partition lost data: {why}")),
            Health::Deleted => return Err("the shuffle was unregistered".into()),
        }
        let keep = self.files.last().is_some_and(|f| files.keeps(&f.handle));
        if !keep {
            let handle = files.open(key, pid, self.files.len() as u32)?;
            self.files.push(PartitionFile { handle, cursor: 0 });
        }
        let number = self.files.len() as u32 - 1;
        let f = self.files.last_mut().expect("a file was just ensured");
        let offset = f.cursor;
        f.cursor += padded_len(bytes);
        Ok((number, f.handle.clone(), offset))
    }

    /// The shuffle became readable: its chunk index never grows again, so it gives back the
    /// room it had kept for more (a wide shuffle's 10,000 indexes of a few early chunks each
    /// held up to twice their chunks).
    pub(super) fn seal(&mut self) {
        self.chunks.shrink_to_fit();
        self.files.shrink_to_fit();
    }

    /// Takes a plan back: records its chunk when written; the plan's memory is freed. The index
    /// stays in file and offset order, the order the plans were made in, whatever order the
    /// flusher threads finish them in: a map's batches are read back in the order it pushed
    /// them (two threads finishing a partition's plans out of order once served them so).
    pub(super) fn flushed(&mut self, plan: FlushPlan<F>, outcome: FlushOutcome) {
        match outcome {
            FlushOutcome::Written if self.health != Health::Deleted => {
                let chunk = plan.into_chunk();
                let at = (chunk.file(), chunk.offset());
                // Nearly always the last: a search only for one that finished early.
                if self.chunks.last().is_none_or(|c| (c.file(), c.offset()) < at) {
                    self.chunks.push(chunk);
                } else {
                    let i = self.chunks.partition_point(|c| (c.file(), c.offset()) < at);
                    self.chunks.insert(i, chunk);
                }
            }
            FlushOutcome::Written | FlushOutcome::Dropped => {}
            FlushOutcome::Lost(why) => self.mark_lost(why),
        }
    }

    /// Marks the partition lost (the first reason stays): it refuses pushes, its readers get
    /// `DATA_LOST`, and what it buffers is dropped.
    pub(super) fn mark_lost(&mut self, why: String) {
        if self.health == Health::Storing {
            self.health = Health::Lost(why);
        }
        self.buffer = Buffer::default();
    }

    /// Forgets everything (the shuffle is deleted); returns the current file, which the shell
    /// may recycle, and the keys of the objects holding its data in the object store, which
    /// the shell deletes.
    pub(super) fn delete(&mut self) -> Removal<F> {
        self.health = Health::Deleted;
        self.buffer = Buffer::default();
        self.chunks = Vec::new();
        let current = self.files.pop().map(|f| f.handle);
        let older = std::mem::take(&mut self.files).into_iter().map(|f| f.handle).collect();
        Removal {
            current: current.into_iter().collect(),
            older,
            objects: std::mem::take(&mut self.objects),
        }
    }

    /// Every file with where the partition's data in it ends (page padding included): the
    /// current file's cursor, the end of the last chunk in each earlier one. A file taken from
    /// a recycle pool can be longer; the bytes past the end are an earlier shuffle's.
    pub(super) fn file_ends(&self, out: &mut Vec<(F, u64)>) {
        let last = self.files.len().saturating_sub(1);
        for (n, f) in self.files.iter().enumerate() {
            let end = if n == last {
                f.cursor
            } else {
                let ends = self.chunks.iter().filter(|c| c.file() as usize == n);
                ends.map(Chunk::padded_end).max().unwrap_or(0)
            };
            out.push((f.handle.clone(), end));
        }
    }

    /// Of each chunk holding a map in `[start, end)`, the byte ranges of the attempts `wanted`
    /// says yes to, handed to `body` with where the chunk is (its file, or its object once the
    /// partition moved to the object store); chunks with none are skipped. Consecutive chunks
    /// of one file are served as one while together they hold at most `up_to` bytes: a
    /// partition flushed in many small chunks (early, while the disks were idle) is still read
    /// in few large ones.
    pub(super) fn serve<B>(
        &self,
        (start, end): (u32, u32),
        mut wanted: impl FnMut(u32, u32) -> bool,
        up_to: u64,
        mut body: impl FnMut(ChunkSource<'_, F>, &[ByteRange]) -> B,
    ) -> Result<Vec<B>, Refusal> {
        let mut out = Vec::new();
        // The served chunk being gathered: its file number, ranges and bytes.
        let mut gathering: Option<(u32, Vec<ByteRange>, u64)> = None;
        let mut emit = |g: (u32, Vec<ByteRange>, u64)| -> Result<B, Refusal> {
            // Never skipped silently: a chunk whose file is unknown would be data gone missing.
            let n = g.0 as usize;
            let source = if self.objects.is_empty() {
                self.files.get(n).map(|f| ChunkSource::File(&f.handle))
            } else {
                self.objects.get(n).map(|k| ChunkSource::Object(k.as_str()))
            };
            let Some(source) = source else {
                let have = self.files.len().max(self.objects.len());
                let why = format!("a chunk points at file {} of {have}", g.0);
                return Err(Refusal::new(ErrorCode::Internal, why));
            };
            Ok(body(source, &g.1))
        };
        for c in self.chunks.iter().filter(|c| c.has_map_in(start, end)) {
            let ranges = c.ranges(&mut wanted);
            if ranges.is_empty() {
                continue;
            }
            let len: u64 = ranges.iter().map(|r| r.len).sum();
            match &mut gathering {
                Some((file, held, bytes)) if *file == c.file() && *bytes + len <= up_to => {
                    *bytes += len;
                    for r in ranges {
                        match held.last_mut() {
                            Some(last) if last.offset + last.len == r.offset => last.len += r.len,
                            _ => held.push(r),
                        }
                    }
                }
                _ => {
                    if let Some(g) = gathering.replace((c.file(), ranges, len)) {
                        out.push(emit(g)?);
                    }
                }
            }
        }
        if let Some(g) = gathering {
            out.push(emit(g)?);
        }
        Ok(out)
    }
}
