//! raid1 and raid10: every member of a group holds the same data. Reads go to one copy
//! (spread over the copies by stripe) and fall over to the next; a copy that failed to
//! read is rewritten from a good one. Writes reach every copy, inside the write-intent
//! bitmap (copies that a crash left different are resynced) and the stripe lock.

use super::{patches_within, CheckMode, Family, Judgement, Patch, BLOCK};
use crate::buf::{AlignedBuf, SharedBuf};
use crate::datapath::{all_done, slice_of, DataPath, Target};
use crate::dev::IoClass;
use crate::error::{Error, Result};
use crate::member::Member;
use crate::placement::StripeAddr;
use std::sync::Arc;

pub(crate) struct Mirror;

/// Read from the first copy that answers; copies that failed are rewritten from it unless
/// the caller holds the stripe lock (`locked`: a write follows that rewrites every copy
/// anyway).
async fn read_copies(
    dp: &DataPath,
    addr: StripeAddr,
    moff: u64,
    dst: SharedBuf,
    locked: bool,
) -> Result<()> {
    let st = dp.state.load_full();
    let len = dst.len() as u64;
    // Spread reads over the copies: start at a copy chosen by the stripe.
    let mut order: Vec<Arc<Member>> = Vec::new();
    for slot in dp.map.copies_from(addr) {
        if let Some(m) = st.slots[slot].readable(moff + len) {
            order.push(m.clone());
        }
    }
    if order.is_empty() {
        return Err(Error::Failed(
            format!("group {} has no readable copy", addr.group).into(),
        ));
    }
    // Copies that failed, with their error: a checksum mismatch is judged once a good
    // copy is found (`DataPath::heal`: a damaged tag, or wrong data).
    let mut bad: Vec<(Arc<Member>, std::io::Error)> = Vec::new();
    for m in &order {
        match dp.mread(m, moff, dst.clone(), IoClass::Foreground).await {
            Ok(()) => {
                if locked {
                    // The lock is held and `dst` was read under it: heal here (a write
                    // follows that rewrites every copy, but the judgement counts).
                    for (m, e) in bad {
                        dp.heal(&m, moff, dst.clone(), IoClass::Foreground, &e)
                            .await;
                    }
                } else if !bad.is_empty() {
                    repair_copies(dp, addr, moff, &dst, bad).await;
                }
                return Ok(());
            }
            Err(e) => {
                dp.note_read_error_to_heal(m, &e).await;
                bad.push((m.clone(), e));
            }
        }
    }
    // No copy to judge them by: mismatches count as wrong data.
    for (m, e) in &bad {
        dp.unhealed(m, e).await;
    }
    Err(Error::Failed(
        format!(
            "no copy of group {} could be read at member offset {moff}",
            addr.group
        )
        .into(),
    ))
}

/// Heal copies that failed to read from a good copy read again under the lock (see
/// `DataPath::heal`: a damaged tag is rewritten, wrong data rewritten and counted).
async fn repair_copies(
    dp: &DataPath,
    addr: StripeAddr,
    moff: u64,
    good: &SharedBuf,
    bad: Vec<(Arc<Member>, std::io::Error)>,
) {
    let _lock = dp.locks.lock(addr.group, addr.stripe).await;
    let st = dp.state.load_full();
    let len = good.len() as u64;
    let mut bad = bad;
    let others: Vec<Arc<Member>> = dp
        .map
        .group_slots(addr.group)
        .filter_map(|slot| st.slots[slot].readable(moff + len))
        .filter(|m| !bad.iter().any(|(b, _)| Arc::ptr_eq(b, m)))
        .cloned()
        .collect();
    // The first of the other copies that reads (one that fails joins the ones healed).
    let fresh = AlignedBuf::for_overwrite(len as usize).into_shared();
    let mut read = false;
    for src in others {
        match dp
            .mread(&src, moff, fresh.clone(), IoClass::Foreground)
            .await
        {
            Ok(()) => {
                read = true;
                break;
            }
            Err(e) => {
                dp.note_read_error_to_heal(&src, &e).await;
                bad.push((src, e));
            }
        }
    }
    for (m, e) in bad {
        match read {
            true => {
                dp.heal(&m, moff, fresh.clone(), IoClass::Foreground, &e)
                    .await;
            }
            false => dp.unhealed(&m, &e).await,
        }
    }
}

async fn write_chunk(
    dp: &DataPath,
    addr: StripeAddr,
    moff: u64,
    src: SharedBuf,
    fua: bool,
    patches: Vec<Patch>,
) -> Result<()> {
    let _region = dp.enter_region(moff).await?;
    let _lock = dp.locks.lock(addr.group, addr.stripe).await;
    for p in &patches {
        let old = AlignedBuf::for_overwrite(BLOCK as usize).into_shared();
        read_copies(dp, addr, moff + p.at as u64, old.clone(), true).await?;
        p.merge(&src, &old);
    }
    let st = dp.state.load_full();
    let targets: Vec<Target> = dp
        .map
        .group_slots(addr.group)
        .flat_map(|slot| st.slots[slot].write_targets().map(move |m| (slot, m)))
        .map(|(slot, m)| Target {
            slot,
            member: m.clone(),
            offset: moff,
            buf: src.clone(),
            crcs: None,
        })
        .collect();
    if targets.is_empty() {
        return Err(Error::Failed(
            format!("group {} has no working copy", addr.group).into(),
        ));
    }
    dp.write_targets(targets, fua, IoClass::Foreground, Some(addr))
        .await
}

