//! The distributed spare space of a declustered layout (docs/ENGINE.md, "Declustered
//! layouts"): the **distributed rebuild**, which rebuilds a failed slot's chunks into the
//! spare space of every row (reading from and writing to every survivor), and the
//! **copy-back**, which copies them from there onto the slot's replacement. Both are one
//! transition of the spared list `L -> L'` (`placement::Spared`), walked in member row
//! order a window of rows at a time:
//!
//! 1. every stripe of the window is locked (client requests to it wait);
//! 2. every chunk whose member differs between `L` and `L'` is written to its new place:
//!    read from its old place, else rebuilt from its stripe (`Family::recover`), all the
//!    window's chunks at once;
//! 3. the row boundary moves past the window in memory, before the locks are let go. A
//!    copy-back first flushes the members and records the boundary in the superblocks
//!    (with `mgmt` held, so no other superblock write records an older one): after it,
//!    writes go to the new places only. A distributed rebuild records it every few
//!    seconds (flushed first): its old places are on the failed member, so below a
//!    boundary not yet recorded a crash simply rebuilds those chunks from parity again.
//!
//! So a crash at any point leaves the recorded boundary below every row whose new places
//! were not yet all durable, and rows at and above it are read in `L`, whose places the
//! transition never overwrote: a distributed rebuild writes only spare space no chunk of
//! `L` holds, and a copy-back only the replacement (only the last slot spared is copied
//! back: `Decl::resolved_row` then moves nothing else). The transition is recorded before
//! its first window moves, and resumed from the recorded boundary at the next start.

