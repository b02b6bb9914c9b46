//! Fuzz target `watch_stream`: see `harness::watch_stream` for what it covers.
#![no_main]

#[allow(dead_code)]
#[path = "../harness.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::watch_stream(data));
