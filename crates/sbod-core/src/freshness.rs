//! Which members are trusted: one pure function over the superblocks found at assembly.
//!
//! Every member carries the array's event counter (+1 per superblock write), the session it
//! was last written in (a new id each time the array is started for writing) and, in the
//! newest superblock, the last starts (`history`). The member with the highest event is the
//! newest, N. Against it each member is:
//!
//! - **fresh**: same session and event as N. N's record of its slot applies.
//! - **fresh, missed the last write**: exactly one event behind N, in N's session; or the
//!   last event of the session before, when N's session has had only its start write (a
//!   session opens for data with a second superblock write, so nothing was written in it).
//!   A superblock write goes to every member at once and only a crash leaves it on some of
//!   them; since a member is never left out of a data write before its failure is durable
//!   on the others (the state is persisted before it is used), such a member received
//!   every write the array acknowledged. md accepts the same margin of one ("the superblock
//!   update may have been interrupted"). Recovering it instead would be worse after an
//!   unclean stop: it would be rebuilt from parity the crash may have left stale (the
//!   write hole). A copy of a member taken while the array was stopped is always behind:
//!   the session it ends was followed by a start and an opening.
//! - **behind**: in N's lineage (its session is N's, or one N's history shows ended before
//!   the next began) but older: it missed writes. Never read until recovered: from the
//!   write-intent bitmap when the bitmap covers everything since its event
//!   ([`bitmap_covers`]), else in full. A member older than N's whole history is behind as
//!   well: too old to know, so never data.
//! - **diverged**: its session is not in N's lineage, or it went on in a session after N's
//!   lineage had moved to the next one: two sets of members each went on without the other
//!   (split brain). Never merged silently: assembly refuses and names both sides; forced, it
//!   takes N's side and the others are rebuilt in full.
//!
//! Not covered, as in md: a copy of a member taken while the array runs (a file copied
//! under a live server, not a consistent image anyway), put back while the array's event
//! has moved by one at most.

use crate::superblock::{Role, SlotState, Superblock};
use uuid::Uuid;

/// How one member's superblock relates to the newest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Same session and event as the newest.
    Fresh,
    /// One event behind in the newest's lineage: it missed only the newest superblock
    /// write, which a crash interrupted. Its data is as good as the others'.
    FreshMissedLast,
    /// In the newest's lineage, stopped getting updates at `event`: it missed writes.
    /// `bitmap`: the newest's write-intent bitmap records everything it missed.
    Behind { event: u64, bitmap: bool },
    /// Went on without the newest's lineage (split brain).
    Diverged { event: u64 },
}

impl Verdict {
    /// Its data is as current as the newest's record of it says.
    pub fn is_fresh(self) -> bool {
        matches!(self, Verdict::Fresh | Verdict::FreshMissedLast)
    }
}

/// The judgement of a set of superblocks, in the order given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdicts {
    /// Index of the newest superblock.
    pub newest: usize,
    pub members: Vec<Verdict>,
}

/// Two lineages that each went on without the other.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SplitBrain {
    /// The verdicts taking the newest's side (what `--force` does): the other side's
    /// members are `Diverged`, recovered in full if used at all.
    pub verdicts: Verdicts,
}

impl SplitBrain {
    /// Indices of the members on the newest's side.
    pub fn newest_side(&self) -> Vec<usize> {
        (0..self.verdicts.members.len())
            .filter(|&i| !matches!(self.verdicts.members[i], Verdict::Diverged { .. }))
            .collect()
    }

    /// Indices of the members that went on elsewhere.
    pub fn other_side(&self) -> Vec<usize> {
        (0..self.verdicts.members.len())
            .filter(|&i| matches!(self.verdicts.members[i], Verdict::Diverged { .. }))
            .collect()
    }
}

/// When the session a superblock was written in started (Unix seconds), if it says.
pub fn session_started(sb: &Superblock) -> Option<u64> {
    sb.history
        .iter()
        .rev()
        .find(|h| h.id == sb.session)
        .map(|h| h.started)
}

