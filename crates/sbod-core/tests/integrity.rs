//! Checksums on every block (`--integrity crc32c`): members that return wrong bytes (bit
//! flips on the medium, lost writes, misdirected writes, stale blocks put back) are caught
//! on read, on every level. Where there is redundancy the client gets the right bytes, the
//! block is rewritten in place and the member is charged (and failed past
//! `max_checksum_errors`); where there is none the client gets EIO. Never the wrong bytes.

use crate::torture_util;

use sbod_core::dev::{BlockDev, MemDev};
use sbod_core::integrity::Kind;
use sbod_core::{AlignedBuf, Array, CreateSpec, Level};
use sbod_testkit::fault::{self, FaultDev, FaultPlan};
use std::sync::Arc;
use torture_util::{blocks_of, pattern, specs, BLOCK, CHUNK, MIB};

fn rt() -> tokio::runtime::Runtime {
    torture_util::rt(2)
}

/// (level, members, copies): every level.
fn levels() -> Vec<(Level, usize, u32)> {
    vec![
        (Level::Raid0, 2, 2),
        (Level::Concat, 2, 2),
        (Level::Raid1, 2, 2),
        (Level::Raid1, 3, 2),
        (Level::Raid10, 4, 2),
        (Level::Raid5, 3, 2),
        (Level::Raid6, 5, 2),
        (Level::Ec { k: 3, m: 2 }, 5, 2),
    ]
}

struct Rig {
    a: Arc<Array>,
    devs: Vec<Arc<FaultDev>>,
}

async fn rig(level: Level, n: usize, copies: u32) -> Rig {
    let devs: Vec<Arc<FaultDev>> = (0..n)
        .map(|i| {
            let m: Arc<dyn BlockDev> = Arc::new(MemDev::new(format!("m{i}"), 3 * MIB));
            Arc::new(FaultDev::new(m, i as u64))
        })
        .collect();
    let spec = CreateSpec {
        name: "t".into(),
        level,
        chunk: CHUNK,
        groups: 1,
        spares: 0,
        declustered: false,
        copies,
        bitmap_region: None,
        assume_clean: true,
        integrity: Kind::Crc32c,
        force: false,
    };
    let a = Array::create(spec, specs(&devs)).await.unwrap();
    assert_eq!(a.integrity(), Kind::Crc32c);
    Rig { a, devs }
}

impl Rig {
    fn data_offset(&self) -> u64 {
        self.a.geometry().data_offset
    }

    fn redundant(&self) -> bool {
        self.a.geometry().redundancy() > 0
    }

    /// Read the volume block by block: every block that reads must be `want`'s; returns
    /// the blocks that answered an error.
    async fn check(&self, want: &[u8], what: &str) -> Vec<usize> {
        let mut eio = Vec::new();
        for b in 0..want.len() / BLOCK {
            match self.a.read((b * BLOCK) as u64, BLOCK).await {
                Ok(got) => assert!(
                    got[..] == want[b * BLOCK..(b + 1) * BLOCK],
                    "{what}: block {b} read back bytes that were not written"
                ),
                Err(_) => eio.push(b),
            }
        }
        eio
    }

    /// Read `want` back after one block of a member went bad: with redundancy every
    /// block reads right, without it that one block answers EIO.
    async fn check_one_bad(&self, want: &[u8], what: &str) {
        let eio = self.check(want, what).await;
        assert_eq!(eio.len(), usize::from(!self.redundant()), "{what}: {eio:?}");
    }

    fn cksum(&self, i: usize) -> u64 {
        self.a.status().members[i].checksum_errors
    }

    fn state(&self, i: usize) -> String {
        self.a.status().members[i].state.to_string()
    }
}

