//! The reshape: moving every byte of the volume from the layout it had into a new one
//! (`sbod grow`: more members per group, more groups), online, window by window, as md's
//! raid5 reshape does going forward.
//!
//! The volume below `pos` is in the new layout, from `pos` on in the old one; both views
//! run at once over the same members (the old one numbers its slots as the new one does,
//! see `Placement::with_stride`). A window `[pos, pos + w)` of whole new stripes is moved
//! at a time: client requests that touch it wait (they are let in again when it is
//! durable), requests below it go to the new view, above it to the old one
//! (`Array::enter`). For each window:
//!
//! 1. it is read through the old view (degraded reads reconstruct as ever);
//! 2. if writing its new stripes would overwrite old data that is still in the window
//!    (only the first windows of a wider layout: the new stripes are narrower in member
//!    space than the old ones, so they catch up with the data being read), its bytes are
//!    first written aside on every new member ("backup") and the superblocks record it;
//! 3. the new stripes are written through the new view (full stripes: parity from the
//!    data, checksums, bitmap and log as any client write);
//! 4. the members are flushed and the superblocks record `pos + w`.
//!
//! In place (no backup), the new stripes of a window overwrite only old data below the
//! durable `pos`, which the superblocks already say is in the new layout: a crash at any
//! point leaves the old layout of everything from `pos` on intact, and the reshape starts
//! that window again. With a backup, a crash is repaired at the next start by writing the
//! backup into the window's new stripes. When `pos` reaches the old capacity the space the
//! new layout adds is zeroed the same way (it reads as zeros, its parity and checksums are
//! right), and the new view takes the whole volume.
//!
//! A reshape that narrows the groups (`sbod grow --remove`: the members leaving are the
//! last of each group) goes the other way, as md's does: the new layout puts a volume
//! offset at a higher member offset than the old one, so the walk starts at the new
//! (smaller) capacity and goes down: the volume from `pos` on is in the new layout, below
//! it in the old one, a window is `[pos - w, pos)`, and its new stripes overwrite old data
//! that is already moved (or beyond the new capacity, which no client reaches any more).
//! Only the last windows, near the volume's start, catch up with the data being read and
//! are written aside, in the last rows of every member, which the narrower layout leaves
//! free (`Geometry::narrowed`; they held old data that moved, or was let go, long before).
//! When `pos` reaches 0 the members leaving are let go.

use super::{ProcessHandle, Throttle};
use crate::array::{Array, Core};
use crate::buf::{AlignedBuf, SharedBuf};
use crate::datapath::DataPath;
use crate::dev::IoClass;
use crate::error::{Error, Result};
use crate::layout::Geometry;
use crate::member::Member;
use crate::superblock::{BackupRec, OutReason, SlotState};
use arc_swap::ArcSwap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub use sbod_types::ProcessKind;

/// The largest window moved at once. Each window ends with a flush and a superblock
/// write on every member (a seek to the metadata and back on a disk), so small windows
/// spend more on those than on moving data: on modelled nearline HDDs 16 MiB windows
/// moved at 0.33 of the rebuild's rate per member (docs/PERFORMANCE.md). Client requests
/// touching the window wait for it (on those disks a 64 MiB window of 10 members takes
/// about a tenth of a second).
pub(crate) const MAX_WINDOW: u64 = 64 << 20;
/// The largest window written aside (the backup area at the end of every new member).
pub(crate) const MAX_BACKUP: u64 = 4 << 20;

/// A reshape in progress.
pub(crate) struct Reshape {
    /// The old layout's view (its own stripe locks, the shared state).
    pub old: Arc<Core>,
    /// The new layout's geometry.
    pub new: Geometry,
    /// Below this the volume is in the new layout, durably (the superblocks say so);
    /// narrowing: from this on.
    pub pos: AtomicU64,
    /// The far edge of the window being moved (`pos` when none is): its end going
    /// forward, its start narrowing.
    pub wend: AtomicU64,
    /// Woken when a window ends (requests that waited for it go on).
    pub moved: tokio::sync::Notify,
    /// The window written aside, while one is.
    pub backup: parking_lot::Mutex<Option<BackupRec>>,
    /// The volume's size in the old layout and in the new one.
    pub old_cap: u64,
    pub new_cap: u64,
    /// The slots that hold the backup area: those the new layout adds, or (narrowing)
    /// those it lets go.
    pub aside: Vec<usize>,
    /// The new layout has narrower groups: the walk goes down from the new capacity.
    pub narrowing: bool,
    /// The new layout has another chunk (`sbod grow --chunk`): every window is written
    /// aside first (its new stripes cover the same member bytes as its old ones), in the
    /// rows past the new layout's end, which it leaves free until it ends.
    pub rechunk: bool,
}

