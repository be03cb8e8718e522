//! The log device's on-disk format: a superblock (two copies) and a ring of records.
//!
//! ```text
//! 0        4K       8K                64K                                  end
//! | super A | super B | (unused)       | ring: record, record, ...  (wraps) |
//! ```
//!
//! The superblock names the array and this device, and says where replay starts: the
//! session's `nonce` and the `tail` (sequence number and ring offset of the oldest record
//! whose member writes may not be durable in the pool yet). A write of generation `g` goes
//! to copy `g % 2`, so a torn superblock write leaves the previous one.
//!
//! A record is a header of one or more 4 KiB blocks followed by its payload:
//!
//! ```text
//! magic[8] version u32 header_len u32 nonce u64 seq u64 off u64 total_len u64
//! entries u32 payload_crc u32 header_crc u32 pending u32
//! entry * n: slot u32 flags u32 offset u64 len u32 reserved u32
//! payload: each entry's bytes in order (an entry flagged SAME_DATA, or ZERO, has none)
//! ```
//!
//! `header_crc` (crc32c of the header with that field zeroed) covers `payload_crc`, so
//! one check covers header and payload: a torn record (some of its 4 KiB blocks written,
//! others not) is detected, as is a record from an earlier pass over the ring (its `seq`
//! or `off` is not the one expected there) or from an earlier session (`nonce`).
//!
//! `pending` says which records before this one were durable when it was written: 0 means
//! unknown (an sbod before it was kept, where the field was reserved), `n > 0` that every
//! record of the session with a sequence number below `seq - (n - 1)` was durable on the
//! log, so could have been acknowledged and applied to the pool. Replay uses it to tell a
//! record damaged after it was acknowledged (a later record vouches for it) from an append
//! the crash tore (nothing later vouches for it): see `log::scan`.
//! Hand-encoded, little-endian, like the member superblock: every byte is defined here and
//! damaged bytes give an error, never a panic.

use uuid::Uuid;

/// The unit of every log write (the engine's block; O_DIRECT alignment).
pub const BLOCK: usize = 4096;
pub const SB_MAGIC: [u8; 8] = *b"SBODlog\x01";
pub const REC_MAGIC: [u8; 8] = *b"SBODrec\x01";
pub const VERSION: u32 = 1;
/// Where the ring starts on the device.
pub const RING_START: u64 = 64 * 1024;
/// The smallest ring sbod accepts.
pub const MIN_RING: u64 = 1 << 20;
/// Entry flag: the same bytes as the entry before (a mirror's copies are logged once).
pub const SAME_DATA: u32 = 1;
/// Entry flag: the range is zeroed (write-zeroes); no payload.
pub const ZERO: u32 = 2;

const SB_LEN: usize = 8 + 4 + 4 + 4 + 16 + 16 + 8 + 8 + 8 + 8 + 8;
const REC_FIXED: usize = 64;
const ENTRY: usize = 24;

/// The log superblock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogSuper {
    pub array_uuid: Uuid,
    /// This device.
    pub log_uuid: Uuid,
    /// Bumped with every superblock write.
    pub generation: u64,
    /// The session whose records follow the tail.
    pub nonce: u64,
    /// The oldest record replay must look at (if any was written there).
    pub tail_seq: u64,
    pub tail_off: u64,
    /// Bytes of ring after `RING_START`.
    pub ring_len: u64,
}

