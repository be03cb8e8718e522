//! The management verbs, one typed interface for every client (the CLI, the HTTP API, the
//! dashboard, the monitor). Each verb goes to the serving process through its control
//! socket ([`crate::control`]) when one serves the array, and otherwise opens the array in
//! this process ([`Local`]): the same requests, executed by the same code either way.

use crate::control;
use crate::error::{err, err_advised, ErrorKind};
use crate::local::Local;
use crate::words::Style;
use crate::{members, registry};
use anyhow::{anyhow, bail, Context, Result};
use sbod_core::array::read_superblock;
use sbod_core::superblock::Superblock;
use sbod_core::{AddOutcome, Array, AssembleOptions, CreateSpec};
use sbod_types::control::{
    AddArgs, AssembleArgs, CreateArgs, GrowArgs, GrowReply, IoMetrics, MemberArgs, ReplaceArgs,
    Request, ScrubArgs, SetArgs, SetReply,
};
use sbod_types::{
    human, ArrayStatus, AssemblyReport, LogDevState, MemberState, ProcessKind, ProcessStatus,
    Status, Step, SyncMode,
};
use std::sync::Arc;
use std::time::Duration;

/// How a client hears about what happens along the way.
pub trait Reporter: Send + Sync {
    /// A warning or a note for the person (an unreadable member, a resync).
    fn note(&self, msg: &str);
    /// Progress of long work (`what`: rebuild, check, repair).
    fn progress(&self, _what: &str, _done: u64, _total: u64) {}
    /// The long work is over.
    fn progress_done(&self) {}
    /// Whose words notes use for steps (see [`crate::words`]).
    fn style(&self) -> Style {
        Style::Cli
    }
}

/// Reports through `tracing` (services).
pub struct Logged;

impl Reporter for Logged {
    fn note(&self, msg: &str) {
        tracing::warn!("{msg}");
    }
}

/// What to do with long work (a rebuild, a scrub) on an array that no process serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Offline {
    /// Run it here and now, reporting progress (the CLI).
    Foreground,
    /// Refuse, changing nothing: serve the array first (the HTTP API).
    Refuse,
}

pub struct Manager {
    pub reporter: Arc<dyn Reporter>,
    pub offline: Offline,
}

/// Where a verb went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    /// The serving process did it.
    Served,
    /// Done on the members by this process.
    Offline,
}

impl Manager {
    pub fn new(reporter: Arc<dyn Reporter>, offline: Offline) -> Manager {
        Manager { reporter, offline }
    }

    /// Registered array names.
    pub fn list(&self) -> Result<Vec<String>> {
        registry::list()
    }

    /// Open a registered array in this process. A rescue (`force` on a failed array) that
    /// cannot read everything looks at the members that failed too (it writes nothing).
    pub async fn open_offline(&self, name: &str, opts: AssembleOptions) -> Result<Local> {
        let reg = registry::load(name)?;
        let mut a = self
            .assemble_registered(name, &reg, &opts, &reg.to_open())
            .await?;
        let short = a
            .report()
            .rescue
            .is_some_and(|r| !r.unreadable_groups.is_empty());
        if short && !reg.failed.is_empty() {
            a.close().await.ok();
            let mut all = reg.to_open();
            all.extend(reg.failed.iter().map(|f| f.path.clone()));
            all.dedup();
            a = self.assemble_registered(name, &reg, &opts, &all).await?;
        }
        if a.uuid.to_string() != reg.uuid {
            a.close().await.ok();
            bail!(
                "the members registered as '{name}' now belong to another array ({})",
                a.uuid
            );
        }
        let rep = a.report();
        if rep.resynced_regions > 0 {
            self.reporter.note(&format!(
                "{name}: not shut down cleanly; resynced {} region(s), {} of member space",
                rep.resynced_regions,
                human(rep.resynced_bytes)
            ));
        }
        for (p, why) in &rep.ignored {
            self.reporter.note(&format!("warning: {p}: {why}"));
        }
        if !opts.read_only {
            for line in report_lines(&a, Some(&reg), self.reporter.style()) {
                self.reporter.note(&format!("{name}: {line}"));
            }
        }
        Ok(Local::offline(name, a))
    }

    /// Assemble a registered array from the given member paths.
    async fn assemble_registered(
        &self,
        name: &str,
        reg: &registry::Registry,
        opts: &AssembleOptions,
        paths: &[String],
    ) -> Result<Arc<Array>> {
        let mut specs = Vec::new();
        for p in paths {
            let was_missing = reg.failed.iter().any(|f| f.missing && &f.path == p);
            if was_missing && !members::exists(p) {
                // Still missing: the array already knows.
                continue;
            }
            let r = if opts.read_only {
                members::open_read_only(p)
            } else {
                members::open(p, "")
            };
            match r {
                Ok(s) => specs.push(s),
                Err(e) => self
                    .reporter
                    .note(&format!("warning: {e}; assembling '{name}' without it")),
            }
        }
        if specs.is_empty() {
            return Err(err(
                ErrorKind::Io,
                format!("none of the members of '{name}' could be opened"),
            ));
        }
        Array::assemble(specs, opts.clone())
            .await
            .map_err(|e| explain(e, Some(reg)))
    }

    /// Open for a verb that changes membership (no background processes started).
    async fn open_for_change(&self, name: &str) -> Result<Local> {
        self.open_offline(
            name,
            AssembleOptions {
                no_processes: true,
                degraded: true,
                ..Default::default()
            },
        )
        .await
    }

    /// Run `f` on the array opened here, then close it (also when `f` fails). Closing a
    /// failed array reports its failure again: that is no news to the caller (status says
    /// it), so only other close errors are returned.
    async fn with_offline<T>(
        &self,
        local: Local,
        f: impl AsyncFnOnce(&Local) -> Result<T>,
    ) -> Result<T> {
        let r = f(&local).await;
        let closed = local.array.close().await;
        let v = r?;
        match closed {
            Err(sbod_core::Error::Failed(_)) => Ok(v),
            Err(e) => Err(e.into()),
            Ok(()) => Ok(v),
        }
    }

    fn refuse_offline(&self, name: &str, what: &str) -> Result<()> {
        if self.offline == Offline::Refuse {
            return Err(err_advised(
                ErrorKind::Conflict,
                format!("'{name}' is not served, and {what} runs in the serving process"),
                vec![Step::serve(name)],
            ));
        }
        Ok(())
    }

