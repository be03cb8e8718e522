//! The client's requests (NBD's READ, WRITE, WRITE_ZEROES, TRIM, FLUSH): checked, then
//! handed to the array's RAID family. Byte-granular writes are merged here into whole
//! blocks under the stripe lock the family takes.

use super::process::reshape::Route;
use super::{Array, Core};
use crate::buf::{AlignedBuf, SharedBuf};
use crate::error::{Error, Result};
use crate::family::{Patch, BLOCK};
use crate::member::State;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The view of the volume that serves a request: the array's own, or during a reshape
/// the old layout's for what has not moved yet.
pub(crate) enum View {
    Cur(arc_swap::Guard<Arc<Core>>),
    Old(Arc<Core>),
}

impl std::ops::Deref for View {
    type Target = Core;
    fn deref(&self) -> &Core {
        match self {
            View::Cur(g) => g,
            View::Old(c) => c,
        }
    }
}

type Pass<'a> = tokio::sync::RwLockReadGuard<'a, ()>;

impl Array {
    /// Let a request on `[offset, offset + len)` in: its pass at the gate, and the view
    /// that serves it. During a reshape, a request that touches the window being moved
    /// (or lies across the boundary between the layouts) waits, holding no pass, until the
    /// window is durable in the new layout.
    pub(crate) async fn enter(&self, offset: u64, len: u64) -> (Pass<'_>, View) {
        loop {
            let (pass, parts) = self.enter_parts(offset, len, false).await;
            if let Some((_, _, v)) = parts.into_iter().next() {
                return (pass, v);
            }
        }
    }

    /// As [`Array::enter`], but a request across the boundary between the layouts while
    /// no window is being moved is cut there: the views with the ranges each serves.
    /// (Without `split`, such a request waits as one that touches the window does.)
    async fn enter_parts(
        &self,
        offset: u64,
        len: u64,
        split: bool,
    ) -> (Pass<'_>, Vec<(u64, u64, View)>) {
        let end = offset.saturating_add(len);
        loop {
            let pass = self.gate.enter_client().await;
            let r = match self.reshape.load().as_ref() {
                None => return (pass, vec![(offset, end, View::Cur(self.core.load()))]),
                Some(r) => r.clone(),
            };
            let moved = r.moved.notified();
            // Closing or failed: the request is refused as ever (`check_io`).
            let refused = self.dp().closing.load(Ordering::Acquire)
                || self.dp().state.load().failed.is_some();
            if refused {
                return (pass, vec![(offset, end, View::Cur(self.core.load()))]);
            }
            match r.route(offset, end, split) {
                Route::New => return (pass, vec![(offset, end, View::Cur(self.core.load()))]),
                Route::Old => return (pass, vec![(offset, end, View::Old(r.old.clone()))]),
                Route::Split { at, low_new } => {
                    let (low, high) = match low_new {
                        true => (View::Cur(self.core.load()), View::Old(r.old.clone())),
                        false => (View::Old(r.old.clone()), View::Cur(self.core.load())),
                    };
                    return (pass, vec![(offset, at, low), (at, end, high)]);
                }
                Route::Wait => {}
            }
            drop(pass);
            // Woken when the window moves on; a second now and then in case a reshape
            // that stopped (closing, an error) leaves it where it is.
            let _ = tokio::time::timeout(std::time::Duration::from_secs(1), moved).await;
        }
    }

    /// Check a client request: the array serves, the range is whole blocks inside the
    /// volume.
    pub(crate) fn check_io(&self, offset: u64, len: u64) -> Result<Arc<State>> {
        if self.dp().closing.load(Ordering::Acquire) {
            return Err(Error::ShutDown);
        }
        if !offset.is_multiple_of(4096) || !len.is_multiple_of(4096) {
            return Err(Error::Invalid(
                format!("offset {offset} and length {len} must be multiples of 4096").into(),
            ));
        }
        self.end_of(offset, len)?;
        let st = self.dp().state.load_full();
        if let Some(why) = &st.failed {
            return Err(Error::Failed(why.clone().into()));
        }
        Ok(st)
    }

