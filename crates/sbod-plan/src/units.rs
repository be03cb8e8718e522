//! Human numbers in and out: sizes (`20TB`, `16TiB`), rates (`100MB/s`), hours (`2.5M`),
//! percentages (`0.35%`), and the formatting the tables use.
//!
//! Sizes follow sbod's one size rule (`sbod_types::size`: `20TB` = 20 x 10^12, `18T` =
//! `18TiB` = 18 x 2^40, decimal parts exact); hours and percentages are the planner's own,
//! with error messages that say what would be accepted.

use anyhow::{bail, Context, Result};

/// Bytes in a vendor terabyte.
pub const TB: f64 = 1e12;
/// Bytes in a tebibyte.
pub const TIB: f64 = (1u64 << 40) as f64;
/// Hours in the year AFR figures are quoted over (365 days).
pub const HOURS_PER_YEAR: f64 = 8760.0;

/// Splits `text` into its number and its (trimmed) unit suffix.
fn split_number(text: &str) -> (&str, &str) {
    let t = text.trim();
    let end = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_' || c == ','))
        .unwrap_or(t.len());
    (&t[..end], t[end..].trim())
}

/// Parses a non-negative decimal like `1.92` or `2_500_000` exactly, as (all its digits as
/// an integer, number of digits after the point): `1.92` is (192, 2).
fn parse_decimal(num: &str) -> Option<(u128, u32)> {
    let cleaned: String = num.chars().filter(|&c| c != '_' && c != ',').collect();
    let (int, frac) = match cleaned.split_once('.') {
        Some((i, f)) => (i, f),
        None => (cleaned.as_str(), ""),
    };
    if int.is_empty() && frac.is_empty() {
        return None;
    }
    if !int.chars().all(|c| c.is_ascii_digit()) || !frac.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let digits = format!("{int}{frac}");
    let mantissa: u128 = if digits.is_empty() {
        0
    } else {
        digits.parse().ok()?
    };
    Some((mantissa, frac.len() as u32))
}

/// Parses a disk size by sbod's one size rule ([`sbod_types::size`]): `20TB` and `1.92TB`
/// are decimal (10^12, as vendors count), `18T` and `16TiB` binary (2^40); zero is refused.
pub fn parse_size(text: &str) -> Result<u64> {
    let bytes = sbod_types::parse_size(text)?;
    if bytes == 0 {
        bail!("{text:?} is zero: a disk needs a size, e.g. 20TB");
    }
    Ok(bytes)
}

/// Parses a rate in bytes per second: `100MB/s`, `1.5GB/s`, `250M` (MiB/s, by the size
/// rule); a bare number is MB/s.
pub fn parse_rate(text: &str) -> Result<f64> {
    let t = text.trim();
    let hint = "write a rate like 100MB/s, 1.5GB/s or 250 (MB/s)";
    if t.chars()
        .all(|c| c.is_ascii_digit() || c == '.' || c == '_')
    {
        let (mantissa, frac_digits) =
            parse_decimal(t).with_context(|| format!("{text:?} is not a rate: {hint}"))?;
        let rate = mantissa as f64 * 1e6 / 10f64.powi(frac_digits as i32);
        if rate <= 0.0 {
            bail!("{text:?} is zero: a rate must be positive ({hint})");
        }
        return Ok(rate);
    }
    let rate = sbod_types::parse_rate(t)
        .map_err(|e| anyhow::anyhow!("{e}"))
        .with_context(|| hint.to_string())?;
    if rate == 0 {
        bail!("{text:?} is zero: a rate must be positive ({hint})");
    }
    Ok(rate as f64)
}

/// Parses a positive number with an optional `k`/`M`/`G` multiplier: `500k`, `2.5M`.
pub fn parse_number(text: &str) -> Result<f64> {
    parse_scaled(text, text, "write a number like 200, 500k or 2.5M")
}

/// Parses MTTF hours like `2.5M`, `2500000`, `1.2Mh` or `800k hours`.
pub fn parse_hours(text: &str) -> Result<f64> {
    let t = text.trim();
    let lower = t.to_ascii_lowercase();
    let cut = lower
        .strip_suffix("hours")
        .or_else(|| lower.strip_suffix('h'))
        .map_or(t.len(), str::len);
    parse_scaled(&t[..cut], text, "write hours like 2.5M, 1.2M or 2500000")
}

