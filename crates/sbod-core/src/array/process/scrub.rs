//! Scrub (check, repair) and resync (after a crash, at creation, of stripes a write left
//! inconsistent): each stripe is read whole from every member and judged by the RAID
//! family; the loop rewrites what the family says, blames and fails members located as
//! wrong too often, and reports mismatched regions.

use super::{ProcessHandle, ProcessKind, Throttle, PIPELINE};
use crate::array::{Array, Member};
use crate::buf::{AlignedBuf, SharedBuf};
use crate::datapath::WriteFault;
use crate::dev::IoClass;
use crate::error::{Error, Result};
use crate::family::CheckMode;
use crate::integrity::BLOCK;
use crate::placement::StripeAddr;
use crate::reason;
use sbod_types::MismatchRegion;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What one stripe check found.
#[derive(Default)]
struct StripeCheck {
    mismatched_blocks: u64,
    repaired_blocks: u64,
    /// Checksums found damaged over right data, rewritten.
    tags_repaired: u64,
    /// Resync: a member is missing, nothing was done.
    skipped: bool,
    /// Members a check took out for returning wrong data.
    failed: Vec<String>,
}

impl Array {
    /// Start a scrub: `repair` fixes what it finds. Refused while another process runs or
    /// when redundancy is missing.
    pub fn start_scrub(self: &Arc<Self>, repair: bool) -> Result<Arc<ProcessHandle>> {
        if self.dp().geometry.redundancy() == 0 && self.dp().integrity.is_some() {
            // Checksums can still be verified; nothing can be repaired.
            let h2 = self.claim(ProcessKind::Check, self.dp().geometry.member_size)?;
            let (a, h) = (self.clone(), h2.handle());
            let task = tokio::spawn(async move {
                let r = a.verify_pass(&h2).await;
                h2.finish(r.err().map(|e| e.to_string()));
            });
            self.bg.tasks.lock().push(task);
            return Ok(h);
        }
        if self.dp().geometry.redundancy() == 0 {
            return Err(Error::Invalid(
                format!(
                    "'{}' is {}: there is no redundancy to check",
                    self.dp().name,
                    self.dp().geometry.level
                )
                .into(),
            ));
        }
        let st = self.dp().state.load_full();
        if !self.whole(&st) {
            return Err(Error::Refused(
                format!(
                    "'{}' is degraded: scrub needs every member; replace or rebuild first",
                    self.dp().name
                )
                .into(),
            ));
        }
        let kind = if repair {
            ProcessKind::Repair
        } else {
            ProcessKind::Check
        };
        let stripes = self.dp().geometry.stripes();
        let h2 = self.claim(kind, stripes * self.dp().geometry.chunk as u64)?;
        let a = self.clone();
        let h = h2.handle();
        let task = tokio::spawn(async move {
            let mode = if repair {
                CheckMode::Repair
            } else {
                CheckMode::Check
            };
            let r = a.scrub_pass(&h2, mode, 0, stripes).await;
            if repair {
                // Repaired data must be durable before anyone relies on it.
                let _ = a.dp().flush().await;
            }
            h2.finish(r.err().map(|e| e.to_string()));
        });
        self.bg.tasks.lock().push(task);
        Ok(h)
    }

