//! End-to-end integrity: a checksum (tag) per 4 KiB block of every member's data, kept on
//! the member in a tag region between the write-intent bitmap and the data, verified on
//! every read (see docs/RELIABILITY.md, "Checksums on every block").
//!
//! - **Tag**: `crc32c(block) ^ mix(block number on the member)`, never 0 or 1: 0 is a
//!   block never written since the array was created (zeros where the members were known
//!   to be zero then, else unverified until the initial resync tags it), 1 a block a write
//!   refused for space may or may not have reached (unverified until written again). Mixing in the address makes right data at the
//!   wrong place (a misdirected write or read) fail; a lost write leaves the old data
//!   against the new tag. Being a plain XOR, the tag of a zero block needs no CRC of
//!   zeros, and the CRC of a buffer written to several mirrors is the same.
//! - **Store**: tag block `i` (4 KiB, 1024 tags, the tags of member data `[4 MiB * i,
//!   4 MiB * (i+1))`) lives at `tag_offset + 4 KiB * i`. Tag blocks are cached per member
//!   (bounded, clock eviction of clean blocks) and written back lazily: at every
//!   [`Array::flush`] (so what a FLUSH makes durable is verifiable after a power cut) and
//!   before the bitmap sweeper clears a region. Between those, the write-intent bitmap
//!   covers them: a write's region is dirty before it starts, and after a crash the resync
//!   of a dirty region makes its tags agree with the data it makes consistent.
//! - **Writes in flight**: a write sets the new tag before it is issued and keeps the old
//!   one as an alternate until it completes, so a concurrent read sees either. A read whose
//!   tags changed while it ran is read again before it counts as a mismatch.
//!
//! This module is the format and the per-member cache; the data path's member I/O layer
//! uses it (`datapath::tags`): `mread` verifies, `mwrite` and `mzero` set tags, `flush`
//! writes them back, `note_read_error` counts mismatches, a reconstruction is vouched for
//! against the tags of the member it replaces, the crash resync retags what it makes
//! consistent.
//!
//! Hand-written (the CRC itself is the `crc-fast` crate: crc32c by carry-less multiplication,
//! VPCLMULQDQ/PCLMULQDQ/ARMv8, chosen at run time; 2.2x the `crc32c` crate's SSE4.2 on
//! 4 KiB blocks, the same values, see `crc` and `examples/crc_bench.rs`):
//! the tag store is the product's own on-member format and its crash contract.

use crate::buf::AlignedBuf;
use crate::dev::{self, BlockDev, IoClass};
use parking_lot::Mutex;
use rustc_hash::FxHashMap as HashMap;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};

pub use sbod_types::Integrity as Kind;

// The record's format (where the tags live, their granularity) is the superblock's.
pub use crate::superblock::{TagLayout, BLOCK, SPAN, TAGS_PER_BLOCK, TAG_BLOCK};
const SHARDS: usize = 16;

/// Tag blocks [`MemberTags::read_ahead`] reads at most at once: 256 KiB of tags, those of
/// 256 MiB of member data.
pub const READ_AHEAD: usize = 64;
/// Reads of a block whose tags changed meanwhile, before a mismatch counts.
pub(crate) const REREADS: usize = 4;

static ZERO_CRC: LazyLock<u32> = LazyLock::new(|| crc(&[0u8; BLOCK as usize]));

/// crc32c (Castagnoli, as iSCSI and ext4 use it) of `data`: the tags' checksum.
pub fn crc(data: &[u8]) -> u32 {
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, data) as u32
}

fn mix(block: u64) -> u32 {
    // splitmix64's finaliser: every address bit moves about half the tag bits.
    let mut z = block.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z as u32) ^ ((z >> 32) as u32)
}

/// A block never written since the array was created: it holds zeros where the members
/// were known to be zero at creation ([`TagLayout::zeroed`]), else what they held.
pub const UNWRITTEN: u32 = 0;
/// A block a write refused for space may or may not have reached: any content is taken
/// until it is written again.
pub const UNKNOWN: u32 = 1;

fn nonzero(t: u32) -> u32 {
    if t <= UNKNOWN {
        t + 2
    } else {
        t
    }
}

/// Does a block whose tag is `t` (and the tag of zeros at its address, `zt`) match the
/// stored tag `cur`?
pub(crate) fn matches(cur: u32, t: u32, zt: u32, zeroed: bool) -> bool {
    match cur {
        UNWRITTEN => !zeroed || t == zt,
        UNKNOWN => true,
        c => c == t,
    }
}

