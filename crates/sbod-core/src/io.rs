//! The data path: reads, writes, flush, zeroing.
//!
//! Plans per stripe: a full-stripe write computes parity from the new data alone; a
//! partial one reads whichever is less, old data plus old parity (read-modify-write) or
//! the untouched data (reconstruct-write); a stripe with a missing member falls back to
//! reading what survives, reconstructing, and re-encoding. Reads of a missing chunk
//! reconstruct it under the stripe lock, and a read error that redundancy can fix is
//! repaired by rewriting the range on the member that failed to read it.

use crate::array::{Array, Member, State};
use crate::buf::{AlignedBuf, SharedBuf};
use crate::dev::{self, IoClass, IoKind, IoReq};
use crate::error::{Error, Result};
use crate::layout::{ChunkPiece, Scheme};
use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Counts a write in flight in a bitmap region; leaves it on drop.
pub(crate) struct RegionGuard<'a> {
    array: &'a Array,
    region: Option<u64>,
}

impl Drop for RegionGuard<'_> {
    fn drop(&mut self) {
        if let (Some(r), Some(bm)) = (self.region, self.array.bitmap.as_ref()) {
            bm.leave(r);
        }
    }
}

/// A contiguous run of one member for layouts without redundancy.
struct Direct {
    slot: usize,
    lock_key: usize,
    moff: u64,
    buf_off: u64,
    len: u64,
}

/// A piece of new data destined for one data chunk of a stripe.
#[derive(Clone)]
pub(crate) struct NewData {
    pub index: usize,
    pub chunk_off: u64,
    pub src: SharedBuf,
}

/// A member found smaller than the data the array keeps on it.
#[derive(Debug)]
pub(crate) struct Shrank {
    /// Its size when opened, now, and what the array needs (data offset + data).
    pub from: u64,
    pub to: u64,
    pub need: u64,
}

impl std::fmt::Display for Shrank {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.why())
    }
}

impl std::error::Error for Shrank {}

impl Shrank {
    pub fn why(&self) -> crate::reason::Why {
        crate::reason::shrank(self.from, self.to, self.need)
    }
}

fn shrank_of(e: &io::Error) -> Option<&Shrank> {
    e.get_ref().and_then(|x| x.downcast_ref::<Shrank>())
}

/// Out of space on the member's file system: not a failure of the member.
pub(crate) fn is_nospace(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
}

/// What a failed member write means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WriteFault {
    /// Its file system is full: the member stays in service.
    NoSpace,
    /// The member was taken out of service.
    Failed,
}

/// Check a member file's size around each write (see `mwrite`). Only the benchmark of its
/// cost (scripts/bench-size-check.sh, docs/PERFORMANCE.md) builds without it.
const CHECK_SIZE_AFTER_WRITES: bool = !cfg!(feature = "bench-no-size-check");

/// The unit of a byte-granular write's merge: the block size the volume is written in.
const BLOCK: u64 = 4096;

/// A 4 KiB block a byte-granular write covers in part: bytes `new` of it are the caller's,
/// the rest keep what the volume holds, read under the stripe lock (see `write_bytes`).
#[derive(Clone, Debug)]
pub(crate) struct Patch {
    /// Where the block starts in the piece's buffer.
    pub at: usize,
    pub new: std::ops::Range<usize>,
}

impl Patch {
    /// Fill the bytes of the block in `buf` that the write does not cover from `old`.
    fn merge(&self, buf: &SharedBuf, old: &SharedBuf) {
        let blk = &mut slice_mut(buf)[self.at..self.at + BLOCK as usize];
        let old = slice_of(old);
        blk[..self.new.start].copy_from_slice(&old[..self.new.start]);
        blk[self.new.end..].copy_from_slice(&old[self.new.end..]);
    }
}

/// Run writes to several stripes to the end, then give the first error. Never stop at the
/// first error (as `try_join_all` does, dropping the others mid-flight): a stripe write
/// dropped between its member writes would leave data and parity disagreeing, unrecorded.
async fn all_done<F: std::future::Future<Output = Result<()>>>(
    futs: impl IntoIterator<Item = F>,
) -> Result<()> {
    futures::future::join_all(futs)
        .await
        .into_iter()
        .collect::<Result<Vec<()>>>()
        .map(|_| ())
}

/// What became of a set of member writes.
#[derive(Default)]
struct Written {
    any_failed: bool,
    /// Members whose file system was full, and a member offset one of them refused.
    full: Vec<Arc<Member>>,
    region: Option<u64>,
}

/// One member write of a plan.
struct Target {
    member: Arc<Member>,
    offset: u64,
    buf: SharedBuf,
}

fn slice_of(b: &SharedBuf) -> &[u8] {
    // SAFETY: plan buffers are only read after the I/O that filled them completed, and no
    // I/O writes them while the codec runs.
    unsafe { b.as_slice() }
}

#[allow(clippy::mut_from_ref)]
fn slice_mut(b: &SharedBuf) -> &mut [u8] {
    // SAFETY: as above; each plan buffer has one user at a time.
    unsafe { b.as_mut_slice() }
}

impl Array {
    pub(crate) fn check_io(&self, offset: u64, len: u64) -> Result<Arc<State>> {
        if self.closing.load(Ordering::Acquire) {
            return Err(Error::ShutDown);
        }
        if !offset.is_multiple_of(4096) || !len.is_multiple_of(4096) {
            return Err(Error::Invalid(format!(
                "offset {offset} and length {len} must be multiples of 4096"
            )));
        }
        if offset.checked_add(len).is_none_or(|end| end > self.size) {
            return Err(Error::Invalid(format!(
                "range {offset}+{len} is beyond the end of the volume ({} bytes)",
                self.size
            )));
        }
        let st = self.state.load_full();
        if let Some(why) = &st.failed {
            return Err(Error::Failed(why.clone()));
        }
        Ok(st)
    }

    fn member_off(&self, off: u64) -> u64 {
        self.geometry.data_offset + off
    }

    pub(crate) async fn mread(
        &self,
        m: &Arc<Member>,
        off: u64,
        buf: SharedBuf,
        class: IoClass,
    ) -> io::Result<()> {
        m.stats.reads.fetch_add(1, Ordering::Relaxed);
        m.stats
            .read_bytes
            .fetch_add(buf.len() as u64, Ordering::Relaxed);
        if class == IoClass::Foreground {
            m.stats.fg_ops.fetch_add(1, Ordering::Relaxed);
        }
        dev::read_at(&m.dev, self.member_off(off), buf, class).await
    }

    /// Write to a member. A member file can be truncated under the array, and a write past
    /// its new end grows it back with a hole of zeros before the written bytes; so after
    /// every write to a file the member's size is checked before the write counts as done
    /// (and before a write to its last block, which would grow it back whole and hide the
    /// cut): a shrunk member's write returns a [`Shrank`] error, which fails it.
    pub(crate) async fn mwrite(
        &self,
        m: &Arc<Member>,
        off: u64,
        buf: SharedBuf,
        fua: bool,
        class: IoClass,
    ) -> io::Result<()> {
        m.stats.writes.fetch_add(1, Ordering::Relaxed);
        let len = buf.len() as u64;
        m.stats.write_bytes.fetch_add(len, Ordering::Relaxed);
        if class == IoClass::Foreground {
            m.stats.fg_ops.fetch_add(1, Ordering::Relaxed);
        }
        let check = m.is_file && CHECK_SIZE_AFTER_WRITES;
        if check && off + len >= m.size {
            self.check_size(m)?;
        }
        dev::write_at(&m.dev, self.member_off(off), buf, fua, class).await?;
        if check {
            self.check_size(m)?;
        }
        Ok(())
    }

