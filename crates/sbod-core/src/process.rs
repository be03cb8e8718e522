//! Background processes: rebuild (onto spares and replacements), scrub (check / repair),
//! resync (parity made consistent after a crash or at creation), and the bitmap sweeper.
//! Each works stripe by stripe under the same stripe locks and through the same member
//! queues as client I/O, so it runs online.

use crate::array::{Array, Member, State};
use crate::buf::{AlignedBuf, SharedBuf};
use crate::dev::IoClass;
use crate::error::{Error, Result};
use crate::io::WriteFault;
use crate::layout::{Level, Scheme};
use crate::reason;
use crate::superblock::{OutReason, SlotState};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use sbod_types::{MismatchRegion, ProcessKind, ProcessStatus};

pub struct ProcessHandle {
    pub kind: ProcessKind,
    pub total: AtomicU64,
    pub done: AtomicU64,
    pub mismatches: AtomicU64,
    pub repaired: AtomicU64,
    pub started: Instant,
    cancel: AtomicBool,
    finished: AtomicBool,
    /// How long it ran, once it has ended.
    ended_after: parking_lot::Mutex<Option<std::time::Duration>>,
    error: parking_lot::Mutex<Option<String>>,
    pub regions: parking_lot::Mutex<Vec<MismatchRegion>>,
    notify: tokio::sync::Notify,
}

impl ProcessHandle {
    fn new(kind: ProcessKind, total: u64) -> Arc<ProcessHandle> {
        Arc::new(ProcessHandle {
            kind,
            total: AtomicU64::new(total),
            done: AtomicU64::new(0),
            mismatches: AtomicU64::new(0),
            repaired: AtomicU64::new(0),
            started: Instant::now(),
            cancel: AtomicBool::new(false),
            finished: AtomicBool::new(false),
            ended_after: parking_lot::Mutex::new(None),
            error: parking_lot::Mutex::new(None),
            regions: parking_lot::Mutex::new(Vec::new()),
            notify: tokio::sync::Notify::new(),
        })
    }

    pub fn cancel(&self) {
        self.cancel.store(true, Ordering::Release);
    }

    pub fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Acquire)
    }

    pub fn is_finished(&self) -> bool {
        self.finished.load(Ordering::Acquire)
    }

    fn finish(&self, err: Option<String>) {
        *self.error.lock() = err;
        *self.ended_after.lock() = Some(self.started.elapsed());
        self.finished.store(true, Ordering::Release);
        self.notify.notify_waiters();
    }

    /// Wait until the process ends.
    pub async fn wait(&self) {
        loop {
            let n = self.notify.notified();
            if self.is_finished() {
                return;
            }
            n.await;
        }
    }

    pub fn status(&self) -> ProcessStatus {
        let done = self.done.load(Ordering::Relaxed);
        let total = self.total.load(Ordering::Relaxed);
        // A finished process keeps the duration it ran, and the rate it ran at.
        let elapsed = self
            .ended_after
            .lock()
            .unwrap_or_else(|| self.started.elapsed())
            .as_secs_f64();
        let rate = if elapsed > 0.0 {
            done as f64 / elapsed
        } else {
            0.0
        };
        let finished = self.is_finished();
        ProcessStatus {
            kind: self.kind,
            done,
            total,
            percent: if total > 0 {
                100.0 * done as f64 / total as f64
            } else {
                100.0
            },
            elapsed_secs: elapsed,
            rate,
            eta_secs: (!finished && rate > 0.0).then(|| (total.saturating_sub(done)) as f64 / rate),
            mismatches: self.mismatches.load(Ordering::Relaxed),
            repaired: self.repaired.load(Ordering::Relaxed),
            finished,
            cancelled: self.cancelled(),
            error: self.error.lock().clone(),
            regions: self.regions.lock().clone(),
        }
    }
}

/// Keeps a background process to its rate: `min_rate` while clients are busy, `max_rate`
/// otherwise (0 = unlimited).
struct Throttle {
    window: Instant,
    bytes: u64,
    fg_last: u64,
    rate: u64,
}

impl Throttle {
    fn new() -> Throttle {
        Throttle {
            window: Instant::now(),
            bytes: 0,
            fg_last: 0,
            rate: 0,
        }
    }

