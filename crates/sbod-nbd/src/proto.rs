//! Wire format of the NBD protocol (NetworkBlockDevice/nbd, doc/proto.md): constants, and
//! pure parsers and encoders that never panic on any input.

pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
pub const OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;
pub const EXTENDED_REQUEST_MAGIC: u32 = 0x21e4_1c71;
pub const EXTENDED_REPLY_MAGIC: u32 = 0x6e8a_278c;

// Handshake flags (server) and client flags.
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const FLAG_C_NO_ZEROES: u32 = 1 << 1;

// Transmission flags.
pub const TF_HAS_FLAGS: u16 = 1 << 0;
pub const TF_READ_ONLY: u16 = 1 << 1;
pub const TF_SEND_FLUSH: u16 = 1 << 2;
pub const TF_SEND_FUA: u16 = 1 << 3;
pub const TF_SEND_TRIM: u16 = 1 << 5;
pub const TF_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const TF_SEND_DF: u16 = 1 << 7;
pub const TF_CAN_MULTI_CONN: u16 = 1 << 8;
pub const TF_SEND_CACHE: u16 = 1 << 10;
pub const TF_SEND_FAST_ZERO: u16 = 1 << 11;

// Options.
pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;
pub const OPT_LIST_META_CONTEXT: u32 = 9;
pub const OPT_SET_META_CONTEXT: u32 = 10;
pub const OPT_EXTENDED_HEADERS: u32 = 11;

// Option replies.
pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_META_CONTEXT: u32 = 4;
pub const REP_ERR_UNSUP: u32 = (1 << 31) + 1;
pub const REP_ERR_POLICY: u32 = (1 << 31) + 2;
pub const REP_ERR_INVALID: u32 = (1 << 31) + 3;
pub const REP_ERR_TLS_REQD: u32 = (1 << 31) + 5;
pub const REP_ERR_UNKNOWN: u32 = (1 << 31) + 6;
pub const REP_ERR_SHUTDOWN: u32 = (1 << 31) + 7;
pub const REP_ERR_TOO_BIG: u32 = (1 << 31) + 9;

// Info types.
pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

// Commands and their flags.
pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_CACHE: u16 = 5;
pub const CMD_WRITE_ZEROES: u16 = 6;
pub const CMD_BLOCK_STATUS: u16 = 7;
pub const CMD_FLAG_FUA: u16 = 1 << 0;
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
pub const CMD_FLAG_DF: u16 = 1 << 2;
pub const CMD_FLAG_REQ_ONE: u16 = 1 << 3;
pub const CMD_FLAG_FAST_ZERO: u16 = 1 << 4;
pub const CMD_FLAG_PAYLOAD_LEN: u16 = 1 << 5;

// Structured reply chunk types and flags.
pub const REPLY_FLAG_DONE: u16 = 1 << 0;
pub const REPLY_TYPE_NONE: u16 = 0;
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const REPLY_TYPE_OFFSET_HOLE: u16 = 2;
pub const REPLY_TYPE_BLOCK_STATUS: u16 = 5;
pub const REPLY_TYPE_BLOCK_STATUS_EXT: u16 = 6;
pub const REPLY_TYPE_ERROR: u16 = (1 << 15) + 1;

// Error values.
pub const EPERM: u32 = 1;
pub const EIO: u32 = 5;
pub const ENOMEM: u32 = 12;
pub const EINVAL: u32 = 22;
pub const ENOSPC: u32 = 28;
pub const EOVERFLOW: u32 = 75;
pub const ENOTSUP: u32 = 95;
pub const ESHUTDOWN: u32 = 108;

// `base:allocation` status flags.
pub const STATE_HOLE: u32 = 1 << 0;
pub const STATE_ZERO: u32 = 1 << 1;

/// The one metadata context served, and the id it is given when selected.
pub const META_BASE_ALLOCATION: &str = "base:allocation";
pub const META_ID_ALLOCATION: u32 = 1;

/// Longest option payload we accept (names are at most 4096 bytes by the spec).
pub const MAX_OPTION_LEN: u32 = 64 * 1024;

/// A transmission-phase request header (28 bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    pub flags: u16,
    pub kind: u16,
    pub cookie: u64,
    pub offset: u64,
    /// 32 bits in a compact header; 64 in an extended one (a payload length with
    /// `CMD_FLAG_PAYLOAD_LEN`, else the effect length).
    pub length: u64,
}

