//! The data path's shared state and its member I/O layer.
//!
//! [`DataPath`] holds what client I/O, the RAID families and the background processes
//! share: the geometry and its placement map, the membership snapshot, the stripe locks,
//! the write-intent bitmap ([`intent`]) and the settings. Its member I/O layer
//! ([`DataPath::mread`], [`DataPath::mwrite`], [`DataPath::mzero`]) is the one way the
//! engine touches a member's data area: it counts, checks member sizes, verifies and sets
//! the checksums of every block ([`tags`], on arrays that carry them), and decides what a
//! failed member I/O means (the one place that does). Membership is not changed here: a
//! member that must be taken out is handed to the array's membership ([`Membership`]),
//! which records the change on the members before it is used.

pub mod intent;
mod tags;

use crate::bitmap::Bitmap;
use crate::buf::SharedBuf;
use crate::dev::{self, IoClass, IoKind, IoReq};
use crate::error::{Error, Msg, Result, Step};
use crate::layout::Geometry;
use crate::locks::StripeLocks;
use crate::log::{self, Log, LogError, Ticket};
use crate::member::{Member, State};
use crate::placement::{Placement, StripeAddr};
use crate::reason::Why;
use arc_swap::ArcSwap;
use futures::future::BoxFuture;
use sbod_types::Settings;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

/// Who takes members out of service: the array's membership. The data path calls up
/// through this when a member I/O failure means the member must go.
pub(crate) trait Membership: Send + Sync {
    fn fail_member<'a>(&'a self, m: &'a Arc<Member>, why: Why) -> BoxFuture<'a, ()>;
    /// The log every client write goes through first, while one runs.
    fn journal(&self) -> Option<Arc<Log>>;
    /// Every device of the log failed: once what it acknowledged is in the pool, record
    /// that writes take the in-pool path (`Array::log_failed`).
    fn log_failed(&self) -> BoxFuture<'_, ()>;
}

/// What the data path and the background processes share: one view of the volume (a
/// geometry, its placement map and the stripe locks of that map) over the state every view
/// shares ([`Shared`]: the members, the bitmap, the settings, the lease). An array runs one
/// view; a reshape runs two at once over the same [`Shared`] (the old layout for what it
/// has not moved yet, the new one for what it has) and keeps the new one when it ends.
pub struct DataPath {
    pub(crate) shared: Arc<Shared>,
    pub geometry: Geometry,
    /// Where every volume byte lives (the one map).
    pub(crate) map: Placement,
    pub(crate) locks: StripeLocks,
    /// Parity known good below this member offset (initial sync in progress otherwise).
    pub(crate) resync_offset: AtomicU64,
    pub(crate) size: u64,
}

/// What every view of an array's volume shares (see [`DataPath`]).
pub struct Shared {
    pub name: String,
    pub(crate) state: ArcSwap<State>,
    pub(crate) bitmap: Option<Bitmap>,
    pub(crate) bitmap_bytes: u32,
    pub(crate) closing: AtomicBool,
    pub(crate) read_only: AtomicBool,
    pub settings: parking_lot::Mutex<Settings>,
    pub(crate) owner: Weak<dyn Membership>,
    /// Where the members keep the checksums of their blocks, if they do.
    pub(crate) integrity: Option<crate::integrity::TagLayout>,
    /// The resync after an unclean shutdown is running: checksums of the dirty regions
    /// may lag their data, so it reads them as they are and makes them again.
    pub(crate) crash_resync: AtomicBool,
    /// Whether this head may write the members (see `owner`): checked before every
    /// member write.
    pub(crate) lease: crate::owner::Lease,
    /// Client writes a server has received for this array and not finished yet (its
    /// count, kept by the server: [`crate::array::Array::queued_writes`]). A write being
    /// worked on sees from it that the client's next ones are already here, before their
    /// tasks start (with members in memory a task runs to its end once started, so the
    /// writes in progress in the engine are seldom more than one): a sequential stream's
    /// split stripe then waits for the next request's half (`family/parity/coalesce.rs`).
    pub(crate) queued_writes: Arc<std::sync::atomic::AtomicUsize>,
}

