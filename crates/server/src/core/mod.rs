//! The shuffle core: what a server remembers about its shuffles, and every rule about how that
//! changes, with no I/O and no clock.
//!
//! The core owns applications ([`Apps`]), shuffles ([`Shuffle`], whose life is one
//! [`Lifecycle`]), their partitions (buffers, file cursors, chunk index) and open streams
//! ([`Streams`]). State changes only through methods that say what happens: `push`,
//! `take_flush` → [`FlushPlan`], `flushed(plan, outcome)`, `mapper_end`, `begin_commit` /
//! `finish_commit`, `open_stream`, `delete`. Time comes in as a parameter; files are an opaque
//! `F` the shell opens through a [`FileSource`]; what a stream sends of a chunk is an opaque
//! `B` the shell builds from a file and byte ranges.
//!
//! Around it, the shell (the rest of the crate) does the I/O: the transport handler
//! (`state.rs`), the writers that carry out flush plans (`flusher.rs`), the data directories
//! (`storage.rs`) and the maintenance tick. Because nothing here blocks or reads a clock, the
//! core is unit-tested without tokio or files and fuzzed with operation sequences
//! (`fuzzing.rs`).
//!
//! ## Layout
//! - `key`: which shuffle ([`ShuffleKey`]).
//! - `refusal`: a request turned down, with its wire code ([`Refusal`]).
//! - `chunk`: runs of map attempts, chunks and their byte ranges, page padding.
//! - `buffer`: a partition's buffered bytes (slices of push bodies, copies of small sections)
//!   and how a flush lays them out.
//! - `partition`: a partition's buffer, files and cursors, chunk index; flush plans.
//! - `maps`: `MapperEnd` records and which attempts a stream reads.
//! - `record`: the commit record made durable at commit and read back at start.
//! - `shuffle`: a shuffle's lifecycle and its requests: push, commit, open stream, delete.
//! - `apps`: applications and their shuffles.
//! - `streams`: open read streams.
//! - `report`: read-only snapshots for operators.

mod apps;
mod buffer;
mod chunk;
mod key;
mod maps;
mod partition;
mod record;
mod refusal;
mod report;
mod shuffle;
mod streams;

#[cfg(test)]
pub(crate) mod tests;

pub use apps::{Apps, Deleted};
#[cfg(any(test, feature = "fuzzing"))]
pub use buffer::COPY_BELOW;
#[cfg(any(test, feature = "fuzzing"))]
pub use chunk::padded_len;
pub use chunk::{ByteRange, CHUNK_ALIGN};
pub use key::ShuffleKey;
pub use partition::{ChunkSource, FileSource, FlushOutcome, FlushPlan};
pub use record::{decode as decode_record, Decoded};
pub use refusal::Refusal;
pub use report::{AppReport, ShuffleReport};
pub use shuffle::Lifecycle;
pub use shuffle::Shuffle;
pub use streams::{stream_not_open, Streams};
