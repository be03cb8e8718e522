//! Members coming and going while the array runs: re-adding a member that was out (md's
//! `--re-add`, recovered from the write-intent bitmap), the operator's guard rails, the
//! read-only rescue of a failed array, and the record of every recovery for status.

use crate::array::{
    read_superblock, AssemblyReport, Member, MemberSpec, MemberStats, ReAdd, RecoveryLog,
    RecoveryStatus, RescueReport, SlotRt, State,
};
use crate::bitmap::Bitmap;
use crate::error::{Error, Result};
use crate::freshness::{self, Verdict};
use crate::layout::human;
use crate::superblock::{OutReason, Role, SlotState, Superblock};
use crate::Array;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

/// Where a former member goes back, and how it is recovered.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ReAddPlan {
    pub slot: usize,
    pub bitmap: bool,
}

/// The status line of a member found stale: "stale: event 4, array at 6; resyncing 3
/// regions (12 MiB) from the write-intent bitmap".
pub(crate) fn stale_note(
    event: u64,
    array_event: u64,
    bitmap: bool,
    planned: u64,
    bm: Option<&Bitmap>,
) -> String {
    let how = match (bitmap, bm) {
        (true, Some(b)) => format!(
            "resyncing {} region(s) ({}) from the write-intent bitmap",
            b.dirty_count(),
            human(planned)
        ),
        _ => format!(
            "rebuilding in full, {} (the bitmap does not cover event {event})",
            human(planned)
        ),
    };
    format!("stale: event {event}, array at {array_event}; {how}")
}

/// Unix seconds as "2026-11-23 14:05:09 UTC" (no time-zone database needed).
pub(crate) fn utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + (m <= 2) as i64;
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

impl Array {
    pub(crate) fn read_only_error(&self) -> Error {
        Error::ReadOnly(format!(
            "'{}' was started read-only to rescue its data: nothing is written to it. Copy the data off; to use the array again, bring back its members (or replace them) and assemble it without --force",
            self.name
        ))
    }

    pub(crate) fn check_writable(&self) -> Result<()> {
        if self.read_only.load(Ordering::Acquire) {
            return Err(self.read_only_error());
        }
        Ok(())
    }

    /// Started read-only (a rescue, or only looking).
    pub fn is_read_only(&self) -> bool {
        self.read_only.load(Ordering::Acquire)
    }

    /// The guard rail of `fail`: refuse when failing `m` would leave its group with more
    /// members out than it survives. The same `judge` that fails the array decides.
    pub(crate) fn refuse_unsafe_fail(&self, m: &Arc<Member>) -> Result<()> {
        let mut probe = (*self.state.load_full()).clone();
        let rec = crate::superblock::OutRecord {
            reason: OutReason::Admin,
            event: 0,
        };
        if !Array::mark_failed(&mut probe, m, rec) {
            return Ok(());
        }
        // No spare is handed out in the probe: a spare only rebuilds, it serves nothing yet.
        self.judge(&mut probe);
        if probe.failed.is_none() {
            return Ok(());
        }
        let w = self.geometry.width as usize;
        let slot = probe
            .slots
            .iter()
            .position(|s| s.member.as_ref().is_some_and(|x| Arc::ptr_eq(x, m)));
        let (g, working) = match slot {
            Some(i) => {
                let g = i / w;
                let working = probe.slots[g * w..(g + 1) * w]
                    .iter()
                    .filter(|s| s.state == SlotState::Active)
                    .count();
                (g, working)
            }
            None => (0, 0),
        };
        let red = self.geometry.redundancy();
        let rebuilding = probe.slots[g * w..(g + 1) * w]
            .iter()
            .any(|s| s.state == SlotState::Rebuilding);
        Err(Error::WouldFail(format!(
            "failing {} would leave group {g} of '{}' with {working} working member{} of {w} ({} survives {red} out{}): the array would stop serving and its data would be unavailable. Use --force to fail it anyway",
            m.path,
            self.name,
            if working == 1 { "" } else { "s" },
            self.geometry.level,
            if rebuilding {
                "; a member being rebuilt does not count until its rebuild is done"
            } else {
                ""
            }
        )))
    }

