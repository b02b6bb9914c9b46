//! Writes a volume's files so that a container never sees a half-updated
//! set: the files live in a timestamped directory `..<time>`, the symlink
//! `..data` points at the current one, and each top-level name is a symlink
//! through `..data`. An update writes a new directory and swaps `..data` with
//! one rename (the layout upstream's atomic writer uses, which programs
//! watching mounted secrets expect).

use std::collections::BTreeSet;
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{symlink, DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use super::payload::Payload;

/// The symlink to the directory of current files.
pub(crate) const DATA_LINK: &str = "..data";
const DATA_LINK_TMP: &str = "..data_tmp";

/// Makes `dir` hold exactly `payload`. Returns whether anything changed.
/// `dir` must exist; the payload's paths must have passed `check_paths`.
pub(crate) fn write_payload(dir: &Path, payload: &Payload) -> io::Result<bool> {
    // Only a link to one of our own timestamped directories, right here,
    // is the old set: anything else in `..data` is never read or removed.
    let old = fs::read_link(dir.join(DATA_LINK))
        .ok()
        .filter(|old| is_timestamped_name(old));
    if let Some(old) = &old {
        if same_content(&dir.join(old), payload) {
            return Ok(false);
        }
    }

    let ts_name = timestamped_name();
    let ts_dir = dir.join(&ts_name);
    // 0755 whatever the umask, so that any container user can go through.
    fs::DirBuilder::new().mode(0o755).create(&ts_dir)?;
    fs::set_permissions(&ts_dir, fs::Permissions::from_mode(0o755))?;
    let filled = fill(&ts_dir, payload);
    if let Err(e) = filled {
        let _ = fs::remove_dir_all(&ts_dir);
        return Err(e);
    }

    // Swap `..data` in one rename. Until it happens the old files stay
    // current; if it cannot (a full or read-only disk) the new directory
    // goes, so failed attempts leave nothing behind.
    let tmp = dir.join(DATA_LINK_TMP);
    let _ = fs::remove_file(&tmp);
    let swapped = symlink(&ts_name, &tmp).and_then(|()| fs::rename(&tmp, dir.join(DATA_LINK)));
    if let Err(e) = swapped {
        let _ = fs::remove_file(&tmp);
        let _ = fs::remove_dir_all(&ts_dir);
        return Err(e);
    }

    // Top-level names: add the new ones, drop the ones that went away.
    let top: BTreeSet<&str> = payload
        .keys()
        .map(|p| p.split('/').next().unwrap_or(p))
        .collect();
    for name in &top {
        let link = dir.join(name);
        if fs::symlink_metadata(&link).is_err() {
            symlink(Path::new(DATA_LINK).join(name), &link)?;
        }
    }
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("..") || top.contains(&*name) {
            continue;
        }
        if entry.file_type()?.is_symlink() {
            fs::remove_file(entry.path())?;
        }
    }
    if let Some(old) = old {
        if old.as_os_str() != ts_name.as_str() {
            fs::remove_dir_all(dir.join(old))?;
        }
    }
    Ok(true)
}

/// Whether `name` is one path element made by `timestamped_name`: no
/// separator, not `..` itself nor the data links.
fn is_timestamped_name(name: &Path) -> bool {
    let Some(s) = name.to_str() else {
        return false;
    };
    s.len() > 2
        && s.starts_with("..")
        && s != DATA_LINK
        && s != DATA_LINK_TMP
        && crate::paths::element_error(s).is_none()
}

/// A name no payload path can take (they may not start with `..`).
fn timestamped_name() -> String {
    let now = k8s_openapi::jiff::Timestamp::now();
    format!(
        "..{}.{:09}",
        now.strftime("%Y_%m_%d_%H_%M_%S"),
        now.subsec_nanosecond()
    )
}

fn fill(ts_dir: &Path, payload: &Payload) -> io::Result<()> {
    for (path, file) in payload {
        let target = ts_dir.join(path);
        if let Some(parent) = target.parent() {
            make_dirs(ts_dir, parent)?;
        }
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(file.mode)
            .open(&target)?;
        f.write_all(&file.data)?;
        // The umask may have cut bits the spec asked for.
        f.set_permissions(fs::Permissions::from_mode(file.mode))?;
    }
    Ok(())
}

/// Makes the directories from `ts_dir` down to `dir`, each 0755 whatever
/// the umask.
fn make_dirs(ts_dir: &Path, dir: &Path) -> io::Result<()> {
    if dir == ts_dir || dir.is_dir() {
        return Ok(());
    }
    if let Some(parent) = dir.parent() {
        make_dirs(ts_dir, parent)?;
    }
    fs::DirBuilder::new().mode(0o755).create(dir)?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o755))
}

