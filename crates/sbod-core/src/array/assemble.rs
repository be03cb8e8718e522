//! Assembly: an array put together from its members' superblocks alone. Which copy is
//! trusted is judged by one pure function ([`crate::freshness`]); stale members are never
//! read and are recovered from the write-intent bitmap where it covers what they missed;
//! split brain is refused; members missing at start need `degraded`; a failed array can
//! only be rescued read-only.

use super::membership::stale_note;
use super::membership::utc;
use super::{read_superblock, Array, Lineage, Member, MemberSpec, SlotRt, State};
use crate::bitmap::Bitmap;
use crate::buf::AlignedBuf;
use crate::dev::{self, IoClass};
use crate::error::{Error, Msg, Result, Step};
use crate::freshness::{self, Verdict};
use crate::layout::{Geometry, Level, Scheme};
use crate::placement::Placement;
use crate::superblock::{self, OutReason, OutRecord, Role, SlotState, Superblock};
use sbod_types::{AssemblyReport, RescueReport, StaleMember};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use uuid::Uuid;

#[derive(Clone, Debug, Default)]
pub struct AssembleOptions {
    pub force: bool,
    /// Don't start rebuild/resync processes (tools that run them in the foreground).
    pub no_processes: bool,
    /// Only look: write nothing, resync nothing, start nothing (offline status).
    pub read_only: bool,
    /// Start even though members the array had in service when it stopped are missing
    /// (they are recorded as missing, and recovered from the bitmap when they come back).
    pub degraded: bool,
    /// The host this head is, and its heartbeat (see `owner`); `None`: the process
    /// default ([`crate::owner::default_config`]). With `force`, members another host
    /// holds are taken over even while its heartbeat runs (it is fenced).
    pub owner: Option<crate::owner::Config>,
}

impl Array {
    /// Assemble an array from its members' superblocks. Unless only looking, the members
    /// are claimed for this head first (see `owner`): refused while another host's
    /// heartbeat runs on them, taken over once it has stopped (after its lease).
    pub async fn assemble(members: Vec<MemberSpec>, opts: AssembleOptions) -> Result<Arc<Array>> {
        if members.is_empty() {
            return Err(Error::Invalid("no members given".into()));
        }
        let claim = if opts.read_only {
            None
        } else {
            Self::claim_members(&members, &opts).await?
        };
        let r = Self::assemble_claimed(members, opts, claim.as_ref()).await;
        if let (Err(_), Some(c)) = (&r, &claim) {
            c.release().await;
        }
        r
    }

    /// Claim the members given (those with a superblock of one array, each once) before
    /// anything of them is trusted: what another head wrote until we hold them is read
    /// after.
    async fn claim_members(
        members: &[MemberSpec],
        opts: &AssembleOptions,
    ) -> Result<Option<super::ownership::Claim>> {
        let mut devs = Vec::new();
        let mut seen = std::collections::HashSet::new();
        let mut array: Option<(Uuid, String)> = None;
        // Every member's superblock read at once: a remote member's read is a round trip,
        // and sixty of them in a row were seconds of a start.
        let sbs = futures::future::join_all(members.iter().map(|m| read_superblock(&m.dev))).await;
        for (m, sb) in members.iter().zip(sbs) {
            let Ok(sb) = sb else {
                continue;
            };
            match &array {
                Some((u, _)) if *u != sb.array_uuid => return Ok(None), // refused below
                _ => array = Some((sb.array_uuid, sb.name.clone())),
            }
            if seen.insert(sb.this_member) {
                devs.push((m.path.clone(), m.dev.clone()));
            }
        }
        let Some((uuid, name)) = array else {
            return Ok(None);
        };
        let cfg = opts
            .owner
            .clone()
            .unwrap_or_else(crate::owner::default_config);
        super::ownership::Claim::take(devs, uuid, &name, cfg, opts.force)
            .await
            .map(Some)
    }

