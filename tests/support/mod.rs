//! Helpers shared by the integration tests.

pub mod agent;
pub mod churn;
pub mod containerd;
pub mod fake_apiserver;
pub mod fake_cri;
pub mod registry;
pub mod relay;
pub mod streams;
