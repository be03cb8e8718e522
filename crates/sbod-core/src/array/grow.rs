//! Growing an array online (`sbod grow`): the verbs that change its geometry without
//! moving data, each recorded on every member as one state change (event + 1) before the
//! new view of the volume is used, and swapped in between client requests (see
//! [`crate::locks::ViewGate`]):
//!
//! - a mirror (raid1) gets one more copy: a new slot, rebuilt online like a replacement
//!   while the other copies serve (md's `--grow --raid-devices=N+1`);
//! - a mirror drops a copy (`drop_copy`): its slot leaves the geometry; refused without
//!   force while the copy is in service, since the group then survives one failure less;
//! - concat appends members: the volume grows by their size at once (the new space is
//!   zeroed first where checksums promise that unwritten blocks read as zeros).
//!
//! - a striped array gets one more parity shard per stripe (`grow_parity`: raid0 ->
//!   raid5, raid5 -> raid6, ec:K+M -> ec:K+(M+1)), on one new member per group: nothing
//!   moves, the new parity is computed onto the new members by a rebuild (md's
//!   `left-symmetric-6` conversion; see `Geometry::dedicated`).
//!
//! Restriping (raid0/5/6/ec wider, more groups) is the reshape process
//! (`process::reshape`), and so is narrowing (`grow_remove`: the last members of every
//! group leave), and so is a new chunk (`grow_chunk`); other level changes are refused by
//! name before anything changes. The design is in docs/ENGINE.md ("Views, grow and
//! reshape").
//!
//! A swap keeps the meaning of every stripe address of the slots that stay (a mirror
//! group's stripes and concat's per-slot stripes do not depend on the member count), so a
//! process that planned stripes before the swap is still right after it.

use super::create::{check_blank, claim_metadata};
use super::process::reshape::Reshape;
use super::{Array, Core, Member, MemberSpec, SlotRt, State};
use crate::datapath::DataPath;
use crate::error::{Error, Msg, Result, Step};
use crate::family::Personality;
use crate::layout::{Geometry, Level};
use crate::superblock::{OutReason, SlotState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// What `grow` did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GrowOutcome {
    /// A reshape started: the volume moves into the new layout online; its size is `to`
    /// when it ends.
    Reshaping {
        from: u64,
        to: u64,
        geometry: Geometry,
    },
    /// New mirror copies, rebuilding in these slots.
    Copies { slots: Vec<usize> },
    /// Concat members appended: the volume's size before and after.
    Appended { from: u64, to: u64 },
    /// One more parity shard per stripe (a level change: raid0 -> raid5, raid5 -> raid6,
    /// ec:K+M -> ec:K+(M+1)): the new member of each group, in these slots, is being
    /// filled with it; the data stays where it is.
    Parity { slots: Vec<usize>, level: Level },
    /// Every member holds more data (`--size`): the volume's size before and after.
    Resized { from: u64, to: u64 },
}

/// What `sbod grow --size` asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SizeTarget {
    /// All the members can hold (the smallest, spares included), within what the
    /// metadata area covers.
    Max,
    /// This many data bytes per member (rounded down to the chunk).
    Bytes(u64),
}

impl Array {
    /// Refuse a grow of an array that cannot change now (read-only, failed, a process
    /// running), naming why.
    fn check_growable(&self) -> Result<()> {
        if self.dp().read_only.load(Ordering::Acquire) {
            return Err(self.dp().read_only_error());
        }
        self.dp().check_writable()?;
        self.dp().failed()?;
        if self.geometry().declustered.is_some() {
            return Err(Error::Refused(
                Msg::new(format!(
                    "'{}' is declustered: its permutation table is drawn for its member count, so growing it would move every stripe, which this sbod does not do: nothing was changed",
                    self.name()
                ))
                .or(Step::say(
                    "create a new declustered array on more members and copy the volume over (nbdcopy)",
                )),
            ));
        }
        if let Some(p) = self.current_process() {
            if !p.is_finished() {
                return Err(Error::Refused(
                    Msg::new(format!(
                        "'{}' is running a {} ({:.0}% done): its shape changes only when no background process runs",
                        self.name(),
                        p.kind,
                        p.status().percent
                    ))
                    .or(Step::say("wait for it to finish, then grow")),
                ));
            }
        }
        Ok(())
    }

    /// Refuse what needs data restriped, by name, before anything changes.
    fn refuse_restripe(&self, what: &str) -> Error {
        let g = self.geometry();
        Error::Refused(
            Msg::new(format!(
                "{what} of a {} array ({} group{} of {}) needs its data restriped, which this sbod does not do yet: nothing was changed",
                g.level,
                g.groups,
                if g.groups == 1 { "" } else { "s" },
                g.width
            ))
            .or(Step::say(
                "grow online works today for raid1 (one more copy, or one fewer) and concat (append members); \
                 for other levels create a new array and copy the volume over (nbdcopy)",
            )),
        )
    }

    /// `sbod grow NAME --add DEV...`: one more mirror copy per device (raid1), or
    /// members appended (concat). Checked whole before anything is written: a device given
    /// twice, a member of this or another array, one too small, or a level that would need
    /// its data restriped are refused and nothing changes.
    pub async fn grow_add(
        &self,
        specs: Vec<MemberSpec>,
        new_groups: bool,
        force: bool,
    ) -> Result<GrowOutcome> {
        self.grow_to(None, specs, new_groups, force).await
    }

