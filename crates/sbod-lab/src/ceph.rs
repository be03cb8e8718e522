//! The lab on a Ceph RBD image: the same life cycle as for an sbod array, on a cluster.
//!
//! NOMINAL measures the image through fio's rbd engine. DEVICE DOWN stops one OSD (a command,
//! `systemctl stop ceph-osd@{id}` by default, or the pid file of a cluster made by
//! scripts/ceph-single-node.sh), marks it out and holds recovery (`norecover`, `nobackfill`)
//! so the phase measures a degraded pool, not its recovery. DEVICE REBUILD starts the OSD
//! again, marks it in and lets recovery and backfill run under the workloads; its progress
//! comes from `ceph status --format json` (degraded and misplaced object copies), its rate
//! from the object copies recovered times their size. The cluster talks through the `ceph`
//! command (ceph-common): the same JSON an operator reads, no binding to librados.

use crate::backend::{ArrayState, Backend};
use crate::fio::Target;
use crate::schema::{ArrayInfo, MemberInfo};
use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// File a cluster made by scripts/ceph-single-node.sh carries in its directory.
pub const SINGLE_NODE_MARKER: &str = ".sbod-ceph-single-node";

/// Which image of which cluster, and how to stop and start an OSD.
#[derive(Clone, Debug, PartialEq)]
pub struct CephTarget {
    pub pool: String,
    pub image: String,
    pub conf: PathBuf,
    pub id: String,
    /// Shell command that stops OSD `{id}` (None: the single-node script's pid file, else
    /// `systemctl stop ceph-osd@{id}`).
    pub osd_stop: Option<String>,
    pub osd_start: Option<String>,
}

impl CephTarget {
    /// Parse `rbd:POOL/IMAGE`.
    pub fn parse(spec: &str, conf: PathBuf, id: String) -> Result<CephTarget> {
        let rest = spec
            .strip_prefix("rbd:")
            .ok_or_else(|| anyhow!("--target {spec}: use rbd:POOL/IMAGE"))?;
        let (pool, image) = rest
            .split_once('/')
            .filter(|(p, i)| !p.is_empty() && !i.is_empty() && !i.contains('/'))
            .ok_or_else(|| anyhow!("--target {spec}: use rbd:POOL/IMAGE"))?;
        Ok(CephTarget {
            pool: pool.into(),
            image: image.into(),
            conf,
            id,
            osd_stop: None,
            osd_start: None,
        })
    }

    /// fio's target for the image (see [`crate::fio::FioJob::command_line`]).
    pub fn fio_uri(&self) -> String {
        rbd_uri(&self.pool, &self.image, &self.conf, &self.id)
    }

    /// The directory of a cluster made by scripts/ceph-single-node.sh, if this is one.
    pub fn single_node_dir(&self) -> Option<PathBuf> {
        let d = self.conf.parent()?;
        d.join(SINGLE_NODE_MARKER).exists().then(|| d.to_path_buf())
    }

    /// What stopping OSD `id` does, in words, for the warning before DEVICE DOWN.
    pub fn stop_text(&self, id: Option<u32>) -> String {
        let id = id.map(|i| i.to_string()).unwrap_or_else(|| "{id}".into());
        match (&self.osd_stop, self.single_node_dir()) {
            (Some(c), _) => format!("runs `{}`", c.replace("{id}", &id)),
            (None, Some(d)) => format!(
                "sends SIGTERM to its daemon in the single-node cluster of {}",
                d.display()
            ),
            (None, None) => format!("runs `systemctl stop ceph-osd@{id}`"),
        }
    }
}

/// `rbd:POOL/IMAGE?conf=PATH&id=ID`: how the lab names an RBD image to fio.
pub fn rbd_uri(pool: &str, image: &str, conf: &Path, id: &str) -> String {
    format!("rbd:{pool}/{image}?conf={}&id={id}", conf.display())
}

/// The parts of an [`rbd_uri`]: (pool, image, conf, id).
pub fn parse_rbd_uri(uri: &str) -> Option<(String, String, String, String)> {
    let rest = uri.strip_prefix("rbd:")?;
    let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (pool, image) = path.split_once('/')?;
    let mut conf = String::new();
    let mut id = "admin".to_string();
    for kv in query.split('&') {
        if let Some(v) = kv.strip_prefix("conf=") {
            conf = v.into();
        } else if let Some(v) = kv.strip_prefix("id=") {
            id = v.into();
        }
    }
    Some((pool.into(), image.into(), conf, id))
}