    async fn pace(&mut self, array: &Array, bytes: u64) {
        let st = array.state.load();
        let fg: u64 = st
            .live_members()
            .iter()
            .map(|m| m.stats.fg_ops.load(Ordering::Relaxed))
            .sum();
        let busy = fg != self.fg_last;
        self.fg_last = fg;
        let s = array.settings.lock().clone();
        let rate = if busy && s.rebuild_min_rate > 0 {
            if s.rebuild_max_rate > 0 {
                s.rebuild_min_rate.min(s.rebuild_max_rate)
            } else {
                s.rebuild_min_rate
            }
        } else {
            s.rebuild_max_rate
        };
        if rate != self.rate {
            self.rate = rate;
            self.window = Instant::now();
            self.bytes = 0;
        }
        self.bytes += bytes;
        if rate > 0 {
            let due = Duration::from_secs_f64(self.bytes as f64 / rate as f64);
            let el = self.window.elapsed();
            if due > el {
                tokio::time::sleep(due - el).await;
            }
            if self.window.elapsed() > Duration::from_secs(2) {
                self.window = Instant::now();
                self.bytes = 0;
            }
        } else if busy {
            // Unlimited but clients are active: let their requests in between stripes.
            tokio::task::yield_now().await;
        }
    }
}

/// Stripes a background process keeps in flight.
const PIPELINE: u64 = 8;

/// What one stripe check found.

#[derive(Default)]
struct StripeCheck {
    mismatched_blocks: u64,
    repaired_blocks: u64,
    /// Resync: a member is missing, nothing was done.
    skipped: bool,
    /// Members a check took out for returning wrong data.
    failed: Vec<String>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum CheckMode {
    Check,
    Repair,
    /// Make redundancy agree with the data (parity from data, mirrors from the first copy).
    Resync,
}

fn slice_of(b: &SharedBuf) -> &[u8] {
    // SAFETY: buffers here are read only after their I/O completed.
    unsafe { b.as_slice() }
}

#[allow(clippy::mut_from_ref)]
fn slice_mut(b: &SharedBuf) -> &mut [u8] {
    // SAFETY: as above, one user at a time.
    unsafe { b.as_mut_slice() }
}

impl Array {
    pub(crate) fn last_process(&self) -> Option<ProcessStatus> {
        let p = self.process.lock().clone()?;
        p.is_finished().then(|| p.status())
    }

    /// The running (or last) background process.
    pub fn current_process(&self) -> Option<Arc<ProcessHandle>> {
        self.process.lock().clone()
    }

    pub(crate) fn cancel_process_on_failure(&self) {
        if let Some(p) = self.process.lock().as_ref() {
            if matches!(p.kind, ProcessKind::Check | ProcessKind::Repair) && !p.is_finished() {
                p.cancel();
            }
        }
    }

    /// Claim the process slot, or say what is running.
    fn claim(&self, kind: ProcessKind, total: u64) -> Result<Arc<ProcessHandle>> {
        let mut slot = self.process.lock();
        if let Some(p) = slot.as_ref() {
            if !p.is_finished() {
                return Err(Error::Busy(
                    format!(
                        "a {:?} is running on '{}' ({:.1}% done); try again when it finishes",
                        p.kind,
                        self.name,
                        p.status().percent
                    )
                    .to_lowercase(),
                ));
            }
        }
        let h = ProcessHandle::new(kind, total);
        *slot = Some(h.clone());
        Ok(h)
    }

    pub(crate) fn start_processes(self: &Arc<Self>) {
        let a = self.clone();
        let sup = tokio::spawn(async move { a.supervise().await });
        let a = self.clone();
        let sweep = tokio::spawn(async move { a.sweep_loop().await });
        let a = self.clone();
        let watch = tokio::spawn(async move { a.watch_loop().await });
        let flusher = crate::sync::spawn_flusher(self);
        self.tasks.lock().extend([sup, sweep, watch, flusher]);
    }

    /// Every second: fail members that shrank (a truncated member file is caught here even
    /// where no I/O touches the part cut off), and resync the stripes writes left
    /// inconsistent for want of space, once writes succeed again.
    async fn watch_loop(self: Arc<Self>) {
        loop {
            // Made before `closing` is read, so a close's kick during a round is not missed.
            let kicked = self.wake.notified();
            if self.closing.load(Ordering::Acquire) {
                return;
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                _ = kicked => {}
            }
            if self.closing.load(Ordering::Acquire) {
                return;
            }
            self.check_sizes().await;
            if let Err(e) = self.resync_unsynced().await {
                tracing::debug!(array = %self.name, error = %e, "inconsistent stripes wait");
            }
        }
    }

    /// Fail every member in service that is now smaller than the data the array keeps on
    /// it. Returns how many were failed.
    pub async fn check_sizes(&self) -> usize {
        let mut n = 0;
        for m in self.state.load_full().live_members() {
            if let Some(s) = self.shrunk(&m) {
                self.fail_member(&m, s.why()).await;
                n += 1;
            }
        }
        n
    }

