//! The one way tinylet starts threads: always named, with a small explicit
//! stack, and a handle that joins the thread when dropped.
//!
//! Architecture invariant: no other module calls `std::thread::spawn`,
//! `std::thread::scope` or a `thread::Builder`; a tidy test checks this.

use std::io;
use std::thread;

/// Stack size for tinylet's own threads. They parse manifests and build CRI
/// requests, nothing deeply recursive; 256 KiB leaves ample headroom for serde
/// on a large manifest while keeping 110 pod workers cheap.
pub(crate) const DEFAULT_STACK: usize = 256 * 1024;

/// Starts a named thread with the default stack size.
pub fn spawn_named<F, T>(name: impl Into<String>, f: F) -> io::Result<JoinOnDrop<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    spawn_with_stack(name, DEFAULT_STACK, f)
}

/// Starts a named thread with the given stack size.
pub fn spawn_with_stack<F, T>(
    name: impl Into<String>,
    stack: usize,
    f: F,
) -> io::Result<JoinOnDrop<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let handle = thread::Builder::new()
        .name(name.into())
        .stack_size(stack)
        .spawn(move || {
            let result = f();
            release_stack();
            result
        })?;
    Ok(JoinOnDrop(Some(handle)))
}

/// Runs `f` with a scope in which it can start named threads that borrow
/// from the caller's stack (`std::thread::scope`); every thread started in
/// the scope is joined before `scope_named` returns, and a panic in one
/// that nobody joined panics here.
pub(crate) fn scope_named<'env, F, T>(f: F) -> T
where
    F: for<'scope> FnOnce(&NamedScope<'scope, 'env>) -> T,
{
    thread::scope(|s| f(&NamedScope(s)))
}

/// The scope [`scope_named`] hands out: its threads are named and get the
/// default stack size.
pub(crate) struct NamedScope<'scope, 'env: 'scope>(&'scope thread::Scope<'scope, 'env>);

impl<'scope, 'env> NamedScope<'scope, 'env> {
    /// Starts a named thread with the default stack size in this scope.
    pub(crate) fn spawn<F, T>(
        &self,
        name: impl Into<String>,
        f: F,
    ) -> io::Result<thread::ScopedJoinHandle<'scope, T>>
    where
        F: FnOnce() -> T + Send + 'scope,
        T: Send + 'scope,
    {
        thread::Builder::new()
            .name(name.into())
            .stack_size(DEFAULT_STACK)
            .spawn_scoped(self.0, f)
    }
}

/// Hands the pages of the ending thread's stack below the current frame
/// back to the system. glibc keeps the stacks of ended threads (up to
/// 40 MiB) for new threads to reuse, with every page they touched still
/// resident: after 110 pod workers came and went that was ~4 MiB of RSS.
/// The stack stays mapped, so reuse works as before; its pages come back
/// zeroed when touched again.
fn release_stack() {
    let _ = release_stack_below_here();
}

/// Hands back the stack pages below the caller's frame of a thread that
/// is about to wait a long time (a pod worker between syncs): a sync's deep
/// calls (gRPC, protobuf, serde) touch tens of KiB that would otherwise stay
/// resident for every pod. Call it from a shallow frame.
pub(crate) fn release_idle_stack() {
    let _ = release_stack_below_here();
}

/// Does the work of [`release_stack`]; returns the released range.
fn release_stack_below_here() -> Option<(usize, usize)> {
    #[cfg(target_os = "linux")]
    {
        let here = 0u8;
        let sp = std::hint::black_box(&here) as *const u8 as usize;
        // SAFETY: the attribute object is initialised by pthread_getattr_np
        // and destroyed after use; madvise only drops pages of this thread's
        // own stack below the live frames (leaving a page of margin), which
        // nothing else uses.
        unsafe {
            let mut attr: libc::pthread_attr_t = std::mem::zeroed();
            if libc::pthread_getattr_np(libc::pthread_self(), &mut attr) != 0 {
                return None;
            }
            let mut base: *mut libc::c_void = std::ptr::null_mut();
            let mut size: libc::size_t = 0;
            let got = libc::pthread_attr_getstack(&attr, &mut base, &mut size);
            libc::pthread_attr_destroy(&mut attr);
            if got != 0 {
                return None;
            }
            let page = match usize::try_from(libc::sysconf(libc::_SC_PAGESIZE)) {
                Ok(p) if p.is_power_of_two() => p,
                _ => return None,
            };
            let low = base as usize;
            let top = (sp & !(page - 1)).saturating_sub(page);
            if top > low
                && sp < low + size
                && libc::madvise(base, top - low, libc::MADV_DONTNEED) == 0
            {
                return Some((low, top));
            }
        }
    }
    None
}

