//! What an array does to its modelled drives on a sequential stream: one process, N
//! modelled drives over memory, an sbod array on them, a closed loop of 1 MiB requests at a
//! queue depth; then the same drives each alone (BASELINE's pattern: 1 MiB sequential at
//! QD2 a drive). Prints both rates, their ratio and, per member, what the drive was sent:
//! how many commands, their mean size, and how many arrived in LBA order (starting where
//! the previous one ended), ahead of it (a gap) or behind it (a revolution lost with the
//! write cache off).
//!
//!   cargo run --release -p sbod-drive --example array_stream -- \
//!       [LEVEL] [MEMBERS] [write|read] [QD] [SECS] [PROFILE] [MEMBER_MIB]
//!
//! e.g. `array_stream raid6 8 write 16 4 hdd-nearline,wce=off 512`. Before the array is
//! measured its first `WS_MIB` (1024) MiB are written once, as the lab's `--precondition
//! seq` does (the checksums' tag blocks are then cached); `NO_FILL=1` skips that,
//! `NO_CRC=1` creates the array without checksums, `DECL_SPARES=S` makes it declustered
//! (one group, `S` members' worth of distributed spare space), `BASE_ONLY=1` measures BASELINE alone,
//! `TRACE=1` prints every command (member, offset, submitted and completed in µs of
//! CLOCK_MONOTONIC, write or not, length) on stderr. The in-process BASELINE runs 16 client tasks
//! on two threads and falls behind its drives on a busy host (its QD2 leaves no slack):
//! compare the lab's BASELINE (`sbod bench`), or the drives' model, for the ratio.

use parking_lot::Mutex;
use sbod_core::buf::AlignedBuf;
use sbod_core::dev::{self, BlockDev, Done, IoClass, IoKind, IoReq, MemDev};
use sbod_core::{Array, CreateSpec, Level, MemberSpec};
use sbod_drive::{wrap, Spec};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

/// Notes what reaches the drive, in the order it does.
struct Recorder {
    inner: Arc<dyn BlockDev>,
    log: Mutex<Vec<(bool, u64, u64)>>,
    on: std::sync::atomic::AtomicBool,
}

