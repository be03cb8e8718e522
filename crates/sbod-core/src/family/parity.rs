//! raid5, raid6 and ec:K+M: `k` data chunks and `m` parity chunks per stripe, one code
//! path for every k+m (the codec computes XOR, md's P+Q, or Cauchy Reed-Solomon).
//!
//! A write is planned per stripe ([`super::plan`]: full stripe, read-modify-write,
//! reconstruct-write or degraded) and executed here, inside the write-intent bitmap and
//! the stripe lock. A read of a missing or unreadable chunk reconstructs it from the rest
//! of its stripe under the lock, and rewrites it on a member that failed to read it.

mod coalesce;

use super::plan::{Plan, Shape, Strategy};
use super::{CheckMode, Family, Judgement, Patch, BLOCK};
use crate::buf::{AlignedBuf, SharedBuf};
use crate::datapath::{all_done, slice_mut, slice_of, DataPath, Target};
use crate::dev::IoClass;
use crate::error::{Error, Result};
use crate::layout::Geometry;
use crate::member::{Member, State};
use crate::placement::{Extent, StripeAddr};
use coalesce::{Coalescer, Writing, COALESCE_MIN_WRITE};
use sbod_codec::Codec;
use std::sync::atomic::Ordering;
use std::sync::Arc;

pub(crate) struct Parity {
    codec: Arc<Codec>,
    k: usize,
    m: usize,
    /// Partial stripes waiting for the write that completes them (see [`coalesce`]).
    coalescer: Coalescer,
}

/// A piece of new data destined for one data chunk of a stripe.
#[derive(Clone)]
struct NewData {
    index: usize,
    chunk_off: u64,
    src: SharedBuf,
}

/// A stripe's shards read (and the missing ones rebuilt) for a row range.
pub(crate) struct Shards {
    /// Per shard (codec order): the rows, for every present or reconstructed shard.
    pub bufs: Vec<Option<SharedBuf>>,
    /// Shards that were missing or unreadable and have been reconstructed.
    pub stale: Vec<usize>,
    /// Shards whose member failed to read, with the error: healed once the caller has
    /// what they should hold ([`Parity::heal_shards`]), where a checksum mismatch is
    /// judged (a damaged tag, or wrong data), or given up ([`Parity::unhealed`]).
    pub failed: Vec<(usize, Arc<Member>, std::io::Error)>,
}

/// The codec failed on buffers the engine sized: a fault of the engine, never of the
/// caller's request (clients get EIO, not EINVAL).
fn codec_err(e: sbod_codec::CodecError) -> Error {
    Error::Codec(e.to_string())
}

impl Parity {
    pub fn new(geometry: &Geometry) -> Result<Parity> {
        let scheme = geometry
            .codec_scheme()
            .expect("a parity layout has a codec scheme");
        let codec = Codec::new(scheme).map_err(|e| Error::Invalid(e.to_string().into()))?;
        Ok(Parity {
            k: codec.k(),
            m: codec.m(),
            codec: Arc::new(codec),
            coalescer: Coalescer::new(),
        })
    }

    async fn read_piece(&self, dp: &DataPath, p: Extent, dst: SharedBuf) -> Result<()> {
        let st = dp.state.load_full();
        let mut bad = None;
        if let Some(m) = st.slots[p.slot].readable(p.moff + p.len) {
            match dp.mread(m, p.moff, dst.clone(), IoClass::Foreground).await {
                Ok(()) => return Ok(()),
                Err(e) => {
                    dp.note_read_error_to_heal(m, &e).await;
                    bad = Some((m.clone(), e));
                }
            }
        }
        let _lock = dp.locks.lock(p.addr.group, p.addr.stripe).await;
        self.reconstruct_locked(dp, p, dst, bad).await
    }

    /// Reconstruct one piece of a data chunk from the rest of its stripe, with the stripe
    /// lock held. With `repair` (the member whose read failed, and how), heal it with the
    /// result (see `DataPath::heal`: a damaged tag is told from wrong data there).
    async fn reconstruct_locked(
        &self,
        dp: &DataPath,
        p: Extent,
        dst: SharedBuf,
        repair: Option<(Arc<Member>, std::io::Error)>,
    ) -> Result<()> {
        let r = self.reconstruct_inner(dp, p, &dst, repair.as_ref()).await;
        match (r, repair) {
            (Ok(out), Some((m, e))) => {
                dp.heal(&m, p.moff, out, IoClass::Foreground, &e).await;
                Ok(())
            }
            (Ok(_), None) => Ok(()),
            (Err(x), repair) => {
                if let Some((m, e)) = repair {
                    dp.unhealed(&m, &e).await;
                }
                Err(x)
            }
        }
    }