/// Rank every member against the newest superblock (which to trust, which to recover,
/// which went on elsewhere). Pure: superblocks in, verdicts out.
pub fn rank_members(found: &[&Superblock]) -> Result<Verdicts, SplitBrain> {
    assert!(!found.is_empty(), "rank_members needs a superblock");
    // The newest: highest event. Ties between sessions are split brain whichever wins;
    // the later start (then the larger side) is the side `--force` takes.
    let side_size = |s: &Uuid| found.iter().filter(|x| &x.session == s).count();
    let newest = (0..found.len())
        .max_by_key(|&i| {
            let sb = found[i];
            (
                sb.event,
                session_started(sb).unwrap_or(0),
                side_size(&sb.session),
                std::cmp::Reverse(i),
            )
        })
        .expect("non-empty");
    let n = found[newest];
    let members: Vec<Verdict> = found.iter().map(|x| verdict(n, x)).collect();
    let v = Verdicts { newest, members };
    if v.members
        .iter()
        .any(|m| matches!(m, Verdict::Diverged { .. }))
    {
        return Err(SplitBrain { verdicts: v });
    }
    Ok(v)
}

/// How far one member is to be trusted against a newest superblock (`re_add` asks it of
/// a member that comes back, against the running array's own).
pub fn trust_of(n: &Superblock, x: &Superblock) -> Verdict {
    verdict(n, x)
}

/// Where `x` stands in `n`'s lineage.
fn verdict(n: &Superblock, x: &Superblock) -> Verdict {
    let behind = || Verdict::Behind {
        event: x.event,
        bitmap: bitmap_covers(n, x),
    };
    if x.session == n.session {
        return if x.event >= n.event {
            Verdict::Fresh
        } else if x.event + 1 == n.event {
            Verdict::FreshMissedLast
        } else {
            behind()
        };
    }
    if n.history.is_empty() {
        // Written by a version without sessions: the events alone must tell.
        return if x.event < n.event {
            behind()
        } else {
            Verdict::Diverged { event: x.event }
        };
    }
    if x.session.is_nil() {
        // Written by a version without sessions, before N's lineage began recording them:
        // it belongs before N's oldest recorded start.
        let first = &n.history[0];
        return if x.event >= first.start_event {
            Verdict::Diverged { event: x.event }
        } else if n.history.len() == 1
            && x.event + 1 == first.start_event
            && first.start_event == n.event
        {
            Verdict::FreshMissedLast
        } else {
            behind()
        };
    }
    match n.history.iter().position(|h| h.id == x.session) {
        Some(i) => {
            let Some(next) = n.history.get(i + 1) else {
                // Its session is N's last recorded start but not N's own: N's lineage
                // cannot place it.
                return Verdict::Diverged { event: x.event };
            };
            if x.event >= next.start_event {
                // It went on after N's lineage had moved to the next session.
                return Verdict::Diverged { event: x.event };
            }
            // Only N's own session's first write missed: N began its session with that
            // one write, which a crash interrupted.
            let last = i + 2 == n.history.len() && next.id == n.session;
            if last && x.event + 1 == next.start_event && next.start_event == n.event {
                Verdict::FreshMissedLast
            } else {
                behind()
            }
        }
        None => {
            let oldest = n.history[0].start_event;
            if x.event < oldest {
                // Older than everything N remembers: too old to know, never data.
                behind()
            } else {
                Verdict::Diverged { event: x.event }
            }
        }
    }
}

