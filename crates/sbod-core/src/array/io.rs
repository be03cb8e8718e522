//! The client's requests (NBD's READ, WRITE, WRITE_ZEROES, TRIM, FLUSH): checked, then
//! handed to the array's RAID family. Byte-granular writes are merged here into whole
//! blocks under the stripe lock the family takes.

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
            let (pos, wend) = (
                r.pos.load(Ordering::Acquire),
                r.wend.load(Ordering::Acquire),
            );
            // Closing or failed: the request is refused as ever (`check_io`).
            let refused = self.dp().closing.load(Ordering::Acquire)
                || self.dp().state.load().failed.is_some();
            if end <= pos || refused {
                return (pass, vec![(offset, end, View::Cur(self.core.load()))]);
            }
            if offset >= wend.max(pos) {
                return (pass, vec![(offset, end, View::Old(r.old.clone()))]);
            }
            if split && wend <= pos && offset < pos {
                return (
                    pass,
                    vec![
                        (offset, pos, View::Cur(self.core.load())),
                        (pos, end, View::Old(r.old.clone())),
                    ],
                );
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

    /// NBD TRIM: advisory. Files have their blocks punched out (they read back as zeros on
    /// every member, so parity stays consistent); block devices are left alone, since
    /// discard on them does not promise zeros.
    pub async fn trim(&self, offset: u64, len: u64) -> Result<()> {
        let (_pass, v) = self.enter(offset, len).await;
        self.check_io(offset, len)?;
        self.dp().check_writable()?;
        let st = self.dp().state.load_full();
        let all_files = st.live_members().iter().all(|m| m.is_file);
        if !all_files {
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

/// The whole blocks around a byte range.
fn blocks_around(offset: u64, len: u64) -> (u64, u64) {
    let end = offset.saturating_add(len);
    (offset / BLOCK * BLOCK, end.div_ceil(BLOCK) * BLOCK)
}
