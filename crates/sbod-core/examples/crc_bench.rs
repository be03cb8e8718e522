//! The checksum's speed against memory's (docs/PERFORMANCE.md, "Checksums"): crc32c of
//! 4 KiB blocks (the tag of every block read and written, `integrity::tag`) cache-resident
//! and streaming through 256 MiB, beside a memory copy of the same bytes, and the
//! cache-resident rate of the `crc32c` crate the tags used before `crc-fast`.
//!
//!   cargo run --release -p sbod-core --example crc_bench

use std::time::Instant;

fn rate(bytes: usize, secs: f64) -> String {
    format!("{:.1} GB/s", bytes as f64 / secs / 1e9)
}

fn main() {
    let big = 256 << 20;
    let src: Vec<u8> = (0..big)
        .map(|i| ((i * 2_654_435_761usize) >> 7) as u8)
        .collect();
    let mut dst = vec![0u8; big];
    let block = sbod_core::integrity::BLOCK as usize;
    let rounds = 8;
    // Cache-resident: the same 64 KiB over and over.
    let hot = &src[..64 << 10];
    let t = Instant::now();
    let mut x = 0u32;
    let n = 40_000;
    for _ in 0..n {
        for (i, b) in hot.chunks(block).enumerate() {
            x ^= sbod_core::integrity::tag(i as u64, b);
        }
    }
    let hot_rate = rate(n * hot.len(), t.elapsed().as_secs_f64());
    // The same blocks through the `crc32c` crate (SSE4.2), which the tags used before.
    let t = Instant::now();
    for _ in 0..n {
        for b in hot.chunks(block) {
            x ^= crc32c::crc32c(b);
        }
    }
    let hot_sse = rate(n * hot.len(), t.elapsed().as_secs_f64());
    // Streaming: 256 MiB, tag per 4 KiB block.
    let t = Instant::now();
    for _ in 0..rounds {
        for (i, b) in src.chunks(block).enumerate() {
            x ^= sbod_core::integrity::tag(i as u64, b);
        }
    }
    let stream_rate = rate(rounds * big, t.elapsed().as_secs_f64());
    let t = Instant::now();
    for _ in 0..rounds {
        dst.copy_from_slice(&src);
        std::hint::black_box(&dst);
    }
    let copy_rate = rate(rounds * big, t.elapsed().as_secs_f64());
    #[cfg(target_arch = "x86_64")]
    let hw = std::is_x86_feature_detected!("sse4.2");
    #[cfg(target_arch = "aarch64")]
    let hw = std::arch::is_aarch64_feature_detected!("crc");
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let hw = false;
    println!(
        "crc32c instructions: {}",
        if hw { "yes" } else { "no (software)" }
    );
    println!("crc32c per 4 KiB block, cache-resident (64 KiB): {hot_rate}");
    println!("  the same with the crc32c crate (SSE4.2):       {hot_sse}");
    println!("crc32c per 4 KiB block, streaming 256 MiB:       {stream_rate}");
    println!("memory copy, streaming 256 MiB:                  {copy_rate}");
    std::hint::black_box(x);
}
