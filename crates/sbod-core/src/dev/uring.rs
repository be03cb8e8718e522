//! Members driven by io_uring: one ring and one thread per member, its own queue.
//!
//! Submitters (any thread) push requests into the member's lock-free MPSC channel and wake
//! the ring thread only when it sleeps: the thread announces sleep in an atomic flag, and the
//! one submitter that clears the flag writes an eventfd that the ring itself reads (an
//! io_uring read of the eventfd is always armed while the thread runs). A busy member costs
//! submitters no syscall at all.
//!
//! The ring thread owns every in-flight request (with its buffer) in a slot table until the
//! kernel posts its completion; short reads/writes and EINTR/EAGAIN are resubmitted for the
//! remainder. Requests that wait together in the queue and are contiguous on the member
//! (the chunks of consecutive stripes a sequential transfer puts on one member) are merged
//! into one vectored read or write of up to [`MERGE_BYTES`]; a merged I/O that fails is
//! issued again request by request, so each request gets its own outcome. In-flight operations never exceed the completion queue's size, so the CQ
//! cannot overflow, and requests beyond the queue depth wait in the channel (backpressure).
//! Zeroing (fallocate / BLKZEROOUT / written zeros, see `file::execute`) may block for long
//! on some file systems and needs its fallback chain, so it runs on a helper thread started
//! on first use, never on the ring thread; the helper hands results back to the ring thread,
//! where every completion callback runs.
//!
//! Hand-written on top of the `io-uring` crate (a thin, well-kept binding) because the
//! runtimes built on it (tokio-uring, glommio, monoio) are stale or want to own the threads
//! and buffers, while the engine hands us its own buffers and completion callbacks.

use super::file::{self, Opened};
use super::{closed_err, BlockDev, Done, IoClass, IoKind, IoReq, Pending};
use crossbeam_channel::{Receiver, Sender, TryRecvError};
use io_uring::{opcode, squeue, types, IoUring};
use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::{JoinHandle, ThreadId};

/// Requests one member keeps in the kernel at once. More wait in the member's channel.
pub const QUEUE_DEPTH: u32 = 256;
/// One read or write never asks the kernel for more than this; the rest follows as a
/// resubmitted remainder (io_uring lengths are 32-bit).
const MAX_CHUNK: usize = 1 << 30;
/// Slots only urgent requests (the ownership heartbeat's, [`IoClass::Urgent`]) may take:
/// with every other slot busy, an owner-block read still reaches the kernel at once instead
/// of waiting in the channel behind the requests a busy member has queued.
const URGENT_SLOTS: usize = 2;
/// The I/O priority urgent requests ask for: the real-time class, level 0
/// (`IOPRIO_PRIO_VALUE(IOPRIO_CLASS_RT, 0)`). mq-deadline dispatches it before the rest,
/// and a SATA drive with NCQ priority enabled (`ncq_prio_enable`) serves it first. A
/// process without CAP_SYS_NICE/CAP_SYS_ADMIN is refused (EPERM): the request goes again
/// without it, and so do the member's later ones. A kernel that refuses the field (EINVAL)
/// is told from a request that is itself invalid by the second try: only when that one is
/// accepted do the later ones go without.
const IOPRIO_RT: u16 = 1 << 13;
/// `user_data` of the eventfd read (slot indices are below QUEUE_DEPTH).
const WAKE: u64 = u64::MAX;
/// The most bytes one merged read or write carries.
pub const MERGE_BYTES: usize = 2 << 20;
/// The most requests merged into one I/O (iovecs of one readv/writev).
const MERGE_REQS: usize = 64;
/// How far back among the requests waiting for submission a new one looks for a neighbour.
const MERGE_LOOKBACK: usize = 8;

/// Merge neighbouring requests (on unless `SBOD_URING_MERGE=0`, which exists for A/B
/// benchmarks: scripts/bench-members.sh, docs/PERFORMANCE.md). Read once ([`crate::tuning`]).
fn merging() -> bool {
    crate::tuning::uring_merge()
}

/// State shared between submitters, `close()` and the ring thread.
struct Shared {
    /// The ring thread is (about to be) blocked in the kernel: the next submitter wakes it.
    sleeping: AtomicBool,
    closed: AtomicBool,
    /// Nonblocking eventfd the ring thread keeps a read armed on.
    wake: OwnedFd,
    /// Requests that rode along in another's I/O (see [`UringDev::merged`]).
    merged: AtomicU64,
    /// The kernel refused real-time I/O priority ([`IOPRIO_RT`]): urgent requests go
    /// without it.
    no_rt: AtomicBool,
}

