//! Sharded stripe locks: writes (and reads that reconstruct) to one stripe are ordered,
//! while unrelated stripes never contend. Each lock is an entry in one of many small
//! shard tables, created on demand and removed when its last holder leaves; waiters queue
//! in FIFO order and the lock is handed over directly, so a busy stripe cannot starve.

use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use tokio::sync::oneshot;

const SHARDS: usize = 256;

type Key = (u32, u64);

#[derive(Default)]
struct Shard {
    held: HashMap<Key, VecDeque<oneshot::Sender<()>>>,
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
