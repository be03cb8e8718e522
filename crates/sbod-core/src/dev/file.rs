//! Members that are regular files or block devices, driven by blocking syscalls on a small
//! pool of threads owned by each member (the portable path; see `uring` for io_uring).

use super::{closed_err, BlockDev, Done, IoKind, IoReq, Pending};
use std::fs::File;
use std::io;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::sync::Arc;
use std::thread::JoinHandle;

const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
const BLKSSZGET: libc::c_ulong = 0x1268;
const BLKZEROOUT: libc::c_ulong = 0x127f;

/// How to open a member.
#[derive(Clone, Debug)]
pub struct OpenOptions {
    /// Use O_DIRECT where the file system supports it.
    pub direct: bool,
    /// Refuse a member another process holds (flock on files, O_EXCL on block devices).
    pub exclusive: bool,
    /// Worker threads for the blocking path.
    pub threads: usize,
    /// Use io_uring when the kernel allows it.
    pub uring: bool,
    /// Read-only (examine).
    pub read_only: bool,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            direct: true,
            exclusive: true,
            threads: 4,
            uring: true,
            read_only: false,
        }
    }
}

/// An opened member file or device, before a queue is attached.
pub struct Opened {
    pub file: File,
    pub size: u64,
    pub block_device: bool,
    pub direct: bool,
}

fn os_err(what: &str, path: &Path) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
}

/// Retry `busy()` while it says the device is held, for a few seconds. A process that
/// was killed with I/O in flight keeps its member files locked (and block devices claimed)
/// until the kernel has torn its io_uring down, a few to tens of milliseconds after it is
/// reaped; a restart in that window must not take the member for one in use (and assemble
/// without it). Returns whether it is still busy.
fn busy_for_a_moment(mut busy: impl FnMut() -> bool) -> bool {
    let t = std::time::Instant::now();
    while busy() {
        if t.elapsed() > std::time::Duration::from_secs(3) {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    false
}

/// Open a member: O_DIRECT if possible, exclusively, and learn its size.
pub fn open(path: &Path, opts: &OpenOptions) -> io::Result<Opened> {
    let meta = std::fs::metadata(path)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
    let block_device = meta.file_type().is_block_device();
    if !block_device && !meta.file_type().is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{} is neither a block device nor a regular file",
                path.display()
            ),
        ));
    }
    let open_with = |direct: bool| -> io::Result<File> {
        let mut flags = 0;
        if direct {
            flags |= libc::O_DIRECT;
        }
        if block_device && opts.exclusive {
            flags |= libc::O_EXCL;
        }
        std::fs::OpenOptions::new()
            .read(true)
            .write(!opts.read_only)
            .custom_flags(flags)
            .open(path)
    };
    let mut direct = opts.direct;
    let mut first = None;
    busy_for_a_moment(|| {
        let r = open_with(direct);
        let busy = matches!(&r, Err(e) if e.raw_os_error() == Some(libc::EBUSY));
        first = Some(r);
        busy
    });
    let file = match first.expect("tried once") {
        Ok(f) => f,
        Err(e) if direct && e.raw_os_error() == Some(libc::EINVAL) => {
            direct = false;
            open_with(false)?
        }
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
            return Err(io::Error::new(
                io::ErrorKind::ResourceBusy,
                format!(
                    "{} is in use (mounted, or held by another program)",
                    path.display()
                ),
            ))
        }
        Err(e) => return Err(io::Error::new(e.kind(), format!("{}: {e}", path.display()))),
    };
    let fd = file.as_raw_fd();
    if !block_device && opts.exclusive {
        let lock = if opts.read_only {
            libc::LOCK_SH
        } else {
            libc::LOCK_EX
        };
        let mut failed = None;
        busy_for_a_moment(|| {
            // SAFETY: fd is open.
            if unsafe { libc::flock(fd, lock | libc::LOCK_NB) } == 0 {
                failed = None;
                return false;
            }
            let e = io::Error::last_os_error();
            let busy = e.raw_os_error() == Some(libc::EWOULDBLOCK);
            failed = Some(e);
            busy
        });
        if let Some(e) = failed {
            if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                return Err(io::Error::new(
                    io::ErrorKind::ResourceBusy,
                    format!("{} is in use by another sbod process", path.display()),
                ));
            }
            return Err(io::Error::new(
                e.kind(),
                format!("lock {}: {e}", path.display()),
            ));
        }
    }
    let size = if block_device {
        let mut size: u64 = 0;
        // SAFETY: BLKGETSIZE64 writes a u64.
        if unsafe { libc::ioctl(fd, BLKGETSIZE64 as _, &mut size) } != 0 {
            return Err(os_err("size of", path));
        }
        let mut lbs: libc::c_int = 0;
        // SAFETY: BLKSSZGET writes an int.
        if unsafe { libc::ioctl(fd, BLKSSZGET as _, &mut lbs) } == 0 && lbs > 4096 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} has {lbs}-byte logical blocks; sbod needs 4096 or less",
                    path.display()
                ),
            ));
        }
        size
    } else {
        meta.len()
    };
    // Some file systems accept O_DIRECT at open and refuse it at I/O: probe one block.
    if direct && size >= 4096 {
        let buf = crate::buf::AlignedBuf::zeroed(4096);
        // SAFETY: buf is 4096 bytes, aligned.
        let r = unsafe { libc::pread(fd, buf.as_ptr() as *mut libc::c_void, 4096, 0) };
        if r < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::EINVAL) {
            drop(file);
            direct = false;
            let file = open_with(false)?;
            return Ok(Opened {
                file,
                size,
                block_device,
                direct,
            });
        }
    }
    Ok(Opened {
        file,
        size,
        block_device,
        direct,
    })
}

