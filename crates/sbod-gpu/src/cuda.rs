//! The CUDA layer: driver and NVRTC loaded at run time through `cudarc`, kernels compiled
//! from `kernels/parity.cu` (or the PTX generated from it), and small RAII wrappers for
//! device memory, pinned host memory, streams and events.
//!
//! The hot path uses the driver API directly (`cudarc::driver::{result, sys}`) with raw
//! pointers: cudarc's safe layer tracks every buffer with events, which costs calls per copy
//! and fights the explicit stream overlap a batch needs.

use std::ffi::c_void;
use std::mem::MaybeUninit;
use std::sync::{Arc, OnceLock};

use cudarc::driver::{result, sys, CudaContext, CudaModule};

use crate::Error;

/// The kernel source. NVRTC compiles it for the device's own architecture at start.
pub const KERNEL_SOURCE: &str = include_str!("../kernels/parity.cu");
/// PTX generated from [`KERNEL_SOURCE`] by `scripts/gen-ptx.sh` (NVRTC, compute_60), used
/// where NVRTC is not installed: the driver alone can load it. Its first line records the
/// FNV-1a hash of the source it came from; a test checks that it is current.
pub const EMBEDDED_PTX: &str = include_str!("../kernels/parity.ptx");
/// The architecture the embedded PTX targets (Pascal and newer).
pub const EMBEDDED_PTX_ARCH: &str = "compute_60";

/// 64-bit FNV-1a, to tie the embedded PTX to the source it was made from.
pub fn fnv1a(s: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The first line the embedded PTX must carry.
pub fn ptx_header() -> String {
    format!("// sbod parity.cu fnv1a={:016x}", fnv1a(KERNEL_SOURCE))
}

/// Threads per block for every kernel (they are declared `__launch_bounds__(256)`).
pub const BLOCK: u32 = 256;

fn cuda_err(what: &str, e: result::DriverError) -> Error {
    let name = e
        .error_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|_| format!("{:?}", e.0));
    Error::Cuda(format!("{what}: {name}"))
}

pub(crate) trait Check<T> {
    fn ctx(self, what: &str) -> Result<T, Error>;
}
impl<T> Check<T> for Result<T, result::DriverError> {
    fn ctx(self, what: &str) -> Result<T, Error> {
        self.map_err(|e| cuda_err(what, e))
    }
}

/// Whether NVRTC (libnvrtc) can be loaded on this machine.
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries to dlopen the library names; loads no symbol.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// Whether the CUDA driver (libcuda) can be loaded on this machine.
pub fn driver_present() -> bool {
    // SAFETY: as above.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// NVRTC's version, if it loads.
pub fn nvrtc_version() -> Option<(i32, i32)> {
    if !nvrtc_present() {
        return None;
    }
    let (mut a, mut b) = (0, 0);
    // SAFETY: plain out-parameters; the library is present.
    let r = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut a, &mut b) };
    (r == cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS).then_some((a, b))
}

/// Compile the kernel source to PTX with NVRTC for `arch` (e.g. "compute_90").
pub fn compile(arch: &str) -> Result<String, Error> {
    if !nvrtc_present() {
        return Err(Error::Unavailable("no NVRTC (libnvrtc) found".into()));
    }
    let opts = cudarc::nvrtc::CompileOptions {
        options: vec![format!("--gpu-architecture={arch}"), "-lineinfo".into()],
        name: Some("parity.cu".into()),
        ..Default::default()
    };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(KERNEL_SOURCE, opts).map_err(|e| match e {
        cudarc::nvrtc::CompileError::CompileError { log, .. } => {
            Error::Cuda(format!("NVRTC: {}", log.to_string_lossy()))
        }
        e => Error::Cuda(format!("NVRTC: {e:?}")),
    })?;
    Ok(ptx.to_src())
}

/// Where the loaded kernels came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KernelOrigin {
    /// Compiled at start by NVRTC (version) for the device's architecture.
    Nvrtc { version: (i32, i32), arch: String },
    /// The PTX shipped in the crate, JIT-compiled by the driver.
    Embedded,
}

/// What [`crate::probe`] reports about the GPU.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    pub name: String,
    pub compute_capability: (i32, i32),
    pub multiprocessors: u32,
    pub memory_bytes: usize,
    /// The driver's CUDA version, e.g. 13000 for 13.0.
    pub driver_version: i32,
    pub kernels: KernelOrigin,
    /// Why NVRTC was not used, when it was not.
    pub nvrtc_note: Option<String>,
}

