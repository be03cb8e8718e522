//! Performance estimate of a layout from one disk's figures (docs/PLANNER.md, "Performance").
//!
//! An estimate, not a measurement: it counts how many disks' worth of work each kind of
//! I/O gets, assuming enough concurrent requests to keep every disk busy and nothing else
//! (network, controller, CPU, parity computation) in the way.
//!
//! * raid0: every disk streams and seeks for itself.
//! * concat: one sequential stream is on one disk at a time; random I/O spreads over all.
//! * mirrors (raid1, raid10) with `c` copies: reads come from every copy (all disks);
//!   each write goes to all `c` copies, so writes get `members / c` disks.
//! * parity (raid5, raid6, ec:K+M) with `p` parity per group of width `w`: sequential reads
//!   and full-stripe writes move data at the data disks' share, `groups x (w - p)`; random
//!   reads spread over all members (rotating parity); a small random write reads and writes
//!   the data and its `p` parities, `2 (p + 1)` disk I/Os: 4 for raid5, 6 for raid6.
//! * groups work in parallel; hot spares idle.

use serde::Serialize;

use crate::layout::{Layout, Level};

/// One estimated figure: disks' worth, and the absolute figure when the disk's is known.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Figure {
    /// In multiples of one disk.
    pub disks: f64,
    /// `disks x` the disk's figure (MB/s or IOPS), when it was given.
    pub value: Option<f64>,
}

/// The estimate for a layout.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Performance {
    /// Always `"estimate"`: these figures come from a model, not a measurement.
    pub kind: &'static str,
    /// The disk's sequential MB/s and random IOPS the estimate scales, when given.
    pub disk_mb_s: Option<f64>,
    pub disk_iops: Option<f64>,
    /// Disk I/Os per small random write.
    pub write_penalty: f64,
    /// Sequential read and write, MB/s.
    pub seq_read: Figure,
    pub seq_write: Figure,
    /// Random read and write, IOPS.
    pub rand_read: Figure,
    pub rand_write: Figure,
}

impl Performance {
    pub fn estimate(
        layout: &Layout,
        disk_mb_s: Option<f64>,
        disk_iops: Option<f64>,
    ) -> Performance {
        let members = layout.members as f64;
        let data = layout.data_disks as f64;
        let (seq_read, seq_write, rand_read, penalty) = match layout.level {
            Level::Raid0 => (members, members, members, 1.0),
            Level::Concat => (1.0, 1.0, members, 1.0),
            Level::Raid1 | Level::Raid10 => {
                let c = layout.copies.unwrap_or(2) as f64;
                (members, members / c, members, c)
            }
            Level::Raid5 | Level::Raid6 | Level::Ec { .. } => {
                let p = layout.set_tolerates as f64;
                (data, data, members, 2.0 * (p + 1.0))
            }
        };
        let rand_write = members / penalty;
        let fig = |disks: f64, per: Option<f64>| Figure {
            disks,
            value: per.map(|v| disks * v),
        };
        Performance {
            kind: "estimate",
            disk_mb_s,
            disk_iops,
            write_penalty: penalty,
            seq_read: fig(seq_read, disk_mb_s),
            seq_write: fig(seq_write, disk_mb_s),
            rand_read: fig(rand_read, disk_iops),
            rand_write: fig(rand_write, disk_iops),
        }
    }
}