    /// Where a request of `len` bytes at `offset` ends, if inside the volume.
    fn end_of(&self, offset: u64, len: u64) -> Result<u64> {
        offset
            .checked_add(len)
            .filter(|&e| e <= self.dp().size)
            .ok_or_else(|| {
                Error::Invalid(
                    format!(
                        "range {offset}+{len} is beyond the end of the volume ({} bytes)",
                        self.dp().size
                    )
                    .into(),
                )
            })
    }

    /// Read `len` bytes at `offset`.
    pub async fn read(&self, offset: u64, len: usize) -> Result<AlignedBuf> {
        let (_pass, parts) = self.enter_parts(offset, len as u64, true).await;
        self.check_io(offset, len as u64)?;
        let out = AlignedBuf::for_overwrite(len).into_shared();
        for (a, b, v) in &parts {
            let piece = out.slice((a - offset) as usize..(b - offset) as usize);
            v.family.read(&v.dp, *a, &piece).await?;
        }
        drop(parts);
        Ok(out.try_unwrap().expect("read views released"))
    }

    /// Write `data` at `offset`; with `fua`, durable on every member before returning.
    pub async fn write(&self, offset: u64, data: AlignedBuf, fua: bool) -> Result<()> {
        let (_pass, parts) = self.enter_parts(offset, data.len() as u64, true).await;
        if let [(_, _, v)] = &parts[..] {
            return self.write_in(v, offset, data, fua).await;
        }
        // Across the boundary of a reshape: each layout its part.
        let fua = self.sync.fua(fua);
        self.check_io(offset, data.len() as u64)?;
        self.dp().check_writable()?;
        let data = data.into_shared();
        for (a, b, v) in &parts {
            let piece = data.slice((a - offset) as usize..(b - offset) as usize);
            self.write_shared(v, *a, &piece, fua, &[]).await?;
        }
        Ok(())
    }

    async fn write_in(&self, v: &Core, offset: u64, data: AlignedBuf, fua: bool) -> Result<()> {
        let fua = self.sync.fua(fua);
        self.check_io(offset, data.len() as u64)?;
        self.dp().check_writable()?;
        self.write_shared(v, offset, &data.into_shared(), fua, &[])
            .await
    }

    /// Write `data` at any byte `offset` (an NBD client that did not agree to the block
    /// size; zeroing part of a block). The 4 KiB blocks it covers only in part are read
    /// and merged inside the same stripe lock every write to them takes, so writes from
    /// any number of connections, to the same blocks at once, never lose each other's
    /// bytes. Aligned requests take the plain path.
    pub async fn write_bytes(&self, offset: u64, data: &[u8], fua: bool) -> Result<()> {
        let (a, b) = blocks_around(offset, data.len() as u64);
        let (_pass, v) = self.enter(a, b - a).await;
        self.write_bytes_in(&v, offset, data, fua).await
    }

    async fn write_bytes_in(&self, v: &Core, offset: u64, data: &[u8], fua: bool) -> Result<()> {
        let fua = self.sync.fua(fua);
        let len = data.len() as u64;
        if len == 0 {
            return Ok(());
        }
        let end = self.end_of(offset, len)?;
        let (start, stop) = (offset / BLOCK * BLOCK, end.div_ceil(BLOCK) * BLOCK);
        if (start, stop) == (offset, end) {
            return self
                .write_in(v, offset, AlignedBuf::from_slice(data), fua)
                .await;
        }
        self.check_io(start, stop - start)?;
        let mut buf = AlignedBuf::zeroed((stop - start) as usize);
        let at = (offset - start) as usize;
        buf[at..at + data.len()].copy_from_slice(data);
        // The blocks at either end that keep bytes of their own (one, if both ends lie in
        // the same block).
        let mut patches = Vec::new();
        let head_end = (start + BLOCK).min(end);
        if offset > start || head_end < start + BLOCK {
            patches.push(Patch {
                at: 0,
                new: at..(head_end - start) as usize,
            });
        }
        if end < stop && stop - BLOCK > start {
            patches.push(Patch {
                at: (stop - BLOCK - start) as usize,
                new: 0..(end - (stop - BLOCK)) as usize,
            });
        }
        let data = buf.into_shared();
        self.write_shared(v, start, &data, fua, &patches).await
    }