    /// Check stripes `[from, to)` of every group.
    async fn scrub_pass(
        &self,
        h: &ProcessHandle,
        mode: CheckMode,
        from: u64,
        to: u64,
    ) -> Result<()> {
        let chunk = self.dp().geometry.chunk as u64;
        let mut throttle = Throttle::new();
        let region = self
            .dp()
            .bitmap
            .as_ref()
            .map(|b| b.region)
            .unwrap_or(chunk * 1024);
        let groups = self.dp().map.groups();
        let mut t = from;
        while t < to {
            if h.cancelled() || self.dp().closing.load(Ordering::Acquire) {
                return Err(Error::Busy("scrub stopped before it finished".into()));
            }
            let w_end = (t + PIPELINE).min(to);
            let jobs = (t..w_end).flat_map(|tt| (0..groups).map(move |g| (tt, g)));
            let checks = futures::future::join_all(jobs.clone().map(|(tt, g)| {
                self.check_stripe_in_its_layout(
                    StripeAddr {
                        group: g,
                        stripe: tt,
                    },
                    mode,
                )
            }))
            .await;
            // A member a check failed makes the other stripes in flight see it gone: say
            // what happened to it, not that.
            let failed: Vec<String> = checks
                .iter()
                .filter_map(|c| c.as_ref().ok())
                .flat_map(|c| c.failed.iter().cloned())
                .collect();
            if !failed.is_empty() {
                return Err(Error::Refused(format!(
                    "failed {}; the scrub stops here and the array rebuilds what it held (from a spare, or once replaced)",
                    failed.join(", ")
                ).into()));
            }
            for ((tt, g), c) in jobs.zip(checks) {
                let c = c?;
                if c.skipped {
                    // A resync that cannot run (a member missing): the stripe stays held
                    // as inconsistent, so nothing is rebuilt from its parity, which may
                    // not match (the write hole); the watch resyncs it once it can.
                    self.dp().mark_unsynced(
                        StripeAddr {
                            group: g,
                            stripe: tt,
                        },
                        tt * chunk,
                    );
                }
                if c.mismatched_blocks > 0 {
                    h.mismatches
                        .fetch_add(c.mismatched_blocks, Ordering::Relaxed);
                    let moff = tt * chunk / region * region;
                    let mut regions = h.regions.lock();
                    match regions
                        .iter_mut()
                        .find(|r| r.group == g && r.member_offset == moff)
                    {
                        Some(r) => r.blocks += c.mismatched_blocks,
                        None => regions.push(MismatchRegion {
                            group: g,
                            member_offset: moff,
                            volume_offset: (tt * self.dp().geometry.groups as u64 + g as u64)
                                * self.dp().geometry.stripe_data(),
                            blocks: c.mismatched_blocks,
                        }),
                    }
                }
                h.repaired.fetch_add(c.repaired_blocks, Ordering::Relaxed);
                h.tags_repaired
                    .fetch_add(c.tags_repaired, Ordering::Relaxed);
            }
            h.done.store(w_end * chunk, Ordering::Relaxed);
            throttle
                .pace(
                    self,
                    (w_end - t) * chunk * self.dp().geometry.members() as u64,
                )
                .await;
            t = w_end;
        }
        Ok(())
    }

    /// Write a stripe's rewrites (position in the group, offset in the chunk, data) to
    /// `members`, the chunks at member offset `base`: a member's adjacent rows joined into
    /// one write (a judge gives one 4 KiB row at a time), the members' writes at once. Rows
    /// written one after the other each waited a revolution on a drive with its write
    /// cache off: a resync after the lab's BASELINE (every row differs) ran at 250 KiB/s a
    /// member that way. A member's writes that overlap keep their order, unjoined. Returns
    /// (position, 4 KiB blocks, result) per write; a member's writes stop at its first
    /// error. Call with the stripe lock held. Rewrites never grow a member (one that shrank
    /// is failed instead).
    async fn write_rewrites(
        &self,
        members: &[Arc<Member>],
        base: u64,
        rewrite: Vec<(usize, u64, SharedBuf)>,
    ) -> Vec<(usize, u64, std::io::Result<()>)> {
        let per_member = join_rewrites(rewrite);
        let futs = per_member.into_iter().map(|(i, writes)| async move {
            let mut out = Vec::with_capacity(writes.len());
            for (row, buf) in writes {
                let n = buf.len() as u64 / BLOCK;
                let r = self
                    .dp()
                    .mwrite_in_place(&members[i], base + row, buf, IoClass::Background)
                    .await;
                let stop = r.is_err();
                out.push((i, n, r));
                if stop {
                    break;
                }
            }
            out
        });
        futures::future::join_all(futs)
            .await
            .into_iter()
            .flatten()
            .collect()
    }