    /// `reconstruct_locked`'s rebuild: `dst` filled, and the rebuilt piece returned.
    async fn reconstruct_inner(
        &self,
        dp: &DataPath,
        p: Extent,
        dst: &SharedBuf,
        repair: Option<&(Arc<Member>, std::io::Error)>,
    ) -> Result<SharedBuf> {
        dp.failed()?;
        let st = dp.state.load_full();
        // Beyond the initial resync's progress, parity is only known to match the data in
        // rows that were written since creation: writes there always compute parity from
        // the whole row (reconstruct-write, see `plan`), never from old parity. So every
        // byte a client wrote reconstructs exactly; a never-written row reads as whatever
        // the members held before creation (zeros on members sbod created), as md does
        // after an interrupted initial sync.
        let shards = self
            .read_shards(
                dp,
                &st,
                p.addr,
                p.chunk_off,
                p.len,
                &[p.index],
                IoClass::Foreground,
                repair.map(|(m, _)| m),
            )
            .await?;
        let out = shards.bufs[p.index].as_ref().expect("reconstructed");
        if let Some((m, _)) = repair {
            // With checksums: only a rebuild that matches them (or shows them wrong).
            if let Err(x) = dp.tags_vouch(m, p.moff, slice_of(out), slice_of(dst)).await {
                self.unhealed(dp, &shards).await;
                return Err(x);
            }
        }
        slice_mut(dst).copy_from_slice(slice_of(out));
        let fix = AlignedBuf::from_slice(slice_of(out)).into_shared();
        let base = dp.map.stripe_offset(p.addr.stripe);
        self.heal_shards(dp, base, p.chunk_off, &shards, IoClass::Foreground)
            .await;
        Ok(fix)
    }

    /// Heal the members whose reads failed in a gather (`g.failed`, rows `[off, ...)` of
    /// the stripe at member offset `base`) from what they should hold: a data shard as
    /// gathered (rebuilt), a parity shard encoded from the data. With the stripe locked.
    pub(crate) async fn heal_shards(
        &self,
        dp: &DataPath,
        base: u64,
        off: u64,
        g: &Shards,
        class: IoClass,
    ) {
        if g.failed.is_empty() {
            return;
        }
        let len = g.bufs.iter().flatten().next().map_or(0, |b| b.len());
        let parity: Option<Vec<SharedBuf>> = match g.failed.iter().any(|(s, _, _)| *s >= self.k) {
            true => {
                let data: Option<Vec<SharedBuf>> = g.bufs[..self.k].iter().cloned().collect();
                let par: Vec<SharedBuf> = (0..self.m)
                    .map(|_| AlignedBuf::for_overwrite(len).into_shared())
                    .collect();
                data.and_then(|d| self.encode(&d, &par).ok()).map(|_| par)
            }
            false => None,
        };
        for (s, m, e) in &g.failed {
            let want = match *s < self.k {
                true => g.bufs[*s].clone(),
                false => parity.as_ref().map(|p| p[*s - self.k].clone()),
            };
            match want {
                Some(b) => {
                    let b = AlignedBuf::from_slice(slice_of(&b)).into_shared();
                    dp.heal(m, base + off, b, class, e).await;
                }
                None => dp.unhealed(m, e).await,
            }
        }
    }

    /// The failed reads of a gather whose result is not used: mismatches count as
    /// checksum errors, as nothing judged them.
    pub(crate) async fn unhealed(&self, dp: &DataPath, g: &Shards) {
        for (_, m, e) in &g.failed {
            dp.unhealed(m, e).await;
        }
    }

    /// The pieces of one stripe with a member out of service: the rows they span are
    /// read once under the stripe lock (each surviving chunk read once), rebuilt, and
    /// copied out. A data chunk that failed to read is rewritten on its member.
    async fn read_degraded(
        &self,
        dp: &DataPath,
        addr: StripeAddr,
        pieces: Vec<Extent>,
        out: &SharedBuf,
    ) -> Result<()> {
        let _lock = dp.locks.lock(addr.group, addr.stripe).await;
        dp.failed()?;
        let st = dp.state.load_full();
        let r0 = pieces.iter().map(|p| p.chunk_off).min().expect("pieces");
        let r1 = pieces
            .iter()
            .map(|p| p.chunk_off + p.len)
            .max()
            .expect("pieces");
        let base = dp.map.stripe_offset(addr.stripe);
        let want: Vec<usize> = pieces.iter().map(|p| p.index).collect();
        let g = self
            .read_shards(dp, &st, addr, r0, r1 - r0, &want, IoClass::Foreground, None)
            .await?;
        // Data chunks rebuilt although their member is in service: it failed to read.
        // With checksums, each must match that member's tags before it is returned or
        // written back; only where it does not are the member's own bytes read, to tell
        // a damaged tag (they equal the rebuild) from a rebuild that is not the data.
        let fixes: Vec<(&Arc<Member>, &SharedBuf)> = g
            .stale
            .iter()
            .filter(|&&s| s < self.k)
            .filter_map(|&s| {
                let m = st.slots[dp.map.slot(addr, s)].readable(base + r1)?;
                Some((m, g.bufs[s].as_ref().expect("stale")))
            })
            .collect();
        for &(m, rebuilt) in &fixes {
            if dp
                .tags_vouch(m, base + r0, slice_of(rebuilt), &[])
                .await
                .is_err()
            {
                let raw = AlignedBuf::for_overwrite((r1 - r0) as usize).into_shared();
                let as_read = match dp
                    .mread_raw(m, base + r0, raw.clone(), IoClass::Foreground)
                    .await
                {
                    Ok(()) => slice_of(&raw),
                    Err(_) => &[][..],
                };
                if let Err(x) = dp
                    .tags_vouch(m, base + r0, slice_of(rebuilt), as_read)
                    .await
                {
                    self.unhealed(dp, &g).await;
                    return Err(x);
                }
            }
        }
        for p in &pieces {
            let src = g.bufs[p.index].as_ref().expect("read or rebuilt");
            let at = (p.chunk_off - r0) as usize;
            let dst = out.slice(p.buf_off as usize..(p.buf_off + p.len) as usize);
            slice_mut(&dst).copy_from_slice(&slice_of(src)[at..at + p.len as usize]);
        }
        // Members whose reads failed: healed (a damaged tag rewritten, wrong data
        // rewritten and counted).
        self.heal_shards(dp, base, r0, &g, IoClass::Foreground)
            .await;
        Ok(())
    }

