//! The life cycle: BASELINE, NOMINAL, DEVICE DOWN, DEVICE REBUILD, each a series of fio
//! measurements, with the array put back together whatever happens.

use crate::backend::Backend;
use crate::fio::{is_cancelled, sleep_while, Cancelled, FioJob, FioRunner, Target};
use crate::machine;
use crate::schema::*;
use crate::stats;
use anyhow::{anyhow, bail, Result};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Ctrl-C, counted: the first stops the measurements (the array is still put back together),
/// the second stops waiting for that too.
#[derive(Clone, Default)]
pub struct Cancel(Arc<AtomicU32>);

impl Cancel {
    pub fn new() -> Cancel {
        Cancel::default()
    }
    pub fn request(&self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
    pub fn count(&self) -> u32 {
        self.0.load(Ordering::SeqCst)
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Precondition {
    None,
    /// One sequential 1M pass over the working set.
    Seq,
    /// Two sequential passes, then one 4K random pass (the field's recipe).
    Full,
}

impl Precondition {
    pub fn name(&self) -> &'static str {
        match self {
            Precondition::None => "none",
            Precondition::Seq => "seq",
            Precondition::Full => "full",
        }
    }
}

impl std::str::FromStr for Precondition {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(Precondition::None),
            "seq" => Ok(Precondition::Seq),
            "full" => Ok(Precondition::Full),
            _ => Err(format!("'{s}': use none, seq or full")),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RebuildRate {
    /// The array's own settings (a floor of 50 MB/s while clients do I/O).
    Default,
    /// Pin the rebuild to this many bytes/s.
    Fixed(u64),
    /// Pick the rate that makes the rebuild last about as long as the DEVICE REBUILD
    /// workloads, so every one of them runs against a rebuilding array.
    Span,
}

/// How many client connections (fio job sections) carry the RAID set's queue depth.
///
/// BASELINE spreads a depth over up to one connection per member (each member is its own
/// export), so its client side copies and waits on as many sockets as the depth allows;
/// one connection for the array made every memory-speed ratio a measure of one socket's
/// ping-pong (docs/PERFORMANCE.md, "One connection against eight"). `Auto` gives the array
/// the same number of connections as BASELINE gets for the same depth, as a host with
/// multi-conn (nbd-client -C, nbdcopy) would use; an RBD image keeps one client, as
/// several librbd clients of one image fight over its exclusive lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Connections {
    Auto,
    Fixed(u32),
}

impl std::str::FromStr for Connections {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        if s == "auto" {
            return Ok(Connections::Auto);
        }
        match s.parse::<u32>() {
            Ok(n) if (1..=256).contains(&n) => Ok(Connections::Fixed(n)),
            _ => Err(format!(
                "--connections {s}: give auto or a count from 1 to 256"
            )),
        }
    }
}

impl std::fmt::Display for Connections {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Connections::Auto => write!(f, "auto"),
            Connections::Fixed(n) => write!(f, "{n}"),
        }
    }
}

impl Connections {
    /// Connections for a job of depth `qd` on a target of an array of `members` (never
    /// more than the depth: every connection keeps at least one request in flight).
    /// `streams` is a sequential job on members that stream like disks (rotational,
    /// [`crate::schema::MemberInfo::rotational`]): `Auto` gives it one connection, since
    /// `n` connections make it `n` streams ([`split_connections`]) and each disk would
    /// seek between them, where BASELINE streams each member once: a different workload,
    /// not a wider client (0.04 of BASELINE for raid6 of 8 modelled HDDs writing 1M,
    /// against 0.67-0.78 with one; docs/LAB.md, "Connections").
    pub fn count(self, qd: u32, members: usize, uri: &str, streams: bool) -> u32 {
        let n = match self {
            Connections::Fixed(n) => n,
            Connections::Auto if uri.starts_with("rbd:") || streams => 1,
            Connections::Auto => members.max(1) as u32,
        };
        n.min(qd).max(1)
    }
}

/// Is `w` one sequential stream (what [`split_connections`] cuts into parts)?
fn sequential(w: &Workload) -> bool {
    matches!(w.rw.as_str(), "read" | "write")
}

/// Bytes in an fio size ("1M", "128k", "4096"; binary units, as fio's default kb_base).
/// Not `sbod_types::size::parse_size`: that reads `4KB` as 4000, as disk vendors count,
/// where fio (kb_base=1024) reads it as 4096; this reads only the catalogue's spellings
/// and says None for anything else (the job is then split as a random one).
fn fio_bytes(s: &str) -> Option<u64> {
    let s = s.trim().to_ascii_lowercase();
    let (num, mul) = match s.chars().last()? {
        'k' => (&s[..s.len() - 1], 1u64 << 10),
        'm' => (&s[..s.len() - 1], 1 << 20),
        'g' => (&s[..s.len() - 1], 1 << 30),
        _ => (&s[..], 1),
    };
    num.parse::<u64>().ok().map(|n| n * mul)
}

