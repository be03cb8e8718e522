//! The array: members, their state, assembly, persistence and management.

use crate::bitmap::Bitmap;
use crate::buf::AlignedBuf;
use crate::dev::{self, BlockDev, IoClass};
use crate::error::{Error, Result};
use crate::freshness::{self, Verdict};
use crate::layout::{Geometry, Level, Scheme};
use crate::locks::StripeLocks;
use crate::membership::{stale_note, utc};
use crate::process::ProcessHandle;
use crate::reason::{self, Why};
use crate::superblock::{
    self, Extension, MemberEntry, OutReason, OutRecord, Role, SessionRec, Slot, SlotState,
    Superblock,
};
use arc_swap::ArcSwap;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use uuid::Uuid;

/// Per-member counters (the pool view's read/write/checksum columns).
#[derive(Default, Debug)]
pub struct MemberStats {
    pub reads: AtomicU64,
    pub writes: AtomicU64,
    pub read_bytes: AtomicU64,
    pub write_bytes: AtomicU64,
    pub read_errors: AtomicU64,
    pub write_errors: AtomicU64,
    pub checksum_errors: AtomicU64,
    /// Sectors rewritten after a read error or a scrub found them bad.
    pub repaired: AtomicU64,
    /// Foreground requests submitted (background processes watch this to yield).
    pub fg_ops: AtomicU64,
    /// Writes its file system refused for want of space (ENOSPC, EDQUOT): not failures of
    /// the member, which stays in service.
    pub nospace: AtomicU64,
    /// Why the engine took it out of service, once it has (see `reason`).
    pub out_reason: parking_lot::Mutex<Option<String>>,
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
    pub stats: MemberStats,
}

impl Member {
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

#[derive(Clone, Debug)]
pub struct CreateSpec {
    pub name: String,
    pub level: Level,
    pub chunk: u32,
    /// Redundancy groups (RAID50/60); raid10 derives its groups from `copies`.
    pub groups: u32,
    /// How many of the given members are hot spares (the last ones).
    pub spares: usize,
    /// Mirror copies for raid10 (default 2).
    pub copies: u32,
    pub bitmap_region: Option<u64>,
    /// Members are known to be zero (freshly created files) or the user says parity is in
    /// sync: skip the initial resync.
    pub assume_clean: bool,
    pub force: bool,
}

impl CreateSpec {
    /// Check every value of the layout that does not depend on the members' sizes, for
    /// `members` devices (spares included), before anything is created or written: a
    /// clear error naming the option and what would work. Returns (groups, width).
    pub fn check(&self, members: usize) -> Result<(u32, u32)> {
        let bad = |m: String| Err(Error::Invalid(m));
        if self.name.is_empty() || self.name.len() > superblock::MAX_NAME {
            return bad(format!(
                "array names are 1 to {} bytes",
                superblock::MAX_NAME
            ));
        }
        if !self
            .name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        {
            return bad(format!(
                "array name '{}' may only contain letters, digits, '-', '_' and '.'",
                self.name
            ));
        }
        let chunk = self.chunk as u64;
        if !chunk.is_power_of_two() || !(MIN_CHUNK..=MAX_CHUNK).contains(&chunk) {
            return bad(format!(
                "--chunk {}: the chunk is a power of two from 4K to 16M (64K is a good default)",
                if chunk < 1024 {
                    chunk.to_string()
                } else {
                    crate::layout::human(chunk)
                }
            ));
        }
        if self.groups == 0 {
            return bad("--groups 0: an array has at least one group (the default, 1)".into());
        }
        if members == 0 {
            return bad("no members given".into());
        }
        if self.spares >= members {
            return bad(format!(
                "{members} members with --spares {} leaves none for data",
                self.spares
            ));
        }
        let data_members = members - self.spares;
        let groups = match self.level {
            Level::Raid10 => {
                if self.groups > 1 {
                    return bad(
                        "raid10 forms its groups from --copies (mirror sets); drop --groups".into(),
                    );
                }
                let c = self.copies as usize;
                if c < 2 {
                    return bad(format!(
                        "--copies {c}: a mirror set holds at least 2 copies (2 is the default)"
                    ));
                }
                if !data_members.is_multiple_of(c) {
                    return bad(format!(
                        "raid10 with {c} copies needs a multiple of {c} members, not {data_members}"
                    ));
                }
                (data_members / c) as u32
            }
            Level::Concat | Level::Raid0 if self.groups > 1 => {
                return bad(format!("{} does not take --groups", self.level));
            }
            _ => self.groups,
        };
        if !data_members.is_multiple_of(groups as usize) {
            let ok: Vec<String> = (1..=data_members)
                .filter(|g| data_members.is_multiple_of(*g))
                .map(|g| g.to_string())
                .collect();
            return bad(format!(
                "{data_members} members don't split into {groups} equal groups; {} groups would",
                ok.join(", ")
            ));
        }
        let width = (data_members / groups as usize) as u32;
        if let Some(r) = self.bitmap_region {
            if r == 0 || !r.is_multiple_of(chunk) || r > MAX_MEMBER_DATA {
                return bad(format!(
                    "--bitmap-region {r}: the region is a non-zero multiple of the chunk ({}), e.g. {}",
                    crate::layout::human(chunk),
                    crate::layout::human(chunk.max(1 << 20))
                ));
            }
        }
        // The rest of the layout's rules, on a stand-in size.
        Geometry {
            level: self.level,
            groups,
            width,
            chunk: self.chunk,
            member_size: chunk,
            data_offset: 1 << 20,
        }
        .validate()
        .map_err(Error::Invalid)?;
        Ok((groups, width))
    }
}

/// Chunk limits (power of two in between).
pub const MIN_CHUNK: u64 = 4096;
pub const MAX_CHUNK: u64 = 16 << 20;
/// The most data one member may hold (the layout's limit).
pub const MAX_MEMBER_DATA: u64 = 1 << 60;

#[derive(Clone, Debug, Default)]
pub struct AssembleOptions {
    pub force: bool,
    /// Don't start rebuild/resync processes (tools that run them in the foreground).
    pub no_processes: bool,
    /// Only look: write nothing, resync nothing, start nothing (offline status).
    pub read_only: bool,
    /// Start even though members the array had in service when it stopped are missing
    /// (they are recorded as missing, and recovered from the bitmap when they come back).
    pub degraded: bool,
}

pub use sbod_types::{AssemblyReport, RecoveryStatus, RescueReport, Settings, StaleMember};

/// What `Array::re_add` did.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ReAdd {
    pub slot: usize,
    pub path: String,
    /// Recovered from the write-intent bitmap (only what was written while it was out),
    /// else in full.
    pub bitmap: bool,
    /// The member's own superblock event, and the array's when it came back.
    pub member_event: u64,
    pub array_event: u64,
    /// Bytes of member space the recovery covers (a bound: regions written since).
    pub planned_bytes: u64,
}

/// What `Array::add` did with a device.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AddOutcome {
    /// A hot spare.
    Spare,
    /// A degraded slot took it at once; rebuilt in full.
    Rebuilding { slot: usize },
    /// A former member of this array back in its slot.
    ReAdded(ReAdd),
}

pub(crate) struct RecoveryLog {
    pub slot: usize,
    pub uuid: Uuid,
    pub path: String,
    pub reason: String,
    pub bitmap: bool,
    pub planned: AtomicU64,
    pub done: AtomicU64,
    /// 0 running, 1 done, 2 stopped.
    pub end: std::sync::atomic::AtomicU8,
}

pub struct Array {
    pub name: String,
    pub uuid: Uuid,
    pub created: u64,
    pub geometry: Geometry,
    pub(crate) codec: Option<Arc<sbod_codec::Codec>>,
    pub(crate) state: ArcSwap<State>,
    /// Serialises state changes and superblock writes (never taken by plain I/O).
    pub(crate) mgmt: tokio::sync::Mutex<()>,
    pub(crate) event: AtomicU64,
    pub(crate) locks: StripeLocks,
    pub(crate) bitmap: Option<Bitmap>,
    pub(crate) bitmap_bytes: u32,
    /// Parity known good below this member offset (initial sync in progress otherwise).
    pub(crate) resync_offset: AtomicU64,
    pub(crate) size: u64,
    /// Concat: logical start of each slot.
    pub(crate) concat_starts: Vec<u64>,
    pub(crate) process: parking_lot::Mutex<Option<Arc<ProcessHandle>>>,
    pub(crate) wake: tokio::sync::Notify,
    pub(crate) closing: AtomicBool,
    pub(crate) closed: AtomicBool,
    pub(crate) read_only: AtomicBool,
    pub settings: parking_lot::Mutex<Settings>,
    pub(crate) report: parking_lot::Mutex<AssemblyReport>,
    pub(crate) tasks: parking_lot::Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// This start's session and the ones before it (see `freshness`).
    pub(crate) session: Uuid,
    pub(crate) history: Vec<SessionRec>,
    /// Every write since this event has its bit set in the bitmap (see `freshness`).
    pub(crate) bitmap_since: AtomicU64,
    /// Extension records of a newer sbod, written back unchanged.
    pub(crate) extensions: Vec<Extension>,
    pub(crate) recoveries: parking_lot::Mutex<Vec<Arc<RecoveryLog>>>,
    /// Started for a rescue: reads only.
    pub(crate) rescue: AtomicBool,
    /// What FLUSH and FUA do, and the log devices (see `sync`).
    pub(crate) sync: crate::sync::SyncState,
}

