//! Fuzz target `manifest`: see `harness::manifest` for what it covers.
#![no_main]

#[allow(dead_code)]
#[path = "../harness.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::manifest(data));
