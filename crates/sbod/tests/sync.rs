//! Sync modes and log devices end to end: the CLI, `sbod serve` on real files, and a real
//! NBD client (nbdsh, libnbd) sending writes with FUA and FLUSHes.

mod common;

use common::*;
use serde_json::Value;
use std::fs::File;
use std::process::{Command, Stdio};
use std::time::Duration;

fn nbdsh(uri: &str, py: &str) -> String {
    // nbdsh runs `python3` from PATH; Debian's python3-libnbd lives with /usr/bin/python3.
    let path = format!("/usr/bin:{}", std::env::var("PATH").unwrap_or_default());
    run(Command::new("nbdsh")
        .env("PATH", path)
        .args(["-u", uri, "-c", py]))
}

/// `sbod serve` with its stderr kept in `log`, to read what it said at the start.
fn serve_logged(sb: &Sbod, procs: &mut Procs, name: &str, log: &str) -> String {
    let sock = sb.dir.join(format!("{name}.sock"));
    let listen = format!("unix:{}", sock.display());
    let err = File::create(sb.dir.join(log)).unwrap();
    let child = sb
        .cmd(&["serve", name, "--nbd", &listen])
        .stdout(Stdio::null())
        .stderr(err)
        .spawn()
        .unwrap();
    procs.0.push(("head".into(), child));
    let uri = format!("nbd+unix:///?socket={}", sock.display());
    wait_nbd(&uri, Duration::from_secs(30));
    uri
}

fn sync_of(s: &Value) -> &Value {
    &s["sync"]
}

/// Writes with FUA and FLUSHes from a real client; returns the bytes it wrote at 0.
fn client_writes(uri: &str, byte: u8, flushes: usize) -> Vec<u8> {
    nbdsh(
        uri,
        &format!(
            "for i in range({flushes}):\n  h.pwrite(bytes([{byte}]) * 65536, i * 65536, nbd.CMD_FLAG_FUA)\n  h.flush()\n"
        ),
    );
    vec![byte; flushes * 65536]
}

fn read_back(uri: &str, len: usize) -> Vec<u8> {
    let out = nbdsh(
        uri,
        &format!("import sys; sys.stdout.buffer.write(h.pread({len}, 0))"),
    );
    out.into_bytes()
}

