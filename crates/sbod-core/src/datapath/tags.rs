//! The member I/O layer's side of the checksums (see [`crate::integrity`] for their format
//! and cache): `mread` verifies every block, `mwrite` and `mzero` set the tags of what
//! they write, `flush` writes changed tags back, and a read that fails its tags is counted
//! as a checksum error (not a read error). The background processes use the rest: a
//! reconstruction vouched for against the tags of the member it replaces, and the resync
//! after a crash, which makes tags agree with what it makes consistent.

use super::{DataPath, WriteFault};
use crate::buf::{AlignedBuf, SharedBuf};
use crate::dev::IoClass;
use crate::error::{Error, Result};
use crate::integrity::{self, Kind, Mismatch, NewTags, TagLayout, TagWrite, BLOCK};
use crate::member::Member;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;

impl DataPath {
    /// The tag region, if this array carries tags.
    pub fn tag_layout(&self) -> Option<TagLayout> {
        self.integrity
    }

    pub fn integrity(&self) -> Kind {
        match self.integrity {
            Some(_) => Kind::Crc32c,
            None => Kind::None,
        }
    }

    /// The tags of member data `[off, off+len)` of `m` as the cache (or the member) has them.
    pub async fn member_tags(&self, m: &Arc<Member>, off: u64, len: u64) -> io::Result<Vec<u32>> {
        match &self.integrity {
            Some(layout) => m.tags.get(&m.dev, layout, off, len).await,
            None => Ok(Vec::new()),
        }
    }

    /// Read member data and verify every block against its tag (`mread`). A block that
    /// fails is read again while its tags keep changing (a write to it landed meanwhile);
    /// one that still fails is a [`Mismatch`].
    pub(super) async fn read_verified(
        &self,
        m: &Arc<Member>,
        off: u64,
        buf: SharedBuf,
        class: IoClass,
        layout: &TagLayout,
    ) -> io::Result<()> {
        if class == IoClass::Background {
            // A process going forward through the member: its tags in one read ahead.
            m.tags.read_ahead(&m.dev, layout, off).await;
        }
        let mut check = m
            .tags
            .read_check(&m.dev, layout, off, buf.len() as u64)
            .await?;
        let mut tries = 0;
        loop {
            check.start();
            self.mread_raw(m, off, buf.clone(), class).await?;
            // SAFETY: the read completed; the caller reads the buffer only after us.
            let data = unsafe { buf.as_slice() };
            let mut bad = check.bad(layout.zeroed, data);
            if let (true, Some(bm)) = (self.read_only.load(Ordering::Acquire), &self.bitmap) {
                // Looked at or rescued after a crash: nothing resyncs the regions written
                // at the time, whose checksums may lag their data; those are not held
                // against it (the rest are).
                bad.retain(|&b| !bm.is_dirty(bm.region_of(b)));
            }
            if bad.is_empty() {
                return Ok(());
            }
            tries += 1;
            if !check.moved() || tries >= integrity::REREADS {
                return Err(integrity::mismatch(bad));
            }
        }
    }

    /// Before a write (or zeroing) of member data `[off, off+len)` of `m`: its new tags
    /// (see [`crate::integrity::MemberTags::set`]).
    pub(super) async fn tags_begin_write(
        &self,
        m: &Arc<Member>,
        off: u64,
        new: NewTags<'_>,
    ) -> io::Result<Option<TagWrite>> {
        match &self.integrity {
            Some(layout) => m.tags.set(&m.dev, layout, off, new).await.map(Some),
            None => Ok(None),
        }
    }

    /// The write is done (see [`crate::integrity::MemberTags::settle`]). One that failed
    /// on a member still in service (its file system full) is read back, and each block
    /// keeps the tag of what it holds (see [`crate::integrity::MemberTags::resolve`]).
    pub(super) async fn tags_end_write(&self, m: &Arc<Member>, w: Option<TagWrite>, ok: bool) {
        let Some(w) = w else {
            return;
        };
        let (off, len) = (w.off, w.len);
        m.tags.settle(w, ok);
        if ok || !self.in_service(m) {
            return;
        }
        let buf = AlignedBuf::for_overwrite(len as usize).into_shared();
        if self
            .mread_raw(m, off, buf.clone(), IoClass::Foreground)
            .await
            .is_ok()
        {
            let zeroed = self.integrity.is_some_and(|l| l.zeroed);
            // SAFETY: the read completed.
            m.tags.resolve(off, unsafe { buf.as_slice() }, zeroed);
        }
    }

