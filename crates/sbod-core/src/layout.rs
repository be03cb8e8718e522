//! Geometry and address mapping: where each logical byte lives.
//!
//! The volume is striped over `groups` equal redundancy groups. Logical stripe `s` (of
//! `k * chunk` data bytes) lives in group `s % groups`, as that group's stripe `t = s /
//! groups`, at member offset `t * chunk` on every member of the group. Within a parity
//! group, parity rotates as Linux md's left-symmetric layout does: stripe `t` puts parity
//! row `r` on member `(p0 + r) % n` with `p0 = n - 1 - t % n`, and data chunk `i` on member
//! `(p0 + m + i) % n`. For raid5 and raid6 this is exactly md's `ALGORITHM_LEFT_SYMMETRIC`.

use serde::{Deserialize, Serialize};

pub use sbod_types::Level;

/// How one group keeps its data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    /// `k` data chunks and `m` parity chunks per stripe (m = 0: plain striping).
    Parity { k: usize, m: usize },
    /// Every member holds the same data.
    Mirror { copies: usize },
    /// Members appended end to end.
    Concat,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Geometry {
    pub level: Level,
    /// Redundancy groups the volume is striped over.
    pub groups: u32,
    /// Members per group.
    pub width: u32,
    /// Chunk (stripe unit) in bytes.
    pub chunk: u32,
    /// Data bytes used on every member (concat: the largest member's; see `member_sizes`).
    pub member_size: u64,
    /// Where data starts on each member.
    pub data_offset: u64,
}

impl Geometry {
    pub fn members(&self) -> usize {
        self.groups as usize * self.width as usize
    }

    pub fn scheme(&self) -> Scheme {
        let n = self.width as usize;
        match self.level {
            Level::Raid0 => Scheme::Parity { k: n, m: 0 },
            Level::Raid1 | Level::Raid10 => Scheme::Mirror { copies: n },
            Level::Raid5 => Scheme::Parity { k: n - 1, m: 1 },
            Level::Raid6 => Scheme::Parity { k: n - 2, m: 2 },
            Level::Ec { k, m } => Scheme::Parity {
                k: k as usize,
                m: m as usize,
            },
            Level::Concat => Scheme::Concat,
        }
    }

    /// Data chunks per group stripe.
    pub fn k(&self) -> usize {
        match self.scheme() {
            Scheme::Parity { k, .. } => k,
            Scheme::Mirror { .. } => 1,
            Scheme::Concat => self.width as usize,
        }
    }

    /// Member failures each group survives.
    pub fn redundancy(&self) -> usize {
        match self.scheme() {
            Scheme::Parity { m, .. } => m,
            Scheme::Mirror { copies } => copies - 1,
            Scheme::Concat => 0,
        }
    }

    /// The codec for parity groups (None for m = 0, mirrors, concat).
    pub fn codec_scheme(&self) -> Option<sbod_codec::Scheme> {
        let k = self.k();
        match self.level {
            Level::Raid5 => Some(sbod_codec::Scheme::Xor { k }),
            Level::Raid6 => Some(sbod_codec::Scheme::PQ { k }),
            Level::Ec { k, m } => Some(sbod_codec::Scheme::Cauchy {
                k: k as usize,
                m: m as usize,
            }),
            _ => None,
        }
    }

    /// Stripes per group.
    pub fn stripes(&self) -> u64 {
        self.member_size / self.chunk as u64
    }

    /// Bytes of data in one group stripe.
    pub fn stripe_data(&self) -> u64 {
        self.k() as u64 * self.chunk as u64
    }

    /// Usable bytes of the volume (concat: see `Array::size`).
    pub fn capacity(&self) -> u64 {
        self.groups as u64 * self.stripes() * self.stripe_data()
    }

