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
//! * groups work in parallel; hot spares idle; a declustered layout's stripes and spare
//!   space are spread over every disk, so all of them work (random I/O); a stream passes
//!   the spare space in every row as it passes parity, so it moves the data disks' share.
//! * one disk down (`degraded`): see [`parity_costs`]; the group that lost the disk sets
//!   the pace of the others (the load is spread evenly over the groups).
//! * with [`Queueing`] (a client keeping a fixed number of random reads in flight, on
//!   disks whose command queueing serves more the deeper their queue, as an HDD's NCQ
//!   does), random reads are those of a closed queueing network ([`closed_ops`]): a disk
//!   with a larger share of the reads collects a deeper queue and serves it faster, so a
//!   mirror set left with one disk paces the others less than one disk's worth would, and
//!   a parity group's degraded reads (`k` disk reads each, sent at once) keep deeper
//!   queues than BASELINE's.

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

/// The estimate with one disk down (the lab's DEVICE DOWN), from the same counting.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Degraded {
    pub seq_read: Figure,
    pub seq_write: Figure,
    pub rand_read: Figure,
    pub rand_write: Figure,
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
    /// With one disk down; None without redundancy (raid0, concat).
    pub degraded: Option<Degraded>,
    /// The client's queue depth and the disks' queueing gain the random reads count, if
    /// given (see [`Queueing`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queueing: Option<Queueing>,
}

/// A closed client: `depth` random reads in flight, on disks that serve `q^gain` times as
/// many reads with `q` queued as with one (and `q` times as many below one: idle part of
/// the time). Reads then go where the queues are: a disk with a larger share of them
/// collects a deeper queue and serves faster.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Queueing {
    pub depth: f64,
    pub gain: f64,
    /// The disks' write caches are off: a write waits in the drive's queue as a read
    /// does, so a mirror's writes (each sent to every copy at once) count as reads do.
    /// With them on a drive takes writes at once and destages them in its own order,
    /// whatever the client's depth, and writes are counted open.
    pub writes_queue: bool,
}

impl Queueing {
    /// A 7200 rpm HDD with NCQ (shortest positioning time first): about 2.8 times its
    /// QD1 random reads at QD32 (`32^0.3`), the class's usual gain (about 80 IOPS at QD1,
    /// 200-250 at QD32), and what sbod's modelled nearline HDD gives (docs/PLANNER.md).
    pub const HDD_GAIN: f64 = 0.3;

    /// Reads a second of one disk with `q` queued, in units of its QD1 rate.
    fn rate(&self, q: f64) -> f64 {
        if q >= 1.0 {
            q.powf(self.gain)
        } else {
            q
        }
    }

    /// The queue a disk holds to serve `r` (in units of its QD1 rate).
    fn queue_for(&self, r: f64) -> f64 {
        if r >= 1.0 {
            r.powf(1.0 / self.gain)
        } else {
            r
        }
    }
}