impl LogSuper {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(BLOCK);
        b.extend_from_slice(&SB_MAGIC);
        b.extend_from_slice(&VERSION.to_le_bytes());
        b.extend_from_slice(&(SB_LEN as u32).to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes()); // crc
        b.extend_from_slice(self.array_uuid.as_bytes());
        b.extend_from_slice(self.log_uuid.as_bytes());
        for v in [
            self.generation,
            self.nonce,
            self.tail_seq,
            self.tail_off,
            self.ring_len,
        ] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        debug_assert_eq!(b.len(), SB_LEN);
        let crc = crc32c::crc32c(&b);
        b[16..20].copy_from_slice(&crc.to_le_bytes());
        b.resize(BLOCK, 0);
        b
    }

    /// Decode one copy. `Err` says why it is not a valid log superblock.
    pub fn decode(b: &[u8]) -> Result<LogSuper, String> {
        if b.len() < SB_LEN || b[..8] != SB_MAGIC {
            return Err("no sbod log superblock".into());
        }
        let u32at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
        let u64at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
        if u32at(8) != VERSION {
            return Err(format!(
                "log superblock version {} is not understood here ({VERSION}); upgrade sbod",
                u32at(8)
            ));
        }
        if u32at(12) as usize != SB_LEN {
            return Err("log superblock length is wrong".into());
        }
        let mut c = b[..SB_LEN].to_vec();
        c[16..20].fill(0);
        if crc32c::crc32c(&c) != u32at(16) {
            return Err("log superblock checksum mismatch".into());
        }
        let sb = LogSuper {
            array_uuid: Uuid::from_bytes(b[20..36].try_into().unwrap()),
            log_uuid: Uuid::from_bytes(b[36..52].try_into().unwrap()),
            generation: u64at(52),
            nonce: u64at(60),
            tail_seq: u64at(68),
            tail_off: u64at(76),
            ring_len: u64at(84),
        };
        if sb.ring_len < MIN_RING
            || !sb.ring_len.is_multiple_of(BLOCK as u64)
            || sb.tail_off >= sb.ring_len
            || !sb.tail_off.is_multiple_of(BLOCK as u64)
        {
            return Err("log superblock describes an impossible ring".into());
        }
        Ok(sb)
    }

    /// The newer valid copy of the two at the start of a device (`area`: 2 blocks).
    pub fn decode_area(area: &[u8]) -> Result<LogSuper, String> {
        let a = LogSuper::decode(&area[..BLOCK.min(area.len())]);
        let b = if area.len() >= 2 * BLOCK {
            LogSuper::decode(&area[BLOCK..2 * BLOCK])
        } else {
            Err("no second copy".into())
        };
        match (a, b) {
            (Ok(a), Ok(b)) => Ok(if b.generation > a.generation { b } else { a }),
            (Ok(a), Err(_)) => Ok(a),
            (Err(_), Ok(b)) => Ok(b),
            (Err(e), Err(_)) => Err(e),
        }
    }

    /// Where this generation's copy goes.
    pub fn copy_offset(&self) -> u64 {
        (self.generation % 2) * BLOCK as u64
    }
}

/// Does a device start with an sbod log superblock? (Assembly sorts devices by it.)
pub fn is_log_area(area: &[u8]) -> bool {
    LogSuper::decode_area(area).is_ok()
}

/// One member write of a record: `len` bytes at `offset` of slot `slot`'s data area.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub slot: u32,
    pub flags: u32,
    pub offset: u64,
    pub len: u32,
}

impl Entry {
    /// Bytes of payload it carries.
    pub fn payload(&self) -> usize {
        if self.flags & (SAME_DATA | ZERO) != 0 {
            0
        } else {
            self.len as usize
        }
    }
}

/// A record's header, decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    pub nonce: u64,
    pub seq: u64,
    /// Its own ring offset.
    pub off: u64,
    /// Header and payload, a multiple of BLOCK.
    pub total_len: u64,
    pub header_len: u32,
    pub payload_crc: u32,
    pub entries: Vec<Entry>,
    /// Every record of the session below this sequence number was durable when this one
    /// was written (`None`: not recorded).
    pub durable_below: Option<u64>,
}

/// Bytes of header for `n` entries.
pub fn header_len(n: usize) -> usize {
    (REC_FIXED + n * ENTRY).div_ceil(BLOCK) * BLOCK
}

/// Bytes a record of these entries takes in the ring.
pub fn record_len(entries: &[Entry]) -> u64 {
    let payload: usize = entries.iter().map(|e| e.payload()).sum();
    (header_len(entries.len()) + payload.div_ceil(BLOCK) * BLOCK) as u64
}

/// Check entries before they are encoded: lengths are whole blocks, a SAME_DATA entry
/// follows one of the same length.
pub fn check_entries(entries: &[Entry]) -> Result<(), String> {
    for (i, e) in entries.iter().enumerate() {
        if e.len == 0 || !(e.len as usize).is_multiple_of(BLOCK) {
            return Err(format!("entry {i}: length {} is not whole blocks", e.len));
        }
        if e.flags & !(SAME_DATA | ZERO) != 0 || e.flags == SAME_DATA | ZERO {
            return Err(format!("entry {i}: unknown flags {:#x}", e.flags));
        }
        if e.flags & SAME_DATA != 0
            && (i == 0 || entries[i - 1].len != e.len || entries[i - 1].flags & ZERO != 0)
        {
            return Err(format!(
                "entry {i}: SAME_DATA without an entry of its length with data before it"
            ));
        }
    }
    Ok(())
}

