//! The SCSI block device (SBC-3/SPC-4) on a [`Backend`]: CDB decoding, the commands, and
//! their errors as sense data. Transport-free: iSCSI (and later NVMe/TCP's SCSI-less
//! sibling, docs/NVME-TCP.md) hand it a CDB, the I_T nexus and the data-out buffer.
//!
//! A read the backend cannot serve is a MEDIUM ERROR with no data: never other bytes.

use crate::pr::{Access, Nexus, Pr, PrError};
use crate::sense::{self, Sense, CHECK_CONDITION, GOOD, RESERVATION_CONFLICT};
use sbod_nbd::{Backend, ExportInfo, NbdError};
use std::sync::Arc;

/// Data a command returns to the initiator.
pub enum DataIn<Buf> {
    None,
    Bytes(Vec<u8>),
    /// `len` bytes of `buf` from `start`.
    Buf {
        buf: Buf,
        start: usize,
        len: usize,
    },
}

impl<Buf: AsRef<[u8]>> DataIn<Buf> {
    pub fn len(&self) -> usize {
        match self {
            DataIn::None => 0,
            DataIn::Bytes(v) => v.len(),
            DataIn::Buf { len, .. } => *len,
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn slice(&self) -> &[u8] {
        match self {
            DataIn::None => &[],
            DataIn::Bytes(v) => v,
            DataIn::Buf { buf, start, len } => &buf.as_ref()[*start..*start + *len],
        }
    }
}

/// A finished command.
pub struct Done<Buf> {
    pub status: u8,
    /// Fixed-format sense data (CHECK CONDITION only).
    pub sense: Vec<u8>,
    pub data: DataIn<Buf>,
}

impl<Buf> Done<Buf> {
    pub fn good(data: DataIn<Buf>) -> Self {
        Done {
            status: GOOD,
            sense: Vec::new(),
            data,
        }
    }
    pub fn check(s: Sense) -> Self {
        Done {
            status: CHECK_CONDITION,
            sense: s.bytes(),
            data: DataIn::None,
        }
    }
    fn conflict() -> Self {
        Done {
            status: RESERVATION_CONFLICT,
            sense: Vec::new(),
            data: DataIn::None,
        }
    }
}

type R<T> = Result<T, Sense>;

/// Where the bytes of a logical unit come from and how it names itself.
#[derive(Clone, Debug)]
pub struct LuConfig {
    /// Logical block size: 512 (emulated on a larger backend block) or the backend's.
    pub block_size: u32,
    /// Unit serial number (VPD 0x80), stable for the volume (sbod: the array's UUID).
    pub serial: String,
    pub vendor: String,
    pub product: String,
}

/// COMPARE AND WRITE is atomic against other COMPARE AND WRITEs to the same blocks
/// (VMware's ATS: its lock records are only ever changed by ATS) through one of these
/// locks, chosen by address: no single lock on the I/O path.
const CAW_SHARDS: usize = 64;
/// Bytes one lock unit covers.
const CAW_UNIT: u64 = 4096;
/// The most blocks one READ/WRITE may move (Block Limits VPD), bytes.
pub const MAX_TRANSFER: u64 = 8 << 20;
/// The most blocks one WRITE SAME or UNMAP descriptor covers, bytes.
const MAX_ZERO: u64 = 1 << 30;

pub struct Lu<B: Backend> {
    pub backend: Arc<B>,
    info: ExportInfo,
    bs: u64,
    blocks: u64,
    cfg: LuConfig,
    naa: [u8; 8],
    pub pr: parking_lot::Mutex<Pr>,
    caw: Vec<tokio::sync::Mutex<()>>,
}

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf29ce484222325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100000001b3)
    })
}

fn be(b: &[u8]) -> u64 {
    b.iter().fold(0u64, |a, &x| a << 8 | x as u64)
}

fn alloc_len(cdb: &[u8], at: usize, n: usize) -> usize {
    be(&cdb[at..at + n]) as usize
}

fn truncate<Buf>(mut v: Vec<u8>, n: usize) -> Done<Buf> {
    v.truncate(n);
    Done::good(DataIn::Bytes(v))
}

fn write_err(e: NbdError) -> Sense {
    match e {
        NbdError::NoSpc => sense::SPACE_ALLOC_FAILED,
        NbdError::Perm => sense::WRITE_PROTECTED,
        NbdError::ShutDown => sense::SHUTTING_DOWN,
        NbdError::Inval | NbdError::Overflow => sense::LBA_OUT_OF_RANGE,
        NbdError::NotSup => sense::INVALID_OPCODE,
        NbdError::Io => sense::WRITE_ERROR,
    }
}

fn read_err(e: NbdError) -> Sense {
    match e {
        NbdError::ShutDown => sense::SHUTTING_DOWN,
        _ => sense::UNRECOVERED_READ,
    }
}