/// One target's job split over `n` connections. Random workloads address the whole
/// target from every connection. A sequential workload becomes `n` sequential streams,
/// connection i streaming through the i-th of `n` equal parts (whole blocks) of the
/// target, as fio's `numjobs` with `offset_increment` does: a host's writers each on its
/// own connection (a Linux multi-queue NBD client maps each CPU's requests to one
/// connection). One stream dealt out over the connections in turn (`rw=write:SKIP`) was
/// tried and dropped: the connections drift apart, and a stripe split between two
/// requests waits for a neighbour on a lagging connection (docs/PERFORMANCE.md, "One
/// connection against eight").
pub fn split_connections(t: &Target, w: &Workload, n: u32) -> Vec<Target> {
    if n <= 1 {
        return vec![t.clone()];
    }
    let seq_bs = match (w.rw.as_str(), &w.bs) {
        ("read" | "write", Some(bs)) => fio_bytes(bs).filter(|b| *b > 0),
        _ => None,
    };
    let share = seq_bs.map(|bs| t.size / n as u64 / bs * bs);
    (0..n as u64)
        .map(|i| match share {
            Some(share) if share > 0 => Target {
                uri: t.uri.clone(),
                offset: t.offset + i * share,
                size: share,
            },
            _ => t.clone(),
        })
        .collect()
}

/// What to run.
#[derive(Clone, Debug)]
pub struct Config {
    /// "demo" or "bench".
    pub mode: String,
    pub sbod_version: String,
    pub workloads: Vec<Workload>,
    pub sweep_workloads: Vec<Workload>,
    pub qd_sweep: Vec<u32>,
    /// Phases to run, a subset of [`PHASES`].
    pub phases: Vec<String>,
    pub runtime: f64,
    pub ramp: f64,
    pub reps: u32,
    pub cov_threshold: f64,
    pub precondition: Precondition,
    /// Bytes of the volume to address (None: all of it).
    pub working_set: Option<u64>,
    pub percentiles: Vec<f64>,
    pub rebuild_rate: RebuildRate,
    /// The member to fail for DEVICE DOWN (default: the one in the last slot).
    pub fail_member: Option<String>,
    /// Client connections of the RAID set's jobs.
    pub connections: Connections,
}

/// Percentiles fio reports: enough points for a curve on a "nines" scale.
pub const PERCENTILES: [f64; 17] = [
    1.0, 5.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 95.0, 99.0, 99.5, 99.9, 99.95,
    99.99,
];

impl Config {
    pub fn has(&self, phase: &str) -> bool {
        self.phases.iter().any(|p| p == phase)
    }

    /// Does the plan write to the volume (or, for the baseline, to the members)?
    pub fn writes(&self) -> bool {
        self.precondition != Precondition::None
            || self.has(BASELINE)
            || self
                .workloads
                .iter()
                .chain(self.sweep_workloads.iter())
                .any(|w| w.writes())
    }

    fn run_secs(&self) -> f64 {
        self.runtime + self.ramp + 0.4
    }

    /// Planned seconds of one phase's measurements.
    pub fn phase_secs(&self, phase: &str) -> f64 {
        let mut n = self.workloads.len() as f64;
        if phase != DEVICE_REBUILD {
            n += (self.sweep_workloads.len() * self.qd_sweep.len()) as f64;
        }
        n * self.reps as f64 * self.run_secs()
    }
}

/// Shown while the run goes on.
pub trait Progress {
    /// What runs now, and how long the whole run has left (planned).
    fn status(&mut self, phase: &str, what: &str, left_secs: f64, done_frac: f64);
    /// A finished measurement or a note, printed above the status.
    fn line(&mut self, text: &str);
    fn finish(&mut self);
}

/// Progress that goes nowhere (tests).
pub struct NoProgress;

impl Progress for NoProgress {
    fn status(&mut self, _: &str, _: &str, _: f64, _: f64) {}
    fn line(&mut self, _: &str) {}
    fn finish(&mut self) {}
}

struct RebuildTrack {
    failed: String,
    replacement: String,
    started: Instant,
    started_secs: f64,
    finished: Option<(f64, u64)>,
    workloads_done: Option<Instant>,
    samples: Vec<[f64; 2]>,
    percent: f64,
    last_poll: Option<Instant>,
    total: u64,
    /// Seconds from the request until the server's rebuild process was first seen.
    began: Option<f64>,
}

