//! Stripe planning: which member I/Os a write to one parity stripe becomes. Pure: it looks
//! at the stripe's shape (which rows of which data chunks are new, which shards can be
//! read, whether parity is known to match) and decides; [`super::parity`] executes.
//!
//! - **Full**: every data chunk's rows are new: parity is computed from the new data
//!   alone, nothing is read.
//! - **Read-modify-write**: read the old data under the new pieces and the old parity
//!   rows, and fold the difference into parity. Only where parity is known to match the
//!   data (outside an initial resync's unsynced part): it builds on old parity.
//! - **Reconstruct-write**: read the rows of the data chunks the write does not cover and
//!   compute parity from whole rows. Never reads parity; the rows are consistent
//!   afterwards whatever they were before.
//! - **Degraded**: a data chunk is missing or unreadable: read what survives, rebuild the
//!   rows, merge the new data and encode again (and, where members can run out of space,
//!   keep the old rows to put back, see `parity`).
//!
//! Read-modify-write and reconstruct-write are chosen by whichever reads fewer bytes, as
//! md's raid5 does (rmw vs rcw).

use std::ops::Range;

/// What a stripe write looks like to the planner. Ranges are byte offsets within a chunk.
#[derive(Clone, Debug)]
pub(crate) struct Shape {
    pub k: usize,
    pub m: usize,
    pub chunk: u64,
    /// The new bytes of each data chunk (at most one range per chunk).
    pub written: Vec<Option<Range<u64>>>,
    /// Which shards (codec order: data `0..k`, parity `k..k+m`) can be read over the rows
    /// the write touches.
    pub readable: Vec<bool>,
    /// Parity is known to match the data here (outside the unsynced part of an initial
    /// resync).
    pub synced: bool,
    /// The stripe is held as inconsistent (a write ran out of space on part of it).
    pub unsynced: bool,
    /// A member that takes this stripe's writes can refuse them for space (a file).
    pub may_run_out: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Strategy {
    Full,
    ReadModifyWrite,
    ReconstructWrite,
    Degraded,
}

/// A planned stripe write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Plan {
    pub strategy: Strategy,
    /// The rows the write spans: parity is written over these.
    pub rows: Range<u64>,
    /// Member reads before parity can be computed: (shard, byte range within its chunk).
    /// Empty for `Full`; for `Degraded` the reads are chosen at run time from what
    /// answers (see `Parity::read_shards`).
    pub reads: Vec<(usize, Range<u64>)>,
    /// Parity follows from the data alone afterwards (`Full`, reconstruct-write,
    /// degraded): over whole rows of the chunk this makes an inconsistent stripe
    /// consistent again.
    pub from_data: bool,
}

impl Shape {
    /// The rows the write spans.
    pub fn rows(&self) -> Range<u64> {
        let r0 = self.written.iter().flatten().map(|r| r.start).min();
        let r1 = self.written.iter().flatten().map(|r| r.end).max();
        r0.expect("a stripe write writes something")..r1.expect("something")
    }

    fn covers(&self, i: usize, rows: &Range<u64>) -> bool {
        self.written[i]
            .as_ref()
            .is_some_and(|r| r.start == rows.start && r.end == rows.end)
    }

    /// Every data chunk is written over the same rows.
    pub fn full(&self) -> bool {
        let rows = self.rows();
        (0..self.k).all(|i| self.covers(i, &rows))
    }

    /// The write covers whole chunks (rows of the whole stripe).
    pub fn whole_chunks(&self) -> bool {
        let rows = self.rows();
        rows.start == 0 && rows.end == self.chunk
    }

