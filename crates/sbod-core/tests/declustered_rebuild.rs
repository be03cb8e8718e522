//! The distributed spare space of a declustered layout (issue 27, docs/ENGINE.md,
//! "Declustered layouts"): a failed member's chunks are rebuilt into the spare space of
//! every row (the array is back to full redundancy without a new disk), a replacement
//! is filled by copying them back, and a failure beyond the spare space falls back to
//! running degraded (and a hot spare). Power cuts at random points of both transitions:
//! the array comes back, resumes from the row its superblocks recorded, and every
//! acknowledged write reads back.
//!
//! The array: raid6 in two 3+2 groups with two members' worth of spare space, spread over
//! 12 members of 2 MiB of data each (16 KiB chunks: 128 rows, moved 8 rows a window).
//! `SBOD_TORTURE_ITERS` sets the power-cut trials (default 6), `SBOD_TORTURE_SEED` the seed.

use crate::torture_util;

use sbod_core::dev::mem::MemDev;
use sbod_core::dev::{BlockDev, Done, IoClass, IoKind, IoReq};
use sbod_core::{AlignedBuf, Array, AssembleOptions, CreateSpec, Level, MemberSpec};
use sbod_testkit::fault::{FaultDev, PowerCutDev, PowerSupply, Rng};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering as AtomicOrdering};
use std::sync::Arc;
use std::time::Duration;
use torture_util::*;

const MEMBERS: usize = 12;
const BLOCK: u64 = 4096;

fn dspec() -> CreateSpec {
    CreateSpec {
        name: "decl".into(),
        level: Level::Raid6,
        chunk: CHUNK,
        groups: 2,
        spares: 2,
        declustered: true,
        copies: 2,
        bitmap_region: Some(4 * CHUNK as u64),
        assume_clean: true,
        integrity: sbod_core::integrity::Kind::Crc32c,
        force: false,
    }
}

fn mem_members(n: usize) -> Vec<Arc<MemDev>> {
    (0..n)
        .map(|i| Arc::new(MemDev::new(format!("m{i}"), MEMBER_SIZE)))
        .collect()
}

fn one<D: BlockDev + 'static>(d: &Arc<D>) -> MemberSpec {
    specs(std::slice::from_ref(d)).remove(0)
}

/// The uuid of the member recorded in a slot (replaced by it when its disk is gone).
fn uuid_of(a: &Array, slot: usize) -> String {
    a.status()
        .members
        .iter()
        .find(|m| m.slot == Some(slot) && m.state != "replacing")
        .and_then(|m| m.uuid.clone())
        .expect("a member recorded in the slot")
}

fn reason_of(a: &Array, slot: usize) -> String {
    a.status()
        .members
        .iter()
        .find(|m| m.slot == Some(slot) && m.state != "replacing")
        .and_then(|m| m.reason.clone())
        .unwrap_or_default()
}

async fn fill(a: &Array, seed: u64) -> Vec<u8> {
    let data = pattern(a.size() as usize, seed);
    for (i, c) in data.chunks(256 << 10).enumerate() {
        a.write(
            i as u64 * (256 << 10),
            AlignedBuf::from_slice(c),
            i % 7 == 0,
        )
        .await
        .unwrap();
    }
    a.flush().await.unwrap();
    data
}

fn throttle(a: &Array, rate: u64) {
    a.update_settings(|s| {
        s.rebuild_max_rate = rate;
        s.rebuild_min_rate = rate;
    });
}

/// One failure after another: each is rebuilt into the spare space (nothing reads the
/// failed member after it: its data is wiped), until the space is full; the next runs
/// degraded, and says so. The lists survive a restart; replacements are copied back,
/// last spared first, and the array ends as it began.
#[test]
fn failures_are_rebuilt_into_the_spare_space_and_copied_back() {
    rt(2).block_on(async {
        let devs = mem_members(MEMBERS);
        let a = Array::create(dspec(), specs(&devs)).await.unwrap();
        let mut data = fill(&a, 1).await;
        a.fail("m3", false).await.unwrap();
        a.rebuild_now().await.unwrap();
        assert_eq!(spared(&a), (vec![3], false));
        let st = a.status();
        assert_eq!(st.state, "optimal", "{:?}", st.members);
        assert!(reason_of(&a, 3).contains("spared"), "{}", reason_of(&a, 3));
        // Nothing reads the spared member any more.
        devs[3].with_data(|v| v[(1 << 20)..].fill(0xEE));
        check_volume(&a, &data, "m3 spared").await;
        scrub_check(&a, "m3 spared").await;
        // Writes while spared land in the spare space.
        let half = pattern(a.size() as usize / 2, 2);
        a.write(4096 * 3, AlignedBuf::from_slice(&half), false)
            .await
            .unwrap();
        data[4096 * 3..4096 * 3 + half.len()].copy_from_slice(&half);
        check_volume(&a, &data, "written while spared").await;

        a.fail("m5", false).await.unwrap();
        a.rebuild_now().await.unwrap();
        assert_eq!(spared(&a), (vec![3, 5], false));
        devs[5].with_data(|v| v[(1 << 20)..].fill(0xEE));
        check_volume(&a, &data, "m3 and m5 spared").await;
        scrub_check(&a, "m3 and m5 spared").await;

        // The spare space is full: the next failure runs degraded, and status says so.
        a.fail("m7", false).await.unwrap();
        a.rebuild_now().await.unwrap();
        assert_eq!(spared(&a), (vec![3, 5], false));
        assert_eq!(a.status().state, "degraded");
        let r = reason_of(&a, 7);
        assert!(r.contains("distributed spare space is full"), "{r}");
        check_volume(&a, &data, "m7 out, spare space full").await;
        a.close().await.unwrap();

        // Recorded: a restart (without the failed disks: one back would be re-added and
        // copied back at once) resolves through the same list.
        let left: Vec<Arc<MemDev>> = devs
            .iter()
            .enumerate()
            .filter(|(i, _)| ![3, 5, 7].contains(i))
            .map(|(_, d)| d.clone())
            .collect();
        let a = Array::assemble(specs(&left), AssembleOptions::default())
            .await
            .unwrap();
        assert_eq!(spared(&a), (vec![3, 5], false));
        check_volume(&a, &data, "restarted").await;

        // m7 is replaced as in any layout (rebuilt, it holds chunks of its own).
        let r7 = Arc::new(MemDev::new("r7", MEMBER_SIZE));
        a.replace(&uuid_of(&a, 7), one(&r7), false).await.unwrap();
        a.rebuild_now().await.unwrap();
        assert_eq!(spared(&a), (vec![3, 5], false));
        // m3's replacement waits for m5's: copied back last spared first.
        let r3 = Arc::new(MemDev::new("r3", MEMBER_SIZE));
        a.replace(&uuid_of(&a, 3), one(&r3), false).await.unwrap();
        a.rebuild_now().await.unwrap();
        assert_eq!(spared(&a), (vec![3, 5], false));
        let r = reason_of(&a, 3);
        assert!(r.contains("slot 5 first"), "{r}");
        let r5 = Arc::new(MemDev::new("r5", MEMBER_SIZE));
        a.replace(&uuid_of(&a, 5), one(&r5), false).await.unwrap();
        a.rebuild_now().await.unwrap();
        assert_eq!(spared(&a), (vec![], false));
        let st = a.status();
        assert_eq!(st.state, "optimal");
        assert!(
            st.members.iter().all(|m| m.state == "active"),
            "{:?}",
            st.members
        );
        check_volume(&a, &data, "copied back").await;
        // Parity matches the copied chunks everywhere.
        scrub_check(&a, "copied back").await;
        a.close().await.unwrap();
    });
}

