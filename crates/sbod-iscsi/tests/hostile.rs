//! Hostile initiators: garbage, lengths over the limits, PDUs out of order (commands before
//! login, logins after it), CmdSNs outside the window, Data-Outs nobody asked for, bad
//! digests, and random mutations of valid PDUs. Each gets a clear reject (a Reject PDU, a
//! failed login with its reason, CHECK CONDITION) or its own connection closed; a
//! well-behaved initiator doing verified I/O (with header and data digests) keeps working
//! throughout, nothing it wrote is harmed, and the server never panics.

mod common;
use common::*;
use rand::{Rng, SeedableRng};
use sbod_iscsi::login::{encode_keys, parse_keys};
use sbod_iscsi::pdu::*;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A minimal initiator, written from RFC 7143 for these tests.
struct Raw {
    s: TcpStream,
    cmd_sn: u32,
    itt: u32,
    hd: bool,
    dd: bool,
    /// The ISID of its last login.
    isid: [u8; 6],
}

type P = ([u8; BHS_LEN], Vec<u8>);

impl Raw {
    fn connect(addr: SocketAddr) -> Raw {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        Raw {
            s,
            cmd_sn: 1,
            itt: 1,
            hd: false,
            dd: false,
            isid: [0; 6],
        }
    }

    fn send(&mut self, bhs: [u8; BHS_LEN], data: &[u8]) {
        let mut out = Vec::new();
        let mut b = bhs;
        set_dsl(&mut b, data.len());
        out.extend_from_slice(&b);
        if self.hd {
            out.extend_from_slice(&crc32c::crc32c(&b).to_le_bytes());
        }
        encode_data(data, self.dd, &mut out);
        let _ = self.s.write_all(&out);
    }

    /// The next PDU, or None if the connection closed (or went silent).
    fn recv(&mut self) -> Option<P> {
        let mut b = [0u8; BHS_LEN];
        self.s.read_exact(&mut b).ok()?;
        let (ahs, dsl) = lengths(&b);
        let mut skip = vec![0u8; ahs + if self.hd { 4 } else { 0 }];
        self.s.read_exact(&mut skip).ok()?;
        let mut d = vec![0u8; dsl + pad4(dsl)];
        self.s.read_exact(&mut d).ok()?;
        if self.dd && dsl > 0 {
            let mut c = [0u8; 4];
            self.s.read_exact(&mut c).ok()?;
            assert_eq!(
                u32::from_le_bytes(c),
                data_digest(&d[..dsl]),
                "bad data digest from the target"
            );
        }
        d.truncate(dsl);
        Some((b, d))
    }

    fn login_pdu(&self, keys: &[(&str, &str)]) -> P {
        let mut h = header(0x43, 0x80 | 1 << 2 | 3);
        // A fresh ISID per connection: the same one would reinstate (end) another session.
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let n = NEXT.fetch_add(1, Ordering::Relaxed) as u32;
        h[8..14].copy_from_slice(&[
            0x80,
            0,
            (n >> 24) as u8,
            (n >> 16) as u8,
            (n >> 8) as u8,
            n as u8,
        ]);
        put32(&mut h, 16, self.itt);
        put32(&mut h, 24, self.cmd_sn);
        let k: Vec<(String, String)> = keys
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        (h, encode_keys(&k))
    }

    /// Log in (operational stage straight to full feature), with or without digests.
    fn login(addr: SocketAddr, digests: bool) -> Raw {
        let mut r = Raw::connect(addr);
        let dg = if digests { "CRC32C" } else { "None" };
        let (h, d) = r.login_pdu(&[
            ("InitiatorName", "iqn.2025-01.test:raw"),
            ("SessionType", "Normal"),
            ("TargetName", IQN),
            ("HeaderDigest", dg),
            ("DataDigest", dg),
            ("ImmediateData", "Yes"),
            ("InitialR2T", "Yes"),
            ("MaxRecvDataSegmentLength", "65536"),
            ("FirstBurstLength", "65536"),
            ("MaxBurstLength", "262144"),
        ]);
        r.isid = h[8..14].try_into().unwrap();
        r.send(h, &d);
        let (b, d) = r.recv().expect("a login response");
        assert_eq!(b[0] & 0x3f, OP_LOGIN_RESP);
        assert_eq!((b[36], b[37]), (0, 0), "login failed: {:?}", parse_keys(&d));
        assert_eq!(b[1] & 0x83, 0x83, "not in full feature phase");
        let keys = parse_keys(&d).unwrap();
        assert!(
            keys.contains(&("HeaderDigest".into(), dg.into())),
            "{keys:?}"
        );
        r.hd = digests;
        r.dd = digests;
        r
    }

