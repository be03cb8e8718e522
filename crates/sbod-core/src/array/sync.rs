//! The array's side of its sync mode (see `crate::sync`): changing it, a client's FLUSH,
//! what status shows, and the background flusher of `disabled`.

use super::Array;
use crate::error::{Error, Result};
use crate::superblock::OutReason;
use sbod_types::{SyncMode, SyncStatus};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

impl Array {
    /// The array's sync mode.
    pub fn sync_mode(&self) -> SyncMode {
        self.sync.mode()
    }

    /// Change the sync mode and record it on the members. Leaving `disabled`, every write
    /// acknowledged before this call is made durable before it returns (writes from then
    /// on follow the new mode).
    pub async fn set_sync(&self, mode: SyncMode) -> Result<()> {
        self.dp().check_writable()?;
        let old = self.sync.mode();
        if old == mode {
            return Ok(());
        }
        // The new mode first: a crash before it is recorded starts the array in the old
        // one, which is only stronger when going to `disabled`.
        self.sync.set_mode(mode);
        if old == SyncMode::Disabled {
            self.dp().flush().await?;
        }
        let _g = self.mgmt.lock().await;
        let st = self.dp().state.load_full();
        if let Some(why) = &st.failed {
            return Err(Error::Failed(why.clone().into()));
        }
        let lost = self.commit((*st).clone()).await;
        drop(_g);
        for m in lost {
            self.fail_member(&m, OutReason::MetadataWrite).await;
        }
        if mode == SyncMode::Disabled {
            tracing::warn!(array = %self.dp().name, "sync=disabled: {}", self.sync_promise());
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
            if let Some(why) = &self.dp().state.load().failed {
                return Err(Error::Failed(why.clone().into()));
            }
            // The log records that everything acknowledged was durable, so a replay never
            // takes a damaged record of it for a torn append (`Log::seal`).
            if let Some(log) = self.sync.log.current() {
                if self.sync.mode() != SyncMode::Disabled && log.seal().await.is_err() {
                    return self.dp().flush().await;
                }
            }
            self.sync.skipped_flushes.fetch_add(1, Relaxed);
            return Ok(());
        }
        self.dp().flush().await
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
            if a.dp().closing.load(std::sync::atomic::Ordering::Acquire) {
                return;
            }
            tokio::select! {
                _ = tokio::time::sleep_until(due) => {}
                _ = kicked => continue,
            }
            due = tokio::time::Instant::now() + a.sync.interval();
            if a.sync.mode() != SyncMode::Disabled || a.dp().is_read_only() {
                continue;
            }
            match a.dp().flush().await {
                Ok(()) => {
                    a.sync.background_flushes.fetch_add(1, Relaxed);
                }
                Err(e) => tracing::debug!(array = %a.dp().name, error = %e, "background flush"),
            }
        }
    })
}
