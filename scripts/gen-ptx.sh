#!/usr/bin/env bash
# Regenerate crates/sbod-gpu/kernels/parity.ptx from kernels/parity.cu.
#
# The PTX ships in the crate so that GPU parity works on machines with a CUDA driver but no
# NVRTC (the driver JIT-compiles PTX itself). A test (embedded_ptx_is_current) fails when
# the .cu changed and this was not rerun. Needs NVRTC but no GPU: if libnvrtc is not
# installed, NVIDIA's NVRTC wheel (nvidia-cuda-nvrtc-cu12, pinned) is fetched from PyPI into
# a temporary directory. NVRTC 12.9 writes PTX ISA 8.8: loadable by drivers of CUDA 12.9
# (575) and newer; older drivers use NVRTC at run time instead.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"

if ! ldconfig -p 2>/dev/null | grep -q 'libnvrtc\.so'; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download -q --no-deps --only-binary=:all: \
    --platform manylinux2014_x86_64 --platform manylinux_2_12_x86_64 \
    nvidia-cuda-nvrtc-cu12==12.9.86 -d "$tmp"
  python3 -m zipfile -e "$tmp"/nvidia_cuda_nvrtc_cu12-*.whl "$tmp/x"
  export LD_LIBRARY_PATH="$tmp/x/nvidia/cuda_nvrtc/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
cargo run -q -p sbod-gpu --bin sbod-gpu-bench -- --emit-ptx crates/sbod-gpu/kernels/parity.ptx
# The source-compiles test, with the NVRTC just found.
cargo test -q -p sbod-gpu --test cpu_path -- kernel_source_compiles_with_nvrtc embedded_ptx_is_current