impl Family for Mirror {
    async fn read(&self, dp: &DataPath, offset: u64, out: &SharedBuf) -> Result<()> {
        let futs = dp.map.map(offset, out.len() as u64).into_iter().map(|p| {
            let dst = out.slice(p.buf_off as usize..(p.buf_off + p.len) as usize);
            read_copies(dp, p.addr, p.moff, dst, false)
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
        let futs = dp.map.map(offset, data.len() as u64).into_iter().map(|p| {
            let src = data.slice(p.buf_off as usize..(p.buf_off + p.len) as usize);
            write_chunk(
                dp,
                p.addr,
                p.moff,
                src,
                fua,
                patches_within(patches, p.buf_off, p.len),
            )
        });
        all_done(futs).await
    }

    async fn zero(&self, dp: &DataPath, offset: u64, len: u64, punch: bool) -> Result<()> {
        let futs = dp.map.map(offset, len).into_iter().map(|p| async move {
            let _region = dp.enter_region(p.moff).await?;
            let _lock = dp.locks.lock(p.addr.group, p.addr.stripe).await;
            let slots: Vec<usize> = dp.map.group_slots(p.addr.group).collect();
            dp.zero_slots(&slots, p.moff, p.len, punch, Some(p.addr))
                .await
        });
        all_done(futs).await
    }

    /// Every target gets the first copy that reads.
    async fn recover(
        &self,
        dp: &DataPath,
        addr: StripeAddr,
        len: u64,
        targets: &[(usize, Arc<Member>)],
    ) -> Result<Vec<SharedBuf>> {
        let st = dp.state.load_full();
        let base = dp.map.stripe_offset(addr.stripe);
        let buf = AlignedBuf::for_overwrite(len as usize).into_shared();
        let mut bad: Vec<(Arc<Member>, std::io::Error)> = Vec::new();
        for slot in dp.map.group_slots(addr.group) {
            if let Some(m) = st.slots[slot].readable(base + len) {
                match dp.mread(m, base, buf.clone(), IoClass::Background).await {
                    Ok(()) => {
                        // Sources that failed are healed from it (the stripe is locked).
                        for (m, e) in bad {
                            dp.heal(&m, base, buf.clone(), IoClass::Background, &e)
                                .await;
                        }
                        return Ok(targets.iter().map(|_| buf.clone()).collect());
                    }
                    Err(e) => {
                        dp.note_read_error_to_heal(m, &e).await;
                        bad.push((m.clone(), e));
                    }
                }
            }
        }
        for (m, e) in &bad {
            dp.unhealed(m, e).await;
        }
        Err(Error::Failed(
            format!(
                "no readable copy in group {} at member offset {base}",
                addr.group
            )
            .into(),
        ))
    }

    /// Copies compared block by block. A majority of three or more copies wins, and
    /// locates the copies that differ; otherwise the first copy wins and nobody is blamed
    /// (two copies that differ cannot say which is wrong; md rewrites likewise). A resync
    /// after a crash expects differences: it blames nobody.
    fn judge(
        &self,
        dp: &DataPath,
        addr: StripeAddr,
        bufs: &[SharedBuf],
        unreadable: &[usize],
        mode: CheckMode,
        vouched: &[Vec<bool>],
    ) -> Result<Judgement> {
        let chunk = dp.geometry.chunk as usize;
        let w = bufs.len();
        let mut out = Judgement::default();
        let good: Vec<usize> = (0..w).filter(|i| !unreadable.contains(i)).collect();
        if good.is_empty() {
            return Err(Error::Failed(
                format!(
                    "no copy of group {} stripe {} could be read",
                    addr.group, addr.stripe
                )
                .into(),
            ));
        }
        for row in (0..chunk).step_by(BLOCK as usize) {
            let rows: Vec<&[u8]> = good
                .iter()
                .map(|&i| &slice_of(&bufs[i])[row..row + BLOCK as usize])
                .collect();
            let same = rows.iter().all(|r| *r == rows[0]);
            if same && unreadable.is_empty() {
                continue;
            }
            if !same {
                out.mismatched_blocks += 1;
            }
            let majority = (rows.len() >= 3)
                .then(|| {
                    rows.iter()
                        .find(|r| rows.iter().filter(|x| x == r).count() * 2 > rows.len())
                })
                .flatten()
                .copied();
            // After a crash, a copy its checksum vouches for holds a version the client
            // may see (old or new); one that fails it may be corrupt.
            let vouched = good
                .iter()
                .position(|&i| vouched.get(i).is_some_and(|v| v[row / BLOCK as usize]))
                .map(|j| rows[j]);
            let winner = majority.or(vouched).unwrap_or(rows[0]);
            let fix = AlignedBuf::from_slice(winner).into_shared();
            for i in 0..w {
                let differs = unreadable.contains(&i)
                    || &slice_of(&bufs[i])[row..row + BLOCK as usize] != winner;
                if differs {
                    if !unreadable.contains(&i) && majority.is_some() && mode != CheckMode::Resync {
                        *out.blame.entry(i).or_default() += 1;
                    }
                    if mode != CheckMode::Check || unreadable.contains(&i) {
                        out.rewrite.push((i, row as u64, fix.clone()));
                    }
                }
            }
        }
        Ok(out)
    }

    fn heal_row(
        &self,
        _dp: &DataPath,
        _addr: StripeAddr,
        rows: &mut [Vec<u8>],
        lost: &[usize],
    ) -> Result<()> {
        let Some(good) = (0..rows.len()).find(|i| !lost.contains(i)) else {
            return Err(Error::Failed("no copy left to heal from".into()));
        };
        let src = rows[good].clone();
        for &i in lost {
            rows[i].copy_from_slice(&src);
        }
        Ok(())
    }
}