    /// `sbod grow NAME [--level L] --add DEV...`: as [`Array::grow_add`], or with a new
    /// `level` a level change (see [`Array::grow_parity`]).
    pub async fn grow_to(
        &self,
        level: Option<Level>,
        specs: Vec<MemberSpec>,
        new_groups: bool,
        force: bool,
    ) -> Result<GrowOutcome> {
        self.check_growable()?;
        if specs.is_empty() {
            return Err(Error::Invalid(
                "grow --add needs at least one device".into(),
            ));
        }
        let g = self.geometry();
        for (i, a) in specs.iter().enumerate() {
            if specs[..i].iter().any(|b| b.path == a.path) {
                return Err(Error::Invalid(format!("{} is given twice", a.path).into()));
            }
        }
        if let Some(l) = level.filter(|&l| l != g.level) {
            if new_groups {
                return Err(Error::Invalid(
                    "a level change adds one member to every group: leave --new-groups out".into(),
                ));
            }
            return self.grow_parity(l, specs, force).await;
        }
        if !matches!(g.level, Level::Raid1 | Level::Concat) {
            return self.grow_restripe(specs, new_groups, force).await;
        }
        if g.groups > 1 || new_groups {
            return Err(self
                .refuse_restripe("adding copies to mirrors in several groups, or whole groups,"));
        }
        let width = g.width as usize + specs.len();
        if width > 256 {
            return Err(Error::Invalid(
                format!("{} members would be more than the 256 a group holds", width).into(),
            ));
        }
        // Everything checked before anything is written.
        let mut sizes = Vec::new();
        for spec in &specs {
            self.check_joining(spec).await?;
            let size = self.check_new_member(spec)?;
            // Concat: no member holds more than the bitmap and checksums cover.
            let size = size.min(g.member_size);
            if size == 0 {
                return Err(Error::Invalid(
                    format!("{} is too small to hold one chunk of data", spec.path).into(),
                ));
            }
            check_blank(&spec.dev, force).await?;
            self.probe_joining(&spec.path, &spec.dev).await?;
            sizes.push(size);
        }
        let st = self.dp().state.load_full();
        if g.level == Level::Raid1 {
            for (i, spec) in specs.iter().enumerate() {
                self.check_domain_of(&st, spec, i)?;
            }
        }
        for spec in &specs {
            claim_metadata(&spec.dev, g.data_offset, &spec.path).await?;
        }
        let members: Vec<Arc<Member>> = specs
            .into_iter()
            .zip(sizes)
            .map(|(spec, size)| Self::new_member(spec, size))
            .collect();
        if g.level == Level::Concat && self.dp().integrity.is_some_and(|t| t.zeroed) {
            // Unwritten blocks must read as zeros under the checksums: make them so (a
            // file's blocks are punched out at once).
            for m in &members {
                self.dp()
                    .mzero(m, 0, m.size, true)
                    .await
                    .map_err(|e| Error::io(format!("zeroing {}", m.path), e))?;
            }
        }
        let level = g.level;
        let before = self.size();
        let new_geometry = Geometry {
            width: width as u32,
            ..g.clone()
        };
        let slots = self
            .swap_view(new_geometry, |st| {
                let mut out = Vec::new();
                for m in &members {
                    let i = st.slots.len();
                    let state = match level {
                        Level::Raid1 => SlotState::Rebuilding,
                        _ => SlotState::Active,
                    };
                    st.slots.push(SlotRt {
                        entry: Some(m.entry()),
                        member: Some(m.clone()),
                        state,
                        recovery: Arc::new(AtomicU64::new(0)),
                        replacement: None,
                        out: None,
                        bitmap_recovery: false,
                        note: None,
                    });
                    out.push(i);
                }
                out
            })
            .await?;
        if level == Level::Raid1 {
            for (&i, m) in slots.iter().zip(&members) {
                self.log_recovery(i, m, "new mirror copy".into(), false, m.size);
            }
            self.kick();
            Ok(GrowOutcome::Copies { slots })
        } else {
            Ok(GrowOutcome::Appended {
                from: before,
                to: self.size(),
            })
        }
    }

