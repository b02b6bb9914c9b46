//! Whole-file writes that a full or read-only disk cannot leave half done:
//! the bytes go to a dotfile beside the target, which is renamed over it
//! only once complete, so a reader sees the old file or the new one, never
//! a cut-off mix. When any step fails the dotfile is removed again (a full
//! disk keeps no litter) and the error names the step, the path and the
//! OS error (`No space left on device (os error 28)`, ENOSPC;
//! `Read-only file system (os error 30)`, EROFS).

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// How hard a write tries to survive a power cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Durability {
    /// The file is flushed before the rename and the directory after it:
    /// for state read back after a reboot (pod checkpoints).
    Fsync,
    /// Atomic against a full disk and crashes of tinylet, not against a
    /// power cut: for files rewritten at each use (a pod's /etc/hosts).
    Rename,
}

/// The dotfile `write_file` stages `path`'s new content in.
pub(crate) fn temp_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.tmp"))
}

/// Replaces `path` with `data` (file mode `mode`) in one rename. On error
/// `path` is as it was and the staging file is gone.
pub(crate) fn write_file(
    path: &Path,
    data: &[u8],
    mode: u32,
    durability: Durability,
) -> io::Result<()> {
    let tmp = temp_path(path);
    let result = stage(&tmp, data, mode, durability).and_then(|()| {
        crate::fault::point("file-staged", path.display());
        fs::rename(&tmp, path).map_err(|e| context(e, "rename", &tmp, Some(path)))
    });
    if let Err(e) = result {
        // Best effort: on a read-only filesystem the file was never made.
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    if durability == Durability::Fsync {
        if let Some(dir) = path.parent() {
            fs::File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| context(e, "fsync directory", dir, None))?;
        }
    }
    Ok(())
}

fn stage(tmp: &Path, data: &[u8], mode: u32, durability: Durability) -> io::Result<()> {
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(tmp)
        .map_err(|e| context(e, "create", tmp, None))?;
    f.write_all(data)
        .map_err(|e| context(e, "write", tmp, None))?;
    // The umask may have cut bits the caller asked for.
    f.set_permissions(fs::Permissions::from_mode(mode))
        .map_err(|e| context(e, "chmod", tmp, None))?;
    if durability == Durability::Fsync {
        f.sync_all().map_err(|e| context(e, "fsync", tmp, None))?;
    }
    Ok(())
}

/// `e` with the step and path(s) in its message (which keeps the OS
/// error's text and code); the kind is kept, so callers can match on it.
fn context(e: io::Error, step: &str, path: &Path, to: Option<&Path>) -> io::Error {
    let what = match to {
        Some(to) => format!("{step} {} to {}", path.display(), to.display()),
        None => format!("{step} {}", path.display()),
    };
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_the_file_in_one_step_and_keeps_the_old_one_on_failure() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("etc-hosts");
        write_file(&path, b"one\n", 0o644, Durability::Rename).unwrap();
        write_file(&path, b"two\n", 0o600, Durability::Fsync).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"two\n");
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert!(!temp_path(&path).exists());

        // The rename cannot happen (a directory is in the way): the staged
        // file is removed and the error names both paths.
        let blocked = dir.path().join("blocked");
        fs::create_dir(&blocked).unwrap();
        fs::write(blocked.join("x"), "keep").unwrap();
        let e = write_file(&blocked, b"new", 0o644, Durability::Rename).unwrap_err();
        let text = e.to_string();
        assert!(text.starts_with("rename "), "{text}");
        assert!(text.contains(&blocked.display().to_string()), "{text}");
        assert!(text.contains("(os error "), "{text}");
        assert!(!temp_path(&blocked).exists(), "staging file left behind");
        assert_eq!(fs::read_to_string(blocked.join("x")).unwrap(), "keep");

        // A missing directory: nothing is created, the error says where.
        let e =
            write_file(&dir.path().join("no/such"), b"x", 0o644, Durability::Rename).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert!(e.to_string().starts_with("create "), "{e}");
    }
}
