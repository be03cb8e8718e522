//! The fault and power-cut devices do what the torture tests rely on.

use sbod_core::buf::AlignedBuf;
use sbod_core::dev::{BlockDev, IoClass, IoKind, IoReq, MemDev};
use sbod_testkit::fault::*;
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn mem(size: u64) -> Arc<dyn BlockDev> {
    Arc::new(MemDev::new("m", size))
}

#[test]
#[allow(clippy::single_range_in_vec_init)]
fn eio_at_ranges_rates_and_pending_sectors_heal() {
    let fault = FaultDev::new(mem(1 << 20), 1);
    let fdev: Arc<FaultDev> = Arc::new(fault);
    let d: Arc<dyn BlockDev> = fdev.clone();
    write_all(&d, 0, &[7u8; 16384], false).unwrap();
    fdev.plan().bad_sectors = vec![4096..8192];
    fdev.plan().read_eio = vec![12288..16384];
    assert!(read_all(&d, 0, 4096).is_ok());
    assert_eq!(
        read_all(&d, 0, 8192).unwrap_err().raw_os_error(),
        Some(libc::EIO)
    );
    // Rewriting the pending sector heals it; the dead area stays dead.
    write_all(&d, 4096, &[9u8; 4096], false).unwrap();
    assert_eq!(read_all(&d, 4096, 4096).unwrap(), vec![9u8; 4096]);
    write_all(&d, 12288, &[9u8; 4096], false).unwrap();
    assert!(read_all(&d, 12288, 4096).is_err());
    let s = fdev.stats().snapshot();
    assert_eq!(s.read_errors, 2);
    assert_eq!(s.healed_bytes, 4096);
    // Writes at a range, and at a rate of 1.
    fdev.plan().write_eio = vec![0..4096];
    assert!(write_all(&d, 0, &[1u8; 4096], false).is_err());
    assert!(write_all(&d, 8192, &[1u8; 4096], false).is_ok());
    fdev.set_plan(FaultPlan {
        read_eio_rate: 1.0,
        ..Default::default()
    });
    assert!(read_all(&d, 8192, 4096).is_err());
    fdev.plan().read_eio_rate = 0.0;
    fdev.plan().flush_eio = true;
    assert!(flush_wait(&d).is_err());
    assert_eq!(fdev.stats().snapshot().flush_errors, 1);
}

#[test]
fn latency_delays_on_the_timer_and_keeps_every_request() {
    let fdev = Arc::new(FaultDev::new(mem(1 << 20), 2));
    fdev.set_plan(FaultPlan {
        latency_rate: 1.0,
        latency_max: Duration::from_millis(20),
        ..Default::default()
    });
    let d: Arc<dyn BlockDev> = fdev.clone();
    let t = Instant::now();
    // Submitting returns at once; completions come later, each exactly once.
    let (tx, rx) = std::sync::mpsc::channel();
    for i in 0..50u64 {
        let tx = tx.clone();
        d.submit(
            IoReq {
                offset: i * 4096,
                kind: IoKind::Write {
                    buf: AlignedBuf::from_slice(&[i as u8; 4096]).into_shared(),
                    fua: false,
                },
                class: IoClass::Foreground,
            },
            Box::new(move |r| tx.send((i, r.is_ok())).unwrap()),
        );
    }
    drop(tx);
    let mut got: Vec<(u64, bool)> = rx.iter().collect();
    got.sort();
    assert_eq!(got, (0..50).map(|i| (i, true)).collect::<Vec<_>>());
    assert!(t.elapsed() >= Duration::from_millis(5));
    assert_eq!(fdev.stats().snapshot().delayed, 50);
    for i in 0..50u64 {
        assert_eq!(read_all(&d, i * 4096, 4096).unwrap(), vec![i as u8; 4096]);
    }
}

#[test]
fn vanish_fails_new_and_in_flight_requests() {
    let fdev = Arc::new(FaultDev::new(mem(1 << 20), 3));
    fdev.set_plan(FaultPlan {
        latency_rate: 1.0,
        latency_max: Duration::from_millis(50),
        ..Default::default()
    });
    let d: Arc<dyn BlockDev> = fdev.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    d.submit(
        IoReq {
            offset: 0,
            kind: IoKind::Write {
                buf: AlignedBuf::from_slice(&[1u8; 4096]).into_shared(),
                fua: false,
            },
            class: IoClass::Foreground,
        },
        Box::new(move |r| tx.send(r.is_ok()).unwrap()),
    );
    fdev.vanish();
    assert!(
        !rx.recv().unwrap(),
        "an in-flight request completed after vanish"
    );
    assert!(read_all(&d, 0, 4096).is_err());
    assert!(fdev.stats().snapshot().vanished_errors >= 2);
    fdev.reappear();
    fdev.plan().latency_rate = 0.0;
    assert!(read_all(&d, 0, 4096).is_ok());
}

