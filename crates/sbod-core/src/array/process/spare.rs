//! The distributed spare space of a declustered layout (docs/ENGINE.md, "Declustered
//! layouts"): the **distributed rebuild**, which rebuilds a failed slot's chunks into the
//! spare space of every row (reading from and writing to every survivor), and the
//! **copy-back**, which copies them from there onto the slot's replacement. Both are one
//! transition of the spared list `L -> L'` (`placement::Spared`), walked in member row
//! order a window of rows at a time, `SBOD_DECL_WINDOWS` windows under way (the next
//! window's reads and rebuilds issued while the last one's writes finish: no barrier
//! between windows leaves the members idle):
//!
//! 1. the window's chunks whose member differs between `L` and `L'` are cut into blocks
//!    (the rows of one permutation; the whole window where the row height is below
//!    [`SCHED_HEIGHT`]), started in row order, [`BLOCKS_IN_FLIGHT`] under way at once
//!    ([`BUSY_BLOCKS`] while clients are busy); a block whose runs are read ahead has its
//!    stripes locked as it starts (client requests to them wait from then on), any other
//!    block one row at a time, while that row's chunks move;
//! 2. every chunk of a block under way is written to its new place: read from its old
//!    place, else rebuilt from its stripe (`Family::recover`), at most [`BLOCK_DEPTH`] of
//!    a block and `IN_FLIGHT` chunks at once over all the windows under way (and, while
//!    clients are busy, at most `SBOD_DECL_ROOM` of them touching any one member:
//!    [`Room`]); while clients are idle, a block's members' runs are read ahead, one
//!    request a member ([`Runs`], within `SBOD_DECL_RUNS` of memory), and the block's
//!    chunks rebuilt from them and written a run a member ([`Array::move_block`]);
//! 3. the row boundary moves past the window in memory once every chunk of it **and of
//!    every window before it** is written, before the window's locks are let go (a
//!    distributed rebuild's main pass lets a block's locks go as soon as its chunks are
//!    written, its rows marked ahead of the boundary: `Spared::mark_ahead`; a block
//!    whose runs are not read ahead is locked a row at a time, while the row's chunks
//!    move). A
//!    copy-back first flushes the members and records the boundary in the superblocks
//!    (with `mgmt` held, so no other superblock write records an older one): after it,
//!    writes go to the new places only. A distributed rebuild records it every few
//!    seconds (flushed first, the boundary as it was before the flush; beside the walk,
//!    which goes on meanwhile): its old places are on the failed member, so below a
//!    boundary not yet recorded a crash simply rebuilds those chunks from parity again.
//!
//! So a crash at any point leaves the recorded boundary below every row whose new places
//! were not yet all durable, and rows at and above it are read in `L`, whose places the
//! transition never overwrote: a distributed rebuild writes only spare space no chunk of
//! `L` holds, and a copy-back only the replacement (only the last slot spared is copied
//! back: `Decl::resolved_row` then moves nothing else). A copy-back is recorded before its
//! first window moves; a distributed rebuild with its first boundary (a crash before it
//! reads `L`, and the next start begins the transition again). Either is resumed from the
//! recorded boundary at the next start.

use super::{ProcessKind, Throttle};
use crate::array::{Array, State};
use crate::buf::{AlignedBuf, SharedBuf};
use crate::datapath::WriteFault;
use crate::dev::IoClass;
use crate::error::{Error, Result};
use crate::layout::Geometry;
use crate::locks::StripeGuard;
use crate::placement::Decl;
use crate::placement::StripeAddr;
use crate::reason;
use crate::superblock::{OutReason, SlotState};
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use std::collections::VecDeque;
use std::future::Future;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Member bytes a window of rows spans (on each member). Windows end in a barrier (every
/// chunk written before the boundary moves), so larger ones keep the members busier: on
/// modelled disks 16 MiB windows rebuilt 24 members in 3.8 s where 4 MiB ones took 5.0 s
/// (docs/PERFORMANCE.md).
const WINDOW_BYTES: u64 = 16 << 20;

/// Chunks a transition moves at once (each holds its stripe's reads), over all the
/// windows under way: at least this many, and at least [`BLOCKS_IN_FLIGHT`] row heights
/// (at most [`MAX_IN_FLIGHT`]).
const IN_FLIGHT: usize = 64;

/// Blocks (the rows of one permutation) a transition keeps under way at once where the
/// row height is at least [`SCHED_HEIGHT`], started in row order, so that every member
/// has a run to stream: a block's chunks touch only its stripe's members (a group's) and
/// a spare's, 10 of them with groups of 8+2, each a run of `height` chunks.
const BLOCKS_IN_FLIGHT: usize = 12;

/// Chunks of one block in flight at most: enough for each of its members to stream its
/// run (the drive reorders what it holds), few enough that [`BLOCKS_IN_FLIGHT`] blocks
/// fit in [`MAX_IN_FLIGHT`].
const BLOCK_DEPTH: usize = 32;

/// Blocks under way at once while clients are busy: one block's members (a group's and a
/// spare's, as a classic rebuild's) take the transition's I/O, the rest serve clients.
const BUSY_BLOCKS: usize = 1;

/// The least row height whose blocks are scheduled as units: lower, a block is too few
/// chunks to keep its members busy, and the chunks of a window go in row order.
const SCHED_HEIGHT: u64 = 4;

/// The most chunks a transition moves at once, whatever the row height.
const MAX_IN_FLIGHT: usize = 512;

/// The most bytes of one member read as one run (a block's run is cut in parts of this
/// many rows' chunks): 4 MiB, 64 rows of 64 KiB chunks, the row height of a 1 GiB member
/// (a real disk's 16 MiB blocks go in four parts).
const RUN_BYTES: u64 = 4 << 20;

/// Blocks under way at most with runs read ahead (the memory budget, `SBOD_DECL_RUNS`,
/// sets how many fit: 25 of 8+2 groups' 4 MiB runs reading at once in the default 1 GiB).
const MAX_RUN_BLOCKS: usize = 128;

/// Runs a distributed rebuild keeps queued on each member at most, the memory budget
/// allowing (blocks reading at once: this many times the members over `k`): enough for
/// a drive to order its queue, not so many that the blocks wait on long queues. At slow=8
/// (docs/PERFORMANCE.md), 24 members of 1 GiB rebuilt at 0.95 of the bound with 12
/// blocks of 8+2 reading at once and 0.78 with 25; 48 members of 4 GiB at 0.80 with 25
/// and 0.69 with 12.
const RUNS_A_MEMBER: u64 = 4;

/// Parts of one tall block under way at once while runs are read ahead (see
/// [`next_part`]): 48 members of 4 GiB (blocks of 16 MiB a member, parts of 4 MiB) rebuilt
/// in 48.2 s with one, 53.7 s with two, 57.3-63.7 s with no limit (docs/PERFORMANCE.md).
const PARTS_PER_BLOCK: usize = 1;

/// The waiting blocks [`next_part`] weighs at most when it balances the members' queues.
const BALANCE_LOOK: usize = 256;

/// Windows open at most while runs are read ahead and clients are idle: with two, the
/// blocks of the second were all started while the front window's last block waited for
/// its slowest member, and the other members went idle (48 members of 1 GiB at slow=8:
/// 12.6 s against 18.0 s; docs/PERFORMANCE.md).
const RUN_WINDOWS: usize = 8;

/// The most rows a distributed rebuild marks ahead of its boundary (`Spared::mark_ahead`;
/// 2 MiB of ring): its windows run no further ahead than this with any chunk size.
const AHEAD_ROWS: u64 = 1 << 18;

/// How often a distributed rebuild records its boundary (flushed first): a crash
/// rebuilds at most this much of the walk again.
const RECORD_EVERY: Duration = Duration::from_secs(2);

/// A member's run read ahead: its bytes once read and verified (None: it could not be, and
/// its chunks are read one by one as before, which heals or fails as a chunk read does).
type RunRead = futures::future::Shared<futures::future::BoxFuture<'static, Option<SharedBuf>>>;

/// The runs of a block read ahead (docs/ENGINE.md, "A transition"): for each member a
/// chunk of the block is read from (a rebuilt chunk's stripe members, a copied chunk's
/// old place), its rows of the block as one request, issued as the block starts (its
/// stripes locked), so each member streams its run without waiting for the others, and
/// the block's chunks are rebuilt from the runs once all have arrived.
struct Runs {
    chunk: u64,
    /// (slot, rows, the read).
    reads: Vec<(usize, Range<u64>, RunRead)>,
}

impl Runs {
    /// Every run read (or failed).
    async fn ready(&self) {
        futures::future::join_all(self.reads.iter().map(|r| r.2.clone())).await;
    }

    /// The first `len` bytes of row `row`'s chunk on `slot`, where its run was read.
    fn get(&self, slot: usize, row: u64, len: u64) -> Option<SharedBuf> {
        let (_, rows, read) = self
            .reads
            .iter()
            .find(|(s, rows, _)| *s == slot && rows.contains(&row))?;
        let buf = read.peek()?.as_ref()?;
        let at = ((row - rows.start) * self.chunk) as usize;
        (at + len as usize <= buf.len()).then(|| buf.slice(at..at + len as usize))
    }
}

/// A window of rows under way: the stripes of its blocks done locked until the boundary
/// passes it (but a distributed rebuild's blocks whose rows are marked ahead of it).
struct Window<'a> {
    /// The row after its last.
    end: u64,
    guards: Vec<StripeGuard<'a>>,
    /// Chunks not yet written.
    left: usize,
    bytes: u64,
}

