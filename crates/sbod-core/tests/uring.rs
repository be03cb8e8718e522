//! Member queues on real files: the io_uring queue (and the worker-thread queue, held to the
//! same model) against a plain in-memory model, many requests in flight, FUA, short files,
//! shutdown with requests in flight, and the whole array engine on io_uring members.
//!
//! io_uring may be unavailable (sysctl kernel.io_uring_disabled, seccomp in CI containers):
//! then the io_uring half of each test says so and checks the threads half only.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sbod_core::buf::SharedBuf;
use sbod_core::dev::{
    self, file, Backend, BlockDev, Done, FileDev, InlineDev, IoClass, IoKind, IoReq, UringDev,
};
use sbod_core::{AlignedBuf, Array, AssembleOptions, CreateSpec, Level, MemberSpec};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

const BLOCK: usize = 4096;
/// A request that has not completed after this long is a hang.
const HANG: Duration = Duration::from_secs(60);

fn backends() -> Vec<Backend> {
    match sbod_core::dev::uring::available() {
        Ok(()) => vec![Backend::Uring, Backend::Threads, Backend::Inline],
        Err(e) => {
            eprintln!("io_uring not usable here ({e}): testing the threads and inline backends");
            vec![Backend::Threads, Backend::Inline]
        }
    }
}

fn make_file(dir: &Path, name: &str, size: u64) -> PathBuf {
    let p = dir.join(name);
    let f = std::fs::File::create(&p).unwrap();
    f.set_len(size).unwrap();
    p
}

fn open(path: &Path, backend: Backend) -> Arc<dyn BlockDev> {
    let opts = file::OpenOptions::default();
    let opened = file::open(path, &opts).unwrap();
    let name = path.display().to_string();
    match backend {
        Backend::Uring => Arc::new(UringDev::new(name, opened).unwrap()),
        Backend::Threads => Arc::new(FileDev::new(name, opened, opts.threads)),
        Backend::Inline => Arc::new(InlineDev::new(name, opened)),
    }
}

/// How a request ended, as seen by its callback.
#[derive(Debug)]
enum End {
    Done(io::Result<()>),
    /// The callback was dropped without being called: a lost completion.
    Dropped,
}

/// A callback that reports `(id, End)` exactly as it is used.
struct Tracker {
    id: usize,
    tx: Option<mpsc::Sender<(usize, End)>>,
}

impl Drop for Tracker {
    fn drop(&mut self) {
        if let Some(tx) = self.tx.take() {
            let _ = tx.send((self.id, End::Dropped));
        }
    }
}

fn tracked(id: usize, tx: &mpsc::Sender<(usize, End)>) -> Done {
    let mut t = Tracker {
        id,
        tx: Some(tx.clone()),
    };
    Box::new(move |r| {
        let tx = t.tx.take().unwrap();
        let _ = tx.send((t.id, End::Done(r)));
    })
}

/// Wait for `n` completions; every id must end exactly once and no callback be dropped.
fn collect(rx: &mpsc::Receiver<(usize, End)>, n: usize) -> Vec<io::Result<()>> {
    let mut out: Vec<Option<io::Result<()>>> = (0..n).map(|_| None).collect();
    for _ in 0..n {
        let (id, end) = rx.recv_timeout(HANG).expect("a request never completed");
        match end {
            End::Done(r) => {
                assert!(out[id].is_none(), "request {id} completed twice");
                out[id] = Some(r);
            }
            End::Dropped => panic!("request {id} was dropped without completing"),
        }
    }
    if let Ok((id, end)) = rx.try_recv() {
        panic!("request {id} reported again: {end:?}");
    }
    out.into_iter().map(|r| r.unwrap()).collect()
}

/// After close: nothing more arrives (a second completion, or a late drop).
fn quiet(rx: &mpsc::Receiver<(usize, End)>) {
    if let Ok((id, end)) = rx.recv_timeout(Duration::from_millis(20)) {
        panic!("request {id} reported after close: {end:?}");
    }
}

fn buf_with(data: &[u8]) -> SharedBuf {
    AlignedBuf::from_slice(data).into_shared()
}