    /// Hold every stripe of these bitmap regions as inconsistent, for the watch to resync
    /// (a resync that could not run now).
    pub(crate) fn defer_resync(&self, regions: &[u64]) {
        let Some(bm) = self.bitmap.as_ref() else {
            return;
        };
        let chunk = self.geometry.chunk as u64;
        for &r in regions {
            let from = r * bm.region / chunk;
            let to = ((r + 1) * bm.region).min(self.geometry.member_size) / chunk;
            for t in from..to {
                for g in 0..self.geometry.groups as usize {
                    bm.unsynced(g, t, r);
                }
            }
        }
    }

    /// Resync the stripes writes left inconsistent (parity from the data; mirrors from the
    /// first copy, or the majority of three or more). A stripe whose group misses a member
    /// waits (its parity cannot be recomputed); out of space stops the round. Returns how
    /// many stay inconsistent.
    pub async fn resync_unsynced(&self) -> Result<usize> {
        let Some(bm) = self.bitmap.as_ref() else {
            return Ok(0);
        };
        let stripes = bm.unsynced_stripes();
        if stripes.is_empty() {
            return Ok(0);
        }
        for (g, t) in stripes {
            match self.check_stripe(g, t, CheckMode::Resync).await {
                Ok(c) if !c.skipped => {
                    bm.synced(g, t);
                    tracing::info!(array = %self.name, group = g, stripe = t, "resynced a stripe a write had left inconsistent");
                }
                Ok(_) => {}
                Err(e @ Error::NoSpace(_)) => return Err(e),
                Err(e) => {
                    tracing::warn!(array = %self.name, group = g, stripe = t, error = %e, "could not resync an inconsistent stripe")
                }
            }
        }
        Ok(bm.unsynced_stripes().len())
    }

    /// Runs rebuilds and the initial resync whenever there is work.
    async fn supervise(self: Arc<Self>) {
        loop {
            if self.closing.load(Ordering::Acquire) {
                return;
            }
            let notified = self.wake.notified();
            let st = self.state.load_full();
            if st.failed.is_none() && !rebuild_targets(&st).is_empty() {
                // A scrub gives way to a rebuild (one run in the foreground is waited for).
                let running = self.process.lock().clone();
                if let Some(p) = running.filter(|p| !p.is_finished()) {
                    if p.kind != ProcessKind::Rebuild {
                        p.cancel();
                    }
                    p.wait().await;
                }
                if let Err(e) = self.rebuild().await {
                    tracing::error!(array = %self.name, error = %e, "rebuild stopped");
                    // Try again in a while, or at once when woken (a close, a new member).
                    let _ = tokio::time::timeout(Duration::from_secs(1), notified).await;
                }
                continue;
            }
            if st.failed.is_none()
                && self.resync_offset.load(Ordering::Acquire) != u64::MAX
                && !st.slots.iter().any(|s| s.state != SlotState::Active)
            {
                if let Err(e) = self.initial_resync().await {
                    tracing::warn!(array = %self.name, error = %e, "resync paused");
                    let _ = tokio::time::timeout(Duration::from_secs(1), notified).await;
                }
                continue;
            }
            let _ = tokio::time::timeout(Duration::from_secs(5), notified).await;
        }
    }

    /// Clear bitmap bits of regions idle since the last sweep, after a flush.
    async fn sweep_loop(self: Arc<Self>) {
        let Some(bm) = self.bitmap.as_ref() else {
            return;
        };
        loop {
            // Created before looking at `closing`, so a close's kick is never missed (a
            // sweeper first polled after the close used to sleep its full second).
            let notified = self.wake.notified();
            if self.closing.load(Ordering::Acquire) {
                return;
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(1000)) => {}
                _ = notified => {}
            }
            if self.closing.load(Ordering::Acquire) {
                return;
            }
            let cand = bm.idle_candidates();
            if cand.is_empty() || !self.may_clear_bits().await || self.flush().await.is_err() {
                continue;
            }
            let mut i = 0;
            while i < cand.len() {
                let blk = cand[i] / crate::bitmap::BITS_PER_BLOCK;
                let mut img = bm.blocks[blk as usize].lock().await;
                let mut cleared = Vec::new();
                while i < cand.len() && cand[i] / crate::bitmap::BITS_PER_BLOCK == blk {
                    if bm.begin_clear(cand[i], &mut img) {
                        cleared.push(cand[i]);
                    }
                    i += 1;
                }
                if !cleared.is_empty() && self.write_bitmap_block(blk as usize, &img).await.is_ok()
                {
                    for r in cleared {
                        bm.finish_clear(r);
                    }
                } else {
                    for r in cleared {
                        // Could not write: keep the region dirty.
                        bm.set_dirty(r);
                    }
                }
            }
        }
    }

