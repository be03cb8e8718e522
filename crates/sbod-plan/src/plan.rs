//! The whole plan: inputs, and the capacity, reliability and performance of a layout.

use anyhow::{bail, Result};
use serde::Serialize;

use crate::capacity::{Capacity, TibConvention};
use crate::layout::Layout;
use crate::performance::Performance;
use crate::reliability::{self, RateSource, Rebuild, Reliability};
use crate::units::HOURS_PER_YEAR;

/// The disk speed assumed for the rebuild rate when neither `--rebuild-rate` nor the disk's
/// sequential speed is given: a nearline HDD's sustained rate, MB/s.
pub const ASSUMED_DISK_MB_S: f64 = 200.0;

/// One disk model's figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Disk {
    pub size_bytes: u64,
    /// Mean time to failure, hours (from the datasheet, or from an AFR).
    pub mttf_hours: f64,
    /// Sustained sequential MB/s (10^6 bytes), if known.
    pub seq_mb_s: Option<f64>,
    /// Random IOPS at a useful queue depth, if known.
    pub random_iops: Option<f64>,
}

/// Everything else the models need, with the documented defaults.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Assumptions {
    /// Service life, years (default 5).
    pub service_years: f64,
    /// Fraction of usable capacity one plans to fill (default 0.9).
    pub fill_limit: f64,
    /// Rebuild rate in MB/s, when given; else derived from the disk's speed.
    pub rebuild_rate_mb_s: Option<f64>,
    /// Share of the disk's sequential speed a rebuild gets (default 0.5).
    pub rebuild_share: f64,
    /// Hours from a failure to a replacement disk being in place, without hot spares
    /// (default 24).
    pub replace_hours: f64,
    /// Unrecoverable read errors per bit read; `None` leaves UREs out of the model.
    pub ure_per_bit: Option<f64>,
    pub tib: TibConvention,
    /// Random reads a client keeps in flight on HDDs with command queueing: the random
    /// read estimates count where the queues build (`Queueing`); `None` counts disk
    /// operations alone.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue_depth: Option<f64>,
    /// With `queue_depth`: the disks' write caches are off, so a mirror's writes queue
    /// as reads do (`Queueing::writes_queue`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub write_cache_off: bool,
}

impl Default for Assumptions {
    fn default() -> Assumptions {
        Assumptions {
            service_years: 5.0,
            fill_limit: 0.9,
            rebuild_rate_mb_s: None,
            rebuild_share: 0.5,
            replace_hours: 24.0,
            ure_per_bit: None,
            queue_depth: None,
            write_cache_off: false,
            tib: TibConvention::Exact,
        }
    }
}

/// Capacity, reliability and performance of one layout.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Plan {
    pub layout: Layout,
    pub disk: Disk,
    pub assumptions: Assumptions,
    pub capacity: Capacity,
    pub reliability: Reliability,
    pub performance: Performance,
    /// Drives with more than one actuator (`--actuators`), each seen as that many devices.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub actuators: Option<Actuators>,
}

/// Multi-actuator drives (Seagate MACH.2, the field's Exos 2X14): one drive appears as
/// `per_drive` devices (LUNs, or access ranges) of `1/per_drive` its size, each with a
/// single actuator's speed, so a drive has `per_drive` times the IOPS; one drive failing
/// takes all of them: one failure unit.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Actuators {
    pub per_drive: u32,
    pub drives: u32,
    /// Devices the layout is made of: `drives x per_drive`.
    pub devices: u32,
    /// Where the layout has fewer redundancy groups than a drive has LUNs, the LUNs of a
    /// drive share a group: a drive failure costs that group `per_drive` failures, and the
    /// reliability is computed on drives. Else each LUN of a drive is in another group
    /// (sbod create gives them one failure domain and refuses otherwise).
    pub luns_share_a_group: bool,
}

fn positive(v: f64, what: &str, example: &str) -> Result<()> {
    if !(v.is_finite() && v > 0.0) {
        bail!("{what} must be a positive number, e.g. {example} (got {v})");
    }
    Ok(())
}

