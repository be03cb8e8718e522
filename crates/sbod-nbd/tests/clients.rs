//! The server with the real clients from Debian's packages: nbdinfo, nbdsh (libnbd's
//! Python bindings), nbdcopy, fio's nbd engine and qemu-img.

use crate::common;
use common::*;
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

#[test]
fn nbdinfo_sees_the_truth() {
    need("nbdinfo");
    let srv = TestServer::start(64 << 20);
    let out = run(Command::new("nbdinfo").arg("--json").arg(srv.uri()));
    let j: serde_like::Json = serde_like::parse(&out);
    assert_eq!(j.num("export-size"), 64 << 20);
    assert_eq!(j.num("block_size_minimum"), 4096);
    assert_eq!(j.num("block_size_maximum"), 32 << 20);
    for f in [
        "can_flush",
        "can_fua",
        "can_trim",
        "can_zero",
        "can_multi_conn",
    ] {
        assert!(j.bool(f), "{f} should be advertised");
    }
    assert!(!j.bool("is_read_only"));
    assert!(
        out.contains("\"structured\"") || out.contains("structured"),
        "{out}"
    );
    let list = run(Command::new("nbdinfo")
        .arg("--list")
        .arg(format!("nbd+unix:///?socket={}", srv.sock.display())));
    assert!(list.contains("export=\"mem\""), "{list}");
}

#[test]
fn nbdsh_exercises_every_command_both_reply_kinds() {
    need("nbdsh");
    let srv = TestServer::start(8 << 20);
    for structured in ["True", "False"] {
        let script = format!(
            r#"
import errno
# Let requests through to the server: it, not libnbd, must refuse bad ones.
h.set_strict_mode(0)
h.set_request_structured_replies({structured})
h.connect_uri("{uri}")
assert h.get_structured_replies_negotiated() == {structured}
size = h.get_size()
h.pwrite(b"a" * 8192, 4096, nbd.CMD_FLAG_FUA)
assert h.pread(8192, 4096) == b"a" * 8192
h.flush()
h.zero(4096, 8192)
assert h.pread(4096, 8192) == b"\0" * 4096
h.pwrite(b"b" * 4096, 0)
h.trim(4096, 0)
assert h.pread(4096, 0) == b"\0" * 4096
for bad in [lambda: h.pread(4096, size), lambda: h.pread(8192, size - 4096)]:
    try:
        bad()
        raise SystemExit("out-of-range read succeeded")
    except nbd.Error as e:
        assert e.errnum == errno.EINVAL, e
try:
    h.pwrite(b"c" * 4096, size)
    raise SystemExit("out-of-range write succeeded")
except nbd.Error as e:
    assert e.errnum in (errno.ENOSPC, errno.EINVAL), e
h.shutdown()
"#,
            uri = srv.uri()
        );
        // nbdsh runs `python3` from PATH; Debian's python3-libnbd lives with /usr/bin/python3.
        let path = format!("/usr/bin:{}", std::env::var("PATH").unwrap_or_default());
        run(Command::new("nbdsh")
            .env("PATH", path)
            .arg("-c")
            .arg(script));
    }
}

#[test]
fn nbdcopy_fio_and_qemu_img_move_real_data() {
    for t in ["nbdcopy", "fio", "qemu-img"] {
        need(t);
    }
    let srv = TestServer::start(64 << 20);
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src.img");
    let data: Vec<u8> = (0..(64u32 << 20))
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    std::fs::write(&src, &data).unwrap();
    run(Command::new("nbdcopy").arg(&src).arg(srv.uri()));
    assert!(srv.backend.snapshot() == data, "nbdcopy in: data differs");
    let back = dir.path().join("back.img");
    run(Command::new("nbdcopy").arg(srv.uri()).arg(&back));
    assert!(
        std::fs::read(&back).unwrap() == data,
        "nbdcopy out: data differs"
    );
    // fio: random writes with many in flight and several jobs, verified.
    let out = run(Command::new("fio").args([
        "--name=verify",
        "--ioengine=nbd",
        &format!("--uri={}", srv.uri()),
        "--rw=randwrite",
        "--bs=4k",
        "--iodepth=32",
        "--numjobs=4",
        "--size=8M",
        "--offset_increment=8M",
        "--verify=crc32c",
        "--verify_state_save=0",
        "--do_verify=1",
        "--group_reporting",
    ]));
    assert!(out.contains("err= 0"), "{out}");
    // qemu-img: info, convert out and compare.
    let info = run(Command::new("qemu-img").args(["info", "--output=json", &srv.uri()]));
    assert!(info.contains("\"virtual-size\": 67108864"), "{info}");
    let q = dir.path().join("q.raw");
    run(Command::new("qemu-img")
        .args(["convert", "-O", "raw", &srv.uri()])
        .arg(&q));
    run(Command::new("qemu-img")
        .args(["compare", "-f", "raw", "-F", "raw"])
        .arg(&q)
        .arg(srv.uri()));
}

/// A tiny JSON reader for nbdinfo's flat output (keeps serde out of this crate's tests).
mod serde_like {
    pub struct Json(String);
    pub fn parse(s: &str) -> Json {
        Json(s.to_string())
    }
    impl Json {
        fn raw(&self, key: &str) -> String {
            let pat = format!("\"{key}\":");
            let i = self
                .0
                .find(&pat)
                .unwrap_or_else(|| panic!("{key} missing in {}", self.0))
                + pat.len();
            self.0[i..]
                .trim_start()
                .chars()
                .take_while(|c| !matches!(c, ',' | '\n' | '}'))
                .collect::<String>()
                .trim()
                .to_string()
        }
        pub fn num(&self, key: &str) -> u64 {
            self.raw(key).parse().unwrap()
        }
        pub fn bool(&self, key: &str) -> bool {
            self.raw(key) == "true"
        }
    }
}