impl super::plug::Unplug for Shared {
    fn unplug(&self) {
        // As in submit: the ring thread either saw the requests or announced its sleep.
        fence(Ordering::SeqCst);
        if self.sleeping.load(Ordering::Relaxed) && self.sleeping.swap(false, Ordering::AcqRel) {
            self.wake();
        }
    }
}

impl Shared {
    fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to an fd we own. It cannot block
        // (EFD_NONBLOCK) and only fails if the counter would overflow, which a pending
        // wake-up already covers.
        unsafe {
            libc::write(
                self.wake.as_raw_fd(),
                &one as *const u64 as *const libc::c_void,
                8,
            )
        };
    }
}

/// A member driven by its own io_uring ring and thread.
pub struct UringDev {
    name: String,
    size: u64,
    direct: bool,
    probe: file::SizeProbe,
    tx: Sender<Pending>,
    /// Urgent requests: the ring thread takes them before `tx`'s.
    urgent_tx: Sender<Pending>,
    shared: Arc<Shared>,
    /// `shared`, as the plug keeps it (see `dev::plug`).
    unplug: Arc<dyn super::plug::Unplug>,
    thread: parking_lot::Mutex<Option<JoinHandle<()>>>,
    thread_id: ThreadId,
}

/// Can this process use io_uring for members (not disabled by `kernel.io_uring_disabled`,
/// seccomp or an old kernel)? Checked once.
pub fn available() -> io::Result<()> {
    static PROBE: OnceLock<Result<(), (Option<i32>, String)>> = OnceLock::new();
    PROBE
        .get_or_init(|| {
            probe().map_err(|e| {
                (
                    e.raw_os_error(),
                    format!("io_uring is not usable here: {e}"),
                )
            })
        })
        .clone()
        .map_err(|(code, msg)| {
            let kind = code
                .map(|c| io::Error::from_raw_os_error(c).kind())
                .unwrap_or(io::ErrorKind::Unsupported);
            io::Error::new(kind, msg)
        })
}

fn probe() -> io::Result<()> {
    let ring = IoUring::new(4)?;
    let mut probe = io_uring::Probe::new();
    ring.submitter().register_probe(&mut probe)?;
    for (code, name) in [
        (opcode::Read::CODE, "READ"),
        (opcode::Write::CODE, "WRITE"),
        (opcode::Fsync::CODE, "FSYNC"),
    ] {
        if !probe.is_supported(code) {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("the kernel lacks IORING_OP_{name}"),
            ));
        }
    }
    Ok(())
}

/// Can the kernel issue I/O on this member without blocking (RWF_NOWAIT)? Where it cannot,
/// io_uring hands every request to its own kernel worker threads, which is slower than our
/// worker pool (measured on tmpfs: see docs/PERFORMANCE.md), so the automatic choice takes
/// the threads there. Block devices and O_DIRECT files on ext4/xfs/btrfs can; tmpfs, many
/// network and FUSE file systems cannot, nor can buffered writes (a member file whose
/// file system refused O_DIRECT) on most file systems.
pub fn nowait_io(opened: &Opened) -> bool {
    if opened.block_device {
        return true;
    }
    if !opened.direct {
        return false;
    }
    if opened.size < 4096 {
        return true;
    }
    let buf = crate::buf::AlignedBuf::zeroed(4096);
    let iov = libc::iovec {
        iov_base: buf.as_ptr() as *mut libc::c_void,
        iov_len: 4096,
    };
    // SAFETY: one iovec over a live, aligned 4096-byte buffer we own.
    let r = unsafe { libc::preadv2(opened.file.as_raw_fd(), &iov, 1, 0, libc::RWF_NOWAIT) };
    // EAGAIN means "supported, but would block now"; only EOPNOTSUPP says "never".
    r >= 0 || io::Error::last_os_error().raw_os_error() != Some(libc::EOPNOTSUPP)
}