/// The commands this unit answers: (opcode, service action, CDB length, usage mask).
const OPCODES: &[(u8, Option<u16>, usize)] = &[
    (0x00, None, 6),  // TEST UNIT READY
    (0x03, None, 6),  // REQUEST SENSE
    (0x08, None, 6),  // READ(6)
    (0x0a, None, 6),  // WRITE(6)
    (0x12, None, 6),  // INQUIRY
    (0x1a, None, 6),  // MODE SENSE(6)
    (0x1b, None, 6),  // START STOP UNIT
    (0x25, None, 10), // READ CAPACITY(10)
    (0x28, None, 10), // READ(10)
    (0x2a, None, 10), // WRITE(10)
    (0x2e, None, 10), // WRITE AND VERIFY(10)
    (0x2f, None, 10), // VERIFY(10)
    (0x35, None, 10), // SYNCHRONIZE CACHE(10)
    (0x41, None, 10), // WRITE SAME(10)
    (0x42, None, 10), // UNMAP
    (0x5a, None, 10), // MODE SENSE(10)
    (0x5e, Some(0), 10),
    (0x5e, Some(1), 10),
    (0x5e, Some(2), 10),
    (0x5e, Some(3), 10), // PERSISTENT RESERVE IN
    (0x5f, Some(0), 10),
    (0x5f, Some(1), 10),
    (0x5f, Some(2), 10),
    (0x5f, Some(3), 10),
    (0x5f, Some(4), 10),
    (0x5f, Some(5), 10),
    (0x5f, Some(6), 10),    // PERSISTENT RESERVE OUT
    (0x88, None, 16),       // READ(16)
    (0x89, None, 16),       // COMPARE AND WRITE
    (0x8a, None, 16),       // WRITE(16)
    (0x8e, None, 16),       // WRITE AND VERIFY(16)
    (0x8f, None, 16),       // VERIFY(16)
    (0x91, None, 16),       // SYNCHRONIZE CACHE(16)
    (0x93, None, 16),       // WRITE SAME(16)
    (0x9e, Some(0x10), 16), // READ CAPACITY(16)
    (0x9e, Some(0x12), 16), // GET LBA STATUS
    (0xa0, None, 12),       // REPORT LUNS
    (0xa3, Some(0x0c), 12), // REPORT SUPPORTED OPERATION CODES
    (0xa8, None, 12),       // READ(12)
    (0xaa, None, 12),       // WRITE(12)
    (0xae, None, 12),       // WRITE AND VERIFY(12)
    (0xaf, None, 12),       // VERIFY(12)
];

/// The CDB usage data of a command: every bit the command reads (SPC-4 6.35.3).
fn usage(op: u8, sa: Option<u16>, len: usize) -> Vec<u8> {
    let mut m = vec![0xffu8; len];
    m[0] = op;
    m[len - 1] = 0x07; // CONTROL: NACA and the link bits as the standard's examples
    if let Some(sa) = sa {
        m[1] = sa as u8 & 0x1f | if op == 0x5f || op == 0x5e { 0 } else { 0xe0 };
    }
    m
}

impl<B: Backend> Lu<B> {
    pub fn new(backend: Arc<B>, cfg: LuConfig, target: &str) -> Lu<B> {
        let info = backend.info();
        let bs = cfg.block_size as u64;
        assert!(bs.is_power_of_two() && bs >= 512, "block size {bs}");
        let mut naa = fnv(format!("{target}/{}", cfg.serial).as_bytes()).to_be_bytes();
        // NAA 3: locally assigned.
        naa[0] = 0x30 | (naa[0] & 0x0f);
        Lu {
            blocks: info.size / bs,
            info,
            bs,
            backend,
            cfg,
            naa,
            pr: Default::default(),
            caw: (0..CAW_SHARDS).map(|_| Default::default()).collect(),
        }
    }

    pub fn block_size(&self) -> u32 {
        self.bs as u32
    }

    pub fn blocks(&self) -> u64 {
        self.blocks
    }

    /// The bytes a write command expects from the initiator, from the CDB alone (for the
    /// transport's residual check); `None` for commands that carry no data-out.
    pub fn data_out_len(&self, cdb: &[u8]) -> Option<u64> {
        let blocks = |n: u64| Some(n * self.bs);
        match cdb[0] {
            0x0a => blocks(if cdb[4] == 0 { 256 } else { cdb[4] as u64 }),
            0x2a | 0x2e => blocks(be(&cdb[7..9])),
            0xaa | 0xae => blocks(be(&cdb[6..10])),
            0x8a | 0x8e => blocks(be(&cdb[10..14])),
            _ => None,
        }
    }

