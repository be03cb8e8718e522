//! Where sbod keeps its state: which members make up each named array, and where a running
//! array's control socket listens. `SBOD_STATE_DIR` overrides the location (tests use it).
//! The registry's policy (what is recorded when, which failed members are remembered) lives
//! here and nowhere else.

use crate::error::{err, ErrorKind};
use anyhow::{bail, Context, Result};
use sbod_core::superblock::{OutReason, SlotState};
use sbod_core::Array;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

pub fn state_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("SBOD_STATE_DIR") {
        return PathBuf::from(d);
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return PathBuf::from("/var/lib/sbod");
    }
    if let Some(d) = std::env::var_os("XDG_STATE_HOME") {
        return PathBuf::from(d).join("sbod");
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    home.join(".local/state/sbod")
}

/// The record of one array.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Registry {
    pub name: String,
    pub uuid: String,
    /// Members the array relies on (active, rebuilding, replacing, spares).
    pub members: Vec<String>,
    /// Members that failed; kept for the record, not opened at assembly (except missing
    /// ones: those are looked for again, and recovered when back).
    #[serde(default)]
    pub failed: Vec<FailedMember>,
    /// The member uuid of each path in `members`, to name a member that goes missing.
    #[serde(default)]
    pub uuids: std::collections::BTreeMap<String, String>,
    /// Log devices (opened with the members at assembly, which tells them apart).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub logs: Vec<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct FailedMember {
    pub path: String,
    pub uuid: String,
    /// Not there when the array was started (`--degraded`): opened again when present.
    #[serde(default)]
    pub missing: bool,
}

impl Registry {
    /// The uuid of a failed member named by path (the engine no longer has it open).
    pub fn failed_uuid(&self, path: &str) -> Option<String> {
        self.failed
            .iter()
            .find(|f| f.path == path)
            .map(|f| f.uuid.clone())
    }

    /// The path of a member known by uuid: a failed or missing one, or one in service.
    pub fn failed_path(&self, uuid: &str) -> Option<String> {
        self.failed
            .iter()
            .find(|f| f.uuid == uuid)
            .map(|f| f.path.clone())
            .or_else(|| {
                self.uuids
                    .iter()
                    .find(|(_, u)| u.as_str() == uuid)
                    .map(|(p, _)| p.clone())
            })
    }

    /// Devices to look for at assembly: members in service, missing ones, log devices.
    pub fn to_open(&self) -> Vec<String> {
        let mut v = self.members.clone();
        for l in &self.logs {
            if !v.contains(l) {
                v.push(l.clone());
            }
        }
        for f in self.failed.iter().filter(|f| f.missing) {
            if !v.contains(&f.path) {
                v.push(f.path.clone());
            }
        }
        v
    }
}

fn arrays_dir() -> PathBuf {
    state_dir().join("arrays")
}

pub fn run_dir() -> PathBuf {
    state_dir().join("run")
}

/// Array names become file names: keep them to what is safe there (and in URLs).
pub fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with(['.', '-'])
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if !ok {
        return Err(err(
            ErrorKind::Invalid,
            format!(
                "'{name}' is not a usable array name: use up to 64 letters, digits, '-', '_' or \
                 '.', not starting with '.' or '-'"
            ),
        ));
    }
    Ok(())
}

pub fn socket_path(name: &str) -> PathBuf {
    run_dir().join(format!("{name}.sock"))
}

fn registry_path(name: &str) -> PathBuf {
    arrays_dir().join(format!("{name}.json"))
}

pub fn load(name: &str) -> Result<Registry> {
    check_name(name)?;
    let p = registry_path(name);
    let text = std::fs::read_to_string(&p).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            let known = list().unwrap_or_default();
            let hint = if known.is_empty() {
                "no arrays are known here; create one with `sbod create` or assemble one from its members with `sbod assemble NAME MEMBER...`".to_string()
            } else {
                format!("known arrays: {}", known.join(", "))
            };
            err(
                ErrorKind::NotFound,
                format!(
                    "no array named '{name}' ({hint}; state directory {})",
                    state_dir().display()
                ),
            )
        } else {
            anyhow::anyhow!("reading {}: {e}", p.display())
        }
    })?;
    serde_json::from_str(&text).with_context(|| format!("{} is damaged", p.display()))
}

/// Record an open array's current members, as `name` (its own name if None).
pub fn save_array(array: &Array, name: Option<&str>) -> Result<()> {
    let name = name.unwrap_or(&array.name);
    let st = array.state();
    let prev = load(name).ok();
    let mut failed = Vec::new();
    for s in &st.slots {
        if s.state == SlotState::Failed {
            let missing = s.out.is_some_and(|o| o.reason == OutReason::Missing);
            match (&s.member, &s.entry) {
                (Some(m), _) => failed.push(FailedMember {
                    path: m.path.clone(),
                    uuid: m.uuid.to_string(),
                    missing,
                }),
                (None, Some(e)) => {
                    // A member not here: keep the path it had, to look for it again.
                    let uuid = e.uuid.to_string();
                    if let Some(path) = prev.as_ref().and_then(|r| r.failed_path(&uuid)) {
                        failed.push(FailedMember {
                            path,
                            uuid,
                            missing,
                        });
                    }
                }
                _ => {}
            }
        }
    }
    let live = st.live_members();
    let members: Vec<String> = live.iter().map(|m| m.path.clone()).collect();
    let uuids = live
        .iter()
        .map(|m| (m.path.clone(), m.uuid.to_string()))
        .collect();
    // Keep earlier failures while their slot still records them.
    let recorded: Vec<String> = st
        .slots
        .iter()
        .filter_map(|s| s.entry.as_ref().map(|e| e.uuid.to_string()))
        .collect();
    // Log devices: those open now; while the array records one that is not (missing),
    // the ones registered before are kept, to look for them again.
    let mut logs = array.log_paths();
    let recorded_logs = array.log_status().map(|l| l.devices.len()).unwrap_or(0);
    if logs.len() < recorded_logs {
        for p in prev.as_ref().map(|r| r.logs.clone()).unwrap_or_default() {
            if !logs.contains(&p) {
                logs.push(p);
            }
        }
    }
    let mut prev_failed = prev.map(|r| r.failed).unwrap_or_default();
    prev_failed.retain(|f| {
        !members.contains(&f.path)
            && recorded.contains(&f.uuid)
            && !failed.iter().any(|x| x.uuid == f.uuid)
    });
    failed.extend(prev_failed);
    save(&Registry {
        name: name.to_string(),
        uuid: array.uuid.to_string(),
        members,
        failed,
        uuids,
        logs,
    })
}

