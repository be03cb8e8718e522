//! Member queue benchmark: the same load through the worker-thread queue (`FileDev`) and the
//! io_uring queue (`UringDev`), side by side, on files in each given directory.
//!
//! Loads: random 4K read and write at a fixed queue depth, sequential 1M read and write.
//! Each (directory, load) runs every backend `--reps` times, interleaved, and reports the
//! mean IOPS and MB/s, the coefficient of variation, CPU time per I/O (getrusage of the
//! whole process: submitter, queue threads and io_uring's kernel workers) and the
//! uring/threads ratios. Run through scripts/bench-members.sh.
//!
//!     cargo run --release -p sbod-core --example member_bench -- \
//!         --dir /dev/shm --dir /tmp --size 1G --secs 2 --reps 3

use sbod_core::buf::SharedBuf;
use sbod_core::dev::{file, BlockDev, FileDev, IoClass, IoKind, IoReq, UringDev};
use sbod_core::AlignedBuf;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Backend {
    Threads,
    Uring,
}

#[derive(Clone, Copy)]
struct Load {
    name: &'static str,
    bs: usize,
    qd: usize,
    write: bool,
    random: bool,
}

struct Args {
    dirs: Vec<PathBuf>,
    /// Existing block devices (or files) to run on directly. Their data is overwritten.
    devs: Vec<PathBuf>,
    size: u64,
    secs: f64,
    reps: usize,
    qd: usize,
    seq_qd: usize,
    threads: usize,
    /// Only loads whose name contains one of these (all when empty).
    only: Vec<String>,
}

fn parse_size(s: &str) -> u64 {
    sbod_core::layout::parse_size(s).unwrap_or_else(|e| panic!("{e}"))
}

fn args() -> Args {
    let mut a = Args {
        dirs: Vec::new(),
        devs: Vec::new(),
        size: 1 << 30,
        secs: 2.0,
        reps: 3,
        qd: 32,
        seq_qd: 8,
        threads: file::OpenOptions::default().threads,
        only: Vec::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut v = || it.next().unwrap_or_else(|| panic!("{k} needs a value"));
        match k.as_str() {
            "--dir" => a.dirs.push(PathBuf::from(v())),
            "--dev" => a.devs.push(PathBuf::from(v())),
            "--size" => a.size = parse_size(&v()),
            "--secs" => a.secs = v().parse().expect("--secs"),
            "--reps" => a.reps = v().parse().expect("--reps"),
            "--qd" => a.qd = v().parse().expect("--qd"),
            "--seq-qd" => a.seq_qd = v().parse().expect("--seq-qd"),
            "--threads" => a.threads = v().parse().expect("--threads"),
            "--only" => a.only.extend(v().split(',').map(String::from)),
            _ => panic!(
                "unknown argument {k}; use --dir D / --dev DEVICE (repeatable; a device is overwritten) --size S --secs T --reps N \
                 --qd N --seq-qd N --threads N --only randread,seqwrite,..."
            ),
        }
    }
    if a.dirs.is_empty() && a.devs.is_empty() {
        a.dirs = vec![PathBuf::from("/dev/shm"), std::env::temp_dir()];
    }
    a
}

fn cpu_time() -> Duration {
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage fills the struct we pass.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

fn fs_type(dir: &Path) -> String {
    // The longest mount point that contains dir.
    let dir = std::fs::canonicalize(dir).unwrap_or(dir.to_path_buf());
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let mut best = (0, String::from("?"));
    for l in mounts.lines() {
        let f: Vec<&str> = l.split(' ').collect();
        if f.len() > 2 && dir.starts_with(f[1]) && f[1].len() >= best.0 {
            best = (f[1].len(), f[2].to_string());
        }
    }
    best.1
}

/// Fill the file with non-zero data so reads hit real blocks, not holes.
fn prefill(path: &Path, size: u64) {
    let mut f = std::fs::File::create(path).expect("create bench file");
    let chunk: Vec<u8> = (0..1 << 20).map(|i| (i * 7 + 3) as u8).collect();
    let mut left = size;
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        f.write_all(&chunk[..n]).expect("prefill");
        left -= n as u64;
    }
    f.sync_all().expect("sync");
    // Leave no page cache behind: cached pages make nonblocking O_DIRECT attempts fail.
    // SAFETY: plain syscall on an open fd.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
}