    /// Run one command. `data` holds the data-out bytes (exactly what the initiator sent).
    pub async fn execute(&self, nexus: &Nexus, cdb: &[u8], data: Option<B::Buf>) -> Done<B::Buf> {
        let access = match cdb[0] {
            0x08 | 0x28 | 0xa8 | 0x88 | 0x2f | 0xaf | 0x8f => Access::Read,
            0x0a | 0x2a | 0xaa | 0x8a | 0x2e | 0xae | 0x8e | 0x41 | 0x93 | 0x42 | 0x89 | 0x35
            | 0x91 => Access::Write,
            _ => Access::Other,
        };
        if access != Access::Other && !self.pr.lock().allows(nexus, access) {
            return Done::conflict();
        }
        match self.run(nexus, cdb, data).await {
            Ok(d) => d,
            Err(s) => Done::check(s),
        }
    }

    async fn run(&self, nexus: &Nexus, cdb: &[u8], data: Option<B::Buf>) -> R<Done<B::Buf>> {
        let none = || Ok(Done::good(DataIn::None));
        let data_bytes = |d: &Option<B::Buf>| -> Vec<u8> {
            d.as_ref().map(|b| b.as_ref().to_vec()).unwrap_or_default()
        };
        match cdb[0] {
            0x00 => none(),
            0x03 => {
                let n = cdb[4] as usize;
                if cdb[1] & 0x01 != 0 {
                    return Err(sense::INVALID_FIELD_CDB);
                }
                Ok(truncate(sense::NO_SENSE.bytes(), n))
            }
            0x12 => self.inquiry(cdb),
            0x1a | 0x5a => self.mode_sense(cdb),
            0x1b => none(),
            0x25 => {
                let mut d = vec![0u8; 8];
                let last = self.blocks.saturating_sub(1).min(0xffff_ffff) as u32;
                d[0..4].copy_from_slice(&last.to_be_bytes());
                d[4..8].copy_from_slice(&(self.bs as u32).to_be_bytes());
                Ok(Done::good(DataIn::Bytes(d)))
            }
            0x9e if cdb[1] & 0x1f == 0x10 => {
                let mut d = vec![0u8; 32];
                d[0..8].copy_from_slice(&(self.blocks.saturating_sub(1)).to_be_bytes());
                d[8..12].copy_from_slice(&(self.bs as u32).to_be_bytes());
                d[13] = self.phys_exp();
                // LBPME and LBPRZ: UNMAP and WRITE SAME(UNMAP) are honoured; unmapped
                // blocks read as zeros.
                d[14] = 0x80 | 0x40;
                Ok(truncate(d, alloc_len(cdb, 10, 4)))
            }
            0x9e if cdb[1] & 0x1f == 0x12 => {
                // GET LBA STATUS: every block is reported mapped (an unmapped block reads
                // as zeros, so a client that reads it anyway gets the truth).
                let lba = be(&cdb[2..10]);
                if lba >= self.blocks {
                    return Err(sense::LBA_OUT_OF_RANGE);
                }
                let n = (self.blocks - lba).min(u32::MAX as u64) as u32;
                let mut d = vec![0u8; 24];
                d[3] = 20;
                d[8..16].copy_from_slice(&lba.to_be_bytes());
                d[16..20].copy_from_slice(&n.to_be_bytes());
                Ok(truncate(d, alloc_len(cdb, 10, 4)))
            }
            0x08 => {
                let lba = be(&cdb[1..4]) & 0x1f_ffff;
                let n = if cdb[4] == 0 { 256 } else { cdb[4] as u64 };
                self.read(lba, n).await
            }
            0x28 | 0xa8 | 0x88 => {
                let (lba, n) = self.lba_len(cdb);
                if cdb[1] & 0xe0 != 0 {
                    return Err(Sense {
                        field: Some((true, 1)),
                        ..sense::INVALID_FIELD_CDB
                    });
                }
                self.read(lba, n).await
            }
            0x0a => {
                let lba = be(&cdb[1..4]) & 0x1f_ffff;
                let n = if cdb[4] == 0 { 256 } else { cdb[4] as u64 };
                self.write(lba, n, data, false).await
            }
            0x2a | 0xaa | 0x8a | 0x2e | 0xae | 0x8e => {
                let (lba, n) = self.lba_len(cdb);
                if cdb[1] & 0xe0 != 0 {
                    return Err(Sense {
                        field: Some((true, 1)),
                        ..sense::INVALID_FIELD_CDB
                    });
                }
                let verify = matches!(cdb[0], 0x2e | 0xae | 0x8e);
                // WRITE AND VERIFY is written through: FUA.
                self.write(lba, n, data, verify || cdb[1] & 0x08 != 0).await
            }
            0x2f | 0xaf | 0x8f => {
                let (lba, n) = self.lba_len(cdb);
                if cdb[1] & 0xe0 != 0 {
                    return Err(sense::INVALID_FIELD_CDB);
                }
                let bytchk = (cdb[1] >> 1) & 3;
                self.verify(lba, n, bytchk, data_bytes(&data)).await
            }
            0x35 | 0x91 => {
                let (lba, n) = if cdb[0] == 0x35 {
                    (be(&cdb[2..6]), be(&cdb[7..9]))
                } else {
                    (be(&cdb[2..10]), be(&cdb[10..14]))
                };
                self.range(lba, n)?;
                self.backend.flush().await.map_err(write_err)?;
                none()
            }
            0x41 | 0x93 => {
                let (lba, n) = if cdb[0] == 0x41 {
                    (be(&cdb[2..6]), be(&cdb[7..9]))
                } else {
                    (be(&cdb[2..10]), be(&cdb[10..14]))
                };
                self.write_same(cdb, lba, n, data_bytes(&data)).await
            }
            0x42 => self.unmap(cdb, data_bytes(&data)).await,
            0x89 => self.compare_and_write(cdb, data).await,
            0xa0 => {
                if cdb[2] > 2 && !(0x10..=0x12).contains(&cdb[2]) {
                    return Err(sense::INVALID_FIELD_CDB);
                }
                let n = alloc_len(cdb, 6, 4);
                if n < 16 {
                    return Err(sense::INVALID_FIELD_CDB);
                }
                let mut d = vec![0u8; 16];
                d[3] = 8;
                Ok(truncate(d, n))
            }
            0xa3 if cdb[1] & 0x1f == 0x0c => self.report_opcodes(cdb),
            0x5e => {
                let v = self.pr.lock().read(cdb[1] & 0x1f)?;
                Ok(truncate(v, alloc_len(cdb, 7, 2)))
            }
            0x5f => {
                let plen = alloc_len(cdb, 5, 4);
                let p = data_bytes(&data);
                if plen != 24 || p.len() < 24 {
                    return Err(sense::PARAM_LIST_LENGTH);
                }
                let r = self
                    .pr
                    .lock()
                    .out(nexus, cdb[1] & 0x1f, cdb[2] & 0x0f, cdb[2] >> 4, &p);
                match r {
                    Ok(()) => none(),
                    Err(PrError::Conflict) => Ok(Done::conflict()),
                    Err(PrError::Check(s)) => Err(s),
                }
            }
            _ => Err(sense::INVALID_OPCODE),
        }
    }

