//! The superblock every member carries, written on every state change (event + 1), and
//! stopping: cleanly (flushed, bitmap cleared, marked clean) or as a power cut would.

use super::create::default_region;
use super::{Array, Member, State};
use crate::buf::AlignedBuf;
use crate::dev::{self, IoClass};
use crate::error::Result;
use crate::superblock::{Slot, SlotState, Superblock};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use uuid::Uuid;

impl Array {
    /// The superblock a member gets for the given state.
    pub(crate) fn superblock(&self, st: &State, event: u64, clean: bool, this: Uuid) -> Superblock {
        Superblock {
            array_uuid: self.uuid,
            name: self.dp().name.clone(),
            created: self.created,
            event,
            this_member: this,
            geometry: self.dp().geometry.clone(),
            bitmap_region: self
                .dp()
                .bitmap
                .as_ref()
                .map(|b| b.region)
                .unwrap_or_else(|| {
                    default_region(self.dp().geometry.member_size, self.dp().geometry.chunk)
                }),
            bitmap_bytes: self.dp().bitmap_bytes,
            clean,
            resync_offset: self.dp().resync_offset.load(Ordering::Acquire),
            slots: st
                .slots
                .iter()
                .map(|s| Slot {
                    member: s.entry.clone(),
                    state: s.state,
                    recovery_offset: s.recovery.load(Ordering::Acquire),
                    replacement: s
                        .replacement
                        .as_ref()
                        .map(|(m, r)| (m.entry(), r.load(Ordering::Acquire))),
                    out: match s.state {
                        SlotState::Active => None,
                        _ => s.out,
                    },
                    bitmap_recovery: s.bitmap_recovery && s.state == SlotState::Rebuilding,
                })
                .collect(),
            spares: st.spares.iter().map(|m| m.entry()).collect(),
            session: self.lineage.session,
            history: self.lineage.history.clone(),
            bitmap_since: self.lineage.bitmap_since.load(Ordering::Acquire),
            sync: self.sync.mode(),
            log: self.sync.log_entries(),
            tags: self.lineage.tags,
            reshape: self.reshaping().map(|r| crate::superblock::ReshapeRec {
                old: r.old.dp.geometry.clone(),
                pos: r.pos.load(Ordering::Acquire),
                backup: *r.backup.lock(),
            }),
            spared: self.spare_rec(),
            extensions: self.lineage.extensions.clone(),
        }
    }

    /// The distributed spare space in use, as the superblocks record it.
    fn spare_rec(&self) -> crate::superblock::SpareRec {
        let s = self.dp().map.spared();
        let l = |v: &[usize]| v.iter().map(|&x| x as u16).collect::<Vec<u16>>();
        crate::superblock::SpareRec {
            list: l(&s.from),
            next: s
                .to
                .as_ref()
                .map(|t| (l(t), s.recorded.load(Ordering::Acquire))),
            first: s
                .to
                .as_ref()
                .and(s.first())
                .map(|y| (y as u16, s.first_recorded.load(Ordering::Acquire))),
        }
    }

    /// Write the superblock for `st` to every live member (event + 1). Returns the
    /// members whose write failed; the caller fails them. Call with `mgmt` held.
    pub(crate) async fn persist(&self, st: &State, clean: bool) -> Vec<Arc<Member>> {
        self.persist_recorded(st, clean).await.unwrap_or_default()
    }

    /// As [`Array::persist`], and `None` where nothing was written (looking or rescuing,
    /// or the lease lost): a step that may only follow the record (wiping a member that
    /// leaves) must not follow it then.
    pub(crate) async fn persist_recorded(
        &self,
        st: &State,
        clean: bool,
    ) -> Option<Vec<Arc<Member>>> {
        if self.dp().read_only.load(Ordering::Acquire) {
            // Looking or rescuing: nothing is ever written to a member.
            return None;
        }
        if self.hold_lease().await.is_err() {
            // Taken over, or the heartbeat could not reach the members for the time a
            // client write waits for it: write nothing, for good (a superblock another
            // head may be writing too must not be touched).
            if self.dp().lease.fenced_by().is_none() {
                let by = "the ownership lease lapsed while recording a state change".to_string();
                if self.dp().lease.fence(by.clone()) {
                    tracing::error!(array = %self.dp().name, "fenced: {by}: this head writes nothing more");
                }
            }
            return None;
        }
        let event = self.event.fetch_add(1, Ordering::AcqRel) + 1;
        let members = st.live_members();
        // One superblock for all: members at the same event say the same thing (assembly
        // refuses one that does not), though a rebuild may move on meanwhile.
        let base = self.superblock(st, event, clean, Uuid::nil());
        let futs = members.iter().map(|m| {
            let sb = Superblock {
                this_member: m.uuid,
                ..base.clone()
            };
            let bytes = sb.encode();
            let mut buf = AlignedBuf::zeroed(bytes.len().div_ceil(4096) * 4096);
            buf[..bytes.len()].copy_from_slice(&bytes);
            let off = sb.copy_offset();
            let m = m.clone();
            async move {
                let r =
                    dev::write_at(&m.dev, off, buf.into_shared(), true, IoClass::Foreground).await;
                (m, r)
            }
        });
        let mut failed = Vec::new();
        for (m, r) in futures::future::join_all(futs).await {
            if let Err(e) = r {
                tracing::error!(member = %m.path, error = %e, "superblock write failed");
                m.stats.write_errors.fetch_add(1, Ordering::Relaxed);
                failed.push(m);
            }
        }
        Some(failed)
    }

