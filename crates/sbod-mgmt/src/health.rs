//! Members' disks in the management layer (issue 28): every status shows each member's
//! health, slot and stable identity ([`decorate`]); each array has a predictive failure
//! policy (thresholds, proactive replacement, autoreplace), kept in the state directory
//! (`health/NAME.json`, `sbod set NAME --health-policy`); and the serving process
//! ([`watch`]) reads health on the policy's schedule, lights the fault LED of a failed
//! member's slot (and puts it out when the slot is whole again), copies a failing member
//! onto a hot spare while it still serves, and acts on disks plugged in (a former member
//! is given back; a blank disk in a failed member's slot replaces it with autoreplace on).
//!
//! A bad health verdict never fails a member: with no spare left it is an event only
//! (`sbod monitor`'s `member_health`), as OpenZFS learned (issue 14666): a failing disk
//! that still serves is better than a hole.

use crate::local::Local;
use crate::registry;
use anyhow::{Context, Result};
use sbod_health::hotplug::{self, Decision, EventSource, OutMember};
use sbod_health::led::{self, Led};
use sbod_health::{Cache, Reader};
use sbod_types::control::Request;
use sbod_types::{
    ArrayState, HealthPolicy, HealthVerdict, Identity, Location, MemberState, Status,
};
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// The host's disks (`SBOD_SYSFS_ROOT`, `SBOD_SMARTCTL` for tests).
pub fn reader() -> &'static Reader {
    static R: OnceLock<Reader> = OnceLock::new();
    R.get_or_init(Reader::from_env)
}

fn cache() -> &'static Cache {
    static C: OnceLock<Cache> = OnceLock::new();
    C.get_or_init(Cache::default)
}

/// Where an array's health policy is kept.
pub fn policy_path(name: &str) -> PathBuf {
    registry::state_dir()
        .join("health")
        .join(format!("{name}.json"))
}

/// The array's health policy (the defaults where none was set).
pub fn load_policy(name: &str) -> HealthPolicy {
    match std::fs::read(policy_path(name)) {
        Ok(b) => serde_json::from_slice(&b).unwrap_or_else(|e| {
            tracing::warn!(
                "{}: unreadable ({e}); the default health policy applies",
                policy_path(name).display()
            );
            HealthPolicy::default()
        }),
        Err(_) => HealthPolicy::default(),
    }
}

/// Keep an array's health policy (written whole, then renamed into place).
pub fn save_policy(name: &str, p: &HealthPolicy) -> Result<()> {
    registry::check_name(name)?;
    let path = policy_path(name);
    let dir = path.parent().expect("a directory");
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let tmp = dir.join(format!(".{name}.json.{}", std::process::id()));
    std::fs::write(&tmp, serde_json::to_vec_pretty(p)?)
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, &path).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// Forget an array's policy (`sbod forget`).
pub fn forget_policy(name: &str) {
    let _ = std::fs::remove_file(policy_path(name));
}

/// Show each member's disk in the status: its health (read at most `max_age` ago), its
/// enclosure slot and its stable identity, and which members share one physical drive.
pub fn decorate_blocking(status: &mut Status, policy: &HealthPolicy, max_age: Duration) {
    let r = reader();
    let members: Vec<(usize, String)> = status
        .members
        .iter()
        .enumerate()
        .filter(|(_, m)| !matches!(m.state, MemberState::Empty))
        .filter_map(|(i, m)| m.path.clone().map(|p| (i, p)))
        .collect();
    // One thread per disk: smartctl on sixty disks one after the other is a minute.
    let read: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> = members
            .iter()
            .map(|(i, p)| {
                s.spawn(move || {
                    let (id, loc) = r.place(p);
                    let h = cache().get(r, p, policy, max_age);
                    (*i, id, loc, h)
                })
            })
            .collect();
        hs.into_iter().filter_map(|h| h.join().ok()).collect()
    });
    let disks: Vec<String> = read
        .iter()
        .filter_map(|(_, id, _, _)| id.as_ref().and_then(|i| i.kernel_name.clone()))
        .collect();
    let shared = r.sysfs.shared_drives(&disks);
    for (i, mut id, loc, h) in read {
        if let Some(id) = id.as_mut() {
            id.shared_drive = id.kernel_name.as_ref().and_then(|k| shared.get(k).cloned());
        }
        let m = &mut status.members[i];
        m.identity = id;
        m.location = loc;
        m.health = Some(h);
    }
}

