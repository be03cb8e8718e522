//! A crash (SIGKILL, power cut) while a member is being replaced, then a start with every
//! member there: the refusal names what is really at risk (the replacement whose rebuild
//! had not reached the regions written at the time), not members that are "missing", and
//! says what each choice risks.

use sbod_core::dev::{BlockDev, MemDev};
use sbod_core::error::Step;
use sbod_core::{AlignedBuf, Array, AssembleOptions, CreateSpec, Error, Level, MemberSpec};
use std::sync::Arc;

const MIB: u64 = 1 << 20;
const CHUNK: u32 = 64 << 10;

fn spec_of(d: &Arc<MemDev>) -> MemberSpec {
    MemberSpec {
        dev: d.clone() as Arc<dyn BlockDev>,
        path: d.name().to_string(),
        is_file: false,
        domain: String::new(),
    }
}

fn buf(len: usize, seed: u8) -> AlignedBuf {
    let mut b = AlignedBuf::zeroed(len);
    for (i, x) in b.iter_mut().enumerate() {
        *x = (i as u8).wrapping_mul(31).wrapping_add(seed);
    }
    b
}

#[test]
fn a_crash_during_a_replace_says_what_is_at_risk_not_that_members_are_missing() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let size = MIB + 64 * CHUNK as u64;
        let devs: Vec<Arc<MemDev>> = (0..6)
            .map(|i| Arc::new(MemDev::new(format!("m{i}"), size)))
            .collect();
        let new = Arc::new(MemDev::new("new", size));
        let spec = CreateSpec {
            name: "r6".into(),
            level: Level::Raid6,
            chunk: CHUNK,
            groups: 1,
            spares: 0,
            declustered: false,
            copies: 2,
            bitmap_region: Some(2 * CHUNK as u64),
            assume_clean: true,
            integrity: sbod_core::integrity::Kind::Crc32c,
            force: false,
        };
        let a = Array::create(spec, devs.iter().map(spec_of).collect())
            .await
            .expect("create");
        let vol = a.size();
        a.write(0, buf(vol as usize, 1), true).await.unwrap();
        a.close().await.unwrap();

        // Started without background processes: the replacement's rebuild stays at 0.
        let all = || {
            devs.iter()
                .chain(std::iter::once(&new))
                .map(spec_of)
                .collect::<Vec<_>>()
        };
        let a = Array::assemble(
            devs.iter().map(spec_of).collect(),
            AssembleOptions {
                no_processes: true,
                ..Default::default()
            },
        )
        .await
        .expect("start");
        // The usual replace: of a member that failed.
        a.fail("m0", false).await.expect("fail m0");
        a.replace("m0", spec_of(&new), false)
            .await
            .expect("replace");
        // Writes after the replacement began, near the end of the volume (past where any
        // rebuild got), and then the process dies.
        let at = vol - 4 * CHUNK as u64 * 4;
        a.write(at, buf(CHUNK as usize, 7), false).await.unwrap();
        a.abandon().await;

        let e = Array::assemble(all(), AssembleOptions::default())
            .await
            .err()
            .expect("a dirty start with a replacement mid-rebuild is refused");
        let msg = e.to_string();
        let advice = e.advice();
        println!("{msg}\nadvice: {advice:?}");
        assert!(matches!(e, Error::Refused(_)), "{e:?}");
        // Every member is here: nothing tells the person to bring members back.
        let says = |s: &Step| match s {
            Step::Say { text } => text.clone(),
            Step::Force { does } | Step::Degraded { does } => does.clone(),
            other => format!("{other:?}"),
        };
        for s in &advice {
            assert!(
                !says(s).contains("with all its members"),
                "advice asks for members that are all here: {advice:?}"
            );
        }
        // The message names the replacement and why it is at risk.
        assert!(msg.contains("new"), "{msg}");
        assert!(msg.contains("replacement"), "{msg}");
        assert!(!msg.contains("(missing)"), "{msg}");
        assert!(msg.contains("every member is here"), "{msg}");
        // Each choice says what it risks.
        let force = advice
            .iter()
            .find_map(|s| match s {
                Step::Force { does } => Some(does.clone()),
                _ => None,
            })
            .expect("--force is offered");
        assert!(force.contains("may"), "{force}");
        assert!(force.contains("may read wrong"), "{force}");
        // --degraded would change nothing (no member is missing): not offered.
        assert!(
            !advice.iter().any(|s| matches!(s, Step::Degraded { .. })),
            "{advice:?}"
        );

        // The choice offered works: forced, it starts, and (the crash here tore no
        // write) reads back what was written.
        let a = Array::assemble(
            all(),
            AssembleOptions {
                force: true,
                ..Default::default()
            },
        )
        .await
        .expect("forced start");
        let back = a.read(at, CHUNK as usize).await.unwrap();
        assert_eq!(&back[..], &buf(CHUNK as usize, 7)[..]);
        a.close().await.unwrap();
    });
}
