//! Sizes in and out, one rule everywhere (create, add, replace, set, plan, bench, demo, lab):
//!
//! - a plain number is bytes: `4096`, `4096B`;
//! - a bare letter is binary, as in mdadm and zfs: `64K` = 64 x 2^10, `1G` = 2^30,
//!   `1T` = 2^40 (K, M, G, T, P, E); so is the IEC spelling: `1KiB`, `1TiB`, `1Ti`;
//! - a letter with `B` is decimal, as disk vendors count: `20TB` = 20 x 10^12, `960GB`,
//!   `1KB` = 1000 (KB, MB, GB, TB, PB, EB);
//! - case does not matter; a fraction is allowed and rounded to the nearest byte (`1.5G`,
//!   `1.92TB` = 1 920 000 000 000 exactly); `_` may group digits; a value above 2^64-1 bytes
//!   is refused with a message.
//!
//! Hand-written rather than `bytesize` or `parse-size`: those read `1T` as 10^12 or differ
//! on `TB`, and the planner needs decimal fractions exact (`1.92TB`), not rounded through an
//! `f64` product.

use crate::ParseError;

/// The rule in one line, for `--help` texts and error messages.
pub const SIZE_RULE: &str =
    "K/M/G/T = 2^10..2^40 (also KiB/MiB/GiB/TiB), KB/MB/GB/TB = 10^3..10^12, a plain number is bytes";

const BIN: [&str; 7] = ["", "k", "m", "g", "t", "p", "e"];

/// The multiplier of a unit, or None if the unit is not one.
fn unit(u: &str) -> Option<u128> {
    let u = u.to_ascii_lowercase();
    let (letter, binary) = if u.is_empty() || u == "b" {
        return Some(1);
    } else if let Some(l) = u.strip_suffix("ib").or_else(|| u.strip_suffix('i')) {
        (l, true)
    } else if let Some(l) = u.strip_suffix('b') {
        (l, false)
    } else {
        (u.as_str(), true)
    };
    let p = BIN[1..].iter().position(|&x| x == letter)? as u32 + 1;
    Some(if binary {
        1u128 << (10 * p)
    } else {
        10u128.pow(3 * p)
    })
}

/// Parse a size by the rule above.
pub fn parse_size(text: &str) -> Result<u64, ParseError> {
    let t = text.trim();
    let end = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_'))
        .unwrap_or(t.len());
    let (num, u) = (&t[..end], t[end..].trim());
    let bad = || {
        ParseError(format!(
            "'{text}' is not a size: write it like 4096, 64K, 1.5G, 20TB or 16TiB ({SIZE_RULE})"
        ))
    };
    let num: String = num.chars().filter(|&c| c != '_').collect();
    let (int, frac) = num.split_once('.').unwrap_or((&num, ""));
    if (int.is_empty() && frac.is_empty()) || frac.contains('.') {
        return Err(bad());
    }
    let mult = unit(u).ok_or_else(|| {
        ParseError(format!(
            "unknown unit '{u}' in '{text}': {SIZE_RULE} (e.g. 64K, 1.5G, 20TB, 16TiB)"
        ))
    })?;
    let too_large = || ParseError(format!("'{text}' is too large: sizes go up to 16 EiB"));
    // Exact: all digits as one integer, scaled down by the digits after the point.
    if frac.len() > 30 {
        return Err(bad());
    }
    let digits = format!("{int}{frac}");
    let mantissa: u128 = digits.trim_start_matches('0').parse().or_else(|_| {
        if digits.chars().all(|c| c == '0') {
            Ok(0)
        } else {
            Err(too_large())
        }
    })?;
    let scale = 10u128.pow(frac.len() as u32);
    let scaled = mantissa.checked_mul(mult).ok_or_else(too_large)?;
    let bytes = (scaled + scale / 2) / scale;
    u64::try_from(bytes).map_err(|_| too_large())
}

/// Parse a rate in bytes per second: a size by the same rule, optionally followed by `/s`
/// (`50M`, `50M/s`, `1.5GB/s`).
pub fn parse_rate(text: &str) -> Result<u64, ParseError> {
    let t = text.trim();
    let t = t
        .strip_suffix("/s")
        .or_else(|| t.strip_suffix("/S"))
        .unwrap_or(t);
    parse_size(t).map_err(|e| ParseError(e.0.replace("a size", "a rate (bytes/s)")))
}

/// A size written so that [`parse_size`] reads it back exactly, as short as the rule allows:
/// `64KiB`, `20TB`, `1GiB`, `4097` (bytes).
pub fn format_size(bytes: u64) -> String {
    let b = bytes as u128;
    if b == 0 {
        return "0".into();
    }
    for p in (1..BIN.len()).rev() {
        let bin = 1u128 << (10 * p);
        if b % bin == 0 {
            return format!("{}{}iB", b / bin, BIN[p].to_ascii_uppercase());
        }
        let dec = 10u128.pow(3 * p as u32);
        if b % dec == 0 {
            return format!("{}{}B", b / dec, BIN[p].to_ascii_uppercase());
        }
    }
    bytes.to_string()
}

/// Bytes the way storage people read them: binary units with one decimal (`1.5 GiB`).
/// For display; [`format_size`] when the value must read back exactly.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rule() {
        let cases: &[(&str, u64)] = &[
            ("4096", 4096),
            ("4096B", 4096),
            ("64K", 64 << 10),
            ("64k", 64 << 10),
            ("64KiB", 64 << 10),
            ("64Ki", 64 << 10),
            ("1KB", 1000),
            ("1.5M", 1_572_864),
            ("1G", 1 << 30),
            ("1T", 1 << 40),
            ("1TiB", 1 << 40),
            ("18T", 18 << 40),
            ("18TB", 18_000_000_000_000),
            ("20TB", 20_000_000_000_000),
            ("20tb", 20_000_000_000_000),
            ("1.92TB", 1_920_000_000_000),
            ("0.5 TiB", 1 << 39),
            ("960GB", 960_000_000_000),
            ("2P", 2 << 50),
            ("1PB", 1_000_000_000_000_000),
            ("1_000", 1000),
            ("0", 0),
            ("15EiB", 15 << 60),
            ("18446744073709551615", u64::MAX),
        ];
        for &(t, want) in cases {
            assert_eq!(parse_size(t), Ok(want), "{t}");
        }
        for bad in ["", "K", "1.2.3T", "12X", "-1K", "1 T B", "1Tb2"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
        assert!(parse_size("12X").unwrap_err().0.contains("20TB"));
        assert!(parse_size("17EiB").unwrap_err().0.contains("too large"));
        assert!(parse_size("18446744073709551616")
            .unwrap_err()
            .0
            .contains("too large"));
        assert_eq!(parse_rate("50M/s"), Ok(50 << 20));
        assert_eq!(parse_rate("1.5GB/s"), Ok(1_500_000_000));
        assert_eq!(parse_rate("0"), Ok(0));
        assert!(parse_rate("fast").unwrap_err().0.contains("rate"));
    }

    #[test]
    fn formats() {
        assert_eq!(format_size(64 << 10), "64KiB");
        assert_eq!(format_size(20_000_000_000_000), "20TB");
        assert_eq!(format_size(1 << 40), "1TiB");
        assert_eq!(format_size(4097), "4097");
        assert_eq!(format_size(3000), "3KB");
        assert_eq!(human(1536 << 20), "1.5 GiB");
        assert_eq!(human(512), "512 B");
    }
}
