//! A fake sysfs and /dev under a temporary root, shaped as the kernel lays them out: SCSI
//! disks behind a SAS HBA, an SES enclosure (the ses driver's /sys/class/enclosure) with
//! its slots' LED files, an NVMe drive in a PCIe slot, a dual-actuator drive as two LUNs
//! and one as one device with two access ranges.

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

pub struct Tree {
    pub dir: tempfile::TempDir,
}

fn write(p: &Path, s: impl AsRef<[u8]>) {
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, s).unwrap();
}

fn link(target: &str, at: &Path) {
    std::fs::create_dir_all(at.parent().unwrap()).unwrap();
    symlink(target, at).unwrap();
}

/// A raw VPD page 0x80 (unit serial number).
fn vpd80(serial: &str) -> Vec<u8> {
    let mut v = vec![0, 0x80, 0, serial.len() as u8];
    v.extend_from_slice(serial.as_bytes());
    v
}

impl Tree {
    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    pub fn p(&self, rel: &str) -> PathBuf {
        self.root().join(rel)
    }

    /// A SCSI disk at `addr` (H:C:T:L) with its wwid and serial; returns its device dir.
    pub fn scsi_disk(&self, name: &str, addr: &str, wwid: &str, serial: &str) -> String {
        let t: Vec<&str> = addr.split(':').collect();
        let dev = format!(
            "sys/devices/pci0000:00/0000:00:03.0/0000:02:00.0/host{h}/port-{h}:0/end_device-{h}:0/target{h}:{c}:{t}/{addr}",
            h = t[0],
            c = t[1],
            t = t[2]
        );
        write(&self.p(&format!("{dev}/wwid")), format!("{wwid}\n"));
        write(&self.p(&format!("{dev}/model")), "ST14000NM0001   \n");
        write(&self.p(&format!("{dev}/vpd_pg80")), vpd80(serial));
        std::fs::create_dir_all(self.p(&format!("{dev}/block/{name}/queue"))).unwrap();
        link("../..", &self.p(&format!("{dev}/block/{name}/device")));
        link(
            &format!("../../{}/block/{name}", dev.trim_start_matches("sys/")),
            &self.p(&format!("sys/class/block/{name}")),
        );
        write(&self.p(&format!("dev/{name}")), "");
        let wwn = wwid.trim_start_matches("naa.");
        link(
            &format!("../../{name}"),
            &self.p(&format!("dev/disk/by-id/wwn-0x{wwn}")),
        );
        link(
            &format!("../../{name}"),
            &self.p(&format!("dev/disk/by-id/scsi-3{wwn}")),
        );
        dev
    }

    /// A partition of a disk made by [`Tree::scsi_disk`].
    pub fn partition(&self, dev: &str, disk: &str, part: &str) {
        write(
            &self.p(&format!("{dev}/block/{disk}/{part}/partition")),
            "1\n",
        );
        link(
            &format!(
                "../../{}/block/{disk}/{part}",
                dev.trim_start_matches("sys/")
            ),
            &self.p(&format!("sys/class/block/{part}")),
        );
        write(&self.p(&format!("dev/{part}")), "");
    }

    /// An SES enclosure `enc` whose slot `comp` (slot number `slot`) holds the device at
    /// `dev` (None: an empty slot).
    pub fn enclosure_slot(&self, enc: &str, comp: &str, slot: u32, dev: Option<&str>) {
        let c = self.p(&format!("sys/class/enclosure/{enc}/{comp}"));
        write(
            &self.p(&format!("sys/class/enclosure/{enc}/id")),
            "0x500605b0000272bf\n",
        );
        write(&c.join("locate"), "0\n");
        write(&c.join("fault"), "0\n");
        write(&c.join("slot"), format!("{slot}\n"));
        write(&c.join("type"), "array device\n");
        if let Some(d) = dev {
            // Absolute within the tree: the test's root, then the device's directory.
            symlink(self.p(d), c.join("device")).unwrap();
        }
    }

