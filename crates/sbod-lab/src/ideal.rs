//! The layout's ideal ratio to BASELINE: what a RAID layout gives of its members' own
//! throughput when the drives, not the CPU, are the limit (issue 31). The lab's report
//! puts it beside each measured ratio, with the fraction of it reached and the aim the
//! issue sets for that row.
//!
//! The model counts drive operations. BASELINE is every member serving the workload alone:
//! one client I/O costs one drive operation, on any of the `n` members. A layout spends,
//! per client I/O, the drive operations it needs, on the members that are in service, so
//! its ratio is `(members in service / cost per client I/O) / members of BASELINE`.
//! Sequential streams count drive time instead: a drive streaming a stripe's chunks spends
//! the same time passing a chunk it does not need (parity, another copy) as reading it, so
//! a parity layout of `k` data in `w` chunks delivers `k / w` of its drives' bandwidth,
//! nominal or with a member down (the survivors read or write every chunk they hold and the
//! missing data is the parity's), and a mirror of `c` copies `1 / c`. A declustered
//! layout's spare space is a chunk of every row on some member, passed as parity is: its
//! streams deliver `groups * k` of the `members` chunks of a row.
//!
//! Random 4K, per client I/O (`n` members share the stripes, `k + m = w` chunks a stripe,
//! one member down in DEVICE DOWN, so a chunk is on it with probability `1 / n`):
//!
//! - read: 1; down: `1 - 1/n + k/n` (a chunk on the missing member is rebuilt from `k`).
//! - write, parity: read-modify-write, `2 (m + 1)` (old data and parity read, new
//!   written); down: `k - 1 + m` where the data chunk is missing (reconstruct-write: the
//!   other data read, the parity written), `2m` where one of the parity chunks is
//!   (probability `m / n`), else `2 (m + 1)`.
//! - write, mirror of `c`: `c`; down: `c - c/n` (the set that lost a copy writes `c - 1`).
//! - a read/write mix: the mix of the two.
//!
//! Arrays of several groups (not declustered) share the load evenly between groups, so the
//! slowest group (the degraded one) sets the pace of all. QD1 latency runs, `bssplit` mixes,
//! queue-depth sweeps and DEVICE REBUILD (the rebuild takes the drives' time) have no ideal
//! here, nor has DEVICE DOWN of an array with spare capacity (hot spares, or a declustered
//! layout's spare space): sbod rebuilds into it the moment a member fails, so that phase
//! measures a rebuild, not the degraded array this model counts. On members that answer
//! from memory the CPU, not the drives, is the limit and the ideal is an upper bound, not
//! a target.

use crate::schema::{ArrayInfo, Ideal, Workload, NOMINAL};

/// DEVICE DOWN's phase id.
const DOWN: &str = "device-down";

/// The shape of a layout, as the model sees it.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Shape {
    /// No redundancy (raid0): every member carries data, one operation per I/O.
    Stripe,
    /// `copies` mirrors of each chunk.
    Mirror { copies: f64 },
    /// `k` data and `m` parity chunks a stripe.
    Parity { k: f64, m: f64 },
}

fn shape(a: &ArrayInfo) -> Option<Shape> {
    let w = a.width as f64;
    let lvl = a.level.as_str();
    Some(match lvl {
        "raid0" => Shape::Stripe,
        "raid1" | "raid10" if w >= 2.0 => Shape::Mirror { copies: w },
        "raid5" if w >= 2.0 => Shape::Parity { k: w - 1.0, m: 1.0 },
        "raid6" if w >= 3.0 => Shape::Parity { k: w - 2.0, m: 2.0 },
        _ => {
            let (k, m) = lvl.strip_prefix("ec:")?.split_once('+')?;
            Shape::Parity {
                k: k.parse().ok()?,
                m: m.parse().ok()?,
            }
        }
    })
}

