//! The log of an array: found among the devices at assembly and replayed into the members
//! before the array serves; a parity array that crashed mid-write and lost a member starts
//! with `--degraded` alone when its log journaled the write, and reads back what was
//! written; without the log it is refused as before. The write path does not journal yet
//! (see `log::attach::JOURNALING`): these tests put the record in the log as the engine
//! will, with the exact member writes of a stripe's plan.

mod torture_util;

use sbod_core::dev::fault::{PowerCutDev, PowerSupply, Rng};
use sbod_core::dev::{BlockDev, MemDev};
use sbod_core::error::Step;
use sbod_core::log::{Data, Write};
use sbod_core::{AlignedBuf, Array, AssembleOptions, Error, MemberSpec};
use std::sync::Arc;
use std::time::Duration;
use torture_util::*;

const LOG_SIZE: u64 = (64 << 10) + (2 << 20);

fn spec_of(dev: Arc<dyn BlockDev>) -> MemberSpec {
    MemberSpec {
        path: dev.name().to_string(),
        dev,
        is_file: false,
        domain: String::new(),
    }
}

/// The member writes of stripe 0 after `writes` on a fresh array of layout `l`: what a
/// stripe plan hands the log (every member's chunk, data and parity).
async fn plan_of(l: &Layout, writes: &[(u64, Vec<u8>)]) -> Vec<Write> {
    let mems: Vec<Arc<MemDev>> = (0..l.members)
        .map(|i| Arc::new(MemDev::new(format!("r{i}"), MEMBER_SIZE)))
        .collect();
    let r = Array::create(spec(l), specs(&mems)).await.unwrap();
    for (off, d) in writes {
        r.write(*off, AlignedBuf::from_slice(d), false)
            .await
            .unwrap();
    }
    let off = r.geometry.data_offset as usize;
    let plan = mems
        .iter()
        .enumerate()
        .map(|(slot, m)| Write {
            slot: slot as u32,
            offset: 0,
            data: Data::Bytes(
                AlignedBuf::from_slice(&m.with_data(|d| d[off..off + CHUNK as usize].to_vec()))
                    .into_shared(),
            ),
        })
        .collect();
    r.close().await.unwrap();
    plan
}

struct Crash {
    images: Vec<Vec<u8>>,
    log: Vec<u8>,
    blocks: u64,
    stripe_blocks: u64,
}

/// Write `old` everywhere (durable), then a stripe write of `new` over stripe 0 whose
/// record is in the log (if `journal`) and whose member writes landed on `landed` members
/// only; then the power goes.
async fn crash_mid_stripe(l: &Layout, journal: bool, landed: &[usize], rng: &Rng) -> Crash {
    let supply = PowerSupply::new();
    let devs = power_members(blank(l.members), &supply, Duration::ZERO, |_| rng.next());
    let logd = PowerCutDev::new(
        "log",
        vec![0u8; LOG_SIZE as usize],
        &supply,
        Duration::ZERO,
        rng.next(),
    );
    let a = Array::create(spec(l), specs(&devs)).await.unwrap();
    a.add_log(spec_of(logd.clone()), false).await.unwrap();
    a.set_log_journaling(journal).await;
    let blocks = a.size() / BLOCK as u64;
    let stripe_blocks = a.geometry.stripe_data() / BLOCK as u64;
    let old = blocks_of(1, 0, blocks);
    a.write(0, AlignedBuf::from_slice(&old), false)
        .await
        .unwrap();
    a.flush().await.unwrap();
    // A small write to stripe 0 marks its region dirty (the write-intent bitmap); then the
    // stripe write the crash interrupts.
    let small = blocks_of(2, 0, 1);
    a.write(0, AlignedBuf::from_slice(&small), true)
        .await
        .unwrap();
    let new = blocks_of(3, 0, stripe_blocks);
    let plan = plan_of(l, &[(0, old.clone()), (0, small.clone()), (0, new.clone())]).await;
    if journal {
        let log = a.log().expect("the log runs");
        let t = log.append(&plan).await.unwrap();
        // The engine would write every member now; the power goes after some.
        std::mem::forget(t);
    }
    let data_offset = a.geometry.data_offset;
    for &i in landed {
        let Data::Bytes(b) = &plan[i].data else {
            unreachable!()
        };
        // SAFETY: nothing else uses the plan's buffers.
        let bytes = unsafe { b.as_slice() }.to_vec();
        sbod_core::dev::fault::write_all(
            &(devs[i].clone() as Arc<dyn BlockDev>),
            data_offset,
            &bytes,
            true,
        )
        .unwrap();
    }
    supply.cut(rng.next());
    a.abandon().await;
    Crash {
        images: devs.iter().map(|d| d.image()).collect(),
        log: logd.image(),
        blocks,
        stripe_blocks,
    }
}