    fn max_caw(&self) -> u64 {
        ((1u64 << 20) / self.bs).min(255)
    }

    /// MAXIMUM WRITE SAME LENGTH, blocks: what one write could move.
    fn max_ws(&self) -> u64 {
        MAX_TRANSFER / self.bs
    }

    /// MAXIMUM UNMAP LBA COUNT, blocks.
    fn max_unmap(&self) -> u64 {
        (MAX_ZERO * 4 / self.bs).min(1 << 20)
    }

    fn phys_exp(&self) -> u8 {
        let pb = (self.info.min_block as u64).max(self.bs);
        (pb / self.bs).trailing_zeros() as u8
    }

    fn lba_len(&self, cdb: &[u8]) -> (u64, u64) {
        match cdb[0] & 0xe0 {
            0x20 => (be(&cdb[2..6]), be(&cdb[7..9])),
            0xa0 => (be(&cdb[2..6]), be(&cdb[6..10])),
            _ => (be(&cdb[2..10]), be(&cdb[10..14])),
        }
    }

    fn range(&self, lba: u64, n: u64) -> R<()> {
        if lba > self.blocks || n > self.blocks - lba {
            return Err(sense::LBA_OUT_OF_RANGE);
        }
        Ok(())
    }

    fn check_transfer(&self, lba: u64, n: u64) -> R<()> {
        self.range(lba, n)?;
        if n * self.bs > MAX_TRANSFER {
            return Err(sense::INVALID_FIELD_CDB);
        }
        Ok(())
    }

    /// Read whole backend blocks around the range and return the range of them.
    async fn read_bytes(&self, off: u64, len: u64) -> R<DataIn<B::Buf>> {
        let mb = self.info.min_block as u64;
        let a0 = off / mb * mb;
        let a1 = (off + len).div_ceil(mb) * mb;
        let a1 = a1.min(self.info.size.div_ceil(mb) * mb);
        let buf = self
            .backend
            .read(a0, (a1 - a0) as u32)
            .await
            .map_err(read_err)?;
        if buf.as_ref().len() < (off - a0 + len) as usize {
            // The backend returned less than asked: never hand out other bytes.
            return Err(sense::UNRECOVERED_READ);
        }
        Ok(DataIn::Buf {
            buf,
            start: (off - a0) as usize,
            len: len as usize,
        })
    }

