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
    save(&of_array(array, name))
}

/// The registration of an open array's current members, as `name` (its own name if None):
/// what [`save_array`] writes.
pub fn of_array(array: &Array, name: Option<&str>) -> Registry {
    let name = name.unwrap_or(array.name());
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
    Registry {
        name: name.to_string(),
        uuid: array.uuid.to_string(),
        members,
        failed,
        uuids,
        logs,
    }
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

/// Write atomically (temp file + rename). A write that fails leaves nothing behind: the
/// old registration stays, and the temp file goes.
pub fn save(r: &Registry) -> Result<()> {
    reserve(&r.name)?.commit(r)
}

/// Room for the registration of one array, taken before a verb changes anything: a temp
/// file in the state directory, as large as the registration may grow, written and
/// synced. A verb that cannot have it (the state directory is full, read-only, not
/// ours) stops there, having changed nothing. [`Reserved::commit`] then writes the new
/// registration over that room (no new space is needed) and renames it into place;
/// dropped without a commit, the temp file is removed.
pub struct Reserved {
    dir: PathBuf,
    name: String,
    tmp: PathBuf,
    file: Option<std::fs::File>,
    room: u64,
}

/// Bytes kept for a registration: twice the present one (it may grow by members given
/// back, added, or failed and remembered) and some more for a first one.
fn room_for(present: u64) -> u64 {
    2 * present + 16 * 1024
}

/// Take room for `name`'s registration (see [`Reserved`]); the room may be committed for
/// another name (an array assembled without one takes the name in its superblocks).
pub fn reserve(name: &str) -> Result<Reserved> {
    check_name(name)?;
    reserve_in(&arrays_dir(), name)
}

/// [`reserve`] in the folder `dir` (the state directory's `arrays/`).
fn reserve_in(dir: &Path, name: &str) -> Result<Reserved> {
    let dir = dir.to_path_buf();
    std::fs::create_dir_all(&dir).map_err(|e| nothing_changed(&dir, "creating", e))?;
    let present = std::fs::metadata(dir.join(format!("{name}.json")))
        .map(|m| m.len())
        .unwrap_or(0);
    let room = room_for(present);
    remove_orphans(&dir, name);
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!(".{name}.json.{}.{seq}.tmp", std::process::id()));
    let mut r = Reserved {
        dir: dir.clone(),
        name: name.to_string(),
        tmp: tmp.clone(),
        file: None,
        room,
    };
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .map_err(|e| nothing_changed(&tmp, "creating", e))?;
    r.file = Some(f);
    // Spaces: the JSON written over them later may end in whitespace.
    let fill = vec![b' '; room as usize];
    let f = r.file.as_mut().expect("just opened");
    use std::io::Write;
    f.write_all(&fill)
        .and_then(|()| f.sync_all())
        .map_err(|e| nothing_changed(&tmp, "writing", e))?;
    Ok(r)
}