    /// `check_stripe` in the layout that holds the stripe's row: during a reshape, a row
    /// below the reshape's position in the new layout's view, a row still holding old
    /// data in the old layout's, a row between (moved away, not yet written anew) nowhere.
    async fn check_stripe_in_its_layout(
        &self,
        addr: StripeAddr,
        mode: CheckMode,
    ) -> Result<StripeCheck> {
        let Some(r) = self.reshaping() else {
            return self.check_stripe(addr, mode).await;
        };
        match r.layout_of(addr.group as u64, addr.stripe) {
            super::reshape::RowIn::New => self.check_stripe(addr, mode).await,
            super::reshape::RowIn::Old => {
                // The old layout's rows over the same member bytes (one, the same row,
                // unless the reshape changes the chunk).
                let mut out = StripeCheck::default();
                for stripe in r.old_rows(addr.stripe) {
                    let old = StripeAddr { stripe, ..addr };
                    let c =
                        crate::array::in_view(r.old.clone(), self.check_stripe(old, mode)).await?;
                    out.mismatched_blocks += c.mismatched_blocks;
                    out.repaired_blocks += c.repaired_blocks;
                    out.tags_repaired += c.tags_repaired;
                    out.skipped |= c.skipped;
                    out.failed.extend(c.failed);
                }
                Ok(out)
            }
            super::reshape::RowIn::Neither => Ok(StripeCheck::default()),
        }
    }

    /// The resync of a parity stripe some of whose members are out: where only parity
    /// chunks are missing (a dedicated parity member that failed, say), every data chunk
    /// is here, so the parity that is here is made to follow the data again (the missing
    /// chunks are rebuilt in full, or from the bitmap, when their members come back).
    /// `None` where a data chunk is missing or a read fails: the stripe stays held as
    /// inconsistent (nothing is rebuilt from parity that may not match). Call with the
    /// stripe lock held.
    async fn resync_with_parity_out(
        &self,
        addr: StripeAddr,
        members: &[Option<Arc<Member>>],
    ) -> Result<Option<StripeCheck>> {
        if !matches!(self.dp().geometry.scheme(), crate::layout::Scheme::Parity { m, .. } if m > 0)
        {
            return Ok(None);
        }
        let chunk = self.dp().geometry.chunk as u64;
        let base = self.dp().map.stripe_offset(addr.stripe);
        let raw = self.dp().crash_resync.load(Ordering::Acquire);
        let bufs: Vec<SharedBuf> = members
            .iter()
            .map(|_| AlignedBuf::zeroed(chunk as usize).into_shared())
            .collect();
        let absent: Vec<usize> = (0..members.len())
            .filter(|&i| members[i].is_none())
            .collect();
        let futs = members.iter().zip(&bufs).map(|(m, b)| async move {
            match (m, raw) {
                (None, _) => Ok(()),
                (Some(m), true) => {
                    self.dp()
                        .mread_raw(m, base, b.clone(), IoClass::Background)
                        .await
                }
                (Some(m), false) => {
                    self.dp()
                        .mread(m, base, b.clone(), IoClass::Background)
                        .await
                }
            }
        });
        if futures::future::join_all(futs)
            .await
            .iter()
            .any(|r| r.is_err())
        {
            return Ok(None);
        }
        let judged = self
            .fam()
            .judge(&self.dp(), addr, &bufs, &absent, CheckMode::Resync, &[])?;
        if judged.skipped {
            return Ok(None);
        }
        // What is here, renumbered: the rewrites of the parity that is here.
        let here: Vec<usize> = (0..members.len()).filter(|i| !absent.contains(i)).collect();
        let at = |i: usize| here.iter().position(|&j| j == i);
        let present: Vec<Arc<Member>> = here.iter().map(|&i| members[i].clone().unwrap()).collect();
        let present_bufs: Vec<SharedBuf> = here.iter().map(|&i| bufs[i].clone()).collect();
        let rewrite: Vec<(usize, u64, SharedBuf)> = judged
            .rewrite
            .into_iter()
            .filter_map(|(i, row, b)| at(i).map(|j| (j, row, b)))
            .collect();
        if raw {
            self.dp()
                .retag_resynced(&present, base, &present_bufs)
                .await;
        }
        let mut out = StripeCheck {
            mismatched_blocks: judged.mismatched_blocks,
            ..Default::default()
        };
        let mut failed = false;
        for (j, n, r) in self.write_rewrites(&present, base, rewrite).await {
            match r {
                Ok(()) => out.repaired_blocks += n,
                Err(e) => {
                    self.dp()
                        .write_failed(&present[j], &e, reason::SCRUB_REPAIR_WRITE)
                        .await;
                    failed = true;
                }
            }
        }
        if failed {
            return Ok(None);
        }
        self.dp().mark_synced(addr);
        Ok(Some(out))
    }

