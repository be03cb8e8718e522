//! The I/O path never trusts a member that shrinks or lies, and never fails one whose file
//! system is merely full: members truncated while the array runs (in memory and as real
//! files), short reads, ENOSPC from thin members sharing their space, and the stripes a
//! write leaves inconsistent when it reaches some members only.

use crate::torture_util;
use torture_util::pattern;

use sbod_core::dev::{self, file, BlockDev, MemDev};
use sbod_core::error::Step;
use sbod_core::placement::StripeAddr;
use sbod_core::{AlignedBuf, Array, CreateSpec, Error, Level, MemberSpec};
use sbod_testkit::fault::{FaultDev, SpacePool};
use std::sync::Arc;
use std::time::Duration;

const MIB: u64 = 1 << 20;
const CHUNK: u32 = 16384;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn spec(level: Level, copies: u32) -> CreateSpec {
    CreateSpec {
        name: "t".into(),
        level,
        chunk: CHUNK,
        groups: 1,
        spares: 0,
        declustered: false,
        copies,
        bitmap_region: None,
        assume_clean: true,
        integrity: sbod_core::integrity::Kind::Crc32c,
        force: false,
    }
}

/// (level, members, copies) of every layout with redundancy, and raid0.
fn layouts() -> Vec<(Level, usize, u32)> {
    vec![
        (Level::Raid1, 2, 2),
        (Level::Raid10, 4, 2),
        (Level::Raid5, 3, 2),
        (Level::Raid6, 5, 2),
        (Level::Ec { k: 3, m: 2 }, 5, 2),
    ]
}

/// Members that behave as files (`is_file`: the engine checks their size after writes).
fn mem_specs(devs: &[Arc<MemDev>]) -> Vec<MemberSpec> {
    devs.iter()
        .map(|d| MemberSpec {
            dev: d.clone() as Arc<dyn BlockDev>,
            path: d.name().to_string(),
            is_file: true,
            domain: String::new(),
        })
        .collect()
}

fn member_state(a: &Array, path: &str) -> (String, Option<String>) {
    let s = a.status();
    let m = s
        .members
        .iter()
        .find(|m| m.path.as_deref() == Some(path))
        .expect("member listed");
    (m.state.to_string(), m.reason.clone())
}

/// Truncated while served, then read: reads past the cut reconstruct (never zeros), the
/// member is failed at once with "shrank", and nothing grows it back.
#[test]
fn a_member_that_shrinks_is_failed_at_once_and_never_read_as_zeros() {
    for (level, n, copies) in layouts() {
        rt().block_on(async {
            let devs: Vec<Arc<MemDev>> = (0..n)
                .map(|i| Arc::new(MemDev::new(format!("m{i}"), 2 * MIB + 64 * CHUNK as u64)))
                .collect();
            let a = Array::create(spec(level, copies), mem_specs(&devs))
                .await
                .unwrap();
            let size = a.size() as usize;
            let data = pattern(size, 1);
            a.write(0, AlignedBuf::from_slice(&data), false)
                .await
                .unwrap();
            let g = &a.geometry();
            let cut = g.data_offset + g.member_size / 2;
            devs[1].truncate(cut);
            let got = a.read(0, size).await.unwrap();
            assert!(got[..] == data[..], "{level}: wrong data after the cut");
            let (state, why) = member_state(&a, "m1");
            assert_eq!(state, "failed", "{level}");
            assert!(
                why.as_deref().unwrap_or("").contains("shrank"),
                "{level}: {why:?}"
            );
            assert_eq!(
                devs[1].current_size().unwrap(),
                cut,
                "{level}: the shrunk member was written again"
            );
            // It stays out; the array goes on.
            let more = pattern(size, 2);
            a.write(0, AlignedBuf::from_slice(&more), true)
                .await
                .unwrap();
            assert!(a.read(0, size).await.unwrap()[..] == more[..], "{level}");
            assert_eq!(devs[1].current_size().unwrap(), cut, "{level}");
            a.close().await.unwrap();
        });
    }
}

