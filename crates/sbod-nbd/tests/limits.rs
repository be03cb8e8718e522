//! The server's limits against clients that would exhaust it (server::Limits): stalled
//! handshakes are closed while others are served, connections beyond the limits are refused
//! with the reason and served again once one closes, a WRITE whose payload stalls gives its
//! budget back, a client that does not take its replies is closed, an idle connection is
//! closed only when asked. Memory staying bounded is measured on the `sbod export` process
//! (crates/sbod/tests/nbd_limits.rs).

use crate::common;
use common::*;
use sbod_nbd::proto::*;
use sbod_nbd::{Limits, MemBackend};
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::process::Command;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

const SIZE: u64 = 64 << 20;

/// Poll `f` until it holds (up to a generous bound, so a slow machine never fails it).
fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..1200 {
        if f() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("never happened: {what}");
}

/// Whether the server still holds the connection and has sent nothing: a read finds no
/// data (rather than data or the end of the stream).
fn held(s: &mut UnixStream) -> bool {
    s.set_nonblocking(true).unwrap();
    let mut b = [0u8; 1];
    let r = s.read(&mut b);
    s.set_nonblocking(false).unwrap();
    matches!(r, Err(e) if e.kind() == ErrorKind::WouldBlock)
}

/// Read until the server closes the stream; panics if it sends anything else or stays open.
fn closed_by_server(s: &mut UnixStream) {
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let mut b = [0u8; 4096];
    loop {
        match s.read(&mut b) {
            Ok(0) => return,
            Ok(_) => continue,
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return,
            Err(e) => panic!("the server did not close the connection: {e}"),
        }
    }
}

fn nbdinfo(uri: &str) -> std::process::Output {
    need("nbdinfo");
    Command::new("nbdinfo")
        .args(["--size", uri])
        .env("LIBNBD_DEBUG", "1")
        .output()
        .unwrap()
}

/// 500 connections that stop in the handshake (after the greeting, half of them in the
/// middle of an option) are held until the handshake deadline, then closed; meanwhile
/// nbdinfo (libnbd) is served. Control: they really were accepted and held (greeted, still
/// open after nbdinfo ran), and the server counts each as closed for the deadline.
#[test]
fn stalled_handshakes_are_closed_while_others_are_served() {
    let limits = Limits {
        handshake_timeout: Duration::from_secs(15),
        ..Limits::default()
    };
    let srv =
        TestServer::start_limited(vec![("mem", Arc::new(MemBackend::new(SIZE)))], limits, None);
    let mut stalled: Vec<UnixStream> = (0..500)
        .map(|i| {
            let mut s = UnixStream::connect(&srv.sock).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
            if i % 2 == 0 {
                // Greeting read, no flags sent.
                let mut g = [0u8; 18];
                s.read_exact(&mut g).unwrap();
            } else {
                // Flags, then half an option header.
                greet(&mut s);
                s.write_all(&IHAVEOPT.to_be_bytes()).unwrap();
            }
            s
        })
        .collect();
    let o = nbdinfo(&srv.uri());
    assert!(
        o.status.success(),
        "nbdinfo failed while stalled handshakes were held: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), SIZE.to_string());
    for s in &mut stalled {
        assert!(
            held(s),
            "a stalled handshake was closed before its deadline"
        );
    }
    for s in &mut stalled {
        closed_by_server(s);
    }
    eventually("each counted as closed for the deadline", || {
        srv.stats.timeouts.load(Relaxed) >= 500
    });
}

/// With a limit of 3 connections the 4th is refused, and libnbd reports the server's reason
/// (in its debug output: its error says "server policy prevents NBD_OPT_GO");
/// once one closes, a client is served again. Per client address (TCP): a third connection
/// from 127.0.0.1 is refused with its reason while the Unix socket still serves.
#[test]
fn connection_limits_refuse_with_the_reason_and_recover() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let tcp: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let limits = Limits {
        max_connections: 3,
        max_per_client: 2,
        ..Limits::default()
    };
    let srv = TestServer::start_limited(
        vec![("mem", Arc::new(MemBackend::new(SIZE)))],
        limits,
        Some(tcp),
    );
    let tcp_uri = format!("nbd://127.0.0.1:{port}/mem");

    // Two over TCP: the third from the same address is refused.
    let mut t: Vec<TcpStream> = (0..2)
        .map(|_| {
            let mut s = TcpStream::connect(tcp).unwrap();
            let mut g = [0u8; 18];
            s.read_exact(&mut g).unwrap();
            s
        })
        .collect();
    let o = nbdinfo(&tcp_uri);
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(
        !o.status.success(),
        "a third connection from one address was served"
    );
    assert!(
        err.contains("limit of 2 connections from 127.0.0.1"),
        "nbdinfo does not show the reason: {err}"
    );
    // The Unix socket (no client address) still serves: the server-wide limit has room.
    let mut c = Client::connect(&srv.sock, true);
    assert_eq!(c.write(0, &[7u8; 4096], false), 0);

    // Now 3 connections are open: the server-wide limit refuses the next one.
    let o = nbdinfo(&srv.uri());
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(
        !o.status.success(),
        "a 4th connection was served over a limit of 3"
    );
    assert!(
        err.contains("connection limit (3) is reached"),
        "nbdinfo does not show the reason: {err}"
    );
    assert!(srv.stats.refused.load(Relaxed) >= 2);
    // The refused attempts harmed nothing: the held client still works.
    assert_eq!(c.read(0, 4096).unwrap(), vec![7u8; 4096]);

    // One closes: served again.
    drop(t.pop());
    eventually("nbdinfo is served once a connection closed", || {
        nbdinfo(&srv.uri()).status.success()
    });
    // And another from 127.0.0.1 is under its per-address limit again.
    drop(t);
    eventually("TCP is served once its connections closed", || {
        nbdinfo(&tcp_uri).status.success()
    });
    c.disconnect();
}