/// The chunks of one block (the rows of one permutation) in a window, moved as a unit,
/// under way until its last chunk is written. With its runs read ahead its stripes are
/// locked as it starts, and once it is done a distributed rebuild's main pass marks its
/// rows ahead of the boundary and lets its locks go (`Spared::mark_ahead`); otherwise
/// they go to its window, let go when the boundary passes it. Without runs, each row is
/// locked only while its chunks move, and marked (or its locks given to the window) as
/// they are written.
struct Blk<'a> {
    /// Its window's sequence number.
    win: u64,
    /// Its permutation (its first row over the row height): the parts of one tall
    /// block share it, and its members.
    perm: u64,
    /// Chunks not yet issued, in row order.
    moves: VecDeque<Move>,
    /// Chunks not yet written.
    left: usize,
    /// Chunks in flight.
    flying: usize,
    /// Its stripes' locks, once started.
    guards: Vec<StripeGuard<'a>>,
    /// The rows it locked, in order.
    rows: Vec<u64>,
    /// Locked as a whole as it started (its runs read ahead); else each row is locked
    /// while its chunks move.
    locked: bool,
    /// The members its chunks touch (read or written), each once.
    members: Vec<usize>,
}

/// The blocks of a window's chunks (`moves`, in row order): the chunks of each `height`
/// rows of one permutation.
fn window_blocks<'a>(moves: Vec<Move>, unit: u64, height: u64, win: u64) -> Vec<Blk<'a>> {
    let mut out: Vec<Blk<'a>> = Vec::new();
    let mut last_block = None;
    for mv in moves {
        let block = mv.addr.stripe / unit;
        if last_block != Some(block) {
            last_block = Some(block);
            out.push(Blk {
                win,
                perm: mv.addr.stripe / height.max(1),
                moves: VecDeque::new(),
                left: 0,
                flying: 0,
                guards: Vec::new(),
                rows: Vec::new(),
                locked: false,
                members: Vec::new(),
            });
        }
        let b = out.last_mut().expect("pushed");
        b.members.extend_from_slice(&mv.members);
        b.moves.push_back(mv);
        b.left += 1;
    }
    for b in &mut out {
        b.members.sort_unstable();
        b.members.dedup();
    }
    out
}

/// The waiting block to start next: the first in row order whose permutation has fewer
/// than `parts` parts under way. A tall block read ahead in runs is cut in parts of
/// [`RUN_BYTES`] a member; started in row order, the memory budget's parts were a few
/// blocks' in a row, so only those blocks' members (10 of 48 each) worked while the rest
/// went idle. With at most `parts` of one block under way, the budget spreads over as many
/// blocks, and each member still reads its part of a block in order.
///
/// With `balance` (the members in service, while runs are read ahead): of the first
/// [`BALANCE_LOOK`] such blocks, the one whose busiest member has the fewest blocks under
/// way, the first in row order among equals. A block's chunks are rebuilt once every one of
/// its runs has arrived, so it waits for its slowest member's queue; started in row order,
/// the blocks piled onto some members' queues while others ran dry (48 members at slow=8:
/// each member's media busy 61-66% of the rebuild).
fn next_part(
    waiting: &VecDeque<Blk<'_>>,
    active: &[(u64, Blk<'_>)],
    parts: usize,
    balance: Option<&[bool]>,
) -> Option<usize> {
    let fits = |b: &Blk<'_>| {
        parts == usize::MAX || active.iter().filter(|(_, a)| a.perm == b.perm).count() < parts
    };
    let Some(serving) = balance else {
        return waiting.iter().position(fits);
    };
    let mut load = vec![0u32; serving.len()];
    for (_, a) in active {
        for &m in &a.members {
            load[m] += 1;
        }
    }
    let busiest = |b: &Blk<'_>| {
        b.members
            .iter()
            .filter(|&&m| serving[m])
            .map(|&m| load[m])
            .max()
            .unwrap_or(0)
    };
    waiting
        .iter()
        .take(BALANCE_LOOK)
        .enumerate()
        .filter(|(_, b)| fits(b))
        .min_by_key(|&(i, b)| (busiest(b), i))
        .map(|(i, _)| i)
}

/// One chunk to move: its stripe, old and new place, and every member it may touch (the
/// stripe's members in the old list, which a rebuild reads, and the new place).
struct Move {
    addr: StripeAddr,
    old: Option<usize>,
    new: Option<usize>,
    members: Vec<usize>,
}

/// Why a transition stops before its last row.
enum Stop {
    /// Cancelled, or the array closing: resumed at the next start.
    Quit,
    /// The array failed.
    Failed(String),
    /// A copy-back's replacement is out.
    TargetOut,
    /// Another slot went out during a distributed rebuild: its first pass is due.
    First(usize),
}

/// Which walk of a distributed rebuild (see `placement::Spared`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pass {
    /// Only the rows where the slot spared and the first pass's other slot hold chunks
    /// of one stripe, moving `first_boundary`.
    First,
    /// Every row (but those the first pass moved), moving `boundary`.
    Main,
}

/// The slot a distributed rebuild of `target` takes its first pass for: another slot out
/// (not in service, not spared), the one out first.
fn first_candidate(st: &State, sp: &crate::placement::Spared, target: usize) -> Option<usize> {
    (0..st.slots.len())
        .filter(|&i| i != target && st.slots[i].state != SlotState::Active && !sp.involves(i))
        .min_by_key(|&i| st.slots[i].out.map_or(0, |o| o.event))
}

/// The first pass done: flushed, and its end recorded.
async fn dp_flush_and_record(a: &Array, sp: &crate::placement::Spared, rows: u64) -> Result<()> {
    a.dp().flush().await?;
    a.record_spares(|| sp.first_recorded.store(rows, Ordering::Release))
        .await
}