/// A second failure while the distributed rebuild runs: it goes on degraded, and the
/// second member is spared after it. A second failure while a copy-back runs: the copy
/// goes on (rebuilding what it cannot read), and the member is spared after it. The
/// replacement failing during its copy-back: the slot is simply spared again.
#[test]
fn failures_during_the_transitions() {
    rt(2).block_on(async {
        let devs = mem_members(MEMBERS);
        let a = Array::create(dspec(), specs(&devs)).await.unwrap();
        let data = fill(&a, 3).await;
        throttle(&a, 2 << 20);
        a.fail("m2", false).await.unwrap();
        while !spared(&a).1 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        a.fail("m9", false).await.unwrap();
        throttle(&a, 0);
        a.rebuild_now().await.unwrap();
        assert_eq!(spared(&a), (vec![2, 9], false));
        assert_eq!(a.status().state, "optimal");
        check_volume(&a, &data, "m9 failed during m2's distributed rebuild").await;
        scrub_check(&a, "two spared").await;

        // Copy-back of m9 with m4 failing meanwhile.
        throttle(&a, 2 << 20);
        let r9 = Arc::new(MemDev::new("r9", MEMBER_SIZE));
        a.replace("m9", one(&r9), false).await.unwrap();
        while !spared(&a).1 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        a.fail("m4", false).await.unwrap();
        throttle(&a, 0);
        a.rebuild_now().await.unwrap();
        assert_eq!(spared(&a), (vec![2, 4], false));
        assert_eq!(a.status().state, "optimal");
        check_volume(&a, &data, "m4 failed during m9's copy-back").await;
        scrub_check(&a, "m4 failed during copy-back").await;

        // The replacement itself fails during its copy-back.
        throttle(&a, 2 << 20);
        let r4 = Arc::new(MemDev::new("r4", MEMBER_SIZE));
        a.replace("m4", one(&r4), false).await.unwrap();
        while !spared(&a).1 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        a.fail("r4", false).await.unwrap();
        throttle(&a, 0);
        a.rebuild_now().await.unwrap();
        assert_eq!(spared(&a), (vec![2, 4], false));
        check_volume(&a, &data, "the replacement failed during its copy-back").await;
        scrub_check(&a, "replacement failed").await;
        a.close().await.unwrap();
    });
}

/// Rows of the array (16 KiB chunks over 2 MiB of data a member).
fn rows_of(a: &Array) -> u64 {
    // 2 groups of 3 data chunks a row.
    a.size() / (2 * 3 * CHUNK as u64)
}

/// The stripes missing a chunk on both `x` and `y` at or above `from_row`, as the map
/// resolves them now.
fn doubly_lost(a: &Array, x: usize, y: usize, from_row: u64) -> Vec<(u64, usize)> {
    let p = a.placement();
    (from_row..rows_of(a))
        .flat_map(|row| (0..2).map(move |group| (row, group)))
        .filter(|&(row, group)| {
            let slots = p.stripe_slots(sbod_core::placement::StripeAddr { group, stripe: row });
            slots.contains(&x) && slots.contains(&y)
        })
        .collect()
}