    /// A write that must not grow the member (a repair, a resync): checks its size first.
    pub(crate) async fn mwrite_in_place(
        &self,
        m: &Arc<Member>,
        off: u64,
        buf: SharedBuf,
        class: IoClass,
    ) -> io::Result<()> {
        self.check_size(m)?;
        self.mwrite(m, off, buf, false, class).await
    }

    /// Has the member shrunk below the data the array keeps on it? (A device that cannot
    /// say, a vanished one, is judged by its I/O errors instead.)
    pub(crate) fn shrunk(&self, m: &Member) -> Option<Shrank> {
        let need = self.geometry.data_offset + m.size;
        match m.dev.current_size() {
            Ok(now) if now < need => Some(Shrank {
                from: m.dev.size(),
                to: now,
                need,
            }),
            _ => None,
        }
    }

    fn check_size(&self, m: &Member) -> io::Result<()> {
        match self.shrunk(m) {
            Some(s) => Err(io::Error::other(s)),
            None => Ok(()),
        }
    }

    /// A member failed to read. A member that shrank, or that came back short (EOF inside
    /// its data), is failed at once: it lies about its size, and what it would return past
    /// the cut is not the array's data. Other errors are counted, and fail the member once
    /// they persist.
    pub(crate) async fn note_read_error(&self, m: &Arc<Member>, e: &io::Error) {
        let n = m.stats.read_errors.fetch_add(1, Ordering::Relaxed) + 1;
        tracing::warn!(member = %m.path, error = %e, count = n, "read error");
        if let Some(s) = self.shrunk(m) {
            self.fail_member(m, s.why()).await;
            return;
        }
        if dev::is_unreachable(e) {
            self.fail_member(m, crate::reason::UNREACHABLE).await;
            return;
        }
        if e.kind() == io::ErrorKind::UnexpectedEof {
            self.fail_member(m, crate::reason::SHORT_READ).await;
            return;
        }
        let max = self.settings.lock().max_read_errors;
        if n > max {
            self.fail_member(m, crate::reason::READ_ERRORS).await;
        }
    }

    /// A member write failed: decide what it means (the one place that does). A member
    /// that shrank is failed at once (a shrunk block device also answers ENOSPC past its
    /// end, so size is asked first); out of space (ENOSPC, EDQUOT) is not a failure of the
    /// member, which stays in service (counted); anything else fails it with `why`.
    pub(crate) async fn write_failed(
        &self,
        m: &Arc<Member>,
        e: &io::Error,
        why: crate::reason::Why,
    ) -> WriteFault {
        if let Some(s) = shrank_of(e) {
            self.fail_member(m, s.why()).await;
            return WriteFault::Failed;
        }
        if let Some(s) = self.shrunk(m) {
            self.fail_member(m, s.why()).await;
            return WriteFault::Failed;
        }
        if dev::is_unreachable(e) {
            m.stats.write_errors.fetch_add(1, Ordering::Relaxed);
            tracing::error!(member = %m.path, error = %e, "member unreachable");
            self.fail_member(m, crate::reason::UNREACHABLE).await;
            return WriteFault::Failed;
        }
        if is_nospace(e) {
            let n = m.stats.nospace.fetch_add(1, Ordering::Relaxed);
            if n.is_power_of_two() || n == 0 {
                tracing::warn!(member = %m.path, error = %e, count = n + 1, "out of space: the write is refused, the member stays in service");
            }
            return WriteFault::NoSpace;
        }
        m.stats.write_errors.fetch_add(1, Ordering::Relaxed);
        tracing::error!(member = %m.path, error = %e, "{why}");
        self.fail_member(m, why).await;
        WriteFault::Failed
    }

    pub(crate) fn nospace_error(&self, m: &[Arc<Member>]) -> Error {
        let who: Vec<&str> = m.iter().map(|m| m.path.as_str()).collect();
        Error::NoSpace(format!(
            "'{}': no space left on the file system of {}: the write did not complete (no member was failed); free space there, or give the members their space with --preallocate, and write again",
            self.name,
            who.join(", ")
        ))
    }

    /// Write to every target concurrently. Members that fail are failed (the write still
    /// succeeds while the array holds the data); members whose file system is full are
    /// not, but the write then fails with [`Error::NoSpace`], and the stripe `key` (group,
    /// stripe), which it may have reached on some members only, is recorded as
    /// inconsistent until resynced.
    async fn write_targets(
        &self,
        targets: Vec<Target>,
        fua: bool,
        class: IoClass,
        key: Option<(usize, u64)>,
    ) -> Result<()> {
        let out = self.write_each(targets, fua, class).await;
        self.judge_writes(&out, key)
    }

    /// The outcome of writes to targets: an error if the array failed, or NoSpace (after
    /// recording the stripe `key` as inconsistent) if a member was out of space.
    fn judge_writes(&self, out: &Written, key: Option<(usize, u64)>) -> Result<()> {
        if !out.any_failed {
            return Ok(());
        }
        if let Some(why) = &self.state.load().failed {
            return Err(Error::Failed(why.clone()));
        }
        if let Some(off) = out.region {
            if let (Some((g, t)), Some(bm)) = (key, self.bitmap.as_ref()) {
                bm.unsynced(g, t, bm.region_of(off));
            }
            return Err(self.nospace_error(&out.full));
        }
        Ok(())
    }

    /// Write to every target concurrently and judge each failure (see `write_failed`).
    async fn write_each(&self, targets: Vec<Target>, fua: bool, class: IoClass) -> Written {
        let futs = targets.into_iter().map(|t| async move {
            let r = self.mwrite(&t.member, t.offset, t.buf, fua, class).await;
            (t.member, t.offset, r)
        });
        let mut out = Written::default();
        for (m, off, r) in futures::future::join_all(futs).await {
            if let Err(e) = r {
                out.any_failed = true;
                if self.write_failed(&m, &e, crate::reason::WRITE_ERROR).await
                    == WriteFault::NoSpace
                {
                    out.region = Some(off);
                    if !out.full.iter().any(|x| Arc::ptr_eq(x, &m)) {
                        out.full.push(m);
                    }
                }
            }
        }
        out
    }

