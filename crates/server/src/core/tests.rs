//! Scenarios of the core alone: no runtime, no files (files are numbers).

use std::cell::Cell;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use sluice_proto::message::{MapAttempt, OpenStream, RegisterShuffle, Section};
use sluice_proto::ErrorCode;

use super::partition::Removal;
use super::*;
use crate::memory_budget::MemoryBudget;

/// A body of one batch of `len` payload bytes of `map`'s `attempt`.
pub(crate) fn batch_body(map: u32, attempt: u32, len: usize) -> Bytes {
    let mut b = BytesMut::new();
    sluice_proto::batch::put_batch(&mut b, map, attempt, 0, &vec![7u8; len]);
    b.freeze()
}

/// Files are numbers; `fail` makes every open fail, `move_on` makes current files not kept.
#[derive(Default)]
struct Numbers {
    next: Cell<u32>,
    fail: bool,
    move_on: bool,
}

impl FileSource<u32> for Numbers {
    fn keeps(&self, _: &u32) -> bool {
        !self.move_on
    }
    fn open(&self, _: &ShuffleKey, _: u32, _: u32) -> Result<u32, String> {
        if self.fail {
            return Err("no directory".into());
        }
        self.next.set(self.next.get() + 1);
        Ok(self.next.get() - 1)
    }
}

fn section(partition_id: u32, body: &Bytes) -> Section {
    Section { partition_id, offset: 0, length: body.len() as u32 }
}

fn shuffle(chunk_bytes: u64) -> Shuffle<u32> {
    Shuffle::new(ShuffleKey::new("app", 1), 2, 2, chunk_bytes)
}

/// Registers shuffle 1 of `app` with `num_maps` maps and as many partitions, chunks of
/// `chunk_bytes`.
fn register(apps: &Apps<u32>, app: &str, num_maps: u32, chunk_bytes: u64, now: Instant) {
    let r = RegisterShuffle {
        app_id: app.into(),
        shuffle_id: 1,
        num_maps,
        num_partitions: num_maps,
        ..Default::default()
    };
    apps.register_shuffle(&r, chunk_bytes, 0, now).unwrap();
}

fn stream(partition_id: u32) -> OpenStream {
    OpenStream {
        app_id: "app".into(),
        shuffle_id: 1,
        partition_id,
        map_start: 0,
        map_end: 2,
        attempts: vec![],
    }
}

#[test]
fn a_full_buffer_becomes_a_plan_whose_chunk_is_served_after_the_commit() {
    let files = Numbers::default();
    let budget = MemoryBudget::new(1 << 20, 0.9, 0.95, 0.5);
    let s = shuffle(100);
    let body = batch_body(0, 0, 200);
    let pushed = s.push(&[section(1, &body)], &body, budget.try_reserve(220), &files);
    assert_eq!((pushed.result.clone(), pushed.stored, pushed.flushes.len()), (Ok(()), 1, 1));
    let mut plan = pushed.flushes.into_iter().next().unwrap();
    assert_eq!((plan.partition(), *plan.file(), plan.offset(), plan.bytes()), (1, 0, 0, 220));
    assert_eq!(plan.slices().iter().map(|b| b.len()).sum::<usize>(), 4096, "padded to a page");
    assert_eq!(s.flushes_in_flight(), 1);
    assert_eq!(
        budget.used(),
        1024,
        "the plan holds its copy's memory (a 1 KiB block), not the push's"
    );
    assert!(s.flushed(plan, FlushOutcome::Written), "the last flush in flight");
    assert_eq!(budget.used(), 0);
    assert_eq!(s.mapper_end(0, 0, &[(1, 1)]), Ok((0, false)));
    assert_eq!(s.mapper_end(1, 0, &[]), Ok((0, false)));
    assert_eq!(
        s.open_stream(&stream(1), |_, _| ()).unwrap_err().code(),
        ErrorCode::ShuffleNotCommitted
    );
    assert!(s.begin_commit(&files).unwrap().flushes.is_empty());
    let sizes = s.finish_commit().unwrap();
    assert_eq!((sizes.len(), sizes[0].partition, sizes[0].bytes), (1, 1, 220));
    let (bodies, committed) =
        s.open_stream(&stream(1), |f, r| (*f.file().unwrap(), r.to_vec())).unwrap();
    assert_eq!(bodies, vec![(0, vec![ByteRange { offset: 0, len: 220 }])]);
    assert_eq!((committed[0].map_id, committed[0].batches), (0, 1));
    // Pushes are refused once committed; a second commit changes nothing.
    let again = s.push(&[section(1, &body)], &body, None, &files);
    assert_eq!(again.result.unwrap_err().code(), ErrorCode::ShuffleCommitted);
    assert!(s.begin_commit(&files).unwrap().flushes.is_empty());
    assert_eq!(s.lifecycle(), Lifecycle::Readable);
}