#[test]
fn bit_flips_on_reads_and_on_the_medium() {
    let fdev = Arc::new(FaultDev::new(mem(1 << 20), 4));
    let d: Arc<dyn BlockDev> = fdev.clone();
    write_all(&d, 0, &[0u8; 8192], false).unwrap();
    fdev.plan().read_flips = vec![(5, 0x10)];
    let r = read_all(&d, 0, 8192).unwrap();
    assert_eq!(r[5], 0x10);
    assert_eq!(r.iter().filter(|&&b| b != 0).count(), 1);
    // Not on the medium: the inner device still holds zeros.
    assert_eq!(read_all(fdev.inner(), 0, 4096).unwrap(), vec![0u8; 4096]);
    fdev.plan().read_flips.clear();
    fdev.corrupt(4100, 0x01).unwrap();
    assert_eq!(read_all(&d, 4096, 4096).unwrap()[4], 1);
    let s = fdev.stats().snapshot();
    assert_eq!((s.read_flips, s.medium_flips), (1, 1));
}

#[test]
fn thin_members_share_space_and_write_what_fits() {
    let pool = SpacePool::new(5 * 4096);
    let a: Arc<dyn BlockDev> = Arc::new(FaultDev::thin(mem(1 << 20), 1, pool.clone()));
    let b: Arc<dyn BlockDev> = Arc::new(FaultDev::thin(mem(1 << 20), 2, pool.clone()));
    write_all(&a, 0, &[1u8; 8192], false).unwrap();
    // Rewriting allocated blocks takes no space.
    write_all(&a, 0, &[2u8; 8192], false).unwrap();
    assert_eq!(pool.free(), 3 * 4096);
    // Four new blocks, three fit: they land, the fourth does not, the write fails.
    let e = write_all(&b, 0, &[3u8; 4 * 4096], false).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC));
    assert_eq!(pool.free(), 0);
    let got = read_all(&b, 0, 4 * 4096).unwrap();
    assert_eq!(&got[..3 * 4096], &[3u8; 3 * 4096][..]);
    assert_eq!(&got[3 * 4096..], &[0u8; 4096][..]);
    // Nothing fits: nothing is written.
    let e = write_all(&a, 65536, &[4u8; 4096], false).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC));
    assert_eq!(read_all(&a, 65536, 4096).unwrap(), vec![0u8; 4096]);
    // Punching gives space back; more space from outside does too.
    wait(
        &a,
        0,
        IoKind::Zero {
            len: 8192,
            punch: true,
        },
    )
    .unwrap();
    assert_eq!(pool.free(), 2 * 4096);
    pool.set_free(1 << 20);
    write_all(&a, 65536, &[4u8; 4096], false).unwrap();
    assert_eq!(read_all(&a, 65536, 4096).unwrap(), vec![4u8; 4096]);
}

#[test]
fn a_truncated_member_reads_short_and_writes_extend_it() {
    let m = Arc::new(MemDev::new("m", 1 << 20));
    let d: Arc<dyn BlockDev> = Arc::new(FaultDev::new(m.clone(), 1));
    write_all(&d, 0, &[7u8; 8192], false).unwrap();
    m.truncate(4096);
    assert_eq!((d.size(), d.current_size().unwrap()), (1 << 20, 4096));
    let e = read_all(&d, 0, 8192).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    // A write past the end extends it with a hole of zeros, as a file does.
    write_all(&d, 65536, &[9u8; 4096], false).unwrap();
    assert_eq!(d.current_size().unwrap(), 65536 + 4096);
    assert_eq!(read_all(&d, 4096, 4096).unwrap(), vec![0u8; 4096]);
}

fn pc(supply: &Arc<PowerSupply>, size: usize) -> Arc<PowerCutDev> {
    PowerCutDev::new("pc", vec![0u8; size], supply, Duration::ZERO, 9)
}

