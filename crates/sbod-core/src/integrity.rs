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
//! The engine reaches this module through a few hooks (see the module's `impl Array`):
//! `mread` verifies, `mwrite` and member zeroing set tags, `flush` writes tags back,
//! `note_read_error` counts mismatches, a reconstruction is vouched for against the tags
//! of the member it replaces, the crash resync retags what it makes consistent.
//!
//! Hand-written (the CRC itself is the `crc32c` crate, with SSE4.2/ARMv8 instructions):
//! the tag store is the product's own on-member format and its crash contract.

use crate::array::{Array, Member};
use crate::buf::{AlignedBuf, SharedBuf};
use crate::dev::{self, BlockDev, IoClass};
use crate::error::{Error, Result};
use crate::layout::Geometry;
use crate::superblock::{Extension, EXT_INCOMPAT};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};

pub use sbod_types::Integrity as Kind;

/// Bytes of data per tag.
pub const BLOCK: u64 = 4096;
/// Bytes of one tag block on the member (the unit read and written).
pub const TAG_BLOCK: usize = 4096;
/// Tags per tag block.
pub const TAGS_PER_BLOCK: u64 = (TAG_BLOCK / 4) as u64;
/// Data bytes one tag block covers.
pub const SPAN: u64 = TAGS_PER_BLOCK * BLOCK;
/// The superblock extension record saying an array carries tags (marked incompatible: an
/// sbod that does not know it would write data without tags, so it must refuse).
pub const EXT_TAG: u16 = 0x0015;
/// How many tag blocks each member may keep cached by default: 16 MiB of tags per member,
/// the tags of 16 GiB of its data. `SBOD_TAG_CACHE` (bytes per member) overrides it.
pub const DEFAULT_CACHE_BYTES: u64 = 16 << 20;
const SHARDS: usize = 16;
/// Reads of a block whose tags changed meanwhile, before a mismatch counts.
const REREADS: usize = 4;

static ZERO_CRC: LazyLock<u32> = LazyLock::new(|| crc32c::crc32c(&[0u8; BLOCK as usize]));

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
fn matches(cur: u32, t: u32, zt: u32, zeroed: bool) -> bool {
    match cur {
        UNWRITTEN => !zeroed || t == zt,
        UNKNOWN => true,
        c => c == t,
    }
}

/// The tag of the 4 KiB `data` at member block `block` (member data offset / 4096).
pub fn tag(block: u64, data: &[u8]) -> u32 {
    debug_assert_eq!(data.len() as u64, BLOCK);
    nonzero(crc32c::crc32c(data) ^ mix(block))
}

/// The tag of a block of zeros at `block`.
pub fn zero_tag(block: u64) -> u32 {
    nonzero(*ZERO_CRC ^ mix(block))
}

/// Where the tags live on each member.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TagLayout {
    /// Member byte offset of tag block 0.
    pub offset: u64,
    /// Bytes reserved (a multiple of 4 KiB).
    pub bytes: u64,
    /// The members were zero when the array was created (`--assume-clean`, files sbod
    /// made): a block never written must read as zeros.
    pub zeroed: bool,
}

impl TagLayout {
    /// Bytes of tags for `member_data` bytes of data.
    pub fn bytes_for(member_data: u64) -> u64 {
        member_data.div_ceil(SPAN).max(1) * TAG_BLOCK as u64
    }

    /// The superblock record: kind 1 = crc32c per 4 KiB, the tag region.
    pub fn extension(&self) -> Extension {
        let mut data = Vec::with_capacity(24);
        data.push(1u8); // crc32c
        data.push(self.zeroed as u8); // flags: 1 = never-written blocks are zeros
        data.extend_from_slice(&[0u8; 2]);
        data.extend_from_slice(&(BLOCK as u32).to_le_bytes());
        data.extend_from_slice(&self.offset.to_le_bytes());
        data.extend_from_slice(&self.bytes.to_le_bytes());
        Extension {
            tag: EXT_TAG,
            flags: EXT_INCOMPAT,
            data,
        }
    }

