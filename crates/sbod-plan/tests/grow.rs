//! `sbod plan --grow`: figures computed by hand (raid6 8 -> 10 of 1 TB at 200 MB/s, raid60
//! 2x6 -> 2x7, whole new groups, ec, raid10, raid1 2 -> 3 copies, concat), and the grows
//! `sbod grow` refuses, refused the same way; through the clap parser as the binary wires it.

use clap::Parser;
use sbod_plan::cli::{self, PlanArgs};
use sbod_plan::{Grow, GrowKind, SpeedSource};
use serde_json::Value;

const TB: u64 = 1_000_000_000_000;

#[derive(Parser)]
struct Sbod {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Subcommand)]
enum Command {
    Plan(PlanArgs),
}

fn args(line: &str) -> Result<PlanArgs, clap::Error> {
    let argv = std::iter::once("sbod").chain(line.split_whitespace());
    Sbod::try_parse_from(argv).map(|s| match s.command {
        Command::Plan(a) => a,
    })
}

fn grow(line: &str) -> Grow {
    cli::grow_plan(&args(line).unwrap()).unwrap()
}

fn render(line: &str) -> String {
    cli::render(&args(line).unwrap()).unwrap()
}

/// The whole error chain, as `sbod` prints it.
fn refused(line: &str) -> String {
    let e = cli::render(&args(line).unwrap()).unwrap_err();
    format!("{e:#}")
}

#[test]
fn raid6_8_to_10_of_1tb_at_200mbs() {
    let line = "plan --level raid6 --disks 8 --disk-size 1TB --grow 2 --disk-mbps 200";
    let g = grow(line);
    assert_eq!(g.kind, GrowKind::Reshape);
    assert_eq!(g.before.layout.spec, "raid6:1x8");
    assert_eq!(g.after.layout.spec, "raid6:1x10");
    assert_eq!(g.added_disks, 2);
    // 6 data disks before, 8 after.
    assert_eq!(g.before.capacity.usable.bytes, 6 * TB);
    assert_eq!(g.after.capacity.usable.bytes, 8 * TB);
    // The whole old volume moves: 6 TB read over 8 members, 0.75 TB each (parity rotates
    // and is not read); every member writes its whole 1 TB (new stripes and zeros).
    assert_eq!(g.data_bytes, 6 * TB);
    assert_eq!(g.old_member_read_bytes, 750_000_000_000);
    assert_eq!(g.old_member_write_bytes, TB);
    assert_eq!(g.new_member_write_bytes, TB);
    assert_eq!(g.busiest_member_bytes, 1_750_000_000_000);
    // 1.75 TB at 200 MB/s = 8,750 s.
    assert_eq!(g.disk_mb_s, 200.0);
    assert_eq!(g.disk_mb_s_source, SpeedSource::Given);
    assert!((g.seconds - 8750.0).abs() < 1e-9, "{}", g.seconds);
    // Reliability and performance of both layouts are the planner's own.
    assert_eq!(g.before.layout.set_tolerates, 2);
    assert_eq!(g.after.layout.set_width, 10);
    assert_eq!(g.before.performance.seq_read.value, Some(1200.0));
    assert_eq!(g.after.performance.seq_read.value, Some(1600.0));
    assert!(g.after.reliability.p_loss > g.before.reliability.p_loss);

    let out = render(line);
    for want in [
        "sbod plan --grow: 8 x 1 TB disks (0.91 TiB each) as raid6:1x8, 2 more disks: raid6:1x10",
        "a reshape: the group gets 2 more disks",
        "usable TB                     6.00        8.00",
        "usable TiB                    5.46        7.28",
        "Data to move      6.00 TB (5.46 TiB): the whole old volume, counted as full",
        "each old member reads 0.75 TB",
        "writes 1.00 TB",
        "each new disk   writes 1.00 TB",
        "Time              8,750 s (2 h 26 min) at 200 MB/s per disk",
        "1.75 TB in all",
        "a lower bound",
    ] {
        assert!(out.contains(want), "{want:?} missing from:\n{out}");
    }

    let v: Value = serde_json::from_str(&render(&format!("{line} --json"))).unwrap();
    assert_eq!(v["kind"], "reshape");
    assert_eq!(v["before"]["layout"]["spec"], "raid6:1x8");
    assert_eq!(v["after"]["layout"]["spec"], "raid6:1x10");
    assert_eq!(v["before"]["capacity"]["usable"]["tb"], 6.0);
    assert_eq!(v["after"]["capacity"]["usable"]["tb"], 8.0);
    assert_eq!(v["data_bytes"], 6 * TB);
    assert_eq!(v["old_member_read_bytes"], 750_000_000_000u64);
    assert_eq!(v["busiest_member_bytes"], 1_750_000_000_000u64);
    assert_eq!(v["seconds"], 8750.0);
    assert_eq!(v["disk_mb_s_source"], "given");
}

