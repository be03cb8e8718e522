//! Members on other hosts, for real: four "storage nodes" and one "head", each in its own
//! network namespace, joined by veth links. Nodes export their disks over TCP (`sbod export`
//! on three, nbdkit on one, reached through a userspace link that adds latency and drops
//! connections); the head serves raid6 over them; fio (verifying) and nbdcopy drive the
//! head from the host. A node's link is cut mid-write (the head goes degraded, the client
//! sees nothing) and restored (its members are re-added); latency and loss slow it down but
//! nothing is wrong; a node dies for good and its members are replaced on another node.
//!
//! Needs root (ip netns, veth); skips with a message where the kernel forbids namespaces.
//! tc netem is not assumed: latency and loss come from the proxy here. SBOD_NETNS_SCALE=N
//! makes members and the load N times larger (default 1: about a minute).

mod common;

use common::*;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn ip(args: &[&str]) -> std::process::Output {
    Command::new("ip")
        .args(args)
        .output()
        .expect("ip (iproute2)")
}

fn ip_ok(args: &[&str]) {
    let o = ip(args);
    check(&o, &format!("ip {args:?}"));
}

/// Namespaces and links of one test run, removed when it ends however it ends (deleting a
/// namespace removes its veth ends and kills nothing else; processes are the caller's).
struct Netns {
    pid: u32,
    names: Vec<String>,
}

impl Netns {
    /// Remove namespaces left by runs whose process is gone (a test killed with SIGKILL).
    fn sweep_stale() {
        let o = ip(&["netns", "list"]);
        for line in String::from_utf8_lossy(&o.stdout).lines() {
            let name = line.split_whitespace().next().unwrap_or("");
            if let Some(rest) = name.strip_prefix("sbodt-") {
                let pid = rest.split('-').next().unwrap_or("");
                if !pid.is_empty() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
                    let _ = ip(&["netns", "del", name]);
                }
            }
        }
    }

    /// The namespaces, or why they cannot be made here.
    fn new() -> Result<Netns, String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("not root".into());
        }
        if Command::new("ip").arg("-V").output().is_err() {
            return Err("ip (iproute2) is not installed".into());
        }
        Self::sweep_stale();
        let n = Netns {
            pid: std::process::id(),
            names: Vec::new(),
        };
        let probe = n.name("probe");
        let o = ip(&["netns", "add", &probe]);
        if !o.status.success() {
            return Err(format!(
                "ip netns add: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            ));
        }
        let _ = ip(&["netns", "del", &probe]);
        Ok(n)
    }

    fn name(&self, what: &str) -> String {
        format!("sbodt-{}-{what}", self.pid)
    }

    fn add(&mut self, what: &str) -> String {
        let ns = self.name(what);
        ip_ok(&["netns", "add", &ns]);
        self.names.push(ns.clone());
        ip_ok(&["-n", &ns, "link", "set", "lo", "up"]);
        ns
    }

    /// A link head <-> node k: 10.117.k.1 on the head, 10.117.k.2 on the node. Returns the
    /// node-side interface name.
    fn link(&self, head: &str, node: &str, k: u32) -> String {
        let (h, n) = (
            format!("sb{}h{k}", self.pid % 10_000_000),
            format!("sb{}n{k}", self.pid % 10_000_000),
        );
        ip_ok(&[
            "link", "add", &h, "netns", head, "type", "veth", "peer", "name", &n, "netns", node,
        ]);
        ip_ok(&[
            "-n",
            head,
            "addr",
            "add",
            &format!("10.117.{k}.1/24"),
            "dev",
            &h,
        ]);
        ip_ok(&[
            "-n",
            node,
            "addr",
            "add",
            &format!("10.117.{k}.2/24"),
            "dev",
            &n,
        ]);
        ip_ok(&["-n", head, "link", "set", &h, "up"]);
        ip_ok(&["-n", node, "link", "set", &n, "up"]);
        n
    }

    fn remove(&mut self, ns: &str) {
        let _ = ip(&["netns", "del", ns]);
        self.names.retain(|n| n != ns);
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        for ns in self.names.drain(..) {
            let _ = ip(&["netns", "del", &ns]);
        }
    }
}

