//! sbod-gpu: parity on an NVIDIA GPU (CUDA), with the SIMD CPU codec as the fallback.
//!
//! What the engine uses:
//!
//! * [`Parity`]: one per array geometry, made with a [`ParityMode`] (`--parity
//!   cpu|gpu|auto`). It hands out [`Batch`]es (pinned when the GPU may run them), and
//!   [`Parity::encode`] / [`Parity::reconstruct`] run a whole batch on the CPU or the GPU,
//!   saying which. `Auto` measures both at start and sends the GPU only the batch sizes it
//!   wins; a GPU fault in auto mode falls back to the CPU for that batch and from then on.
//! * [`Batch`]: many stripes of one geometry in one shard-major buffer (member `i`'s part
//!   of the batch is one contiguous run, [`Batch::shard`]).
//!
//! Underneath, [`GpuCodec`] runs batches on the device: the whole batch is split into
//! segments that flow through several CUDA streams (copy in, kernel, copy out overlap).
//! The kernels (`kernels/parity.cu`) are CUDA C compiled at start by NVRTC, or taken from
//! the PTX shipped in the crate when NVRTC is missing; CUDA is loaded at run time, so
//! sbod builds, and its tests pass, on machines with no GPU and no CUDA toolkit.
//! Results are byte-identical to [`sbod_codec::Codec`]: the kernels' arithmetic has a
//! bit-exact CPU model ([`emu`]) tested against it everywhere, and the kernels themselves
//! are tested against it wherever a device is present.
//!
//! ```
//! use sbod_codec::Scheme;
//! use sbod_gpu::{Parity, ParityMode, ParityOptions};
//!
//! // `auto` runs on the CPU where there is no CUDA device (as here on CI).
//! let parity = Parity::new(Scheme::PQ { k: 8 }, ParityMode::Auto, ParityOptions::default())?;
//! println!("{}", parity.summary());
//! let mut batch = parity.new_batch(64 << 10, 16)?; // 16 stripes of 8+2 x 64 KiB
//! for stripe in 0..batch.stripes() {
//!     for d in 0..batch.k() {
//!         batch.chunk_of_mut(stripe, d).fill((stripe * 8 + d) as u8); // the engine's data
//!     }
//! }
//! let backend = parity.encode(&mut batch)?;
//! // Member i writes batch.shard(i): its chunks of all 16 stripes, contiguous.
//! let q = batch.shard(9).to_vec();
//! // Lose two members, rebuild them.
//! let mut present = vec![true; 10];
//! present[3] = false;
//! present[9] = false;
//! batch.shard_mut(3).fill(0);
//! batch.shard_mut(9).fill(0);
//! parity.reconstruct(&mut batch, &present)?;
//! assert_eq!(batch.shard(9), &q[..]);
//! assert!(batch.chunk_of(5, 3).iter().all(|&b| b == 5 * 8 + 3));
//! # let _ = backend;
//! # Ok::<(), sbod_gpu::Error>(())
//! ```
//!
//! Hand-written because no crate does GPU Reed-Solomon in md/ISA-L-compatible form; the
//! CUDA plumbing itself is `cudarc`.

mod batch;
pub mod cuda;
pub mod emu;
mod gpu;
pub mod measure;
mod parity;
pub mod plan;

pub use batch::Batch;
pub use cuda::{DeviceInfo, KernelOrigin};
pub use gpu::{Gpu, GpuCodec};
pub use parity::{
    cpu_encode, cpu_reconstruct_some, Backend, Parity, ParityMode, ParityOptions, Sample,
};

/// Errors of GPU parity.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No usable GPU (the message says why); `--parity auto` runs on the CPU instead.
    #[error("GPU parity unavailable: {0}")]
    Unavailable(String),
    /// A CUDA call failed.
    #[error("CUDA: {0}")]
    Cuda(String),
    #[error(transparent)]
    Codec(#[from] sbod_codec::CodecError),
    /// A batch that does not fit the codec or the GPU path.
    #[error("batch: {0}")]
    Batch(String),
}

/// Whether a usable CUDA device is present, and if not, why: `Ok(info)` or `Err(reason)`,
/// e.g. "no CUDA driver (libcuda.so) on this machine". Never panics, even without CUDA.
pub fn probe() -> Result<DeviceInfo, String> {
    match Gpu::open() {
        Ok(Some(g)) => Ok(g.info().clone()),
        Ok(None) => Err(cuda::absence_reason().unwrap_or_else(|| "no CUDA device".into())),
        Err(e) => Err(e.to_string()),
    }
}