    async fn read(&self, lba: u64, n: u64) -> R<Done<B::Buf>> {
        self.check_transfer(lba, n)?;
        if n == 0 {
            return Ok(Done::good(DataIn::None));
        }
        Ok(Done::good(
            self.read_bytes(lba * self.bs, n * self.bs).await?,
        ))
    }

    /// Write `data` (the whole data-out, exactly n blocks: the transport checked) at `off`.
    async fn write_at(&self, off: u64, data: B::Buf, fua: bool) -> R<()> {
        let mb = self.info.min_block as u64;
        let len = data.as_ref().len() as u64;
        let r = if off.is_multiple_of(mb) && len.is_multiple_of(mb) {
            self.backend.write(off, data, fua).await
        } else {
            self.backend.write_unaligned(off, data, fua).await
        };
        r.map_err(write_err)
    }

    async fn write(&self, lba: u64, n: u64, data: Option<B::Buf>, fua: bool) -> R<Done<B::Buf>> {
        self.check_transfer(lba, n)?;
        if self.info.read_only {
            return Err(sense::WRITE_PROTECTED);
        }
        if n == 0 {
            return Ok(Done::good(DataIn::None));
        }
        let want = n * self.bs;
        let have = data.as_ref().map_or(0, |d| d.as_ref().len() as u64);
        let off = lba * self.bs;
        match data {
            Some(d) if have == want => self.write_at(off, d, fua).await?,
            // The initiator sent less or more than the CDB asks (a residual the transport
            // reports): what both cover is written, nothing beyond (FCP-4 9.4.2 a).
            Some(d) if have.min(want) > 0 => {
                let k = have.min(want) as usize;
                let mut b = self.backend.alloc(k);
                b.as_mut().copy_from_slice(&d.as_ref()[..k]);
                self.write_at(off, b, fua).await?
            }
            _ => {}
        }
        Ok(Done::good(DataIn::None))
    }

    async fn verify(&self, lba: u64, n: u64, bytchk: u8, data: Vec<u8>) -> R<Done<B::Buf>> {
        self.check_transfer(lba, n)?;
        if bytchk == 2 {
            return Err(sense::INVALID_FIELD_CDB);
        }
        if n == 0 {
            return Ok(Done::good(DataIn::None));
        }
        let got = self.read_bytes(lba * self.bs, n * self.bs).await?;
        if bytchk == 0 {
            return Ok(Done::good(DataIn::None));
        }
        // BYTCHK 1: n blocks to compare; 3: one block compared against each.
        let want_len = if bytchk == 1 { n * self.bs } else { self.bs } as usize;
        if data.len() != want_len {
            return Err(sense::INVALID_FIELD_IU);
        }
        let got = got.slice();
        for (i, b) in got.iter().enumerate() {
            if *b != data[i % want_len] {
                return Err(Sense {
                    info: Some(i as u32),
                    ..sense::MISCOMPARE_VERIFY
                });
            }
        }
        Ok(Done::good(DataIn::None))
    }

    async fn zero(&self, off: u64, len: u64, unmap: bool) -> R<()> {
        let mb = self.info.min_block as u64;
        let mut at = off;
        while at < off + len {
            let n = (off + len - at).min(MAX_ZERO);
            let r = if at.is_multiple_of(mb) && n.is_multiple_of(mb) {
                self.backend.write_zeroes(at, n as u32, false, !unmap).await
            } else {
                self.backend
                    .write_zeroes_unaligned(at, n as u32, false, !unmap)
                    .await
            };
            r.map_err(write_err)?;
            at += n;
        }
        Ok(())
    }

    async fn write_same(&self, cdb: &[u8], lba: u64, n: u64, data: Vec<u8>) -> R<Done<B::Buf>> {
        let unmap = cdb[1] & 0x08 != 0;
        let ndob = cdb[0] == 0x93 && cdb[1] & 0x01 != 0;
        if cdb[1] & 0xe0 != 0 || cdb[1] & 0x10 != 0 {
            // WRPROTECT, ANCHOR: not offered.
            return Err(sense::INVALID_FIELD_CDB);
        }
        if n == 0 || n > self.max_ws() {
            // WSNZ: a length of 0 is not "to the end".
            return Err(sense::INVALID_FIELD_CDB);
        }
        self.range(lba, n)?;
        if self.info.read_only {
            return Err(sense::WRITE_PROTECTED);
        }
        let block = if ndob {
            vec![0u8; self.bs as usize]
        } else {
            if data.len() != self.bs as usize {
                return Err(sense::INVALID_FIELD_IU);
            }
            data
        };
        let (off, len) = (lba * self.bs, n * self.bs);
        if block.iter().all(|&b| b == 0) {
            self.zero(off, len, unmap).await?;
        } else {
            // UNMAP with a non-zero pattern: the blocks are written (unmapped blocks would
            // not read back as the pattern), which SBC allows.
            let chunk_blocks = (1u64 << 20) / self.bs;
            let mut at = 0;
            while at < n {
                let k = (n - at).min(chunk_blocks);
                let mut buf = self.backend.alloc((k * self.bs) as usize);
                for c in buf.as_mut().chunks_mut(self.bs as usize) {
                    c.copy_from_slice(&block);
                }
                self.write_at(off + at * self.bs, buf, false).await?;
                at += k;
            }
        }
        Ok(Done::good(DataIn::None))
    }