fn new_ring() -> io::Result<IoUring> {
    // Cooperative task running: completions are delivered when the ring thread next enters
    // the kernel (it does so whenever it has nothing else to do) instead of interrupting it.
    // CQ twice the SQ (the default) leaves room for every slot plus the wake-up read.
    let coop = IoUring::builder()
        .setup_coop_taskrun()
        .setup_taskrun_flag()
        .setup_submit_all()
        .build(QUEUE_DEPTH);
    match coop {
        Ok(r) => Ok(r),
        // Kernels before 5.19 refuse the flags; the plain ring works the same, a bit slower.
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => IoUring::new(QUEUE_DEPTH),
        Err(e) => Err(e),
    }
}

impl UringDev {
    /// Attach an io_uring queue to an opened member.
    pub fn new(name: String, opened: Opened) -> io::Result<UringDev> {
        UringDev::try_new(name, opened).map_err(|(e, _)| e)
    }

    /// As `new`, but hands the member back on failure so the caller can fall back.
    pub(crate) fn try_new(name: String, opened: Opened) -> Result<UringDev, (io::Error, Opened)> {
        let setup = || -> io::Result<(IoUring, OwnedFd)> {
            available()?;
            let ring = new_ring()?;
            ring.submitter()
                .register_files(&[opened.file.as_raw_fd()])?;
            // SAFETY: plain syscall; the result is checked before use.
            let efd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
            if efd < 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: efd is a fresh descriptor nobody else owns.
            Ok((ring, unsafe { OwnedFd::from_raw_fd(efd) }))
        };
        let (ring, wake) = match setup() {
            Ok(x) => x,
            Err(e) => return Err((e, opened)),
        };
        if opened.direct && !opened.block_device {
            // Clean page-cache pages of a member file (a copied-in image, a buffered
            // prefill) make every nonblocking O_DIRECT attempt over them fail with EAGAIN
            // and go to io_uring's worker threads. Nothing here uses the page cache.
            // SAFETY: plain syscall on an open fd; failure only costs speed.
            unsafe {
                libc::posix_fadvise(opened.file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED)
            };
        }
        let shared = Arc::new(Shared {
            sleeping: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            wake,
            merged: AtomicU64::new(0),
            no_rt: AtomicBool::new(false),
        });
        let (tx, rx) = crossbeam_channel::unbounded();
        let (urgent_tx, urgent) = crossbeam_channel::unbounded();
        let size = opened.size;
        let direct = opened.direct;
        let efd = shared.wake.as_raw_fd();
        let file = Arc::new(opened.file);
        let worker = Worker {
            ring,
            rx,
            urgent,
            shared: shared.clone(),
            file: file.clone(),
            block_device: opened.block_device,
            efd,
            efd_buf: Box::new(0),
            efd_armed: false,
            slots: (0..QUEUE_DEPTH).map(|_| None).collect(),
            free: (0..QUEUE_DEPTH).rev().collect(),
            ready: VecDeque::new(),
            retry: VecDeque::new(),
            merge: merging(),
            ops: 0,
            merged: 0,
            in_kernel: 0,
            zero: None,
            cqes: Vec::with_capacity(2 * QUEUE_DEPTH as usize),
            name: name.clone(),
        };
        let spawned = std::thread::Builder::new()
            .name("sbod-uring".into())
            .spawn(move || worker.run());
        let handle = match spawned {
            Ok(h) => h,
            Err(e) => {
                // A failed spawn drops the closure, and with it the worker's clone of the file.
                let file = Arc::try_unwrap(file).expect("member file still shared");
                let opened = Opened {
                    file,
                    size,
                    block_device: opened.block_device,
                    direct,
                };
                return Err((e, opened));
            }
        };
        Ok(UringDev {
            name,
            size,
            direct,
            probe: file::SizeProbe::new(file, opened.block_device),
            tx,
            urgent_tx,
            unplug: shared.clone(),
            shared,
            thread_id: handle.thread().id(),
            thread: parking_lot::Mutex::new(Some(handle)),
        })
    }

    /// Whether the member was opened with O_DIRECT.
    pub fn direct(&self) -> bool {
        self.direct
    }

    /// Whether urgent requests still ask for real-time I/O priority (until the kernel
    /// refuses it).
    pub fn real_time_priority(&self) -> bool {
        !self.shared.no_rt.load(Ordering::Relaxed)
    }

