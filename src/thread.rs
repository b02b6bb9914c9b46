//! The one way tinylet starts threads: always named, with a small explicit
//! stack, and a handle that joins the thread when dropped.
//!
//! Architecture invariant: no other module calls `std::thread::spawn`; a tidy
//! test checks this.

use std::io;
use std::thread;

/// Stack size for tinylet's own threads. They parse manifests and build CRI
/// requests, nothing deeply recursive; 256 KiB leaves ample headroom for serde
/// on a large manifest while keeping 110 pod workers cheap.
pub const DEFAULT_STACK: usize = 256 * 1024;

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
        .spawn(f)?;
    Ok(JoinOnDrop(Some(handle)))
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
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

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
