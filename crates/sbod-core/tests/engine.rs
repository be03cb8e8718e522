//! The engine's integration tests, one module a file, built as one test binary: each
//! binary of its own linked sbod-core and its dependencies again (24 of them were 650 s of
//! a 2-core CI build's 1400). Run a file's tests with its module path:
//! `cargo test -p sbod-core --test engine -- model::`.

mod torture_util;

mod allocation;
mod declustered_rebuild;
mod files;
mod grow;
mod integrity;
mod layering;
mod lifecycle;
mod log;
mod log_array;
mod log_damage;
mod model;
mod replace_crash;
mod reshape_powercut;
mod spare_nospace;
mod sync_modes;
mod torture_faults;
mod torture_fuzz;
mod torture_powercut;
mod torture_restart;
mod trim_blockdev;
mod trust_io;
mod tuning;
mod two_heads;
mod uring;