#[test]
fn without_a_disk_speed_200_mbs_is_assumed_and_said() {
    let g = grow("plan --level raid6 --disks 8 --disk-size 1TB --grow 2");
    assert_eq!(g.disk_mb_s_source, SpeedSource::Assumed);
    assert!((g.seconds - 8750.0).abs() < 1e-9);
    let out = render("plan --level raid6 --disks 8 --disk-size 1TB --grow 2");
    assert!(
        out.contains("an assumed 200 MB/s per disk (give --disk-mbps)"),
        "{out}"
    );
    // A faster disk takes proportionally less time.
    let g = grow("plan --level raid6 --disks 8 --disk-size 1TB --grow 2 --disk-mbps 250MB/s");
    assert!((g.seconds - 7000.0).abs() < 1e-9);
}

#[test]
fn raid60_2x6_to_2x7() {
    let g = grow("plan --level raid6 --groups 2 --disks 12 --disk-size 1TB --grow 2");
    assert_eq!(g.before.layout.spec, "raid6:2x6");
    assert_eq!(g.after.layout.spec, "raid6:2x7");
    // 2 x 4 data disks before, 2 x 5 after.
    assert_eq!(g.before.capacity.usable.bytes, 8 * TB);
    assert_eq!(g.after.capacity.usable.bytes, 10 * TB);
    assert_eq!(g.data_bytes, 8 * TB);
    // 8 TB over 12 members: 0.667 TB each, plus 1 TB written: 1.667 TB at 200 MB/s.
    assert_eq!(g.old_member_read_bytes, 666_666_666_666);
    assert_eq!(g.busiest_member_bytes, 1_666_666_666_666);
    assert!((g.seconds - 8333.333).abs() < 0.01, "{}", g.seconds);
    let out = render("plan --level raid6 --groups 2 --disks 12 --disk-size 1TB --grow 2");
    assert!(
        out.contains("each of the 2 groups gets 1 more disk"),
        "{out}"
    );
    assert!(out.contains("8,333 s (2 h 19 min)"), "{out}");
}

#[test]
fn whole_new_groups() {
    let g = grow("plan --level raid6 --groups 2 --disks 12 --disk-size 1TB --grow 6 --new-groups");
    assert!(g.new_groups);
    assert_eq!(g.after.layout.spec, "raid6:3x6");
    assert_eq!(g.after.capacity.usable.bytes, 12 * TB);
    // The new groups' stripes interleave with the old ones: the whole volume still moves.
    assert_eq!(g.data_bytes, 8 * TB);
    assert_eq!(g.busiest_member_bytes, 1_666_666_666_666);
    assert!((g.seconds - 8333.333).abs() < 0.01);
    let out =
        render("plan --level raid6 --groups 2 --disks 12 --disk-size 1TB --grow 6 --new-groups");
    assert!(out.contains("1 whole group of 6 added"), "{out}");

    // ec: wider groups grow K, keep M; whole groups keep both.
    let g = grow("plan --level ec:4+2 --disks 12 --disk-size 1TB --grow 2");
    assert_eq!(g.before.layout.spec, "ec:4+2:2x6");
    assert_eq!(g.after.layout.spec, "ec:5+2:2x7");
    assert_eq!(g.after.capacity.usable.bytes, 10 * TB);
    let g = grow("plan --level ec:4+2 --disks 12 --disk-size 1TB --grow 12 --new-groups");
    assert_eq!(g.after.layout.spec, "ec:4+2:4x6");
    assert_eq!(g.after.capacity.usable.bytes, 16 * TB);
}

