//! The placement map: where every byte of the volume lives on the members, and back.
//!
//! This is the one place that knows the layout. The data path splits requests with
//! [`Placement::map`], a RAID family finds the members of a stripe with
//! [`Placement::slot`], rebuild and scrub ask which shard a slot holds in a stripe
//! ([`Placement::shard_at`]), and scrub reports map member space back to the volume with
//! [`Placement::volume_offset`]. Nothing else computes a slot from a group and a position:
//! a new layout (a distributed spare, as ZFS dRAID has) is a new map here.
//!
//! **Striped layouts** (raid0, raid1/10, raid5/6, ec): the volume is striped over `groups`
//! equal redundancy groups of `width` slots each (group `g` holds slots `g*width ..
//! (g+1)*width`). Logical stripe `s` (of `k * chunk` data bytes) lives in group
//! `s % groups`, as that group's stripe `t = s / groups`, at member offset `t * chunk` on
//! every member of the group. Within a parity group, parity rotates as Linux md's
//! left-symmetric layout does: stripe `t` puts parity row `r` on position `(p0 + r) % n`
//! with `p0 = n - 1 - t % n`, and data chunk `i` on position `(p0 + m + i) % n`. For raid5
//! and raid6 this is exactly md's `ALGORITHM_LEFT_SYMMETRIC`. Mirrors keep the chunk on
//! every position; raid0 puts data chunk `i` on position `i`.
//!
//! **Concat**: members appended end to end. Each slot is a "group" of one member and its
//! chunks are that group's stripes, so the unit a writer and a replacement's copy lock is
//! the same `(group, stripe)` as everywhere else.
//!
//! Shards are numbered in codec order: data `0..k`, then parity `k..k+m`. Mirrors and
//! concat have one shard per position (a mirror's copies are shards `0..copies`).

use crate::layout::{Geometry, Level, Scheme};
use std::ops::Range;

/// A stripe: the unit every member of a group holds one chunk of, locked as one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StripeAddr {
    pub group: usize,
    /// The stripe within its group.
    pub stripe: u64,
}

/// One piece of a volume range that lies within one data chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    /// Offset of the piece in the caller's range.
    pub buf_off: u64,
    pub len: u64,
    pub addr: StripeAddr,
    /// Data shard within the stripe (`0..k`; 0 for mirrors and concat).
    pub index: usize,
    /// Offset within the chunk.
    pub chunk_off: u64,
    /// The slot holding the data (a mirror's: the group's first copy).
    pub slot: usize,
    /// Member offset of the piece (from the start of the members' data area).
    pub moff: u64,
}

/// The map of one array.
#[derive(Clone, Debug)]
pub struct Placement {
    level: Level,
    scheme: Scheme,
    groups: usize,
    width: usize,
    chunk: u64,
    k: usize,
    /// Slots between the starts of two groups: the width, except in the old layout of a
    /// reshape that widens its groups, whose slots are numbered as the new layout's (group
    /// `g`'s old members keep their slots `g * stride ..`, the new ones follow them).
    stride: usize,
    /// Parity shards on dedicated slots (the geometry's `dedicated`): the last
    /// `dedicated` parity shards sit on the group's last `dedicated` slots, the rest of
    /// the stripe rotates over the slots before them.
    dedicated: usize,
    /// Concat: where each slot starts in the volume, and the volume's end.
    starts: Vec<u64>,
}

impl Placement {
    /// The map for `geometry`; `slot_sizes` are the data bytes of each slot (they differ
    /// only for concat, which appends them).
    pub fn new(geometry: &Geometry, slot_sizes: &[u64]) -> Placement {
        let mut starts = Vec::new();
        if geometry.level == Level::Concat {
            let mut pos = 0;
            for s in slot_sizes {
                starts.push(pos);
                pos += s;
            }
            starts.push(pos);
        }
        Placement {
            level: geometry.level,
            scheme: geometry.scheme(),
            groups: geometry.groups as usize,
            width: geometry.width as usize,
            chunk: geometry.chunk as u64,
            k: geometry.k(),
            stride: geometry.width as usize,
            dedicated: geometry.dedicated as usize,
            starts,
        }
    }

