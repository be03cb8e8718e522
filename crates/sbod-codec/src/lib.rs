//! sbod's parity codec.
//!
//! Three schemes, all systematic (data shards are stored as they are) over GF(2^8) with the
//! polynomial 0x11d and generator 2:
//!
//! * [`Scheme::Xor`]: one parity shard, `P = D0 ^ D1 ^ ...` (raid5).
//! * [`Scheme::PQ`]: two parity shards exactly as Linux md raid6 computes them:
//!   `P = sum D_i`, `Q = sum g^i * D_i` with `g = 2`, `i` the data index in the stripe.
//! * [`Scheme::Cauchy`]: `m` parity shards from the Cauchy matrix ISA-L's
//!   `gf_gen_cauchy1_matrix` builds: parity row `r`, data column `j` has coefficient
//!   `1 / ((k + r) ^ j)`. Every square submatrix is invertible, so any `m` lost shards of
//!   `k + m <= 256` can be rebuilt, and the output is byte-identical to ISA-L's
//!   `ec_encode_data` with that matrix.
//!
//! Shards are byte slices of equal length. Shard indices run `0..k` for data and
//! `k..k+m` for parity.
//!
//! This is the product's own core, written by hand: no crate offers md-compatible P+Q and
//! ISA-L-compatible Cauchy coding with the partial-stripe update and syndrome-based
//! corruption location sbod needs (see ../shared/notes/crates-survey.md).

pub mod bench;
mod decode;
pub mod gf;
mod kernels;
mod selftest;

pub use bench::AlignedBuf;
pub use kernels::Isa;

use kernels::{Mode, Plan};
use std::fmt;
use std::sync::Arc;

/// Which parity code a group uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scheme {
    /// k data shards, one XOR parity shard (raid5).
    Xor { k: usize },
    /// k data shards, md raid6 P and Q.
    PQ { k: usize },
    /// k data shards, m Cauchy Reed-Solomon parity shards (`ec:K+M`).
    Cauchy { k: usize, m: usize },
}

impl Scheme {
    pub fn k(&self) -> usize {
        match *self {
            Scheme::Xor { k } | Scheme::PQ { k } | Scheme::Cauchy { k, .. } => k,
        }
    }
    pub fn m(&self) -> usize {
        match *self {
            Scheme::Xor { .. } => 1,
            Scheme::PQ { .. } => 2,
            Scheme::Cauchy { m, .. } => m,
        }
    }
}

impl fmt::Display for Scheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Scheme::Xor { k } => write!(f, "xor {k}+1"),
            Scheme::PQ { k } => write!(f, "p+q {k}+2"),
            Scheme::Cauchy { k, m } => write!(f, "cauchy {k}+{m}"),
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CodecError {
    #[error("invalid geometry: {0}")]
    Geometry(String),
    #[error("{lost} shards lost but the code only rebuilds {m}")]
    TooManyErasures { lost: usize, m: usize },
    #[error("shard lengths differ or do not match the code's shard count")]
    Shape,
    #[error("this CPU cannot run the {0} kernels")]
    Unsupported(Isa),
}

/// What [`Codec::locate`] found in a stripe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Parity agrees with data.
    Clean,
    /// Exactly one shard (this index) is wrong; the others are consistent.
    Corrupt(usize),
    /// Parity disagrees, but no single shard explains it (or the code has one parity).
    Unlocatable,
}

/// An encoder/decoder for one geometry. Cheap to clone and to share between threads
/// (clones share the encode tables and the decode-plan cache).
#[derive(Clone)]
pub struct Codec {
    scheme: Scheme,
    k: usize,
    m: usize,
    /// m rows of k coefficients.
    coef: Vec<u8>,
    /// The parity rows prepared for the kernels.
    enc: Arc<Plan>,
    /// Decode plans per erasure pattern (matrix inversion and tables cost microseconds,
    /// more than rebuilding a 4 KiB stripe).
    decode: Arc<decode::Cache>,
}

/// Shards per thread below which [`Codec::encode_par`] does not split the work.
pub const PAR_MIN_BYTES: usize = 64 * 1024;

impl fmt::Debug for Codec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Codec")
            .field("scheme", &self.scheme)
            .field("isa", &self.enc.isa())
            .finish()
    }
}

impl Codec {
    /// A codec using the kernels [`Isa::selected`] picks for this CPU.
    pub fn new(scheme: Scheme) -> Result<Codec, CodecError> {
        Codec::with_isa(scheme, Isa::selected())
    }

