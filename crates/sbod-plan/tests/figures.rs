//! Hand-checked figures (the field's 60 x 20 TB calculator case among them), error
//! messages, and `sbod plan` end to end through the clap parser.

use clap::Parser;
use sbod_plan::cli::{self, PlanArgs};
use sbod_plan::{Assumptions, Disk, Layout, Plan, TibConvention};
use serde_json::Value;

const TB20: u64 = 20_000_000_000_000;

fn close(a: f64, b: f64, rel: f64) -> bool {
    (a - b).abs() <= rel * a.abs().max(b.abs())
}

fn plan(spec: &str, disks: u32, disk: &Disk, a: &Assumptions) -> Plan {
    let layout = Layout::resolve(&spec.parse().unwrap(), disks).unwrap();
    Plan::new(&layout, disk, a).unwrap()
}

fn field_disk() -> Disk {
    Disk {
        size_bytes: TB20,
        mttf_hours: 2.5e6,
        seq_mb_s: Some(250.0),
        random_iops: Some(200.0),
    }
}

#[test]
fn the_field_calculator_60_x_20tb_raid6_6x10() {
    let p = plan("raid6:6x10", 60, &field_disk(), &Assumptions::default());
    let c = &p.capacity;
    assert_eq!(c.raw.bytes, 1_200_000_000_000_000);
    assert_eq!(format!("{:.2}", c.raw.tb), "1200.00");
    assert_eq!(format!("{:.2}", c.usable.tb), "960.00");
    assert_eq!(format!("{:.2}", c.at_fill_limit.tb), "864.00");
    assert_eq!(c.usable.disks, 48.0);
    assert_eq!(c.redundancy.disks, 12.0);
    assert_eq!(format!("{:.0}", c.efficiency * 100.0), "80");
    // Exact TiB: 1.2e15 / 2^40.
    assert_eq!(format!("{:.2}", c.raw.tib), "1091.39");
    assert_eq!(format!("{:.2}", c.usable.tib), "873.11");
    // The calculator's TiB figures count each disk as its label's 18.2 TiB.
    let label = Assumptions {
        tib: TibConvention::Label,
        ..Assumptions::default()
    };
    let c = plan("raid6:6x10", 60, &field_disk(), &label).capacity;
    assert_eq!(format!("{:.2}", c.raw.tib), "1092.00");
    assert_eq!(format!("{:.2}", c.usable.tib), "873.60");
    assert_eq!(format!("{:.2}", c.usable.tb), "960.00");
    assert_eq!(format!("{:.2}", c.at_fill_limit.tb), "864.00");

    // Reliability arithmetic: AFR 0.35%, 0.21 failures a year, 1.05 over five years.
    let r = &p.reliability;
    assert_eq!(format!("{:.2}", r.afr * 100.0), "0.35");
    assert_eq!(format!("{:.2}", r.expected_failures_per_year), "0.21");
    assert_eq!(format!("{:.2}", r.expected_failures), "1.05");
    assert!(close(
        r.expected_failures,
        60.0 * 5.0 * 8760.0 / 2.5e6,
        1e-12
    ));

    // Rebuild window: 20 TB at 50% of 250 MB/s is 44.4 h, plus 24 h to replace.
    let w = 24.0 + 20e12 / 125e6 / 3600.0;
    assert!(close(r.rebuild.window_hours, w, 1e-12));
    // Data loss: 6 groups, each needing a third failure inside two overlapping windows;
    // first order: 6 * n(n-1)(n-2) lambda^3 W^2 / 2 per hour.
    let lambda: f64 = 1.0 / 2.5e6;
    let rate = 6.0 * 720.0 * lambda.powi(3) * w * w / 2.0;
    assert!(close(r.p_loss, rate * 5.0 * 8760.0, 2e-3), "{}", r.p_loss);
    assert!(close(r.mttdl_hours, 1.0 / rate, 2e-3));

    // Performance: 48 data disks stream, all 60 seek, small writes cost 6 I/Os.
    let perf = &p.performance;
    assert_eq!(perf.kind, "estimate");
    assert_eq!(perf.seq_read.value, Some(12_000.0));
    assert_eq!(perf.seq_write.value, Some(12_000.0));
    assert_eq!(perf.rand_read.value, Some(12_000.0));
    assert_eq!(perf.rand_write.value, Some(2_000.0));
    assert_eq!(perf.write_penalty, 6.0);
}

