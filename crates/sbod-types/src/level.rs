//! The RAID level, one type for the engine, the planner and the management interfaces.

use crate::ParseError;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// How an array (each of its groups) keeps its data. Written and read as `raid0`, `raid1`,
/// `raid10`, `raid5`, `raid6`, `ec:K+M` or `concat` (also in JSON and superblocks).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub enum Level {
    Raid0,
    Raid1,
    Raid10,
    Raid5,
    Raid6,
    /// Reed-Solomon with `k` data and `m` parity shards per group.
    Ec {
        k: u16,
        m: u16,
    },
    Concat,
}

/// What `Level`'s parser accepts, for error messages and `--help`.
pub const LEVELS_HINT: &str = "raid0, raid1, raid10, raid5, raid6, ec:K+M (e.g. ec:8+3) or concat";

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Level::Raid0 => f.write_str("raid0"),
            Level::Raid1 => f.write_str("raid1"),
            Level::Raid10 => f.write_str("raid10"),
            Level::Raid5 => f.write_str("raid5"),
            Level::Raid6 => f.write_str("raid6"),
            Level::Ec { k, m } => write!(f, "ec:{k}+{m}"),
            Level::Concat => f.write_str("concat"),
        }
    }
}

impl From<Level> for String {
    fn from(l: Level) -> String {
        l.to_string()
    }
}

impl TryFrom<String> for Level {
    type Error = ParseError;
    fn try_from(s: String) -> Result<Level, ParseError> {
        s.parse()
    }
}

impl FromStr for Level {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Level, ParseError> {
        let err = |m: String| ParseError(m);
        let l = s.trim().to_ascii_lowercase();
        Ok(match l.as_str() {
            "raid0" | "0" | "stripe" => Level::Raid0,
            "raid1" | "1" | "mirror" => Level::Raid1,
            "raid10" | "10" => Level::Raid10,
            "raid5" | "5" => Level::Raid5,
            "raid6" | "6" => Level::Raid6,
            "concat" | "linear" => Level::Concat,
            _ => {
                let spec = l
                    .strip_prefix("ec:")
                    .ok_or_else(|| err(format!("unknown level '{s}': use {LEVELS_HINT}")))?;
                let (k, m) = spec.split_once('+').ok_or_else(|| {
                    err(format!(
                        "'{s}' is not an erasure code: write ec:K+M with K data and M parity \
                         shards per group, for example ec:8+3"
                    ))
                })?;
                let k: u16 = k
                    .parse()
                    .map_err(|_| err(format!("'{s}': K must be a number (ec:K+M)")))?;
                let m: u16 = m
                    .parse()
                    .map_err(|_| err(format!("'{s}': M must be a number (ec:K+M)")))?;
                if k == 0 || m == 0 {
                    return Err(err(format!(
                        "'{s}': K and M must both be at least 1 (ec:K+M)"
                    )));
                }
                if k as usize + m as usize > 256 {
                    return Err(err(format!("'{s}': K+M is at most 256 (ec:K+M)")));
                }
                Level::Ec { k, m }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for l in [
            Level::Raid0,
            Level::Raid1,
            Level::Raid10,
            Level::Raid5,
            Level::Raid6,
            Level::Ec { k: 8, m: 3 },
            Level::Concat,
        ] {
            assert_eq!(l.to_string().parse::<Level>().unwrap(), l);
            let j = serde_json::to_string(&l).unwrap();
            assert_eq!(serde_json::from_str::<Level>(&j).unwrap(), l);
        }
        assert_eq!("RAID6".parse::<Level>().unwrap(), Level::Raid6);
        assert_eq!("linear".parse::<Level>().unwrap(), Level::Concat);
        assert!("ec:8".parse::<Level>().unwrap_err().0.contains("ec:K+M"));
        assert!("raid9".parse::<Level>().unwrap_err().0.contains("ec:K+M"));
        assert!("ec:0+2".parse::<Level>().is_err());
        assert!("ec:200+57".parse::<Level>().is_err());
        assert!(serde_json::from_str::<Level>("\"raid7\"").is_err());
    }
}
