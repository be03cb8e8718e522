//! Management messages: what the control socket of a serving array carries (one JSON
//! request per line, one JSON response per line), and the bodies of the HTTP API's actions.
//! The same arguments as the CLI's, typed once.

use crate::size::{parse_rate, parse_size};
use serde::{Deserialize, Deserializer, Serialize};

/// A request to one array. On the wire: `{"cmd":"fail","member":"/dev/sdc"}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum Request {
    /// Reply: a [`crate::Status`].
    Status,
    /// Take a member out of service; past the array's redundancy only with `force`.
    /// Reply: null.
    Fail {
        member: String,
        #[serde(default, skip_serializing_if = "is_false")]
        force: bool,
    },
    /// Remove a failed member or a spare. Reply: null.
    Remove { member: String },
    /// Add a hot spare (an absolute path the server can open), or re-add a former member
    /// to its slot. Reply: what was done (the engine's `AddOutcome`).
    Add {
        member: String,
        #[serde(default)]
        domain: String,
        #[serde(default)]
        force: bool,
    },
    /// Change the array's shape (`sbod grow`): add members (`add`: absolute paths the
    /// server can open; wider groups, or whole groups with `new_groups`), or drop a mirror
    /// copy (`drop`). Reply: a [`GrowReply`].
    Grow {
        #[serde(default)]
        add: Vec<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        drop: Option<String>,
        /// Members to let go: a striped array restriped onto the others (narrower
        /// groups; the volume shrinks to what they hold).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        remove: Vec<String>,
        #[serde(default)]
        domain: String,
        #[serde(default, skip_serializing_if = "is_false")]
        new_groups: bool,
        /// A level change (one more parity shard per stripe) with the members added.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        level: Option<crate::Level>,
        /// Use more of every member (`--size max|SIZE`), with nothing added.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        member_size: Option<MemberSize>,
        /// A new chunk (bytes): the data restriped onto the same members.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        chunk: Option<u32>,
        #[serde(default, skip_serializing_if = "is_false")]
        force: bool,
    },
    /// Rebuild `new` in place of `old`. Reply: null.
    Replace {
        old: String,
        new: String,
        #[serde(default)]
        force: bool,
    },
    /// Start a scrub. Reply: the new process's [`crate::ProcessStatus`].
    Scrub {
        #[serde(default)]
        repair: bool,
    },
    /// Add a log device (an absolute path the server can open): the first makes the log,
    /// a second mirrors it. Reply: null.
    AddLog {
        device: String,
        #[serde(default, skip_serializing_if = "is_false")]
        force: bool,
    },
    /// Change settings (None keeps a value). Reply: the [`SetReply`] now in force.
    Set {
        #[serde(default)]
        rebuild_min_rate: Option<u64>,
        #[serde(default)]
        rebuild_max_rate: Option<u64>,
        /// Persisted on the members.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sync: Option<crate::SyncMode>,
    },
    /// Stop serving (cleanly). Reply: null.
    Stop,
    /// I/O counters and latency of the serving process. Reply: [`IoMetrics`].
    Metrics,
}

/// What went wrong, so that each client can answer in its own terms (an HTTP status, an
/// exit code) without parsing messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The request cannot be honoured as given (bad argument, unknown member).
    Invalid,
    /// Refused to protect data (foreign member, signature, in use); `force` may override.
    Refused,
    /// No such array.
    NotFound,
    /// Not now: another process runs, the array is stopping, or is failed.
    Conflict,
    /// A device or the system failed.
    Io,
}

/// The answer to one request.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Response {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<ErrorKind>,
    /// What can be done about the error, for the client to word.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub advice: Vec<crate::Step>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<serde_json::Value>,
}

impl Response {
    pub fn ok(v: serde_json::Value) -> Response {
        Response {
            ok: true,
            error: None,
            kind: None,
            advice: Vec::new(),
            result: Some(v),
        }
    }

    pub fn err(kind: ErrorKind, e: impl std::fmt::Display) -> Response {
        Response::advised(kind, e, Vec::new())
    }