#[test]
fn the_fields_alternatives() {
    let d = field_disk();
    let a = Assumptions::default();
    let m3 = plan("raid1:20x3", 60, &d, &a);
    assert_eq!(format!("{:.2}", m3.capacity.usable.tb), "400.00");
    assert_eq!(m3.performance.seq_read.value, Some(15_000.0));
    assert_eq!(m3.performance.seq_write.value, Some(5_000.0));
    assert_eq!(m3.performance.rand_write.value, Some(4_000.0));
    let m2 = plan("raid1:30x2", 60, &d, &a);
    assert_eq!(format!("{:.2}", m2.capacity.usable.tb), "600.00");
    assert_eq!(m2.performance.seq_write.value, Some(7_500.0));
    // A 2-way mirror loses data when the partner dies inside the window:
    // 30 sets * 2 lambda^2 W per hour, to first order.
    let lambda: f64 = 1.0 / 2.5e6;
    let w = m2.reliability.rebuild.window_hours;
    let rate = 30.0 * 2.0 * lambda * lambda * w;
    assert!(close(
        m2.reliability.p_loss,
        1.0 - (-rate * 43_800.0).exp(),
        1e-3
    ));
    // Ordering the field expects: 3-way mirror and raid6 far safer than 2-way mirror.
    let r6 = plan("raid6:6x10", 60, &d, &a);
    assert!(m3.reliability.p_loss < r6.reliability.p_loss);
    assert!(r6.reliability.p_loss < m2.reliability.p_loss / 100.0);

    let ec = plan("ec:8+3:5x11:s5", 60, &d, &a);
    assert_eq!(format!("{:.2}", ec.capacity.usable.tb), "800.00");
    assert_eq!(format!("{:.2}", ec.capacity.spares.tb), "100.00");
    assert_eq!(ec.reliability.rebuild.replacement_hours, 0.0);
    assert_eq!(ec.performance.write_penalty, 8.0);
    assert_eq!(ec.performance.rand_write.value, Some(55.0 * 200.0 / 8.0));
    assert_eq!(ec.performance.seq_write.value, Some(40.0 * 250.0));

    let r10 = plan("raid10:c2", 60, &d, &a);
    assert_eq!(r10.layout.sets, 30);
    assert_eq!(r10.reliability.p_loss, m2.reliability.p_loss);
    let r0 = plan("raid0", 60, &d, &a);
    // raid0 loses data at the first failure: 1 - exp(-1.0512).
    assert!(close(r0.reliability.p_loss, 1.0 - (-1.0512f64).exp(), 1e-9));
    let concat = plan("concat", 60, &d, &a);
    assert_eq!(concat.performance.seq_read.disks, 1.0);
    assert_eq!(concat.performance.rand_read.disks, 60.0);
}

#[test]
fn ure_option() {
    let d = field_disk();
    let a = Assumptions {
        ure_per_bit: Some(1e-15),
        ..Assumptions::default()
    };
    let p = plan("raid6:6x10", 60, &d, &a);
    // The last-redundancy rebuild reads 8 whole disks: 1 - exp(-8 * 20e12 * 8 * 1e-15).
    let q = p.reliability.ure_per_critical_rebuild.unwrap();
    assert!(close(q, 1.0 - (-1.28f64).exp(), 1e-12));
    let without = plan("raid6:6x10", 60, &d, &Assumptions::default());
    assert!(p.reliability.p_loss > without.reliability.p_loss);
    assert!(plan("raid0", 60, &d, &a)
        .reliability
        .ure_per_critical_rebuild
        .is_none());
}

#[test]
fn rebuild_rate_sources() {
    let mut d = field_disk();
    let a = Assumptions::default();
    let p = plan("raid6:6x10", 60, &d, &a);
    assert_eq!(p.reliability.rebuild.rate_mb_s, 125.0);
    d.seq_mb_s = None;
    let p = plan("raid6:6x10", 60, &d, &a);
    assert_eq!(p.reliability.rebuild.rate_mb_s, 100.0);
    let given = Assumptions {
        rebuild_rate_mb_s: Some(50.0),
        ..a.clone()
    };
    let p = plan("raid6:6x9:s6", 60, &d, &given);
    assert_eq!(p.reliability.rebuild.rate_mb_s, 50.0);
    assert_eq!(p.reliability.rebuild.replacement_hours, 0.0);
    assert!(close(
        p.reliability.rebuild.window_hours,
        20e12 / 50e6 / 3600.0,
        1e-12
    ));
}

/// `sbod plan` as the binary wires it: PlanArgs flattened under a `plan` subcommand.
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

fn render(line: &str) -> anyhow::Result<String> {
    cli::render(&args(line).unwrap())
}

