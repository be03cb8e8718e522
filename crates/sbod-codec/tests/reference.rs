//! The codec against an independent reference: a bit-serial GF(2^8) multiply (no tables)
//! and the textbook definitions of md's P+Q and ISA-L's Cauchy matrix.

use proptest::prelude::*;
use sbod_codec::{Codec, Scheme, Verdict};

/// Russian-peasant multiply modulo x^8+x^4+x^3+x^2+1, independent of the codec's tables.
fn slow_mul(mut a: u8, mut b: u8) -> u8 {
    let mut p = 0u8;
    while b != 0 {
        if b & 1 != 0 {
            p ^= a;
        }
        let hi = a & 0x80;
        a <<= 1;
        if hi != 0 {
            a ^= 0x1d;
        }
        b >>= 1;
    }
    p
}

fn slow_pow2(e: usize) -> u8 {
    (0..e).fold(1u8, |x, _| slow_mul(x, 2))
}

fn slow_inv(a: u8) -> u8 {
    (1..=255u8).find(|&b| slow_mul(a, b) == 1).unwrap()
}

fn reference_parity(scheme: Scheme, data: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let k = data.len();
    let len = data[0].len();
    let coef = |r: usize, j: usize| -> u8 {
        match scheme {
            Scheme::Xor { .. } => 1,
            Scheme::PQ { .. } => {
                if r == 0 {
                    1
                } else {
                    slow_pow2(j)
                }
            }
            Scheme::Cauchy { .. } => slow_inv(((k + r) ^ j) as u8),
        }
    };
    (0..scheme.m())
        .map(|r| {
            (0..len)
                .map(|b| (0..k).fold(0u8, |acc, j| acc ^ slow_mul(coef(r, j), data[j][b])))
                .collect()
        })
        .collect()
}

/// A hand-derived raid6 vector: 3 data bytes 0x01, 0x02, 0x80.
/// P = 0x01^0x02^0x80 = 0x83; Q = 1*0x01 ^ 2*0x02 ^ 4*0x80 = 0x01 ^ 0x04 ^ (0x200 mod 0x11d = 0x1d... )
#[test]
fn raid6_hand_vector() {
    let codec = Codec::new(Scheme::PQ { k: 3 }).unwrap();
    let d: Vec<Vec<u8>> = vec![vec![0x01], vec![0x02], vec![0x80]];
    let mut p = vec![0u8];
    let mut q = vec![0u8];
    let refs: Vec<&[u8]> = d.iter().map(|v| v.as_slice()).collect();
    codec.encode(&refs, &mut [&mut p, &mut q]).unwrap();
    assert_eq!(p[0], 0x83);
    // 4 * 0x80 = x^2 * x^7 = x^9 = x * (x^4+x^3+x^2+1) = x^5+x^4+x^3+x = 0x3a
    assert_eq!(q[0], 0x01 ^ 0x04 ^ 0x3a);
}

