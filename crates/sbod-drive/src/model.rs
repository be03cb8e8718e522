//! The timing model: a drive as a discrete-event system on a clock of nanoseconds.
//!
//! Pure: no threads, no real time. [`Model::submit`] hands the drive a command at a time,
//! [`Model::advance`] runs it up to a time and says which commands completed, and
//! [`Model::next_event`] says when something happens next. The real-time member
//! ([`crate::dev::ModelDev`]) drives it from CLOCK_MONOTONIC with one timer thread for all
//! drives; the tests drive it on virtual time, deterministically.
//!
//! Hand-written: no crate models disk mechanics at this grain (seek by distance, rotation,
//! zones, NCQ, write cache, actuators) that could be driven in real time.

use crate::link::{reserve_path, Dir, Link};
use crate::profile::{Hdd, Ssd};
use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, VecDeque};
use std::sync::Arc;

/// What a command does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Read,
    Write {
        fua: bool,
    },
    Flush,
    /// Deallocate (TRIM/UNMAP): no media work.
    Trim,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Op {
    pub kind: Kind,
    /// Member bytes.
    pub offset: u64,
    pub len: u64,
    /// High priority (the host's real-time I/O class, a drive's NCQ priority): first out
    /// of the host queue, and the drive serves it next, before nearer commands. The
    /// engine's ownership heartbeat asks for it (`IoClass::Urgent`).
    pub urgent: bool,
}

/// A drive's timing.
pub trait Model: Send {
    /// A command arrives at `now` (not before the model's last time). Its completion is
    /// reported by a later [`Model::advance`] (possibly at `now` itself). Call
    /// [`Model::advance`] to `now` first: events due before `now` must happen at their own
    /// times, not at the command's arrival.
    fn submit(&mut self, now: u64, id: u64, op: Op);
    /// Run up to `now`; push the ids of the commands that completed.
    fn advance(&mut self, now: u64, done: &mut Vec<u64>);
    /// When the next internal event is due, if any.
    fn next_event(&self) -> Option<u64>;
    /// Nanoseconds of model time the media spent on commands, and of that, moving data
    /// (the rest is seeks, settles and rotation), for `SBOD_DRIVE_STATS`.
    fn media_ns(&self) -> (u64, u64) {
        (0, 0)
    }
    /// Where the media time went, by kind of operation, for `SBOD_DRIVE_STATS` (empty
    /// where the model does not say).
    fn breakdown(&self) -> String {
        String::new()
    }
}

const NS: f64 = 1e9;

/// Where a member's bytes lie on an HDD actuator: zones and tracks.
///
/// Tracks are evenly spaced in radius from the outer (radius 1) to the inner diameter
/// (radius `rho` = inner rate / outer rate) and hold bytes in proportion to their radius.
/// `rev(u)`, the tracks (revolutions) from the outer edge to byte `u` of the actuator, has
/// a closed form; it gives the cylinder a byte lies on (for seeks) and its angle (for
/// rotation). A member smaller than the drive is spread over the whole stroke with
/// `scale` = actuator bytes / member bytes per actuator (span=full): a member byte `x`
/// lies at drive byte `x * scale` for seeks and zones, and transfers run at the rate of
/// that zone; with `scale` 1 (span=size) the member is the drive's first bytes.
#[derive(Clone, Debug)]
pub struct Geometry {
    /// Bytes of one actuator's share of the drive.
    cap: f64,
    /// 1 - rho^2.
    k: f64,
    /// Bytes on the outermost track.
    outer_track: f64,
    /// Revolutions over the whole stroke.
    total_revs: f64,
    pub rev_ns: f64,
    pub scale: f64,
    /// Seek curve: t(d) = track + a*sqrt(d) + b*d (ns) for a fraction d of the stroke.
    seek_track: f64,
    seek_a: f64,
    seek_b: f64,
}