/// Bit flips on one member's medium, in data blocks: caught on read, repaired from
/// redundancy (a second read finds nothing), counted; EIO without redundancy.
#[test]
fn bit_flips_are_caught_on_read_and_repaired() {
    for (level, n, copies) in levels() {
        rt().block_on(async {
            let r = rig(level, n, copies).await;
            r.a.update_settings(|s| s.max_checksum_errors = 1000);
            let size = r.a.size() as usize;
            let data = pattern(size, 1);
            r.a.write(0, AlignedBuf::from_slice(&data), false)
                .await
                .unwrap();
            r.a.flush().await.unwrap();
            // Three blocks of member 0 (data or parity, whatever it holds there).
            for off in [0u64, 5 * BLOCK as u64, 40 * BLOCK as u64 + 17] {
                r.devs[0].corrupt(r.data_offset() + off, 0x10).unwrap();
            }
            let eio = r.check(&data, &format!("{level}")).await;
            if r.redundant() {
                assert!(eio.is_empty(), "{level}: {eio:?}");
                let found = r.cksum(0);
                assert!(found >= 1, "{level}: nothing counted");
                // A scrub finds whatever reads did not touch (parity), and repairs it.
                let h = r.a.start_scrub(true).unwrap();
                h.wait().await;
                assert!(h.status().error.is_none(), "{level}: {:?}", h.status());
                let after = r.cksum(0);
                assert_eq!(after, 3, "{level}: three bad blocks, each counted once");
                // All repaired: reading again and scrubbing again find nothing.
                assert!(r.check(&data, &format!("{level}")).await.is_empty());
                let h = r.a.start_scrub(false).unwrap();
                h.wait().await;
                assert_eq!(h.status().mismatches, 0, "{level}");
                assert_eq!(r.cksum(0), 3, "{level}: a repaired block failed again");
                assert_eq!(r.state(0), "active", "{level}");
            } else {
                // Exactly the blocks of member 0 that were flipped.
                assert_eq!(eio.len(), 3, "{level}: {eio:?}");
                assert_eq!(r.check(&data, "again").await, eio, "{level}");
                assert_eq!(r.state(0), "active", "{level}: no redundancy, not failed");
                // The scrub names them too.
                let h = r.a.start_scrub(false).unwrap();
                h.wait().await;
                assert_eq!(h.status().mismatches, 3, "{level}: {:?}", h.status());
            }
            r.a.close().await.unwrap();
        });
    }
}

/// A member that acknowledges writes and drops them (lost writes), or lands them
/// elsewhere (misdirected writes): its blocks fail against the new tags. With redundancy
/// the client gets the new data and the member is failed past `max_checksum_errors`;
/// without, EIO for that member's blocks.
#[test]
fn lost_and_misdirected_writes_never_reach_the_client() {
    for misdirect in [false, true] {
        for (level, n, copies) in levels() {
            rt().block_on(async {
                let r = rig(level, n, copies).await;
                let what = format!("{level} misdirected={misdirect}");
                let size = r.a.size() as usize;
                let old = pattern(size, 2);
                r.a.write(0, AlignedBuf::from_slice(&old), false)
                    .await
                    .unwrap();
                r.a.flush().await.unwrap();
                let d0 = r.data_offset();
                let span = r.a.geometry().member_size;
                let mut plan = FaultPlan::default();
                if misdirect {
                    // Writes to the first half of member 0's data land 8 chunks further on.
                    plan.misdirected_writes = vec![(d0..d0 + span / 2, 8 * CHUNK as i64)];
                } else {
                    plan.lost_writes = std::iter::once(d0..d0 + span).collect();
                }
                r.devs[0].set_plan(plan);
                // Rewrite the first half of the volume.
                let half = size / 2 / BLOCK * BLOCK;
                let mut new = old.clone();
                new[..half].copy_from_slice(&pattern(half, 3));
                r.a.write(0, AlignedBuf::from_slice(&new[..half]), true)
                    .await
                    .unwrap();
                r.devs[0].set_plan(FaultPlan::default());
                let st = r.devs[0].stats();
                let hit = st.lost_writes.load(std::sync::atomic::Ordering::Relaxed)
                    + st.misdirected_writes
                        .load(std::sync::atomic::Ordering::Relaxed);
                assert!(hit > 0, "{what}: the fault never fired");
                let eio = r.check(&new, &what).await;
                if r.redundant() {
                    assert!(eio.is_empty(), "{what}: {eio:?}");
                    assert!(r.cksum(0) > 0, "{what}");
                    assert_eq!(r.state(0), "failed", "{what}: past the limit, failed");
                    let reason = r.a.status().members[0].reason.clone().unwrap_or_default();
                    assert!(reason.contains("checksum"), "{what}: {reason}");
                } else {
                    assert!(!eio.is_empty(), "{what}");
                    assert_eq!(r.state(0), "active", "{what}");
                }
                r.a.close().await.unwrap();
            });
        }
    }
}