    /// A codec using one particular kernel family (tests and benchmarks compare them).
    /// Unlike [`Codec::new`] there is no self-test and no fallback.
    pub fn with_isa(scheme: Scheme, isa: Isa) -> Result<Codec, CodecError> {
        if !isa.is_supported() {
            return Err(CodecError::Unsupported(isa));
        }
        let (k, m) = (scheme.k(), scheme.m());
        if k == 0 {
            return Err(CodecError::Geometry(
                "at least one data shard is needed".into(),
            ));
        }
        let coef = match scheme {
            Scheme::Xor { .. } => vec![1u8; k],
            Scheme::PQ { .. } => {
                if k > 255 {
                    return Err(CodecError::Geometry(
                        "P+Q supports at most 255 data shards".into(),
                    ));
                }
                let mut c = vec![1u8; k];
                c.extend((0..k).map(gf::exp));
                c
            }
            Scheme::Cauchy { .. } => {
                if m == 0 {
                    return Err(CodecError::Geometry(
                        "at least one parity shard is needed".into(),
                    ));
                }
                if k + m > 256 {
                    return Err(CodecError::Geometry(format!(
                        "k+m = {} exceeds 256 shards",
                        k + m
                    )));
                }
                let mut c = Vec::with_capacity(k * m);
                for r in 0..m {
                    for j in 0..k {
                        c.push(gf::inv(((k + r) ^ j) as u8));
                    }
                }
                c
            }
        };
        let enc = Arc::new(Plan::new(isa, coef.clone(), m, k));
        Ok(Codec {
            scheme,
            k,
            m,
            coef,
            enc,
            decode: Arc::new(decode::Cache::new()),
        })
    }

    /// The kernel family this codec runs.
    pub fn isa(&self) -> Isa {
        self.enc.isa()
    }

    pub fn scheme(&self) -> Scheme {
        self.scheme
    }
    pub fn k(&self) -> usize {
        self.k
    }
    pub fn m(&self) -> usize {
        self.m
    }

    /// The coefficient of data shard `data_index` in parity shard `parity_row`.
    pub fn coefficient(&self, parity_row: usize, data_index: usize) -> u8 {
        self.coef[parity_row * self.k + data_index]
    }

    /// The full (k+m) x k generator matrix, row-major: identity rows then parity rows.
    pub fn generator_matrix(&self) -> Vec<u8> {
        let mut g = vec![0u8; (self.k + self.m) * self.k];
        for i in 0..self.k {
            g[i * self.k + i] = 1;
        }
        g[self.k * self.k..].copy_from_slice(&self.coef);
        g
    }

    /// Compute every parity shard from the data shards, in one pass over the data.
    pub fn encode(&self, data: &[&[u8]], parity: &mut [&mut [u8]]) -> Result<(), CodecError> {
        self.check_encode_shape(data, parity)?;
        self.enc.run(data, parity, Mode::SetCold);
        Ok(())
    }

    /// [`Codec::encode`] a slice at a time: the parity of bytes `[a, b)` of every shard
    /// (`slice` bytes each, the last one shorter), then `after(a, data, parity)` with those
    /// bytes of the data and of the new parity, while they are still in the core's cache.
    /// The parity is written with cached stores, for a caller that reads it at once (the
    /// checksum of every block written, fused with the parity pass: one trip of the stripe
    /// through the cache instead of three). The parity is identical to `encode`'s.
    pub fn encode_slices(
        &self,
        data: &[&[u8]],
        parity: &mut [&mut [u8]],
        slice: usize,
        mut after: impl FnMut(usize, &[&[u8]], &[&[u8]]),
    ) -> Result<(), CodecError> {
        self.check_encode_shape(data, parity)?;
        if slice == 0 {
            return Err(CodecError::Shape);
        }
        let len = data[0].len();
        // The parity still to do, split off a slice at a time (no allocation per slice).
        let mut rest: Vec<&mut [u8]> = parity.iter_mut().map(|p| &mut **p).collect();
        let mut outs: Vec<&mut [u8]> = Vec::with_capacity(self.m);
        let mut ds: Vec<&[u8]> = Vec::with_capacity(self.k);
        let mut ps: Vec<&[u8]> = Vec::with_capacity(self.m);
        let mut a = 0;
        while a < len {
            let b = (a + slice).min(len);
            ds.clear();
            ds.extend(data.iter().map(|d| &d[a..b]));
            outs.clear();
            for r in rest.iter_mut() {
                let (head, tail) = std::mem::take(r).split_at_mut(b - a);
                *r = tail;
                outs.push(head);
            }
            self.enc.run(&ds, &mut outs, Mode::Set);
            ps.clear();
            ps.extend(outs.drain(..).map(|h| &*h));
            after(a, &ds, &ps);
            a = b;
        }
        Ok(())
    }

    /// [`Codec::encode`] with the byte range split over up to `threads` threads (scoped
    /// threads, started for this call; slices of at least [`PAR_MIN_BYTES`] per shard, so
    /// small stripes stay on the calling thread). The result is identical to `encode`.
    pub fn encode_par(
        &self,
        data: &[&[u8]],
        parity: &mut [&mut [u8]],
        threads: usize,
    ) -> Result<(), CodecError> {
        self.check_encode_shape(data, parity)?;
        let len = data[0].len();
        let threads = threads.min(len / PAR_MIN_BYTES).max(1);
        if threads == 1 {
            self.enc.run(data, parity, Mode::SetCold);
            return Ok(());
        }
        // Slices on 4 KiB boundaries keep every slice as aligned as the buffers.
        let chunk = len.div_ceil(threads).next_multiple_of(4096);
        let mut slices: Vec<Vec<&mut [u8]>> = Vec::new();
        for p in parity.iter_mut() {
            for (t, c) in p.chunks_mut(chunk).enumerate() {
                if slices.len() <= t {
                    slices.push(Vec::with_capacity(self.m));
                }
                slices[t].push(c);
            }
        }
        std::thread::scope(|scope| {
            let mut slices = slices.into_iter().enumerate();
            let (_, mut mine) = slices.next().expect("at least one slice");
            for (t, mut outs) in slices {
                let srcs: Vec<&[u8]> = data
                    .iter()
                    .map(|d| &d[t * chunk..(t * chunk + chunk).min(len)])
                    .collect();
                let enc = &self.enc;
                scope.spawn(move || enc.run(&srcs, &mut outs, Mode::SetCold));
            }
            let srcs: Vec<&[u8]> = data.iter().map(|d| &d[..chunk.min(len)]).collect();
            self.enc.run(&srcs, &mut mine, Mode::SetCold);
        });
        Ok(())
    }

