//! `sbod demo` and `sbod bench`: the storage lab (crate sbod-lab), wired to the command line
//! and to Ctrl-C.

use anyhow::{anyhow, Result};
use clap::Args;
use sbod_lab::orchestrate::{Cancel, Precondition, RebuildRate};
use sbod_lab::{report, BenchOptions, DemoOptions, Outcome};
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Folder for the demo's member files (removed afterwards) and its report (kept).
    #[arg(long, default_value = "sbod-demo")]
    pub dir: PathBuf,
    /// The CI version: tiny members, 1-second runs, two workloads (well under a minute).
    #[arg(long)]
    pub quick: bool,
    /// RAID level of the demo array.
    #[arg(long, default_value = "raid6")]
    pub level: String,
    /// Number of members (default 8; 6 with --quick).
    #[arg(long)]
    pub members: Option<u32>,
    /// Size of each member file (default 1G, less when the folder's file system is short).
    #[arg(long, value_parser = crate::cmd::size_arg)]
    pub size_each: Option<u64>,
    /// Seconds per measurement.
    #[arg(long)]
    pub runtime: Option<f64>,
    /// Repetitions per measurement.
    #[arg(long)]
    pub reps: Option<u32>,
    /// Add a queue-depth sweep (4K random read at QD 1, 4, 16, 64).
    #[arg(long)]
    pub qd_sweep: bool,
    /// Checksums on every block of the demo's array: crc32c or none.
    #[arg(long, default_value = "crc32c")]
    pub integrity: sbod_types::Integrity,
    /// Modelled drives as members: a profile (hdd-nearline, hdd-nearline-sas, hdd-dual,
    /// nvme-dc) with options, e.g. `hdd-nearline,link=exp0@2.4G` (docs/LAB.md, "Modelled
    /// drives"). The member files keep the data; the model sets the time.
    #[arg(long)]
    pub drives: Option<String>,
    /// Client connections the array's jobs spread their queue depth over: auto (as many as
    /// BASELINE gets for the same depth, one per member up to the depth; a sequential
    /// stream stays one stream, its blocks taken in turn) or a count, e.g. 1.
    #[arg(long, default_value = "auto")]
    pub connections: sbod_lab::Connections,
}

/// Check a `--drives` value as the member name `model:DRIVES:PATH` would be.
fn check_drives(d: &Option<String>) -> Result<()> {
    if let Some(d) = d {
        sbod_drive::Spec::parse(&format!("model:{d}:/x")).map_err(|e| {
            anyhow!(
                "--drives {d}: {}",
                e.replace("'model:", "'").replace(":/x'", "'")
            )
        })?;
    }
    Ok(())
}

/// `sbod bench NAME` (an array through its life cycle) or `sbod bench codec` (the parity
/// codec alone).
#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct BenchCmd {
    #[command(subcommand)]
    pub what: Option<BenchWhat>,
    #[command(flatten)]
    pub array: BenchArgs,
}

#[derive(clap::Subcommand, Debug)]
pub enum BenchWhat {
    /// Measure sbod's parity codec on this CPU (no disks): XOR, P+Q and Cauchy K+M encode,
    /// decode and update, cache-resident and streaming, against the memory-copy ceiling.
    /// scripts/bench-codec.sh runs the same beside ISA-L and klauspost/reedsolomon.
    Codec(CodecArgs),
}

#[derive(Args, Debug)]
pub struct CodecArgs {
    /// Print the report as JSON (schema: sbod_codec::bench::Report).
    #[arg(long)]
    pub json: bool,
    /// Longer rounds for steadier figures (about ten times the default run).
    #[arg(long)]
    pub long: bool,
    /// Kernels to measure (portable, avx2, avx512, gfni, gfni-avx2, gfni-avx512; default:
    /// the best this CPU has).
    #[arg(long)]
    pub isa: Option<String>,
    /// Only the cases whose name contains TEXT (e.g. "10+4", "encode", "xor").
    #[arg(long)]
    pub filter: Option<String>,
    /// Shard sizes (comma separated, e.g. 4K,64K,1M).
    #[arg(long, value_delimiter = ',', value_parser = crate::cmd::size_arg)]
    pub sizes: Vec<u64>,
    /// Size of the streaming working set (well above the last-level cache).
    #[arg(long, default_value = "256M", value_parser = crate::cmd::size_arg)]
    pub stream: u64,
}

