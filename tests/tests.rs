//! One integration test binary: the real `tinylet` binary against a fake CRI
//! server, and end-to-end against a private, real containerd.

mod support;

mod agent;
mod e2e;
mod fake_cri;
mod tidy;
