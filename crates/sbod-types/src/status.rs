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
        /// Its data is being moved into a new layout (`sbod grow`); it serves meanwhile.
        Reshaping = "reshaping",
        /// More members lost than the layout survives: data is unavailable.
        Failed = "failed",
        /// Started read-only from what could be found (`--force` on a failed array), to
        /// copy the data off.
        Rescue = "rescue",
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
        /// Older than the array (missed writes): never read; shown so while the array is
        /// only looked at or rescued (otherwise it is rebuilding).
        Stale = "stale",
    }
}

word_enum! {
    /// End-to-end integrity: what every block of the array's members carries to prove, on
    /// every read, that it holds what was written there (`sbod create --integrity`).
    Integrity {
        /// Members are trusted to return what was written (md, SPDK and RAID cards do).
        None = "none",
        /// A crc32c per 4 KiB block, kept on the member beside the data.
        Crc32c = "crc32c",
    }
}

#[allow(clippy::derivable_impls)] // `word_enum!` derives the rest; `None`: arrays from before
impl Default for Integrity {
    fn default() -> Integrity {
        Integrity::None
    }
}

word_enum! {
    /// A background process.
    ProcessKind {
        Rebuild = "rebuild",
        Check = "check",
        Repair = "repair",
        Resync = "resync",
        /// Data moved into a new layout (`sbod grow`): more members, more groups.
        Reshape = "reshape",
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
    /// Started read-only (a rescue): writes are refused.
    #[serde(default)]
    pub read_only: bool,
    /// Usable bytes.
    pub size: u64,
    pub chunk: u32,
    pub groups: u32,
    pub width: u32,
    /// Declustered: members' worth of distributed spare space (the groups' stripes and
    /// it spread over every member); None: each group on its own members.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub declustered: Option<u32>,
    /// Members per group the array may lose.
    pub redundancy: usize,
    /// Checksums on every block (`none` on arrays from before they existed).
    #[serde(default)]
    pub integrity: Integrity,
    pub event: u64,
    pub members: Vec<MemberStatus>,
    /// The process running now.
    pub process: Option<ProcessStatus>,
    /// The last one that ended.
    pub last_process: Option<ProcessStatus>,
    pub bitmap_region: Option<u64>,
    pub dirty_regions: u64,
    /// Stripes a write left inconsistent (it reached some members only, for want of
    /// space) and not yet resynced.
    #[serde(default)]
    pub inconsistent_stripes: u64,
    /// Initial sync: parity is known good below this member offset.
    pub resync_offset: Option<u64>,
    pub assembly: AssemblyReport,
    /// Members recovered since the array started (stale, re-added, spares, replacements),
    /// with the bytes each needed.
    #[serde(default)]
    pub recoveries: Vec<RecoveryStatus>,
    /// What FLUSH and FUA do (`sbod set --sync`), and what they did.
    #[serde(default)]
    pub sync: crate::SyncStatus,
    /// The log devices, if the array has any.
    #[serde(default)]
    pub log: Option<crate::LogStatus>,
    /// Another head (host) took the members over: this one writes nothing more
    /// ("members taken over by HOST").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fenced: Option<String>,
    /// The host this head holds the members as, and its heartbeat.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<OwnerStatus>,
    /// The array is being stopped (`sbod stop`): what the stop is doing now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub closing: Option<Closing>,
    /// The tuning knobs the serving process runs with, by environment variable
    /// (docs/ENGINE.md, "Tuning knobs"; empty from an older sbod).
    #[serde(default)]
    pub tuning: std::collections::BTreeMap<String, KnobValue>,
}

/// Where a stop stands: its stage ("flushing the members (their write caches)",
/// "recording the array clean", ...), and while members are being flushed, how many of
/// how many have answered (drives destaging their write caches take seconds to minutes).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Closing {
    pub stage: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub members_flushed: Option<[u64; 2]>,
}

/// Who holds the members (the owner block's heartbeat, see docs/RELIABILITY.md).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct OwnerStatus {
    pub host: String,
    pub host_id: String,
    pub interval_ms: u64,
    pub lease_ms: u64,
}

/// A tuning knob's value in force and its default.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KnobValue {
    pub value: String,
    pub default: String,
}

