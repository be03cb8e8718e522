//! The RAID families, one module each behind one narrow interface ([`Family`]), as md's
//! personalities and SPDK's raid modules: [`plain`] (raid0, concat: no redundancy),
//! [`mirror`] (raid1, raid10: copies) and [`parity`] (raid5, raid6, ec: one code path for
//! every k+m, as md's raid5.c serves 4, 5 and 6).
//!
//! A family turns client requests into member I/O over the placement map, supplies a
//! rebuilt chunk for the generic rebuild, and judges a stripe read whole for the generic
//! scrub and resync. It works on the shared [`DataPath`] (members, locks, bitmap, member
//! I/O) and never changes membership: the background loops, the bitmap's life cycle and
//! membership changes are generic and never ask which family they drive.

pub(crate) mod mirror;
pub(crate) mod parity;
pub(crate) mod plain;
pub(crate) mod plan;

use crate::buf::SharedBuf;
use crate::datapath::{slice_mut, slice_of, DataPath};
use crate::error::Result;
use crate::layout::{Geometry, Scheme};
use crate::member::Member;
use crate::placement::StripeAddr;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The unit of a byte-granular write's merge: the block size the volume is written in.
pub(crate) const BLOCK: u64 = 4096;

/// A 4 KiB block a byte-granular write covers in part: bytes `new` of it are the caller's,
/// the rest keep what the volume holds, read under the stripe lock (see `write_bytes`).
#[derive(Clone, Debug)]
pub(crate) struct Patch {
    /// Where the block starts in the piece's buffer.
    pub at: usize,
    pub new: std::ops::Range<usize>,
}

impl Patch {
    /// Fill the bytes of the block in `buf` that the write does not cover from `old`.
    pub fn merge(&self, buf: &SharedBuf, old: &SharedBuf) {
        let blk = &mut slice_mut(buf)[self.at..self.at + BLOCK as usize];
        let old = slice_of(old);
        blk[..self.new.start].copy_from_slice(&old[..self.new.start]);
        blk[self.new.end..].copy_from_slice(&old[self.new.end..]);
    }
}

/// The patches inside a piece at `buf_off..buf_off+len` of a request, relative to it.
pub(crate) fn patches_within(patches: &[Patch], buf_off: u64, len: u64) -> Vec<Patch> {
    patches
        .iter()
        .filter(|p| (buf_off..buf_off + len).contains(&(p.at as u64)))
        .map(|p| Patch {
            at: p.at - buf_off as usize,
            new: p.new.clone(),
        })
        .collect()
}

/// What a scrub pass does with a stripe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CheckMode {
    Check,
    Repair,
    /// Make redundancy agree with the data (parity from data, mirrors from the first copy).
    Resync,
}

/// A family's judgement of a stripe read whole from every member of its group.
#[derive(Default)]
pub(crate) struct Judgement {
    /// A resync that cannot run (a data chunk unreadable): nothing was decided.
    pub skipped: bool,
    pub mismatched_blocks: u64,
    /// What to rewrite: (position in the group, byte offset in the chunk, data).
    pub rewrite: Vec<(usize, u64, SharedBuf)>,
    /// Blocks of each member (by position) that redundancy located as wrong.
    pub blame: BTreeMap<usize, u64>,
}

/// The interface every family implements: what SPDK's raid modules and md's personalities
/// provide to their core.
pub(crate) trait Family {
    /// Fill `out` from volume offset `offset` (whole blocks).
    async fn read(&self, dp: &DataPath, offset: u64, out: &SharedBuf) -> Result<()>;
    /// Write `data` at `offset` (whole blocks); `patches` are blocks the caller covers in
    /// part, merged with what the volume holds under the lock the write takes.
    async fn write(
        &self,
        dp: &DataPath,
        offset: u64,
        data: &SharedBuf,
        fua: bool,
        patches: &[Patch],
    ) -> Result<()>;
    /// Make whole blocks read back as zeros (`punch`: deallocate where members can).
    async fn zero(&self, dp: &DataPath, offset: u64, len: u64, punch: bool) -> Result<()>;
    /// A rebuild's source: what each of `targets` (slot, member being rebuilt) must hold
    /// in the first `len` bytes of stripe `addr`. Called with the stripe locked.
    async fn recover(
        &self,
        dp: &DataPath,
        addr: StripeAddr,
        len: u64,
        targets: &[(usize, Arc<Member>)],
    ) -> Result<Vec<SharedBuf>>;
    /// Judge a stripe read whole: `bufs` by position in the group, `unreadable` the
    /// positions that could not be read; `vouched` (the resync after a crash, with
    /// checksums): for each position, which 4 KiB rows match their checksums.
    fn judge(
        &self,
        dp: &DataPath,
        addr: StripeAddr,
        bufs: &[SharedBuf],
        unreadable: &[usize],
        mode: CheckMode,
        vouched: &[Vec<bool>],
    ) -> Result<Judgement>;
    /// Rebuild one 4 KiB row of stripe `addr` (`rows`, by position in the group) at the
    /// positions in `lost` from the others (no more than the group's redundancy).
    fn heal_row(
        &self,
        dp: &DataPath,
        addr: StripeAddr,
        rows: &mut [Vec<u8>],
        lost: &[usize],
    ) -> Result<()>;
}