    /// The layout an array's superblock records, if it carries tags. Checked against the
    /// geometry: the tags must lie between the bitmap and the data and cover all of it.
    pub fn from_extensions(
        ext: &[Extension],
        g: &Geometry,
        bitmap_end: u64,
    ) -> std::result::Result<Option<TagLayout>, String> {
        let Some(e) = ext.iter().find(|e| e.tag == EXT_TAG) else {
            return Ok(None);
        };
        let d = &e.data;
        if d.len() < 24 {
            return Err("the checksum record is truncated".into());
        }
        if d[0] != 1 {
            return Err(format!("unknown checksum kind {}", d[0]));
        }
        if d[1] > 1 {
            return Err(format!("unknown checksum flags {}", d[1]));
        }
        let block = u32::from_le_bytes(d[4..8].try_into().unwrap()) as u64;
        let offset = u64::from_le_bytes(d[8..16].try_into().unwrap());
        let bytes = u64::from_le_bytes(d[16..24].try_into().unwrap());
        if block != BLOCK {
            return Err(format!("checksums per {block} bytes are not supported"));
        }
        if offset < bitmap_end
            || !offset.is_multiple_of(TAG_BLOCK as u64)
            || offset
                .checked_add(bytes)
                .is_none_or(|end| end > g.data_offset)
            || bytes < Self::bytes_for(g.member_size)
        {
            return Err("the checksum region does not fit between the bitmap and the data".into());
        }
        Ok(Some(TagLayout {
            offset,
            bytes,
            zeroed: d[1] == 1,
        }))
    }

    /// Is this extension one this sbod knows (so its incompatible flag is no reason to
    /// refuse the superblock)?
    pub fn known(tag: u16) -> bool {
        tag == EXT_TAG
    }
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

fn mismatch(blocks: Vec<u64>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, Mismatch { blocks })
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
    alts: Mutex<HashMap<u16, Vec<u32>>>,
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
            alts: Mutex::new(HashMap::new()),
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
            let mut v = t.load(Ordering::Acquire);
            if alts.contains_key(&(i as u16)) {
                v = UNKNOWN;
            }
            b[i * 4..i * 4 + 4].copy_from_slice(&v.to_le_bytes());
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
                .get(&(i as u16))
                .is_some_and(|v| v.iter().any(|&a| matches(a, t, zt, zeroed)))
    }
}

/// One member's cached tags. Each member has its own (the SBOD rule: nothing shared
/// between members in the I/O path), sharded by tag block.
pub struct MemberTags {
    shards: Vec<Mutex<HashMap<u64, Arc<TagBlock>>>>,
    /// Clean tag blocks each shard may keep.
    cap: usize,
    pub(crate) stats: CacheStats,
}

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
        let bytes = std::env::var("SBOD_TAG_CACHE")
            .ok()
            .and_then(|v| sbod_types::parse_size(&v).ok())
            .unwrap_or(DEFAULT_CACHE_BYTES);
        MemberTags::with_capacity(bytes)
    }
}

impl MemberTags {
    /// A cache holding about `bytes` of clean tag blocks.
    pub fn with_capacity(bytes: u64) -> MemberTags {
        let blocks = (bytes / TAG_BLOCK as u64).max(SHARDS as u64) as usize;
        MemberTags {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            cap: blocks.div_ceil(SHARDS),
            stats: CacheStats::default(),
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
                        Self::evict(&mut map, self.cap - 1, &self.stats);
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
                let buf = AlignedBuf::zeroed(TAG_BLOCK).into_shared();
                let off = layout.offset + idx * TAG_BLOCK as u64;
                dev::read_at(dev, off, buf.clone(), IoClass::Foreground).await?;
                // SAFETY: the read completed; this task is the buffer's only user.
                let s = unsafe { buf.as_slice() };
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
        match r {
            Ok(()) => Ok(b),
            Err(e) => {
                // Not cached: the next access reads again.
                let mut map = self.shard(idx).lock();
                if map.get(&idx).is_some_and(|x| Arc::ptr_eq(x, &b)) {
                    map.remove(&idx);
                }
                Err(e)
            }
        }
    }

    /// Drop clean, loaded blocks nobody holds, second-chance by their clock bit. Dirty
    /// blocks stay until written back (the next flush), so a shard may pass its share for
    /// a while under many writes.
    fn evict(map: &mut HashMap<u64, Arc<TagBlock>>, target: usize, stats: &CacheStats) {
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
    fn dirty_in(&self, from: u64, to: u64) -> bool {
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
        };
        let mut b = off / BLOCK;
        let end = (off + len).div_ceil(BLOCK);
        while b < end {
            let idx = b / TAGS_PER_BLOCK;
            let blk = self.block(dev, layout, idx).await?;
            let stop = end.min((idx + 1) * TAGS_PER_BLOCK);
            let mut alts = blk.alts.lock();
            for x in b..stop {
                let t = match &new {
                    NewTags::Data(d) => {
                        let at = ((x - off / BLOCK) * BLOCK) as usize;
                        tag(x, &d[at..at + BLOCK as usize])
                    }
                    NewTags::Zeros(_) => zero_tag(x),
                };
                let i = (x % TAGS_PER_BLOCK) as usize;
                let old = blk.tags[i].swap(t, Ordering::AcqRel);
                // Writes to a block are ordered by its stripe lock: one in flight at most
                // (more old tags only after writes that failed).
                alts.entry(i as u16).or_default().push(old);
            }
            blk.nalts.store(alts.len(), Ordering::Release);
            blk.gen.fetch_add(1, Ordering::AcqRel);
            blk.dirty.store(true, Ordering::Release);
            drop(alts);
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
                for x in lo..hi {
                    alts.remove(&((x % TAGS_PER_BLOCK) as u16));
                }
            }
            blk.nalts.store(alts.len(), Ordering::Release);
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
                let Some(old) = alts.remove(&(i as u16)) else {
                    continue;
                };
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
            blk.nalts.store(alts.len(), Ordering::Release);
            blk.gen.fetch_add(1, Ordering::AcqRel);
            blk.dirty.store(true, Ordering::Release);
        }
    }