/// Where the array's lineage stands (sessions, bitmap coverage), for `build`.
pub(crate) struct Lineage {
    pub session: Uuid,
    pub history: Vec<SessionRec>,
    pub bitmap_since: u64,
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
        return Err(Error::Invalid(format!(
            "{} is too small to be an sbod member",
            dev.name()
        )));
    }
    let buf = AlignedBuf::zeroed(want).into_shared();
    dev::read_at(dev, 0, buf.clone(), IoClass::Foreground)
        .await
        .map_err(|e| Error::io(format!("reading the superblock of {}", dev.name()), e))?;
    let buf = buf.try_unwrap().expect("sole owner");
    Superblock::decode_area(&buf).map_err(|e| Error::Invalid(format!("{}: {e}", dev.name())))
}

/// Refuse a device that holds anything recognisable, unless forced.
pub async fn check_blank(dev: &Arc<dyn BlockDev>, force: bool) -> Result<()> {
    let n = (crate::signature::PROBE_BYTES as u64).min(dev.size() / 4096 * 4096) as usize;
    if n == 0 {
        return Ok(());
    }
    let buf = AlignedBuf::zeroed(n).into_shared();
    dev::read_at(dev, 0, buf.clone(), IoClass::Foreground)
        .await
        .map_err(|e| Error::io(format!("reading {}", dev.name()), e))?;
    let buf = buf.try_unwrap().expect("sole owner");
    if force {
        return Ok(());
    }
    if let Ok(sb) = Superblock::decode_area(&buf) {
        return Err(Error::Refused(format!(
            "{} is a member of sbod array '{}' ({}); stop that array and wipe the member, or use --force to overwrite it",
            dev.name(),
            sb.name,
            sb.array_uuid
        )));
    }
    if let Some(what) = crate::signature::probe(&buf) {
        return Err(Error::Refused(format!(
            "{} holds {what}; sbod will not overwrite it without --force",
            dev.name()
        )));
    }
    Ok(())
}

/// Write zeros over a new member's whole metadata area (both superblock copies, the
/// bitmap), so that a member file holds the blocks every later superblock and bitmap write
/// lands on: state changes must be recorded even when the file system is full (a
/// superblock that cannot be written fails its member), and sparse files would otherwise
/// allocate the second superblock copy only at the array's second state change.
async fn claim_metadata(dev: &Arc<dyn BlockDev>, data_offset: u64, path: &str) -> Result<()> {
    let zero = AlignedBuf::zeroed(data_offset as usize).into_shared();
    dev::write_at(dev, 0, zero, true, IoClass::Foreground)
        .await
        .map_err(|e| {
            if crate::io::is_nospace(&e) {
                Error::NoSpace(format!(
                    "no space left on the file system of {path} for its metadata: free space there, or give it its space with --preallocate"
                ))
            } else {
                Error::io(format!("writing {path}"), e)
            }
        })
}

/// Default bitmap region: about 1024 regions per member, 1 MiB to 128 MiB, a multiple of
/// the chunk.
fn default_region(member_size: u64, chunk: u32) -> u64 {
    let r = (member_size / 1024)
        .next_power_of_two()
        .clamp(1 << 20, 128 << 20);
    r.max(chunk as u64)
}