#[test]
fn sync_modes_through_a_real_client() {
    for t in ["nbdsh", "nbdinfo"] {
        need(t);
    }
    let dir = tempfile::tempdir().unwrap();
    let sb = Sbod::new(dir.path());
    // A mode that does not exist is refused, and nothing is created.
    let e = sb.fails(&[
        "create",
        "bad",
        "--level",
        "raid5",
        "--size-each",
        "40M",
        "--sync",
        "sometimes",
        "b0.img",
        "b1.img",
        "b2.img",
    ]);
    assert!(e.contains("standard") && e.contains("disabled"), "{e}");
    assert!(!dir.path().join("b0.img").exists());

    let out = sb.ok(&[
        "create",
        "vol0",
        "--level",
        "raid5",
        "--size-each",
        "40M",
        "--sync",
        "disabled",
        "d0.img",
        "d1.img",
        "d2.img",
    ]);
    assert!(out.contains("sync=disabled"), "{out}");
    let s = sb.status("vol0");
    assert_eq!(sync_of(&s)["mode"], "disabled", "{s:#}");
    let text = sb.ok(&["status", "vol0"]);
    assert!(text.contains("sync: disabled"), "{text}");
    assert!(
        sb.ok(&["examine", "d0.img"])
            .contains("sync       disabled"),
        "the mode is on the members"
    );

    // Served: the warning at the start, FLUSH and FUA acknowledged at once.
    let mut procs = Procs::default();
    let uri = serve_logged(&sb, &mut procs, "vol0", "serve1.log");
    let said = std::fs::read_to_string(dir.path().join("serve1.log")).unwrap();
    assert!(
        said.contains("WARNING: sync=disabled") && said.contains("power cut loses"),
        "no warning at the start: {said}"
    );
    let mut want = client_writes(&uri, 0x11, 4);
    let s = sb.status("vol0");
    let y = sync_of(&s);
    assert_eq!(y["client_flushes"], 4, "{s:#}");
    assert_eq!(y["flushes_acknowledged_at_once"], 4, "{s:#}");
    assert_eq!(y["fua_dropped"], 4, "{s:#}");

    // Changed while served: every write is FUA, every FLUSH goes to the members.
    let reply: Value = serde_json::from_str(&sb.ok(&["set", "vol0", "--sync", "always"])).unwrap();
    assert_eq!(reply["sync"], "always", "{reply:#}");
    assert!(reply["rebuild_min_rate"].is_u64(), "{reply:#}");
    nbdsh(
        &uri,
        "h.pwrite(bytes([0x22]) * 65536, 65536)\nh.pwrite(bytes([0x22]) * 65536, 131072)\nh.flush()",
    );
    want[65536..196608].fill(0x22);
    let s = sb.status("vol0");
    let y = sync_of(&s);
    assert_eq!(y["mode"], "always");
    assert_eq!(y["fua_added"], 2, "{s:#}");
    assert_eq!(y["flushes_acknowledged_at_once"], 4, "{s:#}");
    assert_eq!(read_back(&uri, want.len()).len(), want.len());
    assert!(
        read_back(&uri, want.len()) == want,
        "the client reads back what it wrote"
    );
    sb.ok(&["stop", "vol0"]);
    procs.term("head");

    // Stopped: the mode is on the members, and can be changed there.
    assert_eq!(sync_of(&sb.status("vol0"))["mode"], "always");
    let reply: Value =
        serde_json::from_str(&sb.ok(&["set", "vol0", "--sync", "standard"])).unwrap();
    assert_eq!(reply["sync"], "standard");
    assert_eq!(sync_of(&sb.status("vol0"))["mode"], "standard");
    let e = sb.fails(&["set", "vol0", "--rebuild-min-rate", "1M"]);
    assert!(e.contains("not running") && e.contains("--sync"), "{e}");
    let e = sb.fails(&["set", "vol0"]);
    assert!(e.contains("nothing to set"), "{e}");
    let e = sb.fails(&["set", "vol0", "--sync", "often"]);
    assert!(e.contains("standard"), "{e}");

    // Every start says it again.
    sb.ok(&["set", "vol0", "--sync", "disabled"]);
    let uri = serve_logged(&sb, &mut procs, "vol0", "serve2.log");
    let said = std::fs::read_to_string(dir.path().join("serve2.log")).unwrap();
    assert!(said.contains("WARNING: sync=disabled"), "{said}");
    assert!(read_back(&uri, want.len()) == want);
    sb.ok(&["stop", "vol0"]);
    procs.term("head");
    let said = std::fs::read_to_string(dir.path().join("serve2.log")).unwrap();
    assert_eq!(said.matches("WARNING: sync=disabled").count(), 1, "{said}");
}