    /// Write every changed tag block to the member (not durably: a flush follows).
    /// Returns how many were written.
    pub async fn write_back(
        &self,
        dev: &Arc<dyn BlockDev>,
        layout: &TagLayout,
    ) -> io::Result<usize> {
        let mut n = 0;
        for (idx, blk) in self.dirty_blocks() {
            // Cleared before the image is taken: a change after it marks it again.
            blk.dirty.store(false, Ordering::Release);
            let img = blk.image().into_shared();
            let off = layout.offset + idx * TAG_BLOCK as u64;
            if let Err(e) = dev::write_at(dev, off, img, false, IoClass::Foreground).await {
                blk.dirty.store(true, Ordering::Release);
                return Err(e);
            }
            self.stats.writebacks.fetch_add(1, Ordering::Relaxed);
            n += 1;
        }
        Ok(n)
    }
}

/// The tags a write sets, one per 4 KiB block of its range: computed from its data, or
/// those of zero blocks.
pub enum NewTags<'a> {
    Data(&'a [u8]),
    Zeros(u64),
}

/// A write's tags, set before it is issued; [`MemberTags::settle`] settles them.
#[must_use]
pub struct TagWrite {
    off: u64,
    len: u64,
}

impl Array {
    /// The tag region, if this array carries tags.
    pub fn tag_layout(&self) -> Option<TagLayout> {
        self.integrity
    }

    pub fn integrity(&self) -> Kind {
        match self.integrity {
            Some(_) => Kind::Crc32c,
            None => Kind::None,
        }
    }

    /// The tags of member data `[off, off+len)` of `m` as the cache (or the member) has them.
    pub async fn member_tags(&self, m: &Arc<Member>, off: u64, len: u64) -> io::Result<Vec<u32>> {
        match &self.integrity {
            Some(layout) => m.tags.get(&m.dev, layout, off, len).await,
            None => Ok(Vec::new()),
        }
    }

    /// Read member data and verify every block against its tag (the `mread` hook). A
    /// block that fails is read again while its tags keep changing (a write to it landed
    /// meanwhile); one that still fails is a [`Mismatch`].
    pub(crate) async fn read_verified(
        &self,
        m: &Arc<Member>,
        off: u64,
        buf: SharedBuf,
        class: IoClass,
    ) -> io::Result<()> {
        let Some(layout) = self.integrity else {
            return self.mread_raw(m, off, buf, class).await;
        };
        let blocks = m
            .tags
            .blocks(&m.dev, &layout, off, buf.len() as u64)
            .await?;
        let mut tries = 0;
        loop {
            let gens: Vec<u64> = blocks
                .iter()
                .map(|b| b.gen.load(Ordering::Acquire))
                .collect();
            self.mread_raw(m, off, buf.clone(), class).await?;
            // SAFETY: the read completed; the caller reads the buffer only after us.
            let data = unsafe { buf.as_slice() };
            let mut bad = MemberTags::mismatches(&blocks, layout.zeroed, off, data);
            if let (true, Some(bm)) = (self.read_only.load(Ordering::Acquire), &self.bitmap) {
                // Looked at or rescued after a crash: nothing resyncs the regions written
                // at the time, whose checksums may lag their data; those are not held
                // against it (the rest are).
                bad.retain(|&b| !bm.is_dirty(bm.region_of(b)));
            }
            if bad.is_empty() {
                return Ok(());
            }
            let moved = blocks
                .iter()
                .zip(&gens)
                .any(|(b, g)| b.gen.load(Ordering::Acquire) != *g);
            tries += 1;
            if !moved || tries >= REREADS {
                return Err(mismatch(bad));
            }
        }
    }

