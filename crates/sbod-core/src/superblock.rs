//! The on-member superblock: who the member is, which array it belongs to, the array's
//! geometry and the state of every slot, with a crc32c and an event counter.
//!
//! Two copies live at the start of every member (0 and 32 KiB); a write of event `e` goes
//! to copy `e % 2`, so a torn write always leaves the previous copy intact. The reader takes
//! the valid copy with the higher event. The format is little-endian and hand-encoded so
//! that every byte is defined here and a damaged block is refused with a message, never a
//! panic.

use crate::layout::{Geometry, Level};
use serde::Serialize;
use uuid::Uuid;

pub const MAGIC: [u8; 8] = *b"SBODsb\x00\x01";
pub const VERSION: u32 = 1;
/// Bytes reserved for each superblock copy.
pub const COPY_SIZE: usize = 32 * 1024;
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
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SbError {
    #[error("no sbod superblock (wrong magic)")]
    NoMagic,
    #[error("superblock version {0} is newer than this sbod understands (1); upgrade sbod")]
    Version(u32),
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
        let mut w = W(Vec::with_capacity(4096));
        w.0.extend_from_slice(&MAGIC);
        w.u32(VERSION);
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
        }
        w.u32(self.spares.len() as u32);
        for m in &self.spares {
            w.member(m);
        }
        let len = w.0.len() as u32;
        w.0[12..16].copy_from_slice(&len.to_le_bytes());
        let crc = crc32c::crc32c(&w.0);
        w.0[16..20].copy_from_slice(&crc.to_le_bytes());
        assert!(
            w.0.len() <= COPY_SIZE,
            "superblock outgrew its {COPY_SIZE} bytes"
        );
        w.0
    }

    /// Decode one copy. Never panics, whatever the bytes.
    pub fn decode(b: &[u8]) -> Result<Superblock, SbError> {
        if b.len() < HDR || b[..8] != MAGIC {
            return Err(SbError::NoMagic);
        }
        let version = u32::from_le_bytes(b[8..12].try_into().unwrap());
        if version != VERSION {
            return Err(SbError::Version(version));
        }
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
        let geometry = Geometry {
            level,
            groups: r.u32()?,
            width: r.u32()?,
            chunk: r.u32()?,
            member_size: r.u64()?,
            data_offset: r.u64()?,
        };
        geometry.validate().map_err(SbError::Malformed)?;
        let bitmap_region = r.u64()?;
        let bitmap_bytes = r.u32()?;
        let clean = r.u8()? != 0;
        let resync_offset = r.u64()?;
        let nslots = r.u32()? as usize;
        if nslots != geometry.members() {
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
            slots.push(Slot {
                member,
                state,
                recovery_offset,
                replacement,
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
        if geometry.data_offset < BITMAP_OFFSET + bitmap_bytes as u64
            || !geometry.data_offset.is_multiple_of(4096)
        {
            return Err(SbError::Malformed(
                "data offset overlaps the metadata area".into(),
            ));
        }
        let too_big = slots
            .iter()
            .flat_map(|s| s.member.iter().chain(s.replacement.iter().map(|r| &r.0)))
            .chain(spares.iter())
            .any(|m| m.size > geometry.member_size);
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
                })
                .collect(),
            spares: vec![MemberEntry {
                uuid: Uuid::new_v4(),
                domain: String::new(),
                size: 65536 * 100,
            }],
        }
    }

    #[test]
    fn roundtrip() {
        let sb = sample();
        let b = sb.encode();
        assert_eq!(Superblock::decode(&b).unwrap(), sb);
    }

    #[test]
    fn any_flipped_bit_is_refused() {
        let b = sample().encode();
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
