//! Write coalescing: partial stripes merged across client requests, as md's stripe cache does: the tail
//! of one sequential request and the head of the next (a 1 MiB stream over a 384 KiB
//! stripe splits one stripe in three) are written together as one full stripe, with
//! parity from the new data alone, instead of each reading the other's half first (4
//! member reads per MiB on raid6 of 8) and waiting for the other on the stripe lock.
//!
//! A partial stripe at the edge of a large request waits briefly, holding nothing (no
//! lock, no region), for a neighbouring write to the same stripe; a write that finds it
//! waiting adds its pieces, and whoever completes the stripe (or the first whose wait
//! runs out) writes everything coalesced in one stripe write and hands each the outcome.
//! Nobody is acknowledged before the write carrying its bytes completed on the members,
//! so what a read or a FLUSH sees, and what survives a fault, is as for separate writes.
//! Writes only join when their bytes do not overlap. Sharded like the stripe locks: no
//! table is shared by unrelated stripes' writes.
//!
//! Moved out of `parity.rs` unchanged (issue 30); "coalesce" is the one name for merging
//! writes (reading k shards is `read_shards`; the range decisions are
//! [`super::super::plan::written`]).

use super::super::plan::written;
use super::{NewData, Parity};
use crate::buf::AlignedBuf;
use crate::datapath::{slice_mut, slice_of, DataPath};
use crate::error::{Error, Result};
use crate::placement::StripeAddr;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::oneshot;

/// Partial stripes waiting for the write that completes them, sharded like the stripe
/// locks (see the module's documentation).
pub(super) struct Coalescer {
    shards: Vec<Mutex<HashMap<(usize, u64), Open>>>,
    /// Client writes in progress: with one (a client waiting for each write before the
    /// next) nobody can complete a stripe, so nothing waits.
    pub(super) writes: AtomicUsize,
    /// Waits in a row that ran out with nobody joining (no sequential stream): waiting
    /// stops, but for a probe now and then.
    misses: AtomicUsize,
    probes: AtomicUsize,
    ids: AtomicU64,
    wait: Duration,
    /// How many average latencies a partial stripe waits (`SBOD_GATHER_LATENCIES`).
    latencies: u32,
    /// Recent large client writes' time from arrival to completion, in ns (a moving
    /// average): how long a stream's next request can take to arrive (see
    /// [`Coalescer::wait`]).
    latency_ns: AtomicU64,
}

/// The longest a partial stripe waits for its neighbour, however slow the members.
const COALESCE_WAIT_MAX: Duration = Duration::from_millis(100);

/// A partial stripe waiting for more.
struct Open {
    id: u64,
    written: Vec<Option<Range<u64>>>,
    pieces: Vec<NewData>,
    fua: bool,
    waiting: Vec<oneshot::Sender<Result<()>>>,
}

const COALESCE_SHARDS: usize = 64;
/// Smaller client writes are never coalesced (random I/O).
pub(super) const COALESCE_MIN_WRITE: u64 = 32 << 10;

impl Coalescer {
    pub(super) fn new() -> Coalescer {
        Coalescer {
            shards: (0..COALESCE_SHARDS).map(|_| Mutex::default()).collect(),
            writes: AtomicUsize::new(0),
            misses: AtomicUsize::new(0),
            probes: AtomicUsize::new(0),
            ids: AtomicU64::new(0),
            // `SBOD_GATHER_US` (0: off), for A/B benchmarks.
            wait: crate::tuning::coalesce_wait(),
            latencies: crate::tuning::coalesce_latencies(),
            latency_ns: AtomicU64::new(0),
        }
    }

    /// A large client write took `d` from arrival to completion.
    pub(super) fn took(&self, d: Duration) {
        let ns = d.as_nanos().min(u64::MAX as u128) as u64;
        // An average over about the last 8 (racing updates lose one now and then: harmless).
        let old = self.latency_ns.load(Ordering::Relaxed);
        let new = if old == 0 { ns } else { old - old / 8 + ns / 8 };
        self.latency_ns.store(new, Ordering::Relaxed);
    }