    /// Before a write (or zeroing) of member data `[off, off+len)` of `m`: its new tags
    /// (see [`MemberTags::set`]).
    pub(crate) async fn tags_begin_write(
        &self,
        m: &Arc<Member>,
        off: u64,
        new: NewTags<'_>,
    ) -> io::Result<Option<TagWrite>> {
        match &self.integrity {
            Some(layout) => m.tags.set(&m.dev, layout, off, new).await.map(Some),
            None => Ok(None),
        }
    }

    /// The write is done (see [`MemberTags::settle`]). One that failed on a member still
    /// in service (its file system full) is read back, and each block keeps the tag of
    /// what it holds (see [`MemberTags::resolve`]).
    pub(crate) async fn tags_end_write(&self, m: &Arc<Member>, w: Option<TagWrite>, ok: bool) {
        let Some(w) = w else {
            return;
        };
        let (off, len) = (w.off, w.len);
        m.tags.settle(w, ok);
        if ok || !self.in_service(m) {
            return;
        }
        let buf = AlignedBuf::for_overwrite(len as usize).into_shared();
        if self
            .mread_raw(m, off, buf.clone(), IoClass::Foreground)
            .await
            .is_ok()
        {
            // SAFETY: the read completed.
            let zeroed = self.integrity.is_some_and(|l| l.zeroed);
            m.tags.resolve(off, unsafe { buf.as_slice() }, zeroed);
        }
    }

    /// Set the tags of member data `[off, off+len)` from what it holds (`data`), with no
    /// write: a resync after a crash, which makes a dirty region consistent and its tags
    /// agree with it.
    pub(crate) async fn retag(&self, m: &Arc<Member>, off: u64, data: &[u8]) -> io::Result<()> {
        if let Some(w) = self.tags_begin_write(m, off, NewTags::Data(data)).await? {
            self.tags_end_write(m, Some(w), true).await;
        }
        Ok(())
    }

    /// The crash resync's hook: retag each member's chunk at `off` from what it holds
    /// (`bufs`) with the rows about to be rewritten (`rewrite`: member position, row
    /// offset, data) as they will be.
    pub(crate) async fn retag_resynced(
        &self,
        members: &[Arc<Member>],
        off: u64,
        bufs: &[SharedBuf],
        rewrite: &[(usize, u64, SharedBuf)],
    ) {
        for (i, (m, b)) in members.iter().zip(bufs).enumerate() {
            // SAFETY: the reads completed; the resync holds the stripe lock.
            let mut data = unsafe { b.as_slice() }.to_vec();
            for (_, row, fix) in rewrite.iter().filter(|(j, _, _)| *j == i) {
                let fix = unsafe { fix.as_slice() };
                data[*row as usize..*row as usize + fix.len()].copy_from_slice(fix);
            }
            if let Err(e) = self.retag(m, off, &data).await {
                self.note_read_error(m, &e).await;
            }
        }
    }

    /// For each member, which 4 KiB rows of `bufs` (its chunk at `off`, read as it is)
    /// match their checksums (none where its checksums cannot be read, or there are none).
    pub(crate) async fn rows_vouched(
        &self,
        members: &[Arc<Member>],
        off: u64,
        bufs: &[SharedBuf],
    ) -> Vec<Vec<bool>> {
        let Some(layout) = self.integrity else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (m, b) in members.iter().zip(bufs) {
            // SAFETY: the reads completed; the scrub holds the stripe lock.
            let data = unsafe { b.as_slice() };
            let rows = data.len() / BLOCK as usize;
            let v = match m.tags.check(&m.dev, &layout, off, data).await {
                Ok(bad) => (0..rows)
                    .map(|r| !bad.contains(&(off + r as u64 * BLOCK)))
                    .collect(),
                Err(_) => vec![false; rows],
            };
            out.push(v);
        }
        out
    }

