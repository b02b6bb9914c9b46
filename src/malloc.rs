//! Settings of glibc's allocator that keep tinylet's memory small: one
//! arena, no per-thread chunk cache, a small cache of thread stacks, and
//! free memory handed back to the system once pods are gone. Elsewhere
//! (another libc) these are no-ops. Also: maps that give their room back
//! after a burst.

/// glibc gives each thread that allocates its own arena, up to 8 per core,
/// and keeps what they free: with a thread per pod that held on to ~8 MiB
/// more after 50 pods came and went. One arena is enough for tinylet:
/// its threads mostly wait, and a second arena's fragments kept ~1 MiB.
/// Call before other threads start.
pub fn limit_arenas() {
    #[cfg(target_env = "gnu")]
    {
        // SAFETY: mallopt only changes allocator settings.
        let ok = unsafe { libc::mallopt(libc::M_ARENA_MAX, 1) };
        if ok != 1 {
            log::debug!("mallopt(M_ARENA_MAX) refused; keeping glibc's default arenas");
        }
    }
}

/// The glibc tunables tinylet runs with, unless `GLIBC_TUNABLES` sets
/// them otherwise:
/// - `glibc.pthread.stack_cache_size`: glibc keeps the stacks of ended
///   threads for reuse, up to 40 MiB, and each keeps a few pages resident
///   (its top, where glibc's own thread data lives): after 110 pods came and
///   went, ~2.5 MiB stayed. 1 MiB keeps four 256 KiB stacks for reuse.
/// - `glibc.malloc.tcache_count`: each thread keeps up to 7 freed chunks of
///   every small size for itself. The long-lived threads (sync loop, PLEG,
///   gRPC's) fill theirs during a burst of pods, and those chunks, spread
///   over the heap, kept ~1.5 MiB of pages resident that trimming cannot
///   return. Without the per-thread cache RSS came back to 1.3 MiB of idle
///   (from 2.7), and the pod start benchmark shows no cost.
pub const TUNABLES: [(&str, &str); 2] = [
    ("glibc.pthread.stack_cache_size", "1048576"),
    ("glibc.malloc.tcache_count", "0"),
];

/// Set in the environment of the re-executed process.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const REEXECUTED: &str = "TINYLET_GLIBC_TUNABLES_SET";

/// glibc reads its tunables only at process start, so when [`TUNABLES`]
/// are missing from the environment tinylet starts itself again, in the
/// same process (exec keeps the PID), with `GLIBC_TUNABLES` extended.
/// Returns only when that is not needed or not possible (exec failed).
pub fn reexec_with_tunables() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        use std::ffi::CString;
        use std::os::unix::ffi::OsStrExt;
        // Once only: a glibc that drops tunables it does not know from the
        // environment must not make this loop.
        if std::env::var_os(REEXECUTED).is_some() {
            return;
        }
        let current = std::env::var_os("GLIBC_TUNABLES").unwrap_or_default();
        let Some(value) = with_tunables(&current.to_string_lossy()) else {
            return;
        };
        let cstrings = |v: Vec<Vec<u8>>| -> Option<Vec<CString>> {
            v.into_iter().map(|b| CString::new(b).ok()).collect()
        };
        let Some(args) = cstrings(std::env::args_os().map(|a| a.as_bytes().to_vec()).collect())
        else {
            return;
        };
        let mut env: Vec<Vec<u8>> = std::env::vars_os()
            .filter(|(k, _)| k != "GLIBC_TUNABLES" && k != REEXECUTED)
            .map(|(k, v)| [k.as_bytes(), b"=", v.as_bytes()].concat())
            .collect();
        env.push(format!("GLIBC_TUNABLES={value}").into_bytes());
        env.push(format!("{REEXECUTED}=1").into_bytes());
        let Some(env) = cstrings(env) else { return };
        let argv: Vec<*const libc::c_char> = args
            .iter()
            .map(|a| a.as_ptr())
            .chain(std::iter::once(std::ptr::null()))
            .collect();
        let envp: Vec<*const libc::c_char> = env
            .iter()
            .map(|e| e.as_ptr())
            .chain(std::iter::once(std::ptr::null()))
            .collect();
        // execve itself, not execvp: no shell fallback when the kernel cannot
        // run the file (an ARM binary under qemu-user without binfmt_misc).
        // SAFETY: argv and envp are null-terminated arrays of pointers to
        // NUL-terminated strings that outlive the call.
        unsafe {
            libc::execve(c"/proc/self/exe".as_ptr(), argv.as_ptr(), envp.as_ptr());
        }
        // Still here: run on with glibc's defaults.
        log_later(std::io::Error::last_os_error());
    }
}

