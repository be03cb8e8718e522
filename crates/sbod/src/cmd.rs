//! The array commands: create, assemble, status, examine, fail, remove, add, replace,
//! scrub, stop, forget, set. Each is a call to the management library (sbod-mgmt), which
//! reaches a running array through its control socket or opens the array in this process;
//! this file holds only the arguments and the words printed.

use crate::output;
use anyhow::{bail, Result};
use clap::Args;
use sbod_core::array::Status;
use sbod_core::layout::{human, Level};
use sbod_core::AddOutcome;
use sbod_mgmt::manager::Added;
use sbod_mgmt::{registry, Manager, Offline, Reporter, Via};
use sbod_types::control as req;
use sbod_types::control::Size;
use sbod_types::SyncMode;
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
    /// The last N members are hot spares (with --declustered: N members' worth of spare
    /// space spread over all of them).
    #[arg(long, short, default_value_t = 0)]
    pub spares: usize,
    /// Spread the groups' stripes and the spare space over every member, in a fixed
    /// pseudorandom order (raid5, raid6, ec:K+M; OpenZFS dRAID's idea): a failed member's
    /// chunks are rebuilt from and onto every survivor at once. `--level raid6 --groups 2
    /// --spares 2 --declustered` on 22 members: two groups' worth of 8+2 stripes and two
    /// members' worth of spare space on all 22.
    #[arg(long)]
    pub declustered: bool,
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
    /// Checksums on every block: crc32c (a crc32c per 4 KiB block, verified on every
    /// read; wrong data is rebuilt from redundancy or answered with EIO) or none.
    #[arg(long, default_value = "crc32c")]
    pub integrity: sbod_types::Integrity,
    /// What FLUSH and FUA do: standard (as the NBD spec says), always (every write is
    /// FUA) or disabled (acknowledged at once; a power cut loses the last seconds).
    #[arg(long, default_value = "standard")]
    pub sync: SyncMode,
    /// A log device (an SSD, NVMe): give it twice for a mirrored log.
    #[arg(long = "log", value_name = "DEV")]
    pub log: Vec<String>,
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
    /// rescue what is readable. Also overwrites a registration of another array, and takes
    /// the members over from another host that holds them (that host is fenced).
    #[arg(long)]
    pub force: bool,
    #[arg(long)]
    pub json: bool,
    /// Find every array from its members' superblocks and assemble each (at boot): looks
    /// at every block device, the members of registered arrays, and the files and
    /// directories given.
    #[arg(long)]
    pub scan: bool,
    /// With --scan: look only at the places given (and the members of registered arrays),
    /// not at every block device of this host (as mdadm.conf's DEVICE line).
    #[arg(long, requires = "scan")]
    pub only: bool,
    /// Member devices or files (with --scan: more places to look, files or directories).
    #[arg(required_unless_present = "scan")]
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
    /// The devices are log devices: the first makes the array's log, a second mirrors it.
    #[arg(long)]
    pub log: bool,
    #[arg(long)]
    pub force: bool,
}