/// A `Shared` with no members and no array above it, for unit tests of the views.
#[cfg(test)]
pub(crate) fn test_shared() -> Arc<Shared> {
    struct Nobody;
    impl Membership for Nobody {
        fn fail_member<'a>(&'a self, _: &'a Arc<Member>, _: Why) -> BoxFuture<'a, ()> {
            Box::pin(async {})
        }
        fn journal(&self) -> Option<Arc<Log>> {
            None
        }
        fn log_failed(&self) -> BoxFuture<'_, ()> {
            Box::pin(async {})
        }
    }
    let owner: Weak<dyn Membership> = Weak::<Nobody>::new();
    Arc::new(Shared {
        name: "test".into(),
        state: ArcSwap::from_pointee(State {
            slots: Vec::new(),
            spares: Vec::new(),
            failed: None,
        }),
        bitmap: None,
        bitmap_bytes: 0,
        closing: AtomicBool::new(false),
        read_only: AtomicBool::new(false),
        settings: Default::default(),
        owner,
        integrity: None,
        crash_resync: AtomicBool::new(false),
        lease: Default::default(),
        queued_writes: Default::default(),
    })
}

impl std::ops::Deref for DataPath {
    type Target = Shared;
    fn deref(&self) -> &Shared {
        &self.shared
    }
}

impl DataPath {
    /// A view of the volume in `geometry` over `shared` (slot sizes: see
    /// [`Placement::new`]).
    pub(crate) fn view(
        shared: Arc<Shared>,
        geometry: Geometry,
        slot_sizes: &[u64],
        resync_offset: u64,
    ) -> DataPath {
        let stride = geometry.width as usize;
        Self::view_strided(shared, geometry, slot_sizes, resync_offset, stride)
    }

    /// A view whose slots are numbered `stride` per group (a reshape's old layout: see
    /// `Placement::with_stride`).
    pub(crate) fn view_strided(
        shared: Arc<Shared>,
        geometry: Geometry,
        slot_sizes: &[u64],
        resync_offset: u64,
        stride: usize,
    ) -> DataPath {
        let map = if geometry.level == crate::layout::Level::Concat {
            Placement::new(&geometry, slot_sizes)
        } else {
            Placement::with_stride(&geometry, slot_sizes, stride)
        };
        Self::with_map(shared, geometry, map, resync_offset)
    }

    /// The new layout's view during a reshape that narrows groups of `stride` slots
    /// (see `Placement::narrowed`).
    pub(crate) fn view_narrowed(
        shared: Arc<Shared>,
        geometry: Geometry,
        slot_sizes: &[u64],
        resync_offset: u64,
        stride: usize,
    ) -> DataPath {
        let map = Placement::narrowed(&geometry, slot_sizes, stride);
        Self::with_map(shared, geometry, map, resync_offset)
    }

