//! What the engine holds: a parity backend that picks the CPU or the GPU per batch.

use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use sbod_codec::{Codec, Scheme};

use crate::batch::Batch;
use crate::gpu::GpuCodec;
use crate::Error;

/// `sbod serve --parity cpu|gpu|auto`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ParityMode {
    /// The SIMD CPU codec only.
    #[default]
    Cpu,
    /// The GPU for every batch; an error at start if there is no usable GPU.
    Gpu,
    /// The GPU for batches at least as large as the size from which a start-up measurement
    /// found it faster than the CPU; the CPU for the rest, and for everything when there is
    /// no GPU or it never won.
    Auto,
}

impl FromStr for ParityMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "cpu" => Ok(ParityMode::Cpu),
            "gpu" => Ok(ParityMode::Gpu),
            "auto" => Ok(ParityMode::Auto),
            _ => Err(format!("parity mode must be cpu, gpu or auto, not {s:?}")),
        }
    }
}

impl std::fmt::Display for ParityMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ParityMode::Cpu => "cpu",
            ParityMode::Gpu => "gpu",
            ParityMode::Auto => "auto",
        })
    }
}

/// Which backend computed a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Cpu,
    Gpu,
}

/// Knobs for [`Parity::new`].
#[derive(Clone, Debug)]
pub struct ParityOptions {
    /// Threads the CPU path spreads one batch over (the engine usually runs batches on
    /// several threads already, so 1 by default).
    pub cpu_threads: usize,
    /// Chunk size of the batches the engine will hand over (calibration uses it).
    pub chunk: usize,
    /// The largest batch the engine will hand over, in data bytes (calibration stops there).
    pub max_batch_bytes: usize,
}

impl Default for ParityOptions {
    fn default() -> Self {
        ParityOptions {
            cpu_threads: 1,
            chunk: 64 << 10,
            max_batch_bytes: 64 << 20,
        }
    }
}

/// One calibration point: encode time of a batch of `stripes` stripes on each backend.
#[derive(Clone, Debug)]
pub struct Sample {
    pub stripes: usize,
    pub data_bytes: usize,
    pub cpu: Duration,
    pub gpu: Duration,
}

/// A parity backend for one geometry. Cheap to share between threads.
#[derive(Debug)]
pub struct Parity {
    codec: Codec,
    gpu: Option<GpuCodec>,
    mode: ParityMode,
    /// Auto: batches of at least this many data bytes go to the GPU.
    gpu_from: Option<usize>,
    cpu_threads: usize,
    samples: Vec<Sample>,
    summary: String,
    /// Set when a GPU call failed in auto mode: from then on everything runs on the CPU.
    gpu_failed: AtomicBool,
}

impl Parity {
    /// Set up parity for `scheme`. `Cpu` never touches CUDA; `Gpu` fails unless a GPU is
    /// usable; `Auto` calibrates (a fraction of a second) when there is one.
    pub fn new(scheme: Scheme, mode: ParityMode, opts: ParityOptions) -> Result<Parity, Error> {
        let codec = Codec::new(scheme)?;
        let cpu_threads = opts.cpu_threads.max(1);
        let mut p = Parity {
            codec,
            gpu: None,
            mode,
            gpu_from: None,
            cpu_threads,
            samples: Vec::new(),
            summary: String::new(),
            gpu_failed: AtomicBool::new(false),
        };
        match mode {
            ParityMode::Cpu => p.summary = format!("{scheme}: CPU parity"),
            ParityMode::Gpu => {
                let g = GpuCodec::new(scheme)?.ok_or_else(|| {
                    Error::Unavailable(
                        crate::cuda::absence_reason().unwrap_or_else(|| "no CUDA device".into()),
                    )
                })?;
                p.summary = format!("{scheme}: GPU parity on {}", g.device_info().name);
                p.gpu = Some(g);
                p.gpu_from = Some(0);
            }
            ParityMode::Auto => match GpuCodec::new(scheme) {
                Ok(Some(g)) => {
                    p.gpu = Some(g);
                    p.calibrate(&opts)?;
                }
                Ok(None) => p.summary = format!("{scheme}: CPU parity (auto: no CUDA device)"),
                Err(e) => p.summary = format!("{scheme}: CPU parity (auto: GPU unusable: {e})"),
            },
        }
        Ok(p)
    }

