//! Where sbod keeps its state: which members make up each named array, and where a running
//! array's control socket listens. `SBOD_STATE_DIR` overrides the location (tests use it).

use anyhow::{bail, Context, Result};
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

    /// Members to look for at assembly: those in service, and missing ones.
    pub fn to_open(&self) -> Vec<String> {
        let mut v = self.members.clone();
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

pub fn socket_path(name: &str) -> PathBuf {
    run_dir().join(format!("{name}.sock"))
}

fn registry_path(name: &str) -> PathBuf {
    arrays_dir().join(format!("{name}.json"))
}

pub fn load(name: &str) -> Result<Registry> {
    let p = registry_path(name);
    let text = std::fs::read_to_string(&p).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            let known = list().unwrap_or_default();
            let hint = if known.is_empty() {
                "no arrays are known here; create one with `sbod create` or assemble one from its members with `sbod assemble NAME MEMBER...`".to_string()
            } else {
                format!("known arrays: {}", known.join(", "))
            };
            anyhow::anyhow!("no array named '{name}' ({hint}; state directory {})", state_dir().display())
        } else {
            anyhow::anyhow!("reading {}: {e}", p.display())
        }
    })?;
    serde_json::from_str(&text).with_context(|| format!("{} is damaged", p.display()))
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
    let abs = std::fs::canonicalize(p).with_context(|| format!("{}", p.display()))?;
    Ok(abs.to_string_lossy().to_string())
}