    /// Read a whole stripe of a group, compare redundancy with data, and fix per `mode`.
    async fn check_stripe(&self, addr: StripeAddr, mode: CheckMode) -> Result<StripeCheck> {
        let (g, t) = (addr.group, addr.stripe);
        let chunk = self.dp().geometry.chunk as u64;
        let base = self.dp().map.stripe_offset(t);
        // A grow swaps the view only between stripes (see `ViewGate`).
        let _pass = self.gate.enter().await;
        let dp = self.dp();
        let _lock = dp.locks.lock(g, t).await;
        // A stripe a write left inconsistent is not corrupt: a check passes over it, a
        // repair resyncs it (parity from the data), and nobody is blamed.
        let unsynced = self.dp().is_unsynced(addr);
        if unsynced && mode == CheckMode::Check {
            return Ok(StripeCheck::default());
        }
        let mode = if unsynced { CheckMode::Resync } else { mode };
        let st = self.dp().state.load_full();
        let members: Vec<Option<Arc<Member>>> = self
            .dp()
            .map
            .stripe_slots(addr)
            .into_iter()
            .map(|slot| st.slots[slot].readable(base + chunk).cloned())
            .collect();
        if members.iter().any(|m| m.is_none()) {
            if mode == CheckMode::Resync {
                if let Some(c) = self.resync_with_parity_out(addr, &members).await? {
                    return Ok(c);
                }
                // Nothing to make consistent without it; the checksums of what the others
                // hold are made all the same (a crash leaves them behind the data).
                if self.dp().crash_resync.load(Ordering::Acquire) {
                    self.dp()
                        .retag_chunks(members.iter().flatten(), base, chunk)
                        .await;
                }
                return Ok(StripeCheck {
                    skipped: true,
                    ..Default::default()
                });
            }
            return Err(Error::Refused(
                format!("group {g} lost a member during the scrub").into(),
            ));
        }
        let members: Vec<Arc<Member>> = members.into_iter().map(|m| m.expect("checked")).collect();
        let bufs: Vec<SharedBuf> = members
            .iter()
            .map(|_| AlignedBuf::for_overwrite(chunk as usize).into_shared())
            .collect();
        // The resync after a crash reads what is there: the checksums of a dirty region
        // are made below. (Other resyncs run with checksums that are right.)
        let raw = mode == CheckMode::Resync && self.dp().crash_resync.load(Ordering::Acquire);
        let futs = members.iter().zip(&bufs).map(|(m, b)| async move {
            match raw {
                true => {
                    self.dp()
                        .mread_raw(m, base, b.clone(), IoClass::Background)
                        .await
                }
                false => {
                    self.dp()
                        .mread(m, base, b.clone(), IoClass::Background)
                        .await
                }
            }
        });
        let results = futures::future::join_all(futs).await;
        let mut unreadable = Vec::new();
        // Blocks that failed their checksums: rebuilt row by row from the other members
        // (the rest of their chunk is good), found like mismatches and rewritten below.
        let mut bad_rows = Vec::new();
        // Their errors: judged once the rows are rebuilt (a damaged tag, or wrong data).
        let mut mismatched = Vec::new();
        for (i, r) in results.into_iter().enumerate() {
            if let Err(e) = r {
                match crate::integrity::mismatch_of(&e) {
                    // Not from parity that a resync is about to recompute.
                    Some(x) if mode != CheckMode::Resync => {
                        bad_rows.push((i, x.blocks.iter().map(|b| b - base).collect()));
                        mismatched.push((i, e));
                        continue;
                    }
                    _ => self.dp().note_read_error(&members[i], &e).await,
                }
                unreadable.push(i);
            }
        }
        // The stored tags of the chunks that failed them (to judge a row that more
        // members fail than the group survives: some may be right data, wrong tags).
        let mut tags: Vec<Option<Vec<u32>>> = vec![None; members.len()];
        for (i, _) in &bad_rows {
            tags[*i] = self.dp().member_tags(&members[*i], base, chunk).await.ok();
        }
        let (healed, retag) = match self.heal_rows(addr, &bufs, &unreadable, &bad_rows, &tags) {
            Ok(h) => h,
            Err(x) => {
                // Too little to judge them by: counted, nobody failed for them.
                for (i, e) in &mismatched {
                    self.dp().unhealed(&members[*i], e).await;
                }
                return Err(x);
            }
        };
        // Blocks rebuilt different from what their member holds: wrong data (counted
        // towards failing it); rebuilt the same: right data under a damaged tag (the tag
        // is rewritten, counted apart, the member not blamed).
        for (i, _) in &mismatched {
            let blocks: Vec<u64> = healed
                .iter()
                .filter(|(j, _, _)| j == i)
                .map(|(_, row, _)| base + row)
                .collect();
            if !blocks.is_empty() {
                self.dp()
                    .note_data_errors(&members[*i], &crate::integrity::Mismatch { blocks })
                    .await;
            }
        }
        let mut tags_repaired = 0;
        for (i, row) in retag {
            let m = &members[i];
            let at = row as usize..(row + BLOCK) as usize;
            // SAFETY: the reads completed; the stripe lock is held.
            let data = &unsafe { bufs[i].as_slice() }[at];
            match self.dp().retag(m, base + row, data).await {
                Ok(()) => {
                    self.dp().note_tag_errors(m, 1, base + row);
                    tags_repaired += 1;
                }
                Err(e) => self.dp().note_read_error(m, &e).await,
            }
        }
        // The crash resync of mirrors: which rows of each copy match their checksums.
        let vouched = match raw {
            true => self.dp().rows_vouched(&members, base, &bufs).await,
            false => Vec::new(),
        };
        let judged = self
            .fam()
            .judge(&self.dp(), addr, &bufs, &unreadable, mode, &vouched)?;
        if judged.skipped {
            if raw {
                let read = (0..members.len()).filter(|i| !unreadable.contains(i));
                self.dp()
                    .retag_chunks(read.map(|i| &members[i]), base, chunk)
                    .await;
            }
            return Ok(StripeCheck {
                skipped: true,
                ..Default::default()
            });
        }
        let mut out = StripeCheck {
            mismatched_blocks: judged.mismatched_blocks + healed.len() as u64,
            tags_repaired,
            ..Default::default()
        };
        let blame = judged.blame;
        let mut rewrite = healed;
        rewrite.extend(judged.rewrite);
        if raw {
            // Checksums agree with what the stripe holds; the rewrites below set their
            // own, as any write (one refused for space keeps the tag of what stays).
            self.dp().retag_resynced(&members, base, &bufs).await;
        }
        let mut full = Vec::new();
        for (i, n, r) in self.write_rewrites(&members, base, rewrite).await {
            let m = &members[i];
            match r {
                Ok(()) => {
                    m.stats.repaired.fetch_add(n, Ordering::Relaxed);
                    out.repaired_blocks += n;
                }
                Err(e) => {
                    if self
                        .dp()
                        .write_failed(m, &e, reason::SCRUB_REPAIR_WRITE)
                        .await
                        == WriteFault::NoSpace
                    {
                        full.push(m.clone());
                    }
                }
            }
        }
        if !full.is_empty() {
            return Err(self.dp().nospace_error(&full));
        }
        if unsynced {
            self.dp().mark_synced(addr);
        }
        // A member located as wrong in more blocks than the array tolerates is taken out in
        // a check (which rewrites nothing); a repair has just rewritten its blocks (and a
        // repair it refused has failed it). Never left in service, wrong and unrepaired,
        // past the limit.
        let max = self.dp().settings.lock().max_checksum_errors;
        for (i, n) in blame {
            let m = &members[i];
            let total = m.stats.checksum_errors.fetch_add(n, Ordering::Relaxed) + n;
            if mode == CheckMode::Check && total > max && self.dp().in_service(m) {
                let why = reason::corrupt(total);
                self.fail_member(m, why.clone()).await;
                out.failed.push(format!("{} ({why})", m.path));
            }
        }
        Ok(out)
    }

