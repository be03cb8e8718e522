//! Every SIMD kernel family against the portable kernels, on random data, geometries,
//! lengths and alignments. Families this CPU lacks are reported as skipped (they cannot
//! run here; `Isa::selected` self-tests whichever one a machine picks before using it).

use proptest::prelude::*;
use sbod_codec::{AlignedBuf, Codec, Isa, Scheme, Verdict};
use std::sync::Once;

/// The SIMD families this CPU can run; says once which ones are skipped.
fn variants() -> Vec<Isa> {
    static SAY: Once = Once::new();
    SAY.call_once(|| {
        // Straight to stderr, past the test harness's capture, so a run shows what it
        // could not check.
        use std::io::Write;
        for isa in Isa::ALL.into_iter().filter(|i| !i.is_supported()) {
            let _ = writeln!(
                std::io::stderr(),
                "skipped: {isa} kernels (this CPU lacks them)"
            );
        }
    });
    Isa::supported()
        .into_iter()
        .filter(|&i| i != Isa::Portable)
        .collect()
}

fn scheme_strategy() -> impl Strategy<Value = Scheme> {
    prop_oneof![
        (1usize..20).prop_map(|k| Scheme::Xor { k }),
        (1usize..20).prop_map(|k| Scheme::PQ { k }),
        (1usize..20, 1usize..7).prop_map(|(k, m)| Scheme::Cauchy { k, m }),
        // Many parities: several kernel passes per encode.
        (1usize..6, 7usize..14).prop_map(|(k, m)| Scheme::Cauchy { k, m }),
        // Many sources: several source groups per pass (on long shards, see encode_par).
        (11usize..30, 1usize..6).prop_map(|(k, m)| Scheme::Cauchy { k, m }),
    ]
}

/// Random bytes for `n` shards of `len` bytes, each starting `off` bytes into its buffer
/// (so the kernels also see unaligned shards).
struct Shards {
    bufs: Vec<AlignedBuf>,
    off: usize,
    len: usize,
}

impl Shards {
    fn random(n: usize, len: usize, off: usize, seed: u64) -> Shards {
        let mut x = seed | 1;
        let bufs = (0..n)
            .map(|_| {
                let mut b = AlignedBuf::new(off + len);
                for v in b.iter_mut() {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    *v = (x >> 32) as u8;
                }
                b
            })
            .collect();
        Shards { bufs, off, len }
    }
    fn refs(&self) -> Vec<&[u8]> {
        self.bufs
            .iter()
            .map(|b| &b[self.off..self.off + self.len])
            .collect()
    }
    fn muts(&mut self) -> Vec<&mut [u8]> {
        let (off, len) = (self.off, self.len);
        self.bufs
            .iter_mut()
            .map(|b| &mut b[off..off + len])
            .collect()
    }
    fn bytes(&self) -> Vec<Vec<u8>> {
        self.refs().iter().map(|s| s.to_vec()).collect()
    }
}

