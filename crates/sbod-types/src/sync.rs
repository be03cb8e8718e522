//! How an array treats a client's request for durability (FLUSH, FUA): its sync mode, and
//! what status says about it and about its log devices.

use serde::{Deserialize, Serialize};

word_enum! {
    /// What FLUSH and FUA do. Persisted on the members (`sbod create --sync`, `sbod set
    /// --sync`); the names and the trade-off are ZFS's `sync` property.
    #[derive(Default)]
    SyncMode {
        /// FLUSH and FUA mean what the NBD spec says: a write acknowledged with FUA, or
        /// before a FLUSH that completed, survives a power cut.
        #[default]
        Standard = "standard",
        /// Every write is treated as FUA: every acknowledged write survives a power cut,
        /// FLUSH or not (slower: each write waits for the members' disks).
        Always = "always",
        /// FLUSH and FUA are acknowledged at once; the members are flushed in the
        /// background every few seconds. A power cut loses the writes of those last
        /// seconds (each block then reads as an older or a newer value, never as others).
        Disabled = "disabled",
    }
}

impl SyncMode {
    /// What a power cut costs in this mode, in words (status, the warning at every start).
    pub fn promise(&self, interval_secs: f64) -> String {
        match self {
            SyncMode::Standard => {
                "writes acknowledged with FUA or before a completed FLUSH survive a power cut"
                    .into()
            }
            SyncMode::Always => "every acknowledged write survives a power cut".into(),
            SyncMode::Disabled => format!(
                "FLUSH and FUA are acknowledged at once: a power cut loses the writes of up to the last {interval_secs:.0} s (the members are flushed in the background every {interval_secs:.0} s), whatever a client flushed; each block then reads as an older or a newer value, never as other bytes"
            ),
        }
    }
}

/// The sync mode of an array and what it did, for `status`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SyncStatus {
    pub mode: SyncMode,
    /// Disabled: seconds between the background flushes of the members.
    pub interval_secs: f64,
    /// Client FLUSHes, and of them those acknowledged at once (sync=disabled).
    pub client_flushes: u64,
    pub flushes_acknowledged_at_once: u64,
    /// Client writes whose FUA was dropped (disabled) or added (always).
    pub fua_dropped: u64,
    pub fua_added: u64,
    /// Flushes of every member the background flusher made (disabled).
    pub background_flushes: u64,
}

word_enum! {
    /// One log device's health.
    LogDevState {
        /// Written with every record.
        Active = "active",
        /// Failed: no longer written; the other log device (if any) carries on.
        Failed = "failed",
        /// Recorded, but not found when the array started.
        Missing = "missing",
    }
}

word_enum! {
    /// What the log does for the array.
    LogState {
        /// Every device works.
        Optimal = "optimal",
        /// A mirrored log with one device out.
        Degraded = "degraded",
        /// Every log device is out: writes take the in-pool path (as without a log).
        Failed = "failed",
    }
}

/// One log device, for `status`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LogDevStatus {
    pub path: Option<String>,
    pub uuid: String,
    pub state: LogDevState,
    /// Why it is out.
    #[serde(default)]
    pub reason: Option<String>,
    pub write_errors: u64,
}

/// The array's log (md's journal, ZFS's separate intent log), for `status`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LogStatus {
    pub state: LogState,
    pub devices: Vec<LogDevStatus>,
    /// Bytes of the ring, and of it in use (records whose pool writes are not yet known
    /// durable).
    pub capacity: u64,
    pub used: u64,
    /// Records appended since the array started, and bytes of them.
    pub records: u64,
    pub bytes: u64,
    /// Checkpoints (pool flushed, log tail advanced) since the array started.
    pub checkpoints: u64,
    /// Records replayed into the pool when the array started.
    #[serde(default)]
    pub replayed_records: u64,
    /// Do the members trust the log to hold every write of this session (the engine
    /// journals every write through a log in service; false once the log failed, or for a
    /// log an sbod that did not journal attached, until its next start)?
    #[serde(default)]
    pub journaling: bool,
    /// Records the replay at the start found damaged on every log device, and what became
    /// of each (empty when the log was read whole).
    #[serde(default)]
    pub replay_issues: Vec<LogReplayIssue>,
}

/// A log record the replay found damaged on every device.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogReplayIssue {
    /// Its sequence number.
    pub seq: u64,
    /// An acknowledged write the pool may not hold: the ranges may read stale bytes.
    pub lost: bool,
    /// What was found and done, in words.
    pub what: String,
    /// The member ranges kept as the pool has them for it; `None`: not known.
    pub ranges: Option<Vec<MemberRange>>,
}

/// `len` bytes at `offset` of a slot's data area.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberRange {
    pub slot: usize,
    pub member: Option<String>,
    pub offset: u64,
    pub len: u64,
}
