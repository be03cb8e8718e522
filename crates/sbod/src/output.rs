//! Human output: tables, sizes, progress bars.

use indicatif::{ProgressBar, ProgressStyle};
use sbod_core::array::{RecoveryStatus, Status};
use sbod_core::layout::{human, Level};
use sbod_core::process::ProcessStatus;
use sbod_core::superblock::Superblock;
use sbod_types::{LogStatus, SyncStatus};

pub fn layout_desc(s: &Status) -> String {
    let desc = level_desc(s);
    match s.integrity {
        sbod_types::Integrity::None => desc,
        i => format!("{desc}, checksums {i}"),
    }
}

fn level_desc(s: &Status) -> String {
    let chunk = human(s.chunk as u64);
    match s.level {
        Level::Raid10 => format!(
            "raid10 ({} mirror sets of {}), chunk {chunk}",
            s.groups, s.width
        ),
        Level::Concat => "concat".to_string(),
        _ if s.groups > 1 => format!(
            "{} in {} groups of {}, chunk {chunk}",
            s.level, s.groups, s.width
        ),
        _ => format!("{} of {}, chunk {chunk}", s.level, s.width),
    }
}

fn short(p: &str) -> String {
    if let Ok(cwd) = std::env::current_dir() {
        if let Ok(rel) = std::path::Path::new(p).strip_prefix(&cwd) {
            return rel.to_string_lossy().to_string();
        }
    }
    p.to_string()
}

pub fn print_status(s: &Status, running: bool) {
    println!(
        "{}: {}, {} usable, {}{}",
        s.name,
        layout_desc(s),
        human(s.size),
        s.state.as_str().to_uppercase(),
        if running { " (served)" } else { "" }
    );
    if let Some(why) = &s.failed_reason {
        println!("  failed: {why}");
        println!(
            "  bring the members back and start it again, or rescue what is readable: sbod serve {} --force (read-only)",
            s.name
        );
    }
    if let Some(by) = &s.fenced {
        println!("  fenced: {by}; this head writes nothing more (writes fail with EIO)");
    }
    if s.read_only {
        println!("  read-only: started to rescue what is readable; writes are refused");
    }
    let width = s
        .members
        .iter()
        .filter_map(|m| m.path.as_ref().map(|p| short(p).len()))
        .max()
        .unwrap_or(4)
        .max(6);
    println!(
        "  {:<5} {:<5} {:<width$} {:<11} {:<8} {:>9} {:>6} {:>6} {:>6} {:>6}",
        "slot", "group", "member", "state", "domain", "size", "read", "write", "cksum", "tags"
    );
    for m in &s.members {
        let slot = m.slot.map(|x| x.to_string()).unwrap_or_else(|| "-".into());
        let group = m.group.map(|x| x.to_string()).unwrap_or_else(|| "-".into());
        let path = m
            .path
            .as_deref()
            .map(short)
            .unwrap_or_else(|| format!("({})", m.uuid.as_deref().unwrap_or("?")));
        let mut state = m.state.to_string();
        if let (Some(r), true) = (m.recovered, m.size > 0) {
            state = format!("{state} {:.0}%", 100.0 * r as f64 / m.size as f64);
        }
        println!(
            "  {:<5} {:<5} {:<width$} {:<11} {:<8} {:>9} {:>6} {:>6} {:>6} {:>6}",
            slot,
            group,
            path,
            state,
            if m.domain.is_empty() { "-" } else { &m.domain },
            if m.size > 0 {
                human(m.size)
            } else {
                "-".into()
            },
            m.read_errors,
            m.write_errors,
            m.checksum_errors,
            m.tag_errors
        );
    }
    for m in &s.members {
        if let Some(r) = &m.reason {
            let who = m
                .path
                .as_deref()
                .map(short)
                .unwrap_or_else(|| format!("slot {}", m.slot.unwrap_or(0)));
            println!("  {who}: {r}");
        }
    }
    for r in &s.recoveries {
        println!("  {}", recovery_line(r));
    }
    if let Some(p) = &s.process {
        println!("  {}", process_line(p));
    }
    if let Some(r) = s.resync_offset {
        println!("  initial sync at {}", human(r));
    }
    println!("  sync: {}: {}", s.sync.mode, sync_promise(&s.sync));
    if let Some(l) = &s.log {
        println!("  {}", log_line(l));
        for d in &l.devices {
            println!(
                "    {} {}{}{}",
                d.path
                    .as_deref()
                    .map(short)
                    .unwrap_or_else(|| format!("({})", d.uuid)),
                d.state,
                d.reason
                    .as_deref()
                    .map(|r| format!(" ({r})"))
                    .unwrap_or_default(),
                if d.write_errors > 0 {
                    format!(", {} write errors", d.write_errors)
                } else {
                    String::new()
                }
            );
        }
    }
}

/// What a power cut costs in an array's sync mode.
pub fn sync_promise(s: &SyncStatus) -> String {
    s.mode.promise(s.interval_secs)
}

