//! Modelled drives in real time: the data is the inner device's, the answers come no
//! sooner than the model says (a floor, so the bounds below cannot flake on a slow
//! machine; the ceilings are generous), and an sbod array runs on them.

use sbod_core::dev::{self, BlockDev, IoClass, MemDev};
use sbod_core::{AlignedBuf, Array, CreateSpec, Level, MemberSpec};
use sbod_drive::{wrap, Spec};
use std::sync::Arc;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn drive(name: &str, spec: &str, size: u64) -> Arc<dyn BlockDev> {
    let spec = Spec::parse(spec).unwrap();
    let inner: Arc<dyn BlockDev> = Arc::new(MemDev::new(name, size));
    wrap(name.to_string(), &spec, inner).unwrap()
}

fn pattern(seed: u64, len: usize) -> AlignedBuf {
    let mut b = AlignedBuf::zeroed(len);
    for (i, x) in b.iter_mut().enumerate() {
        *x = (seed as usize * 31 + i * 7 + i / 4096) as u8;
    }
    b
}

#[test]
fn a_modelled_hdd_keeps_data_and_takes_a_drive_s_time() {
    rt().block_on(async {
        let d = drive("d0", "model:hdd-nearline,wce=off:/mem/d0", 256 * MIB);
        assert_eq!(d.size(), 256 * MIB);
        assert_eq!(d.queue(), "model");
        // 20 random 4 KiB writes through (no write cache) and reads back, one at a time.
        // Each costs at least a seek over the spread stroke or a part of a turn: the
        // model's floor for 40 of them is far above 40 ms.
        let t = Instant::now();
        for i in 0..20u64 {
            let off = (i * 7919 % 4096) * 64 * 1024;
            let w = pattern(i, 4096).into_shared();
            dev::write_at(&d, off, w, false, IoClass::Foreground)
                .await
                .unwrap();
            let r = AlignedBuf::zeroed(4096).into_shared();
            dev::read_at(&d, off, r.clone(), IoClass::Foreground)
                .await
                .unwrap();
            let r = r.try_unwrap().unwrap();
            assert_eq!(&r[..], &pattern(i, 4096)[..], "block {i}");
        }
        let took = t.elapsed();
        assert!(
            took > Duration::from_millis(40) && took < Duration::from_secs(20),
            "40 random I/Os on a 7200 rpm drive took {took:?}"
        );
        // A FLUSH with the write cache off costs only the command.
        dev::flush(&d).await.unwrap();
        d.close();
        let r = AlignedBuf::zeroed(4096).into_shared();
        assert!(dev::read_at(&d, 0, r, IoClass::Foreground).await.is_err());
    });
}

#[test]
fn an_array_on_modelled_drives() {
    rt().block_on(async {
        // A raid6 of 5 modelled nearline HDDs behind one shared expander link, in memory.
        let dir = tempfile::tempdir().unwrap();
        let members: Vec<MemberSpec> = (0..5)
            .map(|i| {
                let name = format!(
                    "model:hdd-nearline,link=exp0@1G:{}/m{i}.img",
                    dir.path().display()
                );
                let spec = Spec::parse(&name).unwrap();
                let inner: Arc<dyn BlockDev> = Arc::new(MemDev::new(name.clone(), 64 * MIB));
                MemberSpec {
                    dev: wrap(name.clone(), &spec, inner).unwrap(),
                    path: name,
                    is_file: false,
                    domain: String::new(),
                }
            })
            .collect();
        let a = Array::create(
            CreateSpec {
                name: "modelled".into(),
                level: Level::Raid6,
                chunk: 64 * 1024,
                groups: 1,
                spares: 0,
                declustered: false,
                copies: 2,
                bitmap_region: None,
                assume_clean: true,
                integrity: sbod_core::integrity::Kind::Crc32c,
                force: false,
            },
            members,
        )
        .await
        .unwrap();
        assert!(dir.path().join(".sbod-link-exp0").exists());
        // Full stripes and a partial one, read back.
        let writes = [
            (0u64, 3 * 64 * 1024usize),
            (5 * MIB, 1 << 20),
            (9 * MIB + 4096, 8192),
        ];
        for (i, &(off, len)) in writes.iter().enumerate() {
            a.write(off, pattern(i as u64, len), false).await.unwrap();
        }
        for (i, &(off, len)) in writes.iter().enumerate() {
            let got = a.read(off, len).await.unwrap();
            assert_eq!(&got[..], &pattern(i as u64, len)[..], "write {i}");
        }
        let st = a.status();
        assert_eq!(st.state.to_string(), "optimal");
        a.close().await.unwrap();
    });
}

