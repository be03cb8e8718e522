//! The trust model as a property: random lives of an array against a model that knows
//! which member holds what. Between client writes, reads, zeroes and flushes the array is
//! stopped and started again; a member is hidden at a start (refused without `degraded`,
//! then run without it) and brought back (at the next start, or re-added while running);
//! an old copy of a member is put back; members fail (past the redundancy: refused without
//! `force`; forced, the array fails and is then rescued read-only); the array crashes
//! (abandoned, as a power cut that keeps what was acknowledged, members being memory).
//!
//! After every step: every read returns exactly what the model says was last acknowledged,
//! or (failed array) an error; a rescue returns, per block, a value the block held at some
//! time or an error; never other bytes. A member that comes back is recovered from the
//! write-intent bitmap when the model says the bitmap covers it, and then rebuilds no more
//! than the regions written since the bitmap was last known clear (and the regions the
//! bitmap set ahead of a writer moving forward, `SBOD_BITMAP_AHEAD`, past each of them).
//!
//! `SBOD_LIFECYCLE_CASES` sets the number of random lives (default 200);
//! `SBOD_TORTURE_REPORT` collects the figures (see docs/RELIABILITY.md).

use crate::torture_util;

use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence, TestRunner};
use sbod_core::dev::{BlockDev, MemDev};
use sbod_core::error::Step;
use sbod_core::{AlignedBuf, Array, AssembleOptions, CreateSpec, Error, MemberSpec};
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use torture_util::{blocks_of, decode, report, Layout, BLOCK, LAYOUTS, MIB};

#[derive(Clone, Debug)]
enum Op {
    Write {
        at: u64,
        blocks: u64,
    },
    Zero {
        at: u64,
        blocks: u64,
    },
    Read {
        at: u64,
        blocks: u64,
    },
    Flush,
    /// Stop cleanly and start again.
    Restart,
    /// Stop as a power cut would (what members acknowledged stays), and start again.
    Crash,
    /// Keep a member away from the next start (also while running: it takes effect then).
    Hide(usize),
    /// Bring a hidden member back: re-added while running, or at the next start.
    BringBack(usize),
    /// Copy a member aside while stopped (the next Restart stops first).
    Snapshot(usize),
    /// Put the old copy back while stopped.
    Restore(usize),
    /// `sbod fail`; `force` goes past the redundancy.
    Fail(usize, bool),
    /// Re-add a failed member while running.
    ReAdd(usize),
    /// Let recoveries finish.
    Settle,
    /// `sbod grow --add` (a wider restripe, a mirror copy or set; `true`: a level change
    /// where the level has one, raid5 -> raid6), run to its end while running; only with
    /// every member in service.
    Grow(bool),
    /// `sbod grow --remove --force` of the last member of a one-group striped array: the
    /// data restriped onto the others, the volume's tail past the new size dropped.
    Narrow,
    /// `sbod grow --chunk --force` (`true`: twice the chunk, else half): every window
    /// written aside, the volume's last rows (the backup area) dropped and back as zeros.
    Rechunk(bool),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (any::<u64>(), 1u64..24).prop_map(|(at, blocks)| Op::Write { at, blocks }),
        1 => (any::<u64>(), 1u64..24).prop_map(|(at, blocks)| Op::Zero { at, blocks }),
        3 => (any::<u64>(), 1u64..48).prop_map(|(at, blocks)| Op::Read { at, blocks }),
        1 => Just(Op::Flush),
        2 => Just(Op::Restart),
        1 => Just(Op::Crash),
        2 => (0usize..8).prop_map(Op::Hide),
        2 => (0usize..8).prop_map(Op::BringBack),
        1 => (0usize..8).prop_map(Op::Snapshot),
        2 => (0usize..8).prop_map(Op::Restore),
        2 => (0usize..8, prop::bool::weighted(0.3)).prop_map(|(i, f)| Op::Fail(i, f)),
        2 => (0usize..8).prop_map(Op::ReAdd),
        1 => Just(Op::Settle),
        1 => any::<bool>().prop_map(Op::Grow),
        1 => Just(Op::Narrow),
        1 => any::<bool>().prop_map(Op::Rechunk),
    ]
}

/// Figures over all cases, for docs/RELIABILITY.md.
#[derive(Default, Debug, Clone)]
struct Figures {
    cases: u64,
    steps: u64,
    starts: u64,
    refused_missing: u64,
    refused_past_redundancy: u64,
    stale_found: u64,
    bitmap_recoveries: u64,
    full_recoveries: u64,
    re_adds: u64,
    rescues: u64,
    blocks_verified: u64,
    errors_returned: u64,
    wrong: u64,
    grows: u64,
    narrowings: u64,
    rechunks: u64,
}

/// Per block: the write (tag) it holds now, and every tag it ever held.
struct Blocks {
    now: Vec<u64>,
    ever: Vec<BTreeSet<u64>>,
}

impl Blocks {
    fn new(n: u64) -> Blocks {
        Blocks {
            now: vec![0; n as usize],
            ever: (0..n).map(|_| BTreeSet::from([0])).collect(),
        }
    }

    fn set(&mut self, first: u64, n: u64, tag: u64) {
        for b in first..first + n {
            self.now[b as usize] = tag;
            self.ever[b as usize].insert(tag);
        }
    }
}

