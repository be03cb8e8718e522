//! Every management verb with the state directory full (a small tmpfs filled up) or
//! read-only (the tmpfs remounted read-only), through the real `sbod` binary, on a served
//! array and on one nothing serves. Each verb either happens whole or is refused with a
//! message that names the state directory, having changed nothing: the members'
//! superblocks (`sbod examine --json`), the server's state (`sbod status --json`), no temp
//! file in the state directory, no member file made for the command left behind or
//! deleted while the array uses it. Afterwards, with the state directory writable again,
//! each array starts normally (no `--degraded`). Needs root (mount).

mod common;

use common::{Procs, Sbod};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A tmpfs mounted for the test, unmounted when it ends (also on failure).
struct Tmpfs {
    at: PathBuf,
}

impl Tmpfs {
    fn mount(at: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(at).unwrap();
        let o = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .output()
            .expect("mount is installed");
        assert!(
            o.status.success(),
            "mounting a tmpfs needs root: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        Tmpfs {
            at: at.to_path_buf(),
        }
    }

    fn remount(&self, how: &str) {
        let o = Command::new("mount")
            .args(["-o", &format!("remount,{how}")])
            .arg(&self.at)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }

    /// Fill it up: a file grows until the file system has no room left.
    fn fill(&self) {
        use std::io::Write;
        let mut f = std::fs::File::create(self.at.join("filler")).unwrap();
        let block = vec![0x55u8; 4096];
        while f.write_all(&block).is_ok() {}
        let _ = f.sync_all();
        // Proof that it is full: not one more byte fits.
        assert!(std::fs::write(self.at.join("probe"), [1u8; 4096]).is_err());
        let _ = std::fs::remove_file(self.at.join("probe"));
    }