/// Where a client request goes during a reshape (`Reshape::route`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Route {
    /// All of it in the new layout's view.
    New,
    /// All of it in the old layout's view.
    Old,
    /// Below `at` in the `low` view, from `at` on in the other.
    Split { at: u64, low_new: bool },
    /// It touches the window being moved: wait for it.
    Wait,
}

/// A point in a window's move, for fault-injection tests (`Array::on_reshape_step`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// The window's bytes are written aside and the superblocks say so.
    BackupRecorded,
    /// The window's new stripes are written, not yet flushed.
    Written,
    /// The superblocks record the window as moved.
    Recorded,
}

/// What a test runs at each step: the step and the window's start.
pub type Hook = Arc<dyn Fn(Step, u64) + Send + Sync>;

/// Which layout a member row is in during a reshape (see `Reshape::layout_of`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RowIn {
    New,
    Old,
    Neither,
}

/// The reshape of an array, if one runs.
pub(crate) type Slot = ArcSwap<Option<Arc<Reshape>>>;

impl Reshape {
    /// Where the backup area starts on every added member (from its data area's start):
    /// the last `MAX_BACKUP` bytes, which the new layout reaches only in the last windows
    /// of the zeroing, long after the last backup (checked by `plan_window`).
    /// Narrowing: the rows past the new layout's end, on every member.
    pub fn backup_at(&self) -> u64 {
        match self.narrowing || self.rechunk {
            false => self.new.member_size - self.backup_room(),
            true => self.new.member_size,
        }
    }

    /// Bytes of the backup area: `MAX_BACKUP`, or half of a small member; narrowing, the
    /// rows the new layout leaves free.
    fn backup_room(&self) -> u64 {
        if self.narrowing || self.rechunk {
            return self.old.dp.geometry.member_size - self.new.member_size;
        }
        let c = self.new.chunk as u64;
        (MAX_BACKUP.min(self.new.member_size / 2) / c * c).max(c)
    }

    /// Bytes of one new stripe's data: windows are whole new stripes.
    fn unit(&self) -> u64 {
        self.new.stripe_data()
    }

    /// The old layout's rows over the member bytes of the new layout's row `row`: the
    /// same row, unless the chunk changes; none past the old layout's last row (a larger
    /// chunk's last row reaches past it where the members' size is not a multiple of it).
    pub fn old_rows(&self, row: u64) -> std::ops::Range<u64> {
        let o = &self.old.dp.geometry;
        let (oc, nc) = (o.chunk as u64, self.new.chunk as u64);
        let end = ((row + 1) * nc).div_ceil(oc).min(o.stripes());
        (row * nc / oc).min(end)..end
    }

    /// The end (exclusive) of the old data at member row `row` of new group `g`: what
    /// writing that row in the new layout overwrites (0: nothing, a group or row the old
    /// layout does not have).
    fn old_end(&self, g: u64, row: u64) -> u64 {
        let o = &self.old.dp.geometry;
        let rows = self.old_rows(row);
        if g >= o.groups as u64 || rows.is_empty() {
            return 0;
        }
        ((rows.end - 1) * o.groups as u64 + g + 1) * o.stripe_data()
    }

    /// Narrowing: where the old data at member row `row` of group `g` starts in the
    /// volume (`u64::MAX`: the old layout has no such row).
    fn old_start(&self, g: u64, row: u64) -> u64 {
        let o = &self.old.dp.geometry;
        let rows = self.old_rows(row);
        if g >= o.groups as u64 || rows.is_empty() {
            return u64::MAX;
        }
        (rows.start * o.groups as u64 + g) * o.stripe_data()
    }

    /// Narrowing: the start of the lowest old data that writing the new stripes of
    /// `[lo, lo + w)` overwrites.
    fn underwrites(&self, lo: u64, w: u64) -> u64 {
        let u = self.unit();
        let groups = self.new.groups as u64;
        (lo / u..(lo + w) / u)
            .map(|s| self.old_start(s % groups, s / groups))
            .min()
            .unwrap_or(u64::MAX)
    }

    /// Where a request on `[offset, end)` goes now; `split`: one across the boundary
    /// between the layouts while no window is being moved is cut there (else it waits).
    pub fn route(&self, offset: u64, end: u64, split: bool) -> Route {
        let pos = self.pos.load(Ordering::Acquire);
        let wend = self.wend.load(Ordering::Acquire);
        if self.narrowing {
            if offset >= pos {
                Route::New
            } else if end <= wend.min(pos) {
                Route::Old
            } else if split && wend >= pos && end > pos {
                Route::Split {
                    at: pos,
                    low_new: false,
                }
            } else {
                Route::Wait
            }
        } else if end <= pos {
            Route::New
        } else if offset >= wend.max(pos) {
            Route::Old
        } else if split && wend <= pos && offset < pos {
            Route::Split {
                at: pos,
                low_new: true,
            }
        } else {
            Route::Wait
        }
    }

