#!/usr/bin/env bash
# GPU parity benchmark and on-device correctness check, in one command.
#
# Measures on the machine it runs on: device memory ceiling (device-to-device copy), PCIe
# ceiling (pinned copies), kernel-only encode/reconstruct with data on the GPU (8+2 P+Q,
# 8+2 Cauchy, 10+4 Cauchy, 7+1 XOR), end-to-end batch encode including transfers (streams
# overlapping), and the CPU codec on all cores; prints a Markdown table with ratios against
# the aims (kernel >= 50% of memory bandwidth, end-to-end >= 80% of PCIe). Before timing it
# runs sbod-gpu's test binaries (GPU results byte-identical to the CPU codec) and the
# bench's own verification pass. Results: docs/PERFORMANCE.md, "## GPU parity".
#
# The GPU machine has no network and may have no Rust toolchain, so this runs prebuilt
# binaries from .gpu-bin/ (git-ignored):
#
#   here (any machine, no GPU needed):   scripts/bench-gpu.sh --build
#   on the GPU machine (carry .gpu-bin): scripts/bench-gpu.sh [bench options]
#
# With the device tool: run(command="scripts/bench-gpu.sh", carry=[".gpu-bin"]).
# Output also goes to $OUT/bench-gpu.md when $OUT is set. Options pass through to
# sbod-gpu-bench (--quick, --data-mib N, --e2e-mib N, --chunk-kib N, --iters N, --threads N).
# Without a CUDA device it prints "no CUDA device" and why, and exits with status 2.
# Where cargo is present and .gpu-bin/ is missing, it builds first.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.gpu-bin

build() {
  export PATH="$HOME/.cargo/bin:$PATH"
  export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
  cargo build --release -p sbod-gpu --bin sbod-gpu-bench
  mkdir -p "$BIN"
  cp "$CARGO_TARGET_DIR/release/sbod-gpu-bench" "$BIN/"
  # The test binaries, so that the GPU machine runs the same tests cargo would.
  cargo test --release -p sbod-gpu --no-run --message-format=json 2>/dev/null |
    python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["target"]["name"], m["executable"])' |
    while read -r name exe; do cp "$exe" "$BIN/test-$name"; done
  strip --strip-debug "$BIN"/* 2>/dev/null || true
  ls -la "$BIN"
  echo "built: carry $BIN to the GPU machine and run scripts/bench-gpu.sh there"
}

if [ "${1:-}" = "--build" ]; then
  build
  exit 0
fi
if [ ! -x "$BIN/sbod-gpu-bench" ]; then
  if command -v cargo >/dev/null 2>&1 || [ -x "$HOME/.cargo/bin/cargo" ]; then
    build
  else
    echo "no $BIN/sbod-gpu-bench and no cargo here: run scripts/bench-gpu.sh --build on a" \
         "build machine and carry $BIN" >&2
    exit 1
  fi
fi

# NVRTC, if the machine has it (toolkit or pip wheels); otherwise the embedded PTX is used.
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
         /usr/local/lib/python3*/dist-packages/nvidia/cu13/lib \
         /opt/*/.venv/lib/python3*/site-packages/nvidia/cu13/lib \
         /opt/*/.venv/lib/python3*/site-packages/nvidia/cuda_nvrtc/lib; do
  if ls "$d"/libnvrtc.so* >/dev/null 2>&1; then
    export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    break
  fi
done

log="${OUT:+$OUT/bench-gpu.md}"
log="${log:-/dev/null}"
{
  echo "command: scripts/bench-gpu.sh $*"
  echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
  if command -v nvidia-smi >/dev/null 2>&1; then
    export SBOD_REQUIRE_GPU=1 # GPU tests fail rather than skip here
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem,pcie.link.gen.max,pcie.link.width.max \
      --format=csv 2>&1 || true
  fi
  echo
  status=0
  for t in "$BIN"/test-*; do
    [ -x "$t" ] || continue
    echo "== $(basename "$t")"
    tlog=$(mktemp)
    if ! "$t" --test-threads=1 --nocapture >"$tlog" 2>&1; then
      echo "FAILED: $(basename "$t")"
      status=1
    fi
    grep -E '^test |test result|skipped|panicked|CUDA device|parity' "$tlog" || true
    rm -f "$tlog"
  done
  echo
  "$BIN/sbod-gpu-bench" "$@" || status=$?
  exit $status
} 2>&1 | tee "$log"
exit "${PIPESTATUS[0]}"