/// `sbod bench codec`.
pub fn bench_codec(a: CodecArgs) -> Result<()> {
    use sbod_codec::bench;
    let mut opts = if a.long {
        bench::Options::long()
    } else {
        bench::Options::default()
    };
    if let Some(isa) = &a.isa {
        let isa: sbod_codec::Isa = isa.parse().map_err(|e: String| anyhow!("--isa: {e}"))?;
        if !isa.is_supported() {
            return Err(anyhow!(
                "--isa {isa}: this CPU lacks it (it has: {})",
                sbod_codec::Isa::supported()
                    .iter()
                    .map(|i| i.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        opts.isa = Some(isa);
    }
    if let Some(f) = &a.filter {
        opts.cases.retain(|c| c.name().contains(f.as_str()));
        if opts.cases.is_empty() {
            return Err(anyhow!(
                "--filter {f:?} matches no case (try xor, p+q, 10+4, encode, decode, update)"
            ));
        }
    }
    if !a.sizes.is_empty() {
        opts.shard_sizes = a.sizes.iter().map(|&s| s as usize).collect();
        if let Some(s) = opts.shard_sizes.iter().find(|&&s| s == 0 || s % 64 != 0) {
            return Err(anyhow!(
                "--sizes: a shard of {s} bytes is not a multiple of 64"
            ));
        }
    }
    opts.stream_bytes = a.stream as usize;
    let report = bench::run(&opts);
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        bench::print_table(&report);
    }
    Ok(())
}

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// The array to measure (registered, not being served: bench serves it itself).
    #[arg(required_unless_present = "target")]
    pub name: Option<String>,
    /// Measure a Ceph RBD image instead of an sbod array: rbd:POOL/IMAGE (for an image with
    /// its data in an EC pool, the pool of its header). Same phases and report; BASELINE
    /// is left out, DEVICE DOWN stops an OSD and marks it out (with --destructive).
    #[arg(long, conflicts_with = "name")]
    pub target: Option<String>,
    /// The cluster's configuration file (for --target rbd:...).
    #[arg(long, default_value = "/etc/ceph/ceph.conf")]
    pub ceph_conf: PathBuf,
    /// The Ceph client id (for --target rbd:...).
    #[arg(long, default_value = "admin")]
    pub ceph_id: String,
    /// Command that stops OSD {id} for DEVICE DOWN (default: systemctl stop ceph-osd@{id},
    /// or the pid file of a cluster made by scripts/ceph-single-node.sh).
    #[arg(long)]
    pub ceph_osd_stop: Option<String>,
    /// Command that starts OSD {id} again for DEVICE REBUILD.
    #[arg(long)]
    pub ceph_osd_start: Option<String>,
    /// Accept that the run overwrites the volume's data (write workloads, preconditioning)
    /// and, for BASELINE, the members themselves: the array is created again on them
    /// afterwards, with the same layout and no data.
    #[arg(long)]
    pub destructive: bool,
    /// Read workloads only, no BASELINE, no preconditioning: the data survives.
    #[arg(long, conflicts_with = "destructive")]
    pub read_only: bool,
    /// Workloads to run (comma separated; default all): randread-4k, randwrite-4k,
    /// randrw70-4k, seqread-128k, seqwrite-128k, seqread-1m, seqwrite-1m, mixed-bssplit,
    /// qd1-randread-4k, qd1-randwrite-4k.
    #[arg(long, value_delimiter = ',')]
    pub workloads: Vec<String>,
    /// Phases to run (comma separated; default all): baseline, nominal, device-down,
    /// device-rebuild.
    #[arg(long, value_delimiter = ',')]
    pub phases: Vec<String>,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 30.0)]
    pub runtime: f64,
    /// Seconds of ramp before each measurement.
    #[arg(long, default_value_t = 5.0)]
    pub ramp: f64,
    /// Repetitions per measurement.
    #[arg(long, default_value_t = 3)]
    pub reps: u32,
    /// Flag measurements whose IOPS vary more than this (coefficient of variation).
    #[arg(long, default_value_t = 0.05)]
    pub cov_threshold: f64,
    /// none, seq (one sequential pass) or full (two sequential passes and a random one).
    #[arg(long, default_value = "full")]
    pub precondition: Precondition,
    /// Address only the first SIZE of the volume (default: all of it).
    #[arg(long, value_parser = crate::cmd::size_arg)]
    pub working_set: Option<u64>,
    /// Add queue-depth sweeps (4K random read and write) at these depths, e.g.
    /// 1,2,4,8,16,32,64,128,256.
    #[arg(long, value_delimiter = ',', num_args = 0.., default_missing_value = "1,2,4,8,16,32,64,128,256")]
    pub qd_sweep: Option<Vec<u32>>,
    /// Rebuild rate during DEVICE REBUILD: a rate (e.g. 200M), "span" (as slow as makes
    /// the rebuild last the phase's workloads) or "default" (the array's own settings).
    #[arg(long, default_value = "default")]
    pub rebuild_rate: String,
    /// Rebuild onto this device instead of the failed member itself (it joins the array).
    #[arg(long)]
    pub replacement: Option<String>,
    /// The member to fail for DEVICE DOWN (default: the one in the last slot).
    #[arg(long)]
    pub fail: Option<String>,
    /// Folder for the reports (default sbod-bench-NAME).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Serve the array's file members (and BASELINE's) as modelled drives of this profile,
    /// e.g. hdd-nearline (docs/LAB.md, "Modelled drives").
    #[arg(long)]
    pub drives: Option<String>,
    /// Client connections the array's jobs spread their queue depth over: auto (as many as
    /// BASELINE gets for the same depth, one per member up to the depth; a sequential
    /// stream stays one stream, its blocks taken in turn) or a count, e.g. 1.
    #[arg(long, default_value = "auto")]
    pub connections: sbod_lab::Connections,
}

