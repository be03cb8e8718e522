//! `sbod grow` in the engine: a mirror gets one more copy and drops one, concat appends
//! members, all while a client writes; every level that would need its data restriped is
//! refused with nothing changed. After each change the array is stopped (cleanly, and as a
//! power cut would) and assembled again from its members alone: the geometry the members
//! record is the new one and every acknowledged write reads back.

use sbod_core::dev::{BlockDev, MemDev};
use sbod_core::{
    AlignedBuf, Array, AssembleOptions, CreateSpec, Error, GrowOutcome, Level, MemberSpec,
    SizeTarget,
};
use std::sync::Arc;

const MIB: u64 = 1 << 20;
const CHUNK: u32 = 64 << 10;
const BLOCK: u64 = 4096;

fn spec_of(d: &Arc<MemDev>) -> MemberSpec {
    MemberSpec {
        dev: d.clone() as Arc<dyn BlockDev>,
        path: d.name().to_string(),
        is_file: false,
        domain: String::new(),
    }
}

fn create_spec(level: Level) -> CreateSpec {
    CreateSpec {
        name: "g".into(),
        level,
        chunk: CHUNK,
        groups: 1,
        spares: 0,
        declustered: false,
        copies: 2,
        bitmap_region: Some(2 * CHUNK as u64),
        assume_clean: true,
        integrity: sbod_core::integrity::Kind::Crc32c,
        force: false,
    }
}

fn devs(prefix: &str, n: usize, size: u64) -> Vec<Arc<MemDev>> {
    (0..n)
        .map(|i| Arc::new(MemDev::new(format!("{prefix}{i}"), size)))
        .collect()
}

fn block(at: u64, seed: u64) -> AlignedBuf {
    let mut b = AlignedBuf::zeroed(BLOCK as usize);
    for (i, x) in b.iter_mut().enumerate() {
        *x = (at / BLOCK)
            .wrapping_mul(131)
            .wrapping_add(seed)
            .wrapping_add(i as u64 * 7) as u8;
    }
    b
}

/// The model: what each block last acknowledged (seed), 0 = never written. A writer
/// holds it across its write and the record of it, a check across each read, so a read
/// is compared with the write acknowledged last before it.
type Model = Arc<tokio::sync::Mutex<Vec<u64>>>;

fn model_of(blocks: u64) -> Model {
    Arc::new(tokio::sync::Mutex::new(vec![0; blocks as usize]))
}

/// Write random blocks until `stop`, recording each acknowledged write in the model.
async fn writer(a: Arc<Array>, model: Model, stop: Arc<std::sync::atomic::AtomicBool>, seed: u64) {
    // The model's size bounds it (a narrowing's client keeps below the new size).
    let blocks = (a.size() / BLOCK).min(model.lock().await.len() as u64);
    let mut x = seed | 1;
    let mut n = 0u64;
    while !stop.load(std::sync::atomic::Ordering::Acquire) || n < 50 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let b = x % blocks;
        n += 1;
        let s = seed * 1_000_000 + n;
        let mut m = model.lock().await;
        a.write(b * BLOCK, block(b * BLOCK, s), false)
            .await
            .expect("write during grow");
        m[b as usize] = s;
        drop(m);
        tokio::task::yield_now().await;
    }
}

async fn check(a: &Array, model: &Model) {
    let n = model.lock().await.len();
    for b in 0..n {
        let m = model.lock().await;
        let s = m[b];
        let got = a
            .read(b as u64 * BLOCK, BLOCK as usize)
            .await
            .expect("read");
        drop(m);
        let want = match s {
            0 => AlignedBuf::zeroed(BLOCK as usize),
            s => block(b as u64 * BLOCK, s),
        };
        assert!(
            got[..] == want[..],
            "block {b}: not the last acknowledged write"
        );
    }
}

