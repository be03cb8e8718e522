//! sbod's own codec figures (`sbod bench codec`), and the pieces the peer comparison
//! (`scripts/bench-codec.sh`) reuses so that sbod and its peers are measured on the same
//! buffers with the same clock.
//!
//! Rates are bytes of data shards per second of the measuring thread's CPU time: the
//! machines this runs on are shared and noisy, and CPU time does not count the time the
//! thread was not running. Wall-clock rates are reported alongside.

use crate::{Codec, Isa, Scheme};
use serde::{Deserialize, Serialize};
use std::alloc::{self, Layout};
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::time::{Duration, Instant};

/// A zero-filled heap buffer with a chosen alignment (4096 by default, like the engine's
/// I/O buffers).
pub struct AlignedBuf {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
    align: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like a Vec<u8>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only hands out &[u8].
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// `len` zero bytes aligned to 4096.
    pub fn new(len: usize) -> AlignedBuf {
        AlignedBuf::with_align(len, 4096)
    }

    /// `len` zero bytes aligned to `align` (a power of two).
    pub fn with_align(len: usize, align: usize) -> AlignedBuf {
        let layout = Layout::from_size_align(len.max(1), align).expect("valid alignment");
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = std::ptr::NonNull::new(ptr).unwrap_or_else(|| alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, len, align }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let layout = Layout::from_size_align(self.len.max(1), self.align).expect("valid alignment");
        // SAFETY: allocated in with_align with this layout.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), layout) }
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for len initialised bytes for the buffer's lifetime.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in deref, and &mut self makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Clone for AlignedBuf {
    fn clone(&self) -> AlignedBuf {
        let mut b = AlignedBuf::with_align(self.len, self.align);
        b.copy_from_slice(self);
        b
    }
}

impl fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AlignedBuf({} bytes, align {})", self.len, self.align)
    }
}

/// CPU time the calling thread has used (wall time where the OS cannot tell).
pub fn thread_cpu_time() -> Duration {
    clock(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// CPU time the whole process has used (all threads).
pub fn process_cpu_time() -> Duration {
    clock(libc::CLOCK_PROCESS_CPUTIME_ID)
}

fn clock(id: libc::clockid_t) -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec to write into.
    if unsafe { libc::clock_gettime(id, &mut ts) } != 0 {
        static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        return START.get_or_init(Instant::now).elapsed();
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// A buffer of pseudo-random bytes that [`StripeSet`]s are laid out in; grown on
/// demand and reused, so measuring many cases fills memory only once.
#[derive(Default)]
pub struct Pool {
    buf: Option<AlignedBuf>,
}

impl Pool {
    pub fn new() -> Pool {
        Pool::default()
    }

    /// `stripes` stripes of `shards` shards of `shard_bytes`, skewed by `skew` (see
    /// [`StripeSet`]); the bytes are whatever earlier users left (random at first).
    pub fn stripes(
        &mut self,
        stripes: usize,
        shards: usize,
        shard_bytes: usize,
        skew: usize,
    ) -> StripeSet<'_> {
        let stride = shard_bytes.next_multiple_of(4096) + skew;
        let stripe_stride = (stride * shards).next_multiple_of(4096);
        let need = stripe_stride * stripes;
        if self.buf.as_ref().is_none_or(|b| b.len() < need) {
            let mut buf = AlignedBuf::new(need);
            let mut x = 0x2545_f491_4f6c_dd1du64;
            for w in buf.chunks_mut(8) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                w.copy_from_slice(&x.to_le_bytes()[..w.len()]);
            }
            self.buf = Some(buf);
        }
        let buf = &mut self.buf.as_mut().expect("allocated above")[..need];
        StripeSet {
            buf,
            stripes,
            shards,
            shard_bytes,
            stride,
            stripe_stride,
        }
    }

    /// Enough stripes to fill `bytes` (at least `min`).
    pub fn stripes_for(
        &mut self,
        bytes: usize,
        min: usize,
        shards: usize,
        shard_bytes: usize,
        skew: usize,
    ) -> StripeSet<'_> {
        let n = (bytes / (shards * shard_bytes)).max(min);
        self.stripes(n, shards, shard_bytes, skew)
    }
}

