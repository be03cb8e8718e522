//! Kernel selection ([`Isa`]) and execution plans ([`Plan`]): a coefficient matrix turned
//! into the tables one instruction set needs, run over caller-owned buffers.

pub(crate) mod portable;
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86;

use std::fmt;
use std::str::FromStr;
use std::sync::OnceLock;

/// The instruction set a codec's kernels use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Isa {
    /// Table lookups, one byte at a time; runs anywhere.
    Portable,
    /// 256-bit `vpshufb` split-nibble multiply.
    Avx2,
    /// 512-bit `vpshufb` with `vpternlogq` (AVX-512F + AVX-512BW).
    Avx512,
    /// `gf2p8affineqb` on 256-bit vectors (GFNI + AVX2).
    GfniAvx2,
    /// `gf2p8affineqb` on 512-bit vectors (GFNI + AVX-512F + AVX-512BW).
    GfniAvx512,
}

impl Isa {
    /// Every variant, slowest first.
    pub const ALL: [Isa; 5] = [
        Isa::Portable,
        Isa::Avx2,
        Isa::Avx512,
        Isa::GfniAvx2,
        Isa::GfniAvx512,
    ];

    /// The name `SBOD_CODEC_ISA` accepts.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
            Isa::GfniAvx2 => "gfni-avx2",
            Isa::GfniAvx512 => "gfni-avx512",
        }
    }

    /// Whether this CPU (and OS) can run the variant.
    pub fn is_supported(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            match self {
                Isa::Portable => true,
                Isa::Avx2 => has!("avx2"),
                Isa::Avx512 => has!("avx512f") && has!("avx512bw"),
                Isa::GfniAvx2 => has!("avx2") && has!("gfni"),
                Isa::GfniAvx512 => has!("avx512f") && has!("avx512bw") && has!("gfni"),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            self == Isa::Portable
        }
    }

    /// The variants this CPU can run, slowest first.
    pub fn supported() -> Vec<Isa> {
        Isa::ALL.into_iter().filter(|i| i.is_supported()).collect()
    }

    /// The fastest variant this CPU supports (no self-test, no environment override).
    pub fn best() -> Isa {
        *Isa::supported().last().unwrap_or(&Isa::Portable)
    }

    /// The variant new codecs use: `SBOD_CODEC_ISA` if set (and supported), else
    /// [`Isa::best`]; decided once per process. The first time a SIMD variant is chosen it
    /// is checked against the portable kernels on random data, and if they ever disagree
    /// the process falls back to portable (and says so on stderr): wrong parity is never
    /// an acceptable price for speed.
    pub fn selected() -> Isa {
        static SELECTED: OnceLock<Isa> = OnceLock::new();
        *SELECTED.get_or_init(|| {
            let mut isa = Isa::best();
            if let Ok(v) = std::env::var("SBOD_CODEC_ISA") {
                match v.parse::<Isa>() {
                    Ok(forced) if forced.is_supported() => isa = forced,
                    Ok(forced) => eprintln!(
                        "sbod-codec: SBOD_CODEC_ISA={v}: this CPU lacks {}, using {}",
                        forced.name(),
                        isa.name()
                    ),
                    Err(e) => eprintln!("sbod-codec: SBOD_CODEC_ISA: {e}; using {}", isa.name()),
                }
            }
            if isa != Isa::Portable {
                if let Err(what) = crate::selftest::check(isa) {
                    eprintln!(
                        "sbod-codec: the {} kernels disagree with the portable ones ({what}); \
                         using portable kernels",
                        isa.name()
                    );
                    isa = Isa::Portable;
                }
            }
            isa
        })
    }

    /// Most outputs one kernel pass computes (more are done in groups).
    pub(crate) fn max_outputs(self) -> usize {
        match self {
            Isa::Portable => usize::MAX,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => x86::avx2::MAXN,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => x86::avx512::MAXN,
            #[cfg(target_arch = "x86_64")]
            Isa::GfniAvx2 => x86::gfni_avx2::MAXN,
            #[cfg(target_arch = "x86_64")]
            Isa::GfniAvx512 => x86::gfni_avx512::MAXN,
            #[cfg(not(target_arch = "x86_64"))]
            _ => unreachable!(),
        }
    }

    /// Append the kernel table for coefficient `c`.
    fn coef_table(self, c: u8, out: &mut Vec<u8>) {
        match self {
            Isa::Portable => out.push(c),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => x86::avx2::coef_table(c, out),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => x86::avx512::coef_table(c, out),
            #[cfg(target_arch = "x86_64")]
            Isa::GfniAvx2 => x86::gfni_avx2::coef_table(c, out),
            #[cfg(target_arch = "x86_64")]
            Isa::GfniAvx512 => x86::gfni_avx512::coef_table(c, out),
            #[cfg(not(target_arch = "x86_64"))]
            _ => unreachable!(),
        }
    }

    /// Vector width in bytes (alignment needed for streaming stores).
    fn width(self) -> usize {
        match self {
            Isa::Portable => 1,
            Isa::Avx2 | Isa::GfniAvx2 => 32,
            Isa::Avx512 | Isa::GfniAvx512 => 64,
        }
    }
}

