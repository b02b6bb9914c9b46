//! One accepted client connection of the node's API: plain TCP or TLS
//! over TCP, read and written as one byte stream.
//!
//! The socket stays in blocking mode, but the server's own reads and
//! writes never wait on it: [`Conn::fill`] takes what the socket holds
//! (`MSG_DONTWAIT`), driving the TLS handshake as records come, and
//! [`Conn::write_all_by`] writes without waiting and polls for room until
//! an absolute deadline. So the poll thread can read heads and handshakes
//! of many clients at once, and a worker never waits past a deadline.
//!
//! An upgraded session (exec, attach, port-forward) must wait on the
//! client and the runtime at once; rustls cannot split a connection into
//! a read half and a write half, so such a relay polls the socket
//! (`tcp()`) and drives the TLS state itself (`tls_mut()`).

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::time::Instant;

/// The plaintext of one TLS record at most: what a read may add past
/// [`Conn::fill`]'s limit.
const MAX_RECORD: usize = 16 * 1024;

/// A client of the node's API.
pub enum Conn {
    Plain(TcpStream),
    Tls(TcpStream, Box<rustls::ServerConnection>),
}

impl Conn {
    /// The socket underneath, for timeouts, polling and the peer address.
    pub(crate) fn tcp(&self) -> &TcpStream {
        match self {
            Conn::Plain(s) | Conn::Tls(s, _) => s,
        }
    }

    /// Whether TLS records wait to be written (the handshake's, or a
    /// session ticket): the poll thread then also waits for room.
    pub(crate) fn wants_write(&self) -> bool {
        match self {
            Conn::Plain(_) => false,
            Conn::Tls(_, c) => c.wants_write(),
        }
    }

    /// Appends to `buf` what the client sent that the socket holds now,
    /// decrypted, without waiting; stops reading the socket once `buf`
    /// holds `limit` bytes (a TLS read may add one record past it). Also
    /// writes, without waiting, the TLS records that wait. Every plaintext
    /// byte rustls decrypted is taken, so none is left behind when the
    /// connection moves to another thread. An error (a socket error, a
    /// TLS alert to send) means the connection is done.
    pub(crate) fn fill(&mut self, buf: &mut Vec<u8>, limit: usize) -> io::Result<Filled> {
        let mut got = Filled::default();
        let mut chunk = [0u8; 4096];
        match self {
            Conn::Plain(s) => {
                while buf.len() < limit {
                    let want = (limit - buf.len()).min(chunk.len());
                    match NoWait(s).read(&mut chunk[..want]) {
                        Ok(0) => {
                            got.eof = true;
                            break;
                        }
                        Ok(n) => {
                            got.received = true;
                            extend_bounded(buf, &chunk[..n], limit);
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(e),
                    }
                }
            }
            Conn::Tls(s, c) => {
                while buf.len() < limit && !got.eof {
                    match c.read_tls(&mut NoWait(s)) {
                        Ok(0) => got.eof = true,
                        Ok(_) => got.received = true,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e) => return Err(e),
                    }
                    let state = match c.process_new_packets() {
                        Ok(state) => state,
                        Err(e) => {
                            // The alert rustls queued, if the socket takes it.
                            let _ = write_pending(s, c);
                            return Err(io::Error::new(io::ErrorKind::InvalidData, e));
                        }
                    };
                    let (mut left, closed) =
                        (state.plaintext_bytes_to_read(), state.peer_has_closed());
                    while left > 0 {
                        let n = c.reader().read(&mut chunk[..left.min(4096)])?;
                        if n == 0 {
                            break;
                        }
                        extend_bounded(buf, &chunk[..n], limit + MAX_RECORD);
                        left -= n;
                    }
                    got.eof |= closed;
                }
                write_pending(s, c)?;
            }
        }
        Ok(got)
    }

