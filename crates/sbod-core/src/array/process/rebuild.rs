//! Rebuild: every member that is rebuilding (a spare taken over, a replacement, a member
//! back from being out) is filled stripe by stripe from what its RAID family recovers,
//! resumably (progress persisted), only where needed (a bitmap recovery skips regions
//! nothing was written to), and promoted once durable.

use super::{ProcessKind, Throttle, PIPELINE};
use crate::array::{Array, Member, State};
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

impl Array {
    /// Rebuild every slot that is rebuilding or being replaced, resumably.
    pub(super) async fn rebuild(self: &Arc<Self>) -> Result<()> {
        let chunk = self.dp().geometry.chunk as u64;
        let total = self.dp().geometry.member_size;
        if rebuild_targets(&self.dp().state.load_full(), &self.dp().map.spared()).is_empty() {
            return Ok(());
        }
        let handle = self.claim(ProcessKind::Rebuild, total)?;

        let mut throttle = Throttle::new();
        let mut last_persist = Instant::now();
        let result: Result<()> = async {
            loop {
                let st = self.dp().state.load_full();
                if let Some(why) = &st.failed {
                    return Err(Error::Failed(why.clone().into()));
                }
                let targets = rebuild_targets(&st, &self.dp().map.spared());
                if targets.is_empty() {
                    return Ok(());
                }
                let start = targets
                    .iter()
                    .map(|t| t.progress.load(Ordering::Acquire))
                    .min()
                    .unwrap_or(0)
                    / chunk;
                let end = targets.iter().map(|t| t.member.size).max().unwrap_or(0) / chunk;
                handle.total.store(end * chunk, Ordering::Relaxed);
                let event = self.event.load(Ordering::Acquire);
                let mut t = start;
                while t < end {
                    if handle.cancelled() || self.dp().closing.load(Ordering::Acquire) {
                        self.checkpoint().await;
                        return Ok(());
                    }
                    // Stripes no target needs (a bitmap recovery over regions nothing was
                    // written to) are passed over without I/O.
                    let next = self.next_needed(&targets, t * chunk).map(|o| o / chunk);
                    let skip_to = next.unwrap_or(end).min(end);
                    if skip_to > t {
                        t = skip_to;
                        for x in &targets {
                            let off = (t * chunk).min(x.member.size);
                            if x.progress.load(Ordering::Acquire) < off {
                                x.progress.store(off, Ordering::Release);
                            }
                        }
                        handle.done.store(t * chunk, Ordering::Relaxed);
                        continue;
                    }
                    // A window of stripes in flight at once keeps every member busy;
                    // progress only advances past stripes that are all done.
                    let w_end = (t + PIPELINE).min(end);
                    let mut jobs = Vec::new();
                    for tt in t..w_end {
                        let mut groups: Vec<usize> = targets
                            .iter()
                            .filter(|x| self.target_needs(x, self.dp().map.stripe_offset(tt)))
                            .filter_map(|x| self.dp().map.group_at(tt, x.slot))
                            .collect();
                        groups.sort_unstable();
                        groups.dedup();
                        jobs.extend(groups.into_iter().map(|group| {
                            let addr = StripeAddr { group, stripe: tt };
                            self.rebuild_stripe(addr, &targets)
                        }));
                    }
                    let mut bytes = 0;
                    for r in futures::future::join_all(jobs).await {
                        bytes += r?;
                    }
                    for x in &targets {
                        let off = w_end * chunk;
                        if x.progress.load(Ordering::Acquire) < off {
                            x.progress.store(off.min(x.member.size), Ordering::Release);
                        }
                    }
                    handle.done.store(w_end * chunk, Ordering::Relaxed);
                    throttle.pace(self, bytes).await;
                    if last_persist.elapsed() > Duration::from_secs(2) {
                        self.checkpoint().await;
                        last_persist = Instant::now();
                    }
                    t = w_end;
                    if self.event.load(Ordering::Acquire) != event {
                        // Membership changed (a new target or a failure): plan again.
                        break;
                    }
                }
                self.finish_targets().await;
            }
        }
        .await;
        handle.finish(result.as_ref().err().map(|e| e.to_string()));
        result
    }