    /// Set the tags of member data `[off, off+len)` from what it holds (`data`), with no
    /// write: a resync after a crash, which makes a dirty region consistent and its tags
    /// agree with it.
    pub(crate) async fn retag(&self, m: &Arc<Member>, off: u64, data: &[u8]) -> io::Result<()> {
        if let Some(w) = self.tags_begin_write(m, off, NewTags::Data(data)).await? {
            self.tags_end_write(m, Some(w), true).await;
        }
        Ok(())
    }

    /// The crash resync: retag each member's chunk at `off` from what it holds (`bufs`).
    /// The rows it then rewrites set their own tags as any write does, keeping these as
    /// the old ones: a rewrite refused for space (a thin member full) leaves each block
    /// with the tag of what it still holds (see [`DataPath::tags_end_write`]), never a tag
    /// for bytes that did not land, which reads would blame on the member.
    pub(crate) async fn retag_resynced(
        &self,
        members: &[Arc<Member>],
        off: u64,
        bufs: &[SharedBuf],
    ) {
        for (m, b) in members.iter().zip(bufs) {
            // SAFETY: the reads completed; the resync holds the stripe lock.
            let data = unsafe { b.as_slice() };
            if let Err(e) = self.retag(m, off, data).await {
                self.note_read_error(m, &e).await;
            }
        }
    }

    /// For each member, which 4 KiB rows of `bufs` (its chunk at `off`, read as it is)
    /// match their checksums (none where its checksums cannot be read, or there are none).
    pub(crate) async fn rows_vouched(
        &self,
        members: &[Arc<Member>],
        off: u64,
        bufs: &[SharedBuf],
    ) -> Vec<Vec<bool>> {
        let Some(layout) = self.integrity else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (m, b) in members.iter().zip(bufs) {
            // SAFETY: the reads completed; the resync holds the stripe lock.
            let data = unsafe { b.as_slice() };
            let rows = data.len() / BLOCK as usize;
            let v = match m.tags.check(&m.dev, &layout, off, data).await {
                Ok(bad) => (0..rows)
                    .map(|r| !bad.contains(&(off + r as u64 * BLOCK)))
                    .collect(),
                Err(_) => vec![false; rows],
            };
            out.push(v);
        }
        out
    }

    /// Retag member data `[off, off+len)` of each of `members` from what it holds (a
    /// resync that cannot make a stripe consistent, a member missing). A member that
    /// cannot be read is left to its read error.
    pub(crate) async fn retag_chunks(
        &self,
        members: impl Iterator<Item = &Arc<Member>>,
        off: u64,
        len: u64,
    ) {
        if self.integrity.is_none() {
            return;
        }
        for m in members {
            let buf = AlignedBuf::for_overwrite(len as usize).into_shared();
            let r = match self
                .mread_raw(m, off, buf.clone(), IoClass::Background)
                .await
            {
                // SAFETY: the read completed.
                Ok(()) => self.retag(m, off, unsafe { buf.as_slice() }).await,
                Err(e) => Err(e),
            };
            if let Err(e) = r {
                self.note_read_error(m, &e).await;
            }
        }
    }

    /// Write every changed tag block of every member in service (`flush`: the member
    /// flush that follows makes them durable with the data). A member that cannot take
    /// its tags is failed as for a bitmap write.
    pub(super) async fn tags_write_back(&self) -> Result<()> {
        let Some(layout) = self.integrity else {
            return Ok(());
        };
        let st = self.state.load_full();
        let members = st.live_members();
        let futs = members
            .iter()
            .map(|m| async move { (m.clone(), m.tags.write_back(&m.dev, &layout).await) });
        let mut full = Vec::new();
        for (m, r) in futures::future::join_all(futs).await {
            if let Err(e) = r {
                if self.write_failed(&m, &e, crate::reason::TAG_WRITE).await == WriteFault::NoSpace
                {
                    full.push(m);
                }
            }
        }
        self.failed()?;
        if !full.is_empty() {
            return Err(self.nospace_error(&full));
        }
        Ok(())
    }

