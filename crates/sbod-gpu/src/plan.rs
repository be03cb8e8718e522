//! What a kernel launch computes: a GF(2^8) matrix from source slots to destination slots,
//! the kernel that computes it, and the split-nibble tables the general kernel reads.
//!
//! A plan is built on the CPU (decode matrices inverted with
//! [`sbod_codec::gf::invert_matrix`]) and shared, unchanged, by the CUDA kernels and by their
//! bit-exact CPU model in [`crate::emu`].

use sbod_codec::{gf, Codec, Scheme};

/// Parity rows one general-kernel block computes: a table word packs 4 rows' products.
pub const ROWS_PER_GROUP: usize = 4;
/// Table words per source: 16 low-nibble products then 16 high-nibble products.
pub const TABLE_WORDS: usize = 32;

/// Which kernel computes a plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KernelKind {
    /// One output row whose coefficients are all 1: plain XOR.
    Xor,
    /// Two rows, P (all 1) and Q (`2^j` for source j): md raid6 by Horner's rule.
    PQ,
    /// Any matrix: split-nibble table lookups, up to 4 rows per pass.
    General,
}

/// A matrix from source slots to destination slots, ready for a kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Shard slots read, in matrix column order.
    pub src: Vec<u32>,
    /// Shard slots written, in matrix row order.
    pub dst: Vec<u32>,
    /// `dst.len()` rows of `src.len()` coefficients, row-major.
    pub coef: Vec<u8>,
    pub kind: KernelKind,
}

impl Plan {
    /// Build a plan and pick its kernel from the matrix's shape.
    pub fn new(src: Vec<u32>, dst: Vec<u32>, coef: Vec<u8>) -> Plan {
        assert_eq!(coef.len(), src.len() * dst.len());
        assert!(!src.is_empty() && !dst.is_empty());
        let n = src.len();
        let kind = if dst.len() == 1 && coef.iter().all(|&c| c == 1) {
            KernelKind::Xor
        } else if dst.len() == 2
            && n <= 255
            && coef[..n].iter().all(|&c| c == 1)
            && coef[n..].iter().enumerate().all(|(j, &c)| c == gf::exp(j))
        {
            KernelKind::PQ
        } else {
            KernelKind::General
        };
        Plan {
            src,
            dst,
            coef,
            kind,
        }
    }

    /// Encode: data slots `0..k` to parity slots `k..k+m`.
    pub fn encode(codec: &Codec) -> Plan {
        let (k, m) = (codec.k(), codec.m());
        let mut coef = Vec::with_capacity(k * m);
        for r in 0..m {
            coef.extend((0..k).map(|j| codec.coefficient(r, j)));
        }
        Plan::new(
            (0..k as u32).collect(),
            (k as u32..(k + m) as u32).collect(),
            coef,
        )
    }

    /// Rebuild the shards flagged in `want` (each absent) from `k` present ones, in one
    /// pass: the rows are `G[want] * inverse(G[survivors])` with `G` the generator matrix,
    /// so lost parity comes straight from the survivors too. Survivors are the first `k`
    /// present shards, data first, as in the CPU codec (any choice gives the same bytes).
    pub fn reconstruct(
        codec: &Codec,
        present: &[bool],
        want: &[bool],
    ) -> Result<Plan, sbod_codec::CodecError> {
        let (k, m) = (codec.k(), codec.m());
        let n = k + m;
        if present.len() != n || want.len() != n {
            return Err(sbod_codec::CodecError::Shape);
        }
        let lost = present.iter().filter(|p| !**p).count();
        if lost > m {
            return Err(sbod_codec::CodecError::TooManyErasures { lost, m });
        }
        if want.iter().zip(present).any(|(w, p)| *w && *p) || !want.contains(&true) {
            return Err(sbod_codec::CodecError::Shape);
        }
        let g = codec.generator_matrix();
        let survivors: Vec<usize> = (0..n).filter(|&i| present[i]).take(k).collect();
        let mut sub = Vec::with_capacity(k * k);
        for &s in &survivors {
            sub.extend_from_slice(&g[s * k..(s + 1) * k]);
        }
        let inv = gf::invert_matrix(&sub, k)
            .ok_or_else(|| sbod_codec::CodecError::Geometry("decode matrix is singular".into()))?;
        let wanted: Vec<usize> = (0..n).filter(|&i| want[i]).collect();
        let mut coef = Vec::with_capacity(wanted.len() * k);
        for &w in &wanted {
            let row = &g[w * k..(w + 1) * k];
            for col in 0..k {
                let mut acc = 0u8;
                for (i, &c) in row.iter().enumerate() {
                    acc ^= gf::mul(c, inv[i * k + col]);
                }
                coef.push(acc);
            }
        }
        Ok(Plan::new(
            survivors.iter().map(|&s| s as u32).collect(),
            wanted.iter().map(|&w| w as u32).collect(),
            coef,
        ))
    }

    pub fn nsrc(&self) -> usize {
        self.src.len()
    }
    pub fn nrow(&self) -> usize {
        self.dst.len()
    }
    /// Row groups the general kernel runs (grid y).
    pub fn groups(&self) -> usize {
        self.nrow().div_ceil(ROWS_PER_GROUP)
    }

    /// The plan as the kernels read it from device memory: the tables of every row group,
    /// then the source slots, then the destination slots.
    pub fn image(&self) -> Vec<u32> {
        let mut img = tables(&self.coef, self.nsrc(), self.nrow());
        img.extend_from_slice(&self.src);
        img.extend_from_slice(&self.dst);
        img
    }
}

/// Split-nibble product tables for every row group: group g, source j, word `n < 16` holds
/// `coef[4g + r][j] * n` in byte r, word `16 + n` holds `coef[4g + r][j] * (n << 4)`; rows
/// past the last are 0. Since multiplication distributes over XOR,
/// `c * x = c * (x & 15) ^ c * (x & 0xf0)`: two lookups give a byte's products for 4 rows.
pub fn tables(coef: &[u8], nsrc: usize, nrow: usize) -> Vec<u32> {
    assert_eq!(coef.len(), nsrc * nrow);
    let groups = nrow.div_ceil(ROWS_PER_GROUP);
    let mut t = vec![0u32; groups * nsrc * TABLE_WORDS];
    for g in 0..groups {
        for j in 0..nsrc {
            let base = (g * nsrc + j) * TABLE_WORDS;
            for r in 0..ROWS_PER_GROUP {
                let row = g * ROWS_PER_GROUP + r;
                if row >= nrow {
                    break;
                }
                let c = coef[row * nsrc + j];
                for n in 0..16u8 {
                    t[base + n as usize] |= (gf::mul(c, n) as u32) << (8 * r);
                    t[base + 16 + n as usize] |= (gf::mul(c, n << 4) as u32) << (8 * r);
                }
            }
        }
    }
    t
}

/// The plan that encodes `scheme` (a convenience for tests and benchmarks).
pub fn encode_plan(scheme: Scheme) -> Result<Plan, sbod_codec::CodecError> {
    Ok(Plan::encode(&Codec::new(scheme)?))
}