/// Temp files of `name` left by a process that died between taking room and recording
/// (SIGKILL): removed. The process id is in the name; one still alive keeps its own.
fn remove_orphans(dir: &Path, name: &str) {
    let prefix = format!(".{name}.json.");
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let n = e.file_name().to_string_lossy().to_string();
        let Some(rest) = n.strip_prefix(&prefix).and_then(|r| r.strip_suffix(".tmp")) else {
            continue;
        };
        let pid = rest.split('.').next().and_then(|p| p.parse::<u32>().ok());
        if let Some(pid) = pid {
            if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

impl Reserved {
    /// Write `reg` (the registration of the array this room was taken for) and put it in
    /// place.
    pub fn commit(mut self, reg: &Registry) -> Result<()> {
        use std::io::{Seek, Write};
        let text = serde_json::to_vec_pretty(reg)?;
        self.name = reg.name.clone();
        let mut f = self.file.take().expect("a reservation commits once");
        // Over the room already allocated; a registration larger than the room (many
        // members at once) needs more space, which the file system may still have.
        if text.len() as u64 > self.room {
            tracing::debug!("registration of {} outgrows its room", self.name);
        }
        f.seek(std::io::SeekFrom::Start(0))
            .and_then(|_| f.write_all(&text))
            .and_then(|()| f.set_len(text.len() as u64))
            .and_then(|()| f.sync_all())
            .map_err(|e| state_dir_error(&self.tmp, "writing", e))?;
        drop(f);
        let p = self.dir.join(format!("{}.json", self.name));
        std::fs::rename(&self.tmp, &p).map_err(|e| state_dir_error(&p, "writing", e))?;
        // The rename is durable once the directory is synced (best effort: it may not
        // open for reading on every file system).
        if let Ok(d) = std::fs::File::open(&self.dir) {
            let _ = d.sync_all();
        }
        Ok(())
    }
}

impl Drop for Reserved {
    fn drop(&mut self) {
        // Not committed (or the commit failed): the temp file goes.
        let _ = std::fs::remove_file(&self.tmp);
    }
}

/// An error of the state directory: which, and what the person can do (free space, make
/// it writable). Its kind is `Io`.
fn state_dir_error(p: &Path, what: &str, e: std::io::Error) -> anyhow::Error {
    state_dir_error_then(p, what, e, "")
}

/// [`state_dir_error`] before anything was changed: says so.
fn nothing_changed(p: &Path, what: &str, e: std::io::Error) -> anyhow::Error {
    state_dir_error_then(p, what, e, "; nothing was changed")
}

fn state_dir_error_then(p: &Path, what: &str, e: std::io::Error, then: &str) -> anyhow::Error {
    let dir = state_dir();
    let fix = match e.raw_os_error() {
        Some(libc::ENOSPC) | Some(libc::EDQUOT) => format!("free space in {}", dir.display()),
        Some(libc::EROFS) => format!(
            "mount {} read-write (or set SBOD_STATE_DIR to a writable directory)",
            dir.display()
        ),
        Some(libc::EACCES) | Some(libc::EPERM) => format!(
            "run as a user who may write to {} (or set SBOD_STATE_DIR)",
            dir.display()
        ),
        _ => format!("check the file system of {}", dir.display()),
    };
    crate::error::err_advised(
        ErrorKind::Io,
        format!(
            "the state directory {} cannot record the array ({what} {}: {e}){then}",
            dir.display(),
            p.display()
        ),
        vec![sbod_types::Step::say(fix)],
    )
}

pub fn forget(name: &str) -> Result<()> {
    let p = registry_path(name);
    match std::fs::remove_file(&p) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(nothing_changed(&p, "removing", e)),
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// A small tmpfs, unmounted when the test ends (also on failure).
    struct Tmpfs(tempfile::TempDir);

    impl Drop for Tmpfs {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(self.0.path()).status();
        }
    }

    fn temp_files(dir: &Path) -> Vec<String> {
        std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().to_string())
            .filter(|n| n.ends_with(".tmp"))
            .collect()
    }

    /// The room taken before a verb is enough to record it after, though the file system
    /// filled up in between; and with the file system full, no room is taken and nothing
    /// is left behind.
    #[test]
    fn room_taken_before_the_disk_fills_still_records() {
        let t = Tmpfs(tempfile::tempdir().unwrap());
        let o = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=1M", "tmpfs"])
            .arg(t.0.path())
            .output()
            .expect("mount is installed");
        assert!(
            o.status.success(),
            "this test mounts a tmpfs: run it as root ({})",
            String::from_utf8_lossy(&o.stderr)
        );
        let dir = t.0.path().join("arrays");
        std::fs::create_dir_all(&dir).unwrap();
        // A temp file left by a process that died (no such pid) goes at the next reserve.
        let orphan = dir.join(format!(".v.json.{}.0.tmp", u32::MAX - 1));
        std::fs::write(&orphan, b"  ").unwrap();
        let room = reserve_in(&dir, "v").unwrap();
        assert!(!orphan.exists(), "an orphaned temp file stays");
        // Fill the file system.
        {
            use std::io::Write;
            let mut f = std::fs::File::create(t.0.path().join("filler")).unwrap();
            while f.write_all(&[7u8; 4096]).is_ok() {}
        }
        // Negative control: it really is full.
        assert!(std::fs::write(t.0.path().join("probe"), [1u8; 4096]).is_err());
        let reg = Registry {
            name: "v".into(),
            uuid: "u".repeat(36),
            members: (0..16)
                .map(|i| format!("/dev/disk/by-id/member-{i:04}"))
                .collect(),
            failed: Vec::new(),
            uuids: Default::default(),
            logs: Vec::new(),
        };
        room.commit(&reg)
            .expect("the room taken before holds the record");
        let back: Registry =
            serde_json::from_slice(&std::fs::read(dir.join("v.json")).unwrap()).unwrap();
        assert_eq!(back, reg);
        assert_eq!(temp_files(&dir), Vec::<String>::new());
        // Full: no room is taken, the error says so and what to do, nothing is left.
        let e = reserve_in(&dir, "v")
            .err()
            .expect("a full file system has no room");
        let text = crate::words::message(&e, crate::words::Style::Cli);
        assert!(
            text.contains("nothing was changed") && text.contains("free space"),
            "{text}"
        );
        assert_eq!(temp_files(&dir), Vec::<String>::new());
        assert_eq!(
            back,
            serde_json::from_slice::<Registry>(&std::fs::read(dir.join("v.json")).unwrap())
                .unwrap()
        );
    }
}