pub const REQUEST_LEN: usize = 28;
pub const EXTENDED_REQUEST_LEN: usize = 32;

/// Parse a request header. `None` if the magic is wrong (the connection must be dropped).
pub fn parse_request(b: &[u8; REQUEST_LEN]) -> Option<Request> {
    let magic = u32::from_be_bytes(b[0..4].try_into().ok()?);
    if magic != REQUEST_MAGIC {
        return None;
    }
    Some(Request {
        flags: u16::from_be_bytes(b[4..6].try_into().ok()?),
        kind: u16::from_be_bytes(b[6..8].try_into().ok()?),
        cookie: u64::from_be_bytes(b[8..16].try_into().ok()?),
        offset: u64::from_be_bytes(b[16..24].try_into().ok()?),
        length: u32::from_be_bytes(b[24..28].try_into().ok()?) as u64,
    })
}

/// Parse an extended request header (`NBD_OPT_EXTENDED_HEADERS`). `None` if the magic is
/// wrong.
pub fn parse_extended_request(b: &[u8; EXTENDED_REQUEST_LEN]) -> Option<Request> {
    let magic = u32::from_be_bytes(b[0..4].try_into().ok()?);
    if magic != EXTENDED_REQUEST_MAGIC {
        return None;
    }
    Some(Request {
        flags: u16::from_be_bytes(b[4..6].try_into().ok()?),
        kind: u16::from_be_bytes(b[6..8].try_into().ok()?),
        cookie: u64::from_be_bytes(b[8..16].try_into().ok()?),
        offset: u64::from_be_bytes(b[16..24].try_into().ok()?),
        length: u64::from_be_bytes(b[24..32].try_into().ok()?),
    })
}

pub fn encode_extended_request(r: &Request) -> [u8; EXTENDED_REQUEST_LEN] {
    let mut b = [0u8; EXTENDED_REQUEST_LEN];
    b[0..4].copy_from_slice(&EXTENDED_REQUEST_MAGIC.to_be_bytes());
    b[4..6].copy_from_slice(&r.flags.to_be_bytes());
    b[6..8].copy_from_slice(&r.kind.to_be_bytes());
    b[8..16].copy_from_slice(&r.cookie.to_be_bytes());
    b[16..24].copy_from_slice(&r.offset.to_be_bytes());
    b[24..32].copy_from_slice(&r.length.to_be_bytes());
    b
}

/// The data of an NBD_OPT_LIST_META_CONTEXT / NBD_OPT_SET_META_CONTEXT option.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetaRequest {
    pub name: String,
    pub queries: Vec<String>,
}

/// Parse LIST/SET_META_CONTEXT data. `None` if malformed (a length beyond the data, bytes
/// left over, a string that is not UTF-8 or longer than 4096 bytes): NBD_REP_ERR_INVALID.
pub fn parse_meta_request(d: &[u8]) -> Option<MetaRequest> {
    fn string(d: &[u8], at: &mut usize) -> Option<String> {
        let n = u32::from_be_bytes(d.get(*at..*at + 4)?.try_into().ok()?) as usize;
        if n > 4096 {
            return None;
        }
        let s = d.get(*at + 4..(*at + 4).checked_add(n)?)?;
        *at += 4 + n;
        String::from_utf8(s.to_vec()).ok()
    }
    let mut at = 0;
    let name = string(d, &mut at)?;
    let n = u32::from_be_bytes(d.get(at..at + 4)?.try_into().ok()?) as usize;
    at += 4;
    // Each query takes at least its 4-byte length: a count beyond that is a lie.
    if n > (d.len() - at) / 4 {
        return None;
    }
    let mut queries = Vec::with_capacity(n);
    for _ in 0..n {
        queries.push(string(d, &mut at)?);
    }
    (at == d.len()).then_some(MetaRequest { name, queries })
}

pub fn encode_meta_request(r: &MetaRequest) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&(r.name.len() as u32).to_be_bytes());
    v.extend_from_slice(r.name.as_bytes());
    v.extend_from_slice(&(r.queries.len() as u32).to_be_bytes());
    for q in &r.queries {
        v.extend_from_slice(&(q.len() as u32).to_be_bytes());
        v.extend_from_slice(q.as_bytes());
    }
    v
}

