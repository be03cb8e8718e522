//! raid0 and concat: every byte on one member, no redundancy. A read or write is one member
//! I/O per contiguous run; a member's failure fails the array. The stripe locks order a
//! write with a replacement's copy of the same chunks (the only rebuild there is).

use super::{patches_within, CheckMode, Family, Judgement, Patch, BLOCK};
use crate::buf::{AlignedBuf, SharedBuf};
use crate::datapath::{all_done, DataPath, Target};
use crate::dev::IoClass;
use crate::error::{Error, Result};
use crate::member::Member;
use crate::placement::{Extent, StripeAddr};
use std::sync::Arc;

pub(crate) struct Plain;

/// The pieces of a range, one member each, with neighbours that are contiguous on the same
/// member and in the buffer merged into one member I/O.
fn runs(dp: &DataPath, offset: u64, len: u64) -> Vec<Extent> {
    let mut out: Vec<Extent> = Vec::new();
    for d in dp.map.map(offset, len) {
        match out.last_mut() {
            Some(l)
                if l.slot == d.slot
                    && l.moff + l.len == d.moff
                    && l.buf_off + l.len == d.buf_off =>
            {
                l.len += d.len
            }
            _ => out.push(d),
        }
    }
    out
}

/// Read from the one member that holds this data.
pub(crate) async fn read_direct(
    dp: &DataPath,
    slot: usize,
    moff: u64,
    dst: SharedBuf,
) -> Result<()> {
    let st = dp.state.load_full();
    let m = st.slots[slot]
        .readable(moff + dst.len() as u64)
        .ok_or_else(|| Error::Failed(format!("slot {slot} has no working member").into()))?
        .clone();
    if let Err(e) = dp.mread(&m, moff, dst, IoClass::Foreground).await {
        dp.note_read_error(&m, &e).await;
        return Err(Error::io(format!("reading {}", m.path), e));
    }
    Ok(())
}

/// A write with no redundancy: one member (and its replacement, if one is being copied:
/// hence the locks, which order this write with the copy of its chunks).
async fn write_run(
    dp: &DataPath,
    run: Extent,
    src: SharedBuf,
    fua: bool,
    patches: Vec<Patch>,
) -> Result<()> {
    // The bitmap (present with checksums) covers the tags of what this writes.
    let _regions = dp.enter_range(run.moff, run.len).await?;
    let mut _locks = Vec::new();
    for t in dp.map.stripe_at(run.moff)..dp.map.stripe_at(run.moff + run.len - 1) + 1 {
        // Ascending order; the copy holds one lock at a time, so this cannot deadlock.
        _locks.push(dp.locks.lock(run.addr.group, t).await);
    }
    for p in &patches {
        let old = AlignedBuf::for_overwrite(BLOCK as usize).into_shared();
        read_direct(dp, run.slot, run.moff + p.at as u64, old.clone()).await?;
        p.merge(&src, &old);
    }
    // A guard, not a clone of the state: nothing here waits while it is held.
    let targets: Vec<Target> = dp.state.load().slots[run.slot]
        .write_targets()
        .map(|m| Target {
            slot: run.slot,
            member: m.clone(),
            offset: run.moff,
            buf: src.clone(),
            crcs: None,
        })
        .collect();
    if targets.is_empty() {
        return Err(Error::Failed(
            format!("slot {} has no working member", run.slot).into(),
        ));
    }
    // One copy: a write refused for space leaves nothing inconsistent to resync.
    dp.write_targets(targets, fua, IoClass::Foreground, None)
        .await
}

impl Family for Plain {
    async fn read(&self, dp: &DataPath, offset: u64, out: &SharedBuf) -> Result<()> {
        let futs = runs(dp, offset, out.len() as u64).into_iter().map(|d| {
            let dst = out.slice(d.buf_off as usize..(d.buf_off + d.len) as usize);
            read_direct(dp, d.slot, d.moff, dst)
        });
        futures::future::try_join_all(futs).await?;
        Ok(())
    }

    async fn write(
        &self,
        dp: &DataPath,
        offset: u64,
        data: &SharedBuf,
        fua: bool,
        patches: &[Patch],
    ) -> Result<()> {
        let futs = runs(dp, offset, data.len() as u64).into_iter().map(|d| {
            let src = data.slice(d.buf_off as usize..(d.buf_off + d.len) as usize);
            write_run(dp, d, src, fua, patches_within(patches, d.buf_off, d.len))
        });
        all_done(futs).await
    }

    async fn zero(&self, dp: &DataPath, offset: u64, len: u64, punch: bool) -> Result<()> {
        let futs = runs(dp, offset, len).into_iter().map(|d| async move {
            let _regions = dp.enter_range(d.moff, d.len).await?;
            dp.zero_slot(d.slot, d.moff, d.len, punch, None).await
        });
        all_done(futs).await
    }

    /// Only a replacement can be rebuilt, by copying its slot's member.
    async fn recover(
        &self,
        dp: &DataPath,
        addr: StripeAddr,
        len: u64,
        targets: &[(usize, Arc<Member>)],
    ) -> Result<Vec<SharedBuf>> {
        let st = dp.state.load_full();
        let base = dp.map.stripe_offset(addr.stripe);
        let mut out = Vec::new();
        for (slot, _) in targets {
            let src = st.slots[*slot]
                .readable(base + len)
                .ok_or_else(|| {
                    Error::Failed(format!("slot {slot} has no readable member to copy from").into())
                })?
                .clone();
            let buf = AlignedBuf::for_overwrite(len as usize).into_shared();
            if let Err(e) = dp.mread(&src, base, buf.clone(), IoClass::Background).await {
                dp.note_read_error(&src, &e).await;
                return Err(Error::io(format!("copying from {}", src.path), e));
            }
            out.push(buf);
        }
        Ok(out)
    }

    /// Nothing to compare without redundancy.
    fn judge(
        &self,
        _dp: &DataPath,
        _addr: StripeAddr,
        _bufs: &[SharedBuf],
        _unreadable: &[usize],
        _mode: CheckMode,
        _vouched: &[Vec<bool>],
    ) -> Result<Judgement> {
        Ok(Judgement::default())
    }

    fn heal_row(
        &self,
        _dp: &DataPath,
        _addr: StripeAddr,
        _rows: &mut [Vec<u8>],
        _lost: &[usize],
    ) -> Result<()> {
        Err(Error::Failed("no redundancy to rebuild from".into()))
    }
}
