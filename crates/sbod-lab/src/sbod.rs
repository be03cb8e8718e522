//! The real backend: the `sbod` executable, run as child processes (`create`, `serve`,
//! `status --json`, `fail`, `remove`, `add`, `replace`, `set`, `stop`, `forget`), exactly as
//! a user would run them. Servers and fio see the same NBD path a user's client does.

use crate::backend::{ArrayState, Backend};
use crate::fio::{sleep_while, Cancelled, Target};
use crate::proc::{self, prepare_child, ChildSignal};
use crate::schema::{ArrayInfo, MemberInfo};
use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// What the run measures.
#[derive(Clone, Debug)]
pub enum Setup {
    /// `sbod demo`: the lab creates member files in `dir`, and removes them at the end.
    Fresh {
        dir: PathBuf,
        name: String,
        level: String,
        chunk: String,
        members: u32,
        size_each: u64,
        /// `--integrity` of the array (crc32c, none).
        integrity: String,
        /// The members are modelled drives: `model:DRIVES:FILE` (sbod_drive::spec).
        drives: Option<String>,
    },
    /// `sbod bench NAME`: an array registered in the user's state directory.
    Existing {
        name: String,
        /// Rebuild onto this instead of the failed member itself.
        replacement: Option<String>,
        /// Serve file members as modelled drives of this profile (`SBOD_DRIVE_MODEL`).
        drives: Option<String>,
    },
}

/// The environment variable that makes a server open its file members as modelled drives
/// (read by sbod-mgmt's member opener).
pub const DRIVE_MODEL_ENV: &str = "SBOD_DRIVE_MODEL";

struct Server {
    name: String,
    state_dir: Option<PathBuf>,
    child: Child,
    sock: PathBuf,
    log: PathBuf,
}

pub struct SbodBackend {
    exe: PathBuf,
    setup: Setup,
    /// Sockets, logs and the private state directory (short paths: Unix sockets are
    /// limited to 108 bytes).
    work: tempfile::TempDir,
    baseline: Vec<Server>,
    array: Option<Server>,
    info: Option<ArrayInfo>,
    /// The layout as `sbod status --json` gave it before the run touched anything.
    original: Option<Value>,
    /// Existing array: its registration was dropped for the baseline and it must be created
    /// again on its members.
    must_recreate: bool,
    /// Demo: member files the run created (removed at the end).
    created_files: Vec<PathBuf>,
    /// The replacement given to `sbod bench` was refused: rebuild in place instead, so the
    /// array is restored anyway.
    replacement_failed: bool,
}

fn uri(sock: &Path) -> String {
    format!("nbd+unix:///?socket={}", sock.display())
}

impl SbodBackend {
    pub fn new(exe: PathBuf, setup: Setup) -> Result<SbodBackend> {
        let work = tempfile::Builder::new().prefix("sbod-lab.").tempdir()?;
        std::fs::create_dir_all(work.path().join("state"))?;
        Ok(SbodBackend {
            exe,
            setup,
            work,
            baseline: Vec::new(),
            array: None,
            info: None,
            original: None,
            must_recreate: false,
            created_files: Vec::new(),
            replacement_failed: false,
        })
    }

    fn private_state(&self) -> PathBuf {
        self.work.path().join("state")
    }

    /// The state directory of the measured array: private for the demo, the user's otherwise.
    fn array_state_dir(&self) -> Option<PathBuf> {
        match &self.setup {
            Setup::Fresh { .. } => Some(self.private_state()),
            Setup::Existing { .. } => None,
        }
    }

    fn name(&self) -> String {
        match &self.setup {
            Setup::Fresh { name, .. } | Setup::Existing { name, .. } => name.clone(),
        }
    }

    fn command(&self, state_dir: Option<&Path>, args: &[String]) -> Command {
        let mut c = Command::new(&self.exe);
        c.args(args).stdin(Stdio::null());
        if let Setup::Existing {
            drives: Some(d), ..
        } = &self.setup
        {
            c.env(DRIVE_MODEL_ENV, d);
        }
        if let Some(d) = state_dir {
            c.env("SBOD_STATE_DIR", d);
        }
        prepare_child(&mut c, ChildSignal::Term);
        c
    }

