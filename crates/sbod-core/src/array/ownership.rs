//! This head's hold on its members (see [`crate::owner`]): claimed at create and assemble
//! before anything else is written, kept by the heartbeat task, checked by the data path's
//! lease before every member write, and released by a clean stop.

use super::Array;
use crate::dev::BlockDev;
use crate::error::Result;
use crate::owner::{self, Block, Config, Lease};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use uuid::Uuid;

/// Heartbeats under way at once, at most (see [`Array::hold`]).
const MAX_BEATS: usize = 12;
/// How long a client write waits for a lapsed lease to be renewed, in leases (see
/// [`Array::hold_lease`]).
const SUSPEND_LEASES: u32 = 4;
/// Slow beats are spread so that about this many are under way at once.
const SPREAD: u32 = 4;

/// The heartbeat's state.
#[derive(Default)]
pub(crate) struct Ownership {
    /// Set once the members are held (never for an array only looked at).
    cfg: parking_lot::Mutex<Option<Config>>,
    session: parking_lot::Mutex<Uuid>,
    seq: AtomicU64,
    /// Beats overlap (each takes it shared); a probe of joining members and the release
    /// at a clean stop take it alone (they write the owner blocks too).
    beat: tokio::sync::RwLock<()>,
    /// Test hook: the heartbeat task skips its beats (a paused or cut-off head).
    paused: AtomicBool,
    /// The members (by device) whose owner block has said this session: from then on,
    /// any other head's block there, released or not, means another head ran on them.
    stamped: Stamped,
    task: parking_lot::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

/// Devices by identity. Weak references: a device dropped (a member removed) cannot
/// have its address taken by a new one while it is listed, so a joining member is never
/// mistaken for one that said this session.
#[derive(Default)]
struct Stamped(parking_lot::Mutex<Vec<std::sync::Weak<dyn BlockDev>>>);

impl Stamped {
    fn contains(&self, d: &Arc<dyn BlockDev>) -> bool {
        self.0
            .lock()
            .iter()
            .any(|w| std::ptr::addr_eq(w.as_ptr(), Arc::as_ptr(d)))
    }

    fn insert(&self, d: &Arc<dyn BlockDev>) {
        let mut v = self.0.lock();
        v.retain(|w| w.strong_count() > 0);
        if !v
            .iter()
            .any(|w| std::ptr::addr_eq(w.as_ptr(), Arc::as_ptr(d)))
        {
            v.push(Arc::downgrade(d));
        }
    }
}

/// Members claimed for a new session before the array is built.
pub(crate) struct Claim {
    pub cfg: Config,
    pub session: Uuid,
    devs: Vec<(String, Arc<dyn BlockDev>)>,
}

impl Claim {
    /// Claim `devs` for array `array` (see [`owner::acquire`]).
    pub async fn take(
        devs: Vec<(String, Arc<dyn BlockDev>)>,
        array: Uuid,
        name: &str,
        cfg: Config,
        force: bool,
    ) -> Result<Claim> {
        let session = Uuid::new_v4();
        let me = owner::Me {
            array,
            array_name: name,
            cfg: &cfg,
            session,
        };
        owner::acquire(&devs, &me, force).await?;
        Ok(Claim { cfg, session, devs })
    }