    /// How long a partial stripe waits for the write that completes it. A client streaming
    /// at queue depth q has q writes in flight and sends the next when one completes, so
    /// the write after the newest arrives within about one write's latency: on members
    /// that answer in microseconds the fixed `SBOD_GATHER_US` covers it, on drives (a
    /// stripe write takes milliseconds, a 1 MiB client write at QD16 tens of them) the
    /// wait follows the writes' recent latency, up to [`COALESCE_WAIT_MAX`]. Where nobody
    /// comes (not a stream), `worth_waiting` stops the waits after a few misses.
    ///
    /// The latency is an average, and about a third of a stream's next requests come later
    /// than the average: with eight streams at QD2 each (the lab's connections), 34% of
    /// the waits ran out at one average, the misses then stopped the waiting, and 3.7
    /// member reads per 1 MiB request came back; at four averages (`SBOD_GATHER_LATENCIES`), 2% ran out
    /// and 0.04 reads a request were left (docs/PERFORMANCE.md, "One connection against
    /// eight"). A wait holds nothing (no lock, no region): waiting longer costs only the
    /// waiting write's own latency.
    fn wait(&self) -> Duration {
        let lat = Duration::from_nanos(self.latency_ns.load(Ordering::Relaxed));
        self.wait.max((lat * self.latencies).min(COALESCE_WAIT_MAX))
    }

    fn shard(&self, key: &(usize, u64)) -> &Mutex<HashMap<(usize, u64), Open>> {
        let h = (key.1 ^ (key.0 as u64).rotate_left(29)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        &self.shards[(h >> 58) as usize % COALESCE_SHARDS]
    }

    /// Whether a new partial stripe should wait for company: with another client write in
    /// progress here, or received by a server and coming (`queued`, see
    /// `Shared::queued_writes`).
    pub(super) fn worth_waiting(&self, queued: usize) -> bool {
        if self.wait.is_zero() || self.writes.load(Ordering::Relaxed).max(queued) < 2 {
            return false;
        }
        self.misses.load(Ordering::Relaxed) < 8
            || self
                .probes
                .fetch_add(1, Ordering::Relaxed)
                .is_multiple_of(64)
    }
}

/// Counts a client write in progress while alive.
pub(super) struct Writing<'a>(pub(super) &'a AtomicUsize);

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What becomes of a partial stripe offered for coalescing.
enum Joined {
    /// Write these pieces (everything coalesced) and tell the others.
    Run(Open),
    /// Wait for whoever writes it (id of the open entry).
    Wait(u64, oneshot::Receiver<Result<()>>),
    /// Write on its own.
    Alone,
}