    /// Has any member in service tags of bitmap region `r` not yet written back? (The
    /// sweeper keeps such a region dirty: its bit is cleared only once its tags are
    /// durable.)
    pub(super) fn tags_dirty_in_region(&self, r: u64) -> bool {
        let (Some(_), Some(bm)) = (self.integrity, self.bitmap.as_ref()) else {
            return false;
        };
        let (from, to) = (r * bm.region, (r + 1) * bm.region);
        self.state
            .load()
            .live_members()
            .iter()
            .any(|m| m.tags.dirty_in(from, to))
    }

    /// A member returned data that failed its tags and nothing can judge which is wrong
    /// (`note_read_error`: no redundancy, or none left to rebuild from). Counted as
    /// checksum errors, one per block (see [`DataPath::note_data_errors`]).
    pub(super) async fn note_checksum_error(&self, m: &Arc<Member>, x: &Mismatch) {
        self.note_data_errors(m, x).await
    }

    /// Blocks of `m` known (or taken) to hold wrong data. Counted as checksum errors; past
    /// `max_checksum_errors` the member is failed, where its group can do without it
    /// (without redundancy its reads answer EIO and it stays: failing it would fail the
    /// array and all the good data with it).
    pub(crate) async fn note_data_errors(&self, m: &Arc<Member>, x: &Mismatch) {
        let n = x.blocks.len() as u64;
        let total = m.stats.checksum_errors.fetch_add(n, Ordering::Relaxed) + n;
        tracing::warn!(member = %m.path, blocks = n, total, "{x}");
        if let Some(s) = self.shrunk(m) {
            self.fail_member(m, s.why()).await;
            return;
        }
        let max = self.settings.lock().max_checksum_errors;
        if total > max && self.geometry.redundancy() > 0 {
            self.fail_member(m, crate::reason::checksums(total)).await;
        }
    }

    /// Blocks of `m` whose tag was found wrong over right data (redundancy rebuilt the
    /// bytes the member holds): damage to its tag region, counted apart and never held
    /// against it (the tags are rewritten by the caller).
    pub(crate) fn note_tag_errors(&self, m: &Arc<Member>, n: u64, off: u64) {
        if n == 0 {
            return;
        }
        let total = m.stats.tag_errors.fetch_add(n, Ordering::Relaxed) + n;
        tracing::warn!(member = %m.path, blocks = n, total, offset = off, "checksums damaged over right data: rewritten (the member's tag region was damaged, not its data)");
    }

    /// A member read failed, and the caller will rebuild what the member should hold
    /// from redundancy and hand it to [`DataPath::heal`], which judges a checksum
    /// mismatch then (a damaged tag, or wrong data). Other errors are counted now.
    pub(crate) async fn note_read_error_to_heal(&self, m: &Arc<Member>, e: &io::Error) {
        if integrity::mismatch_of(e).is_none() {
            self.note_read_error(m, e).await;
        }
    }

    /// A read error noted by [`DataPath::note_read_error_to_heal`] that will not be healed
    /// after all (nothing left to rebuild from, or too little to rebuild from: the client
    /// gets EIO). A checksum mismatch is counted as checksum errors, but fails nobody:
    /// nothing judged whether the data or its tag is wrong (another member failing the
    /// same row may be the wrong one), and taking a member out for what may be a damaged
    /// tag would cost the redundancy that judges it.
    pub(crate) async fn unhealed(&self, m: &Arc<Member>, e: &io::Error) {
        if let Some(x) = integrity::mismatch_of(e) {
            let n = x.blocks.len() as u64;
            let total = m.stats.checksum_errors.fetch_add(n, Ordering::Relaxed) + n;
            tracing::warn!(member = %m.path, blocks = n, total, "{x}; nothing left to tell wrong data from a damaged checksum: not returned");
        }
    }

