//! `sbod serve NAME --iscsi` on real files: qemu-img writes and compares through iSCSI,
//! the same bytes read back over NBD (one engine behind both), CHAP secrets from the state
//! directory (refused unless 0600), and a clean stop.

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

struct Env {
    dir: tempfile::TempDir,
    server: Option<Child>,
    port: u16,
}

impl Drop for Env {
    fn drop(&mut self) {
        if let Some(mut c) = self.server.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn need(tool: &str, pkg: &str) {
    let ok = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(
        ok,
        "{tool} is not installed: run scripts/deps.sh (Debian package {pkg})"
    );
}

fn check(o: &Output, what: &str) {
    assert!(
        o.status.success(),
        "{what} failed:\n{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

const IQN: &str = "iqn.2025-01.io.sbod:vol0";

impl Env {
    fn p(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
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
    fn url(&self, creds: &str) -> String {
        format!("iscsi://{creds}127.0.0.1:{}/{IQN}/0", self.port)
    }
    fn nbd(&self) -> String {
        format!("nbd+unix:///?socket={}", self.p("nbd.sock").display())
    }
    fn spawn(&mut self) -> Child {
        self.port = free_port();
        self.cmd(&[
            "serve",
            "vol0",
            "--nbd",
            &format!("unix:{}", self.p("nbd.sock").display()),
            "--iscsi",
            &format!("127.0.0.1:{}", self.port),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
    }
    fn serve(&mut self, creds: &str) {
        let child = self.spawn();
        self.server = Some(child);
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(30) {
            let up = Command::new("iscsi-inq")
                .arg(self.url(creds))
                .output()
                .map(|o| o.status.success())
                .unwrap_or(false);
            if up {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("sbod serve --iscsi did not come up");
    }
    fn stop(&mut self) {
        self.ok(&["stop", "vol0"]);
        let mut c = self.server.take().expect("server running");
        let st = c.wait().unwrap();
        assert!(st.success(), "sbod serve exited with {st}");
    }
}

#[test]
fn serve_over_iscsi_with_qemu_img_and_chap() {
    need("qemu-img", "qemu-utils");
    need("iscsi-inq", "libiscsi-bin");
    need("nbdcopy", "libnbd-bin");
    let mut env = Env {
        dir: tempfile::tempdir().unwrap(),
        server: None,
        port: 0,
    };
    let disks: Vec<String> = (0..3).map(|i| format!("d{i}.img")).collect();
    let mut args = vec!["create", "vol0", "--level", "raid5", "--size-each", "24M"];
    args.extend(disks.iter().map(|s| s.as_str()));
    env.ok(&args);
    env.serve("");

    let size: u64 = Command::new("iscsi-readcapacity16")
        .arg(env.url(""))
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
        .unwrap()
        .lines()
        .find_map(|l| {
            l.strip_prefix("Total size:")
                .map(|v| v.trim().parse().unwrap())
        })
        .expect("a size");
    assert!(size > 32 << 20, "{size}");
    let data: Vec<u8> = (0..size as u32)
        .map(|i| (i.wrapping_mul(2246822519) >> 11) as u8)
        .collect();
    std::fs::write(env.p("src.img"), &data).unwrap();
    let o = Command::new("qemu-img")
        .args(["convert", "-n", "-f", "raw", "-O", "raw"])
        .arg(env.p("src.img"))
        .arg(env.url(""))
        .output()
        .unwrap();
    check(&o, "qemu-img convert to iscsi://");
    let o = Command::new("qemu-img")
        .args(["compare", "-f", "raw", "-F", "raw"])
        .arg(env.p("src.img"))
        .arg(env.url(""))
        .output()
        .unwrap();
    check(&o, "qemu-img compare with iscsi://");
    // The same engine behind NBD: the bytes written over iSCSI read back over NBD.
    let o = Command::new("nbdcopy")
        .arg(env.nbd())
        .arg(env.p("out.img"))
        .output()
        .unwrap();
    check(&o, "nbdcopy");
    assert!(
        std::fs::read(env.p("out.img")).unwrap() == data,
        "NBD reads other bytes than iSCSI wrote"
    );
    env.stop();

    // CHAP: secrets others may read are refused with what to do.
    let chap_dir = env.p("state/iscsi");
    std::fs::create_dir_all(&chap_dir).unwrap();
    let chap = chap_dir.join("vol0.chap");
    std::fs::write(&chap, "user=alice\nsecret=alice-secret-16b\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&chap, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut c = env.spawn();
    let o = c.wait_with_output_stderr();
    assert!(!o.0.success());
    assert!(o.1.contains("chmod 600"), "{}", o.1);
    std::fs::set_permissions(&chap, std::fs::Permissions::from_mode(0o600)).unwrap();
    env.serve("alice%alice-secret-16b@");
    let o = Command::new("iscsi-inq").arg(env.url("")).output().unwrap();
    assert!(!o.status.success(), "a login without CHAP was let in");
    let o = Command::new("iscsi-inq")
        .arg(env.url("alice%not-the-secret@"))
        .output()
        .unwrap();
    assert!(!o.status.success(), "a wrong CHAP secret was let in");
    let o = Command::new("qemu-img")
        .args(["compare", "-f", "raw", "-F", "raw"])
        .arg(env.p("src.img"))
        .arg(env.url("alice%alice-secret-16b@"))
        .output()
        .unwrap();
    check(&o, "qemu-img compare after a restart, with CHAP");
    env.stop();
}

trait WaitStderr {
    fn wait_with_output_stderr(&mut self) -> (std::process::ExitStatus, String);
}

impl WaitStderr for Child {
    fn wait_with_output_stderr(&mut self) -> (std::process::ExitStatus, String) {
        use std::io::Read;
        let mut s = String::new();
        if let Some(mut e) = self.stderr.take() {
            let _ = e.read_to_string(&mut s);
        }
        (self.wait().unwrap(), s)
    }
}