/// Name a member the way the engine knows it: an absolute path, or the uuid of a failed
/// member that is no longer open.
pub fn member_ref(name: &str, p: &str) -> String {
    let abs = crate::members::canonical(p).unwrap_or_else(|_| p.to_string());
    if let Ok(reg) = load(name) {
        if let Some(u) = reg.failed_uuid(&abs) {
            return u;
        }
    }
    abs
}

pub fn exists(name: &str) -> bool {
    registry_path(name).exists()
}

/// Write atomically (temp file + rename).
pub fn save(r: &Registry) -> Result<()> {
    let dir = arrays_dir();
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let p = registry_path(&r.name);
    let tmp = dir.join(format!(".{}.json.tmp", r.name));
    std::fs::write(&tmp, serde_json::to_vec_pretty(r)?)
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, &p).with_context(|| format!("writing {}", p.display()))?;
    Ok(())
}

pub fn forget(name: &str) -> Result<()> {
    let p = registry_path(name);
    match std::fs::remove_file(&p) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => bail!("removing {}: {e}", p.display()),
    }
}

pub fn list() -> Result<Vec<String>> {
    let mut v = Vec::new();
    let dir = arrays_dir();
    let rd = match std::fs::read_dir(&dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(v),
        Err(e) => bail!("reading {}: {e}", dir.display()),
    };
    for e in rd.flatten() {
        let n = e.file_name().to_string_lossy().to_string();
        if let Some(name) = n.strip_suffix(".json") {
            if !name.starts_with('.') {
                v.push(name.to_string());
            }
        }
    }
    v.sort();
    Ok(v)
}

/// An absolute path for a member, so the registry works from any directory.
pub fn absolute(p: &Path) -> Result<String> {
    let abs = std::fs::canonicalize(p).map_err(|e| {
        let kind = if e.kind() == std::io::ErrorKind::NotFound {
            ErrorKind::Invalid
        } else {
            ErrorKind::Io
        };
        err(kind, format!("{}: {e}", p.display()))
    })?;
    Ok(abs.to_string_lossy().to_string())
}

/// This host as the members' owner blocks name it (see docs/RELIABILITY.md, "Two heads"):
/// an id kept in the state directory (`hostid`, made on first use: two sbods with their own
/// state directories are two hosts), this machine's host name, and the heartbeat settings
/// (`SBOD_HEARTBEAT_MS`, default 1000; `SBOD_LEASE_INTERVALS`, default 5: a head writes
/// nothing once its last heartbeat is older than that many intervals).
pub fn owner_config() -> Result<sbod_core::owner::Config> {
    let dir = state_dir();
    let path = dir.join("hostid");
    let host = match std::fs::read_to_string(&path) {
        Ok(s) => s.trim().parse::<uuid::Uuid>().with_context(|| {
            format!(
                "{} is damaged: delete it to make a new host id",
                path.display()
            )
        })?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            let id = uuid::Uuid::new_v4();
            // Made whole in a temporary file, then renamed: never a half-written id.
            let tmp = dir.join(format!(".hostid.{}", std::process::id()));
            std::fs::write(&tmp, format!("{id}\n"))
                .with_context(|| format!("writing {}", tmp.display()))?;
            match std::fs::hard_link(&tmp, &path) {
                Ok(()) => {
                    let _ = std::fs::remove_file(&tmp);
                    id
                }
                Err(_) => {
                    // Another sbod made it first: use that one.
                    let _ = std::fs::remove_file(&tmp);
                    std::fs::read_to_string(&path)
                        .with_context(|| format!("reading {}", path.display()))?
                        .trim()
                        .parse()
                        .with_context(|| format!("{} is damaged", path.display()))?
                }
            }
        }
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let num = |var: &str, default: u64| -> Result<u64> {
        match std::env::var(var) {
            Ok(v) => match v.parse::<u64>() {
                Ok(n) if n > 0 => Ok(n),
                _ => bail!("{var}={v}: a whole number above 0 is needed"),
            },
            Err(_) => Ok(default),
        }
    };
    let interval = num(
        "SBOD_HEARTBEAT_MS",
        sbod_core::owner::DEFAULT_INTERVAL.as_millis() as u64,
    )?;
    let multiple = num(
        "SBOD_LEASE_INTERVALS",
        sbod_core::owner::DEFAULT_LEASE_MULTIPLE as u64,
    )?;
    if !(2..=1000).contains(&multiple) {
        bail!("SBOD_LEASE_INTERVALS={multiple}: 2 to 1000 intervals");
    }
    Ok(sbod_core::owner::Config {
        host,
        host_name: sbod_core::owner::host_name(),
        interval: std::time::Duration::from_millis(interval),
        lease_multiple: multiple as u32,
    })
}
