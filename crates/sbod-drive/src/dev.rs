//! A modelled drive as a member: [`ModelDev`] wraps the device that keeps the data (a
//! sparse file, or memory in tests) and completes each request when the drive's model
//! says the drive would have, in real time.
//!
//! The data I/O goes to the inner device at once, in submission order (so what a read
//! returns never depends on the model); the completion waits for both the inner device and
//! the model. Time is CLOCK_MONOTONIC. One timer thread serves every modelled drive of the
//! process: it sleeps until the earliest deadline (a heap of them, timer slack set to 1 µs)
//! and never spins, so dozens of modelled HDDs cost a few thousand wake-ups a second.
//! This is lab hardware, not the engine: the heap's lock is the model's, as a JBOD's loop
//! is its own (each drive keeps its own state and lock).

use crate::model::{Kind, Model, Op};
use parking_lot::{Condvar, Mutex};
use sbod_core::dev::{BlockDev, Done, IoKind, IoReq};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

/// CLOCK_MONOTONIC in nanoseconds (the clock links share between processes).
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime fills the struct we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

struct Slot {
    done: Option<Done>,
    /// The inner device's result, once it has answered.
    data: Option<io::Result<()>>,
    /// The model has completed the command.
    timed: bool,
}

struct State {
    model: Box<dyn Model>,
    slots: HashMap<u64, Slot>,
    /// The earliest wake-up asked of the timer (u64::MAX: none).
    armed: u64,
    closed: bool,
}

struct Core {
    state: Mutex<State>,
    /// Slow motion (`slow=K`): the model's clock runs K times slower than the wall's, so
    /// every time the drive takes is K times longer (see `Spec::slow`).
    slow: u64,
    next_id: AtomicU64,
    stats: Stats,
}

/// What the drive saw, for `SBOD_DRIVE_STATS=1` (printed when the member closes).
#[derive(Default)]
struct Stats {
    reads: AtomicU64,
    writes: AtomicU64,
    fua: AtomicU64,
    flushes: AtomicU64,
    bytes: AtomicU64,
    ticks: AtomicU64,
    /// Nanoseconds the timer woke after a deadline, summed, and the most.
    late_ns: AtomicU64,
    late_max_ns: AtomicU64,
    said: AtomicBool,
}

type Ready = Vec<(Done, io::Result<()>)>;

impl Core {
    /// Run the model to `now`, collect what is complete, and arm the timer for the next
    /// event. Returns the callbacks to run (outside the lock).
    fn run(self: &Arc<Core>, st: &mut State, now: u64, ready: &mut Ready) {
        let mut done = Vec::new();
        st.model.advance(now / self.slow, &mut done);
        for id in done {
            if let Some(s) = st.slots.get_mut(&id) {
                s.timed = true;
                if s.data.is_some() {
                    let mut s = st.slots.remove(&id).expect("present");
                    if let Some(d) = s.done.take() {
                        ready.push((d, s.data.take().expect("checked")));
                    }
                }
            }
        }
        if let Some(t) = st.model.next_event() {
            let t = t.saturating_mul(self.slow);
            if t < st.armed {
                st.armed = t;
                timer().arm(t, Arc::downgrade(self));
            }
        }
    }

    fn tick(self: &Arc<Core>, due: u64) {
        let mut ready = Vec::new();
        {
            let mut st = self.state.lock();
            if due >= st.armed {
                st.armed = u64::MAX;
            }
            let now = now_ns();
            let late = now.saturating_sub(due);
            self.stats.ticks.fetch_add(1, Ordering::Relaxed);
            self.stats.late_ns.fetch_add(late, Ordering::Relaxed);
            self.stats.late_max_ns.fetch_max(late, Ordering::Relaxed);
            self.run(&mut st, now, &mut ready);
        }
        for (d, r) in ready {
            d(r);
        }
    }
}

/// `SBOD_DRIVE_LATE_SUBMIT=1`: the model as it was before issue 31's fix, a command that
/// arrives before the late timer has run the drive's due events moving them to its own
/// arrival (for A/B runs in docs/PERFORMANCE.md only).
fn late_submit() -> bool {
    static V: OnceLock<bool> = OnceLock::new();
    *V.get_or_init(|| std::env::var_os("SBOD_DRIVE_LATE_SUBMIT").is_some_and(|v| v == "1"))
}

