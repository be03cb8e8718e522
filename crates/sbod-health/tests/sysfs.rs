//! Enclosure, identity, dual-actuator discovery and the LED writes on a fake sysfs tree
//! under a root prefix (tests/faketree), and hot-plug through a test-driven event source.

mod faketree;

use sbod_health::hotplug::{self, Action, Decision, DiskEvent, EventSource, FakeSource, OutMember};
use sbod_health::led::{self, Led};
use sbod_health::sysfs::Sysfs;
use sbod_health::{Joining, MemberKind, Reader};
use std::time::Duration;

#[test]
fn a_member_path_finds_its_disk_through_links_and_partitions() {
    let t = faketree::rack();
    let s = Sysfs::new(t.root());
    assert_eq!(s.kernel_name("/dev/sdc").as_deref(), Some("sdc"));
    assert_eq!(
        s.kernel_name("/dev/disk/by-id/wwn-0x5000c500a1b2c3d4")
            .as_deref(),
        Some("sdc")
    );
    assert_eq!(s.kernel_name("/dev/sdc1").as_deref(), Some("sdc1"));
    assert_eq!(s.whole_disk("sdc1"), "sdc");
    assert_eq!(s.whole_disk("sdc"), "sdc");
    assert_eq!(s.kernel_name("/srv/d0.img"), None);
    let r = Reader {
        sysfs: s,
        ..Reader::default()
    };
    assert_eq!(r.kind("/dev/sdc1"), MemberKind::Disk { disk: "sdc".into() });
    assert_eq!(r.kind("nbd://node1/sdb"), MemberKind::Remote);
    assert_eq!(r.kind("/dev/sdz"), MemberKind::Missing);
}

#[test]
fn identity_is_stable_beside_the_dev_name() {
    let t = faketree::rack();
    let s = Sysfs::new(t.root());
    let id = s.identity("sdc");
    assert_eq!(id.kernel_name.as_deref(), Some("sdc"));
    assert_eq!(id.wwn.as_deref(), Some("naa.5000c500a1b2c3d4"));
    assert_eq!(id.serial.as_deref(), Some("ZL2C0001"), "from VPD page 0x80");
    assert_eq!(id.model.as_deref(), Some("ST14000NM0001"));
    assert_eq!(
        id.by_id.as_deref(),
        Some("/dev/disk/by-id/wwn-0x5000c500a1b2c3d4")
    );
    assert_eq!(id.stable(), Some("naa.5000c500a1b2c3d4"));
    let n = s.identity("nvme0n1");
    assert_eq!(n.wwn.as_deref(), Some("eui.0025388b71e2a1c4"));
    assert_eq!(n.serial.as_deref(), Some("S64HNE0T512345"));
    assert_eq!(
        n.by_id.as_deref(),
        Some("/dev/disk/by-id/nvme-eui.0025388b71e2a1c4")
    );
}

#[test]
fn enclosure_slots_and_pcie_slots_are_found() {
    let t = faketree::rack();
    let s = Sysfs::new(t.root());
    let (loc, leds) = s.location("sdc").expect("sdc is in the enclosure");
    assert_eq!(loc.enclosure, "0:0:12:0");
    assert_eq!(loc.enclosure_id.as_deref(), Some("0x500605b0000272bf"));
    assert_eq!(loc.slot, "3");
    assert!(loc.led);
    assert!(leds.fault.is_some());
    assert_eq!(loc.to_string(), "0:0:12:0/3");
    let (n, _) = s
        .location("nvme0n1")
        .expect("the NVMe drive is in PCIe slot 7");
    assert_eq!((n.enclosure.as_str(), n.slot.as_str()), ("pci", "7"));
    assert!(s.location("sdf").is_none(), "sdf is in no enclosure");
    let r = Reader {
        sysfs: s,
        ..Reader::default()
    };
    let (id, loc) = r.place("/dev/sdc1");
    assert_eq!(
        loc.map(|l| l.slot),
        Some("3".to_string()),
        "a partition's disk's slot"
    );
    assert_eq!(id.and_then(|i| i.serial), Some("ZL2C0001".to_string()));
}