#[derive(Args, Debug)]
pub struct GrowArgs {
    pub name: String,
    /// Members to add: raid0, raid5, raid6 and ec get wider groups (every group the same
    /// number of members more), raid10 more mirror sets, raid1 more copies, concat more
    /// space. The data moves into the new layout online; the new capacity appears when
    /// it has.
    #[arg(long, num_args = 1.., value_name = "DEV")]
    pub add: Vec<String>,
    /// A mirror copy to drop (raid1; refused without --force while it is in service).
    #[arg(long, value_name = "MEMBER", conflicts_with = "add")]
    pub drop: Option<String>,
    /// Members to let go from raid0, raid5, raid6 or ec (the last of every group, the
    /// same number from each): the data is restriped onto the others online and the
    /// volume shrinks to what they hold. Refused while the volume holds data past the
    /// new size (shrink and discard it first, or --force to drop it).
    #[arg(long, num_args = 1.., value_name = "MEMBER", conflicts_with_all = ["add", "drop"])]
    pub remove: Vec<String>,
    /// A new chunk (a power of two from 4K to 16M): raid0, raid5, raid6, ec and raid10
    /// are restriped onto the same members online (md's `--grow --chunk`). Every window
    /// is written aside first, in the members' last rows: the volume's last part (64 MiB
    /// of every member, a quarter of a small one) is out of it while the data moves and
    /// back, as zeros, when it ends; refused while it holds data (or --force to drop it).
    #[arg(long, value_name = "SIZE", value_parser = size_arg, conflicts_with_all = ["add", "drop", "remove"])]
    pub chunk: Option<u64>,
    /// Add the members as whole new groups of the array's width, not wider groups.
    #[arg(long)]
    pub new_groups: bool,
    /// Change the level with the members added, one per group: raid0 -> raid5, raid5 ->
    /// raid6, ec:K+M -> ec:K+(M+1). Nothing moves: the new parity is rebuilt onto the new
    /// members while the array serves.
    #[arg(long, value_name = "LEVEL", requires = "add")]
    pub level: Option<Level>,
    /// Failure domain of the new members.
    #[arg(long, default_value = "")]
    pub domain: String,
    /// With --add: create missing member files of this size. Alone (`--size max` or a
    /// size per member): use more of every member, after they were replaced by larger
    /// ones or their files made longer (md's `--grow --size=max`).
    #[arg(long, value_name = "max|SIZE")]
    pub size: Option<req::MemberSize>,
    /// Give the member files all their space now (fallocate).
    #[arg(long)]
    pub preallocate: bool,
    /// Follow the reshape (or the new copies' rebuild) to its end.
    #[arg(long)]
    pub wait: bool,
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
    /// Background rate floor while clients are busy, bytes/s (e.g. 50M or 50M/s; 0 = none).
    #[arg(long, value_parser = rate_arg)]
    pub rebuild_min_rate: Option<u64>,
    /// Background rate ceiling, bytes/s (e.g. 500M; 0 = unlimited).
    #[arg(long, value_parser = rate_arg)]
    pub rebuild_max_rate: Option<u64>,
    /// What FLUSH and FUA do: standard, always or disabled (recorded on the members; works
    /// whether or not the array is served).
    #[arg(long)]
    pub sync: Option<SyncMode>,
    /// The predictive failure policy, KEY=VALUE,...: thresholds as WARN:FAIL ('-' never)
    /// for reallocated, pending, uncorrectable, media_errors, crc_errors, percentage_used,
    /// temperature; replace=on|off (copy a failing member onto a hot spare);
    /// autoreplace=on|off (a new disk in a failed member's slot replaces it);
    /// interval=SECONDS; rejoin_after=SECONDS|off (a member failed by I/O errors is tried
    /// again that long after, and taken back from the bitmap if it answers); or `default`.
    /// Kept in the state directory, served or not.
    #[arg(long, value_name = "SPEC")]
    pub health_policy: Option<String>,
}

#[derive(Args, Debug)]
pub struct HealthArgs {
    /// Array name (all known arrays if omitted).
    pub name: Option<String>,
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct LocateArgs {
    pub name: String,
    /// The member (its path as registered, or its uuid).
    pub member: String,
    /// Put the locate LED out.
    #[arg(long)]
    pub off: bool,
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
        declustered: args.declustered,
        copies: args.copies,
        size_each: args.size_each.map(Size),
        preallocate: args.preallocate,
        domains: args.domains,
        bitmap_region: args.bitmap_region.map(Size),
        assume_clean: args.assume_clean,
        integrity: args.integrity,
        sync: args.sync,
        log: args.log,
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
        if let Some(l) = &status.log {
            println!("{}", output::log_line(l));
        }
        if status.sync.mode != SyncMode::Standard {
            println!(
                "sync={}: {}",
                status.sync.mode,
                output::sync_promise(&status.sync)
            );
        }
        println!("serve it with: sbod serve {}", args.name);
    }
    Ok(())
}