/// The chunks of rows `rows` whose place differs between the lists `from` and `to`, in row
/// order (and within a row, by column).
fn window_moves(
    d: &Decl,
    g: &Geometry,
    rows: Range<u64>,
    from: &[usize],
    to: &[usize],
) -> Vec<Move> {
    let w = g.width as usize;
    let cols = g.groups as usize * w;
    let mut moves = Vec::new();
    for row in rows {
        let old = d.resolved_row(row, cols, from);
        let new = d.resolved_row(row, cols, to);
        for c in 0..cols {
            if old[c] != new[c] {
                let group = c / w;
                let mut members: Vec<usize> = old[group * w..(group + 1) * w]
                    .iter()
                    .flatten()
                    .copied()
                    .chain(new[c])
                    .collect();
                members.sort_unstable();
                members.dedup();
                moves.push(Move {
                    addr: StripeAddr { group, stripe: row },
                    old: old[c],
                    new: new[c],
                    members,
                });
            }
        }
    }
    moves
}

/// Per-member room for clients (docs/ENGINE.md, "Declustered layouts"): while client
/// requests reach the members, a chunk of the transition enters only with a place on each
/// member it touches, `SBOD_DECL_ROOM` of them a member, so a client request to a member
/// waits behind at most that many of the transition's I/Os there, not behind its whole
/// depth. Idle, it takes no places (the transition keeps every member as busy as it can).
struct Room {
    places: Vec<Arc<Semaphore>>,
    fg_last: u64,
    checked: Instant,
    busy: bool,
    /// When clients were last seen busy (as the transition started: the last client
    /// request any member in service had).
    last_busy: Instant,
}

impl Room {
    /// How often whether clients are busy is looked at again.
    const LOOK: Duration = Duration::from_millis(50);

    /// Whether client requests reach the members now (looked at every [`Room::LOOK`];
    /// never with `SBOD_DECL_ROOM=0`).
    fn look(&mut self, a: &Array) -> bool {
        if !self.places.is_empty() && self.checked.elapsed() >= Self::LOOK {
            let fg = Self::fg(a);
            self.busy = fg != self.fg_last;
            self.fg_last = fg;
            self.checked = Instant::now();
            if self.busy {
                self.last_busy = self.checked;
            }
        }
        self.busy
    }

    /// How long clients must have been idle (and the transition running) before runs
    /// are read ahead: a run of 4 MiB queued on a member holds a client's request behind
    /// it, and the blocks started with runs keep their stripes locked until the boundary
    /// passes them, so a transition that starts as clients come (a failure under load)
    /// starts chunk by chunk.
    const QUIET: Duration = Duration::from_secs(1);

    /// Whether clients have been idle for [`Room::QUIET`] (looked at now).
    fn quiet(&mut self, a: &Array) -> bool {
        !self.look(a) && self.last_busy.elapsed() >= Self::QUIET
    }

    fn new(a: &Array, slots: usize) -> Room {
        let share = crate::tuning::decl_room();
        Room {
            places: if share == 0 {
                Vec::new()
            } else {
                (0..slots)
                    .map(|_| Arc::new(Semaphore::new(share)))
                    .collect()
            },
            fg_last: Self::fg(a),
            checked: Instant::now(),
            busy: false,
            last_busy: Self::last_request(a),
        }
    }

    /// When a member in service last had a client request: a transition that starts
    /// after clients were idle for [`Room::QUIET`] (a failure on an idle array, a
    /// rebuild resumed as the array starts) reads runs ahead from its first block; one
    /// that starts as clients come waits until they have been idle that long.
    fn last_request(a: &Array) -> Instant {
        let now = Instant::now();
        let idle = a
            .dp()
            .state
            .load()
            .live_members()
            .iter()
            .map(|m| m.stats.client_idle().unwrap_or(Self::QUIET))
            .min()
            .unwrap_or(Self::QUIET);
        now.checked_sub(idle.min(Self::QUIET)).unwrap_or(now)
    }

    /// Client requests the members have had.
    fn fg(a: &Array) -> u64 {
        a.dp()
            .state
            .load()
            .live_members()
            .iter()
            .map(|m| m.stats.fg_ops.load(Ordering::Relaxed))
            .sum()
    }

    /// The places `mv` needs, once they are free (none while clients are idle). Taken in
    /// slot order, as every chunk takes them, so no two chunks wait on each other.
    fn enter(
        &mut self,
        a: &Array,
        mv: &Move,
    ) -> impl Future<Output = Vec<OwnedSemaphorePermit>> + Send + 'static {
        self.look(a);
        let sems: Vec<Arc<Semaphore>> = if self.busy {
            // Only members in service: a failed one (the slot a distributed rebuild
            // spares, or another out) takes no I/O, and counting it would hold every
            // chunk of its stripes to its few places.
            let st = a.dp().state.load();
            mv.members
                .iter()
                .filter(|&&m| {
                    matches!(
                        st.slots.get(m).map(|s| s.state),
                        Some(SlotState::Active | SlotState::Rebuilding)
                    )
                })
                .filter_map(|&m| self.places.get(m).cloned())
                .collect()
        } else {
            Vec::new()
        };
        async move {
            let mut held = Vec::with_capacity(sems.len());
            for s in sems {
                held.push(s.acquire_owned().await.expect("never closed"));
            }
            held
        }
    }
}

impl Array {
    /// The transition of the distributed spare space due now, if any: the list to go to.
    /// One under way is resumed; else the last slot spared is copied back when a member
    /// is rebuilding in it (a replacement, or the old member back); else the failed slot
    /// that failed first is spared, while spare space is left.
    pub(super) fn spare_work(&self, st: &State) -> Option<Vec<usize>> {
        let d = self.dp().geometry.declustered?;
        if st.failed.is_some() {
            return None;
        }
        let sp = self.dp().map.spared();
        if let Some(to) = &sp.to {
            return Some(to.clone());
        }
        if let Some(&x) = sp.from.last() {
            let s = &st.slots[x];
            if s.state == SlotState::Rebuilding && s.member.is_some() {
                return Some(sp.from[..sp.from.len() - 1].to_vec());
            }
        }
        if sp.from.len() >= d.spares as usize {
            return None;
        }
        let x = (0..st.slots.len())
            .filter(|&i| st.slots[i].state == SlotState::Failed && !sp.from.contains(&i))
            .min_by_key(|&i| st.slots[i].out.map_or(0, |o| o.event))?;
        let mut to = sp.from.clone();
        to.push(x);
        Some(to)
    }

    /// The failed slots a hot spare may take: those the distributed spare space will not
    /// (all of them but declustered layouts' first failures, while spare space is left).
    pub(crate) fn spare_space_takes(&self, st: &State) -> Vec<usize> {
        let Some(d) = self.dp().geometry.declustered else {
            return Vec::new();
        };
        let sp = self.dp().map.spared();
        let list = sp.to.as_ref().unwrap_or(&sp.from);
        let room = (d.spares as usize).saturating_sub(list.len());
        let mut failed: Vec<usize> = (0..st.slots.len())
            .filter(|&i| {
                matches!(st.slots[i].state, SlotState::Failed | SlotState::Empty) && !sp.involves(i)
            })
            .collect();
        failed.sort_by_key(|&i| st.slots[i].out.map_or(0, |o| o.event));
        failed.truncate(room);
        failed
    }