    /// Make parity (or copies) agree with data in the given bitmap regions. Returns the
    /// member bytes covered and the number of regions.
    pub(crate) async fn resync_regions(&self, regions: &[u64]) -> Result<(u64, u64)> {
        if self.dp().geometry.redundancy() == 0 {
            // Its bitmap covers only checksums: recompute them.
            return self.retag_regions(regions).await;
        }
        self.dp().crash_resync.store(true, Ordering::Release);
        let r = self.resync_crashed(regions).await;
        self.dp().crash_resync.store(false, Ordering::Release);
        r
    }

    async fn resync_crashed(&self, regions: &[u64]) -> Result<(u64, u64)> {
        let Some(bm) = self.shared.bitmap.as_ref() else {
            return Ok((0, 0));
        };
        let chunk = self.dp().geometry.chunk as u64;
        let h = ProcessHandle::new(ProcessKind::Resync, regions.len() as u64 * bm.region);
        let mut bytes = 0;
        for &r in regions {
            let from = r * bm.region / chunk;
            let to = ((r + 1) * bm.region).min(self.dp().geometry.member_size) / chunk;
            self.scrub_pass(&h, CheckMode::Resync, from, to).await?;
            bytes += (to - from) * chunk;
        }
        self.dp().flush().await?;
        tracing::info!(array = %self.dp().name, regions = regions.len(), bytes, "resynced dirty regions after an unclean shutdown");
        Ok((bytes, regions.len() as u64))
    }

