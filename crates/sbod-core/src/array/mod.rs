//! The array: one core that owns the members, their state and the background processes,
//! as SPDK's raid bdev does, split by concept:
//!
//! - [`create`] and [`assemble`]: an array made new, or put together from its members'
//!   superblocks (which copy is trusted is judged by [`crate::freshness`]);
//! - [`membership`]: members failing, added, removed, replaced, re-added, spares taken;
//! - [`persist`]: the superblock every member carries, and stopping;
//! - [`io`]: the client's requests, handed to the array's RAID family;
//! - [`process`]: the background-task owner (rebuild, scrub, resync, the bitmap sweeper);
//! - [`status`]: what `sbod status` shows.
//!
//! The data path's shared state ([`DataPath`]: members, locks, the write-intent bitmap,
//! member I/O) is below all of these, and the RAID families ([`crate::family`]) work on it
//! alone; an `Array` derefs to its `DataPath`.

pub mod assemble;
pub mod create;
mod grow;
mod io;
mod log;
pub mod membership;
mod ownership;
mod persist;
pub mod process;
mod status;
mod sync;

pub use assemble::AssembleOptions;
pub use create::{check_blank, CreateSpec, MAX_CHUNK, MAX_MEMBER_DATA, MIN_CHUNK};
pub use grow::{GrowOutcome, SizeTarget};
pub use membership::{AddOutcome, ReAdd};
pub use sbod_types::{
    ArrayState, AssemblyReport, MemberState, MemberStatus, RecoveryStatus, RescueReport, Settings,
    StaleMember, Status,
};

pub use crate::member::{Member, MemberSpec, MemberStats, SlotRt, State};

use crate::bitmap::Bitmap;
use crate::buf::AlignedBuf;
use crate::datapath::{DataPath, Membership};
use crate::dev::{self, BlockDev, IoClass};
use crate::error::{Error, Result};
use crate::family::Personality;
use crate::layout::Geometry;
use crate::placement::Placement;
use crate::reason::Why;
use crate::superblock::{self, Extension, SessionRec, Superblock};
use arc_swap::ArcSwap;
use membership::RecoveryLog;
use process::Background;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;
use uuid::Uuid;

pub struct Array {
    /// The view of the volume the array runs (its data path and RAID family): one for the
    /// array's life, swapped only when a reshape ends (see [`Core`]).
    core: ArcSwap<Core>,
    /// What every view shares (the members, bitmap, settings, lease).
    shared: Arc<crate::datapath::Shared>,
    pub uuid: Uuid,
    pub created: u64,
    /// Serialises state changes and superblock writes (never taken by plain I/O).
    pub(crate) mgmt: tokio::sync::Mutex<()>,
    pub(crate) event: AtomicU64,
    pub(crate) closed: AtomicBool,
    /// What `close` is doing now (see [`Closing`]).
    pub(crate) closing: persist::Closing,
    pub(crate) report: parking_lot::Mutex<AssemblyReport>,
    pub(crate) lineage: Lineage,
    pub(crate) recoveries: parking_lot::Mutex<Vec<Arc<RecoveryLog>>>,
    /// Started for a rescue: reads only.
    pub(crate) rescue: AtomicBool,
    /// The background processes and tasks.
    pub(crate) bg: Background,
    /// What FLUSH and FUA do, and the log devices (see `sync`).
    pub(crate) sync: crate::sync::SyncState,
    /// This head's hold on the members: its heartbeat (see `owner`).
    pub(crate) ownership: ownership::Ownership,
    /// Every client request holds a pass while it runs; a grow swaps the view of the
    /// volume only with every pass held (see `grow`).
    pub(crate) gate: crate::locks::ViewGate,
    /// The reshape running, if any (see `process::reshape`).
    pub(crate) reshape: process::reshape::Slot,
    /// Fault-injection tests' hook into the reshape's steps.
    pub(crate) reshape_hook: parking_lot::Mutex<Option<process::reshape::Hook>>,
}

/// One view of the volume: the data path the families and processes work on, and the
/// RAID family of its geometry. An array keeps one for its life; a reshape builds the new
/// layout's beside it and swaps it in when every byte has moved (`reshape`).
pub(crate) struct Core {
    pub dp: DataPath,
    pub family: Personality,
}

tokio::task_local! {
    /// A view a task works in instead of the array's own: the resync after a crash during
    /// a reshape judges the stripes of the old layout in the old layout's view.
    static VIEW: Arc<Core>;
}

/// Run `f` with `view` as the array's view for everything it calls (see [`VIEW`]).
pub(crate) async fn in_view<F: std::future::Future>(view: Arc<Core>, f: F) -> F::Output {
    VIEW.scope(view, f).await
}

