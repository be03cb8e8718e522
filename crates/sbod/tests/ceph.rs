//! sbod beside a real Ceph: a single-node cluster (scripts/ceph-single-node.sh: one monitor,
//! one manager, 6 bluestore OSDs on files, loopback only) brought up once for this binary.
//! `sbod bench --target rbd:...` through NOMINAL, DEVICE DOWN and DEVICE REBUILD on an EC 4+2
//! image (it refuses without --destructive and leaves the cluster clean after), and moving a
//! served sbod volume into an RBD image with qemu-img (and nbdcopy into `rbd import`), read
//! back equal. The cluster, its files and every daemon are gone when the test ends; a
//! machine where Ceph cannot start fails the test, saying what to install.

mod common;

use common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/ceph-single-node.sh")
}

/// The cluster, brought down (every daemon stopped, the folder removed) when dropped.
struct Cluster {
    dir: PathBuf,
}

impl Cluster {
    fn up(dir: PathBuf) -> Cluster {
        let c = Cluster { dir };
        let o = Command::new(script())
            .arg("up")
            .arg(&c.dir)
            .args(["--osds", "6", "--osd-size", "1G"])
            .output()
            .expect("running scripts/ceph-single-node.sh");
        assert!(
            o.status.success(),
            "a single-node Ceph did not come up: {}\ninstall Debian's ceph-mon ceph-mgr ceph-osd ceph-common (scripts/deps.sh does)",
            String::from_utf8_lossy(&o.stderr)
        );
        c
    }

    fn conf(&self) -> PathBuf {
        self.dir.join("ceph.conf")
    }

    fn script(&self, args: &[&str]) -> String {
        let mut c = Command::new(script());
        c.arg(args[0]).arg(&self.dir).args(&args[1..]);
        run(&mut c)
    }

    fn ceph(&self, args: &[&str]) -> Value {
        let mut c = Command::new("ceph");
        c.arg("--conf")
            .arg(self.conf())
            .args(args)
            .args(["--format", "json"]);
        serde_json::from_str(&run(&mut c)).unwrap()
    }

    fn rbd(&self) -> Command {
        let mut c = Command::new("rbd");
        c.arg("--conf").arg(self.conf());
        c
    }

