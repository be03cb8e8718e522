//! x86-64 SIMD kernels.
//!
//! One generic kernel body ([`gf_kernels!`]) is instantiated per instruction set; each
//! instance module supplies a handful of small vector operations (load, store, xor, the
//! multiply-by-constant step, multiply-by-2) that carry the same `#[target_feature]`
//! attribute as the kernels, so everything inlines into straight-line SIMD code.
//!
//! The kernels process whole blocks (`STEP` bytes) and leave the tail to the portable
//! code. Callers guarantee that every source and output
//! slice is at least `end` bytes long and that the CPU has the module's features.

/// What a kernel does with its outputs.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Store {
    /// Overwrite with ordinary stores.
    Plain,
    /// Overwrite with non-temporal (streaming) stores; outputs are `W`-aligned.
    Stream,
    /// XOR into what the output already holds.
    Acc,
}

impl Store {
    fn loads(self) -> bool {
        self == Store::Acc
    }
    fn streams(self) -> bool {
        self == Store::Stream
    }
}

macro_rules! gf_kernels {
    ($feat:literal, [$(($n:literal, $u:literal, $tf:literal)),*]) => {
        use super::Store;

        /// How far ahead of the current block the XOR and P+Q kernels prefetch their
        /// sources. (The dot-product kernel does not: since long shards are done in groups
        /// of at most 10 sources, the hardware prefetchers keep up, and the prefetches only
        /// cost; measured on Zen 3 without them: 10+2 encode with 1 MiB shards streaming
        /// 5.8 -> 9.3 GB/s, 64 KiB 18.5 -> 19.9, 10+4 and 16+4 unchanged within noise.)
        const PFD: usize = 4 * W;
        /// Ranges shorter than this are not prefetched at all: the hardware prefetchers
        /// ramp up within a 4 KiB shard as soon as the software ones would (measured on
        /// Zen 3 with 4 KiB shards, scripts/bench-codec-ab.sh: XOR 7+1 cache-resident +13%
        /// in a quiet hour, +6% in a busy one, P+Q and the streaming rows unchanged within
        /// noise; with 1 MiB shards the prefetches still win, XOR from cache +13%).
        const PF_MIN: usize = 32 * 1024;

        /// Bytes per block of the dot-product kernel (every unroll factor divides it).
        pub(crate) const STEP: usize = W * 4;
        /// Bytes per block of the XOR kernel.
        pub(crate) const XSTEP: usize = W * 4;
        /// Bytes per block of the P+Q kernel.
        pub(crate) const PQSTEP: usize = W * 4;

        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn prefetch(p: *const u8, bytes: usize) {
            for l in 0..bytes / 64 {
                core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(p.wrapping_add(64 * l) as *const i8);
            }
        }

        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn put(p: *mut u8, v: V, store: Store) {
            if store.streams() {
                st_nt(p, v)
            } else {
                st(p, v)
            }
        }

        /// One source's contribution to every accumulator of [`dot_n`]: source `j` (with
        /// `DELTA`, `srcs[0] ^ srcs[1]`) at offset `off`, tables at `t`. With `FIRST` the
        /// products replace the accumulators instead of being added (one XOR fewer per
        /// vector; the caller's zeroed accumulators are never read).
        #[target_feature(enable = $feat)]
        #[inline]
        #[allow(clippy::needless_range_loop, clippy::too_many_arguments)]
        unsafe fn source<
            const N: usize,
            const U: usize,
            const TABLES_FIRST: bool,
            const DELTA: bool,
            const FIRST: bool,
        >(
            acc: &mut [[V; U]; N],
            srcs: &[&[u8]],
            j: usize,
            off: usize,
            t: *const u8,
        ) {
            let sp = srcs.get_unchecked(j).as_ptr().add(off);
            // With DELTA, the second pointer is `new`; otherwise unused.
            let sq = if DELTA { srcs.get_unchecked(1).as_ptr().add(off) } else { sp };
            if TABLES_FIRST {
                let mut c = [ld_coef(t); N];
                for r in 1..N {
                    c[r] = ld_coef(t.add(r * CB));
                }
                for u in 0..U {
                    let v = ld(sp.add(u * W));
                    let x = prep(if DELTA { xor(v, ld(sq.add(u * W))) } else { v });
                    for r in 0..N {
                        acc[r][u] = if FIRST { mul(&x, &c[r]) } else { mul_xor(acc[r][u], &x, &c[r]) };
                    }
                }
            } else {
                let mut x = [prep(zero()); U];
                for u in 0..U {
                    let v = ld(sp.add(u * W));
                    x[u] = prep(if DELTA { xor(v, ld(sq.add(u * W))) } else { v });
                }
                for r in 0..N {
                    let c = ld_coef(t.add(r * CB));
                    for u in 0..U {
                        acc[r][u] = if FIRST { mul(&x[u], &c) } else { mul_xor(acc[r][u], &x[u], &c) };
                    }
                }
            }
        }

        /// `outs[r] (=|^=) sum_j coef(r, j) * srcs[j]` over `[start, end)` for `N` outputs,
        /// loading each source byte once, `U` vectors per output per pass. `tab` holds `CB`
        /// table bytes per coefficient, source-major (`tab[(j * N + r) * CB]`). With
        /// `DELTA`, `srcs` is `[old, new]` and the single source is `old ^ new` (the
        /// read-modify-write update). `TABLES_FIRST` picks the loop order: load a source's
        /// N tables once and walk its U vectors (needs 2N table registers), or prepare its U
        /// vectors and load each table once per pass.
        #[target_feature(enable = $feat)]
        #[allow(clippy::needless_range_loop)]
        unsafe fn dot_n<const N: usize, const U: usize, const TABLES_FIRST: bool, const DELTA: bool>(
            tab: *const u8,
            srcs: &[&[u8]],
            outs: &[*mut u8],
            start: usize,
            end: usize,
            store: Store,
        ) {
            let mut o = [core::ptr::null_mut::<u8>(); N];
            for r in 0..N {
                o[r] = outs[r];
            }
            let nsrc = if DELTA { 1 } else { srcs.len() };
            let mut off = start;
            while off < end {
                let mut acc = [[zero(); U]; N];
                let mut t = tab;
                let mut j = 0;
                if store.loads() {
                    for r in 0..N {
                        for u in 0..U {
                            acc[r][u] = ld(o[r].add(off + u * W));
                        }
                    }
                } else if nsrc > 0 {
                    source::<N, U, TABLES_FIRST, DELTA, true>(&mut acc, srcs, 0, off, t);
                    t = t.add(N * CB);
                    j = 1;
                }
                while j < nsrc {
                    source::<N, U, TABLES_FIRST, DELTA, false>(&mut acc, srcs, j, off, t);
                    t = t.add(N * CB);
                    j += 1;
                }
                for r in 0..N {
                    for u in 0..U {
                        put(o[r].add(off + u * W), acc[r][u], store);
                    }
                }
                off += W * U;
            }
        }

        /// [`dot_n`] for a runtime output count `outs.len()` (at most `MAXN`), with the
        /// unroll factor and loop order chosen per count (as many vectors as the registers
        /// hold: fewer loop and table-load instructions per byte).
        #[target_feature(enable = $feat)]
        pub(crate) unsafe fn dot(
            tab: *const u8,
            srcs: &[&[u8]],
            delta: bool,
            outs: &[*mut u8],
            start: usize,
            end: usize,
            store: Store,
        ) {
            match (outs.len(), delta) {
                $(
                    ($n, false) => dot_n::<$n, $u, $tf, false>(tab, srcs, outs, start, end, store),
                    ($n, true) => dot_n::<$n, $u, $tf, true>(tab, srcs, outs, start, end, store),
                )*
                (n, _) => unreachable!("{n} outputs in one kernel pass"),
            }
        }

        /// `out (=|^=) srcs[0] ^ srcs[1] ^ ...` over `[start, end)`.
        #[target_feature(enable = $feat)]
        #[allow(clippy::needless_range_loop)]
        pub(crate) unsafe fn xor_n(
            srcs: &[&[u8]],
            out: *mut u8,
            start: usize,
            end: usize,
            store: Store,
        ) {
            let (first, rest) = if store.loads() {
                (out as *const u8, srcs)
            } else {
                (srcs[0].as_ptr(), &srcs[1..])
            };
            let far = end - start >= PF_MIN;
            let mut off = start;
            while off < end {
                // Never prefetch past the range: the bytes after a shard are often another
                // shard (parity being written with streaming stores, which a prefetch
                // would pull back into the cache).
                let pf = far && off + PFD + XSTEP <= end;
                let mut acc = [zero(); 4];
                if pf {
                    prefetch(first.add(off + PFD), 64);
                }
                for u in 0..4 {
                    acc[u] = ld(first.add(off + u * W));
                }
                for s in rest {
                    let sp = s.as_ptr().add(off);
                    if pf {
                        prefetch(sp.add(PFD), 64);
                    }
                    for u in 0..4 {
                        acc[u] = xor(acc[u], ld(sp.add(u * W)));
                    }
                }
                for u in 0..4 {
                    put(out.add(off + u * W), acc[u], store);
                }
                off += XSTEP;
            }
        }

        /// md raid6 syndromes over `[start, end)`: `p = sum D_j`, `q = sum 2^j D_j`,
        /// by Horner's rule from the highest source down (multiply by 2 is cheap).
        #[target_feature(enable = $feat)]
        #[allow(clippy::needless_range_loop)]
        pub(crate) unsafe fn pq(
            srcs: &[&[u8]],
            p: *mut u8,
            q: *mut u8,
            start: usize,
            end: usize,
            store: Store,
        ) {
            let (last, rest) = srcs.split_last().unwrap();
            let far = end - start >= PF_MIN;
            let mut off = start;
            while off < end {
                let pf = far && off + PFD + PQSTEP <= end;
                let lp = last.as_ptr().add(off);
                if pf {
                    prefetch(lp.add(PFD), PQSTEP);
                }
                let mut pv = [zero(); 4];
                for u in 0..4 {
                    pv[u] = ld(lp.add(u * W));
                }
                let mut qv = pv;
                for s in rest.iter().rev() {
                    let sp = s.as_ptr().add(off);
                    if pf {
                        prefetch(sp.add(PFD), PQSTEP);
                    }
                    for u in 0..4 {
                        let d = ld(sp.add(u * W));
                        pv[u] = xor(pv[u], d);
                        qv[u] = mul2_xor(qv[u], d);
                    }
                }
                if store.loads() {
                    for u in 0..4 {
                        pv[u] = xor(pv[u], ld(p.add(off + u * W)));
                        qv[u] = xor(qv[u], ld(q.add(off + u * W)));
                    }
                }
                for u in 0..4 {
                    put(p.add(off + u * W), pv[u], store);
                    put(q.add(off + u * W), qv[u], store);
                }
                off += PQSTEP;
            }
        }
    };
}

