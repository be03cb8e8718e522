//! Measurements for the benchmark and for calibration: the device's memory and PCIe
//! ceilings, and kernel time with the data already on the GPU.

use std::time::Duration;

use crate::cuda::{copy_2d, Check, DevBuf, Dir, Event, Pinned, Stream};
use crate::gpu::{launch_plan, Gpu, GpuCodec};
use crate::Error;

/// Device memory bandwidth, in bytes read plus bytes written per second.
#[derive(Clone, Copy, Debug)]
pub struct MemoryCeiling {
    /// `cuMemcpyDtoD` of a large buffer.
    pub memcpy: f64,
    /// A streaming copy kernel with 16-byte accesses, the shape of the parity kernels.
    pub copy_kernel: f64,
}

impl MemoryCeiling {
    pub fn best(&self) -> f64 {
        self.memcpy.max(self.copy_kernel)
    }
}

/// Pinned host <-> device copy rates, bytes per second.
#[derive(Clone, Copy, Debug)]
pub struct PcieCeiling {
    pub h2d: f64,
    pub d2h: f64,
    /// Both directions at once on two streams: (h2d, d2h) bytes per second each.
    pub both: (f64, f64),
}

fn time_on(
    gpu: &Gpu,
    stream: &Stream,
    iters: usize,
    mut f: impl FnMut() -> Result<(), Error>,
) -> Result<Duration, Error> {
    let dev = &gpu.0;
    f()?; // warm-up
    stream.sync()?;
    let (a, b) = (Event::new(dev)?, Event::new(dev)?);
    a.record(stream)?;
    for _ in 0..iters {
        f()?;
    }
    b.record(stream)?;
    let ms = a.elapsed_ms(&b)?;
    Ok(Duration::from_secs_f64(ms as f64 / 1e3 / iters as f64))
}

/// Measure device memory bandwidth by copying `bytes` (a multiple of 16) device to device.
pub fn memory_ceiling(gpu: &Gpu, bytes: usize, iters: usize) -> Result<MemoryCeiling, Error> {
    let dev = &gpu.0;
    let (src, dst) = (DevBuf::new(dev, bytes)?, DevBuf::new(dev, bytes)?);
    let s = Stream::new(dev)?;
    // SAFETY: both buffers hold `bytes`; the stream is synchronised by time_on.
    let memcpy = time_on(gpu, &s, iters, || unsafe {
        cudarc::driver::result::memcpy_dtod_async(dst.ptr, src.ptr, bytes, s.s)
            .ctx("cuMemcpyDtoDAsync")
    })?;
    let words = (bytes / 16) as u64;
    let kernel = time_on(gpu, &s, iters, || {
        let (mut i, mut o, mut n) = (src.ptr, dst.ptr, words);
        let mut params = [
            &mut i as *mut u64 as *mut std::ffi::c_void,
            &mut o as *mut u64 as *mut std::ffi::c_void,
            &mut n as *mut u64 as *mut std::ffi::c_void,
        ];
        dev.launch(dev.copy, words, 1, 0, s.s, &mut params)
    })?;
    s.sync()?;
    let rate = |d: Duration| 2.0 * bytes as f64 / d.as_secs_f64();
    Ok(MemoryCeiling {
        memcpy: rate(memcpy),
        copy_kernel: rate(kernel),
    })
}

/// Measure pinned-memory copy rates over PCIe with `bytes`-sized copies.
pub fn pcie_ceiling(gpu: &Gpu, bytes: usize, iters: usize) -> Result<PcieCeiling, Error> {
    let dev = &gpu.0;
    let (h1, h2) = (Pinned::new(dev, bytes)?, Pinned::new(dev, bytes)?);
    let (d1, d2) = (DevBuf::new(dev, bytes)?, DevBuf::new(dev, bytes)?);
    let (s1, s2) = (Stream::new(dev)?, Stream::new(dev)?);
    // SAFETY (all copies below): buffers hold `bytes` and outlive the synchronised streams.
    let up = |s: &Stream| unsafe { copy_2d(Dir::HostToDevice, h1.ptr, d1.ptr, bytes, bytes, 1, s) };
    let down =
        |s: &Stream| unsafe { copy_2d(Dir::DeviceToHost, h2.ptr, d2.ptr, bytes, bytes, 1, s) };
    let h2d = time_on(gpu, &s1, iters, || up(&s1))?;
    let d2h = time_on(gpu, &s1, iters, || down(&s1))?;
    // Both directions: time the whole overlap on the host clock after both streams drain.
    up(&s1)?;
    down(&s2)?;
    s1.sync()?;
    s2.sync()?;
    let t = std::time::Instant::now();
    for _ in 0..iters {
        up(&s1)?;
        down(&s2)?;
    }
    s1.sync()?;
    s2.sync()?;
    let both = t.elapsed().as_secs_f64() / iters as f64;
    let r = |d: f64| bytes as f64 / d;
    Ok(PcieCeiling {
        h2d: r(h2d.as_secs_f64()),
        d2h: r(d2h.as_secs_f64()),
        both: (r(both), r(both)),
    })
}

impl GpuCodec {
    /// Time one encode (or, with `present`, one reconstruct of the absent shards) of
    /// `shard_len`-byte shards whose data is already on the GPU: kernel time only.
    pub fn time_resident(
        &self,
        shard_len: usize,
        present: Option<&[bool]>,
        iters: usize,
    ) -> Result<Duration, Error> {
        let n = self.codec().k() + self.codec().m();
        let pitch = crate::batch::pitch_for(shard_len);
        let ws = self.workspace(pitch * n)?;
        let dev = &self.gpu().0;
        dev.bind()?;
        // Random-looking contents, so that table lookups see real data.
        let mut host = vec![0u8; pitch * n];
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for w in host.chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            w.copy_from_slice(&x.to_le_bytes()[..w.len()]);
        }
        // SAFETY: ws.buf holds at least pitch * n bytes.
        unsafe { cudarc::driver::result::memcpy_htod_sync(ws.buf.ptr, &host) }.ctx("upload")?;
        let plan = match present {
            None => None,
            Some(p) => {
                let want: Vec<bool> = p.iter().map(|x| !x).collect();
                Some(self.decode_plan(p, &want)?)
            }
        };
        let s = &ws.streams[0];
        let t = time_on(&self.gpu(), s, iters, || {
            let p = plan.as_deref().unwrap_or(self.encode_plan());
            launch_plan(dev, p, ws.buf.ptr, pitch, 0, shard_len, s)
        });
        let synced = ws.sync();
        let t = t?;
        synced?;
        self.give_back(ws);
        Ok(t)
    }
}
