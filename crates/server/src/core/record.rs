//! The commit record: what a committed shuffle holds on this server (its map ends, and for
//! each partition its files and chunk index), as bytes the shell makes durable next to the data
//! and reads back when the server starts again.
//!
//! Layout: the magic `SLUICEIX`, then sections, each `length: u32 LE | crc32c: u32 LE | payload`
//! (payloads are `postcard`): first the header (version, shuffle key and sizes, map ends), then
//! one section per partition, in partition order, then the [`Stamp`]. Each section has its own
//! checksum, so damage costs only what it hits: a bad or missing partition section makes that
//! partition lost (readers get `DATA_LOST`, never wrong bytes); a bad header makes the whole
//! shuffle lost; a bad stamp makes the copy count as the oldest (see `durable::merge`).
//!
//! The stamp came after the first records: older ones end with the last partition (their
//! stamp reads as zero), and an older server reads a newer record to the last partition and
//! never looks further, so the layout's version did not change with it.

use serde::{Deserialize, Serialize};

use super::chunk::Chunk;
use super::maps::MapEnds;

/// First bytes of a commit record.
const MAGIC: &[u8; 8] = b"SLUICEIX";
/// Version of the record's layout written; version 1 is read too, another version is refused
/// (the shuffle is reported lost).
const VERSION: u32 = 2;
/// Bytes before each section's payload.
const SECTION_HEADER: usize = 8;

/// Which registration of a shuffle a record is of, and how many records of it were made before:
/// the copies of a record on several directories can differ (one on a directory that failed
/// while the others were written again, one of a shuffle deleted and registered again), and the
/// newest is the one to trust.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Stamp {
    /// Tells the registrations of one shuffle key apart, later ones higher: microseconds since
    /// the epoch when it was registered (one more than the last one given out, if the clock
    /// says less). 0: a record from before the stamp.
    pub incarnation: u64,
    /// Records of this registration made before this one.
    pub revision: u64,
}

impl Stamp {
    /// A stamp for a shuffle registered now: its first record's.
    pub(super) fn registered_now() -> Stamp {
        static LAST: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        let now = now.map_or(1, |d| d.as_micros() as u64);
        let previous = LAST.fetch_update(
            std::sync::atomic::Ordering::Relaxed,
            std::sync::atomic::Ordering::Relaxed,
            |last| Some(now.max(last + 1)),
        );
        let last = previous.unwrap_or_else(|last| last);
        Stamp { incarnation: now.max(last + 1), revision: 0 }
    }
}

/// The header as written (the map ends borrowed, not copied).
#[derive(Serialize)]
struct HeaderOut<'a> {
    version: u32,
    sealed: bool,
    app_id: &'a str,
    shuffle_id: u32,
    num_maps: u32,
    num_partitions: u32,
    chunk_bytes: u64,
    maps: &'a MapEnds,
}

