//! The timing model on virtual time, against numbers worked out by hand from the profiles.
//! Deterministic: a fixed-seed generator, no real time.

use sbod_drive::link::Link;
use sbod_drive::model::{HddModel, Kind, Model, Op, SsdModel};
use sbod_drive::profile::{self, Hdd, Profile};
use std::sync::Arc;

const GIB: u64 = 1 << 30;
const S: f64 = 1e9;

/// splitmix64: deterministic offsets.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn block(&mut self, size: u64, bs: u64) -> u64 {
        self.next() % (size / bs) * bs
    }
}

fn nearline() -> Hdd {
    profile::hdd_nearline()
}

/// Run `drives` as closed loops of `qd` commands each from `gen` until `n` commands per
/// drive completed; seconds of virtual time taken.
fn closed_loop(
    drives: &mut [Box<dyn Model>],
    qd: usize,
    n: usize,
    gen: &mut dyn FnMut(usize) -> Op,
) -> f64 {
    let mut id = 0u64;
    let mut issued = vec![0usize; drives.len()];
    let mut done_n = vec![0usize; drives.len()];
    for (d, m) in drives.iter_mut().enumerate() {
        for _ in 0..qd.min(n) {
            id += 1;
            m.submit(0, id, gen(d));
            issued[d] += 1;
        }
    }
    let mut t = 0;
    let mut done = Vec::new();
    while done_n.iter().any(|&c| c < n) {
        t = drives
            .iter()
            .filter_map(|m| m.next_event())
            .min()
            .expect("work outstanding means an event is due");
        for (d, m) in drives.iter_mut().enumerate() {
            done.clear();
            m.advance(t, &mut done);
            for _ in &done {
                done_n[d] += 1;
                if issued[d] < n {
                    id += 1;
                    m.submit(t, id, gen(d));
                    issued[d] += 1;
                }
            }
        }
    }
    t as f64 / S
}

fn hdd(p: Hdd, member: u64, full: bool) -> Box<dyn Model> {
    Box::new(HddModel::new(p, member, full, Vec::new()))
}

fn read(offset: u64, len: u64) -> Op {
    Op {
        kind: Kind::Read,
        offset,
        len,
        urgent: false,
    }
}

fn write(offset: u64, len: u64, fua: bool) -> Op {
    Op {
        kind: Kind::Write { fua },
        offset,
        len,
        urgent: false,
    }
}

fn seq(n: &mut u64, bs: u64, size: u64) -> u64 {
    let o = *n;
    *n = (*n + bs) % size;
    o
}