#[test]
fn raid10_gets_more_mirror_sets() {
    let g = grow("plan --level raid10 --disks 4 --disk-size 1TB --grow 2");
    assert_eq!(g.kind, GrowKind::Reshape);
    assert_eq!(g.after.layout.spec, "raid10:1x6:c2");
    assert_eq!(g.before.capacity.usable.bytes, 2 * TB);
    assert_eq!(g.after.capacity.usable.bytes, 3 * TB);
    // 2 TB read over 4 members (reads spread over the copies), 1 TB written each.
    assert_eq!(g.old_member_read_bytes, TB / 2);
    assert!((g.seconds - 7500.0).abs() < 1e-9);
}

#[test]
fn raid1_2_to_3_copies_is_one_rebuild() {
    let line = "plan --level raid1 --disks 2 --disk-size 1TB --grow 1 --disk-mbps 200";
    let g = grow(line);
    assert_eq!(g.kind, GrowKind::Copies);
    assert_eq!(g.before.layout.spec, "raid1:1x2");
    assert_eq!(g.after.layout.spec, "raid1:1x3");
    // Same capacity, one failure more survived.
    assert_eq!(g.before.capacity.usable.bytes, TB);
    assert_eq!(g.after.capacity.usable.bytes, TB);
    assert_eq!(g.before.layout.set_tolerates, 1);
    assert_eq!(g.after.layout.set_tolerates, 2);
    // The new copy is written whole: 1 TB at 200 MB/s = 5,000 s.
    assert_eq!(g.data_bytes, TB);
    assert_eq!(g.new_member_write_bytes, TB);
    assert!((g.seconds - 5000.0).abs() < 1e-9);
    let out = render(line);
    assert!(out.contains("every mirror gets 1 more copy"), "{out}");
    assert!(out.contains("5,000 s (1 h 23 min)"), "{out}");
    // 2-way mirrors x 3 grown by 3: each mirror one more copy, rebuilt at once.
    let g = grow("plan --level raid1 --groups 3 --disks 6 --disk-size 1TB --grow 3");
    assert_eq!(g.after.layout.spec, "raid1:3x3");
    assert_eq!(g.data_bytes, 3 * TB);
    assert!((g.seconds - 5000.0).abs() < 1e-9);
}

#[test]
fn concat_appends_and_moves_nothing() {
    let line = "plan --level concat --disks 3 --disk-size 1TB --grow 2";
    let g = grow(line);
    assert_eq!(g.kind, GrowKind::Append);
    assert_eq!(g.before.capacity.usable.bytes, 3 * TB);
    assert_eq!(g.after.capacity.usable.bytes, 5 * TB);
    assert_eq!(g.data_bytes, 0);
    assert_eq!(g.busiest_member_bytes, 0);
    assert_eq!(g.seconds, 0.0);
    let out = render(line);
    assert!(out.contains("Time              0 s"), "{out}");
}

#[test]
fn spares_stay_spares() {
    let g = grow("plan --level raid6 --disks 9 --spares 1 --disk-size 1TB --grow 2");
    assert_eq!(g.before.layout.spec, "raid6:1x8:s1");
    assert_eq!(g.after.layout.spec, "raid6:1x10:s1");
    assert_eq!(g.old_member_read_bytes, 750_000_000_000);
}