impl Array {
    /// Create a new array on `members` (spares last).
    pub async fn create(spec: CreateSpec, members: Vec<MemberSpec>) -> Result<Arc<Array>> {
        let total = members.len();
        let (groups, width) = spec.check(total)?;
        let data_members = total - spec.spares;
        let min_size = members.iter().map(|m| m.dev.size()).min().unwrap_or(0);
        // Metadata: 2 superblock copies, then the bitmap, data 1 MiB aligned.
        let provisional = min_size.saturating_sub(2 << 20) / spec.chunk as u64 * spec.chunk as u64;
        let region = match spec.bitmap_region {
            Some(r) => r, // checked above
            None => default_region(provisional, spec.chunk),
        };
        let bitmap_bytes = Bitmap::bytes_for(provisional.div_ceil(region).max(1));
        let data_offset = (superblock::BITMAP_OFFSET + bitmap_bytes).div_ceil(1 << 20) * (1 << 20);
        let per_member =
            |size: u64| size.saturating_sub(data_offset) / spec.chunk as u64 * spec.chunk as u64;
        let member_size = if spec.level == Level::Concat {
            members
                .iter()
                .map(|m| per_member(m.dev.size()))
                .max()
                .unwrap_or(0)
        } else {
            per_member(min_size)
        };
        let geometry = Geometry {
            level: spec.level,
            groups,
            width,
            chunk: spec.chunk,
            member_size,
            data_offset,
        };
        geometry.validate().map_err(|e| {
            if member_size == 0 {
                Error::Invalid(format!(
                    "members are too small: the smallest has {} and sbod needs more than {} of metadata",
                    crate::layout::human(min_size),
                    crate::layout::human(data_offset)
                ))
            } else {
                Error::Invalid(e)
            }
        })?;
        for m in &members {
            if per_member(m.dev.size()) == 0 {
                return Err(Error::Invalid(format!(
                    "{} is too small to hold data",
                    m.path
                )));
            }
        }
        // Failure domains: no domain may take out more members of a group than it survives.
        let redundancy = geometry.redundancy();
        if !spec.force {
            for g in 0..groups as usize {
                let mut count: HashMap<&str, Vec<&str>> = HashMap::new();
                for m in &members[g * width as usize..(g + 1) * width as usize] {
                    if !m.domain.is_empty() {
                        count.entry(&m.domain).or_default().push(&m.path);
                    }
                }
                for (dom, who) in count {
                    if who.len() > redundancy {
                        return Err(Error::Refused(format!(
                            "failure domain '{dom}' holds {} members of group {g} ({}) but the group survives only {redundancy} failure{}: order the members so each group spans more domains, or use --force",
                            who.len(),
                            who.join(", "),
                            if redundancy == 1 { "" } else { "s" }
                        )));
                    }
                }
            }
        }
        // Refuse devices in use by something else, and duplicates.
        let mut seen = std::collections::HashSet::new();
        for m in &members {
            if !seen.insert(m.path.clone()) {
                return Err(Error::Invalid(format!("{} is given twice", m.path)));
            }
        }
        for m in &members {
            check_blank(&m.dev, spec.force).await?;
        }
        let uuid = Uuid::new_v4();
        let opened: Vec<Arc<Member>> = members
            .into_iter()
            .map(|m| {
                let size = if geometry.level == Level::Concat {
                    per_member(m.dev.size())
                } else {
                    member_size
                };
                Arc::new(Member {
                    dev: m.dev,
                    uuid: Uuid::new_v4(),
                    path: m.path,
                    domain: m.domain,
                    size,
                    is_file: m.is_file,
                    stats: MemberStats::default(),
                })
            })
            .collect();
        let (slot_members, spare_members) = opened.split_at(data_members);
        let state = State {
            slots: slot_members
                .iter()
                .map(|m| SlotRt {
                    entry: Some(m.entry()),
                    member: Some(m.clone()),
                    state: SlotState::Active,
                    recovery: Arc::new(AtomicU64::new(0)),
                    replacement: None,
                    out: None,
                    bitmap_recovery: false,
                    note: None,
                })
                .collect(),
            spares: spare_members.to_vec(),
            failed: None,
        };
        let resync = if spec.assume_clean || geometry.redundancy() == 0 {
            u64::MAX
        } else {
            0
        };
        let (session, history) = Lineage::start(&[], 1);
        let array = Array::build(
            spec.name.clone(),
            uuid,
            now_secs(),
            geometry,
            state,
            0,
            region,
            bitmap_bytes as u32,
            resync,
            &[],
            Lineage {
                session,
                history,
                bitmap_since: 1,
                extensions: Vec::new(),
            },
        )?;
        // Zero the metadata areas (both superblock copies and the bitmap), then write the
        // superblocks.
        let futs = opened
            .iter()
            .map(|m| claim_metadata(&m.dev, data_offset, &m.path));
        futures::future::try_join_all(futs).await?;
        let st = array.state.load_full();
        let failed = array.persist(&st, false).await;
        if !failed.is_empty() {
            return Err(Error::Invalid(format!(
                "could not write the superblock to {}",
                failed
                    .iter()
                    .map(|m| m.path.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        array.start_processes();
        Ok(array)
    }

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
        let codec = match geometry.codec_scheme() {
            Some(s) => Some(Arc::new(
                sbod_codec::Codec::new(s).map_err(|e| Error::Invalid(e.to_string()))?,
            )),
            None => None,
        };
        let bitmap = if geometry.redundancy() > 0 {
            Some(Bitmap::new(region, geometry.member_size, dirty))
        } else {
            None
        };
        let (size, concat_starts) = if geometry.level == Level::Concat {
            let mut starts = Vec::new();
            let mut pos = 0;
            for s in &state.slots {
                starts.push(pos);
                pos += s.entry.as_ref().map(|e| e.size).unwrap_or(0);
            }
            (pos, starts)
        } else {
            (geometry.capacity(), Vec::new())
        };
        Ok(Arc::new(Array {
            name,
            uuid,
            created,
            geometry,
            codec,
            state: ArcSwap::from_pointee(state),
            mgmt: tokio::sync::Mutex::new(()),
            event: AtomicU64::new(event),
            locks: StripeLocks::default(),
            bitmap,
            bitmap_bytes,
            resync_offset: AtomicU64::new(resync_offset),
            size,
            concat_starts,
            process: parking_lot::Mutex::new(None),
            wake: tokio::sync::Notify::new(),
            closing: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            read_only: AtomicBool::new(false),
            settings: parking_lot::Mutex::new(Settings::default()),
            report: parking_lot::Mutex::new(AssemblyReport::default()),
            tasks: parking_lot::Mutex::new(Vec::new()),
            session: lineage.session,
            history: lineage.history,
            bitmap_since: AtomicU64::new(lineage.bitmap_since),
            extensions: lineage.extensions,
            recoveries: parking_lot::Mutex::new(Vec::new()),
            rescue: AtomicBool::new(false),
            sync: Default::default(),
        }))
    }

    /// Assemble an array from its members' superblocks.
    pub async fn assemble(members: Vec<MemberSpec>, opts: AssembleOptions) -> Result<Arc<Array>> {
        if members.is_empty() {
            return Err(Error::Invalid("no members given".into()));
        }
        let (members, logs) = crate::log::attach::split(members).await;
        let mut found: Vec<(MemberSpec, Superblock)> = Vec::new();
        let mut report = AssemblyReport::default();
        for m in members {
            match read_superblock(&m.dev).await {
                Ok(sb) => found.push((m, sb)),
                Err(e) => {
                    return Err(Error::Refused(format!(
                        "{e}; if {} is not an sbod member, leave it out",
                        m.path
                    )))
                }
            }
        }
        // All members must belong to one array.
        let mut arrays: HashMap<Uuid, (String, Vec<String>)> = HashMap::new();
        for (m, sb) in &found {
            arrays
                .entry(sb.array_uuid)
                .or_insert_with(|| (sb.name.clone(), Vec::new()))
                .1
                .push(m.path.clone());
        }
        if arrays.len() > 1 {
            let desc: Vec<String> = arrays
                .iter()
                .map(|(u, (n, p))| format!("'{n}' ({u}): {}", p.join(", ")))
                .collect();
            return Err(Error::Refused(format!(
                "these members belong to different arrays: {}; assemble each array with its own members",
                desc.join("; ")
            )));
        }
        Self::refuse_disagreeing(&found)?;
        Self::refuse_inconsistent(&found)?;
        // The same member given twice: the first one counts.
        let mut seen = std::collections::HashSet::new();
        found.retain(|(m, sb)| {
            let first = seen.insert(sb.this_member);
            if !first {
                report
                    .ignored
                    .push((m.path.clone(), "the same member was given twice".into()));
            }
            first
        });
        // Which member is trusted: one function, on the superblocks alone.
        let judged = {
            let sbs: Vec<&Superblock> = found.iter().map(|(_, sb)| sb).collect();
            freshness::judge_members(&sbs)
        };
        let verdicts = match judged {
            Ok(v) => v,
            Err(split) => {
                let msg = Self::describe_split(&found, &split);
                if !(opts.force || opts.read_only) {
                    let newest = &found[split.verdicts.newest].0.path;
                    return Err(Error::SplitBrain(format!(
                        "{msg}. Nothing was merged or written. Assemble with the members of the side that holds the data you want (the other side's members are then rebuilt from it when added), or use --force to take the newest side ({newest}'s) and rebuild the others from it"
                    )));
                }
                report.split_brain = Some(msg);
                split.verdicts
            }
        };
        let newest = found[verdicts.newest].1.clone();
        let newest_path = found[verdicts.newest].0.path.clone();
        let g = newest.geometry.clone();
        let mut slots: Vec<SlotRt> = newest
            .slots
            .iter()
            .map(|s| SlotRt {
                entry: s.member.clone(),
                member: None,
                state: s.state,
                recovery: Arc::new(AtomicU64::new(s.recovery_offset)),
                replacement: None,
                out: s.out,
                bitmap_recovery: s.bitmap_recovery && s.state == SlotState::Rebuilding,
                note: None,
            })
            .collect();
        let mut spares = Vec::new();
        // Members whose bitmap records what the array wrote: fresh and in service.
        let mut bitmap_images: Vec<Arc<Member>> = Vec::new();
        // Slots whose member missed writes: (slot, its event, from the bitmap, path).
        let mut stale: Vec<(usize, u64, bool, String)> = Vec::new();
        // Members present but out of date that once held the slot's data, for a rescue:
        // (slot, event).
        let mut rescue_candidates: Vec<(usize, u64)> = Vec::new();
        for ((m, sb), verdict) in found.into_iter().zip(verdicts.members.iter().copied()) {
            let role = newest.role_of(&sb.this_member);
            let entry = match role {
                Role::Slot(i) => newest.slots[i].member.clone(),
                Role::Replacement(i) => {
                    newest.slots[i].replacement.as_ref().map(|(e, _)| e.clone())
                }
                Role::Spare => newest
                    .spares
                    .iter()
                    .find(|e| e.uuid == sb.this_member)
                    .cloned(),
                Role::None => None,
            };
            let Some(entry) = entry else {
                let why = if matches!(verdict, Verdict::Diverged { .. }) {
                    format!(
                        "it went on without the newest side (its superblock is from event {}, another session): not used",
                        sb.event
                    )
                } else {
                    format!(
                        "no longer a member of '{}' (its superblock is from event {}, the array is at {}): it was replaced; use `sbod add` to reuse it as a spare",
                        newest.name, sb.event, newest.event
                    )
                };
                report.ignored.push((m.path.clone(), why));
                continue;
            };
            if m.dev.size() < g.data_offset.saturating_add(entry.size) {
                return Err(Error::Refused(format!(
                    "{} is smaller than the array expects ({} of data at offset {})",
                    m.path,
                    crate::layout::human(entry.size),
                    crate::layout::human(g.data_offset)
                )));
            }
            let member = Arc::new(Member {
                dev: m.dev,
                uuid: entry.uuid,
                path: m.path.clone(),
                domain: entry.domain.clone(),
                size: entry.size,
                is_file: m.is_file,
                stats: MemberStats::default(),
            });
            match role {
                Role::Slot(i) => {
                    let s = &mut slots[i];
                    s.member = Some(member.clone());
                    let in_service = matches!(s.state, SlotState::Active | SlotState::Rebuilding);
                    if verdict.is_fresh() && in_service {
                        if verdict == Verdict::FreshMissedLast {
                            report.missed_last_write.push(m.path.clone());
                        }
                        if s.state == SlotState::Rebuilding {
                            report.rebuilding.push(m.path.clone());
                        }
                        bitmap_images.push(member);
                    } else {
                        // Behind, from the other side of a forced split, or back in a slot
                        // the array records as out: it missed writes. Never read until
                        // recovered, from the bitmap where that covers what it missed.
                        let bitmap = !matches!(verdict, Verdict::Diverged { .. })
                            && freshness::bitmap_covers(&newest, &sb);
                        if let Role::Slot(j) = sb.role_of(&sb.this_member) {
                            if j == i && sb.slots[j].state == SlotState::Active {
                                rescue_candidates.push((i, sb.event));
                            }
                        }
                        s.state = SlotState::Rebuilding;
                        s.recovery = Arc::new(AtomicU64::new(0));
                        s.bitmap_recovery = bitmap;
                        s.out = Some(OutRecord {
                            reason: OutReason::Stale,
                            event: sb.event,
                        });
                        stale.push((i, sb.event, bitmap, m.path.clone()));
                        report.rebuilding.push(m.path.clone());
                    }
                }
                Role::Replacement(i) => {
                    let off = match (verdict.is_fresh(), &newest.slots[i].replacement) {
                        (true, Some((_, off))) => *off,
                        _ => 0,
                    };
                    slots[i].replacement = Some((member, Arc::new(AtomicU64::new(off))));
                    report.rebuilding.push(m.path.clone());
                }
                Role::Spare => spares.push(member),
                Role::None => unreachable!(),
            }
        }
        // Slots whose member was in service when the array stopped and is not here: an
        // array does not start without them unless told to.
        let missing: Vec<usize> = (0..slots.len())
            .filter(|&i| {
                slots[i].member.is_none()
                    && matches!(slots[i].state, SlotState::Active | SlotState::Rebuilding)
            })
            .collect();
        let allowed = opts.degraded || opts.force || opts.read_only;
        if !missing.is_empty() && !allowed {
            let w = g.width as usize;
            return Err(Error::MissingMembers(crate::error::MissingMembers {
                array: newest.name.clone(),
                slots: missing
                    .iter()
                    .map(|&i| crate::error::MissingSlot {
                        slot: i,
                        group: i / w,
                        uuid: slots[i].entry.as_ref().map(|e| e.uuid),
                    })
                    .collect(),
                ignored: report.ignored.clone(),
            }));
        }
        for &i in &missing {
            let s = &mut slots[i];
            s.state = SlotState::Failed;
            s.bitmap_recovery = false;
            s.out = Some(OutRecord {
                reason: OutReason::Missing,
                event: newest.event + 1,
            });
            report.missing.push(i);
        }
        let state = State {
            slots,
            spares,
            failed: None,
        };
        // The write-intent bitmap: the union of the in-sync members' images. It says what
        // to resync after an unclean stop, and what a member that was out missed (bits are
        // kept while any slot is out).
        let mut dirty = Vec::new();
        let regions = g.member_size.div_ceil(newest.bitmap_region).max(1);
        let any_out = state.slots.iter().any(|s| s.state != SlotState::Active);
        let bitmap_read = g.redundancy() > 0 && (!newest.clean || any_out);
        if bitmap_read {
            report.unclean = !newest.clean;
            let mut union = vec![0u8; newest.bitmap_bytes as usize];
            for m in &bitmap_images {
                let buf = AlignedBuf::zeroed(newest.bitmap_bytes as usize).into_shared();
                if dev::read_at(
                    &m.dev,
                    superblock::BITMAP_OFFSET,
                    buf.clone(),
                    IoClass::Foreground,
                )
                .await
                .is_ok()
                {
                    let b = buf.try_unwrap().expect("sole owner");
                    for (u, x) in union.iter_mut().zip(b.iter()) {
                        *u |= *x;
                    }
                }
            }
            dirty = Bitmap::set_bits(&union, regions);
        }
        // A start for writing is a new session; looking (or a rescue) starts nothing.
        let (session, history) = if opts.read_only {
            (newest.session, newest.history.clone())
        } else {
            Lineage::start(&newest.history, newest.event + 1)
        };
        let array = Array::build(
            newest.name.clone(),
            newest.array_uuid,
            newest.created,
            g,
            state,
            newest.event,
            newest.bitmap_region,
            newest.bitmap_bytes,
            newest.resync_offset,
            &dirty,
            Lineage {
                session,
                history,
                bitmap_since: newest.bitmap_since,
                extensions: newest.extensions.clone(),
            },
        )?;
        array.sync.restore(&newest, logs);
        let mut st = (*array.state.load_full()).clone();
        for (i, event, bitmap, path) in stale {
            let planned = array.recovery_bytes(&st.slots[i]);
            let note = if opts.read_only {
                // Only looking: nothing will be recovered.
                format!("stale: event {event}, array at {}", newest.event)
            } else {
                stale_note(event, newest.event, bitmap, planned, array.bitmap.as_ref())
            };
            st.slots[i].note = Some(note.clone().into());
            report.stale.push(StaleMember {
                path,
                slot: i,
                event,
                array_event: newest.event,
                bitmap,
                planned_bytes: planned,
                note,
            });
        }
        if opts.read_only {
            array.read_only.store(true, Ordering::Release);
            array.closing.store(true, Ordering::Release);
            array.judge(&mut st);
            array.state.store(Arc::new(st));
            *array.report.lock() = report;
            return Ok(array);
        }
        let mut probe = st.clone();
        array.judge(&mut probe);
        if let Some(why) = probe.failed {
            if opts.force {
                return Ok(array.rescue(st, report, rescue_candidates, &newest));
            }
            // Members judged stale are judged against the newest superblock: name it, for a
            // newest that is wrong (a damaged or foreign copy) is what to look at then.
            let against = if why.contains("(stale)") {
                format!(
                    " (judged against the newest superblock, event {} on {newest_path})",
                    newest.event
                )
            } else {
                String::new()
            };
            return Err(Error::Failed(format!(
                "'{}' cannot start: {why}{against}. Find the missing members and assemble again with them, or assemble with --force to start it read-only and copy off what is readable",
                array.name
            )));
        }
        // The log replayed: with every write journaled, every stripe is consistent again.
        let log_covers = array.attach_logs(&newest, &st, &opts).await?;
        // Forced past the write hole: the user accepts the parity of the dirty regions as
        // it is for the chunks that must be rebuilt from it (md's --force on a dirty
        // degraded array), so the resync below does not hold those stripes.
        let mut forced_hole = log_covers;
        if !newest.clean && !log_covers {
            if let Err(e) = Self::refuse_write_hole(&newest, &st, &dirty) {
                if !opts.force {
                    return Err(e);
                }
                tracing::warn!(array = %array.name, "{e}: forced");
                forced_hole = true;
            }
        }
        let recovering: Vec<usize> = (0..st.slots.len())
            .filter(|&i| st.slots[i].state == SlotState::Rebuilding)
            .collect();
        array.take_spares(&mut st);
        array.judge(&mut st);
        for &i in &recovering {
            let s = &st.slots[i];
            if let Some(m) = &s.member {
                let reason = s
                    .note
                    .as_deref()
                    .map(|n| n.split(';').next().unwrap_or(n).to_string())
                    .unwrap_or_else(|| "rebuild resumed".into());
                array.log_recovery(i, m, reason, s.bitmap_recovery, array.recovery_bytes(s));
            }
        }
        array.state.store(Arc::new(st));
        // Two superblock writes start a session: the start, then the opening once the start
        // is on every member. Nothing is written before the opening, so a member that
        // missed only the start of the newest session missed no data (`freshness` trusts
        // it), while one that stopped before a session that opened is behind.
        for _ in 0..2 {
            let _g = array.mgmt.lock().await;
            let st = array.state.load_full();
            let lost = array.persist(&st, false).await;
            if !lost.is_empty() {
                drop(_g);
                for m in lost {
                    array.fail_member(&m, OutReason::MetadataWrite).await;
                }
            }
        }
        // The start (and with it the unclean mark the write-intent bitmap relies on) must
        // be on the members before anything is written. If so many members refused the
        // superblock write that the array failed, it never started: say so rather than
        // hand out an array that serves nothing and whose start left no trace.
        if let Some(why) = array.state.load_full().failed.clone() {
            if !opts.force {
                array.abandon().await;
                return Err(Error::Failed(format!(
                    "'{}' failed while starting: {why}. Check the members' paths and health, then assemble again",
                    array.name
                )));
            }
        }
        // Every member in service carries the whole bitmap from now on: the union of what
        // the members in sync had (a member back from being out, or an old copy, carries
        // bits of its own past, or lacks recent ones).
        if bitmap_read {
            array
                .sync_bitmap(&array.state.load_full().live_members())
                .await;
        }
        *array.report.lock() = report;
        if !newest.clean && !dirty.is_empty() {
            let (bytes, n) = match array.resync_regions(&dirty).await {
                // Out of space: serve anyway, with those stripes held as inconsistent
                // (never rebuilt from, their regions dirty) until the watch resyncs them.
                Err(Error::NoSpace(msg)) => {
                    tracing::warn!(array = %array.name, "{msg}; the resync waits for space");
                    array.defer_resync(&dirty);
                    (0, 0)
                }
                r => {
                    let r = r?;
                    if forced_hole {
                        if let Some(bm) = &array.bitmap {
                            for (g, t) in bm.unsynced_stripes() {
                                bm.synced(g, t);
                            }
                        }
                    }
                    r
                }
            };
            let mut r = array.report.lock();
            r.resynced_bytes = bytes;
            r.resynced_regions = n;
        }
        if !opts.no_processes {
            array.start_processes();
        }
        Ok(array)
    }

    /// Name both sides of a split brain: members, events, when each was last started.
    fn describe_split(found: &[(MemberSpec, Superblock)], split: &freshness::SplitBrain) -> String {
        let side = |idx: Vec<usize>| -> String {
            let paths: Vec<&str> = idx.iter().map(|&i| found[i].0.path.as_str()).collect();
            let best = idx
                .iter()
                .map(|&i| &found[i].1)
                .max_by_key(|sb| sb.event)
                .expect("a side has members");
            let started = freshness::session_started(best)
                .map(|t| format!(", last started {}", utc(t)))
                .unwrap_or_default();
            format!("{} (event {}{started})", paths.join(", "), best.event)
        };
        format!(
            "the members of '{}' went on in two separate sets without each other (split brain): {} and {}",
            found[split.verdicts.newest].1.name,
            side(split.newest_side()),
            side(split.other_side())
        )
    }

    /// What never changes in an array's life must read the same on every member: a member
    /// that says otherwise carries a damaged (or forged) superblock, whatever its checksum
    /// says, and must not decide the layout (the newest superblock would).
    fn refuse_disagreeing(found: &[(MemberSpec, Superblock)]) -> Result<()> {
        type Ident = (Geometry, u64, u32, u64);
        let ident = |sb: &Superblock| -> Ident {
            (
                sb.geometry.clone(),
                sb.bitmap_region,
                sb.bitmap_bytes,
                sb.created,
            )
        };
        let mut kinds: Vec<(Ident, Vec<&str>)> = Vec::new();
        for (m, sb) in found {
            let k = ident(sb);
            match kinds.iter_mut().find(|(x, _)| *x == k) {
                Some((_, v)) => v.push(&m.path),
                None => kinds.push((k, vec![&m.path])),
            }
        }
        if kinds.len() < 2 {
            return Ok(());
        }
        kinds.sort_by_key(|(_, v)| std::cmp::Reverse(v.len()));
        let name = &found[0].1.name;
        if kinds[0].1.len() == kinds[1].1.len() {
            let desc: Vec<String> = kinds
                .iter()
                .map(|((g, ..), v)| {
                    format!(
                        "{} say {} chunk {} data at {}",
                        v.join(", "),
                        g.level,
                        g.chunk,
                        g.data_offset
                    )
                })
                .collect();
            return Err(Error::Refused(format!(
                "the members of '{name}' disagree about its layout ({}): some superblocks are damaged; compare them with `sbod examine` and assemble with the members that agree",
                desc.join("; ")
            )));
        }
        let odd: Vec<&str> = kinds[1..].iter().flat_map(|(_, v)| v.clone()).collect();
        Err(Error::Refused(format!(
            "the superblock of {} disagrees with the other members of '{name}' about the array's layout (level, chunk, sizes or bitmap): it is damaged. Assemble without {}; the array runs degraded and rebuilds onto it once it is wiped and added back (compare with `sbod examine`)",
            odd.join(", "),
            if odd.len() == 1 { "it" } else { "them" }
        )))
    }

    /// Members written by the same superblock write (same session and event) carry the
    /// same superblock but for the member's own id. One that says otherwise was damaged (or
    /// forged) with a checksum to match, and must not decide who is in which slot.
    fn refuse_inconsistent(found: &[(MemberSpec, Superblock)]) -> Result<()> {
        let same = |a: &Superblock, b: &Superblock| {
            Superblock {
                this_member: Uuid::nil(),
                ..a.clone()
            } == Superblock {
                this_member: Uuid::nil(),
                ..b.clone()
            }
        };
        let mut odd: Vec<&str> = Vec::new();
        for (i, (m, sb)) in found.iter().enumerate() {
            let peers: Vec<&Superblock> = found
                .iter()
                .enumerate()
                .filter(|(j, (_, x))| *j != i && x.session == sb.session && x.event == sb.event)
                .map(|(_, (_, x))| x)
                .collect();
            let agree = peers.iter().filter(|x| same(x, sb)).count();
            // Disagreeing with at least as many as agree (itself included): not trusted.
            if !peers.is_empty() && peers.len() - agree > agree {
                odd.push(&m.path);
            }
        }
        if odd.is_empty() {
            return Ok(());
        }
        Err(Error::Refused(format!(
            "the superblock of {} disagrees with the other members of '{}' written at the same time (who holds which slot, or its state): it is damaged. Assemble without {}; the array runs degraded (--degraded) and rebuilds onto {} once wiped and added back (compare with `sbod examine`)",
            odd.join(", "),
            found[0].1.name,
            if odd.len() == 1 { "it" } else { "them" },
            if odd.len() == 1 { "it" } else { "them" },
        )))
    }

    /// The RAID write hole: after a crash, parity in the dirty regions may not match the
    /// data. With every member present the resync makes it match again; but a chunk that
    /// has to be rebuilt from that parity (its member missing, failed, or not yet rebuilt
    /// there) would come back wrong, silently. Refuse to start such an array unless forced
    /// (md refuses a "dirty degraded array" likewise).
    fn refuse_write_hole(sb: &Superblock, st: &State, dirty: &[u64]) -> Result<()> {
        let g = &sb.geometry;
        if dirty.is_empty() || !matches!(g.scheme(), Scheme::Parity { m, .. } if m > 0) {
            return Ok(());
        }
        let mut at_risk = Vec::new();
        for (i, s) in st.slots.iter().enumerate() {
            let risky = dirty.iter().any(|&r| {
                let end = ((r + 1) * sb.bitmap_region).min(g.member_size);
                s.readable(end).is_none()
            });
            if risky {
                let why = match (s.state, s.out) {
                    (SlotState::Rebuilding, Some(o)) if o.reason == OutReason::Stale => {
                        "stale".to_string()
                    }
                    (state, _) => format!("{state:?}").to_lowercase(),
                };
                at_risk.push(match &s.member {
                    Some(m) => format!("{} ({why})", m.path),
                    None => format!("slot {i} (missing)"),
                });
            }
        }
        if at_risk.is_empty() {
            return Ok(());
        }
        Err(Error::Refused(format!(
            "'{}' was not shut down cleanly and is degraded: parity in {} region(s) written at the time may not match the data, so what {} held there cannot be rebuilt reliably (the RAID write hole). Assemble it with all its members; or, to start anyway and accept that those members' data in those regions may be wrong, assemble with --force{}",
            sb.name,
            dirty.len(),
            at_risk.join(", "),
            crate::log::attach::write_hole_hint(sb)
        )))
    }

    /// Wake the background supervisor (and the sweeper) to look at the state again.
    /// `notify_waiters`, not `notify_one`: both loops wait on `wake`, and `notify_one` could
    /// hand the wake-up to the sweeper instead of the supervisor (a spare then waited 5 s to
    /// start). A `Notified` created before this call sees it even if not yet polled.
    pub(crate) fn kick(&self) {
        self.wake.notify_waiters();
    }

    pub fn report(&self) -> AssemblyReport {
        self.report.lock().clone()
    }

    /// Volume size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    pub fn state(&self) -> Arc<State> {
        self.state.load_full()
    }

    /// The superblock a member gets for the given state.
    pub(crate) fn superblock(&self, st: &State, event: u64, clean: bool, this: Uuid) -> Superblock {
        Superblock {
            array_uuid: self.uuid,
            name: self.name.clone(),
            created: self.created,
            event,
            this_member: this,
            geometry: self.geometry.clone(),
            bitmap_region: self
                .bitmap
                .as_ref()
                .map(|b| b.region)
                .unwrap_or_else(|| default_region(self.geometry.member_size, self.geometry.chunk)),
            bitmap_bytes: self.bitmap_bytes,
            clean,
            resync_offset: self.resync_offset.load(Ordering::Acquire),
            slots: st
                .slots
                .iter()
                .map(|s| Slot {
                    member: s.entry.clone(),
                    state: s.state,
                    recovery_offset: s.recovery.load(Ordering::Acquire),
                    replacement: s
                        .replacement
                        .as_ref()
                        .map(|(m, r)| (m.entry(), r.load(Ordering::Acquire))),
                    out: match s.state {
                        SlotState::Active => None,
                        _ => s.out,
                    },
                    bitmap_recovery: s.bitmap_recovery && s.state == SlotState::Rebuilding,
                })
                .collect(),
            spares: st.spares.iter().map(|m| m.entry()).collect(),
            session: self.session,
            history: self.history.clone(),
            bitmap_since: self.bitmap_since.load(Ordering::Acquire),
            sync: self.sync.mode(),
            log: self.sync.log_entries(),
            extensions: self.extensions.clone(),
        }
    }

    /// Write the superblock for `st` to every live member (event + 1). Returns the
    /// members whose write failed; the caller fails them. Call with `mgmt` held.
    pub(crate) async fn persist(&self, st: &State, clean: bool) -> Vec<Arc<Member>> {
        if self.read_only.load(Ordering::Acquire) {
            // Looking or rescuing: nothing is ever written to a member.
            return Vec::new();
        }
        let event = self.event.fetch_add(1, Ordering::AcqRel) + 1;
        let members = st.live_members();
        // One superblock for all: members at the same event say the same thing (assembly
        // refuses one that does not), though a rebuild may move on meanwhile.
        let base = self.superblock(st, event, clean, Uuid::nil());
        let futs = members.iter().map(|m| {
            let sb = Superblock {
                this_member: m.uuid,
                ..base.clone()
            };
            let bytes = sb.encode();
            let mut buf = AlignedBuf::zeroed(bytes.len().div_ceil(4096) * 4096);
            buf[..bytes.len()].copy_from_slice(&bytes);
            let off = sb.copy_offset();
            let m = m.clone();
            async move {
                let r =
                    dev::write_at(&m.dev, off, buf.into_shared(), true, IoClass::Foreground).await;
                (m, r)
            }
        });
        let mut failed = Vec::new();
        for (m, r) in futures::future::join_all(futs).await {
            if let Err(e) = r {
                tracing::error!(member = %m.path, error = %e, "superblock write failed");
                m.stats.write_errors.fetch_add(1, Ordering::Relaxed);
                failed.push(m);
            }
        }
        failed
    }

    /// Decide whether the state still holds all data.
    pub(crate) fn judge(&self, st: &mut State) {
        let w = self.geometry.width as usize;
        let red = self.geometry.redundancy();
        st.failed = None;
        for g in 0..self.geometry.groups as usize {
            let slots = &st.slots[g * w..(g + 1) * w];
            let out: Vec<usize> = (0..w)
                .filter(|&i| slots[i].state != SlotState::Active)
                .collect();
            if out.len() > red {
                let names: Vec<String> = out
                    .iter()
                    .map(|&i| {
                        let s = &slots[i];
                        let who = s
                            .member
                            .as_ref()
                            .map(|m| m.path.clone())
                            .unwrap_or_else(|| format!("slot {}", g * w + i));
                        let what = match (s.state, s.out) {
                            (SlotState::Rebuilding, Some(o)) if o.reason == OutReason::Stale => {
                                "stale".to_string()
                            }
                            (SlotState::Failed, Some(o)) if o.reason == OutReason::Missing => {
                                "missing".to_string()
                            }
                            (state, _) => format!("{state:?}").to_lowercase(),
                        };
                        format!("{who} ({what})")
                    })
                    .collect();
                st.failed = Some(format!(
                    "group {g} has lost {} of {w} members ({}) and survives only {red}",
                    out.len(),
                    names.join(", ")
                ));
                return;
            }
        }
    }

    /// Hand spares to failed or empty slots, choosing one whose failure domain the
    /// group can absorb when there is a choice.
    pub(crate) fn take_spares(&self, st: &mut State) -> bool {
        let w = self.geometry.width as usize;
        let red = self.geometry.redundancy();
        let mut changed = false;
        for i in 0..st.slots.len() {
            if !matches!(st.slots[i].state, SlotState::Failed | SlotState::Empty)
                || st.spares.is_empty()
            {
                continue;
            }
            let g = i / w;
            let domain_count = |d: &str, st: &State| {
                st.slots[g * w..(g + 1) * w]
                    .iter()
                    .filter(|s| {
                        s.state != SlotState::Failed
                            && s.member.as_ref().is_some_and(|m| m.domain == d)
                    })
                    .count()
            };
            let pick = st
                .spares
                .iter()
                .position(|m| m.domain.is_empty() || domain_count(&m.domain, st) < red)
                .unwrap_or(0);
            let spare = st.spares.remove(pick);
            tracing::warn!(slot = i, spare = %spare.path, "hot spare takes over");
            self.log_recovery(i, &spare, "hot spare".into(), false, spare.size);
            let s = &mut st.slots[i];
            s.entry = Some(spare.entry());
            s.member = Some(spare);
            s.state = SlotState::Rebuilding;
            s.recovery = Arc::new(AtomicU64::new(0));
            s.out = None;
            s.bitmap_recovery = false;
            s.note = None;
            changed = true;
        }
        changed
    }

    /// Fail a member because of an I/O error (or the user's command). The new state is
    /// recorded on the other members before it is used: no write skips this member before
    /// its failure is durable, so a member whose superblock says it was in service has
    /// every write the array acknowledged (what `freshness` relies on).
    pub async fn fail_member(&self, member: &Arc<Member>, why: impl Into<Why>) {
        let _g = self.mgmt.lock().await;
        // Members that then refuse the superblock recording it fail for that reason.
        let mut pending = vec![(member.clone(), why.into())];
        while let Some((m, why)) = pending.pop() {
            let st = self.state.load_full();
            let mut new = (*st).clone();
            let event = self.event.load(Ordering::Acquire) + 1;
            let rec = OutRecord {
                reason: why.code,
                event,
            };
            if !Self::mark_failed(&mut new, &m, rec) {
                continue;
            }
            if let Some(d) = &why.detail {
                m.stats
                    .out_reason
                    .lock()
                    .get_or_insert_with(|| d.to_string());
            }
            if why.code == OutReason::Admin {
                tracing::info!(member = %m.path, array = %self.name, "member failed by the administrator");
            } else {
                tracing::error!(member = %m.path, reason = %why, array = %self.name, "member failed");
            }
            self.end_recovery(&m.uuid, false);
            self.take_spares(&mut new);
            self.judge(&mut new);
            if let Some(f) = &new.failed {
                tracing::error!(array = %self.name, "array failed: {f}");
            }
            let lost = self.commit(new).await;
            pending.extend(lost.into_iter().map(|m| (m, reason::SUPERBLOCK_WRITE)));
            self.cancel_process_on_failure();
        }
        self.kick();
    }

    /// Record `new` on the live members, then use it. Call with `mgmt` held. Returns the
    /// members whose superblock write failed (the caller fails them).
    pub(crate) async fn commit(&self, new: State) -> Vec<Arc<Member>> {
        let lost = self.persist(&new, false).await;
        self.state.store(Arc::new(new));
        lost
    }

    pub(crate) fn mark_failed(st: &mut State, m: &Arc<Member>, why: OutRecord) -> bool {
        for s in st.slots.iter_mut() {
            if s.member.as_ref().is_some_and(|x| Arc::ptr_eq(x, m)) && s.state != SlotState::Failed
            {
                if let Some((r, off)) = s.replacement.take() {
                    // The replacement carries on as the slot's member, rebuilding.
                    s.entry = Some(r.entry());
                    s.member = Some(r);
                    s.state = SlotState::Rebuilding;
                    s.recovery = off;
                    s.bitmap_recovery = false;
                    s.out = None;
                    s.note = None;
                } else {
                    s.state = SlotState::Failed;
                    s.bitmap_recovery = false;
                    s.out = Some(why);
                    s.note = None;
                }
                return true;
            }
            if s.replacement
                .as_ref()
                .is_some_and(|(x, _)| Arc::ptr_eq(x, m))
            {
                s.replacement = None;
                return true;
            }
        }
        let before = st.spares.len();
        st.spares.retain(|x| !Arc::ptr_eq(x, m));
        st.spares.len() != before
    }

    fn find_member(&self, who: &str) -> Result<(Role, Arc<Member>)> {
        let st = self.state.load_full();
        st.find(who).ok_or_else(|| {
            let known: Vec<String> = st.live_members().iter().map(|m| m.path.clone()).collect();
            Error::Invalid(format!(
                "{who} is not a member of '{}' (members: {})",
                self.name,
                known.join(", ")
            ))
        })
    }

    /// `sbod fail`: take a member out of service. Refused (`Error::WouldFail`) when the
    /// array would then have lost more members of a group than it survives (it would stop
    /// serving), unless `force`.
    pub async fn fail(&self, who: &str, force: bool) -> Result<()> {
        let (role, m) = self.find_member(who)?;
        if let Role::Slot(i) = role {
            let st = self.state.load_full();
            if st.slots[i].state == SlotState::Failed {
                return Err(Error::Invalid(format!("{who} has already failed")));
            }
        }
        if self.read_only.load(Ordering::Acquire) {
            return Err(self.read_only_error());
        }
        if !force {
            self.refuse_unsafe_fail(&m)?;
        }
        self.fail_member(&m, OutReason::Admin).await;
        Ok(())
    }

    /// `sbod remove`: forget a failed member or a spare.
    pub async fn remove(&self, who: &str) -> Result<()> {
        let _g = self.mgmt.lock().await;
        let st = self.state.load_full();
        let mut new = (*st).clone();
        let found = st.slots.iter().position(|s| {
            s.member
                .as_ref()
                .is_some_and(|m| m.path == who || m.uuid.to_string() == who)
                || s.entry.as_ref().is_some_and(|e| e.uuid.to_string() == who)
        });
        let removed: Option<Arc<Member>>;
        if let Some(i) = found {
            let s = &mut new.slots[i];
            if s.state != SlotState::Failed {
                return Err(Error::Refused(format!(
                    "{who} is {} in '{}': fail it first (sbod fail {} {who}) or use sbod replace",
                    format!("{:?}", s.state).to_lowercase(),
                    self.name,
                    self.name
                )));
            }
            removed = s.member.take();
            s.entry = None;
            s.state = SlotState::Empty;
            s.note = None;
        } else if let Some(p) = st
            .spares
            .iter()
            .position(|m| m.path == who || m.uuid.to_string() == who)
        {
            removed = Some(new.spares.remove(p));
        } else {
            return Err(Error::Invalid(format!(
                "{who} is not a failed member or spare of '{}'",
                self.name
            )));
        }
        let lost = self.commit(new).await;
        drop(_g);
        for m in lost {
            self.fail_member(&m, OutReason::MetadataWrite).await;
        }
        if let Some(m) = removed {
            // Wipe its claim so it is not mistaken for a member later.
            Self::wipe(&m).await;
            m.dev.close();
        }
        Ok(())
    }

    async fn wipe(m: &Arc<Member>) {
        let z = AlignedBuf::zeroed(2 * superblock::COPY_SIZE).into_shared();
        let _ = dev::write_at(&m.dev, 0, z, true, IoClass::Foreground).await;
    }

    fn check_new_member(&self, spec: &MemberSpec) -> Result<u64> {
        let st = self.state.load_full();
        if st.live_members().iter().any(|m| m.path == spec.path) {
            return Err(Error::Invalid(format!(
                "{} is already a member of '{}'",
                spec.path, self.name
            )));
        }
        let need = self.geometry.data_offset + self.geometry.member_size;
        if self.geometry.level != Level::Concat && spec.dev.size() < need {
            return Err(Error::Invalid(format!(
                "{} has {} but members of '{}' need {}",
                spec.path,
                crate::layout::human(spec.dev.size()),
                self.name,
                crate::layout::human(need)
            )));
        }
        Ok(if self.geometry.level == Level::Concat {
            spec.dev.size().saturating_sub(self.geometry.data_offset) / self.geometry.chunk as u64
                * self.geometry.chunk as u64
        } else {
            self.geometry.member_size
        })
    }

    fn new_member(spec: MemberSpec, size: u64) -> Arc<Member> {
        Arc::new(Member {
            dev: spec.dev,
            uuid: Uuid::new_v4(),
            path: spec.path,
            domain: spec.domain,
            size,
            is_file: spec.is_file,
            stats: MemberStats::default(),
        })
    }

    /// `sbod add`: a hot spare; a degraded array takes it at once and rebuilds. A device
    /// whose superblock says it was a member of this array and whose slot is out (failed
    /// or missing) is re-added there instead (see `re_add`); a former member that cannot
    /// be re-added is refused with the reason unless `force` (then it is wiped and added
    /// as a new member).
    pub async fn add(&self, spec: MemberSpec, force: bool) -> Result<AddOutcome> {
        if self.read_only.load(Ordering::Acquire) {
            return Err(self.read_only_error());
        }
        if let Ok(sb) = read_superblock(&spec.dev).await {
            if sb.array_uuid == self.uuid {
                match self.plan_re_add(&sb, &spec.path) {
                    Ok(plan) => {
                        return self
                            .apply_re_add(spec, &sb, plan)
                            .await
                            .map(AddOutcome::ReAdded)
                    }
                    Err(e) if !force || matches!(e, Error::Invalid(_)) => return Err(e),
                    Err(_) => {}
                }
            }
        }
        let size = self.check_new_member(&spec)?;
        check_blank(&spec.dev, force).await?;
        claim_metadata(&spec.dev, self.geometry.data_offset, &spec.path).await?;
        let m = Self::new_member(spec, size);
        let uuid = m.uuid;
        let _g = self.mgmt.lock().await;
        let mut new = (*self.state.load_full()).clone();
        new.spares.push(m);
        self.take_spares(&mut new);
        self.judge(&mut new);
        let outcome = match new
            .slots
            .iter()
            .position(|s| s.member.as_ref().is_some_and(|x| x.uuid == uuid))
        {
            Some(slot) => AddOutcome::Rebuilding { slot },
            None => AddOutcome::Spare,
        };
        let lost = self.commit(new).await;
        drop(_g);
        for m in lost {
            self.fail_member(&m, OutReason::MetadataWrite).await;
        }
        self.kick();
        Ok(outcome)
    }

    /// Refuse a member for `slot` whose failure domain (a host, an enclosure) already holds
    /// as many members of the slot's group as the group survives losing, as `create` does.
    fn check_domain(&self, st: &State, slot: usize, spec: &MemberSpec) -> Result<()> {
        if spec.domain.is_empty() {
            return Ok(());
        }
        let w = self.geometry.width as usize;
        let g = slot / w;
        let red = self.geometry.redundancy();
        let others: Vec<&str> = (g * w..(g + 1) * w)
            .filter(|&i| i != slot && st.slots[i].state != SlotState::Failed)
            .filter_map(|i| st.slots[i].member.as_ref())
            .filter(|m| m.domain == spec.domain)
            .map(|m| m.path.as_str())
            .collect();
        if others.len() >= red {
            return Err(Error::Refused(format!(
                "failure domain '{}' already holds {} member{} of group {g} ({}), and the group survives only {red} failure{}: put {} in another domain, or use --force",
                spec.domain,
                others.len(),
                if others.len() == 1 { "" } else { "s" },
                others.join(", "),
                if red == 1 { "" } else { "s" },
                spec.path
            )));
        }
        Ok(())
    }

    /// `sbod replace`: rebuild `new` to take `old`'s place. While `old` still works it keeps
    /// serving (redundancy is never reduced); if it has failed, `new` simply rebuilds.
    pub async fn replace(&self, old: &str, spec: MemberSpec, force: bool) -> Result<()> {
        if self.read_only.load(Ordering::Acquire) {
            return Err(self.read_only_error());
        }
        let st = self.state.load_full();
        let slot = st
            .slots
            .iter()
            .position(|s| {
                s.member
                    .as_ref()
                    .is_some_and(|m| m.path == old || m.uuid.to_string() == old)
                    || s.entry.as_ref().is_some_and(|e| e.uuid.to_string() == old)
            })
            .ok_or_else(|| Error::Invalid(format!("{old} is not in a slot of '{}'", self.name)))?;
        if st.slots[slot].replacement.is_some() {
            return Err(Error::Busy(format!("{old} is already being replaced")));
        }
        let size = self.check_new_member(&spec)?;
        if !force {
            self.check_domain(&st, slot, &spec)?;
        }
        check_blank(&spec.dev, force).await?;
        claim_metadata(&spec.dev, self.geometry.data_offset, &spec.path).await?;
        let m = Self::new_member(spec, size);
        let _g = self.mgmt.lock().await;
        let mut new = (*self.state.load_full()).clone();
        let s = &mut new.slots[slot];
        let mut retired = None;
        match s.state {
            SlotState::Active => {
                self.log_recovery(slot, &m, "replacement".into(), false, m.size);
                s.replacement = Some((m, Arc::new(AtomicU64::new(0))))
            }
            _ => {
                self.log_recovery(slot, &m, "replacement".into(), false, m.size);
                if let Some(r) = s.member.take() {
                    self.end_recovery(&r.uuid, false);
                    retired = Some(r);
                }
                s.entry = Some(m.entry());
                s.member = Some(m);
                s.state = SlotState::Rebuilding;
                s.recovery = Arc::new(AtomicU64::new(0));
                s.bitmap_recovery = false;
                s.out = None;
                s.note = None;
            }
        }
        self.judge(&mut new);
        let lost = self.commit(new).await;
        drop(_g);
        if let Some(r) = retired {
            r.dev.close();
        }
        for m in lost {
            self.fail_member(&m, OutReason::MetadataWrite).await;
        }
        self.kick();
        Ok(())
    }

    /// Drop the array as a power cut would: stop everything and close the members
    /// without flushing, clearing the bitmap or marking the superblocks clean. The next
    /// assembly sees an unclean shutdown. For tests and fault drills.
    pub async fn abandon(&self) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        self.closing.store(true, Ordering::Release);
        if let Some(p) = self.process.lock().clone() {
            p.cancel();
        }
        self.kick();
        let tasks = std::mem::take(&mut *self.tasks.lock());
        for t in &tasks {
            t.abort();
        }
        for t in tasks {
            let _ = t.await;
        }
        let st = self.state.load_full();
        for s in &st.slots {
            if let Some(m) = &s.member {
                m.dev.close();
            }
            if let Some((m, _)) = &s.replacement {
                m.dev.close();
            }
        }
        for m in &st.spares {
            m.dev.close();
        }
        self.sync.close_devices();
    }

    /// Stop background work, flush, mark clean and close the members.
    pub async fn close(&self) -> Result<()> {
        if self.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        if self.read_only.load(Ordering::Acquire) {
            // Looked at or rescued: nothing was written, nothing to record.
            let st = self.state.load_full();
            for m in st.live_members() {
                m.dev.close();
            }
            for m in st.slots.iter().filter_map(|s| s.member.as_ref()) {
                m.dev.close();
            }
            self.sync.close_devices();
            return Ok(());
        }
        self.closing.store(true, Ordering::Release);
        if let Some(p) = self.process.lock().clone() {
            p.cancel();
        }
        self.kick();
        let tasks = std::mem::take(&mut *self.tasks.lock());
        for t in tasks {
            let _ = t.await;
        }
        // Stripes a write left inconsistent get a last chance; any left keep their regions
        // dirty (the array is not marked clean) and are resynced at the next start.
        let unsynced = self.resync_unsynced().await.unwrap_or(1);
        self.close_log().await;
        let flushed = self.flush().await;
        let _g = self.mgmt.lock().await;
        let st = self.state.load_full();
        let clean = flushed.is_ok() && st.failed.is_none() && unsynced == 0;
        // With every slot in service, everything is durable everywhere: clear the whole
        // bitmap. Degraded, keep it: its bits are the record of what the members that are
        // out missed (they come back by it).
        let whole = st.slots.iter().all(|s| s.state == SlotState::Active);
        if clean && whole {
            if let Some(bm) = &self.bitmap {
                // Nothing older than this stop can be recovered from the bitmap now.
                self.bitmap_since
                    .store(self.event.load(Ordering::Acquire) + 1, Ordering::Release);
                let zero = AlignedBuf::zeroed(self.bitmap_bytes as usize).into_shared();
                for m in st.live_members() {
                    let _ = dev::write_at(
                        &m.dev,
                        superblock::BITMAP_OFFSET,
                        zero.clone(),
                        true,
                        IoClass::Foreground,
                    )
                    .await;
                }
                for r in 0..bm.regions {
                    bm.finish_clear(r);
                }
            }
        }
        let _ = self.persist(&st, clean).await;
        for m in st.live_members() {
            m.dev.close();
        }
        for s in &st.slots {
            if let Some(m) = &s.member {
                m.dev.close();
            }
        }
        flushed
    }
}

pub use sbod_types::{ArrayState, MemberState, MemberStatus, Status};

impl Array {
    pub fn status(&self) -> Status {
        let st = self.state.load_full();
        let w = self.geometry.width as usize;
        let event = self.event.load(Ordering::Relaxed);
        let mut members = Vec::new();
        let ms = |m: &Arc<Member>, slot: Option<usize>, state: MemberState| MemberStatus {
            slot,
            group: slot.map(|s| s / w),
            path: Some(m.path.clone()),
            uuid: Some(m.uuid.to_string()),
            state,
            reason: None,
            domain: m.domain.clone(),
            size: m.size,
            read_errors: m.stats.read_errors.load(Ordering::Relaxed),
            write_errors: m.stats.write_errors.load(Ordering::Relaxed),
            checksum_errors: m.stats.checksum_errors.load(Ordering::Relaxed),
            repaired: m.stats.repaired.load(Ordering::Relaxed),
            reads: m.stats.reads.load(Ordering::Relaxed),
            writes: m.stats.writes.load(Ordering::Relaxed),
            nospace: m.stats.nospace.load(Ordering::Relaxed),
            recovered: None,
            bitmap_recovery: false,
            recovery_bytes: None,
        };
        let reason = |s: &SlotRt| -> Option<String> {
            if let Some(n) = &s.note {
                return Some(n.to_string());
            }
            match (s.state, s.out) {
                (SlotState::Active, _) => None,
                (SlotState::Rebuilding, Some(o)) if o.reason == OutReason::Stale => {
                    Some(format!("stale: event {}, array at {event}", o.event))
                }
                (SlotState::Rebuilding, Some(o)) => Some(format!("back after: {}", o.reason)),
                (SlotState::Rebuilding, None) => None,
                // While it runs, the I/O path's own words where it has them ("shrank from
                // 256 MiB to 128 MiB ..."); the recorded code otherwise.
                (_, Some(o)) => match s
                    .member
                    .as_ref()
                    .and_then(|m| m.stats.out_reason.lock().clone())
                {
                    Some(d) if o.reason != OutReason::Admin => Some(format!("failed: {d}")),
                    _ => Some(o.reason.to_string()),
                },
                (SlotState::Failed, None) => Some("failed".into()),
                (SlotState::Empty, None) => None,
            }
        };
        let mut rebuilding = false;
        for (i, s) in st.slots.iter().enumerate() {
            let missing = s.out.is_some_and(|o| o.reason == OutReason::Missing);
            match (&s.member, s.state) {
                (Some(m), SlotState::Active) => members.push(ms(m, Some(i), MemberState::Active)),
                (Some(m), SlotState::Rebuilding) => {
                    rebuilding = true;
                    // Looked at (or rescued), a stale member is not being rebuilt.
                    let stale = self.read_only.load(Ordering::Relaxed)
                        && s.out.is_some_and(|o| o.reason == OutReason::Stale);
                    let mut x = ms(
                        m,
                        Some(i),
                        if stale {
                            MemberState::Stale
                        } else {
                            MemberState::Rebuilding
                        },
                    );
                    x.recovered = (!stale).then(|| s.recovery.load(Ordering::Relaxed));
                    x.bitmap_recovery = s.bitmap_recovery;
                    x.recovery_bytes = Some(self.recovery_bytes(s));
                    x.reason = reason(s);
                    members.push(x)
                }
                (Some(m), SlotState::Failed) => {
                    let mut x = ms(
                        m,
                        Some(i),
                        if missing {
                            MemberState::Missing
                        } else {
                            MemberState::Failed
                        },
                    );
                    x.reason = reason(s);
                    members.push(x)
                }
                (None, state) => members.push(MemberStatus {
                    slot: Some(i),
                    group: Some(i / w),
                    path: None,
                    uuid: s.entry.as_ref().map(|e| e.uuid.to_string()),
                    state: if state == SlotState::Empty {
                        MemberState::Empty
                    } else if missing || self.report.lock().missing.contains(&i) {
                        MemberState::Missing
                    } else {
                        MemberState::Failed
                    },
                    reason: reason(s),
                    domain: s
                        .entry
                        .as_ref()
                        .map(|e| e.domain.clone())
                        .unwrap_or_default(),
                    size: 0,
                    read_errors: 0,
                    write_errors: 0,
                    checksum_errors: 0,
                    repaired: 0,
                    reads: 0,
                    writes: 0,
                    nospace: 0,
                    recovered: None,
                    bitmap_recovery: false,
                    recovery_bytes: None,
                }),
                (Some(m), SlotState::Empty) => members.push(ms(m, Some(i), MemberState::Missing)),
            }
            if let Some((m, r)) = &s.replacement {
                rebuilding = true;
                let mut x = ms(m, Some(i), MemberState::Replacing);
                x.recovered = Some(r.load(Ordering::Relaxed));
                members.push(x);
            }
        }
        for m in &st.spares {
            members.push(ms(m, None, MemberState::Spare));
        }
        let degraded = st.slots.iter().any(|s| s.state != SlotState::Active);
        let resync = self.resync_offset.load(Ordering::Relaxed);
        let process = self.process.lock().as_ref().map(|p| p.status());
        let rescue = self.rescue.load(Ordering::Relaxed);
        let state = if st.failed.is_some() {
            ArrayState::Failed
        } else if rescue {
            ArrayState::Rescue
        } else if rebuilding {
            ArrayState::Rebuilding
        } else if degraded {
            ArrayState::Degraded
        } else if resync != u64::MAX {
            ArrayState::Resyncing
        } else {
            ArrayState::Optimal
        };
        Status {
            name: self.name.clone(),
            uuid: self.uuid.to_string(),
            level: self.geometry.level,
            state,
            failed_reason: st.failed.clone(),
            read_only: rescue,
            size: self.size,
            chunk: self.geometry.chunk,
            groups: self.geometry.groups,
            width: self.geometry.width,
            redundancy: self.geometry.redundancy(),
            event,
            members,
            process: process.filter(|p| !p.finished),
            last_process: self.last_process(),
            bitmap_region: self.bitmap.as_ref().map(|b| b.region),
            dirty_regions: self.bitmap.as_ref().map(|b| b.dirty_count()).unwrap_or(0),
            inconsistent_stripes: self
                .bitmap
                .as_ref()
                .map(|b| b.unsynced_stripes().len() as u64)
                .unwrap_or(0),
            resync_offset: (resync != u64::MAX).then_some(resync),
            assembly: self.report(),
            recoveries: self.recovery_status(),
            sync: self.sync_status(),
            log: self.log_status(),
        }
    }

    pub fn scheme(&self) -> Scheme {
        self.geometry.scheme()
    }
}
