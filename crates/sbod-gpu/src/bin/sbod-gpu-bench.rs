//! sbod-gpu-bench: GPU parity measured against the machine's own ceilings and CPU.
//!
//! On a machine with a CUDA device it (1) checks that GPU encode and reconstruct are
//! byte-identical to the CPU codec, (2) measures the device memory ceiling
//! (device-to-device copy) and the PCIe ceiling (pinned copies), (3) kernel-only encode and
//! reconstruct throughput with the data already on the GPU, (4) end-to-end batch encode
//! including transfers (streams overlapping), (5) the CPU codec on all cores, and prints
//! a Markdown table with the ratios against the aims. Run through scripts/bench-gpu.sh.
//!
//! Without a device it says "no CUDA device" (and why) and exits with status 2; with
//! `--cpu-only` it then measures the CPU codec alone. `--emit-ptx PATH` regenerates the
//! PTX shipped in the crate (needs NVRTC, no device).

use std::process::ExitCode;
use std::time::{Duration, Instant};

use sbod_codec::Scheme;
use sbod_gpu::{cpu_encode, Batch, GpuCodec, Parity, ParityMode, ParityOptions};

struct Args {
    data_mib: usize,
    e2e_mib: usize,
    chunk_kib: usize,
    iters: usize,
    threads: usize,
    cpu_only: bool,
    quick: bool,
    emit_ptx: Option<String>,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        data_mib: 1024,
        e2e_mib: 256,
        chunk_kib: 64,
        iters: 20,
        threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        cpu_only: false,
        quick: false,
        emit_ptx: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut val = |name: &str| -> Result<usize, String> {
            it.next()
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| format!("{name} needs a number"))
        };
        match arg.as_str() {
            "--data-mib" => a.data_mib = val("--data-mib")?,
            "--e2e-mib" => a.e2e_mib = val("--e2e-mib")?,
            "--chunk-kib" => a.chunk_kib = val("--chunk-kib")?,
            "--iters" => a.iters = val("--iters")?.max(1),
            "--threads" => a.threads = val("--threads")?.max(1),
            "--cpu-only" => a.cpu_only = true,
            "--quick" => a.quick = true,
            "--emit-ptx" => a.emit_ptx = Some(it.next().ok_or("--emit-ptx needs a path")?),
            "-h" | "--help" => {
                println!(
                    "usage: sbod-gpu-bench [--data-mib N (kernel-only data, 1024)] \
                     [--e2e-mib N (end-to-end batch data, 256)] [--chunk-kib N (64)] \
                     [--iters N (20)] [--threads N (all cores)] [--quick] [--cpu-only] \
                     [--emit-ptx PATH]"
                );
                std::process::exit(0);
            }
            x => return Err(format!("unknown argument {x:?} (try --help)")),
        }
    }
    if a.quick {
        a.data_mib = a.data_mib.min(128);
        a.e2e_mib = a.e2e_mib.min(64);
        a.iters = a.iters.min(5);
    }
    Ok(a)
}

const CASES: [(&str, Scheme); 4] = [
    ("raid6 8+2 P+Q", Scheme::PQ { k: 8 }),
    ("ec 8+2 Cauchy", Scheme::Cauchy { k: 8, m: 2 }),
    ("ec 10+4 Cauchy", Scheme::Cauchy { k: 10, m: 4 }),
    ("raid5 7+1 XOR", Scheme::Xor { k: 7 }),
];