#[test]
fn plans_of_one_partition_get_their_own_offsets_and_a_failed_one_moves_to_a_new_file() {
    let mut files = Numbers::default();
    let s = shuffle(10);
    let body = batch_body(0, 0, 5000); // two pages padded
    let p1 = s.push(&[section(0, &body)], &body, None, &files).flushes.pop().unwrap();
    let mut p2 = s.push(&[section(0, &body)], &body, None, &files).flushes.pop().unwrap();
    assert_eq!((p1.offset(), p2.offset()), (0, 8192), "offsets reserved at hand-out");
    files.move_on = true; // the write failed: the directory is out
    s.retarget(&mut p2, &files).unwrap();
    assert_eq!((*p2.file(), p2.offset()), (1, 0), "a new file, from its start");
    s.flushed(p1, FlushOutcome::Written);
    s.flushed(p2, FlushOutcome::Written);
    let p = s.partition(0).unwrap();
    let chunks: Vec<_> = p.chunks().iter().map(|c| (c.file(), c.offset())).collect();
    assert_eq!(chunks, vec![(0, 0), (1, 0)]);
    assert_eq!((p.files_opened(), p.cursor(0), p.cursor(1)), (2, Some(16384), Some(8192)));
    drop(p);
    let mut ends = s.file_ends();
    ends.sort();
    assert_eq!(ends, vec![(0, 8192), (1, 8192)], "the old file ends at its last chunk");
}

#[test]
fn plans_finished_out_of_order_are_read_in_the_order_they_were_made() {
    // Two flusher threads may finish a partition's plans in any order; its batches must still
    // be served in the order they were pushed (a fresh-clone CI run read 0, 2, 1).
    let files = Numbers::default();
    let s = shuffle(10);
    let plans: Vec<_> = (0..3)
        .map(|b| {
            let body = batch_body(0, b, 5000);
            s.push(&[section(0, &body)], &body, None, &files).flushes.pop().unwrap()
        })
        .collect();
    let [p0, p1, p2] = <[_; 3]>::try_from(plans).ok().unwrap();
    s.flushed(p0, FlushOutcome::Written);
    s.flushed(p2, FlushOutcome::Written);
    s.flushed(p1, FlushOutcome::Written);
    let p = s.partition(0).unwrap();
    let chunks: Vec<_> = p.chunks().iter().map(|c| (c.file(), c.offset())).collect();
    assert_eq!(chunks, vec![(0, 0), (0, 8192), (0, 16384)]);
}

#[test]
fn no_file_loses_the_partition_and_frees_its_memory() {
    let files = Numbers { fail: true, ..Numbers::default() };
    let budget = MemoryBudget::new(1 << 20, 0.9, 0.95, 0.5);
    let s = shuffle(1 << 20);
    let body = batch_body(0, 0, 100);
    let pushed = s.push(&[section(0, &body)], &body, budget.try_reserve(120), &files);
    assert!(pushed.result.is_ok(), "buffered: no file needed yet");
    let err = s.take_flush(0, &files).unwrap_err();
    assert_eq!(err.code(), ErrorCode::StorageUnavailable);
    assert_eq!(budget.used(), 0, "a lost partition's buffer is dropped");
    let again = s.push(&[section(0, &body)], &body, None, &files);
    assert_eq!(again.result.unwrap_err().code(), ErrorCode::StorageFailed);
    s.mapper_end(0, 0, &[(0, 1)]).unwrap();
    s.mapper_end(1, 0, &[]).unwrap();
    assert!(s.begin_commit(&files).unwrap().flushes.is_empty());
    assert_eq!(s.finish_commit().unwrap_err().code(), ErrorCode::StorageFailed);
    assert_eq!(s.open_stream(&stream(0), |_, _| ()).unwrap_err().code(), ErrorCode::DataLost);
}

#[test]
fn a_bad_batch_refuses_the_whole_push() {
    let files = Numbers::default();
    let s = shuffle(1 << 20);
    let good = batch_body(0, 0, 10);
    let mut bad = BytesMut::from(&good[..]);
    let last = bad.len() - 1;
    bad[last] ^= 1;
    let mut body = BytesMut::from(&good[..]);
    body.extend_from_slice(&bad);
    let body = body.freeze();
    let n = good.len() as u32;
    let sections = [
        Section { partition_id: 0, offset: 0, length: n },
        Section { partition_id: 1, offset: n, length: n },
    ];
    let pushed = s.push(&sections, &body, None, &files);
    assert_eq!(
        (pushed.result.unwrap_err().code(), pushed.stored),
        (ErrorCode::ChecksumMismatch, 0)
    );
    assert_eq!(s.partition(0).unwrap().buffered_bytes(), 0, "nothing stored");
    let outside = [Section { partition_id: 0, offset: n, length: 2 * n }];
    let pushed = s.push(&outside, &body, None, &files);
    assert_eq!(pushed.result.unwrap_err().code(), ErrorCode::InvalidRequest);
}

/// What [`one_open_stream`] makes: the applications, the streams, the shuffle, the stream's id and
/// the time it opened.
type OneStream = (Apps<u32>, Streams<u32, u32>, std::sync::Arc<Shuffle<u32>>, u64, Instant);

