//! The distributed spare space of a declustered layout on members whose file system is
//! full (thin member files): a chunk the distributed rebuild (or the copy-back) could not
//! write to its new place, for want of space, must not be read from there.
//!
//! Found by the trust model (`tests/model.rs`, `trust_model_random_io`): the rebuild took
//! a refused write for done, moved its row boundary past the chunk, and reads below the
//! boundary returned the spare space's zeros for it (docs/RELIABILITY.md, "What the
//! torture found"). Now the window stops there, the transition says the file system is
//! full, and it resumes once space is back: reads meanwhile rebuild the chunk from its
//! stripe, as before the transition.

use crate::torture_util;

use sbod_core::dev::{BlockDev, IoClass, MemDev};
use sbod_core::{AlignedBuf, Array, CreateSpec, Error, Level, MemberSpec};
use sbod_testkit::fault::{FaultDev, SpacePool};
use std::sync::Arc;
use torture_util::{check_volume, pattern, rt, scrub_check, spared};

const MEMBERS: usize = 10;
const CHUNK: u32 = 16 << 10;
/// 1 MiB of metadata, then 32 rows of data.
const MEMBER_SIZE: u64 = (1 << 20) + 32 * CHUNK as u64;

fn thin(name: &str, pool: &Arc<SpacePool>, seed: u64) -> MemberSpec {
    let inner: Arc<dyn BlockDev> = Arc::new(MemDev::new(name, MEMBER_SIZE));
    MemberSpec {
        dev: Arc::new(FaultDev::thin(inner, seed, pool.clone())),
        path: name.to_string(),
        is_file: true,
        domain: String::new(),
    }
}

#[test]
fn a_transition_out_of_space_moves_no_chunk_it_could_not_write() {
    rt(2).block_on(async {
        let pool = SpacePool::new(1 << 40);
        let members = (0..MEMBERS)
            .map(|i| thin(&format!("m{i}"), &pool, i as u64))
            .collect();
        let spec = CreateSpec {
            name: "full".into(),
            level: Level::Raid6,
            chunk: CHUNK,
            groups: 2,
            spares: 2,
            declustered: true,
            copies: 2,
            bitmap_region: None,
            assume_clean: true,
            integrity: sbod_core::integrity::Kind::Crc32c,
            force: false,
        };
        let a = Array::create(spec, members).await.unwrap();
        // The volume written whole: every chunk of the layout has its space, the spare
        // space none (nothing wrote it yet).
        let data = pattern(a.size() as usize, 7);
        a.write(0, AlignedBuf::from_slice(&data), false)
            .await
            .unwrap();
        a.flush().await.unwrap();

        // The file system is full when a member fails: the distributed rebuild has no
        // space to write into.
        pool.set_free(0);
        a.fail("m3", false).await.unwrap();
        let r = a.rebuild_now().await;
        check_volume(&a, &data, "distributed rebuild out of space").await;
        assert!(
            matches!(r, Err(Error::NoSpace(_))),
            "a distributed rebuild with no space to write into: {r:?}"
        );
        assert_eq!(
            spared(&a),
            (vec![], true),
            "the transition waits, under way"
        );
        assert_eq!(a.status().members[3].state, "failed");

        // Space back: it resumes and ends; nothing reads the failed member any more.
        pool.set_free(1 << 40);
        a.rebuild_now().await.unwrap();
        assert_eq!(spared(&a), (vec![3], false));
        assert_eq!(a.status().state, "optimal");
        check_volume(&a, &data, "rebuilt into the spare space").await;
        scrub_check(&a, "rebuilt into the spare space").await;

        // The copy-back onto a replacement (a new file) out of space alike: its metadata
        // area has its space (written beforehand), its data area none.
        let r3 = thin("r3", &pool, 99);
        let meta = a.geometry().data_offset;
        let zeros = AlignedBuf::zeroed(meta as usize).into_shared();
        sbod_core::dev::write_at(&r3.dev, 0, zeros, false, IoClass::Background)
            .await
            .unwrap();
        pool.set_free(0);
        let uuid = a.status().members[3].uuid.clone().unwrap();
        a.replace(&uuid, r3, false).await.unwrap();
        let r = a.rebuild_now().await;
        check_volume(&a, &data, "copy-back out of space").await;
        assert!(
            matches!(r, Err(Error::NoSpace(_))),
            "a copy-back with no space to write into: {r:?}"
        );
        assert_eq!(
            spared(&a),
            (vec![3], true),
            "the copy-back waits, under way"
        );

        pool.set_free(1 << 40);
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
        scrub_check(&a, "copied back").await;
        a.close().await.unwrap();
    });
}
