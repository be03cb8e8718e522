//! Two `sbod` hosts on the same members (issue 25): each with its own state directory
//! (its own host id), the second reaching the member files through loop devices, as
//! another host reaches them over the network. While one serves, the other is refused
//! and told who owns the members; a clean stop hands them over at once.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

struct Host {
    dir: PathBuf,
    state: PathBuf,
    sock: PathBuf,
    server: Option<Child>,
}

impl Drop for Host {
    fn drop(&mut self) {
        if let Some(mut c) = self.server.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Host {
    fn new(dir: &Path, name: &str) -> Host {
        Host {
            dir: dir.to_path_buf(),
            state: dir.join(format!("{name}-state")),
            sock: dir.join(format!("{name}.sock")),
            server: None,
        }
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_sbod"));
        c.args(args)
            .current_dir(&self.dir)
            .env("SBOD_STATE_DIR", &self.state)
            // A short heartbeat: the second host watches for longer than the lease.
            .env("SBOD_HEARTBEAT_MS", "100")
            .env("SBOD_LEASE_INTERVALS", "5");
        c
    }

    fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).output().unwrap()
    }

    fn ok(&self, args: &[&str]) -> String {
        let o = self.run(args);
        assert!(
            o.status.success(),
            "sbod {args:?} failed:\n{}\n{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).to_string()
    }

    fn host_id(&self) -> String {
        std::fs::read_to_string(self.state.join("hostid"))
            .unwrap()
            .trim()
            .to_string()
    }

    fn serve(&mut self) {
        let child = self
            .cmd(&[
                "serve",
                "vol0",
                "--nbd",
                &format!("unix:{}", self.sock.display()),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        self.server = Some(child);
        let uri = format!("nbd+unix:///?socket={}", self.sock.display());
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(60) {
            if Command::new("nbdinfo")
                .arg("--size")
                .arg(&uri)
                .output()
                .is_ok_and(|o| o.status.success())
            {
                return;
            }
            if let Some(st) = self.server.as_mut().unwrap().try_wait().unwrap() {
                panic!("sbod serve exited with {st}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("sbod serve did not come up");
    }

    fn stop(&mut self) {
        self.ok(&["stop", "vol0"]);
        let st = self.server.take().expect("serving").wait().unwrap();
        assert!(st.success(), "sbod serve exited with {st}");
    }
}

fn need(tool: &str, package: &str) {
    let ok = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(ok, "{tool} is not installed: install {package}");
}

/// A loop device over a member file (direct I/O: no cache between the hosts), detached
/// on drop.
struct Loop(String);

impl Loop {
    fn attach(file: &Path) -> Loop {
        let out = Command::new("losetup")
            .args(["--find", "--show", "--direct-io=on"])
            .arg(file)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "losetup failed (this test needs root and loop devices): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Loop(String::from_utf8(out.stdout).unwrap().trim().to_string())
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.0]).status();
    }
}

#[test]
fn a_second_host_is_refused_while_the_first_serves_and_told_who() {
    need("losetup", "util-linux");
    need("nbdinfo", "libnbd-bin");
    let dir = tempfile::tempdir().unwrap();
    let mut a = Host::new(dir.path(), "a");
    let mut b = Host::new(dir.path(), "b");
    let files: Vec<String> = (0..4).map(|i| format!("disks/d{i}.img")).collect();
    std::fs::create_dir_all(dir.path().join("disks")).unwrap();
    let mut args = vec!["create", "vol0", "--level", "raid5", "--size-each", "16M"];
    args.extend(files.iter().map(|s| s.as_str()));
    a.ok(&args);
    let loops: Vec<Loop> = files
        .iter()
        .map(|f| Loop::attach(&dir.path().join(f)))
        .collect();
    let mut b_args = vec!["assemble"];
    b_args.extend(loops.iter().map(|l| l.0.as_str()));

    a.serve();
    let o = b.run(&b_args);
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(
        !o.status.success(),
        "host b assembled members host a serves"
    );
    assert!(err.contains("in use by host"), "{err}");
    assert!(
        err.contains(&a.host_id()),
        "the refusal names host a's id: {err}"
    );
    assert!(err.contains("last seen"), "{err}");
    assert!(
        err.contains("--force"),
        "the refusal says how to take over: {err}"
    );
    // Host a serves on, as if nothing happened.
    let s = a.ok(&["status", "vol0"]);
    assert!(!s.contains("fenced"), "{s}");

    // A clean stop releases the members: host b takes them at once, and serves.
    a.stop();
    let out = b.ok(&b_args);
    assert!(out.contains("assembled vol0"), "{out}");
    assert!(!out.contains("not shut down cleanly"), "{out}");
    b.serve();
    // Now host a is the second: refused, naming host b.
    let o = a.run(&[
        "serve",
        "vol0",
        "--nbd",
        &format!("unix:{}", a.sock.display()),
    ]);
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(!o.status.success(), "host a served members host b serves");
    assert!(
        err.contains(&b.host_id()),
        "the refusal names host b's id: {err}"
    );
    b.stop();
    drop(loops);
}
