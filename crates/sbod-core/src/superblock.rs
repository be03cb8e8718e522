//! The on-member superblock: who the member is, which array it belongs to, the array's
//! geometry and the state of every slot, with a crc32c and an event counter.
//!
//! Two copies live at the start of every member (0 and 32 KiB); a write of event `e` goes
//! to copy `e % 2`, so a torn write always leaves the previous copy intact. The reader takes
//! the valid copy with the higher event. The format is little-endian and hand-encoded so
//! that every byte is defined here and a damaged block is refused with a message, never a
//! panic.
//!
//! Version 2 adds what deciding which member to trust needs (see `freshness`): the session
//! (a new id each time the array is started for writing) and the recent sessions before it,
//! the event since which the write-intent bitmap covers every write (`bitmap_since`), and
//! per slot why its member is out. After the fixed body comes an extension area of tagged
//! records, so later features add fields without a new version: an unknown record marked
//! incompatible makes the superblock refused (a newer sbod wrote it), an unknown compatible
//! one is kept and written back unchanged. Version 1 superblocks are still read.
//!
//! Records this sbod knows: the sync mode ([`TAG_SYNC`], compatible: an older sbod keeps
//! it and honours every FLUSH, which is safe) and the log devices ([`TAG_LOG`],
//! incompatible: an older sbod would start the array without replaying the log, and lose
//! writes the log acknowledged), and the checksum tags' region ([`TAG_CHECKSUMS`],
//! incompatible: an older sbod would write data without tags; the tags themselves are
//! `integrity`'s).

use crate::layout::{Declustered, Geometry, Level};
use sbod_types::SyncMode;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

pub const MAGIC: [u8; 8] = *b"SBODsb\x00\x01";
pub const VERSION: u32 = 2;
/// Sessions remembered in `history` (md keeps one event counter; the ids of the last
/// starts also tell a member that went on elsewhere from one that merely stopped early).
pub const MAX_HISTORY: usize = 16;
/// Extension record flag: a reader that does not know the tag must refuse the superblock.
pub const EXT_INCOMPAT: u16 = 1;
/// Extension record: the sync mode, one byte (written only when not `standard`).
pub const TAG_SYNC: u16 = 1;
/// Extension record: the log devices (written only when the array has some).
pub const TAG_LOG: u16 = 2;
/// Extension record: where the checksum tags live ([`TagLayout`], written only when the
/// array carries tags).
pub const TAG_CHECKSUMS: u16 = 0x0015;
/// A reshape in progress (record [`TAG_RESHAPE`], incompatible: an older sbod would read
/// the volume in one layout while half of it is in the other).
pub const TAG_RESHAPE: u16 = 0x0016;
/// Parity on dedicated members (record [`TAG_DEDICATED`], one byte: the geometry's
/// `dedicated`; incompatible: an older sbod would look for that parity where it rotates).
pub const TAG_DEDICATED: u16 = 0x0018;
/// A declustered layout (record [`TAG_DECLUSTER`], incompatible): its spare space, the
/// seed of its permutation table and the table's checksum, checked at every decode so a
/// change of the table's code cannot silently remap the data (see `placement::Decl`).
pub const TAG_DECLUSTER: u16 = 0x0017;
/// Most log devices an array records (a log, and its mirror).
pub const MAX_LOG_DEVICES: usize = 2;
/// Bytes reserved for each superblock copy.
pub const COPY_SIZE: usize = 32 * 1024;
/// Where the owner block lives on every member (see `owner`): the last 4 KiB of the first
/// copy's area, which a superblock's bytes never reach.
pub const OWNER_OFFSET: u64 = (COPY_SIZE - 4096) as u64;
/// Where the write-intent bitmap starts.
pub const BITMAP_OFFSET: u64 = 64 * 1024;
/// Longest array name.
pub const MAX_NAME: usize = 64;
/// Longest failure-domain label.
pub const MAX_DOMAIN: usize = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SlotState {
    /// In sync, serving.
    Active,
    /// Being rebuilt: valid below `recovery_offset`.
    Rebuilding,
    /// Failed: not read, not written.
    Failed,
    /// No member.
    Empty,
}

impl SlotState {
    fn code(self) -> u8 {
        match self {
            SlotState::Active => 1,
            SlotState::Rebuilding => 2,
            SlotState::Failed => 3,
            SlotState::Empty => 4,
        }
    }
    fn from_code(c: u8) -> Option<SlotState> {
        Some(match c {
            1 => SlotState::Active,
            2 => SlotState::Rebuilding,
            3 => SlotState::Failed,
            4 => SlotState::Empty,
            _ => return None,
        })
    }
}

/// Why a slot's member is out of service (or, on a rebuilding slot, why it is being
/// recovered). Stored as a code; codes this sbod does not know are kept as `Other`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutReason {
    /// A write (or the rebuild's write) to it failed.
    WriteError,
    /// It failed more reads than `max_read_errors`.
    ReadErrors,
    FlushError,
    /// Its superblock or bitmap could not be written.
    MetadataWrite,
    /// A range could not be rewritten after a read error or a scrub.
    RepairWrite,
    /// `sbod fail`.
    Admin,
    /// Not present when the array was started (`--degraded`).
    Missing,
    /// Its superblock is older than the array's: it missed writes.
    Stale,
    /// The device got smaller than the data it holds.
    Shrank,
    /// Reads returned fewer bytes than asked (the device lies about its size).
    ShortRead,
    /// A remote member whose host could not be reached (refused, reset, timed out).
    Unreachable,
    /// A scrub located wrong data on it (silent corruption) past `max_checksum_errors`.
    Corrupt,
    /// A code written by a newer sbod.
    Other(u8),
}

impl OutReason {
    pub fn code(self) -> u8 {
        match self {
            OutReason::WriteError => 1,
            OutReason::ReadErrors => 2,
            OutReason::FlushError => 3,
            OutReason::MetadataWrite => 4,
            OutReason::RepairWrite => 5,
            OutReason::Admin => 6,
            OutReason::Missing => 7,
            OutReason::Stale => 8,
            OutReason::Shrank => 9,
            OutReason::ShortRead => 10,
            OutReason::Unreachable => 11,
            OutReason::Corrupt => 12,
            OutReason::Other(c) => c,
        }
    }

    pub fn from_code(c: u8) -> OutReason {
        match c {
            1 => OutReason::WriteError,
            2 => OutReason::ReadErrors,
            3 => OutReason::FlushError,
            4 => OutReason::MetadataWrite,
            5 => OutReason::RepairWrite,
            6 => OutReason::Admin,
            7 => OutReason::Missing,
            8 => OutReason::Stale,
            9 => OutReason::Shrank,
            10 => OutReason::ShortRead,
            11 => OutReason::Unreachable,
            12 => OutReason::Corrupt,
            c => OutReason::Other(c),
        }
    }
}

impl std::fmt::Display for OutReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OutReason::WriteError => write!(f, "failed: write error"),
            OutReason::ReadErrors => write!(f, "failed: too many read errors"),
            OutReason::FlushError => write!(f, "failed: flush error"),
            OutReason::MetadataWrite => write!(f, "failed: superblock or bitmap write error"),
            OutReason::RepairWrite => write!(f, "failed: a repair could not be written"),
            OutReason::Admin => write!(f, "failed by the administrator"),
            OutReason::Missing => write!(f, "missing"),
            OutReason::Stale => write!(f, "stale"),
            OutReason::Shrank => write!(f, "failed: the device shrank"),
            OutReason::ShortRead => write!(f, "failed: short read"),
            OutReason::Unreachable => write!(f, "failed: unreachable"),
            OutReason::Corrupt => write!(f, "failed: returned wrong data (silent corruption)"),
            OutReason::Other(c) => write!(f, "failed (reason code {c})"),
        }
    }
}

/// Why and at which event a slot's member went out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutRecord {
    pub reason: OutReason,
    /// For `Stale`: the event the member's own superblock had; otherwise the array's event
    /// when it happened.
    pub event: u64,
}