    /// The volume bytes still to move from `pos`.
    pub fn left(&self, pos: u64) -> u64 {
        if self.narrowing {
            pos
        } else {
            self.new_cap - pos
        }
    }

    /// The end of the old data that writing the new stripes of `[pos, pos + w)` overwrites.
    fn overwrites(&self, pos: u64, w: u64) -> u64 {
        let u = self.unit();
        let groups = self.new.groups as u64;
        (pos / u..(pos + w) / u)
            .map(|s| self.old_end(s % groups, s / groups))
            .max()
            .unwrap_or(0)
    }

    /// Which layout holds member row `row` of group `g` now (groups and rows numbered as
    /// in the new layout; the old layout's group `g` is the new one's).
    pub fn layout_of(&self, g: u64, row: u64) -> RowIn {
        let pos = self.pos.load(Ordering::Acquire);
        let s = row * self.new.groups as u64 + g;
        if self.narrowing {
            return if s * self.unit() >= pos && s * self.unit() < self.new_cap {
                RowIn::New
            } else if self.old_start(g, row) < pos {
                RowIn::Old
            } else {
                RowIn::Neither
            };
        }
        if self.rechunk && row >= self.new.stripes() {
            // The backup area (old data there let go): a check there would rewrite the
            // windows written aside as if they were stripes.
            return RowIn::Neither;
        }
        if (s + 1) * self.unit() <= pos {
            RowIn::New
        } else if self.old_end(g, row) > pos {
            RowIn::Old
        } else {
            RowIn::Neither
        }
    }

    /// The next window from `pos`: its length, and whether it must be written aside first.
    /// Narrowing, the window is `[pos - w, pos)`.
    pub fn plan_window(&self, pos: u64) -> Result<(u64, bool)> {
        if self.narrowing {
            return self.plan_window_down(pos);
        }
        let u = self.unit();
        let left = self.new_cap - pos;
        let most = (MAX_WINDOW / u).max(1) * u;
        let mut w = most.min(left);
        // In place: the new stripes overwrite only data already durable in the new layout.
        loop {
            if self.overwrites(pos, w) <= pos {
                return Ok((w, false));
            }
            if w <= u {
                break;
            }
            w = (w / 2 / u).max(1) * u;
        }
        // Written aside: all it overwrites is in the window itself.
        let mut w = (self.backup_room() / u * u).min(left);
        while w >= u {
            if self.overwrites(pos, w) <= pos + w {
                let rows = (pos + w).div_ceil(u).div_ceil(self.new.groups as u64);
                if rows * self.new.chunk as u64 > self.backup_at() {
                    break;
                }
                return Ok((w, true));
            }
            w -= u;
        }
        Err(Error::Invalid(
            format!(
                "internal: the reshape from {} to {} cannot move the window at {pos}",
                self.old.dp.geometry.level, self.new.level
            )
            .into(),
        ))
    }
}

impl Reshape {
    /// `plan_window` narrowing: the window below `pos`.
    fn plan_window_down(&self, pos: u64) -> Result<(u64, bool)> {
        let u = self.unit();
        let most = (MAX_WINDOW / u).max(1) * u;
        let mut w = most.min(pos);
        // In place: the new stripes overwrite only old data already moved (from `pos`
        // on), or beyond the new capacity.
        loop {
            if self.underwrites(pos - w, w) >= pos {
                return Ok((w, false));
            }
            if w <= u {
                break;
            }
            w = (w / 2 / u).max(1) * u;
        }
        // Written aside: all it overwrites is in the window itself, and the backup area
        // (the last rows of the members leaving) holds only old data already moved.
        let area = self.backup_at() / self.new.chunk as u64;
        let area_start = (0..self.new.groups as u64)
            .map(|g| self.old_start(g, area))
            .min()
            .unwrap_or(u64::MAX);
        let mut w = (self.backup_room() / u * u).min(pos);
        while w >= u && area_start >= pos {
            if self.underwrites(pos - w, w) >= pos - w {
                return Ok((w, true));
            }
            w -= u;
        }
        Err(Error::Invalid(
            format!(
                "internal: the reshape from {} to {} cannot move the window below {pos}",
                self.old.dp.geometry.level, self.new.level
            )
            .into(),
        ))
    }
}

impl Array {
    /// The reshape running, if any.
    pub(crate) fn reshaping(&self) -> Option<Arc<Reshape>> {
        self.reshape.load().as_ref().clone()
    }

    /// Run the reshape to its end here, in the foreground (an array opened without its
    /// background processes: `sbod grow` of an array nobody serves).
    pub async fn reshape_now(self: &Arc<Self>) -> Result<()> {
        self.run_reshape().await
    }