    async fn unmap(&self, cdb: &[u8], p: Vec<u8>) -> R<Done<B::Buf>> {
        if cdb[1] & 0x01 != 0 {
            return Err(sense::INVALID_FIELD_CDB); // ANCHOR
        }
        let plen = alloc_len(cdb, 7, 2);
        if plen == 0 {
            return Ok(Done::good(DataIn::None));
        }
        if plen < 8 || p.len() < plen {
            return Err(sense::PARAM_LIST_LENGTH);
        }
        let dlen = be(&p[2..4]) as usize;
        if !dlen.is_multiple_of(16) || 8 + dlen > p.len() {
            return Err(sense::PARAM_LIST_LENGTH);
        }
        if self.info.read_only {
            return Err(sense::WRITE_PROTECTED);
        }
        let descs: Vec<(u64, u64)> = p[8..8 + dlen]
            .chunks(16)
            .map(|d| (be(&d[0..8]), be(&d[8..12])))
            .collect();
        if descs.len() > 256 {
            return Err(sense::INVALID_FIELD_PARAM);
        }
        for &(lba, n) in &descs {
            self.range(lba, n)?;
            if n > self.max_unmap() {
                return Err(sense::INVALID_FIELD_PARAM);
            }
        }
        for (lba, n) in descs {
            self.zero(lba * self.bs, n * self.bs, true).await?;
        }
        Ok(Done::good(DataIn::None))
    }

    async fn compare_and_write(&self, cdb: &[u8], data: Option<B::Buf>) -> R<Done<B::Buf>> {
        let lba = be(&cdb[2..10]);
        let n = cdb[13] as u64;
        if cdb[1] & 0xe0 != 0 {
            return Err(sense::INVALID_FIELD_CDB);
        }
        if n > self.max_caw() || (n == 0 && data.as_ref().is_some_and(|d| !d.as_ref().is_empty())) {
            return Err(sense::INVALID_FIELD_CDB);
        }
        self.range(lba, n)?;
        if n == 0 {
            return Ok(Done::good(DataIn::None));
        }
        let len = (n * self.bs) as usize;
        let Some(data) = data.filter(|d| d.as_ref().len() == 2 * len) else {
            return Err(sense::INVALID_FIELD_IU);
        };
        if self.info.read_only {
            return Err(sense::WRITE_PROTECTED);
        }
        let off = lba * self.bs;
        let mut shards: Vec<usize> = (off / CAW_UNIT..(off + len as u64).div_ceil(CAW_UNIT))
            .map(|u| (u % CAW_SHARDS as u64) as usize)
            .collect();
        shards.sort_unstable();
        shards.dedup();
        let mut guards = Vec::with_capacity(shards.len());
        for s in shards {
            guards.push(self.caw[s].lock().await);
        }
        let cur = self.read_bytes(off, len as u64).await?;
        let (verify, write) = data.as_ref().split_at(len);
        if let Some(i) = cur.slice().iter().zip(verify).position(|(a, b)| a != b) {
            return Err(Sense {
                info: Some(i as u32),
                ..sense::MISCOMPARE_VERIFY
            });
        }
        let mut buf = self.backend.alloc(len);
        buf.as_mut().copy_from_slice(write);
        let fua = cdb[1] & 0x08 != 0;
        self.write_at(off, buf, fua).await?;
        drop(guards);
        Ok(Done::good(DataIn::None))
    }