impl Geometry {
    pub fn new(p: &Hdd, member_per_actuator: u64, full_span: bool) -> Geometry {
        let n = p.actuators.max(1) as f64;
        let cap = p.capacity as f64 / n;
        let rho = p.inner_mbps / p.outer_mbps;
        let rev_ns = 60.0 * NS / p.rpm;
        let outer_track = p.outer_mbps * 1e6 / n * rev_ns / NS;
        let k = (1.0 - rho * rho).max(1e-9);
        let scale = if full_span && member_per_actuator > 0 {
            cap / member_per_actuator as f64
        } else {
            1.0
        };
        // Average over uniformly random pairs of cylinders: E[sqrt d] = 8/15, E[d] = 1/3.
        let ms = 1e6;
        let track = p.seek_track_ms * ms;
        let full = p.seek_full_ms * ms - track;
        let avg = p.seek_avg_ms * ms - track;
        let a = (5.0 * (avg - full / 3.0)).clamp(0.0, full);
        let b = full - a;
        let mut g = Geometry {
            cap,
            k,
            outer_track,
            total_revs: 0.0,
            rev_ns,
            scale,
            seek_track: track,
            seek_a: a,
            seek_b: b,
        };
        g.total_revs = g.rev(cap);
        g
    }

    /// Tracks from the outer edge to drive byte `u` of the actuator.
    fn rev(&self, u: f64) -> f64 {
        let e = self.k * (u / self.cap);
        let rad = (1.0 - e).max(0.0).sqrt();
        // 1 - rad, without cancellation near the outer edge.
        let one_minus = e / (1.0 + rad);
        2.0 * self.cap / (self.k * self.outer_track) * one_minus
    }

    /// The cylinder of member byte `x`, as a fraction of the stroke.
    pub fn cylinder(&self, x: u64) -> f64 {
        self.rev(x as f64 * self.scale) / self.total_revs
    }

    /// Revolutions the platter turns while member bytes `[x0, x1)` pass under the head.
    pub fn revs(&self, x0: u64, x1: u64) -> f64 {
        (self.rev(x1 as f64 * self.scale) - self.rev(x0 as f64 * self.scale)) / self.scale
    }

    /// The angle (fraction of a turn) at which member byte `x` starts.
    pub fn angle(&self, x: u64) -> f64 {
        (self.rev(x as f64 * self.scale) / self.scale).fract()
    }

    /// Nanoseconds to transfer `[x0, x1)` from the medium.
    pub fn transfer_ns(&self, x0: u64, x1: u64) -> f64 {
        self.revs(x0, x1) * self.rev_ns
    }

    /// The media rate (bytes/s) at member byte `x`.
    pub fn rate_at(&self, x: u64) -> f64 {
        let u = x as f64 * self.scale;
        let rad = (1.0 - self.k * u / self.cap).max(0.0).sqrt();
        self.outer_track * rad / self.rev_ns * NS
    }

    /// Seek time (ns) over a fraction `d` of the stroke; 0 on the same track.
    pub fn seek_ns(&self, d: f64) -> f64 {
        if d * self.total_revs < 1.0 {
            return 0.0;
        }
        self.seek_track + self.seek_a * d.sqrt() + self.seek_b * d
    }
}

#[derive(Clone, Copy, Debug)]
struct MediaOp {
    /// The command to complete when this finishes (None: a destage of cached data).
    ack: Option<u64>,
    write: bool,
    offset: u64,
    len: u64,
    /// When the drive had the command (ns), for the overhead and for aging.
    arrive: u64,
    /// Destage order (flushes wait for the ones before them).
    seq: u64,
    /// Not to finish before (its data crossed the links).
    not_before: u64,
    /// Served before the rest (see [`Op::urgent`]).
    urgent: bool,
}

#[derive(Clone, Debug)]
struct Actuator {
    busy: Option<(MediaOp, u64)>,
    /// Where the head is: the member byte after the last transfer, and when it got there.
    head: u64,
    head_t: u64,
    /// The last transfer was a read: the drive reads ahead from `head` while idle.
    reading: bool,
    /// Where the current read stream began: the bytes from here (at most `read_ahead_bytes`
    /// back) to `head` went through the drive's buffer and are still in it.
    seg_lo: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    Ack(u64),
    Actuator(usize),
}

/// A command waiting for the drive to take it (the host's queue past the drive's depth).
#[derive(Clone, Copy, Debug)]
struct Cmd {
    id: u64,
    op: Op,
}

/// Longest a command waits while the scheduler prefers others (firmware's aging bound).
const AGING_NS: u64 = 1_000_000_000;
/// How many queued destages the scheduler looks at (the oldest ones).
const DESTAGE_WINDOW: usize = 64;