    fn with_map(
        shared: Arc<Shared>,
        geometry: Geometry,
        map: Placement,
        resync_offset: u64,
    ) -> DataPath {
        let size = map.volume_size(&geometry);
        DataPath {
            shared,
            geometry,
            map,
            locks: StripeLocks::default(),
            resync_offset: AtomicU64::new(resync_offset),
            size,
        }
    }
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
    pub fn why(&self) -> Why {
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

/// What became of a set of member writes.
#[derive(Default)]
pub(crate) struct Written {
    pub any_failed: bool,
    /// Members whose file system was full, and a member offset one of them refused.
    pub full: Vec<Arc<Member>>,
    pub region: Option<u64>,
}

impl Written {
    fn add(&mut self, o: Written) {
        self.any_failed |= o.any_failed;
        for m in o.full {
            push_once(&mut self.full, m);
        }
        self.region = self.region.or(o.region);
    }
}

/// Add `m` to `ms` unless it is there (the members a write found full, each once).
fn push_once(ms: &mut Vec<Arc<Member>>, m: Arc<Member>) {
    if !ms.iter().any(|x| Arc::ptr_eq(x, &m)) {
        ms.push(m);
    }
}

/// How a set of member writes goes to the members: after its record is durable in the
/// log (then without FUA), or in the pool with this FUA.
enum Via {
    Log(Ticket),
    Pool(bool),
}

/// The largest zeroed range one log entry carries (replay zeroes it in place).
const ZERO_PIECE: u64 = 1 << 30;

/// The log's record of member writes: one entry per slot and range (the members that
/// take writes for a slot, a replacement with it, are one entry: replay writes the slot),
/// and a buffer written to several slots (a mirror's copies) kept next to itself, so the
/// log holds its bytes once (the plans list a buffer's targets one after another).
fn records_of(targets: &[Target]) -> Vec<log::Write> {
    let mut out: Vec<log::Write> = Vec::new();
    let mut seen: Vec<(usize, u64, *const u8, usize)> = Vec::new();
    for t in targets {
        let key = (t.slot, t.offset, t.buf.as_ptr(), t.buf.len());
        if seen.contains(&key) {
            continue;
        }
        seen.push(key);
        out.push(log::Write {
            slot: t.slot as u32,
            offset: t.offset,
            data: log::Data::Bytes(t.buf.clone()),
        });
    }
    out
}

/// Cut targets into rounds whose records fit the log (`max` bytes), each with its record:
/// every target's `step`-th piece in the same round. A stripe's plan fits in one (a log
/// device holds four of the largest, checked when it is added); only long runs of
/// raid0/concat (and mirror pieces on a small log) are cut, and each piece is then written
/// before the next is logged (a round's record waits for none of the others').
fn rounds_of(targets: Vec<Target>, max: u64) -> Vec<(Vec<Target>, Vec<log::Write>)> {
    let whole = records_of(&targets);
    if Log::record_len(&whole) <= max {
        return vec![(targets, whole)];
    }
    let distinct = whole.len().max(1) as u64;
    let block = log::format::BLOCK as u64;
    let step = ((max.saturating_sub(64 << 10)) / distinct / block * block).max(block) as usize;
    let longest = targets.iter().map(|t| t.buf.len()).max().unwrap_or(0);
    let mut out = Vec::new();
    let mut at = 0;
    while at < longest {
        let round: Vec<Target> = targets
            .iter()
            .filter(|t| t.buf.len() > at)
            .map(|t| {
                let end = (at + step).min(t.buf.len());
                Target {
                    slot: t.slot,
                    member: t.member.clone(),
                    offset: t.offset + at as u64,
                    buf: t.buf.slice(at..end),
                    // A piece of a buffer: its write sums it.
                    crcs: None,
                }
            })
            .collect();
        let record = records_of(&round);
        out.push((round, record));
        at += step;
    }
    out
}

/// One member write of a plan: to `member`, which takes writes for slot `slot`.
pub(crate) struct Target {
    pub slot: usize,
    pub member: Arc<Member>,
    pub offset: u64,
    pub buf: SharedBuf,
    /// The crc32c of each 4 KiB block of `buf`, where the caller took them while the
    /// bytes were in cache (a full-stripe write's fused parity and checksum pass); else
    /// the member write sums `buf` itself.
    pub crcs: Option<Arc<[u32]>>,
}

pub(crate) fn slice_of(b: &SharedBuf) -> &[u8] {
    // SAFETY: plan buffers are only read after the I/O that filled them completed, and no
    // I/O writes them while the codec runs.
    unsafe { b.as_slice() }
}

#[allow(clippy::mut_from_ref)]
pub(crate) fn slice_mut(b: &SharedBuf) -> &mut [u8] {
    // SAFETY: as above; each plan buffer has one user at a time.
    unsafe { b.as_mut_slice() }
}

/// Run writes to several stripes to the end, then give the first error. Never stop at the
/// first error (as `try_join_all` does, dropping the others mid-flight): a stripe write
/// dropped between its member writes would leave data and parity disagreeing, unrecorded.
pub(crate) async fn all_done<F: std::future::Future<Output = Result<()>>>(
    futs: impl IntoIterator<Item = F>,
) -> Result<()> {
    futures::future::join_all(futs)
        .await
        .into_iter()
        .collect::<Result<Vec<()>>>()
        .map(|_| ())
}

impl DataPath {
    /// The array failed: its reason as an error.
    pub(crate) fn failed(&self) -> Result<()> {
        match &self.state.load().failed {
            Some(why) => Err(Error::Failed(why.clone().into())),
            None => Ok(()),
        }
    }

    /// Take a member out of service (the array's membership records it first).
    pub(crate) async fn fail_member(&self, m: &Arc<Member>, why: impl Into<Why>) {
        if let Some(owner) = self.owner.upgrade() {
            owner.fail_member(m, why.into()).await;
        }
    }

    pub(crate) fn read_only_error(&self) -> Error {
        Error::ReadOnly(
            Msg::new(format!(
                "'{}' was started read-only to rescue its data: nothing is written to it",
                self.name
            ))
            .or(Step::say("copy the data off; to use the array again, bring back its members (or replace them) and assemble it without forcing")),
        )
    }

    pub(crate) fn check_writable(&self) -> Result<()> {
        if self.read_only.load(Ordering::Acquire) {
            return Err(self.read_only_error());
        }
        if self.lease.fenced_by().is_some() {
            return Err(self.lease.error(&self.name));
        }
        Ok(())
    }

    /// Another head took the members over: by whom (this head writes nothing more).
    pub fn fenced_by(&self) -> Option<String> {
        self.lease.fenced_by()
    }

    /// Started read-only (a rescue, or only looking).
    pub fn is_read_only(&self) -> bool {
        self.read_only.load(Ordering::Acquire)
    }

    /// Volume size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    pub fn state(&self) -> Arc<State> {
        self.state.load_full()
    }

    /// Where every volume byte lives.
    pub fn placement(&self) -> &Placement {
        &self.map
    }

    pub fn scheme(&self) -> crate::layout::Scheme {
        self.geometry.scheme()
    }

    pub(crate) fn member_off(&self, off: u64) -> u64 {
        self.geometry.data_offset + off
    }

    /// Is this stripe's parity known to match its data? (Beyond the initial resync's
    /// progress it is only where writes computed it from the whole row.)
    pub(crate) fn synced(&self, addr: StripeAddr) -> bool {
        self.map.stripe_offset(addr.stripe) + self.geometry.chunk as u64
            <= self.resync_offset.load(Ordering::Acquire)
    }

    /// Is this stripe held as inconsistent (a write reached some members only)? Keyed by
    /// the member offset of its row, so a row of another layout's chunk that covers it
    /// (during a reshape to a new chunk) counts too.
    pub(crate) fn is_unsynced(&self, addr: StripeAddr) -> bool {
        self.bitmap.as_ref().is_some_and(|b| {
            b.is_unsynced(
                addr.group,
                self.map.stripe_offset(addr.stripe),
                self.geometry.chunk as u64,
            )
        })
    }

    /// Hold this stripe as inconsistent; `moff`: a member offset the write entered (its
    /// bitmap region, dirty on disk, is pinned).
    pub(crate) fn mark_unsynced(&self, addr: StripeAddr, moff: u64) {
        if let Some(b) = &self.bitmap {
            b.unsynced(
                addr.group,
                self.map.stripe_offset(addr.stripe),
                b.region_of(moff),
            );
        }
    }

    /// This stripe is consistent again.
    pub(crate) fn mark_synced(&self, addr: StripeAddr) {
        if let Some(b) = &self.bitmap {
            b.synced(
                addr.group,
                self.map.stripe_offset(addr.stripe),
                self.geometry.chunk as u64,
            );
        }
    }

    // ------------------------------------------------------------ member I/O

    /// Read member data; with checksums, every block is verified (a block that fails is
    /// an error of its own, see [`crate::integrity::Mismatch`]).
    pub(crate) async fn mread(
        &self,
        m: &Arc<Member>,
        off: u64,
        buf: SharedBuf,
        class: IoClass,
    ) -> io::Result<()> {
        match &self.integrity {
            Some(layout) => self.read_verified(m, off, buf, class, layout).await,
            None => self.mread_raw(m, off, buf, class).await,
        }
    }

    /// Read member data as the member has it, unverified (the crash resync, which makes
    /// the checksums of what it reads).
    pub(crate) async fn mread_raw(
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
            m.stats.client_request();
        }
        dev::read_at(&m.dev, self.member_off(off), buf, class).await
    }

