//! The counting relay the benches put in front of the fake apiserver:
//! what it counts, and that it relays only on loopback.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};

use tinylet::thread::spawn_named;

use crate::support::relay::{Counts, Relay};

#[test]
fn counts_each_way_and_passes_the_end_on() {
    let server = TcpListener::bind("127.0.0.1:0").unwrap();
    let at = server.local_addr().unwrap();
    let echo = spawn_named("relay-test-echo", move || {
        let (mut s, _) = server.accept().unwrap();
        let mut got = Vec::new();
        s.read_to_end(&mut got).unwrap();
        s.write_all(&got).unwrap();
        s.write_all(b"!").unwrap();
    })
    .unwrap();
    let relay = Relay::start(at).unwrap();
    let mut c = TcpStream::connect(relay.addr()).unwrap();
    c.write_all(b"hello").unwrap();
    c.shutdown(Shutdown::Write).unwrap();
    let mut back = Vec::new();
    c.read_to_end(&mut back).unwrap();
    echo.join().unwrap();
    // The end reaches the client after the bytes are counted.
    assert_eq!(back, b"hello!");
    let n = relay.counts();
    assert_eq!((n.up, n.down, n.connections), (5, 6, 1));
    assert_eq!(n.since(&Counts::default()).total(), 11);
}

#[test]
fn relays_only_to_loopback() {
    let e = Relay::start("192.0.2.1:443".parse().unwrap())
        .err()
        .unwrap();
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
}