    /// Writes all of `data` (and any TLS records still waiting) by
    /// `deadline`: never blocks in a write, and waits for room with poll(2)
    /// only until the deadline (`TimedOut` past it, however slowly the
    /// client reads meanwhile).
    pub(crate) fn write_all_by(&mut self, mut data: &[u8], deadline: Instant) -> io::Result<()> {
        match self {
            Conn::Plain(s) => {
                while !data.is_empty() {
                    match NoWait(s).write(data) {
                        Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                        Ok(n) => data = &data[n..],
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            wait_writable(s, deadline)?
                        }
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(e),
                    }
                }
                Ok(())
            }
            Conn::Tls(s, c) => loop {
                if !data.is_empty() {
                    let n = c.writer().write(data)?;
                    data = &data[n..];
                    if n == 0 && !c.wants_write() {
                        return Err(io::ErrorKind::WriteZero.into());
                    }
                }
                if !c.wants_write() {
                    if data.is_empty() {
                        return Ok(());
                    }
                    continue;
                }
                match c.write_tls(&mut NoWait(s)) {
                    Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => wait_writable(s, deadline)?,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            },
        }
    }

    /// The TLS state, when the connection has one.
    pub(crate) fn tls_mut(&mut self) -> Option<(&mut TcpStream, &mut rustls::ServerConnection)> {
        match self {
            Conn::Plain(_) => None,
            Conn::Tls(s, c) => Some((s, c)),
        }
    }
}

impl Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Conn::Plain(s) => s.read(buf),
            Conn::Tls(s, c) => rustls::Stream::new(c.as_mut(), s).read(buf),
        }
    }
}

impl Write for Conn {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Conn::Plain(s) => s.write(buf),
            Conn::Tls(s, c) => rustls::Stream::new(c.as_mut(), s).write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Conn::Plain(s) => s.flush(),
            Conn::Tls(s, c) => rustls::Stream::new(c.as_mut(), s).flush(),
        }
    }
}

/// What one [`Conn::fill`] found.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Filled {
    /// Bytes came from the socket (a TLS record counts, plaintext or not).
    pub(crate) received: bool,
    /// The client closed its end (FIN, or TLS close_notify).
    pub(crate) eof: bool,
}

/// Appends `more` to `buf`, growing it by doubling but never its capacity
/// past `cap` (a head read a byte at a time costs no more than its size).
fn extend_bounded(buf: &mut Vec<u8>, more: &[u8], cap: usize) {
    let need = buf.len() + more.len();
    if need > buf.capacity() {
        let want = (buf.capacity() * 2).clamp(256, cap.max(need)).max(need);
        buf.reserve_exact(want - buf.len());
    }
    buf.extend_from_slice(more);
}

/// Writes the TLS records that wait, as far as the socket takes them
/// without waiting.
fn write_pending(s: &TcpStream, c: &mut rustls::ServerConnection) -> io::Result<()> {
    while c.wants_write() {
        match c.write_tls(&mut NoWait(s)) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Waits with poll(2) until `s` has room to write or `deadline` passes
/// (`TimedOut`).
fn wait_writable(s: &TcpStream, deadline: Instant) -> io::Result<()> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client did not take the answer within its write deadline",
            ));
        }
        let mut fd = libc::pollfd {
            fd: s.as_raw_fd(),
            events: libc::POLLOUT,
            revents: 0,
        };
        // Rounded up, so a wait never ends just short of the deadline.
        let ms = left.as_micros().div_ceil(1000).min(60_000) as libc::c_int;
        // SAFETY: polls one initialised pollfd for an open socket.
        let n = unsafe { libc::poll(&mut fd, 1, ms) };
        if n > 0 {
            // Room, or an error the next write reports.
            return Ok(());
        }
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

/// A socket read and written without waiting (`MSG_DONTWAIT`), whatever
/// its mode: `WouldBlock` when there is nothing to read or no room.
struct NoWait<'a>(&'a TcpStream);

impl Read for NoWait<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        // SAFETY: receives into a live buffer of `buf.len()` bytes from an
        // open socket.
        let n = unsafe {
            libc::recv(
                self.0.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(n as usize)
    }
}

impl Write for NoWait<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        // SAFETY: sends from a live buffer of `buf.len()` bytes on an open
        // socket; MSG_NOSIGNAL turns a closed peer into EPIPE, not SIGPIPE.
        let n = unsafe {
            libc::send(
                self.0.as_raw_fd(),
                buf.as_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(n as usize)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
