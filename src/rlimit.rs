//! The process's limit on open files (`RLIMIT_NOFILE`), raised at start to
//! `--max-open-files` / `maxOpenFiles` as upstream's kubelet does
//! (`rlimit.SetNumFiles`). Every apiserver connection, watch, CRI stream,
//! node API connection and file being written takes a descriptor; under
//! systemd without `LimitNOFILE` the soft limit is 1024, past which every
//! `open`, `socket` and `accept` fails.
//!
//! Upstream sets both the soft and the hard limit to the value, which needs
//! `CAP_SYS_RESOURCE` to go above the hard limit and fails otherwise.
//! tinylet sets the soft limit only, to the value capped at the hard limit
//! (which the service manager sets: `LimitNOFILE=` in the unit), so it
//! never fails for want of the capability and never lowers the hard limit.

/// `--max-open-files`' default, as upstream's `maxOpenFiles`.
pub(crate) const DEFAULT_MAX_OPEN_FILES: u64 = 1_000_000;

/// What [`raise_open_files`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OpenFiles {
    /// The soft limit before.
    pub(crate) was: u64,
    /// The soft limit now.
    pub(crate) soft: u64,
    /// The hard limit (unchanged).
    pub(crate) hard: u64,
}

/// The soft limit to set for `wanted` open files under the hard limit
/// `hard`: `wanted`, capped at `hard` (`RLIM_INFINITY` caps nothing).
fn capped(wanted: u64, hard: u64) -> u64 {
    wanted.min(hard)
}

/// Sets the soft `RLIMIT_NOFILE` to `wanted` capped at the hard limit.
pub(crate) fn raise_open_files(wanted: u64) -> std::io::Result<OpenFiles> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let was = lim.rlim_cur;
    let soft = capped(wanted, lim.rlim_max);
    if soft != was {
        let new = libc::rlimit {
            rlim_cur: soft,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: setrlimit reads the struct we own.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &new) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(OpenFiles {
        was,
        soft,
        hard: lim.rlim_max,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wanted_limit_is_capped_at_the_hard_limit() {
        // systemd's default hard limit, and LimitNOFILE=1048576.
        assert_eq!(capped(DEFAULT_MAX_OPEN_FILES, 524_288), 524_288);
        assert_eq!(capped(DEFAULT_MAX_OPEN_FILES, 1_048_576), 1_000_000);
        assert_eq!(
            capped(DEFAULT_MAX_OPEN_FILES, libc::RLIM_INFINITY),
            1_000_000
        );
        // A lower value is what the operator asked for: set as given.
        assert_eq!(capped(4096, 1_048_576), 4096);
    }

    #[test]
    fn the_soft_limit_is_set_and_the_hard_one_kept() {
        let before = raise_open_files(u64::MAX).unwrap();
        assert_eq!(before.soft, before.hard, "raised to the hard limit");
        let lower = before.hard.min(4096);
        let set = raise_open_files(lower).unwrap();
        assert_eq!(set.was, before.hard);
        assert_eq!((set.soft, set.hard), (lower, before.hard));
        // The process's limit is what was reported.
        let again = raise_open_files(lower).unwrap();
        assert_eq!((again.was, again.soft), (lower, lower));
        raise_open_files(before.was).unwrap();
    }
}