    /// Requests so far that were carried by another request's I/O (merged neighbours).
    pub fn merged(&self) -> u64 {
        self.shared.merged.load(Ordering::Relaxed)
    }
}

impl BlockDev for UringDev {
    fn submit(&self, req: IoReq, done: Done) {
        if self.shared.closed.load(Ordering::Acquire) {
            return done(Err(closed_err()));
        }
        self.probe.note(&req);
        if req.class == IoClass::Urgent {
            // Rare (a heartbeat's two per member): always woken, whatever the ring thread
            // announced (it sleeps unannounced while only urgent slots are free).
            if self.urgent_tx.send(Pending::new(req, done)).is_ok() {
                self.shared.wake();
            }
            return;
        }
        // On a disconnected channel the returned request is dropped, which completes it.
        if self.tx.send(Pending::new(req, done)).is_err() {
            return;
        }
        // Under a plug the wake-up waits for the plug's release, so the ring thread finds
        // this request's neighbours waiting with it.
        if super::plug::defer(&self.unplug) {
            return;
        }
        // Pairs with the fence in Worker::run: either the ring thread sees this request
        // before it sleeps, or we see its flag and wake it. Only one submitter pays.
        fence(Ordering::SeqCst);
        if self.shared.sleeping.load(Ordering::Relaxed)
            && self.shared.sleeping.swap(false, Ordering::AcqRel)
        {
            self.shared.wake();
        }
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn current_size(&self) -> io::Result<u64> {
        self.probe.size()
    }

    fn queue(&self) -> &'static str {
        "uring"
    }

    fn data_ranges(&self, offset: u64, len: u64) -> Option<io::Result<Vec<(u64, u64)>>> {
        self.probe.data_ranges(offset, len)
    }

    fn zeroes_cheaply(&self) -> bool {
        self.probe.cheap_zero
    }

    fn may_run_out(&self) -> bool {
        self.probe.may_run_out()
    }

    fn close(&self) {
        self.shared.closed.store(true, Ordering::Release);
        self.probe.release();
        self.shared.wake();
        // From a completion callback on the ring thread itself we cannot wait for it;
        // it sees the flag and winds down on its own.
        if std::thread::current().id() == self.thread_id {
            return;
        }
        if let Some(h) = self.thread.lock().take() {
            let _ = h.join();
        }
    }
}

impl Drop for UringDev {
    fn drop(&mut self) {
        self.close();
    }
}

/// One I/O in the kernel (or ready to go back): its requests own their buffers.
struct Op {
    p: Pending,
    /// Requests merged behind `p`: contiguous on the member, in order, the same kind.
    more: Vec<Pending>,
    /// Bytes of the read/write (all its requests).
    len: usize,
    /// Bytes of a read/write already done.
    progress: usize,
    /// The iovecs of a merged I/O's remainder, while the kernel holds them.
    iov: Iovecs,
    /// Issued alone: a merged I/O that failed, now retried request by request, or an
    /// urgent request.
    alone: bool,
    /// Sent with real-time I/O priority (urgent, until the kernel refuses it).
    rt: bool,
    /// Refused with EINVAL while it asked for real-time priority, and sent again without:
    /// whether the priority was the cause shows in how the second try ends.
    rt_einval: bool,
}

/// iovecs point into the requests' buffers, which the op owns; the ring thread alone
/// touches them.
#[derive(Default)]
struct Iovecs(Vec<libc::iovec>);
// SAFETY: the pointers are into buffers owned by the same op (SharedBuf is Send); the
// iovecs are only read by the kernel while the op sits in its slot.
unsafe impl Send for Iovecs {}

fn buf_of(p: &Pending) -> Option<&crate::buf::SharedBuf> {
    match &p.req().kind {
        IoKind::Read { buf } | IoKind::Write { buf, .. } => Some(buf),
        _ => None,
    }
}

impl Op {
    fn new(p: Pending, alone: bool) -> Op {
        let len = buf_of(&p).map_or(0, |b| b.len());
        Op {
            p,
            more: Vec::new(),
            len,
            progress: 0,
            iov: Iovecs::default(),
            alone,
            rt: false,
            rt_einval: false,
        }
    }