/// Application "app"'s shuffle 1: one map's batch in partition 0 (file 0), committed, and a
/// stream open over it.
fn one_open_stream() -> OneStream {
    let files = Numbers::default();
    let apps: Apps<u32> = Apps::default();
    let streams: Streams<u32, u32> = Streams::default();
    let t0 = Instant::now();
    register(&apps, "app", 1, 10, t0);
    let s = apps.shuffle("app", 1).unwrap();
    let body = batch_body(0, 0, 10);
    let plan = s.push(&[section(0, &body)], &body, None, &files).flushes.pop().unwrap();
    s.flushed(plan, FlushOutcome::Written);
    s.mapper_end(0, 0, &[(0, 1)]).unwrap();
    assert!(s.begin_commit(&files).unwrap().flushes.is_empty());
    s.finish_commit().unwrap();
    let (chunks, _) =
        s.open_stream(&OpenStream { map_end: 1, ..stream(0) }, |f, _| *f.file().unwrap()).unwrap();
    let id = streams.open(s.clone(), chunks, t0);
    (apps, streams, s, id, t0)
}

#[test]
fn a_deleted_shuffle_serves_nothing_and_hands_back_its_files() {
    let (apps, streams, s, id, t0) = one_open_stream();
    assert_eq!(streams.fetch(id, 0, t0), Ok(0));
    let deleted = apps.unregister_shuffle("app", 1).unwrap().unwrap();
    assert_eq!(deleted.files, vec![0]);
    assert_eq!(s.lifecycle(), Lifecycle::Deleted);
    assert_eq!(streams.fetch(id, 0, t0).unwrap_err().code(), ErrorCode::UnknownStream);
    assert_eq!(streams.expire(t0, Duration::from_secs(1)), 0, "its streams go");
    assert!(s.partition(0).unwrap().chunks().is_empty());
    assert_eq!(apps.shuffle("app", 1).unwrap_err().code(), ErrorCode::UnknownShuffle);
}

#[test]
fn another_applications_stream_is_neither_served_nor_closed() {
    let (_apps, streams, _shuffle, id, t0) = one_open_stream();
    let other = |app: &str| app == "other";
    let own = |app: &str| app == "app";
    assert_eq!(streams.fetch_for(id, 0, t0, other).unwrap_err().code(), ErrorCode::Unauthorized);
    assert_eq!(streams.close_for(id, other).unwrap_err().code(), ErrorCode::Unauthorized);
    assert_eq!(streams.fetch_for(id, 0, t0, own), Ok(0), "still open for its own application");
    assert_eq!(streams.close_for(id, own), Ok(()));
    assert_eq!(streams.fetch_for(id, 0, t0, own).unwrap_err().code(), ErrorCode::UnknownStream);
    assert_eq!(streams.close_for(id, other), Ok(()), "closing a stream not open: a no-op");
}

#[test]
fn a_shuffle_not_held_of_an_application_unlisted_at_start_is_lost_to_its_readers_only() {
    let apps: Apps<u32> = Apps::default();
    let t0 = Instant::now();
    apps.touch("other", t0);
    apps.insert_unlisted("app", "/d1/app could not be listed at restart: denied", t0);
    let read = apps.shuffle_to_read("app", 4).unwrap_err();
    assert_eq!(read.code(), ErrorCode::DataLost);
    assert!(read.to_string().contains("could not be listed"), "{read}");
    // Pushes to it and other applications' shuffles are told what they were before.
    assert_eq!(apps.shuffle("app", 4).unwrap_err().code(), ErrorCode::UnknownShuffle);
    assert_eq!(apps.shuffle_to_read("other", 4).unwrap_err().code(), ErrorCode::UnknownShuffle);
    assert_eq!(apps.shuffle_to_read("none", 4).unwrap_err().code(), ErrorCode::UnknownApp);
    // A shuffle registered since is served as any other, and the application expires as any.
    let mut r = RegisterShuffle { app_id: "app".into(), num_maps: 1, ..Default::default() };
    (r.shuffle_id, r.num_partitions) = (5, 1);
    apps.register_shuffle(&r, 1 << 20, 0, t0).unwrap();
    assert!(apps.shuffle_to_read("app", 5).is_ok());
    // Unregistered since the start, it is unknown to its readers like any other.
    drop(apps.unregister_shuffle("app", 5).unwrap().unwrap());
    assert_eq!(apps.shuffle_to_read("app", 5).unwrap_err().code(), ErrorCode::UnknownShuffle);
    assert_eq!(apps.shuffle_to_read("app", 4).unwrap_err().code(), ErrorCode::DataLost);
    let later = t0 + Duration::from_secs(10);
    let mut expired = apps.expired(later, Duration::from_secs(1));
    expired.sort();
    assert_eq!(expired, ["app", "other"]);
}

