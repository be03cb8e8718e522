//! The life-cycle orchestration against a fake sbod and a fake fio: phase order, what each
//! phase measures, the array put back together after errors and Ctrl-C, and the report's
//! schema (a golden structure, every field documented in docs/LAB.md).

use anyhow::{anyhow, bail, Result};
use sbod_lab::backend::{ArrayState, Backend};
use sbod_lab::fio::{Cancelled, FioJob, FioRunner, Target};
use sbod_lab::orchestrate::{
    Cancel, Config, Connections, Lab, NoProgress, Precondition, RebuildRate,
};
use sbod_lab::schema::*;
use std::cell::RefCell;
use std::collections::BTreeSet;
use std::rc::Rc;

type Log = Rc<RefCell<Vec<String>>>;

fn pos(log: &[String], what: &str) -> usize {
    log.iter()
        .position(|e| e.starts_with(what))
        .unwrap_or_else(|| panic!("no '{what}' in {log:#?}"))
}

fn has(log: &[String], what: &str) -> bool {
    log.iter().any(|e| e.starts_with(what))
}

struct FakeSbod {
    log: Log,
    members: u32,
    redundancy: u32,
    keeps: bool,
    failed: Option<String>,
    /// Polls left until a started rebuild is over.
    rebuild_polls: Option<u32>,
    polls_per_rebuild: u32,
    up: bool,
    cpu: f64,
    /// The members stream like disks (modelled HDDs).
    disks: bool,
}

impl FakeSbod {
    fn new(log: Log, keeps: bool) -> FakeSbod {
        FakeSbod {
            log,
            members: 8,
            redundancy: 2,
            keeps,
            failed: None,
            rebuild_polls: None,
            polls_per_rebuild: 3,
            up: false,
            cpu: 0.0,
            disks: false,
        }
    }

    fn info(&self) -> ArrayInfo {
        ArrayInfo {
            name: "vol".into(),
            level: if self.redundancy == 0 {
                "raid0".into()
            } else {
                "raid6".into()
            },
            chunk_bytes: 65536,
            groups: 1,
            width: self.members,
            redundancy: self.redundancy,
            declustered: false,
            size_bytes: (self.members as u64 - self.redundancy as u64) << 30,
            members: (0..self.members)
                .map(|i| MemberInfo {
                    slot: i,
                    path: format!("/d/m{i}"),
                    size_bytes: 1 << 30,
                    kind: "file".into(),
                    rotational: self.disks,
                })
                .collect(),
        }
    }

    fn ev(&self, e: String) {
        self.log.borrow_mut().push(e);
    }
}

impl Backend for FakeSbod {
    fn describe(&mut self) -> Result<ArrayInfo> {
        self.ev("describe".into());
        Ok(self.info())
    }
    fn baseline_up(&mut self) -> Result<Vec<Target>> {
        self.ev("baseline_up".into());
        self.up = true;
        Ok((0..self.members)
            .map(|i| Target {
                uri: format!("base://{i}"),
                size: 1 << 30,
                ..Default::default()
            })
            .collect())
    }
    fn baseline_down(&mut self) -> Result<()> {
        self.ev("baseline_down".into());
        self.up = false;
        Ok(())
    }
    fn array_up(&mut self, _: &mut dyn FnMut() -> bool) -> Result<(Target, ArrayInfo)> {
        self.ev("array_up".into());
        self.up = true;
        let info = self.info();
        Ok((
            Target {
                uri: "array://".into(),
                size: info.size_bytes,
                ..Default::default()
            },
            info,
        ))
    }
    fn array_state(&mut self) -> Result<ArrayState> {
        if let Some(n) = self.rebuild_polls.as_mut() {
            if *n == 0 {
                self.rebuild_polls = None;
                self.failed = None;
                self.ev("rebuild_finished".into());
                return Ok(ArrayState {
                    state: "optimal".into(),
                    process: None,
                    last_process: Some(("rebuild".into(), 1 << 30, 1.0)),
                });
            }
            *n -= 1;
            let done = (self.polls_per_rebuild - *n) as u64 * (1 << 30)
                / (self.polls_per_rebuild as u64 + 1);
            return Ok(ArrayState {
                state: "rebuilding".into(),
                process: Some(("rebuild".into(), done, 1 << 30)),
                last_process: None,
            });
        }
        Ok(ArrayState {
            state: if self.failed.is_some() {
                "degraded".into()
            } else {
                "optimal".into()
            },
            process: None,
            last_process: None,
        })
    }
    fn fail(&mut self, member: &str) -> Result<()> {
        self.ev(format!("fail {member}"));
        self.failed = Some(member.into());
        Ok(())
    }
    fn start_rebuild(&mut self, failed: &str) -> Result<String> {
        self.ev(format!("start_rebuild {failed}"));
        assert_eq!(self.failed.as_deref(), Some(failed));
        self.rebuild_polls = Some(self.polls_per_rebuild);
        Ok(failed.into())
    }
    fn set_rebuild_rate(&mut self, min: u64, max: u64) -> Result<()> {
        self.ev(format!("set_rate {min} {max}"));
        Ok(())
    }
    fn server_cpu_secs(&mut self) -> f64 {
        self.cpu += 0.5;
        self.cpu
    }
    fn array_down(&mut self) -> Result<()> {
        self.ev("array_down".into());
        self.up = false;
        Ok(())
    }
    fn cleanup(&mut self) {
        self.ev("cleanup".into());
        self.up = false;
    }
    fn keeps_array(&self) -> bool {
        self.keeps
    }
}