/// Stripes of `k + m` shards laid out in a [`Pool`]: shard `s` of a stripe starts
/// `s * skew` bytes further into its 4 KiB page than shard 0 (with `skew` a multiple of
/// 128 this avoids the 4 KiB aliasing that cripples some kernels when every shard sits at
/// the same page offset; 0 puts every shard on a page boundary, like the engine's buffers).
pub struct StripeSet<'a> {
    buf: &'a mut [u8],
    /// Stripes in the set.
    pub stripes: usize,
    /// Shards per stripe.
    pub shards: usize,
    /// Bytes per shard.
    pub shard_bytes: usize,
    stride: usize,
    stripe_stride: usize,
}

impl StripeSet<'_> {
    /// Bytes the stripes' shards occupy.
    pub fn bytes(&self) -> usize {
        self.stripes * self.shards * self.shard_bytes
    }

    /// Raw pointers to the shards of stripe `i` (for foreign codecs).
    pub fn ptrs(&mut self, i: usize) -> Vec<*mut u8> {
        let base = i * self.stripe_stride;
        let p = self.buf.as_mut_ptr();
        // SAFETY: every shard offset lies inside buf (see Pool::stripes).
        (0..self.shards)
            .map(|s| unsafe { p.add(base + s * self.stride) })
            .collect()
    }

    /// Every stripe's shards as mutable slices, at once.
    pub fn all(&mut self) -> Vec<Vec<&mut [u8]>> {
        let (shards, stride, shard_bytes) = (self.shards, self.stride, self.shard_bytes);
        self.buf
            .chunks_mut(self.stripe_stride)
            .map(|stripe| {
                stripe
                    .chunks_mut(stride)
                    .take(shards)
                    .map(|s| &mut s[..shard_bytes])
                    .collect()
            })
            .collect()
    }

    /// The shards of stripe `i` as mutable slices.
    pub fn stripe(&mut self, i: usize) -> Vec<&mut [u8]> {
        let base = i * self.stripe_stride;
        let mut rest: &mut [u8] = &mut self.buf[base..base + self.stripe_stride];
        let mut out = Vec::with_capacity(self.shards);
        for _ in 0..self.shards {
            let (shard, tail) = std::mem::take(&mut rest).split_at_mut(self.stride);
            out.push(&mut shard[..self.shard_bytes]);
            rest = tail;
        }
        out
    }
}

/// A rate measured over several rounds.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub struct Rate {
    /// Median over the rounds, GB/s (10^9 bytes) of CPU time.
    pub gbps: f64,
    /// Best round, GB/s of CPU time.
    pub best_gbps: f64,
    /// Median over the rounds, GB/s of wall-clock time.
    pub wall_gbps: f64,
}

impl Rate {
    /// Median and best of per-round CPU-time rates, median of wall-clock rates.
    pub fn from_rounds(cpu: &[f64], wall: &[f64]) -> Rate {
        let median = |v: &[f64]| {
            let mut v = v.to_vec();
            v.sort_by(|a, b| a.total_cmp(b));
            v.get(v.len() / 2).copied().unwrap_or(0.0)
        };
        Rate {
            gbps: median(cpu),
            best_gbps: cpu.iter().copied().fold(0.0, f64::max),
            wall_gbps: median(wall),
        }
    }
}

/// How long and how often to measure.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct Timing {
    /// CPU time per round.
    pub budget: Duration,
    /// Rounds (the median is reported).
    pub rounds: usize,
}

impl Default for Timing {
    fn default() -> Timing {
        Timing {
            budget: Duration::from_millis(15),
            rounds: 3,
        }
    }
}

/// Per-stripe prepared arguments of an encode: data shards, parity shards.
type EncodeArgs<'a> = (Vec<&'a [u8]>, Vec<&'a mut [u8]>);
/// Per-stripe prepared arguments of an update: old data, new data, parity shards.
type UpdateArgs<'a> = (&'a [u8], &'a [u8], Vec<&'a mut [u8]>);

/// Times a call `f(i)` (i = 0, 1, 2, ...; each call processes `bytes_per_call` bytes)
/// one round at a time, so that several codecs can take turns round by round.
///
/// The clock is read once per batch of calls (reading a CPU-time clock is a system call,
/// which would dwarf a 4 KiB stripe); batches grow until they last a sixteenth of the
/// round.
pub struct Meter<F: FnMut(usize)> {
    f: F,
    i: usize,
    batch: usize,
    bytes_per_call: usize,
    process_clock: bool,
    cpu: Vec<f64>,
    wall: Vec<f64>,
}

