//! What the kernel knows about a member's disk, read from sysfs and /dev under a root
//! prefix (`/` on a host; a fake tree in tests): the whole disk under a partition, a
//! stable identity (WWN, serial, model, a /dev/disk/by-id link), where it sits (an SES
//! enclosure's slot through the kernel's ses driver, `/sys/class/enclosure`; a PCIe slot
//! for NVMe, `/sys/bus/pci/slots`), its LED files, and whether it is one half of a
//! dual-actuator drive (`queue/independent_access_ranges`, or two LUNs of one drive).

use sbod_types::{Identity, Location};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// sysfs and /dev under a root.
#[derive(Clone, Debug)]
pub struct Sysfs {
    root: PathBuf,
}

/// An LED a member's slot offers through sysfs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LedFiles {
    /// The enclosure component's `locate` file, or the PCIe slot's `attention`.
    pub locate: Option<PathBuf>,
    /// The enclosure component's `fault` file (PCIe slots have only the attention LED).
    pub fault: Option<PathBuf>,
}

fn read_trim(p: &Path) -> Option<String> {
    let s = std::fs::read_to_string(p).ok()?;
    let s = s.trim_matches(|c: char| c.is_whitespace() || c == '\0');
    (!s.is_empty()).then(|| s.to_string())
}

