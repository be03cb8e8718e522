//! Membership changes while the array runs: members failing (the one way out of service,
//! recorded on the other members before it is used), hot spares taking over, `add`,
//! `remove`, `replace`, re-adding a former member (md's `--re-add`, from the write-intent
//! bitmap), the operator's guard rails, and the record of every recovery for status.

use super::create::{check_blank, claim_metadata};
use super::{read_superblock, Array, Member, MemberSpec, SlotRt, State};
use crate::bitmap::Bitmap;
use crate::buf::AlignedBuf;
use crate::dev::{self, IoClass};
use crate::error::{Error, Msg, Result, Step};
use crate::freshness::{self, Verdict};
use crate::layout::{human, Level};
use crate::reason::{self, Why};
use crate::superblock;
use crate::superblock::{OutReason, OutRecord, Role, SlotState, Superblock};
use sbod_types::RecoveryStatus;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use uuid::Uuid;

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

/// What `Array::re_add` did.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ReAdd {
    pub slot: usize,
    pub path: String,
    /// Recovered from the write-intent bitmap (only what was written while it was out),
    /// else in full.
    pub bitmap: bool,
    /// The member's own superblock event, and the array's when it came back.
    pub member_event: u64,
    pub array_event: u64,
    /// Bytes of member space the recovery covers (a bound: regions written since).
    pub planned_bytes: u64,
}

/// What `Array::add` did with a device.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AddOutcome {
    /// A hot spare.
    Spare,
    /// A degraded slot took it at once; rebuilt in full.
    Rebuilding { slot: usize },
    /// A former member of this array back in its slot.
    ReAdded(ReAdd),
}

pub(crate) struct RecoveryLog {
    pub slot: usize,
    pub uuid: Uuid,
    pub path: String,
    pub reason: String,
    pub bitmap: bool,
    pub planned: AtomicU64,
    pub done: AtomicU64,
    /// 0 running, 1 done, 2 stopped.
    pub end: std::sync::atomic::AtomicU8,
}

impl Array {
    /// Is every slot in service: active, or (declustered) with its chunks in the
    /// distributed spare space? What the bitmap's clearing, the initial resync and scrub
    /// wait for.
    pub(crate) fn whole(&self, st: &State) -> bool {
        let spared = self.dp().map.spared();
        st.slots
            .iter()
            .enumerate()
            .all(|(i, s)| s.state == SlotState::Active || spared.holds(i))
    }

    /// Decide whether the state still holds all data: `st.failed` says why not (a set
    /// with more members out than it survives), else None.
    pub(crate) fn decide_failed(&self, st: &mut State) {
        let red = self.dp().geometry.redundancy();
        st.failed = None;
        let spared = self.dp().map.spared();
        for g in 0..self.dp().map.sets() {
            let range = self.dp().map.set_slots(g);
            let (first, w) = (range.start, range.len());
            let slots = &st.slots[range];
            // A slot whose chunks all live in the distributed spare space is not out.
            let out: Vec<usize> = (0..w)
                .filter(|&i| slots[i].state != SlotState::Active && !spared.holds(first + i))
                .collect();
            if out.len() > red {
                let names: Vec<String> = out
                    .iter()
                    .map(|&i| {
                        let s = &slots[i];
                        let who = s
                            .member
                            .as_ref()
                            .map(|m| m.path.clone())
                            .unwrap_or_else(|| format!("slot {}", first + i));
                        let what = match (s.state, s.out) {
                            (SlotState::Rebuilding, Some(o)) if o.reason == OutReason::Stale => {
                                "stale".to_string()
                            }
                            (SlotState::Failed, Some(o)) if o.reason == OutReason::Missing => {
                                "missing".to_string()
                            }
                            (state, _) => format!("{state:?}").to_lowercase(),
                        };
                        format!("{who} ({what})")
                    })
                    .collect();
                st.failed = Some(format!(
                    "group {g} has lost {} of {w} members ({}) and survives only {red}",
                    out.len(),
                    names.join(", ")
                ));
                return;
            }
        }
    }

