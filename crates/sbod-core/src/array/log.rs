//! The log of an array: log devices added, mirrored and removed, found and replayed at
//! assembly, recorded on the members, and shown in status (the part of the log that
//! knows the array; `log::slot` is what the sync state keeps). The write path's hook is
//! described in docs/RELIABILITY.md ("Sync modes and the log").

use super::{check_blank, Array, AssembleOptions, MemberSpec, State};
use crate::buf::AlignedBuf;
use crate::dev::{self, BoxFut, IoClass};
use crate::error::{Error, Msg, Result, Step};
use crate::log::slot::JOURNALING;
use crate::log::{format, read_super, scan, Log, LogDevice, LogError, LogHost, Record};
use crate::superblock::{LogDevEntry, OutReason, OutRecord, Superblock};
use sbod_types::{LogDevState, LogDevStatus, LogReplayIssue, LogState, LogStatus, MemberRange};
use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use uuid::Uuid;

/// The log's view of the array: flushing the pool for a checkpoint, and recording a log
/// device that failed.
struct Host(std::sync::Weak<Array>);

impl LogHost for Host {
    fn flush_pool(&self) -> BoxFut<io::Result<()>> {
        let a = self.0.upgrade();
        Box::pin(async move {
            match a {
                Some(a) => a
                    .dp()
                    .flush()
                    .await
                    .map_err(|e| io::Error::other(e.to_string())),
                None => Err(io::Error::other("the array is gone")),
            }
        })
    }

    fn device_failed(&self, uuid: Uuid, error: String) -> BoxFut<()> {
        let a = self.0.upgrade();
        Box::pin(async move {
            if let Some(a) = a {
                tracing::error!(array = %a.dp().name, log = %uuid, "log device failed: {error}");
                a.record_log_out(&[uuid], OutReason::WriteError).await;
            }
        })
    }
}

fn log_err(e: LogError) -> Error {
    match e {
        LogError::Io(m) => Error::Io {
            context: "log".into(),
            source: io::Error::other(m),
        },
        e => Error::Invalid(e.to_string().into()),
    }
}

impl Array {
    fn log_host(self: &Arc<Self>) -> Arc<dyn LogHost> {
        Arc::new(Host(Arc::downgrade(self)))
    }

    /// Record the log's state on the members (with the current state). Call with the
    /// slot's `change` lock held.
    async fn persist_log(&self) {
        let _g = self.mgmt.lock().await;
        let st = self.dp().state.load_full();
        let lost = self.commit((*st).clone()).await;
        drop(_g);
        for m in lost {
            self.fail_member(&m, OutReason::MetadataWrite).await;
        }
    }

    /// Mark log devices out (failed or missing) and record it on the members.
    pub(crate) async fn record_log_out(&self, uuids: &[Uuid], reason: OutReason) {
        self.mark_log_out(uuids, reason);
        self.persist_log().await;
    }

