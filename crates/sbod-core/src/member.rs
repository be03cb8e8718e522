//! The members of a running array and its membership snapshot: what every layer of the
//! engine reads (the data path, the RAID families, the background processes) and only
//! membership changes write, by swapping in a new [`State`].

use crate::dev::BlockDev;
use crate::superblock::{MemberEntry, OutRecord, Role, SlotState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use uuid::Uuid;

/// Milliseconds since the engine's clock started (the first call), plus one: the time a
/// member's counters record (`MemberStats::fg_at`), one atomic store a request.
pub fn clock_ms() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_millis() as u64
        + 1
}

impl MemberStats {
    /// Count a client (foreground) request.
    pub(crate) fn client_request(&self) {
        self.fg_ops.fetch_add(1, Ordering::Relaxed);
        self.fg_at.store(clock_ms(), Ordering::Relaxed);
    }

    /// How long ago it last had a client request (None: never, since the process started).
    pub fn client_idle(&self) -> Option<std::time::Duration> {
        match self.fg_at.load(Ordering::Relaxed) {
            0 => None,
            at => Some(std::time::Duration::from_millis(
                clock_ms().saturating_sub(at),
            )),
        }
    }
}

/// Per-member counters (the pool view's read/write/checksum columns).
#[derive(Default, Debug)]
pub struct MemberStats {
    pub reads: AtomicU64,
    pub writes: AtomicU64,
    pub read_bytes: AtomicU64,
    pub write_bytes: AtomicU64,
    pub read_errors: AtomicU64,
    pub write_errors: AtomicU64,
    /// Blocks it returned wrong (they failed their checksums, and redundancy showed the
    /// data wrong, or could not say).
    pub checksum_errors: AtomicU64,
    /// Blocks whose checksum (tag) was wrong over right data (redundancy showed the data
    /// right): the tag was rewritten. Damage to the tag region, never held against the
    /// member.
    pub tag_errors: AtomicU64,
    /// Sectors rewritten after a read error or a scrub found them bad.
    pub repaired: AtomicU64,
    /// Foreground requests submitted (background processes watch this to yield).
    pub fg_ops: AtomicU64,
    /// When it last had one ([`clock_ms`]; 0: never since the process started): a
    /// process that starts can tell clients idle for a while from clients that just came.
    pub fg_at: AtomicU64,
    /// Writes its file system refused for want of space (ENOSPC, EDQUOT): not failures of
    /// the member, which stays in service.
    pub nospace: AtomicU64,
    /// Why the engine took it out of service, once it has (see `reason`).
    pub out_reason: parking_lot::Mutex<Option<String>>,
    /// Flushes sent to it and not answered yet: a drive destaging its write cache keeps
    /// one for seconds to minutes, which a stop shows (`Array::closing_stage`).
    pub flushing: AtomicU64,
}

/// An open member.
pub struct Member {
    pub dev: Arc<dyn BlockDev>,
    pub uuid: Uuid,
    pub path: String,
    pub domain: String,
    /// Data bytes this member holds (concat members may differ).
    pub size: u64,
    pub is_file: bool,
    /// Shared with the member's next incarnation (a grow that gives it more space makes
    /// a new `Member` of the same device): the counters and the checksum cache (which
    /// may hold tags not yet written back) stay one.
    pub stats: Arc<MemberStats>,
    /// Its cached checksums (arrays with `--integrity`; see `integrity`).
    pub tags: Arc<crate::integrity::MemberTags>,
}

impl Member {
    /// The same member: the same open device under the same identity (also across a
    /// grow that gave it more space, see [`Member::resized`]).
    pub(crate) fn same(&self, other: &Member) -> bool {
        Arc::ptr_eq(&self.dev, &other.dev) && self.uuid == other.uuid
    }