    /// Mark the bitmap region of member offset `off` dirty (durably) before writing it.
    pub(crate) async fn enter_region(&self, off: u64) -> Result<RegionGuard<'_>> {
        let Some(bm) = self.bitmap.as_ref() else {
            return Ok(RegionGuard {
                array: self,
                region: None,
            });
        };
        let r = bm.region_of(off);
        if bm.try_enter(r) {
            return Ok(RegionGuard {
                array: self,
                region: Some(r),
            });
        }
        let blk = (r / crate::bitmap::BITS_PER_BLOCK) as usize;
        let mut img = bm.blocks[blk].lock().await;
        let guard = RegionGuard {
            array: self,
            region: Some(r),
        };
        if bm.enter_locked(r, &mut img) {
            self.write_bitmap_block(blk, &img).await?;
            bm.set_dirty(r);
        }
        Ok(guard)
    }

    /// Write one bitmap block to every live member, durably.
    pub(crate) async fn write_bitmap_block(&self, blk: usize, img: &[u8]) -> Result<()> {
        let st = self.state.load_full();
        let buf = AlignedBuf::from_slice(img).into_shared();
        let off = crate::superblock::BITMAP_OFFSET + (blk * crate::bitmap::BLOCK) as u64;
        let members = st.live_members();
        let futs = members.iter().map(|m| {
            let b = buf.clone();
            async move {
                (
                    m.clone(),
                    dev::write_at(&m.dev, off, b, true, IoClass::Foreground).await,
                )
            }
        });
        let mut full = Vec::new();
        for (m, r) in futures::future::join_all(futs).await {
            if let Err(e) = r {
                if self.write_failed(&m, &e, crate::reason::BITMAP_WRITE).await
                    == WriteFault::NoSpace
                {
                    full.push(m);
                }
            }
        }
        if let Some(why) = &self.state.load().failed {
            return Err(Error::Failed(why.clone()));
        }
        if !full.is_empty() {
            // The bit may be on some members only: harmless (assembly takes the union),
            // but the write it guards must not go ahead.
            return Err(self.nospace_error(&full));
        }
        Ok(())
    }

    // ---------------------------------------------------------------- reads

    /// Read `len` bytes at `offset`.
    pub async fn read(&self, offset: u64, len: usize) -> Result<AlignedBuf> {
        self.check_io(offset, len as u64)?;
        let out = AlignedBuf::for_overwrite(len).into_shared();
        match self.geometry.scheme() {
            Scheme::Concat | Scheme::Parity { m: 0, .. } => {
                let futs = self.direct_pieces(offset, len as u64).into_iter().map(|d| {
                    let dst = out.slice(d.buf_off as usize..(d.buf_off + d.len) as usize);
                    self.read_direct(d.slot, d.moff, dst)
                });
                futures::future::try_join_all(futs).await?;
            }
            _ => {
                let pieces = self.geometry.pieces(offset, len as u64);
                let futs = pieces.into_iter().map(|p| {
                    let dst = out.slice(p.buf_off as usize..(p.buf_off + p.len) as usize);
                    self.read_piece(p, dst)
                });
                futures::future::try_join_all(futs).await?;
            }
        }
        Ok(out.try_unwrap().expect("read views released"))
    }

    /// Concat: (slot, member offset, offset in buffer, length) pieces, split at chunk
    /// boundaries (the unit a replacement copies under lock).
    fn concat_pieces(&self, offset: u64, len: u64) -> Vec<(usize, u64, u64, u64)> {
        let st = self.state.load();
        let chunk = self.geometry.chunk as u64;
        let mut out = Vec::new();
        let mut pos = offset;
        while pos < offset + len {
            let slot = self.concat_starts.partition_point(|&s| s <= pos) - 1;
            let size = st.slots[slot].entry.as_ref().map(|e| e.size).unwrap_or(0);
            let within = pos - self.concat_starts[slot];
            let n = (size - within)
                .min(offset + len - pos)
                .min(chunk - within % chunk);
            out.push((slot, within, pos - offset, n));
            pos += n;
        }
        out
    }

    /// Read from the one member that holds this data (no redundancy).
    async fn read_direct(&self, slot: usize, moff: u64, dst: SharedBuf) -> Result<()> {
        let st = self.state.load_full();
        let s = &st.slots[slot];
        let m = s
            .readable(moff + dst.len() as u64)
            .ok_or_else(|| Error::Failed(format!("slot {slot} has no working member")))?
            .clone();
        if let Err(e) = self.mread(&m, moff, dst, IoClass::Foreground).await {
            self.note_read_error(&m, &e).await;
            return Err(Error::io(format!("reading {}", m.path), e));
        }
        Ok(())
    }

    async fn read_piece(&self, p: ChunkPiece, dst: SharedBuf) -> Result<()> {
        let chunk = self.geometry.chunk as u64;
        let moff = p.stripe * chunk + p.chunk_off;
        let w = self.geometry.width as usize;
        match self.geometry.scheme() {
            Scheme::Mirror { .. } => self.read_mirror(p.group, p.stripe, moff, dst).await,
            Scheme::Parity { m: 0, .. } => {
                let slot = p.group * w + self.geometry.data_member(p.stripe, p.index);
                self.read_direct(slot, moff, dst).await
            }
            Scheme::Parity { .. } => {
                let slot = p.group * w + self.geometry.data_member(p.stripe, p.index);
                let st = self.state.load_full();
                let mut bad = None;
                if let Some(m) = st.slots[slot].readable(moff + p.len) {
                    match self.mread(m, moff, dst.clone(), IoClass::Foreground).await {
                        Ok(()) => return Ok(()),
                        Err(e) => {
                            self.note_read_error(m, &e).await;
                            bad = Some(m.clone());
                        }
                    }
                }
                self.degraded_read(p, dst, bad).await
            }
            Scheme::Concat => unreachable!("concat is read by read_direct"),
        }
    }

    /// Reconstruct one piece of a data chunk from the rest of its stripe. With `repair`,
    /// write the result back to the member that failed to read it.
    async fn degraded_read(
        &self,
        p: ChunkPiece,
        dst: SharedBuf,
        repair: Option<Arc<Member>>,
    ) -> Result<()> {
        let _lock = self.locks.lock(p.group, p.stripe).await;
        self.reconstruct_locked(p, dst, repair).await
    }

    /// `degraded_read` with the stripe lock already held.
    async fn reconstruct_locked(
        &self,
        p: ChunkPiece,
        dst: SharedBuf,
        repair: Option<Arc<Member>>,
    ) -> Result<()> {
        let chunk = self.geometry.chunk as u64;
        let st = self.state.load_full();
        if let Some(why) = &st.failed {
            return Err(Error::Failed(why.clone()));
        }
        let base = p.stripe * chunk;
        // Beyond the initial resync's progress, parity is only known to match the data in
        // rows that were written since creation: writes there always compute parity from
        // the whole row (reconstruct-write, see `write_stripe`), never from old parity. So
        // every byte a client wrote reconstructs exactly; a never-written row reads as
        // whatever the members held before creation (zeros on members sbod created), as md
        // does after an interrupted initial sync.
        let shards = self
            .gather(
                &st,
                p.group,
                p.stripe,
                p.chunk_off,
                p.len,
                &[p.index],
                IoClass::Foreground,
            )
            .await?;
        let out = shards.bufs[p.index].as_ref().expect("reconstructed");
        slice_mut(&dst).copy_from_slice(slice_of(out));
        if let Some(m) = repair {
            let fix = AlignedBuf::from_slice(slice_of(out)).into_shared();
            self.repair(&m, base + p.chunk_off, fix, IoClass::Foreground)
                .await;
        }
        Ok(())
    }

    /// Rewrite a range a member failed to read, with data redundancy rebuilt. Only while
    /// the member is still in service (the read error may have failed it: a member that
    /// shrank is never written again), and never past its size; a repair that cannot be
    /// written fails the member. Returns whether it was rewritten.
    pub(crate) async fn repair(
        &self,
        m: &Arc<Member>,
        off: u64,
        buf: SharedBuf,
        class: IoClass,
    ) -> bool {
        if !self.in_service(m) {
            return false;
        }
        let len = buf.len() as u64;
        match self.mwrite_in_place(m, off, buf, class).await {
            Ok(()) => {
                m.stats.repaired.fetch_add(len / 4096, Ordering::Relaxed);
                tracing::info!(member = %m.path, offset = off, "rewrote unreadable range");
                true
            }
            Err(e) => {
                // Out of space rewriting blocks it holds: it keeps its error, and the
                // next read of them reconstructs again.
                self.write_failed(m, &e, crate::reason::REPAIR_WRITE).await;
                false
            }
        }
    }

    /// Is this member still one the array writes to?
    pub(crate) fn in_service(&self, m: &Arc<Member>) -> bool {
        self.state
            .load()
            .slots
            .iter()
            .flat_map(|s| s.write_targets())
            .any(|x| Arc::ptr_eq(x, m))
    }

    async fn read_mirror(
        &self,
        group: usize,
        stripe: u64,
        moff: u64,
        dst: SharedBuf,
    ) -> Result<()> {
        self.read_copies(group, stripe, moff, dst, false).await
    }

    /// Read from the first copy that answers; copies that failed are rewritten from it
    /// unless the caller holds the stripe lock (`locked`: a write follows that rewrites
    /// every copy anyway).
    async fn read_copies(
        &self,
        group: usize,
        stripe: u64,
        moff: u64,
        dst: SharedBuf,
        locked: bool,
    ) -> Result<()> {
        let w = self.geometry.width as usize;
        let st = self.state.load_full();
        let len = dst.len() as u64;
        // Spread reads over the copies: start at a copy chosen by the stripe.
        let mut order: Vec<Arc<Member>> = Vec::new();
        for i in 0..w {
            let slot = group * w + (i + stripe as usize) % w;
            if let Some(m) = st.slots[slot].readable(moff + len) {
                order.push(m.clone());
            }
        }
        if order.is_empty() {
            return Err(Error::Failed(format!("group {group} has no readable copy")));
        }
        let mut bad = Vec::new();
        for m in &order {
            match self.mread(m, moff, dst.clone(), IoClass::Foreground).await {
                Ok(()) => {
                    if !bad.is_empty() && !locked {
                        self.repair_mirror(group, stripe, moff, &dst, bad).await;
                    }
                    return Ok(());
                }
                Err(e) => {
                    self.note_read_error(m, &e).await;
                    bad.push(m.clone());
                }
            }
        }
        Err(Error::Failed(format!(
            "no copy of group {group} could be read at member offset {moff}"
        )))
    }

    /// Rewrite copies that failed to read, from a good copy read again under the lock.
    async fn repair_mirror(
        &self,
        group: usize,
        stripe: u64,
        moff: u64,
        good: &SharedBuf,
        bad: Vec<Arc<Member>>,
    ) {
        let _lock = self.locks.lock(group, stripe).await;
        let st = self.state.load_full();
        let w = self.geometry.width as usize;
        let len = good.len() as u64;
        let Some(src) = (0..w)
            .filter_map(|i| st.slots[group * w + i].readable(moff + len))
            .find(|m| !bad.iter().any(|b| Arc::ptr_eq(b, m)))
            .cloned()
        else {
            return;
        };
        let fresh = AlignedBuf::for_overwrite(len as usize).into_shared();
        if self
            .mread(&src, moff, fresh.clone(), IoClass::Foreground)
            .await
            .is_err()
        {
            return;
        }
        for m in bad {
            self.repair(&m, moff, fresh.clone(), IoClass::Foreground)
                .await;
        }
    }

    // ---------------------------------------------------------------- writes

    /// Write `data` at `offset`; with `fua`, durable on every member before returning.
    pub async fn write(&self, offset: u64, data: AlignedBuf, fua: bool) -> Result<()> {
        let fua = self.sync.fua(fua);
        self.check_io(offset, data.len() as u64)?;
        self.check_writable()?;
        let len = data.len() as u64;
        let data = data.into_shared();
        self.write_shared(offset, len, &data, fua, &[]).await
    }

    /// Write `data` at any byte `offset` (an NBD client that did not agree to the block
    /// size; zeroing part of a block). The 4 KiB blocks it covers only in part are read
    /// and merged inside the same stripe lock every write to them takes, so writes from
    /// any number of connections, to the same blocks at once, never lose each other's
    /// bytes. Aligned requests take the plain path.
    pub async fn write_bytes(&self, offset: u64, data: &[u8], fua: bool) -> Result<()> {
        let fua = self.sync.fua(fua);
        let len = data.len() as u64;
        if len == 0 {
            return Ok(());
        }
        let end = offset
            .checked_add(len)
            .filter(|&e| e <= self.size)
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "range {offset}+{len} is beyond the end of the volume ({} bytes)",
                    self.size
                ))
            })?;
        let (start, stop) = (offset / BLOCK * BLOCK, end.div_ceil(BLOCK) * BLOCK);
        if (start, stop) == (offset, end) {
            return self.write(offset, AlignedBuf::from_slice(data), fua).await;
        }
        self.check_io(start, stop - start)?;
        let mut buf = AlignedBuf::zeroed((stop - start) as usize);
        let at = (offset - start) as usize;
        buf[at..at + data.len()].copy_from_slice(data);
        // The blocks at either end that keep bytes of their own (one, if both ends lie in
        // the same block).
        let mut patches = Vec::new();
        let head_end = (start + BLOCK).min(end);
        if offset > start || head_end < start + BLOCK {
            patches.push(Patch {
                at: 0,
                new: at..(head_end - start) as usize,
            });
        }
        if end < stop && stop - BLOCK > start {
            patches.push(Patch {
                at: (stop - BLOCK - start) as usize,
                new: 0..(end - (stop - BLOCK)) as usize,
            });
        }
        let data = buf.into_shared();
        self.write_shared(start, stop - start, &data, fua, &patches)
            .await
    }

    /// Make `len` bytes at any byte `offset` read back as zeros: the blocks covered in
    /// part are merged as by [`Array::write_bytes`], whole blocks are zeroed as by
    /// [`Array::write_zeroes`] (with `punch`, deallocated where the members can).
    pub async fn write_zeroes_bytes(
        &self,
        offset: u64,
        len: u64,
        fua: bool,
        punch: bool,
    ) -> Result<()> {
        let fua = self.sync.fua(fua);
        let end = offset
            .checked_add(len)
            .filter(|&e| e <= self.size)
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "range {offset}+{len} is beyond the end of the volume ({} bytes)",
                    self.size
                ))
            })?;
        let (a0, a1) = (offset.div_ceil(BLOCK) * BLOCK, end / BLOCK * BLOCK);
        if a0 >= a1 {
            // No whole block inside: at most two partial ones.
            return self
                .write_bytes(offset, &vec![0u8; len as usize], fua)
                .await;
        }
        let head = async {
            match offset < a0 {
                true => {
                    self.write_bytes(offset, &vec![0u8; (a0 - offset) as usize], false)
                        .await
                }
                false => Ok(()),
            }
        };
        let tail = async {
            match a1 < end {
                true => {
                    self.write_bytes(a1, &vec![0u8; (end - a1) as usize], false)
                        .await
                }
                false => Ok(()),
            }
        };
        let middle = self.write_zeroes(a0, a1 - a0, false, punch);
        let (h, m, t) = futures::future::join3(head, middle, tail).await;
        h.and(m).and(t)?;
        if fua {
            self.flush().await?;
        }
        Ok(())
    }

    pub(crate) async fn write_shared(
        &self,
        offset: u64,
        len: u64,
        data: &SharedBuf,
        fua: bool,
        patches: &[Patch],
    ) -> Result<()> {
        // The patches inside a piece at `buf_off..buf_off+len` of the buffer, relative to it.
        let within = |buf_off: u64, len: u64| -> Vec<Patch> {
            patches
                .iter()
                .filter(|p| (buf_off..buf_off + len).contains(&(p.at as u64)))
                .map(|p| Patch {
                    at: p.at - buf_off as usize,
                    new: p.new.clone(),
                })
                .collect()
        };
        match self.geometry.scheme() {
            Scheme::Concat | Scheme::Parity { m: 0, .. } => {
                let futs = self.direct_pieces(offset, len).into_iter().map(|d| {
                    let src = data.slice(d.buf_off as usize..(d.buf_off + d.len) as usize);
                    let mine = within(d.buf_off, d.len);
                    self.write_plain(d.slot, d.lock_key, d.moff, src, fua, mine)
                });
                all_done(futs).await?;
            }
            Scheme::Mirror { .. } => {
                let futs = self.geometry.pieces(offset, len).into_iter().map(|p| {
                    let src = data.slice(p.buf_off as usize..(p.buf_off + p.len) as usize);
                    let mine = within(p.buf_off, p.len);
                    self.write_mirror(p.group, p.stripe, p.chunk_off, src, fua, mine)
                });
                all_done(futs).await?;
            }
            Scheme::Parity { .. } => {
                // Group pieces by stripe; each stripe is planned on its own.
                type Planned = (usize, u64, Vec<NewData>, Vec<(usize, Patch)>);
                let mut stripes: Vec<Planned> = Vec::new();
                for p in self.geometry.pieces(offset, len) {
                    let nd = NewData {
                        index: p.index,
                        chunk_off: p.chunk_off,
                        src: data.slice(p.buf_off as usize..(p.buf_off + p.len) as usize),
                    };
                    let mine = within(p.buf_off, p.len);
                    match stripes.last_mut() {
                        Some((g, t, v, pp)) if *g == p.group && *t == p.stripe => {
                            pp.extend(mine.into_iter().map(|x| (v.len(), x)));
                            v.push(nd);
                        }
                        _ => stripes.push((
                            p.group,
                            p.stripe,
                            vec![nd],
                            mine.into_iter().map(|x| (0, x)).collect(),
                        )),
                    }
                }
                let futs = stripes
                    .into_iter()
                    .map(|(g, t, v, pp)| self.write_stripe(g, t, v, fua, pp));
                all_done(futs).await?;
            }
        }
        Ok(())
    }

    /// Layouts without redundancy (raid0, concat): the pieces of a range, one member each,
    /// with neighbours that are contiguous on the same member and in the buffer merged
    /// into one member I/O.
    fn direct_pieces(&self, offset: u64, len: u64) -> Vec<Direct> {
        let chunk = self.geometry.chunk as u64;
        let w = self.geometry.width as usize;
        let raw: Vec<Direct> = if self.geometry.level == crate::layout::Level::Concat {
            self.concat_pieces(offset, len)
                .into_iter()
                .map(|(slot, moff, buf_off, len)| Direct {
                    slot,
                    lock_key: slot,
                    moff,
                    buf_off,
                    len,
                })
                .collect()
        } else {
            self.geometry
                .pieces(offset, len)
                .into_iter()
                .map(|p| Direct {
                    slot: p.group * w + self.geometry.data_member(p.stripe, p.index),
                    lock_key: p.group,
                    moff: p.stripe * chunk + p.chunk_off,
                    buf_off: p.buf_off,
                    len: p.len,
                })
                .collect()
        };
        let mut out: Vec<Direct> = Vec::with_capacity(raw.len());
        for d in raw {
            match out.last_mut() {
                Some(l)
                    if l.slot == d.slot
                        && l.moff + l.len == d.moff
                        && l.buf_off + l.len == d.buf_off =>
                {
                    l.len += d.len
                }
                _ => out.push(d),
            }
        }
        out
    }

    /// A write with no redundancy: one member (and its replacement, if one is being
    /// copied: hence the locks, which order this write with the copy of its chunks).
    async fn write_plain(
        &self,
        slot: usize,
        lock_key: usize,
        moff: u64,
        src: SharedBuf,
        fua: bool,
        patches: Vec<Patch>,
    ) -> Result<()> {
        let chunk = self.geometry.chunk as u64;
        let mut _locks = Vec::new();
        for t in moff / chunk..(moff + src.len() as u64).div_ceil(chunk) {
            // Ascending order; the copy holds one lock at a time, so this cannot deadlock.
            _locks.push(self.locks.lock(lock_key, t).await);
        }
        for p in &patches {
            let old = AlignedBuf::for_overwrite(BLOCK as usize).into_shared();
            self.read_direct(slot, moff + p.at as u64, old.clone())
                .await?;
            p.merge(&src, &old);
        }
        let st = self.state.load_full();
        let targets: Vec<Target> = st.slots[slot]
            .write_targets()
            .map(|m| Target {
                member: m.clone(),
                offset: moff,
                buf: src.clone(),
            })
            .collect();
        if targets.is_empty() {
            return Err(Error::Failed(format!("slot {slot} has no working member")));
        }
        // One copy: a write refused for space leaves nothing inconsistent to resync.
        self.write_targets(targets, fua, IoClass::Foreground, None)
            .await
    }

    async fn write_mirror(
        &self,
        group: usize,
        stripe: u64,
        chunk_off: u64,
        src: SharedBuf,
        fua: bool,
        patches: Vec<Patch>,
    ) -> Result<()> {
        let chunk = self.geometry.chunk as u64;
        let moff = stripe * chunk + chunk_off;
        let _region = self.enter_region(moff).await?;
        let _lock = self.locks.lock(group, stripe).await;
        for p in &patches {
            let old = AlignedBuf::for_overwrite(BLOCK as usize).into_shared();
            self.read_copies(group, stripe, moff + p.at as u64, old.clone(), true)
                .await?;
            p.merge(&src, &old);
        }
        let st = self.state.load_full();
        let w = self.geometry.width as usize;
        let targets: Vec<Target> = (0..w)
            .flat_map(|i| st.slots[group * w + i].write_targets())
            .map(|m| Target {
                member: m.clone(),
                offset: moff,
                buf: src.clone(),
            })
            .collect();
        if targets.is_empty() {
            return Err(Error::Failed(format!("group {group} has no working copy")));
        }
        self.write_targets(targets, fua, IoClass::Foreground, Some((group, stripe)))
            .await
    }

    /// Write new data into one parity stripe.
    pub(crate) async fn write_stripe(
        &self,
        group: usize,
        stripe: u64,
        new: Vec<NewData>,
        fua: bool,
        patches: Vec<(usize, Patch)>,
    ) -> Result<()> {
        let chunk = self.geometry.chunk as u64;
        let base = stripe * chunk;
        let _region = self.enter_region(base).await?;
        let _lock = self.locks.lock(group, stripe).await;
        for (i, p) in &patches {
            // The block as the volume holds it now: from its member, else rebuilt.
            let d = &new[*i];
            let piece = ChunkPiece {
                group,
                stripe,
                index: d.index,
                chunk_off: d.chunk_off + p.at as u64,
                len: BLOCK,
                buf_off: 0,
            };
            let old = AlignedBuf::for_overwrite(BLOCK as usize).into_shared();
            let slot =
                group * self.geometry.width as usize + self.geometry.data_member(stripe, d.index);
            let mut bad = None;
            let st = self.state.load_full();
            if let Some(m) = st.slots[slot].readable(base + piece.chunk_off + BLOCK) {
                match self
                    .mread(m, base + piece.chunk_off, old.clone(), IoClass::Foreground)
                    .await
                {
                    Ok(()) => {
                        p.merge(&d.src, &old);
                        continue;
                    }
                    Err(e) => {
                        self.note_read_error(m, &e).await;
                        bad = Some(m.clone());
                    }
                }
            }
            self.reconstruct_locked(piece, old.clone(), bad).await?;
            p.merge(&d.src, &old);
        }
        let st = self.state.load_full();
        if let Some(why) = &st.failed {
            return Err(Error::Failed(why.clone()));
        }
        let codec = self
            .codec
            .as_ref()
            .expect("parity layout has a codec")
            .clone();
        let (k, m) = (codec.k(), codec.m());
        let w = self.geometry.width as usize;
        let r0 = new.iter().map(|d| d.chunk_off).min().expect("pieces");
        let r1 = new
            .iter()
            .map(|d| d.chunk_off + d.src.len() as u64)
            .max()
            .expect("pieces");
        let rl = (r1 - r0) as usize;
        let slot_of = |shard: usize| group * w + self.geometry.member_of_shard(stripe, shard);
        let readable = |shard: usize| st.slots[slot_of(shard)].readable(base + r1).cloned();
        let mut by_index: Vec<Option<&NewData>> = vec![None; k];
        for d in &new {
            by_index[d.index] = Some(d);
        }
        let full = by_index
            .iter()
            .all(|d| d.is_some_and(|d| d.chunk_off == r0 && d.src.len() == rl));
        let synced = base + chunk <= self.resync_offset.load(Ordering::Acquire);

        let parity: Vec<SharedBuf> = (0..m)
            .map(|_| AlignedBuf::for_overwrite(rl).into_shared())
            .collect();
        let mut done = false;
        // Parity computed from the data alone (not from old parity): the rows written are
        // consistent afterwards whatever they were before.
        let mut from_data = full;
        // With a data chunk missing, the stripe must stay consistent through a write that
        // reaches some members only (a member file's file system full): that chunk lives
        // only in parity. Members that can run out of space (files) take the plan below,
        // which keeps the old rows to put back.
        let missing_data = (0..k).any(|i| readable(i).is_none());
        // (A whole-stripe write over a stripe already inconsistent has nothing to keep:
        // what the missing chunk held is not known; it settles the stripe instead.)
        let settles = full
            && r0 == 0
            && rl as u64 == chunk
            && self
                .bitmap
                .as_ref()
                .is_some_and(|b| b.is_unsynced(group, stripe));
        let can_run_out = missing_data
            && !settles
            && (0..k + m).any(|s| st.slots[slot_of(s)].write_targets().any(|x| x.is_file));
        if can_run_out {
            // done stays false: the gather plan.
        } else if full {
            let data: Vec<&[u8]> = by_index
                .iter()
                .map(|d| slice_of(&d.expect("full").src))
                .collect();
            let mut p: Vec<&mut [u8]> = parity.iter().map(slice_mut).collect();
            codec
                .encode(&data, &mut p)
                .map_err(|e| Error::Invalid(e.to_string()))?;
            done = true;
        } else {
            let written: usize = new.iter().map(|d| d.src.len()).sum();
            let rmw_ok = synced
                && new.iter().all(|d| readable(d.index).is_some())
                && (k..k + m).all(|s| readable(s).is_some());
            let rcw_ok = (0..k).all(|i| {
                by_index[i].is_some_and(|d| d.chunk_off == r0 && d.src.len() == rl)
                    || readable(i).is_some()
            });
            let rmw_cost = written + m * rl;
            let rcw_cost: usize = (0..k)
                .map(|i| rl - by_index[i].map(|d| d.src.len()).unwrap_or(0))
                .sum();
            let use_rmw = rmw_ok && (!rcw_ok || rmw_cost <= rcw_cost);
            if use_rmw {
                done = self.rmw(&codec, base, r0, &new, &parity, &readable).await;
            } else if rcw_ok {
                done = self
                    .rcw(&codec, base, r0, rl, &by_index, &parity, &readable)
                    .await;
                from_data = true;
            }
        }
        // What to write back should the write reach some members and not others for
        // want of space (the degraded plan below): the rows as they were.
        let mut undo: Option<Vec<Target>> = None;
        let mut targets = Vec::new();
        // `buf` to every member that takes writes for `shard`, at `off` in the chunk.
        let push = |out: &mut Vec<Target>, shard: usize, off: u64, buf: &SharedBuf| {
            for mem in st.slots[slot_of(shard)].write_targets() {
                out.push(Target {
                    member: mem.clone(),
                    offset: base + off,
                    buf: buf.clone(),
                });
            }
        };
        let encode = |rows: &[SharedBuf], parity: &[SharedBuf]| -> Result<()> {
            let dr: Vec<&[u8]> = rows.iter().map(slice_of).collect();
            let mut p: Vec<&mut [u8]> = parity.iter().map(slice_mut).collect();
            codec
                .encode(&dr, &mut p)
                .map_err(|e| Error::Invalid(e.to_string()))
        };
        if done {
            for d in &new {
                push(&mut targets, d.index, d.chunk_off, &d.src);
            }
        } else {
            // Degraded (or a read failed): rebuild the rows from what survives.
            let want: Vec<usize> = (0..k).filter(|&i| readable(i).is_none()).collect();
            let shards = self
                .gather(
                    &st,
                    group,
                    stripe,
                    r0,
                    rl as u64,
                    &want,
                    IoClass::Foreground,
                )
                .await?;
            // A stripe with a member missing is only consistent while every write to it
            // reaches every member: a write refused for space on one member would leave
            // the missing member's data impossible to rebuild. So keep the old rows, and
            // write them back if that happens.
            let old_rows: Vec<SharedBuf> = (0..k)
                .map(|i| {
                    let b = shards.bufs[i].as_ref().expect("data gathered");
                    if by_index[i].is_some() {
                        AlignedBuf::from_slice(slice_of(b)).into_shared()
                    } else {
                        b.clone()
                    }
                })
                .collect();
            let data: Vec<SharedBuf> = (0..k)
                .map(|i| {
                    let b = shards.bufs[i].as_ref().expect("data gathered").clone();
                    if let Some(d) = by_index[i] {
                        let off = (d.chunk_off - r0) as usize;
                        slice_mut(&b)[off..off + d.src.len()].copy_from_slice(slice_of(&d.src));
                    }
                    b
                })
                .collect();
            let old_parity: Vec<SharedBuf> = (0..m)
                .map(|_| AlignedBuf::for_overwrite(rl).into_shared())
                .collect();
            encode(&old_rows, &old_parity)?;
            // Whole rows of every data chunk we touch or that was stale, and parity.
            let rewritten = |i: usize| by_index[i].is_some() || shards.stale.contains(&i);
            let mut back = Vec::new();
            for (i, b) in old_rows.iter().enumerate().filter(|(i, _)| rewritten(*i)) {
                push(&mut back, i, r0, b);
            }
            for (r, p) in old_parity.iter().enumerate() {
                push(&mut back, k + r, r0, p);
            }
            undo = Some(back);
            from_data = true;
            encode(&data, &parity)?;
            for (i, b) in data.iter().enumerate().filter(|(i, _)| rewritten(*i)) {
                push(&mut targets, i, r0, b);
            }
        }
        for (r, p) in parity.iter().enumerate() {
            push(&mut targets, k + r, r0, p);
        }
        let key = Some((group, stripe));
        let r = match undo {
            None => {
                self.write_targets(targets, fua, IoClass::Foreground, key)
                    .await
            }
            Some(back) => {
                let first = self.write_each(targets, fua, IoClass::Foreground).await;
                match self.judge_writes(&first, None) {
                    Err(e @ Error::NoSpace(_)) => {
                        // Put the rows back as they were. A member out of space took a
                        // prefix of its write (a file system lands what fits, in order),
                        // whose blocks are allocated now: rewriting them needs no space,
                        // and where its rewrite is refused further on nothing had
                        // changed. Only a refusal from a member whose write had landed
                        // whole leaves the stripe inconsistent.
                        let mut again = self.write_each(back, fua, IoClass::Foreground).await;
                        again
                            .full
                            .retain(|m| !first.full.iter().any(|f| Arc::ptr_eq(f, m)));
                        if again.full.is_empty() {
                            again.region = None;
                        }
                        self.judge_writes(&again, key)?;
                        Err(e)
                    }
                    other => other,
                }
            }
        };
        if r.is_ok() && from_data && r0 == 0 && rl as u64 == chunk {
            // Every row's parity now follows from the data: consistent again.
            if let Some(bm) = &self.bitmap {
                bm.synced(group, stripe);
            }
        }
        r
    }

    /// Read-modify-write: parity += coef * (old ^ new). False if a read failed.
    async fn rmw(
        &self,
        codec: &sbod_codec::Codec,
        base: u64,
        r0: u64,
        new: &[NewData],
        parity: &[SharedBuf],
        readable: &(dyn Fn(usize) -> Option<Arc<Member>> + Sync),
    ) -> bool {
        let k = codec.k();
        let old: Vec<SharedBuf> = new
            .iter()
            .map(|d| AlignedBuf::for_overwrite(d.src.len()).into_shared())
            .collect();
        let mut reads = Vec::new();
        for (d, o) in new.iter().zip(&old) {
            reads.push((
                readable(d.index).expect("checked"),
                base + d.chunk_off,
                o.clone(),
            ));
        }
        for (r, p) in parity.iter().enumerate() {
            reads.push((readable(k + r).expect("checked"), base + r0, p.clone()));
        }
        if !self.read_all(reads).await {
            return false;
        }
        for (d, o) in new.iter().zip(&old) {
            let off = (d.chunk_off - r0) as usize;
            let n = d.src.len();
            let mut p: Vec<&mut [u8]> = parity
                .iter()
                .map(|p| &mut slice_mut(p)[off..off + n])
                .collect();
            if codec
                .update(d.index, slice_of(o), slice_of(&d.src), &mut p)
                .is_err()
            {
                return false;
            }
        }
        true
    }

    /// Reconstruct-write: read the untouched data rows and encode. False if a read failed.
    #[allow(clippy::too_many_arguments)]
    async fn rcw(
        &self,
        codec: &sbod_codec::Codec,
        base: u64,
        r0: u64,
        rl: usize,
        by_index: &[Option<&NewData>],
        parity: &[SharedBuf],
        readable: &(dyn Fn(usize) -> Option<Arc<Member>> + Sync),
    ) -> bool {
        let k = codec.k();
        let bufs: Vec<SharedBuf> = (0..k)
            .map(|_| AlignedBuf::for_overwrite(rl).into_shared())
            .collect();
        let mut reads = Vec::new();
        for i in 0..k {
            let b = &bufs[i];
            match by_index[i] {
                Some(d) => {
                    let off = (d.chunk_off - r0) as usize;
                    let n = d.src.len();
                    slice_mut(b)[off..off + n].copy_from_slice(slice_of(&d.src));
                    if off > 0 {
                        reads.push((readable(i).expect("checked"), base + r0, b.slice(0..off)));
                    }
                    if off + n < rl {
                        reads.push((
                            readable(i).expect("checked"),
                            base + r0 + (off + n) as u64,
                            b.slice(off + n..rl),
                        ));
                    }
                }
                None => reads.push((readable(i).expect("checked"), base + r0, b.clone())),
            }
        }
        if !self.read_all(reads).await {
            return false;
        }
        let data: Vec<&[u8]> = bufs.iter().map(slice_of).collect();
        let mut p: Vec<&mut [u8]> = parity.iter().map(slice_mut).collect();
        codec.encode(&data, &mut p).is_ok()
    }

    /// Issue reads concurrently; count errors. True if all succeeded.
    async fn read_all(&self, reads: Vec<(Arc<Member>, u64, SharedBuf)>) -> bool {
        let futs = reads.into_iter().map(|(m, off, b)| async move {
            let r = self.mread(&m, off, b, IoClass::Foreground).await;
            (m, r)
        });
        let mut ok = true;
        for (m, r) in futures::future::join_all(futs).await {
            if let Err(e) = r {
                self.note_read_error(&m, &e).await;
                ok = false;
            }
        }
        ok
    }

    // ---------------------------------------------------------------- flush, zeroes

    /// Make every acknowledged write durable on every member.
    pub async fn flush(&self) -> Result<()> {
        if self.read_only.load(Ordering::Acquire) {
            // A rescue writes nothing: nothing to make durable.
            return Ok(());
        }
        let st = self.state.load_full();
        if let Some(why) = &st.failed {
            return Err(Error::Failed(why.clone()));
        }
        let members: Vec<Arc<Member>> = st
            .slots
            .iter()
            .flat_map(|s| s.write_targets())
            .cloned()
            .collect();
        let futs = members
            .iter()
            .map(|m| async move { (m.clone(), dev::flush(&m.dev).await) });
        for (m, r) in futures::future::join_all(futs).await {
            if let Err(e) = r {
                // Even out of space: a flush that fails may have dropped written data
                // (the kernel forgets pages it could not write back), so the member failed.
                m.stats.write_errors.fetch_add(1, Ordering::Relaxed);
                tracing::error!(member = %m.path, error = %e, "flush failed");
                self.fail_member(&m, crate::reason::FLUSH_ERROR).await;
            }
        }
        if let Some(why) = &self.state.load().failed {
            return Err(Error::Failed(why.clone()));
        }
        Ok(())
    }

    /// Make a range read back as zeros (NBD WRITE_ZEROES); `punch` also deallocates.
    pub async fn write_zeroes(&self, offset: u64, len: u64, fua: bool, punch: bool) -> Result<()> {
        let fua = self.sync.fua(fua);
        self.check_io(offset, len)?;
        self.check_writable()?;
        let chunk = self.geometry.chunk as u64;
        let w = self.geometry.width as usize;
        match self.geometry.scheme() {
            Scheme::Parity { m, .. } if m > 0 => {
                // Whole stripes: zero every member's chunk (parity of zeros is zeros).
                let sd = self.geometry.stripe_data();
                let first_full = offset.div_ceil(sd) * sd;
                let last_full = (offset + len) / sd * sd;
                #[allow(clippy::type_complexity)]
                let mut futs: Vec<
                    std::pin::Pin<Box<dyn std::future::Future<Output = Result<()>> + Send + '_>>,
                > = Vec::new();
                if first_full < last_full {
                    if offset < first_full {
                        futs.push(Box::pin(self.zero_by_writing(
                            offset,
                            first_full - offset,
                            fua,
                        )));
                    }
                    let mut s = first_full / sd;
                    while s < last_full / sd {
                        let g = (s % self.geometry.groups as u64) as usize;
                        let t = s / self.geometry.groups as u64;
                        futs.push(Box::pin(self.zero_stripe(g, t, punch)));
                        s += 1;
                    }
                    if last_full < offset + len {
                        futs.push(Box::pin(self.zero_by_writing(
                            last_full,
                            offset + len - last_full,
                            fua,
                        )));
                    }
                } else {
                    futs.push(Box::pin(self.zero_by_writing(offset, len, fua)));
                }
                all_done(futs).await?;
            }
            Scheme::Concat => {
                let futs = self
                    .concat_pieces(offset, len)
                    .into_iter()
                    .map(|(slot, moff, _, n)| self.zero_slot(slot, moff, n, punch, None));
                all_done(futs).await?;
            }
            scheme => {
                let futs = self
                    .geometry
                    .pieces(offset, len)
                    .into_iter()
                    .map(move |p| async move {
                        let moff = p.stripe * chunk + p.chunk_off;
                        if let Scheme::Mirror { .. } = scheme {
                            let _region = self.enter_region(moff).await?;
                            let _lock = self.locks.lock(p.group, p.stripe).await;
                            for i in 0..w {
                                self.zero_slot(
                                    p.group * w + i,
                                    moff,
                                    p.len,
                                    punch,
                                    Some((p.group, p.stripe)),
                                )
                                .await?;
                            }
                            Ok(())
                        } else {
                            let slot = p.group * w + self.geometry.data_member(p.stripe, p.index);
                            self.zero_slot(slot, moff, p.len, punch, None).await
                        }
                    });
                all_done(futs).await?;
            }
        }
        if fua {
            self.flush().await?;
        }
        Ok(())
    }

    async fn zero_by_writing(&self, offset: u64, len: u64, fua: bool) -> Result<()> {
        let z = AlignedBuf::zeroed(len as usize).into_shared();
        self.write_shared(offset, len, &z, fua, &[]).await
    }

    async fn zero_stripe(&self, group: usize, stripe: u64, punch: bool) -> Result<()> {
        let chunk = self.geometry.chunk as u64;
        let w = self.geometry.width as usize;
        let base = stripe * chunk;
        let _region = self.enter_region(base).await?;
        let _lock = self.locks.lock(group, stripe).await;
        let futs = (0..w)
            .map(|i| self.zero_slot(group * w + i, base, chunk, punch, Some((group, stripe))));
        all_done(futs).await?;
        Ok(())
    }

    /// Zero a member range of one slot (all its write targets).
    async fn zero_slot(
        &self,
        slot: usize,
        moff: u64,
        len: u64,
        punch: bool,
        key: Option<(usize, u64)>,
    ) -> Result<()> {
        let st = self.state.load_full();
        let members: Vec<Arc<Member>> = st.slots[slot].write_targets().cloned().collect();
        let mut full = Vec::new();
        for m in members {
            let req = IoReq {
                offset: self.member_off(moff),
                kind: IoKind::Zero { len, punch },
                class: IoClass::Foreground,
            };
            let mut r = dev::io(&m.dev, req).await;
            if r.is_ok() && m.is_file {
                // Zeroing by writing (the last resort) would grow a truncated file.
                r = self.check_size(&m);
            }
            if let Err(e) = r {
                if self.write_failed(&m, &e, crate::reason::WRITE_ERROR).await
                    == WriteFault::NoSpace
                {
                    full.push(m);
                }
            }
        }
        if let Some(why) = &self.state.load().failed {
            return Err(Error::Failed(why.clone()));
        }
        if !full.is_empty() {
            // Zeroing that was refused leaves old data (and a consistent stripe: zeroing
            // by writing is planned as a write and goes through `write_targets`), except
            // where copies differ: resync them like any inconsistent stripe.
            if let (Some(bm), Some(key)) = (self.bitmap.as_ref(), key) {
                bm.unsynced(key.0, key.1, bm.region_of(moff));
            }
            return Err(self.nospace_error(&full));
        }
        Ok(())
    }

    /// NBD TRIM: advisory. Files have their blocks punched out (they read back as zeros on
    /// every member, so parity stays consistent); block devices are left alone, since
    /// discard on them does not promise zeros.
    pub async fn trim(&self, offset: u64, len: u64) -> Result<()> {
        self.check_io(offset, len)?;
        self.check_writable()?;
        let st = self.state.load_full();
        let all_files = st.live_members().iter().all(|m| m.is_file);
        if !all_files {
            return Ok(());
        }
        // Only whole stripes: partial ones would cost a write for an advisory command.
        let sd = self.geometry.stripe_data();
        let first = offset.div_ceil(sd) * sd;
        let last = (offset + len) / sd * sd;
        if first < last {
            self.write_zeroes(first, last - first, false, true).await?;
        }
        Ok(())
    }
}

