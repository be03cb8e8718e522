//! The tuning knobs (`sbod_core::tuning`, docs/ENGINE.md "Tuning knobs").

use sbod_core::tuning::{self, knobs};

/// The defaults in the table are the engine's where a default is also written elsewhere,
/// and every knob is listed once, in the table's order.
#[test]
fn defaults_match_the_engine() {
    assert_eq!(
        tuning::TAG_CACHE_DEFAULT,
        sbod_core::integrity::DEFAULT_CACHE_BYTES
    );
    assert_eq!(
        sbod_types::parse_size("16M").unwrap(),
        tuning::TAG_CACHE_DEFAULT,
        "the table's default"
    );
    let names: Vec<&str> = knobs().iter().map(|k| k.name).collect();
    assert_eq!(
        names,
        [
            tuning::COALESCE_WAIT,
            tuning::PLUG,
            tuning::URING_MERGE,
            tuning::IO_BACKEND,
            tuning::TAG_CACHE
        ]
    );
}

/// docs/ENGINE.md's table names every knob with its default.
#[test]
fn the_table_in_engine_md_lists_every_knob() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/ENGINE.md"))
        .unwrap();
    for k in knobs() {
        let row = doc
            .lines()
            .find(|l| l.starts_with(&format!("| `{}`", k.name)))
            .unwrap_or_else(|| panic!("docs/ENGINE.md has no row for {}", k.name));
        assert!(
            row.contains(k.default),
            "{}: default {} not in {row}",
            k.name,
            k.default
        );
    }
}