/// One start of the array for writing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionRec {
    pub id: Uuid,
    /// The event its first superblock write had.
    pub start_event: u64,
    /// Unix seconds.
    pub started: u64,
}

/// An extension record this sbod does not know, kept as read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Extension {
    pub tag: u16,
    pub flags: u16,
    pub data: Vec<u8>,
}

/// A log device as the array records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct LogDevEntry {
    pub uuid: Uuid,
    /// In service: written with every record, trusted at replay. Otherwise it failed (or
    /// was missing) at `out`'s event and holds nothing the array relies on.
    pub active: bool,
    pub out: Option<OutRecord>,
}

/// The array's log as its superblocks record it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LogConfig {
    /// Every write of the session goes through the log (the engine journals): after a
    /// crash, replaying it leaves every stripe consistent. False: the log is attached but
    /// writes take the in-pool path.
    pub journal: bool,
    /// Empty: no log.
    pub devices: Vec<LogDevEntry>,
}

fn sync_code(m: SyncMode) -> u8 {
    match m {
        SyncMode::Standard => 0,
        SyncMode::Always => 1,
        SyncMode::Disabled => 2,
    }
}

/// A member as the array records it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MemberEntry {
    pub uuid: Uuid,
    /// Failure domain (enclosure, host, shared physical disk); empty if none.
    pub domain: String,
    /// Data bytes this member contributes (concat members may differ).
    pub size: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Slot {
    pub member: Option<MemberEntry>,
    pub state: SlotState,
    /// For `Rebuilding`: member data below this offset is valid.
    pub recovery_offset: u64,
    /// A member being rebuilt to take this slot over while the current one still serves.
    pub replacement: Option<(MemberEntry, u64)>,
    /// Failed: why. Rebuilding: why it is being recovered (stale, missing, ...).
    pub out: Option<OutRecord>,
    /// Rebuilding from the write-intent bitmap: only regions whose bit is set are rebuilt
    /// (the member was in sync before and missed only what the bitmap records).
    pub bitmap_recovery: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Superblock {
    pub array_uuid: Uuid,
    pub name: String,
    /// Unix seconds.
    pub created: u64,
    pub event: u64,
    /// The member this copy was written to.
    pub this_member: Uuid,
    pub geometry: Geometry,
    /// Write-intent bitmap: bytes of member space per bit, and bytes of bitmap.
    pub bitmap_region: u64,
    pub bitmap_bytes: u32,
    /// Shut down cleanly: no resync needed.
    pub clean: bool,
    /// Parity is known good below this member offset (u64::MAX: everywhere).
    pub resync_offset: u64,
    pub slots: Vec<Slot>,
    pub spares: Vec<MemberEntry>,
    /// The start of the array this superblock belongs to (nil in version 1).
    pub session: Uuid,
    /// The last starts, oldest first, this session last (empty in version 1).
    pub history: Vec<SessionRec>,
    /// Every write since this event has its region's bit set in the bitmap of the members
    /// in sync: a member that left at or after it can be recovered from the bitmap alone.
    pub bitmap_since: u64,
    /// What FLUSH and FUA do (record [`TAG_SYNC`]).
    pub sync: SyncMode,
    /// The log devices (record [`TAG_LOG`]).
    pub log: LogConfig,
    /// Where the checksum tags live, if the array has them (record [`TAG_CHECKSUMS`]).
    pub tags: Option<TagLayout>,
    /// A reshape in progress: the layout the volume had before it, and how far it got
    /// (record [`TAG_RESHAPE`]). `geometry` is the layout it goes to.
    pub reshape: Option<ReshapeRec>,
    /// A declustered layout's distributed spare space in use (in record
    /// [`TAG_DECLUSTER`]): which slots' chunks live in it, and a transition under way.
    pub spared: SpareRec,
    /// Extension records this sbod does not know (compatible ones), kept as read.
    pub extensions: Vec<Extension>,
}

/// The slots of a declustered array whose chunks live in its distributed spare space, as
/// the members record it (docs/ENGINE.md, "Declustered layouts"): `list` in the order
/// they were spared; `next`, a transition under way to another list (a distributed
/// rebuild adds a slot, a copy-back removes one), with the member row below which it
/// holds. Empty for every array with nothing spared (the record's version 1). `first`: a
/// distributed rebuild's first pass (`placement::Spared`): the other slot out, and the
/// row below which the rows where both hold chunks of one stripe are moved (the
/// transition flag 2; only with `next`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SpareRec {
    pub list: Vec<u16>,
    pub next: Option<(Vec<u16>, u64)>,
    pub first: Option<(u16, u64)>,
}

impl SpareRec {
    pub fn is_empty(&self) -> bool {
        self.list.is_empty() && self.next.is_none()
    }
}

/// A reshape in progress, as the members record it: the volume below `pos` is in the new
/// layout (the superblock's geometry), from `pos` on in the old one. `backup`: the window
/// being moved when its new stripes overwrite old data still in it (the first stripes of a
/// wider layout), whose bytes were first written aside.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ReshapeRec {
    pub old: Geometry,
    pub pos: u64,
    pub backup: Option<BackupRec>,
}

/// A window's volume bytes written aside before the window is overwritten in place: on
/// each new member, at member offset `at` (from the data area's start), with a crc32c.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct BackupRec {
    pub start: u64,
    pub len: u64,
    pub at: u64,
    pub crc: u32,
}

impl ReshapeRec {
    fn encode(&self) -> Vec<u8> {
        let mut w = W(Vec::with_capacity(96));
        let g = &self.old;
        let (code, k, m) = level_code(g.level);
        // Version 2 adds the old layout's dedicated parity (the last byte).
        w.u8(if g.dedicated > 0 { 2 } else { 1 });
        w.u8(code);
        w.u32(k as u32);
        w.u32(m as u32);
        w.u32(g.groups);
        w.u32(g.width);
        w.u32(g.chunk);
        w.u64(g.member_size);
        w.u64(g.data_offset);
        w.u64(self.pos);
        match &self.backup {
            Some(b) => {
                w.u8(1);
                w.u64(b.start);
                w.u64(b.len);
                w.u64(b.at);
                w.u32(b.crc);
            }
            None => w.u8(0),
        }
        if g.dedicated > 0 {
            w.u8(g.dedicated);
        }
        w.0
    }

    fn decode(d: &[u8]) -> Result<ReshapeRec, SbError> {
        let mut r = R { b: d, pos: 0 };
        let version = r.u8()?;
        if !(1..=2).contains(&version) {
            return Err(SbError::Malformed("unknown reshape record version".into()));
        }
        let code = r.u8()?;
        let k = r.u32()?;
        let m = r.u32()?;
        if k > u16::MAX as u32 || m > u16::MAX as u32 {
            return Err(SbError::Malformed(
                "bad old level in the reshape record".into(),
            ));
        }
        let old = Geometry {
            level: level_from(code, k as u16, m as u16)?,
            groups: r.u32()?,
            width: r.u32()?,
            chunk: r.u32()?,
            member_size: r.u64()?,
            data_offset: r.u64()?,
            dedicated: 0,
            declustered: None,
        };
        let pos = r.u64()?;
        let backup = match r.u8()? {
            0 => None,
            1 => Some(BackupRec {
                start: r.u64()?,
                len: r.u64()?,
                at: r.u64()?,
                crc: r.u32()?,
            }),
            _ => return Err(SbError::Malformed("bad reshape backup flag".into())),
        };
        let mut old = old;
        if version >= 2 {
            old.dedicated = r.u8()?;
        }
        old.validate()
            .map_err(|e| SbError::Malformed(format!("reshape record: {e}")))?;
        if r.pos != d.len() {
            return Err(SbError::Malformed(
                "trailing bytes in the reshape record".into(),
            ));
        }
        Ok(ReshapeRec { old, pos, backup })
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SbError {
    #[error("no sbod superblock (wrong magic)")]
    NoMagic,
    #[error(
        "superblock version {0} is newer than this sbod understands ({VERSION}); upgrade sbod"
    )]
    Version(u32),
    #[error(
        "the superblock was written by a newer sbod (feature {0} is not known here); upgrade sbod"
    )]
    Incompatible(u16),
    #[error("superblock checksum mismatch (stored {stored:#010x}, computed {computed:#010x}): the block is damaged")]
    Checksum { stored: u32, computed: u32 },
    #[error("superblock is malformed: {0}")]
    Malformed(String),
}