struct Life {
    l: Layout,
    background: bool,
    devs: Vec<Arc<MemDev>>,
    a: Option<Arc<Array>>,
    blocks: Blocks,
    next_tag: u64,
    width: usize,
    red: usize,
    region: u64,
    /// Members kept away from the next start.
    hidden: BTreeSet<usize>,
    /// Slots the array records as out (failed, or missing at its start).
    out: BTreeSet<usize>,
    /// Slots being recovered (not read until done).
    recovering: BTreeSet<usize>,
    /// Members put back from an old copy since the last start.
    restored: BTreeSet<usize>,
    /// Members whose bitmap recovery is certain when they come back (left by failing or
    /// missing a start, after having been in sync).
    bitmap_sure: BTreeSet<usize>,
    snaps: HashMap<usize, Vec<u8>>,
    /// Regions written since the bitmap was last known clear (a clean stop of the whole
    /// array).
    touched: BTreeSet<u64>,
    last_stop_crash: bool,
    /// Failed past its redundancy (forced).
    dead: bool,
    rescued: bool,
    /// The array went on without a member that holds a later superblock of its own.
    forked: bool,
    /// Grows done (at most two per life), and the size of every device.
    grown: usize,
    dev_size: u64,
    fig: Figures,
}

fn spec_of(d: &Arc<MemDev>) -> MemberSpec {
    MemberSpec {
        dev: d.clone() as Arc<dyn BlockDev>,
        path: d.name().to_string(),
        is_file: false,
        domain: String::new(),
    }
}

impl Life {
    fn a(&self) -> &Arc<Array> {
        self.a.as_ref().expect("running")
    }

    fn group(&self, slot: usize) -> usize {
        slot / self.width
    }

    /// Would the group of `slot` have more slots out than it survives, with `slot` out
    /// too? Out: failed or missing, hidden, being recovered, or put back from a copy.
    fn past_redundancy_with(&self, slot: usize) -> bool {
        self.past_with(slot, true)
    }

    /// As above, counting only what is out now (`hidden` takes effect at the next start).
    fn past_with(&self, slot: usize, with_hidden: bool) -> bool {
        let g = self.group(slot);
        let none = BTreeSet::new();
        let hidden = if with_hidden { &self.hidden } else { &none };
        let mut out: BTreeSet<usize> = self
            .out
            .iter()
            .chain(hidden)
            .chain(&self.recovering)
            .chain(&self.restored)
            .copied()
            .filter(|&s| self.group(s) == g)
            .collect();
        out.insert(slot);
        out.len() > self.red
    }

    /// Bytes a bitmap recovery may cover: the regions written since the bitmap was last
    /// known clear, and after each the regions the bitmap may have set ahead of a writer
    /// moving forward (`bitmap::ahead_regions`).
    fn bitmap_bound(&self) -> u64 {
        let ahead = sbod_core::bitmap::ahead_regions(self.region);
        let mut may: BTreeSet<u64> = BTreeSet::new();
        for &r in &self.touched {
            may.extend(r..=r + ahead);
        }
        may.len() as u64 * self.region
    }

    fn regions_of(&self, first: u64, n: u64) -> Vec<u64> {
        self.a()
            .placement()
            .map(first * BLOCK as u64, n * BLOCK as u64)
            .iter()
            .map(|p| p.moff / self.region)
            .collect()
    }

    fn range(&self, at: u64, blocks: u64) -> (u64, u64) {
        let total = self.blocks.now.len() as u64;
        let first = at % total;
        (first, blocks.min(total - first))
    }

    async fn check_read(&mut self, first: u64, n: u64, what: &str) -> Result<(), TestCaseError> {
        let r = self
            .a()
            .read(first * BLOCK as u64, (n * BLOCK as u64) as usize)
            .await;
        match r {
            Ok(got) => {
                for (i, b) in got.chunks(BLOCK).enumerate() {
                    let blk = first + i as u64;
                    let tag = decode(b, blk);
                    let ok = if self.rescued {
                        tag.is_some_and(|t| self.blocks.ever[blk as usize].contains(&t))
                    } else {
                        tag == Some(self.blocks.now[blk as usize])
                    };
                    if !ok {
                        self.fig.wrong += 1;
                    }
                    prop_assert!(
                        ok,
                        "{}: block {} read as {:?}, the model says {} (ever {:?})",
                        what,
                        blk,
                        tag,
                        self.blocks.now[blk as usize],
                        self.blocks.ever[blk as usize]
                    );
                }
                prop_assert!(
                    !self.dead || self.rescued,
                    "{}: a failed array returned data",
                    what
                );
                self.fig.blocks_verified += n;
            }
            Err(e) => {
                prop_assert!(
                    self.dead,
                    "{}: read of blocks {}+{} failed on a working array: {}",
                    what,
                    first,
                    n,
                    e
                );
                self.fig.errors_returned += 1;
            }
        }
        Ok(())
    }

    async fn check_all(&mut self, what: &str) -> Result<(), TestCaseError> {
        let n = self.blocks.now.len() as u64;
        self.check_read(0, n, what).await
    }

    fn opts(&self) -> AssembleOptions {
        AssembleOptions {
            no_processes: !self.background,
            ..Default::default()
        }
    }

    /// Assemble from every member not hidden.
    async fn assemble(&self, opts: AssembleOptions) -> Result<Arc<Array>, Error> {
        let given: Vec<MemberSpec> = (0..self.devs.len())
            .filter(|i| !self.hidden.contains(i))
            .map(|i| spec_of(&self.devs[i]))
            .collect();
        Array::assemble(given, opts).await
    }