    fn unfill(&self) {
        std::fs::remove_file(self.at.join("filler")).unwrap();
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.at).status();
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Broken {
    Full,
    ReadOnly,
}

/// Dropped in this order: the servers, the mount, then the work folder.
struct Rig {
    procs: Procs,
    state: Tmpfs,
    sbod: Sbod,
    how: Broken,
    _work: tempfile::TempDir,
}

/// What must not change: every member's superblock, as `sbod examine --json` shows it.
fn examine(s: &Sbod, paths: &[String]) -> Value {
    let o = s
        .cmd(
            &[
                &["examine", "--json"],
                &paths.iter().map(|p| p.as_str()).collect::<Vec<_>>()[..],
            ]
            .concat(),
        )
        .output()
        .unwrap();
    serde_json::from_slice(&o.stdout).unwrap()
}

/// The server's view that must not change: the array's state and each member's path and
/// state.
fn view(s: &Value) -> Value {
    let members: Vec<Value> = s["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| serde_json::json!([m["path"], m["state"], m["slot"]]))
        .collect();
    serde_json::json!({"state": s["state"], "members": members, "running": s["running"]})
}

impl Rig {
    fn path(&self, rel: &str) -> String {
        self.sbod.dir.join(rel).display().to_string()
    }

    fn members(&self, prefix: &str, n: usize) -> Vec<String> {
        (0..n)
            .map(|i| self.path(&format!("disks/{prefix}{i}.img")))
            .collect()
    }

    /// Temp files left in the state directory.
    fn temp_files(&self) -> Vec<String> {
        let mut v = Vec::new();
        for d in [self.state.at.clone(), self.state.at.join("arrays")] {
            if let Ok(rd) = std::fs::read_dir(&d) {
                for e in rd.flatten() {
                    let n = e.file_name().to_string_lossy().to_string();
                    if n.ends_with(".tmp") {
                        v.push(n);
                    }
                }
            }
        }
        v
    }

    /// Files of this test that a process holds open after they were deleted.
    fn deleted_but_open(&self) -> Vec<String> {
        let mut v = Vec::new();
        let root = self.sbod.dir.display().to_string();
        for (_, c) in &self.procs.0 {
            let fd = format!("/proc/{}/fd", c.id());
            for e in std::fs::read_dir(&fd).into_iter().flatten().flatten() {
                if let Ok(t) = std::fs::read_link(e.path()) {
                    let t = t.display().to_string();
                    if t.starts_with(&root) && t.ends_with("(deleted)") {
                        v.push(t);
                    }
                }
            }
        }
        v
    }

    fn new() -> Rig {
        common::need("nbdinfo");
        let work = tempfile::tempdir().unwrap();
        let sbod = Sbod::new(work.path());
        let state = Tmpfs::mount(&work.path().join("state"), "2M");
        Rig {
            procs: Procs::default(),
            state,
            sbod,
            how: Broken::Full,
            _work: work,
        }
    }

    fn break_it(&mut self, how: Broken) {
        self.how = how;
        match how {
            Broken::Full => self.state.fill(),
            Broken::ReadOnly => self.state.remount("ro"),
        }
    }

    fn mend(&self) {
        match self.how {
            Broken::Full => self.state.unfill(),
            Broken::ReadOnly => self.state.remount("rw"),
        }
    }

    /// Run a verb that must be refused because of the state directory, changing nothing
    /// on `members` nor in what `name` reports.
    fn refused(&self, args: &[&str], name: &str, members: &[String], made: &[String]) {
        let sb = examine(&self.sbod, members);
        let st = view(&self.sbod.status(name));
        let o = self.sbod.cmd(args).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr).to_string();
        let what = format!("{:?}: sbod {args:?}: {err}", self.how);
        // What it did first (nothing), then what it said.
        assert_eq!(self.deleted_but_open(), Vec::<String>::new(), "{what}");
        assert_eq!(view(&self.sbod.status(name)), st, "{what}: state changed");
        assert_eq!(
            examine(&self.sbod, members),
            sb,
            "{what}: superblocks changed"
        );
        assert_eq!(self.temp_files(), Vec::<String>::new(), "{what}: temp file");
        for m in made {
            assert!(!Path::new(m).exists(), "{what}: {m} was left behind");
        }
        assert_eq!(o.status.code(), Some(1), "{what}: should be refused");
        assert!(err.contains("state directory"), "{what}");
        assert!(err.contains("nothing was changed"), "{what}");
        let fix = match self.how {
            Broken::Full => "free space",
            Broken::ReadOnly => "read-write",
        };
        assert!(err.contains(fix), "{what}: no remedy");
    }
}

fn each_verb_happens_whole_or_not_at_all(how: Broken) {
    let mut r = Rig::new();
    // A served raid5 with a spare, and one nothing serves.
    let vs = r.members("s", 5);
    let vo = r.members("o", 4);
    let sa: Vec<&str> = vs.iter().map(|s| s.as_str()).collect();
    let oa: Vec<&str> = vo.iter().map(|s| s.as_str()).collect();
    r.sbod.ok(&[
        &[
            "create",
            "vs",
            "-l",
            "raid5",
            "--spares",
            "1",
            "--size-each",
            "32M",
        ],
        &sa[..],
    ]
    .concat());
    r.sbod.ok(&[
        &["create", "vo", "-l", "raid5", "--size-each", "32M"],
        &oa[..],
    ]
    .concat());
    let mut procs = Procs::default();
    r.sbod.serve(&mut procs, "vs");
    r.procs = procs;
    let before_vs = view(&r.sbod.status("vs"));
    let before_vo = view(&r.sbod.status("vo"));
    r.break_it(how);

    let new = r.path("disks/new.img");
    for (name, m) in [("vs", &vs), ("vo", &vo)] {
        r.refused(&["fail", name, &m[0]], name, m, &[]);
        r.refused(
            &["replace", name, &m[1], &new, "--size", "64M"],
            name,
            m,
            std::slice::from_ref(&new),
        );
        r.refused(
            &["add", name, &new, "--size", "64M"],
            name,
            m,
            std::slice::from_ref(&new),
        );
    }
    r.refused(&["remove", "vs", &vs[4]], "vs", &vs, &[]);
    r.refused(&["serve", "vo"], "vo", &vo, &[]);
    r.refused(
        &[&["assemble", "--name", "vx"], &oa[..]].concat(),
        "vo",
        &vo,
        &[],
    );
    // A new array: over files made for it (none left), and over existing files (no
    // superblock left on them).
    let fresh = r.members("n", 3);
    let fa: Vec<&str> = fresh.iter().map(|s| s.as_str()).collect();
    r.refused(
        &[
            &["create", "vn", "-l", "raid5", "--size-each", "32M"],
            &fa[..],
        ]
        .concat(),
        "vo",
        &vo,
        &fresh,
    );
    for f in &fresh {
        std::fs::write(f, []).unwrap();
        std::fs::File::options()
            .write(true)
            .open(f)
            .unwrap()
            .set_len(32 << 20)
            .unwrap();
    }
    r.refused(
        &[&["create", "vn", "-l", "raid5"], &fa[..]].concat(),
        "vo",
        &vo,
        &[],
    );
    for f in &fresh {
        let e = examine(&r.sbod, std::slice::from_ref(f));
        assert!(
            e[0]["error"].is_string(),
            "{how:?}: {f} has a superblock: {e}"
        );
    }
    // `set` needs no registration: it happens (on the members, or in the server).
    r.sbod.ok(&["set", "vs", "--rebuild-max-rate", "100M"]);
    // `forget` removes the registration: happens where the directory can change it.
    match how {
        Broken::Full => {}
        Broken::ReadOnly => {
            let o = r.sbod.cmd(&["forget", "vo"]).output().unwrap();
            assert!(!o.status.success());
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(err.contains("state directory"), "{err}");
            assert_eq!(view(&r.sbod.status("vo")), before_vo);
        }
    }
    // `stop` stops a served array cleanly though its registration cannot be refreshed.
    r.sbod.ok(&["stop", "vs"]);
    if let Some((_, mut c)) = r.procs.0.pop() {
        c.wait().unwrap();
    }
    assert_eq!(
        r.temp_files(),
        Vec::<String>::new(),
        "{how:?}: stop left a temp file"
    );

    // Mended, both arrays start as they were: nothing needs --degraded or a rebuild.
    r.mend();
    let mut procs = Procs::default();
    r.sbod.serve(&mut procs, "vs");
    r.procs = procs;
    let after = view(&r.sbod.status("vs"));
    assert_eq!(after, before_vs, "{how:?}: vs after the refusals");
    assert_eq!(view(&r.sbod.status("vo")), before_vo, "{how:?}: vo");
    let st = r.sbod.status("vs");
    assert_eq!(st["state"], "optimal", "{st:#}");
    r.sbod.ok(&["stop", "vs"]);
    if let Some((_, mut c)) = r.procs.0.pop() {
        c.wait().unwrap();
    }
    // And the verbs work again.
    r.sbod.ok(&["replace", "vo", &vo[1], &new, "--size", "64M"]);
    let st = r.sbod.status("vo");
    assert_eq!(st["state"], "optimal", "{st:#}");
}

#[test]
fn verbs_with_the_state_directory_full() {
    each_verb_happens_whole_or_not_at_all(Broken::Full);
}

#[test]
fn verbs_with_the_state_directory_read_only() {
    each_verb_happens_whole_or_not_at_all(Broken::ReadOnly);
}

/// The report of issue 25 as it was: `replace` on a served raid5 with the state directory
/// full printed ENOSPC and exited 1, yet the server took the new member and rebuilt onto
/// it, the CLI deleted the file the array then used, and after `stop` the array started
/// only `--degraded`.
#[test]
fn replace_on_a_served_array_with_the_state_directory_full() {
    let mut r = Rig::new();
    let vs = r.members("s", 4);
    let sa: Vec<&str> = vs.iter().map(|s| s.as_str()).collect();
    r.sbod.ok(&[
        &["create", "vs", "-l", "raid5", "--size-each", "32M"],
        &sa[..],
    ]
    .concat());
    let mut procs = Procs::default();
    r.sbod.serve(&mut procs, "vs");
    r.procs = procs;
    let before = view(&r.sbod.status("vs"));
    r.break_it(Broken::Full);
    let new = r.path("disks/new.img");
    r.refused(
        &["replace", "vs", &vs[1], &new, "--size", "64M"],
        "vs",
        &vs,
        std::slice::from_ref(&new),
    );
    r.sbod.ok(&["stop", "vs"]);
    if let Some((_, mut c)) = r.procs.0.pop() {
        c.wait().unwrap();
    }
    r.mend();
    let mut procs = Procs::default();
    r.sbod.serve(&mut procs, "vs");
    r.procs = procs;
    assert_eq!(view(&r.sbod.status("vs")), before);
}
