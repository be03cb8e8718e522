//! Shared parts of the torture tests: self-describing block contents, the durability model
//! a power cut is judged against, iteration counts and the figures each test reports.
#![allow(dead_code)]

use sbod_core::dev::BlockDev;
use sbod_core::{Array, CreateSpec, Level, MemberSpec};
use sbod_testkit::fault::{PowerCutDev, PowerSupply};
use std::sync::Arc;
use std::time::Duration;

pub const BLOCK: usize = 4096;

/// Iterations: `default` in CI, `SBOD_TORTURE_ITERS` for long runs.
pub fn iters(default: u64) -> u64 {
    std::env::var("SBOD_TORTURE_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A seed per run: `SBOD_TORTURE_SEED` replays one. Printed, so a failure's output
/// (the test harness shows what a failed test printed) says how to replay it, whatever
/// assertion failed.
pub fn seed() -> u64 {
    let seed = std::env::var("SBOD_TORTURE_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        });
    println!("replay with SBOD_TORTURE_SEED={seed}");
    seed
}

/// Append one JSON line of figures to `$SBOD_TORTURE_REPORT`, and print it.
pub fn report(v: serde_json::Value) {
    println!("torture figures: {v}");
    if let Ok(p) = std::env::var("SBOD_TORTURE_REPORT") {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(p)
            .expect("open the report file");
        writeln!(f, "{v}").expect("write the report");
    }
}

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The contents of volume block `blk` as written by write `tag` (tag 0: zeros). Every
/// block names its writer and its own address, so a block from the wrong place or a
/// mixture of two writes is recognised.
pub fn fill(out: &mut [u8], tag: u64, blk: u64) {
    debug_assert_eq!(out.len(), BLOCK);
    if tag == 0 {
        out.fill(0);
        return;
    }
    out[0..8].copy_from_slice(&tag.to_le_bytes());
    out[8..16].copy_from_slice(&blk.to_le_bytes());
    let mut s = mix(tag ^ blk.rotate_left(32));
    for c in out[16..].chunks_mut(8) {
        s = mix(s);
        c.copy_from_slice(&s.to_le_bytes()[..c.len()]);
    }
}

pub fn blocks_of(tag: u64, first: u64, n: u64) -> Vec<u8> {
    let mut v = vec![0u8; n as usize * BLOCK];
    for (i, c) in v.chunks_mut(BLOCK).enumerate() {
        fill(c, tag, first + i as u64);
    }
    v
}

/// Which write a block holds, or `None` if it is nothing any write produced.
pub fn decode(b: &[u8], blk: u64) -> Option<u64> {
    if b.iter().all(|&x| x == 0) {
        return Some(0);
    }
    let tag = u64::from_le_bytes(b[0..8].try_into().unwrap());
    let mut want = vec![0u8; BLOCK];
    fill(&mut want, tag, blk);
    (want == b).then_some(tag)
}

/// Per block: the value known durable, and writes issued since, each with the clock
/// value at which it was acknowledged (None: not acknowledged).
#[derive(Clone, Default)]
pub struct BlockModel {
    pub floor: u64,
    pub cands: Vec<(u64, Option<u64>)>,
}

/// What the volume may hold after a power cut. Each block has one writer at a time.
#[derive(Clone)]
pub struct Model {
    pub blocks: Vec<BlockModel>,
    /// Ticks once per acknowledged write.
    pub clock: u64,
}

/// What verification found.
#[derive(Default, Debug, Clone, Copy)]
pub struct Verified {
    /// Blocks whose value was fixed by a FUA or a completed FLUSH, read back exactly.
    pub durable_blocks: u64,
    /// Blocks with unflushed writes: read back as one of their allowed values.
    pub unsettled_blocks: u64,
    /// Of those, how many came back with the newest write (the rest: an older value).
    pub newest: u64,
}

impl Model {
    pub fn new(blocks: u64) -> Model {
        Model {
            blocks: vec![BlockModel::default(); blocks as usize],
            clock: 0,
        }
    }

    pub fn issue(&mut self, tag: u64, first: u64, n: u64) {
        for b in first..first + n {
            self.blocks[b as usize].cands.push((tag, None));
        }
    }

    pub fn ack(&mut self, tag: u64, first: u64, n: u64, fua: bool) {
        self.clock += 1;
        let t = self.clock;
        for b in first..first + n {
            let m = &mut self.blocks[b as usize];
            let i = m
                .cands
                .iter()
                .position(|c| c.0 == tag)
                .expect("acknowledged write was issued");
            m.cands[i].1 = Some(t);
            if fua {
                m.floor = tag;
                m.cands.drain(..=i);
            }
        }
    }

    /// A FLUSH issued when the clock read `at` completed: every write acknowledged by
    /// then is durable.
    pub fn flushed(&mut self, at: u64) {
        for m in self.blocks.iter_mut() {
            if let Some(i) = m.cands.iter().rposition(|c| c.1.is_some_and(|t| t <= at)) {
                m.floor = m.cands[i].0;
                m.cands.drain(..=i);
            }
        }
    }

    /// The value a reader must see now (single writer per block, no errors yet).
    pub fn latest_acked(&self, b: u64) -> u64 {
        let m = &self.blocks[b as usize];
        m.cands
            .iter()
            .rev()
            .find(|c| c.1.is_some())
            .map(|c| c.0)
            .unwrap_or(m.floor)
    }

    /// Check what a restart reads back; afterwards the model is what was read (the image
    /// a restart found is durable). Returns the blocks that hold anything not allowed.
    pub fn verify(&mut self, first: u64, data: &[u8], v: &mut Verified) -> Vec<String> {
        let mut bad = Vec::new();
        for (i, b) in data.chunks(BLOCK).enumerate() {
            let blk = first + i as u64;
            let m = &mut self.blocks[blk as usize];
            let got = decode(b, blk);
            let allowed = got.is_some_and(|g| g == m.floor || m.cands.iter().any(|c| c.0 == g));
            if !allowed {
                bad.push(format!(
                    "block {blk}: holds {} but only {} (durable) or {:?} (unflushed) are allowed",
                    match got {
                        Some(t) => format!("write {t}"),
                        None => "bytes no write produced".into(),
                    },
                    m.floor,
                    m.cands.iter().map(|c| c.0).collect::<Vec<_>>()
                ));
                continue;
            }
            let got = got.expect("allowed");
            if m.cands.is_empty() {
                v.durable_blocks += 1;
            } else {
                v.unsettled_blocks += 1;
                if m.cands.last().map(|c| c.0) == Some(got) {
                    v.newest += 1;
                }
            }
            m.floor = got;
            m.cands.clear();
        }
        bad
    }
}

/// The layouts every torture runs over.
#[derive(Clone, Copy, Debug)]
pub struct Layout {
    pub name: &'static str,
    pub level: Level,
    pub members: usize,
    pub copies: u32,
    /// Declustered, with this many members' worth of spare space (in `members`).
    pub decl: Option<usize>,
}

pub const LAYOUTS: &[Layout] = &[
    Layout {
        name: "raid5",
        level: Level::Raid5,
        members: 4,
        copies: 2,
        decl: None,
    },
    Layout {
        name: "raid6",
        level: Level::Raid6,
        members: 5,
        copies: 2,
        decl: None,
    },
    Layout {
        name: "raid1",
        level: Level::Raid1,
        members: 3,
        copies: 2,
        decl: None,
    },
    Layout {
        name: "raid10",
        level: Level::Raid10,
        members: 4,
        copies: 2,
        decl: None,
    },
    Layout {
        name: "ec:3+2",
        level: Level::Ec { k: 3, m: 2 },
        members: 5,
        copies: 2,
        decl: None,
    },
    // Declustered: a 3+2 group's stripes and two members' worth of spare space spread
    // over 7 members.
    Layout {
        name: "draid6",
        level: Level::Raid6,
        members: 7,
        copies: 2,
        decl: Some(2),
    },
];

pub fn layout(name: &str) -> Layout {
    *LAYOUTS.iter().find(|l| l.name == name).expect("layout")
}

pub const MIB: u64 = 1 << 20;
pub const CHUNK: u32 = 16 * 1024;
/// 1 MiB of metadata, then 2 MiB of data per member.
pub const MEMBER_SIZE: u64 = 3 * MIB;

pub fn spec(l: &Layout) -> CreateSpec {
    CreateSpec {
        name: "torture".into(),
        level: l.level,
        chunk: CHUNK,
        groups: 1,
        spares: l.decl.unwrap_or(0),
        declustered: l.decl.is_some(),
        copies: l.copies,
        // Small regions, so the resync after a crash shows how little it covers.
        bitmap_region: Some(4 * CHUNK as u64),
        assume_clean: true,
        // Checksums on (the default): the crash and fault runs check them too.
        integrity: sbod_core::integrity::Kind::Crc32c,
        force: false,
    }
}

pub fn specs<D: BlockDev + 'static>(devs: &[Arc<D>]) -> Vec<MemberSpec> {
    devs.iter()
        .map(|d| MemberSpec {
            dev: d.clone() as Arc<dyn BlockDev>,
            path: d.name().to_string(),
            is_file: false,
            domain: String::new(),
        })
        .collect()
}

/// Members `m0..` on one power supply with the given media (zeros for new disks, or the
/// images a cut left); member `i` gets seed `seed(i)`.
pub fn power_members(
    images: impl IntoIterator<Item = Vec<u8>>,
    supply: &Arc<PowerSupply>,
    jitter: Duration,
    mut seed: impl FnMut(usize) -> u64,
) -> Vec<Arc<PowerCutDev>> {
    images
        .into_iter()
        .enumerate()
        .map(|(i, img)| PowerCutDev::new(format!("m{i}"), img, supply, jitter, seed(i)))
        .collect()
}

/// `n` new (zeroed) members of `MEMBER_SIZE`.
pub fn blank(n: usize) -> Vec<Vec<u8>> {
    vec![vec![0u8; MEMBER_SIZE as usize]; n]
}

/// A scrub check that must find parity and mirrors consistent.
pub async fn scrub_check(a: &Arc<Array>, what: &str) {
    let h = a.start_scrub(false).expect("start a scrub check");
    h.wait().await;
    let s = h.status();
    assert!(s.error.is_none(), "{what}: scrub stopped: {:?}", s.error);
    assert_eq!(
        s.mismatches, 0,
        "{what}: parity/mirrors inconsistent: {:?}",
        s.regions
    );
}

/// `len` bytes of a xorshift stream from `seed` (a different block content per seed).
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
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

pub fn rt(threads: usize) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .unwrap()
}

/// A declustered array's spared slots, and whether a transition is under way.
pub fn spared(a: &Array) -> (Vec<usize>, bool) {
    let s = a.placement().spared();
    (s.from.clone(), s.to.is_some())
}

/// The whole volume reads back as `data` (in 1 MiB reads), or panic naming the first
/// wrong byte.
pub async fn check_volume(a: &Array, data: &[u8], what: &str) {
    for (i, c) in data.chunks(1 << 20).enumerate() {
        let off = i as u64 * (1 << 20);
        let got = a
            .read(off, c.len())
            .await
            .unwrap_or_else(|e| panic!("{what}: read at {off}: {e}"));
        if &got[..] != c {
            let b = got
                .iter()
                .zip(c)
                .position(|(x, y)| x != y)
                .unwrap_or_default();
            panic!("{what}: wrong bytes at volume offset {}", off + b as u64);
        }
    }
}
