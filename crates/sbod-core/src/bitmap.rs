//! The write-intent bitmap's in-memory side.
//!
//! One bit per region of member space (the same offsets on every member). Before any
//! write touches a region its bit is made durable on every member; regions idle for a
//! sweep interval are flushed and cleared lazily. After a crash only regions whose bit is
//! set need their parity (or mirror copies) made consistent again.
//!
//! Fast path: a writer increments the region's in-flight count and sees the region DIRTY:
//! two atomics, no lock. The clearer marks a region CLEARING before it looks at the
//! in-flight count; a writer that sees CLEARING (or CLEAN) takes the slow path, which
//! serialises with the clearer on the bitmap block's mutex. Both sides use SeqCst, so
//! either the writer sees CLEARING or the clearer sees the writer (Dekker).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, AtomicUsize, Ordering::SeqCst};

pub const CLEAN: u8 = 0;
pub const DIRTY: u8 = 1;
pub const CLEARING: u8 = 2;

/// Bytes of bitmap per on-disk block (the unit written).
pub const BLOCK: usize = 4096;
pub const BITS_PER_BLOCK: u64 = (BLOCK * 8) as u64;

/// Regions set dirty ahead of a writer moving forward at most ([`Bitmap::ahead_locked`];
/// how much member space: `SBOD_BITMAP_AHEAD`).
pub const AHEAD_MAX: u64 = 16;

/// Regions of `region` bytes [`Bitmap::ahead_locked`] sets ahead of a writer moving forward
/// in this process (`SBOD_BITMAP_AHEAD`): what a crash may resync past the regions written.
pub fn ahead_regions(region: u64) -> u64 {
    match crate::tuning::bitmap_ahead_bytes() {
        0 => 0,
        bytes => (bytes / region.max(1)).clamp(1, AHEAD_MAX),
    }
}

pub struct Bitmap {
    pub region: u64,
    pub regions: u64,
    /// Regions [`Bitmap::ahead_locked`] sets ahead of a writer moving forward (0: none).
    ahead: u64,
    state: Vec<AtomicU8>,
    inflight: Vec<AtomicU32>,
    touched: Vec<AtomicBool>,
    /// On-disk image of each block, guarded by its mutex (the slow path's lock).
    pub blocks: Vec<tokio::sync::Mutex<Vec<u8>>>,
    /// Regions that must stay dirty whatever the sweeper sees (stripes left inconsistent).
    pinned: Vec<AtomicU32>,
    /// Stripes (group, stripe) a write left inconsistent, with their region: it reached
    /// some members and not others (out of space). Resynced once writes succeed again;
    /// their regions stay pinned dirty until then, so a crash resyncs them too.
    unsynced: parking_lot::Mutex<BTreeMap<(usize, u64), u64>>,
    unsynced_count: AtomicUsize,
}

impl Bitmap {
    pub fn new(region: u64, member_size: u64, dirty: &[u64]) -> Bitmap {
        let regions = member_size.div_ceil(region).max(1);
        let nblocks = regions.div_ceil(BITS_PER_BLOCK) as usize;
        let ahead = ahead_regions(region);
        let b = Bitmap {
            region,
            regions,
            ahead,
            state: (0..regions).map(|_| AtomicU8::new(CLEAN)).collect(),
            inflight: (0..regions).map(|_| AtomicU32::new(0)).collect(),
            touched: (0..regions).map(|_| AtomicBool::new(false)).collect(),
            blocks: (0..nblocks)
                .map(|_| tokio::sync::Mutex::new(vec![0u8; BLOCK]))
                .collect(),
            pinned: (0..regions).map(|_| AtomicU32::new(0)).collect(),
            unsynced: parking_lot::Mutex::new(BTreeMap::new()),
            unsynced_count: AtomicUsize::new(0),
        };
        for &r in dirty {
            if r < regions {
                b.state[r as usize].store(DIRTY, SeqCst);
                let mut blk = b.blocks[(r / BITS_PER_BLOCK) as usize]
                    .try_lock()
                    .expect("new bitmap");
                let bit = r % BITS_PER_BLOCK;
                blk[(bit / 8) as usize] |= 1 << (bit % 8);
            }
        }
        b
    }

