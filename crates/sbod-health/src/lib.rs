//! A member's disk as the operator sees it (issue 28): its SMART health ([`smart`]), where
//! it sits and a stable name for it ([`sysfs`]), its locate and fault LEDs ([`led`]), and
//! disks arriving and leaving ([`hotplug`]). No dependency on the engine: the management
//! layer asks, the engine never waits on a disk's health.

pub mod hotplug;
pub mod led;
pub mod smart;
pub mod sysfs;

use sbod_types::{Health, HealthPolicy, Identity, Location};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// What a member path is, for health's purposes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemberKind {
    /// A block device the kernel lists: its whole disk's kernel name.
    Disk { disk: String },
    /// A regular file.
    File,
    /// A member on another host (an NBD URI).
    Remote,
    /// Not there.
    Missing,
}

/// Reads members' disks: sysfs (identity, slot) and smartctl (health).
#[derive(Clone, Debug, Default)]
pub struct Reader {
    pub sysfs: sysfs::Sysfs,
    pub smartctl: smart::Smartctl,
    /// Run smartctl on file members too (`SBOD_SMARTCTL_FILES=1`): for tests, with a
    /// stand-in smartctl (`SBOD_SMARTCTL`) that answers for files as a disk would.
    pub smartctl_on_files: bool,
}

/// A remote member's path (the NBD URIs sbod accepts).
pub fn is_remote(path: &str) -> bool {
    path.starts_with("nbd://") || path.starts_with("nbds://") || path.starts_with("nbd+")
}

impl Reader {
    /// The host's sysfs (or `SBOD_SYSFS_ROOT`) and smartctl (or `SBOD_SMARTCTL`).
    pub fn from_env() -> Reader {
        Reader {
            sysfs: sysfs::Sysfs::from_env(),
            smartctl: smart::Smartctl::default(),
            smartctl_on_files: std::env::var_os("SBOD_SMARTCTL_FILES").is_some_and(|v| v == "1"),
        }
    }

    pub fn kind(&self, path: &str) -> MemberKind {
        if is_remote(path) {
            return MemberKind::Remote;
        }
        if let Some(name) = self.sysfs.kernel_name(path) {
            return MemberKind::Disk {
                disk: self.sysfs.whole_disk(&name),
            };
        }
        match std::fs::metadata(self.sysfs.path(path)) {
            Ok(m) if m.is_file() => MemberKind::File,
            Ok(_) => MemberKind::Disk {
                // A device node sysfs does not list (a container's /dev): its own name.
                disk: Path::new(path)
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
            },
            Err(_) => MemberKind::Missing,
        }
    }

    /// The disk's stable identity and slot (cheap: sysfs only). None for files and
    /// remote members.
    pub fn place(&self, path: &str) -> (Option<Identity>, Option<Location>) {
        match self.kind(path) {
            MemberKind::Disk { disk } => {
                let id = self.sysfs.identity(&disk);
                let loc = self.sysfs.location(&disk).map(|(l, _)| l);
                (Some(id), loc)
            }
            _ => (None, None),
        }
    }

    /// Read a member's health now (smartctl on its whole disk), or say why it cannot be.
    /// A remote member's is what its host's `sbod export` read there (see [`remote`]).
    pub fn health(&self, path: &str, policy: &HealthPolicy) -> Health {
        match self.kind(path) {
            MemberKind::Remote => remote(path, policy),
            MemberKind::File if self.smartctl_on_files => {
                self.smartctl.read(Path::new(path), policy)
            }
            MemberKind::File => {
                Health::unavailable("a file: its health is that of the disk under its file system")
            }
            MemberKind::Missing => Health::unavailable(format!("{path} is not there")),
            MemberKind::Disk { disk } => {
                let dev = if self.sysfs.root() == Path::new("/") {
                    format!("/dev/{disk}")
                } else {
                    path.to_string()
                };
                let mut h = self.smartctl.read(Path::new(&dev), policy);
                if h.verdict == sbod_types::HealthVerdict::Unavailable {
                    if let Some(k) = self.sysfs.virtual_kind(&disk) {
                        h.reasons.insert(0, format!("{dev} is {k}"));
                    }
                }
                h
            }
        }
    }
}

/// Where `sbod export` puts its disk's health in an export's description: after this
/// mark, the reading as JSON (a [`Health`]).
pub const EXPORT_HEALTH_MARK: &str = "; health: ";

/// An export's description with its disk's health (what `sbod export` advertises).
pub fn export_description(path: &str, health: Option<&Health>) -> String {
    match health.and_then(|h| serde_json::to_string(h).ok()) {
        Some(j) => format!("sbod export of {path}{EXPORT_HEALTH_MARK}{j}"),
        None => format!("sbod export of {path}"),
    }
}

/// The health in an export's description, if it carries one.
pub fn health_in_description(desc: &str) -> Option<Health> {
    let (_, j) = desc.split_once(EXPORT_HEALTH_MARK)?;
    serde_json::from_str(j).ok()
}

/// A remote member's health: its host's `sbod export` reads its disk (smartctl there) and
/// says it in the export's description, asked here (NBD_OPT_INFO, within 5 s) and judged
/// by this array's policy. Any other server, or one that does not answer: not available,
/// with the reason.
pub fn remote(path: &str, policy: &HealthPolicy) -> Health {
    let uri = match sbod_nbd::NbdUri::parse(path) {
        Ok(u) => u,
        Err(e) => return Health::unavailable(format!("{path}: {e}")),
    };
    let desc = match sbod_nbd::client::describe_blocking(&uri, Duration::from_secs(5)) {
        Ok(d) => d,
        Err(e) => {
            return Health::unavailable(format!(
                "a remote member whose host did not say its disk's health: {e}"
            ))
        }
    };
    match desc.as_deref().and_then(health_in_description) {
        Some(h) => {
            let mut h = smart::rejudge(&h, policy);
            h.reasons
                .push("read on the member's host by `sbod export`".to_string());
            h
        }
        None => Health::unavailable(
            "a remote member: its server does not report its disk's health (`sbod export` \
             does; `sbod health` on its host)",
        ),
    }
}