#[test]
fn a_deleted_shuffle_cannot_be_registered_again_until_its_files_are_removed() {
    let apps: Apps<u32> = Apps::default();
    let t0 = Instant::now();
    register(&apps, "app", 1, 1 << 20, t0);
    let deleted = apps.unregister_shuffle("app", 1).unwrap().unwrap();
    assert!(apps.is_deleting("app", Some(1)) && apps.is_deleting("app", None));
    assert!(!apps.is_deleting("app", Some(2)) && !apps.is_deleting("other", None));
    let r = RegisterShuffle { app_id: "app".into(), shuffle_id: 1, ..Default::default() };
    let refused = apps.register_shuffle(&r, 1 << 20, 0, t0).unwrap_err();
    assert!(refused.code().is_retriable(), "{refused}");
    assert!(apps.unregister_shuffle("app", 1).unwrap().is_none());
    // The shell dropped it once the files were gone: the key is free again.
    drop(deleted);
    assert!(!apps.is_deleting("app", None));
    register(&apps, "app", 1, 1 << 20, t0);

    // The same for an application's shuffles, until each one's files are removed.
    let all = apps.remove("app").unwrap();
    assert!(apps.is_deleting("app", Some(1)));
    assert!(apps.register_shuffle(&r, 1 << 20, 0, t0).is_err());
    drop(all);
    assert!(apps
        .register_shuffle(&RegisterShuffle { num_maps: 1, num_partitions: 1, ..r }, 1 << 20, 0, t0)
        .is_ok());
}

#[test]
fn an_application_heard_from_after_it_was_found_expired_is_not_removed() {
    let apps: Apps<u32> = Apps::default();
    let t0 = Instant::now();
    apps.touch("a", t0);
    let (now, limit) = (t0 + Duration::from_secs(5), Duration::from_secs(1));
    assert_eq!(apps.expired(now, limit), ["a"]);
    apps.touch("a", now); // a heartbeat between the finding and the removal
    assert!(apps.remove_expired("a", now, limit).is_none());
    assert!(apps.shuffle("a", 1).is_err_and(|r| r.code() == ErrorCode::UnknownShuffle));
    let later = now + Duration::from_secs(5);
    assert!(apps.remove_expired("a", later, limit).is_some_and(|d| d.is_empty()));
}

#[test]
fn applications_expire_by_the_time_passed_in() {
    let apps: Apps<u32> = Apps::default();
    let t0 = Instant::now();
    apps.touch("a", t0);
    apps.touch("b", t0 + Duration::from_secs(5));
    assert_eq!(
        apps.expired(t0 + Duration::from_secs(8), Duration::from_secs(4)),
        vec!["a".to_string()]
    );
    assert!(apps.remove("a").unwrap().is_empty());
    assert!(apps.remove("a").is_none());
}

#[test]
fn named_attempts_read_a_later_attempt_and_skip_the_winner() {
    let files = Numbers::default();
    let s = shuffle(10);
    for attempt in [0, 1] {
        let body = batch_body(0, attempt, 10);
        let plan = s.push(&[section(0, &body)], &body, None, &files).flushes.pop().unwrap();
        s.flushed(plan, FlushOutcome::Written);
        s.mapper_end(0, attempt, &[(0, 1)]).unwrap();
    }
    s.mapper_end(1, 0, &[]).unwrap();
    assert!(s.begin_commit(&files).unwrap().flushes.is_empty());
    s.finish_commit().unwrap();
    let o = OpenStream { attempts: vec![MapAttempt { map_id: 0, attempt_id: 1 }], ..stream(0) };
    let (bodies, committed) = s.open_stream(&o, |f, r| (*f.file().unwrap(), r.to_vec())).unwrap();
    assert_eq!((committed.len(), committed[0].attempt_id), (1, 1));
    assert_eq!(
        bodies,
        vec![(0, vec![ByteRange { offset: 4096, len: 30 }])],
        "only attempt 1's chunk"
    );
    let o = OpenStream { attempts: vec![MapAttempt { map_id: 0, attempt_id: 2 }], ..stream(0) };
    assert_eq!(s.open_stream(&o, |_, _| ()).unwrap_err().code(), ErrorCode::DataLost);
}

#[test]
fn a_report_says_what_each_shuffle_holds() {
    let files = Numbers::default();
    let apps: Apps<u32> = Apps::default();
    let t0 = Instant::now();
    register(&apps, "b", 2, 1 << 20, t0);
    apps.touch("a", t0);
    let s = apps.shuffle("b", 1).unwrap();
    let body = batch_body(0, 0, 100);
    assert!(s.push(&[section(1, &body)], &body, None, &files).flushes.is_empty());
    s.mapper_end(0, 0, &[(1, 1)]).unwrap();
    let plan = s.take_flush(1, &files).unwrap().unwrap();
    let mid = apps.report(t0 + Duration::from_millis(1500));
    assert_eq!(mid.iter().map(|a| a.app_id.as_str()).collect::<Vec<_>>(), ["a", "b"]);
    let sr = &mid[1].shuffles[0];
    assert_eq!((mid[1].idle_ms, sr.state, sr.maps_ended), (1500, Lifecycle::Open, 1));
    assert_eq!((sr.buffered_bytes, sr.stored_bytes, sr.flushes_in_flight), (0, 0, 1));
    s.flushed(plan, FlushOutcome::Written);
    let sr = apps.report(t0).remove(1).shuffles.remove(0);
    assert_eq!(
        (sr.stored_bytes, sr.chunks, sr.flushes_in_flight, sr.lost_partitions),
        (120, 1, 0, 0)
    );
}

