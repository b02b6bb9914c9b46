//! Volume ownership for a pod's `fsGroup` (upstream's SetVolumeOwnership):
//! every file and directory of the volume gets the group, group read (and
//! write for writable volumes) and, for directories, group search and the
//! set-group-ID bit so that new files inherit the group.

use std::fs;
use std::io;
use std::os::unix::fs::{lchown, PermissionsExt};
use std::path::Path;

/// Group bits added to files of writable and of read-only volumes.
const RW_MASK: u32 = 0o660;
const RO_MASK: u32 = 0o440;
/// Added to directories: group search, and set-group-ID.
const DIR_MASK: u32 = 0o110 | 0o2000;

/// Gives everything under `dir` (itself included) the group `gid`.
/// Symlinks get the group but keep their (meaningless) mode.
pub(crate) fn set_group(dir: &Path, gid: u32, read_only: bool) -> io::Result<()> {
    let meta = fs::symlink_metadata(dir)?;
    apply(dir, &meta, gid, read_only)?;
    if meta.is_dir() {
        for entry in fs::read_dir(dir)? {
            set_group(&entry?.path(), gid, read_only)?;
        }
    }
    Ok(())
}

/// The mode a file of mode `mode` has once the group was given.
pub(crate) fn file_mode(mode: u32, read_only: bool) -> u32 {
    mode | if read_only { RO_MASK } else { RW_MASK }
}

fn apply(path: &Path, meta: &fs::Metadata, gid: u32, read_only: bool) -> io::Result<()> {
    lchown(path, None, Some(gid))?;
    if meta.file_type().is_symlink() {
        return Ok(());
    }
    let mut mask = if read_only { RO_MASK } else { RW_MASK };
    if meta.is_dir() {
        mask |= DIR_MASK;
    }
    let mode = meta.permissions().mode() & 0o7777;
    if mode | mask != mode {
        fs::set_permissions(path, fs::Permissions::from_mode(mode | mask))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{symlink, MetadataExt};

    #[test]
    fn files_and_directories_get_the_group_and_its_bits() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("vol");
        fs::create_dir_all(dir.join("sub")).unwrap();
        fs::write(dir.join("sub/key"), "v").unwrap();
        fs::set_permissions(dir.join("sub/key"), fs::Permissions::from_mode(0o600)).unwrap();
        symlink("sub/key", dir.join("key")).unwrap();

        set_group(&dir, 4321, true).unwrap();
        let meta = |p: &str| fs::symlink_metadata(dir.join(p)).unwrap();
        assert_eq!(meta("sub/key").gid(), 4321);
        assert_eq!(meta("sub/key").mode() & 0o7777, 0o640);
        assert_eq!(meta("sub").mode() & 0o2070, 0o2050);
        assert_eq!(meta("key").gid(), 4321);
        assert_eq!(fs::metadata(&dir).unwrap().gid(), 4321);

        set_group(&dir, 4321, false).unwrap();
        assert_eq!(meta("sub/key").mode() & 0o7777, 0o660);
        assert_eq!(meta("sub").mode() & 0o2070, 0o2070);
    }
}
