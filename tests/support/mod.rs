//! Helpers shared by the integration tests.

pub mod containerd;
pub mod fake_cri;
