//! `sbod plan --ceph` and `--compare ... --ceph` through the clap parser: the figures a
//! user reads, the JSON, and the refusals.

use clap::Parser;
use sbod_plan::cli::{self, PlanArgs};
use serde_json::Value;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    plan: PlanArgs,
}

fn render(args: &str) -> anyhow::Result<String> {
    let cli = Cli::try_parse_from(std::iter::once("plan").chain(args.split_whitespace()))
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    cli::render(&cli.plan)
}

#[test]
fn a_replicated_pool_over_five_hosts() {
    let t = render(
        "--disks 60 --disk-size 20TB --ceph rep:3 --hosts 5 --disk-mbps 250 --disk-iops 200",
    )
    .unwrap();
    for want in [
        "rep:3 (min_size 2)",
        "60 OSDs",
        "failure domain host",
        "2048 (100 per OSD",
        "400.00 TB (33% of raw)",
        "340.00 TB",
        "288.00 TB (one host lost",
        "2 of 3 shards lost",
        "12,000 IOPS",
        "2,000 IOPS",
    ] {
        assert!(t.contains(want), "no '{want}' in:\n{t}");
    }
    let v: Value = serde_json::from_str(
        &render("--disks 60 --disk-size 20TB --ceph ec:4+2 --hosts 6 --disk-mbps 250 --json")
            .unwrap(),
    )
    .unwrap();
    assert_eq!(v["pool"]["kind"], "erasure");
    assert_eq!(v["pool"]["min_size"], 5);
    assert_eq!(v["osds"], 60);
    assert!(v["p_loss"].as_f64().unwrap() > 0.0);
    assert!(v["recovery"]["window_hours"].as_f64().unwrap() > 10.0 / 60.0);
}

#[test]
fn compare_puts_the_pool_beside_sbod_layouts() {
    let t = render(
        "--disks 60 --disk-size 20TB --compare raid6:6x10 raid1:20x3 --ceph ec:4+2 --hosts 6 --disk-mbps 250 --disk-iops 200",
    )
    .unwrap();
    assert!(t.contains("Beside Ceph"), "{t}");
    let layout = t
        .lines()
        .find(|l| l.starts_with("layout") && l.contains("ceph"))
        .unwrap();
    assert!(
        layout.contains("raid6:6x10") && layout.contains("ceph ec:4+2"),
        "{layout}"
    );
    let usable = t
        .lines()
        .rev()
        .find(|l| l.starts_with("usable TB"))
        .unwrap();
    assert!(usable.trim_end().ends_with("800.00"), "{usable}");
    let v: Value = serde_json::from_str(
        &render("--disks 12 --disk-size 4TB --compare raid6:1x12 --ceph rep:3 --json").unwrap(),
    )
    .unwrap();
    assert_eq!(v["plans"].as_array().unwrap().len(), 1);
    assert_eq!(v["ceph"]["pool"]["size"], 3);
}

#[test]
fn dual_actuator_drives_by_osd_are_flagged() {
    let t =
        render("--disks 12 --disk-size 14TB --actuators 2 --ceph rep:3 --disk-mbps 260").unwrap();
    assert!(
        t.contains("24 OSDs") && t.contains("failure domain osd"),
        "{t}"
    );
    assert!(t.contains("two shards on one drive"), "{t}");
    let h =
        render("--disks 12 --disk-size 14TB --actuators 2 --ceph rep:3 --hosts 3 --disk-mbps 260")
            .unwrap();
    assert!(!h.contains("two shards on one drive"), "{h}");
}

#[test]
fn refusals_say_what_to_change() {
    let e = render("--disks 6 --disk-size 1TB --ceph ec:4+2 --hosts 3")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("6 shards in distinct hosts") && e.contains("has 3"),
        "{e}"
    );
    let e = render("--disks 7 --disk-size 1TB --ceph rep:3 --hosts 2")
        .unwrap_err()
        .to_string();
    assert!(e.contains("divisible"), "{e}");
    let e = render("--disks 6 --disk-size 1TB --ceph rep:3 --nearfull 96%")
        .unwrap_err()
        .to_string();
    assert!(e.contains("full ratios"), "{e}");
    assert!(render("--disks 6 --disk-size 1TB --ceph rep:0").is_err());
    assert!(render("--disks 6 --disk-size 1TB --ceph rep:3 --level raid6").is_err());
}