    fn inquiry(&self, cdb: &[u8]) -> R<Done<B::Buf>> {
        let n = alloc_len(cdb, 3, 2);
        let evpd = cdb[1] & 0x01 != 0;
        if cdb[1] & 0xfe != 0 {
            return Err(sense::INVALID_FIELD_CDB);
        }
        if !evpd {
            if cdb[2] != 0 {
                return Err(Sense {
                    field: Some((true, 2)),
                    ..sense::INVALID_FIELD_CDB
                });
            }
            let mut d = vec![0u8; 66];
            d[2] = 0x06; // SPC-4
            d[3] = 0x12; // HISUP, response data format 2
            d[4] = (d.len() - 5) as u8;
            d[7] = 0x02; // CMDQUE
            let pad = |s: &str, n: usize| format!("{s:<n$}").into_bytes()[..n].to_vec();
            d[8..16].copy_from_slice(&pad(&self.cfg.vendor, 8));
            d[16..32].copy_from_slice(&pad(&self.cfg.product, 16));
            d[32..36].copy_from_slice(&pad(env!("CARGO_PKG_VERSION"), 4));
            // Version descriptors: SAM-5, iSCSI, SPC-4, SBC-3.
            for (i, v) in [0x00a0u16, 0x0960, 0x0460, 0x04c0].iter().enumerate() {
                d[58 + 2 * i..60 + 2 * i].copy_from_slice(&v.to_be_bytes());
            }
            return Ok(truncate(d, n));
        }
        let page = cdb[2];
        let body: Vec<u8> = match page {
            0x00 => vec![0x00, 0x80, 0x83, 0xb0, 0xb1, 0xb2],
            0x80 => self.cfg.serial.as_bytes().to_vec(),
            0x83 => {
                let mut d = Vec::new();
                // NAA (binary, logical unit).
                d.extend_from_slice(&[0x01, 0x03, 0, 8]);
                d.extend_from_slice(&self.naa);
                // T10 vendor ID (ASCII): vendor + serial.
                let t10 = format!("{:<8}{}", self.cfg.vendor, self.cfg.serial);
                d.extend_from_slice(&[0x02, 0x01, 0, t10.len() as u8]);
                d.extend_from_slice(t10.as_bytes());
                // Relative target port 1 and target port group 1 (target port).
                d.extend_from_slice(&[0x51, 0x94, 0, 4, 0, 0, 0, 1]);
                d.extend_from_slice(&[0x51, 0x95, 0, 4, 0, 0, 0, 1]);
                d
            }
            0xb0 => {
                let mut d = vec![0u8; 0x3c];
                d[0] = 0x01; // WSNZ
                d[1] = self.max_caw() as u8;
                let gran = (self.info.min_block as u64 / self.bs).max(1) as u16;
                d[2..4].copy_from_slice(&gran.to_be_bytes());
                d[4..8].copy_from_slice(&((MAX_TRANSFER / self.bs) as u32).to_be_bytes());
                let opt = (self.info.preferred_block as u64).clamp(self.bs, MAX_TRANSFER) / self.bs;
                d[8..12].copy_from_slice(&(opt as u32).to_be_bytes());
                d[16..20].copy_from_slice(&(self.max_unmap() as u32).to_be_bytes());
                d[20..24].copy_from_slice(&256u32.to_be_bytes());
                d[24..28].copy_from_slice(&(gran as u32).to_be_bytes());
                d[28..32].copy_from_slice(&0x8000_0000u32.to_be_bytes()); // UGAVALID, 0
                d[32..40].copy_from_slice(&self.max_ws().to_be_bytes());
                d
            }
            0xb1 => {
                let mut d = vec![0u8; 0x3c];
                d[1] = 1; // non-rotating
                d
            }
            0xb2 => {
                // LBPU, LBPWS, LBPWS10, LBPRZ; thin provisioned.
                vec![0, 0x80 | 0x40 | 0x20 | 0x04, 0x02, 0]
            }
            _ => {
                return Err(Sense {
                    field: Some((true, 2)),
                    ..sense::INVALID_FIELD_CDB
                })
            }
        };
        let mut d = vec![0, page, 0, 0];
        d[2..4].copy_from_slice(&(body.len() as u16).to_be_bytes());
        d.extend_from_slice(&body);
        Ok(truncate(d, n))
    }

    fn mode_page(&self, page: u8, changeable: bool) -> Option<Vec<u8>> {
        let mut p = match page {
            0x08 => {
                let mut p = vec![0u8; 20];
                p[0] = 0x08;
                p[1] = 0x12;
                // WCE: writes are volatile until SYNCHRONIZE CACHE or FUA.
                p[2] = 0x04;
                p
            }
            0x0a => {
                let mut p = vec![0u8; 12];
                p[0] = 0x0a;
                p[1] = 0x0a;
                p[3] = 0x10; // queue algorithm modifier 1: unrestricted reordering
                p[8..10].copy_from_slice(&0xffffu16.to_be_bytes()); // busy timeout
                p
            }
            0x1c => {
                let mut p = vec![0u8; 12];
                p[0] = 0x1c;
                p[1] = 0x0a;
                p
            }
            _ => return None,
        };
        if changeable {
            for b in &mut p[2..] {
                *b = 0;
            }
        }
        Some(p)
    }