/// Truncated, then written before anything reads: a write past the cut grows the member
/// back with a hole of zeros, so the engine checks the size after each write and fails
/// the member before the write is acknowledged; a write to its very last block (which
/// would grow it back whole) is checked before. Every read afterwards is the data.
#[test]
fn a_write_past_the_cut_fails_the_member_before_it_is_acknowledged() {
    for (level, n, copies) in layouts() {
        for last_block in [false, true] {
            rt().block_on(async {
                let devs: Vec<Arc<MemDev>> = (0..n)
                    .map(|i| Arc::new(MemDev::new(format!("m{i}"), 2 * MIB + 64 * CHUNK as u64)))
                    .collect();
                let a = Array::create(spec(level, copies), mem_specs(&devs))
                    .await
                    .unwrap();
                let size = a.size() as usize;
                let mut model = pattern(size, 3);
                a.write(0, AlignedBuf::from_slice(&model), false)
                    .await
                    .unwrap();
                let g = a.geometry().clone();
                devs[0].truncate(g.data_offset + CHUNK as u64);
                // Write every block once, in order from the end (or from just past the
                // cut): the first write that reaches member 0 past its cut must fail it.
                let blocks = size / 4096;
                let order: Vec<usize> = if last_block {
                    (0..blocks).rev().collect()
                } else {
                    (0..blocks).collect()
                };
                let mut failed_at = None;
                for (i, b) in order.into_iter().enumerate() {
                    let p = pattern(4096, 100 + b as u64);
                    a.write(b as u64 * 4096, AlignedBuf::from_slice(&p), false)
                        .await
                        .unwrap();
                    model[b * 4096..(b + 1) * 4096].copy_from_slice(&p);
                    if failed_at.is_none() && member_state(&a, "m0").0 == "failed" {
                        failed_at = Some(i);
                    }
                    // Whatever happened, every block reads back as acknowledged.
                    if i % 16 == 0 {
                        assert!(a.read(0, size).await.unwrap()[..] == model[..], "{level}");
                    }
                }
                assert!(
                    failed_at.is_some(),
                    "{level}: the shrunk member stayed in service"
                );
                let (_, why) = member_state(&a, "m0");
                assert!(why.unwrap().contains("shrank"), "{level}");
                assert!(a.read(0, size).await.unwrap()[..] == model[..], "{level}");
                a.close().await.unwrap();
            });
        }
    }
}

/// Without redundancy there is nothing to read instead: reads past the cut fail (the
/// array fails), they never return zeros.
#[test]
fn raid0_with_a_shrunk_member_fails_rather_than_returning_zeros() {
    rt().block_on(async {
        let devs: Vec<Arc<MemDev>> = (0..2)
            .map(|i| Arc::new(MemDev::new(format!("m{i}"), 2 * MIB + 64 * CHUNK as u64)))
            .collect();
        let a = Array::create(spec(Level::Raid0, 2), mem_specs(&devs))
            .await
            .unwrap();
        let size = a.size() as usize;
        let data = pattern(size, 5);
        a.write(0, AlignedBuf::from_slice(&data), false)
            .await
            .unwrap();
        devs[1].truncate(a.geometry().data_offset + 4 * CHUNK as u64);
        match a.read(0, size).await {
            Ok(got) => panic!(
                "read past the cut succeeded ({} bytes differ)",
                got.iter().zip(&data).filter(|(x, y)| x != y).count()
            ),
            Err(e) => assert!(matches!(e, Error::Io { .. } | Error::Failed(_)), "{e}"),
        }
        assert_eq!(a.status().state, "failed");
        assert!(a
            .write(size as u64 - 4096, AlignedBuf::zeroed(4096), false)
            .await
            .is_err());
        a.close().await.ok();
    });
}