    async fn assemble_claimed(
        members: Vec<MemberSpec>,
        opts: AssembleOptions,
        claim: Option<&super::ownership::Claim>,
    ) -> Result<Arc<Array>> {
        let (members, logs) = crate::log::slot::split(members).await;
        let mut found: Vec<(MemberSpec, Superblock)> = Vec::new();
        let mut report = AssemblyReport::default();
        let sbs = futures::future::join_all(members.iter().map(|m| read_superblock(&m.dev))).await;
        for (m, sb) in members.into_iter().zip(sbs) {
            match sb {
                Ok(sb) => found.push((m, sb)),
                Err(e) => {
                    return Err(Error::Refused(
                        format!("{e}; if {} is not an sbod member, leave it out", m.path).into(),
                    ))
                }
            }
        }
        // All members must belong to one array.
        let mut arrays: HashMap<Uuid, (String, Vec<String>)> = HashMap::new();
        for (m, sb) in &found {
            arrays
                .entry(sb.array_uuid)
                .or_insert_with(|| (sb.name.clone(), Vec::new()))
                .1
                .push(m.path.clone());
        }
        if arrays.len() > 1 {
            let desc: Vec<String> = arrays
                .iter()
                .map(|(u, (n, p))| format!("'{n}' ({u}): {}", p.join(", ")))
                .collect();
            return Err(Error::Refused(format!(
                "these members belong to different arrays: {}; assemble each array with its own members",
                desc.join("; ")
            ).into()));
        }
        Self::refuse_disagreeing(&found)?;
        Self::refuse_inconsistent(&found)?;
        // The same member given twice: the first one counts.
        let mut seen = std::collections::HashMap::new();
        found.retain(|(m, sb)| match seen.get(&sb.this_member) {
            Some(first) => {
                let why = if *first == m.path {
                    "the same member was given twice".to_string()
                } else {
                    format!("the same member was given twice ({} is {first})", m.path)
                };
                report.ignored.push((m.path.clone(), why));
                false
            }
            None => {
                seen.insert(sb.this_member, m.path.clone());
                true
            }
        });
        // Which member is trusted: one function, on the superblocks alone.
        let judged = {
            let sbs: Vec<&Superblock> = found.iter().map(|(_, sb)| sb).collect();
            freshness::rank_members(&sbs)
        };
        let verdicts = match judged {
            Ok(v) => v,
            Err(split) => {
                let msg = Self::describe_split(&found, &split);
                if !(opts.force || opts.read_only) {
                    let newest = &found[split.verdicts.newest].0.path;
                    return Err(Error::SplitBrain(
                        Msg::new(format!("{msg}. Nothing was merged or written"))
                            .or(Step::say("assemble with the members of the side that holds the data you want (the other side's members are then rebuilt from it when added)"))
                            .or(Step::force(format!(
                                "take the newest side ({newest}'s) and rebuild the others from it"
                            ))),
                    ));
                }
                report.split_brain = Some(msg);
                split.verdicts
            }
        };
        let newest = found[verdicts.newest].1.clone();
        let newest_path = found[verdicts.newest].0.path.clone();
        let g = newest.geometry.clone();
        let mut slots: Vec<SlotRt> = newest
            .slots
            .iter()
            .map(|s| SlotRt {
                entry: s.member.clone(),
                member: None,
                state: s.state,
                recovery: Arc::new(AtomicU64::new(s.recovery_offset)),
                replacement: None,
                out: s.out,
                bitmap_recovery: s.bitmap_recovery && s.state == SlotState::Rebuilding,
                note: None,
            })
            .collect();
        let mut spares = Vec::new();
        // Members whose bitmap records what the array wrote: fresh and in service.
        let mut bitmap_images: Vec<Arc<Member>> = Vec::new();
        // Slots whose member missed writes: (slot, its event, from the bitmap, path).
        let mut stale: Vec<(usize, u64, bool, String)> = Vec::new();
        // Members present but out of date that once held the slot's data, for a rescue:
        // (slot, event).
        let mut rescue_candidates: Vec<(usize, u64)> = Vec::new();
        for ((m, sb), verdict) in found.into_iter().zip(verdicts.members.iter().copied()) {
            let role = newest.role_of(&sb.this_member);
            let entry = match role {
                Role::Slot(i) => newest.slots[i].member.clone(),
                Role::Replacement(i) => {
                    newest.slots[i].replacement.as_ref().map(|(e, _)| e.clone())
                }
                Role::Spare => newest
                    .spares
                    .iter()
                    .find(|e| e.uuid == sb.this_member)
                    .cloned(),
                Role::None => None,
            };
            let Some(entry) = entry else {
                let why = if matches!(verdict, Verdict::Diverged { .. }) {
                    format!(
                        "it went on without the newest side (its superblock is from event {}, another session): not used",
                        sb.event
                    )
                } else {
                    format!(
                        "no longer a member of '{}' (its superblock is from event {}, the array is at {}): it was replaced, and can be added back as a spare",
                        newest.name, sb.event, newest.event
                    )
                };
                report.ignored.push((m.path.clone(), why));
                continue;
            };
            if m.dev.size() < g.data_offset.saturating_add(entry.size) {
                return Err(Error::Refused(
                    format!(
                        "{} is smaller than the array expects ({} of data at offset {})",
                        m.path,
                        crate::layout::human(entry.size),
                        crate::layout::human(g.data_offset)
                    )
                    .into(),
                ));
            }
            let member = Arc::new(Member {
                dev: m.dev,
                uuid: entry.uuid,
                path: m.path.clone(),
                domain: entry.domain.clone(),
                size: entry.size,
                is_file: m.is_file,
                stats: Default::default(),
                tags: Default::default(),
            });
            match role {
                Role::Slot(i) => {
                    let s = &mut slots[i];
                    s.member = Some(member.clone());
                    let in_service = matches!(s.state, SlotState::Active | SlotState::Rebuilding);
                    if verdict.is_fresh() && in_service {
                        if verdict == Verdict::FreshMissedLast {
                            report.missed_last_write.push(m.path.clone());
                        }
                        if s.state == SlotState::Rebuilding {
                            report.rebuilding.push(m.path.clone());
                        }
                        bitmap_images.push(member);
                    } else {
                        // Behind, from the other side of a forced split, or back in a slot
                        // the array records as out: it missed writes. Never read until
                        // recovered, from the bitmap where that covers what it missed.
                        let bitmap = !matches!(verdict, Verdict::Diverged { .. })
                            && freshness::bitmap_covers(&newest, &sb);
                        if let Role::Slot(j) = sb.role_of(&sb.this_member) {
                            if j == i && sb.slots[j].state == SlotState::Active {
                                rescue_candidates.push((i, sb.event));
                            }
                        }
                        s.state = SlotState::Rebuilding;
                        s.recovery = Arc::new(AtomicU64::new(0));
                        s.bitmap_recovery = bitmap;
                        s.out = Some(OutRecord {
                            reason: OutReason::Stale,
                            event: sb.event,
                        });
                        stale.push((i, sb.event, bitmap, m.path.clone()));
                        report.rebuilding.push(m.path.clone());
                    }
                }
                Role::Replacement(i) => {
                    let off = match (verdict.is_fresh(), &newest.slots[i].replacement) {
                        (true, Some((_, off))) => *off,
                        _ => 0,
                    };
                    slots[i].replacement = Some((member, Arc::new(AtomicU64::new(off))));
                    report.rebuilding.push(m.path.clone());
                }
                Role::Spare => spares.push(member),
                Role::None => unreachable!(),
            }
        }
        // Slots whose member was in service when the array stopped and is not here: an
        // array does not start without them unless told to.
        let missing: Vec<usize> = (0..slots.len())
            .filter(|&i| {
                slots[i].member.is_none()
                    && matches!(slots[i].state, SlotState::Active | SlotState::Rebuilding)
            })
            .collect();
        let allowed = opts.degraded || opts.force || opts.read_only;
        if !missing.is_empty() && !allowed {
            let sizes: Vec<u64> = slots
                .iter()
                .map(|s| s.entry.as_ref().map_or(0, |e| e.size))
                .collect();
            let map = Placement::new(&g, &sizes);
            return Err(Error::MissingMembers(crate::error::MissingMembers {
                array: newest.name.clone(),
                slots: missing
                    .iter()
                    .map(|&i| crate::error::MissingSlot {
                        slot: i,
                        group: map.set_of(i),
                        uuid: slots[i].entry.as_ref().map(|e| e.uuid),
                    })
                    .collect(),
                ignored: report.ignored.clone(),
            }));
        }
        for &i in &missing {
            let s = &mut slots[i];
            s.state = SlotState::Failed;
            s.bitmap_recovery = false;
            s.out = Some(OutRecord {
                reason: OutReason::Missing,
                event: newest.event + 1,
            });
            report.missing.push(i);
        }
        let state = State {
            slots,
            spares,
            failed: None,
        };
        // The write-intent bitmap: the union of the in-sync members' images. It says what
        // to resync after an unclean stop, and what a member that was out missed (bits are
        // kept while any slot is out).
        let mut dirty = Vec::new();
        let regions = g.member_size.div_ceil(newest.bitmap_region).max(1);
        let any_out = state.slots.iter().any(|s| s.state != SlotState::Active);
        let tagged = newest.tags.is_some();
        let bitmap_read = (g.redundancy() > 0 || tagged) && (!newest.clean || any_out);
        if bitmap_read {
            report.unclean = !newest.clean;
            let mut union = vec![0u8; newest.bitmap_bytes as usize];
            for m in &bitmap_images {
                let buf = AlignedBuf::zeroed(newest.bitmap_bytes as usize).into_shared();
                if dev::read_at(
                    &m.dev,
                    superblock::BITMAP_OFFSET,
                    buf.clone(),
                    IoClass::Foreground,
                )
                .await
                .is_ok()
                {
                    let b = buf.try_unwrap().expect("sole owner");
                    for (u, x) in union.iter_mut().zip(b.iter()) {
                        *u |= *x;
                    }
                }
            }
            dirty = Bitmap::set_bits(&union, regions);
        }
        // A start for writing is a new session; looking (or a rescue) starts nothing.
        let (session, history) = if opts.read_only {
            (newest.session, newest.history.clone())
        } else {
            Lineage::start(&newest.history, newest.event + 1)
        };
        let array = Array::build(
            newest.name.clone(),
            newest.array_uuid,
            newest.created,
            g,
            state,
            newest.event,
            newest.bitmap_region,
            newest.bitmap_bytes,
            newest.resync_offset,
            &dirty,
            Lineage {
                session,
                history,
                bitmap_since: AtomicU64::new(newest.bitmap_since),
                tags: newest.tags,
                extensions: newest.extensions.clone(),
            },
        )?;
        if let Some(c) = claim {
            array.hold(c);
        }
        // The distributed spare space in use, and a transition under way (resumed by the
        // supervisor from its recorded row).
        let sp = &newest.spared;
        let l = |v: &[u16]| v.iter().map(|&x| x as usize).collect::<Vec<usize>>();
        array.dp().map.set_spared_first(
            l(&sp.list),
            sp.next.as_ref().map(|(t, _)| l(t)),
            sp.next.as_ref().map_or(0, |(_, b)| *b),
            sp.first
                .filter(|_| sp.next.is_some())
                .map(|(y, b)| (y as usize, b)),
        );
        array.sync.restore(&newest, logs);
        if let Some(rec) = &newest.reshape {
            array.resume_reshape(rec);
        }
        let mut st = (*array.dp().state.load_full()).clone();
        for (i, event, bitmap, path) in stale {
            let planned = array.recovery_bytes(&st.slots[i]);
            let note = if opts.read_only {
                // Only looking: nothing will be recovered.
                format!("stale: event {event}, array at {}", newest.event)
            } else {
                stale_note(
                    event,
                    newest.event,
                    bitmap,
                    planned,
                    array.dp().bitmap.as_ref(),
                )
            };
            st.slots[i].note = Some(note.clone().into());
            report.stale.push(StaleMember {
                path,
                slot: i,
                event,
                array_event: newest.event,
                bitmap,
                planned_bytes: planned,
                note,
            });
        }
        if opts.read_only {
            array.dp().read_only.store(true, Ordering::Release);
            array.dp().closing.store(true, Ordering::Release);
            array.decide_failed(&mut st);
            array.dp().state.store(Arc::new(st));
            *array.report.lock() = report;
            return Ok(array);
        }
        let mut probe = st.clone();
        array.decide_failed(&mut probe);
        if let Some(why) = probe.failed {
            if opts.force {
                return Ok(array.rescue(st, report, rescue_candidates, &newest));
            }
            // Members judged stale are judged against the newest superblock: name it, for a
            // newest that is wrong (a damaged or foreign copy) is what to look at then.
            let against = if why.contains("(stale)") {
                format!(
                    " (judged against the newest superblock, event {} on {newest_path})",
                    newest.event
                )
            } else {
                String::new()
            };
            return Err(Error::Failed(
                Msg::new(format!(
                    "'{}' cannot start: {why}{against}",
                    array.dp().name
                ))
                .or(Step::say(
                    "find the missing members and assemble again with them",
                ))
                .or(Step::force(
                    "start it read-only and copy off what is readable",
                )),
            ));
        }
        // Forced past the write hole: the user accepts the parity of the dirty regions as
        // it is for the chunks that must be rebuilt from it (md's --force on a dirty
        // degraded array), so the resync below does not hold those stripes.
        // The log replayed: with every write journaled, every stripe is consistent again.
        let log_covers = array.attach_logs(&newest, &st, &opts).await?;
        let mut forced_hole = log_covers;
        if !newest.clean && !log_covers {
            if let Err(e) = Self::refuse_write_hole(&newest, &st, &dirty) {
                if !opts.force {
                    return Err(e);
                }
                tracing::warn!(array = %array.dp().name, "{e}: forced");
                forced_hole = true;
            }
        }
        let recovering: Vec<usize> = (0..st.slots.len())
            .filter(|&i| st.slots[i].state == SlotState::Rebuilding)
            .collect();
        array.take_spares(&mut st);
        array.decide_failed(&mut st);
        for &i in &recovering {
            let s = &st.slots[i];
            if let Some(m) = &s.member {
                let reason = s
                    .note
                    .as_deref()
                    .map(|n| n.split(';').next().unwrap_or(n).to_string())
                    .unwrap_or_else(|| "rebuild resumed".into());
                array.log_recovery(i, m, reason, s.bitmap_recovery, array.recovery_bytes(s));
            }
        }
        array.dp().state.store(Arc::new(st));
        // Two superblock writes start a session: the start, then the opening once the start
        // is on every member. Nothing is written before the opening, so a member that
        // missed only the start of the newest session missed no data (`freshness` trusts
        // it), while one that stopped before a session that opened is behind.
        for _ in 0..2 {
            let _g = array.mgmt.lock().await;
            let st = array.dp().state.load_full();
            let lost = array.persist(&st, false).await;
            if !lost.is_empty() {
                drop(_g);
                for m in lost {
                    array.fail_member(&m, OutReason::MetadataWrite).await;
                }
            }
        }
        // The start (and with it the unclean mark the write-intent bitmap relies on) must
        // be on the members before anything is written. If so many members refused the
        // superblock write that the array failed, it never started: say so rather than
        // hand out an array that serves nothing and whose start left no trace.
        if let Some(why) = array.dp().state.load_full().failed.clone() {
            if !opts.force {
                array.abandon().await;
                return Err(Error::Failed(format!(
                    "'{}' failed while starting: {why}. Check the members' paths and health, then assemble again",
                    array.dp().name
                ).into()));
            }
        }
        // Every member in service carries the whole bitmap from now on: the union of what
        // the members in sync had (a member back from being out, or an old copy, carries
        // bits of its own past, or lacks recent ones).
        if bitmap_read {
            array
                .dp()
                .sync_bitmap(&array.dp().state.load_full().live_members())
                .await;
        }
        *array.report.lock() = report;
        if let Some(r) = array.reshaping() {
            // A window being moved in place at the crash is written from its backup.
            array.restore_backup(&r).await?;
        }
        if !newest.clean && !dirty.is_empty() {
            let (bytes, n) = match array.resync_regions(&dirty).await {
                // Out of space: serve anyway, with those stripes held as inconsistent
                // (never rebuilt from, their regions dirty) until the watch resyncs them.
                Err(Error::NoSpace(msg)) => {
                    tracing::warn!(array = %array.dp().name, "{msg}; the resync waits for space");
                    array.dp().defer_resync(&dirty);
                    (0, 0)
                }
                r => {
                    let r = r?;
                    if forced_hole {
                        if let Some(bm) = &array.dp().bitmap {
                            for (g, t) in bm.unsynced_stripes() {
                                bm.synced(g, t, 1);
                            }
                        }
                    }
                    r
                }
            };
            let mut r = array.report.lock();
            r.resynced_bytes = bytes;
            r.resynced_regions = n;
        }
        if !opts.no_processes {
            array.start_processes();
        }
        Ok(array)
    }

