//! `Array::allocation` (NBD's `base:allocation`) against a model, on real member files:
//! any sequence of writes, trims, zeroes (whole and partial blocks, punched or not) and a
//! restart, then the allocation of the whole volume never says zero for a byte that reads
//! other than zero, and says it for what was never written. Levels: raid0, raid1, raid10,
//! raid5, raid6, concat. `SBOD_ALLOC_CASES` runs more cases.

use proptest::prelude::*;
use sbod_core::dev::{self, file, BlockDev};
use sbod_core::{AlignedBuf, Array, AssembleOptions, CreateSpec, Level, MemberSpec};
use std::path::{Path, PathBuf};
use std::sync::Arc;

const MIB: u64 = 1 << 20;
const B: u64 = 4096;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn open(p: &Path) -> MemberSpec {
    let opts = file::OpenOptions {
        threads: 1,
        ..Default::default()
    };
    let o = file::open(p, &opts).unwrap();
    let dev: Arc<dyn BlockDev> = dev::attach_member(p.display().to_string(), o, &opts).unwrap();
    MemberSpec {
        dev,
        path: p.display().to_string(),
        is_file: true,
        domain: String::new(),
    }
}

fn level(i: u8) -> (Level, usize) {
    match i % 6 {
        0 => (Level::Raid0, 3),
        1 => (Level::Raid1, 2),
        2 => (Level::Raid10, 4),
        3 => (Level::Raid5, 4),
        4 => (Level::Raid6, 5),
        _ => (Level::Concat, 3),
    }
}

#[derive(Clone, Debug)]
enum Op {
    /// Write `blocks` blocks of a byte (0: zeros written as data) at a block.
    Write {
        at: u64,
        blocks: u64,
        byte: u8,
    },
    /// Bytes written at any offset (merged into blocks).
    WriteBytes {
        at: u64,
        len: u64,
        byte: u8,
    },
    Trim {
        at: u64,
        blocks: u64,
    },
    Zero {
        at: u64,
        blocks: u64,
        punch: bool,
    },
    ZeroBytes {
        at: u64,
        len: u64,
    },
    Restart,
}

fn op(size: u64) -> impl Strategy<Value = Op> {
    let blocks = size / B;
    prop_oneof![
        4 => (0..blocks, 1..64u64, any::<u8>()).prop_map(|(at, blocks, byte)| Op::Write { at, blocks, byte }),
        2 => (0..size, 1..20000u64, 1..=255u8).prop_map(|(at, len, byte)| Op::WriteBytes { at, len, byte }),
        2 => (0..blocks, 1..512u64).prop_map(|(at, blocks)| Op::Trim { at, blocks }),
        2 => (0..blocks, 1..512u64, any::<bool>()).prop_map(|(at, blocks, punch)| Op::Zero { at, blocks, punch }),
        1 => (0..size, 1..300000u64).prop_map(|(at, len)| Op::ZeroBytes { at, len }),
        1 => Just(Op::Restart),
    ]
}