/// What the fake fio should do on a job whose label starts with a prefix.
#[derive(Clone)]
enum Trap {
    Fail(String),
    Cancel(String, Cancel, u32),
}

struct FakeFio {
    log: Log,
    jobs: Rc<RefCell<Vec<FioJob>>>,
    traps: Vec<Trap>,
}

impl FioRunner for FakeFio {
    fn run(&mut self, job: &FioJob, keep_going: &mut dyn FnMut() -> bool) -> Result<Metrics> {
        self.log.borrow_mut().push(format!("fio {}", job.label));
        self.jobs.borrow_mut().push(job.clone());
        for t in &self.traps {
            match t {
                Trap::Fail(p) if job.label.starts_with(p.as_str()) => bail!("fio exploded"),
                Trap::Cancel(p, c, times) if job.label.starts_with(p.as_str()) => {
                    for _ in 0..*times {
                        c.request();
                    }
                }
                _ => {}
            }
        }
        // Like the real one: look at keep_going while "running".
        for _ in 0..3 {
            if !keep_going() {
                return Err(anyhow!(Cancelled));
            }
        }
        let base = if job.targets[0].uri.starts_with("base") {
            1000.0
        } else if job.label.starts_with("nominal") {
            800.0
        } else {
            400.0
        };
        let rep: f64 = job
            .label
            .split("rep ")
            .nth(1)
            .and_then(|s| s.split('/').next())
            .and_then(|s| s.parse().ok())
            .unwrap_or(1.0);
        let iops = base + rep;
        Ok(Metrics {
            iops,
            read_iops: iops,
            write_iops: 0.0,
            bw_bytes: iops * 4096.0,
            lat_mean_ns: 1e9 / iops,
            lat_p50_ns: 1e9 / iops,
            lat_p99_ns: 2e9 / iops,
            lat_p999_ns: 3e9 / iops,
            client_cpu_pct: 10.0,
            percentiles: job
                .percentiles
                .iter()
                .map(|p| [*p, 1e9 / iops * (1.0 + p / 50.0)])
                .collect(),
            ..Default::default()
        })
    }
    fn version(&self) -> String {
        "fio-fake".into()
    }
}

fn config(phases: &[&str]) -> Config {
    let workloads =
        sbod_lab::workload::select(&["randread-4k".into(), "seqwrite-1m".into()]).unwrap();
    Config {
        mode: "bench".into(),
        sbod_version: "test".into(),
        workloads,
        sweep_workloads: Vec::new(),
        qd_sweep: Vec::new(),
        phases: phases.iter().map(|s| s.to_string()).collect(),
        runtime: 1.0,
        ramp: 0.0,
        reps: 2,
        cov_threshold: 0.1,
        precondition: Precondition::Seq,
        working_set: Some(1 << 30),
        percentiles: vec![50.0, 99.0, 99.9],
        rebuild_rate: RebuildRate::Span,
        fail_member: None,
        connections: Connections::Auto,
    }
}

struct Outcome {
    report: Report,
    result: Result<()>,
    log: Vec<String>,
    jobs: Vec<FioJob>,
}

/// The first fio job of a run whose label starts with `label`.
fn first_job<'a>(jobs: &'a [FioJob], label: &str) -> &'a FioJob {
    jobs.iter()
        .find(|j| j.label.starts_with(label))
        .unwrap_or_else(|| panic!("no job {label}"))
}

fn run_with(cfg: Config, mut sbod: FakeSbod, traps: Vec<Trap>, cancel: Cancel) -> Outcome {
    let log = sbod.log.clone();
    let jobs = Rc::new(RefCell::new(Vec::new()));
    let mut fio = FakeFio {
        log: log.clone(),
        jobs: jobs.clone(),
        traps,
    };
    let mut progress = NoProgress;
    let lab = Lab::new(cfg, &mut sbod, &mut fio, &mut progress, cancel);
    let (report, result) = lab.run();
    assert!(!sbod.up, "a server was left running");
    let log = log.borrow().clone();
    let jobs = jobs.borrow().clone();
    Outcome {
        report,
        result,
        log,
        jobs,
    }
}

