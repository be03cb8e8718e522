//! sbod's storage lab: the field's fio methodology (shared/FIELD.md) built in.
//!
//! `sbod bench NAME` measures an array through its life cycle (NOMINAL, DEVICE DOWN,
//! DEVICE REBUILD) against a BASELINE of its members without RAID, with the field's
//! workloads, repetitions and coefficients of variation; `sbod demo` does the same on
//! file-backed members it creates and removes. Both write a JSON document (schema
//! `sbod-bench/1`, docs/LAB.md), a Markdown summary and a self-contained HTML report.

pub mod backend;
pub mod ceph;
pub mod fio;
pub mod floor;
pub mod ideal;
pub mod machine;
pub mod orchestrate;
pub mod proc;
pub mod progress;
pub mod report;
pub mod sbod;
pub mod schema;
pub mod stats;
pub mod workload;

use anyhow::{bail, Context, Result};
pub use orchestrate::Connections;
use orchestrate::{Cancel, Config, Precondition, Progress, RebuildRate, PERCENTILES};
use schema::{Report, PHASES};
use std::path::{Path, PathBuf};

/// Where a run's reports went.
#[derive(Clone, Debug)]
pub struct Written {
    pub json: PathBuf,
    pub markdown: PathBuf,
    pub html: PathBuf,
}

/// Write bench.json, summary.md and report.html into `dir`.
pub fn write_reports(r: &Report, dir: &Path) -> Result<Written> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let w = Written {
        json: dir.join("bench.json"),
        markdown: dir.join("summary.md"),
        html: dir.join("report.html"),
    };
    std::fs::write(&w.json, serde_json::to_string_pretty(r)? + "\n")?;
    std::fs::write(&w.markdown, report::markdown(r))?;
    std::fs::write(&w.html, report::html(r))?;
    Ok(w)
}

/// What a run leaves: the report (partial when it stopped early), where it was written, and
/// how the run ended.
pub struct Outcome {
    pub report: Report,
    pub written: Option<Written>,
    pub result: Result<()>,
}

/// Run a lab with the real fio and sbod, and write its reports into `out` (also when it
/// stopped early, if anything was measured).
pub fn execute(
    exe: PathBuf,
    setup: sbod::Setup,
    cfg: Config,
    cancel: Cancel,
    progress: &mut dyn Progress,
    out: &Path,
) -> Result<Outcome> {
    let mut backend = sbod::SbodBackend::new(exe, setup)?;
    execute_on(&mut backend, cfg, cancel, progress, out)
}

/// Run a lab on any backend (an sbod array, a Ceph RBD image) with the real fio, and write
/// its reports into `out`.
pub fn execute_on(
    backend: &mut dyn backend::Backend,
    cfg: Config,
    cancel: Cancel,
    progress: &mut dyn Progress,
    out: &Path,
) -> Result<Outcome> {
    let mut fio = fio::RealFio::default();
    let lab = orchestrate::Lab::new(cfg, backend, &mut fio, progress, cancel);
    let (report, result) = lab.run();
    let written = if !report.runs.is_empty() || result.is_ok() {
        Some(write_reports(&report, out)?)
    } else {
        None
    };
    Ok(Outcome {
        report,
        written,
        result,
    })
}

/// `sbod demo` settings.
#[derive(Clone, Debug)]
pub struct DemoOptions {
    /// Folder for the members (removed afterwards) and the report (kept).
    pub dir: PathBuf,
    /// The CI version: tiny members, 1-second runs, two workloads.
    pub quick: bool,
    pub level: String,
    pub members: Option<u32>,
    pub size_each: Option<u64>,
    pub runtime: Option<f64>,
    pub reps: Option<u32>,
    pub qd_sweep: bool,
    /// `--integrity` of the demo's array (crc32c, none).
    pub integrity: String,
    /// `--drives`: the members are modelled drives of this profile (with options, as in
    /// `model:PROFILE[,OPTIONS]:PATH`; checked by the caller).
    pub drives: Option<String>,
    /// `--connections`: client connections of the array's jobs.
    pub connections: Connections,
    pub sbod_version: String,
}

