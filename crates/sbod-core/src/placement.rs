//! The placement map: where every byte of the volume lives on the members, and back.
//!
//! This is the one place that knows the layout. The data path splits requests with
//! [`Placement::map`], a RAID family finds the members of a stripe with
//! [`Placement::slot`], rebuild and scrub ask which shard a slot holds in a stripe
//! ([`Placement::shard_at`]), and scrub reports map member space back to the volume with
//! [`Placement::volume_offset`]. Nothing else computes a slot from a group and a position:
//! a new layout (a distributed spare, as ZFS dRAID has) is a new map here.
//!
//! **Striped layouts** (raid0, raid1/10, raid5/6, ec): the volume is striped over `groups`
//! equal redundancy groups of `width` slots each (group `g` holds slots `g*width ..
//! (g+1)*width`). Logical stripe `s` (of `k * chunk` data bytes) lives in group
//! `s % groups`, as that group's stripe `t = s / groups`, at member offset `t * chunk` on
//! every member of the group. Within a parity group, parity rotates as Linux md's
//! left-symmetric layout does: stripe `t` puts parity row `r` on position `(p0 + r) % n`
//! with `p0 = n - 1 - t % n`, and data chunk `i` on position `(p0 + m + i) % n`. For raid5
//! and raid6 this is exactly md's `ALGORITHM_LEFT_SYMMETRIC`. Mirrors keep the chunk on
//! every position; raid0 puts data chunk `i` on position `i`.
//!
//! **Concat**: members appended end to end. Each slot is a "group" of one member and its
//! chunks are that group's stripes, so the unit a writer and a replacement's copy lock is
//! the same `(group, stripe)` as everywhere else.
//!
//! **Declustered** (`Geometry::declustered`, OpenZFS dRAID's idea): the `groups` groups
//! of `width` and `spares` members' worth of spare space are spread over all
//! `n = groups * width + spares` members. Member offset `t * chunk` is row `t`; row `t`
//! orders the members by a permutation ([`Decl::member`]): columns `g*width ..
//! (g+1)*width` hold group `g`'s stripe `t` (shard `i` at column `g*width + i`), the last
//! `spares` columns are spare space. So addresses stay `(group, stripe)` at one member
//! offset as in every other layout, and only the slots of a stripe differ from row to row.
//! The permutations come from a fixed table of [`TABLE_ROWS`] rows drawn from a seed;
//! rows come in blocks of `height` (the layout's row height: `Declustered::height`) that
//! share one permutation, and block `b = t / height` takes table row `b % TABLE_ROWS`
//! with every member number shifted by `(b / TABLE_ROWS) % n`, so over
//! `TABLE_ROWS * n` blocks every member sits in every column exactly `TABLE_ROWS *
//! height` rows: data, parity and spare space are exactly balanced. A height above 1
//! (dRAID's rows are 16 MiB of a member) makes each member's share of a group's
//! stripes, and of the spare space, runs of `height` chunks, so a rebuild's reads and
//! writes stream; arrays created before the height was recorded have 1.
//! That is the random table (`Declustered::map` 0, arrays created before 2026-11-29); new
//! arrays take the balanced map ([`Decl::balanced`]: one searched permutation, block `b`
//! shifted by `b % n`), which spreads each failure's rebuild evenly over the survivors on
//! members of any size.
//!
//! Shards are numbered in codec order: data `0..k`, then parity `k..k+m`. Mirrors and
//! concat have one shard per position (a mirror's copies are shards `0..copies`).

use crate::layout::{Geometry, Level, Scheme};
use arc_swap::ArcSwap;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

/// Rows of a declustered layout's permutation table.
pub const TABLE_ROWS: usize = 64;

/// A declustered layout's permutation table (see the module's words).
#[derive(Debug)]
pub struct Decl {
    /// Members.
    n: usize,
    /// `TABLE_ROWS` permutations of `0..n`, row after row.
    table: Vec<u16>,
    /// Their inverses: the column of each member.
    inv: Vec<u16>,
    /// Rows per permutation.
    height: u64,
    /// The balanced map (`Declustered::map` 1): `table` is one permutation, block `b`
    /// shifted by `b % n`; else [`TABLE_ROWS`] of them, block `b` taking row
    /// `b % TABLE_ROWS` shifted by `(b / TABLE_ROWS) % n`.
    sweep: bool,
}

/// The balanced maps drawn so far in this process, by (members, seed, groups, width,
/// k): each takes a search (see [`Decl::balanced`]), and every superblock read checks its
/// table's checksum.
type BalancedKey = (usize, u64, usize, usize, usize);
static BALANCED: OnceLock<std::sync::Mutex<std::collections::HashMap<BalancedKey, Arc<Vec<u16>>>>> =
    OnceLock::new();

/// splitmix64 (Steele, Lea and Flood), written out here rather than taken from a crate:
/// the table it draws is part of the on-disk format, so its output must never change with
/// a dependency's version. The table's checksum in the superblocks guards it as well.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Decl {
    /// The table for `n` members drawn from `seed` (Fisher-Yates shuffles), `height` rows
    /// per permutation.
    pub fn new(n: usize, seed: u64, height: u32) -> Decl {
        assert!((1..=u16::MAX as usize).contains(&n));
        assert!(height >= 1);
        let mut state = seed ^ (n as u64).wrapping_mul(0x2545_f491_4f6c_dd1d);
        let mut table = Vec::with_capacity(TABLE_ROWS * n);
        let mut inv = vec![0u16; TABLE_ROWS * n];
        for row in 0..TABLE_ROWS {
            let mut p: Vec<u16> = (0..n as u16).collect();
            for i in (1..n).rev() {
                let j = (splitmix64(&mut state) % (i as u64 + 1)) as usize;
                p.swap(i, j);
            }
            for (col, &m) in p.iter().enumerate() {
                inv[row * n + m as usize] = col as u16;
            }
            table.extend(p);
        }
        Decl {
            n,
            table,
            inv,
            height: height as u64,
            sweep: false,
        }
    }

    /// The table of a declustered geometry: its map's ([`crate::layout::Declustered`]).
    /// (A geometry that does not validate, as a damaged superblock's, gets the random
    /// table: decoding refuses it anyway, and encoding one must not panic.)
    pub fn for_layout(g: &crate::layout::Geometry) -> Decl {
        let d = g.declustered.expect("a declustered geometry");
        if d.map == 0 || g.validate().is_err() {
            return Decl::new(g.members(), d.seed, d.height);
        }
        Decl::balanced(
            g.members(),
            d.seed,
            d.height,
            g.groups as usize,
            g.width as usize,
            g.k(),
        )
    }

    /// The balanced map (`Declustered::map` 1): one permutation `p`, block `b` taking it
    /// shifted by `b % n`. Over any `n` blocks in a row every member sits in every column
    /// once (data, parity and spare space exactly balanced, as the table's `TABLE_ROWS *
    /// n`), and how often a member `j` holds a chunk that a rebuild of member `f` reads
    /// (or is where it writes) depends only on `j - f mod n`: on the counts, over the
    /// columns of `p`, of each difference between a lost chunk's member and a member its
    /// rebuild touches (the first `k` of the stripe's other shards in shard order, as a
    /// rebuild reads them, and the first spare column, where it writes). `p` is searched
    /// (annealing swaps from a shuffle drawn from `seed`: [`balanced_permutation`]) to
    /// make those counts as even as they can be, so
    /// every failure's rebuild spreads over the survivors within a few percent of evenly
    /// on any member size. The random table (`map` 0) balances only over `TABLE_ROWS * n`
    /// blocks, more than most members hold: 48 members of 4200 MiB (16 MiB rows) gave the
    /// busiest survivor 1.24 times the mean's bytes, and a rebuild is as slow as it.
    pub fn balanced(
        n: usize,
        seed: u64,
        height: u32,
        groups: usize,
        width: usize,
        k: usize,
    ) -> Decl {
        assert!((1..=u16::MAX as usize).contains(&n));
        assert!(height >= 1 && groups * width <= n && k <= width);
        let key = (n, seed, groups, width, k);
        let cache = BALANCED.get_or_init(Default::default);
        let found = cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .cloned();
        let p = found.unwrap_or_else(|| {
            let p = Arc::new(balanced_permutation(n, seed, groups, width, k));
            cache
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(key, p.clone());
            p
        });
        let mut inv = vec![0u16; n];
        for (col, &m) in p.iter().enumerate() {
            inv[m as usize] = col as u16;
        }
        Decl {
            n,
            table: p.to_vec(),
            inv,
            height: height as u64,
            sweep: true,
        }
    }

    /// Rows per permutation.
    pub fn height(&self) -> u64 {
        self.height
    }

    /// The member in column `col` of permutation `block` (rows `block * height ..`).
    fn block_member(&self, block: u64, col: usize) -> usize {
        let (t, shift) = self.block_row(block);
        (self.table[t * self.n + col] as usize + shift) % self.n
    }

    /// The table row and shift of permutation `block`.
    fn block_row(&self, block: u64) -> (usize, usize) {
        let (n, rows) = (self.n as u64, TABLE_ROWS as u64);
        if self.sweep {
            (0, (block % n) as usize)
        } else {
            ((block % rows) as usize, ((block / rows) % n) as usize)
        }
    }

    /// The member in column `col` of row `row`.
    pub fn member(&self, row: u64, col: usize) -> usize {
        self.block_member(row / self.height, col)
    }

    /// The column of member `slot` in row `row` (inverse of [`Decl::member`]).
    pub fn column(&self, row: u64, slot: usize) -> usize {
        let (t, shift) = self.block_row(row / self.height);
        self.inv[t * self.n + (slot + self.n - shift) % self.n] as usize
    }

    /// Where the chunks of row `row`'s first `cols` columns (the groups' columns) live
    /// once the members in `spared` (in the order they failed) have had their chunks
    /// rebuilt into spare space. In that order, every chunk on the next member of
    /// `spared` (its own, or one an earlier member's failure put there) goes to the first
    /// spare column (from `cols` on) whose member neither failed before it nor holds a
    /// chunk already; None where none is left (more in `spared` than spare columns).
    /// So sparing one more member moves only what lay on it, and unsparing the last one
    /// moves only what lies in the spare space for it. The map of the distributed rebuild
    /// and the copy-back (docs/ENGINE.md, "Declustered layouts"): [`Placement`] resolves
    /// every row through it.
    pub fn resolved_row(&self, row: u64, cols: usize, spared: &[usize]) -> Vec<Option<usize>> {
        let mut out: Vec<Option<usize>> = (0..cols).map(|c| Some(self.member(row, c))).collect();
        let mut taken: Vec<usize> = Vec::new();
        for (i, &f) in spared.iter().enumerate() {
            for at in out.iter_mut().filter(|m| **m == Some(f)) {
                let next = (cols..self.n)
                    .map(|c| self.member(row, c))
                    .find(|m| !spared[..=i].contains(m) && !taken.contains(m));
                taken.extend(next);
                *at = next;
            }
        }
        out
    }

    /// Do slots `x` and `y` hold chunks of one stripe (of groups `width` wide) in row
    /// `row`, resolved through `spared`? (The rows a distributed rebuild's first pass
    /// walks: see [`Spared`].)
    pub fn shares_stripe(
        &self,
        row: u64,
        cols: usize,
        width: usize,
        spared: &[usize],
        x: usize,
        y: usize,
    ) -> bool {
        let r = self.resolved_row(row, cols, spared);
        let at = |s: usize| r.iter().position(|&m| m == Some(s));
        matches!((at(x), at(y)), (Some(a), Some(b)) if a / width == b / width)
    }

    /// The checksum of the permutations this table gives (recorded in the superblocks): a
    /// crc32c of the member of every column of the first `TABLE_ROWS + 1` permutations
    /// (the table, and the first shifted one). The height is recorded beside it, so the
    /// checksum is the same for every height (and an array of height 1 keeps the one it
    /// was created with).
    /// The balanced map's checksum covers its first `TABLE_ROWS + 1` permutations too,
    /// after a byte of its own (so no table of the other map can share it).
    pub fn checksum(&self) -> u32 {
        let mut bytes = Vec::with_capacity((TABLE_ROWS + 1) * self.n * 2 + 1);
        if self.sweep {
            bytes.push(1);
        }
        for block in 0..=TABLE_ROWS as u64 {
            for col in 0..self.n {
                bytes.extend_from_slice(&(self.block_member(block, col) as u16).to_le_bytes());
            }
        }
        crc32c::crc32c(&bytes)
    }
}

