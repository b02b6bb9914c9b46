//! tinylet: a synchronous, thread-per-pod Kubernetes node agent.
//!
//! The binary (`src/main.rs`) parses flags, sets up logging and signals and
//! runs an [`agent::Agent`], which starts the threads; everything lives in
//! these modules, named after their upstream kubelet
//! counterparts. See ARCHITECTURE.md for the map.
//!
//! Without the `cri` feature (on by default) only the modules that need no
//! CRI client are built: the ground floor, `kube`, `events`, `admission`,
//! `config`, `fieldpath`, `volume` and the pure parts of `images` (the
//! keyring, the pull policy and back-off). That is what the fuzz targets
//! decode with, and it compiles no gRPC. Items only the CRI side uses are
//! then unused, which is expected of that build and not worth a warning.
#![cfg_attr(not(feature = "cri"), allow(dead_code, unused_imports))]

pub mod active_deadline;
pub mod admission;
#[cfg(feature = "cri")]
pub mod agent;
pub mod apitime;
pub mod atomic_file;
pub mod certificate;
pub mod config;
#[cfg(feature = "cri")]
pub mod cri;
pub mod document;
pub mod events;
#[cfg(feature = "cri")]
pub mod eviction;
pub mod fault;
pub mod fieldpath;
pub mod health;
pub mod httpget;
pub mod image_reference;
pub mod images;
pub mod kube;
#[cfg(feature = "cri")]
pub mod kubelet;
#[cfg(feature = "cri")]
pub mod logs;
pub mod malloc;
pub mod metrics;
pub mod mount;
#[cfg(feature = "cri")]
pub mod node;
#[cfg(feature = "cri")]
pub mod options;
pub mod paths;
#[cfg(feature = "cri")]
pub mod pleg;
pub mod pod;
#[cfg(feature = "cri")]
pub mod pod_workers;
#[cfg(feature = "cri")]
pub mod prober;
pub mod quantity;
pub mod rlimit;
#[cfg(feature = "cri")]
pub mod runonce;
#[cfg(feature = "cri")]
pub mod runtime;
#[cfg(feature = "cri")]
pub mod server;
#[cfg(feature = "cri")]
pub mod stats;
#[cfg(feature = "cri")]
pub mod status;
#[cfg(feature = "cri")]
pub mod status_cmd;
pub mod sysctl;
pub mod thread;
pub mod tls_roots;
pub mod version;
pub mod volume;
pub mod x509;
