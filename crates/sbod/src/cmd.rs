//! The array commands: create, assemble, status, examine, fail, remove, add, replace,
//! scrub, stop, set. Each reaches a running array through its control socket, or opens the
//! array in this process when nothing serves it.

use crate::control::{self, Request};
use crate::members;
use crate::output;
use crate::state::{self, Registry};
use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use sbod_core::array::{self as core_array, Status};
use sbod_core::layout::{parse_size, Level};
use sbod_core::process::ProcessStatus;
use sbod_core::superblock::OutReason;
use sbod_core::{AddOutcome, Array, AssembleOptions, CreateSpec};
use std::sync::Arc;
use std::time::Duration;

pub(crate) fn size_arg(s: &str) -> Result<u64, String> {
    parse_size(s)
}

#[derive(Args, Debug)]
pub struct CreateArgs {
    /// Name of the new array.
    pub name: String,
    /// raid0, raid1, raid10, raid5, raid6, ec:K+M (e.g. ec:8+3) or concat.
    #[arg(long, short)]
    pub level: Level,
    /// Chunk (stripe unit) per member, 4K to 16M.
    #[arg(long, short, default_value = "64K", value_parser = size_arg)]
    pub chunk: u64,
    /// Stripe the volume over this many equal redundancy groups (RAID50/60).
    #[arg(long, short, default_value_t = 1)]
    pub groups: u32,
    /// The last N members are hot spares.
    #[arg(long, short, default_value_t = 0)]
    pub spares: usize,
    /// Copies per mirror set (raid10).
    #[arg(long, default_value_t = 2)]
    pub copies: u32,
    /// Create missing member files of this size (e.g. 1G).
    #[arg(long, value_parser = size_arg)]
    pub size_each: Option<u64>,
    /// Give member files all their space now (fallocate), so the array never meets a
    /// full file system; refused where the file system cannot hold them.
    #[arg(long)]
    pub preallocate: bool,
    /// Failure domain of each member, in order (e.g. enc1,enc1,enc2,...).
    #[arg(long, value_delimiter = ',')]
    pub domains: Vec<String>,
    /// Write-intent bitmap region (default: about 1024 regions per member).
    #[arg(long, value_parser = size_arg)]
    pub bitmap_region: Option<u64>,
    /// Skip the initial parity sync (members are known to be zero).
    #[arg(long)]
    pub assume_clean: bool,
    /// Overwrite members that hold data or belong to another array; allow layouts that
    /// put too many members of a group in one failure domain.
    #[arg(long)]
    pub force: bool,
    #[arg(long)]
    pub json: bool,
    /// Member devices or files (spares last).
    #[arg(required = true)]
    pub members: Vec<String>,
}

#[derive(Args, Debug)]
pub struct AssembleArgs {
    /// Name to register the array under (default: the name in its superblocks).
    #[arg(long)]
    pub name: Option<String>,
    /// Start without members it had in service when it stopped (they are recorded as
    /// missing, and resynced from the write-intent bitmap when they come back).
    #[arg(long)]
    pub degraded: bool,
    /// Accept possible data loss: start although members are missing, over a split brain
    /// (taking the newest side) or a write hole; a failed array is started read-only to
    /// rescue what is readable. Also overwrites a registration of another array.
    #[arg(long)]
    pub force: bool,
    #[arg(long)]
    pub json: bool,
    /// Member devices or files.
    #[arg(required = true)]
    pub members: Vec<String>,
}

