//! TRIM on block-device members: a raid5 over loop devices (whose write-zeroes punches
//! the backing file, as a thin volume or an SSD gets its space back). Whole stripes are
//! zeroed on every member, data and parity (the backing files lose their blocks, the range
//! reads as zeros, a scrub finds parity and checksums consistent); the partial stripes at
//! the ends keep their data. Needs root and loop devices (losetup, util-linux).

use sbod_core::dev::{self, file, BlockDev};
use sbod_core::{AlignedBuf, Array, CreateSpec, Level, MemberSpec};
use std::os::unix::fs::MetadataExt;
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

/// A loop device over a file: attached for the test, detached on drop.
struct Loop(String);

impl Loop {
    fn attach(file: &Path) -> Loop {
        let out = std::process::Command::new("losetup")
            .args(["--find", "--show"])
            .arg(file)
            .output()
            .expect("losetup (util-linux) is needed for this test: install util-linux");
        assert!(
            out.status.success(),
            "losetup failed (run as root with loop devices): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Loop(String::from_utf8(out.stdout).unwrap().trim().to_string())
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = std::process::Command::new("losetup")
            .args(["-d", &self.0])
            .status();
    }
}

fn open(p: &Path) -> MemberSpec {
    let opts = file::OpenOptions {
        threads: 2,
        ..Default::default()
    };
    let o = file::open(p, &opts).unwrap();
    let dev: Arc<dyn BlockDev> = dev::attach_member(p.display().to_string(), o, &opts).unwrap();
    MemberSpec {
        dev,
        path: p.display().to_string(),
        is_file: false,
        domain: String::new(),
    }
}

fn allocated(files: &[PathBuf]) -> u64 {
    files
        .iter()
        .map(|f| std::fs::metadata(f).unwrap().blocks() * 512)
        .sum()
}

#[test]
fn trim_zeroes_whole_stripes_of_block_devices_and_keeps_them_consistent() {
    let dir = tempfile::tempdir().unwrap();
    let files: Vec<PathBuf> = (0..4)
        .map(|i| {
            let p = dir.path().join(format!("b{i}.img"));
            std::fs::File::create(&p)
                .unwrap()
                .set_len(24 * MIB)
                .unwrap();
            p
        })
        .collect();
    let loops: Vec<Loop> = files.iter().map(|f| Loop::attach(f)).collect();
    rt().block_on(async {
        let members: Vec<MemberSpec> = loops.iter().map(|l| open(Path::new(&l.0))).collect();
        assert!(
            members.iter().all(|m| m.dev.zeroes_cheaply()),
            "loop devices take write-zeroes (queue/write_zeroes_max_bytes)"
        );
        let spec = CreateSpec {
            name: "trim".into(),
            level: Level::Raid5,
            chunk: 64 * 1024,
            groups: 1,
            spares: 0,
            copies: 2,
            bitmap_region: None,
            assume_clean: true,
            integrity: sbod_core::integrity::Kind::Crc32c,
            force: true,
            declustered: false,
        };
        let a = Array::create(spec, members).await.unwrap();
        let size = a.size();
        let data: Vec<u8> = (0..size).map(|i| (i * 31 / 4096 + 1) as u8).collect();
        a.write(0, AlignedBuf::from_slice(&data), true)
            .await
            .unwrap();
        a.flush().await.unwrap();
        let before = allocated(&files);
        // 3 data chunks of 64 KiB: stripes of 192 KiB. From inside stripe 10 to inside
        // stripe 60: stripes 11..60 are whole.
        let sd = 3 * 64 * 1024u64;
        let (from, to) = (10 * sd + 4096, 60 * sd + 8192);
        a.trim(from, to - from).await.unwrap();
        a.flush().await.unwrap();
        let after = allocated(&files);
        let whole = 49 * sd;
        // Every member gives back its share of the whole stripes (parity too): 4/3 of them.
        assert!(
            before - after >= whole * 4 / 3 - MIB,
            "the backing files gave back {} bytes of {}",
            before - after,
            whole * 4 / 3
        );
        let got = a.read(0, size as usize).await.unwrap();
        let mut want = data.clone();
        want[(11 * sd) as usize..(60 * sd) as usize].fill(0);
        assert!(
            got[..] == want[..],
            "not zeros in the whole stripes or data lost around them"
        );
        let h = a.start_scrub(false).unwrap();
        h.wait().await;
        let s = h.status();
        assert_eq!(
            (s.mismatches, s.error),
            (0, None),
            "parity or checksums disagree"
        );
        a.close().await.unwrap();
    });
    drop(loops);
}
