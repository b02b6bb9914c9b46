//! The node's pressure conditions (MemoryPressure, DiskPressure,
//! PIDPressure) as the eviction manager last decided them: it writes them,
//! the node status and admission read them. Only the words and the shared
//! state live here; deciding them is the eviction manager's.

use std::sync::atomic::{AtomicU8, Ordering};

/// A node pressure condition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Condition {
    Memory,
    Disk,
    Pid,
}

impl Condition {
    fn bit(self) -> u8 {
        match self {
            Condition::Memory => 1,
            Condition::Disk => 2,
            Condition::Pid => 4,
        }
    }

    /// The condition's type in the Node's status.
    pub(crate) fn type_name(self) -> &'static str {
        match self {
            Condition::Memory => "MemoryPressure",
            Condition::Disk => "DiskPressure",
            Condition::Pid => "PIDPressure",
        }
    }
}

/// The pressure conditions as last decided, shared by the manager (which
/// writes them) with the node status and admission (which read them).
#[derive(Debug, Default)]
pub(crate) struct State(AtomicU8);

impl State {
    pub(crate) fn set(&self, conditions: &[Condition]) {
        let bits = conditions.iter().fold(0, |b, c| b | c.bit());
        self.0.store(bits, Ordering::Relaxed);
    }

    pub(crate) fn has(&self, c: Condition) -> bool {
        self.0.load(Ordering::Relaxed) & c.bit() != 0
    }

    pub(crate) fn conditions(&self) -> Vec<Condition> {
        [Condition::Memory, Condition::Disk, Condition::Pid]
            .into_iter()
            .filter(|c| self.has(*c))
            .collect()
    }
}