/// `SBOD_DRIVE_TRACE=SUFFIX`: every command a modelled drive whose name ends with SUFFIX
/// gets (`.img`: all of a bench's) printed to stderr as it arrives: `drive-trace NAME
/// MODEL_US KIND OFFSET LEN`, the model's clock in microseconds (docs/LAB.md).
fn trace() -> Option<&'static str> {
    static V: OnceLock<Option<String>> = OnceLock::new();
    V.get_or_init(|| {
        std::env::var("SBOD_DRIVE_TRACE")
            .ok()
            .filter(|v| !v.is_empty())
    })
    .as_deref()
}

/// A member that answers in a modelled drive's time.
pub struct ModelDev {
    name: String,
    inner: Arc<dyn BlockDev>,
    core: Arc<Core>,
}

impl ModelDev {
    /// `slow`: the model's clock runs that many times slower than the wall's (1: real time).
    pub fn new(
        name: String,
        inner: Arc<dyn BlockDev>,
        model: Box<dyn Model>,
        slow: u64,
    ) -> ModelDev {
        ModelDev {
            name,
            inner,
            core: Arc::new(Core {
                state: Mutex::new(State {
                    model,
                    slots: HashMap::new(),
                    armed: u64::MAX,
                    closed: false,
                }),
                next_id: AtomicU64::new(1),
                stats: Stats::default(),
                slow: slow.max(1),
            }),
        }
    }
}

fn op_of(req: &IoReq) -> Op {
    let (kind, len) = match &req.kind {
        IoKind::Read { buf } => (Kind::Read, buf.len() as u64),
        IoKind::Write { buf, fua } => (Kind::Write { fua: *fua }, buf.len() as u64),
        IoKind::Flush => (Kind::Flush, 0),
        IoKind::Zero { punch: true, len } => (Kind::Trim, *len),
        // Zeroing without deallocation writes the zeros (WRITE SAME does as much work).
        IoKind::Zero { len, .. } => (Kind::Write { fua: false }, *len),
    };
    Op {
        kind,
        offset: req.offset,
        len,
        urgent: req.class == sbod_core::dev::IoClass::Urgent,
    }
}

impl BlockDev for ModelDev {
    fn submit(&self, req: IoReq, done: Done) {
        let id = self.core.next_id.fetch_add(1, Ordering::Relaxed);
        let op = op_of(&req);
        let s = &self.core.stats;
        match op.kind {
            Kind::Read => s.reads.fetch_add(1, Ordering::Relaxed),
            Kind::Write { fua: true } => s.fua.fetch_add(1, Ordering::Relaxed),
            Kind::Write { .. } => s.writes.fetch_add(1, Ordering::Relaxed),
            Kind::Flush => s.flushes.fetch_add(1, Ordering::Relaxed),
            Kind::Trim => 0,
        };
        s.bytes.fetch_add(op.len, Ordering::Relaxed);
        if trace().is_some_and(|t| self.name.ends_with(t)) {
            let kind = match op.kind {
                Kind::Read => "read",
                Kind::Write { fua: true } => "write-fua",
                Kind::Write { .. } => "write",
                Kind::Flush => "flush",
                Kind::Trim => "trim",
            };
            // Model time in microseconds, as the drive sees the command arrive.
            eprintln!(
                "drive-trace {} {} {kind} {} {}",
                self.name,
                now_ns() / self.core.slow / 1000,
                op.offset,
                op.len
            );
        }
        let mut ready = Vec::new();
        {
            let mut st = self.core.state.lock();
            if st.closed {
                drop(st);
                return done(Err(io::Error::other("member is closed")));
            }
            st.slots.insert(
                id,
                Slot {
                    done: Some(done),
                    data: None,
                    timed: false,
                },
            );
            let now = now_ns();
            // What was due before now happens first, at its own time: the timer wakes a
            // little late, and a command that arrives in between must not move a drive's
            // completion (and its next dispatch) to now. A drive that finished a write at
            // T and takes the next one, queued, at T streams on; taken at T + 100 µs, the
            // sector has passed and it waits a revolution.
            if !late_submit() {
                self.core.run(&mut st, now, &mut ready);
            }
            st.model.submit(now / self.core.slow, id, op);
            self.core.run(&mut st, now, &mut ready);
        }
        for (d, r) in ready {
            d(r);
        }
        let core = self.core.clone();
        self.inner.submit(
            req,
            Box::new(move |r| {
                let fire = {
                    let mut st = core.state.lock();
                    match st.slots.get_mut(&id) {
                        Some(s) if s.timed => {
                            let mut s = st.slots.remove(&id).expect("present");
                            s.done.take().map(|d| (d, r))
                        }
                        Some(s) => {
                            s.data = Some(r);
                            None
                        }
                        None => None,
                    }
                };
                if let Some((d, r)) = fire {
                    d(r);
                }
            }),
        );
    }