impl Parity {
    /// A partial stripe write offered for coalescing with its neighbours (see the
    /// module's documentation); `wait`: it may wait for them.
    pub(super) async fn write_coalesced(
        &self,
        dp: &DataPath,
        addr: StripeAddr,
        new: Vec<NewData>,
        fua: bool,
        wait: bool,
    ) -> Result<()> {
        let g = &self.coalescer;
        let chunk = dp.geometry.chunk as u64;
        let key = (addr.group, addr.stripe);
        let mut mine: Vec<Option<Range<u64>>> = vec![None; self.k];
        for d in &new {
            mine[d.index] = Some(d.chunk_off..d.chunk_off + d.src.len() as u64);
        }
        let joined = {
            let mut sh = g.shard(&key).lock();
            match sh.get_mut(&key) {
                Some(open) => match written::join(&open.written, &mine) {
                    Some(union) => {
                        open.written = union;
                        open.pieces.extend(new.iter().cloned());
                        open.fua |= fua;
                        if written::whole(self.k, chunk, &open.written) {
                            Joined::Run(sh.remove(&key).expect("open"))
                        } else {
                            let (tx, rx) = oneshot::channel();
                            open.waiting.push(tx);
                            Joined::Wait(open.id, rx)
                        }
                    }
                    None => Joined::Alone,
                },
                None if wait && written::edge(self.k, chunk, &mine) => {
                    let id = g.ids.fetch_add(1, Ordering::Relaxed);
                    let (tx, rx) = oneshot::channel();
                    sh.insert(
                        key,
                        Open {
                            id,
                            written: mine,
                            pieces: new.clone(),
                            fua,
                            waiting: vec![tx],
                        },
                    );
                    Joined::Wait(id, rx)
                }
                None => Joined::Alone,
            }
        };
        let (id, mut rx) = match joined {
            Joined::Alone => return self.write_stripe(dp, addr, new, fua, Vec::new()).await,
            Joined::Run(open) => {
                g.misses.store(0, Ordering::Relaxed);
                return self.run_coalesced(dp, addr, open).await;
            }
            Joined::Wait(id, rx) => (id, rx),
        };
        let got = match tokio::time::timeout(g.wait(), &mut rx).await {
            Ok(got) => got,
            Err(_) => {
                // Nobody completed it in time: whoever comes first writes what there is.
                let taken = {
                    let mut sh = g.shard(&key).lock();
                    match sh.get(&key) {
                        Some(open) if open.id == id => sh.remove(&key),
                        _ => None,
                    }
                };
                match taken {
                    Some(open) => {
                        if open.waiting.len() == 1 {
                            g.misses.fetch_add(1, Ordering::Relaxed);
                        }
                        return self.run_coalesced(dp, addr, open).await;
                    }
                    None => rx.await,
                }
            }
        };
        match got {
            Ok(r) => r,
            // Whoever took our pieces went away before telling (its future was dropped):
            // write them ourselves. Rewriting bytes that may have landed is harmless.
            Err(_) => self.write_stripe(dp, addr, new, fua, Vec::new()).await,
        }
    }

    /// Write everything coalesced for a stripe as one stripe write; every write that rode
    /// in it gets its outcome.
    async fn run_coalesced(&self, dp: &DataPath, addr: StripeAddr, open: Open) -> Result<()> {
        let Open {
            written,
            mut pieces,
            fua,
            waiting,
            ..
        } = open;
        // One piece per data chunk: where two writes met inside a chunk, their bytes are
        // copied into one buffer (at most a chunk per coalesced stripe).
        let mut new = Vec::with_capacity(self.k);
        pieces.sort_by_key(|d| (d.index, d.chunk_off));
        for (i, w) in written.iter().enumerate() {
            let Some(w) = w else { continue };
            let mine: Vec<&NewData> = pieces.iter().filter(|d| d.index == i).collect();
            if let [one] = mine[..] {
                new.push(one.clone());
                continue;
            }
            let buf = AlignedBuf::for_overwrite((w.end - w.start) as usize).into_shared();
            for d in mine {
                let at = (d.chunk_off - w.start) as usize;
                slice_mut(&buf)[at..at + d.src.len()].copy_from_slice(slice_of(&d.src));
            }
            new.push(NewData {
                index: i,
                chunk_off: w.start,
                src: buf,
            });
        }
        let r = self.write_stripe(dp, addr, new, fua, Vec::new()).await;
        for tx in waiting {
            let _ = tx.send(r.as_ref().map(|_| ()).map_err(Error::again));
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stream's next request comes within a few of the writes' average latencies, not
    /// within one: the wait covers several (up to its bound), and never less than the
    /// fixed floor for members in memory.
    #[test]
    fn a_partial_stripe_waits_several_average_latencies() {
        let g = Coalescer::new();
        assert_eq!(g.wait(), g.wait, "no latency seen yet: the floor");
        for _ in 0..64 {
            g.took(Duration::from_millis(10));
        }
        let avg = Duration::from_nanos(g.latency_ns.load(Ordering::Relaxed));
        assert!(avg > Duration::from_millis(9), "{avg:?}");
        // Later than the average but within four of them: still met.
        assert!(
            g.wait() >= avg * 3,
            "{:?} for an average of {avg:?}",
            g.wait()
        );
        for _ in 0..64 {
            g.took(Duration::from_secs(1));
        }
        assert_eq!(g.wait(), COALESCE_WAIT_MAX.max(g.wait));
    }
}