    /// Run the reshape to its end (or until the array closes: it resumes at the next
    /// start). The array's process slot shows it.
    pub(crate) async fn run_reshape(self: &Arc<Self>) -> Result<()> {
        let Some(r) = self.reshaping() else {
            return Ok(());
        };
        let h = self.claim(ProcessKind::Reshape, r.new_cap)?;
        h.done.store(
            r.new_cap - r.left(r.pos.load(Ordering::Acquire)),
            Ordering::Relaxed,
        );
        let result = self.reshape_windows(&r, &h).await;
        h.finish(result.as_ref().err().map(|e| e.to_string()));
        result
    }

    async fn reshape_windows(self: &Arc<Self>, r: &Arc<Reshape>, h: &ProcessHandle) -> Result<()> {
        let mut throttle = Throttle::new();
        loop {
            if self.dp().closing.load(Ordering::Acquire) || h.cancelled() {
                h.cancel();
                return Ok(());
            }
            self.dp().failed()?;
            if r.backup.lock().is_some() {
                // A window written aside did not end (an error after its bytes were put
                // aside): its old stripes may be half overwritten, so it is finished from
                // the backup, never read again from the old layout.
                self.restore_backup(r).await?;
                continue;
            }
            let pos = r.pos.load(Ordering::Acquire);
            if r.left(pos) == 0 {
                return self.finish_reshape(r).await;
            }
            let (w, backup) = r.plan_window(pos)?;
            let lo = if r.narrowing { pos - w } else { pos };
            match self.move_window(r, lo, w, backup).await {
                Ok(()) => {}
                Err(e @ Error::NoSpace(_)) => {
                    // Its file system is full: try again when there is room.
                    tracing::warn!(array = %self.name(), error = %e, "reshape waits for space");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
                Err(e) => return Err(e),
            }
            h.done.store(
                r.new_cap - r.left(r.pos.load(Ordering::Acquire)),
                Ordering::Relaxed,
            );
            throttle.pace_by(self, w, self.gate.clients()).await;
        }
    }

    /// Move `[pos, pos + w)` into the new layout (see the module's steps); narrowing,
    /// `pos` is the window's start and the durable position its end.
    async fn move_window(&self, r: &Reshape, pos: u64, w: u64, backup: bool) -> Result<()> {
        // Where the durable position is now, and where it goes when the window is moved.
        let (from, to, far) = match r.narrowing {
            false => (pos, pos + w, pos + w),
            true => (pos + w, pos, pos),
        };
        // Open the window: requests in flight drain, new ones touching it wait.
        {
            let _x = self.gate.exclusive().await;
            r.wend.store(far, Ordering::Release);
        }
        let done = async {
            self.copy_window(r, pos, w, backup).await?;
            // Durable where the superblocks will say it is, then said.
            self.dp().flush().await
        }
        .await;
        if let Err(e) = done {
            if r.backup.lock().is_none() {
                // Nothing of the window's old stripes was overwritten: it stays in the old
                // layout, as the superblocks say, and is served from there meanwhile.
                r.wend.store(from, Ordering::Release);
                r.moved.notify_waiters();
            }
            // Else its old stripes may be half overwritten: requests keep waiting until
            // it is finished from the backup (the next round, or the next start).
            return Err(e);
        }
        self.record_reshape(|| {
            r.pos.store(to, Ordering::Release);
            *r.backup.lock() = None;
        })
        .await;
        r.wend.store(to, Ordering::Release);
        r.moved.notify_waiters();
        self.reshape_step(Step::Recorded, pos);
        Ok(())
    }

    async fn copy_window(&self, r: &Reshape, pos: u64, w: u64, backup: bool) -> Result<()> {
        let data = self.read_old(r, pos, w).await?;
        if backup {
            self.write_backup(r, pos, &data).await?;
            self.reshape_step(Step::BackupRecorded, pos);
        }
        let core = self.core.load_full();
        core.family.write(&core.dp, pos, &data, false, &[]).await?;
        self.reshape_step(Step::Written, pos);
        Ok(())
    }

    fn reshape_step(&self, step: Step, pos: u64) {
        let hook = self.reshape_hook.lock().clone();
        if let Some(f) = hook {
            f(step, pos);
        }
    }

    /// Run `f` at every step of every window the reshape moves (fault-injection tests).
    #[doc(hidden)]
    pub fn on_reshape_step(&self, f: Hook) {
        *self.reshape_hook.lock() = Some(f);
    }

    /// The window's bytes in the old layout (zeros past the old capacity). No client
    /// writes them meanwhile (requests touching the window wait); the old stripe across
    /// the window's end may take a client write to its part beyond, which the family's
    /// read orders by its own stripe lock where it reconstructs (holding the lock here
    /// would deadlock with it).
    async fn read_old(&self, r: &Reshape, pos: u64, w: u64) -> Result<SharedBuf> {
        let out = AlignedBuf::zeroed(w as usize).into_shared();
        let end = (pos + w).min(r.old_cap);
        if pos < end {
            let old = &r.old;
            old.family
                .read(&old.dp, pos, &out.slice(0..(end - pos) as usize))
                .await?;
        }
        Ok(out)
    }

    /// Write a window aside on every member holding the backup area, durably, and record
    /// where.
    async fn write_backup(&self, r: &Reshape, pos: u64, data: &SharedBuf) -> Result<()> {
        let at = r.backup_at();
        let st = self.dp().state.load_full();
        let targets: Vec<Arc<Member>> = match r.rechunk {
            false => r
                .aside
                .iter()
                .filter(|&&i| st.slots[i].state == SlotState::Active)
                .filter_map(|&i| st.slots[i].member.clone())
                .collect(),
            true => {
                // Every window is written aside: on one member more than a group survives
                // losing, all in one group, so losing every copy is losing that group
                // (never fewer copies than the array survives). The group, and where in
                // it the copies start, turn with each window, so the backup writes spread
                // over every member rather than loading a few.
                let g = &self.dp().geometry;
                let (groups, w) = (g.groups as usize, g.width as usize);
                let n = (pos / data.len().max(1) as u64) as usize;
                let (grp, first) = (n % groups, n / groups % w);
                (0..w)
                    .map(|i| grp * w + (first + i) % w)
                    .filter(|&i| st.slots[i].state == SlotState::Active)
                    .filter_map(|i| st.slots[i].member.clone())
                    .take(g.redundancy() + 1)
                    .collect()
            }
        };
        if targets.is_empty() {
            return Err(Error::Refused(
                "every member holding the reshape's backup area has failed: the windows that catch up with the data being read cannot be written aside"
                    .into(),
            ));
        }
        let mut written = 0;
        let dp = self.dp();
        let writes = targets
            .iter()
            .map(|m| dp.mwrite(m, at, data.clone(), true, IoClass::Background));
        for (m, r) in targets.iter().zip(futures::future::join_all(writes).await) {
            match r {
                Ok(()) => written += 1,
                Err(e) => tracing::warn!(member = %m.path, error = %e, "reshape backup write"),
            }
        }
        if written == 0 {
            return Err(Error::Refused(
                "the reshape's backup could not be written to any member holding its area".into(),
            ));
        }
        let rec = BackupRec {
            start: pos,
            len: data.len() as u64,
            at,
            crc: crc32c::crc32c(crate::datapath::slice_of(data)),
        };
        self.record_reshape(|| *r.backup.lock() = Some(rec)).await;
        Ok(())
    }

    /// Change the reshape's record (`change`, under `mgmt`) and write it to the members'
    /// superblocks; a member whose write failed is failed, as after any state change.
    async fn record_reshape(&self, change: impl FnOnce()) {
        let _g = self.mgmt.lock().await;
        change();
        let st = self.dp().state.load_full();
        let lost = self.persist(&st, false).await;
        drop(_g);
        for m in lost {
            self.fail_member(&m, OutReason::MetadataWrite).await;
        }
    }

    /// Every byte is in the new layout: the new view takes the whole volume, and the
    /// superblocks no longer speak of a reshape.
    async fn finish_reshape(&self, r: &Reshape) -> Result<()> {
        let mut last = r.new.clone();
        if r.rechunk {
            // The rows past the new layout's end held the windows written aside: they
            // join the volume again, as zeros (parity and checksums of zeros are zeros),
            // so the volume is back to its size (rounded down to the new chunk). A crash
            // meanwhile finishes again from here.
            let c = r.new.chunk as u64;
            last.member_size = r.old.dp.geometry.member_size / c * c;
            self.zero_rows(r.new.member_size, last.member_size - r.new.member_size)
                .await?;
        }
        self.dp().flush().await?;
        let _x = self.gate.exclusive().await;
        let _g = self.mgmt.lock().await;
        let mut st = (*self.dp().state.load_full()).clone();
        // Narrowing: the last slots of each old group leave (their superblocks are
        // wiped once the members that stay record the new layout without them).
        let mut leaving = Vec::new();
        if r.narrowing {
            let (ow, nw) = (
                r.old.dp.geometry.width as usize,
                self.dp().geometry.width as usize,
            );
            let mut i = 0;
            st.slots.retain(|s| {
                let stays = i % ow < nw;
                if !stays {
                    leaving.extend(s.member.clone());
                }
                i += 1;
                stays
            });
            // The members that stay hold the new layout's data size (the rows past it
            // held the backup area; `grow --size max` takes them back).
            hold_at_most(&mut st, r.new.member_size);
        }
        if r.rechunk {
            // The members hold the old size rounded down to the new chunk.
            hold_at_most(&mut st, last.member_size);
        }
        let sizes: Vec<u64> = st
            .slots
            .iter()
            .map(|s| s.entry.as_ref().map(|e| e.size).unwrap_or(0))
            .collect();
        let family = crate::family::Personality::of(&last)?;
        let dp = DataPath::view(self.shared.clone(), last, &sizes, u64::MAX);
        self.core.store(Arc::new(Core { dp, family }));
        self.reshape.store(Arc::new(None));
        let staying = st.live_members().len();
        let recorded = self.commit_recorded(st).await;
        drop(_g);
        drop(_x);
        r.moved.notify_waiters();
        // The members that leave are wiped only once a member that stays holds the new
        // layout: where nothing was recorded (the lease lost, this head fenced) or no
        // superblock write landed, the old layout, which still needs them, is what the
        // members say, and a wiped one would be missing from it.
        let wipe = recorded.as_ref().is_some_and(|lost| lost.len() < staying);
        for m in recorded.unwrap_or_default() {
            self.fail_member(&m, OutReason::MetadataWrite).await;
        }
        for m in leaving {
            if wipe {
                // Its superblock says it left this array (a later assembly does not
                // take it).
                Self::wipe(&m).await;
            } else {
                tracing::warn!(array = %self.name(), member = %m.path, "the narrower layout was not recorded: the member that leaves keeps its superblock");
            }
            m.dev.close();
        }
        tracing::info!(array = %self.name(), size = self.size(), "reshape finished");
        self.kick();
        Ok(())
    }

    /// Zero `[from, from + len)` of every member in service (the others are rebuilt in
    /// full when they are back).
    async fn zero_rows(&self, from: u64, len: u64) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let st = self.dp().state.load_full();
        let members: Vec<Arc<Member>> = st
            .slots
            .iter()
            .filter(|s| s.state == SlotState::Active)
            .filter_map(|s| s.member.clone())
            .collect();
        let zeroing = members.iter().map(|m| async move {
            self.dp()
                .mzero(m, from, len, true)
                .await
                .map_err(|e| Error::io(format!("zeroing the backup rows of {}", m.path), e))
        });
        for r in futures::future::join_all(zeroing).await {
            r?;
        }
        Ok(())
    }