struct W(Vec<u8>);
impl W {
    fn u8(&mut self, v: u8) {
        self.0.push(v)
    }
    fn u16(&mut self, v: u16) {
        self.0.extend_from_slice(&v.to_le_bytes())
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes())
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes())
    }
    fn uuid(&mut self, u: &Uuid) {
        self.0.extend_from_slice(u.as_bytes())
    }
    fn str(&mut self, s: &str) {
        self.u8(s.len() as u8);
        self.0.extend_from_slice(s.as_bytes());
    }
    fn member(&mut self, m: &MemberEntry) {
        self.uuid(&m.uuid);
        self.u64(m.size);
        self.str(&m.domain);
    }
}

struct R<'a> {
    b: &'a [u8],
    pos: usize,
}
impl<'a> R<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], SbError> {
        if self.pos + n > self.b.len() {
            return Err(SbError::Malformed(format!(
                "truncated at byte {}",
                self.pos
            )));
        }
        let s = &self.b[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, SbError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, SbError> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().unwrap()))
    }
    fn u32(&mut self) -> Result<u32, SbError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    fn u64(&mut self) -> Result<u64, SbError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
    fn uuid(&mut self) -> Result<Uuid, SbError> {
        Ok(Uuid::from_bytes(self.take(16)?.try_into().unwrap()))
    }
    fn str(&mut self, max: usize, what: &str) -> Result<String, SbError> {
        let n = self.u8()? as usize;
        if n > max {
            return Err(SbError::Malformed(format!(
                "{what} is {n} bytes, at most {max}"
            )));
        }
        String::from_utf8(self.take(n)?.to_vec())
            .map_err(|_| SbError::Malformed(format!("{what} is not UTF-8")))
    }
    fn member(&mut self) -> Result<MemberEntry, SbError> {
        Ok(MemberEntry {
            uuid: self.uuid()?,
            size: self.u64()?,
            domain: self.str(MAX_DOMAIN, "domain label")?,
        })
    }
}

fn level_code(l: Level) -> (u8, u16, u16) {
    match l {
        Level::Raid0 => (0, 0, 0),
        Level::Raid1 => (1, 0, 0),
        Level::Raid10 => (10, 0, 0),
        Level::Raid5 => (5, 0, 0),
        Level::Raid6 => (6, 0, 0),
        Level::Ec { k, m } => (100, k, m),
        Level::Concat => (200, 0, 0),
    }
}

fn level_from(code: u8, k: u16, m: u16) -> Result<Level, SbError> {
    Ok(match code {
        0 => Level::Raid0,
        1 => Level::Raid1,
        10 => Level::Raid10,
        5 => Level::Raid5,
        6 => Level::Raid6,
        100 => Level::Ec { k, m },
        200 => Level::Concat,
        c => return Err(SbError::Malformed(format!("unknown level code {c}"))),
    })
}

// Header layout: magic[8] version u32 length u32 crc u32, then the body.
const HDR: usize = 20;

impl Superblock {
    pub fn encode(&self) -> Vec<u8> {
        self.encode_as(VERSION)
    }

    /// Encode in an older format (version 1 drops what version 2 added): for tests of
    /// arrays written by an older sbod.
    #[doc(hidden)]
    pub fn encode_as(&self, version: u32) -> Vec<u8> {
        let v2 = version >= 2;
        let mut w = W(Vec::with_capacity(4096));
        w.0.extend_from_slice(&MAGIC);
        w.u32(version);
        w.u32(0); // length, patched below
        w.u32(0); // crc, patched below
        w.uuid(&self.array_uuid);
        w.str(&self.name);
        w.u64(self.created);
        w.u64(self.event);
        w.uuid(&self.this_member);
        let g = &self.geometry;
        let (code, k, m) = level_code(g.level);
        w.u8(code);
        w.u32(k as u32);
        w.u32(m as u32);
        w.u32(g.groups);
        w.u32(g.width);
        w.u32(g.chunk);
        w.u64(g.member_size);
        w.u64(g.data_offset);
        w.u64(self.bitmap_region);
        w.u32(self.bitmap_bytes);
        w.u8(self.clean as u8);
        w.u64(self.resync_offset);
        w.u32(self.slots.len() as u32);
        for s in &self.slots {
            w.u8(s.state.code());
            w.u64(s.recovery_offset);
            match &s.member {
                Some(m) => {
                    w.u8(1);
                    w.member(m);
                }
                None => w.u8(0),
            }
            match &s.replacement {
                Some((m, off)) => {
                    w.u8(1);
                    w.member(m);
                    w.u64(*off);
                }
                None => w.u8(0),
            }
            if !v2 {
                continue;
            }
            match s.out {
                Some(o) => {
                    // Code 0 means "none": a reason is never written as 0.
                    w.u8(o.reason.code().max(1));
                    w.u64(o.event);
                }
                None => {
                    w.u8(0);
                    w.u64(0);
                }
            }
            w.u8(s.bitmap_recovery as u8);
        }
        w.u32(self.spares.len() as u32);
        for m in &self.spares {
            w.member(m);
        }
        if v2 {
            self.encode_v2_tail(&mut w);
        }
        let len = w.0.len() as u32;
        w.0[12..16].copy_from_slice(&len.to_le_bytes());
        let crc = crc32c::crc32c(&w.0);
        w.0[16..20].copy_from_slice(&crc.to_le_bytes());
        // The copy's last 4 KiB hold the owner block (see `owner`), never written here.
        assert!(
            w.0.len() <= OWNER_OFFSET as usize,
            "superblock outgrew its {} bytes",
            OWNER_OFFSET
        );
        w.0
    }

    fn encode_v2_tail(&self, w: &mut W) {
        w.uuid(&self.session);
        w.u64(self.bitmap_since);
        let skip = self.history.len().saturating_sub(MAX_HISTORY);
        w.u8((self.history.len() - skip) as u8);
        for h in &self.history[skip..] {
            w.uuid(&h.id);
            w.u64(h.start_event);
            w.u64(h.started);
        }
        let mut record = |tag: u16, flags: u16, data: &[u8]| {
            w.u16(tag);
            w.u16(flags);
            w.u32(data.len() as u32);
            w.0.extend_from_slice(data);
        };
        if self.sync != SyncMode::Standard {
            record(TAG_SYNC, 0, &[sync_code(self.sync)]);
        }
        if !self.log.devices.is_empty() {
            let mut d = W(Vec::new());
            d.u8(self.log.journal as u8);
            d.u8(self.log.devices.len() as u8);
            for l in &self.log.devices {
                d.uuid(&l.uuid);
                d.u8(l.active as u8);
                match l.out {
                    Some(o) => {
                        d.u8(o.reason.code().max(1));
                        d.u64(o.event);
                    }
                    None => {
                        d.u8(0);
                        d.u64(0);
                    }
                }
            }
            record(TAG_LOG, EXT_INCOMPAT, &d.0);
        }
        if let Some(t) = &self.tags {
            record(TAG_CHECKSUMS, EXT_INCOMPAT, &t.encode());
        }
        if let Some(r) = &self.reshape {
            record(TAG_RESHAPE, EXT_INCOMPAT, &r.encode());
        }
        if self.geometry.dedicated > 0 {
            record(TAG_DEDICATED, EXT_INCOMPAT, &[self.geometry.dedicated]);
        }
        if let Some(d) = &self.geometry.declustered {
            let mut x = W(Vec::with_capacity(17));
            // Version 1: the layout; version 2 adds the spared slots and a transition;
            // version 3 (the layouts with a row height above 1) the height before them.
            // Version 4 (the balanced map) the map after the height: an older sbod refuses it
            // rather than place the data by the other map.
            // An array of height 1 writes what it always did, so older sbods assemble it.
            let version = match (d.map, d.height, self.spared.is_empty()) {
                (0, 1, true) => 1,
                (0, 1, false) => 2,
                (0, _, _) => 3,
                _ => 4,
            };
            x.u8(version);
            x.u32(d.spares);
            x.u64(d.seed);
            x.u32(crate::placement::Decl::for_layout(&self.geometry).checksum());
            if version >= 3 {
                x.u32(d.height);
            }
            if version == 4 {
                x.u8(d.map);
            }
            if version >= 2 {
                let list = |x: &mut W, l: &[u16]| {
                    x.u8(l.len() as u8);
                    for &s in l {
                        x.u16(s);
                    }
                };
                list(&mut x, &self.spared.list);
                match (&self.spared.next, &self.spared.first) {
                    (Some((l, row)), first) => {
                        x.u8(if first.is_some() { 2 } else { 1 });
                        list(&mut x, l);
                        x.u64(*row);
                        if let Some((slot, frow)) = first {
                            x.u16(*slot);
                            x.u64(*frow);
                        }
                    }
                    (None, _) => x.u8(0),
                }
            }
            record(TAG_DECLUSTER, EXT_INCOMPAT, &x.0);
        }
        for e in &self.extensions {
            w.u16(e.tag);
            w.u16(e.flags);
            w.u32(e.data.len() as u32);
            w.0.extend_from_slice(&e.data);
        }
    }

