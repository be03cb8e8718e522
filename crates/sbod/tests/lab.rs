//! `sbod demo` and `sbod bench` end to end: the real fio against real `sbod serve` processes,
//! through the whole life cycle, in seconds (tiny members, 1-second runs). They check the
//! reports exist and parse, the array comes back whole, Ctrl-C stops cleanly, and nothing is
//! left running or lying around.

use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn need(tool: &str) {
    let ok = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(ok, "{tool} is not installed: run scripts/deps.sh");
}

struct Env {
    dir: tempfile::TempDir,
}

impl Env {
    fn new() -> Env {
        for t in ["fio", "nbdinfo"] {
            need(t);
        }
        Env {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn p(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// sbod with a private state directory, and TMPDIR inside the test's folder so the lab's
    /// own work folder (sockets, logs) is found by `leftovers`.
    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_sbod"));
        std::fs::create_dir_all(self.p("tmp")).unwrap();
        c.args(args)
            .current_dir(self.dir.path())
            .env("SBOD_STATE_DIR", self.p("state"))
            .env("TMPDIR", self.p("tmp"))
            .stdin(Stdio::null());
        c
    }

    fn ok(&self, args: &[&str]) -> String {
        let o = self.cmd(args).output().unwrap();
        check(&o, &format!("sbod {args:?}"));
        String::from_utf8_lossy(&o.stdout).to_string()
    }

    fn status(&self, name: &str) -> Value {
        serde_json::from_str(&self.ok(&["status", name, "--json"])).unwrap()
    }

    /// Processes whose command line mentions this test's folder (servers, fio).
    fn leftovers(&self) -> Vec<String> {
        let me = self.dir.path().to_string_lossy().to_string();
        let mut found = Vec::new();
        for e in std::fs::read_dir("/proc").unwrap().flatten() {
            if let Ok(cmd) = std::fs::read(e.path().join("cmdline")) {
                let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
                if cmd.contains(&me) {
                    found.push(cmd);
                }
            }
        }
        found
    }

    fn assert_clean(&self) {
        // Servers get a moment to finish exiting after their stop.
        let t = Instant::now();
        while !self.leftovers().is_empty() && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(100));
        }
        assert!(
            self.leftovers().is_empty(),
            "left running: {:?}",
            self.leftovers()
        );
        let tmp: Vec<_> = std::fs::read_dir(self.p("tmp"))
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        assert!(tmp.is_empty(), "left in the temporary folder: {tmp:?}");
    }
}

