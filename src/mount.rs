//! tmpfs mounts for volumes that hold secrets (and emptyDir with medium
//! Memory), and unmounting whatever is mounted below a pod's directory.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

fn cstr(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))
}

/// Whether `dir` is the root of a mount (its device differs from its
/// parent's, or it is `/`).
pub fn is_mount_point(dir: &Path) -> io::Result<bool> {
    let m = std::fs::metadata(dir)?;
    let Some(parent) = dir.parent() else {
        return Ok(true);
    };
    let p = std::fs::metadata(parent)?;
    Ok(m.dev() != p.dev() || m.ino() == p.ino())
}

/// Mounts a fresh tmpfs on `dir` unless one is there already (a restarted
/// tinylet finds its earlier mounts). `size` is in bytes (0: tmpfs default).
pub(crate) fn ensure_tmpfs(dir: &Path, size: u64) -> io::Result<()> {
    if is_mount_point(dir)? {
        return Ok(());
    }
    let source = CString::new("tmpfs").map_err(io::Error::other)?;
    let target = cstr(dir)?;
    let mut opts = String::from("mode=0755");
    if size > 0 {
        opts.push_str(&format!(",size={size}"));
    }
    let data = CString::new(opts).map_err(io::Error::other)?;
    // SAFETY: every pointer is a valid NUL-terminated string that outlives
    // the call.
    let rc = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            source.as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            data.as_ptr().cast(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Mount points at or below `dir`, deepest first, from /proc/self/mountinfo.
pub fn mounts_below(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let text = std::fs::read_to_string("/proc/self/mountinfo")?;
    Ok(mounts_below_in(&text, dir))
}

/// The mount points in `mountinfo` text at or below `dir`, deepest first.
pub(crate) fn mounts_below_in(mountinfo: &str, dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = mountinfo
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(unescape_mountinfo(p)))
        .filter(|p| p.starts_with(dir))
        .collect();
    out.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    out.dedup();
    out
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Unmounts everything mounted at or below `dir` (deepest first), never
/// following a symlink at a mount point. A mount still busy is detached
/// lazily, so the directory can be removed.
pub fn unmount_below(dir: &Path) -> io::Result<()> {
    for m in mounts_below(dir)? {
        let target = cstr(&m)?;
        // SAFETY: `target` is a valid NUL-terminated path.
        let rc = unsafe { libc::umount2(target.as_ptr(), libc::UMOUNT_NOFOLLOW) };
        if rc != 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EBUSY) {
                // SAFETY: as above.
                let rc = unsafe {
                    libc::umount2(target.as_ptr(), libc::UMOUNT_NOFOLLOW | libc::MNT_DETACH)
                };
                if rc != 0 {
                    return Err(io::Error::last_os_error());
                }
            } else if e.raw_os_error() != Some(libc::EINVAL) {
                // EINVAL: no longer a mount point (gone meanwhile).
                return Err(e);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_lines_below_a_directory_deepest_first() {
        let text = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/vda rw
30 22 0:40 / /var/lib/tinylet/pods/u1/volumes/kubernetes.io~secret/tok rw - tmpfs tmpfs rw
31 22 0:41 / /var/lib/tinylet/pods/u1/volumes/kubernetes.io~projected/with\\040space rw - tmpfs tmpfs rw
32 30 0:42 / /var/lib/tinylet/pods/u1/volumes/kubernetes.io~secret/tok/deeper rw - tmpfs tmpfs rw
33 22 0:43 / /var/lib/tinylet/pods/u10/volumes/x rw - tmpfs tmpfs rw
";
        let got = mounts_below_in(text, Path::new("/var/lib/tinylet/pods/u1"));
        assert_eq!(
            got,
            [
                "/var/lib/tinylet/pods/u1/volumes/kubernetes.io~secret/tok/deeper",
                "/var/lib/tinylet/pods/u1/volumes/kubernetes.io~secret/tok",
                "/var/lib/tinylet/pods/u1/volumes/kubernetes.io~projected/with space",
            ]
            .map(PathBuf::from)
        );
    }
}