/// The size of an open member now: `fstat` for a file, `BLKGETSIZE64` for a block device.
pub fn current_size(file: &File, block_device: bool) -> io::Result<u64> {
    let fd = file.as_raw_fd();
    if block_device {
        let mut size: u64 = 0;
        // SAFETY: BLKGETSIZE64 writes a u64.
        if unsafe { libc::ioctl(fd, BLKGETSIZE64 as _, &mut size) } != 0 {
            return Err(io::Error::last_os_error());
        }
        return Ok(size);
    }
    // SAFETY: fstat fills the zeroed struct we pass; the fd is open.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st.st_size as u64)
}

/// A member's file as its queue holds it: released by `close` (which drops the lock on
/// it), so asking its size afterwards is an error rather than a stale answer.
pub(crate) struct SizeProbe {
    file: arc_swap::ArcSwapOption<File>,
    block_device: bool,
    /// [`zeroes_cheaply`], asked once at open.
    pub(crate) cheap_zero: bool,
    /// [`BlockDev::may_run_out`].
    pub(crate) space: SpaceCheck,
}

/// Whether writes to a member file can be refused for want of space
/// ([`BlockDev::may_run_out`]). A write within a file's size allocates only where it
/// lands in a hole (never written, punched, or fallocated and not yet written: SEEK_HOLE
/// reports those as holes too), or where the file system copies on write (btrfs, ZFS,
/// XFS's shared extents). So: a file with no holes, on a file system that overwrites in
/// place (ext2/3/4, tmpfs, ramfs), cannot run out; everything else may. Holes come back
/// when the engine zeroes a range (trim, WRITE_ZEROES: `fallocate` punches), so every
/// zeroing request marks the file as having holes before it is issued ([`Self::zeroing`]);
/// a file with holes is looked at again (one `lseek`) at most once a second, so a
/// member written in full (a sequential fill) is found to be whole. A block device
/// answers no (it has no holes to fill).
pub(crate) struct SpaceCheck {
    /// The file system overwrites in place (else: always "may run out").
    in_place: bool,
    /// `generation << 1 | whole`: `whole` set once no hole was found; every zeroing bumps
    /// the generation and clears it, so a look that raced with a zeroing cannot set it.
    state: std::sync::atomic::AtomicU64,
    /// When holes were last looked for, in ms since `epoch` (0: never).
    last: std::sync::atomic::AtomicU64,
    epoch: std::time::Instant,
}

