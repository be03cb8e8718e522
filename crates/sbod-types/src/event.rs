//! Events: what `sbod monitor` and the web service tell people about, as mdadm --monitor
//! does (Fail, DegradedArray, RebuildStarted, RebuildFinished, SpareActive,
//! TestMessage...).

use serde::{Deserialize, Serialize};

word_enum! {
    /// What happened.
    EventKind {
        /// A member was taken out of service (by an error or an administrator).
        MemberFailed = "member_failed",
        /// The array lost redundancy.
        ArrayDegraded = "array_degraded",
        /// More members lost than the layout survives.
        ArrayFailed = "array_failed",
        /// The array is whole again.
        ArrayOptimal = "array_optimal",
        RebuildStarted = "rebuild_started",
        RebuildFinished = "rebuild_finished",
        /// `sbod grow` started moving data into a new layout.
        ReshapeStarted = "reshape_started",
        /// The reshape ended: the new capacity is in use (or it stopped, with why).
        ReshapeFinished = "reshape_finished",
        /// A hot spare took a failed member's slot.
        SpareActivated = "spare_activated",
        /// A scrub ended and found mismatches.
        ScrubMismatches = "scrub_mismatches",
        /// A scrub ended clean.
        ScrubFinished = "scrub_finished",
        /// A member's disk health got worse (warn or failing against the array's health
        /// policy): predicted to fail.
        MemberHealth = "member_health",
        /// A failing member is being copied onto a hot spare while it still serves.
        ProactiveReplace = "proactive_replace",
        /// The monitor started, or a test of the delivery (`sbod monitor --test`).
        Test = "test",
    }
}

/// One event, as delivered (the webhook's body, the program's stdin).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub event: EventKind,
    pub array: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member: Option<String>,
    /// A sentence for people.
    pub message: String,
    /// Seconds since the Unix epoch.
    pub time: u64,
    /// The array's state when the event was seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<crate::ArrayState>,
}

impl EventKind {
    /// Syslog severity: failures are critical, losses of redundancy warnings.
    pub fn severity(&self) -> Severity {
        match self {
            EventKind::ArrayFailed => Severity::Critical,
            EventKind::MemberFailed
            | EventKind::ArrayDegraded
            | EventKind::ScrubMismatches
            | EventKind::MemberHealth
            | EventKind::ProactiveReplace => Severity::Warning,
            _ => Severity::Info,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Severity {
    Critical,
    Warning,
    Info,
}
