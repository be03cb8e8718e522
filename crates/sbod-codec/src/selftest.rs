//! The check a SIMD kernel family must pass, against the portable kernels, before
//! [`crate::Isa::selected`] lets codecs use it.

use crate::bench::AlignedBuf;
use crate::kernels::STREAM_MIN;
use crate::{Codec, Isa, Scheme};

/// Encode, update and reconstruct a few geometries (one and several kernel passes over
/// outputs and over sources, the XOR and P+Q fast paths, block-sized and odd lengths,
/// streaming stores) with `isa` and with the portable kernels, and compare every byte.
pub(crate) fn check(isa: Isa) -> Result<(), String> {
    let cases = [
        (Scheme::Xor { k: 7 }, 4096 + 77),
        (Scheme::PQ { k: 8 }, 4096 + 77),
        (Scheme::Cauchy { k: 10, m: 4 }, 4096 + 77),
        (Scheme::Cauchy { k: 5, m: 11 }, 1000),
        (Scheme::Cauchy { k: 3, m: 2 }, STREAM_MIN + 4096),
        (Scheme::PQ { k: 3 }, STREAM_MIN + 4096),
        (Scheme::Cauchy { k: 12, m: 2 }, 40 * 1024 + 64),
    ];
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    for (scheme, len) in cases {
        let fast = Codec::with_isa(scheme, isa).map_err(|e| e.to_string())?;
        let slow = Codec::with_isa(scheme, Isa::Portable).map_err(|e| e.to_string())?;
        let (k, m) = (scheme.k(), scheme.m());
        let mut shards: Vec<AlignedBuf> = (0..k + m).map(|_| AlignedBuf::new(len)).collect();
        for s in &mut shards[..k] {
            fill(s, &mut seed);
        }
        let expect = encode(&slow, &mut shards.clone(), k);
        let got = encode(&fast, &mut shards, k);
        if got != expect {
            return Err(format!("{scheme} encode, {len} bytes"));
        }
        // Update data shard 1 % k.
        let i = 1 % k;
        let mut new = AlignedBuf::new(len);
        fill(&mut new, &mut seed);
        let (mut a, mut b) = (got.clone(), got);
        let mut pa: Vec<&mut [u8]> = a.iter_mut().map(|v| v.as_mut_slice()).collect();
        let mut pb: Vec<&mut [u8]> = b.iter_mut().map(|v| v.as_mut_slice()).collect();
        fast.update(i, &shards[i], &new, &mut pa)
            .map_err(|e| e.to_string())?;
        slow.update(i, &shards[i], &new, &mut pb)
            .map_err(|e| e.to_string())?;
        if a != b {
            return Err(format!("{scheme} update, {len} bytes"));
        }
        // Lose data shard 0 and, with two or more parities, the last shard.
        let mut present = vec![true; k + m];
        present[0] = false;
        if m >= 2 {
            present[k + m - 1] = false;
        }
        let mut work = shards.clone();
        for (w, p) in work.iter_mut().zip(&present) {
            if !p {
                w.fill(0xa5);
            }
        }
        let mut refs: Vec<&mut [u8]> = work.iter_mut().map(|v| &mut v[..]).collect();
        fast.reconstruct(&mut refs, &present)
            .map_err(|e| e.to_string())?;
        if work.iter().zip(&shards).any(|(w, s)| w[..] != s[..]) {
            return Err(format!("{scheme} reconstruct, {len} bytes"));
        }
    }
    Ok(())
}

/// Encode into `shards[k..]` and return the parity.
fn encode(codec: &Codec, shards: &mut [AlignedBuf], k: usize) -> Vec<Vec<u8>> {
    let (data, parity) = shards.split_at_mut(k);
    let data: Vec<&[u8]> = data.iter().map(|d| &d[..]).collect();
    let mut par: Vec<&mut [u8]> = parity.iter_mut().map(|p| &mut p[..]).collect();
    codec.encode(&data, &mut par).expect("shapes are right");
    parity.iter().map(|p| p.to_vec()).collect()
}

fn fill(buf: &mut [u8], seed: &mut u64) {
    for b in buf.iter_mut() {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        *b = (*seed >> 24) as u8;
    }
}