async fn settle(a: &Array) {
    for _ in 0..2000 {
        if let Some(p) = a.current_process() {
            p.wait().await;
        }
        let st = a.status();
        if st
            .members
            .iter()
            .all(|m| m.state == sbod_core::array::MemberState::Active)
        {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    panic!("the array did not settle: {:?}", a.status().members);
}

/// A scrub of the whole array ends without an error and finds parity right everywhere.
async fn scrub_is_clean(a: &Arc<Array>, what: &str) {
    let h = a.start_scrub(false).expect("scrub");
    h.wait().await;
    let s = h.status();
    assert_eq!(s.mismatches, 0, "{what}: {s:?}");
    assert!(s.error.is_none(), "{what}: {s:?}");
}

/// Assemble `members` after a reshape during which the member of `slot` was out and now
/// answers again: it is taken back but rebuilt in full (it missed moved data), never from
/// the bitmap; then the array has `geometry` and every block reads back.
async fn back_in_full(
    members: Vec<MemberSpec>,
    slot: usize,
    geometry: &sbod_core::Geometry,
    model: &Model,
) -> Arc<Array> {
    let a = Array::assemble(members, AssembleOptions::default())
        .await
        .expect("assemble: the member that was out is not trusted");
    for s in a.report().stale.iter().filter(|s| s.slot == slot) {
        assert!(
            !s.bitmap,
            "slot {slot} recovered from the bitmap across a reshape: {s:?}"
        );
    }
    settle(&a).await;
    assert_eq!(&a.geometry(), geometry);
    check(&a, model).await;
    a
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn a_mirror_gets_a_third_copy_while_a_client_writes_and_keeps_it_across_restarts() {
    rt().block_on(async {
        let size = MIB + 32 * CHUNK as u64;
        let old = devs("m", 2, size);
        let new = devs("n", 1, size);
        let a = Array::create(create_spec(Level::Raid1), old.iter().map(spec_of).collect())
            .await
            .expect("create");
        let model: Model = model_of(a.size() / BLOCK);
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let w = tokio::spawn(writer(a.clone(), model.clone(), stop.clone(), 1));
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        let out = a
            .grow_add(new.iter().map(spec_of).collect(), false, false)
            .await
            .expect("grow");
        assert_eq!(out, GrowOutcome::Copies { slots: vec![2] });
        assert_eq!(a.geometry().width, 3);
        settle(&a).await;
        stop.store(true, std::sync::atomic::Ordering::Release);
        w.await.unwrap();
        check(&a, &model).await;
        assert_eq!(a.status().members.len(), 3);
        a.close().await.unwrap();

        // The new copy alone holds everything: the two old ones are kept away.
        let only_new = Array::assemble(
            vec![spec_of(&new[0])],
            AssembleOptions {
                degraded: true,
                ..Default::default()
            },
        )
        .await
        .expect("the new copy alone");
        assert_eq!(only_new.geometry().width, 3);
        check(&only_new, &model).await;
        only_new.abandon().await;

        // All three, after a power cut: still three copies.
        let all: Vec<MemberSpec> = old.iter().chain(&new).map(spec_of).collect();
        let a = Array::assemble(all, AssembleOptions::default())
            .await
            .expect("assemble");
        assert_eq!(a.geometry().width, 3);
        check(&a, &model).await;
        a.close().await.unwrap();
    });
}

#[test]
fn a_mirror_drops_a_copy_only_when_told_and_never_below_two() {
    rt().block_on(async {
        let size = MIB + 32 * CHUNK as u64;
        let d = devs("d", 3, size);
        let a = Array::create(create_spec(Level::Raid1), d.iter().map(spec_of).collect())
            .await
            .expect("create");
        let model: Model = model_of(a.size() / BLOCK);
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(true));
        writer(a.clone(), model.clone(), stop, 2).await;
        let before = a.status();

        // In service: refused without force, nothing changed.
        let e = a.drop_copy("d1", false).await.expect_err("refused");
        assert!(matches!(e, Error::Refused(_)), "{e}");
        assert!(
            e.to_string().contains("survives 1 failure instead of 2"),
            "{e}"
        );
        assert_eq!(a.geometry().width, 3);
        assert_eq!(a.status().members.len(), before.members.len());

        a.drop_copy("d1", true).await.expect("forced");
        assert_eq!(a.geometry().width, 2);
        check(&a, &model).await;
        // Two copies are the least a mirror keeps.
        let e = a.drop_copy("d0", true).await.expect_err("two copies");
        assert!(e.to_string().contains("at least two"), "{e}");
        a.close().await.unwrap();

        // The dropped copy no longer claims to be a member.
        assert!(
            Array::assemble(vec![spec_of(&d[1])], AssembleOptions::default())
                .await
                .is_err()
        );
        let a = Array::assemble(
            vec![spec_of(&d[0]), spec_of(&d[2])],
            AssembleOptions::default(),
        )
        .await
        .expect("the two copies left");
        assert_eq!(a.geometry().width, 2);
        check(&a, &model).await;
        a.close().await.unwrap();
    });
}

#[test]
fn concat_appends_members_online_and_the_volume_grows() {
    rt().block_on(async {
        let size = MIB + 16 * CHUNK as u64;
        let d = devs("c", 2, size);
        let extra = devs("x", 1, size);
        let a = Array::create(create_spec(Level::Concat), d.iter().map(spec_of).collect())
            .await
            .expect("create");
        let small = a.size();
        let model: Model = model_of(small / BLOCK);
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let w = tokio::spawn(writer(a.clone(), model.clone(), stop.clone(), 3));
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        let out = a
            .grow_add(extra.iter().map(spec_of).collect(), false, false)
            .await
            .expect("append");
        stop.store(true, std::sync::atomic::Ordering::Release);
        w.await.unwrap();
        let GrowOutcome::Appended { from, to } = out else {
            panic!("{out:?}")
        };
        assert_eq!(from, small);
        assert!(to > small, "{to} <= {small}");
        assert_eq!(a.size(), to);
        // The new space reads as zeros and takes writes.
        model.lock().await.resize((to / BLOCK) as usize, 0);
        check(&a, &model).await;
        let last = to / BLOCK - 1;
        a.write(last * BLOCK, block(last * BLOCK, 99), true)
            .await
            .unwrap();
        model.lock().await[last as usize] = 99;
        a.abandon().await;

        let all: Vec<MemberSpec> = d.iter().chain(&extra).map(spec_of).collect();
        let a = Array::assemble(all, AssembleOptions::default())
            .await
            .expect("assemble after a power cut");
        assert_eq!(a.size(), to);
        check(&a, &model).await;
        a.close().await.unwrap();
    });
}

#[test]
fn bad_grows_are_refused_by_name_and_nothing_changes() {
    rt().block_on(async {
        let size = MIB + 16 * CHUNK as u64;
        // Devices that do not make whole groups, a degraded array, a member too small.
        let d = devs("r", 8, size);
        let mut spec = create_spec(Level::Raid6);
        spec.groups = 2;
        let a = Array::create(spec, d.iter().map(spec_of).collect())
            .await
            .expect("create");
        let (g, sz) = (a.geometry(), a.size());
        let extra = devs("e", 3, size);
        let e = a
            .grow_add(extra.iter().map(spec_of).collect(), false, false)
            .await
            .expect_err("3 devices for 2 groups");
        assert!(e.to_string().contains("multiple of 2"), "{e}");
        let e = a
            .grow_add(extra[..2].iter().map(spec_of).collect(), true, false)
            .await
            .expect_err("2 devices are no group of 4");
        assert!(e.to_string().contains("whole groups of 4"), "{e}");
        let small = devs("s", 2, MIB);
        let e = a
            .grow_add(small.iter().map(spec_of).collect(), false, false)
            .await
            .expect_err("too small");
        assert!(e.to_string().contains("need"), "{e}");
        a.fail("r0", false).await.unwrap();
        let e = a
            .grow_add(extra[..2].iter().map(spec_of).collect(), false, false)
            .await
            .expect_err("degraded");
        assert!(e.to_string().contains("not in sync"), "{e}");
        assert_eq!(a.geometry(), g);
        assert_eq!(a.size(), sz);
        for x in extra.iter().chain(&small) {
            let sb = sbod_core::read_superblock(&(x.clone() as Arc<dyn BlockDev>)).await;
            assert!(sb.is_err(), "a refused device got a superblock");
        }
        a.close().await.unwrap();

        // A device given twice, and a member of the array itself.
        let d = devs("t", 2, size);
        let a = Array::create(create_spec(Level::Raid1), d.iter().map(spec_of).collect())
            .await
            .expect("create");
        let n = devs("u", 1, size);
        let e = a
            .grow_add(vec![spec_of(&n[0]), spec_of(&n[0])], false, false)
            .await
            .expect_err("twice");
        assert!(e.to_string().contains("given twice"), "{e}");
        let e = a
            .grow_add(vec![spec_of(&d[0])], false, false)
            .await
            .expect_err("own member");
        assert!(e.to_string().contains("already a member"), "{e}");
        assert_eq!(a.geometry().width, 2);
        a.close().await.unwrap();
    });
}

/// Wait for the reshape to end.
async fn reshaped(a: &Array) {
    for _ in 0..20_000 {
        let st = a.status();
        if st.state != sbod_core::array::ArrayState::Reshaping
            && st
                .process
                .as_ref()
                .is_none_or(|p| p.kind != sbod_core::process::ProcessKind::Reshape)
        {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    panic!("the reshape did not end: {:?}", a.status().process);
}

/// Grow `level` (`groups` groups of `width`) by `add` members (`new_groups`: as whole new
/// groups) while a client writes, and check everything: the new geometry, the new size,
/// every acknowledged write, zeros in the new space, the same after a restart.
fn reshape_case(level: Level, groups: u32, width: usize, add: usize, new_groups: bool) {
    rt().block_on(async {
        let size = MIB + 48 * CHUNK as u64;
        let old = devs("o", groups as usize * width, size);
        let new = devs("n", add, size);
        let mut spec = create_spec(level);
        spec.groups = groups;
        if level == Level::Raid10 {
            spec.copies = width as u32;
            spec.groups = 1;
        }
        let a = Array::create(spec, old.iter().map(spec_of).collect())
            .await
            .expect("create");
        let small = a.size();
        let model: Model = model_of(small / BLOCK);
        // Fill part of it first, so the reshape moves data.
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(true));
        writer(a.clone(), model.clone(), stop, 10).await;
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let w = tokio::spawn(writer(a.clone(), model.clone(), stop.clone(), 11));
        let out = a
            .grow_add(new.iter().map(spec_of).collect(), new_groups, false)
            .await
            .unwrap_or_else(|e| panic!("{level}: grow: {e}"));
        let GrowOutcome::Reshaping { from, to, geometry } = out else {
            panic!("{out:?}")
        };
        assert_eq!(from, small);
        assert!(to > small);
        // Reads while it runs see the last writes.
        check(&a, &model).await;
        reshaped(&a).await;
        stop.store(true, std::sync::atomic::Ordering::Release);
        w.await.unwrap();
        assert_eq!(a.geometry(), geometry);
        assert_eq!(a.size(), to, "{level}: the new capacity");
        let p = a.current_process().expect("the reshape's record").status();
        assert!(p.error.is_none(), "{level}: {p:?}");
        model.lock().await.resize((to / BLOCK) as usize, 0);
        check(&a, &model).await;
        a.close().await.unwrap();
        let all: Vec<MemberSpec> = old.iter().chain(&new).map(spec_of).collect();
        let a = Array::assemble(all, AssembleOptions::default())
            .await
            .expect("assemble");
        assert_eq!(a.geometry(), geometry);
        assert_eq!(a.size(), to);
        check(&a, &model).await;
        // Parity is right everywhere: a scrub finds nothing.
        scrub_is_clean(&a, &level.to_string()).await;
        a.close().await.unwrap();
    });
}

#[test]
fn raid5_of_4_grows_to_5_online() {
    reshape_case(Level::Raid5, 1, 4, 1, false);
}

#[test]
fn raid6_of_6_grows_to_8_online() {
    reshape_case(Level::Raid6, 1, 6, 2, false);
}

#[test]
fn raid0_and_ec_grow_wider_online() {
    reshape_case(Level::Raid0, 1, 2, 1, false);
    reshape_case(Level::Ec { k: 3, m: 2 }, 1, 5, 1, false);
}

#[test]
fn raid60_grows_wider_groups_and_more_groups_online() {
    reshape_case(Level::Raid6, 2, 4, 2, false);
    reshape_case(Level::Raid6, 2, 4, 4, true);
}

#[test]
fn raid10_grows_by_a_mirror_set_online() {
    reshape_case(Level::Raid10, 2, 2, 2, false);
}

/// A level change that adds parity (`from` in `groups` groups of `width` to `to`, one
/// new member per group) while a client writes: nothing moves, the new members are
/// rebuilt with the new parity, and then the array survives one failure more per group:
/// assembled without `to`'s redundancy worth of old members in every group, it still
/// reads every acknowledged write. With `widen`, a later grow restripes the dedicated
/// parity into the usual rotation.
fn level_case(from: Level, to: Level, groups: u32, width: usize, widen: bool) {
    rt().block_on(async {
        let size = MIB + 48 * CHUNK as u64;
        let old = devs("o", groups as usize * width, size);
        let new = devs("p", groups as usize, size);
        let mut spec = create_spec(from);
        spec.groups = groups;
        let a = Array::create(spec, old.iter().map(spec_of).collect())
            .await
            .expect("create");
        let cap = a.size();
        let model: Model = model_of(cap / BLOCK);
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(true));
        writer(a.clone(), model.clone(), stop, 20).await;
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let w = tokio::spawn(writer(a.clone(), model.clone(), stop.clone(), 21));
        let out = a
            .grow_to(Some(to), new.iter().map(spec_of).collect(), false, false)
            .await
            .unwrap_or_else(|e| panic!("{from} -> {to}: {e}"));
        let want_slots: Vec<usize> = (0..groups as usize)
            .map(|g| g * (width + 1) + width)
            .collect();
        assert_eq!(
            out,
            GrowOutcome::Parity {
                slots: want_slots,
                level: to
            }
        );
        let g = a.geometry();
        assert_eq!((g.level, g.width as usize, g.dedicated), (to, width + 1, 1));
        assert_eq!(a.size(), cap, "a level change keeps the capacity");
        check(&a, &model).await;
        settle(&a).await;
        stop.store(true, std::sync::atomic::Ordering::Release);
        w.await.unwrap();
        check(&a, &model).await;
        scrub_is_clean(&a, &to.to_string()).await;
        a.close().await.unwrap();

        // From the members alone: the new level, and the new redundancy in every group.
        let all: Vec<MemberSpec> = old.iter().chain(&new).map(spec_of).collect();
        let a = Array::assemble(
            old.iter().chain(&new).map(spec_of).collect(),
            AssembleOptions::default(),
        )
        .await
        .expect("assemble");
        assert_eq!(a.geometry(), g);
        check(&a, &model).await;
        a.close().await.unwrap();
        let red = g.redundancy();
        let survivors: Vec<MemberSpec> = (0..groups as usize)
            .flat_map(|grp| {
                // Leave out the group's first `red` old members (data and rotating parity).
                old[grp * width + red..(grp + 1) * width]
                    .iter()
                    .chain(std::iter::once(&new[grp]))
                    .map(spec_of)
                    .collect::<Vec<_>>()
            })
            .collect();
        let a = Array::assemble(
            survivors,
            AssembleOptions {
                degraded: true,
                ..Default::default()
            },
        )
        .await
        .expect("assemble without redundancy's worth of members per group");
        check(&a, &model).await;
        a.abandon().await;

        if widen {
            let a = Array::assemble(all, AssembleOptions::default())
                .await
                .expect("assemble");
            settle(&a).await;
            let more = devs("q", groups as usize, size);
            let out = a
                .grow_add(more.iter().map(spec_of).collect(), false, false)
                .await
                .expect("widen");
            let GrowOutcome::Reshaping { to: big, .. } = out else {
                panic!("{out:?}")
            };
            reshaped(&a).await;
            assert_eq!(a.geometry().dedicated, 0, "the restripe rotates all parity");
            model.lock().await.resize((big / BLOCK) as usize, 0);
            check(&a, &model).await;
            scrub_is_clean(&a, "after the widening").await;
            a.close().await.unwrap();
        }
    });
}

#[test]
fn raid5_becomes_raid6_online_and_survives_two_failures() {
    level_case(Level::Raid5, Level::Raid6, 1, 4, false);
}

#[test]
fn raid0_becomes_raid5_and_ec_gains_a_parity_in_two_groups() {
    level_case(Level::Raid0, Level::Raid5, 1, 3, false);
    level_case(
        Level::Ec { k: 3, m: 2 },
        Level::Ec { k: 3, m: 3 },
        2,
        5,
        false,
    );
}

#[test]
fn raid50_becomes_raid60_and_then_grows_wider() {
    level_case(Level::Raid5, Level::Raid6, 2, 3, true);
}

#[test]
fn level_changes_that_lose_or_reshape_are_refused_by_name() {
    rt().block_on(async {
        let size = MIB + 16 * CHUNK as u64;
        let d = devs("l", 6, size);
        let a = Array::create(create_spec(Level::Raid6), d.iter().map(spec_of).collect())
            .await
            .expect("create");
        let g = a.geometry();
        let extra = devs("x", 2, size);
        for (to, n, want) in [
            (Level::Ec { k: 4, m: 3 }, 1, "only to ec:4+3"),
            (Level::Raid5, 1, "not supported"),
            (Level::Raid1, 1, "not supported"),
        ] {
            let e = a
                .grow_to(
                    Some(to),
                    extra[..n].iter().map(spec_of).collect(),
                    false,
                    false,
                )
                .await
                .expect_err("refused");
            assert!(
                e.to_string().contains(want) || e.to_string().contains("raid6"),
                "{to}: {e}"
            );
        }
        a.close().await.unwrap();
        let d = devs("k", 4, size);
        let a = Array::create(create_spec(Level::Raid5), d.iter().map(spec_of).collect())
            .await
            .expect("create");
        let e = a
            .grow_to(
                Some(Level::Raid6),
                extra.iter().map(spec_of).collect(),
                false,
                false,
            )
            .await
            .expect_err("two for one group");
        assert!(e.to_string().contains("one new member per group"), "{e}");
        let e = a
            .grow_to(
                Some(Level::Raid6),
                extra[..1].iter().map(spec_of).collect(),
                true,
                false,
            )
            .await
            .expect_err("new groups");
        assert!(e.to_string().contains("--new-groups"), "{e}");
        assert_eq!(a.geometry().level, Level::Raid5);
        for x in &extra {
            let sb = sbod_core::read_superblock(&(x.clone() as Arc<dyn BlockDev>)).await;
            assert!(sb.is_err(), "a refused device got a superblock");
        }
        a.close().await.unwrap();
        let _ = g;
    });
}

/// `sbod grow --size max` after the members were replaced by larger ones: members of
/// different sizes use the smallest, a grow past what the checksum area covers or below
/// the size in use is refused by name, and the new space reads as zeros, takes writes,
/// has its parity right (a scrub finds nothing; two members fewer still read it all) and
/// stays across a restart.
#[test]
fn bigger_members_are_used_with_size_max() {
    rt().block_on(async {
        let small = MIB + 48 * CHUNK as u64;
        let big = 16 * MIB;
        let d = devs("s", 4, small);
        let mut spec = create_spec(Level::Raid6);
        spec.bitmap_region = Some(4 * CHUNK as u64);
        let a = Array::create(spec, d.iter().map(spec_of).collect())
            .await
            .expect("create");
        let cap = a.size();
        let model: Model = model_of(cap / BLOCK);
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(true));
        writer(a.clone(), model.clone(), stop, 30).await;
        let e = a
            .grow_size(SizeTarget::Max)
            .await
            .expect_err("nothing bigger yet");
        assert!(e.to_string().contains("the smallest member"), "{e}");
        // Replace every member by a bigger one, the last one while it serves.
        let b = devs("b", 4, big);
        for (old, new) in d.iter().zip(&b) {
            a.replace(old.name(), spec_of(new), false)
                .await
                .expect("replace");
            settle(&a).await;
        }
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let w = tokio::spawn(writer(a.clone(), model.clone(), stop.clone(), 31));
        let e = a
            .grow_size(SizeTarget::Bytes(12 * MIB))
            .await
            .expect_err("past the checksum area");
        assert!(e.to_string().contains("checksum area"), "{e}");
        let e = a
            .grow_size(SizeTarget::Bytes(CHUNK as u64))
            .await
            .expect_err("shrink");
        assert!(e.to_string().contains("shrinking"), "{e}");
        let out = a.grow_size(SizeTarget::Max).await.expect("grow --size max");
        let GrowOutcome::Resized { from, to } = out else {
            panic!("{out:?}")
        };
        assert_eq!(from, cap);
        assert!(to > cap, "{from} -> {to}");
        assert_eq!(a.size(), to);
        // That was all the checksum area covers: it says so.
        let e = a
            .grow_size(SizeTarget::Max)
            .await
            .expect_err("at the limit");
        assert!(e.to_string().contains("checksum area"), "{e}");
        stop.store(true, std::sync::atomic::Ordering::Release);
        w.await.unwrap();
        model.lock().await.resize((to / BLOCK) as usize, 0);
        check(&a, &model).await;
        // The new space takes writes.
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(true));
        writer(a.clone(), model.clone(), stop, 32).await;
        check(&a, &model).await;
        scrub_is_clean(&a, "after the grow").await;
        let g = a.geometry();
        a.close().await.unwrap();
        let a = Array::assemble(b.iter().map(spec_of).collect(), AssembleOptions::default())
            .await
            .expect("assemble");
        assert_eq!((a.geometry(), a.size()), (g, to));
        check(&a, &model).await;
        a.close().await.unwrap();
        let a = Array::assemble(
            b[2..].iter().map(spec_of).collect(),
            AssembleOptions {
                degraded: true,
                ..Default::default()
            },
        )
        .await
        .expect("two members fewer");
        check(&a, &model).await;
        a.abandon().await;
    });
}

