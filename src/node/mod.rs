//! The node: registering this machine as a Node object, keeping the
//! Node's status (capacity, allocatable, conditions, addresses, node info)
//! up to date, and renewing the node's Lease in kube-node-lease.
//!
//! `machine` holds the facts about the host those threads report: what it
//! is (cores, memory, ids, kernel, OS image, architecture), its root
//! filesystem, its addresses and its reservations. It is plain functions
//! over /proc, /sys, /etc and statvfs, each with a variant that reads
//! injected text or an injected root so tests need no particular host.
//! The pressure conditions are read from `pressure`, which the eviction
//! manager (`crate::eviction`) writes, as upstream's node status reads them
//! from its eviction manager; `machine`'s own pressure reading, against the default
//! thresholds, is only used where no manager runs (`--runonce`).

pub(crate) mod lease;
pub(crate) mod machine;
pub(crate) mod pressure;
pub(crate) mod state;
pub(crate) mod status;
pub(crate) mod taint;

pub(crate) use state::{initial_node_state, node_info, NodeStateReader, NodeStateWriter};
