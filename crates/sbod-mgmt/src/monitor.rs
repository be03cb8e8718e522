//! Alerts: state changes of arrays turned into events ([`diff`]) and delivered to a program
//! (as `mdadm --monitor --program`: event, array and member as arguments, the event's JSON
//! on stdin), to syslog (the journal reads it), and to a webhook (an HTTP POST of the JSON).
//! `sbod monitor` and `sbod web` both run a [`Monitor`].

use crate::manager::Manager;
use anyhow::{Context, Result};
use sbod_types::{
    ArrayState, Event, EventKind, HealthVerdict, MemberState, ProcessKind, ProcessStatus, Status,
};
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn event(kind: EventKind, s: &Status, member: Option<&str>, message: String) -> Event {
    Event {
        event: kind,
        array: s.name.clone(),
        member: member.map(str::to_string),
        message,
        time: now(),
        state: Some(s.state),
    }
}

fn member_name(m: &sbod_types::MemberStatus) -> String {
    m.path
        .clone()
        .or_else(|| m.uuid.clone())
        .unwrap_or_else(|| format!("slot {}", m.slot.unwrap_or(0)))
}

/// The same process run? (A finished process keeps its kind, size and duration.)
fn same_run(a: &Option<ProcessStatus>, b: &Option<ProcessStatus>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => {
            a.kind == b.kind && a.total == b.total && a.elapsed_secs == b.elapsed_secs
        }
        _ => false,
    }
}

/// What the array's state at first sight calls for (as mdadm reports a degraded array when
/// it starts monitoring).
pub fn initial(s: &Status) -> Vec<Event> {
    let mut out = initial_state(s);
    out.extend(initial_health(s));
    out
}

fn initial_state(s: &Status) -> Vec<Event> {
    match s.state {
        ArrayState::Degraded => vec![event(
            EventKind::ArrayDegraded,
            s,
            None,
            format!("{} is degraded", s.name),
        )],
        ArrayState::Failed => vec![event(
            EventKind::ArrayFailed,
            s,
            None,
            format!(
                "{} has failed: {}",
                s.name,
                s.failed_reason
                    .as_deref()
                    .unwrap_or("too many members lost")
            ),
        )],
        _ => Vec::new(),
    }
}

fn rank(v: Option<HealthVerdict>) -> u8 {
    match v {
        Some(HealthVerdict::Warn) => 1,
        Some(HealthVerdict::Failing) => 2,
        _ => 0,
    }
}

/// A member's disk health got worse (ok or unknown -> warn -> failing).
fn health_event(
    cur: &Status,
    m: &sbod_types::MemberStatus,
    prev: &sbod_types::MemberStatus,
    who: &str,
) -> Option<Event> {
    let now = m.health.as_ref()?;
    let before = prev.health.as_ref().map(|h| h.verdict);
    if rank(Some(now.verdict)) <= rank(before) || rank(Some(now.verdict)) == 0 {
        return None;
    }
    let has_spare = cur.members.iter().any(|x| x.state == MemberState::Spare);
    let what = match (now.verdict, has_spare) {
        (HealthVerdict::Failing, true) => {
            "predicted to fail; a hot spare is there to copy it onto (proactive replacement)"
        }
        (HealthVerdict::Failing, false) => {
            "predicted to fail; no hot spare: left in service, add a spare or replace it (sbod replace)"
        }
        _ => "health warning",
    };
    Some(event(
        EventKind::MemberHealth,
        cur,
        Some(who),
        format!("{}: {who}: {what}: {}", cur.name, now.summary()),
    ))
}

/// What first sight of an array's members' health calls for.
fn initial_health(s: &Status) -> Vec<Event> {
    s.members
        .iter()
        .filter_map(|m| {
            let mut none = m.clone();
            none.health = None;
            health_event(s, m, &none, &member_name(m))
        })
        .collect()
}