enum Loaded {
    Cur(arc_swap::Guard<Arc<Core>>),
    Scoped(Arc<Core>),
}

impl std::ops::Deref for Loaded {
    type Target = Core;
    fn deref(&self) -> &Core {
        match self {
            Loaded::Cur(g) => g,
            Loaded::Scoped(c) => c,
        }
    }
}

/// A loaded view of the data path (see [`Array::dp`]).
pub(crate) struct DpRef(Loaded);

impl std::ops::Deref for DpRef {
    type Target = DataPath;
    fn deref(&self) -> &DataPath {
        &self.0.dp
    }
}

/// A loaded view of the RAID family (see [`Array::fam`]).
pub(crate) struct FamRef(Loaded);

impl std::ops::Deref for FamRef {
    type Target = Personality;
    fn deref(&self) -> &Personality {
        &self.0.family
    }
}

impl Array {
    fn loaded(&self) -> Loaded {
        match VIEW.try_with(|c| c.clone()) {
            Ok(c) => Loaded::Scoped(c),
            Err(_) => Loaded::Cur(self.core.load()),
        }
    }

    /// The data path of the view in force.
    pub(crate) fn dp(&self) -> DpRef {
        DpRef(self.loaded())
    }

    /// The RAID family of the view in force.
    pub(crate) fn fam(&self) -> FamRef {
        FamRef(self.loaded())
    }
}

/// What the array shows of itself. The data path it shares with the families and the
/// background processes (`dp`, private to `array/`) is not its public face: what the rest
/// of sbod may know of it is here.
impl Array {
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The count of client writes a server has received for this array and not finished
    /// yet: a server adds one when a write's request arrives (before its payload) and takes
    /// it off once the write is done. A hint only (a sequential stream's split stripe
    /// waits for the next request's half while the count says one is here, see
    /// `family/parity/coalesce.rs`); a count left high costs waits, never data.
    pub fn queued_writes(&self) -> Arc<std::sync::atomic::AtomicUsize> {
        self.shared.queued_writes.clone()
    }

    pub fn geometry(&self) -> Geometry {
        self.dp().geometry.clone()
    }

    /// Volume size in bytes.
    pub fn size(&self) -> u64 {
        self.dp().size()
    }

    /// The membership snapshot now.
    pub fn state(&self) -> Arc<State> {
        self.dp().state()
    }

    /// Started read-only (a rescue, or only looking).
    pub fn is_read_only(&self) -> bool {
        self.dp().is_read_only()
    }

    /// The checksums the array keeps on every block.
    pub fn integrity(&self) -> crate::integrity::Kind {
        self.dp().integrity()
    }

    /// Where the members keep the checksums of their blocks, if they do.
    pub fn tag_layout(&self) -> Option<crate::integrity::TagLayout> {
        self.dp().tag_layout()
    }

    /// Where every volume byte lives (the one map).
    pub fn placement(&self) -> Placement {
        self.dp().placement().clone()
    }

    /// Flush every member (and write back their checksums), whatever the sync mode: the
    /// engine's durable flush. A client's FLUSH is `client_flush`.
    pub async fn flush(&self) -> Result<()> {
        self.dp().flush().await
    }

    /// The settings in force (`sbod set`).
    pub fn settings(&self) -> Settings {
        self.shared.settings.lock().clone()
    }

    /// Change the settings in force; returns them as changed.
    pub fn update_settings(&self, change: impl FnOnce(&mut Settings)) -> Settings {
        let mut s = self.shared.settings.lock();
        change(&mut s);
        s.clone()
    }
}

impl Membership for Array {
    fn fail_member<'a>(
        &'a self,
        m: &'a Arc<Member>,
        why: Why,
    ) -> futures::future::BoxFuture<'a, ()> {
        Box::pin(Array::fail_member(self, m, why))
    }

    fn journal(&self) -> Option<Arc<crate::log::Log>> {
        self.sync.log.current()
    }

    fn log_failed(&self) -> futures::future::BoxFuture<'_, ()> {
        Box::pin(async move {
            if let Err(e) = Array::log_failed(self).await {
                // The pool could not be flushed: the array failed, as the write will say.
                tracing::error!(array = %self.dp().name, "recording the failed log: {e}");
            }
        })
    }
}

/// Where the array's lineage stands (see `freshness`).
pub(crate) struct Lineage {
    /// This start's session and the ones before it.
    pub session: Uuid,
    pub history: Vec<SessionRec>,
    /// Every write since this event has its bit set in the bitmap.
    pub bitmap_since: AtomicU64,
    /// Where the checksum tags live (record `superblock::TAG_CHECKSUMS`), if any.
    pub tags: Option<crate::superblock::TagLayout>,
    /// Extension records of a newer sbod, written back unchanged.
    pub extensions: Vec<Extension>,
}