    /// Write the whole bitmap to `members`. A member in service must carry every bit that
    /// is set: when it is the only one left in sync, its bitmap is what says what the
    /// others missed. A member that joins (re-added, a spare, a replacement) got only the
    /// blocks written since it joined, so it gets the whole bitmap before it is promoted,
    /// and every member does at assembly (the union of what was found).
    pub(crate) async fn sync_bitmap(&self, members: &[Arc<Member>]) {
        let Some(bm) = &self.bitmap else { return };
        if members.is_empty() || self.read_only.load(Ordering::Acquire) {
            return;
        }
        let mut failed: Vec<Arc<Member>> = Vec::new();
        for (i, blk) in bm.blocks.iter().enumerate() {
            // Held while written: a bit set meanwhile waits, then reaches them too.
            let img = blk.lock().await;
            let buf = crate::buf::AlignedBuf::from_slice(&img).into_shared();
            let off = crate::superblock::BITMAP_OFFSET + (i * crate::bitmap::BLOCK) as u64;
            let futs = members
                .iter()
                .filter(|m| !failed.iter().any(|f| Arc::ptr_eq(f, m)))
                .map(|m| {
                    let b = buf.clone();
                    async move {
                        let r = crate::dev::write_at(
                            &m.dev,
                            off,
                            b,
                            true,
                            crate::dev::IoClass::Foreground,
                        )
                        .await;
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

    /// Bytes of member space the recovery of this slot's member still covers.
    pub(crate) fn recovery_bytes(&self, s: &SlotRt) -> u64 {
        let Some(m) = &s.member else { return 0 };
        let from = s.recovery.load(Ordering::Acquire).min(m.size);
        match (&self.bitmap, s.bitmap_recovery) {
            (Some(bm), true) => bm
                .dirty_regions()
                .into_iter()
                .map(|r| {
                    let a = (r * bm.region).max(from);
                    let b = ((r + 1) * bm.region).min(m.size);
                    b.saturating_sub(a)
                })
                .sum(),
            _ => m.size - from,
        }
    }

    /// Start the record of a member's recovery.
    pub(crate) fn log_recovery(
        &self,
        slot: usize,
        m: &Arc<Member>,
        reason: String,
        bitmap: bool,
        planned: u64,
    ) {
        let mut v = self.recoveries.lock();
        // One running record per member.
        v.retain(|r| !(r.uuid == m.uuid && r.end.load(Ordering::Relaxed) == 0));
        v.push(Arc::new(RecoveryLog {
            slot,
            uuid: m.uuid,
            path: m.path.clone(),
            reason,
            bitmap,
            planned: AtomicU64::new(planned),
            done: AtomicU64::new(0),
            end: AtomicU8::new(0),
        }));
        // Keep the recent ones.
        let excess = v.len().saturating_sub(32);
        v.drain(..excess);
    }

    /// The rebuild wrote `bytes` to `uuid`'s member.
    pub(crate) fn note_recovered(&self, uuid: &uuid::Uuid, bytes: u64) {
        if let Some(r) = self
            .recoveries
            .lock()
            .iter()
            .rev()
            .find(|r| &r.uuid == uuid && r.end.load(Ordering::Relaxed) == 0)
        {
            r.done.fetch_add(bytes, Ordering::Relaxed);
        }
    }

    /// A recovery ended: done, or stopped (its member failed or left).
    pub(crate) fn end_recovery(&self, uuid: &uuid::Uuid, done: bool) {
        for r in self.recoveries.lock().iter() {
            if &r.uuid == uuid && r.end.load(Ordering::Relaxed) == 0 {
                r.end.store(if done { 1 } else { 2 }, Ordering::Relaxed);
                if done {
                    tracing::info!(
                        member = %r.path,
                        bytes = r.done.load(Ordering::Relaxed),
                        bitmap = r.bitmap,
                        "recovery complete"
                    );
                }
            }
        }
    }

    pub(crate) fn recovery_status(&self) -> Vec<RecoveryStatus> {
        self.recoveries
            .lock()
            .iter()
            .map(|r| RecoveryStatus {
                slot: r.slot,
                path: r.path.clone(),
                uuid: r.uuid.to_string(),
                reason: r.reason.clone(),
                bitmap: r.bitmap,
                planned_bytes: r.planned.load(Ordering::Relaxed),
                recovered_bytes: r.done.load(Ordering::Relaxed),
                state: match r.end.load(Ordering::Relaxed) {
                    0 => "running",
                    1 => "done",
                    _ => "stopped",
                }
                .into(),
            })
            .collect()
    }

    /// May `sb`'s member go back into this array, and where? Errors: `Invalid` when it is
    /// not a former member (or is in service), `Refused` when it is one that cannot be
    /// re-added (split off, or its slot was given to another member).
    pub(crate) fn plan_re_add(&self, sb: &Superblock, path: &str) -> Result<ReAddPlan> {
        if sb.array_uuid != self.uuid {
            return Err(Error::Invalid(format!(
                "{path} is not a member of '{}' (its superblock names '{}', {})",
                self.name, sb.name, sb.array_uuid
            )));
        }
        let st = self.state.load_full();
        if st.live_members().iter().any(|m| m.uuid == sb.this_member) {
            return Err(Error::Invalid(format!(
                "{path} is already a member of '{}'",
                self.name
            )));
        }
        let event = self.event.load(Ordering::Acquire);
        let n = self.superblock(&st, event, false, uuid::Uuid::nil());
        let again =
            format!("use --force to wipe {path} and add it as a new member (rebuilt in full)");
        if let Verdict::Diverged { .. } = freshness::judge_one(&n, sb) {
            return Err(Error::Refused(format!(
                "{path} went on without '{}' (split brain: its superblock is from event {} of another session, the array is at {event}); its data is not this array's: {again}",
                self.name, sb.event
            )));
        }
        match n.role_of(&sb.this_member) {
            Role::Slot(i) if matches!(st.slots[i].state, SlotState::Failed | SlotState::Empty) => {
                Ok(ReAddPlan {
                    slot: i,
                    bitmap: freshness::bitmap_covers(&n, sb),
                })
            }
            _ => Err(Error::Refused(format!(
                "{path} was a member of '{}' but its place has been taken (its superblock is from event {}, the array is at {event}): {again}",
                self.name, sb.event
            ))),
        }
    }

    /// Put a former member back into its slot: md's `--re-add`. It is rebuilt from the
    /// write-intent bitmap when that covers everything it missed (only the regions written
    /// while it was out), else in full; it is not read until then. Errors as `add`'s, with
    /// `Invalid` for a device that is not a former member and `Refused` for one that cannot
    /// go back (the caller may wipe it and `add` it with `force`).
    pub async fn re_add(&self, spec: MemberSpec) -> Result<ReAdd> {
        self.check_writable()?;
        let sb = read_superblock(&spec.dev).await?;
        let plan = self.plan_re_add(&sb, &spec.path)?;
        self.apply_re_add(spec, &sb, plan).await
    }

    pub(crate) async fn apply_re_add(
        &self,
        spec: MemberSpec,
        sb: &Superblock,
        _planned: ReAddPlan,
    ) -> Result<ReAdd> {
        let _g = self.mgmt.lock().await;
        // Decide again under the lock: the state may have moved since.
        let plan = self.plan_re_add(sb, &spec.path)?;
        let st = self.state.load_full();
        let entry = st.slots[plan.slot]
            .entry
            .clone()
            .expect("a re-added slot records its member");
        let g = &self.geometry;
        if spec.dev.size() < g.data_offset.saturating_add(entry.size) {
            return Err(Error::Refused(format!(
                "{} is smaller than '{}' expects ({} of data at offset {})",
                spec.path,
                self.name,
                human(entry.size),
                human(g.data_offset)
            )));
        }
        let member = Arc::new(Member {
            dev: spec.dev,
            uuid: entry.uuid,
            path: spec.path.clone(),
            domain: entry.domain.clone(),
            size: entry.size,
            is_file: spec.is_file,
            stats: MemberStats::default(),
            tags: Default::default(),
        });
        let array_event = self.event.load(Ordering::Acquire);
        let mut new = (*st).clone();
        let s = &mut new.slots[plan.slot];
        let old = s.member.replace(member.clone());
        s.state = SlotState::Rebuilding;
        s.recovery = Arc::new(AtomicU64::new(0));
        s.bitmap_recovery = plan.bitmap;
        let planned = self.recovery_bytes(s);
        let why = s.out.map(|o| o.reason.to_string()).unwrap_or_default();
        let how = if plan.bitmap {
            format!(
                "resyncing {} region(s) ({}) from the write-intent bitmap",
                self.bitmap.as_ref().map(|b| b.dirty_count()).unwrap_or(0),
                human(planned)
            )
        } else {
            format!(
                "rebuilding in full, {} (the bitmap does not cover event {})",
                human(planned),
                sb.event
            )
        };
        s.note = Some(
            format!(
                "re-added ({why}): event {}, array at {array_event}; {how}",
                sb.event
            )
            .into(),
        );
        self.judge(&mut new);
        self.log_recovery(
            plan.slot,
            &member,
            format!(
                "re-added ({why}): event {}, array at {array_event}",
                sb.event
            ),
            plan.bitmap,
            planned,
        );
        tracing::info!(member = %spec.path, slot = plan.slot, bitmap = plan.bitmap, planned, "member re-added");
        let lost = self.commit(new).await;
        drop(_g);
        if let Some(old) = old {
            if !Arc::ptr_eq(&old.dev, &member.dev) {
                old.dev.close();
            }
        }
        for m in lost {
            self.fail_member(&m, OutReason::MetadataWrite).await;
        }
        self.kick();
        Ok(ReAdd {
            slot: plan.slot,
            path: spec.path,
            bitmap: plan.bitmap,
            member_event: sb.event,
            array_event,
            planned_bytes: planned,
        })
    }

    /// The device of an out (failed) member the array still holds, by path or uuid, to
    /// re-add it without opening it again (an open file keeps its lock).
    pub fn held_device(&self, who: &str) -> Option<MemberSpec> {
        let st = self.state.load_full();
        st.slots
            .iter()
            .filter(|s| s.state == SlotState::Failed)
            .filter_map(|s| s.member.as_ref())
            .find(|m| m.path == who || m.uuid.to_string() == who)
            .map(|m| MemberSpec {
                dev: m.dev.clone(),
                path: m.path.clone(),
                is_file: m.is_file,
                domain: m.domain.clone(),
            })
    }

    /// `force` on an array that cannot serve: start it read-only from the freshest members
    /// there are. For every group short of members, the out-of-date members that once held
    /// their slot's data are read as if in sync, the most recent first, until the group can
    /// be read. Nothing is written to any member: no superblock, no resync, no rebuild.
    pub(crate) fn rescue(
        self: Arc<Self>,
        mut st: State,
        mut report: AssemblyReport,
        mut candidates: Vec<(usize, u64)>,
        newest: &Superblock,
    ) -> Arc<Array> {
        let w = self.geometry.width as usize;
        let red = self.geometry.redundancy();
        candidates.sort_by_key(|&(_, e)| std::cmp::Reverse(e));
        let mut rescue = RescueReport::default();
        for g in 0..self.geometry.groups as usize {
            let out = |st: &State| {
                st.slots[g * w..(g + 1) * w]
                    .iter()
                    .filter(|s| s.state != SlotState::Active)
                    .count()
            };
            for &(i, event) in candidates.iter().filter(|(i, _)| i / w == g) {
                if out(&st) <= red {
                    break;
                }
                let s = &mut st.slots[i];
                if s.state == SlotState::Active || s.member.is_none() {
                    continue;
                }
                s.state = SlotState::Active;
                s.bitmap_recovery = false;
                let path = s
                    .member
                    .as_ref()
                    .map(|m| m.path.clone())
                    .unwrap_or_default();
                let line = format!(
                    "{path} left at event {event}, the array is at {}: blocks written after that may read old",
                    newest.event
                );
                s.note = Some(format!("rescue: read as of event {event}").into());
                rescue.used.push(line);
            }
            if out(&st) > red {
                rescue.unreadable_groups.push(g);
            }
        }
        // Nothing is recovered in a rescue: the notes say only what is stale.
        for x in report.stale.iter_mut() {
            if let Some((head, _)) = x.note.split_once(';') {
                x.note = head.to_string();
            }
        }
        for s in st.slots.iter_mut() {
            if let Some((head, _)) = s.note.as_deref().and_then(|n| n.split_once(';')) {
                s.note = Some(head.into());
            }
        }
        if !newest.clean {
            rescue.used.push(format!(
                "'{}' was not shut down cleanly: where members are missing, blocks rebuilt from parity written at the time may be wrong",
                self.name
            ));
        }
        // Serve what can be read: a group still short answers its reads with errors.
        self.judge(&mut st);
        st.failed = None;
        self.read_only.store(true, Ordering::Release);
        self.rescue.store(true, Ordering::Release);
        self.state.store(Arc::new(st));
        tracing::info!(array = %self.name, used = ?rescue.used, "started read-only for a rescue");
        report.rescue = Some(rescue);
        *self.report.lock() = report;
        self
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn utc_formats_dates() {
        assert_eq!(super::utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(super::utc(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(super::utc(1_795_373_472), "2026-11-22 18:51:12 UTC");
    }
}