impl SpaceCheck {
    pub(crate) fn new(file: &File, block_device: bool) -> SpaceCheck {
        let in_place = block_device || overwrites_in_place(file);
        let c = SpaceCheck {
            in_place,
            state: std::sync::atomic::AtomicU64::new(block_device as u64),
            last: std::sync::atomic::AtomicU64::new(0),
            epoch: std::time::Instant::now(),
        };
        if in_place && !block_device && no_holes(file) {
            c.state.store(1, std::sync::atomic::Ordering::SeqCst);
        }
        c
    }

    /// A zeroing request (which may punch holes) is about to be issued.
    pub(crate) fn zeroing(&self) {
        use std::sync::atomic::Ordering::SeqCst;
        let _ = self
            .state
            .fetch_update(SeqCst, SeqCst, |v| Some((v.wrapping_add(2)) & !1));
    }

    /// [`BlockDev::may_run_out`] of the member held in `file` (`None`: closed).
    pub(crate) fn may_run_out(&self, file: Option<&File>) -> bool {
        use std::sync::atomic::Ordering::SeqCst;
        if !self.in_place {
            return true;
        }
        let v = self.state.load(SeqCst);
        if v & 1 == 1 {
            return false;
        }
        let Some(file) = file else { return true };
        let now = (self.epoch.elapsed().as_millis() as u64).max(1);
        let last = self.last.load(SeqCst);
        if (last != 0 && now < last + 1000)
            || self
                .last
                .compare_exchange(last, now, SeqCst, SeqCst)
                .is_err()
        {
            return true;
        }
        if no_holes(file) {
            // Fails if a zeroing began since `v` was read: it may have made a hole.
            return self
                .state
                .compare_exchange(v, v | 1, SeqCst, SeqCst)
                .is_err();
        }
        true
    }
}

/// Does this file's file system overwrite a file's allocated blocks in place (no space
/// needed to rewrite them)? Only those named here; any other (btrfs, ZFS, XFS with
/// reflinks, network file systems) may need space for an overwrite.
fn overwrites_in_place(file: &File) -> bool {
    // SAFETY: fstatfs fills the zeroed struct we pass; the fd is open.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstatfs(file.as_raw_fd(), &mut st) } != 0 {
        return false;
    }
    // ramfs's magic (0x858458f6, linux/magic.h) is not in the libc crate.
    const RAMFS_MAGIC: libc::c_long = 0x8584_58f6_u32 as libc::c_long;
    let t = st.f_type as libc::c_long;
    t == libc::EXT4_SUPER_MAGIC as libc::c_long
        || t == libc::TMPFS_MAGIC as libc::c_long
        || t == RAMFS_MAGIC
}

/// No hole anywhere in the file (SEEK_HOLE from 0 finds only the one at its end).
fn no_holes(file: &File) -> bool {
    let fd = file.as_raw_fd();
    // SAFETY: fstat fills the zeroed struct we pass; the fd is open.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd, &mut st) } != 0 || st.st_size <= 0 {
        return false;
    }
    // SAFETY: plain syscall on an open fd; the file position is not used by the I/O
    // (pread/pwrite, io_uring with offsets).
    let hole = unsafe { libc::lseek(fd, 0, libc::SEEK_HOLE) };
    hole >= st.st_size
}

impl SizeProbe {
    pub(crate) fn new(file: Arc<File>, block_device: bool) -> SizeProbe {
        SizeProbe {
            cheap_zero: zeroes_cheaply(&file, block_device),
            space: SpaceCheck::new(&file, block_device),
            file: arc_swap::ArcSwapOption::new(Some(file)),
            block_device,
        }
    }

