//! What a client's FLUSH and FUA do: the array's sync mode (ZFS's `sync` property, the
//! field's biggest write lever) and, later, the log device that makes them cheap.
//!
//! - `standard`: FLUSH and FUA mean what the NBD spec says (every member flushed, a FUA
//!   write written through).
//! - `always`: every write is treated as FUA, so every acknowledged write survives a power
//!   cut without a FLUSH.
//! - `disabled`: FLUSH and FUA are acknowledged at once, and the members are flushed in the
//!   background every [`DEFAULT_INTERVAL`]: a power cut loses the writes of those last
//!   seconds. Each block then holds an older or a newer value, never other bytes, and
//!   parity stays recoverable: the engine's own flushes (before write-intent bits are
//!   cleared, before a rebuild is recorded, at a clean stop) are never skipped, only the
//!   client's.
//!
//! The mode is persisted on the members (superblock record `TAG_SYNC`) and changed with
//! [`Array::set_sync`]. The engine's entry points call [`SyncState::fua`] on a client
//! write's FUA flag; a client's FLUSH is [`Array::client_flush`]. [`Array::flush`] stays
//! the engine's durable flush of every member, whatever the mode.

use crate::array::Array;
use crate::error::{Error, Result};
use crate::superblock::{LogConfig, OutReason, Superblock};
use sbod_types::{SyncMode, SyncStatus};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

/// How often `disabled` flushes the members in the background (ZFS commits a transaction
/// group every 5 s): the most a power cut loses, plus the flush's own time.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(5);

/// The sync mode of a running array and what it did.
pub struct SyncState {
    mode: AtomicU8,
    interval_ms: AtomicU64,
    client_flushes: AtomicU64,
    skipped_flushes: AtomicU64,
    fua_dropped: AtomicU64,
    fua_added: AtomicU64,
    background_flushes: AtomicU64,
    /// The log devices as the superblocks record them (see `log::attach`).
    pub(crate) log: crate::log::attach::LogSlot,
}

impl Default for SyncState {
    fn default() -> SyncState {
        SyncState {
            mode: AtomicU8::new(code(SyncMode::Standard)),
            interval_ms: AtomicU64::new(DEFAULT_INTERVAL.as_millis() as u64),
            client_flushes: AtomicU64::new(0),
            skipped_flushes: AtomicU64::new(0),
            fua_dropped: AtomicU64::new(0),
            fua_added: AtomicU64::new(0),
            background_flushes: AtomicU64::new(0),
            log: Default::default(),
        }
    }
}

fn code(m: SyncMode) -> u8 {
    SyncMode::ALL.iter().position(|x| *x == m).unwrap_or(0) as u8
}

impl SyncState {
    pub fn mode(&self) -> SyncMode {
        SyncMode::ALL[self.mode.load(Relaxed) as usize]
    }

    pub(crate) fn set_mode(&self, m: SyncMode) {
        self.mode.store(code(m), Relaxed);
    }

    /// The FUA a client write gets in this mode (the hook of every write entry point).
    /// Counts only a change, so entry points that call one another count a write once.
    pub fn fua(&self, fua: bool) -> bool {
        match self.mode() {
            SyncMode::Standard => fua,
            SyncMode::Always => {
                if !fua {
                    self.fua_added.fetch_add(1, Relaxed);
                }
                true
            }
            SyncMode::Disabled => {
                if fua {
                    self.fua_dropped.fetch_add(1, Relaxed);
                }
                false
            }
        }
    }

    pub fn interval(&self) -> Duration {
        Duration::from_millis(self.interval_ms.load(Relaxed).max(1))
    }

    /// What assembly found on the members, and the log devices it was given.
    pub(crate) fn restore(&self, sb: &Superblock, logs: Vec<crate::log::LogDevice>) {
        self.set_mode(sb.sync);
        self.log.restore(&sb.log);
        self.log.set_found(logs);
    }

    /// Close the log devices (a power cut's `abandon`).
    pub(crate) fn close_devices(&self) {
        self.log.close_devices();
    }

    /// The log as a superblock records it.
    pub(crate) fn log_entries(&self) -> LogConfig {
        self.log.config()
    }
}

impl Array {
    /// The array's sync mode.
    pub fn sync_mode(&self) -> SyncMode {
        self.sync.mode()
    }

