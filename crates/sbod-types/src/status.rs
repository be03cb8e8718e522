//! What an array reports: the JSON of `sbod status --json`, `GET /api/v1/arrays/NAME` and
//! the control socket's `status`. The engine builds these; every client reads them. Field
//! names and string values are a public interface: add fields, never rename them.

use crate::Level;
use serde::{Deserialize, Serialize};

word_enum! {
    /// The array's health.
    ArrayState {
        /// Every slot holds a current member.
        Optimal = "optimal",
        /// A slot has no current member: redundancy is reduced.
        Degraded = "degraded",
        /// A member is being rebuilt (onto a spare, a replacement, a re-added member).
        Rebuilding = "rebuilding",
        /// Parity is being made consistent (initial sync).
        Resyncing = "resyncing",
        /// More members lost than the layout survives: data is unavailable.
        Failed = "failed",
    }
}

word_enum! {
    /// One member's role and health.
    MemberState {
        Active = "active",
        Failed = "failed",
        Spare = "spare",
        Rebuilding = "rebuilding",
        Missing = "missing",
        /// Being rebuilt to take a slot over from another member (`replace`).
        Replacing = "replacing",
        /// A slot that holds no member (a removed member's).
        Empty = "empty",
    }
}

word_enum! {
    /// A background process.
    ProcessKind {
        Rebuild = "rebuild",
        Check = "check",
        Repair = "repair",
        Resync = "resync",
    }
}

/// The whole array.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Status {
    pub name: String,
    pub uuid: String,
    pub level: Level,
    pub state: ArrayState,
    pub failed_reason: Option<String>,
    /// Usable bytes.
    pub size: u64,
    pub chunk: u32,
    pub groups: u32,
    pub width: u32,
    /// Members per group the array may lose.
    pub redundancy: usize,
    pub event: u64,
    pub members: Vec<MemberStatus>,
    /// The process running now.
    pub process: Option<ProcessStatus>,
    /// The last one that ended.
    pub last_process: Option<ProcessStatus>,
    pub bitmap_region: Option<u64>,
    pub dirty_regions: u64,
    /// Initial sync: parity is known good below this member offset.
    pub resync_offset: Option<u64>,
    pub assembly: AssemblyReport,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MemberStatus {
    pub slot: Option<usize>,
    pub group: Option<usize>,
    pub path: Option<String>,
    pub uuid: Option<String>,
    pub state: MemberState,
    /// Failure domain label ("" if none).
    pub domain: String,
    pub size: u64,
    pub read_errors: u64,
    pub write_errors: u64,
    pub checksum_errors: u64,
    pub repaired: u64,
    pub reads: u64,
    pub writes: u64,
    /// Rebuilding/replacing: bytes of member data valid so far.
    pub recovered: Option<u64>,
}

/// A region of member space where scrub found mismatches.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MismatchRegion {
    pub group: usize,
    /// Logical (volume) offset of the first mismatched stripe in this region.
    pub volume_offset: u64,
    /// Member offset of the region start.
    pub member_offset: u64,
    /// Mismatched 4 KiB blocks.
    pub blocks: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ProcessStatus {
    pub kind: ProcessKind,
    pub done: u64,
    pub total: u64,
    pub percent: f64,
    pub elapsed_secs: f64,
    /// Bytes per second so far.
    pub rate: f64,
    pub eta_secs: Option<f64>,
    pub mismatches: u64,
    pub repaired: u64,
    pub finished: bool,
    pub cancelled: bool,
    pub error: Option<String>,
    pub regions: Vec<MismatchRegion>,
}

/// What assembly had to do.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct AssemblyReport {
    /// The array was not shut down cleanly.
    pub unclean: bool,
    /// Bytes of member space resynced from the write-intent bitmap.
    pub resynced_bytes: u64,
    pub resynced_regions: u64,
    /// Members that were stale or re-added and are rebuilt.
    pub rebuilding: Vec<String>,
    /// Members given but not used, with the reason.
    pub ignored: Vec<(String, String)>,
    /// Slots with no member.
    pub missing: Vec<usize>,
}

/// One array as `sbod status --json` and `GET /api/v1/arrays[/NAME]` list it: its status,
/// and whether a process serves it now.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ArrayStatus {
    #[serde(flatten)]
    pub status: Status,
    pub running: bool,
}

/// Tunables a user can change on a running array.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Settings {
    /// Background bytes/s when foreground I/O is active (0 = no floor).
    pub rebuild_min_rate: u64,
    /// Background bytes/s ceiling (0 = unlimited).
    pub rebuild_max_rate: u64,
    /// Read errors a member may have before it is failed.
    pub max_read_errors: u64,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            rebuild_min_rate: 50 << 20,
            rebuild_max_rate: 0,
            max_read_errors: 20,
        }
    }
}

impl Status {
    /// Is a rebuild running or due (a member rebuilding or replacing)?
    pub fn rebuilding(&self) -> bool {
        self.state == ArrayState::Rebuilding
            || self
                .members
                .iter()
                .any(|m| matches!(m.state, MemberState::Rebuilding | MemberState::Replacing))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_are_lowercase_words() {
        for s in ArrayState::ALL {
            let j = serde_json::to_string(s).unwrap();
            assert_eq!(j, format!("\"{s}\""));
            assert_eq!(serde_json::from_str::<ArrayState>(&j).unwrap(), *s);
        }
        for s in MemberState::ALL {
            assert_eq!(serde_json::to_string(s).unwrap(), format!("\"{s}\""));
        }
        assert_eq!(ArrayState::Degraded, "degraded");
        assert!(serde_json::from_str::<ArrayState>("\"sad\"").is_err());
    }
}