    /// At a start after a crash during a window that was written aside: the backup (the
    /// window's bytes as they were) is written into the window's new stripes, and the
    /// superblocks move past it. A backup no added member holds whole is an error: the
    /// window's old stripes may be half overwritten.
    pub(crate) async fn restore_backup(&self, r: &Reshape) -> Result<()> {
        let Some(b) = *r.backup.lock() else {
            return Ok(());
        };
        let st = self.dp().state.load_full();
        let mut found = None;
        for &i in &r.aside {
            let Some(m) = st.slots[i].member.clone() else {
                continue;
            };
            if st.slots[i].state != SlotState::Active {
                continue;
            }
            let buf = AlignedBuf::zeroed(b.len as usize).into_shared();
            // Raw: the backup's own crc vouches for it (its blocks' checksums were not
            // flushed with it).
            if self
                .dp()
                .mread_raw(&m, b.at, buf.clone(), IoClass::Foreground)
                .await
                .is_ok()
                && crc32c::crc32c(crate::datapath::slice_of(&buf)) == b.crc
            {
                found = Some(buf);
                break;
            }
        }
        let Some(data) = found else {
            return Err(Error::Refused(
                format!(
                    "the reshape was writing the volume's bytes {}..{} in place and no member holding its backup area has it whole",
                    b.start,
                    b.start + b.len
                )
                .into(),
            ));
        };
        let core = self.core.load_full();
        core.family
            .write(&core.dp, b.start, &data, false, &[])
            .await?;
        self.dp().flush().await?;
        let to = match r.narrowing {
            false => b.start + b.len,
            true => b.start,
        };
        self.record_reshape(|| {
            r.pos.store(to, Ordering::Release);
            r.wend.store(to, Ordering::Release);
            *r.backup.lock() = None;
        })
        .await;
        tracing::warn!(array = %self.name(), start = b.start, len = b.len, "reshape: the window being moved at the crash was written from its backup");
        Ok(())
    }
}