/// A member fails in the middle of a reshape: the reshape goes on degraded and ends,
/// every acknowledged write reads back, and the array runs without the member (which a
/// later assembly does not trust: it is rebuilt in full). Then a stop in the middle of another reshape and a start
/// with a member missing: the reshape resumes degraded from its record and ends, and the
/// member added back is rebuilt in full (it missed data that moved, which no bitmap
/// describes) with everything reading back and the parity right.
#[test]
fn a_member_failing_or_missing_during_a_reshape_loses_nothing() {
    rt().block_on(async {
        use sbod_core::process::ReshapeStep;
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        let size = MIB + 48 * CHUNK as u64;
        let d = devs("f", 5, size);
        let a = Array::create(create_spec(Level::Raid6), d.iter().map(spec_of).collect())
            .await
            .expect("create");
        let model: Model = model_of(a.size() / BLOCK);
        writer(
            a.clone(),
            model.clone(),
            Arc::new(AtomicBool::new(true)),
            40,
        )
        .await;
        let windows = Arc::new(AtomicUsize::new(0));
        {
            let (windows, victim) = (windows.clone(), d[1].clone());
            a.on_reshape_step(Arc::new(move |step, _| {
                if step == ReshapeStep::Recorded && windows.fetch_add(1, Ordering::AcqRel) == 3 {
                    victim.dead.store(true, Ordering::Release);
                }
            }));
        }
        let stop = Arc::new(AtomicBool::new(false));
        let w = tokio::spawn(writer(a.clone(), model.clone(), stop.clone(), 41));
        let extra = devs("fx", 1, size);
        let out = a
            .grow_add(extra.iter().map(spec_of).collect(), false, false)
            .await
            .expect("grow");
        let GrowOutcome::Reshaping { to, geometry, .. } = out else {
            panic!("{out:?}")
        };
        reshaped(&a).await;
        stop.store(true, Ordering::Release);
        w.await.unwrap();
        assert!(
            windows.load(Ordering::Acquire) > 4,
            "the member failed mid-way"
        );
        let p = a.current_process().expect("the reshape's record").status();
        assert!(p.error.is_none(), "{p:?}");
        assert_eq!((a.geometry(), a.size()), (geometry.clone(), to));
        let st = a.status();
        assert!(
            st.members
                .iter()
                .any(|m| m.state == sbod_core::array::MemberState::Failed),
            "{:?}",
            st.members
        );
        model.lock().await.resize((to / BLOCK) as usize, 0);
        check(&a, &model).await;
        a.close().await.unwrap();
        // It answers again, with the superblock of the old layout.
        d[1].dead.store(false, Ordering::Release);
        let a = back_in_full(
            d.iter().chain(&extra).map(spec_of).collect(),
            1,
            &geometry,
            &model,
        )
        .await;
        a.close().await.unwrap();

        // A stop mid-reshape, then a start without a member.
        let d = devs("c", 4, size);
        let a = Array::create(create_spec(Level::Raid5), d.iter().map(spec_of).collect())
            .await
            .expect("create");
        let model: Model = model_of(a.size() / BLOCK);
        writer(
            a.clone(),
            model.clone(),
            Arc::new(AtomicBool::new(true)),
            50,
        )
        .await;
        let crash = Arc::new(tokio::sync::Notify::new());
        {
            let (crash, n) = (crash.clone(), AtomicUsize::new(0));
            a.on_reshape_step(Arc::new(move |step, _| {
                if step == ReshapeStep::Recorded && n.fetch_add(1, Ordering::AcqRel) == 4 {
                    crash.notify_one();
                }
            }));
        }
        let extra = devs("cx", 1, size);
        let out = a
            .grow_add(extra.iter().map(spec_of).collect(), false, false)
            .await
            .expect("grow");
        let GrowOutcome::Reshaping { to, geometry, .. } = out else {
            panic!("{out:?}")
        };
        crash.notified().await;
        // Stopped mid-way (a crash with a member missing is the write hole, refused as
        // for any degraded start; see the power-cut suite for crashes).
        a.close().await.unwrap();
        let a = Array::assemble(
            d[..2]
                .iter()
                .chain(&d[3..])
                .chain(&extra)
                .map(spec_of)
                .collect(),
            AssembleOptions {
                degraded: true,
                no_processes: true,
                ..Default::default()
            },
        )
        .await
        .expect("assemble without c2 in the middle of the reshape");
        assert!(a.size() < to, "the new capacity before the reshape ends");
        check(&a, &model).await;
        a.reshape_now().await.expect("the reshape resumes degraded");
        let p = a.current_process().expect("the reshape's record").status();
        assert!(p.error.is_none(), "{p:?}");
        assert_eq!((a.geometry(), a.size()), (geometry, to));
        model.lock().await.resize((to / BLOCK) as usize, 0);
        check(&a, &model).await;
        let back = a.re_add(spec_of(&d[2])).await.expect("re-add c2");
        assert!(
            !back.bitmap,
            "recovered from the bitmap across a reshape: {back:?}"
        );
        a.rebuild_now().await.expect("rebuild c2");
        settle(&a).await;
        check(&a, &model).await;
        scrub_is_clean(&a, "after the grow").await;
        a.close().await.unwrap();
    });
}

