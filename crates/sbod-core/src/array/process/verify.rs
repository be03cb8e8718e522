//! What checksums add to the background processes (`--integrity`, see
//! [`crate::integrity`]): the scrub's row-by-row healing of blocks that failed their
//! checksums (the family rebuilds each row), the verify-only scrub of arrays without
//! redundancy, and the crash resync of their checksums.

use super::ProcessHandle;
use crate::array::Array;
use crate::buf::{AlignedBuf, SharedBuf};
use crate::dev::IoClass;
use crate::error::{Error, Result};
use crate::integrity::BLOCK;
use crate::placement::StripeAddr;
use crate::superblock::SlotState;
use std::sync::atomic::Ordering;

impl Array {
    /// The scrub's hook (`check_stripe`): rebuild the rows of stripe `addr` that failed
    /// their checksums (`bad`: position in the group, row offsets in the chunk), row by row
    /// from the other members' rows, into `bufs`: a chunk with one bad block keeps its
    /// other rows, so bad blocks on several members are healed as long as no row has more
    /// than the group survives. Returns the rows to rewrite (position, row offset, data),
    /// and the rows whose member holds what the others rebuild: right data under a damaged
    /// checksum, for their tags to be rewritten (position, row offset).
    ///
    /// A row that more members fail than the group survives may still be judged: some of
    /// them may hold right data under damaged tags. `tags` (by position: the stored tags of
    /// the chunk, for the members that failed them) lets each choice of members to rebuild
    /// (the rest of those that failed taken as they are) be tried: one whose every rebuilt
    /// block is named by its member's own stored tag is the data (a CRC names it; taking
    /// wrong bytes as right would need rebuilt garbage to match a CRC), and the members
    /// taken as they are had damaged tags. If no choice is, the row is an error.
    #[allow(clippy::type_complexity)]
    pub(super) fn heal_rows(
        &self,
        addr: StripeAddr,
        bufs: &[SharedBuf],
        unreadable: &[usize],
        bad: &[(usize, Vec<u64>)],
        tags: &[Option<Vec<u32>>],
    ) -> Result<(Vec<(usize, u64, SharedBuf)>, Vec<(usize, u64)>)> {
        let mut rows: Vec<u64> = bad.iter().flat_map(|(_, r)| r.iter().copied()).collect();
        rows.sort_unstable();
        rows.dedup();
        let w = bufs.len();
        let mut out = Vec::new();
        let mut tags_out = Vec::new();
        for r in rows {
            let mut lost: Vec<usize> = (0..w)
                .filter(|i| {
                    unreadable.contains(i) || bad.iter().any(|(p, rs)| p == i && rs.contains(&r))
                })
                .collect();
            if lost.len() > self.dp().geometry.redundancy() {
                if let Some(s) = self.which_to_rebuild(addr, bufs, r, &lost, unreadable, tags) {
                    // Rebuild `s`; the others that failed hold right data (their tags
                    // are rewritten below, as rows rebuilt as they are).
                    let mut work: Vec<Vec<u8>> =
                        bufs.iter().map(|b| row_of(b, r).to_vec()).collect();
                    self.fam().heal_row(&self.dp(), addr, &mut work, &s)?;
                    for &i in lost.iter().filter(|i| !unreadable.contains(i)) {
                        if row_of(&bufs[i], r) == &work[i][..] {
                            tags_out.push((i, r));
                            continue;
                        }
                        row_of(&bufs[i], r).copy_from_slice(&work[i]);
                        out.push((i, r, AlignedBuf::from_slice(&work[i]).into_shared()));
                    }
                    lost.clear();
                    continue;
                }
                return Err(Error::Failed(
                    format!(
                        "group {} stripe {}, row at {r}: {} of {w} members unreadable or failing their checksums",
                        addr.group,
                        addr.stripe,
                        lost.len()
                    )
                    .into(),
                ));
            }
            let mut work: Vec<Vec<u8>> = bufs.iter().map(|b| row_of(b, r).to_vec()).collect();
            self.fam().heal_row(&self.dp(), addr, &mut work, &lost)?;
            for &i in lost.iter().filter(|i| !unreadable.contains(i)) {
                if row_of(&bufs[i], r) == &work[i][..] {
                    // Rebuilt as it is: the data is right, its checksum is not.
                    tags_out.push((i, r));
                    continue;
                }
                row_of(&bufs[i], r).copy_from_slice(&work[i]);
                out.push((i, r, AlignedBuf::from_slice(&work[i]).into_shared()));
            }
        }
        Ok((out, tags_out))
    }