    /// Can `q` join this op, before (`Some(true)`) or after (`Some(false)`) its requests?
    fn joins(&self, q: &Pending) -> Option<bool> {
        if self.alone || self.progress > 0 || self.more.len() + 2 > MERGE_REQS {
            return None;
        }
        let (a, b) = (self.p.req(), q.req());
        let same = match (&a.kind, &b.kind) {
            (IoKind::Read { .. }, IoKind::Read { .. }) => true,
            (IoKind::Write { fua: x, .. }, IoKind::Write { fua: y, .. }) => x == y,
            _ => false,
        };
        let n = buf_of(q)?.len();
        if !same || self.len + n > MERGE_BYTES {
            return None;
        }
        if a.offset + self.len as u64 == b.offset {
            Some(false)
        } else if b.offset + n as u64 == a.offset {
            Some(true)
        } else {
            None
        }
    }

    fn join(&mut self, q: Pending, front: bool) {
        self.len += buf_of(&q).map_or(0, |b| b.len());
        if front {
            let old = std::mem::replace(&mut self.p, q);
            self.more.insert(0, old);
        } else {
            self.more.push(q);
        }
    }

    fn finish(mut self, r: io::Result<()>) {
        for mut q in self.more.drain(..) {
            q.finish(match &r {
                Ok(()) => Ok(()),
                Err(e) => Err(io::Error::new(e.kind(), e.to_string())),
            });
        }
        self.p.finish(r);
    }
}

/// The thread that zeroes ranges with blocking syscalls. It hands each finished request back
/// to the ring thread, so completion callbacks only ever run there (a callback may then
/// close its own member without two threads waiting for each other).
struct ZeroHelper {
    tx: Sender<Pending>,
    done: Receiver<(Pending, io::Result<()>)>,
    thread: JoinHandle<()>,
    /// Requests handed over and not yet back.
    pending: usize,
}

/// The ring thread's state. Only this thread touches the ring.
struct Worker {
    ring: IoUring,
    rx: Receiver<Pending>,
    /// Urgent requests, taken first (see [`URGENT_SLOTS`]).
    urgent: Receiver<Pending>,
    shared: Arc<Shared>,
    file: Arc<File>,
    block_device: bool,
    efd: RawFd,
    /// Target of the eventfd read; boxed so its address is stable while the kernel holds it.
    efd_buf: Box<u64>,
    efd_armed: bool,
    slots: Vec<Option<Op>>,
    free: Vec<u32>,
    /// Slots waiting for (re)submission, in order.
    ready: VecDeque<u32>,
    /// Requests of a merged I/O that failed, to issue again one by one (before new ones).
    retry: VecDeque<Pending>,
    merge: bool,
    /// I/Os issued, and requests that rode along in another's I/O (for the debug log).
    ops: u64,
    merged: u64,
    /// Slots whose SQE is in the rings (submitted or queued in the SQ).
    in_kernel: usize,
    zero: Option<ZeroHelper>,
    /// Completions being handled (kept to reuse its allocation).
    cqes: Vec<(u64, i32)>,
    name: String,
}

impl Worker {
    fn run(mut self) {
        let mut closing = false;
        loop {
            self.reap();
            self.reap_zero();
            closing = closing || self.shared.closed.load(Ordering::Acquire);
            if closing {
                self.refuse_queued();
            } else if !self.accept() {
                // Every handle to the device is gone.
                closing = true;
                continue;
            }
            self.fill(closing);
            if closing && self.in_kernel == 0 && self.zero_pending() == 0 {
                if !self.efd_armed {
                    break;
                }
                // Complete our own wake-up read so nothing is left in the kernel.
                self.shared.wake();
            }
            let cq_empty = self.ring.completion().is_empty();
            let can_take = !closing && self.can_take();
            let zeroed = self.zero.as_ref().is_some_and(|z| !z.done.is_empty());
            if !cq_empty || !self.ready.is_empty() || can_take || zeroed {
                self.enter(0);
                continue;
            }
            // Nothing to do until the kernel completes something or a submitter wakes us.
            // Announce sleep only if a request other than an urgent one could be taken:
            // with every other slot busy a completion is coming anyway, and submitters
            // need not pay for a wake-up (urgent ones always wake us).
            if !closing && self.free_for_any() {
                self.shared.sleeping.store(true, Ordering::Relaxed);
                fence(Ordering::SeqCst);
                if self.can_take() || self.shared.closed.load(Ordering::Relaxed) {
                    self.shared.sleeping.store(false, Ordering::Relaxed);
                    continue;
                }
            }
            self.enter(1);
            self.shared.sleeping.store(false, Ordering::Relaxed);
        }
        if let Some(z) = self.zero.take() {
            // Nothing is pending: the helper is idle and exits when its channel closes.
            drop(z.tx);
            let _ = z.thread.join();
        }
        tracing::debug!(member = %self.name, ios = self.ops, merged = self.merged, "ring thread done");
        // Release the registered file now: a ring torn down by its last close drops it
        // later, from a kernel worker, and the member's lock would outlive close().
        let _ = self.ring.submitter().unregister_files();
    }