/// The permutation of the balanced map ([`Decl::balanced`]): of columns `0..n`, groups
/// `groups` of `width` (shards in order, the first `k` the ones a rebuild reads first),
/// then the spare columns.
fn balanced_permutation(n: usize, seed: u64, groups: usize, width: usize, k: usize) -> Vec<u16> {
    let mut state = seed ^ (n as u64).wrapping_mul(0x2545_f491_4f6c_dd1d) ^ 0xba1a_9ced;
    let mut p: Vec<u16> = (0..n as u16).collect();
    for i in (1..n).rev() {
        let j = (splitmix64(&mut state) % (i as u64 + 1)) as usize;
        p.swap(i, j);
    }
    // The rebuild of a chunk at position `lost` of a stripe touches positions `touch(lost)`:
    // the first `k` others in shard order (what it reads), and the first spare column
    // (where a single failure's chunks go), if there is one.
    let spare_col = (groups * width < n).then_some(groups * width);
    let mut pairs: Vec<(usize, usize)> = Vec::new();
    for g in 0..groups {
        for lost in 0..width {
            let c_lost = g * width + lost;
            pairs.extend(
                (0..width)
                    .filter(|&s| s != lost)
                    .take(k)
                    .map(|s| (c_lost, g * width + s)),
            );
            pairs.extend(spare_col.map(|c| (c_lost, c)));
        }
    }
    if n < 2 || pairs.is_empty() {
        return p;
    }
    // The counts of each difference, and their sum of squares, kept as columns swap: a
    // swap changes only the pairs of its two columns.
    let mut of_col: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (i, &(a, b)) in pairs.iter().enumerate() {
        of_col[a].push(i);
        if b != a {
            of_col[b].push(i);
        }
    }
    let diff = |p: &[u16], (a, b): (usize, usize)| (p[b] as usize + n - p[a] as usize) % n;
    let mut cnt = vec![0i64; n];
    for &pr in &pairs {
        cnt[diff(&p, pr)] += 1;
    }
    let mut sq: i64 = cnt.iter().map(|c| c * c).sum();
    let max = |cnt: &[i64]| cnt.iter().copied().max().unwrap_or(0);
    // No count can be below the mean's ceiling: reached, the search stops.
    let floor = pairs.len().div_ceil(n - 1) as i64;
    let mut best = ((max(&cnt), sq), p.clone());
    // The largest count is looked at only where the sum of squares is as good as the
    // best's (a swap costs its own pairs, not a pass over all `n` counts).
    let mut touched: Vec<usize> = Vec::new();
    // Annealing on the sum of squares (plain descent stalled one above the best): a swap
    // that makes it larger by `delta` is kept with probability 2^(-16 delta / t16), the
    // temperature `t16` falling to nothing over each round; the best permutation seen (by
    // largest count, then sum of squares) is kept. Integers only: the result is part of
    // the on-disk format and must be the same on every machine.
    'search: for _round in 0..BALANCE_ROUNDS {
        for it in 0..BALANCE_SWAPS {
            if best.0 .0 <= floor {
                break 'search;
            }
            let i = (splitmix64(&mut state) % n as u64) as usize;
            let j = (splitmix64(&mut state) % n as u64) as usize;
            if i == j {
                continue;
            }
            touched.clear();
            touched.extend(of_col[i].iter().chain(&of_col[j]).copied());
            touched.sort_unstable();
            touched.dedup();
            let before = sq;
            let apply = |p: &mut Vec<u16>, cnt: &mut Vec<i64>, sq: &mut i64| {
                for &t in &touched {
                    let d = diff(p, pairs[t]);
                    *sq -= 2 * cnt[d] - 1;
                    cnt[d] -= 1;
                }
                p.swap(i, j);
                for &t in &touched {
                    let d = diff(p, pairs[t]);
                    *sq += 2 * cnt[d] + 1;
                    cnt[d] += 1;
                }
            };
            apply(&mut p, &mut cnt, &mut sq);
            let delta = sq - before;
            let t16 = (44 * (BALANCE_SWAPS - it) / BALANCE_SWAPS + 1) as i64;
            let shift = (delta.max(0) * 16 / t16).min(40) as u32;
            let draw = splitmix64(&mut state) >> 32;
            if delta <= 0 || draw < (1u64 << 32) >> shift {
                if sq <= best.0 .1 {
                    let now = (max(&cnt), sq);
                    if now < best.0 {
                        best = (now, p.clone());
                    }
                }
            } else {
                apply(&mut p, &mut cnt, &mut sq);
            }
        }
    }
    best.1
}

/// Rounds of [`BALANCE_SWAPS`] swaps [`balanced_permutation`] tries at most (each found
/// the best of 48 members about half the time).
const BALANCE_ROUNDS: usize = 6;

/// Swaps [`balanced_permutation`] tries.
const BALANCE_SWAPS: usize = 200_000;

