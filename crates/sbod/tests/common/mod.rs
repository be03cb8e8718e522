//! Helpers for the remote-member tests: processes that die with the test, the sbod CLI
//! with its own state directory, and test certificates.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub fn need(tool: &str) {
    let ok = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(ok, "{tool} is not installed: run scripts/deps.sh");
}

pub fn check(o: &Output, what: &str) {
    assert!(
        o.status.success(),
        "{what} failed:\n{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

pub fn run(c: &mut Command) -> String {
    let o = c.output().unwrap();
    check(&o, &format!("{c:?}"));
    String::from_utf8_lossy(&o.stdout).to_string()
}

/// Child processes killed (and reaped) when the test ends, however it ends.
#[derive(Default)]
pub struct Procs(pub Vec<(String, Child)>);

impl Procs {
    pub fn spawn(&mut self, name: &str, c: &mut Command) {
        let child = c
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {name}: {e}"));
        self.0.push((name.to_string(), child));
    }

    /// Kill one (SIGKILL: a host that dies).
    pub fn kill(&mut self, name: &str) {
        if let Some(i) = self.0.iter().position(|(n, _)| n == name) {
            let (_, mut c) = self.0.remove(i);
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Stop one with SIGTERM and wait for a clean exit.
    pub fn term(&mut self, name: &str) {
        if let Some(i) = self.0.iter().position(|(n, _)| n == name) {
            let (_, c) = self.0.remove(i);
            // SAFETY: kill(2) on our own child.
            unsafe {
                libc::kill(c.id() as i32, libc::SIGTERM);
            }
            let out = c.wait_with_output().unwrap();
            assert!(out.status.success(), "{name} exited with {}", out.status);
        }
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        for (_, c) in self.0.iter_mut().rev() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The sbod CLI with a private state directory.
pub struct Sbod {
    pub dir: PathBuf,
    /// Prefix for every command (e.g. `ip netns exec NS`).
    pub prefix: Vec<String>,
    pub env: Vec<(String, String)>,
}

impl Sbod {
    pub fn new(dir: &Path) -> Sbod {
        Sbod {
            dir: dir.to_path_buf(),
            prefix: Vec::new(),
            env: Vec::new(),
        }
    }

    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = if self.prefix.is_empty() {
            Command::new(env!("CARGO_BIN_EXE_sbod"))
        } else {
            let mut c = Command::new(&self.prefix[0]);
            c.args(&self.prefix[1..]).arg(env!("CARGO_BIN_EXE_sbod"));
            c
        };
        c.args(args)
            .current_dir(&self.dir)
            .env("SBOD_STATE_DIR", self.dir.join("state"));
        for (k, v) in &self.env {
            c.env(k, v);
        }
        c
    }

    pub fn ok(&self, args: &[&str]) -> String {
        let o = self.cmd(args).output().unwrap();
        check(&o, &format!("sbod {args:?}"));
        String::from_utf8_lossy(&o.stdout).to_string()
    }

    /// Run a command that must fail; returns its stderr.
    pub fn fails(&self, args: &[&str]) -> String {
        let o = self.cmd(args).output().unwrap();
        assert!(
            !o.status.success(),
            "sbod {args:?} succeeded:\n{}",
            String::from_utf8_lossy(&o.stdout)
        );
        String::from_utf8_lossy(&o.stderr).to_string()
    }

    /// `sbod serve NAME` on a Unix socket in the work folder, killed with `procs`; returns
    /// the export's URI once it answers.
    pub fn serve(&self, procs: &mut Procs, name: &str) -> String {
        self.serve_with(procs, name, &[])
    }

    /// `sbod serve NAME` with more arguments (`--degraded`, ...).
    pub fn serve_with(&self, procs: &mut Procs, name: &str, extra: &[&str]) -> String {
        let sock = self.dir.join(format!("{name}.sock"));
        let listen = format!("unix:{}", sock.display());
        let mut args = vec!["serve", name, "--nbd", &listen];
        args.extend_from_slice(extra);
        procs.spawn("head", &mut self.cmd(&args));
        let uri = format!("nbd+unix:///?socket={}", sock.display());
        wait_nbd(&uri, Duration::from_secs(30));
        uri
    }

    pub fn status(&self, name: &str) -> serde_json::Value {
        serde_json::from_str(&self.ok(&["status", name, "--json"])).unwrap()
    }

    /// Wait until the array's status satisfies `f`.
    pub fn wait_status(
        &self,
        name: &str,
        what: &str,
        limit: Duration,
        f: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let t = Instant::now();
        loop {
            let s = self.status(name);
            if f(&s) {
                return s;
            }
            assert!(t.elapsed() < limit, "{name} never got {what}: {s:#}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Wait until `nbdinfo` can reach `uri`.
pub fn wait_nbd(uri: &str, limit: Duration) {
    let t = Instant::now();
    while t.elapsed() < limit {
        if Command::new("nbdinfo")
            .arg("--size")
            .arg(uri)
            .stderr(Stdio::null())
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
        {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("{uri} did not come up");
}

/// Wait until something listens on a TCP address.
pub fn wait_tcp(addr: &str, limit: Duration) {
    let t = Instant::now();
    while t.elapsed() < limit {
        if std::net::TcpStream::connect(addr).is_ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("nothing listens on {addr}");
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A test CA and a server certificate for `localhost`/127.0.0.1 in `dir`, named as nbdkit
/// and libnbd expect (ca-cert.pem, server-cert.pem, server-key.pem).
pub fn make_certs(dir: &Path) {
    need("openssl");
    std::fs::create_dir_all(dir).unwrap();
    let ossl = |args: &[&str]| {
        run(Command::new("openssl").args(args).current_dir(dir));
    };
    let ec_key = |key: &'static str| {
        [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
        ]
        .into_iter()
        .chain([key])
        .collect::<Vec<_>>()
    };
    let mut ca = vec!["req", "-x509"];
    ca.extend(ec_key("ca-key.pem"));
    ca.extend([
        "-out",
        "ca-cert.pem",
        "-days",
        "2",
        "-subj",
        "/CN=sbod test CA",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    ]);
    ossl(&ca);
    let mut server = vec!["req"];
    server.extend(ec_key("server-key.pem"));
    server.extend(["-out", "server.csr", "-subj", "/CN=localhost"]);
    ossl(&server);
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\nbasicConstraints=CA:FALSE\n",
    )
    .unwrap();
    ossl(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca-cert.pem",
        "-CAkey",
        "ca-key.pem",
        "-CAcreateserial",
        "-out",
        "server-cert.pem",
        "-days",
        "2",
        "-extfile",
        "ext.cnf",
    ]);
}

/// Deterministic bytes for a volume.
pub fn data(len: usize, seed: u32) -> Vec<u8> {
    (0..len as u32)
        .map(|i| ((i ^ seed).wrapping_mul(2246822519) >> 11) as u8)
        .collect()
}

pub fn fio_verify(uri: &str, offset: u64, size: u64, loops: u32) -> Command {
    let mut c = Command::new("fio");
    c.args([
        "--name=load",
        "--ioengine=nbd",
        &format!("--uri={uri}"),
        "--rw=randwrite",
        "--bs=4k",
        "--iodepth=16",
        &format!("--offset={offset}"),
        &format!("--size={size}"),
        "--verify=crc32c",
        "--verify_state_save=0",
        "--do_verify=1",
        "--verify_fatal=1",
        &format!("--loops={loops}"),
    ])
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    c
}

/// Wait for a fio started with [`fio_verify`] and check it saw no error.
pub fn fio_done(c: Child) -> String {
    let out = c.wait_with_output().unwrap();
    check(&out, "fio");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(text.contains("err= 0"), "{text}");
    text
}