    async fn stop(&mut self, crash: bool) {
        let Some(a) = self.a.take() else { return };
        let whole = self.out.is_empty() && self.recovering.is_empty() && !self.dead;
        if crash {
            a.abandon().await;
        } else {
            let _ = a.close().await;
            // A clean stop with every slot in service clears the bitmap.
            if whole {
                self.touched.clear();
            }
        }
        self.last_stop_crash = crash;
    }

    /// Start with every member not hidden. Checks what assembly says against the model.
    async fn start(&mut self, what: &str) -> Result<(), TestCaseError> {
        self.fig.starts += 1;
        // Hidden members the array had in service: it must not start without them silently.
        let missing_in_service: Vec<usize> = self
            .hidden
            .iter()
            .copied()
            .filter(|s| !self.out.contains(s))
            .collect();
        let r = self.assemble(self.opts()).await;
        let mut split_forced = false;
        let r = match r {
            Err(Error::MissingMembers(m)) => {
                prop_assert!(
                    !missing_in_service.is_empty(),
                    "{}: refused for missing members the array did not need: {}",
                    what,
                    m
                );
                self.fig.refused_missing += 1;
                self.assemble(AssembleOptions {
                    degraded: true,
                    ..self.opts()
                })
                .await
            }
            Ok(a) => {
                prop_assert!(
                    missing_in_service.is_empty() || self.dead,
                    "{}: started without members {:?} it had in service, without being asked",
                    what,
                    missing_in_service
                );
                Ok(a)
            }
            other => other,
        };
        let r = match r {
            // The array went on from members that did not know of a failure that a member
            // kept away recorded (see below): its return is a split brain, refused, and
            // forced, the newest side (which went on, holding every write) is taken.
            Err(Error::SplitBrain(msg)) => {
                prop_assert!(self.forked, "{}: split brain out of nowhere: {}", what, msg);
                // The other side's members are rebuilt in full.
                split_forced = true;
                self.assemble(AssembleOptions {
                    force: true,
                    ..self.opts()
                })
                .await
            }
            // After a crash with members out, the write hole: refused unless forced. The
            // members are memory and nothing was in flight, so forcing loses nothing here.
            Err(Error::Refused(msg)) if msg.contains("not shut down cleanly") => {
                // A failed array cannot flush, so its stop is unclean too.
                prop_assert!(
                    self.last_stop_crash || self.dead,
                    "{}: write hole without a crash: {}",
                    what,
                    msg
                );
                self.assemble(AssembleOptions {
                    force: true,
                    ..self.opts()
                })
                .await
            }
            Err(Error::Failed(msg)) if self.dead => {
                prop_assert!(
                    msg.advice.iter().any(|s| matches!(s, Step::Force { .. })),
                    "{}: {}",
                    what,
                    msg
                );
                // Rescue: read-only from the freshest members.
                let a = self
                    .assemble(AssembleOptions {
                        force: true,
                        ..self.opts()
                    })
                    .await;
                if let Ok(a) = &a {
                    prop_assert!(a.is_read_only(), "{}: a rescue is read-only", what);
                    prop_assert_eq!(a.status().state, "rescue");
                    self.rescued = true;
                    self.fig.rescues += 1;
                }
                a
            }
            other => other,
        };
        let a = match r {
            Ok(a) => a,
            Err(e) => return Err(TestCaseError::fail(format!("{what}: start failed: {e}"))),
        };
        if self.dead && a.is_read_only() && !self.rescued {
            prop_assert_eq!(a.status().state, "rescue");
            self.rescued = true;
            self.fig.rescues += 1;
        }
        if self.dead && !self.rescued {
            // The failure that failed the array could not be recorded anywhere (no member
            // was left in service to take the superblock), so the members say the last one
            // failed is in sync, and it is: nothing was acknowledged after it failed. The
            // array serves again; its reads are checked exactly like any other. A member
            // kept away that did record the failure now holds another story: a split.
            self.dead = false;
            self.forked |= !self.hidden.is_empty();
            let st = a.status();
            self.out = st
                .members
                .iter()
                .filter(|m| m.state == "failed" || m.state == "missing")
                .filter_map(|m| m.slot)
                .collect();
            self.recovering = st
                .members
                .iter()
                .filter(|m| m.state == "rebuilding")
                .filter_map(|m| m.slot)
                .collect();
            self.restored.clear();
            self.a = Some(a);
            return self
                .check_all(&format!("{what}: back from a failure no member recorded"))
                .await;
        }
        let st = a.status();
        let rep = a.report();
        // What the model knows about each slot, against what status says.
        for s in 0..self.devs.len() {
            let m = st.members.iter().find(|m| m.slot == Some(s)).expect("slot");
            if self.rescued {
                continue;
            }
            if self.hidden.contains(&s) {
                prop_assert!(
                    m.state == "missing" || m.state == "failed",
                    "{}: hidden member {} shows {}",
                    what,
                    s,
                    m.state
                );
            } else if self.restored.contains(&s) || self.out.contains(&s) {
                // An old copy, or a member back from being out: never trusted as it is.
                prop_assert_eq!(&m.state, "rebuilding", "{}: member {} {:?}", what, s, m);
                let reason = m.reason.clone().unwrap_or_default();
                prop_assert!(reason.starts_with("stale: event"), "{}: {:?}", what, m);
                let stale = rep
                    .stale
                    .iter()
                    .find(|x| x.slot == s)
                    .expect("reported stale");
                if self.bitmap_sure.contains(&s) && !self.restored.contains(&s) && !split_forced {
                    prop_assert!(
                        stale.bitmap,
                        "{}: member {} recovered in full: {:?}",
                        what,
                        s,
                        stale
                    );
                }
                if stale.bitmap {
                    prop_assert!(
                        stale.planned_bytes <= self.bitmap_bound(),
                        "{}: bitmap recovery of {} covers {} bytes, more than the {} regions written (and those ahead of them)",
                        what,
                        s,
                        stale.planned_bytes,
                        self.touched.len()
                    );
                    self.fig.bitmap_recoveries += 1;
                } else {
                    // Rebuilt in full: if it leaves before that is done, so is its return.
                    self.bitmap_sure.remove(&s);
                    self.fig.full_recoveries += 1;
                }
                self.fig.stale_found += 1;
                self.recovering.insert(s);
            }
        }
        for &s in &self.hidden {
            // Left while in sync: recovered from the bitmap when back. Left while being
            // recovered (or out already): as sure as before.
            if !self.recovering.remove(&s) && !self.out.contains(&s) {
                self.bitmap_sure.insert(s);
            }
        }
        self.out = self.hidden.clone();
        self.restored.clear();
        self.a = Some(a);
        self.check_all(&format!("{what}: after the start")).await
    }

