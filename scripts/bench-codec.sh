#!/usr/bin/env bash
# Parity codec benchmark, side by side on this machine in one run: sbod's codec vs Intel
# ISA-L (Debian's libisal, linked by bench/codec) vs klauspost/reedsolomon (Go program in
# bench/codec/klauspost). Same geometries, shard sizes, buffer layout and working sets;
# rounds alternate between the codecs; rates are data bytes per second of the measuring
# thread's CPU time. Before measuring, it checks that sbod's parity is byte-identical to
# ISA-L's (ec_encode_data with gf_gen_cauchy1_matrix, pq_gen, xor_gen).
#
#   scripts/bench-codec.sh [--long] [--json | --json-out FILE] [--filter TEXT] [--sizes 4096,...]
#                          [--skew BYTES] [--stream-mib N] [--isa avx2|portable|...]
#
# Not part of the test suite. Needs libisal-dev (scripts/deps.sh) and, for the klauspost
# column, Go >= 1.24 (skipped with a note when missing). Results: docs/PERFORMANCE.md.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
export PATH="$HOME/.cargo/bin:$PATH"
out="${CARGO_TARGET_DIR:-$PWD/target}/bench-codec"
mkdir -p "$out"

kp=()
if command -v go >/dev/null 2>&1 && (cd bench/codec/klauspost && go build -o "$out/klauspost-bench" . 2>"$out/go-build.log"); then
  kp=(--klauspost "$out/klauspost-bench")
else
  echo "bench-codec: no usable Go toolchain (see $out/go-build.log): skipping klauspost/reedsolomon" >&2
fi

CARGO_TARGET_DIR="$out" cargo build --release --locked --quiet --manifest-path bench/codec/Cargo.toml
exec "$out/release/sbod-codec-peers" "${kp[@]}" "$@"
