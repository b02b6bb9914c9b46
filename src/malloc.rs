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
pub(crate) const TUNABLES: [(&str, &str); 2] = [
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
/// work has ended, not on every turn. The code only the burst ran goes
/// too ([`drop_code_pages`]).
pub(crate) fn give_back() {
    #[cfg(target_env = "gnu")]
    {
        // SAFETY: malloc_trim only releases free memory of the allocator.
        unsafe {
            libc::malloc_trim(0);
        }
    }
    drop_code_pages();
}

/// Gives a map's spare room back once it holds far fewer entries than it
/// has room for (after a burst of pods went away). Maps never shrink on
/// their own, and a big table left in the middle of the heap also keeps
/// the free pages around it from being returned.
pub(crate) fn shrink_map<K, V, S>(map: &mut std::collections::HashMap<K, V, S>)
where
    K: Eq + std::hash::Hash,
    S: std::hash::BuildHasher,
{
    if map.capacity() > 4 * map.len() + 16 {
        map.shrink_to_fit();
    }
}

/// Unmaps the resident pages of tinylet's own code and read-only data
/// (the executable's read-only, non-RELRO `PT_LOAD` segments), so that
/// what stays mapped is what the node touches from now on. Returns the
/// bytes advised.
///
/// Start-up runs code an idle node never runs again (flag and
/// configuration parsing, certificate generation, registration), and the
/// kernel maps 64 KiB around every page a fault brings in: a node idle
/// after start-up kept ~6.8 MiB of its 7.3 MiB of code mapped while its
/// loops touched ~1.3 MiB. These pages are clean copies of the file:
/// `MADV_DONTNEED` drops only this process's mappings, the page cache
/// keeps the file, and a later touch maps the page back with a minor
/// fault. Writable segments and the RELRO range (written at start by
/// relocations) are left alone, since dropping a written private page
/// would lose what was written.
pub(crate) fn drop_code_pages() -> usize {
    #[cfg(target_os = "linux")]
    {
        let ranges = code_ranges();
        let mut advised = 0;
        for (start, end) in ranges {
            // SAFETY: the range is page-aligned and lies inside a mapped,
            // read-only segment of this executable whose pages were never
            // written (no RELRO, no writable segment), so dropping the
            // mappings only makes later reads fault the file's pages in
            // again; no memory Rust code owns is affected.
            let r = unsafe {
                libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED)
            };
            if r == 0 {
                advised += end - start;
            } else {
                log::debug!(
                    "madvise(DONTNEED) of code at {start:#x}..{end:#x}: {}",
                    std::io::Error::last_os_error()
                );
            }
        }
        advised
    }
    #[cfg(not(target_os = "linux"))]
    {
        0
    }
}

/// The page-aligned address ranges of the executable's read-only loaded
/// segments, minus its RELRO range.
#[cfg(target_os = "linux")]
fn code_ranges() -> Vec<(usize, usize)> {
    struct Found {
        loads: Vec<(usize, usize)>,
        relro: Option<(usize, usize)>,
    }
    unsafe extern "C" fn first_object(
        info: *mut libc::dl_phdr_info,
        _size: libc::size_t,
        data: *mut libc::c_void,
    ) -> libc::c_int {
        // SAFETY: the loader passes a valid info for the duration of the
        // call, and `data` is the `Found` handed to dl_iterate_phdr below.
        let (info, found) = unsafe { (&*info, &mut *(data as *mut Found)) };
        let phdrs: &[libc::Elf64_Phdr] = if info.dlpi_phdr.is_null() {
            &[]
        } else {
            // SAFETY: dlpi_phdr points at dlpi_phnum program headers.
            unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) }
        };
        let base = info.dlpi_addr as usize;
        for p in phdrs {
            let (start, end) = (
                base + p.p_vaddr as usize,
                base + (p.p_vaddr + p.p_memsz) as usize,
            );
            if p.p_type == libc::PT_LOAD && p.p_flags & libc::PF_W == 0 {
                found.loads.push((start, end));
            } else if p.p_type == libc::PT_GNU_RELRO {
                found.relro = Some((start, end));
            }
        }
        // The first object is the executable itself: stop there.
        1
    }
    let mut found = Found {
        loads: Vec::new(),
        relro: None,
    };
    // SAFETY: the callback only reads the headers the loader passes and
    // writes to `found`, which outlives the call.
    unsafe {
        libc::dl_iterate_phdr(
            Some(first_object),
            &mut found as *mut Found as *mut libc::c_void,
        );
    }
    // SAFETY: sysconf has no preconditions.
    let page = match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        n if n > 0 => n as usize,
        _ => 4096,
    };
    let mut out = Vec::new();
    for (start, end) in found.loads {
        // Only whole pages inside the segment: the pages at its edges may
        // be shared with a neighbouring, written segment.
        let mut pieces = vec![(start.div_ceil(page) * page, end / page * page)];
        if let Some((rs, re)) = found.relro {
            let (rs, re) = (rs / page * page, re.div_ceil(page) * page);
            pieces = pieces
                .into_iter()
                .flat_map(|(s, e)| [(s, e.min(rs)), (s.max(re), e)])
                .collect();
        }
        out.extend(pieces.into_iter().filter(|(s, e)| s < e));
    }
    out
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

    /// The resident KiB of this executable's read-only mappings that hold
    /// its loaded code and data (not another mapping of the same file: a
    /// panic's backtrace maps the whole executable to read its debug
    /// information, and that stays).
    #[cfg(target_os = "linux")]
    fn own_code_rss_kib() -> u64 {
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let code = code_ranges();
        let mut ours = false;
        let mut kib = 0;
        for line in smaps.lines() {
            let mut words = line.split_whitespace();
            let first = words.next().unwrap_or("");
            if first.contains('-') && !first.ends_with(':') {
                let perms = words.next().unwrap_or("");
                let path = line.split_whitespace().nth(5).unwrap_or("");
                let (start, end) = first.split_once('-').unwrap_or(("0", "0"));
                let start = usize::from_str_radix(start, 16).unwrap_or(0);
                let end = usize::from_str_radix(end, 16).unwrap_or(0);
                let loaded = code.iter().any(|(s, e)| start < *e && *s < end);
                ours = loaded && !perms.contains('w') && std::path::Path::new(path) == exe;
            } else if ours && first == "Rss:" {
                kib += words
                    .next()
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0);
            }
        }
        kib
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn dropped_code_pages_leave_the_mappings_and_the_code_runs_on() {
        // Touch a good part of the code first (formatting, collections).
        let text: Vec<String> = (0..2000).map(|i| format!("{i:x}")).collect();
        // The other tests' threads run on meanwhile and fault their code
        // back in; on a busy machine that can be half of it before the
        // reading. One of a few tries shows the drop.
        let mut seen = Vec::new();
        for _ in 0..5 {
            let before = own_code_rss_kib();
            let advised = drop_code_pages();
            let after = own_code_rss_kib();
            assert!(advised > 0, "nothing advised");
            seen.push((before, after));
            if after < before / 2 {
                break;
            }
        }
        assert!(
            seen.iter().any(|(before, after)| after < &(before / 2)),
            "code RSS (KiB) before and after each drop: {seen:?}"
        );
        // Code and read-only data fault back in; the RELRO range (function
        // pointers written at start) was kept, or these calls would crash.
        let again: Vec<String> = (0..2000).map(|i| format!("{i:x}")).collect();
        assert_eq!(text, again);
        assert!(own_code_rss_kib() > 0);
    }
}
