//! `sbod plan`: the command line over the model.

use std::fmt::Write as _;

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::Serialize;

use crate::capacity::TibConvention;
use crate::grow::{grown_spec, Grow, GrowKind, SpeedSource};
use crate::layout::{Layout, LayoutSpec, Level};
use crate::plan::{Assumptions, Disk, Plan, ASSUMED_DISK_MB_S};
use crate::reliability::{mttf_from_afr, RateSource};
use crate::units::{self, thousands};

/// The default MTTF when neither `--mttf` nor `--afr` is given: a typical enterprise
/// nearline datasheet figure, hours.
pub const DEFAULT_MTTF_HOURS: f64 = 2.5e6;

/// Capacity, reliability and expected performance of a disk layout (`sbod plan`).
#[derive(Debug, Clone, Args)]
#[command(after_help = "Examples:
  sbod plan --disks 60 --disk-size 20TB --level raid6 --groups 6 --mttf 2.5M --years 5
  sbod plan --disks 60 --disk-size 20TB --compare --disk-mbps 250 --disk-iops 200
  sbod plan --disks 60 --disk-size 20TB --compare raid6:6x10 raid1:20x3 ec:8+3:5x11:s5 --json
  sbod plan --disks 8 --disk-size 1TB --level raid6 --grow 2 --disk-mbps 200
  sbod plan --disks 60 --disk-size 20TB --ceph rep:3 --hosts 5 --disk-mbps 250 --disk-iops 200
  sbod plan --disks 60 --disk-size 20TB --compare raid6:6x10 --ceph ec:4+2 --hosts 6

The models and their assumptions: docs/PLANNER.md.")]
pub struct PlanArgs {
    /// Number of disks, hot spares included.
    #[arg(long, value_name = "N")]
    pub disks: u32,

    /// Size of one disk: 20TB or 1.92TB (TB = 10^12 bytes, as vendors count), 16TiB or 16T
    /// (T = TiB = 2^40): sbod's one size rule.
    #[arg(long, value_name = "SIZE", value_parser = units::parse_size)]
    pub disk_size: u64,

    /// Level: raid0, raid1, raid10, raid5, raid6, ec:K+M or concat; the compact layout
    /// spelling of --compare (e.g. raid6:6x10) works too.
    #[arg(long, value_name = "LEVEL", required_unless_present_any = ["compare", "ceph"])]
    pub level: Option<LayoutSpec>,

    /// Stripe the volume over this many equal redundancy groups (RAID50/60 style).
    #[arg(long, value_name = "G")]
    pub groups: Option<u32>,

    /// Copies per mirror set, for raid1 (the group size) and raid10 (default 2).
    #[arg(long, value_name = "N")]
    pub copies: Option<u32>,

    /// Hot spares, taken from --disks.
    #[arg(long, value_name = "S")]
    pub spares: Option<u32>,

    /// Compare layouts side by side, in the compact spelling LEVEL[:GxW][:cN][:sN]:
    /// raid6:6x10 (6 groups of 10), raid1:20x3 (20 three-way mirrors), raid10:1x60:c3,
    /// ec:8+3:5x11:s5 (5 groups of 11, 5 hot spares). With no layouts: raid6 groups of
    /// about 10, 3-way mirrors, 2-way mirrors and ec:K+3 groups of about 15.
    #[arg(long, value_name = "LAYOUT", num_args = 0.., conflicts_with_all = ["level", "groups", "copies", "spares"])]
    pub compare: Option<Vec<LayoutSpec>>,

    /// Disk mean time to failure in hours, e.g. 2.5M or 2500000 [default: 2.5M].
    #[arg(long, value_name = "HOURS", value_parser = units::parse_hours, conflicts_with = "afr")]
    pub mttf: Option<f64>,

    /// Disk annualised failure rate instead of --mttf, e.g. 0.35% or 1.2%.
    #[arg(long, value_name = "PERCENT", value_parser = units::parse_afr)]
    pub afr: Option<f64>,

    /// Service life in years.
    #[arg(long, value_name = "YEARS", default_value_t = 5.0)]
    pub years: f64,

    /// The disk's sustained sequential speed, e.g. 250 or 250MB/s; scales the performance
    /// estimate and, with --rebuild-share, gives the rebuild rate.
    #[arg(long, value_name = "MB/s", value_parser = parse_mb_s)]
    pub disk_mbps: Option<f64>,

    /// The disk's random IOPS (at the queue depth you plan for), e.g. 200.
    #[arg(long, value_name = "IOPS", value_parser = units::parse_number)]
    pub disk_iops: Option<f64>,

    /// Rebuild rate onto a replacement disk, e.g. 100MB/s [default: disk speed x share,
    /// with 200 MB/s assumed when --disk-mbps is not given].
    #[arg(long, value_name = "RATE", value_parser = parse_mb_s)]
    pub rebuild_rate: Option<f64>,

    /// Share of the disk's sequential speed a rebuild gets.
    #[arg(long, value_name = "PERCENT", default_value = "50%", value_parser = units::parse_fraction)]
    pub rebuild_share: f64,

    /// Hours until a failed disk is replaced when there are no hot spares (with spares the
    /// rebuild starts at once).
    #[arg(long, value_name = "HOURS", default_value_t = 24.0)]
    pub replace_hours: f64,

    /// Count unrecoverable read errors during a rebuild with no redundancy left, at this
    /// rate per bit read, e.g. 1e-15 (or 1e15 for "1 in 10^15 bits").
    #[arg(long, value_name = "PER_BIT", value_parser = units::parse_ure)]
    pub ure: Option<f64>,

    /// Plan to fill usable capacity up to this share.
    #[arg(long, value_name = "PERCENT", default_value = "90%", value_parser = units::parse_fraction)]
    pub fill: f64,

    /// Count each disk as its label's TiB rounded to 0.1 (20 TB = 18.2 TiB), as vendors'
    /// storage calculators do, instead of exactly (18.19 TiB).
    #[arg(long)]
    pub label_tib: bool,

    /// Actuators per drive: 2 for dual-actuator drives (Seagate MACH.2, Exos 2X14), each
    /// seen as 2 devices (LUNs) of half its size with one actuator's --disk-mbps and
    /// --disk-iops (twice the IOPS per drive); --disks counts drives, layouts (--groups,
    /// GxW) count devices; a drive failing takes both: one failure unit.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub actuators: u32,

    /// Random reads the client keeps in flight, on HDDs with command queueing (NCQ): a
    /// disk that serves a larger share of the reads (the one left of a mirror pair) holds
    /// a deeper queue and serves it faster, which the random read estimates then count;
    /// --disk-iops is the disk's IOPS with this depth spread over all disks.
    #[arg(long, value_name = "N", value_parser = units::parse_number)]
    pub queue_depth: Option<f64>,

    /// With --queue-depth: the disks' write caches are off (SAS drives' default), so a
    /// mirror's random writes queue at the disks as reads do and are counted the same way.
    #[arg(long, requires = "queue_depth")]
    pub write_cache_off: bool,