    /// Bytes the bitmap takes on disk.
    pub fn bytes_for(regions: u64) -> u64 {
        regions.div_ceil(BITS_PER_BLOCK).max(1) * BLOCK as u64
    }

    pub fn region_of(&self, member_offset: u64) -> u64 {
        member_offset / self.region
    }

    /// Fast path: returns true if the region is already durable-dirty and the caller now
    /// counts as in flight. On false the caller is NOT counted and must use the slow path.
    pub fn try_enter(&self, r: u64) -> bool {
        let i = r as usize;
        self.inflight[i].fetch_add(1, SeqCst);
        self.touched[i].store(true, std::sync::atomic::Ordering::Relaxed);
        if self.state[i].load(SeqCst) == DIRTY {
            return true;
        }
        self.inflight[i].fetch_sub(1, SeqCst);
        false
    }

    /// Slow path, with the block's mutex held by the caller: count in, and say whether the
    /// bit must be written before the write may proceed.
    pub fn enter_locked(&self, r: u64, image: &mut [u8]) -> bool {
        let i = r as usize;
        self.inflight[i].fetch_add(1, SeqCst);
        self.touched[i].store(true, std::sync::atomic::Ordering::Relaxed);
        if self.state[i].load(SeqCst) == DIRTY {
            return false;
        }
        let bit = r % BITS_PER_BLOCK;
        image[(bit / 8) as usize] |= 1 << (bit % 8);
        true
    }

    /// With the block's mutex held, as `r`'s bit is about to be written: where the region
    /// before `r` is dirty (a writer moving forward, as a sequential one does), set the bits
    /// of the clean regions after it too, up to `SBOD_BITMAP_AHEAD` of member space (at least
    /// one region, at most [`AHEAD_MAX`]; none with `SBOD_BITMAP_AHEAD=0`) and within this
    /// block, so they go to the members in the same write.
    /// Returns them, for [`Bitmap::set_dirty`] once that write is durable.
    ///
    /// Why: the first write to a clean region waits for its bit's FUA write on every
    /// member, a seek to the bitmap and back on a disk. One per region made a sequential
    /// writer on rotating members wait once per region: with the 1 MiB regions of a 1 GiB
    /// member, 2.9 times slower than with 64 MiB ones (docs/PERFORMANCE.md, "The
    /// write-intent bitmap ahead of a writer"). A crash now resyncs at most that much more
    /// of each stream's member space. They count as touched, so the sweeper leaves
    /// them for one sweep before it clears those the writer did not reach.
    ///
    /// Regions in CLEARING exist only under the block's mutex, so here each is CLEAN or
    /// DIRTY.
    pub fn ahead_locked(&self, r: u64, image: &mut [u8]) -> Vec<u64> {
        if self.ahead == 0 || r == 0 || self.state[r as usize - 1].load(SeqCst) != DIRTY {
            return Vec::new();
        }
        let n = self.ahead;
        let block_end = (r / BITS_PER_BLOCK + 1) * BITS_PER_BLOCK;
        let end = (r + 1 + n).min(self.regions).min(block_end);
        let mut out = Vec::new();
        for a in r + 1..end {
            if self.state[a as usize].load(SeqCst) != CLEAN {
                continue;
            }
            self.touched[a as usize].store(true, SeqCst);
            let bit = a % BITS_PER_BLOCK;
            image[(bit / 8) as usize] |= 1 << (bit % 8);
            out.push(a);
        }
        out
    }

    /// After the block holding `r` is durable: mark it dirty in memory.
    pub fn set_dirty(&self, r: u64) {
        self.state[r as usize].store(DIRTY, SeqCst);
    }

    pub fn leave(&self, r: u64) {
        self.inflight[r as usize].fetch_sub(1, SeqCst);
    }

    /// Regions that have been dirty and idle since the previous sweep.
    pub fn idle_candidates(&self) -> Vec<u64> {
        let mut out = Vec::new();
        for i in 0..self.regions as usize {
            if self.state[i].load(SeqCst) == DIRTY && self.pinned[i].load(SeqCst) == 0 {
                let touched = self.touched[i].swap(false, SeqCst);
                if !touched && self.inflight[i].load(SeqCst) == 0 {
                    out.push(i as u64);
                }
            }
        }
        out
    }

