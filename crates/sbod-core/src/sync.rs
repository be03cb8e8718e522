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
//! `Array::set_sync`. The engine's entry points call [`SyncState::fua`] on a client
//! write's FUA flag; a client's FLUSH is `Array::client_flush`, and `Array::flush` stays
//! the engine's durable flush of every member, whatever the mode (`array/sync.rs`: the
//! array's side, and the background flusher).

use crate::superblock::{LogConfig, Superblock};
use sbod_types::SyncMode;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering::Relaxed};
use std::time::Duration;

/// How often `disabled` flushes the members in the background (ZFS commits a transaction
/// group every 5 s): the most a power cut loses, plus the flush's own time.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(5);

/// The sync mode of a running array and what it did.
pub struct SyncState {
    mode: AtomicU8,
    pub(crate) interval_ms: AtomicU64,
    pub(crate) client_flushes: AtomicU64,
    pub(crate) skipped_flushes: AtomicU64,
    pub(crate) fua_dropped: AtomicU64,
    pub(crate) fua_added: AtomicU64,
    pub(crate) background_flushes: AtomicU64,
    /// The log devices as the superblocks record them (see `log::slot`).
    pub(crate) log: crate::log::slot::LogSlot,
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
