//! Power cuts during a reshape (`sbod grow` of a striped array): members are
//! [`PowerCutDev`]s (completed writes sit in a volatile cache until a FLUSH; a cut keeps a
//! random part of them, tears one, and fails everything after). A client writes with FUA
//! while the reshape runs; the power goes at a random moment (before the grow is recorded,
//! while the first windows are written aside, while windows move in place, while the new
//! space is zeroed); the array is then assembled from what the members kept, the reshape
//! resumes and ends, and every block reads back as the last write the client saw
//! acknowledged (a write that failed with the cut may have landed or not), the new space
//! reads as zeros, and a scrub finds parity right everywhere.
//!
//! Beside the random cuts, a cut at each step of the first windows (written aside) and of
//! later ones (in place): after the backup is recorded, after the new stripes are written
//! but not flushed, after the window is recorded.
//!
//! Level changes (`grow --level`: raid5 -> raid6, ec:3+2 -> 3+3 in two groups) take the
//! random cuts too: the new parity members rebuild after the cut, nothing else moved.
//!
//! Narrowing (`grow --remove`: raid5 of 5 -> 4, raid6 in two groups of 6 -> 5) walks down
//! from the new capacity and writes its last windows aside on the members leaving: the
//! same random cuts and cuts at each step, with the client writing only below the new
//! size (the space past it is let go).
//!
//! A new chunk (`grow --chunk`: raid5 of 4 to 128 KiB, raid6 in two groups of 5 to 32
//! KiB) writes every window aside (in the last rows of the members, which the volume gets
//! back as zeros at the end): random cuts and a cut at each step of three windows.
//!
//! `SBOD_RESHAPE_CUTS` sets the number of random cuts (default 16).

use sbod_core::dev::BlockDev;
use sbod_core::{AlignedBuf, Array, AssembleOptions, CreateSpec, GrowOutcome, Level, MemberSpec};
use sbod_testkit::fault::{PowerCutDev, PowerSupply, Rng};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

const MIB: u64 = 1 << 20;
const CHUNK: u32 = 64 << 10;
const BLOCK: u64 = 4096;

fn spec_of(d: &Arc<PowerCutDev>, name: &str) -> MemberSpec {
    MemberSpec {
        dev: d.clone() as Arc<dyn BlockDev>,
        path: name.to_string(),
        is_file: false,
        domain: String::new(),
    }
}

fn block(b: u64, seed: u64) -> AlignedBuf {
    let mut x = AlignedBuf::zeroed(BLOCK as usize);
    for (i, v) in x.iter_mut().enumerate() {
        *v = (b.wrapping_mul(977) ^ seed.wrapping_mul(31)).wrapping_add(i as u64) as u8;
    }
    x
}

/// What each block may read as: the values it may hold (0 = zeros). One value once a write
/// was acknowledged; more while writes that failed with the cut may or may not have landed.
#[derive(Default)]
struct Model {
    may: BTreeMap<u64, Vec<u64>>,
}

impl Model {
    fn acked(&mut self, b: u64, s: u64) {
        self.may.insert(b, vec![s]);
    }
    fn unsure(&mut self, b: u64, s: u64) {
        self.may.entry(b).or_insert_with(|| vec![0]).push(s);
    }
    fn allows(&self, b: u64, got: &[u8]) -> bool {
        let may = self.may.get(&b).cloned().unwrap_or_else(|| vec![0]);
        may.iter().any(|&s| match s {
            0 => got.iter().all(|&x| x == 0),
            s => got == &block(b, s)[..],
        })
    }
}

#[derive(Debug)]
struct Case {
    level: Level,
    groups: u32,
    width: usize,
    add: usize,
    new_groups: bool,
    /// A level change (`grow --level`) rather than a restripe.
    to: Option<Level>,
    /// Members removed (the last of each group: `grow --remove`) rather than added.
    remove: usize,
    /// A new chunk (`grow --chunk`), nothing added or removed.
    chunk: u32,
}

