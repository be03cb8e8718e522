//! Block status (`base:allocation`), extended headers, CACHE and fast zero: through the
//! real clients (nbdinfo --map, nbdsh, qemu-img map, nbdcopy) and byte by byte, including
//! malformed meta-context options and block-status requests, after which the server
//! keeps serving.

use crate::common;
use common::*;
use sbod_nbd::proto::*;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::process::Command;

fn run(cmd: &mut Command) -> String {
    let o = cmd.output().expect("spawn client");
    assert!(
        o.status.success(),
        "{cmd:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).to_string()
}

/// nbdsh with Debian's python3-libnbd (it lives with /usr/bin/python3).
fn nbdsh(script: &str) -> String {
    need("nbdsh");
    let path = format!("/usr/bin:{}", std::env::var("PATH").unwrap_or_default());
    run(Command::new("nbdsh")
        .env("PATH", path)
        .arg("-c")
        .arg(script))
}

const MIB: u64 = 1 << 20;

/// A 64 MiB export with data at 1 MiB (64 KiB), 10 MiB (4 KiB) and its last 4 KiB.
fn with_data() -> TestServer {
    let srv = TestServer::start(64 * MIB);
    let mut c = Client::connect(&srv.sock, true);
    assert_eq!(c.write(MIB, &vec![7u8; 65536], false), 0);
    assert_eq!(c.write(10 * MIB, &[1u8; 4096], false), 0);
    assert_eq!(c.write(64 * MIB - 4096, &[2u8; 4096], true), 0);
    c.disconnect();
    srv
}

/// nbdinfo --map's lines as (offset, length, type).
fn map_of(uri: &str) -> Vec<(u64, u64, u32)> {
    need("nbdinfo");
    let out = run(Command::new("nbdinfo").arg("--map").arg(uri));
    out.lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (
                f[0].parse().unwrap(),
                f[1].parse().unwrap(),
                f[2].parse().unwrap(),
            )
        })
        .collect()
}

#[test]
fn nbdinfo_map_shows_holes_and_data() {
    let srv = with_data();
    let m = map_of(&srv.uri());
    let expect = vec![
        (0, MIB, 3),
        (MIB, 65536, 0),
        (MIB + 65536, 9 * MIB - 65536, 3),
        (10 * MIB, 4096, 0),
        (10 * MIB + 4096, 54 * MIB - 8192, 3),
        (64 * MIB - 4096, 4096, 0),
    ];
    assert_eq!(m, expect);
}

#[test]
fn qemu_img_map_shows_holes_and_data() {
    need("qemu-img");
    let srv = with_data();
    let out = run(Command::new("qemu-img").args(["map", "--output=json", "-f", "raw", &srv.uri()]));
    // One line per extent: "data": false and "zero": true for the holes.
    let lines: Vec<&str> = out.lines().filter(|l| l.contains("\"start\"")).collect();
    let data: Vec<u64> = lines
        .iter()
        .filter(|l| l.contains("\"data\": true"))
        .map(|l| {
            let i = l.find("\"start\": ").unwrap() + 9;
            l[i..].split(',').next().unwrap().trim().parse().unwrap()
        })
        .collect();
    assert_eq!(data, vec![MIB, 10 * MIB, 64 * MIB - 4096], "{out}");
    assert!(
        lines
            .iter()
            .filter(|l| l.contains("\"data\": false"))
            .all(|l| l.contains("\"zero\": true")),
        "{out}"
    );
}

#[test]
fn nbdcopy_copies_only_the_data() {
    need("nbdcopy");
    let srv = with_data();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("copy.img");
    run(Command::new("nbdcopy").arg(srv.uri()).arg(&out));
    let got = std::fs::read(&out).unwrap();
    assert!(got == srv.backend.snapshot(), "the copy differs");
    // Only the 72 KiB of data was read from the server, not 64 MiB.
    let read = srv
        .stats
        .read_bytes
        .load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        read <= 4 * MIB,
        "nbdcopy read {read} bytes of a 72 KiB volume"
    );
    // And the destination is sparse where the source is.
    use std::os::unix::fs::MetadataExt;
    let allocated = std::fs::metadata(&out).unwrap().blocks() * 512;
    assert!(allocated < 4 * MIB, "the copy allocates {allocated} bytes");
    // --no-extents: the peer, every byte read.
    let srv2 = with_data();
    let full = dir.path().join("full.img");
    run(Command::new("nbdcopy")
        .arg("--no-extents")
        .arg(srv2.uri())
        .arg(&full));
    let read = srv2
        .stats
        .read_bytes
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(read, 64 * MIB);
}