    /// Hand spares to failed or empty slots, choosing one whose failure domain the
    /// group can absorb when there is a choice.
    pub(crate) fn take_spares(&self, st: &mut State) -> bool {
        let red = self.dp().geometry.redundancy();
        let mut changed = false;
        // A declustered layout's failures go to its distributed spare space while there
        // is room; only those beyond it take a hot spare.
        let distributed = self.spare_space_takes(st);
        let spared = self.dp().map.spared();
        for i in 0..st.slots.len() {
            if !matches!(st.slots[i].state, SlotState::Failed | SlotState::Empty)
                || st.spares.is_empty()
                || distributed.contains(&i)
                // A spared slot takes one only when it can be copied back to it (the
                // last one spared, no transition under way).
                || (spared.involves(i)
                    && !(spared.to.is_none() && spared.from.last() == Some(&i)))
            {
                continue;
            }
            let set = self.dp().map.set_slots(self.dp().map.set_of(i));
            let domain_count = |d: &str, st: &State| {
                st.slots[set.clone()]
                    .iter()
                    .filter(|s| {
                        s.state != SlotState::Failed
                            && s.member.as_ref().is_some_and(|m| m.domain == d)
                    })
                    .count()
            };
            let pick = st
                .spares
                .iter()
                .position(|m| m.domain.is_empty() || domain_count(&m.domain, st) < red)
                .unwrap_or(0);
            let spare = st.spares.remove(pick);
            tracing::warn!(slot = i, spare = %spare.path, "hot spare takes over");
            self.log_recovery(i, &spare, "hot spare".into(), false, spare.size);
            let s = &mut st.slots[i];
            s.entry = Some(spare.entry());
            s.member = Some(spare);
            s.state = SlotState::Rebuilding;
            s.recovery = Arc::new(AtomicU64::new(0));
            s.out = None;
            s.bitmap_recovery = false;
            s.note = None;
            changed = true;
        }
        changed
    }

    /// Fail a member because of an I/O error (or the user's command). The new state is
    /// recorded on the other members before it is used: no write skips this member before
    /// its failure is durable, so a member whose superblock says it was in service has
    /// every write the array acknowledged (what `freshness` relies on).
    pub async fn fail_member(&self, member: &Arc<Member>, why: impl Into<Why>) {
        let _g = self.mgmt.lock().await;
        // Members that then refuse the superblock recording it fail for that reason.
        let mut pending = vec![(member.clone(), why.into())];
        while let Some((m, why)) = pending.pop() {
            let st = self.dp().state.load_full();
            let mut new = (*st).clone();
            let event = self.event.load(Ordering::Acquire) + 1;
            let rec = OutRecord {
                reason: why.code,
                event,
            };
            if !Self::mark_failed(&mut new, &m, rec) {
                continue;
            }
            if let Some(d) = &why.detail {
                m.stats
                    .out_reason
                    .lock()
                    .get_or_insert_with(|| d.to_string());
            }
            if why.code == OutReason::Admin {
                tracing::info!(member = %m.path, array = %self.dp().name, "member failed by the administrator");
            } else {
                tracing::error!(member = %m.path, reason = %why, array = %self.dp().name, "member failed");
            }
            self.end_recovery(&m.uuid, false);
            self.take_spares(&mut new);
            self.decide_failed(&mut new);
            if let Some(f) = &new.failed {
                tracing::error!(array = %self.dp().name, "array failed: {f}");
            }
            let lost = self.commit(new).await;
            pending.extend(lost.into_iter().map(|m| (m, reason::SUPERBLOCK_WRITE)));
            self.cancel_process_on_failure();
        }
        self.kick();
    }

    pub(crate) fn mark_failed(st: &mut State, m: &Arc<Member>, why: OutRecord) -> bool {
        for s in st.slots.iter_mut() {
            if s.member.as_ref().is_some_and(|x| x.same(m)) && s.state != SlotState::Failed {
                if let Some((r, off)) = s.replacement.take() {
                    // The replacement carries on as the slot's member, rebuilding.
                    s.entry = Some(r.entry());
                    s.member = Some(r);
                    s.state = SlotState::Rebuilding;
                    s.recovery = off;
                    s.bitmap_recovery = false;
                    s.out = None;
                    s.note = None;
                } else {
                    s.state = SlotState::Failed;
                    s.bitmap_recovery = false;
                    s.out = Some(why);
                    s.note = None;
                }
                return true;
            }
            if s.replacement.as_ref().is_some_and(|(x, _)| x.same(m)) {
                s.replacement = None;
                return true;
            }
        }
        let before = st.spares.len();
        st.spares.retain(|x| !x.same(m));
        st.spares.len() != before
    }