#[derive(Clone, Copy)]
pub(crate) struct Func {
    pub f: sys::CUfunction,
    /// Resident blocks per multiprocessor at the largest shared-memory size used.
    pub blocks_per_sm: u32,
}

// SAFETY: a CUfunction is an immutable driver handle, usable from any thread with its
// context bound (every launch binds it).
unsafe impl Send for Func {}
unsafe impl Sync for Func {}

/// One GPU: its context and the loaded kernels. Shared by every codec on the device.
pub struct Device {
    pub(crate) ctx: Arc<CudaContext>,
    _module: Arc<CudaModule>,
    pub(crate) gf_apply: Func,
    pub(crate) xor: Func,
    pub(crate) pq: Func,
    pub(crate) copy: Func,
    pub(crate) info: DeviceInfo,
}

// SAFETY: CUfunction handles are plain driver handles, valid in any thread once the context
// is current; every entry point here binds the context first.
unsafe impl Send for Device {}
unsafe impl Sync for Device {}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device").field("info", &self.info).finish()
    }
}

/// The process-wide device, opened once. `Ok(None)`: no driver or no device.
pub(crate) fn device() -> Result<Option<Arc<Device>>, Error> {
    static DEV: OnceLock<Result<Option<Arc<Device>>, String>> = OnceLock::new();
    DEV.get_or_init(|| {
        // cudarc panics when a library or symbol is missing; keep that inside.
        match std::panic::catch_unwind(open) {
            Ok(Ok(d)) => Ok(d.map(Arc::new)),
            Ok(Err(e)) => Err(e.to_string()),
            Err(p) => Err(format!(
                "CUDA initialisation panicked: {}",
                p.downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default()
            )),
        }
    })
    .clone()
    .map_err(Error::Unavailable)
}

/// Why there is no device, for messages: `None` when there is one.
pub(crate) fn absence_reason() -> Option<String> {
    if !driver_present() {
        return Some("no CUDA driver (libcuda.so) on this machine".into());
    }
    match device() {
        Ok(Some(_)) => None,
        Ok(None) => Some("no CUDA device".into()),
        Err(e) => Some(e.to_string()),
    }
}

