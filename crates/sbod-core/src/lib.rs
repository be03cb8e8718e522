//! sbod's array engine.
//!
//! Layers, each using only the ones above it in this list:
//!
//! - [`layout`] (the geometry) and [`placement`] (the one map from volume offsets to
//!   members and back); [`superblock`], [`freshness`] (which copy is trusted), [`bitmap`],
//!   [`locks`], [`dev`] (every member its own queue: the SBOD rule), [`buf`];
//! - [`member`]: the members and the membership snapshot every layer reads;
//! - [`datapath`]: what client I/O and background processes share, the member I/O layer
//!   and the write-intent bitmap on the members;
//! - [`family`]: one module per RAID family (plain, mirror, parity) behind one interface,
//!   with stripe planning apart from its execution;
//! - [`array`]: the core that owns members, state and background processes: creation,
//!   assembly, membership changes, persistence, client entry points, processes;
//! - [`sync`] (what FLUSH and FUA do) and [`log`] (the log devices: a journal of stripe
//!   writes, replayed at assembly).
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

/// The background processes' handles and statuses.
pub mod process {
    pub use crate::array::process::{MismatchRegion, ProcessHandle, ProcessKind, ProcessStatus};
}

pub use array::{AddOutcome, Array, AssembleOptions, CreateSpec, MemberSpec, ReAdd};
pub use buf::AlignedBuf;
pub use error::{Error, Result};
pub use layout::{Geometry, Level};
