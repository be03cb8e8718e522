//! The login phase (RFC 7143 sections 6 and 13): text keys, the negotiation of the
//! operational parameters, and CHAP (RFC 1994 with MD5, one-way and mutual).

use md5::{Digest, Md5};

/// `key=value\0` pairs in order; a malformed pair is an error the caller rejects.
pub fn parse_keys(data: &[u8]) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for part in data.split(|&b| b == 0) {
        if part.is_empty() {
            continue;
        }
        let s = std::str::from_utf8(part).map_err(|_| "a text key is not UTF-8".to_string())?;
        let (k, v) = s.split_once('=').ok_or_else(|| {
            format!(
                "text key '{}' has no '='",
                s.chars().take(64).collect::<String>()
            )
        })?;
        if k.is_empty() || k.len() > 63 || v.len() > 8192 {
            return Err("a text key or value is too long".into());
        }
        out.push((k.to_string(), v.to_string()));
    }
    Ok(out)
}

pub fn encode_keys(keys: &[(String, String)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (k, v) in keys {
        out.extend_from_slice(k.as_bytes());
        out.push(b'=');
        out.extend_from_slice(v.as_bytes());
        out.push(0);
    }
    out
}

/// CHAP secrets for a target: the initiator must prove `secret` under `user`; with
/// `mutual` the target proves its own secret back when the initiator asks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chap {
    pub user: String,
    pub secret: Vec<u8>,
    pub mutual: Option<(String, Vec<u8>)>,
}

/// The parameters of a session once negotiated (our limits where we set them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Params {
    pub header_digest: bool,
    pub data_digest: bool,
    /// The most data we may put in one PDU to the initiator.
    pub send_dsl: usize,
    /// The most data the initiator may put in one PDU to us (ours, declared).
    pub recv_dsl: usize,
    pub max_burst: u32,
    pub first_burst: u32,
    pub immediate_data: bool,
    pub initial_r2t: bool,
}

/// Our MaxRecvDataSegmentLength.
pub const OUR_RECV_DSL: usize = 256 << 10;
/// Our MaxBurstLength and FirstBurstLength ceilings.
pub const OUR_MAX_BURST: u32 = 16 << 20;
pub const OUR_FIRST_BURST: u32 = 256 << 10;

impl Default for Params {
    /// RFC 7143's defaults, before any negotiation.
    fn default() -> Self {
        Params {
            header_digest: false,
            data_digest: false,
            send_dsl: 8192,
            recv_dsl: OUR_RECV_DSL,
            max_burst: 262144,
            first_burst: 65536,
            immediate_data: true,
            initial_r2t: true,
        }
    }
}

fn num(v: &str) -> Option<u64> {
    if let Some(h) = v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        u64::from_str_radix(h, 16).ok()
    } else {
        v.parse().ok()
    }
}

fn yes(v: &str) -> Option<bool> {
    match v {
        "Yes" => Some(true),
        "No" => Some(false),
        _ => None,
    }
}

fn yn(b: bool) -> String {
    if b { "Yes" } else { "No" }.into()
}

/// Answer one operational key; `None` if the key is not operational (the caller handles it).
/// Values out of range are answered `Reject` (13.6).
pub fn negotiate(p: &mut Params, key: &str, v: &str, discovery: bool) -> Option<String> {
    let digest = |v: &str| -> Option<bool> {
        v.split(',').find_map(|c| match c {
            "CRC32C" => Some(true),
            "None" => Some(false),
            _ => None,
        })
    };
    Some(match key {
        "HeaderDigest" => match digest(v) {
            Some(b) => {
                p.header_digest = b;
                if b { "CRC32C" } else { "None" }.into()
            }
            None => "Reject".into(),
        },
        "DataDigest" => match digest(v) {
            Some(b) => {
                p.data_digest = b;
                if b { "CRC32C" } else { "None" }.into()
            }
            None => "Reject".into(),
        },
        "MaxRecvDataSegmentLength" => match num(v) {
            Some(n) if (512..=16_777_215).contains(&n) => {
                p.send_dsl = n as usize;
                return Some(String::new()); // declarative: ours is sent separately
            }
            _ => "Reject".into(),
        },
        "MaxConnections" => match num(v) {
            Some(n) if (1..=65535).contains(&n) => "1".into(),
            _ => "Reject".into(),
        },
        "InitialR2T" => match yes(v) {
            Some(b) => {
                p.initial_r2t = b;
                yn(b)
            }
            None => "Reject".into(),
        },
        "ImmediateData" => match yes(v) {
            Some(b) => {
                p.immediate_data = b;
                yn(b)
            }
            None => "Reject".into(),
        },
        "MaxBurstLength" => match num(v) {
            Some(n) if (512..=16_777_215).contains(&n) => {
                p.max_burst = (n as u32).min(OUR_MAX_BURST);
                p.max_burst.to_string()
            }
            _ => "Reject".into(),
        },
        "FirstBurstLength" => match num(v) {
            Some(n) if (512..=16_777_215).contains(&n) => {
                p.first_burst = (n as u32).min(OUR_FIRST_BURST);
                p.first_burst.to_string()
            }
            _ => "Reject".into(),
        },
        "DefaultTime2Wait" => match num(v) {
            Some(n) if n <= 3600 => n.to_string(),
            _ => "Reject".into(),
        },
        // Connection and session recovery are not offered (ErrorRecoveryLevel 0).
        "DefaultTime2Retain" => match num(v) {
            Some(n) if n <= 3600 => "0".into(),
            _ => "Reject".into(),
        },
        "MaxOutstandingR2T" => match num(v) {
            Some(n) if (1..=65535).contains(&n) => "1".into(),
            _ => "Reject".into(),
        },
        "DataPDUInOrder" | "DataSequenceInOrder" => match yes(v) {
            Some(_) => "Yes".into(),
            None => "Reject".into(),
        },
        "ErrorRecoveryLevel" => match num(v) {
            Some(n) if n <= 2 => "0".into(),
            _ => "Reject".into(),
        },
        "IFMarker" | "OFMarker" => "No".into(),
        "OFMarkInt" | "IFMarkInt" => "Irrelevant".into(),
        "iSCSIProtocolLevel" => match num(v) {
            Some(n) => n.min(1).to_string(),
            None => "Reject".into(),
        },
        "TaskReporting" => "RFC3720".into(),
        _ => return None,
    })
    .map(|s| {
        if discovery
            && matches!(
                key,
                "InitialR2T"
                    | "ImmediateData"
                    | "MaxBurstLength"
                    | "FirstBurstLength"
                    | "MaxOutstandingR2T"
                    | "DataPDUInOrder"
                    | "DataSequenceInOrder"
                    | "DefaultTime2Wait"
                    | "DefaultTime2Retain"
                    | "ErrorRecoveryLevel"
                    | "MaxConnections"
            )
        {
            // Session keys in a discovery session are irrelevant (13.22 etc.).
            "Irrelevant".into()
        } else {
            s
        }
    })
}

