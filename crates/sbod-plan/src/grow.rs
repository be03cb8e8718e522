//! A grow before it is done (`sbod plan --grow N`): the layout `sbod grow NAME --add DEV...`
//! makes of N more disks, the capacity before and after, the data that must move, what each
//! member reads and writes, and how long that takes at the disk's speed
//! (docs/PLANNER.md, "Growing").
//!
//! The shapes are the engine's (`sbod-core`'s `array/grow.rs`):
//!
//! * raid0, raid5, raid6, ec:K+M: every group gets `N / groups` more disks (ec: K grows, M
//!   stays), or with `new_groups` whole groups of the same width are added; either way a
//!   **reshape** reads the whole old volume and rewrites it in the new layout, every member
//!   at once, then writes zeros over the space the new layout adds;
//! * raid10: more mirror sets (N a multiple of the copies), also a reshape;
//! * raid1: more copies (every mirror `N / groups` more), each new copy **rebuilt** from
//!   the copies in service;
//! * concat: the disks are **appended**: no data moves.
//!
//! The figures: a reshape moves the whole old volume (every byte, used or not: the reshape
//! does not know which are used), so each old member reads its share of the old data
//! (`usable / members`, parity is not read) and every member, old and new, writes its whole
//! size (its share of the new layout, the zeros over the new space included). The busiest
//! member is an old one: `usable_old / members_old + disk size`, at the disk's full
//! sustained speed. A rebuild writes one disk per new copy, all at once. The few MiB the
//! reshape writes aside at its start (the backup of the critical section) are not counted.

use anyhow::{bail, Result};
use serde::Serialize;

use crate::layout::{Layout, LayoutSpec, Level};
use crate::plan::{Plan, ASSUMED_DISK_MB_S};

/// The most disks a group holds (the engine's limit; ec's Reed-Solomon code's too).
pub const MAX_GROUP_WIDTH: u32 = 256;

/// What a grow does to the data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GrowKind {
    /// The whole volume is rewritten in the new layout (raid0/5/6/10, ec).
    Reshape,
    /// New mirror copies are rebuilt (raid1).
    Copies,
    /// Disks appended (concat): no data moves.
    Append,
    /// A level change that adds one parity shard per stripe (`--grow-level`): one new disk
    /// per group written whole with the new parity, nothing else moves.
    Parity,
    /// Fewer disks (`--shrink`, `sbod grow --remove`): what the others hold is read and
    /// rewritten in the narrower layout; the disks removed are then free.
    Narrow,
    /// A new chunk on the same disks (`--rechunk`, `sbod grow --chunk`): the whole volume
    /// is read and rewritten, every window first written aside (redundancy + 1 copies).
    Rechunk,
}

/// Where the disk speed of the estimate came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SpeedSource {
    /// `--disk-mbps`.
    Given,
    /// Not given: [`ASSUMED_DISK_MB_S`].
    Assumed,
}

/// A grow planned: the layout before and after, and the work in between.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Grow {
    pub kind: GrowKind,
    /// Disks added (devices, with multi-actuator drives).
    pub added_disks: u32,
    /// Whole groups added rather than wider groups.
    pub new_groups: bool,
    pub before: Plan,
    pub after: Plan,
    /// Bytes of data that must move: for a reshape the whole old volume (as if full: a
    /// reshape moves every byte, used or not); for new copies what they are written (one
    /// disk each); 0 for concat.
    pub data_bytes: u64,
    /// What each member in the old layout reads (its share of the old data; for new
    /// copies, a copy in service read end to end as the source).
    pub old_member_read_bytes: u64,
    /// What each member in the old layout writes (its share of the new layout).
    pub old_member_write_bytes: u64,
    /// What each added disk writes.
    pub new_member_write_bytes: u64,
    /// The busiest member's reads and writes together: what bounds the time.
    pub busiest_member_bytes: u64,
    /// The disk's sustained sequential speed the time is computed at, MB/s.
    pub disk_mb_s: f64,
    pub disk_mb_s_source: SpeedSource,
    /// The busiest member's bytes at `disk_mb_s`, seconds: a lower bound (an idle array,
    /// no pacing).
    pub seconds: f64,
}

/// The layout a level change to `to` with `added` more disks makes of `layout` (as `sbod
/// grow --level TO --add DEV...` would): one more parity shard per stripe, one new disk
/// per group; refused, with what would work, where the engine refuses.
pub fn parity_spec(layout: &Layout, added: u32, to: Level) -> Result<LayoutSpec> {
    let (g, w) = (layout.groups, layout.group_width);
    let ok = match (layout.level, to) {
        (Level::Raid0, Level::Raid5) | (Level::Raid5, Level::Raid6) => true,
        (Level::Ec { k, m }, Level::Ec { k: k2, m: m2 }) => k == k2 && m2 == m + 1,
        _ => false,
    };
    if !ok {
        let next = match layout.level {
            Level::Raid0 => "raid5".to_string(),
            Level::Raid5 => "raid6".to_string(),
            Level::Ec { k, m } => format!("ec:{k}+{}", m + 1),
            l => bail!("a {l} array does not change level online"),
        };
        bail!(
            "a {} array changes level online only to {next} (one more parity shard, one more disk per group), not {to}",
            layout.level
        );
    }
    if added != g {
        bail!("a level change adds one disk per group: --grow {g}, not {added}");
    }
    if w + 1 > MAX_GROUP_WIDTH {
        bail!(
            "{} disks per group would be more than the {MAX_GROUP_WIDTH} a group holds",
            w + 1
        );
    }
    let mut spec = LayoutSpec::new(to);
    spec.spares = Some(layout.spares).filter(|&s| s > 0);
    spec.groups = Some(g);
    spec.width = Some(w + 1);
    Ok(spec)
}