/// A member truncated while nothing touches the part cut off is found by the periodic
/// check within a few seconds.
#[test]
fn the_watch_finds_a_shrunk_member_without_io() {
    rt().block_on(async {
        let devs: Vec<Arc<MemDev>> = (0..3)
            .map(|i| Arc::new(MemDev::new(format!("m{i}"), 2 * MIB + 64 * CHUNK as u64)))
            .collect();
        let a = Array::create(spec(Level::Raid5, 2), mem_specs(&devs))
            .await
            .unwrap();
        devs[2].truncate(a.geometry().data_offset + 8 * CHUNK as u64);
        let t = std::time::Instant::now();
        while member_state(&a, "m2").0 != "failed" {
            assert!(t.elapsed() < Duration::from_secs(10), "not found");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(member_state(&a, "m2").1.unwrap().contains("shrank"));
        a.close().await.unwrap();
    });
}

/// The same on real member files (O_DIRECT where the file system allows, the product's
/// queue), truncated with the file system's own truncate.
#[test]
fn a_truncated_member_file_is_failed_and_not_grown() {
    let dir = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let paths: Vec<std::path::PathBuf> = (0..3)
            .map(|i| {
                let p = dir.path().join(format!("d{i}.img"));
                std::fs::File::create(&p)
                    .unwrap()
                    .set_len(32 * MIB)
                    .unwrap();
                p
            })
            .collect();
        let opts = file::OpenOptions {
            threads: 2,
            ..Default::default()
        };
        let specs: Vec<MemberSpec> = paths
            .iter()
            .map(|p| MemberSpec {
                dev: dev::open_member(p, &opts).unwrap(),
                path: p.display().to_string(),
                is_file: true,
                domain: String::new(),
            })
            .collect();
        let mut s = spec(Level::Raid5, 2);
        s.chunk = 65536;
        let a = Array::create(s, specs).await.unwrap();
        let size = a.size() as usize;
        let data = pattern(size, 9);
        a.write(0, AlignedBuf::from_slice(&data), true)
            .await
            .unwrap();
        let victim = paths[1].display().to_string();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&paths[1])
            .unwrap()
            .set_len(16 * MIB)
            .unwrap();
        assert!(a.read(0, size).await.unwrap()[..] == data[..]);
        let (state, why) = member_state(&a, &victim);
        assert_eq!(state, "failed");
        assert!(why.unwrap().contains("shrank from 32.0 MiB to 16.0 MiB"));
        a.write(0, AlignedBuf::from_slice(&data), true)
            .await
            .unwrap();
        assert_eq!(std::fs::metadata(&paths[1]).unwrap().len(), 16 * MIB);
        assert!(a.read(0, size).await.unwrap()[..] == data[..]);
        a.close().await.unwrap();
    });
}

/// A device that reports EOF inside the data it claims to hold (short reads) is failed at
/// once, not after `max_read_errors` of them.
#[test]
fn a_short_read_fails_the_member_at_once() {
    rt().block_on(async {
        let devs: Vec<Arc<MemDev>> = (0..3)
            .map(|i| Arc::new(MemDev::new(format!("m{i}"), 2 * MIB + 64 * CHUNK as u64)))
            .collect();
        // Not a file: its size cannot change under us, but its reads come back short.
        let specs: Vec<MemberSpec> = mem_specs(&devs)
            .into_iter()
            .map(|mut s| {
                s.is_file = false;
                s
            })
            .collect();
        let a = Array::create(spec(Level::Raid5, 2), specs).await.unwrap();
        let size = a.size() as usize;
        let data = pattern(size, 4);
        a.write(0, AlignedBuf::from_slice(&data), false)
            .await
            .unwrap();
        // A device that answers with less than it holds: truncate the bytes, keep the
        // size it reports (MemDev::current_size follows the bytes, so give it a lying
        // wrapper: FaultDev reports the inner size; truncating the inner MemDev makes
        // reads short while `size()` still says the old size).
        devs[0].truncate(a.geometry().data_offset + 2 * CHUNK as u64);
        assert!(a.read(0, size).await.unwrap()[..] == data[..]);
        let (state, why) = member_state(&a, "m0");
        assert_eq!(state, "failed");
        assert!(why.is_some(), "no reason recorded");
        assert_eq!(
            a.status().members[0].read_errors,
            1,
            "failed at the first short read"
        );
        a.close().await.unwrap();
    });
}