    /// An error with the steps the client may word for the person.
    pub fn advised(
        kind: ErrorKind,
        e: impl std::fmt::Display,
        advice: Vec<crate::Step>,
    ) -> Response {
        Response {
            ok: false,
            error: Some(e.to_string()),
            kind: Some(kind),
            advice,
            result: None,
        }
    }
}

/// Counters of the client I/O an array served, since it started.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct IoMetrics {
    pub reads: u64,
    pub read_bytes: u64,
    pub writes: u64,
    pub write_bytes: u64,
    pub flushes: u64,
    /// Trims and write-zeroes.
    pub trims: u64,
    /// Requests answered with an error.
    pub errors: u64,
    /// Latency of reads, writes and flushes.
    pub latency: Vec<LatencyHistogram>,
    /// Seconds since serving started.
    pub uptime_secs: f64,
}

/// A latency histogram: `counts[i]` requests took at most `bounds_secs[i]` (and more than
/// the bound before); the last count, one past the bounds, is the rest (+Inf).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LatencyHistogram {
    /// read, write or flush.
    pub op: String,
    pub bounds_secs: Vec<f64>,
    pub counts: Vec<u64>,
    pub sum_secs: f64,
}

impl LatencyHistogram {
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }
}

/// A size in a JSON body: a number of bytes, or a string by the one size rule (`"1G"`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Size(pub u64);

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Size, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(u64),
            S(String),
        }
        match Raw::deserialize(d).map_err(|_| {
            serde::de::Error::custom("a size is a number of bytes or a string like \"1G\"")
        })? {
            Raw::N(n) => Ok(Size(n)),
            // Rates too: "50M/s" reads as 50M.
            Raw::S(s) => parse_size(&s)
                .or_else(|e| parse_rate(&s).map_err(|_| e))
                .map(Size)
                .map_err(serde::de::Error::custom),
        }
    }
}

/// `sbod grow --size max|SIZE`: the data bytes every member holds after the grow (`max`:
/// all the smallest member can, within what the array's metadata covers). In JSON
/// `"max"`, a number of bytes or a size string (`"2T"`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemberSize {
    Max,
    Bytes(u64),
}

impl std::str::FromStr for MemberSize {
    type Err = crate::ParseError;
    fn from_str(s: &str) -> Result<MemberSize, crate::ParseError> {
        if s.trim().eq_ignore_ascii_case("max") {
            return Ok(MemberSize::Max);
        }
        parse_size(s).map(MemberSize::Bytes)
    }
}

impl Serialize for MemberSize {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            MemberSize::Max => s.serialize_str("max"),
            MemberSize::Bytes(n) => s.serialize_u64(*n),
        }
    }
}

impl<'de> Deserialize<'de> for MemberSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<MemberSize, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(u64),
            S(String),
        }
        match Raw::deserialize(d).map_err(|_| {
            serde::de::Error::custom(
                "a member size is \"max\", a number of bytes or a string like \"2T\"",
            )
        })? {
            Raw::N(n) => Ok(MemberSize::Bytes(n)),
            Raw::S(s) => s.parse().map_err(serde::de::Error::custom),
        }
    }
}

/// `POST /api/v1/arrays/NAME/fail` and `/remove`: `sbod fail|remove NAME MEMBER`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemberArgs {
    /// A member's path (or the uuid of a failed member that is gone).
    pub member: String,
    /// `fail` only: take the array past its redundancy (it then fails).
    #[serde(default)]
    pub force: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// `POST .../add`: `sbod add NAME MEMBER... [--domain D] [--size S] [--force]`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AddArgs {
    pub members: Vec<String>,
    #[serde(default)]
    pub domain: String,
    /// Create missing member files of this size.
    #[serde(default)]
    pub size: Option<Size>,
    /// Give member files all their space now (posix_fallocate).
    #[serde(default)]
    pub preallocate: bool,
    /// The devices are log devices (`sbod add NAME --log DEV`), not members.
    #[serde(default)]
    pub log: bool,
    #[serde(default)]
    pub force: bool,
}