    /// Run any pending rebuild now, in the caller's task (offline tools show progress from
    /// `current_process`). Returns when every target is rebuilt, or on failure.
    pub async fn rebuild_now(self: &Arc<Self>) -> Result<()> {
        loop {
            let running = self.bg.process.lock().clone().filter(|p| !p.is_finished());
            if let Some(p) = running {
                if p.kind != ProcessKind::Rebuild {
                    p.cancel();
                }
                p.wait().await;
                continue;
            }
            let st = self.dp().state.load_full();
            if let Some(why) = &st.failed {
                return Err(Error::Failed(why.clone().into()));
            }
            if self.spare_work(&st).is_some() {
                match self.spare_transition().await {
                    Err(Error::Busy(_)) => continue,
                    other => other?,
                }
                continue;
            }
            if rebuild_targets(&st, &self.dp().map.spared()).is_empty() {
                return Ok(());
            }
            match self.rebuild().await {
                Err(Error::Busy(_)) => continue,
                other => other?,
            }
        }
    }

    /// Promote targets that are complete: their data is made durable, the new state is
    /// recorded on the members, and only then used (a retired member stops getting writes
    /// only once no superblock says it is in service).
    async fn finish_targets(&self) {
        let complete = |st: &State| {
            st.slots.iter().any(|s| {
                (s.state == SlotState::Rebuilding
                    && s.recovery.load(Ordering::Acquire)
                        >= s.member.as_ref().map(|m| m.size).unwrap_or(0))
                    || s.replacement.as_ref().is_some_and(|(m, off)| {
                        off.load(Ordering::Acquire) >= m.size && s.state == SlotState::Active
                    })
            })
        };
        let st = self.dp().state.load_full();
        if !complete(&st) || self.dp().flush().await.is_err() {
            return;
        }
        // About to be in sync: they carry the whole bitmap first.
        let joining: Vec<Arc<Member>> = st
            .slots
            .iter()
            .flat_map(|s| {
                let main = (s.state == SlotState::Rebuilding)
                    .then(|| s.member.clone())
                    .flatten();
                main.into_iter()
                    .chain(s.replacement.as_ref().map(|(m, _)| m.clone()))
            })
            .collect();
        self.dp().sync_bitmap(&joining).await;
        let _g = self.mgmt.lock().await;
        let st = self.dp().state.load_full();
        let mut new = (*st).clone();
        let mut retired = Vec::new();
        let mut done = Vec::new();
        let mut changed = false;
        for s in new.slots.iter_mut() {
            if s.state == SlotState::Rebuilding {
                let size = s.member.as_ref().map(|m| m.size).unwrap_or(0);
                if s.recovery.load(Ordering::Acquire) >= size {
                    s.state = SlotState::Active;
                    s.out = None;
                    s.bitmap_recovery = false;
                    s.note = None;
                    changed = true;
                    if let Some(m) = &s.member {
                        done.push(m.uuid);
                    }
                    tracing::info!(member = %s.member.as_ref().map(|m| m.path.as_str()).unwrap_or("?"), "rebuild complete");
                }
            }
            if let Some((m, off)) = &s.replacement {
                if off.load(Ordering::Acquire) >= m.size && s.state == SlotState::Active {
                    let (m, _) = s.replacement.take().expect("replacement");
                    if let Some(old) = s.member.replace(m.clone()) {
                        retired.push(old);
                    }
                    s.entry = Some(m.entry());
                    done.push(m.uuid);
                    changed = true;
                    tracing::info!(member = %m.path, "replacement complete");
                }
            }
        }
        if !changed {
            return;
        }
        self.decide_failed(&mut new);
        let lost = self.commit(new).await;
        for u in &done {
            self.end_recovery(u, true);
        }
        drop(_g);
        for m in retired {
            // The old member leaves the array: wipe its claim.
            let z = AlignedBuf::zeroed(2 * crate::superblock::COPY_SIZE).into_shared();
            let _ = crate::dev::write_at(&m.dev, 0, z, true, IoClass::Background).await;
            m.dev.close();
        }
        for m in lost {
            self.fail_member(&m, OutReason::MetadataWrite).await;
        }
    }

    /// Does rebuild target `x` still need member offset `off`? A bitmap recovery needs
    /// only regions whose bit is set: a region clean now was clean when the member came
    /// back (bits are not cleared while a slot is out), and every write since reached it.
    fn target_needs(&self, x: &Target, off: u64) -> bool {
        x.progress.load(Ordering::Acquire) <= off
            && off < x.member.size
            && (!x.bitmap
                || self
                    .dp()
                    .bitmap
                    .as_ref()
                    .is_none_or(|b| b.is_dirty(b.region_of(off))))
    }

