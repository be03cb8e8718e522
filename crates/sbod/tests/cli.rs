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