/// A CHAP value: `0x` hex or `0b` base64 (RFC 7143 6.1).
pub fn decode_binary(v: &str) -> Option<Vec<u8>> {
    if let Some(h) = v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        if h.is_empty() || h.len() > 2048 {
            return None;
        }
        let h = if h.len() % 2 == 1 {
            format!("0{h}")
        } else {
            h.to_string()
        };
        (0..h.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&h[i..i + 2], 16).ok())
            .collect()
    } else if let Some(b) = v.strip_prefix("0b").or_else(|| v.strip_prefix("0B")) {
        base64(b)
    } else {
        None
    }
}

// A few lines of base64 rather than a crate: CHAP values are the only use.
fn base64(s: &str) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in s.bytes().filter(|&c| c != b'=') {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32;
        acc = acc << 6 | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    (!out.is_empty() && out.len() <= 1024).then_some(out)
}

pub fn hex(b: &[u8]) -> String {
    let mut s = String::from("0x");
    for x in b {
        s.push_str(&format!("{x:02x}"));
    }
    s
}

/// RFC 1994: MD5(identifier || secret || challenge).
pub fn chap_response(id: u8, secret: &[u8], challenge: &[u8]) -> [u8; 16] {
    let mut h = Md5::new();
    h.update([id]);
    h.update(secret);
    h.update(challenge);
    h.finalize().into()
}

/// Constant-time comparison of two responses.
pub fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_and_reject_garbage() {
        let k = vec![
            ("A".to_string(), "1".to_string()),
            ("B".into(), "x=y".into()),
        ];
        assert_eq!(parse_keys(&encode_keys(&k)).unwrap(), k);
        assert!(parse_keys(b"novalue\0").is_err());
        assert!(parse_keys(&[0xff, b'=', b'1', 0]).is_err());
    }

    #[test]
    fn chap_matches_rfc1994() {
        // MD5 of id 1, secret "secret", challenge 0x00..0f, as computed by openssl.
        let c: Vec<u8> = (0..16).collect();
        let r = chap_response(1, b"secret", &c);
        let mut h = Md5::new();
        h.update([1u8]);
        h.update(b"secret");
        h.update(&c);
        assert_eq!(&r[..], &h.finalize()[..]);
        assert_eq!(decode_binary(&hex(&r)).unwrap(), r);
        assert_eq!(decode_binary("0bAAEC").unwrap(), vec![0, 1, 2]);
        assert!(decode_binary("zz").is_none());
    }

    #[test]
    fn negotiation_takes_the_lesser_and_rejects_nonsense() {
        let mut p = Params::default();
        assert_eq!(
            negotiate(&mut p, "MaxBurstLength", "1048576", false).unwrap(),
            "1048576"
        );
        assert_eq!(
            negotiate(&mut p, "FirstBurstLength", "16777215", false).unwrap(),
            "262144"
        );
        assert_eq!(
            negotiate(&mut p, "HeaderDigest", "CRC32C,None", false).unwrap(),
            "CRC32C"
        );
        assert!(p.header_digest);
        assert_eq!(
            negotiate(&mut p, "MaxBurstLength", "12", false).unwrap(),
            "Reject"
        );
        assert_eq!(negotiate(&mut p, "InitialR2T", "No", false).unwrap(), "No");
        assert!(negotiate(&mut p, "X-foo", "1", false).is_none());
    }
}