    /// A request to the serving process, if there is one.
    async fn remote(&self, name: &str, req: &Request) -> Result<Option<serde_json::Value>> {
        registry::check_name(name)?;
        control::call(name, req).await
    }

    /// The status of one array: from its server, or read from its members.
    pub async fn status(&self, name: &str) -> Result<ArrayStatus> {
        let (mut status, running): (Status, bool) =
            match self.remote(name, &Request::Status).await? {
                Some(v) => (
                    serde_json::from_value(v).context("status from the server")?,
                    true,
                ),
                None => {
                    let l = self
                        .open_offline(
                            name,
                            AssembleOptions {
                                read_only: true,
                                ..Default::default()
                            },
                        )
                        .await?;
                    let s = l.array.status();
                    l.array.close().await.ok();
                    (s, false)
                }
            };
        if let Ok(reg) = registry::load(name) {
            for m in status.members.iter_mut() {
                if m.path.is_none() {
                    m.path = m.uuid.as_deref().and_then(|u| reg.failed_path(u));
                }
            }
        }
        let status = crate::health::decorate(status, false).await;
        Ok(ArrayStatus { status, running })
    }

    /// The status with every member's health read now (`sbod health`), and the policy
    /// it was judged by.
    pub async fn health(&self, name: &str) -> Result<(ArrayStatus, sbod_types::HealthPolicy)> {
        let mut a = self.status(name).await?;
        a.status = crate::health::decorate(a.status, true).await;
        Ok((a, crate::health::load_policy(name)))
    }

    /// Light (or put out) the locate LED of a member's slot. Returns how, in words.
    pub async fn locate(&self, name: &str, member: &str, on: bool) -> Result<String> {
        let st = self.status(name).await?.status;
        let m = crate::registry::member_ref(name, member);
        let found = st
            .members
            .iter()
            .find(|x| {
                x.path.as_deref() == Some(m.as_str())
                    || x.path.as_deref() == Some(member)
                    || x.uuid.as_deref() == Some(member)
            })
            .ok_or_else(|| {
                err_advised(
                    ErrorKind::NotFound,
                    format!("{member} is not a member of {name}"),
                    vec![Step::on_array("status", name)],
                )
            })?;
        let path = found.path.clone().unwrap_or_default();
        let r = crate::health::reader();
        let lit = match (r.kind(&path), &found.location) {
            (sbod_health::MemberKind::Disk { disk }, _) => {
                sbod_health::led::set(&r.sysfs, &disk, sbod_health::led::Led::Locate, on)
            }
            (_, Some(loc)) => {
                sbod_health::led::set_location(&r.sysfs, loc, sbod_health::led::Led::Locate, on)
            }
            (sbod_health::MemberKind::File, None) => Err(format!(
                "{path} is a file: it has no slot and no LED (the disk under its file system has)"
            )),
            (sbod_health::MemberKind::Remote, None) => Err(format!(
                "{path} is on another host: light its LED there (sbod locate on that host)"
            )),
            (sbod_health::MemberKind::Missing, None) => {
                Err(format!("{path} is not there, and its slot is not known"))
            }
        };
        lit.map_err(|e| err(ErrorKind::Invalid, e))
    }

    /// Every registered array's status (an array that cannot be read is reported in the
    /// error list rather than failing the others).
    pub async fn status_all(&self) -> Result<(Vec<ArrayStatus>, Vec<(String, String)>)> {
        let mut ok = Vec::new();
        let mut bad = Vec::new();
        for n in self.list()? {
            match self.status(&n).await {
                Ok(s) => ok.push(s),
                Err(e) => bad.push((n, format!("{e:#}"))),
            }
        }
        Ok((ok, bad))
    }

    /// I/O counters of a served array (None if nothing serves it).
    pub async fn metrics(&self, name: &str) -> Result<Option<IoMetrics>> {
        match self.remote(name, &Request::Metrics).await? {
            Some(v) => Ok(Some(serde_json::from_value(v)?)),
            None => Ok(None),
        }
    }

    /// Take a member out of service.
    pub async fn fail(&self, name: &str, a: &MemberArgs) -> Result<Via> {
        let member = registry::member_ref(name, &a.member);
        self.member_change(
            name,
            Request::Fail {
                member,
                force: a.force,
            },
        )
        .await
    }

    /// Remove a failed member or a spare.
    pub async fn remove(&self, name: &str, a: &MemberArgs) -> Result<Via> {
        let member = registry::member_ref(name, &a.member);
        self.member_change(name, Request::Remove { member }).await
    }

    async fn member_change(&self, name: &str, req: Request) -> Result<Via> {
        if self.remote(name, &req).await?.is_some() {
            return Ok(Via::Served);
        }
        // Room for the record before the array is opened (a start writes the members'
        // superblocks): a full or read-only state directory changes nothing.
        registry::load(name)?;
        let room = registry::reserve(name)?;
        let l = self.open_for_change(name).await?;
        self.with_offline(l, async |l| l.call_with(req, Some(room)).await)
            .await?;
        Ok(Via::Offline)
    }

    /// Create the new members' files where a size is given (recorded in `created`), give
    /// them their space with `preallocate` (else warn where sparse files cannot all grow),
    /// and name them the way the registry does.
    fn prepare_new(
        &self,
        paths: &[String],
        size: Option<u64>,
        preallocate: bool,
        created: &mut Vec<String>,
    ) -> Result<Vec<String>> {
        if let Some(sz) = size {
            check_member_size("size", sz, 4096)?;
        }
        let space = members::space_needed(paths, size)?;
        if preallocate {
            members::check_preallocate(&space)?;
        }
        if let Some(sz) = size {
            created.extend(members::create_files(paths, sz)?);
        }
        let abs = paths
            .iter()
            .map(|p| {
                members::check_exists(p)?;
                members::canonical(p)
            })
            .collect::<Result<Vec<_>>>()?;
        if preallocate {
            members::preallocate(paths)?;
        } else {
            for w in members::sparse_warnings(&space) {
                self.reporter.note(&w);
            }
        }
        Ok(abs)
    }

