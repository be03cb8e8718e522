//! The engine on real files with O_DIRECT: the whole life cycle, stale members, foreign
//! members, and an unclean shutdown resynced from the write-intent bitmap.

use sbod_core::dev::{self, file, BlockDev};
use sbod_core::{AlignedBuf, Array, AssembleOptions, CreateSpec, Error, Level, MemberSpec};
use std::path::{Path, PathBuf};
use std::sync::Arc;

const MIB: u64 = 1 << 20;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn make_files(dir: &Path, n: usize, size: u64, prefix: &str) -> Vec<PathBuf> {
    (0..n)
        .map(|i| {
            let p = dir.join(format!("{prefix}{i}.img"));
            let f = std::fs::File::create(&p).unwrap();
            f.set_len(size).unwrap();
            p
        })
        .collect()
}

fn open(p: &Path) -> MemberSpec {
    let opts = file::OpenOptions {
        threads: 2,
        ..Default::default()
    };
    let o = file::open(p, &opts).unwrap();
    // The product's choice of member queue; SBOD_IO=uring|threads forces one.
    let dev: Arc<dyn BlockDev> = dev::attach_member(p.display().to_string(), o, &opts).unwrap();
    MemberSpec {
        dev,
        path: p.display().to_string(),
        is_file: true,
        domain: String::new(),
    }
}

fn spec(name: &str, level: Level) -> CreateSpec {
    CreateSpec {
        name: name.into(),
        level,
        chunk: 64 * 1024,
        groups: 1,
        spares: 0,
        copies: 2,
        bitmap_region: None,
        assume_clean: true,
        force: false,
    }
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

async fn assemble(paths: &[PathBuf]) -> Result<Arc<Array>, Error> {
    assemble_with(paths, AssembleOptions::default()).await
}

async fn assemble_with(paths: &[PathBuf], opts: AssembleOptions) -> Result<Arc<Array>, Error> {
    Array::assemble(
        paths.iter().map(|p| open(p)).collect(),
        AssembleOptions {
            no_processes: true,
            ..opts
        },
    )
    .await
}

#[test]
fn life_cycle_on_files() {
    let dir = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let paths = make_files(dir.path(), 8, 32 * MIB, "d");
        let a = Array::create(
            spec("vol0", Level::Raid6),
            paths.iter().map(|p| open(p)).collect(),
        )
        .await
        .unwrap();
        let size = a.size();
        let data = pattern(size as usize, 1);
        a.write(0, AlignedBuf::from_slice(&data), false)
            .await
            .unwrap();
        // Small writes all over (RMW and RCW paths), then read back.
        let mut model = data.clone();
        for i in 0..200u64 {
            let off = (i * 7919 * 4096) % (size - 8 * 4096);
            let n = 4096 * (1 + i % 7);
            let p = pattern(n as usize, 100 + i);
            a.write(off, AlignedBuf::from_slice(&p), i % 5 == 0)
                .await
                .unwrap();
            model[off as usize..(off + n) as usize].copy_from_slice(&p);
        }
        a.flush().await.unwrap();
        // Two members fail: everything still reads back.
        a.fail(&paths[2].display().to_string(), false)
            .await
            .unwrap();
        a.fail(&paths[5].display().to_string(), false)
            .await
            .unwrap();
        assert_eq!(a.status().state, "degraded");
        assert!(a.read(0, size as usize).await.unwrap()[..] == model[..]);
        // Writes go on while degraded.
        let p = pattern(3 * 4096, 9);
        a.write(4096 * 10, AlignedBuf::from_slice(&p), false)
            .await
            .unwrap();
        model[4096 * 10..4096 * 13].copy_from_slice(&p);
        // Replace both; rebuild; scrub clean.
        let new = make_files(dir.path(), 2, 32 * MIB, "n");
        a.replace(&paths[2].display().to_string(), open(&new[0]), false)
            .await
            .unwrap();
        a.replace(&paths[5].display().to_string(), open(&new[1]), false)
            .await
            .unwrap();
        a.rebuild_now().await.unwrap();
        assert_eq!(a.status().state, "optimal", "{:?}", a.status());
        let h = a.start_scrub(false).unwrap();
        h.wait().await;
        let s = h.status();
        assert_eq!((s.mismatches, s.error), (0, None));
        a.close().await.unwrap();
        // Assemble from the new member set and read back.
        let mut members: Vec<PathBuf> = paths.clone();
        members[2] = new[0].clone();
        members[5] = new[1].clone();
        let b = assemble(&members).await.unwrap();
        assert_eq!(b.status().state, "optimal");
        assert!(b.read(0, size as usize).await.unwrap()[..] == model[..]);
        // The rebuilt members carry real data: lose two original members and read again.
        b.fail(&members[0].display().to_string(), false)
            .await
            .unwrap();
        b.fail(&members[1].display().to_string(), false)
            .await
            .unwrap();
        assert!(b.read(0, size as usize).await.unwrap()[..] == model[..]);
        b.close().await.unwrap();
    });
}