    /// `sbod grow NAME --size max|SIZE`: after the members were replaced by larger ones
    /// (or their files made longer), use their space: every member holds `target` data
    /// bytes (max: the smallest member's, spares included, as md's `--size=max`). The new
    /// space is zeroed on every member first (its parity is then right: the parity of
    /// zeros is zeros, and checksums vouch for zeros), then the new size is recorded on
    /// every member (event + 1) and put in force between client requests. A crash before
    /// the record leaves the old size; after it, the new one with zeros in its new space.
    /// The write-intent bitmap and the checksum area were sized at create: the most they
    /// cover is the limit, said by name when it is the one that binds.
    pub async fn grow_size(&self, target: SizeTarget) -> Result<GrowOutcome> {
        self.check_growable()?;
        let g = self.geometry();
        if g.level == Level::Concat {
            return Err(Error::Refused(
                Msg::new("a concat array uses each member's whole size already".to_string())
                    .or(Step::say("grow it with --add (members appended)")),
            ));
        }
        self.check_quiet(false, "growing the members")?;
        let st = self.dp().state.load_full();
        let chunk = g.chunk as u64;
        let members: Vec<Arc<Member>> = st
            .slots
            .iter()
            .filter_map(|s| s.member.clone())
            .chain(st.spares.iter().cloned())
            .collect();
        // What binds: the smallest member, the bitmap's area, the checksum area.
        let (smallest, dev_room) = members
            .iter()
            .map(|m| {
                // As it is now: a file made longer, a LUN grown since it was opened.
                let now = m.dev.current_size().unwrap_or(m.dev.size());
                let room = now.saturating_sub(g.data_offset) / chunk * chunk;
                (m.path.clone(), room)
            })
            .min_by_key(|x| x.1)
            .expect("an array has members");
        let region = self.dp().bitmap.as_ref().map(|b| b.region);
        let bitmap_room = region.map_or(u64::MAX, |r| {
            (self.dp().bitmap_bytes as u64 * 8).saturating_mul(r) / chunk * chunk
        });
        let tags_room = self.dp().integrity.map_or(u64::MAX, |t| {
            (t.bytes / crate::superblock::TAG_BLOCK as u64).saturating_mul(crate::superblock::SPAN)
                / chunk
                * chunk
        });
        let limit = dev_room
            .min(bitmap_room)
            .min(tags_room)
            .min(super::MAX_MEMBER_DATA / chunk * chunk);
        let why = |size: u64| -> String {
            if size > dev_room {
                format!(
                    "{smallest} holds {} of data (the smallest member)",
                    crate::layout::human(dev_room)
                )
            } else if size > bitmap_room {
                format!(
                    "the write-intent bitmap made at create covers {} per member",
                    crate::layout::human(bitmap_room)
                )
            } else {
                format!(
                    "the checksum area made at create covers {} per member",
                    crate::layout::human(tags_room)
                )
            }
        };
        let new_size = match target {
            SizeTarget::Max => limit,
            SizeTarget::Bytes(b) => {
                let b = b / chunk * chunk;
                if b > limit {
                    return Err(Error::Refused(
                        Msg::new(format!(
                            "{} per member is more than '{}' can use: {}",
                            crate::layout::human(b),
                            self.name(),
                            why(b)
                        ))
                        .or(Step::say(format!(
                            "use at most {} (--size max)",
                            crate::layout::human(limit)
                        ))),
                    ));
                }
                b
            }
        };
        if new_size < g.member_size {
            return Err(Error::Refused(
                Msg::new(format!(
                    "'{}' uses {} per member: shrinking would cut off the end of the volume",
                    self.name(),
                    crate::layout::human(g.member_size)
                ))
                .or(Step::say(
                    "to use smaller members, create a new array and copy the volume over (nbdcopy)",
                )),
            ));
        }
        if new_size == g.member_size {
            let bound = if limit == g.member_size {
                why(limit + chunk)
            } else {
                "that is the size it has".to_string()
            };
            return Err(Error::Invalid(
                format!(
                    "'{}' already uses {} per member: {bound}",
                    self.name(),
                    crate::layout::human(g.member_size)
                )
                .into(),
            ));
        }
        let new_g = Geometry {
            member_size: new_size,
            ..g.clone()
        };
        new_g.validate().map_err(|e| Error::Invalid(e.into()))?;
        // The new space reads as zeros on every member (a file's is punched out at once),
        // before the volume covers it.
        let old = g.member_size;
        // (Spares get all of it written when they take a slot over.)
        let zeroing = members[..members.len() - st.spares.len()].iter().map(|m| {
            let dp = self.dp();
            let m = m.clone();
            async move {
                dp.mzero(&m, old, new_size - old, true)
                    .await
                    .map_err(|e| Error::io(format!("zeroing the new space of {}", m.path), e))
            }
        });
        for r in futures::future::join_all(zeroing).await {
            r?;
        }
        let before = self.size();
        self.swap_view(new_g, |st| {
            for s in st.slots.iter_mut() {
                if let Some(m) = &s.member {
                    let m = m.resized(new_size);
                    s.entry = Some(m.entry());
                    s.member = Some(m);
                } else if let Some(e) = &mut s.entry {
                    e.size = new_size;
                }
            }
            for sp in st.spares.iter_mut() {
                *sp = sp.resized(new_size);
            }
        })
        .await?;
        tracing::info!(array = %self.name(), from = before, to = self.size(), "members grown");
        Ok(GrowOutcome::Resized {
            from: before,
            to: self.size(),
        })
    }

    /// The geometry a level change to `level` gives `g` with one more member per group,
    /// or why not (by name, with what would work).
    fn with_parity(g: &Geometry, level: Level) -> Result<Geometry> {
        let ok = match (g.level, level) {
            (Level::Raid0, Level::Raid5) | (Level::Raid5, Level::Raid6) => true,
            (Level::Ec { k, m }, Level::Ec { k: k2, m: m2 }) => k2 == k && m2 == m + 1,
            _ => false,
        };
        if !ok {
            let next = match g.level {
                Level::Raid0 => Some("raid5".to_string()),
                Level::Raid5 => Some("raid6".to_string()),
                Level::Ec { k, m } => Some(format!("ec:{k}+{}", m + 1)),
                _ => None,
            };
            let what = match next {
                Some(n) => format!(
                    "a {} array changes level online only to {n} (one more parity shard, one more member per group)",
                    g.level
                ),
                None => format!("a {} array does not change level online", g.level),
            };
            return Err(Error::Refused(
                Msg::new(format!(
                    "{what}; {level} is not supported: nothing was changed"
                ))
                .or(Step::say(
                    "for other levels create a new array and copy the volume over (nbdcopy)",
                )),
            ));
        }
        let new = Geometry {
            level,
            width: g.width + 1,
            dedicated: g.dedicated + 1,
            ..g.clone()
        };
        new.validate().map_err(|e| Error::Invalid(e.into()))?;
        Ok(new)
    }