    /// `re_add` a member that is out, while running: recovered from the bitmap when the
    /// model is sure it covers it, never more than what was written; reads stay exact.
    async fn re_add(&mut self, i: usize, what: &str) -> Result<(), TestCaseError> {
        let r = match self.a().re_add(spec_of(&self.devs[i])).await {
            Ok(r) => r,
            // Kept away while the array went on from members that did not know of its
            // record (see `start`): it is on another side, and stays out.
            Err(Error::Refused(m)) if self.forked && m.contains("split brain") => return Ok(()),
            Err(e) => return Err(TestCaseError::fail(format!("{what}: re-add: {e}"))),
        };
        if self.bitmap_sure.contains(&i) {
            prop_assert!(r.bitmap, "{}: re-add of {} in full: {:?}", what, i, r);
        }
        if r.bitmap {
            prop_assert!(r.planned_bytes <= self.bitmap_bound());
            self.fig.bitmap_recoveries += 1;
        } else {
            self.bitmap_sure.remove(&i);
            self.fig.full_recoveries += 1;
        }
        self.out.remove(&i);
        self.recovering.insert(i);
        self.fig.re_adds += 1;
        let st = self.a().status();
        let m = st.members.iter().find(|m| m.slot == Some(i)).expect("slot");
        prop_assert_eq!(&m.state, "rebuilding");
        if self.background {
            self.settle().await?;
        }
        self.check_all(&format!("{what}: after re-adding {i}"))
            .await
    }

    async fn settle(&mut self) -> Result<(), TestCaseError> {
        if self.rescued || self.dead {
            return Ok(());
        }
        let a = self.a().clone();
        a.rebuild_now()
            .await
            .map_err(|e| TestCaseError::fail(format!("rebuild: {e}")))?;
        for r in a.status().recoveries.iter().filter(|r| r.state == "done") {
            if r.bitmap {
                prop_assert!(
                    r.recovered_bytes <= self.bitmap_bound(),
                    "bitmap recovery of {} rebuilt {} bytes, more than the {} regions written (and those ahead of them)",
                    r.path,
                    r.recovered_bytes,
                    self.touched.len()
                );
            }
        }
        self.recovering.clear();
        Ok(())
    }

