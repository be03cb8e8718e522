//! The `sbod` command end to end on real files (offline: no server running).

use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};

struct Env {
    dir: tempfile::TempDir,
}

impl Env {
    fn new() -> Env {
        Env {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn path(&self, p: &str) -> String {
        self.dir.path().join(p).display().to_string()
    }

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

    fn status(&self, name: &str) -> Value {
        serde_json::from_str(&self.ok(&["status", name, "--json"])).unwrap()
    }
}

fn disks(n: usize, prefix: &str) -> Vec<String> {
    (0..n).map(|i| format!("disks/{prefix}{i}.img")).collect()
}

fn args<'a>(head: &[&'a str], tail: &'a [String]) -> Vec<&'a str> {
    head.iter()
        .copied()
        .chain(tail.iter().map(|s| s.as_str()))
        .collect()
}

#[test]
fn create_fail_replace_scrub_status() {
    let e = Env::new();
    let d = disks(8, "d");
    let out = e.ok(&args(
        &[
            "create",
            "vol0",
            "--level",
            "raid6",
            "--chunk",
            "64K",
            "--size-each",
            "40M",
        ],
        &d,
    ));
    assert!(out.contains("created vol0"), "{out}");
    let s = e.status("vol0");
    assert_eq!(s["state"], "optimal");
    assert_eq!(s["level"], "raid6");
    assert_eq!(s["members"].as_array().unwrap().len(), 8);
    assert_eq!(s["running"], false);
    // Human sizes: 8 x 39 MiB of data (1 MiB metadata) in raid6 = 6 x 39 MiB.
    assert_eq!(s["size"].as_u64().unwrap(), 6 * 39 * 1024 * 1024);

    e.ok(&["fail", "vol0", "disks/d3.img"]);
    let s = e.status("vol0");
    assert_eq!(s["state"], "degraded");
    let m3 = &s["members"][3];
    assert_eq!(m3["state"], "failed");
    assert!(m3["path"].as_str().unwrap().ends_with("disks/d3.img"));

    e.ok(&[
        "replace",
        "vol0",
        "disks/d3.img",
        "disks/d8.img",
        "--size",
        "40M",
    ]);
    let s = e.status("vol0");
    assert_eq!(s["state"], "optimal", "{s}");
    assert!(s["members"][3]["path"]
        .as_str()
        .unwrap()
        .ends_with("disks/d8.img"));

    let out = e.ok(&["scrub", "vol0"]);
    assert!(out.contains("0 mismatched"), "{out}");
    let j: Value = serde_json::from_str(&e.ok(&["scrub", "vol0", "--json"])).unwrap();
    assert_eq!(j["mismatches"], 0);
    assert_eq!(j["kind"], "check");

    // Examine reads the superblock.
    let ex: Value = serde_json::from_str(&e.ok(&["examine", "disks/d0.img", "--json"])).unwrap();
    assert_eq!(ex[0]["superblock"]["name"], "vol0");

    // Stop when nothing serves it is harmless; forget + assemble brings it back.
    assert!(e.ok(&["stop", "vol0"]).contains("not running"));
    e.ok(&["forget", "vol0"]);
    let members: Vec<String> = (0..8)
        .map(|i| {
            if i == 3 {
                "disks/d8.img".into()
            } else {
                format!("disks/d{i}.img")
            }
        })
        .collect();
    let out = e.ok(&args(&["assemble"], &members));
    assert!(out.contains("assembled vol0"), "{out}");
    assert_eq!(e.status("vol0")["state"], "optimal");
}

#[test]
fn bad_input_gets_clear_errors_and_harms_nothing() {
    let e = Env::new();
    let d = disks(4, "d");
    e.ok(&args(
        &["create", "vol0", "--level", "raid5", "--size-each", "16M"],
        &d,
    ));
    // Same name again.
    let err = e.fails(&args(
        &["create", "vol0", "--level", "raid5", "--size-each", "16M"],
        &disks(4, "x"),
    ));
    assert!(err.contains("already registered"), "{err}");
    // A member of another array.
    let err = e.fails(&[
        "create",
        "vol1",
        "--level",
        "raid1",
        "disks/d0.img",
        "disks/d1.img",
    ]);
    assert!(
        err.contains("member of sbod array 'vol0'") && err.contains("--force"),
        "{err}"
    );
    // Geometry errors say what would work.
    let err = e.fails(&args(
        &[
            "create",
            "vol2",
            "--level",
            "raid6",
            "--groups",
            "3",
            "--size-each",
            "16M",
        ],
        &disks(8, "g"),
    ));
    assert!(
        err.contains("don't split into 3 equal groups") && err.contains("1, 2, 4, 8"),
        "{err}"
    );
    let err = e.fails(&["create", "vol3", "--level", "ec:8", "a.img"]);
    assert!(err.contains("ec:K+M"), "{err}");
    let err = e.fails(&[
        "create",
        "vol3",
        "--level",
        "raid5",
        "--chunk",
        "3K",
        "--size-each",
        "16M",
        "c0",
        "c1",
        "c2",
    ]);
    assert!(err.contains("power of two"), "{err}");
    // Failure domains: two members of a raid5 group in one enclosure.
    let err = e.fails(&args(
        &[
            "create",
            "vol4",
            "--level",
            "raid5",
            "--size-each",
            "16M",
            "--domains",
            "enc1,enc1,enc2",
        ],
        &disks(3, "f"),
    ));
    assert!(
        err.contains("failure domain 'enc1'") && err.contains("--force"),
        "{err}"
    );
    e.ok(&args(
        &[
            "create",
            "vol4",
            "--level",
            "raid5",
            "--size-each",
            "16M",
            "--domains",
            "enc1,enc2,enc3",
        ],
        &disks(3, "f"),
    ));
    // Unknown array, unknown member.
    let err = e.fails(&["status", "nope"]);
    assert!(
        err.contains("no array named 'nope'") && err.contains("vol0"),
        "{err}"
    );
    let err = e.fails(&["fail", "vol0", "disks/zz.img"]);
    assert!(err.contains("not a member"), "{err}");
    // Failing past the redundancy is refused, saying what would be lost; forced, the
    // array reports failed and the command says so.
    let out = e.ok(&["fail", "vol0", "disks/d0.img"]);
    assert!(out.contains("degraded") && !out.contains("FAILED"), "{out}");
    let err = e.fails(&["fail", "vol0", "disks/d1.img"]);
    assert!(
        err.contains("would leave group 0 of 'vol0' with 2 working members of 4")
            && err.contains("raid5 survives 1")
            && err.contains("--force"),
        "{err}"
    );
    assert_eq!(e.status("vol0")["state"], "degraded");
    let out = e.ok(&["fail", "vol0", "disks/d1.img", "--force"]);
    assert!(out.contains("has FAILED"), "{out}");
    let s = e.status("vol0");
    assert_eq!(s["state"], "failed");
    assert!(s["failed_reason"]
        .as_str()
        .unwrap()
        .contains("survives only 1"));
    // The other array is untouched.
    assert_eq!(e.status("vol4")["state"], "optimal");
    assert!(Path::new(&e.path("state/arrays/vol4.json")).exists());
}

/// Everything under `dir` except sbod's state directory, as sorted relative paths.
fn listing(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(dir).unwrap().display().to_string();
            if rel == "state" {
                continue;
            }
            if p.is_dir() {
                stack.push(p.clone());
            }
            out.push(rel);
        }
    }
    out.sort();
    out
}