    /// Decode one copy. Never panics, whatever the bytes.
    pub fn decode(b: &[u8]) -> Result<Superblock, SbError> {
        if b.len() < HDR || b[..8] != MAGIC {
            return Err(SbError::NoMagic);
        }
        let version = u32::from_le_bytes(b[8..12].try_into().unwrap());
        if !(1..=VERSION).contains(&version) {
            return Err(SbError::Version(version));
        }
        let v2 = version >= 2;
        let len = u32::from_le_bytes(b[12..16].try_into().unwrap()) as usize;
        if !(HDR..=COPY_SIZE.min(b.len())).contains(&len) {
            return Err(SbError::Malformed(format!("length {len} out of range")));
        }
        let stored = u32::from_le_bytes(b[16..20].try_into().unwrap());
        let mut copy = b[..len].to_vec();
        copy[16..20].fill(0);
        let computed = crc32c::crc32c(&copy);
        if stored != computed {
            return Err(SbError::Checksum { stored, computed });
        }
        let mut r = R {
            b: &b[..len],
            pos: HDR,
        };
        let array_uuid = r.uuid()?;
        let name = r.str(MAX_NAME, "array name")?;
        let created = r.u64()?;
        let event = r.u64()?;
        let this_member = r.uuid()?;
        let code = r.u8()?;
        let k = r.u32()?;
        let m = r.u32()?;
        if k > 256 || m > 256 {
            return Err(SbError::Malformed(
                "erasure code parameters out of range".into(),
            ));
        }
        let level = level_from(code, k as u16, m as u16)?;
        let mut geometry = Geometry {
            level,
            groups: r.u32()?,
            width: r.u32()?,
            chunk: r.u32()?,
            member_size: r.u64()?,
            data_offset: r.u64()?,
            dedicated: 0,
            declustered: None,
        };
        geometry.validate().map_err(SbError::Malformed)?;
        let bitmap_region = r.u64()?;
        let bitmap_bytes = r.u32()?;
        let clean = r.u8()? != 0;
        let resync_offset = r.u64()?;
        let nslots = r.u32()? as usize;
        // A declustered layout's spare members' worth of slots are told by its record,
        // read below; the count is checked again then.
        if nslots < geometry.members() || nslots > geometry.members() + 256 {
            return Err(SbError::Malformed(format!(
                "{nslots} slots for a geometry of {} members",
                geometry.members()
            )));
        }
        let mut slots = Vec::with_capacity(nslots);
        for _ in 0..nslots {
            let state = SlotState::from_code(r.u8()?)
                .ok_or_else(|| SbError::Malformed("unknown slot state".into()))?;
            let recovery_offset = r.u64()?;
            let member = match r.u8()? {
                0 => None,
                1 => Some(r.member()?),
                _ => return Err(SbError::Malformed("bad member flag".into())),
            };
            let replacement = match r.u8()? {
                0 => None,
                1 => Some((r.member()?, r.u64()?)),
                _ => return Err(SbError::Malformed("bad replacement flag".into())),
            };
            let (out, bitmap_recovery) = if v2 {
                let code = r.u8()?;
                let event = r.u64()?;
                let out = (code != 0).then(|| OutRecord {
                    reason: OutReason::from_code(code),
                    event,
                });
                let flags = r.u8()?;
                if flags > 1 {
                    return Err(SbError::Malformed("unknown slot flags".into()));
                }
                (out, flags == 1)
            } else {
                (None, false)
            };
            slots.push(Slot {
                member,
                state,
                recovery_offset,
                replacement,
                out,
                bitmap_recovery,
            });
        }
        let nspares = r.u32()? as usize;
        if nspares > 1024 {
            return Err(SbError::Malformed(format!("{nspares} spares")));
        }
        let mut spares = Vec::with_capacity(nspares);
        for _ in 0..nspares {
            spares.push(r.member()?);
        }
        let (session, bitmap_since, history, extensions, known) = if v2 {
            let session = r.uuid()?;
            let bitmap_since = r.u64()?;
            let n = r.u8()? as usize;
            if n > MAX_HISTORY {
                return Err(SbError::Malformed(format!("{n} sessions in the history")));
            }
            let mut history = Vec::with_capacity(n);
            for _ in 0..n {
                history.push(SessionRec {
                    id: r.uuid()?,
                    start_event: r.u64()?,
                    started: r.u64()?,
                });
            }
            if history
                .windows(2)
                .any(|w| w[0].start_event >= w[1].start_event)
                || history.last().is_some_and(|h| h.start_event > event)
            {
                return Err(SbError::Malformed(
                    "the session history is out of order".into(),
                ));
            }
            let mut extensions = Vec::new();
            let mut known = Known::default();
            while r.pos < len {
                let tag = r.u16()?;
                let flags = r.u16()?;
                let n = r.u32()? as usize;
                let data = r.take(n)?;
                if known.read(tag, data)? {
                    continue;
                }
                // An unknown record marked incompatible is a newer sbod's.
                if flags & EXT_INCOMPAT != 0 {
                    return Err(SbError::Incompatible(tag));
                }
                extensions.push(Extension {
                    tag,
                    flags,
                    data: data.to_vec(),
                });
            }
            (session, bitmap_since, history, extensions, known)
        } else {
            (Uuid::nil(), event, Vec::new(), Vec::new(), Known::default())
        };
        if let Some(d) = known.dedicated {
            geometry.dedicated = d;
            geometry
                .validate()
                .map_err(|e| SbError::Malformed(format!("dedicated parity: {e}")))?;
        }
        if let Some((d, crc)) = known.decluster {
            geometry.declustered = Some(d);
            geometry.validate().map_err(SbError::Malformed)?;
            let have = crate::placement::Decl::for_layout(&geometry).checksum();
            if have != crc {
                return Err(SbError::Malformed(format!(
                    "the declustered layout's permutation table has checksum {crc:08x} on the members but {have:08x} in this sbod: it would place the data elsewhere; assemble with the sbod that created the array"
                )));
            }
        }
        let spared_slots = known
            .spared
            .list
            .iter()
            .chain(known.spared.next.iter().flat_map(|(l, _)| l.iter()))
            .chain(known.spared.first.iter().map(|(s, _)| s));
        if let Some(s) = spared_slots.clone().find(|&&s| s as usize >= nslots) {
            return Err(SbError::Malformed(format!(
                "the declustered record spares slot {s} of {nslots}"
            )));
        }
        // A reshape that narrows the groups keeps the members leaving until it ends.
        let want = match &known.reshape {
            Some(r) if r.old.groups == geometry.groups && r.old.width > geometry.width => {
                r.old.members()
            }
            _ => geometry.members(),
        };
        if nslots != want {
            return Err(SbError::Malformed(format!(
                "{nslots} slots for a geometry of {want} members",
            )));
        }
        if geometry.data_offset < BITMAP_OFFSET + bitmap_bytes as u64
            || !geometry.data_offset.is_multiple_of(4096)
        {
            return Err(SbError::Malformed(
                "data offset overlaps the metadata area".into(),
            ));
        }
        if let Some(t) = &known.tags {
            t.check(&geometry, BITMAP_OFFSET + bitmap_bytes as u64)
                .map_err(SbError::Malformed)?;
        }
        // A narrowing keeps its members' old size until it ends (its new layout leaves
        // their last rows for its backup area).
        let holds = match &known.reshape {
            Some(r) => geometry.member_size.max(r.old.member_size),
            None => geometry.member_size,
        };
        let too_big = slots
            .iter()
            .flat_map(|s| s.member.iter().chain(s.replacement.iter().map(|r| &r.0)))
            .chain(spares.iter())
            .any(|m| m.size > holds);
        if too_big {
            return Err(SbError::Malformed(
                "a member records more data than the geometry holds".into(),
            ));
        }
        if bitmap_region == 0 || bitmap_region % geometry.chunk as u64 != 0 {
            return Err(SbError::Malformed(
                "bitmap region is not a multiple of the chunk".into(),
            ));
        }
        if (bitmap_bytes as u64) * 8 < geometry.member_size.div_ceil(bitmap_region) {
            return Err(SbError::Malformed(
                "bitmap too small for the member size".into(),
            ));
        }
        Ok(Superblock {
            array_uuid,
            name,
            created,
            event,
            this_member,
            geometry,
            bitmap_region,
            bitmap_bytes,
            clean,
            resync_offset,
            slots,
            spares,
            session,
            history,
            bitmap_since,
            sync: known.sync.unwrap_or_default(),
            log: known.log.unwrap_or_default(),
            tags: known.tags,
            reshape: known.reshape,
            spared: known.spared,
            extensions,
        })
    }