    fn encode(&self, rows: &[SharedBuf], parity: &[SharedBuf]) -> Result<()> {
        let dr: Vec<&[u8]> = rows.iter().map(slice_of).collect();
        let mut p: Vec<&mut [u8]> = parity.iter().map(slice_mut).collect();
        self.codec.encode(&dr, &mut p).map_err(codec_err)
    }

    /// [`Parity::encode`], and the crc32c of every 4 KiB block of each data and parity
    /// shard (codec order), taken in the same pass: the parity of one block row, then the
    /// sums of that row's blocks while they are in the core's cache (the checksums of a
    /// full-stripe write otherwise read the stripe again from memory, the parity twice
    /// as the codec streams it past the cache). Rows are whole blocks (the caller checks).
    fn encode_summed(&self, rows: &[SharedBuf], parity: &[SharedBuf]) -> Result<Vec<Arc<[u32]>>> {
        let dr: Vec<&[u8]> = rows.iter().map(slice_of).collect();
        let mut p: Vec<&mut [u8]> = parity.iter().map(slice_mut).collect();
        let blocks = dr.first().map_or(0, |d| d.len()) / BLOCK as usize;
        let mut sums: Vec<Vec<u32>> = (0..rows.len() + parity.len())
            .map(|_| Vec::with_capacity(blocks))
            .collect();
        self.codec
            .encode_slices(&dr, &mut p, BLOCK as usize, |_, ds, ps| {
                for (s, b) in sums.iter_mut().zip(ds.iter().chain(ps)) {
                    s.push(crate::integrity::crc(b));
                }
            })
            .map_err(codec_err)?;
        Ok(sums.into_iter().map(Arc::from).collect())
    }

    /// Write new data into one stripe: plan, then execute.
    async fn write_stripe(
        &self,
        dp: &DataPath,
        addr: StripeAddr,
        new: Vec<NewData>,
        fua: bool,
        patches: Vec<(usize, Patch)>,
    ) -> Result<()> {
        let base = dp.map.stripe_offset(addr.stripe);
        let _region = dp.enter_region(base).await?;
        let _lock = dp.locks.lock(addr.group, addr.stripe).await;
        for (i, p) in &patches {
            // The block as the volume holds it now: from its member, else rebuilt.
            let d = &new[*i];
            let piece = Extent {
                addr,
                index: d.index,
                chunk_off: d.chunk_off + p.at as u64,
                len: BLOCK,
                buf_off: 0,
                slot: dp.map.slot(addr, d.index),
                moff: base + d.chunk_off + p.at as u64,
            };
            let old = AlignedBuf::for_overwrite(BLOCK as usize).into_shared();
            let mut bad = None;
            let st = dp.state.load_full();
            if let Some(m) = st.slots[piece.slot].readable(piece.moff + BLOCK) {
                match dp
                    .mread(m, piece.moff, old.clone(), IoClass::Foreground)
                    .await
                {
                    Ok(()) => {
                        p.merge(&d.src, &old);
                        continue;
                    }
                    Err(e) => {
                        dp.note_read_error_to_heal(m, &e).await;
                        bad = Some((m.clone(), e));
                    }
                }
            }
            self.reconstruct_locked(dp, piece, old.clone(), bad).await?;
            p.merge(&d.src, &old);
        }
        dp.failed()?;
        let st = dp.state.load_full();
        let (k, m) = (self.k, self.m);
        let mut by_index: Vec<Option<&NewData>> = vec![None; k];
        for d in &new {
            by_index[d.index] = Some(d);
        }
        let r1 = new
            .iter()
            .map(|d| d.chunk_off + d.src.len() as u64)
            .max()
            .expect("pieces");
        let slot_of = |shard: usize| dp.map.slot(addr, shard);
        let readable = |shard: usize| st.slots[slot_of(shard)].readable(base + r1).cloned();
        let shape = Shape {
            k,
            m,
            chunk: dp.geometry.chunk as u64,
            written: by_index
                .iter()
                .map(|d| d.map(|d| d.chunk_off..d.chunk_off + d.src.len() as u64))
                .collect(),
            readable: (0..k + m).map(|s| readable(s).is_some()).collect(),
            synced: dp.synced(addr),
            unsynced: dp.is_unsynced(addr),
            may_run_out: (0..k + m).any(|s| {
                st.slots[slot_of(s)]
                    .write_targets()
                    .any(|x| x.is_file && x.dev.may_run_out())
            }),
        };
        let plan = shape.plan();
        self.execute(dp, &st, addr, &plan, &shape, &by_index, &new, fua)
            .await
    }

