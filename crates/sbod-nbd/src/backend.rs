//! What an export must provide.

use std::future::Future;

/// An export's size, constraints and capabilities, as advertised to clients.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportInfo {
    pub size: u64,
    /// Power of two, at most 64 KiB.
    pub min_block: u32,
    /// Power of two, at least 512 and `min_block`.
    pub preferred_block: u32,
    pub max_payload: u32,
    pub read_only: bool,
    pub can_flush: bool,
    pub can_fua: bool,
    pub can_trim: bool,
    pub can_write_zeroes: bool,
    /// Only if a FLUSH on one connection covers writes completed on every connection.
    pub can_multi_conn: bool,
    pub description: Option<String>,
}

/// One extent of a `base:allocation` answer (NBD block status): `length` bytes with the
/// same status, `flags` of [`crate::proto::STATE_HOLE`] and [`crate::proto::STATE_ZERO`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    pub length: u64,
    pub flags: u32,
}

impl Extent {
    /// Allocated, contents not known to be zero: what may always be said.
    pub fn data(length: u64) -> Extent {
        Extent { length, flags: 0 }
    }

    /// A hole that reads back as zeros.
    pub fn hole(length: u64) -> Extent {
        Extent {
            length,
            flags: crate::proto::STATE_HOLE | crate::proto::STATE_ZERO,
        }
    }
}

/// Errors a backend reports; mapped to the spec's error values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NbdError {
    #[error("input/output error")]
    Io,
    #[error("invalid argument")]
    Inval,
    #[error("no space left")]
    NoSpc,
    #[error("operation not permitted")]
    Perm,
    #[error("operation not supported")]
    NotSup,
    #[error("value too large")]
    Overflow,
    #[error("server is shutting down")]
    ShutDown,
}

impl NbdError {
    pub fn code(self) -> u32 {
        use crate::proto::*;
        match self {
            NbdError::Io => EIO,
            NbdError::Inval => EINVAL,
            NbdError::NoSpc => ENOSPC,
            NbdError::Perm => EPERM,
            NbdError::NotSup => ENOTSUP,
            NbdError::Overflow => EOVERFLOW,
            NbdError::ShutDown => ESHUTDOWN,
        }
    }
}

/// A block device behind an export. Requests reaching it are already validated against
/// `info()` (in range, allowed) and, but for the `*_unaligned` calls, aligned to
/// `min_block`; many run concurrently, from any number of connections.
pub trait Backend: Send + Sync + 'static {
    /// Buffers the backend wants payloads in (e.g. aligned for O_DIRECT), so WRITE payloads
    /// are read from the socket straight into them.
    type Buf: AsRef<[u8]> + AsMut<[u8]> + Send + 'static;

    fn info(&self) -> ExportInfo;
    fn alloc(&self, len: usize) -> Self::Buf;
    /// A count the server keeps of the WRITEs it has received for this backend and not
    /// finished: one is added when a WRITE's header arrives (before its payload is read)
    /// and taken off once its reply is made. The backend learns from it that more writes
    /// are here while it works on one, before their tasks start (sbod's parity arrays: a
    /// sequential stream's split stripe waits for the next request's half instead of
    /// reading the rest). None (the default): not kept.
    fn queued_writes(&self) -> Option<std::sync::Arc<std::sync::atomic::AtomicUsize>> {
        None
    }
    fn read(
        &self,
        offset: u64,
        len: u32,
    ) -> impl Future<Output = Result<Self::Buf, NbdError>> + Send;
    fn write(
        &self,
        offset: u64,
        data: Self::Buf,
        fua: bool,
    ) -> impl Future<Output = Result<(), NbdError>> + Send;
    fn flush(&self) -> impl Future<Output = Result<(), NbdError>> + Send;
    fn trim(
        &self,
        offset: u64,
        len: u32,
        fua: bool,
    ) -> impl Future<Output = Result<(), NbdError>> + Send;
    fn write_zeroes(
        &self,
        offset: u64,
        len: u32,
        fua: bool,
        no_hole: bool,
    ) -> impl Future<Output = Result<(), NbdError>> + Send;
    /// A write not aligned to `min_block` (from a client that did not agree to the block
    /// size). The backend merges the blocks it covers in part with what they hold,
    /// atomically with every other write to them: the server keeps no lock of its own,
    /// so a backend that read, merged and wrote without one would let concurrent writes
    /// (from other connections, or aligned ones on this one) lose each other's bytes.
    fn write_unaligned(
        &self,
        offset: u64,
        data: Self::Buf,
        fua: bool,
    ) -> impl Future<Output = Result<(), NbdError>> + Send;
    /// Zeroes not aligned to `min_block`, merged as by `write_unaligned`.
    fn write_zeroes_unaligned(
        &self,
        offset: u64,
        len: u32,
        fua: bool,
        no_hole: bool,
    ) -> impl Future<Output = Result<(), NbdError>> + Send;
    /// `base:allocation` of `[offset, offset + len)` (NBD_CMD_BLOCK_STATUS): consecutive
    /// extents from `offset`, covering the range or a prefix of it (at least one byte).
    /// An extent marked [`crate::proto::STATE_ZERO`] MUST read back as zeros until
    /// written; when in doubt, say data. The default says data for all of it.
    fn block_status(
        &self,
        _offset: u64,
        len: u64,
    ) -> impl Future<Output = Result<Vec<Extent>, NbdError>> + Send {
        async move { Ok(vec![Extent::data(len)]) }
    }
    /// NBD_CMD_CACHE: the client will read this range soon. Advisory; the default does
    /// nothing.
    fn cache(&self, _offset: u64, _len: u64) -> impl Future<Output = Result<(), NbdError>> + Send {
        async { Ok(()) }
    }
    /// Would zeroing this range be faster than writing zeros to it (NBD's fast zero)? A
    /// WRITE_ZEROES with NBD_CMD_FLAG_FAST_ZERO fails at once with ENOTSUP when not. The
    /// default: no.
    fn fast_zero(&self, _offset: u64, _len: u64) -> bool {
        false
    }
}