    /// Add hot spares, or give former members back (re-added to their slot, resynced from
    /// the write-intent bitmap); a degraded array rebuilds onto a spare (offline: in the
    /// foreground). Returns each member (as registered) with what was done with it.
    pub async fn add(&self, name: &str, a: &AddArgs) -> Result<(Via, Vec<(String, Added)>)> {
        registry::load(name)?;
        if a.members.is_empty() {
            return Err(err(ErrorKind::Invalid, "name at least one member to add"));
        }
        let served = control::running(name).await;
        if !served {
            self.refuse_offline(name, "adding a member (and the rebuild it may start)")?;
        }
        let mut created = Vec::new();
        let r = self.add_new(name, a, served, &mut created).await;
        if r.is_err() {
            self.remove_unused(name, served, &created).await;
        }
        r
    }

    /// After a failed verb, remove the member files it created, but never one the array
    /// uses: a server that answered with an error, or went away, may have taken it. When
    /// the server cannot say, the files stay (and a note says so).
    async fn remove_unused(&self, name: &str, served: bool, created: &[String]) {
        if created.is_empty() {
            return;
        }
        if !served {
            members::remove_created(created);
            return;
        }
        let used: Option<Vec<String>> = match self.remote(name, &Request::Status).await {
            Ok(Some(v)) => serde_json::from_value::<Status>(v).ok().map(|s| {
                let mut u: Vec<String> = s.members.iter().filter_map(|m| m.path.clone()).collect();
                if let Some(l) = &s.log {
                    u.extend(l.devices.iter().filter_map(|d| d.path.clone()));
                }
                u
            }),
            _ => None,
        };
        match used {
            Some(used) => {
                let (keep, gone): (Vec<String>, Vec<String>) =
                    created.iter().cloned().partition(|c| {
                        let abs = members::canonical(c).unwrap_or_else(|_| c.clone());
                        used.contains(&abs)
                            || used.iter().any(|u| {
                                members::local_path(u) == Some(abs.as_str())
                                    || u.starts_with(&format!("{abs}/"))
                            })
                    });
                for k in &keep {
                    self.reporter
                        .note(&format!("{name}: {k} is kept: the array uses it"));
                }
                members::remove_created(&gone);
            }
            None => {
                for k in created {
                    self.reporter.note(&format!(
                        "{name}: {k} is kept: the server could not say whether the array uses it"
                    ));
                }
            }
        }
    }

    async fn add_new(
        &self,
        name: &str,
        a: &AddArgs,
        served: bool,
        created: &mut Vec<String>,
    ) -> Result<(Via, Vec<(String, Added)>)> {
        let paths = self.prepare_new(&a.members, a.size.map(|s| s.0), a.preallocate, created)?;
        let req = |p: &String| match a.log {
            true => Request::AddLog {
                device: p.clone(),
                force: a.force,
            },
            false => Request::Add {
                member: p.clone(),
                domain: a.domain.clone(),
                force: a.force,
            },
        };
        let mut out = Vec::new();
        if served {
            for p in &paths {
                let v = self
                    .remote(name, &req(p))
                    .await?
                    .ok_or_else(|| anyhow!("the server for '{name}' went away"))?;
                keep(created, p);
                let o = match a.log {
                    true => Added::Log,
                    false => serde_json::from_value::<AddOutcome>(v)
                        .map(Added::Outcome)
                        .unwrap_or(Added::Done),
                };
                out.push((p.clone(), o));
            }
            return Ok((Via::Served, out));
        }
        let mut room = Some(registry::reserve(name)?);
        let l = self.open_for_change(name).await?;
        self.with_offline(l, async |l| {
            for p in &paths {
                if l.array.state().live_members().iter().any(|m| &m.path == p) {
                    // A missing member that is back: assembly took it in already.
                    out.push((p.clone(), Added::Back));
                    continue;
                }
                let room = match room.take() {
                    Some(r) => r,
                    None => registry::reserve(name)?,
                };
                let v = l.call_with(req(p), Some(room)).await?;
                keep(created, p);
                let o = match a.log {
                    true => Added::Log,
                    false => serde_json::from_value::<AddOutcome>(v)
                        .map(Added::Outcome)
                        .unwrap_or(Added::Done),
                };
                out.push((p.clone(), o));
            }
            self.rebuild_here(l).await
        })
        .await?;
        Ok((Via::Offline, out))
    }

    /// Change an array's shape (`sbod grow`): members added (a reshape moves the data into
    /// the new layout online; new mirror copies rebuild; concat grows at once) or a mirror
    /// copy dropped. With a server, `wait` follows the reshape or rebuild to its end;
    /// offline it always runs to the end here.
    pub async fn grow(&self, name: &str, a: &GrowArgs, wait: bool) -> Result<(Via, GrowReply)> {
        registry::load(name)?;
        let verbs = [
            !a.add.is_empty(),
            a.drop.is_some(),
            a.member_size.is_some(),
            !a.remove.is_empty(),
            a.chunk.is_some(),
        ];
        if verbs.iter().filter(|&&x| x).count() != 1 {
            return Err(err(
                ErrorKind::Invalid,
                "grow takes one of --add DEV..., --remove MEMBER..., --drop MEMBER, --chunk SIZE or --size max|SIZE (with nothing added: use more of every member)",
            ));
        }
        let served = control::running(name).await;
        if !served {
            self.refuse_offline(name, "a grow (and the reshape or rebuild it starts)")?;
        }
        let mut created = Vec::new();
        let r = self.grow_with(name, a, wait, served, &mut created).await;
        if r.is_err() {
            self.remove_unused(name, served, &created).await;
        }
        r
    }