/// The vector type, its width in bytes, and load, store, streaming store, zero and XOR
/// for one vector width, compiled with the given target features.
macro_rules! vector_ops {
    (256, $feat:literal) => {
        type V = __m256i;
        const W: usize = 32;
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn ld(p: *const u8) -> V {
            _mm256_loadu_si256(p as *const V)
        }
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn st(p: *mut u8, v: V) {
            _mm256_storeu_si256(p as *mut V, v)
        }
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn st_nt(p: *mut u8, v: V) {
            _mm256_stream_si256(p as *mut V, v)
        }
        #[target_feature(enable = $feat)]
        #[inline]
        fn zero() -> V {
            _mm256_setzero_si256()
        }
        #[target_feature(enable = $feat)]
        #[inline]
        fn xor(a: V, b: V) -> V {
            _mm256_xor_si256(a, b)
        }
    };
    (512, $feat:literal) => {
        type V = __m512i;
        const W: usize = 64;
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn ld(p: *const u8) -> V {
            _mm512_loadu_si512(p as *const V)
        }
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn st(p: *mut u8, v: V) {
            _mm512_storeu_si512(p as *mut V, v)
        }
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn st_nt(p: *mut u8, v: V) {
            _mm512_stream_si512(p as *mut V, v)
        }
        #[target_feature(enable = $feat)]
        #[inline]
        fn zero() -> V {
            _mm512_setzero_si512()
        }
        #[target_feature(enable = $feat)]
        #[inline]
        fn xor(a: V, b: V) -> V {
            _mm512_xor_si512(a, b)
        }
    };
}