/// An old copy of a block put back on a member (a stale block: the data and the tag of an
/// earlier write) is caught: its tag is the new write's.
#[test]
fn a_stale_block_put_back_is_caught() {
    for (level, n, copies) in levels() {
        rt().block_on(async {
            let r = rig(level, n, copies).await;
            r.a.update_settings(|s| s.max_checksum_errors = 1000);
            let size = r.a.size() as usize;
            let v1 = pattern(size, 4);
            r.a.write(0, AlignedBuf::from_slice(&v1), true)
                .await
                .unwrap();
            let at = r.data_offset() + 3 * BLOCK as u64;
            let inner = r.devs[0].inner().clone();
            let stale = fault::read_all(&inner, at, BLOCK).unwrap();
            let v2 = pattern(size, 5);
            r.a.write(0, AlignedBuf::from_slice(&v2), true)
                .await
                .unwrap();
            fault::write_all(&inner, at, &stale, true).unwrap();
            r.check_one_bad(&v2, &format!("{level}")).await;
            r.a.close().await.unwrap();
        });
    }
}

/// The checksums survive a stop and a start (they are on the members), and a flip made
/// while the array was stopped is caught after it.
#[test]
fn checksums_persist_across_a_restart() {
    for (level, n, copies) in levels() {
        rt().block_on(async {
            let r = rig(level, n, copies).await;
            let size = r.a.size() as usize;
            let data = pattern(size, 6);
            r.a.write(0, AlignedBuf::from_slice(&data), false)
                .await
                .unwrap();
            r.a.close().await.unwrap();
            r.devs[0]
                .corrupt(r.data_offset() + 2 * BLOCK as u64, 1)
                .unwrap();
            let a = Array::assemble(specs(&r.devs), Default::default())
                .await
                .unwrap();
            assert_eq!(a.integrity(), Kind::Crc32c, "{level}");
            let r2 = Rig {
                a,
                devs: r.devs.clone(),
            };
            r2.check_one_bad(&data, &format!("{level}")).await;
            r2.a.close().await.unwrap();
        });
    }
}

/// Zeroing sets the tags of zero blocks: zeroed ranges read back as zeros, and a flip in
/// them is caught.
#[test]
fn zeroed_blocks_carry_the_tags_of_zeros() {
    for (level, n, copies) in levels() {
        rt().block_on(async {
            let r = rig(level, n, copies).await;
            r.a.update_settings(|s| s.max_checksum_errors = 1000);
            let size = r.a.size() as usize;
            let mut data = pattern(size, 7);
            r.a.write(0, AlignedBuf::from_slice(&data), false)
                .await
                .unwrap();
            let sd = r.a.geometry().stripe_data() as usize;
            r.a.write_zeroes(0, (2 * sd) as u64, false, true)
                .await
                .unwrap();
            r.a.write_zeroes_bytes(3 * sd as u64 + 100, 9000, false, false)
                .await
                .unwrap();
            data[..2 * sd].fill(0);
            data[3 * sd + 100..3 * sd + 9100].fill(0);
            assert!(r.check(&data, &format!("{level}")).await.is_empty());
            r.devs[0].corrupt(r.data_offset() + 1, 0x80).unwrap();
            r.check_one_bad(&data, &format!("{level}")).await;
            r.a.close().await.unwrap();
        });
    }
}

/// Mirrors: the copy whose checksum holds wins, whichever is read first, and the other is
/// rewritten from it.
#[test]
fn mirrors_take_the_copy_with_the_good_checksum() {
    rt().block_on(async {
        let r = rig(Level::Raid1, 2, 2).await;
        r.a.update_settings(|s| s.max_checksum_errors = 1000);
        let size = r.a.size() as usize;
        let data = pattern(size, 8);
        r.a.write(0, AlignedBuf::from_slice(&data), true)
            .await
            .unwrap();
        // Every block wrong on one copy or the other, never both.
        for b in 0..size / BLOCK {
            r.devs[b % 2]
                .corrupt(r.data_offset() + (b * BLOCK) as u64, 0x01)
                .unwrap();
        }
        assert!(r.check(&data, "raid1").await.is_empty());
        let read_first = r.cksum(0) + r.cksum(1);
        assert!(read_first > 0);
        // The copies no read reached are found by a scrub (and rewritten): each bad block
        // counted once.
        let h = r.a.start_scrub(false).unwrap();
        h.wait().await;
        assert_eq!(r.cksum(0) + r.cksum(1), (size / BLOCK) as u64);
        assert!(h.status().repaired > 0, "{:?}", h.status());
        // All rewritten: nothing more is found.
        assert!(r.check(&data, "raid1").await.is_empty());
        let h = r.a.start_scrub(false).unwrap();
        h.wait().await;
        assert_eq!((h.status().mismatches, h.status().repaired), (0, 0));
        assert_eq!(r.cksum(0) + r.cksum(1), (size / BLOCK) as u64);
        r.a.close().await.unwrap();
    });
}