    async fn grow_with(
        &self,
        name: &str,
        a: &GrowArgs,
        wait: bool,
        served: bool,
        created: &mut Vec<String>,
    ) -> Result<(Via, GrowReply)> {
        let paths = match a.add.is_empty() {
            true => Vec::new(),
            false => self.prepare_new(&a.add, a.size.map(|s| s.0), a.preallocate, created)?,
        };
        let req = Request::Grow {
            add: paths.clone(),
            drop: a.drop.as_ref().map(|d| registry::member_ref(name, d)),
            remove: a
                .remove
                .iter()
                .map(|d| registry::member_ref(name, d))
                .collect(),
            domain: a.domain.clone(),
            new_groups: a.new_groups,
            level: a.level,
            member_size: a.member_size,
            chunk: match a.chunk {
                Some(c) => Some(u32::try_from(c.0).map_err(|_| {
                    err(
                        ErrorKind::Invalid,
                        format!("chunk {}: use a power of two from 4K to 16M", c.0),
                    )
                })?),
                None => None,
            },
            force: a.force,
        };
        if served {
            let v = self
                .remote(name, &req)
                .await?
                .ok_or_else(|| anyhow!("the server for '{name}' went away"))?;
            for p in &paths {
                keep(created, p);
            }
            let reply: GrowReply = serde_json::from_value(v)?;
            if wait {
                let what = if reply.kind == "reshape" {
                    "reshape"
                } else {
                    "rebuild"
                };
                self.wait_served(name, what, |s| {
                    s.process.as_ref().is_some_and(|p| {
                        matches!(p.kind, ProcessKind::Reshape | ProcessKind::Rebuild)
                    }) || s.rebuilding()
                        || s.state == sbod_types::ArrayState::Reshaping
                })
                .await?;
            }
            return Ok((Via::Served, reply));
        }
        let room = registry::reserve(name)?;
        let l = self.open_for_change(name).await?;
        let reply = self
            .with_offline(l, async |l| {
                let v = l.call_with(req, Some(room)).await?;
                for p in &paths {
                    keep(created, p);
                }
                let reply: GrowReply = serde_json::from_value(v)?;
                if reply.kind == "reshape" {
                    self.with_progress(&l.array, "reshape", l.array.reshape_now())
                        .await?;
                    registry::save_array(&l.array, Some(&l.name))?;
                }
                self.rebuild_here(l).await?;
                Ok(reply)
            })
            .await?;
        Ok((Via::Offline, reply))
    }

    /// Rebuild `new` in place of `old`. With a server, `wait` follows the rebuild to its end;
    /// offline it always runs to the end here.
    pub async fn replace(&self, name: &str, a: &ReplaceArgs, wait: bool) -> Result<Via> {
        registry::load(name)?;
        let served = control::running(name).await;
        if !served {
            self.refuse_offline(name, "a replacement's rebuild")?;
        }
        let mut created = Vec::new();
        let r = self.replace_with(name, a, wait, served, &mut created).await;
        if r.is_err() {
            self.remove_unused(name, served, &created).await;
        }
        r
    }

    async fn replace_with(
        &self,
        name: &str,
        a: &ReplaceArgs,
        wait: bool,
        served: bool,
        created: &mut Vec<String>,
    ) -> Result<Via> {
        let new = self
            .prepare_new(
                std::slice::from_ref(&a.new),
                a.size.map(|s| s.0),
                a.preallocate,
                created,
            )?
            .remove(0);
        let req = Request::Replace {
            old: registry::member_ref(name, &a.old),
            new: new.clone(),
            force: a.force,
        };
        if served {
            self.remote(name, &req)
                .await?
                .ok_or_else(|| anyhow!("the server for '{name}' went away"))?;
            keep(created, &new);
            if wait {
                self.wait_served(name, "rebuild", |s| {
                    s.process
                        .as_ref()
                        .is_some_and(|p| p.kind == ProcessKind::Rebuild)
                        || s.rebuilding()
                })
                .await?;
            }
            return Ok(Via::Served);
        }
        let room = registry::reserve(name)?;
        let l = self.open_for_change(name).await?;
        self.with_offline(l, async |l| {
            l.call_with(req, Some(room)).await?;
            keep(created, &new);
            self.rebuild_here(l).await
        })
        .await?;
        Ok(Via::Offline)
    }

    /// Rebuild what needs it on an array opened here, with progress.
    async fn rebuild_here(&self, l: &Local) -> Result<()> {
        if !l.array.status().rebuilding() {
            return Ok(());
        }
        let r = self
            .with_progress(&l.array, "rebuild", l.array.rebuild_now())
            .await;
        l.call(Request::Status).await?;
        // The change itself was recorded; this only brings the record up to date (a
        // replaced member retired). Behind, it still starts the array, which records it
        // again.
        if let Err(e) = registry::save_array(&l.array, Some(&l.name)) {
            self.reporter.note(&format!(
                "{}: warning: the registration was not brought up to date after the rebuild ({}); the next start does it",
                l.name,
                crate::words::message(&e, self.reporter.style())
            ));
        }
        r
    }

    /// Check (or repair) parity and mirrors. With a server and `wait` false, returns the
    /// process just started; otherwise the finished process.
    pub async fn scrub(&self, name: &str, a: &ScrubArgs, wait: bool) -> Result<ProcessStatus> {
        let kind = if a.repair { "repair" } else { "check" };
        let req = Request::Scrub { repair: a.repair };
        if let Some(v) = self.remote(name, &req).await? {
            if !wait {
                return Ok(serde_json::from_value(v)?);
            }
            let s = self
                .wait_served(name, kind, |s| {
                    s.process
                        .as_ref()
                        .is_some_and(|p| matches!(p.kind, ProcessKind::Check | ProcessKind::Repair))
                })
                .await?;
            return s
                .last_process
                .ok_or_else(|| anyhow!("the server did not report the scrub's result"));
        }
        self.refuse_offline(name, "a scrub")?;
        let l = self.open_for_change(name).await?;
        self.with_offline(l, async |l| {
            let h = l.array.start_scrub(a.repair)?;
            self.with_progress(&l.array, kind, async {
                h.wait().await;
                Ok(())
            })
            .await?;
            Ok(h.status())
        })
        .await
    }

    /// Change an array's settings: the rebuild rates of a served array, and the sync mode
    /// (recorded on the members, so also of an array nothing serves).
    pub async fn set(&self, name: &str, a: &SetArgs) -> Result<SetReply> {
        let policy = match &a.health_policy {
            Some(spec) => {
                registry::load(name)?;
                let mut p = crate::health::load_policy(name);
                p.apply(spec).map_err(|e| {
                    err_advised(
                        ErrorKind::Invalid,
                        format!("--health-policy: {e}"),
                        vec![Step::say(format!(
                            "now: {}",
                            crate::health::load_policy(name).describe()
                        ))],
                    )
                })?;
                crate::health::save_policy(name, &p)?;
                Some(p)
            }
            None => None,
        };
        let mut reply = self.set_engine(name, a, policy.is_some()).await?;
        reply.health_policy = Some(policy.unwrap_or_else(|| crate::health::load_policy(name)));
        Ok(reply)
    }