    /// The initial sync of a new array whose members were not known to be zero.
    pub(super) async fn initial_resync(self: &Arc<Self>) -> Result<()> {
        let chunk = self.dp().geometry.chunk as u64;
        let stripes = self.dp().geometry.stripes();
        let h = self.claim(ProcessKind::Resync, stripes * chunk)?;
        let start = self.dp().resync_offset.load(Ordering::Acquire) / chunk;
        h.done.store(start * chunk, Ordering::Relaxed);
        let mut last = Instant::now();
        let mut result = Ok(());
        let mut t = start;
        while t < stripes {
            let step = (t + 64).min(stripes);
            if let Err(e) = self.scrub_pass(&h, CheckMode::Resync, t, step).await {
                result = Err(e);
                break;
            }
            self.dp()
                .resync_offset
                .store(step * chunk, Ordering::Release);
            t = step;
            if last.elapsed() > Duration::from_secs(2) {
                self.checkpoint().await;
                last = Instant::now();
            }
        }
        if result.is_ok() {
            self.dp().flush().await?;
            self.dp().resync_offset.store(u64::MAX, Ordering::Release);
            self.checkpoint().await;
        }
        h.finish(result.as_ref().err().map(|e| e.to_string()));
        result
    }

    /// Resync the stripes writes left inconsistent (parity from the data; mirrors from the
    /// first copy, or the majority of three or more). A stripe whose group misses a member
    /// waits (its parity cannot be recomputed); out of space stops the round. Returns how
    /// many stay inconsistent.
    pub async fn resync_unsynced(&self) -> Result<usize> {
        let Some(bm) = self.shared.bitmap.as_ref() else {
            return Ok(0);
        };
        let stripes = bm.unsynced_stripes();
        if stripes.is_empty() {
            return Ok(0);
        }
        for (g, moff) in stripes {
            // A key past the data of the layout in force names a row of a layout that is
            // gone (a reshape to a larger chunk set the tail aside as its backup area, and
            // the row a write left inconsistent there was moved and written whole): nothing
            // of the array lives there, and reading it would run past the members' data.
            if self.reshaping().is_none() && moff >= self.dp().geometry.member_size {
                bm.synced(g, moff, self.dp().geometry.chunk as u64);
                continue;
            }
            // Its row in the view in force (during a reshape to a new chunk the key may
            // name a row of the old layout; the check looks at whichever holds it).
            let t = self.dp().map.stripe_at(moff);
            let addr = StripeAddr {
                group: g,
                stripe: t,
            };
            if !self.dp().is_unsynced(addr) {
                continue; // resynced with an earlier key's row
            }
            match self
                .check_stripe_in_its_layout(addr, CheckMode::Resync)
                .await
            {
                Ok(c) if !c.skipped => {
                    self.dp().mark_synced(addr);
                    tracing::info!(array = %self.dp().name, group = g, stripe = t, "resynced a stripe a write had left inconsistent");
                }
                Ok(_) => {}
                Err(e @ Error::NoSpace(_)) => return Err(e),
                Err(e) => {
                    tracing::warn!(array = %self.dp().name, group = g, stripe = t, error = %e, "could not resync an inconsistent stripe")
                }
            }
        }
        Ok(bm.unsynced_stripes().len())
    }
}