/// Drive operations per client I/O (or drive time per unit of data, for streams) of
/// `shape` on a pool of `n` members, one of them down when `down`.
fn cost(shape: Shape, w: &Workload, n: f64, down: bool) -> Option<f64> {
    let p = if down { 1.0 / n } else { 0.0 };
    let seq = match w.rw.as_str() {
        "read" | "write" => true,
        "randread" | "randwrite" | "randrw" => false,
        _ => return None,
    };
    if seq {
        // Drive time per unit of data; with one member down the stripes it held lose a
        // chunk's worth of time (1/n of the pool's).
        let per = match shape {
            Shape::Stripe => 1.0,
            Shape::Mirror { copies } => copies,
            Shape::Parity { k, m } => (k + m) / k,
        };
        return Some(per * (1.0 - p));
    }
    let read = match shape {
        Shape::Stripe | Shape::Mirror { .. } => 1.0,
        Shape::Parity { k, .. } => 1.0 - p + p * k,
    };
    let write = match shape {
        Shape::Stripe => 1.0,
        Shape::Mirror { copies } => copies - p * copies,
        Shape::Parity { k, m } => {
            let q = if down { m / n } else { 0.0 };
            p * (k - 1.0 + m) + q * 2.0 * m + (1.0 - p - q) * 2.0 * (m + 1.0)
        }
    };
    Some(match w.rw.as_str() {
        "randread" => read,
        "randwrite" => write,
        _ => {
            let r = w.rwmixread? as f64 / 100.0;
            r * read + (1.0 - r) * write
        }
    })
}

/// The aim the issue sets for a row, as a fraction of its ideal: nominal sequential
/// reads 0.95 and writes 0.9, random writes 0.9, reads with a member down 0.9, sequential
/// writes with a member down 0.8.
fn aim(w: &Workload, phase: &str) -> Option<f64> {
    match (phase, w.rw.as_str()) {
        (NOMINAL, "read") => Some(0.95),
        (NOMINAL, "write") => Some(0.9),
        (NOMINAL, "randwrite") => Some(0.9),
        (DOWN, "read" | "randread") => Some(0.9),
        (DOWN, "write") => Some(0.8),
        _ => None,
    }
}

/// The ideal ratio to BASELINE of `w` on array `a` in `phase` (see the module's text), the
/// fraction of it that `measured` reaches and the aim for that fraction; `None` where the
/// model has no ideal.
pub fn ideal(a: &ArrayInfo, w: &Workload, phase: &str, measured: Option<f64>) -> Option<Ideal> {
    if w.bssplit.is_some() || w.sweep || w.iodepth <= 1 {
        return None;
    }
    let down = match phase {
        NOMINAL => false,
        DOWN => true,
        _ => return None,
    };
    let shape = shape(a)?;
    if down && (shape == Shape::Stripe || has_spare_capacity(a)) {
        return None;
    }
    let baseline = a.members.len().max(1) as f64;
    let width = a.width.max(1) as f64;
    let groups = a.groups.max(1) as f64;
    // Members that carry the layout: a declustered pool is every member; classic groups
    // are `groups` sets of `width`, and the rest (hot spares) idle.
    let (sets, n) = if a.declustered {
        (1.0, baseline)
    } else {
        (groups, width)
    };
    let nominal = n / cost(shape, w, n, false)?;
    let pace = if down {
        // One member of one set is down; the slowest set paces all.
        ((n - 1.0) / cost(shape, w, n, true)?).min(nominal)
    } else {
        nominal
    };
    // A declustered layout's distributed spare space lies in every row, on every member:
    // a drive streaming its rows passes the spare chunks as it passes parity, so a stream
    // gets the rows' data chunks of all their chunks (`groups * k` of `members`), as hot
    // spares leave theirs idle. Random I/O counts operations, which spare space takes none
    // of.
    let spare_space = if a.declustered && matches!(w.rw.as_str(), "read" | "write") {
        (groups * width / baseline).min(1.0)
    } else {
        1.0
    };
    let ratio = sets * pace * spare_space / baseline;
    Some(Ideal {
        ratio,
        of_ideal: measured.map(|m| m / ratio),
        aim: aim(w, phase),
    })
}

/// The array holds more members than its groups span: hot spares, or (declustered) spare
/// space in every row. A member failing is rebuilt into it at once.
pub fn has_spare_capacity(a: &ArrayInfo) -> bool {
    (a.groups.max(1) as usize) * (a.width.max(1) as usize) < a.members.len()
}