#[test]
fn a_deleted_shuffle_hands_back_every_file_of_a_partition_not_only_its_current_one() {
    // A write to file 0 failed and the flusher moved the plan to file 1: both are the
    // partition's, and the shell must retire both (a flush still holding file 0 would make it
    // again under the removal of the shuffle's directory).
    let mut files = Numbers::default();
    let s = shuffle(10);
    let body = batch_body(0, 0, 100);
    let mut plan = s.push(&[section(0, &body)], &body, None, &files).flushes.pop().unwrap();
    files.move_on = true;
    s.retarget(&mut plan, &files).unwrap();
    s.flushed(plan, FlushOutcome::Written);
    let removal = s.delete();
    assert_eq!((removal.current, removal.older), (vec![1], vec![0]));
}

#[test]
fn an_applications_shuffles_hold_at_most_their_share_of_partitions() {
    let apps: Apps<u32> = Apps::default().with_max_partitions_per_app(250);
    let now = Instant::now();
    let reg = |app: &str, id, n| {
        let r = RegisterShuffle {
            app_id: app.into(),
            shuffle_id: id,
            num_maps: 1,
            num_partitions: n,
            ..Default::default()
        };
        apps.register_shuffle(&r, 10, 0, now)
    };
    reg("a", 1, 100).unwrap();
    reg("a", 2, 100).unwrap();
    reg("a", 1, 100).unwrap(); // again: holds nothing more
    let e = reg("a", 3, 51).unwrap_err();
    assert_eq!(e.code(), ErrorCode::QuotaExceeded);
    assert!(e.reason().contains("max_partitions_per_app (250)"), "{}", e.reason());
    reg("a", 3, 50).unwrap();
    reg("b", 1, 250).unwrap(); // another application's own share
    apps.unregister_shuffle("a", 2).unwrap();
    reg("a", 4, 100).unwrap();
}

#[test]
fn a_deletion_waits_for_a_record_being_written_and_stamps_grow() {
    let apps: Apps<u32> = Apps::default();
    register(&apps, "app", 2, 10, Instant::now());
    let s = apps.shuffle("app", 1).unwrap();
    let mut writer = s.record_writer();
    let stamps: Vec<_> =
        (0..3).map(|_| decode_record(&writer.record(|f| f.to_string())).unwrap().stamp).collect();
    assert!(stamps[0] < stamps[1] && stamps[1] < stamps[2], "{stamps:?}");
    // Deleted while a record is being written: its files are removed only once it is written
    // (the shell holds this lock while it removes them).
    let deleted = apps.unregister_shuffle("app", 1).unwrap().unwrap();
    let writers = deleted.record_writers();
    assert!(writers.try_lock().is_none(), "the deletion would not wait for the writer");
    drop(writer);
    assert!(writers.try_lock().is_some());
    // A record read back is followed by later ones.
    let back = Shuffle::recovered(
        decode_record(&s.commit_record(|f| f.to_string())).unwrap(),
        |_, n, _, _| Ok(n),
    );
    let next = decode_record(&back.commit_record(|f| f.to_string())).unwrap().stamp;
    assert!(next > stamps[2] && next.incarnation == stamps[0].incarnation, "{next:?}");
}

#[test]
fn a_deleted_or_lost_partition_never_opens_a_file_again() {
    let mut files = Numbers::default();
    let s = shuffle(10);
    let body = batch_body(0, 0, 100);
    let mut plan = s.push(&[section(0, &body)], &body, None, &files).flushes.pop().unwrap();
    let removal = Removal { current: vec![0], ..Removal::default() };
    assert_eq!(s.delete(), removal, "unregistered while the plan's write is failing");
    files.move_on = true; // the write failed: the flusher moves the plan
    assert!(s.retarget(&mut plan, &files).is_err(), "no file for a deleted shuffle");
    assert_eq!(files.next.get(), 1, "nothing opened");
    s.flushed(plan, FlushOutcome::Written);
    assert!(s.partition(0).unwrap().chunks().is_empty(), "a deleted shuffle records nothing");

    let s = shuffle(10);
    let mut p1 = s.push(&[section(1, &body)], &body, None, &files).flushes.pop().unwrap();
    let p2 = s.push(&[section(1, &body)], &body, None, &files).flushes.pop().unwrap();
    s.flushed(p2, FlushOutcome::Lost("disk gone".into()));
    let opened = files.next.get();
    assert!(s.retarget(&mut p1, &files).is_err(), "no file for a lost partition");
    assert_eq!(files.next.get(), opened);
    s.flushed(p1, FlushOutcome::Lost("disk gone".into()));
}

