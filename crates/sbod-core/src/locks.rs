//! Sharded stripe locks: writes (and reads that reconstruct) to one stripe are ordered,
//! while unrelated stripes never contend. Each lock is an entry in one of many small
//! shard tables, created on demand and removed when its last holder leaves; waiters queue
//! in FIFO order and the lock is handed over directly, so a busy stripe cannot starve.

use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use std::collections::VecDeque;
use tokio::sync::oneshot;

const SHARDS: usize = 256;

type Key = (u32, u64);

#[derive(Default)]
struct Shard {
    // Fx, not SipHash: the keys are the engine's own stripe numbers (no hostile input),
    // and hashing showed in the profile of 4 KiB writes.
    held: FxHashMap<Key, VecDeque<oneshot::Sender<()>>>,
}

pub struct StripeLocks {
    shards: Vec<Mutex<Shard>>,
}

impl Default for StripeLocks {
    fn default() -> Self {
        StripeLocks {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
        }
    }
}

pub struct StripeGuard<'a> {
    locks: &'a StripeLocks,
    key: Key,
}

impl StripeLocks {
    fn shard(&self, key: &Key) -> &Mutex<Shard> {
        let h = (key.1 ^ (key.0 as u64).rotate_left(47)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        &self.shards[(h >> 56) as usize % SHARDS]
    }

    /// Lock stripe `stripe` of group `group`.
    pub async fn lock(&self, group: usize, stripe: u64) -> StripeGuard<'_> {
        let key = (group as u32, stripe);
        let rx = {
            let mut sh = self.shard(&key).lock();
            match sh.held.get_mut(&key) {
                None => {
                    sh.held.insert(key, VecDeque::new());
                    None
                }
                Some(q) => {
                    let (tx, rx) = oneshot::channel();
                    q.push_back(tx);
                    Some(rx)
                }
            }
        };
        if let Some(rx) = rx {
            // The holder hands the lock over by completing our sender. If this future is
            // dropped while waiting, `Waiting` passes on a lock handed to it too late.
            let mut w = Waiting {
                locks: self,
                key,
                rx: Some(rx),
            };
            let r = w.rx.as_mut().expect("receiver present").await;
            w.rx = None;
            r.expect("stripe lock table dropped a waiter");
        }
        StripeGuard { locks: self, key }
    }

    fn release(&self, key: Key) {
        let mut sh = self.shard(&key).lock();
        let q = sh
            .held
            .get_mut(&key)
            .expect("released a stripe lock not held");
        while let Some(tx) = q.pop_front() {
            if tx.send(()).is_ok() {
                return; // handed over
            }
            // That waiter was cancelled: try the next one.
        }
        sh.held.remove(&key);
    }

    /// Number of stripes locked now (for tests and status).
    pub fn held(&self) -> usize {
        self.shards.iter().map(|s| s.lock().held.len()).sum()
    }
}

struct Waiting<'a> {
    locks: &'a StripeLocks,
    key: Key,
    rx: Option<oneshot::Receiver<()>>,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if let Some(mut rx) = self.rx.take() {
            rx.close();
            if rx.try_recv().is_ok() {
                // Handed over after we were cancelled: pass it on.
                self.locks.release(self.key);
            }
        }
    }
}

impl Drop for StripeGuard<'_> {
    fn drop(&mut self) {
        self.locks.release(self.key);
    }
}

/// The gate every client request passes while it runs, so that the array's view of its
/// volume (its geometry and map: `Array::dp`) can be swapped between requests, never under
/// one (a grow that changes the geometry). Client requests take a shared pass on one of
/// a few shards (a different one from one request to the next, so no single lock word is
/// shared by every request: the SBOD rule); a swap takes every shard exclusively, which
/// waits for the requests in flight and holds new ones back for as long as the swap takes
/// (a superblock write), as Linux's big-reader locks do.
pub struct ViewGate {
    shards: Vec<tokio::sync::RwLock<()>>,
    /// Client requests let in, per shard (a background process watches them to yield).
    counts: Vec<Padded>,
}

/// A counter on a cache line of its own.
#[repr(align(64))]
#[derive(Default)]
struct Padded(std::sync::atomic::AtomicU64);

const GATE_SHARDS: usize = 16;