    /// Make `len` bytes at any byte `offset` read back as zeros: the blocks covered in
    /// part are merged as by [`Array::write_bytes`], whole blocks are zeroed as by
    /// [`Array::write_zeroes`] (with `punch`, deallocated where the members can).
    pub async fn write_zeroes_bytes(
        &self,
        offset: u64,
        len: u64,
        fua: bool,
        punch: bool,
    ) -> Result<()> {
        let (a, b) = blocks_around(offset, len);
        let (_pass, v) = self.enter(a, b - a).await;
        let v = &*v;
        let fua = self.sync.fua(fua);
        let end = self.end_of(offset, len)?;
        let (a0, a1) = (offset.div_ceil(BLOCK) * BLOCK, end / BLOCK * BLOCK);
        if a0 >= a1 {
            // No whole block inside: at most two partial ones.
            return self
                .write_bytes_in(v, offset, &vec![0u8; len as usize], fua)
                .await;
        }
        let head = async {
            match offset < a0 {
                true => {
                    self.write_bytes_in(v, offset, &vec![0u8; (a0 - offset) as usize], false)
                        .await
                }
                false => Ok(()),
            }
        };
        let tail = async {
            match a1 < end {
                true => {
                    self.write_bytes_in(v, a1, &vec![0u8; (end - a1) as usize], false)
                        .await
                }
                false => Ok(()),
            }
        };
        let middle = self.write_zeroes_in(v, a0, a1 - a0, false, punch);
        let (h, m, t) = futures::future::join3(head, middle, tail).await;
        h.and(m).and(t)?;
        if fua {
            self.dp().flush().await?;
        }
        Ok(())
    }

    /// A write of whole blocks through the family; `patches` are blocks covered in part.
    pub(crate) async fn write_shared(
        &self,
        v: &Core,
        offset: u64,
        data: &SharedBuf,
        fua: bool,
        patches: &[Patch],
    ) -> Result<()> {
        self.hold_lease().await?;
        v.family.write(&v.dp, offset, data, fua, patches).await
    }

    /// Make a range read back as zeros (NBD WRITE_ZEROES); `punch` also deallocates.
    pub async fn write_zeroes(&self, offset: u64, len: u64, fua: bool, punch: bool) -> Result<()> {
        let (_pass, parts) = self.enter_parts(offset, len, true).await;
        for (a, b, v) in &parts {
            self.write_zeroes_in(v, *a, b - a, fua, punch).await?;
        }
        Ok(())
    }

    async fn write_zeroes_in(
        &self,
        v: &Core,
        offset: u64,
        len: u64,
        fua: bool,
        punch: bool,
    ) -> Result<()> {
        let fua = self.sync.fua(fua);
        self.check_io(offset, len)?;
        self.dp().check_writable()?;
        self.hold_lease().await?;
        v.family.zero(&v.dp, offset, len, punch).await?;
        if fua {
            self.dp().flush().await?;
        }
        Ok(())
    }