    /// Retag member data `[off, off+len)` of each of `members` from what it holds (a
    /// resync that cannot make a stripe consistent, a member missing). A member that
    /// cannot be read is left to its read error.
    pub(crate) async fn retag_chunks(
        &self,
        members: impl Iterator<Item = &Arc<Member>>,
        off: u64,
        len: u64,
    ) {
        if self.integrity.is_none() {
            return;
        }
        for m in members {
            let buf = AlignedBuf::for_overwrite(len as usize).into_shared();
            let r = match self
                .mread_raw(m, off, buf.clone(), IoClass::Background)
                .await
            {
                // SAFETY: the read completed.
                Ok(()) => self.retag(m, off, unsafe { buf.as_slice() }).await,
                Err(e) => Err(e),
            };
            if let Err(e) = r {
                self.note_read_error(m, &e).await;
            }
        }
    }

    /// Write every changed tag block of every member in service (the `flush` hook: the
    /// flush that follows makes them durable with the data). A member that cannot take
    /// its tags is failed as for a bitmap write.
    pub(crate) async fn tags_write_back(&self) -> Result<()> {
        let Some(layout) = self.integrity else {
            return Ok(());
        };
        let st = self.state.load_full();
        let members = st.live_members();
        let futs = members
            .iter()
            .map(|m| async move { (m.clone(), m.tags.write_back(&m.dev, &layout).await) });
        let mut full = Vec::new();
        for (m, r) in futures::future::join_all(futs).await {
            if let Err(e) = r {
                if self.write_failed(&m, &e, crate::reason::TAG_WRITE).await
                    == crate::io::WriteFault::NoSpace
                {
                    full.push(m);
                }
            }
        }
        if let Some(why) = &self.state.load().failed {
            return Err(Error::Failed(why.clone()));
        }
        if !full.is_empty() {
            return Err(self.nospace_error(&full));
        }
        Ok(())
    }

    /// Has any member in service tags of bitmap region `r` not yet written back? (The
    /// sweeper keeps such a region dirty: its bit is cleared only once its tags are
    /// durable.)
    pub(crate) fn tags_dirty_in_region(&self, r: u64) -> bool {
        let (Some(_), Some(bm)) = (self.integrity, self.bitmap.as_ref()) else {
            return false;
        };
        let (from, to) = (r * bm.region, (r + 1) * bm.region);
        self.state
            .load()
            .live_members()
            .iter()
            .any(|m| m.tags.dirty_in(from, to))
    }

    /// A member returned data that failed its tags (the `note_read_error` hook). Counted as
    /// checksum errors, one per block; past `max_checksum_errors` the member is failed,
    /// where its group can do without it (without redundancy its reads answer EIO and it
    /// stays: failing it would fail the array and all the good data with it).
    pub(crate) async fn note_checksum_error(&self, m: &Arc<Member>, x: &Mismatch) {
        let n = x.blocks.len() as u64;
        let total = m.stats.checksum_errors.fetch_add(n, Ordering::Relaxed) + n;
        tracing::warn!(member = %m.path, blocks = n, total, "{x}");
        if let Some(s) = self.shrunk(m) {
            self.fail_member(m, s.why()).await;
            return;
        }
        let max = self.settings.lock().max_checksum_errors;
        if total > max && self.geometry.redundancy() > 0 {
            self.fail_member(m, crate::reason::checksums(total)).await;
        }
    }

    /// Vouch for data rebuilt from redundancy to replace member data `[off, off+len)` of
    /// `m` that could not be read or failed its tags (`as_read`: what `m` returned). Each
    /// block must match `m`'s tag (or have none); if it does not, but equals what `m`
    /// returned, the tag was the damaged part (the block is rewritten with a new tag).
    /// Otherwise the reconstruction is not known to be the data (parity from before a
    /// lost write, say): an error, never a guess.
    pub(crate) async fn tags_vouch(
        &self,
        m: &Arc<Member>,
        off: u64,
        rebuilt: &[u8],
        as_read: &[u8],
    ) -> Result<()> {
        let Some(layout) = self.integrity else {
            return Ok(());
        };
        let Ok(tags) = self.member_tags(m, off, rebuilt.len() as u64).await else {
            return Ok(()); // its tags cannot be read: nothing to hold the rebuild against
        };
        for (n, (t, blk)) in tags.iter().zip(rebuilt.chunks(BLOCK as usize)).enumerate() {
            let b = off / BLOCK + n as u64;
            let at = n * BLOCK as usize;
            if matches(*t, tag(b, blk), zero_tag(b), layout.zeroed)
                || as_read.get(at..at + blk.len()) == Some(blk)
            {
                continue;
            }
            return Err(Error::io(
                format!("reading {}", m.path),
                io::Error::other(format!(
                    "member offset {}: the data rebuilt from redundancy does not match its checksum either; not returned",
                    b * BLOCK
                )),
            ));
        }
        Ok(())
    }