    async fn step(&mut self, op: &Op, what: &str) -> Result<(), TestCaseError> {
        let n = self.devs.len();
        if self.rescued {
            // A rescued array: reads only, and every write refused.
            if let Op::Write { at, blocks } = *op {
                let (first, nb) = self.range(at, blocks);
                let r = self
                    .a()
                    .write(
                        first * BLOCK as u64,
                        AlignedBuf::from_slice(&blocks_of(1, first, nb)),
                        false,
                    )
                    .await;
                prop_assert!(
                    matches!(r, Err(Error::ReadOnly(_))),
                    "{}: rescue wrote: {:?}",
                    what,
                    r
                );
            }
            if let Op::Read { at, blocks } = *op {
                let (first, nb) = self.range(at, blocks);
                self.check_read(first, nb, what).await?;
            }
            return Ok(());
        }
        match *op {
            Op::Write { at, blocks } | Op::Zero { at, blocks } => {
                if self.a.is_none() {
                    return Ok(());
                }
                let (first, nb) = self.range(at, blocks);
                let zero = matches!(op, Op::Zero { .. });
                let tag = if zero {
                    0
                } else {
                    self.next_tag += 1;
                    self.next_tag
                };
                let r = if zero {
                    self.a()
                        .write_zeroes(first * BLOCK as u64, nb * BLOCK as u64, false, false)
                        .await
                } else {
                    self.a()
                        .write(
                            first * BLOCK as u64,
                            AlignedBuf::from_slice(&blocks_of(tag, first, nb)),
                            false,
                        )
                        .await
                };
                if self.dead {
                    prop_assert!(r.is_err(), "{}: a failed array took a write", what);
                } else {
                    r.map_err(|e| TestCaseError::fail(format!("{what}: write: {e}")))?;
                    self.blocks.set(first, nb, tag);
                    let regions = self.regions_of(first, nb);
                    self.touched.extend(regions);
                }
            }
            Op::Read { at, blocks } => {
                if self.a.is_none() {
                    return Ok(());
                }
                let (first, nb) = self.range(at, blocks);
                self.check_read(first, nb, what).await?;
            }
            Op::Flush => {
                if let Some(a) = &self.a {
                    let r = a.flush().await;
                    prop_assert_eq!(r.is_ok(), !self.dead, "{}: flush {:?}", what, r.err());
                }
            }
            Op::Restart | Op::Crash => {
                self.stop(matches!(op, Op::Crash)).await;
                self.start(what).await?;
            }
            Op::Hide(i) => {
                let i = i % n;
                // Left out of the next start (taken effect then).
                if self.dead || self.rescued || self.hidden.contains(&i) {
                    return Ok(());
                }
                if self.past_redundancy_with(i) {
                    return Ok(());
                }
                self.hidden.insert(i);
            }
            Op::BringBack(i) => {
                let i = i % n;
                if !self.hidden.remove(&i) {
                    return Ok(());
                }
                if self.a.is_some() && !self.dead && self.out.contains(&i) {
                    // Re-added while running.
                    self.re_add(i, what).await?;
                }
            }
            Op::Snapshot(i) => {
                let i = i % n;
                if self.a.is_some() {
                    // Copies are taken with the array stopped: stop it first.
                    self.stop(false).await;
                }
                let img = self.devs[i].with_data(|v| v.clone());
                self.snaps.insert(i, img);
                self.start(what).await?;
            }
            Op::Restore(i) => {
                let i = i % n;
                if self.dead || self.hidden.contains(&i) || self.restored.contains(&i) {
                    return Ok(());
                }
                let Some(img) = self.snaps.get(&i).cloned() else {
                    return Ok(());
                };
                if self.past_redundancy_with(i) {
                    return Ok(());
                }
                self.stop(false).await;
                self.devs[i].with_data(|v| v.copy_from_slice(&img));
                self.restored.insert(i);
                self.recovering.remove(&i);
                self.bitmap_sure.remove(&i);
                self.start(what).await?;
            }
            Op::Fail(i, force) => {
                let i = i % n;
                if self.a.is_none() || self.dead {
                    return Ok(());
                }
                if self.background {
                    self.settle().await?;
                }
                if self.out.contains(&i) {
                    return Ok(());
                }
                let name = self.devs[i].name().to_string();
                let past = self.past_with(i, false);
                if !past && self.past_with(i, true) {
                    // Members of this group meant to be left out of the next start come
                    // back to it instead.
                    let g = self.group(i);
                    self.hidden.retain(|&s| s / self.width != g);
                }
                let r = self.a().fail(&name, force).await;
                if past && !force {
                    prop_assert!(
                        matches!(r, Err(Error::WouldFail(ref m)) if m.advice.iter().any(|s| matches!(s, Step::Force { .. }))),
                        "{}: failing {} past the redundancy: {:?}",
                        what,
                        name,
                        r
                    );
                    self.fig.refused_past_redundancy += 1;
                    return Ok(());
                }
                r.map_err(|e| TestCaseError::fail(format!("{what}: fail {name}: {e}")))?;
                let was_recovering = self.recovering.remove(&i);
                self.out.insert(i);
                if was_recovering {
                    self.bitmap_sure.remove(&i);
                } else {
                    self.bitmap_sure.insert(i);
                }
                if past {
                    self.dead = true;
                    prop_assert_eq!(self.a().status().state, "failed");
                } else {
                    prop_assert_ne!(self.a().status().state, "failed");
                }
                self.check_all(&format!("{what}: after failing {name}"))
                    .await?;
            }
            Op::ReAdd(i) => {
                let i = i % n;
                if self.a.is_none()
                    || self.dead
                    || !self.out.contains(&i)
                    || self.hidden.contains(&i)
                {
                    return Ok(());
                }
                self.re_add(i, what).await?;
            }
            Op::Settle => {
                if self.a.is_some() {
                    self.settle().await?;
                }
            }
            Op::Grow(level) => self.grow(level, what).await?,
            Op::Narrow => self.narrow(what).await?,
            Op::Rechunk(up) => self.rechunk(up, what).await?,
        }
        Ok(())
    }

    /// Grow the array with new devices (appended: the model's device index stays the
    /// slot), run the reshape or rebuild to its end, and check everything reads back;
    /// the new space reads as zeros.
    async fn grow(&mut self, level: bool, what: &str) -> Result<(), TestCaseError> {
        if !self.may_grow() {
            return Ok(());
        }
        self.settle().await?;
        let a = self.a().clone();
        let g = a.geometry();
        let (to, add) = match g.level {
            sbod_core::Level::Raid5 if level => (Some(sbod_core::Level::Raid6), 1),
            sbod_core::Level::Raid10 => (None, g.width as usize),
            _ => (None, 1),
        };
        let n = self.devs.len();
        let extra: Vec<Arc<MemDev>> = (0..add)
            .map(|i| Arc::new(MemDev::new(format!("m{}", n + i), self.dev_size)))
            .collect();
        let r = a
            .grow_to(to, extra.iter().map(spec_of).collect(), false, false)
            .await;
        let out = match r {
            Ok(o) => o,
            Err(e) => {
                // Refused (an ec group at its limit, windows that do not fit): nothing changed.
                prop_assert_eq!(
                    a.geometry(),
                    g,
                    "{}: a refused grow changed it: {}",
                    what,
                    e
                );
                return Ok(());
            }
        };
        self.grown += 1;
        self.fig.grows += 1;
        self.devs.extend(extra);
        if matches!(out, sbod_core::GrowOutcome::Reshaping { .. }) {
            self.reshaped(&a, what).await?;
        } else {
            // New copies or parity: rebuilt.
            for i in n..self.devs.len() {
                self.recovering.insert(i);
            }
            self.settle().await?;
        }
        let now = a.geometry();
        self.width = now.width as usize;
        self.red = now.redundancy();
        let blocks = a.size() / BLOCK as u64;
        while (self.blocks.now.len() as u64) < blocks {
            self.blocks.now.push(0);
            self.blocks.ever.push(BTreeSet::from([0]));
        }
        // The reshape or rebuild wrote everywhere: any region may be in the bitmap.
        self.touched
            .extend(0..now.member_size.div_ceil(self.region));
        self.check_all(&format!("{what}: after the grow")).await
    }
}

