//! Issue 28 end to end through the `sbod` command: members that are files say their health
//! is not available (with the reason) in `status`, `status --json` and `health`, rather
//! than guess; the health policy is set, refused when wrong, and shown; `locate` on a file
//! member is refused with the reason. (The parser, sysfs, LEDs, hot-plug and the real
//! smartctl on this machine's disks are tested in crates/sbod-health.)

use serde_json::Value;
use std::process::{Command, Output};

struct Env {
    dir: tempfile::TempDir,
}

impl Env {
    fn run(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_sbod"))
            .args(args)
            .current_dir(self.dir.path())
            .env("SBOD_STATE_DIR", self.dir.path().join("state"))
            .output()
            .expect("run sbod")
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
