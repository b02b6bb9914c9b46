//! What each pod uses of the node, as the eviction manager ranks and
//! limits pods by it: working set, writable layers, logs and local volumes.

/// What a pod uses, from the statistics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodUsage {
    pub containers: Vec<ContainerUsage>,
    pub volumes: Vec<VolumeUsage>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerUsage {
    pub name: String,
    pub memory_working_set: Option<u64>,
    /// Writable layer.
    pub rootfs_bytes: Option<u64>,
    pub rootfs_inodes: Option<u64>,
    pub logs_bytes: Option<u64>,
    pub logs_inodes: Option<u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VolumeUsage {
    pub name: String,
    /// A disk-backed emptyDir or another volume counted as local
    /// ephemeral storage.
    pub ephemeral: bool,
    pub bytes: u64,
    pub inodes: u64,
}

impl PodUsage {
    /// Bytes (or inodes) on the node's filesystem: writable layers, logs
    /// and local ephemeral volumes, as upstream's disk ranking measures.
    pub fn disk(&self, inodes: bool) -> u64 {
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

    pub fn memory(&self) -> u64 {
        self.containers
            .iter()
            .map(|c| c.memory_working_set.unwrap_or(0))
            .sum()
    }
}
