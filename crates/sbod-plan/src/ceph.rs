//! A Ceph pool on the same disks (`sbod plan --ceph`): capacity under Ceph's full ratios,
//! placement groups, recovery time after a drive failure from the OSD count and disk speed,
//! data-loss probability, and expected performance with the replication or erasure-coding
//! write cost. First principles, assumptions in docs/PLANNER.md ("Ceph pools").

use anyhow::{bail, Result};
use serde::Serialize;

use crate::performance::Figure;
use crate::reliability::{afr_from_mttf, p_loss, set_mttdl_hours};
use crate::units::HOURS_PER_YEAR;

/// Replicated `size`/`min_size` or erasure-coded `k+m`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum CephPool {
    Replicated { size: u32, min_size: u32 },
    Erasure { k: u32, m: u32, min_size: u32 },
}

impl std::str::FromStr for CephPool {
    type Err = String;
    /// `rep:3`, `rep:3:2` (min_size), `ec:4+2`, `ec:4+2:5`.
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || {
            format!(
                "'{s}': use rep:SIZE[:MIN_SIZE] (e.g. rep:3) or ec:K+M[:MIN_SIZE] (e.g. ec:4+2)"
            )
        };
        let num = |t: &str| t.parse::<u32>().map_err(|_| bad());
        if let Some(r) = s.strip_prefix("rep:") {
            let (size, min) = match r.split_once(':') {
                Some((a, b)) => (num(a)?, Some(num(b)?)),
                None => (num(r)?, None),
            };
            if !(1..=10).contains(&size) {
                return Err(format!("'{s}': a replicated pool has 1 to 10 copies"));
            }
            // Ceph's default: size - size/2 (2 of 3).
            let min_size = min.unwrap_or(size - size / 2);
            if min_size == 0 || min_size > size {
                return Err(format!("'{s}': min_size is 1 to size"));
            }
            return Ok(CephPool::Replicated { size, min_size });
        }
        if let Some(r) = s.strip_prefix("ec:") {
            let (km, min) = match r.split_once(':') {
                Some((a, b)) => (a, Some(num(b)?)),
                None => (r, None),
            };
            let (k, m) = km.split_once('+').ok_or_else(bad)?;
            let (k, m) = (num(k)?, num(m)?);
            if k < 2 || m < 1 || k + m > 32 {
                return Err(format!("'{s}': EC needs k >= 2, m >= 1, k + m <= 32"));
            }
            // Ceph's default for EC pools: k + 1 (writes stop before the last shard of
            // redundancy is gone).
            let min_size = min.unwrap_or(k + 1);
            if min_size < k || min_size > k + m {
                return Err(format!("'{s}': min_size is k to k+m"));
            }
            return Ok(CephPool::Erasure { k, m, min_size });
        }
        Err(bad())
    }
}

impl std::fmt::Display for CephPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CephPool::Replicated { size, min_size } => {
                write!(f, "rep:{size} (min_size {min_size})")
            }
            CephPool::Erasure { k, m, min_size } => write!(f, "ec:{k}+{m} (min_size {min_size})"),
        }
    }
}

impl CephPool {
    /// `rep:3`, `ec:4+2`.
    pub fn short(&self) -> String {
        match self {
            CephPool::Replicated { size, .. } => format!("rep:{size}"),
            CephPool::Erasure { k, m, .. } => format!("ec:{k}+{m}"),
        }
    }
    /// OSDs (failure domains) a placement group spans.
    pub fn width(&self) -> u32 {
        match self {
            CephPool::Replicated { size, .. } => *size,
            CephPool::Erasure { k, m, .. } => k + m,
        }
    }
    /// Shards or copies a PG can lose and keep its data.
    pub fn tolerates(&self) -> u32 {
        match self {
            CephPool::Replicated { size, .. } => size - 1,
            CephPool::Erasure { m, .. } => *m,
        }
    }
    /// Shards or copies a PG can lose and still take writes (min_size).
    pub fn serves_writes_after(&self) -> u32 {
        match self {
            CephPool::Replicated { size, min_size } => size - min_size,
            CephPool::Erasure { k, m, min_size } => k + m - min_size,
        }
    }
    /// Usable bytes per raw byte.
    pub fn efficiency(&self) -> f64 {
        match self {
            CephPool::Replicated { size, .. } => 1.0 / *size as f64,
            CephPool::Erasure { k, m, .. } => *k as f64 / (k + m) as f64,
        }
    }
    /// Shards read to recreate one lost shard (replicated: one copy).
    fn recovery_reads(&self) -> u32 {
        match self {
            CephPool::Replicated { .. } => 1,
            CephPool::Erasure { k, .. } => *k,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FailureDomain {
    Osd,
    Host,
    Rack,
}

impl FailureDomain {
    pub fn name(&self) -> &'static str {
        match self {
            FailureDomain::Osd => "osd",
            FailureDomain::Host => "host",
            FailureDomain::Rack => "rack",
        }
    }
}

impl std::str::FromStr for FailureDomain {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "osd" => Ok(FailureDomain::Osd),
            "host" => Ok(FailureDomain::Host),
            "rack" => Ok(FailureDomain::Rack),
            _ => Err(format!("'{s}': use osd, host or rack")),
        }
    }
}