/// Placement of the image's data: replicated or erasure-coded.
#[derive(Clone, Debug, PartialEq)]
pub enum PoolKind {
    Replicated { size: u32, min_size: u32 },
    Erasure { k: u32, m: u32, min_size: u32 },
}

impl PoolKind {
    pub fn level(&self) -> String {
        match self {
            PoolKind::Replicated { size, .. } => format!("ceph rep:{size}"),
            PoolKind::Erasure { k, m, .. } => format!("ceph ec:{k}+{m}"),
        }
    }
    /// Copies (or shards) of an object.
    pub fn width(&self) -> u32 {
        match self {
            PoolKind::Replicated { size, .. } => *size,
            PoolKind::Erasure { k, m, .. } => k + m,
        }
    }
    /// OSD failures the data survives.
    pub fn redundancy(&self) -> u32 {
        match self {
            PoolKind::Replicated { size, .. } => size.saturating_sub(1),
            PoolKind::Erasure { m, .. } => *m,
        }
    }
    /// Object bytes held by one copy or shard, per object byte.
    pub fn copy_fraction(&self) -> f64 {
        match self {
            PoolKind::Replicated { .. } => 1.0,
            PoolKind::Erasure { k, .. } => 1.0 / (*k).max(1) as f64,
        }
    }
}

/// Recovery as `ceph status --format json` shows it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Recovery {
    pub num_pgs: u64,
    pub clean_pgs: u64,
    /// PGs not active (I/O to them waits).
    pub inactive_pgs: u64,
    /// Object copies missing or misplaced.
    pub dirty_copies: u64,
    pub recovering_bytes_per_sec: f64,
    pub data_bytes: u64,
    pub num_objects: u64,
    pub osds_up: u32,
    pub osds_in: u32,
    pub num_osds: u32,
    pub flags: String,
}

impl Recovery {
    pub fn from_status(v: &Value) -> Recovery {
        let pg = &v["pgmap"];
        let u = |x: &Value| x.as_u64().unwrap_or(0);
        let mut clean = 0;
        let mut inactive = 0;
        if let Some(states) = pg["pgs_by_state"].as_array() {
            for s in states {
                let name = s["state_name"].as_str().unwrap_or("");
                let n = u(&s["count"]);
                let parts: Vec<&str> = name.split('+').collect();
                if parts == ["active", "clean"] {
                    clean += n;
                }
                if !parts.contains(&"active") {
                    inactive += n;
                }
            }
        }
        let om = &v["osdmap"];
        // Pacific nests the counts under osdmap.osdmap; later releases flatten them.
        let om = if om["osdmap"].is_object() {
            &om["osdmap"]
        } else {
            om
        };
        Recovery {
            num_pgs: u(&pg["num_pgs"]),
            clean_pgs: clean,
            inactive_pgs: inactive,
            dirty_copies: u(&pg["degraded_objects"]) + u(&pg["misplaced_objects"]),
            recovering_bytes_per_sec: pg["recovering_bytes_per_sec"].as_f64().unwrap_or(0.0),
            data_bytes: u(&pg["data_bytes"]),
            num_objects: u(&pg["num_objects"]),
            osds_up: u(&om["num_up_osds"]) as u32,
            osds_in: u(&om["num_in_osds"]) as u32,
            num_osds: u(&om["num_osds"]) as u32,
            flags: v["health"]["checks"]["OSDMAP_FLAGS"]["summary"]["message"]
                .as_str()
                .unwrap_or("")
                .to_string(),
        }
    }

    /// Every PG active+clean and every OSD up and in.
    pub fn clean(&self) -> bool {
        self.num_pgs > 0
            && self.clean_pgs == self.num_pgs
            && self.osds_up == self.num_osds
            && self.osds_in == self.num_osds
    }
}

/// The pieces of a rebuild the lab reports, in bytes: copies recovered since the rebuild
/// began, of the copies that were dirty when it did, at `copy_bytes` each.
#[derive(Clone, Debug)]
struct RebuildWatch {
    started: Instant,
    dirty0: Option<u64>,
    copy_bytes: f64,
    done: bool,
    total_bytes: u64,
    secs: f64,
}

pub struct CephBackend {
    t: CephTarget,
    kind: Option<PoolKind>,
    info: Option<ArrayInfo>,
    failed: Option<u32>,
    flags_set: bool,
    rebuild: Option<RebuildWatch>,
}

