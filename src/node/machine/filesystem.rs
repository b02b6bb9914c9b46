//! The size of the filesystem holding a path (statvfs), as cAdvisor reports
//! it: the node's ephemeral-storage capacity and the nodefs signals.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Size of the filesystem holding a path, as cAdvisor reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct FsStats {
    /// Bytes: fragment size × blocks.
    pub(crate) capacity: u64,
    /// Bytes available to unprivileged users: fragment size × blocks
    /// available (the eviction signal nodefs.available).
    pub(crate) available: u64,
    /// Total inodes; 0 on filesystems that do not count them (btrfs).
    pub(crate) inodes: u64,
    /// Free inodes (the eviction signal nodefs.inodesFree).
    pub(crate) inodes_free: u64,
}

/// statvfs(2) of `path`.
pub(crate) fn fs_stats(path: &Path) -> std::io::Result<FsStats> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{}: path contains a NUL byte", path.display()),
        )
    })?;
    // SAFETY: statvfs is plain data; the call fills it or fails.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
        let e = std::io::Error::last_os_error();
        return Err(std::io::Error::new(
            e.kind(),
            format!("statvfs {}: {e}", path.display()),
        ));
    }
    let frsize = s.f_frsize as u64;
    Ok(FsStats {
        capacity: frsize.saturating_mul(s.f_blocks as u64),
        available: frsize.saturating_mul(s.f_bavail as u64),
        inodes: s.f_files as u64,
        inodes_free: s.f_ffree as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fs_stats_of_root() {
        let s = fs_stats(Path::new("/")).unwrap();
        assert!(s.capacity > 0);
        assert!(s.available <= s.capacity);
        assert!(s.inodes_free <= s.inodes);
        let e = fs_stats(Path::new("/no/such/dir")).unwrap_err();
        assert!(e.to_string().contains("/no/such/dir"), "{e}");
    }
}