    /// A level change that adds one parity shard per stripe (raid0 -> raid5, raid5 ->
    /// raid6, ec:K+M -> ec:K+(M+1)), one new member per group. The data and the parity
    /// there is stay where they are; the new parity goes on the new member of each group
    /// (a dedicated parity member, `Geometry::dedicated`), filled by a rebuild while the
    /// array serves: until it ends, each group survives what it survived before; after,
    /// one failure more. The new geometry is recorded on every member (event + 1) with
    /// the new slots rebuilding, so a crash at any point leaves either the old array or
    /// the new one with its rebuild to resume: nothing is ever half-moved.
    pub async fn grow_parity(
        &self,
        level: Level,
        specs: Vec<MemberSpec>,
        force: bool,
    ) -> Result<GrowOutcome> {
        let g = self.geometry();
        let new_g = Self::with_parity(&g, level)?;
        let groups = g.groups as usize;
        if specs.len() != groups {
            return Err(Error::Invalid(
                format!(
                    "{} -> {level} takes one new member per group: give {groups}, not {}",
                    g.level,
                    specs.len()
                )
                .into(),
            ));
        }
        self.check_quiet(true, &format!("a level change to {level}"))?;
        let st = self.dp().state.load_full();
        for spec in &specs {
            self.check_joining(spec).await?;
            self.check_new_member(spec)?;
            check_blank(&spec.dev, force).await?;
            self.probe_joining(&spec.path, &spec.dev).await?;
        }
        // Failure domains: a group's domain may not hold more members than it survives.
        let ow = g.width as usize;
        for (grp, spec) in specs.iter().enumerate() {
            if spec.domain.is_empty() {
                continue;
            }
            let same = st.slots[grp * ow..(grp + 1) * ow]
                .iter()
                .filter_map(|s| s.member.as_ref())
                .filter(|m| m.domain == spec.domain)
                .count();
            if same + 1 > new_g.redundancy() && !force {
                return Err(Error::Refused(
                    Msg::new(format!(
                        "failure domain '{}' already holds {same} member(s) of group {grp}, which survives {} failure(s) after the change",
                        spec.domain,
                        new_g.redundancy()
                    ))
                    .or(Step::say(format!("put {} in another domain", spec.path)))
                    .or(Step::force("add it there all the same")),
                ));
            }
        }
        for spec in &specs {
            claim_metadata(&spec.dev, g.data_offset, &spec.path).await?;
        }
        let members: Vec<Arc<Member>> = specs
            .into_iter()
            .map(|spec| Self::new_member(spec, g.member_size))
            .collect();
        let slots = self
            .swap_view(new_g, |st| {
                // Each group's new member after its old ones: the slots renumber as the
                // new geometry numbers them.
                for (grp, m) in members.iter().enumerate().rev() {
                    st.slots.insert(
                        (grp + 1) * ow,
                        SlotRt {
                            entry: Some(m.entry()),
                            member: Some(m.clone()),
                            state: SlotState::Rebuilding,
                            recovery: Arc::new(AtomicU64::new(0)),
                            replacement: None,
                            out: None,
                            bitmap_recovery: false,
                            note: None,
                        },
                    );
                }
                (0..members.len())
                    .map(|grp| grp * (ow + 1) + ow)
                    .collect::<Vec<_>>()
            })
            .await?;
        for (&i, m) in slots.iter().zip(&members) {
            self.log_recovery(
                i,
                m,
                format!("new parity ({} -> {level})", g.level),
                false,
                m.size,
            );
        }
        tracing::info!(array = %self.name(), from = %g.level, to = %level, "level change: new parity rebuilding");
        self.kick();
        Ok(GrowOutcome::Parity { slots, level })
    }

    /// Refuse a change that needs every member in service and no initial sync or reshape
    /// (`what` names it); `no_log`: a log device too (the change renumbers slots its
    /// records name).
    fn check_quiet(&self, no_log: bool, what: &str) -> Result<()> {
        let st = self.dp().state.load_full();
        if let Some(i) = st.slots.iter().position(|s| s.state != SlotState::Active) {
            return Err(Error::Refused(
                Msg::new(format!(
                    "slot {i} of '{}' is not in sync: {what} starts only with every member in service",
                    self.name()
                ))
                .or(Step::say("let the rebuild finish (or replace the missing member), then grow")),
            ));
        }
        if self.dp().resync_offset.load(Ordering::Acquire) != u64::MAX {
            return Err(Error::Refused(
                Msg::new(format!("'{}' is still in its initial sync", self.name()))
                    .or(Step::say("wait for it to finish, then grow")),
            ));
        }
        if no_log && self.log().is_some() {
            return Err(Error::Refused(
                Msg::new(format!(
                    "'{}' has a log device: its records name slots {what} renumbers",
                    self.name()
                ))
                .or(Step::say(
                    "remove the log device, grow, and add it back when the change is done",
                )),
            ));
        }
        if self.reshaping().is_some() {
            return Err(Error::Refused(
                Msg::new(format!("'{}' is already reshaping", self.name()))
                    .or(Step::say("wait for it to finish")),
            ));
        }
        Ok(())
    }

    /// The layout `n` more members give a striped array: wider groups (each group gets
    /// `n / groups`), or with `new_groups` more groups of the same width. Refused by name
    /// where it does not divide, or the level cannot grow so.
    fn wider(&self, g: &Geometry, n: usize, new_groups: bool) -> Result<Geometry> {
        let bad = |m: String| Err(Error::Invalid(m.into()));
        let groups = g.groups as usize;
        let width = g.width as usize;
        let new = if new_groups || g.level == Level::Raid10 {
            if !n.is_multiple_of(width) {
                return bad(format!(
                    "{n} device(s) do not make whole groups of {width}: give a multiple of {width}"
                ));
            }
            Geometry {
                groups: (groups + n / width) as u32,
                ..g.clone()
            }
        } else {
            if !n.is_multiple_of(groups) {
                return bad(format!(
                    "{n} device(s) cannot widen {groups} groups alike: give a multiple of {groups}, or add whole groups (--new-groups, {width} devices each)"
                ));
            }
            let per = n / groups;
            let level = match g.level {
                Level::Ec { k, m } => Level::Ec {
                    k: k + per as u16,
                    m,
                },
                l => l,
            };
            // The restripe rotates every parity shard again.
            Geometry {
                level,
                width: (width + per) as u32,
                dedicated: 0,
                ..g.clone()
            }
        };
        new.validate().map_err(|e| Error::Invalid(e.into()))?;
        Ok(new)
    }