    /// Write to a member. A member file can be truncated under the array, and a write past
    /// its new end grows it back with a hole of zeros before the written bytes; so after
    /// every write to a file the member's size is checked before the write counts as done
    /// (and before a write to its last block, which would grow it back whole and hide the
    /// cut): a shrunk member's write returns a [`Shrank`] error, which fails it. With
    /// checksums, the new tags are set before the write is issued and settled after.
    pub(crate) async fn mwrite(
        &self,
        m: &Arc<Member>,
        off: u64,
        buf: SharedBuf,
        fua: bool,
        class: IoClass,
    ) -> io::Result<()> {
        self.mwrite_summed(m, off, buf, None, fua, class).await
    }

    /// [`DataPath::mwrite`] with the crc32c of each 4 KiB block of `buf` given (taken by
    /// the caller while the bytes were in cache), where the caller has them.
    pub(crate) async fn mwrite_summed(
        &self,
        m: &Arc<Member>,
        off: u64,
        buf: SharedBuf,
        crcs: Option<&[u32]>,
        fua: bool,
        class: IoClass,
    ) -> io::Result<()> {
        m.stats.writes.fetch_add(1, Ordering::Relaxed);
        let len = buf.len() as u64;
        m.stats.write_bytes.fetch_add(len, Ordering::Relaxed);
        if class == IoClass::Foreground {
            m.stats.client_request();
        }
        if !self.lease.ok() {
            return Err(crate::owner::lapsed());
        }
        let check = m.is_file && CHECK_SIZE_AFTER_WRITES;
        if check && off + len >= m.size {
            self.check_size(m)?;
        }
        if let (IoClass::Background, Some(layout)) = (class, &self.integrity) {
            // A process writing forward through the member (a rebuild's target).
            m.tags.read_ahead(&m.dev, layout, off).await;
        }
        let new = match crcs {
            Some(c) if c.len() as u64 * crate::integrity::BLOCK == len => {
                crate::integrity::NewTags::Crcs(c)
            }
            // SAFETY: the buffer is not written while it is being written to the member.
            _ => crate::integrity::NewTags::Data(unsafe { buf.as_slice() }),
        };
        let tags = self.tags_begin_write(m, off, new).await?;
        let r = dev::write_at(&m.dev, self.member_off(off), buf, fua, class).await;
        self.tags_end_write(m, tags, r.is_ok()).await;
        r?;
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

    /// Make `len` bytes of a member read back as zeros (`punch`: deallocate them too).
    pub(crate) async fn mzero(
        &self,
        m: &Arc<Member>,
        off: u64,
        len: u64,
        punch: bool,
    ) -> io::Result<()> {
        if !self.lease.ok() {
            return Err(crate::owner::lapsed());
        }
        let req = IoReq {
            offset: self.member_off(off),
            kind: IoKind::Zero { len, punch },
            class: IoClass::Foreground,
        };
        let tags = self
            .tags_begin_write(m, off, crate::integrity::NewTags::Zeros(len))
            .await?;
        let r = dev::io(&m.dev, req).await;
        self.tags_end_write(m, tags, r.is_ok()).await;
        r?;
        if m.is_file {
            // Zeroing by writing (the last resort) would grow a truncated file.
            self.check_size(m)?;
        }
        Ok(())
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
    /// A checksum mismatch is counted apart (see `note_checksum_error`).
    pub(crate) async fn note_read_error(&self, m: &Arc<Member>, e: &io::Error) {
        if let Some(x) = crate::integrity::mismatch_of(e) {
            return self.note_checksum_error(m, x).await;
        }
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
        why: Why,
    ) -> WriteFault {
        if crate::owner::is_lapsed(e) {
            // Refused by the ownership lease: the member is fine, this head may not write.
            return WriteFault::Failed;
        }
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
        Error::NoSpace(
            Msg::new(format!(
                "'{}': no space left on the file system of {}: the write did not complete (no member was failed)",
                self.name,
                who.join(", ")
            ))
            .or(Step::say("free space there and write again"))
            .or(Step::Preallocate),
        )
    }

    /// Write to every target concurrently. Members that fail are failed (the write still
    /// succeeds while the array holds the data); members whose file system is full are
    /// not, but the write then fails with [`Error::NoSpace`], and the stripe `key`, which
    /// it may have reached on some members only, is recorded as inconsistent until
    /// resynced.
    pub(crate) async fn write_targets(
        &self,
        targets: Vec<Target>,
        fua: bool,
        class: IoClass,
        key: Option<StripeAddr>,
    ) -> Result<()> {
        let out = self.write_each(targets, fua, class).await;
        self.write_outcome(&out, key)
    }

    /// The outcome of writes to targets (the caller's verdict on them): an error if the array failed, or NoSpace (after
    /// recording the stripe `key` as inconsistent) if a member was out of space.
    pub(crate) fn write_outcome(&self, out: &Written, key: Option<StripeAddr>) -> Result<()> {
        if !out.any_failed {
            return Ok(());
        }
        self.failed()?;
        if !self.lease.ok() {
            return Err(self.lease.error(&self.name));
        }
        if let Some(off) = out.region {
            if let Some(a) = key {
                self.mark_unsynced(a, off);
            }
            return Err(self.nospace_error(&out.full));
        }
        Ok(())
    }

    /// Write to every target concurrently and judge each failure (see `write_failed`).
    /// While the array has a log, the writes' record goes to it first (docs/RELIABILITY.md,
    /// "Sync modes and the log"): once it is durable there, the members are written
    /// without FUA and the record is marked applied, whatever the writes' outcome.
    pub(crate) async fn write_each(
        &self,
        targets: Vec<Target>,
        fua: bool,
        class: IoClass,
    ) -> Written {
        let Some(log) = self.journal() else {
            return self.write_now(targets, fua, class).await;
        };
        let mut out = Written::default();
        for (round, record) in rounds_of(targets, log.max_record()) {
            let written = match self.log_append(&log, &record, fua).await {
                Via::Log(t) => {
                    let w = self.write_now(round, false, class).await;
                    t.applied();
                    w
                }
                Via::Pool(fua) => self.write_now(round, fua, class).await,
            };
            out.add(written);
        }
        out
    }

    async fn write_now(&self, targets: Vec<Target>, fua: bool, class: IoClass) -> Written {
        let futs = targets.into_iter().map(|t| async move {
            let r = self
                .mwrite_summed(&t.member, t.offset, t.buf, t.crcs.as_deref(), fua, class)
                .await;
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
                    push_once(&mut out.full, m);
                }
            }
        }
        out
    }

    /// The log client writes go through first, while the array has one.
    fn journal(&self) -> Option<Arc<Log>> {
        self.owner.upgrade().and_then(|o| o.journal())
    }

    /// Append a record of member writes: `Via::Log` once it is durable, else how to write
    /// in the pool. A failed log is recorded as failed (once what it acknowledged is in the
    /// pool) and the write goes in the pool with its own FUA; a log being removed has
    /// stopped taking records (the client's FLUSHes no longer skip the pool then, but the
    /// write may have been acknowledged as durable by one): FUA.
    async fn log_append(&self, log: &Arc<Log>, writes: &[log::Write], fua: bool) -> Via {
        match log.append(writes).await {
            Ok(t) => Via::Log(t),
            Err(LogError::Closed) => Via::Pool(true),
            Err(e) => {
                if !matches!(e, LogError::Failed(_)) {
                    // The engine's fault (a record it cannot log): writing around the log
                    // would let an older record's replay overwrite this write, so the log
                    // stops, as if its devices had failed.
                    tracing::error!(array = %self.name, "the log refused a record: {e}");
                    log.fail(format!("a record was refused: {e}"));
                }
                if let Some(o) = self.owner.upgrade() {
                    o.log_failed().await;
                }
                Via::Pool(fua)
            }
        }
    }

    /// Issue reads concurrently; count errors. True if all succeeded. (A write's reads: one
    /// that fails sends the write to its degraded plan, which reads the stripe again and
    /// judges a checksum mismatch there, see `DataPath::heal`; only other errors count now.)
    pub(crate) async fn read_all(
        &self,
        reads: Vec<(Arc<Member>, u64, SharedBuf)>,
        class: IoClass,
    ) -> bool {
        let futs = reads.into_iter().map(|(m, off, b)| async move {
            let r = self.mread(&m, off, b, class).await;
            (m, r)
        });
        let mut ok = true;
        for (m, r) in futures::future::join_all(futs).await {
            if let Err(e) = r {
                self.note_read_error_to_heal(&m, &e).await;
                ok = false;
            }
        }
        ok
    }

    /// Zero a member range of every write target of `slot`. A refusal for space records
    /// the stripe `key` as inconsistent (copies may differ) and fails with NoSpace.
    pub(crate) async fn zero_slot(
        &self,
        slot: usize,
        moff: u64,
        len: u64,
        punch: bool,
        key: Option<StripeAddr>,
    ) -> Result<()> {
        self.zero_slots(&[slot], moff, len, punch, key).await
    }

    /// Zero a member range of every write target of each of `slots` (a stripe's members:
    /// one record in the log, as for a write). A refusal for space records the stripe
    /// `key` as inconsistent and fails with NoSpace.
    pub(crate) async fn zero_slots(
        &self,
        slots: &[usize],
        moff: u64,
        len: u64,
        punch: bool,
        key: Option<StripeAddr>,
    ) -> Result<()> {
        let st = self.state.load_full();
        let members: Vec<Arc<Member>> = slots
            .iter()
            .flat_map(|&s| st.slots[s].write_targets().cloned())
            .collect();
        let mut full = Vec::new();
        let log = self.journal();
        let piece = if log.is_some() { ZERO_PIECE } else { len };
        let mut at = 0;
        while at < len {
            let n = piece.min(len - at);
            let ticket = match &log {
                Some(log) => {
                    let writes: Vec<log::Write> = slots
                        .iter()
                        .map(|&s| log::Write {
                            slot: s as u32,
                            offset: moff + at,
                            data: log::Data::Zero(n as u32),
                        })
                        .collect();
                    // Zeroing has no FUA of its own (write_zeroes flushes for it).
                    match self.log_append(log, &writes, false).await {
                        Via::Log(t) => Some(t),
                        Via::Pool(_) => None,
                    }
                }
                None => None,
            };
            let futs = members
                .iter()
                .map(|m| async move { (m.clone(), self.mzero(m, moff + at, n, punch).await) });
            for (m, r) in futures::future::join_all(futs).await {
                if let Err(e) = r {
                    if self.write_failed(&m, &e, crate::reason::WRITE_ERROR).await
                        == WriteFault::NoSpace
                    {
                        push_once(&mut full, m);
                    }
                }
            }
            if let Some(t) = ticket {
                t.applied();
            }
            at += n;
        }
        self.failed()?;
        if !full.is_empty() {
            // Zeroing that was refused leaves old data (and a consistent stripe: zeroing
            // by writing is planned as a write and goes through `write_targets`), except
            // where copies differ: resync them like any inconsistent stripe.
            if let Some(a) = key {
                self.mark_unsynced(a, moff);
            }
            return Err(self.nospace_error(&full));
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

    /// Make every acknowledged write durable on every member.
    pub async fn flush(&self) -> Result<()> {
        if self.read_only.load(Ordering::Acquire) {
            // A rescue writes nothing: nothing to make durable.
            return Ok(());
        }
        self.failed()?;
        if !self.lease.ok() {
            return Err(self.lease.error(&self.name));
        }
        // The checksums of what this flush makes durable go with it.
        self.tags_write_back().await?;
        let st = self.state.load_full();
        let members: Vec<Arc<Member>> = st
            .slots
            .iter()
            .flat_map(|s| s.write_targets())
            .cloned()
            .collect();
        // Counted while in flight (dropped or not), for a stop to show.
        struct Flushing<'a>(&'a AtomicU64);
        impl Drop for Flushing<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::Relaxed);
            }
        }
        let futs = members.iter().map(|m| async move {
            m.stats.flushing.fetch_add(1, Ordering::Relaxed);
            let _f = Flushing(&m.stats.flushing);
            (m.clone(), dev::flush(&m.dev).await)
        });
        for (m, r) in futures::future::join_all(futs).await {
            if let Err(e) = r {
                // Even out of space: a flush that fails may have dropped written data
                // (the kernel forgets pages it could not write back), so the member failed.
                m.stats.write_errors.fetch_add(1, Ordering::Relaxed);
                tracing::error!(member = %m.path, error = %e, "flush failed");
                self.fail_member(&m, crate::reason::FLUSH_ERROR).await;
            }
        }
        self.failed()
    }
}