impl<F: FnMut(usize)> Meter<F> {
    /// With `process_clock`, CPU time is counted over all threads (multi-threaded calls).
    pub fn new(bytes_per_call: usize, process_clock: bool, f: F) -> Meter<F> {
        Meter {
            f,
            i: 0,
            batch: 1,
            bytes_per_call,
            process_clock,
            cpu: Vec::new(),
            wall: Vec::new(),
        }
    }

    /// Untimed calls.
    pub fn warm(&mut self, calls: usize) {
        for _ in 0..calls {
            (self.f)(self.i);
            self.i += 1;
        }
    }

    /// Call until `budget` of CPU time is used; records and returns GB/s of CPU time.
    pub fn round(&mut self, budget: Duration) -> f64 {
        let clock = if self.process_clock {
            process_cpu_time
        } else {
            thread_cpu_time
        };
        let (c0, w0) = (clock(), Instant::now());
        let mut calls = 0usize;
        loop {
            let b0 = clock();
            for _ in 0..self.batch {
                (self.f)(self.i);
                self.i += 1;
            }
            calls += self.batch;
            let now = clock();
            if (now - b0) * 16 < budget {
                self.batch *= 2;
            }
            if now - c0 >= budget {
                break;
            }
        }
        let bytes = (calls * self.bytes_per_call) as f64;
        let gbps = bytes / (clock() - c0).as_secs_f64() / 1e9;
        self.cpu.push(gbps);
        self.wall.push(bytes / w0.elapsed().as_secs_f64() / 1e9);
        gbps
    }

    /// Median and best over the rounds so far.
    pub fn rate(&self) -> Rate {
        Rate::from_rounds(&self.cpu, &self.wall)
    }
}

/// `warm` untimed calls, then `timing.rounds` rounds of [`Meter::round`].
pub fn measure(
    timing: Timing,
    warm: usize,
    bytes_per_call: usize,
    process_clock: bool,
    f: impl FnMut(usize),
) -> Rate {
    let mut m = Meter::new(bytes_per_call, process_clock, f);
    m.warm(warm);
    for _ in 0..timing.rounds.max(1) {
        m.round(timing.budget);
    }
    m.rate()
}

/// The memory-bandwidth reference: a large copy.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub struct Ceiling {
    /// Bytes copied per second of CPU time, GB/s: the better of the two copies below.
    pub copy_gbps: f64,
    /// The C library's memcpy (`copy_from_slice`).
    pub memcpy_gbps: f64,
    /// A copy with streaming stores (sbod's XOR kernel with one source).
    pub stream_copy_gbps: f64,
    /// Bytes read plus written per second (twice the copy rate), GB/s: what a streaming
    /// kernel's reads and writes are compared with.
    pub traffic_gbps: f64,
    /// Size of each of the two buffers, bytes.
    pub bytes: usize,
}

/// Copy one `bytes`-sized buffer into another, whole, repeatedly: with the C library's
/// memcpy and with streaming stores (the `isa` XOR kernel with one source); the better
/// one is the ceiling.
pub fn memory_ceiling(pool: &mut Pool, bytes: usize, timing: Timing, isa: Isa) -> Ceiling {
    let mut set = pool.stripes(1, 2, bytes, 0);
    let mut s = set.stripe(0);
    let (src, dst) = s.split_at_mut(1);
    let memcpy = measure(timing, 1, bytes, false, |_| {
        dst[0].copy_from_slice(src[0]);
        std::hint::black_box(&mut dst[0]);
    });
    let copy = Codec::with_isa(Scheme::Xor { k: 1 }, isa).expect("a supported ISA");
    let stream = measure(timing, 1, bytes, false, |_| {
        copy.encode(&[src[0]], dst).expect("shapes match");
        std::hint::black_box(&mut dst[0]);
    });
    let best = memcpy.gbps.max(stream.gbps);
    Ceiling {
        copy_gbps: best,
        memcpy_gbps: memcpy.gbps,
        stream_copy_gbps: stream.gbps,
        traffic_gbps: 2.0 * best,
        bytes,
    }
}