/// An HDD: mechanics, NCQ, write cache, read-ahead, actuators, links.
pub struct HddModel {
    p: Hdd,
    geo: Geometry,
    /// Member bytes per actuator.
    per_act: u64,
    links: Vec<Arc<Link>>,
    t: u64,
    seq: u64,
    host: VecDeque<Cmd>,
    /// Commands the drive holds (queued, in flight, or being acknowledged).
    in_drive: u32,
    /// Media operations that complete a command (reads, writes through).
    queued: Vec<MediaOp>,
    /// Cached writes to destage, oldest first.
    destage: VecDeque<MediaOp>,
    /// Seqs of destages not finished (queued or in flight).
    dirty_seqs: BTreeSet<u64>,
    dirty_bytes: u64,
    /// Writes taken by the drive, waiting for room in the cache.
    blocked: VecDeque<(Cmd, u64)>,
    /// FLUSHes waiting: (id, the last destage seq they cover).
    flushes: Vec<(u64, u64)>,
    acts: Vec<Actuator>,
    events: BinaryHeap<Reverse<(u64, Ev)>>,
    /// By kind of operation (cached writes destaged, writes through the cache, reads):
    /// count, media ns, of it transferring, and how many did not start where the head was
    /// ([`Model::media_ns`] is their sum, [`Model::breakdown`] each).
    by_kind: [[u64; 4]; 3],
}

impl HddModel {
    /// `member` bytes of member on this drive; `full_span`: spread them over the stroke.
    pub fn new(p: Hdd, member: u64, full_span: bool, links: Vec<Arc<Link>>) -> HddModel {
        let n = p.actuators.max(1) as u64;
        let per_act = member.div_ceil(n).max(1);
        let geo = Geometry::new(&p, per_act, full_span);
        let mut links = links;
        links.insert(0, Link::local("interface", p.interface_mbps * 1e6));
        HddModel {
            geo,
            per_act,
            links,
            t: 0,
            seq: 0,
            host: VecDeque::new(),
            in_drive: 0,
            queued: Vec::new(),
            destage: VecDeque::new(),
            dirty_seqs: BTreeSet::new(),
            dirty_bytes: 0,
            blocked: VecDeque::new(),
            flushes: Vec::new(),
            acts: vec![
                Actuator {
                    busy: None,
                    head: 0,
                    head_t: 0,
                    reading: false,
                    seg_lo: 0,
                };
                n as usize
            ],
            events: BinaryHeap::new(),
            by_kind: [[0; 4]; 3],
            p,
        }
    }

    pub fn geometry(&self) -> &Geometry {
        &self.geo
    }

    fn actuator_of(&self, offset: u64) -> usize {
        ((offset / self.per_act) as usize).min(self.acts.len() - 1)
    }

    /// Offset within the actuator's share.
    fn local(&self, offset: u64) -> u64 {
        let a = self.actuator_of(offset) as u64;
        offset - a * self.per_act
    }

    fn at(&mut self, t: u64, ev: Ev) {
        self.events.push(Reverse((t, ev)));
    }

    fn overhead(&self) -> u64 {
        (self.p.command_us * 1e3) as u64
    }

    /// The drive takes a command from the host queue.
    fn accept(&mut self, c: Cmd) {
        let t = self.t;
        self.in_drive += 1;
        self.seq += 1;
        let seq = self.seq;
        match c.op.kind {
            Kind::Read => self.queued.push(MediaOp {
                ack: Some(c.id),
                write: false,
                offset: c.op.offset,
                len: c.op.len,
                arrive: t,
                seq,
                not_before: 0,
                urgent: c.op.urgent,
            }),
            Kind::Write { fua } if fua || !self.p.write_cache => {
                let landed = reserve_path(&self.links, Dir::Down, t, c.op.len);
                self.queued.push(MediaOp {
                    ack: Some(c.id),
                    write: true,
                    offset: c.op.offset,
                    len: c.op.len,
                    arrive: t,
                    seq,
                    not_before: landed,
                    urgent: c.op.urgent,
                })
            }
            Kind::Write { .. } => {
                if self.blocked.is_empty() && self.room_for(c.op.len) {
                    self.cache_write(c, seq);
                } else {
                    self.blocked.push_back((c, seq));
                }
            }
            Kind::Flush => {
                if !self.p.write_cache {
                    let done = t + self.overhead();
                    self.at(done, Ev::Ack(c.id));
                } else {
                    self.flushes.push((c.id, seq));
                    self.check_flushes();
                }
            }
            Kind::Trim => {
                let done = t + self.overhead();
                self.at(done, Ev::Ack(c.id));
            }
        }
    }