pub fn encode_request(r: &Request) -> [u8; REQUEST_LEN] {
    let mut b = [0u8; REQUEST_LEN];
    b[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
    b[4..6].copy_from_slice(&r.flags.to_be_bytes());
    b[6..8].copy_from_slice(&r.kind.to_be_bytes());
    b[8..16].copy_from_slice(&r.cookie.to_be_bytes());
    b[16..24].copy_from_slice(&r.offset.to_be_bytes());
    b[24..28].copy_from_slice(&(r.length as u32).to_be_bytes());
    b
}

/// The data of an NBD_OPT_INFO / NBD_OPT_GO option.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InfoRequest {
    pub name: String,
    pub requests: Vec<u16>,
}

/// Parse NBD_OPT_INFO/GO data. `None` if malformed (reply NBD_REP_ERR_INVALID).
pub fn parse_info_request(d: &[u8]) -> Option<InfoRequest> {
    if d.len() < 6 {
        return None;
    }
    let nlen = u32::from_be_bytes(d[0..4].try_into().ok()?) as usize;
    if nlen > d.len() - 6 {
        return None;
    }
    let name = String::from_utf8(d[4..4 + nlen].to_vec()).ok()?;
    let rest = &d[4 + nlen..];
    let n = u16::from_be_bytes(rest[0..2].try_into().ok()?) as usize;
    if rest.len() != 2 + 2 * n {
        return None;
    }
    let requests = (0..n)
        .map(|i| u16::from_be_bytes([rest[2 + 2 * i], rest[3 + 2 * i]]))
        .collect();
    Some(InfoRequest { name, requests })
}

pub fn encode_info_request(r: &InfoRequest) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&(r.name.len() as u32).to_be_bytes());
    v.extend_from_slice(r.name.as_bytes());
    v.extend_from_slice(&(r.requests.len() as u16).to_be_bytes());
    for q in &r.requests {
        v.extend_from_slice(&q.to_be_bytes());
    }
    v
}

/// An option reply header plus data.
pub fn option_reply(option: u32, kind: u32, data: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(20 + data.len());
    v.extend_from_slice(&OPT_REPLY_MAGIC.to_be_bytes());
    v.extend_from_slice(&option.to_be_bytes());
    v.extend_from_slice(&kind.to_be_bytes());
    v.extend_from_slice(&(data.len() as u32).to_be_bytes());
    v.extend_from_slice(data);
    v
}

pub fn simple_reply_header(error: u32, cookie: u64) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    b[4..8].copy_from_slice(&error.to_be_bytes());
    b[8..16].copy_from_slice(&cookie.to_be_bytes());
    b
}

