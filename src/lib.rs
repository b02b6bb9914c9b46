//! tinylet: a synchronous, thread-per-pod Kubernetes node agent.
//!
//! The binary (`src/main.rs`) parses flags and wires the threads; everything
//! else lives in these modules, named after their upstream kubelet
//! counterparts. See ARCHITECTURE.md for the map.

pub mod active_deadline;
pub mod admission;
pub mod apitime;
pub mod atomic_file;
pub mod config;
pub mod cri;
pub mod document;
pub mod events;
pub mod eviction;
pub mod fault;
pub mod fieldpath;
pub mod health;
pub mod httpget;
pub mod image_reference;
pub mod images;
pub mod kube;
pub mod kubelet;
pub mod logs;
pub mod malloc;
pub mod metrics;
pub mod mount;
pub mod node;
pub mod options;
pub mod paths;
pub mod pleg;
pub mod pod;
pub mod pod_workers;
pub mod prober;
pub mod quantity;
pub mod runonce;
pub mod runtime;
pub mod server;
pub mod stats;
pub mod status;
pub mod status_cmd;
pub mod sysctl;
pub mod thread;
pub mod tls_roots;
pub mod version;
pub mod volume;