    /// At assembly, after the members are sorted: find the recorded log devices among
    /// those given, replay the log into the members (`st`: the slots as assembled), flush
    /// them, and start a new log session. Returns whether the replay leaves every stripe
    /// the crashed session wrote consistent (the log journaled every write and was read):
    /// then a degraded start needs no `--force` for the write hole.
    pub(crate) async fn attach_logs(
        self: &Arc<Self>,
        sb: &Superblock,
        st: &State,
        opts: &AssembleOptions,
    ) -> Result<bool> {
        let cfg = sb.log.clone();
        let found = self.sync.log.found.lock().clone();
        for d in &found {
            if !cfg.devices.iter().any(|e| e.uuid == d.uuid) {
                self.report.lock().ignored.push((
                    d.path.clone(),
                    "a log device this array does not record (a removed or foreign log): not used"
                        .into(),
                ));
            }
        }
        let active: Vec<LogDevEntry> = cfg.devices.iter().filter(|e| e.active).copied().collect();
        if active.is_empty() {
            // No log, or it failed: everything it acknowledged was made durable in the
            // pool before that was recorded.
            return Ok(false);
        }
        let trusted: Vec<LogDevice> = active
            .iter()
            .filter_map(|e| found.iter().find(|d| d.uuid == e.uuid).cloned())
            .collect();
        let missing: Vec<Uuid> = active
            .iter()
            .filter(|e| !trusted.iter().any(|d| d.uuid == e.uuid))
            .map(|e| e.uuid)
            .collect();
        let scanned = if trusted.is_empty() {
            Err("no log device was given".to_string())
        } else {
            scan(&trusted, self.uuid).await
        };
        let scan = match scanned {
            Ok(s) => s,
            Err(why) => {
                if !sb.clean && cfg.journal && !opts.force {
                    return Err(Error::Refused(
                        Msg::new(format!(
                            "'{}' was not shut down cleanly and its log cannot be read ({why}): the log may hold acknowledged writes the members do not have",
                            self.dp().name
                        ))
                        .or(Step::say("give its log device(s) to assemble"))
                        .or(Step::force("start without them and lose those writes")),
                    ));
                }
                let all: Vec<Uuid> = active.iter().map(|e| e.uuid).collect();
                self.mark_log_out(&all, OutReason::Missing);
                return Ok(false);
            }
        };
        // Devices of the log that could not be read (or are missing) are out from now on.
        let mut out: Vec<Uuid> = missing;
        for (d, r) in trusted.iter().zip(&scan.per_device) {
            if let Err(e) = r {
                tracing::warn!(array = %self.dp().name, log = %d.path, "log device unusable: {e}");
                out.push(d.uuid);
            }
        }
        // Damaged records whose writes the pool holds (read before anything is replayed).
        let mut in_pool = std::collections::HashSet::new();
        for d in &scan.damaged {
            if let Some(h) = &d.header {
                if self.pool_holds(h, st).await {
                    in_pool.insert(d.seq);
                }
            }
        }
        let plan = scan.plan(&in_pool);
        let issues = self.replay_issues(&plan, st);
        for i in &plan.issues {
            tracing::warn!(array = %self.dp().name, seq = i.seq, lost = i.lost, "log replay: {}", i.what);
        }
        if plan.lost() {
            let what: Vec<String> = issues
                .iter()
                .filter(|i| i.lost)
                .map(|i| i.what.clone())
                .collect();
            if !opts.force {
                return Err(Error::Refused(
                    Msg::new(format!(
                        "the log of '{}' lost acknowledged writes the members may not hold: {}",
                        self.dp().name,
                        what.join("; ")
                    ))
                    .or(Step::say(
                        "give every device of its log to assemble (a mirrored log's other device may hold them)",
                    ))
                    .or(Step::force(
                        "start anyway: the rest of the log is replayed, never over newer data, and those ranges may read stale",
                    )),
                ));
            }
            tracing::error!(array = %self.dp().name, "forced past a log that lost acknowledged writes: {}", what.join("; "));
        }
        *self.sync.log.issues.lock() = issues;
        let n = plan.steps.len();
        for &i in &plan.steps {
            let rec = scan
                .read(&trusted, i)
                .await
                .map_err(|e| Error::Invalid(format!("replaying the log: {e}").into()))?;
            self.replay_record(&plan, &rec, st).await?;
        }
        self.sync.log.replayed.store(n as u64, Ordering::Relaxed);
        if n > 0 {
            // Replayed, then durable in the pool, before the new session forgets them.
            for m in st.live_members() {
                dev::flush(&m.dev).await.map_err(|e| {
                    Error::io(format!("flushing {} after the log replay", m.path), e)
                })?;
            }
            tracing::info!(array = %self.dp().name, records = n, "log replayed");
        }
        let usable: Vec<LogDevice> = trusted
            .into_iter()
            .filter(|d| !out.contains(&d.uuid))
            .collect();
        match Log::start(usable, self.uuid, Some(&scan), self.log_host()).await {
            Ok((log, failed)) => {
                let f: Vec<Uuid> = failed.iter().map(|(d, _)| d.uuid).collect();
                self.mark_log_out(&f, OutReason::WriteError);
                self.sync.log.log.store(Some(log));
                // Every write of this session goes through it (recorded at the start).
                let mut c = self.sync.log.cfg.lock();
                c.journal = JOURNALING && c.devices.iter().any(|e| e.active);
            }
            Err(e) => {
                tracing::error!(array = %self.dp().name, "the log cannot be started: {e}");
                let all: Vec<Uuid> = active.iter().map(|e| e.uuid).collect();
                self.mark_log_out(&all, OutReason::WriteError);
            }
        }
        Ok(cfg.journal)
    }