/// The device, and whether O_DIRECT and nonblocking I/O are in effect.
fn open(path: &Path, backend: Backend, threads: usize) -> (Arc<dyn BlockDev>, bool, bool) {
    let opts = file::OpenOptions {
        threads,
        ..Default::default()
    };
    let opened = file::open(path, &opts).expect("open bench file");
    let direct = opened.direct;
    let nowait = sbod_core::dev::uring::nowait_io(&opened);
    let name = path.display().to_string();
    let dev: Arc<dyn BlockDev> = match backend {
        Backend::Threads => Arc::new(FileDev::new(name, opened, threads)),
        Backend::Uring => Arc::new(UringDev::new(name, opened).expect("io_uring")),
    };
    (dev, direct, nowait)
}

struct Sample {
    ios: u64,
    secs: f64,
    cpu: Duration,
}

/// Keep `load.qd` requests in flight for `secs`; one submitter thread, completions come
/// back through a channel (as the engine's completions do).
fn run(dev: &Arc<dyn BlockDev>, load: Load, size: u64, secs: f64, seed: u64) -> Sample {
    let blocks = size / load.bs as u64;
    let bufs: Vec<SharedBuf> = (0..load.qd)
        .map(|i| {
            let mut b = AlignedBuf::zeroed(load.bs);
            b.iter_mut()
                .enumerate()
                .for_each(|(j, x)| *x = (i + j) as u8 | 1);
            b.into_shared()
        })
        .collect();
    let (tx, rx) = crossbeam_channel::unbounded::<(usize, std::io::Result<()>)>();
    let mut rng = seed | 1;
    let mut seq = 0u64;
    let mut next_off = |rng: &mut u64| -> u64 {
        if load.random {
            // xorshift64
            *rng ^= *rng << 13;
            *rng ^= *rng >> 7;
            *rng ^= *rng << 17;
            (*rng % blocks) * load.bs as u64
        } else {
            let o = (seq % blocks) * load.bs as u64;
            seq += 1;
            o
        }
    };
    let submit = |slot: usize, off: u64| {
        let buf = bufs[slot].clone();
        let kind = if load.write {
            IoKind::Write { buf, fua: false }
        } else {
            IoKind::Read { buf }
        };
        let tx = tx.clone();
        dev.submit(
            IoReq {
                offset: off,
                kind,
                class: IoClass::Foreground,
            },
            Box::new(move |r| {
                let _ = tx.send((slot, r));
            }),
        );
    };
    let cpu0 = cpu_time();
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs_f64(secs);
    for slot in 0..load.qd {
        submit(slot, next_off(&mut rng));
    }
    let mut ios = 0u64;
    let mut outstanding = load.qd;
    let mut stopping = false;
    while outstanding > 0 {
        let (slot, r) = rx.recv().expect("completion");
        r.expect("bench I/O failed");
        ios += 1;
        outstanding -= 1;
        if !stopping && ios & 63 == 0 && Instant::now() >= deadline {
            stopping = true;
        }
        if !stopping {
            submit(slot, next_off(&mut rng));
            outstanding += 1;
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    Sample {
        ios,
        secs,
        cpu: cpu_time() - cpu0,
    }
}

fn mean_cov(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let m = v.iter().sum::<f64>() / n;
    let var = v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / n;
    (m, if m > 0.0 { var.sqrt() / m * 100.0 } else { 0.0 })
}

fn main() {
    let a = args();
    let loads = [
        Load {
            name: "randread 4K",
            bs: 4096,
            qd: a.qd,
            write: false,
            random: true,
        },
        Load {
            name: "randwrite 4K",
            bs: 4096,
            qd: a.qd,
            write: true,
            random: true,
        },
        Load {
            name: "seqread 1M",
            bs: 1 << 20,
            qd: a.seq_qd,
            write: false,
            random: false,
        },
        Load {
            name: "seqwrite 1M",
            bs: 1 << 20,
            qd: a.seq_qd,
            write: true,
            random: false,
        },
    ];
    let backends = [Backend::Threads, Backend::Uring];
    println!(
        "member queue benchmark: file {} MiB, {} s x {} reps per backend, random QD{}, \
         sequential QD{}, threads backend {} workers; {} CPUs",
        a.size >> 20,
        a.secs,
        a.reps,
        a.qd,
        a.seq_qd,
        a.threads,
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    );
    let targets = a
        .dirs
        .iter()
        .map(|d| (d, false))
        .chain(a.devs.iter().map(|d| (d, true)));
    for (dir, device) in targets {
        // The bench file's directory, removed at the end of this target.
        let mut _tmp = None;
        let path = if device {
            dir.clone()
        } else {
            let tmp = tempfile::Builder::new()
                .prefix("sbod-bench-")
                .tempdir_in(dir)
                .expect("temp dir");
            let p = tmp.path().join("member");
            prefill(&p, a.size);
            _tmp = Some(tmp);
            p
        };
        let (dev0, direct, nowait) = open(&path, Backend::Threads, 1);
        let size = a.size.min(dev0.size());
        dev0.close();
        drop(dev0);
        println!(
            "\n{} ({}): O_DIRECT {}, nonblocking I/O {} (automatic choice: {})",
            dir.display(),
            if device {
                "device".to_string()
            } else {
                fs_type(dir)
            },
            if direct { "in effect" } else { "NOT in effect" },
            if nowait { "yes" } else { "no" },
            if nowait { "uring" } else { "threads" },
        );
        println!(
            "  {:<13} {:<8} {:>10} {:>9} {:>6} {:>11}   {:>11} {:>9}",
            "load", "backend", "IOPS", "MB/s", "COV%", "CPU us/IO", "uring/thr", "CPU ratio"
        );
        for load in loads {
            if !a.only.is_empty() && !a.only.iter().any(|o| load.name.contains(o.as_str())) {
                continue;
            }
            let mut samples: Vec<Vec<Sample>> = backends.iter().map(|_| Vec::new()).collect();
            for rep in 0..a.reps {
                for (bi, &b) in backends.iter().enumerate() {
                    let (dev, _, _) = open(&path, b, a.threads);
                    samples[bi].push(run(&dev, load, size, a.secs, rep as u64 + 7));
                    dev.close();
                }
            }
            let stats: Vec<(f64, f64, f64)> = samples
                .iter()
                .map(|s| {
                    let iops: Vec<f64> = s.iter().map(|x| x.ios as f64 / x.secs).collect();
                    let (m, cov) = mean_cov(&iops);
                    let ios: u64 = s.iter().map(|x| x.ios).sum();
                    let cpu: Duration = s.iter().map(|x| x.cpu).sum();
                    (m, cov, cpu.as_secs_f64() * 1e6 / ios as f64)
                })
                .collect();
            for (bi, b) in backends.iter().enumerate() {
                let (iops, cov, cpu) = stats[bi];
                let ratio = if *b == Backend::Uring {
                    format!("{:>11.2} {:>9.2}", iops / stats[0].0, cpu / stats[0].2)
                } else {
                    String::new()
                };
                println!(
                    "  {:<13} {:<8} {:>10.0} {:>9.1} {:>6.1} {:>11.2}   {}",
                    load.name,
                    format!("{b:?}").to_lowercase(),
                    iops,
                    iops * load.bs as f64 / 1e6,
                    cov,
                    cpu,
                    ratio
                );
            }
        }
    }
}