fn cases() -> u32 {
    std::env::var("SBOD_ALLOC_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(12)
}

async fn assemble(paths: &[PathBuf]) -> Arc<Array> {
    Array::assemble(
        paths.iter().map(|p| open(p)).collect(),
        AssembleOptions {
            no_processes: true,
            ..Default::default()
        },
    )
    .await
    .unwrap()
}

/// Check the allocation of the whole volume against what it reads and the model.
async fn check(a: &Array, model: &[u8]) {
    let size = a.size();
    let got = a.read(0, size as usize).await.unwrap();
    assert!(got[..] == model[..], "the array does not read as the model");
    let mut at = 0u64;
    while at < size {
        let pieces = a.allocation(at, size - at).await.unwrap();
        assert!(!pieces.is_empty());
        for (len, zero) in pieces {
            assert!(len > 0);
            let r = at as usize..(at + len) as usize;
            if zero {
                assert!(
                    model[r.clone()].iter().all(|&b| b == 0),
                    "{at}+{len} reported zero but holds data"
                );
            }
            at += len;
        }
    }
    assert_eq!(at, size);
}

fn run_case(lvl: u8, ops: Vec<Op>) {
    let dir = tempfile::tempdir().unwrap();
    let (level, n) = level(lvl);
    rt().block_on(async {
        let paths: Vec<PathBuf> = (0..n)
            .map(|i| {
                let p = dir.path().join(format!("m{i}.img"));
                std::fs::File::create(&p)
                    .unwrap()
                    .set_len(12 * MIB)
                    .unwrap();
                p
            })
            .collect();
        let spec = CreateSpec {
            name: "alloc".into(),
            level,
            chunk: 64 * 1024,
            groups: 1,
            spares: 0,
            copies: 2,
            bitmap_region: None,
            assume_clean: true,
            integrity: sbod_core::integrity::Kind::Crc32c,
            force: false,
            declustered: false,
        };
        let mut a = Array::create(spec, paths.iter().map(|p| open(p)).collect())
            .await
            .unwrap();
        let size = a.size();
        let mut model = vec![0u8; size as usize];
        // A fresh array is all holes.
        assert_eq!(a.allocation(0, size).await.unwrap(), vec![(size, true)]);
        for o in ops {
            match o {
                Op::Write { at, blocks, byte } => {
                    let at = at * B % size;
                    let n = (blocks * B).min(size - at);
                    a.write(at, AlignedBuf::from_slice(&vec![byte; n as usize]), false)
                        .await
                        .unwrap();
                    model[at as usize..(at + n) as usize].fill(byte);
                }
                Op::WriteBytes { at, len, byte } => {
                    let at = at % size;
                    let n = len.min(size - at);
                    a.write_bytes(at, &vec![byte; n as usize], false)
                        .await
                        .unwrap();
                    model[at as usize..(at + n) as usize].fill(byte);
                }
                Op::Trim { at, blocks } => {
                    let at = at * B % size;
                    let n = (blocks * B).min(size - at);
                    a.trim(at, n).await.unwrap();
                    // Advisory: the model learns what it now reads.
                    let r = a.read(at, n as usize).await.unwrap();
                    model[at as usize..(at + n) as usize].copy_from_slice(&r);
                }
                Op::Zero { at, blocks, punch } => {
                    let at = at * B % size;
                    let n = (blocks * B).min(size - at);
                    a.write_zeroes(at, n, false, punch).await.unwrap();
                    model[at as usize..(at + n) as usize].fill(0);
                }
                Op::ZeroBytes { at, len } => {
                    let at = at % size;
                    let n = len.min(size - at);
                    a.write_zeroes_bytes(at, n, false, true).await.unwrap();
                    model[at as usize..(at + n) as usize].fill(0);
                }
                Op::Restart => {
                    a.close().await.unwrap();
                    a = assemble(&paths).await;
                }
            }
        }
        check(&a, &model).await;
        // Whole stripes zeroed with punch are holes again: zero everything, and the whole
        // volume is reported zero.
        a.write_zeroes(0, size, false, true).await.unwrap();
        model.fill(0);
        check(&a, &model).await;
        let all: u64 = {
            let mut at = 0;
            let mut z = 0;
            while at < size {
                for (len, zero) in a.allocation(at, size - at).await.unwrap() {
                    if zero {
                        z += len;
                    }
                    at += len;
                }
            }
            z
        };
        assert_eq!(
            all, size,
            "{level:?}: a volume zeroed whole is not all holes"
        );
        a.close().await.unwrap();
    });
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]
    #[test]
    fn allocation_never_reports_zero_for_data(lvl in 0u8..6, ops in proptest::collection::vec(op(20 * MIB), 1..24)) {
        run_case(lvl, ops);
    }
}

/// A degraded array reports data where a missing member's rows would be needed.
#[test]
fn degraded_parity_reports_data() {
    let dir = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let paths: Vec<PathBuf> = (0..4)
            .map(|i| {
                let p = dir.path().join(format!("m{i}.img"));
                std::fs::File::create(&p)
                    .unwrap()
                    .set_len(12 * MIB)
                    .unwrap();
                p
            })
            .collect();
        let spec = CreateSpec {
            name: "deg".into(),
            level: Level::Raid5,
            chunk: 64 * 1024,
            groups: 1,
            spares: 0,
            copies: 2,
            bitmap_region: None,
            assume_clean: true,
            integrity: sbod_core::integrity::Kind::Crc32c,
            force: false,
            declustered: false,
        };
        let a = Array::create(spec, paths.iter().map(|p| open(p)).collect())
            .await
            .unwrap();
        let size = a.size();
        assert!(a.allocation(0, size).await.unwrap()[0].1);
        a.fail(&paths[1].display().to_string(), false)
            .await
            .unwrap();
        assert_eq!(a.allocation(0, size).await.unwrap(), vec![(size, false)]);
        a.close().await.unwrap();
    });
}