    /// Time both backends on batches from one stripe up to `max_batch_bytes`, check that
    /// they agree byte for byte, and send the GPU the sizes from which it wins for good.
    fn calibrate(&mut self, opts: &ParityOptions) -> Result<(), Error> {
        let g = self.gpu.as_ref().expect("calibrate with a GPU");
        let scheme = self.codec.scheme();
        let chunk = opts.chunk.max(16).div_ceil(16) * 16;
        let stripe_bytes = self.codec.k() * chunk;
        let max_stripes = (opts.max_batch_bytes / stripe_bytes).max(1);
        let mut samples = Vec::new();
        let mut stripes = 1;
        let mut big = g.new_batch(chunk, max_stripes)?;
        fill_pattern(big.raw_mut(), 0x5b0d);
        loop {
            let mut b = g.new_batch(chunk, stripes)?;
            for i in 0..b.k() {
                let l = b.shard_len();
                b.shard_mut(i).copy_from_slice(&big.shard(i)[..l]);
            }
            let mut c = Batch::new_heap(b.k(), b.m(), chunk, stripes)?;
            c.raw_mut().copy_from_slice(b.raw());
            let cpu = best_of(3, || cpu_encode(&self.codec, &mut c, self.cpu_threads))?;
            let gpu = best_of(3, || g.encode(&mut b))?;
            for r in b.k()..b.shards() {
                if b.shard(r) != c.shard(r) {
                    self.gpu = None;
                    self.summary = format!(
                        "{scheme}: CPU parity (auto: GPU parity differed from the CPU codec \
                         in shard {r}; GPU disabled)"
                    );
                    return Ok(());
                }
            }
            samples.push(Sample {
                stripes,
                data_bytes: b.data_bytes(),
                cpu,
                gpu,
            });
            if stripes >= max_stripes {
                break;
            }
            stripes = (stripes * 4).min(max_stripes);
        }
        drop(big);
        // The smallest size from which the GPU wins at every measured size above it.
        let mut from = None;
        for s in samples.iter().rev() {
            if s.gpu < s.cpu {
                from = Some(s.data_bytes);
            } else {
                break;
            }
        }
        let name = &self.gpu.as_ref().unwrap().device_info().name;
        self.summary = match from {
            Some(b) => format!(
                "{scheme}: auto parity: GPU ({name}) for batches of {} KiB of data or more, \
                 CPU ({} thread(s)) below",
                b >> 10,
                self.cpu_threads
            ),
            None => format!(
                "{scheme}: auto parity: CPU ({} thread(s)); the GPU ({name}) did not win at \
                 any batch size up to {} KiB",
                self.cpu_threads,
                opts.max_batch_bytes >> 10
            ),
        };
        self.gpu_from = from;
        if from.is_none() {
            self.gpu = None;
        }
        self.samples = samples;
        Ok(())
    }

    pub fn mode(&self) -> ParityMode {
        self.mode
    }
    pub fn codec(&self) -> &Codec {
        &self.codec
    }
    /// One line on what was chosen and why (for logs and `sbod status`).
    pub fn summary(&self) -> &str {
        &self.summary
    }
    /// Auto mode's calibration measurements.
    pub fn samples(&self) -> &[Sample] {
        &self.samples
    }
    pub fn gpu(&self) -> Option<&GpuCodec> {
        self.gpu.as_ref()
    }

    /// The backend a batch with this many data bytes goes to.
    pub fn backend_for(&self, data_bytes: usize) -> Backend {
        match (&self.gpu, self.gpu_from) {
            (Some(_), Some(from))
                if data_bytes >= from && !self.gpu_failed.load(Ordering::Relaxed) =>
            {
                Backend::Gpu
            }
            _ => Backend::Cpu,
        }
    }

    /// A batch for this geometry: pinned when the GPU may run it.
    pub fn new_batch(&self, chunk: usize, stripes: usize) -> Result<Batch, Error> {
        match &self.gpu {
            Some(g) => g.new_batch(chunk, stripes),
            None => Batch::new_heap(self.codec.k(), self.codec.m(), chunk, stripes),
        }
    }

    /// Compute the parity of every stripe in the batch.
    pub fn encode(&self, batch: &mut Batch) -> Result<Backend, Error> {
        self.dispatch(batch, |g, b| g.encode(b), cpu_encode)
    }

    /// Rebuild every absent shard (the same pattern in every stripe).
    pub fn reconstruct(&self, batch: &mut Batch, present: &[bool]) -> Result<Backend, Error> {
        let want: Vec<bool> = present.iter().map(|p| !p).collect();
        self.reconstruct_some(batch, present, &want)
    }

    /// Rebuild the shards flagged in `want` (each absent).
    pub fn reconstruct_some(
        &self,
        batch: &mut Batch,
        present: &[bool],
        want: &[bool],
    ) -> Result<Backend, Error> {
        self.dispatch(
            batch,
            |g, b| g.reconstruct_some(b, present, want),
            |c, b, t| cpu_reconstruct_some(c, b, present, want, t),
        )
    }

