//! iSCSI PDUs (RFC 7143 section 11): the 48-byte Basic Header Segment, additional header
//! segments, the data segment, and the CRC32C header and data digests.

use std::io;
use tokio::io::{AsyncRead, AsyncReadExt};

pub const BHS_LEN: usize = 48;

// Initiator opcodes.
pub const OP_NOP_OUT: u8 = 0x00;
pub const OP_SCSI_CMD: u8 = 0x01;
pub const OP_TMF_REQ: u8 = 0x02;
pub const OP_LOGIN_REQ: u8 = 0x03;
pub const OP_TEXT_REQ: u8 = 0x04;
pub const OP_DATA_OUT: u8 = 0x05;
pub const OP_LOGOUT_REQ: u8 = 0x06;
pub const OP_SNACK: u8 = 0x10;
// Target opcodes.
pub const OP_NOP_IN: u8 = 0x20;
pub const OP_SCSI_RESP: u8 = 0x21;
pub const OP_TMF_RESP: u8 = 0x22;
pub const OP_LOGIN_RESP: u8 = 0x23;
pub const OP_TEXT_RESP: u8 = 0x24;
pub const OP_DATA_IN: u8 = 0x25;
pub const OP_LOGOUT_RESP: u8 = 0x26;
pub const OP_R2T: u8 = 0x31;
pub const OP_REJECT: u8 = 0x3f;

pub const FLAG_F: u8 = 0x80;
/// Reserved tag: no task / no transfer.
pub const NO_TAG: u32 = 0xffff_ffff;

// Reject reasons (11.17.1).
pub const REJECT_DIGEST: u8 = 0x02;
pub const REJECT_PROTOCOL: u8 = 0x04;
pub const REJECT_NOT_SUPPORTED: u8 = 0x05;
pub const REJECT_INVALID_FIELD: u8 = 0x09;

/// A PDU as read from the wire.
#[derive(Clone, Debug)]
pub struct Pdu {
    pub bhs: [u8; BHS_LEN],
    pub ahs: Vec<u8>,
    pub data: Vec<u8>,
}

pub fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().unwrap())
}
pub fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes(b[at..at + 2].try_into().unwrap())
}
pub fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_be_bytes());
}
pub fn put16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_be_bytes());
}

impl Pdu {
    pub fn opcode(&self) -> u8 {
        self.bhs[0] & 0x3f
    }
    pub fn immediate(&self) -> bool {
        self.bhs[0] & 0x40 != 0
    }
    pub fn flags(&self) -> u8 {
        self.bhs[1]
    }
    pub fn final_bit(&self) -> bool {
        self.bhs[1] & FLAG_F != 0
    }
    pub fn itt(&self) -> u32 {
        be32(&self.bhs, 16)
    }
    pub fn lun(&self) -> u64 {
        u64::from_be_bytes(self.bhs[8..16].try_into().unwrap())
    }
    pub fn field32(&self, at: usize) -> u32 {
        be32(&self.bhs, at)
    }
    pub fn cmd_sn(&self) -> u32 {
        be32(&self.bhs, 24)
    }
    pub fn exp_stat_sn(&self) -> u32 {
        be32(&self.bhs, 28)
    }
}

/// The data segment length and total AHS length a BHS announces.
pub fn lengths(bhs: &[u8; BHS_LEN]) -> (usize, usize) {
    let ahs = bhs[4] as usize * 4;
    let dsl = (bhs[5] as usize) << 16 | (bhs[6] as usize) << 8 | bhs[7] as usize;
    (ahs, dsl)
}

pub fn set_dsl(bhs: &mut [u8; BHS_LEN], len: usize) {
    debug_assert!(len < 1 << 24);
    bhs[5] = (len >> 16) as u8;
    bhs[6] = (len >> 8) as u8;
    bhs[7] = len as u8;
}

pub fn pad4(n: usize) -> usize {
    (4 - n % 4) % 4
}

/// The digest of a data segment, with its padding (RFC 7143 13.1: CRC32C, sent LSB first).
pub fn data_digest(data: &[u8]) -> u32 {
    let c = crc32c::crc32c(data);
    let p = pad4(data.len());
    if p == 0 {
        c
    } else {
        crc32c::crc32c_append(c, &[0u8; 4][..p])
    }
}

/// Why a PDU could not be read. `Closed` is a clean end between PDUs.
#[derive(Debug)]
pub enum ReadError {
    Closed,
    Io(io::Error),
    /// Breaks the protocol: the connection cannot stay in sync.
    Protocol(String),
    /// A data digest mismatch: the PDU is whole (the stream is in sync) but its data is bad.
    DataDigest(Box<Pdu>),
}

impl From<io::Error> for ReadError {
    fn from(e: io::Error) -> Self {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            ReadError::Protocol("the connection closed inside a PDU".into())
        } else {
            ReadError::Io(e)
        }
    }
}