impl Default for ViewGate {
    fn default() -> Self {
        ViewGate {
            shards: (0..GATE_SHARDS)
                .map(|_| tokio::sync::RwLock::new(()))
                .collect(),
            counts: (0..GATE_SHARDS).map(|_| Padded::default()).collect(),
        }
    }
}

thread_local! {
    static NEXT_SHARD: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

impl ViewGate {
    /// A client request's pass, held while it runs. Never taken twice by one request
    /// (a swap waiting between the two would wait forever).
    pub async fn enter(&self) -> tokio::sync::RwLockReadGuard<'_, ()> {
        let i = NEXT_SHARD.with(|c| {
            let i = c.get();
            c.set(i.wrapping_add(1));
            i
        });
        self.shards[i % GATE_SHARDS].read().await
    }

    /// A client request's pass (counted: see [`ViewGate::clients`]).
    pub async fn enter_client(&self) -> tokio::sync::RwLockReadGuard<'_, ()> {
        let g = self.enter().await;
        let i = NEXT_SHARD.with(|c| c.get()) % GATE_SHARDS;
        self.counts[i]
            .0
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        g
    }

    /// Client requests let in so far.
    pub fn clients(&self) -> u64 {
        self.counts
            .iter()
            .map(|c| c.0.load(std::sync::atomic::Ordering::Relaxed))
            .sum()
    }

    /// Every shard, exclusively: no client request runs while the passes are held.
    ///
    /// All or nothing: a shard that is busy is waited for while holding none of the
    /// others, then everything is tried again. A background process keeps several stripes
    /// in flight, each with its pass, and may be waiting for one shard while holding
    /// another: taking the shards one by one and keeping them would deadlock with it.
    pub async fn exclusive(&self) -> Vec<tokio::sync::RwLockWriteGuard<'_, ()>> {
        loop {
            let mut out = Vec::with_capacity(GATE_SHARDS);
            let mut busy = None;
            for (i, s) in self.shards.iter().enumerate() {
                match s.try_write() {
                    Ok(g) => out.push(g),
                    Err(_) => {
                        busy = Some(i);
                        break;
                    }
                }
            }
            let Some(i) = busy else {
                return out;
            };
            drop(out);
            // Wait until it is free (queued as a writer, so new passes on it wait behind
            // this one and it cannot starve), then start again.
            drop(self.shards[i].write().await);
        }
    }
}

#[cfg(test)]
mod gate_tests {
    use super::ViewGate;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    #[tokio::test]
    async fn exclusive_waits_for_every_pass_in_flight() {
        let gate = Arc::new(ViewGate::default());
        // Passes on several shards, as requests from one thread take them.
        let passes: Vec<_> = futures_join(&gate).await;
        let swapped = Arc::new(AtomicBool::new(false));
        let (g2, s2) = (gate.clone(), swapped.clone());
        let t = tokio::spawn(async move {
            let _x = g2.exclusive().await;
            s2.store(true, Ordering::SeqCst);
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(
            !swapped.load(Ordering::SeqCst),
            "a swap ran under requests in flight"
        );
        drop(passes);
        t.await.unwrap();
        assert!(swapped.load(Ordering::SeqCst));
    }

    /// A holder of two passes waiting for its second while a swap waits: the swap holds
    /// no shard while it waits, so the holder gets its pass and the swap runs after.
    #[tokio::test]
    async fn a_holder_of_several_passes_never_deadlocks_with_a_swap() {
        let gate = Arc::new(ViewGate::default());
        for _ in 0..50 {
            let first = gate.enter().await;
            let (g2, done) = (gate.clone(), Arc::new(AtomicBool::new(false)));
            let d2 = done.clone();
            let swap = tokio::spawn(async move {
                let _x = g2.exclusive().await;
                d2.store(true, Ordering::SeqCst);
            });
            tokio::task::yield_now().await;
            // A second pass (another shard) while the swap waits.
            let second = tokio::time::timeout(std::time::Duration::from_secs(5), gate.enter())
                .await
                .expect("a second pass was not given while a swap waited");
            drop((first, second));
            swap.await.unwrap();
            assert!(done.load(Ordering::SeqCst));
        }
    }

    async fn futures_join(gate: &ViewGate) -> Vec<tokio::sync::RwLockReadGuard<'_, ()>> {
        let mut v = Vec::new();
        for _ in 0..20 {
            v.push(gate.enter().await);
        }
        v
    }
}