impl fmt::Display for Isa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Isa {
    type Err = String;
    fn from_str(s: &str) -> Result<Isa, String> {
        let s = s.trim().to_ascii_lowercase();
        if s == "gfni" {
            // The best GFNI form this CPU has (512-bit if it can).
            return Ok(
                if Isa::GfniAvx512.is_supported() || !Isa::GfniAvx2.is_supported() {
                    Isa::GfniAvx512
                } else {
                    Isa::GfniAvx2
                },
            );
        }
        Isa::ALL
            .into_iter()
            .find(|i| i.name() == s || (s == "avx512bw" && *i == Isa::Avx512))
            .ok_or_else(|| {
                format!("unknown codec ISA {s:?} (portable, avx2, avx512, gfni, gfni-avx2, gfni-avx512)")
            })
    }
}

/// What a plan does with its outputs.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Mode {
    /// outputs = the products
    Set,
    /// outputs = the products, and the outputs are not read again soon (parity headed
    /// for the disk): long ones bypass the cache with streaming stores.
    SetCold,
    /// outputs ^= the products
    Acc,
}

/// Which kernel shape a coefficient matrix allows.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Shape {
    /// One output, every coefficient 1: plain XOR.
    Xor,
    /// Two outputs, coefficients 1 and 2^j: md raid6 P and Q.
    PQ,
    /// Anything: table multiply.
    General,
}

/// XOR and P+Q outputs at or above this length are written with streaming stores when the
/// caller says they are cold ([`Mode::SetCold`]: parity headed for the disk): they bypass
/// the cache, with no read-for-ownership, which lifts these memory-bound kernels by about
/// a fifth once the data comes from memory (measured on Zen 3 from 64 KiB shards). Below
/// it, and for the compute-bound general kernel at any length, cache stores measured
/// better (at 4 KiB streaming stores halved XOR speed). It was 64 KiB; on the AVX-512
/// guest, with 64 KiB shards from cache, XOR 7+1 then ran at 0.80-0.82 of ISA-L's
/// `xor_gen` and P+Q 8+2 at 0.98 of `pq_gen`, and with cache stores at 1.03-1.04 and 1.48,
/// while streaming 64 KiB stayed ahead (1.01-1.03 and 1.10; scripts/bench-codec-ab.sh,
/// docs/PERFORMANCE.md).
pub(crate) const STREAM_MIN: usize = 128 * 1024;

/// Most sources one kernel pass reads when shards are long: more concurrent streams than
/// this outrun the hardware prefetchers (measured on Zen 3: 16+4 with 1 MiB shards went
/// from 0.7x klauspost/reedsolomon, which also caps a pass at 10 inputs, to parity; the
/// extra pass over the partial results costs less than it saves).
const SRC_GROUP: usize = 10;
/// Shards shorter than this are done in one pass whatever their count (the streams are
/// short; a second pass only costs).
const SRC_GROUP_MIN_LEN: usize = 32 * 1024;
/// Block length per source-group pass: the partial results of one block stay in L2.
const SRC_GROUP_BLOCK: usize = 64 * 1024;

/// Call `f` with the outputs' base pointers, without a heap allocation for the usual
/// handful of outputs (small stripes are a few microseconds; an allocation shows).
#[cfg(target_arch = "x86_64")]
fn with_ptrs<R>(outs: &mut [&mut [u8]], f: impl FnOnce(&[*mut u8]) -> R) -> R {
    const INLINE: usize = 16;
    if outs.len() <= INLINE {
        let mut a = [std::ptr::null_mut(); INLINE];
        for (p, o) in a.iter_mut().zip(outs.iter_mut()) {
            *p = o.as_mut_ptr();
        }
        f(&a[..outs.len()])
    } else {
        let v: Vec<*mut u8> = outs.iter_mut().map(|o| o.as_mut_ptr()).collect();
        f(&v)
    }
}

/// A `rows x cols` coefficient matrix prepared for one instruction set.
pub(crate) struct Plan {
    isa: Isa,
    rows: usize,
    cols: usize,
    /// Row-major coefficients (the portable kernels and the tails use these).
    coef: Vec<u8>,
    shape: Shape,
    groups: Vec<Group>,
}

/// Outputs `first..first + n`, computed in one pass over the sources.
struct Group {
    first: usize,
    n: usize,
    /// Kernel tables, source-major: source `j`, output `r` at `(j * n + r) * CB`.
    tab: Vec<u8>,
}