/// [`decorate_blocking`] with the array's policy, off the async threads. `fresh`: read
/// health now (`sbod health`), else within the policy's interval.
pub async fn decorate(mut status: Status, fresh: bool) -> Status {
    let policy = load_policy(&status.name);
    let age = if fresh {
        Duration::ZERO
    } else {
        Duration::from_secs(policy.interval_secs)
    };
    let name = status.name.clone();
    let backup = status.clone();
    match tokio::task::spawn_blocking(move || {
        decorate_blocking(&mut status, &policy, age);
        status
    })
    .await
    {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!("{name}: reading the members' health: {e}");
            backup
        }
    }
}

/// How often the serving process looks (fault LEDs, hot-plug, the policy's schedule).
fn tick() -> Duration {
    Duration::from_millis(
        std::env::var("SBOD_HEALTH_TICK_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(10_000),
    )
}

/// What the serving process remembers of a member's disk while it is there, to find its
/// slot when it is gone, and to know it when it comes back.
#[derive(Default)]
struct Seen {
    by_member: HashMap<String, (Option<Identity>, Option<Location>, String)>,
}

fn member_key(m: &sbod_types::MemberStatus) -> Option<String> {
    m.uuid.clone().or_else(|| m.path.clone())
}

/// The serving process's health duty, until `stop` (see the module's words).
pub async fn watch(local: Arc<Local>, mut stop: tokio::sync::watch::Receiver<bool>) {
    let name = local.name.clone();
    let (ev_tx, mut ev_rx) = tokio::sync::mpsc::unbounded_channel();
    // Hot-plug: the kernel's uevents on a thread of their own (a blocking socket), or
    // the lines of the file SBOD_HOTPLUG_EVENTS names (tests drive this duty with it).
    if std::env::var_os("SBOD_HOTPLUG").is_none_or(|v| v != "0") {
        let stop_flag = stop.clone();
        let source: std::io::Result<Box<dyn EventSource>> =
            match std::env::var_os("SBOD_HOTPLUG_EVENTS") {
                Some(p) => Ok(Box::new(hotplug::FileSource::new(p))),
                None => hotplug::Uevents::open().map(|u| Box::new(u) as Box<dyn EventSource>),
            };
        match source {
            Ok(mut src) => {
                std::thread::spawn(move || {
                    while !*stop_flag.borrow() {
                        match src.next(Duration::from_millis(500)) {
                            Ok(Some(ev)) => {
                                if ev_tx.send(ev).is_err() {
                                    return;
                                }
                            }
                            Ok(None) => {}
                            Err(e) => {
                                tracing::warn!("hot-plug events: {e}; no longer watched");
                                return;
                            }
                        }
                    }
                });
            }
            Err(e) => tracing::warn!("{name}: hot-plug events cannot be watched: {e}"),
        }
    }
    let mut seen = Seen::default();
    let mut lit: HashSet<String> = HashSet::new();
    let mut tried: HashMap<String, Instant> = HashMap::new();
    let mut warned: HashSet<String> = HashSet::new();
    let mut rejoins = Rejoins::default();
    loop {
        let ev = tokio::select! {
            _ = stop.changed() => break,
            _ = tokio::time::sleep(tick()) => None,
            ev = ev_rx.recv() => ev,
        };
        if *stop.borrow() {
            break;
        }
        let policy = load_policy(&name);
        let st = decorate(local.array.status(), false).await;
        for m in &st.members {
            if let (Some(k), Some(p)) = (member_key(m), m.path.clone()) {
                if m.identity.is_some() || m.location.is_some() {
                    seen.by_member
                        .insert(k, (m.identity.clone(), m.location.clone(), p));
                }
            }
        }
        fault_leds(&reader().sysfs, &st, &seen, &mut lit);
        if let Some(ev) = ev {
            on_disk_event(&local, &st, &seen, &policy, &ev).await;
            continue;
        }
        rejoins.tick(&local, &policy).await;
        proactive(&local, &st, &policy, &mut tried, &mut warned).await;
    }
    // Lights this process lit are put out: the next one lights them again.
    for key in lit {
        if let Some((_, Some(loc), _)) = seen.by_member.get(&key) {
            let _ = led::set_location(&reader().sysfs, loc, Led::Fault, false);
        }
    }
}

/// Fault LEDs follow the members: on for a failed or missing member's slot (as last
/// seen), off when that member is back or its slot is someone else's in service.
fn fault_leds(
    sysfs: &sbod_health::sysfs::Sysfs,
    st: &Status,
    seen: &Seen,
    lit: &mut HashSet<String>,
) {
    let want: HashSet<String> = st
        .members
        .iter()
        .filter(|m| matches!(m.state, MemberState::Failed | MemberState::Missing))
        .filter_map(member_key)
        .filter(|k| seen.by_member.get(k).is_some_and(|s| s.1.is_some()))
        .collect();
    // A slot now held by a member in service is not lit for its former tenant.
    let serving: HashSet<&Location> = st
        .members
        .iter()
        .filter(|m| !matches!(m.state, MemberState::Failed | MemberState::Missing))
        .filter_map(|m| m.location.as_ref())
        .collect();
    for k in want.difference(lit).cloned().collect::<Vec<_>>() {
        let Some((_, Some(loc), path)) = seen.by_member.get(&k) else {
            continue;
        };
        if serving.contains(loc) {
            continue;
        }
        match led::set_location(sysfs, loc, Led::Fault, true) {
            Ok(how) => {
                tracing::warn!(array = %st.name, member = %path, "fault LED on at {loc} ({how})");
                lit.insert(k);
            }
            Err(e) => tracing::debug!("fault LED of {path}: {e}"),
        }
    }
    for k in lit.clone() {
        let Some((_, Some(loc), path)) = seen.by_member.get(&k) else {
            continue;
        };
        if !want.contains(&k) || serving.contains(loc) {
            if led::set_location(sysfs, loc, Led::Fault, false).is_ok() {
                tracing::info!(array = %st.name, member = %path, "fault LED off at {loc}");
            }
            lit.remove(&k);
        }
    }
}

/// Members failed by I/O errors, tried again after the policy's `rejoin_after` (Ceph's
/// down-out interval): one that answers is taken back, resynced from the write-intent
/// bitmap (`sbod add` of a held member). Each try of a member, taken back or not, doubles
/// the wait before its next (at most 64 times the grace): a member that does not answer is
/// not asked every tick, and one that keeps failing again is not taken back every grace.
/// Members failed by the administrator, for wrong data or a changed size, stale or missing
/// ones are never taken back by this; remote members whose host went away come back by
/// themselves (crate::rejoin).
#[derive(Default)]
struct Rejoins {
    /// Per member uuid: since when it is out this time (None: in service), tries so far,
    /// and the last.
    seen: HashMap<uuid::Uuid, (Option<Instant>, u32, Option<Instant>)>,
}

/// Whether a member out for `reason` may be tried again: I/O errors only.
fn rejoinable(reason: sbod_core::superblock::OutReason) -> bool {
    use sbod_core::superblock::OutReason::*;
    matches!(
        reason,
        WriteError | ReadErrors | FlushError | MetadataWrite | RepairWrite
    )
}

impl Rejoins {
    async fn tick(&mut self, local: &Local, policy: &HealthPolicy) {
        let state = local.array.state();
        let out: Vec<(uuid::Uuid, String, sbod_core::superblock::OutReason)> = state
            .slots
            .iter()
            .filter(|s| s.state == sbod_core::superblock::SlotState::Failed)
            .filter_map(|s| {
                let r = s.out?.reason;
                let m = s.member.as_ref()?;
                rejoinable(r).then(|| (m.uuid, m.path.clone(), r))
            })
            .collect();
        for (u, e) in self.seen.iter_mut() {
            if !out.iter().any(|(o, _, _)| o == u) {
                e.0 = None;
            }
        }
        for (u, _, _) in &out {
            let e = self.seen.entry(*u).or_insert((None, 0, None));
            e.0.get_or_insert_with(Instant::now);
        }
        let Some(grace) = policy.rejoin_after_secs.map(Duration::from_secs) else {
            return;
        };
        let wait = |tries: u32| grace * 2u32.pow(tries.min(6));
        for (uuid, path, reason) in out {
            let (since, tries, last) = self.seen[&uuid];
            let since = since.unwrap_or_else(Instant::now);
            let w = wait(tries);
            if since.elapsed() < w || last.is_some_and(|t| t.elapsed() < w) {
                continue;
            }
            self.seen
                .insert(uuid, (Some(since), tries + 1, Some(Instant::now())));
            let name = &local.name;
            match local
                .call(Request::Add {
                    member: path.clone(),
                    domain: String::new(),
                    force: false,
                })
                .await
            {
                Ok(_) => tracing::warn!(
                    array = %name, member = %path,
                    "{reason} {} s ago; it answers again: taken back from the write-intent bitmap (rejoin_after={}; if it fails again, tried after {} s)",
                    since.elapsed().as_secs(), grace.as_secs(), wait(tries + 1).as_secs()
                ),
                Err(e) => tracing::warn!(
                    array = %name, member = %path,
                    "{reason}; tried again after {} s and still not taken back: {e:#}; next try in {} s",
                    since.elapsed().as_secs(),
                    wait(tries + 1).as_secs()
                ),
            }
        }
    }
}

/// Where a failing member still serves and a spare waits: copy it onto the spare (the
/// spare is taken out of the spares and rebuilt as the member's replacement, md's
/// want_replacement: the member serves until the copy is whole). Without a spare: said
/// once in the log (the monitor's event tells people), the member left in service.
async fn proactive(
    local: &Local,
    st: &Status,
    policy: &HealthPolicy,
    tried: &mut HashMap<String, Instant>,
    warned: &mut HashSet<String>,
) {
    let failing: Vec<&sbod_types::MemberStatus> = st
        .members
        .iter()
        .filter(|m| m.state == MemberState::Active)
        .filter(|m| {
            m.health
                .as_ref()
                .is_some_and(|h| h.verdict == HealthVerdict::Failing)
        })
        .collect();
    if failing.is_empty() {
        return;
    }
    let busy = st
        .members
        .iter()
        .any(|m| matches!(m.state, MemberState::Replacing | MemberState::Rebuilding));
    let spare = st
        .members
        .iter()
        .find(|m| m.state == MemberState::Spare)
        .and_then(|m| m.path.clone());
    for m in failing {
        let Some(path) = m.path.clone() else { continue };
        let why = m.health.as_ref().map(|h| h.summary()).unwrap_or_default();
        let Some(spare) = spare.clone().filter(|_| policy.replace) else {
            if warned.insert(path.clone()) {
                tracing::warn!(
                    array = %st.name, member = %path,
                    "predicted to fail ({why}); {} — left in service",
                    if policy.replace { "no hot spare to copy it onto: add one (sbod add)" } else { "proactive replacement is off" }
                );
            }
            continue;
        };
        if busy || st.state != ArrayState::Optimal {
            return;
        }
        let again = Duration::from_secs(policy.interval_secs);
        if tried.get(&path).is_some_and(|t| t.elapsed() < again) {
            continue;
        }
        tried.insert(path.clone(), Instant::now());
        tracing::warn!(
            array = %st.name, member = %path,
            "predicted to fail ({why}): copying it onto the hot spare {spare} while it serves"
        );
        if let Err(e) = replace_with_spare(local, &path, &spare).await {
            tracing::warn!(array = %st.name, member = %path, "proactive replacement: {e:#}");
        }
        return; // one at a time
    }
}

/// Replace `old` by the spare `spare`: out of the spares (its claim wiped), then rebuilt as
/// `old`'s replacement; if the replacement is refused, the spare is given back.
pub async fn replace_with_spare(local: &Local, old: &str, spare: &str) -> Result<()> {
    local
        .call(Request::Remove {
            member: spare.to_string(),
        })
        .await
        .context("taking the spare out of the spares")?;
    let r = local
        .call(Request::Replace {
            old: old.to_string(),
            new: spare.to_string(),
            force: false,
        })
        .await;
    if let Err(e) = r {
        let back = local
            .call(Request::Add {
                member: spare.to_string(),
                domain: String::new(),
                force: false,
            })
            .await;
        return Err(match back {
            Ok(_) => e.context("refused; the spare is a spare again"),
            Err(b) => e.context(format!(
                "refused, and the spare could not be added back: {b:#}"
            )),
        });
    }
    Ok(())
}

/// The failure domain of each device joining `status`'s array (add, replace, grow --add)
/// with the domain `asked` (empty: none given), and why where it was chosen for it: a
/// device that is the other LUN of a dual-actuator drive a member is on joins that
/// member's recorded failure domain (the array's domain rules then apply to it as to
/// any), as `create` puts two such LUNs in one. Where that member has no domain recorded,
/// an array that survives only one failure refuses it unless `force` (nothing would keep
/// one drive from taking two members); one that survives more takes it with a warning,
/// as does a mirror grown by copies (`grow`: each copy added is one more it survives).
/// `leaving`: the member a replacement takes the place of (not a partner).
pub fn joining_domains(
    status: &Status,
    joining: &[String],
    asked: &str,
    leaving: Option<&str>,
    grow: bool,
    force: bool,
) -> Result<Vec<(String, Option<String>)>> {
    if !asked.is_empty() {
        return Ok(joining.iter().map(|_| (asked.to_string(), None)).collect());
    }
    let members: Vec<(String, String)> = status
        .members
        .iter()
        .filter(|m| !matches!(m.state, MemberState::Empty))
        .filter(|m| {
            leaving.is_none_or(|l| {
                m.uuid.as_deref() != Some(l)
                    && m.path
                        .as_deref()
                        .is_none_or(|p| p != l && Some(l) != crate::members::local_path(p))
            })
        })
        .filter_map(|m| Some((m.path.clone()?, m.domain.clone())))
        .collect();
    let mut out = Vec::new();
    for j in sbod_health::joining_domains(reader(), &members, joining) {
        match j {
            sbod_health::Joining::Alone => out.push((String::new(), None)),
            sbod_health::Joining::Domain { domain, why } => {
                tracing::info!(array = %status.name, "{why}");
                out.push((domain, Some(why)));
            }
            sbod_health::Joining::Undomained { why, .. } => {
                let more_copies = grow && status.level == sbod_types::Level::Raid1;
                if status.redundancy == 1 && !more_copies && !force {
                    return Err(crate::error::err_advised(
                        crate::error::ErrorKind::Refused,
                        format!("{why}; '{}' survives only one failure", status.name),
                        vec![
                            sbod_types::Step::say("use a disk on another drive"),
                            sbod_types::Step::force("use it all the same"),
                        ],
                    ));
                }
                tracing::warn!(array = %status.name, "{why}");
                out.push((String::new(), None));
            }
        }
    }
    Ok(out)
}

/// A disk plugged in: a former member is given back; a disk in a failed member's slot
/// replaces it where autoreplace is on.
async fn on_disk_event(
    local: &Local,
    st: &Status,
    seen: &Seen,
    policy: &HealthPolicy,
    ev: &hotplug::DiskEvent,
) {
    let out: Vec<OutMember> = st
        .members
        .iter()
        .filter(|m| matches!(m.state, MemberState::Failed | MemberState::Missing))
        .filter_map(|m| {
            let k = member_key(m)?;
            let (identity, location, path) = seen.by_member.get(&k).cloned()?;
            Some(OutMember {
                member: m.path.clone().unwrap_or(path),
                identity,
                location,
            })
        })
        .collect();
    if out.is_empty() {
        return;
    }
    let sysfs = reader().sysfs.clone();
    let ev2 = ev.clone();
    let autoreplace = policy.autoreplace;
    let decision = tokio::task::spawn_blocking(move || {
        // udev makes the device node and its by-id links after the kernel's event.
        let node = sysfs.path(format!("/dev/{}", ev2.name));
        let until = Instant::now() + Duration::from_secs(10);
        while !node.exists() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(100));
        }
        hotplug::on_event(&sysfs, &ev2, &out, autoreplace)
    })
    .await
    .ok()
    .flatten();
    let name = &st.name;
    match decision {
        None => {}
        Some(Decision::Leave(why)) => tracing::info!(array = %name, "hot-plug: {why}"),
        Some(Decision::Withheld { old, why, .. }) => {
            tracing::warn!(array = %name, member = %old, "hot-plug: {why}")
        }
        Some(Decision::ReAdd { member, device }) => {
            // Its registered name when that leads to it again, else the new node.
            let path = if std::path::Path::new(&member).exists() {
                member.clone()
            } else {
                device.clone()
            };
            match local
                .call(Request::Add {
                    member: path.clone(),
                    domain: String::new(),
                    force: false,
                })
                .await
            {
                Ok(_) => {
                    tracing::warn!(array = %name, member = %member, "hot-plug: {device} is a former member: given back ({path})")
                }
                Err(e) => {
                    tracing::warn!(array = %name, member = %member, "hot-plug: {device} is back but was not re-added: {e:#}")
                }
            }
        }
        Some(Decision::Replace { old, new }) => {
            match local
                .call(Request::Replace {
                    old: old.clone(),
                    new: new.clone(),
                    force: false,
                })
                .await
            {
                Ok(_) => {
                    tracing::warn!(array = %name, member = %old, "hot-plug: {new} in its slot replaces it (autoreplace)")
                }
                Err(e) => {
                    tracing::warn!(array = %name, member = %old, "hot-plug: {new} in its slot was not taken: {e:#}")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(members: serde_json::Value) -> Status {
        serde_json::from_value(serde_json::json!({
            "name": "v", "uuid": "x", "level": "raid1", "state": "degraded", "failed_reason": null,
            "size": 1, "chunk": 65536, "groups": 1, "width": 2, "redundancy": 1, "event": 1,
            "members": members, "process": null, "last_process": null, "bitmap_region": null,
            "dirty_regions": 0, "resync_offset": null, "assembly": {"unclean": false,
            "resynced_bytes": 0, "resynced_regions": 0, "rebuilding": [], "ignored": [],
            "missing": []}
        }))
        .unwrap()
    }

    fn member(path: &str, uuid: &str, state: &str, slot: Option<&str>) -> serde_json::Value {
        let mut m = serde_json::json!({"slot": 0, "group": 0, "path": path, "uuid": uuid,
            "state": state, "domain": "", "size": 1, "read_errors": 0, "write_errors": 0,
            "checksum_errors": 0, "repaired": 0, "reads": 0, "writes": 0, "recovered": null});
        if let Some(s) = slot {
            m["location"] = serde_json::json!({"enclosure": "0:0:12:0", "slot": s, "led": true});
        }
        m
    }

    /// A failed member's slot lights its fault LED (where it was last seen, its disk gone),
    /// and the LED goes out when a member in service holds the slot again.
    #[test]
    fn fault_leds_follow_failed_members() {
        let dir = tempfile::tempdir().unwrap();
        let slot = dir.path().join("sys/class/enclosure/0:0:12:0/Slot 03");
        std::fs::create_dir_all(&slot).unwrap();
        std::fs::write(slot.join("slot"), "3\n").unwrap();
        std::fs::write(slot.join("fault"), "0\n").unwrap();
        std::fs::write(slot.join("locate"), "0\n").unwrap();
        let sysfs = sbod_health::sysfs::Sysfs::new(dir.path());
        let fault = || std::fs::read_to_string(slot.join("fault")).unwrap();
        let mut seen = Seen::default();
        let mut lit = HashSet::new();
        // In service in slot 3: seen there, nothing lit.
        let ok = status(serde_json::json!([member(
            "/dev/sdc",
            "a",
            "active",
            Some("3")
        )]));
        seen.by_member.insert(
            "a".into(),
            (None, ok.members[0].location.clone(), "/dev/sdc".into()),
        );
        fault_leds(&sysfs, &ok, &seen, &mut lit);
        assert_eq!(fault(), "0\n");
        // Failed and pulled (no location now): lit by what was seen.
        let failed = status(serde_json::json!([member("/dev/sdc", "a", "failed", None)]));
        fault_leds(&sysfs, &failed, &seen, &mut lit);
        assert_eq!(fault(), "1");
        assert!(lit.contains("a"));
        fault_leds(&sysfs, &failed, &seen, &mut lit);
        assert_eq!(fault(), "1", "stays lit");
        // A replacement in service in slot 3: out.
        let replaced = status(serde_json::json!([
            member("/dev/sdc", "a", "failed", None),
            member("/dev/sdg", "b", "active", Some("3"))
        ]));
        fault_leds(&sysfs, &replaced, &seen, &mut lit);
        assert_eq!(fault(), "0");
        assert!(lit.is_empty());
    }
}
