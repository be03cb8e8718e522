//! What `sbod status` shows: the array's state, every member's, and its processes.

use super::{Array, Member, SlotRt};
use crate::superblock::{OutReason, SlotState};
use std::sync::atomic::Ordering;
use std::sync::Arc;

pub use sbod_types::{ArrayState, MemberState, MemberStatus, Status};

impl Array {
    pub fn status(&self) -> Status {
        let st = self.dp().state.load_full();
        let event = self.event.load(Ordering::Relaxed);
        let mut members = Vec::new();
        let ms = |m: &Arc<Member>, slot: Option<usize>, state: MemberState| MemberStatus {
            slot,
            group: slot.map(|s| self.dp().map.set_of(s)),
            path: Some(m.path.clone()),
            uuid: Some(m.uuid.to_string()),
            state,
            reason: None,
            domain: m.domain.clone(),
            size: m.size,
            read_errors: m.stats.read_errors.load(Ordering::Relaxed),
            write_errors: m.stats.write_errors.load(Ordering::Relaxed),
            checksum_errors: m.stats.checksum_errors.load(Ordering::Relaxed),
            tag_errors: m.stats.tag_errors.load(Ordering::Relaxed),
            repaired: m.stats.repaired.load(Ordering::Relaxed),
            reads: m.stats.reads.load(Ordering::Relaxed),
            writes: m.stats.writes.load(Ordering::Relaxed),
            nospace: m.stats.nospace.load(Ordering::Relaxed),
            recovered: None,
            bitmap_recovery: false,
            recovery_bytes: None,
            health: None,
            location: None,
            identity: None,
        };
        let reason = |s: &SlotRt| -> Option<String> {
            if let Some(n) = &s.note {
                return Some(n.to_string());
            }
            match (s.state, s.out) {
                (SlotState::Active, _) => None,
                (SlotState::Rebuilding, Some(o)) if o.reason == OutReason::Stale => {
                    Some(format!("stale: event {}, array at {event}", o.event))
                }
                (SlotState::Rebuilding, Some(o)) => Some(format!("back after: {}", o.reason)),
                (SlotState::Rebuilding, None) => None,
                // While it runs, the I/O path's own words where it has them ("shrank from
                // 256 MiB to 128 MiB ..."); the recorded code otherwise.
                (_, Some(o)) => match s
                    .member
                    .as_ref()
                    .and_then(|m| m.stats.out_reason.lock().clone())
                {
                    Some(d) if o.reason != OutReason::Admin => Some(format!("failed: {d}")),
                    _ => Some(o.reason.to_string()),
                },
                (SlotState::Failed, None) => Some("failed".into()),
                (SlotState::Empty, None) => None,
            }
        };
        let mut rebuilding = false;
        for (i, s) in st.slots.iter().enumerate() {
            let missing = s.out.is_some_and(|o| o.reason == OutReason::Missing);
            match (&s.member, s.state) {
                (Some(m), SlotState::Active) => members.push(ms(m, Some(i), MemberState::Active)),
                (Some(m), SlotState::Rebuilding) => {
                    rebuilding = true;
                    // Looked at (or rescued), a stale member is not being rebuilt.
                    let stale = self.dp().read_only.load(Ordering::Relaxed)
                        && s.out.is_some_and(|o| o.reason == OutReason::Stale);
                    let mut x = ms(
                        m,
                        Some(i),
                        if stale {
                            MemberState::Stale
                        } else {
                            MemberState::Rebuilding
                        },
                    );
                    x.recovered = (!stale).then(|| s.recovery.load(Ordering::Relaxed));
                    x.bitmap_recovery = s.bitmap_recovery;
                    x.recovery_bytes = Some(self.recovery_bytes(s));
                    x.reason = reason(s);
                    members.push(x)
                }
                (Some(m), SlotState::Failed) => {
                    let mut x = ms(
                        m,
                        Some(i),
                        if missing {
                            MemberState::Missing
                        } else {
                            MemberState::Failed
                        },
                    );
                    x.reason = reason(s);
                    members.push(x)
                }
                (None, state) => members.push(MemberStatus {
                    slot: Some(i),
                    group: Some(self.dp().map.set_of(i)),
                    path: None,
                    uuid: s.entry.as_ref().map(|e| e.uuid.to_string()),
                    state: if state == SlotState::Empty {
                        MemberState::Empty
                    } else if missing || self.report.lock().missing.contains(&i) {
                        MemberState::Missing
                    } else {
                        MemberState::Failed
                    },
                    reason: reason(s),
                    domain: s
                        .entry
                        .as_ref()
                        .map(|e| e.domain.clone())
                        .unwrap_or_default(),
                    size: 0,
                    read_errors: 0,
                    write_errors: 0,
                    checksum_errors: 0,
                    tag_errors: 0,
                    repaired: 0,
                    reads: 0,
                    writes: 0,
                    nospace: 0,
                    recovered: None,
                    bitmap_recovery: false,
                    recovery_bytes: None,
                    health: None,
                    location: None,
                    identity: None,
                }),
                (Some(m), SlotState::Empty) => members.push(ms(m, Some(i), MemberState::Missing)),
            }
            if let Some((m, r)) = &s.replacement {
                rebuilding = true;
                let mut x = ms(m, Some(i), MemberState::Replacing);
                x.recovered = Some(r.load(Ordering::Relaxed));
                members.push(x);
            }
        }
        for m in &st.spares {
            members.push(ms(m, None, MemberState::Spare));
        }
        self.spare_reasons(&st, &mut members);
        let degraded = !self.whole(&st);
        let resync = self.dp().resync_offset.load(Ordering::Relaxed);
        let process = self.bg.process.lock().as_ref().map(|p| p.status());
        let rescue = self.rescue.load(Ordering::Relaxed);
        let state = if st.failed.is_some() {
            ArrayState::Failed
        } else if rescue {
            ArrayState::Rescue
        } else if rebuilding {
            ArrayState::Rebuilding
        } else if degraded {
            ArrayState::Degraded
        } else if self.reshaping().is_some() {
            ArrayState::Reshaping
        } else if resync != u64::MAX {
            ArrayState::Resyncing
        } else {
            ArrayState::Optimal
        };
        Status {
            name: self.dp().name.clone(),
            uuid: self.uuid.to_string(),
            level: self.dp().geometry.level,
            state,
            failed_reason: st.failed.clone(),
            read_only: rescue,
            size: self.dp().size,
            chunk: self.dp().geometry.chunk,
            groups: self.dp().geometry.groups,
            width: self.dp().geometry.width,
            declustered: self.dp().geometry.declustered.map(|d| d.spares),
            redundancy: self.dp().geometry.redundancy(),
            integrity: self.dp().integrity(),
            event,
            members,
            process: process.filter(|p| !p.finished),
            last_process: self.last_process(),
            bitmap_region: self.dp().bitmap.as_ref().map(|b| b.region),
            dirty_regions: self
                .dp()
                .bitmap
                .as_ref()
                .map(|b| b.dirty_count())
                .unwrap_or(0),
            inconsistent_stripes: self
                .dp()
                .bitmap
                .as_ref()
                .map(|b| b.unsynced_stripes().len() as u64)
                .unwrap_or(0),
            resync_offset: (resync != u64::MAX).then_some(resync),
            assembly: self.report(),
            recoveries: self.recovery_status(),
            sync: self.sync_status(),
            log: self.log_status(),
            fenced: self.dp().fenced_by(),
            owner: self.owner_config().map(|c| sbod_types::OwnerStatus {
                host: c.host_name.clone(),
                host_id: c.host.to_string(),
                interval_ms: c.interval.as_millis() as u64,
                lease_ms: c.lease().as_millis() as u64,
            }),
            closing: self.closing_stage(),
            tuning: crate::tuning::knobs()
                .into_iter()
                .map(|k| {
                    let v = sbod_types::KnobValue {
                        value: k.value,
                        default: k.default.to_string(),
                    };
                    (k.name.to_string(), v)
                })
                .collect(),
        }
    }