    fn room_for(&self, len: u64) -> bool {
        self.dirty_bytes == 0 || self.dirty_bytes + len <= self.p.write_cache_bytes
    }

    /// A write lands in the cache: acknowledged once its data crossed the links.
    fn cache_write(&mut self, c: Cmd, seq: u64) {
        let t = self.t;
        let landed = reserve_path(&self.links, Dir::Down, t, c.op.len);
        self.dirty_bytes += c.op.len;
        self.dirty_seqs.insert(seq);
        self.destage.push_back(MediaOp {
            ack: None,
            write: true,
            offset: c.op.offset,
            len: c.op.len,
            arrive: landed,
            seq,
            not_before: landed,
            urgent: false,
        });
        let ack = landed.max(t + self.overhead());
        self.at(ack, Ev::Ack(c.id));
    }

    fn check_flushes(&mut self) {
        let oldest = self.dirty_seqs.first().copied().unwrap_or(u64::MAX);
        let t = self.t + (self.p.flush_us * 1e3) as u64;
        let mut i = 0;
        while i < self.flushes.len() {
            if self.flushes[i].1 < oldest {
                let (id, _) = self.flushes.swap_remove(i);
                self.at(t, Ev::Ack(id));
            } else {
                i += 1;
            }
        }
    }

    /// When a media op on actuator `a` would end if started now (and when its transfer
    /// would begin).
    fn cost(&self, a: usize, op: &MediaOp) -> u64 {
        let act = &self.acts[a];
        let g = &self.geo;
        let x0 = self.local(op.offset);
        let x1 = x0 + op.len;
        let ready = self.t.max(op.arrive + self.overhead());
        // A read of bytes the stream already passed (a request that arrived after the ones
        // around it): they are in the drive's buffer, the media is not involved.
        if act.reading && !op.write && x0 >= self.kept_from(act) && x1 <= act.head {
            return ready;
        }
        // Read-ahead: the drive kept reading after its last read; a read within that
        // stream needs no positioning and finishes when the stream reaches its end.
        if act.reading && !op.write && x0 >= act.head && x1 <= act.head + self.p.read_ahead_bytes {
            let stream = act.head_t as f64 + g.transfer_ns(act.head, x1);
            return (stream as u64).max(ready);
        }
        let seek = g.seek_ns((g.cylinder(x0) - g.cylinder(act.head)).abs())
            + if op.write {
                self.p.write_settle_ms * 1e6
            } else {
                0.0
            };
        let on_track = ready as f64 + seek;
        let angle_now = (on_track / g.rev_ns).fract();
        let mut wait = (g.angle(x0) - angle_now).rem_euclid(1.0);
        // The next sector under the head: float noise must not cost a whole turn.
        if wait > 1.0 - 1e-6 {
            wait = 0.0;
        }
        let start = on_track + wait * g.rev_ns;
        let end = (start + g.transfer_ns(x0, x1)) as u64;
        end.max(op.not_before)
    }

    /// The lowest byte a read stream still holds in the buffer: what it streamed since it
    /// began, at most `read_ahead_bytes` back from the head (one cache segment).
    fn kept_from(&self, act: &Actuator) -> u64 {
        act.seg_lo
            .max(act.head.saturating_sub(self.p.read_ahead_bytes))
    }

