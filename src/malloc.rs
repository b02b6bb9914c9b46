//! Settings of glibc's allocator that keep tinylet's memory small: few
//! arenas, and free memory handed back to the system once pods are gone.
//! Elsewhere (another libc) these are no-ops. Also: maps that give their
//! room back after a burst.

/// glibc gives each thread that allocates its own arena, up to 8 per core,
/// and keeps what they free: with a thread per pod that held on to ~8 MiB
/// more after 50 pods came and went. Two arenas are plenty for tinylet.
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

/// The glibc tunable that bounds the cache of ended threads' stacks, and
/// the bound tinylet runs with: room for four 256 KiB stacks.
pub const STACK_CACHE_TUNABLE: &str = "glibc.pthread.stack_cache_size";
pub const STACK_CACHE_BYTES: usize = 1024 * 1024;

/// glibc keeps the stacks of ended threads for reuse, up to 40 MiB, and a
/// pod worker's stack keeps a few pages resident in that cache (its top,
/// where glibc's own thread data lives): after 110 pods came and went,
/// ~2.5 MiB stayed. The bound is a tunable read only at process start, so
/// without it in the environment tinylet starts itself again, in the same
/// process (exec keeps the PID), with `GLIBC_TUNABLES` extended. Returns
/// only when that is not needed or not possible (exec failed).
pub fn reexec_with_small_stack_cache() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        use std::os::unix::process::CommandExt;
        let current = std::env::var_os("GLIBC_TUNABLES").unwrap_or_default();
        let Some(value) = tunables_with_stack_cache(&current.to_string_lossy()) else {
            return;
        };
        let mut args = std::env::args_os();
        let arg0 = args.next().unwrap_or_else(|| "tinylet".into());
        let err = std::process::Command::new("/proc/self/exe")
            .arg0(arg0)
            .args(args)
            .env("GLIBC_TUNABLES", value)
            .exec();
        // Still here: run on with glibc's default cache.
        eprintln!("tinylet: cannot restart itself with a small thread stack cache: {err}");
    }
}

/// `GLIBC_TUNABLES` with the stack cache bound added, or `None` when it
/// names the bound already (it was set here, or by the admin).
fn tunables_with_stack_cache(current: &str) -> Option<String> {
    if current
        .split(':')
        .any(|t| t.split('=').next() == Some(STACK_CACHE_TUNABLE))
    {
        return None;
    }
    let ours = format!("{STACK_CACHE_TUNABLE}={STACK_CACHE_BYTES}");
    Some(if current.is_empty() {
        ours
    } else {
        format!("{current}:{ours}")
    })
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
    fn the_stack_cache_bound_is_added_once_and_an_admins_is_kept() {
        assert_eq!(
            tunables_with_stack_cache("").as_deref(),
            Some("glibc.pthread.stack_cache_size=1048576")
        );
        assert_eq!(
            tunables_with_stack_cache("glibc.malloc.arena_max=1").as_deref(),
            Some("glibc.malloc.arena_max=1:glibc.pthread.stack_cache_size=1048576")
        );
        assert_eq!(
            tunables_with_stack_cache("glibc.pthread.stack_cache_size=0"),
            None
        );
        assert_eq!(
            tunables_with_stack_cache(
                "glibc.malloc.arena_max=1:glibc.pthread.stack_cache_size=1048576"
            ),
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