impl Plan {
    /// Plans `layout` built from `disk`s under `assumptions`.
    pub fn new(layout: &Layout, disk: &Disk, assumptions: &Assumptions) -> Result<Plan> {
        let a = assumptions;
        if disk.size_bytes == 0 {
            bail!("the disk size must be positive, e.g. 20TB");
        }
        if (layout.disks as u128) * (disk.size_bytes as u128) > u64::MAX as u128 {
            bail!(
                "{} disks of {} bytes make more than 18 EB (2^64 bytes), beyond what sbod \
                 addresses: plan fewer or smaller disks",
                layout.disks,
                disk.size_bytes
            );
        }
        positive(disk.mttf_hours, "the MTTF", "2.5M hours")?;
        positive(a.service_years, "the service life", "5 years")?;
        if let Some(v) = disk.seq_mb_s {
            positive(v, "the disk's sequential speed", "250 MB/s")?;
        }
        if let Some(v) = disk.random_iops {
            positive(v, "the disk's random IOPS", "200")?;
        }
        if let Some(v) = a.rebuild_rate_mb_s {
            positive(v, "the rebuild rate", "100MB/s")?;
        }
        if let Some(v) = a.ure_per_bit {
            positive(v, "the URE rate", "1e-15 per bit")?;
        }
        if !(a.fill_limit > 0.0 && a.fill_limit <= 1.0) {
            bail!("the fill limit must be above 0% and at most 100%, e.g. 90%");
        }
        if !(a.rebuild_share > 0.0 && a.rebuild_share <= 1.0) {
            bail!("the rebuild share must be above 0% and at most 100%, e.g. 50%");
        }
        if !(a.replace_hours.is_finite() && a.replace_hours >= 0.0) {
            bail!("the replacement delay must be 0 or more hours, e.g. 24");
        }

        let capacity = Capacity::new(
            disk.size_bytes,
            layout.data_disks,
            layout.redundancy_disks,
            layout.spares,
            a.fill_limit,
            a.tib,
        );

        let (rate_mb_s, rate_source) = match (a.rebuild_rate_mb_s, disk.seq_mb_s) {
            (Some(r), _) => (r, RateSource::Given),
            (None, Some(s)) => (s * a.rebuild_share, RateSource::Disk),
            (None, None) => (ASSUMED_DISK_MB_S * a.rebuild_share, RateSource::Assumed),
        };
        // Declustered with spare space: the lost chunks are rebuilt from and onto every
        // survivor at once (`Layout::rebuild_speedup`), each at the rebuild rate.
        let speedup = layout.rebuild_speedup();
        let rebuild_hours = disk.size_bytes as f64 / (rate_mb_s * 1e6) / 3600.0 / speedup;
        let replacement_hours = if layout.spares > 0 {
            0.0
        } else {
            a.replace_hours
        };
        let rebuild = Rebuild {
            rate_mb_s,
            rate_source,
            rebuild_hours,
            speedup,
            replacement_hours,
            window_hours: replacement_hours + rebuild_hours,
        };
        let lambda = 1.0 / disk.mttf_hours;
        let (n, f) = (layout.set_width, layout.set_tolerates);
        let q = a
            .ure_per_bit
            .filter(|_| f > 0)
            .map(|ure| reliability::ure_probability(ure, (n - f) as f64 * disk.size_bytes as f64));
        let set_mttdl =
            reliability::set_mttdl_hours(n, f, lambda, rebuild.window_hours, q.unwrap_or(0.0));
        let life_hours = a.service_years * HOURS_PER_YEAR;
        let mttdl_hours = set_mttdl / layout.sets as f64;
        let failures_per_year = layout.disks as f64 * HOURS_PER_YEAR / disk.mttf_hours;
        let reliability = Reliability {
            mttf_hours: disk.mttf_hours,
            afr: reliability::afr_from_mttf(disk.mttf_hours),
            service_years: a.service_years,
            expected_failures_per_year: failures_per_year,
            expected_failures: failures_per_year * a.service_years,
            rebuild,
            ure_per_bit: a.ure_per_bit,
            ure_per_critical_rebuild: q,
            set_mttdl_hours: set_mttdl,
            mttdl_hours,
            mttdl_years: mttdl_hours / HOURS_PER_YEAR,
            p_loss_per_year: reliability::p_loss(layout.sets, set_mttdl, HOURS_PER_YEAR),
            p_loss: reliability::p_loss(layout.sets, set_mttdl, life_hours),
        };

        let performance = Performance::estimate_queued(
            layout,
            disk.seq_mb_s,
            disk.random_iops,
            a.queue_depth.map(|depth| crate::Queueing {
                depth,
                gain: crate::Queueing::HDD_GAIN,
                writes_queue: a.write_cache_off,
            }),
        );
        Ok(Plan {
            layout: layout.clone(),
            disk: disk.clone(),
            assumptions: a.clone(),
            capacity,
            reliability,
            performance,
            actuators: None,
        })
    }
}