#[test]
fn stale_member_is_rebuilt_not_trusted() {
    let dir = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let paths = make_files(dir.path(), 4, 16 * MIB, "d");
        let a = Array::create(
            spec("vol0", Level::Raid5),
            paths.iter().map(|p| open(p)).collect(),
        )
        .await
        .unwrap();
        let size = a.size() as usize;
        a.write(0, AlignedBuf::from_slice(&pattern(size, 1)), false)
            .await
            .unwrap();
        a.close().await.unwrap();
        // Run without member 1, and change everything.
        let without: Vec<PathBuf> = paths
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != 1)
            .map(|(_, p)| p.clone())
            .collect();
        // It was in service when the array stopped: starting without it takes --degraded.
        let err = assemble(&without)
            .await
            .err()
            .expect("started without a member");
        assert!(
            matches!(err, Error::MissingMembers(_)) && err.to_string().contains("--degraded"),
            "{err}"
        );
        let b = assemble_with(
            &without,
            AssembleOptions {
                degraded: true,
                ..Default::default()
            },
        )
        .await
        .unwrap();
        assert_eq!(b.status().state, "degraded");
        assert_eq!(b.status().members[1].state, "missing");
        let newer = pattern(size, 2);
        b.write(0, AlignedBuf::from_slice(&newer), false)
            .await
            .unwrap();
        b.close().await.unwrap();
        // Member 1 comes back with old data and an old event counter.
        let c = assemble(&paths).await.unwrap();
        let rep = c.report();
        assert_eq!(
            rep.rebuilding,
            vec![paths[1].display().to_string()],
            "{rep:?}"
        );
        // Until rebuilt it is not read: data is the newer version.
        assert!(c.read(0, size).await.unwrap()[..] == newer[..]);
        c.rebuild_now().await.unwrap();
        assert_eq!(c.status().state, "optimal");
        // Now member 1 must carry the new data: lose another member and read through it.
        c.fail(&paths[0].display().to_string(), false)
            .await
            .unwrap();
        assert!(c.read(0, size).await.unwrap()[..] == newer[..]);
        c.close().await.unwrap();
    });
}

