//! Pod status: generating the API status of a pod from its spec and the
//! runtime's view of it (`generate`), and reporting it to the apiserver.
//!
//! Generation is pure (no I/O, no threads): the reporter feeds it the
//! runtime's state and the last status the apiserver holds, and sends the
//! strategic-merge patch it computes.

pub mod generate;
pub mod manager;

pub use generate::{generate_pod_status, pod_phase, status_equal, status_patch, StatusContext};