#[test]
fn flushed_and_fua_writes_survive_a_cut() {
    for seed in 0..50 {
        let supply = PowerSupply::new();
        let p = pc(&supply, 64 * 4096);
        let d: Arc<dyn BlockDev> = p.clone();
        write_all(&d, 0, &[1u8; 8192], false).unwrap();
        flush_wait(&d).unwrap();
        write_all(&d, 0, &[2u8; 8192], false).unwrap(); // cached, may go
        write_all(&d, 4096, &[3u8; 4096], true).unwrap(); // durable
        write_all(&d, 16384, &[4u8; 16384], false).unwrap(); // cached, may tear
                                                             // Reads see the cache.
        assert_eq!(read_all(&d, 16384, 4096).unwrap(), vec![4u8; 4096]);
        supply.cut(seed);
        assert!(read_all(&d, 0, 4096).is_err(), "I/O after the cut");
        let img = p.image();
        let blk = |b: usize| &img[b * 4096..(b + 1) * 4096];
        assert!(blk(0) == [1u8; 4096] || blk(0) == [2u8; 4096]);
        // The FUA write wins over the older cached write of the same block.
        assert_eq!(blk(1), [3u8; 4096]);
        for b in 4..8 {
            assert!(blk(b) == [0u8; 4096] || blk(b) == [4u8; 4096]);
        }
    }
}

#[test]
fn cuts_drop_and_tear_unflushed_writes() {
    let mut total = CutReport::default();
    let mut saw_torn_mix = false;
    for seed in 0..40 {
        let supply = PowerSupply::new();
        let p = pc(&supply, 64 * 4096);
        let d: Arc<dyn BlockDev> = p.clone();
        for i in 0..8u64 {
            write_all(&d, i * 16384, &[i as u8 + 1; 16384], false).unwrap();
        }
        total += supply.cut(seed);
        let img = p.image();
        for i in 0..8usize {
            let blocks: Vec<bool> = (0..4)
                .map(|b| {
                    let s = &img[i * 16384 + b * 4096..i * 16384 + (b + 1) * 4096];
                    assert!(s == [0u8; 4096] || s == [i as u8 + 1; 4096], "block mixed");
                    s[0] != 0
                })
                .collect();
            if blocks.iter().any(|x| *x) && blocks.iter().any(|x| !*x) {
                saw_torn_mix = true;
            }
        }
    }
    assert_eq!(total.unflushed, 320);
    assert_eq!(total.torn, 40);
    assert_eq!(total.landed + total.dropped + total.torn, 320);
    assert!(total.landed > 50 && total.dropped > 50, "{total:?}");
    assert!(saw_torn_mix, "no write was ever torn in part");
    assert!(total.dropped_bytes > 0);
}

#[test]
fn queued_requests_are_in_flight_at_the_cut_and_fail() {
    let supply = PowerSupply::new();
    let p = PowerCutDev::new(
        "pc",
        vec![0u8; 1 << 20],
        &supply,
        Duration::from_millis(5),
        5,
    );
    let d: Arc<dyn BlockDev> = p.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    for i in 0..64u64 {
        let tx = tx.clone();
        d.submit(
            IoReq {
                offset: i * 4096,
                kind: IoKind::Write {
                    buf: AlignedBuf::from_slice(&[0xaa; 4096]).into_shared(),
                    fua: true,
                },
                class: IoClass::Foreground,
            },
            Box::new(move |r| tx.send((i, r.is_ok())).unwrap()),
        );
    }
    // Cut once the first request has been served: the rest are still queued.
    let first = rx.recv().unwrap();
    let rep = supply.cut(1);
    drop(tx);
    let mut got: Vec<(u64, bool)> = rx.iter().collect();
    got.push(first);
    assert_eq!(got.len(), 64, "every request completes exactly once");
    let img = p.image();
    for (i, ok) in &got {
        let s = &img[*i as usize * 4096..(*i as usize + 1) * 4096];
        if *ok {
            assert_eq!(s, [0xaa; 4096], "an acknowledged FUA write was lost");
        } else {
            assert!(s == [0u8; 4096] || s == [0xaa; 4096]);
        }
    }
    assert!(got.iter().any(|x| !x.1), "nothing was in flight");
    assert!(rep.unflushed > 0);
}

#[test]
fn image_round_trips_through_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.img");
    let supply = PowerSupply::new();
    let p = pc(&supply, 8 * 4096);
    let d: Arc<dyn BlockDev> = p.clone();
    write_all(&d, 4096, &[5u8; 4096], true).unwrap();
    p.save(&path).unwrap();
    let q = PowerCutDev::from_file(&path, &PowerSupply::new(), Duration::ZERO, 1).unwrap();
    let e: Arc<dyn BlockDev> = q;
    assert_eq!(read_all(&e, 4096, 4096).unwrap(), vec![5u8; 4096]);
}
