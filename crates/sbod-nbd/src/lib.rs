//! The Network Block Device protocol and an async server for sbod.
//!
//! Written here because no usable crate exists: `tokio-nbd` is GPL and panics on structured
//! replies (which libnbd and qemu ask for by default) and `nbd` is synchronous without
//! NBD_OPT_GO/INFO. The protocol is the fixed newstyle handshake with EXPORT_NAME, LIST,
//! ABORT, INFO, GO and STRUCTURED_REPLY, and the commands READ, WRITE (FUA), FLUSH, TRIM,
//! WRITE_ZEROES and DISC, many requests in flight per connection, replies out of order.

pub mod backend;
pub mod mem;
pub mod proto;
pub mod server;

pub use backend::{Backend, ExportInfo, NbdError};
pub use mem::MemBackend;
pub use server::{Listen, Server, Stats};