    async fn set_engine(&self, name: &str, a: &SetArgs, policy_set: bool) -> Result<SetReply> {
        let req = Request::Set {
            rebuild_min_rate: a.rebuild_min_rate.map(|s| s.0),
            rebuild_max_rate: a.rebuild_max_rate.map(|s| s.0),
            sync: a.sync,
        };
        if let Some(v) = self.remote(name, &req).await? {
            return Ok(serde_json::from_value(v)?);
        }
        registry::load(name)?;
        if a.rebuild_min_rate.is_some() || a.rebuild_max_rate.is_some() {
            return Err(err_advised(
                ErrorKind::Conflict,
                format!("{name} is not running: rebuild rates apply to a served array"),
                vec![
                    Step::serve(name),
                    Step::option(
                        "sync",
                        "set the sync mode alone (it is recorded on the members, served or not)",
                    ),
                ],
            ));
        }
        if a.sync.is_none() && policy_set {
            // The policy alone: what else is in force, read from the members.
            let st = self.status(name).await?.status;
            return Ok(SetReply {
                settings: sbod_types::Settings::default(),
                sync: st.sync.mode,
                health_policy: None,
            });
        }
        if a.sync.is_none() {
            return Err(err_advised(
                ErrorKind::Invalid,
                "nothing to set",
                vec![
                    Step::option("sync", "set the sync mode"),
                    Step::option("rebuild_min_rate", "set the rebuild's rate floor"),
                    Step::option("rebuild_max_rate", "set the rebuild's rate ceiling"),
                    Step::option("health_policy", "set the predictive failure policy"),
                ],
            ));
        }
        let l = self.open_for_change(name).await?;
        self.with_offline(l, async |l| Ok(serde_json::from_value(l.call(req).await?)?))
            .await
    }