#[test]
fn libnbd_block_status_cache_fast_zero_and_kernel_habits() {
    let srv = with_data();
    let script = format!(
        r#"
import errno
h.add_meta_context("base:allocation")
h.connect_uri("{uri}")
assert h.can_meta_context("base:allocation")
assert h.can_cache() and h.can_fast_zero()
got = []
def f(ctx, off, ents, err):
    assert ctx == "base:allocation"
    got.append((off, list(ents)))
    return 0
h.block_status(16 << 20, 0, f)
assert got == [(0, [1 << 20, 3, 65536, 0, (9 << 20) - 65536, 3, 4096, 0, (6 << 20) - 4096, 3])], got
# REQ_ONE: one extent, within the request.
got.clear()
h.block_status(8 << 20, 4096, f, nbd.CMD_FLAG_REQ_ONE)
assert got == [(4096, [(1 << 20) - 4096, 3])], got
h.cache(1 << 20, 0)
h.zero(65536, 1 << 20, nbd.CMD_FLAG_FAST_ZERO)
assert h.pread(65536, 1 << 20) == b"\0" * 65536
h.shutdown()

# The kernel's habits: no structured replies, so no meta context; reads, writes,
# trims and zeroes as ever.
h = nbd.NBD()
h.set_request_structured_replies(False)
h.add_meta_context("base:allocation")
h.connect_uri("{uri}")
assert not h.get_structured_replies_negotiated()
assert not h.can_meta_context("base:allocation")
h.pwrite(b"k" * 4096, 20 << 20)
assert h.pread(4096, 20 << 20) == b"k" * 4096
h.trim(4096, 20 << 20)
h.zero(4096, (20 << 20) + 4096)
assert h.pread(8192, 20 << 20) == b"\0" * 8192
h.set_strict_mode(0)
try:
    h.block_status(4096, 0, f)
    raise SystemExit("block status without a meta context succeeded")
except nbd.Error as e:
    pass
assert h.pread(4096, 10 << 20) == b"\1" * 4096
h.shutdown()
"#,
        uri = srv.uri()
    );
    nbdsh(&script);
}

// ---------------------------------------------------------------- byte by byte

/// Negotiate extended headers (and `base:allocation`), then GO.
fn connect_extended(srv: &TestServer, meta: bool) -> (UnixStream, u16) {
    let mut s = UnixStream::connect(&srv.sock).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(20)))
        .unwrap();
    greet(&mut s);
    send_option(&mut s, OPT_EXTENDED_HEADERS, &[]);
    assert_eq!(read_option_reply(&mut s, OPT_EXTENDED_HEADERS).0, REP_ACK);
    if meta {
        let q = encode_meta_request(&MetaRequest {
            name: "mem".into(),
            queries: vec!["base:allocation".into(), "x-unknown:thing".into()],
        });
        send_option(&mut s, OPT_SET_META_CONTEXT, &q);
        let (k, d) = read_option_reply(&mut s, OPT_SET_META_CONTEXT);
        assert_eq!(k, REP_META_CONTEXT);
        assert_eq!(&d[4..], b"base:allocation");
        assert_eq!(read_option_reply(&mut s, OPT_SET_META_CONTEXT).0, REP_ACK);
    }
    let req = encode_info_request(&InfoRequest {
        name: "mem".into(),
        requests: vec![INFO_BLOCK_SIZE],
    });
    send_option(&mut s, OPT_GO, &req);
    let mut flags = 0;
    loop {
        let (kind, d) = read_option_reply(&mut s, OPT_GO);
        match kind {
            REP_INFO if u16::from_be_bytes([d[0], d[1]]) == INFO_EXPORT => {
                flags = u16::from_be_bytes([d[10], d[11]]);
            }
            REP_INFO => {}
            REP_ACK => break,
            k => panic!("GO failed: {k:#x}"),
        }
    }
    (s, flags)
}

