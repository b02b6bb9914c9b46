//! Paths built from names that come from pods (UIDs, volume and container
//! names), and the two file-system operations that must not be turned
//! against the host by such a name or by what a container left in a pod's
//! directory: creating directories with fixed modes, removing a tree, and
//! measuring what a tree uses.
//!
//! Names are validated before a pod is accepted (`config::validation`);
//! `join` checks again wherever one becomes a path, so a name that slipped
//! through (a runtime label, a checkpoint) can never reach outside its root.
//!
//! `remove_tree` never follows a symlink (every step is an `openat` or
//! `unlinkat` relative to a directory opened with `O_NOFOLLOW`) and never
//! enters another file system: it refuses a tree that still has mounts
//! below it, and stops at any directory whose device differs from the
//! tree's. Its walk is iterative and holds one directory open at a time,
//! so a container that nested directories thousands deep cannot exhaust
//! the worker's stack or its file descriptors.
//!
//! `disk_usage` walks the same way (`openat` with `O_NOFOLLOW`, `fstatat`
//! with `AT_SYMLINK_NOFOLLOW`, never across a device), iteratively and
//! with a bounded number of directories open, but with no depth bound:
//! a container cannot hide what it writes by nesting it deep. Its only
//! bound is the number of entries it looks at, and a walk that stops there
//! (or misses part of the tree for any reason) says it is incomplete. The
//! walk is self-contained (`Dir`, `Frame`, `UsageWalk` here) so that other
//! walks over trees a container wrote can take the same shape.

use std::ffi::{CStr, CString};
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The longest pod UID accepted, in bytes. The API server's UIDs are 36
/// characters and static pods' are 32; the bound only keeps the names of
/// the directories built from a UID (`<ns>_<name>_<uid>` among them) within
/// what file systems take.
pub(crate) const UID_MAX: usize = 128;

/// Modes of the directories tinylet makes under `--root-dir`: the root,
/// `pods`, each pod's directory, its `volumes` and plugin directories
/// (upstream's setupDataDirs and makePodDataDirs).
pub(crate) const PRIVATE_DIR_MODE: u32 = 0o750;

/// Why `name` cannot be one element of a path, if it cannot: empty, `.` or
/// `..`, or holding a `/` or a NUL.
pub(crate) fn element_error(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        Some("must not be empty")
    } else if name == "." || name == ".." {
        Some("must not be '.' or '..'")
    } else if name.contains('/') {
        Some("must not contain '/'")
    } else if name.contains('\0') {
        Some("must not contain a NUL byte")
    } else {
        None
    }
}

/// Why `uid` cannot be a pod's UID, if it cannot (see `UID_MAX`).
pub(crate) fn uid_error(uid: &str) -> Option<String> {
    if let Some(why) = element_error(uid) {
        return Some(why.to_string());
    }
    if uid.len() > UID_MAX {
        return Some(format!("must be no more than {UID_MAX} bytes"));
    }
    None
}

/// `root/name`, where `name` must be one plain path element: the result
/// stays directly under `root` whatever `name` is, or this fails.
pub(crate) fn join(root: &Path, name: &str) -> io::Result<PathBuf> {
    match element_error(name) {
        None => Ok(root.join(name)),
        Some(why) => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{name:?} cannot be a name under {}: it {why}",
                root.display()
            ),
        )),
    }
}

/// The directory of the pod `uid`: `<root_dir>/pods/<uid>`.
pub(crate) fn pod_dir(root_dir: &Path, uid: &str) -> io::Result<PathBuf> {
    if let Some(why) = uid_error(uid) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("pod UID {uid:?} cannot name a directory: it {why}"),
        ));
    }
    join(&root_dir.join("pods"), uid)
}