pub struct Lab<'a> {
    cfg: Config,
    backend: &'a mut dyn Backend,
    fio: &'a mut dyn FioRunner,
    progress: &'a mut dyn Progress,
    cancel: Cancel,
    t0: Instant,
    started: String,
    runs: Vec<Run>,
    phases: Vec<PhaseInfo>,
    notes: Vec<String>,
    info: Option<ArrayInfo>,
    /// The CPU floor of a write on this machine, measured once the runs are done.
    floor: Option<crate::schema::CpuFloor>,
    failed: Option<String>,
    rebuild: Option<RebuildTrack>,
    plan_total: f64,
    plan_done: f64,
    step_started: Instant,
    step_planned: f64,
}

/// Round down to whole MiB.
fn mib_floor(x: u64) -> u64 {
    x / (1 << 20) * (1 << 20)
}

fn fmt_secs(s: f64) -> String {
    let s = s.max(0.0).round() as u64;
    if s >= 60 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{s}s")
    }
}

/// One line per measurement: what a user watches scroll by.
pub fn run_line(r: &Run) -> String {
    let m = &r.metrics;
    format!(
        "{:<14} {:<18} qd{:<3} rep {}  {:>10.0} IOPS {:>9.1} MB/s  p99 {:>9}  sbod cpu {:>4.0}%{}",
        r.phase,
        r.workload,
        r.iodepth,
        r.rep,
        m.iops,
        m.bw_bytes / 1e6,
        crate::report::fmt_ns(m.lat_p99_ns),
        m.server_cpu_pct,
        r.rebuild_percent
            .map(|p| format!("  rebuild {:.0}%->{:.0}%", p[0], p[1]))
            .unwrap_or_default()
    )
}