/// What a row measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Op {
    /// Compute all parity from the data.
    Encode,
    /// `encode_par` over all cores.
    EncodePar,
    /// Rebuild `lost` data shards (the first ones: the costliest case).
    Decode { lost: usize },
    /// Read-modify-write of one data shard: parity from old data, new data, old parity.
    Update,
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::Encode => write!(f, "encode"),
            Op::EncodePar => write!(f, "encode-par"),
            Op::Decode { lost } => write!(f, "decode {lost} lost"),
            Op::Update => write!(f, "update"),
        }
    }
}

/// One geometry and operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Case {
    pub scheme: Scheme,
    pub op: Op,
}

impl Case {
    /// What reports call the case, e.g. "cauchy 10+4 encode" (and what `--filter` matches).
    pub fn name(&self) -> String {
        format!("{} {}", self.scheme, self.op)
    }

    /// The cases scripts/bench-codec.sh compares with ISA-L and klauspost/reedsolomon:
    /// 7+1 XOR, 8+2 P+Q, and 10+2, 10+4, 16+4 Cauchy encode and decode of 1 and 2 lost.
    pub fn peer() -> Vec<Case> {
        let mut v = vec![
            Case {
                scheme: Scheme::Xor { k: 7 },
                op: Op::Encode,
            },
            Case {
                scheme: Scheme::PQ { k: 8 },
                op: Op::Encode,
            },
        ];
        for (k, m) in [(10, 2), (10, 4), (16, 4)] {
            for op in [Op::Encode, Op::Decode { lost: 1 }, Op::Decode { lost: 2 }] {
                v.push(Case {
                    scheme: Scheme::Cauchy { k, m },
                    op,
                });
            }
        }
        v
    }

    /// [`Case::peer`] plus what only sbod does or measures: P+Q decode, read-modify-write
    /// updates and the multi-core encode.
    pub fn standard() -> Vec<Case> {
        let mut v = Case::peer();
        let more = [
            (Scheme::PQ { k: 8 }, Op::Decode { lost: 2 }),
            (Scheme::PQ { k: 8 }, Op::Update),
            (Scheme::Cauchy { k: 10, m: 4 }, Op::Update),
            (Scheme::Cauchy { k: 10, m: 4 }, Op::EncodePar),
        ];
        v.extend(more.into_iter().map(|(scheme, op)| Case { scheme, op }));
        v
    }

    /// (bytes read + bytes written) per data byte, for the percentage of the memory ceiling.
    pub fn traffic_per_byte(&self) -> f64 {
        let (k, m) = (self.scheme.k() as f64, self.scheme.m() as f64);
        match self.op {
            Op::Encode | Op::EncodePar => (k + m) / k,
            Op::Decode { lost } => (k + lost as f64) / k,
            // Read old, new and m parities, write m parities, per byte of new data.
            Op::Update => 2.0 + 2.0 * m,
        }
    }

    /// Data bytes one call processes with shards of `shard` bytes.
    pub fn data_bytes(&self, shard: usize) -> usize {
        match self.op {
            Op::Update => shard,
            _ => self.scheme.k() * shard,
        }
    }
}

/// Whether a row's working set stays in cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WorkingSet {
    /// One stripe, used over and over.
    Cache,
    /// Stripes filling [`Options::stream_bytes`], used in turn: the data comes from memory.
    Stream,
}

impl fmt::Display for WorkingSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WorkingSet::Cache => "cache",
            WorkingSet::Stream => "stream",
        })
    }
}

/// What [`run`] measures.
#[derive(Clone, Debug)]
pub struct Options {
    /// Kernels to measure; `None` = what `Codec::new` would use.
    pub isa: Option<Isa>,
    pub cases: Vec<Case>,
    pub shard_sizes: Vec<usize>,
    pub working_sets: Vec<WorkingSet>,
    /// Size of the streaming working set (well above the last-level cache).
    pub stream_bytes: usize,
    /// Byte offset between consecutive shards' page offsets (see [`StripeSet`]).
    pub skew: usize,
    /// Threads for [`Op::EncodePar`]; 0 = all available.
    pub threads: usize,
    pub timing: Timing,
}