    /// Name both sides of a split brain: members, events, when each was last started.
    fn describe_split(found: &[(MemberSpec, Superblock)], split: &freshness::SplitBrain) -> String {
        let side = |idx: Vec<usize>| -> String {
            let paths: Vec<&str> = idx.iter().map(|&i| found[i].0.path.as_str()).collect();
            let best = idx
                .iter()
                .map(|&i| &found[i].1)
                .max_by_key(|sb| sb.event)
                .expect("a side has members");
            let started = freshness::session_started(best)
                .map(|t| format!(", last started {}", utc(t)))
                .unwrap_or_default();
            format!("{} (event {}{started})", paths.join(", "), best.event)
        };
        format!(
            "the members of '{}' went on in two separate sets without each other (split brain): {} and {}",
            found[split.verdicts.newest].1.name,
            side(split.newest_side()),
            side(split.other_side())
        )
    }

    /// What never changes in an array's life must read the same on every member: a member
    /// that says otherwise carries a damaged (or forged) superblock, whatever its checksum
    /// says, and must not decide the layout (the newest superblock would). That is where
    /// data starts, the bitmap and the creation time; the level, width, groups, chunk and
    /// member size change with `sbod grow`, recorded with the event like every other
    /// state change, so a member that missed a grow is stale, not damaged (and members of
    /// one superblock write that differ in them are refused by `refuse_inconsistent`).
    fn refuse_disagreeing(found: &[(MemberSpec, Superblock)]) -> Result<()> {
        type Ident = (Geometry, u64, u32, u64);
        let ident = |sb: &Superblock| -> Ident {
            let g = &sb.geometry;
            (
                Geometry {
                    level: Level::Raid0,
                    groups: 0,
                    width: 0,
                    chunk: 4096,
                    member_size: 0,
                    dedicated: 0,
                    ..g.clone()
                },
                sb.bitmap_region,
                sb.bitmap_bytes,
                sb.created,
            )
        };
        let mut kinds: Vec<(Ident, Vec<&str>)> = Vec::new();
        for (m, sb) in found {
            let k = ident(sb);
            match kinds.iter_mut().find(|(x, _)| *x == k) {
                Some((_, v)) => v.push(&m.path),
                None => kinds.push((k, vec![&m.path])),
            }
        }
        if kinds.len() < 2 {
            return Ok(());
        }
        kinds.sort_by_key(|(_, v)| std::cmp::Reverse(v.len()));
        let name = &found[0].1.name;
        if kinds[0].1.len() == kinds[1].1.len() {
            let desc: Vec<String> = kinds
                .iter()
                .map(|((g, ..), v)| format!("{} say data at {}", v.join(", "), g.data_offset))
                .collect();
            return Err(Error::Refused(
                Msg::new(format!(
                    "the members of '{name}' disagree about its layout ({}): some superblocks are damaged",
                    desc.join("; ")
                ))
                .or(Step::Examine)
                .or(Step::say("assemble with the members that agree")),
            ));
        }
        let odd: Vec<&str> = kinds[1..].iter().flat_map(|(_, v)| v.clone()).collect();
        let it = if odd.len() == 1 { "it" } else { "them" };
        Err(Error::Refused(
            Msg::new(format!(
                "the superblock of {} disagrees with the other members of '{name}' about what never changes in the array (data offset, bitmap or creation time): it is damaged",
                odd.join(", "),
            ))
            .or(Step::degraded(format!(
                "assemble without {it}; the array runs degraded and rebuilds onto {it} once wiped and added back"
            )))
            .or(Step::Examine),
        ))
    }