/// Size the demo to the machine: 8 x 1 GiB in raid6 when the folder's file system has room
/// (the members are sparse, but preconditioning and the rebuild fill part of them), smaller
/// when it has not.
pub fn demo_plan(o: &DemoOptions, free_bytes: Option<u64>) -> Result<(sbod::Setup, Config)> {
    let members = o.members.unwrap_or(if o.quick { 6 } else { 8 });
    let mut size = o
        .size_each
        .unwrap_or(if o.quick { 32 << 20 } else { 1 << 30 });
    if let Some(free) = free_bytes {
        // Room for every member written in full, plus a quarter.
        let need = |s: u64| s * members as u64 / 4 * 5;
        while need(size) > free && size > 64 << 20 && o.size_each.is_none() {
            size /= 2;
        }
        if need(size) > free {
            bail!(
                "{} has {} free; the demo needs about {} for {members} members of {} (choose another --dir or smaller --size-each)",
                o.dir.display(),
                report::fmt_bytes(free as f64),
                report::fmt_bytes(need(size) as f64),
                report::fmt_bytes(size as f64)
            );
        }
    }
    let ids: Vec<String> = if o.quick {
        vec!["randread-4k".into(), "randwrite-4k".into()]
    } else {
        workload::DEMO_SET.iter().map(|s| s.to_string()).collect()
    };
    let cfg = Config {
        mode: "demo".into(),
        sbod_version: o.sbod_version.clone(),
        workloads: workload::select(&ids)?,
        sweep_workloads: if o.qd_sweep {
            workload::sweep_catalogue()
                .into_iter()
                .filter(|w| w.id == "sweep-randread-4k")
                .collect()
        } else {
            Vec::new()
        },
        qd_sweep: vec![1, 4, 16, 64],
        phases: PHASES.iter().map(|s| s.to_string()).collect(),
        runtime: o.runtime.unwrap_or(1.0),
        ramp: if o.quick { 0.0 } else { 0.5 },
        reps: o.reps.unwrap_or(2),
        cov_threshold: 0.1,
        precondition: Precondition::Seq,
        working_set: Some(if o.quick { 64 << 20 } else { 1 << 30 }),
        percentiles: PERCENTILES.to_vec(),
        rebuild_rate: RebuildRate::Span,
        fail_member: None,
        connections: o.connections,
    };
    let setup = sbod::Setup::Fresh {
        dir: o.dir.join("members"),
        name: "demo".into(),
        level: o.level.clone(),
        chunk: "64K".into(),
        members,
        size_each: size,
        integrity: o.integrity.clone(),
        drives: o.drives.clone(),
    };
    Ok((setup, cfg))
}

/// `sbod bench NAME` settings.
#[derive(Clone, Debug)]
pub struct BenchOptions {
    pub name: String,
    /// Consent to overwrite the volume's data (write workloads, preconditioning) and the
    /// members (BASELINE, after which the array is created again on them).
    pub destructive: bool,
    /// Only read workloads, no BASELINE, no preconditioning: safe for data.
    pub read_only: bool,
    pub workloads: Vec<String>,
    pub phases: Vec<String>,
    pub runtime: f64,
    pub ramp: f64,
    pub reps: u32,
    pub cov_threshold: f64,
    pub precondition: Precondition,
    pub working_set: Option<u64>,
    pub qd_sweep: Option<Vec<u32>>,
    pub rebuild_rate: RebuildRate,
    pub replacement: Option<String>,
    pub fail_member: Option<String>,
    /// `--drives`: serve the array's file members (and BASELINE's) as modelled drives of
    /// this profile (`SBOD_DRIVE_MODEL` in the servers' environment).
    pub drives: Option<String>,
    /// `--connections`: client connections of the array's jobs.
    pub connections: Connections,
    pub sbod_version: String,
}

/// Check a bench request and turn it into a plan.
pub fn bench_plan(o: &BenchOptions) -> Result<(sbod::Setup, Config)> {
    for p in &o.phases {
        if !PHASES.contains(&p.as_str()) {
            bail!("unknown phase '{p}'; phases: {}", PHASES.join(", "));
        }
    }
    let mut phases: Vec<String> = if o.phases.is_empty() {
        PHASES.iter().map(|s| s.to_string()).collect()
    } else {
        PHASES
            .iter()
            .filter(|p| o.phases.iter().any(|x| x == *p))
            .map(|s| s.to_string())
            .collect()
    };
    let mut workloads = workload::select(&o.workloads)?;
    let mut sweep = if o.qd_sweep.is_some() {
        workload::sweep_catalogue()
    } else {
        Vec::new()
    };
    let mut precondition = o.precondition;
    if o.read_only {
        if !o.workloads.is_empty() && workloads.iter().any(|w| w.writes()) {
            bail!("--read-only runs read workloads only; drop the writing ones from --workloads");
        }
        workloads.retain(|w| !w.writes());
        sweep.retain(|w| !w.writes());
        phases.retain(|p| p != schema::BASELINE);
        precondition = Precondition::None;
    }
    let qd_sweep = o.qd_sweep.clone().unwrap_or_default();
    if qd_sweep.iter().any(|q| *q == 0 || *q > 4096) {
        bail!("queue depths of the sweep must be 1 to 4096");
    }
    let cfg = Config {
        mode: "bench".into(),
        sbod_version: o.sbod_version.clone(),
        workloads,
        sweep_workloads: sweep,
        qd_sweep,
        phases,
        runtime: o.runtime,
        ramp: o.ramp,
        reps: o.reps,
        cov_threshold: o.cov_threshold,
        precondition,
        working_set: o.working_set,
        percentiles: PERCENTILES.to_vec(),
        rebuild_rate: o.rebuild_rate,
        fail_member: o.fail_member.clone(),
        connections: o.connections,
    };
    if cfg.reps == 0 || cfg.runtime <= 0.0 {
        bail!("--reps and --runtime must be positive");
    }
    if cfg.writes() && !o.destructive {
        bail!(
            "this plan overwrites '{}': {}. Pass --destructive to accept that (the array keeps its layout and members, not its data), or --read-only for read workloads without BASELINE",
            o.name,
            [
                (cfg.has(schema::BASELINE), "BASELINE serves each member alone, which overwrites the members and creates the array again afterwards"),
                (cfg.precondition != Precondition::None, "preconditioning fills the volume"),
                (cfg.workloads.iter().chain(cfg.sweep_workloads.iter()).any(|w| w.writes()), "write workloads write over the volume"),
            ]
            .iter()
            .filter(|x| x.0)
            .map(|x| x.1)
            .collect::<Vec<_>>()
            .join("; ")
        );
    }
    Ok((
        sbod::Setup::Existing {
            name: o.name.clone(),
            replacement: o.replacement.clone(),
            drives: o.drives.clone(),
        },
        cfg,
    ))
}