impl Life {
    /// A grow or narrowing may run now: a running array, every member in service, at
    /// most two per life.
    fn may_grow(&self) -> bool {
        self.a.is_some()
            && !self.dead
            && self.grown < 2
            && self.out.is_empty()
            && self.hidden.is_empty()
            && self.restored.is_empty()
    }

    /// Run the reshape a grow started to its end (in the background, or here).
    async fn reshaped(&self, a: &Arc<Array>, what: &str) -> Result<(), TestCaseError> {
        if self.background {
            for _ in 0..20_000 {
                if a.status().state != "reshaping" {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(2)).await;
            }
            prop_assert_ne!(
                a.status().state,
                "reshaping",
                "{}: the reshape did not end",
                what
            );
        } else {
            a.reshape_now()
                .await
                .map_err(|e| TestCaseError::fail(format!("{what}: reshape: {e}")))?;
        }
        Ok(())
    }

    /// Let the last member of a one-group raid0/5/6/ec go (`grow --remove --force`), run
    /// the reshape to its end, and check everything below the new size reads back.
    async fn narrow(&mut self, what: &str) -> Result<(), TestCaseError> {
        if !self.may_grow() {
            return Ok(());
        }
        self.settle().await?;
        let a = self.a().clone();
        let g = a.geometry();
        let min = match g.level {
            sbod_core::Level::Raid0 => 2,
            sbod_core::Level::Raid5 => 4,
            sbod_core::Level::Raid6 => 5,
            sbod_core::Level::Ec { k, .. } if k > 1 => 0,
            _ => usize::MAX,
        };
        if g.groups != 1 || self.devs.len() != g.width as usize || (g.width as usize) < min {
            return Ok(());
        }
        let last = self.devs.len() - 1;
        let name = self.devs[last].name().to_string();
        let r = a.grow_remove(&[name], true).await;
        if let Err(e) = r {
            prop_assert_eq!(
                a.geometry(),
                g,
                "{}: a refused narrowing changed it: {}",
                what,
                e
            );
            return Ok(());
        }
        self.grown += 1;
        self.fig.narrowings += 1;
        self.reshaped(&a, what).await?;
        // The member let go is no member any more: no later op names it.
        self.devs.pop();
        self.snaps.remove(&last);
        self.bitmap_sure.remove(&last);
        let now = a.geometry();
        prop_assert_eq!(now.width as usize, last, "{}: {:?}", what, now);
        self.width = now.width as usize;
        self.red = now.redundancy();
        let blocks = (a.size() / BLOCK as u64) as usize;
        self.blocks.now.truncate(blocks);
        self.blocks.ever.truncate(blocks);
        self.touched
            .extend(0..now.member_size.div_ceil(self.region));
        self.check_all(&format!("{what}: after the narrowing"))
            .await
    }
}

impl Life {
    /// A new chunk, twice or half the one it has (`grow --chunk --force`), run to its end:
    /// what was below the size it kept meanwhile reads back, the rows past it read as
    /// zeros.
    async fn rechunk(&mut self, up: bool, what: &str) -> Result<(), TestCaseError> {
        if !self.may_grow() {
            return Ok(());
        }
        self.settle().await?;
        let a = self.a().clone();
        let g = a.geometry();
        use sbod_core::Level as L;
        if !matches!(
            g.level,
            L::Raid0 | L::Raid5 | L::Raid6 | L::Ec { .. } | L::Raid10
        ) {
            return Ok(());
        }
        let chunk = if up { g.chunk * 2 } else { g.chunk / 2 };
        let big = a.size();
        if let Err(e) = a.grow_chunk(chunk, true).await {
            prop_assert_eq!(
                a.geometry(),
                g,
                "{}: a refused new chunk changed it: {}",
                what,
                e
            );
            return Ok(());
        }
        let kept = a.size();
        prop_assert!(kept < big, "{}: no backup area set aside", what);
        self.grown += 1;
        self.fig.rechunks += 1;
        self.reshaped(&a, what).await?;
        let now = a.geometry();
        prop_assert_eq!(now.chunk, chunk, "{}: {:?}", what, now);
        let size = a.size();
        prop_assert!(size <= big && size > kept, "{}: {} of {}", what, size, big);
        let blocks = (size / BLOCK as u64) as usize;
        for b in (kept / BLOCK as u64) as usize..blocks {
            self.blocks.now[b] = 0;
            self.blocks.ever[b].insert(0);
        }
        self.blocks.now.truncate(blocks);
        self.blocks.ever.truncate(blocks);
        self.touched
            .extend(0..now.member_size.div_ceil(self.region));
        self.check_all(&format!("{what}: after the new chunk"))
            .await
    }
}

