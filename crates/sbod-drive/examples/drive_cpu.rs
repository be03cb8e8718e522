//! What modelled drives cost the host's CPU: N drives in one process, each kept busy by a
//! closed loop of requests, over an inner device that does no data work (so only the model,
//! its timer and the completions are measured). Prints the I/O the drives did in real time
//! against their model, and the process's CPU time.
//!
//!   cargo run --release -p sbod-drive --example drive_cpu -- [DRIVES] [PROFILE] [rand4k|seq1m] [QD] [SECS]

use sbod_core::buf::AlignedBuf;
use sbod_core::dev::{self, BlockDev, Done, IoClass, IoReq};
use sbod_drive::{wrap, Spec};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Answers at once, touches nothing.
struct Null(u64);
impl BlockDev for Null {
    fn submit(&self, _req: IoReq, done: Done) {
        done(Ok(()))
    }
    fn size(&self) -> u64 {
        self.0
    }
    fn name(&self) -> &str {
        "null"
    }
}

fn cpu_secs() -> f64 {
    // SAFETY: getrusage fills the struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let n: usize = a.get(1).map_or(24, |s| s.parse().unwrap());
    let profile = a.get(2).cloned().unwrap_or("hdd-nearline".into());
    let pattern = a.get(3).cloned().unwrap_or("rand4k".into());
    let qd: usize = a.get(4).map_or(16, |s| s.parse().unwrap());
    let secs: f64 = a.get(5).map_or(5.0, |s| s.parse().unwrap());
    let size = 16u64 << 30;
    let (bs, random) = match pattern.as_str() {
        "seq1m" => (1u64 << 20, false),
        _ => (4096u64, true),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let ops = Arc::new(AtomicU64::new(0));
    let spec = Spec::parse(&format!("model:{profile}:/tmp/drive_cpu")).unwrap();
    let drives: Vec<Arc<dyn BlockDev>> = (0..n)
        .map(|i| wrap(format!("d{i}"), &spec, Arc::new(Null(size))).unwrap())
        .collect();
    let (c0, t0) = (cpu_secs(), Instant::now());
    rt.block_on(async {
        let end = Instant::now() + Duration::from_secs_f64(secs);
        let mut tasks = Vec::new();
        for (di, d) in drives.iter().enumerate() {
            for q in 0..qd {
                let (d, ops) = (d.clone(), ops.clone());
                tasks.push(tokio::spawn(async move {
                    let mut x = (di * 7919 + q * 104729) as u64 | 1;
                    let mut pos = (q as u64) * bs;
                    let buf = AlignedBuf::zeroed(bs as usize).into_shared();
                    while Instant::now() < end {
                        let off = if random {
                            x ^= x << 13;
                            x ^= x >> 7;
                            x ^= x << 17;
                            x % (size / bs) * bs
                        } else {
                            pos = (pos + qd as u64 * bs) % size;
                            pos
                        };
                        dev::read_at(&d, off, buf.clone(), IoClass::Foreground)
                            .await
                            .unwrap();
                        ops.fetch_add(1, Ordering::Relaxed);
                    }
                }));
            }
        }
        for t in tasks {
            t.await.unwrap();
        }
    });
    let (cpu, wall) = (cpu_secs() - c0, t0.elapsed().as_secs_f64());
    let o = ops.load(Ordering::Relaxed) as f64;
    println!(
        "{n} x {profile}, {pattern} QD{qd}: {:.0} IOPS per drive, {:.0} MB/s per drive; CPU {:.1}% of one core ({:.2}% per drive)",
        o / wall / n as f64,
        o * bs as f64 / wall / n as f64 / 1e6,
        cpu / wall * 100.0,
        cpu / wall * 100.0 / n as f64
    );
}