#[derive(Args, Debug)]
pub struct StatusArgs {
    /// Array name (all known arrays if omitted).
    pub name: Option<String>,
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct ExamineArgs {
    #[arg(required = true)]
    pub members: Vec<String>,
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct MemberArgs {
    pub name: String,
    pub member: String,
}

#[derive(Args, Debug)]
pub struct FailArgs {
    pub name: String,
    pub member: String,
    /// Fail it even if the array would then stop serving (more members of a group out than
    /// it survives).
    #[arg(long)]
    pub force: bool,
}

#[derive(Args, Debug)]
pub struct AddArgs {
    pub name: String,
    #[arg(required = true)]
    pub members: Vec<String>,
    /// Failure domain of the new member(s).
    #[arg(long, default_value = "")]
    pub domain: String,
    /// Create missing member files of this size.
    #[arg(long, value_parser = size_arg)]
    pub size: Option<u64>,
    /// Give the member files all their space now (fallocate).
    #[arg(long)]
    pub preallocate: bool,
    #[arg(long)]
    pub force: bool,
}

#[derive(Args, Debug)]
pub struct ReplaceArgs {
    pub name: String,
    /// The member to replace.
    pub old: String,
    /// The new member.
    pub new: String,
    /// Create the new member file of this size if missing.
    #[arg(long, value_parser = size_arg)]
    pub size: Option<u64>,
    /// Give the new member file all its space now (fallocate).
    #[arg(long)]
    pub preallocate: bool,
    #[arg(long)]
    pub force: bool,
    /// With a running server: wait for the rebuild and show its progress.
    #[arg(long)]
    pub wait: bool,
}

#[derive(Args, Debug)]
pub struct ScrubArgs {
    pub name: String,
    /// Fix what the check finds (a single bad chunk is located with two or more parity).
    #[arg(long)]
    pub repair: bool,
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct NameArgs {
    pub name: String,
}

#[derive(Args, Debug)]
pub struct SetArgs {
    pub name: String,
    /// Background rate floor while clients are busy (e.g. 50M; 0 = none).
    #[arg(long, value_parser = size_arg)]
    pub rebuild_min_rate: Option<u64>,
    /// Background rate ceiling (e.g. 500M; 0 = unlimited).
    #[arg(long, value_parser = size_arg)]
    pub rebuild_max_rate: Option<u64>,
}

/// Record the array's current members.
pub fn save_registry(array: &Array) -> Result<()> {
    let st = array.state();
    let prev = state::load(&array.name).ok();
    let mut failed = Vec::new();
    for s in &st.slots {
        if s.state == sbod_core::superblock::SlotState::Failed {
            let missing = s.out.is_some_and(|o| o.reason == OutReason::Missing);
            match (&s.member, &s.entry) {
                (Some(m), _) => failed.push(state::FailedMember {
                    path: m.path.clone(),
                    uuid: m.uuid.to_string(),
                    missing,
                }),
                (None, Some(e)) => {
                    // A member not here: keep the path it had, to look for it again.
                    let uuid = e.uuid.to_string();
                    if let Some(path) = prev.as_ref().and_then(|r| r.failed_path(&uuid)) {
                        failed.push(state::FailedMember {
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
    let mut prev_failed = prev.map(|r| r.failed).unwrap_or_default();
    prev_failed.retain(|f| {
        !members.contains(&f.path)
            && recorded.contains(&f.uuid)
            && !failed.iter().any(|x| x.uuid == f.uuid)
    });
    failed.extend(prev_failed);
    state::save(&Registry {
        name: array.name.clone(),
        uuid: array.uuid.to_string(),
        members,
        failed,
        uuids,
    })
}

/// Open a registered array in this process.
pub async fn open_offline(name: &str, opts: AssembleOptions) -> Result<Arc<Array>> {
    let reg = state::load(name)?;
    let mut a = assemble_registered(name, &reg, &opts, &reg.to_open()).await?;
    let short = a
        .report()
        .rescue
        .is_some_and(|r| !r.unreadable_groups.is_empty());
    if short && !reg.failed.is_empty() {
        // A rescue that cannot read everything: the members that failed may still hold
        // what is missing (a rescue writes nothing, so looking again is harmless).
        a.close().await.ok();
        let mut all = reg.to_open();
        all.extend(reg.failed.iter().map(|f| f.path.clone()));
        all.dedup();
        a = assemble_registered(name, &reg, &opts, &all).await?;
    }
    if a.uuid.to_string() != reg.uuid {
        bail!(
            "the members registered as '{name}' now belong to another array ({})",
            a.uuid
        );
    }
    let rep = a.report();
    let read_only = opts.read_only;
    if rep.resynced_regions > 0 {
        eprintln!(
            "{name}: not shut down cleanly; resynced {} region(s), {} of member space",
            rep.resynced_regions,
            sbod_core::layout::human(rep.resynced_bytes)
        );
    }
    for (p, why) in &rep.ignored {
        eprintln!("warning: {p}: {why}");
    }
    if !read_only {
        for line in report_lines(&a, Some(&reg)) {
            eprintln!("{name}: {line}");
        }
    }
    Ok(a)
}

/// Assemble a registered array from the given member paths.
async fn assemble_registered(
    name: &str,
    reg: &Registry,
    opts: &AssembleOptions,
    paths: &[String],
) -> Result<Arc<Array>> {
    let mut specs = Vec::new();
    for p in paths {
        let was_missing = reg.failed.iter().any(|f| f.missing && &f.path == p);
        if was_missing && !std::path::Path::new(p).exists() {
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
            Err(e) => eprintln!("warning: {e}; assembling '{name}' without it"),
        }
    }
    if specs.is_empty() {
        bail!("none of the members of '{name}' could be opened");
    }
    Array::assemble(specs, opts.clone())
        .await
        .map_err(|e| explain(e, Some(reg)))
}

/// An engine error for the terminal: members named by their registered paths.
pub fn explain(e: sbod_core::Error, reg: Option<&Registry>) -> anyhow::Error {
    match e {
        sbod_core::Error::MissingMembers(m) => anyhow!(
            "{}",
            m.describe(|u| reg.and_then(|r| r.failed_path(&u.to_string())))
        ),
        e => anyhow!(e),
    }
}

/// What assembly found that the user should know: members missing, stale ones being
/// recovered, a split brain forced, a rescue.
pub fn report_lines(a: &Array, reg: Option<&Registry>) -> Vec<String> {
    let rep = a.report();
    let st = a.state();
    let mut out = Vec::new();
    for &i in &rep.missing {
        let who = st.slots[i]
            .entry
            .as_ref()
            .and_then(|e| reg.and_then(|r| r.failed_path(&e.uuid.to_string())))
            .unwrap_or_else(|| format!("the member of slot {i}"));
        out.push(format!(
            "{who} (slot {i}) is missing: running degraded without it (it is resynced from the write-intent bitmap when it comes back: `sbod add {} {who}`, or at the next start)",
            a.name
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

pub async fn create(args: CreateArgs) -> Result<()> {
    if state::exists(&args.name) {
        bail!(
            "an array named '{}' is already registered; choose another name, or `sbod stop {}` and remove its registration with `sbod forget {}`",
            args.name,
            args.name,
            args.name
        );
    }
    if !args.domains.is_empty() && args.domains.len() != args.members.len() {
        bail!(
            "--domains lists {} labels for {} members: give one label per member, in order",
            args.domains.len(),
            args.members.len()
        );
    }
    // Every value is checked before a file is created or a member touched.
    spec_of(&args, false).check(args.members.len())?;
    if let Some(sz) = args.size_each {
        check_member_size("--size-each", sz, args.chunk)?;
    }
    if args.size_each.is_none() {
        for m in &args.members {
            members::check_exists(m)?;
        }
    }
    let space = members::space_needed(&args.members, args.size_each)?;
    if args.preallocate {
        members::check_preallocate(&space)?;
    }
    let created = match args.size_each {
        Some(sz) => members::create_files(&args.members, sz)?,
        None => Vec::new(),
    };
    let fresh = args.members.iter().all(|m| created.contains(m));
    let r = async {
        if args.preallocate {
            members::preallocate(&args.members)?;
        } else {
            members::warn_sparse(&space);
        }
        create_on(&args, fresh).await
    }
    .await;
    if r.is_err() {
        members::remove_created(&created);
    }
    r
}

fn spec_of(args: &CreateArgs, fresh: bool) -> CreateSpec {
    CreateSpec {
        name: args.name.clone(),
        level: args.level,
        // A chunk beyond u32 is refused by the check like any other unsupported chunk.
        chunk: u32::try_from(args.chunk).unwrap_or(0),
        groups: args.groups,
        spares: args.spares,
        copies: args.copies,
        bitmap_region: args.bitmap_region,
        assume_clean: args.assume_clean || fresh,
        force: args.force,
    }
}

/// A size for member files sbod creates: room for the metadata and a chunk, and no more
/// than a member may hold.
fn check_member_size(opt: &str, size: u64, chunk: u64) -> Result<()> {
    let min = (1 << 20) + chunk.max(4096) * 2;
    if size < min {
        bail!(
            "{opt} {}: a member needs room for sbod's metadata (about 1 MiB) and data; give at least {}",
            sbod_core::layout::human(size),
            sbod_core::layout::human(min.div_ceil(1 << 20) * (1 << 20))
        );
    }
    if size > core_array::MAX_MEMBER_DATA {
        bail!(
            "{opt} {}: at most {} per member",
            sbod_core::layout::human(size),
            sbod_core::layout::human(core_array::MAX_MEMBER_DATA)
        );
    }
    Ok(())
}

async fn create_on(args: &CreateArgs, fresh: bool) -> Result<()> {
    let mut specs = Vec::new();
    for (i, m) in args.members.iter().enumerate() {
        let abs = members::canonical(m)?;
        let dom = args.domains.get(i).cloned().unwrap_or_default();
        specs.push(members::open(&abs, &dom)?);
    }
    let array = Array::create(spec_of(args, fresh), specs).await?;
    save_registry(&array)?;
    let status = array.status();
    let needs_sync = status.resync_offset.is_some();
    array.close().await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&status)?);
    } else {
        println!(
            "created {}: {} over {} members, {} usable",
            args.name,
            output::layout_desc(&status),
            status.members.len(),
            sbod_core::layout::human(status.size)
        );
        if needs_sync {
            println!("initial parity sync runs in the background while the array is served (sbod serve {})", args.name);
        }
        println!("serve it with: sbod serve {}", args.name);
    }
    Ok(())
}

pub async fn assemble(args: AssembleArgs) -> Result<()> {
    let mut specs = Vec::new();
    for m in &args.members {
        let abs = members::canonical(m)?;
        specs.push(members::open(&abs, "")?);
    }
    let known = args.name.as_deref().and_then(|n| state::load(n).ok());
    let array = Array::assemble(
        specs,
        AssembleOptions {
            force: args.force,
            degraded: args.degraded,
            ..Default::default()
        },
    )
    .await
    .map_err(|e| explain(e, known.as_ref()))?;
    if let Some(n) = &args.name {
        if n != &array.name {
            eprintln!(
                "note: the superblocks name this array '{}'; registering it as '{n}'",
                array.name
            );
        }
    }
    let name = args.name.clone().unwrap_or_else(|| array.name.clone());
    let reg = state::load(&name).ok();
    if let Some(reg) = &reg {
        if reg.uuid != array.uuid.to_string() && !args.force {
            array.close().await.ok();
            bail!(
                "'{name}' is already registered for another array ({}); use --name to pick another name or --force to replace the registration",
                reg.uuid
            );
        }
    }
    if control::running(&name).await {
        array.close().await.ok();
        bail!("'{name}' is being served right now; stop it first");
    }
    let rep = array.report();
    let rescue = array.is_read_only();
    // Recover stale members now, with progress, so the array is whole when we return.
    let rebuilding = !rescue
        && array
            .status()
            .members
            .iter()
            .any(|m| m.state == "rebuilding" || m.state == "replacing");
    if rebuilding {
        run_with_progress(&array, "rebuild", array.rebuild_now()).await?;
    }
    let st = array.status();
    let mut reg_name_array = st.clone();
    reg_name_array.name = name.clone();
    let lines = report_lines(&array, reg.as_ref());
    save_registry_as(&array, &name)?;
    array.close().await?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(
                &serde_json::json!({"status": reg_name_array, "assembly": rep})
            )?
        );
    } else {
        println!(
            "assembled {name}: {} ({})",
            output::layout_desc(&st),
            st.state
        );
        if rep.unclean && rescue {
            println!("  not shut down cleanly (nothing resynced: read-only)");
        } else if rep.unclean {
            println!(
                "  not shut down cleanly: resynced {} region(s), {}",
                rep.resynced_regions,
                sbod_core::layout::human(rep.resynced_bytes)
            );
        }
        for l in &lines {
            println!("  {l}");
        }
        for r in st.recoveries.iter().filter(|r| r.state == "done") {
            println!("  {}", output::recovery_line(r));
        }
        for (p, why) in &rep.ignored {
            println!("  {p}: ignored: {why}");
        }
        if rescue {
            println!(
                "  serve it read-only with: sbod serve {name} --force (copy the data off; nothing is written to the members)"
            );
        }
    }
    Ok(())
}

fn save_registry_as(array: &Array, name: &str) -> Result<()> {
    save_registry(array)?;
    if name != array.name {
        let mut r = state::load(&array.name)?;
        state::forget(&array.name)?;
        r.name = name.to_string();
        state::save(&r)?;
    }
    Ok(())
}

/// Status of a named array: from its server, or read from its members.
pub async fn fetch_status(name: &str) -> Result<(Status, bool)> {
    if let Some(v) = control::call(name, &Request::Status).await? {
        return Ok((
            serde_json::from_value(v).context("status from the server")?,
            true,
        ));
    }
    let a = open_offline(
        name,
        AssembleOptions {
            read_only: true,
            ..Default::default()
        },
    )
    .await?;
    let s = a.status();
    a.close().await.ok();
    Ok((s, false))
}

pub async fn status(args: StatusArgs) -> Result<()> {
    let names = match &args.name {
        Some(n) => vec![n.clone()],
        None => state::list()?,
    };
    if names.is_empty() && !args.json {
        println!(
            "no arrays (state directory {})",
            state::state_dir().display()
        );
        return Ok(());
    }
    let mut all = Vec::new();
    for n in &names {
        let (mut s, running) = fetch_status(n).await?;
        if let Ok(reg) = state::load(n) {
            for m in s.members.iter_mut() {
                if m.path.is_none() {
                    m.path = m.uuid.as_deref().and_then(|u| reg.failed_path(u));
                }
            }
        }
        all.push((s, running));
    }
    if args.json {
        let v: Vec<serde_json::Value> = all
            .iter()
            .map(|(s, r)| {
                let mut v = serde_json::to_value(s).expect("status serialises");
                v["running"] = serde_json::Value::Bool(*r);
                v
            })
            .collect();
        if args.name.is_some() {
            println!("{}", serde_json::to_string_pretty(&v[0])?);
        } else {
            println!("{}", serde_json::to_string_pretty(&v)?);
        }
    } else {
        for (s, r) in &all {
            output::print_status(s, *r);
        }
    }
    Ok(())
}

pub async fn examine(args: ExamineArgs) -> Result<()> {
    let mut out = Vec::new();
    for p in &args.members {
        let spec = members::open_read_only(p)?;
        let sb = core_array::read_superblock(&spec.dev).await;
        spec.dev.close();
        match sb {
            Ok(sb) => out.push((p.clone(), Ok(sb))),
            Err(e) => out.push((p.clone(), Err(e.to_string()))),
        }
    }
    if args.json {
        let v: Vec<serde_json::Value> = out
            .iter()
            .map(|(p, r)| match r {
                Ok(sb) => serde_json::json!({"path": p, "superblock": sb}),
                Err(e) => serde_json::json!({"path": p, "error": e}),
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let mut bad = false;
    for (p, r) in out {
        match r {
            Ok(sb) => output::print_superblock(&p, &sb),
            Err(e) => {
                bad = true;
                println!("{p}: {e}");
            }
        }
    }
    if bad {
        bail!("some members have no valid sbod superblock");
    }
    Ok(())
}

/// Name a member the way the engine knows it: an absolute path, or the uuid of a failed
/// member that is no longer open.
fn member_ref(name: &str, p: &str) -> String {
    let abs = members::canonical(p).unwrap_or_else(|_| p.to_string());
    if let Ok(reg) = state::load(name) {
        if let Some(u) = reg.failed_uuid(&abs) {
            return u;
        }
    }
    abs
}

/// What a `fail` left: serving degraded, or failed.
fn fail_outcome(name: &str, member: &str, s: &Status, served: bool) -> String {
    if s.state == "failed" {
        format!(
            "{name}: {member} failed; the array has FAILED ({}): its data is unavailable until members come back (`sbod assemble --force` starts it read-only to rescue what is readable)",
            s.failed_reason.as_deref().unwrap_or("too many members out")
        )
    } else if served {
        format!(
            "{name}: {member} failed; the array keeps serving, {}",
            s.state
        )
    } else {
        format!("{name}: {member} marked failed; the array is {}", s.state)
    }
}

pub async fn fail(args: FailArgs) -> Result<()> {
    let member = member_ref(&args.name, &args.member);
    if control::call(
        &args.name,
        &Request::Fail {
            member: member.clone(),
            force: args.force,
        },
    )
    .await?
    .is_some()
    {
        let (s, _) = fetch_status(&args.name).await?;
        println!("{}", fail_outcome(&args.name, &args.member, &s, true));
        return Ok(());
    }
    let a = open_offline(
        &args.name,
        AssembleOptions {
            no_processes: true,
            degraded: true,
            ..Default::default()
        },
    )
    .await?;
    let r = a.fail(&member, args.force).await;
    save_registry(&a)?;
    let s = a.status();
    a.close().await.ok();
    r?;
    println!("{}", fail_outcome(&args.name, &args.member, &s, false));
    Ok(())
}

pub async fn remove(args: MemberArgs) -> Result<()> {
    let member = member_ref(&args.name, &args.member);
    if control::call(
        &args.name,
        &Request::Remove {
            member: member.clone(),
        },
    )
    .await?
    .is_some()
    {
        println!("{}: {} removed", args.name, args.member);
        return Ok(());
    }
    let a = open_offline(
        &args.name,
        AssembleOptions {
            no_processes: true,
            degraded: true,
            ..Default::default()
        },
    )
    .await?;
    let r = a.remove(&member).await;
    save_registry(&a)?;
    a.close().await.ok();
    r?;
    println!("{}: {} removed", args.name, args.member);
    Ok(())
}

/// Create the new members' files where a size is given (recorded in `created`), give
/// them their space with `preallocate` (else warn where sparse files cannot all grow),
/// and name them absolutely.
fn prepare_new(
    paths: &[String],
    size: Option<u64>,
    preallocate: bool,
    created: &mut Vec<String>,
) -> Result<Vec<String>> {
    if let Some(sz) = size {
        check_member_size("--size", sz, 4096)?;
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
        members::warn_sparse(&space);
    }
    Ok(abs)
}

/// What `add` did with a device, in words.
fn added(name: &str, p: &str, o: &AddOutcome) -> String {
    match o {
        AddOutcome::Spare => format!("{name}: added {p} as a hot spare"),
        AddOutcome::Rebuilding { slot } => {
            format!("{name}: added {p}; it takes slot {slot} and is rebuilt in full")
        }
        AddOutcome::ReAdded(r) => format!(
            "{name}: {p} re-added to slot {} (it was at event {}, the array at {}): {}",
            r.slot,
            r.member_event,
            r.array_event,
            if r.bitmap {
                format!(
                    "resyncing {} written while it was out, from the write-intent bitmap",
                    sbod_core::layout::human(r.planned_bytes)
                )
            } else {
                format!(
                    "rebuilding it in full, {} (the bitmap does not cover its event)",
                    sbod_core::layout::human(r.planned_bytes)
                )
            }
        ),
    }
}

pub async fn add(args: AddArgs) -> Result<()> {
    let mut created = Vec::new();
    let r = add_new(&args, &mut created).await;
    if r.is_err() {
        members::remove_created(&created);
    }
    r
}

async fn add_new(args: &AddArgs, created: &mut Vec<String>) -> Result<()> {
    let paths = prepare_new(&args.members, args.size, args.preallocate, created)?;
    if control::running(&args.name).await {
        for p in &paths {
            let v = control::call(
                &args.name,
                &Request::Add {
                    member: p.clone(),
                    domain: args.domain.clone(),
                    force: args.force,
                },
            )
            .await?;
            keep(created, p);
            match v.and_then(|v| serde_json::from_value::<AddOutcome>(v).ok()) {
                Some(o) => println!("{}", added(&args.name, p, &o)),
                None => println!("{}: added {p}", args.name),
            }
        }
        return Ok(());
    }
    let a = open_offline(
        &args.name,
        AssembleOptions {
            no_processes: true,
            degraded: true,
            ..Default::default()
        },
    )
    .await?;
    let mut result = Ok(());
    for p in &paths {
        if a.state().live_members().iter().any(|m| &m.path == p) {
            // A missing member that is back: assembly took it in already.
            println!("{}: {p} is back in the array", args.name);
            continue;
        }
        let spec = match members::open(p, &args.domain) {
            Ok(s) => s,
            Err(e) => {
                result = Err(e);
                break;
            }
        };
        match a.add(spec, args.force).await {
            Ok(o) => {
                keep(created, p);
                println!("{}", added(&args.name, p, &o))
            }
            Err(e) => {
                result = Err(anyhow!(e));
                break;
            }
        }
    }
    if result.is_ok() && a.status().members.iter().any(|m| m.state == "rebuilding") {
        result = run_with_progress(&a, "rebuild", a.rebuild_now()).await;
        for r in a.status().recoveries.iter().filter(|r| r.state == "done") {
            println!("{}: {}", args.name, output::recovery_line(r));
        }
    }
    save_registry(&a)?;
    a.close().await.ok();
    result
}

/// A file `prepare_new` created has become a member: it stays whatever happens next.
fn keep(created: &mut Vec<String>, member: &str) {
    created.retain(|c| state::absolute(std::path::Path::new(c)).ok().as_deref() != Some(member));
}

pub async fn replace(args: ReplaceArgs) -> Result<()> {
    let mut created = Vec::new();
    let r = replace_with(&args, &mut created).await;
    if r.is_err() {
        members::remove_created(&created);
    }
    r
}

async fn replace_with(args: &ReplaceArgs, created: &mut Vec<String>) -> Result<()> {
    let new = prepare_new(
        std::slice::from_ref(&args.new),
        args.size,
        args.preallocate,
        created,
    )?
    .remove(0);
    let old = member_ref(&args.name, &args.old);
    if control::running(&args.name).await {
        control::call(
            &args.name,
            &Request::Replace {
                old,
                new: new.clone(),
                force: args.force,
            },
        )
        .await?;
        keep(created, &new);
        println!(
            "{}: rebuilding {} to replace {}",
            args.name, args.new, args.old
        );
        if args.wait {
            wait_remote(&args.name, "rebuild", |s| {
                s.process
                    .as_ref()
                    .is_some_and(|p| p.kind == sbod_core::process::ProcessKind::Rebuild)
                    || s.state == "rebuilding"
            })
            .await?;
            println!("{}: replacement complete", args.name);
        } else {
            println!("watch it with: sbod status {}", args.name);
        }
        return Ok(());
    }
    let a = open_offline(
        &args.name,
        AssembleOptions {
            no_processes: true,
            degraded: true,
            ..Default::default()
        },
    )
    .await?;
    let mut r = match members::open(&new, "") {
        Ok(spec) => a
            .replace(&old, spec, args.force)
            .await
            .map_err(|e| anyhow!(e)),
        Err(e) => Err(e),
    };
    if r.is_ok() {
        keep(created, &new);
        save_registry(&a)?;
        r = run_with_progress(&a, "rebuild", a.rebuild_now()).await;
    }
    save_registry(&a)?;
    a.close().await.ok();
    r?;
    println!("{}: {} replaced by {}", args.name, args.old, args.new);
    Ok(())
}

pub async fn scrub(args: ScrubArgs) -> Result<()> {
    let kind = if args.repair { "repair" } else { "check" };
    let result: ProcessStatus = if control::call(
        &args.name,
        &Request::Scrub {
            repair: args.repair,
        },
    )
    .await?
    .is_some()
    {
        let s = wait_remote(&args.name, kind, |s| {
            s.process.as_ref().is_some_and(|p| {
                matches!(
                    p.kind,
                    sbod_core::process::ProcessKind::Check
                        | sbod_core::process::ProcessKind::Repair
                )
            })
        })
        .await?;
        s.last_process
            .ok_or_else(|| anyhow!("the server did not report the scrub's result"))?
    } else {
        let a = open_offline(
            &args.name,
            AssembleOptions {
                no_processes: true,
                ..Default::default()
            },
        )
        .await?;
        let r = async {
            let h = a.start_scrub(args.repair)?;
            run_with_progress(&a, kind, async {
                h.wait().await;
                Ok(())
            })
            .await?;
            Ok::<_, anyhow::Error>(h.status())
        }
        .await;
        a.close().await.ok();
        r?
    };
    if let Some(e) = &result.error {
        bail!("scrub of '{}' stopped: {e}", args.name);
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&result)?);
    } else {
        output::print_scrub(&args.name, &result);
    }
    Ok(())
}

pub async fn stop(args: NameArgs) -> Result<()> {
    if control::call(&args.name, &Request::Stop).await?.is_none() {
        state::load(&args.name)?;
        println!("{} is not running", args.name);
        return Ok(());
    }
    for _ in 0..600 {
        if !control::running(&args.name).await {
            println!("{} stopped", args.name);
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("{} did not stop within 60 s", args.name)
}

pub async fn forget(args: NameArgs) -> Result<()> {
    if control::running(&args.name).await {
        bail!("{} is being served; stop it first", args.name);
    }
    state::load(&args.name)?;
    state::forget(&args.name)?;
    println!(
        "{} forgotten (its members keep their superblocks; `sbod assemble` brings it back)",
        args.name
    );
    Ok(())
}

pub async fn set(args: SetArgs) -> Result<()> {
    let req = Request::Set {
        rebuild_min_rate: args.rebuild_min_rate,
        rebuild_max_rate: args.rebuild_max_rate,
    };
    match control::call(&args.name, &req).await? {
        Some(v) => {
            println!("{}", serde_json::to_string_pretty(&v)?);
            Ok(())
        }
        None => bail!(
            "{} is not running: settings apply to a served array (sbod serve {})",
            args.name,
            args.name
        ),
    }
}

/// Run a foreground process, drawing a progress bar from the array's current process.
pub async fn run_with_progress<F>(array: &Arc<Array>, what: &str, fut: F) -> Result<()>
where
    F: std::future::Future<Output = sbod_core::Result<()>>,
{
    let bar = output::progress_bar(what);
    let a = array.clone();
    let b = bar.clone();
    let ticker = tokio::spawn(async move {
        loop {
            if let Some(p) = a.current_process() {
                let s = p.status();
                b.set_length(s.total.max(1));
                b.set_position(s.done);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    let r = fut.await;
    ticker.abort();
    if let Some(p) = array.current_process() {
        let s = p.status();
        bar.set_length(s.total.max(1));
        bar.set_position(s.done);
    }
    bar.finish_and_clear();
    r.map_err(|e| anyhow!(e))
}

/// Poll a running server until the process `active` describes is over; draws progress.
async fn wait_remote(name: &str, what: &str, active: impl Fn(&Status) -> bool) -> Result<Status> {
    let bar = output::progress_bar(what);
    let mut seen = false;
    let mut idle_polls = 0;
    loop {
        let v = control::call(name, &Request::Status)
            .await?
            .ok_or_else(|| anyhow!("the server for '{name}' went away"))?;
        let s: Status = serde_json::from_value(v)?;
        if let Some(p) = &s.process {
            bar.set_length(p.total.max(1));
            bar.set_position(p.done);
        }
        if active(&s) {
            seen = true;
            idle_polls = 0;
        } else {
            idle_polls += 1;
            if seen || idle_polls > 3 {
                bar.finish_and_clear();
                return Ok(s);
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
