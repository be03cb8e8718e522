//! Issue 28 end to end through the `sbod` command: members that are files say their health
//! is not available (with the reason) in `status`, `status --json` and `health`, rather
//! than guess; the health policy is set, refused when wrong, and shown; `locate` on a file
//! member is refused with the reason. (The parser, sysfs, LEDs, hot-plug and the real
//! smartctl on this machine's disks are tested in crates/sbod-health.)

mod common;
#[allow(dead_code)]
#[path = "../../sbod-health/tests/faketree/mod.rs"]
mod faketree;

use serde_json::Value;
use std::process::{Command, Output};

struct Env {
    dir: tempfile::TempDir,
    /// Environment for every sbod this test runs.
    vars: Vec<(&'static str, String)>,
}

impl Env {
    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_sbod"));
        c.args(args)
            .current_dir(self.dir.path())
            .env("SBOD_STATE_DIR", self.dir.path().join("state"))
            .envs(self.vars.iter().map(|(k, v)| (k, v)));
        c
    }

    fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).output().expect("run sbod")
    }

    fn ok(&self, args: &[&str]) -> String {
        let o = self.run(args);
        assert!(
            o.status.success(),
            "sbod {args:?} failed:\n{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8(o.stdout).unwrap()
    }

    fn fails(&self, args: &[&str]) -> String {
        let o = self.run(args);
        assert!(!o.status.success(), "sbod {args:?} should have failed");
        String::from_utf8(o.stderr).unwrap()
    }
}

#[test]
fn file_members_say_health_is_not_available() {
    let e = Env {
        dir: tempfile::tempdir().unwrap(),
        vars: Vec::new(),
    };
    e.ok(&[
        "create",
        "h0",
        "--level",
        "raid1",
        "--size-each",
        "8M",
        "d0.img",
        "d1.img",
    ]);
    let s: Value = serde_json::from_str(&e.ok(&["status", "h0", "--json"])).unwrap();
    let members = s["members"].as_array().unwrap();
    assert_eq!(members.len(), 2);
    for m in members {
        assert_eq!(m["health"]["verdict"], "unavailable", "{m}");
        let why = m["health"]["reasons"][0].as_str().unwrap();
        assert!(why.contains("a file"), "{why}");
        assert!(
            m.get("location").is_none() && m.get("identity").is_none(),
            "{m}"
        );
    }
    let text = e.ok(&["status", "h0"]);
    assert!(text.contains("health"), "{text}");
    assert_eq!(text.matches(" n/a").count(), 2, "{text}");

    let h: Value = serde_json::from_str(&e.ok(&["health", "h0", "--json"])).unwrap();
    assert_eq!(h["policy"]["replace"], true, "{h}");
    for m in h["members"].as_array().unwrap() {
        assert_eq!(m["health"]["verdict"], "unavailable", "{m}");
    }
    let text = e.ok(&["health", "h0"]);
    assert!(
        text.contains(
            "not available: a file: its health is that of the disk under its file system"
        ),
        "{text}"
    );

    // The policy: set (served or not), shown, refused when wrong (nothing changed).
    let r: Value = serde_json::from_str(&e.ok(&[
        "set",
        "h0",
        "--health-policy",
        "reallocated=5:50,autoreplace=on",
    ]))
    .unwrap();
    assert_eq!(r["health_policy"]["reallocated"]["warn"], 5, "{r}");
    assert_eq!(r["health_policy"]["autoreplace"], true, "{r}");
    let err = e.fails(&["set", "h0", "--health-policy", "pending=9:3"]);
    assert!(err.contains("above the failing one"), "{err}");
    let err = e.fails(&["set", "h0", "--health-policy", "speed=3"]);
    assert!(err.contains("unknown health policy key 'speed'"), "{err}");
    let h: Value = serde_json::from_str(&e.ok(&["health", "h0", "--json"])).unwrap();
    assert_eq!(h["policy"]["reallocated"]["fail"], 50, "kept: {h}");
    assert_eq!(
        h["policy"]["pending"]["fail"], 10,
        "the refused one changed nothing: {h}"
    );

    // A file has no LED.
    let d0 = e.dir.path().join("d0.img").display().to_string();
    let err = e.fails(&["locate", "h0", &d0]);
    assert!(
        err.contains("is a file: it has no slot and no LED"),
        "{err}"
    );
    let err = e.fails(&["locate", "h0", "nothere.img"]);
    assert!(err.contains("is not a member of h0"), "{err}");
    e.ok(&["forget", "h0"]);
    assert!(!e.dir.path().join("state/health/h0.json").exists());
}