pub async fn assemble(args: AssembleArgs) -> Result<()> {
    if args.scan {
        return assemble_scan(args).await;
    }
    let (st, rep, lines) = manager()
        .assemble(&req::AssembleArgs {
            name: args.name,
            degraded: args.degraded,
            force: args.force,
            members: args.members,
        })
        .await?;
    let rescue = st.read_only;
    let name = &st.name;
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
        if rep.unclean && rescue {
            println!("  not shut down cleanly (nothing resynced: read-only)");
        } else if rep.unclean {
            println!(
                "  not shut down cleanly: resynced {} region(s), {}",
                rep.resynced_regions,
                human(rep.resynced_bytes)
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

/// `sbod assemble --scan`: every array whose members can be found, as mdadm's
/// `--assemble --scan` (without a config file: the superblocks say it all).
async fn assemble_scan(args: AssembleArgs) -> Result<()> {
    if args.name.is_some() {
        bail!("--scan names each array after its superblocks (or its registration); --name is for one array");
    }
    let m = manager();
    let found = m.scan(&args.members, !args.only).await?;
    if found.is_empty() {
        if args.json {
            println!("[]");
        } else {
            println!("no sbod members found");
        }
        return Ok(());
    }
    let mut out = Vec::new();
    let mut failed = 0;
    // Members held by another program (an array served by another sbod, with its own
    // state directory, on the same devices): that array runs elsewhere; pass it over.
    let busy = |e: &anyhow::Error| {
        e.chain().any(|c| {
            c.downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::ResourceBusy)
        })
    };
    for f in found {
        let mut skipped = f.served;
        let r = if f.served {
            Err("already served".to_string())
        } else {
            m.assemble(&req::AssembleArgs {
                name: f.registered.clone(),
                degraded: args.degraded,
                force: args.force,
                members: f.members.clone(),
            })
            .await
            .map_err(|e| {
                let text = sbod_mgmt::words::message(&e, sbod_mgmt::words::Style::Cli);
                if busy(&e) {
                    skipped = true;
                    format!("in use by another program (served elsewhere?): {text}")
                } else {
                    text
                }
            })
        };
        let name = f.registered.clone().unwrap_or(f.name.clone());
        match &r {
            Ok((st, _, lines)) => {
                if !args.json {
                    println!(
                        "assembled {}: {} ({}) from {} member(s)",
                        st.name,
                        output::layout_desc(st),
                        st.state,
                        f.members.len()
                    );
                    for l in lines {
                        println!("  {l}");
                    }
                }
            }
            Err(e) if skipped => {
                if !args.json {
                    println!("{name}: {e}");
                }
            }
            Err(e) => {
                failed += 1;
                if !args.json {
                    println!("{name}: not assembled: {e}");
                }
            }
        }
        out.push(serde_json::json!({
            "name": name,
            "uuid": f.uuid,
            "members": f.members,
            "assembled": r.is_ok(),
            "skipped": skipped,
            "state": r.as_ref().ok().map(|(st, _, _)| st.state),
            "error": r.as_ref().err(),
        }));
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    }
    if failed > 0 {
        bail!("{failed} array(s) could not be assembled (see above)");
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
                eprintln!("{p}: {e}");
            }
        }
    }
    if bad {
        bail!("some members have no valid sbod superblock");
    }
    Ok(())
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
    let a = req::MemberArgs {
        member: args.member.clone(),
        force: args.force,
    };
    let m = manager();
    let via = m.fail(&args.name, &a).await?;
    let s = m.status(&args.name).await?;
    println!(
        "{}",
        fail_outcome(&args.name, &args.member, &s.status, via == Via::Served)
    );
    Ok(())
}

pub async fn remove(args: MemberArgs) -> Result<()> {
    let a = req::MemberArgs {
        member: args.member.clone(),
        force: false,
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
        preallocate: args.preallocate,
        log: args.log,
        force: args.force,
    };
    let m = manager();
    let (via, added) = m.add(&args.name, &a).await?;
    for (p, o) in added {
        println!("{}", added_line(&args.name, &p, &o));
    }
    if via == Via::Offline {
        if let Ok(s) = m.status(&args.name).await {
            for r in s.status.recoveries.iter().filter(|r| r.state == "done") {
                println!("{}: {}", args.name, output::recovery_line(r));
            }
        }
    }
    Ok(())
}

pub async fn grow(args: GrowArgs) -> Result<()> {
    let (size, member_size) = match (args.size, args.add.is_empty()) {
        (Some(req::MemberSize::Max), false) => {
            bail!("--size max uses more of the members there are: leave --add out (with --add, --size is the size of new member files)")
        }
        (Some(req::MemberSize::Bytes(b)), false) => (Some(Size(b)), None),
        (s, true) => (None, s),
        (None, false) => (None, None),
    };
    let a = req::GrowArgs {
        add: args.add,
        drop: args.drop,
        remove: args.remove,
        domain: args.domain,
        new_groups: args.new_groups,
        level: args.level,
        member_size,
        chunk: args.chunk.map(Size),
        size,
        preallocate: args.preallocate,
        force: args.force,
    };
    let m = manager();
    let (via, r) = m.grow(&args.name, &a, args.wait).await?;
    let n = &args.name;
    let shape = format!("{} in {} group(s) of {}", r.level, r.groups, r.width);
    match r.kind.as_str() {
        "reshape" if args.chunk.is_some() && via == Via::Served && !args.wait => println!(
            "{n}: restriping to a chunk of {}: {} until the data has moved (its last rows hold the windows written aside), then {} again (online; `sbod status {n}` shows progress)",
            human(r.chunk as u64),
            human(m.status(n).await.map(|s| s.status.size).unwrap_or(r.from)),
            human(r.to)
        ),
        "reshape" if args.chunk.is_some() => println!(
            "{n}: now a chunk of {} ({shape}): {}",
            human(r.chunk as u64),
            human(r.to)
        ),
        "reshape" if r.to < r.from && via == Via::Served && !args.wait => println!(
            "{n}: narrowing to {shape}: {} now (was {}); the members removed are let go when the data has moved (`sbod status {n}` shows progress)",
            human(r.to),
            human(r.from)
        ),
        "reshape" if via == Via::Served && !args.wait => println!(
            "{n}: reshaping to {shape}: {} now, {} when the data has moved (online; `sbod status {n}` shows progress)",
            human(r.from),
            human(r.to)
        ),
        "reshape" => println!(
            "{n}: reshaped to {shape}: {} (was {})",
            human(r.to),
            human(r.from)
        ),
        "copies" => println!("{n}: now {shape}: the new copies are being rebuilt"),
        "parity" if via == Via::Served && !args.wait => println!(
            "{n}: now {shape}: the new parity is being rebuilt onto the new member(s); full redundancy when it ends (`sbod status {n}`)"
        ),
        "parity" => println!("{n}: now {shape}, with its new parity in place"),
        "appended" | "resized" => println!("{n}: now {} (was {})", human(r.to), human(r.from)),
        _ => println!("{n}: now {shape}"),
    }
    if r.to != r.from && via == Via::Served {
        println!(
            "{n}: NBD clients see the new size when they connect again; qemu: `block_resize`, then grow the file system"
        );
    }
    Ok(())
}

