//! Decode plans per erasure pattern, cached per codec.
//!
//! Rebuilding shards means choosing `k` survivors, inverting their generator rows and
//! preparing kernel tables for the rows that give the wanted shards: microseconds of
//! setup, more than the rebuild of a 4 KiB stripe itself. A degraded array sees the same
//! pattern over and over, so plans are cached by pattern. The cache is split into shards
//! behind read-write locks: lookups of a cached pattern from many threads take only read
//! locks and never wait on each other.

use crate::kernels::{Mode, Plan};
use crate::{gf, Codec, CodecError};
use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};
use std::sync::{Arc, RwLock};

const SHARDS: usize = 16;
/// Patterns kept per cache shard; a full shard is emptied (patterns are cheap to rebuild,
/// and a real array sees few at a time).
const SHARD_CAP: usize = 256;

/// Shard index sets as bitmaps over at most 256 shards.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct Key {
    present: [u64; 4],
    want: [u64; 4],
}

fn bits(flags: &[bool]) -> [u64; 4] {
    let mut b = [0u64; 4];
    for (i, _) in flags.iter().enumerate().filter(|(_, f)| **f) {
        b[i / 64] |= 1 << (i % 64);
    }
    b
}

/// A multiply-rotate hash: the keys are ours (not attacker-chosen) and SipHash would
/// cost a good part of a small rebuild.
#[derive(Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        for c in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            self.write_u64(u64::from_le_bytes(w));
        }
    }
    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(23) ^ x).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
    fn finish(&self) -> u64 {
        self.0 ^ (self.0 >> 29)
    }
}

type Map = HashMap<Key, Arc<DecodePlan>, BuildHasherDefault<KeyHasher>>;

pub(crate) struct Cache {
    shards: [RwLock<Map>; SHARDS],
}

impl Cache {
    pub(crate) fn new() -> Cache {
        Cache {
            shards: std::array::from_fn(|_| RwLock::new(Map::default())),
        }
    }

    /// The plan for rebuilding `want` from `present` (both validated by the caller).
    pub(crate) fn get(
        &self,
        codec: &Codec,
        present: &[bool],
        want: &[bool],
    ) -> Result<Arc<DecodePlan>, CodecError> {
        let key = Key {
            present: bits(present),
            want: bits(want),
        };

        let shard = &self.shards
            [(BuildHasherDefault::<KeyHasher>::default().hash_one(key) >> 58) as usize % SHARDS];
        if let Some(p) = shard.read().unwrap_or_else(|e| e.into_inner()).get(&key) {
            return Ok(p.clone());
        }
        let plan = Arc::new(DecodePlan::new(codec, present, want)?);
        let mut map = shard.write().unwrap_or_else(|e| e.into_inner());
        if map.len() >= SHARD_CAP {
            map.clear();
        }
        map.insert(key, plan.clone());
        Ok(plan)
    }
}

/// Which shards to read, which to write, and the matrix from one to the other.
pub(crate) struct DecodePlan {
    /// Survivor shard indices the plan reads, ascending.
    srcs: Vec<usize>,
    /// Shard indices it writes, ascending.
    outs: Vec<usize>,
    plan: Plan,
}

impl DecodePlan {
    fn new(codec: &Codec, present: &[bool], want: &[bool]) -> Result<DecodePlan, CodecError> {
        let (k, n) = (codec.k, codec.k + codec.m);
        // The first k survivors, data before parity: with no data lost this is the data
        // itself and the decode matrix is the identity.
        let survivors: Vec<usize> = (0..n).filter(|&i| present[i]).take(k).collect();
        let g = codec.generator_matrix();
        let mut sub = Vec::with_capacity(k * k);
        for &s in &survivors {
            sub.extend_from_slice(&g[s * k..(s + 1) * k]);
        }
        let inv = gf::invert_matrix(&sub, k)
            .ok_or_else(|| CodecError::Geometry("decode matrix is singular".into()))?;
        // Shard i = G[i] * data = G[i] * inv * survivors: one row over the survivors per
        // wanted shard, so wanted parity never waits for lost data to be rebuilt first.
        let outs: Vec<usize> = (0..n).filter(|&i| want[i]).collect();
        let mut rows = Vec::with_capacity(outs.len() * k);
        for &o in &outs {
            let gi = &g[o * k..(o + 1) * k];
            for j in 0..k {
                rows.push((0..k).fold(0u8, |acc, i| acc ^ gf::mul(gi[i], inv[i * k + j])));
            }
        }
        // Drop survivors no wanted row uses (e.g. the other data shards when only a
        // lost data shard's XOR parity is needed... or nothing at all).
        let used: Vec<usize> = (0..k)
            .filter(|&j| (0..outs.len()).any(|r| rows[r * k + j] != 0))
            .collect();
        let mut coef = Vec::with_capacity(outs.len() * used.len());
        for r in 0..outs.len() {
            coef.extend(used.iter().map(|&j| rows[r * k + j]));
        }
        let srcs = used.iter().map(|&j| survivors[j]).collect();
        Ok(DecodePlan {
            srcs,
            outs: outs.clone(),
            plan: Plan::new(codec.isa(), coef, outs.len(), used.len()),
        })
    }

    /// Rebuild the wanted shards in place, reading the survivors where they lie.
    pub(crate) fn run(&self, shards: &mut [&mut [u8]]) {
        let mut srcs: Vec<&[u8]> = Vec::with_capacity(self.srcs.len());
        let mut outs: Vec<&mut [u8]> = Vec::with_capacity(self.outs.len());
        let (mut si, mut oi) = (0, 0);
        for (i, s) in shards.iter_mut().enumerate() {
            if self.srcs.get(si) == Some(&i) {
                srcs.push(&**s);
                si += 1;
            } else if self.outs.get(oi) == Some(&i) {
                outs.push(&mut **s);
                oi += 1;
            }
        }
        debug_assert_eq!(outs.len(), self.plan.rows());
        // Rebuilt shards are usually read again soon (sent to a client, copied to a spare):
        // cache stores (measured: no loss against streaming stores at 1 MiB).
        self.plan.run(&srcs, &mut outs, Mode::Set);
    }
}