/// The family an array runs, chosen by its level.
pub(crate) enum Personality {
    Plain(plain::Plain),
    Mirror(mirror::Mirror),
    Parity(parity::Parity),
}

/// Call the same method on whichever family this is.
macro_rules! dispatch {
    ($self:ident, $f:ident($($a:expr),*) $(.$await:ident)?) => {
        match $self {
            Personality::Plain(x) => x.$f($($a),*)$(.$await)?,
            Personality::Mirror(x) => x.$f($($a),*)$(.$await)?,
            Personality::Parity(x) => x.$f($($a),*)$(.$await)?,
        }
    };
}

impl Personality {
    pub fn of(geometry: &Geometry) -> Result<Personality> {
        Ok(match geometry.scheme() {
            Scheme::Concat | Scheme::Parity { m: 0, .. } => Personality::Plain(plain::Plain),
            Scheme::Mirror { .. } => Personality::Mirror(mirror::Mirror),
            Scheme::Parity { .. } => Personality::Parity(parity::Parity::new(geometry)?),
        })
    }

    pub async fn read(&self, dp: &DataPath, offset: u64, out: &SharedBuf) -> Result<()> {
        dispatch!(self, read(dp, offset, out).await)
    }

    pub async fn write(
        &self,
        dp: &DataPath,
        offset: u64,
        data: &SharedBuf,
        fua: bool,
        patches: &[Patch],
    ) -> Result<()> {
        dispatch!(self, write(dp, offset, data, fua, patches).await)
    }

    pub async fn zero(&self, dp: &DataPath, offset: u64, len: u64, punch: bool) -> Result<()> {
        dispatch!(self, zero(dp, offset, len, punch).await)
    }

    pub async fn recover(
        &self,
        dp: &DataPath,
        addr: StripeAddr,
        len: u64,
        targets: &[(usize, Arc<Member>)],
    ) -> Result<Vec<SharedBuf>> {
        dispatch!(self, recover(dp, addr, len, targets).await)
    }

    /// [`Personality::recover`] with shards taken from `pre` (by slot) where it has them:
    /// bytes the caller read and verified with the stripe locked (parity levels; the
    /// others read as ever).
    pub async fn recover_pre(
        &self,
        dp: &DataPath,
        addr: StripeAddr,
        len: u64,
        targets: &[(usize, Arc<Member>)],
        pre: &(dyn Fn(usize) -> Option<SharedBuf> + Sync),
    ) -> Result<Vec<SharedBuf>> {
        match self {
            Personality::Parity(x) => x.recover_pre(dp, addr, len, targets, pre).await,
            _ => self.recover(dp, addr, len, targets).await,
        }
    }

    pub fn judge(
        &self,
        dp: &DataPath,
        addr: StripeAddr,
        bufs: &[SharedBuf],
        unreadable: &[usize],
        mode: CheckMode,
        vouched: &[Vec<bool>],
    ) -> Result<Judgement> {
        dispatch!(self, judge(dp, addr, bufs, unreadable, mode, vouched))
    }

    pub fn heal_row(
        &self,
        dp: &DataPath,
        addr: StripeAddr,
        rows: &mut [Vec<u8>],
        lost: &[usize],
    ) -> Result<()> {
        dispatch!(self, heal_row(dp, addr, rows, lost))
    }
}
