//! The write-intent bitmap on the members: the engine's side of [`crate::bitmap`].
//!
//! Every write that may leave redundancy disagreeing with data enters its region first
//! ([`DataPath::enter_region`]): the region's bit is made durable on every member before
//! the write is issued. Regions idle for a sweep are cleared lazily
//! ([`DataPath::clear_idle`], run by the array's sweeper once the membership allows it).
//! Members that join get the whole bitmap ([`DataPath::sync_bitmap`]), and stripes that a
//! write left inconsistent keep their regions dirty until resynced
//! ([`DataPath::defer_resync`]).

use super::{DataPath, WriteFault};
use crate::bitmap::{BITS_PER_BLOCK, BLOCK};
use crate::buf::AlignedBuf;
use crate::dev::{self, IoClass};
use crate::error::{Error, Result};
use crate::member::Member;
use crate::superblock::{OutReason, BITMAP_OFFSET};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Counts a write in flight in a bitmap region; leaves it on drop.
pub(crate) struct RegionGuard<'a> {
    dp: &'a DataPath,
    region: Option<u64>,
}

impl Drop for RegionGuard<'_> {
    fn drop(&mut self) {
        if let (Some(r), Some(bm)) = (self.region, self.dp.bitmap.as_ref()) {
            bm.leave(r);
        }
    }
}