/// Says why the tunables could not be set, on stderr (the logger does not
/// run yet). Not an error: only memory use after bursts differs.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn log_later(err: std::io::Error) {
    eprintln!(
        "tinylet: running with glibc's default allocator tunables (re-executing /proc/self/exe: {err})"
    );
}

/// `GLIBC_TUNABLES` with the missing [`TUNABLES`] added, or `None` when it
/// names them all already (set here, or by the admin).
fn with_tunables(current: &str) -> Option<String> {
    let named = |key: &str| current.split(':').any(|t| t.split('=').next() == Some(key));
    let missing: Vec<String> = TUNABLES
        .iter()
        .filter(|(k, _)| !named(k))
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    if missing.is_empty() {
        return None;
    }
    let mut all: Vec<&str> = current.split(':').filter(|t| !t.is_empty()).collect();
    all.extend(missing.iter().map(String::as_str));
    Some(all.join(":"))
}

/// Returns the free pages of every arena to the system. glibc only shrinks
/// the top of a heap on its own, so after a burst of pods (each with a
/// thread, decoded objects and statuses) most of the freed memory would
/// otherwise stay resident. Costs a walk over the free lists: call it when
/// work has ended, not on every turn.
pub fn give_back() {
    #[cfg(target_env = "gnu")]
    {
        // SAFETY: malloc_trim only releases free memory of the allocator.
        unsafe {
            libc::malloc_trim(0);
        }
    }
}

/// Gives a map's spare room back once it holds far fewer entries than it
/// has room for (after a burst of pods went away). Maps never shrink on
/// their own, and a big table left in the middle of the heap also keeps
/// the free pages around it from being returned.
pub fn shrink_map<K, V, S>(map: &mut std::collections::HashMap<K, V, S>)
where
    K: Eq + std::hash::Hash,
    S: std::hash::BuildHasher,
{
    if map.capacity() > 4 * map.len() + 16 {
        map.shrink_to_fit();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn missing_tunables_are_added_once_and_an_admins_are_kept() {
        let ours = "glibc.pthread.stack_cache_size=1048576:glibc.malloc.tcache_count=0";
        assert_eq!(with_tunables("").as_deref(), Some(ours));
        assert_eq!(
            with_tunables("glibc.malloc.arena_max=1").as_deref(),
            Some(format!("glibc.malloc.arena_max=1:{ours}").as_str())
        );
        assert_eq!(
            with_tunables("glibc.malloc.tcache_count=3").as_deref(),
            Some("glibc.malloc.tcache_count=3:glibc.pthread.stack_cache_size=1048576")
        );
        assert_eq!(with_tunables(ours), None);
        assert_eq!(
            with_tunables("glibc.pthread.stack_cache_size=0:glibc.malloc.tcache_count=7"),
            None
        );
    }

    #[test]
    fn a_map_emptied_after_a_burst_shrinks_and_a_full_one_does_not() {
        let mut m: HashMap<u32, [u8; 64]> = (0..500).map(|i| (i, [0; 64])).collect();
        let full = m.capacity();
        shrink_map(&mut m);
        assert_eq!(m.capacity(), full, "a full map keeps its room");
        m.retain(|k, _| *k < 3);
        shrink_map(&mut m);
        assert!(
            m.capacity() < 32,
            "capacity {} after shrinking",
            m.capacity()
        );
        assert_eq!(m.len(), 3);
    }
}