    /// Pick the newest valid of the two copies read from the start of a member
    /// (`area` is at least 2 * COPY_SIZE bytes). Errors describe the better failure.
    pub fn decode_area(area: &[u8]) -> Result<Superblock, SbError> {
        let a = Superblock::decode(&area[..COPY_SIZE.min(area.len())]);
        let b = if area.len() >= 2 * COPY_SIZE {
            Superblock::decode(&area[COPY_SIZE..2 * COPY_SIZE])
        } else {
            Err(SbError::NoMagic)
        };
        match (a, b) {
            (Ok(a), Ok(b)) => Ok(if b.event > a.event { b } else { a }),
            (Ok(a), Err(_)) => Ok(a),
            (Err(_), Ok(b)) => Ok(b),
            (Err(SbError::NoMagic), Err(e)) | (Err(e), Err(_)) => Err(e),
        }
    }

    /// Byte offset of the copy this superblock's event is written to.
    pub fn copy_offset(&self) -> u64 {
        (self.event % 2) * COPY_SIZE as u64
    }

    /// The slot (and whether as replacement) that `member` holds, if any.
    pub fn role_of(&self, member: &Uuid) -> Role {
        for (i, s) in self.slots.iter().enumerate() {
            if s.member.as_ref().map(|m| &m.uuid) == Some(member) {
                return Role::Slot(i);
            }
            if s.replacement.as_ref().map(|(m, _)| &m.uuid) == Some(member) {
                return Role::Replacement(i);
            }
        }
        if self.spares.iter().any(|m| &m.uuid == member) {
            return Role::Spare;
        }
        Role::None
    }
}

/// The extension records this sbod knows, as decoded (each at most once).
#[derive(Default)]
struct Known {
    sync: Option<SyncMode>,
    log: Option<LogConfig>,
    tags: Option<TagLayout>,
    reshape: Option<ReshapeRec>,
    dedicated: Option<u8>,
    /// The declustered layout and its table's checksum.
    decluster: Option<(Declustered, u32)>,
    /// Its spared slots (version 2 of the record).
    spared: SpareRec,
}

impl Known {
    /// Decode a record if its tag is known (true), else leave it (false).
    fn read(&mut self, tag: u16, data: &[u8]) -> Result<bool, SbError> {
        let twice = || SbError::Malformed(format!("extension record {tag} appears twice"));
        match tag {
            TAG_SYNC => {
                let mode = match data {
                    [0] => SyncMode::Standard,
                    [1] => SyncMode::Always,
                    [2] => SyncMode::Disabled,
                    _ => return Err(SbError::Malformed("unknown sync mode".into())),
                };
                if self.sync.replace(mode).is_some() {
                    return Err(twice());
                }
            }
            TAG_LOG => {
                let mut r = R { b: data, pos: 0 };
                let journal = match r.u8()? {
                    0 => false,
                    1 => true,
                    _ => return Err(SbError::Malformed("unknown log flags".into())),
                };
                let n = r.u8()? as usize;
                if n == 0 || n > MAX_LOG_DEVICES {
                    return Err(SbError::Malformed(format!("{n} log devices")));
                }
                let mut devs = Vec::with_capacity(n);
                for _ in 0..n {
                    let uuid = r.uuid()?;
                    let active = match r.u8()? {
                        0 => false,
                        1 => true,
                        _ => return Err(SbError::Malformed("bad log device state".into())),
                    };
                    let code = r.u8()?;
                    let event = r.u64()?;
                    devs.push(LogDevEntry {
                        uuid,
                        active,
                        out: (code != 0).then(|| OutRecord {
                            reason: OutReason::from_code(code),
                            event,
                        }),
                    });
                }
                if r.pos != data.len() {
                    return Err(SbError::Malformed(
                        "trailing bytes in the log record".into(),
                    ));
                }
                let cfg = LogConfig {
                    journal,
                    devices: devs,
                };
                if self.log.replace(cfg).is_some() {
                    return Err(twice());
                }
            }
            TAG_CHECKSUMS => {
                let t = TagLayout::decode(data).map_err(SbError::Malformed)?;
                if self.tags.replace(t).is_some() {
                    return Err(twice());
                }
            }
            TAG_RESHAPE => {
                let t = ReshapeRec::decode(data)?;
                if self.reshape.replace(t).is_some() {
                    return Err(twice());
                }
            }
            TAG_DEDICATED => {
                if data.len() != 1 || data[0] == 0 {
                    return Err(SbError::Malformed("bad dedicated parity record".into()));
                }
                if self.dedicated.replace(data[0]).is_some() {
                    return Err(twice());
                }
            }
            TAG_DECLUSTER => {
                let mut r = R { b: data, pos: 0 };
                let version = r.u8()?;
                if !(1..=4).contains(&version) {
                    return Err(SbError::Malformed(
                        "unknown declustered record version".into(),
                    ));
                }
                let spares = r.u32()?;
                let seed = r.u64()?;
                let crc = r.u32()?;
                let height = if version >= 3 { r.u32()? } else { 1 };
                let map = if version == 4 { r.u8()? } else { 0 };
                if map > 1 || (version == 4 && map == 0) {
                    return Err(SbError::Malformed(format!("unknown declustered map {map}")));
                }
                if version >= 2 {
                    let list = |r: &mut R| -> Result<Vec<u16>, SbError> {
                        let n = r.u8()? as usize;
                        let mut l = Vec::with_capacity(n);
                        for _ in 0..n {
                            let s = r.u16()?;
                            if l.contains(&s) {
                                return Err(SbError::Malformed(
                                    "a slot spared twice in the declustered record".into(),
                                ));
                            }
                            l.push(s);
                        }
                        if n > spares as usize {
                            return Err(SbError::Malformed(format!(
                                "{n} slots spared in a declustered layout with {spares} spares"
                            )));
                        }
                        Ok(l)
                    };
                    self.spared.list = list(&mut r)?;
                    self.spared.next = match r.u8()? {
                        0 => None,
                        f @ (1 | 2) => {
                            let l = list(&mut r)?;
                            let row = r.u64()?;
                            if f == 2 {
                                self.spared.first = Some((r.u16()?, r.u64()?));
                            }
                            Some((l, row))
                        }
                        _ => {
                            return Err(SbError::Malformed(
                                "bad transition flag in the declustered record".into(),
                            ))
                        }
                    };
                }
                if r.pos != data.len() || spares > 256 || height == 0 || height > 1 << 20 {
                    return Err(SbError::Malformed("bad declustered record".into()));
                }
                if self
                    .decluster
                    .replace((
                        Declustered {
                            spares,
                            seed,
                            height,
                            map,
                        },
                        crc,
                    ))
                    .is_some()
                {
                    return Err(twice());
                }
            }
            _ => return Ok(false),
        }
        Ok(true)
    }
}