    /// Heal member data `[off, off+len)` of `m` whose read failed (`e`) with `good`, what
    /// redundancy says it holds (rebuilt under the stripe lock, which the caller holds).
    /// An I/O error: `good` is written back ([`DataPath::repair`]). A checksum mismatch is
    /// judged block by block against the member's own bytes, read again: a block that
    /// fails its tag but equals `good` has right data under a damaged tag (its tag is
    /// rewritten, counted as a tag error, the member not blamed); one that differs holds
    /// wrong data (a checksum error, counted towards failing the member, and rewritten).
    /// So damage to a tag region never fails a healthy member, while wrong data still
    /// does. True if the member holds `good` with tags that vouch for it.
    pub(crate) async fn heal(
        &self,
        m: &Arc<Member>,
        off: u64,
        good: SharedBuf,
        class: IoClass,
        e: &io::Error,
    ) -> bool {
        let Some(layout) = self.integrity else {
            return self.repair(m, off, good, class).await;
        };
        if integrity::mismatch_of(e).is_none() {
            return self.repair(m, off, good, class).await;
        }
        if !self.in_service(m) {
            self.note_read_error(m, e).await;
            return false;
        }
        let len = good.len();
        let raw = AlignedBuf::for_overwrite(len).into_shared();
        if let Err(re) = self.mread_raw(m, off, raw.clone(), class).await {
            // Unreadable now: judged as the I/O error it is, and rewritten.
            self.note_read_error(m, &re).await;
            return self.repair(m, off, good, class).await;
        }
        // SAFETY: the read completed; the buffers are ours.
        let (raw_s, good_s) = unsafe { (raw.as_slice(), good.as_slice()) };
        let bad = match m.tags.check(&m.dev, &layout, off, raw_s).await {
            Ok(bad) => bad,
            Err(_) => {
                // Its tags cannot be read: nothing to judge by; rewritten as before.
                self.note_read_error(m, e).await;
                return self.repair(m, off, good, class).await;
            }
        };
        let block = |b: u64| {
            let at = (b - off) as usize;
            at..at + BLOCK as usize
        };
        let (tags, data): (Vec<u64>, Vec<u64>) = bad
            .into_iter()
            .partition(|&b| raw_s[block(b)] == good_s[block(b)]);
        self.note_tag_errors(m, tags.len() as u64, off);
        if !data.is_empty() {
            self.note_data_errors(m, &Mismatch { blocks: data }).await;
        }
        if raw_s == good_s {
            // The data is right: only tags to rewrite (no data write).
            if tags.is_empty() {
                return true;
            }
            return match self.retag(m, off, good_s).await {
                Ok(()) => true,
                Err(re) => {
                    self.note_read_error(m, &re).await;
                    false
                }
            };
        }
        self.repair(m, off, good, class).await
    }

    /// Vouch for data rebuilt from redundancy to replace member data `[off, off+len)` of
    /// `m` that could not be read or failed its tags (`as_read`: what `m` returned). Each
    /// block must match `m`'s tag (or have none); if it does not, but equals what `m`
    /// returned, the tag was the damaged part (the block is rewritten with a new tag).
    /// Otherwise the reconstruction is not known to be the data (parity from before a
    /// lost write, say): an error, never a guess.
    ///
    /// Only a member in service vouches (the caller holds the stripe lock, so this holds
    /// for the whole check): it took every write to the stripe, each setting its tags
    /// first. One failed since its read was issued (a concurrent write to it failed)
    /// took none after that, so its tags describe a moment of the stripe now gone, while
    /// the rebuild is of the stripe as it is: nothing to hold the rebuild against, as for
    /// any member out of service (a degraded read returns its rebuild unvouched).
    pub(crate) async fn tags_vouch(
        &self,
        m: &Arc<Member>,
        off: u64,
        rebuilt: &[u8],
        as_read: &[u8],
    ) -> Result<()> {
        let Some(layout) = self.integrity else {
            return Ok(());
        };
        if !self.in_service(m) {
            return Ok(());
        }
        let Ok(tags) = self.member_tags(m, off, rebuilt.len() as u64).await else {
            return Ok(()); // its tags cannot be read: nothing to hold the rebuild against
        };
        for (n, (t, blk)) in tags.iter().zip(rebuilt.chunks(BLOCK as usize)).enumerate() {
            let b = off / BLOCK + n as u64;
            let at = n * BLOCK as usize;
            if integrity::matches(
                *t,
                integrity::tag(b, blk),
                integrity::zero_tag(b),
                layout.zeroed,
            ) || as_read.get(at..at + blk.len()) == Some(blk)
            {
                continue;
            }
            return Err(Error::io(
                format!("reading {}", m.path),
                io::Error::other(format!(
                    "member offset {}: the data rebuilt from redundancy does not match its checksum either; not returned",
                    b * BLOCK
                )),
            ));
        }
        Ok(())
    }
}