/// `POST .../grow`: `sbod grow NAME [--add DEV...] [--drop MEMBER] [--new-groups]
/// [--size S] [--preallocate] [--domain D] [--force]`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrowArgs {
    #[serde(default)]
    pub add: Vec<String>,
    #[serde(default)]
    pub drop: Option<String>,
    /// Members to let go (raid0/5/6/ec: the last of each group): the data is restriped
    /// onto the others, online, and the volume shrinks to what they hold.
    #[serde(default)]
    pub remove: Vec<String>,
    #[serde(default)]
    pub domain: String,
    /// Add the members as whole new groups (of the array's width) rather than widen every
    /// group.
    #[serde(default)]
    pub new_groups: bool,
    /// A level change with the members added (one more parity shard per stripe, one new
    /// member per group: raid0 -> raid5, raid5 -> raid6, ec:K+M -> ec:K+(M+1)).
    #[serde(default)]
    pub level: Option<crate::Level>,
    /// Use more of every member, with nothing added: after the members were replaced by
    /// larger ones (`max`, or a size per member).
    #[serde(default)]
    pub member_size: Option<MemberSize>,
    /// A new chunk (bytes, a power of two from 4 KiB to 16 MiB): raid0/5/6/ec/raid10
    /// restriped onto the same members, online; the volume's last rows are its backup
    /// area meanwhile (refused while they hold data, unless `force`).
    #[serde(default)]
    pub chunk: Option<Size>,
    /// Create missing member files of this size.
    #[serde(default)]
    pub size: Option<Size>,
    #[serde(default)]
    pub preallocate: bool,
    #[serde(default)]
    pub force: bool,
}

/// What a grow did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrowReply {
    /// `reshape` (data moves into the new layout, in the background), `copies` (new
    /// mirror copies rebuilding), `parity` (a level change: the new parity members
    /// rebuilding), `resized` (every member holds more: the volume grew at once), `appended` (concat: the volume grew at once), `dropped`
    /// (a mirror copy left).
    pub kind: String,
    /// The volume's size before, and once the change is done.
    pub from: u64,
    pub to: u64,
    pub level: crate::Level,
    pub groups: u32,
    pub width: u32,
    /// The chunk, bytes (once the change is done).
    #[serde(default)]
    pub chunk: u32,
}

/// `POST .../replace`: `sbod replace NAME OLD NEW [--size S] [--force]`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplaceArgs {
    pub old: String,
    pub new: String,
    #[serde(default)]
    pub size: Option<Size>,
    /// Give the new member file all its space now (posix_fallocate).
    #[serde(default)]
    pub preallocate: bool,
    #[serde(default)]
    pub force: bool,
}

/// `POST .../scrub`: `sbod scrub NAME [--repair]`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScrubArgs {
    #[serde(default)]
    pub repair: bool,
}

/// `POST .../set`: `sbod set NAME [--rebuild-min-rate R] [--rebuild-max-rate R] [--sync
/// MODE]`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetArgs {
    #[serde(default)]
    pub rebuild_min_rate: Option<Size>,
    #[serde(default)]
    pub rebuild_max_rate: Option<Size>,
    /// The sync mode (persisted on the members: also for an array nothing serves).
    #[serde(default)]
    pub sync: Option<crate::SyncMode>,
    /// The predictive failure policy, as `KEY=VALUE,...` (see
    /// [`crate::HealthPolicy::apply`]); kept in the state directory, served or not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_policy: Option<String>,
}

/// What `set` leaves in force: the served array's tunables (the defaults a start gives,
/// for an array nothing serves) and its sync mode.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SetReply {
    #[serde(flatten)]
    pub settings: crate::Settings,
    pub sync: crate::SyncMode,
    /// The array's health policy now in force (filled by the management layer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_policy: Option<crate::HealthPolicy>,
}

