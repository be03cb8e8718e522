#!/usr/bin/env bash
# Compile crates/sbod-gpu/kernels/parity.cu for a real GPU architecture and show what
# ptxas made of it (registers, spills) and the instruction mix of each kernel, with no GPU
# and no CUDA toolkit: NVRTC and nvdisasm come from NVIDIA's PyPI wheels (pinned) in a
# temporary directory. For kernel work on machines without a GPU; timings still need one
# (scripts/bench-gpu.sh).
#
#   scripts/gpu-sass.sh [sm_90]     # prints ptxas -v, per-kernel opcode counts
#   KEEP=dir scripts/gpu-sass.sh     # also leaves dir/parity.sass
set -euo pipefail
cd "$(dirname "$0")/.."
arch="${1:-sm_90}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: \
  --platform manylinux2014_x86_64 --platform manylinux_2_12_x86_64 --platform manylinux_2_17_x86_64 \
  nvidia-cuda-nvrtc-cu12==12.9.86 nvidia-cuda-nvdisasm==13.5.37 -d "$tmp"
for w in "$tmp"/*.whl; do python3 -m zipfile -e "$w" "$tmp/x"; done
nvrtc=$(find "$tmp/x" -name 'libnvrtc.so.*' ! -name '*alt*' ! -name '*builtins*' | head -1)
nvdisasm=$(find "$tmp/x" -name nvdisasm -type f | head -1)
chmod +x "$nvdisasm"
python3 - "$nvrtc" crates/sbod-gpu/kernels/parity.cu "$tmp/parity.cubin" "$arch" <<'PY'
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
src = open(sys.argv[2], "rb").read()
prog = ctypes.c_void_p()
assert lib.nvrtcCreateProgram(ctypes.byref(prog), src, b"parity.cu", 0, None, None) == 0
opts = [b"--gpu-architecture=" + sys.argv[4].encode(), b"--ptxas-options=-v"]
r = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
n = ctypes.c_size_t()
lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
log = ctypes.create_string_buffer(n.value)
lib.nvrtcGetProgramLog(prog, log)
print(log.value.decode())
if r != 0:
    sys.exit("NVRTC failed")
lib.nvrtcGetCUBINSize(prog, ctypes.byref(n))
buf = ctypes.create_string_buffer(n.value)
lib.nvrtcGetCUBIN(prog, buf)
open(sys.argv[3], "wb").write(buf.raw)
PY
"$nvdisasm" -c "$tmp/parity.cubin" 2>/dev/null >"$tmp/parity.sass"
awk '/^\/\/-+ \.text\./ { k = $2; sub(/^\.text\./, "", k) }
     /^ +\/\*[0-9a-f]+\*\/ / { op = $2; if (op ~ /^@/) op = $3; sub(/[.;].*/, "", op); n[k " " op]++ }
     END { for (x in n) print x, n[x] }' "$tmp/parity.sass" | sort -k1,1 -k3,3nr |
  awk '{ if ($1 != last) { printf "\n%s:", $1; last = $1 } printf " %s=%s", $2, $3 } END { print "" }'
if [ -n "${KEEP:-}" ]; then mkdir -p "$KEEP"; cp "$tmp/parity.sass" "$KEEP/"; fi