#[test]
fn sequential_transfer_runs_at_the_zone_rate() {
    // Short-stroked (span=size): the member is the outer edge, 281 MB/s.
    let (mut pos, n) = (0u64, 256);
    let secs = closed_loop(&mut [hdd(nearline(), GIB, false)], 4, n, &mut |_| {
        read(seq(&mut pos, 1 << 20, GIB), 1 << 20)
    });
    let mbps = n as f64 * (1 << 20) as f64 / secs / 1e6;
    eprintln!("outer 1M reads: {mbps:.0} MB/s");
    assert!(
        (265.0..=281.5).contains(&mbps),
        "outer reads at {mbps} MB/s"
    );

    // Writes through (write cache off) stream as fast when queued.
    let mut p = nearline();
    p.write_cache = false;
    let mut pos = 0;
    let secs = closed_loop(&mut [hdd(p, GIB, false)], 4, n, &mut |_| {
        write(seq(&mut pos, 1 << 20, GIB), 1 << 20, false)
    });
    let mbps = n as f64 * (1 << 20) as f64 / secs / 1e6;
    eprintln!("outer 1M writes through: {mbps:.0} MB/s");
    assert!(
        (265.0..=281.5).contains(&mbps),
        "outer writes at {mbps} MB/s"
    );

    // Spread over the stroke (span=full): the member's last bytes are the inner zone,
    // 132 MB/s, and the rate falls from outer to inner.
    let m = HddModel::new(nearline(), GIB, true, Vec::new());
    let g = m.geometry();
    let outer = g.rate_at(0) / 1e6;
    let mid = g.rate_at(GIB / 2) / 1e6;
    let inner = g.rate_at(GIB - 1) / 1e6;
    assert!((outer - 281.0).abs() < 0.5, "{outer}");
    assert!((inner - 132.0).abs() < 0.5, "{inner}");
    // Half the bytes lie outside the middle radius: sqrt((1 + 0.47^2) / 2) = 0.781.
    assert!((mid - 281.0 * 0.781).abs() < 1.5, "{mid}");
    // From 3/4 to 7/8 of the member the rate falls from 281 * sqrt(1 - 0.779 * 0.75) = 181
    // to 281 * sqrt(1 - 0.779 * 0.875) = 158.6 MB/s; the time is the integral of 1/rate:
    // 0.125 / ((2 / 0.779) * (0.645 - 0.564)) * 281 = 169 MB/s on average.
    let mut pos = GIB - (256 << 20);
    let secs = closed_loop(&mut [hdd(nearline(), GIB, true)], 4, 128, &mut |_| {
        let o = pos;
        pos += 1 << 20;
        read(o, 1 << 20)
    });
    let mbps = 128.0 * (1 << 20) as f64 / secs / 1e6;
    eprintln!("3/4..7/8 1M reads: {mbps:.0} MB/s");
    assert!(
        (160.0..=170.0).contains(&mbps),
        "inner reads at {mbps} MB/s"
    );
}

/// Random 4 KiB reads at QD1, no queueing. By hand, full stroke: the average seek over
/// random LBAs (a little under the datasheet's 8.2 ms, which averages over cylinders,
/// and outer cylinders hold more LBAs) + half a turn (4.17 ms at 7200 rpm) + 40 µs of
/// command + 15 µs of transfer: about 12 ms, 80-90 IOPS. Short-stroked to 1 GiB: seeks
/// of a few hundred tracks (about 1 ms) + 4.17 ms: about 190 IOPS.
#[test]
fn random_reads_at_qd1_and_with_ncq() {
    let mut fifo = nearline();
    fifo.sptf = false;
    fifo.queue_depth = 1;
    let n = 2000;
    let size = 16 * GIB;
    let mut r = Rng(1);
    let secs = closed_loop(&mut [hdd(fifo.clone(), size, true)], 1, n, &mut |_| {
        read(r.block(size, 4096), 4096)
    });
    let qd1 = n as f64 / secs;
    assert!((75.0..=100.0).contains(&qd1), "full stroke QD1: {qd1} IOPS");

    let mut r = Rng(2);
    let secs = closed_loop(&mut [hdd(fifo.clone(), GIB, false)], 1, n, &mut |_| {
        read(r.block(GIB, 4096), 4096)
    });
    let short = n as f64 / secs;
    assert!(
        (150.0..=250.0).contains(&short),
        "short stroke QD1: {short} IOPS"
    );

    // Without NCQ a deeper host queue changes nothing.
    let mut r = Rng(3);
    let secs = closed_loop(&mut [hdd(fifo, size, true)], 32, n, &mut |_| {
        read(r.block(size, 4096), 4096)
    });
    let fifo32 = n as f64 / secs;
    eprintln!("4K random read: QD1 full {qd1:.0}, short {short:.0}, FIFO QD32 {fifo32:.0} IOPS");
    assert!((fifo32 / qd1 - 1.0).abs() < 0.1, "{fifo32} vs {qd1}");

    // NCQ (shortest positioning time first) at QD16 and QD32: the datasheets' QD16 figure
    // for this class is about 2x QD1 (Exos 2X14: 304 IOPS for two actuators).
    let mut r = Rng(4);
    let secs = closed_loop(&mut [hdd(nearline(), size, true)], 16, n, &mut |_| {
        read(r.block(size, 4096), 4096)
    });
    let ncq16 = n as f64 / secs;
    let mut r = Rng(5);
    let secs = closed_loop(&mut [hdd(nearline(), size, true)], 32, n, &mut |_| {
        read(r.block(size, 4096), 4096)
    });
    let ncq32 = n as f64 / secs;
    eprintln!("4K random read NCQ: QD16 {ncq16:.0}, QD32 {ncq32:.0} IOPS");
    assert!(
        ncq16 > 1.6 * qd1 && ncq32 > ncq16 && ncq32 < 6.0 * qd1,
        "QD1 {qd1}, NCQ QD16 {ncq16}, QD32 {ncq32}"
    );
    assert!((130.0..=260.0).contains(&ncq16), "NCQ QD16: {ncq16}");
}