/// Does `n`'s write-intent bitmap record everything `x` missed? Yes when the layout keeps
/// a bitmap, `x` was in sync in the slot `n` still gives it when it stopped getting
/// updates (or was itself being recovered from the bitmap there: what it still lacked is
/// in bits that are still set), and no bit has been cleared since (`bitmap_since`: before
/// clearing any bit the array moves `bitmap_since` to its current event, and it clears
/// nothing while a slot is out).
pub fn bitmap_covers(n: &Superblock, x: &Superblock) -> bool {
    if n.geometry.redundancy() == 0 || x.event < n.bitmap_since || x.array_uuid != n.array_uuid {
        return false;
    }
    // A member that missed a grow (a new layout or size, a reshape's progress) missed
    // more than client writes: the data moved, or new space was zeroed.
    let at = |s: &Superblock| s.reshape.as_ref().map(|r| (r.old.clone(), r.pos));
    if x.geometry != n.geometry || at(x) != at(n) {
        return false;
    }
    match (x.role_of(&x.this_member), n.role_of(&x.this_member)) {
        (Role::Slot(i), Role::Slot(j)) => {
            let own = &x.slots[i];
            i == j
                && match own.state {
                    SlotState::Active => own.out.is_none(),
                    SlotState::Rebuilding => own.bitmap_recovery,
                    _ => false,
                }
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{Geometry, Level};
    use crate::superblock::{MemberEntry, OutReason, OutRecord, SessionRec, Slot};
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    const M: usize = 4;

    /// A member in the simulation: its superblock's fields and the writes its data holds.
    #[derive(Clone, Debug)]
    struct SimMember {
        uuid: Uuid,
        session: Uuid,
        event: u64,
        history: Vec<SessionRec>,
        bitmap_since: u64,
        /// Slot states as this member's superblock records them.
        states: Vec<SlotState>,
        writes: BTreeSet<u32>,
        /// Writes whose region's bit is set in this member's bitmap.
        bits: BTreeSet<u32>,
        /// What the array held (the writes it acknowledged) while this member was in it:
        /// the truth of its lineage, whatever this member's own data is.
        view: BTreeSet<u32>,
    }

    /// A running session.
    struct Running {
        members: Vec<usize>,
        id: Uuid,
        event: u64,
        history: Vec<SessionRec>,
        bitmap_since: u64,
        states: Vec<SlotState>,
        /// Writes whose bit is set in the running array's bitmap.
        bits: BTreeSet<u32>,
        /// The writes the array acknowledged.
        view: BTreeSet<u32>,
    }

    struct Sim {
        members: Vec<SimMember>,
        run: Option<Running>,
        next_write: u32,
        starts: usize,
        snapshots: Vec<Option<SimMember>>,
    }

    fn uuids() -> Vec<Uuid> {
        (0..M as u128).map(|i| Uuid::from_u128(i + 1)).collect()
    }

    fn superblock(m: &SimMember) -> Superblock {
        let ids = uuids();
        Superblock {
            array_uuid: Uuid::from_u128(99),
            name: "t".into(),
            created: 0,
            event: m.event,
            this_member: m.uuid,
            geometry: Geometry {
                level: Level::Raid6,
                groups: 1,
                width: M as u32,
                chunk: 4096,
                member_size: 4096 * 16,
                data_offset: 1 << 20,
                dedicated: 0,
                declustered: None,
            },
            bitmap_region: 4096,
            bitmap_bytes: 4096,
            clean: true,
            resync_offset: u64::MAX,
            slots: (0..M)
                .map(|i| Slot {
                    member: Some(MemberEntry {
                        uuid: ids[i],
                        domain: String::new(),
                        size: 4096 * 16,
                    }),
                    state: m.states[i],
                    recovery_offset: 0,
                    replacement: None,
                    out: (m.states[i] == SlotState::Failed).then_some(OutRecord {
                        reason: OutReason::Missing,
                        event: m.event,
                    }),
                    bitmap_recovery: false,
                })
                .collect(),
            spares: Vec::new(),
            session: m.session,
            history: m.history.clone(),
            bitmap_since: m.bitmap_since,
            sync: Default::default(),
            log: Default::default(),
            tags: None,
            reshape: None,
            spared: Default::default(),
            extensions: Vec::new(),
        }
    }

    #[derive(Clone, Debug)]
    enum Step {
        /// Start with the members in the mask (those with the newest superblock among them
        /// lead; the others are recovered at once).
        Start(u8),
        /// A crash while the start's superblock writes were under way: only the members in
        /// the second mask got the start (with `true`: all got the start, those in the mask
        /// the opening), and nothing was written or recovered yet.
        TornStart(u8, u8, bool),
        Write,
        Persist,
        /// A crash in the middle of a superblock write: the members in the mask got it.
        TornPersist(u8),
        /// The sweeper clears the bits of idle regions.
        Clear,
        Stop,
        Crash,
        Snapshot(usize),
        Restore(usize),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            3 => (1u8..16).prop_map(Step::Start),
            1 => (1u8..16, any::<u8>(), any::<bool>()).prop_map(|(a, b, c)| Step::TornStart(a, b, c)),
            4 => Just(Step::Write),
            2 => Just(Step::Persist),
            1 => any::<u8>().prop_map(Step::TornPersist),
            2 => Just(Step::Clear),
            3 => Just(Step::Stop),
            1 => Just(Step::Crash),
            1 => (0..M).prop_map(Step::Snapshot),
            1 => (0..M).prop_map(Step::Restore),
        ]
    }

    impl Sim {
        fn new() -> Sim {
            let ids = uuids();
            let session = Uuid::from_u128(1000);
            let hist = vec![SessionRec {
                id: session,
                start_event: 1,
                started: 0,
            }];
            Sim {
                members: (0..M)
                    .map(|i| SimMember {
                        uuid: ids[i],
                        session,
                        event: 1,
                        history: hist.clone(),
                        bitmap_since: 1,
                        states: vec![SlotState::Active; M],
                        writes: BTreeSet::new(),
                        bits: BTreeSet::new(),
                        view: BTreeSet::new(),
                    })
                    .collect(),
                run: None,
                next_write: 1,
                starts: 0,
                snapshots: vec![None; M],
            }
        }

        fn persist_to(&mut self, who: &[usize]) {
            let r = self.run.as_mut().expect("running");
            r.event += 1;
            for &i in who {
                let m = &mut self.members[i];
                m.session = r.id;
                m.event = r.event;
                m.history = r.history.clone();
                m.bitmap_since = r.bitmap_since;
                m.states = r.states.clone();
                m.bits = r.bits.clone();
                m.view = r.view.clone();
            }
        }

        fn start(&mut self, mask: u8, torn: Option<(u8, bool)>) {
            if self.run.is_some() || self.starts >= 12 {
                return;
            }
            let who: Vec<usize> = (0..M).filter(|i| mask & (1 << i) != 0).collect();
            // Lead: the newest of those given; the others are recovered from it.
            let lead = *who
                .iter()
                .max_by_key(|&&i| (self.members[i].event, std::cmp::Reverse(i)))
                .expect("mask is non-zero");
            let l = self.members[lead].clone();
            if torn.is_none() {
                for &i in &who {
                    self.members[i].writes = l.view.clone();
                }
            }
            let id = Uuid::from_u128(2000 + self.starts as u128);
            self.starts += 1;
            let start = l.event + 1;
            let mut history = l.history.clone();
            history.push(SessionRec {
                id,
                start_event: start,
                started: self.starts as u64,
            });
            let skip = history.len().saturating_sub(crate::superblock::MAX_HISTORY);
            history.drain(..skip);
            let states = (0..M)
                .map(|i| {
                    if !who.contains(&i) {
                        SlotState::Failed
                    } else if self.members[i].writes == l.view {
                        SlotState::Active
                    } else {
                        // Not recovered yet (a torn start): recorded as rebuilding.
                        SlotState::Rebuilding
                    }
                })
                .collect();
            self.run = Some(Running {
                members: who.clone(),
                id,
                event: l.event,
                history,
                bitmap_since: l.bitmap_since,
                states,
                bits: l.bits.clone(),
                view: l.view.clone(),
            });
            match torn {
                None => {
                    // The start, then the opening.
                    self.persist_to(&who);
                    self.persist_to(&who);
                }
                Some((got, open)) => {
                    let got: Vec<usize> = who
                        .iter()
                        .copied()
                        .filter(|i| got & (1 << i) != 0)
                        .collect();
                    if open {
                        self.persist_to(&who);
                    }
                    self.persist_to(&got);
                    self.run = None;
                }
            }
        }

        fn apply(&mut self, s: &Step) {
            match *s {
                Step::Start(mask) => self.start(mask, None),
                Step::TornStart(mask, got, open) => self.start(mask, Some((got, open))),
                Step::Write => {
                    if let Some(r) = self.run.as_mut() {
                        let w = self.next_write;
                        self.next_write += 1;
                        // The bit is durable on every member before the data is written.
                        r.bits.insert(w);
                        r.view.insert(w);
                        for &i in &r.members {
                            self.members[i].writes.insert(w);
                            self.members[i].bits.insert(w);
                            self.members[i].view.insert(w);
                        }
                    }
                }
                Step::Persist => {
                    if let Some(r) = &self.run {
                        let who = r.members.clone();
                        self.persist_to(&who);
                    }
                }
                Step::TornPersist(mask) => {
                    if let Some(r) = &self.run {
                        let who: Vec<usize> = r
                            .members
                            .iter()
                            .copied()
                            .filter(|i| mask & (1 << i) != 0)
                            .collect();
                        self.persist_to(&who);
                        self.run = None;
                    }
                }
                Step::Clear => {
                    let Some(r) = &self.run else { return };
                    // Nothing is cleared while a slot is out.
                    if r.members.len() < M {
                        return;
                    }
                    if r.bitmap_since < r.event {
                        let who = r.members.clone();
                        let r = self.run.as_mut().unwrap();
                        r.bitmap_since = r.event + 1;
                        self.persist_to(&who);
                    }
                    let r = self.run.as_mut().unwrap();
                    r.bits.clear();
                    for &i in &r.members {
                        self.members[i].bits.clear();
                    }
                }
                Step::Stop => {
                    let Some(r) = &self.run else { return };
                    let who = r.members.clone();
                    if who.len() == M {
                        // A clean stop of a whole array clears the whole bitmap.
                        let r = self.run.as_mut().unwrap();
                        r.bitmap_since = r.event + 1;
                        r.bits.clear();
                    }
                    self.persist_to(&who);
                    self.run = None;
                }
                Step::Crash => self.run = None,
                Step::Snapshot(i) => {
                    if self.run.is_none() {
                        self.snapshots[i] = Some(self.members[i].clone());
                    }
                }
                Step::Restore(i) => {
                    if self.run.is_none() {
                        if let Some(s) = self.snapshots[i].clone() {
                            self.members[i] = s;
                        }
                    }
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

        /// Random lives of a 4-member array (starts with any subset, writes, superblock
        /// writes torn by crashes, bitmap clears, old copies put back, sides that went on
        /// alone), then every member judged against the newest:
        /// - never fresh while it lacks a write the newest has (a stale member is never
        ///   read);
        /// - behind and recoverable from the bitmap only if every write it lacks still has
        ///   its bit set;
        /// - a member holding a write the newest lacks is never quietly behind or fresh: it
        ///   is on another side, and the split is refused;
        /// - a member that got every superblock write, or missed only the last (torn) one,
        ///   is fresh: no needless rebuild.
        #[test]
        fn verdicts_match_what_each_member_holds(steps in proptest::collection::vec(step(), 1..40)) {
            let mut sim = Sim::new();
            for s in &steps {
                sim.apply(s);
            }
            // Judge as the next assembly does, with every member given.
            sim.run = None;
            let sbs: Vec<Superblock> = sim.members.iter().map(superblock).collect();
            let refs: Vec<&Superblock> = sbs.iter().collect();
            let (v, split) = match rank_members(&refs) {
                Ok(v) => (v, false),
                Err(sb) => (sb.verdicts, true),
            };
            let n = &sim.members[v.newest];
            for (i, m) in sim.members.iter().enumerate() {
                // Against what the newest's lineage acknowledged.
                let lacks: Vec<u32> = n.view.difference(&m.writes).copied().collect();
                let extra: Vec<u32> = m.writes.difference(&n.view).copied().collect();
                let active_in_n = n.states[i] == SlotState::Active;
                match v.members[i] {
                    Verdict::Fresh | Verdict::FreshMissedLast if active_in_n => {
                        prop_assert!(lacks.is_empty(), "member {} judged {:?} lacks writes {:?}", i, v.members[i], lacks);
                        prop_assert!(extra.is_empty(), "member {} judged {:?} has other writes {:?}", i, v.members[i], extra);
                    }
                    // Fresh, but the newest records it as out or rebuilding: not read.
                    Verdict::Fresh | Verdict::FreshMissedLast => {}
                    // A member whose own superblock says it is being rebuilt was taken into
                    // the newest's lineage already (a forced start chose the other side): its
                    // data is known to be replaced. Anyone else holding writes the newest's
                    // lineage never had must be on another side.
                    Verdict::Behind { .. } if m.states[i] != SlotState::Rebuilding => {
                        prop_assert!(extra.is_empty(), "member {} holds writes {:?} the newest lacks, judged behind", i, extra);
                    }
                    Verdict::Behind { .. } => {}
                    Verdict::Diverged { .. } => prop_assert!(split),
                }
                // Recovered from the bitmap (behind, or back in a slot the newest records as
                // out): the newest's bitmap must record everything it lacks.
                let by_bitmap = match v.members[i] {
                    Verdict::Behind { bitmap, .. } => bitmap,
                    Verdict::Fresh | Verdict::FreshMissedLast if n.states[i] == SlotState::Failed => {
                        bitmap_covers(&sbs[v.newest], &sbs[i])
                    }
                    _ => false,
                };
                if by_bitmap {
                    let gone: Vec<&u32> = lacks.iter().filter(|w| !n.bits.contains(w)).collect();
                    prop_assert!(gone.is_empty(), "member {} recovered from the bitmap lacks writes {:?} whose bits are clear", i, gone);
                }
                if m.session == n.session && m.event + 1 >= n.event {
                    prop_assert!(v.members[i].is_fresh(), "member {} in step with the newest judged {:?}", i, v.members[i]);
                }
            }
            if split {
                let diverged = v.members.iter().filter(|x| matches!(x, Verdict::Diverged { .. })).count();
                prop_assert!(diverged > 0);
            }
        }
    }

    fn sb(session: u128, event: u64, history: &[(u128, u64)]) -> Superblock {
        let m = SimMember {
            uuid: uuids()[0],
            session: Uuid::from_u128(session),
            event,
            history: history
                .iter()
                .map(|&(id, start_event)| SessionRec {
                    id: Uuid::from_u128(id),
                    start_event,
                    started: start_event,
                })
                .collect(),
            bitmap_since: 0,
            states: vec![SlotState::Active; M],
            writes: BTreeSet::new(),
            bits: BTreeSet::new(),
            view: BTreeSet::new(),
        };
        superblock(&m)
    }

    #[test]
    fn the_issue_13_reproduction_is_behind() {
        // Member 2's copy was taken after the first stop (event 4, session A); the array
        // then ran in session B (started at 5) and stopped at 6.
        let n = sb(0xB, 6, &[(0xA, 1), (0xB, 5)]);
        let old = sb(0xA, 4, &[(0xA, 1)]);
        let v = rank_members(&[&n, &old]).unwrap();
        assert_eq!(v.newest, 0);
        assert!(matches!(v.members[1], Verdict::Behind { event: 4, .. }));
    }

    #[test]
    fn equal_events_in_different_sessions_diverge() {
        let a = sb(0xB, 9, &[(0xA, 1), (0xB, 5)]);
        let b = sb(0xC, 9, &[(0xA, 1), (0xC, 5)]);
        let e = rank_members(&[&a, &b]).unwrap_err();
        assert_eq!(e.newest_side().len(), 1);
        assert_eq!(e.other_side().len(), 1);
    }

    #[test]
    fn a_member_that_went_on_after_the_fork_diverges() {
        // N's lineage moved from A to B at event 5; this member kept writing in A.
        let n = sb(0xB, 9, &[(0xA, 1), (0xB, 5)]);
        let x = sb(0xA, 7, &[(0xA, 1)]);
        assert!(rank_members(&[&n, &x]).is_err());
        // One that stopped in A before B started is merely behind.
        let y = sb(0xA, 3, &[(0xA, 1)]);
        assert!(matches!(
            rank_members(&[&n, &y]).unwrap().members[1],
            Verdict::Behind { .. }
        ));
    }

    #[test]
    fn the_history_horizon_and_the_first_write_of_a_session() {
        // Older than the oldest start N remembers: behind (too old to know).
        let n = sb(0xB, 40, &[(0xA, 20), (0xB, 30)]);
        let x = sb(0x1, 10, &[(0x1, 1)]);
        assert!(matches!(
            rank_members(&[&n, &x]).unwrap().members[1],
            Verdict::Behind { event: 10, .. }
        ));
        // N's session began with the write this member missed: fresh.
        let n = sb(0xB, 30, &[(0xA, 20), (0xB, 30)]);
        let x = sb(0xA, 29, &[(0xA, 20)]);
        assert_eq!(
            rank_members(&[&n, &x]).unwrap().members[1],
            Verdict::FreshMissedLast
        );
        // ... but not if N went on after it.
        let n = sb(0xB, 31, &[(0xA, 20), (0xB, 30)]);
        assert!(matches!(
            rank_members(&[&n, &x]).unwrap().members[1],
            Verdict::Behind { .. }
        ));
    }

    #[test]
    fn version_1_superblocks_are_judged_by_event() {
        // What decoding a version 1 superblock gives: no sessions, a bitmap that covers
        // nothing before its own event.
        let v1 = |event| Superblock {
            bitmap_since: event,
            ..sb(0, event, &[])
        };
        let (n, torn, old) = (v1(8), v1(7), v1(5));
        let v = rank_members(&[&n, &torn, &old]).unwrap();
        assert_eq!(v.members[0], Verdict::Fresh);
        assert_eq!(v.members[1], Verdict::FreshMissedLast);
        assert!(matches!(
            v.members[2],
            Verdict::Behind { bitmap: false, .. }
        ));
    }
}