    pub(crate) fn size(&self) -> io::Result<u64> {
        match self.file.load().as_ref() {
            Some(f) => current_size(f, self.block_device),
            None => Err(closed_err()),
        }
    }

    pub(crate) fn release(&self) {
        self.file.store(None);
    }

    /// [`BlockDev::may_run_out`] of the member.
    pub(crate) fn may_run_out(&self) -> bool {
        self.space.may_run_out(self.file.load().as_deref())
    }

    /// Note a request before it is issued: a zeroing may punch holes.
    pub(crate) fn note(&self, req: &IoReq) {
        if matches!(req.kind, IoKind::Zero { .. }) {
            self.space.zeroing();
        }
    }

    /// [`BlockDev::data_ranges`] of the member: `None` for a block device.
    pub(crate) fn data_ranges(&self, offset: u64, len: u64) -> Option<io::Result<Vec<(u64, u64)>>> {
        if self.block_device {
            return None;
        }
        Some(match self.file.load().as_ref() {
            Some(f) => data_ranges(f, offset, len),
            None => Err(closed_err()),
        })
    }
}

/// Can this member be zeroed without writing zeros (see [`BlockDev::zeroes_cheaply`])? A
/// file: yes (`fallocate`). A block device: where its queue takes write-zeroes
/// (`queue/write_zeroes_max_bytes` in sysfs, of the disk for a partition).
pub fn zeroes_cheaply(file: &File, block_device: bool) -> bool {
    if !block_device {
        return true;
    }
    // SAFETY: fstat fills the zeroed struct we pass; the fd is open.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(file.as_raw_fd(), &mut st) } != 0 {
        return false;
    }
    let (major, minor) = (libc::major(st.st_rdev), libc::minor(st.st_rdev));
    let dev = format!("/sys/dev/block/{major}:{minor}");
    [
        format!("{dev}/queue/write_zeroes_max_bytes"),
        format!("{dev}/../queue/write_zeroes_max_bytes"),
    ]
    .iter()
    .find_map(|p| std::fs::read_to_string(p).ok())
    .and_then(|v| v.trim().parse::<u64>().ok())
    .is_some_and(|n| n > 0)
}

/// Most ranges [`data_ranges`] lists; beyond them the rest of the range counts as data.
const MAX_DATA_RANGES: usize = 1 << 16;

/// Where a member file holds data in `[offset, offset + len)`, by `lseek` SEEK_DATA and
/// SEEK_HOLE: what lies outside the ranges is a hole, which the file system guarantees
/// reads as zeros. Ranges are rounded out to 4 KiB (a partly written block is data).
/// Dirty page cache counts as data (ext4, xfs, tmpfs), so an acknowledged write is seen
/// whether or not it has reached the disk.
pub fn data_ranges(file: &File, offset: u64, len: u64) -> io::Result<Vec<(u64, u64)>> {
    const B: u64 = 4096;
    let fd = file.as_raw_fd();
    let end = offset.saturating_add(len);
    let mut out: Vec<(u64, u64)> = Vec::new();
    let mut pos = offset;
    while pos < end {
        // SAFETY: plain syscall on an open fd.
        let d = unsafe { libc::lseek(fd, pos as libc::off_t, libc::SEEK_DATA) };
        if d < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ENXIO) {
                break; // no data from pos to the end of the file
            }
            return Err(e);
        }
        let d = d as u64;
        if d >= end {
            break;
        }
        // SAFETY: as above.
        let h = unsafe { libc::lseek(fd, d as libc::off_t, libc::SEEK_HOLE) };
        if h < 0 {
            return Err(io::Error::last_os_error());
        }
        let h = h as u64;
        let (s, e) = (
            (d / B * B).max(offset),
            h.div_ceil(B).saturating_mul(B).min(end),
        );
        if h <= d || out.len() >= MAX_DATA_RANGES {
            // Not what SEEK_HOLE promises, or too many pieces: the rest is data.
            push_range(&mut out, s, end);
            break;
        }
        push_range(&mut out, s, e);
        pos = e.max(h);
    }
    Ok(out)
}