/// A WRITE header of the largest size whose payload stalls holds the whole (32 MiB) budget:
/// another client's write waits for it; the stalled connection is closed at the I/O
/// deadline, its budget returns, the waiting write completes, and none of the stalled
/// payload reached the export. Control: the budget really was held (the gauge shows it,
/// and the other write had not been answered) before the deadline.
#[test]
fn a_stalled_payload_gives_its_budget_back() {
    let limits = Limits {
        inflight_bytes: 32 << 20,
        io_timeout: Duration::from_secs(3),
        ..Limits::default()
    };
    let backend = Arc::new(MemBackend::new(SIZE));
    let srv = TestServer::start_limited(vec![("mem", backend)], limits, None);
    let mut bad = Client::connect(&srv.sock, false);
    let mut hdr = Vec::new();
    hdr.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
    hdr.extend_from_slice(&0u16.to_be_bytes());
    hdr.extend_from_slice(&CMD_WRITE.to_be_bytes());
    hdr.extend_from_slice(&99u64.to_be_bytes());
    hdr.extend_from_slice(&(8u64 << 20).to_be_bytes());
    hdr.extend_from_slice(&(32u32 << 20).to_be_bytes());
    bad.s.write_all(&hdr).unwrap();
    bad.s.write_all(&vec![0xEEu8; 1 << 20]).unwrap();
    eventually("the stalled write holds the budget", || {
        srv.stats.inflight_bytes.load(Relaxed) == 32 << 20
    });

    let mut good = Client::connect(&srv.sock, true);
    let c = good.send(CMD_WRITE, 0, 0, 4096, &[5u8; 4096]);
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        held(&mut good.s),
        "the write was answered while the budget was held"
    );
    closed_by_server(&mut bad.s);
    good.s
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let (cookie, err, _) = good.reply(0);
    assert_eq!((cookie, err), (c, 0));
    assert_eq!(good.read(0, 4096).unwrap(), vec![5u8; 4096]);
    assert_eq!(good.read(8 << 20, 4096).unwrap(), vec![0u8; 4096]);
    eventually("counted as closed for the deadline", || {
        srv.stats.timeouts.load(Relaxed) >= 1
    });
    good.disconnect();
    eventually("the budget is all back", || {
        srv.stats.inflight_bytes.load(Relaxed) == 0
    });
}

/// A client that sends READs and never takes the replies holds their data only until the
/// I/O deadline: the connection is closed and the budget returns; others are served.
#[test]
fn replies_not_taken_give_the_budget_back() {
    let limits = Limits {
        inflight_bytes: 64 << 20,
        io_timeout: Duration::from_secs(3),
        ..Limits::default()
    };
    let srv =
        TestServer::start_limited(vec![("mem", Arc::new(MemBackend::new(SIZE)))], limits, None);
    let mut bad = Client::connect(&srv.sock, false);
    for _ in 0..16 {
        bad.send(CMD_READ, 0, 0, 4 << 20, &[]);
    }
    eventually("unsent replies hold budget", || {
        srv.stats.inflight_bytes.load(Relaxed) > 0
    });
    eventually("the connection is closed and its budget returns", || {
        srv.stats.inflight_bytes.load(Relaxed) == 0 && srv.stats.timeouts.load(Relaxed) >= 1
    });
    let mut good = Client::connect(&srv.sock, true);
    assert_eq!(good.read(0, 32 << 20).unwrap().len(), 32 << 20);
    good.disconnect();
    closed_by_server(&mut bad.s);
}