#[test]
fn create_checks_every_value_before_it_creates_anything() {
    let e = Env::new();
    let d = disks(3, "d");
    // (arguments, what the message must name)
    let cases: &[(&[&str], &str)] = &[
        (&["--level", "raid5", "--chunk", "0"], "--chunk 0"),
        (&["--level", "raid5", "--chunk", "3K"], "power of two"),
        (&["--level", "raid5", "--chunk", "32M"], "4K to 16M"),
        (&["--level", "raid5", "--chunk", "5000000000"], "--chunk"),
        (&["--level", "raid5", "--groups", "0"], "--groups 0"),
        (&["--level", "raid5", "--groups", "5000"], "groups"),
        (&["--level", "raid10", "--copies", "0"], "--copies 0"),
        (&["--level", "raid10", "--copies", "1"], "--copies 1"),
        (&["--level", "raid10", "--copies", "4"], "multiple of 4"),
        (&["--level", "raid5", "--spares", "3"], "--spares 3"),
        (&["--level", "raid6"], "at least 4 members"),
        (&["--level", "ec:2+2"], "exactly 4 members"),
        (
            &["--level", "raid5", "--bitmap-region", "0"],
            "--bitmap-region 0",
        ),
        (
            &["--level", "raid5", "--bitmap-region", "100K"],
            "multiple of the chunk",
        ),
        (&["--level", "raid5", "--size-each", "16E"], "too large"),
        (&["--level", "raid5", "--size-each", "15E"], "at most"),
        (&["--level", "raid5", "--size-each", "100K"], "at least"),
    ];
    for (extra, want) in cases {
        let mut a = vec!["create", "x"];
        a.extend_from_slice(extra);
        if !extra.contains(&"--size-each") {
            a.extend(["--size-each", "64M"]);
        }
        a.extend(d.iter().map(|s| s.as_str()));
        let o = e.run(&a);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{a:?} was accepted");
        // 1: refused by sbod; 2: refused by the argument parser (a size out of range).
        assert!(matches!(o.status.code(), Some(1 | 2)), "{a:?}: {err}");
        assert!(!err.contains("panicked"), "{a:?}: {err}");
        assert!(err.contains(want), "{a:?}: wanted '{want}' in: {err}");
        assert!(
            listing(e.dir.path()).is_empty(),
            "{a:?} left {:?}",
            listing(e.dir.path())
        );
        assert!(!Path::new(&e.path("state/arrays/x.json")).exists());
    }
    // A refusal that only the members can reveal (domains) removes the files and the
    // directory it made for them.
    let err = e.fails(&args(
        &[
            "create",
            "x",
            "--level",
            "raid5",
            "--size-each",
            "8M",
            "--domains",
            "a,a,b",
        ],
        &d,
    ));
    assert!(err.contains("failure domain"), "{err}");
    assert!(
        listing(e.dir.path()).is_empty(),
        "{:?}",
        listing(e.dir.path())
    );
    // Files that were there before are left alone.
    std::fs::write(e.path("keep.img"), b"mine").unwrap();
    e.fails(&[
        "create",
        "x",
        "--level",
        "raid5",
        "--chunk",
        "0",
        "--size-each",
        "8M",
        "keep.img",
        "n1",
        "n2",
    ]);
    assert_eq!(listing(e.dir.path()), vec!["keep.img".to_string()]);
    assert_eq!(std::fs::read(e.path("keep.img")).unwrap(), b"mine");
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 40, ..Default::default() })]

    /// Random create arguments: sbod never panics; what it refuses leaves the directory
    /// as it was; what it accepts it can show and forget.
    #[test]
    fn random_create_arguments_never_panic_or_leave_files(
        level in proptest::sample::select(vec!["raid0", "raid1", "raid10", "raid5", "raid6", "ec:2+1", "ec:3+2", "concat"]),
        members in 1usize..7,
        chunk in proptest::sample::select(vec!["0", "1", "512", "3K", "4K", "64K", "1M", "16M", "32M", "4294967296"]),
        groups in 0u32..4,
        copies in 0u32..4,
        spares in 0usize..4,
        size in proptest::sample::select(vec!["0", "4K", "1M", "3M", "16M", "1E", "15E"]),
        region in proptest::option::of(proptest::sample::select(vec!["0", "4K", "64K", "1M", "1E"])),
    ) {
        let e = Env::new();
        let d = disks(members, "p");
        let (g, c, s) = (groups.to_string(), copies.to_string(), spares.to_string());
        let mut a = vec!["create", "p", "--level", level, "--chunk", chunk, "--groups", &g,
            "--copies", &c, "--spares", &s, "--size-each", size];
        if let Some(r) = region {
            a.extend(["--bitmap-region", r]);
        }
        a.extend(d.iter().map(|s| s.as_str()));
        let o = e.run(&a);
        let err = String::from_utf8_lossy(&o.stderr).to_string();
        proptest::prop_assert!(!err.contains("panicked"), "{:?}: {}", a, err);
        if o.status.success() {
            let st = e.status("p");
            proptest::prop_assert_eq!(&st["state"], "optimal");
        } else {
            proptest::prop_assert!(matches!(o.status.code(), Some(1 | 2)), "{:?}: {}", a, err);
            proptest::prop_assert!(err.starts_with("sbod: ") || err.starts_with("error: "), "{:?}: {}", a, err);
            proptest::prop_assert!(listing(e.dir.path()).is_empty(), "{:?} left {:?}", a, listing(e.dir.path()));
        }
    }
}