/// Encode shards `k..` from shards `..k` with `codec`.
fn encode(codec: &Codec, s: &mut Shards) {
    let k = codec.k();
    let mut all = s.muts();
    let (data, parity) = all.split_at_mut(k);
    let data: Vec<&[u8]> = data.iter().map(|d| &**d).collect();
    codec.encode(&data, parity).unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn encode_matches_portable(scheme in scheme_strategy(), len in 0usize..1500, off in 0usize..70, seed: u64, threads in 1usize..4) {
        let reference = Codec::with_isa(scheme, Isa::Portable).unwrap();
        let mut want = Shards::random(scheme.k() + scheme.m(), len, off, seed);
        encode(&reference, &mut want);
        for isa in variants() {
            let codec = Codec::with_isa(scheme, isa).unwrap();
            let mut got = Shards::random(scheme.k() + scheme.m(), len, off, seed);
            encode(&codec, &mut got);
            prop_assert_eq!(got.bytes(), want.bytes(), "{} {}", isa, scheme);
            // encode_par splits at PAR_MIN_BYTES granularity: short shards stay on one thread,
            // so stretch the length for it.
            let big = len * 17 + sbod_codec::PAR_MIN_BYTES;
            let mut a = Shards::random(scheme.k() + scheme.m(), big, off, seed);
            let mut b = Shards::random(scheme.k() + scheme.m(), big, off, seed);
            encode(&reference, &mut a);
            let k = scheme.k();
            let mut all = b.muts();
            let (data, parity) = all.split_at_mut(k);
            let data: Vec<&[u8]> = data.iter().map(|d| &**d).collect();
            codec.encode_par(&data, parity, threads).unwrap();
            prop_assert!(a.bytes() == b.bytes(), "{} {} encode_par x{}", isa, scheme, threads);
        }
    }

    #[test]
    fn encode_slices_matches_encode(scheme in scheme_strategy(), len in 0usize..5000, off in 0usize..70, slice in 1usize..2000, seed: u64) {
        // The sliced encode (the fused checksum pass's) gives every variant's parity, and
        // hands the callback each slice's data and parity, in order, covering every byte.
        let reference = Codec::with_isa(scheme, Isa::Portable).unwrap();
        let mut want = Shards::random(scheme.k() + scheme.m(), len, off, seed);
        encode(&reference, &mut want);
        let want = want.bytes();
        let k = scheme.k();
        for isa in std::iter::once(Isa::Portable).chain(variants()) {
            let codec = Codec::with_isa(scheme, isa).unwrap();
            let mut got = Shards::random(scheme.k() + scheme.m(), len, off, seed ^ 0x5a5a);
            // The same data as `want`, parity garbage.
            for (i, b) in got.muts().iter_mut().enumerate().take(k) {
                b.copy_from_slice(&want[i]);
            }
            let mut seen = vec![Vec::new(); scheme.k() + scheme.m()];
            let mut next = 0;
            {
                let mut all = got.muts();
                let (data, parity) = all.split_at_mut(k);
                let data: Vec<&[u8]> = data.iter().map(|d| &**d).collect();
                codec.encode_slices(&data, parity, slice, |a, ds, ps| {
                    assert_eq!(a, next, "slices in order, none skipped");
                    next = a + ds[0].len();
                    for (i, d) in ds.iter().chain(ps.iter()).enumerate() {
                        seen[i].extend_from_slice(d);
                    }
                }).unwrap();
            }
            prop_assert_eq!(next, len);
            prop_assert!(got.bytes() == want, "{} {} slices of {}", isa, scheme, slice);
            prop_assert!(seen == want, "{} {}: the callback saw other bytes", isa, scheme);
        }
    }

    #[test]
    fn update_matches_portable(scheme in scheme_strategy(), len in 0usize..1500, off in 0usize..70, idx: usize, seed: u64) {
        let k = scheme.k();
        let i = idx % k;
        let reference = Codec::with_isa(scheme, Isa::Portable).unwrap();
        let base = {
            let mut s = Shards::random(k + scheme.m(), len, off, seed);
            encode(&reference, &mut s);
            s
        };
        let new = Shards::random(1, len, (off + 5) % 64, seed ^ 0xdead_beef);
        let run = |codec: &Codec| {
            let mut s = Shards { bufs: base.bufs.clone(), off, len };
            let old = s.refs()[i].to_vec();
            let mut all = s.muts();
            codec.update(i, &old, new.refs()[0], &mut all[k..]).unwrap();
            s.bytes()
        };
        let want = run(&reference);
        for isa in variants() {
            prop_assert_eq!(run(&Codec::with_isa(scheme, isa).unwrap()), want.clone(), "{} {}", isa, scheme);
        }
    }

    #[test]
    fn reconstruct_matches_portable(scheme in scheme_strategy(), len in 1usize..1500, off in 0usize..70, lost_seed: u64, want_seed: u64, seed: u64) {
        let (k, m) = (scheme.k(), scheme.m());
        let n = k + m;
        let reference = Codec::with_isa(scheme, Isa::Portable).unwrap();
        let mut full = Shards::random(n, len, off, seed);
        encode(&reference, &mut full);
        // Lose up to m shards, want a random non-empty subset of them rebuilt.
        let mut present = vec![true; n];
        let mut x = lost_seed;
        for _ in 0..=(lost_seed as usize % m) {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            present[(x >> 33) as usize % n] = false;
        }
        let lost: Vec<usize> = (0..n).filter(|&i| !present[i]).collect();
        let mut want = vec![false; n];
        for (b, &i) in lost.iter().enumerate() {
            want[i] = want_seed & (1 << b) != 0 || b == 0;
        }
        let expect = full.bytes();
        for isa in variants() {
            let codec = Codec::with_isa(scheme, isa).unwrap();
            let mut work = Shards { bufs: full.bufs.clone(), off, len };
            {
                let mut all = work.muts();
                for &i in &lost {
                    all[i].fill(0x5a);
                }
                codec.reconstruct_some(&mut all, &present, &want).unwrap();
            }
            let got = work.bytes();
            for i in 0..n {
                if present[i] || want[i] {
                    prop_assert!(got[i] == expect[i], "{} {} shard {} present {:?} want {:?}", isa, scheme, i, present, want);
                } else {
                    prop_assert!(got[i].iter().all(|&b| b == 0x5a), "{} {} touched unwanted shard {}", isa, scheme, i);
                }
            }
        }
    }

    #[test]
    fn locate_matches_portable(k in 1usize..12, m in 1usize..5, pq: bool, len in 1usize..700, victim: usize, seed: u64) {
        let scheme = if pq { Scheme::PQ { k } } else { Scheme::Cauchy { k, m } };
        let n = k + scheme.m();
        let reference = Codec::with_isa(scheme, Isa::Portable).unwrap();
        let mut s = Shards::random(n, len, 3, seed);
        encode(&reference, &mut s);
        let v = victim % n;
        let byte = (victim / n) % len;
        s.muts()[v][byte] ^= 0x40;
        let want = reference.locate(&s.refs()).unwrap();
        if scheme.m() >= 2 {
            prop_assert_eq!(want, Verdict::Corrupt(v));
        }
        for isa in variants() {
            prop_assert_eq!(Codec::with_isa(scheme, isa).unwrap().locate(&s.refs()).unwrap(), want, "{}", isa);
        }
    }
}