    /// Carry out a stripe write's plan. Reads that fail fall back to the degraded plan.
    #[allow(clippy::too_many_arguments)]
    async fn execute(
        &self,
        dp: &DataPath,
        st: &State,
        addr: StripeAddr,
        plan: &Plan,
        shape: &Shape,
        by_index: &[Option<&NewData>],
        new: &[NewData],
        fua: bool,
    ) -> Result<()> {
        let (k, m) = (self.k, self.m);
        let chunk = dp.geometry.chunk as u64;
        let base = dp.map.stripe_offset(addr.stripe);
        let r0 = plan.rows.start;
        let rl = (plan.rows.end - r0) as usize;
        let slot_of = |shard: usize| dp.map.slot(addr, shard);
        let readable = |shard: usize| {
            st.slots[slot_of(shard)]
                .readable(base + plan.rows.end)
                .cloned()
        };
        let parity: Vec<SharedBuf> = (0..m)
            .map(|_| AlignedBuf::for_overwrite(rl).into_shared())
            .collect();
        let mut from_data = plan.from_data;
        // The crc32c of every block of each shard written, where the encode took them.
        let mut sums: Option<Vec<Arc<[u32]>>> = None;
        let done = match plan.strategy {
            Strategy::Full => {
                let data: Vec<SharedBuf> = by_index
                    .iter()
                    .map(|d| d.expect("full").src.clone())
                    .collect();
                let aligned = (r0.is_multiple_of(BLOCK) && (rl as u64).is_multiple_of(BLOCK))
                    && new.iter().all(|d| d.chunk_off == r0 && d.src.len() == rl);
                if dp.integrity.is_some() && aligned {
                    sums = Some(self.encode_summed(&data, &parity)?);
                } else {
                    self.encode(&data, &parity)?;
                }
                true
            }
            Strategy::ReadModifyWrite => {
                self.rmw(dp, base, plan, by_index, &parity, &readable)
                    .await?
            }
            Strategy::ReconstructWrite => {
                self.rcw(dp, base, plan, by_index, &parity, &readable)
                    .await?
            }
            Strategy::Degraded => false,
        };
        // What to write back should the write reach some members and not others for
        // want of space (the degraded plan below): the rows as they were.
        let mut undo: Option<Vec<Target>> = None;
        let mut targets = Vec::new();
        // `buf` to every member that takes writes for `shard`, at `off` in the chunk.
        let sum_of = |shard: usize| sums.as_ref().map(|s| s[shard].clone());
        let push = |out: &mut Vec<Target>, shard: usize, off: u64, buf: &SharedBuf| {
            let slot = slot_of(shard);
            for mem in st.slots[slot].write_targets() {
                out.push(Target {
                    slot,
                    member: mem.clone(),
                    offset: base + off,
                    buf: buf.clone(),
                    crcs: sum_of(shard),
                });
            }
        };
        if done {
            for d in new {
                push(&mut targets, d.index, d.chunk_off, &d.src);
            }
        } else {
            // Degraded (or a read failed): rebuild the rows from what survives.
            let want: Vec<usize> = (0..k).filter(|&i| readable(i).is_none()).collect();
            let shards = self
                .read_shards(
                    dp,
                    st,
                    addr,
                    r0,
                    rl as u64,
                    &want,
                    IoClass::Foreground,
                    None,
                )
                .await?;
            // Members whose reads failed: judged and healed from the rows as they are
            // (before the new data goes into the gathered buffers); the write follows.
            self.heal_shards(dp, base, r0, &shards, IoClass::Foreground)
                .await;
            // Whole rows of every data chunk we touch or that was stale, and parity.
            let rewritten = |i: usize| by_index[i].is_some() || shards.stale.contains(&i);
            // A stripe with a member missing is only consistent while every write to it
            // reaches every member: a write refused for space on one member would leave
            // the missing member's data impossible to rebuild. So where a member can
            // refuse for space (a file with holes, see `BlockDev::may_run_out`), keep the
            // old rows, and write them back if that happens. Members that cannot (block
            // devices, files with no holes) skip the copy and its encode.
            if shape.may_run_out {
                let old_rows: Vec<SharedBuf> = (0..k)
                    .map(|i| {
                        let b = shards.bufs[i].as_ref().expect("data read");
                        if by_index[i].is_some() {
                            AlignedBuf::from_slice(slice_of(b)).into_shared()
                        } else {
                            b.clone()
                        }
                    })
                    .collect();
                let old_parity: Vec<SharedBuf> = (0..m)
                    .map(|_| AlignedBuf::for_overwrite(rl).into_shared())
                    .collect();
                self.encode(&old_rows, &old_parity)?;
                let mut back = Vec::new();
                for (i, b) in old_rows.iter().enumerate().filter(|(i, _)| rewritten(*i)) {
                    push(&mut back, i, r0, b);
                }
                for (r, p) in old_parity.iter().enumerate() {
                    push(&mut back, k + r, r0, p);
                }
                undo = Some(back);
            }
            let data: Vec<SharedBuf> = (0..k)
                .map(|i| {
                    let b = shards.bufs[i].as_ref().expect("data read").clone();
                    if let Some(d) = by_index[i] {
                        let off = (d.chunk_off - r0) as usize;
                        slice_mut(&b)[off..off + d.src.len()].copy_from_slice(slice_of(&d.src));
                    }
                    b
                })
                .collect();
            from_data = true;
            self.encode(&data, &parity)?;
            for (i, b) in data.iter().enumerate().filter(|(i, _)| rewritten(*i)) {
                push(&mut targets, i, r0, b);
            }
        }
        for (r, p) in parity.iter().enumerate() {
            push(&mut targets, k + r, r0, p);
        }
        let key = Some(addr);
        let r = match undo {
            None => {
                dp.write_targets(targets, fua, IoClass::Foreground, key)
                    .await
            }
            Some(back) => {
                let first = dp.write_each(targets, fua, IoClass::Foreground).await;
                match dp.write_outcome(&first, None) {
                    Err(e @ Error::NoSpace(_)) => {
                        // Put the rows back as they were. A member out of space took a
                        // prefix of its write (a file system lands what fits, in order),
                        // whose blocks are allocated now: rewriting them needs no space,
                        // and where its rewrite is refused further on nothing had
                        // changed. Only a refusal from a member whose write had landed
                        // whole leaves the stripe inconsistent.
                        let mut again = dp.write_each(back, fua, IoClass::Foreground).await;
                        again
                            .full
                            .retain(|m| !first.full.iter().any(|f| Arc::ptr_eq(f, m)));
                        if again.full.is_empty() {
                            again.region = None;
                        }
                        dp.write_outcome(&again, key)?;
                        Err(e)
                    }
                    other => other,
                }
            }
        };
        if r.is_ok() && from_data && r0 == 0 && rl as u64 == chunk {
            debug_assert!(shape.whole_chunks());
            // Every row's parity now follows from the data: consistent again.
            dp.mark_synced(addr);
        }
        r
    }

