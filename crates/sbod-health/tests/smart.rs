//! The health parser on recorded `smartctl --json -a` outputs (tests/fixtures: constructed
//! after smartmontools' documented schema, see its README), and smartctl itself where it
//! is installed.

use sbod_health::smart::{self, Smartctl};
use sbod_health::Reader;
use sbod_types::{DiskProtocol, HealthPolicy, HealthVerdict};

fn fixture(name: &str) -> String {
    std::fs::read_to_string(format!(
        "{}/tests/fixtures/{name}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap()
}

#[test]
fn a_healthy_sata_disk_is_ok() {
    let h = smart::parse(&fixture("sata-hdd-healthy.json"), &HealthPolicy::default());
    assert_eq!(h.verdict, HealthVerdict::Ok, "{h:?}");
    assert!(h.reasons.is_empty());
    assert_eq!(h.protocol, Some(DiskProtocol::Ata));
    assert_eq!(h.passed, Some(true));
    assert_eq!(h.serial.as_deref(), Some("ZR5A1B2C"));
    assert_eq!(h.model.as_deref(), Some("ST18000NM000J-2TV103"));
    assert_eq!(h.reallocated_sectors, Some(0));
    assert_eq!(h.pending_sectors, Some(0));
    assert_eq!(h.uncorrectable_sectors, Some(0));
    assert_eq!(h.crc_errors, Some(0));
    assert_eq!(h.temperature_celsius, Some(35));
    assert_eq!(h.power_on_hours, Some(10987));
    assert_eq!(h.summary(), "ok");
}

#[test]
fn a_failing_sata_disk_is_failing_with_its_reasons() {
    let h = smart::parse(&fixture("sata-hdd-failing.json"), &HealthPolicy::default());
    assert_eq!(h.verdict, HealthVerdict::Failing, "{h:?}");
    assert_eq!(h.passed, Some(false));
    assert_eq!(h.reallocated_sectors, Some(1932));
    assert_eq!(h.pending_sectors, Some(24));
    assert_eq!(h.uncorrectable_sectors, Some(7));
    assert_eq!(h.crc_errors, Some(3));
    // Raw 194 packs min/max in upper bytes; the count is smartctl's decoding.
    assert_eq!(h.temperature_celsius, Some(42));
    let all = h.reasons.join(" | ");
    for want in [
        "SMART assessment: FAILED",
        "Reallocated_Sector_Ct (5) at or below its threshold",
        "1932 reallocated sectors (failing at 100)",
        "24 pending sectors (failing at 10)",
        "7 uncorrectable errors (warning at 1)",
    ] {
        assert!(all.contains(want), "missing '{want}' in {all}");
    }
    assert!(
        !all.contains("CRC"),
        "3 CRC errors are below the warning: {all}"
    );
}

#[test]
fn thresholds_are_the_operators() {
    let json = fixture("sata-hdd-failing.json");
    // Lift every threshold above the counters: only the drive's own words remain.
    let mut p = HealthPolicy::default();
    p.apply("reallocated=5000:9000,pending=100:200,uncorrectable=100:200,crc_errors=1:2")
        .unwrap();
    let h = smart::parse(&json, &p);
    assert_eq!(h.verdict, HealthVerdict::Failing);
    assert!(h
        .reasons
        .iter()
        .any(|r| r.starts_with("3 link CRC errors") && r.ends_with("(failing at 2)")));
    assert!(
        !h.reasons.iter().any(|r| r.contains("pending")),
        "{:?}",
        h.reasons
    );
    // The healthy disk turns warn on a low temperature threshold; rejudge agrees with parse.
    let mut hot = HealthPolicy::default();
    hot.apply("temperature=30:-").unwrap();
    let healthy = smart::parse(&fixture("sata-hdd-healthy.json"), &hot);
    assert_eq!(healthy.verdict, HealthVerdict::Warn);
    assert_eq!(healthy.reasons, vec!["35 °C (warning at 30)".to_string()]);
    let again = smart::rejudge(&healthy, &HealthPolicy::default());
    assert_eq!(again.verdict, HealthVerdict::Ok);
}

#[test]
fn a_sas_disk_reads_its_defect_list_and_error_log() {
    let h = smart::parse(&fixture("sas-hdd.json"), &HealthPolicy::default());
    assert_eq!(h.protocol, Some(DiskProtocol::Scsi));
    assert_eq!(h.passed, Some(true));
    assert_eq!(h.reallocated_sectors, Some(12));
    assert_eq!(h.uncorrectable_sectors, Some(0));
    assert_eq!(h.temperature_celsius, Some(31));
    assert_eq!(h.model.as_deref(), Some("SEAGATE ST14000NM0001"));
    assert_eq!(h.verdict, HealthVerdict::Warn);
    assert_eq!(
        h.reasons,
        vec!["12 reallocated sectors (warning at 1)".to_string()]
    );
}

#[test]
fn an_nvme_drive_reads_its_health_log() {
    let json = fixture("nvme.json");
    let h = smart::parse(&json, &HealthPolicy::default());
    assert_eq!(h.protocol, Some(DiskProtocol::Nvme));
    assert_eq!(h.critical_warning, Some(0));
    assert_eq!(h.percentage_used, Some(93));
    assert_eq!(h.media_errors, Some(0));
    assert_eq!(h.temperature_celsius, Some(38));
    assert_eq!(h.power_on_hours, Some(30120));
    assert_eq!(h.verdict, HealthVerdict::Warn);
    assert!(
        h.reasons[0].contains("93 % of rated endurance used"),
        "{:?}",
        h.reasons
    );
    // The same drive with reliability degraded and media errors: failing.
    let mut v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let log = &mut v["nvme_smart_health_information_log"];
    log["critical_warning"] = 0x04.into();
    log["media_errors"] = 3.into();
    log["available_spare"] = 5.into();
    let h = smart::parse(&v.to_string(), &HealthPolicy::default());
    assert_eq!(h.verdict, HealthVerdict::Failing);
    let all = h.reasons.join(" | ");
    assert!(all.contains("reliability degraded"), "{all}");
    assert!(
        all.contains("available spare 5% below its threshold 10%"),
        "{all}"
    );
    assert!(all.contains("3 media errors (warning at 1)"), "{all}");
}

#[test]
fn a_disk_without_smart_is_not_available_with_smartctls_words() {
    let h = smart::parse(&fixture("virtio-vda.json"), &HealthPolicy::default());
    assert_eq!(h.verdict, HealthVerdict::Unavailable);
    assert_eq!(
        h.summary(),
        "not available: smartctl cannot read it: /dev/vda: Unable to detect device type"
    );
}

#[test]
fn files_remote_members_and_a_missing_smartctl_say_so() {
    let r = Reader::default();
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("m0.img");
    std::fs::write(&f, [0u8; 4096]).unwrap();
    let h = r.health(f.to_str().unwrap(), &HealthPolicy::default());
    assert_eq!(h.verdict, HealthVerdict::Unavailable);
    assert!(h.summary().contains("a file"), "{}", h.summary());
    let h = r.health("nbd://127.0.0.1:1/sdb", &HealthPolicy::default());
    assert!(h.summary().contains("a remote member"), "{}", h.summary());
    let none = Smartctl {
        program: dir.path().join("no-smartctl"),
        ..Smartctl::default()
    };
    let h = none.read(std::path::Path::new("/dev/sda"), &HealthPolicy::default());
    assert!(
        h.summary().contains("install smartmontools"),
        "{}",
        h.summary()
    );
}

/// The real smartctl on this machine's disks: read where the disk has SMART, and on a
/// virtual disk "not available" with smartctl's reason, never an error or a guess.
#[test]
fn real_smartctl_on_this_machines_disks() {
    let s = Smartctl::default();
    assert!(
        s.installed(),
        "smartctl is not installed: apt-get install smartmontools (scripts/deps.sh does)"
    );
    let r = Reader::default();
    let disks: Vec<String> = std::fs::read_dir("/sys/block")
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with("loop") && !n.starts_with("zram") && !n.starts_with("ram"))
        .filter(|n| std::path::Path::new(&format!("/dev/{n}")).exists())
        .collect();
    for d in &disks {
        let h = r.health(&format!("/dev/{d}"), &HealthPolicy::default());
        eprintln!("/dev/{d}: {}", h.summary());
        if h.verdict == HealthVerdict::Unavailable {
            assert!(
                !h.reasons.is_empty(),
                "/dev/{d}: unavailable without a reason"
            );
            if d.starts_with("vd") {
                assert!(h.summary().contains("virtio"), "{}", h.summary());
            }
        } else {
            assert!(
                h.protocol.is_some(),
                "/dev/{d}: read without a protocol: {h:?}"
            );
        }
    }
}
