//! The crash harness, bounded: a few SIGKILLs of `sbod serve` under real libnbd clients
//! (well under a minute). `scripts/torture.sh --long` runs the long version.

#[test]
fn sigkill_under_nbd_clients_loses_nothing_acknowledged() {
    let sbod = sbod_torture::sbod_binary().expect("the sbod binary");
    let mut o = sbod_torture::Options::bounded(sbod);
    if let Some(n) = std::env::var("SBOD_TORTURE_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        o.crashes = n;
    }
    let s = sbod_torture::run(&o).unwrap_or_else(|e| panic!("{e:#}"));
    println!("{}", s.table());
    assert_eq!(s.lost_blocks, 0);
    assert_eq!(s.scrub_mismatches, 0);
    assert_eq!(s.crashes, o.crashes);
    assert!(s.writes_acked > 0 && s.flushes_acked > 0, "{s:?}");
    assert!(s.durable_blocks_verified > 0, "{s:?}");
    assert!(s.restarts_verified >= 2, "{s:?}");
}
