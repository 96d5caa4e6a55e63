//! What each map's attempts reported in `MapperEnd`, and which attempts a stream reads.

use std::collections::hash_map::Entry;
use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use sluice_proto::message::{CommittedMap, MapAttempt};

/// How many later attempts of one map a server remembers; an engine makes a handful (retries,
/// speculative copies, stage re-runs), so more means a misbehaving client.
pub const MAX_LATER_ATTEMPTS: usize = 64;

/// One map attempt's batches per partition, as `MapperEnd` reported them, in as few bytes as
/// they fit: a wide shuffle (2,000 maps × 10,000 partitions) holds one count per map and
/// partition, and a hash map of them took ~15 bytes each (docs/benchmarks-log.md#metadata-at-scale).
/// Dense (one byte per partition up to the highest one reported, larger counts beside) when
/// that is smaller than a sorted list of (partition, count) pairs, else that list. Serialized as
/// held (the commit record's format since version 2).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Counts {
    /// `small[p]`: partition p's count, or [`Counts::BIG`] when it is in `big` (sorted).
    Dense { small: Box<[u8]>, big: Box<[(u32, u32)]> },
    /// (partition, count) sorted by partition, counts of 0 left out.
    Sparse(Box<[(u32, u32)]>),
}

impl Counts {
    /// The `small` value of a count that is in `big`.
    const BIG: u8 = u8::MAX;

    fn new(counts: impl IntoIterator<Item = (u32, u32)>) -> Counts {
        let mut pairs: Vec<(u32, u32)> = counts.into_iter().filter(|c| c.1 > 0).collect();
        pairs.sort_unstable();
        // A partition reported twice: the last count stands, as it did in a map.
        pairs.dedup_by(|later, earlier| {
            let same = later.0 == earlier.0;
            if same {
                earlier.1 = later.1;
            }
            same
        });
        let span = pairs.last().map_or(0, |p| p.0 as usize + 1);
        if span > pairs.len() * std::mem::size_of::<(u32, u32)>() {
            return Counts::Sparse(pairs.into_boxed_slice());
        }
        let mut small = vec![0u8; span];
        let mut big = Vec::new();
        for (p, n) in pairs {
            match u8::try_from(n) {
                Ok(b) if b != Self::BIG => small[p as usize] = b,
                _ => {
                    small[p as usize] = Self::BIG;
                    big.push((p, n));
                }
            }
        }
        Counts::Dense { small: small.into_boxed_slice(), big: big.into_boxed_slice() }
    }

    /// The batches reported for `partition` (`None`: none).
    fn get(&self, partition: u32) -> Option<u32> {
        let find = |pairs: &[(u32, u32)]| {
            pairs.binary_search_by_key(&partition, |p| p.0).ok().map(|i| pairs[i].1)
        };
        match self {
            Counts::Sparse(pairs) => find(pairs),
            Counts::Dense { small, big } => match *small.get(partition as usize)? {
                0 => None,
                Self::BIG => find(big),
                n => Some(n as u32),
            },
        }
    }

    /// Bytes it holds on the heap.
    fn heap_bytes(&self) -> usize {
        let pair = std::mem::size_of::<(u32, u32)>();
        match self {
            Counts::Sparse(pairs) => pairs.len() * pair,
            Counts::Dense { small, big } => small.len() + big.len() * pair,
        }
    }
}

/// How counts are written in a commit record: as held (a wide shuffle's dense counts are one
/// byte per partition). Version 1 records wrote a map of partition → batches (read by
/// [`MapEnds::from_lists`]).
#[derive(Serialize)]
enum CountsOut<'a> {
    Dense {
        #[serde(with = "serde_bytes")]
        small: &'a [u8],
        big: &'a [(u32, u32)],
    },
    Sparse(&'a [(u32, u32)]),
}