    fn find_member(&self, who: &str) -> Result<(Role, Arc<Member>)> {
        let st = self.dp().state.load_full();
        st.find(who).ok_or_else(|| {
            let known: Vec<String> = st.live_members().iter().map(|m| m.path.clone()).collect();
            Error::Invalid(
                format!(
                    "{who} is not a member of '{}' (members: {})",
                    self.dp().name,
                    known.join(", ")
                )
                .into(),
            )
        })
    }

    /// `sbod fail`: take a member out of service. Refused (`Error::WouldFail`) when the
    /// array would then have lost more members of a group than it survives (it would stop
    /// serving), unless `force`.
    pub async fn fail(&self, who: &str, force: bool) -> Result<()> {
        let (role, m) = self.find_member(who)?;
        if let Role::Slot(i) = role {
            let st = self.dp().state.load_full();
            if st.slots[i].state == SlotState::Failed {
                return Err(Error::Invalid(format!("{who} has already failed").into()));
            }
        }
        if self.dp().read_only.load(Ordering::Acquire) {
            return Err(self.dp().read_only_error());
        }
        if !force {
            self.refuse_unsafe_fail(&m)?;
        }
        self.fail_member(&m, OutReason::Admin).await;
        Ok(())
    }

    /// `sbod remove`: forget a failed member or a spare.
    pub async fn remove(&self, who: &str) -> Result<()> {
        let _g = self.mgmt.lock().await;
        let st = self.dp().state.load_full();
        let mut new = (*st).clone();
        let found = st.slots.iter().position(|s| {
            s.member
                .as_ref()
                .is_some_and(|m| m.path == who || m.uuid.to_string() == who)
                || s.entry.as_ref().is_some_and(|e| e.uuid.to_string() == who)
        });
        let removed: Option<Arc<Member>>;
        if let Some(i) = found {
            let s = &mut new.slots[i];
            if s.state != SlotState::Failed {
                return Err(Error::Refused(
                    Msg::new(format!(
                        "{who} is {} in '{}': only a failed member can be removed",
                        format!("{:?}", s.state).to_lowercase(),
                        self.dp().name,
                    ))
                    .or(Step::command("fail", &self.dp().name, who))
                    .or(Step::command("replace", &self.dp().name, who)),
                ));
            }
            removed = s.member.take();
            s.entry = None;
            s.state = SlotState::Empty;
            s.note = None;
        } else if let Some(p) = st
            .spares
            .iter()
            .position(|m| m.path == who || m.uuid.to_string() == who)
        {
            removed = Some(new.spares.remove(p));
        } else {
            return Err(Error::Invalid(
                format!(
                    "{who} is not a failed member or spare of '{}'",
                    self.dp().name
                )
                .into(),
            ));
        }
        let lost = self.commit(new).await;
        drop(_g);
        for m in lost {
            self.fail_member(&m, OutReason::MetadataWrite).await;
        }
        if let Some(m) = removed {
            // Wipe its claim so it is not mistaken for a member later.
            Self::wipe(&m).await;
            m.dev.close();
        }
        Ok(())
    }

    pub(crate) async fn wipe(m: &Arc<Member>) {
        let z = AlignedBuf::zeroed(2 * superblock::COPY_SIZE).into_shared();
        let _ = dev::write_at(&m.dev, 0, z, true, IoClass::Foreground).await;
    }