    /// Read-modify-write: parity += coef * (old ^ new), reading what the plan says. False
    /// if a read failed.
    async fn rmw(
        &self,
        dp: &DataPath,
        base: u64,
        plan: &Plan,
        by_index: &[Option<&NewData>],
        parity: &[SharedBuf],
        readable: &(dyn Fn(usize) -> Option<Arc<Member>> + Sync),
    ) -> Result<bool> {
        let k = self.k;
        let r0 = plan.rows.start;
        // Old data under each new piece into a buffer of its own; old parity rows into
        // the parity buffers, which the update then turns into the new parity.
        let bufs: Vec<SharedBuf> = plan
            .reads
            .iter()
            .map(|(s, r)| match *s >= k {
                true => parity[s - k].clone(),
                false => AlignedBuf::for_overwrite((r.end - r.start) as usize).into_shared(),
            })
            .collect();
        let reads = plan
            .reads
            .iter()
            .zip(&bufs)
            .map(|((s, r), b)| (readable(*s).expect("planned"), base + r.start, b.clone()))
            .collect();
        if !dp.read_all(reads, IoClass::Foreground).await {
            return Ok(false);
        }
        for ((s, r), old) in plan.reads.iter().zip(&bufs).filter(|((s, _), _)| *s < k) {
            let d = by_index[*s].expect("planned on a written chunk");
            let off = (r.start - r0) as usize;
            let n = d.src.len();
            let mut p: Vec<&mut [u8]> = parity
                .iter()
                .map(|p| &mut slice_mut(p)[off..off + n])
                .collect();
            self.codec
                .update(*s, slice_of(old), slice_of(&d.src), &mut p)
                .map_err(codec_err)?;
        }
        Ok(true)
    }

    /// Reconstruct-write: the new data and the untouched rows the plan reads, encoded.
    /// False if a read failed.
    async fn rcw(
        &self,
        dp: &DataPath,
        base: u64,
        plan: &Plan,
        by_index: &[Option<&NewData>],
        parity: &[SharedBuf],
        readable: &(dyn Fn(usize) -> Option<Arc<Member>> + Sync),
    ) -> Result<bool> {
        let r0 = plan.rows.start;
        let rl = (plan.rows.end - r0) as usize;
        let bufs: Vec<SharedBuf> = (0..self.k)
            .map(|_| AlignedBuf::for_overwrite(rl).into_shared())
            .collect();
        for (b, d) in bufs.iter().zip(by_index) {
            if let Some(d) = d {
                let off = (d.chunk_off - r0) as usize;
                slice_mut(b)[off..off + d.src.len()].copy_from_slice(slice_of(&d.src));
            }
        }
        let reads = plan
            .reads
            .iter()
            .map(|(s, r)| {
                let at = (r.start - r0) as usize..(r.end - r0) as usize;
                (
                    readable(*s).expect("planned"),
                    base + r.start,
                    bufs[*s].slice(at),
                )
            })
            .collect();
        if !dp.read_all(reads, IoClass::Foreground).await {
            return Ok(false);
        }
        self.encode(&bufs, parity)?;
        Ok(true)
    }