/// A stripe's rewrites grouped by member (in the order members first appear), each
/// member's rows sorted and adjacent ones joined into one buffer; where a member's rows
/// overlap they stay as they came, in order (the later one wins on the drive too).
fn join_rewrites(rewrite: Vec<(usize, u64, SharedBuf)>) -> Vec<(usize, Vec<(u64, SharedBuf)>)> {
    let mut per: Vec<(usize, Vec<(u64, SharedBuf)>)> = Vec::new();
    for (i, row, buf) in rewrite {
        match per.iter_mut().find(|(j, _)| *j == i) {
            Some((_, v)) => v.push((row, buf)),
            None => per.push((i, vec![(row, buf)])),
        }
    }
    for (_, v) in per.iter_mut() {
        let mut sorted: Vec<(u64, u64)> = v.iter().map(|(r, b)| (*r, b.len() as u64)).collect();
        sorted.sort_unstable();
        if sorted.windows(2).any(|w| w[0].0 + w[0].1 > w[1].0) {
            continue;
        }
        v.sort_by_key(|(r, _)| *r);
        let mut joined: Vec<(u64, SharedBuf)> = Vec::new();
        let mut run: Vec<(u64, SharedBuf)> = Vec::new();
        let flush = |run: &mut Vec<(u64, SharedBuf)>, joined: &mut Vec<(u64, SharedBuf)>| {
            match run.len() {
                0 => {}
                1 => joined.push(run.pop().expect("one")),
                _ => {
                    let len: usize = run.iter().map(|(_, b)| b.len()).sum();
                    let mut buf = AlignedBuf::for_overwrite(len);
                    let mut at = 0;
                    for (_, b) in run.iter() {
                        // SAFETY: the judge's buffers are its own, written before it returned.
                        buf[at..at + b.len()].copy_from_slice(unsafe { b.as_slice() });
                        at += b.len();
                    }
                    joined.push((run[0].0, buf.into_shared()));
                    run.clear();
                }
            }
        };
        for (row, buf) in std::mem::take(v) {
            let adjacent = run.last().is_some_and(|(r, b)| r + b.len() as u64 == row);
            if !adjacent {
                flush(&mut run, &mut joined);
            }
            run.push((row, buf));
        }
        flush(&mut run, &mut joined);
        *v = joined;
    }
    per
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(fill: u8) -> SharedBuf {
        AlignedBuf::from_slice(&[fill; BLOCK as usize]).into_shared()
    }

    fn bytes(b: &SharedBuf) -> Vec<u8> {
        // SAFETY: the test's buffers are not shared with any I/O.
        unsafe { b.as_slice() }.to_vec()
    }

    #[test]
    fn adjacent_rows_of_a_member_are_one_write() {
        let b = BLOCK;
        // Member 1's rows 2, 0, 1 (out of order) and 5; member 0's row 3.
        let rw = vec![
            (1, 2 * b, row(2)),
            (0, 3 * b, row(9)),
            (1, 0, row(0)),
            (1, b, row(1)),
            (1, 5 * b, row(5)),
        ];
        let per = join_rewrites(rw);
        assert_eq!(per.len(), 2);
        let (m1, w1) = &per[0];
        assert_eq!(*m1, 1);
        assert_eq!(w1.len(), 2, "rows 0-2 joined, row 5 apart");
        assert_eq!(w1[0].0, 0);
        let mut want = vec![0u8; b as usize];
        want.extend(vec![1u8; b as usize]);
        want.extend(vec![2u8; b as usize]);
        assert_eq!(bytes(&w1[0].1), want);
        assert_eq!(w1[1].0, 5 * b);
        assert_eq!(bytes(&w1[1].1), vec![5u8; b as usize]);
        let (m0, w0) = &per[1];
        assert_eq!((*m0, w0.len(), w0[0].0), (0, 1, 3 * b));
    }

    #[test]
    fn overlapping_rows_keep_their_order() {
        let b = BLOCK;
        let chunk = AlignedBuf::from_slice(&[7u8; 4 * BLOCK as usize]).into_shared();
        // A fix of the second row, then the whole chunk: not joined, and written in the
        // order they came (the chunk's row lands last, as it would have unjoined).
        let per = join_rewrites(vec![(0, b, row(1)), (0, 0, chunk)]);
        let w = &per[0].1;
        assert_eq!(w.iter().map(|(r, _)| *r).collect::<Vec<_>>(), vec![b, 0]);
    }
}