use super::{ProcessKind, Throttle};
use crate::array::{Array, State};
use crate::buf::AlignedBuf;
use crate::datapath::WriteFault;
use crate::dev::IoClass;
use crate::error::{Error, Result};
use crate::placement::StripeAddr;
use crate::reason;
use crate::superblock::{OutReason, SlotState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Member bytes a window of rows spans (on each member). Windows end in a barrier (every
/// chunk written before the boundary moves), so larger ones keep the members busier: on
/// modelled disks 16 MiB windows rebuilt 24 members in 3.8 s where 4 MiB ones took 5.0 s
/// (docs/PERFORMANCE.md).
const WINDOW_BYTES: u64 = 16 << 20;

/// Chunks a transition moves at once (each holds its stripe's reads).
const IN_FLIGHT: usize = 64;

impl Array {
    /// The transition of the distributed spare space due now, if any: the list to go to.
    /// One under way is resumed; else the last slot spared is copied back when a member
    /// is rebuilding in it (a replacement, or the old member back); else the failed slot
    /// that failed first is spared, while spare space is left.
    pub(super) fn spare_work(&self, st: &State) -> Option<Vec<usize>> {
        let d = self.dp().geometry.declustered?;
        if st.failed.is_some() {
            return None;
        }
        let sp = self.dp().map.spared();
        if let Some(to) = &sp.to {
            return Some(to.clone());
        }
        if let Some(&x) = sp.from.last() {
            let s = &st.slots[x];
            if s.state == SlotState::Rebuilding && s.member.is_some() {
                return Some(sp.from[..sp.from.len() - 1].to_vec());
            }
        }
        if sp.from.len() >= d.spares as usize {
            return None;
        }
        let x = (0..st.slots.len())
            .filter(|&i| st.slots[i].state == SlotState::Failed && !sp.from.contains(&i))
            .min_by_key(|&i| st.slots[i].out.map_or(0, |o| o.event))?;
        let mut to = sp.from.clone();
        to.push(x);
        Some(to)
    }

    /// The failed slots a hot spare may take: those the distributed spare space will not
    /// (all of them but declustered layouts' first failures, while spare space is left).
    pub(crate) fn spare_space_takes(&self, st: &State) -> Vec<usize> {
        let Some(d) = self.dp().geometry.declustered else {
            return Vec::new();
        };
        let sp = self.dp().map.spared();
        let list = sp.to.as_ref().unwrap_or(&sp.from);
        let room = (d.spares as usize).saturating_sub(list.len());
        let mut failed: Vec<usize> = (0..st.slots.len())
            .filter(|&i| {
                matches!(st.slots[i].state, SlotState::Failed | SlotState::Empty) && !sp.involves(i)
            })
            .collect();
        failed.sort_by_key(|&i| st.slots[i].out.map_or(0, |o| o.event));
        failed.truncate(room);
        failed
    }

    /// Walk the transition due (see the module's steps), from its recorded boundary.
    pub(super) async fn spare_transition(self: &Arc<Self>) -> Result<()> {
        let g = self.dp().geometry.clone();
        let chunk = g.chunk as u64;
        let rows = g.member_size.div_ceil(chunk);
        let handle = self.claim(ProcessKind::Rebuild, rows * chunk)?;
        // Decided with the process slot held: another may have run meanwhile.
        let Some(to) = self.spare_work(&self.dp().state.load_full()) else {
            handle.finish(None);
            return Ok(());
        };
        let result = self.spare_walk(&handle, to, rows).await;
        handle.finish(result.as_ref().err().map(|e| e.to_string()));
        result
    }

    async fn spare_walk(
        self: &Arc<Self>,
        handle: &super::ProcessHandle,
        to: Vec<usize>,
        rows: u64,
    ) -> Result<()> {
        let g = self.dp().geometry.clone();
        let chunk = g.chunk as u64;
        let cols = g.groups as usize * g.width as usize;
        let sp = self.dp().map.spared();
        if sp.to.as_ref() != Some(&to) {
            // Recorded before any chunk moves. Requests in flight drain first: a read that
            // found its place in the old state is done before a place can be reused.
            {
                let _x = self.gate.exclusive().await;
                self.dp()
                    .map
                    .set_spared(sp.from.clone(), Some(to.clone()), 0);
            }
            self.record_spares(|| {}).await?;
        }
        let sp = self.dp().map.spared();
        let from = sp.from.clone();
        let copyback = to.len() < from.len();
        let target = if copyback {
            from.last().copied()
        } else {
            to.last().copied()
        };
        let target = target.expect("a transition changes the list");
        tracing::info!(
            array = %self.dp().name,
            slot = target,
            from = ?from,
            to = ?to,
            row = sp.boundary.load(Ordering::Acquire),
            "{}",
            if copyback { "copy-back from the distributed spare space" } else { "distributed rebuild into the spare space" }
        );
        // Windows of at most 16 MiB a member, and at least 16 of them: the boundary moves
        // often enough for a small array to show its progress (and be cut anywhere).
        let window = (WINDOW_BYTES / chunk).min(rows.div_ceil(16)).max(1);
        let mut throttle = Throttle::new();
        let mut last_record = Instant::now();
        loop {
            let t = sp.boundary.load(Ordering::Acquire);
            handle.done.store(t * chunk, Ordering::Relaxed);
            if t >= rows {
                break;
            }
            if handle.cancelled() || self.dp().closing.load(Ordering::Acquire) {
                return Ok(());
            }
            let st = self.dp().state.load_full();
            if let Some(why) = &st.failed {
                return Err(Error::Failed(why.clone().into()));
            }
            if copyback && st.slots[target].state != SlotState::Rebuilding {
                // The replacement failed (or went): the rows copied back lose their copy
                // on it, which their stripes' parity still has. The slot is simply out
                // again, as before the copy-back, and is spared anew from the start.
                tracing::warn!(array = %self.dp().name, slot = target, "copy-back stopped: its member is out");
                let _g = self.mgmt.lock().await;
                self.dp().map.set_spared(to.clone(), None, 0);
                let mut new = (*self.dp().state.load_full()).clone();
                self.decide_failed(&mut new);
                let lost = self.commit(new).await;
                drop(_g);
                for m in lost {
                    self.fail_member(&m, OutReason::MetadataWrite).await;
                }
                return Ok(());
            }
            let end = (t + window).min(rows);
            let dp = self.dp();
            let mut guards = Vec::with_capacity(((end - t) as usize) * g.groups as usize);
            for row in t..end {
                for group in 0..g.groups as usize {
                    guards.push(dp.locks.lock(group, row).await);
                }
            }
            let d = dp.map.declustered().expect("declustered");
            let mut moves = Vec::new();
            for row in t..end {
                let old = d.resolved_row(row, cols, &from);
                let new = d.resolved_row(row, cols, &to);
                for c in 0..cols {
                    if old[c] != new[c] {
                        let addr = StripeAddr {
                            group: c / g.width as usize,
                            stripe: row,
                        };
                        moves.push((addr, old[c], new[c]));
                    }
                }
            }
            // The window's chunks IN_FLIGHT at a time: each survivor gets the reads of
            // many stripes it shares with the failed member queued together (its queue
            // and the drive reorder them by offset), and what is in flight stays bounded.
            use futures::StreamExt;
            let mut done = futures::stream::iter(
                moves
                    .into_iter()
                    .map(|(addr, old, new)| self.move_chunk(addr, old, new)),
            )
            .buffer_unordered(IN_FLIGHT);
            let mut bytes = 0;
            while let Some(r) = done.next().await {
                bytes += r?;
            }
            drop(done);
            if copyback {
                // Durable, and recorded, before a write can go to the new places only: the
                // old ones (still holding the chunks) are what a crash would read.
                dp.flush().await?;
                let st = self.dp().state.load_full();
                self.record_spares(|| {
                    sp.boundary.store(end, Ordering::Release);
                    sp.recorded.store(end, Ordering::Release);
                    st.slots[target]
                        .recovery
                        .store((end * chunk).min(g.member_size), Ordering::Release);
                })
                .await?;
            } else {
                // A distributed rebuild's old places are on the failed member: below a
                // boundary not yet recorded, a crash reads the chunks rebuilt from parity
                // again, as the stripes held them. Recorded every few seconds, flushed first.
                sp.boundary.store(end, Ordering::Release);
                if last_record.elapsed() > Duration::from_secs(2) {
                    dp.flush().await?;
                    self.record_spares(|| sp.recorded.store(end, Ordering::Release))
                        .await?;
                    last_record = Instant::now();
                }
            }
            drop(guards);
            handle.done.store(end * chunk, Ordering::Relaxed);
            throttle.pace(self, bytes).await;
        }
        // Every row moved (and durable): `to` is the list, and a slot copied back is in
        // service.
        self.dp().flush().await?;
        let _g = self.mgmt.lock().await;
        self.dp().map.set_spared(to.clone(), None, 0);
        let mut new = (*self.dp().state.load_full()).clone();
        let s = &mut new.slots[target];
        if copyback && s.state == SlotState::Rebuilding {
            s.state = SlotState::Active;
            s.out = None;
            s.note = None;
            s.bitmap_recovery = false;
            s.recovery = Arc::new(AtomicU64::new(g.member_size));
        }
        // A hot spare, if any, takes the slot now spared: copied back at once.
        self.take_spares(&mut new);
        self.decide_failed(&mut new);
        let lost = self.commit(new).await;
        drop(_g);
        tracing::info!(array = %self.dp().name, slot = target, "{}", if copyback { "copy-back complete" } else { "distributed rebuild complete: full redundancy" });
        for m in lost {
            self.fail_member(&m, OutReason::MetadataWrite).await;
        }
        self.kick();
        Ok(())
    }

    /// Record the spare state on the members after `change` (with `mgmt` held, so no
    /// other superblock write can record an older boundary meanwhile).
    async fn record_spares(&self, change: impl FnOnce()) -> Result<()> {
        let _g = self.mgmt.lock().await;
        change();
        let st = self.dp().state.load_full();
        let lost = self.persist(&st, false).await;
        drop(_g);
        for m in lost {
            self.fail_member(&m, OutReason::MetadataWrite).await;
        }
        match &self.dp().state.load_full().failed {
            Some(why) => Err(Error::Failed(why.clone().into())),
            None => Ok(()),
        }
    }

    /// Write one chunk of `addr` (its stripe locked) from its place `old` to `new`: read
    /// from `old` where that member can be read, else rebuilt from the stripe. A new place
    /// out of service is passed over (its member's own sparing rebuilds it later); one
    /// whose file system is full fails the window (NoSpace), so its boundary stays.
    async fn move_chunk(
        &self,
        addr: StripeAddr,
        old: Option<usize>,
        new: Option<usize>,
    ) -> Result<u64> {
        let dp = self.dp();
        let st = dp.state.load_full();
        let Some(new) = new else {
            return Ok(0);
        };
        let dst = match st.slots[new].state {
            SlotState::Active | SlotState::Rebuilding => st.slots[new].member.clone(),
            _ => None,
        };
        let Some(dst) = dst else {
            return Ok(0);
        };
        let base = dp.map.stripe_offset(addr.stripe);
        let len = (dp.geometry.chunk as u64).min(dp.geometry.member_size - base);
        let mut data = None;
        if let Some(src) = old.and_then(|o| st.slots[o].readable(base + len)) {
            let buf = AlignedBuf::for_overwrite(len as usize).into_shared();
            match dp.mread(src, base, buf.clone(), IoClass::Background).await {
                Ok(()) => data = Some(buf),
                Err(e) => dp.note_read_error_to_heal(src, &e).await,
            }
        }
        let buf = match data {
            Some(b) => b,
            None => {
                // Rebuilt as the old place's shard (rows at the boundary and above are
                // still resolved through the old list).
                let old = old.expect("a chunk has a place");
                let mut v = self
                    .fam()
                    .recover(&dp, addr, len, &[(old, dst.clone())])
                    .await?;
                v.pop().expect("one target")
            }
        };
        if let Err(e) = dp.mwrite(&dst, base, buf, false, IoClass::Background).await {
            if dp.write_failed(&dst, &e, reason::REBUILD_WRITE).await == WriteFault::NoSpace {
                // Out of space, the member still in service: the chunk is not at its new
                // place, which reads below the boundary would take it from. The window
                // stops here (its boundary does not move) and the supervisor tries again,
                // as a rebuild out of space does.
                return Err(dp.nospace_error(&[dst]));
            }
        }
        Ok(len)
    }
}