fn all_phases() -> Vec<&'static str> {
    PHASES.to_vec()
}

#[test]
fn life_cycle_runs_in_order_and_reports_every_cell() {
    let log: Log = Default::default();
    let o = run_with(
        config(&all_phases()),
        FakeSbod::new(log, false),
        vec![],
        Cancel::new(),
    );
    o.result.unwrap();
    let l = &o.log;
    let order = [
        "describe",
        "baseline_up",
        "fio baseline precondition",
        "fio baseline randread-4k",
        "baseline_down",
        "array_up",
        "fio nominal precondition",
        "fio nominal randread-4k",
        "fail /d/m7",
        "fio device-down randread-4k",
        "set_rate",
        "start_rebuild /d/m7",
        "fio device-rebuild randread-4k",
        "array_down",
        "cleanup",
    ];
    for w in order.windows(2) {
        assert!(
            pos(l, w[0]) < pos(l, w[1]),
            "{} should come before {}: {l:#?}",
            w[0],
            w[1]
        );
    }
    // The rebuild is over before the run ends, and after the last DEVICE DOWN run.
    let last_down = l
        .iter()
        .rposition(|e| e.starts_with("fio device-down"))
        .unwrap();
    assert!(pos(l, "start_rebuild") > last_down);
    assert!(pos(l, "rebuild_finished") < pos(l, "array_down"));
    let r = &o.report;
    assert_eq!(r.schema, SCHEMA);
    assert!(!r.incomplete);
    assert_eq!(r.runs.len(), 4 * 2 * 2);
    assert_eq!(r.cells.len(), 4 * 2);
    assert_eq!(
        r.phases.iter().map(|p| p.id.as_str()).collect::<Vec<_>>(),
        all_phases()
    );
    let nom = r.cell(NOMINAL, "randread-4k", 32).unwrap();
    assert_eq!(nom.n, 2);
    assert!((nom.mean.iops - 801.5).abs() < 1e-9);
    let vb = nom.vs_baseline.as_ref().unwrap();
    assert!((vb.iops - 801.5 / 1001.5).abs() < 1e-9);
    let down = r.cell(DEVICE_DOWN, "randread-4k", 32).unwrap();
    assert!((down.vs_nominal.as_ref().unwrap().iops - 401.5 / 801.5).abs() < 1e-9);
    assert!(down.mean.server_cpu_pct > 0.0 && down.mean.iops_per_cpu_pct > 0.0);
    // Bytes per CPU-second: the bandwidth over the server's CPU, run by run.
    for run in &r.runs {
        let m = &run.metrics;
        let want = m.bw_bytes / (m.server_cpu_pct / 100.0);
        assert!((m.bytes_per_cpu_sec - want).abs() <= want * 1e-9, "{m:?}");
    }
    // The floor it is held against, for this array's layout (raid6 of 8: P+Q 6+2).
    let f = r.floor.as_ref().expect("the floor measured");
    assert!(f.copy > 0.0 && f.copy_crc32c > 0.0 && f.layout.is_some_and(|l| l > 0.0));
    let rb = r.rebuild.as_ref().unwrap();
    assert_eq!(rb.failed_member, "/d/m7");
    assert!(rb.duration_secs.is_some() && rb.rate_bytes_per_sec.is_some());
    assert!(rb.samples.len() >= 2);
    assert!(rb.start_delay_secs.is_some());
    // Runs under rebuild carry its progress.
    assert!(r
        .runs
        .iter()
        .filter(|x| x.phase == DEVICE_REBUILD)
        .all(|x| x.rebuild_percent.is_some()));
    assert!(r
        .runs
        .iter()
        .filter(|x| x.phase != DEVICE_REBUILD)
        .all(|x| x.rebuild_percent.is_none()));
}

