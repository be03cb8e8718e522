//! sbod's array engine.
//!
//! Layers, each using only its own and the ones above it in this list (docs/ENGINE.md has
//! the table, and `tests/layering.rs` checks it):
//!
//! - [`error`] and [`tuning`] (the knobs, read once);
//! - [`layout`] (the geometry) and [`placement`] (the one map from volume offsets to
//!   members and back);
//! - on-disk records: [`superblock`], [`freshness`] (which copy is trusted), [`bitmap`],
//!   [`signature`] (other software's), [`reason`] (why a member was taken out), the log's
//!   record format;
//! - members: [`dev`] (every member its own queue: the SBOD rule), [`buf`], [`member`]
//!   (the membership snapshot every layer reads), [`locks`], [`integrity`] (the
//!   checksums and their cache), [`log`] (the log device, and the array's log as recorded),
//!   [`sync`] (the sync mode's state: what FLUSH and FUA do);
//! - [`datapath`]: what client I/O and background processes share, the member I/O layer,
//!   the write-intent bitmap and the checksums on the members;
//! - `family`: one module per RAID family (plain, mirror, parity) behind one interface,
//!   with stripe planning apart from its execution, and write coalescing;
//! - [`array`]: the core that owns members, state and background processes: creation,
//!   assembly, membership changes, persistence, client entry points, processes, the sync
//!   mode's and the log's array side (`array/sync.rs`, `array/log.rs`).
//!
//! The I/O path takes no global lock: state is a snapshot swapped atomically on (rare)
//! changes, stripes are ordered by sharded locks, and the write-intent bitmap's fast path
//! is one atomic per region. The codec crate does the parity math.

// Index loops over parallel per-shard arrays read better than zipped iterators here.
#![allow(clippy::needless_range_loop)]

pub mod array;
pub mod bitmap;
pub mod buf;
pub mod datapath;
pub mod dev;
pub mod error;
pub(crate) mod family;
pub mod freshness;
pub mod integrity;
pub mod layout;
pub mod locks;
pub mod log;
pub mod member;
pub mod owner;
pub mod placement;
pub mod reason;
pub mod signature;
pub mod superblock;
pub mod sync;
pub mod tuning;

// The fault and power-cut devices (`crates/sbod-testkit`), for the unit tests that need
// them, compiled into the engine's own test build: through the testkit crate they would
// bring a second copy of the engine's types. See `sbod_testkit`'s documentation.
#[cfg(test)]
extern crate self as sbod_core;
#[cfg(test)]
#[allow(dead_code)] // only the power-cut device is used here
#[path = "../../sbod-testkit/src/fault.rs"]
pub(crate) mod fault;

/// The background processes' handles and statuses.
pub mod process {
    pub use crate::array::process::reshape::{Hook as ReshapeHook, Step as ReshapeStep};
    pub use crate::array::process::{MismatchRegion, ProcessHandle, ProcessKind, ProcessStatus};
}

pub use array::{
    read_superblock, AddOutcome, Array, AssembleOptions, CreateSpec, GrowOutcome, MemberSpec,
    ReAdd, SizeTarget,
};
pub use buf::AlignedBuf;
pub use error::{Error, Result};
pub use layout::{Geometry, Level};
