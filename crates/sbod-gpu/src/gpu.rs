//! The GPU codec: plans on the device, workspaces with streams, batched encode and
//! reconstruct with transfers and kernels overlapped.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Arc;

use parking_lot::Mutex;
use sbod_codec::{Codec, Scheme};

use crate::batch::Batch;
use crate::cuda::{copy_2d, Check, DevBuf, Device, DeviceInfo, Dir, Func, Stream};
use crate::plan::{KernelKind, Plan, TABLE_WORDS};
use crate::Error;

/// Streams a workspace cycles segments through: one copying in, one computing, one
/// copying out, and one spare so that the issue order never stalls the pipeline.
const STREAMS: usize = 4;
/// Smallest segment (bytes per shard) worth its own copies and launch.
const MIN_SEGMENT: usize = 512 << 10;
const MAX_SEGMENTS: usize = 16;

/// A handle on the GPU, shared by every codec on it.
#[derive(Clone, Debug)]
pub struct Gpu(pub(crate) Arc<Device>);

impl Gpu {
    /// The process's GPU: `Ok(None)` when there is no CUDA driver or no device; an error
    /// when there is one but it cannot be used (the message says why).
    pub fn open() -> Result<Option<Gpu>, Error> {
        Ok(crate::cuda::device()?.map(Gpu))
    }
    pub fn info(&self) -> &DeviceInfo {
        &self.0.info
    }
}

/// A plan uploaded to the device, with the kernel that runs it.
pub(crate) struct DevPlan {
    pub plan: Plan,
    pub image: DevBuf,
    pub func: Func,
    pub shared: u32,
    pub grid_y: u32,
}

impl DevPlan {
    fn new(dev: &Arc<Device>, plan: Plan) -> Result<DevPlan, Error> {
        let image = plan.image();
        let buf = DevBuf::new(dev, image.len() * 4)?;
        // SAFETY: buf holds image.len() u32s; synchronous copy from a live Vec.
        unsafe { cudarc::driver::result::memcpy_htod_sync(buf.ptr, &image) }
            .ctx("uploading a plan")?;
        let nsrc = plan.nsrc();
        let (func, shared, grid_y) = match plan.kind {
            KernelKind::Xor => (dev.xor, nsrc * 8, 1),
            KernelKind::PQ => (dev.pq, nsrc * 8, 1),
            KernelKind::General => (dev.gf_apply, nsrc * (8 + 4 * TABLE_WORDS), plan.groups()),
        };
        Ok(DevPlan {
            plan,
            image: buf,
            func,
            shared: shared as u32,
            grid_y: grid_y as u32,
        })
    }
}

/// Device memory for one batch at a time, and its streams.
pub(crate) struct Workspace {
    pub buf: DevBuf,
    pub streams: Vec<Stream>,
}

impl Workspace {
    pub fn new(dev: &Arc<Device>, bytes: usize) -> Result<Workspace, Error> {
        Ok(Workspace {
            buf: DevBuf::new(dev, bytes)?,
            streams: (0..STREAMS)
                .map(|_| Stream::new(dev))
                .collect::<Result<_, _>>()?,
        })
    }
    pub fn sync(&self) -> Result<(), Error> {
        for s in &self.streams {
            s.sync()?;
        }
        Ok(())
    }
}

/// Runs of consecutive slots, as (first, count): one 2D copy each.
fn runs(slots: &[u32]) -> Vec<(usize, usize)> {
    let mut sorted: Vec<usize> = slots.iter().map(|&s| s as usize).collect();
    sorted.sort_unstable();
    let mut out: Vec<(usize, usize)> = Vec::new();
    for s in sorted {
        match out.last_mut() {
            Some((a, n)) if *a + *n == s => *n += 1,
            _ => out.push((s, 1)),
        }
    }
    out
}

/// Split `len` bytes (a multiple of 16) into segments of whole 16-byte words.
pub(crate) fn segments(len: usize) -> Vec<(usize, usize)> {
    let n = (len / MIN_SEGMENT).clamp(1, MAX_SEGMENTS);
    let seg = len.div_ceil(n).div_ceil(16) * 16;
    (0..len)
        .step_by(seg.max(16))
        .map(|a| (a, (a + seg).min(len)))
        .collect()
}