    /// Read enough shards of rows `[off, off+len)` of a stripe to rebuild the shards in
    /// `want` (plus every data shard), reconstructing what could not be read. Unreadable
    /// members are noted; errors only if fewer than k shards survive. `avoid`: the member
    /// whose failed read the caller is reconstructing (never read again: each bad block is
    /// counted once, and a rebuild is never made from what failed).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn read_shards(
        &self,
        dp: &DataPath,
        st: &State,
        addr: StripeAddr,
        off: u64,
        len: u64,
        want: &[usize],
        class: IoClass,
        avoid: Option<&Arc<Member>>,
    ) -> Result<Shards> {
        self.read_shards_pre(dp, st, addr, off, len, want, class, avoid, &|_| None)
            .await
    }

    /// [`Parity::read_shards`], taking a shard's bytes from `pre` (by slot: the bytes
    /// `[off, off + len)` of the stripe's chunk on that member, read and verified by the
    /// caller with the stripe locked) where it has them, instead of reading them.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn read_shards_pre(
        &self,
        dp: &DataPath,
        st: &State,
        addr: StripeAddr,
        off: u64,
        len: u64,
        want: &[usize],
        class: IoClass,
        avoid: Option<&Arc<Member>>,
        pre: &(dyn Fn(usize) -> Option<SharedBuf> + Sync),
    ) -> Result<Shards> {
        let (k, m) = (self.k, self.m);
        let n = k + m;
        let base = dp.map.stripe_offset(addr.stripe);
        let mut bufs: Vec<Option<SharedBuf>> = vec![None; n];
        let mut tried = vec![false; n];
        let mut got = 0usize;
        let mut failed: Vec<(usize, Arc<Member>, std::io::Error)> = Vec::new();
        loop {
            // Pick untried readable shards, data first, until we could have k.
            let mut batch = Vec::new();
            for s in 0..n {
                if got + batch.len() >= k {
                    break;
                }
                if tried[s] {
                    continue;
                }
                tried[s] = true;
                let slot = dp.map.slot(addr, s);
                let readable = st.slots[slot]
                    .readable(base + off + len)
                    .filter(|m| avoid.is_none_or(|a| !Arc::ptr_eq(a, m)));
                if let Some(mem) = readable {
                    if let Some(b) = pre(slot).filter(|b| b.len() as u64 == len) {
                        bufs[s] = Some(b);
                        got += 1;
                        continue;
                    }
                    batch.push((
                        s,
                        mem.clone(),
                        AlignedBuf::for_overwrite(len as usize).into_shared(),
                    ));
                }
            }
            if batch.is_empty() {
                break;
            }
            let futs = batch.into_iter().map(|(s, mem, b)| async move {
                let r = dp.mread(&mem, base + off, b.clone(), class).await;
                (s, mem, b, r)
            });
            for (s, mem, b, r) in futures::future::join_all(futs).await {
                match r {
                    Ok(()) => {
                        bufs[s] = Some(b);
                        got += 1;
                    }
                    Err(e) => {
                        dp.note_read_error_to_heal(&mem, &e).await;
                        failed.push((s, mem, e));
                    }
                }
            }
            if got >= k {
                break;
            }
        }
        if got < k {
            for (_, m, e) in &failed {
                dp.unhealed(m, e).await;
            }
            return Err(Error::Failed(
                format!(
                    "group {} stripe {}: only {got} of {n} chunks readable, {k} needed",
                    addr.group, addr.stripe
                )
                .into(),
            ));
        }
        let present: Vec<bool> = bufs.iter().map(|b| b.is_some()).collect();
        let mut wanted = vec![false; n];
        for s in 0..k {
            wanted[s] = !present[s];
        }
        for &s in want {
            if !present[s] {
                wanted[s] = true;
            }
        }
        let stale: Vec<usize> = (0..n).filter(|&s| wanted[s]).collect();
        // Parity re-encoded from every data chunk is right whatever the stripe held; data
        // rebuilt from parity is only right where parity matched.
        if stale.iter().any(|&s| s < k) && dp.is_unsynced(addr) {
            // Parity here may not match the data (a write reached some members only):
            // what it would rebuild is not known to be the data. An error, never guesses.
            for (_, m, e) in &failed {
                dp.unhealed(m, e).await;
            }
            return Err(DataPath::unsynced_error(addr.group, addr.stripe));
        }
        if !stale.is_empty() {
            let work: Vec<SharedBuf> = (0..n)
                .map(|s| {
                    bufs[s]
                        .clone()
                        .unwrap_or_else(|| AlignedBuf::for_overwrite(len as usize).into_shared())
                })
                .collect();
            {
                let mut refs: Vec<&mut [u8]> = work.iter().map(slice_mut).collect();
                self.codec
                    .reconstruct_some(&mut refs, &present, &wanted)
                    .map_err(codec_err)?;
            }
            for s in &stale {
                bufs[*s] = Some(work[*s].clone());
            }
        }
        Ok(Shards {
            bufs,
            stale,
            failed,
        })
    }

    /// [`Family::recover`] with shards taken from `pre` where it has them (see
    /// [`Parity::read_shards_pre`]): a declustered transition's runs read ahead.
    pub(crate) async fn recover_pre(
        &self,
        dp: &DataPath,
        addr: StripeAddr,
        len: u64,
        targets: &[(usize, Arc<Member>)],
        pre: &(dyn Fn(usize) -> Option<SharedBuf> + Sync),
    ) -> Result<Vec<SharedBuf>> {
        let st = dp.state.load_full();
        let want: Vec<usize> = targets
            .iter()
            .map(|(slot, _)| dp.map.shard_at(addr.stripe, *slot))
            .collect();
        let g = self
            .read_shards_pre(dp, &st, addr, 0, len, &want, IoClass::Background, None, pre)
            .await?;
        let base = dp.map.stripe_offset(addr.stripe);
        self.heal_shards(dp, base, 0, &g, IoClass::Background).await;
        Ok(want
            .iter()
            .map(|&s| g.bufs[s].clone().expect("read or rebuilt"))
            .collect())
    }

    /// Whole stripes of zeros: every member's chunk is zeroed (parity of zeros is zeros).
    async fn zero_stripe(&self, dp: &DataPath, addr: StripeAddr, punch: bool) -> Result<()> {
        let chunk = dp.geometry.chunk as u64;
        let base = dp.map.stripe_offset(addr.stripe);
        let _region = dp.enter_region(base).await?;
        let _lock = dp.locks.lock(addr.group, addr.stripe).await;
        let slots = dp.map.stripe_slots(addr);
        dp.zero_slots(&slots, base, chunk, punch, Some(addr)).await
    }

    async fn zero_by_writing(&self, dp: &DataPath, offset: u64, len: u64) -> Result<()> {
        let z = AlignedBuf::zeroed(len as usize).into_shared();
        self.write(dp, offset, &z, false, &[]).await
    }
}