/// Whether `ts_dir` holds exactly the payload's files, contents and modes.
fn same_content(ts_dir: &Path, payload: &Payload) -> bool {
    let mut found = 0usize;
    if !count_files(ts_dir, &mut found) || found != payload.len() {
        return false;
    }
    payload.iter().all(|(path, file)| {
        let p = ts_dir.join(path);
        match (fs::symlink_metadata(&p), fs::read(&p)) {
            (Ok(m), Ok(data)) => {
                m.is_file() && m.permissions().mode() & 0o777 == file.mode && data == file.data
            }
            _ => false,
        }
    })
}

fn count_files(dir: &Path, n: &mut usize) -> bool {
    let Ok(entries) = fs::read_dir(dir) else {
        return false;
    };
    for entry in entries {
        let Ok(entry) = entry else { return false };
        match entry.file_type() {
            Ok(t) if t.is_dir() => {
                if !count_files(&entry.path(), n) {
                    return false;
                }
            }
            Ok(_) => *n += 1,
            Err(_) => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::super::payload::File;
    use super::*;

    fn payload(files: &[(&str, &str, u32)]) -> Payload {
        files
            .iter()
            .map(|(p, d, m)| {
                (
                    p.to_string(),
                    File {
                        data: d.as_bytes().to_vec(),
                        mode: *m,
                    },
                )
            })
            .collect()
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn files_appear_through_data_and_updates_swap_it() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let p1 = payload(&[("token", "t1", 0o644), ("sub/ca.crt", "ca", 0o600)]);
        assert!(write_payload(dir, &p1).unwrap());
        assert_eq!(fs::read_to_string(dir.join("token")).unwrap(), "t1");
        assert_eq!(fs::read_to_string(dir.join("sub/ca.crt")).unwrap(), "ca");
        assert_eq!(
            fs::metadata(dir.join("sub/ca.crt"))
                .unwrap()
                .permissions()
                .mode()
                & 0o777,
            0o600
        );
        assert_eq!(
            fs::read_link(dir.join("token")).unwrap(),
            Path::new("..data/token")
        );
        let first = fs::read_link(dir.join("..data")).unwrap();

        // The same payload again changes nothing.
        assert!(!write_payload(dir, &p1).unwrap());
        assert_eq!(fs::read_link(dir.join("..data")).unwrap(), first);

        // An update: new content, a file gone, the old directory removed.
        let p2 = payload(&[("token", "t2", 0o644)]);
        assert!(write_payload(dir, &p2).unwrap());
        assert_eq!(fs::read_to_string(dir.join("token")).unwrap(), "t2");
        assert!(!dir.join("sub").exists());
        let listing = names(dir);
        assert_eq!(listing.len(), 3, "{listing:?}");
        assert!(listing.contains(&"..data".to_string()));
        assert!(listing.contains(&"token".to_string()));
        assert!(!listing.contains(&first.to_string_lossy().into_owned()));
    }

    #[test]
    fn a_mode_change_alone_is_written() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        assert!(write_payload(dir, &payload(&[("a", "x", 0o644)])).unwrap());
        assert!(write_payload(dir, &payload(&[("a", "x", 0o400)])).unwrap());
        assert_eq!(
            fs::metadata(dir.join("a")).unwrap().permissions().mode() & 0o777,
            0o400
        );
    }

    #[test]
    fn a_data_link_to_elsewhere_is_neither_read_nor_removed() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        fs::create_dir(&outside).unwrap();
        fs::write(outside.join("keep"), "host file").unwrap();
        let dir = tmp.path().join("vol");
        fs::create_dir(&dir).unwrap();
        symlink(&outside, dir.join(DATA_LINK)).unwrap();
        assert!(write_payload(&dir, &payload(&[("a", "x", 0o644)])).unwrap());
        assert_eq!(fs::read_to_string(dir.join("a")).unwrap(), "x");
        assert_eq!(
            fs::read_to_string(outside.join("keep")).unwrap(),
            "host file"
        );
    }

    #[test]
    fn an_empty_payload_leaves_an_empty_volume() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        assert!(write_payload(dir, &payload(&[("a", "x", 0o644)])).unwrap());
        assert!(write_payload(dir, &Payload::new()).unwrap());
        assert_eq!(names(dir).len(), 2, "{:?}", names(dir));
        assert!(!dir.join("a").exists());
    }
}