/// Does the stored tag `cur` positively vouch for a block whose tag is `t` (`zt`: the tag
/// of zeros there)? Stricter than [`matches`]: "unknown", and "never written" where that
/// may hold anything, vouch for nothing. (Judging between members that both fail their
/// tags takes a tag that names the data.)
pub(crate) fn vouches(cur: u32, t: u32, zt: u32, zeroed: bool) -> bool {
    match cur {
        UNWRITTEN => zeroed && t == zt,
        UNKNOWN => false,
        c => c == t,
    }
}

/// The tag of the 4 KiB `data` at member block `block` (member data offset / 4096).
pub fn tag(block: u64, data: &[u8]) -> u32 {
    debug_assert_eq!(data.len() as u64, BLOCK);
    tag_of_crc(block, crc(data))
}

/// The tag of a block of zeros at `block`.
pub fn zero_tag(block: u64) -> u32 {
    nonzero(*ZERO_CRC ^ mix(block))
}

/// A read whose data did not match its tags: a distinct error, counted as a checksum
/// error (not a read error) and handled by the engine's read-error paths (reconstructed
/// and rewritten where there is redundancy, EIO where there is none).
#[derive(Debug)]
pub struct Mismatch {
    /// Member data offsets of the blocks that failed.
    pub blocks: Vec<u64>,
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "checksum mismatch in {} block(s) from member offset {} (the member returned data that was not written there)",
            self.blocks.len(),
            self.blocks.first().copied().unwrap_or(0)
        )
    }
}

impl std::error::Error for Mismatch {}

/// The mismatch an I/O error carries, if it is one.
pub fn mismatch_of(e: &io::Error) -> Option<&Mismatch> {
    e.get_ref().and_then(|x| x.downcast_ref::<Mismatch>())
}

pub(crate) fn mismatch(blocks: Vec<u64>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, Mismatch { blocks })
}

/// Tags from a tag block's image on the member.
fn fill(tags: &[AtomicU32], img: &[u8]) {
    for (i, t) in tags.iter().enumerate() {
        t.store(
            u32::from_le_bytes(img[i * 4..i * 4 + 4].try_into().unwrap()),
            Ordering::Release,
        );
    }
}

/// One cached tag block.
struct TagBlock {
    tags: Box<[AtomicU32]>,
    loaded: tokio::sync::OnceCell<()>,
    dirty: AtomicBool,
    /// Bumped on every change of a tag (readers that saw a mismatch read again if it moved).
    gen: AtomicU64,
    /// Old tags of blocks being written, by index: what the block may still hold until
    /// the write completes; after a write that failed (refused for space), until one
    /// succeeds.
    alts: Mutex<Alts>,
    nalts: AtomicUsize,
    /// Clock bit for eviction.
    used: AtomicBool,
}

impl TagBlock {
    fn new() -> TagBlock {
        TagBlock {
            tags: (0..TAGS_PER_BLOCK).map(|_| AtomicU32::new(0)).collect(),
            loaded: tokio::sync::OnceCell::new(),
            dirty: AtomicBool::new(false),
            gen: AtomicU64::new(0),
            alts: Mutex::new(Alts::default()),
            nalts: AtomicUsize::new(0),
            used: AtomicBool::new(true),
        }
    }

    /// The block as written to the member. A block with old tags pending is written as
    /// [`UNKNOWN`]: one value cannot say "either" (a write in flight is covered by its
    /// dirty region anyway; a refused one is unverified after a restart until rewritten).
    fn image(&self) -> AlignedBuf {
        let mut b = AlignedBuf::zeroed(TAG_BLOCK);
        let alts = self.alts.lock();
        for (i, t) in self.tags.iter().enumerate() {
            let v = t.load(Ordering::Acquire);
            b[i * 4..i * 4 + 4].copy_from_slice(&v.to_le_bytes());
        }
        for &(i, _) in &alts.0 {
            let i = i as usize;
            b[i * 4..i * 4 + 4].copy_from_slice(&UNKNOWN.to_le_bytes());
        }
        b
    }

    /// Does a block with tag `t` (`zt`: the tag of zeros there) match tag `i`, or the
    /// old tag of a write in flight?
    fn accepts(&self, i: usize, t: u32, zt: u32, zeroed: bool) -> bool {
        let cur = self.tags[i].load(Ordering::Acquire);
        if matches(cur, t, zt, zeroed) {
            return true;
        }
        if self.nalts.load(Ordering::Acquire) == 0 {
            return false;
        }
        let alts = self.alts.lock();
        let cur = self.tags[i].load(Ordering::Acquire);
        matches(cur, t, zt, zeroed)
            || alts
                .0
                .iter()
                .any(|&(j, a)| j as usize == i && matches(a, t, zt, zeroed))
    }
}

