//! The GPU path against the CPU codec. Each test that needs a CUDA device prints
//! "skipped: no CUDA device" and returns when there is none (as on CI), unless
//! SBOD_REQUIRE_GPU=1 (scripts/bench-gpu.sh sets it on machines with nvidia-smi), where a
//! missing device fails the test instead of skipping it.

#![allow(clippy::needless_range_loop)]

use sbod_codec::{Codec, Scheme};
use sbod_gpu::{cpu_encode, Batch, GpuCodec, Parity, ParityMode, ParityOptions};

fn gpu_codec(scheme: Scheme) -> Option<GpuCodec> {
    match GpuCodec::new(scheme) {
        Ok(Some(g)) => Some(g),
        Ok(None) => {
            assert!(
                std::env::var_os("SBOD_REQUIRE_GPU").is_none(),
                "SBOD_REQUIRE_GPU is set but there is no CUDA device: {:?}",
                sbod_gpu::probe().err()
            );
            eprintln!("skipped: no CUDA device");
            None
        }
        Err(e) => panic!("a CUDA device is present but unusable: {e}"),
    }
}

fn fill(buf: &mut [u8], seed: u64) {
    let mut x = seed | 1;
    for w in buf.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        w.copy_from_slice(&x.to_le_bytes()[..w.len()]);
    }
}

fn schemes() -> Vec<Scheme> {
    vec![
        Scheme::Xor { k: 1 },
        Scheme::Xor { k: 7 },
        Scheme::PQ { k: 2 },
        Scheme::PQ { k: 8 },
        Scheme::PQ { k: 30 },
        Scheme::Cauchy { k: 8, m: 2 },
        Scheme::Cauchy { k: 10, m: 4 },
        Scheme::Cauchy { k: 12, m: 5 },
        Scheme::Cauchy { k: 40, m: 9 },
    ]
}

#[test]
fn gpu_encode_is_byte_identical_to_cpu() {
    for scheme in schemes() {
        let Some(g) = gpu_codec(scheme) else { return };
        let (k, m) = (g.codec().k(), g.codec().m());
        // A tiny batch, an odd-sized one, and one large enough for several segments.
        for (chunk, stripes) in [(16, 1), (4096 + 80, 7), (64 << 10, 48)] {
            let mut gb = g.new_batch(chunk, stripes).unwrap();
            assert!(gb.is_pinned());
            fill(gb.raw_mut(), (k * 31 + m + chunk) as u64);
            let mut cb = Batch::new_heap(k, m, chunk, stripes).unwrap();
            cb.raw_mut().copy_from_slice(gb.raw());
            g.encode(&mut gb).unwrap();
            cpu_encode(g.codec(), &mut cb, 2).unwrap();
            for i in 0..k + m {
                assert_eq!(gb.shard(i), cb.shard(i), "{scheme} chunk {chunk} shard {i}");
            }
        }
    }
}

#[test]
fn gpu_reconstruct_restores_every_pattern() {
    for scheme in schemes() {
        let Some(g) = gpu_codec(scheme) else { return };
        let (k, m) = (g.codec().k(), g.codec().m());
        let n = k + m;
        let mut b = g.new_batch(4096, 9).unwrap();
        fill(b.raw_mut(), n as u64);
        g.encode(&mut b).unwrap();
        let good = b.raw().to_vec();
        let mut patterns: Vec<Vec<usize>> = (0..n).map(|i| vec![i]).collect();
        if m >= 2 {
            for a in 0..n {
                for c in a + 1..n {
                    if n <= 16 || (a + c) % 5 == 0 {
                        patterns.push(vec![a, c]);
                    }
                }
            }
        }
        patterns.push((0..m).collect());
        patterns.push((n - m..n).collect());
        for lost in patterns {
            let mut present = vec![true; n];
            for &i in &lost {
                present[i] = false;
                b.shard_mut(i).fill(0x3c);
            }
            g.reconstruct(&mut b, &present).unwrap();
            assert!(b.raw() == &good[..], "{scheme} lost {lost:?}");
        }
        // Rebuilding only some of the lost shards leaves the others alone.
        if m >= 2 {
            let mut present = vec![true; n];
            present[0] = false;
            present[n - 1] = false;
            let mut want = vec![false; n];
            want[n - 1] = true;
            b.shard_mut(0).fill(0x11);
            b.shard_mut(n - 1).fill(0x22);
            g.reconstruct_some(&mut b, &present, &want).unwrap();
            assert_eq!(
                b.shard(n - 1),
                &good[(n - 1) * b.pitch()..][..b.shard_len()]
            );
            assert!(b.shard(0).iter().all(|&x| x == 0x11));
        }
    }
}

#[test]
fn gpu_runs_concurrent_batches() {
    let Some(g) = gpu_codec(Scheme::Cauchy { k: 6, m: 3 }) else {
        return;
    };
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let g = &g;
            s.spawn(move || {
                for round in 0..5 {
                    let mut gb = g.new_batch(8192, 33).unwrap();
                    fill(gb.raw_mut(), t * 100 + round);
                    let mut cb = Batch::new_heap(6, 3, 8192, 33).unwrap();
                    cb.raw_mut().copy_from_slice(gb.raw());
                    g.encode(&mut gb).unwrap();
                    cpu_encode(g.codec(), &mut cb, 1).unwrap();
                    assert!(gb.raw() == cb.raw());
                }
            });
        }
    });
}

#[test]
fn gpu_rejects_mismatched_batches() {
    let Some(g) = gpu_codec(Scheme::PQ { k: 4 }) else {
        return;
    };
    let mut wrong = Batch::new_heap(5, 2, 4096, 2).unwrap();
    assert!(g.encode(&mut wrong).is_err());
    let mut odd = g.new_batch(10, 1).unwrap(); // 10-byte shards: not whole 16-byte words
    assert!(g.encode(&mut odd).is_err());
}

#[test]
fn forced_gpu_mode_without_device_is_a_clear_error() {
    let r = Parity::new(
        Scheme::PQ { k: 4 },
        ParityMode::Gpu,
        ParityOptions::default(),
    );
    match sbod_gpu::probe() {
        Ok(_) => assert!(r.is_ok()),
        Err(why) => {
            let e = r.unwrap_err().to_string();
            assert!(e.contains("unavailable"), "{e}");
            eprintln!("skipped: no CUDA device ({why}); got the expected error: {e}");
        }
    }
}

#[test]
fn auto_mode_calibrates_or_falls_back() {
    let p = Parity::new(
        Scheme::Cauchy { k: 4, m: 2 },
        ParityMode::Auto,
        ParityOptions {
            cpu_threads: 1,
            chunk: 4096,
            max_batch_bytes: 1 << 20,
        },
    )
    .unwrap();
    eprintln!("{}", p.summary());
    let codec = Codec::new(Scheme::Cauchy { k: 4, m: 2 }).unwrap();
    let mut b = p.new_batch(4096, 64).unwrap();
    fill(b.raw_mut(), 5);
    let mut c = Batch::new_heap(4, 2, 4096, 64).unwrap();
    c.raw_mut().copy_from_slice(b.raw());
    let used = p.encode(&mut b).unwrap();
    cpu_encode(&codec, &mut c, 1).unwrap();
    assert!(b.raw() == c.raw(), "backend {used:?}");
    if sbod_gpu::probe().is_err() {
        assert_eq!(used, sbod_gpu::Backend::Cpu);
        assert!(p.samples().is_empty());
    } else {
        assert!(!p.samples().is_empty());
    }
}