/// AVX2: split-nibble multiply with `vpshufb`, 256-bit vectors.
pub(crate) mod avx2 {
    use core::arch::x86_64::*;

    vector_ops!(256, "avx2");
    /// Table bytes per coefficient: 16-byte low- and high-nibble tables, each broadcast to
    /// both 128-bit lanes.
    pub(crate) const CB: usize = 64;
    pub(crate) const MAXN: usize = 4;

    pub(crate) fn coef_table(c: u8, out: &mut Vec<u8>) {
        let (lo, hi) = super::nibble_tables(c);
        out.extend_from_slice(&lo);
        out.extend_from_slice(&lo);
        out.extend_from_slice(&hi);
        out.extend_from_slice(&hi);
    }

    /// The low and high nibbles of every byte.
    #[target_feature(enable = "avx2")]
    #[inline]
    fn prep(x: V) -> (V, V) {
        let m = _mm256_set1_epi8(0x0f);
        (
            _mm256_and_si256(x, m),
            _mm256_and_si256(_mm256_srli_epi64::<4>(x), m),
        )
    }
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn ld_coef(p: *const u8) -> (V, V) {
        (ld(p), ld(p.add(32)))
    }
    #[target_feature(enable = "avx2")]
    #[inline]
    fn mul_xor(acc: V, x: &(V, V), c: &(V, V)) -> V {
        xor(acc, mul(x, c))
    }
    #[target_feature(enable = "avx2")]
    #[inline]
    fn mul(x: &(V, V), c: &(V, V)) -> V {
        xor(_mm256_shuffle_epi8(c.0, x.0), _mm256_shuffle_epi8(c.1, x.1))
    }
    /// `2 * q ^ d` for every byte (multiply by 2 modulo 0x11d: shift, and fold the
    /// carried-out bit back in with a blend on the byte's sign bit).
    #[target_feature(enable = "avx2")]
    #[inline]
    fn mul2_xor(q: V, d: V) -> V {
        let (zero, poly) = (_mm256_setzero_si256(), _mm256_set1_epi8(0x1d));
        let fold: V;
        // LLVM rewrites _mm256_blendv_epi8 with constant inputs into vpcmpgtb + vpand, two
        // instructions where Zen 3 runs vpblendvb as one (P+Q is ~10% faster with it).
        // SAFETY: a register-only AVX2 instruction (this function requires AVX2).
        unsafe {
            core::arch::asm!(
                "vpblendvb {f}, {z}, {p}, {q}",
                f = lateout(ymm_reg) fold,
                z = in(ymm_reg) zero,
                p = in(ymm_reg) poly,
                q = in(ymm_reg) q,
                options(pure, nomem, nostack, preserves_flags)
            );
        }
        xor(xor(_mm256_add_epi8(q, q), fold), d)
    }