#[test]
fn baseline_spreads_the_same_workload_over_every_member() {
    let log: Log = Default::default();
    let o = run_with(
        config(&all_phases()),
        FakeSbod::new(log, false),
        vec![],
        Cancel::new(),
    );
    o.result.unwrap();
    let base: Vec<&FioJob> = o
        .jobs
        .iter()
        .filter(|j| j.label.starts_with("baseline randread"))
        .collect();
    let nominal: Vec<&FioJob> = o
        .jobs
        .iter()
        .filter(|j| j.label.starts_with("nominal randread"))
        .collect();
    assert_eq!(base.len(), 2);
    let b = base[0];
    assert_eq!(b.targets.len(), 8);
    // 32 over 8 members: 4 each; each member addresses the bytes of it the RAID job's
    // working set occupies (raid6 of 8: 1 GiB of volume is 8/6 GiB over 8 members,
    // 170 MiB each, whole MiB), so both stream over the same member bytes.
    assert!(b.args.contains(&"--iodepth=4".to_string()), "{:?}", b.args);
    assert!(
        b.targets.iter().all(|t| t.size == 170 << 20),
        "{:?}",
        b.targets
    );
    // The array's job: the same depth over as many connections, each addressing the
    // whole working set (random reads).
    let n = &nominal[0];
    assert!(n.args.contains(&"--iodepth=4".to_string()), "{:?}", n.args);
    assert_eq!(n.targets.len(), 8);
    assert!(n
        .targets
        .iter()
        .all(|t| t.uri == "array://" && t.offset == 0 && t.size == 1 << 30));
    // Preconditioning runs a pass over the same bytes, not time-based, as one stream.
    let pre = o
        .jobs
        .iter()
        .find(|j| j.label.starts_with("nominal precondition"))
        .unwrap();
    assert!(pre.runtime.is_none());
    assert_eq!(pre.targets, n.targets[..1]);
    // A sequential workload: 16 deep over 8 connections, each streaming through its
    // eighth of the same bytes (whole MiB blocks).
    let seq = o
        .jobs
        .iter()
        .find(|j| j.label.starts_with("nominal seqwrite-1m"))
        .unwrap();
    assert!(
        seq.args.contains(&"--iodepth=2".to_string()),
        "{:?}",
        seq.args
    );
    assert_eq!(seq.targets.len(), 8);
    for (i, t) in seq.targets.iter().enumerate() {
        let i = i as u64;
        assert_eq!((t.offset, t.size), (i << 27, 1 << 27));
    }
    let line = seq.command_line().join(" ");
    assert!(
        line.contains("--name=t3 --uri=array:// --size=134217728 --offset=402653184 --name=t4"),
        "{line}"
    );
    // Each run says how many connections carried it.
    let runs = |phase: &str, w: &str| {
        o.report
            .runs
            .iter()
            .filter(|r| r.phase == phase && r.workload == w)
            .map(|r| r.connections)
            .collect::<Vec<_>>()
    };
    assert_eq!(runs(NOMINAL, "seqwrite-1m"), vec![8, 8]);
    assert_eq!(runs(BASELINE, "seqwrite-1m"), vec![8, 8]);
    assert_eq!(o.report.settings.connections, "auto");
}

/// On members that stream like disks, `auto` keeps a sequential job one stream (eight
/// connections would make it eight streams, and every disk would seek between them,
/// where BASELINE streams each member once); random jobs still get the eight.
#[test]
fn sequential_jobs_on_disks_stay_one_stream() {
    let log: Log = Default::default();
    let mut fake = FakeSbod::new(log, false);
    fake.disks = true;
    let o = run_with(config(&[BASELINE, NOMINAL]), fake, vec![], Cancel::new());
    o.result.unwrap();
    let job = |label: &str| first_job(&o.jobs, label);
    let seq = job("nominal seqwrite-1m");
    assert_eq!(seq.targets.len(), 1, "{:?}", seq.targets);
    assert_eq!(seq.targets[0].offset, 0);
    assert!(
        seq.args.contains(&"--iodepth=16".to_string()),
        "{:?}",
        seq.args
    );
    assert_eq!(job("nominal randread").targets.len(), 8);
    assert_eq!(job("baseline seqwrite-1m").targets.len(), 8);
    assert_eq!(o.report.settings.connections, "auto");
}

/// What streams like a disk: modelled HDDs by their profile, block devices by sysfs (a
/// loop device over a file is not rotational), files and remote members not.
#[test]
fn members_that_stream_like_disks() {
    use sbod_lab::sbod::{array_info, rotational};
    assert!(rotational("model:hdd-nearline:/m0.img", "model"));
    assert!(rotational(
        "model:hdd-dual,slow=8,span=size:/m0.img",
        "model"
    ));
    assert!(!rotational("model:nvme-dc:/m0.img", "model"));
    assert!(!rotational("/srv/m0.img", "file"));
    assert!(!rotational("nbd://h/x", "nbd"));
    assert!(!rotational("/dev/this-is-not-there", "block"));
    let v = serde_json::json!({"members": [
        {"slot": 0, "path": "model:hdd-nearline,wce=off:/x/m0.img", "size": 1},
        {"slot": 1, "path": "/x/m1.img", "size": 1},
    ]});
    let info = array_info(&v);
    let r: Vec<(&str, bool)> = info
        .members
        .iter()
        .map(|m| (m.kind.as_str(), m.rotational))
        .collect();
    assert_eq!(r, vec![("model", true), ("file", false)]);
}