impl Family for Parity {
    async fn read(&self, dp: &DataPath, offset: u64, out: &SharedBuf) -> Result<()> {
        // A stripe with a piece on a member out of service is read once, whole rows, and
        // rebuilt: reading its other pieces on their own as well would read those chunks
        // twice (DEVICE DOWN sequential reads).
        let st = dp.state.load_full();
        let mut direct = Vec::new();
        let mut degraded: Vec<(StripeAddr, Vec<Extent>)> = Vec::new();
        let mut pieces = dp.map.map(offset, out.len() as u64).into_iter().peekable();
        while let Some(first) = pieces.next() {
            let mut stripe = vec![first];
            while let Some(p) = pieces.next_if(|p| p.addr == first.addr) {
                stripe.push(p);
            }
            let missing = stripe
                .iter()
                .any(|p| st.slots[p.slot].readable(p.moff + p.len).is_none());
            match missing && stripe.len() > 1 {
                true => degraded.push((first.addr, stripe)),
                false => direct.extend(stripe),
            }
        }
        let slice = |p: &Extent| out.slice(p.buf_off as usize..(p.buf_off + p.len) as usize);
        let one = futures::future::try_join_all(
            direct
                .into_iter()
                .map(|p| self.read_piece(dp, p, slice(&p))),
        );
        let whole = futures::future::try_join_all(
            degraded
                .into_iter()
                .map(|(addr, ps)| self.read_degraded(dp, addr, ps, out)),
        );
        futures::future::try_join(one, whole).await?;
        Ok(())
    }

    async fn write(
        &self,
        dp: &DataPath,
        offset: u64,
        data: &SharedBuf,
        fua: bool,
        patches: &[Patch],
    ) -> Result<()> {
        // Group pieces by stripe; each stripe is planned on its own.
        type Planned = (StripeAddr, Vec<NewData>, Vec<(usize, Patch)>);
        let mut stripes: Vec<Planned> = Vec::new();
        for p in dp.map.map(offset, data.len() as u64) {
            let nd = NewData {
                index: p.index,
                chunk_off: p.chunk_off,
                src: data.slice(p.buf_off as usize..(p.buf_off + p.len) as usize),
            };
            let mine = super::patches_within(patches, p.buf_off, p.len);
            match stripes.last_mut() {
                Some((a, v, pp)) if *a == p.addr => {
                    pp.extend(mine.into_iter().map(|x| (v.len(), x)));
                    v.push(nd);
                }
                _ => stripes.push((p.addr, vec![nd], mine.into_iter().map(|x| (0, x)).collect())),
            }
        }
        let g = &self.coalescer;
        g.writes.fetch_add(1, Ordering::Relaxed);
        let _writing = Writing(&g.writes);
        let chunk = dp.geometry.chunk as u64;
        // Small writes (random I/O) go their own way; larger ones' partial stripes without
        // partial blocks meet their neighbours (see [`coalesce`]). Blocks written in part
        // are merged under the stripe lock alone.
        let large = data.len() as u64 >= COALESCE_MIN_WRITE;
        let wait = large && g.worth_waiting(dp.queued_writes.load(Ordering::Relaxed));
        let started = std::time::Instant::now();
        let futs = stripes.into_iter().map(|(a, v, pp)| async move {
            let partial = v.len() < self.k || v.iter().any(|d| d.src.len() as u64 != chunk);
            if large && partial && pp.is_empty() {
                self.write_coalesced(dp, a, v, fua, wait).await
            } else {
                self.write_stripe(dp, a, v, fua, pp).await
            }
        });
        let r = all_done(futs).await;
        if large {
            g.took(started.elapsed());
        }
        r
    }

    async fn zero(&self, dp: &DataPath, offset: u64, len: u64, punch: bool) -> Result<()> {
        // Whole stripes are zeroed on every member; the partial ones at either end are
        // written with zeros.
        let sd = dp.geometry.stripe_data();
        let first_full = offset.div_ceil(sd) * sd;
        let last_full = (offset + len) / sd * sd;
        if first_full >= last_full {
            return self.zero_by_writing(dp, offset, len).await;
        }
        let head = async {
            match offset < first_full {
                true => self.zero_by_writing(dp, offset, first_full - offset).await,
                false => Ok(()),
            }
        };
        let tail = async {
            match last_full < offset + len {
                true => {
                    self.zero_by_writing(dp, last_full, offset + len - last_full)
                        .await
                }
                false => Ok(()),
            }
        };
        let whole = all_done(
            dp.map
                .map(first_full, last_full - first_full)
                .into_iter()
                .filter(|p| p.index == 0 && p.chunk_off == 0)
                .map(|p| self.zero_stripe(dp, p.addr, punch)),
        );
        let (h, w, t) = futures::future::join3(head, whole, tail).await;
        h.and(w).and(t)
    }

    /// Rebuilt from the rest of the stripe.
    async fn recover(
        &self,
        dp: &DataPath,
        addr: StripeAddr,
        len: u64,
        targets: &[(usize, Arc<Member>)],
    ) -> Result<Vec<SharedBuf>> {
        self.recover_pre(dp, addr, len, targets, &|_| None).await
    }