const CASES: &[Case] = &[
    Case {
        level: Level::Raid5,
        groups: 1,
        width: 4,
        add: 1,
        new_groups: false,
        to: Some(Level::Raid6),
        remove: 0,
        chunk: 0,
    },
    Case {
        level: Level::Ec { k: 3, m: 2 },
        groups: 2,
        width: 5,
        add: 2,
        new_groups: false,
        to: Some(Level::Ec { k: 3, m: 3 }),
        remove: 0,
        chunk: 0,
    },
    Case {
        level: Level::Raid5,
        groups: 1,
        width: 4,
        add: 1,
        new_groups: false,
        to: None,
        remove: 0,
        chunk: 0,
    },
    Case {
        level: Level::Raid6,
        groups: 1,
        width: 5,
        add: 2,
        new_groups: false,
        to: None,
        remove: 0,
        chunk: 0,
    },
    Case {
        level: Level::Raid6,
        groups: 2,
        width: 4,
        add: 2,
        new_groups: false,
        to: None,
        remove: 0,
        chunk: 0,
    },
    Case {
        level: Level::Raid5,
        groups: 2,
        width: 3,
        add: 3,
        new_groups: true,
        to: None,
        remove: 0,
        chunk: 0,
    },
    Case {
        level: Level::Ec { k: 3, m: 2 },
        groups: 1,
        width: 5,
        add: 1,
        new_groups: false,
        to: None,
        remove: 0,
        chunk: 0,
    },
    Case {
        level: Level::Raid0,
        groups: 1,
        width: 3,
        add: 1,
        new_groups: false,
        to: None,
        remove: 0,
        chunk: 0,
    },
    Case {
        level: Level::Raid5,
        groups: 1,
        width: 5,
        add: 0,
        new_groups: false,
        to: None,
        remove: 1,
        chunk: 0,
    },
    Case {
        level: Level::Raid6,
        groups: 2,
        width: 6,
        add: 0,
        new_groups: false,
        to: None,
        remove: 2,
        chunk: 0,
    },
    Case {
        level: Level::Raid5,
        groups: 1,
        width: 4,
        add: 0,
        new_groups: false,
        to: None,
        remove: 0,
        chunk: 128 << 10,
    },
    Case {
        level: Level::Raid6,
        groups: 2,
        width: 5,
        add: 0,
        new_groups: false,
        to: None,
        remove: 0,
        chunk: 32 << 10,
    },
];