fn push_range(out: &mut Vec<(u64, u64)>, s: u64, e: u64) {
    match out.last_mut() {
        Some(last) if last.1 >= s => last.1 = last.1.max(e),
        _ => out.push((s, e)),
    }
}

/// Execute one request with blocking syscalls. Shared by the thread pool and by the
/// io_uring path for the operations it does not queue (zeroing).
pub fn execute(file: &File, block_device: bool, req: &IoReq) -> io::Result<()> {
    let fd = file.as_raw_fd();
    match &req.kind {
        IoKind::Read { buf } => {
            let mut done = 0usize;
            while done < buf.len() {
                // SAFETY: the engine owns this range of the buffer for this I/O.
                let r = unsafe {
                    libc::pread(
                        fd,
                        buf.as_mut_ptr().add(done) as *mut libc::c_void,
                        buf.len() - done,
                        (req.offset + done as u64) as libc::off_t,
                    )
                };
                if r < 0 {
                    let e = io::Error::last_os_error();
                    if e.kind() == io::ErrorKind::Interrupted {
                        continue;
                    }
                    return Err(e);
                }
                if r == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "read past the end of the member",
                    ));
                }
                done += r as usize;
            }
            Ok(())
        }
        IoKind::Write { buf, fua } => {
            let mut done = 0usize;
            while done < buf.len() {
                let iov = libc::iovec {
                    // SAFETY: pointer into the buffer range owned by this I/O.
                    iov_base: unsafe { buf.as_mut_ptr().add(done) } as *mut libc::c_void,
                    iov_len: buf.len() - done,
                };
                let flags = if *fua { libc::RWF_DSYNC } else { 0 };
                // SAFETY: one valid iovec.
                let r = unsafe {
                    libc::pwritev2(
                        fd,
                        &iov,
                        1,
                        (req.offset + done as u64) as libc::off_t,
                        flags,
                    )
                };
                if r < 0 {
                    let e = io::Error::last_os_error();
                    if e.kind() == io::ErrorKind::Interrupted {
                        continue;
                    }
                    return Err(e);
                }
                if r == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::WriteZero,
                        "member accepted no bytes",
                    ));
                }
                done += r as usize;
            }
            Ok(())
        }
        IoKind::Flush => {
            // SAFETY: fd is open.
            if unsafe { libc::fdatasync(fd) } != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        }
        IoKind::Zero { len, punch } => zero_range(fd, block_device, req.offset, *len, *punch),
    }
}

fn zero_range(fd: i32, block_device: bool, offset: u64, len: u64, punch: bool) -> io::Result<()> {
    if block_device {
        // With `punch` (a trim, a WRITE_ZEROES that may leave holes): fallocate PUNCH_HOLE
        // on the device is the kernel's write-zeroes that may unmap, zeros guaranteed (and
        // refused, EOPNOTSUPP, where the device cannot: no silent fallback to writing).
        // BLKZEROOUT zeroes without unmapping (writing zeros itself where the device has
        // no write-zeroes). BLKDISCARD does not promise zeros, so it is never used for
        // data a parity stripe depends on.
        let punch_mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        // SAFETY: plain syscall.
        if punch
            && unsafe { libc::fallocate(fd, punch_mode, offset as libc::off_t, len as libc::off_t) }
                == 0
        {
            return Ok(());
        }
        let range: [u64; 2] = [offset, len];
        // SAFETY: the ioctl reads two u64.
        if unsafe { libc::ioctl(fd, BLKZEROOUT as _, range.as_ptr()) } == 0 {
            return Ok(());
        }
    } else {
        let mode = if punch {
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE
        } else {
            libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE
        };
        // SAFETY: plain syscall.
        if unsafe { libc::fallocate(fd, mode, offset as libc::off_t, len as libc::off_t) } == 0 {
            return Ok(());
        }
        let punch_mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        // SAFETY: plain syscall. A punched hole reads back as zeros too.
        if !punch
            && unsafe { libc::fallocate(fd, punch_mode, offset as libc::off_t, len as libc::off_t) }
                == 0
        {
            return Ok(());
        }
    }
    // Last resort: write zeros.
    let zeros = crate::buf::AlignedBuf::zeroed(1 << 20);
    let mut done = 0u64;
    while done < len {
        let n = (len - done).min(zeros.len() as u64) as usize;
        // SAFETY: zeros is valid for n bytes.
        let r = unsafe {
            libc::pwrite(
                fd,
                zeros.as_ptr() as *const libc::c_void,
                n,
                (offset + done) as libc::off_t,
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if r == 0 {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "member accepted no bytes",
            ));
        }
        done += r as u64;
    }
    Ok(())
}