/// "log: optimal, mirrored, 12 MiB of 1 GiB in use, 340 records, ...".
pub fn log_line(l: &LogStatus) -> String {
    let mut out = format!(
        "log: {}, {}",
        l.state,
        if l.devices.len() > 1 {
            "mirrored"
        } else {
            "one device"
        }
    );
    if l.capacity > 0 {
        out += &format!(
            ", {} of {} in use, {} records ({}) since the start, {} checkpoints",
            human(l.used),
            human(l.capacity),
            l.records,
            human(l.bytes),
            l.checkpoints
        );
    }
    if l.replayed_records > 0 {
        out += &format!(", {} records replayed at the start", l.replayed_records);
    }
    let lost: Vec<String> = l
        .replay_issues
        .iter()
        .filter(|i| i.lost)
        .map(|i| i.seq.to_string())
        .collect();
    if !lost.is_empty() {
        out += &format!(
            "; it lost acknowledged record(s) {} at the start (forced): their ranges may read stale",
            lost.join(", ")
        );
    } else if !l.replay_issues.is_empty() {
        out += &format!(
            "; {} damaged record(s) at the start, nothing lost",
            l.replay_issues.len()
        );
    }
    if !l.journaling && l.state != sbod_types::LogState::Failed {
        // Attached by an sbod that did not journal: trusted from the next start on.
        out += "; the members do not yet trust it with this session's writes";
    }
    out
}

/// One member's recovery: "d2.img (slot 2): resynced 12 MiB of 12 MiB from the write-intent
/// bitmap (stale: event 4, array at 6)".
pub fn recovery_line(r: &RecoveryStatus) -> String {
    let verb = match r.state.as_str() {
        "done" => "recovered",
        "stopped" => "stopped after",
        _ => "recovering:",
    };
    format!(
        "{} (slot {}): {verb} {} of {} {} ({})",
        short(&r.path),
        r.slot,
        human(r.recovered_bytes),
        human(r.planned_bytes),
        if r.bitmap {
            "from the write-intent bitmap"
        } else {
            "in full"
        },
        r.reason
    )
}

pub fn process_line(p: &ProcessStatus) -> String {
    let eta = p
        .eta_secs
        .map(|e| format!(", {:.0}s left", e))
        .unwrap_or_default();
    format!(
        "{:?}: {:.1}% ({} of {}) at {}/s{eta}",
        p.kind,
        p.percent,
        human(p.done),
        human(p.total),
        human(p.rate as u64)
    )
    .to_lowercase()
}

pub fn print_scrub(name: &str, p: &ProcessStatus) {
    let what = format!("{:?}", p.kind).to_lowercase();
    println!(
        "{name}: {what} of {} done in {:.1}s: {} mismatched block(s){}",
        human(p.total),
        p.elapsed_secs,
        p.mismatches,
        if p.repaired > 0 {
            format!(", {} repaired", p.repaired)
        } else {
            String::new()
        }
    );
    if p.tags_repaired > 0 {
        println!(
            "  {} damaged checksum(s) over right data rewritten (tags repaired; the data was not wrong)",
            p.tags_repaired
        );
    }
    for r in &p.regions {
        println!(
            "  group {} at member offset {} (volume offset {}): {} block(s)",
            r.group,
            human(r.member_offset),
            r.volume_offset,
            r.blocks
        );
    }
    if p.mismatches > 0 && p.repaired == 0 {
        println!("  run `sbod scrub {name} --repair` to fix them");
    }
}

pub fn print_superblock(path: &str, sb: &Superblock) {
    let g = &sb.geometry;
    println!("{path}:");
    println!("  array      {} ({})", sb.name, sb.array_uuid);
    println!(
        "  layout     {} groups {} width {} chunk {}",
        g.level,
        g.groups,
        g.width,
        human(g.chunk as u64)
    );
    println!(
        "  member     {} ({:?})",
        sb.this_member,
        sb.role_of(&sb.this_member)
    );
    println!(
        "  event      {}  {}",
        sb.event,
        if sb.clean { "clean" } else { "active/unclean" }
    );
    println!(
        "  data       {} at offset {}",
        human(g.member_size),
        human(g.data_offset)
    );
    for (i, s) in sb.slots.iter().enumerate() {
        let who = s
            .member
            .as_ref()
            .map(|m| m.uuid.to_string())
            .unwrap_or_else(|| "-".into());
        println!(
            "  slot {i:<3} {:<10} {who}",
            format!("{:?}", s.state).to_lowercase()
        );
    }
    for m in &sb.spares {
        println!("  spare      {}", m.uuid);
    }
    println!("  sync       {}", sb.sync);
    for l in &sb.log.devices {
        println!(
            "  log        {} {}",
            l.uuid,
            if l.active { "active" } else { "out" }
        );
    }
}

pub fn progress_bar(what: &str) -> ProgressBar {
    let bar = ProgressBar::new(1);
    bar.set_style(
        ProgressStyle::with_template(
            "{msg:>8} [{bar:40}] {percent:>3}% {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .expect("template")
        .progress_chars("=> "),
    );
    bar.set_message(what.to_string());
    bar
}