#[test]
fn cli_json_for_the_issue_example() {
    let out = render(
        "plan --disks 60 --disk-size 20TB --level raid6 --groups 6 --mttf 2.5M --years 5 --json",
    )
    .unwrap();
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["layout"]["spec"], "raid6:6x10");
    assert_eq!(v["layout"]["level"], "raid6");
    assert_eq!(v["layout"]["groups"], 6);
    assert_eq!(v["layout"]["group_width"], 10);
    assert_eq!(v["layout"]["data_disks"], 48);
    assert_eq!(v["disk"]["size_bytes"], TB20);
    assert_eq!(v["capacity"]["raw"]["tb"], 1200.0);
    assert_eq!(v["capacity"]["raw"]["bytes"], 1_200_000_000_000_000u64);
    assert_eq!(v["capacity"]["usable"]["tb"], 960.0);
    assert_eq!(v["capacity"]["at_fill_limit"]["tb"], 864.0);
    assert_eq!(v["capacity"]["fill_limit"], 0.9);
    assert_eq!(v["capacity"]["tib_convention"], "exact");
    let r = &v["reliability"];
    assert!(close(r["afr"].as_f64().unwrap(), 0.0035, 0.01));
    assert!(close(
        r["expected_failures"].as_f64().unwrap(),
        1.0512,
        1e-9
    ));
    assert_eq!(r["service_years"], 5.0);
    assert_eq!(r["rebuild"]["rate_source"], "assumed");
    let p = r["p_loss"].as_f64().unwrap();
    assert!(p > 0.0 && p < 1e-6, "{p}");
    assert!(r["mttdl_years"].as_f64().unwrap() > 1e7);
    assert_eq!(v["performance"]["kind"], "estimate");
    assert_eq!(v["performance"]["seq_read"]["disks"], 48.0);
    assert!(v["performance"]["seq_read"]["value"].is_null());
}

#[test]
fn cli_compare() {
    let out = render("plan --disks 60 --disk-size 20TB --compare --json --label-tib").unwrap();
    let v: Value = serde_json::from_str(&out).unwrap();
    let specs: Vec<&str> = v["plans"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["layout"]["spec"].as_str().unwrap())
        .collect();
    assert_eq!(
        specs,
        [
            "raid6:6x10",
            // Declustered groups and spare space fill the disks exactly: 7 x 8 + 4.
            "raid6:7x8:s4:d",
            "raid1:20x3",
            "raid1:30x2",
            "ec:12+3:4x15"
        ]
    );
    assert_eq!(v["plans"][0]["capacity"]["usable"]["tib"], 873.6);

    let out = render(
        "plan --disks 60 --disk-size 20TB --disk-mbps 250 --disk-iops 200 \
         --compare raid6:6x10 raid1:20x3 raid1:30x2 ec:8+3:5x11:s5",
    )
    .unwrap();
    for want in [
        "raid6:6x10",
        "ec:8+3:5x11:s5",
        "960.00",
        "864.00",
        "seq write MB/s (est.)",
        "not a measurement",
    ] {
        assert!(out.contains(want), "{want} missing from\n{out}");
    }
    // Default set adapts to the disk count; leftovers become spares.
    let out = render("plan --disks 25 --disk-size 18T --compare --json").unwrap();
    let v: Value = serde_json::from_str(&out).unwrap();
    for p in v["plans"].as_array().unwrap() {
        assert_eq!(p["layout"]["disks"], 25);
    }
    // The raid6 groups, then the same declustered (the leftover disk is spare space).
    assert_eq!(v["plans"][3]["layout"]["spec"], "raid1:12x2:s1");
    let (groups, decl) = (&v["plans"][0], &v["plans"][1]);
    assert_eq!(decl["layout"]["declustered"], true);
    assert_eq!(
        format!("{}:d", groups["layout"]["spec"].as_str().unwrap()),
        decl["layout"]["spec"]
    );
    assert!(
        decl["reliability"]["rebuild"]["rebuild_hours"].as_f64()
            < groups["reliability"]["rebuild"]["rebuild_hours"].as_f64()
    );
}

#[test]
fn cli_table() {
    let out = render("plan --disks 60 --disk-size 20TB --level raid6 --groups 6").unwrap();
    for want in [
        "raid6:6x10",
        "1,200.00",
        "1,091.39",
        "960.00",
        "864.00",
        "AFR 0.35%",
        "0.21 a year, 1.05 in 5 years",
        "2 failures per group of 10",
        "an estimate",
    ] {
        assert!(out.contains(want), "{want} missing from\n{out}");
    }
}