/// How a member's tag region is damaged while the array is stopped (issue 25).
#[derive(Clone, Copy, Debug)]
enum TagDamage {
    /// 8 KiB of zeros from the start of the region (the report).
    Zeros8K,
    /// Tag block 0 wholly random.
    RandomBlock,
    /// One tag, one bit flipped.
    OneFlip,
    /// Every tag block, wholly zero.
    AllBlocksZero,
}

/// A little generator for the damage (deterministic per seed).
fn rand_u32(s: &mut u64) -> u32 {
    *s = s
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (*s >> 33) as u32
}

/// Damage member `i`'s tag region as `how` says, on the medium, with the array stopped.
/// Returns how many tags of its data blocks now disagree with the data they cover (the
/// exact count the array must find and repair).
fn damage_tags(devs: &[Arc<FaultDev>], i: usize, a: &Array, how: TagDamage) -> u64 {
    let layout = a.tag_layout().expect("checksums on");
    let d0 = a.geometry().data_offset;
    let blocks = a.geometry().member_size / BLOCK as u64;
    let inner = devs[i].inner().clone();
    let mut tags = fault::read_all(&inner, layout.offset, layout.bytes as usize).unwrap();
    let before = tags.clone();
    let mut s = 0x5eed ^ i as u64;
    match how {
        TagDamage::Zeros8K => tags[..8192].fill(0),
        TagDamage::RandomBlock => {
            for t in tags[..4096].chunks_mut(4) {
                // Never 0 or 1 (those mean "unwritten" and "unknown").
                t.copy_from_slice(&(rand_u32(&mut s) | 2).to_le_bytes());
            }
        }
        TagDamage::OneFlip => tags[4 * 7 + 2] ^= 0x10,
        TagDamage::AllBlocksZero => tags.fill(0),
    }
    fault::write_all(&inner, layout.offset, &tags, true).unwrap();
    // The data blocks whose tag now fails: changed and not "unknown", and not zeros
    // under a zero tag (the pattern written has none).
    let mut n = 0;
    for b in 0..blocks {
        let at = b as usize * 4;
        let (old, new) = (&before[at..at + 4], &tags[at..at + 4]);
        if old != new {
            let data = fault::read_all(&inner, d0 + b * BLOCK as u64, BLOCK).unwrap();
            assert!(data.iter().any(|&x| x != 0), "the data there is not zeros");
            assert_ne!(u32::from_le_bytes(new.try_into().unwrap()), 1);
            n += 1;
        }
    }
    assert!(n > 0, "{how:?}: nothing was damaged");
    n
}

async fn rig_sized(level: Level, n: usize, copies: u32, member: u64) -> Rig {
    let devs: Vec<Arc<FaultDev>> = (0..n)
        .map(|i| {
            let m: Arc<dyn BlockDev> = Arc::new(MemDev::new(format!("m{i}"), member));
            Arc::new(FaultDev::new(m, i as u64))
        })
        .collect();
    let spec = CreateSpec {
        name: "t".into(),
        level,
        chunk: CHUNK,
        groups: 1,
        spares: 0,
        declustered: false,
        copies,
        bitmap_region: None,
        assume_clean: true,
        integrity: Kind::Crc32c,
        force: false,
    };
    let a = Array::create(spec, specs(&devs)).await.unwrap();
    Rig { a, devs }
}

impl Rig {
    fn tags(&self, i: usize) -> u64 {
        self.a.status().members[i].tag_errors
    }

    async fn restart(self) -> Rig {
        self.a.close().await.unwrap();
        let a = Array::assemble(specs(&self.devs), Default::default())
            .await
            .unwrap();
        Rig { a, devs: self.devs }
    }