impl<'a> Lab<'a> {
    pub fn new(
        cfg: Config,
        backend: &'a mut dyn Backend,
        fio: &'a mut dyn FioRunner,
        progress: &'a mut dyn Progress,
        cancel: Cancel,
    ) -> Lab<'a> {
        Lab {
            cfg,
            backend,
            fio,
            progress,
            cancel,
            t0: Instant::now(),
            started: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
            runs: Vec::new(),
            phases: Vec::new(),
            notes: Vec::new(),
            info: None,
            floor: None,
            failed: None,
            rebuild: None,
            plan_total: 0.0,
            plan_done: 0.0,
            step_started: Instant::now(),
            step_planned: 0.0,
        }
    }

    fn now(&self) -> f64 {
        self.t0.elapsed().as_secs_f64()
    }

    fn keep_going(&self) -> bool {
        self.cancel.count() == 0
    }

    /// Run everything; the report comes back even when the run stopped early.
    pub fn run(mut self) -> (Report, Result<()>) {
        let mut result = self.run_phases();
        if let Err(e) = &result {
            if is_cancelled(e) {
                self.notes.push("stopped on request (Ctrl-C)".into());
            } else {
                self.notes.push(format!("stopped by an error: {e:#}"));
            }
        }
        if let Err(e) = self.restore() {
            self.notes.push(format!("restoring the array: {e:#}"));
            if result.is_ok() {
                result = Err(e);
            }
        }
        if let Err(e) = self.backend.array_down() {
            if result.is_ok() {
                result = Err(e);
            }
        }
        self.backend.cleanup();
        if !self.runs.is_empty() {
            // What the server's bytes per CPU-second are held against (about a second of
            // one core, with the machine as the runs had it).
            self.floor = self.info.as_ref().map(|i| {
                let scheme = crate::floor::scheme_of(&i.level, i.width, i.redundancy);
                crate::floor::measure(scheme, i.chunk_bytes as usize)
            });
        }
        self.progress.finish();
        let report = self.report(result.is_err());
        (report, result)
    }

    /// A member failed for DEVICE DOWN of an array that outlives the run is rebuilt before
    /// the run ends: never leave it degraded.
    fn restore(&mut self) -> Result<()> {
        if !self.backend.keeps_array() {
            return Ok(());
        }
        let Some(failed) = self.failed.clone() else {
            return Ok(());
        };
        if self.rebuild.is_none() {
            self.progress
                .line(&format!("restoring the array: rebuilding {failed}"));
            let replacement = self.backend.start_rebuild(&failed)?;
            self.rebuild = Some(RebuildTrack {
                failed: failed.clone(),
                replacement,
                started: Instant::now(),
                started_secs: self.now(),
                finished: None,
                workloads_done: Some(Instant::now()),
                samples: Vec::new(),
                percent: 0.0,
                last_poll: None,
                total: 0,
                began: None,
            });
        }
        if self.rebuild.as_ref().is_some_and(|r| r.finished.is_none()) {
            let _ = self.backend.set_rebuild_rate(0, 0);
            let cancel = self.cancel.clone();
            match self.finish_rebuild(&mut || cancel.count() < 2) {
                Err(e) if is_cancelled(&e) => {
                    self.notes.push(
                        "the rebuild was still running when the run was stopped a second time; it resumes when the array is next served".into(),
                    );
                }
                r => r?,
            }
        }
        Ok(())
    }

    fn begin_phase(&mut self, id: &str) {
        self.phases.push(PhaseInfo {
            id: id.into(),
            title: phase_title(id).into(),
            started_secs: self.now(),
            duration_secs: 0.0,
            note: None,
        });
        self.progress.line(&format!("== {}", phase_title(id)));
    }

    fn end_phase(&mut self) {
        let now = self.now();
        if let Some(p) = self.phases.last_mut() {
            p.duration_secs = now - p.started_secs;
        }
    }

    fn skip_phase(&mut self, id: &str, why: &str) {
        self.phases.push(PhaseInfo {
            id: id.into(),
            title: phase_title(id).into(),
            started_secs: self.now(),
            duration_secs: 0.0,
            note: Some(why.into()),
        });
        self.notes.push(format!("{}: {why}", phase_title(id)));
        self.progress
            .line(&format!("== {}: skipped: {why}", phase_title(id)));
    }

    fn plan(&mut self, info: &ArrayInfo) {
        let ws = self.working_set(info) as f64;
        let passes = match self.cfg.precondition {
            Precondition::None => 0.0,
            Precondition::Seq => 1.0,
            Precondition::Full => 2.5,
        };
        let pre = passes * ws / 150e6;
        let mut t = 0.0;
        if self.cfg.has(BASELINE) {
            t += pre + self.cfg.phase_secs(BASELINE) + 2.0;
        }
        if self.cfg.has(NOMINAL) || self.cfg.has(DEVICE_DOWN) || self.cfg.has(DEVICE_REBUILD) {
            t += pre + 2.0;
        }
        for p in [NOMINAL, DEVICE_DOWN, DEVICE_REBUILD] {
            if self.cfg.has(p) {
                t += self.cfg.phase_secs(p);
            }
        }
        self.plan_total = t;
    }

    fn step(&mut self, phase: &str, what: &str, planned: f64) {
        self.plan_done += self.step_planned;
        self.step_planned = planned;
        self.step_started = Instant::now();
        self.tick_status(phase, what);
    }

    fn tick_status(&mut self, phase: &str, what: &str) {
        let inside = self
            .step_started
            .elapsed()
            .as_secs_f64()
            .min(self.step_planned);
        let done = self.plan_done + inside;
        let left = (self.plan_total - done).max(0.0);
        let frac = if self.plan_total > 0.0 {
            (done / self.plan_total).min(1.0)
        } else {
            0.0
        };
        self.progress.status(phase_title(phase), what, left, frac);
    }

    fn working_set(&self, info: &ArrayInfo) -> u64 {
        mib_floor(
            self.cfg
                .working_set
                .unwrap_or(u64::MAX)
                .min(info.size_bytes),
        )
    }

    fn run_phases(&mut self) -> Result<()> {
        if self.cfg.reps == 0 {
            bail!("repetitions must be at least 1");
        }
        let info = self.backend.describe()?;
        self.info = Some(info.clone());
        self.plan(&info);
        let ws = self.working_set(&info);
        if ws < 8 << 20 {
            bail!("the working set is too small ({ws} bytes): give the array at least 8 MiB");
        }
        if self.cfg.has(BASELINE) {
            self.begin_phase(BASELINE);
            self.step(BASELINE, "serving each member alone", 2.0);
            let targets = self.backend.baseline_up()?;
            let n = targets.len().max(1) as u64;
            // Each member the bytes of it the array's working set will occupy (its data
            // and redundancy over the members carrying the layout), so that BASELINE and
            // the array stream over the same member bytes (a drive's outer bytes are
            // faster); without a known layout, its share of the working set.
            let per = crate::ideal::member_footprint(&info, ws)
                .unwrap_or(ws / n)
                .max(ws / n);
            let per = mib_floor(per).max(4 << 20);
            let targets: Vec<Target> = targets
                .into_iter()
                .map(|t| Target {
                    size: per.min(mib_floor(t.size)),
                    uri: t.uri,
                    ..Default::default()
                })
                .collect();
            self.precondition(BASELINE, &targets)?;
            self.measure(BASELINE, &targets)?;
            self.backend.baseline_down()?;
            self.end_phase();
        }
        let lifecycle = [NOMINAL, DEVICE_DOWN, DEVICE_REBUILD];
        if !lifecycle.iter().any(|p| self.cfg.has(p)) {
            return Ok(());
        }
        self.step(NOMINAL, "serving the array", 2.0);
        let cancel = self.cancel.clone();
        let (target, info) = self.backend.array_up(&mut || cancel.count() == 0)?;
        self.info = Some(info.clone());
        let target = Target {
            size: ws.min(mib_floor(target.size)),
            uri: target.uri,
            ..Default::default()
        };
        let targets = vec![target];
        self.precondition(NOMINAL, &targets)?;
        if self.cfg.has(NOMINAL) {
            self.begin_phase(NOMINAL);
            self.measure(NOMINAL, &targets)?;
            self.end_phase();
        }
        let down = self.cfg.has(DEVICE_DOWN);
        let rebuild = self.cfg.has(DEVICE_REBUILD);
        if !down && !rebuild {
            return Ok(());
        }
        if info.redundancy == 0 {
            let why = format!("{} has no redundancy: no member can fail", info.level);
            for p in [DEVICE_DOWN, DEVICE_REBUILD] {
                if self.cfg.has(p) {
                    self.skip_phase(p, &why);
                }
            }
            return Ok(());
        }
        let member = match &self.cfg.fail_member {
            Some(m) => m.clone(),
            None => info
                .members
                .iter()
                .max_by_key(|m| m.slot)
                .map(|m| m.path.clone())
                .ok_or_else(|| anyhow!("the array reports no members"))?,
        };
        self.progress.line(&format!("failing {member}"));
        self.backend.fail(&member)?;
        self.failed = Some(member.clone());
        if down {
            self.begin_phase(DEVICE_DOWN);
            let note = if crate::ideal::has_spare_capacity(&info) {
                format!(
                    "{member} failed; the array rebuilds into its spare {} at once, so this phase measures a rebuild (no ideal)",
                    if info.declustered { "space" } else { "member" }
                )
            } else {
                format!("{member} failed")
            };
            self.phases.last_mut().unwrap().note = Some(note);
            self.measure(DEVICE_DOWN, &targets)?;
            self.end_phase();
        }
        if rebuild {
            self.begin_phase(DEVICE_REBUILD);
            let member_size = info
                .members
                .iter()
                .find(|m| m.path == member)
                .map(|m| m.size_bytes)
                .unwrap_or(0);
            match self.cfg.rebuild_rate {
                RebuildRate::Default => {}
                RebuildRate::Fixed(r) => self.backend.set_rebuild_rate(r, r)?,
                RebuildRate::Span => {
                    let secs = self.cfg.phase_secs(DEVICE_REBUILD).max(1.0);
                    let r = ((member_size as f64 / secs) as u64).max(1 << 20);
                    self.backend.set_rebuild_rate(r, r)?;
                    self.notes.push(format!(
                        "DEVICE REBUILD: rebuild rate pinned to {}/s so that it spans the workloads",
                        crate::report::fmt_bytes(r as f64)
                    ));
                }
            }
            let replacement = self.backend.start_rebuild(&member)?;
            self.progress.line(&format!(
                "rebuilding {} in place of {member}",
                if replacement == member {
                    "the same member, wiped,".to_string()
                } else {
                    replacement.clone()
                }
            ));
            self.rebuild = Some(RebuildTrack {
                failed: member.clone(),
                replacement,
                started: Instant::now(),
                started_secs: self.now(),
                finished: None,
                workloads_done: None,
                samples: vec![[0.0, 0.0]],
                percent: 0.0,
                last_poll: None,
                total: member_size,
                began: None,
            });
            self.measure(DEVICE_REBUILD, &targets)?;
            if let Some(r) = self.rebuild.as_mut() {
                r.workloads_done = Some(Instant::now());
            }
            match self.rebuild.as_ref().and_then(|r| r.finished) {
                Some((at, _)) => {
                    let msg = format!(
                        "the rebuild finished {:.1} s into DEVICE REBUILD, before its workloads did: runs after that measured an optimal array (see each run's rebuild_percent)",
                        at
                    );
                    self.phases.last_mut().unwrap().note = Some(msg.clone());
                    self.notes.push(format!("DEVICE REBUILD: {msg}"));
                }
                None => {
                    self.backend.set_rebuild_rate(0, 0)?;
                    let cancel = self.cancel.clone();
                    self.finish_rebuild(&mut || cancel.count() == 0)?;
                }
            }
            self.end_phase();
        }
        Ok(())
    }

    /// Poll the array until the rebuild is over.
    fn finish_rebuild(&mut self, keep_going: &mut dyn FnMut() -> bool) -> Result<()> {
        loop {
            self.poll_rebuild(true)?;
            let Some(r) = self.rebuild.as_ref() else {
                return Ok(());
            };
            if r.finished.is_some() {
                return Ok(());
            }
            let pct = r.percent;
            self.tick_status(DEVICE_REBUILD, &format!("finishing the rebuild: {pct:.0}%"));
            sleep_while(Duration::from_millis(500), keep_going)?;
        }
    }

    /// Look at the rebuild (at most once a second unless `now`).
    fn poll_rebuild(&mut self, now: bool) -> Result<()> {
        let Some(r) = self.rebuild.as_ref() else {
            return Ok(());
        };
        if r.finished.is_some()
            || (!now
                && r.last_poll
                    .is_some_and(|t| t.elapsed() < Duration::from_millis(500)))
        {
            return Ok(());
        }
        let st = self.backend.array_state()?;
        sample_rebuild(self.rebuild.as_mut().unwrap(), &st)
    }

    fn precondition(&mut self, phase: &str, targets: &[Target]) -> Result<()> {
        let passes: Vec<(&str, Vec<String>)> = match self.cfg.precondition {
            Precondition::None => vec![],
            Precondition::Seq => vec![("sequential fill", seq_fill())],
            Precondition::Full => vec![
                ("sequential fill 1/2", seq_fill()),
                ("sequential fill 2/2", seq_fill()),
                (
                    "random fill",
                    vec![
                        "--rw=randwrite".into(),
                        "--bs=4k".into(),
                        "--iodepth=32".into(),
                    ],
                ),
            ],
        };
        let bytes: u64 = targets.iter().map(|t| t.size).sum();
        for (what, args) in passes {
            let planned = bytes as f64 / 150e6;
            self.step(phase, &format!("precondition: {what}"), planned);
            let job = FioJob {
                label: format!("{phase} precondition {what}"),
                targets: targets.to_vec(),
                args,
                runtime: None,
                ramp: 0.0,
                percentiles: vec![50.0],
            };
            let t = Instant::now();
            let m = self.fio_watch(&job, phase, &format!("precondition: {what}"))?;
            self.progress.line(&format!(
                "{phase:<14} precondition: {what}: {} in {:.1} s ({:.0} MB/s)",
                crate::report::fmt_bytes(bytes as f64),
                t.elapsed().as_secs_f64(),
                m.bw_bytes / 1e6
            ));
        }
        Ok(())
    }

    fn measure(&mut self, phase: &str, targets: &[Target]) -> Result<()> {
        // BASELINE offers the same total queue depth as the RAID job: spread over as many
        // members as the depth allows, each at an equal share (rounded up).
        // The array's jobs get as many connections (`Connections`), each with its share of
        // the depth.
        let members = self.info.as_ref().map_or(1, |i| i.members.len());
        let disks = self.info.as_ref().is_some_and(ArrayInfo::on_disks);
        let conns = self.cfg.connections;
        let spread = |qd: u32, w: &Workload| -> (Vec<Target>, u32) {
            if phase == BASELINE {
                let used = (qd as usize).clamp(1, targets.len());
                (targets[..used].to_vec(), qd.div_ceil(used as u32).max(1))
            } else {
                let n = targets
                    .iter()
                    .map(|t| conns.count(qd, members, &t.uri, disks && sequential(w)))
                    .min()
                    .unwrap_or(1);
                let split = targets
                    .iter()
                    .flat_map(|t| split_connections(t, w, n))
                    .collect();
                (split, qd.div_ceil(n).max(1))
            }
        };
        let mut plan: Vec<(Workload, u32)> = self
            .cfg
            .workloads
            .iter()
            .map(|w| (w.clone(), w.iodepth))
            .collect();
        if phase != DEVICE_REBUILD {
            for w in &self.cfg.sweep_workloads {
                for qd in &self.cfg.qd_sweep {
                    plan.push((w.clone(), *qd));
                }
            }
        }
        for (w, qd) in plan {
            for rep in 1..=self.cfg.reps {
                if !self.keep_going() {
                    return Err(anyhow!(Cancelled));
                }
                let what = format!("{} qd{qd} rep {rep}/{}", w.id, self.cfg.reps);
                self.step(phase, &what, self.cfg.run_secs());
                let (job_targets, job_qd) = spread(qd, &w);
                let job_targets_n = job_targets.len() as u32;
                let job = FioJob {
                    label: format!("{phase} {what}"),
                    targets: job_targets,
                    args: w.fio_args(job_qd),
                    runtime: Some(self.cfg.runtime),
                    ramp: self.cfg.ramp,
                    percentiles: self.cfg.percentiles.clone(),
                };
                self.poll_rebuild(true)?;
                let pct0 = self.rebuild.as_ref().map(|r| r.percent);
                let cpu0 = self.backend.server_cpu_secs();
                let started_secs = self.now();
                let t = Instant::now();
                let mut m = self.fio_watch(&job, phase, &what)?;
                let wall = t.elapsed().as_secs_f64();
                let cpu1 = self.backend.server_cpu_secs();
                self.poll_rebuild(true)?;
                let pct1 = self.rebuild.as_ref().map(|r| r.percent);
                m.server_cpu_pct = if wall > 0.0 {
                    ((cpu1 - cpu0) / wall * 100.0).max(0.0)
                } else {
                    0.0
                };
                m.iops_per_cpu_pct = if m.server_cpu_pct > 0.0 {
                    m.iops / m.server_cpu_pct
                } else {
                    0.0
                };
                m.bytes_per_cpu_sec = if m.server_cpu_pct > 0.0 {
                    m.bw_bytes / (m.server_cpu_pct / 100.0)
                } else {
                    0.0
                };
                let run = Run {
                    phase: phase.into(),
                    workload: w.id.clone(),
                    iodepth: qd,
                    connections: job_targets_n,
                    rep,
                    started_secs,
                    wall_secs: wall,
                    metrics: m,
                    rebuild_percent: match (phase, pct0, pct1) {
                        (DEVICE_REBUILD, Some(a), Some(b)) => Some([a, b]),
                        _ => None,
                    },
                };
                self.progress.line(&run_line(&run));
                self.runs.push(run);
            }
        }
        Ok(())
    }

    /// fio with the status line ticking and, during DEVICE REBUILD, the rebuild sampled.
    fn fio_watch(
        &mut self,
        job: &FioJob,
        phase: &str,
        what: &str,
    ) -> Result<crate::schema::Metrics> {
        let Lab {
            fio,
            backend,
            progress,
            cancel,
            rebuild,
            plan_total,
            plan_done,
            step_started,
            step_planned,
            ..
        } = self;
        let mut last = Instant::now();
        let mut err: Option<anyhow::Error> = None;
        let r = fio.run(job, &mut || {
            if last.elapsed() >= Duration::from_millis(250) {
                last = Instant::now();
                let inside = step_started.elapsed().as_secs_f64().min(*step_planned);
                let done = *plan_done + inside;
                let left = (*plan_total - done).max(0.0);
                let frac = if *plan_total > 0.0 {
                    (done / *plan_total).min(1.0)
                } else {
                    0.0
                };
                let mut w = what.to_string();
                if let Some(r) = rebuild.as_mut() {
                    if r.finished.is_none()
                        && r.last_poll
                            .is_none_or(|t| t.elapsed() >= Duration::from_millis(500))
                    {
                        match backend.array_state() {
                            Ok(st) => {
                                if let Err(e) = sample_rebuild(r, &st) {
                                    err = Some(e);
                                    return false;
                                }
                            }
                            Err(e) => {
                                err = Some(e);
                                return false;
                            }
                        }
                    }
                    w = format!("{what} (rebuild {:.0}%)", r.percent);
                }
                progress.status(phase_title(phase), &w, left, frac);
            }
            cancel.count() == 0
        });
        if let Some(e) = err {
            return Err(e.context("watching the rebuild"));
        }
        r
    }

    fn report(&self, incomplete: bool) -> Report {
        let cells = stats::cells(&self.runs, self.cfg.cov_threshold);
        let mut flags: Vec<String> = cells
            .iter()
            .filter(|c| c.flagged)
            .map(|c| {
                format!(
                    "{} {} qd{}: IOPS COV {:.1}% over {} runs (threshold {:.0}%): investigate before trusting the mean",
                    phase_title(&c.phase),
                    c.workload,
                    c.iodepth,
                    c.cov.iops * 100.0,
                    c.n,
                    self.cfg.cov_threshold * 100.0
                )
            })
            .collect();
        for (c, n) in stats::few_ios(self.cfg.runtime, &cells) {
            flags.push(format!(
                "{} {} qd{}: about {n:.0} I/Os a run ({:.0} IOPS for {} s): a count this small is good to about {:.0}% at best; run longer (--runtime {:.0}) before judging its ratios",
                phase_title(&c.phase),
                c.workload,
                c.iodepth,
                c.mean.iops,
                self.cfg.runtime,
                100.0 / n.max(1.0).sqrt(),
                (1000.0 / c.mean.iops).ceil()
            ));
        }
        let info = self.info.clone().unwrap_or(ArrayInfo {
            name: String::new(),
            level: String::new(),
            chunk_bytes: 0,
            groups: 0,
            width: 0,
            redundancy: 0,
            declustered: false,
            size_bytes: 0,
            members: Vec::new(),
        });
        let mut workloads = self.cfg.workloads.clone();
        workloads.extend(self.cfg.sweep_workloads.iter().cloned());
        flags.extend(stats::cached_writes(info.on_disks(), &workloads, &cells));
        let mut cells = cells;
        for c in cells.iter_mut() {
            if let Some(w) = workloads.iter().find(|w| w.id == c.workload) {
                let measured = c.vs_baseline.as_ref().map(|r| r.iops);
                c.ideal = crate::ideal::ideal(&info, w, &c.phase, measured);
            }
        }
        let rebuild = self.rebuild.as_ref().map(|r| {
            let under_load = match (r.workloads_done, r.finished) {
                (Some(done), Some((secs, _))) => {
                    secs.min(done.duration_since(r.started).as_secs_f64())
                }
                (Some(done), None) => done.duration_since(r.started).as_secs_f64(),
                (None, Some((secs, _))) => secs,
                (None, None) => r.started.elapsed().as_secs_f64(),
            };
            RebuildInfo {
                failed_member: r.failed.clone(),
                replacement: r.replacement.clone(),
                bytes: r.finished.map(|f| f.1).unwrap_or(r.total),
                started_secs: r.started_secs,
                duration_secs: r.finished.map(|f| f.0),
                rate_bytes_per_sec: r.finished.filter(|f| f.0 > 0.0).map(|f| f.1 as f64 / f.0),
                finished_during_workloads: match (r.finished, r.workloads_done) {
                    (Some((secs, _)), Some(done)) => {
                        secs < done.duration_since(r.started).as_secs_f64()
                    }
                    (Some(_), None) => true,
                    _ => false,
                },
                under_load_secs: under_load,
                start_delay_secs: r.began,
                samples: r.samples.clone(),
            }
        });
        Report {
            schema: SCHEMA.into(),
            mode: self.cfg.mode.clone(),
            started: self.started.clone(),
            duration_secs: self.now(),
            incomplete,
            tool: Tool {
                sbod_version: self.cfg.sbod_version.clone(),
                fio_version: self.fio.version(),
            },
            machine: machine::info(),
            array: info.clone(),
            settings: Settings {
                runtime_secs: self.cfg.runtime,
                ramp_secs: self.cfg.ramp,
                repetitions: self.cfg.reps,
                cov_threshold: self.cfg.cov_threshold,
                precondition: self.cfg.precondition.name().into(),
                working_set_bytes: self.working_set(&info),
                baseline_iodepth: "spread".into(),
                connections: self.cfg.connections.to_string(),
                percentiles: self.cfg.percentiles.clone(),
                rebuild_rate_limit: match self.cfg.rebuild_rate {
                    RebuildRate::Default => None,
                    RebuildRate::Fixed(r) => Some(r),
                    RebuildRate::Span => {
                        let m = info.members.first().map(|m| m.size_bytes).unwrap_or(0);
                        let secs = self.cfg.phase_secs(DEVICE_REBUILD).max(1.0);
                        Some(((m as f64 / secs) as u64).max(1 << 20))
                    }
                },
                qd_sweep: if self.cfg.sweep_workloads.is_empty() {
                    Vec::new()
                } else {
                    self.cfg.qd_sweep.clone()
                },
            },
            workloads,
            phases: self.phases.clone(),
            runs: self.runs.clone(),
            cells,
            rebuild,
            flags,
            notes: self.notes.clone(),
            floor: self.floor.clone(),
        }
    }
}