    /// Stop a served array cleanly and wait until it has stopped. False if it was not
    /// running.
    pub async fn stop(&self, name: &str) -> Result<bool> {
        if self.remote(name, &Request::Stop).await?.is_none() {
            registry::load(name)?;
            return Ok(false);
        }
        // The server answers until the array is closed (its members flushed and marked
        // clean), which on drives with write caches full of random writes takes from
        // seconds to minutes: the wait shows what the close is doing after the first
        // seconds, and ends in an error only if the server stops answering, or after
        // `STOP_PATIENCE` whatever it says.
        const STOP_PATIENCE: Duration = Duration::from_secs(900);
        const SILENT_PATIENCE: Duration = Duration::from_secs(60);
        let t0 = std::time::Instant::now();
        let mut answered = t0;
        let mut next_look = t0 + Duration::from_secs(2);
        let (mut said, mut stage) = (None::<String>, String::from("closing"));
        let mut bar = false;
        let r = loop {
            if !control::running(name).await {
                break Ok(true);
            }
            let now = std::time::Instant::now();
            if now >= next_look {
                next_look = now + Duration::from_millis(500);
                let look = tokio::time::timeout(
                    Duration::from_secs(5),
                    self.remote(name, &Request::Status),
                )
                .await;
                let mut flushed = None;
                if let Ok(Ok(Some(v))) = look {
                    answered = std::time::Instant::now();
                    if let Some(c) = serde_json::from_value::<Status>(v)
                        .ok()
                        .and_then(|s| s.closing)
                    {
                        stage = c.stage;
                        flushed = c.members_flushed;
                    }
                }
                // Each stage as a line, the members flushed as a bar.
                if said.as_deref() != Some(stage.as_str()) {
                    if bar {
                        self.reporter.progress_done();
                        bar = false;
                    }
                    self.reporter.note(&format!(
                        "{name}: closing ({:.0} s): {stage}",
                        t0.elapsed().as_secs_f64()
                    ));
                    said = Some(stage.clone());
                }
                if let Some([done, of]) = flushed {
                    self.reporter.progress("members flushed", done, of);
                    bar = true;
                }
                if answered.elapsed() > SILENT_PATIENCE {
                    break Err(anyhow!(
                        "{name} did not stop: its server has not answered for {} s (last seen: {stage}); it may still be closing: `sbod status {name}` tells, and the array is checked at its next start if the process is killed",
                        SILENT_PATIENCE.as_secs()
                    ));
                }
                if t0.elapsed() > STOP_PATIENCE {
                    break Err(anyhow!(
                        "{name} did not stop within {} minutes (still {stage}); it goes on closing in the background: `sbod status {name}` tells",
                        STOP_PATIENCE.as_secs() / 60
                    ));
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        if bar {
            self.reporter.progress_done();
        }
        r
    }

    /// Forget a stopped array's registration (its members keep their superblocks).
    pub async fn forget(&self, name: &str) -> Result<()> {
        registry::load(name)?;
        if control::running(name).await {
            return Err(err_advised(
                ErrorKind::Conflict,
                format!("{name} is being served"),
                vec![Step::on_array("stop", name)],
            ));
        }
        registry::forget(name)?;
        crate::health::forget_policy(name);
        Ok(())
    }

    /// Create an array. Returns its status (the initial sync, if any, runs when served).
    pub async fn create(&self, a: &CreateArgs) -> Result<Status> {
        registry::check_name(&a.name)?;
        if registry::exists(&a.name) {
            return Err(err_advised(
                ErrorKind::Conflict,
                format!("an array named '{}' is already registered", a.name),
                vec![
                    Step::say("choose another name"),
                    Step::say(format!(
                        "stop '{}' and remove its registration (its members keep their superblocks)",
                        a.name
                    )),
                    Step::on_array("forget", &a.name),
                ],
            ));
        }
        if !a.domains.is_empty() && a.domains.len() != a.members.len() {
            return Err(anyhow::Error::new(sbod_core::Error::BadSetting {
                setting: "domains",
                value: format!("({} labels)", a.domains.len()),
                why: format!(
                    "give one label per member, in order ({} members)",
                    a.members.len()
                ),
            }));
        }
        // Every value is checked before a file is created or a member touched.
        spec_of(a, false).check(a.members.len())?;
        let logs = check_logs(&a.log, &a.members)?;
        let size_each = a.size_each.map(|s| s.0);
        if let Some(sz) = size_each {
            check_member_size("size_each", sz, a.chunk.0)?;
        } else {
            for m in &a.members {
                members::check_exists(m)?;
            }
        }
        let space = members::space_needed(&a.members, size_each)?;
        if a.preallocate {
            members::check_preallocate(&space)?;
        }
        // Room for the registration before a file is made or a member written: a full or
        // read-only state directory refuses the create here, changing nothing.
        let room = registry::reserve(&a.name)?;
        let created = match size_each {
            Some(sz) => members::create_files(&a.members, sz)?,
            None => Vec::new(),
        };
        // Every member a file made just now (a modelled drive's data file counts: its
        // member is named `model:PROFILE:PATH`), so every member reads zeros: nothing to
        // resync.
        let fresh = a
            .members
            .iter()
            .all(|m| members::local_path(m).is_some_and(|p| created.iter().any(|c| c == p)));
        // What the superblock area of the devices that were there before held, to put it
        // back if the array cannot be made whole (created and registered).
        let mut devices = a.members.clone();
        devices.extend(logs.iter().cloned());
        let heads = match members::save_heads(&devices, &created) {
            Ok(h) => h,
            Err(e) => {
                members::remove_created(&created);
                return Err(e);
            }
        };
        let r = async {
            if a.preallocate {
                members::preallocate(&a.members)?;
            } else {
                for w in members::sparse_warnings(&space) {
                    self.reporter.note(&w);
                }
            }
            // Two LUNs of one dual-actuator drive fail together: without --domains they
            // get one failure domain, so a group never holds more of them than it survives.
            let drives = if a.domains.is_empty() {
                sbod_health::drive_domains(crate::health::reader(), &a.members)
            } else {
                Vec::new()
            };
            for (m, d) in a.members.iter().zip(&drives) {
                if let Some(d) = d {
                    self.reporter.note(&format!(
                        "{m}: one LUN of a dual-actuator drive shared with another member: failure domain '{d}'"
                    ));
                }
            }
            let mut specs = Vec::new();
            for (i, m) in a.members.iter().enumerate() {
                let abs = members::canonical(m)?;
                let dom = a
                    .domains
                    .get(i)
                    .cloned()
                    .or_else(|| drives.get(i).cloned().flatten())
                    .unwrap_or_default();
                specs.push(members::open(&abs, &dom)?);
            }
            let array = Array::create(spec_of(a, fresh), specs).await?;
            let r = async {
                for l in &logs {
                    array.add_log(members::open(l, "")?, a.force).await?;
                }
                array.set_sync(a.sync).await?;
                Ok::<_, anyhow::Error>(())
            }
            .await;
            if let Err(e) = r {
                array.close().await.ok();
                return Err(e);
            }
            let reg = registry::of_array(&array, None);
            let status = array.status();
            array.close().await?;
            room.commit(&reg)?;
            Ok(status)
        }
        .await;
        if let Err(e) = r {
            // Not made whole: undone. The files made go, the devices that were there get
            // their superblock area back (no sbod superblock of this array is left).
            let bad = members::restore_heads(&heads);
            members::remove_created(&created);
            if !bad.is_empty() {
                return Err(e.context(format!(
                    "'{}' was not created, and the superblocks it wrote could not all be taken back ({}): wipe those devices' first 64 KiB before using them",
                    a.name,
                    bad.join("; ")
                )));
            }
            return Err(e.context(format!(
                "'{}' was not created (nothing was changed)",
                a.name
            )));
        }
        r
    }

    /// Assemble an array from its members and register it; stale members are rebuilt here,
    /// with progress, so the array is whole when this returns.
    pub async fn assemble(
        &self,
        a: &AssembleArgs,
    ) -> Result<(Status, AssemblyReport, Vec<String>)> {
        if let Some(n) = &a.name {
            registry::check_name(n)?;
        }
        // Room for the registration before the members are opened (a start writes their
        // superblocks): a full or read-only state directory changes nothing.
        let room = registry::reserve(a.name.as_deref().unwrap_or("assembled"))?;
        let mut specs = Vec::new();
        for m in &a.members {
            let abs = members::canonical(m)?;
            specs.push(members::open(&abs, "")?);
        }
        let known = a.name.as_deref().and_then(|n| registry::load(n).ok());
        let array = Array::assemble(
            specs,
            AssembleOptions {
                force: a.force,
                degraded: a.degraded,
                ..Default::default()
            },
        )
        .await
        .map_err(|e| explain(e, known.as_ref()))?;
        let name = a.name.clone().unwrap_or_else(|| array.name().to_string());
        let l = Local::offline(&name, array);
        self.with_offline(l, async |l| {
            registry::check_name(&name)?;
            if name != l.array.name() {
                self.reporter.note(&format!(
                    "note: the superblocks name this array '{}'; registering it as '{name}'",
                    l.array.name()
                ));
            }
            let reg = registry::load(&name).ok();
            if let Some(reg) = &reg {
                if reg.uuid != l.array.uuid.to_string() && !a.force {
                    return Err(err_advised(
                        ErrorKind::Conflict,
                        format!(
                            "'{name}' is already registered for another array ({})",
                            reg.uuid
                        ),
                        vec![
                            Step::option("name", "register this one under another name"),
                            Step::force("replace the registration"),
                        ],
                    ));
                }
            }
            if control::running(&name).await {
                return Err(err_advised(
                    ErrorKind::Conflict,
                    format!("'{name}' is being served right now"),
                    vec![Step::on_array("stop", &name)],
                ));
            }
            let rep = l.array.report();
            // Recover stale members now, with progress, so the array is whole when this
            // returns (a rescue is read-only: nothing is recovered).
            if !l.array.is_read_only()
                && l.array
                    .status()
                    .members
                    .iter()
                    .any(|m| matches!(m.state, MemberState::Rebuilding | MemberState::Replacing))
            {
                self.with_progress(&l.array, "rebuild", l.array.rebuild_now())
                    .await?;
            }
            let mut st = l.array.status();
            st.name = name.clone();
            let lines = report_lines(&l.array, reg.as_ref(), self.reporter.style());
            room.commit(&registry::of_array(&l.array, Some(&name)))
                .map_err(|e| {
                    e.context(format!(
                        "'{name}' was assembled (its members record the start), but not registered"
                    ))
                })?;
            Ok((st, rep, lines))
        })
        .await
    }

    /// Find arrays by their members' superblocks: every block device of this host (when
    /// `block_devices`), the members (and missing members) of registered arrays, and
    /// `extra` (files, or directories whose files are looked at). Members are grouped by
    /// array; each group says under which name it is registered, if it is, and whether it
    /// is served.
    pub async fn scan(&self, extra: &[String], block_devices: bool) -> Result<Vec<Found>> {
        let mut paths: Vec<String> = Vec::new();
        let rd = if block_devices {
            std::fs::read_dir("/sys/class/block").ok()
        } else {
            None
        };
        if let Some(rd) = rd {
            for e in rd.flatten() {
                let n = e.file_name().to_string_lossy().to_string();
                // Loop and ram devices with nothing behind them answer reads with errors
                // or zeros; they are looked at like the rest (cheap).
                paths.push(format!("/dev/{n}"));
            }
        }
        let regs: Vec<registry::Registry> = registry::list()?
            .iter()
            .filter_map(|n| registry::load(n).ok())
            .collect();
        for r in &regs {
            paths.extend(r.to_open());
        }
        for x in extra {
            let p = std::path::Path::new(x);
            if p.is_dir() {
                let mut files: Vec<String> = std::fs::read_dir(p)
                    .with_context(|| format!("reading {x}"))?
                    .flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
                    .map(|e| e.path().display().to_string())
                    .collect();
                files.sort();
                paths.extend(files);
            } else if p.exists()
                || sbod_remote::is_uri(x)
                || (sbod_drive::is_model(x) && members::exists(x))
            {
                paths.push(x.clone());
            } else {
                return Err(err(ErrorKind::Invalid, format!("{x} does not exist")));
            }
        }
        let mut seen = std::collections::HashSet::new();
        let mut groups: Vec<Found> = Vec::new();
        // Log devices go with the members of their array (assembly tells them apart).
        let mut logs: Vec<(String, String)> = Vec::new();
        for p in paths {
            let Ok(abs) = members::canonical(&p) else {
                continue;
            };
            if !seen.insert(abs.clone()) {
                continue;
            }
            let Ok(spec) = members::open_read_only(&abs) else {
                continue;
            };
            let sb = read_superblock(&spec.dev).await;
            let log = match &sb {
                Err(_) => sbod_core::log::read_super(&spec.dev).await.ok(),
                Ok(_) => None,
            };
            spec.dev.close();
            if let Some(l) = log {
                logs.push((l.array_uuid.to_string(), abs));
                continue;
            }
            let Ok(sb) = sb else {
                continue;
            };
            let uuid = sb.array_uuid.to_string();
            match groups.iter_mut().find(|g| g.uuid == uuid) {
                Some(g) => g.members.push(abs),
                None => groups.push(Found {
                    name: sb.name.clone(),
                    uuid,
                    registered: None,
                    served: false,
                    members: vec![abs],
                }),
            }
        }
        for (uuid, path) in logs {
            if let Some(g) = groups.iter_mut().find(|g| g.uuid == uuid) {
                g.members.push(path);
            }
        }
        for g in &mut groups {
            g.registered = regs
                .iter()
                .find(|r| r.uuid == g.uuid)
                .map(|r| r.name.clone());
            if let Some(n) = &g.registered {
                g.served = control::running(n).await;
            }
        }
        Ok(groups)
    }

    /// The superblock of each path (or why there is none).
    pub async fn examine(&self, paths: &[String]) -> Vec<(String, Result<Superblock, String>)> {
        let mut out = Vec::new();
        for p in paths {
            let r = match members::open_read_only(p) {
                Ok(spec) => {
                    let sb = read_superblock(&spec.dev).await;
                    spec.dev.close();
                    sb.map_err(|e| e.to_string())
                }
                Err(e) => Err(format!("{e:#}")),
            };
            out.push((p.clone(), r));
        }
        out
    }

    /// Run long work on an array opened here, reporting its process's progress.
    pub async fn with_progress<F>(&self, array: &Arc<Array>, what: &str, fut: F) -> Result<()>
    where
        F: std::future::Future<Output = sbod_core::Result<()>>,
    {
        let rep = self.reporter.clone();
        let a = array.clone();
        let w = what.to_string();
        let ticker = tokio::spawn(async move {
            loop {
                if let Some(p) = a.current_process() {
                    let s = p.status();
                    rep.progress(&w, s.done, s.total);
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        let r = fut.await;
        ticker.abort();
        if let Some(p) = array.current_process() {
            let s = p.status();
            self.reporter.progress(what, s.done, s.total);
        }
        self.reporter.progress_done();
        r.map_err(|e| anyhow!(e))
    }

    /// Poll a serving array until the process `active` describes is over, reporting
    /// progress. Returns the status at the end.
    async fn wait_served(
        &self,
        name: &str,
        what: &str,
        active: impl Fn(&Status) -> bool,
    ) -> Result<Status> {
        let mut seen = false;
        let mut idle_polls = 0;
        loop {
            let v = self
                .remote(name, &Request::Status)
                .await?
                .ok_or_else(|| anyhow!("the server for '{name}' went away"))?;
            let s: Status = serde_json::from_value(v)?;
            if let Some(p) = &s.process {
                self.reporter.progress(what, p.done, p.total);
            }
            if active(&s) {
                seen = true;
                idle_polls = 0;
            } else {
                idle_polls += 1;
                if seen || idle_polls > 3 {
                    self.reporter.progress_done();
                    return Ok(s);
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// What `add` did with one member.
#[derive(Clone, Debug)]
pub enum Added {
    /// What the engine did (a spare, a slot rebuilt, a former member re-added).
    Outcome(AddOutcome),
    /// A missing member that assembly already took back.
    Back,
    /// Done (an older server that does not say what).
    Done,
    /// A log device (the first makes the log, a second mirrors it).
    Log,
}

/// The log devices of `create`: one or two, existing, none of them a member; their
/// canonical paths.
fn check_logs(logs: &[String], members: &[String]) -> Result<Vec<String>> {
    if logs.len() > 2 {
        return Err(anyhow::Error::new(sbod_core::Error::BadSetting {
            setting: "log",
            value: format!("(given {} times)", logs.len()),
            why: "a log is one device, or two for a mirrored log".into(),
        }));
    }
    // Members may not exist yet (--size-each): compare absolute names.
    let name = |p: &str| {
        std::path::absolute(p)
            .map(|x| x.display().to_string())
            .unwrap_or_else(|_| p.to_string())
    };
    let mut out: Vec<String> = Vec::new();
    for l in logs {
        let member = members.iter().any(|m| name(m) == name(l));
        if member || logs.iter().filter(|x| name(x) == name(l)).count() > 1 {
            return Err(err(
                ErrorKind::Invalid,
                format!("{l} is given twice (as a member or a log device)"),
            ));
        }
        if !members::exists(l) {
            return Err(err(
                ErrorKind::Invalid,
                format!("log device {l} does not exist (create it first: a partition, a namespace, or a file)"),
            ));
        }
        out.push(members::canonical(l)?);
    }
    Ok(out)
}

/// A file `prepare_new` created has become a member: it stays whatever happens next.
fn keep(created: &mut Vec<String>, member: &str) {
    created.retain(|c| {
        let abs = members::canonical(c).ok();
        abs.as_deref() != Some(member) && abs.as_deref() != members::local_path(member)
    });
}

fn spec_of(a: &CreateArgs, fresh: bool) -> CreateSpec {
    CreateSpec {
        name: a.name.clone(),
        level: a.level,
        // A chunk beyond u32 is refused by the check like any other unsupported chunk.
        chunk: u32::try_from(a.chunk.0).unwrap_or(0),
        groups: a.groups,
        spares: a.spares,
        declustered: a.declustered,
        copies: a.copies,
        bitmap_region: a.bitmap_region.map(|s| s.0),
        assume_clean: a.assume_clean || fresh,
        integrity: a.integrity,
        force: a.force,
    }
}

/// A size for member files sbod creates: room for the metadata and a chunk, and no more
/// than a member may hold.
/// `setting` is named as the API names it ("size_each"); each client words it.
fn check_member_size(setting: &'static str, size: u64, chunk: u64) -> Result<()> {
    let min = (1 << 20) + chunk.max(4096) * 2;
    let bad = |why: String| {
        anyhow::Error::new(sbod_core::Error::BadSetting {
            setting,
            value: human(size),
            why,
        })
    };
    if size < min {
        return Err(bad(format!(
            "a member needs room for sbod's metadata (about 1 MiB) and data; give at least {}",
            human(min.div_ceil(1 << 20) * (1 << 20))
        )));
    }
    if size > sbod_core::array::MAX_MEMBER_DATA {
        return Err(bad(format!(
            "at most {} per member",
            human(sbod_core::array::MAX_MEMBER_DATA)
        )));
    }
    Ok(())
}

/// An engine error for people: members named by their registered paths.
pub fn explain(e: sbod_core::Error, reg: Option<&registry::Registry>) -> anyhow::Error {
    match e {
        sbod_core::Error::MissingMembers(m) => err_advised(
            ErrorKind::Refused,
            m.describe(|u| reg.and_then(|r| r.failed_path(&u.to_string()))),
            m.advice(),
        ),
        e => anyhow!(e),
    }
}

/// What assembly found that the user should know: members missing, stale ones being
/// recovered, a split brain forced, a rescue.
pub fn report_lines(a: &Array, reg: Option<&registry::Registry>, style: Style) -> Vec<String> {
    let rep = a.report();
    let st = a.state();
    let mut out = Vec::new();
    if a.sync_mode() == SyncMode::Disabled {
        out.push(format!("WARNING: sync=disabled: {}", a.sync_promise()));
    }
    if let Some(l) = a.log_status() {
        if l.replayed_records > 0 {
            out.push(format!(
                "replayed {} record(s) from the log into the members",
                l.replayed_records
            ));
        }
        for i in &l.replay_issues {
            out.push(format!(
                "{}log record {}: {}",
                if i.lost { "DATA LOSS: " } else { "" },
                i.seq,
                i.what
            ));
            for r in i.ranges.iter().flatten().filter(|_| i.lost) {
                out.push(format!(
                    "  may be stale: {} (slot {}) bytes {}..{} of its data area",
                    r.member.as_deref().unwrap_or("(missing)"),
                    r.slot,
                    r.offset,
                    r.offset + r.len
                ));
            }
        }
        for d in l.devices.iter().filter(|d| d.state != LogDevState::Active) {
            out.push(format!(
                "log device {} is {}{}",
                d.path.as_deref().unwrap_or(&d.uuid),
                d.state,
                if l.devices.iter().any(|x| x.state == LogDevState::Active) {
                    ": the log runs on the other device alone".to_string()
                } else {
                    format!(
                        ": writes take the in-pool path; {}",
                        crate::words::step(&Step::AddLog, style)
                    )
                }
            ));
        }
    }
    for &i in &rep.missing {
        let who = st.slots[i]
            .entry
            .as_ref()
            .and_then(|e| reg.and_then(|r| r.failed_path(&e.uuid.to_string())))
            .unwrap_or_else(|| format!("the member of slot {i}"));
        out.push(format!(
            "{who} (slot {i}) is missing: running degraded without it (it is resynced from the write-intent bitmap when it comes back, at the next start, or: {})",
            crate::words::step(&Step::command("add", a.name(), &who), style)
        ));
    }
    for s in &rep.stale {
        out.push(format!("{} (slot {}): {}", s.path, s.slot, s.note));
    }
    for p in &rep.missed_last_write {
        out.push(format!(
            "{p} missed only the last superblock write (interrupted by a crash): trusted"
        ));
    }
    if let Some(sb) = &rep.split_brain {
        out.push(format!(
            "forced over a split brain: {sb}; the newest side was taken"
        ));
    }
    if let Some(r) = &rep.rescue {
        out.push("started READ-ONLY to rescue what is readable; nothing is written".into());
        for u in &r.used {
            out.push(format!("rescue: {u}"));
        }
        for g in &r.unreadable_groups {
            out.push(format!(
                "rescue: group {g} has too few members left: its part of the volume reads as errors"
            ));
        }
    }
    out
}

/// An array `scan` found.
#[derive(Clone, Debug)]
pub struct Found {
    /// The name in its superblocks.
    pub name: String,
    pub uuid: String,
    /// The name it is registered under here, if it is.
    pub registered: Option<String>,
    /// A process serves it now.
    pub served: bool,
    pub members: Vec<String>,
}