/// Random reads a closed client of `q.depth` reads in flight gets from disks in `classes`
/// (how many disks, and the disk reads one client read costs each disk of the class on
/// average: its share of the reads, times the reads a rebuilt chunk takes where one is),
/// in disks' worth of BASELINE: `baseline` disks served alone, the same depth spread
/// evenly over them (over `depth` of them when fewer). Every disk serves its share at the
/// rate its queue gives, and the queues hold every disk read in flight, `depth` times the
/// disk reads a client read costs (a rebuilt chunk's `k` reads are sent at once): the
/// throughput is the one at which they do.
pub fn closed_ops(classes: &[(f64, f64)], q: Queueing, baseline: f64) -> f64 {
    let classes: Vec<(f64, f64)> = classes
        .iter()
        .copied()
        .filter(|c| c.0 > 0.0 && c.1 > 0.0)
        .collect();
    let in_flight = q.depth * classes.iter().map(|&(n, per)| n * per).sum::<f64>();
    let queued = |x: f64| -> f64 {
        classes
            .iter()
            .map(|&(n, per)| n * q.queue_for(x * per))
            .sum()
    };
    // The queues grow with the throughput: bisect for the one they fill the depth at.
    let (mut lo, mut hi) = (0.0, 1.0);
    while queued(hi) < in_flight {
        hi *= 2.0;
    }
    for _ in 0..200 {
        let mid = (lo + hi) / 2.0;
        if queued(mid) < in_flight {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let used = baseline.min(q.depth).max(1.0);
    (lo + hi) / 2.0 / q.rate(q.depth / used)
}

/// Disk operations (or, for streams, disk time per unit of data) one client I/O costs on
/// a pool of `n` disks holding stripes of `k` data and `m` parity chunks, with one disk down
/// when `down` (a chunk is on it with probability `1 / n`; docs/PLANNER.md, "Performance").
/// Returns (sequential, random read, random write).
fn parity_costs(k: f64, m: f64, n: f64, down: bool) -> (f64, f64, f64) {
    let p = if down { 1.0 / n } else { 0.0 };
    let q = if down { m / n } else { 0.0 };
    let seq = (k + m) / k * (1.0 - p);
    let read = 1.0 - p + p * k;
    let write = p * (k - 1.0 + m) + q * 2.0 * m + (1.0 - p - q) * 2.0 * (m + 1.0);
    (seq, read, write)
}

impl Performance {
    pub fn estimate(
        layout: &Layout,
        disk_mb_s: Option<f64>,
        disk_iops: Option<f64>,
    ) -> Performance {
        Self::estimate_queued(layout, disk_mb_s, disk_iops, None)
    }

    /// `estimate`, its random reads counted for a closed client on queueing disks when
    /// `queueing` is given (see [`Queueing`]); `disk_iops` is then the disk's random reads
    /// with the depth spread over the layout's disks.
    pub fn estimate_queued(
        layout: &Layout,
        disk_mb_s: Option<f64>,
        disk_iops: Option<f64>,
        queueing: Option<Queueing>,
    ) -> Performance {
        let disks = layout.disks as f64;
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
        // A declustered layout spreads its stripes (and its spare space) over every disk:
        // all of them work, not only `members`. Streams gain nothing from it: each row
        // holds a chunk of spare space, which a disk streaming its rows passes as it
        // passes parity, so a stream still moves `data` disks' worth (as hot spares idle).
        let spread = if layout.declustered {
            layout.disks as f64 / members
        } else {
            1.0
        };
        let rand_read = rand_read * spread;
        // Reads spread evenly over the disks that hold data: the same queue on each.
        let rand_read = match queueing {
            Some(q) => closed_ops(&[(rand_read, 1.0 / rand_read)], q, disks),
            None => rand_read,
        };
        let members = members * spread;
        let rand_write = match (queueing, layout.level) {
            // Each write goes to its set's `c` copies at once: `c / members` disk writes
            // a client write on each disk.
            (Some(q), Level::Raid1 | Level::Raid10) if q.writes_queue => {
                closed_ops(&[(members, penalty / members)], q, disks)
            }
            _ => members / penalty,
        };
        let fig = |disks: f64, per: Option<f64>| Figure {
            disks,
            value: per.map(|v| disks * v),
        };
        // One disk down. Classic groups share the load evenly, so the group that lost a
        // disk sets the pace of all (`sets x` its own); a declustered pool is one set.
        let degraded = match layout.level {
            Level::Raid0 | Level::Concat => None,
            Level::Raid1 | Level::Raid10 => {
                let c = layout.copies.unwrap_or(2) as f64;
                let sets = members / c;
                // The set left with c - 1 disks takes its share of the reads on c - 1 and
                // paces the others; a write goes to c - 1 copies there, as fast as to c.
                // A closed client's reads queue up there instead, where the disks serve
                // a deeper queue faster.
                let reads = match queueing {
                    Some(q) => closed_ops(
                        &[
                            (c - 1.0, 1.0 / (sets * (c - 1.0))),
                            (members - c, 1.0 / (sets * c)),
                        ],
                        q,
                        disks,
                    ),
                    None => sets * (c - 1.0),
                };
                // A write to a set goes to every disk it has left, one disk write each.
                let writes = match queueing {
                    Some(q) if q.writes_queue => closed_ops(
                        &[(c - 1.0, 1.0 / sets), (members - c, 1.0 / sets)],
                        q,
                        disks,
                    ),
                    _ => sets,
                };
                Some((sets * (c - 1.0), sets, reads, writes))
            }
            Level::Raid5 | Level::Raid6 | Level::Ec { .. } => {
                let w = layout.group_width as f64;
                let m = layout.set_tolerates as f64;
                let k = w - m;
                let (sets, n) = if layout.declustered {
                    (1.0, layout.disks as f64)
                } else {
                    (layout.groups as f64, w)
                };
                let (s0, r0, w0) = parity_costs(k, m, n, false);
                let (s1, r1, w1) = parity_costs(k, m, n, true);
                let pace = |nom: f64, down: f64| sets * (n / nom).min((n - 1.0) / down);
                // A closed client's reads: the degraded set's survivors each take `r1 / (n -
                // 1)` disk reads of its share of the client's, the other sets' disks `r0 /
                // n` of theirs.
                let reads = match queueing {
                    Some(q) => closed_ops(
                        &[
                            (n - 1.0, r1 / (sets * (n - 1.0))),
                            ((sets - 1.0) * n, r0 / (sets * n)),
                        ],
                        q,
                        disks,
                    ),
                    None => pace(r0, r1),
                };
                // Streams pass the spare space of every row (declustered; 1 otherwise).
                let passed = n * sets / (layout.groups as f64 * w);
                let seq = pace(s0, s1) / passed;
                Some((seq, seq, reads, pace(w0, w1)))
            }
        }
        .map(|(sr, sw, rr, rw)| Degraded {
            seq_read: fig(sr, disk_mb_s),
            seq_write: fig(sw, disk_mb_s),
            rand_read: fig(rr, disk_iops),
            rand_write: fig(rw, disk_iops),
        });
        Performance {
            kind: "estimate",
            disk_mb_s,
            disk_iops,
            write_penalty: penalty,
            seq_read: fig(seq_read, disk_mb_s),
            seq_write: fig(seq_write, disk_mb_s),
            rand_read: fig(rand_read, disk_iops),
            rand_write: fig(rand_write, disk_iops),
            degraded,
            queueing,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::LayoutSpec;

    fn perf(spec: &str, disks: u32) -> Performance {
        let s: LayoutSpec = spec.parse().unwrap();
        Performance::estimate(&Layout::resolve(&s, disks).unwrap(), None, None)
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn one_disk_down_by_hand() {
        // raid6 of 8: streams keep 6 disks' worth; a 4K read costs 1 - 1/8 + 6/8 = 13/8
        // on 7 disks; a write 1/8 x 7 + 2/8 x 4 + 5/8 x 6 = 45/8 on 7.
        let d = perf("raid6:1x8", 8).degraded.unwrap();
        assert!(close(d.seq_read.disks, 6.0));
        assert!(close(d.seq_write.disks, 6.0));
        assert!(close(d.rand_read.disks, 7.0 / (13.0 / 8.0)));
        assert!(close(d.rand_write.disks, 7.0 / (45.0 / 8.0)));
        // raid5 of 8: reads 7 / (7/8 + 7/8) = 4.
        let d = perf("raid5:1x8", 8).degraded.unwrap();
        assert!(close(d.rand_read.disks, 4.0));
        // raid10, 4 sets of 2: the set with one disk paces the others.
        let p = perf("raid10:4x2", 8);
        let d = p.degraded.unwrap();
        assert!(close(d.rand_read.disks, 4.0));
        assert!(close(d.rand_write.disks, 4.0));
        assert!(close(d.seq_write.disks, p.seq_write.disks));
        assert!(perf("raid0", 8).degraded.is_none());
    }

    #[test]
    fn closed_ops_by_hand() {
        let q = Queueing {
            depth: 32.0,
            gain: 0.3,
            writes_queue: false,
        };
        // Even shares: as many disks' worth as disks serve, whatever the gain.
        assert!((closed_ops(&[(8.0, 1.0 / 8.0)], q, 8.0) - 8.0).abs() < 1e-6);
        // 6 of 8 disks (2 spares idle): each holds 32/6 instead of 4, and serves
        // (4/3)^0.3 as fast.
        let six = closed_ops(&[(6.0, 1.0 / 6.0)], q, 8.0);
        assert!((six - 6.0 * (8.0f64 / 6.0).powf(0.3)).abs() < 1e-6, "{six}");
        // Without a gain it is the open count: the busiest disk paces all.
        let flat = Queueing { gain: 1e-9, ..q };
        let r = closed_ops(&[(1.0, 0.25), (6.0, 0.125)], flat, 8.0);
        assert!((r - 4.0).abs() < 0.01, "{r}");
    }

    #[test]
    fn a_closed_client_on_a_degraded_mirror() {
        let s: LayoutSpec = "raid10:4x2".parse().unwrap();
        let l = Layout::resolve(&s, 8).unwrap();
        let q = Queueing {
            depth: 32.0,
            gain: Queueing::HDD_GAIN,
            writes_queue: false,
        };
        let p = Performance::estimate_queued(&l, None, None, Some(q));
        // Nominal: even, as without queueing.
        assert!((p.rand_read.disks - 8.0).abs() < 1e-6);
        // The set left with one disk serves a quarter of the reads; its queue grows until
        // it keeps up: (1/4^(1/g) + 6/8^(1/g))^-g against 8 (32/8)^g... about 6.5 disks'
        // worth, where the open count gives 4 (the lab measured 0.78 of BASELINE).
        let d = p.degraded.unwrap().rand_read.disks;
        let g = Queueing::HDD_GAIN;
        let x = (32.0 / (0.25f64.powf(1.0 / g) + 6.0 * 0.125f64.powf(1.0 / g))).powf(g);
        assert!((d - x / 4.0f64.powf(g)).abs() < 1e-6, "{d}");
        assert!(d > 6.0 && d < 7.0, "{d}");
        // raid5 of 8 with a disk down: a read costs 7/8 + 7/8 disk reads, on 7 disks: 56
        // reads in flight, 8 a disk where BASELINE holds 4, so each serves 2^g faster
        // than the open count's 4 disks' worth (the lab measured 0.63 of BASELINE).
        let s: LayoutSpec = "raid5:1x8".parse().unwrap();
        let r5 =
            Performance::estimate_queued(&Layout::resolve(&s, 8).unwrap(), None, None, Some(q));
        let d5 = r5.degraded.unwrap().rand_read.disks;
        assert!((d5 - 4.0 * 2.0f64.powf(g)).abs() < 1e-6, "{d5}");
        // Writes and streams as without.
        let o = perf("raid10:4x2", 8);
        assert_eq!(p.rand_write, o.rand_write);
        assert_eq!(p.seq_read, o.seq_read);
        // With the write caches off a mirror's writes queue as reads do: each is two disk
        // writes sent at once, 64 in flight on 8 disks (8 each against BASELINE's 4):
        // 4 x 2^g; with a disk down 56 on 7, the same 8 each, as every disk left takes a
        // write of each quarter.
        let w = Performance::estimate_queued(
            &l,
            None,
            None,
            Some(Queueing {
                writes_queue: true,
                ..q
            }),
        );
        assert!((w.rand_write.disks - 4.0 * 2.0f64.powf(g)).abs() < 1e-6);
        let dw = w.degraded.unwrap().rand_write.disks;
        assert!((dw - 4.0 * 2.0f64.powf(g)).abs() < 1e-6, "{dw}");
        // Parity's read-modify-write stays counted open.
        let r6 = Performance::estimate_queued(
            &Layout::resolve(&"raid6:1x8".parse().unwrap(), 8).unwrap(),
            None,
            None,
            Some(Queueing {
                writes_queue: true,
                ..q
            }),
        );
        assert_eq!(r6.rand_write, perf("raid6:1x8", 8).rand_write);
    }

    #[test]
    fn groups_pace_and_declustered_spread() {
        // Two groups of raid6 4+2: the degraded group gives 5 / (1 - 1/6 + 4/6) disks'
        // worth of reads, and the other waits for it.
        let d = perf("raid6:2x6", 12).degraded.unwrap();
        assert!(close(d.rand_read.disks, 2.0 * 5.0 / 1.5));
        // Declustered over 14 (two spares' worth): every disk works, nominal and down;
        // streams pass the spare space of every row: 8 data chunks of 14 a row.
        let p = perf("raid6:2x6:s2:d", 14);
        assert!(close(p.seq_read.disks, 8.0));
        assert!(close(p.seq_write.disks, 8.0));
        assert!(close(p.degraded.as_ref().unwrap().seq_read.disks, 8.0));
        // Without spare space, as the classic layout: 6 of 8.
        assert!(close(perf("raid6:1x8:d", 8).seq_read.disks, 6.0));
        assert!(close(perf("raid6:1x8:d", 8).rand_read.disks, 8.0));
        assert!(close(p.rand_read.disks, 14.0));
        let d = p.degraded.unwrap();
        assert!(close(
            d.rand_read.disks,
            13.0 / (1.0 - 1.0 / 14.0 + 4.0 / 14.0)
        ));
        assert!(d.rand_read.disks > perf("raid6:2x6:s2", 14).degraded.unwrap().rand_read.disks);
    }

    #[test]
    fn down_is_never_faster_than_nominal() {
        for (s, n) in [
            ("raid5:1x4", 4),
            ("raid6:3x8", 24),
            ("ec:8+3:5x11:s5", 60),
            ("raid10:1x60:c3", 60),
            ("raid6:2x10:s4:d", 24),
        ] {
            let p = perf(s, n);
            let d = p.degraded.unwrap();
            for (a, b) in [
                (d.seq_read, p.seq_read),
                (d.seq_write, p.seq_write),
                (d.rand_read, p.rand_read),
                (d.rand_write, p.rand_write),
            ] {
                assert!(a.disks <= b.disks + 1e-9 && a.disks > 0.0, "{s}");
            }
        }
    }
}