#[test]
fn bench_codec_reports_its_figures() {
    let e = Env::new();
    let out = e.ok(&[
        "bench", "codec", "--json", "--filter", "p+q", "--sizes", "4K,64K", "--stream", "8M",
    ]);
    let v: Value = serde_json::from_str(&out).expect("JSON");
    assert!(v["isa"].is_string(), "{v}");
    assert!(v["ceiling"]["traffic_gbps"].as_f64().unwrap() > 0.0, "{v}");
    let rows = v["rows"].as_array().unwrap();
    // p+q encode, decode and update; two shard sizes; cache and streaming.
    assert_eq!(rows.len(), 3 * 2 * 2, "{v}");
    for r in rows {
        assert!(r["case"].as_str().unwrap().contains("p+q"), "{r}");
        assert!(r["gbps"].as_f64().unwrap() > 0.0, "{r}");
        assert!(
            [4096, 65536].contains(&r["shard_bytes"].as_u64().unwrap()),
            "{r}"
        );
    }
    // The table names the kernels and the cases.
    let t = e.ok(&[
        "bench", "codec", "--filter", "xor", "--sizes", "4K", "--stream", "8M",
    ]);
    assert!(
        t.contains("xor 7+1 encode") && t.contains("memory ceiling"),
        "{t}"
    );
    // Bad requests say what would work.
    assert!(e
        .fails(&["bench", "codec", "--filter", "nothing-like-it"])
        .contains("matches no case"));
    assert!(e
        .fails(&["bench", "codec", "--isa", "sse9"])
        .contains("unknown codec ISA"));
    assert!(e
        .fails(&["bench", "codec", "--sizes", "100"])
        .contains("multiple of 64"));
    assert!(e.fails(&["bench"]).contains("NAME"));
}