/// A thread handle that joins the thread when dropped, so that an owner that
/// goes away also waits for its thread. Declare it after the sender that
/// stops the thread: fields drop in order, the sender first.
pub struct JoinOnDrop<T>(Option<thread::JoinHandle<T>>);

impl<T> JoinOnDrop<T> {
    /// Waits for the thread and returns its result (`Err` if it panicked).
    pub fn join(mut self) -> thread::Result<T> {
        match self.0.take() {
            Some(h) => h.join(),
            None => Err(Box::new("thread already joined")),
        }
    }

    /// Lets the thread run on without being joined.
    pub fn detach(mut self) {
        self.0.take();
    }

    pub fn is_finished(&self) -> bool {
        self.0.as_ref().is_none_or(|h| h.is_finished())
    }
}

impl<T> Drop for JoinOnDrop<T> {
    fn drop(&mut self) {
        if let Some(h) = self.0.take() {
            if h.thread().id() != thread::current().id() {
                let _ = h.join();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Touches `kib` KiB of stack.
    #[inline(never)]
    fn deep(kib: usize) -> u8 {
        let buf = std::hint::black_box([1u8; 1024]);
        if kib <= 1 {
            buf[7]
        } else {
            buf[3].wrapping_add(deep(kib - 1))
        }
    }

    #[test]
    fn an_ending_thread_gives_its_touched_stack_pages_back() {
        let t = spawn_named("stack-test", || {
            std::hint::black_box(deep(64));
            let (low, top) = release_stack_below_here().expect("nothing released");
            let page = 4096usize.max(unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize);
            let pages = (top - low).div_ceil(page);
            let mut vec = vec![0u8; pages];
            // SAFETY: the range is this thread's mapped stack.
            let r = unsafe { libc::mincore(low as *mut libc::c_void, top - low, vec.as_mut_ptr()) };
            assert_eq!(r, 0);
            (top - low, vec.iter().filter(|v| **v & 1 == 1).count())
        })
        .unwrap();
        let (len, resident) = t.join().unwrap();
        assert!(len >= 60 * 1024, "released only {len} bytes");
        assert_eq!(resident, 0, "pages still resident below the frame");
    }
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    #[test]
    fn scoped_threads_are_named_borrow_and_are_joined_by_the_scope() {
        let counted = std::sync::atomic::AtomicUsize::new(0);
        let names = scope_named(|s| {
            let handles: Vec<_> = (0..3)
                .map(|i| {
                    let counted = &counted;
                    s.spawn(format!("scoped/{i}"), move || {
                        counted.fetch_add(1, Ordering::SeqCst);
                        thread::current().name().map(str::to_string)
                    })
                    .unwrap()
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap())
                .collect::<Vec<_>>()
        });
        assert_eq!(counted.load(Ordering::SeqCst), 3);
        assert_eq!(
            names,
            ["scoped/0", "scoped/1", "scoped/2"].map(|n| Some(n.to_string()))
        );
        // Threads nobody joined are joined when the scope ends.
        scope_named(|s| {
            s.spawn("scoped/unjoined", || {
                std::thread::sleep(std::time::Duration::from_millis(20));
                counted.fetch_add(1, Ordering::SeqCst);
            })
            .unwrap();
        });
        assert_eq!(counted.load(Ordering::SeqCst), 4);
    }

    #[test]
    fn named_thread_runs_and_is_joined_on_drop() {
        let ran = Arc::new(AtomicBool::new(false));
        let r = ran.clone();
        let h = spawn_named("test-thread", move || {
            assert_eq!(thread::current().name(), Some("test-thread"));
            std::thread::sleep(std::time::Duration::from_millis(20));
            r.store(true, Ordering::SeqCst);
        })
        .unwrap();
        drop(h);
        assert!(ran.load(Ordering::SeqCst));
    }
}