/// Ctrl-C and SIGTERM count into `cancel`: the first stops the measurements, the second
/// stops waiting for a rebuild that restores the array.
fn watch_signals(cancel: Cancel, progress_note: &'static str) {
    tokio::spawn(async move {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(t) => t,
                Err(_) => return,
            };
        loop {
            tokio::select! {
                r = tokio::signal::ctrl_c() => { if r.is_err() { return; } }
                _ = term.recv() => {}
            }
            cancel.request();
            if cancel.count() == 1 {
                eprintln!("\nstopping: {progress_note}");
            } else {
                eprintln!("\nstopping now");
            }
        }
    });
}

fn finish(o: Outcome) -> Result<()> {
    if o.report.runs.is_empty() {
        return o.result;
    }
    println!();
    println!("{}", report::array_line(&o.report));
    println!();
    print!("{}", report::summary_table(&o.report));
    if let Some(l) = report::rebuild_line(&o.report) {
        println!("\n{l}.");
    }
    for f in &o.report.flags {
        println!("⚠ {f}");
    }
    if let Some(w) = &o.written {
        println!();
        println!("HTML report: {}", w.html.display());
        println!("summary:     {}", w.markdown.display());
        println!("JSON:        {}", w.json.display());
    }
    o.result
}

pub async fn demo(a: DemoArgs) -> Result<()> {
    let exe = std::env::current_exe()?;
    let dir = if a.dir.is_absolute() {
        a.dir.clone()
    } else {
        std::env::current_dir()?.join(&a.dir)
    };
    check_drives(&a.drives)?;
    std::fs::create_dir_all(&dir)?;
    let o = DemoOptions {
        dir: dir.clone(),
        quick: a.quick,
        level: a.level,
        members: a.members,
        size_each: a.size_each,
        runtime: a.runtime,
        reps: a.reps,
        qd_sweep: a.qd_sweep,
        integrity: a.integrity.to_string(),
        drives: a.drives.clone(),
        connections: a.connections,
        sbod_version: env!("CARGO_PKG_VERSION").into(),
    };
    let (setup, cfg) = sbod_lab::demo_plan(&o, sbod_lab::machine::free_bytes(&dir))?;
    if let sbod_lab::sbod::Setup::Fresh {
        members,
        size_each,
        level,
        drives,
        ..
    } = &setup
    {
        let kind = match drives {
            Some(d) => format!("modelled {d} drives as members, their data in files"),
            None => "file members".to_string(),
        };
        eprintln!(
            "sbod demo: {members} {kind} of {} in {level}, in {}; {} workloads x {} repetitions x {:.0} s through BASELINE, NOMINAL, DEVICE DOWN and DEVICE REBUILD",
            report::fmt_bytes(*size_each as f64),
            dir.join("members").display(),
            cfg.workloads.len(),
            cfg.reps,
            cfg.runtime
        );
    }
    let cancel = Cancel::new();
    watch_signals(
        cancel.clone(),
        "stopping the servers and removing the demo's members (Ctrl-C again to hurry)",
    );
    let out = dir.join("report");
    let o = tokio::task::spawn_blocking(move || {
        let mut progress = sbod_lab::progress::BarProgress::new();
        sbod_lab::execute(exe, setup, cfg, cancel, &mut progress, &out)
    })
    .await
    .map_err(|e| anyhow!("lab thread: {e}"))??;
    let members_dir = dir.join("members");
    let _ = std::fs::remove_dir(&members_dir);
    finish(o)
}