    /// The map of a striped layout whose slots are numbered with `stride` slots per group
    /// (the old layout of a reshape that widens groups: see the field).
    pub fn with_stride(geometry: &Geometry, slot_sizes: &[u64], stride: usize) -> Placement {
        assert!(stride >= geometry.width as usize);
        Placement {
            stride,
            ..Placement::new(geometry, slot_sizes)
        }
    }

    /// The map of a striped layout, for tools and tests that have only a geometry.
    pub fn striped(geometry: &Geometry) -> Placement {
        assert!(
            geometry.level != Level::Concat,
            "concat needs its slot sizes"
        );
        Placement::new(geometry, &[])
    }

    pub fn is_concat(&self) -> bool {
        self.level == Level::Concat
    }

    /// Bytes of the volume.
    pub fn volume_size(&self, geometry: &Geometry) -> u64 {
        match self.starts.last() {
            Some(&end) => end,
            None => geometry.capacity(),
        }
    }

    /// Groups: the unit a stripe spans and is locked in (redundancy groups; concat's
    /// slots, each its own).
    pub fn groups(&self) -> usize {
        if self.is_concat() {
            self.starts.len() - 1
        } else {
            self.groups
        }
    }

    /// Redundancy sets: the slots that survive failures together (a redundancy group; all
    /// of concat, which has no redundancy). Membership rules (how many may be out, how
    /// many may share a failure domain) count within a set.
    pub fn sets(&self) -> usize {
        if self.is_concat() {
            1
        } else {
            self.groups
        }
    }

    /// The slots of a redundancy set.
    pub fn set_slots(&self, set: usize) -> Range<usize> {
        if self.is_concat() {
            0..self.starts.len() - 1
        } else {
            self.group_slots(set)
        }
    }

    /// The redundancy set of a slot.
    pub fn set_of(&self, slot: usize) -> usize {
        if self.is_concat() {
            0
        } else {
            slot / self.stride
        }
    }

    /// The slots of a group.
    pub fn group_slots(&self, group: usize) -> Range<usize> {
        if self.is_concat() {
            group..group + 1
        } else {
            group * self.stride..group * self.stride + self.width
        }
    }

    /// The group a slot belongs to.
    pub fn group_of(&self, slot: usize) -> usize {
        if self.is_concat() {
            slot
        } else {
            slot / self.stride
        }
    }

    /// Data chunks per stripe.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Member offset where a stripe's chunks start (the same on every member of its group).
    pub fn stripe_offset(&self, stripe: u64) -> u64 {
        stripe * self.chunk
    }

    /// The stripe holding member offset `moff`.
    pub fn stripe_at(&self, moff: u64) -> u64 {
        moff / self.chunk
    }

    /// Position within its group of the slot holding `shard` of stripe `stripe`.
    fn position(&self, stripe: u64, shard: usize) -> usize {
        match self.scheme {
            Scheme::Parity { m: 0, .. } | Scheme::Mirror { .. } | Scheme::Concat => shard,
            Scheme::Parity { k, m } => {
                // Dedicated parity: the last shards on the last slots; the rest rotate
                // over the slots before them as the layout did before they were added.
                let (n, m) = (self.width - self.dedicated, m - self.dedicated);
                if shard >= k + m {
                    return n + (shard - k - m);
                }
                if m == 0 {
                    return shard;
                }
                let n = n as u64;
                let p0 = n - 1 - stripe % n;
                let rel = if shard < k { m + shard } else { shard - k };
                ((p0 + rel as u64) % n) as usize
            }
        }
    }