/// A request, or a worker's signal to stop. A request left in the channel when the member
/// goes away completes with "member is closed" as it is dropped (see `Pending`).
type Job = Option<Pending>;

/// A member driven by its own pool of blocking worker threads.
pub struct FileDev {
    name: String,
    size: u64,
    direct: bool,
    probe: SizeProbe,
    tx: crossbeam_channel::Sender<Job>,
    /// Urgent requests ([`super::IoClass::Urgent`]): the next free worker takes them first.
    urgent_tx: crossbeam_channel::Sender<Pending>,
    /// To refuse what is left there at close.
    urgent_rx: crossbeam_channel::Receiver<Pending>,
    closed: std::sync::atomic::AtomicBool,
    workers: parking_lot::Mutex<Vec<JoinHandle<()>>>,
}

impl FileDev {
    pub fn new(name: String, opened: Opened, threads: usize) -> FileDev {
        let (tx, rx) = crossbeam_channel::unbounded::<Job>();
        let (urgent_tx, urgent) = crossbeam_channel::unbounded::<Pending>();
        let file = Arc::new(opened.file);
        let block_device = opened.block_device;
        let workers = (0..threads.max(1))
            .map(|i| {
                let rx = rx.clone();
                let mut urgent = urgent.clone();
                let file = file.clone();
                std::thread::Builder::new()
                    .name(format!("sbod-io-{i}"))
                    .spawn(move || loop {
                        let mut p = crossbeam_channel::select_biased! {
                            recv(urgent) -> j => match j {
                                Ok(p) => p,
                                Err(_) => {
                                    urgent = crossbeam_channel::never();
                                    continue;
                                }
                            },
                            recv(rx) -> j => match j {
                                Ok(Some(p)) => p,
                                _ => break,
                            },
                        };
                        let r = execute(&file, block_device, p.req());
                        p.finish(r);
                    })
                    .expect("spawn member I/O thread")
            })
            .collect();
        FileDev {
            name,
            size: opened.size,
            direct: opened.direct,
            probe: SizeProbe::new(file, block_device),
            tx,
            urgent_tx,
            urgent_rx: urgent,
            closed: std::sync::atomic::AtomicBool::new(false),
            workers: parking_lot::Mutex::new(workers),
        }
    }

    pub fn direct(&self) -> bool {
        self.direct
    }
}