    /// Mark log devices out in memory (recorded with the next superblock write).
    fn mark_log_out(&self, uuids: &[Uuid], reason: OutReason) {
        let event = self.event.load(Ordering::Acquire) + 1;
        let mut cfg = self.sync.log.cfg.lock();
        for e in cfg.devices.iter_mut() {
            if uuids.contains(&e.uuid) && e.active {
                e.active = false;
                e.out = Some(OutRecord { reason, event });
            }
        }
        cfg.journal &= cfg.devices.iter().any(|e| e.active);
    }

    /// Does the pool hold the writes of a record whose payload the log lost? Each entry is
    /// read from its slot's member (an active slot only: a slot being rebuilt or missing
    /// proves nothing), and the record's payload checksum decides.
    async fn pool_holds(&self, h: &format::Header, st: &State) -> bool {
        let mut got: Vec<Option<Vec<u8>>> = Vec::new();
        for e in &h.entries {
            let m = st
                .slots
                .get(e.slot as usize)
                .filter(|s| s.state == crate::superblock::SlotState::Active)
                .and_then(|s| s.member.clone());
            let bytes = match m {
                Some(m) if e.offset + e.len as u64 <= m.size => {
                    let buf = AlignedBuf::zeroed(e.len as usize).into_shared();
                    let off = self.dp().geometry.data_offset + e.offset;
                    match dev::read_at(&m.dev, off, buf.clone(), IoClass::Foreground).await {
                        Ok(()) => buf.try_unwrap().ok().map(|b| b.to_vec()),
                        Err(_) => None,
                    }
                }
                _ => None,
            };
            got.push(bytes);
        }
        let mut it = got.into_iter();
        crate::log::pool_holds(h, |_| it.next().flatten())
    }

    /// The plan's issues for status: ranges named by member.
    fn replay_issues(&self, plan: &crate::log::Plan, st: &State) -> Vec<LogReplayIssue> {
        plan.issues
            .iter()
            .map(|i| LogReplayIssue {
                seq: i.seq,
                lost: i.lost,
                what: i.what.clone(),
                ranges: i.ranges.as_ref().map(|rs| {
                    rs.iter()
                        .map(|r| MemberRange {
                            slot: r.slot as usize,
                            member: st
                                .slots
                                .get(r.slot as usize)
                                .and_then(|s| s.member.as_ref())
                                .map(|m| m.path.clone()),
                            offset: r.offset,
                            len: r.len,
                        })
                        .collect()
                }),
            })
            .collect()
    }

    /// Write one record's entries to the members that take writes for their slots, but
    /// for the blocks the plan keeps as the pool has them.
    async fn replay_record(&self, plan: &crate::log::Plan, rec: &Record, st: &State) -> Result<()> {
        for (slot, offset, data, len) in plan.writes(rec.header.seq, rec) {
            let slot = slot as usize;
            let Some(s) = st.slots.get(slot) else {
                return Err(Error::Invalid(
                    format!(
                    "the log names slot {slot}, and '{}' has {} slots: it is not this array's log",
                    self.dp().name,
                    st.slots.len()
                )
                    .into(),
                ));
            };
            let buf = data.map(|d| AlignedBuf::from_slice(d).into_shared());
            for m in s.write_targets() {
                if offset + len > m.size {
                    return Err(Error::Invalid(
                        format!("the log writes past the end of {}'s data", m.path).into(),
                    ));
                }
                let offset = self.dp().geometry.data_offset + offset;
                let kind = match &buf {
                    Some(b) => dev::IoKind::Write {
                        buf: b.clone(),
                        fua: false,
                    },
                    None => dev::IoKind::Zero { len, punch: false },
                };
                let req = dev::IoReq {
                    offset,
                    kind,
                    class: IoClass::Foreground,
                };
                dev::io(&m.dev, req)
                    .await
                    .map_err(|x| Error::io(format!("replaying the log onto {}", m.path), x))?;
            }
        }
        Ok(())
    }