fn parse_scaled(body: &str, text: &str, hint: &str) -> Result<f64> {
    let (num, unit) = split_number(body);
    let (mantissa, frac_digits) =
        parse_decimal(num).with_context(|| format!("{text:?} is not understood: {hint}"))?;
    let mult = match unit.to_ascii_lowercase().as_str() {
        "" => 1.0,
        "k" => 1e3,
        "m" => 1e6,
        "g" => 1e9,
        _ => bail!("unknown multiplier in {text:?}: {hint}"),
    };
    let v = mantissa as f64 * mult / 10f64.powi(frac_digits as i32);
    if v <= 0.0 {
        bail!("{text:?} is zero: {hint}");
    }
    Ok(v)
}

/// Parses a fraction written as a percentage (`90%`) or as a plain fraction (`0.9`).
pub fn parse_fraction(text: &str) -> Result<f64> {
    let t = text.trim();
    let v = if let Some(p) = t.strip_suffix('%') {
        let p: f64 = p
            .trim()
            .parse()
            .with_context(|| format!("{text:?} is not a percentage like 90%"))?;
        p / 100.0
    } else {
        let v: f64 = t
            .parse()
            .with_context(|| format!("{text:?} is not a fraction like 0.9 or 90%"))?;
        if v > 1.0 {
            bail!("{text:?} is more than 1: write a percentage with a % sign ({text}%) or a fraction like 0.9");
        }
        v
    };
    if !(v.is_finite() && v > 0.0 && v <= 1.0) {
        bail!("{text:?} is out of range: it must be above 0% and at most 100%");
    }
    Ok(v)
}

/// Parses an annualised failure rate, which must carry a `%` sign (`0.35%`): a bare `0.35`
/// is too easily meant as a percentage and read as 35%.
pub fn parse_afr(text: &str) -> Result<f64> {
    if !text.trim().ends_with('%') {
        bail!("write the AFR as a percentage, e.g. --afr 0.35% (got {text:?})");
    }
    let v = parse_fraction(text)?;
    if v >= 1.0 {
        bail!(
            "an AFR of {text} means every disk fails within a year; typical figures are 0.3% to 3%"
        );
    }
    Ok(v)
}

/// Parses an unrecoverable read error rate: errors per bit read (`1e-15`), or the datasheet's
/// "one in N bits" written as N (`1e15`).
pub fn parse_ure(text: &str) -> Result<f64> {
    let v: f64 = text
        .trim()
        .parse()
        .with_context(|| format!("{text:?} is not a URE rate: write errors per bit, e.g. 1e-15"))?;
    if !(v.is_finite() && v > 0.0) {
        bail!("{text:?} is not a URE rate: it must be positive, e.g. 1e-15 per bit");
    }
    Ok(if v > 1.0 { 1.0 / v } else { v })
}

/// `1234567.8` -> `1,234,568`.
pub fn thousands(v: f64) -> String {
    let s = format!("{:.0}", v.abs());
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if v < 0.0 && s != "0" {
        out.insert(0, '-');
    }
    out
}

/// A probability for a table: `12.3%`, `0.0421%`, or `3.8e-8` when tiny.
pub fn prob(p: f64) -> String {
    if p <= 0.0 {
        "0".into()
    } else if p >= 0.1 {
        format!("{:.1}%", p * 100.0)
    } else if p >= 1e-5 {
        // Three significant figures.
        let digits = (2 - (p * 100.0).log10().floor() as i32).max(0) as usize;
        format!("{:.*}%", digits, p * 100.0)
    } else {
        format!("{p:.1e}")
    }
}

/// `1 in 26.1 million` style odds for a probability.
pub fn odds(p: f64) -> String {
    if p <= 0.0 {
        return "never".into();
    }
    let n = 1.0 / p;
    if n < 1.05 {
        return "certain".into();
    }
    if n < 10.0 {
        return format!("1 in {n:.1}");
    }
    if n < 1e6 {
        return format!("1 in {}", thousands(n));
    }
    for (scale, word) in [(1e6, "million"), (1e9, "billion"), (1e12, "trillion")] {
        let v = n / scale;
        if v < 999.5 {
            return if v < 99.95 {
                format!("1 in {v:.1} {word}")
            } else {
                format!("1 in {v:.0} {word}")
            };
        }
    }
    format!("1 in {n:.1e}")
}