/// A recovery of one member (rebuild, bitmap resync, replacement).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RecoveryStatus {
    pub slot: usize,
    pub path: String,
    pub uuid: String,
    /// Why: "stale: event 4, array at 6", "missing", "hot spare", "replacement", ...
    pub reason: String,
    pub bitmap: bool,
    /// Bytes of member space it covers, and bytes rebuilt so far.
    pub planned_bytes: u64,
    pub recovered_bytes: u64,
    /// running / done / stopped
    pub state: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MemberStatus {
    pub slot: Option<usize>,
    pub group: Option<usize>,
    pub path: Option<String>,
    pub uuid: Option<String>,
    pub state: MemberState,
    /// Why it is out or being recovered: "failed: write error", "failed by the
    /// administrator", "missing", "stale: event 4, array at 6; ...".
    #[serde(default)]
    pub reason: Option<String>,
    /// Failure domain label ("" if none).
    pub domain: String,
    pub size: u64,
    pub read_errors: u64,
    pub write_errors: u64,
    /// Blocks it returned that failed their checksums and that redundancy showed wrong
    /// (or could not judge: no redundancy). Past `max_checksum_errors` it is failed.
    pub checksum_errors: u64,
    /// Checksums (tags) found damaged over right data and rewritten ("tags repaired"):
    /// damage to the member's tag region, never held against it.
    #[serde(default)]
    pub tag_errors: u64,
    pub repaired: u64,
    pub reads: u64,
    pub writes: u64,
    /// Writes refused for want of space on its file system (the member stays in service).
    #[serde(default)]
    pub nospace: u64,
    /// Rebuilding/replacing: bytes of member data valid so far.
    pub recovered: Option<u64>,
    /// Rebuilding: only the regions the write-intent bitmap marks.
    #[serde(default)]
    pub bitmap_recovery: bool,
    /// Rebuilding: bytes of member space this recovery covers.
    #[serde(default)]
    pub recovery_bytes: Option<u64>,
    /// Its disk's health (SMART), or why it cannot be read; absent where nobody looked
    /// (an older sbod, the engine alone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<crate::Health>,
    /// Where its disk sits: enclosure and slot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<crate::Location>,
    /// A stable name for its disk (WWN, serial, by-id path) beside the /dev name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<crate::Identity>,
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
    /// Checksums (tags) found damaged over right data and rewritten (not mismatches).
    #[serde(default)]
    pub tags_repaired: u64,
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
    /// Members whose superblock is older than the array's: never read, recovered.
    #[serde(default)]
    pub stale: Vec<StaleMember>,
    /// Members one event behind (a superblock write a crash interrupted), trusted.
    #[serde(default)]
    pub missed_last_write: Vec<String>,
    /// Forced over a split brain: what the other side was.
    #[serde(default)]
    pub split_brain: Option<String>,
    /// Started read-only from what could be found (`force` on a failed array).
    #[serde(default)]
    pub rescue: Option<RescueReport>,
}

/// A member found behind the array at assembly (or re-added later).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StaleMember {
    pub path: String,
    pub slot: usize,
    /// Its own superblock's event, and the array's.
    pub event: u64,
    pub array_event: u64,
    /// Recovered from the write-intent bitmap (else in full).
    pub bitmap: bool,
    /// Bytes of member space the recovery covers.
    pub planned_bytes: u64,
    /// The status line: "stale: event 4, array at 6; resyncing ...".
    pub note: String,
}

/// What a rescue (read-only start of a failed array) uses.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RescueReport {
    /// Out-of-date members read as if in sync, with what they may have missed.
    pub used: Vec<String>,
    /// Groups that still cannot be read.
    pub unreadable_groups: Vec<usize>,
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
    /// Blocks a member may return wrong before it is failed: blocks whose checksum fails
    /// on a read (`--integrity crc32c`), and blocks a scrub locates as wrong (raid6, ec
    /// with m >= 2, mirrors of three or more copies). Below it the blocks are rewritten
    /// from redundancy (a scrub check only reports what parity located). Members of
    /// arrays without redundancy are never failed for it: their reads return EIO.
    #[serde(default = "default_max_checksum_errors")]
    pub max_checksum_errors: u64,
}

fn default_max_checksum_errors() -> u64 {
    8
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            rebuild_min_rate: 50 << 20,
            rebuild_max_rate: 0,
            max_read_errors: 20,
            max_checksum_errors: default_max_checksum_errors(),
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

    /// A status from an sbod without `tuning` still reads (as no knobs).
    #[test]
    fn a_status_without_tuning_reads() {
        let j = serde_json::json!({
            "name": "a", "uuid": "u", "level": "raid1", "state": "optimal",
            "failed_reason": null, "size": 0, "chunk": 65536, "groups": 1, "width": 2,
            "redundancy": 1, "event": 1, "members": [], "process": null,
            "last_process": null, "bitmap_region": null, "dirty_regions": 0,
            "resync_offset": null, "assembly": serde_json::to_value(AssemblyReport::default()).unwrap(),
        });
        let s: Status = serde_json::from_value(j.clone()).unwrap();
        assert!(s.tuning.is_empty());
        let mut with = j;
        with["tuning"] = serde_json::json!({"SBOD_PLUG": {"value": "0", "default": "1"}});
        let s: Status = serde_json::from_value(with).unwrap();
        assert_eq!(s.tuning["SBOD_PLUG"].value, "0");
    }
}