    /// Plan a grow (`sbod grow NAME --add DEV...`) by this many disks: the layout and
    /// capacity before and after, the data that must move, and the time at --disk-mbps.
    /// raid0/5/6/ec get wider groups (each N/groups more; ec: K grows), raid10 more mirror
    /// sets, raid1 more copies, concat appends.
    #[arg(long, value_name = "N", conflicts_with = "compare")]
    pub grow: Option<u32>,

    /// With --grow: add the disks as whole new groups of the same width (raid5, raid6,
    /// ec), not wider groups.
    #[arg(long, requires = "grow")]
    pub new_groups: bool,

    /// With --grow (one disk per group): a level change that adds parity, as `sbod grow
    /// --level`: raid0 -> raid5, raid5 -> raid6, ec:K+M -> ec:K+(M+1). Nothing moves: the
    /// new disks are written with the new parity.
    #[arg(
        long,
        value_name = "LEVEL",
        requires = "grow",
        conflicts_with = "new_groups"
    )]
    pub grow_level: Option<Level>,

    /// Plan the other way (`sbod grow NAME --remove MEMBER...`): this many disks fewer,
    /// the last of every group (raid0, raid5, raid6, ec: K shrinks): the capacity before
    /// and after, the data that must move, and the time at --disk-mbps.
    #[arg(long, value_name = "N", conflicts_with_all = ["compare", "grow"])]
    pub shrink: Option<u32>,

    /// Plan a new chunk (`sbod grow NAME --chunk SIZE`): the same disks and layout, every
    /// byte read and rewritten, each window first written aside: the data that moves and
    /// the time at --disk-mbps.
    #[arg(long, conflicts_with_all = ["compare", "grow", "shrink"])]
    pub rechunk: bool,

    /// Plan a Ceph pool on the same disks instead (or, with --compare, beside the sbod
    /// layouts): rep:SIZE[:MIN_SIZE] (rep:3) or ec:K+M[:MIN_SIZE] (ec:4+2). --disks
    /// counts drives; the cluster's shape comes from the --hosts, --racks,
    /// --failure-domain, --osds-per-drive and the ratio flags below.
    #[arg(long, value_name = "POOL", conflicts_with_all = ["level", "grow"])]
    pub ceph: Option<crate::ceph::CephPool>,

    /// Ceph: hosts the drives are spread over evenly.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub hosts: u32,

    /// Ceph: racks the hosts are spread over evenly.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub racks: u32,

    /// Ceph: the CRUSH failure domain, osd, host or rack [default: host with several hosts,
    /// else osd].
    #[arg(long, value_name = "DOMAIN")]
    pub failure_domain: Option<crate::ceph::FailureDomain>,

    /// Ceph: OSDs per drive [default: --actuators, one OSD per actuator].
    #[arg(long, value_name = "N")]
    pub osds_per_drive: Option<u32>,

    /// Ceph: placement groups per OSD the pool aims for.
    #[arg(long, value_name = "N", default_value_t = 100)]
    pub pgs_per_osd: u32,

    /// Ceph: nearfull ratio (the planned fill; Ceph warns beyond).
    #[arg(long, value_name = "PERCENT", default_value = "85%", value_parser = units::parse_fraction)]
    pub nearfull: f64,

    /// Ceph: backfillfull ratio (recovery stops filling an OSD beyond).
    #[arg(long, value_name = "PERCENT", default_value = "90%", value_parser = units::parse_fraction)]
    pub backfillfull: f64,

    /// Ceph: full ratio (writes stop).
    #[arg(long, value_name = "PERCENT", default_value = "95%", value_parser = units::parse_fraction)]
    pub full_ratio: f64,

    /// Ceph: network per host in Gbit/s (public and cluster together).
    #[arg(long, value_name = "GBIT", default_value_t = 25.0)]
    pub network_gbps: f64,

    /// Ceph: osd_max_backfills (concurrent backfills per OSD).
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub max_backfills: u32,

    /// Ceph: mon_osd_down_out_interval in minutes (recovery starts after it).
    #[arg(long, value_name = "MIN", default_value_t = 10.0)]
    pub down_out_minutes: f64,

    /// Ceph: the OSDs are on flash (no BlueStore deferred writes: one disk write per
    /// small write instead of two).
    #[arg(long)]
    pub flash: bool,

    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// The Ceph pool `args` ask for (`--ceph`).
pub fn ceph_plan(args: &PlanArgs) -> Result<Option<crate::ceph::CephPlan>> {
    use crate::ceph::{CephCluster, CephPlan, FailureDomain};
    let Some(pool) = args.ceph else {
        return Ok(None);
    };
    let mttf_hours = match (args.mttf, args.afr) {
        (Some(m), _) => m,
        (None, Some(afr)) => mttf_from_afr(afr),
        (None, None) => DEFAULT_MTTF_HOURS,
    };
    let osds_per_drive = args.osds_per_drive.unwrap_or(args.actuators);
    if !(1..=8).contains(&osds_per_drive) || !(1..=8).contains(&args.actuators) {
        bail!("--osds-per-drive and --actuators: 1 to 8 per drive");
    }
    let c = CephCluster {
        drives: args.disks,
        drive_bytes: args.disk_size,
        osds_per_drive,
        actuators: args.actuators,
        hosts: args.hosts,
        racks: args.racks,
        failure_domain: args.failure_domain.unwrap_or(if args.hosts > 1 {
            FailureDomain::Host
        } else {
            FailureDomain::Osd
        }),
        pgs_per_osd: args.pgs_per_osd.max(1),
        nearfull_ratio: args.nearfull,
        backfillfull_ratio: args.backfillfull,
        full_ratio: args.full_ratio,
        disk_mb_s: args.disk_mbps.unwrap_or(ASSUMED_DISK_MB_S),
        disk_iops: args.disk_iops,
        recovery_share: args.rebuild_share,
        max_backfills: args.max_backfills.max(1),
        down_out_minutes: args.down_out_minutes,
        network_gbps: args.network_gbps,
        deferred_small_writes: !args.flash,
        mttf_hours,
        service_years: args.years,
    };
    CephPlan::new(pool, c).map(Some)
}