/// Shards gathered for a stripe's row range.
pub(crate) struct Gathered {
    /// Per shard (codec order): the rows, for every present or reconstructed shard.
    pub bufs: Vec<Option<SharedBuf>>,
    /// Shards that were missing or unreadable and have been reconstructed.
    pub stale: Vec<usize>,
}

impl Array {
    /// Read enough shards of rows `[off, off+len)` of a stripe to rebuild the shards in
    /// `want` (plus every data shard), reconstructing what could not be read. Unreadable
    /// members are noted; errors only if fewer than k shards survive.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn gather(
        &self,
        st: &State,
        group: usize,
        stripe: u64,
        off: u64,
        len: u64,
        want: &[usize],
        class: IoClass,
    ) -> Result<Gathered> {
        let codec = self.codec.as_ref().expect("parity codec").clone();
        let (k, m) = (codec.k(), codec.m());
        let n = k + m;
        let w = self.geometry.width as usize;
        let chunk = self.geometry.chunk as u64;
        let base = stripe * chunk;
        let mut bufs: Vec<Option<SharedBuf>> = vec![None; n];
        let mut tried = vec![false; n];
        let mut got = 0usize;
        loop {
            // Pick untried readable shards, data first, until we could have k.
            let mut batch = Vec::new();
            for s in 0..n {
                if got + batch.len() >= k {
                    break;
                }
                if tried[s] {
                    continue;
                }
                let slot = group * w + self.geometry.member_of_shard(stripe, s);
                tried[s] = true;
                if let Some(mem) = st.slots[slot].readable(base + off + len) {
                    batch.push((
                        s,
                        mem.clone(),
                        AlignedBuf::for_overwrite(len as usize).into_shared(),
                    ));
                }
            }
            if batch.is_empty() {
                break;
            }
            let futs = batch.into_iter().map(|(s, mem, b)| async move {
                let r = self.mread(&mem, base + off, b.clone(), class).await;
                (s, mem, b, r)
            });
            for (s, mem, b, r) in futures::future::join_all(futs).await {
                match r {
                    Ok(()) => {
                        bufs[s] = Some(b);
                        got += 1;
                    }
                    Err(e) => self.note_read_error(&mem, &e).await,
                }
            }
            if got >= k {
                break;
            }
        }
        if got < k {
            return Err(Error::Failed(format!(
                "group {group} stripe {stripe}: only {got} of {n} chunks readable, {k} needed"
            )));
        }
        let present: Vec<bool> = bufs.iter().map(|b| b.is_some()).collect();
        let mut wanted = vec![false; n];
        for s in 0..k {
            wanted[s] = !present[s];
        }
        for &s in want {
            if !present[s] {
                wanted[s] = true;
            }
        }
        let stale: Vec<usize> = (0..n).filter(|&s| wanted[s]).collect();
        // Parity re-encoded from every data chunk is right whatever the stripe held; data
        // rebuilt from parity is only right where parity matched.
        if stale.iter().any(|&s| s < k)
            && self
                .bitmap
                .as_ref()
                .is_some_and(|b| b.is_unsynced(group, stripe))
        {
            // Parity here may not match the data (a write reached some members only):
            // what it would rebuild is not known to be the data. An error, never guesses.
            return Err(Error::io(
                format!("group {group} stripe {stripe}"),
                io::Error::other(
                    "this stripe was left inconsistent by a write that ran out of space and cannot be reconstructed until it is resynced (that happens by itself once space is free, while all its members are present)",
                ),
            ));
        }
        if !stale.is_empty() {
            let work: Vec<SharedBuf> = (0..n)
                .map(|s| {
                    bufs[s]
                        .clone()
                        .unwrap_or_else(|| AlignedBuf::for_overwrite(len as usize).into_shared())
                })
                .collect();
            {
                let mut refs: Vec<&mut [u8]> = work.iter().map(slice_mut).collect();
                codec
                    .reconstruct_some(&mut refs, &present, &wanted)
                    .map_err(|e| Error::Failed(format!("reconstruction failed: {e}")))?;
            }
            for s in &stale {
                bufs[*s] = Some(work[*s].clone());
            }
        }
        Ok(Gathered { bufs, stale })
    }
}