#[derive(Deserialize)]
enum CountsIn {
    Dense {
        #[serde(with = "serde_bytes")]
        small: Vec<u8>,
        big: Vec<(u32, u32)>,
    },
    Sparse(Vec<(u32, u32)>),
}

impl Serialize for Counts {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Counts::Dense { small, big } => CountsOut::Dense { small, big },
            Counts::Sparse(pairs) => CountsOut::Sparse(pairs),
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for Counts {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Rebuilt from the pairs, so that what was read is in the form `new` makes.
        Ok(match CountsIn::deserialize(d)? {
            CountsIn::Sparse(pairs) => Counts::new(pairs),
            CountsIn::Dense { small, big } => {
                let small = small.iter().enumerate().filter(|(_, &b)| b != 0 && b != Self::BIG);
                Counts::new(small.map(|(p, &b)| (p as u32, b as u32)).chain(big))
            }
        })
    }
}

/// What a map's attempts reported: the winner's (the first to arrive), and the later
/// attempts', which are read only when a reader names them (`OpenStream::attempts`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct MapEnd {
    attempt_id: u32,
    /// partition → batches pushed there.
    batches: Counts,
    /// Later attempts, in arrival order: (attempt, partition → batches).
    later: Vec<(u32, Counts)>,
}

impl MapEnd {
    /// The batches per partition that `attempt` reported, if it ended here.
    fn batches_of(&self, attempt: u32) -> Option<&Counts> {
        if attempt == self.attempt_id {
            return Some(&self.batches);
        }
        self.later.iter().find(|(a, _)| *a == attempt).map(|(_, b)| b)
    }
}

/// What `MapperEnd` recorded for one map attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// Recorded (or already known); the map's winning attempt is this one.
    Winner(u32),
    /// Kept nowhere: the map had no end before the commit, or too many attempts of it ended.
    NotKept,
}

/// Every map's ends of one shuffle.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct MapEnds {
    maps: HashMap<u32, MapEnd>,
}

