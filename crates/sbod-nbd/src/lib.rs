//! The Network Block Device protocol and an async server for sbod.
//!
//! Written here because no usable crate exists: `tokio-nbd` is GPL and panics on structured
//! replies (which libnbd and qemu ask for by default) and `nbd` is synchronous without
//! NBD_OPT_GO/INFO. The protocol is the fixed newstyle handshake with EXPORT_NAME, LIST,
//! ABORT, INFO, GO, STRUCTURED_REPLY, EXTENDED_HEADERS and LIST/SET_META_CONTEXT
//! (`base:allocation`), and the commands READ, WRITE (FUA), FLUSH, TRIM, WRITE_ZEROES
//! (NO_HOLE, FAST_ZERO), CACHE, BLOCK_STATUS and DISC, many requests in flight per
//! connection, replies out of order.
//! The client side ([`client`]) speaks the same protocol to other servers (nbdkit, qemu,
//! `sbod export`) for remote members; [`uri`] parses NBD URIs; [`tls`] does STARTTLS.

pub mod backend;
pub mod client;
pub mod mem;
pub mod proto;
pub mod server;
pub mod tls;
pub mod uri;

pub use backend::{Backend, ExportInfo, Extent, NbdError};
pub use client::{ClientBuf, ClientOptions, Command, Connection, Death, Outcome};
pub use mem::MemBackend;
pub use server::{Limits, Listen, Server, Stats};
pub use uri::NbdUri;