// ------------------------------------------------------------------ out of space

struct Thin {
    pool: Arc<SpacePool>,
    devs: Vec<Arc<FaultDev>>,
}

fn thin(n: usize, member: u64, free: u64) -> Thin {
    let pool = SpacePool::new(free);
    let devs = (0..n)
        .map(|i| {
            let inner: Arc<dyn BlockDev> = Arc::new(MemDev::new(format!("t{i}"), member));
            Arc::new(FaultDev::thin(inner, i as u64, pool.clone()))
        })
        .collect();
    Thin { pool, devs }
}

impl Thin {
    fn specs(&self) -> Vec<MemberSpec> {
        self.devs
            .iter()
            .map(|d| MemberSpec {
                dev: d.clone() as Arc<dyn BlockDev>,
                path: d.name().to_string(),
                is_file: true,
                domain: String::new(),
            })
            .collect()
    }
}

/// Thin members on a file system that fills: the write that does not fit fails with
/// NoSpace (ENOSPC to an NBD client), no member is failed, everything acknowledged reads
/// back, the failed write's blocks read back old or new; once space is free the stripes
/// it left inconsistent are resynced, writes succeed again, and the array survives losing
/// a member as before.
#[test]
fn out_of_space_fails_the_write_not_the_members() {
    for (level, n, copies) in layouts() {
        rt().block_on(async {
            let member = 2 * MIB + 64 * CHUNK as u64;
            let t = thin(n, member, 4 * MIB * n as u64);
            let a = Array::create(spec(level, copies), t.specs()).await.unwrap();
            let size = a.size();
            let mut model = vec![0u8; size as usize];
            // (offset, old, new) of each refused write
            let mut refused: Vec<(usize, Vec<u8>, Vec<u8>)> = Vec::new();
            t.pool.set_free(size / 2);
            let step = 3 * 4096usize;
            let mut off = 0usize;
            let mut seed = 10;
            while off + step <= size as usize {
                let p = pattern(step, seed);
                seed += 1;
                match a.write(off as u64, AlignedBuf::from_slice(&p), false).await {
                    Ok(()) => model[off..off + step].copy_from_slice(&p),
                    Err(Error::NoSpace(msg)) => {
                        assert!(msg.advice.contains(&Step::Preallocate), "{msg}");
                        refused.push((off, model[off..off + step].to_vec(), p));
                    }
                    Err(e) => panic!("{level}: {e}"),
                }
                off += step;
            }
            assert!(!refused.is_empty(), "{level}: the pool never ran out");
            let s = a.status();
            assert_eq!(s.state, "optimal", "{level}: {:?}", s.failed_reason);
            assert!(s.members.iter().all(|m| m.state == "active"), "{level}");
            assert!(s.members.iter().map(|m| m.nospace).sum::<u64>() > 0);
            let check = |got: &[u8], model: &[u8], refused: &[(usize, Vec<u8>, Vec<u8>)]| {
                for b in 0..got.len() / 4096 {
                    let r = b * 4096..(b + 1) * 4096;
                    if got[r.clone()] == model[r.clone()] {
                        continue;
                    }
                    let ok = refused.iter().any(|(o, _, new)| {
                        r.start >= *o
                            && r.end <= o + new.len()
                            && got[r.clone()] == new[r.start - o..r.end - o]
                    });
                    assert!(ok, "{level}: block {b} is neither old nor new");
                }
            };
            check(&a.read(0, size as usize).await.unwrap(), &model, &refused);
            // Space comes back: the inconsistent stripes are resynced, a scrub finds none.
            t.pool.set_free(1 << 40);
            assert_eq!(a.resync_unsynced().await.unwrap(), 0, "{level}");
            assert_eq!(a.status().inconsistent_stripes, 0);
            // What a refused write left is now settled: take it as the model.
            let now = a.read(0, size as usize).await.unwrap();
            check(&now, &model, &refused);
            model.copy_from_slice(&now);
            let h = a.start_scrub(false).unwrap();
            h.wait().await;
            assert_eq!(h.status().mismatches, 0, "{level}: {:?}", h.status());
            // Writes go on; a member is lost; everything reads back.
            let p = pattern(size as usize / 2, 99);
            a.write(0, AlignedBuf::from_slice(&p), true).await.unwrap();
            model[..p.len()].copy_from_slice(&p);
            a.fail("t1", false).await.unwrap();
            assert!(
                a.read(0, size as usize).await.unwrap()[..] == model[..],
                "{level}"
            );
            a.close().await.unwrap();
        });
    }
}