    /// Bits are the record of what a member that is out missed: none is cleared while any
    /// slot is out. And before the first clear since the event last moved, the superblocks
    /// move `bitmap_since` to a new event, so a member that stopped before it (a copy put
    /// back, a member taken out) can never be recovered from bits already gone.
    async fn may_clear_bits(&self) -> bool {
        let whole = |st: &State| st.slots.iter().all(|s| s.state == SlotState::Active);
        if !whole(&self.state.load_full()) {
            return false;
        }
        let _g = self.mgmt.lock().await;
        let st = self.state.load_full();
        if !whole(&st) || st.failed.is_some() {
            return false;
        }
        let event = self.event.load(Ordering::Acquire);
        if self.bitmap_since.load(Ordering::Acquire) >= event {
            return true;
        }
        self.bitmap_since.store(event + 1, Ordering::Release);
        let lost = self.persist(&st, false).await;
        drop(_g);
        if lost.is_empty() {
            return true;
        }
        for m in lost {
            self.fail_member(&m, OutReason::MetadataWrite).await;
        }
        false
    }

    fn lock_key(&self, slot: usize) -> usize {
        if self.geometry.level == Level::Concat {
            slot
        } else {
            slot / self.geometry.width as usize
        }
    }

    /// Rebuild every slot that is rebuilding or being replaced, resumably.
    async fn rebuild(self: &Arc<Self>) -> Result<()> {
        let chunk = self.geometry.chunk as u64;
        let total = self.geometry.member_size;
        if rebuild_targets(&self.state.load_full()).is_empty() {
            return Ok(());
        }
        let handle = self.claim(ProcessKind::Rebuild, total)?;

        let mut throttle = Throttle::new();
        let mut last_persist = Instant::now();
        let result: Result<()> = async {
            loop {
                let st = self.state.load_full();
                if let Some(why) = &st.failed {
                    return Err(Error::Failed(why.clone()));
                }
                let targets = rebuild_targets(&st);
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
                    if handle.cancelled() || self.closing.load(Ordering::Acquire) {
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
                        let mut keys: Vec<usize> = targets
                            .iter()
                            .filter(|x| self.target_needs(x, tt * chunk))
                            .map(|x| self.lock_key(x.slot))
                            .collect();
                        keys.sort_unstable();
                        keys.dedup();
                        jobs.extend(
                            keys.into_iter()
                                .map(|key| self.rebuild_stripe(key, tt, &targets)),
                        );
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
            let running = self.process.lock().clone().filter(|p| !p.is_finished());
            if let Some(p) = running {
                if p.kind != ProcessKind::Rebuild {
                    p.cancel();
                }
                p.wait().await;
                continue;
            }
            let st = self.state.load_full();
            if let Some(why) = &st.failed {
                return Err(Error::Failed(why.clone()));
            }
            if rebuild_targets(&st).is_empty() {
                return Ok(());
            }
            match self.rebuild().await {
                Err(Error::Busy(_)) => continue,
                other => other?,
            }
        }
    }

    /// Persist rebuild (and initial resync) progress. What the rebuild wrote below the
    /// recorded offsets is made durable first: a superblock must never say a member is
    /// valid where its data could still be lost to a power cut.
    async fn checkpoint(&self) {
        if self.flush().await.is_err() {
            return;
        }
        let _g = self.mgmt.lock().await;
        let st = self.state.load_full();
        let lost = self.persist(&st, false).await;
        drop(_g);
        for m in lost {
            self.fail_member(&m, OutReason::MetadataWrite).await;
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
        let st = self.state.load_full();
        if !complete(&st) || self.flush().await.is_err() {
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
        self.sync_bitmap(&joining).await;
        let _g = self.mgmt.lock().await;
        let st = self.state.load_full();
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
        self.judge(&mut new);
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
                match (&self.bitmap, x.bitmap) {
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
    async fn rebuild_stripe(&self, key: usize, t: u64, plan: &[Target]) -> Result<u64> {
        let chunk = self.geometry.chunk as u64;
        let w = self.geometry.width as usize;
        let _lock = self.locks.lock(key, t).await;
        let st = self.state.load_full();
        let base = t * chunk;
        let slots: Vec<usize> = if self.geometry.level == Level::Concat {
            vec![key]
        } else {
            (key * w..(key + 1) * w).collect()
        };
        let targets: Vec<(usize, Arc<Member>)> = rebuild_targets(&st)
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
        let mut writes: Vec<(Arc<Member>, SharedBuf)> = Vec::new();
        match self.geometry.scheme() {
            Scheme::Parity { m, .. } if m > 0 => {
                let shard_of = |slot: usize| self.geometry.shard_of_member(t, slot - key * w);
                let want: Vec<usize> = targets.iter().map(|(s, _)| shard_of(*s)).collect();
                let g = self
                    .gather(&st, key, t, 0, len, &want, IoClass::Background)
                    .await?;
                for (slot, mem) in &targets {
                    writes.push((
                        mem.clone(),
                        g.bufs[shard_of(*slot)].clone().expect("gathered"),
                    ));
                }
            }
            Scheme::Mirror { .. } => {
                let buf = AlignedBuf::for_overwrite(len as usize).into_shared();
                let mut ok = false;
                for s in &slots {
                    if let Some(m) = st.slots[*s].readable(base + len) {
                        match self.mread(m, base, buf.clone(), IoClass::Background).await {
                            Ok(()) => {
                                ok = true;
                                break;
                            }
                            Err(e) => self.note_read_error(m, &e).await,
                        }
                    }
                }
                if !ok {
                    return Err(Error::Failed(format!(
                        "no readable copy in group {key} at member offset {base}"
                    )));
                }
                for (_, mem) in &targets {
                    writes.push((mem.clone(), buf.clone()));
                }
            }
            _ => {
                // No redundancy: only a replacement can be rebuilt, by copying.
                for (slot, mem) in &targets {
                    let src = st.slots[*slot]
                        .readable(base + len)
                        .ok_or_else(|| {
                            Error::Failed(format!(
                                "slot {slot} has no readable member to copy from"
                            ))
                        })?
                        .clone();
                    let buf = AlignedBuf::for_overwrite(len as usize).into_shared();
                    if let Err(e) = self
                        .mread(&src, base, buf.clone(), IoClass::Background)
                        .await
                    {
                        self.note_read_error(&src, &e).await;
                        return Err(Error::io(format!("copying from {}", src.path), e));
                    }
                    writes.push((mem.clone(), buf));
                }
            }
        }
        let mut bytes = 0;
        let mut full = Vec::new();
        for (mem, buf) in writes {
            let n = buf.len() as u64;
            bytes += n;
            let r = self
                .mwrite(&mem, base, buf, false, IoClass::Background)
                .await;
            if r.is_ok() {
                self.note_recovered(&mem.uuid, n);
            }
            if let Err(e) = r {
                if self.write_failed(&mem, &e, reason::REBUILD_WRITE).await == WriteFault::NoSpace {
                    full.push(mem);
                }
            }
        }
        if !full.is_empty() {
            // Out of space: the rebuild pauses here (its progress stays before this
            // stripe) and the supervisor tries again; the member stays.
            return Err(self.nospace_error(&full));
        }
        Ok(bytes)
    }

    /// Start a scrub: `repair` fixes what it finds. Refused while another process runs or
    /// when redundancy is missing.
    pub fn start_scrub(self: &Arc<Self>, repair: bool) -> Result<Arc<ProcessHandle>> {
        if self.geometry.redundancy() == 0 {
            return Err(Error::Invalid(format!(
                "'{}' is {}: there is no redundancy to check",
                self.name, self.geometry.level
            )));
        }
        let st = self.state.load_full();
        if st.slots.iter().any(|s| s.state != SlotState::Active) {
            return Err(Error::Refused(format!(
                "'{}' is degraded: scrub needs every member; replace or rebuild first",
                self.name
            )));
        }
        let kind = if repair {
            ProcessKind::Repair
        } else {
            ProcessKind::Check
        };
        let stripes = self.geometry.stripes();
        let h = self.claim(kind, stripes * self.geometry.chunk as u64)?;
        let a = self.clone();
        let h2 = h.clone();
        let task = tokio::spawn(async move {
            let mode = if repair {
                CheckMode::Repair
            } else {
                CheckMode::Check
            };
            let r = a.scrub_pass(&h2, mode, 0, stripes).await;
            if repair {
                // Repaired data must be durable before anyone relies on it.
                let _ = a.flush().await;
            }
            h2.finish(r.err().map(|e| e.to_string()));
        });
        self.tasks.lock().push(task);
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
        let chunk = self.geometry.chunk as u64;
        let mut throttle = Throttle::new();
        let region = self
            .bitmap
            .as_ref()
            .map(|b| b.region)
            .unwrap_or(chunk * 1024);
        let groups = self.geometry.groups as usize;
        let mut t = from;
        while t < to {
            if h.cancelled() || self.closing.load(Ordering::Acquire) {
                return Err(Error::Busy("scrub stopped before it finished".into()));
            }
            let w_end = (t + PIPELINE).min(to);
            let jobs = (t..w_end).flat_map(|tt| (0..groups).map(move |g| (tt, g)));
            let checks = futures::future::join_all(
                jobs.clone().map(|(tt, g)| self.check_stripe(g, tt, mode)),
            )
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
                )));
            }
            for ((tt, g), c) in jobs.zip(checks) {
                let c = c?;
                if c.skipped {
                    // A resync that cannot run (a member missing): the stripe stays held
                    // as inconsistent, so nothing is rebuilt from its parity, which may
                    // not match (the write hole); the watch resyncs it once it can.
                    if let Some(bm) = &self.bitmap {
                        bm.unsynced(g, tt, bm.region_of(tt * chunk));
                    }
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
                            volume_offset: (tt * self.geometry.groups as u64 + g as u64)
                                * self.geometry.stripe_data(),
                            blocks: c.mismatched_blocks,
                        }),
                    }
                }
                h.repaired.fetch_add(c.repaired_blocks, Ordering::Relaxed);
            }
            h.done.store(w_end * chunk, Ordering::Relaxed);
            throttle
                .pace(self, (w_end - t) * chunk * self.geometry.members() as u64)
                .await;
            t = w_end;
        }
        Ok(())
    }

    /// Read a whole stripe of a group, compare redundancy with data, and fix per `mode`.
    async fn check_stripe(&self, g: usize, t: u64, mode: CheckMode) -> Result<StripeCheck> {
        let chunk = self.geometry.chunk as u64;
        let w = self.geometry.width as usize;
        let base = t * chunk;
        let _lock = self.locks.lock(g, t).await;
        // A stripe a write left inconsistent is not corrupt: a check passes over it, a
        // repair resyncs it (parity from the data), and nobody is blamed.
        let unsynced = self.bitmap.as_ref().is_some_and(|b| b.is_unsynced(g, t));
        if unsynced && mode == CheckMode::Check {
            return Ok(StripeCheck::default());
        }
        let mode = if unsynced { CheckMode::Resync } else { mode };
        let st = self.state.load_full();
        let members: Vec<Option<Arc<Member>>> = (0..w)
            .map(|i| st.slots[g * w + i].readable(base + chunk).cloned())
            .collect();
        if members.iter().any(|m| m.is_none()) {
            if mode == CheckMode::Resync {
                return Ok(StripeCheck {
                    skipped: true,
                    ..Default::default()
                });
            }
            return Err(Error::Refused(format!(
                "group {g} lost a member during the scrub"
            )));
        }
        let members: Vec<Arc<Member>> = members.into_iter().map(|m| m.expect("checked")).collect();
        let bufs: Vec<SharedBuf> = (0..w)
            .map(|_| AlignedBuf::for_overwrite(chunk as usize).into_shared())
            .collect();
        let futs = members
            .iter()
            .zip(&bufs)
            .map(|(m, b)| self.mread(m, base, b.clone(), IoClass::Background));
        let results = futures::future::join_all(futs).await;
        let mut unreadable = Vec::new();
        for (i, r) in results.into_iter().enumerate() {
            if let Err(e) = r {
                self.note_read_error(&members[i], &e).await;
                unreadable.push(i);
            }
        }
        if mode == CheckMode::Resync
            && matches!(self.geometry.scheme(), Scheme::Parity { .. })
            && (0..self.geometry.k())
                .any(|s| unreadable.contains(&self.geometry.member_of_shard(t, s)))
        {
            // Parity here may not match the data (the reason for the resync): a data chunk
            // that cannot be read cannot be rebuilt from it. The stripe stays held as
            // inconsistent; reads of that chunk fail rather than guess.
            return Ok(StripeCheck {
                skipped: true,
                ..Default::default()
            });
        }
        let mut out = StripeCheck::default();
        let mut rewrite: Vec<(usize, u64, SharedBuf)> = Vec::new(); // (member pos, row offset, data)
                                                                    // Blocks of each member (by position) that redundancy located as wrong.
        let mut blame: std::collections::BTreeMap<usize, u64> = Default::default();
        match self.geometry.scheme() {
            Scheme::Mirror { .. } => {
                let good: Vec<usize> = (0..w).filter(|i| !unreadable.contains(i)).collect();
                if good.is_empty() {
                    return Err(Error::Failed(format!(
                        "no copy of group {g} stripe {t} could be read"
                    )));
                }
                for row in (0..chunk as usize).step_by(4096) {
                    let rows: Vec<&[u8]> = good
                        .iter()
                        .map(|&i| &slice_of(&bufs[i])[row..row + 4096])
                        .collect();
                    let same = rows.iter().all(|r| *r == rows[0]);
                    if same && unreadable.is_empty() {
                        continue;
                    }
                    if !same {
                        out.mismatched_blocks += 1;
                    }
                    // A majority of three or more copies wins, and locates the copies that
                    // differ; otherwise the first copy wins and nobody is blamed (two
                    // copies that differ cannot say which is wrong; md rewrites likewise).
                    // A resync after a crash expects differences: it blames nobody.
                    let majority = (rows.len() >= 3)
                        .then(|| {
                            rows.iter()
                                .find(|r| rows.iter().filter(|x| x == r).count() * 2 > rows.len())
                        })
                        .flatten()
                        .copied();
                    let winner = majority.unwrap_or(rows[0]);
                    let fix = AlignedBuf::from_slice(winner).into_shared();
                    for i in 0..w {
                        let differs = unreadable.contains(&i)
                            || &slice_of(&bufs[i])[row..row + 4096] != winner;
                        if differs {
                            if !unreadable.contains(&i)
                                && majority.is_some()
                                && mode != CheckMode::Resync
                            {
                                *blame.entry(i).or_default() += 1;
                            }
                            if mode != CheckMode::Check || unreadable.contains(&i) {
                                rewrite.push((i, row as u64, fix.clone()));
                            }
                        }
                    }
                }
            }
            Scheme::Parity { k, m } => {
                let codec = self.codec.as_ref().expect("codec").clone();
                let n = k + m;
                let pos = |shard: usize| self.geometry.member_of_shard(t, shard);
                let shard_bufs: Vec<SharedBuf> = (0..n).map(|s| bufs[pos(s)].clone()).collect();
                let lost: Vec<usize> = (0..n).filter(|&s| unreadable.contains(&pos(s))).collect();
                if lost.len() > m {
                    return Err(Error::Failed(format!(
                        "group {g} stripe {t}: {} chunks unreadable",
                        lost.len()
                    )));
                }
                if !lost.is_empty() {
                    // Rebuild unreadable chunks from the rest and rewrite them.
                    let present: Vec<bool> = (0..n).map(|s| !lost.contains(&s)).collect();
                    let mut refs: Vec<&mut [u8]> = shard_bufs.iter().map(slice_mut).collect();
                    codec
                        .reconstruct(&mut refs, &present)
                        .map_err(|e| Error::Failed(e.to_string()))?;
                    for &s in &lost {
                        rewrite.push((pos(s), 0, shard_bufs[s].clone()));
                    }
                }
                // Fast path: recompute parity for the whole chunk and compare.
                let fresh: Vec<SharedBuf> = (0..m)
                    .map(|_| AlignedBuf::for_overwrite(chunk as usize).into_shared())
                    .collect();
                {
                    let data: Vec<&[u8]> = (0..k).map(|s| slice_of(&shard_bufs[s])).collect();
                    let mut p: Vec<&mut [u8]> = fresh.iter().map(slice_mut).collect();
                    codec
                        .encode(&data, &mut p)
                        .map_err(|e| Error::Invalid(e.to_string()))?;
                }
                let clean = (0..m).all(|r| slice_of(&fresh[r]) == slice_of(&shard_bufs[k + r]));
                if !clean {
                    for row in (0..chunk as usize).step_by(4096) {
                        let row_clean = (0..m).all(|r| {
                            slice_of(&fresh[r])[row..row + 4096]
                                == slice_of(&shard_bufs[k + r])[row..row + 4096]
                        });
                        if row_clean {
                            continue;
                        }
                        out.mismatched_blocks += 1;
                        let rows: Vec<&[u8]> = (0..n)
                            .map(|s| &slice_of(&shard_bufs[s])[row..row + 4096])
                            .collect();
                        let verdict = if mode == CheckMode::Resync {
                            sbod_codec::Verdict::Unlocatable
                        } else {
                            codec
                                .locate(&rows)
                                .map_err(|e| Error::Invalid(e.to_string()))?
                        };
                        match verdict {
                            sbod_codec::Verdict::Clean => {}
                            sbod_codec::Verdict::Corrupt(bad) => {
                                *blame.entry(pos(bad)).or_default() += 1;
                                if mode == CheckMode::Repair {
                                    let mut work: Vec<Vec<u8>> =
                                        rows.iter().map(|r| r.to_vec()).collect();
                                    let present: Vec<bool> = (0..n).map(|s| s != bad).collect();
                                    let mut refs: Vec<&mut [u8]> =
                                        work.iter_mut().map(|v| v.as_mut_slice()).collect();
                                    codec
                                        .reconstruct(&mut refs, &present)
                                        .map_err(|e| Error::Failed(e.to_string()))?;
                                    rewrite.push((
                                        pos(bad),
                                        row as u64,
                                        AlignedBuf::from_slice(&work[bad]).into_shared(),
                                    ));
                                }
                            }
                            sbod_codec::Verdict::Unlocatable => {
                                if mode != CheckMode::Check {
                                    // As md does: data is the truth, parity is rewritten.
                                    for r in 0..m {
                                        let fix = AlignedBuf::from_slice(
                                            &slice_of(&fresh[r])[row..row + 4096],
                                        )
                                        .into_shared();
                                        rewrite.push((pos(k + r), row as u64, fix));
                                    }
                                }
                            }
                        }
                    }
                }
            }
            Scheme::Concat => {}
        }
        let mut full = Vec::new();
        for (i, row, buf) in rewrite {
            let m = &members[i];
            let n = buf.len() as u64 / 4096;
            // Rewrites never grow a member (one that shrank is failed instead).
            match self
                .mwrite_in_place(m, base + row, buf, IoClass::Background)
                .await
            {
                Ok(()) => {
                    m.stats.repaired.fetch_add(n, Ordering::Relaxed);
                    out.repaired_blocks += n;
                }
                Err(e) => {
                    if self.write_failed(m, &e, reason::SCRUB_REPAIR_WRITE).await
                        == WriteFault::NoSpace
                    {
                        full.push(m.clone());
                    }
                }
            }
        }
        if !full.is_empty() {
            return Err(self.nospace_error(&full));
        }
        if unsynced {
            if let Some(bm) = &self.bitmap {
                bm.synced(g, t);
            }
        }
        // A member located as wrong in more blocks than the array tolerates is taken out in
        // a check (which rewrites nothing); a repair has just rewritten its blocks (and a
        // repair it refused has failed it). Never left in service, wrong and unrepaired,
        // past the limit.
        let max = self.settings.lock().max_checksum_errors;
        for (i, n) in blame {
            let m = &members[i];
            let total = m.stats.checksum_errors.fetch_add(n, Ordering::Relaxed) + n;
            if mode == CheckMode::Check && total > max && self.in_service(m) {
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
        let Some(bm) = self.bitmap.as_ref() else {
            return Ok((0, 0));
        };
        let chunk = self.geometry.chunk as u64;
        let h = ProcessHandle::new(ProcessKind::Resync, regions.len() as u64 * bm.region);
        let mut bytes = 0;
        for &r in regions {
            let from = r * bm.region / chunk;
            let to = ((r + 1) * bm.region).min(self.geometry.member_size) / chunk;
            self.scrub_pass(&h, CheckMode::Resync, from, to).await?;
            bytes += (to - from) * chunk;
        }
        self.flush().await?;
        tracing::info!(array = %self.name, regions = regions.len(), bytes, "resynced dirty regions after an unclean shutdown");
        Ok((bytes, regions.len() as u64))
    }

    /// The initial sync of a new array whose members were not known to be zero.
    async fn initial_resync(self: &Arc<Self>) -> Result<()> {
        let chunk = self.geometry.chunk as u64;
        let stripes = self.geometry.stripes();
        let h = self.claim(ProcessKind::Resync, stripes * chunk)?;
        let start = self.resync_offset.load(Ordering::Acquire) / chunk;
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
            self.resync_offset.store(step * chunk, Ordering::Release);
            t = step;
            if last.elapsed() > Duration::from_secs(2) {
                self.checkpoint().await;
                last = Instant::now();
            }
        }
        if result.is_ok() {
            self.flush().await?;
            self.resync_offset.store(u64::MAX, Ordering::Release);
            self.checkpoint().await;
        }
        h.finish(result.as_ref().err().map(|e| e.to_string()));
        result
    }
}

/// A member being rebuilt.
struct Target {
    slot: usize,
    member: Arc<Member>,
    /// Valid below this member offset.
    progress: Arc<AtomicU64>,
    /// Only the regions the write-intent bitmap marks.
    bitmap: bool,
}

/// Every member being rebuilt.
fn rebuild_targets(st: &State) -> Vec<Target> {
    let mut v = Vec::new();
    for (i, s) in st.slots.iter().enumerate() {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_finished_process_keeps_its_duration_and_rate() {
        let h = ProcessHandle::new(ProcessKind::Check, 1000);
        h.done.store(1000, Ordering::Relaxed);
        std::thread::sleep(std::time::Duration::from_millis(5));
        h.finish(None);
        let a = h.status();
        std::thread::sleep(std::time::Duration::from_millis(30));
        let b = h.status();
        assert!(a.finished && b.finished);
        assert_eq!(a.elapsed_secs, b.elapsed_secs);
        assert_eq!(a.rate, b.rate);
        assert!(a.elapsed_secs >= 0.005 && a.eta_secs.is_none(), "{a:?}");
    }
}