    /// This member holding `size` data bytes: the same device, identity, counters and
    /// checksum cache (`sbod grow --size`).
    pub(crate) fn resized(&self, size: u64) -> Arc<Member> {
        Arc::new(Member {
            dev: self.dev.clone(),
            uuid: self.uuid,
            path: self.path.clone(),
            domain: self.domain.clone(),
            size,
            is_file: self.is_file,
            stats: self.stats.clone(),
            tags: self.tags.clone(),
        })
    }

    pub(crate) fn entry(&self) -> MemberEntry {
        MemberEntry {
            uuid: self.uuid,
            domain: self.domain.clone(),
            size: self.size,
        }
    }
}

/// One slot of the running array.
#[derive(Clone)]
pub struct SlotRt {
    /// Who the array records in this slot (also when the device is gone).
    pub entry: Option<MemberEntry>,
    /// The open device, if any.
    pub member: Option<Arc<Member>>,
    pub state: SlotState,
    /// Rebuilding: valid below this member offset. Shared across snapshots so the rebuild
    /// advances it without swapping state.
    pub recovery: Arc<AtomicU64>,
    /// A member being rebuilt to take this slot over (replace), with its progress.
    pub replacement: Option<(Arc<Member>, Arc<AtomicU64>)>,
    /// Failed: why. Rebuilding: why it is being recovered. Persisted.
    pub out: Option<OutRecord>,
    /// Rebuilding only the regions the write-intent bitmap marks. Persisted.
    pub bitmap_recovery: bool,
    /// Details for status ("stale: event 4, array at 6; ..."), not persisted.
    pub note: Option<Arc<str>>,
}

impl SlotRt {
    /// Can data at member offsets below `end` be read from this slot?
    pub fn readable(&self, end: u64) -> Option<&Arc<Member>> {
        match self.state {
            SlotState::Active => self.member.as_ref(),
            SlotState::Rebuilding if self.recovery.load(Ordering::Acquire) >= end => {
                self.member.as_ref()
            }
            _ => None,
        }
    }

    /// The devices a write to this slot must reach.
    pub fn write_targets(&self) -> impl Iterator<Item = &Arc<Member>> {
        let main = match self.state {
            SlotState::Active | SlotState::Rebuilding => self.member.as_ref(),
            _ => None,
        };
        main.into_iter()
            .chain(self.replacement.as_ref().map(|(m, _)| m))
    }
}

/// An immutable snapshot of the array's membership.
#[derive(Clone)]
pub struct State {
    pub slots: Vec<SlotRt>,
    pub spares: Vec<Arc<Member>>,
    /// Why the array has failed, if it has.
    pub failed: Option<String>,
}

impl State {
    /// Every open member the array still relies on (gets superblocks and flushes).
    pub fn live_members(&self) -> Vec<Arc<Member>> {
        let mut v: Vec<Arc<Member>> = Vec::new();
        for s in &self.slots {
            if matches!(s.state, SlotState::Active | SlotState::Rebuilding) {
                if let Some(m) = &s.member {
                    v.push(m.clone());
                }
            }
            if let Some((m, _)) = &s.replacement {
                v.push(m.clone());
            }
        }
        v.extend(self.spares.iter().cloned());
        v
    }

    pub fn find(&self, who: &str) -> Option<(Role, Arc<Member>)> {
        let hit = |m: &Arc<Member>| m.path == who || m.uuid.to_string() == who;
        for (i, s) in self.slots.iter().enumerate() {
            if let Some(m) = s.member.as_ref().filter(|m| hit(m)) {
                return Some((Role::Slot(i), m.clone()));
            }
            if let Some((m, _)) = s.replacement.as_ref().filter(|(m, _)| hit(m)) {
                return Some((Role::Replacement(i), m.clone()));
            }
        }
        self.spares
            .iter()
            .find(|m| hit(m))
            .map(|m| (Role::Spare, m.clone()))
    }
}

/// A device offered to the engine.
pub struct MemberSpec {
    pub dev: Arc<dyn BlockDev>,
    pub path: String,
    pub is_file: bool,
    /// Failure domain label (create/add only; assembly reads it from the superblock).
    pub domain: String,
}