/// Health readings kept for a while: a status shown every second must not run smartctl
/// every second (nor wake sleeping disks).
#[derive(Default)]
pub struct Cache {
    map: Mutex<HashMap<String, (Instant, Health)>>,
}

impl Cache {
    /// The reading of `path` if younger than `max_age`, else a new one.
    pub fn get(
        &self,
        reader: &Reader,
        path: &str,
        policy: &HealthPolicy,
        max_age: Duration,
    ) -> Health {
        if let Some((t, h)) = self.map.lock().unwrap().get(path) {
            if t.elapsed() < max_age {
                return smart::rejudge(h, policy);
            }
        }
        let h = reader.health(path, policy);
        self.map
            .lock()
            .unwrap()
            .insert(path.to_string(), (Instant::now(), h.clone()));
        h
    }
}

/// The failure domain each member gets by default for being half of a dual-actuator drive
/// (two LUNs of one physical drive: one drive failing takes both): `drive:SERIAL` (or
/// the WWN base) for those that share a drive with another member, None for the others.
pub fn drive_domains(reader: &Reader, members: &[String]) -> Vec<Option<String>> {
    let disks: Vec<Option<String>> = members
        .iter()
        .map(|m| match reader.kind(m) {
            MemberKind::Disk { disk } => Some(disk),
            _ => None,
        })
        .collect();
    let known: Vec<String> = disks.iter().flatten().cloned().collect();
    let shared = reader.sysfs.shared_drives(&known);
    disks
        .iter()
        .map(|d| Some(drive_label(shared.get(d.as_ref()?)?)))
        .collect()
}

/// A dual-actuator drive's failure domain label from its key in
/// [`sysfs::Sysfs::shared_drives`]: `drive:SERIAL` (or the WWN base).
fn drive_label(key: &str) -> String {
    format!("drive:{}", key.strip_prefix("serial:").unwrap_or(key))
}

/// What a device joining an array (`sbod add`, `replace`, `grow --add`) without a failure
/// domain of its own gets for being one LUN of a dual-actuator drive.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Joining {
    /// It shares no drive with a member or with another device joining: as asked.
    Alone,
    /// It shares a drive: this failure domain (the member's on that drive, as recorded;
    /// or `drive:SERIAL` with another device joining beside it), and why, in words.
    Domain { domain: String, why: String },
    /// It shares a drive with a member that has no failure domain recorded: nothing
    /// keeps the two apart (why, in words).
    Undomained { partner: String, why: String },
}

/// For each device joining, whether it is the other LUN of a dual-actuator drive that a
/// member (`members`: path and recorded failure domain) or another joining device is on,
/// and the failure domain it must then have: the partner's, since one drive failing takes
/// both (what `create` does with [`drive_domains`], for the members that come later).
pub fn joining_domains(
    reader: &Reader,
    members: &[(String, String)],
    joining: &[String],
) -> Vec<Joining> {
    let disk_of = |p: &str| match reader.kind(p) {
        MemberKind::Disk { disk } => Some(disk),
        _ => None,
    };
    let member_disks: Vec<Option<String>> = members.iter().map(|(p, _)| disk_of(p)).collect();
    let joining_disks: Vec<Option<String>> = joining.iter().map(|p| disk_of(p)).collect();
    let all: Vec<String> = member_disks
        .iter()
        .chain(&joining_disks)
        .flatten()
        .cloned()
        .collect();
    let shared = reader.sysfs.shared_drives(&all);
    joining
        .iter()
        .zip(&joining_disks)
        .map(|(j, d)| {
            let Some(d) = d else { return Joining::Alone };
            // A member's own disk (a former member given back): its recorded domain stands.
            if member_disks.iter().flatten().any(|md| md == d) {
                return Joining::Alone;
            }
            let Some(key) = shared.get(d) else {
                return Joining::Alone;
            };
            let label = drive_label(key);
            let partners: Vec<(&String, &String)> = members
                .iter()
                .zip(&member_disks)
                .filter(|(_, md)| md.as_ref().is_some_and(|md| md != d && shared.get(md) == Some(key)))
                .map(|((p, dom), _)| (p, dom))
                .collect();
            if let Some((p, dom)) = partners.iter().find(|(_, dom)| !dom.is_empty()) {
                return Joining::Domain {
                    domain: dom.to_string(),
                    why: format!(
                        "{j} and member {p} are two LUNs of one dual-actuator drive ({label}): one drive failing takes both, so {j} joins {p}'s failure domain '{dom}'"
                    ),
                };
            }
            if let Some((p, _)) = partners.first() {
                return Joining::Undomained {
                    partner: p.to_string(),
                    why: format!(
                        "{j} and member {p} are two LUNs of one dual-actuator drive ({label}): one drive failing takes both, and {p} has no failure domain recorded to keep them apart"
                    ),
                };
            }
            let beside = joining
                .iter()
                .zip(&joining_disks)
                .any(|(o, od)| o != j && od.as_ref().is_some_and(|od| od != d && shared.get(od) == Some(key)));
            if beside {
                return Joining::Domain {
                    domain: label.clone(),
                    why: format!(
                        "{j} is one LUN of a dual-actuator drive ({label}) another device joining with it is on: failure domain '{label}'"
                    ),
                };
            }
            Joining::Alone
        })
        .collect()
}