fn run_life(
    l: Layout,
    background: bool,
    chunk: u32,
    chunks: u64,
    ops: &[Op],
    fig: &Mutex<Figures>,
) -> Result<(), TestCaseError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let size = MIB + chunks * chunk as u64;
        let devs: Vec<Arc<MemDev>> = (0..l.members)
            .map(|i| Arc::new(MemDev::new(format!("m{i}"), size)))
            .collect();
        let spec = CreateSpec {
            name: "life".into(),
            level: l.level,
            chunk,
            groups: 1,
            spares: 0,
            declustered: false,
            copies: l.copies,
            bitmap_region: Some(2 * chunk as u64),
            assume_clean: true,
            integrity: sbod_core::integrity::Kind::Crc32c,
            force: false,
        };
        let a = Array::create(spec, devs.iter().map(spec_of).collect())
            .await
            .expect("create");
        let blocks = a.size() / BLOCK as u64;
        let width = a.geometry().width as usize;
        let red = a.geometry().redundancy();
        let region = a.status().bitmap_region.expect("bitmap");
        a.close().await.unwrap();
        let mut life = Life {
            l,
            background,
            devs,
            a: None,
            blocks: Blocks::new(blocks),
            next_tag: 1,
            width,
            red,
            region,
            hidden: BTreeSet::new(),
            out: BTreeSet::new(),
            recovering: BTreeSet::new(),
            restored: BTreeSet::new(),
            bitmap_sure: BTreeSet::new(),
            snaps: HashMap::new(),
            touched: BTreeSet::new(),
            last_stop_crash: false,
            dead: false,
            rescued: false,
            forked: false,
            grown: 0,
            dev_size: size,
            fig: Figures::default(),
        };
        life.start("first start").await?;
        for (k, op) in ops.iter().enumerate() {
            let what = format!("{} step {k} {op:?}", life.l.name);
            life.step(op, &what).await?;
            life.fig.steps += 1;
        }
        // The end: stop and start once more with everything back.
        if !life.dead {
            life.hidden.clear();
            life.stop(false).await;
            life.start("final start").await?;
            life.settle().await?;
            life.check_all("final read-back").await?;
            if !life.rescued {
                let h = life.a().start_scrub(false);
                if let Ok(h) = h {
                    h.wait().await;
                    prop_assert_eq!(h.status().mismatches, 0, "scrub after the life");
                }
            }
        }
        life.stop(false).await;
        life.fig.cases = 1;
        let mut f = fig.lock().unwrap();
        let x = &life.fig;
        f.cases += x.cases;
        f.steps += x.steps;
        f.starts += x.starts;
        f.refused_missing += x.refused_missing;
        f.refused_past_redundancy += x.refused_past_redundancy;
        f.stale_found += x.stale_found;
        f.bitmap_recoveries += x.bitmap_recoveries;
        f.full_recoveries += x.full_recoveries;
        f.re_adds += x.re_adds;
        f.rescues += x.rescues;
        f.blocks_verified += x.blocks_verified;
        f.errors_returned += x.errors_returned;
        f.wrong += x.wrong;
        f.grows += x.grows;
        f.narrowings += x.narrowings;
        f.rechunks += x.rechunks;
        Ok(())
    })
}