/// Files are numbers from an atomic counter, shared by threads.
#[derive(Default)]
struct AtomicNumbers(std::sync::atomic::AtomicU32);

impl FileSource<u32> for AtomicNumbers {
    fn keeps(&self, _: &u32) -> bool {
        true
    }
    fn open(&self, _: &ShuffleKey, _: u32, _: u32) -> Result<u32, String> {
        Ok(self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
    }
}

/// Pushers on three threads, a fourth relieving memory and writing plans, and a commit in the
/// middle: every acknowledged byte ends in a chunk, all memory comes back, nothing stays in
/// flight. (The operation-sequence harness is single-threaded; this is its concurrent twin.)
#[test]
fn concurrent_pushes_relief_and_commit_lose_no_acknowledged_byte() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::{Arc, Mutex as StdMutex};
    for round in 0..60u64 {
        let files = Arc::new(AtomicNumbers::default());
        let s = Arc::new(Shuffle::new(ShuffleKey::new("app", 1), 4, 4, 300));
        let budget = MemoryBudget::new(1 << 30, 0.9, 0.95, 0.5);
        let plans: Arc<StdMutex<Vec<FlushPlan<u32>>>> = Arc::default();
        let acked = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let mut pushers = Vec::new();
        for t in 0..3u32 {
            let (s, files, plans, acked, budget) =
                (s.clone(), files.clone(), plans.clone(), acked.clone(), budget.clone());
            pushers.push(std::thread::spawn(move || {
                for i in 0..200u32 {
                    let body = batch_body(t, 0, 50 + (i as usize % 7) * 30);
                    let reservation = budget.try_reserve(body.len() as u64);
                    let pushed =
                        s.push(&[section((i + t) % 4, &body)], &body, reservation, &*files);
                    plans.lock().unwrap().extend(pushed.flushes);
                    match pushed.result {
                        Ok(()) => _ = acked.fetch_add(body.len() as u64, Ordering::Relaxed),
                        Err(r) => {
                            assert_eq!(r.code(), ErrorCode::ShuffleCommitted);
                            break;
                        }
                    }
                }
            }));
        }
        let writer = {
            let (s, files, plans, stop) = (s.clone(), files.clone(), plans.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Acquire) {
                    for pid in 0..4 {
                        if let Ok(Some(p)) = s.take_flush(pid, &*files) {
                            plans.lock().unwrap().push(p);
                        }
                    }
                    let taken: Vec<_> = plans.lock().unwrap().drain(..).collect();
                    for p in taken {
                        s.flushed(p, FlushOutcome::Written);
                    }
                    std::thread::yield_now();
                }
            })
        };
        std::thread::sleep(Duration::from_micros(200 + round * 30));
        let begun = s.begin_commit(&*files).unwrap();
        assert!(begun.lost.is_empty());
        plans.lock().unwrap().extend(begun.flushes);
        for h in pushers {
            h.join().unwrap();
        }
        while s.flushes_in_flight() > 0 {
            std::thread::yield_now();
        }
        stop.store(true, Ordering::Release);
        writer.join().unwrap();
        let stored: u64 = s.finish_commit().unwrap().iter().map(|p| p.bytes).sum();
        assert_eq!(stored, acked.load(Ordering::Relaxed), "round {round}: acknowledged bytes");
        assert_eq!(budget.used(), 0, "round {round}: memory left reserved");
    }
}

#[test]
fn an_empty_open_shuffle_parks_and_comes_back_open_one_with_data_does_not_park() {
    let files = Numbers::default();
    let s = shuffle(1 << 20);
    assert!(!s.unsealed_with_data(), "registered, nothing pushed");
    assert!(s.park());
    let body = batch_body(0, 0, 10);
    let pushed = s.push(&[section(0, &body)], &body, None, &files);
    assert_eq!(pushed.result.unwrap_err().code(), ErrorCode::ShuttingDown, "parked: retriable");
    // Nor map ends: its record is written without them, and one kept in memory only would be
    // lost at the restart.
    let ended = s.mapper_end(0, 0, &[]).unwrap_err();
    assert_eq!(ended.code(), ErrorCode::ShuttingDown, "parked: retriable");
    // Its record brings it back open: it takes pushes again.
    let back = Shuffle::recovered(
        decode_record(&s.commit_record(|f| f.to_string())).unwrap(),
        |_, _, n, _| n.parse::<u32>().map_err(|e| e.to_string()),
    );
    assert_eq!(back.lifecycle(), Lifecycle::Open);
    assert!(back.push(&[section(0, &body)], &body, None, &files).result.is_ok());
    assert!(back.mapper_end(0, 0, &[(0, 1)]).is_ok(), "and map ends");
    // Holding data (buffered only), it does not park: a stop must wait for its commit.
    assert!(back.unsealed_with_data());
    assert!(!back.park());
    assert!(back.push(&[section(1, &body)], &body, None, &files).result.is_ok(), "not left parked");
}