    /// Restripe a striped array (raid0, raid5, raid6, ec, raid10) onto more members: the
    /// reshape starts at once and runs in the background (`process::reshape`).
    async fn grow_restripe(
        &self,
        specs: Vec<MemberSpec>,
        new_groups: bool,
        force: bool,
    ) -> Result<GrowOutcome> {
        let g = self.geometry();
        let new_g = self.wider(&g, specs.len(), new_groups)?;
        self.check_quiet(true, "a reshape")?;
        // Everything checked before anything is written.
        for spec in &specs {
            self.check_joining(spec).await?;
            self.check_new_member(spec)?;
            check_blank(&spec.dev, force).await?;
            self.probe_joining(&spec.path, &spec.dev).await?;
        }
        let (old_w, new_w) = (g.width as usize, new_g.width as usize);
        let old_cap = self.size();
        let new_cap = new_g.capacity();
        // The slots of the new layout: group by group, the old members first.
        let mut slots: Vec<Option<usize>> = Vec::new();
        for grp in 0..new_g.groups as usize {
            for i in 0..new_w {
                slots.push((grp < g.groups as usize && i < old_w).then(|| grp * old_w + i));
            }
        }
        let added: Vec<usize> = (0..slots.len()).filter(|&i| slots[i].is_none()).collect();
        // The first windows (written aside) must fit before the backup area: a dry run.
        {
            let probe = self.reshape_for(&g, &new_g, old_cap, new_cap, added.clone(), &[]);
            let mut pos = 0;
            while pos < new_cap {
                let (w, backup) = probe.plan_window(pos)?;
                if !backup {
                    break;
                }
                pos += w;
            }
        }
        for spec in &specs {
            claim_metadata(&spec.dev, g.data_offset, &spec.path).await?;
        }
        let mut fresh: Vec<Arc<Member>> = specs
            .into_iter()
            .map(|spec| Self::new_member(spec, g.member_size))
            .collect();
        fresh.reverse();
        let _passes = self.gate.exclusive().await;
        let _mg = self.mgmt.lock().await;
        self.check_growable()?;
        let cur = self.dp().state.load_full();
        let mut new = (*cur).clone();
        new.slots = slots
            .iter()
            .map(|&old| match old {
                Some(i) => cur.slots[i].clone(),
                None => {
                    let m = fresh.pop().expect("one member per new slot");
                    SlotRt {
                        entry: Some(m.entry()),
                        member: Some(m),
                        state: SlotState::Active,
                        recovery: Arc::new(AtomicU64::new(0)),
                        replacement: None,
                        out: None,
                        bitmap_recovery: false,
                        note: None,
                    }
                }
            })
            .collect();
        self.begin_reshape((_passes, _mg), new, &g, new_g, old_cap, added)
            .await
    }

    /// Put a reshape from `old` to `new_g` in force with the membership `new`, record it
    /// on the members (event + 1), and start it. `held`: the gate and `mgmt`, let go once
    /// it is recorded.
    async fn begin_reshape<H>(
        &self,
        held: H,
        new: State,
        old: &Geometry,
        new_g: Geometry,
        old_cap: u64,
        aside: Vec<usize>,
    ) -> Result<GrowOutcome> {
        let new_cap = new_g.capacity();
        let sizes: Vec<u64> = new
            .slots
            .iter()
            .map(|s| s.entry.as_ref().map(|e| e.size).unwrap_or(0))
            .collect();
        let r = self.reshape_for(old, &new_g, old_cap, new_cap, aside, &sizes);
        self.install_reshape(r, &new_g, &sizes, old_cap);
        let lost = self.commit(new).await;
        drop(held);
        for m in lost {
            self.fail_member(&m, OutReason::MetadataWrite).await;
        }
        // Recorded on too few members to stand (they failed writing it): not done.
        self.dp().failed()?;
        tracing::info!(array = %self.name(), from = old_cap, to = new_cap, "reshape started");
        self.kick();
        Ok(GrowOutcome::Reshaping {
            from: old_cap,
            to: new_cap,
            geometry: new_g,
        })
    }