/// `sbod assemble --scan` (what sbod-assemble.service runs at boot) finds every array from
/// its members' superblocks, registered or not, names each as its superblocks (or its
/// registration) do, skips files that are not members, and refuses what assembly refuses.
#[test]
fn assemble_scan_finds_every_array_from_its_members() {
    let e = Env::new();
    let a = disks(3, "a");
    let b = disks(2, "b");
    e.ok(&args(
        &["create", "va", "--level", "raid5", "--size-each", "16M"],
        &a,
    ));
    e.ok(&args(
        &["create", "vb", "--level", "raid1", "--size-each", "16M"],
        &b,
    ));
    std::fs::write(e.path("disks/notes.txt"), b"not a member").unwrap();
    // vb is forgotten (as on a new host): only its members know it.
    e.ok(&["forget", "vb"]);
    assert!(e.fails(&["status", "vb"]).contains("vb"));
    // The host's block devices may hold arrays of other runs (loop devices are shared by
    // every container on a kernel): --only looks at the places named (and registrations).
    let out = e.ok(&["assemble", "--scan", "--only", "disks", "--json"]);
    let v: Value = serde_json::from_str(&out).unwrap();
    let ours: Vec<&Value> = v
        .as_array()
        .unwrap()
        .iter()
        .filter(|x| x["skipped"] != true)
        .collect();
    let mut names: Vec<&str> = ours.iter().map(|x| x["name"].as_str().unwrap()).collect();
    names.sort();
    assert_eq!(names, ["va", "vb"], "{out}");
    for x in ours {
        assert_eq!(x["assembled"], true, "{x}");
        assert_eq!(x["state"], "optimal", "{x}");
    }
    assert_eq!(e.status("vb")["members"].as_array().unwrap().len(), 2);
    assert_eq!(e.status("va")["state"], "optimal");
    // A member missing: the scan does not start that array by itself (as assemble).
    std::fs::rename(e.path(&a[1]), e.path("a1.away")).unwrap();
    e.ok(&["forget", "va"]);
    let o = e.run(&["assemble", "--scan", "--only", "disks"]);
    assert!(!o.status.success());
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("va: not assembled") && text.contains("--degraded"),
        "{text}"
    );
    // --degraded starts it; the member back later is re-added from the bitmap.
    e.ok(&["assemble", "--scan", "--only", "--degraded", "disks"]);
    assert_eq!(e.status("va")["state"], "degraded");
    // Nowhere to look is a clear error.
    assert!(e
        .fails(&["assemble", "--scan", "nowhere"])
        .contains("does not exist"));
}