    pub(crate) fn check_new_member(&self, spec: &MemberSpec) -> Result<u64> {
        let st = self.dp().state.load_full();
        if st.live_members().iter().any(|m| m.path == spec.path) {
            return Err(Error::Invalid(
                format!("{} is already a member of '{}'", spec.path, self.dp().name).into(),
            ));
        }
        let need = self.dp().geometry.data_offset + self.dp().geometry.member_size;
        if self.dp().geometry.level != Level::Concat && spec.dev.size() < need {
            return Err(Error::Invalid(
                format!(
                    "{} has {} but members of '{}' need {}",
                    spec.path,
                    crate::layout::human(spec.dev.size()),
                    self.dp().name,
                    crate::layout::human(need)
                )
                .into(),
            ));
        }
        Ok(if self.dp().geometry.level == Level::Concat {
            spec.dev
                .size()
                .saturating_sub(self.dp().geometry.data_offset)
                / self.dp().geometry.chunk as u64
                * self.dp().geometry.chunk as u64
        } else {
            self.dp().geometry.member_size
        })
    }

    pub(crate) fn new_member(spec: MemberSpec, size: u64) -> Arc<Member> {
        Arc::new(Member {
            dev: spec.dev,
            uuid: Uuid::new_v4(),
            path: spec.path,
            domain: spec.domain,
            size,
            is_file: spec.is_file,
            stats: Default::default(),
            tags: Default::default(),
        })
    }

    /// `sbod add`: a hot spare; a degraded array takes it at once and rebuilds. A device
    /// whose superblock says it was a member of this array and whose slot is out (failed
    /// or missing) is re-added there instead (see `re_add`); a former member that cannot
    /// be re-added is refused with the reason unless `force` (then it is wiped and added
    /// as a new member).
    pub async fn add(&self, spec: MemberSpec, force: bool) -> Result<AddOutcome> {
        if self.dp().read_only.load(Ordering::Acquire) {
            return Err(self.dp().read_only_error());
        }
        self.check_joining(&spec).await?;
        if let Ok(sb) = read_superblock(&spec.dev).await {
            if sb.array_uuid == self.uuid {
                // A member in service, under another name.
                let st = self.dp().state.load_full();
                if let Some(m) = st.live_members().iter().find(|m| m.uuid == sb.this_member) {
                    return Err(crate::owner::same(&m.path, &spec.path));
                }
                match self.plan_re_add(&sb, &spec.path) {
                    Ok(plan) => {
                        return self
                            .apply_re_add(spec, &sb, plan)
                            .await
                            .map(AddOutcome::ReAdded)
                    }
                    Err(e) if !force || matches!(e, Error::Invalid(_)) => return Err(e),
                    Err(_) => {}
                }
            }
        }
        let size = self.check_new_member(&spec)?;
        check_blank(&spec.dev, force).await?;
        self.probe_joining(&spec.path, &spec.dev).await?;
        claim_metadata(&spec.dev, self.dp().geometry.data_offset, &spec.path).await?;
        let m = Self::new_member(spec, size);
        let uuid = m.uuid;
        let _g = self.mgmt.lock().await;
        let mut new = (*self.dp().state.load_full()).clone();
        new.spares.push(m);
        self.take_spares(&mut new);
        self.decide_failed(&mut new);
        let outcome = match new
            .slots
            .iter()
            .position(|s| s.member.as_ref().is_some_and(|x| x.uuid == uuid))
        {
            Some(slot) => AddOutcome::Rebuilding { slot },
            None => AddOutcome::Spare,
        };
        let lost = self.commit(new).await;
        drop(_g);
        for m in lost {
            self.fail_member(&m, OutReason::MetadataWrite).await;
        }
        self.kick();
        Ok(outcome)
    }

    /// Refuse a member for `slot` whose failure domain (a host, an enclosure) already holds
    /// as many members of the slot's group as the group survives losing, as `create` does.
    fn check_domain(&self, st: &State, slot: usize, spec: &MemberSpec) -> Result<()> {
        if spec.domain.is_empty() {
            return Ok(());
        }
        let g = self.dp().map.set_of(slot);
        let red = self.dp().geometry.redundancy();
        let others: Vec<&str> = self
            .dp()
            .map
            .set_slots(g)
            .filter(|&i| i != slot && st.slots[i].state != SlotState::Failed)
            .filter_map(|i| st.slots[i].member.as_ref())
            .filter(|m| m.domain == spec.domain)
            .map(|m| m.path.as_str())
            .collect();
        if others.len() >= red {
            return Err(Error::Refused(
                Msg::new(format!(
                    "failure domain '{}' already holds {} member{} of group {g} ({}), and the group survives only {red} failure{}",
                    spec.domain,
                    others.len(),
                    if others.len() == 1 { "" } else { "s" },
                    others.join(", "),
                    if red == 1 { "" } else { "s" },
                ))
                .or(Step::say(format!("put {} in another domain", spec.path)))
                .or(Step::force(format!("use {} all the same", spec.path))),
            ));
        }
        Ok(())
    }