/// `sbod plan --ceph POOL`: the pool in words and figures.
pub fn ceph_table(p: &crate::ceph::CephPlan, disk_given: bool) -> String {
    let c = &p.cluster;
    let mut o = String::new();
    let tb = |b: f64| format!("{} TB", fixed2(b / 1e12));
    let _ = writeln!(
        o,
        "sbod plan --ceph {}: {} drives of {} in {} host{}{}, {} OSD{} per drive ({} OSDs), failure domain {}, {} years",
        p.pool,
        c.drives,
        tb(c.drive_bytes as f64),
        c.hosts,
        if c.hosts == 1 { "" } else { "s" },
        if c.racks > 1 { format!(" and {} racks", c.racks) } else { String::new() },
        c.osds_per_drive,
        if c.osds_per_drive == 1 { "" } else { "s" },
        p.osds,
        c.failure_domain.name(),
        short(c.service_years)
    );
    let _ = writeln!(o);
    let mut rows: Vec<(String, Vec<String>)> = Vec::new();
    let mut row = |n: &str, v: String| rows.push((n.to_string(), vec![v]));
    row(
        "PGs (pg_num)",
        format!(
            "{} ({} per OSD aimed for, x{} shards)",
            p.pg_num,
            c.pgs_per_osd,
            p.pool.width()
        ),
    );
    row("raw", tb(p.raw_bytes));
    row(
        "usable at 100%",
        format!(
            "{} ({:.0}% of raw)",
            tb(p.usable_bytes),
            p.pool.efficiency() * 100.0
        ),
    );
    row(
        &format!("usable at nearfull {:.0}%", c.nearfull_ratio * 100.0),
        tb(p.usable_at_nearfull_bytes),
    );
    row(
        "fill that still self-heals",
        format!(
            "{} (one {} lost, recovered under backfillfull {:.0}%)",
            tb(p.self_healing_bytes),
            c.failure_domain.name(),
            c.backfillfull_ratio * 100.0
        ),
    );
    row(
        "survives",
        format!(
            "{} of {} shards lost; writes stop beyond {} (min_size)",
            p.pool.tolerates(),
            p.pool.width(),
            p.pool.serves_writes_after()
        ),
    );
    let r = &p.recovery;
    row(
        "recovery of a drive",
        format!(
            "{} in {} at {} MB/s (+ {} down-out)",
            tb(r.bytes),
            hours(r.window_hours - c.down_out_minutes / 60.0),
            short(r.rate_bytes_per_sec / 1e6),
            hours(c.down_out_minutes / 60.0)
        ),
    );
    row(
        "  limits: disks / PGs / network",
        format!(
            "{} / {} / {}",
            hours(r.disk_hours),
            hours(r.pg_hours),
            if r.network_hours > 0.0 {
                hours(r.network_hours)
            } else {
                "-".into()
            }
        ),
    );
    row(
        &format!("data loss in {} y", short(c.service_years)),
        units::prob(p.p_loss),
    );
    row("  odds", units::odds(p.p_loss).replace("1 in ", "1:"));
    row("MTTDL years", units::years(p.mttdl_years));
    let perf = &p.performance;
    row("disk I/Os per 4K write", short(perf.write_ios));
    row(
        "seq read MB/s (est.)",
        thousands(perf.seq_read.value.unwrap_or(0.0)),
    );
    row(
        "seq write MB/s (est.)",
        format!(
            "{} (bound by the {})",
            thousands(perf.seq_write.value.unwrap_or(0.0)),
            perf.seq_write_bound
        ),
    );
    let io = |f: &crate::performance::Figure| match f.value {
        Some(v) => format!("{} IOPS", thousands(v)),
        None => format!("{} disks", short(f.disks)),
    };
    row("rand read (est.)", io(&perf.rand_read));
    row("rand write (est.)", io(&perf.rand_write));
    grid(&mut o, &rows);
    for w in &p.warnings {
        let _ = writeln!(o, "\nwarning: {w}");
    }
    if !disk_given {
        let _ = writeln!(
            o,
            "\nDisk speed assumed {ASSUMED_DISK_MB_S} MB/s: give --disk-mbps (and --disk-iops) for yours."
        );
    }
    let _ = writeln!(
        o,
        "\nA model from first principles (docs/PLANNER.md, \"Ceph pools\"), not a measurement."
    );
    o
}

/// `--compare ... --ceph POOL`: the main figures of the sbod layouts and the Ceph pool.
fn ceph_compare_table(plans: &[Plan], c: &crate::ceph::CephPlan) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "Beside Ceph ({} pool, {} hosts, failure domain {}, the same {} drives):",
        c.pool,
        c.cluster.hosts,
        c.cluster.failure_domain.name(),
        c.cluster.drives
    );
    let _ = writeln!(o);
    let mut rows: Vec<(String, Vec<String>)> = Vec::new();
    let mut row = |n: &str, mut v: Vec<String>, last: String| {
        v.push(last);
        rows.push((n.to_string(), v));
    };
    let each = |f: &dyn Fn(&Plan) -> String| plans.iter().map(f).collect::<Vec<_>>();
    row(
        "layout",
        each(&|p| p.layout.spec.clone()),
        format!("ceph {}", c.pool.short()),
    );
    row(
        "usable TB",
        each(&|p| fixed2(p.capacity.usable.tb)),
        fixed2(c.usable_bytes / 1e12),
    );
    row(
        "usable / raw",
        each(&|p| format!("{:.0}%", p.capacity.efficiency * 100.0)),
        format!("{:.0}%", c.pool.efficiency() * 100.0),
    );
    row(
        "rebuild window",
        each(&|p| hours(p.reliability.rebuild.window_hours)),
        hours(c.recovery.window_hours),
    );
    row(
        "data loss",
        each(&|p| units::prob(p.reliability.p_loss)),
        units::prob(c.p_loss),
    );
    row(
        "MTTDL years",
        each(&|p| units::years(p.reliability.mttdl_years)),
        units::years(c.mttdl_years),
    );
    let val = |f: &crate::performance::Figure| match f.value {
        Some(v) => thousands(v),
        None => short(f.disks),
    };
    row(
        "seq read (est.)",
        each(&|p| val(&p.performance.seq_read)),
        val(&c.performance.seq_read),
    );
    row(
        "seq write (est.)",
        each(&|p| val(&p.performance.seq_write)),
        val(&c.performance.seq_write),
    );
    row(
        "rand read (est.)",
        each(&|p| val(&p.performance.rand_read)),
        val(&c.performance.rand_read),
    );
    row(
        "rand write (est.)",
        each(&|p| val(&p.performance.rand_write)),
        val(&c.performance.rand_write),
    );
    grid(&mut o, &rows);
    let _ = writeln!(
        o,
        "\nsbod's rebuild window is one disk rebuilt at its share of one disk's speed; Ceph's is the down-out delay plus recovery spread over the surviving OSDs."
    );
    o
}

fn parse_mb_s(text: &str) -> Result<f64> {
    Ok(units::parse_rate(text)? / 1e6)
}