/// Narrow `level` (`groups` groups of `width`) by `remove` members (the last of each
/// group) while a client writes below the new size: data past the new size is refused
/// first (and zeros there are not data), then everything is checked as for a grow, and
/// the members let go carry no superblock of the array any more.
fn narrowing_case(level: Level, groups: u32, width: usize, remove: usize) {
    rt().block_on(async {
        let size = MIB + 48 * CHUNK as u64;
        let old = devs("w", groups as usize * width, size);
        let mut spec = create_spec(level);
        spec.groups = groups;
        let a = Array::create(spec, old.iter().map(spec_of).collect())
            .await
            .expect("create");
        let big = a.size();
        let per = remove / groups as usize;
        // Narrower groups, and the last rows of every member kept for the backup area.
        let small = a.geometry().narrowed(per).unwrap().capacity();
        assert!(small < big / width as u64 * (width - per) as u64);
        let leaving: Vec<String> = (0..old.len())
            .filter(|i| i % width >= width - per)
            .map(|i| old[i].name().to_string())
            .collect();
        // Data past the new size: refused, nothing changed.
        a.write(small + 8 * BLOCK, block(small, 3), false)
            .await
            .unwrap();
        let e = a
            .grow_remove(&leaving, false)
            .await
            .expect_err("data past the new size");
        assert!(
            matches!(e, Error::Refused(_)) && e.to_string().contains("holds data at byte"),
            "{e}"
        );
        assert_eq!(a.size(), big);
        // A member that is not one of the last of its group: refused, naming those.
        {
            let first: Vec<String> = (0..old.len())
                .filter(|i| i % width < per)
                .map(|i| old[i].name().to_string())
                .collect();
            let e = a
                .grow_remove(&first, false)
                .await
                .expect_err("first member");
            assert!(e.to_string().contains(&leaving[0]), "{e}");
        }
        // Zeros there are not data.
        a.write(small + 8 * BLOCK, AlignedBuf::zeroed(BLOCK as usize), false)
            .await
            .unwrap();
        let model: Model = model_of(small / BLOCK);
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(true));
        writer(a.clone(), model.clone(), stop, 20).await;
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let w = tokio::spawn(writer(a.clone(), model.clone(), stop.clone(), 21));
        let out = a
            .grow_remove(&leaving, false)
            .await
            .unwrap_or_else(|e| panic!("{level}: narrowing: {e}"));
        let GrowOutcome::Reshaping { from, to, geometry } = out else {
            panic!("{out:?}")
        };
        assert_eq!((from, to), (big, small), "{level}");
        assert_eq!(geometry.width as usize, width - per);
        // At once the volume is the smaller size; reads while it runs see the last writes.
        assert_eq!(a.size(), small);
        check(&a, &model).await;
        reshaped(&a).await;
        stop.store(true, std::sync::atomic::Ordering::Release);
        w.await.unwrap();
        assert_eq!(a.geometry(), geometry);
        assert_eq!(a.size(), small);
        assert_eq!(a.status().members.len(), old.len() - remove);
        check(&a, &model).await;
        a.close().await.unwrap();
        for d in &old {
            let sb = sbod_core::read_superblock(&(d.clone() as Arc<dyn BlockDev>)).await;
            let name = d.name().to_string();
            assert_eq!(sb.is_ok(), !leaving.contains(&name), "{name}: {sb:?}");
        }
        let stay: Vec<MemberSpec> = old
            .iter()
            .filter(|d| !leaving.contains(&d.name().to_string()))
            .map(spec_of)
            .collect();
        let a = Array::assemble(stay, AssembleOptions::default())
            .await
            .expect("assemble");
        assert_eq!(a.geometry(), geometry);
        check(&a, &model).await;
        scrub_is_clean(&a, &level.to_string()).await;
        // The rows kept for the backup area come back with `--size max`.
        let out = a.grow_size(SizeTarget::Max).await.expect("size max");
        let GrowOutcome::Resized { from, to } = out else {
            panic!("{out:?}")
        };
        assert!(from == small && to > small, "{from} -> {to}");
        model.lock().await.resize((to / BLOCK) as usize, 0);
        check(&a, &model).await;
        a.close().await.unwrap();
    });
}