    /// `sbod replace`: rebuild `new` to take `old`'s place. While `old` still works it keeps
    /// serving (redundancy is never reduced); if it has failed, `new` simply rebuilds.
    pub async fn replace(&self, old: &str, spec: MemberSpec, force: bool) -> Result<()> {
        if self.dp().read_only.load(Ordering::Acquire) {
            return Err(self.dp().read_only_error());
        }
        let st = self.dp().state.load_full();
        let slot = st
            .slots
            .iter()
            .position(|s| {
                s.member
                    .as_ref()
                    .is_some_and(|m| m.path == old || m.uuid.to_string() == old)
                    || s.entry.as_ref().is_some_and(|e| e.uuid.to_string() == old)
            })
            .ok_or_else(|| {
                Error::Invalid(format!("{old} is not in a slot of '{}'", self.dp().name).into())
            })?;
        if st.slots[slot].replacement.is_some() {
            return Err(Error::Busy(
                format!("{old} is already being replaced").into(),
            ));
        }
        let size = self.check_new_member(&spec)?;
        if !force {
            self.check_domain(&st, slot, &spec)?;
        }
        self.check_joining(&spec).await?;
        check_blank(&spec.dev, force).await?;
        self.probe_joining(&spec.path, &spec.dev).await?;
        claim_metadata(&spec.dev, self.dp().geometry.data_offset, &spec.path).await?;
        let m = Self::new_member(spec, size);
        let _g = self.mgmt.lock().await;
        let mut new = (*self.dp().state.load_full()).clone();
        let s = &mut new.slots[slot];
        let mut retired = None;
        match s.state {
            SlotState::Active => {
                self.log_recovery(slot, &m, "replacement".into(), false, m.size);
                s.replacement = Some((m, Arc::new(AtomicU64::new(0))))
            }
            _ => {
                self.log_recovery(slot, &m, "replacement".into(), false, m.size);
                if let Some(r) = s.member.take() {
                    self.end_recovery(&r.uuid, false);
                    retired = Some(r);
                }
                s.entry = Some(m.entry());
                s.member = Some(m);
                s.state = SlotState::Rebuilding;
                s.recovery = Arc::new(AtomicU64::new(0));
                s.bitmap_recovery = false;
                s.out = None;
                s.note = None;
            }
        }
        self.decide_failed(&mut new);
        let lost = self.commit(new).await;
        drop(_g);
        if let Some(r) = retired {
            r.dev.close();
        }
        for m in lost {
            self.fail_member(&m, OutReason::MetadataWrite).await;
        }
        self.kick();
        Ok(())
    }

    /// The guard rail of `fail`: refuse when failing `m` would leave its group with more
    /// members out than it survives. The same `decide_failed` that fails the array decides.
    pub(crate) fn refuse_unsafe_fail(&self, m: &Arc<Member>) -> Result<()> {
        let mut probe = (*self.dp().state.load_full()).clone();
        let rec = crate::superblock::OutRecord {
            reason: OutReason::Admin,
            event: 0,
        };
        if !Array::mark_failed(&mut probe, m, rec) {
            return Ok(());
        }
        // No spare is handed out in the probe: a spare only rebuilds, it serves nothing yet.
        self.decide_failed(&mut probe);
        if probe.failed.is_none() {
            return Ok(());
        }
        let slot = probe
            .slots
            .iter()
            .position(|s| s.member.as_ref().is_some_and(|x| x.same(m)));
        let g = slot.map_or(0, |i| self.dp().map.set_of(i));
        let set = self.dp().map.set_slots(g);
        let w = set.len();
        let working = match slot {
            Some(_) => probe.slots[set.clone()]
                .iter()
                .filter(|s| s.state == SlotState::Active)
                .count(),
            None => 0,
        };
        let red = self.dp().geometry.redundancy();
        let rebuilding = probe.slots[set]
            .iter()
            .any(|s| s.state == SlotState::Rebuilding);
        Err(Error::WouldFail(Msg::new(format!(
            "failing {} would leave group {g} of '{}' with {working} working member{} of {w} ({} survives {red} out{}): the array would stop serving and its data would be unavailable",
            m.path,
            self.dp().name,
            if working == 1 { "" } else { "s" },
            self.dp().geometry.level,
            if rebuilding {
                "; a member being rebuilt does not count until its rebuild is done"
            } else {
                ""
            }
        )).or(Step::force("fail it anyway"))))
    }

