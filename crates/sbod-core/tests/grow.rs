//! `sbod grow` in the engine: a mirror gets one more copy and drops one, concat appends
//! members, all while a client writes; every level that would need its data restriped is
//! refused with nothing changed. After each change the array is stopped (cleanly, and as a
//! power cut would) and assembled again from its members alone: the geometry the members
//! record is the new one and every acknowledged write reads back.

use sbod_core::dev::{BlockDev, MemDev};
use sbod_core::{
    AlignedBuf, Array, AssembleOptions, CreateSpec, Error, GrowOutcome, Level, MemberSpec,
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
    let blocks = a.size() / BLOCK;
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
        let h = a.start_scrub(false).expect("scrub");
        h.wait().await;
        let s = h.status();
        assert_eq!(s.mismatches, 0, "{level}: {s:?}");
        assert!(s.error.is_none(), "{level}: {s:?}");
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