/// Every member (and spare) of `st` holds at most `size` bytes of data.
fn hold_at_most(st: &mut crate::array::State, size: u64) {
    for s in st.slots.iter_mut() {
        if let Some(m) = &s.member {
            let m = m.resized(size.min(m.size));
            s.entry = Some(m.entry());
            s.member = Some(m);
        } else if let Some(e) = &mut s.entry {
            e.size = e.size.min(size);
        }
    }
    for sp in st.spares.iter_mut() {
        *sp = sp.resized(size.min(sp.size));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::Level;

    fn reshape(old: Geometry, new: Geometry) -> Reshape {
        let old_cap = old.capacity();
        let new_cap = new.capacity();
        let sizes = vec![0; new.members()];
        let shared_state = crate::datapath::test_shared();
        let dp = DataPath::view_strided(
            shared_state,
            old.clone(),
            &sizes,
            u64::MAX,
            old.width.max(new.width) as usize,
        );
        let family = crate::family::Personality::of(&old).unwrap();
        let narrowing = old.width > new.width;
        let old_cap_chunk_differs = old.chunk != new.chunk;
        Reshape {
            old: Arc::new(Core { dp, family }),
            new,
            pos: AtomicU64::new(0),
            wend: AtomicU64::new(0),
            moved: Default::default(),
            backup: Default::default(),
            old_cap,
            new_cap,
            aside: vec![],
            narrowing,
            rechunk: old_cap_chunk_differs,
        }
    }

    fn geo(level: Level, groups: u32, width: u32) -> Geometry {
        Geometry {
            level,
            groups,
            width,
            chunk: 64 << 10,
            member_size: 256 << 20,
            data_offset: 1 << 20,
            dedicated: 0,
            declustered: None,
        }
    }

    /// Walk a whole reshape window by window: every window either overwrites only data
    /// below the durable position, or (written aside) only data inside itself; every
    /// byte of old data is read before its place is overwritten.
    fn walk(old: Geometry, new: Geometry) -> (u64, u64) {
        let r = reshape(old, new);
        let (mut pos, mut windows, mut backups) = (0, 0, 0);
        while pos < r.new_cap {
            let (w, b) = r.plan_window(pos).expect("a window");
            assert!(w > 0 && w % r.unit() == 0);
            let over = r.overwrites(pos, w);
            if b {
                assert!(over <= pos + w && w <= r.backup_room());
                backups += 1;
            } else {
                assert!(over <= pos, "window {pos}+{w} overwrites up to {over}");
            }
            pos += w;
            windows += 1;
        }
        assert_eq!(pos, r.new_cap);
        (windows, backups)
    }

    #[test]
    fn widening_needs_a_backup_only_for_the_first_windows() {
        for (old, new) in [
            (geo(Level::Raid5, 1, 4), geo(Level::Raid5, 1, 5)),
            (geo(Level::Raid6, 1, 8), geo(Level::Raid6, 1, 10)),
            (geo(Level::Raid0, 1, 2), geo(Level::Raid0, 1, 3)),
            (
                geo(Level::Ec { k: 4, m: 2 }, 1, 6),
                geo(Level::Ec { k: 5, m: 2 }, 1, 7),
            ),
            (geo(Level::Raid6, 2, 6), geo(Level::Raid6, 2, 7)),
            (geo(Level::Raid6, 2, 6), geo(Level::Raid6, 3, 6)),
            (geo(Level::Raid10, 2, 2), geo(Level::Raid10, 3, 2)),
        ] {
            let (windows, backups) = walk(old.clone(), new.clone());
            assert!(
                (1..=3).contains(&backups),
                "{old:?} -> {new:?}: {backups} backups"
            );
            assert!(windows < 200, "{windows} windows");
        }
    }

    /// Walk a whole narrowing down from the new capacity: every window overwrites only
    /// old data already moved (from the durable position on), or (written aside) only
    /// data inside itself, and the backup area holds only old data already moved.
    fn walk_down(old: Geometry, new: Geometry) -> (u64, u64) {
        assert_eq!(
            old.narrowed((old.width - new.width) as usize),
            Ok(new.clone())
        );
        let r = reshape(old, new);
        let (mut pos, mut windows, mut backups) = (r.new_cap, 0, 0);
        while pos > 0 {
            let (w, b) = r.plan_window(pos).expect("a window");
            assert!(w > 0 && w % r.unit() == 0 && w <= pos);
            let under = r.underwrites(pos - w, w);
            if b {
                assert!(under >= pos - w && w <= r.backup_room());
                let area = r.backup_at() / r.new.chunk as u64;
                assert!((0..r.new.groups as u64).all(|g| r.old_start(g, area) >= pos));
                backups += 1;
            } else {
                assert!(
                    under >= pos,
                    "window below {pos} of {w} overwrites from {under}"
                );
            }
            pos -= w;
            windows += 1;
        }
        (windows, backups)
    }

    #[test]
    fn narrowing_needs_a_backup_only_for_the_last_windows() {
        for (old, new) in [
            (geo(Level::Raid5, 1, 5), 1),
            (geo(Level::Raid5, 1, 4), 1),
            (geo(Level::Raid6, 1, 10), 2),
            (geo(Level::Raid0, 1, 3), 1),
            (geo(Level::Ec { k: 5, m: 2 }, 1, 7), 1),
            (geo(Level::Raid6, 2, 7), 1),
        ] {
            let new = old.narrowed(new).unwrap();
            let (windows, backups) = walk_down(old.clone(), new.clone());
            assert!(
                (1..=3).contains(&backups),
                "{old:?} -> {new:?}: {backups} backups"
            );
            assert!(windows < 200, "{windows} windows");
        }
    }

    /// A new chunk: every window is whole rows of both chunks, written aside, and its
    /// new stripes overwrite exactly the old data it holds; rows below the position are
    /// in the new layout, the rest in the old one.
    #[test]
    fn a_new_chunk_writes_every_window_aside() {
        for (old, chunk) in [
            (geo(Level::Raid5, 1, 4), 128u32 << 10),
            (geo(Level::Raid6, 2, 6), 16 << 10),
            (geo(Level::Raid0, 1, 3), 1 << 20),
            (geo(Level::Raid10, 2, 2), 256 << 10),
            (geo(Level::Ec { k: 5, m: 2 }, 1, 7), 32 << 10),
        ] {
            let room = 8 << 20;
            let new = Geometry {
                chunk,
                member_size: old.member_size - room,
                ..old.clone()
            };
            let r = reshape(old.clone(), new);
            assert!(r.rechunk && !r.narrowing);
            assert_eq!(r.backup_at(), old.member_size - room);
            let l = (old.chunk as u64).max(chunk as u64);
            let whole = l * old.stripe_data() / old.chunk as u64 * old.groups as u64;
            let (mut pos, mut windows) = (0, 0);
            while pos < r.new_cap {
                let (w, b) = r.plan_window(pos).expect("a window");
                assert!(b, "{old:?} -> {chunk}: window at {pos} in place");
                assert!(w % whole == 0 && w <= room, "window {w} of {whole}");
                assert_eq!(r.overwrites(pos, w), pos + w);
                pos += w;
                windows += 1;
                r.pos.store(pos, Ordering::Release);
                let row = pos / r.unit() / r.new.groups as u64;
                if row > 0 {
                    assert_eq!(r.layout_of(0, row - 1), RowIn::New);
                }
                if pos < r.new_cap {
                    assert_eq!(r.layout_of(0, row), RowIn::Old);
                    // The old rows over it start where it does, in member bytes.
                    let o = r.old_rows(row);
                    assert_eq!(o.start * old.chunk as u64, row * chunk as u64);
                }
            }
            assert_eq!(pos, r.new_cap);
            assert!(windows < 400, "{windows} windows");
            // The backup area is no layout's: no check rewrites the windows set aside.
            r.pos.store(0, Ordering::Release);
            assert_eq!(r.layout_of(0, r.new.stripes()), RowIn::Neither);
        }
    }

    #[test]
    fn routes_follow_the_direction_of_the_walk() {
        let r = reshape(geo(Level::Raid5, 1, 5), geo(Level::Raid5, 1, 4));
        r.pos.store(1 << 20, Ordering::Release);
        r.wend.store(1 << 20, Ordering::Release);
        assert_eq!(r.route(1 << 20, 2 << 20, false), Route::New);
        assert_eq!(r.route(0, 4096, false), Route::Old);
        assert_eq!(r.route(0, 2 << 20, false), Route::Wait);
        assert_eq!(
            r.route(0, 2 << 20, true),
            Route::Split {
                at: 1 << 20,
                low_new: false
            }
        );
        // A window below the position is being moved: what touches it waits.
        r.wend.store(512 << 10, Ordering::Release);
        assert_eq!(r.route(600 << 10, 700 << 10, true), Route::Wait);
        assert_eq!(r.route(0, 4096, true), Route::Old);
        let f = reshape(geo(Level::Raid5, 1, 4), geo(Level::Raid5, 1, 5));
        f.pos.store(1 << 20, Ordering::Release);
        f.wend.store(1 << 20, Ordering::Release);
        assert_eq!(f.route(0, 4096, false), Route::New);
        assert_eq!(f.route(1 << 20, 2 << 20, false), Route::Old);
        assert_eq!(
            f.route(0, 2 << 20, true),
            Route::Split {
                at: 1 << 20,
                low_new: true
            }
        );
    }

    #[test]
    fn the_old_end_of_a_row_is_its_old_stripe_data_end() {
        let r = reshape(geo(Level::Raid5, 2, 4), geo(Level::Raid5, 2, 5));
        let sd = 3 * (64 << 10);
        // Old group 1, row 0 = old logical stripe 1.
        assert_eq!(r.old_end(1, 0), 2 * sd);
        assert_eq!(r.old_end(0, 2), 5 * sd);
        // New groups the old layout lacks hold nothing old.
        assert_eq!(r.old_end(2, 0), 0);
    }
}