#[test]
fn raid5_of_5_narrows_to_4_online() {
    narrowing_case(Level::Raid5, 1, 5, 1);
}

#[test]
fn raid6_in_two_groups_and_ec_and_raid0_narrow_online() {
    narrowing_case(Level::Raid6, 2, 6, 2);
    narrowing_case(Level::Ec { k: 4, m: 2 }, 1, 6, 1);
    narrowing_case(Level::Raid0, 1, 3, 1);
}

#[test]
fn members_failing_during_a_narrowing_lose_nothing() {
    rt().block_on(async {
        use sbod_core::process::ReshapeStep;
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        let size = MIB + 48 * CHUNK as u64;
        let d = devs("nf", 6, size);
        let a = Array::create(create_spec(Level::Raid6), d.iter().map(spec_of).collect())
            .await
            .expect("create");
        let small = a.geometry().narrowed(1).unwrap().capacity();
        let model: Model = model_of(small / BLOCK);
        writer(
            a.clone(),
            model.clone(),
            Arc::new(AtomicBool::new(true)),
            60,
        )
        .await;
        // A member that stays fails after the first window, the one leaving after the third:
        // raid6 survives both, and the walk goes on degraded.
        let windows = Arc::new(AtomicUsize::new(0));
        {
            let (windows, stays, leaves) = (windows.clone(), d[1].clone(), d[5].clone());
            a.on_reshape_step(Arc::new(move |step, _| {
                if step == ReshapeStep::Recorded {
                    match windows.fetch_add(1, Ordering::AcqRel) {
                        0 => stays.dead.store(true, Ordering::Release),
                        2 => leaves.dead.store(true, Ordering::Release),
                        _ => {}
                    }
                }
            }));
        }
        a.update_settings(|s| s.rebuild_max_rate = 16 * MIB);
        let stop = Arc::new(AtomicBool::new(false));
        let w = tokio::spawn(writer(a.clone(), model.clone(), stop.clone(), 61));
        let out = a
            .grow_remove(&[d[5].name().to_string()], false)
            .await
            .expect("narrowing");
        let GrowOutcome::Reshaping { to, geometry, .. } = out else {
            panic!("{out:?}")
        };
        assert_eq!(to, small);
        reshaped(&a).await;
        stop.store(true, Ordering::Release);
        w.await.unwrap();
        assert!(windows.load(Ordering::Acquire) > 3, "both failed mid-way");
        let p = a.current_process().expect("the reshape's record").status();
        assert!(p.error.is_none(), "{p:?}");
        assert_eq!((a.geometry(), a.size()), (geometry.clone(), small));
        let st = a.status();
        assert_eq!(st.members.len(), 5, "{:?}", st.members);
        check(&a, &model).await;
        a.close().await.unwrap();
        // The member that stays answers again: taken back, rebuilt in full (it missed
        // moved data), and then every block reads back from the new layout.
        d[1].dead.store(false, Ordering::Release);
        let a = back_in_full(d[..5].iter().map(spec_of).collect(), 1, &geometry, &model).await;
        scrub_is_clean(&a, "after the narrowing and the rebuild").await;
        a.close().await.unwrap();
    });
}