/// Modelled drives (`model:PROFILE[,OPTIONS]:PATH`) are members like files: created with
/// --size-each (data files made just now read zeros: no resync, as for plain files),
/// registered under an absolute name, scrubbed (I/O through the model), examined,
/// assembled again; a bad profile or option is a clear error that creates nothing.
#[test]
fn modelled_drives_are_members() {
    let e = Env::new();
    let d: Vec<String> = (0..4)
        .map(|i| format!("model:hdd-nearline,link=exp0@2.4G:disks/h{i}.img"))
        .collect();
    let out = e.ok(&args(
        &["create", "hd", "--level", "raid6", "--size-each", "16M"],
        &d,
    ));
    assert!(out.contains("created hd"), "{out}");
    let s = e.status("hd");
    assert_eq!(s["state"], "optimal", "{s}");
    let abs = e.path("disks/h0.img");
    assert_eq!(
        s["members"][0]["path"],
        format!("model:hdd-nearline,link=exp0@2.4G:{abs}"),
        "{s}"
    );
    // The data files and the link's state file lie beside each other.
    assert!(Path::new(&abs).exists());
    assert!(Path::new(&e.path("disks/.sbod-link-exp0")).exists());
    let out = e.ok(&["scrub", "hd"]);
    assert!(out.contains("0 mismatched"), "{out}");
    let ex: Value = serde_json::from_str(&e.ok(&["examine", &d[1], "--json"])).unwrap();
    assert_eq!(ex[0]["superblock"]["name"], "hd");
    e.ok(&["forget", "hd"]);
    let out = e.ok(&args(&["assemble"], &d));
    assert!(out.contains("assembled hd"), "{out}");
    assert_eq!(e.status("hd")["state"], "optimal");

    // SBOD_DRIVE_MODEL (what `sbod bench --drives` gives its servers): plain file members
    // open as modelled drives, under their own names.
    let plain = disks(4, "p");
    e.ok(&args(
        &[
            "create",
            "pl",
            "--level",
            "raid5",
            "--size-each",
            "16M",
            "--assume-clean",
        ],
        &plain,
    ));
    let with_model = |v: &str, a: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_sbod"))
            .args(a)
            .current_dir(e.dir.path())
            .env("SBOD_STATE_DIR", e.dir.path().join("state"))
            .env("SBOD_DRIVE_MODEL", v)
            .output()
            .unwrap()
    };
    let o = with_model("hdd-nearline", &["scrub", "pl"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("0 mismatched"));
    assert_eq!(e.status("pl")["members"][0]["path"], e.path("disks/p0.img"));
    let o = with_model("floppy", &["scrub", "pl"]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("no drive profile 'floppy'"), "{err}");

    for (bad, says) in [
        ("model:floppy:disks/x0.img", "no drive profile 'floppy'"),
        (
            "model:hdd-nearline,rpm=15000:disks/x0.img",
            "unknown option 'rpm'",
        ),
        ("model:hdd-nearline", "give the file that keeps the data"),
    ] {
        let x: Vec<String> = vec![bad.into(), "disks/x1.img".into(), "disks/x2.img".into()];
        let err = e.fails(&args(
            &["create", "bad", "--level", "raid5", "--size-each", "16M"],
            &x,
        ));
        assert!(err.contains(says), "{bad}: {err}");
        assert!(!Path::new(&e.path("disks/x0.img")).exists(), "{bad}");
        assert!(!Path::new(&e.path("disks/x1.img")).exists(), "{bad}");
    }
}
