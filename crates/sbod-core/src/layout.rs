//! An array's geometry: its level, groups, chunk and sizes, and what follows from them
//! (data chunks per stripe, redundancy, capacity, the codec). Where each byte lives is the
//! placement map's business ([`crate::placement`]).

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
    /// Parity shards kept on dedicated members rather than rotated: the last `dedicated`
    /// parity shards of every stripe live on the last `dedicated` slots of its group, and
    /// the rest rotate over the other slots as before. What a level change that adds
    /// parity leaves (raid0 -> raid5, raid5 -> raid6, ec:K+M -> ec:K+(M+1)): the existing
    /// layout stays where it is and the new parity is computed onto the new member, as
    /// md's `left-symmetric-6` layout does. 0 for every array created as it is.
    #[serde(default)]
    pub dedicated: u8,
    /// Declustered (`--declustered`): the groups' stripes and `spares` members' worth of
    /// spare space spread over every member by a fixed permutation table
    /// ([`crate::placement`]); None: each group on its own members.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub declustered: Option<Declustered>,
}

/// What makes a layout declustered: the spare space (in members' worth) and the seed of
/// its permutation table. The table's checksum is recorded beside them in the
/// superblocks (`TAG_DECLUSTER`), so a change of the table's code cannot silently remap
/// an array's data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Declustered {
    pub spares: u32,
    pub seed: u64,
    /// Rows (of one chunk on each member) that share one permutation of the table: the
    /// stripes of a group stay on the same members for `height` rows, so a survivor's
    /// share of a lost member's stripes, and the spare space's writes, are runs of
    /// `height` chunks (OpenZFS dRAID's 16 MiB rows). 1 (one permutation per row) for
    /// arrays created before it was recorded; new arrays take [`Declustered::height_for`].
    #[serde(default = "one")]
    pub height: u32,
    /// Which map places the blocks of rows: 0, a table of random permutations (arrays
    /// created before the balanced map); 1, the balanced map (`Decl::balanced`), which
    /// spreads each failure's rebuild evenly over the survivors on any member size.
    #[serde(default)]
    pub map: u8,
}

fn one() -> u32 {
    1
}

impl Declustered {
    /// The largest row height: 16 MiB of each member per permutation, as dRAID's rows.
    pub const MAX_HEIGHT_BYTES: u64 = 16 << 20;
    /// Permutations a member should see at least, so that each survivor's share of a
    /// rebuild, and the spare space, stay near the mean on small members too (the random
    /// table's need: it balances only over many permutations).
    pub const MIN_PERMUTATIONS: u64 = 256;
    /// Sweeps of `n` permutations a member should see at least on the balanced map, which
    /// is exactly balanced over each whole sweep (`Decl::balanced`): a sweep's part at the
    /// member's end is the only unevenness, a quarter of the whole or less.
    pub const MIN_SWEEPS: u64 = 4;

    /// The row height a new array of `members` members of `member_size` bytes and chunks
    /// of `chunk` gets: the largest power of two of rows up to 16 MiB of a member that
    /// still leaves each member [`Declustered::MIN_SWEEPS`] sweeps of the balanced map, or
    /// [`Declustered::MIN_PERMUTATIONS`] permutations if that is fewer (1 on members too
    /// small for any more). Taller rows are longer runs for a rebuild's reads and writes:
    /// 48 members of 1 GiB got 2 MiB rows when 256 permutations were asked of them, 4 MiB
    /// (five and a third sweeps) now, and each survivor of a rebuild made 49 reads
    /// instead of 84, its media busy 9% less (docs/PERFORMANCE.md, "Rows for whole
    /// sweeps").
    pub fn height_for(member_size: u64, chunk: u64, members: usize) -> u32 {
        let rows = member_size / chunk.max(1);
        let cap = (Self::MAX_HEIGHT_BYTES / chunk.max(1)).max(1);
        let perms = Self::MIN_PERMUTATIONS.min(Self::MIN_SWEEPS * members.max(1) as u64);
        let want = (rows / perms).clamp(1, cap);
        // The largest power of two at most `want`.
        (1u64 << (63 - want.leading_zeros())) as u32
    }
}

/// The seed of every declustered table this sbod creates.
pub const DECLUSTER_SEED: u64 = 0x5b0d_d1a1_d000_0001;

impl Geometry {
    /// Slots: the groups' members, and a declustered layout's spare members' worth.
    pub fn members(&self) -> usize {
        self.groups as usize * self.width as usize + self.spare_slots()
    }

    /// Members' worth of distributed spare space (0 unless declustered).
    pub fn spare_slots(&self) -> usize {
        self.declustered.map_or(0, |d| d.spares as usize)
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

    /// The layout with `per` fewer members in every group (`sbod grow --remove`): the
    /// level keeps its parity (ec:K+M keeps M), and every member keeps its last rows free
    /// (4 MiB, or half of a small member, in whole chunks) for the reshape's backup area
    /// (see `process::reshape`).
    pub fn narrowed(&self, per: usize) -> Result<Geometry, String> {
        let level = match self.level {
            Level::Ec { k, .. } if per >= k as usize => {
                return Err(format!(
                    "{}: groups keep at least one data member",
                    self.level
                ))
            }
            Level::Ec { k, m } => Level::Ec {
                k: k - per as u16,
                m,
            },
            l => l,
        };
        if per >= self.width as usize {
            return Err(format!(
                "a group of {} cannot lose {per} members",
                self.width
            ));
        }
        let c = self.chunk as u64;
        let room = ((4u64 << 20).min(self.member_size / 2) / c * c).max(c);
        let g = Geometry {
            level,
            width: self.width - per as u32,
            dedicated: 0,
            member_size: self.member_size.saturating_sub(room),
            ..self.clone()
        };
        g.validate()?;
        Ok(g)
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
        if self.declustered.is_some() {
            if !matches!(self.level, Level::Raid5 | Level::Raid6 | Level::Ec { .. }) {
                return Err(format!(
                    "{} cannot be declustered: raid5, raid6 and ec:K+M can (their groups and spare space spread over every member)",
                    self.level
                ));
            }
            if self.members() > 256 {
                return Err(format!(
                    "a declustered layout spans at most 256 members, this one {}",
                    self.members()
                ));
            }
            if self
                .declustered
                .is_some_and(|d| d.height == 0 || d.height > 1 << 20)
            {
                return Err("a declustered layout's row height is 1 to 2^20 rows".into());
            }
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
        if self.dedicated > 0 {
            let m = self.redundancy();
            if !matches!(self.scheme(), Scheme::Parity { .. }) || self.dedicated as usize > m {
                return Err(format!(
                    "{} keeps at most {m} parity shard(s) on dedicated members, not {}",
                    self.level, self.dedicated
                ));
            }
        }
        let total = self.member_size as u128 * self.members() as u128;
        if self.member_size > 1 << 60 || self.data_offset > 1 << 40 || total > (1u128 << 63) {
            return Err("sizes out of range".into());
        }
        Ok(())
    }
}

pub use sbod_types::size::{human, parse_size};
