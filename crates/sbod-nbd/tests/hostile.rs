//! Bad input: garbage, truncated handshakes, bad options, oversize payloads, unknown
//! commands, out-of-range requests, clients vanishing mid-payload. Each gets the error the
//! spec prescribes, or its own connection closed; a well-behaved client doing verified I/O
//! keeps working throughout, and nothing of the export is harmed.

use crate::common;
use common::*;
use sbod_nbd::proto::*;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

const SIZE: u64 = 16 << 20;

/// A client doing write/read-verify in a loop until told to stop; counts round trips.
fn good_client(
    sock: std::path::PathBuf,
    stop: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut c = Client::connect(&sock, true);
        let mut i = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let off = (i % 1024) * 4096;
            let data: Vec<u8> = (0..8192).map(|j| (i as usize * 7 + j) as u8).collect();
            assert_eq!(c.write(off, &data, i.is_multiple_of(3)), 0);
            assert_eq!(
                c.read(off, 8192).unwrap(),
                data,
                "good client read back wrong data"
            );
            i += 1;
            done.fetch_add(1, Ordering::Relaxed);
        }
        c.disconnect();
    })
}

fn expect_closed(s: &mut UnixStream) {
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    let mut b = [0u8; 64];
    loop {
        match s.read(&mut b) {
            Ok(0) => return,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return,
            Err(e) => panic!("server neither answered nor closed: {e}"),
        }
    }
}

