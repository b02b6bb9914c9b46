//! Settings of glibc's allocator that keep tinylet's memory small: few
//! arenas, and free memory handed back to the system once pods are gone.
//! Elsewhere (another libc) these are no-ops.

/// glibc gives each thread that allocates its own arena, up to 8 per core,
/// and keeps what they free: with a thread per pod that held on to ~8 MiB
/// more after 50 pods came and went. Two arenas are plenty for tinylet.
/// Call before other threads start.
pub fn limit_arenas() {
    #[cfg(target_env = "gnu")]
    {
        // SAFETY: mallopt only changes allocator settings.
        let ok = unsafe { libc::mallopt(libc::M_ARENA_MAX, 2) };
        if ok != 1 {
            log::debug!("mallopt(M_ARENA_MAX) refused; keeping glibc's default arenas");
        }
    }
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
