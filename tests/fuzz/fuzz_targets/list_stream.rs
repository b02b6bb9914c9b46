//! Fuzz target `list_stream`: see `harness::list_stream` for what it covers.
#![no_main]

#[allow(dead_code)]
#[path = "../harness.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::list_stream(data));