    /// Members written by the same superblock write (same session and event) carry the
    /// same superblock but for the member's own id. One that says otherwise was damaged (or
    /// forged) with a checksum to match, and must not decide who is in which slot.
    fn refuse_inconsistent(found: &[(MemberSpec, Superblock)]) -> Result<()> {
        let same = |a: &Superblock, b: &Superblock| {
            Superblock {
                this_member: Uuid::nil(),
                ..a.clone()
            } == Superblock {
                this_member: Uuid::nil(),
                ..b.clone()
            }
        };
        let mut odd: Vec<&str> = Vec::new();
        for (i, (m, sb)) in found.iter().enumerate() {
            let peers: Vec<&Superblock> = found
                .iter()
                .enumerate()
                .filter(|(j, (_, x))| *j != i && x.session == sb.session && x.event == sb.event)
                .map(|(_, (_, x))| x)
                .collect();
            let agree = peers.iter().filter(|x| same(x, sb)).count();
            // Disagreeing with at least as many as agree (itself included): not trusted.
            if !peers.is_empty() && peers.len() - agree > agree {
                odd.push(&m.path);
            }
        }
        if odd.is_empty() {
            return Ok(());
        }
        let it = if odd.len() == 1 { "it" } else { "them" };
        Err(Error::Refused(
            Msg::new(format!(
                "the superblock of {} disagrees with the other members of '{}' written at the same time (who holds which slot, or its state): it is damaged",
                odd.join(", "),
                found[0].1.name,
            ))
            .or(Step::degraded(format!(
                "assemble without {it}; the array runs degraded and rebuilds onto {it} once wiped and added back"
            )))
            .or(Step::Examine),
        ))
    }

