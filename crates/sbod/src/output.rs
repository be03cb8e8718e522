//! Human output: tables, sizes, progress bars.

use indicatif::{ProgressBar, ProgressStyle};
use sbod_core::array::{RecoveryStatus, Status};
use sbod_core::layout::{human, Level};
use sbod_core::process::ProcessStatus;
use sbod_core::superblock::Superblock;
use sbod_types::{HealthPolicy, HealthVerdict, LogStatus, MemberStatus, SyncStatus};

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
        _ if s.declustered.is_some() => format!(
            "{} declustered: {} group{} of {} and {} member{}' worth of spare space over all {} members, chunk {chunk}",
            s.level,
            s.groups,
            if s.groups == 1 { "" } else { "s" },
            s.width,
            s.declustered.unwrap_or(0),
            if s.declustered == Some(1) { "" } else { "s" },
            s.members.len()
        ),
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

/// The status table's health column: ok, warn, failing, n/a (not available), `-` (not
/// looked at).
fn health_word(m: &MemberStatus) -> &'static str {
    match m.health.as_ref().map(|h| h.verdict) {
        Some(HealthVerdict::Ok) => "ok",
        Some(HealthVerdict::Warn) => "warn",
        Some(HealthVerdict::Failing) => "FAILING",
        Some(HealthVerdict::Unavailable) => "n/a",
        None => "-",
    }
}

/// Where a member's disk sits and its stable name, beside its /dev name: "enclosure
/// 0:0:12:0 slot 3, sdc, wwn naa.5000c500a1b2c3d4, serial ZL2C0001, dual actuator".
fn disk_line(m: &MemberStatus) -> Option<String> {
    let mut parts = Vec::new();
    if let Some(l) = &m.location {
        parts.push(if l.enclosure == "pci" {
            format!("PCIe slot {}", l.slot)
        } else {
            format!("enclosure {} slot {}", l.enclosure, l.slot)
        });
    }
    if let Some(id) = &m.identity {
        if let Some(k) = &id.kernel_name {
            parts.push(k.clone());
        }
        if let Some(w) = &id.wwn {
            parts.push(format!("wwn {w}"));
        }
        if let Some(sn) = &id.serial {
            parts.push(format!("serial {sn}"));
        }
        if let Some(b) = &id.by_id {
            parts.push(b.clone());
        }
        if let Some(n) = id.actuators {
            parts.push(format!("{n} actuators"));
        }
        if id.shared_drive.is_some() {
            parts.push("one LUN of a drive shared with another member (dual actuator)".into());
        }
    }
    (!parts.is_empty()).then(|| parts.join(", "))
}

/// `sbod health`: each member's disk health in full, and the policy judging it.
pub fn print_health(s: &Status, p: &HealthPolicy) {
    println!("{}: health policy {}", s.name, p.describe());
    for m in &s.members {
        let who = m
            .path
            .as_deref()
            .map(short)
            .unwrap_or_else(|| format!("({})", m.uuid.as_deref().unwrap_or("?")));
        let Some(h) = &m.health else {
            println!("  {who}: not looked at");
            continue;
        };
        println!("  {who} ({}): {}", m.state, h.summary());
        if let Some(line) = disk_line(m) {
            println!("    {line}");
        }
        let mut f = Vec::new();
        if let Some(x) = h.protocol {
            f.push(x.to_string());
        }
        if let Some(x) = &h.model {
            f.push(x.clone());
        }
        if let Some(x) = h.passed {
            f.push(format!("SMART {}", if x { "PASSED" } else { "FAILED" }));
        }
        for (k, v) in [
            ("reallocated", h.reallocated_sectors),
            ("pending", h.pending_sectors),
            ("uncorrectable", h.uncorrectable_sectors),
            ("media errors", h.media_errors),
            ("CRC errors", h.crc_errors),
            ("power-on hours", h.power_on_hours),
        ] {
            if let Some(v) = v {
                f.push(format!("{k} {v}"));
            }
        }
        if let Some(v) = h.critical_warning {
            f.push(format!("critical warning 0x{v:02x}"));
        }
        if let Some(v) = h.percentage_used {
            f.push(format!("{v}% used"));
        }
        if let Some(v) = h.temperature_celsius {
            f.push(format!("{v} °C"));
        }
        if !f.is_empty() {
            println!("    {}", f.join(", "));
        }
    }
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
        "  {:<5} {:<5} {:<width$} {:<11} {:<8} {:>9} {:>6} {:>6} {:>6} {:>6}  health",
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
            "  {:<5} {:<5} {:<width$} {:<11} {:<8} {:>9} {:>6} {:>6} {:>6} {:>6}  {}",
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
            m.tag_errors,
            health_word(m)
        );
    }
    for m in &s.members {
        let who = m.path.as_deref().map(short).unwrap_or_default();
        if let Some(line) = disk_line(m) {
            println!("  {who}: {line}");
        }
        if let Some(h) = m
            .health
            .as_ref()
            .filter(|h| matches!(h.verdict, HealthVerdict::Warn | HealthVerdict::Failing))
        {
            println!("  {who}: health {}", h.summary());
        }
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