#[test]
fn an_offloaded_partition_serves_objects_survives_its_record_and_deletes_them() {
    let files = Numbers::default();
    let s = shuffle(100);
    for pid in 0..2 {
        let body = batch_body(0, 0, 200);
        let pushed = s.push(&[section(pid, &body)], &body, None, &files);
        for plan in pushed.flushes {
            s.flushed(plan, FlushOutcome::Written);
        }
    }
    s.mapper_end(0, 0, &[(0, 1), (1, 1)]).unwrap();
    s.mapper_end(1, 0, &[]).unwrap();
    assert!(s.offloadable().is_empty(), "nothing moves before the commit");
    assert!(s.begin_commit(&files).unwrap().flushes.is_empty());
    s.finish_commit().unwrap();
    // Readable, but its commit record not yet written: a move would rewrite a record that is
    // not there, or race the commit's own (which may then name the local files the move
    // deletes).
    assert!(s.offloadable().is_empty(), "nothing moves before the commit record is written");
    s.mark_recorded();
    let candidates = s.offloadable();
    assert_eq!(candidates.iter().map(|c| c.0).collect::<Vec<_>>(), vec![0, 1]);
    assert_eq!(candidates[0].1, vec![(0, 4096)], "the file and its padded end");

    // The wrong number of objects changes nothing; the right one hands the files back.
    assert!(s.offloaded(0, vec![]).is_err());
    assert_eq!(s.offloaded(0, vec!["k0".into()]), Ok(vec![0]));
    assert!(s.offloaded(0, vec!["k1".into()]).is_err(), "moved already");
    assert_eq!(s.offloadable().len(), 1, "only partition 1 is left to move");
    assert_eq!(s.offloaded_bytes(), 220);
    let (bodies, _) = s
        .open_stream(&stream(0), |src, r| match src {
            ChunkSource::Object(k) => (k.to_owned(), r.to_vec()),
            ChunkSource::File(f) => panic!("served from file {f} after the move"),
        })
        .unwrap();
    assert_eq!(bodies, vec![("k0".to_owned(), vec![ByteRange { offset: 0, len: 220 }])]);

    // The record says where it is; a restart reads it back from there.
    let record = s.commit_record(|f| format!("/dir/{f}"));
    let back = Shuffle::recovered(decode_record(&record).unwrap(), |_, n, _, _| Ok(100 + n));
    assert!(back.is_recorded(), "read back from its record: recorded");
    let (bodies, _) = back.open_stream(&stream(0), |src, _| format!("{src:?}")).unwrap();
    assert_eq!(bodies, vec!["Object(\"k0\")".to_owned()]);
    let (bodies, _) = back.open_stream(&stream(1), |src, _| format!("{src:?}")).unwrap();
    assert_eq!(bodies, vec!["File(100)".to_owned()], "partition 1 is still local");

    // Deleting hands the objects back to be deleted; a move after the deletion is refused.
    assert_eq!(s.delete().objects, vec!["k0".to_owned()]);
    assert!(s.offloaded(1, vec!["k2".into()]).is_err(), "deleted meanwhile");
}

#[test]
fn a_partition_reaching_the_split_threshold_is_named_in_each_push_from_then_on() {
    let files = Numbers::default();
    let budget = MemoryBudget::new(1 << 20, 0.9, 0.95, 0.5);
    // Chunks of 100 bytes (each push is flushed at once): the threshold counts flushed bytes
    // (page-padded, as the file cursor stands) and buffered ones alike.
    let s = shuffle(100).with_split_bytes(4096);
    let body = batch_body(0, 0, 200);
    let push = |p: u32| s.push(&[section(p, &body)], &body, budget.try_reserve(220), &files);
    let first = push(1);
    assert!(first.split.is_empty(), "220 bytes held: under the threshold");
    let second = push(1);
    assert_eq!(second.split, vec![1], "a page written and 220 bytes held: past it");
    let other = push(0);
    assert!(other.split.is_empty(), "partition 0 holds 220 bytes");
    let third = push(1);
    assert_eq!(third.split, vec![1], "still past it: every push says so");
    for p in [first, second, other, third] {
        for plan in p.flushes {
            s.flushed(plan, FlushOutcome::Written);
        }
    }
    // 0: never on size.
    let never = shuffle(100).with_split_bytes(0);
    let pushed = never.push(&[section(1, &body)], &body, budget.try_reserve(220), &files);
    assert!(pushed.split.is_empty());
    for plan in pushed.flushes {
        never.flushed(plan, FlushOutcome::Written);
    }
}

