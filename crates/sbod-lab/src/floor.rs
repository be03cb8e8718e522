//! The CPU floor of a write, measured on this machine before a run (issue 31; the
//! standalone version with every pass apart is `crates/sbod-core/examples/floor_bench.rs`,
//! docs/PERFORMANCE.md "The floor"): what the bytes of a client write cost at the least,
//! one copy, the crc32c of every 4 KiB block and, for a parity layout, the parity of each
//! stripe taken a block row at a time with the row's sums (as the engine's full-stripe
//! writes do) and the parity's copy, in client bytes per second of this thread's CPU time
//! (best of a few passes: steady on a shared machine, where wall-clock rates are not). The
//! report holds the server's bytes per CPU-second against it.

use crate::schema::CpuFloor;
use sbod_codec::{Codec, Scheme};

const BLOCK: usize = 4096;
/// Streamed per pass: past the caches, as a client's bytes come.
const BYTES: usize = 64 << 20;
const PASSES: usize = 3;

fn crc(b: &[u8]) -> u32 {
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, b) as u32
}

/// This thread's CPU time, in seconds.
fn cpu_now() -> f64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

/// Best of [`PASSES`] runs of `f` over `bytes` of client data: bytes per CPU-second.
fn best(bytes: usize, mut f: impl FnMut()) -> f64 {
    let mut top: f64 = 0.0;
    for _ in 0..PASSES {
        let t = cpu_now();
        f();
        let s = (cpu_now() - t).max(1e-9);
        top = top.max(bytes as f64 / s);
    }
    top
}

/// The parity scheme of a lab level ("raid5", "raid6", "ec:K+M") over `width` members
/// with `redundancy` of them parity; None for layouts without parity.
pub fn scheme_of(level: &str, width: u32, redundancy: u32) -> Option<Scheme> {
    let (w, r) = (width as usize, redundancy as usize);
    let k = w.checked_sub(r).filter(|&k| k > 0)?;
    match level {
        "raid5" if r == 1 => Some(Scheme::Xor { k }),
        "raid6" if r == 2 => Some(Scheme::PQ { k }),
        l if l.starts_with("ec:") && r > 0 => Some(Scheme::Cauchy { k, m: r }),
        _ => None,
    }
}

/// Measure the floor for a layout (`scheme`: its parity, None for none) with `chunk`
/// bytes per chunk. About a second of one core.
pub fn measure(scheme: Option<Scheme>, chunk: usize) -> CpuFloor {
    let src: Vec<u8> = (0..BYTES)
        .map(|i| ((i.wrapping_mul(2_654_435_761)) >> 7) as u8)
        .collect();
    let mut dst = vec![0u8; BYTES];
    let mut sink = 0u32;
    let copy = best(BYTES, || {
        dst.copy_from_slice(&src);
        std::hint::black_box(&dst);
    });
    let copy_crc32c = best(BYTES, || {
        for (s, d) in src.chunks(BLOCK).zip(dst.chunks_mut(BLOCK)) {
            sink ^= crc(s);
            d.copy_from_slice(s);
        }
        std::hint::black_box(&dst);
    });
    let chunk = chunk.clamp(BLOCK, 1 << 20) / BLOCK * BLOCK;
    let layout = scheme.and_then(|scheme| {
        let codec = Codec::new(scheme).ok()?;
        let (k, m) = (scheme.k(), scheme.m());
        let stripe = k * chunk;
        let stripes = BYTES / stripe;
        if stripes == 0 {
            return None;
        }
        let per = chunk / BLOCK;
        let mut par = vec![vec![0u8; chunk]; m];
        let mut sums = vec![0u32; (k + m) * per];
        let mut pdst = vec![0u8; stripes * m * chunk];
        Some(best(stripes * stripe, || {
            for s in 0..stripes {
                let d: Vec<&[u8]> = (0..k)
                    .map(|i| &src[s * stripe + i * chunk..s * stripe + (i + 1) * chunk])
                    .collect();
                let mut p: Vec<&mut [u8]> = par.iter_mut().map(|p| &mut p[..]).collect();
                codec
                    .encode_slices(&d, &mut p, BLOCK, |a, ds, ps| {
                        let row = a / BLOCK;
                        for (i, b) in ds.iter().chain(ps).enumerate() {
                            sums[i * per + row] = crc(b);
                        }
                    })
                    .expect("shards of one length");
                dst[s * stripe..(s + 1) * stripe]
                    .copy_from_slice(&src[s * stripe..(s + 1) * stripe]);
                for (r, p) in par.iter().enumerate() {
                    let at = (s * m + r) * chunk;
                    pdst[at..at + chunk].copy_from_slice(p);
                }
            }
            std::hint::black_box((&dst, &pdst, &sums));
        }))
    });
    std::hint::black_box(sink);
    let what = match scheme {
        Some(s) => format!(
            "{} {}+{}, {} KiB chunks: copy of data and parity, parity and crc32c per 4 KiB block row",
            match s {
                Scheme::Xor { .. } => "xor",
                Scheme::PQ { .. } => "p+q",
                Scheme::Cauchy { .. } => "cauchy",
            },
            s.k(),
            s.m(),
            chunk >> 10
        ),
        None => "no parity".into(),
    };
    CpuFloor {
        copy,
        copy_crc32c,
        layout,
        what,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_map_to_their_parity() {
        assert_eq!(scheme_of("raid6", 8, 2), Some(Scheme::PQ { k: 6 }));
        assert_eq!(scheme_of("raid5", 4, 1), Some(Scheme::Xor { k: 3 }));
        assert_eq!(
            scheme_of("ec:5+3", 8, 3),
            Some(Scheme::Cauchy { k: 5, m: 3 })
        );
        assert_eq!(scheme_of("raid10", 4, 1), None);
        assert_eq!(scheme_of("raid0", 4, 0), None);
    }

    #[test]
    fn the_floor_measures_each_row() {
        let f = measure(Some(Scheme::PQ { k: 6 }), 64 << 10);
        let layout = f.layout.expect("raid6 has parity");
        for x in [f.copy, f.copy_crc32c, layout] {
            assert!(x.is_finite() && x > 0.0, "{f:?}");
        }
        assert!(f.what.contains("p+q 6+2, 64 KiB"), "{}", f.what);
        assert_eq!(measure(None, 64 << 10).layout, None);
    }
}