impl BlockDev for Recorder {
    fn submit(&self, req: IoReq, done: Done) {
        if self.on.load(Ordering::Relaxed) {
            let e = match &req.kind {
                IoKind::Read { buf } => Some((false, req.offset, buf.len() as u64)),
                IoKind::Write { buf, .. } => Some((true, req.offset, buf.len() as u64)),
                _ => None,
            };
            if let Some(e) = e {
                self.log.lock().push(e);
            }
        }
        if std::env::var_os("TRACE").is_some() {
            let (t0, off) = (sbod_drive::dev::now_ns(), req.offset);
            let len = match &req.kind {
                IoKind::Read { buf } => buf.len(),
                IoKind::Write { buf, .. } => buf.len(),
                _ => 0,
            };
            let name = self.name().to_string();
            let w = matches!(req.kind, IoKind::Write { .. });
            self.inner.submit(
                req,
                Box::new(move |r| {
                    let t1 = sbod_drive::dev::now_ns();
                    eprintln!(
                        "{name} {off} sub {} done {} {w} {len}",
                        t0 / 1000,
                        t1 / 1000
                    );
                    done(r)
                }),
            );
            return;
        }
        self.inner.submit(req, done)
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn close(&self) {
        self.inner.close()
    }
    fn may_run_out(&self) -> bool {
        false
    }
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let level: Level = a.get(1).map_or("raid6", |s| s).parse().unwrap();
    let n: usize = a.get(2).map_or(8, |s| s.parse().unwrap());
    let write = a.get(3).is_none_or(|s| s == "write");
    let qd: usize = a.get(4).map_or(16, |s| s.parse().unwrap());
    let secs: f64 = a.get(5).map_or(4.0, |s| s.parse().unwrap());
    let profile = a.get(6).cloned().unwrap_or("hdd-nearline,wce=off".into());
    let size = a.get(7).map_or(256, |s| s.parse::<u64>().unwrap()) * MIB;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let spec = Spec::parse(&format!("model:{profile}:/tmp/array_stream")).unwrap();
    let recs: Vec<Arc<Recorder>> = (0..n)
        .map(|i| {
            let name = format!("d{i}");
            let inner: Arc<dyn BlockDev> = Arc::new(MemDev::new(name.clone(), size));
            Arc::new(Recorder {
                inner: wrap(name, &spec, inner).unwrap(),
                log: Mutex::new(Vec::new()),
                on: false.into(),
            })
        })
        .collect();
    let bs = MIB as usize;

    // BASELINE: each drive alone, 1 MiB sequential at QD2, from its start.
    let base = rt.block_on(async {
        let bytes = Arc::new(AtomicU64::new(0));
        let t0 = Instant::now();
        let dl = t0 + Duration::from_secs_f64(secs / 2.0);
        let mut tasks = Vec::new();
        for r in &recs {
            for q in 0..2u64 {
                let d: Arc<dyn BlockDev> = r.clone();
                let bytes = bytes.clone();
                tasks.push(tokio::spawn(async move {
                    let mut off = q * MIB;
                    while Instant::now() < dl {
                        let b = AlignedBuf::zeroed(bs).into_shared();
                        if write {
                            dev::write_at(&d, off, b, false, IoClass::Foreground)
                                .await
                                .unwrap();
                        } else {
                            dev::read_at(&d, off, b, IoClass::Foreground).await.unwrap();
                        }
                        bytes.fetch_add(MIB, Ordering::Relaxed);
                        off += 2 * MIB;
                    }
                }));
            }
        }
        for t in tasks {
            t.await.unwrap();
        }
        bytes.load(Ordering::Relaxed) as f64 / t0.elapsed().as_secs_f64() / 1e6
    });

    if std::env::var_os("BASE_ONLY").is_some() {
        println!("BASELINE {base:.0} MB/s over {n} drives");
        return;
    }
    let members: Vec<MemberSpec> = recs
        .iter()
        .map(|r| MemberSpec {
            dev: r.clone(),
            path: r.name().to_string(),
            is_file: false,
            domain: String::new(),
        })
        .collect();
    // `DECL_SPARES=S`: the declustered layout, one group over every member with `S`
    // members' worth of distributed spare space (`sbod create --declustered --spares S`).
    let decl_spares: Option<usize> = std::env::var("DECL_SPARES")
        .ok()
        .map(|v| v.parse().unwrap());
    let mb = rt.block_on(async {
        let arr = Arc::new(
            Array::create(
                CreateSpec {
                    name: "stream".into(),
                    level,
                    chunk: 64 * 1024,
                    groups: 1,
                    spares: decl_spares.unwrap_or(0),
                    declustered: decl_spares.is_some(),
                    copies: 2,
                    bitmap_region: Some(128 * MIB),
                    assume_clean: true,
                    integrity: if std::env::var_os("NO_CRC").is_some() {
                        sbod_core::integrity::Kind::None
                    } else {
                        sbod_core::integrity::Kind::Crc32c
                    },
                    force: false,
                },
                members,
            )
            .await
            .unwrap(),
        );
        let ws: u64 = std::env::var("WS_MIB")
            .ok()
            .map_or(1024, |v| v.parse().unwrap())
            * MIB;
        let vol = arr.size().min(ws);
        if std::env::var_os("NO_FILL").is_none() {
            // The lab's precondition: the working set written once, sequentially.
            let next = Arc::new(AtomicU64::new(0));
            let mut tasks = Vec::new();
            for _ in 0..qd {
                let (arr, next) = (arr.clone(), next.clone());
                tasks.push(tokio::spawn(async move {
                    loop {
                        let off = next.fetch_add(MIB, Ordering::Relaxed);
                        if off + MIB > vol {
                            break;
                        }
                        arr.write(off, AlignedBuf::zeroed(bs), false).await.unwrap();
                    }
                }));
            }
            for t in tasks {
                t.await.unwrap();
            }
        }
        for r in &recs {
            r.on.store(true, Ordering::Relaxed);
        }
        let next = Arc::new(AtomicU64::new(0));
        let bytes = Arc::new(AtomicU64::new(0));
        let t0 = Instant::now();
        let dl = t0 + Duration::from_secs_f64(secs);
        let trace = std::env::var_os("TRACE").is_some();
        if trace {
            eprintln!("STREAM from {}", sbod_drive::dev::now_ns() / 1000);
        }
        let mut tasks = Vec::new();
        for _ in 0..qd {
            let arr = arr.clone();
            let next = next.clone();
            let bytes = bytes.clone();
            tasks.push(tokio::spawn(async move {
                while Instant::now() < dl {
                    let off = next.fetch_add(MIB, Ordering::Relaxed) % (vol / MIB * MIB);
                    if write {
                        arr.write(off, AlignedBuf::zeroed(bs), false).await.unwrap();
                    } else {
                        arr.read(off, bs).await.unwrap();
                    }
                    bytes.fetch_add(MIB, Ordering::Relaxed);
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let mb = bytes.load(Ordering::Relaxed) as f64 / t0.elapsed().as_secs_f64() / 1e6;
        if trace {
            eprintln!("STREAM to {}", sbod_drive::dev::now_ns() / 1000);
        }
        // A FLUSH after the stream: the checksums' tag blocks it changed are written back.
        let t = Instant::now();
        arr.flush().await.unwrap();
        println!(
            "FLUSH after the stream: {:.0} ms",
            t.elapsed().as_secs_f64() * 1e3
        );
        for r in &recs {
            r.on.store(false, Ordering::Relaxed);
        }
        arr.close().await.unwrap();
        mb
    });
    println!(
        "{level} of {n}, 1 MiB sequential {} at QD{qd}, {profile}: BASELINE {base:.0} MB/s, array {mb:.0} MB/s, ratio {:.2}",
        if write { "write" } else { "read" },
        mb / base
    );
    for r in &recs {
        let log = r.log.lock();
        let (mut rd, mut wr, mut bytes, mut inorder, mut ahead, mut behind) = (0, 0, 0u64, 0, 0, 0);
        let mut end: Option<u64> = None;
        for &(w, off, len) in log.iter() {
            if w {
                wr += 1
            } else {
                rd += 1
            }
            bytes += len;
            match end {
                Some(e) if off == e => inorder += 1,
                Some(e) if off > e => ahead += 1,
                Some(_) => behind += 1,
                None => {}
            }
            end = Some(off + len);
        }
        let cmds = (rd + wr).max(1);
        println!(
            "  {}: {rd} reads, {wr} writes, mean {} KiB; in order {inorder}, ahead {ahead}, behind {behind}",
            r.name(),
            bytes / cmds / 1024,
        );
    }
}
