//! Member devices: the narrow interface the engine drives, and its implementations.
//!
//! Every member has its own queue and its own worker(s): the SBOD rule. Nothing here is
//! shared between members, so a slow member only slows the requests that touch it.

use crate::buf::SharedBuf;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;

/// Who asked: foreground (client I/O), a background process (rebuild, scrub, resync), or
/// the ownership heartbeat (`Urgent`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoClass {
    Foreground,
    Background,
    /// Must not wait behind the member's queue: the owner block's reads and writes, whose
    /// lateness lapses the lease and stops every write (see [`crate::owner`]). Queues
    /// serve it first: the io_uring member skips its waiting requests and asks the kernel
    /// for real-time I/O priority (which mq-deadline dispatches first, and SATA drives
    /// with NCQ priority enabled serve first); the modelled drive serves it next. A few
    /// requests, far apart: never for data.
    Urgent,
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
    /// Usable bytes, as found when the member was opened.
    fn size(&self) -> u64;
    /// The member's size now, asked of the device itself (`fstat` for a file, which can be
    /// truncated under the array; `BLKGETSIZE64` for a block device). The engine asks after
    /// a read error and after writes to files, and fails a member that has shrunk.
    fn current_size(&self) -> io::Result<u64> {
        Ok(self.size())
    }
    /// What a user calls this device (its path).
    fn name(&self) -> &str;
    /// Stop the workers; pending requests complete with an error.
    fn close(&self) {}
    /// Which queue drives the member ("uring", "threads"; empty if not said), for status
    /// and tests.
    fn queue(&self) -> &'static str {
        ""
    }
    /// For members reached over a network: `Some(true)` while the member's host answers
    /// (or is being reconnected to), `Some(false)` once it has stayed unreachable past its
    /// deadline (requests then fail with [`unreachable`] errors). `None` for local devices.
    fn link_up(&self) -> Option<bool> {
        None
    }
    /// The parts of `[offset, offset + len)` (device offsets) that may hold data, as
    /// `(start, end)` pairs in order, rounded out to 4 KiB: every byte outside them reads
    /// back as zeros (the holes of a sparse member file: never written, punched, or zeroed
    /// by `fallocate`). `None` where the device cannot tell (block devices, remote members):
    /// callers then take all of it as data. Blocking (`lseek`): call it off the runtime.
    fn data_ranges(&self, _offset: u64, _len: u64) -> Option<io::Result<Vec<(u64, u64)>>> {
        None
    }
    /// Does [`IoKind::Zero`] with `punch` make the range read as zeros without writing
    /// them: a file (`fallocate` punches a hole), or a block device that takes the
    /// kernel's write-zeroes command (which may unmap: `fallocate` PUNCH_HOLE on the device,
    /// zeros guaranteed, never the plain discard whose contents after are undefined)?
    /// Where not, zeroing writes zeros and costs a write. Default: no.
    fn zeroes_cheaply(&self) -> bool {
        false
    }
    /// Can a write to this member be refused for want of space (ENOSPC, EDQUOT) although
    /// it stays within the member's size? A member file with holes can (writing into a
    /// hole allocates); one with none, on a file system that overwrites in place, cannot
    /// (see `file::SpaceCheck`). The parity family keeps a degraded stripe's old rows, to
    /// put back after such a refusal, only where a member answers yes. Default: yes (a
    /// wrapper that does not know, a fault injector); only asked of members that are
    /// files. May do a cheap syscall now and then (`lseek`).
    fn may_run_out(&self) -> bool {
        true
    }
}

/// The error a network member completes requests with once its host has stayed
/// unreachable past its deadline: the engine fails such a member at once, as a dead disk,
/// rather than counting read errors.
pub fn unreachable(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::NotConnected, msg.into())
}

/// Is this error a member's host being unreachable (see [`unreachable`])?
pub fn is_unreachable(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NotConnected
}

pub(crate) fn closed_err() -> io::Error {
    io::Error::other("member is closed")
}

/// A request with its callback; completes exactly once. If it is dropped unfinished
/// (a channel torn down at shutdown), it completes with "member is closed".
pub(crate) struct Pending {
    req: Option<IoReq>,
    done: Option<Done>,
}

impl Pending {
    pub(crate) fn new(req: IoReq, done: Done) -> Pending {
        Pending {
            req: Some(req),
            done: Some(done),
        }
    }

    pub(crate) fn req(&self) -> &IoReq {
        self.req.as_ref().expect("request already completed")
    }