/// `sbod create NAME --level L MEMBER...`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateArgs {
    pub name: String,
    pub level: crate::Level,
    /// Chunk (stripe unit) per member.
    #[serde(default = "default_chunk")]
    pub chunk: Size,
    #[serde(default = "one")]
    pub groups: u32,
    /// The last N members are hot spares (declustered: N members' worth of spare space
    /// on all of them).
    #[serde(default)]
    pub spares: usize,
    /// Spread the groups' stripes and the spare space over every member.
    #[serde(default)]
    pub declustered: bool,
    /// Copies per mirror set (raid10).
    #[serde(default = "two")]
    pub copies: u32,
    /// Create missing member files of this size.
    #[serde(default)]
    pub size_each: Option<Size>,
    /// Give member files all their space now (posix_fallocate).
    #[serde(default)]
    pub preallocate: bool,
    /// Failure domain of each member, in order (empty: none).
    #[serde(default)]
    pub domains: Vec<String>,
    #[serde(default)]
    pub bitmap_region: Option<Size>,
    #[serde(default)]
    pub assume_clean: bool,
    /// Checksums on every block: `crc32c` (the default) or `none`.
    #[serde(default = "default_integrity")]
    pub integrity: crate::Integrity,
    /// What FLUSH and FUA do (default: standard).
    #[serde(default)]
    pub sync: crate::SyncMode,
    /// Log devices (one, or two for a mirrored log).
    #[serde(default)]
    pub log: Vec<String>,
    #[serde(default)]
    pub force: bool,
    pub members: Vec<String>,
}

/// What `create` (and `bench`, `demo`) choose when not told: checksums on, for what they
/// cost (docs/PERFORMANCE.md, "Checksums").
pub fn default_integrity() -> crate::Integrity {
    crate::Integrity::Crc32c
}

fn default_chunk() -> Size {
    Size(64 << 10)
}
fn one() -> u32 {
    1
}
fn two() -> u32 {
    2
}

/// `sbod assemble [--name N] [--force] MEMBER...`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AssembleArgs {
    /// Register under this name (default: the superblocks' name).
    #[serde(default)]
    pub name: Option<String>,
    /// Start without members it had in service when it stopped.
    #[serde(default)]
    pub degraded: bool,
    #[serde(default)]
    pub force: bool,
    pub members: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_format() {
        let r = Request::Fail {
            member: "/d/x".into(),
            force: false,
        };
        assert_eq!(
            serde_json::to_string(&r).unwrap(),
            r#"{"cmd":"fail","member":"/d/x"}"#
        );
        let back: Request = serde_json::from_str(r#"{"cmd":"add","member":"/d/y"}"#).unwrap();
        assert_eq!(
            back,
            Request::Add {
                member: "/d/y".into(),
                domain: String::new(),
                force: false
            }
        );
        assert_eq!(
            serde_json::from_str::<Request>(r#"{"cmd":"metrics"}"#).unwrap(),
            Request::Metrics
        );
        assert!(serde_json::from_str::<Request>(r#"{"cmd":"explode"}"#).is_err());
    }

    #[test]
    fn bodies() {
        let s: SetArgs = serde_json::from_str(r#"{"rebuild_min_rate":"50M"}"#).unwrap();
        assert_eq!(s.rebuild_min_rate, Some(Size(50 << 20)));
        let s: SetArgs = serde_json::from_str(r#"{"rebuild_max_rate":1000}"#).unwrap();
        assert_eq!(s.rebuild_max_rate, Some(Size(1000)));
        let e = serde_json::from_str::<SetArgs>(r#"{"rebuild_min_rate":"lots"}"#).unwrap_err();
        assert!(e.to_string().contains("not a size"), "{e}");
        assert!(serde_json::from_str::<SetArgs>(r#"{"rebuild_min":"1G"}"#).is_err());
        let s: SetArgs = serde_json::from_str(r#"{"sync":"disabled"}"#).unwrap();
        assert_eq!(s.sync, Some(crate::SyncMode::Disabled));
        let e = serde_json::from_str::<SetArgs>(r#"{"sync":"sometimes"}"#).unwrap_err();
        assert!(e.to_string().contains("standard"), "{e}");
        // Older clients' requests still read, and keep the mode.
        let r: Request = serde_json::from_str(r#"{"cmd":"set","rebuild_min_rate":5}"#).unwrap();
        assert!(matches!(r, Request::Set { sync: None, .. }));
        assert!(serde_json::from_str::<MemberArgs>(r#"{}"#).is_err());
    }
}
