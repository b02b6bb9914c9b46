//! Who holds the node API's sessions (container logs, followed or not, exec,
//! attach, port-forward), so that one caller cannot take them all, and when an
//! idle one is closed.
//!
//! Each session holds a [`SessionSlot`] for its caller: at most
//! [`PER_NAMESPACE`] per user and pod namespace, and [`PER_USER`] per user
//! whatever the namespaces; the node-wide bound is the server's
//! (`http::MAX_SESSIONS`, above both). The namespace counts because the
//! apiserver calls the node for every tenant as one user (its kubelet
//! client certificate): a tenant with `pods/log` in one namespace reaches
//! the node only in that namespace, so it fills its own share and no
//! other's. Upstream has no such bounds (a goroutine per session); the
//! counts live only while sessions do, so the maps stay as small as the
//! sessions are few.
//!
//! The idle timeout is upstream's `streamingConnectionIdleTimeout`
//! (default 4h): a session with no traffic either way for that long is
//! closed. [`IdleWriter`] applies it to a log follow, `stream`'s relay to
//! exec, attach and port-forward.

use std::collections::HashMap;
use std::io::{self, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Sessions one user holds in one pod namespace at most.
pub(crate) const PER_NAMESPACE: usize = 8;
/// Sessions one user holds at most, whatever the namespaces: a quarter of
/// the node's stay free for others (an admin, the apiserver).
pub(crate) const PER_USER: usize = 48;

/// The session counts by caller, and the idle timeout.
pub(crate) struct Sessions {
    idle: Option<Duration>,
    held: Mutex<Held>,
}

#[derive(Default)]
struct Held {
    by_user: HashMap<String, usize>,
    by_namespace: HashMap<(String, String), usize>,
}

/// One session's place in its caller's counts, given back when dropped.
pub(crate) struct SessionSlot {
    sessions: Arc<Sessions>,
    user: String,
    namespace: String,
}

impl Sessions {
    /// Counts with `idle` as the idle timeout (zero: none).
    pub(crate) fn new(idle: Duration) -> Arc<Sessions> {
        Arc::new(Sessions {
            idle: (!idle.is_zero()).then_some(idle),
            held: Mutex::new(Held::default()),
        })
    }

    /// How long a session may go without traffic; none: forever.
    pub(crate) fn idle(&self) -> Option<Duration> {
        self.idle
    }

    /// A slot for one more session of `user` on a pod in `namespace`, or
    /// why not (the refusal's text for the client).
    pub(crate) fn admit(
        self: &Arc<Self>,
        user: &str,
        namespace: &str,
    ) -> Result<SessionSlot, String> {
        let mut held = self.held.lock();
        let in_namespace = held
            .by_namespace
            .get(&(user.to_string(), namespace.to_string()))
            .copied()
            .unwrap_or(0);
        if in_namespace >= PER_NAMESPACE {
            return Err(format!(
                "too many sessions: user {user:?} holds {PER_NAMESPACE} in namespace \
                 {namespace:?}, the most one user may; close one and try again\n"
            ));
        }
        if held.by_user.get(user).copied().unwrap_or(0) >= PER_USER {
            return Err(format!(
                "too many sessions: user {user:?} holds {PER_USER} on this node, the most \
                 one user may; close one and try again\n"
            ));
        }
        *held.by_user.entry(user.to_string()).or_default() += 1;
        *held
            .by_namespace
            .entry((user.to_string(), namespace.to_string()))
            .or_default() += 1;
        Ok(SessionSlot {
            sessions: self.clone(),
            user: user.to_string(),
            namespace: namespace.to_string(),
        })
    }

    /// Sessions `user` holds (in `namespace`, when given).
    #[cfg(test)]
    fn held(&self, user: &str, namespace: Option<&str>) -> usize {
        let held = self.held.lock();
        match namespace {
            Some(ns) => held
                .by_namespace
                .get(&(user.to_string(), ns.to_string()))
                .copied()
                .unwrap_or(0),
            None => held.by_user.get(user).copied().unwrap_or(0),
        }
    }
}

impl Drop for SessionSlot {
    fn drop(&mut self) {
        let mut held = self.sessions.held.lock();
        let key = (
            std::mem::take(&mut self.user),
            std::mem::take(&mut self.namespace),
        );
        if let Some(n) = held.by_namespace.get_mut(&key) {
            *n -= 1;
            if *n == 0 {
                held.by_namespace.remove(&key);
            }
        }
        if let Some(n) = held.by_user.get_mut(&key.0) {
            *n -= 1;
            if *n == 0 {
                held.by_user.remove(&key.0);
            }
        }
    }
}

/// A writer that fails once nothing was written to it for the idle
/// timeout: a log follow flushes it while it waits for new lines, so a
/// quiet log's follow ends after that long, as an idle stream does.
pub(crate) struct IdleWriter<W> {
    inner: W,
    idle: Option<Duration>,
    last: Instant,
}

impl<W: Write> IdleWriter<W> {
    pub(crate) fn new(inner: W, idle: Option<Duration>) -> IdleWriter<W> {
        IdleWriter {
            inner,
            idle,
            last: Instant::now(),
        }
    }

    pub(crate) fn into_inner(self) -> W {
        self.inner
    }
}

impl<W: Write> Write for IdleWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        if n > 0 {
            self.last = Instant::now();
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()?;
        match self.idle {
            Some(idle) if self.last.elapsed() >= idle => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "no traffic for {} (the streaming connection idle timeout)",
                    crate::apitime::go_duration(idle)
                ),
            )),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_caller_holds_at_most_its_share_and_others_still_get_theirs() {
        let s = Sessions::new(Duration::from_secs(3600));
        let mut mine: Vec<SessionSlot> = (0..PER_NAMESPACE)
            .map(|_| s.admit("alice", "team-a").unwrap())
            .collect();
        let refused = s.admit("alice", "team-a").err().unwrap();
        assert!(
            refused.contains("\"alice\"") && refused.contains("\"team-a\""),
            "{refused}"
        );
        // Another user in the same namespace, and the same user (the
        // apiserver, for another tenant) in another namespace: served.
        let bob = s.admit("bob", "team-a").unwrap();
        let other = s.admit("alice", "team-b").unwrap();
        assert_eq!(s.held("alice", None), PER_NAMESPACE + 1);
        // One given back: one more is let in.
        mine.pop();
        mine.push(s.admit("alice", "team-a").unwrap());
        drop((bob, other));

        // Across namespaces one user stops at PER_USER.
        let mut spread = Vec::new();
        let mut i = 0;
        while s.held("alice", None) < PER_USER {
            spread.push(
                s.admit("alice", &format!("ns-{}", i / PER_NAMESPACE))
                    .unwrap(),
            );
            i += 1;
        }
        let refused = s.admit("alice", "fresh").err().unwrap();
        assert!(refused.contains(&PER_USER.to_string()), "{refused}");
        assert!(s.admit("carol", "fresh").is_ok());

        // Every slot given back: nothing is left in the maps.
        drop(mine);
        drop(spread);
        assert_eq!(s.held("alice", None), 0);
        assert_eq!(s.held("alice", Some("team-a")), 0);
        let held = s.held.lock();
        assert!(held.by_user.is_empty() && held.by_namespace.is_empty());
    }

    #[test]
    fn an_idle_writer_fails_its_flush_once_nothing_was_written_for_the_timeout() {
        let mut w = IdleWriter::new(Vec::new(), Some(Duration::from_millis(50)));
        w.write_all(b"line\n").unwrap();
        w.flush().unwrap();
        std::thread::sleep(Duration::from_millis(80));
        let e = w.flush().unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        // Writing again is traffic: the clock starts over.
        w.write_all(b"more\n").unwrap();
        w.flush().unwrap();
        assert_eq!(w.into_inner(), b"line\nmore\n");

        let mut never = IdleWriter::new(Vec::new(), None);
        never.flush().unwrap();
        assert!(Sessions::new(Duration::ZERO).idle().is_none());
    }
}