/// The distributed spare space in use (declustered layouts): the slots whose chunks
/// live in it, in the order they were spared (`from`), and a transition under way to
/// another list (`to`): rows below `boundary` are resolved through `to`, the rest
/// through `from`. A new `Spared` is swapped in for every transition (its boundary is
/// its own), and the boundary moves only with the locks of the rows it passes held.
///
/// A distributed rebuild (`to` = `from` + the slot `x` it spares) may take a **first
/// pass** (docs/ENGINE.md, "Order"): while another slot `y` is out too, it first walks
/// only the rows where `x` and `y` hold chunks of one stripe (the stripes that lost two
/// chunks), moving `first_boundary`; such a row below `first_boundary` is resolved
/// through `to` as well. `first_slot` is set before `first_boundary` first moves past
/// `boundary`, and both only with the rows' locks held.
///
/// A distributed rebuild's main pass also resolves through `to` the rows **ahead** of
/// the boundary whose chunks it has all written ([`Spared::mark_ahead`]), so that it can
/// let their locks go as soon as their block is done instead of when the boundary passes
/// their window: a client's request waits for one block, not for the slowest block of a
/// window. Only a distributed rebuild may: `to` keeps every place `from` has on a member
/// in service and adds the spared slot's chunks in spare space no chunk of `from` holds,
/// so a write resolved through `to` writes every place `from` would read, and a crash (or
/// a transition that stops) falls back to `from` with nothing lost. A copy-back may not:
/// its old places are what a crash reads.
#[derive(Debug)]
pub struct Spared {
    pub from: Vec<usize>,
    pub to: Option<Vec<usize>>,
    pub boundary: AtomicU64,
    /// The boundary the superblocks may record: at most `boundary`, and only where what
    /// the transition wrote below it is durable.
    pub recorded: AtomicU64,
    /// The first pass's other slot out (`NO_FIRST`: none).
    pub first_slot: AtomicUsize,
    /// How far the first pass got (rows where both slots hold a chunk of one stripe
    /// below it are resolved through `to`).
    pub first_boundary: AtomicU64,
    /// What the superblocks may record of it (as `recorded`).
    pub first_recorded: AtomicU64,
    /// The rows ahead of `boundary` marked by [`Spared::mark_ahead`]: a ring (set up once
    /// by the walk, [`Spared::ahead_init`]) whose entry `row % len` holds `row + 1` once
    /// row `row` is marked. Only rows below `boundary + len` are marked, so an entry is
    /// overwritten only by a row `len` further on, once the boundary has passed the row it
    /// held: no entry is ever cleared, and a mark is never lost while it is needed.
    ahead: OnceLock<Box<[AtomicU64]>>,
}

/// `Spared::first_slot` when there is no first pass.
pub const NO_FIRST: usize = usize::MAX;

impl Default for Spared {
    fn default() -> Spared {
        Spared {
            from: Vec::new(),
            to: None,
            boundary: AtomicU64::new(0),
            recorded: AtomicU64::new(0),
            first_slot: AtomicUsize::new(NO_FIRST),
            first_boundary: AtomicU64::new(0),
            first_recorded: AtomicU64::new(0),
            ahead: OnceLock::new(),
        }
    }
}

impl Spared {
    /// The list row `row` is resolved through, not counting a first pass (see
    /// [`Placement`]'s resolution, which does).
    pub fn list_at(&self, row: u64) -> &[usize] {
        match &self.to {
            Some(to) if self.moved(row) => to,
            _ => &self.from,
        }
    }

    /// Is row `row` below the boundary, or marked ahead of it? The mark is read first: an
    /// entry found overwritten was overwritten after the boundary passed the row.
    fn moved(&self, row: u64) -> bool {
        self.is_ahead(row) || row < self.boundary.load(Ordering::Acquire)
    }

    /// Set up the ring of rows marked ahead of the boundary, `len` rows (the most a walk
    /// runs ahead of it); once only, the first length stays.
    pub fn ahead_init(&self, len: usize) {
        self.ahead
            .get_or_init(|| (0..len.max(1)).map(|_| AtomicU64::new(0)).collect());
    }

    /// Mark row `row` (ahead of the boundary) as resolved through `to`: every chunk the
    /// distributed rebuild moves in it is written, and the rows' stripe locks are held
    /// (they are let go after). Only the walk that moves the boundary calls it. False
    /// (and nothing marked) where the row is not ahead of the boundary within the ring, or
    /// this is no distributed rebuild: its locks are then held until the boundary passes.
    pub fn mark_ahead(&self, row: u64) -> bool {
        let Some(ring) = self.ahead.get() else {
            return false;
        };
        let b = self.boundary.load(Ordering::Acquire);
        let len = ring.len() as u64;
        if self.sparing().is_none() || row < b || row >= b + len {
            return false;
        }
        ring[(row % len) as usize].store(row + 1, Ordering::Release);
        true
    }

    /// Is row `row` marked ahead of the boundary (see [`Spared::mark_ahead`])?
    pub fn is_ahead(&self, row: u64) -> bool {
        self.ahead.get().is_some_and(|ring| {
            ring[(row % ring.len() as u64) as usize].load(Ordering::Acquire) == row + 1
        })
    }

    /// Is `slot`'s every chunk in the spare space (so the slot is not out)?
    pub fn holds(&self, slot: usize) -> bool {
        self.from.contains(&slot)
    }

    /// Is `slot` spared, or being spared or copied back?
    pub fn involves(&self, slot: usize) -> bool {
        self.from.contains(&slot) || self.to.as_ref().is_some_and(|t| t.contains(&slot))
    }

    /// The slot a distributed rebuild spares (None: no transition, or a copy-back).
    pub fn sparing(&self) -> Option<usize> {
        match &self.to {
            Some(to) if to.len() > self.from.len() => to.last().copied(),
            _ => None,
        }
    }

    /// The first pass's other slot, if one was started.
    pub fn first(&self) -> Option<usize> {
        Some(self.first_slot.load(Ordering::Acquire)).filter(|&y| y != NO_FIRST)
    }
}

/// A stripe: the unit every member of a group holds one chunk of, locked as one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StripeAddr {
    pub group: usize,
    /// The stripe within its group.
    pub stripe: u64,
}

/// One piece of a volume range that lies within one data chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    /// Offset of the piece in the caller's range.
    pub buf_off: u64,
    pub len: u64,
    pub addr: StripeAddr,
    /// Data shard within the stripe (`0..k`; 0 for mirrors and concat).
    pub index: usize,
    /// Offset within the chunk.
    pub chunk_off: u64,
    /// The slot holding the data (a mirror's: the group's first copy).
    pub slot: usize,
    /// Member offset of the piece (from the start of the members' data area).
    pub moff: u64,
}

/// The map of one array.
#[derive(Clone, Debug)]
pub struct Placement {
    level: Level,
    scheme: Scheme,
    groups: usize,
    width: usize,
    chunk: u64,
    k: usize,
    /// Slots between the starts of two groups: the width, except in the old layout of a
    /// reshape that widens its groups, whose slots are numbered as the new layout's (group
    /// `g`'s old members keep their slots `g * stride ..`, the new ones follow them).
    stride: usize,
    /// Slots of a redundancy set from its group's first: the width, except in the new
    /// layout of a reshape that narrows its groups, whose sets keep the members leaving
    /// (they hold old data until the reshape ends: their failure costs a stripe a chunk).
    set_span: usize,
    /// Parity shards on dedicated slots (the geometry's `dedicated`): the last
    /// `dedicated` parity shards sit on the group's last `dedicated` slots, the rest of
    /// the stripe rotates over the slots before them.
    dedicated: usize,
    /// Concat: where each slot starts in the volume, and the volume's end.
    starts: Vec<u64>,
    /// Declustered: the permutation table.
    decl: Option<Arc<Decl>>,
    /// Declustered: the distributed spare space in use (shared by the clones of a map).
    spared: Arc<ArcSwap<Spared>>,
}

impl Placement {
    /// The map for `geometry`; `slot_sizes` are the data bytes of each slot (they differ
    /// only for concat, which appends them).
    pub fn new(geometry: &Geometry, slot_sizes: &[u64]) -> Placement {
        let mut starts = Vec::new();
        if geometry.level == Level::Concat {
            let mut pos = 0;
            for s in slot_sizes {
                starts.push(pos);
                pos += s;
            }
            starts.push(pos);
        }
        Placement {
            level: geometry.level,
            scheme: geometry.scheme(),
            groups: geometry.groups as usize,
            width: geometry.width as usize,
            chunk: geometry.chunk as u64,
            k: geometry.k(),
            stride: geometry.width as usize,
            set_span: geometry.width as usize,
            dedicated: geometry.dedicated as usize,
            starts,
            decl: geometry
                .declustered
                .map(|_| Arc::new(Decl::for_layout(geometry))),
            spared: Default::default(),
        }
    }

    /// The distributed spare space in use now.
    pub fn spared(&self) -> Arc<Spared> {
        self.spared.load_full()
    }