    async fn scrub(&self, repair: bool) -> sbod_core::process::ProcessStatus {
        let h = self.a.start_scrub(repair).unwrap();
        h.wait().await;
        h.status()
    }
}

/// Issue 25: a member whose tag region was damaged (zeros, random bytes, one flipped tag,
/// every tag block) while the array was stopped holds right data. With redundancy every
/// byte reads right, its tags are rewritten and counted as tags repaired (exactly the
/// damaged ones, after a read of everything and a scrub), and no member is failed or
/// charged a checksum error; the repaired tags survive a restart. Without redundancy
/// (raid0, concat) nothing can judge: the damaged blocks answer EIO, never other bytes,
/// and the member stays.
#[test]
fn damaged_tags_do_not_fail_a_healthy_member() {
    for how in [
        TagDamage::Zeros8K,
        TagDamage::RandomBlock,
        TagDamage::OneFlip,
        TagDamage::AllBlocksZero,
    ] {
        for (level, n, copies) in levels() {
            rt().block_on(async {
                let what = format!("{level} {how:?}");
                // 6 MiB members: two tag blocks each.
                let r = rig_sized(level, n, copies, 6 * MIB).await;
                assert!(r.a.geometry().member_size > 4 * MIB, "two tag blocks");
                let size = r.a.size() as usize;
                let data = pattern(size, 11);
                r.a.write(0, AlignedBuf::from_slice(&data), false)
                    .await
                    .unwrap();
                r.a.close().await.unwrap();
                let damaged = damage_tags(&r.devs, 0, &r.a, how);
                let a = Array::assemble(specs(&r.devs), Default::default())
                    .await
                    .unwrap();
                let r = Rig { a, devs: r.devs };
                let eio = r.check(&data, &what).await;
                let members = r.a.status().members.len();
                if !r.redundant() {
                    // Each damaged tag costs its block an EIO, nothing more.
                    assert_eq!(eio.len() as u64, damaged, "{what}");
                    assert_eq!(r.state(0), "active", "{what}");
                    assert_eq!(r.tags(0), 0, "{what}: nothing to judge by");
                    r.a.close().await.unwrap();
                    return;
                }
                assert!(eio.is_empty(), "{what}: {eio:?}");
                // Whatever the reads did not reach (other copies read, parity) the scrub
                // finds; tags are not mismatches.
                let s = r.scrub(false).await;
                assert!(s.error.is_none(), "{what}: {s:?}");
                assert_eq!(s.mismatches, 0, "{what}: {s:?}");
                assert_eq!(r.tags(0), damaged, "{what}: each damaged tag counted once");
                assert!(s.tags_repaired <= damaged, "{what}: {s:?}");
                for i in 0..members {
                    assert_eq!(r.state(i), "active", "{what}: member {i}");
                    assert_eq!(r.cksum(i), 0, "{what}: member {i} charged");
                    if i != 0 {
                        assert_eq!(r.tags(i), 0, "{what}: member {i}");
                    }
                }
                let s = r.scrub(false).await;
                assert_eq!((s.mismatches, s.tags_repaired), (0, 0), "{what}: {s:?}");
                // The tags rewritten are on the medium: a restart finds nothing wrong.
                let r = r.restart().await;
                assert!(r.check(&data, &what).await.is_empty(), "{what}");
                let s = r.scrub(false).await;
                assert_eq!((s.mismatches, s.tags_repaired), (0, 0), "{what}: {s:?}");
                for i in 0..members {
                    assert_eq!((r.cksum(i), r.tags(i)), (0, 0), "{what}: member {i}");
                }
                r.a.close().await.unwrap();
            });
        }
    }
}