#[test]
fn two_actuators_double_random_iops() {
    let size = 16 * GIB;
    let Profile::Hdd(dual) = profile::by_name("hdd-dual").unwrap() else {
        panic!()
    };
    let single = Hdd {
        actuators: 1,
        outer_mbps: dual.outer_mbps / 2.0,
        inner_mbps: dual.inner_mbps / 2.0,
        ..dual.clone()
    };
    let run = |p: Hdd, qd: usize| {
        let mut r = Rng(7);
        let n = 3000;
        n as f64
            / closed_loop(&mut [hdd(p, size, true)], qd, n, &mut |_| {
                read(r.block(size, 4096), 4096)
            })
    };
    // In arrival order (no reordering), both actuators always have work: twice the IOPS.
    let fifo = |p: &Hdd| Hdd {
        sptf: false,
        ..p.clone()
    };
    let (one, two) = (run(fifo(&single), 32), run(fifo(&dual), 32));
    let ratio = two / one;
    eprintln!("FIFO QD32: one actuator {one:.0}, two {two:.0} IOPS ({ratio:.2}x)");
    assert!(
        (1.85..=2.1).contains(&ratio),
        "FIFO: {one} -> {two} IOPS ({ratio}x)"
    );
    // With NCQ each actuator chooses among half the queue, so the gain is a little less
    // (the Exos 2X14's 304 random read IOPS are about 1.8x what single-actuator drives of its class give, about 168 at QD16).
    let (one, two) = (run(single, 16), run(dual, 16));
    let ratio = two / one;
    eprintln!("NCQ QD16: one actuator {one:.0}, two {two:.0} IOPS ({ratio:.2}x)");
    assert!(
        (1.5..=2.1).contains(&ratio),
        "NCQ: {one} -> {two} IOPS ({ratio}x)"
    );
    assert!((250.0..=350.0).contains(&two), "dual QD16: {two}");
}