    /// Bytes of member space the recovery of this slot's member still covers.
    pub(crate) fn recovery_bytes(&self, s: &SlotRt) -> u64 {
        let Some(m) = &s.member else { return 0 };
        let from = s.recovery.load(Ordering::Acquire).min(m.size);
        match (&self.dp().bitmap, s.bitmap_recovery) {
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
            return Err(Error::Invalid(
                format!(
                    "{path} is not a member of '{}' (its superblock names '{}', {})",
                    self.dp().name,
                    sb.name,
                    sb.array_uuid
                )
                .into(),
            ));
        }
        let st = self.dp().state.load_full();
        if st.live_members().iter().any(|m| m.uuid == sb.this_member) {
            return Err(Error::Invalid(
                format!("{path} is already a member of '{}'", self.dp().name).into(),
            ));
        }
        let event = self.event.load(Ordering::Acquire);
        let n = self.superblock(&st, event, false, uuid::Uuid::nil());
        let again = Step::force(format!(
            "wipe {path} and add it as a new member (rebuilt in full)"
        ));
        if let Verdict::Diverged { .. } = freshness::trust_of(&n, sb) {
            return Err(Error::Refused(Msg::new(format!(
                "{path} went on without '{}' (split brain: its superblock is from event {} of another session, the array is at {event}); its data is not this array's",
                self.dp().name, sb.event
            )).or(again)));
        }
        match n.role_of(&sb.this_member) {
            Role::Slot(i) if matches!(st.slots[i].state, SlotState::Failed | SlotState::Empty) => {
                Ok(ReAddPlan {
                    slot: i,
                    bitmap: freshness::bitmap_covers(&n, sb),
                })
            }
            _ => Err(Error::Refused(Msg::new(format!(
                "{path} was a member of '{}' but its place has been taken (its superblock is from event {}, the array is at {event})",
                self.dp().name, sb.event
            )).or(again))),
        }
    }

    /// Put a former member back into its slot: md's `--re-add`. It is rebuilt from the
    /// write-intent bitmap when that covers everything it missed (only the regions written
    /// while it was out), else in full; it is not read until then. Errors as `add`'s, with
    /// `Invalid` for a device that is not a former member and `Refused` for one that cannot
    /// go back (the caller may wipe it and `add` it with `force`).
    pub async fn re_add(&self, spec: MemberSpec) -> Result<ReAdd> {
        self.dp().check_writable()?;
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
        let st = self.dp().state.load_full();
        let entry = st.slots[plan.slot]
            .entry
            .clone()
            .expect("a re-added slot records its member");
        let g = &self.dp().geometry;
        if spec.dev.size() < g.data_offset.saturating_add(entry.size) {
            return Err(Error::Refused(
                format!(
                    "{} is smaller than '{}' expects ({} of data at offset {})",
                    spec.path,
                    self.dp().name,
                    human(entry.size),
                    human(g.data_offset)
                )
                .into(),
            ));
        }
        let member = Arc::new(Member {
            dev: spec.dev,
            uuid: entry.uuid,
            path: spec.path.clone(),
            domain: entry.domain.clone(),
            size: entry.size,
            is_file: spec.is_file,
            stats: Default::default(),
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
                self.dp()
                    .bitmap
                    .as_ref()
                    .map(|b| b.dirty_count())
                    .unwrap_or(0),
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
        self.decide_failed(&mut new);
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
        let st = self.dp().state.load_full();
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