fn gbs(bytes: f64, t: Duration) -> f64 {
    bytes / t.as_secs_f64() / 1e9
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

/// Shard length for `data_mib` of data over k shards, a multiple of the chunk.
fn shard_len(data_mib: usize, k: usize, chunk: usize) -> usize {
    ((data_mib << 20) / k / chunk).max(1) * chunk
}

/// CPU codec on `threads` threads over one heap batch: data GB/s.
fn cpu_rate(scheme: Scheme, data_mib: usize, chunk: usize, threads: usize) -> Result<f64, String> {
    let codec = sbod_codec::Codec::new(scheme).map_err(|e| e.to_string())?;
    let stripes = shard_len(data_mib, codec.k(), chunk) / chunk;
    let mut b = Batch::new_heap(codec.k(), codec.m(), chunk, stripes).map_err(|e| e.to_string())?;
    fill(b.raw_mut(), 7);
    cpu_encode(&codec, &mut b, threads).map_err(|e| e.to_string())?;
    let t = Instant::now();
    let mut n = 0;
    while n < 3 || t.elapsed() < Duration::from_millis(1500) {
        cpu_encode(&codec, &mut b, threads).map_err(|e| e.to_string())?;
        n += 1;
    }
    Ok(gbs((b.data_bytes() * n) as f64, t.elapsed()))
}

/// GPU results against the CPU codec: encode of each case, and reconstruct of every
/// erasure pattern of up to m lost shards (sampled for wide codes).
fn verify(threads: usize) -> Result<usize, String> {
    let mut cases = 0;
    let mut schemes: Vec<Scheme> = CASES.iter().map(|c| c.1).collect();
    schemes.extend([
        Scheme::Xor { k: 1 },
        Scheme::PQ { k: 3 },
        Scheme::Cauchy { k: 1, m: 1 },
        Scheme::Cauchy { k: 5, m: 3 },
        Scheme::Cauchy { k: 17, m: 7 },
        Scheme::Cauchy { k: 32, m: 8 },
    ]);
    for (si, scheme) in schemes.into_iter().enumerate() {
        let g = GpuCodec::new(scheme)
            .map_err(|e| e.to_string())?
            .ok_or("device vanished")?;
        let (k, m) = (g.codec().k(), g.codec().m());
        let n = k + m;
        // Odd sizes: 3 stripes of 4 KiB + 48 bytes exercise partial blocks and segments.
        for (chunk, stripes) in [(4096 + 48, 3), (64 << 10, 40)] {
            let mut gb = g.new_batch(chunk, stripes).map_err(|e| e.to_string())?;
            fill(gb.raw_mut(), 1000 + si as u64);
            let mut cb = Batch::new_heap(k, m, chunk, stripes).map_err(|e| e.to_string())?;
            cb.raw_mut().copy_from_slice(gb.raw());
            g.encode(&mut gb).map_err(|e| e.to_string())?;
            cpu_encode(g.codec(), &mut cb, threads).map_err(|e| e.to_string())?;
            for i in 0..n {
                if gb.shard(i) != cb.shard(i) {
                    return Err(format!("{scheme}: GPU encode differs in shard {i}"));
                }
            }
            cases += 1;
            let good = gb.raw().to_vec();
            // Every pattern of 1..=min(m,2) losses, plus m losses in a few positions.
            let mut patterns: Vec<Vec<usize>> = Vec::new();
            for a in 0..n {
                patterns.push(vec![a]);
                if m >= 2 {
                    for b in a + 1..n {
                        patterns.push(vec![a, b]);
                    }
                }
            }
            for start in [0, n.saturating_sub(m), k / 2] {
                patterns.push((start..(start + m).min(n)).collect());
            }
            if n > 24 {
                patterns.retain(|p| p.len() != 2 || (p[0] + p[1]) % 7 == 0);
            }
            for lost in patterns {
                let mut present = vec![true; n];
                for &i in &lost {
                    present[i] = false;
                    gb.shard_mut(i).fill(0xa5);
                }
                g.reconstruct(&mut gb, &present)
                    .map_err(|e| e.to_string())?;
                if gb.raw() != &good[..] {
                    return Err(format!("{scheme}: GPU reconstruct of {lost:?} is wrong"));
                }
                cases += 1;
            }
        }
    }
    Ok(cases)
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("sbod-gpu-bench: {e}");
            return ExitCode::from(64);
        }
    };
    if let Some(path) = &args.emit_ptx {
        return emit_ptx(path);
    }
    let chunk = args.chunk_kib << 10;
    println!("# sbod GPU parity benchmark");
    println!();
    println!(
        "host: {} ({} threads used for the CPU codec)",
        cpu_model(),
        args.threads
    );
    let info = match sbod_gpu::probe() {
        Ok(i) => i,
        Err(why) => {
            println!("no CUDA device: {why}");
            println!("GPU measurements skipped.");
            if args.cpu_only {
                cpu_table(&args, chunk);
                return ExitCode::SUCCESS;
            }
            return ExitCode::from(2);
        }
    };
    println!(
        "device: {} (compute {}.{}, {} SMs, {:.1} GiB), driver CUDA {}.{}, kernels: {:?}{}",
        info.name,
        info.compute_capability.0,
        info.compute_capability.1,
        info.multiprocessors,
        info.memory_bytes as f64 / (1u64 << 30) as f64,
        info.driver_version / 1000,
        info.driver_version % 1000 / 10,
        info.kernels,
        info.nvrtc_note
            .as_ref()
            .map(|n| format!(" (NVRTC not used: {n})"))
            .unwrap_or_default()
    );
    match run(&args, chunk) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            println!("FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args, chunk: usize) -> Result<(), String> {
    let gpu = sbod_gpu::Gpu::open()
        .map_err(|e| e.to_string())?
        .ok_or("no device")?;
    let t = Instant::now();
    let cases = verify(args.threads)?;
    println!(
        "verify: {cases} encode/reconstruct cases byte-identical to the CPU codec ({:.1} s)",
        t.elapsed().as_secs_f64()
    );

    let mem_bytes = (args.data_mib << 20).clamp(64 << 20, 2 << 30) / 16 * 16;
    let mem = sbod_gpu::measure::memory_ceiling(&gpu, mem_bytes, args.iters)
        .map_err(|e| e.to_string())?;
    let pcie_bytes = (args.e2e_mib << 20).clamp(32 << 20, 1 << 30);
    let pcie = sbod_gpu::measure::pcie_ceiling(&gpu, pcie_bytes, args.iters.min(10))
        .map_err(|e| e.to_string())?;
    let mem_ceiling = mem.best() / 1e9;
    let h2d = pcie.h2d / 1e9;
    println!();
    println!("## Ceilings");
    println!();
    println!(
        "- device memory (read + written bytes/s): cuMemcpyDtoD {:.0} GB/s, streaming copy \
         kernel {:.0} GB/s ({} MiB copies); ceiling used: {:.0} GB/s",
        mem.memcpy / 1e9,
        mem.copy_kernel / 1e9,
        mem_bytes >> 20,
        mem_ceiling
    );
    println!(
        "- PCIe, pinned ({} MiB copies): host-to-device {:.1} GB/s, device-to-host {:.1} GB/s, \
         both at once {:.1} + {:.1} GB/s; ceiling used: host-to-device {:.1} GB/s",
        pcie_bytes >> 20,
        pcie.h2d / 1e9,
        pcie.d2h / 1e9,
        pcie.both.0 / 1e9,
        pcie.both.1 / 1e9,
        h2d
    );

    println!();
    println!("## Encode");
    println!();
    println!(
        "Kernel: {} MiB of data resident on the GPU. End-to-end: {} MiB batches of {} KiB \
         chunks from pinned host memory, parity back to it. CPU: sbod-codec on {} threads. \
         GB/s count data bytes (k shards); 'mem %' counts every byte the kernel reads and \
         writes ((k+m)/k of the data rate) against the memory ceiling.",
        args.data_mib, args.e2e_mib, args.chunk_kib, args.threads
    );
    println!();
    println!(
        "| case | kernel GB/s | kernel / mem ceiling | mem % | end-to-end GB/s | / PCIe H2D | \
         CPU GB/s | end-to-end / CPU | kernel / CPU |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let mut aims = Vec::new();
    for (name, scheme) in CASES {
        let g = GpuCodec::on(&gpu, scheme).map_err(|e| e.to_string())?;
        let (k, m) = (g.codec().k(), g.codec().m());
        let len = shard_len(args.data_mib, k, chunk);
        let kt = g
            .time_resident(len, None, args.iters)
            .map_err(|e| e.to_string())?;
        let kernel = gbs((k * len) as f64, kt);
        let traffic = kernel * (k + m) as f64 / k as f64;

        let stripes = shard_len(args.e2e_mib, k, chunk) / chunk;
        let mut b = g.new_batch(chunk, stripes).map_err(|e| e.to_string())?;
        fill(b.raw_mut(), 3);
        g.encode(&mut b).map_err(|e| e.to_string())?;
        let iters = args.iters.clamp(3, 10);
        let t = Instant::now();
        for _ in 0..iters {
            g.encode(&mut b).map_err(|e| e.to_string())?;
        }
        let e2e = gbs((b.data_bytes() * iters) as f64, t.elapsed());
        drop(b);
        let cpu = cpu_rate(scheme, args.e2e_mib, chunk, args.threads)?;
        println!(
            "| {name} | {kernel:.0} | {:.0}% | {:.0}% | {e2e:.1} | {:.0}% | {cpu:.1} | {:.2}x | {:.1}x |",
            100.0 * kernel / mem_ceiling,
            100.0 * traffic / mem_ceiling,
            100.0 * e2e / h2d,
            e2e / cpu,
            kernel / cpu
        );
        if k == 8 && m == 2 {
            aims.push((name, kernel / mem_ceiling, e2e / h2d));
        }
    }

    println!();
    println!("## Reconstruct (kernel only, data resident)");
    println!();
    println!("| case | lost | kernel GB/s (survivor bytes read) |");
    println!("|---|---|---|");
    for (name, scheme, lost) in [
        ("raid6 8+2 P+Q", Scheme::PQ { k: 8 }, vec![2usize, 5]),
        ("ec 8+2 Cauchy", Scheme::Cauchy { k: 8, m: 2 }, vec![0, 7]),
        (
            "ec 10+4 Cauchy",
            Scheme::Cauchy { k: 10, m: 4 },
            vec![0, 3, 6, 9],
        ),
        ("raid5 7+1 XOR", Scheme::Xor { k: 7 }, vec![4]),
    ] {
        let g = GpuCodec::on(&gpu, scheme).map_err(|e| e.to_string())?;
        let (k, m) = (g.codec().k(), g.codec().m());
        let len = shard_len(args.data_mib, k, chunk);
        let mut present = vec![true; k + m];
        for &i in &lost {
            present[i] = false;
        }
        let t = g
            .time_resident(len, Some(&present), args.iters)
            .map_err(|e| e.to_string())?;
        println!("| {name} | {lost:?} | {:.0} |", gbs((k * len) as f64, t));
    }

    println!();
    println!("## Aims");
    println!();
    for (name, kr, er) in aims {
        println!(
            "- {name}: kernel-only data rate = {:.0}% of the memory ceiling (aim >= 50%: {}); \
             end-to-end = {:.0}% of the PCIe host-to-device ceiling (aim >= 80%: {})",
            100.0 * kr,
            if kr >= 0.5 { "met" } else { "MISSED" },
            100.0 * er,
            if er >= 0.8 { "met" } else { "MISSED" }
        );
    }

    println!();
    println!(
        "## --parity auto (8+2 P+Q, {} KiB chunks, 1 CPU thread per batch)",
        args.chunk_kib
    );
    println!();
    let p = Parity::new(
        Scheme::PQ { k: 8 },
        ParityMode::Auto,
        ParityOptions {
            cpu_threads: 1,
            chunk,
            max_batch_bytes: 64 << 20,
        },
    )
    .map_err(|e| e.to_string())?;
    println!("{}", p.summary());
    println!();
    println!("| batch data | CPU | GPU |");
    println!("|---|---|---|");
    for s in p.samples() {
        println!(
            "| {} KiB | {:.1} GB/s | {:.1} GB/s |",
            s.data_bytes >> 10,
            gbs(s.data_bytes as f64, s.cpu),
            gbs(s.data_bytes as f64, s.gpu)
        );
    }
    Ok(())
}

fn cpu_table(args: &Args, chunk: usize) {
    println!();
    println!(
        "| case | CPU GB/s ({} threads, {} MiB batches, {} KiB chunks) |",
        args.threads, args.e2e_mib, args.chunk_kib
    );
    println!("|---|---|");
    for (name, scheme) in CASES {
        match cpu_rate(scheme, args.e2e_mib, chunk, args.threads) {
            Ok(r) => println!("| {name} | {r:.1} |"),
            Err(e) => println!("| {name} | error: {e} |"),
        }
    }
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into())
        + &format!(
            ", {} logical CPUs",
            std::thread::available_parallelism().map_or(1, |n| n.get())
        )
}

fn emit_ptx(path: &str) -> ExitCode {
    match sbod_gpu::cuda::compile(sbod_gpu::cuda::EMBEDDED_PTX_ARCH) {
        Ok(ptx) => {
            let v = sbod_gpu::cuda::nvrtc_version().unwrap_or((0, 0));
            let text = format!(
                "{}\n// Generated by scripts/gen-ptx.sh (NVRTC {}.{}, {}): do not edit.\n{}",
                sbod_gpu::cuda::ptx_header(),
                v.0,
                v.1,
                sbod_gpu::cuda::EMBEDDED_PTX_ARCH,
                ptx.trim_end_matches('\0')
            );
            if let Err(e) = std::fs::write(path, text) {
                eprintln!("writing {path}: {e}");
                return ExitCode::FAILURE;
            }
            println!("wrote {path}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}