#[test]
fn dual_actuator_drives_are_one_drive() {
    let t = faketree::rack();
    let s = Sysfs::new(t.root());
    assert_eq!(s.actuators("sdf"), Some(2), "two access ranges");
    assert_eq!(s.actuators("sdc"), None);
    let all: Vec<String> = ["sdc", "sdd", "sde", "sdf", "nvme0n1"]
        .iter()
        .map(|x| x.to_string())
        .collect();
    let shared = s.shared_drives(&all);
    assert_eq!(shared.len(), 2, "{shared:?}");
    assert_eq!(
        shared["sdd"], shared["sde"],
        "two LUNs, one serial: one drive"
    );
    // Without serials, the WWN base on one SCSI target says the same.
    std::fs::remove_file(t.p(
        "sys/devices/pci0000:00/0000:00:03.0/0000:02:00.0/host0/port-0:0/end_device-0:0/target0:0:5/0:0:5:0/vpd_pg80",
    ))
    .unwrap();
    std::fs::remove_file(t.p(
        "sys/devices/pci0000:00/0000:00:03.0/0000:02:00.0/host0/port-0:0/end_device-0:0/target0:0:5/0:0:5:1/vpd_pg80",
    ))
    .unwrap();
    let shared = s.shared_drives(&all);
    assert_eq!(shared.get("sdd"), shared.get("sde"));
    assert!(shared.contains_key("sdd"), "{shared:?}");
    assert!(!shared.contains_key("sdc"));
}