/// A structured reply chunk header (20 bytes).
pub fn chunk_header(flags: u16, kind: u16, cookie: u64, length: u32) -> [u8; 20] {
    let mut b = [0u8; 20];
    b[0..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    b[4..6].copy_from_slice(&flags.to_be_bytes());
    b[6..8].copy_from_slice(&kind.to_be_bytes());
    b[8..16].copy_from_slice(&cookie.to_be_bytes());
    b[16..20].copy_from_slice(&length.to_be_bytes());
    b
}

/// An extended reply chunk header (32 bytes).
pub fn extended_header(flags: u16, kind: u16, cookie: u64, offset: u64, length: u64) -> [u8; 32] {
    let mut b = [0u8; 32];
    b[0..4].copy_from_slice(&EXTENDED_REPLY_MAGIC.to_be_bytes());
    b[4..6].copy_from_slice(&flags.to_be_bytes());
    b[6..8].copy_from_slice(&kind.to_be_bytes());
    b[8..16].copy_from_slice(&cookie.to_be_bytes());
    b[16..24].copy_from_slice(&offset.to_be_bytes());
    b[24..32].copy_from_slice(&length.to_be_bytes());
    b
}

/// A complete extended NBD_REPLY_TYPE_ERROR chunk with the DONE flag.
pub fn extended_error_chunk(cookie: u64, offset: u64, error: u32, message: &str) -> Vec<u8> {
    let msg = &message.as_bytes()[..message.len().min(4096)];
    let mut v = Vec::with_capacity(38 + msg.len());
    v.extend_from_slice(&extended_header(
        REPLY_FLAG_DONE,
        REPLY_TYPE_ERROR,
        cookie,
        offset,
        6 + msg.len() as u64,
    ));
    v.extend_from_slice(&error.to_be_bytes());
    v.extend_from_slice(&(msg.len() as u16).to_be_bytes());
    v.extend_from_slice(msg);
    v
}

/// A complete NBD_REPLY_TYPE_ERROR chunk with the DONE flag.
pub fn error_chunk(cookie: u64, error: u32, message: &str) -> Vec<u8> {
    let msg = &message.as_bytes()[..message.len().min(4096)];
    let mut v = Vec::with_capacity(26 + msg.len());
    v.extend_from_slice(&chunk_header(
        REPLY_FLAG_DONE,
        REPLY_TYPE_ERROR,
        cookie,
        6 + msg.len() as u32,
    ));
    v.extend_from_slice(&error.to_be_bytes());
    v.extend_from_slice(&(msg.len() as u16).to_be_bytes());
    v.extend_from_slice(msg);
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn request_roundtrip() {
        let r = Request {
            flags: 1,
            kind: CMD_WRITE,
            cookie: 0xdead_beef,
            offset: 4096,
            length: 512,
        };
        assert_eq!(parse_request(&encode_request(&r)), Some(r));
        let mut b = encode_request(&r);
        b[0] ^= 1;
        assert_eq!(parse_request(&b), None);
    }

    #[test]
    fn info_request_roundtrip_and_bounds() {
        let r = InfoRequest {
            name: "vol0".into(),
            requests: vec![INFO_BLOCK_SIZE, INFO_NAME],
        };
        assert_eq!(parse_info_request(&encode_info_request(&r)), Some(r));
        // Name length larger than the data.
        let mut bad = encode_info_request(&InfoRequest {
            name: "x".into(),
            requests: vec![],
        });
        bad[3] = 200;
        assert_eq!(parse_info_request(&bad), None);
        // Count of requests that doesn't match the data.
        let mut bad = encode_info_request(&InfoRequest {
            name: String::new(),
            requests: vec![1],
        });
        bad.push(0);
        assert_eq!(parse_info_request(&bad), None);
    }

    #[test]
    fn meta_request_roundtrip_and_bounds() {
        let r = MetaRequest {
            name: "vol0".into(),
            queries: vec!["base:allocation".into(), "qemu:".into()],
        };
        assert_eq!(
            parse_meta_request(&encode_meta_request(&r)),
            Some(r.clone())
        );
        let good = encode_meta_request(&r);
        // Trailing bytes, a truncated query, a count beyond the data.
        let mut bad = good.clone();
        bad.push(0);
        assert_eq!(parse_meta_request(&bad), None);
        assert_eq!(parse_meta_request(&good[..good.len() - 1]), None);
        let mut bad = encode_meta_request(&MetaRequest {
            name: String::new(),
            queries: vec![],
        });
        bad[7] = 0xff;
        assert_eq!(parse_meta_request(&bad), None);
        assert_eq!(parse_meta_request(&[]), None);
    }

    #[test]
    fn extended_request_roundtrip() {
        let r = Request {
            flags: CMD_FLAG_REQ_ONE,
            kind: CMD_BLOCK_STATUS,
            cookie: 7,
            offset: 1 << 40,
            length: 5 << 32,
        };
        assert_eq!(
            parse_extended_request(&encode_extended_request(&r)),
            Some(r)
        );
        let mut b = encode_extended_request(&r);
        b[0] ^= 1;
        assert_eq!(parse_extended_request(&b), None);
    }

    proptest! {
        #[test]
        fn parsers_never_panic(data in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = parse_info_request(&data);
            let _ = parse_meta_request(&data);
            let mut x = [0u8; EXTENDED_REQUEST_LEN];
            for (i, b) in data.iter().take(EXTENDED_REQUEST_LEN).enumerate() { x[i] = *b; }
            let _ = parse_extended_request(&x);
            let mut h = [0u8; REQUEST_LEN];
            for (i, b) in data.iter().take(REQUEST_LEN).enumerate() { h[i] = *b; }
            let _ = parse_request(&h);
        }
    }
}