/// The layouts `--compare` shows when given none, fitted to `disks`: raid6 in groups of
/// about 10, 3-way mirrors, 2-way mirrors, and ec:K+3 in groups of about 15; disks that
/// don't fit a whole group become hot spares.
pub fn default_compare(disks: u32) -> Vec<LayoutSpec> {
    let fit_in = |disks: u32, lo: u32, hi: u32, ideal: u32| -> Option<(u32, u32)> {
        (lo..=hi.min(disks))
            .min_by_key(|&w| {
                // A spare disk weighs as much as two disks' distance from the ideal width.
                let spares = (disks % w) as i64;
                (
                    2 * spares + (w as i64 - ideal as i64).abs(),
                    spares,
                    std::cmp::Reverse(w),
                )
            })
            .map(|w| (disks / w, w))
    };
    let fit = |lo: u32, hi: u32, ideal: u32| fit_in(disks, lo, hi, ideal);
    let spec = |level: Level, (groups, width): (u32, u32)| LayoutSpec {
        level,
        groups: Some(groups),
        width: Some(width),
        copies: None,
        spares: Some(disks - groups * width).filter(|&s| s > 0),
        declustered: false,
    };
    let mut out = Vec::new();
    if let Some(gw) = fit(4, 16, 10) {
        out.push(spec(Level::Raid6, gw));
        // The same groups and spares declustered over every disk, the rebuild window it
        // buys side by side; where the groups use every disk, groups fitted to one disk
        // fewer, so there is spare space to rebuild into.
        let gw = match disks % gw.1 {
            0 => fit_in(disks - 1, 4, 16, 10),
            _ => Some(gw),
        };
        if let Some(gw) = gw.filter(|&(g, w)| g * w < disks) {
            out.push(LayoutSpec {
                declustered: true,
                ..spec(Level::Raid6, gw)
            });
        }
    }
    for copies in [3, 2] {
        if disks >= copies {
            out.push(spec(Level::Raid1, (disks / copies, copies)));
        }
    }
    if let Some((g, w)) = fit(7, 16, 15) {
        // w is at most 16 (fit's widest).
        let k = u16::try_from(w - 3).expect("a group of at most 16");
        out.push(spec(Level::Ec { k, m: 3 }, (g, w)));
    }
    out
}

/// Merges `--groups/--copies/--spares` into the `--level` spec.
fn single_spec(args: &PlanArgs) -> Result<LayoutSpec> {
    let Some(mut spec) = args.level.clone() else {
        bail!("give --level (e.g. --level raid6 --groups 6) or --compare");
    };
    for (flag, slot, v) in [
        ("--groups", &mut spec.groups, args.groups),
        ("--copies", &mut spec.copies, args.copies),
        ("--spares", &mut spec.spares, args.spares),
    ] {
        if let Some(v) = v {
            match slot {
                Some(old) if *old != v => {
                    bail!("{flag} {v} disagrees with the layout given to --level ({old})")
                }
                _ => *slot = Some(v),
            }
        }
    }
    Ok(spec)
}

/// Builds the plans `args` ask for: one, or one per compared layout.
pub fn plans(args: &PlanArgs) -> Result<Vec<Plan>> {
    let mttf_hours = match (args.mttf, args.afr) {
        (Some(m), _) => m,
        (None, Some(afr)) => mttf_from_afr(afr),
        (None, None) => DEFAULT_MTTF_HOURS,
    };
    if !(1..=8).contains(&args.actuators) {
        bail!(
            "--actuators {}: 1 to 8 per drive (2 for dual-actuator drives)",
            args.actuators
        );
    }
    let per = args.actuators;
    let devices = args
        .disks
        .checked_mul(per)
        .context("too many devices: --disks x --actuators")?;
    let disk = Disk {
        size_bytes: args.disk_size / per as u64,
        mttf_hours,
        seq_mb_s: args.disk_mbps,
        random_iops: args.disk_iops,
    };
    let assumptions = Assumptions {
        service_years: args.years,
        fill_limit: args.fill,
        rebuild_rate_mb_s: args.rebuild_rate,
        rebuild_share: args.rebuild_share,
        replace_hours: args.replace_hours,
        ure_per_bit: args.ure,
        queue_depth: args.queue_depth.filter(|&q| q > 0.0),
        write_cache_off: args.write_cache_off,
        tib: if args.label_tib {
            TibConvention::Label
        } else {
            TibConvention::Exact
        },
    };
    let specs = match &args.compare {
        None => vec![single_spec(args)?],
        Some(list) if list.is_empty() => {
            let d = default_compare(devices);
            if d.is_empty() {
                bail!(
                    "{} too few to compare redundant layouts: give at least 2",
                    match args.disks {
                        0 => "zero disks are".to_string(),
                        1 => "1 disk is".to_string(),
                        n => format!("{n} disks are"),
                    }
                );
            }
            d
        }
        Some(list) => list.clone(),
    };
    specs
        .iter()
        .map(|spec| {
            let layout = Layout::resolve(spec, devices)
                .with_context(|| format!("layout {} on {} disks", spec_text(spec), devices))?;
            let mut plan = Plan::new(&layout, &disk, &assumptions)?;
            if per > 1 {
                let share = layout.sets < per;
                if share {
                    // The LUNs of each drive share a group: count in drives (a group of
                    // w LUNs surviving f is w/per drives surviving f/per).
                    let mut drives = layout.clone();
                    drives.set_width = (layout.set_width / per).max(1);
                    drives.set_tolerates = layout.set_tolerates / per;
                    drives.disks = args.disks;
                    drives.spares = layout.spares / per;
                    let whole = Disk {
                        size_bytes: args.disk_size,
                        ..disk.clone()
                    };
                    plan.reliability = Plan::new(&drives, &whole, &assumptions)?.reliability;
                }
                let r = &mut plan.reliability;
                r.expected_failures_per_year =
                    args.disks as f64 * crate::units::HOURS_PER_YEAR / r.mttf_hours;
                r.expected_failures = r.expected_failures_per_year * r.service_years;
                plan.actuators = Some(crate::plan::Actuators {
                    per_drive: per,
                    drives: args.disks,
                    devices,
                    luns_share_a_group: share,
                });
            }
            Ok(plan)
        })
        .collect()
}

/// The layout as the user gave it, for error context: `raid6:6x10`, `raid10 (7 groups, 3 copies)`.
fn spec_text(spec: &LayoutSpec) -> String {
    let mut parts = Vec::new();
    match (spec.groups, spec.width) {
        (Some(g), Some(w)) => parts.push(format!("{g} groups of {w}")),
        (Some(g), None) => parts.push(format!("{g} groups")),
        (None, Some(w)) => parts.push(format!("groups of {w}")),
        (None, None) => {}
    }
    if let Some(c) = spec.copies {
        parts.push(format!("{c} copies"));
    }
    if let Some(sp) = spec.spares {
        parts.push(format!("{sp} spares"));
    }
    if parts.is_empty() {
        spec.level.to_string()
    } else {
        format!("{} ({})", spec.level, parts.join(", "))
    }
}