#[test]
fn lives_of_an_array_never_return_wrong_data() {
    let cases: u32 = std::env::var("SBOD_LIFECYCLE_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let fig = Mutex::new(Figures::default());
    let mut runner = TestRunner::new(Config {
        cases,
        // A failure found once is kept (next to this file) and tried first on every run.
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        source_file: Some(file!()),
        ..Config::default()
    });
    let strat = (
        0usize..LAYOUTS.len(),
        any::<bool>(),
        prop_oneof![Just(4096u32), Just(8192)],
        12u64..32,
        proptest::collection::vec(op(), 1..50),
    );
    runner
        .run(&strat, |(li, background, chunk, chunks, ops)| {
            run_life(LAYOUTS[li], background, chunk, chunks, &ops, &fig)
        })
        .unwrap();
    let f = fig.into_inner().unwrap();
    assert_eq!(f.wrong, 0);
    // The grow verbs ran in these lives, not only in the other suites.
    assert!(f.grows > 0 || cases < 20, "no life grew its array: {f:?}");
    report(serde_json::json!({
        "test": "lifecycle",
        "cases": f.cases,
        "steps": f.steps,
        "starts": f.starts,
        "refused_missing": f.refused_missing,
        "refused_past_redundancy": f.refused_past_redundancy,
        "stale_found": f.stale_found,
        "bitmap_recoveries": f.bitmap_recoveries,
        "full_recoveries": f.full_recoveries,
        "re_adds": f.re_adds,
        "rescues": f.rescues,
        "blocks_verified": f.blocks_verified,
        "errors_returned": f.errors_returned,
        "wrong": f.wrong,
        "grows": f.grows,
        "narrowings": f.narrowings,
        "rechunks": f.rechunks,
    }));
}

/// A member leaves and returns (issue 28): its host goes away (or its disk is pulled) just
/// as the array records a superblock, the one by which the sweeper moves the event since
/// which the bitmap covers every write (`bitmap_since`), so its last superblock is older
/// than that. No bit is cleared while it is out, so the bitmap still holds everything it
/// missed: when it answers again it is resynced from the bitmap (only the regions written
/// while it was away, far less than the member), and its data is right (read back with
/// another member failed, so that the returned one must serve). Before the fix it was
/// rebuilt in full ("the bitmap does not cover event N").
#[test]
fn a_member_that_leaves_and_returns_is_resynced_from_the_bitmap() {
    leaves_and_returns(false);
}

/// The same with the whole disk pulled (every request fails, as a vanished device) and
/// pushed back in.
#[test]
fn a_disk_pulled_and_pushed_back_is_resynced_from_the_bitmap() {
    leaves_and_returns(true);
}

fn leaves_and_returns(pulled: bool) {
    use sbod_core::superblock::BITMAP_OFFSET;
    use sbod_testkit::fault::{FaultDev, FaultPlan};
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let chunk = 64 * 1024u32;
        let devs: Vec<Arc<FaultDev>> = (0..4)
            .map(|i| {
                let m: Arc<dyn BlockDev> = Arc::new(MemDev::new(format!("m{i}"), 9 * MIB));
                Arc::new(FaultDev::new(m, i as u64))
            })
            .collect();
        let specs = || -> Vec<MemberSpec> {
            devs.iter()
                .map(|d| MemberSpec {
                    dev: d.clone() as Arc<dyn BlockDev>,
                    path: d.name().to_string(),
                    is_file: false,
                    domain: String::new(),
                })
                .collect()
        };
        let spec = CreateSpec {
            name: "rejoin".into(),
            level: sbod_core::layout::Level::Raid5,
            chunk,
            groups: 1,
            spares: 0,
            declustered: false,
            copies: 1,
            bitmap_region: Some(2 * chunk as u64),
            assume_clean: true,
            integrity: sbod_core::integrity::Kind::Crc32c,
            force: false,
        };
        let a = Array::create(spec, specs()).await.expect("create");
        let size = a.size();
        let region = a.status().bitmap_region.expect("bitmap");
        let member_size = a.geometry().member_size;
        let all = blocks_of(1, 0, size / BLOCK as u64);
        a.write(0, AlignedBuf::from_slice(&all), false)
            .await
            .unwrap();
        a.close().await.unwrap();
        // Started again: its start moved the event past `bitmap_since`, so the sweeper's
        // next clear first records a new `bitmap_since`.
        let a = Array::assemble(specs(), AssembleOptions::default())
            .await
            .expect("assemble");
        let mut want = all;
        // m0's superblock area fails from now on (data and bitmap still work): it misses
        // the sweeper's superblock and goes out by it.
        if pulled {
            // Pulled just after the write below.
        } else {
            devs[0].set_plan(FaultPlan {
                write_eio: std::iter::once(0..BITMAP_OFFSET).collect(),
                ..Default::default()
            });
        }
        let mut tag = 2;
        let mut write = |at: u64, want: &mut Vec<u8>| {
            let first = at / BLOCK as u64;
            let b = blocks_of(tag, first, 4);
            tag += 1;
            want[at as usize..at as usize + b.len()].copy_from_slice(&b);
            b
        };
        let b = write(0, &mut want);
        a.write(0, AlignedBuf::from_slice(&b), false).await.unwrap();
        if pulled {
            devs[0].vanish();
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while a.status().members[0].state != "failed" {
            assert!(
                std::time::Instant::now() < deadline,
                "m0 never went out: {:?}",
                a.status().members[0]
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        // The fault really was injected: it went out by a failed write.
        assert!(
            pulled || devs[0].stats().snapshot().write_errors > 0,
            "{:?}",
            devs[0].stats().snapshot()
        );
        // Written while it is away: three regions far apart.
        let mut away = BTreeSet::new();
        for at in [size / 3, size / 2, size - 4 * BLOCK as u64] {
            let at = at / BLOCK as u64 * BLOCK as u64;
            let b = write(at, &mut want);
            a.write(at, AlignedBuf::from_slice(&b), false)
                .await
                .unwrap();
            away.insert(at);
        }
        a.flush().await.unwrap();
        // It answers again and goes back in.
        devs[0].set_plan(FaultPlan::default());
        devs[0].reappear();
        let r = a
            .re_add(MemberSpec {
                dev: devs[0].clone() as Arc<dyn BlockDev>,
                path: devs[0].name().to_string(),
                is_file: false,
                domain: String::new(),
            })
            .await
            .expect("re-add");
        // Each volume write touches one region of every member (a stripe), the first
        // perhaps one more: a bound of the regions written since it left.
        let bound = (away.len() as u64 + 2) * region;
        assert!(
            r.bitmap,
            "a member that came back is rebuilt in full, not from the bitmap: {r:?}"
        );
        assert!(r.planned_bytes <= bound, "{r:?} over {bound}");
        a.rebuild_now().await.unwrap();
        let st = a.status();
        assert_eq!(st.state, "optimal", "{st:?}");
        let rec = st
            .recoveries
            .iter()
            .rfind(|x| x.path == devs[0].name())
            .expect("its recovery");
        assert!(rec.bitmap && rec.state == "done", "{rec:?}");
        assert!(
            rec.recovered_bytes > 0
                && rec.recovered_bytes <= bound
                && rec.recovered_bytes < member_size / 8,
            "resynced {} bytes of a {member_size}-byte member, bound {bound}: {rec:?}",
            rec.recovered_bytes
        );
        // Its data is right: with another member out, every read needs it.
        a.fail(devs[1].name(), false).await.unwrap();
        let got = a.read(0, size as usize).await.unwrap();
        assert!(
            got[..] == want[..],
            "read back through the returned member differs"
        );
        a.close().await.unwrap();
    });
}