/// What `sbod bench --target rbd:POOL/IMAGE` will do to the cluster, in words (printed
/// before it starts, and the reason it asks for --destructive).
pub fn ceph_effects(cfg: &Config, t: &ceph::CephTarget, fail_osd: Option<u32>) -> Vec<String> {
    let mut v = Vec::new();
    if cfg.precondition != Precondition::None
        || cfg
            .workloads
            .iter()
            .chain(cfg.sweep_workloads.iter())
            .any(|w| w.writes())
    {
        v.push(format!(
            "writes over the image {}/{} (preconditioning and write workloads): its data is lost",
            t.pool, t.image
        ));
    }
    let osd = fail_osd
        .map(|i| format!("osd.{i}"))
        .unwrap_or_else(|| "the OSD with the highest id".into());
    if cfg.has(schema::DEVICE_DOWN) || cfg.has(schema::DEVICE_REBUILD) {
        v.push(format!(
            "DEVICE DOWN sets the cluster's norecover and nobackfill flags, stops {osd} ({}) and marks it out: the pools on it run degraded",
            t.stop_text(fail_osd)
        ));
        v.push(format!(
            "DEVICE REBUILD (and the end of the run, whatever happens) starts {osd} again, marks it in and unsets the flags: recovery and backfill run until every PG is active+clean"
        ));
    }
    v
}

/// Check `sbod bench --target rbd:...` and turn it into a plan: the array's plan without
/// BASELINE (the OSDs' devices are the cluster's) and with Ceph's own recovery pace.
pub fn ceph_bench_plan(o: &BenchOptions, t: &ceph::CephTarget) -> Result<Config> {
    let mut o = o.clone();
    if o.phases.iter().any(|p| p == schema::BASELINE) {
        bail!("BASELINE would overwrite the OSDs' devices of a live cluster: leave it out for rbd: targets (scripts/bench-ceph.sh measures the same files alone before it makes the cluster)");
    }
    if !matches!(o.rebuild_rate, RebuildRate::Default) {
        bail!("--rebuild-rate: Ceph's recovery has no bytes/s limit; leave it at default (osd_max_backfills and osd_recovery_sleep set its pace)");
    }
    if let Some(f) = &o.fail_member {
        if !f.starts_with("osd.") || f[4..].parse::<u32>().is_err() {
            bail!("--fail {f}: name an OSD as osd.N");
        }
    }
    if o.replacement.is_some() || o.drives.is_some() {
        bail!("--replacement and --drives are for sbod arrays; a Ceph OSD restarts in place");
    }
    if o.phases.is_empty() {
        o.phases = PHASES
            .iter()
            .filter(|p| **p != schema::BASELINE)
            .map(|s| s.to_string())
            .collect();
    }
    let destructive = o.destructive;
    o.destructive = true;
    o.name = format!("{}/{}", t.pool, t.image);
    let (_, cfg) = bench_plan(&o)?;
    let effects = ceph_effects(
        &cfg,
        t,
        o.fail_member.as_ref().and_then(|f| f[4..].parse().ok()),
    );
    if !destructive && !effects.is_empty() {
        bail!(
            "this plan changes the cluster: {}. Pass --destructive to accept that, or --read-only --phases nominal for read workloads that change nothing",
            effects.join("; ")
        );
    }
    Ok(cfg)
}
