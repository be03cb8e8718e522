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
//! Every other shape change needs data restriped (raid0/5/6/ec wider, more groups, a new
//! level or chunk): refused by name before anything changes. The restripe design is in
//! docs/ENGINE.md ("Reshape").
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
            Geometry {
                level,
                width: (width + per) as u32,
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
        let st = self.dp().state.load_full();
        if let Some(i) = st.slots.iter().position(|s| s.state != SlotState::Active) {
            return Err(Error::Refused(
                Msg::new(format!(
                    "slot {i} of '{}' is not in sync: a reshape starts only with every member in service",
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
        if self.log().is_some() {
            return Err(Error::Refused(
                Msg::new(format!(
                    "'{}' has a log device: its records name slots the reshape renumbers",
                    self.name()
                ))
                .or(Step::say(
                    "remove the log device, grow, and add it back when the reshape is done",
                )),
            ));
        }
        if self.reshaping().is_some() {
            return Err(Error::Refused(
                Msg::new(format!("'{}' is already reshaping", self.name()))
                    .or(Step::say("wait for it to finish")),
            ));
        }
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
        let sizes: Vec<u64> = new
            .slots
            .iter()
            .map(|s| s.entry.as_ref().map(|e| e.size).unwrap_or(0))
            .collect();
        let r = self.reshape_for(&g, &new_g, old_cap, new_cap, added, &sizes);
        self.install_reshape(r, &new_g, &sizes, old_cap);
        let lost = self.commit(new).await;
        drop(_mg);
        drop(_passes);
        for m in lost {
            self.fail_member(&m, OutReason::MetadataWrite).await;
        }
        tracing::info!(array = %self.name(), from = old_cap, to = new_cap, "reshape started");
        self.kick();
        Ok(GrowOutcome::Reshaping {
            from: old_cap,
            to: new_cap,
            geometry: new_g,
        })
    }

    /// A reshape from `old` to `new` at its start (the old layout's view numbers its
    /// slots as the new one does).
    pub(crate) fn reshape_for(
        &self,
        old: &Geometry,
        new: &Geometry,
        old_cap: u64,
        new_cap: u64,
        added: Vec<usize>,
        sizes: &[u64],
    ) -> Reshape {
        let dp = DataPath::view_strided(
            self.shared.clone(),
            old.clone(),
            sizes,
            u64::MAX,
            new.width as usize,
        );
        let family = Personality::of(old).expect("a running geometry has a family");
        Reshape {
            old: Arc::new(Core { dp, family }),
            new: new.clone(),
            pos: AtomicU64::new(0),
            wend: AtomicU64::new(0),
            moved: Default::default(),
            backup: Default::default(),
            old_cap,
            new_cap,
            added,
        }
    }

    /// Put a reshape in force: the new layout's view (the old capacity until it ends)
    /// as the array's, the old one beside it. Call with the gate held (or before serving).
    pub(crate) fn install_reshape(&self, r: Reshape, new: &Geometry, sizes: &[u64], old_cap: u64) {
        let family = Personality::of(new).expect("a checked geometry has a family");
        let mut dp = DataPath::view(self.shared.clone(), new.clone(), sizes, u64::MAX);
        dp.size = old_cap;
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
        let added: Vec<usize> = (0..new.members())
            .filter(|&i| i / nw >= old.groups as usize || i % nw >= ow)
            .collect();
        let old_cap = old.capacity();
        let r = self.reshape_for(&old, &new, old_cap, new.capacity(), added, &sizes);
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
        let lost = self.commit(new).await;
        drop(_g);
        drop(_passes);
        for m in lost {
            self.fail_member(&m, OutReason::MetadataWrite).await;
        }
        Ok(out)
    }
}
