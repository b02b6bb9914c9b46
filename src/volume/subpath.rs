//! Safe subPath mounts (upstream's `pkg/volume/util/subpath`, linux): a
//! volumeMount's subPath is resolved one element at a time from the
//! volume's root with `openat(O_NOFOLLOW)`, missing elements are made as
//! directories the same way (`mkdirat`), and the runtime is handed a bind
//! mount of the resolved file descriptor (`/proc/self/fd/<n>`) made at
//! `<root-dir>/pods/<uid>/volume-subpaths/<volume>/<container>/<index>`.
//! A container that plants a symlink in a volume it can write, or swaps
//! one in after the check, cannot get another path mounted: any symlink
//! and anything that would leave the volume is refused.
//!
//! Volumes tinylet writes itself (secret, configMap, downwardAPI,
//! projected) are read-only to containers and use the atomic writer's
//! `..data` symlinks; for those the symlinks that stay inside the volume
//! are resolved first, and the resolved path gets the same walk.
//!
//! The mounts are undone with the pod's volumes (`crate::mount::unmount_below` on
//! the pod's directory) and by housekeeping's sweep of orphaned pod
//! directories.

use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};

use crate::paths::{fstat, is_type, open_at};

/// Symlinks followed at most while resolving the atomic writer's links.
const MAX_LINKS: usize = 40;

/// What a volumeMount with a subPath needs to be mounted safely.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SubPath {
    /// The volume's directory on the host.
    pub(crate) volume_root: PathBuf,
    /// The subPath (after `subPathExpr` expansion), relative to the root.
    pub(crate) path: String,
    /// The volume's name (a directory of the bind mount's path).
    pub(crate) volume: String,
    /// The mount's index in the container's volumeMounts.
    pub(crate) index: usize,
    /// A volume tinylet writes with the `..data` layout, whose own
    /// symlinks (inside the volume) are followed.
    pub(crate) writer_links: bool,
}

/// The directory of the pod's subPath bind mounts.
pub(crate) fn pod_subpaths_dir(pod_dir: &Path) -> PathBuf {
    pod_dir.join("volume-subpaths")
}

/// Whether `sub` is relative and has only plain names (no `..`, no `.`,
/// not absolute, not empty).
pub(crate) fn check_relative(sub: &str) -> Result<(), String> {
    let p = Path::new(sub);
    if p.is_absolute() {
        return Err("must not be an absolute path".into());
    }
    if sub.is_empty() || p.components().any(|c| !matches!(c, Component::Normal(_))) {
        return Err("must be a relative path without '..'".into());
    }
    Ok(())
}

fn cstr(name: &OsStr) -> io::Result<CString> {
    CString::new(name.as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))
}

/// Opens `sub` below the directory `root` without following any symlink
/// (`O_PATH|O_NOFOLLOW` for each element), making missing elements as
/// directories with the root's mode (upstream's doSafeMakeDir: the last
/// element may be an existing file of any kind). The fd returned is the
/// resolved file or directory.
pub(crate) fn open_beneath(root: &Path, sub: &str) -> Result<OwnedFd, String> {
    check_relative(sub)?;
    let root_c = cstr(root.as_os_str()).map_err(|e| format!("{}: {e}", root.display()))?;
    // The volume's own directory is tinylet's or the hostPath the pod
    // named: links in it are followed, as upstream does.
    let mut cur = open_at(libc::AT_FDCWD, &root_c, libc::O_PATH | libc::O_DIRECTORY)
        .map_err(|e| format!("open volume directory {}: {e}", root.display()))?;
    let perm = fstat(cur.as_raw_fd())
        .map_err(|e| format!("stat {}: {e}", root.display()))?
        .st_mode
        & 0o7777;
    let names: Vec<&OsStr> = Path::new(sub).iter().collect();
    let mut walked = PathBuf::new();
    for (i, name) in names.iter().enumerate() {
        let last = i + 1 == names.len();
        walked.push(name);
        let c = cstr(name).map_err(|e| format!("{}: {e}", walked.display()))?;
        let next = match open_at(cur.as_raw_fd(), &c, libc::O_PATH | libc::O_NOFOLLOW) {
            Ok(fd) => fd,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                make_dir_at(cur.as_raw_fd(), &c, perm)
                    .map_err(|e| format!("create directory {}: {e}", walked.display()))?
            }
            Err(e) => return Err(format!("open {}: {e}", walked.display())),
        };
        let st = fstat(next.as_raw_fd()).map_err(|e| format!("stat {}: {e}", walked.display()))?;
        if is_type(&st, libc::S_IFLNK) {
            return Err(format!(
                "{} is a symlink, which could point out of the volume",
                walked.display()
            ));
        }
        if !last && !is_type(&st, libc::S_IFDIR) {
            return Err(format!("{} is not a directory", walked.display()));
        }
        cur = next;
    }
    Ok(cur)
}

