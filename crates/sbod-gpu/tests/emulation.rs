//! The CPU model of the GPU kernels (`sbod_gpu::emu`) against the CPU codec, on random data
//! and random geometries. Runs everywhere: no GPU needed.

#![allow(clippy::needless_range_loop)]

use proptest::prelude::*;
use sbod_codec::{Codec, Scheme};
use sbod_gpu::emu;
use sbod_gpu::plan::{KernelKind, Plan};

fn scheme_strategy() -> impl Strategy<Value = Scheme> {
    prop_oneof![
        (1usize..=24).prop_map(|k| Scheme::Xor { k }),
        (1usize..=24).prop_map(|k| Scheme::PQ { k }),
        (1usize..=20, 1usize..=9).prop_map(|(k, m)| Scheme::Cauchy { k, m }),
    ]
}

/// A shard-major buffer: `n` shards of `len` bytes, `stride` bytes apart.
fn layout(n: usize, len: usize, pad: usize) -> (Vec<u8>, usize) {
    let stride = len + pad;
    (vec![0u8; n * stride], stride)
}

fn fill(buf: &mut [u8], seed: u64) {
    let mut x = seed | 1;
    for b in buf.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, .. ProptestConfig::default() })]

    /// Encoding through the kernel model is byte-identical to `Codec::encode`.
    #[test]
    fn encode_matches_cpu_codec(scheme in scheme_strategy(), words in 1usize..40,
                                pad_words in 0usize..3, seed in any::<u64>()) {
        let codec = Codec::new(scheme).unwrap();
        let (k, m) = (codec.k(), codec.m());
        let len = 16 * words;
        let (mut buf, stride) = layout(k + m, len, 16 * pad_words);
        fill(&mut buf, seed);
        let plan = Plan::encode(&codec);
        emu::run(&plan, &mut buf, stride, 0, words);

        let data: Vec<&[u8]> = (0..k).map(|i| &buf[i * stride..i * stride + len]).collect();
        let mut want = vec![vec![0u8; len]; m];
        let mut outs: Vec<&mut [u8]> = want.iter_mut().map(|v| v.as_mut_slice()).collect();
        codec.encode(&data, &mut outs).unwrap();
        for r in 0..m {
            prop_assert_eq!(&buf[(k + r) * stride..(k + r) * stride + len], &want[r][..]);
        }
    }

    /// Rebuilding any erasure pattern through the kernel model restores the exact bytes.
    #[test]
    fn reconstruct_matches_original(scheme in scheme_strategy(), words in 1usize..24,
                                    seed in any::<u64>(), pick in any::<u64>()) {
        let codec = Codec::new(scheme).unwrap();
        let (k, m) = (codec.k(), codec.m());
        let n = k + m;
        let len = 16 * words;
        let (mut buf, stride) = layout(n, len, 0);
        fill(&mut buf, seed);
        {
            let (data, parity) = buf.split_at_mut(k * stride);
            let data: Vec<&[u8]> = data.chunks(stride).collect();
            let mut outs: Vec<&mut [u8]> = parity.chunks_mut(stride).collect();
            codec.encode(&data, &mut outs).unwrap();
        }
        let original = buf.clone();
        // Lose between 1 and m shards, chosen by `pick`.
        let mut present = vec![true; n];
        let mut x = pick;
        let lose = 1 + (x % m as u64) as usize;
        let mut lost = 0;
        while lost < lose {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let i = (x >> 33) as usize % n;
            if present[i] {
                present[i] = false;
                lost += 1;
            }
        }
        for i in 0..n {
            if !present[i] {
                buf[i * stride..(i + 1) * stride].fill(0xa5);
            }
        }
        let want: Vec<bool> = present.iter().map(|p| !p).collect();
        let plan = Plan::reconstruct(&codec, &present, &want).unwrap();
        emu::run(&plan, &mut buf, stride, 0, words);
        prop_assert_eq!(buf, original);
    }

    /// A segment run touches only its words: running a batch in pieces equals one run.
    #[test]
    fn segments_compose(k in 1usize..12, m in 1usize..6, words in 2usize..30,
                        cut in 1usize..29, seed in any::<u64>()) {
        let cut = cut.min(words - 1);
        let codec = Codec::new(Scheme::Cauchy { k, m }).unwrap();
        let plan = Plan::encode(&codec);
        let (mut a, stride) = layout(k + m, 16 * words, 0);
        fill(&mut a, seed);
        let mut b = a.clone();
        emu::run(&plan, &mut a, stride, 0, words);
        emu::run(&plan, &mut b, stride, cut, words);
        emu::run(&plan, &mut b, stride, 0, cut);
        prop_assert_eq!(a, b);
    }
}

#[test]
fn kernels_are_picked_by_matrix_shape() {
    let enc = |s| Plan::encode(&Codec::new(s).unwrap()).kind;
    assert_eq!(enc(Scheme::Xor { k: 7 }), KernelKind::Xor);
    assert_eq!(enc(Scheme::PQ { k: 8 }), KernelKind::PQ);
    assert_eq!(enc(Scheme::Cauchy { k: 8, m: 2 }), KernelKind::General);
    assert_eq!(enc(Scheme::Cauchy { k: 4, m: 1 }), KernelKind::General);
    // raid6 losing one data shard with P present: the decode row is all 1s.
    let codec = Codec::new(Scheme::PQ { k: 6 }).unwrap();
    let mut present = vec![true; 8];
    present[3] = false;
    let mut want = vec![false; 8];
    want[3] = true;
    let plan = Plan::reconstruct(&codec, &present, &want).unwrap();
    assert_eq!(plan.kind, KernelKind::Xor);
    // ... and with P lost too, a general matrix.
    present[6] = false;
    want[6] = true;
    let plan = Plan::reconstruct(&codec, &present, &want).unwrap();
    assert_eq!(plan.kind, KernelKind::General);
}

#[test]
fn reconstruct_rejects_bad_patterns() {
    let codec = Codec::new(Scheme::Cauchy { k: 4, m: 2 }).unwrap();
    let mut present = vec![true; 6];
    present[0] = false;
    present[1] = false;
    present[2] = false;
    let want: Vec<bool> = present.iter().map(|p| !p).collect();
    assert!(Plan::reconstruct(&codec, &present, &want).is_err());
    // Wanting a present shard, or nothing at all, is a caller error.
    let present = vec![true; 6];
    assert!(
        Plan::reconstruct(&codec, &present, &[true, false, false, false, false, false]).is_err()
    );
    assert!(Plan::reconstruct(&codec, &present, &[false; 6]).is_err());
}

/// Wide codes run several row groups of the general kernel: m = 9 is three groups with a
/// partial last one.
#[test]
fn wide_codes_use_several_row_groups() {
    let codec = Codec::new(Scheme::Cauchy { k: 20, m: 9 }).unwrap();
    let plan = Plan::encode(&codec);
    assert_eq!(plan.groups(), 3);
    let words = 5;
    let (mut buf, stride) = layout(29, 16 * words, 16);
    fill(&mut buf, 42);
    emu::run(&plan, &mut buf, stride, 0, words);
    let data: Vec<&[u8]> = (0..20).map(|i| &buf[i * stride..i * stride + 80]).collect();
    let mut want = vec![vec![0u8; 80]; 9];
    let mut outs: Vec<&mut [u8]> = want.iter_mut().map(|v| v.as_mut_slice()).collect();
    codec.encode(&data, &mut outs).unwrap();
    for r in 0..9 {
        assert_eq!(
            &buf[(20 + r) * stride..(20 + r) * stride + 80],
            &want[r][..]
        );
    }
}
