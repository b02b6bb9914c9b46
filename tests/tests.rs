//! One integration test binary: the real `tinylet` binary against a fake CRI
//! server, the pod config sources against local servers, and end-to-end
//! against a private, real containerd.

mod support;

mod agent;
mod cluster;
mod config_sources;
mod e2e;
mod e2e_churn;
mod e2e_cluster;
mod e2e_disk;
mod e2e_env;
mod e2e_eviction;
mod e2e_hostile_numbers;
mod e2e_images;
mod e2e_kill;
mod e2e_lifecycle;
mod e2e_logs;
mod e2e_node_api;
mod e2e_objects;
mod e2e_outage;
mod e2e_pod_fields;
mod e2e_policy;
mod e2e_probes;
mod e2e_read_only;
mod e2e_runtime_outage;
mod e2e_security;
mod e2e_spec;
mod e2e_stats;
mod e2e_status;
mod e2e_stream;
mod env;
mod fake_apiserver;
mod fake_cri;
mod fuzz_regressions;
mod hostile_watch;
mod http_source;
mod node_auth;
mod object_volumes;
mod runonce;
mod server;
mod status_cmd;
mod tidy;
