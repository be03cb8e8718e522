//! The background-task owner: the process slot (one rebuild, scrub or resync at a time,
//! with progress), the supervisor that starts rebuilds and the initial resync, the watch
//! (shrunk members, stripes waiting for space), and the write-intent bitmap's sweeper.
//! The loops are generic: what a stripe needs is asked of the RAID family
//! ([`crate::family::Family::recover`], [`crate::family::Family::judge`]), and every
//! process works stripe by stripe under the same locks and through the same member queues
//! as client I/O, so it runs online (SPDK's raid "process").

mod rebuild;
use rebuild::rebuild_targets;
pub(crate) mod reshape;
mod scrub;
mod spare;
mod verify;

use crate::array::{Array, State};
use crate::error::{Error, Result};
use crate::superblock::OutReason;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use sbod_types::{MismatchRegion, ProcessKind, ProcessStatus};

/// The array's background processes and tasks.
#[derive(Default)]
pub(crate) struct Background {
    /// The running (or last) process.
    pub process: parking_lot::Mutex<Option<Arc<ProcessHandle>>>,
    /// Wakes the supervisor, the sweeper and the watch.
    pub wake: tokio::sync::Notify,
    pub tasks: parking_lot::Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

pub struct ProcessHandle {
    pub kind: ProcessKind,
    pub total: AtomicU64,
    pub done: AtomicU64,
    pub mismatches: AtomicU64,
    pub repaired: AtomicU64,
    /// Tags found damaged over right data and rewritten.
    pub tags_repaired: AtomicU64,
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
            tags_repaired: AtomicU64::new(0),
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
            tags_repaired: self.tags_repaired.load(Ordering::Relaxed),
            finished,
            cancelled: self.cancelled(),
            error: self.error.lock().clone(),
            regions: self.regions.lock().clone(),
        }
    }
}

/// A process's slot, held by whatever runs it. Whoever waits for a process (`rebuild_now`,
/// `sbod replace --wait`, the next process to claim the slot) waits for its end, so the
/// end must come however the runner stops: dropped (the array closes, a caller gives up)
/// or panicking (a bug), the claim ends the process with an error that says so, instead
/// of leaving every waiter waiting forever.
pub(crate) struct Claim(Arc<ProcessHandle>);

impl Claim {
    /// The handle, for status and for the caller that started the process.
    pub(crate) fn handle(&self) -> Arc<ProcessHandle> {
        self.0.clone()
    }
}

impl std::ops::Deref for Claim {
    type Target = ProcessHandle;
    fn deref(&self) -> &ProcessHandle {
        &self.0
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        if !self.0.is_finished() {
            self.0.finish(Some(if std::thread::panicking() {
                "the process stopped in a panic (a bug in sbod: its log says where); \
                 a rebuild, resync or reshape goes on from its last record at the next start"
                    .into()
            } else {
                "the process stopped before its end (the array closed or its caller \
                 went away); a rebuild, resync or reshape goes on from its last record \
                 at the next start"
                    .into()
            }));
        }
    }
}

/// Keeps a background process to its rate: `min_rate` while clients are busy, `max_rate`
/// otherwise (0 = unlimited).
pub(crate) struct Throttle {
    window: Instant,
    bytes: u64,
    fg_last: u64,
    rate: u64,
}

impl Throttle {
    pub(crate) fn new() -> Throttle {
        Throttle {
            window: Instant::now(),
            bytes: 0,
            fg_last: 0,
            rate: 0,
        }
    }

    pub(crate) async fn pace(&mut self, array: &Array, bytes: u64) {
        let st = array.dp().state.load();
        let fg: u64 = st
            .live_members()
            .iter()
            .map(|m| m.stats.fg_ops.load(Ordering::Relaxed))
            .sum();
        self.pace_by(array, bytes, fg).await
    }