/// The layout `removed` fewer disks make of `layout` (as `sbod grow --remove` would: the
/// last disks of every group leave, the same number from each), in the compact spelling's
/// fields; refused, with what would work, where the engine refuses.
pub fn narrowed_spec(layout: &Layout, removed: u32) -> Result<LayoutSpec> {
    let (g, w) = (layout.groups, layout.group_width);
    if removed == 0 {
        bail!("--shrink 0 removes nothing: give the number of disks to remove, e.g. --shrink 1");
    }
    let min = match layout.level {
        Level::Raid0 => 1,
        Level::Raid5 => 3,
        Level::Raid6 => 4,
        Level::Ec { m, .. } => u32::from(m) + 1,
        l => bail!(
            "a {l} array does not restripe onto fewer disks (raid0, raid5, raid6 and ec do; a raid1 copy leaves with `sbod grow --drop`)"
        ),
    };
    if removed % g != 0 {
        bail!("{removed} disk(s) cannot narrow {g} groups alike: give a multiple of {g}");
    }
    let per = removed / g;
    if w < per + min {
        bail!(
            "{} keeps at least {min} disks per group: at most {} fewer per group",
            layout.level,
            w.saturating_sub(min)
        );
    }
    let mut spec = LayoutSpec::new(match layout.level {
        Level::Ec { k, m } => Level::Ec {
            k: k - u16::try_from(per).expect("below 256"),
            m,
        },
        l => l,
    });
    spec.spares = Some(layout.spares).filter(|&s| s > 0);
    spec.groups = Some(g);
    spec.width = Some(w - per);
    Ok(spec)
}

/// The layout `added` more disks make of `layout` (as `sbod grow --add` would), in the
/// compact spelling's fields; refused, with what would work, where the engine refuses.
pub fn grown_spec(layout: &Layout, added: u32, new_groups: bool) -> Result<LayoutSpec> {
    let level = layout.level;
    let (g, w) = (layout.groups, layout.group_width);
    if added == 0 {
        bail!("--grow 0 adds nothing: give the number of disks to add, e.g. --grow 2");
    }
    let mut spec = LayoutSpec::new(level);
    spec.spares = Some(layout.spares).filter(|&s| s > 0);
    let whole_groups = || -> Result<u32> {
        if added % w != 0 {
            bail!(
                "{added} disk(s) do not make whole groups of {w}: give a multiple of {w} with \
                 --new-groups{}",
                if added % g == 0 {
                    format!(
                        ", or leave --new-groups out to widen every group by {}",
                        added / g
                    )
                } else {
                    String::new()
                }
            );
        }
        Ok(added / w)
    };
    let (groups, width) = match level {
        Level::Concat => {
            if new_groups {
                bail!(
                    "concat has no groups: it appends the disks (no data moves); drop --new-groups"
                );
            }
            return Ok(spec);
        }
        Level::Raid1 => {
            if new_groups {
                bail!(
                    "raid1 grows by more copies of each mirror (a rebuild of each new copy), \
                     not by new groups: drop --new-groups (for more mirror sets use raid10)"
                );
            }
            if added % g != 0 {
                bail!(
                    "{added} disk(s) cannot add copies to {g} mirrors alike: give a multiple of {g}"
                );
            }
            (g, w + added / g)
        }
        Level::Raid10 => {
            // More mirror sets, with or without --new-groups (the engine's raid10 groups
            // are its mirror sets).
            let c = layout.copies.unwrap_or(2);
            if added % c != 0 {
                bail!(
                    "{added} disk(s) do not make whole {c}-way mirror sets: give a multiple of {c}"
                );
            }
            spec.copies = Some(c);
            if added % (g * c) == 0 {
                (g, w + added / g)
            } else {
                // The planner's raid10 groups only stripe mirror sets: one group of them
                // all is the same layout to every model.
                (1, layout.members + added)
            }
        }
        Level::Raid0 => {
            // raid0 has one set in the planner; whole groups of its width or a wider set
            // are the same layout to every model.
            if new_groups {
                whole_groups()?;
            }
            (1, w + added)
        }
        Level::Raid5 | Level::Raid6 | Level::Ec { .. } => {
            if new_groups {
                (g + whole_groups()?, w)
            } else {
                if added % g != 0 {
                    bail!(
                        "{added} disk(s) cannot widen {g} groups alike: give a multiple of {g}, \
                         or add whole groups (--new-groups, {w} disks each)"
                    );
                }
                (g, w + added / g)
            }
        }
    };
    if width > MAX_GROUP_WIDTH {
        let what = match level {
            Level::Ec { k, m } => format!(
                "{level} would become ec:{}+{m}, {width} disks per group; the Reed-Solomon code \
                 allows at most {MAX_GROUP_WIDTH}",
                u32::from(k) + width - w
            ),
            Level::Raid1 => format!(
                "{width} copies per mirror would be more than the {MAX_GROUP_WIDTH} a group holds"
            ),
            _ => format!(
                "{width} disks per group would be more than the {MAX_GROUP_WIDTH} a group holds"
            ),
        };
        let instead = match level {
            Level::Raid5 | Level::Raid6 | Level::Ec { .. } if !new_groups => {
                format!(": add whole groups instead (--new-groups, {w} disks each)")
            }
            _ => ": add fewer disks".to_string(),
        };
        bail!("{what}{instead}");
    }
    if let Level::Ec { k, m } = level {
        // Width <= 256, so K fits.
        let k = u32::from(k) + width - w;
        spec.level = Level::Ec {
            k: u16::try_from(k).expect("K below 256"),
            m,
        };
    }
    spec.groups = Some(groups);
    spec.width = Some(width);
    Ok(spec)
}