    /// Walk the transition due (see the module's steps), from its recorded boundary.
    pub(super) async fn spare_transition(self: &Arc<Self>) -> Result<()> {
        let g = self.dp().geometry.clone();
        let chunk = g.chunk as u64;
        let rows = g.member_size.div_ceil(chunk);
        let handle = self.claim(ProcessKind::Rebuild, rows * chunk)?;
        // Decided with the process slot held: another may have run meanwhile.
        let Some(to) = self.spare_work(&self.dp().state.load_full()) else {
            handle.finish(None);
            return Ok(());
        };
        let result = self.spare_walk(&handle, to, rows).await;
        handle.finish(result.as_ref().err().map(|e| e.to_string()));
        result
    }

    async fn spare_walk(
        self: &Arc<Self>,
        handle: &super::ProcessHandle,
        to: Vec<usize>,
        rows: u64,
    ) -> Result<()> {
        let g = self.dp().geometry.clone();
        let chunk = g.chunk as u64;
        let sp = self.dp().map.spared();
        if sp.to.as_ref() != Some(&to) {
            // Requests in flight drain first: a read that found its place in the old state
            // is done before a place can be reused.
            {
                let _x = self.gate.exclusive().await;
                self.dp()
                    .map
                    .set_spared(sp.from.clone(), Some(to.clone()), 0);
            }
            // A copy-back is recorded before any chunk moves. A distributed rebuild is
            // recorded with its first boundary (or as it ends, or as a first pass
            // starts): until then a crash reads every row in the list as it was, whose
            // places it never writes (only spare space no chunk of the list holds; the
            // chunks it moves were on the failed member, and are rebuilt from parity
            // again), as below any boundary not yet recorded. One superblock write to
            // every member less as it starts: at 48 modelled disks, 0.4 s of a 10 s
            // rebuild (docs/PERFORMANCE.md).
            if to.len() < sp.from.len() {
                self.record_spares(|| {}).await?;
            }
        }
        let sp = self.dp().map.spared();
        let from = sp.from.clone();
        let copyback = to.len() < from.len();
        let target = if copyback {
            from.last().copied()
        } else {
            to.last().copied()
        };
        let target = target.expect("a transition changes the list");
        tracing::info!(
            array = %self.dp().name,
            slot = target,
            from = ?from,
            to = ?to,
            row = sp.boundary.load(Ordering::Acquire),
            "{}",
            if copyback { "copy-back from the distributed spare space" } else { "distributed rebuild into the spare space" }
        );
        // The first pass (docs/ENGINE.md, "Order"): while another slot is out, the
        // stripes that lost a chunk on both are rebuilt before the rest. Resumed if one
        // was recorded; started now if a slot is out already.
        let mut pass = Pass::Main;
        if !copyback {
            if sp.first().is_none() {
                let st = self.dp().state.load_full();
                if let Some(y) = first_candidate(&st, &sp, target) {
                    self.begin_first(&sp, y).await?;
                }
            }
            if sp.first().is_some() && sp.first_boundary.load(Ordering::Acquire) < rows {
                pass = Pass::First;
            }
        }
        let stop = loop {
            match self
                .spare_pass(handle, &sp, &to, rows, pass, copyback, target)
                .await?
            {
                None if pass == Pass::First => {
                    // Durable and recorded at once: every stripe that lost two chunks is
                    // back to one.
                    dp_flush_and_record(self, &sp, rows).await?;
                    tracing::info!(array = %self.dp().name, slot = target, "distributed rebuild: the stripes that lost two chunks are back to one; the rest follows");
                    pass = Pass::Main;
                }
                None => break None,
                Some(Stop::First(y)) => {
                    self.begin_first(&sp, y).await?;
                    pass = Pass::First;
                }
                Some(s) => break Some(s),
            }
        };
        match stop {
            Some(Stop::Quit) => return Ok(()),
            Some(Stop::Failed(why)) => return Err(Error::Failed(why.into())),
            Some(Stop::TargetOut) => {
                // The replacement failed (or went): the rows copied back lose their copy
                // on it, which their stripes' parity still has. The slot is simply out
                // again, as before the copy-back, and is spared anew from the start.
                tracing::warn!(array = %self.dp().name, slot = target, "copy-back stopped: its member is out");
                let _g = self.mgmt.lock().await;
                self.dp().map.set_spared(to.clone(), None, 0);
                let mut new = (*self.dp().state.load_full()).clone();
                self.decide_failed(&mut new);
                let lost = self.commit(new).await;
                drop(_g);
                for m in lost {
                    self.fail_member(&m, OutReason::MetadataWrite).await;
                }
                return Ok(());
            }
            // Taken by the loop above.
            Some(Stop::First(_)) | None => {}
        }
        handle.done.store(rows * chunk, Ordering::Relaxed);
        // Every row moved (and durable): `to` is the list, and a slot copied back is in
        // service.
        self.dp().flush().await?;
        let _g = self.mgmt.lock().await;
        self.dp().map.set_spared(to.clone(), None, 0);
        let mut new = (*self.dp().state.load_full()).clone();
        let s = &mut new.slots[target];
        if copyback && s.state == SlotState::Rebuilding {
            s.state = SlotState::Active;
            s.out = None;
            s.note = None;
            s.bitmap_recovery = false;
            s.recovery = Arc::new(AtomicU64::new(g.member_size));
        }
        // A hot spare, if any, takes the slot now spared: copied back at once.
        self.take_spares(&mut new);
        self.decide_failed(&mut new);
        let lost = self.commit(new).await;
        drop(_g);
        tracing::info!(array = %self.dp().name, slot = target, "{}", if copyback { "copy-back complete" } else { "distributed rebuild complete: full redundancy" });
        for m in lost {
            self.fail_member(&m, OutReason::MetadataWrite).await;
        }
        self.kick();
        Ok(())
    }

    /// Start the first pass for slot `y` (at the boundary: the rows below it are moved
    /// already), recorded before it moves.
    async fn begin_first(&self, sp: &crate::placement::Spared, y: usize) -> Result<()> {
        tracing::info!(array = %self.dp().name, slot = y, "distributed rebuild: the stripes that also lost a chunk on slot {y} first");
        let b = sp.boundary.load(Ordering::Acquire);
        sp.first_recorded
            .store(sp.recorded.load(Ordering::Acquire), Ordering::Release);
        sp.first_boundary.store(b, Ordering::Release);
        sp.first_slot.store(y, Ordering::Release);
        self.record_spares(|| {}).await
    }

