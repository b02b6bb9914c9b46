//! Volume ownership for a pod's `fsGroup` (upstream's SetVolumeOwnership):
//! every file and directory of the volume gets the group, group read (and
//! write for writable volumes) and, for directories, group search and the
//! set-group-ID bit so that new files inherit the group.
//!
//! The walk may meet a tree that a container writes while it runs (an
//! emptyDir that an earlier tinylet set up without leaving a ready marker),
//! and it runs as root, so it goes by file descriptors, never by path, and
//! nothing a container does can turn it onto a file outside the volume:
//!
//! - Every entry is opened with `openat(dir, name, O_PATH|O_NOFOLLOW)`
//!   relative to its directory's descriptor and `fstat`ed. Its group is set
//!   with `fchownat(fd, "", AT_EMPTY_PATH|AT_SYMLINK_NOFOLLOW)` and its mode
//!   with `chmod` of `/proc/self/fd/<fd>` (what glibc's `fchmodat` does for
//!   `AT_SYMLINK_NOFOLLOW`): both act on the inode that was looked at,
//!   whatever is put in its place meanwhile. A symlink gets the group, keeps
//!   its mode and is never followed. No entry is opened for reading or
//!   writing, so no device's `open` runs; devices, FIFOs and sockets get the
//!   group and its bits as files do (upstream chmods them too).
//! - A directory is entered by `openat(fd, ".", O_RDONLY|O_DIRECTORY)` on
//!   that same descriptor and read with `getdents64`. Nothing on another
//!   device or mount than the volume's root (a mount below it, a bind mount
//!   of the same file system included: `statx`'s mount ID, where the kernel
//!   has it, 5.8 on) is changed or entered.
//! - The walk is iterative, with the path from the root as an explicit
//!   stack, and holds at most [`MAX_HELD`] directory descriptors (the
//!   root's and the deepest levels'), and for a moment two more: the entry
//!   being looked at and the directory being entered. A level whose descriptor was closed is
//!   opened again from the root, name by name and only downwards (never by
//!   `..`), each with `O_NOFOLLOW|O_DIRECTORY`, and must be the directory
//!   (device and inode) it was; if one was moved or replaced, the walk
//!   leaves that part. Directories more than [`MAX_DEPTH`] levels below the
//!   root get the group but are not entered, and the walk reports it (a
//!   path-based walk such as upstream's stops at `PATH_MAX` sooner).
//!
//! A directory read resumes at the offset of the last entry handled
//! (`d_off`), so in a tree that changes during the walk an entry may be
//! seen twice or missed, as with any walk; what holds whatever happens is
//! that nothing outside the volume is touched. The cost of a walk falls on
//! the pod's own worker; `volume` runs it once per volume (see its doc).

use std::ffi::{CStr, CString, OsStr};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::paths::{fstat, is_type, open_at};

/// Group bits added to files of writable and of read-only volumes.
const RW_MASK: u32 = 0o660;
const RO_MASK: u32 = 0o440;
/// Added to directories: group search, and set-group-ID.
const DIR_MASK: u32 = 0o110 | 0o2000;

/// Directory descriptors a walk holds open at most, the root's included.
pub(crate) const MAX_HELD: usize = 16;
/// Levels below the root a walk enters at most.
pub(crate) const MAX_DEPTH: usize = 4096;
/// Bytes of directory entries read at a time.
const DIRENT_BUF: usize = 8192;

const DIR_FLAGS: libc::c_int =
    libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;

/// What a walk did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Walked {
    /// Entries looked at, the root included.
    pub(crate) entries: u64,
    /// Entries whose group or mode was changed.
    pub(crate) changed: u64,
    /// Entries left alone: on another device, or gone, moved or replaced
    /// while the walk ran.
    pub(crate) skipped: u64,
    /// The most directory descriptors held at once.
    pub(crate) most_held: usize,
}

/// The bounds of a walk: [`MAX_HELD`] and [`MAX_DEPTH`], smaller in tests.
#[derive(Debug, Clone, Copy)]
struct Limits {
    held: usize,
    depth: usize,
}

/// Gives everything under `dir` (itself included) the group `gid` and the
/// group's bits, by descriptors (see the module doc). `dir` itself must be
/// a directory, not a symlink. An entry that cannot be changed does not stop
/// the walk; the error names the first such entry and how many there were.
pub(crate) fn set_group(dir: &Path, gid: u32, read_only: bool) -> io::Result<Walked> {
    let limits = Limits {
        held: MAX_HELD,
        depth: MAX_DEPTH,
    };
    walk(dir, gid, read_only, limits)
}