/// What `add` did with a device, in words.
fn added_line(name: &str, p: &str, o: &Added) -> String {
    match o {
        Added::Back => format!("{name}: {p} is back in the array"),
        Added::Done => format!("{name}: added {p}"),
        Added::Log => format!("{name}: added {p} as a log device"),
        Added::Outcome(AddOutcome::Spare) => format!("{name}: added {p} as a hot spare"),
        Added::Outcome(AddOutcome::Rebuilding { slot }) => {
            format!("{name}: added {p}; it takes slot {slot} and is rebuilt in full")
        }
        Added::Outcome(AddOutcome::ReAdded(r)) => format!(
            "{name}: {p} re-added to slot {} (it was at event {}, the array at {}): {}",
            r.slot,
            r.member_event,
            r.array_event,
            if r.bitmap {
                format!(
                    "resyncing {} written while it was out, from the write-intent bitmap",
                    human(r.planned_bytes)
                )
            } else {
                format!(
                    "rebuilding it in full, {} (the bitmap does not cover its event)",
                    human(r.planned_bytes)
                )
            }
        ),
    }
}

pub async fn replace(args: ReplaceArgs) -> Result<()> {
    let a = req::ReplaceArgs {
        old: args.old.clone(),
        new: args.new.clone(),
        size: args.size.map(Size),
        preallocate: args.preallocate,
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
        sync: args.sync,
        health_policy: args.health_policy,
    };
    let s = manager().set(&args.name, &a).await?;
    if s.sync == SyncMode::Disabled && args.sync.is_some() {
        eprintln!(
            "{}: WARNING: sync=disabled: FLUSH and FUA are acknowledged at once; a power cut loses the last seconds of writes",
            args.name
        );
    }
    println!("{}", serde_json::to_string_pretty(&s)?);
    Ok(())
}

/// `sbod health [NAME] [--json]`: every member's disk health read now, with its slot and
/// stable identity, judged by the array's policy.
pub async fn health(args: HealthArgs) -> Result<()> {
    let m = manager();
    let names = match &args.name {
        Some(n) => vec![n.clone()],
        None => m.list()?,
    };
    let mut all = Vec::new();
    for n in &names {
        all.push(m.health(n).await?);
    }
    if args.json {
        let v: Vec<serde_json::Value> = all
            .iter()
            .map(|(s, p)| {
                serde_json::json!({
                    "name": s.status.name,
                    "policy": p,
                    "members": s.status.members.iter().map(|m| serde_json::json!({
                        "path": m.path, "uuid": m.uuid, "slot": m.slot, "state": m.state,
                        "health": m.health, "location": m.location, "identity": m.identity,
                    })).collect::<Vec<_>>(),
                })
            })
            .collect();
        if args.name.is_some() {
            println!("{}", serde_json::to_string_pretty(&v[0])?);
        } else {
            println!("{}", serde_json::to_string_pretty(&v)?);
        }
    } else {
        for (s, p) in &all {
            output::print_health(&s.status, p);
        }
    }
    Ok(())
}

/// `sbod locate NAME MEMBER [--off]`.
pub async fn locate(args: LocateArgs) -> Result<()> {
    let how = manager()
        .locate(&args.name, &args.member, !args.off)
        .await?;
    println!(
        "{}: locate LED of {} {} ({how})",
        args.name,
        args.member,
        if args.off { "off" } else { "on" }
    );
    Ok(())
}