/// Random operations (writes, reads, restarts, scrubs) with random damage: to the tag
/// regions of any member (zeros, random bytes, a flipped bit; on the medium, while the
/// array is stopped) and to the data of one member, the "bad" one (bit flips, while it
/// runs). Every read returns the last acknowledged bytes (or, for a write that failed,
/// the bytes before or after it) or an error, never others; no member but the bad one is
/// ever failed; the tag damage is found and repaired (tags repaired counted: the fault
/// fired). `SBOD_TORTURE_ITERS` rounds per level (default 2), `SBOD_TORTURE_SEED` replays.
#[test]
fn torture_tag_and_data_damage() {
    use sbod_testkit::fault::Rng;
    use torture_util::decode;
    let seed = torture_util::seed();
    let rounds = torture_util::iters(2);
    let (mut reads, mut eios, mut tag_hits, mut flips, mut tag_damage) = (0u64, 0u64, 0, 0, 0);
    for (li, (level, n, copies)) in levels().into_iter().enumerate() {
        if matches!(level, Level::Raid0 | Level::Concat) {
            continue;
        }
        for round in 0..rounds {
            let s = seed ^ (li as u64) << 40 ^ round << 20;
            let what = format!("{level} seed {seed} round {round}");
            rt().block_on(async {
                let rng = Rng::new(s);
                let mut r = rig_sized(level, n, copies, 6 * MIB).await;
                let blocks = r.a.size() / BLOCK as u64;
                let bad = rng.below(n as u64) as usize;
                // Allowed writers per block (`fill`'s tag).
                let mut allowed: Vec<Vec<u64>> = vec![vec![1]; blocks as usize];
                let mut next_tag = 2u64;
                let first = blocks_of(1, 0, blocks);
                r.a.write(0, AlignedBuf::from_slice(&first), false)
                    .await
                    .unwrap();
                let read_check = |got: &[u8], at: u64, allowed: &[Vec<u64>]| {
                    for (i, b) in got.chunks(BLOCK).enumerate() {
                        let blk = at + i as u64;
                        let t = decode(b, blk);
                        assert!(
                            t.is_some_and(|t| allowed[blk as usize].contains(&t)),
                            "{what}: block {blk} read {t:?}, allowed {:?}",
                            allowed[blk as usize]
                        );
                    }
                };
                for _ in 0..60 {
                    match rng.below(100) {
                        0..=34 => {
                            let len = 1 + rng.below(16.min(blocks));
                            let at = rng.below(blocks - len + 1);
                            let t = next_tag;
                            next_tag += 1;
                            let buf = blocks_of(t, at, len);
                            let ok =
                                r.a.write(at * BLOCK as u64, AlignedBuf::from_slice(&buf), false)
                                    .await
                                    .is_ok();
                            for b in at..at + len {
                                let v = &mut allowed[b as usize];
                                if ok {
                                    *v = vec![t];
                                } else {
                                    v.push(t);
                                }
                            }
                        }
                        35..=69 => {
                            let len = 1 + rng.below(64.min(blocks));
                            let at = rng.below(blocks - len + 1);
                            reads += 1;
                            match r.a.read(at * BLOCK as u64, len as usize * BLOCK).await {
                                Ok(got) => read_check(&got, at, &allowed),
                                Err(_) => eios += 1,
                            }
                        }
                        70..=79 => {
                            // A bit flip in the bad member's data.
                            let m = r.a.geometry().member_size;
                            let off = r.data_offset() + rng.below(m);
                            r.devs[bad].corrupt(off, 1 << rng.below(8)).unwrap();
                            flips += 1;
                        }
                        80..=91 => {
                            // Stop, damage a tag region, start.
                            r.a.close().await.unwrap();
                            let layout = r.a.tag_layout().unwrap();
                            let used = sbod_core::integrity::TagLayout::bytes_for(
                                r.a.geometry().member_size,
                            );
                            let i = rng.below(n as u64) as usize;
                            let inner = r.devs[i].inner().clone();
                            let len = match rng.below(3) {
                                0 => 1,
                                1 => 4 * (1 + rng.below(64)),
                                _ => 4096,
                            };
                            let at = rng.below(used - len + 1);
                            let mut t =
                                fault::read_all(&inner, layout.offset + at, len as usize).unwrap();
                            match rng.below(3) {
                                0 => t.fill(0),
                                1 => t.iter_mut().for_each(|x| *x = rng.next() as u8),
                                _ => t[0] ^= 1 << rng.below(8),
                            }
                            fault::write_all(&inner, layout.offset + at, &t, true).unwrap();
                            tag_damage += 1;
                            let a = Array::assemble(specs(&r.devs), Default::default())
                                .await
                                .unwrap();
                            r = Rig { a, devs: r.devs };
                        }
                        92..=95 => {
                            let h = r.a.start_scrub(rng.chance(0.5));
                            if let Ok(h) = h {
                                h.wait().await;
                            }
                        }
                        _ => r = r.restart().await,
                    }
                    for i in (0..n).filter(|&i| i != bad) {
                        assert_eq!(r.state(i), "active", "{what}: member {i} failed");
                    }
                }
                // Everything, then a repairing scrub, then everything again.
                for pass in 0..2 {
                    for at in (0..blocks).step_by(64) {
                        let len = 64.min(blocks - at);
                        reads += 1;
                        match r.a.read(at * BLOCK as u64, len as usize * BLOCK).await {
                            Ok(got) => read_check(&got, at, &allowed),
                            Err(_) => eios += 1,
                        }
                    }
                    if pass == 0 {
                        if let Ok(h) = r.a.start_scrub(true) {
                            h.wait().await;
                        }
                    }
                }
                for i in (0..n).filter(|&i| i != bad) {
                    assert_eq!(r.state(i), "active", "{what}: member {i} failed");
                }
                tag_hits += (0..n).map(|i| r.tags(i)).sum::<u64>();
                r.a.close().await.unwrap();
            });
        }
    }
    println!(
        "torture figures: reads {reads}, eio {eios}, tag damage {tag_damage}, data flips {flips}, tags repaired {tag_hits}"
    );
    assert!(tag_damage > 0 && tag_hits > 0, "the tag damage never fired");
}