fn open() -> Result<Option<Device>, Error> {
    if !driver_present() {
        return Ok(None);
    }
    if let Err(e) = result::init() {
        // CUDA_ERROR_NO_DEVICE and friends: a driver without a usable GPU.
        return match e.0 {
            sys::CUresult::CUDA_ERROR_NO_DEVICE
            | sys::CUresult::CUDA_ERROR_NOT_SUPPORTED
            | sys::CUresult::CUDA_ERROR_SYSTEM_DRIVER_MISMATCH
            | sys::CUresult::CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE => Ok(None),
            _ => Err(cuda_err("cuInit", e)),
        };
    }
    if result::device::get_count().ctx("cuDeviceGetCount")? < 1 {
        return Ok(None);
    }
    let ordinal: usize = std::env::var("SBOD_GPU_DEVICE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let ctx = CudaContext::new(ordinal).ctx("creating the CUDA context")?;
    let cc = ctx.compute_capability().ctx("compute capability")?;
    let attr = |a| ctx.attribute(a).ctx("device attribute");
    let sms = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32;
    let mut driver_version = 0;
    // SAFETY: plain out-parameter.
    unsafe { sys::cuDriverGetVersion(&mut driver_version) }
        .result()
        .ctx("driver version")?;

    // NVRTC for this device's architecture first; the embedded PTX where NVRTC is missing,
    // fails, or makes PTX this driver is too old to load. SBOD_GPU_KERNELS=embedded|nvrtc
    // forces one (to test both).
    let force = std::env::var("SBOD_GPU_KERNELS").unwrap_or_default();
    let arch = format!("compute_{}{}", cc.0, cc.1);
    let mut nvrtc_note = None;
    let mut loaded = None;
    if force != "embedded" {
        let attempt = compile(&arch).and_then(|ptx| {
            ctx.load_module(cudarc::nvrtc::Ptx::from_src(ptx))
                .ctx("loading NVRTC PTX")
        });
        match attempt {
            Ok(m) => {
                loaded = Some((
                    m,
                    KernelOrigin::Nvrtc {
                        version: nvrtc_version().unwrap_or((0, 0)),
                        arch: arch.clone(),
                    },
                ))
            }
            Err(e) if force == "nvrtc" => return Err(e),
            Err(e) => nvrtc_note = Some(e.to_string()),
        }
    }
    let (module, origin) = match loaded {
        Some(x) => x,
        None => (
            ctx.load_module(cudarc::nvrtc::Ptx::from_src(EMBEDDED_PTX))
                .ctx("loading the embedded PTX")?,
            KernelOrigin::Embedded,
        ),
    };
    let func = |name: &str, max_shared: usize| -> Result<Func, Error> {
        let f = module
            .load_function(name)
            .ctx(&format!("kernel {name}"))?
            .cu_function();
        let mut blocks = 0;
        // SAFETY: f is a live function of the loaded module.
        unsafe {
            sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(
                &mut blocks,
                f,
                BLOCK as i32,
                max_shared,
            )
        }
        .result()
        .ctx("occupancy")?;
        Ok(Func {
            f,
            blocks_per_sm: blocks.max(1) as u32,
        })
    };
    // Shared memory at 32 sources (most arrays); wider codes run at lower occupancy.
    let gf_apply = func("sbod_gf_apply", 32 * (8 + 4 * crate::plan::TABLE_WORDS))?;
    let xor = func("sbod_xor", 32 * 8)?;
    let pq = func("sbod_pq", 32 * 8)?;
    let copy = func("sbod_copy", 0)?;
    let info = DeviceInfo {
        name: ctx.name().ctx("device name")?,
        compute_capability: cc,
        multiprocessors: sms,
        memory_bytes: ctx.total_mem().ctx("device memory")?,
        driver_version,
        kernels: origin,
        nvrtc_note,
    };
    Ok(Some(Device {
        ctx,
        _module: module,
        gf_apply,
        xor,
        pq,
        copy,
        info,
    }))
}

impl Device {
    pub(crate) fn bind(&self) -> Result<(), Error> {
        self.ctx.bind_to_thread().ctx("binding the CUDA context")
    }

    /// Launch `f` with `params` on `stream`, over `words` 16-byte words.
    pub(crate) fn launch(
        &self,
        f: Func,
        words: u64,
        grid_y: u32,
        shared: u32,
        stream: sys::CUstream,
        params: &mut [*mut c_void],
    ) -> Result<(), Error> {
        let want = words.div_ceil(BLOCK as u64).max(1);
        let cap = (self.info.multiprocessors * f.blocks_per_sm) as u64;
        let grid_x = want.min(cap) as u32;
        // SAFETY: params point at live values of the kernel's parameter types (callers
        // build them next to the call); buffers they name outlive the stream's work.
        unsafe {
            result::launch_kernel(
                f.f,
                (grid_x, grid_y, 1),
                (BLOCK, 1, 1),
                shared,
                stream,
                params,
            )
        }
        .ctx("kernel launch")
    }
}

/// Device memory.
pub(crate) struct DevBuf {
    pub ptr: sys::CUdeviceptr,
    pub bytes: usize,
    dev: Arc<Device>,
}

impl DevBuf {
    pub fn new(dev: &Arc<Device>, bytes: usize) -> Result<DevBuf, Error> {
        dev.bind()?;
        // SAFETY: plain allocation; freed in Drop.
        let ptr = unsafe { result::malloc_sync(bytes.max(16)) }.ctx("cuMemAlloc")?;
        Ok(DevBuf {
            ptr,
            bytes,
            dev: dev.clone(),
        })
    }
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        let _ = self.dev.bind();
        // SAFETY: allocated by malloc_sync; no stream uses it any more (owners synchronise).
        let _ = unsafe { result::free_sync(self.ptr) };
    }
}

/// Page-locked host memory, so that copies run at full PCIe speed and asynchronously.
pub(crate) struct Pinned {
    pub ptr: *mut u8,
    dev: Arc<Device>,
}

// SAFETY: plain memory owned by this value.
unsafe impl Send for Pinned {}
unsafe impl Sync for Pinned {}

impl Pinned {
    pub fn new(dev: &Arc<Device>, bytes: usize) -> Result<Pinned, Error> {
        dev.bind()?;
        // PORTABLE: usable from every context. Not WRITECOMBINED: the CPU reads it too.
        // SAFETY: plain allocation; freed in Drop.
        let ptr = unsafe { result::malloc_host(bytes.max(16), sys::CU_MEMHOSTALLOC_PORTABLE) }
            .ctx("cuMemHostAlloc")? as *mut u8;
        // SAFETY: fresh allocation of `bytes`; zero it so it reads as initialised memory.
        unsafe { std::ptr::write_bytes(ptr, 0, bytes) };
        Ok(Pinned {
            ptr,
            dev: dev.clone(),
        })
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        let _ = self.dev.bind();
        // SAFETY: allocated by malloc_host; no copy is in flight (owners synchronise).
        let _ = unsafe { result::free_host(self.ptr as *mut c_void) };
    }
}