/// Bytes of data per checksum tag.
pub const BLOCK: u64 = 4096;
/// Bytes of one tag block on the member (the unit read and written).
pub const TAG_BLOCK: usize = 4096;
/// Tags per tag block.
pub const TAGS_PER_BLOCK: u64 = (TAG_BLOCK / 4) as u64;
/// Data bytes one tag block covers.
pub const SPAN: u64 = TAGS_PER_BLOCK * BLOCK;

/// Where the checksum tags live on each member (record [`TAG_CHECKSUMS`]; the tags
/// themselves are `integrity`'s).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
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

    /// The record's bytes: kind 1 = crc32c per 4 KiB, flags, the tag region.
    fn encode(&self) -> Vec<u8> {
        let mut data = Vec::with_capacity(24);
        data.push(1u8); // crc32c
        data.push(self.zeroed as u8); // flags: 1 = never-written blocks are zeros
        data.extend_from_slice(&[0u8; 2]);
        data.extend_from_slice(&(BLOCK as u32).to_le_bytes());
        data.extend_from_slice(&self.offset.to_le_bytes());
        data.extend_from_slice(&self.bytes.to_le_bytes());
        data
    }

    /// The record as read (its own fields checked; see [`TagLayout::check`] for where it
    /// lies).
    pub fn decode(d: &[u8]) -> Result<TagLayout, String> {
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
        Ok(TagLayout {
            offset,
            bytes,
            zeroed: d[1] == 1,
        })
    }

    /// Checked against the geometry: the tags must lie between the bitmap (ending at
    /// `bitmap_end`) and the data and cover all of it.
    pub fn check(&self, g: &Geometry, bitmap_end: u64) -> Result<(), String> {
        if self.offset < bitmap_end
            || !self.offset.is_multiple_of(TAG_BLOCK as u64)
            || self
                .offset
                .checked_add(self.bytes)
                .is_none_or(|end| end > g.data_offset)
            || self.bytes < Self::bytes_for(g.member_size)
        {
            return Err("the checksum region does not fit between the bitmap and the data".into());
        }
        Ok(())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Slot(usize),
    Replacement(usize),
    Spare,
    None,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    pub fn sample() -> Superblock {
        let geometry = Geometry {
            level: Level::Raid6,
            groups: 2,
            width: 4,
            chunk: 65536,
            member_size: 65536 * 100,
            data_offset: 1 << 20,
            dedicated: 0,
            declustered: None,
        };
        Superblock {
            array_uuid: Uuid::new_v4(),
            name: "vol0".into(),
            created: 1_700_000_000,
            event: 7,
            this_member: Uuid::new_v4(),
            geometry,
            bitmap_region: 1 << 20,
            bitmap_bytes: 4096,
            clean: true,
            resync_offset: u64::MAX,
            slots: (0..8)
                .map(|i| Slot {
                    member: Some(MemberEntry {
                        uuid: Uuid::new_v4(),
                        domain: format!("enc{}", i % 3),
                        size: 65536 * 100,
                    }),
                    state: if i == 3 {
                        SlotState::Rebuilding
                    } else {
                        SlotState::Active
                    },
                    recovery_offset: if i == 3 { 4096 } else { 0 },
                    replacement: None,
                    out: match i {
                        3 => Some(OutRecord {
                            reason: OutReason::Stale,
                            event: 4,
                        }),
                        5 => Some(OutRecord {
                            reason: OutReason::Other(200),
                            event: 6,
                        }),
                        _ => None,
                    },
                    bitmap_recovery: i == 3,
                })
                .collect(),
            spares: vec![MemberEntry {
                uuid: Uuid::new_v4(),
                domain: String::new(),
                size: 65536 * 100,
            }],
            session: Uuid::new_v4(),
            history: vec![
                SessionRec {
                    id: Uuid::new_v4(),
                    start_event: 1,
                    started: 1_700_000_000,
                },
                SessionRec {
                    id: Uuid::new_v4(),
                    start_event: 5,
                    started: 1_700_000_100,
                },
            ],
            bitmap_since: 5,
            sync: SyncMode::Standard,
            log: LogConfig::default(),
            tags: None,
            reshape: None,
            spared: Default::default(),
            extensions: Vec::new(),
        }
    }

    #[test]
    fn version_1_superblocks_are_read_with_defaults() {
        let mut sb = sample();
        let b = sb.encode_as(1);
        let d = Superblock::decode(&b).unwrap();
        // What version 1 cannot say: no session, no reasons, and a bitmap that covers
        // nothing before the superblock's own event.
        assert_eq!(d.session, Uuid::nil());
        assert!(d.history.is_empty() && d.extensions.is_empty());
        assert_eq!(d.bitmap_since, d.event);
        assert!(d
            .slots
            .iter()
            .all(|s| s.out.is_none() && !s.bitmap_recovery));
        sb.session = Uuid::nil();
        sb.history.clear();
        sb.bitmap_since = sb.event;
        for s in sb.slots.iter_mut() {
            s.out = None;
            s.bitmap_recovery = false;
        }
        assert_eq!(d, sb);
        assert!(Superblock::decode(&sb.encode_as(3)).is_err());
    }

    /// A declustered layout's record round-trips; a table that does not match its
    /// recorded checksum (a code change that would remap the data) is refused by name.
    #[test]
    fn a_declustered_layout_is_recorded_and_its_table_checked() {
        let mut sb = sample();
        sb.geometry.declustered = Some(Declustered {
            spares: 1,
            seed: crate::layout::DECLUSTER_SEED,
            height: 1,
            map: 0,
        });
        let mut extra = sb.slots[0].clone();
        extra.member.as_mut().unwrap().uuid = Uuid::new_v4();
        sb.slots.push(extra);
        let b = sb.encode();
        assert_eq!(Superblock::decode(&b).unwrap(), sb);
        // Without its spare slot the count is wrong.
        let mut short = sb.clone();
        short.slots.pop();
        assert!(Superblock::decode(&short.encode()).is_err());
        // The record's checksum changed (as a new table would leave it), the copy's own
        // crc made right again.
        let head: Vec<u8> = [
            &TAG_DECLUSTER.to_le_bytes()[..],
            &EXT_INCOMPAT.to_le_bytes(),
            &17u32.to_le_bytes(),
        ]
        .concat();
        let at = b
            .windows(head.len())
            .position(|w| w == &head[..])
            .expect("the record");
        let mut bad = b.clone();
        bad[at + head.len() + 13] ^= 1;
        bad[16..20].fill(0);
        let crc = crc32c::crc32c(&bad);
        bad[16..20].copy_from_slice(&crc.to_le_bytes());
        let e = Superblock::decode(&bad).unwrap_err().to_string();
        assert!(e.contains("permutation table"), "{e}");
    }

    /// Where the data of an encoded superblock's declustered record starts.
    fn decluster_record_at(b: &[u8]) -> usize {
        let head: Vec<u8> = [
            &TAG_DECLUSTER.to_le_bytes()[..],
            &EXT_INCOMPAT.to_le_bytes(),
        ]
        .concat();
        b.windows(4)
            .position(|w| w == &head[..])
            .expect("the record")
            + 8
    }

    /// A declustered superblock (two spares' worth, height 1) with two more members.
    fn declustered_sample() -> Superblock {
        let mut sb = sample();
        sb.geometry.declustered = Some(Declustered {
            spares: 2,
            seed: crate::layout::DECLUSTER_SEED,
            height: 1,
            map: 0,
        });
        for i in 0..2 {
            let mut extra = sb.slots[0].clone();
            extra.member.as_mut().unwrap().uuid = Uuid::from_u128(77 + i);
            sb.slots.push(extra);
        }
        sb
    }

    /// A row height above 1 is recorded (version 3, with or without spared slots) and
    /// round-trips; height 1 writes version 1 or 2 as before (so an older sbod assembles
    /// such an array).
    #[test]
    fn a_row_height_is_recorded() {
        let mut sb = declustered_sample();
        let v1 = sb.encode();
        let find = |b: &[u8]| {
            let at = decluster_record_at(b);
            let len = u32::from_le_bytes(b[at - 4..at].try_into().unwrap()) as usize;
            b[at..at + len].to_vec()
        };
        assert_eq!(find(&v1)[0], 1);
        assert_eq!(find(&v1).len(), 17);
        for height in [16u32, 256] {
            sb.geometry.declustered.as_mut().unwrap().height = height;
            sb.spared = SpareRec::default();
            let b = sb.encode();
            let rec = find(&b);
            assert_eq!((rec[0], rec.len()), (3, 17 + 4 + 2));
            assert_eq!(Superblock::decode(&b).unwrap(), sb);
            sb.spared = SpareRec {
                list: vec![3],
                next: Some((vec![3, 7], 17)),
                first: Some((9, 20)),
            };
            let b = sb.encode();
            assert_eq!(find(&b)[0], 3);
            assert_eq!(Superblock::decode(&b).unwrap(), sb);
        }
    }

    /// The balanced map is recorded (version 4: the map after the height) and
    /// round-trips; a map byte this sbod does not know, or 0 in version 4, is refused.
    #[test]
    fn the_balanced_map_is_recorded() {
        let mut sb = declustered_sample();
        sb.geometry.declustered.as_mut().unwrap().map = 1;
        let b = sb.encode();
        assert_eq!(Superblock::decode(&b).unwrap(), sb);
        let at = decluster_record_at(&b);
        // Version, spares, seed, crc, height, map; then the empty spared list and flag.
        assert_eq!((b[at], b[at + 21]), (4, 1));
        for map in [0u8, 2] {
            let mut bad = b.clone();
            bad[at + 21] = map;
            bad[16..20].fill(0);
            let crc = crc32c::crc32c(&bad);
            bad[16..20].copy_from_slice(&crc.to_le_bytes());
            let e = Superblock::decode(&bad).unwrap_err().to_string();
            assert!(e.contains("declustered map"), "{map}: {e}");
        }
        // The other map's table is another table: its crc differs.
        let d0 =
            crate::placement::Decl::new(sb.geometry.members(), crate::layout::DECLUSTER_SEED, 1);
        let d1 = crate::placement::Decl::for_layout(&sb.geometry);
        assert_ne!(d0.checksum(), d1.checksum());
    }

    /// The spared slots and a transition round-trip (record version 2); an array with
    /// nothing spared writes version 1, as before; slots out of range are refused.
    #[test]
    fn spared_slots_are_recorded() {
        let mut sb = declustered_sample();
        let v1 = sb.encode();
        assert_eq!(Superblock::decode(&v1).unwrap(), sb);
        sb.spared = SpareRec {
            list: vec![3],
            next: Some((vec![3, 7], 17)),
            first: None,
        };
        let v2 = sb.encode();
        // A count and a slot, a flag, a count and two slots, a row.
        assert_eq!(v2.len(), v1.len() + 3 + 1 + 5 + 8);
        assert_eq!(Superblock::decode(&v2).unwrap(), sb);
        // A first pass: its slot and row too.
        sb.spared.first = Some((9, 40));
        let v3 = sb.encode();
        assert_eq!(v3.len(), v2.len() + 2 + 8);
        assert_eq!(Superblock::decode(&v3).unwrap(), sb);
        sb.spared.first = Some((12, 40));
        let e = Superblock::decode(&sb.encode()).unwrap_err().to_string();
        assert!(e.contains("spares slot 12"), "{e}");
        sb.spared.first = None;
        sb.spared.next = None;
        assert_eq!(Superblock::decode(&sb.encode()).unwrap(), sb);
        sb.spared.list = vec![3, 9];
        assert_eq!(Superblock::decode(&sb.encode()).unwrap(), sb);
        sb.spared.list = vec![3, 10];
        let e = Superblock::decode(&sb.encode()).unwrap_err().to_string();
        assert!(e.contains("spares slot 10"), "{e}");
        sb.spared.list = vec![1, 2, 3];
        let e = Superblock::decode(&sb.encode()).unwrap_err().to_string();
        assert!(e.contains("3 slots spared"), "{e}");
    }

    fn with_extension(tag: u16, flags: u16, data: &[u8]) -> Vec<u8> {
        let mut sb = sample();
        sb.extensions.push(Extension {
            tag,
            flags,
            data: data.to_vec(),
        });
        sb.encode()
    }

    #[test]
    fn unknown_compatible_extensions_are_kept() {
        let b = with_extension(0x7001, 0, b"later feature");
        let d = Superblock::decode(&b).unwrap();
        assert_eq!(
            d.extensions,
            vec![Extension {
                tag: 0x7001,
                flags: 0,
                data: b"later feature".to_vec()
            }]
        );
        // Written back unchanged.
        assert_eq!(d.encode(), b);
    }

    #[test]
    fn unknown_incompatible_extensions_are_refused() {
        let b = with_extension(0x7002, EXT_INCOMPAT, &[1, 2, 3]);
        let e = Superblock::decode(&b).unwrap_err();
        assert_eq!(e, SbError::Incompatible(0x7002));
        assert!(e.to_string().contains("newer sbod"), "{e}");
        // A record that runs past the end is malformed, not read out of bounds.
        let mut b = with_extension(0x7003, 0, &[9; 16]);
        let len = u32::from_le_bytes(b[12..16].try_into().unwrap()) as usize;
        b[len - 16 - 4..len - 16].copy_from_slice(&1000u32.to_le_bytes());
        b[16..20].fill(0);
        let crc = crc32c::crc32c(&b[..len]);
        b[16..20].copy_from_slice(&crc.to_le_bytes());
        assert!(matches!(Superblock::decode(&b), Err(SbError::Malformed(_))));
    }

    /// Dedicated parity (a level change's): round-tripped in the geometry and in a
    /// reshape's old geometry, incompatible for an older sbod, checked against the level.
    #[test]
    fn dedicated_parity_round_trips_and_is_checked() {
        let mut sb = sample();
        sb.geometry.dedicated = 1;
        let d = Superblock::decode(&sb.encode()).unwrap();
        assert_eq!(d, sb);
        let mut old = sb.geometry.clone();
        old.level = Level::Raid5;
        old.width = 3;
        sb.reshape = Some(ReshapeRec {
            old,
            pos: 65536 * 3,
            backup: None,
        });
        assert_eq!(Superblock::decode(&sb.encode()).unwrap(), sb);
        // More dedicated parity than the level has: malformed, whatever else is right.
        let mut bad = sample();
        bad.geometry.dedicated = 3;
        assert!(matches!(
            Superblock::decode(&bad.encode()),
            Err(SbError::Malformed(_))
        ));
        // An sbod that does not know the record refuses the array.
        let b = with_extension(TAG_DEDICATED + 0x100, EXT_INCOMPAT, &[1]);
        assert!(matches!(
            Superblock::decode(&b),
            Err(SbError::Incompatible(_))
        ));
    }

    /// The checksum record: round-tripped, flagged incompatible (an older sbod must refuse
    /// an array with tags), and checked against the geometry and its own fields.
    #[test]
    fn the_checksum_record_round_trips_and_is_checked() {
        let mut sb = sample();
        sb.geometry.member_size = 1 << 30;
        sb.geometry.data_offset = 2 << 20;
        let t = TagLayout {
            offset: BITMAP_OFFSET + sb.bitmap_bytes as u64,
            bytes: TagLayout::bytes_for(1 << 30),
            zeroed: true,
        };
        assert_eq!(t.bytes, 1 << 20);
        let plain = sb.encode();
        assert_eq!(Superblock::decode(&plain).unwrap().tags, None);
        sb.tags = Some(t);
        let b = sb.encode();
        let d = Superblock::decode(&b).unwrap();
        assert_eq!(d.tags, Some(t));
        assert!(d.extensions.is_empty());
        assert_eq!(d.encode(), b, "written back as read");
        // The record's header: its tag, the incompatible flag, 24 bytes.
        let mut head = TAG_CHECKSUMS.to_le_bytes().to_vec();
        head.extend_from_slice(&EXT_INCOMPAT.to_le_bytes());
        head.extend_from_slice(&24u32.to_le_bytes());
        assert!(
            b.windows(head.len()).any(|w| w == head),
            "older sbods must refuse it"
        );
        assert!(!plain.windows(head.len()).any(|w| w == head));
        // The same record as an older sbod wrote it among the extensions reads the same.
        let mut old = sb.clone();
        old.tags = None;
        old.extensions.push(Extension {
            tag: TAG_CHECKSUMS,
            flags: EXT_INCOMPAT,
            data: t.encode(),
        });
        assert_eq!(Superblock::decode(&old.encode()).unwrap().tags, Some(t));
        // Overlapping the bitmap, or the data, or too small for the data: refused.
        let refused = |sb: &Superblock| {
            assert!(matches!(
                Superblock::decode(&sb.encode()),
                Err(SbError::Malformed(_))
            ));
        };
        let mut x = sb.clone();
        x.tags = Some(TagLayout {
            offset: t.offset - 4096,
            ..t
        });
        refused(&x);
        let mut x = sb.clone();
        x.geometry.data_offset = 1 << 20;
        refused(&x);
        let mut x = sb.clone();
        x.geometry.member_size = 2 << 30;
        refused(&x);
        // An unknown checksum kind: refused.
        let mut bad = t.encode();
        bad[0] = 9;
        assert!(TagLayout::decode(&bad).is_err());
        let mut x = sb.clone();
        x.tags = None;
        x.extensions.push(Extension {
            tag: TAG_CHECKSUMS,
            flags: EXT_INCOMPAT,
            data: bad,
        });
        refused(&x);
    }

    /// The records this sbod knows: typed, round-tripped, and flagged so that an older sbod
    /// keeps the sync mode (compatible) but refuses an array with a log (incompatible).
    #[test]
    fn sync_and_log_records() {
        let plain = sample();
        // Standard and no log: no record, the bytes an older sbod writes.
        let b = plain.encode();
        let mut sb = plain.clone();
        sb.sync = SyncMode::Disabled;
        sb.log.journal = true;
        sb.log.devices = vec![
            LogDevEntry {
                uuid: Uuid::new_v4(),
                active: true,
                out: None,
            },
            LogDevEntry {
                uuid: Uuid::new_v4(),
                active: false,
                out: Some(OutRecord {
                    reason: OutReason::WriteError,
                    event: 6,
                }),
            },
        ];
        sb.extensions.push(Extension {
            tag: 0x7001,
            flags: 0,
            data: b"later".to_vec(),
        });
        let enc = sb.encode();
        assert!(enc.len() > b.len());
        let d = Superblock::decode(&enc).unwrap();
        assert_eq!(d, sb);
        assert_eq!(d.encode(), enc);
        // What an older sbod sees: the records with their flags.
        let records = |b: &[u8]| -> Vec<(u16, u16)> {
            let mut sb = Superblock::decode(b).unwrap();
            // Parse the tail by hand: known records are typed, so strip them from a copy
            // and look at the raw area instead.
            sb.extensions.clear();
            let base = Superblock {
                sync: SyncMode::Standard,
                log: LogConfig::default(),
                ..sb
            }
            .encode()
            .len();
            let mut out = Vec::new();
            let mut pos = base;
            let len = u32::from_le_bytes(b[12..16].try_into().unwrap()) as usize;
            while pos < len {
                let tag = u16::from_le_bytes(b[pos..pos + 2].try_into().unwrap());
                let flags = u16::from_le_bytes(b[pos + 2..pos + 4].try_into().unwrap());
                let n = u32::from_le_bytes(b[pos + 4..pos + 8].try_into().unwrap()) as usize;
                out.push((tag, flags));
                pos += 8 + n;
            }
            out
        };
        assert_eq!(
            records(&enc),
            vec![(TAG_SYNC, 0), (TAG_LOG, EXT_INCOMPAT), (0x7001, 0)]
        );
        for mode in SyncMode::ALL {
            let x = Superblock {
                sync: *mode,
                ..plain.clone()
            };
            assert_eq!(Superblock::decode(&x.encode()).unwrap().sync, *mode);
        }
    }

    #[test]
    fn bad_known_records_are_malformed() {
        for (tag, data) in [
            (TAG_SYNC, vec![9u8]),
            (TAG_SYNC, vec![]),
            (TAG_LOG, vec![0u8, 0]),
            (TAG_LOG, vec![0u8, 3]),
            (TAG_LOG, vec![2u8, 1]),
            (TAG_LOG, vec![0u8, 1, 2]),
        ] {
            let b = with_extension(tag, 0, &data);
            assert!(
                matches!(Superblock::decode(&b), Err(SbError::Malformed(_))),
                "tag {tag} {data:?}"
            );
        }
        // Twice the same record.
        let mut sb = sample();
        sb.sync = SyncMode::Always;
        sb.extensions.push(Extension {
            tag: TAG_SYNC,
            flags: 0,
            data: vec![2],
        });
        assert!(matches!(
            Superblock::decode(&sb.encode()),
            Err(SbError::Malformed(_))
        ));
    }

    #[test]
    fn reasons_keep_their_codes() {
        for c in 1..=255u8 {
            let r = OutReason::from_code(c);
            assert_eq!(r.code(), c);
            assert!(!r.to_string().is_empty());
        }
    }

    #[test]
    fn a_history_out_of_order_is_refused() {
        let mut sb = sample();
        sb.history.swap(0, 1);
        assert!(matches!(
            Superblock::decode(&sb.encode()),
            Err(SbError::Malformed(_))
        ));
    }

    #[test]
    fn roundtrip() {
        let sb = sample();
        let b = sb.encode();
        assert_eq!(Superblock::decode(&b).unwrap(), sb);
    }

    #[test]
    fn any_flipped_bit_is_refused() {
        let b = with_extension(0x7001, 0, b"xyz");
        for i in 0..b.len() * 8 {
            let mut c = b.clone();
            c[i / 8] ^= 1 << (i % 8);
            assert!(
                Superblock::decode(&c).is_err(),
                "bit {i} flipped went unnoticed"
            );
        }
    }

    #[test]
    fn newest_copy_wins_and_torn_copy_falls_back() {
        let mut sb = sample();
        let mut area = vec![0u8; 2 * COPY_SIZE];
        for e in [10u64, 11] {
            sb.event = e;
            let b = sb.encode();
            let off = sb.copy_offset() as usize;
            area[off..off + b.len()].copy_from_slice(&b);
        }
        assert_eq!(Superblock::decode_area(&area).unwrap().event, 11);
        // Tear copy B (event 11): the reader falls back to event 10.
        area[COPY_SIZE + 100] ^= 0xff;
        assert_eq!(Superblock::decode_area(&area).unwrap().event, 10);
    }

    proptest! {
        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let _ = Superblock::decode(&bytes);
            let _ = Superblock::decode_area(&bytes);
        }

        #[test]
        fn mutated_superblock_never_panics(pos in 0usize..600, val: u8) {
            let mut b = sample().encode();
            if pos < b.len() { b[pos] = val; }
            // Recompute the crc so the parser goes past the checksum into the body.
            b[16..20].fill(0);
            let crc = crc32c::crc32c(&b);
            b[16..20].copy_from_slice(&crc.to_le_bytes());
            let _ = Superblock::decode(&b);
        }
    }
}