#[test]
fn power_cuts_during_a_reshape_never_lose_an_acknowledged_write() {
    let cuts: u64 = std::env::var("SBOD_RESHAPE_CUTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(16);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut resumed = 0;
    let mut backups_cut = 0;
    for seed in 0..cuts {
        let c = &CASES[seed as usize % CASES.len()];
        let (r, b) = rt.block_on(one_cut(c, seed));
        resumed += r as u64;
        backups_cut += b as u64;
    }
    eprintln!("{cuts} cuts: {resumed} reshapes resumed after the cut, {backups_cut} cut while a window was written aside");
    if cuts >= 16 {
        assert!(
            resumed >= cuts / 3,
            "too few cuts landed during a reshape: {resumed}"
        );
    }
}

#[test]
fn a_power_cut_at_each_step_of_a_window_never_loses_an_acknowledged_write() {
    use sbod_core::process::ReshapeStep as S;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut seed = 1000;
    for c in &CASES[2..5] {
        // The first window (written aside), the second, and one further in (in place).
        for nth in [0usize, 1, 3] {
            for step in [S::BackupRecorded, S::Written, S::Recorded] {
                seed += 1;
                let at = Cut::Step(step, nth);
                let (during, _) = rt.block_on(one_life(c, seed, at));
                // Only the first windows are written aside.
                if !(step == S::BackupRecorded && nth > 0) {
                    assert!(
                        during,
                        "{c:?}: no cut at {step:?} of window {nth}",
                        c = c.level
                    );
                }
            }
        }
    }
}

#[test]
fn a_power_cut_at_each_step_of_a_narrowing_never_loses_an_acknowledged_write() {
    use sbod_core::process::ReshapeStep as S;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut seed = 2000;
    for c in CASES.iter().filter(|c| c.remove > 0) {
        // The first window (in place, at the top), one further down, and the first one
        // written aside (near the volume's start).
        for (step, nth) in [
            (S::Written, 0usize),
            (S::Recorded, 0),
            (S::Written, 2),
            (S::BackupRecorded, 0),
            (S::Written, 0),
        ] {
            seed += 1;
            let (during, _) = rt.block_on(one_life(c, seed, Cut::Step(step, nth)));
            assert!(during, "{c:?}: no cut at {step:?} of window {nth}");
        }
    }
}

#[test]
fn a_power_cut_at_each_step_of_a_new_chunk_never_loses_an_acknowledged_write() {
    use sbod_core::process::ReshapeStep as S;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut seed = 3000;
    for c in CASES.iter().filter(|c| c.chunk > 0) {
        // Every window is written aside: the first, the second and one further in.
        for nth in [0usize, 1, 3] {
            for step in [S::BackupRecorded, S::Written, S::Recorded] {
                seed += 1;
                let (during, _) = rt.block_on(one_life(c, seed, Cut::Step(step, nth)));
                assert!(during, "{c:?}: no cut at {step:?} of window {nth}");
            }
        }
    }
}

/// When the power goes.
#[derive(Clone, Copy, Debug)]
enum Cut {
    /// After a random time.
    Random,
    /// At a step of the n-th window.
    Step(sbod_core::process::ReshapeStep, usize),
}

async fn one_cut(c: &Case, seed: u64) -> (bool, bool) {
    one_life(c, seed, Cut::Random).await
}

/// One life: create, fill, grow, cut the power (at a random moment or a given step),
/// assemble, check. Returns whether the cut came while the reshape ran, and whether the
/// reshape was in its first windows then.
async fn one_life(c: &Case, seed: u64, at: Cut) -> (bool, bool) {
    let what = format!(
        "{} {}x{} +{} (seed {seed})",
        c.level, c.groups, c.width, c.add
    );
    let rng = Rng::new(seed * 7919 + 1);
    let size = MIB + 40 * CHUNK as u64;
    let n_old = c.groups as usize * c.width;
    let per = c.remove / c.groups as usize;
    let names: Vec<String> = (0..n_old + c.add).map(|i| format!("m{i}")).collect();
    let supply = PowerSupply::new();
    let jitter = Duration::from_micros(200);
    let devs: Vec<Arc<PowerCutDev>> = names
        .iter()
        .enumerate()
        .map(|(i, n)| {
            PowerCutDev::new(
                n.clone(),
                vec![0; size as usize],
                &supply,
                jitter,
                seed ^ i as u64,
            )
        })
        .collect();
    let spec = CreateSpec {
        name: "pc".into(),
        level: c.level,
        chunk: CHUNK,
        groups: c.groups,
        spares: 0,
        declustered: false,
        copies: 2,
        bitmap_region: Some(2 * CHUNK as u64),
        assume_clean: true,
        integrity: sbod_core::integrity::Kind::Crc32c,
        force: false,
    };
    let a = Array::create(
        spec,
        devs[..n_old]
            .iter()
            .zip(&names)
            .map(|(d, n)| spec_of(d, n))
            .collect(),
    )
    .await
    .unwrap_or_else(|e| panic!("{what}: create: {e}"));
    // The reshape runs at a few MiB a second, so the cut finds it anywhere.
    if matches!(at, Cut::Random) {
        a.update_settings(|s| s.rebuild_max_rate = 24 * MIB);
    }
    // Narrowing: the client keeps to what the narrower layout holds; a new chunk: below
    // its backup area (at most a quarter of every member).
    let blocks = match per {
        _ if c.chunk > 0 => a.size() / 2,
        0 => a.size(),
        per => a.geometry().narrowed(per).unwrap().capacity(),
    } / BLOCK;
    let model = Arc::new(tokio::sync::Mutex::new(Model::default()));
    for b in (0..blocks).step_by(3) {
        a.write(b * BLOCK, block(b, 1), true).await.unwrap();
        model.lock().await.acked(b, 1);
    }
    // A client writing with FUA throughout: what it saw acknowledged is durable.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (a, model, stop) = (a.clone(), model.clone(), stop.clone());
        let rng = Rng::new(seed + 77);
        tokio::spawn(async move {
            let mut n = 2;
            while !stop.load(std::sync::atomic::Ordering::Acquire) {
                let b = rng.below(blocks);
                n += 1;
                let mut m = model.lock().await;
                match a.write(b * BLOCK, block(b, n), true).await {
                    Ok(()) => m.acked(b, n),
                    Err(_) => m.unsure(b, n),
                }
                drop(m);
                tokio::time::sleep(Duration::from_micros(300)).await;
            }
        })
    };
    let cut_after = Duration::from_millis(rng.below(700));
    let stepped = Arc::new(std::sync::atomic::AtomicBool::new(false));
    if let Cut::Step(step, nth) = at {
        let (supply, stepped) = (supply.clone(), stepped.clone());
        let seen = std::sync::atomic::AtomicUsize::new(0);
        let f: sbod_core::process::ReshapeHook = Arc::new(move |s, _pos| {
            if s != step {
                return;
            }
            if seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == nth {
                stepped.store(true, std::sync::atomic::Ordering::SeqCst);
                supply.cut(seed);
            }
        });
        a.on_reshape_step(f);
    }
    let removed: Vec<String> = (0..n_old)
        .filter(|i| c.remove > 0 && i % c.width >= c.width - per)
        .map(|i| names[i].clone())
        .collect();
    let grow = {
        let a = a.clone();
        let removed = removed.clone();
        let specs: Vec<MemberSpec> = devs[n_old..]
            .iter()
            .zip(&names[n_old..])
            .map(|(d, n)| spec_of(d, n))
            .collect();
        let (new_groups, to, chunk) = (c.new_groups, c.to, c.chunk);
        tokio::spawn(async move {
            match removed.is_empty() {
                _ if chunk > 0 => a.grow_chunk(chunk, false).await,
                true => a.grow_to(to, specs, new_groups, false).await,
                false => a.grow_remove(&removed, false).await,
            }
        })
    };
    let (during, backup) = match at {
        Cut::Random => {
            tokio::time::sleep(cut_after).await;
            // A level change rebuilds its new parity member instead of reshaping.
            let during = match c.to {
                None => a.status().state == sbod_core::array::ArrayState::Reshaping,
                Some(_) => a.status().state != sbod_core::array::ArrayState::Optimal,
            };
            let backup = a
                .current_process()
                .is_some_and(|p| p.status().done < 4 * MIB && !p.is_finished());
            supply.cut(seed);
            (during, backup)
        }
        Cut::Step(..) => {
            // Until the hook cuts the power (or the reshape ends without reaching it).
            for _ in 0..20_000 {
                if stepped.load(std::sync::atomic::Ordering::SeqCst)
                    || (grow.is_finished()
                        && a.status().state != sbod_core::array::ArrayState::Reshaping)
                {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            supply.cut(seed);
            (stepped.load(std::sync::atomic::Ordering::SeqCst), false)
        }
    };
    stop.store(true, std::sync::atomic::Ordering::Release);
    writer.await.unwrap();
    let grown = grow.await.unwrap();
    a.abandon().await;

    // What the members kept, on new devices.
    let supply = PowerSupply::new();
    let again: Vec<Arc<PowerCutDev>> = devs
        .iter()
        .zip(&names)
        .map(|(d, n)| PowerCutDev::new(n.clone(), d.image(), &supply, Duration::ZERO, seed))
        .collect();
    let all = || -> Vec<MemberSpec> {
        again
            .iter()
            .zip(&names)
            .map(|(d, n)| spec_of(d, n))
            .collect()
    };
    let mut whole = true;
    // Narrowing: the members let go are wiped once the others record the narrower layout;
    // if the cut came between the two, a stale one must not be taken back.
    let all = || -> Vec<MemberSpec> {
        let mut v = all();
        if c.remove > 0 && grow_done(&removed, &again, &names) {
            v.retain(|s| !removed.contains(&s.path));
        }
        v
    };
    let a = match Array::assemble(all(), AssembleOptions::default()).await {
        Ok(a) => a,
        Err(e) => {
            // The power went while the grow was being recorded: the members it did not
            // reach carry no superblock (new ones) and are left out; without them the
            // array starts degraded (or as it was, if no member recorded the grow).
            let mut with_sb = Vec::new();
            for s in all() {
                if sbod_core::read_superblock(&s.dev).await.is_ok() {
                    with_sb.push(s);
                }
            }
            assert!(
                with_sb.len() < n_old + c.add,
                "{what}: assembly failed: {e}"
            );
            whole = false;
            Array::assemble(
                with_sb,
                AssembleOptions {
                    degraded: true,
                    ..Default::default()
                },
            )
            .await
            .unwrap_or_else(|e| {
                panic!("{what}: assembly of the members that hold a superblock: {e}")
            })
        }
    };
    if let (Ok(GrowOutcome::Reshaping { .. }), true) = (&grown, whole) {
        assert!(
            a.geometry().width as usize * a.geometry().groups as usize + c.remove == n_old + c.add,
            "{what}: an acknowledged grow was lost: {:?}",
            a.geometry()
        );
        if c.chunk > 0 {
            assert_eq!(
                a.geometry().chunk,
                c.chunk,
                "{what}: an acknowledged new chunk was lost"
            );
        }
    }
    if let (Ok(GrowOutcome::Parity { level, .. }), true) = (&grown, whole) {
        assert_eq!(
            a.geometry().level,
            *level,
            "{what}: an acknowledged level change was lost"
        );
    }
    // Let it finish (the reshape, or the new parity's rebuild).
    for _ in 0..30_000 {
        let st = a.status().state;
        if st != sbod_core::array::ArrayState::Reshaping
            && (!whole || st == sbod_core::array::ArrayState::Optimal)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let st = a.status();
    if whole {
        assert_eq!(
            st.state,
            sbod_core::array::ArrayState::Optimal,
            "{what}: {st:?}"
        );
    }
    let m = model.lock().await;
    let size = a.size();
    let mut buf_at = 0;
    while buf_at < size {
        let len = (size - buf_at).min(MIB);
        let got = a
            .read(buf_at, len as usize)
            .await
            .unwrap_or_else(|e| panic!("{what}: read at {buf_at}: {e}"));
        for (i, x) in got.chunks(BLOCK as usize).enumerate() {
            let b = buf_at / BLOCK + i as u64;
            assert!(
                m.allows(b, x),
                "{what}: block {b} holds bytes no acknowledged write left there (cut after {cut_after:?})"
            );
        }
        buf_at += len;
    }
    if whole {
        let h = a.start_scrub(false).expect("scrub");
        h.wait().await;
        let s = h.status();
        assert!(s.error.is_none() && s.mismatches == 0, "{what}: {s:?}");
    }
    a.close().await.unwrap();
    (during, during && backup)
}

/// Whether a member let go by a narrowing was wiped (the narrowing ended before the cut).
fn grow_done(removed: &[String], devs: &[Arc<PowerCutDev>], names: &[String]) -> bool {
    // Wiped: both superblock copies zero. (Events alternate between the copies, so one
    // copy is still blank on a member cut before its second superblock write: it was not
    // let go. Looking at the first copy only took such a member for wiped, and left it
    // out of an assembly that needed it.)
    let copy = sbod_core::superblock::COPY_SIZE;
    removed.iter().any(|r| {
        let i = names.iter().position(|n| n == r).unwrap();
        let image = devs[i].image();
        [0, copy]
            .iter()
            .all(|&at| image[at..at + 8192].iter().all(|&b| b == 0))
    })
}