/// Encode a record's header into `out` (at least `header_len` bytes), the payload's crc
/// given; every record below `durable_below` (at most `seq`) is durable.
#[allow(clippy::too_many_arguments)]
pub fn encode_header(
    out: &mut [u8],
    nonce: u64,
    seq: u64,
    off: u64,
    entries: &[Entry],
    payload_crc: u32,
    durable_below: u64,
) {
    let hl = header_len(entries.len());
    let total = record_len(entries);
    let h = &mut out[..hl];
    h.fill(0);
    h[0..8].copy_from_slice(&REC_MAGIC);
    h[8..12].copy_from_slice(&VERSION.to_le_bytes());
    h[12..16].copy_from_slice(&(hl as u32).to_le_bytes());
    h[16..24].copy_from_slice(&nonce.to_le_bytes());
    h[24..32].copy_from_slice(&seq.to_le_bytes());
    h[32..40].copy_from_slice(&off.to_le_bytes());
    h[40..48].copy_from_slice(&total.to_le_bytes());
    h[48..52].copy_from_slice(&(entries.len() as u32).to_le_bytes());
    h[52..56].copy_from_slice(&payload_crc.to_le_bytes());
    // How many records before this one may not be durable, plus one (0: unknown); a
    // count past u32 says less (an earlier bound), never more.
    let pending = seq.saturating_sub(durable_below).min(u32::MAX as u64 - 1) as u32 + 1;
    h[60..64].copy_from_slice(&pending.to_le_bytes());
    for (i, e) in entries.iter().enumerate() {
        let p = REC_FIXED + i * ENTRY;
        h[p..p + 4].copy_from_slice(&e.slot.to_le_bytes());
        h[p + 4..p + 8].copy_from_slice(&e.flags.to_le_bytes());
        h[p + 8..p + 16].copy_from_slice(&e.offset.to_le_bytes());
        h[p + 16..p + 20].copy_from_slice(&e.len.to_le_bytes());
    }
    let crc = crc32c::crc32c(h);
    h[56..60].copy_from_slice(&crc.to_le_bytes());
}

/// How many bytes of header to read to decode the one whose first block is `first`
/// (`None`: not a record header).
pub fn header_len_of(first: &[u8]) -> Option<usize> {
    if first.len() < REC_FIXED || first[..8] != REC_MAGIC {
        return None;
    }
    let hl = u32::from_le_bytes(first[12..16].try_into().unwrap()) as usize;
    (hl >= BLOCK && hl.is_multiple_of(BLOCK) && hl <= 64 * BLOCK).then_some(hl)
}

/// Decode a record header (all `header_len` bytes of it). `Err` says why it is not one.
pub fn decode_header(h: &[u8]) -> Result<Header, String> {
    let hl = header_len_of(h).ok_or("not a record header")?;
    if h.len() < hl {
        return Err("header cut short".into());
    }
    let u32at = |i: usize| u32::from_le_bytes(h[i..i + 4].try_into().unwrap());
    let u64at = |i: usize| u64::from_le_bytes(h[i..i + 8].try_into().unwrap());
    if u32at(8) != VERSION {
        return Err(format!("record version {}", u32at(8)));
    }
    let mut c = h[..hl].to_vec();
    c[56..60].fill(0);
    if crc32c::crc32c(&c) != u32at(56) {
        return Err("record header checksum mismatch".into());
    }
    let n = u32at(48) as usize;
    if header_len(n) != hl {
        return Err("record header length does not match its entries".into());
    }
    let entries: Vec<Entry> = (0..n)
        .map(|i| {
            let p = REC_FIXED + i * ENTRY;
            Entry {
                slot: u32at(p),
                flags: u32at(p + 4),
                offset: u64at(p + 8),
                len: u32at(p + 16),
            }
        })
        .collect();
    check_entries(&entries)?;
    let total = u64at(40);
    if total != record_len(&entries) {
        return Err("record length does not match its entries".into());
    }
    let seq = u64at(24);
    let pending = u32at(60) as u64;
    Ok(Header {
        nonce: u64at(16),
        seq,
        durable_below: (pending > 0).then(|| seq.saturating_sub(pending - 1)),
        off: u64at(32),
        total_len: total,
        header_len: hl as u32,
        payload_crc: u32at(52),
        entries,
    })
}

