//! Issue 28 end to end through the `sbod` command: members that are files say their health
//! is not available (with the reason) in `status`, `status --json` and `health`, rather
//! than guess; the health policy is set, refused when wrong, and shown; `locate` on a file
//! member is refused with the reason. (The parser, sysfs, LEDs, hot-plug and the real
//! smartctl on this machine's disks are tested in crates/sbod-health.)

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
    /// An array `hv` of the given members, served with the fake smartctl and a fast tick.
    fn new(create: &[&str]) -> Served {
        let mut env = Env {
            dir: tempfile::tempdir().unwrap(),
            vars: Vec::new(),
        };
        let smartctl = fake_smartctl(env.dir.path());
        env.vars = vec![
            ("SBOD_SMARTCTL", smartctl.display().to_string()),
            ("SBOD_SMARTCTL_FILES", "1".into()),
            ("SBOD_HEALTH_TICK_MS", "100".into()),
            ("SBOD_HOTPLUG", "0".into()),
        ];
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
