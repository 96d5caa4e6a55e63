//! The commit record: what a committed shuffle holds on this server (its map ends, and for
//! each partition its files and chunk index), as bytes the shell makes durable next to the data
//! and reads back when the server starts again.
//!
//! Layout: the magic `SLUICEIX`, then sections, each `length: u32 LE | crc32c: u32 LE | payload`
//! (payloads are `postcard`): first the header (version, shuffle key and sizes, map ends), then
//! one section per partition, in partition order. Each section has its own checksum, so damage
//! costs only what it hits: a bad or missing partition section makes that partition lost
//! (readers get `DATA_LOST`, never wrong bytes); a bad header makes the whole shuffle lost.

use serde::{Deserialize, Serialize};

use super::chunk::Chunk;
use super::maps::MapEnds;

/// First bytes of a commit record.
const MAGIC: &[u8; 8] = b"SLUICEIX";
/// Version of the record's layout; another version is refused (the shuffle is reported lost).
const VERSION: u32 = 1;
/// Bytes before each section's payload.
const SECTION_HEADER: usize = 8;

#[derive(Debug, Serialize, Deserialize)]
struct Header {
    version: u32,
    /// Committed (readable); `false`: a registration parked at a stop, open and empty.
    sealed: bool,
    app_id: String,
    shuffle_id: u32,
    num_maps: u32,
    num_partitions: u32,
    chunk_bytes: u64,
    maps: MapEnds,
}

/// What a partition's section says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PartitionRecord {
    /// Its files (each named by the shell: where it lives), in opening order, and its chunks.
    Stored {
        /// One name per file number.
        files: Vec<String>,
        /// The chunk index.
        chunks: Vec<Chunk>,
    },
    /// It lost data before the commit (why).
    Lost(String),
    /// Its data moved to the object store after the commit: the key of the object holding each
    /// of its former files (by file number), and the chunk index (offsets unchanged). Added
    /// after the first records: older ones never hold it, and an older server reading a newer
    /// record finds this section unreadable (that partition lost, never wrong bytes).
    Offloaded {
        /// One object key per former file number.
        objects: Vec<String>,
        /// The chunk index.
        chunks: Vec<Chunk>,
    },
}

/// A commit record read back.
#[derive(Debug)]
pub struct Decoded {
    /// The shuffle's application.
    pub app_id: String,
    /// The shuffle's id.
    pub shuffle_id: u32,
    /// Committed; `false`: an open, empty shuffle parked at a clean stop.
    pub sealed: bool,
    pub(super) num_maps: u32,
    pub(super) chunk_bytes: u64,
    pub(super) maps: MapEnds,
    /// Each partition's record, or why it cannot be trusted (a bad or missing section).
    pub partitions: Vec<Result<PartitionRecord, String>>,
}

/// Appends one section (the `postcard` bytes of `value`, with its length and checksum) to `out`.
fn put_section(out: &mut Vec<u8>, value: &impl Serialize) {
    let payload = postcard::to_allocvec(value).expect("postcard encodes into a Vec");
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32c::crc32c(&payload).to_le_bytes());
    out.extend_from_slice(&payload);
}

/// The next section of `data` from `at`, checked; moves `at` past it.
fn take_section<'a>(data: &'a [u8], at: &mut usize) -> Result<&'a [u8], String> {
    let head = data
        .get(*at..*at + SECTION_HEADER)
        .ok_or_else(|| format!("the record ends at byte {} (truncated)", data.len()))?;
    let len = u32::from_le_bytes(head[..4].try_into().expect("4 bytes")) as usize;
    let crc = u32::from_le_bytes(head[4..].try_into().expect("4 bytes"));
    let start = *at + SECTION_HEADER;
    let payload = start
        .checked_add(len)
        .and_then(|end| data.get(start..end))
        .ok_or_else(|| format!("a {len}-byte section at byte {} runs past the end", *at))?;
    if crc32c::crc32c(payload) != crc {
        return Err(format!("the section at byte {} fails its checksum", *at));
    }
    *at = start + len;
    Ok(payload)
}

/// Encodes a committed shuffle's record.
pub(super) fn encode(
    (app_id, shuffle_id): (&str, u32),
    (num_maps, chunk_bytes): (u32, u64),
    (sealed, maps): (bool, &MapEnds),
    partitions: impl ExactSizeIterator<Item = PartitionRecord>,
) -> Vec<u8> {
    let header = Header {
        version: VERSION,
        sealed,
        app_id: app_id.to_owned(),
        shuffle_id,
        num_maps,
        num_partitions: partitions.len() as u32,
        chunk_bytes,
        maps: maps.clone(),
    };
    let mut out = MAGIC.to_vec();
    put_section(&mut out, &header);
    for p in partitions {
        put_section(&mut out, &p);
    }
    out
}