    gf_kernels!(
        "avx2",
        [(1, 4, true), (2, 4, true), (3, 2, false), (4, 2, false)]
    );
}

/// AVX-512BW: split-nibble multiply with 512-bit `vpshufb` and `vpternlogq` folding both
/// table lookups into the accumulator in one instruction.
pub(crate) mod avx512 {
    use core::arch::x86_64::*;

    vector_ops!(512, "avx512f,avx512bw");
    /// 16-byte low- and high-nibble tables, broadcast to the four lanes when loaded.
    pub(crate) const CB: usize = 32;
    pub(crate) const MAXN: usize = 8;

    pub(crate) fn coef_table(c: u8, out: &mut Vec<u8>) {
        let (lo, hi) = super::nibble_tables(c);
        out.extend_from_slice(&lo);
        out.extend_from_slice(&hi);
    }

    #[target_feature(enable = "avx512f,avx512bw")]
    #[inline]
    fn prep(x: V) -> (V, V) {
        let m = _mm512_set1_epi8(0x0f);
        (
            _mm512_and_si512(x, m),
            _mm512_and_si512(_mm512_srli_epi64::<4>(x), m),
        )
    }
    #[target_feature(enable = "avx512f,avx512bw")]
    #[inline]
    unsafe fn ld_coef(p: *const u8) -> (V, V) {
        (
            _mm512_broadcast_i32x4(_mm_loadu_si128(p as *const __m128i)),
            _mm512_broadcast_i32x4(_mm_loadu_si128(p.add(16) as *const __m128i)),
        )
    }
    #[target_feature(enable = "avx512f,avx512bw")]
    #[inline]
    fn mul_xor(acc: V, x: &(V, V), c: &(V, V)) -> V {
        _mm512_ternarylogic_epi64::<0x96>(
            acc,
            _mm512_shuffle_epi8(c.0, x.0),
            _mm512_shuffle_epi8(c.1, x.1),
        )
    }
    #[target_feature(enable = "avx512f,avx512bw")]
    #[inline]
    fn mul(x: &(V, V), c: &(V, V)) -> V {
        xor(_mm512_shuffle_epi8(c.0, x.0), _mm512_shuffle_epi8(c.1, x.1))
    }
    #[target_feature(enable = "avx512f,avx512bw")]
    #[inline]
    fn mul2_xor(q: V, d: V) -> V {
        let fold = _mm512_maskz_mov_epi8(_mm512_movepi8_mask(q), _mm512_set1_epi8(0x1d));
        _mm512_ternarylogic_epi64::<0x96>(_mm512_add_epi8(q, q), fold, d)
    }