/// Makes `dir` a directory of mode `mode` whatever the umask: created with
/// it, or, when it exists, narrowed to it (never widened: an administrator
/// may have made it narrower). A symlink or a file in its place is an
/// error.
pub(crate) fn ensure_dir(dir: &Path, mode: u32) -> io::Result<()> {
    match fs::DirBuilder::new().mode(mode).create(dir) {
        Ok(()) => fs::set_permissions(dir, fs::Permissions::from_mode(mode)),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            let meta = fs::symlink_metadata(dir)?;
            if !meta.is_dir() {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!("{} exists and is not a directory", dir.display()),
                ));
            }
            let have = meta.mode() & 0o7777;
            if have & !mode & 0o777 != 0 {
                fs::set_permissions(dir, fs::Permissions::from_mode(have & (mode | 0o7000)))?;
            }
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// Makes the directories `base/names[0]/names[1]/...`, each with `mode`
/// (see `ensure_dir`). `base` must exist; every name is checked by `join`.
/// Returns the deepest one.
pub(crate) fn ensure_dirs_under(base: &Path, names: &[&str], mode: u32) -> io::Result<PathBuf> {
    let mut dir = base.to_path_buf();
    for name in names {
        dir = join(&dir, name)?;
        ensure_dir(&dir, mode)?;
    }
    Ok(dir)
}

/// Makes `<root_dir>/pods/<uid>` and the directories `names` below it, all
/// of `PRIVATE_DIR_MODE`. Returns the deepest one.
pub(crate) fn ensure_pod_dirs(root_dir: &Path, uid: &str, names: &[&str]) -> io::Result<PathBuf> {
    let pod = pod_dir(root_dir, uid)?;
    ensure_dir(&root_dir.join("pods"), PRIVATE_DIR_MODE)?;
    ensure_dir(&pod, PRIVATE_DIR_MODE)?;
    ensure_dirs_under(&pod, names, PRIVATE_DIR_MODE)
}