#[test]
fn one_connection_when_asked() {
    let log: Log = Default::default();
    let mut cfg = config(&[BASELINE, NOMINAL]);
    cfg.connections = "1".parse().unwrap();
    let o = run_with(cfg, FakeSbod::new(log, false), vec![], Cancel::new());
    o.result.unwrap();
    for j in o.jobs.iter().filter(|j| j.label.starts_with("nominal")) {
        assert_eq!(j.targets.len(), 1, "{}", j.label);
        assert_eq!(j.targets[0].offset, 0);
    }
    let n = o
        .jobs
        .iter()
        .find(|j| j.label.starts_with("nominal randread"))
        .unwrap();
    assert!(n.args.contains(&"--iodepth=32".to_string()));
    assert_eq!(o.report.settings.connections, "1");
    // An RBD image keeps one client (librbd clients of one image share its exclusive
    // lock); a count never exceeds the depth.
    assert_eq!(Connections::Auto.count(32, 8, "rbd:pool/img", false), 1);
    assert_eq!(
        Connections::Auto.count(32, 8, "nbd+unix:///?socket=/s", false),
        8
    );
    assert_eq!(
        Connections::Fixed(4).count(2, 8, "nbd+unix:///?socket=/s", false),
        2
    );
    // A sequential job on disks: one stream under auto, what was asked otherwise.
    assert_eq!(
        Connections::Auto.count(32, 8, "nbd+unix:///?socket=/s", true),
        1
    );
    assert_eq!(
        Connections::Fixed(4).count(32, 8, "nbd+unix:///?socket=/s", true),
        4
    );
    for bad in ["0", "x", "257", ""] {
        let e = bad.parse::<Connections>().unwrap_err();
        assert!(e.contains("auto or a count"), "{e}");
    }
}

#[test]
fn baseline_at_low_queue_depth_uses_as_many_members_as_the_depth() {
    let log: Log = Default::default();
    let mut cfg = config(&[BASELINE, NOMINAL]);
    cfg.workloads = sbod_lab::workload::select(&["qd1-randread-4k".into()]).unwrap();
    cfg.sweep_workloads = sbod_lab::workload::sweep_catalogue();
    cfg.qd_sweep = vec![1, 4, 12, 64];
    let o = run_with(cfg, FakeSbod::new(log, false), vec![], Cancel::new());
    o.result.unwrap();
    let job = |label: &str| first_job(&o.jobs, label);
    let shape = |label: &str| {
        let j = job(label);
        let qd: u32 = j
            .args
            .iter()
            .find_map(|a| a.strip_prefix("--iodepth="))
            .unwrap()
            .parse()
            .unwrap();
        (j.targets.len(), qd)
    };
    // QD1: one member at QD1, the device's own latency.
    assert_eq!(shape("baseline qd1-randread-4k"), (1, 1));
    assert_eq!(shape("baseline sweep-randread-4k qd4 "), (4, 1));
    assert_eq!(shape("baseline sweep-randread-4k qd12 "), (8, 2));
    assert_eq!(shape("baseline sweep-randread-4k qd64 "), (8, 8));
    // The array's job: as many connections as BASELINE's members for the depth.
    assert_eq!(shape("nominal qd1-randread-4k"), (1, 1));
    assert_eq!(shape("nominal sweep-randread-4k qd4 "), (4, 1));
    assert_eq!(shape("nominal sweep-randread-4k qd12 "), (8, 2));
}

#[test]
fn an_error_in_device_down_still_rebuilds_a_kept_array() {
    let log: Log = Default::default();
    let o = run_with(
        config(&all_phases()),
        FakeSbod::new(log, true),
        vec![Trap::Fail("device-down randread-4k qd32 rep 1".into())],
        Cancel::new(),
    );
    let e = o.result.unwrap_err();
    assert!(format!("{e:#}").contains("fio exploded"));
    let l = &o.log;
    assert!(pos(l, "fail /d/m7") < pos(l, "start_rebuild /d/m7"));
    assert!(pos(l, "start_rebuild") < pos(l, "rebuild_finished"));
    assert!(pos(l, "rebuild_finished") < pos(l, "array_down"));
    assert!(pos(l, "array_down") < pos(l, "cleanup"));
    assert!(!has(l, "fio device-rebuild"));
    assert!(o.report.incomplete);
    assert!(o.report.notes.iter().any(|n| n.contains("fio exploded")));
    // What was measured before the error is in the report.
    assert!(o.report.cell(NOMINAL, "randread-4k", 32).is_some());
}