#[test]
fn log_devices_through_the_cli() {
    for t in ["nbdsh", "nbdinfo"] {
        need(t);
    }
    let dir = tempfile::tempdir().unwrap();
    let sb = Sbod::new(dir.path());
    for (f, size) in [
        ("log0.img", 8u64 << 20),
        ("log1.img", 8 << 20),
        ("tiny.img", 64 << 10),
    ] {
        File::create(dir.path().join(f))
            .unwrap()
            .set_len(size)
            .unwrap();
    }
    let members = ["d0.img", "d1.img", "d2.img", "d3.img"];
    let create = |extra: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = ["create", "vol0", "--level", "raid5", "--size-each", "40M"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        v.extend(extra.iter().map(|s| s.to_string()));
        v.extend(members.iter().map(|s| s.to_string()));
        v
    };
    let strs = |v: &[String]| -> Vec<String> { v.to_vec() };
    // Bad log devices are refused before anything is created.
    for (extra, says) in [
        (vec!["--log", "nowhere.img"], "nowhere.img"),
        (vec!["--log", "d1.img"], "given twice"),
        (
            vec![
                "--log", "log0.img", "--log", "log1.img", "--log", "log0.img",
            ],
            "mirrored",
        ),
        (vec!["--log", "tiny.img"], "too small"),
    ] {
        let a = strs(&create(&extra));
        let a: Vec<&str> = a.iter().map(|s| s.as_str()).collect();
        let e = sb.fails(&a);
        assert!(e.contains(says), "{extra:?}: {e}");
        assert!(
            !dir.path().join("d0.img").exists(),
            "{extra:?} left members"
        );
        assert!(sb.fails(&["status", "vol0"]).contains("no array"));
    }
    let a = strs(&create(&["--log", "log0.img"]));
    let a: Vec<&str> = a.iter().map(|s| s.as_str()).collect();
    let out = sb.ok(&a);
    assert!(out.contains("log: optimal, one device"), "{out}");
    let s = sb.status("vol0");
    assert_eq!(s["log"]["state"], "optimal", "{s:#}");
    assert_eq!(s["log"]["devices"].as_array().unwrap().len(), 1);
    assert_eq!(s["log"]["journaling"], true);
    assert!(sb.ok(&["examine", "d2.img"]).contains("log        "));

    // Mirrored while served; clients write as ever.
    let mut procs = Procs::default();
    let uri = sb.serve(&mut procs, "vol0");
    let out = sb.ok(&["add", "vol0", "--log", "log1.img"]);
    assert!(out.contains("as a log device"), "{out}");
    let s = sb.status("vol0");
    assert_eq!(s["log"]["devices"].as_array().unwrap().len(), 2, "{s:#}");
    assert!(s["log"]["capacity"].as_u64().unwrap() > 0, "{s:#}");
    let e = sb.fails(&["add", "vol0", "--log", "tiny.img"]);
    assert!(e.contains("mirrored log"), "{e}");
    let want = client_writes(&uri, 0x33, 3);
    sb.ok(&["stop", "vol0"]);
    procs.term("head");

    // The log goes with the members: found again at assembly from the registry, and by
    // `assemble` among the devices given.
    let s = sb.status("vol0");
    assert_eq!(s["log"]["devices"].as_array().unwrap().len(), 2, "{s:#}");
    sb.ok(&["forget", "vol0"]);
    let mut a = vec!["assemble".to_string()];
    a.extend(members.iter().map(|s| s.to_string()));
    a.push("log1.img".into());
    a.push("log0.img".into());
    let a: Vec<&str> = a.iter().map(|s| s.as_str()).collect();
    let out = sb.ok(&a);
    assert!(out.contains("assembled vol0"), "{out}");
    let s = sb.status("vol0");
    assert_eq!(s["log"]["state"], "optimal", "{s:#}");
    let uri = sb.serve(&mut procs, "vol0");
    assert!(read_back(&uri, want.len()) == want);
    // One device out: the log runs on the other; the last one takes the log with it.
    sb.ok(&["remove", "vol0", "log1.img"]);
    let s = sb.status("vol0");
    assert_eq!(s["log"]["devices"].as_array().unwrap().len(), 1, "{s:#}");
    sb.ok(&["remove", "vol0", "log0.img"]);
    let s = sb.status("vol0");
    assert!(s["log"].is_null(), "{s:#}");
    sb.ok(&["stop", "vol0"]);
    procs.term("head");
    assert!(sb.status("vol0")["log"].is_null());
    // A removed log device is wiped: no longer this array's, and blank again.
    let e = sb.fails(&["remove", "vol0", "log0.img"]);
    assert!(e.contains("not a failed member"), "{e}");
    sb.ok(&["add", "vol0", "--log", "log0.img"]);
    assert_eq!(sb.status("vol0")["log"]["state"], "optimal");
    // Another array's log device is refused without --force.
    File::create(dir.path().join("log2.img"))
        .unwrap()
        .set_len(8 << 20)
        .unwrap();
    sb.ok(&[
        "create",
        "vol1",
        "--level",
        "raid1",
        "--size-each",
        "40M",
        "--log",
        "log2.img",
        "e0.img",
        "e1.img",
    ]);
    let e = sb.fails(&["add", "vol0", "--log", "log2.img"]);
    assert!(e.contains("another array") && e.contains("--force"), "{e}");
    let s = sb.status("vol0");
    assert_eq!(s["log"]["devices"].as_array().unwrap().len(), 1, "{s:#}");
}