    /// Check the geometry is one sbod can run; the message says what would work.
    pub fn validate(&self) -> Result<(), String> {
        let n = self.width as usize;
        if self.groups == 0 || self.width == 0 {
            return Err("an array needs at least one member".into());
        }
        if self.width > 256 {
            return Err("at most 256 members per group".into());
        }
        if self.groups > 4096 {
            return Err("at most 4096 groups".into());
        }

        if !self.chunk.is_power_of_two() || self.chunk < 4096 || self.chunk > 16 << 20 {
            return Err(format!(
                "chunk {} is not supported: use a power of two from 4K to 16M (64K is a good default)",
                self.chunk
            ));
        }
        let min = match self.level {
            Level::Raid0 | Level::Concat => 1,
            Level::Raid1 | Level::Raid10 => 2,
            Level::Raid5 => 3,
            Level::Raid6 => 4,
            Level::Ec { k, m } => {
                if n != (k + m) as usize {
                    return Err(format!(
                        "{} needs groups of exactly {} members, not {n}",
                        self.level,
                        k + m
                    ));
                }
                (k + m) as usize
            }
        };
        if n < min {
            return Err(format!(
                "{} needs at least {min} members per group, this layout gives {n}",
                self.level
            ));
        }
        if matches!(self.level, Level::Raid6) && n - 2 > 255 {
            return Err("raid6 groups hold at most 257 members".into());
        }
        if n > 256 {
            return Err("at most 256 members per group".into());
        }
        if !self.member_size.is_multiple_of(self.chunk as u64) {
            return Err("member data size must be a multiple of the chunk".into());
        }
        if self.member_size == 0 {
            return Err("members are too small to hold one chunk of data".into());
        }
        let total = self.member_size as u128 * self.members() as u128;
        if self.member_size > 1 << 60 || self.data_offset > 1 << 40 || total > (1u128 << 63) {
            return Err("sizes out of range".into());
        }
        Ok(())
    }
}

/// One piece of a logical range that lies in one chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkPiece {
    /// Offset of the piece in the caller's range.
    pub buf_off: u64,
    pub len: u64,
    pub group: usize,
    /// Group stripe.
    pub stripe: u64,
    /// Data index within the stripe (0..k).
    pub index: usize,
    /// Offset within the chunk.
    pub chunk_off: u64,
}

impl Geometry {
    /// Split a logical range into chunk pieces, in address order (parity and mirror layouts).
    pub fn pieces(&self, offset: u64, len: u64) -> Vec<ChunkPiece> {
        let chunk = self.chunk as u64;
        let sd = self.stripe_data();
        let g = self.groups as u64;
        let mut out = Vec::new();
        let mut pos = offset;
        let end = offset + len;
        while pos < end {
            let s = pos / sd;
            let within = pos % sd;
            let index = (within / chunk) as usize;
            let chunk_off = within % chunk;
            let n = (chunk - chunk_off).min(end - pos);
            out.push(ChunkPiece {
                buf_off: pos - offset,
                len: n,
                group: (s % g) as usize,
                stripe: s / g,
                index,
                chunk_off,
            });
            pos += n;
        }
        out
    }

    /// The member (position within its group, 0..width) holding data chunk `index` of
    /// group stripe `stripe`.
    pub fn data_member(&self, stripe: u64, index: usize) -> usize {
        match self.scheme() {
            Scheme::Parity { m: 0, .. } => index,
            Scheme::Parity { m, .. } => {
                let n = self.width as u64;
                let p0 = n - 1 - stripe % n;
                ((p0 + m as u64 + index as u64) % n) as usize
            }
            Scheme::Mirror { .. } => 0,
            Scheme::Concat => index,
        }
    }

    /// The member holding parity row `r` of group stripe `stripe`.
    pub fn parity_member(&self, stripe: u64, r: usize) -> usize {
        let n = self.width as u64;
        let p0 = n - 1 - stripe % n;
        ((p0 + r as u64) % n) as usize
    }

