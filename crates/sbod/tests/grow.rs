//! `sbod grow` end to end: a served raid5 of four files gets a fifth while nbdcopy reads
//! and writes it; the volume keeps its bytes through the reshape, new NBD connections see
//! the new size when it ends, and a restart finds the new layout. Offline, a mirror gets a
//! third copy; bad grows are refused with nothing changed. A served raid5 lets a member go
//! (`grow --remove`), and a served raid6 gets a new chunk (`grow --chunk`). A served declustered raid6 rebuilds failed members into its spare
//! space and copies them back onto replacements (the shape-changing processes sbod runs
//! online), with the volume read back through NBD at every step.

use serde_json::Value;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

struct Env {
    dir: tempfile::TempDir,
    server: Option<Child>,
}

impl Drop for Env {
    fn drop(&mut self) {
        if let Some(mut c) = self.server.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn need(tool: &str) {
    let ok = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(ok, "{tool} is not installed: run scripts/deps.sh");
}

fn check(o: &Output, what: &str) {
    assert!(
        o.status.success(),
        "{what} failed:\n{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

impl Env {
    fn new() -> Env {
        for t in ["nbdcopy", "nbdinfo"] {
            need(t);
        }
        Env {
            dir: tempfile::tempdir().unwrap(),
            server: None,
        }
    }

    fn p(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn uri(&self) -> String {
        format!("nbd+unix:///?socket={}", self.p("nbd.sock").display())
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_sbod"));
        c.args(args)
            .current_dir(self.dir.path())
            .env("SBOD_STATE_DIR", self.p("state"));
        c
    }

    fn ok(&self, args: &[&str]) -> String {
        let o = self.cmd(args).output().unwrap();
        check(&o, &format!("sbod {args:?}"));
        String::from_utf8_lossy(&o.stdout).to_string()
    }

    fn fails(&self, args: &[&str]) -> String {
        let o = self.cmd(args).output().unwrap();
        assert!(!o.status.success(), "sbod {args:?} should have failed");
        String::from_utf8_lossy(&o.stderr).to_string()
    }

    fn status(&self, name: &str) -> Value {
        serde_json::from_str(&self.ok(&["status", name, "--json"])).unwrap()
    }

    fn serve(&mut self, name: &str) {
        let sock = format!("unix:{}", self.p("nbd.sock").display());
        let child = self
            .cmd(&["serve", name, "--nbd", &sock])
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        self.server = Some(child);
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(30) {
            if self.nbd_size().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("sbod serve did not come up");
    }

    fn nbd_size(&self) -> Option<u64> {
        let o = Command::new("nbdinfo")
            .arg("--size")
            .arg(self.uri())
            .output()
            .ok()?;
        o.status
            .success()
            .then(|| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .flatten()
    }

    fn stop(&mut self, name: &str) {
        self.ok(&["stop", name]);
        let mut c = self.server.take().expect("server running");
        let st = c.wait().unwrap();
        assert!(st.success(), "sbod serve exited with {st}");
    }

    fn nbdcopy(&self, from: &str, to: &str) {
        let o = Command::new("nbdcopy").args([from, to]).output().unwrap();
        check(&o, &format!("nbdcopy {from} {to}"));
    }

    /// The volume's bytes now.
    fn volume(&self) -> Vec<u8> {
        let out = self.p("read.img");
        let _ = std::fs::remove_file(&out);
        self.nbdcopy(&self.uri(), &out.display().to_string());
        std::fs::read(out).unwrap()
    }
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[test]
fn a_served_raid5_grows_a_member_while_clients_read_and_write() {
    let mut e = Env::new();
    e.ok(&[
        "create",
        "vol0",
        "--level",
        "raid5",
        "--size-each",
        "24M",
        "d0.img",
        "d1.img",
        "d2.img",
        "d3.img",
    ]);
    e.serve("vol0");
    let small = e.nbd_size().unwrap();
    let data = pattern(small as usize, 7);
    std::fs::write(e.p("src.img"), &data).unwrap();
    e.nbdcopy(&e.p("src.img").display().to_string(), &e.uri());

    // Slow enough that clients work while it runs.
    e.ok(&["set", "vol0", "--rebuild-max-rate", "16M"]);
    let out = e.ok(&["grow", "vol0", "--add", "d4.img", "--size", "24M"]);
    assert!(
        out.contains("reshaping to raid5 in 1 group(s) of 5"),
        "{out}"
    );
    let st = e.status("vol0");
    assert_eq!(st["state"], "reshaping", "{st}");
    assert_eq!(st["process"]["kind"], "reshape", "{st}");
    // Clients during the reshape: the whole volume reads back, a new write lands.
    assert!(e.volume() == data, "the volume changed during the reshape");
    let mut data = data;
    let patch = pattern(3 << 20, 8);
    let at = (small as usize / 2) & !4095;
    data[at..at + patch.len()].copy_from_slice(&patch);
    std::fs::write(e.p("src.img"), &data).unwrap();
    e.nbdcopy(&e.p("src.img").display().to_string(), &e.uri());

    let st = e.settled("vol0", "the reshape did not end");
    assert_eq!(st["width"], 5, "{st}");
    let big = st["size"].as_u64().unwrap();
    assert_eq!(big, small / 3 * 4, "raid5 of 5 holds 4/3 of raid5 of 4");
    // A new connection sees the new size; the old bytes are where they were, the new
    // space reads as zeros.
    assert_eq!(e.nbd_size(), Some(big));
    let now = e.volume();
    assert!(now[..data.len()] == data[..], "the volume's bytes moved");
    assert!(
        now[data.len()..].iter().all(|&b| b == 0),
        "the new space is not zeros"
    );
    let last = e.status("vol0")["last_process"].clone();
    assert_eq!(last["kind"], "reshape", "{last}");
    assert!(last["error"].is_null(), "{last}");

    // A restart finds the new layout.
    e.stop("vol0");
    e.serve("vol0");
    assert_eq!(e.nbd_size(), Some(big));
    assert!(e.volume()[..data.len()] == data[..]);
    let out = e.ok(&["scrub", "vol0", "--json"]);
    let s: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(s["mismatches"], 0, "{s}");
    e.stop("vol0");
}

#[test]
fn offline_a_mirror_gets_a_third_copy_and_bad_grows_change_nothing() {
    let e = Env::new();
    e.ok(&[
        "create",
        "m",
        "--level",
        "raid1",
        "--size-each",
        "16M",
        "a.img",
        "b.img",
    ]);
    let out = e.ok(&["grow", "m", "--add", "c.img", "--size", "16M"]);
    assert!(out.contains("raid1 in 1 group(s) of 3"), "{out}");
    let st = e.status("m");
    assert_eq!(st["width"], 3, "{st}");
    let states: Vec<&str> = st["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["active", "active", "active"], "{st}");

    // A raid5 that cannot take two devices in one group of three... it can; but a
    // device of another array and a device given with --drop on a raid5 are refused.
    e.ok(&[
        "create",
        "r",
        "--level",
        "raid5",
        "--size-each",
        "16M",
        "r0.img",
        "r1.img",
        "r2.img",
    ]);
    let before = e.status("r");
    let err = e.fails(&["grow", "r", "--add", "a.img"]);
    assert!(err.contains("a.img"), "{err}");
    let err = e.fails(&["grow", "r", "--drop", "r0.img"]);
    assert!(err.contains("restriped") || err.contains("raid1"), "{err}");
    let err = e.fails(&["grow", "r"]);
    assert!(err.contains("--add") && err.contains("--drop"), "{err}");
    let after = e.status("r");
    assert_eq!(before["width"], after["width"]);
    assert_eq!(before["size"], after["size"]);
}

/// A served raid5 becomes a raid6 with one more file (nothing moves: the new parity is
/// rebuilt onto it), then its files are made longer and `--size max` uses the space:
/// the volume keeps its bytes, new connections see the new size, the new space reads as
/// zeros, and a scrub after a restart finds the parity right.
#[test]
fn a_served_raid5_becomes_raid6_and_grows_into_longer_files() {
    let mut e = Env::new();
    e.ok(&[
        "create",
        "lv",
        "--level",
        "raid5",
        "--size-each",
        "16M",
        "l0.img",
        "l1.img",
        "l2.img",
    ]);
    e.serve("lv");
    let small = e.nbd_size().unwrap();
    let data = pattern(small as usize, 11);
    std::fs::write(e.p("src.img"), &data).unwrap();
    e.nbdcopy(&e.p("src.img").display().to_string(), &e.uri());

    let err = e.fails(&[
        "grow", "lv", "--level", "raid10", "--add", "l3.img", "--size", "16M",
    ]);
    assert!(err.contains("only to raid6"), "{err}");
    let out = e.ok(&[
        "grow", "lv", "--level", "raid6", "--add", "l3.img", "--size", "16M", "--wait",
    ]);
    assert!(out.contains("raid6 in 1 group(s) of 4"), "{out}");
    let st = e.status("lv");
    assert_eq!(
        (st["level"].as_str(), st["width"].as_u64()),
        (Some("raid6"), Some(4)),
        "{st}"
    );
    assert_eq!(st["state"], "optimal", "{st}");
    assert!(e.volume() == data, "the level change moved bytes");

    // Longer files, then `--size max`.
    for f in ["l0.img", "l1.img", "l2.img", "l3.img"] {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(e.p(f))
            .unwrap();
        file.set_len(24 << 20).unwrap();
    }
    let err = e.fails(&["grow", "lv", "--size", "max", "--add", "x.img"]);
    assert!(err.contains("leave --add out"), "{err}");
    let out = e.ok(&["grow", "lv", "--size", "max"]);
    assert!(out.contains("now") && out.contains("was"), "{out}");
    let big = e.status("lv")["size"].as_u64().unwrap();
    assert!(big > small, "{small} -> {big}");
    assert_eq!(e.nbd_size(), Some(big));
    let now = e.volume();
    assert!(now[..data.len()] == data[..], "the volume's bytes moved");
    assert!(
        now[data.len()..].iter().all(|&b| b == 0),
        "the new space is not zeros"
    );
    let err = e.fails(&["grow", "lv", "--size", "max"]);
    assert!(err.contains("already uses"), "{err}");

    e.stop("lv");
    e.serve("lv");
    assert_eq!(e.nbd_size(), Some(big));
    let out = e.ok(&["scrub", "lv", "--json"]);
    let s: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(s["mismatches"], 0, "{s}");
    e.stop("lv");
}

#[test]
fn a_served_raid5_lets_a_member_go_and_restarts_without_it() {
    let mut e = Env::new();
    e.ok(&[
        "create",
        "nv",
        "--level",
        "raid5",
        "--size-each",
        "16M",
        "v0.img",
        "v1.img",
        "v2.img",
        "v3.img",
        "v4.img",
    ]);
    e.serve("nv");
    let big = e.nbd_size().unwrap();
    // Data past the new size: refused by name (saying the new size), nothing changes.
    let mut data = pattern(big as usize, 5);
    std::fs::write(e.p("src.img"), &data).unwrap();
    e.nbdcopy(&e.p("src.img").display().to_string(), &e.uri());
    let err = e.fails(&["grow", "nv", "--remove", "v4.img"]);
    assert!(err.contains("holds data at byte"), "{err}");
    let small: u64 = err
        .split("would shrink to ")
        .nth(1)
        .and_then(|t| t.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("the new size in {err}"));
    // Four members' data of five, less the rows kept for the reshape's backup area.
    assert!(
        small < big / 4 * 3 && small > big / 4 * 3 - (16 << 20),
        "{small}"
    );
    let err = e.fails(&["grow", "nv", "--remove", "v1.img"]);
    assert!(
        err.contains("v4.img"),
        "the error names who can leave: {err}"
    );
    assert_eq!(e.status("nv")["width"], 5);
    // The tail emptied (zeros are not data): it goes.
    data[small as usize..].fill(0);
    std::fs::write(e.p("src.img"), &data).unwrap();
    e.nbdcopy(&e.p("src.img").display().to_string(), &e.uri());
    e.ok(&["set", "nv", "--rebuild-max-rate", "16M"]);
    let out = e.ok(&["grow", "nv", "--remove", "v4.img"]);
    assert!(
        out.contains("narrowing to raid5 in 1 group(s) of 4"),
        "{out}"
    );
    // The volume is the smaller size at once for new connections, and reads back.
    assert_eq!(e.nbd_size(), Some(small));
    assert!(e.volume()[..] == data[..small as usize]);
    let st = e.settled("nv", "the narrowing did not end");
    assert_eq!(st["width"], 4, "{st}");
    // The registration follows while it serves (a crash now must not name v4.img).
    let reg = e.p("state/arrays/nv.json");
    let t = Instant::now();
    while std::fs::read_to_string(&reg).unwrap().contains("v4.img") {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the registration still names the member let go"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(e.volume()[..] == data[..small as usize]);
    e.stop("nv");
    e.serve("nv");
    assert_eq!(e.nbd_size(), Some(small));
    assert!(e.volume()[..] == data[..small as usize]);
    let out = e.ok(&["scrub", "nv", "--json"]);
    let s: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(s["mismatches"], 0, "{s}");
    e.stop("nv");
    // The member let go is free: a new array takes it without --force.
    e.ok(&["create", "solo", "--level", "raid0", "v4.img"]);
}

#[test]
fn a_served_raid6_gets_a_new_chunk_and_its_volume_back_whole() {
    let mut e = Env::new();
    e.ok(&[
        "create",
        "cv",
        "--level",
        "raid6",
        "--chunk",
        "64K",
        "--size-each",
        "16M",
        "c0.img",
        "c1.img",
        "c2.img",
        "c3.img",
        "c4.img",
    ]);
    e.serve("cv");
    let big = e.nbd_size().unwrap();
    let mut data = pattern(big as usize, 9);
    std::fs::write(e.p("src.img"), &data).unwrap();
    e.nbdcopy(&e.p("src.img").display().to_string(), &e.uri());
    // Its last rows are the backup area while the data moves: refused while they hold
    // data, saying how much stays.
    let err = e.fails(&["grow", "cv", "--chunk", "256K"]);
    assert!(
        err.contains("holds data at byte") && err.contains("backup area"),
        "{err}"
    );
    let small: u64 = err
        .split("would shrink to ")
        .nth(1)
        .and_then(|t| t.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("the size kept in {err}"));
    assert!(small < big && small >= big / 2, "{small} of {big}");
    assert_eq!(e.status("cv")["chunk"], 64 << 10);
    // Bad chunks: refused by name.
    let err = e.fails(&["grow", "cv", "--chunk", "100K"]);
    assert!(err.contains("power of two"), "{err}");
    let err = e.fails(&["grow", "cv", "--chunk", "64K"]);
    assert!(err.contains("already"), "{err}");
    data[small as usize..].fill(0);
    std::fs::write(e.p("src.img"), &data).unwrap();
    e.nbdcopy(&e.p("src.img").display().to_string(), &e.uri());
    e.ok(&["set", "cv", "--rebuild-max-rate", "32M"]);
    let out = e.ok(&["grow", "cv", "--chunk", "256K"]);
    assert!(out.contains("restriping to a chunk of 256"), "{out}");
    // While it moves: the smaller size, the bytes read back.
    assert_eq!(e.nbd_size(), Some(small));
    assert!(e.volume()[..] == data[..small as usize]);
    let st = e.settled("cv", "the new chunk did not end");
    assert_eq!(st["chunk"], 256 << 10, "{st}");
    // Back to its size; the rows that held the windows read as zeros.
    assert_eq!(e.nbd_size(), Some(big));
    assert!(e.volume()[..] == data[..]);
    e.stop("cv");
    e.serve("cv");
    assert_eq!(e.status("cv")["chunk"], 256 << 10);
    assert!(e.volume()[..] == data[..]);
    let out = e.ok(&["scrub", "cv", "--json"]);
    let s: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(s["mismatches"], 0, "{s}");
    e.stop("cv");
}

impl Env {
    /// Wait until the array is optimal with no process running.
    fn settled(&self, name: &str, what: &str) -> Value {
        let t = Instant::now();
        loop {
            let st = self.status(name);
            let busy = st["process"]
                .as_object()
                .is_some_and(|p| p.get("finished") != Some(&Value::Bool(true)));
            if st["state"] == "optimal" && !busy {
                return st;
            }
            assert!(t.elapsed() < Duration::from_secs(120), "{what}: {st}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

#[test]
fn a_served_declustered_raid6_rebuilds_into_its_spare_space_and_copies_back() {
    let mut e = Env::new();
    let members: Vec<String> = (0..8).map(|i| format!("m{i}.img")).collect();
    let mut args = vec![
        "create",
        "dv",
        "--level",
        "raid6",
        "--groups",
        "1",
        "--spares",
        "2",
        "--declustered",
        "--size-each",
        "16M",
    ];
    args.extend(members.iter().map(|s| s.as_str()));
    e.ok(&args);
    e.serve("dv");
    let size = e.nbd_size().unwrap();
    let data = pattern(size as usize, 13);
    std::fs::write(e.p("src.img"), &data).unwrap();
    e.nbdcopy(&e.p("src.img").display().to_string(), &e.uri());
    // Two failures: each rebuilt into the spare space of the others, no disk added, back
    // to full redundancy (optimal) while serving.
    for m in ["m3.img", "m5.img"] {
        e.ok(&["fail", "dv", m]);
        e.settled("dv", &format!("the distributed rebuild after {m} failed"));
        assert!(
            e.volume() == data,
            "the volume changed after {m} was rebuilt into the spare space"
        );
    }
    // A third finds the spare space full: degraded, and said.
    e.ok(&["fail", "dv", "m6.img"]);
    let st = e.status("dv");
    assert_eq!(st["state"], "degraded", "{st}");
    assert!(st.to_string().contains("spare space is full"), "{st}");
    assert!(e.volume() == data, "the volume changed, degraded");
    // Replacements: the degraded slot is rebuilt, then the spared ones are copied back
    // (the one spared last first).
    for (old, new) in [
        ("m6.img", "r6.img"),
        ("m5.img", "r5.img"),
        ("m3.img", "r3.img"),
    ] {
        e.ok(&["replace", "dv", old, new, "--size", "16M", "--wait"]);
        e.settled("dv", &format!("{new} replacing {old}"));
        assert!(
            e.volume() == data,
            "the volume changed after {new} replaced {old}"
        );
    }
    let st = e.status("dv");
    assert!(
        st["members"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["state"] == "active"),
        "{st}"
    );
    e.stop("dv");
    e.serve("dv");
    assert!(e.volume() == data, "the volume changed across a restart");
    let out = e.ok(&["scrub", "dv", "--json"]);
    let s: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(s["mismatches"], 0, "{s}");
    e.stop("dv");
}