    fn cmd(&mut self, cdb: &[u8], write: Option<&[u8]>, read_len: u32) -> (u8, Vec<u8>, Vec<u8>) {
        self.itt += 1;
        let mut h = header(
            OP_SCSI_CMD,
            0x80 | if write.is_some() { 0x20 } else { 0x40 },
        );
        put32(&mut h, 16, self.itt);
        put32(&mut h, 20, write.map_or(read_len, |w| w.len() as u32));
        put32(&mut h, 24, self.cmd_sn);
        self.cmd_sn += 1;
        h[32..32 + cdb.len()].copy_from_slice(cdb);
        self.send(h, write.unwrap_or(&[]));
        let mut data = Vec::new();
        loop {
            let (b, d) = self.recv().expect("an answer");
            match b[0] & 0x3f {
                OP_DATA_IN => {
                    assert_eq!(be32(&b, 16), self.itt);
                    assert_eq!(
                        be32(&b, 40) as usize,
                        data.len(),
                        "Data-In offsets in order"
                    );
                    data.extend_from_slice(&d);
                    if b[1] & 0x01 != 0 {
                        return (b[3], data, Vec::new());
                    }
                }
                OP_SCSI_RESP => {
                    assert_eq!(be32(&b, 16), self.itt);
                    return (b[3], data, d);
                }
                OP_NOP_IN => continue,
                op => panic!("unexpected opcode {op:#x}"),
            }
        }
    }

    fn write10(&mut self, lba: u32, data: &[u8]) -> u8 {
        let mut cdb = [0u8; 10];
        cdb[0] = 0x2a;
        cdb[2..6].copy_from_slice(&lba.to_be_bytes());
        cdb[7..9].copy_from_slice(&((data.len() / 512) as u16).to_be_bytes());
        self.cmd(&cdb, Some(data), 0).0
    }

    fn read10(&mut self, lba: u32, blocks: u16) -> Vec<u8> {
        let mut cdb = [0u8; 10];
        cdb[0] = 0x28;
        cdb[2..6].copy_from_slice(&lba.to_be_bytes());
        cdb[7..9].copy_from_slice(&blocks.to_be_bytes());
        let (st, d, sense) = self.cmd(&cdb, None, blocks as u32 * 512);
        assert_eq!(st, 0, "READ10 failed: {sense:?}");
        d
    }

    /// A NOP-Out ping answered with its data: the connection still works.
    fn ping(&mut self) -> bool {
        self.itt += 1;
        let mut h = header(0x40 | OP_NOP_OUT, 0x80);
        put32(&mut h, 16, self.itt);
        put32(&mut h, 20, NO_TAG);
        put32(&mut h, 24, self.cmd_sn);
        self.send(h, b"ping");
        while let Some((b, d)) = self.recv() {
            if b[0] & 0x3f == OP_NOP_IN && be32(&b, 16) == self.itt {
                return d == b"ping";
            }
        }
        false
    }

    /// The connection ends (after whatever the target still says).
    fn closes(&mut self) -> bool {
        self.s
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let mut b = [0u8; 4096];
        loop {
            match self.s.read(&mut b) {
                Ok(0) => return true,
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
                Err(_) => return false,
            }
        }
    }
}

/// Writes and reads back its own region in a loop, with digests on.
fn good_initiator(
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut c = Raw::login(addr, true);
        let mut i = 0u32;
        while !stop.load(Ordering::Relaxed) {
            let lba = 1024 + (i % 64) * 16;
            let data = pattern(8192, i);
            assert_eq!(c.write10(lba, &data), 0);
            assert!(
                c.read10(lba, 16) == data,
                "the good initiator read other bytes"
            );
            i += 1;
            done.fetch_add(1, Ordering::Relaxed);
        }
    })
}

fn panics_counted() -> Arc<AtomicU64> {
    let n = Arc::new(AtomicU64::new(0));
    let n2 = n.clone();
    let prev = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |i| {
        n2.fetch_add(1, Ordering::Relaxed);
        prev(i)
    }));
    n
}