    /// A declustered layout's distributed spare space, in the words of the slots it
    /// concerns (spared, being spared or copied back, or out with no spare space left).
    fn spare_reasons(&self, st: &crate::array::State, members: &mut [MemberStatus]) {
        let Some(d) = self.dp().geometry.declustered else {
            return;
        };
        let sp = self.dp().map.spared();
        let rows = self
            .dp()
            .geometry
            .member_size
            .div_ceil(self.dp().geometry.chunk as u64);
        let at = sp.boundary.load(Ordering::Relaxed);
        for x in members.iter_mut() {
            let Some(i) = x.slot else { continue };
            if x.state == MemberState::Replacing || x.state == MemberState::Spare {
                continue;
            }
            let s = &st.slots[i];
            let into = sp.to.as_ref().is_some_and(|t| t.contains(&i));
            let why = if sp.from.contains(&i) && sp.to.is_some() && !into {
                format!("copy-back from the distributed spare space: row {at} of {rows}")
            } else if !sp.from.contains(&i) && into {
                let fb = sp.first_boundary.load(Ordering::Relaxed);
                match sp.first() {
                    Some(y) if fb < rows => format!(
                        "being rebuilt into the distributed spare space, first the stripes that also lost a chunk on slot {y}: row {fb} of {rows}"
                    ),
                    _ => format!(
                        "being rebuilt into the distributed spare space: row {at} of {rows}"
                    ),
                }
            } else if sp.from.contains(&i) && s.state == SlotState::Rebuilding {
                let last = sp.from.last().copied().unwrap_or(i);
                format!(
                    "waits to be copied back: slots are copied back last spared first, replace slot {last} first"
                )
            } else if sp.from.contains(&i) {
                "spared: its chunks live in the distributed spare space (the array has its full redundancy); replace it to copy them back".to_string()
            } else if s.state == SlotState::Failed && sp.from.len() >= d.spares as usize {
                format!(
                    "the distributed spare space is full ({} slot{} spared): the array runs degraded until a hot spare or a replacement is rebuilt",
                    sp.from.len(),
                    if sp.from.len() == 1 { "" } else { "s" }
                )
            } else {
                continue;
            };
            // Why the member went out stays first.
            x.reason = Some(match x.reason.take() {
                Some(r) => format!("{r}; {why}"),
                None => why,
            });
        }
    }
}