/// The old tags of a tag block's blocks being written (or whose write failed), by index
/// in the block. A plain list, not a map: a write sets and settles a run of them at once
/// (256 for 1 MiB), and hashing and one allocation per 4 KiB block cost more than the
/// checksum itself; lookups (a read racing a write) are rare and short.
#[derive(Default)]
struct Alts(Vec<(u16, u32)>);

impl Alts {
    /// Forget the old tags of indexes `[lo, hi)`.
    fn clear(&mut self, lo: u16, hi: u16) {
        self.0.retain(|&(i, _)| !(lo..hi).contains(&i));
    }

    /// Take the old tags of index `i`, if it has any.
    fn take(&mut self, i: u16) -> Vec<u32> {
        let mut out = Vec::new();
        self.0.retain(|&(j, a)| {
            if j == i {
                out.push(a);
            }
            j != i
        });
        out
    }
}

/// One member's cached tags. Each member has its own (the SBOD rule: nothing shared
/// between members in the I/O path), sharded by tag block.
pub struct MemberTags {
    shards: Vec<Mutex<HashMap<u64, Arc<TagBlock>>>>,
    /// Clean tag blocks each shard may keep.
    cap: usize,
    pub(crate) stats: CacheStats,
    /// Bumped whenever a block leaves the cache (evicted, dropped after a failed load,
    /// cleared): a read-ahead adopts the blocks it read only if none left while it ran
    /// (see [`MemberTags::adopt`]).
    gone: AtomicU64,
    /// Read-aheads in flight: the tag blocks `[first, end)` each reads, and a semaphore
    /// closed when it is done. A read-ahead that starts inside one waits for it instead
    /// of reading the same blocks again (a rebuild's chunks ask for the same region's
    /// tags dozens of times at once as it starts: each read them again), and one that
    /// starts before one stops short of it.
    ahead: Mutex<Vec<(u64, u64, Arc<tokio::sync::Semaphore>)>>,
}

/// What [`MemberTags::claim_ahead`] gave a read-ahead.
enum Claim {
    /// Another read-ahead reads the block: done when its semaphore is closed.
    Wait(Arc<tokio::sync::Semaphore>),
    /// The block is loaded.
    Nothing,
    /// These blocks, from the first on, to read (registered as in flight).
    Run(Vec<Arc<TagBlock>>),
}

/// Tag blocks a load reads at once when the block before it is cached (a stream moving
/// forward): 64 KiB of tags, the tags of 64 MiB of member data. On a drive, a stream's
/// tags cost one positioning per 64 MiB instead of one per 4 MiB (each a seek away from
/// the data, which waits for it); a read of 64 KiB costs about what one of 4 KiB does.
const READ_AHEAD_BLOCKS: u64 = 16;

/// Most adjacent tag blocks [`MemberTags::write_back`] writes as one command (1 MiB).
const WRITE_BACK_RUN: usize = 256;

/// How the tag cache fares (for the cache benchmark and tests).
#[derive(Default, Debug)]
pub struct CacheStats {
    pub hits: AtomicU64,
    pub loads: AtomicU64,
    pub evictions: AtomicU64,
    pub writebacks: AtomicU64,
}

impl Default for MemberTags {
    fn default() -> MemberTags {
        // Bytes per member: `tuning::TAG_CACHE` (default `tuning::TAG_CACHE_DEFAULT`).
        MemberTags::with_capacity(crate::tuning::tag_cache_bytes())
    }
}

impl MemberTags {
    /// A cache holding about `bytes` of clean tag blocks.
    pub fn with_capacity(bytes: u64) -> MemberTags {
        let blocks = (bytes / TAG_BLOCK as u64).max(SHARDS as u64) as usize;
        MemberTags {
            // Fx, not SipHash: the keys are tag block numbers (no hostile input), looked up
            // twice per member write.
            shards: (0..SHARDS)
                .map(|_| Mutex::new(HashMap::default()))
                .collect(),
            cap: blocks.div_ceil(SHARDS),
            stats: CacheStats::default(),
            gone: AtomicU64::new(0),
            ahead: Mutex::new(Vec::new()),
        }
    }

    fn shard(&self, idx: u64) -> &Mutex<HashMap<u64, Arc<TagBlock>>> {
        &self.shards[(idx as usize) % SHARDS]
    }