fn dir_names(p: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(p)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

impl Default for Sysfs {
    fn default() -> Sysfs {
        Sysfs::new("/")
    }
}

impl Sysfs {
    pub fn new(root: impl Into<PathBuf>) -> Sysfs {
        Sysfs { root: root.into() }
    }

    /// `SBOD_SYSFS_ROOT` (a test's fake tree), else `/`.
    pub fn from_env() -> Sysfs {
        Sysfs::new(std::env::var_os("SBOD_SYSFS_ROOT").unwrap_or_else(|| "/".into()))
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// A host path under the root.
    pub fn path(&self, p: impl AsRef<Path>) -> PathBuf {
        let p = p.as_ref();
        self.root.join(p.strip_prefix("/").unwrap_or(p))
    }

    fn block(&self, name: &str) -> PathBuf {
        self.path("sys/class/block").join(name)
    }

    /// The kernel name of the block device a member path names ("/dev/sdc",
    /// "/dev/disk/by-id/wwn-0x5000c500a1b2c3d4" -> "sdc"), if it is one the kernel lists.
    pub fn kernel_name(&self, member: &str) -> Option<String> {
        let p = if member.starts_with("/dev/") {
            self.path(member)
        } else if self.in_root_dev(member) {
            // Under a test's root, a member opened through the tree's own dev/.
            PathBuf::from(member)
        } else {
            return None;
        };
        let real = std::fs::canonicalize(&p).unwrap_or(p);
        let name = real.file_name()?.to_string_lossy().into_owned();
        self.block(&name).exists().then_some(name)
    }

    /// Whether a path lies in the root's dev/ (never under the host's `/`: there,
    /// members are named /dev/...): a fake tree's device files, which tests use as members
    /// (the engine opens them as files; health sees the disk the tree describes).
    fn in_root_dev(&self, member: &str) -> bool {
        if self.root == Path::new("/") {
            return false;
        }
        let m = Path::new(member);
        m.starts_with(self.root.join("dev"))
            || std::fs::canonicalize(&self.root).is_ok_and(|r| m.starts_with(r.join("dev")))
    }

    /// The path by which a disk's kernel name is opened: `/dev/NAME` on a host, the
    /// tree's own under a test's root.
    pub fn dev_path(&self, name: &str) -> String {
        self.path(format!("/dev/{name}")).display().to_string()
    }

    /// The whole disk a block device is part of ("sdc1" -> "sdc"; "nvme0n1p2" ->
    /// "nvme0n1"), or itself.
    pub fn whole_disk(&self, name: &str) -> String {
        let b = self.block(name);
        if !b.join("partition").exists() {
            return name.to_string();
        }
        // /sys/class/block/sdc1 -> ../../devices/.../block/sdc/sdc1: the parent is the disk.
        std::fs::canonicalize(&b)
            .ok()
            .and_then(|r| r.parent().map(|p| p.to_path_buf()))
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .filter(|n| self.block(n).exists())
            .unwrap_or_else(|| name.to_string())
    }

    /// What kind of device it is, where health can not be read from it: loop, dm, md,
    /// zram, nbd, virtio and Xen disks, RAM disks. None for a disk smartctl may read.
    pub fn virtual_kind(&self, disk: &str) -> Option<&'static str> {
        const KINDS: &[(&str, &str)] = &[
            ("loop", "a loop device (over a file)"),
            ("dm-", "a device-mapper device"),
            ("md", "an md array"),
            ("zram", "a compressed RAM disk"),
            ("ram", "a RAM disk"),
            ("nbd", "a network block device"),
            ("vd", "a virtio virtual disk"),
            ("xvd", "a Xen virtual disk"),
            ("rbd", "a Ceph RBD device"),
        ];
        KINDS
            .iter()
            .find(|(p, _)| {
                disk.strip_prefix(p)
                    .is_some_and(|r| r.chars().next().is_some_and(|c| c.is_ascii_alphanumeric()))
            })
            .map(|(_, k)| *k)
    }

    /// The device's directory that holds its identity (`device/` for SCSI and NVMe
    /// namespaces' controllers).
    fn device_dir(&self, disk: &str) -> PathBuf {
        self.block(disk).join("device")
    }

    /// A stable identity for a whole disk.
    pub fn identity(&self, disk: &str) -> Identity {
        let b = self.block(disk);
        let d = self.device_dir(disk);
        let wwn = read_trim(&d.join("wwid"))
            .or_else(|| read_trim(&b.join("wwid")))
            .or_else(|| read_trim(&d.join("wwn")));
        let serial = read_trim(&d.join("serial")).or_else(|| vpd_serial(&d.join("vpd_pg80")));
        let model = read_trim(&d.join("model"));
        Identity {
            kernel_name: Some(disk.to_string()),
            wwn,
            serial,
            model,
            by_id: self.by_id(disk),
            shared_drive: None,
            actuators: self.actuators(disk),
        }
    }

    /// A /dev/disk/by-id link to the disk: `wwn-` first, then `nvme-eui.`, then any.
    pub fn by_id(&self, disk: &str) -> Option<String> {
        let dir = self.path("dev/disk/by-id");
        let mut links: Vec<String> = dir_names(&dir)
            .into_iter()
            .filter(|n| {
                std::fs::read_link(dir.join(n))
                    .ok()
                    .and_then(|t| t.file_name().map(|f| f == disk))
                    .unwrap_or(false)
            })
            .collect();
        let rank = |n: &String| {
            if n.starts_with("wwn-") {
                0
            } else if n.starts_with("nvme-eui.") {
                1
            } else {
                2
            }
        };
        links.sort_by_key(|n| (rank(n), n.clone()));
        links
            .into_iter()
            .next()
            .map(|n| format!("/dev/disk/by-id/{n}"))
    }

    /// Independent access ranges (actuators) the device reports, where more than one.
    pub fn actuators(&self, disk: &str) -> Option<u32> {
        let n = dir_names(&self.block(disk).join("queue/independent_access_ranges"))
            .iter()
            .filter(|n| n.parse::<u32>().is_ok())
            .count() as u32;
        (n > 1).then_some(n)
    }

    /// The SCSI address (host:channel:target:lun) of the disk, from its `device` link.
    pub fn scsi_address(&self, disk: &str) -> Option<[u32; 4]> {
        let real = std::fs::canonicalize(self.device_dir(disk)).ok()?;
        let n = real.file_name()?.to_string_lossy().into_owned();
        let v: Vec<u32> = n.split(':').filter_map(|x| x.parse().ok()).collect();
        <[u32; 4]>::try_from(v).ok()
    }

    /// Where the disk sits: an enclosure slot (SES), or the PCIe slot of an NVMe drive.
    pub fn location(&self, disk: &str) -> Option<(Location, LedFiles)> {
        self.enclosure_slot(disk).or_else(|| self.pci_slot(disk))
    }

    fn enclosure_slot(&self, disk: &str) -> Option<(Location, LedFiles)> {
        let encs = self.path("sys/class/enclosure");
        for enc in dir_names(&encs) {
            let e = encs.join(&enc);
            for comp in dir_names(&e) {
                let c = e.join(&comp);
                if !c.join("device/block").join(disk).exists() {
                    continue;
                }
                let file = |n: &str| Some(c.join(n)).filter(|p| p.exists());
                let leds = LedFiles {
                    locate: file("locate"),
                    fault: file("fault"),
                };
                let slot = read_trim(&c.join("slot")).unwrap_or(comp.clone());
                return Some((
                    Location {
                        enclosure: enc.clone(),
                        enclosure_id: read_trim(&e.join("id")),
                        slot,
                        led: leds.locate.is_some(),
                    },
                    leds,
                ));
            }
        }
        None
    }

    /// An NVMe drive's PCIe slot: /sys/bus/pci/slots/N/address names the drive's PCI
    /// device (domain:bus:device), which its namespace's sysfs path passes through.
    fn pci_slot(&self, disk: &str) -> Option<(Location, LedFiles)> {
        if !disk.starts_with("nvme") {
            return None;
        }
        let link = std::fs::read_link(self.block(disk)).ok()?;
        let link = link.to_string_lossy();
        let slots = self.path("sys/bus/pci/slots");
        for slot in dir_names(&slots) {
            let Some(addr) = read_trim(&slots.join(&slot).join("address")) else {
                continue;
            };
            if link.split('/').any(|c| c.starts_with(&format!("{addr}."))) {
                let attention = Some(slots.join(&slot).join("attention")).filter(|p| p.exists());
                return Some((
                    Location {
                        enclosure: "pci".into(),
                        enclosure_id: None,
                        slot,
                        led: attention.is_some(),
                    },
                    LedFiles {
                        locate: attention,
                        fault: None,
                    },
                ));
            }
        }
        None
    }

    /// The LED files of a slot known by its location (its disk may be gone).
    pub fn slot_leds(&self, loc: &Location) -> Option<LedFiles> {
        if loc.enclosure == "pci" {
            let a = self
                .path("sys/bus/pci/slots")
                .join(&loc.slot)
                .join("attention");
            let there = a.exists();
            return there.then_some(LedFiles {
                locate: Some(a),
                fault: None,
            });
        }
        let e = self.path("sys/class/enclosure").join(&loc.enclosure);
        dir_names(&e).into_iter().find_map(|comp| {
            let c = e.join(&comp);
            let slot = read_trim(&c.join("slot")).unwrap_or(comp.clone());
            if slot != loc.slot {
                return None;
            }
            let file = |n: &str| Some(c.join(n)).filter(|p| p.exists());
            Some(LedFiles {
                locate: file("locate"),
                fault: file("fault"),
            })
        })
    }

    /// Which of the given whole disks are halves of one physical drive (a dual-actuator
    /// drive presented as two LUNs): the same serial, or the same WWN but for its last
    /// digit on one SCSI target. Returns each such disk with the drive's key (shared by
    /// its halves); disks alone on their drive are left out.
    pub fn shared_drives(&self, disks: &[String]) -> BTreeMap<String, String> {
        let mut by_key: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for d in disks {
            let id = self.identity(d);
            let key = if let Some(s) = id.serial.as_deref() {
                Some(format!("serial:{s}"))
            } else {
                match (id.wwn.as_deref(), self.scsi_address(d)) {
                    (Some(w), Some([h, c, t, _])) if w.len() > 1 => {
                        Some(format!("wwn:{}*@{h}:{c}:{t}", &w[..w.len() - 1]))
                    }
                    _ => None,
                }
            };
            if let Some(k) = key {
                let v = by_key.entry(k).or_default();
                if !v.contains(d) {
                    v.push(d.clone());
                }
            }
        }
        let mut out = BTreeMap::new();
        for (k, v) in by_key {
            if v.len() > 1 {
                for d in v {
                    out.insert(d, k.clone());
                }
            }
        }
        out
    }
}

/// The unit serial number from a raw VPD page 0x80 (4 header bytes, then ASCII).
fn vpd_serial(p: &Path) -> Option<String> {
    let b = std::fs::read(p).ok()?;
    if b.len() < 4 || b[1] != 0x80 {
        return None;
    }
    let n = (u16::from_be_bytes([b[2], b[3]]) as usize).min(b.len() - 4);
    let s = String::from_utf8_lossy(&b[4..4 + n]).trim().to_string();
    (!s.is_empty()).then_some(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn virtual_kinds_by_name() {
        let s = Sysfs::new("/nonexistent");
        assert!(s.virtual_kind("vda").is_some());
        assert!(s.virtual_kind("loop3").is_some());
        assert!(s.virtual_kind("sda").is_none());
        assert!(s.virtual_kind("nvme0n1").is_none());
        assert!(s.virtual_kind("md127").is_some());
    }
}