    /// `sbod add NAME --log DEV`: the first log device makes the log; a second mirrors it
    /// (a failed one is replaced). The device is refused if it holds anything (unless
    /// `force`) or is too small.
    pub async fn add_log(self: &Arc<Self>, spec: MemberSpec, force: bool) -> Result<()> {
        self.dp().check_writable()?;
        let _c = self.sync.log.change.lock().await;
        if self
            .dp()
            .state
            .load()
            .live_members()
            .iter()
            .any(|m| m.path == spec.path)
        {
            return Err(Error::Invalid(
                format!(
                    "{} is a member of '{}', not a log device",
                    spec.path,
                    self.dp().name
                )
                .into(),
            ));
        }
        let cfg = self.sync.log.config();
        let found = self.sync.log.found.lock().clone();
        if found
            .iter()
            .any(|d| d.path == spec.path && cfg.devices.iter().any(|e| e.uuid == d.uuid))
        {
            return Err(Error::Invalid(
                format!(
                    "{} is already a log device of '{}'",
                    spec.path,
                    self.dp().name
                )
                .into(),
            ));
        }
        let active: Vec<String> = cfg
            .devices
            .iter()
            .filter(|e| e.active)
            .map(|e| {
                found
                    .iter()
                    .find(|d| d.uuid == e.uuid)
                    .map(|d| d.path.clone())
                    .unwrap_or_else(|| e.uuid.to_string())
            })
            .collect();
        if active.len() >= crate::superblock::MAX_LOG_DEVICES {
            return Err(Error::Refused(
                format!(
                    "'{}' already has a mirrored log ({}): remove one of its devices first",
                    self.dp().name,
                    active.join(", ")
                )
                .into(),
            ));
        }
        if let Ok(sb) = read_super(&spec.dev).await {
            if !force {
                return Err(Error::Refused(
                    Msg::new(format!(
                        "{} is a log device of {} ({})",
                        spec.path,
                        if sb.array_uuid == self.uuid {
                            format!("'{}' removed earlier", self.dp().name)
                        } else {
                            "another array".to_string()
                        },
                        sb.array_uuid
                    ))
                    .or(Step::force("overwrite it")),
                ));
            }
        } else {
            check_blank(&spec.dev, force).await?;
        }
        // A record is at most a quarter of the ring, and the largest is a whole stripe's
        // plan: every member's chunk (and a replacement's), with its header.
        let stripe = (self.dp().geometry.width as u64 + 1) * self.dp().geometry.chunk as u64;
        let need = (4 * (stripe + 64 * 1024)).max(format::MIN_RING);
        let ring = crate::log::ring_len_for(spec.dev.size());
        if ring < need {
            return Err(Error::Invalid(format!(
                "{} is too small for a log device of '{}': it needs at least {} (four of its largest stripe writes)",
                spec.path,
                self.dp().name,
                crate::layout::human(format::RING_START + need)
            ).into()));
        }
        let dev = LogDevice {
            dev: spec.dev,
            uuid: Uuid::new_v4(),
            path: spec.path,
        };
        crate::log::format(&dev, self.uuid).await.map_err(log_err)?;
        match self.sync.log.current() {
            Some(log) if log.failed().is_none() => {
                log.add_device(dev.clone()).await.map_err(log_err)?
            }
            _ => {
                let (log, failed) = Log::start(vec![dev.clone()], self.uuid, None, self.log_host())
                    .await
                    .map_err(log_err)?;
                if let Some((_, e)) = failed.first() {
                    return Err(Error::Invalid(format!("{}: {e}", dev.path).into()));
                }
                self.sync.log.log.store(Some(log));
            }
        }
        {
            let mut cfg = self.sync.log.cfg.lock();
            // A failed device gives its place to the new one.
            while cfg.devices.len() >= crate::superblock::MAX_LOG_DEVICES {
                match cfg.devices.iter().position(|e| !e.active) {
                    Some(i) => {
                        cfg.devices.remove(i);
                    }
                    None => break,
                }
            }
            if cfg.devices.iter().all(|e| !e.active) {
                cfg.devices.clear();
            }
            cfg.devices.push(LogDevEntry {
                uuid: dev.uuid,
                active: true,
                out: None,
            });
            cfg.journal = JOURNALING;
        }
        self.sync.log.found.lock().push(dev);
        self.persist_log().await;
        Ok(())
    }

