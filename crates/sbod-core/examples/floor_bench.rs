//! The CPU floor of a write (issue 31, docs/PERFORMANCE.md "The floor"): what the bytes of
//! a client write cost at the least on this machine, to hold the engine's CPU per byte
//! against. Every byte written is copied once (client buffer to the member's page cache or
//! device), summed once (its crc32c tag), and for a parity layout encoded once; this times
//! exactly that, streaming through 256 MiB so the bytes come from memory as a client's do,
//! in bytes of client data per second of this thread's CPU time (steady on a shared
//! machine, where wall-clock rates are not):
//!
//! - plain: copy + crc32c of each 4 KiB block (raid0 of one member: the plain export);
//! - raid6 6+2, 64 KiB chunks: copy of the data and parity + P+Q + crc32c of the data and
//!   the parity, as three passes (what the write path did before) and fused (the parity and
//!   the sums of one block row while it is in cache, `Codec::encode_slices`, then the copy).
//!
//!   cargo run --release -p sbod-core --example floor_bench [-- --json]

use sbod_codec::{Codec, Scheme};
use sbod_core::integrity::crc;

const BLOCK: usize = 4096;

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

/// Best of `reps` runs of `f` (each over `bytes` of client data): GB of client data per CPU
/// second.
fn best(reps: usize, bytes: usize, mut f: impl FnMut()) -> f64 {
    let mut top: f64 = 0.0;
    for _ in 0..reps {
        let t = cpu_now();
        f();
        let s = cpu_now() - t;
        top = top.max(bytes as f64 / s / 1e9);
    }
    top
}

fn main() {
    let json = std::env::args().any(|a| a == "--json");
    let big = 256 << 20;
    let src: Vec<u8> = (0..big)
        .map(|i| ((i * 2_654_435_761usize) >> 7) as u8)
        .collect();
    let mut dst = vec![0u8; big];
    let reps = 5;
    let mut sink = 0u32;

    // Plain: each 4 KiB block copied and summed.
    let copy = best(reps, big, || {
        dst.copy_from_slice(&src);
        std::hint::black_box(&dst);
    });
    let sum = best(reps, big, || {
        for b in src.chunks(BLOCK) {
            sink ^= crc(b);
        }
    });
    let plain = best(reps, big, || {
        for (s, d) in src.chunks(BLOCK).zip(dst.chunks_mut(BLOCK)) {
            sink ^= crc(s);
            d.copy_from_slice(s);
        }
        std::hint::black_box(&dst);
    });

    // raid6 6+2, 64 KiB chunks: stripes of 384 KiB of data.
    let (k, m, chunk) = (6usize, 2usize, 64 << 10);
    let codec = Codec::new(Scheme::PQ { k }).expect("codec");
    let stripe = k * chunk;
    let stripes = big / stripe;
    let data_bytes = stripes * stripe;
    let mut par = vec![vec![0u8; chunk]; m];
    let mut sums = vec![0u32; (k + m) * (chunk / BLOCK)];
    // Where the parity lands (its copy), one chunk per stripe per parity shard.
    let mut pdst = vec![0u8; stripes * m * chunk];
    // The data chunks of stripe `s`.
    let shards = |s: usize| -> Vec<&[u8]> {
        (0..k)
            .map(|i| &src[s * stripe + i * chunk..s * stripe + (i + 1) * chunk])
            .collect()
    };
    let parity_only = best(reps, data_bytes, || {
        for s in 0..stripes {
            let d = shards(s);
            let mut p: Vec<&mut [u8]> = par.iter_mut().map(|p| &mut p[..]).collect();
            codec.encode(&d, &mut p).expect("encode");
        }
        std::hint::black_box(&par);
    });
    let three = best(reps, data_bytes, || {
        for s in 0..stripes {
            let d = shards(s);
            let mut p: Vec<&mut [u8]> = par.iter_mut().map(|p| &mut p[..]).collect();
            codec.encode(&d, &mut p).expect("encode");
            for (n, b) in d
                .iter()
                .copied()
                .chain(par.iter().map(|p| &p[..]))
                .flat_map(|x| x.chunks(BLOCK))
                .enumerate()
            {
                sums[n] = crc(b);
            }
            dst[s * stripe..(s + 1) * stripe].copy_from_slice(&src[s * stripe..(s + 1) * stripe]);
            for (r, p) in par.iter().enumerate() {
                let at = (s * m + r) * chunk;
                pdst[at..at + chunk].copy_from_slice(p);
            }
        }
        std::hint::black_box((&dst, &pdst, &sums));
    });
    let fused = best(reps, data_bytes, || {
        for s in 0..stripes {
            let d = shards(s);
            let mut p: Vec<&mut [u8]> = par.iter_mut().map(|p| &mut p[..]).collect();
            let per = chunk / BLOCK;
            codec
                .encode_slices(&d, &mut p, BLOCK, |a, ds, ps| {
                    let row = a / BLOCK;
                    for (i, b) in ds.iter().chain(ps).enumerate() {
                        sums[i * per + row] = crc(b);
                    }
                })
                .expect("encode");
            dst[s * stripe..(s + 1) * stripe].copy_from_slice(&src[s * stripe..(s + 1) * stripe]);
            for (r, p) in par.iter().enumerate() {
                let at = (s * m + r) * chunk;
                pdst[at..at + chunk].copy_from_slice(p);
            }
        }
        std::hint::black_box((&dst, &pdst, &sums));
    });
    std::hint::black_box(sink);
    let rows = [
        ("copy", copy),
        ("crc32c per 4 KiB", sum),
        ("plain floor: copy + crc32c", plain),
        ("raid6 6+2 P+Q alone", parity_only),
        ("raid6 6+2 floor, three passes: P+Q, crc32c, copy", three),
        (
            "raid6 6+2 floor, fused: P+Q with crc32c per block row, copy",
            fused,
        ),
    ];
    if json {
        let v: Vec<String> = rows
            .iter()
            .map(|(n, r)| format!("{{\"what\":\"{n}\",\"gb_per_cpu_s\":{r:.3}}}"))
            .collect();
        println!("[{}]", v.join(","));
        return;
    }
    println!("| what (256 MiB streamed, client bytes) | GB per CPU-second |");
    println!("|---|---:|");
    for (n, r) in rows {
        println!("| {n} | {r:.2} |");
    }
}
