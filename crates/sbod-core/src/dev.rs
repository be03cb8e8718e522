//! Member devices: the narrow interface the engine drives, and its implementations.
//!
//! Every member has its own queue and its own worker(s): the SBOD rule. Nothing here is
//! shared between members, so a slow member only slows the requests that touch it.

use crate::buf::SharedBuf;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;

/// Who asked: foreground (client I/O) or a background process (rebuild, scrub, resync).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoClass {
    Foreground,
    Background,
}

#[derive(Debug)]
pub enum IoKind {
    /// Fill `buf` from `offset`.
    Read { buf: SharedBuf },
    /// Write `buf` at `offset`; with `fua`, durable before completion.
    Write { buf: SharedBuf, fua: bool },
    /// Make every completed write durable.
    Flush,
    /// Make `len` bytes at `offset` read back as zeros; with `punch`, deallocate them too
    /// where the member can (thin files). Never leaves old data behind.
    Zero { len: u64, punch: bool },
}

#[derive(Debug)]
pub struct IoReq {
    pub offset: u64,
    pub kind: IoKind,
    pub class: IoClass,
}

/// Completion callback. Runs on the member's I/O thread: keep it short.
pub type Done = Box<dyn FnOnce(io::Result<()>) + Send>;

/// A member device. Implementations must be safe to call from many threads at once and
/// must complete every request exactly once (also on error and on shutdown).
pub trait BlockDev: Send + Sync {
    fn submit(&self, req: IoReq, done: Done);
    /// Usable bytes.
    fn size(&self) -> u64;
    /// What a user calls this device (its path).
    fn name(&self) -> &str;
    /// Stop the workers; pending requests complete with an error.
    fn close(&self) {}
}

/// Submit and wait.
pub fn io(dev: &Arc<dyn BlockDev>, req: IoReq) -> impl Future<Output = io::Result<()>> + Send {
    let (tx, rx) = tokio::sync::oneshot::channel();
    dev.submit(
        req,
        Box::new(move |r| {
            let _ = tx.send(r);
        }),
    );
    async move {
        rx.await
            .unwrap_or_else(|_| Err(io::Error::other("member queue dropped the request")))
    }
}

pub type BoxFut<T> = Pin<Box<dyn Future<Output = T> + Send>>;

pub fn read_at(
    dev: &Arc<dyn BlockDev>,
    offset: u64,
    buf: SharedBuf,
    class: IoClass,
) -> impl Future<Output = io::Result<()>> + Send {
    io(
        dev,
        IoReq {
            offset,
            kind: IoKind::Read { buf },
            class,
        },
    )
}

pub fn write_at(
    dev: &Arc<dyn BlockDev>,
    offset: u64,
    buf: SharedBuf,
    fua: bool,
    class: IoClass,
) -> impl Future<Output = io::Result<()>> + Send {
    io(
        dev,
        IoReq {
            offset,
            kind: IoKind::Write { buf, fua },
            class,
        },
    )
}

pub fn flush(dev: &Arc<dyn BlockDev>) -> impl Future<Output = io::Result<()>> + Send {
    io(
        dev,
        IoReq {
            offset: 0,
            kind: IoKind::Flush,
            class: IoClass::Foreground,
        },
    )
}

pub mod fault;
pub mod file;
pub mod mem;

pub use file::{FileDev, OpenOptions};
pub use mem::MemDev;
