//! Where the node's certificates live (client-go's file store, which
//! kubeadm and operators know): under the cert dir, each issued pair as
//! `<pair>-<YYYY-MM-DD-HH-MM-SS>.pem` (the certificate chain, then the
//! key; 0600), and `<pair>-current.pem`, a symlink to the newest, swapped
//! in one rename so a reader sees the old pair or the new one. A key
//! waiting for its certificate is kept as `<pair>.key.tmp`, so a restart
//! while the request is pending asks again with the same key (and so the
//! same request name).

use std::fs;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::atomic_file::{write_file, Durability};

/// A certificate and its key, as read from the store.
#[derive(Debug, Clone)]
pub(crate) struct Pair {
    /// The file the pair was read from (`<pair>-current.pem`).
    pub(crate) path: PathBuf,
    /// PEM: the certificate chain, leaf first.
    pub(crate) cert_pem: Vec<u8>,
    /// PEM: the private key.
    pub(crate) key_pem: Vec<u8>,
    /// The leaf's validity.
    pub(crate) not_before: SystemTime,
    pub(crate) not_after: SystemTime,
}

impl Pair {
    /// Reads a file holding a certificate chain and a key, in any order.
    pub(crate) fn read(path: &Path) -> Result<Pair, String> {
        let file = path.display();
        let bytes = fs::read(path).map_err(|e| format!("{file}: {e}"))?;
        Pair::from_pem(path, &bytes).map_err(|e| format!("{file}: {e}"))
    }

    /// A pair from PEM text with both the chain and the key.
    pub(crate) fn from_pem(path: &Path, pem: &[u8]) -> Result<Pair, String> {
        use rustls::pki_types::pem::{PemObject, SectionKind};
        let (mut cert_pem, mut key_pem) = (String::new(), String::new());
        let mut leaf = None;
        for section in <(SectionKind, Vec<u8>)>::pem_slice_iter(pem) {
            let (kind, der) = section.map_err(|e| format!("not PEM: {e}"))?;
            match kind {
                SectionKind::Certificate => {
                    if leaf.is_none() {
                        leaf = Some(der.clone());
                    }
                    cert_pem.push_str(&crate::x509::pem("CERTIFICATE", &der));
                }
                SectionKind::PrivateKey if key_pem.is_empty() => {
                    key_pem = crate::x509::pem("PRIVATE KEY", &der);
                }
                SectionKind::EcPrivateKey if key_pem.is_empty() => {
                    key_pem = crate::x509::pem("EC PRIVATE KEY", &der);
                }
                SectionKind::RsaPrivateKey if key_pem.is_empty() => {
                    key_pem = crate::x509::pem("RSA PRIVATE KEY", &der);
                }
                _ => {}
            }
        }
        let leaf = leaf.ok_or("no certificate in it")?;
        if key_pem.is_empty() {
            return Err("no private key in it".into());
        }
        let (not_before, not_after) =
            crate::x509::validity(&leaf).map_err(|e| format!("certificate: {e}"))?;
        Ok(Pair {
            path: path.to_path_buf(),
            cert_pem: cert_pem.into_bytes(),
            key_pem: key_pem.into_bytes(),
            not_before,
            not_after,
        })
    }

    /// Whether `now` is inside the certificate's validity.
    pub(crate) fn valid_at(&self, now: SystemTime) -> bool {
        self.not_before <= now && now < self.not_after
    }
}

/// The pairs of one name (`kubelet-client`, `kubelet-server`) in one
/// directory.
#[derive(Debug, Clone)]
pub(crate) struct Store {
    dir: PathBuf,
    pair: String,
}

impl Store {
    pub(crate) fn new(dir: &Path, pair: &str) -> Store {
        Store {
            dir: dir.to_path_buf(),
            pair: pair.to_string(),
        }
    }

    /// `<dir>/<pair>-current.pem`, the path kubeconfigs name.
    pub(crate) fn current_path(&self) -> PathBuf {
        self.dir.join(format!("{}-current.pem", self.pair))
    }

    /// `<dir>/<pair>.key.tmp`, the key of a request not yet answered.
    pub(crate) fn pending_key_path(&self) -> PathBuf {
        self.dir.join(format!("{}.key.tmp", self.pair))
    }

    /// The current pair; `Ok(None)` when there is none yet.
    pub(crate) fn current(&self) -> Result<Option<Pair>, String> {
        let path = self.current_path();
        match fs::symlink_metadata(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(format!("{}: {e}", path.display())),
            Ok(_) => Pair::read(&path).map(Some),
        }
    }