    fn mode_sense(&self, cdb: &[u8]) -> R<Done<B::Buf>> {
        let ten = cdb[0] == 0x5a;
        let dbd = cdb[1] & 0x08 != 0;
        let llbaa = ten && cdb[1] & 0x10 != 0;
        let pc = cdb[2] >> 6;
        let page = cdb[2] & 0x3f;
        let sub = cdb[3];
        let n = if ten {
            alloc_len(cdb, 7, 2)
        } else {
            cdb[4] as usize
        };
        if pc == 3 {
            return Err(sense::SAVING_NOT_SUPPORTED);
        }
        if sub != 0 && sub != 0xff {
            return Err(sense::INVALID_FIELD_CDB);
        }
        let mut pages = Vec::new();
        if page == 0x3f {
            for p in [0x08, 0x0a, 0x1c] {
                pages.extend(self.mode_page(p, pc == 1).unwrap());
            }
        } else {
            match self.mode_page(page, pc == 1) {
                Some(p) if sub == 0 => pages = p,
                _ => {
                    return Err(Sense {
                        field: Some((true, 2)),
                        ..sense::INVALID_FIELD_CDB
                    })
                }
            }
        }
        let mut bd = Vec::new();
        if !dbd {
            if llbaa {
                bd.extend_from_slice(&self.blocks.to_be_bytes());
                bd.extend_from_slice(&[0, 0, 0, 0]);
                bd.extend_from_slice(&(self.bs as u32).to_be_bytes());
            } else {
                bd.extend_from_slice(&(self.blocks.min(0xffff_ffff) as u32).to_be_bytes());
                bd.extend_from_slice(&(self.bs as u32).to_be_bytes());
            }
            if !ten {
                bd[0..4].copy_from_slice(&(self.blocks.min(0xff_ffff) as u32).to_be_bytes());
                bd[4] = 0;
            }
        }
        let wp = if self.info.read_only { 0x80 } else { 0 } | 0x10; // DPOFUA
        let mut d = Vec::new();
        if ten {
            let total = 8 + bd.len() + pages.len();
            d.extend_from_slice(&((total - 2) as u16).to_be_bytes());
            d.extend_from_slice(&[0, wp, if llbaa { 1 } else { 0 }, 0]);
            d.extend_from_slice(&(bd.len() as u16).to_be_bytes());
        } else {
            let total = 4 + bd.len() + pages.len();
            d.extend_from_slice(&[(total - 1).min(255) as u8, 0, wp, bd.len() as u8]);
        }
        d.extend(bd);
        d.extend(pages);
        Ok(truncate(d, n))
    }

    fn report_opcodes(&self, cdb: &[u8]) -> R<Done<B::Buf>> {
        let opts = cdb[2] & 0x07;
        let rctd = cdb[2] & 0x80 != 0;
        let (req_op, req_sa) = (cdb[3], be(&cdb[4..6]) as u16);
        let n = alloc_len(cdb, 6, 4);
        let timeouts = |d: &mut Vec<u8>| {
            if rctd {
                d.extend_from_slice(&[0, 0x0a, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
            }
        };
        let mut d = Vec::new();
        match opts {
            0 => {
                d.extend_from_slice(&[0; 4]);
                for &(op, sa, len) in OPCODES {
                    d.push(op);
                    d.push(0);
                    d.extend_from_slice(&sa.unwrap_or(0).to_be_bytes());
                    d.push(0);
                    d.push(if sa.is_some() { 1 } else { 0 } | if rctd { 2 } else { 0 });
                    d.extend_from_slice(&(len as u16).to_be_bytes());
                    timeouts(&mut d);
                }
                let l = (d.len() - 4) as u32;
                d[0..4].copy_from_slice(&l.to_be_bytes());
            }
            1..=3 => {
                let has_sa = OPCODES.iter().any(|&(o, s, _)| o == req_op && s.is_some());
                if (opts == 1 && has_sa)
                    || (opts == 2 && !has_sa && OPCODES.iter().any(|&(o, _, _)| o == req_op))
                {
                    return Err(sense::INVALID_FIELD_CDB);
                }
                let found = OPCODES.iter().find(|&&(o, s, _)| {
                    o == req_op && (opts == 1 || s.is_none() && opts == 3 || s == Some(req_sa))
                });
                let mut h = vec![0u8, 0, 0, 0];
                match found {
                    Some(&(op, sa, len)) => {
                        h[1] = 0x03 | if rctd { 0x80 } else { 0 };
                        h[2..4].copy_from_slice(&(len as u16).to_be_bytes());
                        h.extend(usage(op, sa, len));
                    }
                    None => h[1] = 0x01,
                }
                d = h;
                timeouts(&mut d);
            }
            _ => return Err(sense::INVALID_FIELD_CDB),
        }
        Ok(truncate(d, n))
    }
}