    fn check_encode_shape(&self, data: &[&[u8]], parity: &[&mut [u8]]) -> Result<(), CodecError> {
        if data.len() != self.k || parity.len() != self.m {
            return Err(CodecError::Shape);
        }
        let len = data[0].len();
        if data.iter().any(|d| d.len() != len) || parity.iter().any(|p| p.len() != len) {
            return Err(CodecError::Shape);
        }
        Ok(())
    }

    /// Read-modify-write update: `parity[r] ^= coef(r, data_index) * (old ^ new)`.
    pub fn update(
        &self,
        data_index: usize,
        old: &[u8],
        new: &[u8],
        parity: &mut [&mut [u8]],
    ) -> Result<(), CodecError> {
        if data_index >= self.k || parity.len() != self.m || old.len() != new.len() {
            return Err(CodecError::Shape);
        }
        if parity.iter().any(|p| p.len() != old.len()) {
            return Err(CodecError::Shape);
        }
        self.enc.run_delta(data_index, old, new, parity);
        Ok(())
    }

    /// Rebuild every shard whose `present` flag is false from the others.
    pub fn reconstruct(
        &self,
        shards: &mut [&mut [u8]],
        present: &[bool],
    ) -> Result<(), CodecError> {
        let want: Vec<bool> = present.iter().map(|p| !p).collect();
        self.reconstruct_some(shards, present, &want)
    }

    /// Rebuild only the shards flagged in `want` (each must be absent), from present ones.
    pub fn reconstruct_some(
        &self,
        shards: &mut [&mut [u8]],
        present: &[bool],
        want: &[bool],
    ) -> Result<(), CodecError> {
        let n = self.k + self.m;
        if shards.len() != n || present.len() != n || want.len() != n {
            return Err(CodecError::Shape);
        }
        let len = shards[0].len();
        if shards.iter().any(|s| s.len() != len) {
            return Err(CodecError::Shape);
        }
        let lost = present.iter().filter(|p| !**p).count();
        if lost > self.m {
            return Err(CodecError::TooManyErasures { lost, m: self.m });
        }
        if want.iter().zip(present).any(|(w, p)| *w && *p) {
            return Err(CodecError::Shape);
        }
        if !want.iter().any(|w| *w) {
            return Ok(());
        }
        let plan = self.decode.get(self, present, want)?;
        plan.run(shards);
        Ok(())
    }

    /// Check a full stripe and, with two or more parity shards, locate a single corrupt
    /// shard from the syndromes (what md needs the separate raid6check tool for).
    pub fn locate(&self, shards: &[&[u8]]) -> Result<Verdict, CodecError> {
        let n = self.k + self.m;
        if shards.len() != n {
            return Err(CodecError::Shape);
        }
        let len = shards[0].len();
        if shards.iter().any(|s| s.len() != len) {
            return Err(CodecError::Shape);
        }
        // Syndromes: stored parity minus recomputed parity.
        let mut syn: Vec<Vec<u8>> = shards[self.k..].iter().map(|s| s.to_vec()).collect();
        {
            let mut refs: Vec<&mut [u8]> = syn.iter_mut().map(|s| s.as_mut_slice()).collect();
            self.enc.run(&shards[..self.k], &mut refs, Mode::Acc);
        }
        let bad_rows: Vec<usize> = (0..self.m)
            .filter(|&r| syn[r].iter().any(|&b| b != 0))
            .collect();
        if bad_rows.is_empty() {
            return Ok(Verdict::Clean);
        }
        if self.m < 2 {
            return Ok(Verdict::Unlocatable);
        }
        if bad_rows.len() == 1 {
            // Only one parity disagrees: that parity shard is the corrupt one.
            return Ok(Verdict::Corrupt(self.k + bad_rows[0]));
        }
        let mut found = None;
        for i in 0..self.k {
            let c0 = self.coefficient(0, i);
            let explains = (0..len).all(|b| {
                let e = gf::div(syn[0][b], c0);
                (1..self.m).all(|r| syn[r][b] == gf::mul(self.coefficient(r, i), e))
            });
            if explains {
                if found.is_some() {
                    return Ok(Verdict::Unlocatable);
                }
                found = Some(i);
            }
        }
        Ok(found.map_or(Verdict::Unlocatable, Verdict::Corrupt))
    }
}