    /// Run an sbod command to completion; its stdout, or an error with its stderr.
    fn sbod(&self, state_dir: Option<&Path>, args: &[String]) -> Result<String> {
        let o = self
            .command(state_dir, args)
            .output()
            .with_context(|| format!("running {}", self.exe.display()))?;
        if !o.status.success() {
            let err = String::from_utf8_lossy(&o.stderr);
            bail!(
                "{} (from `sbod {}`)",
                err.trim().trim_start_matches("sbod: "),
                args.join(" ")
            );
        }
        Ok(String::from_utf8_lossy(&o.stdout).to_string())
    }

    fn status_json(&self, state_dir: Option<&Path>, name: &str) -> Result<Value> {
        let out = self.sbod(state_dir, &["status".into(), name.into(), "--json".into()])?;
        serde_json::from_str(&out).context("sbod status --json")
    }

    fn serve(&self, state_dir: Option<&Path>, name: &str, tag: &str) -> Result<Server> {
        let sock = self.work.path().join(format!("{tag}.sock"));
        let log = self.work.path().join(format!("{tag}.log"));
        let mut c = self.command(
            state_dir,
            &[
                "serve".into(),
                name.into(),
                "--nbd".into(),
                format!("unix:{}", sock.display()),
            ],
        );
        c.stdout(Stdio::null()).stderr(std::fs::File::create(&log)?);
        let child = c.spawn().context("starting sbod serve")?;
        let mut s = Server {
            name: name.into(),
            state_dir: state_dir.map(Path::to_path_buf),
            child,
            sock,
            log,
        };
        let t = Instant::now();
        loop {
            if let Some(st) = s.child.try_wait()? {
                bail!(
                    "sbod serve {name} exited ({st}): {}",
                    std::fs::read_to_string(&s.log).unwrap_or_default().trim()
                );
            }
            let up = Command::new("nbdinfo")
                .arg("--size")
                .arg(uri(&s.sock))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .map(|st| st.success())
                .unwrap_or(false);
            if up {
                return Ok(s);
            }
            if t.elapsed() > Duration::from_secs(60) {
                self.stop(&mut s);
                bail!("sbod serve {name} did not come up within 60 s (is nbdinfo installed? scripts/deps.sh)");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stop a server cleanly (`sbod stop`), falling back to SIGTERM and then SIGKILL.
    fn stop(&self, s: &mut Server) {
        self.stop_all(std::slice::from_mut(s));
    }

    /// Stop servers together: each one's stop (its members' flush, which on modelled drives
    /// with a write cache destages what the cache holds: seconds a drive after random
    /// writes) overlaps the others', where one after another they added up (BASELINE's
    /// eight servers). `sbod stop` first, SIGTERM (the same clean stop) to those that still
    /// run after 10 s, SIGKILL after a minute.
    fn stop_all(&self, servers: &mut [Server]) {
        let mut asked: Vec<Child> = Vec::new();
        for s in servers.iter_mut() {
            if let Ok(None) = s.child.try_wait() {
                let mut c = self.command(s.state_dir.as_deref(), &["stop".into(), s.name.clone()]);
                c.stdout(Stdio::null()).stderr(Stdio::null());
                if let Ok(ch) = c.spawn() {
                    asked.push(ch);
                }
            }
        }
        let t = Instant::now();
        let mut termed = false;
        loop {
            let mut running: Vec<&mut Server> = Vec::new();
            for s in servers.iter_mut() {
                if let Ok(None) = s.child.try_wait() {
                    running.push(s);
                }
            }
            if running.is_empty() {
                break;
            }
            if !termed && t.elapsed() > Duration::from_secs(10) {
                for s in &running {
                    proc::signal(s.child.id(), libc::SIGTERM);
                }
                termed = true;
            }
            if t.elapsed() > Duration::from_secs(60) {
                for s in running {
                    let _ = s.child.kill();
                    let _ = s.child.wait();
                }
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        for mut c in asked {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn member_path(dir: &Path, i: u32) -> PathBuf {
        dir.join(format!("m{i}.img"))
    }

    /// `info` with the file members of an existing array that this lab serves as modelled
    /// drives (`Setup::Existing`'s `drives`) known as what they are served as.
    fn with_drives(&self, mut info: ArrayInfo) -> ArrayInfo {
        if let Setup::Existing {
            drives: Some(d), ..
        } = &self.setup
        {
            for m in info.members.iter_mut().filter(|m| m.kind == "file") {
                m.rotational = rotational(&format!("model:{d}:{}", m.path), "model");
            }
        }
        info
    }

    /// The member's name for sbod: the file, or the modelled drive that keeps its data in it.
    fn member_name(&self, dir: &Path, i: u32) -> String {
        let p = Self::member_path(dir, i).display().to_string();
        match &self.setup {
            Setup::Fresh {
                drives: Some(d), ..
            } => format!("model:{d}:{p}"),
            _ => p,
        }
    }

    fn create_fresh(&mut self) -> Result<()> {
        let Setup::Fresh {
            dir,
            name,
            level,
            chunk,
            members,
            size_each,
            integrity,
            drives,
        } = self.setup.clone()
        else {
            unreachable!()
        };
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let mut args: Vec<String> = vec![
            "create".into(),
            name,
            "--level".into(),
            level,
            "--chunk".into(),
            chunk,
            "--size-each".into(),
            size_each.to_string(),
            "--integrity".into(),
            integrity,
        ];
        if drives.is_some() {
            // The bitmap region sbod gives a member of the modelled drive's size (every
            // profile is 7.68 TB or more: 128 MiB), not the small file's 1 MiB: on a drive,
            // each first write to a region is a FUA write to the bitmap, a seek away.
            args.push("--bitmap-region".into());
            args.push("128M".into());
        }
        for i in 0..members {
            let p = Self::member_path(&dir, i);
            if p.exists() {
                bail!(
                    "{} already exists: the demo creates its own members (remove it, or choose another --dir)",
                    p.display()
                );
            }
            args.push(self.member_name(&dir, i));
        }
        let st = self.private_state();
        for i in 0..members {
            self.created_files.push(Self::member_path(&dir, i));
        }
        self.sbod(Some(&st), &args)?;
        Ok(())
    }

    fn remove_fresh_members(&mut self) {
        for p in std::mem::take(&mut self.created_files) {
            let _ = std::fs::remove_file(p);
        }
    }

    fn forget_private(&self, name: &str) {
        let _ = self.sbod(Some(&self.private_state()), &["forget".into(), name.into()]);
    }

    /// `sbod create` arguments that rebuild the layout `status` describes on its members.
    fn recreate_args(status: &Value, name: &str) -> Result<Vec<String>> {
        let level = status["level"].as_str().unwrap_or_default().to_string();
        let mut args: Vec<String> = vec![
            "create".into(),
            name.into(),
            "--level".into(),
            level.clone(),
            "--chunk".into(),
            status["chunk"].as_u64().unwrap_or(65536).to_string(),
            "--force".into(),
        ];
        // Declustered: the groups and the members' worth of spare space spread over all.
        let declustered = status["declustered"].as_u64();
        if level == "raid10" {
            args.push("--copies".into());
            args.push(status["width"].as_u64().unwrap_or(2).to_string());
        } else if let Some(d) = declustered {
            args.push("--groups".into());
            args.push(status["groups"].as_u64().unwrap_or(1).to_string());
            args.push("--spares".into());
            args.push(d.to_string());
            args.push("--declustered".into());
        } else if status["groups"].as_u64().unwrap_or(1) > 1 {
            args.push("--groups".into());
            args.push(status["groups"].as_u64().unwrap_or(1).to_string());
        }
        if let Some(i) = status["integrity"].as_str() {
            args.push("--integrity".into());
            args.push(i.into());
        }
        if let Some(r) = status["bitmap_region"].as_u64() {
            args.push("--bitmap-region".into());
            args.push(r.to_string());
        }
        let members = status["members"].as_array().cloned().unwrap_or_default();
        let mut slots: Vec<(u64, String, String)> = Vec::new();
        let mut spares: Vec<(String, String)> = Vec::new();
        for m in &members {
            let path = m["path"]
                .as_str()
                .ok_or_else(|| anyhow!("a member of '{name}' has no path"))?
                .to_string();
            let dom = m["domain"].as_str().unwrap_or_default().to_string();
            match m["slot"].as_u64() {
                Some(s) => slots.push((s, path, dom)),
                None => spares.push((path, dom)),
            }
        }
        slots.sort();
        let doms: Vec<String> = slots
            .iter()
            .map(|s| s.2.clone())
            .chain(spares.iter().map(|s| s.1.clone()))
            .collect();
        if doms.iter().any(|d| !d.is_empty()) {
            args.push("--domains".into());
            args.push(doms.join(","));
        }
        if !spares.is_empty() {
            if declustered.is_some() {
                bail!("'{name}' is declustered and has hot spares besides: sbod bench cannot re-create that layout; remove the hot spares first");
            }
            args.push("--spares".into());
            args.push(spares.len().to_string());
        }
        args.extend(slots.into_iter().map(|s| s.1));
        args.extend(spares.into_iter().map(|s| s.0));
        Ok(args)
    }
}

/// Does a member stream like a disk? A modelled drive by its profile's name (the HDD
/// profiles are `hdd-*`, sbod_drive::profile::NAMES; read here rather than by depending on
/// the drive model and the engine below it for a name), a block device (or its disk, for a
/// partition) by what the kernel says in sysfs; files and remote members: no.
pub fn rotational(path: &str, kind: &str) -> bool {
    match kind {
        "model" => path
            .strip_prefix("model:")
            .and_then(|r| r.split([',', ':']).next())
            .is_some_and(|p| p.starts_with("hdd")),
        "block" => {
            use std::os::unix::fs::MetadataExt;
            let Ok(md) = std::fs::metadata(path) else {
                return false;
            };
            let dev = format!(
                "/sys/dev/block/{}:{}",
                libc::major(md.rdev()),
                libc::minor(md.rdev())
            );
            [
                format!("{dev}/queue/rotational"),
                format!("{dev}/../queue/rotational"),
            ]
            .iter()
            .find_map(|f| std::fs::read_to_string(f).ok())
            .is_some_and(|v| v.trim() == "1")
        }
        _ => false,
    }
}

/// The report's view of `sbod status --json`.
pub fn array_info(v: &Value) -> ArrayInfo {
    let members = v["members"]
        .as_array()
        .map(|ms| {
            ms.iter()
                .filter_map(|m| {
                    let slot = m["slot"].as_u64()?;
                    let path = m["path"].as_str().unwrap_or("?").to_string();
                    let kind = match std::fs::metadata(&path) {
                        _ if path.contains("://") => "nbd",
                        _ if path.starts_with("model:") => "model",
                        Ok(md) if md.file_type().is_block_device() => "block",
                        _ => "file",
                    };
                    Some(MemberInfo {
                        slot: slot as u32,
                        size_bytes: m["size"].as_u64().unwrap_or(0),
                        rotational: rotational(&path, kind),
                        path,
                        kind: kind.into(),
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    ArrayInfo {
        name: v["name"].as_str().unwrap_or_default().into(),
        level: v["level"].as_str().unwrap_or_default().into(),
        chunk_bytes: v["chunk"].as_u64().unwrap_or(0),
        groups: v["groups"].as_u64().unwrap_or(1) as u32,
        width: v["width"].as_u64().unwrap_or(0) as u32,
        redundancy: v["redundancy"].as_u64().unwrap_or(0) as u32,
        declustered: v["declustered"].as_u64().is_some(),
        size_bytes: v["size"].as_u64().unwrap_or(0),
        members,
    }
}

/// The health fields of `sbod status --json`.
pub fn array_state(v: &Value) -> ArrayState {
    let proc_of = |p: &Value| -> Option<(String, u64, u64, f64)> {
        if !p.is_object() {
            return None;
        }
        Some((
            p["kind"].as_str().unwrap_or("?").to_lowercase(),
            p["done"].as_u64().unwrap_or(0),
            p["total"].as_u64().unwrap_or(0),
            p["elapsed_secs"].as_f64().unwrap_or(0.0),
        ))
    };
    ArrayState {
        state: v["state"].as_str().unwrap_or("?").into(),
        process: proc_of(&v["process"]).map(|(k, d, t, _)| (k, d, t)),
        last_process: proc_of(&v["last_process"]).map(|(k, _, t, e)| (k, t, e)),
    }
}

impl Backend for SbodBackend {
    fn describe(&mut self) -> Result<ArrayInfo> {
        let name = self.name();
        let v = match &self.setup {
            Setup::Fresh { .. } => {
                // Create the layout once to learn its geometry (and refuse a bad one before
                // anything runs), then drop it: the members are created again, fresh.
                self.create_fresh()?;
                let st = self.private_state();
                let v = self.status_json(Some(&st), &name);
                self.forget_private(&name);
                self.remove_fresh_members();
                v?
            }
            Setup::Existing { .. } => {
                let v = self.status_json(None, &name)?;
                if v["running"].as_bool() == Some(true) {
                    bail!("'{name}' is being served: stop it first (sbod stop {name}); sbod bench serves it itself");
                }
                let state = v["state"].as_str().unwrap_or("?");
                if state != "optimal" && state != "resyncing" && state != "rebuilding" {
                    bail!("'{name}' is {state}: sbod bench needs a whole array (rebuild or replace the failed members first)");
                }
                if let Setup::Existing {
                    replacement: Some(r),
                    ..
                } = &self.setup
                {
                    // A remote member (an NBD URI) is checked when it is opened.
                    if !r.contains("://") && !r.starts_with("model:") && !Path::new(r).exists() {
                        bail!("the replacement {r} does not exist");
                    }
                }
                v
            }
        };
        let info = self.with_drives(array_info(&v));
        self.original = Some(v);
        self.info = Some(info.clone());
        Ok(info)
    }

    fn baseline_up(&mut self) -> Result<Vec<Target>> {
        let info = self.info.clone().ok_or_else(|| anyhow!("describe first"))?;
        let st = self.private_state();
        let paths: Vec<String> = match self.setup.clone() {
            Setup::Fresh {
                dir,
                members,
                size_each,
                ..
            } => (0..members)
                .map(|i| {
                    let p = Self::member_path(&dir, i);
                    self.created_files.push(p.clone());
                    let _ = size_each;
                    self.member_name(&dir, i)
                })
                .collect(),
            Setup::Existing { name, .. } => {
                // The members are about to be overwritten: drop the registration now, and
                // create the array again on them afterwards (array_up), even if this fails.
                self.sbod(None, &["forget".into(), name.clone()])?;
                self.must_recreate = true;
                let mut ps: Vec<(u32, String)> = info
                    .members
                    .iter()
                    .map(|m| (m.slot, m.path.clone()))
                    .collect();
                ps.sort();
                ps.into_iter().map(|x| x.1).collect()
            }
        };
        let mut targets = Vec::new();
        for (i, p) in paths.iter().enumerate() {
            let name = format!("base{i}");
            let mut args: Vec<String> = vec![
                "create".into(),
                name.clone(),
                "--level".into(),
                "raid0".into(),
                // The baseline is the members as they are: no checksums.
                "--integrity".into(),
                "none".into(),
                "--force".into(),
            ];
            if let Setup::Fresh { size_each, .. } = &self.setup {
                args.push("--size-each".into());
                args.push(size_each.to_string());
            }
            args.push(p.clone());
            self.sbod(Some(&st), &args)?;
            let s = self.serve(Some(&st), &name, &format!("b{i}"))?;
            let size = self.status_json(Some(&st), &name)?["size"]
                .as_u64()
                .unwrap_or(0);
            targets.push(Target {
                uri: uri(&s.sock),
                size,
                ..Default::default()
            });
            self.baseline.push(s);
        }
        Ok(targets)
    }

    fn baseline_down(&mut self) -> Result<()> {
        let mut servers = std::mem::take(&mut self.baseline);
        self.stop_all(&mut servers);
        for s in &servers {
            self.forget_private(&s.name);
        }
        if let Setup::Fresh { .. } = self.setup {
            self.remove_fresh_members();
        }
        Ok(())
    }

    fn array_up(&mut self, keep_going: &mut dyn FnMut() -> bool) -> Result<(Target, ArrayInfo)> {
        let name = self.name();
        let sd = self.array_state_dir();
        match &self.setup {
            Setup::Fresh { .. } => self.create_fresh()?,
            Setup::Existing { .. } if self.must_recreate => {
                let orig = self
                    .original
                    .clone()
                    .ok_or_else(|| anyhow!("describe first"))?;
                let args = Self::recreate_args(&orig, &name)?;
                self.sbod(None, &args).with_context(|| {
                    format!("creating '{name}' again on its members after the baseline")
                })?;
                self.must_recreate = false;
            }
            Setup::Existing { .. } => {}
        }
        let s = self.serve(sd.as_deref(), &name, "array")?;
        let sock = s.sock.clone();
        self.array = Some(s);
        // A recreated array resyncs its parity first; measure only a settled array.
        loop {
            let st = self.array_state()?;
            if st.state == "optimal" && st.process.is_none() {
                break;
            }
            if st.state == "failed" || st.state == "degraded" {
                bail!("'{name}' is {st:?} after start", st = st.state);
            }
            sleep_while(Duration::from_millis(500), keep_going)?;
        }
        let v = self.status_json(sd.as_deref(), &name)?;
        let info = self.with_drives(array_info(&v));
        self.info = Some(info.clone());
        Ok((
            Target {
                uri: uri(&sock),
                size: info.size_bytes,
                ..Default::default()
            },
            info,
        ))
    }

    fn array_state(&mut self) -> Result<ArrayState> {
        let sd = self.array_state_dir();
        Ok(array_state(&self.status_json(sd.as_deref(), &self.name())?))
    }

    fn fail(&mut self, member: &str) -> Result<()> {
        let sd = self.array_state_dir();
        self.sbod(sd.as_deref(), &["fail".into(), self.name(), member.into()])?;
        Ok(())
    }

    fn start_rebuild(&mut self, failed: &str) -> Result<String> {
        let sd = self.array_state_dir();
        let name = self.name();
        match &self.setup {
            Setup::Existing {
                replacement: Some(r),
                ..
            } if !self.replacement_failed => {
                let r = r.clone();
                let res = self.sbod(
                    sd.as_deref(),
                    &["replace".into(), name, failed.into(), r.clone()],
                );
                if res.is_err() {
                    self.replacement_failed = true;
                }
                res?;
                Ok(r)
            }
            _ => {
                // Swap in a blank disk in the same bay: the failed member leaves the array
                // (its superblock wiped) and comes back as a new member, rebuilt in full.
                self.sbod(
                    sd.as_deref(),
                    &["remove".into(), name.clone(), failed.into()],
                )?;
                self.sbod(
                    sd.as_deref(),
                    &["add".into(), name, failed.into(), "--force".into()],
                )?;
                Ok(failed.to_string())
            }
        }
    }

    fn set_rebuild_rate(&mut self, min: u64, max: u64) -> Result<()> {
        let sd = self.array_state_dir();
        self.sbod(
            sd.as_deref(),
            &[
                "set".into(),
                self.name(),
                "--rebuild-min-rate".into(),
                min.to_string(),
                "--rebuild-max-rate".into(),
                max.to_string(),
            ],
        )?;
        Ok(())
    }

    fn server_cpu_secs(&mut self) -> f64 {
        self.baseline
            .iter()
            .chain(self.array.iter())
            .filter_map(|s| proc::cpu_secs(s.child.id()))
            .sum()
    }

    fn array_down(&mut self) -> Result<()> {
        if let Some(mut s) = self.array.take() {
            self.stop(&mut s);
            let st = s.child.wait()?;
            if !st.success() {
                bail!(
                    "sbod serve {} exited with {st}: {}",
                    s.name,
                    std::fs::read_to_string(&s.log).unwrap_or_default().trim()
                );
            }
        }
        Ok(())
    }

    fn cleanup(&mut self) {
        let _ = self.baseline_down();
        if let Some(mut s) = self.array.take() {
            self.stop(&mut s);
        }
        let name = self.name();
        match &self.setup {
            Setup::Fresh { .. } => {
                self.forget_private(&name);
                self.remove_fresh_members();
            }
            Setup::Existing { .. } => {
                if self.must_recreate {
                    // Stopped between dropping the registration and creating the array again:
                    // put the array back (empty, its data was given up with --destructive).
                    if let Some(orig) = self.original.clone() {
                        if let Ok(args) = Self::recreate_args(&orig, &name) {
                            if self.sbod(None, &args).is_ok() {
                                self.must_recreate = false;
                            }
                        }
                    }
                }
            }
        }
    }

    fn keeps_array(&self) -> bool {
        matches!(self.setup, Setup::Existing { .. })
    }
}

impl Drop for SbodBackend {
    fn drop(&mut self) {
        self.cleanup();
    }
}

/// For messages: a `Cancelled` error from a wait.
pub fn cancelled() -> anyhow::Error {
    anyhow!(Cancelled)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recreate_keeps_layout_order_spares_and_domains() {
        let v: Value = serde_json::json!({
            "name": "v", "level": "raid6", "chunk": 131072, "groups": 2, "width": 4,
            "bitmap_region": 1048576,
            "members": [
                {"slot": 1, "path": "/d/b", "domain": "e1"},
                {"slot": 0, "path": "/d/a", "domain": "e2"},
                {"slot": null, "path": "/d/s", "domain": "e1"},
                {"slot": 2, "path": "/d/c", "domain": "e2"},
            ]
        });
        let a = SbodBackend::recreate_args(&v, "v").unwrap();
        let s = a.join(" ");
        assert!(s.starts_with("create v --level raid6 --chunk 131072 --force --groups 2"));
        assert!(s.contains("--bitmap-region 1048576"));
        assert!(s.contains("--domains e2,e1,e2,e1"));
        assert!(s.ends_with("--spares 1 /d/a /d/b /d/c /d/s"), "{s}");
        let mut r10 = v.clone();
        r10["level"] = "raid10".into();
        r10["width"] = 3.into();
        let s = SbodBackend::recreate_args(&r10, "v").unwrap().join(" ");
        assert!(s.contains("--copies 3") && !s.contains("--groups"));
        // A declustered layout comes back declustered, with its spare space.
        let d: Value = serde_json::json!({
            "name": "v", "level": "raid6", "chunk": 65536, "groups": 1, "width": 3,
            "declustered": 1,
            "members": [
                {"slot": 0, "path": "/d/a"}, {"slot": 1, "path": "/d/b"},
                {"slot": 2, "path": "/d/c"}, {"slot": 3, "path": "/d/d"},
            ]
        });
        let s = SbodBackend::recreate_args(&d, "v").unwrap().join(" ");
        assert!(
            s.contains("--groups 1 --spares 1 --declustered") && s.ends_with("/d/a /d/b /d/c /d/d"),
            "{s}"
        );
        let mut both = d.clone();
        both["members"]
            .as_array_mut()
            .unwrap()
            .push(serde_json::json!({"slot": null, "path": "/d/s"}));
        assert!(SbodBackend::recreate_args(&both, "v").is_err());
    }

    #[test]
    fn state_from_status_json() {
        let v = serde_json::json!({
            "state": "rebuilding",
            "process": {"kind": "Rebuild", "done": 50, "total": 200, "elapsed_secs": 1.0},
            "last_process": null
        });
        let s = array_state(&v);
        assert!(s.busy());
        assert_eq!(s.percent(), Some(25.0));
        assert_eq!(s.process.as_ref().unwrap().0, "rebuild");
    }
}