    /// The start failed after the claim: give the members back.
    pub async fn release(&self) {
        release(&self.devs, self.session).await;
    }
}

/// Mark released the owner blocks of `devs` that `session` still holds.
async fn release(devs: &[(String, Arc<dyn BlockDev>)], session: Uuid) {
    let futs = devs.iter().map(|(_, d)| async move {
        if let Ok(Some(b)) = owner::read_block(d).await {
            if b.session == session && !b.released {
                let b = Block {
                    released: true,
                    stamp_ms: owner::unix_ms(),
                    ..b
                };
                let _ = owner::write_block(d, &b).await;
            }
        }
    });
    futures::future::join_all(futs).await;
}

impl Array {
    /// Hold the members as claimed: the lease starts now, the heartbeat keeps it.
    pub(crate) fn hold(self: &Arc<Self>, claim: &Claim) {
        let cfg = claim.cfg.clone();
        *self.ownership.cfg.lock() = Some(cfg.clone());
        *self.ownership.session.lock() = claim.session;
        // The claim wrote this session's block on every member it took.
        for (_, d) in &claim.devs {
            self.ownership.stamped.insert(d);
        }
        self.dp().lease.renew(Lease::now(), cfg.lease());
        let weak = Arc::downgrade(self);
        // Beats start on a cadence, not an interval after the last one ended, and overlap:
        // a beat whose owner-block I/O waits behind a deep member queue (a drive serving
        // the nearest commands first) still renews the lease from when it began. The lease
        // holds as long as a beat begins at most (lease - beat time) after the one before
        // it, so slow beats are spread evenly over their duration (a quarter of it apart,
        // about `SPREAD` under way), not started in a burst of one per interval: a burst
        // followed by a wait for a free slot leaves a gap of a whole beat between starts,
        // and with beats over half the lease, that gap lapses it. The duration is judged
        // by the last beat that ended and by the oldest still under way (the first slow
        // beats are spread before any has ended). At most `MAX_BEATS` at once; aborting
        // the task (a stop) aborts them all.
        let task = tokio::spawn(async move {
            use std::collections::HashMap;
            use tokio::time::Instant;
            let mut beats = tokio::task::JoinSet::new();
            let mut started: HashMap<tokio::task::Id, Instant> = HashMap::new();
            let mut last = std::time::Duration::ZERO;
            let mut last_start: Option<Instant> = None;
            let mut tick = tokio::time::interval_at(Instant::now() + cfg.interval, cfg.interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    Some(r) = beats.join_next_with_id(), if !beats.is_empty() => {
                        let id = match &r { Ok((id, ())) => *id, Err(e) => e.id() };
                        if let Some(s) = started.remove(&id) {
                            last = s.elapsed();
                        }
                        continue;
                    }
                }
                let Some(a) = weak.upgrade() else { return };
                if a.dp().lease.fenced_by().is_some() {
                    return;
                }
                if a.ownership.paused.load(Ordering::Acquire) || beats.len() >= MAX_BEATS {
                    continue;
                }
                let now = Instant::now();
                let oldest = started.values().map(|s| now - *s).max().unwrap_or_default();
                let spacing = cfg.interval.max(last.max(oldest) / SPREAD);
                if last_start.is_some_and(|s| now - s + cfg.interval / 4 < spacing) {
                    continue;
                }
                last_start = Some(now);
                let h = beats.spawn(async move {
                    a.beat().await;
                });
                started.insert(h.id(), now);
            }
        });
        if let Some(old) = self.ownership.task.lock().replace(task) {
            old.abort();
        }
    }

    /// One heartbeat: read every member's owner block back; another owner there fences
    /// this head for good; otherwise write the next heartbeat, and renew the lease from
    /// the time the beat began. Returns whether the lease was renewed.
    pub(crate) async fn beat(&self) -> bool {
        let Some(cfg) = self.ownership.cfg.lock().clone() else {
            return false;
        };
        let _g = self.ownership.beat.read().await;
        if self.dp().lease.fenced_by().is_some() {
            return false;
        }
        let began = Lease::now();
        let session = *self.ownership.session.lock();
        let seq = self.ownership.seq.fetch_add(1, Ordering::AcqRel) + 1;
        let members = self.dp().state.load_full().live_members();
        // A member that does not answer within the patience is left out of this beat (the
        // data path judges it by its own I/O): one hung member must not stop every write
        // by letting the lease lapse. Any other member shows a takeover. The patience
        // leaves the renewal two intervals of the lease (at least half of it), so that
        // beats slowed by a deep member queue (they overlap) still keep it.
        let patience = (cfg.lease() / 2).max(cfg.lease().saturating_sub(2 * cfg.interval));
        let futs = members.iter().map(|m| {
            let cfg = &cfg;
            let one = async move {
                let b = owner::read_block(&m.dev).await.map_err(|_| None)?;
                let stamped = self.ownership.stamped.contains(&m.dev);
                let nonce = match &b {
                    Some(b) if b.session == session => b.member_nonce,
                    // Another host holds it: the members were taken over.
                    Some(b) if b.host != cfg.host && !b.released => return Err(Some(b.clone())),
                    // Another head's released block on a member that has said this
                    // session: it ran on the members meanwhile (a takeover while this
                    // head was paused or cut off, then a clean stop), and this head's
                    // state (superblock event, bitmap, tags) is stale. (A nil session
                    // is another head's identity probe, put back when it ends: it
                    // writes no data. Another sbod of this host claiming the members
                    // unreleased is written over, as before: its claim sees its block
                    // change and refuses.)
                    Some(b) if stamped && !b.session.is_nil() && b.released => {
                        return Err(Some(b.clone()))
                    }
                    // Zeroed (a member that just joined), released, or this host's own
                    // earlier start (a member back after being away): ours now.
                    _ => Uuid::new_v4(),
                };
                let mine = Block {
                    array: self.uuid,
                    host: cfg.host,
                    host_name: cfg.host_name.clone(),
                    session,
                    member_nonce: nonce,
                    seq,
                    stamp_ms: owner::unix_ms(),
                    interval_ms: cfg.interval.as_millis().min(u32::MAX as u128) as u32,
                    lease_multiple: cfg.lease_multiple,
                    released: false,
                };
                owner::write_block(&m.dev, &mine).await.map_err(|_| None)?;
                self.ownership.stamped.insert(&m.dev);
                Ok(())
            };
            async move {
                tokio::time::timeout(patience, one)
                    .await
                    .unwrap_or(Err(None))
            }
        });
        let mut written = 0;
        let mut taken: Option<Block> = None;
        for r in futures::future::join_all(futs).await {
            match r {
                Ok(()) => written += 1,
                Err(Some(b)) => taken = Some(b),
                // A member that cannot be read or written: the data path judges it.
                Err(None) => {}
            }
        }
        if let Some(b) = taken {
            let by = format!("members taken over by {} (host id {})", b.host_name, b.host);
            if self.dp().lease.fence(by.clone()) {
                tracing::error!(array = %self.dp().name, "fenced: {by}: this head writes nothing more");
            }
            return false;
        }
        if written > 0 || members.is_empty() {
            self.dp().lease.renew(began, cfg.lease());
            return true;
        }
        false
    }