impl Default for Options {
    /// The quick run: every standard case, 4 KiB / 64 KiB / 1 MiB shards, cache and
    /// streaming, 3 rounds of 15 ms each (a few seconds in all).
    fn default() -> Options {
        Options {
            isa: None,
            cases: Case::standard(),
            shard_sizes: vec![4096, 65536, 1 << 20],
            working_sets: vec![WorkingSet::Cache, WorkingSet::Stream],
            stream_bytes: 256 << 20,
            skew: 128,
            threads: 0,
            timing: Timing::default(),
        }
    }
}

impl Options {
    /// Longer rounds for steadier figures (about ten times the quick run).
    pub fn long() -> Options {
        Options {
            timing: Timing {
                budget: Duration::from_millis(60),
                rounds: 7,
            },
            ..Options::default()
        }
    }
}

/// One measured row.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Row {
    /// e.g. "cauchy 10+4 encode".
    pub case: String,
    pub k: usize,
    pub m: usize,
    pub op: Op,
    pub shard_bytes: usize,
    pub working_set: WorkingSet,
    /// Bytes of shards the row cycles through.
    pub working_set_bytes: usize,
    pub threads: usize,
    #[serde(flatten)]
    pub rate: Rate,
    /// Bytes read and written per second as a percentage of the copy's (streaming rows).
    pub pct_of_ceiling: Option<f64>,
}

/// Everything [`run`] found.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Report {
    pub cpu: String,
    /// The kernels measured.
    pub isa: Isa,
    /// Every kernel family this CPU supports.
    pub supported: Vec<Isa>,
    pub skew: usize,
    pub clock: String,
    pub ceiling: Ceiling,
    pub rows: Vec<Row>,
}

/// The CPU's model name, from /proc/cpuinfo where there is one.
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

/// Measure sbod's codec.
pub fn run(opts: &Options) -> Report {
    let isa = opts.isa.unwrap_or_else(Isa::selected);
    let mut pool = Pool::new();
    let ceiling = memory_ceiling(&mut pool, opts.stream_bytes / 2, opts.timing, isa);
    let threads = if opts.threads == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        opts.threads
    };
    let mut rows = Vec::new();
    for case in &opts.cases {
        let Ok(codec) = Codec::with_isa(case.scheme, isa) else {
            continue;
        };
        for &shard in &opts.shard_sizes {
            for &ws in &opts.working_sets {
                let bytes = match ws {
                    WorkingSet::Cache => 0,
                    WorkingSet::Stream => opts.stream_bytes,
                };
                let t = if case.op == Op::EncodePar { threads } else { 1 };
                let (rate, set_bytes) = measure_case(
                    &mut pool,
                    &codec,
                    case,
                    shard,
                    bytes,
                    opts.skew,
                    t,
                    opts.timing,
                );
                rows.push(Row {
                    case: case.name(),
                    k: case.scheme.k(),
                    m: case.scheme.m(),
                    op: case.op,
                    shard_bytes: shard,
                    working_set: ws,
                    working_set_bytes: set_bytes,
                    threads: t,
                    rate,
                    pct_of_ceiling: (ws == WorkingSet::Stream && t == 1).then(|| {
                        100.0 * rate.gbps * case.traffic_per_byte() / ceiling.traffic_gbps
                    }),
                });
            }
        }
    }
    Report {
        cpu: cpu_model(),
        isa,
        supported: Isa::supported(),
        skew: opts.skew,
        clock: "GB/s = 10^9 data-shard bytes per second of the measuring thread's CPU time \
                (process CPU time for multi-threaded rows)"
            .into(),
        ceiling,
        rows,
    }
}

/// Measure one case; returns the rate and the working-set size.
#[allow(clippy::too_many_arguments)]
pub fn measure_case(
    pool: &mut Pool,
    codec: &Codec,
    case: &Case,
    shard: usize,
    stream_bytes: usize,
    skew: usize,
    threads: usize,
    timing: Timing,
) -> (Rate, usize) {
    let mut set = case_stripes(pool, codec, case, shard, stream_bytes, skew);
    let (stripes, bytes) = (set.stripes, set.bytes());
    let per_call = case.data_bytes(shard);
    let f = sbod_call(codec, case, &mut set, threads);
    (
        measure(timing, stripes.min(2), per_call, threads > 1, f),
        bytes,
    )
}

