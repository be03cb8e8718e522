//! A batch: many stripes of one geometry in one buffer, laid out shard-major.
//!
//! Shard `i` of every stripe lies in one run of `stripes * chunk` bytes (stripe `s` at
//! offset `s * chunk` inside it), and the runs sit `pitch` bytes apart. So a member disk's
//! part of the batch is one contiguous buffer (one large write per member), and for the
//! codec the whole batch is a single stripe of `stripes * chunk`-byte shards: one kernel
//! launch, one 2D copy per direction, no per-stripe bookkeeping.

use std::sync::Arc;

use crate::cuda::{Device, Pinned};
use crate::Error;

enum Storage {
    Heap(Vec<u8>),
    Pinned(Pinned),
}

/// Stripes of `k` data and `m` parity chunks of `chunk` bytes. Pinned (page-locked) when
/// made by a GPU-capable [`crate::Parity`] or [`crate::GpuCodec`], plain heap memory
/// otherwise.
pub struct Batch {
    k: usize,
    m: usize,
    chunk: usize,
    stripes: usize,
    pitch: usize,
    /// Byte offset of shard 0 inside the storage (64-byte alignment for heap storage).
    base: usize,
    storage: Storage,
}

impl std::fmt::Debug for Batch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch")
            .field("k", &self.k)
            .field("m", &self.m)
            .field("chunk", &self.chunk)
            .field("stripes", &self.stripes)
            .field("pinned", &self.is_pinned())
            .finish()
    }
}

/// Bytes between shard runs: 64-byte aligned, and never a multiple of 4 KiB so that shards
/// do not alias in the CPU's caches (see shared/notes/codec-anchors.md: equal 4 KiB page
/// offsets cost ISA-L-style kernels up to 5x; a 128-byte skew restored them).
pub(crate) fn pitch_for(shard_len: usize) -> usize {
    let p = shard_len.div_ceil(64) * 64;
    if p % 4096 == 0 {
        p + 128
    } else {
        p
    }
}

impl Batch {
    fn check(k: usize, m: usize, chunk: usize, stripes: usize) -> Result<usize, Error> {
        if k == 0 || m == 0 || k + m > 256 {
            return Err(Error::Batch(format!("bad geometry {k}+{m}")));
        }
        if chunk == 0 || stripes == 0 {
            return Err(Error::Batch("empty batch".into()));
        }
        chunk
            .checked_mul(stripes)
            .and_then(|l| pitch_for(l).checked_mul(k + m))
            .ok_or_else(|| Error::Batch("batch too large".into()))
    }

    /// A batch in ordinary heap memory (the CPU path needs nothing else).
    pub fn new_heap(k: usize, m: usize, chunk: usize, stripes: usize) -> Result<Batch, Error> {
        let total = Self::check(k, m, chunk, stripes)?;
        let v = vec![0u8; total + 64];
        let base = v.as_ptr().align_offset(64);
        Ok(Batch {
            k,
            m,
            chunk,
            stripes,
            pitch: pitch_for(chunk * stripes),
            base,
            storage: Storage::Heap(v),
        })
    }

    pub(crate) fn new_pinned(
        dev: &Arc<Device>,
        k: usize,
        m: usize,
        chunk: usize,
        stripes: usize,
    ) -> Result<Batch, Error> {
        let total = Self::check(k, m, chunk, stripes)?;
        Ok(Batch {
            k,
            m,
            chunk,
            stripes,
            pitch: pitch_for(chunk * stripes),
            base: 0,
            storage: Storage::Pinned(Pinned::new(dev, total)?),
        })
    }

    pub fn k(&self) -> usize {
        self.k
    }
    pub fn m(&self) -> usize {
        self.m
    }
    /// Shards per stripe, `k + m`.
    pub fn shards(&self) -> usize {
        self.k + self.m
    }
    pub fn chunk(&self) -> usize {
        self.chunk
    }
    pub fn stripes(&self) -> usize {
        self.stripes
    }
    /// Bytes of one shard run: `stripes * chunk`.
    pub fn shard_len(&self) -> usize {
        self.chunk * self.stripes
    }
    /// Data bytes in the batch: `k * stripes * chunk`.
    pub fn data_bytes(&self) -> usize {
        self.k * self.shard_len()
    }
    /// Bytes from the start of one shard run to the next.
    pub fn pitch(&self) -> usize {
        self.pitch
    }
    pub fn is_pinned(&self) -> bool {
        matches!(self.storage, Storage::Pinned(_))
    }

    /// The whole buffer: shard `i` at `i * pitch()`, `shard_len()` bytes each.
    pub fn raw(&self) -> &[u8] {
        let len = self.shards() * self.pitch;
        match &self.storage {
            Storage::Heap(v) => &v[self.base..self.base + len],
            // SAFETY: the pinned allocation holds `len` initialised bytes and lives as
            // long as self; no device copy is in flight outside &mut self methods.
            Storage::Pinned(p) => unsafe { std::slice::from_raw_parts(p.ptr, len) },
        }
    }

    /// The whole buffer, mutable.
    pub fn raw_mut(&mut self) -> &mut [u8] {
        let len = self.shards() * self.pitch;
        match &mut self.storage {
            Storage::Heap(v) => &mut v[self.base..self.base + len],
            // SAFETY: as in raw(), and &mut self makes the access exclusive.
            Storage::Pinned(p) => unsafe { std::slice::from_raw_parts_mut(p.ptr, len) },
        }
    }

    pub(crate) fn host_ptr(&mut self) -> *mut u8 {
        self.raw_mut().as_mut_ptr()
    }

    /// Shard `i` of every stripe, one run (what member `i` stores for the batch).
    pub fn shard(&self, i: usize) -> &[u8] {
        let (p, l) = (self.pitch, self.shard_len());
        &self.raw()[i * p..i * p + l]
    }
    pub fn shard_mut(&mut self, i: usize) -> &mut [u8] {
        let (p, l) = (self.pitch, self.shard_len());
        &mut self.raw_mut()[i * p..i * p + l]
    }

    /// Chunk `shard` of stripe `stripe`.
    pub fn chunk_of(&self, stripe: usize, shard: usize) -> &[u8] {
        let c = self.chunk;
        &self.shard(shard)[stripe * c..(stripe + 1) * c]
    }
    pub fn chunk_of_mut(&mut self, stripe: usize, shard: usize) -> &mut [u8] {
        let c = self.chunk;
        &mut self.shard_mut(shard)[stripe * c..(stripe + 1) * c]
    }

    /// Every shard run, mutable at once, for stripe-parallel work.
    pub fn shards_mut(&mut self) -> Vec<&mut [u8]> {
        let (p, l) = (self.pitch, self.shard_len());
        self.raw_mut().chunks_mut(p).map(|c| &mut c[..l]).collect()
    }
}