impl CephBackend {
    pub fn new(t: CephTarget) -> CephBackend {
        CephBackend {
            t,
            kind: None,
            info: None,
            failed: None,
            flags_set: false,
            rebuild: None,
        }
    }

    fn tool(&self, program: &str, args: &[&str]) -> Result<String> {
        let mut cmd = Command::new(program);
        cmd.arg("--conf")
            .arg(&self.t.conf)
            .arg("--id")
            .arg(&self.t.id)
            .args(args);
        if program == "ceph" {
            cmd.args(["--connect-timeout", "15"]);
        }
        let out = cmd.output().with_context(|| {
            format!("running {program} (install Debian's ceph-common: scripts/deps.sh)")
        })?;
        if !out.status.success() {
            bail!(
                "`{program} {}` failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn ceph_json(&self, args: &[&str]) -> Result<Value> {
        let mut a = args.to_vec();
        a.extend(["--format", "json"]);
        let text = self.tool("ceph", &a)?;
        serde_json::from_str(&text).with_context(|| format!("reading `ceph {}`", args.join(" ")))
    }

    pub fn recovery(&self) -> Result<Recovery> {
        Ok(Recovery::from_status(&self.ceph_json(&["status"])?))
    }

    fn pool_kind(&self, pool: &str) -> Result<PoolKind> {
        let v = self.ceph_json(&["osd", "pool", "get", pool, "all"])?;
        let u = |k: &str| v[k].as_u64().unwrap_or(0) as u32;
        if let Some(profile) = v["erasure_code_profile"].as_str().filter(|p| !p.is_empty()) {
            let p = self.ceph_json(&["osd", "erasure-code-profile", "get", profile])?;
            let n = |k: &str| -> u32 {
                p[k].as_str()
                    .and_then(|s| s.parse().ok())
                    .or(p[k].as_u64().map(|x| x as u32))
                    .unwrap_or(0)
            };
            return Ok(PoolKind::Erasure {
                k: n("k"),
                m: n("m"),
                min_size: u("min_size"),
            });
        }
        Ok(PoolKind::Replicated {
            size: u("size"),
            min_size: u("min_size"),
        })
    }

    fn osd_cmd(&self, id: u32, start: bool) -> Result<()> {
        let given = if start {
            &self.t.osd_start
        } else {
            &self.t.osd_stop
        };
        if let Some(c) = given {
            let c = c.replace("{id}", &id.to_string());
            let st = status_within(Command::new("sh").arg("-c").arg(&c), OSD_CMD_LIMIT)
                .with_context(|| format!("running `{c}`"))?;
            if !st.success() {
                bail!("`{c}` failed ({st})");
            }
            return Ok(());
        }
        if let Some(dir) = self.t.single_node_dir() {
            return if start {
                single_node_start_osd(&dir, &self.t.conf, id)
            } else {
                single_node_stop_osd(&dir, &self.t.conf, id)
            };
        }
        let verb = if start { "start" } else { "stop" };
        let st = status_within(
            Command::new("systemctl").args([verb, &format!("ceph-osd@{id}")]),
            OSD_CMD_LIMIT,
        )
        .context("running systemctl (or give --ceph-osd-stop/--ceph-osd-start)")?;
        if !st.success() {
            bail!("`systemctl {verb} ceph-osd@{id}` failed ({st}): give --ceph-osd-stop and --ceph-osd-start for this cluster");
        }
        Ok(())
    }

    /// Wait until `ok` holds for the cluster's status (polling `keep_going`).
    fn wait_for(
        &self,
        what: &str,
        limit: Duration,
        keep_going: &mut dyn FnMut() -> bool,
        ok: &dyn Fn(&Recovery) -> bool,
    ) -> Result<Recovery> {
        let t = Instant::now();
        loop {
            let r = self.recovery()?;
            if ok(&r) {
                return Ok(r);
            }
            if t.elapsed() > limit {
                bail!(
                    "the cluster did not {what} within {} s ({} of {} PGs active+clean, {} inactive, {}/{} OSDs up/in{})",
                    limit.as_secs(),
                    r.clean_pgs,
                    r.num_pgs,
                    r.inactive_pgs,
                    r.osds_up,
                    r.osds_in,
                    if r.flags.is_empty() { String::new() } else { format!("; {}", r.flags) }
                );
            }
            crate::fio::sleep_while(Duration::from_millis(500), keep_going)?;
        }
    }

    fn set_flags(&mut self, on: bool) -> Result<()> {
        let verb = if on { "set" } else { "unset" };
        for f in ["norecover", "nobackfill"] {
            self.tool("ceph", &["osd", verb, f])?;
        }
        self.flags_set = on;
        Ok(())
    }
}

fn pid_of(dir: &Path, conf: &Path, id: u32) -> Option<u32> {
    let pid: u32 = std::fs::read_to_string(dir.join(format!("run/osd.{id}.pid")))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
    cmdline.contains(&conf.display().to_string()).then_some(pid)
}

/// How long starting or stopping an OSD may take. ceph-osd's parent waits for its daemon
/// to finish starting; on a broken cluster (a full disk, OSDs gone) that never happens, and
/// the run must not hang on it.
const OSD_CMD_LIMIT: Duration = Duration::from_secs(90);

/// Run a command, killing it (its process group) past `limit`.
fn status_within(cmd: &mut Command, limit: Duration) -> Result<std::process::ExitStatus> {
    crate::proc::prepare_child(cmd, crate::proc::ChildSignal::Kill);
    let mut child = cmd.spawn()?;
    let t = Instant::now();
    loop {
        if let Some(st) = child.try_wait()? {
            return Ok(st);
        }
        if t.elapsed() > limit {
            crate::proc::kill_group(child.id(), libc::SIGKILL);
            let _ = child.wait();
            bail!("gave up after {} s", limit.as_secs());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Stop an OSD of a single-node cluster: SIGTERM to the pid in its pid file (checked against
/// its command line), then wait for it to exit.
pub fn single_node_stop_osd(dir: &Path, conf: &Path, id: u32) -> Result<()> {
    let Some(pid) = pid_of(dir, conf, id) else {
        return Ok(());
    };
    crate::proc::signal(pid, libc::SIGTERM);
    let t = Instant::now();
    while Path::new(&format!("/proc/{pid}")).exists() {
        if t.elapsed() > Duration::from_secs(20) {
            crate::proc::signal(pid, libc::SIGKILL);
        }
        if t.elapsed() > Duration::from_secs(30) {
            bail!("osd.{id} (pid {pid}) did not exit");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// Start an OSD of a single-node cluster again, with the arguments it was made with.
pub fn single_node_start_osd(dir: &Path, conf: &Path, id: u32) -> Result<()> {
    if pid_of(dir, conf, id).is_some() {
        return Ok(());
    }
    let args = std::fs::read_to_string(dir.join(format!("osd.{id}.args"))).unwrap_or_default();
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(format!("log/start-osd.{id}.log")))?;
    let st = status_within(
        Command::new("ceph-osd")
            .stdout(log.try_clone()?)
            .stderr(log)
            .arg("-c")
            .arg(conf)
            .arg("-i")
            .arg(id.to_string())
            .args(args.lines().filter(|l| !l.is_empty())),
        OSD_CMD_LIMIT,
    )
    .context("starting ceph-osd (install Debian's ceph-osd)")?;
    if !st.success() {
        bail!(
            "ceph-osd -i {id} did not start ({st}); log: {}",
            dir.join(format!("log/osd.{id}.log")).display()
        );
    }
    Ok(())
}

/// CPU seconds of the cluster's OSD daemons on this host (those started with `conf`, or every
/// ceph-osd when none names it).
fn osd_cpu_secs(conf: &Path) -> f64 {
    let conf = conf.display().to_string();
    let mut mine = 0.0;
    let mut all = 0.0;
    let mut any_mine = false;
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return 0.0;
    };
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if comm.trim() != "ceph-osd" {
            continue;
        }
        let cpu = crate::proc::cpu_secs(pid).unwrap_or(0.0);
        all += cpu;
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmd).contains(&conf) {
            mine += cpu;
            any_mine = true;
        }
    }
    if any_mine {
        mine
    } else {
        all
    }
}

/// "osd.3" -> 3.
fn osd_id(member: &str) -> Result<u32> {
    member
        .strip_prefix("osd.")
        .unwrap_or(member)
        .parse()
        .map_err(|_| anyhow!("'{member}' is not an OSD: name one as osd.N"))
}

impl Backend for CephBackend {
    fn describe(&mut self) -> Result<ArrayInfo> {
        let img: Value = serde_json::from_str(&self.tool(
            "rbd",
            &[
                "info",
                &format!("{}/{}", self.t.pool, self.t.image),
                "--format",
                "json",
            ],
        )?)
        .context("reading `rbd info`")?;
        let size = img["size"].as_u64().unwrap_or(0);
        let object = 1u64 << img["order"].as_u64().unwrap_or(22);
        let data_pool = img["data_pool"]
            .as_str()
            .unwrap_or(&self.t.pool)
            .to_string();
        let kind = self.pool_kind(&data_pool)?;
        let df = self.ceph_json(&["osd", "df"])?;
        let mut members: Vec<MemberInfo> = df["nodes"]
            .as_array()
            .map(|n| {
                n.iter()
                    .map(|o| MemberInfo {
                        slot: o["id"].as_u64().unwrap_or(0) as u32,
                        path: format!("osd.{}", o["id"].as_u64().unwrap_or(0)),
                        size_bytes: o["kb"].as_u64().unwrap_or(0) * 1024,
                        kind: "osd".into(),
                        rotational: false,
                    })
                    .collect()
            })
            .unwrap_or_default();
        members.sort_by_key(|m| m.slot);
        if members.is_empty() {
            bail!("the cluster reports no OSDs");
        }
        let info = ArrayInfo {
            name: format!("{}/{}", self.t.pool, self.t.image),
            level: kind.level(),
            chunk_bytes: object,
            groups: 1,
            width: kind.width(),
            redundancy: kind.redundancy(),
            declustered: false,
            size_bytes: size,
            members,
        };
        self.kind = Some(kind);
        self.info = Some(info.clone());
        Ok(info)
    }

    fn baseline_up(&mut self) -> Result<Vec<Target>> {
        bail!("BASELINE of a Ceph cluster would overwrite its OSDs' devices: measure them alone before the cluster is made (the side-by-side run does: scripts/bench-ceph.sh)")
    }

    fn baseline_down(&mut self) -> Result<()> {
        Ok(())
    }

    fn array_up(&mut self, keep_going: &mut dyn FnMut() -> bool) -> Result<(Target, ArrayInfo)> {
        let info = match &self.info {
            Some(i) => i.clone(),
            None => self.describe()?,
        };
        self.wait_for("become clean", Duration::from_secs(300), keep_going, &|r| {
            r.clean()
        })?;
        Ok((
            Target {
                uri: self.t.fio_uri(),
                size: info.size_bytes,
                ..Default::default()
            },
            info,
        ))
    }

    fn array_state(&mut self) -> Result<ArrayState> {
        let r = self.recovery()?;
        let copy = |kind: &Option<PoolKind>| {
            let f = kind.as_ref().map(|k| k.copy_fraction()).unwrap_or(1.0);
            if r.num_objects > 0 {
                r.data_bytes as f64 / r.num_objects as f64 * f
            } else {
                0.0
            }
        };
        if let Some(w) = self.rebuild.as_mut() {
            if !w.done {
                if r.clean() {
                    w.done = true;
                    w.secs = w.started.elapsed().as_secs_f64();
                } else {
                    let d0 = *w.dirty0.get_or_insert(r.dirty_copies.max(1));
                    if w.copy_bytes == 0.0 {
                        w.copy_bytes = copy(&self.kind);
                    }
                    w.total_bytes = (d0 as f64 * w.copy_bytes) as u64;
                    let done = d0.saturating_sub(r.dirty_copies.min(d0));
                    return Ok(ArrayState {
                        state: "rebuilding".into(),
                        process: Some((
                            "rebuild".into(),
                            (done as f64 * w.copy_bytes) as u64,
                            w.total_bytes.max(1),
                        )),
                        last_process: None,
                    });
                }
            }
            return Ok(ArrayState {
                state: "optimal".into(),
                process: None,
                last_process: Some(("rebuild".into(), w.total_bytes, w.secs)),
            });
        }
        Ok(ArrayState {
            state: if r.clean() {
                "optimal".into()
            } else if r.inactive_pgs > 0 {
                "failed".into()
            } else {
                "degraded".into()
            },
            process: None,
            last_process: None,
        })
    }

    fn fail(&mut self, member: &str) -> Result<()> {
        let id = osd_id(member)?;
        self.set_flags(true)?;
        // Counted as failed before the stop, so that cleanup starts it again whatever
        // happens from here.
        self.failed = Some(id);
        self.osd_cmd(id, false)?;
        let ids = id.to_string();
        let _ = self.tool("ceph", &["osd", "down", &ids]);
        self.tool("ceph", &["osd", "out", &ids])?;
        let n = self.info.as_ref().map(|i| i.members.len()).unwrap_or(0) as u32;
        // The pool serves again once every PG has peered without the OSD.
        self.wait_for(
            "serve with the OSD down",
            Duration::from_secs(120),
            &mut || true,
            &|r| r.osds_up + 1 == n.max(r.num_osds) && r.inactive_pgs == 0,
        )?;
        Ok(())
    }

    fn start_rebuild(&mut self, failed: &str) -> Result<String> {
        let id = osd_id(failed)?;
        self.rebuild = Some(RebuildWatch {
            started: Instant::now(),
            dirty0: None,
            copy_bytes: 0.0,
            done: false,
            total_bytes: 0,
            secs: 0.0,
        });
        self.osd_cmd(id, true)?;
        self.tool("ceph", &["osd", "in", &id.to_string()])?;
        self.set_flags(false)?;
        self.failed = None;
        Ok(format!(
            "osd.{id}, started again with its data (recovery of what it missed)"
        ))
    }

    fn set_rebuild_rate(&mut self, min: u64, max: u64) -> Result<()> {
        if min == 0 && max == 0 {
            return Ok(());
        }
        bail!("Ceph's recovery has no bytes/s limit: use --rebuild-rate default (osd_max_backfills and osd_recovery_sleep set its pace)")
    }

    fn server_cpu_secs(&mut self) -> f64 {
        osd_cpu_secs(&self.t.conf)
    }

    fn array_down(&mut self) -> Result<()> {
        Ok(())
    }

    fn cleanup(&mut self) {
        if let Some(id) = self.failed.take() {
            let _ = self.osd_cmd(id, true);
            let _ = self.tool("ceph", &["osd", "in", &id.to_string()]);
        }
        if self.flags_set {
            let _ = self.set_flags(false);
        }
    }

    fn keeps_array(&self) -> bool {
        true
    }
}

impl Drop for CephBackend {
    fn drop(&mut self) {
        self.cleanup();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_and_uris() {
        let t =
            CephTarget::parse("rbd:ec42-meta/img", "/c/ceph.conf".into(), "admin".into()).unwrap();
        assert_eq!((t.pool.as_str(), t.image.as_str()), ("ec42-meta", "img"));
        let (p, i, c, id) = parse_rbd_uri(&t.fio_uri()).unwrap();
        assert_eq!(
            (p, i, c, id),
            (
                "ec42-meta".into(),
                "img".into(),
                "/c/ceph.conf".into(),
                "admin".into()
            )
        );
        for bad in ["rbd:pool", "rbd:/img", "rbd:p/", "nbd://x", "rbd:a/b/c"] {
            assert!(
                CephTarget::parse(bad, "/c".into(), "a".into()).is_err(),
                "{bad}"
            );
        }
        assert_eq!(osd_id("osd.12").unwrap(), 12);
        assert!(osd_id("sdb").is_err());
    }

    #[test]
    fn recovery_from_status_json() {
        let v: Value = serde_json::from_str(
            r#"{"health":{"checks":{"OSDMAP_FLAGS":{"summary":{"message":"norecover flag(s) set"}}}},
                "osdmap":{"osdmap":{"num_osds":6,"num_up_osds":5,"num_in_osds":5}},
                "pgmap":{"num_pgs":73,"pgs_by_state":[{"state_name":"active+clean","count":40},
                  {"state_name":"active+undersized+degraded","count":30},{"state_name":"peering","count":3}],
                  "degraded_objects":120,"misplaced_objects":5,"data_bytes":4194304,"num_objects":4,
                  "recovering_bytes_per_sec":1000}}"#,
        )
        .unwrap();
        let r = Recovery::from_status(&v);
        assert_eq!((r.num_pgs, r.clean_pgs, r.inactive_pgs), (73, 40, 3));
        assert_eq!(r.dirty_copies, 125);
        assert_eq!((r.osds_up, r.osds_in, r.num_osds), (5, 5, 6));
        assert!(!r.clean());
        assert_eq!(r.flags, "norecover flag(s) set");
        let k = PoolKind::Erasure {
            k: 4,
            m: 2,
            min_size: 5,
        };
        assert_eq!(
            (k.level(), k.width(), k.redundancy()),
            ("ceph ec:4+2".into(), 6, 2)
        );
        assert_eq!(k.copy_fraction(), 0.25);
    }
}