    /// Tag block `idx`, read from the member if it is not cached.
    async fn block(
        &self,
        dev: &Arc<dyn BlockDev>,
        layout: &TagLayout,
        idx: u64,
    ) -> io::Result<Arc<TagBlock>> {
        let b = {
            let mut map = self.shard(idx).lock();
            match map.get(&idx) {
                Some(b) => {
                    b.used.store(true, Ordering::Relaxed);
                    self.stats.hits.fetch_add(1, Ordering::Relaxed);
                    b.clone()
                }
                None => {
                    if map.len() >= self.cap {
                        self.evict(&mut map, self.cap - 1);
                    }
                    let b = Arc::new(TagBlock::new());
                    map.insert(idx, b.clone());
                    b
                }
            }
        };
        if b.loaded.initialized() {
            return Ok(b);
        }
        let r = b
            .loaded
            .get_or_try_init(|| async {
                let n = self.ahead(layout, idx);
                let gone = self.gone.load(Ordering::Acquire);
                let buf = AlignedBuf::zeroed(TAG_BLOCK * n as usize).into_shared();
                let off = layout.offset + idx * TAG_BLOCK as u64;
                dev::read_at(dev, off, buf.clone(), IoClass::Foreground).await?;
                // SAFETY: the read completed; this task is the buffer's only user.
                let s = unsafe { buf.as_slice() };
                fill(&b.tags, &s[..TAG_BLOCK]);
                for j in 1..n {
                    let at = j as usize * TAG_BLOCK;
                    if !self.adopt(idx + j, &s[at..at + TAG_BLOCK], gone) {
                        break;
                    }
                }
                self.stats.loads.fetch_add(1, Ordering::Relaxed);
                Ok::<(), io::Error>(())
            })
            .await;
        match r {
            Ok(()) => Ok(b),
            Err(e) => {
                // Not cached: the next access reads again.
                let mut map = self.shard(idx).lock();
                if map.get(&idx).is_some_and(|x| Arc::ptr_eq(x, &b)) {
                    map.remove(&idx);
                    self.gone.fetch_add(1, Ordering::AcqRel);
                }
                Err(e)
            }
        }
    }