    /// `sbod grow NAME --remove DEV...`: restripe a raid0/5/6/ec array onto fewer
    /// members (md's `--raid-devices=N-1`), online; the volume shrinks to what the rest
    /// hold. The members leaving are the last of each group (as md's highest roles), the
    /// same number from every group. Refused, with nothing changed, where the volume holds
    /// data past the new size (read back: holes and zeros are not data; `force` drops
    /// it), where the level is not striped, or a member named is not one that can leave
    /// (the error names those that can).
    pub async fn grow_remove(&self, who: &[String], force: bool) -> Result<GrowOutcome> {
        self.check_growable()?;
        let g = self.geometry();
        match g.level {
            Level::Raid0 | Level::Raid5 | Level::Raid6 | Level::Ec { .. } => {}
            Level::Raid1 => {
                return Err(Error::Invalid(
                    Msg::new(format!("'{}' is a mirror: it keeps one copy fewer with --drop", self.name()))
                        .or(Step::say(format!("sbod grow {} --drop MEMBER", self.name())))
                        ,
                ))
            }
            l => {
                return Err(Error::Refused(
                    Msg::new(format!(
                        "removing a member of a {l} array is not supported: nothing was changed"
                    ))
                    .or(Step::say(
                        "create a new array on the members that stay and copy the volume over (nbdcopy)",
                    )),
                ))
            }
        }
        if who.is_empty() {
            return Err(Error::Invalid(
                "grow --remove needs at least one member".into(),
            ));
        }
        let st = self.dp().state.load_full();
        let mut slots = Vec::new();
        for (n, w) in who.iter().enumerate() {
            if who[..n].contains(w) {
                return Err(Error::Invalid(format!("{w} is given twice").into()));
            }
            let i = st
                .slots
                .iter()
                .position(|s| {
                    s.member.as_ref().is_some_and(|m| m.path == *w)
                        || s.entry.as_ref().is_some_and(|e| e.uuid.to_string() == *w)
                })
                .ok_or_else(|| {
                    Error::Invalid(format!("{w} is not a member of '{}'", self.name()).into())
                })?;
            slots.push(i);
        }
        let (groups, ow) = (g.groups as usize, g.width as usize);
        if !slots.len().is_multiple_of(groups) {
            return Err(Error::Invalid(
                format!(
                    "{} member(s) cannot narrow {groups} groups alike: remove the same number from every group",
                    slots.len()
                )
                .into(),
            ));
        }
        let per = slots.len() / groups;
        if per >= ow {
            return Err(Error::Invalid(
                format!("a group of {ow} cannot lose {per} members").into(),
            ));
        }
        let nw = ow - per;
        // The members that can leave: the last `per` of every group.
        let can: Vec<usize> = (0..groups * ow).filter(|i| i % ow >= nw).collect();
        if let Some(&bad) = slots.iter().find(|i| !can.contains(i)) {
            let names: Vec<String> = can
                .iter()
                .filter_map(|&i| st.slots[i].member.as_ref().map(|m| m.path.clone()))
                .collect();
            let path = st.slots[bad]
                .member
                .as_ref()
                .map(|m| m.path.clone())
                .unwrap_or_else(|| format!("slot {bad}"));
            return Err(Error::Refused(
                Msg::new(format!(
                    "{path} holds slot {bad}: a narrower layout lets go of the last member{} of every group ({}), as md does",
                    if per == 1 { "" } else { "s" },
                    names.join(", ")
                ))
                .or(Step::say(format!(
                    "remove {} instead; then, to take {path} out too, `sbod replace {} {path} --with` one of them once it is free",
                    names.join(" "),
                    self.name()
                ))),
            ));
        }
        // The narrower layout leaves the last rows of every member free: the backup area
        // of the windows that catch up with the data being read (`Reshape::backup_at`),
        // on every member, so that it survives as many failures as the array does. A
        // later `grow --size max` takes that space back.
        let new_g = g
            .narrowed(per)
            .map_err(|e| Error::Invalid(format!("{ow} - {per} members: {e}").into()))?;
        let every: Vec<usize> = (0..groups * ow).collect();
        self.check_quiet(true, "a reshape")?;
        let old_cap = self.size();
        let new_cap = new_g.capacity();
        if !force {
            self.check_unused(new_cap, old_cap).await?;
        }
        // Every window can be moved (those written aside fit their area): a dry run.
        {
            let probe = self.reshape_for(&g, &new_g, old_cap, new_cap, every.clone(), &[]);
            let mut pos = new_cap;
            while pos > 0 {
                let (w, _) = probe.plan_window(pos)?;
                pos -= w;
            }
        }
        let _passes = self.gate.exclusive().await;
        let _mg = self.mgmt.lock().await;
        self.check_growable()?;
        let cur = (*self.dp().state.load_full()).clone();
        self.begin_reshape((_passes, _mg), cur, &g, new_g, old_cap, every)
            .await
    }

    /// `sbod grow NAME --chunk SIZE`: restripe a raid0/5/6/ec/raid10 array onto the same
    /// members with another chunk, online (md's `--grow --chunk`). Both layouts hold a
    /// window of whole rows of both chunks on the same member bytes, so every window is
    /// written aside before it is rewritten in place (md's backup of every stripe); the
    /// backup area is the last rows of the members, which the volume gives up while the
    /// reshape runs and gets back, as zeros, when it ends. Refused, with nothing changed,
    /// where the volume holds data in those rows (read back: holes and zeros are not
    /// data; `force` drops it), the chunk does not divide the bitmap's region, or the
    /// members are too small to set one window aside.
    pub async fn grow_chunk(&self, chunk: u32, force: bool) -> Result<GrowOutcome> {
        self.check_growable()?;
        let g = self.geometry();
        match g.level {
            Level::Raid0 | Level::Raid5 | Level::Raid6 | Level::Ec { .. } | Level::Raid10 => {}
            l => {
                return Err(Error::Refused(
                    Msg::new(format!(
                        "a {l} array has no stripes: its chunk means nothing to change"
                    ))
                    .or(Step::say(
                        "a new chunk applies to raid0, raid5, raid6, ec:K+M and raid10",
                    )),
                ))
            }
        }
        if chunk == g.chunk {
            return Err(Error::Invalid(
                format!(
                    "'{}' has a chunk of {} already",
                    self.name(),
                    crate::layout::human(chunk as u64)
                )
                .into(),
            ));
        }
        let candidate = Geometry { chunk, ..g.clone() };
        if !chunk.is_power_of_two() || !(4096..=16 << 20).contains(&chunk) {
            candidate.validate().map_err(|e| Error::Invalid(e.into()))?;
        }
        if let Some(b) = &self.dp().bitmap {
            if !b.region.is_multiple_of(chunk as u64) {
                return Err(Error::Refused(
                    Msg::new(format!(
                        "the write-intent bitmap of '{}' tracks regions of {}, which a chunk of {} does not divide",
                        self.name(),
                        crate::layout::human(b.region),
                        crate::layout::human(chunk as u64)
                    ))
                    .or(Step::say(format!(
                        "choose a chunk of at most {}",
                        crate::layout::human(b.region)
                    ))),
                ));
            }
        }
        // The backup area: room for one window of whole rows of both chunks (its bytes
        // are written aside whole), else as large as a reshape's largest window (each
        // window costs a flush and two superblock writes: on modelled HDDs 4 MiB windows
        // moved at 0.09 of a rebuild's rate per member, 32 MiB at 0.29), at most a quarter
        // of a member.
        let (co, cn) = (g.chunk as u64, chunk as u64);
        let l = co.max(cn); // both powers of two: their least common multiple
        let data_per_row = (g.stripe_data() / co) * g.groups as u64;
        let least = l * data_per_row;
        let ms = g.member_size;
        let room = least
            .max(super::process::reshape::MAX_WINDOW.min(ms / 4))
            .div_ceil(l)
            * l;
        if room > ms / 2 || ms - room < l {
            return Err(Error::Refused(
                Msg::new(format!(
                    "a chunk of {} needs {} of every member set aside while the data moves (one window of whole rows of both chunks): the members hold {} each",
                    crate::layout::human(cn),
                    crate::layout::human(room),
                    crate::layout::human(ms)
                ))
                .or(Step::say("choose a chunk nearer the one it has")),
            ));
        }
        let new_g = Geometry {
            chunk,
            member_size: (ms - room) / l * l,
            dedicated: 0,
            ..g.clone()
        };
        new_g.validate().map_err(|e| Error::Invalid(e.into()))?;
        self.check_quiet(true, "a reshape")?;
        let old_cap = self.size();
        let new_cap = new_g.capacity();
        if !force {
            self.check_unused(new_cap, old_cap).await.map_err(|e| match e {
                Error::Refused(m) => Error::Refused(m.or(Step::say(format!(
                    "(the last {} of the volume are its backup area while the chunk changes: it gets them back, as zeros, when it ends)",
                    crate::layout::human(old_cap - new_cap)
                )))),
                e => e,
            })?;
        }
        let aside: Vec<usize> = (0..g.members()).collect();
        // Every window is like the first: it can be moved (a dry run of one).
        self.reshape_for(&g, &new_g, old_cap, new_cap, aside.clone(), &[])
            .plan_window(0)?;
        let _passes = self.gate.exclusive().await;
        let _mg = self.mgmt.lock().await;
        self.check_growable()?;
        let cur = (*self.dp().state.load_full()).clone();
        let last = Geometry {
            member_size: ms / cn * cn,
            ..new_g.clone()
        };
        self.begin_reshape((_passes, _mg), cur, &g, new_g, old_cap, aside)
            .await?;
        // What it is when the reshape ends (the backup area back in the volume).
        Ok(GrowOutcome::Reshaping {
            from: old_cap,
            to: last.capacity(),
            geometry: last,
        })
    }