/// A stand-in smartctl (`SBOD_SMARTCTL`, run on file members with `SBOD_SMARTCTL_FILES=1`)
/// that answers with the recorded failing SATA disk for `d0.img` and the healthy one for
/// the others.
fn fake_smartctl(dir: &std::path::Path) -> std::path::PathBuf {
    let fixtures = concat!(env!("CARGO_MANIFEST_DIR"), "/../sbod-health/tests/fixtures");
    let p = dir.join("smartctl");
    std::fs::write(
        &p,
        format!(
            "#!/bin/sh\ncase \"$3\" in\n  *d0.img) cat '{fixtures}/sata-hdd-failing.json'; exit 8;;\n  *) cat '{fixtures}/sata-hdd-healthy.json';;\nesac\n"
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

struct Served {
    env: Env,
    server: Option<std::process::Child>,
    log: std::path::PathBuf,
}

impl Served {
    /// The served volume's NBD URI, after writing it whole with a pattern of `seed`
    /// (nbdcopy): the URI and the bytes written.
    fn filled(&self, seed: u32) -> (String, Vec<u8>) {
        let uri = format!(
            "nbd+unix:///?socket={}",
            self.env.dir.path().join("hv.sock").display()
        );
        let vsize: usize = common::run(Command::new("nbdinfo").arg("--size").arg(&uri))
            .trim()
            .parse()
            .unwrap();
        let want = common::data(vsize, seed);
        let src = self.env.dir.path().join("src.img");
        std::fs::write(&src, &want).unwrap();
        common::run(Command::new("nbdcopy").arg(&src).arg(&uri));
        (uri, want)
    }

    /// An array `hv` of the given members, served with the fake smartctl and a fast tick.
    fn new(create: &[&str]) -> Served {
        Served::with(
            create,
            vec![
                ("SBOD_SMARTCTL_FILES", "1".into()),
                ("SBOD_HOTPLUG", "0".into()),
            ],
        )
    }

    /// The same with these variables set for every sbod (and no others but the fake
    /// smartctl and the fast tick).
    fn with(create: &[&str], vars: Vec<(&'static str, String)>) -> Served {
        let mut env = Env {
            dir: tempfile::tempdir().unwrap(),
            vars: Vec::new(),
        };
        let smartctl = fake_smartctl(env.dir.path());
        env.vars = vec![
            ("SBOD_SMARTCTL", smartctl.display().to_string()),
            ("SBOD_HEALTH_TICK_MS", "100".into()),
        ];
        env.vars.extend(vars);
        env.ok(create);
        let log = env.dir.path().join("serve.log");
        let sock = env.dir.path().join("hv.sock");
        let server = env
            .cmd(&["serve", "hv", "--nbd", &format!("unix:{}", sock.display())])
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let s = Served {
            env,
            server: Some(server),
            log,
        };
        s.wait_for("served", |st, _| st["running"] == true);
        s
    }

    fn status(&self) -> Value {
        serde_json::from_str(&self.env.ok(&["status", "hv", "--json"])).unwrap()
    }

    /// Poll the status (and the server's log) until `done` holds; panics after 60 s.
    fn wait_for(&self, what: &str, done: impl Fn(&Value, &str) -> bool) -> Value {
        let t = std::time::Instant::now();
        loop {
            let st = self.status();
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            if done(&st, &log) {
                return st;
            }
            assert!(
                t.elapsed() < std::time::Duration::from_secs(60),
                "waiting for {what}: {st:#}\n{log}"
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(mut c) = self.server.take() {
            let _ = self.env.run(&["stop", "hv"]);
            let _ = c.wait();
        }
    }
}

fn member<'a>(st: &'a Value, file: &str) -> Option<&'a Value> {
    st["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["path"].as_str().is_some_and(|p| p.ends_with(file)))
}

/// The serving process copies a member predicted to fail onto the hot spare while the
/// member still serves (md's want_replacement), and the spare takes its slot; the member
/// is never failed for its health.
#[test]
fn a_failing_member_is_copied_onto_the_spare_while_it_serves() {
    let s = Served::new(&[
        "create",
        "hv",
        "--level",
        "raid1",
        "--size-each",
        "16M",
        "--spares",
        "1",
        "d0.img",
        "d1.img",
        "s0.img",
    ]);
    let st = s.wait_for("the spare to take d0's slot", |st, _| {
        if let Some(d0) = member(st, "d0.img") {
            assert_ne!(d0["state"], "failed", "failed for its health: {st:#}");
        }
        member(st, "s0.img").is_some_and(|m| m["state"] == "active" && m["slot"] == 0)
            && st["state"] == "optimal"
    });
    assert!(
        member(&st, "d0.img").is_none_or(|m| m["slot"].is_null()),
        "{st:#}"
    );
    let log = std::fs::read_to_string(&s.log).unwrap();
    assert!(
        log.contains("copying it onto the hot spare"),
        "the server says what it did: {log}"
    );
}

/// With no spare, a member predicted to fail is an event and a log line, never a fault
/// (OpenZFS 14666): it keeps serving.
#[test]
fn without_a_spare_a_failing_member_keeps_serving() {
    let s = Served::new(&[
        "create",
        "hv",
        "--level",
        "raid1",
        "--size-each",
        "16M",
        "d0.img",
        "d1.img",
    ]);
    let st = s.wait_for("the server's verdict", |_, log| {
        log.contains("no hot spare to copy it onto")
    });
    let d0 = member(&st, "d0.img").unwrap();
    assert_eq!(d0["state"], "active", "{st:#}");
    assert_eq!(d0["health"]["verdict"], "failing", "{st:#}");
    assert_eq!(st["state"], "optimal");
    let st = s.status();
    assert_eq!(member(&st, "d0.img").unwrap()["state"], "active");
}

/// Remote members report their disks' health through `sbod export` (issue 28): the
/// exporting host reads its disks (here the stand-in smartctl: d0 failing, d1 healthy) and
/// says it in the export's description; `sbod health` on the head shows it, judged by the
/// head's policy, and says where it was read. A member served by another NBD server
/// (nbdkit) says its health is not available, with the reason.
#[test]
fn remote_members_report_their_disks_health_through_sbod_export() {
    let mut env = Env {
        dir: tempfile::tempdir().unwrap(),
        vars: Vec::new(),
    };
    let smartctl = fake_smartctl(env.dir.path());
    env.vars = vec![
        ("SBOD_SMARTCTL", smartctl.display().to_string()),
        ("SBOD_SMARTCTL_FILES", "1".into()),
        ("SBOD_HOTPLUG", "0".into()),
    ];
    let d = env.dir.path();
    for f in ["d0.img", "d1.img", "d2.img"] {
        std::fs::File::create(d.join(f))
            .unwrap()
            .set_len(64 << 20)
            .unwrap();
    }
    let sock = d.join("node.sock");
    let mut export = env
        .cmd(&[
            "export",
            "d0.img",
            "d1.img",
            "--nbd",
            &format!("unix:{}", sock.display()),
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    struct Kill(Vec<std::process::Child>);
    impl Drop for Kill {
        fn drop(&mut self) {
            for c in &mut self.0 {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
    let kit_sock = d.join("kit.sock");
    let kit = Command::new("nbdkit")
        .args(["--foreground", "--exit-with-parent", "--unix"])
        .arg(&kit_sock)
        .arg("file")
        .arg(d.join("d2.img"))
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("nbdkit is not installed: run scripts/deps.sh");
    let t = std::time::Instant::now();
    while !(sock.exists() && kit_sock.exists()) {
        assert!(t.elapsed().as_secs() < 30, "the exports did not come up");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let _ = export.try_wait();
    let _guard = Kill(vec![export, kit]);
    let uri = |n: &str, s: &std::path::Path| format!("nbd+unix:///{n}?socket={}", s.display());
    let (u0, u1, u2) = (
        uri("d0.img", &sock),
        uri("d1.img", &sock),
        uri("", &kit_sock),
    );
    env.ok(&["create", "rh", "--level", "raid1", &u0, &u1, &u2]);
    let out: Value = serde_json::from_str(&env.ok(&["health", "rh", "--json"])).unwrap();
    let members = out["members"].as_array().unwrap().clone();
    let of = |part: &str| {
        members
            .iter()
            .find(|m| m["path"].as_str().is_some_and(|p| p.contains(part)))
            .unwrap_or_else(|| panic!("{part} not in {members:#?}"))["health"]
            .clone()
    };
    let (h0, h1, h2) = (of("d0.img"), of("d1.img"), of("kit.sock"));
    assert_eq!(h0["verdict"], "failing", "{h0:#}");
    assert_eq!(h1["verdict"], "ok", "{h1:#}");
    assert!(h0["reasons"].to_string().contains("sbod export"), "{h0:#}");
    assert_eq!(h2["verdict"], "unavailable", "{h2:#}");
    assert!(
        h2["reasons"].to_string().contains("does not report"),
        "{h2:#}"
    );
    env.ok(&["forget", "rh"]);
}

/// The rack of crates/sbod-health's fake tree, its disks' device files made 32 MiB long
/// so that sbod uses them as members (as files; health sees the disks the tree describes:
/// identity, enclosure slot, LEDs, the two LUNs of one drive).
fn rack_of_files() -> faketree::Tree {
    let t = faketree::rack();
    for d in ["sdc", "sdd", "sde", "sdf", "nvme0n1"] {
        size_dev(&t, d);
    }
    t
}

fn size_dev(t: &faketree::Tree, name: &str) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(t.p(&format!("dev/{name}")))
        .unwrap()
        .set_len(32 << 20)
        .unwrap();
}

fn dev(t: &faketree::Tree, name: &str) -> String {
    t.p(&format!("dev/{name}")).display().to_string()
}

/// Issue 28: a device that is the other LUN of a member's dual-actuator drive, added,
/// replacing another or growing the array later, gets that member's recorded failure
/// domain (as `create` puts two such LUNs in one), so the array's domain rules keep them
/// apart: `replace` onto it in a two-way mirror is refused, saying why it has that
/// domain; `add` makes it a spare in that domain. Where the member on the drive has no
/// domain, an array that survives one failure refuses it (add, replace, grow) unless
/// forced, saying what to do; nothing is changed by a refusal.
#[test]
fn a_lun_of_a_members_drive_joins_its_failure_domain() {
    let t = rack_of_files();
    let mut e = Env {
        dir: tempfile::tempdir().unwrap(),
        vars: Vec::new(),
    };
    let smartctl = fake_smartctl(e.dir.path());
    e.vars = vec![
        ("SBOD_SYSFS_ROOT", t.root().display().to_string()),
        ("SBOD_SMARTCTL", smartctl.display().to_string()),
        ("SBOD_HOTPLUG", "0".into()),
    ];
    let (sdc, sdd, sde, sdf) = (
        dev(&t, "sdc"),
        dev(&t, "sdd"),
        dev(&t, "sde"),
        dev(&t, "sdf"),
    );
    let member = |st: &Value, path: &str| -> Option<Value> {
        st["members"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["path"] == path)
            .cloned()
    };
    e.ok(&[
        "create",
        "da",
        "--level",
        "raid1",
        "--domains",
        "a,b",
        &sdc,
        &sdd,
    ]);
    let st: Value = serde_json::from_str(&e.ok(&["status", "da", "--json"])).unwrap();
    let d = member(&st, &sdd).unwrap();
    assert_eq!(
        d["identity"]["shared_drive"].as_str(),
        None,
        "its other LUN is not a member yet: {d:#}"
    );
    assert_eq!(d["location"]["slot"], "5", "the tree's disk is seen: {d:#}");
    // sde replacing sdc would put both LUNs of one drive in the mirror.
    let err = e.fails(&["replace", "da", &sdc, &sde]);
    assert!(
        err.contains("two LUNs of one dual-actuator drive (drive:ZJV0A2X1)")
            && err.contains("failure domain 'b'")
            && err.contains("another domain"),
        "{err}"
    );
    let st: Value = serde_json::from_str(&e.ok(&["status", "da", "--json"])).unwrap();
    assert_eq!(member(&st, &sdc).unwrap()["state"], "active", "{st:#}");
    assert!(member(&st, &sde).is_none(), "{st:#}");
    // As a spare it takes sdd's domain.
    e.ok(&["add", "da", &sde]);
    let st: Value = serde_json::from_str(&e.ok(&["status", "da", "--json"])).unwrap();
    let s = member(&st, &sde).unwrap();
    assert_eq!(
        (&s["state"], &s["domain"]),
        (&"spare".into(), &"b".into()),
        "{s:#}"
    );
    assert_eq!(
        member(&st, &sdd).unwrap()["identity"]["shared_drive"],
        "serial:ZJV0A2X1",
        "{st:#}"
    );
    e.ok(&["forget", "da"]);

    // Another drive's two LUNs: sdi a member without a domain (created alone), sdj its
    // other LUN joining a raid5 (one failure).
    t.scsi_disk("sdi", "0:0:7:0", "naa.5000c500d0e0f020", "ZJV0B000");
    t.scsi_disk("sdj", "0:0:7:1", "naa.5000c500d0e0f021", "ZJV0B000");
    t.scsi_disk("sdk", "0:0:8:0", "naa.5000c500d0e0f030", "ZL2C0030");
    for d in ["sdi", "sdj", "sdk"] {
        size_dev(&t, d);
    }
    let (sdi, sdj, sdk) = (dev(&t, "sdi"), dev(&t, "sdj"), dev(&t, "sdk"));
    let nvme = dev(&t, "nvme0n1");
    e.ok(&["create", "db", "--level", "raid5", &sdf, &sdi, &nvme]);
    for args in [
        vec!["add", "db", sdj.as_str()],
        vec!["replace", "db", sdf.as_str(), sdj.as_str()],
        vec!["grow", "db", "--add", sdj.as_str()],
    ] {
        let err = e.fails(&args);
        assert!(
            err.contains(&format!("{sdj} and member {sdi} are two LUNs"))
                && err.contains("no failure domain recorded")
                && err.contains("survives only one failure")
                && err.contains("another drive")
                && err.contains("--force"),
            "{args:?}: {err}"
        );
    }
    let st: Value = serde_json::from_str(&e.ok(&["status", "db", "--json"])).unwrap();
    assert_eq!(st["members"].as_array().unwrap().len(), 3, "{st:#}");
    // Forced, it is taken; a disk of another drive needs nothing.
    e.ok(&["add", "db", &sdj, "--force"]);
    e.ok(&["add", "db", &sdk]);
    let st: Value = serde_json::from_str(&e.ok(&["status", "db", "--json"])).unwrap();
    assert_eq!(member(&st, &sdj).unwrap()["state"], "spare", "{st:#}");
    assert_eq!(member(&st, &sdk).unwrap()["state"], "spare", "{st:#}");
    e.ok(&["forget", "db"]);
}

/// Hot-plug through the real serving process (issue 28), the kernel's events replaced by
/// a file the test appends to (`SBOD_HOTPLUG_EVENTS`) and sysfs by the fake tree: raid5
/// over sdc (enclosure Slot 03), sdf and nvme0n1, written through NBD. sdc fails and is
/// pulled (its fault LED lights), is written around, and is pushed back: the serving
/// process knows it by its WWN and gives it back, resynced from the bitmap (bounded),
/// the LED goes out, and the data reads back right through it. Then sdc fails again and
/// a blank disk arrives in its slot: left alone while autoreplace is off, and a disk in
/// another slot is never taken; with autoreplace on, it replaces sdc, and the data reads
/// back right through it.
#[test]
fn hot_plug_through_the_serving_process() {
    for t in ["nbdcopy", "nbdinfo", "nbdsh"] {
        common::need(t);
    }
    let t = rack_of_files();
    let events = t.p("events");
    let (sdc, sdf, nvme) = (dev(&t, "sdc"), dev(&t, "sdf"), dev(&t, "nvme0n1"));
    let s = Served::with(
        &[
            "create", "hv", "--level", "raid5", "--chunk", "64K", &sdc, &sdf, &nvme,
        ],
        vec![
            ("SBOD_SYSFS_ROOT", t.root().display().to_string()),
            ("SBOD_HOTPLUG_EVENTS", events.display().to_string()),
            // What the serving process leaves alone is said at info.
            ("SBOD_LOG", "warn,sbod_mgmt::health=info".into()),
        ],
    );
    let send = |line: &str| {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&events)
            .unwrap();
        writeln!(f, "{line}").unwrap();
    };
    let (uri, mut want) = s.filled(28);
    let vsize = want.len();
    let read_back = |what: &str, want: &[u8]| {
        let out = s.env.dir.path().join("out.img");
        let _ = std::fs::remove_file(&out);
        common::run(Command::new("nbdcopy").arg(&uri).arg(&out));
        assert!(
            std::fs::read(&out).unwrap() == want,
            "{what}: read-back differs"
        );
    };
    let pwrite = |off: usize, byte: u8, want: &mut Vec<u8>| {
        let path = format!("/usr/bin:{}", std::env::var("PATH").unwrap_or_default());
        common::run(Command::new("nbdsh").env("PATH", &path).args([
            "-u",
            &uri,
            "-c",
            &format!("h.pwrite(b'\\x{byte:02x}' * 65536, {off}); h.flush()"),
        ]));
        want[off..off + 65536].fill(byte);
    };
    let optimal = |st: &Value| st["state"] == "optimal";
    s.wait_for("optimal, sdc seen in its slot", |st, _| {
        optimal(st)
            && member(st, "/dev/sdc").is_some_and(|m| {
                m["location"]["slot"] == "3" && m["identity"]["wwn"] == "naa.5000c500a1b2c3d4"
            })
    });
    // The bits of the first write cleared: what sdc misses is what is written later.
    let st = s.wait_for("a clear bitmap", |st, _| st["dirty_regions"] == 0);
    let region = st["bitmap_region"].as_u64().unwrap();
    let member_size = member(&st, "/dev/sdc").unwrap()["size"].as_u64().unwrap();
    let fault = t.p("sys/class/enclosure/0:0:12:0/Slot 03/fault");
    let fault_led = || std::fs::read_to_string(&fault).unwrap().trim().to_string();
    assert_eq!(fault_led(), "0");

    // sdc fails and is pulled: gone from sysfs and its slot.
    let slot_dev = t.p("sys/class/enclosure/0:0:12:0/Slot 03/device");
    let sdc_sys = t.p("sys/class/block/sdc");
    let sdc_target = std::fs::read_link(&sdc_sys).unwrap();
    let slot_target = std::fs::read_link(&slot_dev).unwrap();
    s.env.ok(&["fail", "hv", &sdc]);
    s.wait_for("sdc's fault LED", |_, _| fault_led() == "1");
    std::fs::remove_file(&sdc_sys).unwrap();
    std::fs::remove_file(&slot_dev).unwrap();
    send("remove sdc");
    // Written while it is away: two places far apart.
    for off in [0, vsize / 2 / 65536 * 65536] {
        pwrite(off, 0x5a, &mut want);
    }
    // Pushed back in.
    std::os::unix::fs::symlink(&sdc_target, &sdc_sys).unwrap();
    std::os::unix::fs::symlink(&slot_target, &slot_dev).unwrap();
    send("add sdc");
    let st = s.wait_for("sdc given back and resynced", |st, _| {
        optimal(st)
            && st["recoveries"].as_array().is_some_and(|r| {
                r.iter()
                    .any(|r| r["path"] == sdc.as_str() && r["state"] == "done")
            })
    });
    let rec = st["recoveries"]
        .as_array()
        .unwrap()
        .iter()
        .rfind(|r| r["path"] == sdc.as_str())
        .unwrap()
        .clone();
    let got = rec["recovered_bytes"].as_u64().unwrap();
    assert!(
        rec["bitmap"] == true && got > 0 && got <= 4 * region && got < member_size / 4,
        "a bounded resync from the bitmap: {got} bytes of a {member_size}-byte member, region {region}: {rec}"
    );
    let log = std::fs::read_to_string(&s.log).unwrap();
    assert!(log.contains("is a former member: given back"), "{log}");
    s.wait_for("sdc's fault LED out", |_, _| fault_led() == "0");
    read_back("after sdc came back", &want);
    // It holds what was written while it was away: read through it.
    s.env.ok(&["fail", "hv", &sdf]);
    read_back("through the returned sdc", &want);
    s.env.ok(&["add", "hv", &sdf]);
    s.wait_for("optimal with sdf back", |st, _| optimal(st));

    // sdc fails again and is pulled for good; a blank disk arrives in Slot 03.
    s.env.ok(&["fail", "hv", &sdc]);
    s.wait_for("sdc's fault LED again", |_, _| fault_led() == "1");
    std::fs::remove_file(&sdc_sys).unwrap();
    std::fs::remove_file(&slot_dev).unwrap();
    pwrite(vsize / 4 / 65536 * 65536, 0xa5, &mut want);
    let sdg = t.scsi_disk("sdg", "0:0:9:0", "naa.5000c500ffff0001", "NEW00001");
    size_dev(&t, "sdg");
    std::os::unix::fs::symlink(t.p(&sdg), &slot_dev).unwrap();
    send("add sdg");
    s.wait_for("the blank disk left alone", |_, log| {
        log.contains("autoreplace is off")
    });
    let st = s.status();
    assert_eq!(st["state"], "degraded", "{st:#}");
    assert!(
        member(&st, "/dev/sdg").is_none(),
        "taken without autoreplace: {st:#}"
    );
    // Autoreplace on: a blank disk in another slot is still not taken...
    s.env
        .ok(&["set", "hv", "--health-policy", "autoreplace=on"]);
    let sdh = t.scsi_disk("sdh", "0:0:10:0", "naa.5000c500ffff0002", "NEW00002");
    size_dev(&t, "sdh");
    std::os::unix::fs::symlink(
        t.p(&sdh),
        t.p("sys/class/enclosure/0:0:12:0/Slot 04/device"),
    )
    .unwrap();
    send("add sdh");
    s.wait_for("the disk in another slot left alone", |_, log| {
        log.contains("no failed member was in that slot")
    });
    // ...and the one in sdc's slot replaces it.
    send("add sdg");
    let st = s.wait_for("sdg in sdc's place", |st, _| {
        optimal(st) && member(st, "/dev/sdg").is_some_and(|m| m["state"] == "active")
    });
    assert_eq!(member(&st, "/dev/sdg").unwrap()["slot"], 0, "{st:#}");
    assert!(member(&st, "/dev/sdh").is_none(), "{st:#}");
    let log = std::fs::read_to_string(&s.log).unwrap();
    assert!(log.contains("replaces it (autoreplace)"), "{log}");
    s.wait_for("the slot's fault LED out", |_, _| fault_led() == "0");
    read_back("after the autoreplace", &want);
    s.env.ok(&["fail", "hv", &nvme]);
    read_back("through sdg", &want);
}

/// Issue 28: a member failed by I/O errors that answers again is taken back from the
/// bitmap after the grace period the operator sets (`rejoin_after`, Ceph's down-out
/// interval), and not while it still fails. raid5 over four nbdkit exports, k0's behind
/// nbdkit's error filter (EIO on every request while a file exists): a write fails it;
/// more is written; while it still fails the serving process tries it and leaves it out;
/// once the errors stop it is taken back, resynced from the bitmap (bounded), and the data
/// reads back right through it.
#[test]
fn a_member_failed_by_io_errors_is_taken_back_after_the_grace_period() {
    for t in ["nbdkit", "nbdcopy", "nbdsh", "nbdinfo"] {
        common::need(t);
    }
    let kits = tempfile::tempdir().unwrap();
    let k = kits.path();
    let errors = k.join("k0.errors");
    let mut procs = common::Procs::default();
    let mut members = Vec::new();
    for i in 0..4 {
        let img = k.join(format!("k{i}.img"));
        std::fs::File::create(&img)
            .unwrap()
            .set_len(24 << 20)
            .unwrap();
        let sock = k.join(format!("k{i}.sock"));
        let mut c = Command::new("nbdkit");
        c.args(["--foreground", "--exit-with-parent", "-U"])
            .arg(&sock);
        if i == 0 {
            c.arg("--filter=error");
        }
        c.args(["file", "cache=none"]).arg(&img);
        if i == 0 {
            c.args(["error=EIO", "error-rate=100%"])
                .arg(format!("error-file={}", errors.display()));
        }
        procs.spawn(&format!("k{i}"), &mut c);
        members.push(format!("nbd+unix:///?socket={}", sock.display()));
    }
    for m in &members {
        common::wait_nbd(m, std::time::Duration::from_secs(20));
    }
    let mut create = vec!["create", "hv", "--level", "raid5", "--chunk", "64K"];
    create.extend(members.iter().map(String::as_str));
    let s = Served::with(&create, vec![("SBOD_HOTPLUG", "0".into())]);
    let (uri, mut want) = s.filled(30);
    let vsize = want.len();
    let optimal = |st: &Value| st["state"] == "optimal";
    let st = s.wait_for("optimal with a clear bitmap", |st, _| {
        optimal(st) && st["dirty_regions"] == 0
    });
    let region = st["bitmap_region"].as_u64().unwrap();
    let member_size = st["members"][0]["size"].as_u64().unwrap();
    s.env
        .ok(&["set", "hv", "--health-policy", "rejoin_after=1"]);
    let pwrite = |off: usize, len: usize, byte: u8, want: &mut Vec<u8>| {
        let path = format!("/usr/bin:{}", std::env::var("PATH").unwrap_or_default());
        common::run(Command::new("nbdsh").env("PATH", &path).args([
            "-u",
            &uri,
            "-c",
            &format!("h.pwrite(b'\\x{byte:02x}' * {len}, {off}); h.flush()"),
        ]));
        want[off..off + len].fill(byte);
    };
    // k0 fails every request now: a write across a whole stripe fails it.
    std::fs::write(&errors, "").unwrap();
    pwrite(0, 4 << 16, 0x11, &mut want);
    let st = s.wait_for("k0 failed by I/O errors", |st, _| {
        st["members"][0]["state"] == "failed"
    });
    let why = st["members"][0]["reason"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        why.contains("error") && !why.contains("administrator"),
        "{st:#}"
    );
    let mid = vsize / 2 / 65536 * 65536;
    pwrite(mid, 65536, 0x22, &mut want);
    // Tried while it still fails: left out.
    let st = s.wait_for("k0 tried and left out", |_, log| {
        log.contains("still not taken back")
    });
    assert_eq!(st["members"][0]["state"], "failed", "{st:#}");
    // The errors stop: taken back at the next try.
    std::fs::remove_file(&errors).unwrap();
    let st = s.wait_for("k0 taken back and resynced", |st, _| {
        optimal(st)
            && st["recoveries"].as_array().is_some_and(|r| {
                r.iter()
                    .any(|r| r["path"] == members[0].as_str() && r["state"] == "done")
            })
    });
    let rec = st["recoveries"]
        .as_array()
        .unwrap()
        .iter()
        .rfind(|r| r["path"] == members[0].as_str())
        .unwrap()
        .clone();
    let got = rec["recovered_bytes"].as_u64().unwrap();
    assert!(
        rec["bitmap"] == true && got > 0 && got <= 3 * region && got < member_size / 4,
        "a bounded resync from the bitmap: {got} bytes of a {member_size}-byte member, region {region}: {rec}"
    );
    let log = std::fs::read_to_string(&s.log).unwrap();
    assert!(
        log.contains("taken back from the write-intent bitmap"),
        "{log}"
    );
    let out = s.env.dir.path().join("out.img");
    common::run(Command::new("nbdcopy").arg(&uri).arg(&out));
    assert!(std::fs::read(&out).unwrap() == want, "read-back differs");
    s.env.ok(&["fail", "hv", &members[1]]);
    common::run(Command::new("nbdcopy").arg(&uri).arg(&out));
    assert!(
        std::fs::read(&out).unwrap() == want,
        "read through the returned k0 differs"
    );
}
