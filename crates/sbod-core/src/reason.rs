//! Why the engine takes a member out of service, in one place. A [`Why`] is the code the
//! superblocks record ([`OutReason`], which survives a restart) with, where the I/O path
//! knows more, the words the log and `status` show while the array runs ("shrank from
//! 256 MiB to 128 MiB ...").

use crate::layout::human;
use crate::superblock::OutReason;
use std::borrow::Cow;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Why {
    pub code: OutReason,
    pub detail: Option<Cow<'static, str>>,
}

impl Why {
    const fn new(code: OutReason, detail: &'static str) -> Why {
        Why {
            code,
            detail: Some(Cow::Borrowed(detail)),
        }
    }
}

impl From<OutReason> for Why {
    fn from(code: OutReason) -> Why {
        Why { code, detail: None }
    }
}

impl std::fmt::Display for Why {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.detail {
            Some(d) => f.write_str(d),
            None => write!(f, "{}", self.code),
        }
    }
}

pub const WRITE_ERROR: Why = Why::new(OutReason::WriteError, "write error");
pub const REBUILD_WRITE: Why = Why::new(OutReason::WriteError, "write error during rebuild");
pub const REPAIR_WRITE: Why = Why::new(
    OutReason::RepairWrite,
    "could not rewrite an unreadable range",
);
pub const SCRUB_REPAIR_WRITE: Why = Why::new(OutReason::RepairWrite, "write error during repair");
pub const READ_ERRORS: Why = Why::new(OutReason::ReadErrors, "too many read errors");
pub const FLUSH_ERROR: Why = Why::new(OutReason::FlushError, "flush error");
/// A remote member whose host cannot be reached (connection refused, reset, timed out).
pub const UNREACHABLE: Why = Why::new(OutReason::Unreachable, "unreachable");
pub const BITMAP_WRITE: Why = Why::new(OutReason::MetadataWrite, "bitmap write error");
pub const SUPERBLOCK_WRITE: Why = Why::new(OutReason::MetadataWrite, "superblock write failed");
pub const SHORT_READ: Why = Why::new(
    OutReason::ShortRead,
    "returned a short read inside its data (the device is smaller than it says)",
);

/// The device got smaller than the data the array keeps on it (a truncated file, a
/// shrunk volume): what lies past the cut is gone, and a file would read back as zeros
/// where a later write grew it again.
pub fn shrank(from: u64, to: u64, need: u64) -> Why {
    Why {
        code: OutReason::Shrank,
        detail: Some(Cow::Owned(format!(
            "shrank from {} to {} (the array needs {})",
            human(from),
            human(to),
            human(need)
        ))),
    }
}

/// A scrub found, with parity that locates the culprit, this many blocks of a member
/// wrong (silent corruption).
pub fn corrupt(blocks: u64) -> Why {
    Why {
        code: OutReason::Corrupt,
        detail: Some(Cow::Owned(format!(
            "returned wrong data in {blocks} block(s) that parity located (silent corruption)"
        ))),
    }
}

/// Its tag blocks (the checksums of its data) could not be written.
pub const TAG_WRITE: Why = Why::new(OutReason::MetadataWrite, "checksum write error");

/// Reads of this many blocks of a member failed their checksums (`--integrity`).
pub fn checksums(blocks: u64) -> Why {
    Why {
        code: OutReason::Corrupt,
        detail: Some(Cow::Owned(format!(
            "returned wrong data in {blocks} block(s) that failed their checksums (silent corruption, lost or misdirected writes)"
        ))),
    }
}
