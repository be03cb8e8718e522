//! Why the I/O path takes a member out of service, in one place: the words the log and
//! `status` show. (The superblock's reason codes name the same cases: a member that shrank,
//! one that returned a short read, a write or repair that failed, blocks a scrub located
//! as corrupt.)

use crate::layout::human;

pub const WRITE_ERROR: &str = "write error";
pub const REBUILD_WRITE: &str = "write error during rebuild";
pub const REPAIR_WRITE: &str = "could not rewrite an unreadable range";
pub const SCRUB_REPAIR_WRITE: &str = "write error during repair";
pub const READ_ERRORS: &str = "too many read errors";
pub const FLUSH_ERROR: &str = "flush error";
/// A remote member whose host cannot be reached (connection refused, reset, timed out).
pub const UNREACHABLE: &str = "unreachable";
pub const BITMAP_WRITE: &str = "bitmap write error";
pub const SHORT_READ: &str =
    "returned a short read inside its data (the device is smaller than it says)";

/// The device got smaller than the data the array keeps on it (a truncated file, a
/// shrunk volume): what lies past the cut is gone, and a file would read back as zeros
/// where a later write grew it again.
pub fn shrank(from: u64, to: u64, need: u64) -> String {
    format!(
        "shrank from {} to {} (the array needs {})",
        human(from),
        human(to),
        human(need)
    )
}

/// A scrub found, with parity that locates the culprit, this many blocks of a member
/// wrong (silent corruption).
pub fn corrupt(blocks: u64) -> String {
    format!("returned wrong data in {blocks} block(s) that parity located (silent corruption)")
}