/// Launch a plan's kernel over bytes `a..b` of each shard in device buffer `base`.
pub(crate) fn launch_plan(
    dev: &Device,
    p: &DevPlan,
    base: u64,
    pitch: usize,
    a: usize,
    b: usize,
    stream: &Stream,
) -> Result<(), Error> {
    let (mut inp, mut out) = (base, base);
    let mut stride = (pitch / 16) as u64;
    let (mut begin, mut end) = ((a / 16) as u64, (b / 16) as u64);
    let mut plan_ptr = p.image.ptr;
    let mut nsrc = p.plan.nsrc() as i32;
    let mut nrow = p.plan.nrow() as i32;
    let mut params: [*mut c_void; 8] = [
        &mut inp as *mut u64 as *mut c_void,
        &mut out as *mut u64 as *mut c_void,
        &mut stride as *mut u64 as *mut c_void,
        &mut begin as *mut u64 as *mut c_void,
        &mut end as *mut u64 as *mut c_void,
        &mut plan_ptr as *mut u64 as *mut c_void,
        &mut nsrc as *mut i32 as *mut c_void,
        &mut nrow as *mut i32 as *mut c_void,
    ];
    dev.launch(
        p.func,
        end - begin,
        p.grid_y,
        p.shared,
        stream.s,
        &mut params,
    )
}

/// A cached decode plan's key: the `present` and `want` flags.
type ErasureKey = (Vec<bool>, Vec<bool>);

/// Batched parity on the GPU, byte-identical to [`sbod_codec::Codec`].
///
/// Shareable between threads: each call takes a workspace (device memory and streams) from
/// a pool, so concurrent batches run side by side.
pub struct GpuCodec {
    dev: Arc<Device>,
    codec: Codec,
    encode: DevPlan,
    decode: Mutex<HashMap<ErasureKey, Arc<DevPlan>>>,
    spaces: Mutex<Vec<Workspace>>,
}

impl std::fmt::Debug for GpuCodec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuCodec")
            .field("scheme", &self.codec.scheme())
            .field("device", &self.dev.info.name)
            .finish()
    }
}

impl GpuCodec {
    /// A codec on the process's GPU; `Ok(None)` when there is none.
    pub fn new(scheme: Scheme) -> Result<Option<GpuCodec>, Error> {
        match Gpu::open()? {
            Some(g) => Ok(Some(GpuCodec::on(&g, scheme)?)),
            None => Ok(None),
        }
    }

    /// A codec on the given GPU.
    pub fn on(gpu: &Gpu, scheme: Scheme) -> Result<GpuCodec, Error> {
        let codec = Codec::new(scheme)?;
        let encode = DevPlan::new(&gpu.0, Plan::encode(&codec))?;
        Ok(GpuCodec {
            dev: gpu.0.clone(),
            codec,
            encode,
            decode: Mutex::new(HashMap::new()),
            spaces: Mutex::new(Vec::new()),
        })
    }

    pub fn codec(&self) -> &Codec {
        &self.codec
    }
    pub fn device_info(&self) -> &DeviceInfo {
        &self.dev.info
    }
    pub fn gpu(&self) -> Gpu {
        Gpu(self.dev.clone())
    }
    pub(crate) fn encode_plan(&self) -> &DevPlan {
        &self.encode
    }

    /// A pinned batch for this codec's geometry.
    pub fn new_batch(&self, chunk: usize, stripes: usize) -> Result<Batch, Error> {
        Batch::new_pinned(&self.dev, self.codec.k(), self.codec.m(), chunk, stripes)
    }

    /// Compute every parity chunk of every stripe in the batch.
    pub fn encode(&self, batch: &mut Batch) -> Result<(), Error> {
        self.run(&self.encode, batch)
    }

    /// Rebuild every shard whose `present` flag is false (the same pattern in every stripe).
    pub fn reconstruct(&self, batch: &mut Batch, present: &[bool]) -> Result<(), Error> {
        let want: Vec<bool> = present.iter().map(|p| !p).collect();
        self.reconstruct_some(batch, present, &want)
    }