    /// The RAID write hole: after a crash, parity in the dirty regions may not match the
    /// data. With every member present the resync makes it match again; but a chunk that
    /// has to be rebuilt from that parity (its member missing, failed, or not yet rebuilt
    /// there) would come back wrong, silently. Refuse to start such an array unless forced
    /// (md refuses a "dirty degraded array" likewise).
    fn refuse_write_hole(sb: &Superblock, st: &State, dirty: &[u64]) -> Result<()> {
        let g = &sb.geometry;
        if dirty.is_empty() || !matches!(g.scheme(), Scheme::Parity { m, .. } if m > 0) {
            return Ok(());
        }
        // Who must be rebuilt from that parity, and why: a slot whose member is not here
        // (bringing it back closes the hole: its data is read, not rebuilt), or a member
        // that is here but holds no current data there yet (stale, or being rebuilt: a
        // replacement or a new member), for which nothing but parity holds that data.
        let mut missing = Vec::new();
        let mut here = Vec::new();
        let (w, d) = (g.width as usize, g.dedicated as usize);
        for (i, s) in st.slots.iter().enumerate() {
            if i % w >= w - d {
                // A dedicated parity member (a level change's) holds parity only: what it
                // must hold is computed from the data, never rebuilt from parity.
                continue;
            }
            // A declustered slot whose chunks live in the distributed spare space holds
            // nothing to rebuild; one being spared, nothing below the transition's row.
            let spared = &sb.spared;
            if spared.list.contains(&(i as u16)) {
                continue;
            }
            let moved = match &spared.next {
                Some((l, row)) if l.contains(&(i as u16)) => row * g.chunk as u64,
                _ => 0,
            };
            let risky = dirty.iter().any(|&r| {
                let end = ((r + 1) * sb.bitmap_region).min(g.member_size);
                end > moved && s.readable(end).is_none()
            });
            if !risky {
                continue;
            }
            match &s.member {
                None => missing.push(format!("slot {i} (missing)")),
                Some(m) => {
                    let why = match (s.state, s.out) {
                        (SlotState::Rebuilding, Some(o)) if o.reason == OutReason::Stale => {
                            "stale".to_string()
                        }
                        (SlotState::Rebuilding, _) => format!(
                            "slot {i}, a new member or a replacement, rebuilt up to {} of {}",
                            crate::layout::human(s.recovery.load(Ordering::Acquire)),
                            crate::layout::human(g.member_size)
                        ),
                        (state, _) => format!("{state:?}").to_lowercase(),
                    };
                    here.push(format!("{} ({why})", m.path));
                }
            }
        }
        if missing.is_empty() && here.is_empty() {
            return Ok(());
        }
        let (more, log) = crate::log::slot::write_hole_hint(sb);
        let at_risk: Vec<String> = missing.iter().chain(here.iter()).cloned().collect();
        let mut text = format!(
            "'{}' was not shut down cleanly and is degraded: parity in {} region(s) written at the time may not match the data, so what {} must hold there cannot be rebuilt reliably (the RAID write hole){more}",
            sb.name,
            dirty.len(),
            at_risk.join(", ")
        );
        if missing.is_empty() {
            text.push_str(
                "; every member is here: none holds that data but the parity, so no member is missing that would help",
            );
        }
        let mut msg = Msg::new(text);
        if !missing.is_empty() {
            msg = msg.or(Step::say(
                "bring back the member(s) of the missing slot(s) and start again: their data is read, not rebuilt",
            ));
        }
        msg = msg.or(Step::force(format!(
            "start anyway, rebuilding {} from that parity: blocks written there just before the crash may read wrong (old, or mixed) afterwards; the rest of the volume is not affected",
            if here.is_empty() && missing.len() == 1 { "that slot" } else { "them" }
        )));
        msg.advice.extend(log);
        Err(Error::Refused(msg))
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
        let red = self.dp().geometry.redundancy();
        candidates.sort_by_key(|&(_, e)| std::cmp::Reverse(e));
        let mut rescue = RescueReport::default();
        for g in 0..self.dp().map.sets() {
            let out = |st: &State| {
                st.slots[self.dp().map.set_slots(g)]
                    .iter()
                    .filter(|s| s.state != SlotState::Active)
                    .count()
            };
            for &(i, event) in candidates
                .iter()
                .filter(|(i, _)| self.dp().map.set_of(*i) == g)
            {
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
                self.dp().name
            ));
        }
        // Serve what can be read: a group still short answers its reads with errors.
        self.decide_failed(&mut st);
        st.failed = None;
        self.dp().read_only.store(true, Ordering::Release);
        self.rescue.store(true, Ordering::Release);
        self.dp().state.store(Arc::new(st));
        tracing::info!(array = %self.dp().name, used = ?rescue.used, "started read-only for a rescue");
        report.rescue = Some(rescue);
        *self.report.lock() = report;
        self
    }
}