/// A model that notes how it is called: each command completes `delay` ns of the model's
/// clock after it arrives (an hour: nothing completes during the test but what it says).
struct Notes {
    log: Arc<parking_lot::Mutex<Vec<(&'static str, u64)>>>,
    due: Vec<(u64, u64)>,
    delay: u64,
}

const HOUR: u64 = 3_600_000_000_000;

impl sbod_drive::model::Model for Notes {
    fn submit(&mut self, now: u64, id: u64, _op: sbod_drive::model::Op) {
        self.log.lock().push(("submit", now));
        self.due.push((now + self.delay, id));
    }
    fn advance(&mut self, now: u64, done: &mut Vec<u64>) {
        self.log.lock().push(("advance", now));
        self.due.retain(|&(t, id)| {
            if t <= now {
                done.push(id);
            }
            t > now
        });
    }
    fn next_event(&self) -> Option<u64> {
        self.due.iter().map(|d| d.0).min()
    }
}

/// A command that arrives while the drive's timer has not yet run what was due (it wakes
/// late on a busy host) must not move those events to its arrival: the drive is run up
/// to the arrival first, then takes the command. (Before, a drive that finished a write
/// at T and was handed the next write, queued, when a command arrived at T + 100 µs took
/// it at T + 100 µs, a revolution late: arrays lost most of their sequential writes.)
#[test]
fn a_command_arrives_after_what_was_due_before_it() {
    rt().block_on(async {
        let log = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let model = Notes {
            log: log.clone(),
            due: Vec::new(),
            delay: HOUR,
        };
        let inner: Arc<dyn BlockDev> = Arc::new(MemDev::new("n0", MIB));
        let d: Arc<dyn BlockDev> = Arc::new(sbod_drive::ModelDev::new(
            "n0".into(),
            inner,
            Box::new(model),
            1,
        ));
        for i in 0..4u64 {
            let d = d.clone();
            // The command completes when the model says (in an hour): don't wait for it.
            d.submit(
                dev::IoReq {
                    offset: i * 4096,
                    kind: dev::IoKind::Write {
                        buf: pattern(i, 4096).into_shared(),
                        fua: false,
                    },
                    class: IoClass::Foreground,
                },
                Box::new(|_| {}),
            );
        }
        let log = log.lock().clone();
        let subs: Vec<usize> = (0..log.len()).filter(|&i| log[i].0 == "submit").collect();
        assert_eq!(subs.len(), 4, "{log:?}");
        for i in subs {
            assert!(
                i > 0 && log[i - 1] == ("advance", log[i].1),
                "command {i} reached the model before it ran to the command's arrival: {log:?}"
            );
        }
        d.close();
    });
}

/// `slow=K`: the model runs on a clock K times slower than the wall's, so a command the
/// model completes after 1 ms is answered no sooner than K ms later, and the model is
/// handed its own clock (the wall's divided by K), never the wall's.
#[test]
fn slow_motion_runs_the_model_on_a_slower_clock() {
    rt().block_on(async {
        assert_eq!(Spec::parse("model:hdd-nearline,slow=8:/x").unwrap().slow, 8);
        for bad in ["slow=0", "slow=1001", "slow=fast"] {
            let e = Spec::parse(&format!("model:hdd-nearline,{bad}:/x")).unwrap_err();
            assert!(e.contains("slow=K"), "{e}");
        }
        let log = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let model = Notes {
            log: log.clone(),
            due: Vec::new(),
            delay: 1_000_000,
        };
        let inner: Arc<dyn BlockDev> = Arc::new(MemDev::new("s0", MIB));
        let d: Arc<dyn BlockDev> = Arc::new(sbod_drive::ModelDev::new(
            "s0".into(),
            inner,
            Box::new(model),
            200,
        ));
        let before = sbod_drive::dev::now_ns();
        let t = Instant::now();
        for i in 0..3u64 {
            dev::write_at(
                &d,
                i * 4096,
                pattern(i, 4096).into_shared(),
                false,
                IoClass::Foreground,
            )
            .await
            .unwrap();
        }
        let took = t.elapsed();
        let after = sbod_drive::dev::now_ns();
        // Three commands one after the other, 1 ms each on the model's clock: 600 ms.
        assert!(took >= Duration::from_millis(600), "took {took:?}");
        for &(what, at) in log.lock().iter() {
            assert!(
                at >= before / 200 && at <= after / 200,
                "{what} at {at}: not the wall's clock / 200 ({} ..= {})",
                before / 200,
                after / 200
            );
        }
        d.close();
    });
}