#[test]
fn ctrl_c_during_nominal_stops_without_failing_anything() {
    let log: Log = Default::default();
    let cancel = Cancel::new();
    let o = run_with(
        config(&all_phases()),
        FakeSbod::new(log, true),
        vec![Trap::Cancel(
            "nominal randread-4k qd32 rep 1".into(),
            cancel.clone(),
            1,
        )],
        cancel,
    );
    let e = o.result.unwrap_err();
    assert!(sbod_lab::fio::is_cancelled(&e));
    let l = &o.log;
    assert!(!has(l, "fail"));
    assert!(!has(l, "start_rebuild"));
    assert!(!has(l, "fio nominal seqwrite-1m"));
    assert!(pos(l, "array_down") < pos(l, "cleanup"));
    assert!(o.report.incomplete);
    assert!(o.report.notes.iter().any(|n| n.contains("Ctrl-C")));
}

#[test]
fn ctrl_c_during_device_down_rebuilds_a_kept_array_but_not_a_demo() {
    for keeps in [true, false] {
        let log: Log = Default::default();
        let cancel = Cancel::new();
        let o = run_with(
            config(&all_phases()),
            FakeSbod::new(log, keeps),
            vec![Trap::Cancel(
                "device-down seqwrite-1m".into(),
                cancel.clone(),
                1,
            )],
            cancel,
        );
        assert!(sbod_lab::fio::is_cancelled(&o.result.unwrap_err()));
        let l = &o.log;
        assert!(!has(l, "fio device-rebuild"));
        if keeps {
            assert!(pos(l, "start_rebuild") < pos(l, "rebuild_finished"));
            assert!(pos(l, "rebuild_finished") < pos(l, "array_down"));
        } else {
            // The demo's array is thrown away: no need to wait for a rebuild.
            assert!(!has(l, "start_rebuild"), "{l:#?}");
        }
        assert!(has(l, "cleanup"));
    }
}

#[test]
fn a_second_ctrl_c_stops_waiting_for_the_rebuild() {
    let log: Log = Default::default();
    let cancel = Cancel::new();
    let mut sbod = FakeSbod::new(log, true);
    sbod.polls_per_rebuild = 1_000_000;
    let o = run_with(
        config(&all_phases()),
        sbod,
        vec![Trap::Cancel("device-down".into(), cancel.clone(), 2)],
        cancel,
    );
    assert!(o.result.is_err());
    let l = &o.log;
    assert!(has(l, "start_rebuild"));
    assert!(!has(l, "rebuild_finished"));
    assert!(has(l, "cleanup"));
    assert!(o
        .report
        .notes
        .iter()
        .any(|n| n.contains("resumes when the array is next served")));
}

#[test]
fn no_redundancy_skips_the_failure_phases() {
    let log: Log = Default::default();
    let mut sbod = FakeSbod::new(log, true);
    sbod.redundancy = 0;
    let o = run_with(config(&all_phases()), sbod, vec![], Cancel::new());
    o.result.unwrap();
    assert!(!has(&o.log, "fail"));
    let skipped: Vec<&PhaseInfo> = o
        .report
        .phases
        .iter()
        .filter(|p| {
            p.note
                .as_deref()
                .is_some_and(|n| n.contains("no redundancy"))
        })
        .collect();
    assert_eq!(skipped.len(), 2);
    assert!(o.report.rebuild.is_none());
}

#[test]
fn a_rebuild_that_ends_early_is_reported_as_such() {
    let log: Log = Default::default();
    let mut sbod = FakeSbod::new(log, false);
    sbod.polls_per_rebuild = 1;
    let o = run_with(config(&all_phases()), sbod, vec![], Cancel::new());
    o.result.unwrap();
    let rb = o.report.rebuild.as_ref().unwrap();
    assert!(rb.finished_during_workloads);
    assert!(o
        .report
        .notes
        .iter()
        .any(|n| n.contains("before its workloads did")));
    // Later runs saw it at 100%.
    let last = o
        .report
        .runs
        .iter()
        .rfind(|r| r.phase == DEVICE_REBUILD)
        .unwrap();
    assert_eq!(last.rebuild_percent.unwrap()[1], 100.0);
}

#[test]
fn only_the_phases_asked_for_run() {
    let log: Log = Default::default();
    let o = run_with(
        config(&[NOMINAL]),
        FakeSbod::new(log, true),
        vec![],
        Cancel::new(),
    );
    o.result.unwrap();
    assert!(!has(&o.log, "baseline_up"));
    assert!(!has(&o.log, "fail"));
    assert!(o.report.runs.iter().all(|r| r.phase == NOMINAL));
    let c = o.report.cell(NOMINAL, "randread-4k", 32).unwrap();
    assert!(c.vs_baseline.is_none());
}

// ---- the schema ----

