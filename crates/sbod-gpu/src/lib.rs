//! sbod-gpu: GPU parity (CUDA), with the CPU codec as the fallback.

pub mod emu;
pub mod plan;