#[test]
fn cli_errors_say_what_would_work() {
    let e = render("plan --disks 60 --disk-size 20TB --level raid6 --groups 7").unwrap_err();
    let e = format!("{e:#}");
    assert!(
        e.contains("1, 2, 3, 4, 5, 6, 10, 12 or 15 groups would"),
        "{e}"
    );
    let e = format!(
        "{:#}",
        render("plan --disks 0 --disk-size 20TB --level raid6").unwrap_err()
    );
    assert!(e.contains("zero disks"), "{e}");
    let e = format!(
        "{:#}",
        render("plan --disks 60 --disk-size 20TB --level ec:2+3").unwrap_err()
    );
    assert!(e.contains("more parity (3) than data (2)"), "{e}");
    let e = format!(
        "{:#}",
        render("plan --disks 60 --disk-size 20TB --compare raid6:6x10 raid6:6x9").unwrap_err()
    );
    assert!(e.contains("keep the other 6 as hot spares"), "{e}");
    let e = format!(
        "{:#}",
        render("plan --disks 100000 --disk-size 1PB --level raid6 --groups 10000").unwrap_err()
    );
    assert!(e.contains("more than 18 EB"), "{e}");
    let e = format!(
        "{:#}",
        render("plan --disks 1 --disk-size 20TB --compare").unwrap_err()
    );
    assert!(e.contains("1 disk is too few"), "{e}");
    // Bad numbers are caught by the parser with the accepted forms.
    for (line, want) in [
        ("plan --disks 60 --disk-size 20XB --level raid6", "16TiB"),
        (
            "plan --disks 60 --disk-size 20TB --level raid6 --afr 0.35",
            "0.35%",
        ),
        ("plan --disks 60 --disk-size 20TB --level raid9", "ec:K+M"),
        (
            "plan --disks 60 --disk-size 20TB --level raid6 --fill 90",
            "90%",
        ),
        ("plan --disks 60 --disk-size 20TB", "--level"),
        (
            "plan --disks 60 --disk-size 20TB --compare --level raid6",
            "cannot be used",
        ),
    ] {
        let e = args(line)
            .err()
            .unwrap_or_else(|| panic!("{line} parsed"))
            .to_string();
        assert!(e.contains(want), "{line}: {e}");
    }
}

/// Dual-actuator drives (the field's Ceph report on Exos 2X14): 12 drives are 24 devices
/// of half the size, with twice the random IOPS of 12 single-actuator drives; the same raw
/// capacity; failures are counted per drive, and where a drive's two LUNs share a group
/// (one group) a drive failure costs that group two failures.
#[test]
fn cli_dual_actuator_drives() {
    let one =
        render("plan --disks 12 --disk-size 14TB --disk-iops 170 --level raid6 --groups 2 --json")
            .unwrap();
    let two = render(
        "plan --disks 12 --disk-size 14TB --disk-iops 170 --actuators 2 --level raid6 --groups 2 --json",
    )
    .unwrap();
    let (one, two): (Value, Value) = (
        serde_json::from_str(&one).unwrap(),
        serde_json::from_str(&two).unwrap(),
    );
    assert_eq!(two["layout"]["disks"], 24);
    assert_eq!(two["disk"]["size_bytes"], 7_000_000_000_000u64);
    assert_eq!(two["capacity"]["raw"]["tb"], one["capacity"]["raw"]["tb"]);
    let iops = |v: &Value| v["performance"]["rand_read"]["value"].as_f64().unwrap();
    assert!(
        close(iops(&two), 2.0 * iops(&one), 1e-9),
        "{} vs {}",
        iops(&two),
        iops(&one)
    );
    assert_eq!(two["actuators"]["drives"], 12);
    assert_eq!(two["actuators"]["luns_share_a_group"], false);
    assert!(
        close(
            two["reliability"]["expected_failures"].as_f64().unwrap(),
            one["reliability"]["expected_failures"].as_f64().unwrap(),
            1e-9
        ),
        "failures are counted per drive"
    );
    assert!(one.get("actuators").is_none());
    // One raid6 group of 24 LUNs: a drive failing costs it two failures: reliability in
    // drives, 12 drives surviving one.
    let shared: Value = serde_json::from_str(
        &render("plan --disks 12 --disk-size 14TB --actuators 2 --level raid6 --json").unwrap(),
    )
    .unwrap();
    assert_eq!(shared["actuators"]["luns_share_a_group"], true);
    let r5: Value = serde_json::from_str(
        &render("plan --disks 12 --disk-size 14TB --level raid5 --json").unwrap(),
    )
    .unwrap();
    assert!(
        close(
            shared["reliability"]["p_loss"].as_f64().unwrap(),
            r5["reliability"]["p_loss"].as_f64().unwrap(),
            1e-9
        ),
        "raid6 over both LUNs of 12 drives survives what raid5 of the 12 drives does"
    );
    let text =
        render("plan --disks 12 --disk-size 14TB --actuators 2 --level raid6 --groups 2").unwrap();
    assert!(
        text.contains(
            "12 drives with 2 actuators each, seen as 24 devices: twice the IOPS per drive"
        ),
        "{text}"
    );
    assert!(render("plan --disks 12 --disk-size 14TB --actuators 0 --level raid6").is_err());
}
