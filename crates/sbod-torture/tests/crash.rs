//! The crash harness, bounded: a few SIGKILLs of `sbod serve` under real libnbd clients
//! (well under a minute). `scripts/torture.sh --long` runs the long version.

/// Run `o` (its crashes from `$SBOD_TORTURE_ITERS` if set) and check that nothing
/// acknowledged was lost.
fn run_and_check(mut o: sbod_torture::Options) -> sbod_torture::Summary {
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
    s
}

#[test]
fn sigkill_under_nbd_clients_loses_nothing_acknowledged() {
    let sbod = sbod_torture::sbod_binary().expect("the sbod binary");
    run_and_check(sbod_torture::Options::bounded(sbod));
}

/// The same with a log device given at create: every write journaled, the log found again
/// and replayed at each restart after a SIGKILL (raid5 of 4: a small stripe, so the log
/// fills and checkpoints under the clients).
#[test]
fn sigkill_with_a_log_loses_nothing_acknowledged() {
    let sbod = sbod_torture::sbod_binary().expect("the sbod binary");
    let mut o = sbod_torture::Options::bounded(sbod);
    o.level = "raid5".into();
    o.members = 4;
    o.crashes = 3;
    o.log_mib = 8;
    let s = run_and_check(o);
    assert!(s.layout.ends_with("+ log"), "{s:?}");
}

/// A declustered raid6 (a 3+2 group's stripes and two members' worth of spare space over
/// 7 members): every stripe on its own members, the same guarantee after SIGKILLs.
#[test]
fn sigkill_declustered_loses_nothing_acknowledged() {
    let sbod = sbod_torture::sbod_binary().expect("the sbod binary");
    let mut o = sbod_torture::Options::bounded(sbod);
    o.members = 7;
    o.crashes = 3;
    o.declustered = Some(2);
    let s = run_and_check(o);
    assert!(s.layout.contains("declustered"), "{s:?}");
}