/// Take one look at the array into the rebuild's record. Times are the lab's own clock from
/// the moment the rebuild was asked for, so a rebuild that starts late counts in full.
fn sample_rebuild(r: &mut RebuildTrack, st: &crate::backend::ArrayState) -> Result<()> {
    r.last_poll = Some(Instant::now());
    let t = r.started.elapsed().as_secs_f64();
    if let Some((kind, _, total)) = &st.process {
        if kind == "rebuild" {
            r.began.get_or_insert(t);
            r.total = *total;
            r.percent = st.percent().unwrap_or(0.0);
            r.samples.push([t, r.percent]);
        }
    } else if st.state == "optimal" {
        let bytes = match &st.last_process {
            Some((kind, total, _)) if kind == "rebuild" => *total,
            _ => r.total,
        };
        r.percent = 100.0;
        r.samples.push([t, 100.0]);
        r.finished = Some((t, bytes));
    } else if st.state == "failed" {
        bail!("the array failed during the rebuild");
    }
    Ok(())
}

fn seq_fill() -> Vec<String> {
    vec!["--rw=write".into(), "--bs=1M".into(), "--iodepth=16".into()]
}

/// Human duration for progress lines.
pub fn left_text(secs: f64) -> String {
    format!("~{} left", fmt_secs(secs))
}