/// Plans `--grow`: the layout before and after `args.grow` more disks, and the work between.
pub fn grow_plan(args: &PlanArgs) -> Result<Grow> {
    if let Some(n) = args.shrink {
        return shrink_plan(args, n);
    }
    if args.rechunk {
        let mut plain = args.clone();
        plain.rechunk = false;
        let before = plans(&plain)?.remove(0);
        if matches!(before.layout.level, Level::Raid1 | Level::Concat) {
            bail!(
                "a {} array has no stripes: a new chunk applies to raid0, raid5, raid6, ec:K+M and raid10",
                before.layout.level
            );
        }
        return Ok(Grow::rechunk(before, args.disk_mbps));
    }
    let Some(added) = args.grow else {
        bail!("give --grow N, the number of disks to add");
    };
    let mut plain = args.clone();
    plain.grow = None;
    plain.new_groups = false;
    plain.grow_level = None;
    let before = plans(&plain)?.remove(0);
    let devices = added
        .checked_mul(args.actuators)
        .context("too many devices: --grow x --actuators")?;
    let spec = match args.grow_level {
        Some(to) => crate::grow::parity_spec(&before.layout, devices, to),
        None => grown_spec(&before.layout, devices, args.new_groups),
    }
    .with_context(|| {
        format!(
            "growing {} by {added} disk{}",
            before.layout.spec,
            if added == 1 { "" } else { "s" }
        )
    })?;
    let grown = PlanArgs {
        disks: args
            .disks
            .checked_add(added)
            .context("too many disks: --disks + --grow")?,
        level: Some(spec),
        groups: None,
        copies: None,
        spares: None,
        ..plain
    };
    let after = plans(&grown)?.remove(0);
    Ok(Grow::new(
        before,
        after,
        devices,
        args.new_groups,
        args.disk_mbps,
    ))
}

/// Plans `--shrink`: the layout before and after `n` fewer disks, and the work between.
fn shrink_plan(args: &PlanArgs, n: u32) -> Result<Grow> {
    let mut plain = args.clone();
    plain.shrink = None;
    let before = plans(&plain)?.remove(0);
    let devices = n
        .checked_mul(args.actuators)
        .context("too many devices: --shrink x --actuators")?;
    let spec = crate::grow::narrowed_spec(&before.layout, devices).with_context(|| {
        format!(
            "shrinking {} by {n} disk{}",
            before.layout.spec,
            if n == 1 { "" } else { "s" }
        )
    })?;
    let shrunk = PlanArgs {
        disks: args
            .disks
            .checked_sub(n)
            .context("--shrink removes more disks than --disks has")?,
        level: Some(spec),
        groups: None,
        copies: None,
        spares: None,
        ..plain
    };
    let after = plans(&shrunk)?.remove(0);
    Ok(Grow::new(before, after, devices, false, args.disk_mbps))
}

/// JSON for `--compare`.
#[derive(Serialize)]
struct Comparison<'a> {
    plans: &'a [Plan],
}

/// What `sbod plan` prints for `args`.
pub fn render(args: &PlanArgs) -> Result<String> {
    if args.grow.is_some() || args.shrink.is_some() || args.rechunk {
        let g = grow_plan(args)?;
        let mut out = if args.json {
            serde_json::to_string_pretty(&g)?
        } else {
            let mut t = grow_table(&g);
            if args.mttf.is_none() && args.afr.is_none() {
                t += "\nMTTF is the default 2.5M hours (a datasheet figure; field AFRs are often 1-2%): \
                      give --mttf or --afr for your disks.\n";
            }
            t
        };
        if !out.ends_with('\n') {
            out.push('\n');
        }
        return Ok(out);
    }
    let ceph = ceph_plan(args)?;
    if let (Some(c), None) = (&ceph, &args.compare) {
        let mut out = if args.json {
            serde_json::to_string_pretty(c)?
        } else {
            ceph_table(c, args.disk_mbps.is_some())
        };
        if !out.ends_with('\n') {
            out.push('\n');
        }
        return Ok(out);
    }
    let plans = plans(args)?;
    if let Some(c) = &ceph {
        let mut out = if args.json {
            serde_json::to_string_pretty(&serde_json::json!({ "plans": plans, "ceph": c }))?
        } else {
            let mut t = compare_table(&plans);
            t.push('\n');
            t += &ceph_compare_table(&plans, c);
            t
        };
        if !out.ends_with('\n') {
            out.push('\n');
        }
        return Ok(out);
    }
    let mut out = if args.json {
        if args.compare.is_some() {
            serde_json::to_string_pretty(&Comparison { plans: &plans })?
        } else {
            serde_json::to_string_pretty(&plans[0])?
        }
    } else {
        let mut t = if args.compare.is_some() {
            compare_table(&plans)
        } else {
            plan_table(&plans[0])
        };
        if args.mttf.is_none() && args.afr.is_none() {
            t += "\nMTTF is the default 2.5M hours (a datasheet figure; field AFRs are often 1-2%): \
                  give --mttf or --afr for your disks.\n";
        }
        t
    };
    if !out.ends_with('\n') {
        out.push('\n');
    }
    Ok(out)
}

/// Runs `sbod plan`.
pub fn run(args: &PlanArgs) -> Result<()> {
    print!("{}", render(args)?);
    Ok(())
}

/// `1234.5` -> `1,234.50`.
fn fixed2(v: f64) -> String {
    let s = format!("{:.2}", v.abs());
    let (int, frac) = s.split_once('.').unwrap_or((&s, "00"));
    let int = thousands(int.parse::<f64>().unwrap_or(0.0));
    format!("{}{int}.{frac}", if v < 0.0 { "-" } else { "" })
}

/// Up to one decimal, dropped when whole: `43.2`, `48`.
fn short(v: f64) -> String {
    if (v - v.round()).abs() < 1e-9 || v >= 100.0 {
        thousands(v)
    } else {
        format!("{v:.1}")
    }
}

fn hours(h: f64) -> String {
    if h >= 100.0 || (h - h.round()).abs() < 1e-9 {
        format!("{} h", thousands(h))
    } else {
        format!("{h:.1} h")
    }
}

fn disk_line(plan: &Plan) -> String {
    let c = &plan.capacity;
    let tib = match c.tib_convention {
        TibConvention::Exact => format!("{:.2} TiB", c.disk_tib),
        TibConvention::Label => format!("{:.1} TiB by label", c.disk_tib),
    };
    format!(
        "{} x {} TB disks ({tib} each)",
        plan.layout.disks,
        short_tb(c.disk_tb)
    )
}

