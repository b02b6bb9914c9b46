//! Fuzz target `docker_config_glob`: see `harness::docker_config_glob` for
//! what it covers.
#![no_main]

#[allow(dead_code)]
#[path = "../harness.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::docker_config_glob(data));