impl Plan {
    pub(crate) fn new(isa: Isa, coef: Vec<u8>, rows: usize, cols: usize) -> Plan {
        assert_eq!(coef.len(), rows * cols);
        assert!(isa.is_supported(), "{isa} kernels on a CPU without them");
        let shape = if rows == 1 && coef.iter().all(|&c| c == 1) {
            Shape::Xor
        } else if rows == 2
            && cols >= 1
            && coef[..cols].iter().all(|&c| c == 1)
            && (0..cols).all(|j| coef[cols + j] == crate::gf::exp(j))
        {
            Shape::PQ
        } else {
            Shape::General
        };
        let mut groups = Vec::new();
        if isa != Isa::Portable {
            // Balanced groups of at most max_outputs rows.
            let ng = rows.div_ceil(isa.max_outputs()).max(1);
            let mut first = 0;
            for g in 0..ng {
                let n = rows / ng + usize::from(g < rows % ng);
                let mut tab = Vec::new();
                for j in 0..cols {
                    for r in first..first + n {
                        isa.coef_table(coef[r * cols + j], &mut tab);
                    }
                }
                groups.push(Group { first, n, tab });
                first += n;
            }
        }
        Plan {
            isa,
            rows,
            cols,
            coef,
            shape,
            groups,
        }
    }

    pub(crate) fn isa(&self) -> Isa {
        self.isa
    }

    pub(crate) fn rows(&self) -> usize {
        self.rows
    }

    pub(crate) fn row(&self, r: usize) -> &[u8] {
        &self.coef[r * self.cols..(r + 1) * self.cols]
    }

    /// `outs[r] (=|^=) sum_j coef(r, j) * srcs[j]`. All slices have the same length.
    pub(crate) fn run(&self, srcs: &[&[u8]], outs: &mut [&mut [u8]], mode: Mode) {
        debug_assert_eq!(srcs.len(), self.cols);
        debug_assert_eq!(outs.len(), self.rows);
        let len = outs.first().map_or(0, |o| o.len());
        debug_assert!(srcs.iter().all(|s| s.len() == len) && outs.iter().all(|o| o.len() == len));
        if self.cols == 0 {
            if mode != Mode::Acc {
                outs.iter_mut().for_each(|o| o.fill(0));
            }
            return;
        }
        let done = self.run_simd(srcs, outs, mode, len);
        if done < len {
            for (r, o) in outs.iter_mut().enumerate() {
                let tails: Vec<&[u8]> = srcs.iter().map(|s| &s[done..]).collect();
                match mode {
                    Mode::Set | Mode::SetCold => portable::dot(self.row(r), &tails, &mut o[done..]),
                    Mode::Acc => portable::dot_acc(self.row(r), &tails, &mut o[done..]),
                }
            }
        }
    }

    /// The SIMD part of [`Plan::run`]; returns how many leading bytes it covered.
    #[cfg(target_arch = "x86_64")]
    fn run_simd(&self, srcs: &[&[u8]], outs: &mut [&mut [u8]], mode: Mode, len: usize) -> usize {
        if self.isa == Isa::Portable {
            return 0;
        }
        with_ptrs(outs, |ptrs| self.run_ptrs(srcs, ptrs, mode, len))
    }

