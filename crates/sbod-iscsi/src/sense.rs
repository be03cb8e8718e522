//! SCSI status codes and fixed-format sense data (SPC-4 4.5.3).

pub const GOOD: u8 = 0x00;
pub const CHECK_CONDITION: u8 = 0x02;
pub const RESERVATION_CONFLICT: u8 = 0x18;

pub const NOT_READY: u8 = 0x02;
pub const MEDIUM_ERROR: u8 = 0x03;
pub const HARDWARE_ERROR: u8 = 0x04;
pub const ILLEGAL_REQUEST: u8 = 0x05;
pub const DATA_PROTECT: u8 = 0x07;
pub const ABORTED_COMMAND: u8 = 0x0b;
pub const MISCOMPARE: u8 = 0x0e;

/// A sense key with its additional sense code and qualifier.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sense {
    pub key: u8,
    pub asc: u8,
    pub ascq: u8,
    /// The INFORMATION field (e.g. the offset of a miscompare), if valid.
    pub info: Option<u32>,
    /// A sense-key-specific field pointer (SKSV): the CDB (`true`) or parameter byte.
    pub field: Option<(bool, u16)>,
}

impl Sense {
    pub const fn new(key: u8, asc: u8, ascq: u8) -> Sense {
        Sense {
            key,
            asc,
            ascq,
            info: None,
            field: None,
        }
    }

    /// 18 bytes, fixed format (response code 0x70, current error).
    pub fn bytes(&self) -> Vec<u8> {
        let mut s = vec![0u8; 18];
        s[0] = 0x70;
        s[2] = self.key;
        if let Some(i) = self.info {
            s[0] |= 0x80;
            s[3..7].copy_from_slice(&i.to_be_bytes());
        }
        s[7] = 10;
        s[12] = self.asc;
        s[13] = self.ascq;
        if let Some((cdb, at)) = self.field {
            s[15] = 0x80 | if cdb { 0x40 } else { 0 };
            s[16..18].copy_from_slice(&at.to_be_bytes());
        }
        s
    }
}

pub const INVALID_OPCODE: Sense = Sense::new(ILLEGAL_REQUEST, 0x20, 0x00);
pub const LBA_OUT_OF_RANGE: Sense = Sense::new(ILLEGAL_REQUEST, 0x21, 0x00);
pub const INVALID_FIELD_CDB: Sense = Sense::new(ILLEGAL_REQUEST, 0x24, 0x00);
pub const LUN_NOT_SUPPORTED: Sense = Sense::new(ILLEGAL_REQUEST, 0x25, 0x00);
pub const INVALID_FIELD_PARAM: Sense = Sense::new(ILLEGAL_REQUEST, 0x26, 0x00);
pub const PARAM_LIST_LENGTH: Sense = Sense::new(ILLEGAL_REQUEST, 0x1a, 0x00);
pub const INVALID_RELEASE: Sense = Sense::new(ILLEGAL_REQUEST, 0x26, 0x04);
pub const INVALID_FIELD_IU: Sense = Sense::new(ILLEGAL_REQUEST, 0x0e, 0x03);
pub const SAVING_NOT_SUPPORTED: Sense = Sense::new(ILLEGAL_REQUEST, 0x39, 0x00);
pub const UNRECOVERED_READ: Sense = Sense::new(MEDIUM_ERROR, 0x11, 0x00);
pub const WRITE_ERROR: Sense = Sense::new(MEDIUM_ERROR, 0x0c, 0x00);
pub const WRITE_PROTECTED: Sense = Sense::new(DATA_PROTECT, 0x27, 0x00);
pub const SPACE_ALLOC_FAILED: Sense = Sense::new(DATA_PROTECT, 0x27, 0x07);
pub const INTERNAL_FAILURE: Sense = Sense::new(HARDWARE_ERROR, 0x44, 0x00);
pub const SHUTTING_DOWN: Sense = Sense::new(NOT_READY, 0x04, 0x00);
pub const MISCOMPARE_VERIFY: Sense = Sense::new(MISCOMPARE, 0x1d, 0x00);
pub const NO_SENSE: Sense = Sense::new(0, 0, 0);
pub const DATA_PHASE_ERROR: Sense = Sense::new(ABORTED_COMMAND, 0x4b, 0x00);