    /// Use another distributed spare state (assembly, and a transition's start and end:
    /// see [`Spared`]).
    pub fn set_spared(&self, from: Vec<usize>, to: Option<Vec<usize>>, boundary: u64) {
        self.set_spared_first(from, to, boundary, None);
    }

    /// [`Placement::set_spared`] with a distributed rebuild's first pass: its other slot
    /// and how far it got (assembly, from the superblocks).
    pub fn set_spared_first(
        &self,
        from: Vec<usize>,
        to: Option<Vec<usize>>,
        boundary: u64,
        first: Option<(usize, u64)>,
    ) {
        let (slot, fb) = first.unwrap_or((NO_FIRST, 0));
        self.spared.store(Arc::new(Spared {
            from,
            to,
            boundary: AtomicU64::new(boundary),
            recorded: AtomicU64::new(boundary),
            first_slot: AtomicUsize::new(slot),
            first_boundary: AtomicU64::new(fb),
            first_recorded: AtomicU64::new(fb),
            ahead: OnceLock::new(),
        }));
    }

    /// Is row `row` one of the first pass's (its two slots hold chunks of one stripe),
    /// under the transition `sp`? False when there is no first pass.
    pub fn first_pass_row(&self, sp: &Spared, row: u64) -> bool {
        let (Some(d), Some(x), Some(y)) = (self.decl.as_deref(), sp.sparing(), sp.first()) else {
            return false;
        };
        d.shares_stripe(row, self.groups * self.width, self.width, &sp.from, x, y)
    }