fn req(offset: u64, kind: IoKind) -> IoReq {
    IoReq {
        offset,
        kind,
        class: IoClass::Foreground,
    }
}

/// Random rounds of concurrent requests over disjoint block ranges, checked against a model.
fn random_rounds(backend: Backend, seed: u64) {
    let dir = tempfile::tempdir().unwrap();
    let blocks = 512usize;
    let path = make_file(dir.path(), "m", (blocks * BLOCK) as u64);
    let d = open(&path, backend);
    let mut rng = StdRng::seed_from_u64(seed);
    let mut model = vec![0u8; blocks * BLOCK];
    let (tx, rx) = mpsc::channel();
    for round in 0..12 {
        // Carve the file into random disjoint extents; each gets one request.
        let mut extents = Vec::new();
        let mut b = 0;
        while b < blocks {
            let n = rng.random_range(1..=24).min(blocks - b);
            if rng.random_bool(0.7) {
                extents.push((b, n));
            }
            b += n;
        }
        let mut reads = Vec::new();
        let mut after = model.clone();
        for (id, &(b, n)) in extents.iter().enumerate() {
            let off = (b * BLOCK) as u64;
            let range = b * BLOCK..(b + n) * BLOCK;
            let kind = match rng.random_range(0..10) {
                0..=3 => {
                    let buf = buf_with(&vec![0u8; n * BLOCK]);
                    reads.push((id, range.clone(), buf.clone()));
                    IoKind::Read { buf }
                }
                4..=7 => {
                    let mut data = vec![0u8; n * BLOCK];
                    rng.fill(&mut data[..]);
                    after[range].copy_from_slice(&data);
                    IoKind::Write {
                        buf: buf_with(&data),
                        fua: rng.random_bool(0.3),
                    }
                }
                8 => {
                    after[range].fill(0);
                    IoKind::Zero {
                        len: (n * BLOCK) as u64,
                        punch: rng.random_bool(0.5),
                    }
                }
                _ => IoKind::Flush,
            };
            d.submit(req(off, kind), tracked(id, &tx));
        }
        for (id, r) in collect(&rx, extents.len()).into_iter().enumerate() {
            r.unwrap_or_else(|e| panic!("{backend:?} seed {seed} round {round} req {id}: {e}"));
        }
        for (id, range, buf) in reads {
            // SAFETY: the read completed; nothing else uses the buffer.
            let got = unsafe { buf.as_slice() };
            assert!(
                got == &model[range.clone()],
                "{backend:?} seed {seed} round {round}: read {id} of {range:?} differs"
            );
        }
        model = after;
    }
    d.close();
    drop(d);
    quiet(&rx);
    // What the queue wrote is what a plain read of the file sees.
    assert!(std::fs::read(&path).unwrap() == model, "file differs");
}

#[test]
fn random_requests_match_model() {
    for backend in backends() {
        for seed in 0..4 {
            random_rounds(backend, seed);
        }
    }
}

/// Hundreds of requests in flight from several threads (more than the queue depth), then
/// read back the same way.
/// `N` writes from 4 threads at once, then `N` reads, each of class `class(i)` (writes)
/// and `class(i + 1)` (reads): each completes once, writes land, reads return them.
fn in_flight_round(backend: Backend, class: &(dyn Fn(usize) -> IoClass + Sync)) {
    const N: usize = 1200;
    let dir = tempfile::tempdir().unwrap();
    let path = make_file(dir.path(), "m", (N * BLOCK) as u64);
    let d = open(&path, backend);
    let fill = |i: usize| -> Vec<u8> { vec![(i * 7 + 1) as u8; BLOCK] };
    let (tx, rx) = mpsc::channel();
    std::thread::scope(|s| {
        for t in 0..4 {
            let (d, tx) = (d.clone(), tx.clone());
            s.spawn(move || {
                for i in (t..N).step_by(4) {
                    let kind = IoKind::Write {
                        buf: buf_with(&fill(i)),
                        fua: i % 10 == 0,
                    };
                    let r = IoReq {
                        offset: (i * BLOCK) as u64,
                        kind,
                        class: class(i),
                    };
                    d.submit(r, tracked(i, &tx));
                }
            });
        }
    });
    assert!(collect(&rx, N).iter().all(|r| r.is_ok()), "{backend:?}");
    let bufs: Vec<SharedBuf> = (0..N).map(|_| buf_with(&[0u8; BLOCK])).collect();
    for (i, b) in bufs.iter().enumerate() {
        let r = IoReq {
            offset: (i * BLOCK) as u64,
            kind: IoKind::Read { buf: b.clone() },
            class: class(i + 1),
        };
        d.submit(r, tracked(i, &tx));
    }
    assert!(collect(&rx, N).iter().all(|r| r.is_ok()), "{backend:?}");
    for (i, b) in bufs.iter().enumerate() {
        // SAFETY: the read completed.
        assert!(
            unsafe { b.as_slice() } == &fill(i)[..],
            "{backend:?} block {i}"
        );
    }
    d.close();
    quiet(&rx);
}