    /// Record that every write goes through the log, or (`false`) what an sbod that did
    /// not journal recorded: for tests of assembly (the write path journals while a log
    /// runs, whatever this says; the members then trust the log less than they could).
    #[doc(hidden)]
    pub async fn set_log_journaling(&self, on: bool) {
        let _c = self.sync.log.change.lock().await;
        {
            let mut cfg = self.sync.log.cfg.lock();
            cfg.journal = on && cfg.devices.iter().any(|e| e.active);
        }
        self.persist_log().await;
    }

    /// Is `who` (a path or uuid) one of the array's log devices?
    pub fn is_log_device(&self, who: &str) -> bool {
        self.log_uuid_of(who).is_some()
    }

    fn log_uuid_of(&self, who: &str) -> Option<Uuid> {
        let cfg = self.sync.log.cfg.lock();
        let found = self.sync.log.found.lock();
        cfg.devices
            .iter()
            .find(|e| {
                e.uuid.to_string() == who || found.iter().any(|d| d.uuid == e.uuid && d.path == who)
            })
            .map(|e| e.uuid)
    }

    /// `sbod remove NAME DEV` for a log device. The last device in service takes the log
    /// with it: what the log holds is made durable in the pool first, and writes take the
    /// in-pool path from then on.
    pub async fn remove_log(&self, who: &str) -> Result<()> {
        self.dp().check_writable()?;
        let _c = self.sync.log.change.lock().await;
        let uuid = self.log_uuid_of(who).ok_or_else(|| {
            Error::Invalid(format!("{who} is not a log device of '{}'", self.dp().name).into())
        })?;
        let cfg = self.sync.log.config();
        let entry = cfg
            .devices
            .iter()
            .find(|e| e.uuid == uuid)
            .copied()
            .expect("found above");
        let others = cfg
            .devices
            .iter()
            .filter(|e| e.active && e.uuid != uuid)
            .count();
        if entry.active {
            match self.sync.log.current() {
                Some(log) if others > 0 => log.remove_device(uuid).map_err(log_err)?,
                Some(log) => {
                    // The members stop trusting the log first (writes still go through it
                    // until it is closed: a write in the pool before then could be
                    // overwritten by an older record's replay).
                    self.sync.log.cfg.lock().journal = false;
                    self.persist_log().await;
                    if let Err(e) = log.close().await {
                        tracing::warn!(array = %self.dp().name, "closing the log: {e}");
                        // Whatever it held is made durable in the pool.
                        log.drain().await;
                        self.dp().flush().await?;
                    }
                    self.sync.log.log.store(None);
                }
                None => {}
            }
        }
        {
            let mut cfg = self.sync.log.cfg.lock();
            cfg.devices.retain(|e| e.uuid != uuid);
            if !cfg.devices.iter().any(|e| e.active) {
                cfg.devices.clear();
                cfg.journal = false;
            }
        }
        self.persist_log().await;
        let dev = {
            let mut found = self.sync.log.found.lock();
            let i = found.iter().position(|d| d.uuid == uuid);
            i.map(|i| found.remove(i))
        };
        if let Some(d) = dev {
            // Its superblock goes, so it is not mistaken for this array's log later.
            let z = AlignedBuf::zeroed(2 * format::BLOCK).into_shared();
            let _ = dev::write_at(&d.dev, 0, z, true, IoClass::Foreground).await;
            d.dev.close();
        }
        Ok(())
    }