    /// The lowest member offset at or after `from` some target needs.
    fn next_needed(&self, targets: &[Target], from: u64) -> Option<u64> {
        targets
            .iter()
            .filter_map(|x| {
                let start = from.max(x.progress.load(Ordering::Acquire));
                if start >= x.member.size {
                    return None;
                }
                match (&self.dp().bitmap, x.bitmap) {
                    (Some(b), true) => {
                        let first = b.region_of(start);
                        (first..b.regions)
                            .find(|&r| b.is_dirty(r))
                            .map(|r| (r * b.region).max(start))
                            .filter(|&o| o < x.member.size)
                    }
                    _ => Some(start),
                }
            })
            .min()
    }

    /// Rebuild member offsets `[t*chunk, (t+1)*chunk)` of every target in the group (or
    /// concat slot) `key`. Returns bytes written.
    async fn rebuild_stripe(&self, addr: StripeAddr, plan: &[Target]) -> Result<u64> {
        let chunk = self.dp().geometry.chunk as u64;
        // A grow swaps the view only between stripes (see `ViewGate`).
        let _pass = self.gate.enter().await;
        let dp = self.dp();
        let _lock = dp.locks.lock(addr.group, addr.stripe).await;
        let st = self.dp().state.load_full();
        let base = self.dp().map.stripe_offset(addr.stripe);
        let slots = self.dp().map.stripe_slots(addr);
        let targets: Vec<(usize, Arc<Member>)> = rebuild_targets(&st, &self.dp().map.spared())
            .into_iter()
            .filter(|x| slots.contains(&x.slot) && self.target_needs(x, base))
            // Only the targets of this pass: one that joined meanwhile is planned next,
            // from its own progress.
            .filter(|x| plan.iter().any(|p| Arc::ptr_eq(&p.member, &x.member)))
            .map(|x| (x.slot, x.member))
            .collect();
        if targets.is_empty() {
            return Ok(0);
        }
        let len = chunk.min(targets[0].1.size - base);
        let bufs = self.fam().recover(&self.dp(), addr, len, &targets).await?;
        let writes = targets.into_iter().map(|(_, m)| m).zip(bufs);
        let mut bytes = 0;
        let mut full = Vec::new();
        for (mem, buf) in writes {
            let n = buf.len() as u64;
            bytes += n;
            let r = self
                .dp()
                .mwrite(&mem, base, buf, false, IoClass::Background)
                .await;
            if r.is_ok() {
                self.note_recovered(&mem.uuid, n);
            }
            if let Err(e) = r {
                if self
                    .dp()
                    .write_failed(&mem, &e, reason::REBUILD_WRITE)
                    .await
                    == WriteFault::NoSpace
                {
                    full.push(mem);
                }
            }
        }
        if !full.is_empty() {
            // Out of space: the rebuild pauses here (its progress stays before this
            // stripe) and the supervisor tries again; the member stays.
            return Err(self.dp().nospace_error(&full));
        }
        Ok(bytes)
    }
}

/// A member being rebuilt.
pub(super) struct Target {
    slot: usize,
    member: Arc<Member>,
    /// Valid below this member offset.
    progress: Arc<AtomicU64>,
    /// Only the regions the write-intent bitmap marks.
    bitmap: bool,
}

/// Every member being rebuilt (not those of slots in a declustered layout's distributed
/// spare space: those are copied back from there, see `spare.rs`).
pub(super) fn rebuild_targets(st: &State, sp: &crate::placement::Spared) -> Vec<Target> {
    let mut v = Vec::new();
    for (i, s) in st.slots.iter().enumerate() {
        if sp.involves(i) {
            continue;
        }
        if s.state == SlotState::Rebuilding {
            if let Some(m) = &s.member {
                v.push(Target {
                    slot: i,
                    member: m.clone(),
                    progress: s.recovery.clone(),
                    bitmap: s.bitmap_recovery,
                });
            }
        }
        if let Some((m, off)) = &s.replacement {
            if s.state == SlotState::Active {
                v.push(Target {
                    slot: i,
                    member: m.clone(),
                    progress: off.clone(),
                    bitmap: false,
                });
            }
        }
    }
    v
}