#[test]
fn hostile_initiators_do_not_disturb_others() {
    let panics = panics_counted();
    let t = start(Opts::default());
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let good = good_initiator(t.addr, stop.clone(), done.clone());

    // Garbage instead of a login.
    let mut r = Raw::connect(t.addr);
    let _ = r.s.write_all(&[0xffu8; 200]);
    assert!(r.closes(), "garbage");

    // A data segment over the limit, before login: closed, nothing allocated.
    let mut r = Raw::connect(t.addr);
    let mut h = header(0x43, 0x87);
    set_dsl(&mut h, (1 << 24) - 1);
    let _ = r.s.write_all(&h);
    assert!(r.closes(), "oversize login");

    // A SCSI command before login: the login is refused (invalid during login).
    let mut r = Raw::connect(t.addr);
    r.send(header(OP_SCSI_CMD, 0xc0), &[]);
    let (b, _) = r.recv().expect("a login reject");
    assert_eq!((b[0] & 0x3f, b[36], b[37]), (OP_LOGIN_RESP, 2, 0x0b));
    assert!(r.closes());

    // An unsupported version; a missing InitiatorName; an unknown target.
    let mut r = Raw::connect(t.addr);
    let (mut h, d) = r.login_pdu(&[("InitiatorName", "iqn.x:y"), ("TargetName", IQN)]);
    h[2] = 5;
    h[3] = 5;
    r.send(h, &d);
    assert_eq!(r.recv().map(|(b, _)| (b[36], b[37])), Some((2, 5)));
    let mut r = Raw::connect(t.addr);
    let (h, d) = r.login_pdu(&[("TargetName", IQN)]);
    r.send(h, &d);
    assert_eq!(r.recv().map(|(b, _)| (b[36], b[37])), Some((2, 7)));
    let mut r = Raw::connect(t.addr);
    let (h, d) = r.login_pdu(&[("InitiatorName", "iqn.x:y"), ("TargetName", "iqn.nope:x")]);
    r.send(h, &d);
    assert_eq!(r.recv().map(|(b, _)| (b[36], b[37])), Some((2, 3)));

    // After login: a CmdSN outside the window is ignored; the connection goes on.
    let mut r = Raw::login(t.addr, false);
    let mut h = header(OP_SCSI_CMD, 0xc0);
    put32(&mut h, 16, 999);
    put32(&mut h, 24, r.cmd_sn.wrapping_add(100_000));
    r.send(h, &[]);
    assert!(r.ping(), "after an out-of-window CmdSN");
    // A Data-Out for a task that does not exist: dropped.
    let mut h = header(OP_DATA_OUT, 0x80);
    put32(&mut h, 16, 4242);
    r.send(h, &[1; 512]);
    assert!(r.ping(), "after a stray Data-Out");
    // An unknown opcode: rejected, the connection goes on.
    r.send(header(0x1c, 0x80), &[]);
    let (b, _) = r.recv().expect("a reject");
    assert_eq!((b[0] & 0x3f, b[2]), (OP_REJECT, REJECT_NOT_SUPPORTED));
    assert!(r.ping());
    // A write announcing 4 GiB: CHECK CONDITION, nothing allocated.
    let mut cdb = [0u8; 10];
    cdb[0] = 0x2a;
    cdb[7] = 0xff;
    r.itt += 1;
    let mut h = header(OP_SCSI_CMD, 0xa0);
    put32(&mut h, 16, r.itt);
    put32(&mut h, 20, u32::MAX);
    put32(&mut h, 24, r.cmd_sn);
    r.cmd_sn += 1;
    h[32..42].copy_from_slice(&cdb);
    r.send(h, &[]);
    let (b, sense) = r.recv().expect("an answer");
    assert_eq!((b[0] & 0x3f, b[3]), (OP_SCSI_RESP, 2), "{sense:?}");
    // A write whose Data-Out comes at an offset not asked for: the command fails with
    // ABORTED COMMAND, the connection goes on.
    r.itt += 1;
    let mut h = header(OP_SCSI_CMD, 0xa0);
    cdb[7..9].copy_from_slice(&8u16.to_be_bytes());
    put32(&mut h, 16, r.itt);
    put32(&mut h, 20, 4096);
    put32(&mut h, 24, r.cmd_sn);
    r.cmd_sn += 1;
    h[32..42].copy_from_slice(&cdb);
    r.send(h, &[]);
    let (b, _) = r.recv().expect("an R2T");
    assert_eq!(b[0] & 0x3f, OP_R2T);
    let mut d = header(OP_DATA_OUT, 0x80);
    put32(&mut d, 16, r.itt);
    put32(&mut d, 20, be32(&b, 20));
    put32(&mut d, 40, 512);
    r.send(d, &[7; 512]);
    let (b, sense) = r.recv().expect("an answer");
    assert_eq!((b[0] & 0x3f, b[3]), (OP_SCSI_RESP, 2));
    assert_eq!(sense[2 + 2] & 0x0f, 0x0b, "ABORTED COMMAND");
    assert!(r.ping());
    // A login in the full feature phase: rejected and closed.
    let (h, d) = r.login_pdu(&[("InitiatorName", "iqn.x:y")]);
    r.send(h, &d);
    assert!(r.closes());

    // With digests: a bad data digest is rejected, a bad header digest closes.
    let mut r = Raw::login(t.addr, true);
    assert!(r.ping());
    let mut h = header(0x40 | OP_NOP_OUT, 0x80);
    put32(&mut h, 16, 77);
    put32(&mut h, 20, NO_TAG);
    set_dsl(&mut h, 4);
    let mut raw = h.to_vec();
    raw.extend_from_slice(&crc32c::crc32c(&h).to_le_bytes());
    raw.extend_from_slice(b"ping");
    raw.extend_from_slice(&[0, 0, 0, 0]);
    let _ = r.s.write_all(&raw);
    let (b, _) = r.recv().expect("a reject");
    assert_eq!((b[0] & 0x3f, b[2]), (OP_REJECT, REJECT_DIGEST));
    assert!(r.ping());
    let mut raw = header(0x40 | OP_NOP_OUT, 0x80).to_vec();
    raw.extend_from_slice(&[0, 0, 0, 0]);
    let _ = r.s.write_all(&raw);
    assert!(r.closes(), "bad header digest");

    // A PDU cut short, then silence: closed by the io timeout at worst; here we leave.
    let mut r = Raw::login(t.addr, false);
    let _ = r.s.write_all(&header(OP_SCSI_CMD, 0x80)[..20]);
    drop(r);

    // Random mutations of valid PDUs, each on a fresh logged-in connection.
    let rounds: usize = std::env::var("SBOD_ISCSI_FUZZ_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(150);
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x15c5);
    for round in 0..rounds {
        let login_first = rng.random_bool(0.8);
        let mut r = if login_first {
            Raw::login(t.addr, rng.random_bool(0.3))
        } else {
            Raw::connect(t.addr)
        };
        r.s.set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        for _ in 0..rng.random_range(1..6) {
            let op = [
                OP_NOP_OUT,
                OP_SCSI_CMD,
                OP_TMF_REQ,
                OP_LOGIN_REQ,
                OP_TEXT_REQ,
                OP_DATA_OUT,
                OP_LOGOUT_REQ,
                OP_SNACK,
            ][rng.random_range(0..8)];
            let mut h = header(op, 0x80);
            put32(&mut h, 16, rng.random_range(0..8));
            put32(&mut h, 20, rng.random_range(0..16384));
            put32(&mut h, 24, r.cmd_sn);
            h[32] = [0x28, 0x2a, 0x12, 0x89, 0x42, 0x5f, 0x93, 0xa3][rng.random_range(0..8)];
            let n = rng.random_range(0..6);
            for _ in 0..n {
                let at = rng.random_range(0..BHS_LEN);
                h[at] = rng.random();
            }
            let len = if rng.random_bool(0.5) {
                0
            } else {
                rng.random_range(0..4096)
            };
            let data: Vec<u8> = (0..len).map(|_| rng.random()).collect();
            // Lengths as mutated, or as sent: the target must cope with both.
            let mut raw = h.to_vec();
            if rng.random_bool(0.7) {
                set_dsl(&mut h, data.len());
                raw = h.to_vec();
            }
            if r.hd {
                raw.extend_from_slice(&crc32c::crc32c(&raw[..BHS_LEN]).to_le_bytes());
            }
            raw.extend_from_slice(&data);
            if r.s.write_all(&raw).is_err() {
                break;
            }
        }
        let mut sink = [0u8; 65536];
        while let Ok(n) = r.s.read(&mut sink) {
            if n == 0 {
                break;
            }
        }
        assert_eq!(
            panics.load(Ordering::Relaxed),
            0,
            "round {round}: the server panicked"
        );
    }

    let before = done.load(Ordering::Relaxed);
    // The good initiator kept going through all of it, and still does.
    let t0 = std::time::Instant::now();
    while done.load(Ordering::Relaxed) < before + 10 && t0.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(10));
    }
    stop.store(true, Ordering::Relaxed);
    good.join().expect("the good initiator failed");
    assert!(
        done.load(Ordering::Relaxed) >= before + 10,
        "the good initiator stalled"
    );
    assert_eq!(panics.load(Ordering::Relaxed), 0, "the server panicked");
    assert!(t.stats.protocol_errors.load(Ordering::Relaxed) > 5);
    // libiscsi still gets in and reads.
    need("iscsi-inq", "libiscsi-bin");
    ok(std::process::Command::new("iscsi-inq").arg(t.url()));
}

