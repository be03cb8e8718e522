use super::*;
use crate::dev::{IoReq, MemDev};
use crate::fault::{PowerCutDev, PowerSupply};
use proptest::prelude::*;

fn block_of(seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; BLOCK as usize];
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for b in v.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    v
}

#[test]
fn tags_depend_on_data_and_address_and_are_never_zero() {
    let d = block_of(1);
    assert_ne!(
        tag(5, &d),
        tag(6, &d),
        "right data at the wrong place fails"
    );
    assert_ne!(tag(5, &d), tag(5, &block_of(2)));
    let mut flipped = d.clone();
    flipped[100] ^= 0x04;
    assert_ne!(tag(5, &d), tag(5, &flipped), "one bit flipped fails");
    for b in 0..10_000 {
        assert_eq!(zero_tag(b), tag(b, &[0u8; BLOCK as usize]));
        assert_ne!(zero_tag(b), 0);
    }
    // Distinct addresses give distinct tags for the same data (no short cycle in `mix`).
    let tags: std::collections::HashSet<u32> = (0..100_000).map(zero_tag).collect();
    assert!(tags.len() > 99_990, "{}", tags.len());
}

/// The tags are on the members: the CRC must stay crc32c bit for bit, whichever crate
/// computes it (checked against the `crc32c` crate, the log format's, and a known value).
#[test]
fn the_crc_is_crc32c() {
    assert_eq!(crc(b"123456789"), 0xE306_9283); // the CRC-32C check value
    assert_eq!(crc(&[]), 0);
    for seed in 0..64u64 {
        let b = block_of(seed);
        assert_eq!(crc(&b), crc32c::crc32c(&b), "seed {seed}");
        // Lengths that are not whole blocks or vectors, and unaligned starts.
        let n = (seed as usize * 37) % b.len();
        let at = seed as usize % 13;
        assert_eq!(crc(&b[at..n.max(at)]), crc32c::crc32c(&b[at..n.max(at)]));
    }
    assert_eq!(*ZERO_CRC, crc32c::crc32c(&[0u8; BLOCK as usize]));
}