/// A duration in years for a table: `4.75`, `1,234`, `2.3e12`.
pub fn years(y: f64) -> String {
    if !y.is_finite() || y >= 1e7 || (y > 0.0 && y < 0.01) {
        format!("{y:.1e}")
    } else if y >= 100.0 {
        thousands(y)
    } else {
        format!("{y:.2}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_exact() {
        assert_eq!(parse_size("20TB").unwrap(), 20_000_000_000_000);
        assert_eq!(parse_size("18T").unwrap(), 18 << 40);
        assert_eq!(parse_size("18TB").unwrap(), 18_000_000_000_000);
        assert_eq!(
            parse_size("1T").unwrap(),
            sbod_types::parse_size("1T").unwrap()
        );
        assert_eq!(parse_size("1.92TB").unwrap(), 1_920_000_000_000);
        assert_eq!(parse_size("16TiB").unwrap(), 16 << 40);
        assert_eq!(parse_size("0.5 TiB").unwrap(), 1 << 39);
        assert_eq!(parse_size("960gb").unwrap(), 960_000_000_000);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert!(parse_size("20XB").unwrap_err().to_string().contains("20TB"));
        assert!(parse_size("TB").is_err());
        assert!(parse_size("0TB").is_err());
        assert!(parse_size("1.2.3TB").is_err());
        assert!(parse_size("99999999PB").is_err());
    }

    #[test]
    fn rates_hours_fractions() {
        assert_eq!(parse_rate("100MB/s").unwrap(), 100e6);
        assert_eq!(parse_rate("1.5GB/s").unwrap(), 1.5e9);
        assert_eq!(parse_rate("250").unwrap(), 250e6);
        assert_eq!(parse_rate("250M/s").unwrap(), (250u64 << 20) as f64);
        assert!(parse_rate("0").is_err());
        assert_eq!(parse_hours("2.5M").unwrap(), 2.5e6);
        assert_eq!(parse_hours("2,500,000").unwrap(), 2.5e6);
        assert_eq!(parse_hours("1.2Mh").unwrap(), 1.2e6);
        assert_eq!(parse_hours("800k hours").unwrap(), 8e5);
        assert!(parse_hours("2.5X").is_err());
        assert!(parse_hours("0").is_err());
        assert_eq!(parse_number("500k").unwrap(), 5e5);
        assert_eq!(parse_number("200").unwrap(), 200.0);
        assert_eq!(parse_fraction("90%").unwrap(), 0.9);
        assert_eq!(parse_fraction("0.9").unwrap(), 0.9);
        assert!(parse_fraction("90")
            .unwrap_err()
            .to_string()
            .contains("90%"));
        assert!(parse_fraction("0%").is_err());
        assert!(parse_fraction("120%").is_err());
        assert!((parse_afr("0.35%").unwrap() - 0.0035).abs() < 1e-15);
        assert!(parse_afr("0.35").unwrap_err().to_string().contains("0.35%"));
        assert_eq!(parse_ure("1e-15").unwrap(), 1e-15);
        assert_eq!(parse_ure("1e15").unwrap(), 1e-15);
    }

    #[test]
    fn formatting() {
        assert_eq!(thousands(1234567.8), "1,234,568");
        assert_eq!(thousands(999.0), "999");
        assert_eq!(prob(0.5), "50.0%");
        assert_eq!(prob(0.0123), "1.23%");
        assert_eq!(prob(0.000123), "0.0123%");
        assert_eq!(prob(3.84e-8), "3.8e-8");
        assert_eq!(odds(1.0 / 26e6), "1 in 26.0 million");
        assert_eq!(odds(1.0 / 131.4e6), "1 in 131 million");
        assert_eq!(odds(1.0 / 999.9e6), "1 in 1.0 billion");
        assert_eq!(odds(1.0 / 29_940.0), "1 in 29,940");
        assert_eq!(odds(1e-20), "1 in 1.0e20");
        assert_eq!(odds(0.01), "1 in 100");
        assert_eq!(odds(0.5), "1 in 2.0");
        assert_eq!(odds(1.0), "certain");
        assert_eq!(years(4.75), "4.75");
        assert_eq!(years(12345.0), "12,345");
    }
}
