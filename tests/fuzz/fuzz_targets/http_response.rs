//! Fuzz target `http_response`: see `harness::http_response` for what it covers.
#![no_main]

#[allow(dead_code)]
#[path = "../harness.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::http_response(data));