/// Judging between members that both fail their tags takes a tag that names the data:
/// "unknown" vouches for nothing, "never written" only for zeros where the members were
/// zero at creation (and for nothing elsewhere), any other tag for the data it is the tag
/// of, at that address.
#[test]
fn only_a_tag_that_names_the_data_vouches_for_it() {
    let d = block_of(3);
    let (t, zt) = (tag(9, &d), zero_tag(9));
    assert!(vouches(t, t, zt, false));
    assert!(!vouches(tag(10, &d), t, zt, false), "another address");
    assert!(!vouches(tag(9, &block_of(4)), t, zt, true), "other data");
    assert!(!vouches(UNKNOWN, t, zt, true));
    assert!(matches(UNKNOWN, t, zt, true), "while a read accepts it");
    assert!(!vouches(UNWRITTEN, t, zt, false));
    assert!(matches(UNWRITTEN, t, zt, false), "while a read accepts it");
    assert!(!vouches(UNWRITTEN, t, zt, true));
    assert!(
        vouches(UNWRITTEN, zt, zt, true),
        "zeros, never written, zeroed"
    );
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

const LAYOUT: TagLayout = TagLayout {
    offset: 0,
    bytes: 16 * TAG_BLOCK as u64,
    zeroed: false,
};

#[test]
fn never_written_blocks_are_zeros_on_zeroed_arrays() {
    rt().block_on(async {
        let dev: Arc<dyn BlockDev> = Arc::new(MemDev::new("t", LAYOUT.bytes));
        let t = MemberTags::with_capacity(1 << 20);
        let zeroed = TagLayout {
            zeroed: true,
            ..LAYOUT
        };
        let zeros = vec![0u8; BLOCK as usize];
        assert!(t.check(&dev, &zeroed, 0, &zeros).await.unwrap().is_empty());
        assert_eq!(
            t.check(&dev, &zeroed, 0, &block_of(1)).await.unwrap(),
            vec![0]
        );
        // Not known to be zero: anything goes until written.
        assert!(t
            .check(&dev, &LAYOUT, 0, &block_of(1))
            .await
            .unwrap()
            .is_empty());
    });
}

#[test]
fn a_write_in_flight_or_refused_accepts_old_and_new() {
    rt().block_on(async {
        let dev: Arc<dyn BlockDev> = Arc::new(MemDev::new("t", LAYOUT.bytes));
        let t = MemberTags::with_capacity(1 << 20);
        let (a, b) = (block_of(1), block_of(2));
        let w = t.set(&dev, &LAYOUT, 0, NewTags::Data(&a)).await.unwrap();
        t.settle(w, true);
        assert!(t.check(&dev, &LAYOUT, 0, &a).await.unwrap().is_empty());
        assert_eq!(t.check(&dev, &LAYOUT, 0, &b).await.unwrap(), vec![0]);
        let w = t.set(&dev, &LAYOUT, 0, NewTags::Data(&b)).await.unwrap();
        // In flight: the block holds either.
        assert!(t.check(&dev, &LAYOUT, 0, &a).await.unwrap().is_empty());
        assert!(t.check(&dev, &LAYOUT, 0, &b).await.unwrap().is_empty());
        assert_eq!(
            t.check(&dev, &LAYOUT, 0, &block_of(3)).await.unwrap(),
            vec![0]
        );
        t.settle(w, true);
        assert_eq!(t.check(&dev, &LAYOUT, 0, &a).await.unwrap(), vec![0]);
        // A refused write: the block holds the old or the new data, until a write succeeds;
        // written to the member as unknown (one value cannot say "either").
        let w = t.set(&dev, &LAYOUT, 0, NewTags::Data(&a)).await.unwrap();
        t.settle(w, false);
        assert!(t.check(&dev, &LAYOUT, 0, &a).await.unwrap().is_empty());
        assert!(t.check(&dev, &LAYOUT, 0, &b).await.unwrap().is_empty());
        assert_eq!(
            t.check(&dev, &LAYOUT, 0, &block_of(3)).await.unwrap(),
            vec![0]
        );
        t.write_back(&dev, &LAYOUT).await.unwrap();
        let fresh = MemberTags::with_capacity(1 << 20);
        assert_eq!(
            fresh.get(&dev, &LAYOUT, 0, BLOCK).await.unwrap(),
            vec![UNKNOWN]
        );
        let w = t.set(&dev, &LAYOUT, 0, NewTags::Data(&a)).await.unwrap();
        t.settle(w, true);
        assert_eq!(t.check(&dev, &LAYOUT, 0, &b).await.unwrap(), vec![0]);
    });
}

#[test]
fn the_cache_is_bounded_and_evicts_only_clean_blocks() {
    rt().block_on(async {
        let layout = TagLayout {
            offset: 0,
            bytes: 256 * TAG_BLOCK as u64,
            zeroed: false,
        };
        let dev: Arc<dyn BlockDev> = Arc::new(MemDev::new("t", layout.bytes));
        // 32 tag blocks of cache (2 per shard).
        let t = MemberTags::with_capacity(32 * TAG_BLOCK as u64);
        let d = block_of(7);
        // Dirty blocks are kept until written back, whatever the bound.
        for i in 0..64 {
            let w = t
                .set(&dev, &layout, i * SPAN, NewTags::Data(&d))
                .await
                .unwrap();
            t.settle(w, true);
        }
        assert_eq!(t.cached(), 64);
        assert_eq!(t.write_back(&dev, &layout).await.unwrap(), 64);
        // Clean now: reading 256 tag blocks keeps the cache near its bound.
        for i in 0..256 {
            t.get(&dev, &layout, i * SPAN, BLOCK).await.unwrap();
        }
        assert!(t.cached() <= 32 + SHARDS, "{}", t.cached());
        assert!(t.stats.evictions.load(Ordering::Relaxed) >= 256 - 32 - SHARDS as u64);
        // What was evicted is read back from the member.
        for i in 0..64 {
            assert!(t
                .check(&dev, &layout, i * SPAN, &d)
                .await
                .unwrap()
                .is_empty());
        }
    });
}

/// A member with a tag region of 256 blocks, the tags of data blocks 0..100 (`block_of(i)`
/// at block `i`) written to it by a cache of their own.
async fn tagged_member() -> (TagLayout, Arc<MemDev>, Arc<dyn BlockDev>) {
    let layout = TagLayout {
        offset: 0,
        bytes: 256 * TAG_BLOCK as u64,
        zeroed: false,
    };
    let mem = Arc::new(MemDev::new("t", layout.bytes));
    let dev: Arc<dyn BlockDev> = mem.clone();
    let w = MemberTags::with_capacity(1 << 20);
    for i in 0..100u64 {
        let x = w
            .set(&dev, &layout, i * SPAN, NewTags::Data(&block_of(i)))
            .await
            .unwrap();
        w.settle(x, true);
    }
    w.write_back(&dev, &layout).await.unwrap();
    (layout, mem, dev)
}

/// The read-ahead loads the run of tag blocks not cached in one read, each as a load
/// of its own would have it; it keeps a cached block's tags (one changed in memory and
/// not yet written back is not read over), stops at one, and respects the cache's bound.
#[test]
fn read_ahead_loads_the_blocks_ahead_in_one_read_and_keeps_what_is_cached() {
    rt().block_on(async {
        // Tags on the member for blocks 0..100 (written back by one cache)...
        let (layout, mem, dev) = tagged_member().await;
        // ...and, in another, block 40 changed in memory only.
        let t = MemberTags::with_capacity(1 << 20);
        let w = t
            .set(&dev, &layout, 40 * SPAN, NewTags::Data(&block_of(1000)))
            .await
            .unwrap();
        t.settle(w, true);
        let reads = mem.reads.load(Ordering::Relaxed);
        t.read_ahead(&dev, &layout, 2 * SPAN + 5).await;
        assert_eq!(mem.reads.load(Ordering::Relaxed), reads + 1, "one read");
        assert_eq!(t.cached(), 39, "blocks 2..40 loaded, and 40 as it was");
        for i in 2..100u64 {
            let want = if i == 40 { 1000 } else { i };
            assert!(
                t.check(&dev, &layout, i * SPAN, &block_of(want))
                    .await
                    .unwrap()
                    .is_empty(),
                "block {i}"
            );
        }
        // Cached at `off`: nothing read.
        let reads = mem.reads.load(Ordering::Relaxed);
        t.read_ahead(&dev, &layout, 3 * SPAN).await;
        assert_eq!(mem.reads.load(Ordering::Relaxed), reads);
        // Past the tag region: nothing; near its end: what is left of it.
        t.read_ahead(&dev, &layout, 256 * SPAN).await;
        t.read_ahead(&dev, &layout, 250 * SPAN).await;
        assert_eq!(mem.reads.load(Ordering::Relaxed), reads + 1);
        // A small cache: a quarter of it at most.
        let small = MemberTags::with_capacity(32 * TAG_BLOCK as u64);
        small.read_ahead(&dev, &layout, 0).await;
        assert_eq!(small.cached(), 8);
    });
}

/// A member whose reads wait until the test lets them go (to hold a read-ahead in flight).
struct HeldReads {
    inner: Arc<dyn BlockDev>,
    held: Mutex<Vec<(IoReq, crate::dev::Done)>>,
    seen: Mutex<Vec<(u64, usize)>>,
}

impl BlockDev for HeldReads {
    fn submit(&self, req: IoReq, done: crate::dev::Done) {
        if let crate::dev::IoKind::Read { buf } = &req.kind {
            self.seen.lock().push((req.offset, buf.len()));
            self.held.lock().push((req, done));
        } else {
            self.inner.submit(req, done);
        }
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn name(&self) -> &str {
        "held"
    }
}

impl HeldReads {
    fn release(&self) {
        for (req, done) in std::mem::take(&mut *self.held.lock()) {
            self.inner.submit(req, done);
        }
    }
}

/// Read-aheads asked for at once (a rebuild's chunks as it starts) read each tag block
/// once: one that starts inside another's run waits for it, one that starts before it
/// stops short of it. Each used to read the whole run again.
#[test]
fn read_aheads_in_flight_are_not_read_twice() {
    rt().block_on(async {
        let (layout, _, dev) = tagged_member().await;
        let held = Arc::new(HeldReads {
            inner: dev.clone(),
            held: Mutex::new(Vec::new()),
            seen: Mutex::new(Vec::new()),
        });
        let hdev: Arc<dyn BlockDev> = held.clone();
        let t = Arc::new(MemberTags::with_capacity(1 << 20));
        let spawn = |off: u64| {
            let (t, d, l) = (t.clone(), hdev.clone(), layout);
            tokio::spawn(async move { t.read_ahead(&d, &l, off).await })
        };
        let first = spawn(10 * SPAN);
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        assert_eq!(
            *held.seen.lock(),
            vec![(10 * TAG_BLOCK as u64, READ_AHEAD * TAG_BLOCK)]
        );
        // The same block, a block inside the run, and one before it: all at once.
        let others: Vec<_> = [10 * SPAN + 7, 30 * SPAN, 8 * SPAN]
            .into_iter()
            .map(spawn)
            .collect();
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        assert_eq!(
            *held.seen.lock(),
            vec![
                (10 * TAG_BLOCK as u64, READ_AHEAD * TAG_BLOCK),
                (8 * TAG_BLOCK as u64, 2 * TAG_BLOCK)
            ],
            "the blocks in flight are not read again"
        );
        assert!(!others[0].is_finished(), "it waits for the read in flight");
        held.release();
        first.await.unwrap();
        for o in others {
            o.await.unwrap();
        }
        assert_eq!(held.seen.lock().len(), 2);
        assert_eq!(t.cached(), 2 + READ_AHEAD);
        for i in 8..100u64 {
            assert!(
                t.check(&dev, &layout, i * SPAN, &block_of(i))
                    .await
                    .unwrap()
                    .is_empty(),
                "block {i}"
            );
        }
    });
}

/// One step of the tag store's life.
#[derive(Clone, Debug)]
enum Op {
    /// Write `n` blocks from block `at` (data from `seed`); `ok`: the write succeeded.
    Write {
        at: u64,
        n: u64,
        seed: u64,
        ok: bool,
    },
    Zero {
        at: u64,
        n: u64,
    },
    /// The medium changes under the array (a bit flip, a lost or misdirected write).
    Corrupt {
        at: u64,
        seed: u64,
    },
    /// Write back and flush: tags durable.
    Flush,
    /// Write back without a flush, then the power is cut: each tag block written since the
    /// last flush lands or not.
    Cut {
        seed: u64,
    },
    Check {
        at: u64,
        n: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let at = 0..(3 * TAGS_PER_BLOCK);
    prop_oneof![
        4 => (at.clone(), 1..40u64, any::<u64>(), prop::bool::weighted(0.9))
            .prop_map(|(at, n, seed, ok)| Op::Write { at, n, seed, ok }),
        1 => (at.clone(), 1..40u64).prop_map(|(at, n)| Op::Zero { at, n }),
        1 => (at.clone(), any::<u64>()).prop_map(|(at, seed)| Op::Corrupt { at, seed }),
        1 => Just(Op::Flush),
        1 => any::<u64>().prop_map(|seed| Op::Cut { seed }),
        3 => (at, 1..64u64).prop_map(|(at, n)| Op::Check { at, n }),
    ]
}

/// What the model knows of each block: what it may hold (the last acknowledged write, or
/// after refused writes any of those and what was before; None: anything, never written
/// or unknown), and what the medium holds.
#[derive(Clone, Default)]
struct Model {
    acked: Vec<Option<Vec<Vec<u8>>>>,
    medium: Vec<Vec<u8>>,
    /// `acked` as of the last flush: after a power cut, tags written since may be lost,
    /// and the resync of the dirty regions (below, `retag`) makes them agree again.
    since_flush: std::collections::BTreeSet<u64>,
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Against a model: a block whose medium differs from what was last acknowledged fails
    /// its check, one that holds it passes; across power cuts, with the blocks written
    /// since the last flush retagged from the medium (what the bitmap's resync does).
    #[test]
    fn tags_catch_every_wrong_block_across_power_cuts(ops in prop::collection::vec(op(), 1..60)) {
        rt().block_on(async {
            let blocks = 3 * TAGS_PER_BLOCK + 64;
            let layout = TagLayout { offset: 0, bytes: blocks.div_ceil(TAGS_PER_BLOCK) * TAG_BLOCK as u64, zeroed: false };
            let supply = PowerSupply::new();
            let mut pc = PowerCutDev::new("tags", vec![0u8; layout.bytes as usize], &supply, std::time::Duration::ZERO, 1);
            let mut dev: Arc<dyn BlockDev> = pc.clone();
            let mut supply = supply;
            let mut t = MemberTags::with_capacity(2 * TAG_BLOCK as u64);
            let mut m = Model {
                acked: vec![None; blocks as usize],
                medium: vec![vec![0u8; BLOCK as usize]; blocks as usize],
                ..Model::default()
            };
            for op in ops {
                match op {
                    Op::Write { at, n, seed, ok } => {
                        let data: Vec<u8> = (0..n).flat_map(|i| block_of(seed ^ i)).collect();
                        let w = t.set(&dev, &layout, at * BLOCK, NewTags::Data(&data)).await.unwrap();
                        for i in 0..n {
                            let b = (at + i) as usize;
                            let new = block_of(seed ^ i);
                            // A refused write lands a prefix (half of it here).
                            if ok || i < n / 2 {
                                m.medium[b] = new.clone();
                            }
                            m.acked[b] = match (ok, m.acked[b].take()) {
                                (true, _) => Some(vec![new]),
                                (false, Some(mut v)) => {
                                    v.push(new);
                                    Some(v)
                                }
                                (false, None) => None,
                            };
                            m.since_flush.insert(at + i);
                        }
                        t.settle(w, ok);
                    }
                    Op::Zero { at, n } => {
                        let w = t.set(&dev, &layout, at * BLOCK, NewTags::Zeros(n * BLOCK)).await.unwrap();
                        for i in 0..n {
                            let b = (at + i) as usize;
                            m.medium[b] = vec![0u8; BLOCK as usize];
                            m.acked[b] = Some(vec![m.medium[b].clone()]);
                            m.since_flush.insert(at + i);
                        }
                        t.settle(w, true);
                    }
                    Op::Corrupt { at, seed } => {
                        let b = at as usize;
                        if seed % 2 == 0 {
                            m.medium[b][(seed as usize / 2) % BLOCK as usize] ^= 1 << (seed % 8);
                        } else {
                            // A neighbour's block landed here (misdirected write).
                            m.medium[b] = m.medium[(b + 1) % blocks as usize].clone();
                        }
                    }
                    Op::Flush => {
                        t.write_back(&dev, &layout).await.unwrap();
                        dev::flush(&dev).await.unwrap();
                        m.since_flush.clear();
                    }
                    Op::Cut { seed } => {
                        t.write_back(&dev, &layout).await.unwrap();
                        supply.cut(seed);
                        let img = pc.image();
                        dev.close();
                        supply = PowerSupply::new();
                        pc = PowerCutDev::new("tags", img, &supply, std::time::Duration::ZERO, seed);
                        dev = pc.clone();
                        t = MemberTags::with_capacity(2 * TAG_BLOCK as u64);
                        // Blocks with old tags pending were written back as unknown.
                        for (b, a) in m.acked.iter_mut().enumerate() {
                            if a.as_ref().is_some_and(|v| v.len() > 1)
                                && !m.since_flush.contains(&(b as u64))
                            {
                                *a = None;
                            }
                        }
                        // The resync of the dirty regions: tags from what the medium holds.
                        for &b in &m.since_flush {
                            let w = t.set(&dev, &layout, b * BLOCK, NewTags::Data(&m.medium[b as usize])).await.unwrap();
                            t.settle(w, true);
                            m.acked[b as usize] = Some(vec![m.medium[b as usize].clone()]);
                        }
                        // ... made durable before the resync ends (`resync_regions` flushes).
                        t.write_back(&dev, &layout).await.unwrap();
                        dev::flush(&dev).await.unwrap();
                        m.since_flush.clear();
                    }
                    Op::Check { at, n } => {
                        let n = n.min(blocks - at);
                        let data: Vec<u8> = (at..at + n).flat_map(|b| m.medium[b as usize].clone()).collect();
                        let bad = t.check(&dev, &layout, at * BLOCK, &data).await.unwrap();
                        let want: Vec<u64> = (at..at + n)
                            .filter(|&b| m.acked[b as usize].as_ref().is_some_and(|a| !a.contains(&m.medium[b as usize])))
                            .map(|b| b * BLOCK)
                            .collect();
                        prop_assert_eq!(bad, want);
                    }
                }
            }
            dev.close();
            Ok(())
        })?;
    }
}

/// A member that notes the offset and length of every read and write.
struct Counting {
    inner: Arc<dyn BlockDev>,
    reads: Mutex<Vec<(u64, usize)>>,
    writes: Mutex<Vec<(u64, usize)>>,
}

impl BlockDev for Counting {
    fn submit(&self, req: crate::dev::IoReq, done: crate::dev::Done) {
        match &req.kind {
            crate::dev::IoKind::Read { buf } => self.reads.lock().push((req.offset, buf.len())),
            crate::dev::IoKind::Write { buf, .. } => {
                self.writes.lock().push((req.offset, buf.len()))
            }
            _ => {}
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

/// The tag of block `b` as [`tag_images`] writes it: never 0 or 1.
fn known_tag(b: u64) -> u32 {
    (b as u32).wrapping_mul(2_654_435_761) | 2
}

/// A member whose tag region (64 blocks) holds [`known_tag`] for every data block.
async fn tag_images() -> (Arc<Counting>, TagLayout) {
    let layout = TagLayout {
        offset: 0,
        bytes: 64 * TAG_BLOCK as u64,
        zeroed: false,
    };
    let dev: Arc<dyn BlockDev> = Arc::new(MemDev::new("t", layout.bytes));
    for i in 0..64u64 {
        let mut img = AlignedBuf::zeroed(TAG_BLOCK);
        for j in 0..TAGS_PER_BLOCK {
            let t = known_tag(i * TAGS_PER_BLOCK + j);
            img[j as usize * 4..j as usize * 4 + 4].copy_from_slice(&t.to_le_bytes());
        }
        dev::write_at(
            &dev,
            i * TAG_BLOCK as u64,
            img.into_shared(),
            false,
            IoClass::Foreground,
        )
        .await
        .unwrap();
    }
    let c = Arc::new(Counting {
        inner: dev,
        reads: Mutex::new(Vec::new()),
        writes: Mutex::new(Vec::new()),
    });
    (c, layout)
}

/// A stream's tags are read ahead: a miss on the block after a cached one reads up to 16
/// blocks at once, and every tag read so is the member's; misses elsewhere read one block.
#[test]
fn a_stream_reads_its_tags_ahead() {
    rt().block_on(async {
        let (c, layout) = tag_images().await;
        let dev: Arc<dyn BlockDev> = c.clone();
        let t = MemberTags::with_capacity(1 << 20);
        // The tags of the first 4 KiB of every 4 MiB, in order (a stream over 160 MiB).
        for i in 0..40u64 {
            let got = t.get(&dev, &layout, i * SPAN, 2 * BLOCK).await.unwrap();
            let b = i * TAGS_PER_BLOCK;
            assert_eq!(got, vec![known_tag(b), known_tag(b + 1)], "block {i}");
        }
        let reads = c.reads.lock().clone();
        // Block 0 alone (nothing before it), then 1..=16, 17..=32, 33..=48.
        let at = |i: u64| i * TAG_BLOCK as u64;
        assert_eq!(
            reads,
            vec![
                (at(0), TAG_BLOCK),
                (at(1), 16 * TAG_BLOCK),
                (at(17), 16 * TAG_BLOCK),
                (at(33), 16 * TAG_BLOCK)
            ]
        );
        // Every tag of those blocks is the member's.
        let all = t.get(&dev, &layout, 0, 49 * SPAN).await.unwrap();
        assert!(all
            .iter()
            .enumerate()
            .all(|(b, &x)| x == known_tag(b as u64)));
        // Not a stream: one block per miss.
        c.reads.lock().clear();
        let t = MemberTags::with_capacity(1 << 20);
        for i in [30u64, 10, 50] {
            assert_eq!(
                t.get(&dev, &layout, i * SPAN, BLOCK).await.unwrap(),
                vec![known_tag(i * TAGS_PER_BLOCK)]
            );
        }
        assert!(c.reads.lock().iter().all(|&(_, n)| n == TAG_BLOCK));
        // The region's end bounds a read-ahead: 63 is the last tag block.
        t.get(&dev, &layout, 61 * SPAN, BLOCK).await.unwrap();
        t.get(&dev, &layout, 62 * SPAN, BLOCK).await.unwrap();
        assert_eq!(*c.reads.lock().last().unwrap(), (at(62), 2 * TAG_BLOCK));
    });
}

/// A block read ahead never replaces a cached one (changed since, not written back), nor
/// is it adopted once any block left the cache while the read ran (it may have been that
/// block, changed and written back after the read saw its old image).
#[test]
fn read_ahead_never_replaces_newer_tags() {
    rt().block_on(async {
        let (c, layout) = tag_images().await;
        let dev: Arc<dyn BlockDev> = c.clone();
        let t = MemberTags::with_capacity(1 << 20);
        t.get(&dev, &layout, 0, BLOCK).await.unwrap();
        // Block 3 changes in the cache (dirty, not written back).
        let d = block_of(9);
        let w = t
            .set(&dev, &layout, 3 * SPAN, NewTags::Data(&d))
            .await
            .unwrap();
        t.settle(w, true);
        // A stream reaches block 1: the read-ahead stops short of block 3.
        t.get(&dev, &layout, SPAN, BLOCK).await.unwrap();
        assert_eq!(
            *c.reads.lock().last().unwrap(),
            (TAG_BLOCK as u64, 2 * TAG_BLOCK)
        );
        assert_eq!(
            t.get(&dev, &layout, 3 * SPAN, BLOCK).await.unwrap(),
            vec![tag(3 * TAGS_PER_BLOCK, &d)]
        );
        assert_eq!(
            t.get(&dev, &layout, 2 * SPAN, BLOCK).await.unwrap(),
            vec![known_tag(2 * TAGS_PER_BLOCK)]
        );
        // A departure while a read-ahead ran: nothing it read is adopted.
        let img = vec![0u8; TAG_BLOCK];
        let gone = t.gone.load(Ordering::Acquire);
        t.clear();
        assert!(!t.adopt(20, &img, gone));
        assert_eq!(t.cached(), 0);
        // With none: adopted, and never over the shard's bound.
        let gone = t.gone.load(Ordering::Acquire);
        assert!(t.adopt(20, &img, gone));
        assert_eq!(t.cached(), 1);
    });
}

/// Write-back sends adjacent changed tag blocks as one write (a drive streams them), and
/// what lands is every block's tags: a fresh cache reads back what was set.
#[test]
fn write_back_merges_adjacent_blocks() {
    rt().block_on(async {
        let (c, layout) = tag_images().await;
        let dev: Arc<dyn BlockDev> = c.clone();
        let t = MemberTags::with_capacity(1 << 20);
        // Blocks 2..=41 (a stream), 50 and 52 change.
        let changed: Vec<u64> = (2..42).chain([50, 52]).collect();
        for &i in &changed {
            let w = t
                .set(&dev, &layout, i * SPAN + BLOCK, NewTags::Data(&block_of(i)))
                .await
                .unwrap();
            t.settle(w, true);
        }
        c.writes.lock().clear();
        assert_eq!(t.write_back(&dev, &layout).await.unwrap(), 42);
        let mut writes = c.writes.lock().clone();
        writes.sort();
        let at = |i: u64| i * TAG_BLOCK as u64;
        assert_eq!(
            writes,
            vec![
                (at(2), 40 * TAG_BLOCK),
                (at(50), TAG_BLOCK),
                (at(52), TAG_BLOCK)
            ]
        );
        // Nothing left to write.
        assert_eq!(t.write_back(&dev, &layout).await.unwrap(), 0);
        let fresh = MemberTags::with_capacity(1 << 20);
        for i in 0..64u64 {
            let got = fresh.get(&dev, &layout, i * SPAN, 2 * BLOCK).await.unwrap();
            let b = i * TAGS_PER_BLOCK;
            let second = if changed.contains(&i) {
                tag(b + 1, &block_of(i))
            } else {
                known_tag(b + 1)
            };
            assert_eq!(got, vec![known_tag(b), second], "tag block {i}");
        }
    });
}