fn short_tb(tb: f64) -> String {
    let s = format!("{tb:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

fn mttf_line(plan: &Plan) -> String {
    let r = &plan.reliability;
    format!(
        "MTTF {} h = AFR {:.2}%",
        thousands(r.mttf_hours),
        r.afr * 100.0
    )
}

fn rate_source(plan: &Plan) -> String {
    match plan.reliability.rebuild.rate_source {
        RateSource::Given => String::new(),
        RateSource::Disk => format!(
            " ({:.0}% of {} MB/s)",
            plan.assumptions.rebuild_share * 100.0,
            short(plan.disk.seq_mb_s.unwrap_or(0.0))
        ),
        RateSource::Assumed => format!(
            " ({:.0}% of an assumed {ASSUMED_DISK_MB_S:.0} MB/s disk)",
            plan.assumptions.rebuild_share * 100.0
        ),
    }
}

fn rebuild_line(plan: &Plan) -> String {
    let rb = &plan.reliability.rebuild;
    let source = rate_source(plan);
    let replace = if plan.layout.spares > 0 {
        "hot spare, rebuild starts at once".to_string()
    } else {
        format!("{} to replace", hours(rb.replacement_hours))
    };
    format!(
        "{} per failed disk: {replace}, {} rebuild at {} MB/s{source}",
        hours(rb.window_hours),
        hours(rb.rebuild_hours),
        short(rb.rate_mb_s)
    )
}

fn survives(l: &Layout) -> String {
    match l.level {
        Level::Raid0 | Level::Concat => "no failure".into(),
        Level::Raid10 => format!("{} of each {}-way mirror set", l.set_tolerates, l.set_width),
        _ => format!(
            "{} failure{} per group of {}",
            l.set_tolerates,
            if l.set_tolerates == 1 { "" } else { "s" },
            l.set_width
        ),
    }
}

fn loss(p: f64) -> String {
    if p <= 0.0 {
        "0".into()
    } else {
        format!("{} ({})", units::prob(p), units::odds(p))
    }
}

fn plan_table(plan: &Plan) -> String {
    let (l, c, r, p) = (
        &plan.layout,
        &plan.capacity,
        &plan.reliability,
        &plan.performance,
    );
    let mut o = String::new();
    let _ = writeln!(o, "sbod plan: {} as {}", disk_line(plan), l.spec);
    if let Some(a) = &plan.actuators {
        let _ = writeln!(
            o,
            "  {} drives with {} actuators each, seen as {} devices: {} the IOPS per drive, one failure unit per drive ({})",
            a.drives,
            a.per_drive,
            a.devices,
            if a.per_drive == 2 { "twice".to_string() } else { format!("{}x", a.per_drive) },
            if a.luns_share_a_group {
                "its LUNs share a group: reliability counted in drives"
            } else {
                "each LUN of a drive in another group: sbod create gives them one failure domain"
            }
        );
    }
    let _ = writeln!(o, "  {}", l.description);
    let _ = writeln!(o);
    let _ = writeln!(o, "Capacity                     TB          TiB    disks");
    let mut row = |name: &str, s: &crate::capacity::Size, note: String| {
        let _ = writeln!(
            o,
            "  {name:<17} {:>12} {:>12} {:>8}{note}",
            fixed2(s.tb),
            fixed2(s.tib),
            short(s.disks)
        );
    };
    row("raw", &c.raw, String::new());
    row("hot spares", &c.spares, String::new());
    row("after spares", &c.after_spares, String::new());
    row("redundancy", &c.redundancy, String::new());
    row(
        "usable",
        &c.usable,
        format!("   {:.0}% of raw", c.efficiency * 100.0),
    );
    row(
        &format!("at {:.0}% fill", c.fill_limit * 100.0),
        &c.at_fill_limit,
        String::new(),
    );
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "Reliability over {} years ({})",
        short(r.service_years),
        mttf_line(plan)
    );
    let _ = writeln!(
        o,
        "  disk failures     {:.2} a year, {:.2} in {} years (all {} disks)",
        r.expected_failures_per_year,
        r.expected_failures,
        short(r.service_years),
        l.disks
    );
    let _ = writeln!(o, "  survives          {}", survives(l));
    let _ = writeln!(o, "  rebuild window    {}", rebuild_line(plan));
    if let (Some(ure), Some(q)) = (r.ure_per_bit, r.ure_per_critical_rebuild) {
        let _ = writeln!(
            o,
            "  URE               {ure:.0e} per bit: {} chance per rebuild with no redundancy left",
            units::prob(q)
        );
    }
    let _ = writeln!(
        o,
        "  data loss         {} in {} years",
        loss(r.p_loss),
        short(r.service_years)
    );
    let _ = writeln!(
        o,
        "                    {} per year",
        loss(r.p_loss_per_year)
    );
    let _ = writeln!(
        o,
        "  MTTDL             {} years",
        units::years(r.mttdl_years)
    );
    let _ = writeln!(o);
    let basis = match (p.disk_mb_s, p.disk_iops) {
        (None, None) => {
            "in disks' worth; give --disk-mbps and --disk-iops for absolute figures".to_string()
        }
        (mb, io) => format!(
            "from {} per disk",
            [
                mb.map(|v| format!("{} MB/s", short(v))),
                io.map(|v| format!("{} IOPS", short(v)))
            ]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
            .join(", ")
        ),
    };
    let _ = writeln!(o, "Performance (an estimate, {basis})");
    if let Some(q) = &p.queueing {
        let _ = writeln!(
            o,
            "  (random reads: {} in flight on HDDs with command queueing)",
            short(q.depth)
        );
    }
    let fig = |f: &crate::performance::Figure, unit: &str| match f.value {
        Some(v) => format!("{:>7} disks {:>12} {unit}", short(f.disks), thousands(v)),
        None => format!("{:>7} disks", short(f.disks)),
    };
    let _ = writeln!(o, "  sequential read   {}", fig(&p.seq_read, "MB/s"));
    let _ = writeln!(o, "  sequential write  {}", fig(&p.seq_write, "MB/s"));
    let _ = writeln!(o, "  random read       {}", fig(&p.rand_read, "IOPS"));
    let _ = writeln!(
        o,
        "  random write      {}   ({} disk I/Os per write)",
        fig(&p.rand_write, "IOPS"),
        short(p.write_penalty)
    );
    o
}

fn compare_table(plans: &[Plan]) -> String {
    let first = &plans[0];
    let r0 = &first.reliability;
    let mut o = String::new();
    let _ = writeln!(
        o,
        "sbod plan --compare: {}, {} years, {}",
        disk_line(first),
        short(r0.service_years),
        mttf_line(first)
    );
    let _ = writeln!(
        o,
        "  {:.2} disk failures expected a year, {:.2} in {} years",
        r0.expected_failures_per_year,
        r0.expected_failures,
        short(r0.service_years)
    );
    let _ = writeln!(o);
    let mut rows: Vec<(String, Vec<String>)> = Vec::new();
    let mut row = |name: &str, f: &dyn Fn(&Plan) -> String| {
        rows.push((name.to_string(), plans.iter().map(f).collect()));
    };
    let fill = first.capacity.fill_limit * 100.0;
    let life = short(r0.service_years);
    row("layout", &|p| p.layout.spec.clone());
    row("survives per group", &|p| match p.layout.set_tolerates {
        0 => "0".into(),
        t => format!("{t} of {}", p.layout.set_width),
    });
    row("hot spares", &|p| p.layout.spares.to_string());
    row("usable TB", &|p| fixed2(p.capacity.usable.tb));
    row("usable TiB", &|p| fixed2(p.capacity.usable.tib));
    row(&format!("at {fill:.0}% fill TB"), &|p| {
        fixed2(p.capacity.at_fill_limit.tb)
    });
    row("usable / raw", &|p| {
        format!("{:.0}%", p.capacity.efficiency * 100.0)
    });
    row("rebuild window", &|p| {
        hours(p.reliability.rebuild.window_hours)
    });
    if first.reliability.ure_per_bit.is_some() {
        row("URE per last-parity rebuild", &|p| {
            p.reliability
                .ure_per_critical_rebuild
                .map_or("-".into(), units::prob)
        });
    }
    row(&format!("data loss in {life} y"), &|p| {
        units::prob(p.reliability.p_loss)
    });
    row("  odds", &|p| {
        units::odds(p.reliability.p_loss).replace("1 in ", "1:")
    });
    row("MTTDL years", &|p| units::years(p.reliability.mttdl_years));
    let perf = &first.performance;
    let unit = |per: Option<f64>, u: &str| {
        if per.is_some() {
            u.to_string()
        } else {
            "disks".to_string()
        }
    };
    let val = |f: &crate::performance::Figure| match f.value {
        Some(v) => thousands(v),
        None => short(f.disks),
    };
    let mb = unit(perf.disk_mb_s, "MB/s");
    let io = unit(perf.disk_iops, "IOPS");
    row(&format!("seq read {mb} (est.)"), &|p| {
        val(&p.performance.seq_read)
    });
    row(&format!("seq write {mb} (est.)"), &|p| {
        val(&p.performance.seq_write)
    });
    row(&format!("rand read {io} (est.)"), &|p| {
        val(&p.performance.rand_read)
    });
    row(&format!("rand write {io} (est.)"), &|p| {
        val(&p.performance.rand_write)
    });
    grid(&mut o, &rows);
    let _ = writeln!(o);
    let rb = &r0.rebuild;
    let _ = writeln!(
        o,
        "Rebuild window: {} per disk at {} MB/s{}, plus {} to replace a disk in layouts without hot spares.",
        hours(rb.rebuild_hours),
        short(rb.rate_mb_s),
        rate_source(first),
        hours(first.assumptions.replace_hours)
    );
    let _ = writeln!(
        o,
        "Performance is an estimate from a model (docs/PLANNER.md), not a measurement."
    );
    o
}

/// Rows of a label and one cell per column, the cells right-aligned.
fn grid(o: &mut String, rows: &[(String, Vec<String>)]) {
    let label_width = rows.iter().map(|(n, _)| n.len()).max().unwrap_or(0);
    let columns = rows.first().map_or(0, |(_, c)| c.len());
    let widths: Vec<usize> = (0..columns)
        .map(|i| rows.iter().map(|(_, c)| c[i].len()).max().unwrap_or(0))
        .collect();
    for (name, cells) in rows {
        let _ = write!(o, "{name:<label_width$}");
        for (cell, w) in cells.iter().zip(&widths) {
            let _ = write!(o, "  {cell:>w$}");
        }
        let _ = writeln!(o);
    }
}

/// `8750` -> `2 h 26 min`; `300` -> `5 min`; `42` -> `42 s`.
fn duration(seconds: f64) -> String {
    let s = seconds.round() as u64;
    if s >= 3600 {
        let m = (seconds / 60.0).round() as u64;
        match m % 60 {
            0 => format!("{} h", m / 60),
            r => format!("{} h {r} min", m / 60),
        }
    } else if s >= 60 {
        format!("{} min", (seconds / 60.0).round() as u64)
    } else {
        format!("{s} s")
    }
}

/// Bytes as vendor TB, two decimals: `0.75 TB`.
fn tb(bytes: u64) -> String {
    format!("{} TB", fixed2(bytes as f64 / crate::units::TB))
}

/// What the grow does, in a sentence.
fn grow_shape(g: &Grow) -> String {
    let (b, a) = (&g.before.layout, &g.after.layout);
    let plural = |n: u32, one: &str, many: &str| {
        if n == 1 {
            format!("{n} {one}")
        } else {
            format!("{n} {many}")
        }
    };
    match g.kind {
        GrowKind::Append => {
            "appended: the volume grows by the new disks at once, no data moves".to_string()
        }
        GrowKind::Rechunk => format!(
            "a new chunk on the same {}: the whole volume is read and rewritten in place, each window first \
             written aside on {} of a group's members (the volume's last rows hold them meanwhile, and come back \
             as zeros at the end)",
            plural(b.members, "disk", "disks"),
            b.set_tolerates + 1
        ),
        GrowKind::Narrow => format!(
            "a reshape onto fewer disks: {} {} fewer; the volume shrinks at once to what the rest hold \
             (refused while data lies past it), which is read and rewritten in the narrower layout, \
             then the disks removed are free",
            if b.groups == 1 {
                "the group has".to_string()
            } else {
                format!("each of the {} groups has", b.groups)
            },
            plural(b.group_width - a.group_width, "disk", "disks")
        ),
        GrowKind::Parity => format!(
            "a level change, {} -> {}: the new disk of each group is written with the new parity (a rebuild); nothing else moves, the capacity stays",
            b.level, a.level
        ),
        GrowKind::Copies => format!(
            "more copies: every mirror gets {}, each rebuilt from the copies in service",
            plural(a.group_width - b.group_width, "more copy", "more copies")
        ),
        GrowKind::Reshape => {
            let how = match b.level {
                Level::Raid10 => format!(
                    "{} added",
                    plural(
                        a.sets - b.sets,
                        &format!("{}-way mirror set", b.set_width),
                        &format!("{}-way mirror sets", b.set_width)
                    )
                ),
                Level::Raid0 => format!("striped over {}", plural(a.members, "disk", "disks")),
                _ if a.groups > b.groups => format!(
                    "{} of {} added",
                    plural(a.groups - b.groups, "whole group", "whole groups"),
                    b.group_width
                ),
                _ => {
                    let per = a.group_width - b.group_width;
                    let who = if b.groups == 1 {
                        "the group gets".to_string()
                    } else {
                        format!("each of the {} groups gets", b.groups)
                    };
                    match (b.level, a.level) {
                        (Level::Ec { k, .. }, Level::Ec { k: k2, .. }) => format!(
                            "{who} {} (K {k} -> {k2}, M stays)",
                            plural(per, "more disk", "more disks")
                        ),
                        _ => format!("{who} {}", plural(per, "more disk", "more disks")),
                    }
                }
            };
            format!(
                "a reshape: {how}; the whole volume is read and rewritten in the new layout, \
                 every member at once, then the new space is zeroed"
            )
        }
    }
}

fn grow_table(g: &Grow) -> String {
    let (b, a) = (&g.before, &g.after);
    let mut o = String::new();
    if g.kind == GrowKind::Rechunk {
        let _ = writeln!(
            o,
            "sbod plan --rechunk: {} as {}, a new chunk",
            disk_line(b),
            b.layout.spec
        );
    } else {
        let _ = writeln!(
            o,
            "sbod plan --{}: {} as {}, {} {} disk{}: {}",
            if g.kind == GrowKind::Narrow {
                "shrink"
            } else {
                "grow"
            },
            disk_line(b),
            b.layout.spec,
            g.added_disks,
            if g.kind == GrowKind::Narrow {
                "fewer"
            } else {
                "more"
            },
            if g.added_disks == 1 { "" } else { "s" },
            a.layout.spec
        );
    }
    let _ = writeln!(o, "  {}", grow_shape(g));
    let _ = writeln!(o);
    let plans = [b, a];
    let mut rows: Vec<(String, Vec<String>)> = vec![(
        String::new(),
        vec!["before".to_string(), "after".to_string()],
    )];
    let mut row = |name: &str, f: &dyn Fn(&Plan) -> String| {
        rows.push((name.to_string(), plans.iter().map(|p| f(p)).collect()));
    };
    let fill = b.capacity.fill_limit * 100.0;
    let life = short(b.reliability.service_years);
    row("layout", &|p| p.layout.spec.clone());
    row("disks", &|p| p.layout.disks.to_string());
    row("survives per group", &|p| match p.layout.set_tolerates {
        0 => "0".into(),
        t => format!("{t} of {}", p.layout.set_width),
    });
    row("usable TB", &|p| fixed2(p.capacity.usable.tb));
    row("usable TiB", &|p| fixed2(p.capacity.usable.tib));
    row(&format!("at {fill:.0}% fill TB"), &|p| {
        fixed2(p.capacity.at_fill_limit.tb)
    });
    row("usable / raw", &|p| {
        format!("{:.0}%", p.capacity.efficiency * 100.0)
    });
    row(&format!("data loss in {life} y"), &|p| {
        units::prob(p.reliability.p_loss)
    });
    row("MTTDL years", &|p| units::years(p.reliability.mttdl_years));
    let perf = &b.performance;
    let mb = if perf.disk_mb_s.is_some() {
        "MB/s"
    } else {
        "disks"
    };
    let io = if perf.disk_iops.is_some() {
        "IOPS"
    } else {
        "disks"
    };
    let val = |f: &crate::performance::Figure| match f.value {
        Some(v) => thousands(v),
        None => short(f.disks),
    };
    row(&format!("seq read {mb} (est.)"), &|p| {
        val(&p.performance.seq_read)
    });
    row(&format!("seq write {mb} (est.)"), &|p| {
        val(&p.performance.seq_write)
    });
    row(&format!("rand read {io} (est.)"), &|p| {
        val(&p.performance.rand_read)
    });
    row(&format!("rand write {io} (est.)"), &|p| {
        val(&p.performance.rand_write)
    });
    grid(&mut o, &rows);
    let _ = writeln!(o);
    let speed = match g.disk_mb_s_source {
        SpeedSource::Given => format!("{} MB/s per disk", short(g.disk_mb_s)),
        SpeedSource::Assumed => format!(
            "an assumed {} MB/s per disk (give --disk-mbps)",
            short(g.disk_mb_s)
        ),
    };
    let time = format!(
        "{} s ({})",
        thousands(g.seconds.round()),
        duration(g.seconds)
    );
    match g.kind {
        GrowKind::Rechunk => {
            let _ = writeln!(
                o,
                "Data to move      {}: the whole volume, counted as full (every byte moves, used or not)",
                tb(g.data_bytes)
            );
            let _ = writeln!(
                o,
                "  each member reads {} (its share of the data; parity is not read), writes {} (its rows again, and its share of the windows written aside)",
                tb(g.old_member_read_bytes),
                tb(g.old_member_write_bytes)
            );
            let _ = writeln!(
                o,
                "Time              {time} at {speed}: every member reads and writes {} in all (every member at once)",
                tb(g.busiest_member_bytes)
            );
            let _ = writeln!(
                o,
                "  a lower bound: the disk's full sustained speed on an idle array; the rebuild rate limits, client I/O and a flush per window lengthen it"
            );
        }
        GrowKind::Narrow => {
            let _ = writeln!(
                o,
                "Data to move      {}: what the narrower layout holds, counted as full (every byte below the new size moves, used or not)",
                tb(g.data_bytes)
            );
            let _ = writeln!(
                o,
                "  each old member reads {} (its share of it), each member that stays writes {} (its share of the new layout)",
                tb(g.old_member_read_bytes),
                tb(g.old_member_write_bytes)
            );
            let _ = writeln!(
                o,
                "Time              {time} at {speed}: the busiest member's reads and writes (every member at once)"
            );
            let _ = writeln!(
                o,
                "  a lower bound: the disk's full sustained speed on an idle array; the rebuild rate limits and client I/O lengthen it"
            );
        }
        GrowKind::Append => {
            let _ = writeln!(
                o,
                "Data to move      none: the new disks' space is appended to the volume"
            );
            let _ = writeln!(o, "Time              0 s");
        }
        GrowKind::Parity => {
            let _ = writeln!(
                o,
                "Data to move      none; {} of new parity written, one new disk per group",
                tb(g.data_bytes)
            );
            let _ = writeln!(
                o,
                "  old member      reads {} (its share of the data the new parity is computed from)",
                tb(g.old_member_read_bytes)
            );
            let _ = writeln!(
                o,
                "  new disk        writes {}",
                tb(g.new_member_write_bytes)
            );
            let _ = writeln!(
                o,
                "Time              {time} at {speed}: one disk written whole (the new disks at once); each group survives one failure more when it ends"
            );
        }
        GrowKind::Copies => {
            let _ = writeln!(
                o,
                "Data to copy      {}: each new copy is written whole, one disk each",
                tb(g.data_bytes)
            );
            let _ = writeln!(
                o,
                "  old member      reads {} (a copy in service, read end to end as a rebuild's source)",
                tb(g.old_member_read_bytes)
            );
            let _ = writeln!(
                o,
                "  new disk        writes {}",
                tb(g.new_member_write_bytes)
            );
            let _ = writeln!(
                o,
                "Time              {time} at {speed}: the rebuild of one copy (the new copies rebuild at once)"
            );
            let _ = writeln!(
                o,
                "  a lower bound: the disk's full sustained speed on an idle array; the rebuild rate limits and client I/O lengthen it"
            );
        }
        GrowKind::Reshape => {
            let data_tib = g.data_bytes as f64 / crate::units::TIB;
            let _ = writeln!(
                o,
                "Data to move      {} ({} TiB): the whole old volume, counted as full (a reshape moves every byte, used or not)",
                tb(g.data_bytes),
                fixed2(data_tib)
            );
            let _ = writeln!(
                o,
                "  each old member reads {} (its share of the old data{}), writes {} (its share of the new layout, the zeros over the new space included)",
                tb(g.old_member_read_bytes),
                match g.before.layout.level {
                    Level::Raid10 => "; each block from one copy",
                    Level::Raid0 => "",
                    _ => "; parity is not read",
                },
                tb(g.old_member_write_bytes)
            );
            let _ = writeln!(
                o,
                "  each new disk   writes {}",
                tb(g.new_member_write_bytes)
            );
            let _ = writeln!(
                o,
                "Time              {time} at {speed}: the busiest member (an old one) reads and writes {} in all",
                tb(g.busiest_member_bytes)
            );
            let _ = writeln!(
                o,
                "  a lower bound: the disk's full sustained speed for reads and writes together on an idle array; the rebuild rate limits and client I/O lengthen it (the few MiB written aside at the start are not counted)"
            );
        }
    }
    o
}