/// Read one PDU. `max_data` is the most data a PDU may carry (our MaxRecvDataSegmentLength
/// or, for a Data-Out into a pre-sized buffer, checked by the caller); more is a protocol
/// error, never an allocation.
pub async fn read_pdu<R: AsyncRead + Unpin>(
    r: &mut R,
    header_digest: bool,
    data_digest_on: bool,
    max_data: usize,
) -> Result<Pdu, ReadError> {
    let mut bhs = [0u8; BHS_LEN];
    // The first byte tells a clean close from a torn PDU.
    match r.read(&mut bhs[..1]).await {
        Ok(0) => return Err(ReadError::Closed),
        Ok(_) => {}
        Err(e) => return Err(ReadError::Io(e)),
    }
    r.read_exact(&mut bhs[1..]).await?;
    let (ahs_len, dsl) = lengths(&bhs);
    if dsl > max_data {
        return Err(ReadError::Protocol(format!(
            "a data segment of {dsl} bytes is over the {max_data} negotiated"
        )));
    }
    let mut ahs = vec![0u8; ahs_len];
    r.read_exact(&mut ahs).await?;
    if header_digest {
        let mut d = [0u8; 4];
        r.read_exact(&mut d).await?;
        let want = crc32c::crc32c_append(crc32c::crc32c(&bhs), &ahs);
        if u32::from_le_bytes(d) != want {
            // The lengths in a bad header cannot be trusted: the stream is lost.
            return Err(ReadError::Protocol("header digest mismatch".into()));
        }
    }
    let mut data = vec![0u8; dsl + pad4(dsl)];
    r.read_exact(&mut data).await?;
    data.truncate(dsl);
    let pdu = Pdu { bhs, ahs, data };
    if data_digest_on && dsl > 0 {
        let mut d = [0u8; 4];
        r.read_exact(&mut d).await?;
        if u32::from_le_bytes(d) != data_digest(&pdu.data) {
            return Err(ReadError::DataDigest(Box::new(pdu)));
        }
    }
    Ok(pdu)
}

/// Encode a header (with its header digest) for a data segment of `dsl` bytes.
pub fn encode_header(mut bhs: [u8; BHS_LEN], dsl: usize, header_digest: bool, out: &mut Vec<u8>) {
    bhs[4] = 0;
    set_dsl(&mut bhs, dsl);
    out.extend_from_slice(&bhs);
    if header_digest {
        out.extend_from_slice(&crc32c::crc32c(&bhs).to_le_bytes());
    }
}

/// Append a data segment: its padding and, if on, its digest.
pub fn encode_data(data: &[u8], data_digest_on: bool, out: &mut Vec<u8>) {
    if data.is_empty() {
        return;
    }
    out.extend_from_slice(data);
    out.extend_from_slice(&[0u8; 4][..pad4(data.len())]);
    if data_digest_on {
        out.extend_from_slice(&data_digest(data).to_le_bytes());
    }
}

/// A new target header with the opcode and flags set.
pub fn header(op: u8, flags: u8) -> [u8; BHS_LEN] {
    let mut b = [0u8; BHS_LEN];
    b[0] = op;
    b[1] = flags;
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_is_the_rfc_crc32c() {
        // RFC 3720 B.4: 32 bytes of zeros have CRC32C 0x8a9136aa.
        assert_eq!(crc32c::crc32c(&[0u8; 32]), 0x8a9136aa);
        assert_eq!(data_digest(&[1, 2, 3]), crc32c::crc32c(&[1, 2, 3, 0]));
    }

    #[tokio::test]
    async fn round_trip_with_digests() {
        let mut h = header(OP_NOP_IN, FLAG_F);
        put32(&mut h, 16, 7);
        let mut out = Vec::new();
        encode_header(h, 5, true, &mut out);
        encode_data(b"hello", true, &mut out);
        let p = read_pdu(&mut &out[..], true, true, 1024).await.unwrap();
        assert_eq!(p.opcode(), OP_NOP_IN);
        assert_eq!(p.itt(), 7);
        assert_eq!(p.data, b"hello");
        // A flipped data bit is caught, the header still parsed.
        let mut bad = out.clone();
        bad[BHS_LEN + 4] ^= 1;
        assert!(matches!(
            read_pdu(&mut &bad[..], true, true, 1024).await,
            Err(ReadError::DataDigest(_))
        ));
        bad = out.clone();
        bad[3] ^= 1;
        assert!(matches!(
            read_pdu(&mut &bad[..], true, true, 1024).await,
            Err(ReadError::Protocol(_))
        ));
        // Over the limit: refused before any allocation.
        assert!(matches!(
            read_pdu(&mut &out[..], true, true, 4).await,
            Err(ReadError::Protocol(_))
        ));
    }
}