    /// Every PG active+clean, every OSD up and in, no flags left set.
    fn assert_clean(&self) {
        let t = std::time::Instant::now();
        loop {
            let s = self.ceph(&["status"]);
            let pg = &s["pgmap"];
            let clean = pg["pgs_by_state"]
                .as_array()
                .map(|a| a.len() == 1 && a[0]["state_name"] == "active+clean" || pg["num_pgs"] == 0)
                .unwrap_or(false);
            let om = &s["osdmap"];
            let osds = om["num_osds"] == om["num_up_osds"] && om["num_osds"] == om["num_in_osds"];
            let flags = self.ceph(&["osd", "dump"])["flags"]
                .as_str()
                .unwrap_or("")
                .to_string();
            if clean && osds && !flags.contains("norecover") && !flags.contains("nobackfill") {
                return;
            }
            assert!(
                t.elapsed() < Duration::from_secs(120),
                "the cluster is not clean: {s:#}, flags {flags}"
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new(script()).arg("down").arg(&self.dir).status();
    }
}

/// Processes whose command line mentions `dir`.
fn processes_in(dir: &Path) -> Vec<String> {
    let me = dir.to_string_lossy().to_string();
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

#[test]
fn sbod_bench_and_moving_to_ceph_on_a_single_node_cluster() {
    for t in ["fio", "qemu-img", "nbdcopy", "python3"] {
        need(t);
    }
    let work = tempfile::tempdir().unwrap();
    let cdir = work.path().join("ceph");
    {
        let cluster = Cluster::up(cdir.clone());
        let rbd_engine = Command::new("fio").arg("--enghelp").output().unwrap();
        assert!(
            String::from_utf8_lossy(&rbd_engine.stdout)
                .lines()
                .any(|l| l.trim() == "rbd"),
            "this fio has no rbd engine: install Debian's fio with librbd1"
        );
        cluster.script(&["pool", "ec42", "ec:4+2", "16"]);
        cluster.script(&["pool", "rep3", "rep:3", "16"]);
        let image = cluster.script(&["image", "ec42", "lab", "32M"]);
        assert_eq!(image.trim(), "rbd:ec42-meta/lab");

        let sbod = Sbod::new(work.path());
        let conf = cluster.conf().display().to_string();
        let bench = |extra: &[&str]| {
            let mut a = vec![
                "bench",
                "--target",
                "rbd:ec42-meta/lab",
                "--ceph-conf",
                &conf,
                "--workloads",
                "randread-4k,randwrite-4k",
                "--runtime",
                "1",
                "--ramp",
                "0",
                "--reps",
                "1",
                "--precondition",
                "seq",
                "--out",
                "report",
            ];
            a.extend_from_slice(extra);
            a.iter().map(|s| s.to_string()).collect::<Vec<_>>()
        };

        // Without --destructive it says what it would do and does nothing.
        let args = bench(&[]);
        let err = sbod.fails(&args.iter().map(|s| s.as_str()).collect::<Vec<_>>());
        for w in [
            "--destructive",
            "norecover",
            "marks it out",
            "writes over the image",
        ] {
            assert!(err.contains(w), "no '{w}' in: {err}");
        }
        assert!(!work.path().join("report").exists());
        cluster.assert_clean();

        // The life cycle on EC 4+2: the report is an sbod report of the pool's layout.
        let args = bench(&["--destructive"]);
        let out = sbod.ok(&args.iter().map(|s| s.as_str()).collect::<Vec<_>>());
        assert!(out.contains("DEVICE DOWN"), "{out}");
        let r: Value = serde_json::from_str(
            &std::fs::read_to_string(work.path().join("report/bench.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(r["schema"], "sbod-bench/1");
        assert_eq!(r["incomplete"], false, "{:#}", r["notes"]);
        assert_eq!(r["array"]["level"], "ceph ec:4+2");
        assert_eq!(r["array"]["redundancy"], 2);
        assert_eq!(r["array"]["members"].as_array().unwrap().len(), 6);
        let phases: Vec<&str> = r["phases"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["id"].as_str().unwrap())
            .collect();
        assert_eq!(phases, ["nominal", "device-down", "device-rebuild"]);
        for run in r["runs"].as_array().unwrap() {
            assert!(run["metrics"]["iops"].as_f64().unwrap() > 0.0, "{run:#}");
        }
        let rb = &r["rebuild"];
        assert_eq!(rb["failed_member"], "osd.5");
        assert!(rb["duration_secs"].as_f64().is_some(), "{rb:#}");
        assert!(work.path().join("report/report.html").exists());
        // The OSD is back, in, and recovery is over: the cluster is as it was.
        cluster.assert_clean();

        // Moving to Ceph: an sbod raid1 volume, served, copied into RBD images.
        let disks: Vec<String> = (0..2)
            .map(|i| work.path().join(format!("d{i}.img")).display().to_string())
            .collect();
        let mut args = vec!["create", "vol", "--level", "raid1", "--size-each", "24M"];
        args.extend(disks.iter().map(|s| s.as_str()));
        sbod.ok(&args);
        let mut procs = Procs::default();
        let uri = sbod.serve(&mut procs, "vol");
        let size: u64 = run(Command::new("nbdinfo").args(["--size", &uri]))
            .trim()
            .parse()
            .unwrap();
        let src = work.path().join("data.bin");
        let bytes: Vec<u8> = (0..size as usize)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        std::fs::write(&src, &bytes).unwrap();
        run(Command::new("nbdcopy").arg(&src).arg(&uri));
        // qemu-img creates the image itself.
        let dest = format!("rbd:rep3/moved:conf={conf}:id=admin");
        run(Command::new("qemu-img").args([
            "convert", "-f", "raw", "-O", "raw", "-W", "-m", "4", &uri, &dest,
        ]));
        run(Command::new("qemu-img").args(["compare", "-f", "raw", "-F", "raw", &uri, &dest]));
        let back = work.path().join("back.bin");
        run(cluster.rbd().args(["export", "rep3/moved"]).arg(&back));
        assert!(
            std::fs::read(&back).unwrap() == bytes,
            "rbd export differs from what was written"
        );
        // nbdcopy into `rbd import` from a pipe.
        let sh = format!(
            "nbdcopy '{uri}' - | rbd --conf '{conf}' import - rep3/piped && rbd --conf '{conf}' export rep3/piped '{}'",
            work.path().join("piped.bin").display()
        );
        run(Command::new("sh").args(["-c", &sh]));
        assert!(std::fs::read(work.path().join("piped.bin")).unwrap() == bytes);
        procs.term("head");
        cluster.assert_clean();
    }
    // Down: no daemon, no file left.
    assert!(!cdir.exists(), "{} is still there", cdir.display());
    let left = processes_in(&cdir);
    assert!(left.is_empty(), "left running: {left:#?}");
}