/// The stripes a case cycles through: one (cache-resident) or enough to fill
/// `stream_bytes`. The bytes are random, not valid stripes: decoding garbage costs the same.
pub fn case_stripes<'a>(
    pool: &'a mut Pool,
    codec: &Codec,
    case: &Case,
    shard: usize,
    stream_bytes: usize,
    skew: usize,
) -> StripeSet<'a> {
    // Update rows read old and new data: one extra shard per stripe holds the new data.
    let extra = usize::from(case.op == Op::Update);
    pool.stripes_for(stream_bytes, 1, codec.k() + codec.m() + extra, shard, skew)
}

/// The call that runs `case` with sbod on stripe `i % stripes` of `set`, with every
/// shard reference prepared in advance (no allocation per call, like a foreign codec
/// handed raw pointers).
pub fn sbod_call<'a>(
    codec: &'a Codec,
    case: &Case,
    set: &'a mut StripeSet<'_>,
    threads: usize,
) -> Box<dyn FnMut(usize) + 'a> {
    let (k, m) = (codec.k(), codec.m());
    let n = set.stripes;
    let all = set.all();
    match case.op {
        Op::Encode | Op::EncodePar => {
            let mut v: Vec<EncodeArgs> = all
                .into_iter()
                .map(|mut s| {
                    let parity = s.split_off(k);
                    (s.into_iter().map(|d| &*d).collect(), parity)
                })
                .collect();
            Box::new(move |i| {
                let (data, parity) = &mut v[i % n];
                if threads > 1 {
                    codec
                        .encode_par(data, parity, threads)
                        .expect("shapes match");
                } else {
                    codec.encode(data, parity).expect("shapes match");
                }
            })
        }
        Op::Decode { lost } => {
            let present: Vec<bool> = (0..k + m).map(|i| i >= lost).collect();
            let mut v = all;
            Box::new(move |i| {
                codec
                    .reconstruct(&mut v[i % n], &present)
                    .expect("decodable")
            })
        }
        Op::Update => {
            // The extra shard plays the new data (the bytes' values do not change the work).
            let mut v: Vec<UpdateArgs> = all
                .into_iter()
                .map(|mut s| {
                    let new = s.pop().expect("spare shard");
                    let parity = s.split_off(k);
                    let old = s.swap_remove(0);
                    (&*old, &*new, parity)
                })
                .collect();
            Box::new(move |i| {
                let (old, new, parity) = &mut v[i % n];
                codec.update(0, old, new, parity).expect("shapes match");
            })
        }
    }
}

fn size(b: usize) -> String {
    if b >= 1 << 20 && b.is_multiple_of(1 << 20) {
        format!("{} MiB", b >> 20)
    } else if b >= 1024 && b.is_multiple_of(1024) {
        format!("{} KiB", b >> 10)
    } else {
        format!("{b} B")
    }
}

/// The human-readable table.
pub fn print_table(r: &Report) {
    println!("sbod codec: {} kernels on {}", r.isa, r.cpu);
    println!(
        "supported: {}",
        r.supported
            .iter()
            .map(|i| i.name())
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!("{}; shard skew {} B", r.clock, r.skew);
    println!(
        "memory ceiling: copy of {}: {:.1} GB/s copied (memcpy {:.1}, streaming stores {:.1}), \
         {:.1} GB/s read+written",
        size(r.ceiling.bytes),
        r.ceiling.copy_gbps,
        r.ceiling.memcpy_gbps,
        r.ceiling.stream_copy_gbps,
        r.ceiling.traffic_gbps
    );
    println!();
    println!(
        "{:<28} {:>8} {:>7} {:>8} {:>8} {:>8} {:>9}",
        "case", "shard", "set", "GB/s", "best", "wall", "% ceiling"
    );
    for row in &r.rows {
        let set = match row.working_set {
            WorkingSet::Cache => "cache".to_string(),
            WorkingSet::Stream => format!("{}M", row.working_set_bytes >> 20),
        };
        let case = if row.threads > 1 {
            format!("{} x{}", row.case, row.threads)
        } else {
            row.case.clone()
        };
        println!(
            "{:<28} {:>8} {:>7} {:>8.1} {:>8.1} {:>8.1} {:>9}",
            case,
            size(row.shard_bytes),
            set,
            row.rate.gbps,
            row.rate.best_gbps,
            row.rate.wall_gbps,
            row.pct_of_ceiling
                .map_or(String::new(), |p| format!("{p:.0}%"))
        );
    }
}