/// Tag damage on one member and real data damage on another in the same stripes: tag
/// block 0 of member 0 zeroed (right data under wrong tags), three data blocks of member
/// 1 flipped (wrong data under right tags) inside the span it covers. Never wrong bytes.
/// Where two members may be lost (raid1 x3, raid6, ec 3+2) everything reads right and
/// the counts are exact: member 0's tags repaired, member 1's three blocks charged as
/// checksum errors. Where one may (raid1 x2, raid10, raid5) a row with both is EIO
/// (nothing tells the two apart), and member 0 is charged for what nothing judged but
/// never failed for it.
#[test]
fn tag_damage_and_data_damage_in_one_stripe() {
    for (level, n, copies) in levels() {
        if matches!(level, Level::Raid0 | Level::Concat) {
            continue;
        }
        rt().block_on(async {
            let what = format!("{level}");
            let r = rig_sized(level, n, copies, 6 * MIB).await;
            let size = r.a.size() as usize;
            let data = pattern(size, 12);
            r.a.write(0, AlignedBuf::from_slice(&data), false)
                .await
                .unwrap();
            r.a.close().await.unwrap();
            let damaged = damage_tags(&r.devs, 0, &r.a, TagDamage::RandomBlock);
            let d0 = r.a.geometry().data_offset;
            for b in [3u64, 100, 700] {
                r.devs[1].corrupt(d0 + b * BLOCK as u64 + 5, 0x40).unwrap();
            }
            let a = Array::assemble(specs(&r.devs), Default::default())
                .await
                .unwrap();
            let r = Rig { a, devs: r.devs };
            let eio = r.check(&data, &what).await;
            let two = r.a.geometry().redundancy() >= 2;
            if two {
                assert!(eio.is_empty(), "{what}: {eio:?}");
                assert_eq!((r.cksum(0), r.tags(1)), (0, 0), "{what}");
            } else {
                // At most the blocks of the three rows, both members' (parity elsewhere).
                assert!(eio.len() <= 6, "{what}: {eio:?}");
            }
            // The scrub judges every row, those too.
            let charged = r.cksum(0);
            let s = r.scrub(true).await;
            assert!(s.error.is_none(), "{what}: {s:?}");
            assert_eq!(
                r.tags(0),
                damaged,
                "{what}: every damaged tag repaired, once"
            );
            assert_eq!(r.cksum(0), charged, "{what}: the scrub charged member 0");
            if two {
                assert_eq!((r.cksum(1), r.tags(1)), (3, 0), "{what}");
            } else {
                assert!(r.cksum(1) >= 3, "{what}");
            }
            assert!(r.check(&data, &what).await.is_empty(), "{what}");
            let s = r.scrub(false).await;
            assert_eq!((s.mismatches, s.tags_repaired), (0, 0), "{what}: {s:?}");
            for i in 0..n {
                assert_eq!(r.state(i), "active", "{what}: member {i}");
            }
            r.a.close().await.unwrap();
        });
    }
}