fn send_ext(s: &mut UnixStream, kind: u16, flags: u16, cookie: u64, offset: u64, length: u64) {
    let r = Request {
        flags,
        kind,
        cookie,
        offset,
        length,
    };
    s.write_all(&encode_extended_request(&r)).unwrap();
}

/// One extended reply chunk: (flags, type, cookie, offset, payload).
fn read_ext(s: &mut UnixStream) -> (u16, u16, u64, u64, Vec<u8>) {
    assert_eq!(read_u32(s), EXTENDED_REPLY_MAGIC, "not an extended reply");
    let flags = read_u16(s);
    let kind = read_u16(s);
    let cookie = read_u64(s);
    let offset = read_u64(s);
    let len = read_u64(s);
    assert!(len < 64 << 20);
    let mut d = vec![0u8; len as usize];
    s.read_exact(&mut d).unwrap();
    (flags, kind, cookie, offset, d)
}

fn error_of(kind: u16, d: &[u8]) -> u32 {
    if kind == REPLY_TYPE_NONE {
        return 0;
    }
    assert_eq!(kind, REPLY_TYPE_ERROR, "unexpected chunk type {kind}");
    u32::from_be_bytes(d[0..4].try_into().unwrap())
}

#[test]
fn extended_headers_byte_by_byte() {
    let srv = with_data();
    let (mut s, flags) = connect_extended(&srv, true);
    assert!(flags & TF_SEND_FAST_ZERO != 0 && flags & TF_SEND_CACHE != 0);
    // A write (payload flag), its read back: every reply extended, offsets echoed.
    let mut v = encode_extended_request(&Request {
        flags: CMD_FLAG_PAYLOAD_LEN,
        kind: CMD_WRITE,
        cookie: 1,
        offset: 2 * MIB,
        length: 8192,
    })
    .to_vec();
    v.extend_from_slice(&[9u8; 8192]);
    s.write_all(&v).unwrap();
    let (f, k, c, o, d) = read_ext(&mut s);
    assert_eq!(
        (f & REPLY_FLAG_DONE, c, o, error_of(k, &d)),
        (1, 1, 2 * MIB, 0)
    );
    send_ext(&mut s, CMD_READ, 0, 2, 2 * MIB, 8192);
    let (_, k, c, o, d) = read_ext(&mut s);
    assert_eq!((k, c, o), (REPLY_TYPE_OFFSET_DATA, 2, 2 * MIB));
    assert_eq!(u64::from_be_bytes(d[0..8].try_into().unwrap()), 2 * MIB);
    assert!(d[8..].iter().all(|&b| b == 9) && d.len() == 8 + 8192);
    // Block status of the whole export with a 64-bit-wide answer.
    send_ext(&mut s, CMD_BLOCK_STATUS, 0, 3, 0, 64 * MIB);
    let (_, k, c, _, d) = read_ext(&mut s);
    assert_eq!((k, c), (REPLY_TYPE_BLOCK_STATUS_EXT, 3));
    assert_eq!(
        u32::from_be_bytes(d[0..4].try_into().unwrap()),
        META_ID_ALLOCATION
    );
    let n = u32::from_be_bytes(d[4..8].try_into().unwrap()) as usize;
    assert_eq!(d.len(), 8 + 16 * n);
    let ext: Vec<(u64, u64)> = (0..n)
        .map(|i| {
            let at = 8 + 16 * i;
            (
                u64::from_be_bytes(d[at..at + 8].try_into().unwrap()),
                u64::from_be_bytes(d[at + 8..at + 16].try_into().unwrap()),
            )
        })
        .collect();
    assert_eq!(ext.iter().map(|e| e.0).sum::<u64>(), 64 * MIB);
    assert_eq!(ext[0], (MIB, 3));
    assert_eq!(ext[1], (65536, 0));
    assert_eq!(ext[3], (8192, 0), "{ext:?}");
    // Fast zero (the in-memory export says yes), CACHE.
    send_ext(
        &mut s,
        CMD_WRITE_ZEROES,
        CMD_FLAG_FAST_ZERO,
        4,
        2 * MIB,
        4096,
    );
    let (_, k, _, _, d) = read_ext(&mut s);
    assert_eq!(error_of(k, &d), 0);
    send_ext(&mut s, CMD_CACHE, 0, 5, 0, 64 * MIB);
    let (_, k, _, _, d) = read_ext(&mut s);
    assert_eq!(error_of(k, &d), 0);
    // A trim of more than 4 GiB is an effect length: beyond this export, EINVAL.
    send_ext(&mut s, CMD_TRIM, 0, 6, 0, 5 << 30);
    let (_, k, _, _, d) = read_ext(&mut s);
    assert_eq!(error_of(k, &d), EINVAL);
    // A payload where the command takes none: consumed, EINVAL, and the stream stays in
    // step.
    let mut v = encode_extended_request(&Request {
        flags: CMD_FLAG_PAYLOAD_LEN,
        kind: CMD_BLOCK_STATUS,
        cookie: 7,
        offset: 0,
        length: 12,
    })
    .to_vec();
    v.extend_from_slice(&[0u8; 12]);
    s.write_all(&v).unwrap();
    let (_, k, c, _, d) = read_ext(&mut s);
    assert_eq!((c, error_of(k, &d)), (7, EINVAL));
    // A write without the payload flag: EINVAL, nothing to consume.
    send_ext(&mut s, CMD_WRITE, 0, 8, 0, 4096);
    let (_, k, c, _, d) = read_ext(&mut s);
    assert_eq!((c, error_of(k, &d)), (8, EINVAL));
    send_ext(&mut s, CMD_READ, 0, 9, 2 * MIB, 4096);
    let (_, k, c, _, d) = read_ext(&mut s);
    assert_eq!((k, c), (REPLY_TYPE_OFFSET_DATA, 9));
    assert!(d[8..].iter().all(|&b| b == 0));
    send_ext(&mut s, CMD_DISC, 0, 10, 0, 0);
}