    /// After a crash, retag bitmap regions of an array without redundancy (raid0,
    /// concat): the data there is what it is (a write in flight may or may not have
    /// landed, and none was flushed); its tags are made to agree.
    pub(crate) async fn retag_regions(&self, regions: &[u64]) -> Result<(u64, u64)> {
        let Some(bm) = self.bitmap.as_ref() else {
            return Ok((0, 0));
        };
        let st = self.state.load_full();
        let step = 1u64 << 20;
        let mut bytes = 0;
        for &r in regions {
            for m in st.live_members() {
                let (from, to) = (r * bm.region, ((r + 1) * bm.region).min(m.size));
                let mut off = from;
                while off < to {
                    let n = step.min(to - off);
                    let buf = AlignedBuf::for_overwrite(n as usize).into_shared();
                    if let Err(e) = self
                        .mread_raw(&m, off, buf.clone(), IoClass::Background)
                        .await
                    {
                        self.note_read_error(&m, &e).await;
                        return Err(Error::io(format!("reading {}", m.path), e));
                    }
                    // SAFETY: the read completed.
                    self.retag(&m, off, unsafe { buf.as_slice() })
                        .await
                        .map_err(|e| Error::io(format!("reading the tags of {}", m.path), e))?;
                    bytes += n;
                    off += n;
                }
            }
        }
        self.flush().await?;
        tracing::info!(array = %self.name, regions = regions.len(), bytes, "checksums of dirty regions recomputed after an unclean shutdown");
        Ok((bytes, regions.len() as u64))
    }