fn restart(c: &Crash, lost: Option<usize>, with_log: bool) -> Vec<MemberSpec> {
    let supply = PowerSupply::new();
    let mut v: Vec<MemberSpec> = c
        .images
        .iter()
        .enumerate()
        .filter(|(i, _)| Some(*i) != lost)
        .map(|(i, img)| {
            spec_of(PowerCutDev::new(
                format!("m{i}"),
                img.clone(),
                &supply,
                Duration::ZERO,
                1,
            ))
        })
        .collect();
    if with_log {
        v.push(spec_of(PowerCutDev::new(
            "log",
            c.log.clone(),
            &supply,
            Duration::ZERO,
            1,
        )));
    }
    v
}

fn degraded() -> AssembleOptions {
    AssembleOptions {
        degraded: true,
        ..Default::default()
    }
}

#[test]
fn a_crashed_degraded_array_with_a_journaling_log_starts_and_reads_right() {
    let seed0 = seed();
    let rng = Rng::new(seed0);
    rt(2).block_on(async {
        for name in ["raid5", "raid6", "ec:3+2"] {
            let l = layout(name);
            for trial in 0..iters(3) {
                let what = format!("{name} trial {trial} (SBOD_TORTURE_SEED={seed0})");
                // Some members got the stripe's new chunk, others not.
                let landed: Vec<usize> = (0..l.members).filter(|_| rng.chance(0.5)).collect();
                let c = crash_mid_stripe(&l, true, &landed, &rng).await;
                let lost = rng.below(l.members as u64) as usize;
                let a = Array::assemble(restart(&c, Some(lost), true), degraded())
                    .await
                    .unwrap_or_else(|e| panic!("{what}: m{lost} lost: {e}"));
                let st = a.status();
                assert_eq!(st.state, "degraded", "{what}");
                let log = st.log.expect("the log is attached");
                assert_eq!(log.replayed_records, 1, "{what}");
                assert_eq!(log.state, "optimal", "{what}");
                let got = a.read(0, c.blocks as usize * BLOCK).await.unwrap();
                for (i, b) in got.chunks(BLOCK).enumerate() {
                    let want = if (i as u64) < c.stripe_blocks { 3 } else { 1 };
                    assert_eq!(
                        decode(b, i as u64),
                        Some(want),
                        "{what}: m{lost} lost, landed {landed:?}: block {i}"
                    );
                }
                // The replay is durable, and the new session's log holds nothing old.
                a.close().await.unwrap();
            }
        }
    });
}

#[test]
fn without_a_journaling_log_the_write_hole_is_refused() {
    let seed0 = seed();
    let rng = Rng::new(seed0);
    rt(2).block_on(async {
        let l = layout("raid5");
        let landed = vec![0usize];
        let c = crash_mid_stripe(&l, false, &landed, &rng).await;
        // The log is attached but did not journal: the hole is there, refused as ever.
        let e = Array::assemble(restart(&c, Some(2), true), degraded())
            .await
            .err()
            .expect("a write hole was ignored");
        assert!(
            matches!(e, Error::Refused(_)) && e.to_string().contains("write hole"),
            "{e}"
        );
        // With every member, nothing is lost, and the log has nothing to replay.
        let a = Array::assemble(restart(&c, None, true), AssembleOptions::default())
            .await
            .unwrap();
        assert_eq!(a.status().log.unwrap().replayed_records, 0);
        a.close().await.unwrap();
    });
}