    /// With the block's mutex held: try to start clearing `r`. False if a writer came in.
    pub fn begin_clear(&self, r: u64, image: &mut [u8]) -> bool {
        let i = r as usize;
        if self.state[i].load(SeqCst) != DIRTY || self.pinned[i].load(SeqCst) != 0 {
            return false;
        }
        self.state[i].store(CLEARING, SeqCst);
        if self.inflight[i].load(SeqCst) != 0 {
            self.state[i].store(DIRTY, SeqCst);
            return false;
        }
        let bit = r % BITS_PER_BLOCK;
        image[(bit / 8) as usize] &= !(1 << (bit % 8));
        true
    }

    /// With the block's mutex held, after `begin_clear`: keep `r` dirty after all.
    pub fn abort_clear(&self, r: u64, image: &mut [u8]) {
        let bit = r % BITS_PER_BLOCK;
        image[(bit / 8) as usize] |= 1 << (bit % 8);
        self.state[r as usize].store(DIRTY, SeqCst);
    }

    /// The cleared bit is durable.
    pub fn finish_clear(&self, r: u64) {
        self.state[r as usize].store(CLEAN, SeqCst);
    }

    /// Is the region's bit set (or being cleared)?
    pub fn is_dirty(&self, r: u64) -> bool {
        self.state
            .get(r as usize)
            .is_some_and(|s| s.load(SeqCst) != CLEAN)
    }

    /// Regions whose bit is set.
    pub fn dirty_regions(&self) -> Vec<u64> {
        (0..self.regions).filter(|&r| self.is_dirty(r)).collect()
    }

    pub fn dirty_count(&self) -> u64 {
        self.state
            .iter()
            .filter(|s| s.load(SeqCst) != CLEAN)
            .count() as u64
    }

    /// Record a stripe a write left inconsistent, by its group and the member offset its
    /// row starts at (not its row number: during a reshape to a new chunk the two layouts
    /// number rows differently, their member offsets are the same), in region `r` (which
    /// the write entered, so it is dirty on disk): the region is pinned dirty until
    /// [`Bitmap::synced`].
    pub fn unsynced(&self, group: usize, moff: u64, r: u64) {
        let mut u = self.unsynced.lock();
        if u.insert((group, moff), r).is_none() {
            self.pinned[r as usize].fetch_add(1, SeqCst);
            self.unsynced_count.fetch_add(1, SeqCst);
        }
    }

    /// Is a stripe of `group` whose row starts in `[moff, moff + len)` inconsistent? (One
    /// atomic load while none is.)
    pub fn is_unsynced(&self, group: usize, moff: u64, len: u64) -> bool {
        self.unsynced_count.load(SeqCst) != 0
            && self
                .unsynced
                .lock()
                .range((group, moff)..(group, moff + len))
                .next()
                .is_some()
    }

    /// The stripes of `group` whose rows start in `[moff, moff + len)` are consistent
    /// again: unpin their regions.
    pub fn synced(&self, group: usize, moff: u64, len: u64) {
        if self.unsynced_count.load(SeqCst) == 0 {
            return;
        }
        let mut u = self.unsynced.lock();
        let keys: Vec<(usize, u64)> = u
            .range((group, moff)..(group, moff + len))
            .map(|(k, _)| *k)
            .collect();
        for k in keys {
            if let Some(r) = u.remove(&k) {
                self.pinned[r as usize].fetch_sub(1, SeqCst);
                self.unsynced_count.fetch_sub(1, SeqCst);
            }
        }
    }

    /// The inconsistent stripes, in order: (group, member offset of the row).
    pub fn unsynced_stripes(&self) -> Vec<(usize, u64)> {
        if self.unsynced_count.load(SeqCst) == 0 {
            return Vec::new();
        }
        self.unsynced.lock().keys().copied().collect()
    }