    /// Parity recomputed from the data and compared. Where a row differs, two or more
    /// parity chunks locate a single wrong chunk (blamed, and rebuilt in a repair);
    /// otherwise, as md does, the data is taken as the truth and parity rewritten. A
    /// resync (after a crash, or of a stripe a write left inconsistent) blames nobody.
    fn judge(
        &self,
        dp: &DataPath,
        addr: StripeAddr,
        bufs: &[SharedBuf],
        unreadable: &[usize],
        mode: CheckMode,
        _vouched: &[Vec<bool>],
    ) -> Result<Judgement> {
        let (k, m) = (self.k, self.m);
        let n = k + m;
        let t = addr.stripe;
        let chunk = dp.geometry.chunk as usize;
        let pos = |shard: usize| dp.map.pos_of(addr, shard);
        if mode == CheckMode::Resync && (0..k).any(|s| unreadable.contains(&pos(s))) {
            // Parity here may not match the data (the reason for the resync): a data chunk
            // that cannot be read cannot be rebuilt from it. The stripe stays held as
            // inconsistent; reads of that chunk fail rather than guess.
            return Ok(Judgement {
                skipped: true,
                ..Default::default()
            });
        }
        let mut out = Judgement::default();
        let shard_bufs: Vec<SharedBuf> = (0..n).map(|s| bufs[pos(s)].clone()).collect();
        let lost: Vec<usize> = (0..n).filter(|&s| unreadable.contains(&pos(s))).collect();
        if lost.len() > m {
            return Err(Error::Failed(
                format!(
                    "group {} stripe {t}: {} chunks unreadable",
                    addr.group,
                    lost.len()
                )
                .into(),
            ));
        }
        if !lost.is_empty() {
            // Rebuild unreadable chunks from the rest and rewrite them.
            let present: Vec<bool> = (0..n).map(|s| !lost.contains(&s)).collect();
            let mut refs: Vec<&mut [u8]> = shard_bufs.iter().map(slice_mut).collect();
            self.codec
                .reconstruct(&mut refs, &present)
                .map_err(codec_err)?;
            for &s in &lost {
                out.rewrite.push((pos(s), 0, shard_bufs[s].clone()));
            }
        }
        // Fast path: recompute parity for the whole chunk and compare.
        let fresh: Vec<SharedBuf> = (0..m)
            .map(|_| AlignedBuf::for_overwrite(chunk).into_shared())
            .collect();
        self.encode(&shard_bufs[..k], &fresh)?;
        let clean = (0..m).all(|r| slice_of(&fresh[r]) == slice_of(&shard_bufs[k + r]));
        if clean {
            return Ok(out);
        }
        let blk = BLOCK as usize;
        for row in (0..chunk).step_by(blk) {
            let row_clean = (0..m).all(|r| {
                slice_of(&fresh[r])[row..row + blk] == slice_of(&shard_bufs[k + r])[row..row + blk]
            });
            if row_clean {
                continue;
            }
            out.mismatched_blocks += 1;
            let rows: Vec<&[u8]> = (0..n)
                .map(|s| &slice_of(&shard_bufs[s])[row..row + blk])
                .collect();
            let verdict = if mode == CheckMode::Resync {
                sbod_codec::Verdict::Unlocatable
            } else {
                self.codec.locate(&rows).map_err(codec_err)?
            };
            match verdict {
                sbod_codec::Verdict::Clean => {}
                sbod_codec::Verdict::Corrupt(bad) => {
                    *out.blame.entry(pos(bad)).or_default() += 1;
                    if mode == CheckMode::Repair {
                        let mut work: Vec<Vec<u8>> = rows.iter().map(|r| r.to_vec()).collect();
                        let present: Vec<bool> = (0..n).map(|s| s != bad).collect();
                        let mut refs: Vec<&mut [u8]> =
                            work.iter_mut().map(|v| v.as_mut_slice()).collect();
                        self.codec
                            .reconstruct(&mut refs, &present)
                            .map_err(codec_err)?;
                        out.rewrite.push((
                            pos(bad),
                            row as u64,
                            AlignedBuf::from_slice(&work[bad]).into_shared(),
                        ));
                    }
                }
                sbod_codec::Verdict::Unlocatable => {
                    if mode != CheckMode::Check {
                        // As md does: data is the truth, parity is rewritten.
                        for r in 0..m {
                            let fix = AlignedBuf::from_slice(&slice_of(&fresh[r])[row..row + blk])
                                .into_shared();
                            out.rewrite.push((pos(k + r), row as u64, fix));
                        }
                    }
                }
            }
        }
        Ok(out)
    }

    fn heal_row(
        &self,
        dp: &DataPath,
        addr: StripeAddr,
        rows: &mut [Vec<u8>],
        lost: &[usize],
    ) -> Result<()> {
        let n = self.k + self.m;
        let pos = |shard: usize| dp.map.pos_of(addr, shard);
        let mut work: Vec<Vec<u8>> = (0..n).map(|s| std::mem::take(&mut rows[pos(s)])).collect();
        let present: Vec<bool> = (0..n).map(|s| !lost.contains(&pos(s))).collect();
        let mut refs: Vec<&mut [u8]> = work.iter_mut().map(|v| v.as_mut_slice()).collect();
        let r = self.codec.reconstruct(&mut refs, &present);
        for (s, v) in work.into_iter().enumerate() {
            rows[pos(s)] = v;
        }
        r.map_err(codec_err)
    }
}