/// Change the chunk of `level` (`groups` groups of `width`) to `chunk` while a client
/// writes below the size the volume keeps meanwhile: data in the rows set aside for the
/// backup area is refused first (zeros there are not data), the volume is that much
/// smaller while the data moves and gets them back, as zeros, when it ends; every
/// acknowledged write reads back, before and after a restart, and parity is right.
fn rechunk_case(level: Level, groups: u32, width: usize, chunk: u32, chunks: u64) {
    rt().block_on(async {
        let size = MIB + chunks * CHUNK as u64;
        let d = devs(&format!("c{chunk}-"), groups as usize * width, size);
        let mut spec = create_spec(level);
        spec.groups = groups;
        if level == Level::Raid10 {
            spec.copies = width as u32;
            spec.groups = 1;
        }
        let a = Array::create(spec, d.iter().map(spec_of).collect())
            .await
            .expect("create");
        let big = a.size();
        // Data in the last rows: refused, nothing changed.
        a.write(big - BLOCK, block(big - BLOCK, 3), false)
            .await
            .unwrap();
        let e = a
            .grow_chunk(chunk, false)
            .await
            .expect_err("data in the backup area");
        assert!(
            matches!(e, Error::Refused(_)) && e.to_string().contains("holds data at byte"),
            "{e}"
        );
        assert_eq!((a.size(), a.geometry().chunk), (big, CHUNK));
        a.write(big - BLOCK, AlignedBuf::zeroed(BLOCK as usize), false)
            .await
            .unwrap();
        // The chunk it has, one the bitmap's region (2 chunks) does not divide: refused.
        assert!(a.grow_chunk(CHUNK, false).await.is_err());
        assert!(a.grow_chunk(4 * CHUNK, false).await.is_err());
        let model: Model = model_of(big / BLOCK);
        // The client keeps below half the volume (the backup area is at most a quarter of
        // every member).
        let small_model: Model = model_of(big / 2 / BLOCK);
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(true));
        writer(a.clone(), small_model.clone(), stop, 30).await;
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let w = tokio::spawn(writer(a.clone(), small_model.clone(), stop.clone(), 31));
        let out = a
            .grow_chunk(chunk, false)
            .await
            .unwrap_or_else(|e| panic!("{level}: new chunk: {e}"));
        let GrowOutcome::Reshaping { from, to, geometry } = out else {
            panic!("{out:?}")
        };
        assert_eq!(from, big);
        assert_eq!(geometry.chunk, chunk);
        assert!(a.size() < big && a.size() >= small_model.lock().await.len() as u64 * BLOCK);
        check(&a, &small_model).await;
        reshaped(&a).await;
        stop.store(true, std::sync::atomic::Ordering::Release);
        w.await.unwrap();
        let p = a.current_process().expect("the reshape's record").status();
        assert!(p.error.is_none(), "{level}: {p:?}");
        assert_eq!(a.geometry(), geometry);
        assert_eq!(a.size(), to);
        // The same size where the new chunk divides the members' data, else what it
        // leaves of them.
        let per = geometry.member_size;
        assert_eq!(per, (chunks * CHUNK as u64) / chunk as u64 * chunk as u64);
        assert_eq!(to, big / (chunks * CHUNK as u64) * per, "{level}: the size");
        model.lock().await.truncate((to / BLOCK) as usize);
        // The rows that held the backup read as zeros.
        let copy = small_model.lock().await.clone();
        model.lock().await[..copy.len()].copy_from_slice(&copy);
        check(&a, &model).await;
        a.close().await.unwrap();
        let a = Array::assemble(d.iter().map(spec_of).collect(), AssembleOptions::default())
            .await
            .expect("assemble");
        assert_eq!(a.geometry(), geometry);
        check(&a, &model).await;
        scrub_is_clean(&a, &format!("{level} to chunk {chunk}")).await;
        a.close().await.unwrap();
    });
}