/// `mkdirat` of `name` in `dir` with `perm` (not cut by the umask), then
/// opened without following links. Someone else making it first is fine;
/// what is there is then checked like any existing element.
fn make_dir_at(dir: RawFd, name: &CString, perm: libc::mode_t) -> io::Result<OwnedFd> {
    // SAFETY: `name` is a valid NUL-terminated string.
    let rc = unsafe { libc::mkdirat(dir, name.as_ptr(), perm & 0o777) };
    if rc != 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EEXIST) {
            return Err(e);
        }
        return open_at(dir, name, libc::O_PATH | libc::O_NOFOLLOW);
    }
    let fd = open_at(
        dir,
        name,
        libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_DIRECTORY,
    )?;
    // SAFETY: `fd` is a valid open directory.
    if unsafe { libc::fchmod(fd.as_raw_fd(), perm) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// Resolves the symlinks of `sub` inside the volume `root` (the atomic
/// writer's `key -> ..data/key` and `..data -> ..<time>`): only relative
/// links whose target stays inside the volume are followed. Returns the
/// resolved path, relative to the root, with no symlinks left for the
/// walk to meet (unless something changed meanwhile, which the walk
/// refuses).
pub(crate) fn resolve_writer_links(root: &Path, sub: &str) -> Result<String, String> {
    check_relative(sub)?;
    let mut pending: Vec<OsString> = Path::new(sub)
        .iter()
        .rev()
        .map(OsStr::to_os_string)
        .collect();
    let mut resolved: Vec<OsString> = Vec::new();
    let mut links = 0;
    while let Some(name) = pending.pop() {
        match Path::new(&name).components().next() {
            Some(Component::CurDir) | None => continue,
            Some(Component::ParentDir) => {
                if resolved.pop().is_none() {
                    return Err("a symlink in it points out of the volume".into());
                }
                continue;
            }
            _ => {}
        }
        resolved.push(name);
        let here: PathBuf = resolved.iter().collect();
        let full = root.join(&here);
        let Ok(meta) = std::fs::symlink_metadata(&full) else {
            // Missing: the walk makes it (or says why it cannot).
            continue;
        };
        if !meta.file_type().is_symlink() {
            continue;
        }
        links += 1;
        if links > MAX_LINKS {
            return Err("too many levels of symlinks".into());
        }
        let target =
            std::fs::read_link(&full).map_err(|e| format!("read link {}: {e}", here.display()))?;
        if target.is_absolute() {
            return Err(format!("{} is a symlink out of the volume", here.display()));
        }
        resolved.pop();
        pending.extend(target.iter().rev().map(OsStr::to_os_string));
    }
    if resolved.is_empty() {
        return Err("resolves to the volume itself".into());
    }
    let out: PathBuf = resolved.iter().collect();
    out.into_os_string()
        .into_string()
        .map_err(|_| "resolves to a name that is not UTF-8".into())
}

/// Resolves `sp` safely and bind-mounts it at `target` (made as a file or a
/// directory to match). A bind mount already at `target` is kept when it
/// shows the same file, and replaced otherwise. Returns the target, the
/// host path the runtime mounts.
pub(crate) fn prepare(sp: &SubPath, target: &Path) -> Result<PathBuf, String> {
    let path = if sp.writer_links {
        resolve_writer_links(&sp.volume_root, &sp.path)?
    } else {
        sp.path.clone()
    };
    let fd = open_beneath(&sp.volume_root, &path)?;
    bind_fd(&fd, target).map_err(|e| format!("bind mount at {}: {e}", target.display()))?;
    Ok(target.to_path_buf())
}

fn same_file(st: &libc::stat, m: &std::fs::Metadata) -> bool {
    m.dev() == st.st_dev && m.ino() == st.st_ino
}

/// Bind-mounts the file or directory `fd` refers to at `target`.
fn bind_fd(fd: &OwnedFd, target: &Path) -> io::Result<()> {
    let src = fstat(fd.as_raw_fd())?;
    let is_dir = is_type(&src, libc::S_IFDIR);
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent)?;
    }
    match std::fs::symlink_metadata(target) {
        Ok(m) if same_file(&src, &m) => return Ok(()),
        Ok(_) => {
            unmount_all(target)?;
            let m = std::fs::symlink_metadata(target)?;
            if m.is_dir() != is_dir {
                if m.is_dir() {
                    std::fs::remove_dir(target)?;
                } else {
                    std::fs::remove_file(target)?;
                }
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    if std::fs::symlink_metadata(target).is_err() {
        if is_dir {
            std::os::unix::fs::DirBuilderExt::mode(&mut std::fs::DirBuilder::new(), 0o750)
                .create(target)?;
        } else {
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o640)
                .custom_flags(libc::O_NOFOLLOW)
                .open(target)?;
        }
    }
    let source =
        CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd())).map_err(io::Error::other)?;
    let target_c = cstr(target.as_os_str())?;
    // SAFETY: every pointer is a valid NUL-terminated string that outlives
    // the call; a bind mount takes no filesystem type or data.
    let rc = unsafe {
        libc::mount(
            source.as_ptr(),
            target_c.as_ptr(),
            std::ptr::null(),
            libc::MS_BIND,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // What is mounted must be what was resolved.
    let m = std::fs::symlink_metadata(target)?;
    if !same_file(&src, &m) {
        let _ = unmount_all(target);
        return Err(io::Error::other(
            "the mount shows another file than the one resolved",
        ));
    }
    Ok(())
}

/// Unmounts whatever is stacked on `target` (never following a symlink
/// there); a busy mount is detached.
fn unmount_all(target: &Path) -> io::Result<()> {
    let c = cstr(target.as_os_str())?;
    for _ in 0..16 {
        // SAFETY: `c` is a valid NUL-terminated path.
        let rc = unsafe { libc::umount2(c.as_ptr(), libc::UMOUNT_NOFOLLOW) };
        if rc == 0 {
            continue;
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINVAL) | Some(libc::ENOENT) => return Ok(()),
            Some(libc::EBUSY) => {
                // SAFETY: as above.
                let rc =
                    unsafe { libc::umount2(c.as_ptr(), libc::UMOUNT_NOFOLLOW | libc::MNT_DETACH) };
                if rc != 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            _ => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// A temp dir with a volume `vol` and a directory `outside` that
    /// planted links point at (never the host's `/`: if the refusal ever
    /// broke, only the test's own files would be exposed). Whatever is
    /// still mounted below it is unmounted before it is deleted, so its
    /// removal never reaches through a mount.
    struct Scratch(tempfile::TempDir);

    impl Scratch {
        fn path(&self) -> &Path {
            self.0.path()
        }
        fn outside(&self) -> PathBuf {
            self.0.path().join("outside")
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = crate::mount::unmount_below(self.0.path());
        }
    }

    fn volume() -> (Scratch, PathBuf) {
        let t = Scratch(tempfile::tempdir().unwrap());
        let root = t.path().join("vol");
        std::fs::create_dir(&root).unwrap();
        std::fs::create_dir(t.outside()).unwrap();
        (t, root)
    }

    #[test]
    fn a_symlink_out_of_the_volume_is_refused() {
        let (t, root) = volume();
        symlink(t.outside(), root.join("x")).unwrap();
        let e = open_beneath(&root, "x").unwrap_err();
        assert!(e.contains("x is a symlink"), "{e}");
        let e = open_beneath(&root, "x/etc/tinylet-probe").unwrap_err();
        assert!(e.contains("x is a symlink"), "{e}");
        assert!(!t.outside().join("etc").exists());
    }

    #[test]
    fn a_symlink_in_the_middle_is_refused_even_to_inside_the_volume() {
        let (t, root) = volume();
        std::fs::create_dir_all(root.join("a/real")).unwrap();
        symlink(t.outside(), root.join("a/out")).unwrap();
        symlink("real", root.join("a/in")).unwrap();
        for sub in ["a/out/vol", "a/in", "a/in/deeper"] {
            let e = open_beneath(&root, sub).unwrap_err();
            assert!(e.contains("is a symlink"), "{sub}: {e}");
        }
        assert!(!root.join("a/real/deeper").exists());
    }

    #[test]
    fn dot_dot_and_absolute_paths_are_refused() {
        let (_t, root) = volume();
        std::fs::create_dir(root.join("a")).unwrap();
        for sub in ["..", "a/../..", "a/..", "/etc", "./a", ""] {
            assert!(open_beneath(&root, sub).is_err(), "{sub:?}");
        }
    }

    #[test]
    fn missing_elements_are_made_as_directories_with_the_volume_mode() {
        use std::os::unix::fs::PermissionsExt;
        let (_t, root) = volume();
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o777)).unwrap();
        let fd = open_beneath(&root, "a/b/c").unwrap();
        let st = fstat(fd.as_raw_fd()).unwrap();
        assert!(is_type(&st, libc::S_IFDIR));
        for d in ["a", "a/b", "a/b/c"] {
            let m = std::fs::symlink_metadata(root.join(d)).unwrap();
            assert!(m.is_dir(), "{d}");
            assert_eq!(
                m.mode() & 0o777,
                0o777,
                "{d}: the root's mode, whatever the umask"
            );
        }
        // Again: the same directory.
        let again = open_beneath(&root, "a/b/c").unwrap();
        let st2 = fstat(again.as_raw_fd()).unwrap();
        assert_eq!((st.st_dev, st.st_ino), (st2.st_dev, st2.st_ino));
    }

    #[test]
    fn an_existing_file_may_be_the_last_element_only() {
        let (_t, root) = volume();
        std::fs::create_dir(root.join("d")).unwrap();
        std::fs::write(root.join("d/f"), "x").unwrap();
        let fd = open_beneath(&root, "d/f").unwrap();
        assert!(is_type(&fstat(fd.as_raw_fd()).unwrap(), libc::S_IFREG));
        let e = open_beneath(&root, "d/f/g").unwrap_err();
        assert!(e.contains("not a directory"), "{e}");
    }

    #[test]
    fn the_writer_links_inside_the_volume_are_resolved_and_others_refused() {
        let (_t, root) = volume();
        let mut files = crate::volume::payload::Payload::new();
        files.insert(
            "labels".into(),
            crate::volume::payload::File {
                data: b"a=b".to_vec(),
                mode: 0o644,
            },
        );
        files.insert(
            "sub/key".into(),
            crate::volume::payload::File {
                data: b"k".to_vec(),
                mode: 0o644,
            },
        );
        crate::volume::writer::write_payload(&root, &files).unwrap();
        let data = std::fs::read_link(root.join("..data")).unwrap();
        let got = resolve_writer_links(&root, "labels").unwrap();
        assert_eq!(Path::new(&got), data.join("labels"));
        let fd = open_beneath(&root, &got).unwrap();
        assert!(is_type(&fstat(fd.as_raw_fd()).unwrap(), libc::S_IFREG));
        let got = resolve_writer_links(&root, "sub/key").unwrap();
        assert_eq!(Path::new(&got), data.join("sub/key"));

        symlink("/etc", root.join("abs")).unwrap();
        symlink("../..", root.join("up")).unwrap();
        assert!(resolve_writer_links(&root, "abs/passwd").is_err());
        assert!(resolve_writer_links(&root, "up/x").is_err());
        symlink("loop", root.join("loop")).unwrap();
        assert!(resolve_writer_links(&root, "loop").is_err());
    }

    #[test]
    fn the_bind_mount_shows_the_resolved_file_and_is_redone_when_it_changed() {
        let (t, root) = volume();
        std::fs::create_dir(root.join("d")).unwrap();
        std::fs::write(root.join("d/f"), "one").unwrap();
        let target = t.path().join("subpaths/vol/app/0");
        let sp = SubPath {
            volume_root: root.clone(),
            path: "d".into(),
            volume: "vol".into(),
            index: 0,
            writer_links: false,
        };
        let got = prepare(&sp, &target).unwrap();
        assert_eq!(std::fs::read_to_string(got.join("f")).unwrap(), "one");
        // Reused as it is.
        prepare(&sp, &target).unwrap();
        assert_eq!(crate::mount::mounts_below(&target).unwrap().len(), 1);
        // The directory was replaced: mounted again, and a file now.
        std::fs::rename(root.join("d"), root.join("old")).unwrap();
        std::fs::write(root.join("d"), "two").unwrap();
        prepare(&sp, &target).unwrap();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "two");
        // A symlink there now: refused, and nothing new mounted.
        std::fs::remove_file(root.join("d")).unwrap();
        symlink(t.outside(), root.join("d")).unwrap();
        assert!(prepare(&sp, &target).is_err());
        crate::mount::unmount_below(t.path()).unwrap();
        assert!(crate::mount::mounts_below(t.path()).unwrap().is_empty());
    }
}