#[test]
fn a_journaling_log_that_cannot_be_found_is_refused_unless_forced() {
    let seed0 = seed();
    let rng = Rng::new(seed0);
    rt(2).block_on(async {
        let l = layout("raid5");
        let c = crash_mid_stripe(&l, true, &[1], &rng).await;
        let e = Array::assemble(restart(&c, None, false), AssembleOptions::default())
            .await
            .err()
            .expect("started without its log");
        let m = e.to_string();
        assert!(
            m.contains("log")
                && e.advice().iter().any(|s| matches!(s, Step::Force { .. }))
                && m.contains("not shut down cleanly"),
            "{m}"
        );
        // Forced: it starts, the log recorded as missing; writes take the in-pool path.
        let a = Array::assemble(
            restart(&c, None, false),
            AssembleOptions {
                force: true,
                ..Default::default()
            },
        )
        .await
        .unwrap();
        let log = a.status().log.unwrap();
        assert_eq!(log.state, "failed");
        assert_eq!(log.devices[0].state, "missing");
        assert!(!log.journaling);
        a.write(0, AlignedBuf::from_slice(&blocks_of(4, 0, 1)), true)
            .await
            .unwrap();
        a.close().await.unwrap();
    });
}

/// Both log devices fail: once what the log acknowledged is applied and the pool flushed,
/// the array records the log as failed and writes take the in-pool path; a restart needs
/// neither log device nor --force.
#[test]
fn a_failed_log_degrades_to_the_in_pool_path() {
    use sbod_core::dev::fault::FaultDev;
    rt(2).block_on(async {
        let l = layout("raid5");
        let mems: Vec<Arc<MemDev>> = (0..l.members)
            .map(|i| Arc::new(MemDev::new(format!("m{i}"), MEMBER_SIZE)))
            .collect();
        let la = Arc::new(FaultDev::new(Arc::new(MemDev::new("logA", LOG_SIZE)), 1));
        let lb = Arc::new(FaultDev::new(Arc::new(MemDev::new("logB", LOG_SIZE)), 2));
        let a = Array::create(spec(&l), specs(&mems)).await.unwrap();
        a.add_log(spec_of(la.clone()), false).await.unwrap();
        a.add_log(spec_of(lb.clone()), false).await.unwrap();
        a.set_log_journaling(true).await;
        let plan = plan_of(&l, &[(0, blocks_of(5, 0, 12))]).await;
        let log = a.log().unwrap();
        log.append(&plan).await.unwrap().applied();
        // One device out: recorded on the members, the log goes on.
        la.vanish();
        log.append(&plan).await.unwrap().applied();
        let st = a.status().log.unwrap();
        assert_eq!(st.state, "degraded", "{st:?}");
        // Both out: appends fail; the engine records the log as failed.
        lb.vanish();
        assert!(log.append(&plan).await.is_err());
        a.log_failed().await.unwrap();
        let st = a.status().log.unwrap();
        assert_eq!(st.state, "failed", "{st:?}");
        assert!(!st.journaling);
        assert!(a.log().is_none());
        a.write(0, AlignedBuf::from_slice(&blocks_of(6, 0, 4)), true)
            .await
            .unwrap();
        a.abandon().await;
        // Restart without any log device: nothing to replay, nothing refused.
        let b = Array::assemble(
            mems.iter()
                .map(|m| spec_of(m.clone() as Arc<dyn BlockDev>))
                .collect(),
            AssembleOptions::default(),
        )
        .await
        .unwrap();
        let st = b.status().log.unwrap();
        assert_eq!(st.state, "failed");
        let got = b.read(0, 4 * BLOCK).await.unwrap();
        for (i, c) in got.chunks(BLOCK).enumerate() {
            assert_eq!(decode(c, i as u64), Some(6));
        }
        b.close().await.unwrap();
    });
}