#[derive(Debug, Deserialize)]
struct Header {
    _version: u32,
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

/// A partition's section as written: [`PartitionRecord`]'s layout, its lists borrowed.
#[derive(Serialize)]
pub(crate) enum PartitionOut<'a> {
    Stored { files: Vec<String>, chunks: &'a [Chunk] },
    Lost(&'a str),
    Offloaded { objects: &'a [String], chunks: &'a [Chunk] },
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
    /// Its stamp; zero when it has none (older records) or it is damaged.
    pub stamp: Stamp,
}

/// Appends one section (the `postcard` bytes of `value`, with its length and checksum) to `out`.
fn put_section(out: &mut Vec<u8>, value: &impl Serialize) {
    let head = out.len();
    out.extend_from_slice(&[0; SECTION_HEADER]);
    *out = postcard::to_extend(value, std::mem::take(out)).expect("postcard encodes into a Vec");
    let payload = &out[head + SECTION_HEADER..];
    let (len, crc) = ((payload.len() as u32).to_le_bytes(), crc32c::crc32c(payload).to_le_bytes());
    out[head..head + 4].copy_from_slice(&len);
    out[head + 4..head + SECTION_HEADER].copy_from_slice(&crc);
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

/// Starts a committed shuffle's record: the magic and the header, to which each partition's
/// section is added with [`put_partition`], in partition order, `num_partitions` of them.
pub(super) fn start(
    (app_id, shuffle_id): (&str, u32),
    (num_maps, chunk_bytes): (u32, u64),
    (sealed, maps): (bool, &MapEnds),
    num_partitions: u32,
) -> Vec<u8> {
    let header = HeaderOut {
        version: VERSION,
        sealed,
        app_id,
        shuffle_id,
        num_maps,
        num_partitions,
        chunk_bytes,
        maps,
    };
    let mut out = MAGIC.to_vec();
    put_section(&mut out, &header);
    out
}

/// Adds the next partition's section to a record begun by [`start`].
pub(super) fn put_partition(out: &mut Vec<u8>, partition: &PartitionOut<'_>) {
    put_section(out, partition);
}

/// Ends a record, its partitions all put, with its stamp.
pub(super) fn finish(out: &mut Vec<u8>, stamp: Stamp) {
    put_section(out, &stamp);
}

/// Reads a record back; `Err` when its header cannot be trusted (the whole shuffle is lost).
pub fn decode(data: &[u8]) -> Result<Decoded, String> {
    if data.get(..MAGIC.len()) != Some(MAGIC) {
        return Err("not a commit record (bad magic)".into());
    }
    let mut at = MAGIC.len();
    let section = take_section(data, &mut at)?;
    // The version leads the header in every version.
    let (version, _) =
        postcard::take_from_bytes::<u32>(section).map_err(|e| format!("header: {e}"))?;
    let header: Header = match version {
        VERSION => postcard::from_bytes(section).map_err(|e| format!("header: {e}"))?,
        1 => v1::header(section)?,
        v => return Err(format!("record version {v} (this server reads 1 and {VERSION})")),
    };
    let partition = |p: &[u8]| match version {
        1 => v1::partition(p),
        _ => postcard::from_bytes::<PartitionRecord>(p).map_err(|e| e.to_string()),
    };
    let mut partitions = Vec::with_capacity(header.num_partitions.min(1 << 20) as usize);
    let mut broken: Option<String> = None;
    for pid in 0..header.num_partitions {
        // Past a damaged section the lengths cannot be trusted: every later partition is lost.
        let record = match &broken {
            Some(why) => Err(why.clone()),
            None => take_section(data, &mut at).and_then(partition).map_err(|e| {
                let why = format!("its index entry is damaged: {e}");
                broken = Some(format!("an earlier index entry (partition {pid}) is damaged"));
                why
            }),
        };
        partitions.push(record);
    }
    // Only after partitions all read: past a damaged one, where it starts is not known.
    let stamp = match (&broken, data.len() > at) {
        (None, true) => take_section(data, &mut at)
            .and_then(|s| postcard::from_bytes::<Stamp>(s).map_err(|e| e.to_string()))
            .unwrap_or_default(),
        _ => Stamp::default(),
    };
    Ok(Decoded {
        app_id: header.app_id,
        shuffle_id: header.shuffle_id,
        sealed: header.sealed,
        num_maps: header.num_maps,
        chunk_bytes: header.chunk_bytes,
        maps: header.maps,
        partitions,
        stamp,
    })
}

/// Version 1 of the record: counts as maps of partition → batches, runs listed one by one.
mod v1 {
    use std::collections::HashMap;

    use serde::{Deserialize, Serialize};

    use super::{Chunk, Header, MapEnds, PartitionRecord};
    use crate::core::chunk::Run;

    type Counts = HashMap<u32, u32>;

    #[derive(Serialize, Deserialize)]
    pub(super) struct MapEnd {
        pub attempt_id: u32,
        pub batches: Counts,
        pub later: Vec<(u32, Counts)>,
    }

    #[derive(Serialize, Deserialize)]
    pub(super) struct HeaderV1 {
        pub version: u32,
        pub sealed: bool,
        pub app_id: String,
        pub shuffle_id: u32,
        pub num_maps: u32,
        pub num_partitions: u32,
        pub chunk_bytes: u64,
        pub maps: HashMap<u32, MapEnd>,
    }

    #[derive(Serialize, Deserialize)]
    pub(super) struct ChunkV1 {
        pub file: u32,
        pub offset: u64,
        pub len: u64,
        pub runs: Vec<Run>,
    }

    #[derive(Serialize, Deserialize)]
    pub(super) enum PartitionV1 {
        Stored { files: Vec<String>, chunks: Vec<ChunkV1> },
        Lost(String),
        Offloaded { objects: Vec<String>, chunks: Vec<ChunkV1> },
    }

    pub(super) fn header(section: &[u8]) -> Result<Header, String> {
        let h: HeaderV1 = postcard::from_bytes(section).map_err(|e| format!("header: {e}"))?;
        let list = |c: Counts| c.into_iter().collect::<Vec<_>>();
        let maps = h.maps.into_iter().map(|(m, e)| {
            let later = e.later.into_iter().map(|(a, c)| (a, list(c))).collect();
            (m, e.attempt_id, list(e.batches), later)
        });
        Ok(Header {
            _version: h.version,
            sealed: h.sealed,
            app_id: h.app_id,
            shuffle_id: h.shuffle_id,
            num_maps: h.num_maps,
            num_partitions: h.num_partitions,
            chunk_bytes: h.chunk_bytes,
            maps: MapEnds::from_lists(maps),
        })
    }

    pub(super) fn partition(section: &[u8]) -> Result<PartitionRecord, String> {
        let chunks = |c: Vec<ChunkV1>| {
            c.into_iter().map(|c| Chunk::from_runs(c.file, c.offset, c.len, c.runs)).collect()
        };
        Ok(match postcard::from_bytes(section).map_err(|e| e.to_string())? {
            PartitionV1::Stored { files, chunks: c } => {
                PartitionRecord::Stored { files, chunks: chunks(c) }
            }
            PartitionV1::Lost(why) => PartitionRecord::Lost(why),
            PartitionV1::Offloaded { objects, chunks: c } => {
                PartitionRecord::Offloaded { objects, chunks: chunks(c) }
            }
        })
    }
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
        encode_all(&maps, &parts)
    }

    fn encode_all(maps: &MapEnds, parts: &[PartitionRecord]) -> Vec<u8> {
        let mut out = start(("app-1", 7), (2, 1 << 20), (true, maps), parts.len() as u32);
        for p in parts {
            put_partition(
                &mut out,
                &match p {
                    PartitionRecord::Stored { files, chunks } => {
                        PartitionOut::Stored { files: files.clone(), chunks }
                    }
                    PartitionRecord::Lost(why) => PartitionOut::Lost(why),
                    PartitionRecord::Offloaded { objects, chunks } => {
                        PartitionOut::Offloaded { objects, chunks }
                    }
                },
            );
        }
        finish(&mut out, STAMP);
        out
    }

    const STAMP: Stamp = Stamp { incarnation: 1_700_000_000_000_000, revision: 2 };

    /// A wide shuffle's record: `maps` maps, each with one 36-byte batch in each of
    /// `partitions` partitions, one chunk per partition.
    fn wide(maps: u32, partitions: u32) -> (MapEnds, Vec<PartitionRecord>) {
        let mut ends = MapEnds::default();
        let counts: Vec<(u32, u32)> = (0..partitions).map(|p| (p, 1)).collect();
        for m in 0..maps {
            ends.record(m, 0, &counts, false);
        }
        let runs: Vec<Run> = (0..maps).map(|m| Run { map_id: m, attempt_id: 0, len: 36 }).collect();
        let parts = (0..partitions)
            .map(|_| PartitionRecord::Stored {
                files: vec!["/d1".into()],
                chunks: vec![Chunk::new(0, 0, runs.clone().into())],
            })
            .collect();
        (ends, parts)
    }

    #[test]
    fn a_wide_shuffles_record_is_a_few_bytes_per_map_and_partition() {
        let (maps, parts) = wide(200, 1_000);
        let bytes = encode_all(&maps, &parts);
        // A count byte and a two-byte run per pair, sections and headers around them.
        let per_pair = bytes.len() as f64 / 200_000.0;
        assert!(per_pair < 3.2, "{per_pair:.2} bytes per map and partition");
        let d = decode(&bytes).unwrap();
        assert_eq!(d.maps, maps);
        assert_eq!(d.partitions, parts.into_iter().map(Ok).collect::<Vec<_>>());
    }

    #[test]
    fn a_version_1_record_reads_back_the_same() {
        let mut maps = MapEnds::default();
        maps.record(0, 1, &[(0, 2), (2, 1)], false);
        maps.record(0, 3, &[(0, 300)], false);
        maps.record(5, 0, &[(1, 1)], false);
        let runs = vec![
            Run { map_id: 0, attempt_id: 1, len: 40 },
            Run { map_id: 5, attempt_id: 0, len: 8 },
        ];
        let new = encode_all(
            &maps,
            &[
                PartitionRecord::Stored {
                    files: vec!["/d1".into()],
                    chunks: vec![Chunk::new(0, 4096, runs.clone().into())],
                },
                PartitionRecord::Lost("disk failed".into()),
                PartitionRecord::Offloaded {
                    objects: vec!["k".into()],
                    chunks: vec![Chunk::new(0, 0, runs.clone().into())],
                },
            ],
        );
        // The same shuffle as version 1 wrote it.
        let counts = |c: &[(u32, u32)]| c.iter().copied().collect();
        let header = v1::HeaderV1 {
            version: 1,
            sealed: true,
            app_id: "app-1".into(),
            shuffle_id: 7,
            num_maps: 2,
            num_partitions: 3,
            chunk_bytes: 1 << 20,
            maps: [
                (
                    0,
                    v1::MapEnd {
                        attempt_id: 1,
                        batches: counts(&[(0, 2), (2, 1)]),
                        later: vec![(3, counts(&[(0, 300)]))],
                    },
                ),
                (5, v1::MapEnd { attempt_id: 0, batches: counts(&[(1, 1)]), later: vec![] }),
            ]
            .into_iter()
            .collect(),
        };
        let chunk = |offset| v1::ChunkV1 { file: 0, offset, len: 48, runs: runs.clone() };
        let mut old = MAGIC.to_vec();
        put_section(&mut old, &header);
        put_section(
            &mut old,
            &v1::PartitionV1::Stored { files: vec!["/d1".into()], chunks: vec![chunk(4096)] },
        );
        put_section(&mut old, &v1::PartitionV1::Lost("disk failed".into()));
        put_section(
            &mut old,
            &v1::PartitionV1::Offloaded { objects: vec!["k".into()], chunks: vec![chunk(0)] },
        );
        let (a, b) = (decode(&new).unwrap(), decode(&old).unwrap());
        assert_eq!((a.app_id, a.shuffle_id, a.sealed), (b.app_id, b.shuffle_id, b.sealed));
        assert_eq!((a.num_maps, a.chunk_bytes), (b.num_maps, b.chunk_bytes));
        assert_eq!(a.maps, b.maps);
        assert_eq!(a.partitions, b.partitions);
        // A version this server does not know is refused, never misread.
        let mut future = MAGIC.to_vec();
        put_section(&mut future, &v1::HeaderV1 { version: 9, ..header });
        assert!(decode(&future).unwrap_err().contains("version 9"));
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
        assert_eq!(d.stamp, STAMP);
    }

    #[test]
    fn a_record_from_before_the_stamp_reads_with_stamp_zero() {
        let with = record();
        // The stamp's section is the last: 8 bytes of section header and its payload.
        let payload = postcard::to_allocvec(&STAMP).unwrap().len();
        let without = &with[..with.len() - SECTION_HEADER - payload];
        let d = decode(without).unwrap();
        assert_eq!(d.stamp, Stamp::default());
        assert!(d.partitions.iter().all(Result::is_ok));
    }

    #[test]
    fn stamps_of_later_registrations_are_higher() {
        let stamps: Vec<Stamp> = (0..1000).map(|_| Stamp::registered_now()).collect();
        assert!(stamps.windows(2).all(|w| w[0].incarnation < w[1].incarnation));
        assert!(stamps[0].incarnation > 1_700_000_000_000_000, "microseconds since the epoch");
        assert!(stamps.iter().all(|s| s.revision == 0));
    }

    #[test]
    fn damage_costs_only_what_it_hits() {
        let good = record();
        // Every single flipped byte: never a wrong record, either the header fails (whole
        // shuffle lost) or some partitions are reported damaged and the others are intact.
        let whole = decode(&good).unwrap();
        // A damaged stamp makes the copy the oldest (zero), nothing else.
        let seen = |d: &Decoded| d.partitions.iter().any(|p| p.is_err()) || d.stamp != STAMP;
        for i in 0..good.len() {
            let mut bad = good.clone();
            bad[i] ^= 0x5A;
            match decode(&bad) {
                Err(_) => {}
                Ok(d) => {
                    assert_eq!(d.partitions.len(), 3, "byte {i}");
                    assert!(seen(&d), "byte {i}: damage unseen");
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
                assert!(seen(&d), "cut at {n}: loss unseen");
            }
        }
        assert!(decode(b"").is_err());
    }
}
