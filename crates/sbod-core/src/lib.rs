//! sbod's array engine.
//!
//! One core ([`Array`]) owns the members, their state and the background processes
//! (rebuild, scrub, resync); the layout module maps logical addresses to members; the codec
//! crate does the parity math. Every member has its own queue ([`dev::BlockDev`]); the I/O
//! path takes no global lock: state is a snapshot swapped atomically on (rare) changes,
//! stripes are ordered by sharded locks, and the write-intent bitmap's fast path is one
//! atomic per region.

// Index loops over parallel per-shard arrays read better than zipped iterators here.
#![allow(clippy::needless_range_loop)]

pub mod array;
pub mod bitmap;
pub mod buf;
pub mod dev;
pub mod error;
pub mod freshness;
mod io;
pub mod layout;
pub mod locks;
pub mod log;
mod membership;
pub mod process;
pub mod reason;
pub mod signature;
pub mod superblock;
pub mod sync;

pub use array::{AddOutcome, Array, AssembleOptions, CreateSpec, MemberSpec, ReAdd};
pub use buf::AlignedBuf;
pub use error::{Error, Result};
pub use layout::{Geometry, Level};