/// The mode a file of mode `mode` has once the group was given.
pub(crate) fn file_mode(mode: u32, read_only: bool) -> u32 {
    mode | if read_only { RO_MASK } else { RW_MASK }
}

/// One directory on the path from the root to where the walk is.
struct Level {
    /// Open, or closed to keep within [`Limits::held`].
    fd: Option<OwnedFd>,
    /// Its name in its parent (empty for the root).
    name: CString,
    /// Its inode, which it must still have when opened again.
    ino: libc::ino_t,
    /// Where its next read starts: the `d_off` of the last entry handled.
    resume: libc::off_t,
    /// The inode of the last directory entered from it (0: none yet). A
    /// read resumed at a `d_off` that does not move past it (a hash
    /// collision in an ext4 directory) does not enter it again.
    entered: libc::ino_t,
}

struct Walker<'a> {
    root: &'a Path,
    gid: u32,
    read_only: bool,
    dev: libc::dev_t,
    /// The root's mount, where the kernel tells.
    mount: Option<u64>,
    limits: Limits,
    walked: Walked,
    failed: u64,
    first: Option<(PathBuf, io::Error)>,
}

fn walk(dir: &Path, gid: u32, read_only: bool, limits: Limits) -> io::Result<Walked> {
    let limits = Limits {
        held: limits.held.max(2),
        depth: limits.depth,
    };
    let c = CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))?;
    let root = open_at(libc::AT_FDCWD, &c, DIR_FLAGS)?;
    let st = fstat(root.as_raw_fd())?;
    let mut w = Walker {
        root: dir,
        gid,
        read_only,
        dev: st.st_dev,
        mount: mount_id(root.as_raw_fd()),
        limits,
        walked: Walked {
            entries: 1,
            most_held: 1,
            ..Walked::default()
        },
        failed: 0,
        first: None,
    };
    w.own(root.as_raw_fd(), &st, &[], None);
    let mut stack = vec![Level {
        fd: Some(root),
        name: CString::default(),
        ino: st.st_ino,
        resume: 0,
        entered: 0,
    }];
    let mut held = 1;
    let mut buf = vec![0u8; DIRENT_BUF];
    while let Some(top) = stack.last() {
        let Some(fd) = top.fd.as_ref().map(AsRawFd::as_raw_fd) else {
            w.reopen(&mut stack, &mut held);
            continue;
        };
        let n = match read_entries(fd, top.resume, &mut buf) {
            Ok(n) => n,
            Err(e) => {
                w.fail(&stack, None, e);
                0
            }
        };
        if n == 0 {
            if stack.pop().is_some_and(|l| l.fd.is_some()) {
                held -= 1;
            }
            continue;
        }
        let mut child = None;
        let mut pos = 0;
        let mut malformed = false;
        while pos < n {
            let Some((next, name, len)) = parse_entry(&buf[pos..n]) else {
                malformed = true;
                break;
            };
            pos += len;
            if let Some(top) = stack.last_mut() {
                top.resume = next;
            }
            if name.to_bytes() == b"." || name.to_bytes() == b".." {
                continue;
            }
            if let Some(level) = w.entry(fd, name, &stack) {
                if stack.last().is_some_and(|t| t.entered == level.ino) {
                    continue;
                }
                if let Some(top) = stack.last_mut() {
                    top.entered = level.ino;
                }
                child = Some(level);
                break;
            }
        }
        if malformed {
            // Nothing more of this directory can be read.
            w.fail(
                &stack,
                None,
                io::Error::other("a malformed directory entry"),
            );
            if stack.pop().is_some_and(|l| l.fd.is_some()) {
                held -= 1;
            }
        } else if let Some(level) = child {
            stack.push(level);
            held += 1;
            if held > w.limits.held {
                let top = stack.len() - 1;
                close_lowest(&mut stack, top);
                held -= 1;
            }
            w.walked.most_held = w.walked.most_held.max(held);
        }
    }
    match w.first {
        None => Ok(w.walked),
        Some((path, e)) => {
            let more = match w.failed {
                0 | 1 => String::new(),
                n => format!(" (and {} more entries)", n - 1),
            };
            Err(io::Error::new(
                e.kind(),
                format!("{}: {e}{more}", path.display()),
            ))
        }
    }
}