/// The events between two statuses of one array.
pub fn diff(prev: &Status, cur: &Status) -> Vec<Event> {
    let mut out = Vec::new();
    let key = |m: &sbod_types::MemberStatus| m.uuid.clone().or_else(|| m.path.clone());
    let before: HashMap<_, _> = prev.members.iter().map(|m| (key(m), m)).collect();
    for m in &cur.members {
        let who = member_name(m);
        // A spare or a new member rebuilt into a slot and made active (mdadm's SpareActive),
        // also when the whole rebuild fell between two looks.
        let was = before.get(&key(m)).map(|p| p.state);
        if m.state == MemberState::Active
            && m.slot.is_some()
            && was.is_none_or(|w| {
                matches!(
                    w,
                    MemberState::Spare | MemberState::Rebuilding | MemberState::Replacing
                )
            })
        {
            out.push(event(
                EventKind::SpareActivated,
                cur,
                Some(&who),
                format!(
                    "{}: {who} rebuilt and active in slot {}",
                    cur.name,
                    m.slot.unwrap_or(0)
                ),
            ));
        }
        let Some(p) = before.get(&key(m)) else {
            continue;
        };
        if m.state == MemberState::Replacing && p.state == MemberState::Spare {
            out.push(event(
                EventKind::ProactiveReplace,
                cur,
                Some(&who),
                format!(
                    "{}: hot spare {who} is copying the member of slot {} while it still serves",
                    cur.name,
                    m.slot.unwrap_or(0)
                ),
            ));
        }
        if let Some(e) = health_event(cur, m, p, &who) {
            out.push(e);
        }
        if m.state == MemberState::Failed && p.state != MemberState::Failed {
            out.push(event(
                EventKind::MemberFailed,
                cur,
                Some(&who),
                format!("{}: member {who} failed", cur.name),
            ));
        }
    }
    if cur.state != prev.state {
        let msg = |what: &str| format!("{} is {what} (was {})", cur.name, prev.state);
        match cur.state {
            ArrayState::Degraded if prev.state != ArrayState::Rebuilding => {
                out.push(event(EventKind::ArrayDegraded, cur, None, msg("degraded")))
            }
            ArrayState::Failed => out.push(event(
                EventKind::ArrayFailed,
                cur,
                None,
                format!(
                    "{} has failed: {}",
                    cur.name,
                    cur.failed_reason
                        .as_deref()
                        .unwrap_or("too many members lost")
                ),
            )),
            ArrayState::Optimal => {
                out.push(event(EventKind::ArrayOptimal, cur, None, msg("optimal")))
            }
            _ => {}
        }
    }
    let reshape_started = cur.process.as_ref().is_some_and(|c| {
        c.kind == ProcessKind::Reshape && prev.process.as_ref().is_none_or(|p| p.kind != c.kind)
    });
    if reshape_started {
        out.push(event(
            EventKind::ReshapeStarted,
            cur,
            None,
            format!("{}: reshape started", cur.name),
        ));
    }
    let started = cur.process.as_ref().filter(|c| {
        c.kind == ProcessKind::Rebuild && prev.process.as_ref().is_none_or(|p| p.kind != c.kind)
    });
    if started.is_some() {
        out.push(event(
            EventKind::RebuildStarted,
            cur,
            None,
            format!("{}: rebuild started", cur.name),
        ));
    }
    if !same_run(&prev.last_process, &cur.last_process) {
        if let Some(p) = &cur.last_process {
            let took = format!("{:.1}s", p.elapsed_secs);
            let seen_running = prev.process.as_ref().is_some_and(|r| r.kind == p.kind);
            if p.kind == ProcessKind::Rebuild && !seen_running && started.is_none() {
                // Started and finished between two looks.
                out.push(event(
                    EventKind::RebuildStarted,
                    cur,
                    None,
                    format!("{}: rebuild started", cur.name),
                ));
            }
            match p.kind {
                ProcessKind::Rebuild => out.push(event(
                    EventKind::RebuildFinished,
                    cur,
                    None,
                    match &p.error {
                        Some(e) => format!("{}: rebuild stopped after {took}: {e}", cur.name),
                        None => format!("{}: rebuild finished in {took}", cur.name),
                    },
                )),
                ProcessKind::Check | ProcessKind::Repair if p.mismatches > 0 => out.push(event(
                    EventKind::ScrubMismatches,
                    cur,
                    None,
                    format!(
                        "{}: {} found {} mismatched block(s){}",
                        cur.name,
                        p.kind,
                        p.mismatches,
                        if p.repaired > 0 {
                            format!(", {} repaired", p.repaired)
                        } else {
                            format!("; run `sbod scrub {} --repair`", cur.name)
                        }
                    ),
                )),
                ProcessKind::Check | ProcessKind::Repair => out.push(event(
                    EventKind::ScrubFinished,
                    cur,
                    None,
                    format!("{}: {} finished clean in {took}", cur.name, p.kind),
                )),
                ProcessKind::Reshape => out.push(event(
                    EventKind::ReshapeFinished,
                    cur,
                    None,
                    match &p.error {
                        Some(e) => format!("{}: reshape stopped after {took}: {e}", cur.name),
                        None if p.cancelled => {
                            format!(
                                "{}: reshape paused after {took}; it resumes at the next start",
                                cur.name
                            )
                        }
                        None => format!("{}: reshape finished in {took}", cur.name),
                    },
                )),
                ProcessKind::Resync => {}
            }
        }
    }
    out
}

