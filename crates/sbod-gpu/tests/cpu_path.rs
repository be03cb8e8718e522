//! The CPU side of the engine API: batches, the CPU fallback, mode parsing, and the
//! embedded PTX's freshness. No GPU needed.

#![allow(clippy::needless_range_loop)]

use proptest::prelude::*;
use sbod_codec::{Codec, Scheme};
use sbod_gpu::{
    cpu_encode, cpu_reconstruct_some, Backend, Batch, Parity, ParityMode, ParityOptions,
};

fn fill(buf: &mut [u8], seed: u64) {
    let mut x = seed | 1;
    for w in buf.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        w.copy_from_slice(&x.to_le_bytes()[..w.len()]);
    }
}

#[test]
fn parity_mode_parses() {
    assert_eq!("cpu".parse::<ParityMode>().unwrap(), ParityMode::Cpu);
    assert_eq!("GPU".parse::<ParityMode>().unwrap(), ParityMode::Gpu);
    assert_eq!("auto".parse::<ParityMode>().unwrap(), ParityMode::Auto);
    assert!("fast".parse::<ParityMode>().is_err());
    assert_eq!(ParityMode::Auto.to_string(), "auto");
}

#[test]
fn batch_layout_is_shard_major() {
    let mut b = Batch::new_heap(3, 2, 100, 4).unwrap();
    assert_eq!(b.shard_len(), 400);
    assert_eq!(b.data_bytes(), 1200);
    assert!(b.pitch() >= 400 && b.pitch() % 64 == 0);
    b.chunk_of_mut(2, 1).fill(7);
    assert!(b.shard(1)[200..300].iter().all(|&x| x == 7));
    assert!(b.shard(1)[..200].iter().all(|&x| x == 0));
    assert!(b.shard(0).iter().all(|&x| x == 0));
    assert_eq!(b.raw().as_ptr() as usize % 64, 0);
    // Page-multiple shard runs are skewed so that shards do not alias in the CPU caches.
    let b = Batch::new_heap(4, 2, 4096, 16).unwrap();
    assert_ne!(b.pitch() % 4096, 0);
    assert!(Batch::new_heap(0, 2, 4096, 1).is_err());
    assert!(Batch::new_heap(2, 2, 0, 1).is_err());
    assert!(Batch::new_heap(200, 57, 16, 1).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]

    /// The CPU path over a batch equals per-stripe encoding, for any thread count.
    #[test]
    fn cpu_batch_encode_matches_per_stripe(k in 1usize..10, m in 1usize..5, chunk in 1usize..300,
                                           stripes in 1usize..9, threads in 1usize..5,
                                           seed in any::<u64>()) {
        let codec = Codec::new(Scheme::Cauchy { k, m }).unwrap();
        let mut b = Batch::new_heap(k, m, chunk, stripes).unwrap();
        fill(b.raw_mut(), seed);
        cpu_encode(&codec, &mut b, threads).unwrap();
        for s in 0..stripes {
            let data: Vec<&[u8]> = (0..k).map(|i| b.chunk_of(s, i)).collect();
            let mut want = vec![vec![0u8; chunk]; m];
            let mut outs: Vec<&mut [u8]> = want.iter_mut().map(|v| v.as_mut_slice()).collect();
            codec.encode(&data, &mut outs).unwrap();
            for r in 0..m {
                prop_assert_eq!(b.chunk_of(s, k + r), &want[r][..]);
            }
        }
    }

    /// CPU batch reconstruct restores what was lost.
    #[test]
    fn cpu_batch_reconstruct(k in 1usize..8, m in 1usize..4, stripes in 1usize..6,
                             threads in 1usize..4, lost_a in 0usize..11, lost_b in 0usize..11,
                             seed in any::<u64>()) {
        let n = k + m;
        let codec = Codec::new(Scheme::Cauchy { k, m }).unwrap();
        let mut b = Batch::new_heap(k, m, 96, stripes).unwrap();
        fill(b.raw_mut(), seed);
        cpu_encode(&codec, &mut b, 1).unwrap();
        let good = b.raw().to_vec();
        let mut present = vec![true; n];
        present[lost_a % n] = false;
        if m >= 2 {
            present[lost_b % n] = false;
        }
        for i in 0..n {
            if !present[i] {
                b.shard_mut(i).fill(0xee);
            }
        }
        let want: Vec<bool> = present.iter().map(|p| !p).collect();
        cpu_reconstruct_some(&codec, &mut b, &present, &want, threads).unwrap();
        prop_assert!(b.raw() == &good[..]);
    }
}

#[test]
fn cpu_mode_never_touches_cuda_and_works() {
    let p = Parity::new(
        Scheme::PQ { k: 6 },
        ParityMode::Cpu,
        ParityOptions::default(),
    )
    .unwrap();
    assert!(p.gpu().is_none());
    let mut b = p.new_batch(4096, 3).unwrap();
    assert!(!b.is_pinned());
    fill(b.raw_mut(), 1);
    assert_eq!(p.encode(&mut b).unwrap(), Backend::Cpu);
    let good = b.raw().to_vec();
    let mut present = vec![true; 8];
    present[1] = false;
    present[7] = false;
    b.shard_mut(1).fill(0);
    b.shard_mut(7).fill(0);
    assert_eq!(p.reconstruct(&mut b, &present).unwrap(), Backend::Cpu);
    assert!(b.raw() == &good[..]);
    // Too many losses is the codec's error, unchanged.
    present[2] = false;
    assert!(p.reconstruct(&mut b, &present).is_err());
}

/// The PTX shipped for machines without NVRTC must come from the current kernel source:
/// regenerate it with scripts/gen-ptx.sh after editing kernels/parity.cu.
#[test]
fn embedded_ptx_is_current() {
    let first = sbod_gpu::cuda::EMBEDDED_PTX.lines().next().unwrap_or("");
    assert_eq!(
        first,
        sbod_gpu::cuda::ptx_header(),
        "kernels/parity.ptx is stale: run scripts/gen-ptx.sh"
    );
    for k in ["sbod_gf_apply", "sbod_xor", "sbod_pq", "sbod_copy"] {
        assert!(
            sbod_gpu::cuda::EMBEDDED_PTX.contains(&format!(".entry {k}(")),
            "{k}"
        );
    }
}

/// The kernel source compiles with NVRTC, for the embedded PTX's target and for Hopper.
#[test]
fn kernel_source_compiles_with_nvrtc() {
    if !sbod_gpu::cuda::nvrtc_present() {
        eprintln!("skipped: no NVRTC");
        return;
    }
    for arch in [sbod_gpu::cuda::EMBEDDED_PTX_ARCH, "compute_90"] {
        let ptx = sbod_gpu::cuda::compile(arch).unwrap_or_else(|e| panic!("{arch}: {e}"));
        assert!(ptx.contains(".entry sbod_gf_apply("), "{arch}");
        // Registers must not spill to local memory (a run-time-indexed array would).
        assert!(
            !ptx.contains("ld.local") && !ptx.contains("st.local"),
            "{arch}"
        );
    }
}

#[test]
fn probe_without_cuda_does_not_panic() {
    match sbod_gpu::probe() {
        Ok(info) => eprintln!("CUDA device: {info:?}"),
        Err(why) => {
            assert!(!why.is_empty());
            eprintln!("skipped: no CUDA device ({why})");
        }
    }
}