fn full_report() -> Report {
    let log: Log = Default::default();
    let mut cfg = config(&all_phases());
    cfg.sweep_workloads = sbod_lab::workload::sweep_catalogue();
    cfg.qd_sweep = vec![1, 4];
    let o = run_with(cfg, FakeSbod::new(log, false), vec![], Cancel::new());
    o.result.unwrap();
    o.report
}

/// Equal JSON documents, numbers to 1e-12 relative (JSON text need not round-trip the last
/// bit of a float).
fn assert_close(a: &serde_json::Value, b: &serde_json::Value, path: &str) {
    use serde_json::Value::*;
    match (a, b) {
        (Object(x), Object(y)) => {
            assert_eq!(x.len(), y.len(), "{path}: different fields");
            for (k, v) in x {
                assert_close(v, &y[k], &format!("{path}.{k}"));
            }
        }
        (Array(x), Array(y)) => {
            assert_eq!(x.len(), y.len(), "{path}: different lengths");
            for (i, (v, w)) in x.iter().zip(y).enumerate() {
                assert_close(v, w, &format!("{path}[{i}]"));
            }
        }
        (Number(x), Number(y)) => {
            let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
            assert!(
                (x - y).abs() <= 1e-12 * x.abs().max(y.abs()),
                "{path}: {x} != {y}"
            );
        }
        _ => assert_eq!(a, b, "{path}"),
    }
}

/// Every path in a JSON document with its type; arrays as [].
fn structure(v: &serde_json::Value, path: &str, out: &mut BTreeSet<String>) {
    use serde_json::Value::*;
    match v {
        Object(m) => {
            for (k, x) in m {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                structure(x, &p, out);
            }
        }
        Array(a) => {
            out.insert(format!("{path}: array"));
            for x in a {
                structure(x, &format!("{path}[]"), out);
            }
        }
        Null => {
            out.insert(format!("{path}: null"));
        }
        Bool(_) => {
            out.insert(format!("{path}: bool"));
        }
        Number(_) => {
            out.insert(format!("{path}: number"));
        }
        String(_) => {
            out.insert(format!("{path}: string"));
        }
    }
}

#[test]
fn report_round_trips_and_matches_the_golden_structure() {
    let r = full_report();
    let text = serde_json::to_string_pretty(&r).unwrap();
    let back = Report::from_json(&text).unwrap();
    assert_close(
        &serde_json::to_value(&back).unwrap(),
        &serde_json::to_value(&r).unwrap(),
        "",
    );
    // Another schema is refused with a clear error.
    let other = text.replacen(SCHEMA, "sbod-bench/999", 1);
    assert!(Report::from_json(&other)
        .unwrap_err()
        .to_string()
        .contains("sbod-bench/999"));
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut s = BTreeSet::new();
    structure(&v, "", &mut s);
    // Values that are null in this run but numbers in others (and the reverse) are one field.
    let lines: BTreeSet<String> = s.into_iter().filter(|l| !l.ends_with(": null")).collect();
    let got = lines.into_iter().collect::<Vec<_>>().join("\n") + "\n";
    let golden_path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/schema-golden.txt");
    if std::env::var_os("SBOD_BLESS").is_some() {
        std::fs::write(golden_path, &got).unwrap();
    }
    let want = std::fs::read_to_string(golden_path).unwrap();
    assert_eq!(
        got, want,
        "the report's structure changed: update docs/LAB.md (and bump SCHEMA if a field changed meaning or went away), then run with SBOD_BLESS=1"
    );
}

#[test]
fn every_field_is_documented() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/LAB.md"))
        .expect("docs/LAB.md");
    let v = serde_json::to_value(full_report()).unwrap();
    let mut s = BTreeSet::new();
    structure(&v, "", &mut s);
    let mut missing = Vec::new();
    for l in s {
        let path = l.split(':').next().unwrap().replace("[]", "");
        let key = path.rsplit('.').next().unwrap().to_string();
        if !doc.contains(&format!("`{key}`")) {
            missing.push(key);
        }
    }
    missing.dedup();
    assert!(
        missing.is_empty(),
        "fields not documented in docs/LAB.md: {missing:?}"
    );
}