/// A degraded group whose write runs out of space on one member: the rows are put back,
/// so what the missing member held is still rebuilt exactly. Where even that is refused,
/// reads that would rebuild from the stripe fail; they never return a guess.
#[test]
fn a_degraded_write_that_runs_out_of_space_keeps_the_missing_data() {
    for (level, n, copies) in [(Level::Raid5, 3, 2), (Level::Raid6, 5, 2)] {
        rt().block_on(async {
            let member = 2 * MIB + 64 * CHUNK as u64;
            let t = thin(n, member, 1 << 40);
            let a = Array::create(spec(level, copies), t.specs()).await.unwrap();
            let g = a.geometry().clone();
            let (size, sd, chunk) = (a.size() as usize, g.stripe_data(), CHUNK as u64);
            // Data only in the chunks member 0 holds: the other data chunks stay
            // unallocated, so writing them needs space.
            let mut model = vec![0u8; size];
            let mut elsewhere = Vec::new();
            for st in 0..g.stripes() {
                for i in 0..g.k() {
                    let off = st * sd + i as u64 * chunk;
                    if a.placement().slot(
                        StripeAddr {
                            group: 0,
                            stripe: st,
                        },
                        i,
                    ) == 0
                    {
                        let p = pattern(chunk as usize, off);
                        a.write(off, AlignedBuf::from_slice(&p), false)
                            .await
                            .unwrap();
                        model[off as usize..(off + chunk) as usize].copy_from_slice(&p);
                    } else {
                        elsewhere.push(off);
                    }
                }
            }
            a.fail("t0", false).await.unwrap();
            let mut refused = 0;
            for (i, off) in elsewhere.iter().enumerate() {
                // None, or one block: a write that lands in part.
                t.pool.set_free(if i % 2 == 0 { 0 } else { 4096 });
                let p = pattern(8192, 300 + i as u64);
                match a.write(*off, AlignedBuf::from_slice(&p), false).await {
                    Ok(()) => model[*off as usize..*off as usize + 8192].copy_from_slice(&p),
                    Err(Error::NoSpace(_)) => refused += 1,
                    Err(e) => panic!("{level}: {e}"),
                }
            }
            assert!(refused > 0);
            t.pool.set_free(1 << 40);
            // Every block reads as acknowledged (the refused writes were put back; their
            // own blocks may read old or new). Member 0's chunks, rebuilt from the others,
            // are all exact: no refused write made them unrebuildable.
            let mut exact = 0;
            let mine_blocks = (g.stripes() * g.k() as u64 - elsewhere.len() as u64) as usize
                * (chunk as usize / 4096);
            for b in 0..size / 4096 {
                let r = b * 4096..(b + 1) * 4096;
                match a.read(r.start as u64, 4096).await {
                    Ok(got) => {
                        let off = r.start as u64 / chunk * chunk;
                        let mine = !elsewhere.contains(&off);
                        if mine {
                            assert!(
                                got[..] == model[r.clone()],
                                "{level}: rebuilt block {b} wrong"
                            );
                            exact += 1;
                        } else {
                            let i = elsewhere.iter().position(|o| *o == off).unwrap();
                            let newp = pattern(8192, 300 + i as u64);
                            let within = r.start - off as usize;
                            let new_ok = within < 8192 && got[..] == newp[within..within + 4096];
                            assert!(got[..] == model[r.clone()] || new_ok, "{level}: block {b}");
                        }
                    }
                    Err(e) => panic!("{level}: block {b}: {e}"),
                }
            }
            // Member 0 held a chunk of every stripe's data but one in three or so.
            assert!(
                exact > 0 && exact == mine_blocks,
                "{level}: {exact} of {mine_blocks}"
            );
            a.close().await.ok();
        });
    }
}