    /// Keeps a newly issued pair: a dated file, then the `-current` link
    /// moved onto it. Returns the pair as read back.
    pub(crate) fn update(
        &self,
        cert_pem: &[u8],
        key_pem: &[u8],
        now: SystemTime,
    ) -> Result<Pair, String> {
        create_dir(&self.dir)?;
        let mut both = cert_pem.to_vec();
        if !both.ends_with(b"\n") {
            both.push(b'\n');
        }
        both.extend_from_slice(key_pem);
        // Checked before anything is written: a certificate that does not
        // parse never becomes current.
        let checked = Pair::from_pem(&self.current_path(), &both)?;
        let stamp = timestamp(now);
        let mut dated = self.dir.join(format!("{}-{stamp}.pem", self.pair));
        let mut n = 1;
        while dated.exists() {
            dated = self.dir.join(format!("{}-{stamp}-{n}.pem", self.pair));
            n += 1;
        }
        write_file(&dated, &both, 0o600, Durability::Fsync)
            .map_err(|e| format!("writing the certificate: {e}"))?;
        let link = self.current_path();
        let staged = self.dir.join(format!("{}-updated.pem", self.pair));
        let _ = fs::remove_file(&staged);
        let target = dated
            .file_name()
            .map(PathBuf::from)
            .ok_or_else(|| format!("{}: no file name", dated.display()))?;
        std::os::unix::fs::symlink(&target, &staged)
            .map_err(|e| format!("{}: {e}", staged.display()))?;
        fs::rename(&staged, &link).map_err(|e| {
            let _ = fs::remove_file(&staged);
            format!("{} -> {}: {e}", staged.display(), link.display())
        })?;
        Ok(Pair {
            path: link,
            ..checked
        })
    }
}

/// Makes the cert dir (0700 when new: it holds private keys).
pub(crate) fn create_dir(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::DirBuilderExt;
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))
}

/// `YYYY-MM-DD-HH-MM-SS` in UTC, as client-go names the dated files.
fn timestamp(t: SystemTime) -> String {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    k8s_openapi::jiff::Timestamp::from_second(i64::try_from(secs).unwrap_or(0))
        .map(|ts| ts.strftime("%Y-%m-%d-%H-%M-%S").to_string())
        .unwrap_or_else(|_| "1970-01-01-00-00-00".into())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::time::Duration;

    /// A self-signed EC pair by openssl: (certificate PEM, key PEM).
    pub(crate) fn openssl_pair(dir: &Path, days: u32) -> (Vec<u8>, Vec<u8>) {
        let (key, crt) = (dir.join("k.pem"), dir.join("c.pem"));
        let status = std::process::Command::new("openssl")
            .args(["req", "-x509", "-nodes", "-days", &days.to_string()])
            .args(["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"])
            .arg("-keyout")
            .arg(&key)
            .args(["-subj", "/O=system:nodes/CN=system:node:edge-1", "-out"])
            .arg(&crt)
            .stderr(std::process::Stdio::null())
            .status()
            .expect("run openssl");
        assert!(status.success());
        (fs::read(crt).unwrap(), fs::read(key).unwrap())
    }

    #[test]
    fn an_update_writes_a_dated_file_and_moves_the_current_link() {
        let dir = tempfile::tempdir().unwrap();
        let pki = dir.path().join("pki");
        let store = Store::new(&pki, "kubelet-client");
        assert!(store.current().unwrap().is_none());

        let (cert, key) = openssl_pair(dir.path(), 2);
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_890_895);
        let first = store.update(&cert, &key, t0).unwrap();
        assert_eq!(first.path, pki.join("kubelet-client-current.pem"));
        let link = fs::read_link(&first.path).unwrap();
        assert_eq!(
            link,
            PathBuf::from("kubelet-client-2026-11-28-18-34-55.pem")
        );
        use std::os::unix::fs::PermissionsExt;
        let mode = fs::metadata(pki.join(&link)).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(
            fs::metadata(&pki).unwrap().permissions().mode() & 0o777,
            0o700
        );
        let read = store.current().unwrap().unwrap();
        assert!(read.valid_at(SystemTime::now()));
        assert!(!read.valid_at(SystemTime::now() + Duration::from_secs(3 * 86_400)));
        assert!(String::from_utf8_lossy(&read.cert_pem).starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(String::from_utf8_lossy(&read.key_pem).contains("PRIVATE KEY-----"));

        // The same second again: a second file, the link on it, the first kept.
        let (cert2, key2) = openssl_pair(dir.path(), 2);
        store.update(&cert2, &key2, t0).unwrap();
        let link2 = fs::read_link(store.current_path()).unwrap();
        assert_eq!(
            link2,
            PathBuf::from("kubelet-client-2026-11-28-18-34-55-1.pem")
        );
        assert!(pki.join(&link).exists());
        assert_eq!(store.current().unwrap().unwrap().cert_pem, {
            let p =
                Pair::from_pem(Path::new("x"), &[cert2.clone(), key2.clone()].concat()).unwrap();
            p.cert_pem
        });
        assert!(!pki.join("kubelet-client-updated.pem").exists());

        // What does not parse never becomes current.
        let e = store.update(b"junk", &key, t0).unwrap_err();
        assert!(e.contains("no certificate"), "{e}");
        let e = store.update(&cert, b"", t0).unwrap_err();
        assert!(e.contains("no private key"), "{e}");
        assert_eq!(fs::read_link(store.current_path()).unwrap(), link2);
    }
}