    /// Tag read-ahead for a reader going forward through a member (the background
    /// processes: rebuild, distributed rebuild, scrub): the tag blocks from the one of
    /// member data offset `off` on that are not cached, up to [`READ_AHEAD`] of them (and a
    /// quarter of the cache), read from the member in one I/O, where the reads would load
    /// them one at a time as they reach them: on a disk each such load is a seek to the tag
    /// region and back, which costs a rebuild more than the tags' bytes. Nothing is read
    /// when the block of `off` is cached. An error here is left to the reads (they load
    /// what they need again, and report what fails).
    pub async fn read_ahead(&self, dev: &Arc<dyn BlockDev>, layout: &TagLayout, off: u64) {
        let first = off / SPAN;
        let total = layout.bytes / TAG_BLOCK as u64;
        if first >= total
            || self
                .shard(first)
                .lock()
                .get(&first)
                .is_some_and(|b| b.loaded.initialized())
        {
            return;
        }
        let run = match self.claim_ahead(first, total) {
            Claim::Wait(done) => {
                // Closed when that read is done (its blocks loaded, or left to the reads).
                let _ = done.acquire().await;
                return;
            }
            Claim::Nothing => return,
            Claim::Run(run) => run,
        };
        // Unregistered and its waiters let go however this ends (an error, or the
        // future dropped).
        struct Done<'a>(&'a MemberTags, u64);
        impl Drop for Done<'_> {
            fn drop(&mut self) {
                let mut v = self.0.ahead.lock();
                if let Some(i) = v.iter().position(|(a, _, _)| *a == self.1) {
                    v.swap_remove(i).2.close();
                }
            }
        }
        let _done = Done(self, first);
        let buf = AlignedBuf::zeroed(run.len() * TAG_BLOCK).into_shared();
        let at = layout.offset + first * TAG_BLOCK as u64;
        if dev::read_at(dev, at, buf.clone(), IoClass::Background)
            .await
            .is_err()
        {
            return;
        }
        // SAFETY: the read completed; this task is the buffer's only user.
        let s = unsafe { buf.as_slice() };
        for (n, b) in run.iter().enumerate() {
            let _ = b
                .loaded
                .get_or_try_init(|| async {
                    let s = &s[n * TAG_BLOCK..(n + 1) * TAG_BLOCK];
                    for (i, t) in b.tags.iter().enumerate() {
                        t.store(
                            u32::from_le_bytes(s[i * 4..i * 4 + 4].try_into().unwrap()),
                            Ordering::Release,
                        );
                    }
                    self.stats.loads.fetch_add(1, Ordering::Relaxed);
                    Ok::<(), io::Error>(())
                })
                .await;
        }
    }

    /// The run a read-ahead from tag block `first` reads, registered as in flight; or
    /// the read-ahead in flight that already reads `first`, to wait for. One read-ahead
    /// at a time for any tag block: checked and registered under the member's list of
    /// those in flight (the background processes' path only; not held across an await).
    fn claim_ahead(&self, first: u64, total: u64) -> Claim {
        let mut inflight = self.ahead.lock();
        if let Some((_, _, done)) = inflight.iter().find(|(a, e, _)| (*a..*e).contains(&first)) {
            return Claim::Wait(done.clone());
        }
        // Short of the next read-ahead in flight.
        let next = inflight
            .iter()
            .filter(|(a, _, _)| *a > first)
            .map(|(a, _, _)| a - first)
            .min()
            .unwrap_or(u64::MAX);
        let most = (READ_AHEAD as u64)
            .min((self.cap * SHARDS / 4).max(1) as u64)
            .min(total - first)
            .min(next);
        // The run of blocks not loaded from `first` on, each in the cache (held here, so
        // none is evicted) before the read: a block loaded meanwhile by another reader
        // keeps what it has (`get_or_try_init` runs once), and one not loaded cannot have
        // changed on the member since (tags change only in loaded blocks).
        let mut run: Vec<Arc<TagBlock>> = Vec::new();
        for idx in first..first + most {
            let mut map = self.shard(idx).lock();
            let b = match map.get(&idx) {
                Some(b) if b.loaded.initialized() => break,
                Some(b) => b.clone(),
                None => {
                    if map.len() >= self.cap {
                        self.evict(&mut map, self.cap - 1);
                    }
                    let b = Arc::new(TagBlock::new());
                    map.insert(idx, b.clone());
                    b
                }
            };
            run.push(b);
        }
        if run.is_empty() {
            return Claim::Nothing;
        }
        let end = first + run.len() as u64;
        inflight.push((first, end, Arc::new(tokio::sync::Semaphore::new(0))));
        Claim::Run(run)
    }

    /// Drop clean, loaded blocks nobody holds, second-chance by their clock bit. Dirty
    /// blocks stay until written back (the next flush), so a shard may pass its share for
    /// a while under many writes.
    /// How many tag blocks to read for a miss on block `idx`: one, or where the block
    /// before is cached and loaded (a stream moving forward) up to [`READ_AHEAD_BLOCKS`],
    /// within the tag region and short of the next block already cached.
    fn ahead(&self, layout: &TagLayout, idx: u64) -> u64 {
        let streaming = idx > 0
            && self
                .shard(idx - 1)
                .lock()
                .get(&(idx - 1))
                .is_some_and(|b| b.loaded.initialized());
        if !streaming {
            return 1;
        }
        let end = (layout.bytes / TAG_BLOCK as u64).min(idx + READ_AHEAD_BLOCKS);
        let mut n = 1;
        while idx + n < end && !self.shard(idx + n).lock().contains_key(&(idx + n)) {
            n += 1;
        }
        n
    }

    /// Cache tag block `idx` as read ahead (`img`, read from the member after `gone` was
    /// taken), unless it is cached already (being loaded, or changed since: the cached one
    /// is newer) or a block left the cache since `gone` (it may have been this one, changed
    /// and written back while the read ran, which may have seen the old image). Never
    /// evicts for it (a full shard skips it). False: stop adopting.
    fn adopt(&self, idx: u64, img: &[u8], gone: u64) -> bool {
        let mut map = self.shard(idx).lock();
        // Blocks leave a shard under its lock, and `gone` is bumped there: a departure
        // before this lock was taken is seen here.
        if self.gone.load(Ordering::Acquire) != gone {
            return false;
        }
        if map.contains_key(&idx) || map.len() >= self.cap {
            return true;
        }
        let b = TagBlock::new();
        fill(&b.tags, img);
        b.loaded.set(()).expect("a new block");
        // Not used yet: the first to go if the stream does not come.
        b.used.store(false, Ordering::Relaxed);
        map.insert(idx, Arc::new(b));
        self.stats.loads.fetch_add(1, Ordering::Relaxed);
        true
    }

    fn evict(&self, map: &mut HashMap<u64, Arc<TagBlock>>, target: usize) {
        let stats = &self.stats;
        for pass in 0..2 {
            let victims: Vec<u64> = map
                .iter()
                .filter(|(_, b)| {
                    Arc::strong_count(b) == 1
                        && !b.dirty.load(Ordering::Acquire)
                        && b.loaded.initialized()
                        && b.nalts.load(Ordering::Acquire) == 0
                        && (pass == 1 || !b.used.swap(false, Ordering::Relaxed))
                })
                .map(|(i, _)| *i)
                .take(map.len().saturating_sub(target))
                .collect();
            for i in victims {
                map.remove(&i);
                stats.evictions.fetch_add(1, Ordering::Relaxed);
                self.gone.fetch_add(1, Ordering::AcqRel);
            }
            if map.len() <= target {
                return;
            }
        }
    }

    fn dirty_blocks(&self) -> Vec<(u64, Arc<TagBlock>)> {
        let mut v = Vec::new();
        for s in &self.shards {
            for (i, b) in s.lock().iter() {
                if b.dirty.load(Ordering::Acquire) {
                    v.push((*i, b.clone()));
                }
            }
        }
        v.sort_by_key(|(i, _)| *i);
        v
    }

    /// Is any tag block covering member data `[from, to)` changed and not written back?
    pub(crate) fn dirty_in(&self, from: u64, to: u64) -> bool {
        (from / SPAN..to.div_ceil(SPAN)).any(|i| {
            self.shard(i)
                .lock()
                .get(&i)
                .is_some_and(|b| b.dirty.load(Ordering::Acquire))
        })
    }

    /// Tag blocks cached now.
    pub fn cached(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }

    /// Forget every cached tag (tests: what a restart sees is what is on the member).
    pub fn clear(&self) {
        for s in &self.shards {
            s.lock().clear();
            self.gone.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// The tag blocks covering member data `[off, off+len)`, in order.
    async fn blocks(
        &self,
        dev: &Arc<dyn BlockDev>,
        layout: &TagLayout,
        off: u64,
        len: u64,
    ) -> io::Result<Vec<Arc<TagBlock>>> {
        let mut v = Vec::new();
        for i in off / SPAN..(off + len).div_ceil(SPAN) {
            v.push(self.block(dev, layout, i).await?);
        }
        Ok(v)
    }

    /// The tags of member data `[off, off+len)`.
    pub async fn get(
        &self,
        dev: &Arc<dyn BlockDev>,
        layout: &TagLayout,
        off: u64,
        len: u64,
    ) -> io::Result<Vec<u32>> {
        let blocks = self.blocks(dev, layout, off, len).await?;
        Ok((off / BLOCK..(off + len).div_ceil(BLOCK))
            .map(|b| {
                let tb = &blocks[(b / TAGS_PER_BLOCK - off / SPAN) as usize];
                tb.tags[(b % TAGS_PER_BLOCK) as usize].load(Ordering::Acquire)
            })
            .collect())
    }

    /// The member data offsets of the blocks of `data` (read at `off`) that match neither
    /// their tag nor the old tag of a write in flight.
    fn mismatches(blocks: &[Arc<TagBlock>], zeroed: bool, off: u64, data: &[u8]) -> Vec<u64> {
        let mut bad = Vec::new();
        for (n, chunk) in data.chunks(BLOCK as usize).enumerate() {
            let moff = off + n as u64 * BLOCK;
            let b = moff / BLOCK;
            let tb = &blocks[(moff / SPAN - off / SPAN) as usize];
            let i = (b % TAGS_PER_BLOCK) as usize;
            if !tb.accepts(i, tag(b, chunk), zero_tag(b), zeroed) {
                bad.push(moff);
            }
        }
        bad
    }

    /// Check `data`, read at member data offset `off`, against its tags: the offsets of
    /// the blocks that fail.
    pub async fn check(
        &self,
        dev: &Arc<dyn BlockDev>,
        layout: &TagLayout,
        off: u64,
        data: &[u8],
    ) -> io::Result<Vec<u64>> {
        let blocks = self.blocks(dev, layout, off, data.len() as u64).await?;
        Ok(Self::mismatches(&blocks, layout.zeroed, off, data))
    }

    /// Before a write (or zeroing) of member data `[off, off+len)`: set its new tags,
    /// keeping the old ones as alternates until [`MemberTags::settle`].
    pub async fn set(
        &self,
        dev: &Arc<dyn BlockDev>,
        layout: &TagLayout,
        off: u64,
        new: NewTags<'_>,
    ) -> io::Result<TagWrite> {
        let len = match &new {
            NewTags::Data(d) => d.len() as u64,
            NewTags::Zeros(n) => *n,
            NewTags::Crcs(c) => c.len() as u64 * BLOCK,
        };
        let mut b = off / BLOCK;
        let end = (off + len).div_ceil(BLOCK);
        while b < end {
            let idx = b / TAGS_PER_BLOCK;
            let blk = self.block(dev, layout, idx).await?;
            let stop = end.min((idx + 1) * TAGS_PER_BLOCK);
            // In runs of at most `RUN` blocks, summed on the stack (no allocation per
            // write), each run's sums first, outside the lock readers take.
            const RUN: u64 = 64;
            let mut at = b;
            while at < stop {
                let run_end = stop.min(at + RUN);
                let mut tags = [0u32; RUN as usize];
                for (x, t) in (at..run_end).zip(tags.iter_mut()) {
                    *t = match &new {
                        NewTags::Data(d) => {
                            let o = ((x - off / BLOCK) * BLOCK) as usize;
                            tag(x, &d[o..o + BLOCK as usize])
                        }
                        NewTags::Zeros(_) => zero_tag(x),
                        NewTags::Crcs(c) => tag_of_crc(x, c[(x - off / BLOCK) as usize]),
                    };
                }
                let mut alts = blk.alts.lock();
                alts.0.reserve((run_end - at) as usize);
                for (x, &t) in (at..run_end).zip(tags.iter()) {
                    let i = (x % TAGS_PER_BLOCK) as usize;
                    let old = blk.tags[i].swap(t, Ordering::AcqRel);
                    // Writes to a block are ordered by its stripe lock: one in flight at
                    // most (more old tags only after writes that failed).
                    alts.0.push((i as u16, old));
                }
                blk.nalts.store(alts.0.len(), Ordering::Release);
                blk.gen.fetch_add(1, Ordering::AcqRel);
                blk.dirty.store(true, Ordering::Release);
                drop(alts);
                at = run_end;
            }
            b = stop;
        }
        Ok(TagWrite { off, len })
    }

    /// A write whose tags were set is done: forget the old tags. A write that failed may
    /// have reached some of its blocks and not others (a file system out of space lands a
    /// prefix): those blocks keep their old tags beside the new one until a write to them
    /// succeeds.
    pub fn settle(&self, w: TagWrite, ok: bool) {
        let first = w.off / BLOCK;
        let end = (w.off + w.len).div_ceil(BLOCK);
        for idx in first / TAGS_PER_BLOCK..end.div_ceil(TAGS_PER_BLOCK) {
            // Loaded by `set`, and not evictable while it has alternates.
            let Some(blk) = self.shard(idx).lock().get(&idx).cloned() else {
                continue;
            };
            let lo = first.max(idx * TAGS_PER_BLOCK);
            let hi = end.min((idx + 1) * TAGS_PER_BLOCK);
            let mut alts = blk.alts.lock();
            if ok {
                let base = idx * TAGS_PER_BLOCK;
                alts.clear((lo - base) as u16, (hi - base) as u16);
            }
            blk.nalts.store(alts.0.len(), Ordering::Release);
            blk.gen.fetch_add(1, Ordering::AcqRel);
            blk.dirty.store(true, Ordering::Release);
        }
    }

    /// After a write that failed: the blocks of `[off, off+len)` hold `data` (read back):
    /// each keeps the one of its candidate tags (new, or old) that matches what it holds,
    /// so the ambiguity a refused write leaves ends here (and survives a restart). A block
    /// that matches none keeps the new tag: it is wrong either way.
    pub fn resolve(&self, off: u64, data: &[u8], zeroed: bool) {
        let first = off / BLOCK;
        let end = (off + data.len() as u64).div_ceil(BLOCK);
        for idx in first / TAGS_PER_BLOCK..end.div_ceil(TAGS_PER_BLOCK) {
            let Some(blk) = self.shard(idx).lock().get(&idx).cloned() else {
                continue;
            };
            let mut alts = blk.alts.lock();
            for x in first.max(idx * TAGS_PER_BLOCK)..end.min((idx + 1) * TAGS_PER_BLOCK) {
                let i = (x % TAGS_PER_BLOCK) as usize;
                let old = alts.take(i as u16);
                if old.is_empty() {
                    continue;
                }
                let at = ((x - first) * BLOCK) as usize;
                let (t, zt) = (tag(x, &data[at..at + BLOCK as usize]), zero_tag(x));
                let cur = blk.tags[i].load(Ordering::Acquire);
                if cur != t && old.iter().any(|&o| matches(o, t, zt, zeroed)) {
                    // It holds what it held before (or what nothing vouched for): its tag
                    // is that of what it holds. (Matching nothing, it keeps the new tag:
                    // it is wrong either way.)
                    blk.tags[i].store(t, Ordering::Release);
                }
            }
            blk.nalts.store(alts.0.len(), Ordering::Release);
            blk.gen.fetch_add(1, Ordering::AcqRel);
            blk.dirty.store(true, Ordering::Release);
        }
    }

    /// Write every changed tag block to the member (not durably: a flush follows).
    /// Returns how many were written. Adjacent blocks go as one write (up to
    /// [`WRITE_BACK_RUN`] of them), and the writes are issued together: on a drive a
    /// stream's tags are one command per 1 MiB of tags, queued at once, instead of one
    /// 4 KiB write a revolution after another (40 dirty blocks took a third of a second on
    /// a drive with its write cache off).
    pub async fn write_back(
        &self,
        dev: &Arc<dyn BlockDev>,
        layout: &TagLayout,
    ) -> io::Result<usize> {
        let mut runs: Vec<Vec<(u64, Arc<TagBlock>)>> = Vec::new();
        for (idx, blk) in self.dirty_blocks() {
            match runs.last_mut() {
                Some(r)
                    if r.last().is_some_and(|(i, _)| i + 1 == idx) && r.len() < WRITE_BACK_RUN =>
                {
                    r.push((idx, blk))
                }
                _ => runs.push(vec![(idx, blk)]),
            }
        }
        let writes = runs.iter().map(|run| async move {
            let mut img = AlignedBuf::zeroed(TAG_BLOCK * run.len());
            for (k, (_, blk)) in run.iter().enumerate() {
                // Cleared before the image is taken: a change after it marks it again.
                blk.dirty.store(false, Ordering::Release);
                img[k * TAG_BLOCK..(k + 1) * TAG_BLOCK].copy_from_slice(&blk.image()[..]);
            }
            let off = layout.offset + run[0].0 * TAG_BLOCK as u64;
            let r = dev::write_at(dev, off, img.into_shared(), false, IoClass::Foreground).await;
            if r.is_err() {
                for (_, blk) in run {
                    blk.dirty.store(true, Ordering::Release);
                }
            }
            r.map(|()| run.len())
        });
        let mut n = 0;
        let mut first_err = None;
        for r in futures::future::join_all(writes).await {
            match r {
                Ok(k) => n += k,
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        self.stats.writebacks.fetch_add(n as u64, Ordering::Relaxed);
        match first_err {
            Some(e) => Err(e),
            None => Ok(n),
        }
    }
}

/// The tag blocks covering a read, and their generations when it was issued: a block that
/// fails while its tags moved (a write landed meanwhile) is read again.
pub(crate) struct ReadCheck {
    off: u64,
    blocks: Vec<Arc<TagBlock>>,
    gens: Vec<u64>,
}

impl MemberTags {
    /// The tags a read of member data `[off, off+len)` is checked against.
    pub(crate) async fn read_check(
        &self,
        dev: &Arc<dyn BlockDev>,
        layout: &TagLayout,
        off: u64,
        len: u64,
    ) -> io::Result<ReadCheck> {
        let blocks = self.blocks(dev, layout, off, len).await?;
        Ok(ReadCheck {
            off,
            gens: vec![0; blocks.len()],
            blocks,
        })
    }
}

impl ReadCheck {
    /// Before the read is issued: note the tags' generations.
    pub(crate) fn start(&mut self) {
        for (g, b) in self.gens.iter_mut().zip(&self.blocks) {
            *g = b.gen.load(Ordering::Acquire);
        }
    }

    /// The member data offsets of the blocks of `data` (as read) that fail their tags.
    pub(crate) fn bad(&self, zeroed: bool, data: &[u8]) -> Vec<u64> {
        MemberTags::mismatches(&self.blocks, zeroed, self.off, data)
    }

    /// Did any tag change since [`ReadCheck::start`]?
    pub(crate) fn moved(&self) -> bool {
        self.blocks
            .iter()
            .zip(&self.gens)
            .any(|(b, g)| b.gen.load(Ordering::Acquire) != *g)
    }
}

/// The tags a write sets, one per 4 KiB block of its range: computed from its data, or
/// those of zero blocks.
pub enum NewTags<'a> {
    Data(&'a [u8]),
    Zeros(u64),
    /// The [`crc`] of each 4 KiB block of the data written, taken by the caller while it
    /// had the data in cache (the parity write's fused pass, see `family::parity`).
    Crcs(&'a [u32]),
}

/// The tag of a block at `block` whose [`crc`] is `crc`: what [`tag`] gives for its data.
pub fn tag_of_crc(block: u64, crc: u32) -> u32 {
    nonzero(crc ^ mix(block))
}

/// A write's tags, set before it is issued; [`MemberTags::settle`] settles them.
#[must_use]
pub struct TagWrite {
    pub(crate) off: u64,
    pub(crate) len: u64,
}

#[cfg(test)]
mod tests;
