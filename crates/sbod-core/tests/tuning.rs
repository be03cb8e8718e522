//! The tuning knobs (`sbod_core::tuning`, docs/ENGINE.md "Tuning knobs").

use sbod_core::tuning::{self, knobs};

/// The table's defaults are the engine's,
/// and every knob is listed once, in the table's order.
#[test]
fn defaults_match_the_engine() {
    assert_eq!(
        sbod_types::parse_size("16M").unwrap(),
        tuning::TAG_CACHE_DEFAULT,
        "the table's default"
    );
    assert_eq!(
        sbod_types::parse_size("16M").unwrap(),
        tuning::BITMAP_AHEAD_DEFAULT
    );
    let names: Vec<&str> = knobs().iter().map(|k| k.name).collect();
    assert_eq!(
        names,
        [
            tuning::COALESCE_WAIT,
            tuning::PLUG,
            tuning::URING_MERGE,
            tuning::IO_BACKEND,
            tuning::TAG_CACHE,
            tuning::BITMAP_AHEAD,
            tuning::DECL_WINDOWS,
            tuning::DECL_ROOM,
            tuning::DECL_RUNS
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

/// `status` shows every knob with the value in force and its default (the "tuning" object
/// of `sbod status --json`).
#[test]
fn status_shows_the_knobs_in_force() {
    use sbod_core::dev::{BlockDev, MemDev};
    use sbod_core::{Array, CreateSpec, MemberSpec};
    use std::sync::Arc;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let devs: Vec<Arc<MemDev>> = (0..2)
            .map(|i| Arc::new(MemDev::new(format!("m{i}"), 4 << 20)))
            .collect();
        let spec = CreateSpec {
            name: "knobs".into(),
            level: sbod_types::Level::Raid1,
            chunk: 65536,
            groups: 1,
            spares: 0,
            declustered: false,
            copies: 2,
            bitmap_region: None,
            assume_clean: true,
            integrity: sbod_core::integrity::Kind::Crc32c,
            force: false,
        };
        let members = devs
            .iter()
            .map(|d| MemberSpec {
                dev: d.clone() as Arc<dyn BlockDev>,
                path: d.name().to_string(),
                is_file: false,
                domain: String::new(),
            })
            .collect();
        let a = Array::create(spec, members).await.expect("create");
        let st = a.status();
        let ks = knobs();
        assert_eq!(st.tuning.len(), ks.len(), "{:?}", st.tuning);
        for k in ks {
            let v = &st.tuning[k.name];
            assert_eq!(
                (v.value.as_str(), v.default.as_str()),
                (k.value.as_str(), k.default)
            );
        }
        let j = serde_json::to_value(&st).unwrap();
        assert_eq!(j["tuning"][tuning::TAG_CACHE]["default"], "16M");
        a.close().await.unwrap();
    });
}
