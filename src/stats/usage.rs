//! What each pod uses of the node, as the eviction manager ranks and
//! limits pods by it: working set, writable layers, logs and local volumes.
//!
//! Logs and volumes are measured by walks (`paths::disk_usage`) that may
//! stop short of a tree a container made huge; such a measure is marked
//! incomplete here, and the eviction manager takes it to be over every
//! limit rather than the lower bound it is.

/// What a pod uses, from the statistics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct PodUsage {
    pub(crate) containers: Vec<ContainerUsage>,
    pub(crate) volumes: Vec<VolumeUsage>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ContainerUsage {
    pub(crate) name: String,
    pub(crate) memory_working_set: Option<u64>,
    /// Writable layer.
    pub(crate) rootfs_bytes: Option<u64>,
    pub(crate) rootfs_inodes: Option<u64>,
    pub(crate) logs_bytes: Option<u64>,
    pub(crate) logs_inodes: Option<u64>,
    /// The walk of the logs did not see all of them.
    pub(crate) logs_incomplete: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct VolumeUsage {
    pub(crate) name: String,
    /// A disk-backed emptyDir or another volume counted as local
    /// ephemeral storage.
    pub(crate) ephemeral: bool,
    pub(crate) bytes: u64,
    pub(crate) inodes: u64,
    /// The walk did not see the whole volume: `bytes` and `inodes` are
    /// a lower bound.
    pub(crate) incomplete: bool,
}

impl PodUsage {
    /// Bytes (or inodes) on the node's filesystem: writable layers, logs
    /// and local ephemeral volumes, as upstream's disk ranking measures.
    pub(crate) fn disk(&self, inodes: bool) -> u64 {
        let containers: u64 = self
            .containers
            .iter()
            .map(|c| {
                if inodes {
                    c.rootfs_inodes.unwrap_or(0) + c.logs_inodes.unwrap_or(0)
                } else {
                    c.rootfs_bytes.unwrap_or(0) + c.logs_bytes.unwrap_or(0)
                }
            })
            .sum();
        let volumes: u64 = self
            .volumes
            .iter()
            .filter(|v| v.ephemeral)
            .map(|v| if inodes { v.inodes } else { v.bytes })
            .sum();
        containers + volumes
    }

    /// Whether a part of what [`PodUsage::disk`] sums was measured only
    /// in part: a log directory or a local ephemeral volume whose walk
    /// stopped short.
    pub(crate) fn disk_incomplete(&self) -> bool {
        self.containers.iter().any(|c| c.logs_incomplete)
            || self.volumes.iter().any(|v| v.ephemeral && v.incomplete)
    }

    pub(crate) fn memory(&self) -> u64 {
        self.containers
            .iter()
            .map(|c| c.memory_working_set.unwrap_or(0))
            .sum()
    }
}