    /// Refuse a shrink to `new_cap` where the volume holds data past it: every byte of
    /// `[new_cap, old_cap)` is a hole of the members or reads as zeros.
    async fn check_unused(&self, new_cap: u64, old_cap: u64) -> Result<()> {
        let mut pos = new_cap;
        while pos < old_cap {
            let runs = self.allocation(pos, old_cap - pos).await?;
            if runs.is_empty() {
                break;
            }
            for (n, hole) in runs {
                let mut at = pos;
                while !hole && at < pos + n {
                    let len = (pos + n - at).min(4 << 20);
                    let buf = self.read(at, len as usize).await?;
                    if let Some(z) = buf.iter().position(|&b| b != 0) {
                        let found = at + z as u64;
                        return Err(Error::Refused(
                            Msg::new(format!(
                                "'{}' would shrink to {} bytes, and it holds data at byte {found} beyond that: nothing was changed",
                                self.name(),
                                new_cap
                            ))
                            .or(Step::say(format!(
                                "shrink what is on it (file system, partition) to at most {new_cap} bytes and discard the rest \
                                 (`blkdiscard --offset {new_cap}` on the NBD device, or `fstrim`), then run this again; \
                                 or add --force to drop the data past {new_cap}"
                            ))),
                        ));
                    }
                    at += len;
                }
                pos += n;
            }
        }
        Ok(())
    }

    /// A reshape from `old` to `new` at its start (the old layout's view numbers its
    /// slots as the new one does).
    pub(crate) fn reshape_for(
        &self,
        old: &Geometry,
        new: &Geometry,
        old_cap: u64,
        new_cap: u64,
        aside: Vec<usize>,
        sizes: &[u64],
    ) -> Reshape {
        let narrowing = old.width > new.width;
        let mut dp = DataPath::view_strided(
            self.shared.clone(),
            old.clone(),
            sizes,
            u64::MAX,
            old.width.max(new.width) as usize,
        );
        // Narrowing, a new chunk: nothing past the new capacity is reached any more.
        dp.size = dp.size.min(new_cap);
        let family = Personality::of(old).expect("a running geometry has a family");
        // The walk starts at 0 going up, or narrowing at the new capacity going down.
        let start = if narrowing { new_cap } else { 0 };
        Reshape {
            old: Arc::new(Core { dp, family }),
            new: new.clone(),
            pos: AtomicU64::new(start),
            wend: AtomicU64::new(start),
            moved: Default::default(),
            backup: Default::default(),
            old_cap,
            new_cap,
            aside,
            narrowing,
            rechunk: old.chunk != new.chunk,
        }
    }

    /// Put a reshape in force: the new layout's view (the old capacity until it ends)
    /// as the array's, the old one beside it. Call with the gate held (or before serving).
    pub(crate) fn install_reshape(&self, r: Reshape, new: &Geometry, sizes: &[u64], old_cap: u64) {
        let family = Personality::of(new).expect("a checked geometry has a family");
        let mut dp = match r.narrowing {
            false => DataPath::view(self.shared.clone(), new.clone(), sizes, u64::MAX),
            true => {
                let stride = r.old.dp.geometry.width as usize;
                DataPath::view_narrowed(self.shared.clone(), new.clone(), sizes, u64::MAX, stride)
            }
        };
        // The smaller of the two sizes until the reshape ends.
        dp.size = old_cap.min(r.new_cap);
        self.reshape.store(Arc::new(Some(Arc::new(r))));
        self.core.store(Arc::new(Core { dp, family }));
    }