// ------------------------------------------------------------------ sub-block writes

/// Many tasks write disjoint byte ranges of the same 4 KiB blocks at once (each task owns
/// one 512-byte eighth of every block), while others overwrite whole neighbouring blocks
/// and zero byte ranges of their own: every byte ends as its last writer left it.
#[test]
fn sub_block_writes_from_many_tasks_never_lose_each_others_bytes() {
    let mut all = layouts();
    all.push((Level::Raid0, 3, 2));
    all.push((Level::Concat, 2, 2));
    for (level, n, copies) in all {
        rt().block_on(async {
            let devs: Vec<Arc<MemDev>> = (0..n)
                .map(|i| Arc::new(MemDev::new(format!("m{i}"), 2 * MIB + 64 * CHUNK as u64)))
                .collect();
            let a = Array::create(spec(level, copies), mem_specs(&devs))
                .await
                .unwrap();
            let blocks: Vec<u64> = (0..48u64).map(|i| i * 5 % (a.size() / 4096 - 1)).collect();
            let mut tasks = Vec::new();
            for t in 0..8usize {
                let a = a.clone();
                let blocks = blocks.clone();
                tasks.push(tokio::spawn(async move {
                    for round in 0..3u64 {
                        for j in 0..blocks.len() {
                            // Each task its own order, so they meet in different blocks.
                            let b = blocks[(j * 7 + t * 3 + round as usize) % blocks.len()];
                            let off = b * 4096 + t as u64 * 512;
                            let p = pattern(512, (t as u64) << 32 | b << 8 | round);
                            a.write_bytes(off, &p, round == 2 && t == 0).await.unwrap();
                        }
                    }
                }));
            }
            // Whole blocks next to them (the block after each), written aligned.
            {
                let a = a.clone();
                let blocks = blocks.clone();
                tasks.push(tokio::spawn(async move {
                    for round in 0..3u64 {
                        for b in &blocks {
                            let p = pattern(4096, 1 << 40 | b << 8 | round);
                            a.write((b + 1) * 4096, AlignedBuf::from_slice(&p), false)
                                .await
                                .unwrap();
                        }
                    }
                }));
            }
            for t in tasks {
                t.await.unwrap();
            }
            for b in &blocks {
                let got = a.read(b * 4096, 4096).await.unwrap();
                for t in 0..8u64 {
                    let want = pattern(512, t << 32 | b << 8 | 2);
                    assert!(
                        got[t as usize * 512..(t as usize + 1) * 512] == want[..],
                        "{level}: block {b}: the eighth of task {t} was lost"
                    );
                }
            }
            // Overlapping pieces in a known order, and zeroing of byte ranges.
            let b = blocks[3];
            let mut want = a.read(b * 4096, 4 * 4096).await.unwrap().to_vec();
            a.write_bytes(b * 4096 + 100, &[1u8; 3000], false)
                .await
                .unwrap();
            want[100..3100].fill(1);
            a.write_bytes(b * 4096 + 2000, &[2u8; 4000], false)
                .await
                .unwrap();
            want[2000..6000].fill(2);
            a.write_zeroes_bytes(b * 4096 + 50, 100, false, false)
                .await
                .unwrap();
            want[50..150].fill(0);
            a.write_zeroes_bytes(b * 4096 + 7000, 9000, true, true)
                .await
                .unwrap();
            want[7000..16000].fill(0);
            let got = a.read(b * 4096, 4 * 4096).await.unwrap();
            assert!(got[..] == want[..], "{level}: overlapping pieces");
            a.close().await.unwrap();
        });
    }
}

// ------------------------------------------------------------------ scrub

