//! Checksums on every block (`--integrity crc32c`): members that return wrong bytes (bit
//! flips on the medium, lost writes, misdirected writes, stale blocks put back) are caught
//! on read, on every level. Where there is redundancy the client gets the right bytes, the
//! block is rewritten in place and the member is charged (and failed past
//! `max_checksum_errors`); where there is none the client gets EIO. Never the wrong bytes.

mod torture_util;

use sbod_core::dev::{BlockDev, MemDev};
use sbod_core::integrity::Kind;
use sbod_core::{AlignedBuf, Array, CreateSpec, Level};
use sbod_testkit::fault::{self, FaultDev, FaultPlan};
use std::sync::Arc;
use torture_util::{pattern, specs, BLOCK, CHUNK, MIB};

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
        self.a.geometry.data_offset
    }

    fn redundant(&self) -> bool {
        self.a.geometry.redundancy() > 0
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
            r.a.settings.lock().max_checksum_errors = 1000;
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
                let span = r.a.geometry.member_size;
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
            r.a.settings.lock().max_checksum_errors = 1000;
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
            r.a.settings.lock().max_checksum_errors = 1000;
            let size = r.a.size() as usize;
            let mut data = pattern(size, 7);
            r.a.write(0, AlignedBuf::from_slice(&data), false)
                .await
                .unwrap();
            let sd = r.a.geometry.stripe_data() as usize;
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
        r.a.settings.lock().max_checksum_errors = 1000;
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