#[test]
fn hostile_clients_do_not_disturb_others() {
    let srv = TestServer::start(SIZE);
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let good = good_client(srv.sock.clone(), stop.clone(), done.clone());

    // Raw garbage instead of client flags and options.
    for seed in 0..20u8 {
        let mut s = UnixStream::connect(&srv.sock).unwrap();
        let junk: Vec<u8> = (0..200)
            .map(|i| (i as u8).wrapping_mul(seed).wrapping_add(seed))
            .collect();
        let _ = s.write_all(&junk);
        expect_closed(&mut s);
    }
    // Truncated handshakes: every prefix of a valid one, then hang up.
    let mut valid = (FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES)
        .to_be_bytes()
        .to_vec();
    valid.extend_from_slice(&IHAVEOPT.to_be_bytes());
    valid.extend_from_slice(&OPT_GO.to_be_bytes());
    let go = encode_info_request(&InfoRequest {
        name: "mem".into(),
        requests: vec![INFO_BLOCK_SIZE],
    });
    valid.extend_from_slice(&(go.len() as u32).to_be_bytes());
    valid.extend_from_slice(&go);
    for cut in 0..valid.len() {
        let mut s = UnixStream::connect(&srv.sock).unwrap();
        let _ = s.write_all(&valid[..cut]);
        drop(s);
    }
    // Unknown option: ERR_UNSUP, and the session goes on.
    let mut s = UnixStream::connect(&srv.sock).unwrap();
    greet(&mut s);
    send_option(&mut s, 4242, b"xyz");
    assert_eq!(read_option_reply(&mut s, 4242).0, REP_ERR_UNSUP);
    // Malformed GO data: ERR_INVALID; unknown export: ERR_UNKNOWN.
    send_option(&mut s, OPT_GO, &[0, 0, 0, 50, 1, 2]);
    assert_eq!(read_option_reply(&mut s, OPT_GO).0, REP_ERR_INVALID);
    send_option(
        &mut s,
        OPT_INFO,
        &encode_info_request(&InfoRequest {
            name: "nope".into(),
            requests: vec![],
        }),
    );
    assert_eq!(read_option_reply(&mut s, OPT_INFO).0, REP_ERR_UNKNOWN);
    // LIST with data is invalid; without, it lists the export.
    send_option(&mut s, OPT_LIST, b"x");
    assert_eq!(read_option_reply(&mut s, OPT_LIST).0, REP_ERR_INVALID);
    send_option(&mut s, OPT_LIST, &[]);
    let (k, d) = read_option_reply(&mut s, OPT_LIST);
    assert_eq!(k, REP_SERVER);
    assert_eq!(&d[4..], b"mem");
    assert_eq!(read_option_reply(&mut s, OPT_LIST).0, REP_ACK);
    // STARTTLS is refused by policy.
    send_option(&mut s, OPT_STARTTLS, &[]);
    assert_eq!(read_option_reply(&mut s, OPT_STARTTLS).0, REP_ERR_POLICY);
    // A huge option length: refused without reading it all, or the connection closed.
    let mut v = IHAVEOPT.to_be_bytes().to_vec();
    v.extend_from_slice(&OPT_INFO.to_be_bytes());
    v.extend_from_slice(&u32::MAX.to_be_bytes());
    s.write_all(&v).unwrap();
    expect_closed(&mut s);
    // ABORT is acknowledged.
    let mut s = UnixStream::connect(&srv.sock).unwrap();
    greet(&mut s);
    send_option(&mut s, OPT_ABORT, &[]);
    assert_eq!(read_option_reply(&mut s, OPT_ABORT).0, REP_ACK);
    // EXPORT_NAME of an unknown export: the only answer is to close.
    let mut s = UnixStream::connect(&srv.sock).unwrap();
    greet(&mut s);
    send_option(&mut s, OPT_EXPORT_NAME, b"nope");
    expect_closed(&mut s);

    // Transmission-phase abuse, simple and structured replies.
    for structured in [false, true] {
        let mut c = Client::connect(&srv.sock, structured);
        assert_eq!(c.size, SIZE);
        // Beyond the end: reads EINVAL, writes ENOSPC (payload still consumed).
        assert_eq!(c.read(SIZE - 4096, 8192), Err(EINVAL));
        assert_eq!(c.read(u64::MAX - 4095, 4096), Err(EINVAL));
        assert_eq!(c.write(SIZE, &[1u8; 4096], false), ENOSPC);
        assert_eq!(c.simple(CMD_TRIM, 0, SIZE, 4096), EINVAL);
        assert_eq!(c.simple(CMD_WRITE_ZEROES, 0, SIZE - 4096, 8192), ENOSPC);
        // Misaligned after agreeing to 4 KiB blocks.
        assert_eq!(c.read(100, 4096), Err(EINVAL));
        assert_eq!(c.write(4096, &[1u8; 100], false), EINVAL);
        // Unknown command, unknown flag, flag on the wrong command.
        assert_eq!(c.simple(99, 0, 0, 0), EINVAL);
        assert_eq!(c.simple(CMD_FLUSH, 1 << 9, 0, 0), EINVAL);
        assert_eq!(c.simple(CMD_FLUSH, CMD_FLAG_FUA, 0, 0), EINVAL);
        // Oversize payload: drained and refused; the stream stays in sync.
        let big = vec![7u8; (32 << 20) + 4096];
        assert_eq!(c.write(12 << 20, &big, false), EINVAL);
        assert_eq!(c.read(12 << 20, 4096).map(|d| d.len()), Ok(4096));
        // Nothing above touched the data (the good client stays below 5 MiB).
        let snap = srv.backend.snapshot();
        let bad = snap[5 << 20..].iter().position(|&b| b != 0);
        assert!(
            bad.is_none(),
            "byte {:?} = {}",
            bad.map(|p| p + (5 << 20)),
            bad.map(|p| snap[p + (5 << 20)]).unwrap_or(0)
        );

        c.disconnect();
    }
    // A payload too big to be honest: connection dropped.
    let mut c = Client::connect(&srv.sock, false);
    c.send(CMD_WRITE, 0, 0, u32::MAX, &[]);
    expect_closed(&mut c.s);
    // Bad request magic: connection dropped.
    let mut c = Client::connect(&srv.sock, true);
    c.s.write_all(&[0xffu8; 28]).unwrap();
    expect_closed(&mut c.s);
    // Vanishing mid-payload.
    let mut c = Client::connect(&srv.sock, true);
    c.send(CMD_WRITE, 0, 8 << 20, 1 << 20, &[9u8; 1000]);
    drop(c);
    // Many requests in flight, then hang up without reading replies.
    let mut c = Client::connect(&srv.sock, true);
    for i in 0..200 {
        c.send(CMD_READ, 0, i * 4096, 4096, &[]);
    }
    drop(c);

    let before = done.load(Ordering::Relaxed);
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(
        done.load(Ordering::Relaxed) > before,
        "the good client stalled"
    );
    stop.store(true, Ordering::Relaxed);
    good.join().expect("the good client saw an error");
    assert!(srv.stats.protocol_errors.load(Ordering::Relaxed) >= 3);
    // The half-sent write at 8 MiB never reached the export.
    assert!(srv.backend.snapshot()[8 << 20..(8 << 20) + 1000]
        .iter()
        .all(|&b| b == 0));
}

#[test]
fn unsized_clients_get_read_modify_write() {
    // A client that did not ask for block sizes may send 512-byte requests.
    let srv = TestServer::start(1 << 20);
    let mut s = UnixStream::connect(&srv.sock).unwrap();
    greet(&mut s);
    send_option(&mut s, OPT_EXPORT_NAME, b"");
    let size = read_u64(&mut s);
    let _flags = read_u16(&mut s);
    assert_eq!(size, 1 << 20);
    let mut c = Client::from_stream(s, false, size);
    assert_eq!(c.write(4096 + 512, &[5u8; 512], false), 0);
    assert_eq!(c.write(4096 + 1024, &[6u8; 1024], true), 0);
    let d = c.read(4096 + 256, 2048).unwrap();
    assert!(d[..256].iter().all(|&b| b == 0));
    assert!(d[256..768].iter().all(|&b| b == 5));
    assert!(d[768..1792].iter().all(|&b| b == 6));
    assert!(d[1792..].iter().all(|&b| b == 0));
    c.disconnect();
}
