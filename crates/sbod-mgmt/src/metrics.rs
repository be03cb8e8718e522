//! Client I/O counters and latency histograms of a serving array, recorded in the I/O path
//! without a shared lock or a shared cache line: each thread adds to its own shard of
//! relaxed atomics (threads pick shards round-robin), and a snapshot sums the shards. The
//! web service reads snapshots through the control socket (`metrics`).
//!
//! Hand-written rather than prometheus-client's `Histogram` (one shared set of atomics per
//! metric, contended by every I/O thread) or `hdrhistogram` (needs `&mut` or a lock): what
//! crosses the process boundary is a plain snapshot, and Prometheus' own types encode it in
//! the web service.

use sbod_types::control::{IoMetrics, LatencyHistogram};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// Upper bounds of the latency buckets, in seconds (as Prometheus' default buckets, with
/// finer steps below a millisecond where NVMe and page-cache hits land).
pub const BOUNDS_SECS: [f64; 17] = [
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0,
];
const NB: usize = BOUNDS_SECS.len() + 1;
const SHARDS: usize = 16;

/// The operations with a latency histogram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Read,
    Write,
    Flush,
    /// Trim and write-zeroes (counted; no histogram).
    Trim,
}

const LAT_OPS: [(Op, &str); 3] = [
    (Op::Read, "read"),
    (Op::Write, "write"),
    (Op::Flush, "flush"),
];

#[derive(Default)]
#[repr(align(128))]
struct Shard {
    reads: AtomicU64,
    read_bytes: AtomicU64,
    writes: AtomicU64,
    write_bytes: AtomicU64,
    flushes: AtomicU64,
    trims: AtomicU64,
    errors: AtomicU64,
    buckets: [[AtomicU64; NB]; 3],
    sum_ns: [AtomicU64; 3],
}

pub struct IoStats {
    shards: Box<[Shard]>,
    started: Instant,
}

impl Default for IoStats {
    fn default() -> Self {
        IoStats {
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
            started: Instant::now(),
        }
    }
}

static NEXT_SHARD: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static MY_SHARD: usize = NEXT_SHARD.fetch_add(1, Relaxed) % SHARDS;
}

fn bucket(secs: f64) -> usize {
    BOUNDS_SECS.partition_point(|&b| b < secs)
}

impl IoStats {
    /// Count one request that moved `bytes` and took `took`; `ok` false counts an error.
    pub fn record(&self, op: Op, bytes: u64, took: Duration, ok: bool) {
        let s = &self.shards[MY_SHARD.with(|i| *i)];
        let (n, b) = match op {
            Op::Read => (&s.reads, Some(&s.read_bytes)),
            Op::Write => (&s.writes, Some(&s.write_bytes)),
            Op::Flush => (&s.flushes, None),
            Op::Trim => (&s.trims, None),
        };
        n.fetch_add(1, Relaxed);
        if let Some(b) = b {
            b.fetch_add(bytes, Relaxed);
        }
        if !ok {
            s.errors.fetch_add(1, Relaxed);
        }
        if let Some(i) = LAT_OPS.iter().position(|(o, _)| *o == op) {
            s.buckets[i][bucket(took.as_secs_f64())].fetch_add(1, Relaxed);
            s.sum_ns[i].fetch_add(took.as_nanos().min(u64::MAX as u128) as u64, Relaxed);
        }
    }

    /// The counters summed over the shards.
    pub fn snapshot(&self) -> IoMetrics {
        let sum = |f: &dyn Fn(&Shard) -> &AtomicU64| -> u64 {
            self.shards.iter().map(|s| f(s).load(Relaxed)).sum()
        };
        let latency = LAT_OPS
            .iter()
            .enumerate()
            .map(|(i, (_, name))| LatencyHistogram {
                op: name.to_string(),
                bounds_secs: BOUNDS_SECS.to_vec(),
                counts: (0..NB).map(|b| sum(&|s| &s.buckets[i][b])).collect(),
                sum_secs: sum(&|s| &s.sum_ns[i]) as f64 / 1e9,
            })
            .collect();
        IoMetrics {
            reads: sum(&|s| &s.reads),
            read_bytes: sum(&|s| &s.read_bytes),
            writes: sum(&|s| &s.writes),
            write_bytes: sum(&|s| &s.write_bytes),
            flushes: sum(&|s| &s.flushes),
            trims: sum(&|s| &s.trims),
            errors: sum(&|s| &s.errors),
            latency,
            uptime_secs: self.started.elapsed().as_secs_f64(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn buckets_hold_their_bounds() {
        assert_eq!(bucket(0.0), 0);
        assert_eq!(bucket(0.00005), 0);
        assert_eq!(bucket(0.00006), 1);
        assert_eq!(bucket(10.0), 16);
        assert_eq!(bucket(11.0), 17);
    }

    /// Many threads recording at once: the snapshot adds up to exactly what was recorded.
    #[test]
    fn concurrent_records_add_up() {
        let st = Arc::new(IoStats::default());
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let st = st.clone();
                std::thread::spawn(move || {
                    for i in 0..1000u64 {
                        st.record(Op::Read, 4096, Duration::from_micros(40), true);
                        st.record(Op::Write, 8192, Duration::from_millis(3), i % 100 != t);
                        if i % 10 == 0 {
                            st.record(Op::Flush, 0, Duration::from_secs(20), true);
                            st.record(Op::Trim, 1 << 20, Duration::ZERO, true);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let m = st.snapshot();
        assert_eq!((m.reads, m.read_bytes), (8000, 8000 * 4096));
        assert_eq!((m.writes, m.write_bytes), (8000, 8000 * 8192));
        assert_eq!((m.flushes, m.trims, m.errors), (800, 800, 80));
        let read = &m.latency[0];
        assert_eq!(
            (read.op.as_str(), read.counts[0], read.count()),
            ("read", 8000, 8000)
        );
        // 3 ms lands in the 5 ms bucket; 20 s beyond the last bound.
        assert_eq!(m.latency[1].counts[bucket(0.003)], 8000);
        assert_eq!(bucket(0.003), 6);
        assert_eq!(m.latency[2].counts[NB - 1], 800);
        assert!((m.latency[2].sum_secs - 16000.0).abs() < 1e-6);
    }
}