    /// Every log device failed (an append or a checkpoint said so): once every record the
    /// log acknowledged is applied and the pool flushed, record the log as failed. Writes
    /// take the in-pool path from then on. The engine calls this before it writes in the
    /// pool what it could not log.
    pub async fn log_failed(&self) -> Result<()> {
        let _c = self.sync.log.change.lock().await;
        let Some(log) = self.sync.log.current() else {
            return Ok(());
        };
        log.drain().await;
        self.dp().flush().await?;
        let uuids: Vec<Uuid> = self
            .sync
            .log
            .config()
            .devices
            .iter()
            .filter(|e| e.active)
            .map(|e| e.uuid)
            .collect();
        tracing::error!(array = %self.dp().name, "the log has failed: writes take the in-pool path");
        // Recorded before any write goes in the pool: until then the members trust the log
        // to hold every write of the session, and writes wait here.
        self.record_log_out(&uuids, OutReason::WriteError).await;
        self.sync.log.log.store(None);
        Ok(())
    }

    /// At a clean stop: reclaim the whole log (the pool is flushed), so it holds nothing.
    pub(crate) async fn close_log(&self) {
        if let Some(log) = self.sync.log.current() {
            if let Err(e) = log.close().await {
                tracing::warn!(array = %self.dp().name, "closing the log: {e}");
            }
        }
        self.sync.log.close_devices();
    }

    /// The paths of the log devices this array records (for the registry).
    pub fn log_paths(&self) -> Vec<String> {
        let cfg = self.sync.log.cfg.lock();
        self.sync
            .log
            .found
            .lock()
            .iter()
            .filter(|d| cfg.devices.iter().any(|e| e.uuid == d.uuid))
            .map(|d| d.path.clone())
            .collect()
    }

    /// The running log (every client write goes through it).
    pub fn log(&self) -> Option<Arc<Log>> {
        self.sync.log.current()
    }

    /// The log for status: None without one.
    pub fn log_status(&self) -> Option<LogStatus> {
        let cfg = self.sync.log.config();
        if cfg.devices.is_empty() {
            return None;
        }
        let info = self.sync.log.current().map(|l| l.info());
        let found = self.sync.log.found.lock().clone();
        let devices: Vec<LogDevStatus> = cfg
            .devices
            .iter()
            .map(|e| {
                let run = info
                    .as_ref()
                    .and_then(|i| i.devices.iter().find(|d| d.uuid == e.uuid));
                let path = found
                    .iter()
                    .find(|d| d.uuid == e.uuid)
                    .map(|d| d.path.clone());
                let state = match (e.active, run) {
                    (true, Some(r)) if !r.active => LogDevState::Failed,
                    (true, None) if info.is_some() => LogDevState::Failed,
                    (true, _) => LogDevState::Active,
                    (false, _) if e.out.is_some_and(|o| o.reason == OutReason::Missing) => {
                        LogDevState::Missing
                    }
                    (false, _) => LogDevState::Failed,
                };
                LogDevStatus {
                    path,
                    uuid: e.uuid.to_string(),
                    state,
                    reason: run
                        .and_then(|r| r.reason.clone())
                        .or_else(|| e.out.map(|o| o.reason.to_string())),
                    write_errors: run.map(|r| r.write_errors).unwrap_or(0),
                }
            })
            .collect();
        let up = devices
            .iter()
            .filter(|d| d.state == LogDevState::Active)
            .count();
        let state = if up == 0 {
            LogState::Failed
        } else if up < devices.len() {
            LogState::Degraded
        } else {
            LogState::Optimal
        };
        let i = info.as_ref();
        Some(LogStatus {
            state,
            devices,
            capacity: i.map(|i| i.capacity).unwrap_or(0),
            used: i.map(|i| i.used).unwrap_or(0),
            records: i.map(|i| i.records).unwrap_or(0),
            bytes: i.map(|i| i.bytes).unwrap_or(0),
            checkpoints: i.map(|i| i.checkpoints).unwrap_or(0),
            replayed_records: self.sync.log.replayed.load(Ordering::Relaxed),
            replay_issues: self.sync.log.issues.lock().clone(),
            journaling: cfg.journal,
        })
    }
}