impl BlockDev for FileDev {
    fn submit(&self, req: IoReq, done: Done) {
        if self.closed.load(std::sync::atomic::Ordering::Acquire) {
            return done(Err(closed_err()));
        }
        self.probe.note(&req);
        // A refused job is dropped here, which completes it.
        if req.class == super::IoClass::Urgent {
            let _ = self.urgent_tx.send(Pending::new(req, done));
        } else {
            let _ = self.tx.send(Some(Pending::new(req, done)));
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
        "threads"
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
        self.closed
            .store(true, std::sync::atomic::Ordering::Release);
        self.probe.release();
        let workers = std::mem::take(&mut *self.workers.lock());
        for _ in &workers {
            let _ = self.tx.send(None);
        }
        let me = std::thread::current().id();
        for w in workers {
            // A completion callback may close its own member: never join ourselves.
            if w.thread().id() != me {
                let _ = w.join();
            }
        }
        // Dropped, each completes with "member is closed".
        while let Ok(p) = self.urgent_rx.try_recv() {
            drop(p);
        }
    }
}

impl Drop for FileDev {
    fn drop(&mut self) {
        self.close();
    }
}

/// Whether a member file lives in memory (tmpfs, ramfs): its reads and writes are page
/// copies that never wait for a device.
pub fn in_memory(opened: &Opened) -> bool {
    if opened.block_device {
        return false;
    }
    // SAFETY: fstatfs fills the zeroed struct we pass; the fd is open.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstatfs(opened.file.as_raw_fd(), &mut st) } != 0 {
        return false;
    }
    // ramfs's magic (0x858458f6, linux/magic.h) is not in the libc crate.
    const RAMFS_MAGIC: libc::c_long = 0x8584_58f6_u32 as libc::c_long;
    st.f_type == libc::TMPFS_MAGIC || st.f_type as libc::c_long == RAMFS_MAGIC
}

/// A member whose I/O is done on the submitting thread: for files in memory (tmpfs,
/// ramfs), where a 4 KiB `pread` is a page copy of about a microsecond and handing the
/// request to a worker thread and back costs several (a futex wake and two context switches
/// per request; see docs/PERFORMANCE.md, "NBD server"). Nothing is shared with other
/// members, and there is no queue to be a bottleneck: each submitter does its own I/O.
/// (SPDK's malloc bdev completes inline for the same reason.)
pub struct InlineDev {
    name: String,
    size: u64,
    /// Taken out by `close`, which releases the file (and its lock) once the requests
    /// running on other threads have finished with it.
    file: arc_swap::ArcSwapOption<File>,
    block_device: bool,
    cheap_zero: bool,
    space: SpaceCheck,
}

impl InlineDev {
    pub fn new(name: String, opened: Opened) -> InlineDev {
        InlineDev {
            name,
            size: opened.size,
            cheap_zero: zeroes_cheaply(&opened.file, opened.block_device),
            space: SpaceCheck::new(&opened.file, opened.block_device),
            file: arc_swap::ArcSwapOption::from_pointee(opened.file),
            block_device: opened.block_device,
        }
    }
}

impl BlockDev for InlineDev {
    fn submit(&self, req: IoReq, done: Done) {
        let file = self.file.load();
        let Some(file) = file.as_ref() else {
            return done(Err(closed_err()));
        };
        if matches!(req.kind, IoKind::Zero { .. }) {
            self.space.zeroing();
        }
        let r = execute(file, self.block_device, &req);
        // Release the buffer before telling the engine, which may reclaim it at once.
        drop(req);
        done(r)
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn current_size(&self) -> io::Result<u64> {
        match self.file.load().as_ref() {
            Some(f) => current_size(f, self.block_device),
            None => Err(closed_err()),
        }
    }

    fn queue(&self) -> &'static str {
        "inline"
    }

    fn zeroes_cheaply(&self) -> bool {
        self.cheap_zero
    }

    fn may_run_out(&self) -> bool {
        self.space.may_run_out(self.file.load().as_deref())
    }

    fn data_ranges(&self, offset: u64, len: u64) -> Option<io::Result<Vec<(u64, u64)>>> {
        if self.block_device {
            return None;
        }
        Some(match self.file.load().as_ref() {
            Some(f) => data_ranges(f, offset, len),
            None => Err(closed_err()),
        })
    }

    fn close(&self) {
        self.file.store(None);
    }
}