/// `openat(dir, name, flags | O_CLOEXEC)` as an owned descriptor: the one
/// way the descriptor walks (`volume::ownership`, `volume::subpath`) open
/// what they look at.
pub(crate) fn open_at(
    dir: libc::c_int,
    name: &CStr,
    flags: libc::c_int,
) -> io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: `name` is NUL-terminated; the descriptor returned is new and
    // owned by nobody else.
    let fd = unsafe { libc::openat(dir, name.as_ptr(), flags | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

/// `fstat` of an open descriptor (`O_PATH` is enough).
pub(crate) fn fstat(fd: libc::c_int) -> io::Result<libc::stat> {
    // SAFETY: an all-zero `stat` is a valid value to be overwritten.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is valid for writes; the caller's `fd` is open.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

/// Whether `st` is of file type `t` (`libc::S_IFDIR`, `S_IFREG`, ...).
pub(crate) fn is_type(st: &libc::stat, t: libc::mode_t) -> bool {
    st.st_mode & libc::S_IFMT == t
}

fn cstr(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))
}

/// An open directory, closed on drop.
struct Dir(libc::c_int);

impl Drop for Dir {
    fn drop(&mut self) {
        // SAFETY: the descriptor is ours and closed once.
        unsafe { libc::close(self.0) };
    }
}

const DIR_FLAGS: libc::c_int =
    libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;

impl Dir {
    fn open_at(parent: libc::c_int, name: &CStr) -> io::Result<Dir> {
        // SAFETY: `name` is NUL-terminated; the result is checked.
        let fd = unsafe { libc::openat(parent, name.as_ptr(), DIR_FLAGS) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Dir(fd))
    }

    fn stat(&self) -> io::Result<libc::stat> {
        fstat(self.0)
    }

    fn stat_at(&self, name: &CStr) -> io::Result<libc::stat> {
        // SAFETY: as above; AT_SYMLINK_NOFOLLOW stats a symlink itself.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: valid descriptor, NUL-terminated name, writable `st`.
        let rc =
            unsafe { libc::fstatat(self.0, name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(st)
    }

    fn unlink_at(&self, name: &CStr, dir: bool) -> io::Result<()> {
        let flags = if dir { libc::AT_REMOVEDIR } else { 0 };
        // SAFETY: valid descriptor and NUL-terminated name.
        if unsafe { libc::unlinkat(self.0, name.as_ptr(), flags) } != 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::NotFound {
                return Err(e);
            }
        }
        Ok(())
    }

    /// The names in the directory, `.` and `..` left out.
    fn names(&self) -> io::Result<Vec<CString>> {
        let mut out = Vec::new();
        self.for_each_name(|name| {
            out.push(name.to_owned());
            true
        })?;
        Ok(out)
    }

    /// Calls `f` with each name in the directory (`.` and `..` left out)
    /// as it is read, until `f` returns false.
    fn for_each_name(&self, mut f: impl FnMut(&CStr) -> bool) -> io::Result<()> {
        // fdopendir takes the descriptor it is given: hand it a copy.
        // SAFETY: the descriptor is open; the result is checked.
        let copy = unsafe { libc::fcntl(self.0, libc::F_DUPFD_CLOEXEC, 0) };
        if copy < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `copy` is an open directory descriptor we own.
        let stream = unsafe { libc::fdopendir(copy) };
        if stream.is_null() {
            let e = io::Error::last_os_error();
            // SAFETY: fdopendir failed, so `copy` is still ours to close.
            unsafe { libc::close(copy) };
            return Err(e);
        }
        // SAFETY: a fresh stream of a copied descriptor starts at offset 0
        // only after a rewind (the copy shares the offset).
        unsafe { libc::rewinddir(stream) };
        let mut result = Ok(());
        loop {
            // readdir tells an error from the end only by errno.
            // SAFETY: errno is thread-local.
            unsafe { *libc::__errno_location() = 0 };
            // SAFETY: `stream` is a valid DIR*; readdir returns null at the end.
            let entry = unsafe { libc::readdir(stream) };
            if entry.is_null() {
                let e = io::Error::last_os_error();
                if e.raw_os_error().is_some_and(|n| n != 0) {
                    result = Err(e);
                }
                break;
            }
            // SAFETY: d_name is a NUL-terminated array inside the entry,
            // valid until the next readdir (`f` makes none on this stream).
            let name = unsafe { CStr::from_ptr((*entry).d_name.as_ptr()) };
            let b = name.to_bytes();
            if b != b"." && b != b".." && !f(name) {
                break;
            }
        }
        // SAFETY: closes the stream and `copy` with it, once.
        unsafe { libc::closedir(stream) };
        result
    }
}

fn is_dir(st: &libc::stat) -> bool {
    is_type(st, libc::S_IFDIR)
}

/// Removes `dir` and everything below it, without following symlinks and
/// without entering another file system (see the module doc). Refuses,
/// leaving it all in place, when anything is still mounted at or below
/// `dir`. A `dir` that does not exist is fine; a symlink or file at `dir`
/// is removed itself, never what it points to.
pub(crate) fn remove_tree(dir: &Path) -> io::Result<()> {
    let meta = match fs::symlink_metadata(dir) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if !meta.is_dir() {
        return fs::remove_file(dir);
    }
    let mounts = crate::mount::mounts_below(dir)?;
    if let Some(m) = mounts.first() {
        return Err(io::Error::other(format!(
            "{} is still mounted; not removing {}",
            m.display(),
            dir.display()
        )));
    }
    let path = cstr(dir)?;
    let mut cur = Dir::open_at(libc::AT_FDCWD, &path)?;
    let top = cur.stat()?;
    if top.st_ino != meta.ino() || top.st_dev != meta.dev() {
        return Err(io::Error::other(format!(
            "{} changed while it was being removed",
            dir.display()
        )));
    }
    let dev = top.st_dev;
    // The directories entered below `dir`: each one's name in its parent,
    // and the parent's inode (the way back up is checked against it).
    let mut trail: Vec<(CString, libc::ino_t)> = Vec::new();
    let mut cur_ino = top.st_ino;
    loop {
        let mut subdir = None;
        for name in cur.names()? {
            let st = match cur.stat_at(&name) {
                Ok(st) => st,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            if !is_dir(&st) {
                cur.unlink_at(&name, false)?;
            } else if st.st_dev != dev {
                return Err(io::Error::other(format!(
                    "a mount point below {} ({:?}); not crossing it",
                    dir.display(),
                    name
                )));
            } else if subdir.is_none() {
                subdir = Some(name);
            }
        }
        match subdir {
            Some(name) => {
                let child = Dir::open_at(cur.0, &name)?;
                let st = child.stat()?;
                if st.st_dev != dev {
                    return Err(io::Error::other(format!(
                        "a mount point below {} ({:?}); not crossing it",
                        dir.display(),
                        name
                    )));
                }
                trail.push((name, cur_ino));
                cur = child;
                cur_ino = st.st_ino;
            }
            None => {
                let Some((name, parent_ino)) = trail.pop() else {
                    break;
                };
                let dotdot = CString::new("..").map_err(io::Error::other)?;
                let parent = Dir::open_at(cur.0, &dotdot)?;
                let st = parent.stat()?;
                if st.st_ino != parent_ino || st.st_dev != dev {
                    return Err(io::Error::other(format!(
                        "a directory below {} was moved while it was being removed",
                        dir.display()
                    )));
                }
                cur = parent;
                cur_ino = st.st_ino;
                cur.unlink_at(&name, true)?;
            }
        }
    }
    drop(cur);
    match fs::remove_dir(dir) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// What a tree uses on its file system: allocated bytes (`st_blocks`, as
/// `du` counts them, each hard-linked inode once) and inodes (every entry,
/// the top directory included), and the top directory's device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DiskUsage {
    pub(crate) bytes: u64,
    pub(crate) inodes: u64,
    pub(crate) dev: u64,
    /// False when the walk did not see the whole tree: it stopped at its
    /// entry budget (or the names it keeps waiting grew past theirs), a
    /// directory could not be read, or one it had left was moved while it
    /// was below it. The counts are then what was seen, a lower bound:
    /// whoever decides by them must take the tree to be at least as large
    /// as any limit (see `eviction::local_storage_violation`).
    pub(crate) complete: bool,
}

/// Directories a usage walk holds open at most. Deeper, the ancestor's
/// descriptor furthest up is closed; the walk opens it again through `..`
/// of its child when it comes back up, and checks it is the same inode.
const HELD_DIRS: usize = 16;

/// Bytes of names of directories still to enter that a usage walk keeps,
/// at most (a container that makes a million subdirectories cannot make
/// tinylet hold their names): past it the walk stops, incomplete.
const PENDING_NAMES_MAX: usize = 16 << 20;

/// Inodes with more than one link a usage walk remembers to count once.
/// Past it further links are each counted, as if they were files: more
/// than the tree uses, never less.
const LINKED_MAX: usize = 1 << 16;

/// Measures the tree at `dir` as `du -x` and a count of its entries would,
/// without following symlinks (every step an `openat` with `O_NOFOLLOW`
/// relative to its parent, every stat `AT_SYMLINK_NOFOLLOW`) and without
/// entering other file systems.
///
/// The walk has no depth bound a container could hide data behind: it is
/// iterative (an explicit stack, no recursion), holds at most
/// [`HELD_DIRS`] directories open, and keeps in memory only the names of
/// the subdirectories it has still to enter (files are counted as their
/// directory is read). What bounds it is the work: at most `max_entries`
/// entries are looked at. Where it stops short, or cannot see part of the
/// tree, the result says so (`complete` false) rather than passing for the
/// whole. There is no time budget: a walk's verdict must not depend on how
/// slow the disk is.
pub(crate) fn disk_usage(dir: &Path, max_entries: u64) -> io::Result<DiskUsage> {
    let top = Dir::open_at(libc::AT_FDCWD, &cstr(dir)?)?;
    let st = top.stat()?;
    let mut walk = UsageWalk {
        usage: DiskUsage {
            bytes: blocks(&st),
            inodes: 1,
            dev: st.st_dev,
            complete: true,
        },
        max_entries,
        linked: std::collections::HashSet::new(),
        pending: 0,
        stopped: false,
    };
    let subdirs = walk.read(&top);
    let mut stack = vec![Frame {
        dir: Some(top),
        ino: st.st_ino,
        subdirs,
    }];
    while !walk.stopped {
        let Some(frame) = stack.last_mut() else {
            break;
        };
        let Some(name) = walk.next_subdir(&mut frame.subdirs) else {
            // This directory is done: back up to its parent, opened again
            // if its descriptor was let go.
            let Some(done) = stack.pop() else {
                break;
            };
            if let (Some(parent), Some(child)) = (stack.last_mut(), done.dir) {
                if parent.dir.is_none() && !parent.reopen(&child, walk.usage.dev) {
                    walk.usage.complete = false;
                    break;
                }
            }
            continue;
        };
        // The top frame's directory is always open (see `Frame::reopen`).
        let Some(cur) = frame.dir.as_ref() else {
            walk.usage.complete = false;
            break;
        };
        let child = match Dir::open_at(cur.0, &name) {
            Ok(d) => d,
            // Gone, or replaced by a symlink or a file, since it was
            // counted: what it held is not in the tree any more.
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ENOENT | libc::ELOOP | libc::ENOTDIR)
                ) =>
            {
                continue
            }
            Err(_) => {
                walk.usage.complete = false;
                continue;
            }
        };
        let Ok(cst) = child.stat() else {
            walk.usage.complete = false;
            continue;
        };
        if cst.st_dev != walk.usage.dev {
            // Mounted on since it was counted: another file system's.
            continue;
        }
        let subdirs = walk.read(&child);
        stack.push(Frame {
            dir: Some(child),
            ino: cst.st_ino,
            subdirs,
        });
        // The open directories are the top of the stack, HELD_DIRS at most.
        if let Some(i) = stack.len().checked_sub(HELD_DIRS + 1) {
            stack[i].dir = None;
        }
    }
    Ok(walk.usage)
}

fn blocks(st: &libc::stat) -> u64 {
    u64::try_from(st.st_blocks).unwrap_or(0).saturating_mul(512)
}

/// One directory of a usage walk's stack.
struct Frame {
    /// None once let go (it is not among the [`HELD_DIRS`] deepest).
    dir: Option<Dir>,
    ino: libc::ino_t,
    /// Names of the subdirectories still to enter, each NUL-terminated.
    subdirs: Vec<u8>,
}

impl Frame {
    /// Opens this frame's directory again as `..` of `child`, which the
    /// walk has just left: true if that is the same directory (device and
    /// inode) it was. Not so when `child` was moved meanwhile; the walk
    /// then cannot know where it is, and stops.
    fn reopen(&mut self, child: &Dir, dev: libc::dev_t) -> bool {
        let Ok(dotdot) = CString::new("..") else {
            return false;
        };
        let Ok(dir) = Dir::open_at(child.0, &dotdot) else {
            return false;
        };
        match dir.stat() {
            Ok(st) if st.st_dev == dev && st.st_ino == self.ino => {
                self.dir = Some(dir);
                true
            }
            _ => false,
        }
    }
}

/// The counts of a usage walk and what bounds it.
struct UsageWalk {
    usage: DiskUsage,
    max_entries: u64,
    linked: std::collections::HashSet<(libc::dev_t, libc::ino_t)>,
    /// Bytes in all frames' `subdirs`.
    pending: usize,
    stopped: bool,
}

impl UsageWalk {
    /// Counts the entries of `dir`, and returns the names of its
    /// subdirectories on the same device (NUL-terminated, one after
    /// another) to enter later.
    fn read(&mut self, dir: &Dir) -> Vec<u8> {
        let mut subdirs = Vec::new();
        let read = dir.for_each_name(|name| {
            if self.usage.inodes >= self.max_entries
                || self.pending + name.to_bytes_with_nul().len() > PENDING_NAMES_MAX
            {
                self.usage.complete = false;
                self.stopped = true;
                return false;
            }
            let st = match dir.stat_at(name) {
                Ok(st) => st,
                // Removed since the directory was read.
                Err(e) if e.kind() == io::ErrorKind::NotFound => return true,
                Err(_) => {
                    self.usage.complete = false;
                    return true;
                }
            };
            if st.st_dev != self.usage.dev {
                // Another file system mounted below: not counted, as `du -x`.
                return true;
            }
            if !is_dir(&st) && st.st_nlink > 1 {
                let key = (st.st_dev, st.st_ino);
                if self.linked.contains(&key) {
                    return true;
                }
                if self.linked.len() < LINKED_MAX {
                    self.linked.insert(key);
                }
            }
            self.usage.inodes += 1;
            self.usage.bytes = self.usage.bytes.saturating_add(blocks(&st));
            if is_dir(&st) {
                let name = name.to_bytes_with_nul();
                subdirs.extend_from_slice(name);
                self.pending += name.len();
            }
            true
        });
        if read.is_err() {
            self.usage.complete = false;
        }
        subdirs
    }

    /// Takes the last name off `subdirs`.
    fn next_subdir(&mut self, subdirs: &mut Vec<u8>) -> Option<CString> {
        let (last, rest) = subdirs.split_last()?;
        debug_assert_eq!(*last, 0);
        let start = rest.iter().rposition(|b| *b == 0).map_or(0, |i| i + 1);
        let name = subdirs.split_off(start);
        self.pending = self.pending.saturating_sub(name.len());
        CString::from_vec_with_nul(name).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn path_elements_and_uids() {
        for ok in ["a", "uid-1", "..a", "a..", " ", &"u".repeat(UID_MAX)] {
            assert_eq!(uid_error(ok), None, "{ok:?}");
        }
        for bad in ["", ".", "..", "/", "a/b", "/etc", "../x", "a\0b"] {
            assert!(uid_error(bad).is_some(), "{bad:?}");
            assert!(element_error(bad).is_some(), "{bad:?}");
        }
        assert!(uid_error(&"u".repeat(UID_MAX + 1)).is_some());
    }

    #[test]
    fn joins_stay_under_their_root() {
        let root = Path::new("/var/lib/tinylet/pods");
        assert_eq!(join(root, "u1").unwrap(), root.join("u1"));
        for bad in ["..", ".", "", "/etc", "../x", "a/b", "a\0"] {
            let e = join(root, bad).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{bad:?}");
            assert!(e.to_string().contains("/var/lib/tinylet/pods"), "{e}");
        }
        let r = Path::new("/r");
        assert_eq!(pod_dir(r, "u1").unwrap(), Path::new("/r/pods/u1"));
        assert!(pod_dir(r, "..").is_err());
        assert!(pod_dir(r, &"u".repeat(UID_MAX + 1)).is_err());
        assert!(ensure_pod_dirs(r, "u1", &["volumes", "../../etc"]).is_err());
    }

    #[test]
    fn directories_get_their_mode_and_are_never_symlinks() {
        let tmp = tempfile::tempdir().unwrap();
        let mode = |p: &Path| fs::symlink_metadata(p).unwrap().mode() & 0o7777;
        let made = ensure_pod_dirs(tmp.path(), "u1", &["volumes", "plugin"]).unwrap();
        for p in [
            "pods",
            "pods/u1",
            "pods/u1/volumes",
            "pods/u1/volumes/plugin",
        ] {
            assert_eq!(mode(&tmp.path().join(p)), 0o750, "{p}");
        }
        // The mode is set after the creation, so no umask cuts bits from it.
        let open = tmp.path().join("open");
        ensure_dir(&open, 0o777).unwrap();
        assert_eq!(mode(&open), 0o777);
        // An existing wider directory is narrowed, a narrower one kept.
        fs::set_permissions(&made, fs::Permissions::from_mode(0o777)).unwrap();
        ensure_dir(&made, 0o750).unwrap();
        assert_eq!(mode(&made), 0o750);
        fs::set_permissions(&made, fs::Permissions::from_mode(0o700)).unwrap();
        ensure_dir(&made, 0o750).unwrap();
        assert_eq!(mode(&made), 0o700);
        // A symlink in a directory's place is refused, not followed.
        let link = tmp.path().join("pods/u2");
        symlink(tmp.path().join("elsewhere"), &link).unwrap();
        assert!(ensure_pod_dirs(tmp.path(), "u2", &[]).is_err());
        assert!(!tmp.path().join("elsewhere").exists());
    }

    #[test]
    fn removal_does_not_follow_symlinks() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        fs::create_dir_all(outside.join("sub")).unwrap();
        fs::write(outside.join("keep"), "data").unwrap();
        fs::write(outside.join("sub/keep"), "data").unwrap();
        let dir = tmp.path().join("pod");
        fs::create_dir_all(dir.join("a/b/c")).unwrap();
        fs::write(dir.join("a/b/c/f"), "x").unwrap();
        fs::write(dir.join("a/g"), "x").unwrap();
        symlink(&outside, dir.join("a/b/to-dir")).unwrap();
        symlink(outside.join("keep"), dir.join("to-file")).unwrap();
        symlink("/nonexistent", dir.join("dangling")).unwrap();

        remove_tree(&dir).unwrap();
        assert!(!dir.exists());
        assert_eq!(fs::read_to_string(outside.join("keep")).unwrap(), "data");
        assert_eq!(
            fs::read_to_string(outside.join("sub/keep")).unwrap(),
            "data"
        );
        // Gone already is fine; a symlink at the top goes, not its target.
        remove_tree(&dir).unwrap();
        symlink(&outside, &dir).unwrap();
        remove_tree(&dir).unwrap();
        assert!(fs::symlink_metadata(&dir).is_err());
        assert!(outside.join("sub/keep").exists());
    }

    #[test]
    fn removal_survives_deep_trees() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("pod");
        fs::create_dir(&dir).unwrap();
        // Deeper than a path can name at once, made step by step.
        let mut cur = Dir::open_at(libc::AT_FDCWD, &cstr(&dir).unwrap()).unwrap();
        let name = CString::new("d".repeat(200)).unwrap();
        for _ in 0..40 {
            // SAFETY: valid descriptor and name.
            assert_eq!(unsafe { libc::mkdirat(cur.0, name.as_ptr(), 0o755) }, 0);
            cur = Dir::open_at(cur.0, &name).unwrap();
        }
        drop(cur);
        remove_tree(&dir).unwrap();
        assert!(!dir.exists());
    }

    #[test]
    fn removal_does_not_cross_a_mount_point() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("pod");
        let mnt = dir.join("volumes/vol");
        fs::create_dir_all(&mnt).unwrap();
        crate::mount::ensure_tmpfs(&mnt, 0).unwrap();
        fs::write(mnt.join("secret"), "s").unwrap();
        let e = remove_tree(&dir).unwrap_err();
        assert!(e.to_string().contains("still mounted"), "{e}");
        assert_eq!(fs::read_to_string(mnt.join("secret")).unwrap(), "s");
        crate::mount::unmount_below(&dir).unwrap();
        remove_tree(&dir).unwrap();
        assert!(!dir.exists());
    }

    /// Makes `depth` directories named `name` one in the other below
    /// `dir`, step by step (deeper than a path can name at once); returns
    /// the deepest one, open.
    fn nest(dir: &Path, name: &str, depth: usize) -> Dir {
        let mut cur = Dir::open_at(libc::AT_FDCWD, &cstr(dir).unwrap()).unwrap();
        let name = CString::new(name).unwrap();
        for _ in 0..depth {
            // SAFETY: valid descriptor and name.
            assert_eq!(unsafe { libc::mkdirat(cur.0, name.as_ptr(), 0o755) }, 0);
            cur = Dir::open_at(cur.0, &name).unwrap();
        }
        cur
    }

    /// Writes `len` bytes to a new file `name` in `dir`.
    fn write_at(dir: &Dir, name: &str, len: usize) {
        let name = CString::new(name).unwrap();
        // SAFETY: valid descriptor and name; the result is checked.
        let fd = unsafe {
            libc::openat(
                dir.0,
                name.as_ptr(),
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC,
                0o644,
            )
        };
        assert!(fd >= 0, "{}", io::Error::last_os_error());
        let data = vec![9u8; len];
        // SAFETY: `fd` is ours; `data` is valid for `len` bytes.
        let n = unsafe { libc::write(fd, data.as_ptr().cast(), len) };
        // SAFETY: `fd` is ours, closed once.
        unsafe { libc::close(fd) };
        assert_eq!(n, len as isize);
    }

    #[test]
    fn disk_usage_has_no_depth_bound_a_container_can_hide_behind() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("vol");
        fs::create_dir(&dir).unwrap();
        // 1 MiB 40 levels down, and 1 MiB 300 levels down (paths of
        // 200-byte names: deeper than PATH_MAX), beside a shallow file.
        write_at(&nest(&dir, "d", 40), "deep", 1 << 20);
        let deepest = nest(&dir, &"e".repeat(200), 300);
        write_at(&deepest, "deeper", 1 << 20);
        fs::write(dir.join("top"), vec![1u8; 4096]).unwrap();
        // Down there, a symlink to a directory outside: not followed.
        let outside = tmp.path().join("outside");
        fs::create_dir(&outside).unwrap();
        fs::write(outside.join("big"), vec![7u8; 4 << 20]).unwrap();
        let target = cstr(&outside).unwrap();
        let link = CString::new("out").unwrap();
        // SAFETY: valid descriptor and NUL-terminated names.
        let rc = unsafe { libc::symlinkat(target.as_ptr(), deepest.0, link.as_ptr()) };
        assert_eq!(rc, 0);

        let u = disk_usage(&dir, 1000).unwrap();
        assert!(u.complete, "{u:?}");
        // vol, 40 + 300 directories, three files and the symlink.
        assert_eq!(u.inodes, 1 + 40 + 300 + 4, "{u:?}");
        assert!(u.bytes >= (2 << 20) + 4096, "{u:?}");
        // Each directory a block or so at most; not the 4 MiB outside.
        assert!(u.bytes < (2 << 20) + 4096 + 345 * 8192, "{u:?}");

        // The same tree with a budget: counted in part, and said so.
        let part = disk_usage(&dir, 100).unwrap();
        assert!(!part.complete, "{part:?}");
        assert!(part.inodes <= 100, "{part:?}");
    }

    #[test]
    fn disk_usage_counts_the_tree_once_and_stays_in_it() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        fs::create_dir(&outside).unwrap();
        fs::write(outside.join("big"), vec![7u8; 1 << 20]).unwrap();
        let dir = tmp.path().join("vol");
        fs::create_dir_all(dir.join("a/b")).unwrap();
        fs::write(dir.join("a/b/f"), vec![1u8; 64 << 10]).unwrap();
        fs::hard_link(dir.join("a/b/f"), dir.join("a/f2")).unwrap();
        symlink(&outside, dir.join("link")).unwrap();
        let mnt = dir.join("mnt");
        fs::create_dir(&mnt).unwrap();
        crate::mount::ensure_tmpfs(&mnt, 0).unwrap();
        fs::write(mnt.join("m"), vec![2u8; 1 << 20]).unwrap();

        let u = disk_usage(&dir, 1000).unwrap();
        crate::mount::unmount_below(&dir).unwrap();
        // vol, a, a/b, a/b/f (a/f2 is the same inode) and link; the
        // mount point is another file system's.
        assert_eq!(u.inodes, 5, "{u:?}");
        assert!(u.complete);
        assert_eq!(u.dev, fs::metadata(&dir).unwrap().dev());
        // The file once; not the symlink's target, not the mount's file.
        assert!(u.bytes >= 64 << 10, "{u:?}");
        assert!(u.bytes < (64 << 10) + (256 << 10), "{u:?}");

        let bounded = disk_usage(&dir, 3).unwrap();
        assert!(!bounded.complete);
        assert!(bounded.inodes <= 3, "{bounded:?}");
        // A symlink as the tree itself is refused, not followed.
        assert!(disk_usage(&dir.join("link"), 1000).is_err());
    }
}