    /// NBD TRIM: advisory. The whole stripes inside the range are zeroed with `punch` on
    /// every member (data and parity, so the stripe stays consistent; the checksums of
    /// zeros are set as for any zeroing): files have their blocks punched out, block
    /// devices get the kernel's write-zeroes that may unmap (`fallocate` PUNCH_HOLE on the
    /// device: zeros guaranteed, the SSD or thin volume gets its space back). Only when
    /// every member can zero without writing (see `BlockDev::zeroes_cheaply`): else a trim
    /// would cost a write of zeros, and it is left undone. Partial stripes are left as
    /// they are (writing their zeros through the normal path would cost that write too).
    pub async fn trim(&self, offset: u64, len: u64) -> Result<()> {
        let (_pass, v) = self.enter(offset, len).await;
        self.check_io(offset, len)?;
        self.dp().check_writable()?;
        if !self.members_zero_cheaply() {
            return Ok(());
        }
        // Only whole stripes: partial ones would cost a write for an advisory command.
        let sd = v.dp.geometry.stripe_data();
        let first = offset.div_ceil(sd) * sd;
        let last = (offset + len) / sd * sd;
        if first < last {
            self.write_zeroes_in(&v, first, last - first, false, true)
                .await?;
        }
        Ok(())
    }
}

/// The most of the volume one [`Array::allocation`] looks at: the answer covers a prefix of
/// a longer range (NBD clients ask again from where it ends).
pub const ALLOCATION_SPAN: u64 = 1 << 30;

impl Array {
    /// What the array knows of a range's allocation, for NBD's `base:allocation`:
    /// consecutive `(length, zero)` pieces from `offset`, covering all of the range or a
    /// prefix of it (at most [`ALLOCATION_SPAN`]). A piece marked zero reads back as zeros
    /// through every path a read can take: each member row that could serve it (the data's
    /// member; every copy of a mirror; every member of a parity stripe, parity included, so
    /// a reconstruction also gives zeros) is a hole of its member file (never written since
    /// create, trimmed, or zeroed), and those members are all in service. Anything else is
    /// reported as data: block-device and remote members (which cannot say), a member out
    /// of service or rebuilding, a reshape in progress, a member that fails to answer.
    /// Derived from the members each time, so nothing is kept that could go stale or be
    /// lost across a restart.
    pub async fn allocation(&self, offset: u64, len: u64) -> Result<Vec<(u64, bool)>> {
        let end = self.end_of(offset, len)?;
        if len == 0 {
            return Ok(Vec::new());
        }
        let (a, b) = blocks_around(offset, len.min(ALLOCATION_SPAN));
        let b = b.min(self.dp().size);
        let (_pass, v) = self.enter(a, b - a).await;
        self.check_io(a, b - a)?;
        let whole = (end.min(b) - offset, false);
        if self.reshape.load().is_some() {
            return Ok(vec![whole]);
        }
        let dp = &v.dp;
        let st = dp.state.load_full();
        let single = matches!(
            dp.geometry.scheme(),
            crate::layout::Scheme::Parity { m: 0, .. } | crate::layout::Scheme::Concat
        );
        // Each piece of the range with the member rows that must all be holes for it to
        // read as zeros (`None`: some cannot say).
        type Rows = Option<Vec<(usize, u64)>>;
        let mut pieces: Vec<(u64, Rows)> = Vec::new();
        // Per slot: its device and the member rows it spans.
        type Span = (Arc<dyn crate::dev::BlockDev>, u64, u64);
        let mut devs: Vec<Option<Span>> = vec![None; st.slots.len()];
        for p in dp.map.map(a, b - a) {
            let slots: Vec<usize> = match single {
                true => vec![p.slot],
                false => dp.map.group_slots(p.addr.group).collect(),
            };
            let mut rows = Some(Vec::with_capacity(slots.len()));
            for s in slots {
                let slot = &st.slots[s];
                let m = match (&slot.state, &slot.member) {
                    (crate::superblock::SlotState::Active, Some(m)) => m,
                    _ => {
                        rows = None;
                        break;
                    }
                };
                let at = dp.member_off(p.moff);
                let d = devs[s].get_or_insert_with(|| (m.dev.clone(), at, at));
                d.1 = d.1.min(at);
                d.2 = d.2.max(at + p.len);
                if let Some(r) = rows.as_mut() {
                    r.push((s, at));
                }
            }
            pieces.push((p.len, rows));
        }
        // One look per member at the rows it spans (lseek, off the runtime).
        let looked = tokio::task::spawn_blocking(move || {
            devs.into_iter()
                .map(|d| {
                    let (dev, lo, hi) = d?;
                    match dev.data_ranges(lo, hi - lo)? {
                        Ok(r) => Some(r),
                        Err(e) => {
                            tracing::debug!(member = %dev.name(), error = %e, "no allocation map");
                            None
                        }
                    }
                })
                .collect::<Vec<_>>()
        })
        .await
        .map_err(|e| Error::Invalid(format!("allocation lookup: {e}").into()))?;
        let mut out: Vec<(u64, bool)> = Vec::new();
        let mut push = |len: u64, zero: bool| match out.last_mut() {
            Some(last) if last.1 == zero => last.0 += len,
            _ if len > 0 => out.push((len, zero)),
            _ => {}
        };
        for (plen, rows) in pieces {
            let Some(rows) = rows else {
                push(plen, false);
                continue;
            };
            // The union of the rows' data, relative to the piece.
            let mut data: Vec<(u64, u64)> = Vec::new();
            let mut unknown = false;
            for (s, at) in rows {
                let Some(ranges) = &looked[s] else {
                    unknown = true;
                    break;
                };
                let i = ranges.partition_point(|r| r.1 <= at);
                for r in ranges[i..].iter().take_while(|r| r.0 < at + plen) {
                    data.push((r.0.max(at) - at, r.1.min(at + plen) - at));
                }
            }
            if unknown {
                push(plen, false);
                continue;
            }
            data.sort_unstable();
            let mut pos = 0;
            for (s, e) in data {
                if e <= pos {
                    continue;
                }
                if s > pos {
                    push(s - pos, true);
                }
                push(e - s.max(pos), false);
                pos = e;
            }
            push(plen - pos, true);
        }
        // From `offset` (inside the first block) to the range's end at most.
        let mut skip = offset - a;
        let mut left = end - offset;
        let mut clipped = Vec::with_capacity(out.len());
        for (len, zero) in out {
            let cut = len.min(skip);
            skip -= cut;
            let n = (len - cut).min(left);
            if n > 0 {
                clipped.push((n, zero));
                left -= n;
            }
        }
        Ok(clipped)
    }
}