    /// Start idle actuators on the best queued work.
    fn dispatch(&mut self) {
        for a in 0..self.acts.len() {
            if self.acts[a].busy.is_some() {
                continue;
            }
            let mut best: Option<(u64, bool, usize, u64)> = None; // (end, destage?, index, arrive)
            let mut oldest: Option<(u64, bool, usize)> = None;
            let consider = |best: &mut Option<(u64, bool, usize, u64)>,
                            oldest: &mut Option<(u64, bool, usize)>,
                            end: u64,
                            d: bool,
                            i: usize,
                            arrive: u64| {
                if best.is_none_or(|b| end < b.0) {
                    *best = Some((end, d, i, arrive));
                }
                if oldest.is_none_or(|o| arrive < o.0) {
                    *oldest = Some((arrive, d, i));
                }
            };
            for (i, op) in self.queued.iter().enumerate() {
                if self.actuator_of(op.offset) != a {
                    continue;
                }
                let end = if self.p.sptf {
                    self.cost(a, op)
                } else {
                    op.seq
                };
                consider(&mut best, &mut oldest, end, false, i, op.arrive);
            }
            for (i, op) in self.destage.iter().take(DESTAGE_WINDOW).enumerate() {
                if self.actuator_of(op.offset) != a || op.arrive > self.t {
                    continue;
                }
                let end = if self.p.sptf {
                    self.cost(a, op)
                } else {
                    op.seq
                };
                consider(&mut best, &mut oldest, end, true, i, op.arrive);
            }
            let Some(b) = best else { continue };
            // An urgent command goes next (the oldest, if several), then aging, then the
            // scheduler's choice.
            let urgent = self
                .queued
                .iter()
                .enumerate()
                .filter(|(_, op)| op.urgent && self.actuator_of(op.offset) == a)
                .min_by_key(|(_, op)| op.arrive)
                .map(|(i, _)| (false, i));
            let (d, i) = match (urgent, oldest) {
                (Some(u), _) => u,
                (None, Some((arr, d, i))) if self.t.saturating_sub(arr) > AGING_NS => (d, i),
                _ => (b.1, b.2),
            };
            let op = if d {
                self.destage.remove(i).expect("index from the scan")
            } else {
                self.queued.swap_remove(i)
            };
            let end = self.cost(a, &op);
            let x0 = self.local(op.offset);
            let k = &mut self.by_kind[if d {
                0
            } else if op.write {
                1
            } else {
                2
            }];
            k[0] += 1;
            k[1] += end.saturating_sub(self.t);
            k[2] += self.geo.transfer_ns(x0, x0 + op.len) as u64;
            k[3] += u64::from(x0 != self.acts[a].head);
            self.acts[a].busy = Some((op, end));
            self.at(end, Ev::Actuator(a));
        }
        // A destage not yet landed (its data still on the links) wakes the drive then.
        if let Some(first) = self
            .destage
            .iter()
            .map(|o| o.arrive)
            .filter(|&t| t > self.t)
            .min()
        {
            if self.acts.iter().any(|a| a.busy.is_none())
                && !self.events.iter().any(|e| e.0 .0 == first)
            {
                self.at(first, Ev::Actuator(usize::MAX));
            }
        }
    }

    fn handle(&mut self, ev: Ev, done: &mut Vec<u64>) {
        match ev {
            Ev::Ack(id) => {
                self.in_drive -= 1;
                done.push(id);
            }
            Ev::Actuator(usize::MAX) => {}
            Ev::Actuator(a) => {
                let Some((op, _)) = self.acts[a].busy.take() else {
                    return;
                };
                let x0 = self.local(op.offset);
                let x1 = x0 + op.len;
                let ra = self.p.read_ahead_bytes;
                let kept = self.kept_from(&self.acts[a]);
                let act = &mut self.acts[a];
                let streaming = act.reading && !op.write;
                if streaming && x0 >= kept && x1 <= act.head {
                    // Served from the buffer: the stream goes on where it was.
                } else {
                    // A read that went on from the stream keeps its segment; anything
                    // else starts a new one where it began.
                    if !(streaming && x0 >= act.head && x1 <= act.head + ra) {
                        act.seg_lo = x0;
                    }
                    act.head = x1;
                    act.head_t = self.t;
                    act.reading = !op.write;
                }
                match op.ack {
                    Some(id) if !op.write => {
                        // The data goes up while the medium reads: the links end it no
                        // earlier than the media does.
                        let xfer = self.links[0].cost(op.len);
                        let up =
                            reserve_path(&self.links, Dir::Up, self.t - xfer.min(self.t), op.len);
                        self.at(up.max(self.t), Ev::Ack(id));
                    }
                    Some(id) => self.at(self.t, Ev::Ack(id)),
                    None => {
                        self.dirty_bytes -= op.len;
                        self.dirty_seqs.remove(&op.seq);
                        while let Some(&(c, seq)) = self.blocked.front() {
                            if !self.room_for(c.op.len) {
                                break;
                            }
                            self.blocked.pop_front();
                            self.cache_write(c, seq);
                        }
                        self.check_flushes();
                    }
                }
            }
        }
    }

    fn fill(&mut self) {
        while self.in_drive < self.p.queue_depth {
            let Some(c) = self.host.pop_front() else {
                break;
            };
            self.accept(c);
        }
    }
}

impl Model for HddModel {
    fn submit(&mut self, now: u64, id: u64, op: Op) {
        self.t = self.t.max(now);
        if op.urgent {
            self.host.push_front(Cmd { id, op });
        } else {
            self.host.push_back(Cmd { id, op });
        }
        self.fill();
        self.dispatch();
    }