#[test]
fn write_cache_flush_and_fua() {
    // 8 MiB of 64 KiB writes land in the cache at the interface's speed (600 MB/s: 14 ms),
    // far sooner than the medium takes them (8 MiB at 281 MB/s: 30 ms); a FLUSH then
    // waits for the destaging to finish.
    let mut m = HddModel::new(nearline(), GIB, false, Vec::new());
    let mut done = Vec::new();
    for i in 0..128u64 {
        m.submit(0, i + 1, write(i * 65536, 65536, false));
    }
    let mut t = 0;
    while done.len() < 128 {
        t = m.next_event().unwrap();
        m.advance(t, &mut done);
    }
    let acked = t as f64 / 1e6;
    eprintln!("8 MiB cached: acknowledged at {acked:.1} ms");
    assert!(
        (13.0..=20.0).contains(&acked),
        "writes acknowledged after {acked} ms"
    );
    m.submit(
        t,
        1000,
        Op {
            kind: Kind::Flush,
            offset: 0,
            len: 0,
            urgent: false,
        },
    );
    done.clear();
    while !done.contains(&1000) {
        t = m.next_event().unwrap();
        m.advance(t, &mut done);
    }
    let flushed = t as f64 / 1e6;
    // Destaging started with the first write: the whole 8 MiB is on the medium by about
    // 30 ms plus positioning (up to a turn, 8.3 ms).
    eprintln!("flushed at {flushed:.1} ms");
    assert!(
        (29.0..=45.0).contains(&flushed),
        "flush done at {flushed} ms"
    );
    // With nothing dirty, a FLUSH costs its fixed 100 µs.
    m.submit(
        t,
        1001,
        Op {
            kind: Kind::Flush,
            offset: 0,
            len: 0,
            urgent: false,
        },
    );
    let t0 = t;
    done.clear();
    while !done.contains(&1001) {
        t = m.next_event().unwrap();
        m.advance(t, &mut done);
    }
    assert_eq!(t - t0, 100_000);

    // A FUA write goes to the medium: a random 4 KiB one costs a seek and a turn's wait
    // (QD1: ~12 ms full stroke), where a cached one is acknowledged in well under 1 ms.
    let size = 16 * GIB;
    let mut r = Rng(9);
    let n = 500;
    let fua = closed_loop(&mut [hdd(nearline(), size, true)], 1, n, &mut |_| {
        write(r.block(size, 4096), 4096, true)
    }) / n as f64;
    let mut r = Rng(9);
    let cached = closed_loop(&mut [hdd(nearline(), size, true)], 1, 100, &mut |_| {
        write(r.block(size, 4096), 4096, false)
    }) / 100.0;
    eprintln!(
        "4K random write QD1: FUA {:.2} ms, cached {:.3} ms",
        fua * 1e3,
        cached * 1e3
    );
    assert!(fua > 0.008 && fua < 0.016, "FUA write {fua} s");
    assert!(cached < 0.0002, "cached write {cached} s");
}

#[test]
fn an_expander_ceiling_is_shared_by_the_drives_behind_it() {
    // 8 drives streaming 1 MiB reads: alone they make 8 x 281 MB/s; behind one 1 GB/s
    // uplink they share 1 GB/s.
    let run = |link: Option<Arc<Link>>| {
        let mut drives: Vec<Box<dyn Model>> = (0..8)
            .map(|_| {
                Box::new(HddModel::new(
                    nearline(),
                    GIB,
                    false,
                    link.iter().cloned().collect(),
                )) as Box<dyn Model>
            })
            .collect();
        let mut pos = [0u64; 8];
        let n = 200;
        let secs = closed_loop(&mut drives, 4, n, &mut |d| {
            read(seq(&mut pos[d], 1 << 20, GIB), 1 << 20)
        });
        8.0 * n as f64 * (1 << 20) as f64 / secs / 1e6
    };
    let free = run(None);
    assert!((2100.0..=2250.0).contains(&free), "{free} MB/s");
    let shared = run(Some(Link::local("exp0", 1e9)));
    eprintln!("8 drives streaming: {free:.0} MB/s alone, {shared:.0} MB/s behind 1 GB/s");
    assert!((950.0..=1001.0).contains(&shared), "{shared} MB/s");
}

#[test]
fn nvme_ceilings() {
    let Profile::Ssd(p) = profile::by_name("nvme-dc").unwrap() else {
        panic!()
    };
    let size = 64 * GIB;
    let ssd = || Box::new(SsdModel::new(p.clone(), Vec::new())) as Box<dyn Model>;
    // QD1: the class latency, 80 µs (+ 4 KiB on the link).
    let mut r = Rng(11);
    let lat = closed_loop(&mut [ssd()], 1, 1000, &mut |_| {
        read(r.block(size, 4096), 4096)
    }) / 1000.0;
    eprintln!("nvme QD1 read latency {:.1} us", lat * 1e6);
    assert!((80e-6..=82e-6).contains(&lat), "{lat}");
    // Deep queues: the IOPS ceiling, 900K reads, 200K writes.
    let mut r = Rng(12);
    let iops = 200_000.0
        / closed_loop(&mut [ssd()], 256, 200_000, &mut |_| {
            read(r.block(size, 4096), 4096)
        });
    eprintln!("nvme 4K read {iops:.0} IOPS");
    assert!((880_000.0..=901_000.0).contains(&iops), "{iops}");
    let mut r = Rng(13);
    let iops = 50_000.0
        / closed_loop(&mut [ssd()], 256, 50_000, &mut |_| {
            write(r.block(size, 4096), 4096, false)
        });
    eprintln!("nvme 4K write {iops:.0} IOPS");
    assert!((195_000.0..=201_000.0).contains(&iops), "{iops}");
    // Large reads: the bandwidth ceiling, 6.5 GB/s.
    let mut pos = 0;
    let n = 5000;
    let mbps = n as f64 * (1 << 20) as f64
        / closed_loop(&mut [ssd()], 16, n, &mut |_| {
            read(seq(&mut pos, 1 << 20, size), 1 << 20)
        })
        / 1e6;
    eprintln!("nvme 1M reads {mbps:.0} MB/s");
    assert!((6300.0..=6501.0).contains(&mbps), "{mbps}");
}