pub async fn bench(a: BenchArgs) -> Result<()> {
    let name = match (&a.name, &a.target) {
        (Some(n), _) => n.clone(),
        (None, Some(t)) => t.clone(),
        (None, None) => {
            return Err(anyhow!(
                "which array? `sbod bench NAME` (or `sbod bench codec`, or --target rbd:POOL/IMAGE)"
            ))
        }
    };
    let exe = std::env::current_exe()?;
    check_drives(&a.drives)?;
    let rebuild_rate = match a.rebuild_rate.as_str() {
        "default" => RebuildRate::Default,
        "span" => RebuildRate::Span,
        r => {
            RebuildRate::Fixed(crate::cmd::size_arg(r).map_err(|e| anyhow!("--rebuild-rate: {e}"))?)
        }
    };
    let o = BenchOptions {
        name: name.clone(),
        destructive: a.destructive,
        read_only: a.read_only,
        workloads: a.workloads,
        phases: a.phases,
        runtime: a.runtime,
        ramp: a.ramp,
        reps: a.reps,
        cov_threshold: a.cov_threshold,
        precondition: a.precondition,
        working_set: a.working_set,
        qd_sweep: a.qd_sweep,
        rebuild_rate,
        replacement: a.replacement,
        fail_member: a.fail,
        drives: a.drives,
        connections: a.connections,
        sbod_version: env!("CARGO_PKG_VERSION").into(),
    };
    if let Some(t) = &a.target {
        return bench_ceph(
            t,
            &o,
            a.ceph_conf,
            a.ceph_id,
            a.ceph_osd_stop,
            a.ceph_osd_start,
            a.out,
        )
        .await;
    }
    let (setup, cfg) = sbod_lab::bench_plan(&o)?;
    let out = a
        .out
        .unwrap_or_else(|| PathBuf::from(format!("sbod-bench-{name}")));
    let cancel = Cancel::new();
    watch_signals(
        cancel.clone(),
        "stopping fio; a failed member is rebuilt before sbod bench exits (Ctrl-C again to leave the rebuild to the next sbod serve)",
    );
    let o = tokio::task::spawn_blocking(move || {
        let mut progress = sbod_lab::progress::BarProgress::new();
        sbod_lab::execute(exe, setup, cfg, cancel, &mut progress, &out)
    })
    .await
    .map_err(|e| anyhow!("lab thread: {e}"))??;
    finish(o)
}

/// `sbod bench --target rbd:POOL/IMAGE`: the lab on a Ceph RBD image.
async fn bench_ceph(
    target: &str,
    o: &BenchOptions,
    conf: PathBuf,
    id: String,
    osd_stop: Option<String>,
    osd_start: Option<String>,
    out: Option<PathBuf>,
) -> Result<()> {
    use sbod_lab::ceph::{CephBackend, CephTarget};
    if !conf.exists() {
        return Err(anyhow!(
            "--ceph-conf {}: no such file (the cluster's ceph.conf; scripts/ceph-single-node.sh up DIR makes a test cluster)",
            conf.display()
        ));
    }
    let mut t = CephTarget::parse(target, conf, id)?;
    if osd_stop.is_some() != osd_start.is_some() {
        return Err(anyhow!(
            "give both --ceph-osd-stop and --ceph-osd-start, or neither"
        ));
    }
    t.osd_stop = osd_stop;
    t.osd_start = osd_start;
    let cfg = sbod_lab::ceph_bench_plan(o, &t)?;
    let fail = o
        .fail_member
        .as_ref()
        .and_then(|f| f.strip_prefix("osd.").and_then(|x| x.parse().ok()));
    for e in sbod_lab::ceph_effects(&cfg, &t, fail) {
        eprintln!("sbod bench {target}: {e}");
    }
    let out = out.unwrap_or_else(|| {
        PathBuf::from(format!(
            "sbod-bench-rbd-{}-{}",
            t.pool.replace('/', "-"),
            t.image
        ))
    });
    let cancel = Cancel::new();
    watch_signals(
        cancel.clone(),
        "stopping fio; a stopped OSD is started again and the cluster recovers before sbod bench exits",
    );
    let o = tokio::task::spawn_blocking(move || {
        let mut progress = sbod_lab::progress::BarProgress::new();
        let mut backend = CephBackend::new(t);
        sbod_lab::execute_on(&mut backend, cfg, cancel, &mut progress, &out)
    })
    .await
    .map_err(|e| anyhow!("lab thread: {e}"))??;
    finish(o)
}
