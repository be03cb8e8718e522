//! Fault injection: what real hardware does to an array, on demand.
//!
//! [`FaultDev`] wraps any member and, following a [`FaultPlan`] that tests change while
//! I/O runs, fails reads or writes with EIO (at chosen member ranges, at a rate, or at
//! "pending sectors" that heal when rewritten, as a drive remaps them), delays requests
//! (latency spikes, on a timer thread so the inner device's workers never block), vanishes
//! (every request fails from then on, including those in flight when they complete), and
//! flips bits silently, either in the data a read returns or on the medium itself.
//!
//! [`PowerCutDev`] is a member with a volatile write cache: completed writes are held in
//! the cache (reads see them) until a FLUSH makes them durable; a FUA write is durable
//! when it completes. Every member of an array draws from one [`PowerSupply`]; cutting it
//! stops all of them at the same instant, and each keeps a random subset of what was in
//! its cache or its queue, in a random order, with one write torn (only some of its 4 KiB
//! blocks land). What remains is the durable image a restart sees.
//!
//! Both are hand-written: they are the test harness of this engine's own contract, and no
//! crate models these failure semantics on top of an arbitrary device.

use parking_lot::{Condvar, Mutex, RwLock};
use sbod_core::buf::{AlignedBuf, SharedBuf};
use sbod_core::dev::{BlockDev, Done, IoClass, IoKind, IoReq};
use std::collections::{BinaryHeap, VecDeque};
use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// Block size of the torn-write model: real drives write 4 KiB physical sectors whole.
pub const TEAR_UNIT: usize = 4096;

fn eio() -> io::Error {
    io::Error::from_raw_os_error(libc::EIO)
}