/// A RAID member's share of a sequential read (a raid6-of-8 member: 6 of every 8 chunks,
/// 64K reads at QD8) streams at the data's share of the media rate (6/8 of about 260 MB/s
/// over the outer zone), also when the requests arrive out of order within a window of 8
/// (an array serves a client's requests concurrently): a read of bytes the stream already
/// passed is served from the drive's buffer, as a drive's read-ahead segment does, not a
/// revolution later.
#[test]
fn out_of_order_reads_within_a_stream_come_from_the_buffer() {
    let mut rates = Vec::new();
    for shuffle in [false, true] {
        let mut m = vec![hdd(nearline(), GIB, true)];
        let mut offs: Vec<u64> = (0..20000u64)
            .filter(|c| c % 8 < 6)
            .map(|c| c * 65536)
            .collect();
        if shuffle {
            let mut rng = Rng(7);
            for w in offs.chunks_mut(8) {
                for i in (1..w.len()).rev() {
                    let j = (rng.next() % (i as u64 + 1)) as usize;
                    w.swap(i, j);
                }
            }
        }
        let mut i = 0;
        let n = 4000;
        let secs = closed_loop(&mut m, 8, n, &mut |_| {
            let o = offs[i];
            i += 1;
            read(o, 65536)
        });
        rates.push(n as f64 * 65536.0 / secs / 1e6);
    }
    let (ordered, shuffled) = (rates[0], rates[1]);
    assert!((180.0..215.0).contains(&ordered), "{ordered} MB/s");
    assert!(shuffled > 0.95 * ordered, "{shuffled} vs {ordered} MB/s");
}

/// A far read behind 200 queued reads clustered elsewhere (more than the drive's queue):
/// how many of them complete before it, plain and urgent.
fn served_before_far_read(urgent: bool) -> usize {
    let size = 16 * GIB;
    let mut m = hdd(nearline(), size, true);
    let mut r = Rng(7);
    let base = 8 * GIB;
    for id in 0..200 {
        m.submit(0, id, read(base + r.block(GIB / 4, 4096), 4096));
    }
    // The owner block, as the heartbeat reads it: near the start of the member.
    let mut far = read(28 << 10, 4096);
    far.urgent = urgent;
    m.submit(0, 1_000, far);
    let mut done = Vec::new();
    let mut before = 0;
    loop {
        let t = m.next_event().expect("commands outstanding");
        done.clear();
        m.advance(t, &mut done);
        for &id in &done {
            if id == 1_000 {
                return before;
            }
            before += 1;
        }
    }
}

#[test]
fn an_urgent_command_goes_ahead_of_the_queue() {
    // Plain, the far read waits for the host queue ahead of it and then loses to nearer
    // commands (up to the aging bound); urgent, it leaves the host queue first and the
    // drive serves it next: only what the actuators had under way finishes before it.
    let plain = served_before_far_read(false);
    let urgent = served_before_far_read(true);
    eprintln!("completed before the far read: plain {plain}, urgent {urgent}");
    assert!(plain >= 100, "plain: {plain}");
    assert!(urgent <= 2, "urgent: {urgent}");
}