    fn advance(&mut self, now: u64, done: &mut Vec<u64>) {
        while let Some(&Reverse((t, ev))) = self.events.peek() {
            if t > now {
                break;
            }
            self.events.pop();
            self.t = self.t.max(t);
            self.handle(ev, done);
            self.fill();
            self.dispatch();
        }
        self.t = self.t.max(now);
    }

    fn next_event(&self) -> Option<u64> {
        self.events.peek().map(|e| e.0 .0)
    }

    fn media_ns(&self) -> (u64, u64) {
        self.by_kind
            .iter()
            .fold((0, 0), |(busy, xfer), k| (busy + k[1], xfer + k[2]))
    }
    fn breakdown(&self) -> String {
        let names = [
            "cached writes destaged",
            "writes through the cache",
            "reads",
        ];
        names
            .iter()
            .zip(self.by_kind)
            .map(|(name, [n, busy, xfer, away])| {
                format!(
                    "{name}: {n}, {} ms ({} ms transferring), {away} not where the head was",
                    busy / 1_000_000,
                    xfer / 1_000_000
                )
            })
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// An SSD: per-command latency, and IOPS and bandwidth ceilings as virtual-time pacing.
pub struct SsdModel {
    p: Ssd,
    links: Vec<Arc<Link>>,
    t: u64,
    host: VecDeque<Cmd>,
    in_drive: u32,
    /// The ceilings: IOPS and bandwidth, per direction (read, write).
    iops: [Arc<Link>; 2],
    bw: [Arc<Link>; 2],
    events: BinaryHeap<Reverse<(u64, u64)>>,
}

impl SsdModel {
    pub fn new(p: Ssd, links: Vec<Arc<Link>>) -> SsdModel {
        let mut links = links;
        links.insert(0, Link::local("interface", p.interface_mbps * 1e6));
        // An IOPS ceiling is a link where each command is one "byte".
        SsdModel {
            iops: [
                Link::local("read iops", p.read_iops),
                Link::local("write iops", p.write_iops),
            ],
            bw: [
                Link::local("read bw", p.read_mbps * 1e6),
                Link::local("write bw", p.write_mbps * 1e6),
            ],
            links,
            t: 0,
            host: VecDeque::new(),
            in_drive: 0,
            events: BinaryHeap::new(),
            p,
        }
    }

    fn accept(&mut self, c: Cmd) {
        let t = self.t;
        self.in_drive += 1;
        let done = match c.op.kind {
            Kind::Read | Kind::Write { .. } => {
                let w = matches!(c.op.kind, Kind::Write { .. }) as usize;
                let lat = if w == 1 {
                    self.p.write_us
                } else {
                    self.p.read_us
                };
                let base = t + (lat * 1e3) as u64;
                // The IOPS ceiling paces commands, the bandwidth ceiling bytes; both from
                // arrival, and a command ends no sooner than its own latency.
                let iops = self.iops[w].reserve(Dir::Up, t, 1);
                let bw = self.bw[w].reserve(Dir::Up, t, c.op.len);
                let dir = if w == 1 { Dir::Down } else { Dir::Up };
                let link = reserve_path(&self.links, dir, t, c.op.len);
                base.max(iops).max(bw).max(link)
            }
            Kind::Flush => t + (self.p.flush_us * 1e3) as u64,
            Kind::Trim => t + (self.p.write_us * 1e3) as u64,
        };
        self.events.push(Reverse((done, c.id)));
    }

    fn fill(&mut self) {
        while self.in_drive < self.p.queue_depth {
            let Some(c) = self.host.pop_front() else {
                break;
            };
            self.accept(c);
        }
    }
}

impl Model for SsdModel {
    fn submit(&mut self, now: u64, id: u64, op: Op) {
        self.t = self.t.max(now);
        if op.urgent {
            self.host.push_front(Cmd { id, op });
        } else {
            self.host.push_back(Cmd { id, op });
        }
        self.fill();
    }

    fn advance(&mut self, now: u64, done: &mut Vec<u64>) {
        while let Some(&Reverse((t, id))) = self.events.peek() {
            if t > now {
                break;
            }
            self.events.pop();
            self.t = self.t.max(t);
            self.in_drive -= 1;
            done.push(id);
            self.fill();
        }
        self.t = self.t.max(now);
    }

    fn next_event(&self) -> Option<u64> {
        self.events.peek().map(|e| e.0 .0)
    }
}