#[test]
fn hundreds_in_flight() {
    for backend in backends() {
        in_flight_round(backend, &|_| IoClass::Foreground);
    }
}

/// Urgent requests (the ownership heartbeat's class) among hundreds in flight, with more
/// queued than the io_uring queue holds: each completes once, whichever queue or priority
/// it took.
#[test]
fn urgent_requests_among_hundreds_in_flight() {
    for backend in backends() {
        in_flight_round(backend, &|i| {
            if i.is_multiple_of(9) {
                IoClass::Urgent
            } else {
                IoClass::Foreground
            }
        });
    }
}

/// An urgent request the kernel refuses as invalid (EINVAL: here an offset past what a
/// file position holds) gets its error, and the member keeps asking for real-time priority:
/// only a second try that the kernel accepts without it says the priority was refused.
#[test]
fn an_invalid_urgent_request_keeps_the_priority() {
    if let Err(e) = sbod_core::dev::uring::available() {
        eprintln!("io_uring not usable here ({e}): nothing to test");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = make_file(dir.path(), "m", 1 << 20);
    let opened = file::open(&path, &file::OpenOptions::default()).unwrap();
    let d = UringDev::new(path.display().to_string(), opened).unwrap();
    let (tx, rx) = mpsc::channel();
    let urgent = |offset| IoReq {
        offset,
        kind: IoKind::Read {
            buf: buf_with(&[0u8; BLOCK]),
        },
        class: IoClass::Urgent,
    };
    d.submit(urgent(0), tracked(0, &tx));
    collect(&rx, 1).pop().unwrap().unwrap();
    // Without CAP_SYS_NICE the kernel refused the priority (EPERM) for good already.
    let rt = d.real_time_priority();
    if !rt {
        eprintln!(
            "real-time I/O priority refused here (no CAP_SYS_NICE): only the error is checked"
        );
    }
    d.submit(urgent(1 << 63), tracked(0, &tx));
    let e = collect(&rx, 1)
        .pop()
        .unwrap()
        .expect_err("a read at a negative position");
    assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{e}");
    assert_eq!(
        d.real_time_priority(),
        rt,
        "an invalid request turned the priority off"
    );
    d.submit(urgent(BLOCK as u64), tracked(0, &tx));
    collect(&rx, 1).pop().unwrap().unwrap();
    d.close();
}

/// Large requests (several MiB) and FUA writes land where a plain read sees them.
#[test]
fn large_and_fua_writes() {
    for backend in backends() {
        let dir = tempfile::tempdir().unwrap();
        let size = 16 << 20;
        let path = make_file(dir.path(), "m", size as u64);
        let d = open(&path, backend);
        let data: Vec<u8> = (0..size).map(|i| (i * 13 / 4096) as u8).collect();
        let (tx, rx) = mpsc::channel();
        // Two 8 MiB writes, one FUA, then a flush.
        for (id, half) in [0usize, 1].into_iter().enumerate() {
            let r = half * size / 2..(half + 1) * size / 2;
            let kind = IoKind::Write {
                buf: buf_with(&data[r.clone()]),
                fua: half == 1,
            };
            d.submit(req(r.start as u64, kind), tracked(id, &tx));
        }
        assert!(collect(&rx, 2).iter().all(|r| r.is_ok()));
        d.submit(req(0, IoKind::Flush), tracked(0, &tx));
        collect(&rx, 1).pop().unwrap().unwrap();
        assert!(std::fs::read(&path).unwrap() == data, "{backend:?}");
        let back = buf_with(&vec![0u8; size]);
        d.submit(req(0, IoKind::Read { buf: back.clone() }), tracked(0, &tx));
        collect(&rx, 1).pop().unwrap().unwrap();
        // SAFETY: the read completed.
        assert!(unsafe { back.as_slice() } == &data[..], "{backend:?}");
        d.close();
        quiet(&rx);
    }
}

/// Reads that run past the end of a short member fail (after the part that exists was
/// read: the io_uring queue resubmits the remainder of a short read and then sees EOF).
#[test]
fn short_file_reads_fail_past_the_end() {
    for backend in backends() {
        let dir = tempfile::tempdir().unwrap();
        let path = make_file(dir.path(), "m", 3 * BLOCK as u64);
        let d = open(&path, backend);
        assert_eq!(d.size(), 3 * BLOCK as u64);
        let (tx, rx) = mpsc::channel();
        let cases = [
            (0u64, 3 * BLOCK, true),
            (2 * BLOCK as u64, BLOCK, true),
            (2 * BLOCK as u64, 2 * BLOCK, false),
            (3 * BLOCK as u64, BLOCK, false),
            (64 * BLOCK as u64, BLOCK, false),
        ];
        for (id, &(off, len, _)) in cases.iter().enumerate() {
            let kind = IoKind::Read {
                buf: buf_with(&vec![0u8; len]),
            };
            d.submit(req(off, kind), tracked(id, &tx));
        }
        for (r, &(off, len, ok)) in collect(&rx, cases.len()).iter().zip(&cases) {
            assert_eq!(r.is_ok(), ok, "{backend:?}: read {len} at {off}: {r:?}");
        }
        // Zero-length requests complete at once.
        d.submit(req(0, IoKind::Read { buf: buf_with(&[]) }), tracked(0, &tx));
        collect(&rx, 1).pop().unwrap().unwrap();
        d.close();
        quiet(&rx);
    }
}

/// Requests queued together that are contiguous on the member are merged into one
/// vectored I/O (`UringDev::merged` counts them); each keeps its own buffer and outcome,
/// also when the merged I/O runs past the member's end (then each is issued again alone:
/// the ones inside succeed, the others fail).
#[test]
fn contiguous_requests_merge_and_keep_their_outcomes() {
    if sbod_core::dev::uring::available().is_err() {
        eprintln!("io_uring not usable here: nothing to test");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let blocks = 256usize;
    let path = make_file(dir.path(), "m", (blocks * BLOCK) as u64);
    let opened = file::open(&path, &file::OpenOptions::default()).unwrap();
    let d = Arc::new(UringDev::new("m".into(), opened).unwrap());
    let dev: Arc<dyn BlockDev> = d.clone();
    let (tx, rx) = mpsc::channel();
    let mut rng = StdRng::seed_from_u64(7);
    // Bursts until some merged (the ring thread takes what waits when it wakes: on an
    // idle machine a burst of 64 requests always leaves some waiting together).
    for round in 0..200 {
        // Contiguous writes of 1-4 blocks in ascending or descending order, FUA or not.
        let mut runs = Vec::new();
        let mut at = 0usize;
        while at < blocks {
            let n = rng.random_range(1..=4).min(blocks - at);
            runs.push((at, n, rng.random::<u8>()));
            at += n;
        }
        if round % 2 == 1 {
            runs.reverse();
        }
        let fua = round % 3 == 0;
        for (id, &(at, n, seed)) in runs.iter().enumerate() {
            let buf = buf_with(&pattern(n * BLOCK, seed));
            let kind = IoKind::Write { buf, fua };
            dev.submit(req((at * BLOCK) as u64, kind), tracked(id, &tx));
        }
        for r in collect(&rx, runs.len()) {
            r.unwrap();
        }
        // Read back in other pieces, reaching past the end.
        let mut reads = Vec::new();
        let mut at = 0usize;
        while at < blocks + 8 {
            let n = rng.random_range(1..=8);
            reads.push((at, n, buf_with(&vec![0u8; n * BLOCK])));
            at += n;
        }
        for (id, (at, _, buf)) in reads.iter().enumerate() {
            let kind = IoKind::Read { buf: buf.clone() };
            dev.submit(req((*at * BLOCK) as u64, kind), tracked(id, &tx));
        }
        let mut want = vec![0u8; blocks * BLOCK];
        for &(at, n, seed) in &runs {
            want[at * BLOCK..(at + n) * BLOCK].copy_from_slice(&pattern(n * BLOCK, seed));
        }
        for (r, (at, n, buf)) in collect(&rx, reads.len()).into_iter().zip(&reads) {
            if at + n <= blocks {
                r.unwrap();
                // SAFETY: the read completed; nothing else uses the buffer.
                let got = unsafe { buf.as_slice() };
                assert!(
                    got == &want[at * BLOCK..(at + n) * BLOCK],
                    "round {round}: read of {n} blocks at {at} differs"
                );
            } else {
                assert!(
                    r.is_err(),
                    "round {round}: read of {n} blocks at {at} past the end"
                );
            }
        }
        if d.merged() > 0 && round >= 3 {
            break;
        }
    }
    assert!(d.merged() > 0, "no request was ever merged");
    eprintln!("{} requests merged", d.merged());
    dev.close();
    quiet(&rx);
}

/// Under a plug (`dev::plug`) an idle io_uring member's thread is not woken per request:
/// the requests wait together until the plug is released, then go as merged I/Os, each
/// with its own outcome. Nested plugs release at the outermost.
#[test]
fn a_plug_batches_requests_for_one_wake_up() {
    if sbod_core::dev::uring::available().is_err() {
        eprintln!("io_uring not usable here: nothing to test");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let blocks = 64usize;
    let path = make_file(dir.path(), "m", (blocks * BLOCK) as u64);
    let opened = file::open(&path, &file::OpenOptions::default()).unwrap();
    let d = Arc::new(UringDev::new("m".into(), opened).unwrap());
    let dev: Arc<dyn BlockDev> = d.clone();
    let (tx, rx) = mpsc::channel();
    // Let the ring thread go to sleep.
    std::thread::sleep(Duration::from_millis(50));
    let before = d.merged();
    {
        let _outer = dev::plug::hold();
        let _inner = dev::plug::hold();
        for i in 0..blocks {
            let buf = buf_with(&pattern(BLOCK, i as u8));
            let kind = IoKind::Write { buf, fua: false };
            dev.submit(req((i * BLOCK) as u64, kind), tracked(i, &tx));
        }
        // Nothing woke the sleeping ring thread: nothing is done while the plug is held.
        std::thread::sleep(Duration::from_millis(30));
        assert!(rx.try_recv().is_err(), "a request completed under the plug");
    }
    for r in collect(&rx, blocks) {
        r.unwrap();
    }
    let merged = d.merged() - before;
    assert!(
        merged >= (blocks / 2) as u64,
        "only {merged} of {blocks} plugged neighbours merged"
    );
    let buf = buf_with(&vec![0u8; blocks * BLOCK]);
    dev.submit(req(0, IoKind::Read { buf: buf.clone() }), tracked(0, &tx));
    collect(&rx, 1).pop().unwrap().unwrap();
    // SAFETY: the read completed; nothing else uses the buffer.
    let got = unsafe { buf.as_slice() };
    for i in 0..blocks {
        assert!(
            got[i * BLOCK..(i + 1) * BLOCK] == pattern(BLOCK, i as u8)[..],
            "block {i}"
        );
    }
    dev.close();
    quiet(&rx);
}

/// A member file truncated while open: every queue reports the size it has now (and the
/// size it was opened with), and stops answering once closed.
#[test]
fn current_size_follows_a_truncation() {
    for backend in backends() {
        let dir = tempfile::tempdir().unwrap();
        let path = make_file(dir.path(), "m", 64 * BLOCK as u64);
        let d = open(&path, backend);
        assert_eq!(d.current_size().unwrap(), 64 * BLOCK as u64);
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(8 * BLOCK as u64)
            .unwrap();
        assert_eq!(d.size(), 64 * BLOCK as u64, "{backend:?}");
        assert_eq!(d.current_size().unwrap(), 8 * BLOCK as u64, "{backend:?}");
        d.close();
        assert!(d.current_size().is_err(), "{backend:?}: size after close");
    }
}

/// A file that is not a multiple of the block size: the read of its tail comes back short;
/// the queue asks again for the rest and reports EOF instead of a half-filled buffer.
#[test]
fn partial_tail_block_is_an_error() {
    for backend in backends() {
        let dir = tempfile::tempdir().unwrap();
        let path = make_file(dir.path(), "m", 2 * BLOCK as u64 + 100);
        let d = open(&path, backend);
        let (tx, rx) = mpsc::channel();
        let kind = IoKind::Read {
            buf: buf_with(&[0u8; BLOCK]),
        };
        d.submit(req(2 * BLOCK as u64, kind), tracked(0, &tx));
        let r = collect(&rx, 1).pop().unwrap();
        assert!(r.is_err(), "{backend:?}: {r:?}");
        d.close();
    }
}

/// close() while hundreds of requests are queued or in flight and more keep arriving from
/// other threads: every request completes exactly once (done or "closed"), close returns,
/// and requests after close fail at once.
#[test]
fn close_with_requests_in_flight() {
    for backend in backends() {
        for round in 0..3 {
            let dir = tempfile::tempdir().unwrap();
            let blocks = 256;
            let path = make_file(dir.path(), "m", (blocks * BLOCK) as u64);
            let d = open(&path, backend);
            let (tx, rx) = mpsc::channel();
            let next = AtomicUsize::new(0);
            const PER_THREAD: usize = 600;
            std::thread::scope(|s| {
                for t in 0..3 {
                    let (d, tx, next) = (d.clone(), tx.clone(), &next);
                    s.spawn(move || {
                        for i in 0..PER_THREAD {
                            let id = next.fetch_add(1, Ordering::Relaxed);
                            let off = (((i * 3 + t) % blocks) * BLOCK) as u64;
                            let kind = match i % 3 {
                                0 => IoKind::Read {
                                    buf: buf_with(&[0u8; BLOCK]),
                                },
                                1 => IoKind::Write {
                                    buf: buf_with(&[t as u8; BLOCK]),
                                    fua: i % 2 == 0,
                                },
                                _ if i % 9 == 2 => IoKind::Flush,
                                _ => IoKind::Zero {
                                    len: BLOCK as u64,
                                    punch: false,
                                },
                            };
                            d.submit(req(off, kind), tracked(id, &tx));
                        }
                    });
                }
                // Close somewhere in the middle of the submissions.
                std::thread::sleep(Duration::from_micros(200 * round));
                d.close();
            });
            let results = collect(&rx, 3 * PER_THREAD);
            let failed = results.iter().filter(|r| r.is_err()).count();
            eprintln!(
                "{backend:?} round {round}: {failed} of {} refused",
                results.len()
            );
            d.submit(req(0, IoKind::Flush), tracked(0, &tx));
            let r = collect(&rx, 1).pop().unwrap();
            assert!(r.is_err(), "{backend:?}: a request after close succeeded");
            d.close();
            drop(d);
            quiet(&rx);
        }
    }
}

/// A completion callback that closes (and drops the last handle of) its own device must
/// not deadlock the member's I/O thread.
#[test]
fn close_and_drop_from_a_callback() {
    for backend in backends() {
        for zero in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let path = make_file(dir.path(), "m", 16 * BLOCK as u64);
            let d = open(&path, backend);
            let (tx, rx) = mpsc::channel();
            let slot = Arc::new(Mutex::new(Some(d.clone())));
            let held = slot.clone();
            let tx2 = tx.clone();
            let kind = if zero {
                IoKind::Zero {
                    len: BLOCK as u64,
                    punch: true,
                }
            } else {
                IoKind::Flush
            };
            d.submit(
                req(0, kind),
                Box::new(move |r| {
                    let dev = held.lock().unwrap().take().unwrap();
                    dev.close();
                    drop(dev); // the last handle: dropped on the I/O thread
                    let _ = tx2.send((0, End::Done(r)));
                }),
            );
            drop(d);
            collect(&rx, 1).pop().unwrap().unwrap();
            assert!(slot.lock().unwrap().is_none());
            // The member is released: it opens again (exclusively).
            let mut again = None;
            for _ in 0..200 {
                match file::open(&path, &file::OpenOptions::default()) {
                    Ok(o) => {
                        again = Some(o);
                        break;
                    }
                    // Closing from its own thread cannot wait: the thread winds down just after.
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
            assert!(
                again.is_some(),
                "{backend:?}: member still held after close"
            );
        }
    }
}

/// `open_member` picks the queue: inline for members in memory (tmpfs: a page copy costs
/// less than a hand-off to another thread); else threads when asked, when the file is not
/// O_DIRECT, or where the file system has no nonblocking I/O (io_uring would punt every
/// request to its kernel workers); io_uring otherwise, when the kernel allows it. (Skipped
/// under SBOD_IO, which overrides the choice.)
#[test]
fn open_member_selects_a_backend() {
    if std::env::var_os(dev::BACKEND_ENV).is_some_and(|v| !v.is_empty()) {
        eprintln!(
            "{} is set: the automatic choice is not in use",
            dev::BACKEND_ENV
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = make_file(dir.path(), "m", 8 * BLOCK as u64);
    let queue = |opts: &file::OpenOptions| {
        let d = dev::open_member(&path, opts).unwrap();
        assert_eq!(d.size(), 8 * BLOCK as u64);
        assert_eq!(d.name(), path.display().to_string());
        let q = d.queue();
        // Exclusive: a second open of the same file is refused while the first is open.
        assert!(dev::open_member(&path, opts).is_err());
        d.close();
        q
    };
    // The temporary directory may itself be on tmpfs.
    let memory = is_tmpfs(dir.path());
    let no_uring = file::OpenOptions {
        uring: false,
        ..Default::default()
    };
    let threads = if memory { "inline" } else { "threads" };
    assert_eq!(queue(&no_uring), threads);
    let buffered = file::OpenOptions {
        direct: false,
        ..Default::default()
    };
    assert_eq!(queue(&buffered), threads);
    let opened = file::open(&path, &file::OpenOptions::default()).unwrap();
    let expect = if memory {
        "inline"
    } else if !opened.direct || !dev::uring::nowait_io(&opened) || dev::uring::available().is_err()
    {
        "threads"
    } else {
        "uring"
    };
    drop(opened);
    assert_eq!(queue(&file::OpenOptions::default()), expect);
    eprintln!("{}: {expect}", dir.path().display());

    // tmpfs has no nonblocking I/O (on kernels that give it O_DIRECT at all), and is
    // memory: its members do their I/O on the submitting thread. Closing releases the file.
    let shm = Path::new("/dev/shm");
    if is_tmpfs(shm) {
        let dir = tempfile::tempdir_in(shm).unwrap();
        let path = make_file(dir.path(), "m", 8 * BLOCK as u64);
        let opened = file::open(&path, &file::OpenOptions::default()).unwrap();
        assert!(!dev::uring::nowait_io(&opened), "tmpfs claims RWF_NOWAIT");
        assert!(file::in_memory(&opened));
        let d = dev::attach_member("shm".into(), opened, &file::OpenOptions::default()).unwrap();
        assert_eq!(d.queue(), "inline");
        assert!(file::open(&path, &file::OpenOptions::default()).is_err());
        d.close();
        assert!(file::open(&path, &file::OpenOptions::default()).is_ok());
        let (tx, rx) = mpsc::channel();
        d.submit(req(0, IoKind::Flush), tracked(0, &tx));
        assert!(collect(&rx, 1).pop().unwrap().is_err(), "I/O after close");
    }
}

fn is_tmpfs(p: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(p.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: statfs fills the zeroed struct we pass; c is a valid C string.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    unsafe { libc::statfs(c.as_ptr(), &mut st) == 0 && st.f_type == libc::TMPFS_MAGIC }
}

// ---- the engine on file members ----

fn member_specs(paths: &[PathBuf], backend: Backend) -> Vec<MemberSpec> {
    paths
        .iter()
        .map(|p| MemberSpec {
            dev: open(p, backend),
            path: p.display().to_string(),
            is_file: true,
            domain: String::new(),
        })
        .collect()
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| ((i * 31 + i / 4096) as u8).wrapping_add(seed))
        .collect()
}

async fn wait_optimal(a: &Array) {
    for _ in 0..3000 {
        if a.status().state == "optimal" {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("never optimal: {:?}", a.status());
}

/// raid6 over six files: write, read, fail a member, write degraded, replace and rebuild,
/// lose two more and read everything back; then reassemble from the files. The backends
/// run side by side (the engine's rebuild start can take seconds).
#[test]
fn raid6_on_file_members() {
    let runs: Vec<_> = backends()
        .into_iter()
        .map(|b| std::thread::spawn(move || raid6_run(b)))
        .collect();
    for r in runs {
        r.join().unwrap();
    }
}

fn raid6_run(backend: Backend) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    {
        let dir = tempfile::tempdir().unwrap();
        let chunk = 16384u32;
        let member_size = (1 << 20) + 64 * chunk as u64;
        let paths: Vec<PathBuf> = (0..7)
            .map(|i| make_file(dir.path(), &format!("d{i}"), member_size))
            .collect();
        rt.block_on(async {
            let spec = CreateSpec {
                name: "u".into(),
                level: Level::Raid6,
                chunk,
                groups: 1,
                spares: 0,
                declustered: false,
                copies: 2,
                bitmap_region: None,
                assume_clean: true,
                integrity: sbod_core::integrity::Kind::Crc32c,
                force: false,
            };
            let a = Array::create(spec, member_specs(&paths[..6], backend))
                .await
                .expect("create");
            let size = a.size() as usize;
            let mut model = pattern(size, 1);
            a.write(0, AlignedBuf::from_slice(&model), false)
                .await
                .unwrap();
            assert!(a.read(0, size).await.unwrap()[..] == model[..]);
            // Many small concurrent writes and reads (the queues take them all at once).
            let a2 = a.clone();
            let writes = (0..64).map(|i| {
                let a = a2.clone();
                let off = (i * 7 % (size / BLOCK)) * BLOCK;
                let data = pattern(BLOCK, i as u8 + 2);
                async move {
                    a.write(off as u64, AlignedBuf::from_slice(&data), i % 4 == 0)
                        .await
                }
            });
            for (i, r) in futures::future::join_all(writes)
                .await
                .into_iter()
                .enumerate()
            {
                r.unwrap();
                let off = (i * 7 % (size / BLOCK)) * BLOCK;
                model[off..off + BLOCK].copy_from_slice(&pattern(BLOCK, i as u8 + 2));
            }
            a.flush().await.unwrap();
            let p = |i: usize| paths[i].display().to_string();
            a.fail(&p(2), false).await.unwrap();
            assert_eq!(a.status().state, "degraded");
            assert!(a.read(0, size).await.unwrap()[..] == model[..]);
            let extra = pattern(size / 2, 9);
            a.write(size as u64 / 4, AlignedBuf::from_slice(&extra), true)
                .await
                .unwrap();
            model[size / 4..size / 4 + size / 2].copy_from_slice(&extra);
            a.write_zeroes(0, 8 * BLOCK as u64, false, false)
                .await
                .unwrap();
            model[..8 * BLOCK].fill(0);
            let spare = member_specs(&paths[6..], backend).pop().unwrap();
            a.replace(&p(2), spare, false).await.unwrap();
            wait_optimal(&a).await;
            a.fail(&p(0), false).await.unwrap();
            a.fail(&p(4), false).await.unwrap();
            assert!(
                a.read(0, size).await.unwrap()[..] == model[..],
                "{backend:?}: after rebuild and two losses"
            );
            a.close().await.unwrap();

            // Reassemble from the surviving files (the failed ones are left out).
            let keep: Vec<PathBuf> = [1, 3, 5, 6].iter().map(|&i| paths[i].clone()).collect();
            let b = Array::assemble(
                member_specs(&keep, backend),
                AssembleOptions {
                    no_processes: true,
                    ..Default::default()
                },
            )
            .await
            .expect("assemble");
            assert!(
                b.read(0, size).await.unwrap()[..] == model[..],
                "{backend:?}: after reassembly"
            );
            b.close().await.unwrap();
        });
    }
}
