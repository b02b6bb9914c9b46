//! The node: registering this machine as a Node object, keeping the
//! Node's status (capacity, allocatable, conditions, addresses, node info)
//! up to date, and renewing the node's Lease in kube-node-lease.
//!
//! `machine` holds the facts about the host those threads report: what it
//! is (cores, memory, ids, kernel, OS image, architecture), its root
//! filesystem, its addresses, its reservations and whether it is under
//! memory, disk or PID pressure. It is plain functions over /proc, /sys,
//! /etc and statvfs, each with a variant that reads injected text or an
//! injected root so tests need no particular host.

pub mod lease;
pub mod machine;
pub mod state;
pub mod status;

pub use state::{initial_node_state, node_info, NodeState};