#[test]
fn malformed_meta_context_options_and_block_status_are_refused_cleanly() {
    let srv = with_data();
    let mut s = UnixStream::connect(&srv.sock).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(20)))
        .unwrap();
    greet(&mut s);
    // Before structured replies: refused.
    let good = encode_meta_request(&MetaRequest {
        name: "mem".into(),
        queries: vec!["base:allocation".into()],
    });
    send_option(&mut s, OPT_SET_META_CONTEXT, &good);
    assert_eq!(
        read_option_reply(&mut s, OPT_SET_META_CONTEXT).0,
        REP_ERR_INVALID
    );
    send_option(&mut s, OPT_STRUCTURED_REPLY, &[]);
    assert_eq!(read_option_reply(&mut s, OPT_STRUCTURED_REPLY).0, REP_ACK);
    // Lengths beyond the data, counts that lie, trailing bytes, bad UTF-8, no data.
    let mut lying = good.clone();
    lying[7] = 0xff;
    let mut long = good.clone();
    long[11] = 0xff;
    let mut trailing = good.clone();
    trailing.push(1);
    let mut bad_utf8 = good.clone();
    let l = bad_utf8.len();
    bad_utf8[l - 1] = 0xff;
    for opt in [OPT_LIST_META_CONTEXT, OPT_SET_META_CONTEXT] {
        for d in [&lying, &long, &trailing, &bad_utf8, &vec![], &vec![0, 0, 0]] {
            send_option(&mut s, opt, d);
            assert_eq!(read_option_reply(&mut s, opt).0, REP_ERR_INVALID, "{d:?}");
        }
    }
    // An unknown export; LIST of everything, of `base:`; an unknown namespace selects
    // nothing.
    let q = |name: &str, qs: &[&str]| {
        encode_meta_request(&MetaRequest {
            name: name.into(),
            queries: qs.iter().map(|x| x.to_string()).collect(),
        })
    };
    send_option(
        &mut s,
        OPT_SET_META_CONTEXT,
        &q("nope", &["base:allocation"]),
    );
    assert_eq!(
        read_option_reply(&mut s, OPT_SET_META_CONTEXT).0,
        REP_ERR_UNKNOWN
    );
    for qs in [
        &[][..],
        &["base:"][..],
        &["base:allocation", "qemu:dirty-bitmap:x"][..],
    ] {
        send_option(&mut s, OPT_LIST_META_CONTEXT, &q("mem", qs));
        let (k, d) = read_option_reply(&mut s, OPT_LIST_META_CONTEXT);
        assert_eq!((k, &d[4..]), (REP_META_CONTEXT, &b"base:allocation"[..]));
        assert_eq!(read_option_reply(&mut s, OPT_LIST_META_CONTEXT).0, REP_ACK);
    }
    send_option(
        &mut s,
        OPT_SET_META_CONTEXT,
        &q("mem", &["x-other:", "base:"]),
    );
    assert_eq!(read_option_reply(&mut s, OPT_SET_META_CONTEXT).0, REP_ACK);
    // `base:` (a wildcard for LIST only) and an unknown namespace select nothing: block
    // status is refused.
    let req = encode_info_request(&InfoRequest {
        name: "mem".into(),
        requests: vec![INFO_BLOCK_SIZE],
    });
    send_option(&mut s, OPT_GO, &req);
    while read_option_reply(&mut s, OPT_GO).0 != REP_ACK {}
    let mut c = Client::from_stream(s, true, 64 * MIB);
    let bad = c.send(CMD_BLOCK_STATUS, 0, 0, 4096, &[]);
    let (cookie, err, _) = c.reply(0);
    assert_eq!((cookie, err), (bad, EINVAL));
    // The connection serves on.
    assert_eq!(c.read(MIB, 4096).unwrap(), vec![7u8; 4096]);

    // With the context: out of range, zero length, unknown flags, unaligned.
    let mut c = connect_structured_meta(&srv);
    for (flags, off, len) in [
        (0, 64 * MIB, 4096),
        (0, 0, 0),
        (CMD_FLAG_FUA, 0, 4096),
        (1 << 9, 0, 4096),
        (0, 100, 4096),
        (0, u64::MAX - 4095, 4096),
    ] {
        let cookie = c.send(CMD_BLOCK_STATUS, flags, off, len as u32, &[]);
        let (got, err, _) = c.reply(0);
        assert_eq!(got, cookie);
        assert_eq!(err, EINVAL, "flags {flags:#x} offset {off} length {len}");
    }
    assert_eq!(c.read(MIB, 4096).unwrap(), vec![7u8; 4096]);
}

fn connect_structured_meta(srv: &TestServer) -> Client {
    let mut s = UnixStream::connect(&srv.sock).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(20)))
        .unwrap();
    greet(&mut s);
    send_option(&mut s, OPT_STRUCTURED_REPLY, &[]);
    assert_eq!(read_option_reply(&mut s, OPT_STRUCTURED_REPLY).0, REP_ACK);
    let q = encode_meta_request(&MetaRequest {
        name: "mem".into(),
        queries: vec!["base:allocation".into()],
    });
    send_option(&mut s, OPT_SET_META_CONTEXT, &q);
    assert_eq!(
        read_option_reply(&mut s, OPT_SET_META_CONTEXT).0,
        REP_META_CONTEXT
    );
    assert_eq!(read_option_reply(&mut s, OPT_SET_META_CONTEXT).0, REP_ACK);
    let req = encode_info_request(&InfoRequest {
        name: "mem".into(),
        requests: vec![INFO_BLOCK_SIZE],
    });
    send_option(&mut s, OPT_GO, &req);
    while read_option_reply(&mut s, OPT_GO).0 != REP_ACK {}
    Client::from_stream(s, true, 64 * MIB)
}