    pub(crate) fn finish(&mut self, r: io::Result<()>) {
        // Release the buffer before telling the engine, which may reclaim it at once.
        self.req = None;
        if let Some(done) = self.done.take() {
            done(r);
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if self.done.is_some() {
            self.finish(Err(closed_err()));
        }
    }
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

/// Plugging, as the block layer's `blk_plug`: while a plug is held on a thread, member
/// queues that would wake their thread for a new request (io_uring members) note it
/// instead, and the plug wakes each of them once when it is released. A client request
/// submits the chunks of all its stripes in one poll; with the plug held over that poll,
/// every member's thread wakes once, finds the request's chunks for it waiting together,
/// and merges the neighbours into one I/O (instead of waking, and taking one chunk, per
/// submission). See [`plugged`].
pub mod plug {
    use std::cell::RefCell;
    use std::sync::Arc;

    /// Something to wake once the plug is released.
    pub trait Unplug: Send + Sync {
        fn unplug(&self);
    }

    struct State {
        depth: usize,
        held: Vec<Arc<dyn Unplug>>,
    }

    thread_local! {
        static PLUG: RefCell<State> = const { RefCell::new(State { depth: 0, held: Vec::new() }) };
    }

    /// Defer `u`'s wake-up to the release of this thread's plug. False (nothing noted) when
    /// no plug is held: the caller wakes at once.
    pub fn defer(u: &Arc<dyn Unplug>) -> bool {
        PLUG.with(|p| {
            let Ok(mut p) = p.try_borrow_mut() else {
                return false;
            };
            if p.depth == 0 {
                return false;
            }
            if !p.held.iter().any(|h| Arc::ptr_eq(h, u)) {
                p.held.push(u.clone());
            }
            true
        })
    }

    /// Plugging is on unless `SBOD_PLUG=0` (for A/B benchmarks; [`crate::tuning`]).
    fn enabled() -> bool {
        crate::tuning::plug()
    }

    /// A plug held on this thread until dropped (nests; the outermost release wakes).
    pub struct Guard(bool);

    pub fn hold() -> Guard {
        if !enabled() {
            return Guard(false);
        }
        PLUG.with(|p| p.borrow_mut().depth += 1);
        Guard(true)
    }

    impl Drop for Guard {
        fn drop(&mut self) {
            if !self.0 {
                return;
            }
            let held = PLUG.with(|p| {
                let mut p = p.borrow_mut();
                p.depth -= 1;
                if p.depth == 0 {
                    std::mem::take(&mut p.held)
                } else {
                    Vec::new()
                }
            });
            for u in held {
                u.unplug();
            }
        }
    }
}

/// Run `f` with a plug held over each of its polls (see [`plug`]): the member I/Os one
/// poll submits reach their queues' threads together, when the poll returns. Never wait
/// synchronously for a member request inside `f`: its queue's thread would not be woken
/// until the poll ends.
pub async fn plugged<F: Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    std::future::poll_fn(|cx| {
        let _plug = plug::hold();
        f.as_mut().poll(cx)
    })
    .await
}

pub mod file;
pub mod mem;
pub mod uring;

pub use file::{FileDev, InlineDev, OpenOptions};
pub use mem::MemDev;
pub use uring::UringDev;

/// How a file or block-device member is driven.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// One io_uring ring and thread per member ([`UringDev`]).
    Uring,
    /// A small pool of blocking threads per member ([`FileDev`]).
    Threads,
    /// The submitting thread does the I/O ([`InlineDev`]): members in memory (tmpfs).
    Inline,
}

/// The environment variable that forces a backend (`uring`, `threads` or `inline`) for
/// every member this process opens, for tests and benchmarks (read once, [`crate::tuning`]).
/// A forced backend that cannot be set up is an error, never a silent fallback.
pub const BACKEND_ENV: &str = crate::tuning::IO_BACKEND;

impl Backend {
    /// The backend forced by `SBOD_IO`, if any.
    pub fn forced() -> io::Result<Option<Backend>> {
        match crate::tuning::io_backend() {
            Ok(None) => Ok(None),
            Ok(Some("uring")) => Ok(Some(Backend::Uring)),
            Ok(Some("threads")) => Ok(Some(Backend::Threads)),
            Ok(Some(_)) => Ok(Some(Backend::Inline)),
            Err(e) => Err(io::Error::new(io::ErrorKind::InvalidInput, e)),
        }
    }
}

/// Open a member file or block device and attach its queue (see [`attach_member`]).
pub fn open_member(path: &std::path::Path, opts: &OpenOptions) -> io::Result<Arc<dyn BlockDev>> {
    let opened = file::open(path, opts)?;
    attach_member(path.display().to_string(), opened, opts)
}

/// Attach a queue to an opened member: a member in memory (a file on tmpfs or ramfs) does
/// its I/O inline on the submitting thread; otherwise io_uring when `opts.uring`, the
/// kernel allows it (not disabled by sysctl `kernel.io_uring_disabled`, seccomp or age)
/// and the member supports nonblocking I/O (see [`uring::nowait_io`]); else the worker
/// threads, with one log line saying why. `SBOD_IO` overrides all of that.
pub fn attach_member(
    name: String,
    opened: file::Opened,
    opts: &OpenOptions,
) -> io::Result<Arc<dyn BlockDev>> {
    let forced = Backend::forced()?;
    let want = forced.unwrap_or(if file::in_memory(&opened) {
        Backend::Inline
    } else if opts.uring {
        Backend::Uring
    } else {
        Backend::Threads
    });
    let opened = match want {
        Backend::Inline => return Ok(Arc::new(InlineDev::new(name, opened))),
        Backend::Threads => opened,
        Backend::Uring if forced.is_none() && !uring::nowait_io(&opened) => {
            static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
            if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
                tracing::info!(
                    member = %name,
                    "no nonblocking I/O on this file system (io_uring would queue every \
                     request to a kernel worker); such members use worker threads"
                );
            }
            opened
        }
        Backend::Uring => match UringDev::try_new(name.clone(), opened) {
            Ok(dev) => return Ok(Arc::new(dev)),
            Err((e, _)) if forced.is_some() => {
                return Err(io::Error::new(
                    e.kind(),
                    format!("{name}: {BACKEND_ENV}=uring but io_uring cannot be used: {e}"),
                ))
            }
            Err((e, opened)) => {
                static WARNED: std::sync::atomic::AtomicBool =
                    std::sync::atomic::AtomicBool::new(false);
                if !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    tracing::warn!("io_uring unavailable ({e}); members use worker threads");
                } else {
                    tracing::debug!(member = %name, "io_uring unavailable ({e})");
                }
                opened
            }
        },
    };
    Ok(Arc::new(FileDev::new(name, opened, opts.threads)))
}