/// Closes the descriptor of the shallowest level of the run of open levels
/// that ends at `upto` (never the root's). Held levels are always the root
/// and one such run, so this closes the open level nearest the root.
fn close_lowest(stack: &mut [Level], upto: usize) {
    let mut i = upto;
    while i > 1 && stack[i - 1].fd.is_some() {
        i -= 1;
    }
    if i >= 1 {
        stack[i].fd = None;
    }
}

impl Walker<'_> {
    /// Looks at the entry `name` of the directory `dir` (the top of
    /// `stack`): sets its group and mode, and returns it as the next level
    /// when it is a directory to enter.
    fn entry(&mut self, dir: RawFd, name: &CStr, stack: &[Level]) -> Option<Level> {
        let fd = match open_at(dir, name, libc::O_PATH | libc::O_NOFOLLOW) {
            Ok(fd) => fd,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                self.walked.skipped += 1;
                return None;
            }
            Err(e) => {
                self.fail(stack, Some(name), e);
                return None;
            }
        };
        let st = match fstat(fd.as_raw_fd()) {
            Ok(st) => st,
            Err(e) => {
                self.fail(stack, Some(name), e);
                return None;
            }
        };
        self.walked.entries += 1;
        if st.st_dev != self.dev || self.other_mount(fd.as_raw_fd()) {
            // A mount below the volume: not ours to change.
            self.walked.skipped += 1;
            return None;
        }
        self.own(fd.as_raw_fd(), &st, stack, Some(name));
        if !is_type(&st, libc::S_IFDIR) {
            return None;
        }
        if stack.len() > self.limits.depth {
            let e = io::Error::other(format!(
                "more than {} directories deep; not entered",
                self.limits.depth
            ));
            self.fail(stack, Some(name), e);
            return None;
        }
        // The directory that was looked at, whatever the name is now.
        match open_at(fd.as_raw_fd(), c".", DIR_FLAGS) {
            Ok(d) => Some(Level {
                fd: Some(d),
                name: name.to_owned(),
                ino: st.st_ino,
                resume: 0,
                entered: 0,
            }),
            Err(e) => {
                self.fail(stack, Some(name), e);
                None
            }
        }
    }

    /// Opens again the levels of `stack` whose descriptors were closed,
    /// from the nearest open one down, each by name with `O_NOFOLLOW` and
    /// checked to be the directory it was. A level that is not is left,
    /// with everything below it.
    fn reopen(&mut self, stack: &mut Vec<Level>, held: &mut usize) {
        for i in 1..stack.len() {
            if stack[i].fd.is_some() {
                continue;
            }
            let Some(parent) = stack[i - 1].fd.as_ref().map(AsRawFd::as_raw_fd) else {
                // Cannot be: each level before `i` was opened first.
                stack.truncate(i);
                return;
            };
            let same = open_at(parent, &stack[i].name, DIR_FLAGS).and_then(|fd| {
                let st = fstat(fd.as_raw_fd())?;
                let same = st.st_dev == self.dev && st.st_ino == stack[i].ino;
                Ok((same && !self.other_mount(fd.as_raw_fd())).then_some(fd))
            });
            match same {
                Ok(Some(fd)) => {
                    stack[i].fd = Some(fd);
                    *held += 1;
                    if *held > self.limits.held {
                        close_lowest(stack, i);
                        *held -= 1;
                    }
                }
                Ok(None) | Err(_) => {
                    // Moved, replaced or gone since it was entered.
                    self.walked.skipped += 1;
                    stack.truncate(i);
                    return;
                }
            }
        }
    }

    /// Gives the file `fd` (stat `st`) the group and the group's bits.
    fn own(&mut self, fd: RawFd, st: &libc::stat, stack: &[Level], name: Option<&CStr>) {
        let mut changed = false;
        if st.st_gid != self.gid {
            // SAFETY: `fd` is open; the empty path with AT_EMPTY_PATH names
            // the file `fd` refers to (the symlink itself, for one).
            let rc = unsafe {
                libc::fchownat(
                    fd,
                    c"".as_ptr(),
                    libc::uid_t::MAX,
                    self.gid,
                    libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
                )
            };
            if rc != 0 {
                self.fail(stack, name, io::Error::last_os_error());
                return;
            }
            changed = true;
        }
        if !is_type(st, libc::S_IFLNK) {
            let mode = st.st_mode & 0o7777;
            let mut mask = if self.read_only { RO_MASK } else { RW_MASK };
            if is_type(st, libc::S_IFDIR) {
                mask |= DIR_MASK;
            }
            // A new group clears a file's set-ID bits: its mode is set again
            // (as upstream, from the mode it had).
            if mode | mask != mode || changed {
                if let Err(e) = chmod_fd(fd, mode | mask) {
                    self.fail(stack, name, e);
                    return;
                }
                changed = true;
            }
        }
        if changed {
            self.walked.changed += 1;
        }
    }

    /// Whether `fd` is on another mount than the root (never, where the
    /// kernel does not tell mounts apart).
    fn other_mount(&self, fd: RawFd) -> bool {
        self.mount.is_some() && mount_id(fd) != self.mount
    }

    fn fail(&mut self, stack: &[Level], name: Option<&CStr>, e: io::Error) {
        self.failed += 1;
        if self.first.is_none() {
            let mut path = self.root.to_path_buf();
            for level in stack.iter().skip(1) {
                path.push(OsStr::from_bytes(level.name.to_bytes()));
            }
            if let Some(name) = name {
                path.push(OsStr::from_bytes(name.to_bytes()));
            }
            self.first = Some((path, e));
        }
    }
}

