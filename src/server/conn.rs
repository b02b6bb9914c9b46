//! One accepted client connection of the node's API: plain TCP or TLS
//! over TCP, read and written as one byte stream.
//!
//! An upgraded session (exec, attach, port-forward) must wait on the
//! client and the runtime at once; rustls cannot split a connection into
//! a read half and a write half, so such a relay polls the socket
//! (`tcp()`) and drives the TLS state itself (`tls_mut()`).

use std::io::{self, Read, Write};
use std::net::TcpStream;

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

    /// Whether bytes already received wait to be read that polling the
    /// socket would not announce: decrypted ones rustls holds (it wants
    /// no read from the socket until they are taken), or its peer's end.
    pub(crate) fn holds_input(&self) -> bool {
        match self {
            Conn::Plain(_) => false,
            Conn::Tls(_, c) => !c.wants_read(),
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