    /// Rebuild only the shards flagged in `want` (each absent). Decode matrices are
    /// inverted on the CPU once per pattern and cached on the device.
    pub fn reconstruct_some(
        &self,
        batch: &mut Batch,
        present: &[bool],
        want: &[bool],
    ) -> Result<(), Error> {
        if !want.contains(&true) {
            return Ok(());
        }
        let plan = self.decode_plan(present, want)?;
        self.run(&plan, batch)
    }

    pub(crate) fn decode_plan(
        &self,
        present: &[bool],
        want: &[bool],
    ) -> Result<Arc<DevPlan>, Error> {
        let key = (present.to_vec(), want.to_vec());
        if let Some(p) = self.decode.lock().get(&key) {
            return Ok(p.clone());
        }
        let plan = Arc::new(DevPlan::new(
            &self.dev,
            Plan::reconstruct(&self.codec, present, want)?,
        )?);
        let mut cache = self.decode.lock();
        if cache.len() >= 1024 {
            cache.clear();
        }
        cache.insert(key, plan.clone());
        Ok(plan)
    }

    fn check_batch(&self, batch: &Batch) -> Result<(), Error> {
        if batch.k() != self.codec.k() || batch.m() != self.codec.m() {
            return Err(Error::Batch(format!(
                "batch is {}+{}, codec is {}",
                batch.k(),
                batch.m(),
                self.codec.scheme()
            )));
        }
        if batch.shard_len() % 16 != 0 {
            return Err(Error::Batch(
                "GPU parity needs stripes * chunk to be a multiple of 16 bytes".into(),
            ));
        }
        Ok(())
    }

    /// A workspace of at least `bytes` of device memory, from the pool or new.
    pub(crate) fn workspace(&self, bytes: usize) -> Result<Workspace, Error> {
        let mut pool = self.spaces.lock();
        if let Some(i) = pool.iter().position(|w| w.buf.bytes >= bytes) {
            return Ok(pool.swap_remove(i));
        }
        drop(pool);
        Workspace::new(&self.dev, bytes)
    }

    pub(crate) fn give_back(&self, ws: Workspace) {
        let mut pool = self.spaces.lock();
        if pool.len() < 8 {
            pool.push(ws);
        }
    }

    /// Copy the plan's sources in, run it, copy its outputs back: segment by segment,
    /// round-robin over the streams, so that copies in, kernels and copies out overlap.
    fn run(&self, p: &DevPlan, batch: &mut Batch) -> Result<(), Error> {
        self.check_batch(batch)?;
        let pitch = batch.pitch();
        let bytes = pitch * batch.shards();
        let ws = self.workspace(bytes)?;
        self.dev.bind()?;
        let host = batch.host_ptr();
        let result = (|| -> Result<(), Error> {
            let src_runs = runs(&p.plan.src);
            let dst_runs = runs(&p.plan.dst);
            for (i, &(a, b)) in segments(batch.shard_len()).iter().enumerate() {
                let s = &ws.streams[i % STREAMS];
                for &(first, n) in &src_runs {
                    let off = first * pitch + a;
                    // SAFETY: host and device buffers both hold `shards * pitch` bytes;
                    // the batch is borrowed mutably until the streams are synchronised.
                    unsafe {
                        copy_2d(
                            Dir::HostToDevice,
                            host.add(off),
                            ws.buf.ptr + off as u64,
                            pitch,
                            b - a,
                            n,
                            s,
                        )?
                    };
                }
                launch_plan(&self.dev, p, ws.buf.ptr, pitch, a, b, s)?;
                for &(first, n) in &dst_runs {
                    let off = first * pitch + a;
                    // SAFETY: as above.
                    unsafe {
                        copy_2d(
                            Dir::DeviceToHost,
                            host.add(off),
                            ws.buf.ptr + off as u64,
                            pitch,
                            b - a,
                            n,
                            s,
                        )?
                    };
                }
            }
            Ok(())
        })();
        // Always drain the streams before the batch can be touched again.
        let synced = ws.sync();
        result?;
        synced?;
        self.give_back(ws);
        Ok(())
    }
}