    /// Which of the members `lost` at row `r` (more than the group survives) to rebuild:
    /// the unreadable ones and some that failed their tags, the others taken as they are,
    /// such that every block rebuilt for a member that failed its tags is named by that
    /// member's stored tag (see [`Array::heal_rows`]). None if no choice is.
    fn which_to_rebuild(
        &self,
        addr: StripeAddr,
        bufs: &[SharedBuf],
        r: u64,
        lost: &[usize],
        unreadable: &[usize],
        tags: &[Option<Vec<u32>>],
    ) -> Option<Vec<usize>> {
        let zeroed = self.dp().tag_layout()?.zeroed;
        let red = self.dp().geometry.redundancy();
        let gone: Vec<usize> = lost
            .iter()
            .copied()
            .filter(|i| unreadable.contains(i))
            .collect();
        let suspects: Vec<usize> = lost
            .iter()
            .copied()
            .filter(|i| !unreadable.contains(i))
            .collect();
        if gone.len() >= red || suspects.len() > 16 {
            return None;
        }
        let b = (self.dp().map.stripe_offset(addr.stripe) + r) / BLOCK;
        let (zt, row) = (crate::integrity::zero_tag(b), (r / BLOCK) as usize);
        // Choices of suspects to rebuild, fewest first (trusting as many as can be).
        let room = red - gone.len();
        for size in 1..=room.min(suspects.len()) {
            for mask in 0u32..(1 << suspects.len()) {
                if mask.count_ones() as usize != size {
                    continue;
                }
                let pick: Vec<usize> = (0..suspects.len())
                    .filter(|j| mask & (1 << j) != 0)
                    .map(|j| suspects[j])
                    .collect();
                let mut s = gone.clone();
                s.extend(&pick);
                let mut work: Vec<Vec<u8>> = bufs.iter().map(|x| row_of(x, r).to_vec()).collect();
                if self
                    .fam()
                    .heal_row(&self.dp(), addr, &mut work, &s)
                    .is_err()
                {
                    continue;
                }
                let named = pick.iter().all(|&i| {
                    tags.get(i)
                        .and_then(|t| t.as_ref())
                        .and_then(|t| t.get(row))
                        .is_some_and(|&cur| {
                            crate::integrity::vouches(
                                cur,
                                crate::integrity::tag(b, &work[i]),
                                zt,
                                zeroed,
                            )
                        })
                });
                if named {
                    return Some(s);
                }
            }
        }
        None
    }

    /// After a crash, retag bitmap regions of an array without redundancy (raid0,
    /// concat): the data there is what it is (a write in flight may or may not have
    /// landed, and none was flushed); its tags are made to agree.
    pub(crate) async fn retag_regions(&self, regions: &[u64]) -> Result<(u64, u64)> {
        let Some(bm) = self.shared.bitmap.as_ref() else {
            return Ok((0, 0));
        };
        let st = self.dp().state.load_full();
        let step = 1u64 << 20;
        let mut bytes = 0;
        for &r in regions {
            for m in st.live_members() {
                let (from, to) = (r * bm.region, ((r + 1) * bm.region).min(m.size));
                let mut off = from;
                while off < to {
                    let n = step.min(to - off);
                    let buf = AlignedBuf::for_overwrite(n as usize).into_shared();
                    if let Err(e) = self
                        .dp()
                        .mread_raw(&m, off, buf.clone(), IoClass::Background)
                        .await
                    {
                        self.dp().note_read_error(&m, &e).await;
                        return Err(Error::io(format!("reading {}", m.path), e));
                    }
                    // SAFETY: the read completed.
                    self.dp()
                        .retag(&m, off, unsafe { buf.as_slice() })
                        .await
                        .map_err(|e| Error::io(format!("reading the tags of {}", m.path), e))?;
                    bytes += n;
                    off += n;
                }
            }
        }
        self.dp().flush().await?;
        tracing::info!(array = %self.dp().name, regions = regions.len(), bytes, "checksums of dirty regions recomputed after an unclean shutdown");
        Ok((bytes, regions.len() as u64))
    }

    /// Scrub an array without redundancy: read every block against its tag. Nothing can
    /// be repaired (there is no other copy); blocks that fail are counted, and reads of
    /// them answer EIO.
    pub(super) async fn verify_pass(&self, h: &ProcessHandle) -> Result<()> {
        let st = self.dp().state.load_full();
        let step = self.dp().geometry.chunk as u64 * 16;
        let mut done = 0;
        for (slot, s) in st.slots.iter().enumerate() {
            let Some(m) = s.member.as_ref().filter(|_| s.state == SlotState::Active) else {
                continue;
            };
            let mut off = 0;
            while off < m.size {
                if h.cancelled() || self.dp().closing.load(Ordering::Acquire) {
                    return Err(Error::Busy("scrub stopped before it finished".into()));
                }
                let n = step.min(m.size - off);
                let buf = AlignedBuf::for_overwrite(n as usize).into_shared();
                // Block by block where a read fails, so each bad block is named.
                if self
                    .dp()
                    .mread(m, off, buf.clone(), IoClass::Background)
                    .await
                    .is_err()
                {
                    for b in (off..off + n).step_by(BLOCK as usize) {
                        let one = AlignedBuf::for_overwrite(BLOCK as usize).into_shared();
                        if let Err(e) = self.dp().mread(m, b, one, IoClass::Background).await {
                            self.dp().note_read_error(m, &e).await;
                            h.mismatches.fetch_add(1, Ordering::Relaxed);
                            h.regions.lock().push(sbod_types::MismatchRegion {
                                group: 0,
                                member_offset: b,
                                volume_offset: self.dp().map.locate(slot, b).unwrap_or(u64::MAX),
                                blocks: 1,
                            });
                        }
                    }
                }
                off += n;
                done += n;
                h.done.store(done, Ordering::Relaxed);
            }
        }
        Ok(())
    }
}

/// Row `r` (a 4 KiB block at offset `r`) of a chunk buffer.
#[allow(clippy::mut_from_ref)]
fn row_of(b: &SharedBuf, r: u64) -> &mut [u8] {
    // SAFETY: the reads completed; the scrub holds the stripe lock and is the buffers'
    // only user, one row at a time.
    let all = unsafe { b.as_mut_slice() };
    &mut all[r as usize..(r + BLOCK) as usize]
}