/// The crc of a record's payload (what follows the header, whole blocks).
pub fn payload_crc(payload: &[u8]) -> u32 {
    crc32c::crc32c(payload)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample_sb() -> LogSuper {
        LogSuper {
            array_uuid: Uuid::new_v4(),
            log_uuid: Uuid::new_v4(),
            generation: 3,
            nonce: 0xfeed,
            tail_seq: 17,
            tail_off: 8192,
            ring_len: 4 << 20,
        }
    }

    #[test]
    fn superblock_roundtrips_and_any_flipped_bit_is_refused() {
        let sb = sample_sb();
        let b = sb.encode();
        assert_eq!(b.len(), BLOCK);
        assert_eq!(LogSuper::decode(&b).unwrap(), sb);
        for i in 0..SB_LEN * 8 {
            let mut c = b.clone();
            c[i / 8] ^= 1 << (i % 8);
            assert!(LogSuper::decode(&c).is_err(), "bit {i}");
        }
    }

    #[test]
    fn newer_superblock_copy_wins_and_a_torn_one_falls_back() {
        let mut sb = sample_sb();
        let mut area = vec![0u8; 2 * BLOCK];
        for g in [10u64, 11] {
            sb.generation = g;
            let o = sb.copy_offset() as usize;
            area[o..o + BLOCK].copy_from_slice(&sb.encode());
        }
        assert_eq!(LogSuper::decode_area(&area).unwrap().generation, 11);
        area[BLOCK + 30] ^= 1;
        assert_eq!(LogSuper::decode_area(&area).unwrap().generation, 10);
        assert!(is_log_area(&area));
        assert!(!is_log_area(&vec![0u8; 2 * BLOCK]));
    }

    fn entries() -> Vec<Entry> {
        vec![
            Entry {
                slot: 0,
                flags: 0,
                offset: 65536,
                len: 8192,
            },
            Entry {
                slot: 1,
                flags: SAME_DATA,
                offset: 65536,
                len: 8192,
            },
            Entry {
                slot: 3,
                flags: ZERO,
                offset: 0,
                len: 1 << 20,
            },
        ]
    }

    #[test]
    fn record_header_roundtrips_and_covers_the_payload_crc() {
        let e = entries();
        assert_eq!(record_len(&e), (BLOCK + 8192) as u64);
        let mut h = vec![0u8; header_len(e.len())];
        encode_header(&mut h, 7, 42, 4096, &e, 0xabcd, 40);
        let d = decode_header(&h).unwrap();
        assert_eq!(
            (d.nonce, d.seq, d.off, d.payload_crc, d.entries.clone()),
            (7, 42, 4096, 0xabcd, e.clone())
        );
        assert_eq!(d.durable_below, Some(40));
        // A header an older sbod wrote (the field was reserved, zero) vouches for nothing.
        let mut old = h.clone();
        old[60..64].fill(0);
        old[56..60].fill(0);
        let crc = crc32c::crc32c(&old);
        old[56..60].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(decode_header(&old).unwrap().durable_below, None);
        for i in 0..(REC_FIXED + e.len() * ENTRY) * 8 {
            let mut c = h.clone();
            c[i / 8] ^= 1 << (i % 8);
            assert!(decode_header(&c).is_err(), "bit {i}");
        }
    }

    #[test]
    fn bad_entries_are_refused() {
        let ok = entries();
        assert!(check_entries(&ok).is_ok());
        let mut bad = ok.clone();
        bad[0].len = 100;
        assert!(check_entries(&bad).is_err());
        let mut bad = ok.clone();
        bad[0].flags = SAME_DATA;
        assert!(check_entries(&bad).is_err());
        let mut bad = ok.clone();
        bad[1].len = 4096;
        assert!(check_entries(&bad).is_err());
        let mut bad = ok;
        bad[2].flags = 8;
        assert!(check_entries(&bad).is_err());
    }

    #[test]
    fn many_entries_take_more_header_blocks() {
        let e: Vec<Entry> = (0..400)
            .map(|i| Entry {
                slot: i,
                flags: 0,
                offset: 0,
                len: 4096,
            })
            .collect();
        let hl = header_len(e.len());
        assert!(hl > BLOCK);
        let mut h = vec![0u8; hl];
        encode_header(&mut h, 1, 2, 0, &e, 5, 2);
        assert_eq!(header_len_of(&h[..BLOCK]), Some(hl));
        assert_eq!(decode_header(&h).unwrap().entries.len(), 400);
        assert!(decode_header(&h[..BLOCK]).is_err());
    }

    proptest! {
        #[test]
        fn garbage_never_panics(b in proptest::collection::vec(any::<u8>(), 0..3 * BLOCK)) {
            let _ = LogSuper::decode(&b);
            let _ = LogSuper::decode_area(&b);
            let _ = header_len_of(&b);
            let _ = decode_header(&b);
        }

        #[test]
        fn mutated_headers_never_panic(pos in 0usize..200, val: u8) {
            let e = entries();
            let mut h = vec![0u8; header_len(e.len())];
            encode_header(&mut h, 1, 2, 0, &e, 5, 2);
            h[pos] = val;
            // Recompute the crc so the parser reaches past it.
            h[56..60].fill(0);
            let crc = crc32c::crc32c(&h);
            h[56..60].copy_from_slice(&crc.to_le_bytes());
            let _ = decode_header(&h);
        }
    }
}