    /// One walk of the transition `sp` (see the module's steps): `pass` says which rows
    /// and which boundary. Returns why it stopped before the last row (None: it got there).
    #[allow(clippy::too_many_arguments)]
    async fn spare_pass(
        self: &Arc<Self>,
        handle: &super::ProcessHandle,
        sp: &Arc<crate::placement::Spared>,
        to: &[usize],
        rows: u64,
        pass: Pass,
        copyback: bool,
        target: usize,
    ) -> Result<Option<Stop>> {
        let g = self.dp().geometry.clone();
        let chunk = g.chunk as u64;
        let from = sp.from.clone();
        // Windows of at most 16 MiB a member, and at least 16 of them: the boundary moves
        // often enough for a small array to show its progress (and be cut anywhere).
        // With a row height above 1, a window holds at least 16 permutations' blocks
        // (whole ones) so its chunks spread over every member.
        let dp = self.dp();
        let d = dp.map.declustered().expect("declustered");
        let height = d.height();
        let window = (WINDOW_BYTES / chunk)
            .max(16 * height)
            .min(rows.div_ceil(16))
            .max(1)
            .div_ceil(height)
            * height;
        // Runs read ahead (`SBOD_DECL_RUNS`): blocks of at most RUN_BYTES a member, and
        // as many blocks under way as the memory budget holds, counted in runs: a block
        // takes `k` for its members' runs (the chunks a rebuild reads; in a copy-back,
        // fewer), given back once its chunks are rebuilt, and 2 for its rebuilt chunks and
        // their copy into one write, given back when it is written: the budget goes to
        // the blocks still reading, not to those waiting for their writes.
        let run_rows = (RUN_BYTES / chunk).max(1);
        let run_bytes = height.min(run_rows) * chunk;
        let part_units = g.k() as u32 + 2;
        // And no more than keeps RUNS_A_MEMBER runs queued on each member: deeper queues
        // made 24 members slower, not faster (see RUNS_A_MEMBER).
        let members = self.dp().state.load().slots.len() as u64;
        let k = g.k() as u64;
        let by_members = (RUNS_A_MEMBER * members).div_ceil(k) * (k + 2);
        let units = (crate::tuning::decl_runs_bytes() / run_bytes.max(1))
            .min(by_members)
            .min(1 << 20) as u32;
        let runs_mem = Arc::new(Semaphore::new(units as usize));
        let mut mem_ready: Option<OwnedSemaphorePermit> = None;
        let runs_on = units >= part_units && height >= SCHED_HEIGHT;
        let unit_rows = if runs_on {
            height.min(run_rows)
        } else {
            height
        };
        let in_flight = IN_FLIGHT
            .max(BLOCKS_IN_FLIGHT * (height as usize).min(BLOCK_DEPTH))
            .min(MAX_IN_FLIGHT);
        let windows = crate::tuning::decl_windows();
        let mut throttle = Throttle::new();
        let mut room = Room::new(self, self.dp().state.load().slots.len());
        // The members in service, whose queues a distributed rebuild with runs read ahead
        // balances (`next_part`).
        let serving: Option<Vec<bool>> = (!copyback).then(|| {
            let st = self.dp().state.load();
            st.slots
                .iter()
                .map(|s| s.state == SlotState::Active)
                .collect()
        });
        let mut last_record = Instant::now();
        let started = Instant::now();
        let mut recording: Option<futures::future::BoxFuture<'_, Result<()>>> = None;
        // The boundary this pass moves (and records), and the rows whose chunks it moves:
        // the first pass's rows; the main pass passes over those the first pass moved.
        let (boundary, recorded) = match pass {
            Pass::First => (&sp.first_boundary, &sp.first_recorded),
            Pass::Main => (&sp.boundary, &sp.recorded),
        };
        let first_end = sp.first_boundary.load(Ordering::Acquire);
        let keep = |row: u64| match pass {
            Pass::First => dp.map.first_pass_row(sp, row),
            Pass::Main => !(row < first_end && dp.map.first_pass_row(sp, row)),
        };
        let watch_first = pass == Pass::Main && !copyback && sp.first().is_none();
        // The windows under way, in row order (the first ends at the next boundary); their
        // blocks waiting, in row order, and under way; the chunks in flight (with their
        // window's sequence number, `first` being the front window's, and their block's).
        let mut wins: VecDeque<Window<'_>> = VecDeque::new();
        let mut first: u64 = 0;
        let mut waiting: VecDeque<Blk<'_>> = VecDeque::new();
        let mut active: Vec<(u64, Blk<'_>)> = Vec::new();
        // A distributed rebuild's main pass lets a block's locks go once it is done, its
        // rows marked ahead of the boundary (`Spared::mark_ahead`): in a ring as long as
        // the rows its windows can run ahead.
        let ahead = pass == Pass::Main && !copyback;
        if ahead {
            let most = (windows.max(RUN_WINDOWS) as u64 + 1) * window;
            sp.ahead_init(most.min(AHEAD_ROWS) as usize);
        }
        let mut next_blk: u64 = 0;
        let sched = height >= SCHED_HEIGHT;
        let mut flying = FuturesUnordered::new();
        // Chunks that completed while a block's locks were waited for.
        let mut done = VecDeque::new();
        let mut next_row = boundary.load(Ordering::Acquire);
        let start_row = next_row;
        let mut stop: Option<Stop> = None;
        loop {
            // The front windows whose chunks are all written: the boundary moves past each
            // in order (never past a window with a chunk still in flight before it).
            // (Not once stopped: a stopped copy-back records nothing more.)
            while stop.is_none() && wins.front().is_some_and(|w| w.left == 0) {
                let w = wins.pop_front().expect("front");
                first += 1;
                if copyback {
                    // Durable, and recorded, before a write can go to the new places only:
                    // the old ones (still holding the chunks) are what a crash would read.
                    dp.flush().await?;
                    let st = self.dp().state.load_full();
                    self.record_spares(|| {
                        boundary.store(w.end, Ordering::Release);
                        recorded.store(w.end, Ordering::Release);
                        st.slots[target]
                            .recovery
                            .store((w.end * chunk).min(g.member_size), Ordering::Release);
                    })
                    .await?;
                } else {
                    // A distributed rebuild's old places are on the failed member: below a
                    // boundary not yet recorded, a crash reads the chunks rebuilt from
                    // parity again, as the stripes held them. Recorded every few seconds,
                    // flushed first: the boundary recorded is the one before the flush, so
                    // it covers only windows whose writes had all completed.
                    //
                    // The flush and the record go on beside the walk (`recording`, one at
                    // a time, polled wherever the walk waits): the chunks of the windows
                    // after it keep moving meanwhile, which with many members is much of
                    // the time (a flush waits for every member's queue). The boundary it
                    // records is the one when it started, every window below it written
                    // before the flush; it is awaited before the pass returns, so a later
                    // record never precedes it.
                    //
                    // Not once the rest of the pass, at its pace so far, takes less than
                    // the time between records: the pass's end flushes and records it
                    // (a flush and a superblock write to every member less as it ends).
                    boundary.store(w.end, Ordering::Release);
                    let moved = w.end.saturating_sub(start_row) as f64;
                    let rest = rows.saturating_sub(w.end) as f64;
                    let ending = moved > 0.0
                        && rest * started.elapsed().as_secs_f64() / moved
                            < RECORD_EVERY.as_secs_f64();
                    if recording.is_none() && last_record.elapsed() > RECORD_EVERY && !ending {
                        let end = w.end;
                        recording = Some(
                            async move {
                                self.dp().flush().await?;
                                self.record_spares(|| recorded.store(end, Ordering::Release))
                                    .await
                            }
                            .boxed(),
                        );
                    }
                }
                drop(w.guards);
                if pass == Pass::Main {
                    handle.done.store(w.end * chunk, Ordering::Relaxed);
                }
                throttle.pace(self, w.bytes).await;
            }
            if stop.is_none() {
                stop = self.spare_stop(handle, copyback, target, watch_first);
            }
            let busy = room.look(self);
            let runs_now = runs_on && room.quiet(self);
            let parts = if runs_now && unit_rows < height {
                PARTS_PER_BLOCK
            } else {
                usize::MAX
            };
            let balance = serving.as_deref().filter(|_| runs_now);
            let (cap, depth) = match (sched, busy) {
                (false, _) => (usize::MAX, usize::MAX),
                (true, true) => (BUSY_BLOCKS, usize::MAX),
                (true, false) if runs_now => (MAX_RUN_BLOCKS, BLOCK_DEPTH),
                (true, false) => (BLOCKS_IN_FLIGHT, BLOCK_DEPTH),
            };
            // With runs, while clients are idle: more windows open, so that blocks
            // whose members have runs to read keep starting while the front window's
            // last block is read (its slowest member's queue); the boundary still moves
            // in order. While clients are busy no more open than `SBOD_DECL_WINDOWS`.
            let open_windows = if runs_now {
                windows.max(RUN_WINDOWS)
            } else {
                windows
            };
            // Issue: the chunks of the blocks under way (the earliest first); else start
            // the next block (`pick_block`), its stripes locked as it starts; else open the
            // next window, while fewer than IN_FLIGHT chunks and `SBOD_DECL_WINDOWS`
            // windows are under way. The next window's reads start while the last ones'
            // finish.
            while stop.is_none() && flying.len() < in_flight {
                if let Some((id, b)) = active
                    .iter_mut()
                    .find(|(_, b)| !b.moves.is_empty() && b.flying < depth)
                {
                    let (id, seq) = (*id, b.win);
                    if b.locked {
                        let mv = b.moves.pop_front().expect("not empty");
                        b.flying += 1;
                        let permits = room.enter(self, &mv);
                        flying.push(
                            async move {
                                let _p = permits.await;
                                let r = self.move_chunk(mv.addr, mv.old, mv.new).await;
                                (seq, id, 1, r, Vec::new())
                            }
                            .boxed(),
                        );
                        continue;
                    }
                    // A block not locked as a whole (no runs read ahead): one row's chunks
                    // at a time, the row locked only while they move (after the room's
                    // permits), then marked ahead and let go, so a client's request waits
                    // for one row, and a sequential writer that caught up with the walk
                    // passes it instead of following it block by block. Where the row
                    // cannot be marked, its locks go to its window.
                    let row = b.moves.front().expect("not empty").addr.stripe;
                    let mut mvs = Vec::new();
                    while b.moves.front().is_some_and(|m| m.addr.stripe == row) {
                        mvs.push(b.moves.pop_front().expect("not empty"));
                    }
                    let n = mvs.len();
                    b.flying += n;
                    let permits: Vec<_> = mvs.iter().map(|mv| room.enter(self, mv)).collect();
                    let mut keys: Vec<usize> = mvs.iter().map(|m| m.addr.group).collect();
                    keys.sort_unstable();
                    keys.dedup();
                    let dp = &dp;
                    flying.push(
                        async move {
                            let _p = futures::future::join_all(permits).await;
                            let mut guards = Vec::with_capacity(keys.len());
                            for group in keys {
                                guards.push(dp.locks.lock(group, row).await);
                            }
                            let moved = futures::future::join_all(
                                mvs.iter()
                                    .map(|mv| self.move_chunk(mv.addr, mv.old, mv.new)),
                            )
                            .await;
                            let r = moved.into_iter().sum::<Result<u64>>();
                            if r.is_ok() && ahead && sp.mark_ahead(row) {
                                guards.clear();
                            }
                            (seq, id, n, r, guards)
                        }
                        .boxed(),
                    );
                } else if let Some(i) = (active.len() < cap
                    && (!runs_now
                        || mem_ready.is_some()
                        || runs_mem.available_permits() >= part_units as usize))
                    .then(|| next_part(&waiting, &active, parts, balance))
                    .flatten()
                {
                    // The next block (`next_part`: in row order, or balancing the members'
                    // queues while runs are read ahead; of a tall block's parts, at most
                    // `parts` under way).
                    let mut b = waiting.remove(i).expect("in range");
                    if !runs_now {
                        // Its rows locked one at a time as their chunks move (above).
                        active.push((next_blk, b));
                        next_blk += 1;
                        continue;
                    }
                    b.locked = true;
                    // Locked as it starts (a client request to its stripes waits from now
                    // until the block is done and its rows marked ahead, else until the
                    // boundary passes its window). Only the transition holds
                    // more than one stripe lock at a time, so the order is free.
                    let mut keys: Vec<(usize, u64)> = b
                        .moves
                        .iter()
                        .map(|m| (m.addr.group, m.addr.stripe))
                        .collect();
                    keys.sort_unstable();
                    keys.dedup();
                    b.rows = keys.iter().map(|k| k.1).collect();
                    b.rows.sort_unstable();
                    b.rows.dedup();
                    // The chunks in flight are driven while the locks are waited for (their
                    // completions kept for below): a client request holding one of these
                    // stripes may wait on something a chunk in flight holds (a checksum
                    // block it is loading), which must not wait for us in turn.
                    let locking = async {
                        let mut v = Vec::with_capacity(keys.len());
                        for (group, row) in keys {
                            v.push(dp.locks.lock(group, row).await);
                        }
                        v
                    };
                    let mut locking = std::pin::pin!(locking);
                    // The record under way too: it holds `mgmt`, which a client request
                    // holding one of these stripes may wait for.
                    let guards = loop {
                        tokio::select! {
                            biased;
                            v = &mut locking => break v,
                            Some(r) = flying.next(), if !flying.is_empty() => done.push_back(r),
                            r = async { recording.as_mut().expect("under way").await }, if recording.is_some() => {
                                recording = None;
                                last_record = Instant::now();
                                r?;
                            }
                        }
                    };
                    b.guards = guards;
                    // Its members' runs, read from now on (its stripes are locked: no
                    // write changes them before its chunks are written).
                    let mem = mem_ready
                        .take()
                        .or_else(|| runs_mem.clone().try_acquire_many_owned(part_units).ok());
                    if let Some(runs) = self.block_runs(&b.moves) {
                        // The whole block as one: its chunks rebuilt from the runs as
                        // they all arrive, written a run a member.
                        let moves: Vec<Move> = b.moves.drain(..).collect();
                        let (n, seq, id) = (moves.len(), b.win, next_blk);
                        b.flying = n;
                        flying.push(
                            async move {
                                let r = self.move_block(moves, runs, mem).await;
                                (seq, id, n, r, Vec::new())
                            }
                            .boxed(),
                        );
                    }
                    active.push((next_blk, b));
                    next_blk += 1;
                } else if wins.len() < open_windows && next_row < rows {
                    let end = (next_row + window).min(rows);
                    let seq = first + wins.len() as u64;
                    let mut moves = window_moves(d, &g, next_row..end, &from, to);
                    // Rows an earlier pass over this transition (stopped, or cut short by
                    // a first pass) marked ahead are done: resolved through `to` since,
                    // kept by every write there, not moved again (their old places are no
                    // longer theirs to read).
                    moves.retain(|m| !sp.is_ahead(m.addr.stripe));
                    if pass == Pass::First || sp.first().is_some() {
                        let rows_kept: std::collections::HashSet<u64> =
                            (next_row..end).filter(|&r| keep(r)).collect();
                        moves.retain(|m| rows_kept.contains(&m.addr.stripe));
                    }
                    wins.push_back(Window {
                        end,
                        guards: Vec::new(),
                        left: moves.len(),
                        bytes: 0,
                    });
                    // Blocks of `height` rows (cut in parts of RUN_BYTES a member where
                    // runs are read ahead); below SCHED_HEIGHT the whole window is one.
                    let unit = if sched { unit_rows } else { window };
                    waiting.extend(window_blocks(moves, unit, height, seq));
                    next_row = end;
                } else {
                    break;
                }
            }
            if flying.is_empty()
                && done.is_empty()
                && (stop.is_some() || wins.front().is_none_or(|w| w.left > 0))
            {
                // Nothing in flight and no window to close: done, or stopped (the chunks
                // in flight drained first: none is left half done).
                break;
            }
            // The next chunk or block done; or the record under way done; or, where a
            // block waits for the runs' memory, that memory given back (a block gives its
            // runs' share back once rebuilt, before it is done).
            let want_mem = runs_now
                && mem_ready.is_none()
                && stop.is_none()
                && active.len() < cap
                && !waiting.is_empty();
            let next = match done.pop_front() {
                Some(r) => Some(r),
                None => tokio::select! {
                    r = async { recording.as_mut().expect("under way").await }, if recording.is_some() => {
                        recording = None;
                        last_record = Instant::now();
                        r?;
                        continue;
                    }
                    p = runs_mem.clone().acquire_many_owned(part_units), if want_mem => {
                        mem_ready = p.ok();
                        continue;
                    }
                    Some(r) = flying.next(), if !flying.is_empty() => Some(r),
                    else => None,
                },
            };
            if let Some((seq, id, n, r, guards)) = next {
                let w = &mut wins[(seq - first) as usize];
                w.left -= n;
                w.guards.extend(guards);
                w.bytes += match r {
                    Ok(b) => b,
                    Err(e) => {
                        // The record under way ends first (a superblock write is not
                        // left half done).
                        if let Some(rec) = recording.take() {
                            let _ = rec.await;
                        }
                        return Err(e);
                    }
                };
                let i = active
                    .iter()
                    .position(|(x, _)| *x == id)
                    .expect("a chunk's block is under way");
                active[i].1.left -= n;
                active[i].1.flying -= n;
                if active[i].1.left == 0 {
                    let (_, b) = active.remove(i);
                    // Every chunk of it written: its rows marked ahead and its locks let
                    // go (a client request to them waits no longer); where they cannot
                    // be, its window holds them until the boundary passes it.
                    let last = b.rows.last().copied();
                    if ahead && last.is_some_and(|r| sp.mark_ahead(r)) {
                        for &r in &b.rows {
                            sp.mark_ahead(r);
                        }
                        drop(b.guards);
                    } else {
                        wins[(b.win - first) as usize].guards.extend(b.guards);
                    }
                }
            }
        }
        if let Some(rec) = recording.take() {
            rec.await?;
        }
        drop(flying);
        // Windows left locked when stopped: never finished, their rows stay above the
        // boundary (moved again at the next start).
        drop(wins);
        Ok(stop)
    }

    /// Whether the transition must stop now, and why.
    fn spare_stop(
        &self,
        handle: &super::ProcessHandle,
        copyback: bool,
        target: usize,
        watch_first: bool,
    ) -> Option<Stop> {
        if handle.cancelled() || self.dp().closing.load(Ordering::Acquire) {
            return Some(Stop::Quit);
        }
        let st = self.dp().state.load_full();
        if let Some(why) = &st.failed {
            return Some(Stop::Failed(why.to_string()));
        }
        if copyback && st.slots[target].state != SlotState::Rebuilding {
            return Some(Stop::TargetOut);
        }
        if watch_first {
            return first_candidate(&st, &self.dp().map.spared(), target).map(Stop::First);
        }
        None
    }

    /// Record the spare state on the members after `change` (with `mgmt` held, so no
    /// other superblock write can record an older boundary meanwhile).
    async fn record_spares(&self, change: impl FnOnce()) -> Result<()> {
        let _g = self.mgmt.lock().await;
        change();
        let st = self.dp().state.load_full();
        let lost = self.persist(&st, false).await;
        drop(_g);
        for m in lost {
            self.fail_member(&m, OutReason::MetadataWrite).await;
        }
        match &self.dp().state.load_full().failed {
            Some(why) => Err(Error::Failed(why.clone().into())),
            None => Ok(()),
        }
    }

    /// The runs of a block's chunks (`moves`, their stripes locked), their reads issued
    /// (see [`Runs`]): for a chunk whose old place can be read, that member's; else its
    /// stripe's members but the old and new places. A member's rows in one run each
    /// (contiguous; a gap starts another). None where no member has a run to read.
    fn block_runs(self: &Arc<Self>, moves: &VecDeque<Move>) -> Option<Arc<Runs>> {
        let dp = self.dp();
        let st = dp.state.load_full();
        let chunk = dp.geometry.chunk as u64;
        let size = dp.geometry.member_size;
        let end_of = |row: u64| (dp.map.stripe_offset(row) + chunk).min(size);
        let k = dp.map.k();
        let mut rows: std::collections::BTreeMap<usize, Vec<u64>> = Default::default();
        for mv in moves {
            let row = mv.addr.stripe;
            match mv
                .old
                .filter(|&o| st.slots[o].readable(end_of(row)).is_some())
            {
                Some(o) => rows.entry(o).or_default().push(row),
                None => {
                    // Only the chunks the rebuild reads: the first `k` readable in shard
                    // order, data first, as `read_shards_pre` takes them. A stripe's
                    // other members (Q, where a data chunk or P is lost) are not read:
                    // a ninth of the reads at 8+2. In a block every row has the same
                    // members in the same columns, so a member's rows stay one run.
                    let mut taken = 0;
                    for s in 0..dp.geometry.width as usize {
                        if taken == k {
                            break;
                        }
                        let m = dp.map.slot(mv.addr, s);
                        if Some(m) == mv.old
                            || Some(m) == mv.new
                            || st.slots[m].readable(end_of(row)).is_none()
                        {
                            continue;
                        }
                        rows.entry(m).or_default().push(row);
                        taken += 1;
                    }
                }
            }
        }
        let mut reads = Vec::new();
        for (slot, mut rs) in rows {
            rs.sort_unstable();
            rs.dedup();
            let mut i = 0;
            while i < rs.len() {
                let mut j = i + 1;
                while j < rs.len() && rs[j] == rs[j - 1] + 1 {
                    j += 1;
                }
                let span = rs[i]..rs[j - 1] + 1;
                i = j;
                let off = dp.map.stripe_offset(span.start);
                let end = end_of(span.end - 1);
                let Some(m) = st.slots[slot].readable(end).cloned() else {
                    continue;
                };
                let a = Arc::clone(self);
                // A task of its own, started now: the buffer (4 MiB, often fresh memory
                // whose pages fault in as it is zeroed: 30-60 ms a block of 8 runs) and
                // the checksums' verification are not the walk's, which went on to start
                // the next block only after them (the members idle meanwhile).
                let task = tokio::spawn(async move {
                    let buf = AlignedBuf::for_overwrite((end - off) as usize).into_shared();
                    // Verified as any read (checksums); an error leaves the run out, and
                    // its chunks are read one by one (where a bad block is healed, or
                    // its member failed, as a chunk read does).
                    let r = a
                        .dp()
                        .mread(&m, off, buf.clone(), IoClass::Background)
                        .await;
                    r.ok().map(|()| buf)
                });
                let read = async move { task.await.ok().flatten() }.boxed().shared();
                reads.push((slot, span, read));
            }
        }
        (!reads.is_empty()).then(|| Arc::new(Runs { chunk, reads }))
    }

    /// Write one chunk of `addr` (its stripe locked) from its place `old` to `new` (see
    /// [`Array::chunk_source`]). A new place out of service is passed over (its member's
    /// own sparing rebuilds it later); one whose file system is full fails the window
    /// (NoSpace), so its boundary stays.
    async fn move_chunk(
        &self,
        addr: StripeAddr,
        old: Option<usize>,
        new: Option<usize>,
    ) -> Result<u64> {
        let Some((dst, base, buf)) = self.chunk_source(addr, old, new, None).await? else {
            return Ok(0);
        };
        let len = buf.len() as u64;
        self.write_moved(&dst, base, buf).await?;
        Ok(len)
    }

    /// Write the chunks of a block whose runs were read ahead (`runs`): each rebuilt (or
    /// copied) from the runs, then each new place's chunks of neighbouring rows written
    /// as one request (a block's chunks on one member: a run of them). Returns the bytes
    /// moved. The chunks' stripes are locked (their block is under way).
    async fn move_block(
        &self,
        moves: Vec<Move>,
        runs: Arc<Runs>,
        mut mem: Option<OwnedSemaphorePermit>,
    ) -> Result<u64> {
        runs.ready().await;
        let got = futures::future::join_all(
            moves
                .iter()
                .map(|mv| self.chunk_source(mv.addr, mv.old, mv.new, Some(&runs))),
        )
        .await;
        // Rebuilt: the runs' share of the memory budget goes back (what a copy-back
        // took from a run is held until written).
        drop(runs);
        if let Some(p) = mem.as_mut() {
            drop(p.split(self.dp().geometry.k()));
        }
        let mut outs = Vec::with_capacity(got.len());
        for r in got {
            if let Some(o) = r? {
                outs.push(o);
            }
        }
        // By member, then offset: each member's neighbouring chunks in one write.
        outs.sort_by_key(|(m, base, _)| (Arc::as_ptr(m) as usize, *base));
        let mut total = 0;
        let mut i = 0;
        while i < outs.len() {
            let mut j = i + 1;
            let mut end = outs[i].1 + outs[i].2.len() as u64;
            while j < outs.len() && Arc::ptr_eq(&outs[j].0, &outs[i].0) && outs[j].1 == end {
                end += outs[j].2.len() as u64;
                j += 1;
            }
            let (dst, base) = (outs[i].0.clone(), outs[i].1);
            let buf = if j == i + 1 {
                outs[i].2.clone()
            } else {
                let mut b = AlignedBuf::for_overwrite((end - base) as usize);
                let mut at = 0;
                for (_, _, c) in &outs[i..j] {
                    // SAFETY: the chunk is complete (read or rebuilt) and not written.
                    let c = unsafe { c.as_slice() };
                    b[at..at + c.len()].copy_from_slice(c);
                    at += c.len();
                }
                b.into_shared()
            };
            // The rebuilt chunks go as soon as they are copied out.
            for o in &mut outs[i..j] {
                o.2 = AlignedBuf::for_overwrite(0).into_shared();
            }
            self.write_moved(&dst, base, buf).await?;
            total += end - base;
            i = j;
        }
        Ok(total)
    }

    /// What chunk `addr` (its stripe locked) must hold at its new place `new`: read from
    /// its place `old` where that member can be read, else rebuilt from the stripe (the
    /// bytes of members whose run was read ahead taken from `runs`, the rest read). None
    /// where the new place is out of service; else its member, offset and the bytes.
    async fn chunk_source(
        &self,
        addr: StripeAddr,
        old: Option<usize>,
        new: Option<usize>,
        runs: Option<&Runs>,
    ) -> Result<Option<(Arc<crate::member::Member>, u64, SharedBuf)>> {
        let dp = self.dp();
        let st = dp.state.load_full();
        let Some(new) = new else {
            return Ok(None);
        };
        let dst = match st.slots[new].state {
            SlotState::Active | SlotState::Rebuilding => st.slots[new].member.clone(),
            _ => None,
        };
        let Some(dst) = dst else {
            return Ok(None);
        };
        let base = dp.map.stripe_offset(addr.stripe);
        let len = (dp.geometry.chunk as u64).min(dp.geometry.member_size - base);
        let pre = |slot: usize| runs.and_then(|r| r.get(slot, addr.stripe, len));
        let mut data = None;
        if let Some(o) = old.filter(|&o| st.slots[o].readable(base + len).is_some()) {
            data = pre(o);
        }
        if data.is_none() {
            if let Some(src) = old.and_then(|o| st.slots[o].readable(base + len)) {
                let buf = AlignedBuf::for_overwrite(len as usize).into_shared();
                match dp.mread(src, base, buf.clone(), IoClass::Background).await {
                    Ok(()) => data = Some(buf),
                    Err(e) => dp.note_read_error_to_heal(src, &e).await,
                }
            }
        }
        let buf = match data {
            Some(b) => b,
            None => {
                // Rebuilt as the old place's shard (rows at the boundary and above are
                // still resolved through the old list).
                let old = old.expect("a chunk has a place");
                let mut v = self
                    .fam()
                    .recover_pre(&dp, addr, len, &[(old, dst.clone())], &pre)
                    .await?;
                v.pop().expect("one target")
            }
        };
        Ok(Some((dst, base, buf)))
    }

    /// Write moved chunks to their new place (`dst` at `base`). A write error fails the
    /// member (its chunks are rebuilt by its own sparing later), but one out of space
    /// with the member still in service: the chunks are not at their new place, which
    /// reads below the boundary would take them from, so the window stops here (its
    /// boundary does not move) and the supervisor tries again, as a rebuild out of space
    /// does.
    async fn write_moved(
        &self,
        dst: &Arc<crate::member::Member>,
        base: u64,
        buf: SharedBuf,
    ) -> Result<()> {
        let dp = self.dp();
        if let Err(e) = dp.mwrite(dst, base, buf, false, IoClass::Background).await {
            if dp.write_failed(dst, &e, reason::REBUILD_WRITE).await == WriteFault::NoSpace {
                return Err(dp.nospace_error(std::slice::from_ref(dst)));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mv(row: u64) -> Move {
        Move {
            addr: StripeAddr {
                group: 0,
                stripe: row,
            },
            old: Some(1),
            new: Some(2),
            members: vec![1, 2],
        }
    }

    /// A window's chunks split at block boundaries (rows `height * k`), in row order,
    /// each chunk in exactly one block.
    #[test]
    fn window_blocks_split_by_height() {
        let rows = [4u64, 5, 7, 8, 13, 14, 15, 16];
        let b = window_blocks(rows.iter().map(|&r| mv(r)).collect(), 4, 8, 3);
        let got: Vec<Vec<u64>> = b
            .iter()
            .map(|b| b.moves.iter().map(|m| m.addr.stripe).collect())
            .collect();
        assert_eq!(
            got,
            vec![vec![4, 5, 7], vec![8], vec![13, 14, 15], vec![16]]
        );
        assert!(b
            .iter()
            .all(|b| b.win == 3 && b.left == b.moves.len() && b.flying == 0));
        // One block where the unit is the window (row heights below SCHED_HEIGHT).
        assert_eq!(
            window_blocks(rows.iter().map(|&r| mv(r)).collect(), 64, 64, 0).len(),
            1
        );
    }

    /// A chunk of row `row` read from `from` and written to `to`.
    fn mv_on(row: u64, from: usize, to: usize) -> Move {
        Move {
            members: vec![from, to],
            ..mv(row)
        }
    }

    /// Balancing, the next block is the first whose busiest member in service has the
    /// fewest blocks under way; members out of service do not count; in row order
    /// without it, and among equals.
    #[test]
    fn next_part_starts_the_block_on_the_least_busy_members() {
        // Blocks of one row each: on members 1+2 (busy), 3+4, 5+6.
        let mut blocks = window_blocks(
            vec![
                mv_on(0, 1, 2),
                mv_on(1, 1, 2),
                mv_on(2, 3, 4),
                mv_on(3, 5, 6),
            ],
            1,
            1,
            0,
        );
        let active = vec![(0u64, blocks.remove(0))];
        let waiting: VecDeque<Blk<'_>> = blocks.into();
        let serving = vec![true; 8];
        assert_eq!(next_part(&waiting, &active, usize::MAX, None), Some(0));
        assert_eq!(
            next_part(&waiting, &active, usize::MAX, Some(&serving)),
            Some(1)
        );
        // Member 1 out of service (the failed one, in every block): 2 still counts.
        let mut out1 = serving.clone();
        out1[1] = false;
        assert_eq!(
            next_part(&waiting, &active, usize::MAX, Some(&out1)),
            Some(1)
        );
        // Members 1 and 2 both out: every block equal, the first in row order.
        out1[2] = false;
        assert_eq!(
            next_part(&waiting, &active, usize::MAX, Some(&out1)),
            Some(0)
        );
    }
}