pub(crate) struct Stream {
    pub s: sys::CUstream,
    dev: Arc<Device>,
}

// SAFETY: stream handles may be used from any thread with the context bound.
unsafe impl Send for Stream {}

impl Stream {
    pub fn new(dev: &Arc<Device>) -> Result<Stream, Error> {
        dev.bind()?;
        let s = result::stream::create(result::stream::StreamKind::NonBlocking)
            .ctx("cuStreamCreate")?;
        Ok(Stream {
            s,
            dev: dev.clone(),
        })
    }
    pub fn sync(&self) -> Result<(), Error> {
        // SAFETY: live stream.
        unsafe { result::stream::synchronize(self.s) }.ctx("cuStreamSynchronize")
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let _ = self.dev.bind();
        // SAFETY: live stream; destroy waits for nothing but is safe with pending work.
        let _ = unsafe { result::stream::destroy(self.s) };
    }
}

pub(crate) struct Event {
    pub e: sys::CUevent,
    dev: Arc<Device>,
}

// SAFETY: event handles may be used from any thread with the context bound.
unsafe impl Send for Event {}

impl Event {
    pub fn new(dev: &Arc<Device>) -> Result<Event, Error> {
        dev.bind()?;
        let e = result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT).ctx("cuEventCreate")?;
        Ok(Event {
            e,
            dev: dev.clone(),
        })
    }
    pub fn record(&self, stream: &Stream) -> Result<(), Error> {
        // SAFETY: live event and stream.
        unsafe { result::event::record(self.e, stream.s) }.ctx("cuEventRecord")
    }
    /// Milliseconds from `self` to `end` (both recorded and complete).
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32, Error> {
        // SAFETY: live events.
        unsafe {
            result::event::synchronize(end.e).ctx("cuEventSynchronize")?;
            result::event::elapsed(self.e, end.e).ctx("cuEventElapsedTime")
        }
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        let _ = self.dev.bind();
        // SAFETY: live event.
        let _ = unsafe { result::event::destroy(self.e) };
    }
}

/// Which side of a 2D copy is where.
pub(crate) enum Dir {
    HostToDevice,
    DeviceToHost,
}

/// Copy `rows` rows of `width` bytes, `pitch` bytes apart on both sides, asynchronously.
///
/// # Safety
/// `host` and `dev` must cover `(rows - 1) * pitch + width` bytes and stay alive and
/// untouched by others until `stream` has finished the copy.
pub(crate) unsafe fn copy_2d(
    dir: Dir,
    host: *mut u8,
    dev: sys::CUdeviceptr,
    pitch: usize,
    width: usize,
    rows: usize,
    stream: &Stream,
) -> Result<(), Error> {
    let mut p: sys::CUDA_MEMCPY2D = MaybeUninit::zeroed().assume_init();
    p.WidthInBytes = width;
    p.Height = rows;
    match dir {
        Dir::HostToDevice => {
            p.srcMemoryType = sys::CUmemorytype::CU_MEMORYTYPE_HOST;
            p.srcHost = host as *const c_void;
            p.srcPitch = pitch;
            p.dstMemoryType = sys::CUmemorytype::CU_MEMORYTYPE_DEVICE;
            p.dstDevice = dev;
            p.dstPitch = pitch;
        }
        Dir::DeviceToHost => {
            p.srcMemoryType = sys::CUmemorytype::CU_MEMORYTYPE_DEVICE;
            p.srcDevice = dev;
            p.srcPitch = pitch;
            p.dstMemoryType = sys::CUmemorytype::CU_MEMORYTYPE_HOST;
            p.dstHost = host as *mut c_void;
            p.dstPitch = pitch;
        }
    }
    if pitch > i32::MAX as usize {
        // Past the driver's maximum pitch: one plain copy per row.
        for r in 0..rows {
            let (h, d) = (host.add(r * pitch), dev + (r * pitch) as u64);
            match dir {
                Dir::HostToDevice => {
                    sys::cuMemcpyHtoDAsync_v2(d, h as *const c_void, width, stream.s)
                }
                Dir::DeviceToHost => {
                    sys::cuMemcpyDtoHAsync_v2(h as *mut c_void, d, width, stream.s)
                }
            }
            .result()
            .ctx("cuMemcpyAsync")?;
        }
        return Ok(());
    }
    sys::cuMemcpy2DAsync_v2(&p, stream.s)
        .result()
        .ctx("cuMemcpy2DAsync")
}