/// With an idle timeout a connection with nothing in flight that sends nothing is closed
/// (after it had been served); without one (the default) it is kept.
#[test]
fn idle_connections_are_closed_only_when_asked() {
    let idle = TestServer::start_limited(
        vec![("mem", Arc::new(MemBackend::new(SIZE)))],
        Limits {
            idle_timeout: Some(Duration::from_secs(1)),
            ..Limits::default()
        },
        None,
    );
    let mut c = Client::connect(&idle.sock, true);
    assert_eq!(c.write(0, &[1u8; 4096], false), 0);
    closed_by_server(&mut c.s);
    eventually("counted as closed for the deadline", || {
        idle.stats.timeouts.load(Relaxed) >= 1
    });

    let keep = TestServer::start(SIZE);
    let mut c = Client::connect(&keep.sock, true);
    assert_eq!(c.write(0, &[1u8; 4096], false), 0);
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(c.read(0, 4096).unwrap(), vec![1u8; 4096]);
    c.disconnect();
}

/// Requests sent together with the GO (before its reply) are kept across the switch from
/// the handshake's small buffers to the transmission's: a WRITE and a FLUSH sent in one
/// write with the option are both served, and the data reads back.
#[test]
fn requests_pipelined_after_go_are_kept() {
    let srv = TestServer::start(SIZE);
    let mut s = UnixStream::connect(&srv.sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    greet(&mut s);
    let go = encode_info_request(&InfoRequest {
        name: String::new(),
        requests: vec![INFO_BLOCK_SIZE],
    });
    let mut out = IHAVEOPT.to_be_bytes().to_vec();
    out.extend_from_slice(&OPT_GO.to_be_bytes());
    out.extend_from_slice(&(go.len() as u32).to_be_bytes());
    out.extend_from_slice(&go);
    let data: Vec<u8> = (0..8192u32).map(|i| (i * 7) as u8).collect();
    for (kind, cookie, len, payload) in [
        (CMD_WRITE, 1u64, 8192u32, &data[..]),
        (CMD_FLUSH, 2, 0, &[][..]),
    ] {
        out.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
        out.extend_from_slice(&0u16.to_be_bytes());
        out.extend_from_slice(&kind.to_be_bytes());
        out.extend_from_slice(&cookie.to_be_bytes());
        out.extend_from_slice(&(if kind == CMD_FLUSH { 0u64 } else { 4096 }).to_be_bytes());
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(payload);
    }
    s.write_all(&out).unwrap();
    loop {
        let (kind, _) = read_option_reply(&mut s, OPT_GO);
        if kind == REP_ACK {
            break;
        }
        assert_eq!(kind, REP_INFO);
    }
    let mut c = Client::from_stream(s, false, SIZE);
    let mut got = [c.reply(0), c.reply(0)];
    got.sort();
    assert_eq!(got, [(1, 0, vec![]), (2, 0, vec![])]);
    assert_eq!(c.read(4096, 8192).unwrap(), data);
}

/// The backend's count of WRITEs received and not finished (`Backend::queued_writes`,
/// which tells sbod's parity arrays that a stream's next request is here): a write is
/// counted from its header on, its payload still to come, and no longer once its
/// connection dropped it; a write done meanwhile saw both.
#[test]
fn queued_writes_count_from_the_header_until_done() {
    let limits = Limits {
        io_timeout: Duration::from_secs(30),
        ..Limits::default()
    };
    let backend = Arc::new(MemBackend::new(SIZE));
    let srv = TestServer::start_limited(vec![("mem", backend.clone())], limits, None);
    let mut bad = Client::connect(&srv.sock, false);
    let mut hdr = Vec::new();
    hdr.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
    hdr.extend_from_slice(&0u16.to_be_bytes());
    hdr.extend_from_slice(&CMD_WRITE.to_be_bytes());
    hdr.extend_from_slice(&7u64.to_be_bytes());
    hdr.extend_from_slice(&(8u64 << 20).to_be_bytes());
    hdr.extend_from_slice(&(1u32 << 20).to_be_bytes());
    bad.s.write_all(&hdr).unwrap();
    bad.s.write_all(&[0xEEu8; 4096]).unwrap();
    eventually("the write is counted before its payload is in", || {
        backend.queued.load(Relaxed) == 1
    });
    let mut good = Client::connect(&srv.sock, true);
    let c = good.send(CMD_WRITE, 0, 0, 4096, &[5u8; 4096]);
    let (cookie, err, _) = good.reply(0);
    assert_eq!((cookie, err), (c, 0));
    assert_eq!(backend.most_queued_seen.load(Relaxed), 2);
    assert_eq!(
        backend.queued.load(Relaxed),
        1,
        "the answered write still counted"
    );
    drop(bad);
    eventually("the dropped write is no longer counted", || {
        backend.queued.load(Relaxed) == 0
    });
    assert_eq!(good.read(8 << 20, 4096).unwrap(), vec![0u8; 4096]);
    good.disconnect();
}