    /// At assembly: the reshape the members record, in force again where it stopped.
    pub(crate) fn resume_reshape(&self, rec: &crate::superblock::ReshapeRec) {
        let new = self.geometry();
        let old = rec.old.clone();
        let st = self.dp().state.load_full();
        let sizes: Vec<u64> = st
            .slots
            .iter()
            .map(|s| s.entry.as_ref().map(|e| e.size).unwrap_or(0))
            .collect();
        let (ow, nw) = (old.width as usize, new.width as usize);
        // The slots that hold the backup area: the new layout's added ones, or (narrowing)
        // every one.
        let aside: Vec<usize> = match ow > nw {
            _ if old.chunk != new.chunk => (0..new.members()).collect(),
            false => (0..new.members())
                .filter(|&i| i / nw >= old.groups as usize || i % nw >= ow)
                .collect(),
            true => (0..old.members()).collect(),
        };
        let old_cap = old.capacity();
        let r = self.reshape_for(&old, &new, old_cap, new.capacity(), aside, &sizes);
        r.pos.store(rec.pos, Ordering::Release);
        r.wend.store(rec.pos, Ordering::Release);
        *r.backup.lock() = rec.backup;
        self.install_reshape(r, &new, &sizes, old_cap);
    }

    /// A new copy's failure domain, checked as `add` checks a slot's (the `i`-th of the
    /// copies being added, which will take slot `width + i`).
    fn check_domain_of(&self, st: &State, spec: &MemberSpec, i: usize) -> Result<()> {
        if spec.domain.is_empty() {
            return Ok(());
        }
        let red = self.geometry().redundancy() + 1 + i;
        let same = st
            .slots
            .iter()
            .filter(|s| s.state != SlotState::Failed)
            .filter_map(|s| s.member.as_ref())
            .filter(|m| m.domain == spec.domain)
            .count();
        if same >= red {
            return Err(Error::Refused(
                Msg::new(format!(
                    "failure domain '{}' already holds {same} of the copies",
                    spec.domain
                ))
                .or(Step::say(format!("put {} in another domain", spec.path))),
            ));
        }
        Ok(())
    }

    /// `sbod grow NAME --drop MEMBER`: a mirror keeps one copy fewer. A copy that is out
    /// of service (failed, missing) just leaves; one in service only with `force`, since
    /// the group then survives one failure less; never the last in-sync copy, never below
    /// two copies (that is a plain disk: stop the array and use the member).
    pub async fn drop_copy(&self, who: &str, force: bool) -> Result<()> {
        self.check_growable()?;
        let g = self.geometry();
        if g.level != Level::Raid1 || g.groups > 1 {
            return Err(self.refuse_restripe("dropping a member"));
        }
        let st = self.dp().state.load_full();
        let slot = st
            .slots
            .iter()
            .position(|s| {
                s.member.as_ref().is_some_and(|m| m.path == who)
                    || s.entry.as_ref().is_some_and(|e| e.uuid.to_string() == who)
            })
            .ok_or_else(|| {
                Error::Invalid(format!("{who} is not a copy of '{}'", self.name()).into())
            })?;
        if g.width <= 2 {
            return Err(Error::Refused(
                Msg::new(format!(
                    "'{}' has {} copies: a mirror keeps at least two",
                    self.name(),
                    g.width
                ))
                .or(Step::say(
                    "to end the mirror, stop the array and use one member as a plain disk",
                )),
            ));
        }
        let in_sync = |i: usize| st.slots[i].state == SlotState::Active;
        if in_sync(slot) && !(0..st.slots.len()).any(|i| i != slot && in_sync(i)) {
            return Err(Error::Refused(
                Msg::new(format!("{who} is the last copy in sync"))
                    .or(Step::say("wait for the other copies to rebuild first")),
            ));
        }
        if matches!(st.slots[slot].state, SlotState::Active) && !force {
            return Err(Error::Refused(
                Msg::new(format!(
                    "{who} is in service: without it '{}' survives {} failure{} instead of {}",
                    self.name(),
                    g.width as usize - 2,
                    if g.width == 3 { "" } else { "s" },
                    g.width as usize - 1
                ))
                .or(Step::force(format!("drop {who} all the same"))),
            ));
        }
        let gone = st.slots[slot].member.clone();
        let new_geometry = Geometry {
            width: g.width - 1,
            ..g
        };
        self.swap_view(new_geometry, |st| {
            st.slots.remove(slot);
        })
        .await?;
        if let Some(m) = gone {
            // Its superblock says it left this array (a later assembly does not take it).
            Self::wipe(&m).await;
            m.dev.close();
        }
        Ok(())
    }

    /// Change the geometry and the membership together: with every client request held
    /// at the gate, the new view is put in force and the new state recorded on the
    /// members (the superblock carries the geometry) before any request runs again. A
    /// member whose superblock write failed is failed as any other state change does.
    async fn swap_view<T>(
        &self,
        geometry: Geometry,
        change: impl FnOnce(&mut State) -> T,
    ) -> Result<T> {
        geometry.validate().map_err(|e| Error::Invalid(e.into()))?;
        let family = Personality::of(&geometry)?;
        let _passes = self.gate.exclusive().await;
        let _g = self.mgmt.lock().await;
        self.check_growable()?;
        let mut new = (*self.dp().state.load_full()).clone();
        let out = change(&mut new);
        let sizes: Vec<u64> = new
            .slots
            .iter()
            .map(|s| s.entry.as_ref().map(|e| e.size).unwrap_or(0))
            .collect();
        let resync = self.dp().resync_offset.load(Ordering::Acquire);
        let dp = DataPath::view(self.shared.clone(), geometry, &sizes, resync);
        self.core.store(Arc::new(Core { dp, family }));
        let staying = new.live_members().len();
        let recorded = self.commit_recorded(new).await;
        drop(_g);
        drop(_passes);
        let Some(lost) = recorded else {
            // Nothing was recorded (the lease lost: this head is fenced and writes
            // nothing more): the change did not happen on the members.
            return Err(self.dp().lease.error(self.name()));
        };
        let none_landed = lost.len() >= staying;
        for m in lost {
            self.fail_member(&m, OutReason::MetadataWrite).await;
        }
        if none_landed {
            return Err(Error::Failed(
                format!(
                    "'{}': the new layout could not be recorded on any member",
                    self.name()
                )
                .into(),
            ));
        }
        Ok(out)
    }
}