    /// Submit what is queued in the SQ and optionally wait for completions.
    fn enter(&mut self, want: usize) {
        match self.ring.submit_and_wait(want) {
            Ok(_) => {}
            Err(e) => match e.raw_os_error() {
                Some(libc::EINTR) => {}
                // Out of kernel resources or completions to reap first: reap and retry.
                Some(libc::EAGAIN) | Some(libc::EBUSY) => std::thread::yield_now(),
                _ => {
                    tracing::error!(member = %self.name, "io_uring_enter failed: {e}");
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
            },
        }
    }

    /// Slots a request other than an urgent one may take.
    fn free_for_any(&self) -> bool {
        self.free.len() > URGENT_SLOTS
    }

    /// Is there a waiting request a free slot can take now?
    fn can_take(&self) -> bool {
        (!self.free.is_empty() && !self.urgent.is_empty())
            || (self.free_for_any() && (!self.rx.is_empty() || !self.retry.is_empty()))
    }

    /// Take new requests while slots are free, urgent ones first (and only they into the
    /// last [`URGENT_SLOTS`]). Returns false once the device is dropped.
    fn accept(&mut self) -> bool {
        while !self.free.is_empty() {
            let Ok(p) = self.urgent.try_recv() else {
                break;
            };
            self.start(p, true);
        }
        while self.free_for_any() {
            let Some(p) = self.retry.pop_front() else {
                break;
            };
            self.start(p, true);
        }
        while self.free_for_any() {
            let p = match self.rx.try_recv() {
                Ok(p) => p,
                Err(TryRecvError::Empty) => return true,
                Err(TryRecvError::Disconnected) => return false,
            };
            self.start(p, false);
        }
        true
    }

    fn start(&mut self, mut p: Pending, alone: bool) {
        let empty = match &p.req().kind {
            IoKind::Read { buf } | IoKind::Write { buf, .. } => buf.is_empty(),
            IoKind::Flush => false,
            IoKind::Zero { .. } => return self.zero(p),
        };
        if empty {
            return p.finish(Ok(()));
        }
        if !alone && self.merge {
            // A neighbour on the member among the I/Os not yet submitted: ride along.
            for &slot in self.ready.iter().rev().take(MERGE_LOOKBACK) {
                let op = self.slots[slot as usize].as_mut().expect("op in slot");
                if let Some(front) = op.joins(&p) {
                    op.join(p, front);
                    self.merged += 1;
                    self.shared.merged.fetch_add(1, Ordering::Relaxed);
                    return;
                }
            }
        }
        let urgent = p.req().class == IoClass::Urgent;
        let slot = self.free.pop().expect("a free slot");
        let mut op = Op::new(p, alone);
        op.rt = urgent && !self.shared.no_rt.load(Ordering::Relaxed);
        self.slots[slot as usize] = Some(op);
        if urgent {
            // Ahead of the I/Os not yet in the submission queue.
            self.ready.push_front(slot);
        } else {
            self.ready.push_back(slot);
        }
    }

    /// Hand a zeroing request to the helper thread (started on first use).
    fn zero(&mut self, mut p: Pending) {
        if self.zero.is_none() {
            let (tx, rx) = crossbeam_channel::unbounded::<Pending>();
            let (done_tx, done) = crossbeam_channel::unbounded();
            let file = self.file.clone();
            let block_device = self.block_device;
            let shared = self.shared.clone();
            let spawned = std::thread::Builder::new()
                .name("sbod-uring-zero".into())
                .spawn(move || {
                    for p in rx {
                        let r = file::execute(&file, block_device, p.req());
                        // The ring thread waits for every zeroing before it exits, so this
                        // send succeeds (were it refused, dropping p would complete it).
                        let _ = done_tx.send((p, r));
                        shared.wake();
                    }
                });
            match spawned {
                Ok(thread) => {
                    self.zero = Some(ZeroHelper {
                        tx,
                        done,
                        thread,
                        pending: 0,
                    })
                }
                Err(e) => return p.finish(Err(e)),
            }
        }
        if let Some(z) = &mut self.zero {
            z.pending += 1;
            // The helper only exits when we drop tx, after every pending request is back.
            let _ = z.tx.send(p);
        }
    }

    fn zero_pending(&self) -> usize {
        self.zero.as_ref().map_or(0, |z| z.pending)
    }

    /// Complete the zeroing requests the helper has finished.
    fn reap_zero(&mut self) {
        if let Some(z) = &mut self.zero {
            while let Ok((mut p, r)) = z.done.try_recv() {
                z.pending -= 1;
                p.finish(r);
            }
        }
    }

    /// Shutting down: everything not yet in the kernel fails; what is in flight finishes.
    fn refuse_queued(&mut self) {
        while let Ok(p) = self.rx.try_recv() {
            drop(p);
        }
        while let Ok(p) = self.urgent.try_recv() {
            drop(p);
        }
        self.retry.clear();
        while let Some(slot) = self.ready.pop_front() {
            if let Some(op) = self.slots[slot as usize].take() {
                op.finish(Err(closed_err()));
            }
            self.free.push(slot);
        }
    }

    /// Push ready slots (and the wake-up read) into the SQ while it has room.
    fn fill(&mut self, closing: bool) {
        // While shutting down the read stays armed only for the zeroing helper's wake-ups.
        if !self.efd_armed && (!closing || self.zero_pending() > 0) {
            let e = opcode::Read::new(types::Fd(self.efd), &mut *self.efd_buf as *mut u64 as _, 8)
                .build()
                .user_data(WAKE);
            // SAFETY: efd_buf is a heap u64 owned by this worker, which outlives the read:
            // run() only returns once no read is armed.
            if unsafe { self.ring.submission().push(&e) }.is_ok() {
                self.efd_armed = true;
            }
        }
        while let Some(&slot) = self.ready.front() {
            let e = self.sqe(slot);
            // SAFETY: the SQE points into the op's buffer; the op (holding an Arc to that
            // buffer) stays in its slot until the kernel posts the completion.
            if unsafe { self.ring.submission().push(&e) }.is_err() {
                // SQ full: submit and come back for the rest.
                break;
            }
            self.ready.pop_front();
            self.in_kernel += 1;
            self.ops += 1;
        }
    }

    fn sqe(&mut self, slot: u32) -> squeue::Entry {
        let op = self.slots[slot as usize].as_mut().expect("op in slot");
        let fd = types::Fixed(0);
        if !op.more.is_empty() {
            // A merged I/O: one iovec per request, less what is already done.
            let Op {
                p,
                more,
                progress,
                iov,
                ..
            } = op;
            iov.0.clear();
            let mut skip = *progress;
            for q in std::iter::once(&*p).chain(more.iter()) {
                let b = buf_of(q).expect("merged requests carry buffers");
                if skip >= b.len() {
                    skip -= b.len();
                    continue;
                }
                iov.0.push(libc::iovec {
                    // SAFETY (pointer arithmetic): skip < b.len().
                    iov_base: unsafe { b.as_mut_ptr().add(skip) } as *mut libc::c_void,
                    iov_len: b.len() - skip,
                });
                skip = 0;
            }
            let req = p.req();
            let off = req.offset + *progress as u64;
            let (ptr, n) = (iov.0.as_ptr(), iov.0.len() as u32);
            let e = match &req.kind {
                IoKind::Read { .. } => opcode::Readv::new(fd, ptr, n).offset(off).build(),
                IoKind::Write { fua, .. } => opcode::Writev::new(fd, ptr, n)
                    .offset(off)
                    .rw_flags(if *fua { libc::RWF_DSYNC } else { 0 })
                    .build(),
                _ => unreachable!("only reads and writes merge"),
            };
            return e.user_data(slot as u64);
        }
        let req = op.p.req();
        let prio = if op.rt { IOPRIO_RT } else { 0 };
        let e = match &req.kind {
            IoKind::Read { buf } => {
                let len = (buf.len() - op.progress).min(MAX_CHUNK);
                // SAFETY (pointer arithmetic): progress < buf.len().
                let ptr = unsafe { buf.as_mut_ptr().add(op.progress) };
                opcode::Read::new(fd, ptr, len as u32)
                    .offset(req.offset + op.progress as u64)
                    .ioprio(prio)
                    .build()
            }
            IoKind::Write { buf, fua } => {
                let len = (buf.len() - op.progress).min(MAX_CHUNK);
                // SAFETY (pointer arithmetic): progress < buf.len().
                let ptr = unsafe { buf.as_ptr().add(op.progress) };
                opcode::Write::new(fd, ptr, len as u32)
                    .offset(req.offset + op.progress as u64)
                    .ioprio(prio)
                    .rw_flags(if *fua { libc::RWF_DSYNC } else { 0 })
                    .build()
            }
            IoKind::Flush => opcode::Fsync::new(fd)
                .flags(types::FsyncFlags::DATASYNC)
                .build(),
            IoKind::Zero { .. } => unreachable!("zeroing runs on the helper thread"),
        };
        e.user_data(slot as u64)
    }

    /// Handle every posted completion.
    fn reap(&mut self) {
        let cq = self.ring.completion();
        if cq.overflow() > 0 {
            // Cannot happen while in-flight ops fit the CQ; with IORING_FEAT_NODROP the
            // kernel would keep them anyway and hand them over on the next enter.
            tracing::warn!(member = %self.name, "io_uring completion queue overflowed");
        }
        let mut done = std::mem::take(&mut self.cqes);
        done.extend(cq.map(|c| (c.user_data(), c.result())));
        for &(ud, res) in &done {
            if ud == WAKE {
                self.efd_armed = false;
                continue;
            }
            self.complete(ud as u32, res);
        }
        done.clear();
        self.cqes = done;
    }

    fn complete(&mut self, slot: u32, res: i32) {
        self.in_kernel -= 1;
        let op = self.slots[slot as usize]
            .as_mut()
            .expect("completion for a live op");
        if !op.more.is_empty()
            && (res == 0 || (res < 0 && res != -libc::EINTR && res != -libc::EAGAIN))
        {
            // A merged I/O failed (or met the member's end): issue its requests one by
            // one, so that each gets its own outcome.
            let op = self.slots[slot as usize].take().expect("live op");
            self.free.push(slot);
            self.retry.push_back(op.p);
            self.retry.extend(op.more);
            return;
        }
        if op.rt && (res == -libc::EPERM || res == -libc::EINVAL) {
            // Real-time priority refused: again without. EPERM is the priority (no
            // capability for it): from now on without. EINVAL may be the request's own
            // (a misaligned buffer, say): the second try tells.
            op.rt = false;
            if res == -libc::EPERM {
                self.shared.no_rt.store(true, Ordering::Relaxed);
            } else {
                op.rt_einval = true;
            }
            self.ready.push_front(slot);
            return;
        }
        if std::mem::take(&mut op.rt_einval) && res != -libc::EINVAL {
            // Without the priority it was accepted: the priority was refused.
            self.shared.no_rt.store(true, Ordering::Relaxed);
        }
        let len = op.len;
        let outcome: Option<io::Result<()>> = if res == -libc::EINTR || res == -libc::EAGAIN {
            None
        } else if res < 0 {
            Some(Err(io::Error::from_raw_os_error(-res)))
        } else {
            match &op.p.req().kind {
                IoKind::Read { .. } | IoKind::Write { .. } => {
                    let write = matches!(op.p.req().kind, IoKind::Write { .. });
                    if res == 0 {
                        Some(Err(if write {
                            io::Error::new(io::ErrorKind::WriteZero, "member accepted no bytes")
                        } else {
                            io::Error::new(
                                io::ErrorKind::UnexpectedEof,
                                "read past the end of the member",
                            )
                        }))
                    } else {
                        op.progress += res as usize;
                        (op.progress >= len).then_some(Ok(()))
                    }
                }
                _ => Some(Ok(())),
            }
        };
        match outcome {
            // Short transfer or a transient error: send the remainder again.
            None => self.ready.push_back(slot),
            Some(r) => {
                let op = self.slots[slot as usize].take().expect("live op");
                self.free.push(slot);
                op.finish(r);
            }
        }
    }
}
