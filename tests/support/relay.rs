//! A counting relay for tests and benches: a TCP relay on loopback that
//! sits in front of a server (the fake apiserver) and counts the bytes that
//! cross it each way, TLS records, handshakes and HTTP framing included, so
//! what a client costs a metered link is measured rather than estimated.
//!
//! Each accepted connection gets a connection of its own to the server and
//! two threads that copy, one per direction; when one side ends its half,
//! the other side's write half is shut, and the pair closes when both are
//! done. Dropping the relay stops accepting and cuts every open pair.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tinylet::thread::{spawn_named, JoinOnDrop};

/// The relay's handle: its address, its counters; dropping it stops it.
pub struct Relay {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: Option<JoinOnDrop<()>>,
}

#[derive(Default)]
struct Shared {
    stop: AtomicBool,
    /// Bytes from the client to the server.
    up: AtomicU64,
    /// Bytes from the server to the client.
    down: AtomicU64,
    accepted: AtomicU64,
    /// Both sockets of every pair still open, to cut them on drop.
    open: Mutex<HashMap<u64, (TcpStream, TcpStream)>>,
}

/// The counters at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Client to server.
    pub up: u64,
    /// Server to client.
    pub down: u64,
    /// Connections accepted so far.
    pub connections: u64,
}

impl Counts {
    pub fn total(&self) -> u64 {
        self.up + self.down
    }

    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &Counts) -> Counts {
        Counts {
            up: self.up - earlier.up,
            down: self.down - earlier.down,
            connections: self.connections - earlier.connections,
        }
    }
}

impl Relay {
    /// Relays 127.0.0.1:<a free port> to `server`, which must be on
    /// loopback too: nothing here reaches past the machine.
    pub fn start(server: SocketAddr) -> io::Result<Relay> {
        if !server.ip().is_loopback() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("the relay only relays to loopback, not {server}"),
            ));
        }
        let listener = TcpListener::bind((IpAddr::from([127, 0, 0, 1]), 0))?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared::default());
        let s = shared.clone();
        let accept = spawn_named("relay-accept", move || accept_loop(listener, server, &s))?;
        Ok(Relay {
            addr,
            shared,
            accept: Some(accept),
        })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn counts(&self) -> Counts {
        Counts {
            up: self.shared.up.load(Ordering::SeqCst),
            down: self.shared.down.load(Ordering::SeqCst),
            connections: self.shared.accepted.load(Ordering::SeqCst),
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // Wakes the accept loop so that it sees the flag.
        let _ = TcpStream::connect(self.addr);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        let open = std::mem::take(&mut *lock(&self.shared.open));
        for (a, b) in open.into_values() {
            let _ = a.shutdown(Shutdown::Both);
            let _ = b.shutdown(Shutdown::Both);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn accept_loop(listener: TcpListener, server: SocketAddr, shared: &Arc<Shared>) {
    for conn in listener.incoming() {
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(client) = conn else { continue };
        // A server that refuses shows to the client as a connection that
        // closes at once.
        let Ok(upstream) = TcpStream::connect(server) else {
            continue;
        };
        let id = shared.accepted.fetch_add(1, Ordering::SeqCst);
        let _ = client.set_nodelay(true);
        let _ = upstream.set_nodelay(true);
        let clones = (
            client.try_clone(),
            upstream.try_clone(),
            client.try_clone(),
            upstream.try_clone(),
        );
        let (Ok(c2), Ok(u2), Ok(c3), Ok(u3)) = clones else {
            continue;
        };
        lock(&shared.open).insert(id, (c3, u3));
        // The pumps end with their sockets; nothing waits for them. The
        // second to end forgets the pair.
        let left = Arc::new(AtomicUsize::new(2));
        for (name, from, to, up) in [
            ("relay-up", client, u2, true),
            ("relay-down", upstream, c2, false),
        ] {
            let (s, left) = (shared.clone(), left.clone());
            let t = spawn_named(name, move || {
                pump(from, to, if up { &s.up } else { &s.down });
                if left.fetch_sub(1, Ordering::SeqCst) == 1 {
                    lock(&s.open).remove(&id);
                }
            });
            if let Ok(t) = t {
                t.detach();
            }
        }
    }
}

/// Copies `from` to `to`, counting, until `from` ends or either fails;
/// then ends `to`'s write half so the other side sees the end too.
fn pump(mut from: TcpStream, mut to: TcpStream, count: &AtomicU64) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        // Counted before it is passed on, so that whoever sees it arrive
        // sees it counted.
        count.fetch_add(n as u64, Ordering::SeqCst);
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
    let _ = from.shutdown(Shutdown::Read);
}