    /// Decide.
    pub fn plan(&self) -> Plan {
        let rows = self.rows();
        let (k, m) = (self.k, self.m);
        let missing_data = (0..k).any(|i| !self.readable[i]);
        // A whole-stripe write over a stripe already inconsistent has nothing to keep:
        // what a missing chunk held is not known; it settles the stripe instead.
        let settles = self.full() && self.whole_chunks() && self.unsynced;
        // With a data chunk missing, the stripe must stay consistent through a write that
        // reaches some members only (a member file's file system full): that chunk lives
        // only in parity. Such stripes take the degraded plan, which keeps the old rows.
        if missing_data && !settles && self.may_run_out {
            return self.degraded(rows);
        }
        if self.full() {
            return Plan {
                strategy: Strategy::Full,
                rows,
                reads: Vec::new(),
                from_data: true,
            };
        }
        let rl = rows.end - rows.start;
        let written_len = |i: usize| self.written[i].as_ref().map_or(0, |r| r.end - r.start);
        let rmw_ok = self.synced
            && (0..k).all(|i| self.written[i].is_none() || self.readable[i])
            && (k..k + m).all(|s| self.readable[s]);
        let rcw_ok = (0..k).all(|i| self.covers(i, &rows) || self.readable[i]);
        let rmw_cost: u64 = (0..k).map(written_len).sum::<u64>() + m as u64 * rl;
        let rcw_cost: u64 = (0..k).map(|i| rl - written_len(i)).sum();
        if rmw_ok && (!rcw_ok || rmw_cost <= rcw_cost) {
            let mut reads: Vec<(usize, Range<u64>)> = (0..k)
                .filter_map(|i| self.written[i].clone().map(|r| (i, r)))
                .collect();
            reads.extend((k..k + m).map(|s| (s, rows.clone())));
            return Plan {
                strategy: Strategy::ReadModifyWrite,
                rows,
                reads,
                from_data: false,
            };
        }
        if rcw_ok {
            let mut reads = Vec::new();
            for i in 0..k {
                match &self.written[i] {
                    Some(r) => {
                        if r.start > rows.start {
                            reads.push((i, rows.start..r.start));
                        }
                        if r.end < rows.end {
                            reads.push((i, r.end..rows.end));
                        }
                    }
                    None => reads.push((i, rows.clone())),
                }
            }
            return Plan {
                strategy: Strategy::ReconstructWrite,
                rows,
                reads,
                from_data: true,
            };
        }
        self.degraded(rows)
    }

    fn degraded(&self, rows: Range<u64>) -> Plan {
        Plan {
            strategy: Strategy::Degraded,
            rows,
            reads: Vec::new(),
            from_data: true,
        }
    }
}

/// The range decisions of write coalescing (`parity/coalesce.rs`; as md's stripe cache does): a
/// sequential stream of requests that are not multiples of the stripe splits stripes
/// between neighbouring requests; the halves written together make a full stripe that
/// reads nothing. These decide from the written ranges alone (per data chunk, in codec
/// order, as [`Shape::written`]).
pub(crate) mod written {
    use std::ops::Range;

    /// The stripe's data in volume order: chunk `i`'s range `r` is `i * chunk + r`.
    fn flat(chunk: u64, w: &[Option<Range<u64>>]) -> Vec<Range<u64>> {
        let mut v: Vec<Range<u64>> = w
            .iter()
            .enumerate()
            .filter_map(|(i, r)| {
                r.as_ref()
                    .map(|r| i as u64 * chunk + r.start..i as u64 * chunk + r.end)
            })
            .filter(|r| r.start < r.end)
            .collect();
        v.sort_by_key(|r| r.start);
        v
    }

    /// One contiguous range of the stripe's data, if `w` is that.
    fn span(chunk: u64, w: &[Option<Range<u64>>]) -> Option<Range<u64>> {
        let v = flat(chunk, w);
        let first = v.first()?;
        let mut end = first.end;
        for r in &v[1..] {
            if r.start != end {
                return None;
            }
            end = r.end;
        }
        Some(first.start..end)
    }

    /// Every byte of the stripe's data is written.
    pub fn whole(k: usize, chunk: u64, w: &[Option<Range<u64>>]) -> bool {
        w.len() == k && w.iter().all(|r| r.as_ref() == Some(&(0..chunk)))
    }

    /// A partial write worth waiting on: one contiguous piece at the start or the end of
    /// the stripe's data (the tail of one sequential request or the head of the next), so
    /// that the neighbouring request can complete the stripe.
    pub fn edge(k: usize, chunk: u64, w: &[Option<Range<u64>>]) -> bool {
        let total = k as u64 * chunk;
        match span(chunk, w) {
            Some(r) => (r.start == 0) != (r.end == total),
            None => false,
        }
    }