    #[cfg(target_arch = "x86_64")]
    fn run_ptrs(&self, srcs: &[&[u8]], ptrs: &[*mut u8], mode: Mode, len: usize) -> usize {
        use x86::Store;
        let store = match mode {
            Mode::Acc => Store::Acc,
            Mode::SetCold
                if self.shape != Shape::General
                    && len >= STREAM_MIN
                    && ptrs
                        .iter()
                        .all(|p| (*p as usize).is_multiple_of(self.isa.width())) =>
            {
                Store::Stream
            }
            Mode::Set | Mode::SetCold => Store::Plain,
        };
        macro_rules! on {
            ($m:ident) => {{
                use x86::$m as k;
                // SAFETY: the plan was built for this ISA only if the CPU supports it
                // (asserted in Plan::new); every slice is `len` bytes and the kernels
                // touch bytes below `done <= len` only.
                unsafe {
                    match self.shape {
                        Shape::Xor => {
                            let done = len / k::XSTEP * k::XSTEP;
                            k::xor_n(srcs, ptrs[0], 0, done, store);
                            done
                        }
                        Shape::PQ if mode != Mode::Acc => {
                            let done = len / k::PQSTEP * k::PQSTEP;
                            k::pq(srcs, ptrs[0], ptrs[1], 0, done, store);
                            done
                        }
                        _ => {
                            let done = len / k::STEP * k::STEP;
                            let sg = if len >= SRC_GROUP_MIN_LEN {
                                SRC_GROUP
                            } else {
                                usize::MAX
                            };
                            if self.groups.len() == 1 && self.cols <= sg {
                                let g = &self.groups[0];
                                k::dot(g.tab.as_ptr(), srcs, false, ptrs, 0, done, store);
                            } else {
                                // Several passes over each block: over output groups (too
                                // many outputs for the registers) and over source groups
                                // (too many source streams for the hardware prefetchers).
                                // Several output groups read the same sources again, so
                                // their blocks are small enough to keep the sources in L2.
                                let blk = if self.groups.len() > 1 {
                                    (256 * 1024 / self.cols).clamp(k::STEP, 16 * 1024)
                                } else {
                                    SRC_GROUP_BLOCK
                                } / k::STEP
                                    * k::STEP;
                                let nsg = self.cols.div_ceil(sg);
                                let per = self.cols.div_ceil(nsg);
                                let mut b = 0;
                                while b < done {
                                    let e = (b + blk).min(done);
                                    for g in &self.groups {
                                        for s in 0..nsg {
                                            let j0 = s * per;
                                            let j1 = (j0 + per).min(self.cols);
                                            // The general kernel never streams, so
                                            // later passes can add to what the first
                                            // one left in cache.
                                            let st = if s == 0 { store } else { Store::Acc };
                                            k::dot(
                                                g.tab.as_ptr().add(j0 * g.n * k::CB),
                                                &srcs[j0..j1],
                                                false,
                                                &ptrs[g.first..g.first + g.n],
                                                b,
                                                e,
                                                st,
                                            );
                                        }
                                    }
                                    b = e;
                                }
                            }
                            done
                        }
                    }
                }
            }};
        }
        let done = match self.isa {
            Isa::Portable => 0,
            Isa::Avx2 => on!(avx2),
            Isa::Avx512 => on!(avx512),
            Isa::GfniAvx2 => on!(gfni_avx2),
            Isa::GfniAvx512 => on!(gfni_avx512),
        };
        if store == Store::Stream {
            // SAFETY: sfence has no preconditions; it orders the streaming stores before
            // anything this thread does next (e.g. handing the buffer to another thread).
            unsafe { std::arch::x86_64::_mm_sfence() };
        }
        done
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn run_simd(&self, _: &[&[u8]], _: &mut [&mut [u8]], _: Mode, _: usize) -> usize {
        0
    }

    /// Read-modify-write: `outs[r] ^= coef(r, col) * (old ^ new)` for every row.
    pub(crate) fn run_delta(&self, col: usize, old: &[u8], new: &[u8], outs: &mut [&mut [u8]]) {
        let len = old.len();
        let done = self.run_delta_simd(col, old, new, outs, len);
        if done < len {
            for (r, o) in outs.iter_mut().enumerate() {
                portable::mul_add_delta(
                    &mut o[done..],
                    &old[done..],
                    &new[done..],
                    self.coef[r * self.cols + col],
                );
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    fn run_delta_simd(
        &self,
        col: usize,
        old: &[u8],
        new: &[u8],
        outs: &mut [&mut [u8]],
        len: usize,
    ) -> usize {
        if self.isa == Isa::Portable {
            return 0;
        }
        with_ptrs(outs, |ptrs| self.run_delta_ptrs(col, old, new, ptrs, len))
    }

    #[cfg(target_arch = "x86_64")]
    fn run_delta_ptrs(
        &self,
        col: usize,
        old: &[u8],
        new: &[u8],
        ptrs: &[*mut u8],
        len: usize,
    ) -> usize {
        use x86::Store;
        let srcs = [old, new];
        macro_rules! on {
            ($m:ident) => {{
                use x86::$m as k;
                // SAFETY: as in run_simd; the table pointer stays inside the group's table
                // (column `col` of `cols`).
                unsafe {
                    if self.shape == Shape::Xor {
                        let done = len / k::XSTEP * k::XSTEP;
                        k::xor_n(&srcs, ptrs[0], 0, done, Store::Acc);
                        done
                    } else {
                        let done = len / k::STEP * k::STEP;
                        for g in &self.groups {
                            let tab = g.tab.as_ptr().add(col * g.n * k::CB);
                            k::dot(
                                tab,
                                &srcs,
                                true,
                                &ptrs[g.first..g.first + g.n],
                                0,
                                done,
                                Store::Acc,
                            );
                        }
                        done
                    }
                }
            }};
        }
        match self.isa {
            Isa::Portable => 0,
            Isa::Avx2 => on!(avx2),
            Isa::Avx512 => on!(avx512),
            Isa::GfniAvx2 => on!(gfni_avx2),
            Isa::GfniAvx512 => on!(gfni_avx512),
        }
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn run_delta_simd(&self, _: usize, _: &[u8], _: &[u8], _: &mut [&mut [u8]], _: usize) -> usize {
        0
    }
}