    /// Change the sync mode and record it on the members. Leaving `disabled`, every write
    /// acknowledged before this call is made durable before it returns (writes from then
    /// on follow the new mode).
    pub async fn set_sync(&self, mode: SyncMode) -> Result<()> {
        self.check_writable()?;
        let old = self.sync.mode();
        if old == mode {
            return Ok(());
        }
        // The new mode first: a crash before it is recorded starts the array in the old
        // one, which is only stronger when going to `disabled`.
        self.sync.set_mode(mode);
        if old == SyncMode::Disabled {
            self.flush().await?;
        }
        let _g = self.mgmt.lock().await;
        let st = self.state.load_full();
        if let Some(why) = &st.failed {
            return Err(Error::Failed(why.clone().into()));
        }
        let lost = self.commit((*st).clone()).await;
        drop(_g);
        for m in lost {
            self.fail_member(&m, OutReason::MetadataWrite).await;
        }
        if mode == SyncMode::Disabled {
            tracing::warn!(array = %self.name, "sync=disabled: {}", self.sync_promise());
        }
        Ok(())
    }

    /// What a power cut costs in the current mode, in words.
    pub fn sync_promise(&self) -> String {
        self.sync.mode().promise(self.sync.interval().as_secs_f64())
    }

    /// A client's FLUSH (NBD_CMD_FLUSH): every member flushed, except with sync=disabled,
    /// where it is acknowledged at once.
    pub async fn client_flush(&self) -> Result<()> {
        self.sync.client_flushes.fetch_add(1, Relaxed);
        // With every write journaled, every acknowledged write is durable in the log: the
        // members are flushed by the log's checkpoints, not for each FLUSH.
        if self.sync.mode() == SyncMode::Disabled || self.sync.log.journaling() {
            if let Some(why) = &self.state.load().failed {
                return Err(Error::Failed(why.clone().into()));
            }
            // The log records that everything acknowledged was durable, so a replay never
            // takes a damaged record of it for a torn append (`Log::seal`).
            if let Some(log) = self.sync.log.current() {
                if self.sync.mode() != SyncMode::Disabled && log.seal().await.is_err() {
                    return self.flush().await;
                }
            }
            self.sync.skipped_flushes.fetch_add(1, Relaxed);
            return Ok(());
        }
        self.flush().await
    }

    /// The interval of the background flushes with sync=disabled (tests use a short one).
    pub fn set_sync_interval(&self, d: Duration) {
        self.sync
            .interval_ms
            .store(d.as_millis().max(1) as u64, Relaxed);
    }

    pub fn sync_status(&self) -> SyncStatus {
        let s = &self.sync;
        SyncStatus {
            mode: s.mode(),
            interval_secs: s.interval().as_secs_f64(),
            client_flushes: s.client_flushes.load(Relaxed),
            flushes_acknowledged_at_once: s.skipped_flushes.load(Relaxed),
            fua_dropped: s.fua_dropped.load(Relaxed),
            fua_added: s.fua_added.load(Relaxed),
            background_flushes: s.background_flushes.load(Relaxed),
        }
    }
}

/// With sync=disabled, flush every member every interval (whether or not anything was
/// written: a flush with nothing to write is cheap, and no write can slip between two
/// looks). Ends when the array closes. Started with the array's background processes.
pub(crate) fn spawn_flusher(a: &Arc<Array>) -> tokio::task::JoinHandle<()> {
    let a = a.clone();
    tokio::spawn(async move {
        let mut due = tokio::time::Instant::now() + a.sync.interval();
        loop {
            // Made before `closing` is read, so a close's kick is not missed.
            let kicked = a.bg.wake.notified();
            if a.closing.load(std::sync::atomic::Ordering::Acquire) {
                return;
            }
            tokio::select! {
                _ = tokio::time::sleep_until(due) => {}
                _ = kicked => continue,
            }
            due = tokio::time::Instant::now() + a.sync.interval();
            if a.sync.mode() != SyncMode::Disabled || a.is_read_only() {
                continue;
            }
            match a.flush().await {
                Ok(()) => {
                    a.sync.background_flushes.fetch_add(1, Relaxed);
                }
                Err(e) => tracing::debug!(array = %a.name, error = %e, "background flush"),
            }
        }
    })
}