/// Where events go.
#[derive(Clone, Debug, Default)]
pub struct Delivery {
    /// Run for each event: `PROGRAM EVENT ARRAY [MEMBER]`, the event's JSON on stdin.
    pub program: Option<PathBuf>,
    /// Log to syslog (facility daemon; journald collects it).
    pub syslog: bool,
    /// POST the event's JSON here.
    pub webhook: Option<String>,
}

impl Delivery {
    /// Deliver one event everywhere it should go; failures are logged, never fatal.
    pub async fn deliver(&self, e: &Event) {
        tracing::info!(event = %e.event, array = %e.array, "{}", e.message);
        if self.syslog {
            syslog(e);
        }
        if let Some(p) = &self.program {
            if let Err(err) = run_program(p, e).await {
                tracing::warn!("--program {}: {err:#}", p.display());
            }
        }
        if let Some(url) = &self.webhook {
            if let Err(err) = post(url, e).await {
                tracing::warn!("--webhook {url}: {err:#}");
            }
        }
    }
}

fn syslog(e: &Event) {
    use sbod_types::event::Severity;
    let prio = match e.event.severity() {
        Severity::Critical => libc::LOG_CRIT,
        Severity::Warning => libc::LOG_WARNING,
        Severity::Info => libc::LOG_INFO,
    };
    let msg = format!("{}: {}", e.event, e.message).replace('\0', " ");
    let c = std::ffi::CString::new(msg).expect("no NUL left");
    // SAFETY: openlog keeps the ident pointer: a static C string; syslog gets a format
    // string of its own and the message as its argument.
    unsafe {
        libc::openlog(c"sbod".as_ptr(), libc::LOG_PID, libc::LOG_DAEMON);
        libc::syslog(prio, c"%s".as_ptr(), c.as_ptr());
    }
}

async fn run_program(p: &PathBuf, e: &Event) -> Result<()> {
    use tokio::io::AsyncWriteExt;
    let mut cmd = tokio::process::Command::new(p);
    cmd.arg(e.event.as_str()).arg(&e.array);
    if let Some(m) = &e.member {
        cmd.arg(m);
    }
    let mut child = cmd
        .stdin(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("starting it")?;
    if let Some(mut stdin) = child.stdin.take() {
        let mut body = serde_json::to_vec(e)?;
        body.push(b'\n');
        // A program that does not read its stdin is fine.
        let _ = stdin.write_all(&body).await;
    }
    let st = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .context("still running after 30 s; killed")??;
    if !st.success() {
        anyhow::bail!("exited with {st}");
    }
    Ok(())
}

async fn post(url: &str, e: &Event) -> Result<()> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()?;
    let r = client.post(url).json(e).send().await?;
    if !r.status().is_success() {
        anyhow::bail!("answered {}", r.status());
    }
    Ok(())
}

/// Watches arrays and delivers their events.
pub struct Monitor {
    pub delivery: Delivery,
    last: HashMap<String, Status>,
}

impl Monitor {
    pub fn new(delivery: Delivery) -> Monitor {
        Monitor {
            delivery,
            last: HashMap::new(),
        }
    }

    /// Look at each array once (all registered ones if `names` is empty); deliver what
    /// changed since the last look, and return it.
    pub async fn poll(&mut self, mgr: &Manager, names: &[String]) -> Vec<Event> {
        let names = if names.is_empty() {
            mgr.list().unwrap_or_default()
        } else {
            names.to_vec()
        };
        let mut events = Vec::new();
        for n in &names {
            let cur = match mgr.status(n).await {
                Ok(s) => s.status,
                Err(e) => {
                    tracing::debug!("{n}: {e:#}");
                    continue;
                }
            };
            let mut evs = match self.last.get(n) {
                Some(prev) => diff(prev, &cur),
                None => initial(&cur),
            };
            // Report under the registered name.
            for e in evs.iter_mut() {
                e.array = n.clone();
            }
            events.extend(evs);
            self.last.insert(n.clone(), cur);
        }
        self.last.retain(|k, _| names.contains(k));
        for e in &events {
            self.delivery.deliver(e).await;
        }
        events
    }
}
