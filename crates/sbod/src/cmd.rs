//! The array commands: create, assemble, status, examine, fail, remove, add, replace,
//! scrub, stop, forget, set. Each is a call to the management library (sbod-mgmt), which
//! reaches a running array through its control socket or opens the array in this process;
//! this file holds only the arguments and the words printed.

use crate::output;
use anyhow::{bail, Result};
use clap::Args;
use sbod_core::layout::{human, Level};
use sbod_mgmt::{registry, Manager, Offline, Reporter, Via};
use sbod_types::control as req;
use sbod_types::control::Size;
use std::sync::Arc;

/// Sizes on the command line follow the one rule of `sbod_types::size`.
pub(crate) use sbod_types::size::{parse_rate as rate_arg, parse_size as size_arg};

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
    /// Start even if the array is failed (to rescue what is readable); overwrite a
    /// registration of another array with the same name.
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
    /// Background rate floor while clients are busy, bytes/s (e.g. 50M or 50M/s; 0 = none).
    #[arg(long, value_parser = rate_arg)]
    pub rebuild_min_rate: Option<u64>,
    /// Background rate ceiling, bytes/s (e.g. 500M; 0 = unlimited).
    #[arg(long, value_parser = rate_arg)]
    pub rebuild_max_rate: Option<u64>,
}

/// The CLI's reporter: notes on stderr, progress as a bar.
struct Terminal {
    bar: parking_lot::Mutex<Option<indicatif::ProgressBar>>,
}

impl Reporter for Terminal {
    fn note(&self, msg: &str) {
        eprintln!("{msg}");
    }

    fn progress(&self, what: &str, done: u64, total: u64) {
        let mut b = self.bar.lock();
        let bar = b.get_or_insert_with(|| output::progress_bar(what));
        bar.set_length(total.max(1));
        bar.set_position(done);
    }

    fn progress_done(&self) {
        if let Some(b) = self.bar.lock().take() {
            b.finish_and_clear();
        }
    }
}

/// The management library as the CLI uses it: long work on an array nothing serves runs
/// here, in the foreground, with a progress bar.
pub fn manager() -> Manager {
    Manager::new(
        Arc::new(Terminal {
            bar: parking_lot::Mutex::new(None),
        }),
        Offline::Foreground,
    )
}

pub async fn create(args: CreateArgs) -> Result<()> {
    let a = req::CreateArgs {
        name: args.name.clone(),
        level: args.level,
        chunk: Size(args.chunk),
        groups: args.groups,
        spares: args.spares,
        copies: args.copies,
        size_each: args.size_each.map(Size),
        domains: args.domains,
        bitmap_region: args.bitmap_region.map(Size),
        assume_clean: args.assume_clean,
        force: args.force,
        members: args.members,
    };
    let status = manager().create(&a).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&status)?);
    } else {
        println!(
            "created {}: {} over {} members, {} usable",
            args.name,
            output::layout_desc(&status),
            status.members.len(),
            human(status.size)
        );
        if status.resync_offset.is_some() {
            println!("initial parity sync runs in the background while the array is served (sbod serve {})", args.name);
        }
        println!("serve it with: sbod serve {}", args.name);
    }
    Ok(())
}

pub async fn assemble(args: AssembleArgs) -> Result<()> {
    let (st, rep) = manager()
        .assemble(&req::AssembleArgs {
            name: args.name,
            force: args.force,
            members: args.members,
        })
        .await?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({"status": st, "assembly": rep}))?
        );
    } else {
        println!(
            "assembled {}: {} ({})",
            st.name,
            output::layout_desc(&st),
            st.state
        );
        if rep.unclean {
            println!(
                "  not shut down cleanly: resynced {} region(s), {}",
                rep.resynced_regions,
                human(rep.resynced_bytes)
            );
        }
        for p in &rep.rebuilding {
            println!("  {p}: stale or incomplete, rebuilt");
        }
        for (p, why) in &rep.ignored {
            println!("  {p}: ignored: {why}");
        }
        for s in &rep.missing {
            println!("  slot {s}: missing");
        }
    }
    Ok(())
}

pub async fn status(args: StatusArgs) -> Result<()> {
    let m = manager();
    let names = match &args.name {
        Some(n) => vec![n.clone()],
        None => m.list()?,
    };
    if names.is_empty() && !args.json {
        println!(
            "no arrays (state directory {})",
            registry::state_dir().display()
        );
        return Ok(());
    }
    let mut all = Vec::new();
    for n in &names {
        all.push(m.status(n).await?);
    }
    if args.json {
        if args.name.is_some() {
            println!("{}", serde_json::to_string_pretty(&all[0])?);
        } else {
            println!("{}", serde_json::to_string_pretty(&all)?);
        }
    } else {
        for s in &all {
            output::print_status(&s.status, s.running);
        }
    }
    Ok(())
}

pub async fn examine(args: ExamineArgs) -> Result<()> {
    let out = manager().examine(&args.members).await;
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

pub async fn fail(args: MemberArgs) -> Result<()> {
    let a = req::MemberArgs {
        member: args.member.clone(),
    };
    match manager().fail(&args.name, &a).await? {
        Via::Served => println!(
            "{}: {} failed; the array keeps serving",
            args.name, args.member
        ),
        Via::Offline => println!("{}: {} marked failed", args.name, args.member),
    }
    Ok(())
}

pub async fn remove(args: MemberArgs) -> Result<()> {
    let a = req::MemberArgs {
        member: args.member.clone(),
    };
    manager().remove(&args.name, &a).await?;
    println!("{}: {} removed", args.name, args.member);
    Ok(())
}

pub async fn add(args: AddArgs) -> Result<()> {
    let a = req::AddArgs {
        members: args.members,
        domain: args.domain,
        size: args.size.map(Size),
        force: args.force,
    };
    let (_, added) = manager().add(&args.name, &a).await?;
    for p in added {
        println!("{}: added {p}", args.name);
    }
    Ok(())
}

pub async fn replace(args: ReplaceArgs) -> Result<()> {
    let a = req::ReplaceArgs {
        old: args.old.clone(),
        new: args.new.clone(),
        size: args.size.map(Size),
        force: args.force,
    };
    match manager().replace(&args.name, &a, args.wait).await? {
        Via::Served => {
            println!(
                "{}: rebuilding {} to replace {}",
                args.name, args.new, args.old
            );
            if args.wait {
                println!("{}: replacement complete", args.name);
            } else {
                println!("watch it with: sbod status {}", args.name);
            }
        }
        Via::Offline => println!("{}: {} replaced by {}", args.name, args.old, args.new),
    }
    Ok(())
}

pub async fn scrub(args: ScrubArgs) -> Result<()> {
    let result = manager()
        .scrub(
            &args.name,
            &req::ScrubArgs {
                repair: args.repair,
            },
            true,
        )
        .await?;
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
    if manager().stop(&args.name).await? {
        println!("{} stopped", args.name);
    } else {
        println!("{} is not running", args.name);
    }
    Ok(())
}

pub async fn forget(args: NameArgs) -> Result<()> {
    manager().forget(&args.name).await?;
    println!(
        "{} forgotten (its members keep their superblocks; `sbod assemble` brings it back)",
        args.name
    );
    Ok(())
}

pub async fn set(args: SetArgs) -> Result<()> {
    let a = req::SetArgs {
        rebuild_min_rate: args.rebuild_min_rate.map(Size),
        rebuild_max_rate: args.rebuild_max_rate.map(Size),
    };
    let s = manager().set(&args.name, &a).await?;
    println!("{}", serde_json::to_string_pretty(&s)?);
    Ok(())
}