/// The newest valid-looking record headers of the log file's session, in sequence order:
/// (ring offset, header length, total length), those with a payload only. Parsed here
/// from the format (crates/sbod-core/src/log/format.rs) to damage one, as a disk would.
fn log_records(img: &[u8]) -> Vec<(usize, usize, usize)> {
    let u64at = |b: &[u8], i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
    let u32at = |b: &[u8], i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap()) as usize;
    // The newer superblock copy: generation at 52, nonce at 60, tail sequence at 68.
    let sb = [&img[..4096], &img[4096..8192]]
        .into_iter()
        .filter(|c| &c[..8] == b"SBODlog\x01")
        .max_by_key(|c| u64at(c, 52))
        .expect("a log superblock");
    let (nonce, tail) = (u64at(sb, 60), u64at(sb, 68));
    let ring = 64 << 10;
    let mut v = Vec::new();
    for pos in (ring..img.len()).step_by(4096) {
        let h = &img[pos..];
        if &h[..8] == b"SBODrec\x01"
            && u64at(h, 16) == nonce
            && u64at(h, 24) >= tail
            && u64at(h, 32) as usize == pos - ring
        {
            let (hl, total) = (u32at(h, 12), u64at(h, 40) as usize);
            if total > hl {
                v.push((u64at(h, 24), pos - ring, hl, total));
            }
        }
    }
    v.sort();
    v.into_iter().map(|(_, o, h, t)| (o, h, t)).collect()
}

/// Issue 25, end to end: raid5 of 4 with one log file, 10 rounds over 16 regions of
/// 64 KiB through a real NBD client, each round flushed; the server SIGKILLed after a
/// later unflushed write elsewhere; one bit flipped in the payload of a record a third of
/// the way into the log; restart. Every region reads round 10 (before the fix: round 4),
/// the unflushed write is there, and status says what the replay found.
#[test]
fn a_flipped_bit_in_the_log_never_reverts_flushed_data() {
    for t in ["nbdsh", "nbdinfo"] {
        need(t);
    }
    let dir = tempfile::tempdir().unwrap();
    let sb = Sbod::new(dir.path());
    // Large enough that no checkpoint passes the ten rounds (the report replayed 58).
    File::create(dir.path().join("log.img"))
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    sb.ok(&[
        "create",
        "vol0",
        "--level",
        "raid5",
        "--size-each",
        "40M",
        "--log",
        "log.img",
        "d0.img",
        "d1.img",
        "d2.img",
        "d3.img",
    ]);
    let mut procs = Procs::default();
    let uri = serve_logged(&sb, &mut procs, "vol0", "serve1.log");
    nbdsh(
        &uri,
        "for r in range(1, 11):\n  for s in range(16):\n    h.pwrite(bytes([r * 16 + s]) * 65536, s * 65536)\n  h.flush()\nh.pwrite(bytes([0xee]) * 65536, 4 << 20)\n",
    );
    procs.kill("head");
    let path = dir.path().join("log.img");
    let mut img = std::fs::read(&path).unwrap();
    let recs = log_records(&img);
    assert!(recs.len() >= 30, "only {} records in the log", recs.len());
    let (off, hl, total) = recs[recs.len() / 3];
    let p = (64 << 10) + off + hl + (total - hl) / 2 + 123;
    img[p] ^= 0x10;
    std::fs::write(&path, &img).unwrap();
    let uri = serve_logged(&sb, &mut procs, "vol0", "serve2.log");
    let said = std::fs::read_to_string(dir.path().join("serve2.log")).unwrap();
    // Each region's first byte where it is not round 10's throughout (printed as text:
    // the bytes are above 127).
    let wrong = nbdsh(
        &uri,
        "print([(s, h.pread(65536, s * 65536)[0]) for s in range(16) if h.pread(65536, s * 65536) != bytes([160 + s]) * 65536])",
    );
    assert_eq!(
        wrong.trim(),
        "[]",
        "regions that do not read round 10 (region, first byte); the start said: {said}"
    );
    let far = nbdsh(
        &uri,
        "print(h.pread(65536, 4 << 20) == bytes([0xee]) * 65536)",
    );
    assert_eq!(far.trim(), "True", "the unflushed write is lost");
    let s = sb.status("vol0");
    let issues = s["log"]["replay_issues"].as_array().expect("replay issues");
    assert_eq!(issues.len(), 1, "{s:#}");
    assert_eq!(issues[0]["lost"], false, "{s:#}");
    assert!(
        said.contains(&format!("log record {}", issues[0]["seq"])),
        "the start does not say what it found: {said}"
    );
    sb.ok(&["stop", "vol0"]);
    procs.term("head");
}