fn check(o: &Output, what: &str) {
    assert!(
        o.status.success(),
        "{what} failed:\n{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

fn read_report(dir: &Path) -> Value {
    let json = std::fs::read_to_string(dir.join("bench.json")).unwrap();
    let v: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["schema"], "sbod-bench/1");
    let md = std::fs::read_to_string(dir.join("summary.md")).unwrap();
    assert!(md.contains("| workload |"), "{md}");
    let html = std::fs::read_to_string(dir.join("report.html")).unwrap();
    assert!(html.starts_with("<!DOCTYPE html>") && html.contains("<svg"));
    assert!(!html.contains("<script") && !html.contains("chart failed"));
    v
}

#[test]
fn quick_demo_runs_the_life_cycle_and_cleans_up() {
    let env = Env::new();
    let o = env
        .cmd(&["demo", "--quick", "--dir", "demo"])
        .output()
        .unwrap();
    check(&o, "sbod demo --quick");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("| 4K random read QD32 |"), "{out}");
    assert!(out.contains("report.html"), "{out}");
    let v = read_report(&env.p("demo/report"));
    assert_eq!(v["mode"], "demo");
    assert_eq!(v["incomplete"], false);
    let phases: Vec<&str> = v["phases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["id"].as_str().unwrap())
        .collect();
    assert_eq!(
        phases,
        ["baseline", "nominal", "device-down", "device-rebuild"]
    );
    let cells = v["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 4 * 2);
    for c in cells {
        assert!(c["mean"]["iops"].as_f64().unwrap() > 0.0, "{c}");
        assert!(c["mean"]["lat_p99_ns"].as_f64().unwrap() > 0.0, "{c}");
        assert!(c["mean"]["server_cpu_pct"].as_f64().unwrap() > 0.0, "{c}");
        if c["phase"] != "baseline" {
            assert!(c["vs_baseline"]["iops"].as_f64().unwrap() > 0.0, "{c}");
        }
    }
    let rb = &v["rebuild"];
    assert!(rb["duration_secs"].as_f64().unwrap() > 0.0, "{rb}");
    assert!(rb["bytes"].as_u64().unwrap() > 0, "{rb}");
    // The members are gone, the report stays, nothing runs, the user's state is untouched.
    assert!(!env.p("demo/members").exists());
    assert!(!env.p("state").exists() || std::fs::read_dir(env.p("state")).unwrap().count() == 0);
    env.assert_clean();
}

fn small_array(env: &Env) {
    env.ok(&[
        "create",
        "vol",
        "--level",
        "raid5",
        "--size-each",
        "24M",
        "d0.img",
        "d1.img",
        "d2.img",
        "d3.img",
    ]);
}

#[test]
fn bench_on_an_existing_array_puts_it_back_together() {
    let env = Env::new();
    small_array(&env);
    let before = env.status("vol");
    // Without consent nothing happens.
    let o = env.cmd(&["bench", "vol"]).output().unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--destructive"));
    assert_eq!(env.status("vol")["uuid"], before["uuid"]);
    let o = env
        .cmd(&[
            "bench",
            "vol",
            "--destructive",
            "--workloads",
            "randread-4k",
            "--reps",
            "2",
            "--runtime",
            "1",
            "--ramp",
            "0",
            "--precondition",
            "seq",
            "--out",
            "rep",
        ])
        .output()
        .unwrap();
    check(&o, "sbod bench --destructive");
    let v = read_report(&env.p("rep"));
    assert_eq!(v["mode"], "bench");
    assert_eq!(v["cells"].as_array().unwrap().len(), 4);
    assert_eq!(v["settings"]["baseline_iodepth"], "spread");
    // The array is back: created again on the same members (BASELINE overwrote them),
    // whole, not served.
    let after = env.status("vol");
    assert_eq!(after["state"], "optimal", "{after}");
    assert_eq!(after["running"], false);
    assert_eq!(after["level"], before["level"]);
    assert_eq!(after["chunk"], before["chunk"]);
    let paths = |s: &Value| -> Vec<String> {
        s["members"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["path"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(paths(&after), paths(&before));
    env.assert_clean();
}

#[test]
fn ctrl_c_in_device_down_rebuilds_before_exiting() {
    let env = Env::new();
    small_array(&env);
    let mut child = env
        .cmd(&[
            "bench",
            "vol",
            "--read-only",
            "--phases",
            "device-down,device-rebuild",
            "--workloads",
            "randread-4k",
            "--reps",
            "20",
            "--runtime",
            "1",
            "--ramp",
            "0",
            "--out",
            "rep",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let err = child.stderr.take().unwrap();
    let mut lines = BufReader::new(err).lines();
    let mut seen = Vec::new();
    // Wait until a DEVICE DOWN measurement has finished, then press Ctrl-C.
    for l in lines.by_ref() {
        let l = l.unwrap();
        seen.push(l.clone());
        if l.starts_with("device-down ") {
            break;
        }
    }
    assert!(
        seen.iter().any(|l| l.starts_with("device-down ")),
        "no DEVICE DOWN run: {seen:#?}"
    );
    unsafe {
        libc_kill(child.id() as i32, 2);
    }
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let st = child.wait().unwrap();
    assert!(!st.success(), "a stopped bench must not report success");
    let all = rest.join("\n");
    assert!(all.contains("restoring the array"), "{all}");
    let s = env.status("vol");
    assert_eq!(s["state"], "optimal", "{s}");
    assert_eq!(s["running"], false);
    // The partial report says it is partial.
    let v = read_report(&env.p("rep"));
    assert_eq!(v["incomplete"], true);
    env.assert_clean();
}

#[test]
fn a_refused_replacement_still_leaves_the_array_whole() {
    let env = Env::new();
    small_array(&env);
    // Too small to replace a 24M member: sbod replace refuses it mid-run.
    std::fs::write(env.p("tiny.img"), vec![0u8; 1 << 20]).unwrap();
    let o = env
        .cmd(&[
            "bench",
            "vol",
            "--read-only",
            "--phases",
            "device-down,device-rebuild",
            "--workloads",
            "randread-4k",
            "--reps",
            "1",
            "--runtime",
            "1",
            "--ramp",
            "0",
            "--replacement",
            "tiny.img",
            "--out",
            "rep",
        ])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("replace"), "{err}");
    let s = env.status("vol");
    assert_eq!(s["state"], "optimal", "{s}");
    assert!(!s.to_string().contains("tiny.img"));
    env.assert_clean();
}

#[test]
fn ctrl_c_stops_the_demo_and_removes_its_members() {
    let env = Env::new();
    let mut child = env
        .cmd(&["demo", "--quick", "--dir", "demo", "--reps", "10"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut seen = Vec::new();
    for l in lines.by_ref() {
        let l = l.unwrap();
        seen.push(l.clone());
        if l.starts_with("baseline ") && l.contains("randread-4k") {
            break;
        }
    }
    assert!(env.p("demo/members").exists(), "{seen:#?}");
    unsafe {
        libc_kill(child.id() as i32, 2);
    }
    let _rest: Vec<String> = lines.map_while(Result::ok).collect();
    let st = child.wait().unwrap();
    assert!(!st.success());
    assert!(!env.p("demo/members").exists(), "members left behind");
    assert_eq!(read_report(&env.p("demo/report"))["incomplete"], true);
    env.assert_clean();
}

extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}

/// `sbod demo --drives`: the whole life cycle on modelled HDDs (BASELINE's servers each
/// model their member, the array's server all of them). A modelled 7200 rpm drive answers
/// 4K random reads in milliseconds, so the IOPS are a drive's, not memory's (member files
/// in memory give tens of thousands here): the bound only fails if the model is bypassed.
#[test]
fn quick_demo_on_modelled_drives() {
    let env = Env::new();
    let o = env
        .cmd(&[
            "demo",
            "--quick",
            "--dir",
            "demo",
            "--members",
            "4",
            "--drives",
            // Write caches off: with them on, BASELINE's random writes fill each drive's
            // 32 MiB of cache in the half second, and stopping its servers destages them
            // (40-50 s of the drives' time, nothing this test looks at).
            "hdd-nearline,wce=off",
            "--reps",
            "1",
            "--runtime",
            "0.5",
        ])
        .output()
        .unwrap();
    check(&o, "sbod demo --quick --drives hdd-nearline");
    let v = read_report(&env.p("demo/report"));
    assert_eq!(v["incomplete"], false);
    for m in v["array"]["members"].as_array().unwrap() {
        assert_eq!(m["kind"], "model", "{m}");
        assert!(m["path"]
            .as_str()
            .unwrap()
            .starts_with("model:hdd-nearline,wce=off:"));
    }
    // With the caches off nothing says a cache took BASELINE's writes.
    assert!(
        !v["flags"].to_string().contains("write caches"),
        "{}",
        v["flags"]
    );
    let cells = v["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 4 * 2);
    for c in cells {
        let iops = c["mean"]["iops"].as_f64().unwrap();
        assert!(iops > 0.0, "{c}");
        assert_eq!(c["n"], 1, "{c}");
        // Reads and (write caches off) writes go to the platters: 4 drives, a few hundred
        // IOPS each at most (NCQ at best about 2.5x QD1's 80-200).
        assert!(iops < 4.0 * 1500.0, "{c}");
        // Half a second on drives holds a few hundred I/Os or fewer: a cell under 200 a
        // run is named with its count, and only such a cell.
        let few = format!(
            "{} qd{}: about {:.0} I/Os a run",
            c["workload"].as_str().unwrap(),
            c["iodepth"],
            iops * 0.5
        );
        assert_eq!(
            v["flags"].to_string().contains(&few),
            iops * 0.5 < 200.0,
            "{few}: {}",
            v["flags"]
        );
    }
    assert!(!env.p("demo/members").exists());
    env.assert_clean();

    // A bad --drives is refused before anything is made.
    let o = env
        .cmd(&["demo", "--quick", "--dir", "demo2", "--drives", "floppy"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("no drive profile 'floppy'"), "{err}");
    assert!(!env.p("demo2/members").exists());
}