    /// As `pace`, with `fg` the count whose change says clients are busy (the reshape's
    /// own member writes are foreground ones: it counts client requests at the gate).
    pub(crate) async fn pace_by(&mut self, array: &Array, bytes: u64, fg: u64) {
        let busy = fg != self.fg_last;
        self.fg_last = fg;
        let s = array.dp().settings.lock().clone();
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
pub(crate) const PIPELINE: u64 = 8;

impl Array {
    pub(crate) fn last_process(&self) -> Option<ProcessStatus> {
        let p = self.bg.process.lock().clone()?;
        p.is_finished().then(|| p.status())
    }

    /// The running (or last) background process.
    pub fn current_process(&self) -> Option<Arc<ProcessHandle>> {
        self.bg.process.lock().clone()
    }

    pub(crate) fn cancel_process_on_failure(&self) {
        if let Some(p) = self.bg.process.lock().as_ref() {
            if matches!(p.kind, ProcessKind::Check | ProcessKind::Repair) && !p.is_finished() {
                p.cancel();
            }
        }
    }

    /// Claim the process slot, or say what is running. The claim ends the process when it
    /// is dropped, whatever way its task stops (see [`Claim`]).
    fn claim(&self, kind: ProcessKind, total: u64) -> Result<Claim> {
        let mut slot = self.bg.process.lock();
        if let Some(p) = slot.as_ref() {
            if !p.is_finished() {
                return Err(Error::Busy(
                    format!(
                        "a {:?} is running on '{}' ({:.1}% done); try again when it finishes",
                        p.kind,
                        self.dp().name,
                        p.status().percent
                    )
                    .to_lowercase()
                    .into(),
                ));
            }
        }
        let h = ProcessHandle::new(kind, total);
        *slot = Some(h.clone());
        Ok(Claim(h))
    }

    pub(crate) fn start_processes(self: &Arc<Self>) {
        let a = self.clone();
        let sup = tokio::spawn(async move { a.supervise().await });
        let a = self.clone();
        let sweep = tokio::spawn(async move { a.sweep_loop().await });
        let a = self.clone();
        let watch = tokio::spawn(async move { a.watch_loop().await });
        let flusher = super::sync::spawn_flusher(self);
        self.bg.tasks.lock().extend([sup, sweep, watch, flusher]);
    }

    /// Every second: fail members that shrank (a truncated member file is caught here even
    /// where no I/O touches the part cut off), and resync the stripes writes left
    /// inconsistent for want of space, once writes succeed again.
    async fn watch_loop(self: Arc<Self>) {
        loop {
            // Made before `closing` is read, so a close's kick during a round is not missed.
            let kicked = self.bg.wake.notified();
            if self.dp().closing.load(Ordering::Acquire) {
                return;
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                _ = kicked => {}
            }
            if self.dp().closing.load(Ordering::Acquire) {
                return;
            }
            self.check_sizes().await;
            if let Err(e) = self.resync_unsynced().await {
                tracing::debug!(array = %self.dp().name, error = %e, "inconsistent stripes wait");
            }
        }
    }

    /// Fail every member in service that is now smaller than the data the array keeps on
    /// it. Returns how many were failed.
    pub async fn check_sizes(&self) -> usize {
        let mut n = 0;
        for m in self.dp().state.load_full().live_members() {
            if let Some(s) = self.dp().shrunk(&m) {
                self.fail_member(&m, s.why()).await;
                n += 1;
            }
        }
        n
    }

    /// Runs rebuilds and the initial resync whenever there is work.
    async fn supervise(self: Arc<Self>) {
        loop {
            if self.dp().closing.load(Ordering::Acquire) {
                return;
            }
            let notified = self.bg.wake.notified();
            let st = self.dp().state.load_full();
            if st.failed.is_none() && self.reshaping().is_some() {
                // The reshape first: a rebuild (onto a spare that took a slot meanwhile)
                // and the initial sync run in one layout, after it.
                if let Err(e) = self.run_reshape().await {
                    tracing::error!(array = %self.dp().name, error = %e, "reshape stopped");
                    let _ = tokio::time::timeout(Duration::from_secs(1), notified).await;
                }
                continue;
            }
            if self.spare_work(&st).is_some() {
                // The distributed spare space first: a declustered array's failed member
                // is rebuilt into it (back to full redundancy), or copied back out of it.
                let running = self.bg.process.lock().clone();
                if let Some(p) = running.filter(|p| !p.is_finished()) {
                    if p.kind != ProcessKind::Rebuild {
                        p.cancel();
                    }
                    p.wait().await;
                }
                if let Err(e) = self.spare_transition().await {
                    // A full file system is waited out (it resumes every second), not an
                    // error of the array.
                    match &e {
                        Error::NoSpace(_) => {
                            tracing::warn!(array = %self.dp().name, error = %e, "distributed spare transition waits for space")
                        }
                        _ => {
                            tracing::error!(array = %self.dp().name, error = %e, "distributed spare transition stopped")
                        }
                    }
                    let _ = tokio::time::timeout(Duration::from_secs(1), notified).await;
                }
                continue;
            }
            if st.failed.is_none() && !rebuild_targets(&st, &self.dp().map.spared()).is_empty() {
                // A scrub gives way to a rebuild (one run in the foreground is waited for).
                let running = self.bg.process.lock().clone();
                if let Some(p) = running.filter(|p| !p.is_finished()) {
                    if p.kind != ProcessKind::Rebuild {
                        p.cancel();
                    }
                    p.wait().await;
                }
                if let Err(e) = self.rebuild().await {
                    match &e {
                        Error::NoSpace(_) => {
                            tracing::warn!(array = %self.dp().name, error = %e, "rebuild waits for space")
                        }
                        _ => {
                            tracing::error!(array = %self.dp().name, error = %e, "rebuild stopped")
                        }
                    }
                    // Try again in a while, or at once when woken (a close, a new member).
                    let _ = tokio::time::timeout(Duration::from_secs(1), notified).await;
                }
                continue;
            }
            if st.failed.is_none()
                && self.dp().resync_offset.load(Ordering::Acquire) != u64::MAX
                && self.whole(&st)
            {
                if let Err(e) = self.initial_resync().await {
                    tracing::warn!(array = %self.dp().name, error = %e, "resync paused");
                    let _ = tokio::time::timeout(Duration::from_secs(1), notified).await;
                }
                continue;
            }
            let _ = tokio::time::timeout(Duration::from_secs(5), notified).await;
        }
    }

    /// Clear bitmap bits of regions idle since the last sweep, after a flush.
    async fn sweep_loop(self: Arc<Self>) {
        let Some(bm) = self.shared.bitmap.as_ref() else {
            return;
        };
        loop {
            // Created before looking at `closing`, so a close's kick is never missed (a
            // sweeper first polled after the close used to sleep its full second).
            let notified = self.bg.wake.notified();
            if self.dp().closing.load(Ordering::Acquire) {
                return;
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(1000)) => {}
                _ = notified => {}
            }
            if self.dp().closing.load(Ordering::Acquire) {
                return;
            }
            let cand = bm.idle_candidates();
            if cand.is_empty() || !self.may_clear_bits().await || self.dp().flush().await.is_err() {
                continue;
            }
            self.dp().clear_idle(&cand).await;
        }
    }

    /// Bits are the record of what a member that is out missed: none is cleared while any
    /// slot is out. And before the first clear since the event last moved, the superblocks
    /// move `bitmap_since` to a new event, so a member that stopped before it (a copy put
    /// back, a member taken out) can never be recovered from bits already gone.
    async fn may_clear_bits(&self) -> bool {
        let whole = |st: &State| self.whole(st);
        if !whole(&self.dp().state.load_full()) {
            return false;
        }
        let _g = self.mgmt.lock().await;
        let st = self.dp().state.load_full();
        if !whole(&st) || st.failed.is_some() {
            return false;
        }
        let event = self.event.load(Ordering::Acquire);
        if self.lineage.bitmap_since.load(Ordering::Acquire) >= event {
            return true;
        }
        let before = self.lineage.bitmap_since.load(Ordering::Acquire);
        self.lineage
            .bitmap_since
            .store(event + 1, Ordering::Release);
        let lost = self.persist(&st, false).await;
        if lost.is_empty() {
            return true;
        }
        // A member missed the move (a host that went away, a disk pulled): it stays at
        // `event`, below the new `bitmap_since`, and would come back in full though no bit
        // has been cleared since it left. Nothing is cleared now (it is going out), so the
        // bitmap still covers everything since `before`: say so again in the superblock
        // that records its failure, and it comes back from the bitmap.
        self.lineage.bitmap_since.store(before, Ordering::Release);
        drop(_g);
        for m in lost {
            self.fail_member(&m, OutReason::MetadataWrite).await;
        }
        false
    }

    /// Persist rebuild (and initial resync) progress. What the rebuild wrote below the
    /// recorded offsets is made durable first: a superblock must never say a member is
    /// valid where its data could still be lost to a power cut.
    async fn checkpoint(&self) {
        if self.dp().flush().await.is_err() {
            return;
        }
        let _g = self.mgmt.lock().await;
        let st = self.dp().state.load_full();
        let lost = self.persist(&st, false).await;
        drop(_g);
        for m in lost {
            self.fail_member(&m, OutReason::MetadataWrite).await;
        }
    }
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

    /// A runner that panics or is dropped still ends its process: whoever waits for it
    /// is woken, and the status says why it ended.
    #[tokio::test]
    async fn a_process_whose_runner_panics_or_is_dropped_ends() {
        let claim = Claim(ProcessHandle::new(ProcessKind::Rebuild, 10));
        let h = claim.handle();
        let runner = tokio::spawn(async move {
            let _claim = claim;
            tokio::task::yield_now().await;
            panic!("a bug in the walk");
        });
        tokio::time::timeout(std::time::Duration::from_secs(10), h.wait())
            .await
            .expect("a panicking runner wakes the waiters");
        assert!(runner.await.unwrap_err().is_panic());
        let st = h.status();
        assert!(st.finished, "{st:?}");
        assert!(st.error.as_deref().unwrap().contains("panic"), "{st:?}");

        let claim = Claim(ProcessHandle::new(ProcessKind::Check, 10));
        let h = claim.handle();
        let runner = tokio::spawn(async move {
            let _claim = claim;
            std::future::pending::<()>().await;
        });
        tokio::task::yield_now().await;
        runner.abort();
        tokio::time::timeout(std::time::Duration::from_secs(10), h.wait())
            .await
            .expect("an aborted runner wakes the waiters");
        let st = h.status();
        assert!(
            st.error.as_deref().unwrap().contains("before its end"),
            "{st:?}"
        );

        // A process that ended on its own keeps its own outcome.
        let claim = Claim(ProcessHandle::new(ProcessKind::Check, 10));
        claim.finish(None);
        let h = claim.handle();
        drop(claim);
        assert_eq!(h.status().error, None);
    }
}