impl Array {
    /// Is zeroing `[offset, offset + len)` faster than writing zeros there (NBD's fast
    /// zero)? Only where the members zero without writing (files: `fallocate`; block
    /// devices with write-zeroes) and, for
    /// parity, the range is mostly whole stripes (the partial ones at its ends are written
    /// with zeros through the normal path). Elsewhere the client writes zeros itself.
    pub fn zero_is_fast(&self, offset: u64, len: u64) -> bool {
        let dp = self.dp();
        if self.reshape.load().is_some() || len == 0 {
            return false;
        }
        if !self.members_zero_cheaply() {
            return false;
        }
        match dp.geometry.scheme() {
            crate::layout::Scheme::Parity { m, .. } if m > 0 => {
                let sd = dp.geometry.stripe_data();
                let whole = ((offset + len) / sd).saturating_sub(offset.div_ceil(sd)) * sd;
                whole >= len / 2
            }
            _ => true,
        }
    }
}

impl Array {
    /// Can every member the array writes zero a range without writing zeros?
    fn members_zero_cheaply(&self) -> bool {
        let st = self.dp().state.load_full();
        st.live_members().iter().all(|m| m.dev.zeroes_cheaply())
    }
}

/// The whole blocks around a byte range.
fn blocks_around(offset: u64, len: u64) -> (u64, u64) {
    let end = offset.saturating_add(len);
    (offset / BLOCK * BLOCK, end.div_ceil(BLOCK) * BLOCK)
}