/// Members wrapped in fault devices, to flip bits on their medium.
fn faulty(n: usize) -> (Vec<Arc<FaultDev>>, Vec<MemberSpec>) {
    let devs: Vec<Arc<FaultDev>> = (0..n)
        .map(|i| {
            let inner: Arc<dyn BlockDev> =
                Arc::new(MemDev::new(format!("f{i}"), 2 * MIB + 64 * CHUNK as u64));
            Arc::new(FaultDev::new(inner, i as u64))
        })
        .collect();
    let specs = devs
        .iter()
        .map(|d| MemberSpec {
            dev: d.clone() as Arc<dyn BlockDev>,
            path: d.name().to_string(),
            is_file: false,
            domain: String::new(),
        })
        .collect();
    (devs, specs)
}

async fn scrub(a: &Arc<Array>, repair: bool) -> sbod_core::process::ProcessStatus {
    let h = a.start_scrub(repair).unwrap();
    h.wait().await;
    h.status()
}

/// Silent corruption on one member, in `blocks` blocks of different stripes.
fn corrupt(a: &Array, dev: &FaultDev, blocks: u64) {
    for i in 0..blocks {
        let off = a.geometry().data_offset + i * 3 * CHUNK as u64 + (i % 4) * 4096 + 17;
        dev.corrupt(off, 0x40).unwrap();
    }
}

/// A member that parity (raid6, ec:3+2) or a majority of copies (three-way raid1)
/// locates as wrong in more blocks than `max_checksum_errors` is failed by a check, not
/// left in service; below the limit the check reports it and a repair rewrites it. Two
/// copies or single parity cannot say who is wrong: nobody is blamed, a repair rewrites
/// as md does (parity from the data, the first copy over the others). Without checksums
/// (with them, every flipped block fails its own: `tests/integrity.rs`).
#[test]
fn a_scrub_never_leaves_a_located_bad_member_in_service() {
    let spec = |level, copies| CreateSpec {
        integrity: sbod_core::integrity::Kind::None,
        ..spec(level, copies)
    };
    for (level, n, copies) in [
        (Level::Raid6, 5, 2),
        (Level::Ec { k: 3, m: 2 }, 5, 2),
        (Level::Raid1, 3, 2),
    ] {
        rt().block_on(async {
            let (devs, specs) = faulty(n);
            let a = Array::create(spec(level, copies), specs).await.unwrap();
            let size = a.size() as usize;
            let data = pattern(size, 77);
            a.write(0, AlignedBuf::from_slice(&data), true)
                .await
                .unwrap();
            // Below the limit: reported, the member stays; repair rewrites it.
            corrupt(&a, &devs[2], 3);
            let s = scrub(&a, false).await;
            assert_eq!(
                (s.mismatches, s.error.as_deref()),
                (3, None),
                "{level}: {s:?}"
            );
            assert_eq!(member_state(&a, "f2").0, "active");
            assert_eq!(a.status().members[2].checksum_errors, 3, "{level}");
            let s = scrub(&a, true).await;
            assert_eq!((s.mismatches, s.repaired), (3, 3), "{level}: {s:?}");
            assert_eq!(scrub(&a, false).await.mismatches, 0, "{level}");
            // Past the limit: a check takes it out.
            corrupt(&a, &devs[2], 12);
            let s = scrub(&a, false).await;
            let err = s.error.unwrap_or_default();
            assert!(
                err.contains("f2") && err.contains("wrong data"),
                "{level}: {err}"
            );
            let (state, why) = member_state(&a, "f2");
            assert_eq!(state, "failed", "{level}");
            assert!(why.unwrap().contains("parity located"), "{level}");
            // Nobody else was blamed; every block reads back right.
            assert!(
                a.status()
                    .members
                    .iter()
                    .filter(|m| m.state == "failed")
                    .count()
                    == 1
            );
            assert!(a.read(0, size).await.unwrap()[..] == data[..], "{level}");
            a.close().await.unwrap();
        });
    }
    for (level, n) in [(Level::Raid5, 3), (Level::Raid1, 2)] {
        rt().block_on(async {
            let (devs, specs) = faulty(n);
            let a = Array::create(spec(level, 2), specs).await.unwrap();
            let data = pattern(a.size() as usize, 78);
            a.write(0, AlignedBuf::from_slice(&data), true)
                .await
                .unwrap();
            corrupt(&a, &devs[1], 12);
            let s = scrub(&a, false).await;
            assert_eq!((s.mismatches, s.error), (12, None), "{level}");
            let st = a.status();
            assert!(st
                .members
                .iter()
                .all(|m| m.state == "active" && m.checksum_errors == 0));
            let s = scrub(&a, true).await;
            assert_eq!(s.mismatches, 12, "{level}");
            assert_eq!(scrub(&a, false).await.mismatches, 0, "{level}");
            a.close().await.unwrap();
        });
    }
}