/// Make the calling thread's sockets belong to namespace `ns`.
fn enter(ns: &str) {
    let f = std::fs::File::open(format!("/var/run/netns/{ns}")).unwrap();
    use std::os::unix::io::AsRawFd;
    // SAFETY: setns on an open namespace file, for this thread only.
    let r = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(r, 0, "setns: {}", std::io::Error::last_os_error());
}

/// A userspace link inside the head's namespace: forwards 127.0.0.1:PORT to a node,
/// adding `delay_us` to every burst it forwards and, with `drop_every_ms`, resetting one
/// connection that often (the loss a TCP connection sees as a dead link).
struct Link {
    port: u16,
    delay_us: Arc<AtomicU64>,
    drop_every_ms: Arc<AtomicU64>,
    dropped: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Link {
    fn start(ns: &str, target: &str) -> Link {
        let (tx, rx) = std::sync::mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let delay_us = Arc::new(AtomicU64::new(0));
        let drop_every_ms = Arc::new(AtomicU64::new(0));
        let dropped = Arc::new(AtomicU64::new(0));
        let conns: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let (ns, target) = (ns.to_string(), target.to_string());
        let (s, d, c) = (stop.clone(), delay_us.clone(), conns.clone());
        let acceptor = std::thread::spawn(move || {
            enter(&ns);
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            l.set_nonblocking(true).unwrap();
            tx.send(l.local_addr().unwrap().port()).unwrap();
            while !s.load(Ordering::Relaxed) {
                let Ok((client, _)) = l.accept() else {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                client.set_nonblocking(false).unwrap();
                let Ok(server) = TcpStream::connect(&target) else {
                    continue;
                };
                let _ = server.set_nodelay(true);
                let _ = client.set_nodelay(true);
                c.lock().unwrap().push(client.try_clone().unwrap());
                for (a, b) in [
                    (client.try_clone().unwrap(), server.try_clone().unwrap()),
                    (server, client),
                ] {
                    let d = d.clone();
                    std::thread::spawn(move || pump(a, b, d));
                }
            }
        });
        let port = rx.recv().unwrap();
        let (s, e, c, n) = (stop.clone(), drop_every_ms.clone(), conns, dropped.clone());
        let dropper = std::thread::spawn(move || {
            let mut k = 0usize;
            while !s.load(Ordering::Relaxed) {
                let every = e.load(Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(every.clamp(20, 200)));
                if every == 0 {
                    continue;
                }
                let mut v = c.lock().unwrap();
                if !v.is_empty() {
                    k = (k + 7) % v.len();
                    let victim = v.swap_remove(k);
                    let _ = victim.shutdown(std::net::Shutdown::Both);
                    n.fetch_add(1, Ordering::Relaxed);
                }
                drop(v);
                std::thread::sleep(Duration::from_millis(every.saturating_sub(200)));
            }
        });
        Link {
            port,
            delay_us,
            drop_every_ms,
            dropped,
            stop,
            threads: vec![acceptor, dropper],
        }
    }
}

fn pump(mut a: TcpStream, mut b: TcpStream, delay_us: Arc<AtomicU64>) {
    let mut buf = vec![0u8; 256 << 10];
    loop {
        let n = match a.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let d = delay_us.load(Ordering::Relaxed);
        if d > 0 {
            std::thread::sleep(Duration::from_micros(d));
        }
        if b.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = a.shutdown(std::net::Shutdown::Both);
    let _ = b.shutdown(std::net::Shutdown::Both);
}

impl Drop for Link {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// fio with verify, one job after another, until told to stop; every job must pass.
fn fio_loop(
    uri: String,
    off: u64,
    len: u64,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<u32> {
    std::thread::spawn(move || {
        let mut jobs = 0;
        while !stop.load(Ordering::Relaxed) || jobs == 0 {
            let text = fio_done(fio_verify(&uri, off, len, 1).spawn().unwrap());
            let bw = text
                .lines()
                .find(|l| l.trim_start().starts_with("write:"))
                .unwrap_or("")
                .trim()
                .to_string();
            eprintln!("fio job {jobs}: {bw}");
            jobs += 1;
        }
        jobs
    })
}

#[test]
fn raid6_over_three_nodes_across_network_namespaces() {
    let mut net = Netns::new().unwrap_or_else(|why| {
        panic!(
            "network namespaces are not available here ({why}): run as root with iproute2 \
             installed (apt-get install iproute2)"
        )
    });
    for t in ["nbdcopy", "nbdinfo", "fio", "nbdkit"] {
        need(t);
    }
    let scale: u64 = std::env::var("SBOD_NETNS_SCALE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
        .max(1);
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let mut procs = Procs::default();
    let head = net.add("head");
    let nodes: Vec<String> = (1..=4).map(|k| net.add(&format!("n{k}"))).collect();
    let ifs: Vec<String> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| net.link(&head, n, i as u32 + 1))
        .collect();
    let in_ns = |ns: &str| {
        vec![
            "ip".to_string(),
            "netns".into(),
            "exec".into(),
            ns.to_string(),
        ]
    };

    // Disks on the nodes; node 1 has a third one, used to test the domain check.
    let size = (32 << 20) * scale;
    for k in 1..=4 {
        let dir = d.join(format!("n{k}"));
        std::fs::create_dir_all(&dir).unwrap();
        for disk in ["a", "b", "c"] {
            std::fs::File::create(dir.join(disk))
                .unwrap()
                .set_len(size)
                .unwrap();
        }
    }
    let mut sb = Sbod::new(d);
    sb.env = vec![
        ("SBOD_REMOTE_IO_TIMEOUT".into(), "1s".into()),
        ("SBOD_REMOTE_CONNECT_TIMEOUT".into(), "1s".into()),
        ("SBOD_REMOTE_GIVE_UP".into(), "2s".into()),
    ];
    let export = |k: usize| {
        let mut e = Sbod::new(d);
        e.prefix = in_ns(&nodes[k - 1]);
        let mut c = e.cmd(&[
            "export",
            &format!("n{k}/a"),
            &format!("n{k}/b"),
            &format!("n{k}/c"),
            "--nbd",
            &format!("tcp:10.117.{k}.2:10809"),
            "--allow-remote",
        ]);
        c.env("SBOD_STATE_DIR", d.join(format!("n{k}-state")));
        c
    };
    procs.spawn("n1", &mut export(1));
    procs.spawn("n2", &mut export(2));
    procs.spawn("n4", &mut export(4));
    // Node 3 runs nbdkit.
    procs.spawn(
        "n3",
        Command::new("ip")
            .args([
                "netns",
                "exec",
                &nodes[2],
                "nbdkit",
                "--foreground",
                "-i",
                "10.117.3.2",
            ])
            .args(["-p", "10809", "file", "cache=none"])
            .arg(format!("dir={}", d.join("n3").display())),
    );
    let head_ok = |args: &[&str]| -> bool {
        Command::new("ip")
            .args(["netns", "exec", &head])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    };
    for k in 1..=4 {
        let t = Instant::now();
        while !head_ok(&["nbdinfo", "--size", &format!("nbd://10.117.{k}.2/a")]) {
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "node {k} never answered"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    // The head reaches node 3 through a userspace link it can slow down and break.
    let link = Link::start(&head, "10.117.3.2:10809");
    let m = |k: u32, disk: &str| {
        if k == 3 {
            format!("nbd://127.0.0.1:{}/{disk}", link.port)
        } else {
            format!("nbd://10.117.{k}.2/{disk}")
        }
    };
    let members = [
        m(1, "a"),
        m(2, "a"),
        m(3, "a"),
        m(1, "b"),
        m(2, "b"),
        m(3, "b"),
    ];
    sb.prefix = in_ns(&head);
    let mut args = vec!["create", "vol0", "--level", "raid6", "--chunk", "64K"];
    args.extend(members.iter().map(String::as_str));
    sb.ok(&args);
    let uri = sb.serve(&mut procs, "vol0");
    // Clients and management run on the host; the head's socket is a file.
    sb.prefix.clear();
    let vsize: usize = run(Command::new("nbdinfo").arg("--size").arg(&uri))
        .trim()
        .parse()
        .unwrap();
    let bytes = data(vsize, 11);
    std::fs::write(d.join("src.img"), &bytes).unwrap();
    run(Command::new("nbdcopy").arg(d.join("src.img")).arg(&uri));
    sb.wait_status("vol0", "optimal", Duration::from_secs(60), |s| {
        s["state"] == "optimal"
    });
    let (fio_off, fio_len) = ((vsize / 2) as u64, (vsize / 8) as u64);
    let stop = Arc::new(AtomicBool::new(false));
    let fio = fio_loop(uri.clone(), fio_off, fio_len, stop.clone());
    std::thread::sleep(Duration::from_millis(500));

    // 1. Cut node 1's link mid-write: its members fail, the client sees nothing.
    ip_ok(&["-n", &nodes[0], "link", "set", &ifs[0], "down"]);
    let s = sb.wait_status(
        "vol0",
        "node 1's members failed",
        Duration::from_secs(30),
        |s| s["members"][0]["state"] == "failed" && s["members"][3]["state"] == "failed",
    );
    assert_eq!(s["state"], "degraded", "{s:#}");
    std::thread::sleep(Duration::from_secs(1));
    // 2. Restore it: the members are re-added and brought up to date.
    ip_ok(&["-n", &nodes[0], "link", "set", &ifs[0], "up"]);
    let s = sb.wait_status(
        "vol0",
        "optimal after the link came back",
        Duration::from_secs(90),
        |s| s["state"] == "optimal",
    );
    eprintln!("after re-add: {}", s["last_process"]);

    // 3. Latency and loss on node 3's link: slower, still correct.
    link.delay_us.store(2000, Ordering::Relaxed);
    link.drop_every_ms.store(700, Ordering::Relaxed);
    std::thread::sleep(Duration::from_secs(4 * scale));
    link.delay_us.store(0, Ordering::Relaxed);
    link.drop_every_ms.store(0, Ordering::Relaxed);
    assert!(
        link.dropped.load(Ordering::Relaxed) > 0,
        "the lossy link dropped nothing"
    );
    let s = sb.wait_status(
        "vol0",
        "optimal after latency and loss",
        Duration::from_secs(90),
        |s| s["state"] == "optimal",
    );
    assert_ne!(s["state"], "failed");

    // 4. Node 2 dies for good: replace its members on node 4.
    procs.kill("n2");
    net.remove(&nodes[1]);
    let s = sb.wait_status(
        "vol0",
        "node 2's members failed",
        Duration::from_secs(30),
        |s| s["members"][1]["state"] == "failed" && s["members"][4]["state"] == "failed",
    );
    assert_eq!(s["state"], "degraded", "{s:#}");
    // Node 1 already holds two members of the group: a third is refused.
    let e = sb.fails(&["replace", "vol0", &members[4], &m(1, "c")]);
    assert!(e.contains("failure domain '10.117.1.2'"), "{e}");
    sb.ok(&["replace", "vol0", &members[1], &m(4, "a")]);
    sb.ok(&["replace", "vol0", &members[4], &m(4, "b"), "--wait"]);
    let s = sb.wait_status("vol0", "optimal on node 4", Duration::from_secs(90), |s| {
        s["state"] == "optimal"
    });
    assert_eq!(s["members"][1]["path"], m(4, "a").as_str());
    assert_eq!(s["members"][4]["domain"], "10.117.4.2");

    stop.store(true, Ordering::Relaxed);
    let jobs = fio.join().expect("fio saw no error");
    eprintln!("{jobs} fio verify jobs passed");
    let out = d.join("out.img");
    run(Command::new("nbdcopy").arg(&uri).arg(&out));
    let got = std::fs::read(&out).unwrap();
    let (a, b) = (fio_off as usize, (fio_off + fio_len) as usize);
    assert!(
        got[..a] == bytes[..a] && got[b..] == bytes[b..],
        "read-back differs"
    );
    let j: serde_json::Value = serde_json::from_str(&sb.ok(&["scrub", "vol0", "--json"])).unwrap();
    assert_eq!(j["mismatches"], 0, "{j}");
    sb.ok(&["stop", "vol0"]);
}
