//! An iSCSI target (RFC 7143) for sbod: a SCSI block device (SBC-3/SPC-4) on the same
//! engine interface the NBD server uses ([`sbod_nbd::Backend`]), so one array serves both.
//!
//! Written here because no Rust crate does it: the pure-Rust iSCSI crates are initiators.
//! [`pdu`] is the wire format, [`login`] the text negotiation and CHAP, [`scsi`] the
//! transport-free SCSI device (an NVMe/TCP target would sit beside [`server`] on the same
//! Backend, docs/NVME-TCP.md), [`pr`] persistent reservations.

pub mod login;
pub mod pdu;
pub mod pr;
pub mod scsi;
pub mod sense;
pub mod server;

pub use login::Chap;
pub use pr::Nexus;
pub use scsi::{Lu, LuConfig};
pub use server::{parse_listen, Limits, Server, Stats, Target};

/// The IQN sbod gives an array: `iqn.2025-01.io.sbod:NAME`.
pub fn default_iqn(name: &str) -> String {
    format!("iqn.2025-01.io.sbod:{}", name.to_ascii_lowercase())
}