/// The cluster the pool lives on and the settings that matter.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CephCluster {
    pub drives: u32,
    pub drive_bytes: u64,
    /// OSDs per drive (2 for a dual-actuator drive, one OSD per actuator).
    pub osds_per_drive: u32,
    /// Actuators per drive: the drive's speed is `actuators x` the per-actuator figures.
    pub actuators: u32,
    pub hosts: u32,
    pub racks: u32,
    pub failure_domain: FailureDomain,
    /// PGs per OSD the pool aims for (Ceph's calculator: 100).
    pub pgs_per_osd: u32,
    pub nearfull_ratio: f64,
    pub backfillfull_ratio: f64,
    pub full_ratio: f64,
    /// Per actuator: sequential MB/s and random IOPS.
    pub disk_mb_s: f64,
    pub disk_iops: Option<f64>,
    /// Share of a disk's speed recovery gets while clients run.
    pub recovery_share: f64,
    /// osd_max_backfills: concurrent backfills per OSD.
    pub max_backfills: u32,
    /// mon_osd_down_out_interval: minutes before a down OSD is marked out and recovery starts.
    pub down_out_minutes: f64,
    /// Network per host, Gbit/s (public and cluster traffic together).
    pub network_gbps: f64,
    /// Small writes go through the RocksDB WAL first and the data later (BlueStore's deferred
    /// writes on HDDs, bluestore_prefer_deferred_size_hdd = 64K): 2 disk writes per small
    /// write; 1 on flash.
    pub deferred_small_writes: bool,
    pub mttf_hours: f64,
    pub service_years: f64,
}