impl Grow {
    /// The work of a new chunk for `before` (`sbod grow --chunk`): the layout stays, every
    /// byte is read, written aside on redundancy + 1 members of a group (turning window by
    /// window over every member) and rewritten in place.
    pub fn rechunk(before: Plan, disk_mb_s: Option<f64>) -> Grow {
        let (rate, source) = match disk_mb_s {
            Some(r) => (r, SpeedSource::Given),
            None => (ASSUMED_DISK_MB_S, SpeedSource::Assumed),
        };
        let l = &before.layout;
        let disk = before.disk.size_bytes;
        let volume = before.capacity.usable.bytes;
        let members = u128::from(l.members.max(1));
        let read = (u128::from(volume) / members) as u64;
        // Every window's bytes on `redundancy + 1` members, spread over all of them.
        let copies = u128::from(l.set_tolerates) + 1;
        let aside = (u128::from(volume) * copies / members) as u64;
        Grow {
            kind: GrowKind::Rechunk,
            added_disks: 0,
            new_groups: false,
            after: before.clone(),
            before,
            data_bytes: volume,
            old_member_read_bytes: read,
            old_member_write_bytes: disk + aside,
            new_member_write_bytes: 0,
            busiest_member_bytes: read + disk + aside,
            disk_mb_s: rate,
            disk_mb_s_source: source,
            seconds: (read + disk + aside) as f64 / (rate * 1e6),
        }
    }

    /// The work between `before` and `after` (`after` is `before` with `added` more disks,
    /// see [`grown_spec`]), at `disk_mb_s` (the assumed 200 MB/s when `None`).
    pub fn new(
        before: Plan,
        after: Plan,
        added: u32,
        new_groups: bool,
        disk_mb_s: Option<f64>,
    ) -> Grow {
        let (rate, source) = match disk_mb_s {
            Some(r) => (r, SpeedSource::Given),
            None => (ASSUMED_DISK_MB_S, SpeedSource::Assumed),
        };
        let disk = before.disk.size_bytes;
        let old = &before.layout;
        let (kind, data, read, old_write, new_write, busiest) = match old.level {
            _ if after.layout.level != old.level => {
                // A level change: each new disk is written whole with the new parity,
                // computed from the data the old members read (their share of it).
                let volume = before.capacity.usable.bytes;
                let read = (u128::from(volume) / u128::from(old.members)) as u64;
                let data = u64::from(added) * disk;
                (GrowKind::Parity, data, read, 0, disk, read.max(disk))
            }
            _ if after.layout.members < old.members => {
                // What the narrower layout holds is read from every old member (its share
                // of it) and written whole onto the members that stay.
                let volume = after.capacity.usable.bytes;
                let read = (u128::from(volume) / u128::from(old.members)) as u64;
                (GrowKind::Narrow, volume, read, disk, 0, read + disk)
            }
            Level::Concat => (GrowKind::Append, 0, 0, 0, 0, 0),
            Level::Raid1 => {
                // Each new copy is written whole, read from a copy in service.
                let data = u64::from(added) * disk;
                (GrowKind::Copies, data, disk, 0, disk, disk)
            }
            _ => {
                let volume = before.capacity.usable.bytes;
                // Parity rotates and mirrors read from every copy: the old data spreads
                // evenly over the old members.
                let read = (u128::from(volume) / u128::from(old.members)) as u64;
                (GrowKind::Reshape, volume, read, disk, disk, read + disk)
            }
        };
        Grow {
            kind,
            added_disks: added,
            new_groups,
            before,
            after,
            data_bytes: data,
            old_member_read_bytes: read,
            old_member_write_bytes: old_write,
            new_member_write_bytes: new_write,
            busiest_member_bytes: busiest,
            disk_mb_s: rate,
            disk_mb_s_source: source,
            seconds: busiest as f64 / (rate * 1e6),
        }
    }
}