/// Every erasure pattern of up to m shards, for small geometries, with every variant.
#[test]
fn every_erasure_pattern_every_variant() {
    for scheme in [
        Scheme::Xor { k: 4 },
        Scheme::PQ { k: 5 },
        Scheme::Cauchy { k: 4, m: 3 },
        Scheme::Cauchy { k: 3, m: 9 },
    ] {
        let (k, m) = (scheme.k(), scheme.m());
        let n = k + m;
        let len = 300;
        let mut full = Shards::random(n, len, 0, 42);
        encode(&Codec::with_isa(scheme, Isa::Portable).unwrap(), &mut full);
        let expect = full.bytes();
        for isa in variants() {
            let codec = Codec::with_isa(scheme, isa).unwrap();
            for mask in 1u32..(1 << n) {
                if mask.count_ones() as usize > m {
                    continue;
                }
                let present: Vec<bool> = (0..n).map(|i| mask & (1 << i) == 0).collect();
                let mut work = Shards {
                    bufs: full.bufs.clone(),
                    off: 0,
                    len,
                };
                let mut all = work.muts();
                for (i, s) in all.iter_mut().enumerate() {
                    if !present[i] {
                        s.fill(0);
                    }
                }
                codec.reconstruct(&mut all, &present).unwrap();
                assert_eq!(work.bytes(), expect, "{isa} {scheme} mask {mask:b}");
            }
        }
    }
}