    /// The written ranges of two writes taken as one: only when they do not overlap (two
    /// writes to the same bytes keep their own order, under the stripe lock) and every
    /// chunk's new bytes stay one range (what a stripe plan takes).
    pub fn join(
        a: &[Option<Range<u64>>],
        b: &[Option<Range<u64>>],
    ) -> Option<Vec<Option<Range<u64>>>> {
        if a.len() != b.len() {
            return None;
        }
        a.iter()
            .zip(b)
            .map(|(x, y)| match (x, y) {
                (None, None) => Some(None),
                (Some(r), None) | (None, Some(r)) => Some(Some(r.clone())),
                (Some(x), Some(y)) if x.end == y.start => Some(Some(x.start..y.end)),
                (Some(x), Some(y)) if y.end == x.start => Some(Some(y.start..x.end)),
                _ => None,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::{Shape, Strategy};
    use proptest::prelude::{any, prop_assert, prop_assert_eq, prop_assume, proptest};
    use std::ops::Range;

    const C: u64 = 65536;

    fn shape(k: usize, m: usize, written: &[Option<Range<u64>>]) -> Shape {
        Shape {
            k,
            m,
            chunk: C,
            written: written.to_vec(),
            readable: vec![true; k + m],
            synced: true,
            unsynced: false,
            may_run_out: false,
        }
    }

    #[test]
    fn a_full_stripe_write_reads_nothing() {
        let s = shape(4, 2, &vec![Some(0..C); 4]);
        let p = s.plan();
        assert_eq!(p.strategy, Strategy::Full);
        assert!(p.reads.is_empty());
        // The same rows of every chunk are full too (a row range, not whole chunks).
        let s = shape(4, 2, &vec![Some(4096..8192); 4]);
        assert_eq!(s.plan().strategy, Strategy::Full);
        assert_eq!(s.plan().rows, 4096..8192);
    }

    #[test]
    fn a_small_write_reads_its_old_data_and_parity() {
        let mut w = vec![None; 6];
        w[2] = Some(4096..8192);
        let p = shape(6, 2, &w).plan();
        assert_eq!(p.strategy, Strategy::ReadModifyWrite);
        assert_eq!(
            p.reads,
            vec![(2, 4096..8192), (6, 4096..8192), (7, 4096..8192)]
        );
    }

    #[test]
    fn most_of_a_stripe_reads_the_rest_and_never_parity() {
        let mut w = vec![Some(0..C); 6];
        w[5] = Some(0..C / 2);
        let p = shape(6, 2, &w).plan();
        assert_eq!(p.strategy, Strategy::ReconstructWrite);
        assert_eq!(p.reads, vec![(5, C / 2..C)]);
    }

    #[test]
    fn unsynced_parity_is_never_read_modified() {
        let mut w = vec![None; 6];
        w[0] = Some(0..4096);
        let mut s = shape(6, 2, &w);
        s.synced = false;
        let p = s.plan();
        assert_eq!(p.strategy, Strategy::ReconstructWrite);
        assert!(p.reads.iter().all(|(sh, _)| *sh < 6));
    }

    #[test]
    fn a_missing_parity_member_means_reconstruct_write() {
        let mut w = vec![None; 4];
        w[1] = Some(0..4096);
        let mut s = shape(4, 1, &w);
        s.readable[4] = false;
        assert_eq!(s.plan().strategy, Strategy::ReconstructWrite);
    }

    #[test]
    fn a_missing_data_member_is_read_modify_write_or_degraded() {
        let mut w = vec![None; 4];
        w[1] = Some(0..4096);
        let mut s = shape(4, 2, &w);
        s.readable[3] = false;
        // The missing chunk is not written: rmw keeps it as parity holds it.
        assert_eq!(s.plan().strategy, Strategy::ReadModifyWrite);
        // Written whole over the rows but missing: its old rows are not needed.
        let mut s2 = s.clone();
        s2.readable = vec![true; 6];
        s2.readable[1] = false;
        assert_eq!(s2.plan().strategy, Strategy::ReconstructWrite);
        // Written in part and missing: the rest of its rows must be rebuilt.
        s2.written[2] = Some(0..8192);
        assert_eq!(s2.plan().strategy, Strategy::Degraded);
        // Members that may run out of space keep old rows: degraded.
        s.may_run_out = true;
        assert_eq!(s.plan().strategy, Strategy::Degraded);
        // Unless the write settles an inconsistent stripe whole.
        let mut s3 = shape(4, 2, &vec![Some(0..C); 4]);
        s3.readable[0] = false;
        s3.may_run_out = true;
        assert_eq!(s3.plan().strategy, Strategy::Degraded);
        s3.unsynced = true;
        assert_eq!(s3.plan().strategy, Strategy::Full);
    }

    #[test]
    fn split_stripes_coalesce_into_full_ones() {
        use super::written::{edge, join, whole};
        // raid6 of 8 (k = 6), 64K chunks, 1 MiB requests: a tail (chunks 2.. and the end
        // of chunk 1) and the next request's head (chunk 0 and the start of chunk 1).
        let mut tail = vec![Some(0..C); 6];
        tail[0] = None;
        tail[1] = Some(C / 2..C);
        let mut head = vec![None; 6];
        head[0] = Some(0..C);
        head[1] = Some(0..C / 2);
        assert!(edge(6, C, &tail) && edge(6, C, &head));
        let j = join(&tail, &head).expect("disjoint, one range per chunk");
        assert!(whole(6, C, &j));
        assert!(!edge(6, C, &j), "a whole stripe waits for nothing");
        // Overlapping bytes never join; nor pieces that leave a hole inside a chunk.
        assert!(join(&tail, &tail).is_none());
        let mut gap = vec![None; 6];
        gap[1] = Some(0..C / 4);
        assert!(join(&tail, &gap).is_none());
        // A piece in the middle of a stripe, or in pieces, is no edge.
        let mut mid = vec![None; 6];
        mid[2] = Some(0..C);
        assert!(!edge(6, C, &mid));
        let mut holes = vec![None; 6];
        holes[0] = Some(0..4096);
        holes[5] = Some(C - 4096..C);
        assert!(!edge(6, C, &holes));
    }

    proptest! {
        /// Joining two writes never loses or invents a byte: the join covers exactly the
        /// bytes of both, they were disjoint, and `whole` is exact.
        #[test]
        fn joins_cover_exactly_both_writes(
            k in 1usize..6,
            a in proptest::collection::vec(proptest::option::of((0u64..16, 1u64..17)), 6),
            b in proptest::collection::vec(proptest::option::of((0u64..16, 1u64..17)), 6),
        ) {
            use super::written::{edge, join, whole};
            let blk = |p: &Option<(u64, u64)>| p.map(|(s, n)| s * 4096..(s + n).min(16) * 4096);
            let a: Vec<_> = a.iter().take(k).map(blk).collect();
            let b: Vec<_> = b.iter().take(k).map(blk).collect();
            let c = 16 * 4096;
            let has = |w: &[Option<Range<u64>>], i: usize, x: u64| {
                w[i].as_ref().is_some_and(|r| r.contains(&x))
            };
            if let Some(j) = join(&a, &b) {
                for i in 0..k {
                    for x in (0..c).step_by(4096) {
                        prop_assert!(!(has(&a, i, x) && has(&b, i, x)), "overlap joined");
                        prop_assert_eq!(has(&j, i, x), has(&a, i, x) || has(&b, i, x));
                    }
                }
                let all = (0..k).all(|i| (0..c).step_by(4096).all(|x| has(&j, i, x)));
                prop_assert_eq!(whole(k, c, &j), all);
                if all {
                    prop_assert!(!edge(k, c, &j));
                }
            }
        }
    }

    proptest! {
        /// Whatever the shape: a plan only reads readable shards, reads no byte the write
        /// brings, stays inside the rows, reads parity only when it builds on it, and
        /// picks the cheaper of rmw and rcw when both are possible.
        #[test]
        fn plans_read_only_what_they_need(
            k in 1usize..8, m in 1usize..4,
            pieces in proptest::collection::vec(proptest::option::of((0u64..16, 1u64..17)), 8),
            unreadable in proptest::collection::vec(any::<bool>(), 12),
            synced in any::<bool>(), run_out in any::<bool>(),
        ) {
            // Pieces of 4 KiB blocks within a chunk of 16 blocks.
            let written: Vec<Option<Range<u64>>> = (0..k)
                .map(|i| pieces[i].map(|(a, n)| a * 4096..(a + n).min(16) * 4096))
                .collect();
            prop_assume!(written.iter().any(|w| w.is_some()));
            let mut s = shape(k, m, &written);
            s.chunk = 16 * 4096;
            // At most m shards out: the stripe is still readable.
            let mut out = 0;
            for (sh, bad) in unreadable.iter().take(k + m).enumerate() {
                if *bad && out < m {
                    s.readable[sh] = false;
                    out += 1;
                }
            }
            s.synced = synced;
            s.may_run_out = run_out;
            let p = s.plan();
            let rows = s.rows();
            prop_assert_eq!(p.rows.clone(), rows.clone());
            for (sh, r) in &p.reads {
                prop_assert!(s.readable[*sh], "reads an unreadable shard {}", sh);
                prop_assert!(r.start < r.end && r.start >= rows.start && r.end <= rows.end);
                if *sh >= k {
                    prop_assert_eq!(p.strategy, Strategy::ReadModifyWrite);
                } else if p.strategy == Strategy::ReconstructWrite {
                    if let Some(w) = &written[*sh] {
                        prop_assert!(r.end <= w.start || r.start >= w.end, "rereads new bytes");
                    }
                }
            }
            if p.strategy == Strategy::ReadModifyWrite {
                prop_assert!(synced, "rmw on parity not known to match");
            }
            if p.strategy == Strategy::Full {
                prop_assert!(p.reads.is_empty());
            }
        }
    }
}