    /// A mirror group's slots in the order a read tries them: from a copy chosen by the
    /// stripe, so that reads spread over the copies.
    pub fn copies_from(&self, addr: StripeAddr) -> impl Iterator<Item = usize> {
        let slots = self.group_slots(addr.group);
        let w = slots.len();
        (0..w).map(move |i| slots.start + (i + addr.stripe as usize) % w)
    }

    /// The slot holding `shard` of a stripe.
    pub fn slot(&self, addr: StripeAddr, shard: usize) -> usize {
        self.group_slots(addr.group).start + self.position(addr.stripe, shard)
    }

    /// The shard slot `slot` holds in a stripe of its group (inverse of [`Placement::slot`]).
    pub fn shard_at(&self, stripe: u64, slot: usize) -> usize {
        let pos = slot - self.group_slots(self.group_of(slot)).start;
        match self.scheme {
            Scheme::Parity { k, m } if m > 0 => {
                let (n, m) = (self.width - self.dedicated, m - self.dedicated);
                if pos >= n {
                    return k + m + (pos - n);
                }
                if m == 0 {
                    return pos;
                }
                let n = n as u64;
                let p0 = n - 1 - stripe % n;
                let rel = ((pos as u64 + n - p0) % n) as usize;
                if rel < m {
                    k + rel
                } else {
                    rel - m
                }
            }
            _ => pos,
        }
    }

    /// Split a volume range into pieces of one data chunk each, in address order.
    pub fn map(&self, offset: u64, len: u64) -> Vec<Extent> {
        let chunk = self.chunk;
        let mut out = Vec::new();
        let mut pos = offset;
        let end = offset + len;
        while pos < end {
            let piece = if self.is_concat() {
                let slot = self.starts.partition_point(|&s| s <= pos) - 1;
                let within = pos - self.starts[slot];
                let chunk_off = within % chunk;
                let n = (self.starts[slot + 1] - pos)
                    .min(end - pos)
                    .min(chunk - chunk_off);
                Extent {
                    buf_off: pos - offset,
                    len: n,
                    addr: StripeAddr {
                        group: slot,
                        stripe: within / chunk,
                    },
                    index: 0,
                    chunk_off,
                    slot,
                    moff: within,
                }
            } else {
                let sd = self.k as u64 * chunk;
                let s = pos / sd;
                let within = pos % sd;
                let index = (within / chunk) as usize;
                let chunk_off = within % chunk;
                let n = (chunk - chunk_off).min(end - pos);
                let addr = StripeAddr {
                    group: (s % self.groups as u64) as usize,
                    stripe: s / self.groups as u64,
                };
                Extent {
                    buf_off: pos - offset,
                    len: n,
                    addr,
                    index,
                    chunk_off,
                    slot: self.slot(addr, index),
                    moff: self.stripe_offset(addr.stripe) + chunk_off,
                }
            };
            pos += piece.len;
            out.push(piece);
        }
        out
    }

    /// Back from a stripe to the volume: where data shard `index` of `addr` starts.
    pub fn volume_offset(&self, addr: StripeAddr, index: usize) -> u64 {
        if self.is_concat() {
            return self.starts[addr.group] + self.stripe_offset(addr.stripe);
        }
        let sd = self.k as u64 * self.chunk;
        (addr.stripe * self.groups as u64 + addr.group as u64) * sd + index as u64 * self.chunk
    }