#[test]
fn raid5_gets_a_larger_chunk_online() {
    rechunk_case(Level::Raid5, 1, 4, 128 << 10, 96);
    // A chunk that does not divide the members' data: they keep what it does.
    rechunk_case(Level::Raid5, 1, 4, 128 << 10, 97);
}

#[test]
fn raid6_in_two_groups_ec_raid0_and_raid10_get_a_new_chunk_online() {
    rechunk_case(Level::Raid6, 2, 6, 32 << 10, 96);
    rechunk_case(Level::Ec { k: 4, m: 2 }, 1, 6, 16 << 10, 96);
    rechunk_case(Level::Raid0, 1, 3, 128 << 10, 96);
    rechunk_case(Level::Raid10, 2, 2, 32 << 10, 96);
}

/// A member dying after the first window of a new chunk (the walk goes on degraded, its
/// windows written aside on the members still in service), and another put back from a
/// copy taken before the change (its superblock says the old chunk): when both answer
/// again they are taken back as stale, not damaged (the chunk changes with the event, as
/// the level does), and rebuilt in full.
#[test]
fn members_out_during_a_new_chunk_come_back_and_are_rebuilt_in_full() {
    rt().block_on(async {
        use sbod_core::process::ReshapeStep;
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        let size = MIB + 96 * CHUNK as u64;
        let d = devs("cf", 6, size);
        let a = Array::create(create_spec(Level::Raid6), d.iter().map(spec_of).collect())
            .await
            .expect("create");
        let model: Model = model_of(a.size() / 2 / BLOCK);
        writer(
            a.clone(),
            model.clone(),
            Arc::new(AtomicBool::new(true)),
            70,
        )
        .await;
        // A copy of d5 from before the change (its superblock says the old chunk).
        a.close().await.unwrap();
        let old_copy = d[5].with_data(|v| v.clone());
        let a = Array::assemble(d.iter().map(spec_of).collect(), AssembleOptions::default())
            .await
            .expect("assemble");
        let windows = Arc::new(AtomicUsize::new(0));
        {
            let (windows, holder) = (windows.clone(), d[0].clone());
            a.on_reshape_step(Arc::new(move |step, _| {
                if step == ReshapeStep::Recorded && windows.fetch_add(1, Ordering::AcqRel) == 0 {
                    holder.dead.store(true, Ordering::Release);
                }
            }));
        }
        a.update_settings(|s| s.rebuild_max_rate = 32 * MIB);
        let stop = Arc::new(AtomicBool::new(false));
        let w = tokio::spawn(writer(a.clone(), model.clone(), stop.clone(), 71));
        let out = a.grow_chunk(32 << 10, false).await.expect("new chunk");
        let GrowOutcome::Reshaping { geometry, .. } = out else {
            panic!("{out:?}")
        };
        reshaped(&a).await;
        stop.store(true, Ordering::Release);
        w.await.unwrap();
        let p = a.current_process().expect("the reshape's record").status();
        assert!(
            windows.load(Ordering::Acquire) > 3,
            "it went on after the failure: {p:?} {:?}",
            a.status().members
        );
        let p = a.current_process().expect("the reshape's record").status();
        assert!(p.error.is_none(), "{p:?}");
        assert_eq!(a.geometry(), geometry);
        check(&a, &model).await;
        a.close().await.unwrap();
        d[0].dead.store(false, Ordering::Release);
        d[5].with_data(|v| v.copy_from_slice(&old_copy));
        let a = Array::assemble(d.iter().map(spec_of).collect(), AssembleOptions::default())
            .await
            .expect("assemble: the members that were out are stale, not damaged");
        let stale: Vec<usize> = a.report().stale.iter().map(|s| s.slot).collect();
        assert!(stale.contains(&0) && stale.contains(&5), "{stale:?}");
        assert!(
            a.report().stale.iter().all(|s| !s.bitmap),
            "{:?}",
            a.report().stale
        );
        settle(&a).await;
        assert_eq!(a.geometry(), geometry);
        check(&a, &model).await;
        scrub_is_clean(&a, "after the new chunk and the rebuilds").await;
        a.close().await.unwrap();
    });
}