/// The bytes of each member that `volume` bytes of the array's volume occupy: its data
/// and its redundancy (`w / k` of it for parity, `c` copies for a mirror) spread over the
/// `groups * width` chunks of a row: hot spares carry none, and a declustered layout's
/// rows span every member with its spare space in them, so each member holds one chunk
/// (data, parity or spare) of every row.
/// BASELINE addresses that much of each member, so that both stream over the same member
/// bytes: on a drive the outer bytes are faster than the inner ones (on a modelled drive
/// spread over its whole stroke, `span=full`, a 512 MiB member's first quarter streams
/// about 7% faster than its first half). `None` for a layout the model does not know.
pub fn member_footprint(a: &ArrayInfo, volume: u64) -> Option<u64> {
    let per = match shape(a)? {
        Shape::Stripe => 1.0,
        Shape::Mirror { copies } => copies,
        Shape::Parity { k, m } => (k + m) / k,
    };
    let carrying = (a.groups.max(1) * a.width.max(1)).max(1) as f64;
    Some((volume as f64 * per / carrying) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::MemberInfo;

    fn array(level: &str, width: u32, members: u32, groups: u32, declustered: bool) -> ArrayInfo {
        ArrayInfo {
            name: "a".into(),
            level: level.into(),
            chunk_bytes: 65536,
            groups,
            width,
            redundancy: 1,
            size_bytes: 0,
            declustered,
            members: (0..members)
                .map(|i| MemberInfo {
                    slot: i,
                    path: format!("m{i}"),
                    size_bytes: 1,
                    kind: "file".into(),
                    rotational: false,
                })
                .collect(),
        }
    }

    fn wl(rw: &str, mix: Option<u32>) -> Workload {
        Workload {
            id: rw.into(),
            title: rw.into(),
            rw: rw.into(),
            bs: Some("4k".into()),
            bssplit: None,
            rwmixread: mix,
            iodepth: 32,
            sweep: false,
        }
    }

    fn r(a: &ArrayInfo, rw: &str, phase: &str) -> f64 {
        ideal(a, &wl(rw, Some(70)), phase, None).unwrap().ratio
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn member_footprint_is_data_and_redundancy_over_the_carrying_members() {
        let g = 1 << 30;
        // raid6 of 8: 1 GiB of volume is 8/6 GiB on 8 members.
        assert_eq!(
            member_footprint(&array("raid6", 8, 8, 1, false), g),
            Some(g / 6)
        );
        // raid10 of 8 in 4 mirror pairs: 2 GiB on 8 members.
        assert_eq!(
            member_footprint(&array("raid10", 2, 8, 4, false), g),
            Some(g / 4)
        );
        // ec:4+2 of 6: 6/4 GiB on 6 members.
        assert_eq!(
            member_footprint(&array("ec:4+2", 6, 6, 1, false), g),
            Some(g / 4)
        );
        // raid5 of 7 with a hot spare: the spare carries nothing.
        assert_eq!(
            member_footprint(&array("raid5", 7, 8, 1, false), g),
            Some(g / 6)
        );
        // Declustered raid6 of width 7 over 8 members (one member's worth of spare space):
        // a row holds 5 data chunks and spans all 8 members, so each holds 1/5 GiB.
        let d = member_footprint(&array("raid6", 7, 8, 1, true), g).unwrap();
        assert!((d as f64 - g as f64 / 5.0).abs() < 2.0);
        assert_eq!(
            member_footprint(&array("ceph rep:3", 3, 3, 1, false), g),
            None
        );
    }

    #[test]
    fn raid6_of_8_by_hand() {
        let a = array("raid6", 8, 8, 1, false);
        // Streams: 6 of 8 chunks are data, nominal or down.
        assert!(close(r(&a, "read", NOMINAL), 0.75));
        assert!(close(r(&a, "write", NOMINAL), 0.75));
        assert!(close(r(&a, "read", DOWN), 0.75));
        assert!(close(r(&a, "write", DOWN), 0.75));
        // Random: reads 1; read-modify-write 6 operations a write.
        assert!(close(r(&a, "randread", NOMINAL), 1.0));
        assert!(close(r(&a, "randwrite", NOMINAL), 1.0 / 6.0));
        // 70/30: 1 / (0.7 + 0.3 x 6).
        assert!(close(r(&a, "randrw", NOMINAL), 1.0 / 2.5));
        // Down: a read costs 7/8 + 6/8 = 13/8 on 7 members: 7/8 / (13/8) = 7/13.
        assert!(close(r(&a, "randread", DOWN), 7.0 / 13.0));
        // A write: 1/8 x (5 + 2) + 2/8 x 4 + 5/8 x 6 = 45/8 on 7 members: 7/45.
        assert!(close(r(&a, "randwrite", DOWN), 7.0 / 45.0));
    }

    #[test]
    fn raid5_ec_mirrors_and_stripes() {
        let a = array("raid5", 4, 4, 1, false);
        assert!(close(r(&a, "read", NOMINAL), 0.75));
        assert!(close(r(&a, "randwrite", NOMINAL), 0.25));
        let a = array("ec:4+2", 6, 6, 1, false);
        assert!(close(r(&a, "write", NOMINAL), 4.0 / 6.0));
        assert!(close(r(&a, "randwrite", NOMINAL), 1.0 / 6.0));
        // raid10, 4 mirror sets of 2 (8 members): a stream uses half; random reads all;
        // down: the set left with one member takes a quarter of the reads on one member
        // and paces the others (4 x 1 / 8); its writes cost 1 on that one member.
        let a = array("raid10", 2, 8, 4, false);
        assert!(close(r(&a, "read", NOMINAL), 0.5));
        assert!(close(r(&a, "randread", NOMINAL), 1.0));
        assert!(close(r(&a, "randwrite", NOMINAL), 0.5));
        assert!(close(r(&a, "randread", DOWN), 0.5));
        assert!(close(r(&a, "randwrite", DOWN), 0.5));
        assert!(close(r(&a, "read", DOWN), 0.5));
        let a = array("raid0", 8, 8, 1, false);
        assert!(close(r(&a, "write", NOMINAL), 1.0));
        assert!(ideal(&a, &wl("read", None), DOWN, None).is_none());
    }

    #[test]
    fn groups_spares_and_declustered() {
        // Two groups of raid6 4+2 and two hot spares: 12 of 14 members carry the layout.
        let a = array("raid6", 6, 14, 2, false);
        assert!(close(
            r(&a, "write", NOMINAL),
            2.0 * 6.0 * (4.0 / 6.0) / 14.0
        ));
        // With a member down a hot spare takes its place and rebuilds: no ideal.
        assert!(has_spare_capacity(&a));
        assert!(ideal(&a, &wl("randread", None), DOWN, None).is_none());
        assert!(ideal(&a, &wl("read", None), DOWN, None).is_none());
        // Without the spares, the degraded group paces the other: 2 x (5 / (1 - 1/6 +
        // 4/6)) / 12.
        let a = array("raid6", 6, 12, 2, false);
        assert!(!has_spare_capacity(&a));
        let want = 2.0 * (5.0 / (1.0 - 1.0 / 6.0 + 4.0 / 6.0)) / 12.0;
        assert!(close(r(&a, "randread", DOWN), want));
        // The same stripes declustered over all 12: the missing member's chunks are 1/12
        // of the reads, and 11 members serve.
        let mut d = a.clone();
        d.declustered = true;
        assert!(close(r(&d, "read", DOWN), 8.0 / 12.0));
        let want = 11.0 / (1.0 - 1.0 / 12.0 + 4.0 / 12.0) / 12.0;
        assert!(close(r(&d, "randread", DOWN), want));
        assert!(r(&d, "randread", DOWN) > r(&a, "randread", DOWN));
        // Declustered with spare space (two groups of 6 over 14): a stream passes the
        // spare space in every row, 8 data chunks of 14 a row; a member down rebuilds
        // into the spare space, no ideal.
        let d = array("raid6", 6, 14, 2, true);
        assert!(close(r(&d, "write", NOMINAL), 8.0 / 14.0));
        assert!(close(r(&d, "read", NOMINAL), 8.0 / 14.0));
        assert!(has_spare_capacity(&d));
        assert!(ideal(&d, &wl("read", None), DOWN, None).is_none());
        // Without spare space a declustered raid6 of 8 streams as raid6 of 8 does, and
        // with one member's worth (width 7 over 8) 5 data chunks of 8 a row, not 5 of 7.
        assert!(close(
            r(&array("raid6", 8, 8, 1, true), "read", NOMINAL),
            0.75
        ));
        let s = array("raid6", 7, 8, 1, true);
        assert!(close(r(&s, "read", NOMINAL), 5.0 / 8.0));
        assert!(close(r(&s, "write", NOMINAL), 5.0 / 8.0));
        assert!(close(r(&s, "randwrite", NOMINAL), 8.0 / 6.0 / 8.0));
    }

    #[test]
    fn rows_without_an_ideal_and_the_fraction() {
        let a = array("raid6", 8, 8, 1, false);
        let mut q1 = wl("randread", None);
        q1.iodepth = 1;
        assert!(ideal(&a, &q1, NOMINAL, None).is_none());
        assert!(ideal(&a, &wl("read", None), "device-rebuild", None).is_none());
        assert!(ideal(
            &array("concat", 1, 2, 1, false),
            &wl("read", None),
            NOMINAL,
            None
        )
        .is_none());
        let i = ideal(&a, &wl("write", None), NOMINAL, Some(0.6)).unwrap();
        assert!(close(i.of_ideal.unwrap(), 0.8));
        assert_eq!(i.aim, Some(0.9));
    }
}