    fn size(&self) -> u64 {
        self.inner.size()
    }

    fn current_size(&self) -> io::Result<u64> {
        self.inner.current_size()
    }

    fn name(&self) -> &str {
        &self.name
    }

    /// The data file's answer: a drive does not run out of space, but the sparse file
    /// that holds a modelled drive's data can.
    fn may_run_out(&self) -> bool {
        self.inner.may_run_out()
    }

    fn close(&self) {
        if std::env::var_os("SBOD_DRIVE_STATS").is_some_and(|v| v == "1")
            && !self.core.stats.said.swap(true, Ordering::Relaxed)
        {
            let s = &self.core.stats;
            let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
            let (busy, xfer) = self.core.state.lock().model.media_ns();
            eprintln!(
                "{}: {} reads, {} writes, {} FUA writes, {} flushes, {} bytes; media busy {} ms of model time, {} ms of it transferring; {} timer wake-ups, {} us late on average, {} us at most",
                self.name,
                g(&s.reads),
                g(&s.writes),
                g(&s.fua),
                g(&s.flushes),
                g(&s.bytes),
                busy / 1_000_000,
                xfer / 1_000_000,
                g(&s.ticks),
                g(&s.late_ns) / g(&s.ticks).max(1) / 1000,
                g(&s.late_max_ns) / 1000
            );
            let by_kind = self.core.state.lock().model.breakdown();
            if !by_kind.is_empty() {
                eprintln!("{}: media time by kind: {by_kind}", self.name);
            }
        }
        let slots: Vec<Slot> = {
            let mut st = self.core.state.lock();
            st.closed = true;
            st.slots.drain().map(|(_, s)| s).collect()
        };
        for mut s in slots {
            if let Some(d) = s.done.take() {
                d(Err(io::Error::other("member is closed")));
            }
        }
        self.inner.close();
    }

    fn queue(&self) -> &'static str {
        "model"
    }
}

impl Drop for ModelDev {
    fn drop(&mut self) {
        let slots: Vec<Slot> = self
            .core
            .state
            .lock()
            .slots
            .drain()
            .map(|(_, s)| s)
            .collect();
        for mut s in slots {
            if let Some(d) = s.done.take() {
                d(Err(io::Error::other("member is closed")));
            }
        }
    }
}

/// The one timer thread of the process: a heap of (deadline, drive).
struct Timer {
    heap: Mutex<BinaryHeap<Reverse<(u64, u64)>>>,
    drives: Mutex<HashMap<u64, Weak<Core>>>,
    wake: Condvar,
    seq: AtomicU64,
    started: AtomicBool,
}

fn timer() -> &'static Timer {
    static T: OnceLock<Timer> = OnceLock::new();
    let t = T.get_or_init(|| Timer {
        heap: Mutex::new(BinaryHeap::new()),
        drives: Mutex::new(HashMap::new()),
        wake: Condvar::new(),
        seq: AtomicU64::new(0),
        started: AtomicBool::new(false),
    });
    if !t.started.swap(true, Ordering::AcqRel) {
        std::thread::Builder::new()
            .name("sbod-drive-timer".into())
            .spawn(|| timer().run())
            .expect("starting the modelled drives' timer thread");
    }
    t
}

impl Timer {
    fn arm(&self, at: u64, core: Weak<Core>) {
        let key = self.seq.fetch_add(1, Ordering::Relaxed);
        self.drives.lock().insert(key, core);
        let mut h = self.heap.lock();
        let earliest = h.peek().is_none_or(|e| at < e.0 .0);
        h.push(Reverse((at, key)));
        drop(h);
        if earliest {
            self.wake.notify_one();
        }
    }

    fn run(&self) {
        // Wake-ups within a microsecond of the deadline, not the default 50 µs slack.
        // SAFETY: prctl on this thread with an integer argument.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1000u64) };
        let mut h = self.heap.lock();
        loop {
            let now = now_ns();
            match h.peek().copied() {
                None => {
                    self.wake.wait(&mut h);
                }
                Some(Reverse((at, key))) if at <= now => {
                    h.pop();
                    drop(h);
                    let core = self.drives.lock().remove(&key).and_then(|w| w.upgrade());
                    if let Some(c) = core {
                        c.tick(at);
                    }
                    h = self.heap.lock();
                }
                Some(Reverse((at, _))) => {
                    self.wake.wait_for(&mut h, Duration::from_nanos(at - now));
                }
            }
        }
    }
}
