//! Fuzzes the frame decoder: `check` + `parse` + message decoding + batch walking, on arbitrary
//! bytes. Run: `cargo +nightly fuzz run frame_decode` (see docs/testing.md).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    sluice_proto::fuzzing::decode_frame(data);
});