impl Lineage {
    /// A new session starting with the superblock write of `event`, after `before`.
    fn start(before: &[SessionRec], event: u64) -> (Uuid, Vec<SessionRec>) {
        let id = Uuid::new_v4();
        let mut history = before.to_vec();
        history.push(SessionRec {
            id,
            start_event: event,
            started: now_secs(),
        });
        let skip = history.len().saturating_sub(superblock::MAX_HISTORY);
        history.drain(..skip);
        (id, history)
    }
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Read the metadata area of a device and decode its superblock.
pub async fn read_superblock(dev: &Arc<dyn BlockDev>) -> Result<Superblock> {
    let want = 2 * superblock::COPY_SIZE;
    if dev.size() < want as u64 {
        return Err(Error::Invalid(
            format!("{} is too small to be an sbod member", dev.name()).into(),
        ));
    }
    let buf = AlignedBuf::zeroed(want).into_shared();
    dev::read_at(dev, 0, buf.clone(), IoClass::Foreground)
        .await
        .map_err(|e| Error::io(format!("reading the superblock of {}", dev.name()), e))?;
    let buf = buf.try_unwrap().expect("sole owner");
    Superblock::decode_area(&buf).map_err(|e| Error::Invalid(format!("{}: {e}", dev.name()).into()))
}

impl Array {
    /// The running array for a geometry, membership and lineage (create and assemble
    /// decide them).
    #[allow(clippy::too_many_arguments)]
    fn build(
        name: String,
        uuid: Uuid,
        created: u64,
        geometry: Geometry,
        state: State,
        event: u64,
        region: u64,
        bitmap_bytes: u32,
        resync_offset: u64,
        dirty: &[u64],
        lineage: Lineage,
    ) -> Result<Arc<Array>> {
        let family = Personality::of(&geometry)?;
        let integrity = lineage.tags;
        if let Some(t) = &integrity {
            t.check(&geometry, superblock::BITMAP_OFFSET + bitmap_bytes as u64)
                .map_err(|e| Error::Invalid(e.into()))?;
        }
        // Without redundancy the bitmap covers only checksums (their lazy write-back).
        let bitmap = if geometry.redundancy() > 0 || integrity.is_some() {
            // Sized for all the regions its area holds, not only those in use: a grow
            // (`--size`) uses more of the members without a new bitmap.
            let cover = (bitmap_bytes as u64 * 8).saturating_mul(region);
            Some(Bitmap::new(region, cover.max(geometry.member_size), dirty))
        } else {
            None
        };
        let sizes: Vec<u64> = state
            .slots
            .iter()
            .map(|s| s.entry.as_ref().map(|e| e.size).unwrap_or(0))
            .collect();
        Ok(Arc::new_cyclic(|me: &std::sync::Weak<Array>| {
            let owner: std::sync::Weak<dyn Membership> = me.clone();
            let shared = Arc::new(crate::datapath::Shared {
                name,
                state: ArcSwap::from_pointee(state),
                bitmap,
                bitmap_bytes,
                closing: AtomicBool::new(false),
                read_only: AtomicBool::new(false),
                settings: parking_lot::Mutex::new(Settings::default()),
                owner,
                integrity,
                crash_resync: AtomicBool::new(false),
                lease: Default::default(),
                queued_writes: Default::default(),
            });
            let dp = DataPath::view(shared.clone(), geometry, &sizes, resync_offset);
            Array {
                core: ArcSwap::from_pointee(Core { dp, family }),
                shared,
                uuid,
                created,
                mgmt: tokio::sync::Mutex::new(()),
                event: AtomicU64::new(event),
                closed: AtomicBool::new(false),
                closing: Default::default(),
                report: parking_lot::Mutex::new(AssemblyReport::default()),
                lineage,
                recoveries: parking_lot::Mutex::new(Vec::new()),
                rescue: AtomicBool::new(false),
                bg: Background::default(),
                sync: Default::default(),
                ownership: Default::default(),
                gate: Default::default(),
                reshape: ArcSwap::from_pointee(None),
                reshape_hook: parking_lot::Mutex::new(None),
            }
        }))
    }

    /// Wake the background supervisor (and the sweeper) to look at the state again.
    /// `notify_waiters`, not `notify_one`: both loops wait on `wake`, and `notify_one` could
    /// hand the wake-up to the sweeper instead of the supervisor (a spare then waited 5 s to
    /// start). A `Notified` created before this call sees it even if not yet polled.
    pub(crate) fn kick(&self) {
        self.bg.wake.notify_waiters();
    }

    pub fn report(&self) -> AssemblyReport {
        self.report.lock().clone()
    }
}