/// The ID of the mount the file `fd` is on, or `None` where the kernel does
/// not say (`STATX_MNT_ID` came with 5.8).
///
/// Made as a raw system call, not through glibc's `statx`: Rust's standard
/// library declares `statx` as a weak symbol, and in the fat-LTO static
/// build that declaration wins, so the linker took no `statx` from libc.a
/// and the call jumped to address 0 (every pod with an fsGroup killed the
/// static node).
fn mount_id(fd: RawFd) -> Option<u64> {
    // SAFETY: an all-zero `statx` is a valid value to be overwritten.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is open and the empty path with AT_EMPTY_PATH names it;
    // `stx` is valid for writes; the arguments are statx(2)'s, in order.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_statx,
            fd,
            c"".as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
            libc::STATX_MNT_ID,
            &mut stx as *mut libc::statx,
        )
    };
    (rc == 0 && stx.stx_mask & libc::STATX_MNT_ID != 0).then_some(stx.stx_mnt_id)
}

/// `fchmod`, or for an `O_PATH` descriptor (which `fchmod` refuses) `chmod`
/// of its `/proc/self/fd` link, which leads to exactly the file it holds.
/// Never called for a symlink, which `chmod` would follow.
fn chmod_fd(fd: RawFd, mode: u32) -> io::Result<()> {
    // SAFETY: plain call on an open descriptor.
    if unsafe { libc::fchmod(fd, mode) } == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() != Some(libc::EBADF) {
        return Err(e);
    }
    let link = CString::new(format!("/proc/self/fd/{fd}")).map_err(io::Error::other)?;
    // SAFETY: `link` is a valid NUL-terminated path.
    if unsafe { libc::chmod(link.as_ptr(), mode) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Reads the entries of the directory `fd` from `offset` (0, or a `d_off`
/// it gave) into `buf`; 0 at the end.
fn read_entries(fd: RawFd, offset: libc::off_t, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: plain call on an open descriptor.
    if unsafe { libc::lseek(fd, offset, libc::SEEK_SET) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `buf` is valid for writes of its length.
    let n = unsafe { libc::syscall(libc::SYS_getdents64, fd, buf.as_mut_ptr(), buf.len()) };
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
}

/// The first `linux_dirent64` of `buf`: its `d_off` (where the next one
/// starts), its name and its length. `None` if it does not fit.
fn parse_entry(buf: &[u8]) -> Option<(libc::off_t, &CStr, usize)> {
    const NAME: usize = 19;
    let off = i64::from_ne_bytes(buf.get(8..16)?.try_into().ok()?);
    let len = usize::from(u16::from_ne_bytes(buf.get(16..18)?.try_into().ok()?));
    if len <= NAME {
        return None;
    }
    let name = CStr::from_bytes_until_nul(buf.get(NAME..len)?).ok()?;
    Some((off, name, len))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::fd::FromRawFd;
    use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};

    fn meta(p: &Path) -> fs::Metadata {
        fs::symlink_metadata(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    }

    #[test]
    fn files_and_directories_get_the_group_and_its_bits() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("vol");
        fs::create_dir_all(dir.join("sub")).unwrap();
        fs::write(dir.join("sub/key"), "v").unwrap();
        fs::set_permissions(dir.join("sub/key"), fs::Permissions::from_mode(0o600)).unwrap();
        symlink("sub/key", dir.join("key")).unwrap();

        let walked = set_group(&dir, 4321, true).unwrap();
        assert_eq!((walked.entries, walked.changed, walked.skipped), (4, 4, 0));
        let m = |p: &str| meta(&dir.join(p));
        assert_eq!(m("sub/key").gid(), 4321);
        assert_eq!(m("sub/key").mode() & 0o7777, 0o640);
        assert_eq!(m("sub").mode() & 0o2070, 0o2050);
        assert_eq!(m("key").gid(), 4321);
        assert_eq!(fs::metadata(&dir).unwrap().gid(), 4321);

        set_group(&dir, 4321, false).unwrap();
        assert_eq!(m("sub/key").mode() & 0o7777, 0o660);
        assert_eq!(m("sub").mode() & 0o2070, 0o2070);
        // Nothing left to change.
        assert_eq!(set_group(&dir, 4321, false).unwrap().changed, 0);
    }

    #[test]
    fn symlinks_get_the_group_and_are_never_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        fs::create_dir_all(outside.join("d")).unwrap();
        fs::write(outside.join("f"), "host").unwrap();
        fs::write(outside.join("d/g"), "host").unwrap();
        for p in ["f", "d/g"] {
            fs::set_permissions(outside.join(p), fs::Permissions::from_mode(0o600)).unwrap();
        }
        let before: Vec<(u32, u32)> = ["", "f", "d", "d/g"]
            .iter()
            .map(|p| (meta(&outside.join(p)).gid(), meta(&outside.join(p)).mode()))
            .collect();
        let dir = tmp.path().join("vol");
        fs::create_dir(&dir).unwrap();
        symlink(outside.join("f"), dir.join("to-file")).unwrap();
        symlink(&outside, dir.join("to-dir")).unwrap();
        symlink("/nonexistent", dir.join("dangling")).unwrap();

        let walked = set_group(&dir, 4321, false).unwrap();
        assert_eq!(walked.entries, 4, "{walked:?}");
        for link in ["to-file", "to-dir", "dangling"] {
            assert_eq!(meta(&dir.join(link)).gid(), 4321, "{link}");
        }
        let after: Vec<(u32, u32)> = ["", "f", "d", "d/g"]
            .iter()
            .map(|p| (meta(&outside.join(p)).gid(), meta(&outside.join(p)).mode()))
            .collect();
        assert_eq!(before, after, "a symlink's target was changed");
        // The volume itself as a symlink is refused, not followed.
        let link = tmp.path().join("link");
        symlink(&outside, &link).unwrap();
        assert!(set_group(&link, 4321, false).is_err());
        assert_eq!(meta(&outside).gid(), before[0].0);
    }

    #[test]
    fn a_mount_below_the_volume_is_not_crossed() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("vol");
        let mnt = dir.join("mnt");
        let bind = dir.join("bind");
        let outside = tmp.path().join("outside");
        fs::create_dir_all(&mnt).unwrap();
        fs::create_dir_all(&bind).unwrap();
        fs::create_dir_all(&outside).unwrap();
        fs::write(dir.join("mine"), "x").unwrap();
        fs::write(outside.join("host"), "y").unwrap();
        crate::mount::ensure_tmpfs(&mnt, 0).unwrap();
        fs::write(mnt.join("other"), "y").unwrap();
        // A bind mount of a directory of the same file system (same device).
        let c = |p: &Path| CString::new(p.as_os_str().as_bytes()).unwrap();
        // SAFETY: valid NUL-terminated paths; a bind mount takes no type or data.
        let rc = unsafe {
            libc::mount(
                c(&outside).as_ptr(),
                c(&bind).as_ptr(),
                std::ptr::null(),
                libc::MS_BIND,
                std::ptr::null(),
            )
        };
        assert_eq!(rc, 0, "{}", io::Error::last_os_error());
        let walked = set_group(&dir, 4321, false);
        let seen = [
            meta(&mnt).gid(),
            meta(&mnt.join("other")).gid(),
            meta(&bind).gid(),
            meta(&bind.join("host")).gid(),
        ];
        let bind_mount_ids = mount_id(
            open_at(libc::AT_FDCWD, &c(&bind), libc::O_PATH)
                .unwrap()
                .as_raw_fd(),
        )
        .is_some();
        crate::mount::unmount_below(&dir).unwrap();
        let walked = walked.unwrap();
        assert_eq!(meta(&dir.join("mine")).gid(), 4321);
        assert_eq!(
            seen[..2],
            [0, 0],
            "the walk crossed into a mount of another file system"
        );
        if bind_mount_ids {
            assert_eq!(seen[2..], [0, 0], "the walk crossed into a bind mount");
            assert_eq!(walked.skipped, 2, "{walked:?}");
        }
        assert_eq!(meta(&outside.join("host")).gid(), seen[3]);
    }

    /// Makes `depth` nested directories named `name` below `root`, by
    /// descriptors (the path may be longer than a path can be), with
    /// `files` files named `<name>-<i>` in `root` and in each of them.
    fn nest(root: &Path, depth: usize, name: &str, files: usize) {
        let dir = CString::new(name).unwrap();
        let mut cur = open_at(
            libc::AT_FDCWD,
            &CString::new(root.as_os_str().as_bytes()).unwrap(),
            DIR_FLAGS,
        )
        .unwrap();
        for level in 0..=depth {
            for i in 0..files {
                let f = CString::new(format!("{name}-{i}")).unwrap();
                let flags = libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY;
                // SAFETY: valid descriptor and name; the result is closed.
                let fd = unsafe { libc::openat(cur.as_raw_fd(), f.as_ptr(), flags, 0o600) };
                assert!(fd >= 0, "{}", io::Error::last_os_error());
                // SAFETY: just opened.
                drop(unsafe { OwnedFd::from_raw_fd(fd) });
            }
            if level == depth {
                break;
            }
            // SAFETY: valid descriptor and name.
            let rc = unsafe { libc::mkdirat(cur.as_raw_fd(), dir.as_ptr(), 0o700) };
            assert_eq!(rc, 0, "{}", io::Error::last_os_error());
            cur = open_at(cur.as_raw_fd(), &dir, DIR_FLAGS).unwrap();
        }
    }

    /// The groups of each level below `root` made by `nest(.., name, ..)`
    /// and of its first file (`u32::MAX` for none).
    fn groups(root: &Path, name: &str) -> Vec<(u32, u32)> {
        let c = CString::new(name).unwrap();
        let first = CString::new(format!("{name}-0")).unwrap();
        let mut cur = open_at(
            libc::AT_FDCWD,
            &CString::new(root.as_os_str().as_bytes()).unwrap(),
            DIR_FLAGS,
        )
        .unwrap();
        let mut out = Vec::new();
        loop {
            let file = open_at(cur.as_raw_fd(), &first, libc::O_PATH | libc::O_NOFOLLOW)
                .map(|f| fstat(f.as_raw_fd()).unwrap().st_gid)
                .unwrap_or(u32::MAX);
            out.push((fstat(cur.as_raw_fd()).unwrap().st_gid, file));
            match open_at(cur.as_raw_fd(), &c, DIR_FLAGS) {
                Ok(next) => cur = next,
                Err(_) => return out,
            }
        }
    }

    #[test]
    fn a_deep_tree_is_walked_whole_holding_few_descriptors() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("vol");
        fs::create_dir(&dir).unwrap();
        // Deeper than PATH_MAX allows to name, with a directory of more
        // entries than one read returns at the top.
        nest(&dir, 300, &"d".repeat(100), 1);
        nest(&dir, 1, "wide", 400);
        let walked = set_group(&dir, 4321, false).unwrap();
        assert!(walked.most_held <= MAX_HELD, "{walked:?}");
        assert_eq!(
            walked.entries,
            1 + (300 + 301) + (1 + 2 * 400),
            "{walked:?}"
        );
        let deep = groups(&dir, &"d".repeat(100));
        assert_eq!(deep.len(), 301);
        assert!(deep.iter().all(|&g| g == (4321, 4321)), "{deep:?}");
        let wide = groups(&dir, "wide");
        assert!(wide.iter().all(|&g| g == (4321, 4321)), "{wide:?}");
        for i in 0..400 {
            assert_eq!(meta(&dir.join(format!("wide/wide-{i}"))).gid(), 4321);
        }
    }

    #[test]
    fn levels_past_the_depth_bound_are_reported_and_left() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("vol");
        fs::create_dir(&dir).unwrap();
        nest(&dir, 60, "d", 1);
        let limits = Limits { held: 3, depth: 40 };
        let e = walk(&dir, 4321, false, limits).unwrap_err();
        assert!(
            e.to_string().contains("more than 40 directories deep"),
            "{e}"
        );
        let levels = groups(&dir, "d");
        assert_eq!(levels.len(), 61);
        // The root and 40 levels entered; the 41st given the group only.
        assert!(
            levels[..41].iter().all(|&g| g == (4321, 4321)),
            "{levels:?}"
        );
        assert_eq!(levels[41], (4321, 0));
        assert!(levels[42..].iter().all(|&g| g == (0, 0)), "{levels:?}");
        // Walked whole with three descriptors at most.
        let walked = walk(
            &dir,
            4321,
            false,
            Limits {
                held: 3,
                depth: 100,
            },
        )
        .unwrap();
        assert_eq!(walked.most_held, 3);
        assert!(groups(&dir, "d").iter().all(|&g| g == (4321, 4321)));
    }

    /// Swaps `a` and `b` (both must exist) in one step.
    fn exchange(a: &Path, b: &Path) {
        let a = CString::new(a.as_os_str().as_bytes()).unwrap();
        let b = CString::new(b.as_os_str().as_bytes()).unwrap();
        // SAFETY: both are valid NUL-terminated paths.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_renameat2,
                libc::AT_FDCWD,
                a.as_ptr(),
                libc::AT_FDCWD,
                b.as_ptr(),
                libc::RENAME_EXCHANGE,
            )
        };
        assert_eq!(rc, 0, "{}", io::Error::last_os_error());
    }

    /// A container swaps a directory of its volume with a symlink to a
    /// host directory, in a loop, while the volume is walked again and
    /// again (every other walk holding two descriptors, so that levels are
    /// opened again by name): no file of the host directory gets the group
    /// or its bits, and the walks did reach into the swapped directory.
    #[test]
    fn a_directory_swapped_for_a_symlink_during_walks_never_leads_out() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let tmp = tempfile::tempdir().unwrap();
        let host = tmp.path().join("host");
        fs::create_dir_all(host.join("etc")).unwrap();
        for f in ["shadow", "etc/sudoers"] {
            fs::write(host.join(f), "root").unwrap();
            fs::set_permissions(host.join(f), fs::Permissions::from_mode(0o600)).unwrap();
        }
        fs::set_permissions(host.join("etc"), fs::Permissions::from_mode(0o700)).unwrap();
        let state = || -> Vec<(PathBuf, u32, u32)> {
            ["", "shadow", "etc", "etc/sudoers"]
                .iter()
                .map(|p| {
                    let m = meta(&host.join(p));
                    (host.join(p), m.gid(), m.mode())
                })
                .collect()
        };
        let before = state();
        let vol = tmp.path().join("vol");
        let at = vol.join("a/b");
        fs::create_dir_all(at.join("s/deeper/still")).unwrap();
        fs::write(at.join("s/f"), "mine").unwrap();
        for i in 0..20 {
            fs::write(vol.join(format!("file-{i}")), "x").unwrap();
            fs::write(at.join(format!("s/deeper/file-{i}")), "x").unwrap();
        }
        symlink(&host, at.join("l")).unwrap();

        let stop = AtomicBool::new(false);
        crate::thread::scope_named(|s| {
            let swapper = s
                .spawn("swapper", || {
                    let mut swaps = 0u64;
                    while !stop.load(Ordering::SeqCst) {
                        exchange(&at.join("s"), &at.join("l"));
                        swaps += 1;
                    }
                    swaps
                })
                .unwrap();
            let few = Limits { held: 2, depth: 64 };
            for i in 0..3000 {
                let _ = match i % 2 {
                    0 => set_group(&vol, 4321, false),
                    _ => walk(&vol, 4321, false, few),
                };
            }
            stop.store(true, Ordering::SeqCst);
            assert!(swapper.join().unwrap() > 0);
        });

        assert_eq!(
            state(),
            before,
            "the host directory was changed through the symlink"
        );
        let inner = if meta(&at.join("s")).is_dir() {
            "s"
        } else {
            "l"
        };
        assert_eq!(
            meta(&at.join(inner).join("f")).gid(),
            4321,
            "the walks never reached into the swapped directory"
        );
    }
}
