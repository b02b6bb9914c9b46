//! A hostPath volume's `type`, checked before its pod's containers are
//! made, as upstream's hostPath plugin checks it: `""` (the default) checks
//! nothing; `DirectoryOrCreate` and `FileOrCreate` make a missing path (a
//! directory 0755 with its parents, an empty file 0644, the umask applying,
//! as upstream) and otherwise check it as `Directory` and `File`;
//! `Directory`, `File`, `Socket`, `CharDevice` and `BlockDevice` must find
//! that kind of file (symlinks followed). A mismatch fails the volume's
//! set-up with upstream's message, and the pod waits (FailedMount) until
//! the next sync finds the path as asked.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// The kinds a path may be asked to be: the type's name as the API spells
/// it, and how upstream's messages describe it.
const KINDS: [(&str, &str); 5] = [
    ("Directory", "directory"),
    ("File", "file"),
    ("Socket", "socket file"),
    ("CharDevice", "character device"),
    ("BlockDevice", "block device"),
];

/// Checks (or, for the `*OrCreate` types, makes) `path` as `kind` asks.
/// The error is upstream's message.
pub(crate) fn check_type(path: &Path, kind: Option<&str>) -> Result<(), String> {
    let p = path.display();
    let expected = match kind.unwrap_or("") {
        "" => return Ok(()),
        "DirectoryOrCreate" if !exists(path) => {
            return fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(path)
                .map_err(|e| format!("mkdir {p}: {e}"));
        }
        "FileOrCreate" if !exists(path) => {
            // Not its parents, as upstream; never truncating what another
            // writer made meanwhile.
            return fs::OpenOptions::new()
                .write(true)
                .create(true)
                .mode(0o644)
                .custom_flags(libc::O_CLOEXEC)
                .open(path)
                .map(drop)
                .map_err(|e| format!("open {p}: {e}"));
        }
        "DirectoryOrCreate" => "Directory",
        "FileOrCreate" => "File",
        other => other,
    };
    let Some(&(_, description)) = KINDS.iter().find(|(k, _)| *k == expected) else {
        return Err(format!("{expected} is an invalid volume type"));
    };
    if !exists(path) {
        return Err(format!("hostPath {p} doesn't exist"));
    }
    match file_type(path) {
        Ok(found) if found == expected => Ok(()),
        Ok(found) => Err(format!(
            "hostPath type check failed: {p} is not a {description}, it's a {found}"
        )),
        Err(e) => Err(format!(
            "hostPath type check failed, {p} is not a {description}, unable to determine its type: {e}"
        )),
    }
}

/// Whether `path` exists, symlinks followed (a dangling one does not).
fn exists(path: &Path) -> bool {
    fs::metadata(path).is_ok()
}

/// The type of the file at `path` (symlinks followed), by its API name.
fn file_type(path: &Path) -> io::Result<&'static str> {
    let t = fs::metadata(path)?.file_type();
    Ok(match () {
        _ if t.is_dir() => "Directory",
        _ if t.is_file() => "File",
        _ if t.is_socket() => "Socket",
        _ if t.is_char_device() => "CharDevice",
        _ if t.is_block_device() => "BlockDevice",
        _ => {
            return Err(io::Error::other(
                "only recognise file, directory, socket, block device and character device",
            ))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{symlink, MetadataExt};

    #[test]
    fn no_type_checks_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let missing = tmp.path().join("missing");
        check_type(&missing, None).unwrap();
        check_type(&missing, Some("")).unwrap();
        assert!(!missing.exists(), "nothing is made");
    }

    #[test]
    fn or_create_types_make_what_is_missing_and_check_what_is_there() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a/b/dir");
        check_type(&dir, Some("DirectoryOrCreate")).unwrap();
        assert!(dir.is_dir());
        check_type(&dir, Some("DirectoryOrCreate")).unwrap();
        let file = tmp.path().join("a/file");
        check_type(&file, Some("FileOrCreate")).unwrap();
        let m = fs::metadata(&file).unwrap();
        assert!(m.is_file() && m.len() == 0);
        assert_eq!(m.mode() & 0o022, 0, "no wider than 0644");
        fs::write(&file, "kept").unwrap();
        check_type(&file, Some("FileOrCreate")).unwrap();
        assert_eq!(fs::read_to_string(&file).unwrap(), "kept");
        // A file's parents are not made, as upstream.
        assert!(check_type(&tmp.path().join("x/y"), Some("FileOrCreate")).is_err());

        let e = check_type(&file, Some("DirectoryOrCreate")).unwrap_err();
        assert_eq!(
            e,
            format!(
                "hostPath type check failed: {} is not a directory, it's a File",
                file.display()
            )
        );
        let e = check_type(&dir, Some("FileOrCreate")).unwrap_err();
        assert_eq!(
            e,
            format!(
                "hostPath type check failed: {} is not a file, it's a Directory",
                dir.display()
            )
        );
    }

    #[test]
    fn each_type_must_find_its_kind_of_file() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("file");
        fs::write(&file, "x").unwrap();
        let sock = tmp.path().join("sock");
        let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        let link = tmp.path().join("link");
        symlink(tmp.path(), &link).unwrap();
        let fifo = tmp.path().join("fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);

        check_type(tmp.path(), Some("Directory")).unwrap();
        check_type(&link, Some("Directory")).unwrap();
        check_type(&file, Some("File")).unwrap();
        check_type(&sock, Some("Socket")).unwrap();
        check_type(Path::new("/dev/null"), Some("CharDevice")).unwrap();
        let mismatch = |p: &Path, kind: &str, what: &str, found: &str| {
            assert_eq!(
                check_type(p, Some(kind)).unwrap_err(),
                format!(
                    "hostPath type check failed: {} is not a {what}, it's a {found}",
                    p.display()
                )
            );
        };
        mismatch(&file, "Directory", "directory", "File");
        mismatch(tmp.path(), "File", "file", "Directory");
        mismatch(&file, "Socket", "socket file", "File");
        mismatch(&file, "CharDevice", "character device", "File");
        mismatch(
            Path::new("/dev/null"),
            "BlockDevice",
            "block device",
            "CharDevice",
        );
        let e = check_type(&fifo, Some("File")).unwrap_err();
        assert!(e.contains("unable to determine its type"), "{e}");

        let missing = tmp.path().join("missing");
        assert_eq!(
            check_type(&missing, Some("Directory")).unwrap_err(),
            format!("hostPath {} doesn't exist", missing.display())
        );
        assert!(!missing.exists());
        assert_eq!(
            check_type(&file, Some("Pipe")).unwrap_err(),
            "Pipe is an invalid volume type"
        );
    }
}
