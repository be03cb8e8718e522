//! The array's log as the superblocks record it and as it runs ([`LogSlot`], kept in the
//! array's sync state), and what assembly needs before there is an array: which devices
//! given to it are log devices ([`split`]) and what the write-hole refusal adds
//! ([`write_hole_hint`]). The array's side (adding, mirroring, removing, replaying at
//! assembly, status) is `array/log.rs`.

use super::{read_super, Log, LogDevice};
use crate::error::Step;
use crate::member::MemberSpec;
use crate::superblock::{LogConfig, Superblock};
use arc_swap::ArcSwapOption;
use parking_lot::Mutex;
use sbod_types::LogReplayIssue;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

/// Does the engine send every write through the log? Yes: while an array has a log, the
/// member I/O layer (`DataPath::write_each`, `DataPath::zero_slots`) appends each stripe
/// write's record before writing in place, and the superblocks say so
/// (`LogConfig::journal`), so assembly trusts a replayed log to have closed the write hole.
/// (A log attached by an sbod that did not journal records `journal: false`; it journals
/// from its next start on.)
pub const JOURNALING: bool = true;

/// What the write-hole refusal adds: a log would have avoided it (once the engine
/// journals through it).
pub(crate) fn write_hole_hint(sb: &Superblock) -> (&'static str, Option<Step>) {
    match (JOURNALING, sb.log.devices.iter().any(|e| e.active)) {
        (true, false) => ("", Some(Step::AddLog)),
        (true, true) => (
            "; its log did not journal the writes of that session (it was attached by an sbod that did not journal)",
            None,
        ),
        (false, _) => ("", None),
    }
}

/// The array's log, as recorded and as running.
#[derive(Default)]
pub struct LogSlot {
    pub(crate) cfg: Mutex<LogConfig>,
    /// Log devices found at assembly or added since (any state).
    pub(crate) found: Mutex<Vec<LogDevice>>,
    pub(crate) log: ArcSwapOption<Log>,
    pub(crate) replayed: AtomicU64,
    /// What the replay at assembly found damaged, and did about it.
    pub(crate) issues: Mutex<Vec<LogReplayIssue>>,
    /// Serialises adding, removing and failing log devices.
    pub(crate) change: tokio::sync::Mutex<()>,
}

impl LogSlot {
    pub(crate) fn restore(&self, cfg: &LogConfig) {
        *self.cfg.lock() = cfg.clone();
    }

    pub(crate) fn config(&self) -> LogConfig {
        self.cfg.lock().clone()
    }

    /// The log devices given to assembly.
    pub(crate) fn set_found(&self, found: Vec<LogDevice>) {
        *self.found.lock() = found;
    }

    /// The running log, if any.
    pub fn current(&self) -> Option<Arc<Log>> {
        self.log.load_full()
    }

    /// Does every write go through the running log (so every acknowledged write is
    /// durable in it)?
    pub fn journaling(&self) -> bool {
        self.cfg.lock().journal
            && self
                .log
                .load()
                .as_ref()
                .is_some_and(|l| l.failed().is_none())
    }

    pub(crate) fn close_devices(&self) {
        for d in self.found.lock().iter() {
            d.dev.close();
        }
    }
}

/// Sort the devices given to assembly: those that start with a log superblock are log
/// devices, the rest members.
pub(crate) async fn split(specs: Vec<MemberSpec>) -> (Vec<MemberSpec>, Vec<LogDevice>) {
    let mut members = Vec::new();
    let mut logs = Vec::new();
    // All at once, as assembly reads the superblocks: a remote device's read is a round trip.
    let supers = futures::future::join_all(specs.iter().map(|s| read_super(&s.dev))).await;
    for (s, sb) in specs.into_iter().zip(supers) {
        match sb {
            Ok(sb) => logs.push(LogDevice {
                dev: s.dev,
                uuid: sb.log_uuid,
                path: s.path,
            }),
            Err(_) => members.push(s),
        }
    }
    (members, logs)
}