#[test]
fn foreign_and_mismatched_members_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let a_paths = make_files(dir.path(), 3, 8 * MIB, "a");
        let b_paths = make_files(dir.path(), 3, 8 * MIB, "b");
        let a = Array::create(
            spec("one", Level::Raid5),
            a_paths.iter().map(|p| open(p)).collect(),
        )
        .await
        .unwrap();
        a.close().await.unwrap();
        let b = Array::create(
            spec("two", Level::Raid5),
            b_paths.iter().map(|p| open(p)).collect(),
        )
        .await
        .unwrap();
        b.close().await.unwrap();
        // Members of two arrays together.
        let mixed = vec![a_paths[0].clone(), a_paths[1].clone(), b_paths[2].clone()];
        let err = assemble(&mixed)
            .await
            .err()
            .expect("mixed members must be refused")
            .to_string();
        assert!(
            err.contains("different arrays") && err.contains("one") && err.contains("two"),
            "{err}"
        );
        // Creating over a member of another array: refused, unless forced.
        let err = Array::create(
            spec("three", Level::Raid1),
            vec![open(&a_paths[0]), open(&b_paths[0])],
        )
        .await
        .err()
        .unwrap()
        .to_string();
        assert!(
            err.contains("member of sbod array") && err.contains("--force"),
            "{err}"
        );
        // A file system signature: refused.
        let plain = make_files(dir.path(), 2, 8 * MIB, "fs");
        {
            use std::os::unix::fs::FileExt;
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(&plain[0])
                .unwrap();
            f.write_all_at(&[0x53, 0xef], 1024 + 56).unwrap();
        }
        let err = Array::create(
            spec("four", Level::Raid1),
            plain.iter().map(|p| open(p)).collect(),
        )
        .await
        .err()
        .unwrap()
        .to_string();
        assert!(err.contains("ext2/3/4"), "{err}");
        // A member with no superblock given to assemble.
        let err = assemble(&[a_paths[0].clone(), plain[1].clone()])
            .await
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("no sbod superblock"), "{err}");
        // Forced create over one of them works, and array one can no longer assemble whole.
        let c = Array::create(
            CreateSpec {
                force: true,
                ..spec("three", Level::Raid1)
            },
            vec![open(&a_paths[0]), open(&b_paths[0])],
        )
        .await
        .unwrap();
        c.close().await.unwrap();
        let err = assemble(&a_paths).await.err().unwrap().to_string();
        assert!(err.contains("different arrays"), "{err}");
    });
}

#[test]
fn unclean_shutdown_resyncs_only_dirty_regions() {
    let dir = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let paths = make_files(dir.path(), 5, 66 * MIB, "d");
        let spec = CreateSpec {
            bitmap_region: Some(MIB),
            ..spec("vol0", Level::Raid6)
        };
        let a = Array::create(spec, paths.iter().map(|p| open(p)).collect())
            .await
            .unwrap();
        let size = a.size() as usize;
        let region = a.status().bitmap_region.unwrap();
        let data = pattern(size, 3);
        a.write(0, AlignedBuf::from_slice(&data), false)
            .await
            .unwrap();
        a.flush().await.unwrap();
        // Wait for the sweeper to clear the bitmap (idle regions are cleared lazily).
        for _ in 0..100 {
            if a.status().dirty_regions == 0 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        assert_eq!(a.status().dirty_regions, 0);
        // A burst of writes into two places, then a power cut.
        let w = pattern(64 * 1024, 4);
        a.write(0, AlignedBuf::from_slice(&w), true).await.unwrap();
        a.write((size / 2) as u64, AlignedBuf::from_slice(&w), true)
            .await
            .unwrap();
        let dirty = a.status().dirty_regions;
        assert!(dirty >= 2, "{dirty} dirty regions");
        a.abandon().await;
        drop(a);
        let b = assemble(&paths).await.unwrap();
        let rep = b.report();
        assert!(rep.unclean);
        assert_eq!(rep.resynced_regions, dirty);
        assert_eq!(rep.resynced_bytes, dirty * region);
        assert!(
            rep.resynced_bytes < b.geometry.member_size / 4,
            "resync was not limited: {rep:?}"
        );
        let mut model = data.clone();
        model[..w.len()].copy_from_slice(&w);
        model[size / 2..size / 2 + w.len()].copy_from_slice(&w);
        assert!(b.read(0, size).await.unwrap()[..] == model[..]);
        let h = b.start_scrub(false).unwrap();
        h.wait().await;
        assert_eq!(h.status().mismatches, 0);
        b.close().await.unwrap();
    });
}