/// What the model says about a pool.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CephPlan {
    pub pool: CephPool,
    pub cluster: CephCluster,
    pub osds: u32,
    /// Failure-domain units (OSDs, hosts or racks).
    pub domains: u32,
    /// pg_num: OSDs x pgs_per_osd / width, rounded to a power of two.
    pub pg_num: u32,
    pub raw_bytes: f64,
    /// Raw x efficiency: what the pool could hold at 100% full.
    pub usable_bytes: f64,
    /// At the nearfull ratio (Ceph warns beyond).
    pub usable_at_nearfull_bytes: f64,
    /// The most the pool should hold so that losing one failure domain can still be
    /// recovered onto the rest without passing backfillfull.
    pub self_healing_bytes: f64,
    /// Recovery after one drive fails: bytes recreated, and the three limits on its speed.
    pub recovery: CephRecovery,
    /// Share of PGs with two shards on the OSDs of one drive (failure domain osd with
    /// several OSDs per drive): one drive failure takes two of their shards.
    pub pgs_sharing_a_drive: f64,
    pub p_loss: f64,
    pub p_loss_per_year: f64,
    pub mttdl_years: f64,
    pub expected_failures_per_year: f64,
    pub performance: CephPerformance,
    pub warnings: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CephRecovery {
    /// Bytes held by the failed drive's OSDs at the planned fill (nearfull), recreated
    /// elsewhere.
    pub bytes: f64,
    /// Hours, limited by the surviving disks' work (reads + writes at the recovery share).
    pub disk_hours: f64,
    /// Hours, limited by the PGs recovering at once (osd_max_backfills).
    pub pg_hours: f64,
    /// Hours, limited by the network between hosts (0 for one host).
    pub network_hours: f64,
    /// The window: down-out delay + the slowest of the three.
    pub window_hours: f64,
    /// Bytes/s of the recovery.
    pub rate_bytes_per_sec: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CephPerformance {
    pub kind: &'static str,
    /// Disk I/Os per 4K client write (replicas, or EC's read-modify-write, with deferred
    /// writes counted).
    pub write_ios: f64,
    pub seq_read: Figure,
    pub seq_write: Figure,
    pub rand_read: Figure,
    pub rand_write: Figure,
    /// What bounds sequential writes: "disks" or "network".
    pub seq_write_bound: &'static str,
}

fn choose(n: u64, r: u64) -> f64 {
    if r > n {
        return 0.0;
    }
    let mut x = 1.0;
    for i in 0..r {
        x *= (n - i) as f64 / (i + 1) as f64;
    }
    x
}

impl CephPlan {
    pub fn new(pool: CephPool, c: CephCluster) -> Result<CephPlan> {
        if c.drives == 0 || c.osds_per_drive == 0 || c.hosts == 0 || c.racks == 0 {
            bail!("a Ceph cluster needs at least one drive, OSD, host and rack");
        }
        if c.drives % c.hosts != 0 || c.hosts % c.racks != 0 {
            bail!(
                "{} drives over {} hosts in {} racks: give drives divisible by hosts, hosts by racks",
                c.drives,
                c.hosts,
                c.racks
            );
        }
        if !(0.0 < c.nearfull_ratio
            && c.nearfull_ratio <= c.backfillfull_ratio
            && c.backfillfull_ratio <= c.full_ratio
            && c.full_ratio <= 1.0)
        {
            bail!("full ratios must be 0 < nearfull <= backfillfull <= full <= 1 (Ceph's defaults: 85%, 90%, 95%)");
        }
        let osds = c.drives * c.osds_per_drive;
        let domains = match c.failure_domain {
            FailureDomain::Osd => osds,
            FailureDomain::Host => c.hosts,
            FailureDomain::Rack => c.racks,
        };
        let w = pool.width();
        if domains < w {
            bail!(
                "{pool} places {w} shards in distinct {}s: this cluster has {domains}",
                match c.failure_domain {
                    FailureDomain::Osd => "OSD",
                    FailureDomain::Host => "host",
                    FailureDomain::Rack => "rack",
                }
            );
        }
        let mut warnings = Vec::new();
        if domains == w {
            warnings.push(format!(
                "{domains} failure domains for {w} shards: after a failure there is nowhere to recover to until it is replaced (the PGs stay degraded)"
            ));
        }
        let pg_target = (osds as f64 * c.pgs_per_osd as f64 / w as f64).max(1.0);
        let pg_num = 2f64.powf(pg_target.log2().round()).max(1.0) as u32;
        let raw = c.drives as f64 * c.drive_bytes as f64;
        let usable = raw * pool.efficiency();
        let largest_domain_share = 1.0 / domains as f64;
        let self_healing = usable
            * c.nearfull_ratio
                .min(c.backfillfull_ratio * (1.0 - largest_domain_share));

        // Recovery after one drive fails (all its OSDs), at the planned fill (nearfull).
        let drive_speed = c.disk_mb_s * 1e6 * c.actuators as f64;
        let stored = c.drive_bytes as f64 * c.nearfull_ratio;
        let survivors = (c.drives - 1).max(1) as f64;
        let reads = pool.recovery_reads() as f64;
        // Every recreated byte is read `reads` times (k shards for EC) and written once,
        // spread over the surviving drives, each giving the recovery its share.
        let disk_secs = stored * (reads + 1.0) / (survivors * drive_speed * c.recovery_share);
        // PGs recover a few at a time: each of the failed OSDs' PGs is backfilled into
        // one target OSD, at most max_backfills per OSD at once, each target writing at
        // its actuator's share.
        let pgs_lost = (pg_num as f64 * w as f64 / osds as f64) * c.osds_per_drive as f64;
        let parallel = pgs_lost
            .min((osds - c.osds_per_drive).max(1) as f64 * c.max_backfills as f64)
            .max(1.0);
        let per_target = c.disk_mb_s * 1e6 * c.recovery_share / c.max_backfills.max(1) as f64;
        let pg_secs = stored / (parallel * per_target);
        // Across hosts each recreated byte moves `reads` times (shards to the primary) and
        // once to the new OSD; the hosts' links carry it in parallel.
        let net_secs = if c.hosts > 1 {
            stored * reads / ((c.hosts - 1) as f64 * c.network_gbps * 1e9 / 8.0)
        } else {
            0.0
        };
        let secs = disk_secs.max(pg_secs).max(net_secs);
        let window_hours = c.down_out_minutes / 60.0 + secs / 3600.0;
        let recovery = CephRecovery {
            bytes: stored,
            disk_hours: disk_secs / 3600.0,
            pg_hours: pg_secs / 3600.0,
            network_hours: net_secs / 3600.0,
            window_hours,
            rate_bytes_per_sec: stored / secs.max(1e-9),
        };

        // Data loss: drives fail at λ; data is lost when f + 1 drives holding shards of one
        // PG fail within overlapping recovery windows. The chain over all drives (any f + 1
        // overlapping failures) times the chance that such a set of drives holds a PG.
        let lambda = 1.0 / c.mttf_hours;
        let f = pool.tolerates();
        let n = c.drives;
        let pgs_col = if c.failure_domain == FailureDomain::Osd && c.osds_per_drive > 1 {
            // The chance that w OSDs drawn from distinct OSDs include two of one drive.
            let a = c.osds_per_drive as f64;
            let total = osds as f64;
            let mut clear = 1.0;
            for i in 1..w {
                clear *= 1.0 - (i as f64 * (a - 1.0)) / (total - i as f64);
            }
            (1.0 - clear).clamp(0.0, 1.0)
        } else {
            0.0
        };
        if pgs_col > 0.0 {
            warnings.push(format!(
                "failure domain osd with {} OSDs per drive: {:.0}% of PGs have two shards on one drive, which one drive failure takes together (use failure domain host, or a CRUSH rule per drive)",
                c.osds_per_drive,
                pgs_col * 100.0
            ));
        }
        // Sets of f+1 drives the placement allows (distinct failure domains).
        let per_domain_drives = match c.failure_domain {
            FailureDomain::Osd => 1.0,
            FailureDomain::Host => (c.drives / c.hosts) as f64,
            FailureDomain::Rack => (c.drives / c.racks) as f64,
        };
        let drive_domains = match c.failure_domain {
            FailureDomain::Osd => c.drives as u64,
            FailureDomain::Host => c.hosts as u64,
            FailureDomain::Rack => c.racks as u64,
        };
        let rate_for = |fail: u32, distinct: u32, pgs: f64| -> f64 {
            // Loss rate (per hour) of `pgs` PGs of `distinct` drives surviving `fail`.
            if pgs <= 0.0 {
                return 0.0;
            }
            if fail + 1 > n {
                return 0.0;
            }
            let sets =
                choose(drive_domains, (fail + 1) as u64) * per_domain_drives.powi(fail as i32 + 1);
            let covered = choose(distinct as u64, (fail + 1) as u64);
            let cover = if sets > 0.0 {
                -(-pgs * covered / sets).exp_m1()
            } else {
                0.0
            };
            cover / set_mttdl_hours(n, fail, lambda, window_hours, 0.0)
        };
        let pgs = pg_num as f64;
        let mut rate = rate_for(f, w, pgs * (1.0 - pgs_col));
        if pgs_col > 0.0 {
            rate += rate_for(f.saturating_sub(1), w - 1, pgs * pgs_col);
        }
        let hours = c.service_years * HOURS_PER_YEAR;
        let mttdl_hours = if rate > 0.0 {
            1.0 / rate
        } else {
            f64::INFINITY
        };
        let p = if rate > 0.0 {
            p_loss(1, mttdl_hours, hours)
        } else {
            0.0
        };
        let p_year = if rate > 0.0 {
            p_loss(1, mttdl_hours, HOURS_PER_YEAR)
        } else {
            0.0
        };
        let _ = afr_from_mttf;

        // Performance.
        let devices = (c.drives * c.actuators) as f64;
        let d = if c.deferred_small_writes { 2.0 } else { 1.0 };
        let write_ios = match pool {
            CephPool::Replicated { size, .. } => size as f64 * d,
            // A 4K overwrite inside a stripe: read the other k - 1 data chunks, write the
            // chunk and m parities (each deferred).
            CephPool::Erasure { k, m, .. } => (k - 1) as f64 + (1 + m) as f64 * d,
        };
        let net_total = c.network_gbps * 1e9 / 8.0 * c.hosts as f64 / 1e6; // MB/s
        let disk_mb = devices * c.disk_mb_s;
        // Sequential writes: raw bandwidth / raw bytes per client byte; through the network
        // each client byte leaves the primary's host (width - 1) / k times (EC) or
        // size - 1 times (replicas), and arrives once.
        let raw_per_byte = 1.0 / pool.efficiency();
        let seq_w_disk = disk_mb / raw_per_byte;
        let seq_w_net = if c.hosts > 1 {
            let moves = 1.0 + (raw_per_byte - 1.0) * (c.hosts - 1) as f64 / c.hosts as f64;
            net_total / moves
        } else {
            f64::INFINITY
        };
        let (seq_write, bound) = if seq_w_net < seq_w_disk {
            (seq_w_net, "network")
        } else {
            (seq_w_disk, "disks")
        };
        let seq_read = if c.hosts > 1 {
            disk_mb.min(net_total)
        } else {
            disk_mb
        };
        let fig = |disks: f64, per: Option<f64>| Figure {
            disks,
            value: per.map(|v| disks * v),
        };
        let performance = CephPerformance {
            kind: "estimate",
            write_ios,
            seq_read: fig(seq_read / c.disk_mb_s, Some(c.disk_mb_s)),
            seq_write: fig(seq_write / c.disk_mb_s, Some(c.disk_mb_s)),
            rand_read: fig(devices, c.disk_iops),
            rand_write: fig(devices / write_ios, c.disk_iops),
            seq_write_bound: bound,
        };
        Ok(CephPlan {
            pool,
            osds,
            domains,
            pg_num,
            raw_bytes: raw,
            usable_bytes: usable,
            usable_at_nearfull_bytes: usable * c.nearfull_ratio,
            self_healing_bytes: self_healing,
            recovery,
            pgs_sharing_a_drive: pgs_col,
            p_loss: p,
            p_loss_per_year: p_year,
            mttdl_years: mttdl_hours / HOURS_PER_YEAR,
            expected_failures_per_year: c.drives as f64 * HOURS_PER_YEAR / c.mttf_hours,
            performance,
            warnings,
            cluster: c,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(drives: u32, hosts: u32, fd: FailureDomain) -> CephCluster {
        CephCluster {
            drives,
            drive_bytes: 20_000_000_000_000,
            osds_per_drive: 1,
            actuators: 1,
            hosts,
            racks: 1,
            failure_domain: fd,
            pgs_per_osd: 100,
            nearfull_ratio: 0.85,
            backfillfull_ratio: 0.90,
            full_ratio: 0.95,
            disk_mb_s: 250.0,
            disk_iops: Some(200.0),
            recovery_share: 0.5,
            max_backfills: 1,
            down_out_minutes: 10.0,
            network_gbps: 25.0,
            deferred_small_writes: true,
            mttf_hours: 2.5e6,
            service_years: 5.0,
        }
    }

    #[test]
    fn pool_spelling_and_defaults() {
        let p: CephPool = "rep:3".parse().unwrap();
        assert_eq!(
            p,
            CephPool::Replicated {
                size: 3,
                min_size: 2
            }
        );
        let p: CephPool = "ec:4+2".parse().unwrap();
        assert_eq!(
            p,
            CephPool::Erasure {
                k: 4,
                m: 2,
                min_size: 5
            }
        );
        assert_eq!(
            (p.width(), p.tolerates(), p.serves_writes_after()),
            (6, 2, 1)
        );
        assert!((p.efficiency() - 4.0 / 6.0).abs() < 1e-12);
        for bad in ["rep:0", "rep:3:4", "ec:1+1", "ec:4", "raid6", "ec:4+2:3"] {
            assert!(bad.parse::<CephPool>().is_err(), "{bad}");
        }
    }

    /// 60 x 20 TB in 5 hosts, x3 by host: the figures by hand.
    #[test]
    fn hand_computed_capacity_pgs_and_recovery() {
        let p = CephPlan::new(
            "rep:3".parse().unwrap(),
            cluster(60, 5, FailureDomain::Host),
        )
        .unwrap();
        assert_eq!(p.osds, 60);
        // 60 x 100 / 3 = 2000 -> 2048.
        assert_eq!(p.pg_num, 2048);
        assert!((p.raw_bytes - 1.2e15).abs() < 1.0);
        assert!((p.usable_bytes - 4e14).abs() < 1.0);
        // min(0.85, 0.90 x 4/5 = 0.72) of 400 TB = 288 TB.
        assert!((p.self_healing_bytes - 2.88e14).abs() < 1e3);
        // 17 TB recreated: read once, write once over 59 drives at 125 MB/s:
        // 17e12 x 2 / (59 x 125e6) = 4610 s.
        let r = &p.recovery;
        assert!((r.disk_hours * 3600.0 - 17e12 * 2.0 / (59.0 * 125e6)).abs() < 1.0);
        // PGs on the drive: 2048 x 3 / 60 = 102.4, at most 59 at once (one backfill per
        // surviving OSD), each at 125 MB/s.
        assert!((r.pg_hours * 3600.0 - 17e12 / (59.0 * 125e6)).abs() < 1.0);
        // Network: 17 TB over 4 links of 25 Gbit/s.
        assert!((r.network_hours * 3600.0 - 17e12 / (4.0 * 25e9 / 8.0)).abs() < 1.0);
        assert!(
            (r.window_hours - (10.0 / 60.0 + r.disk_hours.max(r.pg_hours).max(r.network_hours)))
                .abs()
                < 1e-9
        );
        // 4K writes: 3 replicas x (WAL + data).
        assert_eq!(p.performance.write_ios, 6.0);
        assert!((p.performance.rand_write.value.unwrap() - 60.0 * 200.0 / 6.0).abs() < 1e-6);
        assert!(p.p_loss > 0.0 && p.p_loss < 1e-3, "{}", p.p_loss);
    }

    #[test]
    fn more_redundancy_and_faster_recovery_lose_less() {
        let c = cluster(24, 4, FailureDomain::Host);
        let r2 = CephPlan::new("rep:2".parse().unwrap(), c.clone()).unwrap();
        let r3 = CephPlan::new("rep:3".parse().unwrap(), c.clone()).unwrap();
        assert!(r3.p_loss < r2.p_loss / 100.0, "{} {}", r3.p_loss, r2.p_loss);
        let mut fast = c.clone();
        fast.disk_mb_s *= 4.0;
        let f3 = CephPlan::new("rep:3".parse().unwrap(), fast).unwrap();
        assert!(f3.recovery.window_hours < r3.recovery.window_hours);
        assert!(f3.p_loss < r3.p_loss);
        // EC 4+2 stores more per raw byte than x3 and survives as many failures.
        let e = CephPlan::new(
            "ec:4+2".parse().unwrap(),
            cluster(24, 6, FailureDomain::Host),
        )
        .unwrap();
        assert!(e.usable_bytes > r3.usable_bytes);
        assert!(e.performance.write_ios > r3.performance.write_ios - 1.0);
    }

    #[test]
    fn dual_actuator_osds_by_osd_share_a_drive() {
        let mut c = cluster(12, 1, FailureDomain::Osd);
        c.osds_per_drive = 2;
        c.actuators = 2;
        c.drive_bytes = 14_000_000_000_000;
        let p = CephPlan::new("rep:3".parse().unwrap(), c.clone()).unwrap();
        assert_eq!(p.osds, 24);
        assert!(p.pgs_sharing_a_drive > 0.1, "{}", p.pgs_sharing_a_drive);
        assert!(p
            .warnings
            .iter()
            .any(|w| w.contains("two shards on one drive")));
        let mut one = c.clone();
        one.osds_per_drive = 1;
        let q = CephPlan::new("rep:3".parse().unwrap(), one).unwrap();
        assert!(p.p_loss > q.p_loss * 10.0, "{} vs {}", p.p_loss, q.p_loss);
    }

    #[test]
    fn refusals() {
        let c = cluster(6, 1, FailureDomain::Host);
        let e = CephPlan::new("rep:3".parse().unwrap(), c)
            .unwrap_err()
            .to_string();
        assert!(e.contains("distinct hosts") && e.contains("has 1"), "{e}");
        let c = cluster(6, 4, FailureDomain::Host);
        assert!(CephPlan::new("rep:3".parse().unwrap(), c).is_err());
        let mut c = cluster(6, 1, FailureDomain::Osd);
        c.nearfull_ratio = 0.97;
        assert!(CephPlan::new("rep:3".parse().unwrap(), c).is_err());
        // Six OSDs for EC 4+2: it fits, with nowhere to recover to.
        let p =
            CephPlan::new("ec:4+2".parse().unwrap(), cluster(6, 1, FailureDomain::Osd)).unwrap();
        assert!(p.warnings.iter().any(|w| w.contains("nowhere to recover")));
    }
}
