//! The NBD server's integration tests, one module a file, built as one test binary (see
//! sbod-core's tests/engine.rs): `cargo test -p sbod-nbd --test nbd -- fuzz::`.

mod common;

mod block_status;
mod clients;
mod fuzz;
mod hostile;
mod limits;