    gf_kernels!(
        "avx512f,avx512bw",
        [
            (1, 4, true),
            (2, 4, true),
            (3, 4, true),
            (4, 4, true),
            (5, 2, false),
            (6, 2, false),
            (7, 2, false),
            (8, 2, false)
        ]
    );
}

/// GFNI with 256-bit vectors (e.g. Alder Lake, which has GFNI but no AVX-512): one
/// `gf2p8affineqb` per multiply, with an 8x8 bit matrix per constant (the instruction's
/// own multiply, `gf2p8mulb`, uses the AES polynomial 0x11b, not md's 0x11d).
pub(crate) mod gfni_avx2 {
    use core::arch::x86_64::*;

    vector_ops!(256, "avx2,gfni");
    /// One 8-byte matrix per coefficient, broadcast when loaded.
    pub(crate) const CB: usize = 8;
    pub(crate) const MAXN: usize = 6;

    pub(crate) fn coef_table(c: u8, out: &mut Vec<u8>) {
        out.extend_from_slice(&super::affine_matrix(c).to_le_bytes());
    }

    #[target_feature(enable = "avx2,gfni")]
    #[inline]
    fn prep(x: V) -> V {
        x
    }
    #[target_feature(enable = "avx2,gfni")]
    #[inline]
    unsafe fn ld_coef(p: *const u8) -> V {
        _mm256_set1_epi64x((p as *const i64).read_unaligned())
    }
    #[target_feature(enable = "avx2,gfni")]
    #[inline]
    fn mul_xor(acc: V, x: &V, c: &V) -> V {
        xor(acc, mul(x, c))
    }
    #[target_feature(enable = "avx2,gfni")]
    #[inline]
    fn mul(x: &V, c: &V) -> V {
        _mm256_gf2p8affine_epi64_epi8::<0>(*x, *c)
    }
    #[target_feature(enable = "avx2,gfni")]
    #[inline]
    fn mul2_xor(q: V, d: V) -> V {
        xor(
            _mm256_gf2p8affine_epi64_epi8::<0>(q, _mm256_set1_epi64x(super::MUL2_MATRIX as i64)),
            d,
        )
    }

    gf_kernels!(
        "avx2,gfni",
        [
            (1, 4, true),
            (2, 4, true),
            (3, 2, true),
            (4, 2, true),
            (5, 2, true),
            (6, 2, false)
        ]
    );
}

/// GFNI with AVX-512 (Ice Lake and later, Zen 4 and later).
pub(crate) mod gfni_avx512 {
    use core::arch::x86_64::*;

    vector_ops!(512, "avx512f,avx512bw,gfni");
    pub(crate) const CB: usize = 8;
    pub(crate) const MAXN: usize = 8;

    pub(crate) fn coef_table(c: u8, out: &mut Vec<u8>) {
        out.extend_from_slice(&super::affine_matrix(c).to_le_bytes());
    }