    /// Regions whose bit is set in an on-disk image.
    pub fn set_bits(image: &[u8], regions: u64) -> Vec<u64> {
        (0..regions.min(image.len() as u64 * 8))
            .filter(|&r| image[(r / 8) as usize] & (1 << (r % 8)) != 0)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enter_clear_protocol() {
        let b = Bitmap::new(1 << 20, 10 << 20, &[]);
        assert!(!b.try_enter(3), "clean region needs the slow path");
        let mut img = vec![0u8; BLOCK];
        assert!(
            b.enter_locked(3, &mut img),
            "first writer must persist the bit"
        );
        assert_eq!(img[0], 1 << 3);
        b.set_dirty(3);
        assert!(b.try_enter(3));
        // Two writers in flight: cannot clear.
        assert!(!b.begin_clear(3, &mut img));
        b.leave(3);
        b.leave(3);
        // Touched since the last sweep: not a candidate yet; next sweep it is.
        assert!(b.idle_candidates().is_empty());
        assert_eq!(b.idle_candidates(), vec![3]);
        assert!(b.begin_clear(3, &mut img));
        assert_eq!(img[0], 0);
        // A writer arriving mid-clear goes to the slow path.
        assert!(!b.try_enter(3));
        b.finish_clear(3);
        assert_eq!(b.dirty_count(), 0);
    }

    #[test]
    fn a_writer_moving_forward_sets_the_regions_ahead_in_the_same_write() {
        // 1 MiB regions: SBOD_BITMAP_AHEAD's worth of them (AHEAD_MAX at most) go with
        // the bit.
        let b = Bitmap::new(1 << 20, 64 << 20, &[]);
        let n = (crate::tuning::BITMAP_AHEAD_DEFAULT >> 20).min(AHEAD_MAX);
        let mut img = vec![0u8; BLOCK];
        // A region whose predecessor is clean: a writer that did not come from there.
        assert!(b.enter_locked(5, &mut img));
        assert!(b.ahead_locked(5, &mut img).is_empty());
        assert_eq!(img[0], 1 << 5);
        b.set_dirty(5);
        b.leave(5);
        // Region 6 after dirty 5: 7.. set too, in the image the write takes.
        assert!(b.enter_locked(6, &mut img));
        let ahead = b.ahead_locked(6, &mut img);
        assert_eq!(ahead, (7..7 + n).collect::<Vec<_>>());
        for &a in &ahead {
            assert!(img[(a / 8) as usize] & (1 << (a % 8)) != 0, "bit {a}");
            assert!(!b.is_dirty(a), "dirty in memory only once durable");
        }
        b.set_dirty(6);
        for &a in &ahead {
            b.set_dirty(a);
        }
        b.leave(6);
        // The writer reaches them on the fast path.
        assert!(b.try_enter(7));
        b.leave(7);
        // Not reached yet: left for one sweep, cleared at the next (5 and 6 and 7 with them).
        let first = b.idle_candidates();
        assert!(!first.contains(&8), "{first:?}");
        assert!(b.idle_candidates().contains(&8));
        // Never past the bitmap's end, and dirty regions are not returned again.
        let b = Bitmap::new(1 << 20, 4 << 20, &[0, 2]);
        let mut img = vec![0u8; BLOCK];
        assert!(b.enter_locked(1, &mut img));
        assert_eq!(b.ahead_locked(1, &mut img), vec![3]);
        // Large regions: one ahead.
        let b = Bitmap::new(128 << 20, 4 << 30, &[0]);
        let mut img = vec![0u8; BLOCK];
        assert!(b.enter_locked(1, &mut img));
        assert_eq!(b.ahead_locked(1, &mut img), vec![2]);
    }

    #[test]
    fn an_unsynced_stripe_pins_its_region_dirty() {
        let b = Bitmap::new(1 << 20, 10 << 20, &[2]);
        let mut img = vec![0u8; BLOCK];
        b.unsynced(0, 40, 2);
        b.unsynced(0, 40, 2); // once only
        b.unsynced(1, 41, 2);
        assert!(b.is_unsynced(0, 40, 1) && !b.is_unsynced(0, 39, 1));
        // A row of another chunk size that covers it.
        assert!(b.is_unsynced(0, 32, 16) && !b.is_unsynced(0, 0, 40));
        assert!(b.idle_candidates().is_empty());
        assert!(
            b.idle_candidates().is_empty(),
            "a pinned region is never a candidate"
        );
        assert!(!b.begin_clear(2, &mut img));
        b.synced(0, 40, 1);
        assert!(
            !b.begin_clear(2, &mut img),
            "still pinned by the other stripe"
        );
        assert_eq!(b.unsynced_stripes(), vec![(1, 41)]);
        b.synced(1, 32, 16);
        b.synced(1, 41, 1);
        assert_eq!(b.idle_candidates(), vec![2]);
        assert!(b.begin_clear(2, &mut img));
    }
}