    /// Before a client write: the lease holds, or a heartbeat renews it now (a head that
    /// was paused past its lease re-reads its owner blocks before writing again). Where
    /// that beat cannot reach the members either (a link down for a few seconds: a
    /// remote member's requests are kept and sent again for its `give_up`, 20 s by
    /// default), the write waits for the heartbeat to renew the lease, as MMP suspends a
    /// pool, for up to `SUSPEND_LEASES` leases; then, or once fenced, it is refused.
    /// Nothing is written while it waits, so waiting is always safe; the heartbeat
    /// task's beats, not each waiting write's, renew the lease.
    pub(crate) async fn hold_lease(&self) -> Result<()> {
        if self.dp().lease.ok() {
            return Ok(());
        }
        let Some(cfg) = self.ownership.cfg.lock().clone() else {
            return Err(self.dp().lease.error(&self.dp().name));
        };
        if self.dp().lease.fenced_by().is_none() {
            self.beat().await;
        }
        let until = tokio::time::Instant::now() + cfg.lease() * SUSPEND_LEASES;
        while !self.dp().lease.ok()
            && self.dp().lease.fenced_by().is_none()
            && !self.closed.load(Ordering::Acquire)
            && tokio::time::Instant::now() < until
        {
            tokio::time::sleep(cfg.interval / 2).await;
        }
        if self.dp().lease.ok() {
            return Ok(());
        }
        Err(self.dp().lease.error(&self.dp().name))
    }

    /// Stop the heartbeat (a power cut: the blocks stay as they are).
    pub(crate) fn stop_heartbeat(&self) {
        if let Some(t) = self.ownership.task.lock().take() {
            t.abort();
        }
    }

    /// A clean stop: stop the heartbeat and mark the blocks this head holds released, so
    /// another host starts the array without waiting out the lease.
    pub(crate) async fn release_members(&self) {
        self.stop_heartbeat();
        if self.ownership.cfg.lock().is_none() || self.dp().lease.fenced_by().is_some() {
            return;
        }
        let _g = self.ownership.beat.write().await;
        let session = *self.ownership.session.lock();
        release(&self.live_devs(), session).await;
    }

    /// Test hook: pause (or resume) the heartbeat task, as a head stopped by SIGSTOP or
    /// cut off from its members would be. Writes still re-check ownership first.
    #[doc(hidden)]
    pub fn pause_heartbeat(&self, paused: bool) {
        self.ownership.paused.store(paused, Ordering::Release);
    }

    /// The members in service, by path: what the owner blocks are written to.
    fn live_devs(&self) -> Vec<(String, Arc<dyn BlockDev>)> {
        self.dp()
            .state
            .load_full()
            .live_members()
            .iter()
            .map(|m| (m.path.clone(), m.dev.clone()))
            .collect()
    }

    /// The host this head holds the members as, once it holds them.
    pub fn owner_config(&self) -> Option<Config> {
        self.ownership.cfg.lock().clone()
    }

    /// A member joining (added, replacing, a spare): not one already in the array under
    /// another name. The heartbeat waits meanwhile (the probe writes the owner blocks).
    pub(crate) async fn probe_joining(&self, path: &str, dev: &Arc<dyn BlockDev>) -> Result<()> {
        let _g = self.ownership.beat.write().await;
        let mut devs = self.live_devs();
        devs.push((path.to_string(), dev.clone()));
        owner::probe_identity(&devs).await
    }
}

impl Array {
    /// A joining member is not one of the array's under another local name (device
    /// numbers; writes nothing).
    pub(crate) async fn check_joining(&self, spec: &super::MemberSpec) -> Result<()> {
        let st = self.dp().state.load_full();
        let mut paths: Vec<String> = st.live_members().iter().map(|m| m.path.clone()).collect();
        paths.push(spec.path.clone());
        owner::check_local(paths.iter().map(|p| p.as_str()))
    }
}