    /// The list row `row` is resolved through under `sp`: `to` below the boundary, and
    /// below the first pass's boundary in the rows it walks; else `from`.
    fn list_of<'a>(&self, sp: &'a Spared, row: u64) -> &'a [usize] {
        let Some(to) = &sp.to else {
            return &sp.from;
        };
        if sp.moved(row)
            || (row < sp.first_boundary.load(Ordering::Acquire) && self.first_pass_row(sp, row))
        {
            return to;
        }
        &sp.from
    }

    /// Row `row` of a declustered layout with spared slots: the member of each of the
    /// groups' columns (None: no spared slot in this row's list, the plain permutation).
    fn resolved(&self, d: &Decl, row: u64) -> Option<Vec<Option<usize>>> {
        let sp = self.spared.load();
        let list = self.list_of(&sp, row);
        (!list.is_empty()).then(|| d.resolved_row(row, self.groups * self.width, list))
    }

    /// The member holding column `col` (of the groups' columns) of row `row`.
    ///
    /// Every request of a spared array asks this, so the row is resolved whole only where
    /// it has to be: a column whose member is not in the row's spared list never moves
    /// ([`Decl::resolved_row`] moves only chunks on spared members), and that is all but
    /// the failed members' columns.
    fn member_at(&self, d: &Decl, row: u64, col: usize) -> usize {
        let own = d.member(row, col);
        let sp = self.spared.load();
        let list = self.list_of(&sp, row);
        if !list.contains(&own) {
            return own;
        }
        d.resolved_row(row, self.groups * self.width, list)[col].unwrap_or(own)
    }

    /// The groups' column slot `slot` holds in row `row` (None: spare space, or spared).
    ///
    /// Resolved whole only where `slot`'s own column is spare space (a chunk may have
    /// moved there): a spared member holds no chunk (each one's chunks move to members not
    /// spared before or with it), and a member not spared keeps its own column.
    fn column_of(&self, d: &Decl, row: u64, slot: usize) -> Option<usize> {
        let cols = self.groups * self.width;
        let own = d.column(row, slot);
        let sp = self.spared.load();
        let list = self.list_of(&sp, row);
        if list.is_empty() || list.contains(&slot) {
            return (list.is_empty() && own < cols).then_some(own);
        }
        if own < cols {
            return Some(own);
        }
        d.resolved_row(row, cols, list)
            .iter()
            .position(|&m| m == Some(slot))
    }

    /// The permutation table of a declustered layout.
    pub fn declustered(&self) -> Option<&Decl> {
        self.decl.as_deref()
    }

    /// The map of a striped layout whose slots are numbered with `stride` slots per group
    /// (the old layout of a reshape that widens groups: see the field).
    pub fn with_stride(geometry: &Geometry, slot_sizes: &[u64], stride: usize) -> Placement {
        assert!(stride >= geometry.width as usize);
        Placement {
            stride,
            ..Placement::new(geometry, slot_sizes)
        }
    }

    /// The map of the new layout of a reshape that narrows groups of `stride` slots to
    /// the geometry's width: group `g` keeps slots `g * stride ..` (the members leaving
    /// are the last of each group), and its redundancy set keeps all `stride` of them.
    pub fn narrowed(geometry: &Geometry, slot_sizes: &[u64], stride: usize) -> Placement {
        assert!(stride >= geometry.width as usize);
        Placement {
            stride,
            set_span: stride,
            ..Placement::new(geometry, slot_sizes)
        }
    }

    /// The map of a striped layout, for tools and tests that have only a geometry.
    pub fn striped(geometry: &Geometry) -> Placement {
        assert!(
            geometry.level != Level::Concat,
            "concat needs its slot sizes"
        );
        Placement::new(geometry, &[])
    }

    pub fn is_concat(&self) -> bool {
        self.level == Level::Concat
    }

    /// Bytes of the volume.
    pub fn volume_size(&self, geometry: &Geometry) -> u64 {
        match self.starts.last() {
            Some(&end) => end,
            None => geometry.capacity(),
        }
    }

    /// Groups: the unit a stripe spans and is locked in (redundancy groups; concat's
    /// slots, each its own).
    pub fn groups(&self) -> usize {
        if self.is_concat() {
            self.starts.len() - 1
        } else {
            self.groups
        }
    }

    /// Redundancy sets: the slots that survive failures together (a redundancy group; all
    /// of concat, which has no redundancy). Membership rules (how many may be out, how
    /// many may share a failure domain) count within a set.
    pub fn sets(&self) -> usize {
        if self.is_concat() || self.decl.is_some() {
            1
        } else {
            self.groups
        }
    }

    /// The slots of a redundancy set.
    pub fn set_slots(&self, set: usize) -> Range<usize> {
        if self.is_concat() {
            0..self.starts.len() - 1
        } else if let Some(d) = &self.decl {
            0..d.n
        } else {
            set * self.stride..set * self.stride + self.set_span
        }
    }

    /// The redundancy set of a slot.
    pub fn set_of(&self, slot: usize) -> usize {
        if self.is_concat() || self.decl.is_some() {
            0
        } else {
            slot / self.stride
        }
    }

    /// The slots of a group (declustered: every member, as each row places the group on
    /// members of its own; [`Placement::stripe_slots`] gives those of one stripe).
    pub fn group_slots(&self, group: usize) -> Range<usize> {
        if self.is_concat() {
            group..group + 1
        } else if let Some(d) = &self.decl {
            0..d.n
        } else {
            group * self.stride..group * self.stride + self.width
        }
    }

    /// The group a slot belongs to (not declustered: see [`Placement::group_at`]).
    pub fn group_of(&self, slot: usize) -> usize {
        assert!(self.decl.is_none(), "a declustered slot's group is per row");
        if self.is_concat() {
            slot
        } else {
            slot / self.stride
        }
    }

    /// The group whose stripe `stripe` slot `slot` holds a chunk of, or None where it
    /// holds spare space there (declustered layouts).
    pub fn group_at(&self, stripe: u64, slot: usize) -> Option<usize> {
        match &self.decl {
            Some(d) => self.column_of(d, stripe, slot).map(|c| c / self.width),
            None => Some(self.group_of(slot)),
        }
    }

    /// The slots holding a stripe's chunks, in the order of their positions (the order
    /// scrub reads them in and `judge` and `heal_row` are given them).
    pub fn stripe_slots(&self, addr: StripeAddr) -> Vec<usize> {
        match &self.decl {
            Some(d) => match self.resolved(d, addr.stripe) {
                Some(r) => (0..self.width)
                    .map(|p| {
                        let c = addr.group * self.width + p;
                        r[c].unwrap_or_else(|| d.member(addr.stripe, c))
                    })
                    .collect(),
                None => (0..self.width)
                    .map(|p| d.member(addr.stripe, addr.group * self.width + p))
                    .collect(),
            },
            None => self.group_slots(addr.group).collect(),
        }
    }

    /// The position (in [`Placement::stripe_slots`]) of the slot holding `shard`.
    pub fn pos_of(&self, addr: StripeAddr, shard: usize) -> usize {
        match &self.decl {
            Some(_) => shard,
            None => self.slot(addr, shard) - self.group_slots(addr.group).start,
        }
    }

    /// The slots holding spare space in a row (declustered layouts; none otherwise), in
    /// the order the distributed spares use them.
    pub fn spare_slots_at(&self, stripe: u64) -> Vec<usize> {
        match &self.decl {
            Some(d) => (self.groups * self.width..d.n)
                .map(|c| d.member(stripe, c))
                .collect(),
            None => Vec::new(),
        }
    }

    /// Data chunks per stripe.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Member offset where a stripe's chunks start (the same on every member of its group).
    pub fn stripe_offset(&self, stripe: u64) -> u64 {
        stripe * self.chunk
    }

    /// The stripe holding member offset `moff`.
    pub fn stripe_at(&self, moff: u64) -> u64 {
        moff / self.chunk
    }

    /// Position within its group of the slot holding `shard` of stripe `stripe`.
    fn position(&self, stripe: u64, shard: usize) -> usize {
        match self.scheme {
            Scheme::Parity { m: 0, .. } | Scheme::Mirror { .. } | Scheme::Concat => shard,
            Scheme::Parity { k, m } => {
                // Dedicated parity: the last shards on the last slots; the rest rotate
                // over the slots before them as the layout did before they were added.
                let (n, m) = (self.width - self.dedicated, m - self.dedicated);
                if shard >= k + m {
                    return n + (shard - k - m);
                }
                if m == 0 {
                    return shard;
                }
                let n = n as u64;
                let p0 = n - 1 - stripe % n;
                let rel = if shard < k { m + shard } else { shard - k };
                ((p0 + rel as u64) % n) as usize
            }
        }
    }

    /// A mirror group's slots in the order a read tries them: from a copy chosen by the
    /// stripe, so that reads spread over the copies.
    pub fn copies_from(&self, addr: StripeAddr) -> impl Iterator<Item = usize> {
        let slots = self.group_slots(addr.group);
        let w = slots.len();
        (0..w).map(move |i| slots.start + (i + addr.stripe as usize) % w)
    }

    /// The slot holding `shard` of a stripe.
    pub fn slot(&self, addr: StripeAddr, shard: usize) -> usize {
        if let Some(d) = &self.decl {
            return self.member_at(d, addr.stripe, addr.group * self.width + shard);
        }
        self.group_slots(addr.group).start + self.position(addr.stripe, shard)
    }

    /// The shard slot `slot` holds in a stripe of its group (inverse of [`Placement::slot`];
    /// declustered: the slot must hold a chunk in that row, see [`Placement::group_at`]).
    pub fn shard_at(&self, stripe: u64, slot: usize) -> usize {
        if let Some(d) = &self.decl {
            let col = self
                .column_of(d, stripe, slot)
                .unwrap_or_else(|| panic!("slot {slot} holds no chunk in row {stripe}"));
            return col % self.width;
        }
        let pos = slot - self.group_slots(self.group_of(slot)).start;
        match self.scheme {
            Scheme::Parity { k, m } if m > 0 => {
                let (n, m) = (self.width - self.dedicated, m - self.dedicated);
                if pos >= n {
                    return k + m + (pos - n);
                }
                if m == 0 {
                    return pos;
                }
                let n = n as u64;
                let p0 = n - 1 - stripe % n;
                let rel = ((pos as u64 + n - p0) % n) as usize;
                if rel < m {
                    k + rel
                } else {
                    rel - m
                }
            }
            _ => pos,
        }
    }

    /// Split a volume range into pieces of one data chunk each, in address order.
    pub fn map(&self, offset: u64, len: u64) -> Vec<Extent> {
        let chunk = self.chunk;
        let mut out = Vec::new();
        let mut pos = offset;
        let end = offset + len;
        while pos < end {
            let piece = if self.is_concat() {
                let slot = self.starts.partition_point(|&s| s <= pos) - 1;
                let within = pos - self.starts[slot];
                let chunk_off = within % chunk;
                let n = (self.starts[slot + 1] - pos)
                    .min(end - pos)
                    .min(chunk - chunk_off);
                Extent {
                    buf_off: pos - offset,
                    len: n,
                    addr: StripeAddr {
                        group: slot,
                        stripe: within / chunk,
                    },
                    index: 0,
                    chunk_off,
                    slot,
                    moff: within,
                }
            } else {
                let sd = self.k as u64 * chunk;
                let s = pos / sd;
                let within = pos % sd;
                let index = (within / chunk) as usize;
                let chunk_off = within % chunk;
                let n = (chunk - chunk_off).min(end - pos);
                let addr = StripeAddr {
                    group: (s % self.groups as u64) as usize,
                    stripe: s / self.groups as u64,
                };
                Extent {
                    buf_off: pos - offset,
                    len: n,
                    addr,
                    index,
                    chunk_off,
                    slot: self.slot(addr, index),
                    moff: self.stripe_offset(addr.stripe) + chunk_off,
                }
            };
            pos += piece.len;
            out.push(piece);
        }
        out
    }

    /// Back from a stripe to the volume: where data shard `index` of `addr` starts.
    pub fn volume_offset(&self, addr: StripeAddr, index: usize) -> u64 {
        if self.is_concat() {
            return self.starts[addr.group] + self.stripe_offset(addr.stripe);
        }
        let sd = self.k as u64 * self.chunk;
        (addr.stripe * self.groups as u64 + addr.group as u64) * sd + index as u64 * self.chunk
    }

    /// Back from a member to the volume: the volume offset of the data at member offset
    /// `moff` of `slot`, or None where the slot holds parity there.
    pub fn locate(&self, slot: usize, moff: u64) -> Option<u64> {
        let stripe = self.stripe_at(moff);
        let group = self.group_at(stripe, slot)?;
        // Every copy of a mirror holds the data.
        let index = match self.scheme {
            Scheme::Mirror { .. } => 0,
            _ => self.shard_at(stripe, slot),
        };
        if index >= self.k {
            return None;
        }
        let addr = StripeAddr { group, stripe };
        Some(self.volume_offset(addr, index) + moff % self.chunk)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geo(level: Level, width: u32, groups: u32) -> Geometry {
        Geometry {
            level,
            groups,
            width,
            chunk: 4096,
            member_size: 4096 * 64,
            data_offset: 1 << 20,
            dedicated: 0,
            declustered: None,
        }
    }

    fn declustered(level: Level, width: u32, groups: u32, spares: u32, rows: u64) -> Geometry {
        declustered_m(level, width, groups, spares, rows, 1, 1)
    }

    fn declustered_m(
        level: Level,
        width: u32,
        groups: u32,
        spares: u32,
        rows: u64,
        height: u32,
        map: u8,
    ) -> Geometry {
        Geometry {
            member_size: 4096 * rows,
            declustered: Some(crate::layout::Declustered {
                spares,
                seed: crate::layout::DECLUSTER_SEED,
                height,
                map,
            }),
            ..geo(level, width, groups)
        }
    }

    /// Per survivor, the chunks a rebuild of `f` over `rows` rows reads (the first `k` of
    /// each stripe's other shards, as `block_runs` takes them) and writes (into spare
    /// space: `resolved_row`): the work each member does.
    fn rebuild_loads(p: &Placement, groups: usize, rows: u64, f: usize) -> Vec<u64> {
        let d = p.declustered().unwrap();
        let cols = groups * p.width;
        let mut load = vec![0u64; d.n];
        for row in 0..rows {
            let after = d.resolved_row(row, cols, &[f]);
            for group in 0..groups {
                let addr = StripeAddr { group, stripe: row };
                let slots = p.stripe_slots(addr);
                let Some(lost) = slots.iter().position(|&s| s == f) else {
                    continue;
                };
                for &s in slots.iter().filter(|&&s| s != f).take(p.k()) {
                    load[s] += 1;
                }
                load[after[group * p.width + lost].unwrap()] += 1;
            }
        }
        load
    }

    /// The balanced map spreads every failure's rebuild over the survivors within a few
    /// percent of evenly, on members of any size (here 3 sweeps and a part of one); the
    /// random table did not on members shorter than its cycle (the busiest survivor of
    /// 48 members 24% above the mean at 262 blocks).
    #[test]
    fn the_balanced_map_spreads_every_rebuild_evenly() {
        for (level, width, groups, spares, most) in [
            (Level::Raid6, 10, 4, 8, 1.10),
            (Level::Raid6, 10, 2, 4, 1.10),
            (Level::Ec { k: 8, m: 3 }, 11, 5, 5, 1.10),
            (Level::Ec { k: 3, m: 2 }, 5, 3, 1, 1.15),
            (Level::Raid5, 4, 1, 1, 1.0),
        ] {
            let n = (width * groups + spares) as u64;
            // Whole sweeps of `n` blocks, then three and a half (the last sweep's part
            // balances only as a whole one would, on average).
            for (rows, limit) in [(3 * n, most), (3 * n + n / 2, most + 0.15)] {
                let mut worst = [0f64; 2];
                for map in [0u8, 1] {
                    let g = declustered_m(level, width, groups, spares, rows, 1, map);
                    let p = Placement::striped(&g);
                    for f in 0..n as usize {
                        let load = rebuild_loads(&p, groups as usize, rows, f);
                        let rest: Vec<u64> = (0..n as usize)
                            .filter(|&j| j != f)
                            .map(|j| load[j])
                            .collect();
                        let mean = rest.iter().sum::<u64>() as f64 / rest.len() as f64;
                        let max = *rest.iter().max().unwrap() as f64;
                        worst[map as usize] = worst[map as usize].max(max / mean);
                    }
                }
                eprintln!(
                    "{level} {width}x{groups}+{spares}, {rows} rows: busiest survivor {:.3} of the mean (random table {:.3})",
                    worst[1], worst[0]
                );
                assert!(
                    worst[1] <= limit,
                    "{level} {width}x{groups}+{spares}: {worst:?}"
                );
                assert!(
                    worst[1] <= worst[0],
                    "{level} {width}x{groups}+{spares}: {worst:?}"
                );
            }
        }
    }

    /// A row height only stretches the table: row `t` of height `h` is row `t / h` of
    /// height 1, and the checksum (of the permutations) is the same for every height.
    #[test]
    fn a_row_height_repeats_each_permutation() {
        let one = Decl::new(22, crate::layout::DECLUSTER_SEED, 1);
        for h in [2u32, 16, 256] {
            let d = Decl::new(22, crate::layout::DECLUSTER_SEED, h);
            assert_eq!(d.checksum(), one.checksum());
            for row in [0u64, 1, h as u64 - 1, h as u64, 64 * h as u64 + 5, 1 << 20] {
                for col in 0..22 {
                    assert_eq!(d.member(row, col), one.member(row / h as u64, col));
                    assert_eq!(d.column(row, d.member(row, col)), col);
                }
            }
        }
    }

    /// The height new arrays get: 16 MiB of a member at most, at least four sweeps of the
    /// balanced map a member (256 permutations where that is fewer), a power of two, 1
    /// on small members.
    #[test]
    fn row_heights_for_member_sizes() {
        use crate::layout::Declustered;
        const K64: u64 = 64 << 10;
        // 64 members and more: 256 permutations, as before the balanced map.
        assert_eq!(Declustered::height_for(3 << 20, 16 << 10, 64), 1);
        assert_eq!(Declustered::height_for(256 << 20, K64, 64), 16);
        assert_eq!(Declustered::height_for(1 << 30, K64, 96), 64);
        assert_eq!(Declustered::height_for(20_000_000_000_000, K64, 64), 256);
        assert_eq!(Declustered::height_for(20_000_000_000_000, 1 << 20, 12), 16);
        assert_eq!(Declustered::height_for(20_000_000_000_000, 16 << 20, 48), 1);
        assert_eq!(Declustered::height_for(3 << 30, K64, 100), 128);
        assert_eq!(Declustered::height_for(0, K64, 48), 1);
        // Fewer: four sweeps. 48 members of a little under 1 GiB (the metadata's MiB
        // off): 4 MiB rows, 5.3 sweeps, where 256 permutations gave 2 MiB.
        let gib_less = (1u64 << 30) - (4 << 20);
        assert_eq!(Declustered::height_for(gib_less, K64, 48), 64);
        assert_eq!(Declustered::height_for(gib_less, K64, 64), 32);
        assert_eq!(Declustered::height_for(gib_less, K64, 24), 128);
        assert_eq!(Declustered::height_for(256 << 20, K64, 12), 64);
        assert_eq!(Declustered::height_for(20_000_000_000_000, K64, 24), 256);
        // Whatever the member count, each member gets four whole sweeps or 256
        // permutations.
        for n in [4usize, 12, 24, 48, 60, 64, 200] {
            for size in [8u64 << 20, 100 << 20, 1 << 30, 5 << 30] {
                let h = Declustered::height_for(size, K64, n) as u64;
                let perms = size / K64 / h;
                assert!(
                    h == 1 || perms >= (4 * n as u64).min(256),
                    "{n} members of {size}: height {h}, {perms} permutations"
                );
            }
        }
    }

    /// The table is part of the on-disk format: these values are what every declustered
    /// array created so far was laid out by. If this test fails, the code that draws the
    /// table changed, and existing arrays would read their data from the wrong places.
    #[test]
    fn declustered_table_is_pinned() {
        let d = Decl::new(12, crate::layout::DECLUSTER_SEED, 1);
        let row0: Vec<usize> = (0..12).map(|c| d.member(0, c)).collect();
        let row65: Vec<usize> = (0..12).map(|c| d.member(65, c)).collect();
        assert_eq!(
            (row0, row65, d.checksum()),
            (
                vec![3, 4, 5, 6, 0, 10, 2, 7, 1, 9, 8, 11],
                vec![10, 5, 6, 3, 8, 7, 11, 4, 1, 0, 2, 9],
                3855896868
            )
        );
        // Height 1 (every array created before the height was recorded) is the map as it
        // was first written: row `t` is table row `t % 64`, shifted by `t / 64`.
        let n = d.n;
        for row in 0..(TABLE_ROWS * n * 2) as u64 {
            for col in 0..n {
                let t = (row % TABLE_ROWS as u64) as usize;
                let shift = ((row / TABLE_ROWS as u64) % n as u64) as usize;
                assert_eq!(
                    d.member(row, col),
                    (d.table[t * n + col] as usize + shift) % n
                );
            }
        }
    }

    #[test]
    fn declustered_rows_are_permutations_and_spare_is_exactly_balanced() {
        for map in [0u8, 1] {
            for (level, width, groups, spares, height) in [
                (Level::Raid6, 10, 2, 2, 1),
                (Level::Raid5, 4, 1, 1, 1),
                (Level::Ec { k: 3, m: 2 }, 5, 3, 1, 1),
                (Level::Raid6, 6, 1, 0, 1),
                (Level::Raid6, 10, 2, 2, 4),
                (Level::Raid5, 4, 1, 1, 16),
                (Level::Ec { k: 3, m: 2 }, 5, 3, 1, 3),
            ] {
                let n = (width * groups + spares) as usize;
                let rows = (TABLE_ROWS * n) as u64 * height as u64;
                let g = declustered_m(level, width, groups, spares, rows, height, map);
                g.validate().unwrap();
                let p = Placement::striped(&g);
                let d = p.declustered().unwrap();
                // Per member: chunks of data, of parity, and spare rows.
                let mut data = vec![0u64; n];
                let mut parity = vec![0u64; n];
                let mut spare = vec![0u64; n];
                for row in 0..rows {
                    let mut seen = vec![false; n];
                    for col in 0..n {
                        let m = d.member(row, col);
                        assert!(!seen[m], "{level}: row {row} uses member {m} twice");
                        seen[m] = true;
                        assert_eq!(d.column(row, m), col);
                    }
                    for s in p.spare_slots_at(row) {
                        assert_eq!(p.group_at(row, s), None);
                        spare[s] += 1;
                    }
                    for group in 0..groups as usize {
                        let addr = StripeAddr { group, stripe: row };
                        let slots = p.stripe_slots(addr);
                        for (shard, &slot) in slots.iter().enumerate() {
                            assert_eq!(p.slot(addr, shard), slot);
                            assert_eq!(p.pos_of(addr, shard), shard);
                            assert_eq!(p.shard_at(row, slot), shard);
                            assert_eq!(p.group_at(row, slot), Some(group));
                            match shard < p.k() {
                                true => data[slot] += 1,
                                false => parity[slot] += 1,
                            }
                        }
                    }
                }
                // Every member holds the same share of each: over TABLE_ROWS * n blocks of
                // `height` rows every member sits in every column TABLE_ROWS * height times.
                let per = |share: u64| vec![share * TABLE_ROWS as u64 * height as u64; n];
                let k = p.k() as u64;
                assert_eq!(data, per(k * groups as u64), "{level}");
                assert_eq!(parity, per((width as u64 - k) * groups as u64), "{level}");
                assert_eq!(spare, per(spares as u64), "{level}");
            }
        }
    }

    #[test]
    fn declustered_sets_span_every_member() {
        let g = declustered(Level::Raid6, 10, 2, 2, 64);
        let p = Placement::striped(&g);
        assert_eq!(g.members(), 22);
        assert_eq!(p.sets(), 1);
        assert_eq!(p.set_slots(0), 0..22);
        assert_eq!(p.set_of(21), 0);
        assert_eq!(p.groups(), 2);
        assert_eq!(g.capacity(), 64 * 2 * 8 * 4096);
    }

    proptest::proptest! {
        /// The distributed spare's map: with no more members spared than there are spare
        /// columns, every chunk of a row has a place, no member holds two, none is on a
        /// spared member; sparing one more member moves only the chunks it held or that
        /// lay on it, onto the row's spare columns.
        #[test]
        fn spared_rows_keep_every_chunk_on_its_own_member(
            n in 4usize..40,
            spares in 1usize..4,
            picks in proptest::collection::vec(0usize..1000, 1..4),
            row in 0u64..10_000,
            height in 1u32..300,
        ) {
            let spares = spares.min(n - 2);
            let cols = n - spares;
            let d = Decl::new(n, crate::layout::DECLUSTER_SEED, height);
            let mut spared: Vec<usize> = Vec::new();
            for p in picks.iter().take(spares) {
                let x = (0..n).map(|i| (p + i) % n).find(|m| !spared.contains(m)).unwrap();
                let before = d.resolved_row(row, cols, &spared);
                spared.push(x);
                let after = d.resolved_row(row, cols, &spared);
                let mut seen = std::collections::HashSet::new();
                for (c, m) in after.iter().enumerate() {
                    let m = m.expect("a place for every chunk");
                    proptest::prop_assert!(!spared.contains(&m));
                    proptest::prop_assert!(seen.insert(m), "member {} twice", m);
                    if before[c] != Some(m) {
                        // Moved: it was on x, and went to a spare column.
                        proptest::prop_assert_eq!(before[c], Some(x));
                        proptest::prop_assert!(d.column(row, m) >= cols);
                    }
                }
            }
        }

        /// With slots spared (and a transition under way to one more, or one fewer, at
        /// some row, some rows ahead of it marked): every volume block still maps to
        /// exactly one member block, which maps back to it; no stripe uses a member twice
        /// or a member its row's list spares; and the rows below the boundary (or marked
        /// ahead of it) differ from the rows above only where the transition moves
        /// chunks. Only a distributed rebuild marks rows, and only within the ring.
        #[test]
        fn spared_map_is_one_to_one(
            groups in 1u32..3,
            width in 4u32..9,
            spares in 1u32..3,
            picks in proptest::collection::vec(0usize..1000, 3),
            grow in proptest::bool::ANY,
            boundary in 0u64..40,
            first in proptest::option::of((0usize..1000, 0u64..41)),
            height in 1u32..6,
            ahead in proptest::collection::vec(0u64..40, 0..6),
            ring in 1usize..50,
        ) {
            let rows = 40;
            let g = declustered_m(Level::Raid6, width, groups, spares, rows, height, 1);
            let n = g.members();
            let p = Placement::striped(&g);
            let mut list: Vec<usize> = Vec::new();
            for x in picks.iter().take(spares as usize) {
                let m = (0..n).map(|i| (x + i) % n).find(|m| !list.contains(m)).unwrap();
                list.push(m);
            }
            let (from, to) = if grow {
                let from = list[..list.len() - 1].to_vec();
                (from, list.clone())
            } else {
                (list.clone(), list[..list.len() - 1].to_vec())
            };
            // A distributed rebuild may have a first pass: another slot out, the rows
            // where both hold chunks of one stripe moved up to its own boundary.
            let first = first.filter(|_| grow).map(|(y, fb)| {
                let y = (0..n).map(|i| (y + i) % n).find(|m| !list.contains(m)).unwrap();
                (y, fb.max(boundary))
            });
            p.set_spared_first(from.clone(), Some(to.clone()), boundary, first);
            let sp = p.spared();
            sp.ahead_init(ring);
            let mut marked = std::collections::HashSet::new();
            for &r in &ahead {
                let want = grow && r >= boundary && r < boundary + ring as u64;
                proptest::prop_assert_eq!(sp.mark_ahead(r), want, "row {}", r);
                if want {
                    marked.insert(r);
                }
            }
            for r in 0..rows {
                proptest::prop_assert_eq!(sp.is_ahead(r), marked.contains(&r));
            }
            let d = p.declustered().unwrap();
            let cols = (groups * width) as usize;
            let x_slot = to.last().copied().unwrap_or(0);
            let mut seen = std::collections::HashSet::new();
            for x in p.map(0, g.capacity()) {
                proptest::prop_assert!(seen.insert((x.slot, x.moff)), "two blocks at one place");
                proptest::prop_assert_eq!(p.locate(x.slot, x.moff), Some(x.buf_off));
                let row = x.addr.stripe;
                let moved_first = first.is_some_and(|(y, fb)| {
                    row < fb && d.shares_stripe(row, cols, width as usize, &from, x_slot, y)
                });
                let l = if row < boundary || moved_first || marked.contains(&row) {
                    &to
                } else {
                    &from
                };
                proptest::prop_assert!(!l.contains(&x.slot));
                let slots = p.stripe_slots(x.addr);
                let mut uniq = slots.clone();
                uniq.sort_unstable();
                uniq.dedup();
                proptest::prop_assert_eq!(uniq.len(), width as usize);
                for (shard, &slot) in slots.iter().enumerate() {
                    proptest::prop_assert!(!l.contains(&slot));
                    proptest::prop_assert_eq!(p.slot(x.addr, shard), slot);
                    proptest::prop_assert_eq!(p.shard_at(row, slot), shard);
                    proptest::prop_assert_eq!(p.group_at(row, slot), Some(x.addr.group));
                }
            }
            proptest::prop_assert_eq!(seen.len() as u64, g.capacity() / 4096);
        }

        /// Every volume block of a declustered layout maps to exactly one member block,
        /// which maps back to it; no stripe uses a member twice; spare rows hold no data.
        #[test]
        fn declustered_map_is_one_to_one(
            groups in 1u32..4,
            width in 3u32..12,
            spares in 0u32..4,
            parity in 1u32..4,
            rows in 1u64..80,
            height in 1u32..9,
        ) {
            let level = match parity {
                1 => Level::Raid5,
                2 if width >= 4 => Level::Raid6,
                _ => Level::Ec { k: (width - parity.min(width - 1)) as u16, m: parity.min(width - 1) as u16 },
            };
            let g = declustered_m(level, width, groups, spares, rows, height, 1);
            g.validate().unwrap();
            let p = Placement::striped(&g);
            let mut seen = std::collections::HashSet::new();
            for x in p.map(0, g.capacity()) {
                proptest::prop_assert_eq!(x.len, 4096);
                proptest::prop_assert!(seen.insert((x.slot, x.moff)), "two blocks at one place");
                proptest::prop_assert_eq!(p.locate(x.slot, x.moff), Some(x.buf_off));
                let slots = p.stripe_slots(x.addr);
                let mut uniq = slots.clone();
                uniq.sort_unstable();
                uniq.dedup();
                proptest::prop_assert_eq!(uniq.len(), width as usize);
                proptest::prop_assert!(slots.contains(&x.slot));
            }
            proptest::prop_assert_eq!(seen.len() as u64, g.capacity() / 4096);
            for row in 0..rows {
                for s in p.spare_slots_at(row) {
                    proptest::prop_assert_eq!(p.locate(s, row * 4096), None);
                }
            }
        }
    }

    /// A row marked ahead of the boundary stays resolved through the new list: its ring
    /// entry is taken by a row `len` further on only once the boundary has passed it.
    #[test]
    fn rows_marked_ahead_stay_moved_as_the_ring_turns() {
        let g = declustered_m(Level::Raid6, 6, 1, 2, 64, 1, 1);
        let p = Placement::striped(&g);
        p.set_spared(vec![], Some(vec![3]), 0);
        let sp = p.spared();
        assert!(!sp.mark_ahead(2), "marked before the ring was set up");
        sp.ahead_init(8);
        assert!(sp.mark_ahead(2) && sp.mark_ahead(7));
        assert!(
            !sp.mark_ahead(10),
            "marked beyond the ring: it would take row 2's entry"
        );
        assert_eq!(sp.list_at(2), &[3]);
        assert_eq!(sp.list_at(3), &[] as &[usize]);
        sp.boundary.store(3, Ordering::Release);
        assert!(sp.mark_ahead(10));
        assert!(!sp.is_ahead(2) && sp.is_ahead(10) && sp.is_ahead(7));
        assert_eq!(sp.list_at(2), &[3], "below the boundary");
        assert_eq!(sp.list_at(9), &[] as &[usize]);
        // A copy-back marks nothing: its old places are what a crash reads.
        p.set_spared(vec![3], Some(vec![]), 0);
        let sp = p.spared();
        sp.ahead_init(8);
        assert!(!sp.mark_ahead(1));
        assert_eq!(sp.list_at(1), &[3]);
    }

    /// `slot`, `shard_at` and `group_at` of a spared array resolve a row whole only where
    /// they must: every answer is the whole row's ([`Decl::resolved_row`]), for one, two
    /// and three members spared (three: more than the spare columns, so chunks with
    /// nowhere to go), on both maps, below and above a transition's boundary.
    #[test]
    fn spared_lookups_agree_with_the_whole_row() {
        for map in [0u8, 1] {
            let g = declustered_m(Level::Raid6, 6, 2, 2, 256, 4, map);
            let p = Placement::striped(&g);
            let d = p.declustered().expect("declustered");
            let (n, cols) = (g.members(), 12);
            for (from, to) in [
                (vec![], Some(vec![5])),
                (vec![5], None),
                (vec![5], Some(vec![5, 0])),
                (vec![5, 0], None),
                (vec![5, 0, 9], None),
            ] {
                p.set_spared(from, to, 96);
                let sp = p.spared();
                for row in 0..256u64 {
                    let list = p.list_of(&sp, row).to_vec();
                    let r = d.resolved_row(row, cols, &list);
                    for col in 0..cols {
                        let want = r[col].unwrap_or_else(|| d.member(row, col));
                        let addr = StripeAddr {
                            stripe: row,
                            group: col / 6,
                        };
                        assert_eq!(
                            p.slot(addr, col % 6),
                            want,
                            "map {map} row {row} col {col} {list:?}"
                        );
                    }
                    for slot in 0..n {
                        let want = r.iter().position(|&m| m == Some(slot));
                        assert_eq!(
                            p.group_at(row, slot),
                            want.map(|c| c / 6),
                            "map {map} row {row} slot {slot} {list:?}"
                        );
                        if let Some(c) = want {
                            assert_eq!(p.shard_at(row, slot), c % 6);
                        }
                    }
                }
            }
        }
    }

    /// md's raid5 left-symmetric table for 4 disks (from raid5.c's algorithm):
    /// stripe 0: D0 D1 D2 P ; stripe 1: D1 D2 P D0 ; stripe 2: D2 P D0 D1 ; stripe 3: P D0 D1 D2
    #[test]
    fn raid5_left_symmetric_matches_md() {
        let p = Placement::striped(&geo(Level::Raid5, 4, 1));
        let table = [[0, 1, 2, 9], [1, 2, 9, 0], [2, 9, 0, 1], [9, 0, 1, 2]];
        for (t, row) in table.iter().enumerate() {
            for (slot, &want) in row.iter().enumerate() {
                let shard = p.shard_at(t as u64, slot);
                let got = if shard == 3 { 9 } else { shard };
                assert_eq!(got, want, "stripe {t} slot {slot}");
            }
        }
    }

    /// md raid6 left-symmetric, 5 disks (raid5.c: pd = n-1 - t%n, qd = pd+1, data from pd+2):
    /// stripe 0 = Q D0 D1 D2 P, stripe 1 = D0 D1 D2 P Q, ...
    #[test]
    fn raid6_left_symmetric_matches_md() {
        let p = Placement::striped(&geo(Level::Raid6, 5, 1));
        // P = 8, Q = 9
        let table = [
            [9, 0, 1, 2, 8],
            [0, 1, 2, 8, 9],
            [1, 2, 8, 9, 0],
            [2, 8, 9, 0, 1],
            [8, 9, 0, 1, 2],
        ];
        for (t, row) in table.iter().enumerate() {
            for (slot, &want) in row.iter().enumerate() {
                let got = match p.shard_at(t as u64, slot) {
                    3 => 8,
                    4 => 9,
                    s => s,
                };
                assert_eq!(got, want, "stripe {t} slot {slot}");
            }
        }
    }

    #[test]
    fn slots_and_shards_are_inverse_in_every_group() {
        for level in [
            Level::Raid5,
            Level::Raid6,
            Level::Ec { k: 5, m: 3 },
            Level::Raid0,
            Level::Raid10,
        ] {
            let w = match level {
                Level::Ec { k, m } => (k + m) as u32,
                _ => 8,
            };
            let p = Placement::striped(&geo(level, w, 3));
            for group in 0..3 {
                for stripe in 0..20 {
                    let addr = StripeAddr { group, stripe };
                    for shard in 0..w as usize {
                        let slot = p.slot(addr, shard);
                        assert!(p.group_slots(group).contains(&slot));
                        assert_eq!(p.group_of(slot), group);
                        assert_eq!(p.shard_at(stripe, slot), shard, "{level} {addr:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn map_covers_the_range_and_maps_back() {
        let g = geo(Level::Raid6, 6, 3);
        let p = Placement::striped(&g);
        let pieces = p.map(4096 * 5 + 512, 4096 * 20);
        assert_eq!(pieces.iter().map(|x| x.len).sum::<u64>(), 4096 * 20);
        assert_eq!(pieces[0].chunk_off, 512);
        // stripe data = 4 chunks; logical chunk 5 = stripe 1 -> group 1, group stripe 0, index 1
        let a = pieces[0].addr;
        assert_eq!((a.group, a.stripe, pieces[0].index), (1, 0, 1));
        for x in &pieces {
            let back = p.locate(x.slot, x.moff).expect("data");
            assert_eq!(back, 4096 * 5 + 512 + x.buf_off, "{x:?}");
        }
        // Parity is not volume data.
        let parity = p.slot(
            StripeAddr {
                group: 0,
                stripe: 0,
            },
            4,
        );
        assert_eq!(p.locate(parity, 0), None);
    }

    #[test]
    fn every_volume_block_maps_to_one_member_block_and_back() {
        for (level, w, groups) in [
            (Level::Raid0, 3, 1),
            (Level::Raid5, 4, 2),
            (Level::Raid6, 6, 2),
            (Level::Ec { k: 3, m: 2 }, 5, 1),
            (Level::Raid10, 2, 3),
        ] {
            let g = geo(level, w, groups);
            let p = Placement::striped(&g);
            let mut seen = std::collections::HashSet::new();
            for x in p.map(0, g.capacity()) {
                for b in (0..x.len).step_by(4096) {
                    assert!(
                        seen.insert((x.slot, x.moff + b)),
                        "{level}: two blocks at once"
                    );
                    assert_eq!(p.locate(x.slot, x.moff + b), Some(x.buf_off + b));
                }
            }
            assert_eq!(seen.len() as u64, g.capacity() / 4096);
        }
        // Every copy of a mirror maps back to the same data.
        let p = Placement::striped(&geo(Level::Raid10, 3, 2));
        let x = p.map(4096 * 3, 4096)[0];
        for slot in p.group_slots(x.addr.group) {
            assert_eq!(p.locate(slot, x.moff), Some(4096 * 3));
        }
    }

    #[test]
    fn concat_appends_members_and_locks_per_member_chunk() {
        let g = Geometry {
            level: Level::Concat,
            groups: 1,
            width: 3,
            chunk: 4096,
            member_size: 4096 * 8,
            data_offset: 1 << 20,
            dedicated: 0,
            declustered: None,
        };
        let p = Placement::new(&g, &[4096 * 2, 4096 * 8, 4096 * 3]);
        assert_eq!(p.volume_size(&g), 4096 * 13);
        assert_eq!(p.groups(), 3);
        let x = p.map(4096, 4096 * 3);
        assert_eq!(x.len(), 3);
        assert_eq!((x[0].slot, x[0].moff), (0, 4096));
        assert_eq!((x[1].slot, x[1].moff, x[1].addr.stripe), (1, 0, 0));
        assert_eq!((x[2].slot, x[2].moff, x[2].addr.stripe), (1, 4096, 1));
        assert_eq!(p.locate(2, 4096), Some(4096 * 11));
    }

    /// A level change that adds parity keeps every shard of the old layout where it was
    /// and puts the new parity on the added slot of each group.
    #[test]
    fn dedicated_parity_keeps_the_old_layout_in_place() {
        for (old, new) in [
            (Level::Raid5, Level::Raid6),
            (Level::Raid0, Level::Raid5),
            (Level::Ec { k: 4, m: 2 }, Level::Ec { k: 4, m: 3 }),
        ] {
            let w = match old {
                Level::Ec { k, m } => (k + m) as u32,
                _ => 5,
            };
            let before = Placement::with_stride(&geo(old, w, 3), &[], w as usize + 1);
            let g = Geometry {
                dedicated: 1,
                ..geo(new, w + 1, 3)
            };
            g.validate().unwrap();
            let after = Placement::striped(&g);
            for group in 0..3 {
                for stripe in 0..40 {
                    let addr = StripeAddr { group, stripe };
                    let old_shards = w as usize;
                    for shard in 0..old_shards {
                        assert_eq!(before.slot(addr, shard), after.slot(addr, shard), "{new}");
                    }
                    let added = after.slot(addr, old_shards);
                    assert_eq!(added, group * (w as usize + 1) + w as usize);
                    for slot in after.group_slots(group) {
                        assert_eq!(after.slot(addr, after.shard_at(stripe, slot)), slot);
                    }
                }
            }
            assert_eq!(
                after.map(0, g.capacity()).len(),
                before.map(0, g.capacity()).len()
            );
        }
    }
}
