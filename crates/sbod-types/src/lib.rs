//! Types every part of sbod shares, with no dependency on the engine: the RAID [`Level`],
//! the one size parser and formatter ([`size`]), the typed status an array reports
//! ([`status`]) and the management messages its control socket and HTTP API carry
//! ([`control`]).

/// Defines a closed set of states written as lowercase words, comparable with `&str` so
/// that code and tests may say `state == "degraded"`.
macro_rules! word_enum {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $v:ident = $s:literal),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
        #[serde(rename_all = "snake_case")]
        pub enum $name { $($(#[$vm])* $v),+ }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$v),+];
            pub fn as_str(&self) -> &'static str {
                match self { $($name::$v => $s),+ }
            }
        }
        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
        impl std::str::FromStr for $name {
            type Err = $crate::ParseError;
            fn from_str(s: &str) -> Result<$name, $crate::ParseError> {
                $name::ALL.iter().copied().find(|v| v.as_str() == s).ok_or_else(|| {
                    let all: Vec<&str> = $name::ALL.iter().map(|v| v.as_str()).collect();
                    $crate::ParseError(format!("unknown value '{s}': one of {}", all.join(", ")))
                })
            }
        }
        impl PartialEq<str> for $name {
            fn eq(&self, o: &str) -> bool { self.as_str() == o }
        }
        impl PartialEq<&str> for $name {
            fn eq(&self, o: &&str) -> bool { self.as_str() == *o }
        }
    };
}

pub mod advice;
pub mod control;
pub mod event;
pub mod health;
pub mod level;
pub mod size;
pub mod status;
pub mod sync;

pub use advice::Step;
pub use event::{Event, EventKind};
pub use health::{
    DiskProtocol, Health, HealthPolicy, HealthVerdict, Identity, Location, Threshold,
};
pub use level::Level;
pub use size::{format_size, human, parse_rate, parse_size};
pub use status::{
    ArrayState, ArrayStatus, AssemblyReport, Closing, Integrity, KnobValue, MemberState,
    MemberStatus, MismatchRegion, OwnerStatus, ProcessKind, ProcessStatus, RecoveryStatus,
    RescueReport, Settings, StaleMember, Status,
};
pub use sync::{
    LogDevState, LogDevStatus, LogReplayIssue, LogState, LogStatus, MemberRange, SyncMode,
    SyncStatus,
};

/// A value that did not parse, with a message that says what would have been accepted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ParseError(pub String);
