//! Test support for sbod's engine: members that fail, stall, flip bits, run out of space
//! or lose their volatile cache on a power cut ([`fault`]). A dev-dependency of the crates
//! whose tests use them (and a dependency of the `sbod-torture` tool), never part of the
//! engine's public API.
//!
//! `sbod-core`'s own unit tests that need these devices (the checksum store across power
//! cuts, `src/integrity/tests.rs`) include `src/fault.rs` as a `cfg(test)` module of the
//! engine instead of depending on this crate: through the crate, a unit test would see a
//! second copy of the engine's types (the engine built once for the test, once for this
//! crate). The file is written against `sbod_core::` paths, which the engine resolves to
//! itself in its tests (`extern crate self as sbod_core`).

// As in sbod-core (whose lint settings this file had there): index loops over parallel
// per-block arrays read better than zipped iterators.
#![allow(clippy::needless_range_loop)]

pub mod fault;
