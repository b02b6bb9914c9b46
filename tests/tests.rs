//! One integration test binary: the real `tinylet` binary against a fake CRI
//! server, the pod config sources against local servers, and end-to-end
//! against a private, real containerd.

mod support;

mod agent;
mod bootstrap;
mod cluster;
mod config_sources;
mod e2e;
mod env;
mod fake_apiserver_conformance;
mod fake_cri_conformance;
mod fuzz_regressions;
mod hostile_watch;
mod http_source;
mod layers;
mod node_auth;
mod object_volumes;
mod relay;
mod runonce;
mod server;
mod status_cmd;
mod tidy;
