//! Fuzzes the server's shuffle core with operation sequences: pushes, flushes done and failed,
//! memory relief, map ends, commits, streams and chunk fetches, unregistering, failing disks and
//! time passing, with the core's invariants checked after every step (see
//! `sluice_server::fuzzing`). Run: `cargo +nightly fuzz run core_ops` (see docs/testing.md).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    sluice_server::fuzzing::run(data);
});