#[test]
fn refused_as_sbod_grow_refuses() {
    let base = "plan --level raid6 --groups 2 --disks 12 --disk-size 1TB";
    let e = refused(&format!("{base} --grow 3"));
    assert!(
        e.contains("growing raid6:2x6 by 3 disks: 3 disk(s) cannot widen 2 groups alike: give a multiple of 2, or add whole groups (--new-groups, 6 disks each)"),
        "{e}"
    );
    let e = refused(&format!("{base} --grow 4 --new-groups"));
    assert!(
        e.contains("4 disk(s) do not make whole groups of 6: give a multiple of 6 with --new-groups, or leave --new-groups out to widen every group by 2"),
        "{e}"
    );
    let e = refused(&format!("{base} --grow 0"));
    assert!(e.contains("--grow 0 adds nothing"), "{e}");

    // ec: at most 256 disks per group.
    let e = refused("plan --level ec:250+3 --disks 253 --disk-size 1TB --grow 4");
    assert!(
        e.contains("ec:250+3 would become ec:254+3, 257 disks per group; the Reed-Solomon code allows at most 256: add whole groups instead (--new-groups, 253 disks each)"),
        "{e}"
    );
    assert!(cli::grow_plan(
        &args("plan --level ec:250+3 --disks 253 --disk-size 1TB --grow 3").unwrap()
    )
    .is_ok());
    let e = refused("plan --level raid6 --disks 256 --disk-size 1TB --grow 1");
    assert!(
        e.contains("257 disks per group would be more than the 256"),
        "{e}"
    );

    // Mirrors get copies, not groups; concat appends.
    let e = refused("plan --level raid1 --disks 2 --disk-size 1TB --grow 2 --new-groups");
    assert!(e.contains("raid1 grows by more copies"), "{e}");
    assert!(e.contains("drop --new-groups"), "{e}");
    let e = refused("plan --level concat --disks 2 --disk-size 1TB --grow 2 --new-groups");
    assert!(e.contains("concat has no groups"), "{e}");
    let e = refused("plan --level raid1 --groups 3 --disks 6 --disk-size 1TB --grow 2");
    assert!(
        e.contains("cannot add copies to 3 mirrors alike: give a multiple of 3"),
        "{e}"
    );
    let e = refused("plan --level raid10 --disks 4 --disk-size 1TB --grow 3");
    assert!(
        e.contains("do not make whole 2-way mirror sets: give a multiple of 2"),
        "{e}"
    );

    // Flags that do not go together are refused by the parser.
    assert!(args("plan --level raid6 --disks 8 --disk-size 1TB --new-groups").is_err());
    assert!(args("plan --disks 8 --disk-size 1TB --compare --grow 2").is_err());
}

/// `--grow-level`: raid5 of 6 x 1 TB -> raid6 of 7 at 200 MB/s, and raid50 -> raid60: the
/// capacity stays, the new disks are written whole (5000 s at 200 MB/s), each group
/// survives one failure more and loses data less often; changes sbod does not make are
/// refused as `sbod grow --level` refuses them.
#[test]
fn a_level_change_writes_the_new_parity_disks_only() {
    let g = grow(
        "plan --level raid5 --disks 6 --disk-size 1TB --grow 1 --grow-level raid6 --disk-mbps 200",
    );
    assert_eq!(g.kind, GrowKind::Parity);
    assert_eq!(g.after.layout.spec, "raid6:1x7");
    assert_eq!(g.before.capacity.usable.bytes, 5 * TB);
    assert_eq!(g.after.capacity.usable.bytes, 5 * TB);
    assert_eq!(g.data_bytes, TB);
    assert_eq!(g.new_member_write_bytes, TB);
    assert_eq!(g.old_member_write_bytes, 0);
    assert_eq!(g.old_member_read_bytes, 5 * TB / 6);
    assert!((g.seconds - 5000.0).abs() < 1.0, "{}", g.seconds);
    assert!(g.after.reliability.p_loss < g.before.reliability.p_loss);
    let out = render(
        "plan --level raid5 --groups 2 --disks 10 --disk-size 1TB --grow 2 --grow-level raid6",
    );
    assert!(out.contains("a level change, raid5 -> raid6"), "{out}");
    assert!(out.contains("raid6:2x6"), "{out}");

    let e = refused(
        "plan --level raid5 --groups 2 --disks 10 --disk-size 1TB --grow 1 --grow-level raid6",
    );
    assert!(e.contains("one disk per group: --grow 2, not 1"), "{e}");
    let e = refused("plan --level raid6 --disks 8 --disk-size 1TB --grow 1 --grow-level ec:6+3");
    assert!(
        e.contains("raid6 array does not change level online"),
        "{e}"
    );
    let e = refused("plan --level raid5 --disks 6 --disk-size 1TB --grow 1 --grow-level raid10");
    assert!(e.contains("only to raid6"), "{e}");
    let g = grow("plan --level ec:4+2 --disks 6 --disk-size 1TB --grow 1 --grow-level ec:4+3");
    assert_eq!(g.after.layout.spec, "ec:4+3:1x7");
}