    /// Record `new` on the live members, then use it. Call with `mgmt` held. Returns the
    /// members whose superblock write failed (the caller fails them).
    pub(crate) async fn commit(&self, new: State) -> Vec<Arc<Member>> {
        self.commit_recorded(new).await.unwrap_or_default()
    }

    /// As [`Array::commit`], and `None` where nothing was written (see
    /// [`Array::persist_recorded`]).
    pub(crate) async fn commit_recorded(&self, new: State) -> Option<Vec<Arc<Member>>> {
        let lost = self.persist_recorded(&new, false).await;
        self.dp().state.store(Arc::new(new));
        lost
    }

    /// Drop the array as a power cut would: stop everything and close the members
    /// without flushing, clearing the bitmap or marking the superblocks clean. The next
    /// assembly sees an unclean shutdown. For tests and fault drills.
    pub async fn abandon(&self) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        self.dp().closing.store(true, Ordering::Release);
        self.stop_heartbeat();
        if let Some(p) = self.bg.process.lock().clone() {
            p.cancel();
        }
        self.kick();
        let tasks = std::mem::take(&mut *self.bg.tasks.lock());
        for t in &tasks {
            t.abort();
        }
        for t in tasks {
            let _ = t.await;
        }
        let st = self.dp().state.load_full();
        for s in &st.slots {
            if let Some(m) = &s.member {
                m.dev.close();
            }
            if let Some((m, _)) = &s.replacement {
                m.dev.close();
            }
        }
        for m in &st.spares {
            m.dev.close();
        }
        self.sync.close_devices();
    }

    /// What `close` (or the stop before it) is doing now, for `sbod stop` to show (None:
    /// not stopping).
    pub fn closing_stage(&self) -> Option<sbod_types::Closing> {
        let s = (*self.closing.stage.lock())?;
        // The server's last flush (of the clients' writes) and the close's own: on drives
        // with write caches on that is the long part.
        let st = self.dp().state.load_full();
        let members: Vec<&Arc<Member>> = st.slots.iter().flat_map(|s| s.write_targets()).collect();
        let busy = members
            .iter()
            .filter(|m| m.stats.flushing.load(Ordering::Relaxed) > 0)
            .count();
        Some(if busy > 0 {
            sbod_types::Closing {
                stage: FLUSHING.into(),
                members_flushed: Some([(members.len() - busy) as u64, members.len() as u64]),
            }
        } else {
            sbod_types::Closing {
                stage: s.into(),
                members_flushed: None,
            }
        })
    }

    /// The server is stopping: it finishes its clients' requests and flushes, then closes
    /// the array. From here `closing_stage` tells how far it is.
    pub fn stopping(&self) {
        self.closing
            .stage
            .lock()
            .get_or_insert("finishing the clients' requests");
    }

    /// Stop background work, flush, mark clean and close the members.
    pub async fn close(&self) -> Result<()> {
        if self.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        if self.dp().read_only.load(Ordering::Acquire) {
            // Looked at or rescued: nothing was written, nothing to record.
            self.release_members().await;
            let st = self.dp().state.load_full();
            for m in st.live_members() {
                m.dev.close();
            }
            for m in st.slots.iter().filter_map(|s| s.member.as_ref()) {
                m.dev.close();
            }
            self.sync.close_devices();
            return Ok(());
        }
        self.dp().closing.store(true, Ordering::Release);
        self.closing.stage("stopping background work");
        if let Some(p) = self.bg.process.lock().clone() {
            p.cancel();
        }
        self.kick();
        let tasks = std::mem::take(&mut *self.bg.tasks.lock());
        for t in tasks {
            let _ = t.await;
        }
        // Stripes a write left inconsistent get a last chance; any left keep their regions
        // dirty (the array is not marked clean) and are resynced at the next start.
        self.closing
            .stage("resyncing stripes a write left inconsistent");
        let unsynced = self.resync_unsynced().await.unwrap_or(1);
        self.closing.stage("closing the log");
        self.close_log().await;
        // Drives with their write caches on destage them here: on a loaded array of HDDs
        // that takes seconds to minutes, which `sbod stop` shows with this count.
        self.closing.stage(FLUSHING);
        let flushed = self.dp().flush().await;
        self.closing.stage("recording the array clean");
        let _g = self.mgmt.lock().await;
        let st = self.dp().state.load_full();
        let clean = flushed.is_ok() && st.failed.is_none() && unsynced == 0;
        // With every slot in service, everything is durable everywhere: clear the whole
        // bitmap. Degraded, keep it: its bits are the record of what the members that are
        // out missed (they come back by it).
        let whole = self.whole(&st);
        if clean && whole && self.dp().bitmap.is_some() {
            // Nothing older than this stop can be recovered from the bitmap now.
            self.lineage
                .bitmap_since
                .store(self.event.load(Ordering::Acquire) + 1, Ordering::Release);
            self.dp().clear_all().await;
        }
        let _ = self.persist(&st, clean).await;
        // Last: another host may start the array at once now.
        self.closing.stage("releasing the members");
        self.release_members().await;
        for m in st.live_members() {
            m.dev.close();
        }
        for s in &st.slots {
            if let Some(m) = &s.member {
                m.dev.close();
            }
        }
        flushed
    }
}

/// The stage a stop is in while members are being flushed.
const FLUSHING: &str = "flushing the members (their write caches)";

/// Where a stop stands (see `Array::closing_stage`).
#[derive(Default)]
pub(crate) struct Closing {
    stage: parking_lot::Mutex<Option<&'static str>>,
}

impl Closing {
    fn stage(&self, s: &'static str) {
        *self.stage.lock() = Some(s);
    }
}