impl MapEnds {
    /// Records a map attempt's end; the first attempt to report wins. A later attempt is kept
    /// beside it (once; a repeated `MapperEnd` of an attempt changes nothing), also after the
    /// commit: its pushes were all acknowledged, so made before the commit. A map with no end
    /// before the commit (`committed`) never gets one: the commit needed every map.
    pub(crate) fn record(
        &mut self,
        map_id: u32,
        attempt_id: u32,
        counts: &[(u32, u32)],
        committed: bool,
    ) -> (Ended, bool) {
        let batches = || Counts::new(counts.iter().copied());
        let e = match self.maps.entry(map_id) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(_) if committed => return (Ended::NotKept, false),
            Entry::Vacant(v) => {
                v.insert(MapEnd { attempt_id, batches: batches(), later: Vec::new() })
            }
        };
        let mut dropped = false;
        if e.batches_of(attempt_id).is_none() {
            if e.later.len() < MAX_LATER_ATTEMPTS {
                e.later.push((attempt_id, batches()));
            } else {
                dropped = true;
            }
        }
        (Ended::Winner(e.attempt_id), dropped)
    }

    /// Map ends read back from a version 1 commit record: for each map, its winning attempt
    /// and (partition, batches), and its later attempts with theirs.
    pub(crate) fn from_lists(
        maps: impl IntoIterator<Item = (u32, u32, Vec<(u32, u32)>, Vec<(u32, Vec<(u32, u32)>)>)>,
    ) -> MapEnds {
        let maps = maps.into_iter().map(|(map, attempt_id, batches, later)| {
            let later = later.into_iter().map(|(a, c)| (a, Counts::new(c))).collect();
            (map, MapEnd { attempt_id, batches: Counts::new(batches), later })
        });
        MapEnds { maps: maps.collect() }
    }

    /// The batches `attempt` of `map` reported for `partition`, if that attempt ended here.
    pub(crate) fn batches(&self, map: u32, attempt: u32, partition: u32) -> Option<u32> {
        let counts = self.maps.get(&map)?.batches_of(attempt)?;
        Some(counts.get(partition).unwrap_or(0))
    }

    /// Bytes the map ends hold on the heap: the table (8 of 7 slots used at most, a control
    /// byte each) and every attempt's counts.
    pub(crate) fn heap_bytes(&self) -> usize {
        let slot = std::mem::size_of::<(u32, MapEnd)>() + 1;
        let table = self.maps.capacity() * 8 / 7 * slot;
        let later = std::mem::size_of::<(u32, Counts)>();
        table
            + self
                .maps
                .values()
                .map(|e| {
                    e.batches.heap_bytes()
                        + e.later.capacity() * later
                        + e.later.iter().map(|l| l.1.heap_bytes()).sum::<usize>()
                })
                .sum::<usize>()
    }

    /// How many maps ended.
    pub(crate) fn ended(&self) -> u32 {
        self.maps.len() as u32
    }

    /// The first map of `[start, end)` with no recorded end, if any. Costs one pass over the
    /// ended maps, however wide the range.
    pub(crate) fn first_unended(&self, start: u32, end: u32) -> Option<u32> {
        let want = end.saturating_sub(start) as usize;
        let have = self.maps.keys().filter(|m| (start..end).contains(*m)).count();
        if have == want {
            return None;
        }
        (start..end).find(|m| !self.maps.contains_key(m))
    }

    /// The winning attempt of each map of `[start, end)` that pushed to `partition`.
    pub(crate) fn winners(&self, start: u32, end: u32, partition: u32) -> Vec<CommittedMap> {
        self.maps
            .iter()
            .filter(|(m, _)| (start..end).contains(*m))
            .filter_map(|(m, e)| {
                let batches = e.batches.get(partition)?;
                (batches > 0).then_some(CommittedMap {
                    map_id: *m,
                    attempt_id: e.attempt_id,
                    batches,
                })
            })
            .collect()
    }

    /// The attempts a reader named, each with its batches in `partition` (0 when it pushed
    /// nothing to it here: a split partition's part holds the batches of the maps that wrote
    /// while it was the last part); or the first that this server cannot serve and why: an
    /// attempt that did not end here (its copy here is incomplete, or it never wrote here).
    pub(crate) fn named(
        &self,
        attempts: &[MapAttempt],
        partition: u32,
    ) -> Result<Vec<CommittedMap>, (MapAttempt, &'static str)> {
        attempts
            .iter()
            .map(|a| match self.batches(a.map_id, a.attempt_id, partition) {
                None => Err((a.clone(), "has no MapperEnd on this server")),
                Some(batches) => {
                    Ok(CommittedMap { map_id: a.map_id, attempt_id: a.attempt_id, batches })
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_end_wins_later_ones_are_kept_and_bounded() {
        let mut m = MapEnds::default();
        assert_eq!(m.record(0, 1, &[(0, 2)], false), (Ended::Winner(1), false));
        assert_eq!(m.record(0, 0, &[(0, 5)], false), (Ended::Winner(1), false));
        assert_eq!(m.record(0, 0, &[(0, 9)], false).0, Ended::Winner(1), "a repeat: no change");
        assert_eq!(m.record(0, 1, &[(0, 9)], false).0, Ended::Winner(1));
        assert_eq!(m.batches(0, 1, 0), Some(2));
        assert_eq!(m.batches(0, 0, 0), Some(5), "the later attempt is kept");
        assert_eq!(m.batches(0, 2, 0), None);
        assert_eq!(m.batches(0, 1, 7), Some(0), "ended, nothing in partition 7");
        for a in 2..2 + MAX_LATER_ATTEMPTS as u32 - 1 {
            assert_eq!(m.record(0, a, &[], false), (Ended::Winner(1), false));
        }
        assert_eq!(m.record(0, 999, &[], false), (Ended::Winner(1), true), "bounded");
        assert_eq!(m.batches(0, 999, 0), None);
        assert_eq!(m.record(5, 0, &[], true), (Ended::NotKept, false), "no first end after commit");
        assert_eq!(m.record(0, 1000, &[], true).0, Ended::Winner(1), "later ones still count");
    }

    #[test]
    fn counts_are_compact_and_read_back_as_reported() {
        let dense = Counts::new((0..10_000).map(|p| (p, 1 + p % 300)));
        let Counts::Dense { small, big } = &dense else { panic!("10,000 of 10,000: dense") };
        assert_eq!(small.len(), 10_000);
        assert_eq!(big.len(), (0..10_000).filter(|p| 1 + p % 300 >= 255).count());
        for p in [0, 1, 253, 254, 255, 299, 9_999] {
            assert_eq!(dense.get(p), Some(1 + p % 300), "partition {p}");
        }
        assert_eq!(dense.get(10_000), None);
        let sparse = Counts::new([(9_000, 2), (7, 0), (3, 5), (3, 6)]);
        assert!(matches!(sparse, Counts::Sparse(_)), "{sparse:?}");
        assert_eq!((sparse.get(3), sparse.get(7), sparse.get(9_000)), (Some(6), None, Some(2)));
        // The commit record's format: as held (a dense one, a byte per partition); both kinds
        // round trip.
        for c in [dense, sparse] {
            let bytes = postcard::to_allocvec(&c).unwrap();
            assert!(bytes.len() <= c.heap_bytes() + 16, "{} bytes for {c:?}", bytes.len());
            assert_eq!(postcard::from_bytes::<Counts>(&bytes).unwrap(), c);
        }
        // A version 1 record's map of partition → batches reads back as the same counts.
        let v1 = MapEnds::from_lists([(4, 1, vec![(9_000, 2), (3, 6)], vec![(2, vec![(5, 300)])])]);
        assert_eq!((v1.batches(4, 1, 3), v1.batches(4, 1, 9_000)), (Some(6), Some(2)));
        assert_eq!(
            (v1.batches(4, 2, 5), v1.batches(4, 2, 3), v1.batches(4, 3, 5)),
            (Some(300), Some(0), None)
        );
    }

    #[test]
    fn finds_the_first_map_without_an_end() {
        let mut m = MapEnds::default();
        for (map, attempt) in [(0, 0), (1, 3), (3, 0)] {
            m.record(map, attempt, &[], false);
        }
        assert_eq!(m.first_unended(0, 2), None);
        assert_eq!(m.first_unended(0, 4), Some(2));
        assert_eq!(m.first_unended(3, 4), None);
        assert_eq!(m.first_unended(3, 5), Some(4));
        assert_eq!(m.first_unended(2, 2), None, "an empty range");
        assert_eq!(MapEnds::default().first_unended(0, 1), Some(0));
    }

    #[test]
    fn winners_and_named_attempts() {
        let mut m = MapEnds::default();
        m.record(0, 0, &[(1, 3)], false);
        m.record(1, 2, &[(1, 1), (2, 4)], false);
        m.record(1, 5, &[(1, 7)], false);
        m.record(2, 0, &[(2, 1)], false);
        let mut w = m.winners(0, 3, 1);
        w.sort_by_key(|c| c.map_id);
        let got: Vec<_> = w.iter().map(|c| (c.map_id, c.attempt_id, c.batches)).collect();
        assert_eq!(got, vec![(0, 0, 3), (1, 2, 1)]);
        let named = m.named(&[MapAttempt { map_id: 1, attempt_id: 5 }], 1).unwrap();
        assert_eq!((named[0].attempt_id, named[0].batches), (5, 7));
        assert!(m.named(&[MapAttempt { map_id: 1, attempt_id: 6 }], 1).is_err());
        let nothing = m.named(&[MapAttempt { map_id: 2, attempt_id: 0 }], 1).unwrap();
        assert_eq!(nothing[0].batches, 0, "ended here, nothing in the partition: read as nothing");
    }
}