#[test]
fn raid6_10_to_9_of_1tb_at_200mbs_and_bad_shrinks() {
    let line = "plan --level raid6 --disks 10 --disk-size 1TB --shrink 1 --disk-mbps 200";
    let g = grow(line);
    assert_eq!(g.kind, GrowKind::Narrow);
    assert_eq!(g.before.layout.spec, "raid6:1x10");
    assert_eq!(g.after.layout.spec, "raid6:1x9");
    assert_eq!(g.after.capacity.usable.bytes, 7 * TB);
    // What the 9 hold (7 TB) is read over the 10 old members, 0.7 TB each, and every member
    // that stays writes its whole 1 TB: 1.7 TB at 200 MB/s = 8,500 s.
    assert_eq!(g.data_bytes, 7 * TB);
    assert_eq!(g.old_member_read_bytes, 700_000_000_000);
    assert_eq!(g.busiest_member_bytes, 1_700_000_000_000);
    assert!((g.seconds - 8500.0).abs() < 1e-9, "{}", g.seconds);
    let out = render(line);
    for want in [
        "sbod plan --shrink: 10 x 1 TB disks (0.91 TiB each) as raid6:1x10, 1 fewer disk: raid6:1x9",
        "a reshape onto fewer disks: the group has 1 disk fewer",
        "Data to move      7.00 TB",
        "Time              8,500 s",
    ] {
        assert!(out.contains(want), "{want:?} missing from:\n{out}");
    }
    let v: Value = serde_json::from_str(&render(&format!("{line} --json"))).unwrap();
    assert_eq!(v["kind"], "narrow");
    // ec keeps M, K shrinks; groups shrink alike; the engine's refusals.
    assert_eq!(
        grow("plan --level ec:8+3 --disks 22 --groups 2 --disk-size 1TB --shrink 2")
            .after
            .layout
            .spec,
        "ec:7+3:2x10"
    );
    let e = refused("plan --level raid6 --disks 12 --groups 2 --disk-size 1TB --shrink 1");
    assert!(e.contains("multiple of 2"), "{e}");
    let e = refused("plan --level raid5 --disks 3 --disk-size 1TB --shrink 1");
    assert!(e.contains("at least 3 disks per group"), "{e}");
    let e = refused("plan --level raid1 --disks 3 --disk-size 1TB --shrink 1");
    assert!(e.contains("grow --drop"), "{e}");
}

#[test]
fn a_new_chunk_for_raid6_of_10_of_1tb_at_200mbs() {
    let line = "plan --level raid6 --disks 10 --disk-size 1TB --rechunk --disk-mbps 200";
    let g = grow(line);
    assert_eq!(g.kind, GrowKind::Rechunk);
    assert_eq!(g.before.layout.spec, g.after.layout.spec);
    assert_eq!(g.after.capacity.usable.bytes, 8 * TB);
    // The 8 TB volume is read over the 10 members (0.8 TB each); each writes its 1 TB again
    // and 3 copies of the windows over 10 members (2.4 TB): 4.2 TB at 200 MB/s = 21,000 s.
    assert_eq!(g.data_bytes, 8 * TB);
    assert_eq!(g.old_member_read_bytes, 800_000_000_000);
    assert_eq!(g.old_member_write_bytes, 3_400_000_000_000);
    assert_eq!(g.busiest_member_bytes, 4_200_000_000_000);
    assert!((g.seconds - 21000.0).abs() < 1e-6, "{}", g.seconds);
    let out = render(line);
    for want in [
        "sbod plan --rechunk: 10 x 1 TB disks (0.91 TiB each) as raid6:1x10, a new chunk",
        "each window first written aside on 3",
        "Data to move      8.00 TB",
        "Time              21,000 s",
    ] {
        assert!(out.contains(want), "{want:?} missing from:\n{out}");
    }
    let v: Value = serde_json::from_str(&render(&format!("{line} --json"))).unwrap();
    assert_eq!(v["kind"], "rechunk");
    let e = refused("plan --level raid1 --disks 3 --disk-size 1TB --rechunk");
    assert!(e.contains("no stripes"), "{e}");
}