    /// An NVMe namespace on the PCI function `bdf` (0000:3b:00.0), in PCIe slot `slot`.
    pub fn nvme(&self, name: &str, bdf: &str, slot: &str, eui: &str, serial: &str) {
        let ctrl = name
            .trim_end_matches(|c: char| c != 'n')
            .trim_end_matches('n');
        let pci = format!("sys/devices/pci0000:3a/0000:3a:00.0/{bdf}");
        let c = format!("{pci}/nvme/{ctrl}");
        write(&self.p(&format!("{c}/serial")), format!("{serial}      \n"));
        write(
            &self.p(&format!("{c}/model")),
            "SAMSUNG MZQL23T8HCLS-00A07\n",
        );
        write(&self.p(&format!("{c}/{name}/wwid")), format!("{eui}\n"));
        std::fs::create_dir_all(self.p(&format!("{c}/{name}/queue"))).unwrap();
        link("../../nvme0", &self.p(&format!("{c}/{name}/device")));
        link(
            &format!("../../{}/{name}", c.trim_start_matches("sys/")),
            &self.p(&format!("sys/class/block/{name}")),
        );
        write(&self.p(&format!("dev/{name}")), "");
        let s = self.p(&format!("sys/bus/pci/slots/{slot}"));
        write(&s.join("address"), format!("{}\n", &bdf[..bdf.len() - 2]));
        write(&s.join("attention"), "0\n");
        link(
            &format!("../../{name}"),
            &self.p(&format!("dev/disk/by-id/nvme-{eui}")),
        );
    }

    /// Give a device independent access ranges (actuators).
    pub fn access_ranges(&self, dev: &str, disk: &str, n: u32) {
        for i in 0..n {
            let r = self.p(&format!(
                "{dev}/block/{disk}/queue/independent_access_ranges/{i}"
            ));
            write(
                &r.join("sector"),
                format!("{}\n", i as u64 * 13_671_875_000),
            );
            write(&r.join("nr_sectors"), "13671875000\n");
        }
        write(
            &self.p(&format!(
                "{dev}/block/{disk}/queue/independent_access_ranges/nr_ranges"
            )),
            format!("{n}\n"),
        );
    }
}

/// The rack every test starts from: an enclosure `0:0:12:0` with sdc in Slot 03 and an
/// empty Slot 04; sdd and sde are two LUNs of one dual-actuator SAS drive (one serial);
/// sdf a SATA dual-actuator drive (one device, two access ranges); sdc1 a partition;
/// nvme0n1 in PCIe slot 7.
pub fn rack() -> Tree {
    let t = Tree {
        dir: tempfile::tempdir().unwrap(),
    };
    let sdc = t.scsi_disk("sdc", "0:0:3:0", "naa.5000c500a1b2c3d4", "ZL2C0001");
    t.partition(&sdc, "sdc", "sdc1");
    t.enclosure_slot("0:0:12:0", "Slot 03", 3, Some(&sdc));
    t.enclosure_slot("0:0:12:0", "Slot 04", 4, None);
    let sdd = t.scsi_disk("sdd", "0:0:5:0", "naa.5000c500d0e0f010", "ZJV0A2X1");
    let sde = t.scsi_disk("sde", "0:0:5:1", "naa.5000c500d0e0f011", "ZJV0A2X1");
    t.enclosure_slot("0:0:12:0", "Slot 05", 5, Some(&sdd));
    let _ = sde;
    let sdf = t.scsi_disk("sdf", "1:0:0:0", "naa.5000c500e1e2e3e4", "ZXA0B3Y7");
    t.access_ranges(&sdf, "sdf", 2);
    t.nvme(
        "nvme0n1",
        "0000:3b:00.0",
        "7",
        "eui.0025388b71e2a1c4",
        "S64HNE0T512345",
    );
    t
}
