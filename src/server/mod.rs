//! The node's API (upstream's kubelet server): the HTTPS server on
//! `--port` (10250) that the apiserver calls for logs, exec, attach and
//! port-forward, Prometheus and metrics-server read, and the plain
//! health and read-only ports. It reads the node's state and the runtime,
//! and never changes a pod.

pub mod conn;
pub mod head;
pub mod stream;