    fn dispatch(
        &self,
        batch: &mut Batch,
        on_gpu: impl Fn(&GpuCodec, &mut Batch) -> Result<(), Error>,
        on_cpu: impl Fn(&Codec, &mut Batch, usize) -> Result<(), Error>,
    ) -> Result<Backend, Error> {
        if let (Backend::Gpu, Some(g)) = (self.backend_for(batch.data_bytes()), &self.gpu) {
            match on_gpu(g, batch) {
                Ok(()) => return Ok(Backend::Gpu),
                Err(e @ (Error::Codec(_) | Error::Batch(_))) => return Err(e),
                Err(e) if self.mode == ParityMode::Gpu => return Err(e),
                // Auto: a device fault must not lose a write. The GPU wrote only output
                // shards, so the CPU recomputes them all, and takes over from here on.
                Err(_) => self.gpu_failed.store(true, Ordering::Relaxed),
            }
        }
        on_cpu(&self.codec, batch, self.cpu_threads)?;
        Ok(Backend::Cpu)
    }
}

fn fill_pattern(buf: &mut [u8], seed: u64) {
    let mut x = seed | 1;
    for w in buf.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let b = x.to_le_bytes();
        w.copy_from_slice(&b[..w.len()]);
    }
}

fn best_of(n: usize, mut f: impl FnMut() -> Result<(), Error>) -> Result<Duration, Error> {
    f()?; // warm-up (first touch, plan upload, JIT)
    let mut best = Duration::MAX;
    for _ in 0..n {
        let t = Instant::now();
        f()?;
        best = best.min(t.elapsed());
    }
    Ok(best)
}

/// Column ranges (64-byte aligned) that `threads` workers split a shard run into.
fn column_ranges(len: usize, threads: usize) -> Vec<(usize, usize)> {
    let per = len.div_ceil(threads.max(1)).div_ceil(64) * 64;
    (0..len)
        .step_by(per.max(64))
        .map(|a| (a, (a + per).min(len)))
        .collect()
}

/// Split every shard run of the batch into the same column ranges: `out[t][shard]`.
fn split_columns(batch: &mut Batch, threads: usize) -> Vec<Vec<&mut [u8]>> {
    let ranges = column_ranges(batch.shard_len(), threads);
    let mut per: Vec<Vec<&mut [u8]>> = ranges.iter().map(|_| Vec::new()).collect();
    for shard in batch.shards_mut() {
        let mut rest = shard;
        for (t, &(a, b)) in ranges.iter().enumerate() {
            let (head, tail) = std::mem::take(&mut rest).split_at_mut(b - a);
            per[t].push(head);
            rest = tail;
        }
    }
    per
}

/// The CPU path: the whole batch is one stripe of `shard_len`-byte shards to the codec
/// (every column is independent), split by columns over `threads` threads.
pub fn cpu_encode(codec: &Codec, batch: &mut Batch, threads: usize) -> Result<(), Error> {
    let k = codec.k();
    if batch.k() != k || batch.m() != codec.m() {
        return Err(Error::Batch(
            "batch geometry differs from the codec's".into(),
        ));
    }
    let work = |mut shards: Vec<&mut [u8]>| -> Result<(), Error> {
        let (data, parity) = shards.split_at_mut(k);
        let data: Vec<&[u8]> = data.iter().map(|d| &**d).collect();
        codec.encode(&data, parity)?;
        Ok(())
    };
    run_split(batch, threads, work)
}

/// The CPU path of [`Parity::reconstruct_some`].
pub fn cpu_reconstruct_some(
    codec: &Codec,
    batch: &mut Batch,
    present: &[bool],
    want: &[bool],
    threads: usize,
) -> Result<(), Error> {
    if batch.k() != codec.k() || batch.m() != codec.m() {
        return Err(Error::Batch(
            "batch geometry differs from the codec's".into(),
        ));
    }
    let work = |mut shards: Vec<&mut [u8]>| -> Result<(), Error> {
        codec.reconstruct_some(&mut shards, present, want)?;
        Ok(())
    };
    run_split(batch, threads, work)
}

fn run_split(
    batch: &mut Batch,
    threads: usize,
    work: impl Fn(Vec<&mut [u8]>) -> Result<(), Error> + Sync,
) -> Result<(), Error> {
    let mut parts = split_columns(batch, threads);
    if parts.len() == 1 {
        return work(parts.pop().unwrap());
    }
    std::thread::scope(|s| {
        let handles: Vec<_> = parts
            .into_iter()
            .map(|p| {
                let w = &work;
                s.spawn(move || w(p))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("parity worker panicked"))
            .collect::<Result<Vec<()>, Error>>()
    })?;
    Ok(())
}