impl DataPath {
    /// Mark the bitmap region of member offset `off` dirty (durably) before writing it.
    pub(crate) async fn enter_region(&self, off: u64) -> Result<RegionGuard<'_>> {
        let Some(bm) = self.bitmap.as_ref() else {
            return Ok(RegionGuard {
                dp: self,
                region: None,
            });
        };
        let r = bm.region_of(off);
        if bm.try_enter(r) {
            return Ok(RegionGuard {
                dp: self,
                region: Some(r),
            });
        }
        let blk = (r / BITS_PER_BLOCK) as usize;
        let mut img = bm.blocks[blk].lock().await;
        let guard = RegionGuard {
            dp: self,
            region: Some(r),
        };
        if bm.enter_locked(r, &mut img) {
            // A writer moving forward: the regions it enters next go in the same write.
            let ahead = bm.ahead_locked(r, &mut img);
            self.write_bitmap_block(blk, &img).await?;
            bm.set_dirty(r);
            for a in ahead {
                bm.set_dirty(a);
            }
        }
        Ok(guard)
    }

    /// Enter every bitmap region of member data `[off, off+len)`, for a write to an array
    /// without redundancy, whose bitmap (there only with checksums) covers its tags across
    /// a crash. Redundant layouts enter their stripe's region themselves.
    pub(crate) async fn enter_range(&self, off: u64, len: u64) -> Result<Vec<RegionGuard<'_>>> {
        let Some(bm) = self.bitmap.as_ref() else {
            return Ok(Vec::new());
        };
        let mut v = Vec::new();
        if len > 0 {
            for r in bm.region_of(off)..=bm.region_of(off + len - 1) {
                v.push(self.enter_region(r * bm.region).await?);
            }
        }
        Ok(v)
    }

    /// Write one bitmap block to every live member, durably.
    pub(crate) async fn write_bitmap_block(&self, blk: usize, img: &[u8]) -> Result<()> {
        if !self.lease.ok() {
            return Err(self.lease.error(&self.name));
        }
        let st = self.state.load_full();
        let buf = AlignedBuf::from_slice(img).into_shared();
        let off = BITMAP_OFFSET + (blk * BLOCK) as u64;
        let members = st.live_members();
        let futs = members.iter().map(|m| {
            let b = buf.clone();
            async move {
                (
                    m.clone(),
                    dev::write_at(&m.dev, off, b, true, IoClass::Foreground).await,
                )
            }
        });
        let mut full = Vec::new();
        for (m, r) in futures::future::join_all(futs).await {
            if let Err(e) = r {
                if self.write_failed(&m, &e, crate::reason::BITMAP_WRITE).await
                    == WriteFault::NoSpace
                {
                    full.push(m);
                }
            }
        }
        self.failed()?;
        if !full.is_empty() {
            // The bit may be on some members only: harmless (assembly takes the union),
            // but the write it guards must not go ahead.
            return Err(self.nospace_error(&full));
        }
        Ok(())
    }

    /// Clear the bits of regions idle since the last sweep. The caller has flushed the
    /// members (what the regions' writes did is durable) and holds the membership's leave
    /// to clear (no member is out: bits are the record of what it missed).
    pub(crate) async fn clear_idle(&self, cand: &[u64]) {
        let Some(bm) = self.bitmap.as_ref() else {
            return;
        };
        let mut i = 0;
        while i < cand.len() {
            let blk = cand[i] / BITS_PER_BLOCK;
            let mut img = bm.blocks[blk as usize].lock().await;
            let mut cleared = Vec::new();
            while i < cand.len() && cand[i] / BITS_PER_BLOCK == blk {
                if bm.begin_clear(cand[i], &mut img) {
                    // Checksums changed after the flush (a write that came and went
                    // meanwhile) keep the region dirty until they are durable.
                    if self.tags_dirty_in_region(cand[i]) {
                        bm.abort_clear(cand[i], &mut img);
                    } else {
                        cleared.push(cand[i]);
                    }
                }
                i += 1;
            }
            if !cleared.is_empty() && self.write_bitmap_block(blk as usize, &img).await.is_ok() {
                for r in cleared {
                    bm.finish_clear(r);
                }
            } else {
                for r in cleared {
                    // Could not write: keep the region dirty.
                    bm.set_dirty(r);
                }
            }
        }
    }

    /// Zero the whole bitmap on every live member (a clean stop with every slot in
    /// service: everything is durable everywhere).
    pub(crate) async fn clear_all(&self) {
        let Some(bm) = &self.bitmap else { return };
        if !self.lease.ok() {
            return;
        }
        let zero = AlignedBuf::zeroed(self.bitmap_bytes as usize).into_shared();
        for m in self.state.load_full().live_members() {
            let _ = dev::write_at(
                &m.dev,
                BITMAP_OFFSET,
                zero.clone(),
                true,
                IoClass::Foreground,
            )
            .await;
        }
        for r in 0..bm.regions {
            bm.finish_clear(r);
        }
    }

    /// Write the whole bitmap to `members`. A member in service must carry every bit that
    /// is set: when it is the only one left in sync, its bitmap is what says what the
    /// others missed. A member that joins (re-added, a spare, a replacement) got only the
    /// blocks written since it joined, so it gets the whole bitmap before it is promoted,
    /// and every member does at assembly (the union of what was found).
    pub(crate) async fn sync_bitmap(&self, members: &[Arc<Member>]) {
        let Some(bm) = &self.bitmap else { return };
        if members.is_empty() || self.read_only.load(Ordering::Acquire) || !self.lease.ok() {
            return;
        }
        let mut failed: Vec<Arc<Member>> = Vec::new();
        for (i, blk) in bm.blocks.iter().enumerate() {
            // Held while written: a bit set meanwhile waits, then reaches them too.
            let img = blk.lock().await;
            let buf = AlignedBuf::from_slice(&img).into_shared();
            let off = BITMAP_OFFSET + (i * BLOCK) as u64;
            let futs = members
                .iter()
                .filter(|m| !failed.iter().any(|f| Arc::ptr_eq(f, m)))
                .map(|m| {
                    let b = buf.clone();
                    async move {
                        let r = dev::write_at(&m.dev, off, b, true, IoClass::Foreground).await;
                        (m.clone(), r)
                    }
                });
            for (m, r) in futures::future::join_all(futs).await {
                if let Err(e) = r {
                    m.stats.write_errors.fetch_add(1, Ordering::Relaxed);
                    tracing::error!(member = %m.path, error = %e, "bitmap write failed");
                    failed.push(m);
                }
            }
        }
        for m in failed {
            self.fail_member(&m, OutReason::MetadataWrite).await;
        }
    }

    /// Hold every stripe of these bitmap regions as inconsistent, for the watch to resync
    /// (a resync that could not run now).
    pub(crate) fn defer_resync(&self, regions: &[u64]) {
        let Some(bm) = self.bitmap.as_ref() else {
            return;
        };
        for &r in regions {
            let from = self.map.stripe_at(r * bm.region);
            let to = self
                .map
                .stripe_at(((r + 1) * bm.region).min(self.geometry.member_size));
            for t in from..to {
                for g in 0..self.map.groups() {
                    bm.unsynced(g, self.map.stripe_offset(t), r);
                }
            }
        }
    }

    /// The error of a stripe write or reconstruction that needs a stripe a write left
    /// inconsistent.
    pub(crate) fn unsynced_error(group: usize, stripe: u64) -> Error {
        Error::io(
            format!("group {group} stripe {stripe}"),
            std::io::Error::other(
                "this stripe was left inconsistent by a write that ran out of space and cannot be reconstructed until it is resynced (that happens by itself once space is free, while all its members are present)",
            ),
        )
    }
}