/// A small deterministic generator (splitmix64), so a failing seed replays.
#[derive(Debug)]
pub struct Rng(AtomicU64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(AtomicU64::new(seed))
    }

    pub fn next(&self) -> u64 {
        let mut z = self
            .0
            .fetch_add(0x9e37_79b9_7f4a_7c15, Relaxed)
            .wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, n)` (0 if `n` is 0).
    pub fn below(&self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }

    /// True with probability `p`.
    pub fn chance(&self, p: f64) -> bool {
        p > 0.0 && (self.next() >> 11) as f64 / ((1u64 << 53) as f64) < p
    }
}

fn overlaps(r: &Range<u64>, off: u64, len: u64) -> bool {
    r.start < off + len && off < r.end
}

/// Remove `[off, off+len)` from a set of ranges.
fn subtract(ranges: &mut Vec<Range<u64>>, off: u64, len: u64) -> u64 {
    let end = off + len;
    let mut out = Vec::with_capacity(ranges.len());
    let mut removed = 0;
    for r in ranges.drain(..) {
        if !overlaps(&r, off, len) {
            out.push(r);
            continue;
        }
        removed += r.end.min(end) - r.start.max(off);
        if r.start < off {
            out.push(r.start..off);
        }
        if end < r.end {
            out.push(end..r.end);
        }
    }
    *ranges = out;
    removed
}

/// What a [`FaultDev`] does to requests. Member byte offsets throughout.
#[derive(Clone, Debug, Default)]
pub struct FaultPlan {
    /// Reads touching these ranges fail until a write covers them: a drive's pending
    /// sectors, which it remaps when they are rewritten.
    pub bad_sectors: Vec<Range<u64>>,
    /// Reads touching these ranges always fail (a dead area of the medium).
    pub read_eio: Vec<Range<u64>>,
    /// Writes touching these ranges always fail.
    pub write_eio: Vec<Range<u64>>,
    /// Probability that any read (write) fails.
    pub read_eio_rate: f64,
    pub write_eio_rate: f64,
    /// Every FLUSH fails.
    pub flush_eio: bool,
    /// Probability that a request is held back before it reaches the device, and for how
    /// long at most (uniform in `[max/4, max]`).
    pub latency_rate: f64,
    pub latency_max: Duration,
    /// Reads return these bytes XORed with the mask, silently: (member offset, mask).
    pub read_flips: Vec<(u64, u8)>,
    /// Writes touching these ranges complete successfully and are dropped: the medium
    /// keeps what it had (a lost write, as a firmware bug or a dying cache does).
    pub lost_writes: Vec<Range<u64>>,
    /// Writes starting in these ranges land `shift` bytes away (a misdirected write: the
    /// right data at the wrong place), and complete successfully: (range, shift).
    pub misdirected_writes: Vec<(Range<u64>, i64)>,
}

/// What a [`FaultDev`] injected (and saw).
#[derive(Debug, Default)]
pub struct FaultStats {
    pub reads: AtomicU64,
    pub writes: AtomicU64,
    pub flushes: AtomicU64,
    pub read_errors: AtomicU64,
    pub write_errors: AtomicU64,
    pub flush_errors: AtomicU64,
    /// Bytes of pending sectors cleared by a write that covered them.
    pub healed_bytes: AtomicU64,
    pub delayed: AtomicU64,
    /// Requests failed because the device had vanished (at submission or completion).
    pub vanished_errors: AtomicU64,
    /// Bits flipped in read data, and on the medium.
    pub read_flips: AtomicU64,
    pub medium_flips: AtomicU64,
    /// Writes dropped, and writes sent elsewhere.
    pub lost_writes: AtomicU64,
    pub misdirected_writes: AtomicU64,
}

impl FaultStats {
    /// Plain numbers, for reports.
    pub fn snapshot(&self) -> FaultCounts {
        FaultCounts {
            reads: self.reads.load(Relaxed),
            writes: self.writes.load(Relaxed),
            flushes: self.flushes.load(Relaxed),
            read_errors: self.read_errors.load(Relaxed),
            write_errors: self.write_errors.load(Relaxed),
            flush_errors: self.flush_errors.load(Relaxed),
            healed_bytes: self.healed_bytes.load(Relaxed),
            delayed: self.delayed.load(Relaxed),
            vanished_errors: self.vanished_errors.load(Relaxed),
            read_flips: self.read_flips.load(Relaxed),
            medium_flips: self.medium_flips.load(Relaxed),
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct FaultCounts {
    pub reads: u64,
    pub writes: u64,
    pub flushes: u64,
    pub read_errors: u64,
    pub write_errors: u64,
    pub flush_errors: u64,
    pub healed_bytes: u64,
    pub delayed: u64,
    pub vanished_errors: u64,
    pub read_flips: u64,
    pub medium_flips: u64,
}

impl std::ops::AddAssign for FaultCounts {
    fn add_assign(&mut self, o: FaultCounts) {
        self.reads += o.reads;
        self.writes += o.writes;
        self.flushes += o.flushes;
        self.read_errors += o.read_errors;
        self.write_errors += o.write_errors;
        self.flush_errors += o.flush_errors;
        self.healed_bytes += o.healed_bytes;
        self.delayed += o.delayed;
        self.vanished_errors += o.vanished_errors;
        self.read_flips += o.read_flips;
        self.medium_flips += o.medium_flips;
    }
}

type Job = Box<dyn FnOnce() + Send>;

struct Timed {
    at: Instant,
    seq: u64,
    job: Job,
}

impl PartialEq for Timed {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Timed {}
impl PartialOrd for Timed {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Timed {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        // Earliest first from a max-heap.
        (o.at, o.seq).cmp(&(self.at, self.seq))
    }
}

#[derive(Default)]
struct TimerQueue {
    heap: BinaryHeap<Timed>,
    seq: u64,
    stop: bool,
}

/// One thread per FaultDev that releases delayed requests when their time comes.
struct Timer {
    q: Arc<(Mutex<TimerQueue>, Condvar)>,
}

impl Timer {
    fn new(name: &str) -> Timer {
        let q: Arc<(Mutex<TimerQueue>, Condvar)> = Arc::default();
        let q2 = q.clone();
        std::thread::Builder::new()
            .name(format!("fault-timer-{name}"))
            .spawn(move || Timer::run(&q2))
            .expect("spawn the fault timer");
        Timer { q }
    }

    fn run(q: &(Mutex<TimerQueue>, Condvar)) {
        let (m, cv) = q;
        let mut g = m.lock();
        loop {
            let now = Instant::now();
            let due = g.stop || g.heap.peek().is_some_and(|t| t.at <= now);
            if due {
                if let Some(t) = g.heap.pop() {
                    drop(g);
                    (t.job)();
                    g = m.lock();
                    continue;
                }
                return; // stopped and drained
            }
            match g.heap.peek().map(|t| t.at) {
                Some(at) => {
                    cv.wait_until(&mut g, at);
                }
                None => cv.wait(&mut g),
            }
        }
    }

    fn after(&self, delay: Duration, job: Job) {
        let (m, cv) = &*self.q;
        let mut g = m.lock();
        if g.stop {
            drop(g);
            return job();
        }
        g.seq += 1;
        let seq = g.seq;
        g.heap.push(Timed {
            at: Instant::now() + delay,
            seq,
            job,
        });
        cv.notify_one();
    }

    /// Release everything now and let the thread end.
    fn stop(&self) {
        let (m, cv) = &*self.q;
        m.lock().stop = true;
        cv.notify_one();
    }
}

impl Drop for Timer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The free space of a file system that thin (sparse) members share. A write to blocks a
/// member has not allocated yet takes space from it; zeroing gives the blocks back (sbod
/// zeroes files by punching holes). When it runs out, a write lands the blocks that still
/// fit, in order, and fails with ENOSPC, as a file system's `pwrite` does.
#[derive(Debug)]
pub struct SpacePool {
    free: Mutex<u64>,
}

impl SpacePool {
    pub fn new(free_bytes: u64) -> Arc<SpacePool> {
        Arc::new(SpacePool {
            free: Mutex::new(free_bytes),
        })
    }

    /// Bytes still free.
    pub fn free(&self) -> u64 {
        *self.free.lock()
    }

    /// Set the free space (another tenant of the file system filled or freed it).
    pub fn set_free(&self, bytes: u64) {
        *self.free.lock() = bytes;
    }

    /// Take up to `want` blocks; returns how many were granted.
    fn take(&self, want: u64) -> u64 {
        let mut f = self.free.lock();
        let n = want.min(*f / TEAR_UNIT as u64);
        *f -= n * TEAR_UNIT as u64;
        n
    }

    fn give(&self, blocks: u64) {
        *self.free.lock() += blocks * TEAR_UNIT as u64;
    }
}

/// Which 4 KiB blocks of a thin member hold space, and the pool it takes space from.
struct Thin {
    pool: Arc<SpacePool>,
    allocated: Mutex<Vec<u64>>,
}

impl Thin {
    fn is_set(bits: &[u64], b: u64) -> bool {
        bits.get((b / 64) as usize)
            .is_some_and(|w| w & (1 << (b % 64)) != 0)
    }

    fn set(bits: &mut Vec<u64>, b: u64, on: bool) {
        let i = (b / 64) as usize;
        if i >= bits.len() {
            bits.resize(i + 1, 0);
        }
        if on {
            bits[i] |= 1 << (b % 64);
        } else {
            bits[i] &= !(1 << (b % 64));
        }
    }

    /// Allocate the blocks of `[off, off+len)` in order; returns how many bytes from `off`
    /// now have space (all of `len`, or the prefix that fit).
    fn allocate(&self, off: u64, len: u64) -> u64 {
        let unit = TEAR_UNIT as u64;
        let mut bits = self.allocated.lock();
        let (first, end) = (off / unit, (off + len).div_ceil(unit));
        for b in first..end {
            if Self::is_set(&bits, b) {
                continue;
            }
            if self.pool.take(1) == 0 {
                return (b * unit).saturating_sub(off).min(len);
            }
            Self::set(&mut bits, b, true);
        }
        len
    }

    /// Give back the whole blocks inside `[off, off+len)` (a punched hole).
    fn release(&self, off: u64, len: u64) {
        let unit = TEAR_UNIT as u64;
        let mut bits = self.allocated.lock();
        let mut freed = 0;
        for b in off.div_ceil(unit)..(off + len) / unit {
            if Self::is_set(&bits, b) {
                Self::set(&mut bits, b, false);
                freed += 1;
            }
        }
        self.pool.give(freed);
    }
}

fn enospc() -> io::Error {
    io::Error::from_raw_os_error(libc::ENOSPC)
}

/// A member wrapped in a fault plan.
pub struct FaultDev {
    inner: Arc<dyn BlockDev>,
    name: String,
    plan: Arc<Mutex<FaultPlan>>,
    vanished: Arc<AtomicBool>,
    stats: Arc<FaultStats>,
    rng: Rng,
    timer: Timer,
    thin: Option<Thin>,
}

impl FaultDev {
    pub fn new(inner: Arc<dyn BlockDev>, seed: u64) -> FaultDev {
        let name = inner.name().to_string();
        FaultDev {
            timer: Timer::new(&name),
            inner,
            name,
            plan: Arc::default(),
            vanished: Arc::default(),
            stats: Arc::default(),
            rng: Rng::new(seed),
            thin: None,
        }
    }

    /// A thin member: its blocks take space from `pool` when first written (see
    /// [`SpacePool`]); none is allocated yet, as in a freshly created sparse file.
    pub fn thin(inner: Arc<dyn BlockDev>, seed: u64, pool: Arc<SpacePool>) -> FaultDev {
        let mut d = FaultDev::new(inner, seed);
        d.thin = Some(Thin {
            pool,
            allocated: Mutex::new(Vec::new()),
        });
        d
    }

    /// The device underneath (tests inspect or corrupt it directly).
    pub fn inner(&self) -> &Arc<dyn BlockDev> {
        &self.inner
    }

    /// Change the plan while I/O runs.
    pub fn plan(&self) -> parking_lot::MutexGuard<'_, FaultPlan> {
        self.plan.lock()
    }

    pub fn set_plan(&self, p: FaultPlan) {
        *self.plan.lock() = p;
    }

    pub fn stats(&self) -> &FaultStats {
        &self.stats
    }

    /// From now on every request fails, including those in flight when they complete.
    pub fn vanish(&self) {
        self.vanished.store(true, Relaxed);
    }

    /// The device is back (a re-plugged disk: its data is as it was).
    pub fn reappear(&self) {
        self.vanished.store(false, Relaxed);
    }

    pub fn is_vanished(&self) -> bool {
        self.vanished.load(Relaxed)
    }

    /// Flip bits on the medium itself (silent corruption that every later read sees),
    /// by a read-modify-write of the 4 KiB block through the inner device.
    pub fn corrupt(&self, offset: u64, mask: u8) -> io::Result<()> {
        let blk = offset / 4096 * 4096;
        let buf = AlignedBuf::zeroed(4096).into_shared();
        wait(&self.inner, blk, IoKind::Read { buf: buf.clone() })?;
        // SAFETY: the read completed and nothing else holds this buffer.
        let s = unsafe { buf.as_mut_slice() };
        s[(offset - blk) as usize] ^= mask;
        wait(&self.inner, blk, IoKind::Write { buf, fua: true })?;
        self.stats.medium_flips.fetch_add(1, Relaxed);
        Ok(())
    }

    /// Decide a request's fate now; `Err` fails it at once.
    fn admit(&self, req: &IoReq) -> io::Result<Vec<(u64, u8)>> {
        let mut p = self.plan.lock();
        let off = req.offset;
        match &req.kind {
            IoKind::Read { buf } => {
                self.stats.reads.fetch_add(1, Relaxed);
                let len = buf.len() as u64;
                let hit = p.bad_sectors.iter().any(|r| overlaps(r, off, len))
                    || p.read_eio.iter().any(|r| overlaps(r, off, len))
                    || self.rng.chance(p.read_eio_rate);
                if hit {
                    self.stats.read_errors.fetch_add(1, Relaxed);
                    return Err(eio());
                }
                Ok(p.read_flips
                    .iter()
                    .filter(|(o, _)| (off..off + len).contains(o))
                    .copied()
                    .collect())
            }
            IoKind::Write { buf, .. } => {
                self.stats.writes.fetch_add(1, Relaxed);
                let len = buf.len() as u64;
                if p.write_eio.iter().any(|r| overlaps(r, off, len))
                    || self.rng.chance(p.write_eio_rate)
                {
                    self.stats.write_errors.fetch_add(1, Relaxed);
                    return Err(eio());
                }
                // A rewrite remaps pending sectors. (Healed at admission: the write is
                // about to reach the medium, and a failure fails the member anyway.)
                let healed = subtract(&mut p.bad_sectors, off, len);
                self.stats.healed_bytes.fetch_add(healed, Relaxed);
                Ok(Vec::new())
            }
            IoKind::Zero { len, .. } => {
                self.stats.writes.fetch_add(1, Relaxed);
                if p.write_eio.iter().any(|r| overlaps(r, off, *len)) {
                    self.stats.write_errors.fetch_add(1, Relaxed);
                    return Err(eio());
                }
                let healed = subtract(&mut p.bad_sectors, off, *len);
                self.stats.healed_bytes.fetch_add(healed, Relaxed);
                Ok(Vec::new())
            }
            IoKind::Flush => {
                self.stats.flushes.fetch_add(1, Relaxed);
                if p.flush_eio {
                    self.stats.flush_errors.fetch_add(1, Relaxed);
                    return Err(eio());
                }
                Ok(Vec::new())
            }
        }
    }
}

/// Submit one request to a device and block until it completes.
pub fn wait(dev: &Arc<dyn BlockDev>, offset: u64, kind: IoKind) -> io::Result<()> {
    let (tx, rx) = std::sync::mpsc::channel();
    dev.submit(
        IoReq {
            offset,
            kind,
            class: IoClass::Background,
        },
        Box::new(move |r| {
            let _ = tx.send(r);
        }),
    );
    rx.recv()
        .unwrap_or_else(|_| Err(io::Error::other("request dropped")))
}

impl BlockDev for FaultDev {
    fn submit(&self, req: IoReq, done: Done) {
        if self.vanished.load(Relaxed) {
            self.stats.vanished_errors.fetch_add(1, Relaxed);
            return done(Err(eio()));
        }
        let flips = match self.admit(&req) {
            Ok(f) => f,
            Err(e) => return done(Err(e)),
        };
        let mut req = req;
        if let IoKind::Write { buf, .. } = &req.kind {
            let p = self.plan.lock();
            let len = buf.len() as u64;
            if p.lost_writes.iter().any(|r| overlaps(r, req.offset, len)) {
                drop(p);
                self.stats.lost_writes.fetch_add(1, Relaxed);
                return done(Ok(()));
            }
            if let Some((_, shift)) = p
                .misdirected_writes
                .iter()
                .find(|(r, _)| r.contains(&req.offset))
            {
                req.offset = req.offset.saturating_add_signed(*shift);
                self.stats.misdirected_writes.fetch_add(1, Relaxed);
            }
        }
        let (req, done) = match self.take_space(req, done) {
            Some(x) => x,
            None => return,
        };
        let read_buf = match &req.kind {
            IoKind::Read { buf } if !flips.is_empty() => Some(buf.clone()),
            _ => None,
        };
        let vanished = self.vanished.clone();
        let stats = self.stats.clone();
        let base = req.offset;
        let wrapped: Done = Box::new(move |r| {
            if vanished.load(Relaxed) {
                stats.vanished_errors.fetch_add(1, Relaxed);
                return done(Err(eio()));
            }
            if let (Ok(()), Some(buf)) = (&r, read_buf) {
                // SAFETY: the read into this buffer has completed; the engine reads it
                // only after this callback.
                let s = unsafe { buf.as_mut_slice() };
                for (o, mask) in flips {
                    s[(o - base) as usize] ^= mask;
                    stats.read_flips.fetch_add(1, Relaxed);
                }
            }
            done(r)
        });
        let (rate, max) = {
            let p = self.plan.lock();
            (p.latency_rate, p.latency_max)
        };
        if !max.is_zero() && self.rng.chance(rate) {
            self.stats.delayed.fetch_add(1, Relaxed);
            let lo = max.as_micros() as u64 / 4;
            let d = Duration::from_micros(lo + self.rng.below(max.as_micros() as u64 - lo + 1));
            let inner = self.inner.clone();
            self.timer
                .after(d, Box::new(move || inner.submit(req, wrapped)));
            return;
        }
        self.inner.submit(req, wrapped)
    }

    fn size(&self) -> u64 {
        self.inner.size()
    }

    fn current_size(&self) -> io::Result<u64> {
        if self.vanished.load(Relaxed) {
            return Err(eio());
        }
        self.inner.current_size()
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn close(&self) {
        self.timer.stop();
        self.inner.close()
    }
}

impl FaultDev {
    /// A thin member's space: a write takes the space its new blocks need; if only part
    /// fits, that part is written and the request fails with ENOSPC; if none fits it fails
    /// at once. Zeroing gives blocks back. `None`: the request was completed here.
    fn take_space(&self, req: IoReq, done: Done) -> Option<(IoReq, Done)> {
        let Some(thin) = &self.thin else {
            return Some((req, done));
        };
        match &req.kind {
            IoKind::Write { buf, fua } => {
                let len = buf.len() as u64;
                let fits = thin.allocate(req.offset, len);
                if fits == len {
                    return Some((req, done));
                }
                self.stats.write_errors.fetch_add(1, Relaxed);
                if fits == 0 {
                    done(Err(enospc()));
                    return None;
                }
                let part = IoReq {
                    offset: req.offset,
                    kind: IoKind::Write {
                        buf: buf.slice(0..fits as usize),
                        fua: *fua,
                    },
                    class: req.class,
                };
                Some((part, Box::new(move |r| done(r.and(Err(enospc()))))))
            }
            IoKind::Zero { len, .. } => {
                thin.release(req.offset, *len);
                Some((req, done))
            }
            _ => Some((req, done)),
        }
    }
}

// ------------------------------------------------------------------------ power cuts

/// What a power cut did to the writes that were not yet durable.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct CutReport {
    /// Writes that were in a cache or queue when the power went.
    pub unflushed: u64,
    /// ... of which landed whole, landed in part (torn), or were lost.
    pub landed: u64,
    pub torn: u64,
    pub dropped: u64,
    /// Bytes of unflushed writes that never reached the medium.
    pub dropped_bytes: u64,
}

impl std::ops::AddAssign for CutReport {
    fn add_assign(&mut self, o: CutReport) {
        self.unflushed += o.unflushed;
        self.landed += o.landed;
        self.torn += o.torn;
        self.dropped += o.dropped;
        self.dropped_bytes += o.dropped_bytes;
    }
}

/// The power feeding a set of [`PowerCutDev`]s. Cutting it is atomic across them: no
/// request is being applied by any of them while it is cut, and none is afterwards.
pub struct PowerSupply {
    off: RwLock<bool>,
    devs: Mutex<Vec<Weak<PcShared>>>,
}

impl PowerSupply {
    pub fn new() -> Arc<PowerSupply> {
        Arc::new(PowerSupply {
            off: RwLock::new(false),
            devs: Mutex::new(Vec::new()),
        })
    }

    pub fn is_cut(&self) -> bool {
        *self.off.read()
    }

    /// Cut the power: every device keeps a random part of its unflushed writes, tears
    /// one, and fails all I/O from now on.
    pub fn cut(&self, seed: u64) -> CutReport {
        let mut off = self.off.write();
        let mut rep = CutReport::default();
        if *off {
            return rep;
        }
        *off = true;
        let rng = Rng::new(seed);
        for d in self.devs.lock().iter().filter_map(|w| w.upgrade()) {
            rep += d.settle(&rng);
            d.cv.notify_all();
        }
        rep
    }
}

struct Pending {
    offset: u64,
    data: Arc<Vec<u8>>,
}

struct Media {
    /// What survives a power cut.
    durable: Vec<u8>,
    /// What reads see (durable plus the cache).
    current: Vec<u8>,
    /// Completed writes not yet flushed, oldest first.
    cache: Vec<Pending>,
}

struct PcShared {
    name: String,
    media: Mutex<Media>,
    queue: Mutex<VecDeque<(IoReq, Done)>>,
    cv: Condvar,
    closed: AtomicBool,
    /// Most microseconds a request waits in the queue before it is served.
    jitter_us: u64,
    rng: Rng,
}

fn write_bytes(req: &IoReq) -> Option<Vec<u8>> {
    match &req.kind {
        // SAFETY: write buffers are not changed while their I/O is in flight.
        IoKind::Write { buf, .. } => Some(unsafe { buf.as_slice() }.to_vec()),
        IoKind::Zero { len, .. } => Some(vec![0u8; *len as usize]),
        _ => None,
    }
}

impl PcShared {
    fn check(&self, m: &Media, off: u64, len: usize) -> io::Result<()> {
        if !(off as usize).is_multiple_of(TEAR_UNIT) || !len.is_multiple_of(TEAR_UNIT) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{}: unaligned request {off}+{len}", self.name),
            ));
        }
        if off as usize + len > m.durable.len() {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("{}: request {off}+{len} beyond the end", self.name),
            ));
        }
        Ok(())
    }

    /// Serve one request against the media (power on).
    fn apply(&self, req: &IoReq) -> io::Result<()> {
        let mut m = self.media.lock();
        let off = req.offset;
        match &req.kind {
            IoKind::Read { buf } => {
                self.check(&m, off, buf.len())?;
                let o = off as usize;
                // SAFETY: the engine owns this range for this I/O.
                unsafe { buf.as_mut_slice() }.copy_from_slice(&m.current[o..o + buf.len()]);
            }
            IoKind::Write { .. } | IoKind::Zero { .. } => {
                let fua = matches!(req.kind, IoKind::Write { fua: true, .. });
                let data = write_bytes(req).expect("write");
                self.check(&m, off, data.len())?;
                let o = off as usize;
                let n = data.len();
                m.current[o..o + n].copy_from_slice(&data);
                if fua {
                    m.durable[o..o + n].copy_from_slice(&data);
                    // A cached older write of these blocks must not land over this one.
                    for p in m.cache.iter_mut() {
                        let (ps, pe) = (p.offset as usize, p.offset as usize + p.data.len());
                        let (s, e) = (ps.max(o), pe.min(o + n));
                        if s < e {
                            Arc::make_mut(&mut p.data)[s - ps..e - ps]
                                .copy_from_slice(&data[s - o..e - o]);
                        }
                    }
                } else {
                    m.cache.push(Pending {
                        offset: off,
                        data: Arc::new(data),
                    });
                }
            }
            IoKind::Flush => {
                let Media {
                    durable,
                    current,
                    cache,
                } = &mut *m;
                for p in cache.drain(..) {
                    let (s, e) = (p.offset as usize, p.offset as usize + p.data.len());
                    durable[s..e].copy_from_slice(&current[s..e]);
                }
            }
        }
        Ok(())
    }

    /// Power is gone: decide what of the cache and the queue reached the medium.
    fn settle(&self, rng: &Rng) -> CutReport {
        let queue = self.queue.lock();
        let mut m = self.media.lock();
        let mut cand: Vec<Pending> = std::mem::take(&mut m.cache);
        for (req, _) in queue.iter() {
            if let Some(data) = write_bytes(req) {
                if self.check(&m, req.offset, data.len()).is_ok() {
                    cand.push(Pending {
                        offset: req.offset,
                        data: Arc::new(data),
                    });
                }
            }
        }
        let mut rep = CutReport {
            unflushed: cand.len() as u64,
            ..Default::default()
        };
        // A drive writes its cache back in any order.
        for i in (1..cand.len()).rev() {
            cand.swap(i, rng.below(i as u64 + 1) as usize);
        }
        // One write of two or more blocks is torn: some of its blocks land, others not.
        let tearable: Vec<usize> = (0..cand.len())
            .filter(|&i| cand[i].data.len() >= 2 * TEAR_UNIT)
            .collect();
        let tear =
            (!tearable.is_empty()).then(|| tearable[rng.below(tearable.len() as u64) as usize]);
        for (i, p) in cand.iter().enumerate() {
            let o = p.offset as usize;
            let blocks = p.data.len() / TEAR_UNIT;
            if Some(i) == tear {
                let mut keep: Vec<bool> = (0..blocks).map(|_| rng.chance(0.5)).collect();
                let flip = rng.below(blocks as u64) as usize;
                if keep.iter().all(|k| *k) || keep.iter().all(|k| !*k) {
                    keep[flip] = !keep[flip];
                }
                let mut lost = 0;
                for b in 0..blocks {
                    let r = b * TEAR_UNIT..(b + 1) * TEAR_UNIT;
                    if keep[b] {
                        m.durable[o + r.start..o + r.end].copy_from_slice(&p.data[r]);
                    } else {
                        lost += TEAR_UNIT as u64;
                    }
                }
                rep.torn += 1;
                rep.dropped_bytes += lost;
            } else if rng.chance(0.5) {
                m.durable[o..o + p.data.len()].copy_from_slice(&p.data);
                rep.landed += 1;
            } else {
                rep.dropped += 1;
                rep.dropped_bytes += p.data.len() as u64;
            }
        }
        let d = m.durable.clone();
        m.current = d;
        rep
    }
}

/// A member with a volatile write cache, fed by a [`PowerSupply`].
pub struct PowerCutDev {
    shared: Arc<PcShared>,
    supply: Arc<PowerSupply>,
    size: u64,
}

impl PowerCutDev {
    /// A device whose medium starts as `image` (zeros for a new disk, or the image a
    /// previous run left). Requests wait up to `jitter` in its queue, so some are always
    /// in flight when the power goes.
    pub fn new(
        name: impl Into<String>,
        image: Vec<u8>,
        supply: &Arc<PowerSupply>,
        jitter: Duration,
        seed: u64,
    ) -> Arc<PowerCutDev> {
        let size = image.len() as u64;
        let shared = Arc::new(PcShared {
            name: name.into(),
            media: Mutex::new(Media {
                current: image.clone(),
                durable: image,
                cache: Vec::new(),
            }),
            queue: Mutex::new(VecDeque::new()),
            cv: Condvar::new(),
            closed: AtomicBool::new(false),
            jitter_us: jitter.as_micros() as u64,
            rng: Rng::new(seed),
        });
        supply.devs.lock().push(Arc::downgrade(&shared));
        let (s2, sup2) = (shared.clone(), supply.clone());
        std::thread::Builder::new()
            .name(format!("powercut-{}", shared.name))
            .spawn(move || Self::worker(&s2, &sup2))
            .expect("spawn the power-cut worker");
        Arc::new(PowerCutDev {
            shared,
            supply: supply.clone(),
            size,
        })
    }

    /// The medium from the image of a file.
    pub fn from_file(
        path: &std::path::Path,
        supply: &Arc<PowerSupply>,
        jitter: Duration,
        seed: u64,
    ) -> io::Result<Arc<PowerCutDev>> {
        let image = std::fs::read(path)?;
        Ok(Self::new(
            path.display().to_string(),
            image,
            supply,
            jitter,
            seed,
        ))
    }

    /// What survives: the durable medium (after a cut, what a restart finds).
    pub fn image(&self) -> Vec<u8> {
        self.shared.media.lock().durable.clone()
    }

    pub fn save(&self, path: &std::path::Path) -> io::Result<()> {
        std::fs::write(path, self.image())
    }

    fn worker(s: &PcShared, supply: &PowerSupply) {
        loop {
            let (req, done) = {
                let mut q = s.queue.lock();
                loop {
                    if let Some(x) = q.pop_front() {
                        break x;
                    }
                    if s.closed.load(Relaxed) {
                        return;
                    }
                    s.cv.wait(&mut q);
                }
            };
            if s.jitter_us > 0 && !supply.is_cut() {
                std::thread::sleep(Duration::from_micros(s.rng.below(s.jitter_us + 1)));
            }
            let r = {
                let off = supply.off.read();
                if *off || s.closed.load(Relaxed) {
                    Err(eio())
                } else {
                    s.apply(&req)
                }
            };
            drop(req);
            done(r);
        }
    }
}

impl BlockDev for PowerCutDev {
    fn submit(&self, req: IoReq, done: Done) {
        if self.supply.is_cut() || self.shared.closed.load(Relaxed) {
            return done(Err(eio()));
        }
        self.shared.queue.lock().push_back((req, done));
        self.shared.cv.notify_one();
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn name(&self) -> &str {
        &self.shared.name
    }

    fn close(&self) {
        self.shared.closed.store(true, Relaxed);
        self.shared.cv.notify_all();
    }
}

impl Drop for PowerCutDev {
    fn drop(&mut self) {
        self.close();
    }
}

/// Read a device's bytes through its queue (tests).
pub fn read_all(dev: &Arc<dyn BlockDev>, offset: u64, len: usize) -> io::Result<Vec<u8>> {
    let buf = AlignedBuf::zeroed(len).into_shared();
    wait(dev, offset, IoKind::Read { buf: buf.clone() })?;
    // SAFETY: the read completed.
    Ok(unsafe { buf.as_slice() }.to_vec())
}

/// Write bytes through a device's queue and wait (tests).
pub fn write_all(dev: &Arc<dyn BlockDev>, offset: u64, data: &[u8], fua: bool) -> io::Result<()> {
    let buf: SharedBuf = AlignedBuf::from_slice(data).into_shared();
    wait(dev, offset, IoKind::Write { buf, fua })
}

/// Flush a device and wait (tests).
pub fn flush_wait(dev: &Arc<dyn BlockDev>) -> io::Result<()> {
    wait(dev, 0, IoKind::Flush)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subtract_splits_ranges() {
        let mut r = vec![0..100, 200..300];
        assert_eq!(subtract(&mut r, 50, 200), 100);
        assert_eq!(r, vec![0..50, 250..300]);
        assert_eq!(subtract(&mut r, 0, 1000), 100);
        assert!(r.is_empty());
    }
}