#[test]
fn consecutive_small_chunks_of_a_file_are_served_as_one_within_the_chunk_size_and_the_frame() {
    let files = Numbers::default();
    let budget = MemoryBudget::new(1 << 20, 0.9, 0.95, 0.5);
    let s = shuffle(1000);
    // Every push flushed at once (as while the flushers are idle): four chunks in file 0.
    let mut batches = [0u32; 2];
    for (map, len) in [(0, 280), (1, 280), (0, 280), (1, 600)] {
        let body = batch_body(map, 0, len);
        let r = budget.try_reserve(body.len() as u64);
        let pushed = s.push_flushing_at(&[section(0, &body)], &body, r, &files, 1);
        assert_eq!(pushed.flushes.len(), 1, "flushed early");
        for plan in pushed.flushes {
            s.flushed(plan, FlushOutcome::Written);
        }
        batches[map as usize] += 1;
    }
    assert_eq!(s.partition(0).unwrap().chunks().len(), 4);
    for map in 0..2 {
        s.mapper_end(map, 0, &[(0, batches[map as usize])]).unwrap();
    }
    assert!(s.begin_commit(&files).unwrap().flushes.is_empty());
    s.finish_commit().unwrap();
    let served = |max: u64| {
        let (bodies, _) = s
            .open_stream_within(&stream(0), max, |_, r| r.iter().map(|r| r.len).sum::<u64>())
            .unwrap();
        bodies
    };
    // 300 + 300 + 300 fit in 1,000; the 620 goes alone.
    assert_eq!(served(u64::MAX), vec![900, 620], "merged up to the chunk size");
    assert_eq!(served(650), vec![600, 300, 620], "frames of 650 bytes: two at most");
    assert_eq!(served(599), vec![300, 300, 300, 620], "no two fit; a chunk alone is never cut");
    // The bytes are the chunks', in index order, page padding left out.
    let (ranges, _) = s.open_stream(&stream(0), |_, r| r.to_vec()).unwrap();
    let offsets: Vec<_> = ranges[0].iter().map(|r| (r.offset, r.len)).collect();
    assert_eq!(offsets, vec![(0, 300), (4096, 300), (8192, 300)]);
}

#[test]
fn a_buffer_waiting_through_two_age_checks_is_flushed_and_only_while_open() {
    let files = Numbers::default();
    let s = shuffle(1 << 20);
    let push = |pid: u32, len: usize| {
        let body = batch_body(0, 0, len);
        let pushed = s.push(&[section(pid, &body)], &body, None, &files);
        assert!(pushed.flushes.is_empty() && pushed.result.is_ok());
    };
    push(0, 5000);
    push(1, 100); // under a page: never flushed for its age
    let (plans, lost) = s.flush_aged(4096, &files);
    assert!(plans.is_empty() && lost.is_empty(), "first seen now");
    push(0, 10);
    let (plans, _) = s.flush_aged(4096, &files);
    let got: Vec<_> = plans.iter().map(|p| (p.partition(), p.bytes())).collect();
    assert_eq!(got, vec![(0, 5050)], "waited a whole interval: flushed, with what came since");
    for plan in plans {
        s.flushed(plan, FlushOutcome::Written);
    }
    push(0, 5000);
    assert!(s.flush_aged(4096, &files).0.is_empty(), "a new buffer starts unseen");
    assert!(s.begin_commit(&files).unwrap().flushes.len() == 2);
    assert!(s.flush_aged(0, &files).0.is_empty(), "a committing shuffle is the commit's");
}

#[test]
fn ids_a_reader_could_never_name_are_refused() {
    let files = Numbers::default();
    let s = shuffle(1 << 20); // 2 maps, 2 partitions
                              // A batch of map 2 of a 2-map shuffle: stored, no stream could ever read it.
    let body = batch_body(2, 0, 10);
    let pushed = s.push(&[section(0, &body)], &body, None, &files);
    assert_eq!((pushed.result.unwrap_err().code(), pushed.stored), (ErrorCode::InvalidRequest, 0));
    assert_eq!(s.partition(0).unwrap().buffered_bytes(), 0, "nothing stored");
    // A map end that reports batches of partition 2 of a 2-partition shuffle.
    let e = s.mapper_end(0, 0, &[(0, 1), (2, 1)]).unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidRequest, "{}", e.reason());
    assert!(s.mapper_end(0, 0, &[(0, 1), (1, 1)]).is_ok());
}

#[test]
fn a_shuffle_lost_at_start_refuses_its_commit_and_registration_with_data_lost() {
    let files = Numbers::default();
    let apps: Apps<u32> = Apps::default();
    let s = Shuffle::lost_at_start(ShuffleKey::new("app", 1), "record unreadable".into());
    apps.insert_recovered(s, Instant::now());
    let s = apps.shuffle("app", 1).unwrap();
    // A retried commit must not answer "committed, no partitions": the data is gone.
    let e = s.begin_commit(&files).unwrap_err();
    assert_eq!(e.code(), ErrorCode::DataLost, "{}", e.reason());
    let r = RegisterShuffle {
        app_id: "app".into(),
        shuffle_id: 1,
        num_maps: 2,
        num_partitions: 2,
        ..Default::default()
    };
    let e = apps.register_shuffle(&r, 1 << 20, 0, Instant::now()).unwrap_err();
    assert_eq!(e.code(), ErrorCode::DataLost, "{}", e.reason());
    assert_eq!(s.open_stream(&stream(0), |_, _| ()).unwrap_err().code(), ErrorCode::DataLost);
}