/// Shards long enough, and aligned, for the streaming-store path, and with more sources
/// than one kernel pass takes (the source-group passes), with an odd number of 128-byte
/// blocks and a tail shorter than one.
#[test]
fn long_shards_match_portable() {
    let len = 300 * 1024 + 4096 + 128 + 64;
    for scheme in [
        Scheme::Xor { k: 3 },
        Scheme::Cauchy { k: 6, m: 1 },
        Scheme::PQ { k: 4 },
        Scheme::Cauchy { k: 4, m: 3 },
        Scheme::Cauchy { k: 2, m: 10 },
        Scheme::Cauchy { k: 16, m: 4 },
        Scheme::Cauchy { k: 23, m: 9 },
    ] {
        let n = scheme.k() + scheme.m();
        let mut want = Shards::random(n, len, 0, 7);
        encode(&Codec::with_isa(scheme, Isa::Portable).unwrap(), &mut want);
        for isa in variants() {
            let mut got = Shards::random(n, len, 0, 7);
            encode(&Codec::with_isa(scheme, isa).unwrap(), &mut got);
            assert!(got.bytes() == want.bytes(), "{isa} {scheme}");
            // The same through update: new data for shard 0, parity patched in place.
            {
                let k = scheme.k();
                let new = Shards::random(1, len, 0, 99);
                let mut a = Shards {
                    bufs: got.bufs.clone(),
                    off: 0,
                    len,
                };
                let mut b = Shards {
                    bufs: got.bufs.clone(),
                    off: 0,
                    len,
                };
                let old = a.refs()[0].to_vec();
                for (s, isa) in [(&mut a, isa), (&mut b, Isa::Portable)] {
                    let mut all = s.muts();
                    Codec::with_isa(scheme, isa)
                        .unwrap()
                        .update(0, &old, new.refs()[0], &mut all[k..])
                        .unwrap();
                }
                assert!(a.bytes() == b.bytes(), "{isa} {scheme} update");
            }
            // Decoding two data shards writes full-length outputs too.
            if scheme.m() >= 2 {
                let mut all = got.muts();
                all[0].fill(0);
                all[1 % scheme.k()].fill(0);
                let mut present = vec![true; n];
                present[0] = false;
                present[1 % scheme.k()] = false;
                if scheme.k() == 1 {
                    present[1] = false;
                }
                Codec::with_isa(scheme, isa)
                    .unwrap()
                    .reconstruct(&mut all, &present)
                    .unwrap();
                assert!(got.bytes() == want.bytes(), "{isa} {scheme} decode");
            }
        }
    }
}

#[test]
fn unsupported_variants_are_refused() {
    for isa in Isa::ALL {
        let r = Codec::with_isa(Scheme::PQ { k: 4 }, isa);
        assert_eq!(r.is_ok(), isa.is_supported(), "{isa}");
        if !isa.is_supported() {
            assert_eq!(r.unwrap_err(), sbod_codec::CodecError::Unsupported(isa));
        }
    }
}

#[test]
fn isa_names_round_trip() {
    for isa in Isa::ALL {
        assert_eq!(isa.name().parse::<Isa>().unwrap(), isa);
    }
    assert!("sse9".parse::<Isa>().is_err());
    assert!(Isa::selected().is_supported());
}

#[test]
fn codec_is_send_and_sync() {
    fn check<T: Send + Sync + Clone>() {}
    check::<Codec>();
}

/// Many threads reconstructing at once share one codec's plan cache.
#[test]
fn concurrent_reconstruct_shares_the_cache() {
    let scheme = Scheme::Cauchy { k: 6, m: 3 };
    let codec = Codec::new(scheme).unwrap();
    let mut full = Shards::random(9, 4096, 0, 9);
    encode(&codec, &mut full);
    let expect = full.bytes();
    std::thread::scope(|s| {
        for t in 0..4 {
            let (codec, full, expect) = (&codec, &full, &expect);
            s.spawn(move || {
                for round in 0..50 {
                    let mut present = vec![true; 9];
                    present[(t + round) % 9] = false;
                    present[(t * 3 + round * 7 + 1) % 9] = false;
                    let mut work = Shards {
                        bufs: full.bufs.clone(),
                        off: 0,
                        len: 4096,
                    };
                    let mut all = work.muts();
                    codec.reconstruct(&mut all, &present).unwrap();
                    assert_eq!(&work.bytes(), expect);
                }
            });
        }
    });
}