#[test]
fn connections_beyond_the_limit_are_told_why() {
    let t = start(Opts {
        limits: sbod_iscsi::Limits {
            max_per_client: 2,
            ..Default::default()
        },
        ..Default::default()
    });
    let a = Raw::login(t.addr, false);
    let b = Raw::login(t.addr, false);
    let mut c = Raw::connect(t.addr);
    let (h, d) = c.login_pdu(&[("InitiatorName", "iqn.x:y"), ("TargetName", IQN)]);
    c.send(h, &d);
    let (b3, _) = c.recv().expect("a login response");
    // Class 3 (target error), 0x06: out of resources.
    assert_eq!((b3[36], b3[37]), (3, 6));
    drop((a, b));
    // Places free again once those close.
    let t0 = std::time::Instant::now();
    loop {
        let mut r = Raw::connect(t.addr);
        let (h, d) = r.login_pdu(&[("InitiatorName", "iqn.x:y"), ("TargetName", IQN)]);
        r.send(h, &d);
        if r.recv().is_some_and(|(b, _)| b[36] == 0) {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "places never freed");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Writes waiting for their data hold the payload budget; more commands than the budget
/// allows must not stop the reader from taking that data (it would wait for itself): they
/// wait aside and run as the budget comes back.
#[test]
fn commands_beyond_the_budget_wait_without_stalling_the_connection() {
    let t = start(Opts {
        limits: sbod_iscsi::Limits {
            // The least allowed: one 16 MiB data-out, or two 8 MiB writes.
            inflight_bytes: 16 << 20,
            ..Default::default()
        },
        ..Default::default()
    });
    let mut r = Raw::login(t.addr, false);
    let mut writes = std::collections::HashMap::new();
    let cmd_for = |r: &mut Raw, lba: u32, len: usize, write: bool| -> u32 {
        r.itt += 1;
        let mut cdb = [0u8; 10];
        cdb[0] = if write { 0x2a } else { 0x28 };
        cdb[2..6].copy_from_slice(&lba.to_be_bytes());
        cdb[7..9].copy_from_slice(&((len / 512) as u16).to_be_bytes());
        let mut h = header(OP_SCSI_CMD, 0x80 | if write { 0x20 } else { 0x40 });
        put32(&mut h, 16, r.itt);
        put32(&mut h, 20, len as u32);
        put32(&mut h, 24, r.cmd_sn);
        r.cmd_sn += 1;
        h[32..42].copy_from_slice(&cdb);
        r.send(h, &[]);
        r.itt
    };
    let len = 8 << 20;
    for (i, lba) in [0u32, 16384, 32768].iter().enumerate() {
        let itt = cmd_for(&mut r, *lba, len, true);
        writes.insert(itt, pattern(len, i as u32 + 10));
    }
    let read_itt = cmd_for(&mut r, 0, 65536, false);
    // Answer every R2T; collect the answers.
    let mut answered = std::collections::HashMap::new();
    let mut read = Vec::new();
    while answered.len() < 4 {
        let (b, d) = r.recv().expect("the target stalled");
        let itt = be32(&b, 16);
        match b[0] & 0x3f {
            OP_R2T => {
                let (ttt, off, want) = (be32(&b, 20), be32(&b, 40) as usize, be32(&b, 44) as usize);
                let data = &writes[&itt];
                let mut at = off;
                let mut sn = 0;
                while at < off + want {
                    let n = (off + want - at).min(65536);
                    let mut h = header(OP_DATA_OUT, if at + n == off + want { 0x80 } else { 0 });
                    put32(&mut h, 16, itt);
                    put32(&mut h, 20, ttt);
                    put32(&mut h, 36, sn);
                    put32(&mut h, 40, at as u32);
                    r.send(h, &data[at..at + n]);
                    at += n;
                    sn += 1;
                }
            }
            OP_DATA_IN => {
                read.extend_from_slice(&d);
                if b[1] & 1 != 0 {
                    answered.insert(itt, b[3]);
                }
            }
            OP_SCSI_RESP => {
                answered.insert(itt, b[3]);
            }
            op => panic!("unexpected {op:#x}"),
        }
    }
    assert!(answered.values().all(|&s| s == 0), "{answered:?}");
    assert!(answered.contains_key(&read_itt));
    let snap = t.backend.snapshot();
    for (i, lba) in [0usize, 16384, 32768].iter().enumerate() {
        assert!(
            snap[lba * 512..lba * 512 + len] == pattern(len, i as u32 + 10)[..],
            "write {i}"
        );
    }
    assert!(r.ping());
}

/// An idle connection is pinged (NOP-In, no task); answered, it stays; silent, it is closed.
/// A second login by the same initiator and ISID reinstates the session: the old connection
/// is closed.
#[test]
fn keep_alive_and_session_reinstatement() {
    let t = start(Opts {
        limits: sbod_iscsi::Limits {
            nop_interval: Duration::from_millis(300),
            ..Default::default()
        },
        ..Default::default()
    });
    let mut r = Raw::login(t.addr, false);
    let (b, _) = r.recv().expect("a NOP-In ping");
    assert_eq!((b[0] & 0x3f, be32(&b, 16)), (OP_NOP_IN, NO_TAG));
    // Answer it (NOP-Out with its transfer tag, no task tag).
    let mut h = header(0x40 | OP_NOP_OUT, 0x80);
    put32(&mut h, 16, NO_TAG);
    put32(&mut h, 20, be32(&b, 20));
    put32(&mut h, 24, r.cmd_sn);
    r.send(h, &[]);
    assert!(r.ping(), "answered, the connection stays");
    // Silent: pinged, then closed.
    assert!(r.closes(), "a silent initiator is closed");

    let mut a = Raw::login(t.addr, false);
    assert!(a.ping());
    // The same initiator name and ISID as a's.
    let mut b2 = Raw::connect(t.addr);
    let (mut h, d) = b2.login_pdu(&[
        ("InitiatorName", "iqn.2025-01.test:raw"),
        ("SessionType", "Normal"),
        ("TargetName", IQN),
    ]);
    h[8..14].copy_from_slice(&a.isid);
    b2.send(h, &d);
    let (resp, _) = b2.recv().expect("a login response");
    assert_eq!(resp[36], 0, "the reinstating login succeeds");
    assert!(a.closes(), "the old session's connection is closed");
}

#[test]
fn listening_beyond_loopback_needs_allow_remote() {
    assert!(sbod_iscsi::parse_listen("127.0.0.1:3260", false).is_ok());
    assert!(sbod_iscsi::parse_listen("[::1]:3260", false).is_ok());
    let e = sbod_iscsi::parse_listen("0.0.0.0:3260", false).unwrap_err();
    assert!(e.contains("--allow-remote"), "{e}");
    assert!(sbod_iscsi::parse_listen("0.0.0.0:3260", true).is_ok());
    assert!(sbod_iscsi::parse_listen("nonsense", true).is_err());
}

/// A connection that never logs in does not hold up a shutdown.
#[test]
fn shutdown_does_not_wait_for_a_silent_login() {
    // A login deadline of an hour: a shutdown that waited for it could not finish in the
    // bound below (a liveness bound, far from any scheduling noise).
    let t = start(Opts {
        limits: sbod_iscsi::Limits {
            login_timeout: Duration::from_secs(3600),
            ..Default::default()
        },
        ..Default::default()
    });
    let _silent = TcpStream::connect(t.addr).unwrap();
    let mut r = Raw::login(t.addr, false);
    assert!(r.ping());
    let t0 = std::time::Instant::now();
    drop(t); // stops the server and joins its thread
    assert!(
        t0.elapsed() < Duration::from_secs(600),
        "shutdown waited for the login"
    );
    assert!(r.closes());
}