    /// Back from a member to the volume: the volume offset of the data at member offset
    /// `moff` of `slot`, or None where the slot holds parity there.
    pub fn locate(&self, slot: usize, moff: u64) -> Option<u64> {
        let stripe = self.stripe_at(moff);
        // Every copy of a mirror holds the data.
        let index = match self.scheme {
            Scheme::Mirror { .. } => 0,
            _ => self.shard_at(stripe, slot),
        };
        if index >= self.k {
            return None;
        }
        let addr = StripeAddr {
            group: self.group_of(slot),
            stripe,
        };
        Some(self.volume_offset(addr, index) + moff % self.chunk)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geo(level: Level, width: u32, groups: u32) -> Geometry {
        Geometry {
            level,
            groups,
            width,
            chunk: 4096,
            member_size: 4096 * 64,
            data_offset: 1 << 20,
            dedicated: 0,
        }
    }

    /// md's raid5 left-symmetric table for 4 disks (from raid5.c's algorithm):
    /// stripe 0: D0 D1 D2 P ; stripe 1: D1 D2 P D0 ; stripe 2: D2 P D0 D1 ; stripe 3: P D0 D1 D2
    #[test]
    fn raid5_left_symmetric_matches_md() {
        let p = Placement::striped(&geo(Level::Raid5, 4, 1));
        let table = [[0, 1, 2, 9], [1, 2, 9, 0], [2, 9, 0, 1], [9, 0, 1, 2]];
        for (t, row) in table.iter().enumerate() {
            for (slot, &want) in row.iter().enumerate() {
                let shard = p.shard_at(t as u64, slot);
                let got = if shard == 3 { 9 } else { shard };
                assert_eq!(got, want, "stripe {t} slot {slot}");
            }
        }
    }

    /// md raid6 left-symmetric, 5 disks (raid5.c: pd = n-1 - t%n, qd = pd+1, data from pd+2):
    /// stripe 0 = Q D0 D1 D2 P, stripe 1 = D0 D1 D2 P Q, ...
    #[test]
    fn raid6_left_symmetric_matches_md() {
        let p = Placement::striped(&geo(Level::Raid6, 5, 1));
        // P = 8, Q = 9
        let table = [
            [9, 0, 1, 2, 8],
            [0, 1, 2, 8, 9],
            [1, 2, 8, 9, 0],
            [2, 8, 9, 0, 1],
            [8, 9, 0, 1, 2],
        ];
        for (t, row) in table.iter().enumerate() {
            for (slot, &want) in row.iter().enumerate() {
                let got = match p.shard_at(t as u64, slot) {
                    3 => 8,
                    4 => 9,
                    s => s,
                };
                assert_eq!(got, want, "stripe {t} slot {slot}");
            }
        }
    }

    #[test]
    fn slots_and_shards_are_inverse_in_every_group() {
        for level in [
            Level::Raid5,
            Level::Raid6,
            Level::Ec { k: 5, m: 3 },
            Level::Raid0,
            Level::Raid10,
        ] {
            let w = match level {
                Level::Ec { k, m } => (k + m) as u32,
                _ => 8,
            };
            let p = Placement::striped(&geo(level, w, 3));
            for group in 0..3 {
                for stripe in 0..20 {
                    let addr = StripeAddr { group, stripe };
                    for shard in 0..w as usize {
                        let slot = p.slot(addr, shard);
                        assert!(p.group_slots(group).contains(&slot));
                        assert_eq!(p.group_of(slot), group);
                        assert_eq!(p.shard_at(stripe, slot), shard, "{level} {addr:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn map_covers_the_range_and_maps_back() {
        let g = geo(Level::Raid6, 6, 3);
        let p = Placement::striped(&g);
        let pieces = p.map(4096 * 5 + 512, 4096 * 20);
        assert_eq!(pieces.iter().map(|x| x.len).sum::<u64>(), 4096 * 20);
        assert_eq!(pieces[0].chunk_off, 512);
        // stripe data = 4 chunks; logical chunk 5 = stripe 1 -> group 1, group stripe 0, index 1
        let a = pieces[0].addr;
        assert_eq!((a.group, a.stripe, pieces[0].index), (1, 0, 1));
        for x in &pieces {
            let back = p.locate(x.slot, x.moff).expect("data");
            assert_eq!(back, 4096 * 5 + 512 + x.buf_off, "{x:?}");
        }
        // Parity is not volume data.
        let parity = p.slot(
            StripeAddr {
                group: 0,
                stripe: 0,
            },
            4,
        );
        assert_eq!(p.locate(parity, 0), None);
    }

    #[test]
    fn every_volume_block_maps_to_one_member_block_and_back() {
        for (level, w, groups) in [
            (Level::Raid0, 3, 1),
            (Level::Raid5, 4, 2),
            (Level::Raid6, 6, 2),
            (Level::Ec { k: 3, m: 2 }, 5, 1),
            (Level::Raid10, 2, 3),
        ] {
            let g = geo(level, w, groups);
            let p = Placement::striped(&g);
            let mut seen = std::collections::HashSet::new();
            for x in p.map(0, g.capacity()) {
                for b in (0..x.len).step_by(4096) {
                    assert!(
                        seen.insert((x.slot, x.moff + b)),
                        "{level}: two blocks at once"
                    );
                    assert_eq!(p.locate(x.slot, x.moff + b), Some(x.buf_off + b));
                }
            }
            assert_eq!(seen.len() as u64, g.capacity() / 4096);
        }
        // Every copy of a mirror maps back to the same data.
        let p = Placement::striped(&geo(Level::Raid10, 3, 2));
        let x = p.map(4096 * 3, 4096)[0];
        for slot in p.group_slots(x.addr.group) {
            assert_eq!(p.locate(slot, x.moff), Some(4096 * 3));
        }
    }

    #[test]
    fn concat_appends_members_and_locks_per_member_chunk() {
        let g = Geometry {
            level: Level::Concat,
            groups: 1,
            width: 3,
            chunk: 4096,
            member_size: 4096 * 8,
            data_offset: 1 << 20,
            dedicated: 0,
        };
        let p = Placement::new(&g, &[4096 * 2, 4096 * 8, 4096 * 3]);
        assert_eq!(p.volume_size(&g), 4096 * 13);
        assert_eq!(p.groups(), 3);
        let x = p.map(4096, 4096 * 3);
        assert_eq!(x.len(), 3);
        assert_eq!((x[0].slot, x[0].moff), (0, 4096));
        assert_eq!((x[1].slot, x[1].moff, x[1].addr.stripe), (1, 0, 0));
        assert_eq!((x[2].slot, x[2].moff, x[2].addr.stripe), (1, 4096, 1));
        assert_eq!(p.locate(2, 4096), Some(4096 * 11));
    }

    /// A level change that adds parity keeps every shard of the old layout where it was
    /// and puts the new parity on the added slot of each group.
    #[test]
    fn dedicated_parity_keeps_the_old_layout_in_place() {
        for (old, new) in [
            (Level::Raid5, Level::Raid6),
            (Level::Raid0, Level::Raid5),
            (Level::Ec { k: 4, m: 2 }, Level::Ec { k: 4, m: 3 }),
        ] {
            let w = match old {
                Level::Ec { k, m } => (k + m) as u32,
                _ => 5,
            };
            let before = Placement::with_stride(&geo(old, w, 3), &[], w as usize + 1);
            let g = Geometry {
                dedicated: 1,
                ..geo(new, w + 1, 3)
            };
            g.validate().unwrap();
            let after = Placement::striped(&g);
            for group in 0..3 {
                for stripe in 0..40 {
                    let addr = StripeAddr { group, stripe };
                    let old_shards = w as usize;
                    for shard in 0..old_shards {
                        assert_eq!(before.slot(addr, shard), after.slot(addr, shard), "{new}");
                    }
                    let added = after.slot(addr, old_shards);
                    assert_eq!(added, group * (w as usize + 1) + w as usize);
                    for slot in after.group_slots(group) {
                        assert_eq!(after.slot(addr, after.shard_at(stripe, slot)), slot);
                    }
                }
            }
            assert_eq!(
                after.map(0, g.capacity()).len(),
                before.map(0, g.capacity()).len()
            );
        }
    }
}