    /// For each member position of a group, its role in stripe `stripe`: shard index in
    /// codec order (data 0..k, then parity k..k+m).
    pub fn shard_of_member(&self, stripe: u64, member: usize) -> usize {
        match self.scheme() {
            Scheme::Parity { k, m } => {
                if m == 0 {
                    return member;
                }
                let n = self.width as u64;
                let p0 = n - 1 - stripe % n;
                let rel = ((member as u64 + n - p0) % n) as usize;
                if rel < m {
                    k + rel
                } else {
                    rel - m
                }
            }
            _ => member,
        }
    }

    /// Inverse of `shard_of_member`: member position of shard `shard` in stripe `stripe`.
    pub fn member_of_shard(&self, stripe: u64, shard: usize) -> usize {
        match self.scheme() {
            Scheme::Parity { k, .. } => {
                if shard < k {
                    self.data_member(stripe, shard)
                } else {
                    self.parity_member(stripe, shard - k)
                }
            }
            _ => shard,
        }
    }
}

pub use sbod_types::size::{human, parse_size};

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
        }
    }

    /// md's raid5 left-symmetric table for 4 disks (from raid5.c's algorithm):
    /// stripe 0: D0 D1 D2 P ; stripe 1: D1 D2 P D0 ; stripe 2: D2 P D0 D1 ; stripe 3: P D0 D1 D2
    #[test]
    fn raid5_left_symmetric_matches_md() {
        let g = geo(Level::Raid5, 4, 1);
        let table = [[0, 1, 2, 9], [1, 2, 9, 0], [2, 9, 0, 1], [9, 0, 1, 2]];
        for (t, row) in table.iter().enumerate() {
            for (member, &want) in row.iter().enumerate() {
                let shard = g.shard_of_member(t as u64, member);
                let got = if shard == 3 { 9 } else { shard };
                assert_eq!(got, want, "stripe {t} member {member}");
            }
        }
    }

    /// md raid6 left-symmetric, 5 disks (raid5.c: pd = n-1 - t%n, qd = pd+1, data from pd+2):
    /// stripe 0 = Q D0 D1 D2 P, stripe 1 = D0 D1 D2 P Q, ...
    #[test]
    fn raid6_left_symmetric_matches_md() {
        let g = geo(Level::Raid6, 5, 1);
        // P = 8, Q = 9
        let table = [
            [9, 0, 1, 2, 8],
            [0, 1, 2, 8, 9],
            [1, 2, 8, 9, 0],
            [2, 8, 9, 0, 1],
            [8, 9, 0, 1, 2],
        ];
        for (t, row) in table.iter().enumerate() {
            for (member, &want) in row.iter().enumerate() {
                let shard = g.shard_of_member(t as u64, member);
                let got = match shard {
                    3 => 8,
                    4 => 9,
                    s => s,
                };
                assert_eq!(got, want, "stripe {t} member {member}");
            }
        }
    }

    #[test]
    fn shard_member_roundtrip() {
        for level in [
            Level::Raid5,
            Level::Raid6,
            Level::Ec { k: 5, m: 3 },
            Level::Raid0,
        ] {
            let w = match level {
                Level::Ec { k, m } => (k + m) as u32,
                _ => 8,
            };
            let g = geo(level, w, 1);
            for t in 0..20 {
                for member in 0..w as usize {
                    assert_eq!(g.member_of_shard(t, g.shard_of_member(t, member)), member);
                }
            }
        }
    }

    #[test]
    fn pieces_cover_the_range() {
        let g = geo(Level::Raid6, 6, 3);
        let p = g.pieces(4096 * 5 + 512, 4096 * 20);
        assert_eq!(p.iter().map(|x| x.len).sum::<u64>(), 4096 * 20);
        assert_eq!(p[0].chunk_off, 512);
        // stripe data = 4 chunks; logical chunk 5 = stripe 1 -> group 1, group stripe 0, index 1
        assert_eq!((p[0].group, p[0].stripe, p[0].index), (1, 0, 1));
    }
}