/// Reads a record back; `Err` when its header cannot be trusted (the whole shuffle is lost).
pub fn decode(data: &[u8]) -> Result<Decoded, String> {
    if data.get(..MAGIC.len()) != Some(MAGIC) {
        return Err("not a commit record (bad magic)".into());
    }
    let mut at = MAGIC.len();
    let header: Header =
        postcard::from_bytes(take_section(data, &mut at)?).map_err(|e| format!("header: {e}"))?;
    if header.version != VERSION {
        return Err(format!("record version {} (this server reads {VERSION})", header.version));
    }
    let mut partitions = Vec::with_capacity(header.num_partitions.min(1 << 20) as usize);
    let mut broken: Option<String> = None;
    for pid in 0..header.num_partitions {
        // Past a damaged section the lengths cannot be trusted: every later partition is lost.
        let record = match &broken {
            Some(why) => Err(why.clone()),
            None => take_section(data, &mut at)
                .and_then(|p| postcard::from_bytes::<PartitionRecord>(p).map_err(|e| e.to_string()))
                .map_err(|e| {
                    let why = format!("its index entry is damaged: {e}");
                    broken = Some(format!("an earlier index entry (partition {pid}) is damaged"));
                    why
                }),
        };
        partitions.push(record);
    }
    Ok(Decoded {
        app_id: header.app_id,
        shuffle_id: header.shuffle_id,
        sealed: header.sealed,
        num_maps: header.num_maps,
        chunk_bytes: header.chunk_bytes,
        maps: header.maps,
        partitions,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::chunk::Run;

    fn record() -> Vec<u8> {
        let mut maps = MapEnds::default();
        maps.record(0, 1, &[(0, 2), (2, 1)], false);
        maps.record(0, 3, &[(0, 1)], false);
        let run = Run { map_id: 0, attempt_id: 1, len: 40 };
        let parts = vec![
            PartitionRecord::Stored {
                files: vec!["/d1".into(), "/d2".into()],
                chunks: vec![
                    Chunk::new(0, 0, vec![run].into()),
                    Chunk::new(1, 4096, vec![run].into()),
                ],
            },
            PartitionRecord::Stored { files: vec![], chunks: vec![] },
            PartitionRecord::Lost("disk failed".into()),
        ];
        encode(("app-1", 7), (2, 1 << 20), (true, &maps), parts.into_iter())
    }

    #[test]
    fn a_record_reads_back_whole() {
        let d = decode(&record()).unwrap();
        assert_eq!(
            (d.app_id.as_str(), d.shuffle_id, d.num_maps, d.chunk_bytes),
            ("app-1", 7, 2, 1 << 20)
        );
        assert_eq!(d.maps.batches(0, 3, 0), Some(1), "later attempts are kept");
        assert_eq!(d.partitions.len(), 3);
        let Ok(PartitionRecord::Stored { files, chunks }) = &d.partitions[0] else { panic!() };
        assert_eq!((files.len(), chunks.len(), chunks[1].file()), (2, 2, 1));
        assert_eq!(d.partitions[2], Ok(PartitionRecord::Lost("disk failed".into())));
    }

    #[test]
    fn damage_costs_only_what_it_hits() {
        let good = record();
        // Every single flipped byte: never a wrong record, either the header fails (whole
        // shuffle lost) or some partitions are reported damaged and the others are intact.
        let whole = decode(&good).unwrap();
        for i in 0..good.len() {
            let mut bad = good.clone();
            bad[i] ^= 0x5A;
            match decode(&bad) {
                Err(_) => {}
                Ok(d) => {
                    assert_eq!(d.partitions.len(), 3, "byte {i}");
                    assert!(d.partitions.iter().any(|p| p.is_err()), "byte {i}: damage unseen");
                    for (p, w) in d.partitions.iter().zip(&whole.partitions) {
                        if let Ok(p) = p {
                            assert_eq!(Ok(p), w.as_ref(), "byte {i}: a wrong partition record");
                        }
                    }
                }
            }
        }
        // Truncated anywhere: the same.
        for n in 0..good.len() {
            if let Ok(d) = decode(&good[..n]) {
                assert!(d.partitions.iter().any(|p| p.is_err()), "cut at {n}: loss unseen");
            }
        }
        assert!(decode(b"").is_err());
    }
}