/// `sbod create` without --domains puts the two LUNs of one drive in one failure domain.
#[test]
fn dual_actuator_luns_get_one_failure_domain() {
    let t = faketree::rack();
    let r = Reader {
        sysfs: Sysfs::new(t.root()),
        ..Reader::default()
    };
    let members: Vec<String> = [
        "/dev/sdc1",
        "/dev/sdd",
        "/dev/disk/by-id/wwn-0x5000c500d0e0f011",
        "/dev/sdf",
        "/srv/d0.img",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let d = sbod_health::drive_domains(&r, &members);
    assert_eq!(
        d,
        vec![
            None,
            Some("drive:ZJV0A2X1".to_string()),
            Some("drive:ZJV0A2X1".to_string()),
            None,
            None
        ]
    );
}

/// A device joining later (`sbod add`, `replace`, `grow --add`) that is the other LUN of
/// a member's dual-actuator drive joins that member's recorded failure domain; with a
/// member that has none it is said to be unprotected; two joining together get the
/// drive's domain; others are left as asked. Members are found by any name (by-id links,
/// partitions, the tree's own device files).
#[test]
fn a_lun_joining_later_gets_its_partners_failure_domain() {
    let t = faketree::rack();
    let r = Reader {
        sysfs: Sysfs::new(t.root()),
        ..Reader::default()
    };
    let m = |v: &[(&str, &str)]| -> Vec<(String, String)> {
        v.iter()
            .map(|(p, d)| (p.to_string(), d.to_string()))
            .collect()
    };
    let j = |v: &[&str]| -> Vec<String> { v.iter().map(|s| s.to_string()).collect() };
    // sdd is a member in domain "rack2": sde, the other LUN of its drive, joins it.
    let sde = t.p("dev/sde").display().to_string();
    let got = sbod_health::joining_domains(
        &r,
        &m(&[("/dev/sdc1", "rack1"), ("/dev/sdd", "rack2")]),
        &j(&[&sde, "/dev/sdf", "/srv/d9.img"]),
    );
    match &got[0] {
        Joining::Domain { domain, why } => {
            assert_eq!(domain, "rack2");
            assert!(
                why.contains("member /dev/sdd") && why.contains("drive:ZJV0A2X1"),
                "{why}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(got[1], Joining::Alone, "a dual-actuator drive alone: sdf");
    assert_eq!(got[2], Joining::Alone, "a file");
    // By its by-id name, and the member by its by-id name too.
    let got = sbod_health::joining_domains(
        &r,
        &m(&[("/dev/disk/by-id/wwn-0x5000c500d0e0f010", "drive:ZJV0A2X1")]),
        &j(&["/dev/disk/by-id/wwn-0x5000c500d0e0f011"]),
    );
    assert!(
        matches!(&got[0], Joining::Domain { domain, .. } if domain == "drive:ZJV0A2X1"),
        "{got:?}"
    );
    // A partner without a domain: nothing keeps them apart.
    let got = sbod_health::joining_domains(&r, &m(&[("/dev/sdd", "")]), &j(&["/dev/sde"]));
    match &got[0] {
        Joining::Undomained { partner, why } => {
            assert_eq!(partner, "/dev/sdd");
            assert!(why.contains("no failure domain recorded"), "{why}");
        }
        other => panic!("{other:?}"),
    }
    // Both LUNs joining at once (grow --add): the drive's domain, as create gives.
    let got =
        sbod_health::joining_domains(&r, &m(&[("/dev/sdc", "")]), &j(&["/dev/sdd", "/dev/sde"]));
    for g in &got {
        assert!(
            matches!(g, Joining::Domain { domain, .. } if domain == "drive:ZJV0A2X1"),
            "{got:?}"
        );
    }
    // A former member given back (its disk is in the array's list, out) keeps its own
    // recorded domain, even beside its drive's other LUN without one.
    let got = sbod_health::joining_domains(&r, &m(&[("/dev/sdd", "")]), &j(&["/dev/sdd"]));
    assert_eq!(got[0], Joining::Alone);
    let got = sbod_health::joining_domains(
        &r,
        &m(&[("/dev/sdd", ""), (&sde, "")]),
        &j(&["/dev/disk/by-id/wwn-0x5000c500d0e0f011"]),
    );
    assert_eq!(got[0], Joining::Alone);
}

#[test]
fn locate_and_fault_leds_are_written_in_sysfs() {
    let t = faketree::rack();
    let s = Sysfs::new(t.root());
    let slot = t.p("sys/class/enclosure/0:0:12:0/Slot 03");
    let how = led::set_with(&s, "sdc", Led::Locate, true, None).unwrap();
    assert_eq!(how, "sysfs /sys/class/enclosure/0:0:12:0/Slot 03/locate");
    assert_eq!(std::fs::read_to_string(slot.join("locate")).unwrap(), "1");
    assert_eq!(std::fs::read_to_string(slot.join("fault")).unwrap(), "0\n");
    assert_eq!(led::get(&s, "sdc", Led::Locate), Some(true));
    led::set_with(&s, "sdc", Led::Locate, false, None).unwrap();
    assert_eq!(std::fs::read_to_string(slot.join("locate")).unwrap(), "0");
    led::set_with(&s, "sdc", Led::Fault, true, None).unwrap();
    assert_eq!(std::fs::read_to_string(slot.join("fault")).unwrap(), "1");
    assert_eq!(led::get(&s, "sdc", Led::Fault), Some(true));
    // By the slot alone (its disk gone): the same file.
    let loc = s.location("sdc").unwrap().0;
    led::set_location(&s, &loc, Led::Fault, false).unwrap();
    assert_eq!(std::fs::read_to_string(slot.join("fault")).unwrap(), "0");
    // NVMe: the PCIe slot's attention indicator.
    led::set_with(&s, "nvme0n1", Led::Locate, true, None).unwrap();
    assert_eq!(
        std::fs::read_to_string(t.p("sys/bus/pci/slots/7/attention")).unwrap(),
        "1"
    );
    // No slot and no ledctl: an error that says what would help.
    let e = led::set_with(&s, "sdf", Led::Locate, true, None).unwrap_err();
    assert!(e.contains("ledmon"), "{e}");
}

#[test]
fn ledctl_is_used_where_sysfs_has_no_led() {
    let t = faketree::rack();
    let s = Sysfs::new(t.root());
    let log = t.p("ledctl.log");
    let prog = t.p("ledctl");
    std::fs::write(
        &prog,
        format!("#!/bin/sh\necho \"$@\" >> '{}'\n", log.display()),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(0o755)).unwrap();
    led::set_with(&s, "sdf", Led::Locate, true, Some(prog.clone())).unwrap();
    led::set_with(&s, "sdf", Led::Locate, false, Some(prog.clone())).unwrap();
    led::set_with(&s, "sdf", Led::Fault, true, Some(prog.clone())).unwrap();
    assert_eq!(
        std::fs::read_to_string(&log).unwrap(),
        "locate=/dev/sdf\nlocate_off=/dev/sdf\nfailure=/dev/sdf\n"
    );
    std::fs::write(&prog, "#!/bin/sh\nexit 3\n").unwrap();
    assert!(led::set_with(&s, "sdf", Led::Locate, true, Some(prog)).is_err());
}

#[test]
fn hotplug_readds_a_former_member_and_autoreplaces_only_when_told() {
    let t = faketree::rack();
    let s = Sysfs::new(t.root());
    // sdc failed and was pulled while in Slot 03: the array remembers how it looked.
    let out = vec![OutMember {
        member: "/dev/disk/by-id/wwn-0x5000c500a1b2c3d4".into(),
        identity: Some(s.identity("sdc")),
        location: s.location("sdc").map(|(l, _)| l),
    }];
    let (tx, mut src) = FakeSource::new();
    let add = |name: &str| DiskEvent {
        action: Action::Add,
        name: name.into(),
        disk: true,
    };
    // It comes back (under any name): given back.
    tx.send(add("sdc")).unwrap();
    // A partition appearing, and a removal: nothing to do.
    tx.send(DiskEvent {
        action: Action::Add,
        name: "sdc1".into(),
        disk: false,
    })
    .unwrap();
    tx.send(DiskEvent {
        action: Action::Remove,
        name: "sdd".into(),
        disk: true,
    })
    .unwrap();
    let mut got = Vec::new();
    while let Some(ev) = src.next(Duration::from_millis(50)).unwrap() {
        got.push(hotplug::on_event(&s, &ev, &out, false));
    }
    assert_eq!(
        got,
        vec![
            Some(Decision::ReAdd {
                member: out[0].member.clone(),
                // The tree's own node: a test's tree never names the host's /dev.
                device: t.p("dev/sdc").display().to_string()
            }),
            None,
            None
        ]
    );
    // A new disk in Slot 03 instead: replaced only with autoreplace on.
    std::fs::remove_file(t.p("sys/class/enclosure/0:0:12:0/Slot 03/device")).unwrap();
    let sdg = t.scsi_disk("sdg", "0:0:9:0", "naa.5000c500ffff0001", "NEW00001");
    std::os::unix::fs::symlink(
        t.p(&sdg),
        t.p("sys/class/enclosure/0:0:12:0/Slot 03/device"),
    )
    .unwrap();
    match hotplug::on_event(&s, &add("sdg"), &out, false) {
        Some(Decision::Withheld { old, new, why }) => {
            assert_eq!(
                (old, new),
                (out[0].member.clone(), t.p("dev/sdg").display().to_string())
            );
            assert!(why.contains("autoreplace is off"), "{why}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        hotplug::on_event(&s, &add("sdg"), &out, true),
        Some(Decision::Replace {
            old: out[0].member.clone(),
            new: t.p("dev/sdg").display().to_string()
        })
    );
    // A disk in another slot is never taken.
    let sdh = t.scsi_disk("sdh", "0:0:10:0", "naa.5000c500ffff0002", "NEW00002");
    t.enclosure_slot("0:0:12:0", "Slot 06", 6, Some(&sdh));
    assert!(matches!(
        hotplug::on_event(&s, &add("sdh"), &out, true),
        Some(Decision::Leave(_))
    ));
    drop(tx);
    assert!(
        src.next(Duration::from_millis(10)).is_err(),
        "the source ended"
    );
}

/// The real uevent socket opens (no event is awaited: nothing here plugs disks in).
#[test]
fn the_kernel_uevent_socket_opens() {
    let mut u = hotplug::Uevents::open().expect("a NETLINK_KOBJECT_UEVENT socket");
    let _ = u.next(Duration::from_millis(10)).unwrap();
}