#[test]
fn reports_render_without_the_network() {
    let r = full_report();
    let html = sbod_lab::report::html(&r);
    assert!(html.starts_with("<!DOCTYPE html>"));
    assert!(html.matches("<svg").count() >= 2 * 2 + 2, "charts missing");
    for bad in ["<script", "<link", "src=\"http", "url(http", "@import"] {
        assert!(!html.contains(bad), "HTML reaches out: {bad}");
    }
    assert!(!html.contains("chart failed"));
    let md = sbod_lab::report::markdown(&r);
    assert!(md.contains("| 4K random read QD32 |"));
    assert!(md.contains("BASELINE") && md.contains("DEVICE REBUILD"));
    assert!(md.contains("4K random read, queue-depth sweep"));
    // Bytes per CPU-second beside the floor (writes: the share of the floor kept).
    assert!(md.contains("The floor on this machine"), "{md}");
    assert!(
        md.lines()
            .any(|l| l.starts_with("| 1M sequential write QD16 |")
                && l.contains("GB/CPU-s (")
                && l.contains("of floor)")),
        "{md}"
    );
    // The layout's ideal beside the measured ratio: raid6 of 8 reads 4K at 7/13 of
    // BASELINE at best with a member down.
    assert!(md.contains("## Against the layout's ideal"), "{md}");
    assert!(
        md.lines()
            .any(|l| l.starts_with("| 4K random read QD32 | DEVICE DOWN |")
                && l.contains("| 0.54 |")),
        "{md}"
    );
    assert!(html.contains("Against the layout's ideal"));
    let dir = tempfile::tempdir().unwrap();
    let w = sbod_lab::write_reports(&r, dir.path()).unwrap();
    let back = Report::from_json(&std::fs::read_to_string(&w.json).unwrap()).unwrap();
    assert_close(
        &serde_json::to_value(&back).unwrap(),
        &serde_json::to_value(&r).unwrap(),
        "",
    );
    assert!(std::fs::read_to_string(&w.markdown).unwrap() == md);
}

// ---- plans ----

fn bench_opts() -> sbod_lab::BenchOptions {
    sbod_lab::BenchOptions {
        name: "vol".into(),
        destructive: false,
        read_only: false,
        workloads: Vec::new(),
        phases: Vec::new(),
        runtime: 30.0,
        ramp: 5.0,
        reps: 3,
        cov_threshold: 0.05,
        precondition: Precondition::Full,
        working_set: None,
        qd_sweep: None,
        rebuild_rate: RebuildRate::Default,
        replacement: None,
        fail_member: None,
        drives: None,
        connections: Connections::Auto,
        sbod_version: "test".into(),
    }
}

#[test]
fn bench_refuses_to_overwrite_without_consent() {
    let e = sbod_lab::bench_plan(&bench_opts()).unwrap_err().to_string();
    assert!(e.contains("--destructive"), "{e}");
    assert!(e.contains("BASELINE") && e.contains("write workloads"));
    let mut o = bench_opts();
    o.destructive = true;
    let (_, cfg) = sbod_lab::bench_plan(&o).unwrap();
    assert_eq!(cfg.phases.len(), 4);
    assert_eq!(cfg.workloads.len(), sbod_lab::workload::catalogue().len());
    // Read-only: reads, no baseline, no preconditioning, no consent needed.
    let mut o = bench_opts();
    o.read_only = true;
    o.qd_sweep = Some(vec![1, 8]);
    let (_, cfg) = sbod_lab::bench_plan(&o).unwrap();
    assert!(!cfg.writes());
    assert!(!cfg.has(BASELINE) && cfg.has(DEVICE_DOWN));
    assert!(cfg.workloads.iter().all(|w| !w.writes()));
    assert_eq!(cfg.sweep_workloads.len(), 1);
    o.workloads = vec!["randwrite-4k".into()];
    assert!(sbod_lab::bench_plan(&o).is_err());
    let mut o = bench_opts();
    o.phases = vec!["sideways".into()];
    assert!(sbod_lab::bench_plan(&o).is_err());
}

#[test]
fn demo_fits_the_free_space() {
    let o = sbod_lab::DemoOptions {
        dir: "/tmp/x".into(),
        quick: false,
        level: "raid6".into(),
        members: None,
        size_each: None,
        runtime: None,
        reps: None,
        qd_sweep: false,
        integrity: "crc32c".into(),
        drives: None,
        connections: Connections::Auto,
        sbod_version: "t".into(),
    };
    let size = |free: Option<u64>| match sbod_lab::demo_plan(&o, free).unwrap().0 {
        sbod_lab::sbod::Setup::Fresh {
            size_each, members, ..
        } => (members, size_each),
        _ => unreachable!(),
    };
    assert_eq!(size(None), (8, 1 << 30));
    assert_eq!(size(Some(100 << 30)), (8, 1 << 30));
    assert_eq!(size(Some(3 << 30)), (8, 256 << 20));
    assert!(sbod_lab::demo_plan(&o, Some(100 << 20)).is_err());
    let q = sbod_lab::DemoOptions {
        quick: true,
        ..o.clone()
    };
    let (_, cfg) = sbod_lab::demo_plan(&q, None).unwrap();
    assert_eq!(cfg.workloads.len(), 2);
    assert_eq!(cfg.phases.len(), 4);
}
