//! Property tests of the one size rule.

use proptest::prelude::*;
use sbod_types::size::{format_size, human, parse_rate, parse_size};

proptest! {
    /// What the formatter writes, the parser reads back exactly.
    #[test]
    fn format_round_trips(b in any::<u64>()) {
        prop_assert_eq!(parse_size(&format_size(b)), Ok(b));
    }

    /// Sizes that are whole units round-trip through their shortest spelling.
    #[test]
    fn whole_units_round_trip(n in 1u64..1024, p in 0u32..6) {
        let b = n << (10 * p);
        prop_assert_eq!(parse_size(&format_size(b)), Ok(b));
    }

    /// A bare letter is binary and the letter with B decimal, at every scale.
    #[test]
    fn bare_binary_b_decimal(n in 0u64..10_000, (i, letter) in prop::sample::select(vec![
        (1u32, "K"), (2, "M"), (3, "G"), (4, "T"), (5, "P"),
    ])) {
        prop_assert_eq!(parse_size(&format!("{n}{letter}")), Ok(n << (10 * i)));
        prop_assert_eq!(parse_size(&format!("{n}{letter}iB")), Ok(n << (10 * i)));
        prop_assert_eq!(parse_size(&format!("{n}{letter}B")), Ok(n * 1000u64.pow(i)));
        prop_assert_eq!(parse_size(&format!("{n}{}b", letter.to_lowercase())), Ok(n * 1000u64.pow(i)));
        prop_assert_eq!(parse_rate(&format!("{n}{letter}/s")), Ok(n << (10 * i)));
    }

    /// Plain numbers are bytes.
    #[test]
    fn plain_numbers_are_bytes(b in any::<u64>()) {
        prop_assert_eq!(parse_size(&b.to_string()), Ok(b));
    }

    /// Anything past 2^64-1 bytes is refused, saying why; never wrapped.
    #[test]
    fn overflow_is_refused(n in 16u64..100_000, extra in 1u64..1000) {
        let e = parse_size(&format!("{n}E")).unwrap_err();
        prop_assert!(e.0.contains("too large"), "{}", e);
        let big = (u64::MAX as u128) + extra as u128;
        let e = parse_size(&big.to_string()).unwrap_err();
        prop_assert!(e.0.contains("too large"), "{}", e);
    }

    /// The display form reads back within its one decimal's rounding.
    #[test]
    fn human_reads_back_close(b in 1u64..u64::MAX / 2) {
        let back = parse_size(&human(b)).unwrap() as f64;
        let rel = (back - b as f64).abs() / b as f64;
        prop_assert!(rel <= 0.05, "{} -> {} -> {}", b, human(b), back);
    }
}