/// A stripe a refused write left inconsistent, in a group that then loses a member: the
/// missing chunk cannot be rebuilt there, so reads of it fail (never guess); overwriting
/// the stripe whole settles it.
#[test]
fn an_inconsistent_stripe_of_a_degraded_group_fails_reads_until_overwritten() {
    rt().block_on(async {
        let member = 2 * MIB + 64 * CHUNK as u64;
        let t = thin(3, member, 1 << 40);
        // Without checksums: the test punches a member's chunk behind the array's back to
        // make a rewrite need space, which checksums would (rightly) catch as corruption.
        let spec = CreateSpec {
            integrity: sbod_core::integrity::Kind::None,
            ..spec(Level::Raid5, 2)
        };
        let a = Array::create(spec, t.specs()).await.unwrap();
        let g = a.geometry().clone();
        let sd = g.stripe_data();
        // Stripe 0 written whole (allocated everywhere); then a write to part of it that
        // needs space on one member only: refused there, the stripe inconsistent.
        a.write(0, AlignedBuf::from_slice(&pattern(sd as usize, 1)), false)
            .await
            .unwrap();
        t.pool.set_free(0);
        let p = pattern(8192, 2);
        // Rewrites of allocated blocks need no space: punch one member's chunk first so
        // its rewrite does.
        let victim = a.placement().slot(
            StripeAddr {
                group: 0,
                stripe: 0,
            },
            0,
        );
        let dv: Arc<dyn BlockDev> = t.devs[victim].clone();
        sbod_core::dev::io(
            &dv,
            sbod_core::dev::IoReq {
                offset: g.data_offset,
                kind: sbod_core::dev::IoKind::Zero {
                    len: CHUNK as u64,
                    punch: true,
                },
                class: sbod_core::dev::IoClass::Foreground,
            },
        )
        .await
        .unwrap();
        t.pool.set_free(0);
        let r = a.write(0, AlignedBuf::from_slice(&p), false).await;
        assert!(
            matches!(r, Err(Error::NoSpace(_))),
            "{r:?} {:?}",
            a.status()
                .members
                .iter()
                .map(|m| m.reason.clone())
                .collect::<Vec<_>>()
        );
        assert_eq!(a.status().inconsistent_stripes, 1);
        // The other data member goes: its chunk would be rebuilt from mismatched parity.
        let other = a.placement().slot(
            StripeAddr {
                group: 0,
                stripe: 0,
            },
            1,
        );
        a.fail(&format!("t{other}"), false).await.unwrap();
        let r = a.read(CHUNK as u64, 4096).await;
        assert!(matches!(r, Err(Error::Io { .. })), "{r:?}");
        assert_eq!(
            a.resync_unsynced().await.unwrap(),
            1,
            "resynced while degraded"
        );
        // Overwritten whole: settled, and every byte reads back.
        t.pool.set_free(1 << 40);
        let whole = pattern(sd as usize, 3);
        a.write(0, AlignedBuf::from_slice(&whole), false)
            .await
            .unwrap();
        assert_eq!(a.status().inconsistent_stripes, 0);
        assert!(a.read(0, sd as usize).await.unwrap()[..] == whole[..]);
        a.close().await.unwrap();
    });
}
