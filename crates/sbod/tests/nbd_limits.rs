//! Memory of an NBD server under attack: 60 connections each send a 32 MiB WRITE header and
//! 8 MiB of its payload, then stall. `sbod export` (the same server as `sbod serve`) holds
//! at most its in-flight budget of payload: its resident memory, read from
//! /proc/PID/status, grows by less than the budget plus slack. Control: with a budget
//! large enough for all of them the same attack grows it by several hundred MiB, so the
//! attack is real and the measure sees it.

mod common;
use common::*;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const MIB: u64 = 1 << 20;
const ATTACKERS: usize = 60;
const SENT: usize = 8 << 20;

fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/PID/status")
}

/// Handshake by hand (fixed newstyle, EXPORT_NAME): the attackers are raw sockets.
fn attacker(sock: &Path, name: &str) -> UnixStream {
    let mut s = UnixStream::connect(sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut g = [0u8; 18];
    s.read_exact(&mut g).unwrap();
    s.write_all(&3u32.to_be_bytes()).unwrap(); // FIXED_NEWSTYLE | NO_ZEROES
    let mut o = 0x4948_4156_454F_5054u64.to_be_bytes().to_vec(); // IHAVEOPT
    o.extend_from_slice(&1u32.to_be_bytes()); // EXPORT_NAME
    o.extend_from_slice(&(name.len() as u32).to_be_bytes());
    o.extend_from_slice(name.as_bytes());
    s.write_all(&o).unwrap();
    let mut info = [0u8; 10];
    s.read_exact(&mut info).unwrap();
    s
}

/// Serve a 128 MiB file with this budget, attack it, and return the growth of its RSS (KiB).
fn growth_under_attack(budget: &str) -> u64 {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("disk.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(128 * MIB)
        .unwrap();
    let sock = dir.path().join("nbd.sock");
    let mut procs = Procs::default();
    procs.spawn(
        "export",
        Command::new(env!("CARGO_BIN_EXE_sbod"))
            .args(["export", img.to_str().unwrap(), "--nbd"])
            .arg(format!("unix:{}", sock.display()))
            .args(["--nbd-inflight", budget, "--nbd-io-timeout", "600"])
            .env("SBOD_STATE_DIR", dir.path().join("state")),
    );
    let pid = procs.0[0].1.id();
    wait_nbd(
        &format!("nbd+unix:///disk.img?socket={}", sock.display()),
        Duration::from_secs(30),
    );
    let conns: Vec<UnixStream> = (0..ATTACKERS)
        .map(|_| attacker(&sock, "disk.img"))
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let before = rss_kib(pid);
    // Each sends its header and as much of 8 MiB as the server takes (it stops reading a
    // connection that waits for budget: then the write times out and the attacker stalls).
    let threads: Vec<_> = conns
        .into_iter()
        .enumerate()
        .map(|(i, mut s)| {
            std::thread::spawn(move || {
                s.set_write_timeout(Some(Duration::from_secs(3))).unwrap();
                let mut h = 0x2560_9513u32.to_be_bytes().to_vec();
                h.extend_from_slice(&0u16.to_be_bytes());
                h.extend_from_slice(&1u16.to_be_bytes()); // WRITE
                h.extend_from_slice(&(i as u64).to_be_bytes());
                h.extend_from_slice(&0u64.to_be_bytes());
                h.extend_from_slice(&(32u32 << 20).to_be_bytes());
                s.write_all(&h).unwrap();
                let chunk = vec![0xA5u8; 256 << 10];
                let mut sent = 0;
                while sent < SENT {
                    match s.write(&chunk) {
                        Ok(n) => sent += n,
                        Err(_) => break,
                    }
                }
                s
            })
        })
        .collect();
    let held: Vec<UnixStream> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    // Let the server take in what it will.
    std::thread::sleep(Duration::from_secs(2));
    let after = rss_kib(pid);
    drop(held);
    procs.term("export");
    eprintln!(
        "budget {budget}: RSS {} MiB -> {} MiB",
        before / 1024,
        after / 1024
    );
    after.saturating_sub(before)
}

#[test]
fn memory_stays_within_the_budget_under_huge_stalled_writes() {
    need("nbdinfo");
    // 64 MiB budget: two of the 60 may hold their payload.
    let grown = growth_under_attack("64M");
    let bound = (64 + 48) * 1024;
    assert!(
        grown < bound,
        "the server grew by {} MiB under the attack, over its 64 MiB budget + 48 MiB slack",
        grown / 1024
    );
    // Control: a budget that admits everyone, and the same attack grows it past the bound.
    let unbounded = growth_under_attack("4G");
    assert!(
        unbounded > 3 * bound,
        "the attack grew the server by only {} MiB with a 4G budget: it is not exercised",
        unbounded / 1024
    );
}

/// The limits reach the server from the command line and the environment: a budget below
/// the largest request is refused with the reason; SBOD_NBD_MAX_CONNECTIONS=1 makes a
/// second connection refused with the server's reason, and served once the first closes.
#[test]
fn limits_are_set_by_flags_and_environment() {
    need("nbdinfo");
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("disk.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(16 * MIB)
        .unwrap();
    let sbod = || {
        let mut c = Command::new(env!("CARGO_BIN_EXE_sbod"));
        c.env("SBOD_STATE_DIR", dir.path().join("state"));
        c
    };
    let sock = dir.path().join("nbd.sock");
    let o = sbod()
        .args([
            "export",
            img.to_str().unwrap(),
            "--nbd-inflight",
            "1M",
            "--nbd",
        ])
        .arg(format!("unix:{}", sock.display()))
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("--nbd-inflight") && err.contains("at least 32M"),
        "{err}"
    );

    let mut procs = Procs::default();
    procs.spawn(
        "export",
        sbod()
            .args(["export", img.to_str().unwrap(), "--nbd"])
            .arg(format!("unix:{}", sock.display()))
            .env("SBOD_NBD_MAX_CONNECTIONS", "1"),
    );
    let uri = format!("nbd+unix:///disk.img?socket={}", sock.display());
    wait_nbd(&uri, Duration::from_secs(30));
    let first = attacker(&sock, "disk.img");
    let o = Command::new("nbdinfo")
        .args(["--size", &uri])
        .env("LIBNBD_DEBUG", "1")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success(),
        "a second connection was served over a limit of 1"
    );
    assert!(err.contains("connection limit (1) is reached"), "{err}");
    drop(first);
    wait_nbd(&uri, Duration::from_secs(30));
    procs.term("export");
}