fn scheme_strategy() -> impl Strategy<Value = Scheme> {
    prop_oneof![
        (1usize..12).prop_map(|k| Scheme::Xor { k }),
        (1usize..12).prop_map(|k| Scheme::PQ { k }),
        (1usize..12, 1usize..5).prop_map(|(k, m)| Scheme::Cauchy { k, m }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn encode_matches_reference(scheme in scheme_strategy(), len in 1usize..200, seed: u64) {
        let codec = Codec::new(scheme).unwrap();
        let mut rng = seed;
        let mut next = || { rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407); (rng >> 33) as u8 };
        let data: Vec<Vec<u8>> = (0..scheme.k()).map(|_| (0..len).map(|_| next()).collect()).collect();
        let mut parity = vec![vec![0u8; len]; scheme.m()];
        let refs: Vec<&[u8]> = data.iter().map(|v| v.as_slice()).collect();
        let mut prefs: Vec<&mut [u8]> = parity.iter_mut().map(|v| v.as_mut_slice()).collect();
        codec.encode(&refs, &mut prefs).unwrap();
        prop_assert_eq!(parity, reference_parity(scheme, &data));
    }

    #[test]
    fn every_erasure_pattern_reconstructs(scheme in scheme_strategy(), len in 1usize..64, seed: u64) {
        let codec = Codec::new(scheme).unwrap();
        let (k, m) = (scheme.k(), scheme.m());
        let n = k + m;
        let mut rng = seed;
        let mut next = || { rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407); (rng >> 33) as u8 };
        let data: Vec<Vec<u8>> = (0..k).map(|_| (0..len).map(|_| next()).collect()).collect();
        let mut full = data.clone();
        full.extend(reference_parity(scheme, &data));
        // Every subset of at most m lost shards.
        for mask in 0u32..(1 << n) {
            let lost = mask.count_ones() as usize;
            if lost == 0 || lost > m { continue; }
            let present: Vec<bool> = (0..n).map(|i| mask & (1 << i) == 0).collect();
            let mut work: Vec<Vec<u8>> = full.iter().enumerate()
                .map(|(i, s)| if present[i] { s.clone() } else { vec![0xEE; len] }).collect();
            let mut refs: Vec<&mut [u8]> = work.iter_mut().map(|v| v.as_mut_slice()).collect();
            codec.reconstruct(&mut refs, &present).unwrap();
            prop_assert_eq!(&work, &full, "mask {:b}", mask);
        }
    }

    #[test]
    fn update_equals_reencode(scheme in scheme_strategy(), len in 1usize..64, idx_seed: usize, seed: u64) {
        let codec = Codec::new(scheme).unwrap();
        let k = scheme.k();
        let mut rng = seed;
        let mut next = || { rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407); (rng >> 33) as u8 };
        let mut data: Vec<Vec<u8>> = (0..k).map(|_| (0..len).map(|_| next()).collect()).collect();
        let mut parity = reference_parity(scheme, &data);
        let i = idx_seed % k;
        let new: Vec<u8> = (0..len).map(|_| next()).collect();
        let mut prefs: Vec<&mut [u8]> = parity.iter_mut().map(|v| v.as_mut_slice()).collect();
        codec.update(i, &data[i], &new, &mut prefs).unwrap();
        data[i] = new;
        prop_assert_eq!(parity, reference_parity(scheme, &data));
    }

    #[test]
    fn locate_finds_single_corruption(k in 1usize..10, m in 2usize..5, pq: bool, len in 1usize..64, victim_seed: usize, seed: u64) {
        let scheme = if pq { Scheme::PQ { k } } else { Scheme::Cauchy { k, m } };
        let codec = Codec::new(scheme).unwrap();
        let n = k + scheme.m();
        let mut rng = seed;
        let mut next = || { rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407); (rng >> 33) as u8 };
        let data: Vec<Vec<u8>> = (0..k).map(|_| (0..len).map(|_| next()).collect()).collect();
        let mut full = data.clone();
        full.extend(reference_parity(scheme, &data));
        let refs: Vec<&[u8]> = full.iter().map(|v| v.as_slice()).collect();
        prop_assert_eq!(codec.locate(&refs).unwrap(), Verdict::Clean);
        let victim = victim_seed % n;
        let byte = (victim_seed / n) % len;
        full[victim][byte] ^= 1 << (victim_seed % 8);
        let refs: Vec<&[u8]> = full.iter().map(|v| v.as_slice()).collect();
        prop_assert_eq!(codec.locate(&refs).unwrap(), Verdict::Corrupt(victim));
    }
}

#[test]
fn xor_mismatch_is_unlocatable() {
    let codec = Codec::new(Scheme::Xor { k: 3 }).unwrap();
    let mut s = [vec![1u8; 8], vec![2u8; 8], vec![3u8; 8], vec![0u8; 8]];
    s[3] = vec![1 ^ 2 ^ 3; 8];
    s[1][4] ^= 0x10;
    let refs: Vec<&[u8]> = s.iter().map(|v| v.as_slice()).collect();
    assert_eq!(codec.locate(&refs).unwrap(), Verdict::Unlocatable);
}

#[test]
fn too_many_erasures_is_an_error() {
    let codec = Codec::new(Scheme::PQ { k: 4 }).unwrap();
    let mut s = vec![vec![0u8; 4]; 6];
    let mut refs: Vec<&mut [u8]> = s.iter_mut().map(|v| v.as_mut_slice()).collect();
    let err = codec
        .reconstruct(&mut refs, &[false, false, false, true, true, true])
        .unwrap_err();
    assert_eq!(
        err,
        sbod_codec::CodecError::TooManyErasures { lost: 3, m: 2 }
    );
}