    /// Scrub an array without redundancy: read every block against its tag. Nothing can
    /// be repaired (there is no other copy); blocks that fail are counted, and reads of
    /// them answer EIO.
    pub(crate) async fn verify_pass(&self, h: &crate::process::ProcessHandle) -> Result<()> {
        let st = self.state.load_full();
        let step = self.geometry.chunk as u64 * 16;
        let mut done = 0;
        for m in st.live_members() {
            let mut off = 0;
            while off < m.size {
                if h.cancelled() || self.closing.load(Ordering::Acquire) {
                    return Err(Error::Busy("scrub stopped before it finished".into()));
                }
                let n = step.min(m.size - off);
                let buf = AlignedBuf::for_overwrite(n as usize).into_shared();
                // Block by block where a read fails, so each bad block is named.
                if self
                    .mread(&m, off, buf.clone(), IoClass::Background)
                    .await
                    .is_err()
                {
                    for b in (off..off + n).step_by(BLOCK as usize) {
                        let one = AlignedBuf::for_overwrite(BLOCK as usize).into_shared();
                        if let Err(e) = self.mread(&m, b, one, IoClass::Background).await {
                            self.note_read_error(&m, &e).await;
                            h.mismatches.fetch_add(1, Ordering::Relaxed);
                            let mut regions = h.regions.lock();
                            regions.push(sbod_types::MismatchRegion {
                                group: 0,
                                member_offset: b,
                                volume_offset: self.volume_offset_of(&m, b).unwrap_or(u64::MAX),
                                blocks: 1,
                            });
                        }
                    }
                }
                off += n;
                done += n;
                h.done.store(done, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    /// The volume offset of member data offset `off` of `m`, for arrays without
    /// redundancy (raid0, concat).
    fn volume_offset_of(&self, m: &Arc<Member>, off: u64) -> Option<u64> {
        let st = self.state.load();
        let slot = st
            .slots
            .iter()
            .position(|s| s.member.as_ref().is_some_and(|x| Arc::ptr_eq(x, m)))?;
        if self.geometry.level == crate::layout::Level::Concat {
            return Some(self.concat_starts[slot] + off);
        }
        let chunk = self.geometry.chunk as u64;
        let w = self.geometry.width as u64;
        let t = off / chunk;
        Some((t * w + slot as u64) * chunk + off % chunk)
    }

    /// The scrub's hook (`check_stripe`): rebuild the rows of stripe `t` that failed their
    /// checksums (`bad`: member position, row offsets in the chunk), row by row from the
    /// other members' rows, into `bufs`: a chunk with one bad block keeps its other rows,
    /// so bad blocks on several members are healed as long as no row has more than the
    /// group survives. Returns the rows to rewrite (member position, row offset, data).
    pub(crate) fn heal_rows(
        &self,
        t: u64,
        bufs: &[SharedBuf],
        unreadable: &[usize],
        bad: &[(usize, Vec<u64>)],
    ) -> Result<Vec<(usize, u64, SharedBuf)>> {
        let mut rows: Vec<u64> = bad.iter().flat_map(|(_, r)| r.iter().copied()).collect();
        rows.sort_unstable();
        rows.dedup();
        let w = self.geometry.width as usize;
        let mut out = Vec::new();
        for r in rows {
            let lost: Vec<usize> = (0..w)
                .filter(|i| {
                    unreadable.contains(i) || bad.iter().any(|(p, rs)| p == i && rs.contains(&r))
                })
                .collect();
            if lost.len() > self.geometry.redundancy() {
                return Err(Error::Failed(format!(
                    "stripe {t}, row at {r}: {} of {w} members unreadable or failing their checksums",
                    lost.len()
                )));
            }
            let healed: Vec<usize> = lost
                .iter()
                .copied()
                .filter(|i| !unreadable.contains(i))
                .collect();
            match self.geometry.scheme() {
                crate::layout::Scheme::Mirror { .. } => {
                    let good = (0..w).find(|i| !lost.contains(i)).expect("a good copy");
                    let src = row_of(&bufs[good], r).to_vec();
                    for &i in &healed {
                        row_of(&bufs[i], r).copy_from_slice(&src);
                    }
                }
                _ => {
                    let codec = self.codec.as_ref().expect("parity codec");
                    let n = w;
                    let pos = |s: usize| self.geometry.member_of_shard(t, s);
                    let mut work: Vec<Vec<u8>> =
                        (0..n).map(|s| row_of(&bufs[pos(s)], r).to_vec()).collect();
                    let present: Vec<bool> = (0..n).map(|s| !lost.contains(&pos(s))).collect();
                    let mut refs: Vec<&mut [u8]> =
                        work.iter_mut().map(|v| v.as_mut_slice()).collect();
                    codec
                        .reconstruct(&mut refs, &present)
                        .map_err(|e| Error::Failed(e.to_string()))?;
                    for s in 0..n {
                        if healed.contains(&pos(s)) {
                            row_of(&bufs[pos(s)], r).copy_from_slice(&work[s]);
                        }
                    }
                }
            }
            for &i in &healed {
                let fix = AlignedBuf::from_slice(row_of(&bufs[i], r)).into_shared();
                out.push((i, r, fix));
            }
        }
        Ok(out)
    }

    /// Enter the bitmap regions of member data `[off, off+len)` for a write to an array
    /// without redundancy, whose bitmap (present only with checksums) covers its tags
    /// across a crash. Redundant layouts enter their region themselves.
    pub(crate) async fn enter_regions(
        &self,
        off: u64,
        len: u64,
    ) -> Result<Vec<crate::io::RegionGuard<'_>>> {
        let Some(bm) = self.bitmap.as_ref() else {
            return Ok(Vec::new());
        };
        if self.geometry.redundancy() > 0 || len == 0 {
            return Ok(Vec::new());
        }
        let mut v = Vec::new();
        for r in bm.region_of(off)..=bm.region_of(off + len - 1) {
            v.push(self.enter_region(r * bm.region).await?);
        }
        Ok(v)
    }
}

/// Row `r` (a 4 KiB block at offset `r`) of a chunk buffer.
#[allow(clippy::mut_from_ref)]
fn row_of(b: &SharedBuf, r: u64) -> &mut [u8] {
    // SAFETY: the reads completed; the scrub holds the stripe lock and is the buffers'
    // only user, one row at a time.
    let all = unsafe { b.as_mut_slice() };
    &mut all[r as usize..(r + BLOCK) as usize]
}

#[cfg(test)]
mod tests;