    #[target_feature(enable = "avx512f,avx512bw,gfni")]
    #[inline]
    fn prep(x: V) -> V {
        x
    }
    #[target_feature(enable = "avx512f,avx512bw,gfni")]
    #[inline]
    unsafe fn ld_coef(p: *const u8) -> V {
        _mm512_set1_epi64((p as *const i64).read_unaligned())
    }
    #[target_feature(enable = "avx512f,avx512bw,gfni")]
    #[inline]
    fn mul_xor(acc: V, x: &V, c: &V) -> V {
        xor(acc, mul(x, c))
    }
    #[target_feature(enable = "avx512f,avx512bw,gfni")]
    #[inline]
    fn mul(x: &V, c: &V) -> V {
        _mm512_gf2p8affine_epi64_epi8::<0>(*x, *c)
    }
    #[target_feature(enable = "avx512f,avx512bw,gfni")]
    #[inline]
    fn mul2_xor(q: V, d: V) -> V {
        xor(
            _mm512_gf2p8affine_epi64_epi8::<0>(q, _mm512_set1_epi64(super::MUL2_MATRIX as i64)),
            d,
        )
    }

    gf_kernels!(
        "avx512f,avx512bw,gfni",
        [
            (1, 4, true),
            (2, 4, true),
            (3, 4, true),
            (4, 4, true),
            (5, 4, true),
            (6, 4, true),
            (7, 2, true),
            (8, 2, true)
        ]
    );
}

/// `vpshufb` tables: `lo[t] = c * t`, `hi[t] = c * (t << 4)`, so `c * x` is
/// `lo[x & 15] ^ hi[x >> 4]`.
pub(crate) fn nibble_tables(c: u8) -> ([u8; 16], [u8; 16]) {
    let mut lo = [0u8; 16];
    let mut hi = [0u8; 16];
    for t in 0..16u8 {
        lo[t as usize] = crate::gf::mul(c, t);
        hi[t as usize] = crate::gf::mul(c, t << 4);
    }
    (lo, hi)
}

/// The 8x8 bit matrix that makes `gf2p8affineqb` multiply by `c` in GF(2^8)/0x11d.
///
/// The instruction computes result bit `i` as the parity of `x AND byte[7 - i]` of the
/// matrix qword. Multiplying by `c` is linear over GF(2): bit `i` of `c * x` is the XOR of
/// bit `i` of `c * 2^j` over the set bits `j` of `x`, so byte `7 - i` has bit `j` set when
/// bit `i` of `c * 2^j` is.
pub(crate) fn affine_matrix(c: u8) -> u64 {
    let mut m = 0u64;
    for i in 0..8 {
        let mut row = 0u8;
        for j in 0..8 {
            if (crate::gf::mul(c, 1 << j) >> i) & 1 != 0 {
                row |= 1 << j;
            }
        }
        m |= (row as u64) << (8 * (7 - i));
    }
    m
}

/// `affine_matrix(2)`, spelled out for the multiply-by-2 of P+Q.
const MUL2_MATRIX: u64 = 0x8001_8284_8810_2040;

#[cfg(test)]
mod tests {
    use super::*;

    /// `gf2p8affineqb` on one byte, as Intel's pseudocode defines it.
    fn affine_emulated(matrix: u64, x: u8) -> u8 {
        let mut r = 0u8;
        for i in 0..8 {
            let row = (matrix >> (8 * (7 - i))) as u8;
            r |= (((row & x).count_ones() & 1) as u8) << i;
        }
        r
    }

    #[test]
    fn affine_matrix_multiplies() {
        for c in 0..=255u8 {
            let m = affine_matrix(c);
            for x in 0..=255u8 {
                assert_eq!(affine_emulated(m, x), crate::gf::mul(c, x), "c={c} x={x}");
            }
        }
        assert_eq!(MUL2_MATRIX, affine_matrix(2));
    }

    #[test]
    fn nibble_tables_multiply() {
        for c in 0..=255u8 {
            let (lo, hi) = nibble_tables(c);
            for x in 0..=255u8 {
                assert_eq!(
                    lo[(x & 15) as usize] ^ hi[(x >> 4) as usize],
                    crate::gf::mul(c, x)
                );
            }
        }
    }
}