/// Two members out at once: the distributed rebuild of the first takes the stripes that
/// lost a chunk on both first (docs/ENGINE.md, "Order"), so that when that first pass
/// ends no stripe misses two chunks, long before the whole rebuild ends; status says so
/// while it runs. Then the rest, then the second member: the array ends with both
/// spared, every byte in place.
#[test]
fn stripes_that_lost_two_chunks_first() {
    rt(2).block_on(async {
        let devs = mem_members(MEMBERS);
        let a = Array::create(dspec(), specs(&devs)).await.unwrap();
        let data = fill(&a, 7).await;
        let rows = rows_of(&a);
        // Stripes missing a chunk on both m2 and m9 before anything moves: what the
        // first pass is for (the test would prove nothing without them).
        let lost = doubly_lost(&a, 2, 9, 0).len();
        assert!(
            lost > 10,
            "only {lost} stripes hold chunks on both m2 and m9"
        );
        throttle(&a, 1 << 20);
        a.fail("m2", false).await.unwrap();
        a.fail("m9", false).await.unwrap();
        let mut said = false;
        let p = a.placement();
        let boundary = loop {
            let sp = p.spared();
            let fb = sp.first_boundary.load(AtomicOrdering::Acquire);
            if sp.first() == Some(9) && fb >= rows {
                break sp.boundary.load(AtomicOrdering::Acquire);
            }
            if sp.first() == Some(9) && !said {
                let r = reason_of(&a, 2);
                said = r.contains("first the stripes that also lost a chunk on slot 9");
            }
            assert!(
                sp.to.is_some() || sp.from.is_empty(),
                "the distributed rebuild ended before its first pass was seen: {:?}",
                sp.from
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        };
        assert!(said, "status never told of the first pass");
        // The first pass is done: no stripe misses both, though the main walk has rows
        // left that held such stripes before.
        assert!(
            boundary < rows / 2,
            "the main walk got to row {boundary} of {rows}"
        );
        assert_eq!(doubly_lost(&a, 2, 9, 0), vec![], "after the first pass");
        check_volume(&a, &data, "after the first pass").await;
        throttle(&a, 0);
        a.rebuild_now().await.unwrap();
        assert_eq!(spared(&a), (vec![2, 9], false));
        assert_eq!(a.status().state, "optimal");
        devs[2].with_data(|v| v[(1 << 20)..].fill(0xEE));
        devs[9].with_data(|v| v[(1 << 20)..].fill(0xEE));
        check_volume(&a, &data, "m2 and m9 spared").await;
        scrub_check(&a, "m2 and m9 spared").await;
        a.close().await.unwrap();
    });
}

/// Power cuts at random points of a distributed rebuild with a second member out (the
/// first pass, then the rest, then the second's): every acknowledged write reads back
/// after each, and the array ends with both spared.
#[test]
fn power_cuts_during_the_first_pass() {
    let seed0 = seed();
    let rng = Rng::new(seed0);
    let mut mid = 0u64;
    rt(2).block_on(async {
        for trial in 0..iters(4) {
            let what = |p: &str| format!("trial {trial} {p} (SBOD_TORTURE_SEED={seed0})");
            let (supply, devs, a, mut m) = written_on_power(&rng, false).await;
            let x = rng.below(MEMBERS as u64) as usize;
            let y = (x + 1 + rng.below(MEMBERS as u64 - 1) as usize) % MEMBERS;
            throttle(&a, 4 << 20);
            a.fail(&format!("m{x}"), false).await.unwrap();
            write_blocks(&a, &mut m, &rng, rng.below(20) as usize).await;
            a.fail(&format!("m{y}"), false).await.unwrap();
            write_blocks(&a, &mut m, &rng, rng.below(20) as usize).await;
            tokio::time::sleep(Duration::from_millis(rng.below(400))).await;
            supply.cut(rng.next());
            a.abandon().await;
            drop(a);
            // Both disks are gone.
            let devs = named_but(&devs, &[x, y]);
            let (a, _devs) = after_cut(&devs, &rng).await;
            mid += a.placement().spared().first().is_some() as u64;
            check_blocks(
                &a,
                &m,
                &what(&format!("cut while m{x} was spared, m{y} out")),
            )
            .await;
            a.rebuild_now().await.unwrap();
            assert_eq!(spared(&a), (vec![x, y], false), "{}", what("spared"));
            check_blocks(&a, &m, &what("both spared after the cut")).await;
            scrub_check(&a, &what("both spared")).await;
            a.close().await.unwrap();
        }
    });
    report(serde_json::json!({
        "test": "declustered_first_pass_powercut",
        "seed": seed0,
        "trials": iters(4),
        "cut_with_a_first_pass_recorded": mid,
    }));
}

/// A hot spare is not needed while the spare space has room; it takes the slot once the
/// distributed rebuild is done (copied back at once), and a failure beyond the spare
/// space is rebuilt onto it as in any layout.
#[test]
fn hot_spares_wait_for_the_spare_space() {
    rt(2).block_on(async {
        let devs = mem_members(MEMBERS);
        let a = Array::create(dspec(), specs(&devs)).await.unwrap();
        let data = fill(&a, 4).await;
        let hs = Arc::new(MemDev::new("hs", MEMBER_SIZE));
        a.add(one(&hs), false).await.unwrap();
        a.fail("m1", false).await.unwrap();
        // Not taken by the failure: the distributed rebuild runs.
        let st = a.status();
        assert!(
            st.members
                .iter()
                .any(|m| m.path.as_deref() == Some("hs") && m.state == "spare"),
            "{:?}",
            st.members
        );
        a.rebuild_now().await.unwrap();
        // Then it took m1's slot and was filled by copy-back.
        assert_eq!(spared(&a), (vec![], false));
        let st = a.status();
        assert_eq!(st.state, "optimal");
        assert!(
            st.members.iter().any(|m| m.path.as_deref() == Some("hs")
                && m.slot == Some(1)
                && m.state == "active"),
            "{:?}",
            st.members
        );
        check_volume(&a, &data, "hot spare after the distributed rebuild").await;
        scrub_check(&a, "hot spare").await;
        a.close().await.unwrap();
    });
}

/// Members large enough for a row height above 1 (4 KiB chunks, about 10 MiB of data:
/// 8 rows a permutation): each permutation's stripes span runs of rows, which the
/// distributed rebuild and the copy-back move as a whole; every byte reads back, parity
/// matches, and a restart resolves through the same map.
#[test]
fn a_row_height_above_one_rebuilds_and_copies_back() {
    rt(2).block_on(async {
        let (devs, a) = tall_array(|_, m| m).await;
        let d = a.geometry().declustered.expect("declustered");
        let mut data = fill(&a, 11).await;
        a.fail("m3", false).await.unwrap();
        a.rebuild_now().await.unwrap();
        assert_eq!(spared(&a), (vec![3], false));
        assert_eq!(a.status().state, "optimal");
        devs[3].with_data(|v| v[(1 << 20)..].fill(0xEE));
        check_volume(&a, &data, "m3 spared").await;
        scrub_check(&a, "m3 spared").await;
        let part = pattern(a.size() as usize / 3, 12);
        a.write(4096 * 7, AlignedBuf::from_slice(&part), false)
            .await
            .unwrap();
        data[4096 * 7..4096 * 7 + part.len()].copy_from_slice(&part);
        a.fail("m8", false).await.unwrap();
        a.rebuild_now().await.unwrap();
        assert_eq!(spared(&a), (vec![3, 8], false));
        devs[8].with_data(|v| v[(1 << 20)..].fill(0xEE));
        check_volume(&a, &data, "m3 and m8 spared").await;
        a.close().await.unwrap();

        let left: Vec<Arc<MemDev>> = devs
            .iter()
            .enumerate()
            .filter(|(i, _)| ![3, 8].contains(i))
            .map(|(_, d)| d.clone())
            .collect();
        let a = Array::assemble(specs(&left), AssembleOptions::default())
            .await
            .unwrap();
        assert_eq!(a.geometry().declustered, Some(d));
        assert_eq!(spared(&a), (vec![3, 8], false));
        check_volume(&a, &data, "restarted").await;
        let r8 = Arc::new(MemDev::new("r8", TALL_SIZE));
        a.replace(&uuid_of(&a, 8), one(&r8), false).await.unwrap();
        a.rebuild_now().await.unwrap();
        assert_eq!(spared(&a), (vec![3], false));
        let r3 = Arc::new(MemDev::new("r3", TALL_SIZE));
        a.replace(&uuid_of(&a, 3), one(&r3), false).await.unwrap();
        a.rebuild_now().await.unwrap();
        assert_eq!(spared(&a), (vec![], false));
        assert_eq!(a.status().state, "optimal");
        check_volume(&a, &data, "copied back").await;
        scrub_check(&a, "copied back").await;
        a.close().await.unwrap();
    });
}

/// What each block may read as: its last acknowledged write's seed.
struct Blocks {
    base: u64,
    over: BTreeMap<u64, u64>,
}

impl Blocks {
    fn expect(&self, b: u64) -> Vec<u8> {
        let s = self.over.get(&b).copied().unwrap_or(self.base);
        pattern(BLOCK as usize, s.wrapping_mul(1_000_003) ^ b)
    }
}

async fn write_blocks(a: &Arc<Array>, m: &mut Blocks, rng: &Rng, n: usize) {
    let blocks = a.size() / BLOCK;
    for _ in 0..n {
        let b = rng.below(blocks);
        let s = rng.next() | 1;
        m.over.insert(b, s);
        let x = m.expect(b);
        a.write(b * BLOCK, AlignedBuf::from_slice(&x), true)
            .await
            .unwrap();
    }
}

async fn check_blocks(a: &Array, m: &Blocks, what: &str) {
    let blocks = a.size() / BLOCK;
    let per = 256u64;
    for first in (0..blocks).step_by(per as usize) {
        let n = per.min(blocks - first);
        let got = a
            .read(first * BLOCK, (n * BLOCK) as usize)
            .await
            .unwrap_or_else(|e| panic!("{what}: read block {first}: {e}"));
        for i in 0..n {
            let at = (i * BLOCK) as usize;
            if got[at..at + BLOCK as usize] != m.expect(first + i)[..] {
                panic!("{what}: block {} reads wrong bytes", first + i);
            }
        }
    }
}

/// The members as the cut left them, on a new supply (the failed one gone).
fn again(
    devs: &[(String, Arc<PowerCutDev>)],
    supply: &Arc<PowerSupply>,
    rng: &Rng,
) -> Vec<(String, Arc<PowerCutDev>)> {
    devs.iter()
        .map(|(n, d)| {
            let d = PowerCutDev::new(
                n.clone(),
                d.image(),
                supply,
                Duration::from_micros(20),
                rng.next(),
            );
            (n.clone(), d)
        })
        .collect()
}

fn specs_of(devs: &[(String, Arc<PowerCutDev>)]) -> Vec<MemberSpec> {
    devs.iter().map(|(_, d)| one(d)).collect()
}

/// An array on members that lose what was not flushed when the power is cut, every
/// block written (FUA) with the model's pattern.
async fn written_on_power(
    rng: &Rng,
    tall: bool,
) -> (Arc<PowerSupply>, Vec<Arc<PowerCutDev>>, Arc<Array>, Blocks) {
    let supply = PowerSupply::new();
    let devs = power_members(
        blank_of(MEMBERS, tall),
        &supply,
        Duration::from_micros(20),
        |_| rng.next(),
    );
    let a = Array::create(spec_of(tall), specs(&devs)).await.unwrap();
    if tall {
        let d = a.geometry().declustered.expect("declustered");
        assert!(d.height >= 4, "row height {}", d.height);
    }
    let m = Blocks {
        base: rng.next() | 1,
        over: BTreeMap::new(),
    };
    let blocks = a.size() / BLOCK;
    for first in (0..blocks).step_by(64) {
        let x: Vec<u8> = (first..first + 64).flat_map(|b| m.expect(b)).collect();
        a.write(first * BLOCK, AlignedBuf::from_slice(&x), true)
            .await
            .unwrap();
    }
    (supply, devs, a, m)
}

/// The power-cut trials' layout: `dspec()`, or with `tall` 4 KiB chunks on members of
/// 5 MiB, so the rows come in blocks (a row height of 4 or more) and a transition moves its
/// chunks a block (the rows of one permutation) at a time.
fn spec_of(tall: bool) -> CreateSpec {
    if tall {
        CreateSpec {
            chunk: 4096,
            bitmap_region: Some(64 << 10),
            ..dspec()
        }
    } else {
        dspec()
    }
}

/// `n` blank members for [`spec_of`].
fn blank_of(n: usize, tall: bool) -> Vec<Vec<u8>> {
    if tall {
        vec![vec![0u8; 5 << 20]; n]
    } else {
        blank(n)
    }
}

/// The members with their names, but those in `gone` (their disks taken away).
fn named_but(devs: &[Arc<PowerCutDev>], gone: &[usize]) -> Vec<(String, Arc<PowerCutDev>)> {
    devs.iter()
        .enumerate()
        .filter(|(i, _)| !gone.contains(i))
        .map(|(i, d)| (format!("m{i}"), d.clone()))
        .collect()
}

/// After a cut: assembled (forced past the write hole where the cut left dirty regions
/// that a member out must be rebuilt from: every write was acknowledged before the cut,
/// so parity holds).
async fn after_cut(
    devs: &[(String, Arc<PowerCutDev>)],
    rng: &Rng,
) -> (Arc<Array>, Vec<(String, Arc<PowerCutDev>)>) {
    let supply = PowerSupply::new();
    let devs = again(devs, &supply, rng);
    let a = assemble_after_kill(|| specs_of(&devs)).await;
    (a, devs)
}

/// Assemble members left by a crash: refused only as not shut down cleanly, and then
/// assembled with `force`.
async fn assemble_after_kill(specs: impl Fn() -> Vec<MemberSpec>) -> Arc<Array> {
    match Array::assemble(specs(), AssembleOptions::default()).await {
        Ok(a) => a,
        Err(e) => {
            assert!(
                e.to_string().contains("not shut down cleanly"),
                "refused for another reason: {e}"
            );
            let force = AssembleOptions {
                force: true,
                ..Default::default()
            };
            Array::assemble(specs(), force).await.unwrap()
        }
    }
}

/// What held members hold after a kill (their held writes dropped), `gone` left out: a
/// memory copy of each.
fn left_by_kill(devs: &[Arc<HoldDev>], gone: usize) -> Vec<Arc<MemDev>> {
    for d in devs {
        d.drop_held();
    }
    devs.iter()
        .enumerate()
        .filter(|(i, _)| *i != gone)
        .map(|(_, d)| {
            let c = Arc::new(MemDev::new(d.name().to_string(), d.size()));
            let bytes = d.inner.with_data(|v| v.clone());
            c.with_data(|v| *v = bytes);
            c
        })
        .collect()
}

/// Power cuts at random points of a distributed rebuild (client writes before and while
/// it runs), then of the copy-back to a replacement: each time the array comes back,
/// resumes the transition from its recorded row, and every acknowledged write reads back.
#[test]
fn power_cuts_during_the_distributed_rebuild_and_the_copy_back() {
    power_cuts(false);
}

/// The same with tall blocks ([`spec_of`]): the chunks move a block at a time, out of row order
/// within the windows under way (the boundary still passes a window only once every
/// chunk of it is written).
#[test]
fn power_cuts_during_the_transitions_of_tall_blocks() {
    power_cuts(true);
}

fn power_cuts(tall: bool) {
    let seed0 = seed();
    let rng = Rng::new(seed0);
    // Cuts that found a transition under way (the rest came before or after it).
    let mut mid = [0u64; 2];
    rt(2).block_on(async {
        for trial in 0..iters(6) {
            let what = |p: &str| format!("trial {trial} {p} (SBOD_TORTURE_SEED={seed0})");
            let (supply, devs, a, mut m) = written_on_power(&rng, tall).await;
            // The distributed rebuild of a random member, cut at a random point.
            let x = rng.below(MEMBERS as u64) as usize;
            throttle(&a, 4 << 20);
            a.fail(&format!("m{x}"), false).await.unwrap();
            write_blocks(&a, &mut m, &rng, rng.below(40) as usize).await;
            tokio::time::sleep(Duration::from_millis(rng.below(400))).await;
            supply.cut(rng.next());
            a.abandon().await;
            drop(a);
            // The failed disk is gone.
            let devs = named_but(&devs, &[x]);
            let (a, devs) = after_cut(&devs, &rng).await;
            mid[0] += spared(&a).1 as u64;
            check_blocks(&a, &m, &what(&format!("cut while m{x} was spared"))).await;
            a.rebuild_now().await.unwrap();
            assert_eq!(spared(&a), (vec![x], false), "{}", what("spared"));
            check_blocks(&a, &m, &what(&format!("m{x} spared after the cut"))).await;
            scrub_check(&a, &what("spared")).await;
            a.close().await.unwrap();
            drop(a);

            // The copy-back to a replacement, cut at a random point.
            let supply = PowerSupply::new();
            let mut devs = again(&devs, &supply, &rng);
            let a = Array::assemble(specs_of(&devs), AssembleOptions::default())
                .await
                .unwrap();
            throttle(&a, 4 << 20);
            let r = PowerCutDev::new(
                format!("r{x}"),
                blank_of(1, tall).remove(0),
                &supply,
                Duration::from_micros(20),
                rng.next(),
            );
            a.replace(&uuid_of(&a, x), one(&r), false).await.unwrap();
            devs.push((format!("r{x}"), r));
            write_blocks(&a, &mut m, &rng, rng.below(40) as usize).await;
            tokio::time::sleep(Duration::from_millis(rng.below(400))).await;
            supply.cut(rng.next());
            a.abandon().await;
            drop(a);
            let (a, _devs) = after_cut(&devs, &rng).await;
            mid[1] += spared(&a).1 as u64;
            check_blocks(&a, &m, &what(&format!("cut while r{x} was copied back"))).await;
            a.rebuild_now().await.unwrap();
            assert_eq!(spared(&a), (vec![], false), "{}", what("copied back"));
            assert_eq!(a.status().state, "optimal", "{}", what("copied back"));
            check_blocks(&a, &m, &what(&format!("r{x} copied back after the cut"))).await;
            scrub_check(&a, &what("copied back")).await;
            a.close().await.unwrap();
        }
    });
    report(serde_json::json!({
        "test": if tall { "declustered_transitions_powercut_tall" } else { "declustered_transitions_powercut" },
        "seed": seed0,
        "trials": iters(6),
        "cut_mid_distributed_rebuild": mid[0],
        "cut_mid_copy_back": mid[1],
    }));
}

/// A member that holds back the transition's writes (background class) to the member
/// rows `hold` until `release` (or until it is dropped in a "crash": they never land),
/// and counts those beyond them that it let through.
struct HoldDev {
    inner: Arc<MemDev>,
    hold: parking_lot::Mutex<std::ops::Range<u64>>,
    held: parking_lot::Mutex<Vec<(IoReq, Done)>>,
    beyond: AtomicU64,
}

impl HoldDev {
    fn new(inner: Arc<MemDev>) -> Arc<HoldDev> {
        Arc::new(HoldDev::of(inner))
    }

    fn of(inner: Arc<MemDev>) -> HoldDev {
        HoldDev {
            inner,
            hold: parking_lot::Mutex::new(0..0),
            held: parking_lot::Mutex::new(Vec::new()),
            beyond: AtomicU64::new(0),
        }
    }

    fn release(&self) {
        *self.hold.lock() = 0..0;
        let held = std::mem::take(&mut *self.held.lock());
        for (req, done) in held {
            self.inner.submit(req, done);
        }
    }

    /// The held writes fail (after a crash nobody waits for them; nothing lands).
    fn drop_held(&self) {
        let held = std::mem::take(&mut *self.held.lock());
        for (_, done) in held {
            done(Err(std::io::Error::other("the process was killed")));
        }
    }
}

impl BlockDev for HoldDev {
    fn submit(&self, req: IoReq, done: Done) {
        if req.class == IoClass::Background && matches!(req.kind, IoKind::Write { .. }) {
            let hold = self.hold.lock().clone();
            if hold.contains(&req.offset) {
                self.held.lock().push((req, done));
                return;
            }
            if !hold.is_empty() && req.offset >= hold.end {
                self.beyond.fetch_add(1, AtomicOrdering::Relaxed);
            }
        }
        self.inner.submit(req, done)
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn name(&self) -> &str {
        self.inner.name()
    }
}

/// The array on held members, filled, with the first window of the distributed rebuild's
/// writes held on every member; `x` failed. Returns once a write of a later window has
/// reached a member while the first window's are held (the windows are pipelined): the
/// boundary, in memory and recorded, has not moved.
async fn pipelined(x: usize, seed: u64) -> (Arc<Array>, Vec<Arc<HoldDev>>, Vec<u8>) {
    let devs: Vec<Arc<HoldDev>> = mem_members(MEMBERS).into_iter().map(HoldDev::new).collect();
    let a = Array::create(dspec(), specs(&devs)).await.unwrap();
    let data = fill(&a, seed).await;
    // The transition's first window (rows as spare.rs cuts them: at least 16 windows).
    let g = a.geometry();
    let rows = g.member_size.div_ceil(g.chunk as u64);
    let window = rows.div_ceil(16);
    let first = g.data_offset..g.data_offset + window * g.chunk as u64;
    for d in &devs {
        *d.hold.lock() = first.clone();
    }
    a.fail(&format!("m{x}"), false).await.unwrap();
    let mut waited = 0;
    loop {
        let held: usize = devs.iter().map(|d| d.held.lock().len()).sum();
        let beyond: u64 = devs
            .iter()
            .map(|d| d.beyond.load(AtomicOrdering::Relaxed))
            .sum();
        if held > 0 && beyond > 0 {
            break;
        }
        waited += 1;
        assert!(
            waited < 3000,
            "no write of a later window while the first one's are held ({held} held): \
             the windows are not pipelined"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let sp = a.placement().spared();
    assert_eq!(
        sp.to.as_deref(),
        Some(&[x][..]),
        "the transition is under way"
    );
    assert_eq!(
        sp.boundary.load(AtomicOrdering::Acquire),
        0,
        "the boundary moved past a window with a write in flight"
    );
    assert_eq!(sp.recorded.load(AtomicOrdering::Acquire), 0);
    (a, devs, data)
}

/// Two windows in flight (the second one's writes done, the first one's held): a member
/// failing then is handled as any degraded stripe's, the held writes land, the boundary
/// passes both windows in order, and the second member is spared after the first.
#[test]
fn a_failure_while_windows_are_pipelined() {
    rt(2).block_on(async {
        let (a, devs, data) = pipelined(3, 11).await;
        a.fail("m7", false).await.unwrap();
        for d in &devs {
            d.release();
        }
        a.rebuild_now().await.unwrap();
        assert_eq!(spared(&a), (vec![3, 7], false));
        assert_eq!(a.status().state, "optimal");
        check_volume(&a, &data, "m7 failed while m3's windows were pipelined").await;
        scrub_check(&a, "two spared").await;
        a.close().await.unwrap();
    });
}

/// The process killed with two windows in flight (the second one's writes done, the
/// first one's never landed): the members recorded no boundary past the first window, so
/// the array comes back, resumes the rebuild from the first row (its writes there are
/// held again, and the boundary waits for them), and ends spared with every byte.
#[test]
fn killed_while_windows_are_pipelined() {
    rt(2).block_on(async {
        let (a, devs, data) = pipelined(5, 12).await;
        let first = devs[0].hold.lock().clone();
        a.abandon().await;
        drop(a);
        // What the members hold now (held writes never landed), the failed one gone.
        let copies: Vec<Arc<HoldDev>> = left_by_kill(&devs, 5)
            .into_iter()
            .map(|c| {
                let c = HoldDev::new(c);
                *c.hold.lock() = first.clone();
                c
            })
            .collect();
        let a = assemble_after_kill(|| specs(&copies)).await;
        let run = tokio::spawn({
            let a = a.clone();
            async move { a.rebuild_now().await }
        });
        let mut waited = 0;
        while copies.iter().all(|d| d.held.lock().is_empty()) {
            waited += 1;
            assert!(
                waited < 3000,
                "the resumed rebuild wrote nothing in the first window: it started past it"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let sp = a.placement().spared();
        assert_eq!(sp.to.as_deref(), Some(&[5][..]), "the transition resumed");
        assert_eq!(
            sp.boundary.load(AtomicOrdering::Acquire),
            0,
            "a boundary past a window whose writes never landed was recorded"
        );
        for d in &copies {
            d.release();
        }
        run.await.unwrap().unwrap();
        a.rebuild_now().await.unwrap();
        assert_eq!(spared(&a), (vec![5], false));
        check_volume(&a, &data, "killed with two windows in flight, spared after").await;
        scrub_check(&a, "spared after the kill").await;
        a.close().await.unwrap();
    });
}

/// The tall-block array on held members, filled with `data`; `x` (a member with chunks
/// in the first and the last block of the distributed rebuild's first window) failed,
/// with the last block's writes held on every member, so the boundary cannot pass the
/// window (with `one_row`, only the second row's: the first block cannot end). A
/// client's write (FUA) to the first row's stripe in `x`'s group, the first block's,
/// completes meanwhile and reads back: the first row was let go once its chunk moved
/// (the walk starts row by row: clients were busy within its first second), not when
/// its block ended or the boundary passed its window. Returns the members, the array,
/// the volume as it is now and `x`.
async fn a_done_block_written(
    seed: u64,
    one_row: bool,
) -> (Vec<Arc<HoldDev>>, Arc<Array>, Vec<u8>, usize) {
    let (devs, a) = tall_array(|_, m| HoldDev::of(Arc::new(m))).await;
    let mut data = fill(&a, seed).await;
    let g = a.geometry();
    let chunk = g.chunk as u64;
    let rows = g.member_size.div_ceil(chunk);
    let h = g.declustered.expect("declustered").height as u64;
    // The first window as spare.rs cuts it here (at least 16 windows, whole blocks).
    let window = rows.div_ceil(16).div_ceil(h) * h;
    assert!(window >= 2 * h, "a window of {window} rows holds one block");
    let p = a.placement();
    let last = window - h;
    let x = (0..MEMBERS)
        .find(|&s| p.group_at(0, s).is_some() && p.group_at(last, s).is_some())
        .expect("a member with chunks in both blocks");
    let group = p.group_at(0, x).expect("in a group");
    // The rows of one block share its permutation: x has a chunk in the second row too.
    let held = if one_row {
        g.data_offset + chunk..g.data_offset + 2 * chunk
    } else {
        g.data_offset + last * chunk..g.data_offset + window * chunk
    };
    for d in &devs {
        *d.hold.lock() = held.clone();
    }
    a.fail(&format!("m{x}"), false).await.unwrap();
    let mut waited = 0;
    while devs.iter().all(|d| d.held.lock().is_empty()) {
        waited += 1;
        assert!(waited < 3000, "the rebuild wrote nothing in the held block");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let addr = sbod_core::placement::StripeAddr { group, stripe: 0 };
    let off = p.volume_offset(addr, 0);
    let new = pattern(BLOCK as usize, seed + 1000);
    tokio::time::timeout(
        Duration::from_secs(60),
        a.write(off, AlignedBuf::from_slice(&new), true),
    )
    .await
    .expect("a write to a row the rebuild had moved waited for its block to end or the boundary to pass its window")
    .unwrap();
    let sp = a.placement().spared();
    assert_eq!(
        sp.boundary.load(AtomicOrdering::Acquire),
        0,
        "the boundary passed the first window with its last block's writes held"
    );
    assert!(sp.is_ahead(0), "the first row was not marked ahead");
    assert!(
        !one_row || !sp.is_ahead(1),
        "the second row was marked with its writes held"
    );
    let got = a.read(off, BLOCK as usize).await.unwrap();
    assert!(
        got[..] == new[..],
        "the write to a row ahead of the boundary reads back other bytes"
    );
    data[off as usize..(off + BLOCK) as usize].copy_from_slice(&new);
    (devs, a, data, x)
}

/// A distributed rebuild lets the stripes of a block it has done go at once (its rows
/// marked ahead of the boundary, resolved through the new list): a client's write there
/// does not wait for the slowest block of the window. The held writes land, the rebuild
/// ends, and every byte reads back, the client's too.
#[test]
fn a_write_to_a_block_done_waits_for_no_window() {
    rt(2).block_on(async {
        for one_row in [false, true] {
            let (devs, a, data, x) = a_done_block_written(31, one_row).await;
            for d in &devs {
                d.release();
            }
            a.rebuild_now().await.unwrap();
            assert_eq!(spared(&a).0, vec![x]);
            check_volume(&a, &data, "a write ahead of the boundary, rebuilt").await;
            scrub_check(&a, "a write ahead of the boundary").await;
            a.close().await.unwrap();
        }
    });
}

/// The same, killed before the boundary passes the window (its last block's writes never
/// land): the members recorded no boundary, so the rows written ahead of it are read in
/// the old list again (the failed member's chunks rebuilt from parity, which the write
/// through the new list kept right), and the resumed rebuild ends with every byte.
#[test]
fn killed_after_a_write_ahead_of_the_boundary() {
    rt(2).block_on(async {
        let (devs, a, data, x) = a_done_block_written(32, true).await;
        a.abandon().await;
        drop(a);
        let copies = left_by_kill(&devs, x);
        let a = assemble_after_kill(|| specs(&copies)).await;
        check_volume(&a, &data, "killed after a write ahead of the boundary").await;
        a.rebuild_now().await.unwrap();
        assert_eq!(spared(&a).0, vec![x]);
        check_volume(
            &a,
            &data,
            "killed after a write ahead of the boundary, rebuilt",
        )
        .await;
        scrub_check(&a, "killed after a write ahead of the boundary").await;
        a.close().await.unwrap();
    });
}

/// The tall-block array's member size.
const TALL_SIZE: u64 = 12 << 20;

/// The tall-block array: 12 members of 12 MiB (`wrap` makes each of its memory device),
/// declustered raid6 of 4 KiB chunks, so a row height of 8 or more.
async fn tall_array<D: BlockDev + 'static>(
    wrap: impl Fn(usize, MemDev) -> D,
) -> (Vec<Arc<D>>, Arc<Array>) {
    let devs: Vec<Arc<D>> = (0..MEMBERS)
        .map(|i| Arc::new(wrap(i, MemDev::new(format!("m{i}"), TALL_SIZE))))
        .collect();
    let spec = CreateSpec {
        chunk: 4096,
        bitmap_region: Some(64 << 10),
        ..dspec()
    };
    let a = Array::create(spec, specs(&devs)).await.unwrap();
    let d = a.geometry().declustered.expect("declustered");
    assert!(d.height >= 8, "row height {}", d.height);
    (devs, a)
}

/// A member that counts its background reads by length (the distributed rebuild's runs
/// read ahead are one request a member a block).
struct RunDev {
    inner: Arc<FaultDev>,
    reads: parking_lot::Mutex<BTreeMap<u64, u64>>,
    /// Where each background read began, by length.
    at: parking_lot::Mutex<Vec<(u64, u64)>>,
}

impl BlockDev for RunDev {
    fn submit(&self, req: IoReq, done: Done) {
        if let (IoClass::Background, IoKind::Read { buf }) = (req.class, &req.kind) {
            *self.reads.lock().entry(buf.len() as u64).or_default() += 1;
            self.at.lock().push((buf.len() as u64, req.offset));
        }
        self.inner.submit(req, done)
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn name(&self) -> &str {
        self.inner.name()
    }
}

/// The tall-block array on members that count their background reads.
async fn run_array() -> (Vec<Arc<RunDev>>, Arc<Array>) {
    tall_array(|i, m| RunDev {
        inner: Arc::new(FaultDev::new(Arc::new(m), i as u64)),
        reads: Default::default(),
        at: Default::default(),
    })
    .await
}

/// The distributed rebuild reads each member's run of a block ahead as one request
/// (row height 8 here: 8 chunks a run) once clients have been idle for a second. A run that fails (pending sectors) or does not
/// match its checksums (bits flipped on the medium) is left out and its chunks are read
/// one by one, as without runs: the bad ones are rebuilt from the rest of their stripes
/// (and healed), and every byte reads back right, never the run's.
#[test]
fn runs_read_ahead_that_fail_or_mismatch_are_read_chunk_by_chunk() {
    rt(2).block_on(async {
        let (devs, a) = run_array().await;
        let d = a.geometry().declustered.expect("declustered");
        let data = fill(&a, 21).await;
        // Pending sectors on m1 and flipped bits on m2's medium, in rows where they share
        // a stripe with m3 (so the rebuild reads them), never both in one row (with m3
        // out, raid6 rebuilds either).
        let g = a.geometry();
        let chunk = g.chunk as u64;
        let rows = g.member_size / chunk;
        let p = a.placement();
        let with3 = |slot: usize, r: u64| {
            p.group_at(r, 3).is_some() && p.group_at(r, slot) == p.group_at(r, 3)
        };
        let r1: Vec<u64> = (rows / 2..rows)
            .filter(|&r| r % 3 == 1 && with3(1, r))
            .step_by(7)
            .take(4)
            .collect();
        let r2: Vec<u64> = (rows / 2..rows)
            .filter(|&r| r % 3 == 2 && with3(2, r))
            .step_by(7)
            .take(4)
            .collect();
        assert_eq!((r1.len(), r2.len()), (4, 4));
        for (&a1, &a2) in r1.iter().zip(&r2) {
            let o1 = g.data_offset + a1 * chunk;
            devs[1].inner.plan().bad_sectors.push(o1..o1 + 4096);
            devs[2]
                .inner
                .corrupt(g.data_offset + a2 * chunk + 100, 0x5a)
                .unwrap();
        }
        for dv in &devs {
            dv.reads.lock().clear();
            dv.at.lock().clear();
        }
        // Each member's shard in each row before m3 fails (None: spare space there).
        let shards: Vec<Vec<Option<usize>>> = (0..rows)
            .map(|r| {
                (0..MEMBERS)
                    .map(|slot| p.group_at(r, slot).map(|_| p.shard_at(r, slot)))
                    .collect()
            })
            .collect();
        // Runs are read once clients have been idle a second into the transition: paced
        // so that it lasts longer, the faults in its second half.
        throttle(&a, 4 << 20);
        a.fail("m3", false).await.unwrap();
        a.rebuild_now().await.unwrap();
        assert_eq!(spared(&a).0, vec![3]);
        let run = d.height as u64 * chunk;
        let runs: u64 = devs
            .iter()
            .map(|dv| dv.reads.lock().get(&run).copied().unwrap_or(0))
            .sum();
        assert!(runs > 0, "no run of {run} bytes was read ahead");
        // Runs only from the members a rebuild reads: the first k readable shards of the
        // stripe (here k = 3 of 3+2), never Q, nor P where m3 held P or Q.
        let k = g.width as usize - 2;
        for (i, dv) in devs.iter().enumerate() {
            for &(len, off) in dv.at.lock().iter().filter(|(len, _)| *len == run) {
                let row = (off - g.data_offset) / chunk;
                let (mine, lost) = (shards[row as usize][i], shards[row as usize][3]);
                let (mine, lost) = (mine.expect("a chunk there"), lost.expect("m3's"));
                assert!(
                    mine < k || (mine == k && lost < k),
                    "m{i} read a run of {len} bytes at row {row}, shard {mine} (m3's lost shard {lost}), which the rebuild does not need"
                );
            }
        }
        let st = a.status();
        let of = |slot: usize| {
            st.members
                .iter()
                .find(|m| m.slot == Some(slot))
                .expect("in service")
        };
        assert!(
            of(1).read_errors > 0,
            "the rebuild read none of m1's pending sectors"
        );
        assert!(
            of(2).checksum_errors > 0,
            "the rebuild read none of m2's flipped bits"
        );
        check_volume(&a, &data, "rebuilt past failed and mismatched runs").await;
        a.close().await.unwrap();
    });
}

/// A failure on an array whose clients have been idle for a second: the distributed
/// rebuild reads runs ahead from its first block (each member's last client request's
/// time says so), not chunk by chunk for a second first, as one that starts while
/// clients are busy does. Every member's first read of the rebuild is a run.
#[test]
fn an_idle_array_reads_runs_from_the_first_block() {
    rt(2).block_on(async {
        let (devs, a) = run_array().await;
        let d = a.geometry().declustered.expect("declustered");
        let data = fill(&a, 23).await;
        // Clients idle for more than a second before the failure.
        tokio::time::sleep(Duration::from_millis(1200)).await;
        for dv in &devs {
            dv.reads.lock().clear();
            dv.at.lock().clear();
        }
        a.fail("m3", false).await.unwrap();
        a.rebuild_now().await.unwrap();
        assert_eq!(spared(&a).0, vec![3]);
        let run = d.height as u64 * a.geometry().chunk as u64;
        let mut readers = 0;
        for (i, dv) in devs.iter().enumerate() {
            let at = dv.at.lock();
            if let Some(&(len, off)) = at.first() {
                readers += 1;
                assert_eq!(
                    len, run,
                    "m{i}'s first read of the rebuild (at {off}) was {len} bytes, not a run: \
                     the rebuild started chunk by chunk on an idle array"
                );
            }
        }
        assert!(readers > 0, "the rebuild read nothing");
        check_volume(&a, &data, "rebuilt on an idle array").await;
        a.close().await.unwrap();
    });
}

/// A member whose FLUSH waits (on a thread of its own) while `hold` is set.
struct FlushGate {
    inner: Arc<dyn BlockDev>,
    hold: Arc<AtomicBool>,
    held: Arc<AtomicU64>,
}

impl BlockDev for FlushGate {
    fn submit(&self, req: IoReq, done: Done) {
        if matches!(req.kind, IoKind::Flush) && self.hold.load(AtomicOrdering::Acquire) {
            self.held.fetch_add(1, AtomicOrdering::AcqRel);
            let (inner, hold) = (self.inner.clone(), self.hold.clone());
            std::thread::spawn(move || {
                while hold.load(AtomicOrdering::Acquire) {
                    std::thread::sleep(Duration::from_millis(5));
                }
                inner.submit(req, done)
            });
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
}

/// The distributed rebuild's periodic flush and record go on beside its walk: with every
/// member's FLUSH held once the walk is under way, the walk still moves window after
/// window (with the record in the walk it stood still until the flush returned), and
/// the rebuild ends only after the record does (it is awaited before the pass returns).
/// Every byte reads back.
#[test]
fn the_walk_goes_on_while_its_record_flushes() {
    rt(2).block_on(async {
        let hold = Arc::new(AtomicBool::new(false));
        let held = Arc::new(AtomicU64::new(0));
        let (_devs, a) = tall_array(|_, m| FlushGate {
            inner: Arc::new(m),
            hold: hold.clone(),
            held: held.clone(),
        })
        .await;
        let data = fill(&a, 22).await;
        // About 10 MiB to move at 1 MiB/s: the walk outlasts its first record (2 s).
        throttle(&a, 1 << 20);
        a.fail("m3", false).await.unwrap();
        let r = {
            let a = a.clone();
            tokio::spawn(async move { a.rebuild_now().await })
        };
        let done = || a.status().process.map_or(0, |p| p.done);
        async fn until(what: &str, f: impl Fn() -> bool) {
            let t = std::time::Instant::now();
            while !f() {
                assert!(t.elapsed() < Duration::from_secs(60), "{what}");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        until("the rebuild never started", || done() > 0).await;
        hold.store(true, AtomicOrdering::Release);
        until("no record flushed the members", || {
            held.load(AtomicOrdering::Acquire) > 0
        })
        .await;
        let at = done();
        until(
            "the walk stood still while its record's flush was held",
            || done() > at,
        )
        .await;
        assert!(
            !r.is_finished(),
            "the rebuild ended with its record's flush held"
        );
        hold.store(false, AtomicOrdering::Release);
        r.await.unwrap().unwrap();
        assert_eq!(spared(&a).0, vec![3]);
        check_volume(&a, &data, "rebuilt with its record beside the walk").await;
        a.close().await.unwrap();
    });
}
